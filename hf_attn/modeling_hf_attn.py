"""GPT-2-style models whose heads are global, local or positional: trunk, task heads and the three model types.

GPT-2's skeleton and parameter names (`wte`, `wpe`, `h`, `ln_f`), so a GPT-2 state dict loads into a global-only
layout. What differs lives in `layers_hf_attn.py` (attention by head kind, block styles) and here: the residual
position encoding, numeric inputs, positions counted over real tokens, and the cache.
"""

import os
from collections.abc import Callable
from typing import ClassVar, Protocol

import torch
from torch import nn
from transformers import Cache, DynamicCache, GenerationMixin, PreTrainedModel, StaticCache
from transformers import initialization as init
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    CausalLMOutputWithPast,
    SequenceClassifierOutputWithPast,
    TokenClassifierOutput,
)
from transformers.utils import can_return_tuple

from .attention_hf_attn import rotary_cos_sin
from .cache_hf_attn import HfAttnCache
from .configuration_hf_attn import HfAttnConfig, HybridGPT2Config, LocalGPT2Config, PositionalGPT2Config
from .head_kinds_hf_attn import HEAD_KINDS
from .layers_hf_attn import BLOCKS, AttentionInputs, FixedTable, HfAttnAttention, Projection

# --- trunk -----------------------------------------------------------------------------------------------------


class Sharing(Protocol):
    """What hf_attn adds to saving and pushing where it is installed: `hf_attn.hub`, whose model card templates are
    not exported with this code."""

    def write_model_type_card(self, model: PreTrainedModel, folder: str | os.PathLike) -> object: ...

    def push_model(self, model: PreTrainedModel, repo_id: str, **push_kwargs) -> object: ...


# `save_pretrained`'s arguments that belong to its push (`push_to_hub=True`), as `push_to_hub` names them.
PUSH_ARGUMENTS = ("repo_id", "commit_message", "commit_description", "private", "token", "revision", "create_pr",
                  "tags")  # fmt: skip


class RemoteCodeQuery:
    """`is_remote_code()` asked of a model answers for that model, asked of a class for the class. transformers asks
    both (the class when loading, the model when saving); `enable_remote_code` marks one model, not its class."""

    def __get__(self, model, model_class) -> Callable[[], bool]:
        return lambda: (model_class if model is None else model)._auto_class is not None


class CardSharing:
    """`save_pretrained` and `push_to_hub` that write the model's card, for hf_attn's models and hybridized ones."""

    # Set to `hf_attn.hub` when hf_attn is imported. Where this file runs as remote code without hf_attn it stays None,
    # and saving and pushing are transformers' own (without a card: the templates are not exported).
    sharing: ClassVar[Sharing | None] = None

    def save_pretrained(self, save_directory: str | os.PathLike, is_main_process: bool = True, *args, **kwargs):
        """transformers' `save_pretrained`, then, where hf_attn is installed, the model card as README.md.

        With `push_to_hub=True` the push is `push_to_hub`'s (transformers' arguments: `repo_id`, by default the
        folder's name, `commit_message`, `private`, `token`, ...), so the Hub gets this model's card too, not the
        generic one transformers would upload."""
        push = self.sharing is not None and is_main_process and kwargs.pop("push_to_hub", False)
        hub_kwargs = {name: kwargs.pop(name) for name in PUSH_ARGUMENTS if name in kwargs} if push else {}
        super().save_pretrained(save_directory, is_main_process, *args, **kwargs)
        if self.sharing is not None and is_main_process:
            self.sharing.write_model_type_card(self, save_directory)
        if push:
            repo_id = hub_kwargs.pop("repo_id", os.path.basename(os.path.normpath(save_directory)))
            max_shard_size = kwargs.get("max_shard_size", "50GB")
            self.push_to_hub(repo_id, max_shard_size=max_shard_size, **hub_kwargs)

    def push_to_hub(self, repo_id: str, **kwargs):
        """transformers' `push_to_hub`, with this model's card in place of the generic one where hf_attn is installed
        (`hf_attn.hub.push_model`)."""
        if self.sharing is None:
            return super().push_to_hub(repo_id, **kwargs)
        return self.sharing.push_model(self, repo_id, **kwargs)


