"""Tables and plots of an experiment's runs: each run's results.json aggregated over seeds into Markdown and PNGs.

A collapsed run (see `metrics`) is named under its table and left out of the means and medians instead of averaged
in. When every run has the same seed there is nothing to aggregate: the tables then show each run's value and say so.
"""

import functools
import logging
import math
import statistics
import textwrap
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from .metrics import COLLAPSE_TOLERANCE, is_collapsed

logger = logging.getLogger(__name__)

REPORT_FILE = "results.md"
SCALE_AXIS = "test range scale c (c = 1: training range)"
# {model: {row (c, depth, variant): {"mean", "median", "min", "max", "runs"}}}
Summary = dict[str, dict[str, dict[str, float]]]


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Mean, median, lowest and highest of the finite `values` (NaN without any), and how many runs there were."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return {"mean": math.nan, "median": math.nan, "min": math.nan, "max": math.nan, "runs": len(values)}
    return {"mean": statistics.fmean(finite), "median": statistics.median(finite), "min": min(finite),
            "max": max(finite), "runs": len(values)}  # fmt: skip


def aggregate(results: Iterable[dict], metric: str) -> Summary:
    """{model: {scale: summary over seeds}} of `results[i]["by_scale"][scale][metric]`; collapsed runs left out."""
    grouped: dict[str, dict[str, list[float]]] = {}
    for result in results:
        for scale, metrics in result["by_scale"].items():
            values = grouped.setdefault(result["model"], {}).setdefault(scale, [])
            if not is_collapsed(result):
                values.append(metrics[metric])
    return {model: {s: summarize(v) for s, v in by_scale.items()} for model, by_scale in grouped.items()}


def summarize_along_training(results: Iterable[dict], field: str, value: Callable[[dict], float]) -> Summary:
    """{model: {epoch or step: summary over seeds}} of `value(result[field][point])`, `field` being what
    `MeasureAlongTheWay` recorded (`by_epoch`, `by_step`); collapsed runs left out, as in the tables."""
    grouped: dict[str, dict[str, list[float]]] = {}
    for result in results:
        for point, measured in result.get(field, {}).items():
            values = grouped.setdefault(result["model"], {}).setdefault(point, [])
            if not is_collapsed(result):
                values.append(value(measured))
    return {model: {p: summarize(v) for p, v in by_point.items()} for model, by_point in grouped.items()}


def only_seed(results: list[dict]) -> int | None:
    """The seed of every run when they share one (means and medians over seeds would be each run's value), else
    None."""
    seeds = {result["seed"] for result in results}
    return seeds.pop() if len(seeds) == 1 else None


def format_value(value: float) -> str:
    """Three decimals, or scientific notation for very small and very large values; `n/a` when not finite."""
    if not math.isfinite(value):
        return "n/a"
    return f"{value:.2e}" if value != 0 and (abs(value) < 1e-2 or abs(value) >= 1e3) else f"{value:.3f}"


def row_order(summary: Summary) -> list[str]:
    """Numeric row keys (c, depth) in numeric order; names (variants) in order of first appearance."""
    rows = list(dict.fromkeys(row for by_row in summary.values() for row in by_row))
    try:
        return sorted(rows, key=float)
    except ValueError:
        return rows


