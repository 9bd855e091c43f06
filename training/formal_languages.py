"""Paper B, formal-language recognition: global, k-local and hybrid attention, trained short, tested long.

A token-classification model reads `<bos>` string `<eos>` and says accept/reject at `<eos>` (the datasets put the
string's label only there). Models train on lengths `train_min_length..train_max_length` (Paper B: 1..40) and are
tested on every length L in `range(test_min_length, test_max_length + 1, test_length_step)` (Paper B: 41..500,
step 1), `test_samples_per_length` strings each (Paper B: 512), half members and half adversarial near misses.
`ab_star` and `dyck2_bounded` have members only at even lengths: their odd test lengths are skipped.

Metrics per run (in results.json), from the `recognition` metric (`hf_attn.load_metric`):
- `accuracy` per test length (`by_scale[str(L)]["accuracy"]`) and `mean_accuracy`, their unweighted mean; the same
  on every training length (`train_accuracy_by_length`, `train_accuracy`), with test-style strings of a seed no
  training run uses;
- `longest_perfect_length`, Paper B's: the largest N with 100% accuracy at every length up to N, training lengths
  included (a model perfect in training that fails at 41 scores 40); 0 when the shortest training length is
  already imperfect. With a test step > 1 the lengths in between are not evaluated and count as perfect;
- `longest_perfect_test_length`, ours before Paper B's definition: the same walk over the test lengths alone (0:
  even the shortest test length is imperfect).
Each (language, position encoding, variant, learning rate, seed) is one run. As Paper B does, a table cell
aggregates every run of its (language, encoding, variant), all seeds and learning rates together: the mean, with
the spread and the max alongside, and the number of perfect runs (100% at every test length; Paper B counts a
language as recognised when at least one run is). With several learning rates, each language's report also shows
the cells per rate. Beside each table, what Paper B's theory predicts per cell (from the language's LTL class) and
whether our runs agree.

    python -m training.formal_languages configs/formal_languages/cpu.yaml
    python -m training.formal_languages configs/formal_languages/paper.yaml                 # for a GPU
    python -m training.formal_languages configs/formal_languages/cpu.yaml --resume true     # continue interrupted runs

Writes OUTPUT_DIR/LANGUAGE/POSITIONS/lr-LR/VARIANT/seed-S/{results.json, model/} per run, OUTPUT_DIR/LANGUAGE/
{results.md, accuracy.png} per language and OUTPUT_DIR/{results.md, accuracy_POSITIONS.png} across languages.
"""

import functools
import itertools
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
from evaluate import EvaluationModule
from transformers import AutoConfig, AutoModelForTokenClassification, Trainer, TrainingArguments, set_seed

import hf_attn  # noqa: F401  (registers the model types)
from hf_attn import experiments, load_metric
from hf_attn.data.formal_languages import (
    CONTAINS_POSITIVES,
    LANGUAGES,
    LTL_CLASSES,
    FormalLanguageVocab,
    formal_language_dataset,
    sample_strings,
)
from hf_attn.experiments import grid_table, labelled_argmax, list_field, plot_heatmap, write_markdown
from hf_attn.hub import CardFacts
from training import register_family
from training.models import PAPER_B_VARIANTS, VARIANTS_HELP, PaperBModelArguments, parse_variant

POSITION_EMBEDDINGS = ("none", "sinusoidal", "rope")


@dataclass
class ExperimentArguments(experiments.RunArguments):
    languages: list[str] = list_field(LANGUAGES, "Languages to learn, each its own experiment.", LANGUAGES)
    variants: list[str] = list_field(PAPER_B_VARIANTS, VARIANTS_HELP)
    position_embeddings: list[str] = list_field(
        POSITION_EMBEDDINGS, "Position encodings (Paper B: none, SiPE, RoPE).", POSITION_EMBEDDINGS
    )
    learning_rates: list[float] = field(
        default_factory=lambda: [1e-4, 3e-4, 5e-4],
        metadata={"help": "One run per learning rate (overrides `learning_rate`); tables aggregate over them."},
    )
    train_min_length: int = field(default=1, metadata={"help": "Shortest training string (Paper B: 1)."})
    train_max_length: int = field(default=40, metadata={"help": "Longest training string (Paper B: 40)."})
    train_samples: int = field(default=100_000, metadata={"help": "Training strings, half members (our choice)."})
    test_min_length: int = field(default=41, metadata={"help": "Shortest test length (Paper B: 41)."})
    test_max_length: int = field(default=500, metadata={"help": "Longest test length (Paper B: 500)."})
    test_length_step: int = field(default=1, metadata={"help": "Evaluate every this many lengths (Paper B: 1)."})
    test_samples_per_length: int = field(default=512, metadata={"help": "Test strings per length (Paper B: 512)."})
    contains_positives: str = field(
        default="written_in",
        metadata={
            "help": "Members of the contains_* languages, in training and test: the non-members' strings with the "
            "pattern written in (our inference), or uniform random members (Paper B does not say).",
            "choices": CONTAINS_POSITIVES,
        },
    )

    # `test_max_length` is not among the evaluation fields: it sets the model's n_positions. (Paper B: 5 seeds.)
    run_fields: ClassVar[tuple[str, ...]] = ("languages", "variants", "position_embeddings", "learning_rates",
                                             *experiments.RunArguments.run_fields)  # fmt: skip
    evaluation_fields: ClassVar[tuple[str, ...]] = ("test_min_length", "test_length_step", "test_samples_per_length")


