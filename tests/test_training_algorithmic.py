"""training/algorithmic.py end to end on tiny sizes: outputs, YAML configs, bad input, resume."""

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from paper_a_reference import ReferenceModel
from transformers import AutoModelForTokenClassification, Trainer, TrainingArguments

import hf_attn.experiments
import training.algorithmic as algorithmic
from hf_attn.data import algorithmic_dataset
from hf_attn.experiments import InMemoryDataset, parse_config
from hf_attn.experiments.arguments import experiment_of
from hf_attn.experiments.runs import load_results

ROOT = Path(__file__).parents[1]
CONFIGS = sorted(Path(__file__).parents[1].glob("configs/algorithmic/*.yaml"))
QUICKSTART = str(Path(__file__).parents[1] / "configs/algorithmic/min_cpu.yaml")
TINY = ["--train_samples", "200", "--test_samples", "50", "--per_device_train_batch_size", "50",
        "--num_train_epochs", "2", "--scales", "1", "3", "--seeds", "0"]  # fmt: skip


def tiny_run(output_dir: Path, *extra: str) -> None:
    algorithmic.FAMILY.main([QUICKSTART, "--output_dir", str(output_dir), *TINY, *extra])


@pytest.mark.parametrize("config", CONFIGS, ids=lambda path: path.name)
def test_every_config_parses_and_validates(config):
    experiment, model, training = parse_config(
        (algorithmic.ExperimentArguments, algorithmic.ModelArguments, TrainingArguments), [str(config)]
    )
    assert not algorithmic.problems(experiment, model, training)
    assert experiment.tasks and experiment.models and training.learning_rate > 0
    assert training.max_grad_norm == 0  # Paper A's code does not clip gradients
    if model.architecture == "gpt2":  # Paper A's code: standard heads' queries and keys as wide as d_model
        assert model.content_qk_dim == model.n_embd


@pytest.mark.parametrize("length,depth", [(2, 2), (3, 2), (5, 3), (6, 3), (8, 4), (12, 4), (16, 5)])
def test_depth_is_floor_log2_n_plus_one(length, depth):
    model = algorithmic.build_model("positional", algorithmic.ModelArguments(), length, length + 1)
    assert model.config.n_layer == depth == math.floor(math.log2(length)) + 1


@pytest.mark.parametrize("kind", ["positional", "standard"])
def test_models_have_paper_a_codes_parameters(kind):
    """As many weights as Paper A's code (positional 84,577, standard 150,273), plus one unused token-embedding row."""
    ours = algorithmic.build_model(kind, algorithmic.ModelArguments(), length=8, positions=9)
    official = ReferenceModel(positional=kind == "positional", positions=9)
    unused_token_row = ours.config.n_embd
    assert ours.num_parameters() == sum(p.numel() for p in official.parameters()) + unused_token_row


