"""The kernels of the three head kinds: global, local and positional attention, each as one function with its own
fast path. `head_kinds_hf_attn.py` says which kind runs on which.

Legend: B batch, H heads of one kind, T queries, S keys (S >= T: the last T keys are the queries' own positions),
D head dim, k = `local_window`, s = `sink_tokens`, P the positional encoding (positions x d_P). Query i sits at key
index i + S - T, unless `key_mask` is a whole (B|1, 1, T, S) mask, which then says everything.
Queries and keys may be wider or narrower than values (`content_qk_dim`); outputs take the values' width.

Who sees whom is a `Visibility`: a predicate on (query index, key index) built from small overlays. The reference
masks (padded batches, cached decoding) are built from it; the fast kernels never build a T x T mask. A row with
no visible key (position 0 under a strict causal mask, or a query whose window holds only padding) outputs zeros,
never NaN.
"""

import functools
from collections.abc import Callable, Iterator
from dataclasses import replace

import torch
import torch.nn.functional as F

from .visibility_hf_attn import Visibility, visibility_mask, window_overlay

# Above this many scores per query the chunked kernel beats one pass per offset (measured on CPU, T = 4096,
# batch 4, 12 heads, head dim 64: offsets 465 ms vs chunks 652 ms at k = 8, 818 vs 621 ms at k = 16).
MAX_OFFSETS_FOR_SHIFT_KERNEL = 12
# Queries per chunk in the blocked kernel: large enough for efficient matmuls, small enough to skip most of T x T.
MIN_CHUNK = 32
# Up to this many queries (a decoding step, a short draft), local heads run one SDPA over a whole (T x S) mask: fewer
# operations than a pass per key offset or the chunked kernel's bookkeeping.
MAX_QUERIES_FOR_ONE_MASK = 16


# --- shared pieces ---------------------------------------------------------------------------------------------


def masked_sdpa(q, k, v, mask: torch.Tensor, scale: float, dropout: float, enable_gqa: bool = False) -> torch.Tensor:
    """SDPA with a boolean mask; rows with no visible key give zeros on every backend (no NaN, no gradient).
    `enable_gqa`: fewer key/value heads than query heads, each read by as many consecutive query heads."""
    has_key = mask.any(dim=-1, keepdim=True)  # (B|1, 1|H, T, 1)
    # Unmask empty rows so no backend sees a fully masked row, then zero their output.
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~has_key, dropout_p=dropout, scale=scale,
                                         enable_gqa=enable_gqa)  # fmt: skip
    return out * has_key.to(out.dtype)


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim of `scores` where `mask`; all-hidden rows give all-zero weights."""
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)  # finite fill: no NaN in empty rows
    return scores.softmax(dim=-1) * mask.to(scores.dtype)


def masked_weights(q, k, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Explicit (B, H, T, S) weights, for `output_attentions` and cached decoding of short rows."""
    return masked_softmax(torch.matmul(q, k.transpose(-1, -2)).float() * scale, mask).to(q.dtype)


def masked_attention_with_weights(
    q, k, v, visibility: Visibility, key_mask: torch.Tensor | None, scale: float, dropout: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, T, D) output and the explicit (B, H, T, S) weights from the reference mask, for `output_attentions`."""
    weights = masked_weights(q, k, visibility_mask(visibility, q.shape[-2], key_mask, k.shape[-2], q.device), scale)
    return torch.matmul(F.dropout(weights, dropout), v), weights


def eager_attention(
    q, k, v, visibility: Visibility, key_mask: torch.Tensor | None, scale: float, dropout: float = 0.0
) -> torch.Tensor:
    """softmax(Q K^T) V written out over the reference mask: transformers' `attn_implementation="eager"`."""
    return masked_attention_with_weights(q, k, v, visibility, key_mask, scale, dropout)[0]


# --- global heads ----------------------------------------------------------------------------------------------


