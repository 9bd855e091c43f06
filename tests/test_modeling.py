"""Whole models: GPT-2 equivalence, receptive fields, positional weights, output_attentions, dtypes, bad inputs."""

import re

import pytest
import torch
from conftest import MODEL_TYPES, tiny_config
from naive import naive_attention
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel


def gpt2_and_ours():
    fields = dict(
        n_layer=2, n_head=4, n_embd=32, vocab_size=37, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    gpt2 = GPT2LMHeadModel(GPT2Config(**fields)).eval()
    ours = AutoModelForCausalLM.from_config(
        tiny_config("hybrid_gpt2", num_local_heads=0, attend_to_self=True, position_embedding_type="learned", **fields)
    ).eval()
    missing, unexpected = ours.load_state_dict(gpt2.state_dict(), strict=True)
    assert not missing and not unexpected
    return gpt2, ours


def test_global_layout_reproduces_gpt2_logits():
    gpt2, ours = gpt2_and_ours()
    input_ids = torch.randint(0, 37, (3, 20))
    with torch.no_grad():
        expected = gpt2(input_ids).logits
        torch.testing.assert_close(ours(input_ids).logits, expected, atol=1e-6, rtol=1e-6)


def test_global_layout_reproduces_gpt2_with_left_padding():
    """GPT-2 given the positions `generate` uses (counted over real tokens) == ours, which derives them."""
    gpt2, ours = gpt2_and_ours()
    input_ids = torch.randint(0, 37, (2, 12))
    attention_mask = torch.ones(2, 12, dtype=torch.long)
    attention_mask[0, :5] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        expected = gpt2(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        got = ours(input_ids, attention_mask=attention_mask).logits
    real = attention_mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)


def dependence_on_inputs(model, length: int, position: int) -> torch.Tensor:
    """(length,) bool: which input embeddings the output at `position` has a nonzero gradient for."""
    embeds = torch.randn(1, length, model.config.n_embd, dtype=torch.float64, requires_grad=True)
    out = model(inputs_embeds=embeds).last_hidden_state
    probe = torch.randn_like(out[0, position])  # not .sum(): a LayerNorm output sums to a constant
    (grad,) = torch.autograd.grad((out[0, position] * probe).sum(), embeds)
    return grad[0].abs().sum(-1) > 0


@pytest.mark.parametrize("num_layers,local_window", [(1, 1), (2, 3), (3, 2)])
def test_local_receptive_field_is_layers_times_window(num_layers, local_window):
    from transformers import AutoModel

    config = tiny_config("local_gpt2", n_layer=num_layers, local_window=local_window, position_embedding_type="none")
    model = AutoModel.from_config(config).double()
    length, position = 24, 20
    depends = dependence_on_inputs(model, length, position)
    reach = position - num_layers * local_window
    expected = torch.tensor([reach <= j <= position for j in range(length)])
    assert torch.equal(depends, expected), f"depends on {depends.nonzero().flatten().tolist()}"


@pytest.mark.parametrize("model_type,overrides", [("hybrid_gpt2", {}), ("hybrid_gpt2", {"num_local_heads": 0})])
def test_hybrid_and_global_reach_token_zero(model_type, overrides):
    from transformers import AutoModel

    model = AutoModel.from_config(tiny_config(model_type, local_window=1, **overrides)).double()
    assert dependence_on_inputs(model, 24, 23).all()


def test_positional_weights_identical_for_different_inputs():
    model = AutoModelForCausalLM.from_config(tiny_config("positional_gpt2")).eval()
    first = model(torch.randint(0, 37, (2, 10)), output_attentions=True).attentions
    second = model(torch.randint(0, 37, (3, 10)), output_attentions=True).attentions
    for layer_first, layer_second in zip(first, second, strict=True):
        assert torch.equal(layer_first[0], layer_first[1])
        assert torch.equal(layer_first[0], layer_second[2])
        assert not torch.allclose(layer_first[0, 0, 5, :6], torch.full((6,), 1 / 6)), "weights were learned from P"


def test_positional_weights_match_reference_from_onehot_p():
    """softmax((P Wq)(P Wk)^T / sqrt(d)) with P = eye(n_positions), Paper A, computed here from the parameters."""
    config = tiny_config("positional_gpt2", is_causal=False, n_positions=10)
    model = AutoModelForCausalLM.from_config(config).eval()
    attentions = model(torch.randint(0, 37, (1, 10)), output_attentions=True).attentions
    p = torch.eye(10)
    for layer, weights in zip(model.transformer.h, attentions, strict=True):
        projected = p @ layer.attn.p_attn.weight + layer.attn.p_attn.bias  # (10, 2 * H * qk)
        pq, pk = projected.view(10, 2, 4, -1).permute(1, 2, 0, 3)  # (H, 10, qk) each
        expected = torch.softmax(pq @ pk.transpose(-1, -2) / pq.shape[-1] ** 0.5, dim=-1)
        torch.testing.assert_close(weights[0], expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    "layout", [["global", "local", "positional", "local"], ["local", "global", "global", "positional"]]
)
@pytest.mark.parametrize("attend_to_self", [False, True])
@pytest.mark.parametrize("qk_dim", [8, 12])  # 8: n_embd / n_head, GPT-2's
def test_output_attentions_are_the_real_weights_in_layout_order(layout, attend_to_self, qk_dim):
    """Mixed layouts: each head's returned weights equal the reference recomputed from the layer's parameters."""
    config = tiny_config(
        "hybrid_gpt2", head_layout=[layout, layout], attend_to_self=attend_to_self, local_window=2,
        content_qk_dim=qk_dim,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config).eval()
    captured = {}
    model.transformer.h[1].attn.register_forward_pre_hook(lambda module, args: captured.update(x=args[0]))
    input_ids = torch.randint(0, 37, (2, 11))
    attention_mask = torch.ones(2, 11, dtype=torch.long)
    attention_mask[1, :3] = 0
    outputs = model(input_ids, attention_mask=attention_mask, output_attentions=True)
    torch.testing.assert_close(
        outputs.logits, model(input_ids, attention_mask=attention_mask).logits, atol=1e-5, rtol=1e-5
    )

    attn, weights = model.transformer.h[1].attn, outputs.attentions[1]
    content = [h for h, kind in enumerate(layout) if kind != "positional"]
    width = len(content) * qk_dim  # c_attn: [queries of content heads | their keys | values of all heads]
    projected = attn.c_attn(captured["x"])
    q = projected[..., :width].view(2, 11, -1, qk_dim).transpose(1, 2)
    k = projected[..., width : 2 * width].view(2, 11, -1, qk_dim).transpose(1, 2)
    for i, head in enumerate(content):
        window = 2 if layout[head] == "local" else None
        _, expected = naive_attention(
            q[:, i : i + 1], k[:, i : i + 1], k[:, i : i + 1], True, attend_to_self, window, attention_mask.bool()
        )
        torch.testing.assert_close(weights[:, head].double(), expected[:, 0], atol=1e-5, rtol=1e-5)
    positional = layout.index("positional")
    row_sums = weights[:, positional].sum(-1)
    assert torch.allclose(row_sums[row_sums > 0], torch.ones(()), atol=1e-5)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("attend_to_self", [False, True])
@pytest.mark.parametrize("is_causal", [True, False])
def test_one_head_models_run_batches_as_each_sample_alone(model_type, attend_to_self, is_causal):
    """A single head's output can come out of its kernel as a strided view (a positional head's broadcast matmul
    did): the output projection must still take it, and each sample's logits must not depend on the others."""
    config = tiny_config(model_type, n_head=1, n_embd=16, attend_to_self=attend_to_self, is_causal=is_causal)
    model = AutoModelForCausalLM.from_config(config).eval()
    input_ids = torch.randint(0, 37, (3, 9))
    with torch.no_grad():
        batched = model(input_ids).logits
        alone = torch.cat([model(row[None]).logits for row in input_ids])
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_nan_with_strict_masks_and_padding(model_type, dtype):
    config = tiny_config(model_type, attend_to_self=False, position_embedding_type="rope")
    model = AutoModelForCausalLM.from_config(config).to(dtype)
    input_ids = torch.randint(0, 37, (3, 9))
    attention_mask = torch.ones(3, 9, dtype=torch.long)
    attention_mask[0, :4] = 0
    attention_mask[1, -2:] = 0
    out = model(input_ids, attention_mask=attention_mask, labels=input_ids)
    out.loss.backward()
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("position_embedding_type", ["learned", "sinusoidal", "rope", "none"])
@pytest.mark.parametrize("block_style", ["gpt2", "post_ln", "concat_mlp", "no_layernorm"])
def test_padding_does_not_change_real_positions(model_type, position_embedding_type, block_style):
    """A left-padded sample gives the logits it gives alone: positions count real tokens, padding is never seen."""
    config = tiny_config(model_type, position_embedding_type=position_embedding_type, block_style=block_style)
    model = AutoModelForCausalLM.from_config(config).eval()
    alone = torch.randint(3, 37, (1, 7))
    padded = torch.cat([torch.full((1, 4), 2), alone], dim=1)
    mask = torch.tensor([[0] * 4 + [1] * 7])
    with torch.no_grad():
        expected = model(alone).logits
        got = model(padded, attention_mask=mask).logits[:, 4:]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_no_layernorm_block_is_gpt2s_block_with_its_layernorms_removed_by_hand(model_type):
    """Paper A's induction code: minGPT whose `ln_1`, `ln_2` and `ln_f` are identities. The reference is our GPT-2
    block style with those modules swapped for `nn.Identity` by hand, the same weights loaded."""
    by_hand = AutoModelForCausalLM.from_config(tiny_config(model_type, block_style="gpt2")).eval()
    for block in by_hand.transformer.h:
        block.ln_1, block.ln_2 = torch.nn.Identity(), torch.nn.Identity()
    by_hand.transformer.ln_f = torch.nn.Identity()
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, block_style="no_layernorm")).eval()
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())
    model.load_state_dict(by_hand.state_dict(), strict=True)  # the same parameters, none of them a LayerNorm's
    input_ids = torch.randint(3, 37, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids).logits, by_hand(input_ids).logits, atol=0, rtol=0)


