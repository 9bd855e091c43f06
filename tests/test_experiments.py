"""What every experiment family shares (hf_attn.experiments): a family declared in one place, degenerate settings
refused before anything is built, one output folder per running script, a finished run that keeps its model and no
checkpoint, one progress bar per run, and a command line that says how to use it."""

import dataclasses
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import test_training_algorithmic
import test_training_formal_languages
import test_training_induction
import test_training_mixed
import test_training_wikitext
import transformers
from hub_checks import check_hub_folder
from tqdm.auto import tqdm
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainingArguments,
)

import training.algorithmic as algorithmic
import training.formal_languages as formal_languages
import training.induction as induction
import training.mixed as mixed
import training.pretrain_gpt2 as pretrain_gpt2
import training.wikitext as wikitext
from hf_attn import experiments, load_metric
from hf_attn.data import algorithmic_dataset
from hf_attn.experiments import perplexity, reports
from hf_attn.experiments.processes import LOCK_FILE, lock_output_dir
from hf_attn.hub import CardFacts

ROOT = Path(__file__).parents[1]
SHARED = ROOT.parent / "shared" / "data"
QUICKSTART = str(ROOT / "configs/algorithmic/min_cpu.yaml")
TINY = ["--train_samples", "200", "--test_samples", "50", "--per_device_train_batch_size", "50",
        "--num_train_epochs", "2", "--scales", "1", "3", "--seeds", "0", "--models", "positional"]  # fmt: skip
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
SCRIPTS = {  # each script's command and CPU config
    "algorithmic": (algorithmic.FAMILY.main, "configs/algorithmic/cpu.yaml"),
    "induction": (induction.FAMILY.main, "configs/induction/cpu.yaml"),
    "mixed": (mixed.FAMILY.main, "configs/mixed/cpu.yaml"),
    "formal_languages": (formal_languages.FAMILY.main, "configs/formal_languages/cpu.yaml"),
    "wikitext": (wikitext.FAMILY.main, "configs/wikitext/cpu.yaml"),
    "pretrain_gpt2": (pretrain_gpt2.main, "configs/mixed/gpt2_pretrain_cpu.yaml"),
}


def tiny_run(output_dir: Path, *extra: str) -> None:
    algorithmic.FAMILY.main([QUICKSTART, "--output_dir", str(output_dir), *TINY, *extra])


# --- degenerate sizes ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize(
    "args,message",
    [
        (["--num_train_epochs", "0", "--max_steps", "-1"], "num_train_epochs must be > 0"),
        (["--num_train_epochs", "-1", "--max_steps", "0"], "num_train_epochs must be > 0"),
        (["--per_device_train_batch_size", "-4"], "per_device_train_batch_size must be >= 1, got -4"),
        (["--n_head", "0"], "n_head`? must be >= 1, got 0"),  # the model config's own check
    ],
)
def test_degenerate_sizes_are_refused_before_anything_is_built(tmp_path, script, args, message):
    main, config = SCRIPTS[script]
    with pytest.raises(ValueError, match=message):
        main([str(ROOT / config), "--output_dir", str(tmp_path / "out"), *args])
    assert not (tmp_path / "out").exists()


def test_an_empty_yaml_or_one_without_output_dir_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where TrainingArguments would write ./trainer_output
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    with pytest.raises(ValueError, match=f"config file {empty} must hold a mapping"):
        algorithmic.FAMILY.main([str(empty)])
    no_output = tmp_path / "no_output.yaml"
    no_output.write_text("tasks: [cumulative_min]\n")
    with pytest.raises(ValueError, match="output_dir is not set"):
        algorithmic.FAMILY.main([str(no_output)])
    assert not any(path.name != "empty.yaml" and path.name != "no_output.yaml" for path in tmp_path.iterdir())


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_script_run_without_arguments_asks_for_a_config_and_lists_the_shipped_ones(script, monkeypatch):
    main, config = SCRIPTS[script]
    monkeypatch.chdir(ROOT)  # the configs are then shown as `configs/FAMILY/NAME.yaml`
    with pytest.raises(ValueError) as error:
        main([])
    folder = (ROOT / config).parent
    # pretrain_gpt2's one config lies among the mixed family's
    shipped = [config] if script == "pretrain_gpt2" else sorted(str(p.relative_to(ROOT)) for p in folder.glob("*.yaml"))
    first, *items = str(error.value).splitlines()
    assert first.startswith("a CONFIG.yaml is expected; usage: ") and "CONFIG.yaml [--field value ...]" in first
    assert items == [f"  - {path}" for path in shipped]


