"""Memory and speed of a hybridized model beside the unmodified one: peak memory at every length, decoding at several
batch sizes, and how many sequences each decodes within one memory budget.

    python -m benchmarks.hybrid_speed              # SmolLM2-135M-Instruct, offline; about an hour on one core
    python -m benchmarks.hybrid_speed --quick      # a tiny random Llama: a minute, into outputs/
    python -m benchmarks.hybrid_speed --report     # results.md from results.json alone

Models: `--model` (any `hf_attn.pretrained` source) unmodified, and hybridized by `hf_attn.hybridize` at each
`--local-windows` k: the share `--fraction` of key/value groups made k-local with `--sink-tokens` sinks, ranked by
the score stored in LAYOUT_DIR/scores (the layouts `benchmarks.long_context` measured; `--quick`: a tiny random Llama
and a layout drawn at random).

Every measurement runs in a fresh process (`spawn`) on `--threads` threads. Memory is measured in processes where
glibc maps every allocation above 128 KiB on its own (`MALLOC_MMAP_THRESHOLD_=131072`): a freed tensor then leaves
the resident set at once, so that peak resident memory (Linux's VmHWM, reset after loading) is what the tensors needed
and not the allocator's history (without it, one prefill's peak varied from 337 to 482 MiB between identical
processes). That slows code which allocates often, so time is measured in other processes, with the default
allocator (`benchmarks.common.MALLOC_MMAP_THRESHOLD` has the figures). A process loads the model, prefills a random
prompt of `tokens - steps` tokens, repeats its cache `batch` times (`Cache.batch_repeat_interleave`: every row the
same prompt, which costs what `batch` prompts would) and decodes `steps` greedy tokens. It records the prefill's
seconds, the decoding step's median milliseconds (the first `WARM_UP_STEPS` left out), the peak resident memory above
the loaded model over prefill and decoding at batch 1, and at any batch the peak while decoding (reset once the cache
is built: the cache plus a step's working memory).

- peaks: each of `--lengths` in each of `--dtypes`, batch 1: peak memory;
- lengths: each of `--lengths`, float32, batch 1: prefill seconds and ms per decoding step;
- batches: `--context` tokens, float32, each of `--batches`: ms per decoding step and tokens per second, and the
  decoding peak;
- capacity: the largest batch whose decoding at `--context` tokens peaks within `--budget-mib` above the loaded model,
  found from the batches' peaks (a straight line through them) and then checked in processes of its own: that batch
  fits and one more does not; then timed at that batch.
Timings run `--repeats` times, the unmodified model and the hybridized ones in turn, the order alternating; medians
and ranges. Memory runs once (the same prefill peaks within 4% between processes). Writes
OUTPUT_DIR/{results.json, results.md}.
"""