def global_attention(
    q, k, v, visibility: Visibility, key_mask: torch.Tensor | None, scale: float, dropout: float = 0.0
) -> torch.Tensor:
    """(B, H, T, D) content attention over every visible key, through SDPA.

    Without padding or cache the mask is implicit: inclusive causal is SDPA's `is_causal`, and strict causal is
    the same on sequences shifted by one (query n sees keys 0..n-1), with a zero row prepended for position 0.
    """
    num_queries, num_keys = q.shape[-2], k.shape[-2]
    if key_mask is None and num_queries == num_keys and visibility.is_causal:
        if visibility.attend_to_self:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout, scale=scale)
        shifted = F.scaled_dot_product_attention(
            q[:, :, 1:], k[:, :, :-1], v[:, :, :-1], is_causal=True, dropout_p=dropout, scale=scale
        )
        return torch.cat([shifted.new_zeros(*shifted.shape[:2], 1, shifted.shape[-1]), shifted], dim=2)
    if key_mask is None and num_queries == num_keys and visibility.attend_to_self:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scale)
    mask = visibility_mask(visibility, num_queries, key_mask, num_keys, q.device)
    return masked_sdpa(q, k, v, mask, scale, dropout)


@functools.cache
def _compiled_flex_attention() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_global_attention(
    q, k, v, visibility: Visibility, key_mask: torch.Tensor | None, scale: float, dropout: float = 0.0
) -> torch.Tensor:
    """(B, H, T, D) content attention through FlexAttention (`attn_implementation="flex_attention"`), whose block
    mask skips the blocks no query sees. Compiled, as transformers runs it, unless the model is being compiled.

    FlexAttention has no dropout, and PyTorch gives it no backward on CPU: train with it on a GPU.
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if dropout > 0:
        raise ValueError("`attn_implementation='flex_attention'` has no attention dropout: set `attn_pdrop=0`.")
    batch, num_queries, num_keys = q.shape[0], q.shape[-2], k.shape[-2]
    if key_mask is not None and key_mask.dim() == 4:
        whole = key_mask.expand(batch, -1, -1, -1)

        def mask_mod(b, h, q_idx, kv_idx):
            return whole[b, 0, q_idx, kv_idx]

    else:
        visible, query_start = visibility.predicate, num_keys - num_queries

        def mask_mod(b, h, q_idx, kv_idx):
            seen = visible(q_idx + query_start, kv_idx)
            return seen if key_mask is None else seen & key_mask[b, kv_idx]

    mask_batch = None if key_mask is None else batch
    block_mask = create_block_mask(mask_mod, mask_batch, None, num_queries, num_keys, device=q.device)
    run = flex_attention if torch.compiler.is_compiling() else _compiled_flex_attention()
    return run(q, k, v, block_mask=block_mask, scale=scale)


# --- local heads -----------------------------------------------------------------------------------------------


def local_attention(
    q, k, v, visibility: Visibility, key_mask: torch.Tensor | None, scale: float, dropout: float = 0.0
) -> torch.Tensor:
    """(B, H, T, D) content attention over the k nearest keys (and the first s), in O(T * (k + s)): one pass per
    key offset for a few offsets without sinks, else chunks of queries (one small mask for a few queries). A whole
    4D mask goes to SDPA. Fewer key/value heads than query heads (grouped-query attention) are read in place by
    SDPA, never copied per head."""
    grouped = k.shape[1] != q.shape[1]
    if key_mask is not None and key_mask.dim() == 4:
        return masked_sdpa(q, k, v, key_mask, scale, dropout, enable_gqa=grouped)
    few_offsets = not visibility.sink_tokens and len(visibility.offsets()) <= MAX_OFFSETS_FOR_SHIFT_KERNEL
    if few_offsets and not grouped:
        return local_attention_by_offsets(q, k, v, visibility, key_mask, scale, dropout)[0]
    if q.shape[-2] <= MAX_QUERIES_FOR_ONE_MASK:
        mask = visibility_mask(visibility, q.shape[-2], key_mask, k.shape[-2], q.device)
        return masked_sdpa(q, k, v, mask, scale, dropout, enable_gqa=grouped)
    return local_attention_by_chunks(q, k, v, visibility, key_mask, scale, dropout)


@functools.cache
def _compiled_local_attention() -> Callable:
    return torch.compile(local_attention)


def compiled_local_attention(
    q, k, v, visibility: Visibility, key_mask: torch.Tensor | None, scale: float, dropout: float = 0.0
) -> torch.Tensor:
    """`local_attention` through torch.compile (`local_attention_impl="compiled"`), for training and prefill.

    The eager kernel runs instead while decoding (a query or two per step: nothing to gain from compiling), inside
    a model that is itself being compiled (its trace covers the kernel), and where torch.compile is unsupported.
    """
    decoding = q.shape[-2] != k.shape[-2]
    if decoding or torch.compiler.is_compiling() or not torch._dynamo.is_dynamo_supported():
        return local_attention(q, k, v, visibility, key_mask, scale, dropout)
    return _compiled_local_attention()(q, k, v, visibility, key_mask, scale, dropout)


class BandedAttention(torch.autograd.Function):
    """Attention over a few key offsets per query, with a hand-written backward.

    Autograd of the same few lines allocates a fresh (B, H, T, D) tensor for every product and pads the keys and
    values; on CPU those allocations and copies (page faults on large blocks), not the arithmetic, dominate. Here
    each offset works on slices: queries `lo:hi` meet keys `key_lo:key_lo + hi - lo` (`spans[j]`), products go
    to one reused buffer and results accumulate in place. `visible` (B|1, n, T) says which of those keys exist
    and are not padding; `keep` is the dropout mask.
    """

    @staticmethod
    def forward(ctx, q, k, v, visible, spans, scale, keep):
        products = torch.empty(q.numel(), dtype=q.dtype, device=q.device)  # reused by every offset
        scores = q.new_zeros(len(spans), *q.shape[:-1])  # (n, B, H, T)
        for j, (lo, hi, key_lo) in enumerate(spans):
            scores[j, :, :, lo:hi] = _row_dot(q[:, :, lo:hi], k[:, :, key_lo : key_lo + hi - lo], products)
        mask = visible[:, :, None].movedim(1, 0)  # (n, B|1, 1, T)
        weights = masked_softmax((scores.float() * scale).movedim(0, -1), mask.movedim(0, -1)).movedim(-1, 0)
        weights = weights.to(q.dtype)
        applied = weights if keep is None else weights * keep
        out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
        for j, (lo, hi, key_lo) in enumerate(spans):
            out[:, :, lo:hi].addcmul_(applied[j, :, :, lo:hi, None], v[:, :, key_lo : key_lo + hi - lo])
        ctx.save_for_backward(q, k, v, weights, keep)
        ctx.spans, ctx.scale = spans, scale
        ctx.mark_non_differentiable(weights)
        return out, weights

    @staticmethod
    def backward(ctx, grad_out, _grad_weights):
        q, k, v, weights, keep = ctx.saved_tensors
        spans = ctx.spans
        grad_out = grad_out.contiguous()
        applied = weights if keep is None else weights * keep
        products = torch.empty(grad_out.numel(), dtype=q.dtype, device=q.device)  # (B, H, T, D_v) products
        grad_applied = torch.zeros_like(weights)  # (n, B, H, T)
        grad_v = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
        for j, (lo, hi, key_lo) in enumerate(spans):
            keys = slice(key_lo, key_lo + hi - lo)
            grad_applied[j, :, :, lo:hi] = _row_dot(grad_out[:, :, lo:hi], v[:, :, keys], products)
            grad_v[:, :, keys].addcmul_(applied[j, :, :, lo:hi, None], grad_out[:, :, lo:hi])
        grad_weights = grad_applied if keep is None else grad_applied * keep
        # softmax backward: dS = W * (dW - sum_j W dW), then the scale
        grad_scores = weights * (grad_weights - (weights * grad_weights).sum(0, keepdim=True)) * ctx.scale
        grad_q = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        grad_k = torch.zeros(k.shape, dtype=k.dtype, device=k.device)
        for j, (lo, hi, key_lo) in enumerate(spans):
            keys = slice(key_lo, key_lo + hi - lo)
            grad_q[:, :, lo:hi].addcmul_(grad_scores[j, :, :, lo:hi, None], k[:, :, keys])
            grad_k[:, :, keys].addcmul_(grad_scores[j, :, :, lo:hi, None], q[:, :, lo:hi])
        return grad_q, grad_k, grad_v, None, None, None, None


def _row_dot(a: torch.Tensor, b: torch.Tensor, products: torch.Tensor) -> torch.Tensor:
    """(..., D) x (..., D) -> (...): the product written into the flat buffer `products`, then summed.

    Compiled, the product and the sum fuse into one kernel, and the buffer would only get in the way.
    """
    if torch.compiler.is_compiling():
        return (a * b).sum(-1)
    return torch.mul(a, b, out=products[: a.numel()].view(a.shape)).sum(-1)


def local_attention_by_offsets(
    q, k, v, visibility: Visibility, key_mask: torch.Tensor | None, scale: float, dropout: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """One pass per visible offset: the score of query i with key i - offset, softmax over the offsets.

    Returns the output, the (B, H, T, n) weights and the n offsets they belong to.
    """
    num_queries, num_keys = q.shape[-2], k.shape[-2]
    query_start = num_keys - num_queries  # key index of query 0
    offsets = visibility.offsets()
    spans = []  # per offset: the queries [lo, hi) whose key i + query_start - offset exists, and the first key
    for offset in offsets:
        lo = max(0, offset - query_start)
        hi = max(lo, min(num_queries, num_keys - query_start + offset))
        spans.append((lo, hi, lo + query_start - offset))
    key_index = torch.arange(num_queries, device=q.device) + query_start  # (T,)
    key_index = key_index - torch.tensor(offsets, device=q.device)[:, None]  # (n, T)
    visible = ((key_index >= 0) & (key_index < num_keys))[None]  # (1, n, T)
    if key_mask is not None:
        visible = visible & key_mask.bool()[:, key_index.clamp(0, num_keys - 1)]  # (B, n, T)
    keep = None
    if dropout > 0:
        keep_shape = (len(offsets), *q.shape[:-1])
        keep = (torch.rand(keep_shape, device=q.device) >= dropout).to(q.dtype) / (1 - dropout)
    out, weights = BandedAttention.apply(q, k, v, visible, spans, scale, keep)
    return out, weights.movedim(0, -1), offsets


def local_attention_by_chunks(
    q, k, v, visibility: Visibility, key_mask: torch.Tensor | None, scale: float, dropout: float = 0.0
) -> torch.Tensor:
    """Chunks of C queries, one SDPA each over the keys the chunk can see: its own, the k before it (and after it,
    not causal) and the first s real keys (sinks) where those lie outside that span.

    Each chunk's keys and values are joined from pieces of one split of `k` and `v` (and the sinks, gathered once),
    one (B|1, 1, C, s + span) mask serves every head, and fewer key/value heads than query heads are read in place
    (grouped-query attention): beyond the output no tensor grows with T per head, the cost is O(T * (C + 2k + s)),
    and autograd joins the gradients of the pieces once rather than once per chunk. Query i sits at key index
    i + S - T; `key_mask` (B, S) marks real keys, and under it the sinks are each row's first real keys.
    """
    heads, num_queries = q.shape[1], q.shape[-2]
    num_keys, device = k.shape[-2], q.device
    query_start = num_keys - num_queries  # key index of query 0
    window = visibility.local_window
    left, right = window, (0 if visibility.is_causal else window)
    chunk = max(MIN_CHUNK, window)  # >= left and right: a chunk's span reaches only into its neighbours
    in_window = replace(visibility, sink_tokens=0).predicate
    real = None if key_mask is None else key_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
    if visibility.sink_tokens:
        sink_index, sink_real = first_keys(real, visibility.sink_tokens, num_keys, device)
        sink_keys, sink_values = (gather_keys(x, sink_index) for x in (k, v))
    spans = zip(q.split(chunk, dim=2), *(chunk_spans(x, query_start, chunk, left, right) for x in (k, v)), strict=True)
    outputs, bands, joined = [], {}, None
    for c, (queries, (start, keys), (_, values)) in enumerate(spans):
        lo = query_start + c * chunk  # key index of the chunk's first query
        shape = (lo - start, queries.shape[-2], keys.shape[-2])  # where the queries sit among the keys
        if shape not in bands:  # the window depends on distances alone: chunks alike share one band
            bands[shape] = window_band(in_window, *shape, device)
        mask = bands[shape]  # (1, 1, C, span)
        if real is not None:
            mask = mask & real[..., start : start + keys.shape[-2]]
        if visibility.sink_tokens:  # seen where the query may see them and its window does not hold them
            q_idx = torch.arange(lo, lo + queries.shape[-2], device=device)[:, None]  # (C, 1)
            seen = visibility.unwindowed.predicate(q_idx, sink_index) & ~window_overlay(window)(q_idx, sink_index)
            seen = seen & sink_real  # (B|1, 1, C, s)
            rows = max(seen.shape[0], mask.shape[0])
            mask = torch.cat([seen.expand(rows, -1, -1, -1), mask.expand(rows, -1, -1, -1)], dim=-1)
            keys, values = torch.cat([sink_keys, keys], dim=-2), torch.cat([sink_values, values], dim=-2)
        out = masked_sdpa(queries, keys, values, mask, scale, dropout, enable_gqa=k.shape[1] != heads)
        if torch.is_grad_enabled():
            outputs.append(out)
            continue
        # Without autograd each chunk's output goes straight into one tensor: no list of them beside it.
        if joined is None:
            joined = out.new_empty(*out.shape[:2], num_queries, out.shape[-1])
        joined[:, :, c * chunk : c * chunk + out.shape[-2]] = out
    return torch.cat(outputs, dim=2) if outputs else joined


def window_band(in_window, first_query: int, num_queries: int, num_keys: int, device: torch.device) -> torch.Tensor:
    """(1, 1, C, span) bool: which of `num_keys` keys in a row each of `num_queries` queries (the first at key
    `first_query`) sees through its window. Counted in relative indices of the smallest integer type that holds them,
    so that the differences the predicate takes stay small."""
    small = torch.int16 if first_query + num_queries + num_keys < 2**15 else torch.int32
    q_idx = torch.arange(first_query, first_query + num_queries, dtype=small, device=device)[:, None]
    return in_window(q_idx, torch.arange(num_keys, dtype=small, device=device)[None, :])[None, None]


def chunk_spans(
    x: torch.Tensor, query_start: int, chunk: int, left: int, right: int
) -> Iterator[tuple[int, torch.Tensor]]:
    """Per chunk of queries, in turn, the first key index and the keys (or values) of `x` (B, H, S, D) it can reach:
    up to `left` before the chunk, the chunk's own, up to `right` after it (each <= `chunk`). Pieces of one split of
    `x` (a slice of the whole `x` per chunk would cost autograd a whole-size gradient per chunk), joined one chunk at
    a time (all at once they would copy the keys twice over)."""
    earlier, own = x[:, :, :query_start], x[:, :, query_start:].split(chunk, dim=2)
    for c, part in enumerate(own):
        before = own[c - 1] if c else earlier
        before = before[:, :, before.shape[-2] - min(left, before.shape[-2]) :]
        after = own[c + 1][:, :, :right] if c + 1 < len(own) else part[:, :, :0]
        start = query_start + c * chunk - before.shape[-2]
        yield start, torch.cat([before, part, after], dim=2) if before.shape[-2] or after.shape[-2] else part


def first_keys(real: torch.Tensor | None, count: int, num_keys: int, device: torch.device):
    """The index of each row's first `count` real keys (B|1, 1, 1, count), and whether each exists (fewer real keys
    than `count`); without `real` (B, 1, 1, S), keys 0..count-1."""
    count = min(count, num_keys)
    if real is None:
        index = torch.arange(count, device=device)[None, None, None]
        return index, torch.ones_like(index, dtype=torch.bool)
    position = torch.arange(num_keys, device=device)
    candidates = torch.where(real & (real.cumsum(-1) <= count), position, num_keys)
    index = candidates.topk(count, dim=-1, largest=False).values  # ascending
    return index.clamp(max=num_keys - 1), index < num_keys


def gather_keys(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(B, H, n, D): the keys or values of `x` (B, H, S, D) at each row's `index` (B|1, 1, 1, n)."""
    if index.shape[0] == 1:
        return x[:, :, index[0, 0, 0]]
    return x.gather(2, index[:, 0, 0, None, :, None].expand(-1, x.shape[1], -1, x.shape[-1]))


