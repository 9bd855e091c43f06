"""Per-head global and k-local attention in other transformers decoders: Llama, Qwen2, Qwen3, Mistral, Gemma 3 and
GPT-2.

`hybridize(model, ...)` gives a loaded model per-head kinds with nothing else of its architecture changed: its
config becomes a registered `hf_attn_<family>` type (the family's config plus `head_layout`, `local_window`,
`attend_to_self`), and its attention modules run `hybrid_attention`, registered in transformers'
`AttentionInterface`, which splits each layer's query heads by kind:

- global heads attend as the model always did (SDPA over the mask transformers built);
- local heads see only the `local_window` previous tokens (and themselves, with `attend_to_self`), and the first
  `sink_tokens` tokens of the sequence (attention sinks).

With grouped-query attention several query heads read one key/value head. `HfAttnCache` keeps every token of a
key/value head that some global query head reads, and only the sinks and the last `local_window` tokens of one that
only local heads read: the layout's `kv_head_layout`; static and compileable with `max_cache_len` (what
`cache_implementation="static"` makes). Any other cache works too (transformers' `StaticCache`, or one a user
passes): it keeps what it would for the unmodified model, and local heads find their window in the mask transformers
builds for it.

A model saved after `hybridize` loads with its Auto class once hf_attn is imported, and with
`trust_remote_code=True` where hf_attn is not installed: `save_pretrained` copies this file and the flat siblings it
imports beside the weights, and `config.auto_map` names each hybrid type, bound in this file under its class name.
A model loaded from a GGUF file (its weights unpacked to floats) leaves its GGUF quantizer behind here, so that it
saves and trains as any float model.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
import transformers
from transformers import (
    Gemma3TextConfig,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen3Config,
)
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

from .attention_hf_attn import (
    Visibility,
    global_attention,
    local_attention,
    local_visible,
    masked_sdpa,
    masked_weights,
    visibility_mask,
)
from .attention_inputs_hf_attn import place_columns
from .cache_hf_attn import KEY_INDEX, HfAttnCache, model_window
from .modeling_hf_attn import CardSharing, unsupported_attention

HYBRID_ATTENTION = "hf_attn_hybrid"  # its name in transformers' attention and mask interfaces
# The keyword argument that asks `hybrid_attention` for its weights: the families pass unknown keyword arguments down
# to the attention function, but GPT-2 drops `output_attentions` on the way.
RETURN_WEIGHTS = "hf_attn_return_weights"
# The keyword argument telling `hybrid_attention` how many first tokens an `HfAttnCache` keeps for local heads with
# sinks: the sinks, and the left padding before them.
SINK_PREFIX = "hf_attn_sink_prefix"
KINDS = ("global", "local")
# Up to this many queries (a decoding step, a short draft), local heads run SDPA over their T + k keys with a band
# mask rather than the banded kernel's pass per key offset.
MAX_QUERIES_FOR_SDPA = 16
# What each Auto class loads, by the suffix of the family's class name.
HEADS = {
    "AutoModel": "Model",
    "AutoModelForCausalLM": "ForCausalLM",
    "AutoModelForSequenceClassification": "ForSequenceClassification",
    "AutoModelForTokenClassification": "ForTokenClassification",
    "AutoModelForQuestionAnswering": "ForQuestionAnswering",
}


def family_classes(prefix: str, **renamed: str) -> dict[str, type]:
    """A family's model classes by Auto class, as transformers names them (`renamed`: the exceptions). Heads
    transformers lacks for the family are left out (Gemma 3 has no token classification or question answering)."""
    names = {auto: renamed.get(auto, prefix + suffix) for auto, suffix in HEADS.items()}
    return {auto: getattr(transformers, name) for auto, name in names.items() if hasattr(transformers, name)}


# The families `hybridize` takes: their config type and the model classes it gives per-head kinds, by Auto class.
FAMILIES: dict[str, tuple[type, dict[str, type]]] = {
    "llama": (LlamaConfig, family_classes("Llama")),
    "qwen2": (Qwen2Config, family_classes("Qwen2")),
    "mistral": (MistralConfig, family_classes("Mistral")),
    "qwen3": (Qwen3Config, family_classes("Qwen3")),
    "gemma3_text": (Gemma3TextConfig, family_classes("Gemma3Text", AutoModelForCausalLM="Gemma3ForCausalLM")),
    "gpt2": (GPT2Config, family_classes("GPT2", AutoModelForCausalLM="GPT2LMHeadModel")),
}


# --- which head is which ---------------------------------------------------------------------------------------


class LayerHeads:
    """One layer's query heads by kind (`kinds`, in head order) and the key/value heads they read: query head h reads
    key/value head h // (query heads per key/value head), as transformers' `repeat_kv` has it. Everything is worked
    out once, here, into plain attributes, which graph capture reads as constants."""

    def __init__(
        self, kinds: Sequence[str], num_key_value_heads: int, local_window: int, attend_to_self: bool, sink_tokens: int
    ):
        self.kinds, self.local_window, self.sink_tokens = tuple(kinds), local_window, sink_tokens
        group_size = len(self.kinds) // num_key_value_heads
        groups = [self.kinds[g * group_size : (g + 1) * group_size] for g in range(num_key_value_heads)]
        # Per key/value head: "global" (every token kept) when a global query head reads it, else "local".
        self.kv_kinds = tuple("global" if "global" in group else "local" for group in groups)
        # Query heads, and key/value heads in the order `HfAttnCache` keeps them, per kind present.
        self.heads = {kind: [h for h, k in enumerate(self.kinds) if k == kind] for kind in KINDS if kind in self.kinds}
        self.kv_heads = {
            kind: [g for g, k in enumerate(self.kv_kinds) if k == kind] for kind in KINDS if kind in self.kv_kinds
        }
        # Per query kind, for each of its heads: the kind of key/value head it reads and its index among the kind's.
        position = {g: (kind, i) for kind, heads in self.kv_heads.items() for i, g in enumerate(heads)}
        self.sources = {kind: [position[h // group_size] for h in heads] for kind, heads in self.heads.items()}
        self.every_source = [position[h // group_size] for h in range(len(self.kinds))]  # the same, in head order
        self.pure_groups = all(len(set(group)) == 1 for group in groups)  # no group read by heads of both kinds
        # The permutation that puts outputs computed kind by kind back in head order.
        computed = [h for heads in self.heads.values() for h in heads]
        self.order = sorted(range(len(computed)), key=computed.__getitem__)
        # What a local head sees: the `local_window` previous tokens, itself with `attend_to_self`, and the first
        # `sink_tokens`.
        self.visibility = Visibility(True, attend_to_self, local_window, sink_tokens)


def layer_heads(config, layer_idx: int) -> LayerHeads:
    """A layer's heads. Where the model's own architecture slides a window over the layer (Mistral, Gemma 3's
    sliding layers), its mask hides the first tokens from every head: local heads get no sinks there."""
    sinks = config.sink_tokens if model_window(config, layer_idx) is None else 0
    return LayerHeads(config.head_layout[layer_idx], num_key_value_heads(config), config.local_window,
                      config.attend_to_self, sinks)  # fmt: skip


def num_key_value_heads(config) -> int:
    """GPT-2 has one key/value head per query head and no field saying so."""
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


# --- the attention function ------------------------------------------------------------------------------------


def hybrid_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs):
    """A hybridized layer's attention, as transformers' attention interface calls it: query (B, H, T, D); key and
    value (B, H_kv, S, D), or, from an `HfAttnCache`, {kind: (B, H_kv of that kind, S or fewer, D)}, newest last;
    the mask transformers built (None when causal order says it all, else a boolean (B|1, 1, T, S)).
    Returns (B, T, H, D), and with `output_attentions` the (B, H, T, S) weights, else None."""
    heads: LayerHeads = module.hf_attn_heads
    placed = key.pop(KEY_INDEX, None) if isinstance(key, dict) else None  # a static `HfAttnCache`'s keys
    # Keys known to end at the newest token: a dynamic `HfAttnCache`'s, or any that come without a mask (causal order
    # then says it all). Other caches' (a static cache's slots, empty ones after the newest) come with a mask that
    # places them.
    newest_last = placed is None and (isinstance(key, dict) or attention_mask is None)
    keys, values = by_kv_kind(key, heads), by_kv_kind(value, heads)
    if kwargs.get(RETURN_WEIGHTS):
        if placed is None and isinstance(key, dict) and heads.sink_tokens:  # sinks kept apart from the window
            prefix = kwargs.get(SINK_PREFIX, heads.sink_tokens)
            placed, attention_mask = first_and_last_index(keys, attention_mask, prefix, query.shape[-2])
        if placed is not None:
            keys, values, attention_mask = in_token_order(keys, values, attention_mask, placed, query.shape[-2])
        return attention_with_weights(query, keys, values, attention_mask, heads, scaling, dropout)
    if placed is not None:
        return placed_attention(module, query, keys, values, attention_mask, placed, scaling, dropout)
    if "local" not in heads.heads:  # the model's own attention, exactly: transformers' SDPA function
        return ALL_ATTENTION_FUNCTIONS["sdpa"](
            module, query, keys["global"], values["global"], attention_mask, dropout=dropout, scaling=scaling
        )
    outputs = []
    if "global" in heads.heads:
        outputs.append(global_heads(module, query, keys, values, attention_mask, scaling, dropout))
    if newest_last and heads.sink_tokens:
        prefix = kwargs.get(SINK_PREFIX, heads.sink_tokens)
        outputs.append(local_heads_with_sinks(query, keys, values, attention_mask, heads, scaling, dropout, prefix))
    elif newest_last:
        outputs.append(local_heads(query, keys, values, attention_mask, heads, scaling, dropout))
    else:
        outputs.append(local_heads_by_mask(query, keys, values, attention_mask, heads, scaling, dropout))
    out = torch.cat(outputs, dim=1)[:, heads.order]
    return out.transpose(1, 2), None


def global_heads(module, query, keys: dict, values: dict, attention_mask, scaling: float, dropout: float):
    """(B, H_global, T, D): the global heads over every key. Where no key/value group mixes kinds, the global heads
    are whole groups of the cache's global key/value heads, and transformers' SDPA function runs them as the model
    would (grouped-query attention without copying keys); otherwise each head gets a copy of its keys and values."""
    heads: LayerHeads = module.hf_attn_heads
    query = query[:, heads.heads["global"]]
    if heads.pure_groups:
        out, _ = ALL_ATTENTION_FUNCTIONS["sdpa"](
            module, query, keys["global"], values["global"], attention_mask, dropout=dropout, scaling=scaling
        )
        return out.transpose(1, 2)
    k, v = per_head(keys, heads.sources["global"]), per_head(values, heads.sources["global"])
    return global_attention(query, k, v, Visibility(True, True), attention_mask, scaling, dropout)


def local_heads(query, keys: dict, values: dict, attention_mask, heads: LayerHeads, scaling: float, dropout: float):
    """(B, H_local, T, D): the local heads over the newest T + `local_window` keys at most, all a query can see."""
    query, sources = query[:, heads.heads["local"]], heads.sources["local"]
    length = min(query.shape[-2] + heads.local_window, *(keys[kind].shape[-2] for kind, _ in sources))
    k, v = per_head(keys, sources, length), per_head(values, sources, length)
    return local_attention(query, k, v, heads.visibility, local_mask(attention_mask, heads, query, k), scaling, dropout)


def local_mask(attention_mask, heads: LayerHeads, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """Local heads' mask over the keys they read (the newest ones): None for the banded kernel when causal order says
    it all and the queries are many; else a whole mask with their window in it, the model's mask too if it has one.
    A decoding step's few queries run faster as one small SDPA than as a pass per key offset."""
    num_queries, num_keys = q.shape[-2], k.shape[-2]
    if attention_mask is None and num_queries > MAX_QUERIES_FOR_SDPA:
        return None
    window = visibility_mask(heads.visibility, num_queries, None, num_keys, q.device)
    return window if attention_mask is None else attention_mask[..., -num_keys:].bool() & window


