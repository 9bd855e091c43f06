"""The table of head kinds: for each kind, the kernel that runs its heads, what it sees, what the decoding cache
keeps for it and which config fields it reads.

The configuration (which names `head_layout` may hold), the attention layer (which kernel runs which heads), the
cache (what it keeps) and the model cards (what they describe) all iterate over `HEAD_KINDS`, so a fourth kind is a
new entry here, its kernel in `attention_hf_attn.py` and its tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .attention_hf_attn import (
    compiled_local_attention,
    eager_attention,
    flex_global_attention,
    fused_positional_attention,
    global_attention,
    local_attention,
    masked_attention_with_weights,
    positional_attention,
    positional_attention_with_weights,
    shared_weights_positional_attention,
)
from .visibility_hf_attn import Visibility

if TYPE_CHECKING:
    from .configuration_hf_attn import HfAttnConfig


ATTN_IMPLEMENTATION = "_attn_implementation"  # transformers' config field behind `attn_implementation`


@dataclass(frozen=True)
class HeadKind:
    """One kind of attention head.

    Content kinds (`content=True`) take queries and keys from the hidden states through the layer's `c_attn`. The
    positional kind takes them from the positional encoding P through the layer's `p_attn`, the same for every
    input, so they come with a batch dimension of 1 unless padding shifts positions per sample. Every kind takes
    its values from the hidden states, and every kernel is `(q, k, v, visibility, key_mask, scale, dropout) ->
    (B, H, T, D)`. A layer has one `p_attn` for all its heads that are not content heads, so `positional` is the
    only such kind.
    """

    name: str  # as written in `head_layout`
    content: bool
    kernels: Mapping[str, Callable]  # the functions that can run its heads, by the value of `kernel_field`
    cached: tuple[str, ...]  # what decoding keeps per token: "keys" and "values", or "values" only
    summary: str  # what its heads do, for model cards: "{visible}" becomes the keys a query sees
    kernel_field: str | None = None  # the config field choosing among `kernels`; None when there is one kernel
    kernel_with_weights: Callable | None = None  # also returns the (B|1, H, T, S) weights
    window_field: str | None = None  # the config field bounding how far a query sees, and how much is cached
    sink_field: str | None = None  # the config field naming how many first tokens a query sees besides its window
    config_fields: tuple[str, ...] = ()  # the config fields that shape what this kind alone computes
    # Its name in transformers' `AttentionInterface`, where its kernels are registered (see `attention_function`);
    # None for global heads, whose kernel is transformers' own choice, `attn_implementation`.
    interface_name: str | None = None

    def kernel(self, config: HfAttnConfig) -> Callable:
        """The kernel the config chooses; the first one when it chooses none (`attn_implementation` unset)."""
        choice = getattr(config, self.kernel_field) if self.kernel_field else None
        return self.kernels[choice or next(iter(self.kernels))]

    def attention_function(self) -> Callable:
        """What runs this kind's heads, as transformers' attention interface calls it: `(module, query, key, value,
        attention_mask, scaling, dropout) -> (output (B, T, H, D), weights)`. Looked up in `ALL_ATTENTION_FUNCTIONS`
        at every call, so registering another function under `interface_name` swaps the kernel of every model."""
        if self.interface_name is None:
            return self.run
        return ALL_ATTENTION_FUNCTIONS[self.interface_name]

    def run(self, module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs):
        """This kind's heads of an hf_attn attention layer (`module`) through the kernel its config chose.
        `attention_mask` is the kernel's `key_mask`: None, (B, S) padding, or a whole (B|1, 1, T, S) mask."""
        kernels = getattr(module, "kernels", {})
        if self.name not in kernels:
            raise ValueError(
                f"The attention function {self.interface_name or self.name!r} runs the {self.name} heads of hf_attn "
                f"layers; {type(module).__name__} has none."
            )
        out = kernels[self.name](query, key, value, module.visibility[self.name], attention_mask, scaling, dropout)
        return out.transpose(1, 2), None

    def window(self, config: HfAttnConfig) -> int | None:
        """How many positions back (and, when bidirectional, ahead) a query sees; None for all of them. The cache
        keeps as many past tokens."""
        return getattr(config, self.window_field) if self.window_field else None

    def sinks(self, config: HfAttnConfig) -> int:
        """How many first tokens of the sequence a query sees besides its window (and the cache keeps)."""
        return getattr(config, self.sink_field, 0) if self.sink_field else 0

    def visibility(self, config: HfAttnConfig) -> Visibility:
        return Visibility(config.is_causal, config.attend_to_self, self.window(config), self.sinks(config))

    def describe(self, config: HfAttnConfig) -> str:
        """What each of its heads does, for the model card."""
        return self.summary.format(visible=visible_keys(self.visibility(config)))


