"""Speed and memory of a hybridized model beside the unmodified one, for `benchmarks.long_context`: each measurement
in a fresh process, so that its peak memory is its own and no allocator state or warm cache carries over.

A process loads the model saved in a folder (hybridizing it when given a layout), prefills a random prompt to
`timing_context` tokens minus `decode_steps` and times `decode_steps` greedy steps on the cache (median ms, the first
`WARM_UP_STEPS` left out); its peak resident memory above the loaded model is Linux's VmHWM, reset after loading (the
prefill's activations as well as the cache); then it times one prefill of `prefill_context` tokens. Timing processes
run glibc's default allocator, whose history makes their peaks vary by up to 40% between processes; the peak each
shape reports comes from one more process per model that only prefills and decodes, under `EXACT_MEMORY` (glibc maps
every allocation above 128 KiB on its own: the peak is what the tensors needed). This module imports little, since
every process imports it.
"""

import functools
import statistics

import torch
from transformers import AutoModelForCausalLM

from benchmarks.common import DEFAULT_ALLOCATOR, EXACT_MEMORY, median, peak_rss_bytes, rss_bytes, timed
from benchmarks.common import in_fresh_process as fresh_process
from benchmarks.generation import Decoder
from hf_attn import hybridize

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
WARM_UP_STEPS = 2  # decode steps left out of the median
# Each pair's ratios; the peak under the default allocator is kept beside the exact one the shape reports.
RATIOS = ("decode_speed_ratio", "prefill_time_ratio", "default_allocator_peak_ratio", "cache_bytes_ratio")


def measure_speed(spec: dict) -> dict:
    """Run in a fresh process: the model saved at `spec["folder"]`, hybridized to `spec["layout"]` unless it is
    None; decode ms per step, cache bytes and peak memory at `timing_context`, then prefill seconds at
    `prefill_context` (not with `memory_only`)."""
    torch.set_num_threads(spec["threads"])
    model = AutoModelForCausalLM.from_pretrained(spec["folder"], dtype=DTYPES[spec["dtype"]]).eval()
    if spec["layout"] is not None:
        hybridize(model, head_layout=spec["layout"], local_window=spec["local_window"], sink_tokens=spec["sink_tokens"])
    generator = torch.Generator().manual_seed(0)

    def prompt(tokens: int) -> torch.Tensor:
        return torch.randint(0, model.config.vocab_size, (1, tokens), generator=generator)

    Decoder(model, prompt(16))  # warm-up: allocator, kernels
    with open("/proc/self/clear_refs", "w") as clear_refs:  # VmHWM counts from here (Linux >= 4.0)
        clear_refs.write("5")
    loaded = rss_bytes()
    decoder = Decoder(model, prompt(spec["timing_context"] - spec["decode_steps"]))
    steps = [timed(decoder.step, "cpu") for _ in range(spec["decode_steps"])]
    measured = {"decode_ms": 1000 * median(steps[WARM_UP_STEPS:]), "cache_bytes": decoder.cache_bytes(),
                "peak_memory_bytes": peak_rss_bytes() - loaded}  # fmt: skip
    del decoder
    if spec.get("memory_only"):
        return measured
    return measured | {
        "prefill_seconds": timed(functools.partial(Decoder, model, prompt(spec["prefill_context"])), "cpu")
    }


def in_fresh_process(spec: dict, allocator: dict[str, str] = DEFAULT_ALLOCATOR) -> dict:
    return fresh_process(measure_speed, spec, allocator)


def model_spec(spec: dict, name: str) -> dict:
    """`spec` for the unmodified model or the converted one."""
    return spec | ({"layout": None} if name == "unmodified" else {})


def timing_pair(spec: dict, unmodified_first: bool) -> dict:
    """The converted model's and the unmodified one's measurements, in turn, and their ratios."""
    order = ["unmodified", "converted"] if unmodified_first else ["converted", "unmodified"]
    runs = {name: in_fresh_process(model_spec(spec, name)) for name in order}
    unmodified, converted = runs["unmodified"], runs["converted"]
    return runs | {
        "decode_speed_ratio": unmodified["decode_ms"] / converted["decode_ms"],  # > 1: faster
        "prefill_time_ratio": converted["prefill_seconds"] / unmodified["prefill_seconds"],  # < 1: faster
        "default_allocator_peak_ratio": converted["peak_memory_bytes"] / unmodified["peak_memory_bytes"],
        "cache_bytes_ratio": converted["cache_bytes"] / unmodified["cache_bytes"],
    }


def timing_pairs(spec: dict, repeats: int, unmodified_first: bool) -> dict:
    """`repeats` pairs (`timing_pair`), which model goes first alternating, and each ratio's median over them: on a
    2-core CPU, fresh processes of one model decode up to a third faster or slower than each other. Then each model's
    exact peak, once (it varies by under 4% between processes)."""
    pairs = [timing_pair(spec, unmodified_first == (repeat % 2 == 0)) for repeat in range(repeats)]
    exact = {name: in_fresh_process(model_spec(spec, name) | {"memory_only": True}, EXACT_MEMORY)["peak_memory_bytes"]
             for name in ("unmodified", "converted")}  # fmt: skip
    return (
        {"pairs": pairs, "exact_peak_memory_bytes": exact}
        | {name: statistics.median(pair[name] for pair in pairs) for name in RATIOS}
        | {"peak_memory_ratio": exact["converted"] / exact["unmodified"]}
    )
