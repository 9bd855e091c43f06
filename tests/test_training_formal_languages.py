"""training/formal_languages.py end to end on tiny sizes: outputs, YAML configs, metrics, bad input, kept runs."""

import json
from pathlib import Path

import pytest
from hub_checks import check_hub_folder
from transformers import AutoModelForTokenClassification, TrainingArguments

import training.formal_languages as formal
from hf_attn.experiments import parse_config
from hf_attn.experiments.runs import Run

ROOT = Path(__file__).parents[1]
CONFIG = str(ROOT / "configs/formal_languages/cpu.yaml")
TINY = ["--languages", "ab_star", "--variants", "global", "hybrid-1", "--train_samples", "64",
        "--train_max_length", "8", "--test_min_length", "9", "--test_max_length", "14", "--test_length_step", "1",
        "--test_samples_per_length", "8", "--n_layer", "1", "--n_embd", "16", "--n_head", "2", "--max_steps", "2",
        "--per_device_train_batch_size", "32"]  # fmt: skip


def tiny_run(output_dir: Path, *extra: str) -> None:
    formal.FAMILY.main([CONFIG, "--output_dir", str(output_dir), *TINY, *extra])


@pytest.mark.parametrize("config", sorted(ROOT.glob("configs/formal_languages/*.yaml")), ids=lambda path: path.name)
def test_every_config_parses_and_validates(config):
    experiment, model, training = parse_config(
        (formal.ExperimentArguments, formal.ModelArguments, TrainingArguments), [str(config)]
    )
    assert not formal.problems(experiment, model, training)
    assert experiment.languages and experiment.learning_rates and training.max_grad_norm == 1.0


def longest_perfect(accuracy_by_length: dict[str, float]) -> int:
    lengths = sorted(map(int, accuracy_by_length))
    imperfect = [n for n in lengths if accuracy_by_length[str(n)] < 1]
    return max([0] + [n for n in lengths if not imperfect or n < imperfect[0]])


def check_recognition_scores(results: dict) -> None:
    """The run's scores are what the recognition metric's definitions give from its per-length accuracies."""
    test = {n: scores["accuracy"] for n, scores in results["by_scale"].items()}
    train = results["train_accuracy_by_length"]
    assert results["mean_accuracy"] == pytest.approx(sum(test.values()) / len(test))
    assert results["train_accuracy"] == pytest.approx(sum(train.values()) / len(train))
    assert results["longest_perfect_test_length"] == longest_perfect(test)
    assert results["longest_perfect_length"] == longest_perfect(train | test)  # Paper B's: from the training lengths


def test_tiny_run_writes_results_tables_heatmaps_and_models(tmp_path):
    tiny_run(tmp_path, "--position_embeddings", "none", "rope", "--learning_rates", "0.001", "0.003")
    language = tmp_path / "ab_star"
    for positions in ("none", "rope"):
        for lr in ("0.001", "0.003"):
            for variant in ("global", "hybrid-1"):
                run = language / positions / f"lr-{lr}" / variant / "seed-0"
                results = json.loads((run / "results.json").read_text())
                assert set(results["by_scale"]) == {"10", "12", "14"}  # odd 9, 11, 13: ab_star has no members
                assert results["learning_rate"] == results["config"]["training"]["learning_rate"] == float(lr)
                assert 0 <= results["mean_accuracy"] <= 1 and results["longest_perfect_test_length"] in (0, 10, 12, 14)
                assert set(results["train_accuracy_by_length"]) == {"2", "4", "6", "8"}  # ab_star: even lengths
                assert results["longest_perfect_length"] in (0, 2, 4, 6, 8, 10, 12, 14)
                check_recognition_scores(results)
                saved = AutoModelForTokenClassification.from_pretrained(run / "model")
                assert saved.config.num_labels == 2 and saved.config.n_positions == 16
                check_hub_folder(run / "model", {"accuracy"}, tokenizer=False)
    report = (language / "results.md").read_text()
    assert "| variant | none | rope |" in report and "| hybrid-1 | " in report and "## learning rate 0.003" in report
    assert "| variant | ab_star |" in (tmp_path / "results.md").read_text()
    for plot in (language / "accuracy.png", tmp_path / "accuracy_none.png", tmp_path / "accuracy_rope.png"):
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cells_aggregate_every_seed_and_learning_rate_as_paper_b():
    def result(lr, seed, accuracies, longest):
        by_scale = {str(n): {"accuracy": a} for n, a in zip((41, 50), accuracies, strict=True)}
        return dict(language="ab_star", positions="none", model="global", learning_rate=lr, seed=seed,
                    by_scale=by_scale, mean_accuracy=sum(accuracies) / 2, longest_perfect_length=longest)  # fmt: skip

    results = [result(1e-4, 0, (1.0, 1.0), 50), result(1e-4, 1, (0.5, 0.5), 0), result(3e-4, 0, (1.0, 0.8), 41),
               result(3e-4, 1, (0.9, 0.7), 40)]  # fmt: skip
    cell = formal.cell_summaries(results)["ab_star", "none", "global"]
    assert cell == {"runs": 4, "perfect_runs": 1, "mean_accuracy": pytest.approx(0.8), "min_accuracy": 0.5,
                    "max_accuracy": 1.0, "longest_perfect_length": pytest.approx(32.75),
                    "max_longest_perfect_length": 50}  # fmt: skip
    at_rate = formal.cell_summaries(results, learning_rate=3e-4)["ab_star", "none", "global"]
    assert at_rate["runs"] == 2 and at_rate["perfect_runs"] == 0 and at_rate["mean_accuracy"] == pytest.approx(0.85)