def test_tiny_run_writes_results_table_plots_and_checkpoints(tmp_path):
    tiny_run(tmp_path)
    task = tmp_path / "cumulative_min"
    for model in ("positional", "standard"):
        results = json.loads((task / model / "seed-0" / "results.json").read_text())
        assert results["model"] == model and set(results["by_scale"]) == {"1", "3"}
        assert results["collapse"]["metric"] == "mse" and results["collapse"]["input_blind_error"] > 0
        assert results["machine"]["cpus"] >= 1 and len(results["machine"]["load_average"]) == 3
        assert all(m["mse"] >= 0 and 0 <= m["accuracy"] <= 1 for m in results["by_scale"].values())
        saved = AutoModelForTokenClassification.from_pretrained(task / model / "seed-0" / "model")
        assert saved.config.use_cache and saved.config.model_type == results["model_type"]
    report = (task / "results.md").read_text()
    assert "(2 runs, all of seed 0)" in report and "## MSE (seed 0)" in report  # one seed: nothing to average
    assert "| c | positional | standard |" in report
    for plot in ("mse.png", "accuracy.png"):
        assert (task / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_tiny_llama_run_trains_positional_heads_and_llamas_own(tmp_path):
    """`architecture: llama`: a Llama decoder, every head positional (P one-hot over the 9 positions) or every head
    Llama's own, numbers in through `wne`; both learn (training loss below the untrained model's MSE at c = 1) and
    load back with their Auto class."""
    llama = str(ROOT / "configs/algorithmic/llama_cpu.yaml")
    algorithmic.FAMILY.main([llama, "--output_dir", str(tmp_path), *TINY, "--tasks", "cumulative_min",
                             "--num_train_epochs", "4"])  # fmt: skip
    for model, kinds in (("positional", {"positional"}), ("standard", {"global"})):
        run = tmp_path / "cumulative_min" / model / "seed-0"
        results = json.loads((run / "results.json").read_text())
        saved = AutoModelForTokenClassification.from_pretrained(run / "model")
        assert saved.config.model_type == results["model_type"] == "hf_attn_llama"
        assert {kind for layer in saved.config.head_layout for kind in layer} == kinds
        assert saved.config.positional_encoding == "onehot" and saved.config.positional_encoding_dim == 9
        assert not results["collapse"]["collapsed"]
        assert results["by_scale"]["1"]["mse"] < results["collapse"]["input_blind_error"]


def test_an_untrained_run_is_reported_as_collapsed(tmp_path, capsys):
    """Learning rate 0: the models stay at their init, no better than predicting each position's mean label."""
    tiny_run(tmp_path, "--learning_rate", "0", "--scales", "2")
    for model in ("positional", "standard"):
        results = json.loads((tmp_path / "cumulative_min" / model / "seed-0" / "results.json").read_text())
        assert results["collapse"]["collapsed"] and set(results["by_scale"]) == {"2"}  # c = 1 checked, not reported
    printed = capsys.readouterr().out
    assert "positional 0, standard 0" in printed and "positional seed 0 (mse" in printed
    assert "| 2 | n/a | n/a |" in (tmp_path / "cumulative_min" / "results.md").read_text()


def test_finished_runs_are_kept_and_a_rerun_with_other_settings_is_refused(tmp_path, capsys):
    tiny_run(tmp_path, "--models", "positional")
    results = tmp_path / "cumulative_min" / "positional" / "seed-0" / "results.json"
    before = results.read_text()
    tiny_run(tmp_path, "--models", "positional")
    assert results.read_text() == before
    assert "finished earlier, kept as it is" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"learning_rate 0\.001 -> 0\.1, num_train_epochs 2\.0 -> 3\.0.*delete"):
        tiny_run(tmp_path, "--models", "positional", "--learning_rate", "0.1", "--num_train_epochs", "3")
    assert results.read_text() == before


def test_a_rerun_with_new_scales_evaluates_the_kept_model(tmp_path, capsys):
    """Scales only add evaluation: the finished run is re-evaluated on its kept model, the tables get the new rows,
    and the rows it had keep their values (an independent reference: the first run's own results)."""
    tiny_run(tmp_path, "--models", "positional")
    run = tmp_path / "cumulative_min" / "positional" / "seed-0"
    before = json.loads((run / "results.json").read_text())
    weights = (run / "model" / "model.safetensors").read_bytes()
    tiny_run(tmp_path, "--models", "positional", "--scales", "1", "2", "3")
    assert "re-evaluating the kept model (scales changed)" in capsys.readouterr().out
    after = json.loads((run / "results.json").read_text())
    assert set(after["by_scale"]) == {"1", "2", "3"} and after["config"]["experiment"]["scales"] == [1, 2, 3]
    for scale in ("1", "3"):
        assert after["by_scale"][scale] == pytest.approx(before["by_scale"][scale], rel=1e-6)
    for name in ("train_loss", "train_seconds", "collapse", "parameters"):
        assert after[name] == before[name]
    assert (run / "model" / "model.safetensors").read_bytes() == weights  # not trained again
    assert "| 2 |" in (tmp_path / "cumulative_min" / "results.md").read_text()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--tasks", "cumulative_mode"], "invalid choice"),
        (["--models", "transformer"], "invalid choice"),
        (["--no_such_field", "3"], "unrecognized arguments"),
        (["--block_style", "parallel"], "invalid choice"),
    ],
)
def test_bad_arguments_stop_before_training(tmp_path, args, message):
    with pytest.raises(ValueError, match=message):
        tiny_run(tmp_path, *args)
    assert not (tmp_path / "cumulative_min").exists()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--train_low", "2", "--train_high", "-2"], "train_low"),
        (["--scales", "0", "2"], "scales"),
        (["--architecture", "llama"], "architecture llama is causal: set is_causal true"),
        (
            ["--architecture", "llama", "--is_causal", "true", "--content_qk_dim", "64"],
            "content_qk_dim is not used by architecture llama",
        ),
        (
            ["--architecture", "llama", "--is_causal", "true", "--positional_encoding", "learned"],
            "`positional_encoding` must be one of",
        ),
    ],
)
def test_invalid_ranges_stop_before_training(tmp_path, args, message):
    with pytest.raises(ValueError, match=message):
        tiny_run(tmp_path, *args)
    assert not (tmp_path / "cumulative_min").exists()


