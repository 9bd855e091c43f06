"""Cached decoding gives the tokens of recomputing the whole prefix; the cache keeps only what each kind needs."""

import copy
import io

import pytest
import torch
from conftest import MODEL_TYPES, tiny_config
from transformers import AutoModelForCausalLM

from hf_attn.cache_layers_hf_attn import MIN_GROWTH

PAD = 2


def left_padded_prompts():
    prompts = [torch.randint(3, 37, (n,)) for n in (7, 3, 5)]
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), PAD)
    attention_mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = prompt
        attention_mask[row, width - len(prompt) :] = 1
    return prompts, input_ids, attention_mask


def greedy_by_recomputing(model, input_ids, attention_mask, steps: int) -> torch.Tensor:
    """The reference: a full forward over the whole prefix for every new token, no cache."""
    for _ in range(steps):
        with torch.no_grad():
            logits = model(input_ids, attention_mask=attention_mask, use_cache=False).logits[:, -1]
        input_ids = torch.cat([input_ids, logits.argmax(-1, keepdim=True)], dim=1)
        attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
    return input_ids


def generation_model(model_type: str, **overrides):
    # Larger init so that logits are far apart and greedy choices are never near-ties.
    config = tiny_config(model_type, initializer_range=0.3, eos_token_id=None, **overrides)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"position_embedding_type": "rope", "attend_to_self": True, "local_window": 1},
        {"position_embedding_type": "rope", "content_qk_dim": 12},  # queries and keys wider than values
    ],
)
def test_cached_generation_equals_recomputing_the_prefix(model_type, overrides):
    model = generation_model(model_type, **overrides)
    _, input_ids, attention_mask = left_padded_prompts()
    expected = greedy_by_recomputing(model, input_ids, attention_mask, steps=12)
    cached = model.generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=12, do_sample=False, pad_token_id=PAD
    )
    assert torch.equal(cached, expected)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_left_padded_batch_generates_what_each_prompt_generates_alone(model_type):
    model = generation_model(model_type)
    prompts, input_ids, attention_mask = left_padded_prompts()
    batch = model.generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=8, do_sample=False, pad_token_id=PAD
    )
    for row, prompt in enumerate(prompts):
        alone = model.generate(prompt[None], max_new_tokens=8, do_sample=False, pad_token_id=PAD)
        assert torch.equal(batch[row, -8:], alone[0, -8:])


def cache_after(model, length: int):
    with torch.no_grad():
        return model(torch.randint(3, 37, (2, length)), use_cache=True).cache


def test_local_only_cache_stays_the_same_size_as_the_context_grows():
    model = generation_model("local_gpt2", local_window=3)
    sizes = {length: cache_after(model, length).memory_bytes() for length in (5, 20, 60)}
    assert len(set(sizes.values())) == 1, sizes
    cached = cache_after(model, 60).layers[0].tensors()
    assert set(cached) == {"local_keys", "local_values"} and cached["local_keys"].shape[-2] == 3


def test_cache_keeps_per_kind_what_the_kind_needs():
    layout = ["global", "local", "positional", "positional"]
    model = generation_model("hybrid_gpt2", head_layout=[layout, layout], local_window=2)
    cached = cache_after(model, 10).layers[1].tensors()
    assert cached["global_keys"].shape == cached["global_values"].shape == (2, 1, 10, 8)
    assert cached["local_keys"].shape == cached["local_values"].shape == (2, 1, 2, 8)
    assert cached["positional_values"].shape == (2, 2, 10, 8) and "positional_keys" not in cached
    assert cache_after(model, 20).memory_bytes() > cache_after(model, 10).memory_bytes()


