"""The two routes of positional heads, and the one `positional_attention_impl="auto"` takes, by training step.

Positional heads compute the same attention by two routes (hf_attn/attention_hf_attn.py): shared weights, the
(heads, T, S) weights formed once for the batch and kept for the backward, or fused, SDPA on P's queries and keys for
every sample, never forming T x S. Which is faster depends on the batch and T, so each case is one model trained
under each route: forward + backward + AdamW, the routes interleaved step by step, the median over `--repeats`
steps, as a ratio to shared weights measured in the same run (below 1: faster).

- Paper A: the algorithmic positional model as `configs/algorithmic/cpu.yaml` trains it (n = 8 numbers, 4 layers,
  width 64, 2 heads, one-hot P, bidirectional), at the CPU config's batch of 250 and the paper's 1000;
- language model: `benchmarks.throughput`'s positional model (4 layers, width 256, 8 heads, sinusoidal P, causal,
  byte-level vocabulary) on 4,096 tokens per step, batch = 4096 / T.

    python -m benchmarks.positional_routes
    python -m benchmarks.positional_routes --lengths 256 1024 --repeats 5
    python -m benchmarks.positional_routes --device cuda --dtype bf16 --sdpa-backend flash
"""

import argparse

import torch
from transformers import AutoModelForTokenClassification, PreTrainedModel

from benchmarks.common import (
    AUTOCAST_DTYPES,
    SDPA_BACKENDS,
    Shape,
    Trainee,
    build_model,
    command_line_parser,
    describe_machine,
    median_step_seconds,
    print_header,
    print_row,
)
from hf_attn.attention_hf_attn import shared_weights_pay_off
from hf_attn.layers_hf_attn import HfAttnAttention
from training.algorithmic import ModelArguments, model_config

ROUTES = ("shared_weights", "fused", "auto")
PAPER_A_LENGTH = 8


def paper_a_model(route: str) -> PreTrainedModel:
    config = model_config("positional", ModelArguments(), PAPER_A_LENGTH, PAPER_A_LENGTH)
    config.positional_attention_impl = route
    return AutoModelForTokenClassification.from_config(config)


def language_model(route: str, length: int) -> PreTrainedModel:
    return build_model("positional", Shape(vocab_size=256, n_positions=length), positional_attention_impl=route)


def paper_a_batch(batch: int, generator: torch.Generator) -> dict:
    values = torch.rand(batch, PAPER_A_LENGTH, generator=generator)
    return dict(numeric_values=values, labels=values.cumsum(-1))


def language_batch(batch: int, length: int, generator: torch.Generator) -> dict:
    input_ids = torch.randint(256, (batch, length), generator=generator)
    return dict(input_ids=input_ids, labels=input_ids)


def auto_route(model: PreTrainedModel, batch: int, length: int) -> str:
    """The route `auto` takes for the model's first positional layer at this shape."""
    attention = next(m for m in model.modules() if isinstance(m, HfAttnAttention))
    heads = attention.num_positional_heads
    shapes = (torch.empty(1, heads, length, 0), torch.empty(1, heads, length, 0), torch.empty(batch, heads, length, 0))
    return "shared_weights" if shared_weights_pay_off(*shapes) else "fused"


def print_case(case: str, batch: int, length: int, seconds: dict[str, float], chosen: str) -> None:
    shared = seconds["shared_weights"]
    best = min(("shared_weights", "fused"), key=seconds.__getitem__)
    print_row(
        case, batch, length, *(f"{seconds[route] * 1e3:.0f}" for route in ROUTES), f"{seconds['fused'] / shared:.2f}x",
        chosen, "yes" if chosen == best else f"no ({best} faster)",
    )  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = command_line_parser("benchmarks.positional_routes", __doc__)
    parser.add_argument("--paper-a-batches", type=int, nargs="*", default=[250, 1000])
    parser.add_argument("--lengths", type=int, nargs="*", default=[256, 512, 1024, 4096],
                        help="T of the language-model cases (batch = --tokens-per-step / T)")  # fmt: skip
    parser.add_argument("--tokens-per-step", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per route (median)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=list(AUTOCAST_DTYPES), help="bf16: autocast, fp32 weights")
    parser.add_argument("--sdpa-backend", default="default", choices=list(SDPA_BACKENDS),
                        help="hold the fused route's SDPA to one backend (GPU: flash, efficient, cudnn)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for length in args.lengths:
        if not 2 <= length <= args.tokens_per_step:
            parser.error(f"--lengths: each T must be in [2, --tokens-per-step={args.tokens_per_step}], got {length}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    generator = torch.Generator().manual_seed(args.seed)
    print(f"> {describe_machine(args.device)}")
    backend = "" if args.sdpa_backend == "default" else f", SDPA held to {args.sdpa_backend}"
    print(f"> training step (forward + backward + AdamW), {args.dtype}{backend}, median of {args.repeats}, "
          "routes interleaved")  # fmt: skip
    print_header(
        "case", "batch", "T", "shared weights ms", "fused ms", "auto ms", "fused / shared", "auto takes",
        "auto takes the faster",
    )  # fmt: skip
    for batch in args.paper_a_batches:
        torch.manual_seed(args.seed)
        data = paper_a_batch(batch, generator)
        trainees = {route: Trainee(paper_a_model(route), data, args) for route in ROUTES}
        chosen = auto_route(trainees["auto"].model, batch, PAPER_A_LENGTH)
        print_case("Paper A", batch, PAPER_A_LENGTH, median_step_seconds(trainees, args.repeats, args.device), chosen)
    for length in args.lengths:
        batch = args.tokens_per_step // length
        torch.manual_seed(args.seed)
        data = language_batch(batch, length, generator)
        trainees = {route: Trainee(language_model(route, length), data, args) for route in ROUTES}
        chosen = auto_route(trainees["auto"].model, batch, length)
        print_case("language model", batch, length, median_step_seconds(trainees, args.repeats, args.device), chosen)


if __name__ == "__main__":
    main()
