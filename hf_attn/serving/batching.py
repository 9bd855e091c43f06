"""Continuous batching of hf_attn models on transformers' own machinery: its manager, scheduler, request states and
generation loop, with `HeadKindPagedCache` in place of `PagedAttentionCache`.

`generate_batch`, `continuous_batching_context_manager`, `generate` with a `ContinuousBatchingConfig` and
`transformers serve --continuous-batching` all go through the model's `init_continuous_batching`, which hf_attn's
models answer with `HeadKindBatchingManager`. What it changes, and why:

- the attention implementation stays the model's own (transformers would switch it to "paged|eager", "sdpa" or a
  flash kernel, which know nothing of head kinds);
- its batch processor gets `HeadKindPagedCache` and no transformers mask (both are named inside
  `_create_batch_processor`, so they are swapped there for that call alone);
- CUDA graphs, prefix sharing and offloading to the CPU are off: the masks are made per forward and a window's pages
  change hands; a request the cache cannot hold any more is restarted (transformers' soft reset).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching import continuous_api, input_outputs
from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager

from ..configuration_hf_attn import HfAttnConfig
from ..hybrid_attention import layer_heads
from .paged_attention import begin_hf_attn_batch, begin_hybrid_batch, hf_attn_plan, hybrid_plan
from .paged_cache import HeadKindPagedCache

_SWAP = threading.Lock()  # the cache class is swapped in transformers' module for one call at a time


class HeadKindBatchingManager(ContinuousBatchingManager):
    """transformers' `ContinuousBatchingManager` for hf_attn models (see the module's docstring)."""

    def __init__(self, model, generation_config: GenerationConfig,
                 continuous_batching_config: ContinuousBatchingConfig, workload_hints=None) -> None:  # fmt: skip
        if getattr(generation_config, "num_return_sequences", None) not in (None, 1):
            raise ValueError(
                "`num_return_sequences` must be 1 under continuous batching of hf_attn models (a request's pages "
                f"are not forked), got {generation_config.num_return_sequences}"
            )
        if not getattr(model.config, "is_causal", True):
            raise ValueError("Continuous batching generates left to right: it needs a causal model (`is_causal=True`)")
        if continuous_batching_config.cpu_offload_space:
            raise ValueError(
                "`cpu_offload_space` must be 0 under continuous batching of hf_attn models (a window's pages are not "
                "a dense table to copy out and back): a request that does not fit is restarted instead, got "
                f"{continuous_batching_config.cpu_offload_space}"
            )
        continuous_batching_config.use_cuda_graph = False
        continuous_batching_config.allow_block_sharing = False
        super().__init__(model, generation_config, continuous_batching_config, workload_hints)

    def switch_to_cb_friendly_attn(self, model, auto_switch_to_flash: bool = True) -> None:
        """The model's own attention function reads the paged cache: nothing to switch."""

    def _create_batch_processor(self):
        model = self.model
        if isinstance(model.config, HfAttnConfig):
            plan, begin_batch = hf_attn_plan(model.config, model.dtype), begin_hf_attn_batch
        else:
            plan, begin_batch = hybrid_plan(model.config, layer_heads_of(model), model.dtype), begin_hybrid_batch

        def paged_cache(config, continuous_batching_config, device, distributed_helper, dtype,
                        model_supports_logits_to_keep=False) -> HeadKindPagedCache:  # fmt: skip
            return HeadKindPagedCache(plan, config, continuous_batching_config, device, distributed_helper,
                                      begin_batch, dtype, model_supports_logits_to_keep)  # fmt: skip

        with _hf_attn_batch_processor(paged_cache):
            return super()._create_batch_processor()


def layer_heads_of(model) -> dict:
    config = model.config
    return {i: layer_heads(config, i) for i in range(config.num_hidden_layers)}


@contextmanager
def _hf_attn_batch_processor(paged_cache):
    """transformers' continuous batching names its cache class, and asks whether masks are needed, inside the
    function that makes its batch processor: for that call, `paged_cache` is the cache, and no mask is made (hf_attn's
    attention makes each kind's own from the keys' positions; transformers would make one for the model's
    `attn_implementation`, "sdpa" for hf_attn's own models)."""
    with _SWAP:
        originals = continuous_api.PagedAttentionCache, input_outputs.attn_mask_is_needed
        continuous_api.PagedAttentionCache, input_outputs.attn_mask_is_needed = paged_cache, _no_mask
        try:
            yield
        finally:
            continuous_api.PagedAttentionCache, input_outputs.attn_mask_is_needed = originals


def _no_mask(config) -> bool:
    return False


def init_continuous_batching(model, generation_config: GenerationConfig | None = None,
                             continuous_batching_config: ContinuousBatchingConfig | None = None,
                             workload_hints=None) -> HeadKindBatchingManager:  # fmt: skip
    """transformers' `init_continuous_batching`, with `HeadKindBatchingManager`: a manager kept by the model
    (`persistent_manager=True`) is returned again."""
    cached = getattr(model, "_cached_continuous_batching_manager", None)
    if isinstance(cached, HeadKindBatchingManager):
        return cached
    generation_config = generation_config if generation_config is not None else model.generation_config
    if generation_config.eos_token_id is None:
        generation_config.eos_token_id = -1  # as transformers does: no end-of-sequence token
    if continuous_batching_config is None:
        continuous_batching_config = ContinuousBatchingConfig()
    return HeadKindBatchingManager(model, generation_config, continuous_batching_config, workload_hints)
