"""What every experiment family shares: run folders that resume and never overwrite, metrics, tables and plots.

A run is one (model, seed) of one experiment; it writes `results.json` and a Hub-ready `model/` folder into its own
folder when it finishes. An experiment aggregates its runs' results into `results.md` (mean and median over seeds)
and PNG plots. A run whose in-distribution error is within a few percent of an input-blind predictor's has collapsed:
its results.json says so, and reports list it and leave it out of the means and medians rather than average it in.
Under `torchrun` or `accelerate launch` every process trains and evaluates; only the main process writes results,
cards and reports.
"""

import dataclasses
import json
import logging
import math
import os
import shutil
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from accelerate import PartialState
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model
from transformers import Trainer, TrainerCallback, TrainerState, TrainingArguments
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .hub import write_model_card
from .modeling_hf_attn import HfAttnPreTrainedModel, enable_remote_code

logger = logging.getLogger(__name__)

RESULTS_FILE = "results.json"
SETTINGS_FILE = "settings.json"


def _json_default(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


# --- processes -----------------------------------------------------------------------------------------------


def is_main_process() -> bool:
    """True in a single-process run and in the main process of a `torchrun` / `accelerate launch` run."""
    return PartialState().is_main_process


def wait_for_everyone() -> None:
    PartialState().wait_for_everyone()


# --- runs ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One model trained with one seed, in `folder`: `results.json` when finished, `checkpoint-*` while training.

    `settings` is the configuration it trains with (results.json's `config`); it is kept in `settings.json` from
    the first step, so that a resume can be compared with what the checkpoints were trained with.
    """

    folder: Path
    model: str
    seed: int
    settings: dict = field(default_factory=dict, compare=False)

    @property
    def results_file(self) -> Path:
        return self.folder / RESULTS_FILE

    @property
    def settings_file(self) -> Path:
        return self.folder / SETTINGS_FILE

    @property
    def finished(self) -> bool:
        return self.results_file.exists()

    @property
    def model_folder(self) -> Path:
        return self.folder / "model"

    def checkpoints(self) -> list[Path]:
        """Trainer's `checkpoint-STEP` folders, newest first."""
        steps = {}
        for path in self.folder.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if self.folder.is_dir() else []:
            if (step := path.name.removeprefix(f"{PREFIX_CHECKPOINT_DIR}-")).isdigit():
                steps[int(step)] = path
        return [steps[step] for step in sorted(steps, reverse=True)]

    def recorded_settings(self) -> dict | None:
        """The settings the run was trained with: its results' once finished, `settings.json` while interrupted
        (None before a first checkpoint, or for a run from before settings were kept)."""
        if self.finished:
            return self.read_results().get("config")
        if self.checkpoints() and self.settings_file.is_file():
            return json.loads(self.settings_file.read_text())
        return None

    def resume_problem(self, resume: bool) -> str | None:
        """Why an unfinished run cannot go ahead: it holds an interrupted run's checkpoints and `resume` is off (it
        never silently restarts over them)."""
        checkpoints = self.checkpoints()
        if checkpoints and not resume and not self.finished:
            return (
                f"{self.folder} holds checkpoints of an interrupted run ({checkpoints[0].name}): pass `--resume true` "
                "to continue it, or delete the folder to start over"
            )
        return None

    def checkpoint_to_resume(self, resume: bool) -> Path | None:
        """The newest complete checkpoint when resuming (see `resume_problem`). Newer incomplete ones (a kill while
        saving) are removed, saying why: Trainer would otherwise count them as the newest and rotate the good ones
        away."""
        if problem := self.resume_problem(resume):
            raise ValueError(problem)
        checkpoints = self.checkpoints()
        for checkpoint in checkpoints:
            problem = checkpoint_problem(checkpoint)
            if problem is None:
                return checkpoint
            logger.warning(f"{checkpoint}: incomplete ({problem}), removed; resuming from an older checkpoint.")
            if is_main_process():
                shutil.rmtree(checkpoint)
        if checkpoints:
            logger.warning(f"{self.folder}: no complete checkpoint left, training from the start.")
        return None

    def train(self, trainer: Trainer, resume: bool) -> dict:
        """Trains, from the newest complete checkpoint when resuming; returns the whole run's `train_loss` (mean
        per-step loss) and `train_seconds`, summed over every session that led to the final model, and its
        `loss_curve` (see `loss_curve`).

        A finished run is not trained again (its results are only re-evaluated): its kept model is loaded and its
        recorded training returned.
        """
        if self.finished:
            load_model(trainer.model, self.model_folder / "model.safetensors")
            recorded = self.read_results()
            return {name: recorded.get(name) for name in ("train_loss", "train_seconds", "loss_curve")}
        checkpoint = self.checkpoint_to_resume(resume)
        if checkpoint is None and is_main_process():
            self.folder.mkdir(parents=True, exist_ok=True)
            self.settings_file.write_text(json.dumps(self.settings, indent=2, default=_json_default))
        totals = RunTotals(trainer)
        trainer.add_callback(totals)
        output = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        return totals.whole_run(output, trainer.state.global_step) | {"loss_curve": loss_curve(trainer.state)}

    def write_results(self, results: dict, replace: bool = False) -> None:
        """Written atomically, so a crash never leaves a half-written file that counts as finished, and only once:
        a second writer (another process of a multi-process run) fails instead of silently overwriting, unless
        `replace` (a re-evaluation of a finished run)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        partial = self.results_file.with_suffix(".json.partial")
        partial.write_text(json.dumps(results, indent=2, default=_json_default))
        if replace:
            os.replace(partial, self.results_file)
            return
        os.link(partial, self.results_file)  # raises FileExistsError if the results exist
        partial.unlink()

    def read_results(self) -> dict:
        return json.loads(self.results_file.read_text())


def loss_curve(state: TrainerState) -> list[list[float]]:
    """[step, logged training loss] of every log: Trainer keeps the log history in its checkpoints, so a resumed
    run's curve starts at step 1 too. Shows whether a run was still learning or stuck on a plateau."""
    return [[entry["step"], entry["loss"]] for entry in state.log_history if "loss" in entry]


def checkpoint_problem(checkpoint: Path) -> str | None:
    """Why a checkpoint cannot be resumed from, or None. Trainer writes trainer_state.json last, after the weights,
    optimizer and RNG states, so a kill while saving leaves it missing or the weights truncated."""
    state = checkpoint / TRAINER_STATE_NAME
    if not state.is_file():
        return f"no {TRAINER_STATE_NAME}"
    try:
        json.loads(state.read_text())
    except ValueError:
        return f"{TRAINER_STATE_NAME} is not valid JSON"
    weights = sorted(checkpoint.glob("model*.safetensors"))
    if not weights and not list(checkpoint.glob("pytorch_model_fsdp_*")):  # FSDP's sharded state is a folder
        return "no model weights"
    return next(filter(None, map(safetensors_problem, weights)), None)


def safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file cannot be read (truncated, not safetensors), naming the file; None if it can."""
    try:
        with safe_open(str(path), "pt"):
            return None
    except (OSError, SafetensorError) as error:
        return f"{path} cannot be read: {error}"


class RunTotals(TrainerCallback, ExportableState):
    """The loss summed over steps and the seconds trained, across resumes: saved in every checkpoint's
    trainer_state.json (Trainer's `stateful_callbacks`) and read back when training resumes from it.

    Trainer's own `training_loss` covers only the steps of one `train()` call (0.0 when resuming from the final
    checkpoint), and the part of the loss not yet logged is kept only in its private `_total_loss_scalar` and
    `_tr_loss`: a workaround until Trainer saves a whole-run loss itself.
    """

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self.started = time.perf_counter()  # made just before `train()`: Trainer's set-up counts too
        self.loss_sum: float | None = 0.0  # over the steps before this train() call; None: unknown (old checkpoint)
        self.seconds: float | None = 0.0
        self.first_step: int | None = None  # set when training begins

    def state(self) -> dict:
        loss_sum, seconds = self.loss_sum, self.seconds
        if self.first_step is not None and loss_sum is not None:  # while training: add this call's part
            loss_sum += self.trainer._total_loss_scalar + self.trainer._tr_loss.item()
            seconds += time.perf_counter() - self.started
        return {"args": {}, "attributes": {"loss_sum": loss_sum, "seconds": seconds}}

    def on_train_begin(self, args, state, control, **kwargs):
        name = type(self).__name__
        saved = state.stateful_callbacks.get(name)
        if saved is None and state.global_step > 0:
            logger.warning("The checkpoint predates whole-run totals: train_loss and train_seconds are not recorded.")
            self.loss_sum = self.seconds = None
        elif saved is not None:
            self.loss_sum, self.seconds = saved["attributes"]["loss_sum"], saved["attributes"]["seconds"]
        state.stateful_callbacks[name] = self.state()  # a checkpoint saved later must find its entry
        self.first_step = state.global_step

    def whole_run(self, output, global_step: int) -> dict[str, float | None]:
        """`train_loss`, the mean per-step loss of all `global_step` steps, and `train_seconds`, once trained."""
        if self.loss_sum is None:
            return {"train_loss": None, "train_seconds": None}
        this_call = output.training_loss * (global_step - self.first_step)  # Trainer divides by this call's steps
        return {
            "train_loss": (self.loss_sum + this_call) / global_step if global_step else math.nan,
            "train_seconds": self.seconds + time.perf_counter() - self.started,
        }


# --- training --------------------------------------------------------------------------------------------------


class InMemoryDataset(torch.utils.data.Dataset):
    """A `datasets.Dataset` held as tensors: reading rows from Arrow one by one costs more than a small model's step."""

    def __init__(self, dataset):
        self.columns = dataset.with_format("torch")[:]
        self.length = len(dataset)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: column[index] for name, column in self.columns.items()}


class PlateauTrainer(Trainer):
    """Trainer with Paper A's optimisation: Adam without weight decay, and ReduceLROnPlateau with `plateau`'s factor,
    patience and min_lr, stepped on each epoch's mean training loss by `PlateauOnTrainingLoss`.

    Trainer builds both itself, once the model is wrapped, rather than taking them ready-made through `optimizers=`:
    that is what FSDP requires.
    """

    def __init__(self, *args, plateau: dict, **kwargs):
        super().__init__(*args, callbacks=[PlateauOnTrainingLoss()], **kwargs)
        self.plateau = plateau

    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        if self.optimizer is None:
            parameters = (model or self.model).parameters()
            self.optimizer = torch.optim.Adam(parameters, lr=self.args.learning_rate, weight_decay=0.0)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:
            self.lr_scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer or self.optimizer, **self.plateau)
        return self.lr_scheduler


