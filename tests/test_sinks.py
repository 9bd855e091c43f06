"""Attention sinks: local heads that also see the first `sink_tokens` tokens of their sequence, in hybridized models
(`hybridize(..., sink_tokens=S)`) and in hf_attn's own models (`sink_tokens` in the config).

References: `naive_attention` (tests/naive.py), which picks each query's keys from the definitions by plain loops, and
recomputing the whole sequence without a cache.
"""

import json

import pytest
import torch
from naive import naive_attention
from test_hybrid import LAYOUT, batch, greedy_by_recomputing, tiny
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import AttentionInterface

from hf_attn import HfAttnCache, hybridize
from hf_attn.attention_hf_attn import Visibility, local_attention
from hf_attn.cache_hf_attn import NO_TOKEN, SinkWindowLayer, StaticSinkWindowLayer
from hf_attn.head_kinds_hf_attn import HEAD_KINDS
from hf_attn.hybrid import cache_bytes_per_token, original_cache_bytes_per_token

SINKS, WINDOW = 3, 2

# --- the kernel --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_queries", [80, 50, 3])  # a whole sequence; a later prompt chunk; a few queries
@pytest.mark.parametrize("local_window", [1, 2, 16])
@pytest.mark.parametrize("is_causal,attend_to_self", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("autograd", [True, False])  # without it, chunks are written into one output as they come
def test_local_attention_with_sinks_equals_the_naive_reference(num_queries, local_window, is_causal, attend_to_self,
                                                               padded, autograd):  # fmt: skip
    torch.manual_seed(0)
    num_keys = 80  # chunks of 32 queries
    q = torch.randn(2, 6, num_queries, 8)  # 6 query heads over 3 key/value heads (grouped-query attention)
    k, v = torch.randn(2, 3, num_keys, 8), torch.randn(2, 3, num_keys, 8)
    key_mask = torch.ones(2, num_keys, dtype=torch.bool)
    if padded:
        key_mask[0, :5] = False  # row 0's sinks are keys 5, 6, 7
    visibility = Visibility(is_causal, attend_to_self, local_window, SINKS)
    with torch.set_grad_enabled(autograd):
        out = local_attention(q, k, v, visibility, key_mask if padded else None, scale=0.3)
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    expected, _ = naive_attention(q, k, v, is_causal, attend_to_self, local_window, key_mask if padded else None,
                                  scale=0.3, sink_tokens=SINKS)  # fmt: skip
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_sinks_change_what_a_local_head_computes_only_beyond_its_window():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 30, 8) for _ in range(3))
    without = local_attention(q, k, v, Visibility(True, True, WINDOW), None, scale=0.3)
    with_sinks = local_attention(q, k, v, Visibility(True, True, WINDOW, SINKS), None, scale=0.3)
    within = slice(0, WINDOW + 1)  # queries whose window holds the sinks
    torch.testing.assert_close(with_sinks[:, :, within], without[:, :, within], rtol=1e-6, atol=1e-6)
    assert (with_sinks[:, :, WINDOW + 1 :] - without[:, :, WINDOW + 1 :]).abs().amax(-1).min() > 1e-3


