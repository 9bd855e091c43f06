"""Every benchmark at GPU sizes, in one run that fits a fixed time budget: the figures for the README's GPU section.

    python benchmarks/gpu.py                          # on a CUDA machine: ~7 minutes at most, results in
                                                      # $OUT/gpu_benchmark.md (or ./gpu_benchmark.md)
    python benchmarks/gpu.py --sections kernel train  # a subset (names below), e.g. to rerun what was skipped
    python benchmarks/gpu.py --smoke                  # on CPU at tiny sizes, in under a minute: every code path

(with hf_attn installed, `pip install -e .`, or from the repository root with `PYTHONPATH=.`.)

What it measures, in the order it runs (each section in its own try/except, with its share of the budget):

1.  `kernel`: one strictly causal k-local attention layer, forward + backward, batch 4, 12 heads, head dim 64,
    bf16 and fp32, T in {4096, 16384}, k in {1, 4, 64}: our banded kernel (`local_attention`) against masked SDPA
    over a T x T band mask (what transformers' sliding-window models run), with SDPA's global causal attention
    (flash in bf16) as what a global head costs. Each output and gradient is checked against masked SDPA in fp32.
1b. `compiled-kernel`: the same rows with our kernel under torch.compile and FlexAttention (compiled, with a
    block mask for the band); bf16 first, then fp32 while the section's time lasts.
2.  `train`: training throughput (forward + backward + AdamW, bf16 autocast) and peak memory of GPT-2-small-sized
    models against transformers' GPT-2 (SDPA), through `throughput.measure_speed` / `throughput.model_peak_memory`.
3.  `decode`: ms per decoded token and cache size against the context length, through `generation.decode`.
4.  `memory`: peak memory of one training step at T = 16384 and 32768 (batch 1), local-1 against GPT-2.
2b. `compiled-train`: local-1 and hybrid-1 at T = 4096 compiled whole (`model.compile()`) or with the library's
    compiled kernel (`local_attention_impl="compiled"`), as far as the budget allows (last, as compiling a
    12-layer model takes a minute or more).

Every table row is printed as soon as it is measured and appended at once to the Markdown file (`--output`), so
a run cut short keeps everything measured until then. Each section must end by its share of `--budget-seconds`
(time an earlier one leaves unused goes to the later ones); rows or sections that would not fit print that they
were skipped. Paste the Markdown file into the README.
"""

import argparse
import datetime
import gc
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import nullcontext, redirect_stdout
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from common import Shape, build_model, describe_machine, median, timed
from generation import decode, mib, ratio
from throughput import MIB, measure_speed, model_peak_memory
from torch.nn.attention import SDPBackend, sdpa_kernel

from hf_attn.attention_hf_attn import Visibility, local_attention, local_attention_masked

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# Largest normalized error, max |x - reference| / max |reference|, for (output, gradients) to PASS.
TOLERANCE = {"bf16": (2e-2, 5e-2), "fp32": (1e-3, 1e-3)}
GPT2_SMALL = Shape(n_layer=12, n_embd=768, n_head=12, vocab_size=50257)


# --- what one run measures -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """The sizes of one run: `GPU_PLAN` for the H200, `SMOKE_PLAN` to try every code path on a CPU."""

    device: str
    # 1. one attention layer
    batch: int
    heads: int
    head_dim: int
    kernel_lengths: tuple[int, ...]
    windows: tuple[int, ...]
    kernel_dtypes: tuple[str, ...]
    seconds_per_figure: float  # timed calls per figure: as many as fit in this, within [min, max]_repeats
    min_repeats: int
    max_repeats: int
    max_mask_bytes: int  # 1: masked SDPA is skipped where its T x T masks would take more
    max_model_mask_bytes: int  # 4: local-1 masked is skipped where its layers' T x T masks would take more
    compile_backend: str  # for our kernel; "eager" (Dynamo traces, no code generated) in the smoke run
    seconds_per_compiled_row: float  # a row of 1b starts only with this much of its section's time left
    # 2. training, and 2b
    shape: Shape
    train_models: tuple[str, ...]
    train_lengths: tuple[int, ...]
    tokens_per_step: int
    repeats: int
    seconds_per_train_length: float
    compiled_train_models: tuple[str, ...]  # 2b; "... compiled kernel": the model's local kernel compiled
    compiled_train_length: int
    seconds_per_model_compile: float  # 2b: a whole model is compiled only with this much time left
    seconds_per_kernel_compile: float  # 2b: a compiled-kernel model starts only with this much time left
    # 3. decoding
    decode_models: tuple[str, ...]
    contexts: tuple[int, ...]
    long_decode_models: tuple[str, ...]
    long_contexts: tuple[int, ...]
    new_tokens: int
    # 4. long-context memory
    memory_models: tuple[str, ...]
    memory_lengths: tuple[int, ...]

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


