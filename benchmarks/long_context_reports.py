"""The reports of `benchmarks.long_context`, made from its results alone: the notes, a table per window and the
plot, random layouts' seeds merged into a mean and a range."""

import statistics
from pathlib import Path

from benchmarks.common import write_report_and_plot
from benchmarks.long_context_configs import Config
from hf_attn.experiments.reports import pyplot, save

TIMING_RATIOS = ("peak_memory_ratio", "decode_speed_ratio", "prefill_time_ratio")  # the table's order


def summary_rows(result: dict) -> list[dict]:
    """One row per (k, S, share, score), random layouts' seeds merged: each figure as (mean, min, max) over seeds
    (min = max = the figure for the others), and the timing of the row's shape."""
    groups: dict[tuple, list[dict]] = {}
    for row in result["rows"]:
        config = row["config"]
        groups.setdefault((config["local_window"], config["sink_tokens"], config["fraction"], config["score"]),
                          []).append(row)  # fmt: skip
    summaries = []
    for (window, sinks, fraction, score), rows in groups.items():
        figures = {f"passkey {length}": [row["passkey"][length] for row in rows] for length in rows[0]["passkey"]}
        figures["passkey mean"] = [statistics.fmean(row["passkey"].values()) for row in rows]
        figures["perplexity"] = [row["perplexity"] for row in rows]
        shape = Config(window, sinks, fraction).shape
        summaries.append({
            "local_window": window, "sink_tokens": sinks, "fraction": fraction, "score": score, "seeds": len(rows),
            "kv_ratio": rows[0]["kv_ratio"], "timing": result["timing"].get(shape) if window else None,
            **{name: (statistics.fmean(values), min(values), max(values)) for name, values in figures.items()},
        })  # fmt: skip
    return summaries


def spread(figure: tuple[float, float, float], fmt: str, unit: str = "") -> str:
    """A figure, with its range over seeds when it has one."""
    mean, low, high = figure
    return format(mean, fmt) + unit + ("" if low == high else f" ({format(low, fmt)}-{format(high, fmt)})")