def test_unknown_yaml_key_and_missing_file(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("tasks: [cumulative_min]\nlearning_rat: 0.1\n")
    with pytest.raises(ValueError, match=f"config file {config}: unknown key.* learning_rat"):
        algorithmic.FAMILY.main([str(config), "--output_dir", str(tmp_path)])
    with pytest.raises(ValueError, match="does not exist"):
        algorithmic.FAMILY.main([str(tmp_path / "missing.yaml")])


def crash_after_first_checkpoint(self, *args, **kwargs):
    """Saves the first checkpoint, then fails as a killed job would."""
    Trainer._save_checkpoint(self, *args, **kwargs)
    raise RuntimeError("simulated crash")


def test_interrupted_run_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch):
    tiny_run(tmp_path / "uninterrupted", "--models", "positional")
    interrupted = tmp_path / "interrupted"
    with monkeypatch.context() as patch:
        patch.setattr(hf_attn.experiments.PlateauTrainer, "_save_checkpoint", crash_after_first_checkpoint)
        with pytest.raises(RuntimeError, match="simulated crash"):
            tiny_run(interrupted, "--models", "positional")
    run = interrupted / "cumulative_min" / "positional" / "seed-0"
    assert (run / "checkpoint-4").is_dir() and not (run / "results.json").exists()
    with pytest.raises(ValueError, match="--resume true"):  # never silently restarts over checkpoints
        tiny_run(interrupted, "--models", "positional")
    tiny_run(interrupted, "--models", "positional", "--resume", "true")
    expected = json.loads((tmp_path / "uninterrupted/cumulative_min/positional/seed-0/results.json").read_text())
    resumed = json.loads((run / "results.json").read_text())
    for scale, metrics in expected["by_scale"].items():
        torch.testing.assert_close(resumed["by_scale"][scale]["mse"], metrics["mse"], rtol=1e-5, atol=1e-7)


def test_plateau_trainer_builds_paper_a_optimisation_and_steps_it_once_an_epoch(tmp_path):
    model = algorithmic.build_model("positional", algorithmic.ModelArguments(), length=8, positions=9)
    train_set = InMemoryDataset(algorithmic_dataset("cumulative_min", 64, scale=1.0, seed=0, length=8, low=-2, high=2))
    args = TrainingArguments(str(tmp_path), learning_rate=0.01, num_train_epochs=3, per_device_train_batch_size=32,
                             use_cpu=True, report_to="none", save_strategy="no")  # fmt: skip
    run = hf_attn.experiments.Run(tmp_path / "run", "positional", seed=0)
    trainer = hf_attn.experiments.plateau_trainer(model, train_set, run, args, factor=0.5, patience=0, min_lr=1e-6)
    trainer.train()
    assert type(trainer.optimizer.optimizer) is torch.optim.Adam  # accelerate wraps Trainer's optimizer
    assert trainer.optimizer.param_groups[0]["weight_decay"] == 0.0
    scheduler = trainer.lr_scheduler
    assert isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau) and scheduler.patience == 0
    epoch_losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(epoch_losses) == 3 and scheduler.last_epoch == 3  # stepped on each epoch's training loss
    assert scheduler.best == min(epoch_losses)


