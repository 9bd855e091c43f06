"""Every benchmark at GPU sizes in one run that fits a time budget: the figures for the README's GPU section.

    python -m benchmarks.gpu            # on CUDA, 7 minutes at most; appends to $OUT/gpu_benchmark.md
                                        # (without $OUT: outputs/benchmarks/gpu_benchmark.md, git-ignored)
    python -m benchmarks.gpu --steps decode-long compiled-local-1-train    # a subset, e.g. what was skipped
    python -m benchmarks.gpu --dry-run  # the plan: each step's command and estimate, every command line parsed
    python -m benchmarks.gpu --tiny     # the same steps at tiny sizes on CPU: every code path in a few minutes

Each step is one benchmark module's command line, run in this process and shown above its tables. Steps run in
order, each only if its estimate fits in what is left of `--budget-seconds` (otherwise it says so and the next is
tried): eager figures first, slow compiles last. A failed step prints its traceback and the run goes on. All output
is appended to the Markdown file as it is printed, so a run cut short keeps every finished table.
"""

import argparse
import datetime
import gc
import os
import platform
import shlex
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import redirect_stdout
from dataclasses import dataclass
from types import ModuleType

import torch

from benchmarks import attention_layer, generation, positional_routes, throughput
from benchmarks.common import command_line_parser, describe_machine


@dataclass(frozen=True)
class Step:
    name: str
    module: ModuleType  # a benchmark: `main(argv)` prints its tables, `parse_args(argv)` checks the command line
    argv: str
    seconds: float  # expected on the H200, compiling included; the step runs only with this much budget left

    @property
    def command(self) -> str:
        return f"python -m {self.module.__name__} {self.argv}"


@dataclass(frozen=True)
class Sizes:
    """What differs between the GPU run and the tiny CPU one: the steps are the same."""

    device: str
    layer: str  # one attention layer: shape, lengths and timed calls
    model: str  # every model's shape
    tokens_per_step: int
    train_lengths: tuple[int, int]  # short, long; the compiled models train at the long one
    contexts: str  # decoded by every model
    long_lengths: tuple[int, int]  # decoded by local-1 and gpt2 only, and trained at batch 1 for peak memory
    new_tokens: int
    memory: str  # whether throughput measures peak memory
    compile_backend: str
    efficient_backend: str  # SDPA's memory-efficient kernel; CPU has none, so the tiny run takes the math one


GPU = Sizes(
    device="cuda", layer="--batch 4 --heads 12 --head-dim 64 --lengths 4096 16384 --repeats 10",
    model="--n-layer 12 --n-embd 768 --n-head 12 --vocab-size 50257",  # GPT-2 small
    tokens_per_step=32768, train_lengths=(1024, 4096), contexts="512 1024 2048 4096 8192", long_lengths=(16384, 32768),
    new_tokens=32, memory="--memory", compile_backend="inductor", efficient_backend="efficient",
)  # fmt: skip
TINY = Sizes(
    device="cpu", layer="--batch 1 --heads 2 --head-dim 16 --lengths 64 --repeats 1",
    model="--n-layer 1 --n-embd 32 --n-head 4 --vocab-size 100",
    tokens_per_step=128, train_lengths=(32, 64), contexts="16 32", long_lengths=(64, 128), new_tokens=3,
    memory="--no-memory",  # on CPU each figure takes a fresh process, and means nothing at this size
    compile_backend="eager",  # Dynamo traces, no code is generated: an inductor build of a model takes minutes
    efficient_backend="math",
)  # fmt: skip
TRAIN_MODELS = "gpt2 positional local-1 local-4 hybrid-1 'local-1 masked'"
COMPILED_KERNEL_MODELS = "'local-1 compiled kernel' 'hybrid-1 compiled kernel'"


def plan(s: Sizes) -> list[Step]:
    """The measurements, the eager figures first and the slow compiles last."""
    (short, long), (longer, longest) = s.train_lengths, s.long_lengths
    layer = f"--device {s.device} {s.layer} --windows 1 4 64 --check --compile-backend {s.compile_backend} --dtypes"
    models = f"--device {s.device} {s.model} --dtype bf16 --layer-lengths --compile-backend {s.compile_backend}"
    train = f"{models} --tokens-per-step {s.tokens_per_step} --repeats 5 {s.memory} --models {TRAIN_MODELS}"
    peak = f"{models} --repeats 1 {s.memory} --models gpt2 positional local-1 'local-1 masked' --lengths"  # batch 1
    long_train = f"{models} --tokens-per-step {s.tokens_per_step} --repeats 5 --no-memory --lengths {long}"
    positional = f"{long_train} --models positional --sdpa-backend"
    routes = f"--device {s.device} --dtype bf16 --tokens-per-step {s.tokens_per_step} --lengths {short} {long}"
    decode = f"--device {s.device} {s.model} --new-tokens {s.new_tokens} --contexts"
    return [
        Step("kernel-bf16", attention_layer, f"{layer} bf16 --kernels masked banded global", 30),
        Step("kernel-fp32", attention_layer, f"{layer} fp32 --kernels masked banded global", 40),
        Step("train-short", throughput, f"{train} --lengths {short}", 30),
        Step("train-long", throughput, f"{train} --lengths {long}", 30),
        Step("positional-routes", positional_routes, routes, 25),
        Step("positional-flash", throughput, f"{positional} flash", 15),
        Step("positional-efficient", throughput, f"{positional} {s.efficient_backend}", 15),
        Step("decode", generation, f"{decode} {s.contexts} --models local-1 hybrid-1 positional gpt2", 25),
        Step("decode-long", generation, f"{decode} {longer} {longest} --models local-1 positional gpt2", 20),
        Step("memory-long", throughput, f"{peak} {longer} --tokens-per-step {longer}", 15),
        Step("memory-longest", throughput, f"{peak} {longest} --tokens-per-step {longest}", 15),
        Step("compiled-kernel-bf16", attention_layer, f"{layer} bf16 --kernels banded compiled flex", 90),
        Step("compiled-kernel-fp32", attention_layer, f"{layer} fp32 --kernels banded compiled flex", 90),
        Step("compiled-kernel-train", throughput, f"{long_train} --models {COMPILED_KERNEL_MODELS}", 45),
        Step("compiled-local-1-train", throughput, f"{long_train} --compile --models local-1", 150),
        Step("compiled-hybrid-1-train", throughput, f"{long_train} --compile --models hybrid-1", 150),
    ]


