"""`hf_attn.hybridize`: per-head global and local attention in Llama, Qwen2, Qwen3, Mistral, Gemma 3 and GPT-2 models.

References: the unmodified model (an all-global layout), and the model itself running a naive attention function
written here from the papers' definitions (tests/naive.py), registered in transformers' attention interface.
"""

import copy
import itertools
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import transformers
from huggingface_hub import ModelCard
from naive import naive_attention
from test_masks import shared_prefix_batch
from torch._dynamo.testing import CompileCounter
from transformers import (
    AutoModelForCausalLM,
    BertConfig,
    BertModel,
    DynamicCache,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    StaticCache,
    Trainer,
    TrainingArguments,
)
from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import AttentionInterface

import hf_attn
from hf_attn import HfAttnCache, hybridize
from hf_attn.cache_hf_attn import HfAttnDynamicCache
from hf_attn.hybrid_attention import MAX_QUERIES_FOR_ONE_MASK
from hf_attn.visibility_hf_attn import Visibility, local_visible

VOCAB = 97
NO_SPECIAL_TOKENS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)


def tiny(family: str, seed: int = 0):
    """A tiny model of `family`, random weights; grouped-query attention wherever the family has it."""
    torch.manual_seed(seed)
    shared = dict(vocab_size=VOCAB, num_hidden_layers=2, max_position_embeddings=64, **NO_SPECIAL_TOKENS)
    decoder = dict(hidden_size=64, intermediate_size=96, num_attention_heads=8, **shared)
    if family == "llama":
        return LlamaForCausalLM(LlamaConfig(num_key_value_heads=2, **decoder)).eval()
    if family == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(num_key_value_heads=4, **decoder)).eval()
    if family == "mistral":
        return MistralForCausalLM(MistralConfig(num_key_value_heads=2, sliding_window=None, **decoder)).eval()
    if family == "qwen3":  # RMS norms on queries and keys, before the cache
        return Qwen3ForCausalLM(Qwen3Config(num_key_value_heads=2, head_dim=8, **decoder)).eval()
    if family == "gemma3_text":  # query and key norms, scores scaled by 1/sqrt(query_pre_attn_scalar), a sliding
        # layer whose window (32) holds these tests' texts: a window that binds has tests of its own
        config = Gemma3TextConfig(num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=20, sliding_window=32,
                                  layer_types=["sliding_attention", "full_attention"], **decoder)  # fmt: skip
        return Gemma3ForCausalLM(config).eval()
    return GPT2LMHeadModel(GPT2Config(n_embd=64, n_head=8, n_layer=2, n_positions=64, vocab_size=VOCAB,
                                      **NO_SPECIAL_TOKENS)).eval()  # fmt: skip


FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma3_text", "gpt2")
# Mixed per layer, whole key/value groups local (8 query heads over 2: heads 4-7 share the second) and split ones.
LAYOUT = [["global"] * 4 + ["local"] * 4, ["local", "global", "local", "local", "local", "local", "global", "local"]]


def batch(seed: int = 1, length: int = 12):
    """Two rows, the first left-padded by 3."""
    torch.manual_seed(seed)
    ids = torch.randint(0, VOCAB, (2, length))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    return ids, mask


# --- a naive reference, registered as another attention function ------------------------------------------------

NAIVE = "hf_attn_test_naive"
NAIVE_LAYOUT = {}  # what the naive function reads: "layout", "local_window", "attend_to_self"


