"""WikiText-2 (raw) for causal language modelling: the Hub when online, a local folder always.

Paper B trains on WikiText-2's train split and reports test perplexity. The train split is large and lives on the
Hub; offline, a folder of `wiki.{train,valid,test}.raw` files works, and when it lacks the train split the
reduced protocol trains on validation and evaluates on test, which every output must say.
"""

from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np

from ..hub import hub_offline

WIKITEXT_FILES = {"train": "wiki.train.raw", "validation": "wiki.valid.raw", "test": "wiki.test.raw"}
HUB_DATASET = ("wikitext", "wikitext-2-raw-v1")


@dataclass(frozen=True)
class WikiTextSplits:
    """Raw text of the splits to train and evaluate on, and how they were chosen."""

    train_text: str
    eval_text: str
    protocol: str  # "full" (train -> test) or "reduced" (validation -> test)
    source: str
    train_source: str  # where each text comes from (a file, or the Hub's split), for messages
    eval_source: str

    @property
    def description(self) -> str:
        if self.protocol == "full":
            return f"WikiText-2 train -> test ({self.source})"
        return (f"REDUCED PROTOCOL: trained on WikiText-2 validation, evaluated on test, because the train split "
                f"is not in {self.source}")  # fmt: skip


def load_wikitext(data_dir: str | Path | None = None) -> WikiTextSplits:
    """The local folder `data_dir` if given, else the Hub's `wikitext-2-raw-v1` (needs the network)."""
    if data_dir is not None:
        return _from_folder(Path(data_dir))
    if hub_offline():
        raise ValueError(
            "No `data_dir` given and the Hub is offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE): pass a folder of "
            f"{', '.join(WIKITEXT_FILES.values())} files, e.g. `--data_dir ../shared/data/wikitext-2-raw` "
            "(validation and test only), or go online to download the full dataset from the Hub."
        )
    hub = datasets.load_dataset(*HUB_DATASET)
    texts = {split: "".join(hub[split]["text"]) for split in WIKITEXT_FILES}
    source = "the Hub's wikitext-2-raw-v1"
    return WikiTextSplits(texts["train"], texts["test"], "full", source, f"{source} train", f"{source} test")


def _from_folder(folder: Path) -> WikiTextSplits:
    if not folder.is_dir():
        raise ValueError(
            f"`data_dir` {folder} is not a folder. It must hold {', '.join(WIKITEXT_FILES.values())} (WikiText-2 raw); "
            "offline, ../shared/data/wikitext-2-raw has the validation and test files; online, leave `data_dir` "
            "unset to download everything from the Hub."
        )
    present = {split: folder / name for split, name in WIKITEXT_FILES.items() if (folder / name).is_file()}
    if "test" not in present or not ({"train", "validation"} & set(present)):
        raise ValueError(
            f"`data_dir` {folder} must hold {WIKITEXT_FILES['test']} and {WIKITEXT_FILES['train']} or "
            f"{WIKITEXT_FILES['validation']}; found {sorted(p.name for p in present.values()) or 'none of them'}."
        )
    train_file = present["train" if "train" in present else "validation"]
    protocol = "full" if "train" in present else "reduced"
    return WikiTextSplits(read_text_file(train_file), read_text_file(present["test"]), protocol, f"folder {folder}",
                          str(train_file), str(present["test"]))  # fmt: skip


def read_text_file(path: Path) -> str:
    """A UTF-8 text file; one that is not UTF-8 is refused naming the file and the byte (Python's error names
    neither the file nor what to do)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path} is not UTF-8 text (byte {error.start} is {error.object[error.start : error.start + 1]!r}): "
            "WikiText raw files are UTF-8; re-encode the file or point at the original one"
        ) from None


def tokenize_text(text: str, tokenizer) -> np.ndarray:
    """The whole text as one token stream (documents joined as in the raw file, like run_clm's concatenation)."""
    return np.asarray(tokenizer(text, return_attention_mask=False, verbose=False)["input_ids"], dtype=np.int64)


def language_modelling_blocks(token_ids: np.ndarray, block_size: int) -> datasets.Dataset:
    """Consecutive non-overlapping blocks of `block_size` tokens as `input_ids` = `labels` (the remainder dropped)."""
    if block_size < 2:
        raise ValueError(f"`block_size` must be >= 2, got {block_size}.")
    num_blocks = len(token_ids) // block_size
    if num_blocks == 0:
        raise ValueError(f"The text has {len(token_ids)} tokens, fewer than one block of `block_size`={block_size}.")
    blocks = token_ids[: num_blocks * block_size].reshape(num_blocks, block_size)
    return datasets.Dataset.from_dict({"input_ids": blocks, "labels": blocks}).with_format("torch")
