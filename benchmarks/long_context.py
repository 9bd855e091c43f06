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
alternating so that the machine's drift falls on both (`benchmarks/long_context_timing.py`): decode ms per token at
`--timing_context` tokens of context, prefill seconds at `--prefill_context`; `--timing_repeats` pairs, each ratio
their median; and the peak memory over that prefill and decoding, exact (one more process per model, in which glibc
maps every allocation above 128 KiB on its own).

Resumable: each measurement is written to OUTPUT_DIR/NAME/{configs,scores,timing}/*.json as soon as it ends; a rerun
with the same settings keeps them (one that does not parse, or was measured with other settings, is measured again),
so `--skip_timing` on a busy machine, then the same command without it on an idle one, times only. Quality may be
measured on a GPU and the timing on an idle CPU, the reports made from both records alone:

    python -m benchmarks.long_context MODEL --device cuda --passkey_batch_size 20 --skip_timing   # on the GPU
    python -m benchmarks.long_context MODEL --device cuda --passkey_batch_size 20 --timing_only   # idle CPU
    python -m benchmarks.long_context MODEL --device cuda --passkey_batch_size 20 --stored_only   # the reports

`--scores_only` computes the scores' records alone (OUTPUT_DIR/NAME/scores/), for benchmarks that rank groups by
them (`benchmarks.ruler --layout-dir`). Writes OUTPUT_DIR/NAME/{results.json, results.md, long_context.png}.
"""

import argparse
import functools
import itertools
import json
import os
import re
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import data_dir_problems, describe_machine
from benchmarks.hybrid_tradeoff import run_name
from benchmarks.long_context_configs import SCORE_NAMES, UNIT, UNMODIFIED, Config, layout_for, score_groups
from benchmarks.long_context_quality import passkey_answers, quality
from benchmarks.long_context_records import (
    QUALITY_SETTINGS,
    SCORE_SETTINGS,
    TIMING_SETTINGS,
    measured,
    settings_of,
    stored,
)
from benchmarks.long_context_reports import TIMING_RATIOS, notes, report, tables, write_reports
from benchmarks.long_context_timing import DTYPES, WARM_UP_STEPS, timing_pairs
from hf_attn import hybridize
from hf_attn.data.passkey import PROMPT_FORMATS, passkey_prompts
from hf_attn.data.wikitext import load_wikitext, tokenize_text
from hf_attn.experiments.arguments import below_minimums
from hf_attn.pretrained import PACKAGED_MODELS, load_causal_lm, load_tokenizer, source_argument
from hf_attn.select_heads import units_per_layer

# Here: the command line and the sweep. Its parts: long_context_configs (what is measured, and the head layout
# each configuration gets), long_context_quality (passkey retrieval and perplexity of one configuration),
# long_context_timing (speed and memory, in fresh processes), long_context_records (resuming) and
# long_context_reports (notes, tables, plot). What other code reads from here, the parts' names among it.
__all__ = ["Config", "argument_problems", "main", "notes", "parse_args", "passkey_answers", "report", "run",
           "tables", "write_reports"]  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("model", type=source_argument, help="a Llama, Qwen2, Qwen3, Mistral, Gemma 3 or GPT-2 model: Hub id, folder, "
        f".gguf file or a short name of hf_attn.pretrained ({', '.join(PACKAGED_MODELS)})")  # fmt: skip
    add("--dtype", choices=list(DTYPES), default="bfloat16", help="every model's, the unmodified one's too "
        "(bfloat16: about 1.6x faster than float32 on a 2-core CPU)")  # fmt: skip
    add("--timing_dtype", choices=list(DTYPES), default="float32", help="the timed models' (the unmodified one's too): "
        "a CPU decodes fastest in float32, whose attention at 2K of context is 1.4x bfloat16's speed here")  # fmt: skip
    add("--device", default="cpu", help="where scores, passkeys and perplexity run: cpu, cuda or cuda:N; timing is the "
        "CPU's")  # fmt: skip
    add("--data_dir", default="../shared/data/wikitext-2-raw", help="folder of wiki.{valid,test}.raw; '' for the Hub")
    add("--local_windows", type=int, nargs="+", default=[64, 256], help="k: previous tokens a local head sees")
    add("--sink_tokens", type=int, nargs="+", default=[0, 4], help="first tokens local heads also see")
    add("--fractions", type=float, nargs="+", default=[0.25, 0.5, 0.75], help="shares of key/value groups made local")
    add("--scores", nargs="+", choices=SCORE_NAMES, default=[n for n in SCORE_NAMES if n != "gate_tasks"],
        help="what ranks the groups (default: all but gate_tasks, which needs hf_attn[ruler]'s words)")  # fmt: skip
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
    only.add_argument("--scores_only", action="store_true", help="the scores' records (scores/) alone, for other "
                      "benchmarks to rank groups by (benchmarks.ruler --layout-dir): no passkey, perplexity, timing "
                      "or report")  # fmt: skip
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
    if min(args.local_windows) < 1:
        problems.append(f"--local_windows must be >= 1, got {args.local_windows}")
    if min(args.sink_tokens) < 0:
        problems.append(f"--sink_tokens must be >= 0, got {args.sink_tokens}")
    if min(args.passkey_lengths) < 1:
        problems.append(f"--passkey_lengths must be >= 1, got {args.passkey_lengths}")
    if args.calibration_block_size <= max(args.local_windows) + 1:
        problems.append(f"--calibration_block_size must exceed the widest window + 1 ({max(args.local_windows) + 1})"
                        f", got {args.calibration_block_size}")  # fmt: skip
    counts = ("calibration_blocks", "score_batch_size", "keys_per_depth", "new_tokens", "passkey_batch_size",
              "ppl_blocks", "prefill_context", "timing_repeats", "threads")  # fmt: skip
    problems += below_minimums(args, dict.fromkeys(counts, 1) | {"ppl_block_size": 2}, prefix="--")
    if not WARM_UP_STEPS < args.decode_steps < args.timing_context:
        problems.append(f"--decode_steps must be in ({WARM_UP_STEPS}, --timing_context), got {args.decode_steps}")
    if "random" in args.scores and not args.random_seeds:
        problems.append("--random_seeds must name a seed when --scores has random")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        problems.append(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    elif args.device.startswith("cuda") and not (torch.cuda.is_available() or args.stored_only or args.timing_only):
        problems.append(f"--device {args.device} needs a GPU that torch sees; use cpu")
    return problems + ([] if args.timing_only else data_dir_problems(args.data_dir))  # timing reads no text


def load(model: str, dtype: str, device: str = "cpu") -> tuple:
    """The model in `dtype` on `device`, eval mode, and its tokenizer, from any source `hf_attn.pretrained` takes.
    `dtype` when loading, not `.to(dtype)` after, which would round the rotary frequencies to bfloat16 too."""
    return load_causal_lm(model, dtype=DTYPES[dtype]).to(device).eval(), load_tokenizer(model)


def output_folder(args) -> Path:
    """OUTPUT_DIR/NAME: the GGUF file's name, else the Hub id's or folder's."""
    return Path(args.output_dir) / run_name(args.model)


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
            scores[f"{score}-k{window}-s{sinks}"] = record = ranked(args, model, tokenizer, calibration, window,
                                                                    sinks, score)  # fmt: skip
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


def ranked(args, model, tokenizer, calibration: torch.Tensor, window: int, sinks: int, score: str) -> dict:
    """The record of `score` for (k, S): stored in OUTPUT_DIR/NAME/scores/, else computed and stored there."""
    compute = functools.partial(score_groups, score, model, calibration, window, sinks, args, tokenizer)
    path = output_folder(args) / "scores" / f"{score}-k{window}-s{sinks}.json"
    return measured(path, settings_of(args, SCORE_SETTINGS), compute, stored_only=args.stored_only)


def time_shapes(model, args, folder: Path) -> dict[str, dict]:
    """Each layout shape (k, S, share) timed beside the unmodified model (`timing_pairs`), with a random layout
    (seed 0). `model` must not be hybridized yet: it is saved, once, for the processes to load, when something is
    left to time."""
    settings = settings_of(args, TIMING_SETTINGS) | {"peak_memory": "exact"}  # earlier records: the default allocator's
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


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    if args.timing_only:
        timing = time_shapes(load(args.model, args.dtype)[0], args, output_folder(args))
        print(json.dumps({shape: {name: pair[name] for name in TIMING_RATIOS} for shape, pair in timing.items()}))
        return
    if args.scores_only:
        model, tokenizer = load(args.model, args.dtype, args.device)
        calibration = wikitext_blocks(args, tokenizer)[0]
        for window, sinks, score in configurations(args):
            if score != "random":
                seconds = ranked(args, model, tokenizer, calibration, window, sinks, score)["score_seconds"]
                print(f"{score}-k{window}-s{sinks}: {seconds / 60:.1f} min", flush=True)
        return
    result = run(args)
    folder = output_folder(args)
    (folder / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(write_reports(result, folder))


if __name__ == "__main__":
    main()