def naive_layer_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Every query head through `naive_attention` with its kind's visibility; query head h reads key/value head
    h // (heads per key/value head). Padding is the keys no query of the mask sees (causal order is naive's own). A
    layer the model slides a window of W tokens over (its `sliding_window` argument, counting the query) shows every
    head at most the W - 1 tokens before the query. Returns the weights too, as transformers' eager attention does."""
    kinds = NAIVE_LAYOUT["layout"][module.layer_idx]
    group = query.shape[1] // key.shape[1]
    key_mask = None if attention_mask is None else attention_mask[:, 0].bool().any(-2)
    model_window = None if kwargs.get("sliding_window") is None else kwargs["sliding_window"] - 1
    outputs, weights = [], []
    for h, kind in enumerate(kinds):
        local = kind == "local"
        windows = [w for w in (model_window, NAIVE_LAYOUT["local_window"] if local else None) if w is not None]
        out, head_weights = naive_attention(
            query[:, h : h + 1], key[:, h // group : h // group + 1], value[:, h // group : h // group + 1],
            is_causal=True, attend_to_self=NAIVE_LAYOUT["attend_to_self"] or not local,
            local_window=min(windows, default=None), key_mask=key_mask, scale=scaling,
        )  # fmt: skip
        outputs.append(out.to(query.dtype))
        weights.append(head_weights.to(query.dtype))
    return torch.cat(outputs, dim=1).transpose(1, 2), torch.cat(weights, dim=1)


AttentionInterface.register(NAIVE, naive_layer_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAIVE, sdpa_mask)


def naive_twin(model, layout, local_window: int, attend_to_self: bool):
    twin = copy.deepcopy(model)
    twin.set_attn_implementation(NAIVE)
    NAIVE_LAYOUT.update(layout=layout, local_window=local_window, attend_to_self=attend_to_self)
    return twin


# --- exactness ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_an_all_global_layout_gives_the_original_logits(family):
    model = tiny(family)
    ids, mask = batch()
    expected = model(ids, attention_mask=mask).logits
    hybrid = hybridize(model)
    assert hybrid is model and hybrid.config.model_type == f"hf_attn_{family}"
    torch.testing.assert_close(hybrid(ids, attention_mask=mask).logits, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attend_to_self", [True, False])
@pytest.mark.parametrize("padded", [False, True])
def test_local_heads_equal_a_naive_reference(family, attend_to_self, padded):
    model = tiny(family)
    twin = naive_twin(model, LAYOUT, local_window=2, attend_to_self=attend_to_self)
    hybrid = hybridize(model, head_layout=LAYOUT, local_window=2, attend_to_self=attend_to_self)
    ids, mask = batch(length=24)
    assert ids.shape[1] > MAX_QUERIES_FOR_ONE_MASK  # unpadded, the local heads run the banded kernel
    mask = mask if padded else torch.ones_like(mask)
    expected = twin(ids, attention_mask=mask).logits
    torch.testing.assert_close(hybrid(ids, attention_mask=mask).logits, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_output_attentions_gives_the_weights_of_the_naive_reference(family):
    model = tiny(family)
    twin = naive_twin(model, LAYOUT, local_window=2, attend_to_self=False)
    hybrid = hybridize(model, head_layout=LAYOUT, local_window=2, attend_to_self=False)
    ids, mask = batch(length=24)
    expected = twin(ids, attention_mask=mask, output_attentions=True).attentions
    out = hybrid(ids, attention_mask=mask, output_attentions=True)
    assert len(out.attentions) == len(expected) == 2
    for got, reference in zip(out.attentions, expected, strict=True):
        torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.logits, hybrid(ids, attention_mask=mask).logits, rtol=1e-5, atol=1e-5)


def test_a_decoding_step_weighs_the_keys_as_the_whole_sequence_does():
    """With the cache, key/value heads of local heads alone keep 2 tokens: older keys weigh 0, as in the whole
    sequence."""
    model = hybridize(tiny("llama"), head_layout=LAYOUT, local_window=2)
    ids = batch(length=21)[0]
    cache = HfAttnCache(model.config)
    model(ids[:, :20], cache=cache)
    step = model(ids[:, 20:], cache=cache, output_attentions=True).attentions
    whole = model(ids, use_cache=False, output_attentions=True).attentions
    for got, expected in zip(step, whole, strict=True):
        torch.testing.assert_close(got, expected[..., -1:, :], rtol=1e-5, atol=1e-6)


def test_local_heads_change_the_logits_and_only_beyond_the_window():
    """Positions whose whole past fits in the window see what global heads see; later ones do not."""
    model = tiny("llama")
    ids, _ = batch()
    expected = model(ids).logits
    logits = hybridize(model, num_local_heads=8, local_window=3)(ids).logits
    torch.testing.assert_close(logits[:, :4], expected[:, :4], rtol=1e-5, atol=1e-5)  # positions 0..3: all seen
    assert (logits[:, 4:] - expected[:, 4:]).abs().amax(dim=-1).min() > 1e-4


# --- the layout and its cache -------------------------------------------------------------------------------------


def test_num_local_heads_makes_the_last_heads_local_and_whole_groups_cache_a_window():
    model = hybridize(tiny("llama"), num_local_heads=[4, 6], local_window=2)
    assert model.config.head_layout == [["global"] * 4 + ["local"] * 4, ["global"] * 2 + ["local"] * 6]
    # 8 query heads read 2 key/value heads, 4 each: the second group is all local in both layers.
    assert model.config.kv_head_layout == [["global", "local"], ["global", "local"]]
    assert hybridize(model, num_local_heads=3).config.kv_head_layout == [["global", "global"]] * 2  # 5-7 share with 4


def test_the_cache_keeps_every_token_of_global_groups_and_the_window_of_local_ones():
    model = hybridize(tiny("llama"), num_local_heads=4, local_window=2)
    ids, _ = batch(length=20)
    cache = model(ids, use_cache=True).past_key_values
    assert isinstance(cache, HfAttnCache)
    for layer in cache.layers:
        tensors = layer.tensors()
        assert tensors["global_keys"].shape == (2, 1, 20, 8) and tensors["local_keys"].shape == (2, 1, 2, 8)
    dynamic = DynamicCache(config=tiny("llama").config)
    tiny("llama")(ids, cache=dynamic, use_cache=True)
    dynamic_bytes = sum(t.nbytes for layer in dynamic.layers for t in (layer.keys, layer.values))
    assert cache.memory_bytes() < dynamic_bytes


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padded", [False, True])
def test_decoding_with_the_cache_gives_the_logits_of_the_whole_sequence(family, padded):
    model = hybridize(tiny(family), head_layout=LAYOUT, local_window=2)
    ids, mask = batch(length=26)
    mask = mask if padded else torch.ones_like(mask)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    expected = model(ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
    cache = HfAttnCache(model.config)
    steps = [(0, 20), (20, 22), (22, 23), (23, 26)]  # a prefill (banded kernel unpadded), then 2, 1 and 3 tokens
    for start, end in steps:
        logits = model(ids[:, start:end], attention_mask=mask[:, :end], position_ids=positions[:, start:end],
                       cache=cache).logits  # fmt: skip
        torch.testing.assert_close(logits, expected[:, start:end], rtol=1e-5, atol=1e-5)


def sliding(family: str, window: int = 6):
    """The tiny model of `family` with a sliding window of `window` tokens (the query included) that binds: Mistral
    slides it over every layer, Gemma 3 over its first (its `layer_types`), this Qwen2 over its second only
    (`max_window_layers=1`)."""
    base = tiny(family)
    fields = {**base.config.to_dict(), "sliding_window": window}
    if family == "qwen2":
        fields.update(use_sliding_window=True, max_window_layers=1, layer_types=None)
    torch.manual_seed(0)
    model = type(base)(type(base.config)(**fields)).eval()
    model.load_state_dict(base.state_dict())
    return model


SLIDING_LAYERS = {"mistral": [True, True], "qwen2": [False, True], "gemma3_text": [True, False]}


@pytest.mark.parametrize("family", SLIDING_LAYERS)
@pytest.mark.parametrize("max_cache_len", [None, 26], ids=["dynamic", "static"])
def test_a_model_with_its_own_sliding_window_caches_no_more_than_that_window(family, max_cache_len):
    model = hybridize(sliding(family), head_layout=LAYOUT, local_window=2)
    ids, mask = batch(length=26)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    expected = model(ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
    cache = HfAttnCache(model.config, max_cache_len=max_cache_len)
    for start, end in [(0, 20), (20, 22), (22, 23), (23, 26)]:
        logits = model(ids[:, start:end], attention_mask=mask[:, :end], position_ids=positions[:, start:end],
                       cache=cache).logits  # fmt: skip
        torch.testing.assert_close(logits, expected[:, start:end], rtol=1e-5, atol=1e-5)
    for layer, slides in zip(cache.layers, SLIDING_LAYERS[family], strict=True):
        kept = {name: tensor.shape[-2] for name, tensor in layer.tensors().items()}
        assert kept["global_keys"] == (5 if slides else 26)  # the model's window counts the query
        assert kept.get("local_keys", 2) == 2  # where a key/value head is local's alone


@pytest.mark.parametrize("family", SLIDING_LAYERS)
@pytest.mark.parametrize("local_window", [2, 8])
@pytest.mark.parametrize("padded", [False, True])
def test_every_head_of_a_sliding_layer_keeps_the_model_window(family, local_window, padded):
    """A window of 6 tokens: in a sliding layer global heads see the 5 before the query and local heads the nearer of
    their own k and those 5 (k = 8 is bounded by the model's window), as the naive reference has it."""
    model = sliding(family)
    twin = naive_twin(model, LAYOUT, local_window=local_window, attend_to_self=True)
    hybrid = hybridize(model, head_layout=LAYOUT, local_window=local_window)
    ids, mask = batch(length=24)
    mask = mask if padded else torch.ones_like(mask)
    expected = twin(ids, attention_mask=mask).logits
    torch.testing.assert_close(hybrid(ids, attention_mask=mask).logits, expected, rtol=1e-4, atol=1e-5)


# --- generate ----------------------------------------------------------------------------------------------------


def greedy_by_recomputing(model, ids, mask, new_tokens: int):
    """Greedy decoding written out: the whole sequence again at every step, no cache."""
    for _ in range(new_tokens):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
        following = logits[:, -1].argmax(-1, keepdim=True)
        ids, mask = torch.cat([ids, following], 1), torch.cat([mask, torch.ones_like(following)], 1)
    return ids


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generate_with_left_padding_equals_recomputing(family):
    model = hybridize(tiny(family), head_layout=LAYOUT, local_window=2)
    ids, mask = batch()
    generated = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(generated, greedy_by_recomputing(model, ids, mask, 8))


@pytest.mark.parametrize("options", [dict(num_beams=3), dict(do_sample=True, top_k=5)], ids=["beam", "sample"])
def test_beam_search_and_sampling_with_the_cache_equal_them_without(options):
    model = hybridize(tiny("qwen2"), head_layout=LAYOUT, local_window=2)
    ids, mask = batch()
    runs = []
    for use_cache in (True, False):
        torch.manual_seed(0)
        runs.append(model.generate(ids, attention_mask=mask, max_new_tokens=6, pad_token_id=0, use_cache=use_cache,
                                   **options))  # fmt: skip
    assert torch.equal(*runs)


@pytest.mark.parametrize("family", FAMILIES)
def test_static_cache_generate_equals_recomputing(family):
    """`cache_implementation="static"` gives a static `HfAttnCache`: fixed slots up to `max_cache_len` for key/value
    heads a global head reads (the empty ones after the newest token), k for those only local heads read."""
    model = hybridize(tiny(family), head_layout=LAYOUT, local_window=2)
    ids, mask = batch()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0,
                         cache_implementation="static", return_dict_in_generate=True)  # fmt: skip
    assert isinstance(out.cache, HfAttnCache) and isinstance(out.cache, StaticCache) and out.cache.is_compileable
    assert torch.equal(out.sequences, greedy_by_recomputing(model, ids, mask, 8))
    tensors = out.cache.layers[0].tensors()
    assert tensors["global_keys"].shape[-2] == 19 and tensors["local_keys"].shape[-2] == 2  # 12 + 8 - 1 tokens


@pytest.mark.parametrize("cache", ["static", "dynamic"])
@pytest.mark.parametrize("sliding_window", [None, 6])
def test_a_cache_the_user_makes_decodes_as_recomputing(cache, sliding_window):
    """Strict local heads (k = 2, not themselves) in a Mistral, with or without its own sliding window (6, shorter
    than the text: transformers' static cache then keeps 6 slots and rolls them)."""
    base = tiny("mistral")
    base.config.sliding_window = sliding_window
    model = hybridize(base, head_layout=LAYOUT, local_window=2, attend_to_self=False)
    ids, mask = batch()
    made = StaticCache(config=model.config, max_cache_len=20) if cache == "static" else DynamicCache()
    generated = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0,
                               cache=made)  # fmt: skip
    assert torch.equal(generated, greedy_by_recomputing(model, ids, mask, 8))


def test_local_heads_count_their_window_along_the_mask():
    """Brute force: per query, the keys the mask lets it see, in order; the last of them stands for the query itself.
    A local head keeps the last k + 1 (itself and the k before), or, strict, the k before itself."""
    torch.manual_seed(0)
    mask = torch.rand(3, 1, 5, 9) < 0.6
    for attend_to_self in (True, False):
        expected = torch.zeros_like(mask)
        for b, t in itertools.product(range(3), range(5)):
            seen = mask[b, 0, t].nonzero().flatten().tolist()
            expected[b, 0, t, seen[-3:] if attend_to_self else seen[-3:-1]] = True
        assert torch.equal(local_visible(mask, Visibility(True, attend_to_self, local_window=2)), expected)


def test_compiled_decoding_with_a_static_cache_equals_eager():
    """`generate` through `torch.compile(model.forward, fullgraph=True)` with a static cache: any graph break is an
    error."""
    model = hybridize(tiny("llama"), head_layout=LAYOUT, local_window=2)
    ids, mask = batch()
    options = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    expected = model.generate(ids, **options)
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, fullgraph=True, backend="eager")
    assert torch.equal(model.generate(ids, cache_implementation="static", **options), expected)


@pytest.mark.parametrize("family", FAMILIES)
def test_compiled_static_decoding_compiles_the_prompt_once_and_every_step_once(family):
    """As transformers compiles (`dynamic=False`), with sinks: the static `HfAttnCache` places keys by tensors, not
    Python numbers, so 10 decoding steps share one graph; the prompt, another shape, is the other one."""
    model = hybridize(tiny(family), head_layout=LAYOUT, local_window=2, sink_tokens=1)
    ids, mask = batch()
    options = dict(attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    expected = greedy_by_recomputing(model, ids, mask, 10)
    torch._dynamo.reset()
    counter = CompileCounter()
    model.forward = torch.compile(model.forward, fullgraph=True, backend=counter, dynamic=False)
    assert torch.equal(model.generate(ids, cache_implementation="static", **options), expected)
    assert counter.frame_count == 2


def test_exported_with_transformers_recipe_decodes_the_logits_of_the_whole_sequence():
    """torch.export through `TorchExportableModuleForDecoderOnlyLM` (what ExecuTorch lowers): a static cache, one
    token per call."""
    model = hybridize(tiny("llama"), head_layout=LAYOUT, local_window=2)
    model.generation_config.cache_implementation = "static"
    ids = batch(length=10)[0][1:]
    expected = model(ids, use_cache=False).logits
    exportable = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=16)
    decoder = exportable.export(input_ids=ids[:, :1], cache_position=torch.tensor([0])).module()
    logits = [decoder(input_ids=ids[:, t : t + 1], cache_position=torch.tensor([t])) for t in range(ids.shape[1])]
    torch.testing.assert_close(torch.cat(logits, dim=1), expected, rtol=1e-5, atol=1e-5)


def test_caches_hybridized_models_cannot_use_are_refused_naming_the_allowed_ones():
    model = hybridize(tiny("llama"), num_local_heads=4)
    ids = batch()[0]
    with pytest.raises(ValueError, match=r"'offloaded' is not supported by hybridized models yet; allowed: None"):
        model.generate(ids, max_new_tokens=2, pad_token_id=0, cache_implementation="offloaded")


# --- saving, loading, training -----------------------------------------------------------------------------------


TASK_HEADS = ("AutoModelForSequenceClassification", "AutoModelForTokenClassification", "AutoModelForQuestionAnswering")


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("auto_name", TASK_HEADS)
def test_task_heads_hybridize_and_load_back_with_their_auto_class(family, auto_name, tmp_path):
    config = tiny(family).config
    config.pad_token_id, config.num_labels = 0, 3
    torch.manual_seed(0)
    auto_class = getattr(transformers, auto_name)
    model = auto_class.from_config(config).eval()
    ids, mask = batch()
    expected = model(ids, attention_mask=mask)[0]
    torch.testing.assert_close(hybridize(model)(ids, attention_mask=mask)[0], expected, rtol=0, atol=1e-6)
    hybridize(model, head_layout=LAYOUT, local_window=2)
    local = model(ids, attention_mask=mask)[0]
    assert not torch.allclose(local, expected, atol=1e-3)
    model.save_pretrained(tmp_path)
    loaded = auto_class.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model) and loaded.config.head_layout == LAYOUT
    torch.testing.assert_close(loaded(ids, attention_mask=mask)[0], local)


