"""WikiText-2 perplexity of a continuation read over a compressed context: one measure for a hybridized layout
(`benchmarks.ruler run`) and for a kvpress press (`benchmarks/kvpress/run_presses.py`, in kvpress's own environment,
so this module imports torch alone: neither hf_attn nor transformers).

Why not the perplexity of whole blocks: a press compresses the cache once the prefill has read the context, so every
token of one forward pass is predicted exactly as the unmodified model predicts it. Here each block of L tokens is
read as kvpress's pipeline reads a prompt: its first CONTEXT_SHARE as the context, prefilled through the base model
(under the press, which compresses what the cache holds), then the rest at its own positions over that cache,
CHUNK tokens a forward as decoding reads them (kvpress's head-wise presses hide a dropped key behind
a fake key that all queries of a forward must meet with exp(q.k) ~ 0: it finds one for a few queries per head, not
for a thousand). Scored: the continuation's tokens after its first, each predicted inside the continuation (the
prefill runs without the language-model head, as the pipeline's does). A hybridized model's local heads see their
window and sinks throughout, context and continuation alike; a press's continuation keeps its own tokens.

The blocks: the first `blocks` non-overlapping runs of L tokens of WikiText-2's test split (`wiki.test.raw`, the
tokenizer's tokens without special ones)."""

import contextlib
import hashlib
import inspect
import json
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.records import write_whole

FILE = "continuation.json"  # OUT/pred/{layout}/{L}/continuation.json
BLOCKS = 8
CONTEXT_SHARE = 0.75
CHUNK = 16


def wikitext_blocks(tokenizer, text: Path, length: int, count: int) -> torch.Tensor:
    """(count, length) token ids: the first `count` non-overlapping blocks of `length` tokens of TEXT."""
    ids = tokenizer(text.read_text(encoding="utf-8"), add_special_tokens=False, verbose=False).input_ids
    if len(ids) < count * length:
        raise ValueError(f"{text} has {len(ids):,} tokens, fewer than {count} blocks of {length:,}")
    return torch.tensor(ids[: count * length]).view(count, length)


def context_tokens(length: int) -> int:
    return round(length * CONTEXT_SHARE)


def cache_keyword(model) -> str:
    """What the model's forward calls its cache: `cache` in the transformers hf_attn runs on, `past_key_values` in
    kvpress's older one (5.2)."""
    return "cache" if "cache" in inspect.signature(model.model.forward).parameters else "past_key_values"


@torch.inference_mode()
def continuation_nll(model, block: torch.Tensor, context: int, compressing: AbstractContextManager | None = None,
                     cache=None) -> float:  # fmt: skip
    """Summed negative log-likelihood (nats) of block[context + 1:], each token predicted by the continuation over
    the cache the prefill of block[:context] left (under `compressing`; CACHE: the cache to fill, else the model's
    own)."""
    ids, name = block[None].to(model.device), cache_keyword(model)
    with compressing or contextlib.nullcontext():
        cache = getattr(model.model(input_ids=ids[:, :context], **{name: cache}, use_cache=True), name)
    return continuation_read(model, ids, context, cache)


@torch.inference_mode()
def continuation_read(model, ids: torch.Tensor, context: int, cache) -> float:
    """Summed negative log-likelihood of ids[0, context + 1:] (IDS: (1, L) on the model's device), read CHUNK tokens
    a forward at their own positions over CACHE, which holds what the prefill of ids[:, :context] left."""
    name, nll = cache_keyword(model), 0.0
    for start in range(context, ids.shape[1] - 1, CHUNK):
        end = min(start + CHUNK, ids.shape[1] - 1)
        positions = torch.arange(start, end, device=model.device)[None]
        logits = model(input_ids=ids[:, start:end], **{name: cache}, position_ids=positions).logits
        nll += float(F.cross_entropy(logits[0].float(), ids[0, start + 1 : end + 1], reduction="sum"))
    return nll


def figures(nll: float, blocks: torch.Tensor) -> dict:
    """The continuation perplexity of summed NLL over BLOCKS, and what it counted."""
    context = context_tokens(blocks.shape[1])
    scored = blocks.shape[0] * (blocks.shape[1] - context - 1)
    return {"perplexity": math.exp(nll / scored), "nll": nll, "scored_tokens": scored, "blocks": blocks.shape[0],
            "block_tokens": blocks.shape[1], "context_tokens": context,
            "tokens_sha256": hashlib.sha256(blocks.numpy().tobytes()).hexdigest()}  # fmt: skip


def measure(model, blocks: torch.Tensor, compressing: Callable[[], AbstractContextManager | None] = lambda: None,
            new_cache: Callable[[], object] = lambda: None) -> dict:  # fmt: skip
    """The continuation perplexity over BLOCKS (a fresh `compressing()` and `new_cache()` per block) and what it
    counted."""
    context = context_tokens(blocks.shape[1])
    return figures(sum(continuation_nll(model, block, context, compressing(), new_cache()) for block in blocks), blocks)


def kept(path: Path, settings: dict) -> dict | None:
    """PATH's record where it was measured with SETTINGS (said on standard output), else None."""
    with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
        if (record := json.loads(path.read_text())).get("settings") == settings:
            print(f"{path}: perplexity {record['perplexity']:.2f}, kept", flush=True)
            return record
    return None


def write(path: Path, settings: dict, measured_figures: dict, run: dict) -> dict:
    """PATH's record, written whole: SETTINGS, the figures, then RUN (started, seconds, device, machine)."""
    record = {"settings": settings, **measured_figures, **run}
    write_whole(path, json.dumps(record, indent=1) + "\n")
    print(f"{path}: perplexity {record['perplexity']:.2f} in {record['seconds']:.1f} s", flush=True)
    return record


def measured(path: Path, settings: dict, measuring: Callable[[], dict], machine: Callable[[], dict],
             device: str) -> dict:  # fmt: skip
    """PATH's record where it was measured with SETTINGS, else `measuring()`'s figures with the settings, start,
    seconds, DEVICE and `machine()` before and after, written to PATH whole; says which on standard output."""
    if (record := kept(path, settings)) is not None:
        return record
    before, started, start = machine(), time.time(), time.perf_counter()
    measured_figures = measuring()
    return write(path, settings, measured_figures, {"started": started, "seconds": time.perf_counter() - start,
                                                    "device": device, "machine": {"before": before,
                                                                                  "after": machine()}})  # fmt: skip
