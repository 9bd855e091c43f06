"""Configurations of the three hf_attn model types: presets over one per-layer, per-head layout of head kinds.

Every attention head is of one of the kinds in `head_kinds_hf_attn.HEAD_KINDS` (`global`, `local` or `positional`).
The three model types differ only in `model_type` and in the layout they build when `head_layout` is not given.
"""

import dataclasses
import difflib
import functools
import math

from transformers import GenerationConfig, GPT2Config
from transformers.utils import logging

from .head_kinds_hf_attn import ATTN_IMPLEMENTATION, HEAD_KINDS

logger = logging.get_logger(__name__)

POSITION_EMBEDDING_TYPES = ("learned", "sinusoidal", "rope", "none")
POSITIONAL_ENCODINGS = ("onehot", "binary", "sinusoidal", "learned")
BLOCK_STYLES = ("gpt2", "post_ln", "concat_mlp", "no_layernorm")
INITIALIZATIONS = ("gpt2", "paper_a")
# Keys other than fields that transformers itself passes to a config's `__post_init__`: never a user's typo.
# (Generation parameters are added in `_transformers_keys`.)
TRANSFORMERS_KEYS = frozenset(
    # written by `to_dict` / `save_pretrained` beside the fields, or consumed by transformers' `__post_init__`
    "model_type auto_map torch_dtype _name_or_path name_or_path _commit_hash num_labels output_attentions "
    "attn_implementation experts_implementation per_layer_config quantization_config "
    "_attn_implementation_internal _experts_implementation_internal _attn_implementation_autoset "
    # GPT-2's legacy alias of `n_positions`, and transformers 4.x attributes that config.json files saved then hold
    "n_ctx task_specific_params is_decoder torchscript use_bfloat16 tf_legacy_loss pruned_heads "
    "cross_attention_hidden_size tie_encoder_decoder finetuning_task tokenizer_class prefix sep_token_id "
    "gradient_checkpointing".split()
)


@functools.cache
def _transformers_keys() -> frozenset[str]:
    """`TRANSFORMERS_KEYS` plus the generation parameters that older config.json files hold (transformers drops them
    from the config)."""
    return TRANSFORMERS_KEYS | set(GenerationConfig().to_dict())


def _choice_error(field: str, value, allowed) -> ValueError:
    return ValueError(f"`{field}` must be one of {list(allowed)}, got {value!r}.")


# Positional encodings whose width d_P `n_positions` fixes.
FIXED_WIDTH_ENCODINGS = ("onehot", "binary")


