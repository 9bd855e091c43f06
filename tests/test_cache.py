"""The cache is a transformers `Cache` of transformers' own layers, so what `generate` builds on `Cache` works:
a cache `generate` makes itself, static caches and compiled decoding, crop for assisted and prompt-lookup decoding,
and past keys and values from outside (PEFT's prefix tuning)."""

import pytest
import torch
from conftest import MODEL_TYPES, tiny_config
from test_convert_gpt2 import GPT2_FIELDS
from test_generation import PAD, generation_model, greedy_by_recomputing, left_padded_prompts
from torch._dynamo.testing import CompileCounter
from transformers import AutoModelForCausalLM, DynamicCache, GPT2Config, GPT2LMHeadModel, StaticCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer, StaticLayer

from hf_attn import HfAttnCache, convert_gpt2, hybridize
from hf_attn.cache_hf_attn import StaticSinkWindowLayer

MIXED = [["global", "local", "positional", "positional"], ["positional", "global", "local", "global"]]
GREEDY = dict(do_sample=False, pad_token_id=PAD)


def mixed_model(**overrides):
    return generation_model("hybrid_gpt2", head_layout=MIXED, **overrides)


def test_generate_makes_a_cache_of_transformers_layers_per_kind():
    model = mixed_model()
    _, input_ids, attention_mask = left_padded_prompts()
    out = model.generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=3, return_dict_in_generate=True, **GREEDY
    )
    assert isinstance(out.cache, HfAttnCache)
    layer = out.cache.layers[0]
    assert isinstance(layer.by_kind["global"], DynamicLayer)
    assert isinstance(layer.by_kind["local"], DynamicSlidingWindowLayer)  # keeps the last k = 2 tokens
    assert layer.by_kind["positional"].keys.shape[-1] == 0  # values only
    assert out.cache.get_seq_length() == input_ids.shape[1] + 2


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("overrides", [{}, {"position_embedding_type": "rope", "attend_to_self": True}])
def test_static_cache_decodes_what_recomputing_decodes(model_type, overrides):
    model = generation_model(model_type, **overrides)
    _, input_ids, attention_mask = left_padded_prompts()
    expected = greedy_by_recomputing(model, input_ids, attention_mask, steps=10)
    out = model.generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=10, cache_implementation="static",
        return_dict_in_generate=True, **GREEDY,
    )  # fmt: skip
    assert torch.equal(out.sequences, expected)
    assert out.cache.is_compileable
    for layer in out.cache.layers:
        for name, kind_layer in layer.by_kind.items():
            assert isinstance(kind_layer, StaticSinkWindowLayer if name == "local" else StaticLayer)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("cache_implementation", ["static", None])
def test_a_forward_compiled_as_one_graph_decodes_as_eager(model_type, cache_implementation):
    """`generate` through `torch.compile(model.forward, fullgraph=True)`: any graph break is an error."""
    model = generation_model(model_type)
    _, input_ids, attention_mask = left_padded_prompts()
    generate = dict(attention_mask=attention_mask, max_new_tokens=8, **GREEDY)
    expected = model.generate(input_ids, **generate)
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, fullgraph=True, backend="eager")
    assert torch.equal(model.generate(input_ids, cache_implementation=cache_implementation, **generate), expected)


@pytest.mark.parametrize(
    "model_type,sink_tokens", [*((model_type, 0) for model_type in MODEL_TYPES), ("local_gpt2", 2), ("hybrid_gpt2", 2)]
)
def test_compiled_static_decoding_compiles_the_prompt_once_and_every_step_once(model_type, sink_tokens):
    """As transformers compiles (`dynamic=False`): the mask `generate` passes keeps the static cache's width, so 10
    decoding steps share one graph; the prompt, another shape, is the other one."""
    model = generation_model(model_type, sink_tokens=sink_tokens)
    _, input_ids, attention_mask = left_padded_prompts()
    generate = dict(attention_mask=attention_mask, max_new_tokens=10, cache_implementation="static", **GREEDY)
    expected = model.generate(input_ids, **generate)
    torch._dynamo.reset()
    counter = CompileCounter()
    model.forward = torch.compile(model.forward, fullgraph=True, backend=counter, dynamic=False)
    assert torch.equal(model.generate(input_ids, **generate), expected)
    assert counter.frame_count == 2


