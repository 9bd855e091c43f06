"""What every layer of one forward reads alike, computed once by the trunk: `AttentionInputs` (masks, positions, the
cache's length, P and rotary tables), and the placing of keys by their index in the sequence (a static cache's
slots, sinks kept apart from their window) for masks and returned weights."""

from dataclasses import dataclass, field

import torch
from torch import nn

from .visibility_hf_attn import Visibility, window_overlay


@dataclass
class AttentionInputs:
    """Computed once per forward by the trunk, read by every layer.

    Tokens are indexed from the first one the cache has seen ("absolute" indices): the queries are `past_length`
    onwards. Positions count real tokens, so they differ from indices under left padding and restart in packed
    sequences. Positions are (B|1, ...) so that without padding the positional heads' queries and keys are one tensor
    for the whole batch.
    """

    key_mask: torch.Tensor | None  # (B, M) bool by absolute index: False at padding; None when nothing is padded
    pair_mask: torch.Tensor | None  # (B|1, 1, T, M) bool: a custom 4D mask, or the same-document pairs of packed rows
    past_length: int | torch.Tensor  # tokens before the queries; a tensor for static caches
    query_positions: torch.Tensor  # (B|1, T)
    key_positions: torch.Tensor  # (B|1, M): the position of every token
    keys_in_order: bool  # key j sits at position j for every sample: per-position tables are sliced, not gathered
    positional_encoding: nn.Module | None  # P: position ids -> rows (..., d_P), when the model has positional heads
    rotary: tuple[torch.Tensor, torch.Tensor] | None  # cos, sin (B|1, 1, T, D) at the query positions
    memo: dict = field(default_factory=dict)  # what every layer reads alike, made by the first

    def key_mask_for(self, visibility: Visibility, key_start, num_slots: int, num_queries: int, contiguous: bool):
        """What a kernel takes as `key_mask` for keys at absolute indices `key_start` onwards: the (B, S) padding mask
        of keys that end at the last query (`contiguous`: the kernel's own geometry), else the whole (B|1, 1, T, S)
        mask, the kind's visibility included (static caches' slots, custom 4D masks, packed sequences), made once
        per forward for every layer that asks for the same one."""
        if contiguous and self.pair_mask is None:
            return None if self.key_mask is None else self.key_mask[:, -num_slots:]
        # Listed indices follow from the cache's length, its first tokens and the kind's window: the same in every
        # layer of one forward for one visibility. Keyed without the tensor, which graph capture cannot compare.
        listed = isinstance(key_start, torch.Tensor) and key_start.dim() == 1
        key = ("whole_mask", visibility, "listed" if listed else key_start, num_slots, num_queries, contiguous)
        if key not in self.memo:
            self.memo[key] = self.whole_mask(visibility, key_start, num_slots, num_queries, contiguous)
        return self.memo[key]

    def whole_mask(self, visibility: Visibility, key_start, num_slots: int, num_queries: int, contiguous: bool):
        """(B|1, 1, T, S) bool: who sees whom among the queries and the keys at absolute indices `key_start` on (or
        at the indices `key_start` lists: sinks kept apart from their window)."""
        device = self.key_positions.device
        key_index = key_indices(key_start, num_slots, device)
        query_index = self.past_length + torch.arange(num_queries, device=device)
        if visibility.local_window is not None and (self.pair_mask is not None or visibility.sink_tokens):
            # Under a custom mask or packed documents index and position part ways (a shared prefix, a restart):
            # a local head sees the k previous positions, as it would in the sequences the mask stands for. Its
            # sinks are the first positions: each row's first real tokens under padding.
            mask = visibility.unwindowed.predicate(query_index[:, None], key_index[None, :])[None, None]  # (1,1,T,S)
            key_positions = self.positions_at(key_start, num_slots, contiguous)  # (B|1, S)
            if self.pair_mask is not None:
                near = window_overlay(visibility.local_window)(self.query_positions[:, :, None], key_positions[:, None])
            else:
                near = window_overlay(visibility.local_window)(query_index[:, None], key_index[None, :])[None]
            if visibility.sink_tokens:
                near = near | (key_positions < visibility.sink_tokens)[:, None, :]
            mask = mask & near[:, None]
        else:
            mask = visibility.predicate(query_index[:, None], key_index[None, :])[None, None]  # (1, 1, T, S)
        if self.key_mask is not None:
            columns, known = _columns(key_index, self.key_mask.shape[-1])
            mask = mask & (self.key_mask[:, columns] & known)[:, None, None, :]
        if self.pair_mask is not None:
            columns, known = _columns(key_index, self.pair_mask.shape[-1])
            mask = mask & self.pair_mask[..., columns] & known
        return mask

    def positional_rows(self, key_start, num_slots: int, num_positions: int) -> torch.Tensor:
        """(B|1, S) rows of P at the positions of a static cache's slots, made once per forward for every layer.
        Slots not yet filled lie beyond the tokens and are masked: their positions are only kept inside P's table."""
        key = ("positional_rows", key_start, num_slots)
        if key not in self.memo:
            positions = self.positions_at(key_start, num_slots, contiguous=False).clamp(max=num_positions - 1)
            self.memo[key] = self.positional_encoding(positions)
        return self.memo[key]

    def positions_at(self, key_start, num_slots: int, contiguous: bool) -> torch.Tensor:
        """(B|1, S) positions of the keys at absolute indices `key_start` onwards (or at those it lists)."""
        if contiguous:
            return self.key_positions[:, -num_slots:]
        key_index = key_indices(key_start, num_slots, self.key_positions.device)
        return self.key_positions[:, _columns(key_index, self.key_positions.shape[-1])[0]]


def key_indices(key_start, num_slots: int, device: torch.device) -> torch.Tensor:
    """(S,) absolute indices of `num_slots` keys from `key_start` on; `key_start` may list them already."""
    if isinstance(key_start, torch.Tensor) and key_start.dim() == 1:
        return key_start
    return key_start + torch.arange(num_slots, device=device)


def place_columns(weights: torch.Tensor, key_index: torch.Tensor, width: int) -> torch.Tensor:
    """(..., S) weights over keys at absolute indices `key_index` as (..., width), each in its key's column, 0 in
    the others (keys not kept, and the weights of empty slots, which lie beyond `width`)."""
    columns, known = _columns(key_index, width)
    placed = weights.new_zeros(*weights.shape[:-1], width)
    return placed.index_add(-1, columns, weights * known.to(weights.dtype))


def taken_columns(weights: torch.Tensor, key_index: torch.Tensor) -> torch.Tensor:
    """The inverse of `place_columns`: (..., S) from (..., width), 0 for keys beyond it."""
    columns, known = _columns(key_index, weights.shape[-1])
    return weights[..., columns] * known.to(weights.dtype)


def _columns(key_index: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Columns of a mask `width` wide to read for `key_index`, and whether each exists (a static cache's empty slots
    lie beyond the mask)."""
    return key_index.clamp(max=width - 1), key_index < width


__all__ = ["AttentionInputs", "key_indices", "place_columns", "taken_columns"]
