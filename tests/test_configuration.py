"""Presets, serialisation and refusal of every invalid field with a message that names it."""

import json
import logging

import pytest
import torch
from conftest import MODEL_TYPES, tiny_config
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config

import hf_attn


def test_presets():
    positional = hf_attn.PositionalGPT2Config(n_layer=2, n_head=3, n_embd=12, n_positions=9)
    assert positional.head_layout == [["positional"] * 3] * 2 and positional.attend_to_self
    assert positional.positional_encoding_dim == 9 == positional.positional_qk_dim  # Paper A: d_P = n + 1
    local = hf_attn.LocalGPT2Config(n_layer=1, n_head=2, n_embd=8)
    assert local.head_layout == [["local", "local"]] and local.attend_to_self is False and local.local_window == 1
    hybrid = hf_attn.HybridGPT2Config(n_layer=1, n_head=5, n_embd=10, num_local_heads=3)
    assert hybrid.head_layout == [["global", "global", "local", "local", "local"]]
    assert hf_attn.HybridGPT2Config(n_layer=1, n_head=4, n_embd=8).head_layout == [
        ["global", "global", "local", "local"]
    ]


def test_query_key_width_and_initialization_defaults():
    gpt2_style = hf_attn.HybridGPT2Config(n_layer=1, n_head=4, n_embd=32)
    assert gpt2_style.content_qk_dim == 8 and gpt2_style.initialization == "gpt2"  # GPT-2's head dim and init
    paper_a = hf_attn.HybridGPT2Config(n_layer=1, n_head=2, n_embd=64, block_style="concat_mlp", content_qk_dim=64)
    assert paper_a.content_qk_dim == 64 and paper_a.initialization == "paper_a"  # no residual: Paper A's init
    chosen = hf_attn.HybridGPT2Config(n_layer=1, n_head=2, n_embd=8, block_style="concat_mlp", initialization="gpt2")
    assert chosen.initialization == "gpt2"


@pytest.mark.parametrize(
    "positions,scaled", [("sinusoidal", True), ("learned", False), ("rope", False), ("none", False)]
)
def test_token_embeddings_are_scaled_by_default_only_under_sinusoidal_positions(positions, scaled, tmp_path):
    """Vaswani et al.'s sqrt(d_model) goes with their sinusoids; GPT-2 and RoPE add nothing that large. Either way an
    explicit choice is kept, also through save and load."""
    config = hf_attn.HybridGPT2Config(n_layer=1, n_head=2, n_embd=8, position_embedding_type=positions)
    assert config.scale_embedding is scaled
    chosen = hf_attn.HybridGPT2Config(
        n_layer=1, n_head=2, n_embd=8, position_embedding_type=positions, scale_embedding=not scaled
    )
    chosen.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).scale_embedding is (not scaled)


def test_a_config_saved_before_scale_embedding_existed_loads_unscaled(tmp_path):
    """Such a model was trained unscaled; a fresh config without the field still takes the new default."""
    config = hf_attn.HybridGPT2Config(n_layer=1, n_head=2, n_embd=8, position_embedding_type="sinusoidal")
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["scale_embedding"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert AutoConfig.from_pretrained(tmp_path).scale_embedding is False
    assert AutoConfig.from_pretrained(tmp_path, scale_embedding=True).scale_embedding is True
    del saved["transformers_version"]
    assert hf_attn.HybridGPT2Config.from_dict(saved).scale_embedding is True


def test_binary_encoding_width():
    config = hf_attn.PositionalGPT2Config(n_layer=1, n_head=1, n_embd=8, n_positions=100, positional_encoding="binary")
    assert config.positional_encoding_dim == 7  # 2^7 = 128 >= 100 positions


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_layout_and_fields_survive_json(model_type, tmp_path):
    layout = [["global", "positional"], ["local", "local"]]
    config = AutoConfig.for_model(
        model_type,
        n_layer=2,
        n_head=2,
        n_embd=8,
        head_layout=layout,
        local_window=3,
        is_causal=False,
        position_embedding_type="rope",
        positional_encoding="sinusoidal",
        block_style="concat_mlp",
    )
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert type(loaded) is type(config) and loaded.head_layout == layout
    assert (loaded.local_window, loaded.is_causal, loaded.block_style) == (3, False, "concat_mlp")


TYPO_WARNING = (
    "hybrid_gpt2 config: unknown field 'local_windw' (kept as an attribute, ignored by the model); "
    "did you mean 'local_window'?"
)


def unknown_field_warnings(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if "unknown field" in record.getMessage()]


def test_a_misspelt_field_warns_naming_the_closest_one_however_the_config_is_built(tmp_path, caplog):
    """transformers keeps the typo as an attribute and the model runs with the default (`local_window=1`)."""
    hf_attn.HybridGPT2Config(n_layer=1, n_head=2, n_embd=8).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, "local_windw": 2}))
    builds = [
        lambda: AutoConfig.for_model("hybrid_gpt2", local_windw=2),
        lambda: hf_attn.HybridGPT2Config(local_windw=2),
        lambda: hf_attn.HybridGPT2Config.from_dict({**saved, "local_windw": 2}),
        lambda: AutoConfig.from_pretrained(tmp_path),
    ]
    for build in builds:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hf_attn"):
            config = build()
        assert config.local_window == 1 and unknown_field_warnings(caplog) == [TYPO_WARNING]


