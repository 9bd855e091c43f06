"""Building blocks of hf_attn models: the attention layer that groups heads by kind, the MLP and three block styles.

GPT-2's parameter names (`attn.c_attn`, `attn.c_proj`, `ln_1`, `ln_2`, `mlp.c_fc`, `mlp.c_proj`), so a GPT-2
state dict loads into a global-only layout.
"""

import weakref

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.pytorch_utils import Conv1D

from .attention_hf_attn import MAX_SHARED_WEIGHTS_ELEMENTS, apply_positional_weights
from .attention_inputs_hf_attn import AttentionInputs, key_indices, place_columns, taken_columns
from .cache_hf_attn import HeadKindLayer
from .configuration_hf_attn import HfAttnConfig
from .head_kinds_hf_attn import HEAD_KINDS, HeadKind, kinds_in
from .position_encodings_hf_attn import apply_rotary, fixed_table


class FixedTable(nn.Module):
    """A fixed encoding table looked up by position (sinusoidal residual positions, fixed P).

    Non-persistent: nothing to save, and `_init_weights` refills it after `from_pretrained` builds on meta. Held in
    the dtype the model is built in (`from_pretrained(dtype=...)`, `from_config(dtype=...)` set the default dtype
    meanwhile; `model.to(dtype)` casts it), as every parameter: its rows meet bfloat16 or float16 weights directly.
    """

    def __init__(self, kind: str, num_positions: int, dim: int):
        super().__init__()
        self.kind = kind
        self.register_buffer("table", self.build(num_positions, dim), persistent=False)

    def build(self, num_positions: int, dim: int) -> torch.Tensor:
        return fixed_table(self.kind, num_positions, dim).to(torch.get_default_dtype())

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.table[position_ids]


class Projection(Conv1D):
    """GPT-2's `Conv1D` (a Linear with transposed weights) that knows its place in the block.

    `_init_weights` draws each projection from its place alone: transformers never calls it on parameter-less
    parents (the attention layer, the MLP) of models defined outside the library. `parts` are output column
    groups drawn as separate matrices (queries and keys, then values, in `c_attn`, as Paper A's code has them).
    """

    def __init__(self, nf: int, nx: int, in_attention: bool, writes_residual: bool = False,
                 parts: tuple[int, ...] | None = None):  # fmt: skip
        super().__init__(nf, nx)
        self.in_attention = in_attention
        self.writes_residual = writes_residual
        self.parts = parts or (nf,)


# --- attention layer -------------------------------------------------------------------------------------------


class InferenceWeights:
    """Positional heads' weights kept from one inference forward to the next.

    They depend only on P's rows and `p_attn`, so an evaluation loop over batches of one length need not form them
    again. They are kept once the same rows come a second time: a loop forms them on its second batch and reuses them
    from the third, while a one-off forward (a prompt to prefill) takes the route its shape prefers, often the fused
    one, 2-5x faster at T = 256-1024 than forming the weights (one layer, forward only, CPU). Used for whole
    sequences (not decoding steps) when no gradient is recorded, nothing is padded (padding makes them per sample)
    and not under torch.compile. Recomputed when the rows or a parameter of `p_attn` differ from those they came
    from. Compared by value, not by version counter: an edit through `.data` changes a parameter without moving its
    counter. The comparison reads P's rows and `p_attn` once, far less than the (H, T, S) weights it saves.
    """

    def __init__(self):
        self.sources: list[torch.Tensor] | None = None  # copies of the rows and `p_attn` of the last forward
        self.weights: torch.Tensor | None = None  # the weights they gave, once kept

    @staticmethod
    def applies(inputs: AttentionInputs) -> bool:
        unmasked = inputs.key_mask is None and inputs.pair_mask is None
        return unmasked and not (torch.is_grad_enabled() or torch.compiler.is_compiling())

    @staticmethod
    def fits(heads: int, num_keys: int) -> bool:
        """Larger weights are recomputed rather than held (the fused route never forms them)."""
        return heads * num_keys * num_keys <= MAX_SHARED_WEIGHTS_ELEMENTS

    def seen(self, p_attn: nn.Module, rows: torch.Tensor) -> bool:
        """Whether the last forward had these rows and parameters."""
        return self.sources is not None and all(map(_same_tensor, self.sources, [rows, *p_attn.parameters()]))

    def remember(self, p_attn: nn.Module, rows: torch.Tensor, weights: torch.Tensor | None) -> None:
        self.sources, self.weights = [t.detach().clone() for t in [rows, *p_attn.parameters()]], weights