@dataclass
class ModelArguments(PaperBModelArguments):
    n_layer: int = field(default=5, metadata={"help": "Depth (Paper B: 5)."})
    n_embd: int = field(default=64, metadata={"help": "Width d_model (Paper B: 64)."})
    n_head: int = field(default=8, metadata={"help": "Heads per layer (Paper B: 8)."})


# --- lengths and metrics ---------------------------------------------------------------------------------------


def has_strings(language: str, min_length: int, max_length: int) -> bool:
    """Whether `language` has members (and near misses) at some length in [min_length, max_length]."""
    try:
        sample_strings(language, 2, min_length, max_length)
    except ValueError:  # e.g. a single odd length for `ab_star`: the generator refuses it
        return False
    return True


def evaluated_lengths(language: str, experiment: ExperimentArguments) -> list[int]:
    """The evaluated lengths: the configured range, less those where the language has no members."""
    lengths = range(experiment.test_min_length, experiment.test_max_length + 1, experiment.test_length_step)
    return [length for length in lengths if has_strings(language, length, length)]


def training_lengths(language: str, experiment: ExperimentArguments) -> list[int]:
    """The training lengths where the language has members: Paper B's longest perfect length starts from them."""
    lengths = range(experiment.train_min_length, experiment.train_max_length + 1)
    return [length for length in lengths if has_strings(language, length, length)]


# --- validation and model --------------------------------------------------------------------------------------


def plan(experiment: ExperimentArguments) -> list[experiments.Group]:
    """A folder of runs per language, position encoding and learning rate: OUTPUT_DIR/LANGUAGE/POSITIONS/lr-LR."""
    grid = itertools.product(experiment.languages, experiment.position_embeddings, experiment.learning_rates)
    return [
        experiments.Group(f"{language}/{positions}/lr-{lr:g}", experiment.variants,
                          {"language": language, "positions": positions}, training={"learning_rate": lr})
        for language, positions, lr in grid
    ]  # fmt: skip


def problems(experiment: ExperimentArguments, model: ModelArguments, training: TrainingArguments) -> list[str]:
    """Every problem at once, before any data is built or model trained."""
    problems = []
    e = experiment  # short, for the messages below
    if not 1 <= e.train_min_length <= e.train_max_length:
        problems.append(f"need 1 <= train_min_length ({e.train_min_length}) <= train_max_length ({e.train_max_length})")
    if not e.train_max_length < e.test_min_length <= e.test_max_length:
        problems.append(
            f"need train_max_length ({e.train_max_length}) < test_min_length ({e.test_min_length}) <= "
            f"test_max_length ({e.test_max_length}): tests are on longer strings than training"
        )
    problems += experiments.below("test_length_step", of=e)
    problems += experiments.below("train_samples", "test_samples_per_length", of=e, least=2)  # a member, a non-member
    if not e.learning_rates or any(lr <= 0 for lr in e.learning_rates):
        problems.append(f"learning_rates must list at least one rate, all > 0, got {e.learning_rates}")
    if not e.seeds:
        problems.append("seeds must list at least one seed")
    if not problems:  # the ranges are sane: check every language has strings in them
        for language in e.languages:
            if not has_strings(language, e.train_min_length, e.train_max_length):
                problems.append(f"{language} has no strings of length {e.train_min_length}..{e.train_max_length}")
            if not evaluated_lengths(language, e):
                problems.append(f"{language} has no strings at any test length (even lengths only?)")
    return problems + experiments.config_problems({
        f"{variant} with {positions} positions": functools.partial(
            model_config, variant, positions, model, e.languages[0], e.test_max_length + 2)
        for variant, positions in itertools.product(e.variants, e.position_embeddings)
    })  # fmt: skip


