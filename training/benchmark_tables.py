"""docs/hybrid.md's, docs/performance.md's and docs/serving.md's generated tables from the committed benchmark results:
the offline models the hybrid trade-off converts, the trade-off per model and window, the long-context benchmark per
model (with its CPU check), what converting a pretrained model's heads to positional costs, memory and speed at every
length and batch, under each memory allocator, and continuous batching in process (with its scheduling over other
orders and budgets) and over HTTP."""

import json
from collections.abc import Callable
from pathlib import Path

from benchmarks import (
    allocators,
    hybrid_speed,
    hybrid_tradeoff,
    long_context,
    positional_conversion,
    revision_speed,
    ruler,
    serving,
    serving_http,
    serving_orders,
)
from training.committed_results import (
    DOCS,
    HYBRID_TRADEOFF,
    LONG_CONTEXT,
    LONG_CONTEXT_CPU_CHECK,
    ONE_RUN_BENCHMARKS,
    POSITIONAL_CONVERSION,
    ROOT,
)

# Each one-run benchmark's module, by the name of its generated block.
ONE_RUN_MODULES = {"serving": serving, "serving-http": serving_http, "serving-orders": serving_orders,
                   "hybrid-speed": hybrid_speed, "allocators": allocators, "ruler": ruler,
                   "revision-speed": revision_speed}  # fmt: skip


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


def long_context_runs() -> list[tuple[Path, dict]]:
    """The published long-context runs, a folder per model, each with its results."""
    paths = sorted((DOCS / LONG_CONTEXT).glob("*/results.json"))
    return [(path.parent, json.loads(path.read_text())) for path in paths]


def run_blocks(runs: list[tuple[Path, dict]], plot: str, block: Callable[[Path, dict, Path], str]) -> str:
    """A benchmark's published runs as the docs show them, a block each: `block(folder, result, plot)`, the run's
    plot file `plot` linked from docs/."""
    return "\n".join(block(folder, result, (folder / plot).relative_to(ROOT / "docs")) for folder, result in runs)


def hybrid_tradeoff_tables() -> str:
    """The trade-off's table and plot per converted model and window (benchmarks/hybrid_tradeoff.py)."""
    return run_blocks(hybrid_tradeoff_runs(), "tradeoff.png", hybrid_tradeoff_block)


def hybrid_tradeoff_block(folder: Path, result: dict, plot: Path) -> str:
    return (
        f"**{folder.name}, k = {result['local_window']}** ({result['family']}, {result['layers']} layers of "
        f"{result['heads']} heads; load {result['machine']['load_average'][0]:.1f} on 2 cores as it ended, "
        f"[results.json]({plot.parent}/results.json))\n\n{hybrid_tradeoff.table(result)}\n"
        f"![{folder.name}, k = {result['local_window']}]({plot})\n"
    )


def long_context_tables() -> str:
    """The long-context benchmark's notes, tables and plot per model (benchmarks/long_context.py)."""
    return run_blocks(long_context_runs(), "long_context.png", long_context_block) or (
        "No run published yet. To publish one: `python -m training.reports --publish outputs/long_context/NAME "
        f"{LONG_CONTEXT}/NAME`."
    )


def long_context_block(folder: Path, result: dict, plot: Path) -> str:
    return (
        f"**{result['name']}** ([results.json]({plot.parent}/results.json)): {long_context.notes(result)} "
        f"{long_context_times(result)}\n\n{long_context.tables(result, '####')}\n![{result['name']}]({plot})\n"
    )


