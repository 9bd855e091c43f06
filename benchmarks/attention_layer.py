"""Forward + backward time of one causal k-local attention layer: our banded kernel against masked SDPA and others.

Kernels (`--kernels`; speed-up = the first one's ms / this one's ms):
- masked: SDPA over a T x T band mask (`common.masked_local_attention`), what transformers' sliding-window models
  run; it costs the full T x T whatever k is;
- banded: hf_attn's `local_attention` (one pass per offset for k <= 12, chunked SDPA above);
- compiled: `local_attention` under `torch.compile(dynamic=False, backend=--compile-backend)`;
- flex: FlexAttention, compiled, with a block mask for the band (no backward on CPU: timed forward only there);
- global: SDPA's causal attention over every key (flash in bf16 on CUDA), what a global head costs instead.
All run in one process on the same values, median of `--repeats` calls after an untimed warm-up (compilation,
autotuning, the allocator). `--check` compares each band kernel's output and gradients with masked SDPA run in fp32.

    python -m benchmarks.attention_layer                       # T in {1024, 4096}, k in {1, 4, 64}, fp32
    python -m benchmarks.attention_layer --kernels masked banded compiled
    python -m benchmarks.attention_layer --device cuda --dtypes bf16 fp32 --kernels masked banded global --check
"""

import argparse
import functools
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.common import (
    attempt,
    command_line_parser,
    describe_machine,
    masked_local_attention,
    median,
    print_header,
    print_row,
    timed,
)
from hf_attn.attention_hf_attn import Visibility, local_attention

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Largest normalized error, max |x - reference| / max |reference|, of (output, gradients) that passes the check.
TOLERANCE = {"bf16": (2e-2, 5e-2), "fp32": (1e-3, 1e-3)}
KERNELS = ("masked", "banded", "compiled", "flex", "global")

Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Visibility], torch.Tensor]


@dataclass
class Inputs:
    """q, k, v (leaves that require grad) and the output's gradient, (B, H, T, D), all in one dtype."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grad: torch.Tensor

    @classmethod
    def draw(cls, shape: tuple[int, ...], dtype: str, device: str) -> "Inputs":
        """Drawn in bf16 for every dtype, so the fp32 reference sees exactly the bf16 run's values."""
        generator = torch.Generator(device).manual_seed(shape[2])
        q, k, v, grad = (
            torch.randn(shape, generator=generator, device=device, dtype=torch.bfloat16).to(DTYPES[dtype])
            for _ in range(4)
        )
        return cls(q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), grad)

    def to_fp32(self) -> "Inputs":
        q, k, v = (x.detach().float().requires_grad_() for x in (self.q, self.k, self.v))
        return Inputs(q, k, v, self.grad.float())


def run_kernel(kernel: Kernel, inputs: Inputs, visibility: Visibility, backward: bool) -> tuple[torch.Tensor, ...]:
    """(output, dq, dk, dv) of one forward + backward, or (output,) of a forward alone."""
    if not backward:
        with torch.no_grad():
            return (kernel(inputs.q.detach(), inputs.k.detach(), inputs.v.detach(), visibility),)
    for x in (inputs.q, inputs.k, inputs.v):
        x.grad = None
    out = kernel(inputs.q, inputs.k, inputs.v, visibility)
    out.backward(inputs.grad)
    return out.detach(), inputs.q.grad, inputs.k.grad, inputs.v.grad


def median_seconds(kernel: Kernel, inputs: Inputs, visibility: Visibility, backward: bool, args) -> float:
    work = functools.partial(run_kernel, kernel, inputs, visibility, backward)
    work()  # warm-up: compilation, autotuning, the allocator
    return median([timed(work, args.device) for _ in range(args.repeats)])


def normalized_error(value: torch.Tensor, reference: torch.Tensor, floor: float = 0.0) -> float:
    """max |value - reference| / max |reference|, the denominator at least `floor`."""
    scale = max(float(reference.abs().max()), floor, 1e-30)
    return float((value.float() - reference).abs().max()) / scale


