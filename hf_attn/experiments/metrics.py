"""What the experiments measure beyond hf_attn's `evaluate` metrics (`hf_attn.metrics`: regression errors,
recognition, perplexity): token accuracy, the sliding-window scoring behind perplexity, and the input-blind baselines
that tell a run that learned something from one that collapsed.

A run whose in-distribution error is within `COLLAPSE_TOLERANCE` of the best predictor that ignores the input has
collapsed: it learned (almost) nothing about its input. Its results.json says so (`collapse_check`), and reports
leave it out of their means and medians.
"""

import math

import numpy as np
import torch

from ..data.labels import IGNORE_INDEX
from ..metrics import load_metric

COLLAPSE_TOLERANCE = 0.05


# --- classification ----------------------------------------------------------------------------------------------


def labelled_argmax(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The arg-max class and the label at every labelled position (not `IGNORE_INDEX`), in row order: e.g. one
    `<eos>` decision per string for the `recognition` metric."""
    labelled = labels != IGNORE_INDEX
    return logits.argmax(-1)[labelled], labels[labelled]


def argmax_accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Share of labelled positions whose arg-max class is the label."""
    predictions, references = labelled_argmax(logits, labels)
    return float(np.mean(predictions == references))


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
    them near the start). Not `exp(eval_loss)`, which weights blocks rather than tokens. The `perplexity` metric
    aggregates the scored tokens' NLLs.
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
    token_nll = []  # (tokens,) float64: the NLL of every scored token, in stream order
    for i in range(0, len(windows), batch_size):
        batch = windows[i : i + batch_size]
        width = max(end - start for start, end, _ in batch)
        inputs = torch.zeros(len(batch), width, dtype=torch.long)
        targets = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
        for row, (start, end, first) in enumerate(batch):
            inputs[row, : end - start] = token_ids[start:end]
            targets[row, first - start : end - start] = token_ids[first:end]
        logits = model(input_ids=inputs.to(model.device)).logits[:, :-1].float()  # position t predicts t + 1
        labels = targets[:, 1:].reshape(-1).to(logits.device)  # (B * (width - 1),)
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels, reduction="none")
        token_nll.append(nll[labels != IGNORE_INDEX].double().cpu())
    return load_metric("perplexity").compute(predictions=torch.cat(token_nll).numpy())
