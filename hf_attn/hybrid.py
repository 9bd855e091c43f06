"""Per-head global, k-local and positional attention in other transformers decoders: Llama, Qwen2, Qwen3, Mistral,
Gemma 3 and GPT-2.

`hybridize(model, ...)` gives a loaded model per-head kinds with nothing else of its architecture changed: its
config becomes a registered `hf_attn_<family>` type (the family's config plus `head_layout`, `local_window`,
`attend_to_self`, `sink_tokens` and P's fields), and its attention modules run `hybrid_attention`, registered in
transformers' `AttentionInterface`, which splits each layer's query heads by kind:

- global heads attend as the model always did (SDPA over the mask transformers built);
- local heads see only the `local_window` previous tokens (and themselves, with `attend_to_self`), and the first
  `sink_tokens` tokens of the sequence (attention sinks);
- positional heads (Paper A) weigh every earlier token and themselves by a fixed positional encoding P alone,
  through projections of their own (`p_attn`, new parameters: `hybrid_positional.py`), their values the data's.

With grouped-query attention several query heads read one key/value head. `HfAttnCache` keeps every token of a
key/value head that some global query head reads, only the sinks and the last `local_window` tokens of one that
only local heads read, and only the values of one that only positional heads read: the layout's `kv_head_layout`;
static and compileable with `max_cache_len` (what `cache_implementation="static"` makes). Any other cache works too
(transformers' `StaticCache`, or one a user passes): it keeps what it would for the unmodified model, and local heads
find their window in the mask transformers builds for it.

A model saved after `hybridize` loads with its Auto class once hf_attn is imported, and with
`trust_remote_code=True` where hf_attn is not installed: `save_pretrained` copies this file and the flat siblings it
imports beside the weights, and `config.auto_map` names each hybrid type, bound in this file under its class name.
A model loaded from a GGUF file (its weights unpacked to floats) leaves its GGUF quantizer behind here, so that it
saves and trains as any float model.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence

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

from .cache_hf_attn import GenerateWithHfAttnCache, HfAttnCache
from .head_kinds_hf_attn import unsupported_attention
from .hybrid_attention import (
    HYBRID_ATTENTION,
    HYBRID_IMPLEMENTATIONS,
    KINDS,
    RETURN_WEIGHTS,
    SINK_PREFIX,
    LayerHeads,
    head_dim,
    hybrid_attention,
    layer_heads,
    num_key_value_heads,
)
from .hybrid_positional import (
    NUMERIC_VALUES,
    POSITIONAL_FIELDS,
    attach_numeric_embedding,
    attach_positional_projection,
    fill_positional_fields,
    numbers_embedded,
    per_position_mse,
    positional_problems,
    uses_positional_heads,
    with_positional_rows,
)
from .sharing_hf_attn import CardSharing

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


# --- config and model types ------------------------------------------------------------------------------------


class HybridConfigMixin:
    """The fields a hybridized family's config adds, and their checks. Every query head's kind is in `head_layout`
    (one list per layer); `kv_head_layout` follows from it."""

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.head_layout is None:
            self.head_layout = [["global"] * self.num_attention_heads for _ in range(self.num_hidden_layers)]
        self.head_layout = [list(layer) for layer in self.head_layout]
        fill_positional_fields(self)
        if problems := layout_problems(self) + positional_problems(self):
            raise ValueError(f"Invalid {type(self).__name__}: " + "; ".join(problems))
        self.auto_map = remote_code_map(self.model_type.removeprefix("hf_attn_"))

    @property
    def kv_head_layout(self) -> list[list[str]]:
        """Per layer, the kind of each key/value head: that of the query heads reading it where they are of one kind
        ("local": the cache keeps the last `local_window` tokens; "positional": every value, no key), else "global"
        (every key and value)."""
        return [list(layer_heads(self, i).kv_kinds) for i in range(self.num_hidden_layers)]


def cache_bytes_per_token(config, bytes_per_value: int = 2, context_tokens: int | None = None) -> float:
    """What the cache grows by per token at long context: keys and values of the key/value heads kept whole, values
    of those only positional heads read, in every layer (local ones keep `local_window` + `sink_tokens` tokens
    whatever the context). With `context_tokens`, what it holds at that context per token, local heads' windows and
    sinks counted. 2 bytes a value: bfloat16 and float16."""
    kinds = [kind for layer in config.kv_head_layout for kind in layer]
    per_vector = head_dim(config) * bytes_per_value  # a key or a value of one head and token
    every_token = 2 * kinds.count("global") + kinds.count("positional")  # vectors kept for every token
    if context_tokens is None:
        return every_token * per_vector
    local_tokens = min(context_tokens, config.local_window + config.sink_tokens)
    held = every_token * context_tokens + 2 * kinds.count("local") * local_tokens
    return held * per_vector / context_tokens


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


class HybridModelMixin(GenerateWithHfAttnCache, CardSharing):
    """What a hybridized family's model classes add: every attention module knows its heads (`hf_attn_heads`, and
    `p_attn` where some are positional) and runs `hybrid_attention`; `generate` and `forward` (`hybrid_forward`)
    decode with an `HfAttnCache`; and `save_pretrained` and `push_to_hub` write a card saying which heads are of
    which kind."""

    cache_users = "hybridized models yet"

    def post_init(self):
        """The heads' parameters exist before transformers initialises the model's, so they are drawn with them."""
        attach_heads(self)
        super().post_init()

    def get_correct_attn_implementation(self, requested_attention: str | None, is_init_check: bool = False) -> str:
        """One attention function runs every kind of head: "sdpa" (the default) runs global heads through SDPA, local
        and positional heads through hf_attn's kernels; "eager" writes every head out and returns its weights."""
        if requested_attention is None or requested_attention in HYBRID_IMPLEMENTATIONS.values():
            return requested_attention or HYBRID_ATTENTION
        if requested_attention not in HYBRID_IMPLEMENTATIONS:
            raise ValueError(
                unsupported_attention(requested_attention, list(HYBRID_IMPLEMENTATIONS))
                + " (hybridized models: one attention function runs every kind of head)."
            )
        return HYBRID_IMPLEMENTATIONS[requested_attention]


