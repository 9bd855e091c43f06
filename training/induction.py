"""Paper A, k-hop induction heads: a task whose attention must depend on the data, swept over depth.

Input: a hop token `<hop{k}>` then `length` characters; the target at each character is the character reached by
k times "find the previous occurrence of the current character, step one right" (or `<no_answer>`). Models train
on 5 characters and are tested on fresh samples of them (in distribution) and on the 5 unseen ones (OOD). Paper A:
standard attention solves it in distribution with about 3 layers, positional attention needs more, both fail OOD.

    python -m training.induction configs/induction/cpu.yaml
    python -m training.induction configs/induction/cpu.yaml --depths 4 5 --seeds 0 1
    python -m training.induction configs/induction/cpu.yaml --resume true     # continue interrupted runs

Writes OUTPUT_DIR/depth-D/MODEL/seed-S/{results.json, model/} per run and OUTPUT_DIR/{results.md, *.png}.
"""

import functools
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from transformers import AutoConfig, AutoModelForTokenClassification, Trainer, TrainingArguments, set_seed

import hf_attn  # noqa: F401  (registers the model types)
from hf_attn.configuration_hf_attn import BLOCK_STYLES, POSITIONAL_ENCODINGS
from hf_attn.data import InductionVocab, khop_dataset
from hf_attn.data.induction import IGNORE_INDEX
from hf_attn.experiments import (
    InMemoryDataset,
    Run,
    collapse_check,
    finish_run,
    input_blind_error_rate,
    is_main_process,
    run_arguments,
    write_report,
)
from training.common import (
    claim_runs,
    cli,
    invalid_configuration,
    model_size_problems,
    parse_config,
    run_all,
    run_config,
    runs_for,
)

MODEL_KINDS = ("positional", "standard")
METRICS = (  # (key, title, log scale); per-k accuracy in distribution is added by `report_metrics`
    ("accuracy_id", "in-distribution token accuracy", False),
    ("accuracy_ood", "OOD token accuracy (unseen characters)", False),
    ("loss_id", "in-distribution cross-entropy", True),
    ("loss_ood", "OOD cross-entropy", True),
)
TEST_SEED = 1_000_000  # far from the training seeds, so test samples are fresh
TEST_SPLITS = {"id": "train", "ood": "ood"}  # metric suffix: khop_dataset split (in distribution: training characters)
HEADING = "k-hop induction heads: token accuracy and cross-entropy by depth"


@dataclass
class ExperimentArguments:
    models: list[str] = field(
        default_factory=lambda: list(MODEL_KINDS),
        metadata={"help": "Models to compare at equal size.", "choices": MODEL_KINDS},
    )
    depths: list[int] = field(
        default_factory=lambda: list(range(1, 9)), metadata={"help": "Numbers of layers to train (Paper A: 1..8)."}
    )
    seeds: list[int] = field(default_factory=lambda: [0], metadata={"help": "One run per model, depth and seed."})
    length: int = field(default=100, metadata={"help": "Characters per sample after the hop token (Paper A: 100)."})
    max_hops: int = field(default=3, metadata={"help": "k is uniform in 0..max_hops per sample (Paper A: 3)."})
    train_samples: int = field(
        default=50_000, metadata={"help": "Training samples, drawn once per seed (Paper A's code: 50,000)."}
    )
    test_samples: int = field(
        default=1_000,
        metadata={"help": "Test samples per split (training / unseen characters) and per k (Paper A's code: 1,000)."},
    )
    resume: bool = field(default=False, metadata={"help": "Continue interrupted runs from their last checkpoint."})

    # A rerun may change these: which runs to make (TrainingArguments' `seed` too: each run's comes from `seeds`),
    # and evaluation only (a finished run is re-evaluated on its kept model); other changes are refused.
    run_fields: ClassVar[tuple[str, ...]] = ("models", "depths", "seeds", "resume", "seed")
    evaluation_fields: ClassVar[tuple[str, ...]] = ("test_samples",)


