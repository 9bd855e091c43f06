"""training/induction.py end to end on tiny sizes: outputs, YAML configs, metrics, bad input, resume."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hub_checks import check_hub_folder
from transformers import AutoModelForTokenClassification, TrainingArguments
from transformers.trainer_utils import PredictionOutput

import training.induction as induction
from hf_attn.data import InductionVocab
from hf_attn.experiments import parse_config

CONFIGS = sorted(Path(__file__).parents[1].glob("configs/induction/*.yaml"))
CPU_CONFIG = str(Path(__file__).parents[1] / "configs/induction/cpu.yaml")
TINY = ["--depths", "1", "2", "--length", "12", "--train_samples", "64", "--test_samples", "8", "--max_steps", "4",
        "--per_device_train_batch_size", "16", "--per_device_eval_batch_size", "32", "--save_steps", "2"]  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run faster on one thread, several times so when other jobs share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_run(output_dir: Path, *extra: str) -> None:
    induction.FAMILY.main([CPU_CONFIG, "--output_dir", str(output_dir), *TINY, *extra])


@pytest.mark.parametrize("config", CONFIGS, ids=lambda path: path.name)
def test_every_config_parses_and_validates(config):
    experiment, model, training = parse_config(
        (induction.ExperimentArguments, induction.ModelArguments, TrainingArguments), [str(config)]
    )
    assert not induction.problems(experiment, model, training)
    assert experiment.models and experiment.depths and training.max_steps > 0 and training.learning_rate > 0


def test_tiny_run_writes_results_depth_table_plots_and_models(tmp_path):
    tiny_run(tmp_path)
    for model in ("positional", "standard"):
        for depth in (1, 2):
            run = tmp_path / f"depth-{depth}" / model / "seed-0"
            results = json.loads((run / "results.json").read_text())
            assert (results["model"], results["depth"]) == (model, depth) and list(results["by_scale"]) == [str(depth)]
            assert results["collapse"]["metric"] == "error rate" and 0 < results["collapse"]["input_blind_error"] < 1
            metrics = results["by_scale"][str(depth)]
            for split in ("id", "ood"):
                per_hop = [metrics[f"accuracy_{split}_k{k}"] for k in range(4)]
                assert all(0 <= a <= 1 for a in per_hop) and metrics[f"loss_{split}"] > 0
                assert metrics[f"accuracy_{split}"] == pytest.approx(np.mean(per_hop))
            saved = AutoModelForTokenClassification.from_pretrained(run / "model")
            assert saved.config.use_cache and saved.config.n_layer == depth
            assert saved.config.model_type == results["model_type"]
            assert saved.config.num_labels == InductionVocab(3).vocab_size
            check_hub_folder(run / "model", {"accuracy_id", "accuracy_ood", "loss_id", "loss_ood"}, tokenizer=False)
    report = (tmp_path / "results.md").read_text()
    assert "| depth | positional mean | positional median | standard mean | standard median |" in report
    assert "\n| 1 | " in report and "\n| 2 | " in report
    for metric, _, _ in induction.report_metrics(3):
        assert (tmp_path / f"{metric}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tracked_steps_record_accuracy_along_training(tmp_path):
    """`tracked_steps` records the mean accuracy over k after those steps; after the last step it is the accuracy
    of the final model, which the evaluation computes its own way (Trainer.predict, per k)."""
    tiny_run(tmp_path, "--tracked_steps", "1", "4", "9", "--depths", "2")  # step 9: past max_steps, never reached
    runs = {m: json.loads((tmp_path / "depth-2" / m / "seed-0" / "results.json").read_text())
            for m in ("positional", "standard")}  # fmt: skip
    for results in runs.values():
        assert set(results["by_step"]) == {"1", "4"}
        for split in ("id", "ood"):
            final = results["by_scale"]["2"][f"accuracy_{split}"]
            assert results["by_step"]["4"][f"accuracy_{split}"] == pytest.approx(final, abs=1e-6)
        assert results["by_step"]["1"] != results["by_step"]["4"]  # the model trained in between
    assert "## depth 2" in (tmp_path / "accuracy_by_step.md").read_text()
    assert (tmp_path / "depth-2" / "accuracy_by_step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_accuracy_by_step_summarizes_seeds_per_depth_without_collapsed_runs(tmp_path):
    def run(model, depth, seed, accuracies, collapsed=False):
        by_step = {
            str(step): {"accuracy_id": a, "accuracy_ood": 0.2} for step, a in zip((100, 200), accuracies, strict=True)
        }
        return {"model": model, "depth": depth, "seed": seed, "by_step": by_step, "collapse": {"collapsed": collapsed}}

    results = [run("positional", 1, 0, (0.5, 0.6)), run("positional", 1, 1, (0.7, 0.9)),
               run("positional", 1, 2, (0.1, 0.1), collapsed=True), run("standard", 1, 0, (0.4, 0.8)),
               run("standard", 3, 0, (0.6, 0.95))]  # fmt: skip
    (tmp_path / "depth-1").mkdir(), (tmp_path / "depth-3").mkdir()
    report = induction.write_accuracy_by_step(tmp_path, results)
    depth_1, depth_3 = report.split("## depth 1")[1].split("## depth 3")
    assert "| 100 | 0.600 | 0.600 | 0.400 | 0.400 |" in depth_1 and "| 200 | 0.750 | 0.750 | 0.800 | 0.800 |" in depth_1
    assert "| 200 | 0.950 | 0.950 |" in depth_3 and "positional" not in depth_3
    for depth in (1, 3):
        assert (tmp_path / f"depth-{depth}" / "accuracy_by_step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class FixedPredictions:
    """Stands in for a Trainer: logits that pick `predict(labels)` at every position."""

    def __init__(self, predict):
        self.predict_ids = predict

    def predict(self, dataset):
        labels = dataset.columns["labels"]
        ids = self.predict_ids(labels)
        logits = torch.nn.functional.one_hot(ids, InductionVocab(3).vocab_size).float()  # (N, T, V)
        return PredictionOutput(logits.numpy(), labels.numpy(), {"test_loss": 0.5})


def test_accuracy_counts_labelled_positions_only():
    experiment = induction.ExperimentArguments(length=20, test_samples=16)
    perfect, collapse = induction.evaluate(FixedPredictions(lambda labels: labels.clamp(min=0)), experiment)
    assert perfect["accuracy_id"] == perfect["accuracy_ood"] == 1.0  # the hop token's -100 is not a miss
    assert not collapse["collapsed"] and collapse["error"] == 0
    no_answer = InductionVocab(3).no_answer_id
    abstain, _ = induction.evaluate(FixedPredictions(lambda labels: torch.full_like(labels, no_answer)), experiment)
    assert abstain["accuracy_id_k0"] == 0.0  # k = 0 copies the character: always answerable
    assert 0 < abstain["accuracy_id_k3"] < 1


def test_predicting_each_positions_majority_label_is_a_collapse():
    """A model that ignores the characters can at best predict each position's most frequent label."""
    experiment = induction.ExperimentArguments(length=20, test_samples=16)

    def majority(labels):  # per position, over the test set the model is shown
        counts = torch.nn.functional.one_hot(labels.clamp(min=0), InductionVocab(3).vocab_size).sum(0)
        return counts.argmax(-1).expand_as(labels)

    metrics, collapse = induction.evaluate(FixedPredictions(majority), experiment)
    assert collapse["collapsed"] and collapse["error"] == pytest.approx(collapse["input_blind_error"])
    assert collapse["error"] == pytest.approx(1 - metrics["accuracy_id"])