@pytest.mark.parametrize(
    "model_type,sink_tokens", [*((model_type, 0) for model_type in MODEL_TYPES), ("local_gpt2", 2), ("hybrid_gpt2", 2)]
)
@pytest.mark.parametrize("max_cache_len", [None, 24], ids=["dynamic", "static"])
def test_output_attentions_while_decoding_are_the_rows_of_the_whole_sequence(model_type, sink_tokens, max_cache_len):
    """Token by token, past the local window (and with sinks, past the point where the cache keeps the sinks apart
    from it): each step's weights are over every position in token order, as GPT-2's, 0 for keys a head does not see
    and for a static cache's empty slots; the reference is the last row of the whole sequence's weights."""
    model = generation_model(model_type, sink_tokens=sink_tokens)
    _, input_ids, attention_mask = left_padded_prompts()
    ids = torch.cat([input_ids, torch.randint(3, 37, (3, 8))], dim=1)
    mask = torch.cat([attention_mask, torch.ones(3, 8, dtype=torch.long)], dim=1)
    cache = HfAttnCache(model.config, max_cache_len=max_cache_len)
    with torch.no_grad():
        whole = model(ids, attention_mask=mask, use_cache=False, output_attentions=True).attentions
        model(ids[:, :7], attention_mask=mask[:, :7], cache=cache)
        for end in range(8, ids.shape[1] + 1):
            step = model(ids[:, end - 1 : end], attention_mask=mask[:, :end], cache=cache, output_attentions=True)
            for got, expected in zip(step.attentions, whole, strict=True):
                assert got.shape[-1] == (end if max_cache_len is None else max_cache_len)
                torch.testing.assert_close(got[..., 0, :end], expected[..., end - 1, :end], rtol=1e-5, atol=1e-6)
                assert not got[..., end:].any()


@pytest.mark.parametrize("cache_implementation", [None, "static"])
def test_generate_gives_transformers_cache_classes_that_keep_each_kinds_saving(cache_implementation):
    """A `DynamicCache` by default and a `StaticCache` with `cache_implementation="static"`, as for GPT-2, for hf_attn's
    models and hybridized ones; the local heads' part keeps its window either way."""
    expected_class = StaticCache if cache_implementation == "static" else DynamicCache
    _, input_ids, attention_mask = left_padded_prompts()
    options = dict(attention_mask=attention_mask, max_new_tokens=6, return_dict_in_generate=True, **GREEDY)
    gpt2 = GPT2LMHeadModel(GPT2Config(**GPT2_FIELDS)).eval()
    assert isinstance(gpt2.generate(input_ids, cache_implementation=cache_implementation, **options).cache,
                      expected_class)  # fmt: skip
    hybridized = hybridize(GPT2LMHeadModel(GPT2Config(**GPT2_FIELDS)).eval(), num_local_heads=2, local_window=2)
    for model in (mixed_model(), hybridized):
        cache = model.generate(input_ids, cache_implementation=cache_implementation, **options).cache
        assert isinstance(cache, expected_class) and isinstance(cache, HfAttnCache)
        assert not isinstance(cache, StaticCache if expected_class is DynamicCache else DynamicCache)
        assert cache.layers[0].tensors()["local_keys"].shape[-2] == 2  # k = 2 of 7 + 6 tokens


def test_a_cache_of_global_heads_only_iterates_as_a_dynamic_cache():
    """`DynamicCache` yields (keys, values, sliding window) per layer; a layer whose kinds keep different tokens has
    no such tensors, and says where to look."""
    model = generation_model("hybrid_gpt2", head_layout=[["global"] * 4] * 2)
    input_ids = torch.randint(3, 37, (2, 5))
    with torch.no_grad():
        cache = model(input_ids, use_cache=True).cache
    for keys, values, window in cache:
        assert keys.shape == values.shape == (2, 4, 5, 8) and window is None
    with pytest.raises(TypeError, match=r"tensors\(\)"):
        list(mixed_model()(input_ids, use_cache=True).cache)


