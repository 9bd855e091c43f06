"""Paper B's recognition scores: accuracy per string length and the longest length recognised perfectly."""

import math
import statistics

import evaluate
import numpy as np

from hf_attn.metrics.info import paper_metric_info

_DESCRIPTION = """\
How well a recognizer decides membership in a formal language, length by length, as Paper B (Li & Cotterell, ACL
2026) measures length generalisation: the share of strings of each length whose accept/reject decision is right,
the unweighted mean of those shares, and the longest perfect length, the largest length N with accuracy 1 at every
length up to N. The walk goes over the lengths given, in increasing order: Paper B's definition starts at the
training lengths, so pass strings of those too (a model perfect in training that fails at the first longer length
scores the longest training length); a length not given (e.g. between two evaluated lengths) counts as perfect.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `int`): each string's decision, 1 (in the language) or 0; e.g. the arg-max of a
        token-classification model's logits at `<eos>`.
    references (`list` of `int`): each string's label, 1 or 0.
    lengths (`list` of `int`): each string's length in symbols.
Returns:
    accuracy_by_length (`dict` of `int` to `float`): per length, in increasing order, the share of right decisions.
    mean_accuracy (`float`): the mean of `accuracy_by_length`, each length weighing the same.
    longest_perfect_length (`int`): the largest length N with accuracy 1 at every length up to N; 0 when the
        shortest length is already below 1.
Examples:
    >>> import hf_attn
    >>> recognition = hf_attn.load_metric("recognition")
    >>> recognition.compute(predictions=[1, 0, 1, 1, 0, 1], references=[1, 0, 1, 1, 1, 1], lengths=[1, 1, 2, 3, 3, 4])
    {'accuracy_by_length': {1: 1.0, 2: 1.0, 3: 0.5, 4: 1.0}, 'mean_accuracy': 0.875, 'longest_perfect_length': 2}
"""


def longest_perfect_length(accuracy_by_length: dict[int, float]) -> int:
    """The largest length N with accuracy 1 at every length up to N, walking up from the shortest."""
    longest = 0
    for length in sorted(accuracy_by_length):
        if accuracy_by_length[length] < 1.0:
            break
        longest = length
    return longest


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Recognition(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        inputs = {"predictions": "int64", "references": "int64", "lengths": "int64"}
        return paper_metric_info("B", _DESCRIPTION, _KWARGS_DESCRIPTION, inputs)

    def _compute(self, predictions, references, lengths) -> dict:
        right = np.asarray(predictions) == np.asarray(references)
        lengths = np.asarray(lengths)
        accuracy_by_length = {int(n): float(np.mean(right[lengths == n])) for n in np.unique(lengths)}
        return {
            "accuracy_by_length": accuracy_by_length,
            "mean_accuracy": statistics.fmean(accuracy_by_length.values()) if accuracy_by_length else math.nan,
            "longest_perfect_length": longest_perfect_length(accuracy_by_length),
        }
