"""hf_attn: positional, local and hybrid attention GPT-2 variants for Hugging Face transformers.

Importing the package registers the model types `positional_gpt2`, `local_gpt2` and `hybrid_gpt2` with
`AutoConfig`, `AutoModel`, `AutoModelForCausalLM`, `AutoModelForSequenceClassification` and
`AutoModelForTokenClassification`.
"""

import transformers

from .cache_hf_attn import HeadKindCache
from .configuration_hf_attn import HfAttnConfig, HybridGPT2Config, LocalGPT2Config, PositionalGPT2Config
from .modeling_hf_attn import *  # noqa: F403
from .modeling_hf_attn import MODEL_CLASSES
from .modeling_hf_attn import __all__ as _modeling_all


def _register() -> None:
    for config_class, classes in MODEL_CLASSES.items():
        transformers.AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        for auto_name, model_class in classes.items():
            getattr(transformers, auto_name).register(config_class, model_class, exist_ok=True)


_register()

__all__ = [
    "HeadKindCache",
    "HfAttnConfig",
    "PositionalGPT2Config",
    "LocalGPT2Config",
    "HybridGPT2Config",
    *_modeling_all,
]
