"""The attention function of hybridized models, `hybrid_attention`, registered in transformers' `AttentionInterface`
as "hf_attn_hybrid": each layer's query heads split by kind (`LayerHeads`), global heads through SDPA over the mask
transformers built, local heads through hf_attn's banded kernel (with sinks), positional heads through hf_attn's
positional kernel (weights from P's rows, which the model's forward looks up once for every layer), or, from a static
cache's slots, over keys placed by index. `attn_implementation="eager"` picks its written-out twin,
"hf_attn_hybrid_eager": softmax(Q K^T) V over every head's own mask, the weights returned, as transformers' eager
attention is to its SDPA.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

from .attention_hf_attn import (
    MAX_QUERIES_FOR_ONE_MASK,
    global_attention,
    local_attention,
    masked_sdpa,
    masked_softmax,
    positional_attention,
)
from .attention_inputs_hf_attn import place_columns
from .cache_hf_attn import KEY_INDEX, model_window
from .visibility_hf_attn import Visibility, local_visible, visibility_mask

HYBRID_ATTENTION = "hf_attn_hybrid"  # its name in transformers' attention and mask interfaces
HYBRID_EAGER = "hf_attn_hybrid_eager"  # every head written out
# The `attn_implementation` values a hybridized model takes, and the attention function each stands for.
HYBRID_IMPLEMENTATIONS = {"sdpa": HYBRID_ATTENTION, "eager": HYBRID_EAGER}
# The keyword argument that asks `hybrid_attention` for its weights: the families pass unknown keyword arguments down
# to the attention function, but GPT-2 drops `output_attentions` on the way.
RETURN_WEIGHTS = "hf_attn_return_weights"
# The keyword argument telling `hybrid_attention` how many first tokens an `HfAttnCache` keeps for local heads with
# sinks: the sinks, and the left padding before them.
SINK_PREFIX = "hf_attn_sink_prefix"
# The keyword argument carrying P's rows at the new tokens' positions (B|1, T, d_P) and at every key's (B|1, S, d_P).
POSITIONAL_ROWS = "hf_attn_positional_rows"
KINDS = ("global", "local", "positional")
# What a positional head sees: every earlier token and itself, as the model's global heads do.
POSITIONAL_VISIBILITY = Visibility(True, True)

# --- which head is which ---------------------------------------------------------------------------------------


class LayerHeads:
    """One layer's query heads by kind (`kinds`, in head order) and the key/value heads they read: query head h reads
    key/value head h // (query heads per key/value head), as transformers' `repeat_kv` has it. Everything is worked
    out once, here, into plain attributes, which graph capture reads as constants."""

    def __init__(self, kinds: Sequence[str], num_key_value_heads: int, local_window: int, attend_to_self: bool,
                 sink_tokens: int, positional_qk_dim: int | None = None):  # fmt: skip
        self.kinds, self.local_window, self.sink_tokens = tuple(kinds), local_window, sink_tokens
        self.positional_qk_dim = positional_qk_dim
        self.positional_scale = positional_qk_dim**-0.5 if positional_qk_dim else None
        group_size = len(self.kinds) // num_key_value_heads
        groups = [self.kinds[g * group_size : (g + 1) * group_size] for g in range(num_key_value_heads)]
        # Per key/value head: the kind of the query heads reading it where they are all of one kind; "global" (every
        # key and value kept) where kinds mix: a global head reads every key, a positional head every value, and a
        # local head beside one of them the keys of its window.
        self.kv_kinds = tuple(group[0] if len(set(group)) == 1 else "global" for group in groups)
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
        # Where no group mixes kinds: each kind's query heads as runs of consecutive heads, each with the run of the
        # kind's key/value heads it reads (`reads`: views of the queries and of the cache, no copies).
        self.runs = None
        if self.pure_groups:
            self.runs = {kind: head_runs(heads, group_size, position) for kind, heads in self.heads.items()}
        # What a local head sees: the `local_window` previous tokens, itself with `attend_to_self`, and the first
        # `sink_tokens`.
        self.visibility = Visibility(True, attend_to_self, local_window, sink_tokens)


def head_runs(heads: list[int], group_size: int, position: dict) -> list[tuple[slice, slice]]:
    """Consecutive query heads of one kind, as (their slice, the slice of the kind's key/value heads they read)."""
    runs, start = [], 0
    for i in range(1, len(heads) + 1):
        if i == len(heads) or heads[i] != heads[i - 1] + 1:
            first, last = heads[start], heads[i - 1]
            kv_first, kv_last = position[first // group_size][1], position[last // group_size][1]
            runs.append((slice(first, last + 1), slice(kv_first, kv_last + 1)))
            start = i
    return runs


def layer_heads(config, layer_idx: int) -> LayerHeads:
    """A layer's heads. Where the model's own architecture slides a window over the layer (Mistral, Gemma 3's
    sliding layers), its mask hides the first tokens from every head: local heads get no sinks there."""
    sinks = config.sink_tokens if model_window(config, layer_idx) is None else 0
    return LayerHeads(config.head_layout[layer_idx], num_key_value_heads(config), config.local_window,
                      config.attend_to_self, sinks, config.positional_qk_dim)  # fmt: skip


def num_key_value_heads(config) -> int:
    """GPT-2 has one key/value head per query head and no field saying so."""
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


# --- the attention function ------------------------------------------------------------------------------------


def hybrid_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs):
    """A hybridized layer's attention, as transformers' attention interface calls it: query (B, H, T, D); key and
    value (B, H_kv, S, D), or, from an `HfAttnCache`, {kind: (B, H_kv of that kind, S or fewer, D)}, newest last;
    the mask transformers built (None when causal order says it all, else a boolean (B|1, 1, T, S)).
    Returns (B, T, H, D), and with `output_attentions` the (B, H, T, S) weights, else None. Positional heads read
    P's rows from `kwargs[POSITIONAL_ROWS]`, which the model's forward puts there."""
    if hasattr(key, "hybrid_attention"):  # a paged cache's layer, under continuous batching (`hf_attn.serving`)
        return key.hybrid_attention(module, query, scaling, dropout)
    heads: LayerHeads = module.hf_attn_heads
    rows = kwargs.get(POSITIONAL_ROWS)
    if "positional" in heads.heads and rows is None:
        raise ValueError(
            f"{type(module).__name__} has positional heads, which need P's rows (`{POSITIONAL_ROWS}`): call the "
            "hybridized model, whose forward looks them up, not its attention modules alone."
        )
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
        return attention_with_weights(module, query, keys, values, attention_mask, scaling, dropout, rows)
    if placed is not None:
        return placed_attention(module, query, keys, values, attention_mask, placed, scaling, dropout, rows)
    if set(heads.heads) == {"global"}:  # the model's own attention, exactly: transformers' SDPA function
        return ALL_ATTENTION_FUNCTIONS["sdpa"](
            module, query, keys["global"], values["global"], attention_mask, dropout=dropout, scaling=scaling
        )
    outputs = []
    if "global" in heads.heads:
        outputs += global_heads(module, query, keys, values, attention_mask, scaling, dropout)
    if "local" in heads.heads:
        if newest_last and heads.sink_tokens:
            prefix = kwargs.get(SINK_PREFIX, heads.sink_tokens)
            outputs += local_heads_with_sinks(query, keys, values, attention_mask, heads, scaling, dropout, prefix)
        elif newest_last:
            outputs.append(local_heads(query, keys, values, attention_mask, heads, scaling, dropout))
        else:
            outputs.append(local_heads_by_mask(query, keys, values, attention_mask, heads, scaling, dropout))
    if "positional" in heads.heads:
        masks, key_rows = newest_keys(values, attention_mask, rows[1])
        outputs.append((heads.heads["positional"], positional_heads(module, values, masks, rows[0], key_rows, dropout)))
    return heads_in_order(outputs, len(heads.kinds)), None


def heads_in_order(outputs: list[tuple[slice | list[int], torch.Tensor]], num_heads: int) -> torch.Tensor:
    """(B, T, H, D): each (B, h, T, D) output written into its heads' places, in the layout the model's output
    projection reads (its reshape then copies nothing). Heads computed in different dtypes (under autocast) meet in
    the wider one, as `torch.cat` would have them."""
    first = outputs[0][1]
    dtype = functools.reduce(torch.promote_types, (x.dtype for _, x in outputs))
    out = first.new_empty(first.shape[0], first.shape[2], num_heads, first.shape[3], dtype=dtype)
    for index, x in outputs:
        out[:, :, index] = x.transpose(1, 2).to(dtype)
    return out


def hybrid_attention_eager(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                           **kwargs):  # fmt: skip
    """`attn_implementation="eager"`: every head written out, its weights returned (`attention_with_weights`), as
    transformers' eager attention; the same cache, masks and kinds as `hybrid_attention`."""
    kwargs[RETURN_WEIGHTS] = True
    return hybrid_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)