def test_sequence_longer_than_positions_is_refused():
    model = AutoModelForCausalLM.from_config(tiny_config("positional_gpt2", n_positions=8))
    with pytest.raises(ValueError, match="n_positions"):
        model(torch.randint(0, 37, (1, 9)))


def refused_before_any_computation(model, match: str, **inputs) -> None:
    """`model(**inputs)` raises a ValueError matching `match` before the embeddings are even looked up."""
    looked_up = []
    hook = model.transformer.wte.register_forward_hook(lambda *args: looked_up.append(args))
    with pytest.raises(ValueError, match=match):
        model(**inputs)
    hook.remove()
    assert not looked_up


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("bad", [2, -1, 0.5])
def test_attention_mask_other_than_0_and_1_is_refused(model_type, bad):
    model = AutoModelForCausalLM.from_config(tiny_config(model_type))
    attention_mask = torch.ones(2, 6)
    attention_mask[1, 2] = bad
    message = f"`attention_mask` must hold only 0 (padding) and 1 (token); got {float(bad)} at row 1, position 2"
    match = re.escape(message)
    refused_before_any_computation(model, match, input_ids=torch.randint(3, 37, (2, 6)), attention_mask=attention_mask)


def test_attention_mask_may_be_bool_int_or_float():
    model = AutoModelForCausalLM.from_config(tiny_config("hybrid_gpt2")).eval()
    input_ids = torch.randint(3, 37, (2, 6))
    attention_mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6])
    with torch.no_grad():
        expected = model(input_ids, attention_mask=attention_mask).logits
        for dtype in (torch.bool, torch.float32):
            torch.testing.assert_close(model(input_ids, attention_mask=attention_mask.to(dtype)).logits, expected)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("bad_id", [-1, 37])
