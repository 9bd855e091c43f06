"""Paper A's mixed-type task: a price list in text, a query over four categories, one number as the answer.

One `MixedSample` has two renderings, so every model type sees the same data:

- text, for a causal LM such as GPT-2, as Paper A's fine-tuning code writes it: `CatA, 00.71, Cat+B, CatB, 01.41,
  .... Find min of categories CatA, CatC, CatD and CatH. Answer: 000.89` (prices `dd.dd`, the answer `ddd.dd`);
- positional, for the positional and standard models: the same characters with each price replaced by `#`, the
  8 prices appended as numeric positions (embedded as value * w + b), then one scratchpad slot; the answer is
  regressed from the output at position 0.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import datasets
import numpy as np

from .algorithmic import sample_subranges

MIXED_TASKS = ("min", "sum", "multitask")
NAME_SETS = ("seen", "unseen")
RENDERINGS = ("positional", "text")
OPS = ("min", "sum", "max")
# Category names are "Cat" + one character; test prompts use characters never seen in training (Paper A).
NAME_CHARACTERS = {"seen": "ABCDEFGHIJKLM", "unseen": "NOPQRSTUVWXYZ"}
DECOY_SYMBOLS = "+-"  # a decoy is `Cat+B` or `Cat-B`: a near-copy of a listed name, without a price
PRICE_PLACEHOLDER = "#"
PRICE_LOW, PRICE_HIGH = 0.0, 5.0  # training price range; the OOD test range is [0, 5c]
NUM_CATEGORIES, NUM_DECOYS, NUM_QUERIED = 8, 2, 4
ANSWER_PREFIX = " Answer:"  # follows the prompt; the answer follows after one space

_ANSWER_PATTERN = re.compile(r"Answer:\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+))")


@dataclass(frozen=True)
class MixedSample:
    """One sample of the mixed-type task, independent of how it is rendered."""

    categories: tuple[str, ...]  # the priced names, in listed order
    prices: tuple[float, ...]  # rounded to 2 decimals, aligned with `categories`
    decoys: tuple[str, ...]  # names listed without a price
    decoy_positions: tuple[int, ...]  # increasing index of each decoy among all listed items (priced and decoys)
    queried: tuple[str, ...]  # distinct priced names the query asks about
    op: str  # one of OPS
    answer: float  # op over the queried prices


def _format_number(value: float) -> str:
    # Paper A prints prices as dd.dd; `%05.2f` keeps at least 2 integer digits and grows past 99.99.
    return f"{value:05.2f}"


def _format_answer(value: float) -> str:
    # Paper A's fine-tuning code prints the answer as ddd.dd (`%06.2f`): sums of four prices reach 200 at c = 10.
    return f"{value:06.2f}"


def _render(sample: MixedSample, price_text: Callable[[float], str]) -> str:
    """The prompt without its answer, with each price written as `price_text(price)`."""
    items = [f"{name}, {price_text(price)}" for name, price in zip(sample.categories, sample.prices, strict=True)]
    # Positions increase, so each insert leaves the earlier decoys where they belong.
    for position, decoy in zip(sample.decoy_positions, sample.decoys, strict=True):
        items.insert(position, decoy)
    queried = ", ".join(sample.queried[:-1]) + f" and {sample.queried[-1]}"
    return f"{', '.join(items)}. Find {sample.op} of categories {queried}."


def render_text(sample: MixedSample) -> str:
    """The prompt as text, prices printed as `00.71`."""
    return _render(sample, _format_number)


def render_text_with_answer(sample: MixedSample) -> str:
    """The causal-LM training text: the prompt followed by ` Answer: 000.89`."""
    return f"{render_text(sample)}{ANSWER_PREFIX} {_format_answer(sample.answer)}"


def parse_answer(generated: str) -> float | None:
    """The first number right after `Answer:` in `generated`, or None when there is none (it never raises)."""
    if not isinstance(generated, str):
        return None
    match = _ANSWER_PATTERN.search(generated)
    return float(match.group(1)) if match else None


def _all_characters() -> str:
    """Every character a prompt can hold, whatever the data, so a character's id never changes."""
    text = "".join(NAME_CHARACTERS.values()) + "Cat" + DECOY_SYMBOLS + " ".join(OPS) + "Find of categories and, ."
    return "".join(sorted(set(text + "0123456789" + PRICE_PLACEHOLDER)))


