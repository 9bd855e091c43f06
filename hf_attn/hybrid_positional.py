"""Positional heads (Paper A's kind) and numeric inputs in hybridized decoders.

A positional head takes its queries and keys from a fixed positional encoding P through projections of its own,
`p_attn` in each attention module that has such heads (queries of every positional head, then keys, as hf_attn's
GPT-2 family has them), and its values from the layer's value projection: its weights are the same for every input.
P's rows are computed at the positions the model's forward counts (real tokens from 0 under padding, or the given
`position_ids`: packed documents restart), never read from a table, so no length bounds them but P's own width.

`numeric_inputs` adds `wne`, Paper A's embedding of a number as value * w + b, so that Paper A's tasks (a number per
position, a regression target per position) run on these architectures too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from .cache_hf_attn import widened_to_slots
from .hybrid_attention import POSITIONAL_ROWS, head_dim
from .position_encodings_hf_attn import FIXED_ROWS
from .positions_hf_attn import query_and_key_positions, tracing

POSITIONAL_ENCODINGS = tuple(FIXED_ROWS)
# The fields a hybridized config adds for positional heads and numbers, with their defaults (None: derived).
POSITIONAL_FIELDS = {
    "positional_encoding": "sinusoidal",
    "positional_encoding_dim": None,
    "positional_qk_dim": None,
    "numeric_inputs": False,
}
NUMERIC_VALUES = "numeric_values"  # the forward argument holding Paper A's numbers, (B, T) floats


def fill_positional_fields(config) -> None:
    """P's width d_P where not given: the number of positions for one-hot (as Paper A's `eye(n + 1)`), the bits
    that count them for binary, the heads' width for sinusoidal (a stated deviation from Paper A, whose P is
    one-hot: sinusoids need no bound on positions). The positional heads' query/key width defaults to d_P."""
    if config.positional_encoding_dim is None and config.positional_encoding in FIXED_ROWS:
        positions = config.max_position_embeddings
        config.positional_encoding_dim = {
            "onehot": positions,
            "binary": max(1, math.ceil(math.log2(positions))),
            "sinusoidal": head_dim(config),
        }[config.positional_encoding]
    if config.positional_qk_dim is None:
        config.positional_qk_dim = config.positional_encoding_dim