import argparse
import gc
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
    MALLOC_MMAP_THRESHOLD,
    command_line_parser,
    describe_machine,
    glibc_heap,
    machine_load,
    measured_or_stored,
    peak_rss_bytes,
    preloaded_library,
    release_free_heap,
    rss_bytes,
)
from benchmarks.common import in_fresh_process as fresh_process
from benchmarks.generation import cache_argument, cache_bytes
from benchmarks.long_context_configs import SCORE_NAMES
from benchmarks.serving import code_note, code_version, head_layout, local_groups, score_path
from hf_attn import hybridize
from hf_attn.experiments.arguments import below_minimums
from hf_attn.pretrained import load_causal_lm, source_argument

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
WARM_UP_STEPS = 2  # decoding steps left out of the median
# Defaults (None on the command line): the full run's, and --quick's.
SIZES = {
    "lengths": ([512, 1024, 2048, 4096, 8192], [128]),
    "context": (8192, 128),
    "batches": ([1, 4, 16], [1, 4]),
    "budget_mib": (3072, 4),
    "local_windows": ([256, 64], [16]),
    "dtypes": (["float32", "bfloat16"], ["float32", "bfloat16"]),
    "repeats": (2, 1),
}
OUTPUT_DIRS = ("docs/results/hybrid_speed", "outputs/hybrid_speed-quick")
# --quick's model: a tiny Llama with grouped-query attention, random weights drawn from seed 0 in each process.
TINY_LLAMA = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512)  # fmt: skip
# The project's targets, hybridized against unmodified: (what, comparison, value).
TARGETS = (
    ("peak memory at --context tokens", "<=", 0.8),
    ("peak memory at every length", "<=", 1.0),
    ("decoding speed at the largest batch", ">=", 1.6),
    ("sequences decoded within the budget", ">=", 1.8),
    ("tokens per second at that capacity", ">=", 1.5),
)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The models compared and how each process runs: shared with `benchmarks.allocators`."""
    add = parser.add_argument
    add("--model", type=source_argument, default="smollm2-135m-instruct", help="Hub id, folder, .gguf file or "
        "hf_attn.pretrained short name (not with --quick)")  # fmt: skip
    add("--layout-dir", default="docs/results/long_context/smollm2-135m-instruct", help="a benchmarks.long_context "
        "output folder: its scores/SCORE-kK-sS.json ranks the key/value groups")  # fmt: skip
    add("--score", choices=SCORE_NAMES, help="which score ranks the groups (random: seed 0); default gate "
        "(--quick: random)")  # fmt: skip
    add("--fraction", type=float, default=0.5, help="share of key/value groups made local")
    add("--sink-tokens", type=int, default=4, help="first tokens local heads also see")
    add("--local-windows", type=int, nargs="+", help=f"k of each hybridized model (default "
        f"{SIZES['local_windows'][0]})")  # fmt: skip
    add("--steps", type=int, default=6, help=f"greedy steps decoded per process (the first {WARM_UP_STEPS} warm up)")
    add("--threads", type=int, default=1, help="torch threads in each process")
    add("--quick", action="store_true", help="a tiny random Llama at tiny sizes: the plumbing, not the targets")
    add("--report", action="store_true", help="measure nothing: results.md from OUTPUT_DIR/results.json")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = command_line_parser("benchmarks.hybrid_speed", __doc__)
    add_model_arguments(parser)
    add = parser.add_argument
    add("--lengths", type=int, nargs="+", help=f"tokens of each peak-memory run (default {SIZES['lengths'][0]})")
    add("--dtypes", nargs="+", choices=list(DTYPES), help="dtypes of the peak-memory runs (default both)")
    add("--context", type=int, help=f"tokens of context while decoding batches (default {SIZES['context'][0]})")
    add("--batches", type=int, nargs="+", help=f"batch sizes decoded at --context (default {SIZES['batches'][0]})")
    add("--budget-mib", type=int, help=f"memory above the loaded model for the capacity search (default "
        f"{SIZES['budget_mib'][0]})")  # fmt: skip
    add("--repeats", type=int, help="runs of every measurement but the capacity checks (default 2, --quick 1)")
    add("--output-dir", help=f"default {OUTPUT_DIRS[0]} (--quick: {OUTPUT_DIRS[1]})")
    args = finish_arguments(parser.parse_args(argv), SIZES, OUTPUT_DIRS)
    if problems := argument_problems(args):
        parser.error("; ".join(problems))
    return args


def finish_arguments(args: argparse.Namespace, sizes: dict, output_dirs: tuple[str, str]) -> argparse.Namespace:
    """Each size left out takes the full run's default, or --quick's; the score and output folder likewise."""
    for name, defaults in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, defaults[args.quick])
    args.score = args.score or ("random" if args.quick else "gate")
    args.output_dir = args.output_dir or output_dirs[args.quick]
    return args


def argument_problems(args) -> list[str]:
    """Every invalid argument at once, each naming the flag and what it allows (none with --report)."""
    if args.report:
        return []
    problems = model_problems(args, minimums={"context": 2, "budget_mib": 1, "repeats": 1})
    for flag, values, minimum in (("--lengths", args.lengths, args.steps + 1), ("--batches", args.batches, 1)):
        if min(values) < minimum:
            problems.append(f"{flag} must all be >= {minimum}, got {values}")
    if args.context <= args.steps:
        problems.append(f"--context must be > --steps ({args.steps}), got {args.context}")
    return problems


def model_problems(args, minimums: dict[str, int]) -> list[str]:
    """The problems of `add_model_arguments`' flags, and of the numbers in `minimums` (flag: least value)."""
    minimums = {"sink_tokens": 0, "threads": 1} | minimums
    problems = [problem.replace("_", "-") for problem in below_minimums(args, minimums, prefix="--")]
    if args.steps <= WARM_UP_STEPS:
        problems.append(f"--steps must be > {WARM_UP_STEPS} (the warm-up steps), got {args.steps}")
    if min(args.local_windows) < 1:
        problems.append(f"--local-windows must all be >= 1, got {args.local_windows}")
    if not 0 < args.fraction <= 1:
        problems.append(f"--fraction must be in (0, 1], got {args.fraction}")
    if args.score != "random":
        for window in args.local_windows:
            path = score_path(layout_args(args, window))
            if not path.is_file():
                problems.append(f"--layout-dir must hold scores/{path.name} (benchmarks.long_context writes it with "
                                f"--scores {args.score}), got {args.layout_dir}")  # fmt: skip
    if args.quick and args.model != "smollm2-135m-instruct":
        problems.append("--quick makes its own tiny model: drop --model")
    return problems