def test_settings_table_puts_each_settings_runs_of_a_cell_side_by_side():
    def result(model, accuracy, longest, positions="none"):
        return dict(language="ab_star", positions=positions, model=model, learning_rate=1e-3, seed=0,
                    by_scale={"500": {"accuracy": accuracy}}, mean_accuracy=accuracy,
                    longest_perfect_length=longest)  # fmt: skip

    table = formal.settings_table(
        {"short": [result("hybrid-1", 0.7, 92), result("global", 0.5, 2)], "long": [result("hybrid-1", 1.0, 500)]},
        ["ab_star"], ["global", "hybrid-1"],
    )  # fmt: skip
    lines = table.splitlines()
    assert lines[0] == "| language / variant | Paper B | short | long |"
    assert lines[2] == "| ab_star / global | cannot | 0.500 (0.50-0.50) / 2 (max 2) / 0 of 1 | not run |"
    assert lines[3].startswith("| ab_star / hybrid-1 | can | 0.700 (0.70-0.70) / 92 (max 92) / 0 of 1 | 1.000")
    assert lines[3].endswith("/ 500 (max 500) / 1 of 1 |")
    under_rope = {"scaled": [result("global", 0.9, 41, "rope"), result("global", 0.1, 0)]}
    rope_row = formal.settings_table(under_rope, ["ab_star"], ["global"], positions="rope").splitlines()[2]
    assert rope_row == "| ab_star / global | cannot | 0.900 (0.90-0.90) / 41 (max 41) / 0 of 1 |"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--variants", "sparse-2"], "variant 'sparse-2'"),
        (["--test_min_length", "5"], "train_max_length .8. < test_min_length .5."),
        (["--test_min_length", "20", "--test_max_length", "15"], "test_min_length"),
        (["--train_min_length", "0"], "train_min_length"),
        (["--test_min_length", "9", "--test_max_length", "9"], "ab_star has no strings at any test length"),
        (["--learning_rates", "0"], "learning_rates"),
    ],
)
def test_invalid_values_stop_before_training(tmp_path, args, message):
    with pytest.raises(ValueError, match=message):
        tiny_run(tmp_path, *args)
    assert not (tmp_path / "ab_star").exists()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--languages", "palindromes"], "invalid choice"),
        (["--position_embeddings", "learned"], "invalid choice"),
        (["--contains_positives", "random"], "invalid choice: 'random' \\(choose from 'written_in', 'uniform'\\)"),
        (["--no_such_field", "3"], "unrecognized arguments"),
    ],
)
def test_bad_arguments_stop_before_training(tmp_path, args, message):
    with pytest.raises(ValueError, match=message):
        tiny_run(tmp_path, *args)
    assert not (tmp_path / "ab_star").exists()


def test_finished_runs_are_kept_and_new_test_lengths_evaluate_the_kept_model(tmp_path, capsys):
    tiny_run(tmp_path, "--variants", "global", "--test_min_length", "12")
    results = tmp_path / "ab_star" / "none" / "lr-0.001" / "global" / "seed-0" / "results.json"
    before = results.read_text()
    tiny_run(tmp_path, "--variants", "global", "--test_min_length", "12")
    assert results.read_text() == before
    assert "finished earlier, kept as it is" in capsys.readouterr().out
    with pytest.raises(ValueError, match="max_steps 2 -> 3"):
        tiny_run(tmp_path, "--variants", "global", "--test_min_length", "12", "--max_steps", "3")
    tiny_run(tmp_path, "--variants", "global", "--test_min_length", "10")
    assert "re-evaluating the kept model (test_min_length changed)" in capsys.readouterr().out
    after, before = json.loads(results.read_text()), json.loads(before)
    assert set(after["by_scale"]) == {"10", "12", "14"} and after["train_loss"] == before["train_loss"]
    assert all(after["by_scale"][n] == before["by_scale"][n] for n in ("12", "14"))


