"""Every committed report and every table of the README and docs regenerated from the committed results, in one
command.

    python -m training.reports

`docs/results/NAME/` holds one CPU experiment's runs as results.json files (no weights: those stay in the run's
`model/` folder under `outputs/`). For each folder this rewrites the family's reports (results.md and the plots),
then every table of README.md and docs/*.md between `<!-- generated: NAME -->` and `<!-- /generated -->` from the
same files. Nothing trains. To publish a new run: copy its OUTPUT_DIR without `model/` and `checkpoint-*` folders
(`--publish OUTPUT_DIR NAME`; the same NAME for several folders merges them, e.g. the two processes of one
experiment).
"""

import argparse
import json
import shutil
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from benchmarks import hybrid_tradeoff, long_context
from hf_attn.experiments import (
    aggregate,
    collapse_summary,
    family_named,
    format_value,
    grid_table,
    is_collapsed,
    summarize_along_training,
)
from hf_attn.experiments.arguments import experiment_of
from hf_attn.experiments.runs import load_results
from training import (  # noqa: F401  (each script registers its family)
    algorithmic,
    baseline_learning_rate,
    formal_languages,
    induction,
    mixed,
    paper_numbers,
    wikitext,
)

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs" / "results"
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))  # the pages that hold generated blocks
PAPER_A = ("quickstart", "algorithmic_cpu", "algorithmic_cpu_long", "mixed_cpu", "induction_cpu",
           "induction_cpu_layernorm")  # fmt: skip
FORMAL_PAPER_SIZE = "formal_languages_paper_size_cpu"  # the main table at Paper B's model size: the headline
FORMAL_POSITIVES = "formal_languages_check_positives"  # its contains_ab local cells with uniform random members
FORMAL_CHECKS = {"smaller model: 2 layers x 32, 500 steps": "formal_languages_table_cpu",
                 "4x longer: 2,000 steps": "formal_languages_check_longer",
                 "Paper B's size: 5 layers x 64, 8 heads, 500 steps": "formal_languages_check_paper_size"}  # fmt: skip
PAPER_B_FORMAL = ("formal_languages_table_cpu", "formal_languages_positions_cpu", "formal_languages_check_longer",
                  "formal_languages_check_paper_size")  # fmt: skip
SINUSOIDAL_UNSCALED = {
    "formal": "formal_languages_check_sinusoidal_unscaled",
    "wikitext": "wikitext_check_sinusoidal_unscaled",
}  # before Vaswani et al.'s scale was default
PAPER_B = (FORMAL_PAPER_SIZE, FORMAL_POSITIVES, *PAPER_B_FORMAL, SINUSOIDAL_UNSCALED["formal"], "wikitext_cpu",
           SINUSOIDAL_UNSCALED["wikitext"])  # fmt: skip
HYBRID = ("wikitext_llama_cpu",)  # docs/hybrid.md's experiment runs
HYBRID_TRADEOFF = "hybrid_tradeoff"  # benchmarks/hybrid_tradeoff.py's results (a folder per window, `k16`, ...,
# a folder per model in each) and its models' pretraining
LONG_CONTEXT = "long_context"  # benchmarks/long_context.py's results, a folder per model
PUBLISHED = PAPER_A + PAPER_B + HYBRID  # the folders of docs/results whose reports this rewrites
IDLE_RUN_TIMES = "paper_b_idle_run_times"  # two or more runs of each of these, with nothing else running
IDLE_TIMED = (*PAPER_B_FORMAL, "wikitext_cpu")
TASK_NAMES = {"cumulative_sum": "sum", "cumulative_min": "min", "cumulative_median": "median", "sort": "sort",
              "cumulative_max_subarray_sum": "max subarray"}  # fmt: skip


def write_family_reports(folder: Path) -> None:
    """Rewrites the reports of the experiment in `folder` from its runs' results, as its script would."""
    results = load_results(folder)
    family = family_named(results[0]["experiment"])
    family.write_reports(folder, results, experiment_of(family.arguments, results))


def median(summary: dict, model: str, row: str) -> float:
    return summary.get(model, {}).get(row, {"median": float("nan")})["median"]


def published(value: float) -> str:
    """A paper's number as the source gives it (two significant digits): no padding to our precision."""
    return f"{value:g}"


def beside(ours: float, paper: float) -> str:
    return f"{format_value(ours)} ({published(paper)})"