def local_heads_with_sinks(
    query, keys: dict, values: dict, attention_mask, heads: LayerHeads, scaling: float, dropout: float, prefix: int
) -> torch.Tensor:
    """(B, H_local, T, D): the local heads over the first `prefix` tokens (the sinks, after any left padding) and the
    newest T + `local_window`, all a query can see: what an `HfAttnCache` keeps for them, taken alike from a key/value
    head kept whole. A whole sequence without a mask goes to the chunked kernel, O(T * (k + s)); otherwise the window
    and the sinks are counted along the mask (or causal order) over those keys."""
    query, sources = query[:, heads.heads["local"]], heads.sources["local"]
    num_queries = query.shape[-2]
    lengths = [keys[kind].shape[-2] for kind, _ in sources]
    if attention_mask is None and max(lengths) == num_queries:
        k, v = per_head(keys, sources), per_head(values, sources)
        return local_attention(query, k, v, heads.visibility, None, scaling, dropout)
    first = min(prefix, *lengths)
    last = min(num_queries + heads.local_window, *(length - first for length in lengths))
    kept_keys, kept_values = ({kind: first_and_last(x, first, last) for kind, x in states.items()}
                              for states in (keys, values))  # fmt: skip
    k, v = per_head(kept_keys, sources), per_head(kept_values, sources)
    if attention_mask is None:  # causal order: the kept keys as if in a row, which keeps every distance that matters
        visible = visibility_mask(heads.visibility, num_queries, None, first + last, query.device)
    else:
        visible = local_visible(first_and_last(attention_mask.bool(), first, last, dim=-1), heads.visibility)
    return masked_sdpa(query, k, v, visible, scaling, dropout)


