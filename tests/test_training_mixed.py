"""training/mixed.py end to end on tiny sizes, with a tiny GPT-2 pretrained by training/pretrain_gpt2.py as baseline."""

import json
from pathlib import Path

import pytest
from hub_checks import check_hub_folder
from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, TrainingArguments

import training.baseline_learning_rate as baseline_learning_rate
import training.mixed as mixed
import training.pretrain_gpt2 as pretrain_gpt2
from hf_attn.data import mixed_dataset
from hf_attn.experiments import parse_config

ROOT = Path(__file__).parents[1]
SHARED = ROOT.parent / "shared" / "data"
TOKENIZER = SHARED / "gpt2-tokenizer"
CONFIGS = sorted(ROOT.glob("configs/mixed/*.yaml"))
TINY = ["--train_samples", "64", "--test_samples", "6", "--num_train_epochs", "1",
        "--per_device_train_batch_size", "32", "--baseline_train_samples", "8", "--baseline_batch_size", "4",
        "--baseline_epochs", "1",
        "--baseline_warmup_steps", "0", "--max_new_tokens", "4", "--scales", "1", "3", "--tasks", "min"]  # fmt: skip
METRICS = {f"{metric}_{names}" for metric in ("mse", "mape", "unparsed") for names in ("seen", "unseen")}


def tiny_pretraining(output_dir: Path, data_dir: Path, *extra: str) -> None:
    pretrain_gpt2.main([str(ROOT / "configs/mixed/gpt2_pretrain_cpu.yaml"), "--output_dir", str(output_dir),
                        "--data_dir", str(data_dir), "--tokenizer", str(TOKENIZER), "--n_layer", "1", "--n_embd",
                        "16", "--n_head", "2", "--block_size", "32", "--max_steps", "3",
                        "--per_device_train_batch_size", "4", *extra])  # fmt: skip


@pytest.fixture(scope="module")
def small_text(tmp_path_factory) -> Path:
    """The first 200 lines of WikiText-2's validation split, as a folder of wiki.*.raw."""
    folder = tmp_path_factory.mktemp("text")
    lines = (SHARED / "wikitext-2-raw" / "wiki.valid.raw").read_text().splitlines(keepends=True)[:200]
    (folder / "wiki.valid.raw").write_text("".join(lines))
    return folder


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory, small_text) -> Path:
    folder = tmp_path_factory.mktemp("gpt2")
    tiny_pretraining(folder, small_text)
    return folder / "model"


def test_pretraining_writes_a_gpt2_with_its_tokenizer_and_held_out_perplexity(tiny_gpt2, small_text, capsys):
    results = json.loads((tiny_gpt2.parent / "results.json").read_text())
    total = results["train_tokens"] + results["held_out_tokens"]
    assert results["files"] == ["wiki.valid.raw"] and results["held_out_tokens"] == pytest.approx(0.05 * total, abs=1)
    vocab = len(AutoTokenizer.from_pretrained(tiny_gpt2))
    assert 1 < results["held_out_perplexity"] < 2 * vocab  # three steps: about uniform over the vocabulary
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2)
    assert type(model).__name__ == "GPT2LMHeadModel" and model.config.vocab_size == vocab and model.config.use_cache
    tiny_pretraining(tiny_gpt2.parent, small_text)
    assert "pretrained earlier, kept as it is" in capsys.readouterr().out


def test_pretraining_refuses_a_folder_without_text(tmp_path):
    with pytest.raises(ValueError, match="data_dir"):
        tiny_pretraining(tmp_path / "out", tmp_path)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda path: path.name)
def test_every_config_parses(config):
    if config.name.startswith("gpt2_pretrain"):
        args, training = parse_config((pretrain_gpt2.PretrainArguments, TrainingArguments), [str(config)])
        pretrain_gpt2.validate(args)
        return
    experiment, model, training = parse_config(
        (mixed.ExperimentArguments, mixed.ModelArguments, TrainingArguments), [str(config)]
    )
    assert experiment.tasks and experiment.models and training.learning_rate > 0
    assert training.max_grad_norm == 0  # Paper A's code does not clip gradients
    assert model.n_inner == 32 and model.content_qk_dim in (None, model.n_embd)  # params_nlp_scale.json, its code


def test_fine_tuning_text_teaches_the_answer_and_the_stop(tiny_gpt2):
    """BOS, prompt, ` Answer: ddd.dd`, end of text: every token labelled but the padding, the final EOS included."""
    experiment = mixed.ExperimentArguments(baseline_model=str(tiny_gpt2))
    model, tokenizer = mixed.baseline(experiment)
    assert model.get_input_embeddings().num_embeddings == len(tokenizer)
    assert len({tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}) == 3
    texts = mixed_dataset(3, "sum", rendering="text", seed=0)
    rows = mixed.causal_lm_set(texts, tokenizer)
    batch = DataCollatorForLanguageModeling(tokenizer, mlm=False)([rows[i] for i in range(3)])
    for row, text, labels, ids in zip(rows, texts["text"], batch["labels"], batch["input_ids"], strict=True):
        assert ids[0] == tokenizer.bos_token_id and row["input_ids"][-1] == tokenizer.eos_token_id
        kept = labels[labels != -100]
        assert kept.tolist() == row["input_ids"]  # the EOS after the answer is a target; padding is not
        assert tokenizer.decode(kept[1:-1]) == text and text.rsplit(" Answer: ", 1)[1].count(".") == 1
        assert (ids[labels == -100] == tokenizer.pad_token_id).all()