def long_context_times(result: dict) -> str:
    """How long the run measured, its records' seconds summed, in minutes."""
    scores, configs = (sum(record["seconds"] for record in records) / 60 for records in
                       (result["scores"].values(), result["rows"]))  # fmt: skip
    text = (
        f"The records' times, summed: {scores + configs:.1f} min on {result['machine']['quality']} "
        f"({len(result['scores'])} scores {scores:.1f} min, {len(result['rows'])} configurations {configs:.1f} min)"
    )
    if timing := result["timing"]:
        loads = [record["load_average"][0] for record in timing.values() if "load_average" in record]
        load = f"; 1-minute load {min(loads):.2f}-{max(loads):.2f} as each shape ended" if loads else ""
        minutes = sum(record["seconds"] for record in timing.values()) / 60
        text += f", then {minutes:.1f} min of timing on the CPU ({len(timing)} shapes{load})"
    return text + "."


def long_context_cpu_check_table() -> str:
    """The long-context configurations first measured on the CPU beside the same ones of the GPU run: perplexity, and
    the passkey answers at the lengths both measured, prompt by prompt."""
    lines = ["| configuration | perplexity, CPU | perplexity, GPU | CPU against GPU | keys found, CPU | keys found, "
             "GPU | same answer text | same verdict (found or not) |", "|---" * 8 + "|"]  # fmt: skip
    for path in sorted((DOCS / LONG_CONTEXT_CPU_CHECK / "configs").glob("*.json")):
        cpu = json.loads(path.read_text())
        gpu = json.loads((DOCS / LONG_CONTEXT / cpu["settings"]["model"] / "configs" / path.name).read_text())
        answers = {(a["length"], a["depth"], a["key"]): a for a in gpu["answers"]}
        pairs = [(a, answers[a["length"], a["depth"], a["key"]]) for a in cpu["answers"]]
        found = [sum(answer["found"] for answer in side) for side in zip(*pairs, strict=True)]
        same_text = sum(a["answer"] == b["answer"] for a, b in pairs)
        same_verdict = sum(a["found"] == b["found"] for a, b in pairs)
        lines.append(
            f"| {path.stem} | {cpu['perplexity']:.2f} | {gpu['perplexity']:.2f} | "
            f"{cpu['perplexity'] / gpu['perplexity'] - 1:+.2%} | {found[0]} of {len(pairs)} | {found[1]} of "
            f"{len(pairs)} | {same_text} of {len(pairs)} | {same_verdict} of {len(pairs)} |"
        )
    lengths = sorted({a["length"] for a in cpu["answers"]})
    note = (
        f"CPU: [{LONG_CONTEXT_CPU_CHECK}](results/{LONG_CONTEXT_CPU_CHECK}) ({cpu['settings']['dtype']}, prompts one "
        f"at a time); GPU: the run above ({gpu['device']}, {gpu['settings']['dtype']}, "
        f"{gpu['settings']['passkey_batch_size']} prompts a batch). Answers compared prompt by prompt (the same "
        f"length, depth and key) at {', '.join(str(n) for n in lengths)} tokens."
    )
    return "\n".join(lines) + "\n\n" + note


def positional_conversion_result() -> dict | None:
    path = DOCS / POSITIONAL_CONVERSION / "results.json"
    return json.loads(path.read_text()) if path.exists() else None


def positional_conversion_text() -> str:
    """benchmarks/positional_conversion.py's report without its title, its sections a level under docs/hybrid.md's."""
    result = positional_conversion_result()
    if result is None:
        return "No run published yet: `python -m benchmarks.positional_conversion` makes one."
    return positional_conversion.report(result).split("\n", 2)[2].strip().replace("\n## ", "\n#### ")


def one_run_result(name: str) -> dict | None:
    """The committed run of the one-run benchmark `name` (a key of `ONE_RUN_BENCHMARKS`), if there is one."""
    path = DOCS / ONE_RUN_BENCHMARKS[name] / "results.json"
    return json.loads(path.read_text()) if path.exists() else None


def one_run_text(name: str) -> str:
    """A one-run benchmark's report without its title, for the page that shows it."""
    result = one_run_result(name)
    if result is None:
        return f"No run published yet: `python -m benchmarks.{ONE_RUN_BENCHMARKS[name]}` makes one."
    return ONE_RUN_MODULES[name].report(result).split("\n", 2)[2].strip()