class NewStorages(TorchDispatchMode):
    """The bytes of every storage the ops run inside it make (`made`): views and in-place results of their inputs
    are not new."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[int, int]] = []  # (bytes, data pointer)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given:
                self.made.append((t.untyped_storage().nbytes(), t.untyped_storage().data_ptr()))
        return out


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("num_queries", [2048, 1000])  # a whole sequence; a prompt's second chunk after a cache
def test_local_attention_with_sinks_makes_nothing_the_size_of_the_sequence_per_head(padded, num_queries):
    """Beyond its output, every tensor the kernel makes is a chunk's, smaller than one head's keys: no mask, copy or
    index per head over the sequence (6 query heads over 2 key/value heads, read in place; the values are checked
    against the naive reference at a smaller size above)."""
    torch.manual_seed(0)
    batch, num_keys, dim = 2, 2048, 16
    q = torch.randn(batch, 6, num_queries, dim)
    k, v = torch.randn(batch, 2, num_keys, dim), torch.randn(batch, 2, num_keys, dim)
    key_mask = torch.ones(batch, num_keys, dtype=torch.bool)
    key_mask[0, :100] = False  # left padding: row 0's sinks are keys 100..103
    visibility = Visibility(True, True, 64, 4)
    with torch.inference_mode(), NewStorages() as storages:
        out = local_attention(q, k, v, visibility, key_mask if padded else None, scale=0.25)
    others = [size for size, pointer in storages.made if pointer != out.untyped_storage().data_ptr()]
    assert out.shape == q.shape and max(others) < num_keys * dim * k.element_size()  # one head's keys


# --- hybridized models -------------------------------------------------------------------------------------------

NAIVE_SINKS = "hf_attn_test_naive_sinks"
NAIVE_SINK_LAYOUT = {"layout": LAYOUT}  # the layout `naive_sink_attention` follows (a test may change it)


def naive_sink_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Every query head through `naive_attention`: global heads see every earlier key, local heads their window and
    the first `SINKS` real keys, except in a layer the model slides a window over (Gemma 3's sliding layers, whose
    window holds these texts), where its mask hides the first tokens beyond it; padding from the mask's last row;
    query head h reads key/value head h // group."""
    kinds = NAIVE_SINK_LAYOUT["layout"][module.layer_idx]
    group = query.shape[1] // key.shape[1]
    key_mask = None if attention_mask is None else attention_mask[:, 0, -1, :]
    sinks = 0 if getattr(module, "sliding_window", None) else SINKS
    outputs = []
    for h, kind in enumerate(kinds):
        local = kind == "local"
        out, _ = naive_attention(
            query[:, h : h + 1], key[:, h // group : h // group + 1], value[:, h // group : h // group + 1],
            is_causal=True, attend_to_self=True, local_window=WINDOW if local else None, key_mask=key_mask,
            scale=scaling, sink_tokens=sinks if local else 0,
        )  # fmt: skip
        outputs.append(out.to(query.dtype))
    return torch.cat(outputs, dim=1).transpose(1, 2), None


AttentionInterface.register(NAIVE_SINKS, naive_sink_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAIVE_SINKS, sdpa_mask)

FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma3_text", "gpt2")


def with_sinks(family: str, layout=LAYOUT):
    return hybridize(tiny(family), head_layout=layout, local_window=WINDOW, sink_tokens=SINKS)


def positions_of(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padded", [False, True])
def test_hybridized_local_heads_with_sinks_equal_the_naive_reference(family, padded):
    """Layouts mixing whole and split key/value groups (grouped-query attention); left padding moves the sinks to
    each row's first real tokens."""
    model = tiny(family)
    twin = tiny(family)
    twin.set_attn_implementation(NAIVE_SINKS)
    ids, mask = batch(length=24)
    mask = mask if padded else torch.ones_like(mask)
    expected = twin(ids, attention_mask=mask, position_ids=positions_of(mask)).logits
    got = with_sinks(family)(ids, attention_mask=mask, position_ids=positions_of(mask)).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    plain = hybridize(model, head_layout=LAYOUT, local_window=WINDOW)(
        ids, attention_mask=mask, position_ids=positions_of(mask)
    ).logits
    assert (plain - expected)[:, -1].abs().max() > 1e-3  # the sinks matter here


@pytest.mark.parametrize("padded", [False, True])
def test_whole_groups_of_each_kind_interleaved_equal_the_naive_reference(padded, monkeypatch):
    """Qwen2's 8 query heads over 4 key/value heads, each group of one kind but the kinds interleaved: each run of
    consecutive heads reads its run of key/value heads in place (`LayerHeads.runs`), and the pieces land in head
    order."""
    layout = [["local", "local", "global", "global", "local", "local", "global", "global"],
              ["global", "global", "local", "local", "local", "local", "global", "global"]]  # fmt: skip
    monkeypatch.setitem(NAIVE_SINK_LAYOUT, "layout", layout)
    twin = tiny("qwen2")
    twin.set_attn_implementation(NAIVE_SINKS)
    ids, mask = batch(length=24)
    mask = mask if padded else torch.ones_like(mask)
    expected = twin(ids, attention_mask=mask, position_ids=positions_of(mask)).logits
    model = with_sinks("qwen2", layout=layout)
    assert [len(runs) for runs in model.model.layers[0].self_attn.hf_attn_heads.runs.values()] == [2, 2]
    got = model(ids, attention_mask=mask, position_ids=positions_of(mask)).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("max_cache_len", [None, 30], ids=["dynamic", "static"])
def test_decoding_with_sinks_gives_the_logits_of_the_whole_sequence(family, padded, max_cache_len):
    """Token by token past the point where the window leaves the sinks behind, from an `HfAttnCache` that keeps only
    the sinks (and the padding before them) and the window of local key/value heads, dynamic or static."""
    model = with_sinks(family)
    ids, mask = batch(length=26)
    mask = mask if padded else torch.ones_like(mask)
    positions = positions_of(mask)
    expected = model(ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
    cache = HfAttnCache(model.config, max_cache_len=max_cache_len)
    for start, end in [(0, 6), (6, 7), (7, 9), *((n, n + 1) for n in range(9, 26))]:
        logits = model(ids[:, start:end], attention_mask=mask[:, :end], position_ids=positions[:, start:end],
                       cache=cache).logits  # fmt: skip
        torch.testing.assert_close(logits, expected[:, start:end], rtol=1e-5, atol=1e-5)
    if family != "gemma3_text":  # its sliding layer 0 gives local heads no sinks
        local = cache.layers[0].by_kind["local"]
        assert local.keys.shape[-2] == (3 if padded else 0) + SINKS + WINDOW


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("max_cache_len", [None, 30], ids=["dynamic", "static"])
def test_output_attentions_while_decoding_with_sinks_are_the_rows_of_the_whole_sequence(family, max_cache_len):
    """Left-padded, past the window: each step's weights are over every position in token order (a static cache's
    every slot), 0 for keys a head does not see and for empty slots; the reference is the whole sequence's last row."""
    model = with_sinks(family)
    ids, mask = batch(length=20)
    positions = positions_of(mask)
    whole = model(ids, attention_mask=mask, position_ids=positions, use_cache=False, output_attentions=True).attentions
    cache = HfAttnCache(model.config, max_cache_len=max_cache_len)
    model(ids[:, :12], attention_mask=mask[:, :12], position_ids=positions[:, :12], cache=cache)
    for end in range(13, 21):
        step = model(ids[:, end - 1 : end], attention_mask=mask[:, :end], position_ids=positions[:, end - 1 : end],
                     cache=cache, output_attentions=True).attentions  # fmt: skip
        for got, expected in zip(step, whole, strict=True):
            assert got.shape[-1] == (end if max_cache_len is None else max_cache_len)
            torch.testing.assert_close(got[..., 0, :end], expected[..., end - 1, :end], rtol=1e-5, atol=1e-6)
            assert not got[..., end:].any()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("sink_tokens", [0, SINKS])
def test_a_padded_batch_gives_its_packed_row_the_same_logits(family, sink_tokens):
    """transformers' padding-free property (TRL's `padding_free=True`): the real tokens of a right-padded batch packed
    into one row, positions restarting at each document and no mask, get the padded batch's logits; local heads'
    windows and sinks stay within each document. Without a cache, as transformers' own test runs it: its families
    find packed documents only then."""
    model = hybridize(tiny(family), head_layout=LAYOUT, local_window=WINDOW, sink_tokens=sink_tokens)
    lengths = [12, 5, 9]
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    ids = batch(length=max(lengths))[0].repeat(2, 1)[: len(lengths)]
    positions = torch.cat([torch.arange(length) for length in lengths])[None]
    with torch.no_grad():
        padded = model(ids, attention_mask=mask, position_ids=positions_of(mask), use_cache=False).logits
        packed = model(ids[mask.bool()][None], position_ids=positions, use_cache=False).logits[0]
    torch.testing.assert_close(packed, padded[mask.bool()], rtol=1e-5, atol=1e-5)


def test_the_cache_keeps_the_sinks_and_the_window_of_local_key_value_heads():
    model = with_sinks("llama")  # layer 0: key/value head 0 global, head 1 local; layer 1: both read by a global head
    ids, mask = batch(length=20)
    out = model(ids, attention_mask=mask)
    layer = out.past_key_values.layers[0]
    assert type(layer.by_kind["local"]) is SinkWindowLayer
    padding = 3  # row 0's: the sinks are each row's first real tokens, so the cache keeps 3 more first tokens
    assert layer.by_kind["local"].keys.shape[-2] == padding + SINKS + WINDOW
    assert layer.by_kind["global"].keys.shape[-2] == 20
    assert set(out.past_key_values.layers[1].by_kind) == {"global"}


def test_bytes_per_token_at_a_context_count_the_sinks_and_windows():
    config = with_sinks("llama", layout=[["global"] * 4 + ["local"] * 4] * 2).config
    whole = original_cache_bytes_per_token(config)
    assert cache_bytes_per_token(config) == whole / 2  # one of two key/value heads a layer grows
    per_head_token = whole / 4  # 2 layers x 2 key/value heads
    context = 100
    held = 2 * (context + SINKS + WINDOW) * per_head_token / context
    assert cache_bytes_per_token(config, context_tokens=context) == pytest.approx(held)
    assert cache_bytes_per_token(config, context_tokens=4) == whole  # a context within the window: nothing saved


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_greedy_generate_with_sinks_and_left_padding_equals_recomputing(family):
    model = with_sinks(family)
    ids, mask = batch(length=8)
    generated = model.generate(ids, attention_mask=mask, max_new_tokens=14, do_sample=False, pad_token_id=0)
    assert torch.equal(generated, greedy_by_recomputing(model, ids, mask, 14))


@pytest.mark.parametrize("family", FAMILIES)
def test_static_cache_generate_with_sinks_equals_recomputing(family):
    model = with_sinks(family)
    ids, mask = batch(length=8)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=14, do_sample=False, pad_token_id=0,
                         cache_implementation="static", return_dict_in_generate=True)  # fmt: skip
    assert isinstance(out.cache, HfAttnCache) and out.cache.is_compileable
    assert torch.equal(out.sequences, greedy_by_recomputing(model, ids, mask, 14))


def test_assisted_decoding_with_a_static_sink_cache_equals_greedy():
    """The static cache keeps room for the drafted tokens a verification may reject (transformers asks for it).
    (Prompt-lookup decoding with a static cache writes past `max_cache_len` in transformers 5.25 for the unmodified
    Llama as well: not tested here.)"""
    model = with_sinks("llama")
    assistant = hybridize(tiny("llama", seed=1), num_local_heads=8, local_window=1, sink_tokens=2)
    ids = batch(length=10)[0][1:]
    options = dict(max_new_tokens=16, do_sample=False, pad_token_id=0)
    greedy = model.generate(ids, **options)
    assert torch.equal(model.generate(ids, assistant_model=assistant, cache_implementation="static", **options), greedy)


def assert_compiled_static_greedy_equals_recomputing(model, ids: torch.Tensor, mask: torch.Tensor) -> None:
    """`torch.compile(model.forward, fullgraph=True)`: any graph break is an error; the prefill runs compiled too,
    so the cache makes room for as much left padding as the prompt could hold."""
    expected = greedy_by_recomputing(model, ids, mask, 12)
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, fullgraph=True, backend="eager")
    generated = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0,
                               cache_implementation="static")  # fmt: skip
    assert torch.equal(generated, expected)


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_compiled_static_decoding_with_sinks_equals_recomputing(family):
    ids, mask = batch(length=8)
    assert_compiled_static_greedy_equals_recomputing(with_sinks(family), ids, mask)


