"""What the benchmarks share: the compared models at one shape, the masked-SDPA baseline, timing, tables, the machine.

Every model has GPT-2's pre-LN block, learned positions and the same width, depth, heads and vocabulary, so the
only difference is the attention. Dropout is off for all of them: with dropout, SDPA on CPU leaves its fused
kernel for the T x T math path, which would flatter us against GPT-2.
"""

import argparse
import ctypes
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, PreTrainedModel

import hf_attn  # noqa: F401  (registers the model types)
from hf_attn.attention_hf_attn import Visibility, masked_sdpa, visibility_mask
from hf_attn.data.wikitext import WIKITEXT_FILES
from hf_attn.hub import hub_offline
from hf_attn.layers_hf_attn import HfAttnAttention


def masked_local_attention(
    q, k, v, visibility: Visibility, key_mask: torch.Tensor | None, scale: float, dropout: float = 0.0
) -> torch.Tensor:
    """The route transformers' sliding-window models take: SDPA over a full T x T band mask, O(T^2) whatever k.

    hf_attn's local heads compute the same attention from the k (or k + 1) scores per query; this is what they are
    measured against. Same arguments as `hf_attn.attention_hf_attn.local_attention`.
    """
    mask = visibility_mask(visibility, q.shape[-2], key_mask, k.shape[-2], q.device)  # (B|1, 1, T, S)
    return masked_sdpa(q, k, v, mask, scale, dropout)


@dataclass(frozen=True)
class Shape:
    n_layer: int = 4
    n_embd: int = 256
    n_head: int = 8
    vocab_size: int = 50257  # GPT-2's tokenizer
    n_positions: int = 4096


MASKED = " masked"  # a local model whose local heads run `masked_local_attention`
COMPILED_KERNEL = " compiled kernel"  # a model whose local kernel alone runs under torch.compile

# name -> hf_attn config fields; "gpt2" is transformers' GPT2LMHeadModel with SDPA.
MODELS: dict[str, dict | None] = {
    "gpt2": None,
    # Paper A's one-hot P would be n_positions wide; a sinusoidal P as wide as the model with head-sized queries
    # and keys keeps the positional model the same size as the others.
    "positional": dict(model_type="positional_gpt2", positional_encoding="sinusoidal"),
    "local-1": dict(model_type="local_gpt2", local_window=1),
    "local-4": dict(model_type="local_gpt2", local_window=4),
    "hybrid-1": dict(model_type="hybrid_gpt2", local_window=1),  # half the heads global, half 1-local
    "local-1" + MASKED: dict(model_type="local_gpt2", local_window=1),
    "local-4" + MASKED: dict(model_type="local_gpt2", local_window=4),
    # `local_attention_impl="compiled"`: minutes of warm-up on a CPU.
    "local-1" + COMPILED_KERNEL: dict(model_type="local_gpt2", local_window=1, local_attention_impl="compiled"),
    "hybrid-1" + COMPILED_KERNEL: dict(model_type="hybrid_gpt2", local_window=1, local_attention_impl="compiled"),
}
EAGER_MODELS = [name for name in MODELS if not name.endswith(COMPILED_KERNEL)]
NO_DROPOUT = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def build_model(name: str, shape: Shape, device: str = "cpu", **config_fields) -> PreTrainedModel:
    """One of `MODELS` at `shape`, in fp32 on `device`; `config_fields` override hf_attn models' config."""
    if name not in MODELS:
        raise ValueError(f"model {name!r} must be one of {list(MODELS)}")
    fields = dict(
        n_layer=shape.n_layer, n_embd=shape.n_embd, n_head=shape.n_head, vocab_size=shape.vocab_size,
        n_positions=shape.n_positions, bos_token_id=None, eos_token_id=None, **NO_DROPOUT,
    )  # fmt: skip
    if MODELS[name] is None:
        model = GPT2LMHeadModel(GPT2Config(**fields, attn_implementation="sdpa"))
    else:
        extra = dict(MODELS[name])
        if extra["model_type"] == "positional_gpt2":
            extra.update(positional_encoding_dim=shape.n_embd, positional_qk_dim=shape.n_embd // shape.n_head)
        extra.update(config_fields)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**extra, **fields))
    if name.endswith(MASKED):
        for attention in model.modules():
            if isinstance(attention, HfAttnAttention) and "local" in attention.kernels:
                attention.kernels["local"] = masked_local_attention
    return model.to(device)


AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16}
# SDPA's backends, to force one (e.g. flash or memory-efficient on a GPU); "default" lets SDPA choose.
SDPA_BACKENDS = {
    "default": None,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


def precision(device: str, dtype: str, sdpa_backend: str = "default") -> ExitStack:
    """bf16 autocast (fp32 weights) when `dtype` says so, and SDPA held to one backend when one is named."""
    stack = ExitStack()
    if AUTOCAST_DTYPES[dtype] is not None:
        stack.enter_context(torch.autocast(device.split(":")[0], dtype=AUTOCAST_DTYPES[dtype]))
    if SDPA_BACKENDS[sdpa_backend] is not None:
        stack.enter_context(sdpa_kernel(SDPA_BACKENDS[sdpa_backend]))
    return stack


class Trainee:
    """A model, its optimizer and a fixed batch: `step()` is one training step, the forward under `precision`."""

    def __init__(self, model: PreTrainedModel, batch: dict, args):
        self.model = model.to(args.device).train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.batch = {name: tensor.to(args.device) for name, tensor in batch.items()}
        self.precision = lambda: precision(args.device, args.dtype, args.sdpa_backend)

    def step(self) -> None:
        with self.precision():  # the backward runs the kernels the forward chose
            loss = self.model(**self.batch).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def median_step_seconds(trainees: dict[str, Trainee], repeats: int, device: str) -> dict[str, float]:
    """Median seconds per training step of every trainee, after a warm-up step each, timed in turns."""
    for trainee in trainees.values():  # warm-up: allocator, compiled graphs
        trainee.step()
    times = {name: [] for name in trainees}
    for _ in range(repeats):
        for name, trainee in trainees.items():
            times[name].append(timed(trainee.step, device))
    return {name: median(seconds) for name, seconds in times.items()}


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: str) -> float:
    """Seconds one call of `fn` takes, the device's queue drained before and after."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def median(values: list[float]) -> float:
    return statistics.median(values)


def attempt(measure: Callable[..., object], *args) -> object:
    """`measure(*args)`, or a short 'error: ...' for its table cell (the full message goes to stderr)."""
    try:
        return measure(*args)
    except Exception as error:  # one failed figure (out of memory, a backend missing) must not end the table
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return f"error: {type(error).__name__}" + (" (out of memory)" if "out of memory" in str(error) else "")


def print_header(*columns: str) -> None:
    """A Markdown table's header, after a blank line (the notes above it must not run into it)."""
    print("\n| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns), flush=True)


def print_row(*cells: object) -> None:
    print("| " + " | ".join(str(cell) for cell in cells) + " |", flush=True)


def describe_machine(device: str) -> str:
    if device.startswith("cuda"):
        where = torch.cuda.get_device_name(device)
    else:
        where = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    return f"torch {torch.__version__}, {where}"


def machine_load() -> dict:
    """`uptime`'s line and the load averages; idle: the last minute's below 0.3."""
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    load = os.getloadavg()
    return {"uptime": uptime, "load_average": load, "idle": load[0] < 0.3}


def rss_bytes() -> int:
    """This process's resident memory now (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


# glibc maps every allocation above this many bytes on its own and returns it to the system when freed: a process's
# peak resident memory is then what its tensors needed, not its allocator's history (one prefill's peak varied from
# 337 to 482 MiB between identical processes without it; with it, repeated processes agree within 4%). It slows code
# that allocates often (a system call and fresh pages each time: SmolLM2-135M-Instruct's prefill at 4K tokens, half
# its groups local, 8.5 -> 10.4 s, the unmodified model's unchanged), so timings come from processes without it.
MALLOC_MMAP_THRESHOLD = "131072"


# What a process's memory allocator is set by: glibc's tunables and a library preloaded in its place.
ALLOCATOR_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "LD_PRELOAD")
DEFAULT_ALLOCATOR: dict[str, str] = {}  # glibc's, as a user's process has it
EXACT_MEMORY = {"MALLOC_MMAP_THRESHOLD_": MALLOC_MMAP_THRESHOLD}
# Allocators a user can preload (LD_PRELOAD=NAME: the library of that name in the system's library path).
PRELOADED_ALLOCATORS = {"jemalloc": "libjemalloc.so.2", "tcmalloc": "libtcmalloc_minimal.so.4"}


def in_fresh_process(function: Callable[[dict], dict], spec: dict, allocator: dict[str, str]) -> dict:
    """`function(spec)` in a fresh spawned process started with `allocator`'s variables and no other of
    ALLOCATOR_VARIABLES: `DEFAULT_ALLOCATOR`, or `EXACT_MEMORY`, under which its peak memory is what its tensors needed
    (its timings are then not representative)."""
    previous = {name: os.environ.pop(name, None) for name in ALLOCATOR_VARIABLES}
    os.environ.update(allocator)  # the spawned process inherits the environment
    try:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1) as pool:
            return pool.submit(function, spec).result()
    finally:
        for name, value in previous.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


def preloaded_library() -> str | None:
    """The file of the library this process preloads from LD_PRELOAD, if one was found and mapped (the loader only
    warns about one it cannot find, and the process runs on glibc's allocator)."""
    names = [Path(name).name for name in os.environ.get("LD_PRELOAD", "").split()]
    with open("/proc/self/maps") as maps:
        mapped = {line.split()[-1] for line in maps if len(line.split()) > 5}
    # A library's name may be a link to a file of a longer version: libtcmalloc_minimal.so.4 -> ...so.4.5.10.
    return next((path for path in sorted(mapped) for name in names
                 if Path(path).name == name or Path(path).name.startswith(name + ".")), None)  # fmt: skip


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]  # fmt: skip


def glibc_heap() -> dict[str, int] | None:
    """glibc's main heap now (`mallinfo2`): its size, the bytes in use in it and the bytes mapped apart from it
    (allocations above the mmap threshold); None where glibc's allocator is not the one in use."""
    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):  # not glibc, or glibc < 2.33
        return None
    mallinfo2.restype = _Mallinfo2
    info = mallinfo2()
    if info.arena == 0:  # another allocator serves malloc: glibc's heap was never grown
        return None
    return {"heap_bytes": info.arena, "heap_in_use_bytes": info.uordblks, "mapped_bytes": info.hblkhd}


