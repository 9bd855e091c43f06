"""GPT-2-style models whose heads are global, local or positional: trunk, task heads and the three model types.

GPT-2's skeleton and parameter names (`wte`, `wpe`, `h`, `ln_f`), so a GPT-2 state dict loads into a global-only
layout. Here: the residual position encoding, numeric inputs and the steps of a forward pass. Each step lives where
its name says: `input_checks_hf_attn.py` (what is refused), `positions_hf_attn.py` (positions counted over real
tokens, packed documents), `cache_hf_attn.py` (the cache), `layers_hf_attn.py` (attention by head kind, blocks).
"""

import os

import torch
from torch import nn
from transformers import Cache, GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    CausalLMOutputWithPast,
    SequenceClassifierOutputWithPast,
    TokenClassifierOutput,
)
from transformers.utils import can_return_tuple
from transformers.utils.output_capturing import capture_outputs

from .cache_hf_attn import GenerateWithHfAttnCache, cache_to_use, past_and_mask, widened_to_slots
from .configuration_hf_attn import HfAttnConfig, HybridGPT2Config, LocalGPT2Config, PositionalGPT2Config
from .head_kinds_hf_attn import HEAD_KINDS, unsupported_attention
from .initialization_hf_attn import init_gpt2_projection, init_paper_a
from .input_checks_hf_attn import check_shapes, check_values, numeric_positions
from .layers_hf_attn import BLOCKS, AttentionInputs, FixedTable, HfAttnAttention
from .position_encodings_hf_attn import rotary_cos_sin
from .positions_hf_attn import query_and_key_positions, tracing, visible_pairs
from .sharing_hf_attn import CardSharing, RemoteCodeQuery

# --- trunk -----------------------------------------------------------------------------------------------------


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
    # `output_hidden_states` and `output_attentions` are captured as transformers' models capture them
    # (`capture_outputs`): each block's output and each attention layer's weights (its output 1), so a selection
    # (`output_hidden_states=[0, -1]`) keeps only the layers it names. `output_attentions` still reaches the layers,
    # which compute weights only when asked.
    _can_record_outputs = {
        "hidden_states": list(dict.fromkeys(BLOCKS.values())),
        "attentions": HfAttnAttention,
    }

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
        """Paper A's initialization or GPT-2's (`config.initialization`); fixed tables are rebuilt either way."""
        if self.config.initialization == "paper_a":
            init_paper_a(module)
        else:
            super()._init_weights(module)  # GPT-2's Linear, Embedding, LayerNorm
            init_gpt2_projection(module, self.config)
        if isinstance(module, FixedTable):
            init.copy_(module.table, module.build(*module.table.shape))


