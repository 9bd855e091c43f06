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
from transformers.cache_utils import CacheLayerMixin, StaticLayer

from .cache_layers_hf_attn import (
    NO_TOKEN,
    AppendingLayer,
    LayerOfLayers,
    SinkWindowLayer,
    StaticSinkWindowLayer,
    WindowLayer,
)
from .configuration_hf_attn import HfAttnConfig
from .head_kinds_hf_attn import HeadKind, kinds_in
from .positions_hf_attn import tracing

# The entry of the keys `HeadKindLayer.update` returns from a static cache: per kind, the index of each key it returned
# (a `StaticSinkWindowLayer`'s), or None where each slot is its token's index (a `StaticLayer`'s).
KEY_INDEX = "hf_attn_key_index"


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

    def every_kind(self, attribute: str) -> bool:
        """Whether every kind's layer has `attribute`: the layer is initialized, compileable, ... only if all are."""
        return all(getattr(layer, attribute) for layer in self.by_kind.values())

    is_initialized = property(lambda self: self.every_kind("is_initialized"))
    is_compileable = property(lambda self: self.every_kind("is_compileable"))
    is_croppable = property(lambda self: self.every_kind("is_croppable"))
    is_sliding = property(lambda self: self.every_kind("is_sliding"))

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


class GenerateWithHfAttnCache:
    """For models whose heads keep different tokens (hf_attn's and hybridized ones): `generate`'s cache, made as for
    any model, then replaced by an `HfAttnCache` that keeps of each key/value head what its query heads read, static
    with the same length when `generate` made a `StaticCache` (`cache_implementation="static"`)."""

    # Who the refusal of other caches names, e.g. "hf_attn models".
    cache_users: str

    def _prepare_cache_for_generation(self, generation_config, model_kwargs: dict, *args, **kwargs) -> None:
        super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        made = model_kwargs.get("cache")
        if made is None or isinstance(made, HfAttnCache) or getattr(made, "_is_user_defined", False):
            return
        if not getattr(self.config, "is_causal", True):  # a bidirectional model reruns the whole sequence every step
            del model_kwargs["cache"]
            return
        if type(made) not in (DynamicCache, StaticCache) or made.offloading:
            raise ValueError(
                f"`cache_implementation`={generation_config.cache_implementation!r} is not supported by "
                f"{self.cache_users}; allowed: None or 'dynamic' (the default), 'static'."
            )
        max_cache_len = made.get_max_length() if isinstance(made, StaticCache) else None
        model_kwargs["cache"] = HfAttnCache(self.config, max_cache_len=max_cache_len)
        if generation_config.is_assistant:
            # as transformers asks of the caches it makes: room for the drafts a verification may reject
            model_kwargs["cache"].activate_past_recording(
                recurrent_states_to_keep=generation_config.num_assistant_tokens
            )

    def init_continuous_batching(self, generation_config=None, continuous_batching_config=None, workload_hints=None):
        """transformers' continuous batching (`generate_batch`, `transformers serve --continuous-batching`) with a
        paged cache that keeps of each key/value head what its query heads read (`hf_attn.serving`)."""
        try:
            from hf_attn.serving.batching import init_continuous_batching
        except ImportError as error:  # remote code, without hf_attn installed
            raise ImportError(f"Continuous batching of {self.cache_users} needs the hf_attn package") from error
        return init_continuous_batching(self, generation_config, continuous_batching_config, workload_hints)


def adopted_cache(cache, config: HfAttnConfig) -> HfAttnCache:
    """Another model's kind of cache, e.g. PEFT's prefix of virtual tokens (a `DynamicCache`, or a legacy tuple of
    (keys, values) per layer, (B, n_head, tokens, D)), taken in as the past of an `HfAttnCache`."""
    layers = cache if isinstance(cache, (tuple, list)) else [(layer.keys, layer.values) for layer in cache.layers]
    if not layers or layers[0][0] is None or layers[0][0].shape[-2] == 0:
        raise ValueError(
            f"`cache` must be an HfAttnCache (`generate` and the model make one; or `HfAttnCache(model.config)`), "
            f"got an empty {type(cache).__name__}."
        )
    if config.uses_positional_heads:
        raise ValueError(
            "A cache of past keys and values (e.g. PEFT prefix tuning) cannot be taken by positional heads: their "
            "weights come from positions, not keys, so virtual tokens would only shift every position. Global "
            "and local heads take one; use LoRA or prompt tuning for models with positional heads."
        )
    widths = {config.content_qk_dim, config.n_embd // config.n_head}
    if len(layers) != config.n_layer or any(k.shape[1] != config.n_head for k, _ in layers):
        raise ValueError(f"`cache` must hold {config.n_layer} layers of {config.n_head} heads.")
    if len(widths) > 1:
        raise ValueError("A foreign cache needs `content_qk_dim` equal to the values' width (n_embd / n_head).")
    adopted = HfAttnCache(config)
    for layer, (keys, values) in zip(adopted.layers, layers, strict=True):
        layer.update(keys, values)
    return adopted


def cache_to_use(cache, use_cache: bool | None, config: HfAttnConfig, training: bool) -> tuple[Cache | None, bool]:
    """The cache a forward reads and writes (one is made when asked for; another model's kind is adopted), and
    whether it is returned."""
    use_cache = use_cache if use_cache is not None else (config.use_cache and not training)
    if use_cache and not config.is_causal:
        use_cache = False  # a bidirectional model's past depends on the future: recompute instead
    if cache is not None and not isinstance(cache, HfAttnCache):
        cache = adopted_cache(cache, config)
    if use_cache and cache is None:
        cache = HfAttnCache(config)
    return cache, use_cache


def past_and_mask(cache: HfAttnCache | None, attention_mask, length: int) -> tuple[int | torch.Tensor, object]:
    """How many tokens are cached, and the 2D mask over the cache's columns: a static cache's every slot (as
    `generate` widens it), checked to cover the cached and new tokens otherwise."""
    past_length = cache.get_seq_length() if cache is not None else 0
    if isinstance(past_length, torch.Tensor):  # a static layer's own counter, which its updates move in place
        past_length = past_length.clone()
    elif past_length == 0 and cache is not None:
        cache.make_room_for_padding(attention_mask)
    static = cache is not None and cache.is_compileable
    attention_mask = widened_to_slots(attention_mask, cache)
    checked = attention_mask is not None and not (static or tracing())
    if checked and attention_mask.shape[-1] != past_length + length:
        raise ValueError(
            f"`attention_mask` must cover the {past_length} cached and {length} new tokens, "
            f"got {attention_mask.shape[-1]} columns."
        )
    return past_length, attention_mask


def widened_to_slots(attention_mask, cache: Cache | None):
    """A 2D mask widened with zeros to a static cache's every slot, as `generate` passes it (one shape at every
    step, so that compiled decoding compiles once); any other mask, or cache, leaves it as it is."""
    if attention_mask is None or attention_mask.dim() != 2 or cache is None or not cache.is_compileable:
        return attention_mask
    return torch.nn.functional.pad(attention_mask, (0, cache.get_max_length() - attention_mask.shape[-1]))


__all__ = [
    "NO_TOKEN",
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
    "adopted_cache",
    "GenerateWithHfAttnCache",
]
