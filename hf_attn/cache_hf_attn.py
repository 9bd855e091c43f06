"""The decoding cache, built of transformers' own cache layers: per decoder layer, one layer per head kind, keeping
only what that kind needs, as its `HEAD_KINDS` entry says.

- global heads: every key and value (`DynamicLayer`, or `StaticLayer` for `cache_implementation="static"`);
- local heads: the last `local_window` keys and values, and the first `sink_tokens` (`DynamicSlidingWindowLayer`,
  whose window counts the query itself, so k-local heads get a window of k + 1, or `SinkWindowLayer` with sinks;
  `StaticSinkWindowLayer`, k slots and one per sink, for a static cache);
- positional heads: values only (their keys are zero wide), since their weights come from positions.

So a local-only model decodes with a cache of constant size, and what transformers builds on its layers works as for
any model: `crop` and past recording (assisted, prompt-lookup and speculative decoding), beam reordering, static and
compileable caches, `early_initialization` for export. A hybridized model whose own architecture slides a window over
every head of a layer (Mistral; Qwen2 and Qwen3 with `use_sliding_window`) keeps no more than that window of any kind.
"""

import torch
from transformers import Cache, DynamicCache, StaticCache
from transformers.cache_utils import (
    CacheLayerMixin,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    StaticLayer,
)

from .configuration_hf_attn import HfAttnConfig
from .head_kinds_hf_attn import HeadKind, kinds_in

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
# The entry of the keys `HeadKindLayer.update` returns from a static cache: per kind, the index of each key it returned
# (a `StaticSinkWindowLayer`'s), or None where each slot is its token's index (a `StaticLayer`'s).
KEY_INDEX = "hf_attn_key_index"


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


def kind_layer(
    kind: HeadKind, config: HfAttnConfig, max_cache_len: int | None, model_window: int | None = None
) -> CacheLayerMixin:
    """The transformers layer that keeps what `kind` needs: dynamic, or static when `max_cache_len` is given. Its
    window counts the current token, as transformers' `sliding_window` does: the kind's k + 1, or the model's own
    where that is shorter. A kind with sinks keeps them too, apart from its window (where the model's own window
    does not hide them). A static cache keeps both in fixed slots (`StaticSinkWindowLayer`)."""
    window = kind.window(config)  # past tokens the kind's queries see
    sinks = kind.sinks(config) if model_window is None else 0
    if model_window is not None:
        window = model_window - 1 if window is None else min(window, model_window - 1)
    if max_cache_len is None:
        if window is None:
            return AppendingLayer()
        return SinkWindowLayer(sinks, window + 1) if sinks else WindowLayer(sliding_window=window + 1)
    if window is None:
        return StaticLayer(max_cache_len=max_cache_len)
    return StaticSinkWindowLayer(max_cache_len, sinks, window)