def global_heads(module, query, keys: dict, values: dict, attention_mask, scaling: float,
                 dropout: float) -> list[tuple[slice | list[int], torch.Tensor]]:  # fmt: skip
    """The global heads over every key, as (heads, (B, h, T, D)) pieces (`reads`). Where no key/value group mixes
    kinds, transformers' SDPA function runs each run of them as the model would (grouped-query attention in
    place); otherwise each head gets a copy of its keys and values."""
    heads: LayerHeads = module.hf_attn_heads
    if heads.runs is None:
        ((index, q, k, v),) = reads("global", query, keys, values, heads)
        return [(index, global_attention(q, k, v, Visibility(True, True), attention_mask, scaling, dropout))]
    outputs = []
    for index, q, k, v in reads("global", query, keys, values, heads):
        out, _ = ALL_ATTENTION_FUNCTIONS["sdpa"](module, q, k, v, attention_mask, dropout=dropout, scaling=scaling)
        outputs.append((index, out.transpose(1, 2)))
    return outputs


def local_heads(query, keys: dict, values: dict, attention_mask, heads: LayerHeads, scaling: float,
                dropout: float) -> tuple[list[int], torch.Tensor]:  # fmt: skip
    """The local heads, (B, H_local, T, D), over the newest T + `local_window` keys at most, all a query can see."""
    query, sources = query[:, heads.heads["local"]], heads.sources["local"]
    length = min(query.shape[-2] + heads.local_window, *(keys[kind].shape[-2] for kind, _ in sources))
    k, v = per_head(keys, sources, length), per_head(values, sources, length)
    mask = local_mask(attention_mask, heads, query, k)
    return heads.heads["local"], local_attention(query, k, v, heads.visibility, mask, scaling, dropout)