def test_an_unrelated_unknown_key_warns_without_a_suggestion(caplog):
    with caplog.at_level(logging.WARNING, logger="hf_attn"):
        AutoConfig.for_model("local_gpt2", zebra_count=3)
    assert unknown_field_warnings(caplog) == [
        "local_gpt2 config: unknown field 'zebra_count' (kept as an attribute, ignored by the model)."
    ]


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_saved_configs_and_models_load_without_unknown_field_warnings(model_type, tmp_path, caplog):
    """Round trips carry keys transformers writes itself (`transformers_version`, `architectures`, `dtype`,
    `auto_map`, `output_attentions`, `_name_or_path`) and fields of the other types (`num_local_heads`)."""
    with caplog.at_level(logging.WARNING, logger="hf_attn"):
        config = tiny_config(model_type)
        config.save_pretrained(tmp_path / "config")
        AutoConfig.from_pretrained(tmp_path / "config")
        type(config).from_dict(config.to_dict())
        type(config).from_dict(hf_attn.HybridGPT2Config(n_layer=1, n_head=2, n_embd=8).to_dict())
        model = AutoModelForCausalLM.from_config(config)
        hf_attn.enable_remote_code(model)
        model.save_pretrained(tmp_path / "model")
        AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert "auto_map" in json.loads((tmp_path / "model" / "config.json").read_text())
    assert unknown_field_warnings(caplog) == []


def test_gpt2_keywords_do_not_warn(caplog):
    """GPT-2's fields and legacy `n_ctx`, generation parameters and what else a GPT-2 config.json holds."""
    gpt2 = {key: value for key, value in GPT2Config(n_layer=1).to_dict().items() if key != "model_type"}
    with caplog.at_level(logging.WARNING, logger="hf_attn"):
        AutoConfig.for_model("hybrid_gpt2", n_layer=2, n_embd=16, n_head=2, resid_pdrop=0.0, n_ctx=64)
        AutoConfig.for_model("local_gpt2", task_specific_params={"text-generation": {"do_sample": True}})
        AutoConfig.for_model("local_gpt2", **gpt2, max_length=50, do_sample=True)
    assert unknown_field_warnings(caplog) == []