def test_assisted_decoding_crops_the_sink_cache_and_equals_greedy():
    model = with_sinks("llama")
    assistant = hybridize(tiny("llama", seed=1), num_local_heads=8, local_window=1, sink_tokens=2)
    ids = batch(length=10)[0][1:]
    options = dict(max_new_tokens=16, do_sample=False, pad_token_id=0)
    greedy = model.generate(ids, **options)
    assert torch.equal(model.generate(ids, assistant_model=assistant, **options), greedy)
    assert torch.equal(model.generate(ids, prompt_lookup_num_tokens=3, **options), greedy)


def test_sink_cache_crop_drops_the_newest_tokens_from_the_window_then_the_first_ones():
    layer = SinkWindowLayer(sink_tokens=2, sliding_window=3)
    layer.activate_past_recording()
    tokens = torch.arange(7.0).view(1, 1, 7, 1)
    layer.update(tokens, tokens)
    layer.crop(-2)  # drops tokens 5, 6
    assert layer.get_seq_length() == 5 and layer.keys.flatten().tolist() == [0, 1, 3, 4]
    layer.crop(-4)  # the window's tokens 2-4 (held since recording), then token 1
    assert layer.get_seq_length() == 1 and layer.keys.flatten().tolist() == [0]


@pytest.mark.parametrize("prefix,window", [(0, 1), (0, 3), (2, 3), (3, 1)])
@pytest.mark.parametrize("chunks", [[1] * 20, [5, 1, 1, 7, 1, 1, 1, 3], [20], [2, 3, 1, 9]])
def test_static_sink_cache_returns_the_first_tokens_the_window_and_the_new_ones_in_order(prefix, window, chunks):
    """Brute force: after any sequence of updates, the tokens returned are the first `prefix`, the `window` before
    the update and the new ones, each once, in order, each key beside its index; empty slots are marked."""
    layer = StaticSinkWindowLayer(max_cache_len=100, sink_tokens=prefix, window=window)
    seen = 0
    for size in chunks:
        tokens = torch.arange(seen, seen + size, dtype=torch.float).view(1, 1, size, 1)
        keys, _ = layer.update(tokens, tokens)
        index = layer.returned_index(size)
        held = index != NO_TOKEN
        expected = sorted(
            {*range(min(prefix, seen)), *range(max(prefix, seen - window), seen), *range(seen, seen + size)}
        )
        assert index[held].tolist() == expected
        assert keys.flatten()[held].tolist() == expected
        seen += size
    assert layer.keys.shape[-2] == prefix + window


