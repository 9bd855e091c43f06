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

from datasets import Dataset
from transformers import AutoModelForTokenClassification, Trainer, TrainingArguments, set_seed

import hf_attn  # noqa: F401  (registers the model types)
from hf_attn import experiments
from hf_attn.configuration_hf_attn import BLOCK_STYLES, POSITIONAL_ENCODINGS
from hf_attn.data import InductionVocab, khop_dataset
from hf_attn.experiments import argmax_accuracy, collapse_check, input_blind_error_rate, list_field, write_report
from hf_attn.experiments.reports import plot_metric
from hf_attn.hub import CardFacts
from training import register_family
from training.models import PAPER_A_MODELS, paper_a_config

METRICS = (  # (key, title, log scale); per-k accuracy in distribution is added by `report_metrics`
    ("accuracy_id", "in-distribution token accuracy", False),
    ("accuracy_ood", "OOD token accuracy (unseen characters)", False),
    ("loss_id", "in-distribution cross-entropy", True),
    ("loss_ood", "OOD cross-entropy", True),
)
TEST_SPLITS = {"id": "train", "ood": "ood"}  # metric suffix: khop_dataset split (in distribution: training characters)
HEADING = "k-hop induction heads: token accuracy and cross-entropy by depth"


@dataclass
class ExperimentArguments(experiments.RunArguments):
    models: list[str] = list_field(PAPER_A_MODELS, "Models to compare at equal size.", PAPER_A_MODELS)
    depths: list[int] = list_field(range(1, 9), "Numbers of layers to train (Paper A: 1..8).")
    length: int = field(default=100, metadata={"help": "Characters per sample after the hop token (Paper A: 100)."})
    max_hops: int = field(default=3, metadata={"help": "k is uniform in 0..max_hops per sample (Paper A: 3)."})
    train_samples: int = field(
        default=50_000, metadata={"help": "Training samples, drawn once per seed (Paper A's code: 50,000)."}
    )
    test_samples: int = field(
        default=1_000,
        metadata={"help": "Test samples per split (training / unseen characters) and per k (Paper A's code: 1,000)."},
    )
    tracked_steps: list[int] = list_field(
        (),
        "Steps after which test accuracy is also recorded (results.json's `by_step`): how each depth learns along "
        "training. Never used to stop a run; steps past max_steps are never reached (a shortened run keeps the "
        "config's list).",
    )

    run_fields: ClassVar[tuple[str, ...]] = ("models", "depths", *experiments.RunArguments.run_fields)
    evaluation_fields: ClassVar[tuple[str, ...]] = ("test_samples",)


@dataclass
class ModelArguments(experiments.ModelArguments):
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
    """Paper A's positional or standard model of `depth` layers, a label (the target token's id) per position.
    Paper A's code feeds its positional table only to queries and keys, and adds GPT-2's learned positions to the
    standard model's token embeddings."""
    vocab_size = InductionVocab(experiment.max_hops).vocab_size
    return paper_a_config(
        kind, n_layer=depth, n_embd=model.n_embd, n_head=model.n_head, n_inner=model.n_inner,
        n_positions=experiment.length + 1, block_style=model.block_style,
        positional_encoding=model.positional_encoding, positional_qk_dim=model.positional_qk_dim,
        is_causal=model.is_causal, activation_function=model.activation_function,
        vocab_size=vocab_size, num_labels=vocab_size,  # a label is the target token's id
    )  # fmt: skip


def plan(experiment: ExperimentArguments) -> list[experiments.Group]:
    """A folder of runs per depth: OUTPUT_DIR/depth-D/MODEL/seed-S."""
    return [experiments.Group(f"depth-{depth}", experiment.models, {"depth": depth}) for depth in experiment.depths]