def quickstart_table() -> str:
    """The quickstart's MSE per c, Paper A's own figure for the same task (cumulative min) beside each."""
    results = load_results(DOCS / "quickstart")
    summary = aggregate(results, "mse")
    lines = ["| c | positional mean | positional median | standard mean | standard median |", "|---|---|---|---|---|"]
    for c in sorted(summary["positional"], key=int):
        cells = [beside(summary[m][c][stat], paper_numbers.ALGORITHMIC_MSE["cumulative_min", m, stat][int(c) + 1])
                 for m in ("positional", "standard") for stat in ("mean", "median")]  # fmt: skip
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    note = "In parentheses: Paper A's figure over its 10 runs (`training/paper_numbers.py`), trained far longer."
    return "\n".join(lines) + "\n\n" + note + "\n\n" + collapse_summary(results)


PAPER_A_ALGORITHMIC_NOTE = (
    "In parentheses: Paper A's median over its 10 runs per model, from the authors' result files "
    "(`training/paper_numbers.py`). Its protocol trains 30,000 samples for 2,001 epochs with batch 1,000; ours is the "
    "config named above, far shorter, so the comparison is of the effect's sign and size, not of equal training."
)


def algorithmic_table(name: str) -> str:
    """Per task: median MSE over seeds in and far out of distribution, and the ratio Paper A's claim is about, each
    with Paper A's own median beside it, from the runs in docs/results/NAME."""
    results = load_results(DOCS / name)
    lines = [
        "| task | positional, c = 1 | standard, c = 1 | positional, c = 10 | standard, c = 10 | standard / positional "
        "at c = 10 | runs kept (collapsed) |",
        "|---|---|---|---|---|---|---|",
    ]
    for task, name in TASK_NAMES.items():
        runs = [r for r in results if r["task"] == task]
        summary = aggregate(runs, "mse")
        paper = {m: paper_numbers.ALGORITHMIC_MSE[task, m, "median"] for m in ("positional", "standard")}
        p1, s1 = median(summary, "positional", "1"), median(summary, "standard", "1")
        p10, s10 = median(summary, "positional", "10"), median(summary, "standard", "10")
        kept = {m: sum(r["model"] == m and not is_collapsed(r) for r in runs) for m in ("positional", "standard")}
        dropped = sum(is_collapsed(r) for r in runs)
        cells = [beside(p1, paper["positional"][2]), beside(s1, paper["standard"][2]),
                 beside(p10, paper["positional"][-1]), beside(s10, paper["standard"][-1]),
                 f"{s10 / p10:.1f}x ({paper['standard'][-1] / paper['positional'][-1]:,.0f}x)",
                 f"{kept['positional']} + {kept['standard']} ({dropped})"]  # fmt: skip
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + PAPER_A_ALGORITHMIC_NOTE


def algorithmic_by_epoch_table(name: str) -> str:
    """Per task: median MSE over seeds at c = 10 after each tracked epoch, and the standard / positional ratio Paper
    A's claim is about, from the runs' `by_epoch` in docs/results/NAME; Paper A's own after 2,001 epochs beside."""
    results = load_results(DOCS / name)
    paper_column, models = "Paper A, epoch 2,001", ("positional", "standard")
    rows = {}
    for task, task_name in TASK_NAMES.items():
        summary = summarize_along_training([r for r in results if r["task"] == task], "by_epoch", lambda mse: mse["10"])
        epochs = sorted(summary["positional"], key=int)
        paper = {m: paper_numbers.ALGORITHMIC_MSE[task, m, "median"][-1] for m in models}
        for model in models:
            cells = {f"epoch {e}": format_value(summary[model][e]["median"]) for e in epochs}
            rows[f"{task_name}, {model}"] = cells | {paper_column: published(paper[model])}
        ratios = {f"epoch {e}": f"{ratio:.1f}x" for e, ratio in algorithmic.gap_by_epoch(summary).items()}
        paper_ratio = f"{paper['standard'] / paper['positional']:,.0f}x"
        rows[f"{task_name}, standard / positional"] = ratios | {paper_column: paper_ratio}
    note = (
        "Median test MSE over seeds at c = 10 after each epoch (collapsed runs left out). Paper A's: its median over "
        "10 runs after 2,001 epochs on the same 30,000 samples and batch (`training/paper_numbers.py`)."
    )
    return grid_table(rows, "task, model") + "\n\n" + note


