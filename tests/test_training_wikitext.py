"""training/wikitext.py end to end on a few thousand tokens of the offline WikiText-2 files."""

import json
import math
from pathlib import Path

import pytest
from hub_checks import check_hub_folder
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments, pipeline

import training.wikitext as wikitext
from hf_attn.experiments import parse_config

ROOT = Path(__file__).parents[1]
CONFIG = str(ROOT / "configs/wikitext/cpu.yaml")
SHARED = ROOT.parent / "shared" / "data"
TINY = ["--data_dir", str(SHARED / "wikitext-2-raw"), "--tokenizer", str(SHARED / "gpt2-tokenizer"),
        "--max_train_tokens", "2048", "--max_eval_tokens", "512", "--block_size", "32", "--eval_stride", "16",
        "--n_layer", "1", "--n_embd", "16", "--n_head", "2", "--num_train_epochs", "1"]  # fmt: skip


@pytest.mark.parametrize("config", sorted(ROOT.glob("configs/wikitext/*.yaml")), ids=lambda path: path.name)
def test_every_config_parses(config):
    experiment, model, _ = parse_config(
        (wikitext.ExperimentArguments, wikitext.ModelArguments, TrainingArguments), [str(config)]
    )
    assert all(wikitext.parse_variant(v) for v in experiment.variants)