GPU_PLAN = Plan(
    device="cuda",
    batch=4,
    heads=12,
    head_dim=64,
    kernel_lengths=(4096, 16384),
    windows=(1, 4, 64),
    kernel_dtypes=("bf16", "fp32"),
    seconds_per_figure=1.0,
    min_repeats=3,
    max_repeats=20,
    max_mask_bytes=8 * 2**30,
    max_model_mask_bytes=48 * 2**30,
    compile_backend="inductor",
    seconds_per_compiled_row=25,
    shape=GPT2_SMALL,
    train_models=("gpt2", "positional", "local-1", "local-4", "hybrid-1", "local-1 masked"),
    train_lengths=(1024, 4096),
    tokens_per_step=32768,
    repeats=5,
    seconds_per_train_length=30,
    compiled_train_models=("local-1", "local-1 compiled kernel", "hybrid-1 compiled kernel", "hybrid-1"),
    compiled_train_length=4096,
    seconds_per_model_compile=150,
    seconds_per_kernel_compile=45,
    decode_models=("local-1", "hybrid-1", "gpt2"),
    contexts=(512, 1024, 2048, 4096, 8192),
    long_decode_models=("local-1", "gpt2"),
    long_contexts=(16384, 32768),
    new_tokens=32,
    memory_models=("gpt2", "local-1", "local-1 masked"),
    memory_lengths=(16384, 32768),
)

# Every section at T <= 128, one layer of width 32: the same code paths, no GPU, no time limits, and no model
# compiled whole (the kernel alone is, by Dynamo only in 1b).
SMOKE_PLAN = replace(
    GPU_PLAN,
    device="cpu",
    batch=1,
    heads=2,
    head_dim=16,
    kernel_lengths=(64,),
    seconds_per_figure=0.0,
    min_repeats=1,
    max_repeats=1,
    compile_backend="eager",
    seconds_per_compiled_row=0,
    shape=Shape(n_layer=1, n_embd=32, n_head=4, vocab_size=100),
    train_lengths=(64,),
    tokens_per_step=128,
    repeats=1,
    seconds_per_train_length=0,
    compiled_train_models=("local-1 compiled kernel",),  # a whole-model compile takes minutes on a small CPU
    compiled_train_length=64,
    seconds_per_kernel_compile=0,
    contexts=(16, 32),
    long_contexts=(64,),
    new_tokens=3,
    memory_lengths=(64, 128),
)


@dataclass
class Run:
    """What the sections share: the plan, the clock, and figures a later section compares against."""

    plan: Plan
    started: float = field(default_factory=time.monotonic)
    eager_kernel_seconds: dict[tuple, float | str] = field(default_factory=dict)  # (dtype, T, k) -> ours
    masked_kernel_seconds: dict[tuple, float | str] = field(default_factory=dict)
    train_seconds: dict[tuple, float] = field(default_factory=dict)  # (model, T) -> seconds per step


class Deadline:
    """The end of one section's share of the budget."""

    def __init__(self, at: float):
        self.at = at

    def left(self) -> float:
        return self.at - time.monotonic()

    def skipped(self, needed: float) -> str | None:
        """None if `needed` seconds are left, else why the work is skipped."""
        left = self.left()
        return None if left >= needed else f"skipped: {max(left, 0):.1f} s left of this section, needs ~{needed:.0f}"


# --- output ----------------------------------------------------------------------------------------------------


class Tee:
    """Writes to the console and appends to the results file, flushing both at every write: nothing is lost."""

    def __init__(self, console, path: str):
        self.console = console
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115  (closed in `close`)

    def write(self, text: str) -> int:
        self.console.write(text)
        self.file.write(text)
        self.flush()
        return len(text)

    def flush(self) -> None:
        self.console.flush()
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def table(*columns: str) -> None:
    print()
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns), flush=True)


def row(*cells: object) -> None:
    print("| " + " | ".join(str(cell) for cell in cells) + " |", flush=True)


def ms(seconds: float | str, digits: int = 2) -> str:
    """A time in ms, or the reason there is none."""
    return f"{seconds * 1e3:.{digits}f}" if isinstance(seconds, float) else seconds


