"""Long context after making key/value groups local: passkey retrieval at 1K-4K tokens and WikiText-2 test perplexity
at 2K of a pretrained decoder hybridized by `hf_attn.hybridize`, against the share of groups made local, chosen by
each `select_heads` score and at random, with and without attention sinks; beside each, the KV bytes per token, peak
memory, decode speed at 8K tokens of context and prefill time at 4K, as ratios to the unmodified model.

    python -m benchmarks.long_context smollm2-135m-instruct              # offline: the registry package's GGUF file
    python -m benchmarks.long_context HuggingFaceTB/SmolLM2-135M-Instruct   # online; or a folder, or a .gguf file

Configurations: the unmodified model; then per window k (`--local_windows`), sink count S (`--sink_tokens`), share
of key/value groups made local (`--fractions`) and score (`--scores`), the layout the score gives (`choose_layout`;
`random`: as many groups drawn at random, per seed), hybridized. Each score is computed once per (score, k, S) on
WikiText-2 validation blocks, never test, and timed. Each configuration gets:
- passkey retrieval (`hf_attn.data.passkey`): `--keys_per_depth` keys per length and depth, greedy `generate` with
  the model's default cache (an `HfAttnCache` once hybridized); accuracy per length and per depth;
- WikiText-2 test perplexity over the first `--ppl_blocks` non-overlapping blocks of `--ppl_block_size` tokens,
  exp(mean token NLL);
- KV bytes per token, as a ratio to the unmodified model (sinks add a constant, not bytes per token).
Speed and memory depend on the layout's shape, not on which groups: per (k, S, share) one layout (random, seed 0) is
timed beside the unmodified model, each in a fresh process of the model saved once to a scratch folder, the order
alternating so that the machine's drift falls on both (`benchmarks/long_context_timing.py`): decode ms per token and
peak memory at `--timing_context` tokens of context, prefill seconds at `--prefill_context`; `--timing_repeats`
pairs, each ratio their median.

Resumable: each measurement is written to OUTPUT_DIR/NAME/{configs,scores,timing}/*.json as soon as it ends; a rerun
with the same settings keeps them (one that does not parse, or was measured with other settings, is measured again),
so `--skip_timing` on a busy machine, then the same command without it on an idle one, times only. Quality may be
measured on a GPU and the timing on an idle CPU, the reports made from both records alone:

    python -m benchmarks.long_context MODEL --device cuda --passkey_batch_size 20 --skip_timing   # on the GPU
    python -m benchmarks.long_context MODEL --device cuda --passkey_batch_size 20 --timing_only   # idle CPU
    python -m benchmarks.long_context MODEL --device cuda --passkey_batch_size 20 --stored_only   # the reports

Writes OUTPUT_DIR/NAME/{results.json, results.md, long_context.png}.
"""

import argparse
import copy
import functools
import itertools
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig

from benchmarks.common import describe_machine
from benchmarks.hybrid_tradeoff import random_layout, run_name
from benchmarks.long_context_timing import DTYPES, WARM_UP_STEPS, timing_pairs
from hf_attn import hybridize
from hf_attn.data.passkey import PROMPT_FORMATS, PasskeyPrompt, passkey_found, passkey_prompts
from hf_attn.data.wikitext import load_wikitext, tokenize_text
from hf_attn.experiments.reports import pyplot, save
from hf_attn.hybrid import cache_bytes_per_token, original_cache_bytes_per_token
from hf_attn.pretrained import PACKAGED_MODELS, load_causal_lm, load_tokenizer
from hf_attn.select_heads import SCORES, choose_layout, units_per_layer

SCORE_NAMES = ("random", *SCORES)  # `random` needs no score
UNIT = "kv_group"  # only a group no global head reads shrinks the cache
TIMING_RATIOS = ("peak_memory_ratio", "decode_speed_ratio", "prefill_time_ratio")  # the table's order
# The settings each kind of measurement depends on: a stored one measured with others is measured again.
SCORE_SETTINGS = ("model", "dtype", "device", "data_dir", "calibration_blocks", "calibration_block_size",
                  "score_batch_size")  # fmt: skip