def release_free_heap() -> None:
    """glibc's free heap pages handed back to the system (`malloc_trim(0)`), so that a resident baseline read next
    holds no free memory a later trim could take it below; nothing where glibc's allocator is not in use."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def measured_or_stored(args, argv: list[str], measure, describe) -> dict:
    """With --report the stored results.json, else `measure(args, argv)`'s, written there (and OUTPUT_DIR/runs/, where
    a resumable benchmark keeps each model's record until then, removed); results.md from it (`describe`), printed.
    A one-run benchmark's `main`."""
    folder = Path(args.output_dir)
    if args.report:
        result = json.loads((folder / "results.json").read_text())
    else:
        result = measure(args, argv)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "results.json").write_text(json.dumps(result, indent=1) + "\n")
        shutil.rmtree(folder / "runs", ignore_errors=True)
    (folder / "results.md").write_text(text := describe(result))
    print(text)
    return result


def command_line_parser(module: str, description: str | None) -> argparse.ArgumentParser:
    """The parser of `python -m MODULE`: its usage names that command, its help keeps the docstring's layout."""
    return argparse.ArgumentParser(
        prog=f"python -m {module}", description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def data_dir_problems(data_dir: str) -> list[str]:
    """What is wrong with a benchmark's `--data_dir` (a WikiText-2 folder, or '' for the Hub), found before any model
    loads: a folder that is not there, or the Hub while it is offline."""
    if data_dir and not Path(data_dir).is_dir():
        return [f"--data_dir must be a folder of {', '.join(WIKITEXT_FILES.values())} (WikiText-2 raw) or '' for "
                f"the Hub, got {data_dir} (no such folder)"]  # fmt: skip
    if not data_dir and hub_offline():
        return ["--data_dir '' reads WikiText-2 from the Hub, which is offline (HF_HUB_OFFLINE): name a folder, e.g. "
                "../shared/data/wikitext-2-raw"]  # fmt: skip
    return []


def write_report_and_plot(
    result: dict, folder: Path, report: Callable[[dict], str], plot: Callable[[dict, Path], None], plot_name: str
) -> str:
    """FOLDER/results.md, `report(result)`, and FOLDER/PLOT_NAME, `plot(result, path)`: what a benchmark writes
    beside its results.json, and what `training.reports` rewrites from it. Returns the report's text."""
    text = report(result)
    (folder / "results.md").write_text(text)
    plot(result, folder / plot_name)
    return text
