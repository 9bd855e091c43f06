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

# Room added when a buffer of every past token fills up: an eighth of its tokens, at least this many.
MIN_GROWTH = 16


def _cat(past: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """`new` appended to `past`, in storage of its own: `new` is a view into the layer's whole projection, which
    the cache must not keep alive."""
    return new.contiguous().clone() if past is None else torch.cat([past, new], dim=-2)


def _append(buffer: torch.Tensor | None, used: int, new: torch.Tensor) -> torch.Tensor:
    """`new` written after the first `used` tokens of `buffer`, growing it geometrically when full; returns the
    buffer. Appending in place keeps a decoding step from copying every past token, as `torch.cat` does."""
    needed = used + new.shape[-2]
    # A buffer made under torch.inference_mode can only be written in it: outside, it is copied like a full one.
    frozen = buffer is not None and buffer.is_inference() and not torch.is_inference_mode_enabled()
    if buffer is None or buffer.shape[-2] < needed or frozen:
        grown = new.new_empty(*new.shape[:-2], needed + max(MIN_GROWTH, needed // 8), new.shape[-1])
        if buffer is not None:
            grown[..., :used, :] = buffer[..., :used, :]
        buffer = grown
    buffer[..., used:needed, :] = new
    return buffer


class HeadKindCacheLayer:
    """One layer's cache: per head kind present, the tensors its `cached` names, (B, H_kind, tokens, D), holding the
    last `kind.window(config)` tokens (all of them when the kind has no window).

    A kind without a window keeps every token in a buffer with room to grow (see `_append`), so its tensors are
    views of the first `seen_tokens` tokens. While gradients are recorded, tokens are concatenated instead: an
    in-place write would invalidate the earlier steps' graphs.
    """

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
        """Every kept tensor by `<kind>_<what>`, e.g. `local_keys`, without the room left to grow."""
        return {
            f"{kind}_{what}": tensor[..., : self.seen_tokens, :]
            for kind, kept in self.kept.items()
            for what, tensor in kept.items()
        }

    def update(self, kind: HeadKind, **new: torch.Tensor) -> dict[str, torch.Tensor]:
        """Returns the kept past plus the new tokens of what `kind` caches (`keys=`, `values=`); keeps the last
        `kind.window(config)` tokens of them."""
        past = self.kept.get(kind.name, {})
        window = kind.window(self.config)
        if window is not None:
            full = {what: _cat(past.get(what), new[what]) for what in kind.cached}
            # a view would keep every token alive
            self.kept[kind.name] = {what: t[:, :, -window:].clone() for what, t in full.items()}
            return full
        if torch.is_grad_enabled():
            used = {what: past[what][..., : self.seen_tokens, :] for what in past}
            self.kept[kind.name] = {what: _cat(used.get(what), new[what]) for what in kind.cached}
        else:
            self.kept[kind.name] = {what: _append(past.get(what), self.seen_tokens, new[what]) for what in kind.cached}
        end = self.seen_tokens + next(iter(new.values())).shape[-2]
        return {what: t[..., :end, :] for what, t in self.kept[kind.name].items()}

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
        """Bytes held by every cached tensor, room to grow included, for benchmarks and tests of the cache's growth."""
        return sum(t.untyped_storage().nbytes() for layer in self.layers for t in layer.tensors().values())

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