def test_finished_runs_are_never_overwritten(tmp_path, capsys):
    tiny_run(tmp_path, "--models", "standard", "--depths", "1")
    results = tmp_path / "depth-1" / "standard" / "seed-0" / "results.json"
    before = results.read_text()
    tiny_run(tmp_path, "--models", "standard", "--depths", "1")
    assert "finished earlier, kept as it is" in capsys.readouterr().out
    with pytest.raises(ValueError, match="learning_rate 0.001 -> 0.1"):
        tiny_run(tmp_path, "--models", "standard", "--depths", "1", "--learning_rate", "0.1")
    assert results.read_text() == before


@pytest.mark.parametrize(
    "args,message",
    [
        (["--models", "transformer"], "invalid choice"),
        (["--no_such_field", "3"], "unrecognized arguments"),
        (["--block_style", "parallel"], "invalid choice"),
        (["--depths", "two"], "invalid int value"),
    ],
)
def test_bad_arguments_stop_before_training(tmp_path, args, message):
    with pytest.raises(ValueError, match=message):
        tiny_run(tmp_path, *args)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "args,messages",
    [
        (["--depths", "0", "2"], ["depths must all be >= 1"]),
        (["--depths", "2", "2", "--length", "0"], ["no value twice", "length must be >= 1"]),  # all at once
        (["--max_steps", "-1"], ["max_steps"]),
        (["--n_head", "7"], ["`n_embd` (60) must be divisible by `n_head` (7). (models: positional, standard)"]),
        (["--positional_encoding", "binary", "--positional_qk_dim", "0"], ["positional_qk_dim"]),
        (["--tracked_steps", "0", "2"], ["tracked_steps must all be >= 1, got [0, 2]"]),
    ],
)
def test_invalid_values_stop_before_training(tmp_path, args, messages):
    with pytest.raises(ValueError) as error:
        tiny_run(tmp_path, *args)
    assert all(message in str(error.value) for message in messages)
    assert not any(tmp_path.iterdir())


def test_unknown_yaml_key(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("depths: [1]\nlearning_rat: 0.1\n")
    with pytest.raises(ValueError, match=f"config file {config}: unknown key.* learning_rat"):
        induction.FAMILY.main([str(config), "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


class CrashAfterFirstCheckpoint(induction.Trainer):
    """Saves the first checkpoint, then fails as a killed job would."""

    def _save_checkpoint(self, *args, **kwargs):
        super()._save_checkpoint(*args, **kwargs)
        raise RuntimeError("simulated crash")


def test_interrupted_run_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch):
    one_run = ("--models", "standard", "--depths", "2", "--tracked_steps", "1", "4")  # step 1 before the crash
    tiny_run(tmp_path / "uninterrupted", *one_run)
    interrupted = tmp_path / "interrupted"
    with monkeypatch.context() as patch:
        patch.setattr(induction, "Trainer", CrashAfterFirstCheckpoint)
        with pytest.raises(RuntimeError, match="simulated crash"):
            tiny_run(interrupted, *one_run)
    run = interrupted / "depth-2" / "standard" / "seed-0"
    assert (run / "checkpoint-2").is_dir() and not (run / "results.json").exists()
    with pytest.raises(ValueError, match="--resume true"):  # never silently restarts over checkpoints
        tiny_run(interrupted, *one_run)
    tiny_run(interrupted, *one_run, "--resume", "true")
    expected = json.loads((tmp_path / "uninterrupted/depth-2/standard/seed-0/results.json").read_text())
    resumed = json.loads((run / "results.json").read_text())
    for name, value in expected["by_scale"]["2"].items():
        torch.testing.assert_close(resumed["by_scale"]["2"][name], value, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(resumed["by_step"], expected["by_step"], rtol=1e-5, atol=1e-7)