def test_token_ids_outside_the_vocabulary_are_refused(model_type, bad_id):
    model = AutoModelForCausalLM.from_config(tiny_config(model_type))
    input_ids = torch.randint(3, 37, (2, 6))
    input_ids[0, 4] = bad_id
    match = re.escape(f"`input_ids` must hold token ids in [0, 37) (`vocab_size`); got {bad_id} at row 0, position 4")
    refused_before_any_computation(model, match, input_ids=input_ids)


@pytest.mark.parametrize(
    "inputs",
    [
        {"input_ids": torch.zeros(0, 5, dtype=torch.long)},  # empty batch
        {"input_ids": torch.zeros(2, 0, dtype=torch.long)},  # zero-length sequences
        {"input_ids": torch.zeros(5, dtype=torch.long)},  # no batch dimension
        {"inputs_embeds": torch.zeros(0, 5, 32)},
        {"inputs_embeds": torch.zeros(2, 0, 32)},
    ],
    ids=["empty_batch", "zero_length", "one_dim", "empty_batch_embeds", "zero_length_embeds"],
)
def test_empty_or_misshapen_inputs_are_refused(inputs):
    model = AutoModelForCausalLM.from_config(tiny_config("local_gpt2"))
    name = next(iter(inputs))
    refused_before_any_computation(model, f"`{name}` must be .* at least one sequence of at least one token", **inputs)


