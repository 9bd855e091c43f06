"""The index of every published table (the command that makes it, its training time, where it writes) and the
tables of how long the published runs trained."""

import json
import statistics
from dataclasses import dataclass

import yaml

from hf_attn.experiments.runs import load_results
from training.committed_results import (
    DOCS,
    FORMAL_PAPER_SIZE,
    FORMAL_POSITIVES,
    IDLE_RUN_TIMES,
    IDLE_TIMED,
    ROOT,
    SINUSOIDAL_UNSCALED,
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
    PublishedTable("[algorithmic tasks on a Llama](hybrid.md#paper-as-algorithmic-tasks-on-a-llama)", "algorithmic",
                   ("algorithmic/llama_cpu.yaml",), "algorithmic_llama_cpu"),
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


def run_times_sentence(name: str) -> str:
    """How long the published runs of docs/results/NAME trained, naming the command that made them (its row of
    `EXPERIMENTS`), for the prose beside their table."""
    row = next(row for row in EXPERIMENTS if row.results == name)
    commands = "; ".join(f"`python -m training.{row.script} configs/{config}`" for config in row.configs)
    results = load_results(DOCS / name)
    seconds = [r["train_seconds"] for r in results]
    loads = [r["machine"]["load_average"][0] for r in results]
    return (
        f"Training: {len(results)} runs of {commands} ([docs/results/{name}](results/{name})), {min(seconds):.0f}-"
        f"{max(seconds):.0f} s each, {sum(seconds) / 60:.1f} min in all; 1-minute load {min(loads):.1f}-"
        f"{max(loads):.1f} on {results[0]['machine']['cpus']} cores as the runs ended."
    )


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
