"""Training throughput and peak memory of hf_attn models against transformers' GPT-2 (SDPA) at the same shape.

One training step = forward + backward + AdamW step on `tokens_per_step` tokens (batch = tokens / T). The models
are timed in one process, interleaved step by step, and every figure is the median over `--repeats` steps divided
by GPT-2's median from the same run (machines are noisy; absolute times mean little). Peak memory is measured
per model: on CPU in a fresh process, the resident-memory high-water mark during its first step, less what the
process held before it; on CUDA `max_memory_allocated` over that step, less what was allocated before it (the
model's weights). "<model> masked" is the model with its local heads on masked SDPA, what transformers'
sliding-window models run; "<model> compiled kernel" runs hf_attn's `local_attention_impl="compiled"`. A last
table runs one 1-local attention layer alone to show its memory grows linearly in T where a T x T score matrix
would not fit.

    python -m benchmarks.throughput                                   # T in {1024, 4096}, every eager model
    python -m benchmarks.throughput --vocab-size 50257                # with GPT-2's output layer
    python -m benchmarks.throughput --lengths 1024 --repeats 3 --models gpt2 local-1
    python -m benchmarks.throughput --device cuda --dtype bf16        # on a GPU, bf16 autocast
    python -m benchmarks.throughput --device cuda --dtype bf16 --sdpa-backend flash --models positional
    python -m benchmarks.throughput --compile --no-memory --models local-1 --lengths 4096   # compiled whole
"""

import argparse
import gc
import json
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.common import (
    AUTOCAST_DTYPES,
    EAGER_MODELS,
    MODELS,
    SDPA_BACKENDS,
    Shape,
    Trainee,
    attempt,
    build_model,
    command_line_parser,
    describe_machine,
    masked_local_attention,
    median_step_seconds,
    peak_rss_bytes,
    print_header,
    print_row,
    rss_bytes,
)
from hf_attn.attention_hf_attn import Visibility, local_attention

MIB = 2**20
ROOT = Path(__file__).resolve().parents[1]  # where `python -m benchmarks.throughput` finds the package


def trainee(name: str, shape: Shape, batch: int, length: int, args) -> Trainee:
    """Model `name` (compiled if asked) on a fixed random batch of token ids, its own labels."""
    model = build_model(name, shape, args.device)
    if args.compile and name != "gpt2":
        model.compile(backend=args.compile_backend)
    generator = torch.Generator().manual_seed(args.seed)
    input_ids = torch.randint(shape.vocab_size, (batch, length), generator=generator)
    return Trainee(model, dict(input_ids=input_ids, labels=input_ids), args)