def model_window(config, layer_idx: int) -> int | None:
    """The sliding window a hybridized model's own architecture puts on every head of the layer (Mistral's; Qwen2's
    and Qwen3's upper layers with `use_sliding_window`), counting the current token; None for full attention."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if window is None or (layer_types is not None and layer_types[layer_idx] != "sliding_attention"):
        return None
    return window


class HeadKindLayer(LayerOfLayers):
    """One decoder layer's cache: a transformers cache layer per head kind present (`by_kind`), tensors
    (B, H_kind, tokens, D). Everything transformers asks of a layer is passed on to each of them.

    The heads are the config's `kv_head_layout`: an hf_attn model's heads, or, in a model given kinds by
    `hf_attn.hybridize`, its key/value heads (several query heads may read one)."""

    def __init__(self, config: HfAttnConfig, layer_idx: int, max_cache_len: int | None = None):
        layout = config.kv_head_layout[layer_idx]
        self.layout = layout
        window = model_window(config, layer_idx)
        self.by_kind = {kind.name: kind_layer(kind, config, max_cache_len, window) for kind in kinds_in(layout)}
        self.parts = tuple(self.by_kind.values())
        self.caches_keys = {kind.name: "keys" in kind.cached for kind in kinds_in(layout)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={type(v).__name__}' for k, v in self.by_kind.items())})"

    @property
    def first(self) -> CacheLayerMixin:
        return next(iter(self.by_kind.values()))

    def update_kind(self, kind: HeadKind, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Stores the new tokens of `kind`'s heads; returns the keys and values its queries see, and the index (in
        tokens since the start) of the first of them: transformers' `kv_offset`, 0 unless a window has slid. Sinks
        kept apart from a window that has moved on, and a static local cache's slots, return every key's index
        instead, a (S,) tensor."""
        layer = self.by_kind[kind.name]
        num_queries = keys.shape[-2]
        _, key_start = layer.get_mask_sizes(num_queries)
        if not self.caches_keys[kind.name]:
            keys = keys[..., :0]  # positional heads take their keys from positions
        keys, values = layer.update(keys, values)
        if isinstance(layer, SinkWindowLayer) and layer.has_gap(num_queries):
            key_start = layer.kept_indices(num_queries, keys.device)
        elif isinstance(layer, StaticSinkWindowLayer):
            key_start = layer.returned_index(num_queries)
        return keys, values, key_start

    def is_contiguous(self, kind: HeadKind) -> bool:
        """Whether the last `update_kind` returned exactly the tokens from its `key_start` to the newest, not a fixed
        number of slots, some of them empty (static layers), nor sinks apart from their window."""
        layer = self.by_kind[kind.name]
        return not isinstance(layer, StaticLayer) and not (isinstance(layer, SinkWindowLayer) and layer.has_gap(0))

    # --- transformers' layer interface --------------------------------------------------------------------------

    def split(self, states: torch.Tensor) -> dict[str, torch.Tensor]:
        """Layout-order (B, n_head, T, D) states, per kind."""
        heads = {name: [h for h, kind in enumerate(self.layout) if kind == name] for name in self.by_kind}
        return {name: states[:, indices] for name, indices in heads.items()}

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        keys, values = self.split(key_states), self.split(value_states)
        for name, layer in self.by_kind.items():
            layer.lazy_initialization(keys[name] if self.caches_keys[name] else keys[name][..., :0], values[name])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Layout-order (B, n_head, T, D) states, stored per kind: a hybridized model's new tokens, or the past of an
        hf_attn model from outside (a PEFT prefix; its own attention calls `update_kind`). Returns the keys and the
        values each kind's heads see, {kind: (B, H_kind, tokens, D)}, for `hf_attn.hybrid.hybrid_attention`; from a
        static cache the keys also place themselves under `KEY_INDEX`."""
        keys, values = self.split(key_states), self.split(value_states)
        seen = {
            name: layer.update(keys[name] if self.caches_keys[name] else keys[name][..., :0], values[name])
            for name, layer in self.by_kind.items()
        }
        keys_seen = {name: k for name, (k, _) in seen.items()}
        if self.is_compileable:
            num_new = key_states.shape[-2]
            keys_seen[KEY_INDEX] = {
                name: layer.returned_index(num_new) if isinstance(layer, StaticSinkWindowLayer) else None
                for name, layer in self.by_kind.items()
            }
        return keys_seen, {name: v for name, (_, v) in seen.items()}

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.first.get_mask_sizes(query_length)

    def get_seq_length(self) -> int:
        return self.first.get_seq_length()

    def get_max_length(self) -> int:
        return max(layer.get_max_length() for layer in self.by_kind.values())

    @property
    def is_initialized(self) -> bool:
        return all(layer.is_initialized for layer in self.by_kind.values())

    @property
    def is_compileable(self) -> bool:
        return all(layer.is_compileable for layer in self.by_kind.values())

    @property
    def is_croppable(self) -> bool:
        return all(layer.is_croppable for layer in self.by_kind.values())

    @property
    def is_sliding(self) -> bool:
        return all(layer.is_sliding for layer in self.by_kind.values())

    @property
    def record_past(self) -> bool:
        return any(getattr(layer, "record_past", False) for layer in self.by_kind.values())

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every kept tensor by `<kind>_<what>`, e.g. `local_keys`: what each kind caches, as `HEAD_KINDS` says."""
        return {
            f"{name}_{what}": getattr(layer, what)
            for name, layer in self.by_kind.items()
            if layer.is_initialized
            for what in ("keys", "values")
            if what == "values" or self.caches_keys[name]
        }

    def activate_past_recording(self, **kwargs) -> None:
        """Every kind keeps what `crop` may need again. Of what `Cache` passes (transformers >= 5.25), static windows
        read `recurrent_states_to_keep`: the most tokens a `crop` takes back."""
        for layer in self.by_kind.values():
            if hasattr(layer, "activate_past_recording"):
                layer.activate_past_recording(**kwargs)

    def crop(self, tokens_to_remove: int) -> None:
        self._each("crop", tokens_to_remove)


