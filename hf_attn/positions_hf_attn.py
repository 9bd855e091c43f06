"""Positions per row: real tokens counted from 0 under padding (as `generate` does), documents restarting in packed
rows, and the columns of a mask that belong to the new tokens.

Positions follow the mask, so that left padding changes no row's outputs, and positional heads' weights stay one
tensor for the whole batch wherever no row is left-padded.
"""

import torch


def tracing() -> bool:
    """Under torch.compile or torch.export: nothing may read a tensor on the host (a sync and a graph break)."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


def visible_pairs(mask: torch.Tensor) -> torch.Tensor:
    """A custom 4D mask as (B|1, 1, T, S) bool, True where a query may see a key: bool masks as they are, additive
    float masks (transformers' convention: 0 to attend, a large negative not to) where 0, integer masks where 1."""
    if mask.dtype == torch.bool:
        return mask
    return mask == 0 if mask.is_floating_point() else mask == 1


def query_columns(x: torch.Tensor, past_length: int | torch.Tensor, length: int) -> torch.Tensor:
    """`x`'s last-dimension columns of the `length` queries, which follow `past_length` cached tokens: its last
    columns, unless `x` also spans a static cache's empty slots after them (a mask `generate` widens to the cache)."""
    if isinstance(past_length, int) and x.shape[-1] == past_length + length:
        return x[..., -length:]
    return x[..., past_length + torch.arange(length, device=x.device)]


def positions_and_order(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S) positions counting each row's real tokens from 0, and (B, 1) whether in each row key j sits at
    position j wherever there is a token (no left padding, no holes)."""
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    shared = torch.arange(attention_mask.shape[-1], device=attention_mask.device)
    return positions, ((positions == shared) | (attention_mask == 0)).all(-1, keepdim=True)


def restarts_of(position_ids: torch.Tensor) -> torch.Tensor:
    """(B, T - 1) where a position does not follow the previous one: a packed document starts."""
    return position_ids[:, 1:] != position_ids[:, :-1] + 1


def same_document_pairs(position_ids: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) bool: which tokens share a document, in rows packed without padding, where a document starts
    wherever a position does not follow the previous one (TRL's `padding_free`)."""
    documents = torch.cat([torch.zeros_like(position_ids[:, :1]), restarts_of(position_ids).long().cumsum(-1)], -1)
    return (documents[:, :, None] == documents[:, None, :])[:, None]


def position_ids_from(attention_mask, past_length, length: int, device, num_keys: int | None = None,
                      in_order: bool | None = None) -> tuple[torch.Tensor, bool]:  # fmt: skip
    """(B|1, past + T) positions of every key: real tokens counted from 0, as `generate` does with padding; and
    whether key j simply sits at position j. `num_keys` replaces past + T without a mask (a static cache's size);
    `in_order` is the answer, when already read, to whether every row's key j sits at position j.

    One row for the whole batch unless some row is left-padded: then positional heads' weights stay one
    tensor for the batch (right padding, the usual training case, only masks keys). Under graph capture the
    question is not asked: every row gets its own.
    """
    if attention_mask is None:
        return torch.arange(past_length + length if num_keys is None else num_keys, device=device)[None], True
    positions, row_in_order = positions_and_order(attention_mask)
    shared = torch.arange(attention_mask.shape[-1], device=device)[None]
    if in_order is None:
        in_order = not tracing() and bool(row_in_order.all())
    if in_order:
        return shared, True
    # Chosen row by row, so that a row's positions (padding's included) never depend on the other rows.
    return torch.where(row_in_order, shared, positions), False


def query_and_key_positions(
    position_ids, attention_mask, pair_mask, past_length, length: int, num_keys: int | None, answers: dict, device
) -> tuple[torch.Tensor, torch.Tensor, bool, torch.Tensor | None]:
    """The new tokens' (B|1, T) positions, every key's, whether key j sits at position j, and the pair mask, which
    given positions that restart (a packed row without a mask) make: each document sees only itself. Given
    positions are taken for the keys too where nothing is cached; `answers` are `ask`'s."""
    in_order = False if tracing() else answers.get("rows in order")
    key_position_ids, keys_in_order = position_ids_from(attention_mask, past_length, length, device, num_keys, in_order)
    if position_ids is None:
        if attention_mask is None:
            position_ids = past_length + torch.arange(length, device=device)[None]
        else:
            position_ids = query_columns(key_position_ids, past_length, length)
    elif isinstance(past_length, int) and past_length == 0:
        key_position_ids, keys_in_order = position_ids, False
        if attention_mask is None and pair_mask is None and (tracing() or answers["restarts"]):
            pair_mask = same_document_pairs(position_ids)
    if num_keys is not None and key_position_ids.shape[-1] < num_keys:  # a static cache's empty slots: hidden
        key_position_ids = torch.nn.functional.pad(key_position_ids, (0, num_keys - key_position_ids.shape[-1]))
    return position_ids.view(-1, length), key_position_ids, keys_in_order, pair_mask