def test_the_command_line_without_arguments_names_the_configs_without_a_traceback():
    command = [sys.executable, "-m", "training.wikitext"]
    done = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: a CONFIG.yaml is expected; usage: python -m training.wikitext CONFIG.yaml")
    assert "  - configs/wikitext/cpu.yaml\n" in done.stderr and "output_dir" not in done.stderr


# --- WikiText files ----------------------------------------------------------------------------------------------


WIKITEXT = [str(ROOT / "configs/wikitext/cpu.yaml"), "--tokenizer", str(SHARED / "gpt2-tokenizer"),
            "--block_size", "32", "--eval_stride", "16", "--n_layer", "1", "--n_embd", "16", "--n_head", "2",
            "--num_train_epochs", "1", "--max_eval_tokens", "512"]  # fmt: skip


def wikitext_folder(folder: Path, test_text: bytes) -> Path:
    folder.mkdir()
    (folder / "wiki.valid.raw").write_text(" = Tower = \n The tower is tall and old . \n" * 100)
    (folder / "wiki.test.raw").write_bytes(test_text)
    return folder


@pytest.mark.parametrize(
    "args,message",
    [
        (["--max_eval_tokens", "0"], r"max_eval_tokens must be >= block_size=32 \(one evaluation window\), got 0"),
        (["--max_train_tokens", "-5"], r"max_train_tokens must be >= block_size=32 \(one training block\), got -5"),
        (["--tokenizer", "/no/such/tokenizer"], "tokenizer='/no/such/tokenizer' is not a folder"),
    ],
)
def test_wikitext_settings_that_cannot_give_a_perplexity_are_refused(tmp_path, args, message):
    folder = wikitext_folder(tmp_path / "data", b" = Test = \n" * 200)
    with pytest.raises(ValueError, match=message):
        wikitext.FAMILY.main([*WIKITEXT, "--data_dir", str(folder), "--output_dir", str(tmp_path / "out"), *args])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "test_text,message",
    [
        (b"", "wiki.test.raw has 0 tokens, fewer than block_size=32"),
        (b"Hello world", "wiki.test.raw has 2 tokens, fewer than block_size=32"),
        (b" = Test = \n" * 2000 + b"caf\xe9\n", r"wiki.test.raw is not UTF-8 text \(byte 22003 is b'\\xe9'\)"),
    ],
)
def test_an_unusable_test_file_is_refused_before_training_naming_it(tmp_path, test_text, message):
    folder = wikitext_folder(tmp_path / "data", test_text)
    with pytest.raises(ValueError, match=message):
        wikitext.FAMILY.main([*WIKITEXT, "--data_dir", str(folder), "--output_dir", str(tmp_path / "out")])
    assert not list((tmp_path / "out").glob("**/checkpoint-*"))


def test_perplexity_needs_two_tokens():
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=10))
    with pytest.raises(ValueError, match="at least 2 tokens"):
        perplexity(model, [3], context_length=4, stride=2)


# --- baseline checkpoints ----------------------------------------------------------------------------------------


def test_a_missing_or_truncated_baseline_checkpoint_is_named_before_training(tmp_path):
    argv = [str(ROOT / "configs/mixed/cpu.yaml"), "--output_dir", str(tmp_path / "out"), "--models", "gpt2",
            "--baseline_tokenizer", str(SHARED / "gpt2-tokenizer")]  # fmt: skip
    with pytest.raises(ValueError, match="baseline_model='/no/such/gpt2' is not a folder"):
        mixed.FAMILY.main([*argv, "--baseline_model", "/no/such/gpt2"])
    folder = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=10)).save_pretrained(folder)
    weights = folder / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    with pytest.raises(ValueError, match=f"baseline_model: {weights} cannot be read"):
        mixed.FAMILY.main([*argv, "--baseline_model", str(folder)])
    assert not (tmp_path / "out").exists()