def table(result: dict, window: int) -> str:
    """The unmodified model and every configuration with `window`: passkey accuracy per length, perplexity, and the
    ratios to the unmodified model."""
    rows = summary_rows(result)
    unmodified = next(row for row in rows if row["local_window"] is None)
    lengths = [name.removeprefix("passkey ") for name in unmodified if name.startswith("passkey ") and
               name != "passkey mean"]  # fmt: skip
    settings = result["settings"]
    header = ["local share", "score", "sinks", *(f"passkey {int(n) // 1024}K" if int(n) % 1024 == 0 else
              f"passkey {n}" for n in lengths), "perplexity", "vs unmodified", "KV bytes / token",
              f"peak memory at {settings['timing_context']}", f"decode speed at {settings['timing_context']}",
              f"prefill time at {settings['prefill_context']}"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    original = unmodified["perplexity"][0]
    for row in [unmodified, *(row for row in rows if row["local_window"] == window)]:
        timing = row["timing"]
        if row["local_window"] is None:
            ratios = ["1.00x"] * len(TIMING_RATIOS)
        else:
            ratios = ["n/a" if timing is None else f"{timing[name]:.2f}x" for name in TIMING_RATIOS]
        score = row["score"] + (f" ({row['seeds']} seeds)" if row["seeds"] > 1 else "")
        cells = [f"{row['fraction']:.0%}", score, str(row["sink_tokens"]),
                 *(spread(tuple(100 * v for v in row[f"passkey {n}"]), ".0f", "%") for n in lengths),
                 spread(row["perplexity"], ".2f"), f"{row['perplexity'][0] / original:.3f}x", f"{row['kv_ratio']:.2f}x",
                 *ratios]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def notes(result: dict) -> str:
    """What was measured, how, on what machine and for how long."""
    settings = result["settings"]
    prompts = len(settings["passkey_depths"]) * settings["keys_per_depth"]
    score_times = ", ".join(
        f"{name} {record['score_seconds'] / 60:.1f} min" for name, record in result["scores"].items()
    )
    return (
        f"{result['family']}, {result['parameters']:,} parameters, {result['layers']} layers of {result['heads']} "
        f"query heads over {result['key_value_heads']} key/value groups. Scores, passkeys and perplexity in "
        f"{result['dtype']} on {result['machine']['quality']}; timing in {settings['timing_dtype']} on the CPU. "
        f"Passkey: {prompts} prompts per length ({settings['prompt_format']} text, depths "
        f"{', '.join(f'{d:g}' for d in settings['passkey_depths'])}), greedy, {settings['new_tokens']} new tokens. "
        f"Perplexity: WikiText-2 test, {settings['ppl_blocks']} non-overlapping blocks of {settings['ppl_block_size']}"
        f" tokens. Ranges: min-max over random layouts' seeds. KV bytes per token, peak memory (resident, above the "
        f"loaded model, {peak_measure(result)}) and prefill time: ratios to the unmodified model (< 1: less); "
        f"decode speed: its ms per token over ours (> 1: faster); each shape timed beside the unmodified model in "
        f"{settings['timing_repeats']} pairs of fresh processes, the median ratio. Scores computed in: "
        f"{score_times or 'none'}. Measuring took {hours(result['rows'], result['scores'].values())} for the scores, "
        f"passkeys and perplexity and {hours(result['timing'].values())} for the timing, resumed runs "
        f"included{wall_time(result)}."
    )


def peak_measure(result: dict) -> str:
    """How the timing records measured peak memory: exactly (`EXACT_MEMORY`) or with glibc's default allocator,
    which records from before the exact measure used."""
    exact = ["exact_peak_memory_bytes" in record for record in result["timing"].values()]
    if all(exact):
        return "exact: glibc mapping every allocation above 128 KiB on its own"
    allocator = "glibc's default allocator, which varies by up to 40% between processes"
    return allocator if not any(exact) else f"exact for {sum(exact)} of {len(exact)} shapes, else {allocator}"


def hours(*records) -> str:
    return f"{sum(record['seconds'] for group in records for record in group) / 3600:.1f} h"


def wall_time(result: dict) -> str:
    """The run's wall time and load, unless it only read records measured elsewhere (`--stored_only`)."""
    if result["settings"].get("stored_only"):
        return ""
    machine = result["machine"]
    return (f"; wall time {result['wall_seconds'] / 3600:.1f} h, load average {machine['load_average'][0]:.1f} at "
            f"the end ({machine['torch']})")  # fmt: skip


def tables(result: dict, heading: str = "##") -> str:
    """A table per window, each under a `heading` naming it."""
    windows = sorted({row["config"]["local_window"] for row in result["rows"]} - {None})
    return "\n".join(f"{heading} k = {window}\n\n{table(result, window)}" for window in windows)


def report(result: dict) -> str:
    """results.md: the notes, then a table per window."""
    return f"# {result['name']}: long context with key/value groups made local\n\n{notes(result)}\n\n{tables(result)}"


def plot(result: dict, path: Path) -> None:
    """Per window: passkey accuracy (mean over lengths) and perplexity against the KV bytes per token, a colour per
    score, a line style per sink count, the unmodified model a black star, random layouts' seeds as a band."""
    if (plt := pyplot()) is None:
        return
    rows = summary_rows(result)
    unmodified = next(row for row in rows if row["local_window"] is None)
    windows = sorted({row["local_window"] for row in rows} - {None})
    sinks = sorted({row["sink_tokens"] for row in rows})
    scores = list(dict.fromkeys(row["score"] for row in rows if row["local_window"]))
    figure, axes = plt.subplots(len(windows), 2, figsize=(10, 3.6 * len(windows)), squeeze=False)
    for (passkey_axes, perplexity_axes), window in zip(axes, windows, strict=True):
        for figure_name, ax, scale in (("passkey mean", passkey_axes, 100), ("perplexity", perplexity_axes, 1)):
            for color, score in enumerate(scores):
                for style, sink_count in enumerate(sinks):
                    line = sorted((row["kv_ratio"], *(scale * v for v in row[figure_name])) for row in rows
                                  if (row["local_window"], row["score"], row["sink_tokens"]) ==
                                  (window, score, sink_count))  # fmt: skip
                    if not line:
                        continue
                    x, mean, low, high = zip(*line, strict=True)
                    ax.plot(x, mean, marker="o", color=f"C{color}", linestyle=("-", "--", ":", "-.")[style % 4],
                            label=f"{score}, S = {sink_count}")  # fmt: skip
                    if low != high:
                        ax.fill_between(x, low, high, color=f"C{color}", alpha=0.15)
            ax.plot([1.0], [scale * unmodified[figure_name][0]], marker="*", markersize=12, color="black",
                    linestyle="none", label="unmodified")  # fmt: skip
            ax.set_xlabel("KV-cache bytes per token, ratio to unmodified")
            ax.set_title(f"k = {window}")
        passkey_axes.set_ylabel("passkey accuracy, % (mean over lengths)")
        passkey_axes.set_ylim(-5, 105)
        perplexity_axes.set_ylabel("WikiText-2 test perplexity")
        perplexity_axes.set_yscale("log")
    axes[0][0].legend(fontsize=7)
    figure.suptitle(result["name"])
    save(figure, path)


def write_reports(result: dict, folder: Path) -> str:
    """FOLDER/results.md and FOLDER/long_context.png from `result`; returns the report's text."""
    return write_report_and_plot(result, folder, report, plot, "long_context.png")