class HfAttnPreTrainedModel(CardSharing, PreTrainedModel):
    config: HfAttnConfig
    base_model_prefix = "transformer"
    supports_gradient_checkpointing = True
    # `attn_implementation` chooses the global heads' kernel (HEAD_KINDS["global"].kernels: "sdpa", "eager",
    # "flex_attention"); local and positional heads run theirs, registered in transformers' `AttentionInterface` as
    # "hf_attn_local" and "hf_attn_positional". FlashAttention is refused (`get_correct_attn_implementation`): its
    # kernels take no per-head masks. The cache is static-capable and `forward` captures as one graph.
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_flash_attn = False
    # Not a backend for vLLM or TGI (transformers' meaning of the flag): that needs a tensor-parallel plan and every
    # layer's attention behind one function of the interface, where ours runs one per head kind. What transformers'
    # padding-free tests check behind it holds: rows packed without a mask, positions restarting per document, give
    # the padded batch's outputs, however long the row (tests/test_masks.py).
    _supports_attention_backend = False
    _can_compile_fullgraph = True

    def __init__(self, config: HfAttnConfig, *inputs, **kwargs):
        super().__init__(config, *inputs, **kwargs)
        # Only this model's block class: FSDP's default wrapping (and `device_map`) fail on a listed class it lacks.
        self._no_split_modules = [BLOCKS[config.block_style].__name__]

    is_remote_code = RemoteCodeQuery()

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs):
        """Refuses a config edited after the model was built that no longer fits its weights (the checkpoint would
        not load), then saves as `CardSharing` does."""
        if changed := self.fields_out_of_step():
            raise ValueError(
                f"The config was edited after this model was built: {', '.join(changed)} no longer fits its weights, "
                "so the checkpoint would not load. Build a new model from the edited config "
                "(`AutoModelForCausalLM.from_config(model.config)`), or set the field back."
            )
        return super().save_pretrained(save_directory, *args, **kwargs)

    def fields_out_of_step(self) -> list[str]:
        """Config fields that no longer describe the weights: a learned position table's length, P's width."""
        config, built = self.config, {}
        for table in (getattr(self.base_model, "wpe", None), getattr(self.base_model, "wpp", None)):
            if isinstance(table, nn.Embedding):
                built["n_positions"] = table.num_embeddings
        if (table := getattr(self.base_model, "wpp", None)) is not None:
            rows = table.weight if isinstance(table, nn.Embedding) else table.table
            built["positional_encoding_dim"] = rows.shape[-1]
        return [f"`{field}`={getattr(config, field)} (built with {value})" for field, value in built.items()
                if value != getattr(config, field)]  # fmt: skip

    def get_correct_attn_implementation(self, requested_attention: str | None, is_init_check: bool = False) -> str:
        """transformers' check of `attn_implementation`, refusing with what is supported: the global heads' kernels."""
        supported = list(HEAD_KINDS["global"].kernels)
        if requested_attention is not None and requested_attention not in supported:
            raise ValueError(
                unsupported_attention(requested_attention, supported)
                + f" ({type(self).__name__}: the global heads' kernel; local and positional heads run their own)."
            )
        return requested_attention or supported[0]

    def set_attn_implementation(self, attn_implementation: str | dict, **kwargs) -> None:
        """transformers' switch, carried to the layers' kernels."""
        super().set_attn_implementation(attn_implementation, **kwargs)
        for module in self.modules():
            if isinstance(module, HfAttnAttention):
                module.choose_kernels(self.config)

    def _init_weights(self, module: nn.Module) -> None:
        if self.config.initialization == "paper_a":
            init_paper_a(module)
        else:
            self.init_gpt2(module)
        if isinstance(module, FixedTable):
            init.copy_(module.table, module.build(*module.table.shape))

    def init_gpt2(self, module: nn.Module) -> None:
        """GPT-2's: normal(initializer_range) everywhere, projections into the residual stream scaled down."""
        super()._init_weights(module)  # Linear, Embedding, LayerNorm
        if isinstance(module, Projection):
            std = self.config.initializer_range
            if module.writes_residual:
                std /= (2 * self.config.n_layer) ** 0.5
            init.normal_(module.weight, mean=0.0, std=std)
            init.zeros_(module.bias)


def init_paper_a(module: nn.Module) -> None:
    """Paper A's code: Xavier-uniform attention projections with zero biases, PyTorch's defaults for the rest.

    Its attention has separate query-key, value and output projections; `c_attn` holds the first two side by side
    (`Projection.parts`), so each part gets the Xavier bound of its own shape.
    """
    if isinstance(module, Projection) and module.in_attention:
        if not getattr(module.weight, "_is_hf_initialized", False):  # column slices would lose the loaded flag
            for part in module.weight.split(module.parts, dim=1):
                bound = (6 / sum(part.shape)) ** 0.5  # Xavier-uniform: fan-in + fan-out
                part.uniform_(-bound, bound)
        init.zeros_(module.bias)
    elif isinstance(module, Projection):  # the MLP: PyTorch's Linear default, U(+-1/sqrt(fan_in)) for both
        bound = module.nx**-0.5
        init.uniform_(module.weight, -bound, bound)
        init.uniform_(module.bias, -bound, bound)
    elif isinstance(module, nn.Linear):
        init.kaiming_uniform_(module.weight, a=5**0.5)  # PyTorch's Linear default, as above
        if module.bias is not None:
            init.uniform_(module.bias, -(module.in_features**-0.5), module.in_features**-0.5)
    elif isinstance(module, nn.Embedding):
        init.normal_(module.weight)  # PyTorch's default: N(0, 1)
    elif isinstance(module, nn.LayerNorm):
        init.ones_(module.weight)
        init.zeros_(module.bias)