def problems(experiment: ExperimentArguments, model: ModelArguments, training: TrainingArguments) -> list[str]:
    """Every cross-field problem at once, before any data is built."""
    problems = []
    for name in ("depths", "seeds"):
        values = getattr(experiment, name)
        if not values or len(set(values)) != len(values):
            problems.append(f"{name} must list at least one value and no value twice, got {values}")
    if any(depth < 1 for depth in experiment.depths):
        problems.append(f"depths must all be >= 1, got {experiment.depths}")
    problems += experiments.below("length", "train_samples", "test_samples", of=experiment)
    problems += experiments.below("max_hops", of=experiment, least=0)
    if any(step < 1 for step in experiment.tracked_steps):
        problems.append(f"tracked_steps must all be >= 1, got {experiment.tracked_steps}")
    if training.max_steps < 1:
        problems.append(f"max_steps must be >= 1 (Paper A counts optimizer steps: 100k), got {training.max_steps}")
    if experiment.length >= 1 and experiment.max_hops >= 0:  # else the configs' sizes are wrong too
        problems += experiments.config_problems(
            {kind: functools.partial(model_config, kind, 1, model, experiment) for kind in experiment.models}
        )
    return problems


def report_metrics(max_hops: int) -> list[tuple[str, str, bool]]:
    """The report's tables: `METRICS`, then in-distribution accuracy for each k (harder k should need more depth)."""
    per_hop = [(f"accuracy_id_k{k}", f"in-distribution token accuracy, k = {k}", False) for k in range(max_hops + 1)]
    return [*METRICS, *per_hop]


def test_sets(experiment: ExperimentArguments) -> dict[tuple[str, int], Dataset]:
    """{(split, k): test set}: fresh samples per split and hop count k, the same for every model, depth and seed.
    Each k has its own `test_samples` samples, so every per-k number is equally precise and the overall ones, their
    means, weigh k uniformly as training does."""
    shape = dict(num_samples=experiment.test_samples, length=experiment.length, max_hops=experiment.max_hops)
    return {
        (split, k): khop_dataset(**shape, split=characters, seed=experiments.TEST_SEED + 2 * k + (split == "ood"),
                                 hops=k)
        for split, characters in TEST_SPLITS.items()
        for k in range(experiment.max_hops + 1)
    }  # fmt: skip


def evaluate(trainer: Trainer, experiment: ExperimentArguments) -> tuple[dict[str, float], dict]:
    """Cross-entropy and arg-max accuracy over labelled positions, per split and per hop count k, their means over k,
    and the collapse check on the in-distribution error rate."""
    metrics, input_blind = {}, []
    for (split, k), test_set in test_sets(experiment).items():
        output = trainer.predict(experiments.InMemoryDataset(test_set))
        labels = test_set.with_format("numpy")[:]["labels"]
        metrics[f"accuracy_{split}_k{k}"] = argmax_accuracy(output.predictions, labels)
        metrics[f"loss_{split}_k{k}"] = output.metrics["test_loss"]
        if split == "id":
            input_blind.append(input_blind_error_rate(labels))
    for split in TEST_SPLITS:
        for name in ("accuracy", "loss"):
            metrics[f"{name}_{split}"] = statistics.fmean(
                metrics[f"{name}_{split}_k{k}"] for k in range(experiment.max_hops + 1)
            )
    collapse = collapse_check(1 - metrics["accuracy_id"], statistics.fmean(input_blind), "error rate")
    return metrics, collapse


def accuracy_along_the_way(experiment: ExperimentArguments) -> experiments.MeasureAlongTheWay:
    """Records `accuracy_id` and `accuracy_ood` (means over k, as `evaluate` computes them) after each tracked step."""
    held = {key: experiments.InMemoryDataset(test_set) for key, test_set in test_sets(experiment).items()}

    def measure(model) -> dict[str, float]:
        accuracy = {}
        for (split, _), test_set in held.items():
            inputs = {name: column.to(model.device) for name, column in test_set.columns.items() if name != "labels"}
            logits = model(**inputs).logits.float().cpu().numpy()
            accuracy.setdefault(split, []).append(argmax_accuracy(logits, test_set.columns["labels"].numpy()))
        return {f"accuracy_{split}": statistics.fmean(values) for split, values in accuracy.items()}

    return experiments.MeasureAlongTheWay(measure, steps=experiment.tracked_steps)