def speedup(slower: float | str, faster: float | str) -> str:
    """`slower / faster` as 'N.NNx' (above 1: `faster` is faster), '-' where either is missing."""
    if isinstance(slower, float) and isinstance(faster, float):
        return f"{slower / faster:.2f}x"
    return "-"


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def attempt(measure: Callable[..., object], *args) -> object:
    """`measure(*args)`, or a short 'error: ...' for its table cell (the full message goes to stderr)."""
    try:
        return measure(*args)
    except Exception as error:  # one failed figure (out of memory, a backend missing) must not end the table
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        text = f"error: {type(error).__name__}" + (" (out of memory)" if "out of memory" in str(error) else "")
        free_memory()
        return text


# --- 1. one attention layer ------------------------------------------------------------------------------------


Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class KernelInputs:
    """q, k, v (leaves that require grad) and the output's gradient, (B, H, T, D) in one dtype."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grad: torch.Tensor

    @classmethod
    def make(cls, plan: Plan, length: int, dtype: str) -> "KernelInputs":
        """Values drawn in bf16 for every dtype, so the fp32 reference sees exactly the bf16 inputs."""
        generator = torch.Generator(plan.device).manual_seed(length)
        shape = (plan.batch, plan.heads, length, plan.head_dim)
        q, k, v, grad = (
            torch.randn(shape, generator=generator, device=plan.device, dtype=torch.bfloat16).to(DTYPES[dtype])
            for _ in range(4)
        )
        return cls(q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), grad)

    def to_fp32(self) -> "KernelInputs":
        q, k, v = (x.detach().float().requires_grad_() for x in (self.q, self.k, self.v))
        return KernelInputs(q, k, v, self.grad.float())


def strict_band(window: int) -> Visibility:
    return Visibility(is_causal=True, attend_to_self=False, local_window=window)


def ours(window: int, kernel=local_attention) -> Kernel:
    return lambda q, k, v: kernel(q, k, v, strict_band(window), None, q.shape[-1] ** -0.5)


def masked(window: int) -> Kernel:
    return lambda q, k, v: local_attention_masked(q, k, v, strict_band(window), None, q.shape[-1] ** -0.5)


def global_causal(plan: Plan, dtype: str) -> tuple[Kernel, str]:
    """SDPA's causal attention over every key, and the backend it is held to (flash in bf16 on CUDA)."""
    backend = None
    if plan.cuda:
        backend = SDPBackend.FLASH_ATTENTION if dtype == "bf16" else SDPBackend.EFFICIENT_ATTENTION
    context = (lambda: sdpa_kernel(backend)) if backend is not None else nullcontext

    def run(q, k, v):
        with context():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    name = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.EFFICIENT_ATTENTION: "mem-efficient"}.get(backend)
    return run, name or "default backend"


def masked_fits(plan: Plan, length: int, dtype: str) -> bool:
    """The boolean T x T band mask plus the additive one SDPA makes of it, in the inputs' dtype."""
    return length * length * (1 + DTYPES[dtype].itemsize) <= plan.max_mask_bytes


def forward_backward(kernel: Kernel, inputs: KernelInputs) -> tuple[torch.Tensor, ...]:
    """(output, dq, dk, dv) of one forward + backward."""
    for x in (inputs.q, inputs.k, inputs.v):
        x.grad = None
    out = kernel(inputs.q, inputs.k, inputs.v)
    out.backward(inputs.grad)
    return out.detach(), inputs.q.grad, inputs.k.grad, inputs.v.grad


def forward_only(kernel: Kernel, inputs: KernelInputs) -> tuple[torch.Tensor]:
    return (kernel(inputs.q.detach(), inputs.k.detach(), inputs.v.detach()),)


def median_seconds(work: Callable[[], object], plan: Plan) -> float:
    """Median seconds of `work()` after one warm-up call (compilation, autotuning, the allocator): as many calls
    as fit in `plan.seconds_per_figure`, within [min_repeats, max_repeats]."""
    work()
    times = [timed(work, plan.device)]
    repeats = min(plan.max_repeats, max(plan.min_repeats, int(plan.seconds_per_figure / times[0])))
    times += [timed(work, plan.device) for _ in range(repeats - 1)]
    return median(times)


def time_kernel(kernel: Kernel, inputs: KernelInputs, plan: Plan) -> float:
    return median_seconds(lambda: forward_backward(kernel, inputs), plan)


def normalized_error(value: torch.Tensor, reference: torch.Tensor, floor: float = 0.0) -> float:
    """max |value - reference| / max |reference|, the denominator at least `floor`."""
    scale = max(float(reference.abs().max()), floor, 1e-30)
    return float((value.float() - reference).abs().max()) / scale


