"""hf_attn: positional, local and hybrid attention GPT-2 variants for Hugging Face transformers, and per-head local
attention for other decoders (`hybridize`).

Importing the package registers the model types `positional_gpt2`, `local_gpt2` and `hybrid_gpt2` with
`AutoConfig`, `AutoModel`, `AutoModelForCausalLM`, `AutoModelForSequenceClassification` and
`AutoModelForTokenClassification`, and gives their `save_pretrained` and `push_to_hub` a model card; and the
types `hybridize` makes (`hf_attn_llama`, `hf_attn_qwen2`, `hf_attn_qwen3`, `hf_attn_mistral`, `hf_attn_gemma3_text`,
`hf_attn_gpt2`) with the Auto classes of their families' heads. `hf_attn.pretrained` loads pretrained decoders from the
Hub, folders and GGUF files.
"""

import transformers

from . import hub, hybrid, pretrained  # noqa: F401  (`hf_attn.pretrained.load_causal_lm` after `import hf_attn`)
from .cache_hf_attn import HfAttnCache
from .configuration_hf_attn import HfAttnConfig, HybridGPT2Config, LocalGPT2Config, PositionalGPT2Config
from .hybrid import hybridize
from .metrics import load_metric  # imports `evaluate` only when called
from .modeling_hf_attn import *  # noqa: F403
from .modeling_hf_attn import MODEL_CLASSES, CardSharing
from .modeling_hf_attn import __all__ as _modeling_all


def _register() -> None:
    for config_class, classes in MODEL_CLASSES.items():
        transformers.AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        for auto_name, model_class in classes.items():
            getattr(transformers, auto_name).register(config_class, model_class, exist_ok=True)
    CardSharing.sharing = hub  # model cards for save_pretrained and push_to_hub
    hybrid.register()


_register()


def __getattr__(name: str):
    """`convert_gpt2` loads on first use, so `python -m hf_attn.convert_gpt2` finds its module not yet imported."""
    if name == "convert_gpt2":
        from .convert_gpt2 import convert_gpt2 as function

        globals()[name] = function  # importing the submodule bound its name to the module, not the function
        return function
    raise AttributeError(f"module 'hf_attn' has no attribute {name!r}")


__all__ = [
    "HfAttnCache",
    "HfAttnConfig",
    "PositionalGPT2Config",
    "LocalGPT2Config",
    "HybridGPT2Config",
    "hybridize",
    *_modeling_all,
    "load_metric",
    "convert_gpt2",  # noqa: F405  (loaded on first use by __getattr__)
]