def left_padding(attention_mask: torch.Tensor | dict | None) -> int:
    """The most padding tokens before any row's first real one: in a (B, T) mask, or in the last query's row of a
    boolean 4D one (what `generate` gives a static cache's first step; from a dict of them, the full-attention one).
    Under graph capture, which cannot read the mask on the host (`torch.compile` of a whole `forward`, prefill
    included), as many as there could be: T."""
    if isinstance(attention_mask, dict):
        attention_mask = attention_mask.get("full_attention", next(iter(attention_mask.values()), None))
    if attention_mask is None or attention_mask.dim() not in (2, 4):
        return 0
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return attention_mask.shape[-1]
    if attention_mask.dim() == 4:  # the last query sees every real token before it
        last_row = attention_mask[:, 0, -1]
        attention_mask = last_row if last_row.dtype == torch.bool else last_row == 0  # additive: 0 where visible
    return int((attention_mask.long().cumsum(-1) == 0).sum(-1).max())


class HfAttnCache(Cache):
    """`Cache` for hf_attn models and hybridized ones: dynamic, or static and compileable with `max_cache_len` (what
    `cache_implementation="static"` makes). `generate` and the model make it themselves; a user may too.

    `HfAttnCache(config)` is an `HfAttnDynamicCache`, a transformers `DynamicCache`, and `HfAttnCache(config,
    max_cache_len=N)` an `HfAttnStaticCache`, a `StaticCache`, so that code asking `isinstance` treats them as
    transformers' own; both are made of `HeadKindLayer`s."""

    def __new__(cls, config: HfAttnConfig | None = None, max_cache_len: int | None = None, **kwargs):
        if cls is HfAttnCache:
            cls = HfAttnDynamicCache if max_cache_len is None else HfAttnStaticCache
        return super().__new__(cls)

    def __init__(self, config: HfAttnConfig, max_cache_len: int | None = None):
        layers = [HeadKindLayer(config, i, max_cache_len) for i in range(len(config.kv_head_layout))]
        Cache.__init__(self, layers=layers)  # not `DynamicCache`'s or `StaticCache`'s: they make their own layers
        # The first tokens local heads with sinks read: the sinks, and the left padding before them once known.
        self.sink_tokens = self.first_tokens = getattr(config, "sink_tokens", 0)

    def make_room_for_padding(self, attention_mask: torch.Tensor | None) -> None:
        """Before the first token: local heads with sinks keep the left padding before them too (their sinks are
        each row's first real tokens), in layers that keep sinks apart from a window."""
        if not self.sink_tokens:
            return
        self.first_tokens = self.sink_tokens + left_padding(attention_mask)  # reads the mask on the host
        for layer in self.layers:
            for kind in layer.parts:
                if isinstance(kind, SinkWindowLayer | StaticSinkWindowLayer):
                    kind.prefix_tokens = self.first_tokens

    def memory_bytes(self) -> int:
        """Bytes held by every cached tensor, room to grow included, for benchmarks and tests of the cache's size."""
        storages = {
            t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for layer in self.layers
            for t in layer.tensors().values()
        }
        return sum(storages.values())


class HfAttnDynamicCache(HfAttnCache, DynamicCache):
    """`HfAttnCache` without `max_cache_len`: a `DynamicCache` of `HeadKindLayer`s."""

    def __iter__(self):
        """(keys, values, None) per layer, as `DynamicCache` yields them, where each layer's kinds keep the same
        tokens and widths (every head's kind keeps every token, as global heads do); otherwise no one tensor holds
        a layer's keys."""
        for layer in self.layers:
            if set(layer.by_kind) != {"global"} or isinstance(layer.first, WindowLayer):
                raise TypeError(
                    "An HfAttnCache whose layers keep different tokens per head kind (windows, values only) has no "
                    "(keys, values) tensor per layer; read `cache.layers[i].tensors()`."
                )
            yield layer.first.keys, layer.first.values, None


class HfAttnStaticCache(HfAttnCache, StaticCache):
    """`HfAttnCache` with `max_cache_len`: a `StaticCache` of `HeadKindLayer`s, compileable."""


__all__ = [
    "HfAttnCache",
    "HfAttnDynamicCache",
    "HfAttnStaticCache",
    "HeadKindLayer",
    "AppendingLayer",
    "WindowLayer",
    "SinkWindowLayer",
    "StaticSinkWindowLayer",
    "KEY_INDEX",
    "kind_layer",
]
