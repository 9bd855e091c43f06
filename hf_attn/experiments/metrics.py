"""What the experiments measure: regression errors, accuracy, perplexity, and the input-blind baselines that tell a
run that learned something from one that collapsed.

A run whose in-distribution error is within `COLLAPSE_TOLERANCE` of the best predictor that ignores the input has
collapsed: it learned (almost) nothing about its input. Its results.json says so (`collapse_check`), and reports
leave it out of their means and medians.
"""

import math

import numpy as np
import torch

from ..data.labels import IGNORE_INDEX

COLLAPSE_TOLERANCE = 0.05


# --- regression and classification ------------------------------------------------------------------------------


def mape(errors: np.ndarray, targets: np.ndarray) -> float:
    """Mean absolute error relative to the target (a target of 0 counts as 1e-8)."""
    return float(np.mean(np.abs(errors) / np.maximum(np.abs(targets), 1e-8)))


def regression_metrics(predictions: np.ndarray, labels: np.ndarray, tolerance: float) -> dict[str, float]:
    """MSE over labelled positions (NaN labels, e.g. a scratchpad, are left out), the share within `tolerance` of
    the label, and MAPE."""
    predictions = np.asarray(predictions, dtype=np.float64).reshape(labels.shape)
    kept = ~np.isnan(labels)
    errors = predictions[kept] - labels[kept]
    return {
        "mse": float(np.mean(errors**2)),
        "accuracy": float(np.mean(np.abs(errors) <= tolerance)),
        "mape": mape(errors, labels[kept]),
    }


def argmax_accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Share of labelled positions (not `IGNORE_INDEX`) whose arg-max class is the label."""
    labelled = labels != IGNORE_INDEX
    return float(np.mean(logits.argmax(-1)[labelled] == labels[labelled]))


def longest_perfect_length(accuracy_by_length: dict[int, float]) -> int:
    """Paper B's: the largest evaluated length N with accuracy 1 at every evaluated length up to N; 0 if the shortest
    is already below 1."""
    longest = 0
    for length in sorted(accuracy_by_length):
        if accuracy_by_length[length] < 1.0:
            break
        longest = length
    return longest


# --- input-blind baselines and collapse ---------------------------------------------------------------------------


def input_blind_mse(labels: np.ndarray) -> float:
    """MSE of the best predictor that ignores the inputs: each position's mean label (NaN labels left out).

    A model whose output no longer depends on its input (the constant predictor a collapsed run falls into) can do
    no better. `labels` is (N,) for one answer per sample or (N, T) per position.
    """
    labels = np.asarray(labels, dtype=np.float64).reshape(len(labels), -1)
    labelled = ~np.isnan(labels)
    counts = labelled.sum(axis=0)
    means = np.where(labelled, labels, 0.0).sum(axis=0) / np.maximum(counts, 1)
    return float(np.mean((labels - means)[labelled] ** 2))


def input_blind_error_rate(labels: np.ndarray) -> float:
    """Error rate of the best predictor that ignores the inputs: each position's most frequent label."""
    labels = np.asarray(labels).reshape(len(labels), -1)
    correct = 0
    for column in labels.T:
        kept = column[column != IGNORE_INDEX]
        correct += np.unique(kept, return_counts=True)[1].max() if kept.size else 0
    return float(1 - correct / (labels != IGNORE_INDEX).sum())


def collapse_check(error: float, input_blind_error: float, metric: str, tolerance: float = COLLAPSE_TOLERANCE) -> dict:
    """Whether a run collapsed: its in-distribution `error` (MSE, error rate) is within `tolerance` of the best
    input-blind predictor's, i.e. it learned (almost) nothing about the input. Recorded in results.json."""
    return {
        "collapsed": bool(error >= (1 - tolerance) * input_blind_error),
        "metric": metric,
        "error": float(error),
        "input_blind_error": float(input_blind_error),
        "tolerance": tolerance,
    }


def is_collapsed(result: dict) -> bool:
    return bool(result.get("collapse", {}).get("collapsed", False))


# --- language models ----------------------------------------------------------------------------------------------


def unigram_nll(reference_ids, scored_ids, vocab_size: int) -> float:
    """Mean NLL of `scored_ids` under the token frequencies of `reference_ids` (add-one smoothed over `vocab_size`):
    the best a language model that ignores its context can do, where a run that learned nothing from it plateaus."""
    counts = np.bincount(np.asarray(reference_ids), minlength=vocab_size) + 1.0
    log_probabilities = np.log(counts) - math.log(counts.sum())
    return float(-log_probabilities[np.asarray(scored_ids)].mean())


def plateau_exit_step(curve: list[list[float]], plateau_loss: float, tolerance: float = COLLAPSE_TOLERANCE):
    """The first logged step whose training loss is more than `tolerance` below `plateau_loss` (None: never)."""
    return next((int(step) for step, loss in curve if loss < (1 - tolerance) * plateau_loss), None)


@torch.no_grad()
def perplexity(model, token_ids, context_length: int, stride: int, batch_size: int = 8) -> dict[str, float]:
    """exp(mean token NLL) over one token stream, every token but the first predicted exactly once.

    The stream is scored in chunks of `stride` tokens; each chunk is read in a window of the `context_length`
    tokens ending with it, so every scored token sees at least `context_length - stride` earlier tokens (all of
    them near the start). Not `exp(eval_loss)`, which weights blocks rather than tokens.
    """
    if not 1 <= stride < context_length:
        raise ValueError(f"`stride` must be in [1, context_length={context_length}), got {stride}.")
    if len(token_ids) < 2:
        raise ValueError(
            f"perplexity needs at least 2 tokens (one to predict from, one to score), got {len(token_ids)}."
        )
    token_ids = torch.as_tensor(token_ids, dtype=torch.long)
    windows = []  # (start, end, first): read token_ids[start:end], score token_ids[first:end]
    for first in range(1, len(token_ids), stride):
        end = min(first + stride, len(token_ids))
        windows.append((max(0, end - context_length), end, first))
    model.eval()
    total_nll, total_tokens = 0.0, 0
    for i in range(0, len(windows), batch_size):
        batch = windows[i : i + batch_size]
        width = max(end - start for start, end, _ in batch)
        inputs = torch.zeros(len(batch), width, dtype=torch.long)
        targets = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
        for row, (start, end, first) in enumerate(batch):
            inputs[row, : end - start] = token_ids[start:end]
            targets[row, first - start : end - start] = token_ids[first:end]
        logits = model(input_ids=inputs.to(model.device)).logits[:, :-1].float()  # position t predicts t + 1
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets[:, 1:].reshape(-1).to(logits.device), reduction="sum"
        )
        total_nll += nll.item()
        total_tokens += int((targets[:, 1:] != IGNORE_INDEX).sum())
    mean_nll = total_nll / total_tokens
    return {"perplexity": math.exp(mean_nll), "mean_nll": mean_nll, "tokens": total_tokens}
