"""Where a model's weights come from, for the cards of hybridized checkpoints: `BaseModel` (a name, a Hub repository,
a license, a GGUF file), read from a GGUF file's header, a Hub repository's card, or a local folder's card.
`hf_attn.pretrained.load_causal_lm` records it in `config.base_model`; `hf_attn.hub` writes it into the card.
"""

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import ModelCard, hf_hub_download, try_to_load_from_cache
from huggingface_hub.utils import HFValidationError, validate_repo_id

from .hybrid import FAMILIES

CARD_FILE = "README.md"
HUB_URL = "https://huggingface.co/"

# --- a base's license and name ---------------------------------------------------------------------------------


def hub_license(
    repo_id: str, revision: str | None = None, token: str | bool | None = None, download: bool = True
) -> str | None:
    """The license in the Hub card (README.md) of `repo_id`: fetched, or read from the Hub cache when offline or not
    to `download` (writing a card never calls the Hub). None where there is no card, no license in it, or no way to
    it."""
    try:
        card_file = (hf_hub_download(repo_id, CARD_FILE, revision=revision, token=token) if download
                     else try_to_load_from_cache(repo_id, CARD_FILE, revision=revision))  # fmt: skip
        return ModelCard.load(card_file).data.license if isinstance(card_file, str) else None
    except (OSError, ValueError):  # not found, offline and not cached, or a card whose metadata does not parse
        return None


@dataclass(frozen=True)
class BaseModel:
    """What a model's weights come from: `hf_attn.pretrained` records it in `config.base_model` (a dict, so that
    config.json holds it and `hybridize`, which copies every config field, keeps it), and the card of a hybridized
    checkpoint names it, with its license."""

    name: str  # what the card's text calls it
    repo_id: str | None = None  # its Hub repository: the card's `base_model`
    license: str | None = None  # its license (a GGUF header's, or its Hub card's): the card's `license`
    gguf_file: str | None = None  # the GGUF file its weights were unpacked from

    @classmethod
    def of(cls, config) -> "BaseModel | None":
        """The base recorded in `config`, else the Hub repository `from_pretrained` loaded it from (`name_or_path`,
        see `from_hub_cache`), else None: nothing is said of a base that is not known."""
        if recorded := getattr(config, "base_model", None):
            return cls(**recorded)
        return cls.from_hub_cache(config.name_or_path) if config.name_or_path else None

    @classmethod
    def from_hub_cache(cls, name: str) -> "BaseModel | None":
        """`name` where it is a Hub repository in the Hub cache of a family `hybridize` takes (what `from_pretrained`
        loaded a model from before `hybridize`), with its card's license where that is cached too. None for a
        hybridized checkpoint (whose own name is no base), a local folder, or a name the cache does not hold."""
        try:
            config_file = try_to_load_from_cache(name, "config.json")
        except ValueError:  # no Hub id: a path
            return None
        family = json.loads(Path(config_file).read_text()).get("model_type") if isinstance(config_file, str) else None
        return cls(name=name, repo_id=name, license=hub_license(name, download=False)) if family in FAMILIES else None

    def paragraph(self, config) -> str:
        """The card's words on the base: what it is, what `hybridize` did to its weights, and its license."""
        named = f"[{self.repo_id}]({HUB_URL}{self.repo_id})" if self.repo_id else f"`{self.name}`, a local checkpoint"
        if self.gguf_file is not None:
            where = f"{named}, its GGUF file" if self.repo_id else "the GGUF file"
            named = f'{where} `{self.gguf_file}` ("{self.name}"), unpacked to float weights'
        positional = any("positional" in layer for layer in config.head_layout)
        added = "; positional heads add their own projection `p_attn`" if positional else ""
        license = f"`{self.license}`, the base's" if self.license else "the base's (none was recorded with it)"
        return (f"**Base model**: {named}. `hf_attn.hybridize` kept its weights and changed only what each head "
                f"sees{added}. License: {license}.")  # fmt: skip


