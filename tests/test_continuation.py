"""benchmarks/continuation.py: the continuation read in chunks over the prefill's cache predicts what one forward pass
over the whole block predicts (unmodified, and hybridized with local heads and sinks); over a cache a press cut to
its last m context tokens, what one forward pass predicts whose mask hides the rest of the context from the
continuation; the blocks are the text's first tokens; a record is kept only for the same settings."""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, DynamicCache, LlamaConfig, LlamaForCausalLM

from benchmarks import continuation
from hf_attn import hybridize
from tests.test_ruler_benchmark import GPT2, HAYSTACK

TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
LENGTH = 80  # a block: context 60, then 19 tokens scored over two chunks of 16


def tiny_llama(hybridized: bool) -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY)).eval()
    return hybridize(model, num_local_heads=2, local_window=8, sink_tokens=2) if hybridized else model


def one_pass_nll(model, ids: torch.Tensor, scored_from: int) -> float:
    """The reference: one forward pass over IDS, each token from index SCORED_FROM on predicted by the one before."""
    with torch.no_grad():
        logits = model(ids[None]).logits[0]
    return float(F.cross_entropy(logits[scored_from - 1 : -1], ids[scored_from:], reduction="sum"))


class KeepLast:
    """A stand-in press: once the prefill is over, the cache keeps the last M context tokens of every head."""

    def __init__(self, cache: DynamicCache, keep: int):
        self.cache, self.keep = cache, keep

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, -self.keep :], layer.values[:, :, -self.keep :]


@pytest.mark.parametrize("hybridized", [False, True], ids=["unmodified", "local-heads-with-sinks"])
def test_the_chunked_continuation_predicts_what_one_pass_predicts(hybridized):
    model = tiny_llama(hybridized)
    block = torch.randint(0, TINY["vocab_size"], (LENGTH,), generator=torch.Generator().manual_seed(1))
    context = continuation.context_tokens(LENGTH)
    assert context == 60 and LENGTH - 1 - context > continuation.CHUNK  # more than one chunk, the last one short
    expected = one_pass_nll(model, block, context + 1)
    assert continuation.continuation_nll(model, block, context) == pytest.approx(expected, rel=1e-5)
    blocks = torch.stack([block, block.flip(0)])
    figures = continuation.measure(model, blocks)
    reference = expected + one_pass_nll(model, block.flip(0), context + 1)
    assert figures["scored_tokens"] == 2 * 19 and figures["nll"] == pytest.approx(reference, rel=1e-5)
    assert figures["perplexity"] == pytest.approx(math.exp(reference / 38), rel=1e-5)


def kept_context_nll(model, block: torch.Tensor, keep: int) -> float:
    """The reference for a press keeping the last KEEP context tokens: one forward pass over the block whose mask
    lets the context see all of itself, and the continuation those KEEP tokens and itself."""
    context, length = continuation.context_tokens(len(block)), len(block)
    query, key = torch.arange(length)[:, None], torch.arange(length)[None]
    visible = (key <= query) & ((query < context) | (key >= context - keep))
    with torch.no_grad():
        logits = model(block[None], attention_mask=visible[None, None]).logits[0]
    return float(F.cross_entropy(logits[context:-1], block[context + 1 :], reduction="sum"))


def test_a_compressed_context_is_read_at_the_positions_its_tokens_had():
    model, keep = tiny_llama(False), 12
    block = torch.randint(0, TINY["vocab_size"], (LENGTH,), generator=torch.Generator().manual_seed(2))
    context = continuation.context_tokens(LENGTH)
    cache = DynamicCache()
    nll = continuation.continuation_nll(model, block, context, KeepLast(cache, keep), cache)
    assert nll == pytest.approx(kept_context_nll(model, block, keep), rel=1e-5)
    assert abs(nll - continuation.continuation_nll(model, block, context)) > 1e-2  # the cut context counts


def test_blocks_are_the_texts_first_tokens_and_too_short_a_text_is_refused(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(GPT2)
    text = f"{HAYSTACK}/wiki.test.raw"
    blocks = continuation.wikitext_blocks(tokenizer, Path(text), 100, 3)
    start = open(text, encoding="utf-8").read(5000)
    assert blocks.shape == (3, 100) and blocks.flatten()[:250].tolist() == tokenizer(start).input_ids[:250]
    (tmp_path / "short.txt").write_text("a few words only")
    with pytest.raises(ValueError, match=r"short.txt has 4 tokens, fewer than 3 blocks of 100"):
        continuation.wikitext_blocks(tokenizer, tmp_path / "short.txt", 100, 3)


def test_a_record_is_kept_for_the_same_settings_and_measured_again_for_others(tmp_path, capsys):
    path, calls = tmp_path / "pred" / "layout" / "4096" / continuation.FILE, []

    def measuring():
        calls.append(1)
        return {"perplexity": 20.0 + len(calls)}

    machine = lambda: {"uptime": "up 1"}  # noqa: E731
    record = continuation.measured(path, {"blocks": 8}, measuring, machine, "cpu")
    assert record["perplexity"] == 21.0 and json.loads(path.read_text()) == record
    assert record["machine"] == {"before": {"uptime": "up 1"}, "after": {"uptime": "up 1"}} and record["seconds"] >= 0
    assert continuation.measured(path, {"blocks": 8}, measuring, machine, "cpu") == record and len(calls) == 1
    assert capsys.readouterr().out.splitlines()[-1] == f"{path}: perplexity 21.00, kept"
    assert continuation.measured(path, {"blocks": 4}, measuring, machine, "cpu")["perplexity"] == 22.0
    assert sorted(p.name for p in path.parent.iterdir()) == [continuation.FILE]  # no temporary file left