# --- one run per output folder -----------------------------------------------------------------------------------


def test_a_second_run_into_the_same_output_dir_is_refused_naming_the_first(tmp_path):
    command = [sys.executable, "-m", "training.algorithmic", QUICKSTART, "--output_dir", str(tmp_path), *TINY]
    first = subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / LOCK_FILE).exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(ValueError, match=f"{tmp_path} is in use by process {first.pid} on {socket.gethostname()}"):
            tiny_run(tmp_path)
    finally:
        _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr[-3000:]  # the first run was not disturbed
    assert not (tmp_path / LOCK_FILE).exists() and not list(tmp_path.rglob("*.partial"))  # released at its exit


def test_a_lock_left_by_a_dead_process_is_taken_over_and_one_on_another_host_is_not(tmp_path, capsys):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock = tmp_path / LOCK_FILE
    lock.write_text(json.dumps({"pid": int(gone.stdout), "host": socket.gethostname()}))
    lock_output_dir(tmp_path)
    assert f"taking over the lock of process {int(gone.stdout)}" in capsys.readouterr().out
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    lock_output_dir(tmp_path)  # this process holds it already: main may run twice in one process
    lock.write_text(json.dumps({"pid": os.getpid(), "host": "elsewhere", "since": "today", "command": ["x"]}))
    with pytest.raises(ValueError, match=f"in use by process {os.getpid()} on elsewhere since today.*delete {lock}"):
        lock_output_dir(tmp_path)


# --- messages ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,message",
    [
        (["--scales", "0"], "error: Invalid configuration:"),
        (["--tasks", "cumulative_mode"], "error: argument --tasks: invalid choice: 'cumulative_mode'"),
    ],
)
def test_the_command_line_prints_the_problem_without_usage_or_traceback(tmp_path, args, message):
    command = [sys.executable, "-m", "training.algorithmic", QUICKSTART, "--output_dir", str(tmp_path), *args]
    done = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.startswith(message), done.stderr
    assert "Traceback" not in done.stderr and "usage:" not in done.stderr and len(done.stderr.splitlines()) <= 3