def check(results: tuple[torch.Tensor, ...], reference: tuple[torch.Tensor, ...] | str, dtype: str) -> str:
    """PASS / FAIL against the fp32 reference: max |x - ref| / max |ref| of the output and of each gradient.

    A gradient that is zero in exact arithmetic (dq and dk when every query sees one key, k = 1) is rounding noise
    in the reference, so each gradient's scale is at least 1% of the largest reference gradient's.
    """
    if isinstance(reference, str):
        return f"no reference ({reference})"
    out_error = normalized_error(results[0], reference[0])
    floor = 0.01 * max(float(ref.abs().max()) for ref in reference[1:])
    grad_errors = [normalized_error(x, ref, floor) for x, ref in zip(results[1:], reference[1:], strict=False)]
    out_tolerance, grad_tolerance = TOLERANCE[dtype]
    passed = out_error <= out_tolerance and all(error <= grad_tolerance for error in grad_errors)
    text = f"{'PASS' if passed else 'FAIL'} (out {out_error:.1e}"
    return text + (f", grads {max(grad_errors):.1e})" if grad_errors else ", forward only)")


def checked(kernel: Kernel, inputs: KernelInputs, expected, dtype: str) -> str:
    return check(forward_backward(kernel, inputs), expected, dtype)


def reference(plan: Plan, inputs: KernelInputs, window: int) -> tuple[torch.Tensor, ...] | str:
    """Masked SDPA in fp32 on the same values: the output and gradients every kernel is checked against."""
    if not masked_fits(plan, inputs.q.shape[-2], "fp32"):
        return "its T x T mask is too large"
    return forward_backward(masked(window), inputs.to_fp32())


def kernel_section(run: Run, deadline: Deadline) -> None:
    plan = run.plan
    bf16, fp32 = TOLERANCE["bf16"], TOLERANCE["fp32"]
    print(
        f"One strictly causal k-local attention layer (a query sees the k keys before it, not itself): batch "
        f"{plan.batch}, {plan.heads} heads, head dim {plan.head_dim}, forward + backward, median of {plan.min_repeats}"
        f" to {plan.max_repeats} calls after a warm-up. **ours**: `local_attention` (one pass per offset for k <= 12,"
        " chunked SDPA above); **masked**: SDPA over the T x T band mask (transformers' sliding-window path); "
        "**global**: SDPA `is_causal=True` over every key, what a global head costs. Speed-up = other ms / ours ms. "
        "Check: ours against masked SDPA run in fp32 on the same values, normalized max error of the output and of "
        f"the gradients (PASS: output and gradients within {bf16[0]:.0e} and {bf16[1]:.0e} in bf16, "
        f"{fp32[0]:.0e} and {fp32[1]:.0e} in fp32)."
    )
    table("dtype", "T", "k", "ours ms", "masked ms", "global ms", "ours vs masked", "ours vs global", "check")
    for dtype in plan.kernel_dtypes:
        global_kernel, backend = global_causal(plan, dtype)
        for length in plan.kernel_lengths:
            if why := deadline.skipped(2):
                row(dtype, length, "all", why)
                continue
            inputs = KernelInputs.make(plan, length, dtype)
            global_seconds = attempt(time_kernel, global_kernel, inputs, plan)
            for window in plan.windows:
                key = (dtype, length, window)
                expected = attempt(reference, plan, inputs, window)
                seconds = attempt(time_kernel, ours(window), inputs, plan)
                masked_seconds = "mask too large"
                if masked_fits(plan, length, dtype):
                    masked_seconds = attempt(time_kernel, masked(window), inputs, plan)
                verdict = attempt(checked, ours(window), inputs, expected, dtype)
                run.eager_kernel_seconds[key], run.masked_kernel_seconds[key] = seconds, masked_seconds
                row(
                    dtype, length, window, ms(seconds), ms(masked_seconds), f"{ms(global_seconds)} ({backend})",
                    speedup(masked_seconds, seconds), speedup(global_seconds, seconds), verdict,
                )  # fmt: skip
            inputs = None
            free_memory()


# --- 1b. torch.compile and FlexAttention -----------------------------------------------------------------------


