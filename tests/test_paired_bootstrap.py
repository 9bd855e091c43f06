"""benchmarks/paired_bootstrap.py against the exact bootstrap distribution, enumerated: every way of drawing each
task's records with replacement, each equally likely."""

import itertools

import numpy as np
import pytest

from benchmarks.paired_bootstrap import difference_interval

# Two tasks of 4 records: each record's score in the first row and in the second (0, 1 or a share of answers).
FIRST = {"a": [1, 1, 0, 1], "b": [0.5, 1, 0, 0.25]}
SECOND = {"a": [1, 0, 0, 0], "b": [0.5, 0, 1, 0.25]}


def exact_interval(first: dict, second: dict, level: float) -> tuple[float, float]:
    """The percentiles of the difference of averages over all 4**4 x 4**4 equally likely resamples."""
    per_task = []
    for task in first:
        gaps = 100 * (np.array(first[task]) - np.array(second[task]))
        picks = np.array(list(itertools.product(range(len(gaps)), repeat=len(gaps))))
        per_task.append(gaps[picks].mean(axis=1))
    differences = (per_task[0][:, None] + per_task[1][None, :]).ravel() / 2
    return tuple(np.percentile(differences, [50 * (1 - level), 50 * (1 + level)]))


@pytest.mark.parametrize("level", [0.5, 0.9, 0.95])
def test_the_interval_is_the_exact_bootstraps_within_what_resampling_misses(level):
    low, high = difference_interval(FIRST, SECOND, level=level)
    exact_low, exact_high = exact_interval(FIRST, SECOND, level)
    assert low == pytest.approx(exact_low, abs=2.5) and high == pytest.approx(exact_high, abs=2.5)
    assert low <= 37.5 <= high  # the observed difference: (50 + 25) / 2


def test_rows_that_agree_or_differ_everywhere_give_a_point():
    assert difference_interval(FIRST, FIRST) == (0.0, 0.0)
    right, wrong = {"a": [1] * 5, "b": [1] * 3}, {"a": [0] * 5, "b": [0] * 3}
    assert difference_interval(right, wrong) == (100.0, 100.0)
    assert difference_interval(FIRST, SECOND) == difference_interval(FIRST, SECOND)  # seeded


@pytest.mark.parametrize("second", [{"a": [1, 0, 0, 0]}, {"a": [1, 0, 0], "b": [0, 0, 0, 0]}, {}])
def test_rows_of_other_records_are_refused(second):
    with pytest.raises(ValueError, match="same records of the same tasks"):
        difference_interval(FIRST if second else {}, second)