class HfAttnConfig(GPT2Config):
    r"""
    head_layout (`list[list[str]]`, *optional*):
        Kind of every head, one list per layer: `"global"` (content attention over all visible positions),
        `"local"` (content attention over the `local_window` previous positions) or `"positional"` (weights from
        the fixed positional encoding only, Paper A). Built from the model type's preset when not given.
    local_window (`int`, *optional*, defaults to 1):
        k, the number of positions BEFORE the query that a local head sees (Paper B's k-local). Whether the query
        also sees itself is `attend_to_self`, so an inclusive 1-local head sees 2 positions. This is not
        transformers' `sliding_window`, which counts the current token.
    sink_tokens (`int`, *optional*, defaults to 0):
        How many first tokens of the sequence (the first real ones under left padding) a local head sees besides
        its window: attention sinks (StreamingLLM, Xiao et al. 2023), where pretrained heads park attention they do
        not spend. The decoding cache keeps them beside the window. Paper B's local heads have none.
    attend_to_self (`bool`, *optional*):
        Inclusive masks (GPT-2's: a token sees itself) when True, strict masks (Paper B: it never does) when False.
        Defaults to the preset's: strict for `local_gpt2` and `hybrid_gpt2`, inclusive for `positional_gpt2`.
        Under a strict causal mask position 0 sees nothing and its attention output is zero.
    is_causal (`bool`, *optional*, defaults to `True`):
        Causal (decoder) attention when True. When False every head sees both sides (Paper A's algorithmic
        tasks); a local head then sees the `local_window` positions on each side.
    position_embedding_type (`str`, *optional*, defaults to `"learned"`):
        Position information added to the residual stream: `"learned"` (GPT-2's `wpe`), `"sinusoidal"`
        (fixed, Vaswani et al.), `"rope"` (rotary, applied to queries and keys of global and local heads) or
        `"none"`.
    positional_encoding (`str`, *optional*, defaults to `"onehot"`):
        The encoding P that positional heads compute their weights from, shared by all layers (Paper A):
        `"onehot"` (identity, d_P = n_positions, the paper's), `"binary"` (+-1 bits of the index),
        `"sinusoidal"` or `"learned"`.
    positional_encoding_dim (`int`, *optional*):
        d_P for the `"sinusoidal"` and `"learned"` encodings (defaults to `n_embd`); fixed by the encoding for
        `"onehot"` (n_positions) and `"binary"` (ceil(log2(n_positions))).
    positional_qk_dim (`int`, *optional*):
        Width of a positional head's queries and keys. Defaults to d_P as in Paper A's code; with one-hot P and
        a long context that is d_P^2 parameters per head, so set it lower for long sequences.
    content_qk_dim (`int`, *optional*):
        Width of a global or local head's queries and keys (its values stay `n_embd / n_head` wide). Defaults to
        `n_embd / n_head`, GPT-2's; Paper A's code gives its standard heads queries and keys as wide as the model
        (`n_embd`). Scores are scaled by `content_qk_dim ** -0.5`.
    block_style (`str`, *optional*, defaults to `"gpt2"`):
        `"gpt2"` (pre-LN residual), `"post_ln"` (Paper B: `LN(x + attn(x))`, `LN(x + mlp(x))`), `"concat_mlp"`
        (Paper A: `MLP(concat(x, attn(x)))`, no residual, no LayerNorm) or `"no_layernorm"` (GPT-2's residual block
        with every LayerNorm removed, the final one too: `x + attn(x)`, `x + mlp(x)`, as Paper A's minGPT-based
        code for k-hop induction heads has it).
    initialization (`str`, *optional*):
        How new weights are drawn. `"gpt2"`: GPT-2's normal(`initializer_range`) with the residual projections
        scaled by 1 / sqrt(2 * n_layer). `"paper_a"`: Paper A's code, Xavier-uniform attention projections with
        zero biases and PyTorch's defaults for every other linear and embedding layer. Defaults to `"paper_a"` for
        the `"concat_mlp"` block, which has no residual stream to carry GPT-2's small-output init (its signal
        would shrink layer by layer until the model predicts a constant), and to `"gpt2"` otherwise.
    scale_embedding (`bool`, *optional*):
        Multiply token embeddings by sqrt(n_embd). Defaults to True under `"sinusoidal"` positions, as Vaswani et
        al. do, and to False otherwise, as GPT-2 does: its learned positions are drawn as small as its tokens.
        Fixed sinusoids have amplitude 1, about 35 times a token embedding drawn with std 0.02, so without the
        scale the input starts as mostly position (at CPU size, WikiText-2 runs then never leave the unigram
        plateau). A config saved before this field existed loads unscaled, as it was trained.
    rope_theta (`float`, *optional*, defaults to 10000.0):
        Base of the rotary frequencies when `position_embedding_type="rope"`.
    numeric_inputs (`bool`, *optional*, defaults to `False`):
        Adds `wne`, a `Linear(1, n_embd)` that embeds `numeric_values` as `value * w + b` (Paper A).
    numeric_token_id (`int`, *optional*):
        Token id that marks the positions whose embedding comes from `numeric_values` when no `numeric_mask`
        is passed.
    local_attention_impl (`str`, *optional*, defaults to `"banded"`):
        `"banded"` forms only the k (or k+1) scores per query; `"compiled"` runs the same kernel through
        `torch.compile` (faster once warm, after tens of seconds of compiling per new shape; training and prefill
        only). Both compute the same attention. A config saved with the former `"masked"` (SDPA over a full T x T
        band mask, now only a benchmark baseline) loads as `"banded"`, with a warning.
    positional_attention_impl (`str`, *optional*, defaults to `"auto"`):
        How positional heads compute the same attention. `"shared_weights"` forms the (heads, T, S) weights once for
        the whole batch (they depend on positions only) and keeps them for the backward: fastest for large batches
        of short sequences, as in Paper A. `"fused"` runs SDPA on P's queries and keys for every sample and never
        forms T x S: less memory, faster for long sequences. `"auto"` picks by shape: shared weights while the batch
        exceeds T / 128 and the weights stay under 2**24 elements. In inference (not with `"fused"`) the weights
        are kept once the same positions come twice, for the next batches of an evaluation loop. Attention weights
        (`output_attentions`) always come from shared weights.

    Example:

    ```python
    >>> from transformers import AutoConfig
    >>> import hf_attn
    >>> config = AutoConfig.for_model("hybrid_gpt2", n_layer=2, n_head=4, n_embd=64, local_window=1)
    >>> config.head_layout
    [['global', 'global', 'local', 'local'], ['global', 'global', 'local', 'local']]
    ```"""

    model_type = "hf_attn"

    head_layout: list[list[str]] | None = None
    local_window: int = 1
    sink_tokens: int = 0
    attend_to_self: bool | None = None
    is_causal: bool = True
    position_embedding_type: str = "learned"
    positional_encoding: str = "onehot"
    positional_encoding_dim: int | None = None
    positional_qk_dim: int | None = None
    content_qk_dim: int | None = None
    block_style: str = "gpt2"
    initialization: str | None = None
    scale_embedding: bool | None = None
    rope_theta: float = 10000.0
    numeric_inputs: bool = False
    numeric_token_id: int | None = None
    local_attention_impl: str = "banded"
    positional_attention_impl: str = "auto"

    default_attend_to_self = False

    def __post_init__(self, **kwargs):
        self._set_aliased_fields(kwargs)
        self._warn_unknown_keys(kwargs)
        if self.local_attention_impl == "masked":  # saved by older versions: same attention, slower route
            logger.warning(
                "`local_attention_impl`='masked' is no longer offered (SDPA over a full T x T band mask, now only a "
                "benchmark baseline); using 'banded', which computes the same attention. Allowed values: "
                f"{list(HEAD_KINDS['local'].kernels)}."
            )
            self.local_attention_impl = "banded"
        if self.attend_to_self is None:
            self.attend_to_self = self.default_attend_to_self
        self._check_shape()
        if self.head_layout is None:
            self.head_layout = [self.preset_layer_layout() for _ in range(self.n_layer)]
        if self.positional_encoding_dim is None:
            self.positional_encoding_dim = self.natural_positional_encoding_dim()
        if self.positional_qk_dim is None:
            self.positional_qk_dim = self.positional_encoding_dim
        if self.content_qk_dim is None:
            self.content_qk_dim = self.n_embd // self.n_head
        if self.initialization is None:
            self.initialization = "paper_a" if self.block_style == "concat_mlp" else "gpt2"
        if self.scale_embedding is None:
            self.scale_embedding = self.position_embedding_type == "sinusoidal"
        super().__post_init__(**kwargs)
        self.validate()

    def __setattr__(self, name: str, value) -> None:
        """A fixed P's width (`"onehot"`, `"binary"`) follows `n_positions` (or `max_position_embeddings`) and
        `positional_encoding` when they change after the config is made, and so does `positional_qk_dim` where it
        was left to follow it: a config edited as transformers' tests edit them builds, saves and loads."""
        name = self.attribute_map.get(name, name) if name != "attribute_map" else name
        derived = self.__dict__.get("positional_encoding_dim") is not None  # filled in by `__post_init__`
        if not derived or name not in ("n_positions", "positional_encoding"):
            super().__setattr__(name, value)
            return
        width, qk_width = self.positional_encoding_dim, self.positional_qk_dim
        followed = width == self.natural_positional_encoding_dim()
        super().__setattr__(name, value)
        if followed or self.positional_encoding in FIXED_WIDTH_ENCODINGS:
            super().__setattr__("positional_encoding_dim", self.natural_positional_encoding_dim())
            if qk_width == width:
                super().__setattr__("positional_qk_dim", self.positional_encoding_dim)

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """Also loads a config saved before `scale_embedding` existed (every saved config names its transformers
        version; ours name the field since) as it was trained: unscaled, whatever its positions."""
        if "transformers_version" in config_dict and "scale_embedding" not in config_dict:
            config_dict = {**config_dict, "scale_embedding": False}
        return super().from_dict(config_dict, **kwargs)

    @staticmethod
    def _known_fields() -> set[str]:
        """Fields of every hf_attn config type (GPT-2's and transformers' included) and their `attribute_map` aliases:
        a key valid for one of our types is no typo in another."""
        configs = [HfAttnConfig, *HfAttnConfig.__subclasses__()]
        fields = {field.name for config in configs for field in dataclasses.fields(config)}
        return fields | {alias for config in configs for alias in config.attribute_map}

    def _set_aliased_fields(self, kwargs: dict):
        """GPT-2's aliases (`num_hidden_layers`, `hidden_size`, ...) set their fields before the fields derived from
        them (the layout, the query widths) are filled in; transformers would set them afterwards."""
        for alias, field in self.attribute_map.items():
            if alias in kwargs:
                setattr(self, field, kwargs.pop(alias))

    def _warn_unknown_keys(self, kwargs: dict):
        """transformers keeps any unknown key as an attribute that nothing reads, so a misspelt field would silently
        leave its default in place."""
        known = self._known_fields()
        for key in sorted(kwargs.keys() - known - _transformers_keys()):
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "."
            logger.warning(
                f"{self.model_type} config: unknown field {key!r} (kept as an attribute, ignored by the model){hint}"
            )

    def _check_shape(self):
        """Checks needed before a preset layout can be built (the rest is in `validate_*`)."""
        for field in ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size", "n_inner"):
            if getattr(self, field) is not None and getattr(self, field) < 1:  # n_inner None: 4 * n_embd
                raise ValueError(f"`{field}` must be >= 1, got {getattr(self, field)}.")
        if self.n_embd % self.n_head:
            raise ValueError(f"`n_embd` ({self.n_embd}) must be divisible by `n_head` ({self.n_head}).")

    def preset_layer_layout(self) -> list[str]:
        """The head kinds of one layer when `head_layout` is not given."""
        return ["global"] * self.n_head

    def natural_positional_encoding_dim(self) -> int:
        """d_P: fixed by one-hot and binary encodings, `n_embd` by default for the others."""
        if self.positional_encoding == "onehot":
            return self.n_positions
        if self.positional_encoding == "binary":
            return max(1, math.ceil(math.log2(self.n_positions)))
        return self.n_embd

    def validate(self):
        """Raises `ValueError` naming the field for any invalid value of our fields."""
        self.validate_head_layout()
        self.validate_local_window()
        self.validate_choices()
        self.validate_flags()
        self.validate_positional_dims()
        self.validate_position_embedding()
        self.validate_numeric_inputs()

    @property
    def kv_head_layout(self) -> list[list[str]]:
        """The kind of each head whose keys and values the cache keeps: every head's, one key/value head per head."""
        return self.head_layout

    @property
    def uses_positional_heads(self) -> bool:
        """Some head takes its weights from the positional encoding P (the model then builds P)."""
        return any(not HEAD_KINDS[kind].content for layer in self.head_layout for kind in layer)

    def validate_head_layout(self):
        if not isinstance(self.head_layout, list) or len(self.head_layout) != self.n_layer:
            raise ValueError(
                f"`head_layout` must be a list of `n_layer`={self.n_layer} lists of head kinds, "
                f"got {self.head_layout!r}."
            )
        for layer_idx, layer in enumerate(self.head_layout):
            if len(layer) != self.n_head:
                raise ValueError(
                    f"`head_layout[{layer_idx}]` must list `n_head`={self.n_head} head kinds, got {len(layer)}."
                )
            for kind in layer:
                if kind not in HEAD_KINDS:
                    raise _choice_error(f"head_layout[{layer_idx}]", kind, HEAD_KINDS)

    def validate_local_window(self):
        if not isinstance(self.local_window, int) or isinstance(self.local_window, bool) or self.local_window < 1:
            raise ValueError(
                f"`local_window` must be an integer >= 1 (the number of previous positions a local head sees), "
                f"got {self.local_window!r}."
            )
        if not isinstance(self.sink_tokens, int) or isinstance(self.sink_tokens, bool) or self.sink_tokens < 0:
            raise ValueError(
                f"`sink_tokens` must be an integer >= 0 (the first tokens a local head sees besides its window), "
                f"got {self.sink_tokens!r}."
            )

    def validate_choices(self):
        kernel_choices = [  # `attn_implementation` is transformers' to check, when a model is built
            (kind.kernel_field, kind.kernels)
            for kind in HEAD_KINDS.values()
            if kind.kernel_field not in (None, ATTN_IMPLEMENTATION)
        ]
        for field, allowed in (
            ("position_embedding_type", POSITION_EMBEDDING_TYPES),
            ("positional_encoding", POSITIONAL_ENCODINGS),
            ("block_style", BLOCK_STYLES),
            ("initialization", INITIALIZATIONS),
            *kernel_choices,  # `local_attention_impl`, `positional_attention_impl`
        ):
            if getattr(self, field) not in allowed:
                raise _choice_error(field, getattr(self, field), allowed)

    def validate_flags(self):
        """A string such as "false" would otherwise be read as True."""
        for field in ("attend_to_self", "is_causal", "scale_embedding", "numeric_inputs"):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(f"`{field}` must be True or False, got {getattr(self, field)!r}.")

    def validate_positional_dims(self):
        natural = self.natural_positional_encoding_dim()
        fixed = self.positional_encoding in FIXED_WIDTH_ENCODINGS
        # Only a model with positional heads builds P from n_positions: without them, changing n_positions after the
        # config was made leaves nothing out of step.
        if fixed and self.uses_positional_heads and self.positional_encoding_dim != natural:
            raise ValueError(
                f"`positional_encoding_dim` is fixed to {natural} by `positional_encoding`="
                f"{self.positional_encoding!r}, got {self.positional_encoding_dim}."
            )
        for field in ("positional_encoding_dim", "positional_qk_dim"):
            if getattr(self, field) < 1:
                raise ValueError(f"`{field}` must be >= 1, got {getattr(self, field)}.")
        if self.positional_encoding == "sinusoidal" and self.positional_encoding_dim % 2:
            raise ValueError(
                f"`positional_encoding_dim` must be even for sinusoidal P, got {self.positional_encoding_dim}."
            )

    def validate_position_embedding(self):
        if self.content_qk_dim < 1:
            raise ValueError(f"`content_qk_dim` must be >= 1, got {self.content_qk_dim}.")
        if self.position_embedding_type == "rope" and self.content_qk_dim % 2:
            raise ValueError(
                "`position_embedding_type`='rope' needs an even query/key width (`content_qk_dim`, by default "
                f"n_embd / n_head), got {self.content_qk_dim}."
            )
        if self.position_embedding_type == "sinusoidal" and self.n_embd % 2:
            raise ValueError(f"`position_embedding_type`='sinusoidal' needs an even `n_embd`, got {self.n_embd}.")
        if self.rope_theta <= 0:
            raise ValueError(f"`rope_theta` must be > 0, got {self.rope_theta}.")

    def validate_numeric_inputs(self):
        if self.numeric_token_id is not None and not self.numeric_inputs:
            raise ValueError("`numeric_token_id` is set but `numeric_inputs` is False; set `numeric_inputs=True`.")
        if self.numeric_token_id is not None and not 0 <= self.numeric_token_id < self.vocab_size:
            raise ValueError(
                f"`numeric_token_id` must be in [0, vocab_size={self.vocab_size}), got {self.numeric_token_id}."
            )


