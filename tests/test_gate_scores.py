"""`hf_attn.gate_scores`: the gated attention against the unmodified model and a naive sink + window softmax written
here, what trains, the synthetic retrieval text, and the scores on a model whose retrieval head is known."""

from pathlib import Path

import pytest
import torch
from retrieval_task import retrieval_rows
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import AttentionInterface

from hf_attn import ruler
from hf_attn.gate_scores import (
    GATED_ATTENTION,
    Gating,
    RetrievalText,
    attention_as,
    gate_scores,
    needle_attention,
    retrieval_scores,
    retrieval_text,
    task_gate_scores,
    task_text,
    train_gates,
)

SHARED = Path(__file__).parents[2] / "shared" / "data"
REFERENCE = "test_sink_window_reference"
NO_SPECIAL_TOKENS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)


def tiny(family: str):
    """Random weights; 8 query heads over 2 key/value heads for Llama."""
    torch.manual_seed(0)
    if family == "llama":
        return LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                            num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64,
                                            **NO_SPECIAL_TOKENS)).eval()  # fmt: skip
    return GPT2LMHeadModel(GPT2Config(vocab_size=97, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                      **NO_SPECIAL_TOKENS)).eval()  # fmt: skip


def reference_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Softmax over the keys each head may see, written position by position: a local head (`module.local_heads`)
    sees key j from query i when j <= i and (i - j <= k or j < s); a global head every j <= i."""
    batch, heads, length, _ = query.shape
    key = key.repeat_interleave(heads // key.shape[1], dim=1)
    value = value.repeat_interleave(heads // value.shape[1], dim=1)
    k, s = module.window_and_sinks
    out = torch.zeros_like(query, dtype=torch.float64)
    for h in range(heads):
        for i in range(length):
            keys = [j for j in range(i + 1) if h not in module.local_heads or i - j <= k or j < s]
            weights = torch.softmax(query[:, h, i, None].double() @ key[:, h, keys].double().mT * scaling, dim=-1)
            out[:, h, i] = (weights @ value[:, h, keys].double())[:, 0]
    return out.to(query.dtype).transpose(1, 2), None


AttentionInterface.register(REFERENCE, reference_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(REFERENCE, sdpa_mask)


def reference_logits(model, ids, local_heads: list[set[int]], local_window: int, sink_tokens: int) -> torch.Tensor:
    modules = [m for m in model.modules() if hasattr(m, "layer_idx") and "Attention" in type(m).__name__]
    for module in modules:
        module.local_heads, module.window_and_sinks = local_heads[module.layer_idx], (local_window, sink_tokens)
    previous = model.config._attn_implementation
    model.config._attn_implementation = REFERENCE
    try:
        with torch.no_grad():
            return model(ids).logits
    finally:
        model.config._attn_implementation = previous


def gated_logits(model, ids, gates: torch.Tensor, local_window: int, sink_tokens: int) -> torch.Tensor:
    with attention_as(model, GATED_ATTENTION, Gating(gates, local_window, sink_tokens)), torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_gates_at_1_give_the_unmodified_models_logits(family):
    model = tiny(family)
    ids = torch.randint(0, 97, (2, 40))
    with torch.no_grad():
        expected = model(ids).logits
    heads = model.config.num_attention_heads
    torch.testing.assert_close(gated_logits(model, ids, torch.ones(2, heads), 4, 2), expected)
    assert model.config._attn_implementation == "sdpa"  # restored


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize(("local_window", "sink_tokens"), [(3, 0), (3, 2), (1, 4)])
def test_gates_at_0_give_a_naive_sink_and_window_softmax(family, local_window, sink_tokens):
    model = tiny(family)
    ids = torch.randint(0, 97, (2, 24))
    heads = model.config.num_attention_heads
    everything_local = [set(range(heads))] * 2
    expected = reference_logits(model, ids, everything_local, local_window, sink_tokens)
    got = gated_logits(model, ids, torch.zeros(2, heads), local_window, sink_tokens)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    # A reference that is not sink + window differs: the comparison can fail.
    assert not torch.allclose(got, reference_logits(model, ids, everything_local, local_window + 1, sink_tokens))


def test_key_value_group_gates_make_whole_groups_local():
    model = tiny("llama")  # 8 query heads over 2 key/value heads: heads 4-7 read group 1
    ids = torch.randint(0, 97, (2, 24))
    gates = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # (layers, groups)
    expected = reference_logits(model, ids, [{4, 5, 6, 7}, {0, 1, 2, 3}], 3, 2)
    torch.testing.assert_close(gated_logits(model, ids, gates, 3, 2), expected, atol=1e-5, rtol=1e-4)


def test_gates_between_mix_the_two_outputs():
    """With one layer, a gate of 0.25 on every head gives 0.25 x the full output + 0.75 x the local one, before the
    output projection, which is linear."""
    model = tiny("gpt2")
    model.transformer.h = model.transformer.h[:1]
    model.config.n_layer = 1
    ids = torch.randint(0, 97, (1, 24))
    outputs = []
    hook = model.transformer.h[0].attn.c_proj.register_forward_hook(lambda m, args, out: outputs.append(args[0]))
    for gate in (1.0, 0.0, 0.25):
        gated_logits(model, ids, torch.full((1, 4), gate), 3, 1)
    hook.remove()
    torch.testing.assert_close(outputs[2], 0.25 * outputs[0] + 0.75 * outputs[1])


def test_only_the_gates_get_gradients_and_the_model_is_restored():
    model = tiny("llama")
    model.lm_head.weight.requires_grad_(False)  # a flag to restore as it was
    flags = [p.requires_grad for p in model.parameters()]
    text = retrieval_text(torch.randint(0, 97, (2, 48)), num_passkeys=1)
    scores = train_gates(model, text, local_window=3, sink_tokens=1, batch_size=2, unit="kv_group", steps=2)
    assert scores.shape == (2, 2) and (scores < 1).all()  # the penalty moved every gate
    assert all(p.grad is None for p in model.parameters())
    assert [p.requires_grad for p in model.parameters()] == flags
    assert model.config._attn_implementation == "sdpa"
    assert not any(hasattr(m, "hf_attn_state") for m in model.modules())


def test_retrieval_text_hides_passkeys_and_recalls_them_at_the_end():
    blocks = torch.arange(1000, 1000 + 3 * 64).view(3, 64)  # every token distinct
    text = retrieval_text(blocks, num_passkeys=2, seed=1)
    assert text.ids.shape == text.recall.shape == text.source.shape == (3, 64)
    for ids, recall, source in zip(text.ids, text.recall, text.source, strict=True):
        copying = (source >= 0).nonzero()[:, 0]
        assert len(copying) == 16 and recall.sum() == 16 and recall[-16:].all()  # 2 passkeys of 8 tokens
        assert (ids[copying + 1] == ids[source[copying]]).all()  # each recalled token is the needle's
        assert (source[copying] < 64 - 16).all()  # the needles lie in the text before the recall
    tokenizer = AutoTokenizer.from_pretrained(SHARED / "gpt2-tokenizer")
    text = retrieval_text(tokenizer(open(SHARED / "wikitext-2-raw" / "wiki.valid.raw").read()[:20000],
                                    return_tensors="pt").input_ids[:, :2048].view(2, 1024), tokenizer)  # fmt: skip
    recalled = tokenizer.decode(text.ids[0][text.recall[0]])
    assert recalled.count("passkey?") == 4 and "What is the third passkey? The third passkey is:" in recalled
    copying = (text.source[0] >= 0).nonzero()[:, 0]
    assert (text.ids[0][copying + 1] == text.ids[0][text.source[0][copying]]).all()


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    return AutoTokenizer.from_pretrained(SHARED / "gpt2-tokenizer")


def calibration_blocks(tokenizer, rows: int, width: int) -> torch.Tensor:
    text = open(SHARED / "wikitext-2-raw" / "wiki.valid.raw").read()[: 6 * rows * width]
    return tokenizer(text, return_tensors="pt").input_ids[:, : rows * width].view(rows, width)


def test_task_text_teaches_every_ruler_task_its_answer(gpt2_tokenizer):
    """Each sample is a RULER prompt with its answer after it, the answer marked for recall; essay needles hide in
    the calibration text, not in the evaluation's test split."""
    blocks = calibration_blocks(gpt2_tokenizer, 2, 1024)
    text = task_text(blocks, gpt2_tokenizer, samples_per_task=1)
    assert text.ids.shape == text.recall.shape == text.source.shape == (len(ruler.TASKS), 1024)
    assert (text.source == -1).all()  # no copy targets: the gates compare hidden states only
    calibration_words = set(gpt2_tokenizer.decode(blocks.flatten()).split())
    for task, ids, recall in zip(ruler.TASKS, text.ids, text.recall, strict=True):
        record = ruler.generate(task, gpt2_tokenizer, 1024 - ruler.TASKS[task].max_new_tokens, 1, 0,
                                essay_text=gpt2_tokenizer.decode(blocks.flatten()))[0]  # fmt: skip
        positions = recall.nonzero()[:, 0]  # those that predict the answer: the prompt's last, then the answer's
        assert (positions == torch.arange(positions[0], positions[-1] + 1)).all()  # one span
        answer = gpt2_tokenizer.decode(ids[positions + 1])
        assert ruler.score(task, [answer], [record["outputs"]]) == 100  # every reference string, and only the answer
        prompt = gpt2_tokenizer.decode(ids[: positions[0] + 1])
        assert prompt == record["input"] + record["answer_prefix"]
        assert (ids[positions[-1] + 2 :] == gpt2_tokenizer.eos_token_id).all()  # padded on the right
        assert answer == (" " if not record["answer_prefix"].endswith(" ") else "") + ", ".join(record["outputs"]) + "."
        if getattr(ruler.TASKS[task], "haystack", None) == "essay":
            haystack = set(record["input"].split()) - set(ruler.NIAH_TEMPLATE.split())
            assert len(haystack & calibration_words) > 0.8 * len(haystack)
    again = task_text(blocks, gpt2_tokenizer, samples_per_task=1)
    assert torch.equal(again.ids, text.ids) and torch.equal(again.recall, text.recall)