def model_config(variant: str, positions: str, model: ModelArguments, language: str, n_positions: int):
    """Paper B's recognizer: causal, strict masks, post-LN, fp32, two labels read at `<eos>`, no dropout."""
    vocab = FormalLanguageVocab(language)
    return AutoConfig.for_model(
        **parse_variant(variant),
        n_layer=model.n_layer, n_embd=model.n_embd, n_head=model.n_head, n_positions=n_positions,
        block_style=model.block_style, attend_to_self=model.attend_to_self, position_embedding_type=positions,
        scale_embedding=model.scale_embedding,
        vocab_size=vocab.vocab_size, num_labels=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        pad_token_id=vocab.pad_id, bos_token_id=vocab.bos_id, eos_token_id=vocab.eos_id,
    )  # fmt: skip


def build_model(variant: str, positions: str, model: ModelArguments, language: str, n_positions: int):
    return AutoModelForTokenClassification.from_config(model_config(variant, positions, model, language, n_positions))


# --- one run ---------------------------------------------------------------------------------------------------


def string_decisions(
    trainer: Trainer, language: str, length: int, samples: int, contains_positives: str
) -> dict[str, np.ndarray]:
    """The `<eos>` decisions, labels and lengths of `samples` test strings of exactly `length` symbols: the
    `recognition` metric's inputs."""
    test_set = formal_language_dataset(language, samples, length, length, seed=experiments.TEST_SEED + length,
                                       contains_positives=contains_positives)  # fmt: skip
    rows = test_set.with_format("numpy")[:]  # labels (N, L + 2): IGNORE_INDEX except at <eos>
    logits = trainer.predict(experiments.InMemoryDataset(test_set.remove_columns("length"))).predictions
    predictions, references = labelled_argmax(logits, rows["labels"])  # one labelled position per string
    return {"predictions": predictions, "references": references, "lengths": rows["length"]}


def recognition_scores(recognition: EvaluationModule, decisions: list[dict[str, np.ndarray]]) -> dict:
    """The `recognition` metric over the strings of several `string_decisions`."""
    return recognition.compute(**{key: np.concatenate([d[key] for d in decisions]) for key in decisions[0]})


def train_and_evaluate(
    run: experiments.Run, experiment, model_args, training_args, language: str, positions: str
) -> experiments.Trained:
    set_seed(run.seed)
    model = build_model(run.model, positions, model_args, language, experiment.test_max_length + 2)  # + <bos>, <eos>
    train = formal_language_dataset(language, experiment.train_samples, experiment.train_min_length,
                                     experiment.train_max_length, seed=run.seed,
                                     contains_positives=experiment.contains_positives)  # fmt: skip
    args = experiments.run_arguments(training_args, run)
    trainer = Trainer(model=model, args=args, train_dataset=experiments.InMemoryDataset(train.remove_columns("length")))
    totals = run.train(trainer, experiment.resume)
    recognition = load_metric("recognition")
    decisions = functools.partial(string_decisions, trainer, language, samples=experiment.test_samples_per_length,
                                  contains_positives=experiment.contains_positives)  # fmt: skip
    train_strings = [decisions(n) for n in training_lengths(language, experiment)]
    test_strings = [decisions(n) for n in evaluated_lengths(language, experiment)]
    train_scores = recognition_scores(recognition, train_strings)
    test_scores = recognition_scores(recognition, test_strings)
    every_length = recognition_scores(recognition, train_strings + test_strings)  # Paper B's walk starts in training
    return experiments.Trained(
        trainer, totals, {str(n): {"accuracy": a} for n, a in test_scores["accuracy_by_length"].items()},
        {
            "mean_accuracy": test_scores["mean_accuracy"],
            "longest_perfect_length": every_length["longest_perfect_length"],
            "longest_perfect_test_length": test_scores["longest_perfect_length"],
            "train_accuracy": train_scores["mean_accuracy"],
            "train_accuracy_by_length": {str(n): a for n, a in train_scores["accuracy_by_length"].items()},
        },
    )  # fmt: skip


