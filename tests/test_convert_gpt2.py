"""GPT-2 checkpoints converted to hybrid_gpt2 / local_gpt2: exact logits, kept weights, training, saving, the CLI."""

import json
import re
import subprocess
import sys

import pytest
import torch
from conftest import tiny_config
from huggingface_hub import ModelCard
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, GPT2Model, PreTrainedTokenizerFast

from hf_attn import convert_gpt2
from hf_attn.convert_gpt2 import conversion_note, main
from hf_attn.hub import write_model_type_card

# Non-default values wherever GPT-2 has a choice, to see each carried over; dropout stays on (eval mode ignores it).
GPT2_FIELDS = dict(
    n_layer=2,
    n_embd=32,
    n_head=4,
    vocab_size=50,
    n_positions=64,
    activation_function="gelu",
    layer_norm_epsilon=1e-6,
    resid_pdrop=0.05,
    embd_pdrop=0.05,
    attn_pdrop=0.05,
    scale_attn_by_inverse_layer_idx=True,
    bos_token_id=0,
    eos_token_id=1,
)
CONVERSIONS = {
    "hybrid": ("hybrid_gpt2", {"num_local_heads": 2, "local_window": 1}),
    "local": ("local_gpt2", {"local_window": 2}),
    "interleaved": ("hybrid_gpt2", {"head_layout": [["global", "local"] * 2] * 2, "local_window": 1}),
}


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<|endoftext|>": 0, **{c: i + 1 for i, c in enumerate("abcdefghij")}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """A tiny GPT-2 saved with save_pretrained (and a tokenizer), as a downloaded checkpoint would be."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("gpt2")
    GPT2LMHeadModel(GPT2Config(**GPT2_FIELDS)).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture
def gpt2(gpt2_dir):
    return GPT2LMHeadModel.from_pretrained(gpt2_dir).eval()


def logits(model, input_ids, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids, **kwargs).logits


def test_global_inclusive_conversion_reproduces_gpt2_logits(gpt2_dir, gpt2):
    model = convert_gpt2(gpt2_dir, "hybrid_gpt2", num_local_heads=0, attend_to_self=True)
    assert type(model).__name__ == "HybridGPT2LMHeadModel" and not model.training
    for field, value in GPT2_FIELDS.items():
        assert getattr(model.config, field) == value, field
    input_ids = torch.randint(0, 50, (3, 20))
    torch.testing.assert_close(logits(model, input_ids), logits(gpt2, input_ids), atol=1e-6, rtol=0)

    # Left padding: GPT-2 given the positions hf_attn derives from the mask (real tokens counted from 0).
    attention_mask = torch.ones(3, 20, dtype=torch.long)
    attention_mask[0, :6] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    real = attention_mask.bool()
    expected = logits(gpt2, input_ids, attention_mask=attention_mask, position_ids=position_ids)
    got = logits(model, input_ids, attention_mask=attention_mask)
    torch.testing.assert_close(got[real], expected[real], atol=1e-6, rtol=0)


def test_every_layout_keeps_gpt2_head_order(gpt2):
    """Local heads whose window covers the whole sequence are global ones: any layout then gives GPT-2's logits,
    which holds only if head h of the layout runs on GPT-2's head h."""
    layout = [["local", "global", "local", "global"], ["global", "local", "local", "global"]]
    model = convert_gpt2(gpt2, "hybrid_gpt2", head_layout=layout, local_window=63, attend_to_self=True)
    input_ids = torch.randint(0, 50, (2, 20))
    torch.testing.assert_close(logits(model, input_ids), logits(gpt2, input_ids), atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "model_type,overrides,same",
    [
        ("hybrid_gpt2", {"num_local_heads": 0, "attend_to_self": True}, True),
        ("hybrid_gpt2", {"num_local_heads": 0}, False),  # strict masks: no token sees itself
        ("hybrid_gpt2", {"num_local_heads": 2, "local_window": 1, "attend_to_self": True}, False),
        ("local_gpt2", {"local_window": 2}, False),
    ],
)
def test_only_a_global_inclusive_layout_keeps_gpt2_logits(gpt2, model_type, overrides, same):
    input_ids = torch.randint(0, 50, (2, 16))
    model = convert_gpt2(gpt2, model_type, **overrides)
    assert torch.allclose(logits(model, input_ids), logits(gpt2, input_ids), atol=1e-6) == same