def test_a_static_sink_cache_crops_while_no_token_was_written_over_or_within_its_rollback_room():
    tokens = torch.arange(30.0).view(1, 1, 30, 1)
    layer = StaticSinkWindowLayer(max_cache_len=5, sink_tokens=2, window=3)  # holds every token: nothing written over
    layer.update(tokens[..., :4, :], tokens[..., :4, :])
    layer.crop(-2)
    keys, _ = layer.update(tokens[..., 2:5, :], tokens[..., 2:5, :])
    assert keys.flatten()[layer.returned_index(3) != NO_TOKEN].tolist() == [0, 1, 2, 3, 4]
    layer = StaticSinkWindowLayer(max_cache_len=30, sink_tokens=2, window=3)
    layer.activate_past_recording(recurrent_states_to_keep=4)  # what assisted decoding asks before the first token
    layer.update(tokens[..., :20, :], tokens[..., :20, :])
    layer.crop(-4)  # tokens 16-19 rejected: the window before token 16 is still there
    keys, _ = layer.update(tokens[..., 16:17, :], tokens[..., 16:17, :])
    assert keys.flatten()[layer.returned_index(1) != NO_TOKEN].tolist()[-4:] == [13, 14, 15, 16]
    with pytest.raises(RuntimeError, match="can take back 4, not 5"):
        layer.crop(-5)
    with pytest.raises(RuntimeError, match="activate_past_recording"):
        StaticSinkWindowLayer(max_cache_len=6, sink_tokens=2, window=3).crop(-1)