def card(experiment: ExperimentArguments, results: dict) -> CardFacts:
    language, e = results["language"], experiment
    return CardFacts(
        paper="B",
        title=f"{language}, {results['positions']} positions",
        training=f"recognition of Paper B's formal language `{language}` (the decision is read at `<eos>`): "
        f"{e.train_samples} strings of length {e.train_min_length}..{e.train_max_length}, tested on lengths "
        f"{e.test_min_length}..{e.test_max_length}",
        inputs="`hf_attn.data.formal_language_dataset` builds them: `<bos>` (id 1), the symbols (ids 3, 4, ... in "
        "alphabet order), `<eos>` (id 2); label 1 (in the language) or 0 is the argmax of the logits at "
        "`<eos>`",
        task_type="text-classification",
        dataset_name=f"{language} (synthetic strings)",
        key_name="length",
        metrics=("accuracy",),
    )


# --- tables ----------------------------------------------------------------------------------------------------


def is_perfect(result: dict) -> bool:
    """100% accuracy at every test length: Paper B counts a language as recognised if one run is."""
    return all(metrics["accuracy"] == 1.0 for metrics in result["by_scale"].values())


def cell_summary(runs: list[dict]) -> dict:
    """One table cell over `runs`, as Paper B aggregates them: means, with the spread and the max alongside."""
    accuracies = [r["mean_accuracy"] for r in runs]
    longest = [r["longest_perfect_length"] for r in runs]
    return {
        "runs": len(runs), "perfect_runs": sum(map(is_perfect, runs)),
        "mean_accuracy": statistics.fmean(accuracies), "min_accuracy": min(accuracies), "max_accuracy": max(accuracies),
        "longest_perfect_length": statistics.fmean(longest), "max_longest_perfect_length": max(longest),
    }  # fmt: skip


def cell_summaries(results: list[dict], learning_rate: float | None = None) -> dict[tuple[str, str, str], dict]:
    """Per (language, positions, variant): the summary of every run, all seeds and learning rates together (or
    those at `learning_rate`)."""
    grouped: dict[tuple[str, str, str], list[dict]] = {}
    for result in results:
        if learning_rate is None or result["learning_rate"] == learning_rate:
            grouped.setdefault((result["language"], result["positions"], result["model"]), []).append(result)
    return {key: cell_summary(runs) for key, runs in grouped.items()}


RECOGNISED_CLASSES = {"global": {"LTL[P]"}, "local": {"LTL[Y]"}, "hybrid": {"LTL[P]", "LTL[Y]", "LTL[P,Y]"}}


def predicted_recognition(language: str, variant: str) -> bool | None:
    """Paper B's theory: whether `variant`'s heads can recognise `language`, or None where it does not say.

    Global heads give LTL[P], 1-local heads LTL[Y], hybrid-1 LTL[P, Y]. A wider window gives LTL[Y<=k], weaker than
    LTL[Y] (1-local is the most expressive window): it still cannot do what 1-local cannot, but whether it keeps a
    given LTL[Y] language is open. Languages outside LTL[P, Y] have no guarantee. Expressivity only: a model that
    can may still not learn the language.
    """
    ltl_class = LTL_CLASSES[language]
    kind, _, window = variant.partition("-")
    if ltl_class not in RECOGNISED_CLASSES["hybrid"]:
        return None
    if ltl_class not in RECOGNISED_CLASSES[kind]:
        return False
    return None if "Y" in ltl_class and window != "1" else True


def prediction_cell(language: str, variant: str, stats: dict) -> str:
    """What Paper B predicts for a cell and whether our runs agree (recognised: one run perfect at every length)."""
    predicted = predicted_recognition(language, variant)
    recognised = stats["perfect_runs"] > 0
    runs = f"{stats['perfect_runs']} of {stats['runs']} perfect"
    if predicted is None:
        reason = "open for k > 1" if LTL_CLASSES[language] in RECOGNISED_CLASSES["hybrid"] else "no guarantee"
        return f"{reason}; {runs}"
    return f"{'can' if predicted else 'cannot'}; {runs}" + ("" if predicted == recognised else " (differs)")


def _cell(stats: dict) -> str:
    return (
        f"{stats['mean_accuracy']:.3f} ({stats['min_accuracy']:.2f}-{stats['max_accuracy']:.2f}) / "
        f"{stats['longest_perfect_length']:.0f} (max {stats['max_longest_perfect_length']}) / "
        f"{stats['perfect_runs']} of {stats['runs']}"
    )


def _grids(summaries: dict, rows: list[str], columns: list[str], key) -> tuple[dict, dict]:
    """Table cells and heatmap values, `[row][column]`, of the cell summaries at `key(row, column)`."""
    cells = {row: {column: _cell(summaries[key(row, column)]) for column in columns} for row in rows}
    accuracy = {row: {column: summaries[key(row, column)]["mean_accuracy"] for column in columns} for row in rows}
    return cells, accuracy


