"""training/mixed.py end to end on tiny sizes, with a tiny local GPT-2 standing in for the Hub's."""

import json
from pathlib import Path

import pytest
from hub_checks import check_hub_folder
from transformers import AutoModelForCausalLM, TrainingArguments

import training.init_gpt2 as init_gpt2
import training.mixed as mixed
from training.common import parse_config

ROOT = Path(__file__).parents[1]
TOKENIZER = ROOT.parent / "shared" / "data" / "gpt2-tokenizer"
CONFIGS = sorted(ROOT.glob("configs/mixed/*.yaml"))
TINY = ["--train_samples", "64", "--test_samples", "6", "--num_train_epochs", "1",
        "--per_device_train_batch_size", "32", "--baseline_train_samples", "8", "--baseline_batch_size", "4",
        "--baseline_epochs", "1",
        "--baseline_warmup_steps", "0", "--max_new_tokens", "4", "--scales", "1", "3", "--tasks", "min"]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("gpt2")
    init_gpt2.main(["--tokenizer", str(TOKENIZER), "--output", str(folder), "--n_layer", "1", "--n_embd", "16",
                    "--n_head", "2"])  # fmt: skip
    return folder


@pytest.mark.parametrize("config", CONFIGS, ids=lambda path: path.name)
def test_every_config_parses(config):
    experiment, model, training = parse_config(
        (mixed.ExperimentArguments, mixed.ModelArguments, TrainingArguments), [str(config)]
    )
    assert experiment.tasks and experiment.models and training.learning_rate > 0


def test_tiny_run_compares_all_three_models(tmp_path, tiny_gpt2):
    mixed.main([str(ROOT / "configs/mixed/cpu.yaml"), "--output_dir", str(tmp_path), "--baseline_model",
                str(tiny_gpt2), *TINY])  # fmt: skip
    for model in ("positional", "standard", "gpt2"):
        results = json.loads((tmp_path / "min" / model / "seed-0" / "results.json").read_text())
        assert set(results["by_scale"]) == {"1", "3"}
        for metrics in results["by_scale"].values():
            assert 0 <= metrics["unparsed"] <= 1
            if model != "gpt2":  # regression always answers
                assert metrics["unparsed"] == 0 and metrics["mse"] >= 0
    gpt2 = AutoModelForCausalLM.from_pretrained(tmp_path / "min" / "gpt2" / "seed-0" / "model")
    assert gpt2.config.use_cache
    for model in ("positional", "standard", "gpt2"):
        check_hub_folder(tmp_path / "min" / model / "seed-0" / "model", {"mse", "mape", "unparsed"},
                         tokenizer=model == "gpt2")  # fmt: skip
    report = (tmp_path / "min" / "results.md").read_text()
    assert "| c | positional mean | positional median | standard mean | standard median | gpt2 mean |" in report
    assert all((tmp_path / "min" / f"{m}.png").exists() for m in ("mse", "mape", "unparsed"))


def test_missing_baseline_checkpoint_is_reported_before_training(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="baseline_model='no-such-gpt2'.*init_gpt2"):
        mixed.main([str(ROOT / "configs/mixed/cpu.yaml"), "--output_dir", str(tmp_path), "--baseline_model",
                    "no-such-gpt2", *TINY])  # fmt: skip
    assert not (tmp_path / "min").exists()


def test_tokenizer_that_does_not_fit_the_model_is_refused(tmp_path, tiny_gpt2):
    small = tmp_path / "small-vocab"
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2)
    model.resize_token_embeddings(1000)
    model.save_pretrained(small)
    with pytest.raises(ValueError, match="do not belong together"):
        mixed.main([str(ROOT / "configs/mixed/cpu.yaml"), "--output_dir", str(tmp_path / "out"), "--baseline_model",
                    str(small), "--baseline_tokenizer", str(TOKENIZER), "--models", "gpt2", *TINY])  # fmt: skip


def test_unknown_model_name_stops_at_parsing(tmp_path, capsys):
    with pytest.raises(SystemExit):
        mixed.main([str(ROOT / "configs/mixed/cpu.yaml"), "--output_dir", str(tmp_path), "--models", "gpt3"])
    assert "invalid choice" in capsys.readouterr().err