QUALITY_SETTINGS = (*SCORE_SETTINGS, "prompt_format", "passkey_lengths", "passkey_depths", "keys_per_depth",
                    "key_seed", "new_tokens", "passkey_batch_size", "ppl_blocks", "ppl_block_size")  # fmt: skip
TIMING_SETTINGS = ("model", "timing_dtype", "prefill_context", "timing_context", "decode_steps", "timing_repeats")


@dataclass(frozen=True)
class Config:
    """One measured model: the unmodified one (`local_window` None), or a hybridized one."""

    local_window: int | None = None
    sink_tokens: int = 0
    fraction: float = 0.0
    score: str = "unmodified"
    seed: int | None = None  # random layouts only

    @property
    def shape(self) -> str:
        """What speed and memory depend on: window, sinks and share."""
        return f"k{self.local_window}-s{self.sink_tokens}-f{self.fraction:g}"

    @property
    def name(self) -> str:
        if self.local_window is None:
            return "unmodified"
        return f"{self.shape}-{self.score}" + ("" if self.seed is None else f"-seed{self.seed}")


UNMODIFIED = Config()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("model", help="a Llama, Qwen2, Qwen3, Mistral, Gemma 3 or GPT-2 model: Hub id, folder, .gguf file or a short "
        f"name of hf_attn.pretrained ({', '.join(PACKAGED_MODELS)})")  # fmt: skip
    add("--dtype", choices=list(DTYPES), default="bfloat16", help="every model's, the unmodified one's too "
        "(bfloat16: about 1.6x faster than float32 on a 2-core CPU)")  # fmt: skip
    add("--timing_dtype", choices=list(DTYPES), default="float32", help="the timed models' (the unmodified one's too): "
        "a CPU decodes fastest in float32, whose attention at 2K of context is 1.4x bfloat16's speed here")  # fmt: skip
    add("--device", default="cpu", help="where scores, passkeys and perplexity run (cuda: a GPU); timing is the CPU's")
    add("--data_dir", default="../shared/data/wikitext-2-raw", help="folder of wiki.{valid,test}.raw; '' for the Hub")
    add("--local_windows", type=int, nargs="+", default=[64, 256], help="k: previous tokens a local head sees")
    add("--sink_tokens", type=int, nargs="+", default=[0, 4], help="first tokens local heads also see")
    add("--fractions", type=float, nargs="+", default=[0.25, 0.5, 0.75], help="shares of key/value groups made local")
    add("--scores", nargs="+", choices=SCORE_NAMES, default=list(SCORE_NAMES), help="what ranks the groups")
    add("--random_seeds", type=int, nargs="+", default=[0, 1, 2], help="the random layouts' seeds")
    add("--calibration_blocks", type=int, default=4, help="WikiText-2 validation blocks the scores read")
    add("--calibration_block_size", type=int, default=1024)
    add("--score_batch_size", type=int, default=1)
    add("--prompt_format", choices=PROMPT_FORMATS, default="plain", help="see hf_attn.data.passkey")
    add("--passkey_lengths", type=int, nargs="+", default=[1024, 2048, 4096], help="prompt tokens")
    add("--passkey_depths", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9],
        help="share of the filler before the needle")  # fmt: skip
    add("--keys_per_depth", type=int, default=4, help="prompts per length and depth")
    add("--key_seed", type=int, default=0)
    add("--new_tokens", type=int, default=10, help="greedy tokens generated per prompt (a key and its space: 6)")
    add("--passkey_batch_size", type=int, default=1, help="prompts of one length generated together; 1: one at a "
        "time, prompts of one depth sharing the prefill of their common filler (a CPU's fastest)")  # fmt: skip
    add("--ppl_blocks", type=int, default=8, help="WikiText-2 test blocks scored (the first ones)")
    add("--ppl_block_size", type=int, default=2048)
    add("--prefill_context", type=int, default=4096, help="tokens of the timed prefill")
    add("--timing_context", type=int, default=8192, help="tokens of context at the end of the timed decode")
    add("--decode_steps", type=int, default=32, help="timed greedy steps (the first two are warm-up)")
    add("--timing_repeats", type=int, default=3, help="pairs of fresh processes per shape; the ratios are medians")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--skip_timing", action="store_true", help="scores, passkey and perplexity only: timing wants "
                      "an idle machine, so it may run later, apart, into the same --output_dir")  # fmt: skip
    only.add_argument("--timing_only", action="store_true", help="time every shape on the CPU, nothing else, no "
                      "report")  # fmt: skip
    only.add_argument("--stored_only", action="store_true", help="measure nothing: results.json and the reports "
                      "from the records in --output_dir, made elsewhere (quality on a GPU, say, timing on an idle "
                      "CPU)")  # fmt: skip
    add("--threads", type=int, help="torch threads, the timing processes' too (default: torch's; on a busy machine 1 "
        "can be several times faster than 2)")  # fmt: skip
    add("--output_dir", default="outputs/long_context")
    args = parser.parse_args(argv)
    if problems := argument_problems(args):
        parser.error("; ".join(problems))
    args.data_dir = args.data_dir or None
    return args