def local_mask(attention_mask, heads: LayerHeads, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """Local heads' mask over the keys they read (the newest ones): None for the banded kernel when causal order says
    it all and the queries are many; else a whole mask with their window in it, the model's mask too if it has one.
    A decoding step's few queries run faster as one small SDPA than as a pass per key offset."""
    num_queries, num_keys = q.shape[-2], k.shape[-2]
    if attention_mask is None and num_queries > MAX_QUERIES_FOR_ONE_MASK:
        return None
    window = visibility_mask(heads.visibility, num_queries, None, num_keys, q.device)
    return window if attention_mask is None else attention_mask[..., -num_keys:].bool() & window


def local_heads_with_sinks(
    query, keys: dict, values: dict, attention_mask, heads: LayerHeads, scaling: float, dropout: float, prefix: int
) -> list[tuple[slice | list[int], torch.Tensor]]:
    """The local heads, as (heads, (B, h, T, D)) pieces (`reads`), over the first `prefix` tokens (the sinks, after
    any left padding) and the newest T + `local_window`, all a query can see: what an `HfAttnCache` keeps for them,
    taken alike from a key/value head kept whole. Without a mask those keys go, as if in a row (which keeps every
    distance that matters), to the chunked kernel: O(T * (k + s)) time and memory. Under a mask the window and the
    sinks are counted along it over those keys."""
    num_queries = query.shape[-2]
    lengths = [keys[kind].shape[-2] for kind, _ in heads.sources["local"]]
    first = min(prefix, *lengths)
    last = min(num_queries + heads.local_window, *(length - first for length in lengths))
    kept_keys, kept_values = ({kind: first_and_last(x, first, last) for kind, x in states.items()}
                              for states in (keys, values))  # fmt: skip
    visible = key_mask = None
    if attention_mask is not None:
        kept_mask = first_and_last(attention_mask.bool(), first, last, dim=-1)
        key_mask = left_padding_only(kept_mask)
        if key_mask is None:
            visible = local_visible(kept_mask, heads.visibility)
    # One new token seeing itself sees every key kept: the sinks and its window.
    sees_every_key = attention_mask is None and num_queries == 1 and heads.visibility.attend_to_self
    outputs = []
    for index, q, k, v in reads("local", query, kept_keys, kept_values, heads):
        if sees_every_key:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling,
                                                 enable_gqa=k.shape[1] != q.shape[1])  # fmt: skip
        elif visible is None:
            out = local_attention(q, k, v, heads.visibility, key_mask, scaling, dropout)
        else:
            out = masked_sdpa(q, k, v, visible, scaling, dropout, enable_gqa=k.shape[1] != q.shape[1])
        outputs.append((index, out))
    return outputs