def test_sinks_are_saved_reloaded_and_named_in_the_model_card(tmp_path):
    model = with_sinks("llama")
    ids = batch()[0]
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["sink_tokens"] == SINKS
    assert "first 3 tokens of the sequence (attention sinks)" in (tmp_path / "README.md").read_text()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert reloaded.config.sink_tokens == SINKS
    torch.testing.assert_close(reloaded(ids).logits, model(ids).logits)


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_bad_sink_tokens_are_refused_naming_the_field(value):
    with pytest.raises(ValueError, match="sink_tokens"):
        hybridize(tiny("llama"), num_local_heads=4, local_window=2, sink_tokens=value)
    with pytest.raises(ValueError, match="sink_tokens"):
        AutoConfig.for_model("local_gpt2", n_layer=1, n_head=2, n_embd=16, sink_tokens=value)


# --- hf_attn's own models ------------------------------------------------------------------------------------------


def own_model(model_type: str, **fields):
    torch.manual_seed(0)
    fields = {"local_window": WINDOW, "sink_tokens": SINKS, **fields}
    config = AutoConfig.for_model(model_type, n_layer=2, n_head=4, n_embd=32, vocab_size=50, n_positions=64,
                                  **fields)  # fmt: skip
    return AutoModelForCausalLM.from_config(config).eval()


