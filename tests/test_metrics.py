"""hf_attn.metrics: each `evaluate` module loads from the package with the network cut, documents itself and cites its
paper, gives the numbers of the functions it replaced (`regression_metrics`, `mape`, `argmax_accuracy` per length,
`longest_perfect_length`) on fixed inputs, agrees with a brute-force computation, and serves a Trainer's
`compute_metrics`. (An installed wheel's metrics: tests/test_packaging.py.)"""

import doctest
import math
import socket
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoConfig, AutoModelForTokenClassification, Trainer, TrainingArguments

import hf_attn
from hf_attn import load_metric
from hf_attn.data import algorithmic_dataset
from hf_attn.experiments import InMemoryDataset, labelled_argmax
from hf_attn.hub import PAPERS
from hf_attn.metrics import METRIC_NAMES, metric_path

HF_ATTN = Path(hf_attn.__file__).parent
NAN = math.nan
PAPER_OF = {"ood_regression": "A", "recognition": "B", "perplexity": "B"}
INPUTS = {"ood_regression": {"predictions", "references"}, "recognition": {"predictions", "references", "lengths"},
          "perplexity": {"predictions"}}  # fmt: skip


@pytest.fixture(scope="module")
def ood_regression():
    return load_metric("ood_regression")


@pytest.fixture(scope="module")
def recognition():
    return load_metric("recognition")


# --- loading and documentation ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", METRIC_NAMES)
def test_each_metric_loads_from_the_package_with_the_network_cut(name, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network access in a test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    metric = load_metric(name)
    assert (metric_path(name) / f"{name}.py").is_file() and metric_path(name).parents[1] == HF_ATTN
    assert metric.name == name and set(metric.features) == INPUTS[name]
    paper = PAPERS[PAPER_OF[name]]
    assert metric.citation.strip() == paper.bibtex  # the citation the model cards give
    assert f"https://arxiv.org/abs/{paper.arxiv}" in metric.info.reference_urls
    assert "Paper " + PAPER_OF[name] in metric.description and "Args:" in metric.inputs_description
    # The examples in the inputs' description run and print what they say.
    test = doctest.DocTestParser().get_doctest(metric.inputs_description, {}, name, None, 0)
    runner = doctest.DocTestRunner()
    runner.run(test)
    assert runner.summarize(verbose=False) == (0, 3)


def test_an_unknown_metric_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="hf_attn has no metric 'accuracy'; it has ood_regression, recognition"):
        load_metric("accuracy")


# --- ood_regression -----------------------------------------------------------------------------------------------


def algorithmic_like() -> tuple[np.ndarray, np.ndarray]:
    """Per-position float32 labels with a NaN scratchpad column and float32 predictions, as training/algorithmic.py
    passes them; every value is exact in binary, so the numbers below hold on any machine."""
    k = np.arange(30).reshape(5, 6)
    labels = ((k * 37 % 41) - 20.5) / 8  # no label is 0
    labels[:, -1] = NAN
    predictions = labels + ((k * 11 % 13) - 6) / 40
    return predictions.astype(np.float32), labels.astype(np.float32)


def test_ood_regression_gives_the_numbers_of_the_former_regression_metrics(ood_regression):
    predictions, labels = algorithmic_like()
    scores = ood_regression.compute(predictions=predictions.ravel(), references=labels.ravel(), tolerance=0.15)
    # regression_metrics(predictions, labels, 0.15) before the metrics became `evaluate` modules, in its key order:
    assert list(scores.items()) == [("mse", 0.010500001728536396), ("accuracy", 0.88), ("mape", 0.13247651645985922)]
    # training/mixed.py: float64 answers, one of them 0 (MAPE's floor), no tolerance; as the former `errors`
    answers = np.array([0.0, 0.89, 4.5, 12.25, 3.0, 0.05, 7.75])
    parsed = np.array([0.02, 1.0, 4.5, 11.0, 2.5, 0.0, 8.0])
    assert ood_regression.compute(predictions=parsed, references=answers) == {
        "mse": 0.26999999999999996, "mape": 285714.48922300764,
    }  # fmt: skip