class HfAttnModel(HfAttnPreTrainedModel):
    """The trunk: embeddings, blocks, final LayerNorm (GPT-2 style only; post-LN blocks end normalised)."""

    _input_embed_layer = "wte"  # for transformers' `get_input_embeddings` / `set_input_embeddings`

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
        post_ln = config.block_style != "gpt2"  # post-LN blocks end normalised
        self.ln_f = nn.Identity() if post_ln else nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.post_init()

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

    @capture_outputs
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
        if hasattr(cache, "begin_forward"):  # a paged cache, under continuous batching (`hf_attn.serving`)
            return self.paged_forward(input_ids, cache, position_ids, kwargs)
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        length = check_shapes(input_ids, inputs_embeds, numeric_values, attention_mask)
        pair_mask = None
        if attention_mask is not None and attention_mask.dim() == 4:
            pair_mask, attention_mask = visible_pairs(attention_mask), None
        cache, use_cache = cache_to_use(cache, use_cache, self.config, self.training)
        past_length, attention_mask = past_and_mask(cache, attention_mask, length)

        numeric = numeric_positions(self.config, input_ids, numeric_values, numeric_mask, attention_mask, past_length)
        answers = check_values(self.config, input_ids, attention_mask, numeric_values, numeric, position_ids,
                               past_length, length)  # fmt: skip
        if inputs_embeds is None:
            inputs_embeds = self.embed_inputs(input_ids, numeric_values, numeric)

        num_keys = cache.get_max_length() if cache is not None and cache.is_compileable else None
        position_ids, key_position_ids, keys_in_order, pair_mask = query_and_key_positions(
            position_ids, attention_mask, pair_mask, past_length, length, num_keys, answers, inputs_embeds.device
        )
        hidden_states = inputs_embeds
        if hasattr(self, "wpe"):
            hidden_states = hidden_states + self.wpe(position_ids).to(hidden_states.dtype)
        hidden_states = self.drop(hidden_states)
        unpadded = False if tracing() else answers.get("unpadded", True)
        inputs = self.attention_inputs(
            attention_mask, position_ids, key_position_ids, keys_in_order, pair_mask, past_length, unpadded
        )

        for layer_idx, block in enumerate(self.h):
            cache_layer = cache.layers[layer_idx] if cache is not None else None
            hidden_states = block(hidden_states, inputs, cache_layer, output_attentions)
        return BaseModelOutputWithPast(last_hidden_state=self.ln_f(hidden_states), cache=cache if use_cache else None)

    def paged_forward(self, input_ids: torch.LongTensor, cache, position_ids: torch.LongTensor, kwargs: dict):
        """Continuous batching's one flat row of requests (`hf_attn.serving`): positions as it gives them, each
        layer's attention by the paged cache."""
        cache.begin_forward(self, {**kwargs, "position_ids": position_ids})
        hidden_states = self.embed_inputs(input_ids, None, None)
        if hasattr(self, "wpe"):
            hidden_states = hidden_states + self.wpe(position_ids).to(hidden_states.dtype)
        inputs = self.attention_inputs(None, position_ids, position_ids)
        for block, cache_layer in zip(self.h, cache.layers, strict=True):
            hidden_states = block(hidden_states, inputs, cache_layer)
        return BaseModelOutputWithPast(last_hidden_state=self.ln_f(hidden_states))


# --- heads -----------------------------------------------------------------------------------------------------


class HfAttnLMHeadModel(GenerateWithHfAttnCache, HfAttnPreTrainedModel, GenerationMixin):
    cache_users = "hf_attn models"
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
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """`labels` are the inputs (shifted inside the loss), -100 where ignored; see `HfAttnModel.forward`."""
        # return_dict: the head reads fields; its own `return_dict` decides what it returns
        outputs = self.transformer(
            input_ids, cache, attention_mask, position_ids, inputs_embeds, numeric_values, numeric_mask, use_cache,
            return_dict=True, **kwargs,
        )  # fmt: skip
        hidden_states = outputs.last_hidden_state
        # the last `logits_to_keep` positions (0: all), or those a tensor lists (continuous batching's)
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, kept])
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, cache=outputs.cache, hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )  # fmt: skip

    def create_masks_for_generate(self, attention_mask=None, cache=None, **kwargs):
        """With a static cache `generate` asks for 4D masks; hf_attn builds each kind's own from the 2D one (and
        counts positions over it), so it keeps it, widened with zeros to the cache's slots: one shape at every step,
        so that compiled decoding compiles once."""
        return widened_to_slots(attention_mask, cache)

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
            input_ids, cache, attention_mask, position_ids, inputs_embeds, numeric_values, numeric_mask, use_cache,
            return_dict=True, **kwargs,
        )  # fmt: skip
        logits = self.score(outputs.last_hidden_state)  # (B, T, num_labels)
        batch, length = logits.shape[:2]
        last = last_token_index(input_ids, attention_mask, self.config.pad_token_id, length, logits.device)
        pooled_logits = logits[torch.arange(batch, device=logits.device), last.expand(batch)]
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, pooled_logits=pooled_logits, config=self.config)
        return SequenceClassifierOutputWithPast(
            loss=loss, logits=pooled_logits, cache=outputs.cache, hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )  # fmt: skip


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
