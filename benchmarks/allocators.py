"""Peak memory and time of the models `benchmarks.hybrid_speed` compares, under each memory allocator a user's process
may have: glibc's with its defaults, glibc's mapping every allocation above 128 KiB on its own (the exact measure
`benchmarks.hybrid_speed` takes peaks with) or above 1 MiB, and jemalloc and tcmalloc preloaded (`LD_PRELOAD`) where
installed.

    python -m benchmarks.allocators              # SmolLM2-135M-Instruct at 8,192 tokens; about 35 minutes on one core
    python -m benchmarks.allocators --quick      # a tiny random Llama: under a minute, into outputs/
    python -m benchmarks.allocators --report     # results.md from results.json alone

Why: under glibc's defaults a process's peak depends on where its tensors were placed, not only on what they need.
Allocations up to 32 MiB come from one heap once the first large ones are freed, the heap grows where the free
space it holds is in pieces too small or too late for the next request, and it gives nothing back below a live
tensor (a layer's cache, made in the middle of that layer's temporaries). So the bytes it keeps free grow with every
layer, and by different amounts in two processes that allocate alike. This measures how much that adds to each
model, and what changing the allocator gives and costs.

Each process is `benchmarks.hybrid_speed.measure` at batch 1, float32: a prefill of `--tokens - steps` tokens and
`--steps` greedy steps; peak resident memory above the loaded model over both, the prefill's seconds, the decoding
step's milliseconds and, under glibc's allocator, its heap after decoding: its size and the bytes in use in it (the
rest is free memory the heap keeps). `--repeats` rounds; in each, every allocator in turn and every model under it,
the order of the models alternating. A preloaded library is checked in the process (`/proc/self/maps`): the loader
only warns about one it cannot find. Writes OUTPUT_DIR/{results.json, results.md}.
"""

import argparse
import ctypes.util
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

from benchmarks.common import (
    DEFAULT_ALLOCATOR,
    EXACT_MEMORY,
    PRELOADED_ALLOCATORS,
    command_line_parser,
    describe_machine,
    machine_load,
    measured_or_stored,
)
from benchmarks.hybrid_speed import (
    TINY_LLAMA,
    add_model_arguments,
    finish_arguments,
    in_fresh_process,
    mib,
    model_problems,
    model_specs,
    ranking,
    ratio_or_nan,
    spread,
    summary,
    table,
)
from benchmarks.serving import code_note, code_version
from hf_attn.pretrained import load_causal_lm

SIZES = {"tokens": (8192, 128), "repeats": (3, 1), "local_windows": ([256, 64], [16])}
OUTPUT_DIRS = ("docs/results/allocators", "outputs/allocators-quick")
# glibc's defaults; the exact measure; and a threshold above the chunked kernel's per-chunk tensors (a few hundred KiB
# at 8K tokens), so that they are reused from the heap while every tensor that grows with the sequence is mapped.
GLIBC = {"glibc": DEFAULT_ALLOCATOR, "glibc-mmap-128k": EXACT_MEMORY,
         "glibc-mmap-1m": {"MALLOC_MMAP_THRESHOLD_": str(2**20)}}  # fmt: skip
DESCRIPTIONS = {
    "glibc": "glibc's defaults (a user's process)",
    **{
        name: f"glibc, `MALLOC_MMAP_THRESHOLD_={environment['MALLOC_MMAP_THRESHOLD_']}`"
        for name, environment in GLIBC.items()
        if environment
    },
    **{name: f"{name}, `LD_PRELOAD={library}`" for name, library in PRELOADED_ALLOCATORS.items()},
}