def test_positions_are_one_row_for_the_batch_unless_left_padded():
    """Right padding only masks keys, so positional heads keep one weight tensor for the whole batch."""
    from hf_attn.positions_hf_attn import position_ids_from

    right = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    left = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    positions, in_order = position_ids_from(right, 0, 4, "cpu")
    assert positions.tolist() == [[0, 1, 2, 3]] and in_order
    positions, in_order = position_ids_from(left, 0, 4, "cpu")
    assert positions.tolist() == [[0, 1, 2, 3], [0, 0, 0, 1]] and not in_order
    positions, in_order = position_ids_from(left[1:], 0, 4, "cpu")  # one left-padded row: not in order
    assert positions.tolist() == [[0, 0, 0, 1]] and not in_order


def test_scale_embedding_multiplies_token_embeddings_by_the_square_root_of_the_width():
    """Vaswani et al.'s scale: the scaled model on token ids is the unscaled one on embeddings x sqrt(n_embd)."""
    fields = dict(position_embedding_type="sinusoidal")
    scaled = AutoModelForCausalLM.from_config(tiny_config("hybrid_gpt2", **fields, scale_embedding=True)).eval()
    plain = AutoModelForCausalLM.from_config(tiny_config("hybrid_gpt2", **fields, scale_embedding=False)).eval()
    plain.load_state_dict(scaled.state_dict())
    input_ids = torch.randint(3, 37, (2, 9))
    embeds = plain.transformer.wte(input_ids) * plain.config.n_embd**0.5
    with torch.no_grad():
        torch.testing.assert_close(scaled(input_ids).logits, plain(inputs_embeds=embeds).logits)
        assert not torch.allclose(scaled(input_ids).logits, plain(input_ids).logits)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_return_dict_false_gives_tuples_as_gpt2_does(model_type):
    """`model(ids, return_dict=False)[0]` is the base model's hidden states and the heads' logits, as for GPT-2; a
    config with `return_dict=False` makes every class return tuples."""
    from transformers import AutoModel, GPT2Model

    input_ids = torch.randint(3, 37, (2, 5))
    gpt2 = GPT2Model(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=37)).eval()
    assert isinstance(gpt2(input_ids, return_dict=False), tuple)  # the behaviour we match
    base = AutoModel.from_config(tiny_config(model_type)).eval()
    outputs = base(input_ids, return_dict=False)
    assert isinstance(outputs, tuple)
    torch.testing.assert_close(outputs[0], base(input_ids).last_hidden_state, atol=0, rtol=0)
    lm = AutoModelForCausalLM.from_config(tiny_config(model_type, return_dict=False)).eval()
    outputs = lm(input_ids)
    assert isinstance(outputs, tuple)
    torch.testing.assert_close(outputs[0], lm(input_ids, return_dict=True).logits, atol=0, rtol=0)