@dataclass(frozen=True)
class CharVocab:
    """Character ids of the positional rendering: 0 is PAD, 1 is NUMBER (a numeric position), then one per character.

    The default character set covers both name sets, so a model trained on seen names can read unseen ones.
    """

    characters: str = field(default_factory=_all_characters)
    pad_id: ClassVar[int] = 0
    number_id: ClassVar[int] = 1
    _lookup: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if len(set(self.characters)) != len(self.characters) or not self.characters.isascii():
            raise ValueError(f"`characters` must be distinct ASCII characters, got {self.characters!r}.")
        lookup = np.full(128, -1, dtype=np.int64)  # ASCII code -> id, -1 for characters outside the vocab
        lookup[[ord(c) for c in self.characters]] = np.arange(len(self.characters)) + 2
        object.__setattr__(self, "_lookup", lookup)

    @property
    def vocab_size(self) -> int:
        return len(self.characters) + 2

    def encode(self, text: str) -> np.ndarray:
        unknown = set(text) - set(self.characters)
        if unknown:
            raise ValueError(f"`text` has characters outside the vocabulary: {sorted(unknown)}.")
        return self._lookup[np.frombuffer(text.encode("ascii"), dtype=np.uint8)]

    def decode(self, ids) -> str:
        """Characters of `ids`; NUMBER shows as `<num>`, PAD as nothing."""
        specials = {self.pad_id: "", self.number_id: "<num>"}
        return "".join(self.characters[i - 2] if i >= 2 else specials[i] for i in np.asarray(ids).reshape(-1).tolist())


def _choose(rng: np.random.Generator, num_samples: int, population: int, count: int) -> np.ndarray:
    """`count` distinct indices out of range(population) for every sample, shape (num_samples, count)."""
    return np.argsort(rng.random((num_samples, population)), axis=1)[:, :count]


def sample_mixed(
    num_samples: int, task: str, scale: float = 1.0, names: str = "seen", seed: int = 0
) -> list[MixedSample]:
    """`num_samples` seeded samples of `task`; `names="unseen"` uses the held-out name characters.

    Prices come from a per-sample sub-range of [0, 5 * scale], redrawn for scale > 1 while it lies inside [0, 5].
    """
    if task not in MIXED_TASKS:
        raise ValueError(f"`task` must be one of {list(MIXED_TASKS)}, got {task!r}.")
    if names not in NAME_SETS:
        raise ValueError(f"`names` must be one of {list(NAME_SETS)}, got {names!r}.")
    rng = np.random.default_rng(seed)
    ranges = sample_subranges(rng, num_samples, scale, PRICE_LOW, PRICE_HIGH)  # validates num_samples and scale
    prices = np.round(ranges[:, :1] + (ranges[:, 1:] - ranges[:, :1]) * rng.random((num_samples, NUM_CATEGORIES)), 2)
    alphabet = NAME_CHARACTERS[names]
    # Listed in alphabetical order, as in the paper's code; the query order is random.
    name_index = np.sort(_choose(rng, num_samples, len(alphabet), NUM_CATEGORIES), axis=1)
    mimicked = _choose(rng, num_samples, NUM_CATEGORIES, NUM_DECOYS)  # which listed names the decoys copy
    symbols = rng.integers(0, len(DECOY_SYMBOLS), size=(num_samples, NUM_DECOYS))
    decoy_positions = np.sort(_choose(rng, num_samples, NUM_CATEGORIES + NUM_DECOYS, NUM_DECOYS), axis=1)
    queried = _choose(rng, num_samples, NUM_CATEGORIES, NUM_QUERIED)
    if task == "multitask":  # Paper A's multitask asks for the min or the max, chosen per sample
        ops = np.array(["min", "max"])[rng.integers(0, 2, size=num_samples)]
    else:
        ops = np.full(num_samples, task)
    queried_prices = np.take_along_axis(prices, queried, axis=1)
    answers = np.where(
        ops == "min",
        queried_prices.min(axis=1),
        np.where(ops == "max", queried_prices.max(axis=1), np.round(queried_prices.sum(axis=1), 2)),
    )

    # Names as object arrays, so each sample's fields below are plain row look-ups.
    categories = np.array([f"Cat{c}" for c in alphabet], dtype=object)[name_index]  # (N, 8)
    decoy_names = np.array([[f"Cat{s}{c}" for c in alphabet] for s in DECOY_SYMBOLS], dtype=object)
    decoys = decoy_names[symbols, np.take_along_axis(name_index, mimicked, axis=1)]  # (N, 2)
    queried_names = np.take_along_axis(categories, queried, axis=1)  # (N, 4)
    return [
        MixedSample(tuple(c), tuple(p), tuple(d), tuple(dp), tuple(q), o, a)
        for c, p, d, dp, q, o, a in zip(
            categories.tolist(),
            prices.tolist(),
            decoys.tolist(),
            decoy_positions.tolist(),
            queried_names.tolist(),
            ops.tolist(),
            answers.tolist(),
            strict=True,
        )
    ]