def first_and_last(x: torch.Tensor, first: int, last: int, dim: int = -2) -> torch.Tensor:
    """The `first` entries of `x` along `dim` and its `last` ones: one piece when they meet."""
    if first + last >= x.shape[dim]:
        return x
    return torch.cat([x.narrow(dim, 0, first), x.narrow(dim, x.shape[dim] - last, last)], dim=dim)


def local_heads_by_mask(
    query, keys: dict, values: dict, attention_mask: torch.Tensor, heads: LayerHeads, scaling: float, dropout: float
) -> torch.Tensor:
    """(B, H_local, T, D): the local heads over keys in whatever order the mask describes, each query seeing the
    `local_window` keys nearest before it among those the mask lets it see (and itself with `attend_to_self`)."""
    query, sources = query[:, heads.heads["local"]], heads.sources["local"]
    k, v = per_head(keys, sources), per_head(values, sources)
    mask = local_visible(attention_mask, heads.visibility)
    return local_attention(query, k, v, heads.visibility, mask, scaling, dropout)


def placed_attention(
    module, query, keys: dict, values: dict, attention_mask, placed: dict, scaling: float, dropout: float
) -> tuple[torch.Tensor, None]:
    """A layer's heads over a static `HfAttnCache`: each kind of key/value head under the columns of the mask
    transformers built (over every slot up to `max_cache_len`) at its keys' indices (`placed_mask`), so global heads
    see what the model's mask lets them see and local heads find their window and sinks along it."""
    heads: LayerHeads = module.hf_attn_heads
    num_queries = query.shape[-2]
    masks = {kind: placed_mask(attention_mask, index, keys[kind].shape[-2], num_queries, query.device)
             for kind, index in placed.items()}  # fmt: skip
    outputs = []
    if "global" in heads.heads:
        outputs.append(global_heads(module, query, keys, values, masks["global"], scaling, dropout))
    if "local" in heads.heads:
        outputs.append(local_heads_placed(query, keys, values, masks, heads, scaling, dropout))
    out = torch.cat(outputs, dim=1)[:, heads.order]
    return out.transpose(1, 2), None


