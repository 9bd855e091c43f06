"""The fast paths compute what the plain ones do: compiled kernels, bf16 autocast, reused positional weights,
and attention that torch.compile traces in one graph."""

import dataclasses

import pytest
import torch
from conftest import MODEL_TYPES, tiny_config
from transformers import AutoModelForCausalLM

from hf_attn import attention_hf_attn
from hf_attn.head_kinds_hf_attn import HEAD_KINDS
from hf_attn.layers_hf_attn import HfAttnAttention
from hf_attn.modeling_hf_attn import HfAttnModel
from hf_attn.positions_hf_attn import position_ids_from

LAYOUTS = {
    "global+local": ["global", "global", "local", "local"],
    "local": ["local"] * 4,
    "positional": ["positional"] * 4,
    "mixed": ["global", "local", "positional", "local"],
}


def model_with(layout: list[str], **overrides) -> AutoModelForCausalLM:
    config = tiny_config("hybrid_gpt2", head_layout=[layout, layout], **overrides)
    return AutoModelForCausalLM.from_config(config)


# --- torch.compile ---------------------------------------------------------------------------------------------


# Layouts with positional heads also under the fused route (`auto` takes shared weights at this shape).
COMPILED_CASES = [
    (layout, impl) for layout, heads in LAYOUTS.items() for impl in ("auto", "fused")[: 1 + ("positional" in heads)]
]


@pytest.mark.parametrize("layout,positional_impl", COMPILED_CASES)
@pytest.mark.parametrize("local_window", [1, 16])  # the offsets kernel and the chunked one
@pytest.mark.parametrize("padded", [False, True])
def test_attention_compiles_into_one_graph(layout, positional_impl, local_window, padded):
    config = tiny_config("hybrid_gpt2", head_layout=[LAYOUTS[layout]], n_layer=1, local_window=local_window,
                         positional_attention_impl=positional_impl)  # fmt: skip
    trunk = HfAttnModel(config)
    length = 40
    mask = torch.ones(2, length, dtype=torch.long)
    if padded:
        mask[0, :5] = 0
    positions, in_order = position_ids_from(mask, 0, length, "cpu")
    inputs = trunk.attention_inputs(mask, positions[:, -length:], positions, in_order)
    hidden = torch.randn(2, length, 32, requires_grad=True)
    torch._dynamo.reset()  # each case is a new module: without a reset they pile up to the recompile limit
    compiled = torch.compile(trunk.h[0].attn, backend="eager", fullgraph=True)  # raises on any graph break
    out = compiled(hidden, inputs)[0]
    torch.testing.assert_close(out, trunk.h[0].attn(hidden, inputs)[0])
    out.sum().backward()
    assert torch.isfinite(hidden.grad).all()


@pytest.fixture
def compile_calls(monkeypatch):
    """Counts the calls that reach the compiled local kernel (the kernel itself runs eagerly)."""
    calls = []

    def compiled(*args, **kwargs):
        calls.append(args[0].shape)
        return attention_hf_attn.local_attention(*args, **kwargs)

    monkeypatch.setattr(attention_hf_attn, "_compiled_local_attention", lambda: compiled)
    return calls


def test_compiled_kernel_only_when_requested(compile_calls):
    input_ids = torch.randint(3, 37, (2, 12))
    model_with(LAYOUTS["global+local"])(input_ids)
    assert compile_calls == []
    model_with(LAYOUTS["global+local"], local_attention_impl="compiled")(input_ids)
    assert len(compile_calls) == 2  # one per layer


def test_compiled_kernel_not_for_attention_weights_or_decoding(compile_calls):
    model = model_with(LAYOUTS["global+local"], local_attention_impl="compiled").eval()
    input_ids = torch.randint(3, 37, (1, 12))
    model(input_ids, output_attentions=True)
    assert compile_calls == []  # weights come from the offsets kernel
    model.generate(input_ids, max_new_tokens=4, do_sample=False, pad_token_id=2)
    assert [shape[-2] for shape in compile_calls] == [12, 12]  # the prefill only, in both layers


def test_compiled_model_matches_eager():
    """A real torch.compile of the local kernel: same loss and gradients as the eager kernel."""
    input_ids = torch.randint(3, 37, (2, 24))
    results = {}
    for impl in ("banded", "compiled"):
        torch.manual_seed(0)
        model = model_with(LAYOUTS["mixed"], local_attention_impl=impl)
        loss = model(input_ids, labels=input_ids).loss
        loss.backward()
        results[impl] = loss, [p.grad for p in model.parameters()]
    torch.testing.assert_close(results["compiled"][0], results["banded"][0])
    for compiled, eager in zip(results["compiled"][1], results["banded"][1], strict=True):
        torch.testing.assert_close(compiled, eager, atol=1e-6, rtol=1e-5)