def argument_problems(args) -> list[str]:
    """Every invalid argument at once, each naming what is allowed."""
    problems = []
    if any(not 0 <= f <= 1 for f in args.fractions):
        problems.append(f"--fractions must be in [0, 1], got {args.fractions}")
    if any(not 0 <= d <= 1 for d in args.passkey_depths):
        problems.append(f"--passkey_depths must be in [0, 1], got {args.passkey_depths}")
    if min(args.local_windows) < 1 or min(args.sink_tokens) < 0:
        problems.append(f"need --local_windows >= 1 and --sink_tokens >= 0, got {args.local_windows}, "
                        f"{args.sink_tokens}")  # fmt: skip
    if args.calibration_block_size <= max(args.local_windows) + 1:
        problems.append(f"--calibration_block_size must exceed the widest window + 1 ({max(args.local_windows) + 1})"
                        f", got {args.calibration_block_size}")  # fmt: skip
    counts = dict(calibration_blocks=args.calibration_blocks, score_batch_size=args.score_batch_size,
                  keys_per_depth=args.keys_per_depth, new_tokens=args.new_tokens,
                  passkey_batch_size=args.passkey_batch_size, ppl_blocks=args.ppl_blocks,
                  prefill_context=args.prefill_context, timing_repeats=args.timing_repeats,
                  threads=1 if args.threads is None else args.threads)  # fmt: skip
    problems += [f"--{name} must be >= 1, got {value}" for name, value in counts.items() if value < 1]
    if args.ppl_block_size < 2:
        problems.append(f"--ppl_block_size must be >= 2, got {args.ppl_block_size}")
    if not WARM_UP_STEPS < args.decode_steps < args.timing_context:
        problems.append(f"--decode_steps must be in ({WARM_UP_STEPS}, --timing_context), got {args.decode_steps}")
    if "random" in args.scores and not args.random_seeds:
        problems.append("--random_seeds must name a seed when --scores has random")
    if args.device.startswith("cuda") and not (torch.cuda.is_available() or args.stored_only or args.timing_only):
        problems.append(f"--device {args.device} needs a GPU that torch sees; use cpu")
    return problems


def load(model: str, dtype: str, device: str = "cpu") -> tuple:
    """The model in `dtype` on `device`, eval mode, and its tokenizer, from any source `hf_attn.pretrained` takes.
    `dtype` when loading, not `.to(dtype)` after, which would round the rotary frequencies to bfloat16 too."""
    return load_causal_lm(model, dtype=DTYPES[dtype]).to(device).eval(), load_tokenizer(model)


def output_folder(args) -> Path:
    """OUTPUT_DIR/NAME: the GGUF file's name, else the Hub id's or folder's."""
    return Path(args.output_dir) / run_name(args.model)


# --- stored measurements ---------------------------------------------------------------------------------------