def brute_force_regression(predictions, references, tolerance: float) -> dict[str, float]:
    pairs = [(float(p), float(r)) for p, r in zip(predictions, references, strict=True) if not math.isnan(r)]
    return {
        "mse": math.fsum((p - r) ** 2 for p, r in pairs) / len(pairs),
        "accuracy": sum(abs(p - r) <= tolerance for p, r in pairs) / len(pairs),
        "mape": math.fsum(abs(p - r) / max(abs(r), 1e-8) for p, r in pairs) / len(pairs),
    }


@pytest.mark.parametrize("seed", range(3))
def test_ood_regression_matches_a_brute_force_computation(ood_regression, seed):
    rng = np.random.default_rng(seed)
    references = rng.normal(scale=3, size=200)
    references[rng.random(200) < 0.2] = NAN  # unlabelled positions, e.g. scratchpads
    predictions = references + rng.normal(scale=0.2, size=200)
    predictions[np.isnan(references)] = rng.normal(size=np.isnan(references).sum())  # their outputs are ignored
    tolerance = 0.1 * (seed + 1)
    scores = ood_regression.compute(predictions=predictions, references=references, tolerance=tolerance)
    assert scores == pytest.approx(brute_force_regression(predictions, references, tolerance), rel=1e-12)


def test_ood_regression_tolerance_is_inclusive_and_optional(ood_regression):
    scores = ood_regression.compute(predictions=[1.25, 3.0, 0.0], references=[1.0, 2.0, NAN], tolerance=0.25)
    assert scores["accuracy"] == 0.5  # |1.25 - 1| == 0.25 counts; the NaN label is left out
    assert list(ood_regression.compute(predictions=[1.0], references=[2.0])) == ["mse", "mape"]
    with pytest.raises(ValueError, match="`tolerance` must be >= 0, got -1"):
        ood_regression.compute(predictions=[1.0], references=[2.0], tolerance=-1)
    nothing = ood_regression.compute(predictions=[1.0], references=[NAN], tolerance=0.1)
    assert list(nothing) == ["mse", "accuracy", "mape"] and all(math.isnan(v) for v in nothing.values())


def test_a_trainer_computes_ood_regression_in_compute_metrics(ood_regression, tmp_path):
    """The README's example: a per-position regressor's evaluation through Trainer's `compute_metrics`."""
    config = AutoConfig.for_model("positional_gpt2", n_layer=1, n_head=2, n_embd=8, n_positions=9, vocab_size=1,
                                  numeric_inputs=True, num_labels=1, problem_type="regression")  # fmt: skip
    model = AutoModelForTokenClassification.from_config(config)
    test_set = InMemoryDataset(algorithmic_dataset("cumulative_min", 16, scale=3.0, seed=0))

    def compute_metrics(prediction):
        outputs = prediction.predictions[..., 0]  # (N, T)
        return ood_regression.compute(
            predictions=outputs.ravel(), references=prediction.label_ids.ravel(), tolerance=0.05 * 3
        )

    args = TrainingArguments(str(tmp_path), use_cpu=True, report_to="none", per_device_eval_batch_size=5)
    scores = Trainer(model=model, args=args, compute_metrics=compute_metrics).evaluate(test_set)
    outputs = model.eval()(numeric_values=test_set.columns["numeric_values"]).logits[..., 0].detach().numpy()
    expected = brute_force_regression(outputs.ravel(), test_set.columns["labels"].numpy().ravel(), 0.15)
    assert {key: scores[f"eval_{key}"] for key in expected} == pytest.approx(expected, rel=1e-5)


# --- recognition --------------------------------------------------------------------------------------------------


