"""Paper B's formal-language recognition task: accept/reject one string, read at its EOS position.

Eight languages (Paper B, "Formal-language recognition"), each over its own alphabet of at least three symbols:

| name                             | language                | alphabet | note                                       |
| -------------------------------- | ----------------------- | -------- | ------------------------------------------ |
| `ends_with_a`                    | `Σ*a`                   | a b c    |                                            |
| `ends_with_ab`                   | `Σ*ab`                  | a b c    |                                            |
| `starts_with_a`                  | `aΣ*`                   | a b c    |                                            |
| `contains_a_then_b`              | `Σ*aΣ*bΣ*`              | a b c    | an a before a b, not necessarily adjacent  |
| `ab_star`                        | `(ab)*`                 | a b c    | one member per even length                 |
| `contains_ab`                    | `Σ*abΣ*`                | a b c    | ab as a substring                          |
| `right_deterministic_polynomial` | `(Σ∖{b0})* a (Σ∖{a,b1})*` | a b c d | b = b0, c = b1, d neutral: `[acd]*a[bd]*`  |
| `dyck2_bounded`                  | `(a(ab)*b)*`            | a b c    | a = "(", b = ")", depth <= 2; c never used |

`right_deterministic_polynomial` holds the strings whose LAST a has no b before it and no c after it (the right
factor has no a, so the marked a is the last one, which is what makes it right-deterministic). `dyck2_bounded` is
the spec's regex exactly: well-nested brackets of one type, a = open and b = close, nested at most two deep (the
"2" is the depth bound); the empty string is a member. Both it and `ab_star` are subsets of {a, b}*: c is in their
alphabet only so every language has three symbols.

Sampling (both classes share one length distribution, so length is never a shortcut): lengths are uniform over the
lengths in [min_length, max_length] at which the language has a member and our near-miss non-members exist, i.e.
length >= 1 (`ends_with_a`, `starts_with_a`, the polynomial), >= 2 (`ends_with_ab`, both `contains_*`), or even
and >= 2 (`ab_star`, `dyck2_bounded`). Negatives are adversarial (Paper B): a member with its last symbol, or one of
its last two, substituted (`ends_with_*`), its first symbol substituted (`starts_with_a`), one bracket flipped a <-> b
(`dyck2_bounded`, `ab_star`), one symbol changed so the last a gets a b before it or a c after it (polynomial); a
string with a and b everywhere but no ab (`contains_ab`) or every b before every a (`contains_a_then_b`), whose
positives are the same strings with an ab (resp. an a...b) written in (`contains_positives="written_in"`, our
inference), or uniform random strings that are members (`"uniform"`). Paper B does not say which. A uniform member of
`contains_ab` usually holds an ab near its end, where a k-local model sees it: that would explain Paper B's local
models scoring 71-96% on a language they cannot recognise (`configs/formal_languages/cpu_check_positives.yaml`).
"""

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

import datasets
import numpy as np

from .labels import IGNORE_INDEX

LANGUAGES = (
    "ends_with_a",
    "ends_with_ab",
    "starts_with_a",
    "contains_a_then_b",
    "ab_star",
    "contains_ab",
    "right_deterministic_polynomial",
    "dyck2_bounded",
)
ALPHABETS = {language: "abc" for language in LANGUAGES} | {"right_deterministic_polynomial": "abcd"}
# Paper B's class of each language: global heads recognise LTL[P], k-local heads LTL[Y], hybrids LTL[P, Y].
LTL_CLASSES = {
    "ends_with_a": "LTL[Y]",
    "ends_with_ab": "LTL[Y]",
    "starts_with_a": "LTL[P]",
    "contains_a_then_b": "LTL[P]",
    "ab_star": "LTL[P,Y]",
    "contains_ab": "LTL[P,Y]",
    "right_deterministic_polynomial": "outside LTL[P,Y]",
    "dyck2_bounded": "outside LTL[P,Y]",
}
A, B, C, D = 0, 1, 2, 3  # symbol ids within an alphabet; for the polynomial B is b0, C is b1, D is neutral

# The references: plain regexes, independent of the vectorised samplers below.
_PATTERNS = {
    "ends_with_a": r"[abc]*a",
    "ends_with_ab": r"[abc]*ab",
    "starts_with_a": r"a[abc]*",
    "contains_a_then_b": r"[abc]*a[abc]*b[abc]*",
    "ab_star": r"(ab)*",
    "contains_ab": r"[abc]*ab[abc]*",
    "right_deterministic_polynomial": r"[acd]*a[bd]*",
    "dyck2_bounded": r"(a(ab)*b)*",
}
_MIN_LENGTH = {language: 1 for language in LANGUAGES} | {
    "ends_with_ab": 2,
    "contains_a_then_b": 2,
    "contains_ab": 2,
    "ab_star": 2,
    "dyck2_bounded": 2,
}
_EVEN_ONLY = ("ab_star", "dyck2_bounded")
CONTAINS_POSITIVES = ("written_in", "uniform")  # how the `contains_*` languages' members are drawn


