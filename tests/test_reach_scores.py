"""`hf_attn.reach_scores` (kvpress's on-the-fly DuoAttention statistic) against the same statistic written here from
the weights, with the rotary embedding built from its formula; a head with zero queries scores what a uniform softmax
gives; families with query/key norms and per-layer rotary; refusals."""

import math
import re
from pathlib import Path

import pytest
import torch
from test_hybrid import VOCAB, tiny
from transformers import LlamaConfig, LlamaForCausalLM

from hf_attn.reach_scores import reach_scores
from hf_attn.select_heads import SCORES, main

SHARED = Path(__file__).parents[2] / "shared" / "data"
SCORING = dict(local_window=4, sink_tokens=0, batch_size=2)


def rotated(vector: torch.Tensor, length: int, theta: float) -> torch.Tensor:
    """(..., D) -> (..., length, D): `vector` at positions 0..length-1 under the rotary embedding (halves rotated)."""
    half = vector.shape[-1] // 2
    angles = torch.arange(length, dtype=torch.float64)[:, None] / theta ** (torch.arange(half) * 2 / (2 * half))
    first, second = vector[..., None, :half], vector[..., None, half:]
    return torch.cat([first * angles.cos() - second * angles.sin(), second * angles.cos() + first * angles.sin()], -1)


def naive_reach(model, ids: torch.Tensor, length: int) -> torch.Tensor:
    """(layers, H) per Llama layer and query head, averaged over the rows of `ids`: the mean over tokens of the
    projected query and key, each rotated to positions 0..length-1; softmax of the last query against every key over
    sqrt(D); the mean of its cumulative sum."""
    config = model.config
    heads, groups = config.num_attention_heads, config.num_key_value_heads
    size = config.hidden_size // heads
    theta = config.rope_parameters["rope_theta"]
    with torch.no_grad():
        inputs = model.model(ids, output_hidden_states=True).hidden_states
    areas = torch.zeros(config.num_hidden_layers, heads, dtype=torch.float64)
    for index, layer in enumerate(model.model.layers):
        normed = layer.input_layernorm(inputs[index]).double()  # (B, T, hidden)
        query = (normed @ layer.self_attn.q_proj.weight.double().T).view(len(ids), -1, heads, size).mean(1)
        key = (normed @ layer.self_attn.k_proj.weight.double().T).view(len(ids), -1, groups, size).mean(1)
        for row in range(len(ids)):
            for head in range(heads):
                last = rotated(query[row, head], length, theta)[-1]
                keys = rotated(key[row, head // (heads // groups)], length, theta)
                weights = torch.softmax(keys @ last / math.sqrt(size), dim=0)
                areas[index, head] += weights.cumsum(0).mean() / len(ids)
    return areas


def sharpened(model):
    """Queries and keys 40x larger than at initialization (std 0.02), so heads' weights are far from uniform."""
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight *= 40
            layer.self_attn.k_proj.weight *= 40
    return model


def test_reach_equals_the_statistic_written_from_the_weights():
    model = sharpened(tiny("llama"))
    ids = torch.randint(0, VOCAB, (3, 24), generator=torch.Generator().manual_seed(1))
    expected = naive_reach(model, ids, length=20)
    heads = reach_scores(model, ids, unit="head", length=20, **SCORING)
    torch.testing.assert_close(heads.double(), expected, rtol=1e-5, atol=1e-6)
    groups = reach_scores(model, ids, unit="kv_group", length=20, **SCORING)  # 8 heads over 2 groups: their mean
    torch.testing.assert_close(groups.double(), expected.view(2, 2, 4).mean(-1), rtol=1e-5, atol=1e-6)
    assert heads.std() > 0.01  # the heads differ: the comparison is not between constants


def test_a_head_without_queries_scores_a_uniform_softmax():
    """Zero queries weigh every key alike: the cumulated weights are (j + 1) / L, whose mean is (L + 1) / 2L."""
    model = sharpened(tiny("llama"))
    with torch.no_grad():
        model.model.layers[1].self_attn.q_proj.weight[8:16] = 0  # query head 1 of layer 1 (D = 8)
    ids = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(2))
    scores = reach_scores(model, ids, unit="head", length=30, **SCORING)
    assert scores[1, 1].item() == pytest.approx(31 / 60, abs=1e-6)
    assert (scores[1, [0, *range(2, 8)]] - 31 / 60).abs().min() > 1e-4


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text", "mistral", "qwen2"])
def test_every_rotary_family_scores_and_is_left_as_it_was(family):
    """Query/key norms (Qwen3, Gemma 3), a rotary embedding per layer type (Gemma 3): areas in (0, 1]; afterwards the
    model computes what it did (the attention function, hooks and state removed)."""
    model = sharpened(tiny(family))
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before = model(ids).logits
    scores = reach_scores(model, ids, unit="kv_group", length=16, **SCORING)
    assert scores.shape == (2, model.config.num_key_value_heads) and scores.isfinite().all()
    assert ((scores > 0) & (scores <= 1)).all()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before)
    assert not any(hasattr(module, "hf_attn_state") for module in model.modules())
    assert all(not module._forward_pre_hooks for module in model.modules())


@pytest.mark.parametrize(
    ("family", "length", "message"),
    [
        ("gpt2", 8, "The `reach` score needs rotary position embeddings; GPT2Attention has none"),
        ("llama", 25, "Calibration blocks must hold at least `length` (25) tokens, got blocks of 24 (--block_size)"),
        ("llama", 1, "`length` must be an int >= 2, got 1"),
    ],
)
def test_refusals_name_what_is_wrong(family, length, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        reach_scores(tiny(family), torch.zeros(2, 24, dtype=torch.long), unit="head", length=length, **SCORING)


def test_the_command_ranks_by_reach(tmp_path):
    """`select_heads --score reach`: one forward pass per batch, its length recorded among the score's settings."""
    assert "reach" in SCORES
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50257, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path / "model")
    record = main([str(tmp_path / "model"), "--local_fraction", "0.5", "--local_window", "4", "--score", "reach",
                   "--data", str(SHARED / "wikitext-2-raw" / "wiki.valid.raw"), "--tokenizer",
                   str(SHARED / "gpt2-tokenizer"), "--block_size", "500",
                   "--num_blocks", "2", "--batch_size", "1", "--output", str(tmp_path / "layout.json")])  # fmt: skip
    assert record["score_settings"] == {"length": 500}
    assert record["cost"]["forward_passes"] == 2 and record["cost"]["backward_passes"] == 0
    assert sum(layer.count("local") for layer in record["head_layout"]) == 4  # 2 of 4 groups, 2 heads each
