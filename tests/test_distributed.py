"""The training scripts under `torchrun` and `accelerate launch` (2 CPU processes, gloo), the DDP config in
configs/accelerate/, and Trainer's `report_to="tensorboard"`. FSDP2: test_fsdp.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.utils import DistributedType
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoModelForTokenClassification, Trainer, TrainingArguments

import training.algorithmic as algorithmic
from hf_attn import load_metric
from hf_attn.data import algorithmic_dataset
from hf_attn.experiments import TEST_SEED, InMemoryDataset

ROOT = Path(__file__).parents[1]
QUICKSTART = "configs/algorithmic/min_cpu.yaml"
DDP = ROOT / "configs/accelerate/ddp.yaml"
# test_training_algorithmic's TINY: 200 samples in batches of 50 per process, 2 epochs. One process takes
# 200 / 50 = 4 steps an epoch; two split each epoch's samples, 2 steps each.
TINY = ["--train_samples", "200", "--test_samples", "50", "--per_device_train_batch_size", "50",
        "--num_train_epochs", "2", "--scales", "1", "3", "--seeds", "0"]  # fmt: skip
EPOCHS, STEPS_PER_EPOCH = 2, {1: 4, 2: 2}  # processes -> optimizer steps per epoch


def launch(*command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", *command], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    return done


def tiny_script(output_dir: Path, *extra: str) -> list[str]:
    return ["-m", "training.algorithmic", QUICKSTART, "--output_dir", str(output_dir), *TINY, *extra]


def loss_scalars(run: Path) -> list[tuple[int, float]]:
    """(step, value) of `train/loss` in the run's one TensorBoard log: RUN/runs/<date>_<host>/events.out.tfevents.*"""
    logs = list(run.glob("runs/*/events.out.tfevents.*"))
    assert len(logs) == 1, logs  # one writer: the main process
    events = EventAccumulator(str(logs[0].parent))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars("train/loss")]


def check_written_once(output: Path, stdout: str, runs: list[Path], processes: int) -> None:
    """Every run finished, trained with `processes` processes, and was written and reported by one of them."""
    for run in runs:
        results = json.loads((run / "results.json").read_text())
        assert results["processes"] == processes and not list(run.glob("checkpoint-*"))  # finished: none kept
        last_step = results["loss_curve"][-1][0]  # logged once an epoch, the last at the final step
        assert last_step == EPOCHS * STEPS_PER_EPOCH[processes]  # each process had its share of the data
        assert stdout.count(f"{run}: done") == 1
        assert (run / "model" / "README.md").is_file()
    assert stdout.count("# cumulative_min: MSE and accuracy") == 1  # the report, printed as it is written
    assert "| c | positional |" in (output / "cumulative_min" / "results.md").read_text()
    assert not list(output.rglob("*.partial"))


def test_torchrun_two_processes_write_results_once(tmp_path):
    done = launch("torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                  *tiny_script(tmp_path, "--report_to", "tensorboard"))  # fmt: skip
    runs = [tmp_path / "cumulative_min" / model / "seed-0" for model in ("positional", "standard")]
    check_written_once(tmp_path, done.stdout, runs, processes=2)
    # Only the main process logs to TensorBoard, once an epoch (the plateau scheduler's logging), at global steps 2, 4.
    assert [step for step, _ in loss_scalars(runs[0])] == [2, 4]

    # The distributed evaluation (each process predicts a share of the test set; Trainer gathers them) scores the
    # saved model as one process does.
    results = json.loads((runs[0] / "results.json").read_text())
    model = AutoModelForTokenClassification.from_pretrained(runs[0] / "model")
    trainer = Trainer(model=model, args=TrainingArguments(str(tmp_path / "eval"), use_cpu=True, report_to="none"))
    ood_regression = load_metric("ood_regression")
    for scale in (1, 3):
        test_set = algorithmic_dataset("cumulative_min", 50, scale=scale, seed=TEST_SEED + scale)
        predictions = trainer.predict(InMemoryDataset(test_set)).predictions[..., 0]
        labels = test_set.with_format("numpy")[:]["labels"]
        metrics = ood_regression.compute(
            predictions=predictions.ravel(), references=labels.ravel(), tolerance=0.05 * scale
        )
        assert metrics["mse"] == pytest.approx(results["by_scale"][str(scale)]["mse"], rel=1e-5)


def test_accelerate_launch_with_the_ddp_config_starts_two_processes(tmp_path):
    done = launch("accelerate.commands.launch", "--config_file", str(DDP), "--num_processes", "2",
                  "--main_process_port", "0", *tiny_script(tmp_path, "--models", "positional"))  # fmt: skip
    check_written_once(tmp_path, done.stdout, [tmp_path / "cumulative_min" / "positional" / "seed-0"], processes=2)


def test_report_to_tensorboard_logs_the_training_loss(tmp_path):
    algorithmic.FAMILY.main([QUICKSTART, "--output_dir", str(tmp_path), *TINY, "--models", "positional",
                             "--report_to", "tensorboard", "--logging_steps", "1"])  # fmt: skip
    run = tmp_path / "cumulative_min" / "positional" / "seed-0"
    logged = loss_scalars(run)
    expected = json.loads((run / "results.json").read_text())["loss_curve"]  # every loss Trainer logged
    assert [step for step, _ in logged] == [4, 8]  # one process: twice the steps of two
    assert logged == [(step, pytest.approx(loss, rel=1e-6)) for step, loss in expected]


def test_the_ddp_config_loads():
    """(configs/accelerate/fsdp2.yaml is run and read back in test_fsdp.py.)"""
    ddp = load_config_from_file(str(DDP))
    assert ddp.distributed_type == DistributedType.MULTI_GPU and ddp.mixed_precision == "no" and ddp.num_machines == 1