def _check_language(language: str) -> None:
    if language not in LANGUAGES:
        raise ValueError(f"`language` must be one of {list(LANGUAGES)}, got {language!r}.")


def recognizer(language: str) -> Callable[[str], bool]:
    """Membership test of `language` as a full-match regex: the reference the samplers are checked against."""
    _check_language(language)
    pattern = re.compile(_PATTERNS[language])
    return lambda string: pattern.fullmatch(string) is not None


@dataclass(frozen=True)
class FormalLanguageVocab:
    """Token ids of one language: `<pad>`, `<bos>`, `<eos>`, then the language's alphabet symbols."""

    language: str

    def __post_init__(self):
        _check_language(self.language)

    pad_id = 0
    bos_id = 1
    eos_id = 2
    first_symbol_id = 3

    @property
    def symbols(self) -> str:
        return ALPHABETS[self.language]

    @property
    def tokens(self) -> tuple[str, ...]:
        return ("<pad>", "<bos>", "<eos>", *self.symbols)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, string: str) -> list[int]:
        """`<bos>`, the symbols of `string`, `<eos>`; a symbol outside the alphabet raises ValueError."""
        unknown = set(string) - set(self.symbols)
        if unknown:
            raise ValueError(f"`string` may only use symbols {list(self.symbols)}, got {sorted(unknown)}.")
        return [self.bos_id, *(self.first_symbol_id + self.symbols.index(s) for s in string), self.eos_id]

    def decode(self, ids) -> str:
        """The symbols among `ids` as a string; special tokens and ignored labels are dropped."""
        ids = [i for i in np.asarray(ids).reshape(-1).tolist() if i >= self.first_symbol_id]
        return "".join(self.symbols[i - self.first_symbol_id] for i in ids)


def _below(rng: np.random.Generator, high: np.ndarray) -> np.ndarray:
    """One integer uniform in [0, high[i]) per row; `high` >= 1."""
    return np.minimum((rng.random(high.shape) * high).astype(np.int64), high - 1)


def _choice(rng: np.random.Generator, shape: tuple[int, ...], symbols: tuple[int, ...]) -> np.ndarray:
    return np.asarray(symbols)[rng.integers(0, len(symbols), size=shape)]


def _substitute(rng: np.random.Generator, ids: np.ndarray, cols: np.ndarray, alphabet_size: int) -> None:
    """In place: replace ids[r, cols[r]] by a different symbol, uniform over the other alphabet_size - 1."""
    rows = np.arange(len(ids))
    ids[rows, cols] = (ids[rows, cols] + rng.integers(1, alphabet_size, size=len(ids))) % alphabet_size


def _set(ids: np.ndarray, cols: np.ndarray, values: np.ndarray | int) -> None:
    ids[np.arange(len(ids)), cols] = values


# Each sampler fills (N, max_length) symbol ids for rows of the given `lengths`; cells past a row's length are junk
# and dropped later. Positives and negatives get separate `lengths` draws from the same distribution.


def _ends_with_a(rng: np.random.Generator, lengths: np.ndarray, width: int, positive: bool) -> np.ndarray:
    ids = rng.integers(0, 3, size=(len(lengths), width))
    _set(ids, lengths - 1, A if positive else _choice(rng, lengths.shape, (B, C)))
    return ids


def _ends_with_ab(rng: np.random.Generator, lengths: np.ndarray, width: int, positive: bool) -> np.ndarray:
    ids = rng.integers(0, 3, size=(len(lengths), width))
    _set(ids, lengths - 2, A)
    _set(ids, lengths - 1, B)
    if not positive:  # the wrong symbol in one of the last two places: "?b" with ? != a, or "a?" with ? != b
        _substitute(rng, ids, lengths - 1 - rng.integers(0, 2, size=len(lengths)), 3)
    return ids


def _starts_with_a(rng: np.random.Generator, lengths: np.ndarray, width: int, positive: bool) -> np.ndarray:
    ids = rng.integers(0, 3, size=(len(lengths), width))
    ids[:, 0] = A if positive else _choice(rng, lengths.shape, (B, C))
    return ids


def _contains_a_then_b(rng: np.random.Generator, lengths: np.ndarray, width: int, positive: bool) -> np.ndarray:
    # Base: every b before every a, b/c up to a split point and a/c after it, so no a...b subsequence.
    split = _below(rng, lengths + 1)[:, None]  # (N, 1)
    before = np.arange(width)[None] < split
    ids = np.where(before, _choice(rng, (len(lengths), width), (B, C)), _choice(rng, (len(lengths), width), (A, C)))
    if positive:  # write an a and a later b at two distinct places
        first = _below(rng, lengths)
        second = _below(rng, lengths - 1)
        second += second >= first
        _set(ids, np.minimum(first, second), A)
        _set(ids, np.maximum(first, second), B)
    return ids