def layout_args(args, window: int) -> argparse.Namespace:
    """The arguments `benchmarks.serving.head_layout` reads, for one window."""
    return argparse.Namespace(score=args.score, layout_dir=args.layout_dir, local_window=window,
                              sink_tokens=args.sink_tokens, fraction=args.fraction)  # fmt: skip


# --- one measurement, in a fresh process ---------------------------------------------------------------------------


def load_model(spec: dict):
    if spec["model"] is None:  # --quick
        torch.manual_seed(0)
        config = transformers.LlamaConfig(**TINY_LLAMA)
        return transformers.LlamaForCausalLM(config).to(DTYPES[spec["dtype"]]).eval()
    return load_causal_lm(spec["model"], dtype=DTYPES[spec["dtype"]]).eval()


def reset_peak() -> None:
    """VmHWM counts from the resident memory of now (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def measure(spec: dict) -> dict:
    """Run in a fresh process: the model of `spec`, hybridized to its layout unless None, prefilled to
    `tokens - steps` tokens, its cache repeated `batch` times, `steps` greedy steps."""
    torch.set_num_threads(spec["threads"])
    model = load_model(spec)
    if spec["layout"] is not None:
        hybridize(model, head_layout=spec["layout"], local_window=spec["local_window"], sink_tokens=spec["sink_tokens"])
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (1, spec["tokens"] - spec["steps"]), generator=generator)
    with torch.inference_mode():
        model(prompt[:, :16], use_cache=True, logits_to_keep=1)  # warm-up: allocator, kernels
        gc.collect()  # garbage freed, or free heap trimmed, during the measurement would take resident memory
        release_free_heap()  # below the baseline
        reset_peak()
        loaded = rss_bytes()
        start = time.perf_counter()
        outputs = model(prompt, use_cache=True, logits_to_keep=1)  # the prompt's logits would dwarf the rest
        prefill_seconds = time.perf_counter() - start
        cache, token = outputs.cache, outputs.logits[:, -1:].argmax(-1)
        del outputs
        if spec["batch"] > 1:
            cache.batch_repeat_interleave(spec["batch"])
            token = token.repeat(spec["batch"], 1)
        prefill_peak = peak_rss_bytes() - loaded
        reset_peak()
        steps = []
        for _ in range(spec["steps"]):
            start = time.perf_counter()
            outputs = model(token, use_cache=True, **{cache_argument(model): cache})
            token = outputs.logits[:, -1:].argmax(-1)
            steps.append(time.perf_counter() - start)
        decode_peak = peak_rss_bytes() - loaded
    return {"prefill_seconds": prefill_seconds, "decode_ms": 1000 * statistics.median(steps[WARM_UP_STEPS:]),
            "peak_bytes": max(prefill_peak, decode_peak), "decode_peak_bytes": decode_peak,
            "cache_bytes": cache_bytes(cache), "glibc_heap": glibc_heap(),
            "preloaded": preloaded_library()}  # fmt: skip


def in_fresh_process(spec: dict) -> dict:
    return fresh_process(measure, spec, spec["allocator"])


# --- the three measurements ----------------------------------------------------------------------------------------


def model_specs(args, model_config) -> dict[str, dict]:
    """Per measured model (unmodified, then "k{window}" for each window): what `measure` needs besides the sizes."""
    base = {"model": None if args.quick else args.model, "threads": args.threads, "sink_tokens": args.sink_tokens,
            "steps": args.steps}  # fmt: skip
    specs = {"unmodified": base | {"layout": None, "local_window": None}}
    for window in args.local_windows:
        config, layout = head_layout(layout_args(args, window), model_config)
        specs[f"k{window}"] = base | {"layout": layout, "local_window": window, "layout_name": config.name,
                                      "local_groups": local_groups(layout, model_config)}  # fmt: skip
    return specs


def repeated(specs: dict[str, dict], sizes: dict, repeats: int) -> dict[str, list[dict]]:
    """Each model measured at `sizes` `repeats` times, in turn, the order reversed every other round."""
    runs = {name: [] for name in specs}
    for repeat in range(repeats):
        names = list(specs) if repeat % 2 == 0 else list(reversed(specs))
        for name in names:
            runs[name].append(in_fresh_process(specs[name] | sizes))
            print(f"{name} {sizes}: {runs[name][-1]}", flush=True)
    return runs


def memory(specs: dict[str, dict], sizes: dict) -> dict[str, dict]:
    """Each model's figures from one process measuring memory (exact, so once is enough; its timings are not kept)."""
    return {name: runs[0] for name, runs in repeated(specs, sizes | {"allocator": EXACT_MEMORY}, 1).items()}