def placed_mask(attention_mask, index: torch.Tensor | None, num_keys: int, num_queries: int,
                device: torch.device) -> torch.Tensor:  # fmt: skip
    """(B|1, 1, T, S) bool over a kind's keys: the mask's columns at their indices (`index`, the queries' being the
    last T), causal order among them, no column for an empty slot; where `index` is None each slot is its index."""
    if index is None:
        if attention_mask is None:  # transformers leaves it out for a first step: the queries are the first slots
            slots = torch.arange(num_keys, device=device)
            return (slots[None, :] <= slots[:num_queries, None])[None, None]
        return attention_mask.bool()
    visible = (index[None, :] <= index[-num_queries:, None])[None, None]
    if attention_mask is not None:
        width = attention_mask.shape[-1]
        visible = visible & attention_mask.bool()[..., index.clamp(max=width - 1)] & (index < width)
    return visible


def local_heads_placed(query, keys: dict, values: dict, masks: dict, heads: LayerHeads, scaling: float,
                       dropout: float) -> torch.Tensor:  # fmt: skip
    """(B, H_local, T, D): the local heads over a static cache, those reading each kind of key/value head under that
    kind's mask, each query's window and sinks counted along it (`local_visible`)."""
    local, sources = heads.heads["local"], heads.sources["local"]
    outputs, order = [], []
    for kind in dict.fromkeys(kind for kind, _ in sources):
        which = [i for i, (source_kind, _) in enumerate(sources) if source_kind == kind]
        reading = [sources[i] for i in which]
        k, v = per_head(keys, reading), per_head(values, reading)
        mask = local_visible(masks[kind], heads.visibility)
        outputs.append(local_attention(query[:, [local[i] for i in which]], k, v, heads.visibility, mask, scaling,
                                       dropout))  # fmt: skip
        order += which
    out = torch.cat(outputs, dim=1)
    return out if order == sorted(order) else out[:, sorted(range(len(order)), key=order.__getitem__)]


def first_and_last_index(keys: dict, attention_mask, prefix: int, num_queries: int) -> tuple[dict, torch.Tensor]:
    """The index of each key a dynamic `HfAttnCache` returned, per kind: the first `prefix` tokens and the newest
    ones (`local_heads_with_sinks`'s layout) over every key the mask spans (or, without one, the longest kind's), and
    that mask, causal order written out where there was none."""
    num_keys = attention_mask.shape[-1] if attention_mask is not None else max(x.shape[-2] for x in keys.values())
    device = next(iter(keys.values())).device
    if attention_mask is None:
        attention_mask = visibility_mask(Visibility(True, True), num_queries, None, num_keys, device)
    placed = {}
    for kind, x in keys.items():
        first = min(prefix, x.shape[-2])
        last = x.shape[-2] - first
        placed[kind] = torch.cat(
            [torch.arange(first, device=device), torch.arange(num_keys - last, num_keys, device=device)]
        )
    return placed, attention_mask