def visible_keys(visibility: Visibility) -> str:
    """The keys a query sees, in words, for model cards: read from the same `Visibility` the kernels get."""
    k = visibility.local_window
    if k is None and not visibility.is_causal and visibility.attend_to_self:
        return "every position"
    if k is None:
        seen = "every earlier position" if visibility.is_causal else "every other position"
    elif visibility.is_causal:
        seen = "the previous position" if k == 1 else f"the {k} previous positions"
    else:
        seen = "the nearest position on each side" if k == 1 else f"the {k} nearest positions on each side"
    seen = f"{seen} and itself" if visibility.attend_to_self else seen
    if visibility.sink_tokens:
        first = "token" if visibility.sink_tokens == 1 else f"{visibility.sink_tokens} tokens"
        seen = f"{seen}, and the first {first} of the sequence (attention sinks)"
    return seen


GLOBAL = HeadKind(
    name="global",
    content=True,
    kernels={"sdpa": global_attention, "eager": eager_attention, "flex_attention": flex_global_attention},
    kernel_field=ATTN_IMPLEMENTATION,  # transformers' own choice, `attn_implementation`, checked by the model
    kernel_with_weights=masked_attention_with_weights,
    cached=("keys", "values"),
    summary="each query attends by content to {visible}",
)
LOCAL = HeadKind(
    name="local",
    content=True,
    kernels={"banded": local_attention, "compiled": compiled_local_attention},
    kernel_field="local_attention_impl",
    kernel_with_weights=masked_attention_with_weights,  # differentiable: the banded kernel's weights are not
    cached=("keys", "values"),  # the last `local_window` only: a k-local head never looks further back
    window_field="local_window",
    sink_field="sink_tokens",
    config_fields=("local_window", "sink_tokens"),
    interface_name="hf_attn_local",
    summary="each query attends by content to {visible} only",
)
POSITIONAL = HeadKind(
    name="positional",
    content=False,
    kernels={
        "auto": positional_attention,
        "shared_weights": shared_weights_positional_attention,
        "fused": fused_positional_attention,
    },
    kernel_field="positional_attention_impl",
    kernel_with_weights=positional_attention_with_weights,
    cached=("values",),  # its weights come from positions, not from the keys of past tokens
    config_fields=("positional_encoding", "positional_encoding_dim", "positional_qk_dim"),
    interface_name="hf_attn_positional",
    summary="each query weighs {visible} by the fixed positional encoding P alone, with the same weights for "
    "every input (the values still come from the data)",
)

# In the order a layer groups its heads by kind.
HEAD_KINDS: dict[str, HeadKind] = {kind.name: kind for kind in (GLOBAL, LOCAL, POSITIONAL)}
for _kind in HEAD_KINDS.values():
    if _kind.interface_name is not None:
        AttentionInterface.register(_kind.interface_name, _kind.run)


def kinds_in(*layers: list[str]) -> list[HeadKind]:
    """The kinds that some head of `layers` (lists of kind names, as in `head_layout`) has, in table order."""
    return [kind for kind in HEAD_KINDS.values() if any(kind.name in layer for layer in layers)]


__all__ = ["HeadKind", "HEAD_KINDS", "GLOBAL", "LOCAL", "POSITIONAL", "kinds_in", "visible_keys"]


def unsupported_attention(requested: str, supported) -> str:
    """transformers' words for an `attn_implementation` it does not know, which its tests and users' code match, with
    what this model allows."""
    allowed = ", ".join(f'`attn_implementation="{name}"`' for name in supported)
    return f'Specified `attn_implementation="{requested}"` is not supported. The only possible arguments are {allowed}'