def test_an_unsupported_cache_implementation_is_refused():
    with pytest.raises(ValueError, match="cache_implementation.*'static'"):
        mixed_model().generate(torch.tensor([[4, 5]]), max_new_tokens=2, cache_implementation="offloaded", **GREEDY)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_assisted_and_prompt_lookup_decoding_equal_greedy_decoding(model_type):
    """Both verify drafted tokens and `crop` the rejected ones from every kind's cache, windows slid past included;
    assisted decoding from static caches too (for both models), whose windows keep room for the drafts."""
    model = generation_model(model_type)
    draft = generation_model(model_type, n_layer=1)  # a smaller hf_attn model of the same vocabulary
    prompt = torch.randint(3, 37, (1, 9))
    expected = greedy_by_recomputing(model, prompt, torch.ones_like(prompt), steps=12)
    ways = (dict(assistant_model=draft), dict(prompt_lookup_num_tokens=3),
            dict(assistant_model=draft, cache_implementation="static"))  # fmt: skip
    for how in ways:
        assert torch.equal(model.generate(prompt, max_new_tokens=12, **how, **GREEDY), expected), how


def test_crop_puts_every_kind_back():
    model = mixed_model()
    input_ids = torch.randint(3, 37, (2, 14))
    with torch.no_grad():
        cache = model(input_ids[:, :8], use_cache=True).cache
        cache.activate_past_recording()
        model(input_ids[:, 8:12], cache=cache)  # four drafted tokens, past the local window
        cache.crop(-3)  # three rejected
        assert cache.get_seq_length() == 9
        step = model(input_ids[:, 9:10], cache=cache).logits[:, -1]
        whole = model(input_ids[:, :10], use_cache=False).logits[:, -1]
    torch.testing.assert_close(step, whole, atol=1e-5, rtol=1e-5)


def test_crop_past_a_slid_window_without_recording_is_refused():
    model = mixed_model()
    cache = model(torch.randint(3, 37, (1, 8)), use_cache=True).cache
    with pytest.raises(RuntimeError, match="activate_past_recording"):
        cache.crop(-2)


def random_prefix(config, batch: int, tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    head_dim = config.n_embd // config.n_head
    return [(torch.randn(batch, config.n_head, tokens, head_dim),) * 2 for _ in range(config.n_layer)]


@pytest.mark.parametrize("as_tuple", [False, True], ids=["DynamicCache", "legacy_tuple"])
def test_past_keys_and_values_from_outside_give_gpt2s_logits(as_tuple):
    """A prefix of keys and values (what PEFT's prefix tuning passes) reaches global heads as it reaches GPT-2's."""
    gpt2 = GPT2LMHeadModel(GPT2Config(**GPT2_FIELDS)).eval()
    model = convert_gpt2(gpt2, "hybrid_gpt2", num_local_heads=0, attend_to_self=True)
    prefix = random_prefix(gpt2.config, batch=2, tokens=3)
    input_ids = torch.randint(0, 50, (2, 5))
    mask = torch.ones(2, 8, dtype=torch.long)
    positions = torch.arange(3, 8)[None].expand(2, -1)
    with torch.no_grad():
        expected = gpt2(input_ids, past_key_values=DynamicCache(prefix), attention_mask=mask, position_ids=positions)
        given = tuple(prefix) if as_tuple else DynamicCache(prefix)
        got = model(input_ids, cache=given, attention_mask=mask)
    torch.testing.assert_close(got.logits, expected.logits, atol=1e-5, rtol=0)


def test_prefix_tuning_trains_local_and_global_heads_and_refuses_positional_ones():
    from peft import PrefixTuningConfig, get_peft_model

    input_ids = torch.randint(3, 37, (2, 7))
    prefix_tuning = PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)
    for model_type in ("local_gpt2", "hybrid_gpt2"):
        model = get_peft_model(AutoModelForCausalLM.from_config(tiny_config(model_type)), prefix_tuning)
        model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=input_ids).loss.backward()
        trained = [name for name, p in model.named_parameters() if p.grad is not None]
        assert trained and all("prompt_encoder" in name for name in trained), model_type
        generated = model.generate(input_ids=input_ids, max_new_tokens=3, **GREEDY)
        assert generated.shape == (2, 10)
    positional = get_peft_model(AutoModelForCausalLM.from_config(tiny_config("positional_gpt2")), prefix_tuning)
    with pytest.raises(ValueError, match="positional heads.*positions"):
        positional(input_ids=input_ids, labels=input_ids)


