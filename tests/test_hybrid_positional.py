"""Positional heads (Paper A's kind) in hybridized Llama, Qwen2, Qwen3, Mistral, Gemma 3 and GPT-2 models.

References: P-only attention written out here from Paper A's definition (P's rows from the sinusoid formula, one
query and key at a time, through tests/naive.py), the model's own outputs recomputed without a cache, and the
unmodified model (an all-global layout).
"""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from datasets import Dataset
from huggingface_hub import ModelCard
from naive import naive_attention
from test_hybrid import FAMILIES, REMOTE_LOAD, SLIDING_LAYERS, VOCAB, batch, greedy_by_recomputing, sliding, tiny
from torch._dynamo.testing import CompileCounter
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, Trainer, TrainingArguments

import hf_attn
from hf_attn import HfAttnCache, hybridize
from hf_attn.hybrid import HYBRID_TYPES, cache_bytes_per_token

# 8 query heads over 2 key/value heads (4 each) in the families with grouped-query attention: layer 0 mixes kinds in
# its first group (kept whole) and has a group of local heads alone (a window); layer 1 has a group of positional
# heads alone (values only) and one mixing local, global and positional heads.
LAYOUT = [["global", "local", "positional", "global"] + ["local"] * 4, ["positional"] * 4 + ["local", "local", "global",
          "positional"]]  # fmt: skip
POSITIONAL_HEADS = [[h for h, kind in enumerate(layer) if kind == "positional"] for layer in LAYOUT]


def positional(family: str, **options):
    return hybridize(tiny(family), head_layout=LAYOUT, local_window=2, **options)


def sinusoid_row(position: int, dim: int) -> torch.Tensor:
    """Vaswani et al.'s P row, from the formula: sin(pos / 10000^(2i/d)) at 2i, cos at 2i + 1."""
    row = [0.0] * dim
    for i in range(0, dim, 2):
        angle = position / 10000 ** (i / dim)
        row[i] = math.sin(angle)
        if i + 1 < dim:
            row[i + 1] = math.cos(angle)
    return torch.tensor(row, dtype=torch.float64)


def attention_inputs_and_outputs(model, ids, mask):
    """Per layer: the hidden states the attention module reads, and what it hands its output projection."""
    seen = {}
    hooks = []
    for layer, attention in enumerate(attention_modules(model)):
        output_projection = attention.o_proj if hasattr(attention, "o_proj") else attention.c_proj

        def read_input(module, args, kwargs, layer=layer):
            seen.setdefault(layer, {})["hidden"] = kwargs.get("hidden_states", args[0] if args else None)

        def read_output(module, args, layer=layer):
            seen[layer]["out"] = args[0]

        hooks.append(attention.register_forward_pre_hook(read_input, with_kwargs=True))
        hooks.append(output_projection.register_forward_pre_hook(read_output))
    with torch.no_grad():
        model(ids, attention_mask=mask, use_cache=False)
    for hook in hooks:
        hook.remove()
    return seen


def attention_modules(model):
    return [module for module in model.modules() if hasattr(module, "hf_attn_heads")]