def markdown_table(summary: Summary, scale_name: str = "c", statistics: Sequence[str] = ("mean", "median")) -> str:
    """One row per scale, each of `statistics` over seeds per model: `| c | positional mean | positional median |`;
    with `statistics=("mean",)` one column per model, named after it (one seed each: the run's value)."""
    models = list(summary)
    names = [f"{m} {s}" if len(statistics) > 1 else m for m in models for s in statistics]
    lines = [f"| {scale_name} | " + " | ".join(names) + " |", "|" + "---|" * (1 + len(names))]
    for scale in row_order(summary):
        cells = [format_value(summary[m].get(scale, {}).get(s, math.nan)) for m in models for s in statistics]
        lines.append(f"| {scale} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def grid_table(cells: dict[str, dict[str, str]], row_name: str) -> str:
    """A markdown table of preformatted cells, `cells[row][column]`; rows and columns in order of first appearance."""
    columns = list(dict.fromkeys(column for by_column in cells.values() for column in by_column))
    lines = [f"| {row_name} | " + " | ".join(columns) + " |", "|" + "---|" * (1 + len(columns))]
    for row, by_column in cells.items():
        lines.append(f"| {row} | " + " | ".join(by_column.get(column, "n/a") for column in columns) + " |")
    return "\n".join(lines)


def collapse_summary(results: list[dict]) -> str:
    """Runs kept per model, and each collapsed run with its error against the input-blind predictor's."""
    kept = {model: 0 for model in dict.fromkeys(result["model"] for result in results)}
    collapsed = []
    for result in results:
        if is_collapsed(result):
            check = result["collapse"]
            error, blind = format_value(check["error"]), format_value(check["input_blind_error"])
            run = f"{result['model']} seed {result['seed']}"
            collapsed.append(f"{run} ({check['metric']} {error}, input-blind predictor {blind})")
        else:
            kept[result["model"]] += 1
    counts = ", ".join(f"{model} {count}" for model, count in kept.items())
    if not collapsed:
        return f"Runs per model: {counts}. No run collapsed."
    return (
        f"Runs per model in the means and medians: {counts}. Collapsed (in-distribution error within "
        f"{COLLAPSE_TOLERANCE:.0%} of the best input-blind predictor's), left out: " + "; ".join(collapsed) + "."
    )


def write_report(
    folder: Path,
    heading: str,
    results: list[dict],
    metrics: Sequence[tuple[str, str, bool]],
    scale_name: str = "c",
    xlabel: str = SCALE_AXIS,
) -> str:
    """`results.md` (a table per `(metric, title, log_scale)`, mean and median over seeds, or each run's value when
    all have one seed) and `{metric}.png`.

    Rows are the keys of each result's `by_scale` (named `scale_name`), columns its `model`.
    """
    seed = only_seed(results)
    one_seed = seed is not None
    runs = f"{len(results)} runs, all of seed {seed}" if one_seed else f"{len(results)} runs"
    over = f"seed {seed}" if one_seed else "mean and median over seeds"
    sections = [f"# {heading} ({runs})", collapse_summary(results)]
    name = heading.split(":")[0]
    for metric, title, log_scale in metrics:
        summary = aggregate(results, metric)
        table = markdown_table(summary, scale_name, ("mean",) if one_seed else ("mean", "median"))
        sections.append(f"## {title} ({over})\n\n{table}")
        plot_metric(summary, folder / f"{metric}.png", f"{name}: {title}", title, log_scale, xlabel, one_seed)
    return write_markdown(folder / REPORT_FILE, sections)


def write_markdown(path: Path, sections: Sequence[str], separator: str = "\n\n") -> str:
    """The Markdown file `path`: `sections` (headings, paragraphs, tables) joined, ending in a newline; returns its
    text, which the scripts also print."""
    text = separator.join(sections) + "\n"
    path.write_text(text)
    return text


def write_task_reports(output_dir: Path, results: list[dict], heading: Callable[[str], str], metrics) -> str:
    """`write_report` per task (Paper A's families): OUTPUT_DIR/TASK/{results.md, plots} from the task's runs,
    titled `heading(task)`; returns the reports."""
    tasks = dict.fromkeys(result["task"] for result in results)
    return "\n".join(
        write_report(output_dir / task, heading(task), [r for r in results if r["task"] == task], metrics)
        for task in tasks
    )


def report_files(output_dir: Path) -> list[str]:
    """Where an experiment's reports are: each `results.md` under OUTPUT_DIR, with the plots beside it."""
    lines = []
    for report in sorted(output_dir.glob(f"**/{REPORT_FILE}")):
        plots = ", ".join(sorted(path.name for path in report.parent.glob("*.png")))
        lines.append(f"{report}" + (f" (plots: {plots})" if plots else ""))
    return lines


# --- plots ------------------------------------------------------------------------------------------------------


def pyplot():
    """matplotlib's pyplot, drawing to files only; None without matplotlib (the optional `plots` extra): every plot is
    then skipped, saying so once, and the tables are written all the same."""
    try:
        import matplotlib
    except ImportError:
        plots_skipped()
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@functools.cache
def plots_skipped() -> None:
    """One warning per process, however many plots a report has."""
    logger.warning('Plots skipped: matplotlib is not installed (pip install matplotlib, or in a checkout pip install '
                   '-e ".[plots]"); the tables are written.')  # fmt: skip


def save(figure, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot().close(figure)


def plot_metric(summary: Summary, path: Path, title: str, ylabel: str, log_scale: bool, xlabel: str = SCALE_AXIS,
                one_seed: bool = False) -> None:  # fmt: skip
    """Mean over seeds against the scale, one line per model, its median dashed and a band of its colour from the
    lowest to the highest run (collapsed runs left out, as in the tables); with `one_seed`, each run's value. The
    legend names each model once by colour, and the median's and the band's styles once each, in grey."""
    if (plt := pyplot()) is None:
        return
    figure, axes = plt.subplots(figsize=(6, 4))
    for model, by_scale in summary.items():
        scales = [s for s in row_order(summary) if s in by_scale]
        x = [float(s) for s in scales]
        label = model if one_seed else f"{model} (mean)"
        (line,) = axes.plot(x, [by_scale[s]["mean"] for s in scales], marker="o", label=label)
        if not one_seed:
            axes.plot(x, [by_scale[s]["median"] for s in scales], linestyle="--", color=line.get_color(), alpha=0.6)
            low, high = [by_scale[s]["min"] for s in scales], [by_scale[s]["max"] for s in scales]
            if any(map(math.isfinite, low)):  # a band of NaN only (every run collapsed) breaks a log-scaled axis
                axes.fill_between(x, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
    if log_scale:
        axes.set_yscale("log")
    axes.set_xlabel(xlabel)
    axes.set_ylabel("\n".join(textwrap.wrap(ylabel, 40)))  # the axis is 4 inches high: long titles on two lines
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(handles=axes.get_legend_handles_labels()[0] + ([] if one_seed else style_keys()))
    save(figure, path)


def style_keys() -> list:
    """Legend entries for the median's dashes and the band of runs, in grey: one each, whatever the models."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    return [Line2D([], [], linestyle="--", color="grey", alpha=0.6, label="median"),
            Patch(color="grey", alpha=0.15, linewidth=0, label="lowest to highest run")]  # fmt: skip


def plot_bars(summary: Summary, path: Path, title: str, ylabel: str) -> None:
    """Grouped bars of the mean over seeds: one group per row (variant), one bar per model (column)."""
    if (plt := pyplot()) is None:
        return
    rows, models = row_order(summary), list(summary)
    width = 0.8 / len(models)
    figure, axes = plt.subplots(figsize=(max(6, 0.9 * len(rows) * len(models)), 4))
    for i, model in enumerate(models):
        means = [summary[model].get(row, {"mean": math.nan})["mean"] for row in rows]
        axes.bar([r + i * width for r in range(len(rows))], means, width, label=model)
    axes.set_xticks([r + 0.4 - width / 2 for r in range(len(rows))], rows)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(axis="y", alpha=0.3)
    axes.legend()
    save(figure, path)


def plot_loss_curves(
    panels: dict[str, dict[str, list[list[list[float]]]]], path: Path, title: str, plateau: float | None = None
) -> None:
    """Training loss against step, a panel per key of `panels` (a position encoding) side by side on one y-axis: one
    colour per label (a variant, the same in every panel), one line per run (a seed). `plateau`, a loss drawn as a
    dashed line (e.g. the unigram model's), shows which runs were stuck on it and for how long."""
    if (plt := pyplot()) is None:
        return
    labels = list(dict.fromkeys(label for curves in panels.values() for label in curves))
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels) + 1, 4.5), sharey=True, squeeze=False)
    for axis, (panel, curves) in zip(axes[0], panels.items(), strict=True):
        for label, runs in curves.items():
            for run_index, curve in enumerate(runs):
                steps, losses = zip(*curve, strict=True) if curve else ((), ())
                axis.plot(steps, losses, color=f"C{labels.index(label) % 10}", alpha=0.8,
                          label=label if run_index == 0 else None)  # fmt: skip
        if plateau is not None:
            axis.axhline(plateau, color="grey", linestyle="--", linewidth=1, label="unigram model")
        axis.set_title(panel)
        axis.set_xlabel("optimizer step")
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
    axes[0][0].set_ylabel("training loss")
    figure.suptitle(title)
    save(figure, path)


def plot_heatmap(values: dict[str, dict[str, float]], path: Path, title: str, vmin: float = 0.0,
                 vmax: float = 1.0) -> None:  # fmt: skip
    """`values[row][column]` as an annotated heatmap (rows top to bottom, columns left to right); NaN left blank."""
    if (plt := pyplot()) is None:
        return
    rows = list(values)
    columns = list(dict.fromkeys(column for by_column in values.values() for column in by_column))
    grid = np.array([[values[row].get(column, math.nan) for column in columns] for row in rows], dtype=float)
    figure, axes = plt.subplots(figsize=(max(4, 1.3 * len(columns) + 2), max(3, 0.5 * len(rows) + 1.5)))
    image = axes.imshow(np.ma.masked_invalid(grid), cmap="viridis", vmin=vmin, vmax=vmax, aspect="auto")
    for (i, j), value in np.ndenumerate(grid):
        if math.isfinite(value):
            axes.text(j, i, f"{value:.2f}", ha="center", va="center", color="white" if value < 0.7 else "black")
    axes.set_xticks(range(len(columns)), columns, rotation=30, ha="right")
    axes.set_yticks(range(len(rows)), rows)
    axes.set_title(title)
    figure.colorbar(image, ax=axes)
    save(figure, path)
