"""Continuous batching of a hybridized model against the unmodified one under one cache budget: how many requests
decode at once, generated tokens per second, time to first token.

    python -m benchmarks.serving                 # SmolLM2-135M-Instruct, offline: 64 requests of 1K-8K tokens
    python -m benchmarks.serving --requests 32 --max-prompt 4096   # the recorded run: 36 minutes on 2 CPU cores
    python -m benchmarks.serving --quick         # 8 requests of 128-512 tokens: under a minute, into outputs/
    python -m benchmarks.serving --report        # results.md from results.json alone

On 2 CPU cores the defaults would take hours (estimated from the 32-request run): transformers' continuous batching
lays a forward's requests end to end and its SDPA masks every query against every key of the batch, so a prefill
chunk's cost grows with the cache the decoding requests hold. --quick's prompts are too short for a 256-token window
to free anything: it checks the plumbing and the timing, not the targets.

The model (`--model`, any `hf_attn.pretrained` source; float32, CPU) serves the same requests twice through
transformers' continuous batching (`init_continuous_batching`, its manager, scheduler and generation loop), first
unmodified, then hybridized in place by `hf_attn.hybridize` to the layout `benchmarks.long_context` chose: the share
`--fraction` of key/value groups made `--local-window`-local with `--sink-tokens` sinks, ranked by the score stored in
LAYOUT_DIR/scores (default: the committed k256-s4-f0.5-gate run). Both get the same `ContinuousBatchingConfig`:
`--num-blocks` blocks of `--page-size` tokens of the unmodified model's cache (hf_attn's paged cache counts its blocks
in the same unit, so both hold the same bytes), `--max-batch-tokens`, no prefix sharing (hf_attn's paged cache has
none), no asynchronous batching. The default budget holds `LONGEST_HELD` of the longest requests in the unmodified
model, so that the cache, not the queue, limits how many requests run at once.

Workload: `--requests` prompts cut from WikiText-2 test text, their lengths spread evenly over [`--min-prompt`,
`--max-prompt`] and submitted all at once in a shuffled (seeded) order, each generating `--new-tokens` greedy tokens
with no end-of-sequence token. Measured per model: the most requests that decode in one forward (each forward's
scheduled requests that have a token already, from the scheduler's batches), their time-weighted mean, generated
tokens per second over the run (submission to last token), each request's time to first token (its first token's
timestamp, which transformers records, less its creation time), wall time, and requests preempted (their cache freed
and their prefill begun again when the cache ran out). Ratios are hybridized / unmodified. `--all-global` adds a
third model, measured last: the model hybridized with every head global, which hf_attn's paged cache and attention
serve without local heads (hybridized / all_global is then the local heads' own share of the gain).
Writes OUTPUT_DIR/{results.json, results.md}. Each model's record is kept in OUTPUT_DIR/runs/ as soon as it is
measured, with `uptime` before and after it: the same command again, after an interruption, measures only the models
it lacks (each model's ratios then span two processes; the report says which were resumed).
"""

import json
import random
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from benchmarks.common import (
    command_line_parser,
    data_dir_problems,
    describe_machine,
    machine_load,
    measured_or_stored,
)
from benchmarks.long_context_configs import SCORE_NAMES, Config, layout_for
from hf_attn import hybridize
from hf_attn.data.wikitext import load_wikitext, tokenize_text
from hf_attn.experiments.arguments import below_minimums
from hf_attn.hybrid import num_key_value_heads
from hf_attn.pretrained import load_causal_lm, load_tokenizer, source_argument

# Workload sizes (None on the command line): the full run's, and --quick's.
SIZES = {"requests": (64, 8), "min_prompt": (1024, 128), "max_prompt": (8192, 512), "new_tokens": (128, 16)}
LONGEST_HELD = 4  # the default budget: this many of the longest requests (prompt + new tokens) in the unmodified cache
OUTPUT_DIRS = ("docs/results/serving", "outputs/serving-quick")  # full, --quick: a quick run never overwrites results
# The table's rows: a key of each model's record, what it is, and the target for hybridized / unmodified, if any.
MEASURES = (
    ("max_decoding", "requests decoding at once, most", (">=", 1.8)),
    ("tokens_per_second", "generated tokens/s", (">=", 1.4)),
    ("ttft_median_seconds", "time to first token, median (s)", ("<=", 1.0)),  # no worse
    ("mean_decoding", "requests decoding at once, time-weighted mean", None),
    ("max_active", "requests holding cache at once, most", None),
    ("ttft_p95_seconds", "time to first token, p95 (s)", None),
    ("wall_seconds", "wall time (s)", None),
    ("preempted", "requests preempted (prefill begun again)", None),
    ("forwards", "forwards", None),
)
MODELS = ("unmodified", "hybridized")
ALL_GLOBAL = "all_global"  # --all-global's model: hybridized with every head global (hf_attn's paged path alone)