def check(results: tuple[torch.Tensor, ...], reference: tuple[torch.Tensor, ...], dtype: str) -> str:
    """PASS / FAIL against the fp32 reference: normalized max error of the output and of each gradient.

    A gradient that is zero in exact arithmetic (dq and dk when every query sees one key, k = 1) is rounding noise
    in the reference, so each gradient's scale is at least 1% of the largest reference gradient's.
    """
    out_error = normalized_error(results[0], reference[0])
    floor = 0.01 * max(float(ref.abs().max()) for ref in reference[1:])
    grad_errors = [normalized_error(x, ref, floor) for x, ref in zip(results[1:], reference[1:], strict=False)]
    out_tolerance, grad_tolerance = TOLERANCE[dtype]
    passed = out_error <= out_tolerance and all(error <= grad_tolerance for error in grad_errors)
    text = f"{'PASS' if passed else 'FAIL'} (out {out_error:.1e}"
    return text + (f", grads {max(grad_errors):.1e})" if grad_errors else ", forward only)")


def banded(q, k, v, visibility: Visibility) -> torch.Tensor:
    return local_attention(q, k, v, visibility, None, q.shape[-1] ** -0.5)


def masked(q, k, v, visibility: Visibility) -> torch.Tensor:
    return masked_local_attention(q, k, v, visibility, None, q.shape[-1] ** -0.5)


def global_causal(device: str, dtype: str) -> tuple[Kernel, str]:
    """SDPA's causal attention over every key, and the backend it is held to (flash in bf16 on CUDA)."""
    backend = None
    if device.startswith("cuda"):
        backend = SDPBackend.FLASH_ATTENTION if dtype == "bf16" else SDPBackend.EFFICIENT_ATTENTION

    def attend(q, k, v, visibility: Visibility) -> torch.Tensor:
        with sdpa_kernel(backend) if backend is not None else nullcontext():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    name = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.EFFICIENT_ATTENTION: "mem-efficient"}.get(backend)
    return attend, name or "default backend"


class FlexBand:
    """FlexAttention over the causal k-local band, compiled once per shape and dtype.

    The window is a tensor the mask reads, not a Python int, so a new k needs a new block mask but no recompile.
    The band's first row is empty under strict masks: to pass the check FlexAttention must return zeros there, as
    our kernels do.
    """

    def __init__(self, device: str, backend: str):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        self.create_block_mask, self.device = create_block_mask, device
        self.attention = torch.compile(flex_attention, dynamic=False, backend=backend)
        window = self.window = torch.zeros((), dtype=torch.int32, device=device)
        nearest = self.nearest = torch.zeros((), dtype=torch.int32, device=device)  # 0 inclusive, 1 strict

        def band(batch, head, q_idx, kv_idx):  # a plain function: create_block_mask takes no method
            distance = q_idx - kv_idx
            return (distance >= nearest) & (distance <= window)

        self.band, self.block_mask, self.made_for = band, None, None

    def __call__(self, q, k, v, visibility: Visibility) -> torch.Tensor:
        length = q.shape[-2]
        if self.made_for != (visibility, length):  # in the untimed warm-up call
            self.window.fill_(visibility.local_window)
            self.nearest.fill_(0 if visibility.attend_to_self else 1)
            self.block_mask = self.create_block_mask(self.band, None, None, length, length, device=self.device)
            self.made_for = (visibility, length)
        return self.attention(q, k, v, block_mask=self.block_mask, scale=q.shape[-1] ** -0.5)


def allow_recompiles(limit: int) -> None:
    """Every (T, k, dtype) is a new graph of the same function: keep Dynamo from going eager after 8."""
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(limit, getattr(torch._dynamo.config, name)))


def build_kernels(args) -> dict[str, Kernel]:
    """The band kernels of `--kernels` by name (global is per dtype: see `global_causal`)."""
    makers = {
        "masked": lambda: masked,
        "banded": lambda: banded,
        "compiled": lambda: torch.compile(banded, dynamic=False, backend=args.compile_backend),
        "flex": lambda: FlexBand(args.device, args.compile_backend),
    }
    allow_recompiles(64)
    return {name: makers[name]() for name in args.kernels if name != "global"}


def masked_fits(length: int, args) -> bool:
    return args.max_masked_length is None or length <= args.max_masked_length


def forward_only(name: str, args) -> bool:
    return name == "flex" and not args.device.startswith("cuda")


def measure(name: str, kernel: Kernel, inputs: Inputs, visibility: Visibility, args) -> float | str:
    """Median seconds of one kernel, or why there is none."""
    if name == "masked" and not masked_fits(inputs.q.shape[-2], args):
        return "not run: T x T mask"
    backward = not forward_only(name, args)
    seconds = attempt(median_seconds, kernel, inputs, visibility, backward, args)
    if backward or isinstance(seconds, str):
        return seconds
    return f"{seconds * 1e3:.2f} forward only"  # a string: no speed-up against forward + backward figures