def test_attentions_are_the_weights_used_so_gradients_reach_them_as_in_gpt2():
    """`attentions[i].retain_grad()` then `backward()`: GPT-2's eager attention gives each layer's weights a gradient,
    and a global-only model with GPT-2's weights gives the same one."""
    gpt2, ours = gpt2_and_ours()
    gpt2.set_attn_implementation("eager")
    input_ids = torch.randint(0, 37, (2, 7))
    gradients = []
    for model in (gpt2, ours):
        outputs = model(input_ids, output_attentions=True)
        for weights in outputs.attentions:
            weights.retain_grad()
        (outputs.logits**2).sum().backward()
        gradients.append([weights.grad for weights in outputs.attentions])
    for expected, got in zip(*gradients, strict=True):
        assert got is not None
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("layout", [["global", "local", "positional", "local"], ["positional", "local"]])
def test_attentions_of_every_kind_receive_gradients(layout):
    """Local heads' kernel returns weights without a gradient: the returned ones must be those the output used."""
    config = tiny_config("hybrid_gpt2", head_layout=[layout, layout], n_head=len(layout), n_embd=8 * len(layout))
    model = AutoModelForCausalLM.from_config(config)
    input_ids = torch.randint(3, 37, (2, 9))
    outputs = model(input_ids, output_attentions=True)
    for weights in outputs.attentions:
        weights.retain_grad()
    outputs.logits.sum().backward()
    for weights in outputs.attentions:
        for head in range(len(layout)):
            assert weights.grad is not None and weights.grad[:, head].abs().sum() > 0, (layout, head)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("attend_to_self", [False, True])
def test_attn_implementation_eager_equals_sdpa(model_type, attend_to_self):
    """`attn_implementation` picks the global heads' kernel, as in every transformers model: written-out softmax for
    "eager", SDPA for "sdpa"; the two agree within 1e-5 in fp32, with padding too."""
    from hf_attn.attention_hf_attn import eager_attention, global_attention
    from hf_attn.layers_hf_attn import HfAttnAttention

    def global_kernels(model):
        return {m.kernels.get("global") for m in model.modules() if isinstance(m, HfAttnAttention)}

    layout = [["global", "local", "positional", "global"]] * 2
    config = tiny_config(model_type, attend_to_self=attend_to_self)
    if model_type == "hybrid_gpt2":
        config = tiny_config(model_type, attend_to_self=attend_to_self, head_layout=layout)
    sdpa = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    eager = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    eager.load_state_dict(sdpa.state_dict())
    if model_type == "hybrid_gpt2":
        assert global_kernels(sdpa) == {global_attention} and global_kernels(eager) == {eager_attention}
    input_ids = torch.randint(3, 37, (2, 9))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :3] = 0
    with torch.no_grad():
        expected = sdpa(input_ids, attention_mask=attention_mask).logits
        torch.testing.assert_close(eager(input_ids, attention_mask=attention_mask).logits, expected, atol=1e-5, rtol=0)
        sdpa.set_attn_implementation("eager")  # switched after building, as transformers allows
        torch.testing.assert_close(sdpa(input_ids, attention_mask=attention_mask).logits, expected, atol=1e-5, rtol=0)
    if model_type == "hybrid_gpt2":
        assert global_kernels(sdpa) == {eager_attention}


@pytest.mark.parametrize("implementation", ["foo", "flash_attention_2", "paged|eager", "hf_attn_local"])
def test_unsupported_attn_implementation_is_refused_listing_what_is(implementation):
    """In transformers' words, which its tests match, with what the model allows."""
    allowed = '`attn_implementation="sdpa"`, `attn_implementation="eager"`, `attn_implementation="flex_attention"`'
    expected = f'Specified `attn_implementation="{implementation}"` is not supported. The only possible arguments are '
    with pytest.raises(ValueError, match=re.escape(expected + allowed)):
        AutoModelForCausalLM.from_config(tiny_config("hybrid_gpt2"), attn_implementation=implementation)