def encoding_tables(summaries: dict, variants: list[str], languages: list[str], positions: str) -> str:
    """Two markdown tables for one position encoding, variants by language: the cells, then Paper B's predictions
    beside how many of our runs recognised each language."""
    cells, _ = _grids(summaries, variants, languages, lambda v, lang: (lang, positions, v))
    predictions: dict[str, dict[str, str]] = {variant: {} for variant in variants}
    for variant, language in itertools.product(variants, languages):
        stats = summaries[language, positions, variant]
        predictions[variant][f"{language} ({LTL_CLASSES[language]})"] = prediction_cell(language, variant, stats)
    return "\n\n".join([
        grid_table(cells, "variant"),
        "What Paper B's theory predicts (can the variant recognise the language?) and how many of our runs did "
        "(perfect at every test length); `(differs)` marks a disagreement:",
        grid_table(predictions, "variant"),
    ])  # fmt: skip


def settings_table(
    by_setting: dict[str, list[dict]], languages: list[str], variants: list[str], positions: str = "none"
) -> str:
    """The same (language, variant) cells under `positions` trained under several settings (a column each), beside
    Paper B's prediction: e.g. whether a disagreement goes away with longer training or a larger model."""
    summaries = {setting: cell_summaries(results) for setting, results in by_setting.items()}
    verdicts = {True: "can", False: "cannot", None: "no guarantee"}
    cells = {}
    for language, variant in itertools.product(languages, variants):
        row = {"Paper B": verdicts[predicted_recognition(language, variant)]}
        for setting, summary in summaries.items():
            stats = summary.get((language, positions, variant))
            row[setting] = _cell(stats) if stats else "not run"
        cells[f"{language} / {variant}"] = row
    return grid_table(cells, "language / variant")


def write_reports(output_dir: Path, results: list[dict], experiment: ExperimentArguments) -> str:
    """Per language: results.md (rows variants, columns encodings) and accuracy.png; the same across languages."""
    summaries = cell_summaries(results)
    legend = (
        f"Trained on lengths {experiment.train_min_length}..{experiment.train_max_length}; tested on lengths "
        f"{experiment.test_min_length}..{experiment.test_max_length} step {experiment.test_length_step} (odd ones "
        f"skipped where the language has none), {experiment.test_samples_per_length} strings each. A cell aggregates "
        "every run of its variant and encoding (all seeds and learning rates), as Paper B does: mean accuracy over "
        "test lengths (lowest-highest run) / Paper B's longest perfect length, training lengths included (max over "
        "runs) / runs perfect at every test length."
    )
    overall = [f"# Formal-language recognition ({len(results)} runs)", legend]

    def with_runs(values: list, key: str) -> list:  # a folder may hold a subset of its commands' runs
        return [value for value in values if any(result[key] == value for result in results)]

    variants, languages = with_runs(experiment.variants, "model"), with_runs(experiment.languages, "language")
    encodings = with_runs(experiment.position_embeddings, "positions")
    for language in languages:
        cells, accuracy = _grids(summaries, variants, encodings, lambda v, p, lang=language: (lang, p, v))
        sections = [f"# {language}: recognition accuracy by variant and position encoding", legend,
                    grid_table(cells, "variant")]  # fmt: skip
        if len(experiment.learning_rates) > 1:  # each rate too, so that no rate's failures hide in the means
            for lr in experiment.learning_rates:
                at_rate = cell_summaries(results, learning_rate=lr)
                cells, _ = _grids(at_rate, variants, encodings, lambda v, p, lang=language: (lang, p, v))
                sections += [f"## learning rate {lr:g}", grid_table(cells, "variant")]
        write_markdown(output_dir / language / "results.md", sections)
        plot_heatmap(accuracy, output_dir / language / "accuracy.png", f"{language}: mean test accuracy")
    for positions in encodings:
        overall += [f"## position encoding `{positions}`", encoding_tables(summaries, variants, languages, positions)]
        _, accuracy = _grids(summaries, variants, languages, lambda v, lang, p=positions: (lang, p, v))
        plot_heatmap(accuracy, output_dir / f"accuracy_{positions}.png", f"mean test accuracy, positions {positions}")
    return write_markdown(output_dir / "results.md", overall)


FAMILY = register_family(
    "formal_languages", ExperimentArguments, ModelArguments, plan, problems, train_and_evaluate, card, write_reports
)

if __name__ == "__main__":
    FAMILY.cli()