def reference(inputs: Inputs, visibility: Visibility, args) -> tuple[torch.Tensor, ...] | str:
    """Masked SDPA in fp32 on the same values: the output and gradients every band kernel is checked against."""
    if not masked_fits(inputs.q.shape[-2], args):
        return "no reference: T x T mask not run"
    return attempt(run_kernel, masked, inputs.to_fp32(), visibility, True)


def checked(name: str, kernel: Kernel, inputs: Inputs, visibility: Visibility, expected, dtype: str, args) -> str:
    if isinstance(expected, str):
        return expected
    results = attempt(run_kernel, kernel, inputs, visibility, not forward_only(name, args))
    return results if isinstance(results, str) else check(results, expected, dtype)


def speedup(baseline: float | str, seconds: float | str) -> str:
    if isinstance(baseline, float) and isinstance(seconds, float):
        return f"{baseline / seconds:.2f}x"
    return "-"


def ms(seconds: float | str) -> str:
    return f"{seconds * 1e3:.2f}" if isinstance(seconds, float) else seconds


def print_notes(args) -> None:
    mask = "inclusive" if args.inclusive else "strict"
    backends = ", ".join(f"{global_causal(args.device, dtype)[1]} in {dtype}" for dtype in args.dtypes)
    print(f"> {describe_machine(args.device)}")
    print(f"> batch {args.batch}, {args.heads} heads, head dim {args.head_dim}, causal {mask} k-local")
    print(f"> forward + backward, median of {args.repeats} after a warm-up; speed-up = {args.kernels[0]} ms / its ms")
    if "global" in args.kernels:
        print(f"> global: SDPA is_causal over every key ({backends}), the same at every k")
    if args.check:
        (out_bf16, grad_bf16), (out_fp32, grad_fp32) = TOLERANCE["bf16"], TOLERANCE["fp32"]
        print(
            "> check: against masked SDPA in fp32 on the same values, max |x - ref| / max |ref| of the output and "
            f"gradients (PASS within {out_bf16:.0e} and {grad_bf16:.0e} in bf16, {out_fp32:.0e} and {grad_fp32:.0e} "
            "in fp32)"
        )


def print_table(args) -> None:
    kernels = build_kernels(args)
    columns = ["dtype", "T", "k", f"{args.kernels[0]} ms"]
    for name in args.kernels[1:]:
        columns += [f"{name} ms", "speed-up"]
    checked_kernels = [name for name in args.kernels if name != "global"] if args.check else []
    print_header(*columns, *(f"{name} check" for name in checked_kernels))
    for dtype in args.dtypes:
        kernels["global"] = global_causal(args.device, dtype)[0]
        for length in args.lengths:
            inputs = Inputs.draw((args.batch, args.heads, length, args.head_dim), dtype, args.device)
            seconds = {}
            for window in args.windows:
                visibility = Visibility(is_causal=True, attend_to_self=args.inclusive, local_window=window)
                for name in args.kernels:
                    if name != "global" or "global" not in seconds:  # global sees every key: the same at every k
                        seconds[name] = measure(name, kernels[name], inputs, visibility, args)
                expected = reference(inputs, visibility, args) if checked_kernels else None
                checks = [checked(n, kernels[n], inputs, visibility, expected, dtype, args) for n in checked_kernels]
                cells = [ms(seconds[args.kernels[0]])]
                for name in args.kernels[1:]:
                    cells += [ms(seconds[name]), speedup(seconds[args.kernels[0]], seconds[name])]
                print_row(dtype, length, window, *cells, *checks)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = command_line_parser("benchmarks.attention_layer", __doc__)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096], help="sequence lengths T")
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 4, 64], help="local windows k")
    parser.add_argument("--kernels", nargs="+", default=["masked", "banded"], choices=KERNELS, metavar="KERNEL",
                        help=f"from {list(KERNELS)}; the first is the baseline of every speed-up")  # fmt: skip
    parser.add_argument("--dtypes", nargs="+", default=["fp32"], choices=list(DTYPES))
    parser.add_argument("--check", action="store_true", help="check each band kernel against masked SDPA in fp32")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per figure (median)")
    parser.add_argument("--inclusive", action="store_true", help="inclusive masks (default: strict, Paper B)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile-backend", default="inductor", help="for compiled and flex; 'eager' traces only")
    parser.add_argument("--max-masked-length", type=int, help="longest T to run masked SDPA at (default: every T)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print_notes(args)
    print_table(args)


if __name__ == "__main__":
    main()
