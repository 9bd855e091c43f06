"""The table of head kinds is what the configuration, the layer, the cache and the model cards use, and each entry
computes what its kind means, checked against the position-by-position reference in tests/naive.py."""

import dataclasses

import pytest
import torch
from conftest import tiny_config
from naive import naive_attention
from transformers import AutoModelForCausalLM

import hf_attn.hub
from benchmarks.common import masked_local_attention
from hf_attn import attention_hf_attn
from hf_attn.head_kinds_hf_attn import HEAD_KINDS

# Each kind as the papers define it, written independently of the table: the config field bounding what a query sees
# (None: every visible position), whether its scores come from the content, and what decoding must keep.
SPEC = {
    "global": dict(window=None, content=True, cached={"keys", "values"}),
    "local": dict(window="local_window", content=True, cached={"keys", "values"}),
    "positional": dict(window=None, content=False, cached={"values"}),
}
MASKS = [(True, False), (True, True), (False, False), (False, True)]  # (is_causal, attend_to_self)


def test_the_table_holds_the_specified_kinds():
    assert list(HEAD_KINDS) == list(SPEC)
    for name, kind in HEAD_KINDS.items():
        assert (kind.name, kind.content, set(kind.cached)) == (name, SPEC[name]["content"], SPEC[name]["cached"])


def kernel_configs(name: str, **overrides) -> list:
    """A config per kernel the kind can be run with (one per value of its `kernel_field`)."""
    kind = HEAD_KINDS[name]
    choices = [{kind.kernel_field: choice} for choice in kind.kernels] if kind.kernel_field else [{}]
    return [tiny_config("hybrid_gpt2", **overrides, **choice) for choice in choices]


def assert_close_to(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Float32 kernels against the float64 reference, as in tests/test_attention.py."""
    torch.testing.assert_close(actual.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", SPEC)
@pytest.mark.parametrize("is_causal,attend_to_self", MASKS)
@pytest.mark.parametrize("padded", [False, True])
def test_each_kinds_kernels_match_the_naive_reference(name, is_causal, attend_to_self, padded, monkeypatch):
    # The compiled local kernel runs eagerly here: tests/test_fast_paths.py checks compiling changes nothing.
    monkeypatch.setattr(attention_hf_attn, "_compiled_local_attention", lambda: attention_hf_attn.local_attention)
    batch, heads, length, dim = 2, 3, 9, 8
    key_mask = torch.ones(batch, length, dtype=torch.bool)
    key_mask[0, :3] = False
    key_mask = key_mask if padded else None
    q, k, v = (torch.randn(batch, heads, length, dim) for _ in range(3))
    kind = HEAD_KINDS[name]
    for config in kernel_configs(name, is_causal=is_causal, attend_to_self=attend_to_self, local_window=2):
        window = getattr(config, SPEC[name]["window"]) if SPEC[name]["window"] else None
        visibility = kind.visibility(config)
        if not kind.content:  # queries and keys from P's projections (here those of sample 0), shared by the batch
            q, k = q[:1], k[:1]
        expected, expected_weights = naive_attention(
            q.expand_as(v), k.expand_as(v), v, is_causal, attend_to_self, window, key_mask
        )
        assert_close_to(kind.kernel(config)(q, k, v, visibility, key_mask, dim**-0.5), expected)
        out, weights = kind.kernel_with_weights(q, k, v, visibility, key_mask, dim**-0.5)
        assert_close_to(out, expected)
        assert_close_to(weights.expand_as(expected_weights), expected_weights)


@pytest.mark.parametrize("name", SPEC)
def test_the_layer_runs_each_kinds_heads_through_its_table_entry(name, monkeypatch):
    calls = []

    def recorded(kernel):
        def run(*args, **kwargs):
            calls.append(args)
            return kernel(*args, **kwargs)

        return run

    kind = HEAD_KINDS[name]
    spied = {choice: recorded(kernel) for choice, kernel in kind.kernels.items()}
    monkeypatch.setitem(HEAD_KINDS, name, dataclasses.replace(kind, kernels=spied))
    layout = ["local", name, "positional", "global"]
    config = tiny_config("hybrid_gpt2", head_layout=[layout, layout])
    # gradients recorded: positional heads' inference shortcut (weights kept for the next batch) is off
    AutoModelForCausalLM.from_config(config).eval()(torch.randint(3, 37, (2, 7)))
    assert len(calls) == config.n_layer  # one call per layer, for all of the kind's heads
    for q, k, v, visibility, *_ in calls:
        assert q.shape[1] == k.shape[1] == v.shape[1] == layout.count(name)
        assert visibility == kind.visibility(config)


@pytest.mark.parametrize("name", SPEC)
def test_the_cache_keeps_what_each_kind_declares(name):
    config = tiny_config("hybrid_gpt2", head_layout=[[name] * 4] * 2, local_window=3)
    model = AutoModelForCausalLM.from_config(config).eval()
    input_ids = torch.randint(3, 37, (2, 10))
    with torch.no_grad():
        cached = model(input_ids, use_cache=True).cache.layers[0].tensors()
        # What layer 0 projects: c_attn is [queries | keys | values] of its heads (keys and queries of content heads).
        trunk, block = model.transformer, model.transformer.h[0]
        projected = block.attn.c_attn(block.ln_1(trunk.wte(input_ids) + trunk.wpe(torch.arange(10))))
    width = 4 * config.content_qk_dim if SPEC[name]["content"] else 0
    keys = projected[..., width : 2 * width].view(2, 10, -1, config.content_qk_dim).transpose(1, 2)
    values = projected[..., 2 * width :].view(2, 10, 4, -1).transpose(1, 2)
    kept = getattr(config, SPEC[name]["window"]) if SPEC[name]["window"] else 10
    expected = {"keys": keys[:, :, -kept:], "values": values[:, :, -kept:]}
    assert set(cached) == {f"{name}_{what}" for what in SPEC[name]["cached"]}
    for what in SPEC[name]["cached"]:
        torch.testing.assert_close(cached[f"{name}_{what}"], expected[what], rtol=0, atol=0)


def test_a_fourth_kind_is_one_table_entry(monkeypatch):
    """A new entry is accepted by the configuration, run by the layer, cached and described, with nothing else
    changed: here global attention through a full mask, which must compute what the global heads do."""
    global_kind = HEAD_KINDS["global"]
    masked = dataclasses.replace(
        global_kind, name="masked_global", kernels={"masked": masked_local_attention}, kernel_field=None
    )  # one kernel: nothing to choose
    monkeypatch.setitem(HEAD_KINDS, "masked_global", masked)
    layout = ["global", "masked_global", "local", "positional"]
    model = AutoModelForCausalLM.from_config(tiny_config("hybrid_gpt2", head_layout=[layout, layout])).eval()
    reference_layout = ["global", "global", "local", "positional"]
    reference = AutoModelForCausalLM.from_config(tiny_config("hybrid_gpt2", head_layout=[reference_layout] * 2))
    reference.load_state_dict(model.state_dict())
    input_ids = torch.randint(3, 37, (2, 12))
    with torch.no_grad():
        outputs = model(input_ids, use_cache=True)
        torch.testing.assert_close(outputs.logits, reference.eval()(input_ids).logits)
    assert {"masked_global_keys", "masked_global_values"} <= set(outputs.cache.layers[0].tensors())
    section = hf_attn.hub.head_layout_section(model.config)
    assert "- **masked_global** heads: each query attends by content to every earlier position." in section
    assert "| layers | global heads | local heads | positional heads | masked_global heads |" in section