def test_tiny_run_compares_all_three_models_on_both_name_sets(tmp_path, tiny_gpt2):
    mixed.FAMILY.main([str(ROOT / "configs/mixed/cpu.yaml"), "--output_dir", str(tmp_path), "--baseline_model",
                       str(tiny_gpt2), *TINY])  # fmt: skip
    for model in ("positional", "standard", "gpt2"):
        results = json.loads((tmp_path / "min" / model / "seed-0" / "results.json").read_text())
        assert set(results["by_scale"]) == {"1", "3"} and results["collapse"]["metric"] == "mse"
        for metrics in results["by_scale"].values():
            assert set(metrics) == METRICS and all(0 <= metrics[f"unparsed_{n}"] <= 1 for n in ("seen", "unseen"))
            if model != "gpt2":  # regression always answers
                assert metrics["unparsed_seen"] == metrics["unparsed_unseen"] == 0 and metrics["mse_unseen"] >= 0
    gpt2 = AutoModelForCausalLM.from_pretrained(tmp_path / "min" / "gpt2" / "seed-0" / "model")
    assert gpt2.config.use_cache
    for model in ("positional", "standard", "gpt2"):
        check_hub_folder(tmp_path / "min" / model / "seed-0" / "model", METRICS, tokenizer=model == "gpt2")
    report = (tmp_path / "min" / "results.md").read_text()
    # Every run in OUTPUT_DIR, in folder order: as `python -m training.reports` rewrites the committed reports.
    assert "| c | gpt2 mean | gpt2 median | positional mean | positional median | standard mean |" in report
    assert "## MSE, category names seen in training" in report and "## MSE, unseen category names" in report
    assert all((tmp_path / "min" / f"{metric}.png").exists() for metric in METRICS)
    # A new scale only adds evaluation: the fine-tuned GPT-2 is re-evaluated from its kept folder.
    before = json.loads((tmp_path / "min" / "gpt2" / "seed-0" / "results.json").read_text())
    mixed.FAMILY.main([str(ROOT / "configs/mixed/cpu.yaml"), "--output_dir", str(tmp_path), "--baseline_model",
                       str(tiny_gpt2), *TINY, "--models", "gpt2", "--scales", "1", "2", "3"])  # fmt: skip
    after = json.loads((tmp_path / "min" / "gpt2" / "seed-0" / "results.json").read_text())
    assert set(after["by_scale"]) == {"1", "2", "3"} and after["train_loss"] == before["train_loss"]
    assert all(after["by_scale"][c] == pytest.approx(before["by_scale"][c], nan_ok=True) for c in ("1", "3"))


def test_test_sets_differ_only_in_names():
    seen = mixed_dataset(5, "min", rendering="text", scale=3, names="seen", seed=7)
    unseen = mixed_dataset(5, "min", rendering="text", scale=3, names="unseen", seed=7)
    assert seen["answer"] == unseen["answer"] and seen["prompt"] != unseen["prompt"]
    strip = str.maketrans("", "", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    assert [p.translate(strip) for p in seen["prompt"]] == [p.translate(strip) for p in unseen["prompt"]]


def test_missing_baseline_checkpoint_is_reported_before_training(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="baseline_model='no-such-gpt2'.*pretrain_gpt2"):
        mixed.FAMILY.main([str(ROOT / "configs/mixed/cpu.yaml"), "--output_dir", str(tmp_path), "--baseline_model",
                           "no-such-gpt2", *TINY])  # fmt: skip
    assert not (tmp_path / "min").exists()


def test_tokenizer_that_does_not_fit_the_model_is_refused(tmp_path, tiny_gpt2):
    small = tmp_path / "small-vocab"
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2)
    model.resize_token_embeddings(1000)
    model.save_pretrained(small)
    with pytest.raises(ValueError, match="do not belong together"):
        mixed.FAMILY.main([str(ROOT / "configs/mixed/cpu.yaml"), "--output_dir", str(tmp_path / "out"),
                           "--baseline_model", str(small), "--baseline_tokenizer", str(TOKENIZER), "--models", "gpt2",
                           *TINY])  # fmt: skip


def test_unknown_model_name_stops_at_parsing(tmp_path):
    with pytest.raises(ValueError, match="invalid choice"):
        mixed.FAMILY.main([str(ROOT / "configs/mixed/cpu.yaml"), "--output_dir", str(tmp_path), "--models", "gpt3"])


def test_baseline_learning_rate_choice_writes_a_row_per_rate(tmp_path, tiny_gpt2, capsys):
    tiny = ["--baseline_model", str(tiny_gpt2), "--learning_rates", "1e-3", "1e-4", "--validation_samples", "4",
            "--baseline_train_samples", "8", "--baseline_batch_size", "4", "--baseline_epochs", "1",
            "--baseline_warmup_steps", "0", "--max_new_tokens", "4"]  # fmt: skip
    baseline_learning_rate.main([str(ROOT / "configs/mixed/cpu.yaml"), "--output_dir", str(tmp_path), *tiny])
    rows = json.loads((tmp_path / "baseline_learning_rate.json").read_text())
    assert [row["learning_rate"] for row in rows] == [1e-3, 1e-4] and all(0 <= r["unparsed"] <= 1 for r in rows)
    assert "| learning rate | readable answers | MSE | MAPE |" in capsys.readouterr().out