# The last mask `left_padding_only` answered for (a weak reference), its version then and the answer: every layer of
# a forward asks about the same mask.
_last_left_padding: tuple = (lambda: None, -1, None)


def left_padding_only(mask: torch.Tensor) -> torch.Tensor | None:
    """(B, S) bool, the keys that are not padding, when `mask` (B, 1, T, S) is causal order over them and nothing
    else, every row's padding on its left (as `generate` pads a batch); else None. Counted along such a mask, a
    window and sinks are counted by position from each row's first real key, as the chunked kernel counts them with
    a key mask: O(T * (k + s)) rather than a count over the whole (T, S) mask. The check reads the whole mask (0.17 s
    a layer for 5 x 4K tokens on one core), so its answer is kept for the next layers while the mask lives unchanged
    (made under inference_mode, while it lives: such a tensor counts no in-place changes)."""
    global _last_left_padding
    last, version, answer = _last_left_padding
    current = None if mask.is_inference() else mask._version  # tensors made under inference_mode count no versions
    if last() is not mask or version != current:
        answer = padding_on_the_left(mask)
        answer = None if answer is None else answer.clone()  # not a view: it would hold the mask alive
        _last_left_padding = (weakref.ref(mask), current, answer)
    return answer


def padding_on_the_left(mask: torch.Tensor) -> torch.Tensor | None:
    if mask.dim() != 4 or mask.shape[1] != 1:
        return None
    num_queries, num_keys = mask.shape[-2:]
    real = mask[:, 0, -1]  # the newest query, never padding on the left, sees every real key
    if not bool((real[:, 1:] >= real[:, :-1]).all()):
        return None
    causal = torch.ones(num_queries, num_keys, dtype=torch.bool, device=mask.device).tril(num_keys - num_queries)
    return real if torch.equal(mask[:, 0], causal & real[:, None, :]) else None


def first_and_last(x: torch.Tensor, first: int, last: int, dim: int = -2) -> torch.Tensor:
    """The `first` entries of `x` along `dim` and its `last` ones: one piece when they meet."""
    if first + last >= x.shape[dim]:
        return x
    return torch.cat([x.narrow(dim, 0, first), x.narrow(dim, x.shape[dim] - last, last)], dim=dim)


def local_heads_by_mask(
    query, keys: dict, values: dict, attention_mask: torch.Tensor, heads: LayerHeads, scaling: float, dropout: float
) -> tuple[list[int], torch.Tensor]:
    """The local heads, (B, H_local, T, D), over keys in whatever order the mask describes, each query seeing the
    `local_window` keys nearest before it among those the mask lets it see (and itself with `attend_to_self`)."""
    query, sources = query[:, heads.heads["local"]], heads.sources["local"]
    k, v = per_head(keys, sources), per_head(values, sources)
    mask = local_visible(attention_mask, heads.visibility)
    return heads.heads["local"], local_attention(query, k, v, heads.visibility, mask, scaling, dropout)


def newest_keys(values: dict, attention_mask, key_rows: torch.Tensor) -> tuple[dict, dict]:
    """Per kind of key/value head, the mask's columns and P's rows of its keys, the newest ones: the last as many as
    it holds (all of them for a key/value head kept whole, or a static cache's every slot)."""
    masks, rows = {}, {}
    for kind, v in values.items():
        length = v.shape[-2]
        masks[kind] = None if attention_mask is None else attention_mask[..., -length:]
        rows[kind] = key_rows[:, -length:]
    return masks, rows


