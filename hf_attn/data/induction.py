"""Paper A's k-hop induction-heads task: a task that needs attention to depend on the data.

A sample is a hop token `<hop{k}>` followed by `length` characters with no immediate repeats. The target at
character position t starts at t and k times finds the previous occurrence (strictly before) of the current
character and steps one position right; it is the character reached, or `<no_answer>` when some step finds no
previous occurrence. k = 0 copies the character. Training uses characters a-e, the OOD split the unseen f-j.
"""

from dataclasses import dataclass

import datasets
import numpy as np

from .labels import IGNORE_INDEX

CHARACTERS = "abcdefghij"
NUM_TRAIN_CHARACTERS = 5  # a-e for training, f-j held out for the OOD split (Paper A: 5 seen, 5 unseen)
SPLITS = ("train", "ood")


@dataclass(frozen=True)
class InductionVocab:
    """Token ids of the k-hop task, in order: `<hop0>`..`<hop{max_hops}>`, the 10 characters, `<no_answer>`, `<pad>`."""

    max_hops: int = 3

    def __post_init__(self):
        if not isinstance(self.max_hops, (int, np.integer)) or self.max_hops < 0:
            raise ValueError(f"`max_hops` must be an integer >= 0, got {self.max_hops!r}.")

    @property
    def tokens(self) -> tuple[str, ...]:
        return (*(f"<hop{k}>" for k in range(self.max_hops + 1)), *CHARACTERS, "<no_answer>", "<pad>")

    @property
    def hop_ids(self) -> np.ndarray:
        return np.arange(self.max_hops + 1)

    @property
    def char_ids(self) -> np.ndarray:
        return np.arange(self.max_hops + 1, self.max_hops + 1 + len(CHARACTERS))

    @property
    def train_char_ids(self) -> np.ndarray:
        return self.char_ids[:NUM_TRAIN_CHARACTERS]

    @property
    def ood_char_ids(self) -> np.ndarray:
        return self.char_ids[NUM_TRAIN_CHARACTERS:]

    @property
    def no_answer_id(self) -> int:
        return self.max_hops + 1 + len(CHARACTERS)

    @property
    def pad_id(self) -> int:
        return self.no_answer_id + 1

    @property
    def vocab_size(self) -> int:
        return self.pad_id + 1

    def decode(self, ids) -> str:
        """The tokens of `ids` as one string, e.g. `<hop2>abca<no_answer>`; ignored labels (-100) are skipped."""
        tokens = self.tokens
        return "".join(tokens[i] for i in np.asarray(ids).reshape(-1).tolist() if i != IGNORE_INDEX)


def _previous_occurrence(tokens: np.ndarray) -> np.ndarray:
    """Index of the previous occurrence of tokens[:, t] strictly before t, or -1; shape (N, L)."""
    compact = tokens - tokens.min()  # (N, L) ids from 0, so a (N, V) table of last positions stays small
    num_samples, length = tokens.shape
    rows = np.arange(num_samples)
    last_seen = np.full((num_samples, compact.max() + 1), -1)  # (N, V)
    previous = np.empty(tokens.shape, dtype=np.int64)
    for t in range(length):
        previous[:, t] = last_seen[rows, compact[:, t]]
        last_seen[rows, compact[:, t]] = t
    return previous


def khop_targets(tokens: np.ndarray, hops: np.ndarray, no_answer_id: int = -1) -> np.ndarray:
    """k-hop targets of the token ids `tokens` (N, L), k = `hops[i]` for sample i; `no_answer_id` where none exists."""
    tokens = np.asarray(tokens)
    hops = np.asarray(hops)
    if tokens.ndim != 2 or tokens.shape[1] == 0 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(
            f"`tokens` must be integer ids of shape (num_samples, length >= 1), got {tokens.dtype} {tokens.shape}."
        )
    if hops.shape != tokens.shape[:1] or (hops < 0).any():
        raise ValueError(f"`hops` must be non-negative with shape ({tokens.shape[0]},), got {hops.shape}.")
    previous = _previous_occurrence(tokens)
    position = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape).copy()  # (N, L) where each walk is now
    answered = np.ones(tokens.shape, dtype=bool)
    for step in range(int(hops.max())):
        hopping = (hops > step)[:, None] & answered
        found = np.take_along_axis(previous, position, axis=1)
        answered &= ~(hopping & (found < 0))
        position = np.where(hopping & (found >= 0), found + 1, position)
    return np.where(answered, np.take_along_axis(tokens, position, axis=1), no_answer_id)


def khop_dataset(
    num_samples: int,
    length: int = 100,
    max_hops: int = 3,
    split: str = "train",
    seed: int = 0,
    hops: int | None = None,
) -> datasets.Dataset:
    """A torch-formatted dataset of `input_ids` (hop token, then `length` characters) and `labels`.

    The number of hops is uniform in 0..`max_hops` per sample unless `hops` fixes it. `split="ood"` draws only the
    five held-out characters. The hop-token position is labelled -100.
    """
    vocab = InductionVocab(max_hops)
    if split not in SPLITS:
        raise ValueError(f"`split` must be one of {list(SPLITS)}, got {split!r}.")
    if num_samples < 1:
        raise ValueError(f"`num_samples` must be >= 1, got {num_samples}.")
    if length < 1:
        raise ValueError(f"`length` must be >= 1, got {length}.")
    if hops is not None and not 0 <= hops <= max_hops:
        raise ValueError(f"`hops` must be None or in 0..{max_hops} (`max_hops`), got {hops}.")
    characters = vocab.train_char_ids if split == "train" else vocab.ood_char_ids
    num_characters = len(characters)
    rng = np.random.default_rng(seed)
    # No immediate repeats: each character is the previous one shifted by 1..num_characters-1 (mod num_characters),
    # which is uniform over the other characters.
    shifts = rng.integers(1, num_characters, size=(num_samples, length))
    shifts[:, 0] = rng.integers(0, num_characters, size=num_samples)  # the first character is uniform
    sequence = characters[np.cumsum(shifts, axis=1) % num_characters]  # (N, L)
    sample_hops = rng.integers(0, max_hops + 1, size=num_samples) if hops is None else np.full(num_samples, hops)
    targets = khop_targets(sequence, sample_hops, vocab.no_answer_id)
    input_ids = np.concatenate([vocab.hop_ids[sample_hops][:, None], sequence], axis=1)
    labels = np.concatenate([np.full((num_samples, 1), IGNORE_INDEX), targets], axis=1)
    return datasets.Dataset.from_dict({"input_ids": input_ids, "labels": labels}).with_format("torch")
