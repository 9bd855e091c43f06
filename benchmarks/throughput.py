"""Training throughput and peak memory of hf_attn models against transformers' GPT-2 (SDPA) at the same shape.

One training step = forward + backward + AdamW step on `tokens_per_step` tokens (batch = tokens / T). The models
are timed in one process, interleaved step by step, and every figure is the median over `--repeats` steps divided
by GPT-2's median from the same run (machines are noisy; absolute times mean little). Peak memory is measured
per model in a fresh process: the resident-memory high-water mark during its first step, less what the process held
before them (CPU), or `max_memory_allocated` (CUDA). A last table runs one 1-local attention layer alone to show
its memory grows linearly in T where a T x T score matrix would not fit.

    python benchmarks/throughput.py                                   # T in {1024, 4096}, every model
    python benchmarks/throughput.py --vocab-size 50257                # with GPT-2's output layer
    python benchmarks/throughput.py --lengths 1024 --repeats 3 --models gpt2 local-1
    python benchmarks/throughput.py --device cuda --dtype bf16         # on a GPU, bf16 autocast
"""

import argparse
import json
import subprocess
import sys
from contextlib import nullcontext

import torch
from common import EAGER_MODELS, MODELS, Shape, build_model, describe_machine, median, peak_rss_bytes, rss_bytes, timed

from hf_attn.attention_hf_attn import Visibility, local_attention, local_attention_masked

DTYPES = {"fp32": None, "bf16": torch.bfloat16}
MIB = 2**20


def autocast(device: str, dtype: str):
    if DTYPES[dtype] is None:
        return nullcontext()
    return torch.autocast(device.split(":")[0], dtype=DTYPES[dtype])


class Trainee:
    """A model, its optimizer and a fixed random batch: `step()` is one training step."""

    def __init__(self, name: str, shape: Shape, batch: int, length: int, args):
        self.model = build_model(name, shape, args.device).train()
        if args.compile and name != "gpt2":
            self.model.compile()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        generator = torch.Generator().manual_seed(args.seed)
        self.input_ids = torch.randint(shape.vocab_size, (batch, length), generator=generator).to(args.device)
        self.device, self.dtype = args.device, args.dtype

    def step(self) -> None:
        with autocast(self.device, self.dtype):
            loss = self.model(input_ids=self.input_ids, labels=self.input_ids).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def measure_speed(names: list[str], shape: Shape, length: int, args) -> dict[str, float]:
    """Median seconds per training step of every model, timed in turns."""
    trainees = {name: Trainee(name, shape, args.tokens_per_step // length, length, args) for name in names}
    for trainee in trainees.values():  # warm-up: allocator, compiled graphs
        trainee.step()
    times = {name: [] for name in names}
    for _ in range(args.repeats):
        for name, trainee in trainees.items():
            times[name].append(timed(trainee.step, args.device))
    return {name: median(seconds) for name, seconds in times.items()}


def peak_bytes_of(work, device: str) -> int:
    """Bytes `work()` needs beyond what was held before it: the allocator's peak on CUDA, resident memory's
    high-water mark on CPU (so on CPU call it in a fresh process, see `measured`)."""
    if device.startswith("cuda"):
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
    trainee = Trainee(name, shape, args.tokens_per_step // length, length, args)
    return peak_bytes_of(trainee.step, args.device)


def layer_peak_memory(args, shape: Shape, length: int, masked: bool) -> int:
    """Forward + backward of one 1-local strict attention layer: batch 1, 8 heads, head dim 32."""
    q, k, v = (torch.randn(1, 8, length, 32, device=args.device, requires_grad=True) for _ in range(3))
    visibility = Visibility(is_causal=True, attend_to_self=False, local_window=1)
    kernel = local_attention_masked if masked else local_attention
    return peak_bytes_of(lambda: kernel(q, k, v, visibility, None, 32**-0.5).sum().backward(), args.device)


MEASUREMENTS = {"model": model_peak_memory, "layer": layer_peak_memory}


def measured(args, shape: Shape, measurement: str, *values) -> int:
    """Peak bytes of a measurement; on CPU in a new interpreter, so the high-water mark is its own."""
    if args.device.startswith("cuda"):
        return MEASUREMENTS[measurement](args, shape, *values)
    command = [sys.executable, __file__, "--child", json.dumps([measurement, *values]), *sys.argv[1:]]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return int(output.strip().splitlines()[-1])


def print_speed_and_memory(names: list[str], shape: Shape, args) -> None:
    print("| model | T | batch | ms / step | tokens/s vs gpt2 | peak MiB | memory vs gpt2 |")
    print("|---|---|---|---|---|---|---|")
    for length in args.lengths:
        seconds = measure_speed(names, shape, length, args)
        memory = {name: measured(args, shape, "model", name, length) for name in names}
        for name in names:
            print(
                f"| {name} | {length} | {args.tokens_per_step // length} | {seconds[name] * 1e3:.0f} | "
                f"{seconds['gpt2'] / seconds[name]:.2f}x | {memory[name] / MIB:.0f} | "
                f"{memory[name] / memory['gpt2']:.2f}x |",
                flush=True,
            )


def print_layer_memory(args, shape: Shape) -> None:
    print("\n# one 1-local strict attention layer, batch 1, 8 heads, head dim 32, fp32, forward + backward")
    print("| T | banded peak MiB | masked SDPA peak MiB | a T x T fp32 score matrix (MiB) |")
    print("|---|---|---|---|")
    for length in args.layer_lengths:
        banded = measured(args, shape, "layer", length, False)
        masked = measured(args, shape, "layer", length, True) if length <= args.max_masked_length else None
        scores = 8 * length * length * 4
        masked_text = f"{masked / MIB:.0f}" if masked is not None else "not run"
        print(f"| {length} | {banded / MIB:.1f} | {masked_text} | {scores / MIB:.0f} |", flush=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    parser.add_argument("--dtype", default="fp32", choices=list(DTYPES), help="bf16: autocast, fp32 weights")
    parser.add_argument("--compile", action="store_true", help="torch.compile the hf_attn models")
    parser.add_argument("--layer-lengths", type=int, nargs="*", default=[4096, 8192, 16384],
                        help="T for the attention-layer memory table (empty: skip it)")  # fmt: skip
    parser.add_argument("--max-masked-length", type=int, default=8192, help="longest T to run masked SDPA at")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for length in args.lengths:
        if length < 2 or args.tokens_per_step < length:
            parser.error(f"--lengths: each T must be in [2, --tokens-per-step={args.tokens_per_step}], got {length}")
    return args


def main() -> None:
    args = parse_args()
    shape = Shape(args.n_layer, args.n_embd, args.n_head, args.vocab_size, max(args.lengths))
    if args.child:  # one memory measurement, in its own process
        measurement, *values = json.loads(args.child)
        print(MEASUREMENTS[measurement](args, shape, *values))
        return
    names = ["gpt2"] + [name for name in args.models if name != "gpt2"]
    print(f"# {describe_machine(args.device)}")
    print(f"# {shape}, dropout 0, {args.dtype}{', compiled' if args.compile else ''}")
    print(f"# training step (forward + backward + AdamW) on {args.tokens_per_step} tokens, median of {args.repeats}")
    print_speed_and_memory(names, shape, args)
    if args.layer_lengths:
        print_layer_memory(args, shape)


if __name__ == "__main__":
    main()