def _ab_star(rng: np.random.Generator, lengths: np.ndarray, width: int, positive: bool) -> np.ndarray:
    ids = np.broadcast_to(np.arange(width) % 2, (len(lengths), width)).copy()  # abab...
    if not positive:
        cols = _below(rng, lengths)
        _set(ids, cols, 1 - ids[np.arange(len(ids)), cols])  # flip a <-> b
    return ids


def _contains_ab(rng: np.random.Generator, lengths: np.ndarray, width: int, positive: bool) -> np.ndarray:
    # Base: a Markov chain that never puts b right after a, so no ab; a and b both stay frequent.
    ids = np.empty((len(lengths), width), dtype=np.int64)
    ids[:, 0] = rng.integers(0, 3, size=len(lengths))
    for t in range(1, width):
        after_a = _choice(rng, lengths.shape, (A, C))
        ids[:, t] = np.where(ids[:, t - 1] == A, after_a, rng.integers(0, 3, size=len(lengths)))
    if positive:
        start = _below(rng, lengths - 1)
        _set(ids, start, A)
        _set(ids, start + 1, B)
    return ids


def _polynomial(rng: np.random.Generator, lengths: np.ndarray, width: int, positive: bool) -> np.ndarray:
    # Member: [acd]^i a [bd]^(n-1-i), the marked a at i is the last a.
    marked = _below(rng, lengths)[:, None]  # (N, 1)
    columns = np.arange(width)[None]
    shape = (len(lengths), width)
    ids = np.where(columns < marked, _choice(rng, shape, (A, C, D)), _choice(rng, shape, (B, D)))
    ids[columns == marked] = A
    if not positive:
        # One other place changed: b (= b0) before the last a, or c (= b1) after it; "a" alone loses its a.
        marked = marked[:, 0]
        single = lengths == 1
        other = _below(rng, np.maximum(lengths - 1, 1))
        other += other >= marked  # a place other than the marked a; past the end (ignored) for single rows
        rows = np.flatnonzero(~single)
        ids[rows, other[rows]] = np.where(other[rows] < marked[rows], B, C)
        ids[single, 0] = _choice(rng, (int(single.sum()),), (B, C, D))
    return ids