@dataclass
class ModelArguments:
    n_embd: int = field(default=60, metadata={"help": "Width d_model (Paper A: 60)."})
    n_head: int = field(default=3, metadata={"help": "Heads per layer (Paper A: 3)."})
    n_inner: int | None = field(default=None, metadata={"help": "MLP hidden width; default 4 * n_embd (GPT-2's)."})
    block_style: str = field(
        default="gpt2",
        metadata={"help": "Block (Paper A's code: GPT-2's, minus its LayerNorms).", "choices": BLOCK_STYLES},
    )
    positional_encoding: str = field(
        default="learned",
        metadata={
            "help": "P of the positional model (Paper A's code: a learned table shared by all layers).",
            "choices": POSITIONAL_ENCODINGS,
        },
    )
    positional_qk_dim: int | None = field(
        default=None,
        metadata={"help": "Per-head query/key width of positional heads; default d_P (Paper A's code: 20)."},
    )
    is_causal: bool = field(default=True, metadata={"help": "Causal masks (Paper A: a causal decoder)."})
    activation_function: str = field(default="gelu_new", metadata={"help": "MLP activation (GPT-2's)."})


def model_config(kind: str, depth: int, model: ModelArguments, experiment: ExperimentArguments):
    """Same trunk for both kinds; they differ in head kind and where positions enter (Paper A)."""
    heads = {
        # weights from P only; no position in the residual stream (Paper A's code feeds its table only to q, k)
        "positional": dict(model_type="positional_gpt2", position_embedding_type="none"),
        # content attention over token embeddings plus GPT-2's learned positions
        "standard": dict(model_type="hybrid_gpt2", num_local_heads=0, position_embedding_type="learned"),
    }[kind]
    vocab_size = InductionVocab(experiment.max_hops).vocab_size
    return AutoConfig.for_model(
        **heads,
        n_layer=depth, n_embd=model.n_embd, n_head=model.n_head, n_inner=model.n_inner,
        n_positions=experiment.length + 1, block_style=model.block_style,
        positional_encoding=model.positional_encoding, positional_qk_dim=model.positional_qk_dim,
        is_causal=model.is_causal, attend_to_self=True, activation_function=model.activation_function,
        vocab_size=vocab_size, num_labels=vocab_size,  # a label is the target token's id
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,  # Paper A's code disables dropout
        bos_token_id=None, eos_token_id=None,
    )  # fmt: skip


def validate(experiment: ExperimentArguments, model: ModelArguments, training: TrainingArguments) -> None:
    """Every cross-field problem at once, before any data is built."""
    problems = []
    for name in ("depths", "seeds"):
        values = getattr(experiment, name)
        if not values or len(set(values)) != len(values):
            problems.append(f"{name} must list at least one value and no value twice, got {values}")
    if any(depth < 1 for depth in experiment.depths):
        problems.append(f"depths must all be >= 1, got {experiment.depths}")
    for name in ("length", "train_samples", "test_samples"):
        if getattr(experiment, name) < 1:
            problems.append(f"{name} must be >= 1, got {getattr(experiment, name)}")
    if experiment.max_hops < 0:
        problems.append(f"max_hops must be >= 0, got {experiment.max_hops}")
    if training.max_steps < 1:
        problems.append(f"max_steps must be >= 1 (Paper A counts optimizer steps: 100k), got {training.max_steps}")
    problems += model_size_problems(model)
    if not problems:  # the model configs check the model fields (widths, P, block style) themselves
        for kind in experiment.models:
            try:
                model_config(kind, 1, model, experiment)
            except ValueError as error:
                problems.append(f"model {kind!r}: {error}")
    invalid_configuration(problems)


def report_metrics(max_hops: int) -> list[tuple[str, str, bool]]:
    """The report's tables: `METRICS`, then in-distribution accuracy for each k (harder k should need more depth)."""
    per_hop = [(f"accuracy_id_k{k}", f"in-distribution token accuracy, k = {k}", False) for k in range(max_hops + 1)]
    return [*METRICS, *per_hop]