def test_task_text_refuses_unknown_tasks_and_blocks_too_short(gpt2_tokenizer):
    blocks = calibration_blocks(gpt2_tokenizer, 1, 256)
    with pytest.raises(ValueError, match=r"`tasks` must be some of \['niah_single_1'.*got \['qa_1'\]"):
        task_text(blocks, gpt2_tokenizer, tasks=["niah_single_1", "qa_1"])
    with pytest.raises(ValueError, match="`samples_per_task` must be an int >= 1, got 0"):
        task_text(blocks, gpt2_tokenizer, samples_per_task=0)
    with pytest.raises(ValueError, match="Calibration blocks of 256 tokens are too short for vt"):
        task_text(blocks, gpt2_tokenizer, tasks=["vt"])
    with pytest.raises(ValueError, match="`tokenizer` is required"):
        task_gate_scores(tiny("llama"), blocks, local_window=4, sink_tokens=0, batch_size=1, unit="kv_group")


def test_task_gates_train_on_the_answers(gpt2_tokenizer):
    """A tiny Llama's gates on every task: every gate moves off 1 (the L1 pull) and stays in [0, 1]."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50257, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=1024)).eval()  # fmt: skip
    blocks = calibration_blocks(gpt2_tokenizer, 1, 1024)
    gates = task_gate_scores(model, blocks, local_window=8, sink_tokens=4, batch_size=2, unit="kv_group",
                             tokenizer=gpt2_tokenizer, steps=4)  # fmt: skip
    assert gates.shape == (2, 2) and (gates >= 0).all() and (gates < 1).all()


def known_retrieval_text(num_rows: int, seed: int) -> RetrievalText:
    """The rows as retrieval text: the separator's query recalls the key at position 0."""
    rows = retrieval_rows(num_rows, seed)
    recall = torch.zeros_like(rows, dtype=torch.bool)
    recall[:, -2] = True
    source = torch.full_like(rows, -1)
    source[:, -2] = 0
    return RetrievalText(rows, recall, source)