def installed_allocators() -> dict[str, dict[str, str]]:
    """Each allocator's environment: glibc's two settings, and each preloadable library the system's loader finds."""
    found = {name: ctypes.util.find_library(library.removeprefix("lib").split(".so")[0])
             for name, library in PRELOADED_ALLOCATORS.items()}  # fmt: skip
    return GLIBC | {name: {"LD_PRELOAD": path} for name, path in found.items() if path}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = command_line_parser("benchmarks.allocators", __doc__)
    add_model_arguments(parser)
    add = parser.add_argument
    add("--tokens", type=int, help=f"tokens of context at the end (default {SIZES['tokens'][0]})")
    add("--repeats", type=int, help=f"rounds of every allocator and model (default {SIZES['repeats'][0]})")
    add("--allocators", nargs="+", choices=list(DESCRIPTIONS), help="default: every one installed")
    add("--output-dir", help=f"default {OUTPUT_DIRS[0]} (--quick: {OUTPUT_DIRS[1]})")
    args = finish_arguments(parser.parse_args(argv), SIZES, OUTPUT_DIRS)
    installed = installed_allocators()
    args.allocators = args.allocators or list(installed)
    problems = [] if args.report else model_problems(args, minimums={"repeats": 1})
    if not args.report and args.tokens <= args.steps:
        problems.append(f"--tokens must be > --steps ({args.steps}), got {args.tokens}")
    missing = [name for name in args.allocators if name not in installed]
    if missing and not args.report:
        problems.append(f"--allocators {' '.join(missing)}: not installed (Debian: apt-get install libjemalloc2 "
                        f"libtcmalloc-minimal4); installed: {', '.join(installed)}")  # fmt: skip
    if problems:
        parser.error("; ".join(problems))
    return args


def run(args, argv: list[str]) -> dict:
    start, load_at_start = time.perf_counter(), machine_load()
    print(f"load at start: {load_at_start['uptime']}", flush=True)
    model_config = (transformers.LlamaConfig(**TINY_LLAMA) if args.quick
                    else transformers.AutoConfig.from_pretrained(args.model) if Path(args.model).is_dir()
                    else load_causal_lm(args.model, dtype=torch.float32).config)  # fmt: skip
    specs = model_specs(args, model_config)
    environments = installed_allocators()
    sizes = {"tokens": args.tokens, "batch": 1, "dtype": "float32"}
    runs = {allocator: {name: [] for name in specs} for allocator in args.allocators}
    for repeat in range(args.repeats):
        for allocator in args.allocators:
            for name in list(specs) if repeat % 2 == 0 else list(reversed(specs)):
                measured = in_fresh_process(specs[name] | sizes | {"allocator": environments[allocator]})
                runs[allocator][name].append(measured)
                print(f"{allocator} {name}: {measured}", flush=True)
    for allocator in args.allocators:
        if allocator in PRELOADED_ALLOCATORS and not all(run["preloaded"] for runs_of in runs[allocator].values()
                                                         for run in runs_of):  # fmt: skip
            raise RuntimeError(f"{allocator} was not loaded in every process: see the loader's warnings above")
    return {
        "command": shlex.join(["python", "-m", "benchmarks.allocators", *argv]),
        "model": "tiny-random-llama" if args.quick else args.model, "family": model_config.model_type,
        "models": {name: {key: spec.get(key) for key in ("local_window", "layout_name", "local_groups")}
                   for name, spec in specs.items()},
        "groups": model_config.num_hidden_layers * model_config.num_key_value_heads,
        "environments": {allocator: environments[allocator] for allocator in args.allocators},
        "allocators": {allocator: {name: summary(model_runs) for name, model_runs in by_model.items()}
                       for allocator, by_model in runs.items()},
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "python": sys.version.split()[0]},
        "code": code_version(),
        "machine": {"before": load_at_start, "after": machine_load(), "torch": describe_machine("cpu")},
        "settings": vars(args), "wall_seconds": time.perf_counter() - start,
    }  # fmt: skip


# --- the report ----------------------------------------------------------------------------------------------------


