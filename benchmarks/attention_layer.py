"""Forward + backward time of one local attention layer: our banded kernel against masked SDPA.

Masked SDPA over a T x T band mask is what transformers' sliding-window models run. Both are timed in the same
process, interleaved, and reported as ratios (machines are noisy; absolute times mean little here).

    python benchmarks/attention_layer.py                       # T in {1024, 4096}, k in {1, 4, 64}
    python benchmarks/attention_layer.py --compile             # also the torch.compile'd kernel
    python benchmarks/attention_layer.py --lengths 1024 --windows 1 --repeats 3
"""

import argparse
import platform
import statistics
import time

import torch

from hf_attn.attention_hf_attn import Visibility, local_attention, local_attention_masked


def time_forward_backward(kernel, q, k, v, visibility: Visibility, repeats: int) -> float:
    """Median seconds of one forward + backward, after one warm-up call."""
    times = []
    for step in range(repeats + 1):
        for t in (q, k, v):
            t.grad = None
        start = time.perf_counter()
        kernel(q, k, v, visibility, None, q.shape[-1] ** -0.5).sum().backward()
        if step:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096], help="sequence lengths T")
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 4, 64], help="local windows k")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions per figure (median)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile(local_attention)")
    parser.add_argument("--inclusive", action="store_true", help="inclusive masks (default: strict, Paper B)")
    args = parser.parse_args()

    torch.manual_seed(0)
    compiled = torch.compile(local_attention, dynamic=False) if args.compile else None
    machine = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    print(f"# torch {torch.__version__}, {machine}")
    mask = "inclusive" if args.inclusive else "strict"
    print(f"# batch {args.batch}, {args.heads} heads, head dim {args.head_dim}, fp32, causal {mask} k-local,")
    print(f"# forward + backward, median of {args.repeats} after a warm-up")
    header = "| T | k | masked SDPA (ms) | banded (ms) | speed-up |"
    header += " compiled (ms) | speed-up |" if compiled else ""
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for length in args.lengths:
        shape = (args.batch, args.heads, length, args.head_dim)
        q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
        for window in args.windows:
            visibility = Visibility(is_causal=True, attend_to_self=args.inclusive, local_window=window)
            masked = time_forward_backward(local_attention_masked, q, k, v, visibility, args.repeats)
            banded = time_forward_backward(local_attention, q, k, v, visibility, args.repeats)
            row = f"| {length} | {window} | {masked * 1e3:.0f} | {banded * 1e3:.0f} | {masked / banded:.1f}x |"
            if compiled:
                fast = time_forward_backward(compiled, q, k, v, visibility, args.repeats)
                row += f" {fast * 1e3:.0f} | {masked / fast:.1f}x |"
            print(row, flush=True)


if __name__ == "__main__":
    main()