class HfAttnModel(HfAttnPreTrainedModel):
    """The trunk: embeddings, blocks, final LayerNorm (GPT-2 style only; post-LN blocks end normalised)."""

    def __init__(self, config: HfAttnConfig):
        super().__init__(config)
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        if config.position_embedding_type == "learned":
            self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        elif config.position_embedding_type == "sinusoidal":
            self.wpe = FixedTable("sinusoidal", config.n_positions, config.n_embd)
        if config.numeric_inputs:
            self.wne = nn.Linear(1, config.n_embd)  # Paper A: a number enters as value * w + b
        if config.uses_positional_heads:  # P, shared by every layer (Paper A)
            if config.positional_encoding == "learned":
                self.wpp = nn.Embedding(config.n_positions, config.positional_encoding_dim)
            else:
                self.wpp = FixedTable(config.positional_encoding, config.n_positions, config.positional_encoding_dim)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList([BLOCKS[config.block_style](config, i) for i in range(config.n_layer)])
        self.ln_f = (
            nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
            if config.block_style == "gpt2"
            else nn.Identity()
        )
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.wte

    def set_input_embeddings(self, new_embeddings: nn.Embedding) -> None:
        self.wte = new_embeddings

    def check_shapes(self, input_ids, inputs_embeds, numeric_values, attention_mask) -> int:
        """The new tokens' length; missing, conflicting and empty inputs are refused before any work."""
        if input_ids is not None and inputs_embeds is not None:
            raise ValueError("Pass either `input_ids` or `inputs_embeds`, not both.")
        if inputs_embeds is not None and numeric_values is not None:
            raise ValueError("`numeric_values` go with `input_ids` or alone, not with `inputs_embeds` (never read).")
        candidates = {"input_ids": input_ids, "inputs_embeds": inputs_embeds, "numeric_values": numeric_values}
        name = next((name for name, tensor in candidates.items() if tensor is not None), None)
        if name is None:
            raise ValueError("Pass `input_ids`, `inputs_embeds` or `numeric_values`.")
        given = candidates[name]
        dims = ("batch", "length", "n_embd") if name == "inputs_embeds" else ("batch", "length")
        if given.dim() != len(dims) or 0 in given.shape[:2]:
            raise ValueError(
                f"`{name}` must be ({', '.join(dims)}) with at least one sequence of at least one token, "
                f"got shape {tuple(given.shape)}."
            )
        if attention_mask is not None and attention_mask.dim() not in (2, 4):
            raise ValueError(
                "`attention_mask` must be 2-D (batch, keys) of 0/1, or 4-D (batch, 1, queries, keys): True or 0 where "
                f"a query may see a key; got shape {tuple(attention_mask.shape)}."
            )
        return given.shape[1]

    def numeric_positions(self, input_ids, numeric_values, numeric_mask, query_mask) -> torch.Tensor | None:
        """(B, T) bool: where the embedding is `wne(value)`. Never padding (`query_mask`, the queries' columns of
        the mask): values there are not used."""
        if numeric_values is None:
            return None
        if not self.config.numeric_inputs:
            raise ValueError("`numeric_values` were passed but the config has `numeric_inputs=False`.")
        if input_ids is None:
            positions = torch.ones(numeric_values.shape, dtype=torch.bool, device=numeric_values.device)
        elif numeric_mask is not None:
            positions = numeric_mask.bool()
        elif self.config.numeric_token_id is None:
            raise ValueError("With `numeric_values` and `input_ids`, pass `numeric_mask` or set `numeric_token_id`.")
        else:
            positions = input_ids == self.config.numeric_token_id
        if query_mask is not None:
            positions = positions & query_mask.bool()
        return positions

    def refusals(self, input_ids, attention_mask, numeric_values, numeric_positions) -> dict[str, tuple]:
        """Per checked field: its values, where a value is refused, and what is allowed. Token ids outside the
        vocabulary, masks other than 0/1 and non-finite numbers where used are refused: unchecked, `wte` fails with
        a bare IndexError, a 2 in the mask silently counts as 1, and one NaN spreads to every position (0 * NaN in
        attention) and into the gradients."""
        vocab_size = self.config.vocab_size
        checks = {}
        if input_ids is not None:
            out_of_range = (input_ids < 0) | (input_ids >= vocab_size)
            checks["input_ids"] = (input_ids, out_of_range, f"token ids in [0, {vocab_size}) (`vocab_size`)")
        if attention_mask is not None and attention_mask.dtype != torch.bool:
            not_binary = (attention_mask != 0) & (attention_mask != 1)
            checks["attention_mask"] = (attention_mask, not_binary, "only 0 (padding) and 1 (token)")
        if numeric_values is not None:
            not_finite = numeric_positions & ~torch.isfinite(numeric_values)
            checks["numeric_values"] = (
                numeric_values,
                not_finite,
                "finite numbers where they are used (values at padding and outside `numeric_mask` / "
                "`numeric_token_id` are ignored)",
            )
        return checks

    def ask(self, refusals: dict, attention_mask, position_ids, past_length, length: int) -> dict[str, int]:
        """Every question `forward` has about its inputs' values, asked on the device and read in one host sync:
        one wait per forward for an accelerator, not one per question. Under graph capture nothing is asked (an
        empty dict): the checks are skipped and the fast paths that need an answer are not taken."""
        if tracing():
            return {}
        questions = {f"refused {field}": refused.any() for field, (_, refused, _) in refusals.items()}
        if attention_mask is not None:
            questions["unpadded"] = attention_mask.all()
            positions, row_in_order = positions_and_order(attention_mask)
            questions["rows in order"] = row_in_order.all()
            if attention_mask.shape[-1] > self.config.n_positions:  # below, no position can be out of range
                shared = torch.arange(attention_mask.shape[-1], device=attention_mask.device)
                questions["largest position"] = torch.where(row_in_order, shared, positions).max()
        elif position_ids is None or not (isinstance(past_length, int) and past_length == 0):
            questions["largest position"] = past_length + length - 1  # keys sit at positions 0 .. past + T - 1
        if position_ids is not None:  # without a cache, the only positions: a packed row's restart
            questions["largest given position"] = position_ids.max()
            if attention_mask is None:
                questions["restarts"] = restarts_of(position_ids).any()
        tensors = {name: q for name, q in questions.items() if isinstance(q, torch.Tensor)}
        read = torch.stack([q.long() for q in tensors.values()]).tolist() if tensors else []  # the one sync
        known = {name: q for name, q in questions.items() if name not in tensors}
        return known | dict(zip(tensors, read, strict=True))

    @staticmethod
    def raise_refused(refusals: dict, answers: dict[str, int]) -> None:
        for field, (values, refused, allowed) in refusals.items():
            if answers.get(f"refused {field}"):
                row, position = refused.nonzero()[0].tolist()
                raise ValueError(
                    f"`{field}` must hold {allowed}; got {values[row, position].item()} at row {row}, "
                    f"position {position}."
                )

    def embed_inputs(self, input_ids, numeric_values, numeric_positions) -> torch.Tensor:
        """Token embeddings, with `wne(value)` at the numeric positions (all positions if there are no ids)."""
        embeds = None if input_ids is None else self.wte(input_ids)
        if embeds is not None and self.config.scale_embedding:
            embeds = embeds * self.config.n_embd**0.5
        if numeric_values is None:
            return embeds
        # Values elsewhere are replaced, not only their embeddings: 0 * NaN would still reach wne's gradient.
        values = torch.where(numeric_positions, numeric_values, 0.0)
        numbers = self.wne(values[..., None].to(self.wne.weight.dtype))  # (B, T, E)
        return numbers if embeds is None else torch.where(numeric_positions[..., None], numbers, embeds)

    def position_ids_from(self, attention_mask, past_length, length: int, device, num_keys: int | None = None,
                          in_order: bool | None = None) -> tuple[torch.Tensor, bool]:  # fmt: skip
        """(B|1, past + T) positions of every key: real tokens counted from 0, as `generate` does with padding; and
        whether key j simply sits at position j. `num_keys` replaces past + T without a mask (a static cache's size);
        `in_order` is the answer, when already read, to whether every row's key j sits at position j.

        One row for the whole batch unless some row is left-padded: then positional heads' weights stay one
        tensor for the batch (right padding, the usual training case, only masks keys). Under graph capture the
        question is not asked: every row gets its own.
        """
        if attention_mask is None:
            return torch.arange(past_length + length if num_keys is None else num_keys, device=device)[None], True
        positions, row_in_order = positions_and_order(attention_mask)
        shared = torch.arange(attention_mask.shape[-1], device=device)[None]
        if in_order is None:
            in_order = not tracing() and bool(row_in_order.all())
        if in_order:
            return shared, True
        # Chosen row by row, so that a row's positions (padding's included) never depend on the other rows.
        return torch.where(row_in_order, shared, positions), False

    def check_positions(self, largest: int | None) -> None:
        """Positions beyond the position tables are refused (eagerly; under graph capture the lookup fails instead)."""
        config = self.config
        tabled = config.position_embedding_type in ("learned", "sinusoidal") or config.uses_positional_heads
        if tabled and largest is not None and largest >= config.n_positions:
            raise ValueError(
                f"Position {largest} is beyond `n_positions`={config.n_positions}, the longest the "
                f"position encodings support (`position_embedding_type`={config.position_embedding_type!r}"
                + (f", `positional_encoding`={config.positional_encoding!r}" if config.uses_positional_heads else "")
                + "). Use shorter sequences or a config with a larger `n_positions`."
            )

    def adopt_cache(self, cache) -> HfAttnCache:
        """Another model's kind of cache, e.g. PEFT's prefix of virtual tokens (a `DynamicCache`, or a legacy tuple of
        (keys, values) per layer, (B, n_head, tokens, D)), taken in as the past of an `HfAttnCache`."""
        layers = cache if isinstance(cache, (tuple, list)) else [(layer.keys, layer.values) for layer in cache.layers]
        if not layers or layers[0][0] is None or layers[0][0].shape[-2] == 0:
            raise ValueError(
                f"`cache` must be an HfAttnCache (`generate` and the model make one; or `HfAttnCache(model.config)`), "
                f"got an empty {type(cache).__name__}."
            )
        if self.config.uses_positional_heads:
            raise ValueError(
                "A cache of past keys and values (e.g. PEFT prefix tuning) cannot be taken by positional heads: their "
                "weights come from positions, not keys, so virtual tokens would only shift every position. Global "
                "and local heads take one; use LoRA or prompt tuning for models with positional heads."
            )
        widths = {self.config.content_qk_dim, self.config.n_embd // self.config.n_head}
        if len(layers) != self.config.n_layer or any(k.shape[1] != self.config.n_head for k, _ in layers):
            raise ValueError(f"`cache` must hold {self.config.n_layer} layers of {self.config.n_head} heads.")
        if len(widths) > 1:
            raise ValueError("A foreign cache needs `content_qk_dim` equal to the values' width (n_embd / n_head).")
        adopted = HfAttnCache(self.config)
        for layer, (keys, values) in zip(adopted.layers, layers, strict=True):
            layer.update(keys, values)
        return adopted

    def attention_inputs(self, attention_mask, position_ids, key_position_ids, keys_in_order=False, pair_mask=None,
                         past_length=0, unpadded: bool | None = None) -> AttentionInputs:  # fmt: skip
        """`unpadded`: the answer, when already read, to whether the mask hides nothing (then it is dropped)."""
        if unpadded is None:
            unpadded = attention_mask is None or (not tracing() and bool(attention_mask.all()))
        key_mask = None if attention_mask is None or unpadded else attention_mask.bool()
        rotary = None
        if self.config.position_embedding_type == "rope":
            rotary = rotary_cos_sin(position_ids, self.config.content_qk_dim, self.config.rope_theta)
        return AttentionInputs(
            key_mask=key_mask, pair_mask=pair_mask, past_length=past_length, query_positions=position_ids,
            key_positions=key_position_ids, keys_in_order=keys_in_order,
            positional_encoding=getattr(self, "wpp", None), rotary=rotary,
        )  # fmt: skip

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        numeric_values: torch.Tensor | None = None,
        numeric_mask: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        r"""
        attention_mask (`torch.Tensor`, *optional*):
            (batch, keys) 0/1 over the cached and new tokens, or a custom (batch, 1, queries, keys) mask, bool (True
            where a query may see a key) or additive float (0 there, a large negative elsewhere), as GPT-2 takes it.
            Each head kind still sees only what it sees (a local head its window).
        position_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
            Without a mask, positions that restart mark packed documents (padding-free batches): every head attends
            only within its document.
        numeric_values (`torch.FloatTensor` of shape `(batch_size, sequence_length)`, *optional*):
            Numbers embedded as `value * w + b` (needs `config.numeric_inputs`) at the positions of `numeric_mask`,
            or of `config.numeric_token_id` in `input_ids`, or everywhere when `input_ids` is None.
        numeric_mask (`torch.BoolTensor` of shape `(batch_size, sequence_length)`, *optional*):
            Which positions take their embedding from `numeric_values`.
        """
        cache = kwargs.pop("past_key_values", cache)
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        length = self.check_shapes(input_ids, inputs_embeds, numeric_values, attention_mask)
        pair_mask = None
        if attention_mask is not None and attention_mask.dim() == 4:
            pair_mask, attention_mask = visible_pairs(attention_mask), None

        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        if use_cache and not self.config.is_causal:
            use_cache = False  # a bidirectional model's past depends on the future: recompute instead
        if cache is not None and not isinstance(cache, HfAttnCache):
            cache = self.adopt_cache(cache)
        if use_cache and cache is None:
            cache = HfAttnCache(self.config)
        past_length = cache.get_seq_length() if cache is not None else 0
        if isinstance(past_length, torch.Tensor):  # a static layer's own counter, which its updates move in place
            past_length = past_length.clone()
        elif past_length == 0 and cache is not None:
            cache.make_room_for_padding(attention_mask)
        static = cache is not None and cache.is_compileable
        if static and attention_mask is not None and attention_mask.dim() == 2:  # over every slot, as generate's
            attention_mask = nn.functional.pad(attention_mask, (0, cache.get_max_length() - attention_mask.shape[-1]))
        checked = attention_mask is not None and not (static or tracing())
        if checked and attention_mask.shape[-1] != past_length + length:
            raise ValueError(
                f"`attention_mask` must cover the {past_length} cached and {length} new tokens, "
                f"got {attention_mask.shape[-1]} columns."
            )
        query_mask = None if attention_mask is None else query_columns(attention_mask, past_length, length)
        numeric_positions = self.numeric_positions(input_ids, numeric_values, numeric_mask, query_mask)
        refusals = self.refusals(input_ids, attention_mask, numeric_values, numeric_positions)
        answers = self.ask(refusals, attention_mask, position_ids, past_length, length)
        self.raise_refused(refusals, answers)
        if inputs_embeds is None:
            inputs_embeds = self.embed_inputs(input_ids, numeric_values, numeric_positions)

        device = inputs_embeds.device
        num_keys = cache.get_max_length() if static else None
        in_order = False if tracing() else answers.get("rows in order")
        key_position_ids, keys_in_order = self.position_ids_from(
            attention_mask, past_length, length, device, num_keys, in_order
        )
        if position_ids is None:
            if attention_mask is None:
                position_ids = past_length + torch.arange(length, device=device)[None]
            else:
                position_ids = query_columns(key_position_ids, past_length, length)
        elif isinstance(past_length, int) and past_length == 0:
            key_position_ids, keys_in_order = position_ids, False
            if attention_mask is None and pair_mask is None and (tracing() or answers["restarts"]):
                pair_mask = same_document_pairs(position_ids)
        position_ids = position_ids.view(-1, length)
        self.check_positions(max(answers.get("largest position", -1), answers.get("largest given position", -1)))

        hidden_states = inputs_embeds
        if hasattr(self, "wpe"):
            hidden_states = hidden_states + self.wpe(position_ids).to(hidden_states.dtype)
        hidden_states = self.drop(hidden_states)
        unpadded = False if tracing() else answers.get("unpadded", True)
        inputs = self.attention_inputs(
            attention_mask, position_ids, key_position_ids, keys_in_order, pair_mask, past_length, unpadded
        )

        all_hidden_states, all_attentions = [], []
        for layer_idx, block in enumerate(self.h):
            if output_hidden_states:
                all_hidden_states.append(hidden_states)
            cache_layer = cache.layers[layer_idx] if cache is not None else None
            hidden_states, weights = block(hidden_states, inputs, cache_layer, output_attentions)
            all_attentions.append(weights)
        hidden_states = self.ln_f(hidden_states)
        if output_hidden_states:
            all_hidden_states.append(hidden_states)

        return BaseModelOutputWithPast(
            last_hidden_state=hidden_states,
            cache=cache if use_cache else None,
            hidden_states=tuple(all_hidden_states) if output_hidden_states else None,
            attentions=tuple(all_attentions) if output_attentions else None,
        )


def unsupported_attention(requested: str, supported) -> str:
    """transformers' words for an `attn_implementation` it does not know, which its tests and users' code match, with
    what this model allows."""
    allowed = ", ".join(f'`attn_implementation="{name}"`' for name in supported)
    return f'Specified `attn_implementation="{requested}"` is not supported. The only possible arguments are {allowed}'


def tracing() -> bool:
    """Under torch.compile or torch.export: nothing may read a tensor on the host (a sync and a graph break)."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


def visible_pairs(mask: torch.Tensor) -> torch.Tensor:
    """A custom 4D mask as (B|1, 1, T, S) bool, True where a query may see a key: bool masks as they are, additive
    float masks (transformers' convention: 0 to attend, a large negative not to) where 0, integer masks where 1."""
    if mask.dtype == torch.bool:
        return mask
    return mask == 0 if mask.is_floating_point() else mask == 1


def query_columns(x: torch.Tensor, past_length: int | torch.Tensor, length: int) -> torch.Tensor:
    """`x`'s last-dimension columns of the `length` queries, which follow `past_length` cached tokens: its last
    columns, unless `x` also spans a static cache's empty slots after them (a mask `generate` widens to the cache)."""
    if isinstance(past_length, int) and x.shape[-1] == past_length + length:
        return x[..., -length:]
    return x[..., past_length + torch.arange(length, device=x.device)]


def positions_and_order(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S) positions counting each row's real tokens from 0, and (B, 1) whether in each row key j sits at
    position j wherever there is a token (no left padding, no holes)."""
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    shared = torch.arange(attention_mask.shape[-1], device=attention_mask.device)
    return positions, ((positions == shared) | (attention_mask == 0)).all(-1, keepdim=True)


def restarts_of(position_ids: torch.Tensor) -> torch.Tensor:
    """(B, T - 1) where a position does not follow the previous one: a packed document starts."""
    return position_ids[:, 1:] != position_ids[:, :-1] + 1


def same_document_pairs(position_ids: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) bool: which tokens share a document, in rows packed without padding, where a document starts
    wherever a position does not follow the previous one (TRL's `padding_free`)."""
    documents = torch.cat([torch.zeros_like(position_ids[:, :1]), restarts_of(position_ids).long().cumsum(-1)], -1)
    return (documents[:, :, None] == documents[:, None, :])[:, None]


# --- heads -----------------------------------------------------------------------------------------------------


class HfAttnLMHeadModel(HfAttnPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}

    def __init__(self, config: HfAttnConfig):
        super().__init__(config)
        self.transformer = HfAttnModel(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.loss_type = "ForCausalLM"  # transformers infers it from class names ending in ForCausalLM
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        numeric_values: torch.Tensor | None = None,
        numeric_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """`labels` are the inputs (shifted inside the loss), -100 where ignored; see `HfAttnModel.forward`."""
        outputs = self.transformer(
            input_ids,
            cache,
            attention_mask,
            position_ids,
            inputs_embeds,
            numeric_values,
            numeric_mask,
            use_cache,
            return_dict=True,  # the head reads fields; its own `return_dict` decides what it returns
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        logits = self.lm_head(hidden_states[:, -logits_to_keep:] if logits_to_keep else hidden_states)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )

    def _prepare_cache_for_generation(self, generation_config, model_kwargs: dict, *args, **kwargs) -> None:
        """`generate`'s cache, made as for any model, then given this model's layers: an `HfAttnCache`, static with the
        same length when `generate` made a `StaticCache` (`cache_implementation="static"`)."""
        super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        made = model_kwargs.get("cache")
        if made is None or isinstance(made, HfAttnCache) or getattr(made, "_is_user_defined", False):
            return
        if not self.config.is_causal:  # a bidirectional model reruns the whole sequence at every step
            del model_kwargs["cache"]
            return
        if type(made) not in (DynamicCache, StaticCache) or made.offloading:
            raise ValueError(
                f"`cache_implementation`={generation_config.cache_implementation!r} is not supported by hf_attn "
                "models; allowed: None or 'dynamic' (the default), 'static'."
            )
        max_cache_len = made.get_max_length() if isinstance(made, StaticCache) else None
        model_kwargs["cache"] = HfAttnCache(self.config, max_cache_len=max_cache_len)
        if generation_config.is_assistant:
            # as transformers asks of the caches it makes: room for the drafts a verification may reject
            model_kwargs["cache"].activate_past_recording(recurrent_states_to_keep=generation_config.num_assistant_tokens)

    def create_masks_for_generate(self, attention_mask=None, cache=None, **kwargs):
        """With a static cache `generate` asks for 4D masks; hf_attn builds each kind's own from the 2D one (and
        counts positions over it), so it keeps it, widened with zeros to the cache's slots: one shape at every step,
        so that compiled decoding compiles once."""
        if attention_mask is None or attention_mask.dim() != 2 or cache is None or not cache.is_compileable:
            return attention_mask
        return nn.functional.pad(attention_mask, (0, cache.get_max_length() - attention_mask.shape[-1]))

    def prepare_inputs_for_generation(self, input_ids, next_sequence_length=None, inputs_embeds=None, **kwargs):
        """A bidirectional model (`is_causal=False`) runs the whole sequence at every step: each new token changes
        the outputs at earlier positions, so there is no cache to decode from (`forward` makes none)."""
        if not self.config.is_causal:
            if inputs_embeds is not None:
                raise ValueError(
                    "`generate` with `inputs_embeds` needs `is_causal=True`: a bidirectional model reruns the whole "
                    "sequence at every step, and only the prompt's embeddings, not token ids, are known. Pass "
                    "`input_ids` instead."
                )
            next_sequence_length = None  # the whole sequence, not the newest token
        return super().prepare_inputs_for_generation(
            input_ids, next_sequence_length, inputs_embeds=inputs_embeds, **kwargs
        )


def last_token_index(input_ids, attention_mask, pad_token_id: int | None, length: int, device) -> torch.Tensor:
    """(B,) index of each sequence's last real token, under left or right padding."""
    if attention_mask is not None:
        real = attention_mask.bool()
    elif input_ids is not None and pad_token_id is not None:
        real = input_ids != pad_token_id
    else:
        return torch.full((1,), length - 1, device=device)
    return (real.long() * torch.arange(length, device=device)).argmax(-1)


class HfAttnForSequenceClassification(HfAttnPreTrainedModel):
    """Classification or regression (`problem_type="regression"`) from the last real token, as GPT-2 does."""

    def __init__(self, config: HfAttnConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.transformer = HfAttnModel(config)
        self.score = nn.Linear(config.n_embd, config.num_labels, bias=False)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        cache=None,
        attention_mask=None,
        position_ids=None,
        inputs_embeds=None,
        numeric_values=None,
        numeric_mask=None,
        labels=None,
        use_cache=None,
        **kwargs,
    ) -> SequenceClassifierOutputWithPast:
        outputs = self.transformer(
            input_ids,
            cache,
            attention_mask,
            position_ids,
            inputs_embeds,
            numeric_values,
            numeric_mask,
            use_cache,
            return_dict=True,
            **kwargs,
        )
        logits = self.score(outputs.last_hidden_state)  # (B, T, num_labels)
        batch, length = logits.shape[:2]
        last = last_token_index(input_ids, attention_mask, self.config.pad_token_id, length, logits.device)
        pooled_logits = logits[torch.arange(batch, device=logits.device), last.expand(batch)]
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, pooled_logits=pooled_logits, config=self.config)
        return SequenceClassifierOutputWithPast(
            loss=loss,
            logits=pooled_logits,
            cache=outputs.cache,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class HfAttnForTokenClassification(HfAttnPreTrainedModel):
    """Per-position classification, or per-position regression with `problem_type="regression"`.

    Regression labels are (B, T) for one output or (B, T, num_labels); NaN labels are left out of the loss
    (e.g. Paper A's scratchpad position), since every float is a possible target.
    """

    def __init__(self, config: HfAttnConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.transformer = HfAttnModel(config)
        self.dropout = nn.Dropout(config.resid_pdrop)
        self.classifier = nn.Linear(config.n_embd, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        inputs_embeds=None,
        numeric_values=None,
        numeric_mask=None,
        labels=None,
        **kwargs,
    ) -> TokenClassifierOutput:
        outputs = self.transformer(
            input_ids, None, attention_mask, position_ids, inputs_embeds, numeric_values, numeric_mask, False,
            return_dict=True, **kwargs,
        )  # fmt: skip
        logits = self.classifier(self.dropout(outputs.last_hidden_state))  # (B, T, num_labels)
        loss = None
        if labels is not None and self.config.problem_type == "regression":
            predictions = logits.squeeze(-1) if labels.dim() == 2 else logits
            kept = ~torch.isnan(labels)
            loss = nn.functional.mse_loss(predictions[kept].float(), labels[kept].float())
        elif labels is not None:
            loss = self.loss_function(logits, labels, self.config)
        return TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


# --- the three registered model types: presets, so bare subclasses ---------------------------------------------


class PositionalGPT2Model(HfAttnModel):
    config: PositionalGPT2Config


class PositionalGPT2LMHeadModel(HfAttnLMHeadModel):
    config: PositionalGPT2Config


class PositionalGPT2ForSequenceClassification(HfAttnForSequenceClassification):
    config: PositionalGPT2Config


class PositionalGPT2ForTokenClassification(HfAttnForTokenClassification):
    config: PositionalGPT2Config


class LocalGPT2Model(HfAttnModel):
    config: LocalGPT2Config


class LocalGPT2LMHeadModel(HfAttnLMHeadModel):
    config: LocalGPT2Config


class LocalGPT2ForSequenceClassification(HfAttnForSequenceClassification):
    config: LocalGPT2Config


class LocalGPT2ForTokenClassification(HfAttnForTokenClassification):
    config: LocalGPT2Config


class HybridGPT2Model(HfAttnModel):
    config: HybridGPT2Config


class HybridGPT2LMHeadModel(HfAttnLMHeadModel):
    config: HybridGPT2Config


class HybridGPT2ForSequenceClassification(HfAttnForSequenceClassification):
    config: HybridGPT2Config


class HybridGPT2ForTokenClassification(HfAttnForTokenClassification):
    config: HybridGPT2Config


# Auto class name -> class suffix, shared by registration and the remote-code `auto_map`.
AUTO_CLASS_SUFFIXES = {
    "AutoModel": "Model",
    "AutoModelForCausalLM": "LMHeadModel",
    "AutoModelForSequenceClassification": "ForSequenceClassification",
    "AutoModelForTokenClassification": "ForTokenClassification",
}
MODEL_CLASSES = {
    config_class: {auto: globals()[prefix + suffix] for auto, suffix in AUTO_CLASS_SUFFIXES.items()}
    for prefix, config_class in (
        ("PositionalGPT2", PositionalGPT2Config),
        ("LocalGPT2", LocalGPT2Config),
        ("HybridGPT2", HybridGPT2Config),
    )
}


def enable_remote_code(model: HfAttnPreTrainedModel) -> None:
    """Make `save_pretrained` / `push_to_hub` export this code with a full `auto_map`.

    transformers' `register_for_auto_class` maps only one Auto class; with the full map every Auto class loads
    the checkpoint with `trust_remote_code=True` where hf_attn is not installed. It also marks the whole class, so
    every later model of it would export its code: this marks `model` alone (see `is_remote_code`).
    """
    config_class = type(model.config)
    model._auto_class = next(a for a, c in MODEL_CLASSES[config_class].items() if isinstance(model, c))
    model.config.auto_map = {
        "AutoConfig": f"configuration_hf_attn.{config_class.__name__}",
        **{auto: f"modeling_hf_attn.{cls.__name__}" for auto, cls in MODEL_CLASSES[config_class].items()},
    }


__all__ = [
    "HfAttnPreTrainedModel",
    "HfAttnModel",
    "HfAttnLMHeadModel",
    "HfAttnForSequenceClassification",
    "HfAttnForTokenClassification",
    *(cls.__name__ for classes in MODEL_CLASSES.values() for cls in classes.values()),
    "MODEL_CLASSES",
    "enable_remote_code",
]