# --- GGUF headers ----------------------------------------------------------------------------------------------

# GGUF's value types (ggml's docs/gguf.md): struct formats of the scalars by type code; 8 is a string, 9 an array.
GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
GGUF_UINT32, GGUF_UINT64, GGUF_STRING, GGUF_ARRAY = 4, 10, 8, 9
# Header keys that may hold a GGUF file's Hub repository, the file's own first, then the one it was converted from.
GGUF_REPO_KEYS = ("general.repo_url", "general.source.repo_url", "general.source.huggingface.repository")


def gguf_metadata(path: str | os.PathLike, prefix: str = "general.") -> dict:
    """The header values of a GGUF file (version 2 or later) whose keys start with `prefix`: by default its
    `general.*` facts (name, license, source repository). Read by walking the header, skipping the rest: the `gguf`
    package's GGUFReader parses every field first, 6 s for SmolLM2's 49,152-token vocabulary."""
    metadata = {}
    with open(path, "rb") as file:

        def number(kind: int):
            form = "<" + GGUF_SCALARS[kind]
            return struct.unpack(form, file.read(struct.calcsize(form)))[0]

        def value(kind: int, keep: bool):
            if kind == GGUF_STRING:
                text = file.read(number(GGUF_UINT64))
                return text.decode("utf-8", "replace") if keep else None
            if kind != GGUF_ARRAY:
                return number(kind)
            item_kind, count = number(GGUF_UINT32), number(GGUF_UINT64)
            if not keep and item_kind in GGUF_SCALARS:  # skipped whole: a vocabulary's scores, token types
                file.seek(count * struct.calcsize(GGUF_SCALARS[item_kind]), os.SEEK_CUR)
                return None
            return [value(item_kind, keep) for _ in range(count)]

        if file.read(4) != b"GGUF" or number(GGUF_UINT32) < 2:
            raise ValueError(f"{path} is not a GGUF file of version 2 or later")
        number(GGUF_UINT64)  # how many tensors follow the header
        for _ in range(number(GGUF_UINT64)):
            key = value(GGUF_STRING, keep=True)
            kept = value(number(GGUF_UINT32), keep=key.startswith(prefix))
            if key.startswith(prefix):
                metadata[key] = kept
    return metadata


def hub_repo(reference: str | None) -> str | None:
    """The Hub id in a repository reference of a GGUF header ("https://huggingface.co/org/name" or "org/name"),
    None for anything else."""
    if not reference:
        return None
    repo_id = "/".join(reference.removeprefix(HUB_URL).split("/")[:2]) if reference.startswith(HUB_URL) else reference
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return None
    return repo_id


def gguf_base(path: str | os.PathLike, repo_id: str | None, hub_kwargs: dict) -> BaseModel:
    """A GGUF file's base: the Hub repository it is in (`repo_id`, else its header's), its name and license from its
    header (the license from the repository's card where the header has none)."""
    metadata = gguf_metadata(path)
    repo_id = repo_id or next(filter(None, (hub_repo(metadata.get(key)) for key in GGUF_REPO_KEYS)), None)
    license = metadata.get("general.license") or (hub_license(repo_id, **hub_kwargs) if repo_id else None)
    return BaseModel(name=metadata.get("general.name") or Path(path).stem, repo_id=repo_id, license=license,
                     gguf_file=Path(path).name)  # fmt: skip


def folder_base(folder: Path) -> BaseModel | None:
    """A local folder's base as its own card tells it: the license in its README, under the card's model name. None
    without a card or a license there (a folder's Hub id, if any, is not recorded in it)."""
    try:
        card = ModelCard.load(folder / CARD_FILE).data
    except (OSError, ValueError):
        return None
    return BaseModel(name=card.model_name or folder.name, license=card.license) if card.license else None


__all__ = ["BaseModel", "CARD_FILE", "HUB_URL", "gguf_metadata", "hub_license"]