def positional_heads(module, values: dict, masks: dict, query_rows: torch.Tensor, key_rows: dict,
                     dropout: float) -> torch.Tensor:  # fmt: skip
    """(B, H_positional, T, D): the positional heads, their weights from P alone (queries and keys `p_attn` projects
    from P's rows, one row for the batch unless positions differ by row), their values the data's; those reading
    each kind of key/value head under that kind's mask (None: causal order) over its keys' rows."""
    heads: LayerHeads = module.hf_attn_heads
    sources = heads.sources["positional"]
    queries = positional_projection(module, query_rows, "queries")
    outputs = []
    for kind, which in source_groups(sources):
        v = per_head(values, [sources[i] for i in which])
        k = positional_projection(module, key_rows[kind], "keys")[:, which]
        outputs.append(positional_attention(queries[:, which], k, v, POSITIONAL_VISIBILITY, masks[kind],
                                            heads.positional_scale, dropout))  # fmt: skip
    return in_head_order(outputs, source_groups(sources))


def positional_projection(module, rows: torch.Tensor, part: str) -> torch.Tensor:
    """(B|1, H_positional, N, qk): P's queries or keys of a layer's positional heads at P's rows (B|1, N, d_P).
    `p_attn` holds the queries' columns, then the keys'."""
    weight, bias = module.p_attn.weight, module.p_attn.bias
    half = weight.shape[0] // 2
    taken = slice(0, half) if part == "queries" else slice(half, None)
    projected = torch.nn.functional.linear(rows.to(weight.dtype), weight[taken], bias[taken])
    qk = module.hf_attn_heads.positional_qk_dim
    return projected.view(*rows.shape[:2], -1, qk).transpose(1, 2)


def source_groups(sources: list[tuple[str, int]]) -> list[tuple[str, list[int]]]:
    """A kind's heads grouped by the kind of key/value head they read: (kind read, the heads' indices)."""
    kinds = dict.fromkeys(kind for kind, _ in sources)
    return [(kind, [i for i, (source, _) in enumerate(sources) if source == kind]) for kind in kinds]


def in_head_order(outputs: list[torch.Tensor], groups: list[tuple[str, list[int]]]) -> torch.Tensor:
    """(B, H_kind, T, D): outputs computed group by group (`source_groups`) put back in the kind's head order; one
    group, or groups already in order, as they are."""
    order = [i for _, which in groups for i in which]
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
    return out if order == sorted(order) else out[:, sorted(range(len(order)), key=order.__getitem__)]