def test_a_static_cache_holds_a_fixed_size_and_its_local_part_the_window():
    model = mixed_model()
    cache = HfAttnCache(model.config, max_cache_len=32)
    with torch.no_grad():
        model(torch.randint(3, 37, (2, 9)), cache=cache)
    tensors = cache.layers[0].tensors()
    assert tensors["global_keys"].shape[-2] == tensors["positional_values"].shape[-2] == 32
    assert tensors["local_keys"].shape[-2] == 2  # k slots: the query's own key comes with the update
    assert "positional_keys" not in tensors


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_generate_continues_from_the_cache_it_returned(model_type):
    model = generation_model(model_type)
    input_ids = torch.randint(3, 37, (2, 6))
    expected = model.generate(input_ids, max_new_tokens=10, **GREEDY)
    first = model.generate(input_ids, max_new_tokens=4, return_dict_in_generate=True, **GREEDY)
    whole = torch.ones_like(first.sequences)  # a generated token may be the pad token: nothing is padding here
    continued = model.generate(first.sequences, attention_mask=whole, cache=first.cache, max_new_tokens=6, **GREEDY)
    assert torch.equal(continued, expected)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_a_static_cache_longer_than_the_position_tables_decodes(model_type):
    """Slots beyond `n_positions` (64 here) that no token fills are masked, never looked up."""
    model = generation_model(model_type)
    prompt = torch.randint(3, 37, (2, 12))
    expected = greedy_by_recomputing(model, prompt, torch.ones_like(prompt), steps=6)
    cache = HfAttnCache(model.config, max_cache_len=70)
    assert torch.equal(model.generate(prompt, cache=cache, max_new_tokens=6, **GREEDY), expected)


@pytest.mark.parametrize("cache_implementation", [None, "static"])
def test_generate_returns_gpt2s_attentions_and_hidden_states_at_every_step(cache_implementation):
    """`generate(output_attentions=True, output_hidden_states=True)`: at every step, the prompt's included, the shapes
    GPT-2 gives (weights over every slot of a static cache) and, for GPT-2's weights in a global-only layout, its
    values; then for every type and kinds mixed, the prompt's weights over a static cache are the whole prompt's,
    0 in the slots after it."""
    gpt2 = GPT2LMHeadModel(GPT2Config(**GPT2_FIELDS, attn_implementation="eager")).eval()
    model = convert_gpt2(gpt2, "hybrid_gpt2", num_local_heads=0, attend_to_self=True)
    _, input_ids, attention_mask = left_padded_prompts()
    generate = dict(attention_mask=attention_mask, max_new_tokens=3, cache_implementation=cache_implementation,
                    output_attentions=True, output_hidden_states=True, return_dict_in_generate=True,
                    **GREEDY)  # fmt: skip
    expected, got = gpt2.generate(input_ids, **generate), model.generate(input_ids, **generate)
    assert torch.equal(got.sequences, expected.sequences)
    real = attention_mask.bool()
    prompt_rows = {"attentions": real[:, None, :, None], "hidden_states": real[..., None]}
    for outputs, real in prompt_rows.items():  # padding's rows see nothing real: left aside
        for step, (got_step, expected_step) in enumerate(zip(getattr(got, outputs), getattr(expected, outputs),
                                                             strict=True)):  # fmt: skip
            for got_layer, expected_layer in zip(got_step, expected_step, strict=True):
                assert got_layer.shape == expected_layer.shape, (outputs, step)
                kept = real if step == 0 else True
                torch.testing.assert_close(got_layer * kept, expected_layer * kept, atol=1e-5, rtol=0)
    for model_type in MODEL_TYPES:
        model = mixed_model() if model_type == "hybrid_gpt2" else generation_model(model_type)
        with torch.no_grad():
            whole = model(input_ids, attention_mask=attention_mask, output_attentions=True).attentions
        got = model.generate(input_ids, **{**generate, "cache_implementation": "static"})
        width = got.attentions[-1][0].shape[-1]
        for prompt_weights, whole_weights in zip(got.attentions[0], whole, strict=True):
            assert prompt_weights.shape[-1] == width > whole_weights.shape[-1], model_type
            torch.testing.assert_close(prompt_weights[..., : input_ids.shape[1]], whole_weights)
            assert not prompt_weights[..., input_ids.shape[1] :].any()
