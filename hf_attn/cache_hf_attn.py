"""A decoding cache that keeps, per head kind, only what that kind needs, as its `HEAD_KINDS` entry says.

- global heads: every key and value;
- local heads: the last `local_window` keys and values (a k-local head never looks further back);
- positional heads: values only, since their weights come from positions.

So a local-only model decodes with a cache of constant size, whatever the context length.
"""

import torch
from transformers import Cache

from .configuration_hf_attn import HfAttnConfig
from .head_kinds_hf_attn import HeadKind


def _cat(past: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """`new` appended to `past`, in storage of its own: `new` is a view into the layer's whole projection, which
    the cache must not keep alive."""
    return new.contiguous().clone() if past is None else torch.cat([past, new], dim=-2)


class HeadKindCacheLayer:
    """One layer's cache: per head kind present, the tensors its `cached` names, (B, H_kind, tokens, D), holding the
    last `kind.window(config)` tokens (all of them when the kind has no window)."""

    is_compileable = False
    is_croppable = False  # dropped local keys cannot be restored
    is_sliding = False

    def __init__(self, config: HfAttnConfig):
        self.config = config
        self.kept: dict[str, dict[str, torch.Tensor]] = {}  # kind name -> {"keys": ..., "values": ...}
        self.seen_tokens = 0

    @property
    def is_initialized(self) -> bool:
        return self.seen_tokens > 0

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every kept tensor by `<kind>_<what>`, e.g. `local_keys`."""
        return {f"{kind}_{what}": tensor for kind, kept in self.kept.items() for what, tensor in kept.items()}

    def update(self, kind: HeadKind, **new: torch.Tensor) -> dict[str, torch.Tensor]:
        """Returns the kept past plus the new tokens of what `kind` caches (`keys=`, `values=`); keeps the last
        `kind.window(config)` tokens of them."""
        past = self.kept.get(kind.name, {})
        full = {what: _cat(past.get(what), new[what]) for what in kind.cached}
        window = kind.window(self.config)
        # a view would keep every token alive
        self.kept[kind.name] = full if window is None else {what: t[:, :, -window:].clone() for what, t in full.items()}
        return full

    def apply(self, fn) -> None:
        self.kept = {kind: {what: fn(t) for what, t in kept.items()} for kind, kept in self.kept.items()}

    def get_seq_length(self) -> int:
        return self.seen_tokens

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.__init__(self.config)


class HeadKindCache(Cache):
    """`Cache` for hf_attn models. The model makes it itself when `use_cache=True`, not `generate`."""

    def __init__(self, config: HfAttnConfig):
        super().__init__(layers=[HeadKindCacheLayer(config) for _ in range(config.n_layer)])

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].get_seq_length()

    def memory_bytes(self) -> int:
        """Bytes held by every cached tensor, for benchmarks and tests of the cache's growth."""
        return sum(t.numel() * t.element_size() for layer in self.layers for t in layer.tensors().values())

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        for layer in self.layers:
            layer.apply(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        for layer in self.layers:
            layer.apply(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        for layer in self.layers:
            layer.apply(lambda t: t[indices])

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("HeadKindCache drops old local keys, so it cannot be cropped (assisted decoding).")

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()


__all__ = ["HeadKindCache", "HeadKindCacheLayer"]