def placed_attention(
    module, query, keys: dict, values: dict, attention_mask, placed: dict, scaling: float, dropout: float, rows
) -> tuple[torch.Tensor, None]:
    """A layer's heads over a static `HfAttnCache`: each kind of key/value head under the columns of the mask
    transformers built (over every slot up to `max_cache_len`) at its keys' indices (`placed_mask`), so global heads
    see what the model's mask lets them see, local heads find their window and sinks along it, and positional
    heads take P's rows at their keys' indices."""
    heads: LayerHeads = module.hf_attn_heads
    num_queries = query.shape[-2]
    masks = {kind: placed_mask(attention_mask, index, keys[kind].shape[-2], num_queries, query.device)
             for kind, index in placed.items()}  # fmt: skip
    outputs = []
    if "global" in heads.heads:
        outputs += global_heads(module, query, keys, values, masks["global"], scaling, dropout)
    if "local" in heads.heads:
        outputs.append((heads.heads["local"], local_heads_placed(query, keys, values, masks, heads, scaling, dropout)))
    if "positional" in heads.heads:
        query_rows, key_rows = rows
        last = key_rows.shape[1] - 1  # an empty slot's index is past every key: its column is hidden
        by_index = {kind: key_rows if index is None else key_rows[:, index.clamp(max=last)]
                    for kind, index in placed.items()}  # fmt: skip
        outputs.append((heads.heads["positional"], positional_heads(module, values, masks, query_rows, by_index,
                                                                    dropout)))  # fmt: skip
    return heads_in_order(outputs, len(heads.kinds)), None


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
    outputs = []
    for kind, which in source_groups(sources):
        reading = [sources[i] for i in which]
        k, v = per_head(keys, reading), per_head(values, reading)
        mask = local_visible(masks[kind], heads.visibility)
        outputs.append(local_attention(query[:, [local[i] for i in which]], k, v, heads.visibility, mask, scaling,
                                       dropout))  # fmt: skip
    return in_head_order(outputs, source_groups(sources))


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
    module, query, keys: dict, values: dict, attention_mask, scaling: float, dropout: float, rows
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every head written out, for `output_attentions`: (B, T, H, D) and the (B, H, T, S) weights over the keys the
    mask spans, the newest last; a local head's key/value head keeps fewer of them, the older ones weigh 0. From a
    static cache (`in_token_order`), the mask comes per kind of key/value head. Positional heads' scores come from
    P's rows (`rows`), the others' from their keys."""
    heads: LayerHeads = module.hf_attn_heads
    num_queries = query.shape[-2]
    num_keys = max(k.shape[-2] for k in keys.values())
    if attention_mask is None:  # causal order: query i is key num_keys - num_queries + i
        attention_mask = visibility_mask(Visibility(True, True), num_queries, None, num_keys, query.device)
    if not isinstance(attention_mask, dict):
        attention_mask = dict.fromkeys(keys, attention_mask.bool())
    visible = torch.cat(torch.broadcast_tensors(*(attention_mask[kind] for kind, _ in heads.every_source)), dim=1)
    # A cache keeps no keys for positional heads (zero wide): zeros stand in, their scores come from P.
    keys = {kind: x if x.shape[-1] else x.new_zeros(*x.shape[:-1], query.shape[-1]) for kind, x in keys.items()}
    k, v = (per_head(left_padded(states, num_keys), heads.every_source) for states in (keys, values))
    is_local = torch.tensor([kind == "local" for kind in heads.kinds], device=query.device)[:, None, None]
    mask = torch.where(is_local, local_visible(visible, heads.visibility), visible)  # (B|1, H, T, S)
    scores = torch.matmul(query, k.transpose(-1, -2)).float() * scaling
    if "positional" in heads.heads:
        positional = torch.tensor(heads.heads["positional"], device=query.device)
        pq = positional_projection(module, rows[0], "queries")
        pk = positional_projection(module, rows[1][:, -num_keys:], "keys")
        p_scores = torch.matmul(pq, pk.transpose(-1, -2)).float() * heads.positional_scale
        scores = scores.index_copy(1, positional, p_scores.expand(scores.shape[0], -1, -1, -1))
    weights = masked_softmax(scores, mask).to(query.dtype)
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
    return {kind: states[:, as_slice(indices)] for kind, indices in heads.kv_heads.items()}


def as_slice(indices: list[int]) -> slice | list[int]:
    """Consecutive indices as a slice, which takes a view rather than a copy."""
    consecutive = indices == list(range(indices[0], indices[-1] + 1))
    return slice(indices[0], indices[-1] + 1) if consecutive else indices


def per_head(states: dict, sources: list[tuple[str, int]], length: int | None = None) -> torch.Tensor:
    """(B, len(sources), tokens, D): for each query head, the states of the key/value head it reads (`sources`:
    kind and index among the kind's), the newest `length` tokens (all by default)."""
    start = -length if length else 0
    return torch.stack([states[kind][:, index, start:] for kind, index in sources], dim=1)


def reads(kind: str, query, keys: dict, values: dict, heads: LayerHeads) -> list[tuple]:
    """What the query heads of `kind` read, as (their heads, their queries, keys, values): where no group mixes kinds,
    each run of consecutive heads with the run of key/value heads it reads, all views (SDPA's grouped-query attention
    reads them in place); otherwise the kind's heads at once, each given a copy of its keys and values."""
    if heads.runs is not None:
        runs = heads.runs[kind]
        return [(run, query[:, run], keys[kind][:, kv_run], values[kind][:, kv_run]) for run, kv_run in runs]
    index, sources = heads.heads[kind], heads.sources[kind]
    return [(index, query[:, index], per_head(keys, sources), per_head(values, sources))]


AttentionInterface.register(HYBRID_ATTENTION, hybrid_attention)
AttentionInterface.register(HYBRID_EAGER, hybrid_attention_eager)
for name in HYBRID_IMPLEMENTATIONS.values():  # boolean masks, None where causal order suffices
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)