def test_quickstart_plots_key_the_median_band_the_runs_and_name_the_tolerance(tmp_path, monkeypatch):
    """From the committed quickstart results (three seeds): the figures as drawn, before they are saved; and drawn
    when every run collapsed."""
    figures = {}
    monkeypatch.setattr(hf_attn.experiments.reports, "save", lambda figure, path: figures.update({path.name: figure}))
    results = load_results(ROOT / "docs" / "results" / "quickstart")
    experiment = experiment_of(algorithmic.ExperimentArguments, results)
    assert experiment.tolerance == 0.05
    (tmp_path / "cumulative_min").mkdir()  # where the runs would be
    for tolerance in (0.05, 0.2):  # the label is the runs' setting, not a constant
        algorithmic.write_reports(tmp_path, results, dataclasses.replace(experiment, tolerance=tolerance))
        accuracy = figures["accuracy.png"].axes[0]
        assert f"within {tolerance:g} c of the target" in accuracy.get_ylabel().replace("\n", " ")
        assert f"accuracy within {tolerance:g} c" in (tmp_path / "cumulative_min" / "results.md").read_text()
    for name, metric in (("mse.png", "mse"), ("accuracy.png", "accuracy")):
        axes = figures[name].axes[0]
        legend = [text.get_text() for text in axes.get_legend().get_texts()]
        assert legend == ["positional (mean)", "standard (mean)", "median", "lowest to highest run"]
        for model, band in zip(("positional", "standard"), axes.collections, strict=True):
            runs = [r["by_scale"][c][metric] for r in results if r["model"] == model for c in r["by_scale"]]
            edges = band.get_paths()[0].vertices[:, 1]  # the band's outline: each c's lowest and highest run
            assert min(edges) == pytest.approx(min(runs)) and max(edges) == pytest.approx(max(runs))
    # Every run collapsed: no statistic, no band (one of NaN only would break the log-scaled MSE axis when drawn).
    collapsed = [{**result, "collapse": {**result["collapse"], "collapsed": True}} for result in results]
    algorithmic.write_reports(tmp_path, collapsed, experiment)
    mse = figures["mse.png"]
    mse.canvas.draw()
    assert not mse.axes[0].collections and math.isnan(mse.axes[0].lines[0].get_ydata()[0])
    plt = hf_attn.experiments.reports.pyplot()
    plt.close("all")


def test_tracked_epochs_record_the_test_mse_along_training(tmp_path):
    """`tracked_epochs` records the MSE at every scale after those epochs; after the last one it is the MSE of the
    final model, which the evaluation computes its own way (Trainer.predict and the `ood_regression` metric)."""
    tiny_run(tmp_path, "--tracked_epochs", "1", "2", "--models", "positional")
    results = json.loads((tmp_path / "cumulative_min" / "positional" / "seed-0" / "results.json").read_text())
    assert set(results["by_epoch"]) == {"1", "2"} and set(results["by_epoch"]["1"]) == {"1", "3"}
    for scale in ("1", "3"):
        assert results["by_epoch"]["2"][scale] == pytest.approx(results["by_scale"][scale]["mse"], rel=1e-5)
        assert results["by_epoch"]["1"][scale] != results["by_epoch"]["2"][scale]  # the model trained in between
    report = (tmp_path / "cumulative_min" / "by_epoch.md").read_text()
    assert "test MSE at c = 3 along training" in report and "| 2 |" in report
    assert (tmp_path / "cumulative_min" / "mse_by_epoch.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_gap_by_epoch_is_the_ratio_of_the_models_medians(tmp_path):
    tiny_run(tmp_path, "--tracked_epochs", "1", "2")
    task = tmp_path / "cumulative_min"
    runs = {m: json.loads((task / m / "seed-0" / "results.json").read_text()) for m in ("positional", "standard")}
    ratio = runs["standard"]["by_epoch"]["2"]["3"] / runs["positional"]["by_epoch"]["2"]["3"]
    assert f"epoch 2: {ratio:.1f}x" in (task / "by_epoch.md").read_text()