def parse_args(argv: list[str] | None = None):
    parser = command_line_parser("benchmarks.serving", __doc__)
    add = parser.add_argument
    add("--model", type=source_argument, default="smollm2-135m-instruct", help="Hub id, folder, .gguf file or "
        "hf_attn.pretrained short name")  # fmt: skip
    add("--tokenizer", type=source_argument, help="tokenizer id, folder or .gguf file (default: the model's)")
    add("--data-dir", default="../shared/data/wikitext-2-raw", help="folder of wiki.{valid,test}.raw; '' for the Hub")
    add("--layout-dir", default="docs/results/long_context/smollm2-135m-instruct", help="a benchmarks.long_context "
        "output folder: its scores/SCORE-kK-sS.json ranks the key/value groups")  # fmt: skip
    add("--score", choices=SCORE_NAMES, default="gate", help="which score ranks the groups (random: seed 0, no file)")
    add("--local-window", type=int, default=256, help="k: previous tokens a local head sees")
    add("--sink-tokens", type=int, default=4, help="first tokens local heads also see")
    add("--fraction", type=float, default=0.5, help="share of key/value groups made local")
    for name, (full, quick) in SIZES.items():
        add(f"--{name.replace('_', '-')}", type=int, help=f"default {full} (--quick: {quick})")
    add("--num-blocks", type=int, help=f"cache blocks of --page-size tokens of the unmodified model, for both models "
        f"(default: room for {LONGEST_HELD} requests of --max-prompt + --new-tokens tokens)")  # fmt: skip
    add("--page-size", type=int, default=64, help="tokens per page (for a 256-token window and 4 sinks, local "
        "heads hold up to 3 pages: 768 slots with transformers' default of 256, 384 with 64)")  # fmt: skip
    add("--max-batch-tokens", type=int, default=1024, help="query tokens per forward, prefill chunks included")
    add("--seed", type=int, default=0, help="the prompts' order and where each is cut from the text")
    add("--threads", type=int, help="torch threads (default: torch's)")
    add("--all-global", action="store_true", help="also serve the model hybridized with every head global: "
        "hf_attn's paged cache and attention without local heads, to tell their gain from local heads'")  # fmt: skip
    add(
        "--quick",
        action="store_true",
        help="a tiny workload: under a minute, for the plumbing (prompts within the window: no capacity to gain)",
    )
    add("--report", action="store_true", help="measure nothing: results.md from OUTPUT_DIR/results.json")
    add("--output-dir", help=f"default {OUTPUT_DIRS[0]} (--quick: {OUTPUT_DIRS[1]})")
    args = parser.parse_args(argv)
    for name, sizes in SIZES.items():
        if getattr(args, name) is None:
            setattr(args, name, sizes[args.quick])
    args.output_dir = args.output_dir or OUTPUT_DIRS[args.quick]
    if args.num_blocks is None:
        args.num_blocks = -(-LONGEST_HELD * (args.max_prompt + args.new_tokens) // args.page_size)
    if problems := argument_problems(args):
        parser.error("; ".join(problems))
    return args


def argument_problems(args) -> list[str]:
    """Every invalid argument at once, each naming the flag and what it allows, before any model loads (none with
    --report, which reads results.json alone)."""
    if args.report:
        return []
    minimums = {"requests": 1, "min_prompt": 1, "new_tokens": 1, "local_window": 1, "sink_tokens": 0,
                "num_blocks": 1, "page_size": 4, "max_batch_tokens": 1, "threads": 1}  # fmt: skip
    problems = [problem.replace("_", "-") for problem in below_minimums(args, minimums, prefix="--")]
    if args.max_prompt < args.min_prompt:
        problems.append(f"--max-prompt must be >= --min-prompt ({args.min_prompt}), got {args.max_prompt}")
    if not 0 < args.fraction <= 1:
        problems.append(f"--fraction must be in (0, 1], got {args.fraction}")
    if args.num_blocks * args.page_size < args.max_prompt + args.new_tokens:
        problems.append(f"--num-blocks must hold the longest request ({args.max_prompt + args.new_tokens} tokens, "
                        f"{-(-(args.max_prompt + args.new_tokens) // args.page_size)} blocks of --page-size "
                        f"{args.page_size}), got {args.num_blocks}")  # fmt: skip
    if args.score != "random" and not score_path(args).is_file():
        problems.append(f"--layout-dir must hold scores/{score_path(args).name} (benchmarks.long_context writes it "
                        f"with --scores {args.score}), got {args.layout_dir}")  # fmt: skip
    return problems + data_dir_problems(args.data_dir)


def score_path(args) -> Path:
    """Where `benchmarks.long_context` stores a score for (k, S)."""
    return Path(args.layout_dir) / "scores" / f"{args.score}-k{args.local_window}-s{args.sink_tokens}.json"


def head_layout(args, model_config) -> tuple[Config, list[list[str]]]:
    """The configuration and its head layout, as `benchmarks.long_context` made them."""
    seed, scores = (0, None) if args.score == "random" else (None, json.loads(score_path(args).read_text())["scores"])
    config = Config(args.local_window, args.sink_tokens, args.fraction, args.score, seed)
    return config, layout_for(config, scores, model_config)


def local_groups(layout: list[list[str]], model_config) -> int:
    """Key/value groups that only local heads read: those whose cache keeps the sinks and the window alone."""
    group = model_config.num_attention_heads // num_key_value_heads(model_config)
    starts = range(0, model_config.num_attention_heads, group)
    return sum(set(kinds[start : start + group]) == {"local"} for kinds in layout for start in starts)


def prompt_lengths(args) -> list[int]:
    """`--requests` lengths spread evenly over [min, max], in a seeded shuffled order: long and short prompts arrive
    mixed, as they would at a server."""
    count, spread = args.requests, args.max_prompt - args.min_prompt
    lengths = [args.min_prompt + round(i * spread / max(count - 1, 1)) for i in range(count)]
    random.Random(args.seed).shuffle(lengths)
    return lengths


def prompts(tokenizer, args) -> list[list[int]]:
    """Each prompt a stretch of WikiText-2 test text, the stretches starting at evenly spaced tokens (no two requests
    share a prefix, which prefix caching could otherwise reuse)."""
    tokens = tokenize_text(load_wikitext(args.data_dir or None).eval_text, tokenizer).tolist()
    room = len(tokens) - args.max_prompt
    if room < args.requests:
        raise ValueError(f"the test text has {len(tokens)} tokens, too few for {args.requests} distinct prompts of up "
                         f"to --max-prompt {args.max_prompt}")  # fmt: skip
    lengths = prompt_lengths(args)
    return [tokens[i * room // args.requests :][:length] for i, length in enumerate(lengths)]


class BatchLog:
    """Every forward continuous batching makes: when it was scheduled, how many of its requests decode (have a token
    already), and how many requests hold cache. Wraps the scheduler's `schedule_batch`, which the generation thread
    calls once per forward; read it once the thread has stopped."""

    def __init__(self, scheduler) -> None:
        self.forwards: list[tuple[float, int, int]] = []  # (perf_counter, decoding, active requests)
        self.prefills_begun: dict[str, int] = {}  # request id -> prefills begun from its first token
        schedule = scheduler.schedule_batch

        def logged(token_budget: int, cache_budget: int):
            batch, *rest = schedule(token_budget, cache_budget)
            if batch:
                states = [future.state for future in batch]
                self.forwards.append((time.perf_counter(), sum(s.generated_len() > 0 for s in states),
                                      len(scheduler.active_requests)))  # fmt: skip
                for state in states:
                    if state.position_offset == 0:  # a first prefill chunk: new, or its cache freed (preempted)
                        self.prefills_begun[state.request_id] = self.prefills_begun.get(state.request_id, 0) + 1
            return batch, *rest

        scheduler.schedule_batch = logged

    def summary(self, end: float) -> dict:
        times = [forward[0] for forward in self.forwards] + [end]
        durations = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
        decoding = [forward[1] for forward in self.forwards]
        return {
            "max_decoding": max(decoding), "max_active": max(forward[2] for forward in self.forwards),
            "mean_decoding": sum(d * s for d, s in zip(decoding, durations, strict=False)) / sum(durations),
            "forwards": len(self.forwards), "preempted": sum(count - 1 for count in self.prefills_begun.values()),
        }  # fmt: skip


def batching_config(args) -> ContinuousBatchingConfig:
    """The one configuration both models get (a fresh object each: hf_attn's manager sets fields on its own)."""
    return ContinuousBatchingConfig(num_blocks=args.num_blocks, page_size=args.page_size,
                                    max_batch_tokens=args.max_batch_tokens, allow_block_sharing=False,
                                    use_async_batching=False, use_cuda_graph=False)  # fmt: skip


def percentile(values: list[float], share: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    ordered, position = sorted(values), share * (len(values) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@torch.inference_mode()
def serve(model, requests: list[list[int]], args) -> dict:
    """Every request submitted at once to the model's continuous batching; what `BatchLog` saw, and per request its
    time to first token and its latency."""
    generation = GenerationConfig(max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=-1)  # -1: no eos
    manager = model.init_continuous_batching(generation, batching_config(args))
    manager.warmup()  # makes the batch processor (on a CPU, nothing else: no graphs to capture, nothing compiled)
    log, cache = BatchLog(manager.batch_processor.scheduler), manager.batch_processor.cache
    manager.start()
    submitted = time.perf_counter()
    ids = manager.add_requests(inputs=requests, max_new_tokens=args.new_tokens, streaming=True, record_timestamps=True)
    first, finished = {}, {}  # request id -> its first streamed output (created and first token stamped), its last
    try:
        while len(finished) < len(ids):
            output = manager.get_result(timeout=1)
            if output is None:
                if not manager.is_running():
                    raise RuntimeError(f"continuous batching stopped with {len(ids) - len(finished)} requests left")
                continue
            if output.error is not None:
                raise RuntimeError(f"request {output.request_id} failed: {output.error}")
            first.setdefault(output.request_id, output)  # a preempted request's later outputs restart the clock
            if output.is_finished():
                finished[output.request_id] = output
    finally:
        manager.stop(block=True)
    end = max(output.timestamps[-1] for output in finished.values())
    per_request = [{"prompt_tokens": len(prompt), "generated_tokens": len(finished[i].generated_tokens),
                    "ttft_seconds": first[i].timestamps[0] - first[i].created_time,
                    "latency_seconds": finished[i].timestamps[-1] - first[i].created_time}
                   for i, prompt in zip(ids, requests, strict=True)]  # fmt: skip
    if any(request["generated_tokens"] != args.new_tokens for request in per_request):
        raise RuntimeError(f"a request generated other than --new-tokens {args.new_tokens} tokens")
    ttft = [request["ttft_seconds"] for request in per_request]
    generated = sum(request["generated_tokens"] for request in per_request)
    return log.summary(end) | {
        "tokens_per_second": generated / (end - submitted), "wall_seconds": end - submitted,
        "ttft_median_seconds": statistics.median(ttft), "ttft_p95_seconds": percentile(ttft, 0.95),
        "cache_bytes": cache.cache_tensor.numel() * cache.cache_tensor.element_size(), "cache_blocks": cache.num_blocks,
        "max_batch_tokens": cache.max_batch_tokens, "requests": per_request,
    }  # fmt: skip


def code_version() -> dict:
    """The commit measured, and what in hf_attn and benchmarks differed from it (a run of uncommitted code says so)."""

    def git(*arguments: str) -> str:
        try:  # a machine without git, or a copy of the files without .git (benchmarks/ruler_gpu.sh's), says nothing
            return subprocess.run(["git", *arguments], capture_output=True, text=True, check=False).stdout
        except FileNotFoundError:
            return ""

    return {"commit": git("rev-parse", "--short", "HEAD").strip(),
            "uncommitted": git("status", "--porcelain", "--", "hf_attn", "benchmarks").splitlines()}  # fmt: skip


def served_models(args) -> tuple[str, ...]:
    """The models measured, in order: unmodified first (hybridize works in place), then the one the targets are for."""
    return (*MODELS, ALL_GLOBAL) if args.all_global else MODELS


def stored_or_measured(args, names: tuple[str, ...], measure_one) -> tuple[dict, list[str]]:
    """Each model's record, and the names of those an earlier invocation measured: a full run takes hours on a CPU,
    so each record is written to OUTPUT_DIR/runs/NAME.json as soon as it is measured, with the settings and the
    machine's load around it, and a run stopped part way resumes when given the same arguments again."""
    folder = Path(args.output_dir) / "runs"
    ignored = ("report", "output_dir", "checkpoint_dir", "all_global")  # where things go, and which models
    settings = {key: value for key, value in vars(args).items() if key not in ignored}
    runs, resumed = {}, []
    for name in names:
        path = folder / f"{name}.json"
        stored = json.loads(path.read_text()) if path.is_file() else None
        if stored is not None and stored["settings"] == settings:
            runs[name] = stored["run"]
            resumed.append(name)
            print(f"{name}: measured before ({path}), kept", flush=True)
            continue
        before = machine_load()
        print(f"{name}: load before: {before['uptime']}", flush=True)
        record = measure_one(name)
        runs[name] = {"machine": {"before": before, "after": machine_load()}, "code": code_version()} | record
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"settings": settings, "run": runs[name]}, indent=1) + "\n")
        shown = {key: value for key, value in record.items() if key not in ("requests", "machine")}
        print(f"{name}: {json.dumps(shown)}", flush=True)
    return runs, resumed


def run(args, argv: list[str]) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    start, load_at_start = time.perf_counter(), machine_load()
    print(f"load at start: {load_at_start['uptime']}", flush=True)
    model = load_causal_lm(args.model, dtype=torch.float32).eval()
    requests = prompts(load_tokenizer(args.tokenizer or args.model), args)
    config, layout = head_layout(args, model.config)
    family, parameters = model.config.model_type, model.num_parameters()  # the unmodified model's

    def measure_one(name: str) -> dict:
        if name == ALL_GLOBAL:
            hybridize(model, head_layout=[["global"] * len(kinds) for kinds in layout])
        elif name == "hybridized":
            hybridize(model, head_layout=layout, local_window=args.local_window, sink_tokens=args.sink_tokens)
        return serve(model, requests, args)

    runs, resumed = stored_or_measured(args, served_models(args), measure_one)
    groups = model.config.num_hidden_layers * num_key_value_heads(model.config)
    return {
        "command": shlex.join(["python", "-m", "benchmarks.serving", *argv]), "model": args.model,
        "family": family, "parameters": parameters,
        "layers": model.config.num_hidden_layers, "heads": model.config.num_attention_heads,
        "key_value_heads": num_key_value_heads(model.config), "dtype": "float32", "threads": torch.get_num_threads(),
        "layout": {"name": config.name, "local_groups": local_groups(layout, model.config), "groups": groups,
                   "scores": None if args.score == "random" else str(score_path(args))},
        "workload": {"requests": args.requests, "prompt_tokens": [len(prompt) for prompt in requests],
                     "new_tokens": args.new_tokens, "text": "WikiText-2 test"},
        "batching_config": {"num_blocks": args.num_blocks, "page_size": args.page_size,
                            "max_batch_tokens": args.max_batch_tokens, "allow_block_sharing": False,
                            "use_async_batching": False, "use_cuda_graph": False},
        "runs": runs, "resumed": resumed, "ratios": {key: ratio(runs, key) for key, *_ in MEASURES},
        **({"ratios_to_all_global": {key: ratio(runs, key, ALL_GLOBAL) for key, *_ in MEASURES}}
           if ALL_GLOBAL in runs else {}),
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "python": sys.version.split()[0]},
        "code": code_version(),
        "machine": {"before": load_at_start, "after": machine_load(), "torch": describe_machine("cpu")},
        "settings": vars(args), "wall_seconds": time.perf_counter() - start,
    }  # fmt: skip


def ratio(runs: dict, key: str, baseline: str = "unmodified") -> float | None:
    """hybridized / `baseline`; None where the baseline's figure is 0."""
    measured = runs[baseline][key]
    return runs["hybridized"][key] / measured if measured else None


def met(value: float | None, comparison: str, target: float) -> bool:
    return value is not None and (value >= target if comparison == ">=" else value <= target)


def mib(run: dict) -> str:
    return f"{run['cache_bytes'] / 2**20:,.0f}"


def cell(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"


def code_note(code: dict | None) -> str:
    if code is None:  # results written before the field was
        return ""
    changed = f", with uncommitted changes to {', '.join(line[3:] for line in code['uncommitted'])}"
    return f", at commit {code['commit']}" + (changed if code["uncommitted"] else "")


def ratio_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def machine_lines(result: dict, names: list[str]) -> list[str]:
    """`uptime` around each model's run where the results have it (they do since runs are resumable), else around
    the whole invocation."""
    if all("machine" in result["runs"][name] for name in names):
        return [f"- {name}: `uptime` before: `{result['runs'][name]['machine']['before']['uptime']}`; after: "
                f"`{result['runs'][name]['machine']['after']['uptime']}`." for name in names]  # fmt: skip
    machine = result["machine"]
    return [f"`uptime` before: `{machine['before']['uptime']}`; after: `{machine['after']['uptime']}`."]


def report(result: dict) -> str:
    """results.md: the workload, the table against the targets, the machine."""
    runs, ratios, batching = result["runs"], result["ratios"], result["batching_config"]
    workload, layout = result["workload"], result["layout"]
    lengths = workload["prompt_tokens"]
    unmodified_tokens = batching["num_blocks"] * batching["page_size"]
    names = [name for name in ("unmodified", ALL_GLOBAL, "hybridized") if name in runs]
    extra_header = " hybridized / all_global |" if ALL_GLOBAL in runs else ""
    lines = [
        f"# Continuous batching under one cache budget: {result['model']}", "",
        f"{result['family']}, {result['parameters']:,} parameters, {result['layers']} layers of {result['heads']} "
        f"query heads over {result['key_value_heads']} key/value heads, {result['dtype']}, {result['threads']} "
        f"threads. Hybridized: `{layout['name']}`, {layout['local_groups']} of {layout['groups']} key/value groups "
        f"local" + (f" (ranked by {layout['scores']})" if layout["scores"] else "") + ".", "",
        f"Workload: {workload['requests']} requests submitted at once, prompts of {min(lengths):,}-{max(lengths):,} "
        f"tokens ({workload['text']}, mean {statistics.mean(lengths):,.0f}), {workload['new_tokens']} greedy new "
        f"tokens each, no end-of-sequence token. {'All three' if ALL_GLOBAL in runs else 'Both'} models: "
        f"transformers' continuous batching with `ContinuousBatchingConfig(num_blocks={batching['num_blocks']}, "
        f"page_size={batching['page_size']}, max_batch_tokens={batching['max_batch_tokens']})`, no prefix sharing, "
        f"no asynchronous batching: room for {unmodified_tokens:,} tokens of the unmodified model's cache ("
        + "; ".join(f"{name}: {mib(runs[name])} MiB" for name in names) + ").", "",
        f"| measure | {' | '.join(names)} | hybridized / unmodified | target | met |{extra_header}",
        "|---" * (len(names) + 4 + bool(extra_header)) + "|",
    ]  # fmt: skip
    for key, label, target in MEASURES:
        value = ratios[key]
        verdict = "" if target is None else "yes" if met(value, *target) else "**no**"
        against = "- | -" if target is None else f"{target[0]} {target[1]:.1f}x | {verdict}"
        extra = f" {ratio_cell(result['ratios_to_all_global'][key])} |" if ALL_GLOBAL in runs else ""
        values = " | ".join(cell(runs[name][key]) for name in names)
        lines.append(f"| {label} | {values} | {ratio_cell(value)} | {against} |{extra}")
    versions = result["versions"]
    lines += [
        "", "Requests decoding at once: of each forward's scheduled requests, those with a token already; "
        "time-weighted over the run. Tokens/s: all generated tokens over the time from submission to the last "
        "token. Time to first token: each request's first token's timestamp less its creation time. Preempted: "
        "requests whose cache was freed for others and whose prefill began again."
        + (f" {ALL_GLOBAL}: the model hybridized with every head global, served by hf_attn's paged cache and "
           "attention: what they give without local heads." if ALL_GLOBAL in runs else ""), "",
        f"`{result['command']}`: {result['wall_seconds'] / 60:.1f} min, {result['machine']['torch']}, transformers "
        f"{versions['transformers']}, {', '.join(runs)} in that order{code_note(result.get('code'))}."
        + (f" Measured by an earlier invocation with the same arguments: {', '.join(result['resumed'])}."
           if result.get("resumed") else ""), "",
    ]  # fmt: skip
    lines += machine_lines(result, names)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    measured_or_stored(parse_args(argv), argv, run, report)


if __name__ == "__main__":
    main()