BAD_FIELDS = [
    ({"local_window": 0}, "local_window"),
    ({"local_window": -2}, "local_window"),
    ({"local_window": 1.5}, "local_window"),
    ({"num_local_heads": 5}, "num_local_heads"),
    ({"num_local_heads": -1}, "num_local_heads"),
    ({"head_layout": [["global", "sparse"], ["global", "local"]]}, "head_layout"),
    ({"head_layout": [["global", "local"]]}, "head_layout"),
    ({"head_layout": [["global"], ["local"]]}, "head_layout"),
    ({"position_embedding_type": "alibi"}, "position_embedding_type"),
    ({"positional_encoding": "random"}, "positional_encoding"),
    ({"block_style": "parallel"}, "block_style"),
    ({"local_attention_impl": "flash"}, "local_attention_impl"),
    (
        {"positional_encoding": "onehot", "positional_encoding_dim": 5, "head_layout": [["global", "positional"]] * 2},
        "positional_encoding_dim",
    ),  # fmt: skip
    ({"positional_encoding": "sinusoidal", "positional_encoding_dim": 7}, "positional_encoding_dim"),
    ({"positional_qk_dim": 0}, "positional_qk_dim"),
    ({"content_qk_dim": 0}, "content_qk_dim"),
    ({"content_qk_dim": 5, "position_embedding_type": "rope"}, "content_qk_dim"),
    ({"initialization": "xavier"}, "initialization"),
    ({"n_embd": 9}, "n_embd"),
    ({"n_layer": 0}, "n_layer"),
    ({"n_inner": 0}, "n_inner"),
    ({"vocab_size": 0}, "vocab_size"),
    ({"rope_theta": 0.0}, "rope_theta"),
    ({"n_embd": 12, "n_head": 4, "position_embedding_type": "rope"}, "rope"),
    ({"numeric_token_id": 3}, "numeric_token_id"),
    ({"numeric_inputs": True, "numeric_token_id": 99}, "numeric_token_id"),
    ({"scale_embedding": "false"}, "scale_embedding"),
    ({"is_causal": 0}, "is_causal"),
    ({"attend_to_self": "yes"}, "attend_to_self"),
]


@pytest.mark.parametrize("fields,named", BAD_FIELDS)
def test_invalid_field_raises_value_error_naming_it(fields, named):
    base = dict(n_layer=2, n_head=2, n_embd=8, vocab_size=50)
    with pytest.raises(ValueError, match=named):
        hf_attn.HybridGPT2Config(**{**base, **fields})


@pytest.mark.parametrize(
    "fields,allowed",
    [
        ({"positional_encoding": "random"}, "['onehot', 'binary', 'sinusoidal', 'learned']"),
        ({"local_window": 0}, ">= 1"),
        ({"initialization": "normal"}, "['gpt2', 'paper_a']"),
    ],
)
def test_error_states_allowed_values(fields, allowed):
    with pytest.raises(ValueError) as error:
        hf_attn.LocalGPT2Config(**fields)
    assert allowed in str(error.value)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_gpt2_aliases_set_their_fields_before_derived_ones(model_type):
    """`num_hidden_layers=2` builds a 2-layer layout and `hidden_size` sets the query width, as `n_layer` and `n_embd`
    do (transformers would apply the alias after the layout was built from the default)."""
    aliased = AutoConfig.for_model(model_type, num_hidden_layers=2, hidden_size=48, num_attention_heads=4,
                                   max_position_embeddings=32)  # fmt: skip
    named = AutoConfig.for_model(model_type, n_layer=2, n_embd=48, n_head=4, n_positions=32)
    assert aliased.to_dict() == named.to_dict()
    assert len(aliased.head_layout) == 2 and aliased.content_qk_dim == 12


@pytest.mark.parametrize("alias", ["n_positions", "max_position_embeddings"])
@pytest.mark.parametrize("encoding,width", [("onehot", 64), ("binary", 6), ("sinusoidal", 32)])
def test_a_fixed_p_follows_n_positions_changed_after_the_config_is_made(alias, encoding, width, tmp_path):
    """As transformers' tests edit configs: the edited config saves, loads and builds a model of the new length."""
    config = AutoConfig.for_model("positional_gpt2", n_layer=1, n_head=2, n_embd=32, vocab_size=50, n_positions=11,
                                  positional_encoding=encoding)  # fmt: skip
    setattr(config, alias, 64)
    assert (config.n_positions, config.positional_encoding_dim, config.positional_qk_dim) == (64, width, width)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert (loaded.n_positions, loaded.positional_encoding_dim) == (64, width)
    model = AutoModelForCausalLM.from_config(loaded).eval()
    assert model(torch.arange(40)[None] % loaded.vocab_size).logits.shape[1] == 40  # positions beyond the old 11


def test_a_given_positional_width_stays_when_n_positions_changes():
    fields = dict(positional_encoding="learned", positional_encoding_dim=24, positional_qk_dim=8)
    config = AutoConfig.for_model("positional_gpt2", n_layer=1, n_head=2, n_embd=32, n_positions=11, **fields)
    config.n_positions = 64
    assert (config.positional_encoding_dim, config.positional_qk_dim) == (24, 8)
