"""`python -m hf_attn.select_heads`: scores on a model whose retrieval head is known, and the command end to end."""

import functools
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from gguf_files import write_llama_gguf
from huggingface_hub import ModelCard
from retrieval_task import retrieval_rows
from transformers import LlamaConfig, LlamaForCausalLM

import hf_attn.select_heads
from hf_attn import hybridize
from hf_attn.gate_scores import gate_scores, retrieval_scores, train_gates
from hf_attn.select_heads import (
    SCORES,
    apply_layout,
    calibration_ids,
    choose_layout,
    loss_scores,
    main,
    mass_beyond_window,
    mass_scores,
    score_named,
)

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
    model = apply_layout(LlamaForCausalLM.from_pretrained(tmp_path / "model"), output)
    assert sum(layer.count("local") for layer in model.config.kv_head_layout) == 2 and model.config.local_window == 4
    # The card says how the layout was chosen and what the scoring cost, while the layout is that one.
    model.save_pretrained(tmp_path / "hybrid")
    cost = record["cost"]
    assert (f"`hf_attn.select_heads` ranked the key/value groups of `{tmp_path / 'model'}` by its `{score}` score on "
            f"3 calibration blocks of 32 tokens ({SHARED / 'wikitext-2-raw' / 'wiki.valid.raw'}) and made the lowest "
            f"50% local. Measured cost of the scoring: {cost['seconds']:g} s, forward passes: {cost['forward_passes']} "
            f"over {cost['forward_tokens']} tokens, 0 of them followed by a backward pass."
            ) in ModelCard.load(tmp_path / "hybrid" / "README.md").text  # fmt: skip
    hybridize(model, num_local_heads=2, local_window=4).save_pretrained(tmp_path / "changed")
    assert "How the layout was chosen" not in (tmp_path / "changed" / "README.md").read_text()


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


# --- refusals: one line naming the argument and what it allows, before any pass or model load ---------------------

NEVER_RUN = SimpleNamespace(config=LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
                            device="cpu")  # every refusal comes before the model is called  # fmt: skip
IDS = torch.zeros(2, 64, dtype=torch.long)
SCORING = dict(local_window=4, sink_tokens=0, batch_size=1, unit="kv_group")  # fine: each case spoils one
UNITS = "['kv_group', 'head']"
# function, its arguments, and the start of the message that refuses them
REFUSED = {
    "window": (mass_scores, (NEVER_RUN, IDS), dict(local_window=0), "`local_window` must be an int >= 1, got 0"),
    "float k": (loss_scores, (NEVER_RUN, IDS), dict(local_window=2.5), "`local_window` must be an int >= 1, got 2.5"),
    "sinks": (mass_scores, (NEVER_RUN, IDS), dict(sink_tokens=-1), "`sink_tokens` must be an int >= 0, got -1"),
    "bool S": (train_gates, (NEVER_RUN, None), dict(sink_tokens=True), "`sink_tokens` must be an int >= 0, got True"),
    "batch": (gate_scores, (NEVER_RUN, IDS), dict(batch_size=0), "`batch_size` must be an int >= 1, got 0"),
    "steps": (gate_scores, (NEVER_RUN, IDS), dict(steps=0), "`steps` must be an int >= 1, got 0"),
    "passkeys": (retrieval_scores, (NEVER_RUN, IDS), dict(num_passkeys=0), "`num_passkeys` must be in 1..10, got 0"),
    "mass unit": (mass_scores, (NEVER_RUN, IDS), dict(unit="layer"), f"`unit` must be one of {UNITS}, got 'layer'"),
    "retrieval unit": (retrieval_scores, (NEVER_RUN, IDS), dict(unit="l"), f"`unit` must be one of {UNITS}, got 'l'"),
}  # fmt: skip
OTHER_REFUSALS = {  # the functions around the scores
    "fraction": (lambda: choose_layout(torch.zeros(2, 2), 1.5, heads=4), "`local_fraction` must be in [0, 1], got 1.5"),
    "units": (lambda: choose_layout(torch.zeros(2, 3), 0.5, heads=4),
              "`scores` must be (layers, units) with `heads` (4) a multiple of units, got (2, 3)"),
    "score": (lambda: score_named("best"), f"`score` must be one of {list(SCORES)}, got 'best'"),
    "block size": (lambda: calibration_ids(None, None, 0, 1), "`block_size` must be an int >= 1, got 0"),
    "blocks": (lambda: calibration_ids(None, None, 8, 0), "`num_blocks` must be an int >= 1, got 0"),
    "record": (lambda: apply_layout(NEVER_RUN, {"head_layout": [["local"] * 4] * 2}),
               "`record` must be what `python -m hf_attn.select_heads` wrote; it lacks ['model', 'score', "),
}  # fmt: skip


@pytest.mark.parametrize("case", [*REFUSED, *OTHER_REFUSALS])
def test_bad_arguments_are_refused_naming_them_and_what_is_allowed(case):
    if case in REFUSED:
        function, args, spoiled, message = REFUSED[case]
        call = functools.partial(function, *args, **SCORING | spoiled)
    else:
        call, message = OTHER_REFUSALS[case]
    with pytest.raises(ValueError) as refused:
        call()
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


VALIDATION_TEXT = str(SHARED / "wikitext-2-raw" / "wiki.valid.raw")
EXCEEDS = "--block_size must exceed --sink_tokens + --local_window + 1 (33), got 32"
MISSING = "does not exist (a .gguf file, a model folder, or a folder holding one .gguf file)"


@pytest.mark.parametrize(
    ("model", "argv", "message"),
    [
        ("model", ["--local_fraction", "1.5"], "--local_fraction must be in [0, 1], got 1.5"),
        ("model", ["--batch_size", "0"], "--batch_size must be >= 1, got 0"),
        ("model", ["--sink_tokens", "-1"], "--sink_tokens must be >= 0, got -1"),
        ("model", ["--local_window", "32", "--block_size", "32"], EXCEEDS),
        ("model", ["--local_window", "16", "--sink_tokens", "16", "--block_size", "32"], EXCEEDS),  # sinks fill it
        ("model", ["--score", "best"], "argument --score: invalid choice: 'best' (choose from "),
        ("model", ["--unit", "layer"], "argument --unit: invalid choice: 'layer' (choose from "),
        ("model", ["--data", "missing.txt"], "--data must be a calibration text file, got missing.txt (no such file)"),
        ("model", ["--tokenizer", "/tmp/missing-tokenizer"], f"argument --tokenizer: /tmp/missing-tokenizer {MISSING}"),
        ("/tmp/missing.gguf", [], f"argument model: /tmp/missing.gguf {MISSING}"),
        ("bad name", [], "argument model: 'bad name' is neither a packaged model ('smollm2-135m-instruct', "),
    ],
)  # fmt: skip
def test_the_command_refuses_bad_arguments_in_one_line_before_loading(model, argv, message, capsys, monkeypatch):
    monkeypatch.setattr(hf_attn.select_heads, "load_causal_lm", lambda *args, **kwargs: pytest.fail("loaded"))
    with pytest.raises(SystemExit):
        main([model, "--local_fraction", "0.5", "--local_window", "4", "--data", VALIDATION_TEXT, *argv])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in error
    if "--score" in argv:  # argparse lists the choices
        assert all(f"'{name}'" in error for name in SCORES)


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