def naive_local_kind(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """The local heads of an hf_attn layer through `naive_attention`, from the visibility the layer holds; padding
    arrives as a (B, S) mask for a whole sequence."""
    visibility = module.visibility["local"]
    assert attention_mask is None or attention_mask.dim() == 2
    out, _ = naive_attention(query, key, value, visibility.is_causal, visibility.attend_to_self,
                             visibility.local_window, attention_mask, scale=scaling,
                             sink_tokens=visibility.sink_tokens)  # fmt: skip
    return out.to(query.dtype).transpose(1, 2), None


@pytest.fixture
def naive_local_heads():
    """hf_attn models' local heads run `naive_local_kind` while the test runs (they look their function up in
    transformers' attention interface at every call)."""
    local = HEAD_KINDS["local"]
    AttentionInterface.register(local.interface_name, naive_local_kind)
    yield
    AttentionInterface.register(local.interface_name, local.run)


@pytest.mark.parametrize("model_type", ["local_gpt2", "hybrid_gpt2"])
@pytest.mark.parametrize("padded", [False, True])
def test_own_models_with_sinks_equal_the_naive_reference(model_type, padded, request):
    model = own_model(model_type)
    ids, mask = batch(length=40)
    ids = ids % 50
    mask = mask if padded else torch.ones_like(mask)
    got = model(ids, attention_mask=mask, use_cache=False).logits
    without_sinks = own_model(model_type, sink_tokens=0)(ids, attention_mask=mask, use_cache=False).logits
    request.getfixturevalue("naive_local_heads")
    expected = model(ids, attention_mask=mask, use_cache=False).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert (without_sinks - expected)[:, -1].abs().max() > 1e-3  # the sinks matter here


@pytest.mark.parametrize("model_type", ["local_gpt2", "hybrid_gpt2"])
@pytest.mark.parametrize("padded", [False, True])
def test_own_models_decode_with_sinks_as_the_whole_sequence(model_type, padded):
    model = own_model(model_type)
    ids, mask = batch(length=26)
    ids = ids % 50
    mask = mask if padded else torch.ones_like(mask)
    expected = model(ids, attention_mask=mask, use_cache=False).logits
    cache = HfAttnCache(model.config)
    for start, end in [(0, 6), (6, 7), (7, 9), *((n, n + 1) for n in range(9, 26))]:
        logits = model(ids[:, start:end], attention_mask=mask[:, :end], cache=cache).logits
        torch.testing.assert_close(logits, expected[:, start:end], rtol=1e-5, atol=1e-5)


def test_own_models_keep_sink_tokens_in_config_json(tmp_path):
    model = own_model("local_gpt2")
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["sink_tokens"] == SINKS
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.arange(20).view(1, 20)
    torch.testing.assert_close(reloaded(ids).logits, model(ids).logits)
    assert "the first 3 tokens of the sequence (attention sinks)" in (tmp_path / "README.md").read_text()


@pytest.mark.parametrize("model_type", ["local_gpt2", "hybrid_gpt2"])
@pytest.mark.parametrize("padded", [False, True])
def test_own_models_decode_with_sinks_from_a_static_cache_as_the_whole_sequence(model_type, padded):
    """The static cache keeps the sinks (and the padding before them) and k slots for the window, a fixed size far
    below the 40 tokens it may hold."""
    model = own_model(model_type)
    ids, mask = batch(length=26)
    ids = ids % 50
    mask = mask if padded else torch.ones_like(mask)
    expected = model(ids, attention_mask=mask, use_cache=False).logits
    cache = HfAttnCache(model.config, max_cache_len=40)
    for start, end in [(0, 6), (6, 7), (7, 9), *((n, n + 1) for n in range(9, 26))]:
        logits = model(ids[:, start:end], attention_mask=mask[:, :end], cache=cache).logits
        torch.testing.assert_close(logits, expected[:, start:end], rtol=1e-5, atol=1e-5)
    local = cache.layers[0].by_kind["local"]
    assert local.keys.shape[-2] == (3 if padded else 0) + SINKS + WINDOW


@pytest.mark.parametrize("model_type", ["local_gpt2", "hybrid_gpt2"])
def test_own_models_generate_with_sinks_compiled_and_static_as_by_recomputing(model_type):
    ids, mask = batch(length=8)
    assert_compiled_static_greedy_equals_recomputing(own_model(model_type), ids % 50, mask)


def causal_over(real: torch.Tensor, num_queries: int) -> torch.Tensor:
    """(B, 1, T, S): query i (the newest T of S tokens) sees key j <= its own position where `real` (B, S) is True,
    written out by loops."""
    batch_size, num_keys = real.shape
    mask = torch.zeros(batch_size, 1, num_queries, num_keys, dtype=torch.bool)
    for b in range(batch_size):
        for i in range(num_queries):
            for j in range(num_keys - num_queries + i + 1):
                mask[b, 0, i, j] = bool(real[b, j])
    return mask


@pytest.mark.parametrize("num_queries", [7, 1])  # a prompt; a decoding step over cached keys
def test_only_a_left_padded_causal_mask_gives_the_kernel_a_key_mask(num_queries):
    """Left padding (as `generate` pads) is causal order over each row's real keys, which the chunked kernel counts
    by position as the mask would along itself; right padding, packed rows and per-head masks are counted along
    the mask instead."""
    from hf_attn.hybrid_attention import left_padding_only

    real = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(left_padding_only(causal_over(real, num_queries)), real)
    right = real.flip(-1)
    assert left_padding_only(causal_over(right, num_queries)) is None
    if num_queries > 1:  # one query's contiguous keys are the same whether padding or another sequence precede them
        packed = causal_over(torch.ones_like(real), num_queries)
        positions = torch.arange(9 - num_queries, 9)
        packed[:, :, positions >= 4, :4] = False  # a second sequence from key 4 on
        assert left_padding_only(packed) is None
    assert left_padding_only(causal_over(real, num_queries).expand(2, 4, -1, -1)) is None


def test_the_left_padding_check_reads_a_mask_once_while_it_lives_unchanged(monkeypatch):
    """Every layer of a forward asks about the same mask: the answer is kept, given again for that mask, read again
    for another mask or once the mask is changed in place, and holds no mask alive."""
    import gc
    import weakref

    import hf_attn.hybrid_attention as hybrid_attention

    reads = []
    check = hybrid_attention.padding_on_the_left
    monkeypatch.setattr(hybrid_attention, "padding_on_the_left", lambda mask: reads.append(1) or check(mask))
    real = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    mask = causal_over(real, 6)
    answers = [hybrid_attention.left_padding_only(mask) for _ in range(30)]
    assert len(reads) == 1 and torch.equal(answers[0], real) and all(answer is answers[0] for answer in answers)
    mask[0, 0, -1, 0] = True  # padding seen by the newest query: not causal order over the real keys any more
    assert hybrid_attention.left_padding_only(mask) is None and len(reads) == 2
    assert torch.equal(hybrid_attention.left_padding_only(causal_over(real, 6)), real) and len(reads) == 3
    with torch.inference_mode():  # a tensor made there counts no versions: the same mask alone
        inference = causal_over(real, 6)
        assert all(torch.equal(hybrid_attention.left_padding_only(inference), real) for _ in range(3))
    assert len(reads) == 4
    kept = weakref.ref(mask := causal_over(real, 6))
    hybrid_attention.left_padding_only(mask)
    del mask
    gc.collect()
    assert kept() is None  # the kept answer does not hold its mask alive


def test_left_padded_prefill_of_local_heads_with_sinks_makes_no_whole_count(monkeypatch):
    """A left-padded batch's local heads with sinks never count along the whole (T, S) mask (`local_visible`), and
    still equal the naive reference."""
    import hf_attn.hybrid_attention as hybrid_attention

    counted, count = [], hybrid_attention.local_visible

    def counting(*args):
        counted.append(args[0].shape)
        return count(*args)

    monkeypatch.setattr(hybrid_attention, "local_visible", counting)
    family = FAMILIES[0]
    twin = tiny(family)
    twin.set_attn_implementation(NAIVE_SINKS)
    ids, mask = batch(length=24)
    expected = twin(ids, attention_mask=mask, position_ids=positions_of(mask)).logits
    got = with_sinks(family)(ids, attention_mask=mask, position_ids=positions_of(mask)).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert counted == []
