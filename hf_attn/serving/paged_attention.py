"""Attention over a `HeadKindPagedCache`: continuous batching's one flat row of requests, each head over the keys
its kind keeps, under a mask made from the positions of those keys and the request each belongs to.

transformers' continuous batching lays the requests of a step end to end (`cu_seq_lens_q`) and reads each
request's past keys from the cache before its new ones (`cu_seq_lens_k`, one per group of pages). Where a group
keeps only the sinks and a window, key j of a request is not at position j: `PagedBatch` works the positions out
once per forward, and every head kind's mask follows from its `Visibility` over them, as `visibility_hf_attn.py`
defines it for a single sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import torch

from ..attention_hf_attn import masked_sdpa
from ..cache_hf_attn import model_window
from ..head_kinds_hf_attn import HEAD_KINDS
from ..hybrid_attention import POSITIONAL_VISIBILITY, LayerHeads, num_key_value_heads, positional_projection
from ..position_encodings_hf_attn import FIXED_ROWS
from ..visibility_hf_attn import Visibility
from .paged_cache import EVERY_TOKEN, SINKS_AND_WINDOW, CachePlan, HeadsKept, PageSlots


@dataclass
class PagedBatch:
    """One forward's requests: each query's and each group's keys' positions, where each request's queries and keys
    lie, and the masks made from them (once per visibility and group, for every layer); P's rows where positional
    heads read them.

    Attention runs request by request rather than over the whole row under one block-diagonal mask: the requests
    with one new token (decoding) together, their keys gathered into a padded batch; each request with several
    (a prompt, a chunk of one) alone. Over the whole row every query would be scored against every request's keys.
    """

    query_positions: torch.Tensor  # (M,)
    key_positions: dict[str, torch.Tensor]  # group -> (K,)
    query_spans: list[tuple[int, int]]  # per request: its queries in the row
    key_spans: dict[str, list[tuple[int, int]]]  # group -> per request: its keys in the group's
    read_index: list[torch.Tensor]  # per group, the slots each layer reads, and those it writes
    write_index: list[torch.Tensor]
    positional_rows: object = None  # positions -> P's rows, for models with positional heads
    memo: dict = field(default_factory=dict)

    @classmethod
    def from_kwargs(cls, kwargs: dict, plan: CachePlan, positional_rows=None) -> PagedBatch:
        """From the keyword arguments transformers' continuous batching gives the model's forward."""
        positions = kwargs["position_ids"].reshape(-1).long()
        cu_q = kwargs["cu_seq_lens_q"].long()
        requests = torch.arange(len(cu_q) - 1, device=positions.device)
        query_lengths = cu_q.diff()
        past = positions[cu_q[:-1].clamp(max=max(len(positions) - 1, 0))]  # each request's first new position
        key_positions, key_spans = {}, {}
        for group, cu_k in kwargs["cu_seq_lens_k"].items():
            cu_k = cu_k.long()
            key_lengths = cu_k.diff()
            owner = requests.repeat_interleave(key_lengths)
            offset = torch.arange(len(owner), device=positions.device) - cu_k[:-1][owner]
            # Each request's keys: the sinks kept (offsets below `sinks`), then positions up to its last new token
            sinks = past.clamp(max=plan.sinks if group == SINKS_AND_WINDOW else 0)[owner]
            shift = (past + query_lengths - key_lengths)[owner]
            key_positions[group] = torch.where(offset < sinks, offset, offset + shift)
            key_spans[group] = _spans(cu_k)
        return cls(positions, key_positions, _spans(cu_q), key_spans, kwargs["read_index"], kwargs["write_index"],
                   positional_rows)  # fmt: skip

    @property
    def decoding(self) -> list[int]:
        """The requests with one new token."""
        return [r for r, (start, end) in enumerate(self.query_spans) if end - start == 1]

    def decoding_keys(self, group: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The decoding requests' queries (R,), and their keys in the group gathered into rows (R, longest), with
        which of them are real."""
        key = ("decoding", group)
        if key not in self.memo:
            device = self.query_positions.device
            spans = [self.key_spans[group][r] for r in self.decoding]
            longest = max(end - start for start, end in spans)
            columns = torch.arange(longest, device=device)
            starts = torch.tensor([start for start, _ in spans], device=device)
            lengths = torch.tensor([end - start for start, end in spans], device=device)
            real = columns < lengths[:, None]
            index = torch.where(real, starts[:, None] + columns, 0)
            queries = torch.tensor([self.query_spans[r][0] for r in self.decoding], device=device)
            self.memo[key] = queries, index, real
        return self.memo[key]

    def decoding_mask(self, visibility: Visibility, group: str) -> torch.Tensor:
        """(R, 1, 1, longest) bool: which gathered key each decoding query sees."""
        key = ("decoding_mask", visibility, group)
        if key not in self.memo:
            queries, index, real = self.decoding_keys(group)
            seen = visibility.predicate(self.query_positions[queries, None], self.key_positions[group][index])
            self.memo[key] = (seen & real)[:, None, None]
        return self.memo[key]

    def request_mask(self, visibility: Visibility, group: str, request: int) -> torch.Tensor:
        """(1, 1, queries, keys) bool: who sees whom within one request."""
        key = ("request_mask", visibility, group, request)
        if key not in self.memo:
            (q_start, q_end), (k_start, k_end) = self.query_spans[request], self.key_spans[group][request]
            queries, keys = self.query_positions[q_start:q_end], self.key_positions[group][k_start:k_end]
            self.memo[key] = visibility.predicate(queries[:, None], keys[None, :])[None, None]
        return self.memo[key]

    def slots(self, group, index: int) -> PageSlots:
        """The group's (the `index`-th allocator's) slots read and written, once per forward for every layer."""
        key = ("slots", index)
        if key not in self.memo:
            self.memo[key] = group.slots(self.read_index[index], self.write_index[index])
        return self.memo[key]

    def layer(self, groups: dict, kept: dict[str, HeadsKept]) -> PagedLayer:
        return PagedLayer(groups, kept, self)

    def rows(self, group: str | None) -> torch.Tensor:
        """(1, N, d_P) P's rows at the queries' positions (None) or at a group's keys'."""
        key = ("rows", group)
        if key not in self.memo:
            positions = self.query_positions if group is None else self.key_positions[group]
            self.memo[key] = self.positional_rows(positions)[None]
        return self.memo[key]

    def layer_attention(self, attention, hidden_states: torch.Tensor, inputs, cache, layer_idx: int) -> torch.Tensor:
        """An hf_attn model's attention layer (`HfAttnAttention`) over the paged cache: each kind's heads, the
        output projected as its `forward` does."""
        q, k, v = attention.split_heads(hidden_states, inputs.rotary)
        heads = v.shape[1]
        keys = k.new_zeros(1, heads, k.shape[2], k.shape[3])  # every head's place; positional heads have no keys
        content = [h for kind in attention.kinds if kind.content for h in _listed(attention.value_heads[kind.name])]
        keys[:, content] = k[:, [i for kind in attention.kinds if kind.content
                                 for i in _listed(attention.content_heads[kind.name])]]  # fmt: skip
        layer, _ = cache.update(keys, v, layer_idx)
        dropout = attention.attn_dropout.p if attention.training else 0.0
        outputs = []
        for kind in attention.kinds:
            kv_heads = _listed(attention.value_heads[kind.name])
            visibility = attention.visibility[kind.name]
            if kind.content:
                queries = q[:, _listed(attention.content_heads[kind.name])]
                outputs.append(layer.attend(queries, kv_heads, visibility, attention.scale, dropout))
                continue
            queries = attention.positional_projection(self.rows(None))[:, :, 0].transpose(1, 2)
            scale = attention.positional_qk_dim**-0.5
            outputs.append(layer.attend(queries, kv_heads, visibility, scale, dropout, partial(_keys, attention)))
        out = torch.cat([o.transpose(1, 2) for o in outputs], dim=2)
        out = attention.in_layout_order(out, dim=2).reshape(*hidden_states.shape[:2], -1)
        return attention.resid_dropout(attention.c_proj(out))