def test_a_bad_value_in_the_yaml_file_names_the_file(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("output_dir: out\nblock_style: parallel\n")
    with pytest.raises(ValueError, match=f"config file {config}: argument --block_style.*invalid choice"):
        algorithmic.FAMILY.main([str(config)])
    with pytest.raises(ValueError, match="^argument --block_style.*invalid choice"):  # from the command line
        algorithmic.FAMILY.main([QUICKSTART, "--block_style", "parallel"])


def test_help_shows_how_to_pass_the_config_and_the_scripts_own_fields_first():
    command = [sys.executable, "-m", "training.algorithmic", "--help"]
    done = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "usage: python -m training.algorithmic CONFIG.yaml [--field value ...]"
    assert "CONFIG.yaml, the first argument, is a YAML file" in done.stdout and len(lines) < 200
    options = [line.split()[0] for line in lines if line.startswith("  --")]
    assert lines.index("options:") < lines.index("experiment:") < lines.index("model:")  # options: only -h
    assert options[:2] == ["--seeds", "--resume"] and "--tasks" in options and "--n_embd" in options
    training = done.stdout.split("\ntraining: ")[1]  # TrainingArguments' fields last, by name only
    assert "--learning_rate" not in options and "learning_rate" in training and "model:" not in training
    scratchpad = lines[lines.index(next(line for line in lines if line.startswith("  --no_scratchpad"))) + 1]
    assert "Same as --scratchpad false." in scratchpad


# --- a family, declared once ---------------------------------------------------------------------------------------


@dataclass
class ToyArguments(experiments.RunArguments):
    samples: int = field(default=64, metadata={"help": "Training samples."})


@dataclass
class ToyModelArguments(experiments.ModelArguments):
    n_embd: int = field(default=8, metadata={"help": "Width."})


def toy_config(model: ToyModelArguments):
    return AutoConfig.for_model("positional_gpt2", n_layer=1, n_head=2, n_embd=model.n_embd, n_positions=4,
                                vocab_size=1, numeric_inputs=True, num_labels=1, problem_type="regression")  # fmt: skip


def toy_train(run, experiment, model_args, training_args, task):
    model = AutoModelForTokenClassification.from_config(toy_config(model_args))
    data = experiments.InMemoryDataset(algorithmic_dataset(task, experiment.samples, length=3, seed=run.seed))
    trainer = Trainer(model=model, args=experiments.run_arguments(training_args, run), train_dataset=data)
    totals = run.train(trainer, experiment.resume)
    labels = data.columns["labels"].numpy()
    predictions = trainer.predict(data).predictions[..., 0]
    metrics = load_metric("ood_regression").compute(
        predictions=predictions.ravel(), references=labels.ravel(), tolerance=0.1
    )
    return experiments.Trained(trainer, totals, {"1": metrics})


TOY = experiments.Family(
    name="toy",
    arguments=ToyArguments,
    model_arguments=ToyModelArguments,
    plan=lambda experiment: [experiments.Group("min", ["tiny"], {"task": "cumulative_min"})],
    problems=lambda experiment, model, training: experiments.config_problems({"tiny": lambda: toy_config(model)}),
    train=toy_train,
    card=lambda experiment, results: CardFacts(
        paper="A",
        title=f"toy {results['task']}",
        training=f"{experiment.samples} samples",
        inputs="numbers",
        task_type="token-classification",
        dataset_name="toy",
        key_name="c",
        metrics=("mse",),
    ),  # fmt: skip
    write_reports=lambda output_dir, results, experiment: experiments.write_report(
        output_dir, "toy: MSE", results, [("mse", "MSE", True)]
    ),
)


def test_a_new_family_needs_only_its_declaration(tmp_path, capsys):
    """Arguments, runs, card and reports of a family no library code names: what adding a family takes."""
    toy_yaml = tmp_path / "toy.yaml"
    toy_yaml.write_text(f"output_dir: {tmp_path / 'out'}\nsamples: 32\nnum_train_epochs: 1\nuse_cpu: true\n")
    TOY.main([str(toy_yaml), "--seeds", "0", "1"])
    for seed in (0, 1):
        run = tmp_path / "out" / "min" / "tiny" / f"seed-{seed}"
        results = json.loads((run / "results.json").read_text())
        assert (
            results["experiment"] == "toy" and results["task"] == "cumulative_min" and "mse" in results["by_scale"]["1"]
        )
        card = check_hub_folder(run / "model", {"mse"}, tokenizer=False)
        assert "toy cumulative_min" in card.data.model_name and "32 samples" in card.text
    assert "# toy: MSE (2 runs)" in (tmp_path / "out" / "results.md").read_text()
    assert f"Reports:\n  {tmp_path / 'out' / 'results.md'} (plots: mse.png)" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"`n_embd` must be >= 1, got 0. \(models: tiny\)"):  # the config's check
        TOY.main([str(toy_yaml), "--n_embd", "0"])


def test_a_family_without_card_facts_is_refused_when_declared():
    declaration = {name: getattr(TOY, name) for name in ("name", "arguments", "model_arguments", "plan", "problems",
                                                          "train", "write_reports")}  # fmt: skip
    with pytest.raises(TypeError, match="card"):
        experiments.Family(**declaration)  # before any run, not when the first one has trained
    with pytest.raises(TypeError, match="`card` must be a function"):
        experiments.Family(**declaration, card=None)
    with pytest.raises(TypeError, match="must subclass RunArguments"):
        experiments.Family(**{**declaration, "arguments": TrainingArguments}, card=TOY.card)


def test_families_are_registered_by_name_once():
    assert experiments.family_named("algorithmic") is algorithmic.FAMILY
    with pytest.raises(ValueError, match="two experiment families are named 'algorithmic'"):
        experiments.register(dataclasses.replace(TOY, name="algorithmic"))
    with pytest.raises(ValueError, match="no experiment family 'nonesuch' is registered"):
        experiments.family_named("nonesuch")


# --- what a run leaves and shows ------------------------------------------------------------------------------------