def mixed_table(task: str) -> str:
    """Median MSE over seeds per c, both name sets; GPT-2's share of parsed answers beside its MSE. In parentheses,
    Paper A's medians: its small models beside ours on seen names (as its code tests them), its fine-tuned
    GPT-2-large beside our GPT-2 on unseen names (as it reports them)."""
    results = [r for r in load_results(DOCS / "mixed_cpu") if r["task"] == task]
    mse = {names: aggregate(results, f"mse_{names}") for names in ("seen", "unseen")}
    unparsed = {names: aggregate(results, f"unparsed_{names}") for names in ("seen", "unseen")}
    paper = {m: paper_numbers.MIXED_MSE[task, m, "median"][2:] for m in ("positional", "standard")}
    paper["gpt2"] = paper_numbers.MIXED_GPT2_LARGE[task, "MSE", "median"]
    parameters = {r["model"]: r["parameters"] for r in results}
    n_positions = results[0]["config"]["model"]["n_positions"]
    header = ["c"] + [f"{model}, {names} names" for names in ("seen", "unseen") for model in
                      ("positional", "standard", baseline_label(results, parameters["gpt2"]))]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for c in sorted(mse["seen"]["positional"], key=int):
        cells = []
        for names in ("seen", "unseen"):
            for m in ("positional", "standard"):
                ours = median(mse[names], m, c)
                cells.append(beside(ours, paper[m][int(c) - 1]) if names == "seen" else format_value(ours))
            parsed = 1 - median(unparsed[names], "gpt2", c)
            gpt2 = median(mse[names], "gpt2", c)
            gpt2_cell = beside(gpt2, paper["gpt2"][int(c) - 1]) if names == "unseen" else format_value(gpt2)
            cells.append(f"{gpt2_cell}, {parsed:.0%} parsed")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    note = (
        "In parentheses: Paper A's medians over 10 runs, from the authors' result files (`training/paper_numbers.py`):"
        " its positional and standard models (50,000 samples, 2,001 epochs) beside ours on seen names, its "
        "fine-tuned GPT-2-large beside our GPT-2 on unseen names. Parameters: positional "
        f"{parameters['positional']:,}, standard {parameters['standard']:,} "
        f"({parameters['positional'] / parameters['standard']:.0f}x: nearly all are the positional heads' query and "
        f"key projections of the one-hot P, as wide as the {n_positions} positions in and out, as in Paper A's code), "
        f"GPT-2 {parameters['gpt2']:,}."
    )
    return "\n".join(lines) + "\n\n" + note + "\n\n" + collapse_summary(results)


def baseline_label(results: list[dict], parameters: int) -> str:
    """The GPT-2 baseline as the runs had it: its size, and its Hub id, or that it was pretrained offline (a local
    folder, `training.pretrain_gpt2`)."""
    name = results[0]["config"]["experiment"]["baseline_model"]
    local = name.count("/") > 1 or name.startswith((".", "/")) or (ROOT / name).exists()
    return f"GPT-2 ({parameters / 1e6:.1f}M, {'pretrained offline' if local else name})"