def plateau_trainer(model, train_set, run: Run, training_args, factor: float, patience: int, min_lr: float) -> Trainer:
    """A `PlateauTrainer` for one run, logging once an epoch (the loss the plateau schedule reads)."""
    args = run_arguments(training_args, run, logging_strategy="epoch")
    plateau = {"factor": factor, "patience": patience, "min_lr": min_lr}
    return PlateauTrainer(model=model, args=args, train_dataset=train_set, plateau=plateau)


def run_arguments(training_args: TrainingArguments, run: Run, **changes) -> TrainingArguments:
    """The arguments of one run's Trainer: its folder and seed. Trainer itself never pushes (it would push every run
    to the same repository); `training.common.run_all` pushes each finished run to its own."""
    return dataclasses.replace(training_args, output_dir=str(run.folder), seed=run.seed, push_to_hub=False,
                               hub_token=None, **changes)  # fmt: skip


def finish_run(trainer: Trainer, run: Run, totals: dict, by_scale: dict, tokenizer=None, **fields) -> dict:
    """Saves the Hub-ready model folder (`run.model_folder`) and returns the run's results: what every family
    records (`totals` from `Run.train`, the run's settings as `config`), plus `fields` (among them `collapse`, from
    `collapse_check`, for the families that check it).

    The folder holds the weights (safetensors), the config with `use_cache=True`, hf_attn's modeling code with a
    full `auto_map` (so `trust_remote_code=True` loads it anywhere), the tokenizer (Trainer's `processing_class`, or
    `tokenizer` where passing it to Trainer would change its data collator) and the model card (`README.md`) with
    the results as `model-index`.
    """
    model = trainer.model
    model.config.use_cache = True  # Trainer turns it off for training; a saved model should decode with a cache
    if isinstance(model, HfAttnPreTrainedModel):
        enable_remote_code(model)
    results = {
        "model": run.model, "seed": run.seed, "model_type": model.config.model_type,
        "parameters": model.num_parameters(), **totals, "processes": trainer.args.world_size,
        "machine": machine_state(), **fields, "config": run.settings, "by_scale": by_scale,
    }  # fmt: skip
    trainer.save_model(str(run.model_folder))  # every process calls it: under FSDP they gather the weights together
    if trainer.is_world_process_zero():
        if tokenizer is not None:
            tokenizer.save_pretrained(run.model_folder)
        write_model_card(run.model_folder, json.loads(json.dumps(results, default=_json_default)), model.config)
    return results