def test_a_run_shows_one_progress_bar_and_keeps_its_model_not_its_checkpoints(tmp_path, monkeypatch, capsys):
    bars = []

    def counted_bar(*args, **kwargs):
        bars.append(kwargs)
        return tqdm(*args, **kwargs)

    monkeypatch.setattr(transformers.trainer_callback, "tqdm", counted_bar)
    tiny_run(tmp_path, "--models", "positional", "standard", "--disable_tqdm", "false", "--save_strategy", "epoch")
    assert len(bars) == 2  # Trainer's training bar, once a run: none per prediction, none per file saved
    assert "Writing model shards" not in capsys.readouterr().err
    assert transformers.utils.logging.is_progress_bar_enabled()  # transformers' bars are back on afterwards
    for model in ("positional", "standard"):
        run = tmp_path / "cumulative_min" / model / "seed-0"
        assert (run / "results.json").is_file() and (run / "model" / "model.safetensors").is_file()
        assert not list(run.glob("checkpoint-*"))  # they served resume only


def test_model_changes_name_what_the_saved_model_computes_differently(tmp_path):
    """Saved with one config, compared with models built now: config fields that change what is computed are
    named with both values; kernel choices and caching are not, and a folder without config.json has nothing."""
    shape = dict(n_layer=1, n_embd=16, n_head=2, vocab_size=11, n_positions=16, local_window=1)

    def model(**now) -> transformers.PreTrainedModel:
        return AutoModelForCausalLM.from_config(AutoConfig.for_model("hybrid_gpt2", **shape | now))

    model().save_pretrained(tmp_path / "saved")
    saved = tmp_path / "saved"
    assert experiments.runs.model_changes(saved, model()) == []
    kernels = model(local_attention_impl="compiled", positional_attention_impl="fused", use_cache=False)
    assert experiments.runs.model_changes(saved, kernels) == []
    assert experiments.runs.model_changes(saved, model(layer_norm_epsilon=1e-3, local_window=2)) == [
        ("layer_norm_epsilon", 1e-5, 1e-3),
        ("local_window", 1, 2),
    ]
    assert experiments.runs.model_changes(tmp_path, model(local_window=2)) == []  # no config.json there


def test_a_run_shows_its_bar_and_ends_with_one_line_instead_of_every_log(tmp_path, capsys):
    """Trainer's logs (a loss dict each `logging_steps`) are not written under the bar; one line ends the run."""
    tiny_run(tmp_path / "bar", "--disable_tqdm", "false", "--logging_steps", "1")
    printed = capsys.readouterr()
    run = tmp_path / "bar" / "cumulative_min" / "positional" / "seed-0"
    curve = json.loads((run / "results.json").read_text())["loss_curve"]
    assert [step for step, _ in curve] == [4, 8]  # logged once an epoch, as the plateau schedule reads it
    assert "'loss'" not in printed.out + printed.err and "'train_runtime'" not in printed.out + printed.err
    assert "8/8 [" in printed.err  # the bar, to its end
    done = re.findall(rf"{run}: done, final training loss (\S+) at step 8, mean \S+ over the run, \d+ s of training\n",
                      printed.out)  # fmt: skip
    assert done == [f"{curve[-1][1]:.4g}"]
    tiny_run(tmp_path / "no_bar", "--disable_tqdm", "true")
    printed = capsys.readouterr()
    assert "8/8 [" not in printed.err and "seed-0: done, final training loss" in printed.out


# --- runs shorter than logging_steps -------------------------------------------------------------------------------


FEW_STEPS = ("--max_steps", "2", "--logging_steps", "5")  # Trainer logs no loss before step 5
SHORT = (*FEW_STEPS, "--seeds", "0")


def short_mixed_run(output_dir: Path) -> None:
    """A tiny GPT-2 pretrained (training/pretrain_gpt2.py), then a mixed run of each kind of Trainer (the plateau one
    and GPT-2's fine-tuning) with it as baseline, each in fewer steps than `logging_steps`."""
    text = output_dir / "text"
    text.mkdir(parents=True, exist_ok=True)
    lines = (SHARED / "wikitext-2-raw" / "wiki.valid.raw").read_text().splitlines(keepends=True)[:200]
    (text / "wiki.valid.raw").write_text("".join(lines))
    test_training_mixed.tiny_pretraining(output_dir / "gpt2", text, *FEW_STEPS)  # one run, no seeds
    mixed.FAMILY.main([str(ROOT / "configs/mixed/cpu.yaml"), "--output_dir", str(output_dir / "mixed"),
                       "--baseline_model", str(output_dir / "gpt2" / "model"), *test_training_mixed.TINY,
                       "--models", "positional", "gpt2", "--scales", "1", *SHORT])  # fmt: skip