def in_token_order(keys: dict, values: dict, attention_mask, placed: dict, num_queries: int):
    """Keys and values placed by index (a static cache's slots, sinks kept apart from their window) put in the
    columns of their indices over every position the mask spans, and each kind's mask over them, for
    `attention_with_weights`: columns a kind does not hold are zeros, hidden."""
    slots = [keys[kind].shape[-2] for kind, index in placed.items() if index is None]
    width = attention_mask.shape[-1] if attention_mask is not None else max(slots, default=num_queries)
    device = next(iter(keys.values())).device
    visible = placed_mask(attention_mask, None, width, num_queries, device)
    masks = {}
    for kind, index in placed.items():
        if index is None:
            masks[kind] = visible
            continue
        keys[kind], values[kind] = (
            place_columns(x.transpose(-1, -2), index, width).transpose(-1, -2) for x in (keys[kind], values[kind])
        )
        masks[kind] = visible & (place_columns(torch.ones(len(index), device=device), index, width) > 0)
    return keys, values, masks


def attention_with_weights(
    query, keys: dict, values: dict, attention_mask, heads: LayerHeads, scaling: float, dropout: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every head written out, for `output_attentions`: (B, T, H, D) and the (B, H, T, S) weights over the keys the
    mask spans, the newest last; a local head's key/value head keeps fewer of them, the older ones weigh 0. From a
    static cache (`in_token_order`), the mask comes per kind of key/value head."""
    num_queries = query.shape[-2]
    num_keys = max(k.shape[-2] for k in keys.values())
    if attention_mask is None:  # causal order: query i is key num_keys - num_queries + i
        attention_mask = visibility_mask(Visibility(True, True), num_queries, None, num_keys, query.device)
    if not isinstance(attention_mask, dict):
        attention_mask = dict.fromkeys(keys, attention_mask.bool())
    visible = torch.cat(torch.broadcast_tensors(*(attention_mask[kind] for kind, _ in heads.every_source)), dim=1)
    k, v = (per_head(left_padded(states, num_keys), heads.every_source) for states in (keys, values))
    is_local = torch.tensor([kind == "local" for kind in heads.kinds], device=query.device)[:, None, None]
    mask = torch.where(is_local, local_visible(visible, heads.visibility), visible)  # (B|1, H, T, S)
    weights = masked_weights(query, k, mask, scaling)
    out = torch.matmul(torch.nn.functional.dropout(weights, dropout), v)
    return out.transpose(1, 2), weights


def left_padded(states: dict, num_keys: int) -> dict:
    """Each kind's (B, H_kv, S_kind, D) states padded with zeros on the left to `num_keys`: its newest last."""
    return {kind: torch.nn.functional.pad(x, (0, 0, num_keys - x.shape[-2], 0)) for kind, x in states.items()}


def by_kv_kind(states, heads: LayerHeads) -> dict[str, torch.Tensor]:
    """Key or value states by kind of key/value head: as the cache returned them, or split from one tensor (no
    cache, or another model's)."""
    if isinstance(states, dict):
        return states
    if len(heads.kv_heads) == 1:
        return {next(iter(heads.kv_heads)): states}
    return {kind: states[:, indices] for kind, indices in heads.kv_heads.items()}


def per_head(states: dict, sources: list[tuple[str, int]], length: int | None = None) -> torch.Tensor:
    """(B, len(sources), tokens, D): for each query head, the states of the key/value head it reads (`sources`:
    kind and index among the kind's), the newest `length` tokens (all by default)."""
    start = -length if length else 0
    return torch.stack([states[kind][:, index, start:] for kind, index in sources], dim=1)


AttentionInterface.register(HYBRID_ATTENTION, hybrid_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(HYBRID_ATTENTION, sdpa_mask)  # boolean masks, None where causal order suffices


# --- config and model types ------------------------------------------------------------------------------------


class HybridConfigMixin:
    """The fields a hybridized family's config adds, and their checks. Every query head's kind is in `head_layout`
    (one list per layer); `kv_head_layout` follows from it."""

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.head_layout is None:
            self.head_layout = [["global"] * self.num_attention_heads for _ in range(self.num_hidden_layers)]
        self.head_layout = [list(layer) for layer in self.head_layout]
        if problems := layout_problems(self):
            raise ValueError(f"Invalid {type(self).__name__}: " + "; ".join(problems))
        self.auto_map = remote_code_map(self.model_type.removeprefix("hf_attn_"))

    @property
    def kv_head_layout(self) -> list[list[str]]:
        """Per layer, the kind of each key/value head: "global" where a global query head reads it (the cache keeps
        every token), else "local" (it keeps the last `local_window`)."""
        return [list(layer_heads(self, i).kv_kinds) for i in range(self.num_hidden_layers)]


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def cache_bytes_per_token(config, bytes_per_value: int = 2, context_tokens: int | None = None) -> float:
    """What the cache grows by per token at long context: keys and values of the key/value heads kept whole, in every
    layer (local ones keep `local_window` + `sink_tokens` tokens whatever the context). With `context_tokens`, what it
    holds at that context per token, local heads' windows and sinks counted. 2 bytes a value: bfloat16 and float16."""
    kinds = [kind for layer in config.kv_head_layout for kind in layer]
    per_head_and_token = 2 * head_dim(config) * bytes_per_value  # a key and a value
    if context_tokens is None:
        return kinds.count("global") * per_head_and_token
    local_tokens = min(context_tokens, config.local_window + config.sink_tokens)
    held = kinds.count("global") * context_tokens + kinds.count("local") * local_tokens
    return held * per_head_and_token / context_tokens


def original_cache_bytes_per_token(config, bytes_per_value: int = 2) -> int:
    """The same for the model before `hybridize`: every key/value head of every layer."""
    return 2 * config.num_hidden_layers * num_key_value_heads(config) * head_dim(config) * bytes_per_value


def layout_problems(config) -> list[str]:
    """Every problem of the hybrid fields at once, each naming the field and what it allows."""
    problems = []
    layout, heads, layers = config.head_layout, config.num_attention_heads, config.num_hidden_layers
    if len(layout) != layers:
        problems.append(f"`head_layout` must have one list per layer ({layers}), got {len(layout)}")
    if wrong := [i for i, layer in enumerate(layout) if len(layer) != heads]:
        problems.append(f"`head_layout` must name every head ({heads}) of each layer; layers {wrong} do not")
    if unknown := sorted({kind for layer in layout for kind in layer} - set(KINDS)):
        problems.append(f"`head_layout` holds {unknown}; allowed kinds: {list(KINDS)}")
    if not isinstance(config.local_window, int) or config.local_window < 1:
        problems.append(f"`local_window` must be an int >= 1 (the previous tokens a local head sees), got "
                        f"{config.local_window!r}")  # fmt: skip
    if not isinstance(config.sink_tokens, int) or isinstance(config.sink_tokens, bool) or config.sink_tokens < 0:
        problems.append(f"`sink_tokens` must be an int >= 0 (the first tokens a local head sees besides its window), "
                        f"got {config.sink_tokens!r}")  # fmt: skip
    if heads % num_key_value_heads(config):
        problems.append(f"`num_attention_heads` ({heads}) must be a multiple of `num_key_value_heads` "
                        f"({num_key_value_heads(config)})")  # fmt: skip
    # Gemma's options that hybridized heads cannot honour: they run causal SDPA and a banded kernel, uncapped.
    if getattr(config, "attn_logit_softcapping", None) is not None:
        problems.append(f"`attn_logit_softcapping` must be None (hybridized heads do not soft-cap attention scores), "
                        f"got {config.attn_logit_softcapping!r}")  # fmt: skip
    if getattr(config, "use_bidirectional_attention", False):
        problems.append("`use_bidirectional_attention` must be False (hybridized heads are causal), got True")
    return problems


class HybridModelMixin(CardSharing):
    """What a hybridized family's model classes add: every attention module knows its heads (`hf_attn_heads`) and
    runs `hybrid_attention`; `generate` and `forward` (`hybrid_forward`) decode with an `HfAttnCache`; and
    `save_pretrained` and `push_to_hub` write a card saying which heads are local."""

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        attach_heads(self)

    def get_correct_attn_implementation(self, requested_attention: str | None, is_init_check: bool = False) -> str:
        """Global heads run SDPA, local heads their banded kernel, both behind one attention function."""
        allowed = ("sdpa", HYBRID_ATTENTION)
        if requested_attention is not None and requested_attention not in allowed:
            raise ValueError(
                unsupported_attention(requested_attention, allowed)
                + " (hybridized models: both run global heads through SDPA, local heads through hf_attn's kernel)."
            )
        return HYBRID_ATTENTION

    def _prepare_cache_for_generation(self, generation_config, model_kwargs: dict, *args, **kwargs) -> None:
        """`generate`'s cache, made as for any model, then replaced by an `HfAttnCache` that keeps of each key/value
        head what its query heads read: static with the same length for `cache_implementation="static"`."""
        super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        made = model_kwargs.get("cache")
        if made is None or isinstance(made, HfAttnCache) or getattr(made, "_is_user_defined", False):
            return
        if type(made) not in (transformers.DynamicCache, transformers.StaticCache) or made.offloading:
            raise ValueError(
                f"`cache_implementation`={generation_config.cache_implementation!r} is not supported by hybridized "
                "models yet; allowed: None or 'dynamic' (the default), 'static'."
            )
        max_cache_len = made.get_max_length() if isinstance(made, transformers.StaticCache) else None
        model_kwargs["cache"] = HfAttnCache(self.config, max_cache_len=max_cache_len)
        if generation_config.is_assistant:
            # as transformers asks of the caches it makes: room for the drafts a verification may reject
            model_kwargs["cache"].activate_past_recording(
                recurrent_states_to_keep=generation_config.num_assistant_tokens
            )


def hybrid_forward(family_forward: Callable) -> Callable:
    """The family's `forward`, given an `HfAttnCache` where it would make itself a `DynamicCache`, and asking the
    attention function for weights when `output_attentions` does. Keyword arguments only (the families order their
    positional ones differently); the family's signature stays visible to Trainer, which keeps only the dataset
    columns `forward` names."""

    @functools.wraps(family_forward)
    def forward(self, *args, **kwargs):
        if kwargs.get("output_attentions", self.config.output_attentions):
            kwargs[RETURN_WEIGHTS] = True
        use_cache = kwargs.get("use_cache")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        given = kwargs.get("cache")
        given = kwargs.get("past_key_values") if given is None else given
        if use_cache and len(args) <= 1 and given is None:
            kwargs["cache"] = given = HfAttnCache(self.config)
        if isinstance(given, HfAttnCache) and self.config.sink_tokens:
            past = given.get_seq_length()  # a static cache's is a tensor once it holds tokens: not read on the host
            if isinstance(past, int) and past == 0:
                given.make_room_for_padding(kwargs.get("attention_mask"))
            kwargs[SINK_PREFIX] = given.first_tokens
        return family_forward(self, *args, **kwargs)

    return forward


def attach_heads(model: PreTrainedModel) -> None:
    """Tells each attention module of `model` its heads' kinds (a plain attribute: weights and state dict unchanged)."""
    attention_types = tuple(ATTENTION_MODULES.values())
    for module in model.modules():
        if isinstance(module, attention_types):
            module.hf_attn_heads = layer_heads(model.config, module.layer_idx)


def hybrid_types(family: str, config_class: type, model_classes: dict[str, type]) -> tuple[type, dict[str, type]]:
    """The `hf_attn_<family>` config type and its model classes, by Auto class: the family's own, plus the mixins."""
    name = config_class.__name__.removesuffix("Config")
    config = type(f"HfAttn{name}Config", (HybridConfigMixin, config_class), {
        "__module__": __name__,
        "__doc__": f"`{config_class.__name__}` with a kind per head (`hf_attn.hybridize`).",
        "model_type": f"hf_attn_{family}",
        "__annotations__": {"head_layout": "list[list[str]] | None", "local_window": "int", "attend_to_self": "bool",
                            "sink_tokens": "int"},
        "head_layout": None,
        "local_window": 1,
        "attend_to_self": True,
        "sink_tokens": 0,
    })  # fmt: skip
    models = {
        auto_name: type(
            f"HfAttn{model_class.__name__}",
            (HybridModelMixin, model_class),
            {
                "__module__": __name__,
                "__doc__": f"`{model_class.__name__}` with a kind per head (`hf_attn.hybridize`).",
                "config_class": config,
                "forward": hybrid_forward(model_class.forward),
                "_auto_class": auto_name,  # `save_pretrained` exports this file (transformers' `is_remote_code`)
            },
        )  # fmt: skip
        for auto_name, model_class in model_classes.items()
    }
    return config, models


ATTENTION_MODULES = {
    "llama": transformers.models.llama.modeling_llama.LlamaAttention,
    "qwen2": transformers.models.qwen2.modeling_qwen2.Qwen2Attention,
    "mistral": transformers.models.mistral.modeling_mistral.MistralAttention,
    "qwen3": transformers.models.qwen3.modeling_qwen3.Qwen3Attention,
    "gemma3_text": transformers.models.gemma3.modeling_gemma3.Gemma3Attention,
    "gpt2": transformers.models.gpt2.modeling_gpt2.GPT2Attention,
}
HYBRID_TYPES = {family: hybrid_types(family, *classes) for family, classes in FAMILIES.items()}
# Remote code finds a class by its name in this file (`auto_map`): each hybrid type is bound to its name here.
globals().update({cls.__name__: cls for config, models in HYBRID_TYPES.values() for cls in (config, *models.values())})


def remote_code_map(family: str) -> dict[str, str]:
    """`config.auto_map` of a hybridized family: every Auto class to its class in this file ("hybrid.<name>", also
    where this file runs as remote code), so that each loads the checkpoint with `trust_remote_code=True` where
    hf_attn is not installed."""
    config_class, model_classes = HYBRID_TYPES[family]
    module = __name__.rsplit(".", 1)[-1]
    classes = {"AutoConfig": config_class, **model_classes}
    return {auto: f"{module}.{cls.__name__}" for auto, cls in classes.items()}


# --- the entry point -------------------------------------------------------------------------------------------


def hybridize(
    model: PreTrainedModel,
    head_layout: Sequence[Sequence[str]] | None = None,
    num_local_heads: int | Sequence[int] | None = None,
    local_window: int = 1,
    attend_to_self: bool = True,
    sink_tokens: int = 0,
) -> PreTrainedModel:
    """Gives `model` (a loaded Llama, Qwen2, Qwen3, Mistral, Gemma 3 or GPT-2 model: the base model or one with a
    causal LM, sequence or token classification or question answering head; or one hybridized before) a kind per query
    head, in place, and returns it; weights, dtype and device are untouched.

    `head_layout` names every head's kind ("global" or "local"), one list per layer; or `num_local_heads` makes the
    last N heads of every layer (or of each layer, given a list) local, so that with grouped-query attention whole
    key/value groups turn local and the cache keeps only their last `local_window` tokens. Neither: every head stays
    global and the model computes exactly what it did. `attend_to_self=True` (the default) lets a local head see its
    own token as well, as pretrained heads were trained to. `sink_tokens` = s lets every local head also see the first
    s tokens of its sequence (the first real ones under left padding), as StreamingLLM's and DuoAttention's streaming
    heads do: pretrained heads park attention on the first tokens, and a local head without them loses that place
    (SmolLM2-135M with half its key/value groups 64-local: WikiText-2 perplexity 108 without sinks, 32 with 4). The
    cache keeps s + `local_window` tokens of a key/value head that only local heads read.
    """
    drop_gguf_quantizer(model)
    family = family_of(model.config)
    config_class, model_classes = HYBRID_TYPES[family]
    hybrid_class = hybrid_model_class(model, family)
    if head_layout is not None and num_local_heads is not None:
        raise ValueError("Give `head_layout` or `num_local_heads`, not both.")
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    if num_local_heads is not None:
        head_layout = last_heads_local(num_local_heads, layers, heads)
    fields = {key: value for key, value in model.config.to_dict().items() if key not in ("model_type", "architectures")}
    fields.update(head_layout=head_layout, local_window=local_window, attend_to_self=attend_to_self,
                  sink_tokens=sink_tokens)  # fmt: skip
    config = config_class(**fields)
    config._attn_implementation = HYBRID_ATTENTION
    old_config = model.config
    for module in model.modules():  # every module that reads the config reads the new one
        if getattr(module, "config", None) is old_config:
            module.config = config
    model.__class__ = hybrid_class
    attach_heads(model)
    return model


def drop_gguf_quantizer(model: PreTrainedModel) -> None:
    """Forgets that `model` came from a GGUF file, where its weights were unpacked to floats: transformers keeps the
    file's quantizer all the same (`hf_quantizer`, `config.quantization_config`, `is_quantized`), and with it
    `save_pretrained` refuses the model as "not serializable" and Trainer refuses to train it. Refused where weights
    stayed packed in GGUF blocks (transformers does that where its GGUF kernels are installed)."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None or quantizer.quantization_config.quant_method != "gguf":
        return
    if getattr(quantizer, "packed_modules", None):
        raise ValueError(
            "This model keeps GGUF weights packed, which hybridize and save_pretrained cannot handle: load it with "
            "`quantization_config=GgufConfig(dequantize=True)` (or `hf_attn.pretrained.load_causal_lm`)."
        )
    quantizer.remove_quantization_config(model)
    for module in model.modules():  # transformers marks every sub-model's config too
        if isinstance(module, PreTrainedModel) and hasattr(module.config, "_is_quantized"):
            del module.config._is_quantized


def family_of(config) -> str:
    family = config.model_type.removeprefix("hf_attn_")
    if family not in FAMILIES:
        raise ValueError(
            f"hybridize supports the model types {list(FAMILIES)} (and their hf_attn_ versions); got "
            f"{config.model_type!r}."
        )
    return family


def hybrid_model_class(model: PreTrainedModel, family: str) -> type:
    """The hybrid class of `model`'s class: itself when hybridized before."""
    model_classes = HYBRID_TYPES[family][1]
    if type(model) in model_classes.values():
        return type(model)
    for auto_name, base in FAMILIES[family][1].items():
        if type(model) is base:
            return model_classes[auto_name]
    supported = [cls.__name__ for cls in FAMILIES[family][1].values()]
    raise ValueError(f"hybridize supports {supported} for {family!r}; got {type(model).__name__}.")


def last_heads_local(num_local_heads: int | Sequence[int], layers: int, heads: int) -> list[list[str]]:
    counts = [num_local_heads] * layers if isinstance(num_local_heads, int) else list(num_local_heads)
    if len(counts) != layers or any(not 0 <= n <= heads for n in counts):
        raise ValueError(
            f"`num_local_heads` must be an int in 0..{heads} or one per layer ({layers}); got {num_local_heads!r}"
        )
    return [["global"] * (heads - n) + ["local"] * n for n in counts]


def register() -> None:
    """The `hf_attn_<family>` types with `AutoConfig`, `AutoModel` and `AutoModelForCausalLM`."""
    for config_class, model_classes in HYBRID_TYPES.values():
        transformers.AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        for auto_name, model_class in model_classes.items():
            getattr(transformers, auto_name).register(config_class, model_class, exist_ok=True)


__all__ = [
    "hybridize",
    "hybrid_attention",
    "LayerHeads",
    "HYBRID_TYPES",
    "FAMILIES",
    "cache_bytes_per_token",
    "original_cache_bytes_per_token",
]
