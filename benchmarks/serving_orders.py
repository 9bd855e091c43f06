"""How many requests decode at once under continuous batching, over several orders of `benchmarks.serving`'s workload
and several cache budgets, in minutes instead of hours.

    python -m benchmarks.serving_orders --seeds 0 1 2 3 4 --held 4 8 --max-prompt 8064   # SmolLM2-135M's shape
    python -m benchmarks.serving_orders --report         # results.md from results.json alone

`benchmarks.serving` measures one order of its workload (its --seed) under one budget, in hours on a CPU. Its most
requests decoding at once is a count of a few requests (7 and 12 in the recorded run), which one request more or less
moves by a tenth or more of the ratio. This serves the same workload in other orders (`--seeds`) and under other
budgets (`--held`: room for that many of the longest requests, prompt and new tokens, in the unmodified model's
cache; benchmarks.serving's default holds 4) to show how far the count moves.

Continuous batching's scheduler reads the requests' lengths and the pages free, never what attention computed, as long
as no request can end early (benchmarks.serving gives them no end-of-sequence token). So the counts are measured on a
model of the served model's family with its layers and key/value heads, one query head per key/value head, heads 8
wide and hidden states 16, attention returning zeros: the same pages and forwards, with the same requests in each, at
a fraction of the cost. Checked against benchmarks.serving's own run (docs/results/serving: seed 0, --max-prompt
8192, 520 blocks): the same most requests decoding (7 and 12) and holding cache at once (8 and 13), the same forwards
(1,584 and 913). Time is not measured: a time-weighted mean or a rate from this model would mean nothing.

Every other flag is benchmarks.serving's (the model, the layout and its score, the workload's sizes, the page size, the
batch's tokens); --num-blocks is set for each budget. Each (budget, order) record is kept in OUTPUT_DIR/runs/ as soon
as it is measured, so the same command again goes on from there.
"""

import contextlib
import copy
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from transformers import AutoModelForCausalLM

from benchmarks import serving
from benchmarks.common import command_line_parser, machine_load, measured_or_stored
from hf_attn import hybridize
from hf_attn.hybrid import num_key_value_heads
from hf_attn.pretrained import load_causal_lm, load_tokenizer

COUNTS = ("max_decoding", "max_active", "forwards", "preempted")  # the scheduler's, whatever attention computes
MODELS = ("unmodified", "hybridized")
TARGET = 1.8  # benchmarks.serving's target for the most requests decoding at once, hybridized / unmodified
OUTPUT_DIR = "docs/results/serving_orders"


def parse_args(argv: list[str] | None = None):
    parser = command_line_parser("benchmarks.serving_orders", __doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4],
                        help="the workload's orders (benchmarks.serving --seed: the prompts' order and where each is "
                        "cut from the text)")  # fmt: skip
    parser.add_argument("--held", type=int, nargs="+", default=[serving.LONGEST_HELD], help="the budgets: room for "
                        "this many of the longest requests in the unmodified model's cache")  # fmt: skip
    parser.add_argument("--output-dir", default=OUTPUT_DIR)
    parser.add_argument("--report", action="store_true", help="measure nothing: results.md from results.json")
    args, args.serving = parser.parse_known_args(argv)
    problems = [f"--{name} must be {least} or more, got {value}" for name, least in (("seeds", 0), ("held", 1))
                for value in getattr(args, name) if value < least]  # fmt: skip
    if "--num-blocks" in args.serving or "--seed" in args.serving:
        problems.append("--num-blocks and --seed are set here for each budget and order: use --held and --seeds")
    if problems:
        parser.error("; ".join(problems))
    if not args.report:
        serving.parse_args(args.serving)  # benchmarks.serving's own checks of the rest, before any model loads
    return args


