"""The decoding cache, built of transformers' own cache layers: per decoder layer, one layer per head kind, keeping
only what that kind needs, as its `HEAD_KINDS` entry says.

- global heads: every key and value (`DynamicLayer`, or `StaticLayer` for `cache_implementation="static"`);
- local heads: the last `local_window` keys and values (`DynamicSlidingWindowLayer` / `StaticSlidingWindowLayer`;
  their windows count the query itself, so k-local heads get a window of k + 1);
- positional heads: values only (their keys are zero wide), since their weights come from positions.

So a local-only model decodes with a cache of constant size, and what transformers builds on its layers works as for
any model: `crop` and past recording (assisted, prompt-lookup and speculative decoding), beam reordering, static and
compileable caches, `early_initialization` for export. A hybridized model whose own architecture slides a window over
every head of a layer (Mistral; Qwen2 and Qwen3 with `use_sliding_window`) keeps no more than that window of any kind.
"""

import torch
from transformers import Cache
from transformers.cache_utils import (
    CacheLayerMixin,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    StaticLayer,
    StaticSlidingWindowLayer,
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


def kind_layer(
    kind: HeadKind, config: HfAttnConfig, max_cache_len: int | None, model_window: int | None = None
) -> CacheLayerMixin:
    """The transformers layer that keeps what `kind` needs: dynamic, or static when `max_cache_len` is given. Its
    window counts the current token, as transformers' `sliding_window` does: the kind's k + 1, or the model's own
    where that is shorter."""
    window = kind.window(config)  # past tokens the kind's queries see
    if model_window is not None:
        window = model_window - 1 if window is None else min(window, model_window - 1)
    if max_cache_len is None:
        return AppendingLayer() if window is None else WindowLayer(sliding_window=window + 1)
    if window is None:
        return StaticLayer(max_cache_len=max_cache_len)
    return StaticSlidingWindowLayer(max_cache_len=max_cache_len, sliding_window=window + 1)


def model_window(config, layer_idx: int) -> int | None:
    """The sliding window a hybridized model's own architecture puts on every head of the layer (Mistral's; Qwen2's
    and Qwen3's upper layers with `use_sliding_window`), counting the current token; None for full attention."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if window is None or (layer_types is not None and layer_types[layer_idx] != "sliding_attention"):
        return None
    return window


class HeadKindLayer(CacheLayerMixin):
    """One decoder layer's cache: a transformers cache layer per head kind present (`by_kind`), tensors
    (B, H_kind, tokens, D). Everything transformers asks of a layer is passed on to each of them.

    The heads are the config's `kv_head_layout`: an hf_attn model's heads, or, in a model given kinds by
    `hf_attn.hybridize`, its key/value heads (several query heads may read one)."""

    def __init__(self, config: HfAttnConfig, layer_idx: int, max_cache_len: int | None = None):
        layout = config.kv_head_layout[layer_idx]
        self.layout = layout
        window = model_window(config, layer_idx)
        self.by_kind = {kind.name: kind_layer(kind, config, max_cache_len, window) for kind in kinds_in(layout)}
        self.caches_keys = {kind.name: "keys" in kind.cached for kind in kinds_in(layout)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={type(v).__name__}' for k, v in self.by_kind.items())})"

    @property
    def first(self) -> CacheLayerMixin:
        return next(iter(self.by_kind.values()))

    def update_kind(self, kind: HeadKind, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Stores the new tokens of `kind`'s heads; returns the keys and values its queries see, and the index (in
        tokens since the start) of the first of them: transformers' `kv_offset`, 0 unless a window has slid."""
        layer = self.by_kind[kind.name]
        _, key_start = layer.get_mask_sizes(keys.shape[-2])
        if not self.caches_keys[kind.name]:
            keys = keys[..., :0]  # positional heads take their keys from positions
        return *layer.update(keys, values), key_start

    def is_contiguous(self, kind: HeadKind) -> bool:
        """Whether `update_kind` returns exactly the tokens from its `key_start` to the newest (dynamic layers), not
        a fixed number of slots, some of them empty (static layers)."""
        return not isinstance(self.by_kind[kind.name], StaticLayer)

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
        values each kind's heads see, {kind: (B, H_kind, tokens, D)}, for `hf_attn.hybrid.hybrid_attention`."""
        keys, values = self.split(key_states), self.split(value_states)
        seen = {
            name: layer.update(keys[name] if self.caches_keys[name] else keys[name][..., :0], values[name])
            for name, layer in self.by_kind.items()
        }
        return {name: k for name, (k, _) in seen.items()}, {name: v for name, (_, v) in seen.items()}

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

    def _each(self, method: str, *args) -> None:
        for layer in self.by_kind.values():
            getattr(layer, method)(*args)

    def activate_past_recording(self, **kwargs) -> None:
        """Every kind keeps what `crop` may need again. `Cache` passes options meant for linear-attention layers
        (transformers >= 5.25: `recurrent_states_to_keep`); attention kinds keep no recurrent state, so none apply."""
        for layer in self.by_kind.values():
            if hasattr(layer, "activate_past_recording"):
                layer.activate_past_recording()

    def crop(self, tokens_to_remove: int) -> None:
        self._each("crop", tokens_to_remove)

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


class HfAttnCache(Cache):
    """`Cache` for hf_attn models and hybridized ones: dynamic, or, for hf_attn models, static and compileable with
    `max_cache_len` (what `cache_implementation="static"` makes). `generate` and the model make it themselves; a
    user may too."""

    def __init__(self, config: HfAttnConfig, max_cache_len: int | None = None):
        layers = len(config.kv_head_layout)
        super().__init__(layers=[HeadKindLayer(config, i, max_cache_len) for i in range(layers)])

    def memory_bytes(self) -> int:
        """Bytes held by every cached tensor, room to grow included, for benchmarks and tests of the cache's size."""
        storages = {
            t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for layer in self.layers
            for t in layer.tensors().values()
        }
        return sum(storages.values())


__all__ = ["HfAttnCache", "HeadKindLayer", "AppendingLayer", "WindowLayer", "kind_layer"]