@dataclass
class PagedLayer:
    """What one layer's cache update hands its attention: per group, the keys (or None) and values read, with the
    layer's plan and the forward's batch."""

    groups: dict[str, tuple[torch.Tensor | None, torch.Tensor]]
    kept: dict[str, HeadsKept]
    batch: PagedBatch

    def source(self, kv_head: int) -> tuple[str, int | None, int]:
        """Where a key/value head's keys and values are: its group, its index among the group's keys, its index
        among the group's values."""
        for group, kept in self.kept.items():
            if kv_head in kept.value_heads:
                keys = kept.key_heads.index(kv_head) if kv_head in kept.key_heads else None
                return group, keys, kept.value_heads.index(kv_head)
        raise KeyError(kv_head)

    def attend(self, query: torch.Tensor, kv_heads: list[int], visibility: Visibility, scaling: float,
               dropout: float, positional=None) -> torch.Tensor:  # fmt: skip
        """(1, H, M, D): query heads (1, H, M, d) each reading its key/value head in `kv_heads`; positional heads
        (`positional`: P's rows -> (1, H, N, qk) keys) score P's keys instead of the cache's."""
        sources = [self.source(g) for g in kv_heads]
        out = None
        for group in dict.fromkeys(s[0] for s in sources):
            which = [i for i, s in enumerate(sources) if s[0] == group]
            keys, values = self.groups[group]
            v, repeats = _heads(values, [sources[i][2] for i in which])
            if positional is None:
                k, key_repeats = _heads(keys, [sources[i][1] for i in which])
            else:  # one key per query head
                k, key_repeats = positional(self.batch.rows(group))[:, which], 1
            if key_repeats != repeats:
                k, v = _repeated(k, key_repeats), _repeated(v, repeats)
            part = self.attend_by_request(query[:, which], k, v, visibility, group, scaling, dropout)
            if out is None and len(which) == len(kv_heads):
                return part
            out = query.new_zeros(*query.shape[:-1], v.shape[-1]) if out is None else out
            out[:, which] = part
        return out

    def attend_by_request(self, q, k, v, visibility: Visibility, group: str, scaling: float, dropout: float):
        """(1, H, M, D): the decoding requests in one padded batch, each other request alone (see `PagedBatch`).
        Fewer key/value heads than query heads are read as grouped-query attention, without copies."""
        batch = self.batch
        gqa = k.shape[1] != q.shape[1]
        out = q.new_zeros(*q.shape[:-1], v.shape[-1])
        if decoding := batch.decoding:
            queries, index, _ = batch.decoding_keys(group)
            mask = batch.decoding_mask(visibility, group)
            q_rows = q[0, :, queries].transpose(0, 1)[:, :, None]  # (R, H, 1, d)
            k_rows, v_rows = (x[0][:, index].transpose(0, 1) for x in (k, v))  # (R, H_kv, longest, d)
            rows = masked_sdpa(q_rows, k_rows, v_rows, mask, scaling, dropout, enable_gqa=gqa)
            out[0, :, queries] = rows[:, :, 0].transpose(0, 1)
        for request in sorted(set(range(len(batch.query_spans))) - set(decoding)):
            (q_start, q_end), (k_start, k_end) = batch.query_spans[request], batch.key_spans[group][request]
            mask = batch.request_mask(visibility, group, request)
            out[:, :, q_start:q_end] = masked_sdpa(q[:, :, q_start:q_end], k[:, :, k_start:k_end],
                                                   v[:, :, k_start:k_end], mask, scaling, dropout,
                                                   enable_gqa=gqa)  # fmt: skip
        return out

    def hybrid_attention(self, module, query: torch.Tensor, scaling: float, dropout: float = 0.0):
        """A hybridized layer's attention (see `hybrid_attention`): (1, M, H, D), no weights."""
        heads: LayerHeads = module.hf_attn_heads
        group_size = len(heads.kinds) // len(heads.kv_kinds)
        window = model_window(module.config, module.layer_idx)
        out = [None] * len(heads.kinds)
        for kind, indices in heads.heads.items():
            visibility = query_visibility(heads, kind, window)
            kv_heads = [h // group_size for h in indices]
            if kind == "positional":
                queries = positional_projection(module, self.batch.rows(None), "queries")
                result = self.attend(queries, kv_heads, visibility, heads.positional_scale, dropout,
                                     lambda rows: positional_projection(module, rows, "keys"))  # fmt: skip
            else:
                result = self.attend(query[:, indices], kv_heads, visibility, scaling, dropout)
            for h, o in zip(indices, result.unbind(1), strict=True):
                out[h] = o
        return torch.stack(out, dim=2), None


def _heads(x: torch.Tensor, index: list[int]) -> tuple[torch.Tensor, int]:
    """The heads of `x` (1, heads, N, d) that `index` lists, one per query head, and how many query heads read each:
    where each is read by the same number of consecutive query heads (grouped-query attention), each once, a view
    where they are consecutive; else one copy per query head."""
    unique = list(dict.fromkeys(index))
    repeats = len(index) // len(unique)
    if index != [h for h in unique for _ in range(repeats)]:
        return x[:, index], 1
    if unique == list(range(unique[0], unique[0] + len(unique))):
        return x[:, unique[0] : unique[0] + len(unique)], repeats
    return x[:, unique], repeats


def _repeated(x: torch.Tensor, repeats: int) -> torch.Tensor:
    return x if repeats == 1 else x.repeat_interleave(repeats, dim=1)


def _spans(cumulative: torch.Tensor) -> list[tuple[int, int]]:
    bounds = cumulative.tolist()
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _keys(attention, rows: torch.Tensor) -> torch.Tensor:
    """(1, H_positional, N, qk): an hf_attn layer's positional heads' keys at P's rows."""
    return attention.positional_projection(rows)[:, :, 1].transpose(1, 2)


def _listed(heads: slice | list[int]) -> list[int]:
    return list(range(heads.start, heads.stop)) if isinstance(heads, slice) else list(heads)


def query_visibility(heads: LayerHeads, kind: str, window: int | None) -> Visibility:
    """What a hybridized layer's `kind` heads see; the model's own sliding window (counting the current token)
    narrows every kind's, and leaves local heads no sinks (`layer_heads`)."""
    if kind == "local":
        visibility = heads.visibility
        if window is None:
            return visibility
        return Visibility(True, visibility.attend_to_self, min(visibility.local_window, window - 1))
    base = POSITIONAL_VISIBILITY if kind == "positional" else Visibility(True, True)
    return base if window is None else Visibility(True, True, window - 1)


def hybrid_plan(config, heads: dict[int, LayerHeads], dtype: torch.dtype) -> CachePlan:
    """Which group keeps each key/value head of a hybridized model: heads a global query head reads keep every
    token (or the model's window), heads only local heads read their sinks and window, heads only positional heads
    read their values alone."""
    layers, windows, sinks = {}, [0], [0]
    for layer_idx, layer in heads.items():
        window = model_window(config, layer_idx)
        kept: dict[str, tuple[list[int], list[int]]] = {}
        for g, kind in enumerate(layer.kv_kinds):
            group = SINKS_AND_WINDOW if kind == "local" or window is not None else EVERY_TOKEN
            keys, values = kept.setdefault(group, ([], []))
            if kind != "positional":
                keys.append(g)
            values.append(g)
            if group == SINKS_AND_WINDOW:
                reach = [query_visibility(layer, k, window).local_window for k in layer.heads]
                windows.append(max(r for r in reach if r is not None))
                sinks.append(layer.sink_tokens if kind == "local" and window is None else 0)
        layers[layer_idx] = {group: HeadsKept(tuple(k), tuple(v)) for group, (k, v) in kept.items()}
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    original = 2 * num_key_value_heads(config) * dim * len(heads) * dtype.itemsize
    return CachePlan(layers, dim, dim, max(sinks), max(windows), original)


def begin_hybrid_batch(model, kwargs: dict, plan: CachePlan) -> PagedBatch:
    """A hybridized model's batch: P's rows computed from positions, as its forward computes them."""
    config = model.config
    rows = None
    if any("positional" in layer for layer in config.head_layout):
        encode, width = FIXED_ROWS[config.positional_encoding], config.positional_encoding_dim
        rows = lambda positions: encode(positions, width)  # noqa: E731
    return PagedBatch.from_kwargs(kwargs, plan, rows)


def begin_hf_attn_batch(model, kwargs: dict, plan: CachePlan) -> PagedBatch:
    """An hf_attn model's batch: P's rows from its own table (`wpp`), where it has positional heads."""
    table = getattr(model, "wpp", None)
    return PagedBatch.from_kwargs(kwargs, plan, table)


def hf_attn_plan(config, dtype: torch.dtype) -> CachePlan:
    """Which group keeps each head of an hf_attn model (one key/value head per query head): a windowed kind its
    sinks and window, another every token; a kind without content (positional) its values alone."""
    layers, windows, sinks = {}, [0], [0]
    for layer_idx, layout in enumerate(config.head_layout):
        kept: dict[str, tuple[list[int], list[int]]] = {}
        for h, name in enumerate(layout):
            kind = HEAD_KINDS[name]
            window = kind.window(config)
            group = EVERY_TOKEN if window is None else SINKS_AND_WINDOW
            keys, values = kept.setdefault(group, ([], []))
            if kind.content:
                keys.append(h)
            values.append(h)
            if window is not None:
                windows.append(window)
                sinks.append(kind.sinks(config))
        layers[layer_idx] = {group: HeadsKept(tuple(k), tuple(v)) for group, (k, v) in kept.items()}
    value_dim = config.n_embd // config.n_head
    original = config.n_layer * config.n_head * (config.content_qk_dim + value_dim) * dtype.itemsize
    return CachePlan(layers, config.content_qk_dim, value_dim, max(sinks), max(windows), original)