def stored(path: Path, settings: dict) -> dict | None:
    """The record at `path` if it parses and was measured with `settings`; None if missing, partial, corrupt or
    stale."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("settings") == settings else None


def measured(path: Path, settings: dict, measure: Callable[[], dict], stored_only: bool = False) -> dict:
    """The record stored at `path` (`stored`), else `measure()`'s with its seconds and the load average, stored first
    (atomically: an interrupted write leaves no file); `stored_only`: a missing record is an error."""
    if (record := stored(path, settings)) is not None:
        return record
    if stored_only:
        raise SystemExit(f"--stored_only: {path} is missing or was measured with other settings than {settings}")
    start = time.perf_counter()
    record = measure() | {"settings": settings, "seconds": time.perf_counter() - start, "load_average": os.getloadavg()}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(partial, path)
    return record


def settings_of(args, names: tuple[str, ...]) -> dict:
    return {name: getattr(args, name) for name in names}


# --- layouts ---------------------------------------------------------------------------------------------------


def score_groups(name: str, model, calibration: torch.Tensor, window: int, sinks: int, args, tokenizer) -> dict:
    """`select_heads.SCORES[name]` for (k, S), and how long it took."""
    hybridize(model, local_window=window, sink_tokens=sinks)  # every head global; returns attention weights (`mass`)
    start = time.perf_counter()
    scores = SCORES[name](model, calibration, local_window=window, sink_tokens=sinks, batch_size=args.score_batch_size,
                          unit=UNIT, tokenizer=tokenizer)  # fmt: skip
    return {"scores": scores.tolist(), "score_seconds": time.perf_counter() - start}


def layout_for(config: Config, scores: list | None, model_config) -> list[list[str]]:
    """The head layout making `config.fraction` of the key/value groups local, by the score's order or at random."""
    heads = model_config.num_attention_heads
    if scores is not None:
        return choose_layout(torch.tensor(scores), config.fraction, heads)
    shape = (model_config.num_hidden_layers, units_per_layer(model_config, UNIT))
    return random_layout(torch.zeros(shape), config.fraction, heads, config.seed)


# --- quality: passkey retrieval and perplexity -----------------------------------------------------------------


def passkey_answers(model, tokenizer, prompts: list[PasskeyPrompt], new_tokens: int, batch_size: int = 1) -> list[dict]:
    """Each prompt's greedy continuation (`generate`, the model's default cache) and whether it names the key.

    One prompt at a time (`batch_size` 1), prompts of one length and depth share the filler before their needle: it
    is prefilled once, and each prompt's `generate` continues from a copy of that cache, computing what prefilling the
    whole prompt would (a third less work at the default depths). Otherwise prompts of one length (each exactly that
    many tokens, so no padding) are generated `batch_size` at a time. A prompt's seconds include its share of any
    shared work."""
    generation = GenerationConfig(do_sample=False, max_new_tokens=new_tokens,
                                  eos_token_id=model.generation_config.eos_token_id,
                                  pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)  # fmt: skip

    def answer(prompt: PasskeyPrompt, continuation: torch.Tensor, seconds: float) -> dict:
        text = tokenizer.decode(continuation, skip_special_tokens=True)
        return {"length": prompt.length, "depth": prompt.depth, "key": prompt.key, "answer": text,
                "found": passkey_found(text, prompt.key), "seconds": seconds}  # fmt: skip

    answers = []
    if batch_size > 1:
        for _, group in itertools.groupby(prompts, key=lambda prompt: prompt.length):
            group = list(group)
            for batch in (group[i : i + batch_size] for i in range(0, len(group), batch_size)):
                start = time.perf_counter()
                input_ids = torch.tensor([prompt.input_ids for prompt in batch], device=model.device)
                with torch.no_grad():
                    output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                            generation_config=generation)  # fmt: skip
                seconds = (time.perf_counter() - start) / len(batch)
                answers += [
                    answer(prompt, row[prompt.length :], seconds) for prompt, row in zip(batch, output, strict=True)
                ]
        return answers
    for _, group in itertools.groupby(prompts, key=lambda prompt: (prompt.length, prompt.depth)):
        group = list(group)
        start = time.perf_counter()
        shared = min(shared_prefix_length([prompt.input_ids for prompt in group]), group[0].length - 1)
        prefix = None
        if shared:
            with torch.no_grad():
                prefix = model(torch.tensor([group[0].input_ids[:shared]], device=model.device)).past_key_values
        prefill_seconds = (time.perf_counter() - start) / len(group)
        for prompt in group:
            start = time.perf_counter()
            input_ids = torch.tensor([prompt.input_ids], device=model.device)
            with torch.no_grad():
                cache = copy.deepcopy(prefix)
                output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), past_key_values=cache,
                                        generation_config=generation)  # fmt: skip
            answers.append(answer(prompt, output[0, prompt.length :], prefill_seconds + time.perf_counter() - start))
    return answers