def evaluate(trainer: Trainer, experiment: ExperimentArguments) -> tuple[dict[str, float], dict]:
    """Cross-entropy and arg-max accuracy over labelled positions, per split and per hop count k, and the collapse
    check on the in-distribution error rate.

    Each k has its own test set of `test_samples` samples, so every per-k number is equally precise and the overall
    ones, their means, weigh k uniformly as training does.
    """
    metrics, input_blind = {}, []
    hop_counts = range(experiment.max_hops + 1)
    shape = dict(num_samples=experiment.test_samples, length=experiment.length, max_hops=experiment.max_hops)
    for split, characters in TEST_SPLITS.items():
        for k in hop_counts:
            seed = TEST_SEED + 2 * k + (split == "ood")  # fresh samples, the same for every model, depth and seed
            test_set = khop_dataset(**shape, split=characters, seed=seed, hops=k)
            output = trainer.predict(InMemoryDataset(test_set))
            labels = test_set.with_format("numpy")[:]["labels"]
            labelled = labels != IGNORE_INDEX
            correct = (output.predictions.argmax(-1) == labels) & labelled  # (N, T)
            metrics[f"accuracy_{split}_k{k}"] = float(correct.sum() / labelled.sum())
            metrics[f"loss_{split}_k{k}"] = output.metrics["test_loss"]
            if split == "id":
                input_blind.append(input_blind_error_rate(labels, IGNORE_INDEX))
        for name in ("accuracy", "loss"):
            metrics[f"{name}_{split}"] = statistics.fmean(metrics[f"{name}_{split}_k{k}"] for k in hop_counts)
    collapse = collapse_check(1 - metrics["accuracy_id"], statistics.fmean(input_blind), "error rate")
    return metrics, collapse


def train_and_evaluate(
    run: Run, depth: int, experiment: ExperimentArguments, model_args: ModelArguments, training_args: TrainingArguments
) -> dict:
    """Trains one (model, depth, seed) with Trainer's AdamW and returns its results, one depth-table row."""
    set_seed(run.seed)
    model = AutoModelForTokenClassification.from_config(model_config(run.model, depth, model_args, experiment))
    train_set = khop_dataset(experiment.train_samples, experiment.length, experiment.max_hops, "train", run.seed)
    args = run_arguments(training_args, run)
    trainer = Trainer(model=model, args=args, train_dataset=InMemoryDataset(train_set))
    totals = run.train(trainer, experiment.resume)
    metrics, collapse = evaluate(trainer, experiment)
    return finish_run(
        trainer, run, totals, {str(depth): metrics},  # a row of the depth table
        experiment="induction", depth=depth, collapse=collapse,
    )  # fmt: skip


def write_reports(output_dir: Path, results: list[dict], experiment: ExperimentArguments) -> str:
    """OUTPUT_DIR/{results.md, *.png}: a row per depth; returns the report's text."""
    metrics = report_metrics(experiment.max_hops)
    return write_report(output_dir, HEADING, results, metrics, scale_name="depth", xlabel="depth (layers)")


def main(argv: list[str] | None = None) -> None:
    experiment, model_args, training_args = parse_config((ExperimentArguments, ModelArguments, TrainingArguments), argv)
    validate(experiment, model_args, training_args)
    output_dir = Path(training_args.output_dir)
    settings = run_config(experiment, model_args, training_args)
    runs = {depth: runs_for(output_dir / f"depth-{depth}", experiment.models, experiment.seeds, settings)
            for depth in experiment.depths}  # fmt: skip
    claim_runs(output_dir, [run for group in runs.values() for run in group], experiment)
    results = []
    for depth, group in runs.items():
        train = functools.partial(train_and_evaluate, depth=depth, experiment=experiment, model_args=model_args,
                                  training_args=training_args)  # fmt: skip
        results += run_all(group, train, training_args, experiment)
    if is_main_process():
        print(write_reports(output_dir, results, experiment))


if __name__ == "__main__":
    cli(main)
