"""The papers' numbers in `training.paper_numbers` are, cell for cell, those of `shared/spec/paper_numbers.md`."""

from pathlib import Path

import pytest

from training import paper_numbers

SOURCE = Path(__file__).parents[2] / "shared" / "spec" / "paper_numbers.md"
# The papers' names, as the source writes them, for ours.
TASKS = {"sum": "cumulative_sum", "min": "cumulative_min", "median": "cumulative_median", "sort": "sort",
         "max_sum_subarray": "cumulative_max_subarray_sum"}  # fmt: skip
MODELS = {"pos": "positional", "std": "standard"}
LANGUAGES = {
    "Σ*a": "ends_with_a", "Σ*ab": "ends_with_ab", "aΣ*": "starts_with_a", "Σ*aΣ*bΣ*": "contains_a_then_b",
    "(ab)*": "ab_star", "Σ*abΣ*": "contains_ab", "right-det. polynomial": "right_deterministic_polynomial",
    "bounded Dyck-2": "dyck2_bounded",
}  # fmt: skip
ENCODINGS = {"learned absolute": "learned", "RoPE": "rope", "SiPE": "sinusoidal"}


def tables(section_title: str) -> list[list[list[str]]]:
    """The Markdown tables (rows of cells, header first) of the source's section whose heading starts so."""
    text = SOURCE.read_text().split(f"### {section_title}")[1].split("\n### ")[0].split("\n## ")[0]
    found, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|---"):
            continue
        if line.startswith("|"):
            current.append([cell.strip().replace("**", "") for cell in line.strip().strip("|").split("|")])
        elif current:
            found.append(current)
            current = []
    return found


@pytest.fixture(autouse=True)
def _source():
    if not SOURCE.exists():
        pytest.fail(f"{SOURCE} is missing: the tests need ../shared beside the repository")


def test_algorithmic_mse():
    (table,) = tables("Algorithmic tasks")
    expected = {(TASKS[t], MODELS[m], s): tuple(map(float, v)) for t, m, s, *v in table[1:]}
    assert paper_numbers.ALGORITHMIC_MSE == expected


def test_mixed_task_mse_and_fine_tuned_gpt2():
    models, gpt2 = tables("Mixed text + numbers task")
    assert paper_numbers.MIXED_MSE == {(t, m, s): tuple(map(float, v)) for t, m, s, *v in models[1:]}
    assert paper_numbers.MIXED_GPT2_LARGE == {(t, m, s): tuple(map(float, v)) for t, m, s, *v in gpt2[1:]}


def test_median_task_accuracy():
    text = SOURCE.read_text()
    for model, values in paper_numbers.MEDIAN_TASK_ACCURACY.items():
        line = next(line for line in text.splitlines() if line.startswith(f"- {model}: "))
        assert tuple(float(v) for v in line.split(": ")[1].split(", ")) == values


def test_formal_language_accuracy():
    (table,) = tables("Formal languages")
    header = table[0][2:]
    expected = {LANGUAGES[row[0]]: dict(zip(header, map(float, row[2:]), strict=True)) for row in table[1:]}
    assert paper_numbers.FORMAL_LANGUAGES_ACCURACY == expected


def test_wikitext_hybrid_gain():
    (table,) = tables("WikiText-2 perplexity")
    expected = {ENCODINGS[row[0]]: float(row[-1].replace("−", "-").split()[0]) for row in table[1:]}
    assert paper_numbers.WIKITEXT_HYBRID_1_PERPLEXITY_CHANGE == expected
