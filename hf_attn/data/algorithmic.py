"""Paper A's five algorithmic tasks: n numbers in, one regression target per position.

Every generator is seeded and vectorised over samples, so 30,000 samples take milliseconds. Loops run over the
n positions only where a target needs them (cumulative median, Kadane), never over samples.
"""

import datasets
import numpy as np

ALGORITHMIC_TASKS = ("cumulative_sum", "cumulative_min", "cumulative_median", "sort", "cumulative_max_subarray_sum")


def _cumulative_median(values: np.ndarray) -> np.ndarray:
    # numpy's median averages the two middle values for even counts: the paper's midpoint interpolation.
    return np.stack([np.median(values[:, : i + 1], axis=1) for i in range(values.shape[1])], axis=1)


def _cumulative_max_subarray_sum(values: np.ndarray) -> np.ndarray:
    # Kadane, one step per position, vectorised over samples: `ending_here` is the best sum of a subarray ending at i.
    ending_here = values[:, 0].copy()
    best = values[:, 0].copy()
    targets = np.empty_like(values)
    targets[:, 0] = best
    for i in range(1, values.shape[1]):
        ending_here = np.maximum(values[:, i], ending_here + values[:, i])
        best = np.maximum(best, ending_here)
        targets[:, i] = best
    return targets


_TARGETS = {
    "cumulative_sum": lambda values: np.cumsum(values, axis=1),
    "cumulative_min": lambda values: np.minimum.accumulate(values, axis=1),
    "cumulative_median": _cumulative_median,
    "sort": lambda values: np.sort(values, axis=1),
    "cumulative_max_subarray_sum": _cumulative_max_subarray_sum,
}


def _check_task(task: str) -> None:
    if task not in _TARGETS:
        raise ValueError(f"`task` must be one of {list(ALGORITHMIC_TASKS)}, got {task!r}.")


def algorithmic_targets(task: str, values: np.ndarray) -> np.ndarray:
    """Per-position targets of `task` for `values` of shape (num_samples, n) (Paper A's algorithmic tasks)."""
    _check_task(task)
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[1] == 0:
        raise ValueError(f"`values` must have shape (num_samples, n) with n >= 1, got shape {values.shape}.")
    return _TARGETS[task](values)


def _check_sampling_args(num_samples: int, scale: float, low: float, high: float) -> None:
    if num_samples < 1:
        raise ValueError(f"`num_samples` must be >= 1, got {num_samples}.")
    if not scale >= 1:  # also refuses NaN
        raise ValueError(f"`scale` must be >= 1 (1 is the training distribution), got {scale}.")
    if not low < high:
        raise ValueError(f"`low` must be < `high`, got low={low}, high={high}.")


def sample_subranges(
    rng: np.random.Generator, num_samples: int, scale: float = 1.0, low: float = -2.0, high: float = 2.0
) -> np.ndarray:
    """Per-sample value ranges [a, b], shape (num_samples, 2), inside [scale * low, scale * high].

    For scale > 1, a range that lies inside the training range [low, high] is redrawn, so every test sample has
    values the model never saw (Paper A, "value generalization"); scale = 1 is the training distribution.
    """
    _check_sampling_args(num_samples, scale, low, high)
    ranges = np.sort(rng.uniform(scale * low, scale * high, size=(num_samples, 2)), axis=1)
    if scale == 1:
        return ranges
    rejected = np.flatnonzero((ranges[:, 0] >= low) & (ranges[:, 1] <= high))
    while rejected.size:
        ranges[rejected] = np.sort(rng.uniform(scale * low, scale * high, size=(rejected.size, 2)), axis=1)
        still_inside = (ranges[rejected, 0] >= low) & (ranges[rejected, 1] <= high)
        rejected = rejected[still_inside]
    return ranges


def sample_values(
    num_samples: int, length: int, scale: float, seed: int, low: float = -2.0, high: float = 2.0
) -> np.ndarray:
    """Inputs of shape (num_samples, length): x ~ U[a, b]^length, one sub-range [a, b] per sample.

    The sub-ranges are `sample_subranges(np.random.default_rng(seed), ...)`, drawn first. Drawing a sub-range gives
    samples of very different spreads, not only values spread over the whole range (Paper A).
    """
    if length < 1:
        raise ValueError(f"`length` must be >= 1, got {length}.")
    rng = np.random.default_rng(seed)
    ranges = sample_subranges(rng, num_samples, scale, low, high)
    width = ranges[:, 1:] - ranges[:, :1]  # (N, 1)
    return ranges[:, :1] + width * rng.random((num_samples, length))


def algorithmic_dataset(
    task: str,
    num_samples: int,
    length: int = 8,
    scale: float = 1.0,
    seed: int = 0,
    low: float = -2.0,
    high: float = 2.0,
    scratchpad: bool = True,
) -> datasets.Dataset:
    """A torch-formatted dataset with float32 columns `numeric_values` and `labels`, one value per position.

    With `scratchpad`, one extra position of value 0 is appended (Paper A's scratchpad node); its label is NaN,
    which the models' regression loss skips.
    """
    _check_task(task)
    # Targets come from the float32 inputs the model sees, so they are exact for those inputs.
    values = sample_values(num_samples, length, scale, seed, low, high).astype(np.float32)
    labels = algorithmic_targets(task, values).astype(np.float32)
    if scratchpad:
        values = np.concatenate([values, np.zeros((num_samples, 1), np.float32)], axis=1)
        labels = np.concatenate([labels, np.full((num_samples, 1), np.nan, np.float32)], axis=1)
    return datasets.Dataset.from_dict({"numeric_values": values, "labels": labels}).with_format("torch")