def served(args, seed: int, held: int):
    """benchmarks.serving's arguments for one order and one budget."""
    sizes = serving.parse_args(args.serving)
    blocks = -(-held * (sizes.max_prompt + sizes.new_tokens) // sizes.page_size)
    return serving.parse_args([*args.serving, "--seed", str(seed), "--num-blocks", str(blocks)])


def cache_shaped(config) -> transformers.PreTrainedModel:
    """A random model of `config`'s family with its layers and key/value heads, one query head per key/value head,
    heads 8 wide and hidden states 16: the same pages (both caches count them in blocks, whatever a block's bytes),
    little arithmetic. (The layouts here make whole groups one kind, so one query head stands for a group's.)"""
    shaped = copy.deepcopy(config)
    shaped.num_attention_heads, shaped.head_dim = num_key_value_heads(config), 8
    shaped.hidden_size = shaped.intermediate_size = 16
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(shaped, dtype=torch.float32).eval()


@contextlib.contextmanager
def attention_skipped():
    """`F.scaled_dot_product_attention`, which transformers' SDPA and paged paths and hf_attn's attention all call,
    returns zeros of its output's shape."""
    original = F.scaled_dot_product_attention

    def zeros(query, key, value, *args, **kwargs):
        return query.new_zeros(*query.shape[:-1], value.shape[-1])

    F.scaled_dot_product_attention = zeros
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def measure(args, seed: int, held: int, config, tokenizer) -> dict:
    """Both models' counts for one order and one budget, with the time they took and the machine's load around."""
    start, before = time.perf_counter(), machine_load()
    arguments = served(args, seed, held)
    requests = serving.prompts(tokenizer, arguments)
    model = cache_shaped(config)
    _, layout = serving.head_layout(arguments, model.config)
    counts = {}
    with attention_skipped(), torch.inference_mode():
        for name in MODELS:
            if name == "hybridized":
                hybridize(model, head_layout=layout, local_window=arguments.local_window,
                          sink_tokens=arguments.sink_tokens)  # fmt: skip
            record = serving.serve(model, requests, arguments)
            counts[name] = {key: record[key] for key in COUNTS}
    return {"seed": seed, "held": held, "num_blocks": arguments.num_blocks,
            "prompt_tokens": [len(request) for request in requests], **counts,
            "seconds": time.perf_counter() - start, "machine": {"before": before, "after": machine_load()}}  # fmt: skip


def run(args, argv: list[str]) -> dict:
    print(f"load at start: {machine_load()['uptime']}", flush=True)
    sizes = serving.parse_args(args.serving)
    if sizes.threads:
        torch.set_num_threads(sizes.threads)
    config, tokenizer = load_causal_lm(sizes.model).config, load_tokenizer(sizes.tokenizer or sizes.model)
    folder, settings = Path(args.output_dir) / "runs", {"serving": args.serving}
    orders, resumed = [], []
    for held in args.held:
        for seed in args.seeds:
            path = folder / f"held{held}-seed{seed}.json"
            stored = json.loads(path.read_text()) if path.is_file() else None
            if stored is None or stored["settings"] != settings:
                stored = {"settings": settings, "order": measure(args, seed, held, config, tokenizer)}
                folder.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(stored) + "\n")
            else:
                resumed.append(f"held {held}, seed {seed}")
            orders.append(stored["order"])
            print(f"held {held}, seed {seed}: " + ", ".join(f"{name} {stored['order'][name]}" for name in MODELS),
                  flush=True)  # fmt: skip
    config_name, _ = serving.head_layout(sizes, config)
    return {
        "command": shlex.join(["python", "-m", "benchmarks.serving_orders", *argv]), "model": sizes.model,
        "family": config.model_type, "layers": config.num_hidden_layers, "heads": config.num_attention_heads,
        "key_value_heads": num_key_value_heads(config), "layout": config_name.name,
        "workload": {"requests": sizes.requests, "min_prompt": sizes.min_prompt, "max_prompt": sizes.max_prompt,
                     "new_tokens": sizes.new_tokens, "page_size": sizes.page_size,
                     "max_batch_tokens": sizes.max_batch_tokens},
        "orders": orders, "resumed": resumed,
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "python": sys.version.split()[0]},
        "code": serving.code_version(),
    }  # fmt: skip


def ratio(order: dict) -> float:
    return order["hybridized"]["max_decoding"] / order["unmodified"]["max_decoding"]


def report(result: dict) -> str:
    workload = result["workload"]
    lines = [
        "# Requests decoding at once, over orders and budgets", "",
        f"{result['family']} with the cache shape of {result['model']} ({result['layers']} layers of "
        f"{result['heads']} query heads over {result['key_value_heads']} key/value heads), unmodified and hybridized "
        f"to `{result['layout']}`, attention skipped (the scheduler never reads it). Workload: "
        f"{workload['requests']} requests submitted at once, prompts of {workload['min_prompt']:,}-"
        f"{workload['max_prompt']:,} tokens, {workload['new_tokens']} new tokens each, pages of "
        f"{workload['page_size']} tokens, {workload['max_batch_tokens']:,} tokens a forward; each order a "
        "`--seed` of benchmarks.serving, each budget room for `held` of the longest requests.", "",
        "| held | pages | seed | most decoding: unmodified | hybridized | hybridized / unmodified | most holding "
        "cache: unmodified | hybridized | forwards: unmodified | hybridized | preempted: unmodified | hybridized |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for order in result["orders"]:
        cells = [order["held"], order["num_blocks"], order["seed"]]
        for key in COUNTS:
            cells += [f"{order[name][key]:,}" for name in MODELS]
            if key == "max_decoding":
                cells.append(f"{ratio(order):.2f}x")
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines.append("")
    for held in dict.fromkeys(order["held"] for order in result["orders"]):
        ratios = [ratio(order) for order in result["orders"] if order["held"] == held]
        lines.append(f"- held {held}: hybridized / unmodified {min(ratios):.2f}x to {max(ratios):.2f}x over "
                     f"{len(ratios)} orders (median {statistics.median(ratios):.2f}x); {TARGET}x or more in "
                     f"{sum(value >= TARGET for value in ratios)} of {len(ratios)}.")  # fmt: skip
    orders = result["orders"]
    lines += [
        "", f"`{result['command']}`: {sum(order['seconds'] for order in orders) / 60:.1f} min for the {len(orders)} "
        f"orders, torch {result['versions']['torch']}, transformers {result['versions']['transformers']}"
        f"{serving.code_note(result['code'])}. `uptime` before the first: `{orders[0]['machine']['before']['uptime']}`;"
        f" after the last: `{orders[-1]['machine']['after']['uptime']}`."
        + (f" Measured by an earlier invocation with the same arguments: {'; '.join(result['resumed'])}."
           if result["resumed"] else ""),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    measured_or_stored(parse_args(argv), argv, run, report)


if __name__ == "__main__":
    main()