STEP_NAMES = [step.name for step in plan(GPU)]


def run_plan(steps: list[Step], budget_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
    """Runs `steps` in order, each only if its estimate fits in what is left of the budget."""
    deadline = clock() + budget_seconds
    for step in steps:
        print(f"\n## {step.name}\n\n`{step.command}`\n")
        left = deadline - clock()
        if left < step.seconds:
            print(f"Skipped: needs ~{step.seconds:.0f} s, {max(left, 0):.0f} s of the budget left.", flush=True)
            continue
        started = clock()
        try:
            step.module.main(shlex.split(step.argv))
        except (Exception, SystemExit):  # a failed step (argparse exits) must not cost the others their figures
            print("\nFailed:\n\n```text\n" + traceback.format_exc(limit=-6).rstrip() + "\n```")
        finally:
            gc.collect()
            torch.cuda.empty_cache()  # a no-op without CUDA
        print(f"\n_({clock() - started:.0f} s)_", flush=True)


def dry_run(steps: list[Step]) -> None:
    """Each step's command and estimate; every command line is parsed, so a broken plan shows before a GPU run."""
    for step in steps:
        step.module.parse_args(shlex.split(step.argv))
        print(f"- {step.name}, ~{step.seconds:.0f} s: `{step.command}`")
    print(f"\n~{sum(step.seconds for step in steps):.0f} s in all, if nothing is skipped")


class Tee:
    """Writes to every stream and flushes it at once: a run cut short loses nothing."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> None:
        for stream in self.streams:
            stream.write(text)
            stream.flush()

    def flush(self) -> None:
        pass  # every write is flushed already


def print_run_header(sizes: Sizes, args: argparse.Namespace) -> None:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"\n# hf_attn benchmarks, {now}{' (tiny run)' if args.tiny else ''}\n")
    print(f"- {describe_machine(sizes.device)}, Python {platform.python_version()}, {os.cpu_count()} CPU cores")
    if sizes.device.startswith("cuda"):
        gpu = torch.cuda.get_device_properties(sizes.device)
        print(f"- {gpu.total_memory / 2**30:.0f} GiB, {gpu.multi_processor_count} SMs, CUDA {torch.version.cuda}, "
              f"cuDNN {torch.backends.cudnn.version()}")  # fmt: skip
    print(f"- TF32 matmuls: {torch.backends.cuda.matmul.allow_tf32} (fp32 figures are full fp32)")
    print(f"- `python -m benchmarks.gpu {shlex.join(args.argv)}`, budget {args.budget_seconds:.0f} s", flush=True)


def default_output() -> str:
    """In $OUT where the GPU device tool sets it (it brings back what is written there); otherwise under the
    git-ignored `outputs/`, so a run leaves the working tree clean."""
    return os.path.join(os.environ.get("OUT") or os.path.join("outputs", "benchmarks"), "gpu_benchmark.md")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = command_line_parser("benchmarks.gpu", __doc__)
    parser.add_argument("--output", default=default_output(),
                        help="Markdown file the results are appended to (default: in $OUT if set, else in "
                             "outputs/benchmarks/)")  # fmt: skip
    parser.add_argument("--budget-seconds", type=float, default=420, help="wall-clock time the steps must fit in")
    parser.add_argument("--steps", nargs="+", choices=STEP_NAMES, default=STEP_NAMES, metavar="STEP",
                        help=f"which to run, in the plan's order, from {STEP_NAMES}")  # fmt: skip
    parser.add_argument("--tiny", action="store_true", help="tiny sizes on CPU: try every step quickly")
    parser.add_argument("--dry-run", action="store_true", help="list the plan and parse every step, run nothing")
    args = parser.parse_args(argv)
    if not (args.tiny or args.dry_run or torch.cuda.is_available()):
        parser.error("no CUDA device: this benchmark is for a GPU (--tiny tries it on CPU, --dry-run lists it)")
    args.argv = sys.argv[1:] if argv is None else list(argv)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sizes = TINY if args.tiny else GPU
    steps = [step for step in plan(sizes) if step.name in args.steps]
    if args.dry_run:
        dry_run(steps)
        return
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    print(f"appending results to {args.output}", flush=True)
    with open(args.output, "a", encoding="utf-8") as file, redirect_stdout(Tee(sys.stdout, file)):
        print_run_header(sizes, args)
        started = time.monotonic()
        run_plan(steps, args.budget_seconds)
        print(f"\n_Done in {time.monotonic() - started:.0f} s._")
    print(f"results appended to {args.output}")


if __name__ == "__main__":
    main()