def positional_problems(config) -> list[str]:
    """Every problem of the positional fields, each naming the field and what it allows."""
    problems = []
    if config.positional_encoding not in FIXED_ROWS:
        problems.append(
            f"`positional_encoding` must be one of {list(FIXED_ROWS)} (P's fixed rows), got "
            f"{config.positional_encoding!r}"
        )
    for name in ("positional_encoding_dim", "positional_qk_dim"):
        value = getattr(config, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            problems.append(f"`{name}` must be an int >= 1, got {value!r}")
    if config.positional_encoding == "sinusoidal" and isinstance(config.positional_encoding_dim, int):
        if config.positional_encoding_dim % 2:
            problems.append(
                f"`positional_encoding_dim` must be even for sinusoidal P, got {config.positional_encoding_dim}"
            )
    if not isinstance(config.numeric_inputs, bool):
        problems.append(f"`numeric_inputs` must be True or False, got {config.numeric_inputs!r}")
    return problems


def uses_positional_heads(config) -> bool:
    return any("positional" in layer for layer in config.head_layout)


def attach_positional_projection(model: nn.Module, attention: nn.Module, positional_heads: Sequence[int]) -> None:
    """Gives `attention` its `p_attn` for the query heads `positional_heads` (none: removed), kept where it has one
    for the same heads and widths already (a model hybridized again with other local heads or sinks, or loading); a
    new one otherwise, on the attention's device and dtype, initialised by the model's `_init_weights` (the family's
    normal(`initializer_range`) with zero biases, as hf_attn's GPT-2 family does with `initialization="gpt2"`). On
    the meta device, loading fills or initialises it."""
    config = model.config
    heads = tuple(positional_heads)
    shape = (2 * len(heads) * config.positional_qk_dim, config.positional_encoding_dim)
    current = getattr(attention, "p_attn", None)
    if not heads:
        if current is not None:
            del attention.p_attn
        return
    if current is not None and tuple(current.weight.shape) == shape and current.query_heads == heads:
        return
    reference = attention.o_proj.weight if hasattr(attention, "o_proj") else attention.c_proj.weight
    attention.p_attn = new_linear(model, shape[1], shape[0], reference)
    attention.p_attn.query_heads = heads  # the query heads it projects for, in order


def attach_numeric_embedding(model: nn.Module) -> None:
    """`wne` on the base model where `numeric_inputs` asks for it (Paper A: a number enters as value * w + b)."""
    base = model.base_model
    if not model.config.numeric_inputs:
        if hasattr(base, "wne"):
            del base.wne
        return
    if hasattr(base, "wne"):
        return
    base.wne = new_linear(model, 1, model.config.hidden_size, base.get_input_embeddings().weight)


def new_linear(model: nn.Module, in_features: int, out_features: int, reference: torch.Tensor) -> nn.Linear:
    """A linear layer on `reference`'s device and dtype, drawn by the model's `_init_weights`; left to loading on the
    meta device."""
    linear = nn.Linear(in_features, out_features, device=reference.device, dtype=reference.dtype)
    if reference.device.type != "meta":
        model._init_weights(linear)
    return linear


def numbers_embedded(model: nn.Module, args: tuple, kwargs: dict) -> dict:
    """`numeric_values` (B, T) turned into `inputs_embeds` through `wne`: the numbers are the whole input."""
    values = kwargs.pop(NUMERIC_VALUES)
    if not model.config.numeric_inputs:
        raise ValueError("`numeric_values` needs a model made with `numeric_inputs=True` (its `wne` embeds them).")
    if args or kwargs.get("input_ids") is not None or kwargs.get("inputs_embeds") is not None:
        raise ValueError("Give `numeric_values` or `input_ids` / `inputs_embeds`, not both: the numbers are the input.")
    wne = model.base_model.wne
    kwargs["inputs_embeds"] = wne(values[..., None].to(wne.weight.dtype))
    return kwargs


def positional_rows(config, kwargs: dict, cache, length: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """P's rows at the new tokens' positions (B|1, T, d_P) and at every key's (B|1, S, d_P), S spanning the mask's
    columns (a static cache's every slot). Positions follow the 2D mask (each row's real tokens from 0, as
    `generate` counts them), or the given `position_ids` where nothing is cached (packed documents restart): the
    same rule as hf_attn's own models. One row for the batch wherever every row's token j sits at position j."""
    mask = kwargs.get("attention_mask")
    mask = mask if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None  # a 4D mask says nothing of positions
    past = cache.get_seq_length() if cache is not None else 0
    past = past.clone() if isinstance(past, torch.Tensor) else past  # a static layer's counter, moved in place
    static = cache is not None and cache.is_compileable
    mask = widened_to_slots(mask, cache)
    num_keys = cache.get_max_length() if static else None
    # Packed documents need no pair mask here: the family's own mask keeps them apart.
    position_ids, key_positions, _, _ = query_and_key_positions(
        kwargs.get("position_ids"), mask, None, past, length, num_keys, {"restarts": False}, device
    )
    check_positions_fit(config, key_positions)
    encode = FIXED_ROWS[config.positional_encoding]
    return tuple(encode(p, config.positional_encoding_dim).to(dtype) for p in (position_ids, key_positions))


def check_positions_fit(config, positions: torch.Tensor) -> None:
    """One-hot and binary P tell apart only as many positions as their width allows: refused beyond (read on the
    host, outside graph capture); sinusoidal P has no bound."""
    bound = {"onehot": config.positional_encoding_dim, "binary": 2**config.positional_encoding_dim}.get(
        config.positional_encoding
    )
    if bound is None or tracing():
        return
    if (last := int(positions.max())) >= bound:
        raise ValueError(
            f"Position {last} is beyond what `positional_encoding`={config.positional_encoding!r} with "
            f"`positional_encoding_dim`={config.positional_encoding_dim} tells apart (positions 0..{bound - 1}); "
            "use a wider P or `positional_encoding='sinusoidal'`."
        )


def with_positional_rows(model, args: tuple, kwargs: dict, cache) -> dict:
    """`kwargs` with P's rows for every layer's positional heads (`POSITIONAL_ROWS`); `args`: `input_ids` or none."""
    inputs = args[0] if args else kwargs.get("input_ids")
    inputs = kwargs.get("inputs_embeds") if inputs is None else inputs
    kwargs[POSITIONAL_ROWS] = positional_rows(model.config, kwargs, cache, inputs.shape[1], inputs.device, model.dtype)
    return kwargs


def per_position_mse(logits: torch.Tensor, labels: torch.Tensor, config, **kwargs) -> torch.Tensor:
    """Per-position regression (`problem_type="regression"`), as hf_attn's own token classification: labels (B, T)
    for one output or (B, T, num_labels), NaN where a position has no target (Paper A's scratchpad)."""
    predictions = logits.squeeze(-1) if labels.dim() == 2 else logits
    kept = ~torch.isnan(labels)
    return nn.functional.mse_loss(predictions[kept].float(), labels[kept].float())