def values_of(attention, hidden: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(B, H_kv, T, D): the layer's value projection, as the family computes it."""
    if hasattr(attention, "v_proj"):
        v = attention.v_proj(hidden)
    else:  # GPT-2: queries, keys, values side by side in c_attn
        v = attention.c_attn(hidden).split(hidden.shape[-1], dim=-1)[2]
    return v.view(*hidden.shape[:2], -1, head_dim).transpose(1, 2)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padded", [False, True])
def test_positional_heads_equal_p_only_attention_written_out(family, padded):
    """Each positional head's output is softmax((P Wq)(P Wk)^T / sqrt(d)) V over every earlier real token and itself,
    P's rows at each row's real positions (counted from 0 after left padding), V the layer's value projection."""
    model = positional(family)
    ids, mask = batch(length=10)
    mask = mask if padded else torch.ones_like(mask)
    seen = attention_inputs_and_outputs(model, ids, mask)
    config = model.config
    head_dim = hf_attn.hybrid_attention.head_dim(config)
    group = config.num_attention_heads // hf_attn.hybrid_attention.num_key_value_heads(config)
    qk, width = config.positional_qk_dim, config.positional_encoding_dim
    for layer, attention in enumerate(attention_modules(model)):
        heads = POSITIONAL_HEADS[layer]
        v = values_of(attention, seen[layer]["hidden"], head_dim)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        rows = torch.stack([torch.stack([sinusoid_row(int(p), width) for p in row]) for row in positions])
        weight, bias = attention.p_attn.weight.double(), attention.p_attn.bias.double()
        projected = rows @ weight.T + bias  # (B, T, 2 * heads * qk): every head's queries, then keys
        pq = projected[..., : len(heads) * qk].view(*rows.shape[:2], len(heads), qk).transpose(1, 2)
        pk = projected[..., len(heads) * qk :].view(*rows.shape[:2], len(heads), qk).transpose(1, 2)
        v_read = torch.stack([v[:, h // group] for h in heads], dim=1)
        expected, _ = naive_attention(pq, pk, v_read, is_causal=True, attend_to_self=True, key_mask=mask.bool(),
                                      scale=qk**-0.5)  # fmt: skip
        got = seen[layer]["out"].view(*ids.shape, -1, head_dim)[:, :, heads].transpose(1, 2)
        real = mask.bool()[:, None, :, None].expand_as(got)
        torch.testing.assert_close(got[real].double(), expected[real], rtol=1e-4, atol=1e-5)


def test_a_positional_heads_weights_do_not_change_with_the_content():
    """Other tokens at the same positions: the positional heads weigh them exactly as before, the global heads not."""
    model = positional("llama")
    ids, mask = batch()
    other = (ids + 1 + torch.arange(ids.numel()).view_as(ids)) % VOCAB
    with torch.no_grad():
        first = model(ids, attention_mask=mask, output_attentions=True).attentions
        second = model(other, attention_mask=mask, output_attentions=True).attentions
    for layer, heads in enumerate(POSITIONAL_HEADS):
        assert torch.equal(first[layer][:, heads], second[layer][:, heads])
        assert not torch.allclose(first[layer][:, LAYOUT[layer].index("global")],
                                  second[layer][:, LAYOUT[layer].index("global")])  # fmt: skip


def test_output_attentions_gives_the_weights_the_heads_apply():
    """The weights returned are those the heads apply: each positional head's output is its weights times the values
    it reads, and its rows sum to 1 over the real keys (0 on padding)."""
    model = positional("qwen2")
    ids, mask = batch()
    seen = attention_inputs_and_outputs(model, ids, mask)
    with torch.no_grad():
        attentions = model(ids, attention_mask=mask, output_attentions=True).attentions
    head_dim = hf_attn.hybrid_attention.head_dim(model.config)
    group = model.config.num_attention_heads // model.config.num_key_value_heads
    for layer, attention in enumerate(attention_modules(model)):
        v = values_of(attention, seen[layer]["hidden"], head_dim)
        out = seen[layer]["out"].view(*ids.shape, -1, head_dim)
        for h in POSITIONAL_HEADS[layer]:
            weights = attentions[layer][:, h]
            torch.testing.assert_close(weights @ v[:, h // group], out[:, :, h], rtol=1e-5, atol=1e-6)
            assert torch.all(weights[0, :, :3] == 0)  # row 0's left padding
            torch.testing.assert_close(weights[0, 3:].sum(-1), torch.ones(ids.shape[1] - 3))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("max_cache_len", [None, 30], ids=["dynamic", "static"])
def test_output_attentions_while_decoding_are_the_rows_of_the_whole_sequence(family, max_cache_len):
    """Left-padded, with sinks for the local heads: each step's weights are over every position in token order (a
    static cache's every slot), positional heads' too, whose key/value heads the cache keeps as values only."""
    model = positional(family, sink_tokens=1)
    ids, mask = batch(length=20)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        whole = model(ids, attention_mask=mask, position_ids=positions, use_cache=False,
                      output_attentions=True).attentions  # fmt: skip
        cache = HfAttnCache(model.config, max_cache_len=max_cache_len)
        model(ids[:, :12], attention_mask=mask[:, :12], position_ids=positions[:, :12], cache=cache)
        for end in range(13, 21):
            step = model(ids[:, end - 1 : end], attention_mask=mask[:, :end], position_ids=positions[:, end - 1 : end],
                         cache=cache, output_attentions=True).attentions  # fmt: skip
            for got, expected in zip(step, whole, strict=True):
                torch.testing.assert_close(got[..., 0, :end], expected[..., end - 1, :end], rtol=1e-5, atol=1e-6)
                assert not got[..., end:].any()


@pytest.mark.parametrize("family", FAMILIES)
def test_an_all_global_layout_with_p_fields_is_exactly_the_original(family):
    """Naming P's fields adds nothing where no head is positional: no parameter, the same logits bit for bit."""
    original = tiny(family)
    ids, mask = batch()
    with torch.no_grad():
        expected = original(ids, attention_mask=mask).logits
        model = hybridize(original, positional_encoding="binary")
        assert not any("p_attn" in name for name, _ in model.named_parameters())
        assert torch.equal(model(ids, attention_mask=mask).logits, expected)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padded", [False, True])
def test_decoding_with_the_cache_gives_the_logits_of_the_whole_sequence(family, padded):
    model = positional(family)
    ids, mask = batch(length=26)
    mask = mask if padded else torch.ones_like(mask)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        # GPT-2's learned positions read `position_ids`: given to both (P's positions follow the mask in any case)
        expected = model(ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
        cache = HfAttnCache(model.config)
        for start, end in [(0, 20), (20, 22), (22, 23), (23, 26)]:
            logits = model(ids[:, start:end], attention_mask=mask[:, :end], position_ids=positions[:, start:end],
                           cache=cache).logits  # fmt: skip
            torch.testing.assert_close(logits, expected[:, start:end], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", SLIDING_LAYERS)
@pytest.mark.parametrize("max_cache_len", [None, 30], ids=["dynamic", "static"])
def test_in_a_layer_the_model_slides_a_window_over_positional_heads_keep_that_window(family, max_cache_len):
    """A window of 6 tokens that binds: the model's mask hides older tokens from every head, positional ones
    included, and the cache keeps no more of their values; decoding still equals recomputing."""
    model = hybridize(sliding(family), head_layout=LAYOUT, local_window=2)
    ids, mask = batch(length=20)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        expected = model(ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
        cache = HfAttnCache(model.config, max_cache_len=max_cache_len)
        for start, end in [(0, 12), (12, 13), (13, 16), (16, 20)]:
            logits = model(ids[:, start:end], attention_mask=mask[:, :end], position_ids=positions[:, start:end],
                           cache=cache).logits  # fmt: skip
            torch.testing.assert_close(logits, expected[:, start:end], rtol=1e-5, atol=1e-5)
    sliding_layers = [layer for layer, slides in zip(cache.layers, SLIDING_LAYERS[family], strict=True) if slides]
    kept = [layer.tensors()["positional_values"].shape[-2] for layer in sliding_layers if "positional" in layer.by_kind]
    if family != "gemma3_text":  # its sliding layer has no key/value head of positional heads alone
        assert kept == [5]  # what the next query sees besides itself, of the 20 tokens


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("cache_implementation", [None, "static"])
def test_greedy_generate_with_left_padding_equals_recomputing(family, cache_implementation):
    model = positional(family)
    ids, mask = batch()
    generated = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0,
                               cache_implementation=cache_implementation)  # fmt: skip
    assert torch.equal(generated, greedy_by_recomputing(model, ids, mask, 8))


def test_the_cache_keeps_only_the_values_of_key_value_heads_only_positional_heads_read():
    model = positional("llama")
    ids, mask = batch()
    assert model.config.kv_head_layout == [["global", "local"], ["positional", "global"]]
    out = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
                         return_dict_in_generate=True)  # fmt: skip
    tensors = out.cache.layers[1].tensors()
    assert set(tensors) == {"positional_values", "global_keys", "global_values"}
    assert tensors["positional_values"].shape[-2] == tensors["global_values"].shape[-2] == 15  # 12 + 4 - 1 tokens
    # 16-bit, head dim 8: layer 0 keeps a key and a value of one head per token, layer 1 of one head and a value of
    # the other (the local heads' window does not grow).
    assert cache_bytes_per_token(model.config) == (2 + 2 + 1) * 8 * 2


def test_compiled_static_decoding_compiles_the_prompt_once_and_every_step_once():
    """As transformers compiles (`dynamic=False`, fullgraph): P's rows are computed from tensors, so 10 decoding steps
    share one graph."""
    model = positional("llama", sink_tokens=1)
    ids, mask = batch()
    options = dict(attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    expected = greedy_by_recomputing(model, ids, mask, 10)
    torch._dynamo.reset()
    counter = CompileCounter()
    model.forward = torch.compile(model.forward, fullgraph=True, backend=counter, dynamic=False)
    assert torch.equal(model.generate(ids, cache_implementation="static", **options), expected)
    assert counter.frame_count == 2


def test_packed_documents_restart_their_positions():
    """Two documents in one row, positions restarting and no mask (padding-free batches): each gets the logits it
    has alone, positional heads' weights counted from its own first token."""
    model = positional("llama")
    first, second = batch(length=7)[0][:1], batch(seed=2, length=5)[0][:1]
    packed = torch.cat([first, second], dim=1)
    positions = torch.cat([torch.arange(7), torch.arange(5)])[None]
    with torch.no_grad():
        got = model(packed, position_ids=positions, use_cache=False).logits
        torch.testing.assert_close(got[:, :7], model(first).logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[:, 7:], model(second).logits, rtol=1e-5, atol=1e-5)


def test_save_and_load_give_the_same_logits_with_hf_attn_and_with_remote_code_alone(tmp_path):
    model = positional("llama", positional_encoding="binary")
    ids, mask = batch()
    model.save_pretrained(tmp_path / "saved")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    assert loaded.config.head_layout == LAYOUT and loaded.config.positional_encoding_dim == 6  # log2(64) bits
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
        assert torch.equal(loaded(ids, attention_mask=mask).logits, expected)
    torch.save(ids, tmp_path / "ids.pt")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    command = [sys.executable, "-c", REMOTE_LOAD, str(tmp_path / "ids.pt"), str(tmp_path / "out.pt"),
               str(tmp_path / "saved")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    with torch.no_grad():
        torch.testing.assert_close(torch.load(tmp_path / "out.pt")[str(tmp_path / "saved")][0], model(ids).logits,
                                   rtol=0, atol=0)  # fmt: skip


def test_the_model_card_names_the_positional_heads(tmp_path):
    model = positional("llama")
    model.save_pretrained(tmp_path)
    card = ModelCard.load(tmp_path / "README.md").text
    assert "| layers | global heads | local heads | positional heads |" in card
    # layer 0: 2 global, 5 local, 1 positional; groups kept whole and as a window. Layer 1: 1 global, 2 local, 5
    # positional; a group of positional heads alone (values only) and a mixed one (whole).
    assert "| 0 | 2 | 5 | 1 | 1 | 1 | 0 |" in card and "| 1 | 1 | 2 | 5 | 1 | 0 | 1 |" in card
    assert "Positional heads weigh every earlier token and themselves by the fixed positional encoding P" in card


def test_hybridize_draws_new_p_projections_on_the_models_device_and_dtype_and_keeps_every_other_weight():
    original = tiny("llama").to(torch.bfloat16)
    before = {name: p.clone() for name, p in original.named_parameters()}
    model = hybridize(original, head_layout=LAYOUT)
    added = {name: p for name, p in model.named_parameters() if name not in before}
    assert sorted(added) == [f"model.layers.{i}.self_attn.p_attn.{w}" for i in (0, 1) for w in ("bias", "weight")]
    assert all(p.dtype == torch.bfloat16 for p in added.values())
    # queries and keys (8 wide, P's width: the heads' width) of 1 and 5 positional heads, from 8-wide P rows
    assert added["model.layers.1.self_attn.p_attn.weight"].shape == (2 * 5 * 8, 8)
    weights = torch.cat([p.float().flatten() for name, p in added.items() if name.endswith("weight")])
    assert abs(weights.std().item() - model.config.initializer_range) < 0.004  # normal(0, initializer_range)
    assert all(torch.count_nonzero(p) == 0 for name, p in added.items() if name.endswith("bias"))
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters() if name in before)


def test_hybridizing_again_keeps_p_attn_for_the_same_positional_heads_and_draws_it_anew_for_others():
    """A new window or sinks keep the (perhaps trained) projection; other heads made positional, even as many, get a
    fresh one: it projects for particular heads."""
    model = positional("llama")
    kept = model.model.layers[1].self_attn.p_attn
    hybridize(model, head_layout=LAYOUT, local_window=4, sink_tokens=2)
    assert model.model.layers[1].self_attn.p_attn is kept
    moved = [LAYOUT[0], ["positional"] * 4 + ["local", "local", "positional", "global"]]  # still 5 positional heads
    hybridize(model, head_layout=moved, local_window=4)
    assert model.model.layers[1].self_attn.p_attn is not kept
    assert model.model.layers[1].self_attn.p_attn.weight.shape == kept.weight.shape


def tiny_numeric_llama(kind: str):
    config_class = HYBRID_TYPES["llama"][0]
    torch.manual_seed(0)
    config = config_class(
        vocab_size=1, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        intermediate_size=32, max_position_embeddings=9, head_layout=[[kind] * 2] * 2, positional_encoding="onehot",
        numeric_inputs=True, num_labels=1, problem_type="regression", classifier_dropout=0.0,
    )  # fmt: skip
    return AutoModelForTokenClassification.from_config(config)


def test_numbers_enter_through_wne_and_regression_is_a_masked_mse(tmp_path):
    """Paper A's inputs on a Llama: `numeric_values` embedded as value * w + b; per-position MSE with NaN labels left
    out; Trainer keeps the `numeric_values` column and trains."""
    model = tiny_numeric_llama("positional")
    values = torch.randn(16, 9)
    labels = values.cummin(-1).values
    labels[:, -1] = float("nan")
    out = model(numeric_values=values, labels=labels)
    expected_embeds = values[..., None] * model.model.wne.weight[:, 0] + model.model.wne.bias
    same = model(inputs_embeds=expected_embeds)
    torch.testing.assert_close(out.logits, same.logits)
    torch.testing.assert_close(out.loss, ((out.logits[:, :-1, 0] - labels[:, :-1]) ** 2).mean())
    data = Dataset.from_dict({"numeric_values": values.tolist(), "labels": labels.tolist()})
    arguments = TrainingArguments(tmp_path, num_train_epochs=3, per_device_train_batch_size=8, learning_rate=1e-2,
                                  report_to=[], use_cpu=True, save_strategy="no", logging_steps=1)  # fmt: skip
    history = Trainer(model=model, args=arguments, train_dataset=data).train()
    assert history.training_loss < out.loss.item()


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(head_layout=[["global", "positonal"]] * 2), "allowed kinds: ['global', 'local', 'positional']"),
        (
            dict(positional_encoding="learned"),
            "`positional_encoding` must be one of ['sinusoidal', 'binary', 'onehot']",
        ),
        (dict(positional_encoding_dim=7), "`positional_encoding_dim` must be even for sinusoidal P, got 7"),
        (dict(positional_qk_dim=0), "`positional_qk_dim` must be an int >= 1, got 0"),
    ],
)
def test_bad_fields_are_refused_naming_what_is_allowed(fields, message):
    shape = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, vocab_size=10)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        HYBRID_TYPES["llama"][0](**shape, **fields)


def test_positions_p_cannot_tell_apart_and_numbers_without_wne_are_refused():
    model = tiny_numeric_llama("positional")
    with pytest.raises(ValueError, match="Position 9 is beyond what `positional_encoding`='onehot'"):
        model(numeric_values=torch.randn(2, 10))
    with pytest.raises(ValueError, match="`numeric_values` needs a model made with `numeric_inputs=True`"):
        positional("llama")(numeric_values=torch.randn(2, 4))


def test_loading_reads_the_hybrid_config_fields(tmp_path):
    model = positional("gpt2")
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["positional_encoding"] == "sinusoidal" and saved["positional_encoding_dim"] == 8
    assert saved["positional_qk_dim"] == 8 and saved["numeric_inputs"] is False