class FlexBand:
    """FlexAttention over the strict causal k-local band, compiled once per shape and dtype.

    The window is a tensor the mask reads, not a Python int, so a new k needs a new block mask but no recompile.
    The band's first row is empty (query 0 has no key before it): FlexAttention returns zeros there (seen on CPU
    with torch 2.13), as our kernels do; `row_zero` reports what it returned, and the check zeroes it otherwise.
    """

    def __init__(self, plan: Plan):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        self.plan, self.create_block_mask = plan, create_block_mask
        self.window = torch.zeros((), dtype=torch.int32, device=plan.device)
        self.attention = torch.compile(flex_attention, dynamic=False)
        self.block_mask = None

        def strict_band(batch, head, q_idx, kv_idx):  # a plain function: create_block_mask takes no method
            distance = q_idx - kv_idx
            return (distance >= 1) & (distance <= self.window)

        self.mask_mod = strict_band

    def use(self, window: int, length: int) -> None:
        self.window.fill_(window)
        self.block_mask = self.create_block_mask(self.mask_mod, None, None, length, length, device=self.plan.device)

    def __call__(self, q, k, v):
        return self.attention(q, k, v, block_mask=self.block_mask, scale=q.shape[-1] ** -0.5)

    @staticmethod
    def row_zero(out: torch.Tensor) -> str:
        first = out[:, :, 0].float()
        if not torch.isfinite(first).all():
            return "row 0 NaN"
        return "row 0 zeros" if not first.any() else f"row 0 max {first.abs().max():.1e}"


def time_and_check_flex(
    flex: FlexBand, window: int, inputs: KernelInputs, expected, dtype: str
) -> tuple[float | str, str]:
    """(median seconds, check) of FlexAttention at one k; forward only where it has no backward (CPU)."""
    made = attempt(flex.use, window, inputs.q.shape[-2])
    if made is not None:
        return made, made
    if not flex.plan.cuda:
        results = attempt(forward_only, flex, inputs)
        seconds = "no backward on CPU"
    else:
        seconds = attempt(time_kernel, flex, inputs, flex.plan)
        results = attempt(forward_backward, flex, inputs)
    if isinstance(results, str):
        return seconds, results
    first_row = FlexBand.row_zero(results[0])
    if first_row != "row 0 zeros":  # our convention is zeros: compare the rest of the band
        out = results[0].clone()
        out[:, :, 0] = 0
        results, first_row = (out, *results[1:]), f"{first_row}, zeroed for the check"
    return seconds, f"{check(results, expected, dtype)}, {first_row}"


def eager_figures(run: Run, key: tuple, inputs: KernelInputs) -> tuple[float | str, float | str]:
    """Section 1's (ours, masked) seconds at (dtype, T, k), measured here if section 1 did not run."""
    dtype, length, window = key
    if key not in run.eager_kernel_seconds:
        run.eager_kernel_seconds[key] = attempt(time_kernel, ours(window), inputs, run.plan)
    if key not in run.masked_kernel_seconds:
        fits = masked_fits(run.plan, length, dtype)
        measured = attempt(time_kernel, masked(window), inputs, run.plan) if fits else "mask too large"
        run.masked_kernel_seconds[key] = measured
    return run.eager_kernel_seconds[key], run.masked_kernel_seconds[key]


def allow_recompiles(limit: int) -> None:
    """In 1b every (T, k, dtype) is a new graph of the same function: keep Dynamo from going eager after 8."""
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(limit, getattr(torch._dynamo.config, name)))


def compiled_kernel_section(run: Run, deadline: Deadline) -> None:
    plan = run.plan
    compiled = torch.compile(local_attention, dynamic=False, backend=plan.compile_backend)
    flex = FlexBand(plan)
    print(
        "The rows of section 1 with **compiled**: `torch.compile(local_attention, dynamic=False, backend="
        f"{plan.compile_backend!r})`, and **flex**: `torch.compile(flex_attention)` with a `create_block_mask` band "
        "`(q_idx - kv_idx >= 1) & (q_idx - kv_idx <= k)` (default block size 128). Ours and masked are section 1's "
        "figures (measured here if section 1 did not run). Each first call (compilation) is untimed. Speed-up = the "
        "slower's ms / the faster's. Check: compiled and flex against masked SDPA in fp32, as in 1; row 0 is what "
        "flex returns for the band's empty first row (query 0 sees no key), where our kernels return zeros."
        + ("" if plan.cuda else " **CPU: FlexAttention has no backward here, so flex is checked forward only.**")
    )
    table(
        "dtype", "T", "k", "ours ms", "compiled ms", "flex ms", "masked ms", "compiled vs ours", "ours vs flex",
        "compiled vs flex", "flex vs masked", "check compiled", "check flex",
    )  # fmt: skip
    for dtype in plan.kernel_dtypes:
        for length in plan.kernel_lengths:
            inputs = None
            for window in plan.windows:
                key = (dtype, length, window)
                if why := deadline.skipped(plan.seconds_per_compiled_row):
                    row(dtype, length, window, why)
                    continue
                inputs = inputs or KernelInputs.make(plan, length, dtype)
                expected = attempt(reference, plan, inputs, window)
                compiled_seconds = attempt(time_kernel, ours(window, compiled), inputs, plan)
                compiled_check = attempt(checked, ours(window, compiled), inputs, expected, dtype)
                flex_seconds, flex_check = time_and_check_flex(flex, window, inputs, expected, dtype)
                eager, masked_seconds = eager_figures(run, key, inputs)
                row(
                    dtype, length, window, ms(eager), ms(compiled_seconds), ms(flex_seconds), ms(masked_seconds),
                    speedup(eager, compiled_seconds), speedup(flex_seconds, eager),
                    speedup(flex_seconds, compiled_seconds), speedup(masked_seconds, flex_seconds), compiled_check,
                    flex_check,
                )  # fmt: skip
            inputs = None
            free_memory()


