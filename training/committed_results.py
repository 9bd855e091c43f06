"""The committed results every generated table reads: where they sit, which experiments each page shows, and how a
paper's number stands beside ours.

`docs/results/NAME/` holds one experiment's runs as results.json files; `python -m training.reports` makes every
report and generated table from them.
"""

from pathlib import Path

from hf_attn.experiments import format_value

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs" / "results"


def pages(root: Path = ROOT) -> tuple[Path, ...]:
    """The pages that hold generated blocks: README.md and docs/*.md under `root`."""
    return (root / "README.md", *sorted((root / "docs").glob("*.md")))


PAGES = pages()
PAPER_A = ("quickstart", "algorithmic_cpu", "algorithmic_cpu_long", "algorithmic_llama_cpu", "mixed_cpu",
           "induction_cpu", "induction_cpu_layernorm")  # fmt: skip
FORMAL_PAPER_SIZE = "formal_languages_paper_size_cpu"  # the main table at Paper B's model size: the headline
FORMAL_POSITIVES = "formal_languages_check_positives"  # its contains_ab local cells with uniform random members
FORMAL_CHECKS = {"smaller model: 2 layers x 32, 500 steps": "formal_languages_table_cpu",
                 "4x longer: 2,000 steps": "formal_languages_check_longer",
                 "Paper B's size: 5 layers x 64, 8 heads, 500 steps": "formal_languages_check_paper_size"}  # fmt: skip
PAPER_B_FORMAL = ("formal_languages_table_cpu", "formal_languages_positions_cpu", "formal_languages_check_longer",
                  "formal_languages_check_paper_size")  # fmt: skip
SINUSOIDAL_UNSCALED = {
    "formal": "formal_languages_check_sinusoidal_unscaled",
    "wikitext": "wikitext_check_sinusoidal_unscaled",
}  # before Vaswani et al.'s scale was default
PAPER_B = (FORMAL_PAPER_SIZE, FORMAL_POSITIVES, *PAPER_B_FORMAL, SINUSOIDAL_UNSCALED["formal"], "wikitext_cpu",
           SINUSOIDAL_UNSCALED["wikitext"])  # fmt: skip
HYBRID = ("wikitext_llama_cpu",)  # docs/hybrid.md's experiment runs
HYBRID_TRADEOFF = "hybrid_tradeoff"  # benchmarks/hybrid_tradeoff.py's results (a folder per window, `k16`, ...,
# a folder per model in each) and its models' pretraining
POSITIONAL_CONVERSION = "positional_conversion"  # benchmarks/positional_conversion.py's results
LONG_CONTEXT = "long_context"  # benchmarks/long_context.py's results, a folder per model
LONG_CONTEXT_CPU_CHECK = "long_context_cpu_check"  # its first configurations, measured on the CPU before the GPU run
# Benchmarks whose one run (docs/results/FOLDER/results.json) is a generated block of its own: FOLDER by block name.
ONE_RUN_BENCHMARKS = {"serving": "serving", "serving-http": "serving_http", "serving-orders": "serving_orders",
                      "hybrid-speed": "hybrid_speed", "allocators": "allocators", "ruler": "ruler",
                      "revision-speed": "revision_speed"}  # fmt: skip
PUBLISHED = PAPER_A + PAPER_B + HYBRID  # the folders of docs/results whose reports `training.reports` rewrites
IDLE_RUN_TIMES = "paper_b_idle_run_times"  # two or more runs of each of these, with nothing else running
IDLE_TIMED = (*PAPER_B_FORMAL, "wikitext_cpu")


def published(value: float) -> str:
    """A paper's number as the source gives it (two significant digits): no padding to our precision."""
    return f"{value:g}"


def beside(ours: float, paper: float) -> str:
    return f"{format_value(ours)} ({published(paper)})"