@pytest.mark.parametrize("conversion", CONVERSIONS)
def test_converted_model_keeps_weights_trains_generates_and_saves(gpt2_dir, gpt2, conversion, tmp_path):
    model_type, overrides = CONVERSIONS[conversion]
    model = convert_gpt2(gpt2_dir, model_type, **overrides)
    assert model.config.model_type == model_type and model.dtype == gpt2.dtype
    state = model.state_dict()
    for name, value in gpt2.state_dict().items():  # wte, wpe, ln_*, c_attn, c_proj, mlp, lm_head
        assert torch.equal(state[name], value), name
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.generation_config.eos_token_id == gpt2.generation_config.eos_token_id

    input_ids = torch.randint(0, 50, (4, 16))
    assert torch.isfinite(logits(model, input_ids)).all()
    tokens = model.generate(input_ids[:2, :5], max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert tokens.shape == (2, 9)

    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model) and loaded.config.head_layout == model.config.head_layout
    torch.testing.assert_close(logits(loaded, input_ids), logits(model, input_ids), atol=0, rtol=0)

    with torch.no_grad():
        before = model(input_ids, labels=input_ids).loss
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(5):
        model(input_ids, labels=input_ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    with torch.no_grad():
        assert model(input_ids, labels=input_ids).loss < before


def test_cli_writes_model_tokenizer_and_summary(gpt2_dir, tmp_path):
    out = tmp_path / "converted"
    command = [sys.executable, "-m", "hf_attn.convert_gpt2", str(gpt2_dir), str(out)]
    command += ["--model_type", "hybrid_gpt2", "--num_local_heads", "2", "--local_window", "1", "--attend_to_self"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "hybrid_gpt2"
    assert config["head_layout"] == [["global", "global", "local", "local"]] * 2
    assert (config["local_window"], config["attend_to_self"], config["n_embd"]) == (1, True, 32)
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert "parameters" in result.stdout and "layers 0-1: 2 global + 2 local" in result.stdout
    assert "local_window=1, inclusive masks" in result.stdout and "saved the tokenizer" in result.stdout
    card = ModelCard.load(out / "README.md")
    assert "hybrid_gpt2" in card.data.tags and card.data.base_model is None  # a local folder is no Hub id
    assert "Its weights come from a GPT-2 checkpoint, converted by `hf_attn.convert_gpt2`" in card.text
    assert "Its local heads change what GPT-2's heads see" in card.text  # inclusive masks: only the local heads
    assert (
        "- **local** heads (`local_window` = 1): each query attends by content to the previous position and itself"
        in card.text
    )


def test_the_card_says_where_the_weights_come_from_and_what_the_layout_changes(gpt2, tmp_path):
    same = convert_gpt2(gpt2, "hybrid_gpt2", num_local_heads=0, attend_to_self=True)
    note = conversion_note("openai-community/gpt2", same.config)
    assert note.startswith("Its weights come from the GPT-2 checkpoint `openai-community/gpt2`")
    assert note.endswith("With global heads and inclusive masks only, it computes what GPT-2 does.")
    local = convert_gpt2(gpt2, "local_gpt2")
    assert "Its local heads and strict masks change what GPT-2's heads see" in conversion_note(None, local.config)
    local.save_pretrained(tmp_path)
    write_model_type_card(local, tmp_path, base_model="openai-community/gpt2", conversion=note)
    assert ModelCard.load(tmp_path / "README.md").data.base_model == "openai-community/gpt2"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--model_type", "positional_gpt2"], "positional heads take their queries"),
        (["--model_type", "gpt3"], r"`model_type` must be one of \['hybrid_gpt2', 'local_gpt2'\], got 'gpt3'"),
        (["--local_window", "0"], "`local_window` must be an integer >= 1"),
        (["--num_local_heads", "5"], r"`num_local_heads` must be in \[0, n_head=4\], got 5"),
        (["--model_type", "local_gpt2", "--num_local_heads", "2"], "`num_local_heads` is not a field of LocalGPT2"),
        (["--tokenizer", "/no/such/tokenizer"], "holds no tokenizer"),
    ],
)
def test_cli_refuses_bad_input_with_the_field(gpt2_dir, tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main([str(gpt2_dir), str(tmp_path / "out"), *argv])
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_bad_sources_and_overrides_are_refused(gpt2, tmp_path):
    AutoModelForCausalLM.from_config(tiny_config("hybrid_gpt2")).save_pretrained(tmp_path / "hybrid")
    with pytest.raises(ValueError, match="`model_type`='hybrid_gpt2'; only GPT-2 checkpoints"):
        convert_gpt2(tmp_path / "hybrid")
    with pytest.raises(ValueError, match="is neither a checkpoint folder nor a loadable Hub id"):
        convert_gpt2(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="must be a GPT2LMHeadModel, a Hub id or a folder, got GPT2Model"):
        convert_gpt2(GPT2Model(gpt2.config))
    with pytest.raises(ValueError, match="`n_embd` comes from the GPT-2 checkpoint"):
        convert_gpt2(gpt2, n_embd=64)
    with pytest.raises(ValueError, match="`position_embedding_type` must be 'learned'"):
        convert_gpt2(gpt2, position_embedding_type="rope")
    with pytest.raises(ValueError, match=r"\['positional'\] heads have no GPT-2 counterpart"):
        convert_gpt2(gpt2, head_layout=[["global", "local", "positional", "global"]] * 2)
    with pytest.raises(ValueError, match="`local_wndow` is not a field of HybridGPT2Config"):
        convert_gpt2(gpt2, local_wndow=2)