def test_gate_training_keeps_the_retrieval_head_global(retriever):
    text = known_retrieval_text(64, seed=20_000)
    gates = train_gates(retriever, text, local_window=2, sink_tokens=0, batch_size=16, unit="head", steps=60)
    assert gates.shape == (1, 4) and gates[0].argmax() == 0
    assert gates[0, 0] > 0.5 and (gates[0, 1:] < gates[0, 0] - 0.2).all()
    # With the key among the sinks, no head needs the full attention to retrieve it: every gate falls.
    gates = train_gates(retriever, text, local_window=2, sink_tokens=1, batch_size=16, unit="head", steps=60)
    assert (gates[0] < 0.5).all()


def test_the_retrieval_score_finds_the_retrieval_head(retriever):
    text = known_retrieval_text(64, seed=20_000)
    scores = needle_attention(retriever, text, local_window=2, sink_tokens=0, batch_size=16, unit="head")
    assert scores[0].argmax() == 0 and scores[0, 0] > 0.5


def test_scores_refuse_invalid_settings():
    model, ids = tiny("llama"), torch.randint(0, 97, (2, 48))
    shared = dict(local_window=3, sink_tokens=1, batch_size=2, unit="kv_group")
    for score in (gate_scores, retrieval_scores):
        for field, value in [("unit", "query"), ("local_window", 0), ("sink_tokens", -1)]:
            with pytest.raises(ValueError, match=f"`{field}`"):
                score(model, ids, **{**shared, field: value})
    with pytest.raises(ValueError, match="`steps`"):
        gate_scores(model, ids, **shared, steps=0)
    with pytest.raises(ValueError, match="`num_passkeys` must be in 1..10, got 11"):
        gate_scores(model, ids, **shared, num_passkeys=11)
    with pytest.raises(ValueError, match="`block_size`"):  # 48 tokens cannot hold 4 passkeys of 8 and the text
        gate_scores(model, ids, **shared, num_passkeys=4)