def timing(specs: dict[str, dict], sizes: dict, repeats: int) -> dict[str, dict]:
    """Each model's timings from `repeats` processes with the default allocator: medians and ranges."""
    runs = repeated(specs, sizes | {"allocator": DEFAULT_ALLOCATOR}, repeats)
    return {name: summary(model_runs) for name, model_runs in runs.items()}


def summary(runs: list[dict]) -> dict:
    """Medians and ranges of each figure over the repeats, and the runs themselves."""
    keys = [key for key in runs[0] if isinstance(runs[0][key], (int, float))]
    return {key: statistics.median(run[key] for run in runs) for key in keys} | {
        "ranges": {key: [min(run[key] for run in runs), max(run[key] for run in runs)] for key in keys},
        "runs": runs,
    }


def capacity(spec: dict, batches: dict[int, dict], budget: int, context: int) -> dict:
    """The largest batch whose decoding peak fits `budget` bytes: predicted from a straight line through the measured
    batches' peaks, then checked in processes of its own, widening and halving the bracket until a batch fits and
    the next does not."""
    sizes = sorted(batches)
    low, high = sizes[0], sizes[-1]
    per_row = (batches[high]["decode_peak_bytes"] - batches[low]["decode_peak_bytes"]) / max(high - low, 1)
    fixed = batches[low]["decode_peak_bytes"] - per_row * low
    predicted = max(1, int((budget - fixed) // per_row)) if per_row > 0 else high
    probed = {}

    def fits(size: int) -> bool:
        if size not in probed:
            probed[size] = in_fresh_process(spec | {"tokens": context, "batch": size, "dtype": "float32",
                                                    "allocator": EXACT_MEMORY})  # fmt: skip
            print(f"capacity probe {size}: {probed[size]}", flush=True)
        return probed[size]["decode_peak_bytes"] <= budget

    fitting, failing, step = 0, None, 1  # the largest batch known to fit, the smallest known not to
    size = predicted
    while failing is None or failing - fitting > 1:
        if fits(size):
            fitting, size, step = size, size + step, step * 2
        else:
            failing, step = size, 1
        if failing is not None:
            size = (fitting + failing) // 2 if fitting else max(1, failing // 2)
            if size == fitting or (fitting == 0 and size == failing):
                break
    result = {"batch": fitting, "probed": {str(size): run for size, run in sorted(probed.items())},
              "predicted": predicted}  # fmt: skip
    if fitting:
        result["decode_peak_bytes"] = probed[fitting]["decode_peak_bytes"]
    return result


def run(args, argv: list[str]) -> dict:
    start, load_at_start = time.perf_counter(), machine_load()
    print(f"load at start: {load_at_start['uptime']}", flush=True)
    model_config = (transformers.LlamaConfig(**TINY_LLAMA) if args.quick
                    else transformers.AutoConfig.from_pretrained(args.model) if Path(args.model).is_dir()
                    else load_causal_lm(args.model, dtype=torch.float32).config)  # fmt: skip
    specs = model_specs(args, model_config)
    # Keys as strings, as results.json has them: the report reads both alike.
    peaks = {dtype: {str(length): memory(specs, {"tokens": length, "batch": 1, "dtype": dtype})
                     for length in args.lengths} for dtype in args.dtypes}  # fmt: skip
    lengths = {str(length): timing(specs, {"tokens": length, "batch": 1, "dtype": "float32"}, args.repeats)
               for length in args.lengths}  # fmt: skip
    batches = {}
    for batch in args.batches:
        sizes = {"tokens": args.context, "batch": batch, "dtype": "float32"}
        batches[str(batch)] = {"timing": timing(specs, sizes, args.repeats), "memory": memory(specs, sizes)}
    budget = args.budget_mib * 2**20
    capacities = {}
    for name, spec in specs.items():
        found = capacity(spec, {b: batches[str(b)]["memory"][name] for b in args.batches}, budget, args.context)
        if found["batch"]:
            sizes = {"tokens": args.context, "batch": found["batch"], "dtype": "float32"}
            timed = timing({name: spec}, sizes, args.repeats)[name]
            found |= {"timing": timed, "tokens_per_second": found["batch"] * 1000 / timed["decode_ms"]}
        capacities[name] = found
    return {
        "command": shlex.join(["python", "-m", "benchmarks.hybrid_speed", *argv]),
        "model": "tiny-random-llama" if args.quick else args.model, "family": model_config.model_type,
        "layers": model_config.num_hidden_layers, "heads": model_config.num_attention_heads,
        "key_value_heads": model_config.num_key_value_heads,
        "models": {name: {key: spec.get(key) for key in ("local_window", "layout_name", "local_groups")}
                   for name, spec in specs.items()},
        "groups": model_config.num_hidden_layers * model_config.num_key_value_heads,
        "peaks": peaks, "lengths": lengths, "batches": batches, "capacity": capacities, "budget_bytes": budget,
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "python": sys.version.split()[0]},
        "code": code_version(), "malloc_mmap_threshold": int(MALLOC_MMAP_THRESHOLD),
        "machine": {"before": load_at_start, "after": machine_load(), "torch": describe_machine("cpu")},
        "settings": vars(args), "wall_seconds": time.perf_counter() - start,
    }  # fmt: skip


# --- the report ----------------------------------------------------------------------------------------------------


def mib(num_bytes: float) -> str:
    return f"{num_bytes / 2**20:,.0f}"


def spread(figures: dict, key: str, scale: float = 1.0, digits: int = 2) -> str:
    """A median and its range over the repeats."""
    low, high = (value * scale for value in figures["ranges"][key])
    value = figures[key] * scale
    return f"{value:,.{digits}f}" if low == high else f"{value:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})"


def target_rows(result: dict) -> list[tuple[str, float, str, float]]:
    """(what, hybridized / unmodified, comparison, target) for each target and each hybridized model."""
    context, largest = result["settings"]["context"], max(result["batches"], key=int)
    timed, capacity = result["batches"][largest]["timing"], result["capacity"]
    rows = []
    for name in list(result["models"])[1:]:
        peaks = {(dtype, int(length)): ratio_or_nan(figures[name]["peak_bytes"], figures["unmodified"]["peak_bytes"])
                 for dtype, lengths in result["peaks"].items() for length, figures in lengths.items()}  # fmt: skip
        at_context = [value for (_, length), value in peaks.items() if length == context]
        figures = {
            TARGETS[0][0].replace("--context", f"{context:,}"): max(at_context, default=float("nan")),
            TARGETS[1][0]: max(peaks.values()),
            f"{TARGETS[2][0]} ({largest})": timed["unmodified"]["decode_ms"] / timed[name]["decode_ms"],
            TARGETS[3][0]: ratio_or_nan(capacity[name]["batch"], capacity["unmodified"]["batch"]),
            TARGETS[4][0]: ratio_or_nan(capacity[name].get("tokens_per_second", 0),
                                        capacity["unmodified"].get("tokens_per_second", 0)),
        }  # fmt: skip
        rows += [(f"{name}: {what}", value, *target[1:]) for (what, value), target in zip(figures.items(), TARGETS,
                                                                                           strict=True)]  # fmt: skip
        # The same peaks as a user's process has them, with glibc's default allocator (the timing processes').
        resident = {int(length): ratio_or_nan(figures[name]["peak_bytes"], figures["unmodified"]["peak_bytes"])
                    for length, figures in result["lengths"].items()}  # fmt: skip
        rows += [(f"{name}: {TARGETS[0][0].replace('--context', f'{context:,}')}, default allocator (float32)",
                  resident.get(context, float("nan")), *TARGETS[0][1:]),
                 (f"{name}: {TARGETS[1][0]}, default allocator (float32)", max(resident.values()),
                  *TARGETS[1][1:])]  # fmt: skip
    return rows


def ratio_or_nan(value: float, reference: float) -> float:
    """value / reference, NaN where nothing was measured to divide by (a peak of 0 bytes in a tiny run)."""
    return value / reference if reference else float("nan")


def met(value: float, comparison: str, target: float) -> str:
    holds = value <= target if comparison == "<=" else value >= target
    return "yes" if holds else "**no**"


def weights_bound(result: dict, name: str) -> tuple[float, float] | None:
    """Decoding speed at batch 1 and --context tokens, and the most it could be if a step's time beyond the shortest
    length's (the weights and fixed costs) fell with the cache: unmodified time / (shortest + rest x cache ratio)."""
    lengths, context = result["lengths"], str(result["settings"]["context"])
    if context not in lengths:
        return None
    shortest = min(lengths, key=int)
    unmodified, fixed = lengths[context]["unmodified"]["decode_ms"], lengths[shortest]["unmodified"]["decode_ms"]
    cache = ratio_or_nan(lengths[context][name]["cache_bytes"], lengths[context]["unmodified"]["cache_bytes"])
    return unmodified / lengths[context][name]["decode_ms"], unmodified / (fixed + (unmodified - fixed) * cache)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|---" * len(header) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def ranking(settings: dict, name: str, result: dict) -> str:
    """How a hybridized model's local groups were chosen: the scores file its window ranked them by, or at random."""
    if settings["score"] == "random":
        return "drawn at random (seed 0)"
    window = result["models"][name]["local_window"]
    return f"ranked by {score_path(layout_args(argparse.Namespace(**settings), window))}"


def report(result: dict) -> str:
    """results.md: the targets, then the tables they come from, then the machine."""
    names = list(result["models"])
    hybrids, settings = names[1:], result["settings"]
    context = settings["context"]
    lines = [
        f"# Memory and speed, hybridized beside unmodified: {result['model']}", "",
        f"{result['family']}, {result['layers']} layers of {result['heads']} query heads over "
        f"{result['key_value_heads']} key/value heads. Hybridized: "
        + "; ".join(f"`{result['models'][name]['layout_name']}` ({result['models'][name]['local_groups']} of "
                    f"{result['groups']} key/value groups local, {ranking(settings, name, result)})"
                    for name in hybrids) + ".", "",
    ]  # fmt: skip
    lines += table(["target", "hybridized / unmodified", "target", "met"],
                   [[what, f"{value:.2f}x", f"{comparison} {target:.1f}x", met(value, comparison, target)]
                    for what, value, comparison, target in target_rows(result)])  # fmt: skip
    for name in hybrids:
        if bound := weights_bound(result, name):
            lines += ["", f"{name} at batch 1 and {context:,} tokens decodes at {bound[0]:.2f}x the unmodified "
                      f"model's speed, where {bound[1]:.2f}x is the most a step could gain if all but its time at "
                      f"{int(min(result['lengths'], key=int)):,} tokens (the weights, fixed costs) fell as the cache "
                      "does."]  # fmt: skip
    ratio_header = [cell for name in hybrids for cell in (name, "/ unmodified")]
    for dtype, by_length in result["peaks"].items():
        rows = [[f"{int(length):,}", mib(figures["unmodified"]["peak_bytes"]),
                 *(cell for name in hybrids for cell in (
                     mib(figures[name]["peak_bytes"]),
                     f"{ratio_or_nan(figures[name]['peak_bytes'], figures['unmodified']['peak_bytes']):.2f}x"))]
                for length, figures in by_length.items()]  # fmt: skip
        lines += ["", f"Peak resident memory above the loaded model (MiB), {dtype}, batch 1: one prefill and "
                  f"{settings['steps']} steps:", "", *table(["tokens", "unmodified", *ratio_header], rows)]  # fmt: skip
    measures = (("prefill_seconds", "prefill seconds", 2, 1), ("decode_ms", "ms per decoding step", 1, 1),
                ("peak_bytes", "peak resident memory above the loaded model (MiB) with glibc's default allocator, "
                 "as a user's process has it", 0, 2**-20))  # fmt: skip
    for key, what, digits, scale in measures:
        rows = [[f"{int(length):,}", spread(figures["unmodified"], key, scale, digits),
                 *(cell for name in hybrids for cell in (
                     spread(figures[name], key, scale, digits),
                     f"{ratio_or_nan(figures[name][key], figures['unmodified'][key]):.2f}x"))]
                for length, figures in result["lengths"].items()]  # fmt: skip
        lines += ["", f"Batch 1, float32: {what} (median, range over {settings['repeats']} runs):", "",
                  *table(["tokens", "unmodified", *ratio_header], rows)]  # fmt: skip
    rows = []
    for batch, figures in result["batches"].items():
        timed, peaks = figures["timing"], figures["memory"]
        rows.append([batch, spread(timed["unmodified"], "decode_ms", digits=1),
                     *(cell for name in hybrids for cell in (
                         spread(timed[name], "decode_ms", digits=1),
                         f"{timed['unmodified']['decode_ms'] / timed[name]['decode_ms']:.2f}x")),
                     *(f"{int(batch) * 1000 / timed[name]['decode_ms']:,.1f}" for name in names),
                     *(mib(peaks[name]["decode_peak_bytes"]) for name in names)])  # fmt: skip
    lines += ["", f"Decoding at {context:,} tokens of context, float32: ms per step for the whole batch, speed "
              "(unmodified ms / hybridized ms: > 1 is faster), tokens per second, and the peak while decoding "
              "(MiB: the cache and a step's working memory):", "",
              *table(["batch", "unmodified ms", *(c for name in hybrids for c in (f"{name} ms", "speed")),
                      *(f"{name} tokens/s" for name in names), *(f"{name} MiB" for name in names)], rows)]  # fmt: skip
    rows = []
    reference = result["capacity"]["unmodified"]
    for name in names:
        at = result["capacity"][name]
        probed = ", ".join(f"{size}: {mib(run['decode_peak_bytes'])}" for size, run in at["probed"].items())
        if not at["batch"]:
            rows.append([name, "0", "-", "-", "-", "-", "-", probed])
            continue
        rows.append([name, str(at["batch"]), f"{ratio_or_nan(at['batch'], reference['batch']):.2f}x",
                     mib(at["decode_peak_bytes"]), spread(at["timing"], "decode_ms", digits=1),
                     f"{at['tokens_per_second']:,.1f}",
                     f"{ratio_or_nan(at['tokens_per_second'], reference.get('tokens_per_second', 0)):.2f}x",
                     probed])  # fmt: skip
    lines += ["", f"Capacity: the largest batch whose decoding at {context:,} tokens peaks within "
              f"{mib(result['budget_bytes'])} MiB above the loaded model (float32), one more row checked not to fit "
              "(each batch probed, with its peak in MiB):", "",
              *table(["model", "batch", "/ unmodified", "decoding peak MiB", "ms per step", "tokens/s",
                      "/ unmodified", "probed"], rows)]  # fmt: skip
    before, after = result["machine"]["before"], result["machine"]["after"]
    lines += [
        "", f"`{result['command']}`: {result['wall_seconds'] / 60:.1f} min, {settings['threads']} thread(s) per "
        f"process, timings {settings['repeats']} run(s) each (median, range in brackets), memory in processes with "
        f"MALLOC_MMAP_THRESHOLD_={result['malloc_mmap_threshold']}, {result['machine']['torch']}, transformers "
        f"{result['versions']['transformers']}{code_note(result['code'])}. `uptime` before: `{before['uptime']}`; "
        f"after: `{after['uptime']}`.",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    measured_or_stored(parse_args(argv), argv, run, report)


if __name__ == "__main__":
    main()