SHORT_RUNS = {  # each family's tiny run, in 2 steps of fewer than logging_steps
    "algorithmic": lambda out: test_training_algorithmic.tiny_run(out, "--models", "positional", *SHORT),
    "induction": lambda out: test_training_induction.tiny_run(out, "--models", "positional", "--depths", "1",
                                                               *SHORT),  # fmt: skip
    "formal_languages": lambda out: test_training_formal_languages.tiny_run(out, "--variants", "global", *SHORT),
    "wikitext": lambda out: wikitext.FAMILY.main([test_training_wikitext.CONFIG, "--output_dir", str(out),
                                                  "--variants", "global", *test_training_wikitext.TINY, *SHORT]),
    "mixed and pretrain_gpt2": short_mixed_run,
}  # fmt: skip


@pytest.mark.parametrize("family", SHORT_RUNS)
def test_a_run_shorter_than_logging_steps_finishes_reports_and_reruns(tmp_path, family, capsys):
    """Trainer logs no loss before `logging_steps`: the final step is logged all the same, so the loss curve and the
    reports have a point, and the finished runs are kept by a rerun, which reports them again."""
    SHORT_RUNS[family](tmp_path)
    records = sorted(tmp_path.glob("**/results.json"))
    assert len(records) == (3 if family.startswith("mixed") else 1)  # mixed: GPT-2 pretrained, then two models
    before = {record: record.read_text() for record in records}
    for record in records:
        (step, loss), *others = json.loads(before[record])["loss_curve"]
        assert step == 2 and 0 < loss < 20 and not others
    reports = sorted(tmp_path.glob("**/results.md"))
    assert reports and "Reports:" in capsys.readouterr().out
    SHORT_RUNS[family](tmp_path)
    printed = capsys.readouterr().out
    assert "kept as it is" in printed and "Reports:" in printed
    assert {record: record.read_text() for record in records} == before


def test_a_report_that_fails_leaves_the_results_and_a_rerun_that_is_not_stuck(tmp_path, monkeypatch, caplog):
    """A report is made from the finished runs' results.json: its failure is logged, the results kept, and a rerun
    (which keeps the finished runs) writes the report once the cause is gone."""

    def failing(*args):
        raise IndexError("list index out of range")

    with monkeypatch.context() as patch:
        patch.setattr(algorithmic, "write_task_reports", failing)
        tiny_run(tmp_path)
    results = tmp_path / "cumulative_min" / "positional" / "seed-0" / "results.json"
    kept = results.read_text()
    assert "the reports could not be written" in caplog.text and "IndexError" in caplog.text
    assert not (tmp_path / "cumulative_min" / "results.md").exists()
    tiny_run(tmp_path)
    assert results.read_text() == kept and (tmp_path / "cumulative_min" / "results.md").is_file()


def test_without_matplotlib_the_tables_are_written_and_the_plots_skipped_saying_so_once(tmp_path, monkeypatch, caplog):
    """Every kind of plot (lines, bars, loss curves, heatmaps), from the committed results of three families."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    reports.plots_skipped.cache_clear()  # once a process: this test's is the first
    for name in ("quickstart", "wikitext_cpu", "formal_languages_table_cpu"):
        shutil.copytree(ROOT / "docs" / "results" / name, tmp_path / name,
                        ignore=shutil.ignore_patterns("*.png", "results.md"))  # fmt: skip
        results = experiments.runs.load_results(tmp_path / name)
        family = experiments.family_named(results[0]["experiment"])
        experiment = experiments.arguments.experiment_of(family.arguments, results)
        with caplog.at_level(logging.WARNING):
            family.write_reports(tmp_path / name, results, experiment)
    assert not list(tmp_path.glob("**/*.png")) and len(list(tmp_path.glob("**/results.md"))) > 3
    warnings = [record.getMessage() for record in caplog.records if record.name == reports.__name__]
    assert len(warnings) == 1 and "pip install matplotlib" in warnings[0]
    reports.plots_skipped.cache_clear()
