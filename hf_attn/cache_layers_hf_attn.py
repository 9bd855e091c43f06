"""The cache layers of one head kind, each a transformers cache layer: what `HeadKindLayer` (`cache_hf_attn`) holds
per kind of a decoder layer.

- `AppendingLayer`: every token, appended in place (global heads; positional heads' values);
- `WindowLayer`: the last k tokens (local heads), `SinkWindowLayer` also the first S (attention sinks);
- `StaticSinkWindowLayer`: the first S and the last k in fixed slots, for a static, compileable cache.
"""

import torch
from transformers.cache_utils import CacheLayerMixin, DynamicLayer, DynamicSlidingWindowLayer, StaticLayer

# Room added when a buffer of every past token fills up: an eighth of its tokens, at least this many.
MIN_GROWTH = 16


class AppendingLayer(DynamicLayer):
    """`DynamicLayer` that appends in place to a buffer with room to grow, so a decoding step writes its one token
    instead of copying every past token, as `torch.cat` does. `keys` and `values` stay views of the tokens held.

    While gradients are recorded, or under graph capture, it concatenates as `DynamicLayer` does: an in-place write
    would invalidate the earlier steps' graphs.
    """

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if torch.is_grad_enabled() or torch.compiler.is_compiling():
            return super().update(key_states, value_states)
        self.keys, self.values = _append(self.keys, key_states), _append(self.values, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        """Counted on the values: positional heads' keys are zero wide."""
        return self.values.shape[-2] if self.is_initialized and self.values.dim() > 1 else 0


def _append(kept: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """`kept` (a view of the first tokens of its buffer, or any tensor) followed by `new`, written in place when the
    buffer has room; a buffer grown geometrically otherwise."""
    used = kept.shape[-2] if kept.dim() == new.dim() else 0  # `DynamicLayer` starts from a 1-D empty tensor
    needed = used + new.shape[-2]
    buffer = kept._base if kept._base is not None else kept
    # Room only in a buffer that `kept` starts, whose tokens it reads in order, and not made by torch.inference_mode
    # outside it (such a tensor can only be written in it).
    has_room = (
        used > 0
        and buffer.dim() == kept.dim()
        and buffer.shape[:-2] == kept.shape[:-2]
        and buffer.shape[-2] >= needed
        and buffer.shape[-1] == kept.shape[-1]
        and kept.data_ptr() == buffer.data_ptr()
        and kept.stride() == buffer.stride()
        and not (buffer.is_inference() and not torch.is_inference_mode_enabled())
    )
    if not has_room:
        grown = new.new_empty(*new.shape[:-2], needed + max(MIN_GROWTH, needed // 8), new.shape[-1])
        if used:
            grown[..., :used, :] = kept
        buffer = grown
    buffer[..., used:needed, :] = new
    return buffer[..., :needed, :]


class WindowLayer(DynamicSlidingWindowLayer):
    """`DynamicSlidingWindowLayer` whose kept window owns its storage: a view would keep the whole prefill alive."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        keys, values = super().update(key_states, value_states)
        if not self.record_past:
            self.keys, self.values = self.keys.clone(), self.values.clone()
        return keys, values


class LayerOfLayers(CacheLayerMixin):
    """A cache layer made of other cache layers (`parts`): what transformers asks of the batch and the device is
    passed on to each."""

    parts: tuple[CacheLayerMixin, ...]

    def _each(self, method: str, *args) -> None:
        for part in self.parts:
            getattr(part, method)(*args)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._each("reorder_cache", beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._each("batch_repeat_interleave", repeats)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._each("batch_select_indices", indices)

    def reset(self) -> None:
        self._each("reset")

    def offload(self) -> None:
        self._each("offload")

    def prefetch(self) -> None:
        self._each("prefetch")


class SinkWindowLayer(LayerOfLayers):
    """Keeps the first `prefix_tokens` tokens (the attention sinks, and room for left padding before them) and a
    `WindowLayer` of the tokens after them: what a local head with sinks reads, a constant size at any context.

    `update` returns the kept prefix followed by the window's tokens, in order: every token while the window has
    not yet slid past the prefix, then the first and the last ones with a gap between. The mask transformers builds
    spans every token (`get_mask_sizes` is a whole layer's), so the attention function finds each kept token's column
    in it (`kept_columns`)."""

    is_sliding = False  # the mask must reach back to the first tokens
    is_compileable = False
    is_croppable = True

    def __init__(self, sink_tokens: int, sliding_window: int):
        self.prefix_tokens = sink_tokens
        self.prefix, self.window = DynamicLayer(), WindowLayer(sliding_window=sliding_window)
        self.parts = (self.prefix, self.window)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(prefix_tokens={self.prefix_tokens}, window={self.window.sliding_window})"

    @property
    def is_initialized(self) -> bool:
        return self.prefix.is_initialized

    @property
    def record_past(self) -> bool:
        return self.window.record_past

    @property
    def keys(self) -> torch.Tensor:
        return torch.cat([self.prefix.keys, self.window.keys], dim=-2)

    @property
    def values(self) -> torch.Tensor:
        return torch.cat([self.prefix.values, self.window.values], dim=-2)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        for part in self.parts:
            part.lazy_initialization(key_states, value_states)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        to_prefix = max(0, min(key_states.shape[-2], self.prefix_tokens - self.prefix.get_seq_length()))
        if to_prefix:
            self.prefix.update(key_states[..., :to_prefix, :], value_states[..., :to_prefix, :])
        keys, values = self.window.keys, self.window.values
        if to_prefix < key_states.shape[-2]:
            keys, values = self.window.update(key_states[..., to_prefix:, :], value_states[..., to_prefix:, :])
        return torch.cat([self.prefix.keys, keys], dim=-2), torch.cat([self.prefix.values, values], dim=-2)

    def kept_columns(self, num_queries: int) -> tuple[int, int]:
        """How many of the tokens `update` just returned for `num_queries` queries are the first ones, and how many
        the last ones."""
        first = self.prefix.get_seq_length()
        return first, min(self.get_seq_length() - first, self.window.sliding_window - 1 + num_queries)

    def has_gap(self, num_queries: int) -> bool:
        """Whether tokens lie between the first ones `update` returned and the last ones."""
        return sum(self.kept_columns(num_queries)) < self.get_seq_length()

    def kept_indices(self, num_queries: int, device: torch.device) -> torch.Tensor:
        """(S,) the index of every token `update` returned, counted from the first token."""
        first, last = self.kept_columns(num_queries)
        seen = self.get_seq_length()
        return torch.cat([torch.arange(first, device=device), torch.arange(seen - last, seen, device=device)])

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return self.prefix.get_seq_length() + self.window.get_seq_length()

    def get_max_length(self) -> int:
        return -1

    def activate_past_recording(self, **kwargs) -> None:
        self.window.activate_past_recording()

    def crop(self, tokens_to_remove: int) -> None:
        """Drops the last `-tokens_to_remove` tokens, from the window first (transformers' convention; a positive value,
        its older one, is the length to keep). 0 trims what the window recorded for a rollback."""
        seen = self.get_seq_length()
        remove = -tokens_to_remove if tokens_to_remove <= 0 else max(0, seen - tokens_to_remove)
        from_window = min(remove, self.window.get_seq_length())
        self.window.crop(-from_window)
        if remove > from_window:
            self.prefix.crop(from_window - remove)


# The index of a slot that holds no token: beyond every query, so causal order hides it, and beyond every mask.
NO_TOKEN = 2**62


class StaticSinkWindowLayer(StaticLayer):
    """The static, compileable cache of a local kind: `prefix_tokens` slots for the first tokens (the sinks, and
    room for left padding before them; 0 without sinks) and a ring of `window` slots for the last k tokens, written
    in turn. Its size is fixed whatever `max_cache_len`, and one slot smaller than transformers'
    `StaticSlidingWindowLayer`: the newest tokens are read from the update itself, not from a slot.

    `update` returns the kept tokens in order, then the new ones; `returned_index` gives each one's index (counted
    from the first token; `NO_TOKEN` for empty slots), all from the tensor counter, so a compiled decoding step
    guards on no Python number. The mask reaches back to the first token (`get_mask_sizes` is `StaticLayer`'s): the
    attention function takes its columns at those indices.

    For assisted decoding, `activate_past_recording(recurrent_states_to_keep=n)` before the first token adds n slots
    to the ring, so that `crop` can take back up to n tokens and still find the k before."""

    def __init__(self, max_cache_len: int, sink_tokens: int, window: int):
        super().__init__(max_cache_len=max_cache_len)
        self.prefix_tokens, self.window = sink_tokens, window
        self.rollback = 0  # tokens `crop` may take back
        self.ring = window  # slots after the first tokens, set when the buffers are made

    def __repr__(self) -> str:
        return f"{type(self).__name__}(prefix_tokens={self.prefix_tokens}, window={self.window})"

    @property
    def never_wraps(self) -> bool:
        return self.max_cache_len <= self.prefix_tokens + self.ring

    @property
    def is_croppable(self) -> bool:
        """While no token can have been written over (transformers' static window says the same), or with room kept
        for rolling back."""
        return self.never_wraps or self.rollback > 0

    def activate_past_recording(self, recurrent_states_to_keep: int | None = None, **kwargs) -> None:
        """Room for `crop` to take back `recurrent_states_to_keep` tokens, if asked before the buffers are made."""
        if recurrent_states_to_keep and not self.is_initialized:
            self.rollback = max(self.rollback, recurrent_states_to_keep)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        # A ring longer than the tokens the cache may hold after the first ones never wraps: it need not be kept.
        self.ring = min(self.window + self.rollback, max(1, self.max_cache_len - self.prefix_tokens))
        logical_length, self.max_cache_len = self.max_cache_len, self.prefix_tokens + self.ring
        try:
            super().lazy_initialization(key_states, value_states)
        finally:
            self.max_cache_len = logical_length

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.cumulative_length.clone()
        slots, _ = self.kept_slots(start)
        keys = torch.cat([self.keys[:, :, slots], key_states], dim=-2)
        values = torch.cat([self.values[:, :, slots], value_states], dim=-2)
        self.write(key_states, value_states, start)
        self.cumulative_length.add_(key_states.shape[-2])
        return keys, values

    def kept_slots(self, start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(P + ring,) the slots to read before the token at index `start`, in order, and the index of the token
        each holds (`NO_TOKEN` where none): the first P tokens, then those of the last `ring` before `start` that lie
        after them."""
        device = self.cumulative_length.device
        first = torch.arange(self.prefix_tokens, device=device)
        recent = start - self.ring + torch.arange(self.ring, device=device)
        slots = torch.cat([first, self.prefix_tokens + (recent - self.prefix_tokens) % self.ring])
        held = torch.cat(
            [torch.where(first < start, first, NO_TOKEN), torch.where(recent >= self.prefix_tokens, recent, NO_TOKEN)]
        )
        return slots, held

    def returned_index(self, num_new: int) -> torch.Tensor:
        """(P + ring + num_new,) the index of each token the last `update` of `num_new` tokens returned."""
        start = self.cumulative_length - num_new
        new = start + torch.arange(num_new, device=start.device)
        return torch.cat([self.kept_slots(start)[1], new])

    def write(self, key_states: torch.Tensor, value_states: torch.Tensor, start: torch.Tensor) -> None:
        """Each slot takes the newest of the new tokens meant for it (the first P tokens have a slot each, later
        token t the slot P + (t - P) mod ring), in place: one pass over the slots, whatever the number of tokens."""
        num_new, prefix, ring = key_states.shape[-2], self.prefix_tokens, self.ring
        device = start.device
        end = start + num_new  # one past the newest token
        first = torch.arange(prefix, device=device)
        newest = end - 1 - (end - 1 - prefix - torch.arange(ring, device=device)) % ring  # each ring slot's, < end
        token = torch.cat([first, torch.where(newest >= prefix, newest, -1)])  # -1: a first token's, not the ring's
        fresh = (token >= start) & (token < end)
        source = (token - start).clamp(0, num_new - 1)
        for kept, new in ((self.keys, key_states), (self.values, value_states)):
            kept.copy_(torch.where(fresh[:, None], new[:, :, source], kept))

    def crop(self, tokens_to_remove: int) -> None:
        if not (self.never_wraps or -self.rollback <= tokens_to_remove <= 0):
            raise RuntimeError(
                f"A static cache of {self.max_cache_len} tokens, whose local heads keep {self.prefix_tokens} first "
                f"and {self.ring} last tokens, can take back {self.rollback}, not {abs(tokens_to_remove)}: older ones "
                "are written over. Call `activate_past_recording(recurrent_states_to_keep=n)` on the cache before "
                "its first token, or use the dynamic cache."
            )
        super().crop(tokens_to_remove)