def test_recognition_gives_the_numbers_of_the_former_functions(recognition):
    """Strings of lengths 1..8, 5 each: perfect up to 4, one mistake at 5, perfect at 6 and 7, two mistakes at 8."""
    lengths = np.repeat(np.arange(1, 9), 5)
    references = np.arange(40) % 2
    decisions = references.copy()
    decisions[[22, 36, 37]] = 1 - decisions[[22, 36, 37]]
    logits = np.eye(2)[decisions][:, None, :]  # (N, 1, 2): a recognizer's logits at <eos>
    predictions, labels = labelled_argmax(logits, references[:, None])
    scores = recognition.compute(predictions=predictions, references=labels, lengths=lengths)
    # argmax_accuracy per length, statistics.fmean over lengths and longest_perfect_length, as before:
    assert scores == {
        "accuracy_by_length": {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 0.8, 6: 1.0, 7: 1.0, 8: 0.6},
        "mean_accuracy": 0.925,
        "longest_perfect_length": 4,
    }


@pytest.mark.parametrize("seed", range(3))
def test_recognition_matches_a_brute_force_computation(recognition, seed):
    rng = np.random.default_rng(seed)
    lengths = rng.choice([3, 7, 8, 20, 41], size=300)
    references = rng.integers(0, 2, size=300)
    predictions = np.where(rng.random(300) < 0.1 * (lengths > 7), 1 - references, references)  # right up to 7
    scores = recognition.compute(predictions=predictions, references=references, lengths=lengths)
    expected, longest = {}, 0
    for length in sorted(set(lengths.tolist())):
        right = [p == r for p, r, n in zip(predictions, references, lengths, strict=True) if n == length]
        expected[length] = sum(right) / len(right)
    for length, accuracy in expected.items():
        if accuracy < 1:
            break
        longest = length
    assert scores["accuracy_by_length"] == expected
    assert scores["mean_accuracy"] == pytest.approx(sum(expected.values()) / len(expected), rel=1e-15)
    assert scores["longest_perfect_length"] == longest >= 7


@pytest.mark.parametrize(
    "accuracies,expected",
    [
        ([1.0, 1.0, 1.0, 1.0, 1.0], 60),  # perfect everywhere: the longest length
        ([1.0, 1.0, 1.0, 1.0, 0.99], 50),  # stops before the first imperfect length
        ([1.0, 1.0, 1.0, 0.5, 1.0], 41),  # a later perfect length does not count
        ([1.0, 1.0, 0.9, 1.0, 1.0], 40),  # Paper B: perfect in training, failing at 41, scores 40
        ([0.9, 1.0, 1.0, 1.0, 1.0], 0),  # imperfect from the start
    ],
)
def test_longest_perfect_length_walks_up_from_the_shortest_length(recognition, accuracies, expected):
    lengths = [1, 40, 41, 50, 60]
    strings = 100
    references = np.ones(len(lengths) * strings, dtype=np.int64)
    predictions = np.concatenate([np.arange(strings) < round(a * strings) for a in accuracies]).astype(np.int64)
    for order in (slice(None), slice(None, None, -1)):  # the strings' order does not matter
        scores = recognition.compute(predictions=predictions[order], references=references,
                                     lengths=np.repeat(lengths, strings)[order])  # fmt: skip
        assert scores["longest_perfect_length"] == expected
        assert list(scores["accuracy_by_length"].values()) == accuracies


# --- perplexity ---------------------------------------------------------------------------------------------------


def test_perplexity_is_exp_of_the_mean_token_nll():
    perplexity = load_metric("perplexity")
    nll = np.random.default_rng(0).exponential(scale=4.0, size=1000)
    mean_nll = math.fsum(nll.tolist()) / len(nll)
    scores = perplexity.compute(predictions=nll)
    assert scores == pytest.approx({"perplexity": math.exp(mean_nll), "mean_nll": mean_nll, "tokens": 1000}, rel=1e-14)
    nothing = perplexity.compute(predictions=[])
    assert nothing["tokens"] == 0 and math.isnan(nothing["perplexity"]) and math.isnan(nothing["mean_nll"])