def test_cached_tensors_hold_only_their_own_tokens():
    """No cached tensor may be a view that keeps the whole prefill's projection (or a longer concat) alive: local
    keys and values hold their window exactly, the others their tokens plus the room to grow by."""
    layout = ["global", "local", "positional", "positional"]
    model = generation_model("hybrid_gpt2", head_layout=[layout, layout], local_window=2)
    cache = cache_after(model, 60)
    with torch.no_grad():
        cache = model(torch.randint(3, 37, (2, 1)), cache=cache, use_cache=True).cache
    for layer in cache.layers:
        for name, tensor in layer.tensors().items():
            held_tokens = tensor.untyped_storage().nbytes() // (tensor.numel() // tensor.shape[-2] * 4)
            assert held_tokens == 2 if name.startswith("local") else 61 <= held_tokens <= 61 + MIN_GROWTH, name
            assert tensor.shape[-2] == (2 if name.startswith("local") else 61), name
    held = sum(t.untyped_storage().nbytes() for layer in cache.layers for t in layer.tensors().values())
    assert cache.memory_bytes() == held


def test_decoding_appends_to_the_cache_without_copying_its_past():
    """Every past token is kept in a buffer that grows geometrically: a decoding step writes one token in place."""
    model = generation_model("positional_gpt2")
    cache = cache_after(model, 20)
    buffers = {t.data_ptr() for layer in cache.layers for t in layer.tensors().values()}
    with torch.no_grad():
        for _ in range(5):
            cache = model(torch.randint(3, 37, (2, 1)), cache=cache, use_cache=True).cache
    assert {t.data_ptr() for layer in cache.layers for t in layer.tensors().values()} == buffers
    assert cache.get_seq_length() == 25


def test_cache_under_gradients_keeps_each_steps_graph():
    """With gradients recorded the cache concatenates: a backward through an earlier step still works."""
    model = generation_model("hybrid_gpt2")
    input_ids = torch.randint(3, 37, (2, 6))
    first = model(input_ids, use_cache=True)
    second = model(input_ids[:, :1], cache=first.cache, use_cache=True)
    (first.logits.sum() + second.logits.sum()).backward()
    assert all(p.grad is not None for p in model.transformer.h[0].attn.parameters())


def test_bidirectional_model_does_not_cache():
    model = generation_model("positional_gpt2", is_causal=False)
    assert cache_after(model, 5) is None


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_bidirectional_generation_recomputes_the_whole_sequence(model_type):
    """Each new token changes every earlier output of a bidirectional model: no step may reuse past work."""
    model = generation_model(model_type, is_causal=False)
    _, input_ids, attention_mask = left_padded_prompts()
    expected = greedy_by_recomputing(model, input_ids, attention_mask, steps=10)
    generated = model.generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=10, do_sample=False, pad_token_id=PAD
    )
    assert torch.equal(generated, expected)


def test_bidirectional_generation_from_embeddings_is_refused():
    model = generation_model("hybrid_gpt2", is_causal=False)
    embeds = model.get_input_embeddings()(torch.randint(3, 37, (1, 4)))
    with pytest.raises(ValueError, match="inputs_embeds.*is_causal"):
        model.generate(inputs_embeds=embeds, max_new_tokens=3, do_sample=False, pad_token_id=PAD)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_beam_search_reorders_the_cache(model_type):
    model = generation_model(model_type)
    _, input_ids, attention_mask = left_padded_prompts()
    kwargs = dict(attention_mask=attention_mask, max_new_tokens=6, num_beams=3, do_sample=False, pad_token_id=PAD)
    assert torch.equal(model.generate(input_ids, **kwargs), model.generate(input_ids, use_cache=False, **kwargs))


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_attentions_of_a_cached_step_are_the_last_row_of_the_full_ones(model_type):
    model = generation_model(model_type)
    _, input_ids, attention_mask = left_padded_prompts()
    with torch.no_grad():
        full = model(input_ids, attention_mask=attention_mask, output_attentions=True).attentions
        prefix = model(input_ids[:, :-1], attention_mask=attention_mask[:, :-1], use_cache=True)
        step = model(input_ids[:, -1:], attention_mask=attention_mask, cache=prefix.cache, output_attentions=True)
    for layer_full, layer_step in zip(full, step.attentions, strict=True):
        torch.testing.assert_close(layer_step, layer_full[:, :, -1:], atol=1e-5, rtol=1e-5)