def model_columns(result: dict, figure: str, cell) -> tuple[list[str], list[list[str]]]:
    """A header and one row per allocator: each model's `cell(figures)`, each hybridized one's ratio to the unmodified
    model's median `figure` under that allocator."""
    names = list(result["models"])
    header = ["allocator", names[0]] + [column for name in names[1:] for column in (name, "/ unmodified")]
    rows = []
    for allocator, models in result["allocators"].items():
        row = [DESCRIPTIONS[allocator], cell(models[names[0]])]
        for name in names[1:]:
            row += [cell(models[name]), f"{ratio_or_nan(models[name][figure], models[names[0]][figure]):.2f}x"]
        rows.append(row)
    return header, rows


def heap_rows(result: dict) -> list[list[str]]:
    """Under glibc's defaults, each model's heap after decoding (MiB, median over the repeats): its size, in use, and
    the free memory it keeps."""
    rows = []
    for name, figures in result["allocators"].get("glibc", {}).items():
        heaps = [run["glibc_heap"] for run in figures["runs"] if run["glibc_heap"]]
        if not heaps:
            continue
        size, in_use = (statistics.median(heap[key] for heap in heaps) for key in ("heap_bytes", "heap_in_use_bytes"))
        kept = sorted(heap["heap_bytes"] - heap["heap_in_use_bytes"] for heap in heaps)
        rows.append([name, mib(size), mib(in_use), f"{mib(statistics.median(kept))} ({mib(kept[0])}-{mib(kept[-1])})"])
    return rows


def time_ratios(result: dict, allocator: str, name: str) -> str:
    """A model's prefill and decoding step under `allocator` over its own under glibc's defaults."""
    figures, glibc = result["allocators"][allocator][name], result["allocators"]["glibc"][name]
    return "; ".join(f"{ratio_or_nan(figures[key], glibc[key]):.2f}x" for key in ("prefill_seconds", "decode_ms"))


def report(result: dict) -> str:
    """results.md: peaks, times and glibc's heap under each allocator."""
    names, settings = list(result["models"]), result["settings"]
    tokens = settings["tokens"]
    lines = [
        f"# Memory allocators, hybridized beside unmodified: {result['model']}", "",
        f"{result['family']}. Hybridized: "
        + "; ".join(f"`{result['models'][name]['layout_name']}` ({result['models'][name]['local_groups']} of "
                    f"{result['groups']} key/value groups local, {ranking(settings, name, result)})"
                    for name in names[1:]) + ".", "",
        f"Peak resident memory above the loaded model (MiB), float32, batch 1, a prefill and {settings['steps']} "
        f"steps to {tokens:,} tokens (median, range over {settings['repeats']} processes):", "",
    ]  # fmt: skip
    lines += table(*model_columns(result, "peak_bytes", lambda figures: spread(figures, "peak_bytes", 2**-20, 0)))
    lines += ["", "Prefill seconds (median, range):", ""]
    lines += table(*model_columns(result, "prefill_seconds", lambda figures: spread(figures, "prefill_seconds")))
    lines += ["", "Each model's time under each allocator over its time under glibc's defaults (prefill; decoding "
              "step, median):", ""]  # fmt: skip
    if "glibc" in result["allocators"]:
        lines += table(["allocator", *names], [[DESCRIPTIONS[allocator]] + [time_ratios(result, allocator, name)
                                                                         for name in names]
                                               for allocator in result["allocators"]])  # fmt: skip
    if rows := heap_rows(result):
        lines += ["", "glibc's heap after decoding, under its defaults (MiB, median): its size, the bytes in use in "
                  "it, and the free memory it keeps (median, range):", ""]  # fmt: skip
        lines += table(["model", "heap", "in use", "kept free"], rows)
    before, after = result["machine"]["before"], result["machine"]["after"]
    lines += [
        "", f"`{result['command']}`: {result['wall_seconds'] / 60:.1f} min, {settings['threads']} thread(s) per "
        f"process, {result['machine']['torch']}, transformers {result['versions']['transformers']}"
        f"{code_note(result['code'])}. `uptime` before: `{before['uptime']}`; after: `{after['uptime']}`.",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    measured_or_stored(parse_args(argv), argv, run, report)


if __name__ == "__main__":
    main()
