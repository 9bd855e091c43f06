"""docs/hybrid.md's generated tables from the committed benchmark results: the offline models the hybrid trade-off
converts, the trade-off per model and window, the long-context benchmark per model, and what converting a pretrained
model's heads to positional costs."""

import json
from collections.abc import Callable
from pathlib import Path

from benchmarks import hybrid_tradeoff, long_context, positional_conversion
from training.committed_results import DOCS, HYBRID_TRADEOFF, LONG_CONTEXT, POSITIONAL_CONVERSION, ROOT


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
        f"**{result['name']}** ([results.json]({plot.parent}/results.json)): {long_context.notes(result)}\n\n"
        f"{long_context.tables(result, '####')}\n![{result['name']}]({plot})\n"
    )


def positional_conversion_result() -> dict | None:
    path = DOCS / POSITIONAL_CONVERSION / "results.json"
    return json.loads(path.read_text()) if path.exists() else None


def positional_conversion_text() -> str:
    """benchmarks/positional_conversion.py's report without its title, its sections a level under docs/hybrid.md's."""
    result = positional_conversion_result()
    if result is None:
        return "No run published yet: `python -m benchmarks.positional_conversion` makes one."
    return positional_conversion.report(result).split("\n", 2)[2].strip().replace("\n## ", "\n#### ")