def hybrid_forward(family_forward: Callable) -> Callable:
    """The family's `forward`, given an `HfAttnCache` where it would make itself a `DynamicCache`, and asking the
    attention function for weights when `output_attentions` does. Keyword arguments only (the families order their
    positional ones differently); the family's signature stays visible to Trainer, which keeps only the dataset
    columns `forward` names."""

    @functools.wraps(family_forward)
    def forward(self, *args, **kwargs):
        if kwargs.get(NUMERIC_VALUES) is not None:
            kwargs = numbers_embedded(self, args, kwargs)
        kwargs.pop(NUMERIC_VALUES, None)
        if kwargs.get("output_attentions", self.config.output_attentions):
            kwargs[RETURN_WEIGHTS] = True
        use_cache = kwargs.get("use_cache")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        given = kwargs.get("cache")
        given = kwargs.get("past_key_values") if given is None else given
        if hasattr(given, "begin_forward"):  # a paged cache, under continuous batching (`hf_attn.serving`)
            return family_forward(self, *args, **given.begin_forward(self, kwargs))
        if use_cache and len(args) <= 1 and given is None:
            kwargs["cache"] = given = HfAttnCache(self.config)
        if isinstance(given, HfAttnCache) and self.config.sink_tokens:
            past = given.get_seq_length()  # a static cache's is a tensor once it holds tokens: not read on the host
            if isinstance(past, int) and past == 0:
                given.make_room_for_padding(kwargs.get("attention_mask"))
            kwargs[SINK_PREFIX] = given.first_tokens
        if uses_positional_heads(self.config):
            kwargs = with_positional_rows(self, args, kwargs, given)
        return family_forward(self, *args, **kwargs)

    # Trainer keeps the dataset columns `forward` names: the family's, and Paper A's numbers.
    signature = inspect.signature(family_forward)
    numbers = inspect.Parameter(NUMERIC_VALUES, inspect.Parameter.KEYWORD_ONLY, default=None)
    parameters = list(signature.parameters.values())
    at = next((i for i, p in enumerate(parameters) if p.kind == inspect.Parameter.VAR_KEYWORD), len(parameters))
    forward.__signature__ = signature.replace(parameters=[*parameters[:at], numbers, *parameters[at:]])
    return forward


def attach_heads(model: PreTrainedModel) -> None:
    """Tells each attention module of `model` its heads' kinds (a plain attribute), gives those with positional heads
    their `p_attn`, and the model its `wne` where `numeric_inputs` asks for it: the only parameters hybridize adds."""
    attention_types = tuple(ATTENTION_MODULES.values())
    for module in model.modules():
        if isinstance(module, attention_types):
            module.hf_attn_heads = heads = layer_heads(model.config, module.layer_idx)
            attach_positional_projection(model, module, heads.heads.get("positional", ()))
    attach_numeric_embedding(model)