def forget_scale_embedding(record: Path, *keys: str) -> None:
    """Makes a saved config or a run's record look written before `scale_embedding` existed."""
    data = json.loads(record.read_text())
    section = data
    for key in keys:
        section = section[key]
    del section["scale_embedding"]
    record.write_text(json.dumps(data))


def test_a_model_saved_before_a_default_changed_is_not_loaded_as_another_model(tmp_path, monkeypatch, capsys):
    """An unscaled sinusoidal run saved before `scale_embedding` existed: today's default would scale it. Its
    settings cannot tell (they predate the field); its saved config can, so re-evaluating its kept model or resuming
    its checkpoint is refused until the saved value is set, and then gives what the model gave when it was trained."""
    monkeypatch.setattr(Run, "remove_checkpoints", lambda run: None)  # keeps checkpoint-2 for the resume below
    run_args = ("--variants", "global", "--position_embeddings", "sinusoidal", "--save_strategy", "steps",
                "--save_steps", "2", "--resume", "true")  # fmt: skip
    tiny_run(tmp_path, *run_args, "--test_min_length", "12", "--scale_embedding", "false")
    run = tmp_path / "ab_star" / "sinusoidal" / "lr-0.001" / "global" / "seed-0"
    trained = json.loads((run / "results.json").read_text())
    assert trained["config"]["model"]["scale_embedding"] is False
    forget_scale_embedding(run / "results.json", "config", "model")
    forget_scale_embedding(run / "model" / "config.json")
    forget_scale_embedding(run / "checkpoint-2" / "config.json")

    refused = r" holds another model than the one built now \(scale_embedding False -> True\)"
    with pytest.raises(ValueError, match="model" + refused):  # new test lengths re-evaluate the kept model
        tiny_run(tmp_path, *run_args, "--test_min_length", "10")
    tiny_run(tmp_path, *run_args, "--test_min_length", "10", "--scale_embedding", "false")
    assert "re-evaluating the kept model" in capsys.readouterr().out
    reevaluated = json.loads((run / "results.json").read_text())
    assert all(reevaluated["by_scale"][n] == trained["by_scale"][n] for n in ("12", "14"))

    (run / "results.json").unlink()  # now an interrupted run, whose checkpoint-2 is its last
    forget_scale_embedding(run / "settings.json", "model")
    with pytest.raises(ValueError, match="checkpoint-2" + refused):
        tiny_run(tmp_path, *run_args, "--test_min_length", "12")
    tiny_run(tmp_path, *run_args, "--test_min_length", "12", "--scale_embedding", "false")
    resumed = json.loads((run / "results.json").read_text())
    assert resumed["by_scale"] == trained["by_scale"] and resumed["train_loss"] == trained["train_loss"]


# Paper B (../shared/spec/papers.md): global = LTL[P], 1-local = LTL[Y], hybrid-1 = LTL[P, Y]; a window k > 1 is
# weaker than 1 ("1-local is the most expressive window"), so whether it keeps an LTL[Y] language is open (None).
Y_LANGUAGE = {"global": False, "local-1": True, "hybrid-1": True, "local-4": None, "hybrid-2": None}
P_LANGUAGE = {"global": True, "local-1": False, "hybrid-1": True, "local-4": False, "hybrid-2": True}
PY_LANGUAGE = {"global": False, "local-1": False, "hybrid-1": True, "local-4": False, "hybrid-2": None}
OUTSIDE = dict.fromkeys(Y_LANGUAGE)
PAPER_B_EXPECTATIONS = {
    "ends_with_a": Y_LANGUAGE, "ends_with_ab": Y_LANGUAGE, "starts_with_a": P_LANGUAGE,
    "contains_a_then_b": P_LANGUAGE, "ab_star": PY_LANGUAGE, "contains_ab": PY_LANGUAGE,
    "right_deterministic_polynomial": OUTSIDE, "dyck2_bounded": OUTSIDE,
}  # fmt: skip


@pytest.mark.parametrize("language", PAPER_B_EXPECTATIONS)
@pytest.mark.parametrize("variant", list(Y_LANGUAGE))
def test_predictions_follow_paper_b_classes(language, variant):
    assert formal.predicted_recognition(language, variant) is PAPER_B_EXPECTATIONS[language][variant]


def test_a_cell_that_disagrees_with_the_prediction_is_marked():
    stats = {"perfect_runs": 0, "runs": 3}
    assert formal.prediction_cell("ends_with_a", "local-1", stats) == "can; 0 of 3 perfect (differs)"
    assert formal.prediction_cell("ends_with_a", "global", stats) == "cannot; 0 of 3 perfect"
    assert formal.prediction_cell("dyck2_bounded", "hybrid-1", {"perfect_runs": 1, "runs": 3}) == (
        "no guarantee; 1 of 3 perfect"
    )
    assert formal.prediction_cell("ends_with_a", "local-2", stats) == "open for k > 1; 0 of 3 perfect"
