"""Paper A, algorithmic tasks: positional against standard attention, trained in distribution, tested out of it.

Each task gives n numbers per sample; the model regresses a target at every position (cumulative sum, min,
median, sort, cumulative maximum subarray sum). Models train on numbers from sub-ranges of [-2, 2] and are tested
on [-2c, 2c] for every c in `scales` (c = 1 is in distribution). Paper A: positional attention's error stays low
as c grows while standard attention's grows by orders of magnitude.

    python -m training.algorithmic configs/algorithmic/cpu.yaml
    python -m training.algorithmic configs/algorithmic/cpu.yaml --tasks cumulative_min --seeds 0 1 2
    python -m training.algorithmic configs/algorithmic/cpu.yaml --resume true     # continue interrupted runs
    python -m training.algorithmic configs/algorithmic/llama_cpu.yaml              # the same on a Llama decoder

Writes OUTPUT_DIR/TASK/MODEL/seed-S/{results.json, model/} per run and OUTPUT_DIR/TASK/{results.md, mse.png,
accuracy.png} per task.
"""

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from transformers import AutoModelForTokenClassification, TrainingArguments, set_seed

import hf_attn  # noqa: F401  (registers the model types)
from hf_attn import experiments, load_metric
from hf_attn.configuration_hf_attn import BLOCK_STYLES, POSITIONAL_ENCODINGS
from hf_attn.data import ALGORITHMIC_TASKS, algorithmic_dataset
from hf_attn.experiments import collapse_check, input_blind_mse, list_field, write_task_reports
from hf_attn.experiments.reports import plot_metric
from hf_attn.hub import CardFacts
from hf_attn.hybrid import HYBRID_TYPES
from training import register_family
from training.models import PAPER_A_MODELS, paper_a_config

ARCHITECTURES = ("gpt2", "llama")