class PositionalGPT2Config(HfAttnConfig):
    r"""Every head positional (Paper A). Inclusive masks by default, as in the paper's bidirectional attention.

    Example:

    ```python
    >>> config = PositionalGPT2Config(n_positions=9, is_causal=False, n_layer=4, n_head=2, n_embd=64)
    ```"""

    model_type = "positional_gpt2"
    default_attend_to_self = True

    def preset_layer_layout(self) -> list[str]:
        return ["positional"] * self.n_head


class LocalGPT2Config(HfAttnConfig):
    r"""Every head strictly k-local (Paper B): a token sees only its `local_window` predecessors."""

    model_type = "local_gpt2"

    def preset_layer_layout(self) -> list[str]:
        return ["local"] * self.n_head


class HybridGPT2Config(HfAttnConfig):
    r"""
    num_local_heads (`int`, *optional*):
        Local heads per layer in the preset layout (global heads first, then local ones). Defaults to half of
        `n_head`, rounded down (Paper B's half-and-half split is inferred, not stated).
    """

    model_type = "hybrid_gpt2"

    num_local_heads: int | None = None

    def __post_init__(self, **kwargs):
        self._set_aliased_fields(kwargs)  # `num_attention_heads` decides the default split
        if self.num_local_heads is None:
            self.num_local_heads = self.n_head // 2
        if not 0 <= self.num_local_heads <= self.n_head:
            raise ValueError(f"`num_local_heads` must be in [0, n_head={self.n_head}], got {self.num_local_heads}.")
        super().__post_init__(**kwargs)

    def preset_layer_layout(self) -> list[str]:
        return ["global"] * (self.n_head - self.num_local_heads) + ["local"] * self.num_local_heads


__all__ = ["HfAttnConfig", "PositionalGPT2Config", "LocalGPT2Config", "HybridGPT2Config"]
