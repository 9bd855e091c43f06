"""Kill a tiny run with SIGKILL at several points, resume it with `--resume true`, and compare every field its
results.json records with an uninterrupted run's.

The run (algorithmic, positional model, 4 steps an epoch, 2 epochs, a checkpoint each epoch) is killed in a
subprocess whose Trainer is patched to kill itself: during training (step 6, after checkpoint-4), while saving
checkpoint-8 (after its weights and optimizer, before trainer_state.json; or halfway through writing its weights),
and after the model folder is saved but before results.json. The resume runs here.
"""

import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from transformers import Trainer

import training.algorithmic as algorithmic

ROOT = Path(__file__).parents[1]
QUICKSTART = str(ROOT / "configs/algorithmic/min_cpu.yaml")
TINY = ["--train_samples", "200", "--test_samples", "50", "--per_device_train_batch_size", "50",
        "--num_train_epochs", "2", "--scales", "1", "3", "--seeds", "0", "--models", "positional"]  # fmt: skip
RUN = Path("cumulative_min") / "positional" / "seed-0"
NOT_COMPARED = ("train_seconds", "machine")  # wall time and load averages differ between any two runs

KILLED_RUN = """
import os, signal, sys, time
import transformers.modeling_utils
from transformers import Trainer
import hf_attn.experiments
import training.algorithmic as algorithmic

point, timing, argv = sys.argv[1], sys.argv[2], sys.argv[3:]


def kill(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


def patch(owner, name, before):
    original = getattr(owner, name)

    def patched(*args, **kwargs):
        before(*args, **kwargs)
        return original(*args, **kwargs)

    setattr(owner, name, patched)


def time_first_checkpoint(trainer, *args, **kwargs):  # training time before checkpoint-4 starts saving
    if trainer.state.global_step == 4:
        open(timing, "w").write(str(time.perf_counter() - trainer.train_started))


patch(Trainer, "train", lambda trainer, *args, **kwargs: setattr(trainer, "train_started", time.perf_counter()))
patch(Trainer, "_save_checkpoint", time_first_checkpoint)
if point == "training":
    patch(Trainer, "training_step", lambda trainer, *args, **kwargs: trainer.state.global_step == 5 and kill())
elif point == "checkpoint_state":
    patch(Trainer, "_save_rng_state", lambda trainer, *args, **kwargs: trainer.state.global_step == 8 and kill())
elif point == "checkpoint_weights":
    save_file = transformers.modeling_utils.safe_save_file

    def save_half_then_die(tensors, filename, *args, **kwargs):
        save_file(tensors, filename, *args, **kwargs)
        if "checkpoint-8" in str(filename):
            os.truncate(filename, os.path.getsize(filename) // 2)
            kill()

    transformers.modeling_utils.safe_save_file = save_half_then_die
elif point == "results":
    hf_attn.experiments.Run.write_results = kill
algorithmic.FAMILY.main(argv)
"""


def tiny_run(output_dir: Path, *extra: str) -> None:
    algorithmic.FAMILY.main([QUICKSTART, "--output_dir", str(output_dir), *TINY, *extra])


def kill_run(point: str, output_dir: Path) -> float:
    """Runs the tiny run in a subprocess that kills itself at `point`; returns the seconds it trained before its
    first checkpoint started saving (what a resume from that checkpoint must count as already trained)."""
    timing = output_dir.parent / f"{point}.seconds"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    argv = [QUICKSTART, "--output_dir", str(output_dir), *TINY]
    killed = subprocess.run([sys.executable, "-c", KILLED_RUN, point, str(timing), *argv], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (output_dir / RUN / "results.json").exists()
    return float(timing.read_text())


def flatten(record: dict, prefix: str = "") -> dict:
    """{"a.b": value} for every leaf of a nested results record."""
    leaves = {}
    for key, value in record.items():
        if isinstance(value, dict):
            leaves.update(flatten(value, f"{prefix}{key}."))
        else:
            leaves[f"{prefix}{key}"] = value
    return leaves


def assert_same_record(resumed: dict, expected: dict) -> None:
    resumed, expected = flatten(resumed), flatten(expected)
    compared = [key for key in expected if not key.startswith(NOT_COMPARED)]
    assert set(resumed) == set(expected)
    for key in compared:
        if isinstance(expected[key], float):
            assert resumed[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-8), key
        else:
            assert resumed[key] == expected[key], key


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    output_dir = tmp_path_factory.mktemp("uninterrupted")
    tiny_run(output_dir)
    return json.loads((output_dir / RUN / "results.json").read_text())


@pytest.mark.parametrize(
    "point,steps_left",
    [("training", 4), ("checkpoint_state", 4), ("checkpoint_weights", 4), ("results", 0)],
)
def test_a_killed_run_resumes_to_the_uninterrupted_record(tmp_path, monkeypatch, caplog, capsys, uninterrupted,
                                                           point, steps_left):  # fmt: skip
    output_dir = tmp_path / "out"
    trained_before = kill_run(point, output_dir)
    if point == "training":  # other settings than the checkpoints were trained with: refused, the fields named
        with pytest.raises(ValueError, match=r"learning_rate 0\.001 -> 0\.1, num_train_epochs 2\.0 -> 3\.0"):
            tiny_run(output_dir, "--resume", "true", "--num_train_epochs", "3", "--learning_rate", "0.1")

    steps, sessions = [], []
    train, training_step = Trainer.train, Trainer.training_step

    def timed_train(trainer, *args, **kwargs):
        start = time.perf_counter()
        output = train(trainer, *args, **kwargs)
        sessions.append(time.perf_counter() - start)
        return output

    def counted_step(trainer, *args, **kwargs):
        steps.append(trainer.state.global_step)
        return training_step(trainer, *args, **kwargs)

    monkeypatch.setattr(Trainer, "train", timed_train)
    monkeypatch.setattr(Trainer, "training_step", counted_step)
    with caplog.at_level(logging.WARNING, logger="hf_attn.experiments"):
        tiny_run(output_dir, "--resume", "true")
    assert len(steps) == steps_left  # resumed from the newest complete checkpoint, not from the start
    if point.startswith("checkpoint"):
        assert "checkpoint-8: incomplete" in caplog.text and not (output_dir / RUN / "checkpoint-4").exists()
    assert "taking over the lock of process" in capsys.readouterr().out  # the killed run's lock

    resumed = json.loads((output_dir / RUN / "results.json").read_text())
    assert_same_record(resumed, uninterrupted)
    assert math.isfinite(resumed["train_loss"]) and resumed["train_loss"] > 0
    # The whole run's training time: what was trained before the checkpoint, and this session.
    assert resumed["train_seconds"] >= trained_before + sessions[0] > 0
    card = (output_dir / RUN / "model" / "README.md").read_text()
    assert f"train_loss: {resumed['train_loss']}" in card