# --- 2. training throughput ------------------------------------------------------------------------------------


def training_args(plan: Plan, tokens_per_step: int, compile: bool = False) -> argparse.Namespace:
    """What `throughput.Trainee` reads from its command line."""
    return argparse.Namespace(
        device=plan.device, dtype="bf16", compile=compile, seed=0, tokens_per_step=tokens_per_step,
        repeats=plan.repeats,
    )  # fmt: skip


def shape_for(plan: Plan, longest: int) -> Shape:
    shape = plan.shape
    return Shape(shape.n_layer, shape.n_embd, shape.n_head, shape.vocab_size, n_positions=longest)


def describe_shape(shape: Shape) -> str:
    return f"{shape.n_layer} layers, width {shape.n_embd}, {shape.n_head} heads, vocab {shape.vocab_size}, dropout 0"


def train_section(run: Run, deadline: Deadline) -> None:
    plan = run.plan
    shape = shape_for(plan, max(plan.train_lengths))
    args = training_args(plan, plan.tokens_per_step)
    print(
        f"One training step (forward + backward + AdamW) on {plan.tokens_per_step} tokens (batch = tokens / T), "
        f"bf16 autocast with fp32 weights, {describe_shape(shape)}: `throughput.measure_speed` (models interleaved "
        f"step by step, median of {plan.repeats} after a warm-up step) and `throughput.model_peak_memory` (peak "
        "`max_memory_allocated` over the first step beyond what the model held before, optimizer state included). "
        "gpt2 is transformers' GPT2LMHeadModel with SDPA."
        + ("" if plan.cuda else " **CPU smoke run: memory is this process's resident high-water mark, meaningless.**")
    )
    table("model", "T", "batch", "ms / step", "tokens / s", "tokens/s vs gpt2", "peak MiB", "memory vs gpt2")
    names = list(plan.train_models)
    for length in plan.train_lengths:
        batch = plan.tokens_per_step // length
        if why := deadline.skipped(plan.seconds_per_train_length):
            row("all", length, batch, why)
            continue
        seconds = attempt(measure_speed, names, shape, length, args)
        if isinstance(seconds, str):
            row("all", length, batch, seconds)
            continue
        run.train_seconds.update({(name, length): value for name, value in seconds.items()})
        memory = {}
        for name in names:
            memory[name] = attempt(model_peak_memory, args, shape, name, length)
            free_memory()
            row(
                name, length, batch, ms(seconds[name], 0), f"{plan.tokens_per_step / seconds[name]:,.0f}",
                speedup(seconds["gpt2"], seconds[name]), mebibytes(memory[name]), memory_ratio(memory, name),
            )  # fmt: skip


def mebibytes(num_bytes: int | str) -> str:
    return f"{num_bytes / MIB:,.0f}" if isinstance(num_bytes, int) else num_bytes


def memory_ratio(memory: dict[str, int | str], name: str) -> str:
    value, gpt2 = memory.get(name), memory.get("gpt2")
    return f"{value / gpt2:.2f}x" if isinstance(value, int) and isinstance(gpt2, int) else "-"


# --- 2b. training throughput, compiled -------------------------------------------------------------------------


COMPILED_KERNEL = " compiled kernel"  # common.MODELS names: the local kernel alone under torch.compile


