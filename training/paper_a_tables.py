"""Paper A's generated tables (algorithmic tasks, mixed text and numbers, k-hop induction, the offline GPT-2
baseline) from the committed results, Paper A's own numbers beside ours."""

import json

from hf_attn.experiments import (
    aggregate,
    collapse_summary,
    format_value,
    grid_table,
    is_collapsed,
    summarize_along_training,
)
from hf_attn.experiments.runs import load_results
from training import algorithmic, baseline_learning_rate, paper_numbers
from training.committed_results import DOCS, ROOT, beside, published
from training.published_tables import run_times_sentence

TASK_NAMES = {"cumulative_sum": "sum", "cumulative_min": "min", "cumulative_median": "median", "sort": "sort",
              "cumulative_max_subarray_sum": "max subarray"}  # fmt: skip
PAPER_A_ALGORITHMIC_NOTE = (
    "In parentheses: Paper A's median over its 10 runs per model, from the authors' result files "
    "(`training/paper_numbers.py`). Its protocol trains 30,000 samples for 2,001 epochs with batch 1,000; ours is the "
    "config named above, far shorter, so the comparison is of the effect's sign and size, not of equal training."
)


def median(summary: dict, model: str, row: str) -> float:
    return summary.get(model, {}).get(row, {"median": float("nan")})["median"]


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


def algorithmic_llama_table(name: str = "algorithmic_llama_cpu", beside_name: str = "algorithmic_cpu") -> str:
    """Per task of the Llama-shaped runs (docs/results/NAME), at every c: their median MSE over seeds, beside the
    GPT-2-shaped models' with the same data and training (docs/results/BESIDE_NAME) and Paper A's median; then how
    long the runs trained."""
    llama, gpt2 = load_results(DOCS / name), load_results(DOCS / beside_name)
    models = ("positional", "standard")
    sections = []
    for task in [task for task in TASK_NAMES if any(r["task"] == task for r in llama)]:
        runs = [r for r in llama if r["task"] == task]
        ours, shaped = aggregate(runs, "mse"), aggregate([r for r in gpt2 if r["task"] == task], "mse")
        lines = [f"**{TASK_NAMES[task]}**: median MSE over seeds", "",
                 "| c | Llama positional | Llama standard | standard / positional | GPT-2-shaped positional | "
                 "GPT-2-shaped standard | Paper A positional | Paper A standard |", "|---" * 8 + "|"]  # fmt: skip
        for c in sorted(ours["positional"], key=int):
            llama_medians = [median(ours, m, c) for m in models]
            papers = [paper_numbers.ALGORITHMIC_MSE[task, m, "median"][int(c) + 1] for m in models]
            cells = [*map(format_value, llama_medians), f"{llama_medians[1] / llama_medians[0]:.2g}x",
                     *(format_value(median(shaped, m, c)) for m in models), *map(published, papers)]  # fmt: skip
            lines.append(f"| {c} | " + " | ".join(cells) + " |")
        sections.append("\n".join(lines) + "\n\n" + collapse_summary(runs))
    return "\n\n".join([*sections, run_times_sentence(name)])


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