def machine_state() -> dict:
    """What a run's timing depends on: the cores and the load averages (1, 5, 15 minutes) when it finished. A load
    well above the run's own threads means other jobs shared the machine."""
    return {"cpus": os.cpu_count(), "load_average": [round(load, 2) for load in os.getloadavg()]}


class PlateauOnTrainingLoss(TrainerCallback):
    """Steps a `ReduceLROnPlateau` scheduler on each epoch's mean training loss (Paper A), not on an eval metric.

    Use with `logging_strategy="epoch"` (Trainer then logs the epoch's mean loss), as `PlateauTrainer` does;
    Trainer itself steps such a scheduler only after evaluations.
    """

    def on_log(self, args, state, control, logs=None, lr_scheduler=None, **kwargs):
        if logs and "loss" in logs and isinstance(lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            lr_scheduler.step(logs["loss"])


# --- metrics ---------------------------------------------------------------------------------------------------


def regression_metrics(predictions: np.ndarray, labels: np.ndarray, tolerance: float) -> dict[str, float]:
    """MSE over labelled positions (NaN labels, e.g. a scratchpad, are left out) and the share within tolerance."""
    predictions = np.asarray(predictions, dtype=np.float64).reshape(labels.shape)
    kept = ~np.isnan(labels)
    errors = predictions[kept] - labels[kept]
    return {
        "mse": float(np.mean(errors**2)),
        "accuracy": float(np.mean(np.abs(errors) <= tolerance)),
        "mape": float(np.mean(np.abs(errors) / np.maximum(np.abs(labels[kept]), 1e-8))),
    }


COLLAPSE_TOLERANCE = 0.05


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


def input_blind_error_rate(labels: np.ndarray, ignore_index: int = -100) -> float:
    """Error rate of the best predictor that ignores the inputs: each position's most frequent label."""
    labels = np.asarray(labels).reshape(len(labels), -1)
    correct = 0
    for column in labels.T:
        kept = column[column != ignore_index]
        correct += np.unique(kept, return_counts=True)[1].max() if kept.size else 0
    return float(1 - correct / (labels != ignore_index).sum())


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
        targets = torch.full((len(batch), width), -100, dtype=torch.long)
        for row, (start, end, first) in enumerate(batch):
            inputs[row, : end - start] = token_ids[start:end]
            targets[row, first - start : end - start] = token_ids[first:end]
        logits = model(input_ids=inputs.to(model.device)).logits[:, :-1].float()  # position t predicts t + 1
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets[:, 1:].reshape(-1).to(logits.device), reduction="sum"
        )
        total_nll += nll.item()
        total_tokens += int((targets[:, 1:] != -100).sum())
    mean_nll = total_nll / total_tokens
    return {"perplexity": math.exp(mean_nll), "mean_nll": mean_nll, "tokens": total_tokens}


