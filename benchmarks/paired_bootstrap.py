"""How far the difference of two rows' RULER averages could move on other records: a paired bootstrap.

With 20 records a task, one record is 5 points of a single-answer task, so averages a few points apart can swap on
another sample. Both rows answered the same records; resampling each task's records with replacement, the same picks
for both rows, and taking the difference of the two averages each time gives that difference's spread, whose
percentiles bound it (Efron and Tibshirani 1993, ch. 13). It is the interval of one fixed pair: where each row of the
pair is the best of several on these same records, the spread of that choice is not in it."""

import numpy as np

RESAMPLES = 10_000
SEED = 0


def difference_interval(
    first: dict[str, list[float]], second: dict[str, list[float]], level: float = 0.95, resamples: int = RESAMPLES
) -> tuple[float, float]:
    """The `level` percentile interval of (first's average - second's average) in points, the average being the mean
    over tasks of each task's mean record score (0-1, times 100). FIRST and SECOND: per task, each record's score in
    the data's order, the same tasks and records for both. Deterministic (seeded)."""
    if first.keys() != second.keys() or any(len(first[task]) != len(second[task]) for task in first) or not first:
        raise ValueError("both rows must score the same records of the same tasks, and at least one task")
    generator = np.random.default_rng(SEED)
    differences = np.zeros(resamples)
    for task in first:
        gaps = 100 * (np.asarray(first[task], dtype=float) - np.asarray(second[task], dtype=float))
        differences += gaps[generator.integers(0, len(gaps), size=(resamples, len(gaps)))].mean(axis=1)
    low, high = np.percentile(differences / len(first), [50 * (1 - level), 50 * (1 + level)])
    return round(float(low), 2), round(float(high), 2)