def measure_speed(names: list[str], shape: Shape, length: int, args) -> dict[str, float]:
    """Median seconds per training step of every model, timed in turns."""
    trainees = {name: trainee(name, shape, args.tokens_per_step // length, length, args) for name in names}
    return median_step_seconds(trainees, args.repeats, args.device)


def peak_bytes_of(work, device: str) -> int:
    """Bytes `work()` needs beyond what was held before it: the allocator's peak on CUDA, resident memory's
    high-water mark on CPU (so on CPU call it in a fresh process, see `measured`)."""
    if device.startswith("cuda"):
        gc.collect()  # what an earlier measurement left in reference cycles, before the baseline is read
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        work()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    before = rss_bytes()
    work()
    return peak_rss_bytes() - before


def model_peak_memory(args, shape: Shape, name: str, length: int) -> int:
    """The first training step of model `name` at length T (it also creates AdamW's state)."""
    return peak_bytes_of(trainee(name, shape, args.tokens_per_step // length, length, args).step, args.device)


def layer_peak_memory(args, shape: Shape, length: int, masked: bool) -> int:
    """Forward + backward of one 1-local strict attention layer: batch 1, 8 heads, head dim 32."""
    q, k, v = (torch.randn(1, 8, length, 32, device=args.device, requires_grad=True) for _ in range(3))
    visibility = Visibility(is_causal=True, attend_to_self=False, local_window=1)
    kernel = masked_local_attention if masked else local_attention
    return peak_bytes_of(lambda: kernel(q, k, v, visibility, None, 32**-0.5).sum().backward(), args.device)


MEASUREMENTS = {"model": model_peak_memory, "layer": layer_peak_memory}


def measured(args, shape: Shape, measurement: str, *values) -> int:
    """Peak bytes of a measurement; on CPU in a new interpreter, so the high-water mark is its own."""
    if args.device.startswith("cuda"):
        return MEASUREMENTS[measurement](args, shape, *values)
    command = [sys.executable, "-m", "benchmarks.throughput", "--child", json.dumps([measurement, *values]), *args.argv]
    output = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    return int(output.strip().splitlines()[-1])


def mebibytes(num_bytes: int | str) -> str:
    return f"{num_bytes / MIB:.0f}" if isinstance(num_bytes, int) else num_bytes


def ratio(value: int | float | str, reference: int | float | str) -> str:
    """`value / reference` as 'N.NNx', '-' where either is missing."""
    if isinstance(value, str) or isinstance(reference, str):
        return "-"
    return f"{value / reference:.2f}x"


def print_speed_and_memory(names: list[str], shape: Shape, args) -> None:
    print_header("model", "T", "batch", "ms / step", "tokens/s", "tokens/s vs gpt2", "peak MiB", "memory vs gpt2")
    for length in args.lengths:
        seconds = measure_speed(names, shape, length, args)
        memory = {name: "not measured" for name in names}
        if args.memory:
            memory = {name: attempt(measured, args, shape, "model", name, length) for name in names}
        for name in names:
            print_row(
                name, length, args.tokens_per_step // length, f"{seconds[name] * 1e3:.0f}",
                f"{args.tokens_per_step / seconds[name]:.0f}", ratio(seconds["gpt2"], seconds[name]),
                mebibytes(memory[name]), ratio(memory[name], memory["gpt2"]),
            )  # fmt: skip


def print_layer_memory(args, shape: Shape) -> None:
    print("\n> one 1-local strict attention layer, batch 1, 8 heads, head dim 32, fp32, forward + backward")
    print_header("T", "banded peak MiB", "masked SDPA peak MiB", "a T x T fp32 score matrix (MiB)")
    for length in args.layer_lengths:
        banded = measured(args, shape, "layer", length, False)
        masked = "not run"
        if length <= args.max_masked_length:
            masked = mebibytes(measured(args, shape, "layer", length, True))
        print_row(length, f"{banded / MIB:.1f}", masked, mebibytes(8 * length * length * 4))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = command_line_parser("benchmarks.throughput", __doc__)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096], help="sequence lengths T")
    parser.add_argument("--models", nargs="+", default=EAGER_MODELS, choices=list(MODELS), metavar="MODEL",
                        help=f"models to compare, from {list(MODELS)}; gpt2 is always included")  # fmt: skip
    parser.add_argument("--tokens-per-step", type=int, default=4096, help="batch x T of one step")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per model (median)")
    parser.add_argument("--n-layer", type=int, default=Shape.n_layer)
    parser.add_argument("--n-embd", type=int, default=Shape.n_embd)
    parser.add_argument("--n-head", type=int, default=Shape.n_head)
    parser.add_argument("--vocab-size", type=int, default=256,
                        help="256 (byte-level): the layers, not the output layer all models share, dominate a step; "
                        f"{Shape.vocab_size} for GPT-2's vocabulary")  # fmt: skip
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=list(AUTOCAST_DTYPES), help="bf16: autocast, fp32 weights")
    parser.add_argument("--sdpa-backend", default="default", choices=list(SDPA_BACKENDS),
                        help="hold every model's SDPA calls to one backend (GPU: flash, efficient, cudnn)")  # fmt: skip
    parser.add_argument("--compile", action="store_true", help="torch.compile the hf_attn models whole")
    parser.add_argument("--compile-backend", default="inductor", help="for --compile; 'eager' traces only")
    parser.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True,
                        help="measure each model's peak memory (--no-memory: speed only)")  # fmt: skip
    parser.add_argument("--layer-lengths", type=int, nargs="*", default=[4096, 8192, 16384],
                        help="T for the attention-layer memory table (empty: skip it)")  # fmt: skip
    parser.add_argument("--max-masked-length", type=int, default=8192, help="longest T to run masked SDPA at")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for length in args.lengths:
        if length < 2 or args.tokens_per_step < length:
            parser.error(f"--lengths: each T must be in [2, --tokens-per-step={args.tokens_per_step}], got {length}")
    args.argv = sys.argv[1:] if argv is None else list(argv)  # for the fresh processes that measure CPU memory
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    shape = Shape(args.n_layer, args.n_embd, args.n_head, args.vocab_size, max(args.lengths))
    if args.child:  # one memory measurement, in its own process
        measurement, *values = json.loads(args.child)
        print(MEASUREMENTS[measurement](args, shape, *values))
        return
    names = ["gpt2"] + [name for name in args.models if name != "gpt2"]
    print(f"> {describe_machine(args.device)}")
    backend = "" if args.sdpa_backend == "default" else f", SDPA held to {args.sdpa_backend}"
    print(f"> {shape}, dropout 0, {args.dtype}{backend}{', compiled' if args.compile else ''}")
    print(f"> training step (forward + backward + AdamW) on {args.tokens_per_step} tokens, median of {args.repeats}")
    print_speed_and_memory(names, shape, args)
    if args.layer_lengths:
        print_layer_memory(args, shape)


if __name__ == "__main__":
    main()