class DecodingKeys:
    """Positional heads' keys by position, kept from one decoding step to the next.

    A whole sequence projects P at every position anyway. A decoding step would project all S rows again for its
    one query: S x d_P x width per layer and token, more than the rest of the step at long context. The keys depend
    on the position and `p_attn` alone, so they are kept here for the positions reached so far, once for every
    sequence and batch; the cache keeps values only. Used when no gradient is recorded and not under torch.compile.
    Checked against `p_attn` and P by value, as in `InferenceWeights` (an edit through `.data` moves no version
    counter), the first time each decoding cache comes: within one cache the weights are fixed, as every cached value
    already assumes.
    """

    def __init__(self, num_positions: int):
        self.num_positions = num_positions
        self.keys: torch.Tensor | None = None  # (H, positions so far, qk)
        self.sources: list[torch.Tensor] | None = None  # copies of `p_attn`'s and P's tensors the keys came from
        self.checked_for: weakref.WeakSet = weakref.WeakSet()  # the cache layers the kept keys were checked for

    def __getstate__(self) -> dict:
        """Pickled (`torch.save(model)`, `copy.deepcopy`) without what it keeps: a copy starts afresh."""
        return {"num_positions": self.num_positions}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["num_positions"])

    @staticmethod
    def applies() -> bool:
        return not (torch.is_grad_enabled() or torch.compiler.is_compiling())

    @staticmethod
    def source_tensors(p_attn: Projection, table: nn.Module) -> list[torch.Tensor]:
        return [*p_attn.parameters(), *table.parameters(), *table.buffers()]

    def get(self, p_attn: Projection, inputs: AttentionInputs, cache_layer, heads: int) -> torch.Tensor:
        """(B|1, H, S, qk): the keys at `inputs.key_positions`, projecting only positions not reached before."""
        table = inputs.positional_encoding
        if cache_layer not in self.checked_for:
            current = self.source_tensors(p_attn, table)
            if self.sources is None or not all(map(_same_tensor, self.sources, current)):
                self.keys = None
                self.checked_for.clear()
            self.checked_for.add(cache_layer)
        have = 0 if self.keys is None else self.keys.shape[1]
        num_keys = inputs.key_positions.shape[-1]
        needed = min(num_keys, self.num_positions)  # positions count real tokens from 0
        if needed > have:  # grow geometrically: one new position per step on average
            end = min(self.num_positions, max(needed, 2 * have))
            positions = torch.arange(have, end, device=p_attn.weight.device)
            width = p_attn.nf // 2  # queries, then keys
            new = torch.addmm(p_attn.bias[width:], table(positions), p_attn.weight[:, width:])
            new = new.view(len(positions), heads, -1).transpose(0, 1)
            self.keys = (new if self.keys is None else torch.cat([self.keys, new], dim=1)).contiguous()
            self.sources = [t.detach().clone() for t in self.source_tensors(p_attn, table)]
        if inputs.keys_in_order:
            return self.keys[None, :, :num_keys]  # a view
        return self.keys[:, inputs.key_positions].transpose(0, 1)


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)


def _index_or_slice(indices: list[int]) -> slice | list[int]:
    """A slice (a view, free) when the heads of a kind are contiguous, else the list of head indices.

    Plain Python, not a tensor: `from_pretrained` builds the model on the meta device, where a tensor made in
    `__init__` would stay without data (unlike a parameter or a buffer, nothing refills it).
    """
    if indices == list(range(indices[0], indices[0] + len(indices))):
        return slice(indices[0], indices[0] + len(indices))
    return indices


def _take_heads(x: torch.Tensor, heads: slice | list[int], dim: int = 1) -> torch.Tensor:
    if isinstance(heads, slice):
        return x.narrow(dim, heads.start, heads.stop - heads.start)
    return x.index_select(dim, torch.tensor(heads, device=x.device))


