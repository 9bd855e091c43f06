"""How far back a head's average query reaches: NVIDIA kvpress's on-the-fly DuoAttention scoring
(`duo_attention_on_the_fly`, kvpress 0.5), as a `select_heads` score.

kvpress's DuoAttentionPress, without a pattern trained for the model, ranks key/value heads by one statistic each:
the head's mean query and mean key over a calibration text (before the rotary embedding), each repeated at positions
0..L-1 (L = 500) and rotated there, then the attention weights of the last of those queries over the L keys; the
score is the area under their cumulative sum from position 0: near 1 when the weight sits on the first positions
(far back), near 1/L when it sits on the query's own. The lowest become its streaming heads (128 sinks and 256
recent tokens), hf_attn's local heads. It reads no answers and trains nothing: one forward pass per batch of blocks.

Where it differs from kvpress: the text is `select_heads`' calibration blocks (WikiText-2 validation by default;
kvpress reads 50 BookSum chapters), a block's means over its tokens as a chapter's are; the scale is the attention
module's own `scaling` (kvpress: 1/sqrt(D), the same for Llama, Qwen and Mistral). A key/value group scores as the
mean of its query heads, as kvpress's does (`mass` and `retrieval` take their maximum).

Legend: B batch, H query heads, H_kv key/value heads, T tokens of a block, D head dim, L `length`.
"""

import sys
from dataclasses import dataclass, field

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import AttentionInterface

from .gate_scores import attention_as, check_count, check_score_arguments, frozen, units_per_layer
from .hybrid import ATTENTION_MODULES

REACH_ATTENTION = "hf_attn_reach"  # its name in transformers' attention and mask interfaces
LENGTH = 500  # kvpress's q_len: the synthetic positions the mean query and key are repeated at


@dataclass
class Reach:
    """What `reach_attention` reads and adds to: the synthetic length, the (layers, H) areas summed over blocks, and
    each layer's rotary (cos, sin) of the current forward pass, left by `keep_rotary`."""

    length: int
    totals: torch.Tensor
    rotary: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def rotation_of(module):
    """The family's `apply_rotary_pos_emb(q, k, cos, sin)` (the module that defines the attention class has it), or
    a `ValueError` for a family without rotary embeddings."""
    rotate = getattr(sys.modules[type(module).__module__], "apply_rotary_pos_emb", None)
    if rotate is None:
        raise ValueError(f"The `reach` score needs rotary position embeddings; {type(module).__name__} has none "
                         "(GPT-2 learns absolute positions): choose another score")  # fmt: skip
    return rotate


def reach_areas(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotate, scaling: float,
                length: int) -> torch.Tensor:  # fmt: skip
    """(B, H) area under the cumulated attention of each row's mean query, placed last of `length` copies, over as
    many copies of its mean key (kvpress's statistic). `query` (B, H, T, D) and `key` (B, H_kv, T, D) as attention
    gets them, rotated at positions 0..T-1 by `cos` and `sin` (B, T, D); T >= `length`."""
    cos, sin = cos.float(), sin.float()
    query, key = rotate(query.float(), key.float(), cos, -sin)  # a rotation by minus the angle: as projected
    heads, keys = query.shape[1], key.shape[1]
    mean_query = query.mean(-2, keepdim=True).expand(-1, -1, length, -1)
    mean_key = key.mean(-2, keepdim=True).expand(-1, -1, length, -1)
    mean_query, mean_key = rotate(mean_query, mean_key, cos[:, :length], sin[:, :length])
    mean_key = mean_key.repeat_interleave(heads // keys, dim=1)  # each query head's key/value head
    weights = (mean_query[:, :, -1:] @ mean_key.transpose(-1, -2) * scaling).softmax(-1)  # (B, H, 1, L)
    return weights.cumsum(-1).mean(-1)[..., 0]


def keep_rotary(module, args, kwargs) -> None:
    """Forward pre-hook: leaves the layer's rotary (cos, sin) for `reach_attention`, which gets the rotated query and
    key alone."""
    rotary = kwargs.get("position_embeddings", args[1] if len(args) > 1 else None)
    module.hf_attn_state.rotary[module.layer_idx] = rotary


def reach_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs):
    """SDPA's output, after adding each row's `reach_areas` to the layer's totals."""
    reach: Reach = module.hf_attn_state
    cos, sin = reach.rotary.pop(module.layer_idx)
    areas = reach_areas(query, key, cos, sin, rotation_of(module), scaling, reach.length)
    reach.totals[module.layer_idx] += areas.sum(0).cpu()
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


AttentionInterface.register(REACH_ATTENTION, reach_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(REACH_ATTENTION, sdpa_mask)


def reach_scores(model, calibration_ids: torch.Tensor, *, local_window: int, sink_tokens: int, batch_size: int,
                 unit: str, tokenizer=None, length: int = LENGTH) -> torch.Tensor:  # fmt: skip
    """(layers, units) mean over the blocks of `calibration_ids` (N, T >= `length`) of each head's `reach_areas`; a
    key/value group takes its query heads' mean. The window and sinks do not enter the statistic (they are checked as
    every score's are). Costs N / `batch_size` forward passes."""
    check_score_arguments(local_window, sink_tokens, batch_size)
    check_count("length", length, 2)
    if calibration_ids.shape[1] < length:
        raise ValueError(f"Calibration blocks must hold at least `length` ({length}) tokens, got blocks of "
                         f"{calibration_ids.shape[1]} (--block_size)")  # fmt: skip
    units = units_per_layer(model.config, unit)
    modules = [module for module in model.modules() if isinstance(module, tuple(ATTENTION_MODULES.values()))]
    rotation_of(modules[0])  # a family without rotary embeddings refused before any pass
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    reach = Reach(length, torch.zeros(layers, heads))
    hooks = [module.register_forward_pre_hook(keep_rotary, with_kwargs=True) for module in modules]
    try:
        with frozen(model), attention_as(model, REACH_ATTENTION, reach), torch.no_grad():
            for start in range(0, len(calibration_ids), batch_size):
                model.base_model(calibration_ids[start : start + batch_size].to(model.device), use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return (reach.totals / len(calibration_ids)).view(layers, units, -1).mean(-1)


__all__ = ["reach_scores", "reach_areas", "REACH_ATTENTION", "LENGTH"]
