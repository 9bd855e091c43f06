"""What every hf_attn metric's `MetricInfo` holds besides its own text: the paper it measures for, cited and linked
as the model cards cite it (`hf_attn.hub.PAPERS`), and its inputs' value types. Imported by the metric scripts only,
so that `import hf_attn` still does not import `evaluate`."""

import datasets
import evaluate

from ..hub import PAPERS


def paper_metric_info(
    paper: str, description: str, inputs_description: str, inputs: dict[str, str]
) -> evaluate.MetricInfo:
    """The `MetricInfo` of a metric of Paper `paper` (a key of `PAPERS`), its `inputs` given as name -> value type."""
    cited = PAPERS[paper]
    return evaluate.MetricInfo(
        description=description,
        citation=f"{cited.bibtex}\n",
        inputs_description=inputs_description,
        features=datasets.Features({name: datasets.Value(dtype) for name, dtype in inputs.items()}),
        reference_urls=[f"https://arxiv.org/abs/{cited.arxiv}"],
    )