# --- bf16 autocast ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_bf16_autocast_close_to_fp32(model_type):
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, position_embedding_type="rope"))
    input_ids = torch.randint(3, 37, (2, 20))
    loss = model(input_ids, labels=input_ids).loss
    expected = torch.autograd.grad(loss, list(model.parameters()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids, labels=input_ids)
    grads = torch.autograd.grad(out.loss, list(model.parameters()))
    assert out.logits.dtype == torch.bfloat16
    torch.testing.assert_close(out.loss.float(), loss, atol=0.02, rtol=0.01)
    flat, flat_expected = torch.cat([g.flatten() for g in grads]), torch.cat([g.flatten() for g in expected])
    assert torch.isfinite(flat).all()
    assert torch.nn.functional.cosine_similarity(flat.float(), flat_expected, dim=0) > 0.99


# --- positional weights reused at inference --------------------------------------------------------------------


@pytest.fixture
def weight_computations(monkeypatch):
    """Counts how often positional heads project P (to form their weights or run the fused route)."""
    calls = []
    compute = HfAttnAttention.positional_projection

    def counted(self, *args, **kwargs):
        calls.append(self.layer_idx)
        return compute(self, *args, **kwargs)

    monkeypatch.setattr(HfAttnAttention, "positional_projection", counted)
    return calls


def test_positional_weights_kept_once_the_same_positions_come_twice(weight_computations):
    model = AutoModelForCausalLM.from_config(tiny_config("positional_gpt2")).eval()
    batches = [torch.randint(3, 37, (3, 10)) for _ in range(4)]
    with torch.no_grad():
        logits = [model(batch).logits for batch in batches]
    # The first batch by the route its shape prefers, the second forms the weights and keeps them, the rest reuse them.
    assert weight_computations == [0, 1, 0, 1]
    fresh = AutoModelForCausalLM.from_config(model.config).eval()
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        for batch, got in zip(batches, logits, strict=True):
            torch.testing.assert_close(got, fresh(batch).logits)


@pytest.mark.parametrize(
    "edit",
    [
        lambda weight: weight.add_(0.5),  # in place, as optimizers and load_state_dict do
        lambda weight: weight.data.add_(0.5),  # through `.data`: the version counter does not move
    ],
    ids=["in_place", "through_data"],
)
def test_positional_weights_recomputed_when_parameters_change(weight_computations, edit):
    model = AutoModelForCausalLM.from_config(tiny_config("positional_gpt2")).eval()
    input_ids = torch.randint(3, 37, (2, 10))
    with torch.no_grad():
        model(input_ids)
        before = model(input_ids).logits  # the weights are kept from here on
        weight_computations.clear()
        edit(model.transformer.h[0].attn.p_attn.weight)
        after = model(input_ids).logits
    assert weight_computations == [0]  # only layer 0 changed
    assert not torch.allclose(before, after)
    fresh = AutoModelForCausalLM.from_config(model.config).eval()
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(after, fresh(input_ids).logits)


def test_positional_weights_not_reused_in_training_or_with_padding(weight_computations):
    model = AutoModelForCausalLM.from_config(tiny_config("positional_gpt2"))
    input_ids = torch.randint(3, 37, (2, 10))
    for _ in range(3):  # gradients recorded: always recomputed, so they reach p_attn
        model(input_ids, labels=input_ids).loss.backward()
    assert model.transformer.h[0].attn.p_attn.weight.grad is not None
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[0, :3] = 0
    with torch.no_grad():
        for _ in range(3):
            model(input_ids, attention_mask=mask)
    assert weight_computations == [0, 1] * 6


def test_a_one_off_inference_forward_takes_the_route_its_shape_prefers(monkeypatch):
    """A prompt of 300 tokens, batch 1: fused (no T x T weights) the first time; the weights are formed and kept
    when the same positions come again, and reused after that."""
    formed = []
    kind = HEAD_KINDS["positional"]

    def forming(*args, **kwargs):
        formed.append(args[0].shape[-2])
        return kind.kernel_with_weights(*args, **kwargs)

    monkeypatch.setitem(HEAD_KINDS, "positional", dataclasses.replace(kind, kernel_with_weights=forming))
    model = AutoModelForCausalLM.from_config(tiny_config("positional_gpt2", n_positions=300)).eval()
    prompt = torch.randint(3, 37, (1, 300))
    with torch.no_grad():
        first = model(prompt).logits
        assert formed == []
        second = model(prompt).logits
        assert formed == [300] * model.config.n_layer
        third = model(prompt).logits
        assert formed == [300] * model.config.n_layer
    torch.testing.assert_close(second, first, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(third, first, atol=1e-5, rtol=1e-5)


# --- the routes of positional heads ----------------------------------------------------------------------------


@pytest.mark.parametrize("is_causal,attend_to_self", [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("padded", [False, True])
def test_positional_routes_train_the_same_model(is_causal, attend_to_self, padded):
    """A whole positional model under the fused route: the logits and every parameter's gradient of the shared-weights
    route, left padding (positions per sample) included."""
    masks = dict(is_causal=is_causal, attend_to_self=attend_to_self)
    shared, fused = (
        AutoModelForCausalLM.from_config(tiny_config("positional_gpt2", **masks, positional_attention_impl=impl))
        for impl in ("shared_weights", "fused")
    )
    fused.load_state_dict(shared.state_dict())
    input_ids = torch.randint(3, 37, (3, 12))
    mask = torch.ones_like(input_ids)
    if padded:
        mask[0, :4] = 0
    outputs = [model(input_ids, attention_mask=mask, labels=input_ids) for model in (shared, fused)]
    keep = mask.bool()
    torch.testing.assert_close(outputs[1].logits[keep], outputs[0].logits[keep], atol=1e-5, rtol=1e-5)
    for output in outputs:
        output.loss.backward()
    for (name, expected), actual in zip(shared.named_parameters(), fused.parameters(), strict=True):
        torch.testing.assert_close(actual.grad, expected.grad, atol=1e-5, rtol=1e-4, msg=name)