def train_and_evaluate(run: experiments.Run, experiment: ExperimentArguments, model_args: ModelArguments,
                       training_args: TrainingArguments, depth: int) -> experiments.Trained:  # fmt: skip
    """Trains one (model, depth, seed) with Trainer's AdamW; its results are one row of the depth table."""
    set_seed(run.seed)
    model = AutoModelForTokenClassification.from_config(model_config(run.model, depth, model_args, experiment))
    train_set = khop_dataset(experiment.train_samples, experiment.length, experiment.max_hops, "train", run.seed)
    args = experiments.run_arguments(training_args, run)
    trainer = Trainer(model=model, args=args, train_dataset=experiments.InMemoryDataset(train_set))
    if experiment.tracked_steps:
        trainer.add_callback(accuracy_along_the_way(experiment))
    totals = run.train(trainer, experiment.resume)
    metrics, collapse = evaluate(trainer, experiment)
    fields = {"collapse": collapse}
    if experiment.tracked_steps:
        fields["by_step"] = experiments.measured_along_the_way(trainer, by="step")
    return experiments.Trained(trainer, totals, {str(depth): metrics}, fields)


def card(experiment: ExperimentArguments, results: dict) -> CardFacts:
    return CardFacts(
        paper="A",
        title=f"k-hop induction, depth {results['depth']}",
        training=f"Paper A's k-hop induction heads: a hop token then {experiment.length} characters, k in "
        f"0..{experiment.max_hops}, {experiment.train_samples} training samples; tested on fresh samples (id) and on "
        "unseen characters (ood)",
        inputs="`hf_attn.data.khop_dataset` builds them: a `<hop k>` token, then the characters; the target at each "
        "character is read from the logits there",
        task_type="token-classification",
        dataset_name="k-hop induction (synthetic)",
        key_name="depth",
        metrics=("accuracy_id", "accuracy_ood", "loss_id", "loss_ood"),
    )


def write_reports(output_dir: Path, results: list[dict], experiment: ExperimentArguments) -> str:
    """OUTPUT_DIR/{results.md, *.png}: a row per depth, and for runs with `tracked_steps` also
    OUTPUT_DIR/accuracy_by_step.md and a plot per depth; returns the reports' text."""
    metrics = report_metrics(experiment.max_hops)
    report = write_report(output_dir, HEADING, results, metrics, scale_name="depth", xlabel="depth (layers)")
    tracked = [result for result in results if result.get("by_step")]
    return report + ("\n" + write_accuracy_by_step(output_dir, tracked) if tracked else "")


def write_accuracy_by_step(output_dir: Path, results: list[dict]) -> str:
    """In-distribution accuracy along training, a table per depth (OUTPUT_DIR/accuracy_by_step.md) and a plot per
    depth (OUTPUT_DIR/depth-D/accuracy_by_step.png): does positional attention catch up with more depth, or only
    learn more slowly?"""
    sections = ["# k-hop induction heads: in-distribution token accuracy along training"]
    for depth in sorted({result["depth"] for result in results}):
        runs = [result for result in results if result["depth"] == depth]
        summary = experiments.summarize_along_training(runs, "by_step", lambda measured: measured["accuracy_id"])
        sections.append(f"## depth {depth}\n\n" + experiments.markdown_table(summary, "step"))
        plot_metric(summary, output_dir / f"depth-{depth}" / "accuracy_by_step.png",
                    f"depth {depth}: in-distribution accuracy", "in-distribution token accuracy", log_scale=False,
                    xlabel="optimizer step")  # fmt: skip
    return experiments.write_markdown(output_dir / "accuracy_by_step.md", sections)


FAMILY = register_family(
    "induction", ExperimentArguments, ModelArguments, plan, problems, train_and_evaluate, card, write_reports
)

if __name__ == "__main__":
    FAMILY.cli()