def test_attention_mask_must_cover_cached_tokens():
    model = generation_model("local_gpt2")
    prefix = model(torch.randint(3, 37, (1, 5)), use_cache=True)
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.tensor([[4]]), attention_mask=torch.ones(1, 1), cache=prefix.cache)


def test_an_empty_foreign_cache_is_refused():
    from transformers import DynamicCache

    with pytest.raises(ValueError, match="HfAttnCache"):
        generation_model("hybrid_gpt2")(torch.tensor([[4, 5]]), cache=DynamicCache())


def positional_decoder(**overrides):
    return generation_model("positional_gpt2", positional_encoding="learned", positional_encoding_dim=16, **overrides)


def test_decoding_projects_only_the_new_positions():
    """A decoding step projects P at its query's position only; the keys of earlier positions are kept in the layer,
    not in the cache, which holds values only."""
    model = positional_decoder()
    projected_rows = []
    model.transformer.h[0].attn.p_attn.register_forward_hook(lambda m, i, o: projected_rows.append(i[0].shape[-2]))
    _, input_ids, attention_mask = left_padded_prompts()
    model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=12, do_sample=False, pad_token_id=PAD)
    assert projected_rows == [input_ids.shape[1]] + [1] * 11
    kept = model.transformer.h[0].attn.decoding_keys.keys
    assert input_ids.shape[1] + 11 <= kept.shape[1] <= 2 * (input_ids.shape[1] + 11)  # (H, positions, qk)


@pytest.mark.parametrize(
    "edit",
    [
        lambda model: model.transformer.h[0].attn.p_attn.weight.add_(0.5),  # as an optimizer does
        lambda model: model.transformer.h[0].attn.p_attn.weight.data.add_(0.5),  # the version counter does not move
        lambda model: model.transformer.wpp.weight.mul_(-1),  # learned P, changed in place
        lambda model: model.transformer.wpp.weight.data.mul_(-1),  # learned P, through `.data`
        lambda model: model.load_state_dict(positional_decoder().state_dict()),  # another model's weights
    ],
    ids=["p_attn_in_place", "p_attn_through_data", "learned_p_in_place", "learned_p_through_data", "load_state_dict"],
)
def test_kept_decoding_keys_follow_parameter_changes(edit):
    model = positional_decoder()
    _, input_ids, attention_mask = left_padded_prompts()
    generate = dict(attention_mask=attention_mask, max_new_tokens=10, do_sample=False, pad_token_id=PAD)
    model.generate(input_ids, **generate)  # keeps the keys of the positions reached
    with torch.no_grad():
        edit(model)
    expected = greedy_by_recomputing(model, input_ids, attention_mask, 10)
    assert torch.equal(model.generate(input_ids, **generate), expected)


def test_a_cache_filled_under_inference_mode_goes_on_under_no_grad():
    """Buffers made under torch.inference_mode cannot be written outside it: the cache copies them rather than fail."""
    model = generation_model("hybrid_gpt2", head_layout=[["global", "positional"] * 2] * 2)
    input_ids = torch.randint(3, 37, (2, 9))
    with torch.inference_mode():
        cache = model(input_ids[:, :8], use_cache=True).cache
    with torch.no_grad():
        step = model(input_ids[:, 8:], cache=cache, use_cache=True).logits[:, -1]
        whole = model(input_ids, use_cache=False).logits[:, -1]
    torch.testing.assert_close(step, whole, atol=1e-5, rtol=1e-5)


def test_a_model_that_has_decoded_pickles_and_copies():
    """`torch.save(model)` and `copy.deepcopy` work after generating; the copy decodes the same tokens."""
    model = positional_decoder()
    _, input_ids, attention_mask = left_padded_prompts()
    generate = dict(attention_mask=attention_mask, max_new_tokens=6, do_sample=False, pad_token_id=PAD)
    expected = model.generate(input_ids, **generate)
    saved = io.BytesIO()
    torch.save(model, saved)
    saved.seek(0)
    for copy_of_model in (torch.load(saved, weights_only=False), copy.deepcopy(model)):
        assert torch.equal(copy_of_model.generate(input_ids, **generate), expected)
