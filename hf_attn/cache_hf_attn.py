"""A decoding cache that keeps, per head kind, only what that kind needs.

- global heads: every key and value;
- local heads: the last `local_window` keys and values (a k-local head never looks further back);
- positional heads: values only, since their weights come from positions.

So a local-only model decodes with a cache of constant size, whatever the context length.
"""

import torch
from transformers import Cache


def _cat(past: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """`new` appended to `past`, in storage of its own: `new` is a view into the layer's whole projection, which
    the cache must not keep alive."""
    return new.contiguous().clone() if past is None else torch.cat([past, new], dim=-2)


class HeadKindCacheLayer:
    """One layer's cache. Tensors are (B, H_kind, tokens, D); a kind absent from the layer stays None."""

    is_compileable = False
    is_croppable = False  # dropped local keys cannot be restored
    is_sliding = False

    def __init__(self, local_window: int):
        self.local_window = local_window
        self.global_keys = self.global_values = None
        self.local_keys = self.local_values = None
        self.positional_values = None
        self.seen_tokens = 0

    @property
    def is_initialized(self) -> bool:
        return self.seen_tokens > 0

    def tensors(self) -> dict[str, torch.Tensor]:
        names = ("global_keys", "global_values", "local_keys", "local_values", "positional_values")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    def update_global(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.global_keys, self.global_values = _cat(self.global_keys, keys), _cat(self.global_values, values)
        return self.global_keys, self.global_values

    def update_local(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns the kept past plus the new keys and values; keeps only the last `local_window` of them."""
        keys, values = _cat(self.local_keys, keys), _cat(self.local_values, values)
        self.local_keys = keys[:, :, -self.local_window :].clone()  # a view would keep every token alive
        self.local_values = values[:, :, -self.local_window :].clone()
        return keys, values

    def update_positional(self, values: torch.Tensor) -> torch.Tensor:
        self.positional_values = _cat(self.positional_values, values)
        return self.positional_values

    def apply(self, fn) -> None:
        for name, tensor in self.tensors().items():
            setattr(self, name, fn(tensor))

    def get_seq_length(self) -> int:
        return self.seen_tokens

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.__init__(self.local_window)


class HeadKindCache(Cache):
    """`Cache` for hf_attn models. The model makes it itself when `use_cache=True`, not `generate`."""

    def __init__(self, num_layers: int, local_window: int):
        super().__init__(layers=[HeadKindCacheLayer(local_window) for _ in range(num_layers)])

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
