"""Masks as transformers models take them: custom 4D masks, padding-free packed rows, and outputs of one row that never
depend on the rest of the batch (transformers' batching equivalence), for every head kind."""

import pytest
import torch
from conftest import MODEL_TYPES, tiny_config
from test_convert_gpt2 import GPT2_FIELDS
from transformers import AutoModel, AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from hf_attn import convert_gpt2

MIXED = [["global", "local", "positional", "positional"], ["positional", "global", "local", "global"]]
VARIANTS = {
    **{model_type: (model_type, {}) for model_type in MODEL_TYPES},
    "mixed": ("hybrid_gpt2", {"head_layout": MIXED}),
    "rope_inclusive": (
        "hybrid_gpt2",
        {"head_layout": MIXED, "position_embedding_type": "rope", "attend_to_self": True},
    ),
}


def model_of(variant: str, auto=AutoModelForCausalLM):
    model_type, overrides = VARIANTS[variant]
    return auto.from_config(tiny_config(model_type, initializer_range=0.3, **overrides)).eval()


def shared_prefix_batch():
    """transformers' custom-4D-mask case: three sequences sharing a 3-token prefix, and the same packed into one row
    of 6 tokens whose last three do not see each other, with positions 0, 1, 2, 3, 3, 3."""
    prefix, ends = torch.randint(3, 37, (3,)), torch.randint(3, 37, (3,))
    separate = torch.stack([torch.cat([prefix, end[None]]) for end in ends])  # (3, 4)
    packed = torch.cat([prefix, ends])[None]  # (1, 6)
    visible = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    visible[3:, 3:] = torch.eye(3, dtype=torch.bool)
    return separate, packed, visible[None, None], torch.tensor([[0, 1, 2, 3, 3, 3]])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mask_type", ["bool", "additive_float"])
def test_custom_4d_mask_gives_the_logits_of_separate_sequences(variant, mask_type):
    model = model_of(variant)
    separate, packed, visible, positions = shared_prefix_batch()
    mask = visible if mask_type == "bool" else (~visible).float() * torch.finfo(torch.float32).min
    with torch.no_grad():
        expected = model(separate).logits[:, -1]  # (3, V)
        got = model(packed, attention_mask=mask, position_ids=positions).logits[0, 3:]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_custom_4d_mask_gives_gpt2s_logits():
    gpt2 = GPT2LMHeadModel(GPT2Config(**GPT2_FIELDS)).eval()
    model = convert_gpt2(gpt2, "hybrid_gpt2", num_local_heads=0, attend_to_self=True)
    _, packed, visible, positions = shared_prefix_batch()
    mask = (~visible).float() * torch.finfo(torch.float32).min
    with torch.no_grad():
        expected = gpt2(packed, attention_mask=mask, position_ids=positions).logits
        got = model(packed, attention_mask=mask, position_ids=positions).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_packed_documents_attend_only_within_themselves(variant):
    """TRL's `padding_free=True`: documents packed in one row, positions restarting at each. Every head kind, local
    ones included, must give each document what it gives alone."""
    model = model_of(variant)
    documents = [torch.randint(3, 37, (n,)) for n in (5, 2, 7)]
    packed = torch.cat(documents)[None]
    positions = torch.cat([torch.arange(len(d)) for d in documents])[None]
    with torch.no_grad():
        got = model(packed, position_ids=positions).logits[0].split([len(d) for d in documents])
        for document, logits in zip(documents, got, strict=True):
            torch.testing.assert_close(logits, model(document[None]).logits[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", [*VARIANTS, "sinks"])
def test_a_padded_batch_gives_its_packed_row_the_same_logits_though_longer_than_n_positions(variant):
    """transformers' padding-free property (TRL's `padding_free=True`, `DataCollatorWithFlattening`): the real tokens of
    a padded batch, packed into one row of 60 tokens with positions restarting at each document and no mask, get the
    padded batch's logits, though the row is longer than `n_positions` (24): only each document must fit."""
    model_type, overrides = VARIANTS.get(variant, ("local_gpt2", {"sink_tokens": 2}))
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, initializer_range=0.3, n_positions=24,
                                                         **overrides)).eval()  # fmt: skip
    lengths = [20, 9, 17, 14]
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    input_ids = torch.randint(3, 37, mask.shape)
    packed = input_ids[mask.bool()][None]
    positions = torch.cat([torch.arange(length) for length in lengths])[None]
    assert packed.shape[1] == 60 > model.config.n_positions
    with torch.no_grad():
        padded = model(input_ids, attention_mask=mask).logits[mask.bool()]
        got = model(packed, position_ids=positions).logits[0]
    torch.testing.assert_close(got, padded, atol=1e-5, rtol=1e-5)


def random_attention_mask(batch: int, length: int) -> torch.Tensor:
    """As transformers' model tests draw them: random 0/1 with the first column kept, so holes lie anywhere."""
    mask = torch.randint(0, 2, (batch, length))
    mask[:, 0] = 1
    return mask


def trailing_padding_beside_left_padding() -> torch.Tensor:
    """Row 0 padded at its end while another row is padded at its start: the case that used to differ."""
    mask = torch.ones(14, 7, dtype=torch.long)
    mask[0, 3:] = 0
    mask[1, :2] = 0
    return mask


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("auto", [AutoModel, AutoModelForCausalLM], ids=["base", "lm_head"])
def test_a_row_gives_the_same_outputs_alone_and_in_a_batch(variant, auto):
    """Every output, every position, padding's included, within 1e-5."""
    model = model_of(variant, auto)
    for mask in [trailing_padding_beside_left_padding(), *(random_attention_mask(14, 7) for _ in range(4))]:
        input_ids = torch.randint(3, 37, mask.shape)
        with torch.no_grad():
            batch = model(input_ids, attention_mask=mask, output_hidden_states=True)
            alone = model(input_ids[:1], attention_mask=mask[:1], output_hidden_states=True)
        for name in ("logits", "last_hidden_state"):
            if name in batch:
                torch.testing.assert_close(batch[name][:1], alone[name], atol=1e-5, rtol=1e-5)
        for batched, single in zip(batch.hidden_states, alone.hidden_states, strict=True):
            torch.testing.assert_close(batched[:1], single, atol=1e-5, rtol=1e-5)
