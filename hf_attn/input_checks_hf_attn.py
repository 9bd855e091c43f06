"""What the trunk's `forward` refuses before any work: inputs of the wrong shape, token ids outside the vocabulary,
masks other than 0/1, non-finite numbers where used, positions beyond the position tables.

Shape checks need no values. Value checks are asked on the device and read in one host sync (`ask`): one wait per
forward for an accelerator, not one per question; under graph capture they are skipped.
"""

import torch

from .configuration_hf_attn import HfAttnConfig
from .positions_hf_attn import positions_and_order, query_columns, restarts_of, tracing


def check_shapes(input_ids, inputs_embeds, numeric_values, attention_mask) -> int:
    """The new tokens' length; missing, conflicting and empty inputs are refused before any work."""
    if input_ids is not None and inputs_embeds is not None:
        raise ValueError("Pass either `input_ids` or `inputs_embeds`, not both.")
    if inputs_embeds is not None and numeric_values is not None:
        raise ValueError("`numeric_values` go with `input_ids` or alone, not with `inputs_embeds` (never read).")
    candidates = {"input_ids": input_ids, "inputs_embeds": inputs_embeds, "numeric_values": numeric_values}
    name = next((name for name, tensor in candidates.items() if tensor is not None), None)
    if name is None:
        raise ValueError("Pass `input_ids`, `inputs_embeds` or `numeric_values`.")
    given = candidates[name]
    dims = ("batch", "length", "n_embd") if name == "inputs_embeds" else ("batch", "length")
    if given.dim() != len(dims) or 0 in given.shape[:2]:
        raise ValueError(
            f"`{name}` must be ({', '.join(dims)}) with at least one sequence of at least one token, "
            f"got shape {tuple(given.shape)}."
        )
    if attention_mask is not None and attention_mask.dim() not in (2, 4):
        raise ValueError(
            "`attention_mask` must be 2-D (batch, keys) of 0/1, or 4-D (batch, 1, queries, keys): True or 0 where "
            f"a query may see a key; got shape {tuple(attention_mask.shape)}."
        )
    return given.shape[1]


def numeric_positions(
    config: HfAttnConfig, input_ids, numeric_values, numeric_mask, attention_mask, past_length
) -> torch.Tensor | None:
    """(B, T) bool: where the embedding is `wne(value)`. Never padding (the queries' columns of the mask): values
    there are not used."""
    if numeric_values is None:
        return None
    if not config.numeric_inputs:
        raise ValueError("`numeric_values` were passed but the config has `numeric_inputs=False`.")
    if input_ids is None:
        positions = torch.ones(numeric_values.shape, dtype=torch.bool, device=numeric_values.device)
    elif numeric_mask is not None:
        positions = numeric_mask.bool()
    elif config.numeric_token_id is None:
        raise ValueError("With `numeric_values` and `input_ids`, pass `numeric_mask` or set `numeric_token_id`.")
    else:
        positions = input_ids == config.numeric_token_id
    if attention_mask is not None:
        positions = positions & query_columns(attention_mask, past_length, numeric_values.shape[1]).bool()
    return positions


def check_values(config: HfAttnConfig, input_ids, attention_mask, numeric_values, numeric_positions, position_ids,
                 past_length, length: int) -> dict[str, int]:  # fmt: skip
    """Refuses token ids, mask values, numbers and positions out of range, and returns the answers of `ask`,
    which `forward` reads again for its fast paths."""
    refused = refusals(config, input_ids, attention_mask, numeric_values, numeric_positions)
    answers = ask(config, refused, attention_mask, position_ids, past_length, length)
    raise_refused(refused, answers)
    check_positions(config, answers)
    return answers


def refusals(config: HfAttnConfig, input_ids, attention_mask, numeric_values, numeric_positions) -> dict[str, tuple]:
    """Per checked field: its values, where a value is refused, and what is allowed. Token ids outside the
    vocabulary, masks other than 0/1 and non-finite numbers where used are refused: unchecked, `wte` fails with
    a bare IndexError, a 2 in the mask silently counts as 1, and one NaN spreads to every position (0 * NaN in
    attention) and into the gradients."""
    vocab_size = config.vocab_size
    checks = {}
    if input_ids is not None:
        out_of_range = (input_ids < 0) | (input_ids >= vocab_size)
        checks["input_ids"] = (input_ids, out_of_range, f"token ids in [0, {vocab_size}) (`vocab_size`)")
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        not_binary = (attention_mask != 0) & (attention_mask != 1)
        checks["attention_mask"] = (attention_mask, not_binary, "only 0 (padding) and 1 (token)")
    if numeric_values is not None:
        not_finite = numeric_positions & ~torch.isfinite(numeric_values)
        checks["numeric_values"] = (
            numeric_values,
            not_finite,
            "finite numbers where they are used (values at padding and outside `numeric_mask` / "
            "`numeric_token_id` are ignored)",
        )
    return checks


def ask(config: HfAttnConfig, refusals: dict, attention_mask, position_ids, past_length, length: int) -> dict[str, int]:
    """Every question `forward` has about its inputs' values, asked on the device and read in one host sync. Under
    graph capture nothing is asked (an empty dict): the checks are skipped and the fast paths that need an answer
    are not taken."""
    if tracing():
        return {}
    questions = {f"refused {field}": refused.any() for field, (_, refused, _) in refusals.items()}
    if attention_mask is not None:
        questions["unpadded"] = attention_mask.all()
        positions, row_in_order = positions_and_order(attention_mask)
        questions["rows in order"] = row_in_order.all()
        if attention_mask.shape[-1] > config.n_positions:  # below, no position can be out of range
            shared = torch.arange(attention_mask.shape[-1], device=attention_mask.device)
            questions["largest position"] = torch.where(row_in_order, shared, positions).max()
    elif position_ids is None or not (isinstance(past_length, int) and past_length == 0):
        questions["largest position"] = past_length + length - 1  # keys sit at positions 0 .. past + T - 1
    if position_ids is not None:  # without a cache, the only positions: a packed row's restart
        questions["largest given position"] = position_ids.max()
        if attention_mask is None:
            questions["restarts"] = restarts_of(position_ids).any()
    tensors = {name: q for name, q in questions.items() if isinstance(q, torch.Tensor)}
    read = torch.stack([q.long() for q in tensors.values()]).tolist() if tensors else []  # the one sync
    known = {name: q for name, q in questions.items() if name not in tensors}
    return known | dict(zip(tensors, read, strict=True))


def raise_refused(refusals: dict, answers: dict[str, int]) -> None:
    for field, (values, refused, allowed) in refusals.items():
        if answers.get(f"refused {field}"):
            row, position = refused.nonzero()[0].tolist()
            raise ValueError(
                f"`{field}` must hold {allowed}; got {values[row, position].item()} at row {row}, position {position}."
            )


def check_positions(config: HfAttnConfig, answers: dict[str, int]) -> None:
    """Positions beyond the position tables are refused (eagerly; under graph capture the lookup fails instead)."""
    largest = max(answers.get("largest position", -1), answers.get("largest given position", -1))
    tabled = config.position_embedding_type in ("learned", "sinusoidal") or config.uses_positional_heads
    if tabled and largest >= config.n_positions:
        raise ValueError(
            f"Position {largest} is beyond `n_positions`={config.n_positions}, the longest the "
            f"position encodings support (`position_embedding_type`={config.position_embedding_type!r}"
            + (f", `positional_encoding`={config.positional_encoding!r}" if config.uses_positional_heads else "")
            + "). Use shorter sequences or a config with a larger `n_positions`."
        )