class PerPositionRegression:
    """Token classification with `problem_type="regression"`: a masked MSE per position (transformers' generic
    token classification would take cross-entropy whatever the problem type)."""

    @property
    def loss_function(self):
        if self.config.problem_type == "regression":
            return per_position_mse
        return super().loss_function

    @loss_function.setter
    def loss_function(self, value):
        self._loss_function = value


def hybrid_types(family: str, config_class: type, model_classes: dict[str, type]) -> tuple[type, dict[str, type]]:
    """The `hf_attn_<family>` config type and its model classes, by Auto class: the family's own, plus the mixins."""
    name = config_class.__name__.removesuffix("Config")
    config = type(f"HfAttn{name}Config", (HybridConfigMixin, config_class), {
        "__module__": __name__,
        "__doc__": f"`{config_class.__name__}` with a kind per head (`hf_attn.hybridize`).",
        "model_type": f"hf_attn_{family}",
        "__annotations__": {"head_layout": "list[list[str]] | None", "local_window": "int", "attend_to_self": "bool",
                            "sink_tokens": "int", "positional_encoding": "str", "positional_encoding_dim": "int | None",
                            "positional_qk_dim": "int | None", "numeric_inputs": "bool"},
        "head_layout": None,
        "local_window": 1,
        "attend_to_self": True,
        "sink_tokens": 0,
        **POSITIONAL_FIELDS,
    })  # fmt: skip
    regression = {"AutoModelForTokenClassification": (PerPositionRegression,)}
    models = {
        auto_name: type(
            f"HfAttn{model_class.__name__}",
            (HybridModelMixin, *regression.get(auto_name, ()), model_class),
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
    positional_encoding: str = "sinusoidal",
    positional_encoding_dim: int | None = None,
    positional_qk_dim: int | None = None,
) -> PreTrainedModel:
    """Gives `model` (a loaded Llama, Qwen2, Qwen3, Mistral, Gemma 3 or GPT-2 model: the base model or one with a
    causal LM, sequence or token classification or question answering head; or one hybridized before) a kind per query
    head, in place, and returns it; weights, dtype and device are untouched.

    `head_layout` names every head's kind ("global", "local" or "positional"), one list per layer; or
    `num_local_heads` makes the last N heads of every layer (or of each layer, given a list) local, so that with
    grouped-query attention whole key/value groups turn local and the cache keeps only their last `local_window`
    tokens. Neither: every head stays global and the model computes exactly what it did. `attend_to_self=True` (the
    default) lets a local head see its own token as well, as pretrained heads were trained to. `sink_tokens` = s
    lets every local head also see the first s tokens of its sequence (the first real ones under left padding), as
    StreamingLLM's and DuoAttention's streaming heads do: pretrained heads park attention on the first tokens, and a
    local head without them loses that place (docs/hybrid.md's long-context run: SmolLM2-135M-Instruct with half its
    key/value groups made 64-local at random, 3 seeds, has WikiText-2 test perplexity 178.11 (99.44-249.36) without
    sinks and 28.89 (26.97-30.73) with 4, against 19.24 unmodified). The cache keeps s + `local_window` tokens of a
    key/value head that only local heads read.

    A positional head's queries and keys come from P (`positional_encoding`: "sinusoidal", "binary" or "onehot", of
    width `positional_encoding_dim`, by default the heads' width for sinusoids) through a new projection `p_attn`
    (queries and keys `positional_qk_dim` wide, by default P's width), drawn as the family draws its projections:
    the head keeps its value projection and forgets its learned queries and keys, so it must be trained (the
    cache keeps only the values of a key/value head that only positional heads read).
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
                  sink_tokens=sink_tokens, positional_encoding=positional_encoding,
                  positional_encoding_dim=positional_encoding_dim, positional_qk_dim=positional_qk_dim)  # fmt: skip
    config = config_class(**fields)
    eager = model.config._attn_implementation in ("eager", HYBRID_IMPLEMENTATIONS["eager"])  # stays eager
    config._attn_implementation = HYBRID_IMPLEMENTATIONS["eager" if eager else "sdpa"]
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
