"""Perplexity, exp(mean token NLL), from the negative log-likelihoods of the tokens a language model scored."""

import math

import evaluate
import numpy as np

from hf_attn.metrics.info import paper_metric_info

_DESCRIPTION = """\
The perplexity of a language model over the tokens it scored, exp of their mean negative log-likelihood, as Paper B
(Li & Cotterell, ACL 2026) compares attention variants on WikiText-2: every token weighs the same (unlike
exp(eval_loss), a mean over batches). The inputs are per-token NLLs, not logits: logits are a vocabulary-wide row per
token (50,257 floats for GPT-2's), while which tokens are scored, and with what context, is the scoring loop's
choice (`hf_attn.experiments.perplexity` reads a token stream in sliding windows and computes through this module).
Unlike the Hub's `perplexity`, it runs no model.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `float`): the negative log-likelihood (natural log) of each scored token, e.g.
        `torch.nn.functional.cross_entropy(logits, labels, reduction="none")` at the positions with a label.
Returns:
    perplexity (`float`): exp(mean_nll).
    mean_nll (`float`): the mean NLL per token, in nats.
    tokens (`int`): how many tokens were scored.
    With no token, perplexity and mean_nll are NaN.
Examples:
    >>> import math, hf_attn
    >>> perplexity = hf_attn.load_metric("perplexity")
    >>> perplexity.compute(predictions=[math.log(2), math.log(8)])
    {'perplexity': 4.0, 'mean_nll': 1.3862943611198906, 'tokens': 2}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Perplexity(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return paper_metric_info("B", _DESCRIPTION, _KWARGS_DESCRIPTION, {"predictions": "float64"})

    def _compute(self, predictions) -> dict[str, float]:
        mean_nll = float(np.mean(np.asarray(predictions, dtype=np.float64))) if len(predictions) else math.nan
        return {"perplexity": math.exp(mean_nll), "mean_nll": mean_nll, "tokens": len(predictions)}