def shared_prefix_length(sequences: list[list[int]]) -> int:
    """How many first tokens every sequence has in common."""
    shortest = min(map(len, sequences))
    return next((i for i in range(shortest) if len({tokens[i] for tokens in sequences}) > 1), shortest)


def accuracy(answers: list[dict], field: str) -> dict[str, float]:
    """Share of keys found per value of `field` ("length" or "depth"), keys as strings (JSON's)."""
    groups = itertools.groupby(sorted(answers, key=lambda a: a[field]), key=lambda a: a[field])
    return {f"{value:g}": statistics.fmean(a["found"] for a in group) for value, group in groups}


def block_perplexity(model, blocks: torch.Tensor) -> float:
    """exp(mean token NLL) over non-overlapping blocks (N, T), each read alone from its first token: the protocol
    the issue asks for, where `hf_attn.experiments.perplexity` slides overlapping windows."""
    total, tokens = 0.0, 0
    with torch.no_grad():
        for block in blocks:
            ids = block[None].to(model.device)
            total += model(ids, labels=ids).loss.item() * (ids.shape[-1] - 1)
            tokens += ids.shape[-1] - 1
    return math.exp(total / tokens)


def quality(model, tokenizer, prompts: list[PasskeyPrompt], test_blocks: torch.Tensor, config: Config, args) -> dict:
    answers = passkey_answers(model, tokenizer, prompts, args.new_tokens, args.passkey_batch_size)
    hybrid = config.local_window is not None
    kv_ratio = cache_bytes_per_token(model.config) / original_cache_bytes_per_token(model.config) if hybrid else 1.0
    local_heads = sum(layer.count("local") for layer in model.config.head_layout) if hybrid else 0
    return {
        "config": asdict(config), "local_heads": local_heads, "kv_ratio": kv_ratio,
        "passkey": accuracy(answers, "length"), "passkey_by_depth": accuracy(answers, "depth"),
        "passkey_seconds_per_prompt": {f"{length}": statistics.fmean(a["seconds"] for a in answers
                                                                     if a["length"] == length)
                                       for length in args.passkey_lengths},
        "perplexity": block_perplexity(model, test_blocks), "answers": answers,
        "device": describe_machine(str(model.device)),
    }  # fmt: skip


# --- the run ---------------------------------------------------------------------------------------------------