def compiled_train_section(run: Run, deadline: Deadline) -> None:
    plan = run.plan
    length = plan.compiled_train_length
    shape = shape_for(plan, max(plan.train_lengths))
    print(
        f"As section 2 at T = {length}, gpt2 eager against, in a call of its own each: a model `model.compile()`d "
        'whole (throughput.py\'s `--compile`), or a model with `local_attention_impl="compiled"` ("compiled '
        'kernel": torch.compile around the local kernel alone). Compilation happens in the untimed warm-up step. '
        f"A whole-model compile starts only with {plan.seconds_per_model_compile:.0f} s left, a kernel's with "
        f"{plan.seconds_per_kernel_compile:.0f} s."
    )
    table("model", "T", "batch", "compiled", "ms / step", "tokens/s vs gpt2 (eager)", "vs itself eager (section 2)")
    batch = plan.tokens_per_step // length
    for name in plan.compiled_train_models:
        whole_model = not name.endswith(COMPILED_KERNEL)
        how = "whole model" if whole_model else "kernel"
        needed = plan.seconds_per_model_compile if whole_model else plan.seconds_per_kernel_compile
        if why := deadline.skipped(needed):
            row(name, length, batch, how, why)
            continue
        args = training_args(plan, plan.tokens_per_step, compile=whole_model)
        seconds = attempt(measure_speed, ["gpt2", name], shape, length, args)
        free_memory()
        if isinstance(seconds, str):
            row(name, length, batch, how, seconds)
            continue
        eager = run.train_seconds.get((name.removesuffix(COMPILED_KERNEL), length), "-")
        row(
            name, length, batch, how, ms(seconds[name], 0), speedup(seconds["gpt2"], seconds[name]),
            speedup(eager, seconds[name]),
        )  # fmt: skip


# --- 3. decoding -----------------------------------------------------------------------------------------------


def decode_section(run: Run, deadline: Deadline) -> None:
    plan = run.plan
    contexts = sorted({*plan.contexts, *plan.long_contexts})
    shape = shape_for(plan, contexts[-1] + plan.new_tokens)
    names = list(dict.fromkeys(plan.decode_models + plan.long_decode_models))
    print(
        f"`generation.decode`, {describe_shape(shape)}, n_positions {shape.n_positions}, fp32, batch 1: prefill L "
        f"random tokens in one forward, then decode {plan.new_tokens} tokens greedily, one forward each on the "
        f"cache; ms/token = median of steps 2..{plan.new_tokens}; cache = bytes of cached keys and values after the "
        f"last step. Each model is warmed up once at L = {contexts[0]}. Beyond L = {max(plan.contexts)} only "
        f"{', '.join(plan.long_decode_models)}."
    )
    generator = torch.Generator().manual_seed(0)
    models = {}
    for name in names:
        torch.manual_seed(0)
        models[name] = build_model(name, shape, plan.device).eval()
        warm_up = torch.randint(shape.vocab_size, (1, contexts[0]), generator=generator).to(plan.device)
        decode(models[name], warm_up, plan.new_tokens, plan.device)
    table("model", "context", "ms / token", "vs gpt2 at this context", "vs itself at the shortest", "cache MiB")
    latency: dict[str, dict[int, float]] = {name: {} for name in names}
    for length in contexts:
        if why := deadline.skipped(2):
            row("all", length, why)
            continue
        prompt = torch.randint(shape.vocab_size, (1, length), generator=generator).to(plan.device)
        here = plan.decode_models if length in plan.contexts else plan.long_decode_models
        results = {}
        for name in here:
            results[name] = attempt(decode, models[name], prompt, plan.new_tokens, plan.device)
        gpt2 = results.get("gpt2")
        for name, result in results.items():
            if isinstance(result, str):
                row(name, length, result)
                continue
            seconds, cache = result
            latency[name][length] = seconds
            shortest = latency[name][min(latency[name])]
            versus = ratio(seconds, gpt2[0]) if isinstance(gpt2, tuple) else "-"
            row(name, length, f"{seconds * 1e3:.2f}", versus, ratio(seconds, shortest), mib(cache))
        free_memory()


# --- 4. long-context memory ------------------------------------------------------------------------------------


def memory_section(run: Run, deadline: Deadline) -> None:
    plan = run.plan
    shape = shape_for(plan, max(plan.memory_lengths))
    logits = max(plan.memory_lengths) * shape.vocab_size * 4
    print(
        f"One training step's peak memory at batch 1 (`throughput.model_peak_memory`: the first step, bf16 autocast, "
        f"{describe_shape(shape)}). Both are linear in T: local-1 keeps T x k scores, and SDPA's flash kernel (gpt2) "
        "keeps no T x T matrix either, so expect ratios near 1, the T x vocab logits dominating both (in fp32 "
        f"{logits / MIB:,.0f} MiB per copy at T = {max(plan.memory_lengths)}). local-1 masked builds a T x T mask per "
        f"layer (a boolean one and SDPA's bf16 bias made of it), skipped where its {shape.n_layer} layers' masks "
        f"would pass {plan.max_model_mask_bytes / 2**30:.0f} GiB."
        + ("" if plan.cuda else " **CPU smoke run: memory is this process's resident high-water mark, meaningless.**")
    )
    table("model", "T", "batch", "peak MiB", "memory vs gpt2", "MiB per 1k tokens")
    for length in plan.memory_lengths:
        args = training_args(plan, tokens_per_step=length)  # batch 1
        memory = {}
        for name in plan.memory_models:
            if why := deadline.skipped(2):
                memory[name] = why
            elif name.endswith("masked") and model_mask_bytes(shape, length) > plan.max_model_mask_bytes:
                memory[name] = "skipped: T x T masks too large"
            else:
                memory[name] = attempt(model_peak_memory, args, shape, name, length)
            free_memory()
            per_k = f"{memory[name] / MIB / (length / 1024):,.1f}" if isinstance(memory[name], int) else "-"
            row(name, length, 1, mebibytes(memory[name]), memory_ratio(memory, name), per_k)