# --- tables and plots ------------------------------------------------------------------------------------------


def summarize(values: Sequence[float]) -> dict[str, float]:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return {"mean": math.nan, "median": math.nan, "runs": len(values)}
    return {"mean": statistics.fmean(finite), "median": statistics.median(finite), "runs": len(values)}


def aggregate(results: Iterable[dict], metric: str) -> dict[str, dict[str, dict[str, float]]]:
    """{model: {scale: summary over seeds}} of `results[i]["by_scale"][scale][metric]`; collapsed runs left out."""
    grouped: dict[str, dict[str, list[float]]] = {}
    for result in results:
        for scale, metrics in result["by_scale"].items():
            values = grouped.setdefault(result["model"], {}).setdefault(scale, [])
            if not is_collapsed(result):
                values.append(metrics[metric])
    return {model: {s: summarize(v) for s, v in by_scale.items()} for model, by_scale in grouped.items()}


def format_value(value: float) -> str:
    """Three decimals, or scientific notation for very small and very large values; `n/a` when not finite."""
    if not math.isfinite(value):
        return "n/a"
    return f"{value:.2e}" if value != 0 and (abs(value) < 1e-2 or abs(value) >= 1e3) else f"{value:.3f}"


def row_order(summary: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """Numeric row keys (c, depth) in numeric order; names (variants) in order of first appearance."""
    rows = list(dict.fromkeys(row for by_row in summary.values() for row in by_row))
    try:
        return sorted(rows, key=float)
    except ValueError:
        return rows


def markdown_table(summary: dict[str, dict[str, dict[str, float]]], scale_name: str = "c") -> str:
    """One row per scale, mean and median over seeds per model: `| c | positional mean | positional median | ...`."""
    models = list(summary)
    scales = row_order(summary)
    header = f"| {scale_name} | " + " | ".join(f"{m} mean | {m} median" for m in models) + " |"
    lines = [header, "|" + "---|" * (1 + 2 * len(models))]
    for scale in scales:
        cells = []
        for model in models:
            stats = summary[model].get(scale, {"mean": math.nan, "median": math.nan})
            cells += [format_value(stats["mean"]), format_value(stats["median"])]
        lines.append(f"| {scale} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_metric(
    summary: dict[str, dict[str, dict[str, float]]],
    path: Path,
    title: str,
    ylabel: str,
    log_scale: bool,
    xlabel: str = "test range scale c (c = 1: training range)",
) -> None:
    """Mean over seeds against the scale, one line per model (median as a dashed line of the same colour)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for model, by_scale in summary.items():
        scales = [s for s in row_order(summary) if s in by_scale]
        x = [float(s) for s in scales]
        (line,) = axes.plot(x, [by_scale[s]["mean"] for s in scales], marker="o", label=f"{model} (mean)")
        axes.plot(x, [by_scale[s]["median"] for s in scales], linestyle="--", color=line.get_color(), alpha=0.6)
    if log_scale:
        axes.set_yscale("log")
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_bars(summary: dict[str, dict[str, dict[str, float]]], path: Path, title: str, ylabel: str) -> None:
    """Grouped bars of the mean over seeds: one group per row (variant), one bar per model (column)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, models = row_order(summary), list(summary)
    width = 0.8 / len(models)
    figure, axes = plt.subplots(figsize=(max(6, 0.9 * len(rows) * len(models)), 4))
    for i, model in enumerate(models):
        means = [summary[model].get(row, {"mean": math.nan})["mean"] for row in rows]
        axes.bar([r + i * width for r in range(len(rows))], means, width, label=model)
    axes.set_xticks([r + 0.4 - width / 2 for r in range(len(rows))], rows)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(axis="y", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_loss_curves(
    panels: dict[str, dict[str, list[list[list[float]]]]], path: Path, title: str, plateau: float | None = None
) -> None:
    """Training loss against step, a panel per key of `panels` (a position encoding) side by side on one y-axis: one
    colour per label (a variant, the same in every panel), one line per run (a seed). `plateau`, a loss drawn as a
    dashed line (e.g. the unigram model's), shows which runs were stuck on it and for how long."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(label for curves in panels.values() for label in curves))
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels) + 1, 4.5), sharey=True, squeeze=False)
    for axis, (panel, curves) in zip(axes[0], panels.items(), strict=True):
        for label, runs in curves.items():
            for run_index, curve in enumerate(runs):
                steps, losses = zip(*curve, strict=True) if curve else ((), ())
                axis.plot(steps, losses, color=f"C{labels.index(label) % 10}", alpha=0.8,
                          label=label if run_index == 0 else None)  # fmt: skip
        if plateau is not None:
            axis.axhline(plateau, color="grey", linestyle="--", linewidth=1, label="unigram model")
        axis.set_title(panel)
        axis.set_xlabel("optimizer step")
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
    axes[0][0].set_ylabel("training loss")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_report(
    folder: Path,
    heading: str,
    results: list[dict],
    metrics: Sequence[tuple[str, str, bool]],
    scale_name: str = "c",
    xlabel: str = "test range scale c (c = 1: training range)",
) -> str:
    """`results.md` (a table per `(metric, title, log_scale)`, mean and median over seeds) and `{metric}.png`.

    Rows are the keys of each result's `by_scale` (named `scale_name`), columns its `model`.
    """
    sections = [f"# {heading} ({len(results)} runs)", collapse_summary(results)]
    name = heading.split(":")[0]
    for metric, title, log_scale in metrics:
        summary = aggregate(results, metric)
        sections.append(f"## {title} (mean and median over seeds)\n\n{markdown_table(summary, scale_name)}")
        plot_metric(summary, folder / f"{metric}.png", f"{name}: {title}", title, log_scale, xlabel)
    report = "\n\n".join(sections) + "\n"
    (folder / "results.md").write_text(report)
    return report


def collapse_summary(results: list[dict]) -> str:
    """Runs kept per model, and each collapsed run with its error against the input-blind predictor's."""
    kept = {model: 0 for model in dict.fromkeys(result["model"] for result in results)}
    collapsed = []
    for result in results:
        if is_collapsed(result):
            check = result["collapse"]
            error, blind = format_value(check["error"]), format_value(check["input_blind_error"])
            run = f"{result['model']} seed {result['seed']}"
            collapsed.append(f"{run} ({check['metric']} {error}, input-blind predictor {blind})")
        else:
            kept[result["model"]] += 1
    counts = ", ".join(f"{model} {count}" for model, count in kept.items())
    if not collapsed:
        return f"Runs per model: {counts}. No run collapsed."
    return (
        f"Runs per model in the means and medians: {counts}. Collapsed (in-distribution error within "
        f"{COLLAPSE_TOLERANCE:.0%} of the best input-blind predictor's), left out: " + "; ".join(collapsed) + "."
    )


def grid_table(cells: dict[str, dict[str, str]], row_name: str) -> str:
    """A markdown table of preformatted cells, `cells[row][column]`; rows and columns in order of first appearance."""
    columns = list(dict.fromkeys(column for by_column in cells.values() for column in by_column))
    lines = [f"| {row_name} | " + " | ".join(columns) + " |", "|" + "---|" * (1 + len(columns))]
    for row, by_column in cells.items():
        lines.append(f"| {row} | " + " | ".join(by_column.get(column, "n/a") for column in columns) + " |")
    return "\n".join(lines)


def plot_heatmap(values: dict[str, dict[str, float]], path: Path, title: str, vmin: float = 0.0,
                 vmax: float = 1.0) -> None:  # fmt: skip
    """`values[row][column]` as an annotated heatmap (rows top to bottom, columns left to right); NaN left blank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(values)
    columns = list(dict.fromkeys(column for by_column in values.values() for column in by_column))
    grid = np.array([[values[row].get(column, math.nan) for column in columns] for row in rows], dtype=float)
    figure, axes = plt.subplots(figsize=(max(4, 1.3 * len(columns) + 2), max(3, 0.5 * len(rows) + 1.5)))
    image = axes.imshow(np.ma.masked_invalid(grid), cmap="viridis", vmin=vmin, vmax=vmax, aspect="auto")
    for (i, j), value in np.ndenumerate(grid):
        if math.isfinite(value):
            axes.text(j, i, f"{value:.2f}", ha="center", va="center", color="white" if value < 0.7 else "black")
    axes.set_xticks(range(len(columns)), columns, rotation=30, ha="right")
    axes.set_yticks(range(len(rows)), rows)
    axes.set_title(title)
    figure.colorbar(image, ax=axes)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


__all__ = [
    "Run",
    "RunTotals",
    "loss_curve",
    "checkpoint_problem",
    "safetensors_problem",
    "InMemoryDataset",
    "PlateauOnTrainingLoss",
    "PlateauTrainer",
    "plateau_trainer",
    "finish_run",
    "run_arguments",
    "is_main_process",
    "wait_for_everyone",
    "regression_metrics",
    "input_blind_mse",
    "input_blind_error_rate",
    "collapse_check",
    "is_collapsed",
    "unigram_nll",
    "plateau_exit_step",
    "perplexity",
    "aggregate",
    "format_value",
    "markdown_table",
    "plot_metric",
    "plot_bars",
    "plot_loss_curves",
    "summarize",
    "write_report",
    "grid_table",
    "plot_heatmap",
]
