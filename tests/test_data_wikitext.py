"""WikiText-2 loading (local folder always, Hub only when online) and sliding-window perplexity."""

import math
from pathlib import Path

import pytest
import torch
from conftest import tiny_config
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_attn.data.wikitext as wikitext
from hf_attn.experiments import perplexity

SHARED = Path(__file__).parents[2] / "shared" / "data"


def test_shared_folder_gives_the_reduced_protocol():
    splits = wikitext.load_wikitext(SHARED / "wikitext-2-raw")
    assert splits.protocol == "reduced" and "REDUCED PROTOCOL" in splits.description
    assert splits.train_text == (SHARED / "wikitext-2-raw" / "wiki.valid.raw").read_text()
    assert splits.eval_text == (SHARED / "wikitext-2-raw" / "wiki.test.raw").read_text()


def test_folder_with_a_train_file_gives_the_full_protocol(tmp_path):
    for name, text in (("wiki.train.raw", "train text"), ("wiki.valid.raw", "valid"), ("wiki.test.raw", "test")):
        (tmp_path / name).write_text(text)
    splits = wikitext.load_wikitext(tmp_path)
    assert (splits.protocol, splits.train_text, splits.eval_text) == ("full", "train text", "test")


@pytest.mark.parametrize("make", [lambda tmp: tmp / "missing", lambda tmp: tmp])
def test_missing_data_names_the_folder_and_how_to_get_it(tmp_path, make):
    folder = make(tmp_path)
    with pytest.raises(ValueError, match=f"{folder}.*(shared/data/wikitext-2-raw|wiki.test.raw)"):
        wikitext.load_wikitext(folder)


class FakeHub:
    """Stands in for `datasets.load_dataset`: records calls, returns three tiny splits."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)
        return {split: {"text": [f" = {split} =\n", " words\n"]} for split in ("train", "validation", "test")}


def test_hub_is_used_only_when_online_and_no_folder_is_given(monkeypatch):
    hub = FakeHub()
    monkeypatch.setattr(wikitext.datasets, "load_dataset", hub)
    with pytest.raises(ValueError, match="offline.*--data_dir"):
        wikitext.load_wikitext()  # conftest sets HF_HUB_OFFLINE=1
    wikitext.load_wikitext(SHARED / "wikitext-2-raw")
    assert hub.calls == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    splits = wikitext.load_wikitext()
    assert hub.calls == [("wikitext", "wikitext-2-raw-v1")]
    assert splits.protocol == "full" and splits.train_text == " = train =\n words\n"


def test_tokens_and_blocks():
    tokenizer = AutoTokenizer.from_pretrained(SHARED / "gpt2-tokenizer")
    tokens = wikitext.tokenize_text("Hello world", tokenizer)
    assert tokens.tolist() == [15496, 995]
    blocks = wikitext.language_modelling_blocks(torch.arange(10).numpy(), block_size=4)
    assert blocks[:]["input_ids"].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="block_size"):
        wikitext.language_modelling_blocks(torch.arange(3).numpy(), block_size=4)


def hand_perplexity(model, ids: torch.Tensor, context_length: int, stride: int) -> float:
    """One forward per scored token, over exactly the tokens the definition gives it as context."""
    nll = []
    for target in range(1, len(ids)):
        first = 1 + (target - 1) // stride * stride  # the chunk that scores `target`
        end = min(first + stride, len(ids))
        context = ids[max(0, end - context_length) : target]
        with torch.no_grad():
            log_probs = model(input_ids=context[None]).logits[0, -1].double().log_softmax(-1)
        nll.append(-log_probs[ids[target]].item())
    return math.exp(sum(nll) / len(nll))


@pytest.mark.parametrize("model_type", ["hybrid_gpt2", "local_gpt2"])
@pytest.mark.parametrize("context_length,stride", [(8, 3), (8, 7), (6, 1), (40, 5)])
def test_perplexity_matches_a_hand_computation(model_type, context_length, stride):
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, initializer_range=0.2)).eval()
    ids = torch.randint(0, 37, (23,))
    result = perplexity(model, ids, context_length, stride, batch_size=3)
    assert result["tokens"] == 22
    assert math.isclose(result["perplexity"], hand_perplexity(model, ids, context_length, stride), rel_tol=1e-5)


def test_perplexity_refuses_a_stride_without_context():
    model = AutoModelForCausalLM.from_config(tiny_config("hybrid_gpt2"))
    with pytest.raises(ValueError, match="stride"):
        perplexity(model, torch.arange(10), context_length=8, stride=8)