def test_tiny_run_writes_results_table_bar_plot_and_loss_curves(tmp_path):
    wikitext.FAMILY.main([CONFIG, "--output_dir", str(tmp_path), "--variants", "global", "hybrid-1", *TINY,
                          "--logging_steps", "2"])  # fmt: skip
    for variant in ("global", "hybrid-1"):
        results = json.loads((tmp_path / "learned" / variant / "seed-0" / "results.json").read_text())
        steps, losses = zip(*results["loss_curve"], strict=True)  # 2,048 tokens / 32 = 64 blocks, batch 8: 8 steps
        assert steps == (2, 4, 6, 8) and all(0 < loss < 20 for loss in losses)
        scores = results["by_scale"][variant]
        assert scores["tokens"] == 511 and scores["perplexity"] > 1
        # The context-blind reference: a tiny model trained for 8 steps has not beaten it, and is flagged.
        unigram = results["unigram"]
        assert unigram["test_perplexity"] > 1 and 0 < unigram["train_loss"] < math.log(
            len(AutoTokenizer.from_pretrained(SHARED / "gpt2-tokenizer"))
        )
        assert results["collapse"]["input_blind_error"] == unigram["test_perplexity"]
        assert results["collapse"]["collapsed"] == (scores["perplexity"] >= 0.95 * unigram["test_perplexity"])
        left = results["left_unigram_plateau_at"]
        assert left is None or left in steps
        assert "REDUCED PROTOCOL" in results["protocol"]
        assert AutoModelForCausalLM.from_pretrained(
            tmp_path / "learned" / variant / "seed-0" / "model"
        ).config.use_cache
        card = check_hub_folder(tmp_path / "learned" / variant / "seed-0" / "model", {"perplexity"}, tokenizer=True)
        assert card.data.datasets == ["Salesforce/wikitext"] and card.data.pipeline_tag == "text-generation"
        assert "REDUCED PROTOCOL" in card.text
    # The saved folder is all a `pipeline` needs: the model type, weights and tokenizer.
    folder = tmp_path / "learned" / "hybrid-1" / "seed-0" / "model"
    generated = pipeline("text-generation", model=str(folder))("The tower is", max_new_tokens=6, do_sample=False)
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder)
    prompt = tokenizer("The tower is", return_tensors="pt")
    expected = model.generate(**prompt, max_new_tokens=6, do_sample=False)
    assert generated[0]["generated_text"] == tokenizer.decode(expected[0])
    report = (tmp_path / "results.md").read_text()
    assert "REDUCED PROTOCOL" in report and "| variant | learned |" in report
    assert "| global | learned | 0 |" in report and "| hybrid-1 | learned | 0 |" in report  # a row per run
    assert (tmp_path / "perplexity.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_a_llama_architecture_run_trains_the_variants_heads_and_saves_a_hybridized_llama(tmp_path):
    wikitext.FAMILY.main([str(ROOT / "configs/wikitext/cpu_llama.yaml"), "--output_dir", str(tmp_path), "--variants",
                          "hybrid-1", "--seeds", "0", "--n_kv_head", "1", *TINY])  # fmt: skip
    run = tmp_path / "rope" / "hybrid-1" / "seed-0"
    results = json.loads((run / "results.json").read_text())
    assert results["model_type"] == "hf_attn_llama" and results["by_scale"]["hybrid-1"]["perplexity"] > 1
    model = AutoModelForCausalLM.from_pretrained(run / "model")
    assert type(model).__name__ == "HfAttnLlamaForCausalLM" and model.config.use_cache
    assert model.config.head_layout == [["global", "local"]] and model.config.local_window == 1
    assert not model.config.attend_to_self and model.config.num_key_value_heads == 1
    assert model.config.kv_head_layout == [["global"]]  # the one key/value head is read by a global head too
    card = check_hub_folder(run / "model", {"perplexity"}, tokenizer=True)
    assert "| 0 | 1 | 1 | 1 | 0 |" in card.text and "import hf_attn" in card.text


def test_variants_have_the_same_parameter_count(tmp_path):
    model_args = wikitext.ModelArguments(n_layer=2, n_embd=32, n_head=4)
    counts = {v: wikitext.build_model(v, "rope", model_args, 100, 64).num_parameters()
              for v in ("global", "local-1", "hybrid-1", "hybrid-4")}  # fmt: skip
    assert len(set(counts.values())) == 1, counts


@pytest.mark.parametrize(
    "args,message",
    [
        (["--variants", "sparse-2"], "variant 'sparse-2'"),
        (["--data_dir", "/no/such/folder"], "/no/such/folder.*wikitext-2-raw"),
        (["--eval_stride", "32"], "eval_stride"),
        (["--vocab_size", "1000"], "does not match the model's vocabulary"),
        (["--architecture", "llama", "--position_embeddings", "learned"], "position_embeddings must be \\[rope\\]"),
        (["--architecture", "mamba"], "invalid choice"),
    ],
)
def test_bad_input_stops_before_training(tmp_path, args, message):
    with pytest.raises(ValueError, match=message):
        wikitext.FAMILY.main([CONFIG, "--output_dir", str(tmp_path), *TINY, *args])
    assert not (tmp_path / "learned").exists()


def made_up_run(variant: str, positions: str, perplexity: float, left_at: int | None, collapsed: bool = False) -> dict:
    collapse = {"collapsed": collapsed, "metric": "perplexity", "error": perplexity, "input_blind_error": 1969.0}
    return {"model": variant, "positions": positions, "seed": 0, "by_scale": {variant: {"perplexity": perplexity}},
            "left_unigram_plateau_at": left_at, "collapse": collapse}  # fmt: skip


def test_report_ranks_variants_per_encoding_and_leaves_collapsed_runs_out():
    """Written out by hand: the mean over the runs kept, collapsed runs named but not averaged, and per encoding the
    variants from the lowest mean to the highest with the median step at which their runs left the plateau."""
    results = [
        made_up_run("global", "learned", 900.0, 400),
        made_up_run("global", "learned", 1950.0, None, collapsed=True),  # sat on the unigram plateau
        made_up_run("local-1", "learned", 700.0, 300),
        made_up_run("local-1", "learned", 800.0, 100),
        made_up_run("hybrid-1", "rope", 600.0, 150),
        made_up_run("global", "rope", 650.0, 150),
    ]
    experiment = wikitext.ExperimentArguments(variants=["global", "local-1", "hybrid-1"],
                                              position_embeddings=["learned", "rope"])  # fmt: skip
    section = wikitext.perplexity_section(results, experiment)
    assert "| global | 900, 1 of 2 runs | 650, 1 of 1 runs |" in section
    assert "| local-1 | 750 (700-800), 2 of 2 runs | n/a |" in section
    assert "left out: global (learned) seed 0 (perplexity" in section
    only_collapsed = wikitext.perplexity_section(results[1:2], experiment)
    assert "| global | collapsed, 0 of 1 runs |" in only_collapsed
    assert "- learned: every run collapsed" in only_collapsed
    assert "- learned: local-1 750 (left it at step 200) < global 900 (left it at step 400, not every run)" in section
    assert "- rope: hybrid-1 600 (left it at step 150) < global 650 (left it at step 150)" in section
