"""benchmarks/float32_products_speed.py: both modes decode the same tokens on a tiny saved Llama (the copies kept are
exact), the ratio is printed, and a count below 1 is refused naming the flag."""

import pytest
import torch
import transformers

from benchmarks import float32_products_speed


def test_both_modes_decode_the_same_tokens_and_the_ratio_is_printed(tmp_path, capsys):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    threads = torch.get_num_threads()
    try:
        float32_products_speed.main(["--model", str(tmp_path), "--context", "16", "--steps", "3", "--rounds", "1"])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "widened each time: " in out and "copies kept: " in out
    assert "copies kept / widened each time: " in out and out.count("the same tokens: True") == 1


def test_a_count_below_one_is_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        float32_products_speed.main(["--steps", "0"])
    assert "--steps must be >= 1, got 0" in capsys.readouterr().err
