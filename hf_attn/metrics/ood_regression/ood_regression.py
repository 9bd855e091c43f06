"""Paper A's regression errors out of distribution: MSE, MAPE and accuracy within a tolerance."""

import math

import evaluate
import numpy as np

from hf_attn.metrics.info import paper_metric_info

_DESCRIPTION = """\
Errors of real-valued predictions, as Paper A (Back de Luca et al., ICML 2025) measures models trained on numbers
from one range and tested on ranges c times wider: the mean squared error, the mean absolute percentage error and,
given a tolerance, the share of predictions within it of their label. A position whose label is NaN has no target
(Paper A's scratchpad, a position a task does not label) and is left out, so a per-position model's outputs and
labels can be passed flattened as they come. All arithmetic is in float64.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `float`): one prediction per position, e.g. `logits[..., 0]` of a per-position
        regressor, flattened.
    references (`list` of `float`): the labels, aligned with `predictions`; NaN where a position has no label.
    tolerance (`float`, *optional*): the largest |prediction - label| that counts as right. Absolute: for a test
        range c times the training range, pass `tolerance * c` as training/algorithmic.py does.
Returns:
    mse (`float`): mean of (prediction - label)^2 over labelled positions.
    accuracy (`float`, only with `tolerance`): share of labelled positions with |prediction - label| <= tolerance.
    mape (`float`): mean of |prediction - label| / max(|label|, 1e-8) over labelled positions.
    Every score is NaN when no position has a label.
Examples:
    >>> import hf_attn
    >>> ood_regression = hf_attn.load_metric("ood_regression")
    >>> ood_regression.compute(predictions=[1.0, 2.5, 7.0], references=[1.0, 2.0, float("nan")], tolerance=0.1)
    {'mse': 0.125, 'accuracy': 0.5, 'mape': 0.125}
"""

MAPE_FLOOR = 1e-8  # a label of 0 would divide by zero: its error counts relative to 1e-8


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class OodRegression(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        # float64 both: the default numpy format would hand `_compute` float32 arrays, so none is set
        return paper_metric_info(
            "A", _DESCRIPTION, _KWARGS_DESCRIPTION, {"predictions": "float64", "references": "float64"}
        )

    def _compute(self, predictions, references, tolerance: float | None = None) -> dict[str, float]:
        if tolerance is not None and not tolerance >= 0:
            raise ValueError(f"`tolerance` must be >= 0, got {tolerance}.")
        references = np.asarray(references, dtype=np.float64)
        labelled = ~np.isnan(references)
        errors = np.asarray(predictions, dtype=np.float64)[labelled] - references[labelled]
        per_position = {"mse": errors**2}  # each score is the mean of one of these over the labelled positions
        if tolerance is not None:
            per_position["accuracy"] = np.abs(errors) <= tolerance
        per_position["mape"] = np.abs(errors) / np.maximum(np.abs(references[labelled]), MAPE_FLOOR)
        return {name: float(np.mean(values)) if errors.size else math.nan for name, values in per_position.items()}