class HfAttnAttention(nn.Module):
    """Multi-head attention whose heads follow `config.head_layout[layer_idx]`, run kind by kind as `HEAD_KINDS` says.

    `c_attn` projects to [queries of content heads | keys of content heads | values of all heads], heads in
    layout order (a global-only layout is GPT-2's `c_attn`). Queries and keys are `content_qk_dim` wide, values
    `n_embd / n_head`. Positional heads take queries and keys from P through `p_attn` instead (Paper A), and
    values from the data like every head.
    """

    def __init__(self, config: HfAttnConfig, layer_idx: int):
        super().__init__()
        layout = config.head_layout[layer_idx]
        self.layer_idx = layer_idx
        self.head_dim = config.n_embd // config.n_head
        self.qk_dim = config.content_qk_dim
        content_heads = [h for h, name in enumerate(layout) if HEAD_KINDS[name].content]
        self.num_content_heads = len(content_heads)
        self.kinds = kinds_in(layout)
        # Per kind: where its heads sit among the values (all heads) and among queries/keys (content heads).
        self.value_heads = {
            kind.name: _index_or_slice([h for h, name in enumerate(layout) if name == kind.name]) for kind in self.kinds
        }
        self.content_heads = {
            kind.name: _index_or_slice([i for i, h in enumerate(content_heads) if layout[h] == kind.name])
            for kind in self.kinds
            if kind.content
        }
        kind_order = [h for kind in self.kinds for h in range(config.n_head) if layout[h] == kind.name]
        # argsort of kind_order: where each head of the layout sits among the heads grouped by kind
        restore_order = sorted(range(config.n_head), key=kind_order.__getitem__)
        self.restore_order = None if kind_order == sorted(kind_order) else restore_order

        query_key_width = 2 * self.num_content_heads * self.qk_dim
        self.c_attn = Projection(query_key_width + config.n_embd, config.n_embd, in_attention=True,
                                 parts=(query_key_width, config.n_embd))  # fmt: skip
        self.c_proj = Projection(config.n_embd, config.n_embd, in_attention=True, writes_residual=True)
        self.num_positional_heads = config.n_head - self.num_content_heads
        if self.num_positional_heads:
            self.positional_qk_dim = config.positional_qk_dim
            query_key_width = 2 * self.num_positional_heads * config.positional_qk_dim
            self.p_attn = Projection(query_key_width, config.positional_encoding_dim, in_attention=True)
            self.inference_weights = InferenceWeights()
            self.decoding_keys = DecodingKeys(config.n_positions)
            self.positional_impl = config.positional_attention_impl
        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

        self.scale = self.qk_dim**-0.5 if config.scale_attn_weights else 1.0
        if config.scale_attn_by_inverse_layer_idx:
            self.scale /= float(layer_idx + 1)
        self.visibility = {kind.name: kind.visibility(config) for kind in self.kinds}
        self.choose_kernels(config)

    def choose_kernels(self, config: HfAttnConfig) -> None:
        """Each kind's kernel as `config` chooses now (`set_attn_implementation` changes the global heads' choice)."""
        self.kernels = {kind.name: kind.kernel(config) for kind in self.kinds}

    def split_heads(self, hidden_states: torch.Tensor, rotary) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, length, _ = hidden_states.shape
        content_width = self.num_content_heads * self.qk_dim
        q, k, v = self.c_attn(hidden_states).split([content_width, content_width, hidden_states.shape[-1]], dim=-1)
        q = q.view(batch, length, -1, self.qk_dim).transpose(1, 2)  # (B, H_content, T, D_qk)
        k = k.view(batch, length, -1, self.qk_dim).transpose(1, 2)
        v = v.view(batch, length, -1, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        return q, k, v

    def forward(
        self,
        hidden_states: torch.Tensor,
        inputs: AttentionInputs,
        cache_layer: HeadKindLayer | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if hasattr(cache_layer, "layer_attention"):  # a paged cache, under continuous batching (`hf_attn.serving`)
            return cache_layer.layer_attention(self, hidden_states, inputs), None
        batch, length, _ = hidden_states.shape
        q, k, v = self.split_heads(hidden_states, inputs.rotary)
        dropout = self.attn_dropout.p if self.training else 0.0
        outputs, weights, values_used, key_index = [], [], [], []
        for kind in self.kinds:
            values = _take_heads(v, self.value_heads[kind.name])
            if kind.content:
                queries = _take_heads(q, self.content_heads[kind.name])
                keys = _take_heads(k, self.content_heads[kind.name])
                out, w, values, key_start = self.content_heads_forward(
                    kind, queries, keys, values, inputs, cache_layer, dropout, output_attentions
                )
            else:
                out, w, values, key_start = self.positional_heads(
                    kind, values, length, inputs, cache_layer, dropout, output_attentions
                )
            outputs.append(out)
            weights.append(w)
            values_used.append(values)
            key_index.append(key_indices(key_start, values.shape[-2], v.device))
        attentions = None
        if output_attentions:
            # Each kind's weights over the keys it kept (a window, sinks apart from it, a static cache's slots), put
            # in the column of each key's index: weights over every position, in token order, 0 for keys not kept.
            num_keys = inputs.key_positions.shape[-1]
            placed = [place_columns(w.expand(batch, -1, -1, -1), index, num_keys) for w, index in
                      zip(weights, key_index, strict=True)]  # fmt: skip
            attentions = self.in_layout_order(torch.cat(placed, dim=1))
            outputs = self.outputs_from(attentions, values_used, key_index, dropout)

        # (B, T, H, D) heads side by side, one copy; then (B, T, C) for free
        out = torch.cat([o.transpose(1, 2) for o in outputs], dim=2) if len(outputs) > 1 else outputs[0].transpose(1, 2)
        # contiguous: with one head the reshape can be a strided view (e.g. of a broadcast matmul), which Conv1D's
        # .view refuses
        out = self.in_layout_order(out, dim=2).reshape(batch, length, -1).contiguous()
        return self.resid_dropout(self.c_proj(out)), attentions

    def outputs_from(self, attentions: torch.Tensor, values: list[torch.Tensor], key_index: list[torch.Tensor],
                     dropout: float) -> list[torch.Tensor]:  # fmt: skip
        """Each kind's output computed from the very (B, H, T, S) weights `output_attentions` returns, as GPT-2's eager
        attention does: gradients then reach them (`attentions[i].retain_grad()`, attribution methods)."""
        outputs = []
        for kind, kind_values, index in zip(self.kinds, values, key_index, strict=True):
            kind_weights = taken_columns(_take_heads(attentions, self.value_heads[kind.name]), index)
            kind_weights = nn.functional.dropout(kind_weights, dropout).to(kind_values.dtype)
            outputs.append(torch.matmul(kind_weights, kind_values))
        return outputs

    def in_layout_order(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """Heads come out grouped by kind; put them back in layout order along the head dimension `dim`."""
        return x if self.restore_order is None else _take_heads(x, self.restore_order, dim)

    def cached(self, kind: HeadKind, keys, values, length: int, inputs: AttentionInputs, cache_layer):
        """The keys and values `kind`'s queries see (past ones from the cache, which keeps the new ones), whether
        they end at the last query (see `AttentionInputs.key_mask_for`), and the kernel's `key_mask` for them."""
        key_start, contiguous = 0, True
        if cache_layer is not None:
            keys, values, key_start = cache_layer.update_kind(kind, keys, values)
            contiguous = cache_layer.is_contiguous(kind)
        visibility = self.visibility[kind.name]
        key_mask = inputs.key_mask_for(visibility, key_start, values.shape[-2], length, contiguous)
        return keys, values, key_start, contiguous, key_mask

    def attend(self, kind: HeadKind, q, k, v, key_mask, scale: float, dropout: float) -> torch.Tensor:
        """(B, H, T, D): `kind`'s heads through its function in transformers' attention interface."""
        return kind.attention_function()(self, q, k, v, key_mask, scaling=scale, dropout=dropout)[0].transpose(1, 2)

    def content_heads_forward(self, kind: HeadKind, q, k, v, inputs, cache_layer, dropout, output_attentions):
        """`kind`'s output, its weights with `output_attentions`, the values and where its keys start (or their
        indices: see `HeadKindLayer.update_kind`)."""
        k, v, key_start, _, key_mask = self.cached(kind, k, v, q.shape[-2], inputs, cache_layer)
        if output_attentions:
            visibility = self.visibility[kind.name]
            return *kind.kernel_with_weights(q, k, v, visibility, key_mask, self.scale, dropout), v, key_start
        return self.attend(kind, q, k, v, key_mask, self.scale, dropout), None, v, key_start

    def positional_heads(self, kind: HeadKind, v, length: int, inputs: AttentionInputs, cache_layer, dropout: float,
                         output_attentions: bool):  # fmt: skip
        """Weights from P alone, by the route `positional_attention_impl` picks; in inference, weights that fit are
        kept once the same positions come twice (see `InferenceWeights`), and decoding keeps P's keys (see
        `DecodingKeys`)."""
        _, v, key_start, contiguous, key_mask = self.cached(kind, v, v, length, inputs, cache_layer)
        visibility, scale = self.visibility[kind.name], self.positional_qk_dim**-0.5
        num_keys = v.shape[-2]
        if not contiguous:  # a static cache's slots
            pq, pk = self.static_slot_queries_and_keys(inputs, key_start, num_keys)
            if output_attentions:
                return *kind.kernel_with_weights(pq, pk, v, visibility, key_mask, scale, dropout), v, key_start
            return self.attend(kind, pq, pk, v, key_mask, scale, dropout), None, v, key_start
        decoding = length < num_keys
        if decoding and DecodingKeys.applies():
            rows = inputs.positional_encoding(inputs.query_positions)  # the queries' rows only
            pq = self.positional_projection(rows)[:, :, 0].transpose(1, 2)
            pk = self.decoding_keys.get(self.p_attn, inputs, cache_layer, pq.shape[1])
            return *kind.kernel_with_weights(pq, pk, v, visibility, key_mask, scale, dropout), v, key_start
        rows = inputs.positional_encoding(inputs.key_positions[:, -num_keys:])  # (B|1, S, d_P)
        reusable = (
            not decoding
            and self.positional_impl != "fused"
            and InferenceWeights.applies(inputs)
            and InferenceWeights.fits(self.num_positional_heads, num_keys)
        )
        seen = reusable and self.inference_weights.seen(self.p_attn, rows)
        if seen and self.inference_weights.weights is not None:
            weights = self.inference_weights.weights
            return apply_positional_weights(weights, v), weights, v, key_start
        projected = self.positional_projection(rows)
        pq, pk = projected[:, -length:, 0].transpose(1, 2), projected[:, :, 1].transpose(1, 2)  # (B|1, H, T|S, qk)
        if seen or output_attentions:
            out, weights = kind.kernel_with_weights(pq, pk, v, visibility, key_mask, scale, dropout)
        else:
            out, weights = self.attend(kind, pq, pk, v, key_mask, scale, dropout), None
        if reusable:
            self.inference_weights.remember(self.p_attn, rows, weights if seen else None)
        return out, weights, v, key_start

    def static_slot_queries_and_keys(self, inputs: AttentionInputs, key_start, num_slots: int):
        """(B|1, H, T, d_P) queries and (B|1, H, S, d_P) keys whose scores are P's attention over a static cache's
        slots, without projecting P at every slot, every step (`DecodingKeys` keeps no state under graph capture).

        A query q scores key position j as q . (P_j Wk + bk). The query taken through the key projection,
        u = q Wk^T, scores the rows P_j themselves: u . P_j, and q . bk is the same for every key of a query, which a
        softmax ignores. The rows are read once per forward for every layer (`AttentionInputs.positional_rows`).
        """
        heads, qk = self.num_positional_heads, self.positional_qk_dim
        queries = self.positional_projection(inputs.positional_encoding(inputs.query_positions))[:, :, 0]
        key_weight = self.p_attn.weight[:, heads * qk :].view(-1, heads, qk)  # (d_P, H, qk): Conv1D is (in, out)
        through_keys = torch.einsum("bthq,phq->bhtp", queries, key_weight)
        rows = inputs.positional_rows(key_start, num_slots, self.decoding_keys.num_positions)  # (B|1, S, d_P)
        return through_keys, rows[:, None].expand(-1, heads, -1, -1)

    def positional_projection(self, rows: torch.Tensor) -> torch.Tensor:
        """(B|1, N, 2, H_pos, qk): P's queries and keys of every positional head at `rows` (B|1, N, d_P)."""
        return self.p_attn(rows).view(*rows.shape[:2], 2, self.num_positional_heads, -1)


# --- blocks ----------------------------------------------------------------------------------------------------


class HfAttnMLP(nn.Module):
    """GPT-2's MLP; `input_dim` is 2 * n_embd in Paper A's concat-then-MLP block."""

    def __init__(self, config: HfAttnConfig, input_dim: int):
        super().__init__()
        inner_dim = config.n_inner if config.n_inner is not None else 4 * config.n_embd
        self.c_fc = Projection(inner_dim, input_dim, in_attention=False)
        self.c_proj = Projection(config.n_embd, inner_dim, in_attention=False, writes_residual=True)
        self.act = ACT2FN[config.activation_function]
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(hidden_states))))


