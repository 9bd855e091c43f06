"""The experiments' metrics as `evaluate` modules, shipped inside the package so that they load offline.

Each metric is a folder holding a script of the same name, the layout `evaluate.load(path)` reads:
- `ood_regression` (Paper A): MSE, MAPE and accuracy within a tolerance, positions without a label left out;
- `recognition` (Paper B): accuracy per string length and the longest length recognised perfectly;
- `perplexity` (Paper B): exp(mean NLL) of the tokens a language model scored.
Each metric's script holds its formulas (the experiments in training/ compute through it too); what their infos
share, the paper cited as the model cards cite it, is `info.paper_metric_info`, so a script loads where hf_attn is
installed. `import hf_attn` does not import `evaluate` (it pulls in datasets and pyarrow); `load_metric` does, on first
use.
"""

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import evaluate

METRICS_FOLDER = Path(__file__).resolve().parent
METRIC_NAMES = ("ood_regression", "recognition", "perplexity")


def metric_path(name: str) -> Path:
    """The folder of one of hf_attn's metrics, for `evaluate.load(str(metric_path(name)))`."""
    if name not in METRIC_NAMES:
        raise ValueError(f"hf_attn has no metric {name!r}; it has {', '.join(METRIC_NAMES)}.")
    return METRICS_FOLDER / name


def load_metric(name: str, **kwargs) -> "evaluate.EvaluationModule":
    """`evaluate.load` of one of hf_attn's metrics from the installed package: nothing is downloaded.

    The metric keeps its inputs in memory unless `kwargs` say otherwise (our inputs are small; no cache files or
    locks under ~/.cache). `kwargs` go to `evaluate.load`, e.g. `keep_in_memory=False, num_process=...` to
    compute one metric across processes.
    """
    import evaluate

    return evaluate.load(str(metric_path(name)), **{"keep_in_memory": True, **kwargs})


__all__ = ["METRIC_NAMES", "load_metric", "metric_path"]