def wikitext_blocks(args, tokenizer) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Calibration blocks for the scores (WikiText-2 validation offline, train from the Hub; never test), perplexity
    blocks from the test split, and where the calibration text came from."""
    splits = load_wikitext(args.data_dir)
    blocks = []
    for text, count, size, split in (
        (splits.train_text, args.calibration_blocks, args.calibration_block_size, "calibration"),
        (splits.eval_text, args.ppl_blocks, args.ppl_block_size, "test"),
    ):
        ids = torch.as_tensor(tokenize_text(text, tokenizer)[: count * size])  # fmt: skip
        if len(ids) < count * size:
            raise ValueError(f"the {split} text has {len(ids)} tokens, fewer than {count} blocks of {size}")
        blocks.append(ids.view(count, size))
    return blocks[0], blocks[1], splits.train_source


def configurations(args) -> list[tuple[int, int, str]]:
    """(k, S, score) in the order they run: the order the arguments give."""
    return list(itertools.product(args.local_windows, args.sink_tokens, args.scores))


def run(args) -> dict:
    start = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = output_folder(args)
    model, tokenizer = load(args.model, args.dtype, "cpu" if args.stored_only else args.device)
    measured_here = functools.partial(measured, stored_only=args.stored_only)
    family, layers = model.config.model_type, model.config.num_hidden_layers
    parameters, heads = model.num_parameters(), model.config.num_attention_heads
    prompts = passkey_prompts(tokenizer, args.passkey_lengths, args.passkey_depths, args.keys_per_depth,
                              args.key_seed, args.prompt_format)  # fmt: skip
    calibration, test_blocks, calibration_text = wikitext_blocks(args, tokenizer)
    timing = {} if args.skip_timing else time_shapes(model, args, folder)  # first: the model is not hybridized yet
    quality_settings = settings_of(args, QUALITY_SETTINGS)
    measure = functools.partial(quality, model, tokenizer, prompts, test_blocks)
    unmodified = functools.partial(measure, UNMODIFIED, args)
    rows = [measured_here(folder / "configs" / "unmodified.json", quality_settings, unmodified)]
    scores = {}
    for window, sinks, score in configurations(args):
        ranking = None
        if score != "random":
            compute = functools.partial(score_groups, score, model, calibration, window, sinks, args, tokenizer)
            scores[f"{score}-k{window}-s{sinks}"] = record = measured_here(
                folder / "scores" / f"{score}-k{window}-s{sinks}.json", settings_of(args, SCORE_SETTINGS), compute
            )
            ranking = record["scores"]
        for fraction in args.fractions:
            for seed in args.random_seeds if score == "random" else [None]:
                config = Config(window, sinks, fraction, score, seed)
                layout = layout_for(config, ranking, model.config)

                def measure_converted(config=config, layout=layout) -> dict:
                    hybridize(model, head_layout=layout, local_window=config.local_window,
                              sink_tokens=config.sink_tokens)  # fmt: skip
                    return measure(config, args)

                rows.append(
                    measured_here(folder / "configs" / f"{config.name}.json", quality_settings, measure_converted)
                )
    return {
        "model": args.model, "name": folder.name, "family": family,
        "parameters": parameters, "layers": layers, "heads": heads,
        "key_value_heads": units_per_layer(model.config, UNIT), "dtype": args.dtype,
        "threads": torch.get_num_threads(), "prompt_format": args.prompt_format, "calibration_text": calibration_text,
        "rows": [{key: value for key, value in row.items() if key != "answers"} for row in rows],
        "scores": scores, "timing": timing, "settings": vars(args),
        "wall_seconds": time.perf_counter() - start,
        "machine": {"load_average": os.getloadavg(), "torch": describe_machine("cpu"),
                    "quality": rows[0].get("device", describe_machine("cpu"))},
    }  # fmt: skip


def time_shapes(model, args, folder: Path) -> dict[str, dict]:
    """Each layout shape (k, S, share) timed beside the unmodified model (`timing_pairs`), with a random layout
    (seed 0). `model` must not be hybridized yet: it is saved, once, for the processes to load, when something is
    left to time."""
    settings = settings_of(args, TIMING_SETTINGS)
    timing = {}
    with tempfile.TemporaryDirectory() as scratch:
        shapes = itertools.product(args.local_windows, args.sink_tokens, args.fractions)
        for index, (window, sinks, fraction) in enumerate(shapes):
            config = Config(window, sinks, fraction, "random", 0)
            path = folder / "timing" / f"{config.shape}.json"
            if stored(path, settings) is None and not args.stored_only and not any(Path(scratch).iterdir()):
                model.save_pretrained(scratch)
            spec = {"folder": scratch, "dtype": args.timing_dtype, "threads": torch.get_num_threads(),
                    "layout": layout_for(config, None, model.config), "local_window": window, "sink_tokens": sinks,
                    **settings}  # fmt: skip
            pairs = functools.partial(timing_pairs, spec, args.timing_repeats, index % 2 == 0)
            timing[config.shape] = measured(path, settings, pairs, stored_only=args.stored_only)
    return timing


# --- reports ---------------------------------------------------------------------------------------------------


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
        f"loaded model) and prefill time: ratios to the unmodified model (< 1: less); decode speed: its ms per token "
        f"over ours (> 1: faster); each shape timed beside the unmodified model in {settings['timing_repeats']} "
        f"pairs of fresh processes, the median ratio. Scores computed in: {score_times or 'none'}. Measuring took "
        f"{hours(result['rows'], result['scores'].values())} "
        f"for the scores, passkeys and perplexity and {hours(result['timing'].values())} for the timing, resumed runs "
        f"included{wall_time(result)}."
    )


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
    text = report(result)
    (folder / "results.md").write_text(text)
    plot(result, folder / "long_context.png")
    return text


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    if args.timing_only:
        timing = time_shapes(load(args.model, args.dtype)[0], args, output_folder(args))
        print(json.dumps({shape: {name: pair[name] for name in TIMING_RATIOS} for shape, pair in timing.items()}))
        return
    result = run(args)
    folder = output_folder(args)
    (folder / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(write_reports(result, folder))


if __name__ == "__main__":
    main()