@dataclass
class ExperimentArguments(experiments.RunArguments):
    tasks: list[str] = list_field(ALGORITHMIC_TASKS, "Tasks to run, each its own experiment.", ALGORITHMIC_TASKS)
    models: list[str] = list_field(PAPER_A_MODELS, "Models to compare at equal size.", PAPER_A_MODELS)
    scales: list[int] = list_field(
        range(1, 11), "Test ranges [c * train_low, c * train_high] to evaluate on; 1 is the training range."
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
    tracked_epochs: list[int] = list_field(
        (),
        "Epochs after which the test MSE at every scale is also recorded (results.json's `by_epoch`): how the gap "
        "between the models grows with training. Never used to stop a run.",
    )

    run_fields: ClassVar[tuple[str, ...]] = ("tasks", "models", *experiments.RunArguments.run_fields)
    evaluation_fields: ClassVar[tuple[str, ...]] = ("scales", "test_samples", "tolerance")


@dataclass
class ModelArguments(experiments.ModelArguments):
    architecture: str = field(
        default="gpt2",
        metadata={"help": "`gpt2`: hf_attn's GPT-2-shaped models (Paper A's trunk). `llama`: a Llama decoder (RMSNorm, "
                  "SwiGLU MLP of width n_inner, pre-norm blocks, causal), every head positional (P as "
                  "`positional_encoding` says, through hf_attn.hybridize's positional heads) or every head Llama's own "
                  "(rotary positions); numbers enter through `wne` as in Paper A. Needs `is_causal: true`; "
                  "`block_style`, `activation_function` and `content_qk_dim` are GPT-2's only.",
                  "choices": ARCHITECTURES},
    )  # fmt: skip
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


def plan(experiment: ExperimentArguments) -> list[experiments.Group]:
    """A folder of runs per task: OUTPUT_DIR/TASK/MODEL/seed-S."""
    return [experiments.Group(task, experiment.models, {"task": task}) for task in experiment.tasks]


def problems(experiment: ExperimentArguments, model: ModelArguments, training: TrainingArguments) -> list[str]:
    """Every cross-field problem at once, before any data is built; the model configs check the model fields."""
    problems = []
    if not experiment.train_low < experiment.train_high:
        problems.append(f"train_low ({experiment.train_low}) must be < train_high ({experiment.train_high})")
    if any(c < 1 for c in experiment.scales):
        problems.append(f"scales must all be >= 1, got {experiment.scales}")
    problems += experiments.below("length", "train_samples", "test_samples", of=experiment)
    if experiment.tolerance <= 0:
        problems.append(f"tolerance must be > 0, got {experiment.tolerance}")
    if not experiment.seeds:
        problems.append("seeds must list at least one seed")
    if any(epoch < 1 for epoch in experiment.tracked_epochs):
        problems.append(f"tracked_epochs must all be >= 1, got {experiment.tracked_epochs}")
    problems += llama_problems(model)
    if experiment.length >= 1:  # else the configs' n_positions is wrong too: said once is enough
        positions = experiment.length + int(experiment.scratchpad)
        problems += experiments.config_problems(
            {
                kind: functools.partial(model_config, kind, model, experiment.length, positions)
                for kind in experiment.models
            }
        )
    return problems


def llama_problems(model: ModelArguments) -> list[str]:
    """What a Llama decoder cannot honour: it is causal, its blocks, MLP and heads are Llama's own."""
    if model.architecture != "llama":
        return []
    problems = [] if model.is_causal else ["architecture llama is causal: set is_causal true"]
    gpt2_only = {"block_style": "concat_mlp", "activation_function": "relu", "content_qk_dim": None}
    return problems + [
        f"{name} is not used by architecture llama (its blocks, MLP and heads are Llama's): leave it unset, got "
        f"{getattr(model, name)!r}"
        for name, default in gpt2_only.items()
        if getattr(model, name) != default
    ]


def model_config(kind: str, model: ModelArguments, length: int, positions: int):
    """Paper A's positional or standard model for n = `length` numbers, regressing a value at every position."""
    if model.architecture == "llama":
        return llama_config(kind, model, length, positions)
    return paper_a_config(
        kind, standard_qk_dim=model.content_qk_dim or model.n_embd,
        n_layer=model.n_layer or length.bit_length(),  # Paper A's code: floor(log2 n) + 1 layers
        n_embd=model.n_embd, n_head=model.n_head, n_inner=model.n_inner, n_positions=positions,
        block_style=model.block_style, positional_encoding=model.positional_encoding, is_causal=model.is_causal,
        activation_function=model.activation_function, vocab_size=1, numeric_inputs=True, num_labels=1,
        problem_type="regression",
    )  # fmt: skip


def llama_config(kind: str, model: ModelArguments, length: int, positions: int):
    """A Llama decoder as wide and deep as Paper A's model, every head positional or every head Llama's own, no
    dropout (Paper A's code), numbers in through `wne`."""
    layers = model.n_layer or length.bit_length()
    kind_of_heads = "positional" if kind == "positional" else "global"
    return HYBRID_TYPES["llama"][0](
        hidden_size=model.n_embd, num_hidden_layers=layers, num_attention_heads=model.n_head,
        num_key_value_heads=model.n_head, intermediate_size=model.n_inner, max_position_embeddings=positions,
        head_layout=[[kind_of_heads] * model.n_head] * layers, positional_encoding=model.positional_encoding,
        vocab_size=1, numeric_inputs=True, num_labels=1, problem_type="regression", classifier_dropout=0.0,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip


def build_model(kind: str, model: ModelArguments, length: int, positions: int):
    return AutoModelForTokenClassification.from_config(model_config(kind, model, length, positions))


def test_mse(model, test_set: experiments.InMemoryDataset) -> float:
    """MSE over every labelled position of `test_set`, in one forward."""
    inputs = {name: column.to(model.device) for name, column in test_set.columns.items() if name != "labels"}
    predictions = model(**inputs).logits[..., 0].float().cpu()
    labels = test_set.columns["labels"].float()
    kept = ~torch.isnan(labels)
    return torch.mean((predictions[kept] - labels[kept]) ** 2).item()


def train_and_evaluate(run: experiments.Run, experiment, model_args, training_args, task: str) -> experiments.Trained:
    set_seed(run.seed)
    positions = experiment.length + int(experiment.scratchpad)
    model = build_model(run.model, model_args, experiment.length, positions)
    data = dict(length=experiment.length, low=experiment.train_low, high=experiment.train_high,
                scratchpad=experiment.scratchpad)  # fmt: skip
    train_set = experiments.InMemoryDataset(
        algorithmic_dataset(task, experiment.train_samples, scale=1.0, seed=run.seed, **data)
    )
    test_sets = {
        scale: algorithmic_dataset(
            task, experiment.test_samples, scale=scale, seed=experiments.TEST_SEED + scale, **data
        )  # fmt: skip
        for scale in sorted({1, *experiment.scales})  # c = 1, in distribution, is always tested: the collapse check
    }
    trainer = experiments.plateau_trainer(model, train_set, run, training_args, experiment.plateau_factor,
                                          experiment.plateau_patience, experiment.plateau_min_lr)  # fmt: skip
    if experiment.tracked_epochs:
        tracked = {scale: experiments.InMemoryDataset(test_sets[scale]) for scale in experiment.scales}

        def measure(model) -> dict[str, float]:
            return {str(scale): test_mse(model, test_set) for scale, test_set in tracked.items()}

        trainer.add_callback(experiments.MeasureAlongTheWay(measure, epochs=experiment.tracked_epochs))
    totals = run.train(trainer, experiment.resume)

    ood_regression = load_metric("ood_regression")
    by_scale, collapse = {}, None
    for scale, test_set in test_sets.items():
        predictions = trainer.predict(experiments.InMemoryDataset(test_set)).predictions[..., 0]
        labels = test_set.with_format("numpy")[:]["labels"]
        metrics = ood_regression.compute(
            predictions=predictions.ravel(), references=labels.ravel(), tolerance=experiment.tolerance * scale
        )
        if scale == 1:
            collapse = collapse_check(metrics["mse"], input_blind_mse(labels), "mse")
        if scale in experiment.scales:
            by_scale[str(scale)] = metrics
    fields = {"collapse": collapse}
    if experiment.tracked_epochs:
        fields["by_epoch"] = experiments.measured_along_the_way(trainer, by="epoch")
    return experiments.Trained(trainer, totals, by_scale, fields)


def card(experiment: ExperimentArguments, results: dict) -> CardFacts:
    task, low, high = results["task"], experiment.train_low, experiment.train_high
    return CardFacts(
        paper="A",
        title=task,
        training=f"per-position regression on Paper A's `{task}` task: {experiment.length} numbers per sample from "
        f"sub-ranges of [{low}, {high}] ({experiment.train_samples} samples), tested out of distribution on "
        f"[c * {low}, c * {high}] for c in {experiment.scales}",
        inputs="`hf_attn.data.algorithmic_dataset` builds them: `numeric_values` alone, the numbers and the "
        "scratchpad 0; the prediction at each position is `logits[..., 0]`",
        task_type="token-classification",
        dataset_name=f"{task} (synthetic numbers)",
        key_name="c",
        metrics=("mse", "accuracy"),
    )


def report_metrics(tolerance: float) -> tuple[tuple[str, str, bool], ...]:
    """(key, title, log scale) of each table and plot. The accuracy's title names the tolerance the runs were scored
    with: it is our choice, not the paper's, and a rerun may change it."""
    return ("mse", "MSE", True), ("accuracy", f"accuracy within {tolerance:g} c of the target", False)


def write_reports(output_dir: Path, results: list[dict], experiment: ExperimentArguments) -> str:
    """Per task, OUTPUT_DIR/TASK/{results.md, mse.png, accuracy.png}, and for runs with `tracked_epochs` also
    {by_epoch.md, mse_by_epoch.png}; returns the reports' text."""
    test_range = f"[{experiment.train_low}c, {experiment.train_high}c]"
    reports = write_task_reports(
        output_dir, results, lambda task: f"{task}: MSE and accuracy by test range {test_range}",
        report_metrics(experiment.tolerance),
    )  # fmt: skip
    tracked = [r for r in results if r.get("by_epoch")]
    for task in dict.fromkeys(r["task"] for r in tracked):
        reports += "\n" + write_gap_by_epoch(output_dir / task, [r for r in tracked if r["task"] == task])
    return reports


def gap_by_epoch(summary: dict) -> dict[str, float]:
    """Standard / positional median MSE at each epoch both were measured, from `summarize_along_training`."""
    return {epoch: summary["standard"][epoch]["median"] / positional["median"]
            for epoch, positional in summary["positional"].items() if epoch in summary["standard"]}  # fmt: skip


def write_gap_by_epoch(task_dir: Path, results: list[dict]) -> str:
    """How the models' MSE at the largest tracked c moves with training: a table and a plot, and the standard /
    positional ratio of medians per epoch."""
    scale = max((s for r in results for s in next(iter(r["by_epoch"].values()))), key=int)
    summary = experiments.summarize_along_training(results, "by_epoch", lambda mse: mse[scale])
    lines = [f"# {task_dir.name}: test MSE at c = {scale} along training", "",
             experiments.markdown_table(summary, "epoch")]  # fmt: skip
    if {"positional", "standard"} <= summary.keys():
        ratios = [f"epoch {epoch}: {ratio:.1f}x" for epoch, ratio in gap_by_epoch(summary).items()]
        lines += ["", "Standard / positional median MSE: " + ", ".join(ratios) + "."]
    text = experiments.write_markdown(task_dir / "by_epoch.md", lines, separator="\n")
    plot_metric(summary, task_dir / "mse_by_epoch.png", f"{task_dir.name}: MSE at c = {scale}",
                            f"MSE at c = {scale}", log_scale=True, xlabel="epoch")  # fmt: skip
    return text


FAMILY = register_family(
    "algorithmic", ExperimentArguments, ModelArguments, plan, problems, train_and_evaluate, card, write_reports
)

if __name__ == "__main__":
    FAMILY.cli()