def test_save_pretrained_and_from_pretrained_give_the_same_model(tmp_path):
    model = hybridize(tiny("mistral"), head_layout=LAYOUT, local_window=3, attend_to_self=False)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "hf_attn_mistral" and saved["head_layout"] == LAYOUT
    assert (saved["local_window"], saved["attend_to_self"]) == (3, False)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded) is type(model) and loaded.config._attn_implementation == "hf_attn_hybrid"
    ids, mask = batch()
    torch.testing.assert_close(loaded(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)


REMOTE_LOAD = textwrap.dedent(
    """
    import sys
    sys.modules["hf_attn"] = None  # only the code saved beside the weights can load the model
    import torch
    from transformers import AutoModel, AutoModelForCausalLM
    ids = torch.load(sys.argv[1])
    outputs = {}
    for folder in sys.argv[3:]:
        model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
        base = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
        with torch.no_grad():
            outputs[folder] = (model(ids).logits, base(ids).last_hidden_state)
    torch.save(outputs, sys.argv[2])
    """
)


def test_a_saved_hybridized_model_loads_with_trust_remote_code_where_hf_attn_is_not_installed(tmp_path):
    """A Llama and a Gemma 3 whose sliding window binds, each with a causal LM head and as a base model, in a Python
    where `import hf_attn` fails: the same logits and hidden states as the model that was saved."""
    ids = batch(length=20)[0]
    torch.save(ids, tmp_path / "ids.pt")
    expected, folders = {}, []
    for family, model in (("llama", tiny("llama")), ("gemma3_text", sliding("gemma3_text"))):
        hybridize(model, head_layout=LAYOUT, local_window=2)
        folder = tmp_path / family
        model.save_pretrained(folder)
        config_class, model_classes = hf_attn.hybrid.HYBRID_TYPES[family]
        classes = {"AutoConfig": config_class, **model_classes}
        auto_map = {auto: f"hybrid.{cls.__name__}" for auto, cls in classes.items()}
        assert json.loads((folder / "config.json").read_text())["auto_map"] == auto_map
        assert {"hybrid.py", "hybrid_attention.py", "attention_hf_attn.py"} <= {p.name for p in folder.iterdir()}
        with torch.no_grad():
            expected[str(folder)] = (model(ids).logits, model.model(ids).last_hidden_state)
        folders.append(str(folder))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    command = [sys.executable, "-c", REMOTE_LOAD, str(tmp_path / "ids.pt"), str(tmp_path / "out.pt"), *folders]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = torch.load(tmp_path / "out.pt")
    for folder, (logits, hidden) in expected.items():
        torch.testing.assert_close(loaded[folder][0], logits, rtol=0, atol=0)
        torch.testing.assert_close(loaded[folder][1], hidden, rtol=0, atol=0)


def test_trainer_fine_tunes_a_hybridized_model(tmp_path):
    model = hybridize(tiny("llama"), num_local_heads=4, local_window=2)
    torch.manual_seed(0)
    rows = [{"input_ids": row, "labels": row} for row in torch.randint(0, VOCAB, (32, 16))]
    args = TrainingArguments(tmp_path, max_steps=6, per_device_train_batch_size=8, learning_rate=1e-2, use_cpu=True,
                             report_to="none", save_strategy="no", logging_steps=1)  # fmt: skip
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = Trainer(model=model, args=args, train_dataset=rows)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses[-1] < losses[0]
    assert all(not torch.equal(p, before[name]) for name, p in model.named_parameters())
    assert type(trainer.model).__name__ == "HfAttnLlamaForCausalLM"


# --- refusals ----------------------------------------------------------------------------------------------------


class RenamedLlama(LlamaForCausalLM):
    """A class of the user's: hybridize cannot know what it changes."""


@pytest.mark.parametrize(
    "make,arguments,message",
    [
        (
            lambda: BertModel(
                BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
            ),
            {},
            "hybridize supports the model types",
        ),  # fmt: skip
        (lambda: RenamedLlama(tiny("llama").config), {}, "LlamaForSequenceClassification"),
        (lambda: tiny("llama"), dict(head_layout=LAYOUT, num_local_heads=2), "not both"),
        (lambda: tiny("llama"), dict(num_local_heads=9), "`num_local_heads` must be an int in 0..8"),
        (lambda: tiny("llama"), dict(head_layout=[["global"] * 8]), "one list per layer (2), got 1"),
        (lambda: tiny("llama"), dict(head_layout=[["global"] * 7, ["global"] * 8]), "layers [0] do not"),
        (
            lambda: tiny("llama"),
            dict(head_layout=[["sliding"] * 8] * 2),
            "allowed kinds: ['global', 'local', 'positional']",
        ),
        (lambda: tiny("llama"), dict(num_local_heads=2, local_window=0), "`local_window` must be an int >= 1"),
    ],
)
def test_bad_input_is_refused_naming_what_is_allowed(make, arguments, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        hybridize(make(), **arguments)


def test_attn_implementation_takes_sdpa_and_eager_and_refuses_the_others():
    """`eager` writes every head out (tests/test_half_precision.py compares it with `sdpa`); a model loaded eager
    stays eager once hybridized; anything else is refused in transformers' words."""
    model = hybridize(tiny("llama"), num_local_heads=4)
    assert model.config._attn_implementation == "hf_attn_hybrid"
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "hf_attn_hybrid_eager"
    eager = tiny("llama")
    eager.set_attn_implementation("eager")
    assert hybridize(eager, num_local_heads=4).config._attn_implementation == "hf_attn_hybrid_eager"
    for implementation in ("foo", "flex_attention"):
        expected = f'Specified `attn_implementation="{implementation}"` is not supported. The only possible arguments '
        allowed = 'are `attn_implementation="sdpa"`, `attn_implementation="eager"`'
        with pytest.raises(ValueError, match=re.escape(expected + allowed)):
            model.set_attn_implementation(implementation)


def test_import_registers_the_hybrid_types_with_the_auto_classes():
    for family in FAMILIES:
        config = hf_attn.hybrid.HYBRID_TYPES[family][0]
        assert AutoModelForCausalLM._model_mapping[config].__name__.startswith("HfAttn")


def test_save_pretrained_writes_a_card_naming_the_local_heads_and_push_to_hub_uploads_it(tmp_path, monkeypatch):
    from test_hub import StandInHub

    model = hybridize(tiny("llama"), head_layout=LAYOUT, local_window=2)
    model.save_pretrained(tmp_path / "saved")
    card = ModelCard.load(tmp_path / "saved" / "README.md")
    assert "hf_attn_llama" in card.data.tags and card.data.pipeline_tag == "text-generation"
    # layer 0: heads 4-7 local, so the second key/value head is kept as a window; layer 1: 6 local heads, 2 global
    # ones (heads 1 and 6) reading both key/value heads, so both are kept whole.
    assert "| 0 | 4 | 4 | 1 | 1 |" in card.text and "| 1 | 2 | 6 | 2 | 0 |" in card.text
    # 16-bit keys and values, head dim 8: 3 of the 4 key/value heads are kept whole against 4.
    assert "grows by 96 bytes per token in 16-bit precision, 0.75x the original model's 128" in card.text
    assert "AutoModelForCausalLM.from_pretrained" in card.text

    hub = StandInHub(tmp_path / "hub")
    monkeypatch.setattr(hf_attn.hub, "HfApi", hub)
    model.push_to_hub("me/tiny-hybrid", token="hf_stand_in")
    assert hub.uploaded == ["me/tiny-hybrid"]
    pushed = hub.root / "me/tiny-hybrid"
    pushed_card = ModelCard.load(pushed / "README.md").text
    assert 'from_pretrained("me/tiny-hybrid")' in pushed_card
    assert 'from_pretrained("me/tiny-hybrid", trust_remote_code=True)' in pushed_card
    assert {"hybrid.py", "hybrid_attention.py"} <= {path.name for path in pushed.iterdir()}
    loaded = AutoModelForCausalLM.from_pretrained(pushed)
    ids, mask = batch()
    torch.testing.assert_close(loaded(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)


def test_generate_continues_from_the_cache_it_returned():
    model = hybridize(tiny("llama"), head_layout=LAYOUT, local_window=2)
    ids, mask = batch()
    options = dict(do_sample=False, pad_token_id=0)
    whole = model.generate(ids, attention_mask=mask, max_new_tokens=10, **options)
    first = model.generate(ids, attention_mask=mask, max_new_tokens=5, return_dict_in_generate=True, **options)
    assert type(first.cache) is HfAttnDynamicCache
    mask = torch.cat([mask, torch.ones_like(mask[:, :5])], dim=1)
    rest = model.generate(first.sequences, attention_mask=mask, cache=first.cache, max_new_tokens=5, **options)
    assert torch.equal(rest, whole)


@pytest.mark.parametrize("family", FAMILIES)
def test_assisted_and_prompt_lookup_decoding_equal_greedy_decoding(family):
    """Both crop the cache after rejected draft tokens, windows of local heads included; assisted decoding from a
    static cache too, whose windows keep room for the drafts."""
    model = hybridize(tiny(family), head_layout=LAYOUT, local_window=2)
    assistant = hybridize(tiny(family, seed=1), num_local_heads=8, local_window=1)
    ids = batch(length=10)[0][1:]
    options = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    greedy = model.generate(ids, **options)
    assert torch.equal(model.generate(ids, assistant_model=assistant, **options), greedy)
    assert torch.equal(model.generate(ids, prompt_lookup_num_tokens=3, **options), greedy)
    assert torch.equal(model.generate(ids, assistant_model=assistant, cache_implementation="static", **options), greedy)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_custom_4d_mask_gives_the_logits_of_separate_sequences(family):
    """transformers' custom 4D mask case: three sequences sharing a prefix, packed into one row whose last three tokens
    do not see each other; local heads count their window along the mask."""
    model = hybridize(tiny(family), head_layout=LAYOUT, local_window=2, sink_tokens=1)
    separate, packed, visible, positions = shared_prefix_batch()
    with torch.no_grad():
        expected = model(separate, use_cache=False).logits[:, -1]
        got = model(packed, attention_mask=visible, position_ids=positions, use_cache=False).logits[0, 3:]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_the_docs_cache_table_is_what_the_layouts_give():
    """docs/hybrid.md's bytes per token of a Llama-3.2-1B-shaped config, per number of local heads per layer."""
    config_class = hf_attn.hybrid.HYBRID_TYPES["llama"][0]
    page = (Path(__file__).parents[1] / "docs" / "hybrid.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (\d+) \| ([\d,]+) \| ([\d.]+) \|$", page, flags=re.MULTILINE)
    assert len(rows) == 7
    for local, kept, per_token, ratio in rows:
        layout = [["global"] * (32 - int(local)) + ["local"] * int(local)] * 16
        config = config_class(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                              head_dim=64, head_layout=layout)  # fmt: skip
        computed = hf_attn.hybrid.cache_bytes_per_token(config)
        assert config.kv_head_layout[0].count("global") == int(kept) and computed == int(per_token.replace(",", ""))
        assert f"{computed / hf_attn.hybrid.original_cache_bytes_per_token(config):.2f}" == ratio


def test_gradient_checkpointing_gives_the_same_gradients():
    model = hybridize(tiny("llama"), head_layout=LAYOUT, local_window=2).train()  # Llama has no dropout
    ids, mask = batch(length=24)
    gradients = []
    for checkpointing in (False, True):
        if checkpointing:
            model.gradient_checkpointing_enable()
        model.zero_grad()
        model(ids, attention_mask=mask, labels=ids).loss.backward()
        gradients.append({name: p.grad.clone() for name, p in model.named_parameters()})
    for name, expected in gradients[0].items():
        torch.testing.assert_close(gradients[1][name], expected, rtol=1e-5, atol=1e-6, msg=name)


def test_lora_fine_tunes_a_hybridized_model_and_merges_back():
    from peft import LoraConfig, get_peft_model

    model = hybridize(tiny("llama"), head_layout=LAYOUT, local_window=2)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    ids, mask = batch()
    loss = peft_model(input_ids=ids, attention_mask=mask, labels=ids).loss
    loss.backward()
    trained = [name for name, p in peft_model.named_parameters() if p.grad is not None]
    assert trained and all("lora_" in name for name in trained)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_()
    expected = peft_model(input_ids=ids, attention_mask=mask).logits
    merged = peft_model.merge_and_unload()
    assert type(merged).__name__ == "HfAttnLlamaForCausalLM"
    torch.testing.assert_close(merged(ids, attention_mask=mask).logits, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("padded", [False, True])
def test_the_forward_compiles_as_one_graph(padded):
    """No graph break in hybrid_attention or the layer bookkeeping (aot_eager: traced, not code-generated)."""
    torch._dynamo.reset()
    model = hybridize(tiny("llama"), head_layout=LAYOUT, local_window=2)
    ids, mask = batch()
    mask = mask if padded else torch.ones_like(mask)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    expected = model(ids, attention_mask=mask, use_cache=False).logits
    torch.testing.assert_close(compiled(input_ids=ids, attention_mask=mask, use_cache=False).logits, expected)