@pytest.mark.parametrize("attend_to_self", [False, True])
def test_attn_implementation_flex_attention_equals_sdpa(attend_to_self):
    """FlexAttention runs the global heads (inference only on CPU: PyTorch gives it no backward there)."""
    layout = [["global", "local", "positional", "global"]] * 2
    config = tiny_config("hybrid_gpt2", head_layout=layout, attend_to_self=attend_to_self)
    sdpa = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    flex = AutoModelForCausalLM.from_config(config, attn_implementation="flex_attention").eval()
    flex.load_state_dict(sdpa.state_dict())
    input_ids = torch.randint(3, 37, (2, 9))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :3] = 0
    with torch.no_grad():
        for mask in (None, attention_mask):
            expected = sdpa(input_ids, attention_mask=mask).logits
            torch.testing.assert_close(flex(input_ids, attention_mask=mask).logits, expected, atol=1e-5, rtol=0)


def test_local_heads_run_the_function_registered_in_transformers_attention_interface():
    """Registering another function under "hf_attn_local" (transformers' `AttentionInterface`) swaps the local heads'
    kernel of every model: here the naive reference, which must give the same logits."""
    from transformers import AttentionInterface

    from hf_attn.head_kinds_hf_attn import LOCAL

    config = tiny_config("hybrid_gpt2", head_layout=[["global", "local", "positional", "local"]] * 2)
    model = AutoModelForCausalLM.from_config(config).eval()
    input_ids = torch.randint(3, 37, (2, 9))
    calls = []

    def naive_local(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        calls.append(query.shape)
        out, _ = naive_attention(query, key, value, config.is_causal, config.attend_to_self, config.local_window,
                                 attention_mask, scaling)  # fmt: skip
        return out.to(query.dtype).transpose(1, 2), None

    with torch.no_grad():
        expected = model(input_ids).logits
        AttentionInterface.register("hf_attn_local", naive_local)
        try:
            got = model(input_ids).logits
        finally:
            AttentionInterface.register("hf_attn_local", LOCAL.run)
    assert calls == [(2, 2, 9, 8)] * 2  # both local heads of each layer, together
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_a_registered_head_kind_function_refuses_a_module_without_such_heads():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    q = torch.zeros(1, 1, 2, 4)
    with pytest.raises(ValueError, match="hf_attn_positional.*positional heads"):
        ALL_ATTENTION_FUNCTIONS["hf_attn_positional"](torch.nn.Linear(1, 1), q, q, q, None, scaling=1.0)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_outputs_are_captured_as_transformers_captures_them(model_type):
    """transformers' `capture_outputs`: n_layer + 1 hidden states (the block inputs, then the final norm's output),
    n_layer weights, in a dict or a tuple; `output_hidden_states` as indices keeps only those, negative ones counted
    from the end, the others None; the config's flags ask as the arguments do."""
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, n_layer=3)).eval()
    input_ids = torch.randint(3, 37, (2, 7))
    with torch.no_grad():
        every = model(input_ids, output_hidden_states=True, output_attentions=True)
        selected = model(input_ids, output_hidden_states=[0, -2])
        as_tuple = model(input_ids, output_hidden_states=True, return_dict=False)
        model.config.output_hidden_states = True
        from_config = model(input_ids)
    assert len(every.hidden_states) == 4 and len(every.attentions) == 3
    assert all(w.shape == (2, 4, 7, 7) for w in every.attentions)
    torch.testing.assert_close(every.hidden_states[-1], model.transformer(input_ids).last_hidden_state)
    assert [h is not None for h in selected.hidden_states] == [True, False, True, False]
    for index in (0, 2):
        torch.testing.assert_close(selected.hidden_states[index], from_config.hidden_states[index])
    assert isinstance(as_tuple, tuple) and len(as_tuple[-1]) == 4  # logits, cache, hidden states
    torch.testing.assert_close(as_tuple[0], from_config.logits)
    assert selected.attentions is None and len(from_config.hidden_states) == 4