def induction_table(name: str = "induction_cpu") -> str:
    """Median token accuracy over seeds at the end of training, per depth, on seen and unseen characters."""
    results = load_results(DOCS / name)
    accuracy = {split: aggregate(results, f"accuracy_{split}") for split in ("id", "ood")}
    columns = ["positional, seen characters", "standard, seen characters", "positional, unseen", "standard, unseen"]
    lines = ["| depth | " + " | ".join(columns) + " |", "|---|---|---|---|---|"]
    for depth in sorted(accuracy["id"]["positional"], key=int):
        cells = [format_value(median(accuracy[s], m, depth)) for s in ("id", "ood") for m in ("positional", "standard")]
        lines.append(f"| {depth} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + collapse_summary(results)


def induction_by_step_table() -> str:
    """Median in-distribution accuracy over seeds along training: a row per depth and model, a column per tracked
    step (the runs' `by_step`)."""
    results = load_results(DOCS / "induction_cpu")
    rows = {}
    for depth in sorted({r["depth"] for r in results}):
        runs = [r for r in results if r["depth"] == depth]
        summary = summarize_along_training(runs, "by_step", lambda measured: measured["accuracy_id"])
        for model, by_step in summary.items():
            rows[f"{depth}, {model}"] = {f"step {s}": format_value(v["median"]) for s, v in
                                         sorted(by_step.items(), key=lambda item: int(item[0]))}  # fmt: skip
    return grid_table(rows, "depth, model")


def formal_languages_table(name: str) -> str:
    """Paper B's main table (no position encoding) from the runs in docs/results/NAME, with its predictions beside,
    then our mean accuracy beside Paper B's measured one."""
    results = load_results(DOCS / name)
    experiment = experiment_of(formal_languages.ExperimentArguments, results)
    summaries = formal_languages.cell_summaries(results)
    tables = formal_languages.encoding_tables(summaries, experiment.variants, experiment.languages, "none")
    beside_paper = formal_languages_beside_paper(summaries, experiment.variants, experiment.languages, results[0])
    return tables + "\n\n" + beside_paper


def formal_languages_beside_paper(summaries: dict, variants: list[str], languages: list[str], run: dict) -> str:
    """Mean accuracy (%) over test lengths 41..500 per cell, ours then Paper B's in parentheses; `run`, any of ours,
    says our model and training."""
    published_accuracy = paper_numbers.FORMAL_LANGUAGES_ACCURACY
    lines = ["| variant | " + " | ".join(languages) + " |", "|---" * (len(languages) + 1) + "|"]
    for variant in variants:
        cells = [f"{100 * summaries[language, 'none', variant]['mean_accuracy']:.1f} "
                 f"({published_accuracy[language][variant]:.1f})" for language in languages]  # fmt: skip
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    model, training = run["config"]["model"], run["config"]["training"]
    note = (
        "Mean accuracy (%) over the test lengths, all runs of a cell; in parentheses Paper B's, over 15 runs of its "
        "5-layer, 64-wide model with 8 heads trained 1,000,000 steps (`training/paper_numbers.py`; taken from notes "
        f"of the paper). Ours: {model['n_layer']} layers, {model['n_embd']} wide, {model['n_head']} heads, trained "
        f"{training['max_steps']:,} steps."
    )
    return "Beside Paper B's measured accuracy:\n\n" + "\n".join(lines) + "\n\n" + note


def formal_languages_positions_table() -> str:
    """Paper B's other encodings (sinusoidal, RoPE) for k = 1, with the predictions beside: a table per encoding."""
    results = load_results(DOCS / "formal_languages_positions_cpu")
    experiment = experiment_of(formal_languages.ExperimentArguments, results)
    summaries = formal_languages.cell_summaries(results)
    return "\n\n".join(
        f"Position encoding `{positions}`:\n\n"
        + formal_languages.encoding_tables(summaries, experiment.variants, experiment.languages, positions)
        for positions in experiment.position_embeddings
    )


def formal_languages_checks_table() -> str:
    """The 2-layer table's disagreements with Paper B, trained longer and at Paper B's model size."""
    by_setting = {setting: load_results(DOCS / name) for setting, name in FORMAL_CHECKS.items()}
    checked = experiment_of(formal_languages.ExperimentArguments, by_setting["4x longer: 2,000 steps"])
    return formal_languages.settings_table(by_setting, checked.languages, checked.variants)


def formal_languages_positives_table() -> str:
    """The main table's cells of the uniform-members check, its members written in and uniform side by side, with
    Paper B's measured accuracy after them."""
    uniform = load_results(DOCS / FORMAL_POSITIVES)
    checked = experiment_of(formal_languages.ExperimentArguments, uniform)
    by_setting = {"members written in (the main table)": load_results(DOCS / FORMAL_PAPER_SIZE),
                  "uniform random members": uniform}  # fmt: skip
    table = formal_languages.settings_table(by_setting, checked.languages, checked.variants)
    published_accuracy = paper_numbers.FORMAL_LANGUAGES_ACCURACY
    measured = [f"{language} / {variant} {published_accuracy[language][variant]:.1f}%"
                for language in checked.languages for variant in checked.variants]  # fmt: skip
    return table + "\n\nPaper B's mean accuracy (`training/paper_numbers.py`): " + ", ".join(measured) + "."


def formal_languages_sinusoidal_scale_table() -> str:
    """The sinusoidal cells with token embeddings scaled by sqrt(n_embd) (the default) and unscaled, side by side."""
    scaled = [r for r in load_results(DOCS / "formal_languages_positions_cpu") if r["positions"] == "sinusoidal"]
    by_setting = {"x sqrt(n_embd) (the table's)": scaled,
                  "unscaled": load_results(DOCS / SINUSOIDAL_UNSCALED["formal"])}  # fmt: skip
    experiment = experiment_of(formal_languages.ExperimentArguments, scaled)
    return formal_languages.settings_table(by_setting, experiment.languages, experiment.variants, "sinusoidal")


def wikitext_table(name: str) -> str:
    """WikiText-2 test perplexity per variant and position encoding, collapsed runs named and left out; for the
    main runs, hybrid-1's change against global beside the only WikiText figure Paper B publishes."""
    results = load_results(DOCS / name)
    experiment = experiment_of(wikitext.ExperimentArguments, results)
    section = wikitext.perplexity_section(results, experiment)
    return section if name != "wikitext_cpu" else section + "\n\n" + wikitext_beside_paper(results)


def wikitext_beside_paper(results: list[dict]) -> str:
    """Hybrid-1's mean perplexity minus global's, per encoding, Paper B's in parentheses."""

    def mean_perplexity(variant: str, positions: str) -> float:
        kept = [r["by_scale"][variant]["perplexity"] for r in results
                if r["model"] == variant and r["positions"] == positions and not is_collapsed(r)]  # fmt: skip
        return statistics.mean(kept)

    changes = [
        f"{positions} {mean_perplexity('hybrid-1', positions) - mean_perplexity('global', positions):+.0f} "
        f"({published(paper_change)})"
        for positions, paper_change in paper_numbers.WIKITEXT_HYBRID_1_PERPLEXITY_CHANGE.items()
    ]
    return (
        "Hybrid-1's mean perplexity minus global's: " + ", ".join(changes) + ". In parentheses Paper B's, the only "
        "WikiText-2 figures it publishes (GPT-2-small shape; its absolute perplexities, tokenizer and schedule are "
        "not given; `training/paper_numbers.py`)."
    )


def hybrid_pretraining_text() -> str:
    """What the offline models the trade-off converts are, from their pretraining records."""
    lines = ["| model | parameters | pretrained on | tokens | training time (load as it ended) | held-out perplexity |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for path in sorted((DOCS / HYBRID_TRADEOFF / "pretraining").glob("*.json")):
        run = json.loads(path.read_text())
        config = run["config"]["pretrain"]
        shape = f"{config['n_layer']} layers x {config['n_embd']}, {config['n_head']} heads"
        if config.get("n_kv_head"):
            shape += f" over {config['n_kv_head']} key/value heads"
        lines.append(f"| {path.stem} ({run['model']}, {shape}) | {run['parameters']:,} | "
                     f"{' and '.join(run['files'])} | {run['train_tokens']:,} | {run['train_seconds'] / 60:.0f} min "
                     f"({run['machine']['load_average'][0]:.1f}) | {run['held_out_perplexity']:.0f} on "
                     f"{run['held_out_tokens']:,} tokens |")  # fmt: skip
    return "\n".join(lines)


def hybrid_tradeoff_runs() -> list[tuple[Path, dict]]:
    """The published trade-off runs, one folder per window and model, widest window first, each with its results."""
    windows = sorted((DOCS / HYBRID_TRADEOFF).glob("k[0-9]*"), key=lambda path: -int(path.name[1:]))
    folders = [model for window in windows for model in sorted(path for path in window.iterdir() if path.is_dir())]
    return [(folder, json.loads((folder / "results.json").read_text())) for folder in folders]


def hybrid_tradeoff_tables() -> str:
    """The trade-off's table and plot per converted model and window (benchmarks/hybrid_tradeoff.py)."""
    parts = []
    for folder, result in hybrid_tradeoff_runs():
        plot = (folder / "tradeoff.png").relative_to(ROOT / "docs")
        parts.append(
            f"**{folder.name}, k = {result['local_window']}** ({result['family']}, {result['layers']} layers of "
            f"{result['heads']} heads; load {result['machine']['load_average'][0]:.1f} on 2 cores as it ended, "
            f"[results.json]({plot.parent}/results.json))\n\n{hybrid_tradeoff.table(result)}\n"
            f"![{folder.name}, k = {result['local_window']}]({plot})\n"
        )
    return "\n".join(parts)


def long_context_runs() -> list[tuple[Path, dict]]:
    """The published long-context runs, a folder per model, each with its results."""
    paths = sorted((DOCS / LONG_CONTEXT).glob("*/results.json"))
    return [(path.parent, json.loads(path.read_text())) for path in paths]


def long_context_tables() -> str:
    """The long-context benchmark's notes, tables and plot per model (benchmarks/long_context.py)."""
    parts = []
    for folder, result in long_context_runs():
        plot = (folder / "long_context.png").relative_to(ROOT / "docs")
        parts.append(
            f"**{result['name']}** ([results.json]({plot.parent}/results.json)): {long_context.notes(result)}\n\n"
            f"{long_context.tables(result, '####')}\n![{result['name']}]({plot})\n"
        )
    return "\n".join(parts) or (
        "No run published yet. To publish one: `python -m training.reports --publish outputs/long_context/NAME "
        f"{LONG_CONTEXT}/NAME`."
    )


def gpt2_pretraining_text() -> str:
    """What the offline GPT-2 baseline is, from its pretraining record."""
    run = json.loads((DOCS / "gpt2_pretraining" / "results.json").read_text())
    pretrain, training = run["config"]["pretrain"], run["config"]["training"]
    return (
        f"That is `GPT2LMHeadModel` with GPT-2's tokenizer: {pretrain['n_layer']} layers, width {pretrain['n_embd']}, "
        f"{pretrain['n_head']} heads, {run['parameters']:,} parameters (gpt2-large: 774M), pretrained as a language "
        f"model for {training['num_train_epochs']:g} epochs on {run['train_tokens']:,} tokens of "
        f"{' and '.join(run['files'])} (GPT-2: 40 GB of WebText) in "
        f"{run['train_seconds'] / 60:.0f} minutes; on the {run['held_out_tokens']:,} held-out tokens its perplexity "
        f"is {run['held_out_perplexity']:.0f}. The mixed-task script then fine-tunes it with the recipe above on fewer "
        "samples and at a larger learning rate (`configs/mixed/cpu.yaml` says how many, which and why). It has read "
        "some English, and is far from the GPT-2 Paper A fine-tunes: its rows in the mixed-task tables are labelled "
        "as this substitute."
    )


def gpt2_learning_rate_table() -> str:
    """The offline GPT-2's fine-tuning rates tried on validation prompts (training/baseline_learning_rate.py)."""
    return baseline_learning_rate.table(
        json.loads((DOCS / "gpt2_pretraining" / "baseline_learning_rate.json").read_text())
    )


def run_times_table(names: tuple[str, ...]) -> str:
    """Training time per run (evaluation excluded) and the load the machine was under when each run ended."""
    lines = ["| experiment | runs | training, all runs | per run (min - max) | 1-minute load when runs ended |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name in names:
        results = load_results(DOCS / name)
        seconds = [r["train_seconds"] for r in results]
        loads = [r["machine"]["load_average"][0] for r in results]
        lines.append(
            f"| `{name}` | {len(results)} | {sum(seconds) / 60:.1f} min | {min(seconds):.0f} - {max(seconds):.0f} s "
            f"| {min(loads):.1f} - {max(loads):.1f} (median {statistics.median(loads):.1f}) on "
            f"{results[0]['machine']['cpus']} cores |"
        )
    return "\n".join(lines)


def idle_pace_minutes(name: str) -> float:
    """How long all runs of `name` take, two at a time as they were run, at the pace of its runs timed idle."""
    timed = load_results(DOCS / IDLE_RUN_TIMES / name)
    return len(load_results(DOCS / name)) * statistics.mean(r["train_seconds"] for r in timed) / 2 / 60


def idle_run_times_table(names: tuple[str, ...]) -> str:
    """Per config: its runs timed on an idle machine (two or more), and what all its runs would take at that pace,
    two at a time as they were run."""
    lines = ["| config's runs | timed when idle | per run | load when they ended | all its runs at this pace |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name in names:
        timed = load_results(DOCS / IDLE_RUN_TIMES / name)
        seconds = [r["train_seconds"] for r in timed]
        loads = [r["machine"]["load_average"][0] for r in timed]
        runs = len(load_results(DOCS / name))
        lines.append(
            f"| `{name}` | {len(timed)} ({', '.join(sorted({r['model'] for r in timed}))}) | {min(seconds):.0f} - "
            f"{max(seconds):.0f} s | {min(loads):.1f} - {max(loads):.1f} | {runs} runs: about "
            f"{idle_pace_minutes(name):.0f} min |"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class PublishedTable:
    """One published table: where it is shown, the command that makes it and the committed results it comes from."""

    table: str  # what it shows, linked to the page that shows it
    script: str  # the training module
    configs: tuple[str, ...]  # under configs/, run one after the other
    results: str  # under docs/results/
    recorded_time: str = ""  # for results that record no training time


EXPERIMENTS = (
    PublishedTable("[quickstart](../README.md#quickstart-positional-attention-generalises-out-of-distribution)",
                   "algorithmic", ("algorithmic/min_cpu.yaml",), "quickstart"),
    PublishedTable("[algorithmic tasks](results_paper_a.md#algorithmic-tasks)", "algorithmic",
                   ("algorithmic/cpu.yaml",), "algorithmic_cpu"),
    PublishedTable("[algorithmic tasks, longer](results_paper_a.md#algorithmic-tasks-closer-to-paper-as-training)",
                   "algorithmic", ("algorithmic/cpu_long.yaml",), "algorithmic_cpu_long"),
    PublishedTable("[offline GPT-2 baseline](results_paper_a.md#the-gpt-2-baseline)", "pretrain_gpt2",
                   ("mixed/gpt2_pretrain_cpu.yaml",), "gpt2_pretraining"),
    PublishedTable("[GPT-2's fine-tuning rate](results_paper_a.md#the-gpt-2-baseline)", "baseline_learning_rate",
                   ("mixed/cpu.yaml --output_dir outputs/mixed_baseline_lr",), "gpt2_pretraining",
                   "88 min, our tests running beside it (load about 4)"),
    PublishedTable("[mixed text and numbers](results_paper_a.md#mixed-text-and-numbers)", "mixed",
                   ("mixed/cpu.yaml",), "mixed_cpu"),
    PublishedTable("[k-hop induction](results_paper_a.md#k-hop-induction-heads)", "induction",
                   ("induction/cpu.yaml",), "induction_cpu"),
    PublishedTable("[k-hop induction, GPT-2's block](results_paper_a.md#k-hop-induction-heads)", "induction",
                   ("induction/cpu.yaml --block_style gpt2 --max_steps 2000 --tracked_steps 2000 "
                    "--output_dir outputs/induction_cpu_layernorm",), "induction_cpu_layernorm"),
    PublishedTable("[formal languages, main table](results_paper_b.md#formal-languages-the-main-table)",
                   "formal_languages", ("formal_languages/cpu_paper_size.yaml",), FORMAL_PAPER_SIZE),
    PublishedTable("[formal languages, small model](results_paper_b.md#formal-languages-a-smaller-model)",
                   "formal_languages", ("formal_languages/cpu_table.yaml",), "formal_languages_table_cpu"),
    PublishedTable("[formal languages, 4x longer](results_paper_b.md#formal-languages-training-or-model-size)",
                   "formal_languages", ("formal_languages/cpu_check_longer.yaml",), "formal_languages_check_longer"),
    PublishedTable("[formal languages, Paper B's size](results_paper_b.md#formal-languages-training-or-model-size)",
                   "formal_languages", ("formal_languages/cpu_check_paper_size.yaml",),
                   "formal_languages_check_paper_size"),
    PublishedTable("[formal languages, uniform members](results_paper_b.md#formal-languages-how-the-members-are-drawn)",
                   "formal_languages", ("formal_languages/cpu_check_positives.yaml",), FORMAL_POSITIVES),
    PublishedTable("[formal languages, position encodings](results_paper_b.md#formal-languages-position-encodings)",
                   "formal_languages", ("formal_languages/cpu_positions.yaml",), "formal_languages_positions_cpu"),
    PublishedTable("[formal languages, unscaled sinusoids](results_paper_b.md#formal-languages-the-embedding-scale)",
                   "formal_languages", ("formal_languages/cpu_check_sinusoidal_unscaled.yaml",),
                   SINUSOIDAL_UNSCALED["formal"]),
    PublishedTable("[WikiText-2](results_paper_b.md#wikitext-2-reduced-protocol)", "wikitext",
                   ("wikitext/cpu.yaml", "wikitext/cpu_positions.yaml"), "wikitext_cpu"),
    PublishedTable("[WikiText-2 on a Llama](hybrid.md#from-scratch-paper-bs-wikitext-comparison-on-a-llama)",
                   "wikitext", ("wikitext/cpu_llama.yaml",), "wikitext_llama_cpu"),
    PublishedTable("[WikiText-2, unscaled sinusoids](results_paper_b.md#wikitext-2-the-embedding-scale)",
                   "wikitext", ("wikitext/cpu_check_sinusoidal_unscaled.yaml",), SINUSOIDAL_UNSCALED["wikitext"]),
)  # fmt: skip


def training_time(name: str) -> str:
    """A config's training time on the 2-core machine: its pace when timed idle where it was, else what its published
    runs took, with the load they ran under."""
    if name in IDLE_TIMED:
        timed = len(load_results(DOCS / IDLE_RUN_TIMES / name))
        pace = f"the pace of {timed} runs timed idle"
        return f"about {idle_pace_minutes(name):.0f} min as 2 one-thread processes ({pace})"
    runs = load_results(DOCS / name) or [json.loads((DOCS / name / "results.json").read_text())]
    load = statistics.median(r["machine"]["load_average"][0] for r in runs)
    minutes = sum(r["train_seconds"] for r in runs) / 60
    runs_counted = f"{len(runs)} runs" if len(runs) > 1 else "1 run"
    return f"{minutes:.0f} min summed over {runs_counted} (median load {load:.1f} as they ended)"


def output_folder(config: str) -> str:
    """The folder a command writes: its `--output_dir` where it gives one, else its config file's."""
    path, *flags = config.split()
    if "--output_dir" in flags:
        return flags[flags.index("--output_dir") + 1]
    return yaml.safe_load((ROOT / "configs" / path).read_text())["output_dir"]


def experiments_index() -> str:
    """One line per published table: the command that makes it, its training time and where it writes."""
    lines = ["| table | command | training time on 2 cores | output | committed results |", "|---|---|---|---|---|"]
    for row in EXPERIMENTS:
        commands = "; ".join(f"`python -m training.{row.script} configs/{config}`" for config in row.configs)
        time = row.recorded_time or training_time(row.results)
        results = f"[docs/results/{row.results}](results/{row.results})"
        lines.append(f"| {row.table} | {commands} | {time} | `{output_folder(row.configs[0])}` | {results} |")
    return "\n".join(lines)


TABLES: dict[str, Callable[[], str]] = {
    "quickstart": quickstart_table,
    "algorithmic": lambda: algorithmic_table("algorithmic_cpu"),
    "algorithmic-long": lambda: algorithmic_table("algorithmic_cpu_long"),
    "algorithmic-long-by-epoch": lambda: algorithmic_by_epoch_table("algorithmic_cpu_long"),
    "mixed-min": lambda: mixed_table("min"),
    "mixed-sum": lambda: mixed_table("sum"),
    "mixed-multitask": lambda: mixed_table("multitask"),
    "induction": induction_table,
    "induction-by-step": induction_by_step_table,
    "induction-layernorm": lambda: induction_table("induction_cpu_layernorm"),
    "paper-a-run-times": lambda: run_times_table(PAPER_A),
    "paper-b-run-times": lambda: run_times_table(PAPER_B),
    "paper-b-idle-run-times": lambda: idle_run_times_table(IDLE_TIMED),
    "wikitext": lambda: wikitext_table("wikitext_cpu"),
    "wikitext-sinusoidal-check": lambda: wikitext_table(SINUSOIDAL_UNSCALED["wikitext"]),
    "wikitext-llama": lambda: wikitext_table("wikitext_llama_cpu"),
    "hybrid-pretraining": hybrid_pretraining_text,
    "hybrid-tradeoff": hybrid_tradeoff_tables,
    "hybrid-long-context": long_context_tables,
    "gpt2-pretraining": gpt2_pretraining_text,
    "gpt2-learning-rate": gpt2_learning_rate_table,
    "experiments-index": experiments_index,
    "formal-languages": lambda: formal_languages_table(FORMAL_PAPER_SIZE),
    "formal-languages-small": lambda: formal_languages_table("formal_languages_table_cpu"),
    "formal-languages-positions": formal_languages_positions_table,
    "formal-languages-checks": formal_languages_checks_table,
    "formal-languages-positives": formal_languages_positives_table,
    "formal-languages-sinusoidal-scale": formal_languages_sinusoidal_scale_table,
}


def splice_tables(text: str) -> str:
    """Every `<!-- generated: NAME -->` ... `<!-- /generated -->` block of `text` refilled by `TABLES[NAME]`."""
    out, rest = [], text
    while (start := rest.find("<!-- generated: ")) >= 0:
        name_end = rest.index(" -->", start)
        name = rest[start + len("<!-- generated: ") : name_end]
        end = rest.index("<!-- /generated -->", name_end)
        out.append(rest[: name_end + len(" -->")] + "\n" + TABLES[name]() + "\n")
        rest = rest[end:]
    return "".join(out) + rest


def publish(output_dirs: list[Path], name: str) -> None:
    """Copies an experiment's results into docs/results/NAME, in place of what was there: no weights, checkpoints or
    locks, and no settings.json (results.json holds the same as `config`). Several output folders (one experiment
    run as several processes, each its own groups of runs) merge into one."""
    target = DOCS / name
    shutil.rmtree(target, ignore_errors=True)
    left_out = shutil.ignore_patterns("model", "checkpoint-*", "runs", "settings.json", "*.lock")
    for output_dir in output_dirs:
        shutil.copytree(output_dir, target, ignore=left_out, dirs_exist_ok=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--publish", nargs=2, action="append", default=[], metavar=("OUTPUT_DIR", "NAME"),
                        help="first copy OUTPUT_DIR's results into docs/results/NAME (a NAME given for several "
                        "folders gets them all)")  # fmt: skip
    args = parser.parse_args(argv)
    by_name: dict[str, list[Path]] = {}
    for output_dir, name in args.publish:
        by_name.setdefault(name, []).append(Path(output_dir))
    for name, output_dirs in by_name.items():
        publish(output_dirs, name)
    for name in PUBLISHED:
        write_family_reports(DOCS / name)
    for folder, result in hybrid_tradeoff_runs():
        hybrid_tradeoff.write_reports(result, folder)
    for folder, result in long_context_runs():
        long_context.write_reports(result, folder)
    for page in PAGES:
        page.write_text(splice_tables(page.read_text()))
    print(f"rewrote the reports in {DOCS.relative_to(ROOT)} and the generated tables of README.md and docs/")


if __name__ == "__main__":
    main()