def model_mask_bytes(shape: Shape, length: int) -> int:
    """local-1 masked: every layer's boolean T x T mask and the bf16 bias SDPA makes of it."""
    return shape.n_layer * length * length * 3


# --- running it all --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    share: float  # of the budget; what a section leaves unused goes to those after it
    run: Callable[[Run, Deadline], None]


SECTIONS = [
    Section("kernel", "1. One attention layer: ours, masked SDPA, global attention", 0.15, kernel_section),
    Section("compiled-kernel", "1b. One attention layer: torch.compile, FlexAttention", 0.3, compiled_kernel_section),
    Section("train", "2. Training throughput and peak memory", 0.23, train_section),
    Section("decode", "3. Decoding latency and cache memory against the context", 0.12, decode_section),
    Section("memory", "4. Long-context training memory", 0.08, memory_section),
    Section("compiled-train", "2b. Training throughput, compiled", 0.12, compiled_train_section),
]


def run_section(section: Section, run: Run, ends_at: float) -> None:
    """`section`, which must be done `ends_at` seconds after the start."""
    print(f"\n## {section.title}\n")
    deadline = Deadline(run.started + ends_at)
    if deadline.left() <= 0:
        print(f"Skipped: its time ran until {ends_at:.0f} s, and {elapsed(run):.0f} s are gone.")
        return
    started = time.monotonic()
    try:
        section.run(run, deadline)
    except Exception:  # a broken section must not cost the others their figures
        print("\nSection failed:\n\n```text\n" + traceback.format_exc(limit=-6).rstrip() + "\n```")
    finally:
        free_memory()
        print(f"\n_({time.monotonic() - started:.0f} s; {elapsed(run):.0f} s since the start)_", flush=True)


def elapsed(run: Run) -> float:
    return time.monotonic() - run.started


def print_header(plan: Plan, args: argparse.Namespace) -> None:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"\n# hf_attn benchmarks on {describe_machine(plan.device)}{' (smoke run)' if args.smoke else ''}, {now}\n")
    versions = f"torch {torch.__version__}"
    if plan.cuda:
        properties = torch.cuda.get_device_properties(plan.device)
        versions += f", CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
        memory = properties.total_memory / 2**30
        print(f"- GPU: {properties.name}, {memory:.0f} GiB, {properties.multi_processor_count} SMs")
    print(f"- {versions}, Python {platform.python_version()}, {os.cpu_count()} CPU cores")
    print(f"- TF32 matmuls: {torch.backends.cuda.matmul.allow_tf32} (fp32 figures are full fp32)")
    print(f"- `python benchmarks/gpu.py {' '.join(sys.argv[1:])}`, budget {args.budget_seconds:.0f} s", flush=True)


def default_output() -> str:
    return os.path.join(os.environ["OUT"], "gpu_benchmark.md") if os.environ.get("OUT") else "gpu_benchmark.md"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default=default_output(), help="Markdown file the results are appended to")
    parser.add_argument("--budget-seconds", type=float, default=420, help="sections share this, in order")
    names = [section.name for section in SECTIONS]
    parser.add_argument("--sections", nargs="+", choices=names, default=names, metavar="SECTION",
                        help=f"which to run, from {names}")  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU: try every code path quickly")
    args = parser.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        parser.error("no CUDA device: this benchmark is for a GPU (use --smoke to try it on CPU)")
    return args


def main() -> None:
    args = parse_args()
    plan = SMOKE_PLAN if args.smoke else GPU_PLAN
    allow_recompiles(64)
    run = Run(plan)
    output = Tee(sys.stdout, args.output)
    try:
        with redirect_stdout(output):
            print_header(plan, args)
            chosen = [section for section in SECTIONS if section.name in args.sections]
            total, ends_at = sum(section.share for section in chosen), 0.0
            for section in chosen:
                ends_at += args.budget_seconds * section.share / total
                run_section(section, run, ends_at)
            print(f"\n_Done in {elapsed(run):.0f} s._")
    finally:
        output.close()
    print(f"results appended to {args.output}")


if __name__ == "__main__":
    main()