def _dyck2_bounded(rng: np.random.Generator, lengths: np.ndarray, width: int, positive: bool) -> np.ndarray:
    # Unit j is the pair of places (2j, 2j+1). A group a (ab)^(m-1) b spans m units: its first unit opens with a,
    # later units with b; its last unit closes with b, earlier units with a. So groups are cut where a unit opens one.
    units = width // 2 + 1
    opens = rng.random((len(lengths), units + 1)) < 0.5  # (N, U + 1)
    opens[:, 0] = True
    opens[np.arange(len(lengths)), lengths // 2] = True  # the unit after the last closes the final group
    pairs = np.stack([np.where(opens[:, :-1], A, B), np.where(opens[:, 1:], B, A)], axis=2)  # (N, U, 2)
    ids = pairs.reshape(len(lengths), -1)[:, :width]
    if not positive:  # any flip changes the a/b balance, so it always leaves the language
        cols = _below(rng, lengths)
        _set(ids, cols, 1 - ids[np.arange(len(ids)), cols])
    return ids


def _uniform_members(
    language: str, rng: np.random.Generator, lengths: np.ndarray, width: int, positive: bool
) -> np.ndarray:
    """Uniform random strings of the alphabet, each drawn again until it is a member: a `contains_*` language's
    positives with `contains_positives="uniform"` (at least 1 in 9 draws is a member, at length 2). `positive` is
    always True: the samplers' signature."""
    ids = rng.integers(0, 3, size=(len(lengths), width))
    member = recognizer(language)
    table = np.frombuffer(ALPHABETS[language].encode(), dtype=np.uint8)
    for row, length in enumerate(lengths.tolist()):
        while not member(table[ids[row, :length]].tobytes().decode()):
            ids[row, :length] = rng.integers(0, 3, size=length)
    return ids


_SAMPLERS = {
    "ends_with_a": _ends_with_a,
    "ends_with_ab": _ends_with_ab,
    "starts_with_a": _starts_with_a,
    "contains_a_then_b": _contains_a_then_b,
    "ab_star": _ab_star,
    "contains_ab": _contains_ab,
    "right_deterministic_polynomial": _polynomial,
    "dyck2_bounded": _dyck2_bounded,
}


def _allowed_lengths(language: str, min_length: int, max_length: int) -> np.ndarray:
    lengths = np.arange(max(min_length, _MIN_LENGTH[language]), max_length + 1)
    return lengths[lengths % 2 == 0] if language in _EVEN_ONLY else lengths


def _sample_ids(
    language: str, num_samples: int, min_length: int, max_length: int, seed: int, contains_positives: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Symbol ids (N, max length drawn), lengths (N,) and labels (N,), classes balanced and shuffled."""
    _check_language(language)
    if contains_positives not in CONTAINS_POSITIVES:
        raise ValueError(f"`contains_positives` must be one of {list(CONTAINS_POSITIVES)}, got {contains_positives!r}.")
    if not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
        raise ValueError(f"`num_samples` must be an integer >= 1, got {num_samples!r}.")
    if min_length < 0:
        raise ValueError(f"`min_length` must be >= 0, got {min_length}.")
    if max_length < min_length:
        raise ValueError(f"`max_length` must be >= `min_length` ({min_length}), got {max_length}.")
    allowed = _allowed_lengths(language, min_length, max_length)
    if allowed.size == 0:
        even = " even" if language in _EVEN_ONLY else ""
        raise ValueError(
            f"`min_length`..`max_length` ({min_length}..{max_length}) must include a{even} length >= "
            f"{_MIN_LENGTH[language]}, where `{language}` has members and near-miss non-members."
        )
    rng = np.random.default_rng(seed)
    num_positive = num_samples // 2
    parts, part_lengths = [], []
    for positive, count in ((True, num_positive), (False, num_samples - num_positive)):
        lengths = allowed[rng.integers(0, allowed.size, size=count)]
        width = int(lengths.max(initial=0))
        sampler = _SAMPLERS[language]
        if positive and contains_positives == "uniform" and language.startswith("contains_"):
            sampler = functools.partial(_uniform_members, language)
        parts.append(sampler(rng, lengths, width, positive) if count else np.zeros((0, width), int))
        part_lengths.append(lengths)
    width = max(part.shape[1] for part in parts)
    ids = np.concatenate([np.pad(part, ((0, 0), (0, width - part.shape[1]))) for part in parts])
    lengths = np.concatenate(part_lengths)
    labels = np.concatenate([np.ones(num_positive, np.int64), np.zeros(num_samples - num_positive, np.int64)])
    order = rng.permutation(num_samples)
    return ids[order], lengths[order], labels[order]


def sample_strings(language: str, num_samples: int, min_length: int = 1, max_length: int = 40, seed: int = 0,
                   contains_positives: str = "written_in") -> tuple[list[str], np.ndarray]:  # fmt: skip
    """`num_samples` strings of `language` and their 0/1 labels: half members, half adversarial near misses.

    Lengths are uniform over the lengths in [min_length, max_length] where the language has members (even ones only
    for `ab_star` and `dyck2_bounded`); see the module docstring for how each language's strings are built.
    """
    ids, lengths, labels = _sample_ids(language, num_samples, min_length, max_length, seed, contains_positives)
    table = np.frombuffer(ALPHABETS[language].encode(), dtype=np.uint8)
    chars = table[ids]  # (N, L) ASCII codes
    return [row[:length].tobytes().decode() for row, length in zip(chars, lengths.tolist(), strict=True)], labels


def formal_language_dataset(language: str, num_samples: int, min_length: int = 1, max_length: int = 40,
                            seed: int = 0, contains_positives: str = "written_in") -> datasets.Dataset:  # fmt: skip
    """A torch-formatted dataset of `input_ids` (`<bos>` symbols `<eos>`, right-padded), `attention_mask`, `labels`
    and `length`, for a token-classification head.

    `labels` is -100 everywhere except at `<eos>`, which holds the string's 0/1 label (Paper B reads the decision at
    the final position). Rows are padded with `<pad>` to the longest string of the dataset.
    """
    vocab = FormalLanguageVocab(language)
    ids, lengths, labels = _sample_ids(language, num_samples, min_length, max_length, seed, contains_positives)
    rows = np.arange(num_samples)
    width = int(lengths.max()) + 2
    positions = np.arange(width)[None]  # (1, L + 2)
    eos_position = lengths + 1  # (N,)
    input_ids = np.full((num_samples, width), vocab.pad_id, dtype=np.int64)
    input_ids[:, 1 : ids.shape[1] + 1] = ids + vocab.first_symbol_id
    input_ids[:, 0] = vocab.bos_id
    input_ids[positions > eos_position[:, None]] = vocab.pad_id
    input_ids[rows, eos_position] = vocab.eos_id
    token_labels = np.full((num_samples, width), IGNORE_INDEX, dtype=np.int64)
    token_labels[rows, eos_position] = labels
    columns = {
        "input_ids": input_ids,
        "attention_mask": (positions <= eos_position[:, None]).astype(np.int64),
        "labels": token_labels,
        "length": lengths,
    }
    return datasets.Dataset.from_dict(columns).with_format("torch")
