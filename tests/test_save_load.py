"""save_pretrained / from_pretrained, every Auto class, and remote code where hf_attn cannot be imported."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import MODEL_TYPES, tiny_config
from hub_checks import HF_ATTN_CODE
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

import hf_attn

AUTO_CLASSES = {
    "AutoModel": AutoModel,
    "AutoModelForCausalLM": AutoModelForCausalLM,
    "AutoModelForSequenceClassification": AutoModelForSequenceClassification,
    "AutoModelForTokenClassification": AutoModelForTokenClassification,
}
# Fixed tables (sinusoidal positions, one-hot and binary P) are rebuilt, not saved: cover each.
ENCODINGS = [
    {"position_embedding_type": "sinusoidal", "positional_encoding": "onehot"},
    {"position_embedding_type": "rope", "positional_encoding": "binary"},
    {"position_embedding_type": "learned", "positional_encoding": "learned", "block_style": "post_ln"},
]
# Heads not grouped by kind, as in the README's example: kinds split apart (layer 0) and kinds contiguous but out
# of kind order (layer 1), so both head selections and the restoring of head order must survive loading.
UNGROUPED_LAYOUT = [["global", "local", "positional", "local"], ["local", "global", "global", "positional"]]


def main_output(outputs) -> torch.Tensor:
    return outputs.logits if hasattr(outputs, "logits") else outputs.last_hidden_state


def check_round_trip(auto_name: str, config, path) -> None:
    """Saved and loaded through `auto_name`, the model is of the same class and config and gives the same outputs."""
    auto_class = AUTO_CLASSES[auto_name]
    model = auto_class.from_config(config).eval()
    assert type(model) is hf_attn.MODEL_CLASSES[type(model.config)][auto_name]
    model.save_pretrained(path)
    loaded = auto_class.from_pretrained(path).eval()
    assert type(loaded) is type(model)
    assert loaded.config.to_diff_dict() | {"_name_or_path": ""} == model.config.to_diff_dict() | {"_name_or_path": ""}
    input_ids = torch.randint(3, 37, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(main_output(loaded(input_ids)), main_output(model(input_ids)), atol=0, rtol=0)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("auto_name", AUTO_CLASSES)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_round_trip_through_every_auto_class(model_type, auto_name, encoding, tmp_path):
    check_round_trip(auto_name, tiny_config(model_type, num_labels=3, **encoding), tmp_path)


@pytest.mark.parametrize("auto_name", AUTO_CLASSES)
def test_ungrouped_layout_round_trips_through_every_auto_class(auto_name, tmp_path):
    check_round_trip(auto_name, tiny_config("hybrid_gpt2", num_labels=3, head_layout=UNGROUPED_LAYOUT), tmp_path)


def test_autoconfig_builds_each_type():
    for model_type, config_class in zip(
        MODEL_TYPES, (hf_attn.PositionalGPT2Config, hf_attn.LocalGPT2Config, hf_attn.HybridGPT2Config), strict=True
    ):
        assert type(AutoConfig.for_model(model_type)) is config_class


REMOTE_SCRIPT = textwrap.dedent(
    """
    import os
    import sys
    sys.modules["hf_attn"] = None  # importing hf_attn now fails: only the exported code can load the model
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification
    path, expected = sys.argv[1], torch.load(sys.argv[2])
    config = AutoConfig.from_pretrained(path, trust_remote_code=True)
    assert config.model_type == "hybrid_gpt2", config.model_type
    for auto in (AutoModel, AutoModelForSequenceClassification, AutoModelForTokenClassification):
        loaded = auto.from_pretrained(path, trust_remote_code=True).eval()
        assert type(loaded).__module__.startswith("transformers_modules"), type(loaded).__module__
        trunk = getattr(loaded, "transformer", loaded)  # the task heads are new; the trunk is the saved one
        with torch.no_grad():
            hidden = trunk(expected["input_ids"]).last_hidden_state
        torch.testing.assert_close(hidden, expected["hidden"], atol=0, rtol=0)
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
    assert "hf_attn" not in sys.modules or sys.modules["hf_attn"] is None
    with torch.no_grad():
        logits = model(expected["input_ids"]).logits
    torch.testing.assert_close(logits, expected["logits"], atol=0, rtol=0)
    tokens = model.generate(expected["input_ids"], max_new_tokens=5, do_sample=False)
    assert torch.equal(tokens, expected["tokens"])
    model.save_pretrained(path + "-resaved")  # transformers' own save: the card templates stay with hf_attn
    assert os.path.isfile(os.path.join(path + "-resaved", "model.safetensors"))
    assert not os.path.exists(os.path.join(path + "-resaved", "README.md"))
    print("remote ok", type(model).__name__)
    """
)


@pytest.mark.parametrize("model_type", ["local_gpt2", "hybrid_gpt2"])
def test_a_config_whose_n_positions_changed_after_building_saves_and_loads(model_type, tmp_path):
    """Fields that apply only to positional heads (one-hot P's width follows n_positions) do not block a model
    without them. With rotary positions no weight depends on n_positions, so the model loads back whole (learned
    positions would not load, as for GPT-2: their table has n_positions rows)."""
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, position_embedding_type="rope")).eval()
    model.config.n_positions = 128
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.n_positions == 128
    input_ids = torch.randint(3, 37, (2, 6))
    torch.testing.assert_close(loaded(input_ids).logits, model(input_ids).logits, atol=0, rtol=0)


@pytest.mark.parametrize("model_type", ["positional_gpt2", "local_gpt2"])
def test_a_model_whose_n_positions_changed_after_it_was_built_is_refused_naming_the_field(model_type, tmp_path):
    """Its learned positions (and a one-hot P's width) have a row per position: a config saying otherwise would
    save a checkpoint that does not load. The edited config itself saves, and builds a model that does."""
    model = AutoModelForCausalLM.from_config(tiny_config(model_type))
    model.config.n_positions = 128
    with pytest.raises(ValueError, match=r"`n_positions`=128 \(built with 64\).*from_config"):
        model.save_pretrained(tmp_path / "stale")
    rebuilt = AutoModelForCausalLM.from_config(model.config)
    rebuilt.save_pretrained(tmp_path / "rebuilt")
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "rebuilt").config.n_positions == 128


def test_remote_code_is_enabled_for_one_model_not_its_class(tmp_path):
    """transformers' `register_for_auto_class` marks the class: every later model of it would save its code."""
    shared = AutoModelForCausalLM.from_config(tiny_config("local_gpt2"))
    other = AutoModelForCausalLM.from_config(tiny_config("local_gpt2"))
    assert type(shared) is type(other)
    hf_attn.enable_remote_code(shared)
    shared.save_pretrained(tmp_path / "remote")
    other.save_pretrained(tmp_path / "plain")
    assert HF_ATTN_CODE <= set(os.listdir(tmp_path / "remote"))
    assert not HF_ATTN_CODE & set(os.listdir(tmp_path / "plain"))
    assert "auto_map" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    assert shared.is_remote_code() and not other.is_remote_code() and type(other)._auto_class is None


def test_remote_code_loads_in_a_process_without_hf_attn(tmp_path):
    config = tiny_config("hybrid_gpt2", eos_token_id=None, head_layout=UNGROUPED_LAYOUT)
    model = AutoModelForCausalLM.from_config(config).eval()
    hf_attn.enable_remote_code(model)
    model.save_pretrained(tmp_path / "model")
    saved = json.loads((tmp_path / "model" / "config.json").read_text())
    assert set(saved["auto_map"]) == {"AutoConfig", *AUTO_CLASSES}
    assert HF_ATTN_CODE <= set(os.listdir(tmp_path / "model"))
    input_ids = torch.randint(3, 37, (2, 6))
    with torch.no_grad():
        outputs = model(input_ids, output_hidden_states=True)
    expected = {"input_ids": input_ids, "logits": outputs.logits, "hidden": outputs.hidden_states[-1]}
    expected["tokens"] = model.generate(input_ids, max_new_tokens=5, do_sample=False)
    torch.save(expected, tmp_path / "expected.pt")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    result = subprocess.run(
        [sys.executable, "-c", REMOTE_SCRIPT, str(tmp_path / "model"), str(tmp_path / "expected.pt")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "remote ok HybridGPT2LMHeadModel" in result.stdout


def test_a_checkpoint_saved_with_the_removed_masked_route_loads_on_the_banded_one(tmp_path, caplog):
    """`local_attention_impl="masked"` computed the same attention through a T x T mask (now a benchmark baseline,
    `benchmarks.common.masked_local_attention`): older checkpoints load on the default route, with a warning."""
    model = AutoModelForCausalLM.from_config(tiny_config("local_gpt2")).eval()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "local_attention_impl": "masked"}))
    with caplog.at_level(logging.WARNING):
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert "`local_attention_impl`='masked' is no longer offered" in caplog.text
    assert "['banded', 'compiled']" in caplog.text  # the allowed values
    assert loaded.config.local_attention_impl == "banded"
    input_ids = torch.randint(3, 37, (2, 12))
    torch.testing.assert_close(loaded(input_ids).logits, model(input_ids).logits)
