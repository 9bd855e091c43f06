"""`python -m hf_attn.select_heads`: scores on a model whose retrieval head is known, and the command end to end."""

import json
from pathlib import Path

import pytest
import torch
from gguf_files import write_llama_gguf
from retrieval_task import retrieval_rows
from transformers import LlamaConfig, LlamaForCausalLM

from hf_attn import hybridize
from hf_attn.select_heads import choose_layout, loss_scores, main, mass_beyond_window

SHARED = Path(__file__).parents[2] / "shared" / "data"


def retrieval_accuracy(model, rows: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(rows).logits[:, -2].argmax(-1) == rows[:, -1]).float().mean().item()


def test_the_loss_score_keeps_the_retrieval_head_global(retriever):
    rows = retrieval_rows(256, seed=10_000)
    assert retrieval_accuracy(retriever, rows) > 0.95
    rows_for_scoring = retrieval_rows(64, seed=20_000)
    scores = loss_scores(retriever, rows_for_scoring, local_window=2, sink_tokens=0, batch_size=32, unit="head")
    # The loss is over every position, so losing the answer (1 of 15) raises it by about ln(8) / 15 = 0.14.
    assert scores.shape == (1, 4) and scores[0].argmax() == 0 and scores[0, 0] > 0.05
    layout = choose_layout(scores, local_fraction=0.75, heads=4)
    assert layout == [["global", "local", "local", "local"]]
    assert retrieval_accuracy(hybridize(retriever, head_layout=layout, local_window=2), rows) > 0.95
    # The head it kept is the one the task needs: made local, retrieval falls to about chance (1 / 8).
    assert retrieval_accuracy(hybridize(retriever, head_layout=[["local"] * 4], local_window=2), rows) < 0.4


def test_mass_beyond_the_window_is_the_weight_on_keys_more_than_k_back():
    torch.manual_seed(0)
    weights = torch.rand(2, 3, 6, 6).tril().softmax(-1)  # any rows summing to 1
    expected = torch.zeros(1, 3)
    for h in range(3):
        values = [weights[b, h, i, : i - 2].sum() for b in range(2) for i in range(3, 6)]  # queries 3-5 see beyond 2
        expected[0, h] = torch.stack(values).mean()
    torch.testing.assert_close(mass_beyond_window((weights,), local_window=2), expected)
    # With a sink, key 0 is kept by a local head too: query 3 sees nothing beyond, queries 4-5 keys 1 to i - 3.
    for h in range(3):
        values = [weights[b, h, i, 1 : i - 2].sum() for b in range(2) for i in range(4, 6)]
        expected[0, h] = torch.stack(values).mean()
    torch.testing.assert_close(mass_beyond_window((weights,), local_window=2, sink_tokens=1), expected)


def test_choose_layout_makes_the_lowest_scoring_groups_local_whole():
    scores = torch.tensor([[0.3, 0.1], [0.0, 0.2]])  # (layers, key/value groups)
    layout = choose_layout(scores, local_fraction=0.5, heads=4)  # 2 heads per group
    assert layout == [["global", "global", "local", "local"], ["local", "local", "global", "global"]]
    with pytest.raises(ValueError, match=r"`local_fraction` must be in \[0, 1\], got 1.5"):
        choose_layout(scores, 1.5, heads=4)


@pytest.mark.parametrize("score", ["loss", "mass"])
def test_the_command_writes_a_layout_hybridize_takes(tmp_path, score):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50257, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path / "model")
    output = tmp_path / "layout.json"
    record = main([str(tmp_path / "model"), "--local_fraction", "0.5", "--local_window", "4", "--score", score,
                   "--data", str(SHARED / "wikitext-2-raw" / "wiki.valid.raw"), "--tokenizer",
                   str(SHARED / "gpt2-tokenizer"), "--block_size", "32", "--num_blocks", "3",
                   "--output", str(output)])  # fmt: skip
    assert json.loads(output.read_text()) == record
    assert record["calibration"]["blocks"] == 3 and len(record["scores"]) == 2 and len(record["scores"][0]) == 2
    layout = record["head_layout"]
    assert sum(layer.count("local") for layer in layout) == 4  # half the heads, as two whole groups of two
    for layer in layout:
        assert layer[0] == layer[1] and layer[2] == layer[3]
    model = hybridize(LlamaForCausalLM.from_pretrained(tmp_path / "model"), head_layout=layout, local_window=4)
    assert sum(layer.count("local") for layer in model.config.kv_head_layout) == 2


@pytest.mark.parametrize("score", ["gate", "retrieval"])
def test_the_command_scores_retrieval_with_sinks(tmp_path, score):
    """Blocks of 512 tokens hold two passkeys; the record names the score's settings and what it cost."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50257, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path / "model")
    record = main([str(tmp_path / "model"), "--local_fraction", "0.5", "--local_window", "8", "--score", score,
                   "--sink_tokens", "4", "--data", str(SHARED / "wikitext-2-raw" / "wiki.valid.raw"), "--tokenizer",
                   str(SHARED / "gpt2-tokenizer"), "--block_size", "512", "--num_blocks", "2", "--batch_size", "2",
                   "--output", str(tmp_path / "layout.json")])  # fmt: skip
    assert record["sink_tokens"] == 4 and sum(layer.count("local") for layer in record["head_layout"]) == 4
    cost = record["cost"]
    if score == "gate":  # the full model's states per block, then each step a pass forward and back
        assert record["score_settings"]["steps"] == 48
        assert cost["backward_passes"] == 48 and cost["forward_passes"] == 2 + 48
    else:
        assert cost["backward_passes"] == 0 and cost["forward_passes"] == 1 and cost["forward_tokens"] == 2 * 512


def test_the_command_refuses_a_window_as_long_as_the_blocks(tmp_path):
    with pytest.raises(SystemExit):
        main(["model", "--local_fraction", "0.5", "--local_window", "32", "--block_size", "32"])
    with pytest.raises(SystemExit):  # the sinks and the window fill the block
        main(["model", "--local_fraction", "0.5", "--local_window", "16", "--sink_tokens", "16", "--block_size", "32"])
    with pytest.raises(SystemExit):
        main(["model", "--local_fraction", "0.5", "--local_window", "4", "--sink_tokens", "-1"])


def test_the_command_takes_a_gguf_file_and_calibrates_offline_on_the_text_beside_the_clone(tmp_path, monkeypatch):
    """No `--data`, the Hub off (conftest): the validation text in ../shared, as the training configs find it."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50257, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)  # fmt: skip
    write_llama_gguf(LlamaForCausalLM(config), tmp_path / "tiny.gguf")
    monkeypatch.chdir(Path(__file__).parents[1])
    record = main([str(tmp_path / "tiny.gguf"), "--local_fraction", "0.5", "--local_window", "4", "--score", "mass",
                   "--tokenizer", str(SHARED / "gpt2-tokenizer"), "--block_size", "32", "--num_blocks", "2",
                   "--output", str(tmp_path / "layout.json")])  # fmt: skip
    assert record["calibration"] == {"data": "../shared/data/wikitext-2-raw/wiki.valid.raw", "blocks": 2,
                                     "block_size": 32}  # fmt: skip
    assert sum(layer.count("local") for layer in record["head_layout"]) == 4


def test_without_data_offline_and_far_from_a_clone_the_command_says_to_pass_a_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["model", "--local_fraction", "0.5", "--local_window", "4"])
    assert "the Hub is offline (HF_HUB_OFFLINE): pass --data FILE" in capsys.readouterr().err