class PreLNBlock(GradientCheckpointingLayer):
    """GPT-2: `x + attn(LN(x))`, then `x + mlp(LN(x))`."""

    def __init__(self, config: HfAttnConfig, layer_idx: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = HfAttnAttention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = HfAttnMLP(config, config.n_embd)

    def forward(self, hidden_states, inputs, cache_layer=None, output_attentions=False) -> torch.Tensor:
        attn_output, _ = self.attn(self.ln_1(hidden_states), inputs, cache_layer, output_attentions)
        hidden_states = hidden_states + attn_output
        return hidden_states + self.mlp(self.ln_2(hidden_states))


class PostLNBlock(PreLNBlock):
    """Paper B: `LN(x + attn(x))`, then `LN(x + mlp(x))`."""

    def forward(self, hidden_states, inputs, cache_layer=None, output_attentions=False) -> torch.Tensor:
        attn_output, _ = self.attn(hidden_states, inputs, cache_layer, output_attentions)
        hidden_states = self.ln_1(hidden_states + attn_output)
        return self.ln_2(hidden_states + self.mlp(hidden_states))


class NoLayerNormBlock(GradientCheckpointingLayer):
    """Paper A's k-hop induction code (minGPT with its LayerNorms made identities): `x + attn(x)`, `x + mlp(x)`."""

    def __init__(self, config: HfAttnConfig, layer_idx: int):
        super().__init__()
        self.attn = HfAttnAttention(config, layer_idx)
        self.mlp = HfAttnMLP(config, config.n_embd)

    def forward(self, hidden_states, inputs, cache_layer=None, output_attentions=False) -> torch.Tensor:
        attn_output, _ = self.attn(hidden_states, inputs, cache_layer, output_attentions)
        hidden_states = hidden_states + attn_output
        return hidden_states + self.mlp(hidden_states)


class ConcatMLPBlock(GradientCheckpointingLayer):
    """Paper A: `MLP(concat(x, attn(x)))`, no residual and no LayerNorm."""

    def __init__(self, config: HfAttnConfig, layer_idx: int):
        super().__init__()
        self.attn = HfAttnAttention(config, layer_idx)
        self.mlp = HfAttnMLP(config, 2 * config.n_embd)

    def forward(self, hidden_states, inputs, cache_layer=None, output_attentions=False) -> torch.Tensor:
        attn_output, _ = self.attn(hidden_states, inputs, cache_layer, output_attentions)
        return self.mlp(torch.cat([hidden_states, attn_output], dim=-1))


BLOCKS = {"gpt2": PreLNBlock, "post_ln": PostLNBlock, "concat_mlp": ConcatMLPBlock, "no_layernorm": NoLayerNormBlock}


__all__ = ["AttentionInputs", "FixedTable", "Projection", "HfAttnAttention", "HfAttnMLP", "BLOCKS"]
