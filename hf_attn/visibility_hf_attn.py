"""Who sees whom: a `Visibility` per head kind, a predicate on (query index, key index) built from small overlays,
and the reference masks built from it (padded batches, cached decoding, sinks counted along the mask). The fast
kernels of `attention_hf_attn.py` never build a T x T mask; the references and the tests do.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

Predicate = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def causal_overlay(attend_to_self: bool) -> Predicate:
    """Keys at or before the query (inclusive) or strictly before it (strict)."""
    if attend_to_self:
        return lambda q_idx, kv_idx: kv_idx <= q_idx
    return lambda q_idx, kv_idx: kv_idx < q_idx


def not_self_overlay() -> Predicate:
    return lambda q_idx, kv_idx: kv_idx != q_idx


def window_overlay(local_window: int) -> Predicate:
    """Keys at most `local_window` positions away from the query, on either side."""
    return lambda q_idx, kv_idx: (q_idx - kv_idx).abs() <= local_window


def sink_overlay(sink_tokens: int) -> Predicate:
    """The first `sink_tokens` keys of the sequence (attention sinks)."""
    return lambda q_idx, kv_idx: kv_idx < sink_tokens


def or_masks(*predicates: Predicate) -> Predicate:
    def either(q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        visible = predicates[0](q_idx, kv_idx)
        for predicate in predicates[1:]:
            visible = visible | predicate(q_idx, kv_idx)
        return visible

    return either


def and_masks(*predicates: Predicate) -> Predicate:
    def combined(q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        visible = torch.ones(torch.broadcast_shapes(q_idx.shape, kv_idx.shape), dtype=torch.bool, device=q_idx.device)
        for predicate in predicates:
            visible = visible & predicate(q_idx, kv_idx)
        return visible

    return combined


@dataclass(frozen=True)
class Visibility:
    """Which keys a head kind sees. `local_window=None` means global.

    Causal, k = 2 (■ visible, ⬚ hidden), rows are queries 0..4, columns keys 0..4:

        global strict   global inclusive   2-local strict   2-local inclusive
        ⬚ ⬚ ⬚ ⬚ ⬚       ■ ⬚ ⬚ ⬚ ⬚          ⬚ ⬚ ⬚ ⬚ ⬚        ■ ⬚ ⬚ ⬚ ⬚
        ■ ⬚ ⬚ ⬚ ⬚       ■ ■ ⬚ ⬚ ⬚          ■ ⬚ ⬚ ⬚ ⬚        ■ ■ ⬚ ⬚ ⬚
        ■ ■ ⬚ ⬚ ⬚       ■ ■ ■ ⬚ ⬚          ■ ■ ⬚ ⬚ ⬚        ■ ■ ■ ⬚ ⬚
        ■ ■ ■ ⬚ ⬚       ■ ■ ■ ■ ⬚          ⬚ ■ ■ ⬚ ⬚        ⬚ ■ ■ ■ ⬚
        ■ ■ ■ ■ ⬚       ■ ■ ■ ■ ■          ⬚ ⬚ ■ ■ ⬚        ⬚ ⬚ ■ ■ ■

    The empty first row of a strict mask outputs zeros. 1-local strict sees only the previous token. Without
    `is_causal` the pattern is mirrored to the right of the diagonal.

    A local head may also see the first `sink_tokens` tokens of its sequence, wherever the query is: the attention
    sinks of StreamingLLM (Xiao et al., 2023), where pretrained heads park the attention they do not spend. Without
    padding the first s tokens are keys 0..s-1; under left padding or packing they are the first s tokens the mask
    lets a query see (`local_visible`). 2-local inclusive with 1 sink, queries 0..5:

        ■ ⬚ ⬚ ⬚ ⬚ ⬚
        ■ ■ ⬚ ⬚ ⬚ ⬚
        ■ ■ ■ ⬚ ⬚ ⬚
        ■ ■ ■ ■ ⬚ ⬚
        ■ ⬚ ■ ■ ■ ⬚
        ■ ⬚ ⬚ ■ ■ ■
    """

    is_causal: bool
    attend_to_self: bool
    local_window: int | None = None
    sink_tokens: int = 0

    @property
    def unwindowed(self) -> "Visibility":
        """What the head would see without its window: the causal order (or not) and the self switch alone."""
        return Visibility(self.is_causal, self.attend_to_self)

    @property
    def predicate(self) -> Predicate:
        overlays = []
        if self.is_causal:
            overlays.append(causal_overlay(self.attend_to_self))
        elif not self.attend_to_self:
            overlays.append(not_self_overlay())
        if self.local_window is not None and self.sink_tokens:
            overlays.append(or_masks(window_overlay(self.local_window), sink_overlay(self.sink_tokens)))
        elif self.local_window is not None:
            overlays.append(window_overlay(self.local_window))
        return and_masks(*overlays)

    def offsets(self) -> list[int]:
        """Local heads: the visible `query - key` distances, nearest first."""
        k = self.local_window
        candidates = range(0, k + 1) if self.is_causal else range(-k, k + 1)
        nearest_first = sorted(candidates, key=lambda offset: (abs(offset), offset))
        return [offset for offset in nearest_first if offset != 0 or self.attend_to_self]


def visibility_mask(
    visibility: Visibility, num_queries: int, key_mask: torch.Tensor | None, num_keys: int, device: torch.device
) -> torch.Tensor:
    """Reference (B or 1, 1, T, S) boolean mask: the predicate plus key padding. A 4D `key_mask` is that whole mask
    already (static caches' slots, custom masks, packed sequences: see `AttentionInputs.key_mask_for`)."""
    if key_mask is not None and key_mask.dim() == 4:
        return key_mask
    kv_idx = torch.arange(num_keys, device=device)
    q_idx = kv_idx[num_keys - num_queries :, None]
    if key_mask is None or not visibility.sink_tokens:
        mask = visibility.predicate(q_idx, kv_idx[None, :])[None, None]  # (1, 1, T, S)
        return mask if key_mask is None else mask & key_mask[:, None, None, :].bool()  # (B, 1, T, S)
    # Under padding the sinks are the first real keys of each row, not the first keys.
    key_mask = key_mask.bool()
    real_before = key_mask.cumsum(-1) - 1  # (B, S): real keys before each key
    in_window = replace(visibility, sink_tokens=0).predicate(q_idx, kv_idx[None, :])[None, None]  # (1, 1, T, S)
    sinks = visibility.unwindowed.predicate(q_idx, kv_idx[None, :]) & (real_before < visibility.sink_tokens)[:, None]
    return (in_window | sinks[:, None]) & key_mask[:, None, None, :]


def local_visible(visible: torch.Tensor, visibility: Visibility) -> torch.Tensor:
    """(B|1, H|1, T, S) bool: of the keys a query may see (`visible`, inclusive of the query itself, its last key),
    the `local_window` nearest before it and the first `sink_tokens`, both counted along the mask. Needs no key's
    index or position, so it holds for a static cache's slots, a cache that keeps sinks apart from its window, left
    padding and packed sequences alike."""
    visible = visible.bool()
    up_to_here = visible.cumsum(-1, dtype=torch.int32)  # visible keys from the first to here (one pass, no flips)
    from_query = up_to_here[..., -1:] - up_to_here + visible  # visible keys from here to the last: 1 at the query
    seen = from_query <= visibility.local_window + 1
    if visibility.sink_tokens:
        seen = seen | (up_to_here <= visibility.sink_tokens)
    if not visibility.attend_to_self:
        seen = seen & (from_query > 1)
    return visible & seen