def _ragged_index(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of every element when row i holds `counts[i]` elements from column 0: for scattering."""
    rows = np.repeat(np.arange(len(counts)), counts)
    columns = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    return rows, columns


def _positional_columns(samples: list[MixedSample], char_vocab: CharVocab) -> dict[str, np.ndarray]:
    """Right-padded positional renderings of `samples`: characters with prices as `#`, the prices, a scratchpad."""
    texts = [_render(sample, lambda price: PRICE_PLACEHOLDER) for sample in samples]
    num_chars = np.array([len(text) for text in texts])
    num_prices = np.array([len(sample.prices) for sample in samples])
    lengths = num_chars + num_prices + 1  # + 1: the scratchpad slot
    position = np.arange(lengths.max())[None, :]  # (1, T)
    attention_mask = position < lengths[:, None]  # (N, T)
    numeric_mask = attention_mask & (position >= num_chars[:, None])  # the prices and the scratchpad
    input_ids = np.where(numeric_mask, char_vocab.number_id, char_vocab.pad_id)
    input_ids[_ragged_index(num_chars)] = char_vocab.encode("".join(texts))
    price_rows, price_columns = _ragged_index(num_prices)
    numeric_values = np.zeros(input_ids.shape, dtype=np.float32)
    numeric_values[price_rows, price_columns + num_chars[price_rows]] = [p for sample in samples for p in sample.prices]
    return {
        "input_ids": input_ids,
        "numeric_values": numeric_values,
        "numeric_mask": numeric_mask,
        "attention_mask": attention_mask.astype(np.int64),
        "labels": np.array([sample.answer for sample in samples], dtype=np.float32),
    }


def render_for_positional(sample: MixedSample, char_vocab: CharVocab | None = None) -> dict[str, np.ndarray]:
    """The positional-model inputs of `sample`: characters with prices as `#`, then the 8 prices, then a scratchpad.

    The i-th `#` stands for the i-th appended number. `labels` is the answer, read from the output at position 0.
    """
    columns = _positional_columns([sample], CharVocab() if char_vocab is None else char_vocab)
    return {name: columns[name][0] for name in ("input_ids", "numeric_values", "numeric_mask", "labels")}


def mixed_dataset(
    num_samples: int,
    task: str,
    rendering: str = "positional",
    scale: float = 1.0,
    names: str = "seen",
    seed: int = 0,
) -> datasets.Dataset:
    """The samples of `sample_mixed` with the same arguments, in one rendering.

    `"positional"`: torch-formatted `input_ids`, `numeric_values`, `numeric_mask`, `attention_mask`, `labels`.
    `"text"`: `text` (prompt and answer, for causal-LM training), `prompt` (the text before ` Answer:`: as in
    Paper A's evaluation, the model writes ` Answer: ...` itself) and `answer`.
    """
    if rendering not in RENDERINGS:
        raise ValueError(f"`rendering` must be one of {list(RENDERINGS)}, got {rendering!r}.")
    samples = sample_mixed(num_samples, task, scale, names, seed)
    if rendering == "positional":
        return datasets.Dataset.from_dict(_positional_columns(samples, CharVocab())).with_format("torch")
    return datasets.Dataset.from_dict(
        {
            "text": [render_text_with_answer(sample) for sample in samples],
            "prompt": [render_text(sample) for sample in samples],
            "answer": [sample.answer for sample in samples],
        }
    )