# --- positional heads ------------------------------------------------------------------------------------------


# Two routes compute the same attention. Shared weights: the (1, H, T, S) weights once for the whole batch, then one
# product with every sample's values; it keeps H x T x S floats for the backward. Fused: SDPA on P's queries and keys
# expanded over the batch, B times the query-key work (what GPT-2's heads pay) but no T x S tensor. One layer, 8
# heads, head dim 32, forward + backward, one CPU thread: shared 19 ms against fused 63 ms at T = 9 and batch 1000
# (Paper A), 87 against 160 ms at T = 512 and batch 8, but 275 against 91 ms at T = 1024 and batch 1, 4.6 s against
# 0.75 s at T = 4096. Shared weights win while the batch exceeds T / 128 and their tensor stays small; whole models
# agree (`python -m benchmarks.positional_routes`).
SHARED_WEIGHTS_MIN_BATCH_PER_QUERY = 1 / 128
MAX_SHARED_WEIGHTS_ELEMENTS = 2**24  # 64 MiB of fp32 per layer


def positional_weights(
    pq: torch.Tensor, pk: torch.Tensor, visibility: Visibility, key_mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """Paper A: softmax((P Wq)(P Wk)^T / sqrt(d)). `pq` (1|B, H, T, d), `pk` (1|B, H, S, d).

    Depends on positions only, so without padding it is one (1, H, T, S) tensor for the whole batch. When no row can
    be empty (inclusive masks, no padding), a plain masked softmax saves two T x S passes.
    """
    mask = visibility_mask(visibility, pq.shape[-2], key_mask, pk.shape[-2], pq.device)
    scores = torch.matmul(pq * scale, pk.transpose(-1, -2)).float()
    if visibility.attend_to_self and key_mask is None:
        return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return masked_softmax(scores, mask)


def apply_positional_weights(weights: torch.Tensor, v: torch.Tensor, dropout: float = 0.0) -> torch.Tensor:
    """(B, H, T, D): input-independent weights (1|B, H, T, S) applied to the data's values.

    Weights shared by the batch multiply all samples' values at once, (H, T, S) @ (H, S, B * D): one product per
    head instead of a broadcast that copies the weights B times, and their gradient comes summed over the batch.
    Dropout draws a mask per sample, so it expands the weights first.
    """
    weights = weights.to(v.dtype)
    batch, heads, num_keys, dim = v.shape
    if dropout > 0:
        return torch.matmul(F.dropout(weights.expand(batch, -1, -1, -1), p=dropout), v)
    if weights.shape[0] != 1 or batch == 1:
        return torch.matmul(weights, v)
    folded = v.permute(1, 2, 0, 3).reshape(heads, num_keys, batch * dim)  # (H, S, B * D)
    return torch.bmm(weights[0], folded).view(heads, -1, batch, dim).permute(2, 0, 1, 3)


def positional_attention_with_weights(
    pq, pk, v, visibility: Visibility, key_mask: torch.Tensor | None, scale: float, dropout: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The shared-weights route: the (B, H, T, D) output and the (1|B, H, T, S) weights it applied."""
    weights = positional_weights(pq, pk, visibility, key_mask, scale)
    return apply_positional_weights(weights, v, dropout), weights


def shared_weights_positional_attention(
    pq, pk, v, visibility: Visibility, key_mask: torch.Tensor | None, scale: float, dropout: float = 0.0
) -> torch.Tensor:
    """(B, H, T, D) through the weights, formed once for the batch (`positional_attention_impl="shared_weights"`)."""
    return positional_attention_with_weights(pq, pk, v, visibility, key_mask, scale, dropout)[0]


def fused_positional_attention(
    pq, pk, v, visibility: Visibility, key_mask: torch.Tensor | None, scale: float, dropout: float = 0.0
) -> torch.Tensor:
    """(B, H, T, D) through SDPA on P's queries and keys, never forming the T x S weights
    (`positional_attention_impl="fused"`). Expanding over the batch is a view; autograd sums the gradient back."""
    batch = v.shape[0]
    pq, pk = pq.expand(batch, -1, -1, -1), pk.expand(batch, -1, -1, -1)
    return global_attention(pq, pk, v, visibility, key_mask, scale, dropout)


def shared_weights_pay_off(pq: torch.Tensor, pk: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the shared-weights route beats the fused one at this shape (measured above)."""
    weights_batch, heads, num_queries, _ = pq.shape
    if weights_batch * heads * num_queries * pk.shape[-2] > MAX_SHARED_WEIGHTS_ELEMENTS:
        return False
    return v.shape[0] > num_queries * SHARED_WEIGHTS_MIN_BATCH_PER_QUERY


def positional_attention(
    pq, pk, v, visibility: Visibility, key_mask: torch.Tensor | None, scale: float, dropout: float = 0.0
) -> torch.Tensor:
    """(B, H, T, D) positional attention by the faster route for this shape (`positional_attention_impl="auto"`).

    `pq` (1|B, H, T, d) and `pk` (1|B, H, S, d) are P's queries and keys: one row for the batch unless padding
    shifts positions per sample. Values `v` (B, H, S, D) come from the data.
    """
    if shared_weights_pay_off(pq, pk, v):
        return shared_weights_positional_attention(pq, pk, v, visibility, key_mask, scale, dropout)
    return fused_positional_attention(pq, pk, v, visibility, key_mask, scale, dropout)
