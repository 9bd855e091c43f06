"""Paper A, algorithmic tasks: positional against standard attention, trained in distribution, tested out of it.

Each task gives n numbers per sample; the model regresses a target at every position (cumulative sum, min,
median, sort, cumulative maximum subarray sum). Models train on numbers from sub-ranges of [-2, 2] and are tested
on [-2c, 2c] for every c in `scales` (c = 1 is in distribution). Paper A: positional attention's error stays low
as c grows while standard attention's grows by orders of magnitude.

    python -m training.algorithmic configs/algorithmic/cpu.yaml
    python -m training.algorithmic configs/algorithmic/cpu.yaml --tasks cumulative_min --seeds 0 1 2
    python -m training.algorithmic configs/algorithmic/cpu.yaml --resume true     # continue interrupted runs

Writes OUTPUT_DIR/TASK/MODEL/seed-S/{results.json, model/} per run and OUTPUT_DIR/TASK/{results.md, mse.png,
accuracy.png} per task.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from transformers import AutoConfig, AutoModelForTokenClassification, TrainingArguments, set_seed

import hf_attn  # noqa: F401  (registers the model types)
from hf_attn.configuration_hf_attn import BLOCK_STYLES, POSITIONAL_ENCODINGS
from hf_attn.data import ALGORITHMIC_TASKS, algorithmic_dataset
from hf_attn.experiments import (
    InMemoryDataset,
    Run,
    collapse_check,
    finish_run,
    input_blind_mse,
    plateau_trainer,
    regression_metrics,
)
from training.common import cli, invalid_configuration, model_size_problems, parse_config, run_tasks, write_task_reports

MODEL_KINDS = ("positional", "standard")
METRICS = (("mse", "MSE", True), ("accuracy", "accuracy within tolerance", False))  # (key, title, log scale)
TEST_SEED = 1_000_000  # test sets depend only on (task, c): every model and seed is tested on the same samples


@dataclass
class ExperimentArguments:
    tasks: list[str] = field(
        default_factory=lambda: list(ALGORITHMIC_TASKS),
        metadata={"help": "Tasks to run, each its own experiment.", "choices": ALGORITHMIC_TASKS},
    )
    models: list[str] = field(
        default_factory=lambda: list(MODEL_KINDS),
        metadata={"help": "Models to compare at equal size.", "choices": MODEL_KINDS},
    )
    seeds: list[int] = field(default_factory=lambda: [0], metadata={"help": "One run per model and seed."})
    scales: list[int] = field(
        default_factory=lambda: list(range(1, 11)),
        metadata={"help": "Test ranges [c * train_low, c * train_high] to evaluate on; 1 is the training range."},
    )
    length: int = field(default=8, metadata={"help": "n, the numbers per sample."})
    train_samples: int = field(default=30_000, metadata={"help": "Training samples (Paper A: 30,000)."})
    test_samples: int = field(default=1_000, metadata={"help": "Test samples per scale c (Paper A: 1,000)."})
    train_low: float = field(default=-2.0, metadata={"help": "Lower end of the training range (Paper A: -2)."})
    train_high: float = field(default=2.0, metadata={"help": "Upper end of the training range (Paper A: 2)."})
    scratchpad: bool = field(default=True, metadata={"help": "Append Paper A's scratchpad position (value 0)."})
    tolerance: float = field(
        default=0.05,
        metadata={"help": "Accuracy counts positions with |error| <= tolerance * c (our choice; not in the paper)."},
    )
    plateau_factor: float = field(default=0.9, metadata={"help": "ReduceLROnPlateau factor (Paper A: 0.9)."})
    plateau_patience: int = field(default=50, metadata={"help": "ReduceLROnPlateau patience in epochs (Paper A: 50)."})
    plateau_min_lr: float = field(default=1e-6, metadata={"help": "ReduceLROnPlateau floor (Paper A: 1e-6)."})
    resume: bool = field(default=False, metadata={"help": "Continue interrupted runs from their last checkpoint."})

    # A rerun may change these: which runs to make (TrainingArguments' `seed` too: each run's comes from `seeds`),
    # and evaluation only (a finished run is re-evaluated on its kept model); other changes are refused.
    run_fields: ClassVar[tuple[str, ...]] = ("tasks", "models", "seeds", "resume", "seed")
    evaluation_fields: ClassVar[tuple[str, ...]] = ("scales", "test_samples", "tolerance")


@dataclass
class ModelArguments:
    n_layer: int | None = field(default=None, metadata={"help": "Depth; default floor(log2 n) + 1 (Paper A)."})
    n_embd: int = field(default=64, metadata={"help": "Width d_model (Paper A: 64)."})
    n_head: int = field(default=2, metadata={"help": "Heads per layer (Paper A: 2)."})
    n_inner: int = field(default=64, metadata={"help": "Hidden width of the MLP (Paper A: 64)."})
    content_qk_dim: int | None = field(
        default=None,
        metadata={"help": "Query/key width of each standard head; default n_embd, as in Paper A's code "
                  "(GPT-2's would be n_embd / n_head)."},
    )  # fmt: skip
    block_style: str = field(
        default="concat_mlp", metadata={"help": "Block (Paper A: concat_mlp).", "choices": BLOCK_STYLES}
    )
    positional_encoding: str = field(
        default="onehot",
        metadata={"help": "P of the positional model (Paper A: onehot).", "choices": POSITIONAL_ENCODINGS},
    )
    is_causal: bool = field(default=False, metadata={"help": "Causal masks; Paper A is bidirectional (sort needs it)."})
    activation_function: str = field(default="relu", metadata={"help": "MLP activation (Paper A: relu)."})


def validate(experiment: ExperimentArguments, model: ModelArguments, training: TrainingArguments) -> None:
    """Every cross-field problem at once, before any data is built."""
    problems = []
    if not experiment.train_low < experiment.train_high:
        problems.append(f"train_low ({experiment.train_low}) must be < train_high ({experiment.train_high})")
    if any(c < 1 for c in experiment.scales):
        problems.append(f"scales must all be >= 1, got {experiment.scales}")
    for name in ("length", "train_samples", "test_samples"):
        if getattr(experiment, name) < 1:
            problems.append(f"{name} must be >= 1, got {getattr(experiment, name)}")
    if experiment.tolerance <= 0:
        problems.append(f"tolerance must be > 0, got {experiment.tolerance}")
    if not experiment.seeds:
        problems.append("seeds must list at least one seed")
    invalid_configuration(problems + model_size_problems(model))


def build_model(kind: str, model: ModelArguments, length: int, positions: int):
    """Same trunk for both kinds; they differ in head kind and where positions enter (Paper A)."""
    depth = model.n_layer or length.bit_length()  # Paper A's code: floor(log2 n) + 1 layers
    heads = {
        # weights from P only; no position in the residual stream
        "positional": dict(model_type="positional_gpt2", position_embedding_type="none"),
        # content attention; positions added to the input (Paper A's code feeds [value, one-hot position] to one
        # linear map, the same function as value * w + b plus a learned position row); queries and keys as wide
        # as the model, as in Paper A's code
        "standard": dict(model_type="hybrid_gpt2", num_local_heads=0, position_embedding_type="learned",
                         content_qk_dim=model.content_qk_dim or model.n_embd),
    }[kind]  # fmt: skip
    config = AutoConfig.for_model(
        **heads,
        n_layer=depth, n_embd=model.n_embd, n_head=model.n_head, n_inner=model.n_inner, n_positions=positions,
        block_style=model.block_style, positional_encoding=model.positional_encoding, is_causal=model.is_causal,
        attend_to_self=True, activation_function=model.activation_function, vocab_size=1, numeric_inputs=True,
        num_labels=1, problem_type="regression", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    return AutoModelForTokenClassification.from_config(config)


def train_and_evaluate(run: Run, task: str, experiment, model_args, training_args) -> dict:
    set_seed(run.seed)
    positions = experiment.length + int(experiment.scratchpad)
    model = build_model(run.model, model_args, experiment.length, positions)
    data = dict(length=experiment.length, low=experiment.train_low, high=experiment.train_high,
                scratchpad=experiment.scratchpad)  # fmt: skip
    train_set = InMemoryDataset(algorithmic_dataset(task, experiment.train_samples, scale=1.0, seed=run.seed, **data))
    trainer = plateau_trainer(model, train_set, run, training_args, experiment.plateau_factor,
                              experiment.plateau_patience, experiment.plateau_min_lr)  # fmt: skip
    totals = run.train(trainer, experiment.resume)

    by_scale, collapse = {}, None
    for scale in sorted({1, *experiment.scales}):  # c = 1, in distribution, is always tested: the collapse check
        test_set = algorithmic_dataset(task, experiment.test_samples, scale=scale, seed=TEST_SEED + scale, **data)
        predictions = trainer.predict(InMemoryDataset(test_set)).predictions[..., 0]
        labels = test_set.with_format("numpy")[:]["labels"]
        metrics = regression_metrics(predictions, labels, experiment.tolerance * scale)
        if scale == 1:
            collapse = collapse_check(metrics["mse"], input_blind_mse(labels), "mse")
        if scale in experiment.scales:
            by_scale[str(scale)] = metrics
    return finish_run(trainer, run, totals, by_scale, experiment="algorithmic", task=task, collapse=collapse)


def write_reports(output_dir: Path, results: list[dict], experiment: ExperimentArguments) -> str:
    """Per task, OUTPUT_DIR/TASK/{results.md, mse.png, accuracy.png}; returns the reports' text."""
    test_range = f"[{experiment.train_low}c, {experiment.train_high}c]"
    return write_task_reports(
        output_dir, results, lambda task: f"{task}: MSE and accuracy by test range {test_range}", METRICS
    )


def main(argv: list[str] | None = None) -> None:
    experiment, model_args, training_args = parse_config((ExperimentArguments, ModelArguments, TrainingArguments), argv)
    validate(experiment, model_args, training_args)
    run_tasks(train_and_evaluate, write_reports, experiment, model_args, training_args)


if __name__ == "__main__":
    cli(main)
