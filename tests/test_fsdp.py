"""FSDP2 with configs/accelerate/fsdp2.yaml on 2 CPU processes (gloo), through Trainer: each hf_attn type and a
hybridized Llama train as they do in one process on the same global batch, their checkpoints are sharded, a run
resumed from one equals the uninterrupted run, and the shards merge into an ordinary model folder.

One `accelerate launch` (tests/sharded_training.py) trains all four models; the single-process references are
trained here by the same function.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.commands.launch import launch_command_parser
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin, merge_fsdp_weights
from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
from conftest import tiny_config
from sharded_training import CHECKPOINT_STEP, MODELS, STEPS, train
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.fsdp import StateDictType
from transformers import AutoModelForCausalLM

from hf_attn.layers_hf_attn import BLOCKS

ROOT = Path(__file__).parents[1]
FSDP2 = ROOT / "configs/accelerate/fsdp2.yaml"
# Sharded against single-process, fp32, measured here: losses within 1.4e-7 relative, weights within 2.1e-7 (Adam's
# epsilon raised, see sharded_training.arguments); ten times that is allowed.
LOSS_RTOL, WEIGHT_ATOL = 1.5e-6, 2e-6
pytestmark = pytest.mark.xdist_group("fsdp")  # one worker: the module's one launch serves every test


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Path:
    """One launch of 2 processes trains every model (about 20 s on 2 cores)."""
    out = tmp_path_factory.mktemp("fsdp2")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(FSDP2), "--num_processes", "2",
               "--main_process_port", "0", "tests/sharded_training.py", str(out)]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-5000:]
    return out


def weights(folder: Path) -> dict[str, torch.Tensor]:
    """The weights of a saved model folder, loaded as users load it."""
    return AutoModelForCausalLM.from_pretrained(folder).state_dict()


def differences(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between two state dicts of the same keys."""
    assert expected.keys() == actual.keys()
    return max((expected[k] - actual[k]).abs().max().item() for k in expected)


@pytest.mark.parametrize("name", MODELS)
def test_two_sharded_processes_train_as_one_process_does(launched, name, tmp_path):
    seen = json.loads((launched / name / "seen.json").read_text())["run"]
    # Two processes in one group, the model sharded by FSDP2: every parameter a DTensor, each process holding half
    # (dim 0 split in two, rounded up), one unit per block.
    assert seen["world_size"] == 2 and seen["distributed_type"] == str(DistributedType.FSDP) and seen["fsdp2"]
    assert seen["all_sharded"] and seen["parameters"] / 2 <= seen["held_here"] < 0.55 * seen["parameters"]
    blocks = [unit for unit in seen["units"] if unit.split(".")[-1].isdigit()]
    layers = "model.layers" if name == "hybrid_llama" else "transformer.h"
    assert blocks == [f"{layers}.0", f"{layers}.1"]
    # accelerate 1.16 picks DDP for an FSDP launch on CPU (sharded_training.shard_on_cpu turns it back): when a
    # release picks FSDP itself, drop the workaround and its note in fsdp2.yaml and docs/experiments.md.
    assert seen["accelerate_chose"] == str(DistributedType.MULTI_CPU)

    reference, reference_seen = train(name, tmp_path, processes=1)
    losses = {int(step): loss for step, loss in seen["losses"].items()}
    assert list(losses) == list(range(1, STEPS + 1))
    assert losses == pytest.approx(reference_seen["losses"], rel=LOSS_RTOL)
    assert differences(reference.model.state_dict(), weights(launched / name / "model")) < WEIGHT_ATOL
    # Saved as its own class: FSDP2's class of the same name plus "FSDP", from torch, is neither copied nor named.
    auto_map = json.loads((launched / name / "model" / "config.json").read_text()).get("auto_map", {})
    assert not list((launched / name / "model").glob("_fsdp*.py")) and "FSDP" not in str(auto_map)


@pytest.mark.parametrize("name", MODELS)
def test_checkpoints_are_sharded_and_a_resumed_run_equals_the_uninterrupted_one(launched, name, tmp_path):
    run = launched / name / "run"
    checkpoint = run / f"checkpoint-{CHECKPOINT_STEP}"
    assert not list(checkpoint.glob("*.safetensors")) and not list(checkpoint.glob("*.bin"))  # nothing gathered
    for part in ("pytorch_model_fsdp_0", "optimizer_0"):  # torch.distributed.checkpoint: one file per process
        assert sorted(p.name for p in (checkpoint / part).iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    # Each process wrote its own piece of every tensor: each tensor's pieces lie in both files.
    metadata = FileSystemReader(str(checkpoint / "pytorch_model_fsdp_0")).read_metadata()
    files = {key: set() for key in metadata.state_dict_metadata}
    for index, stored in metadata.storage_data.items():
        files[index.fqn].add(stored.relative_path)
    assert all(where == {"__0_0.distcp", "__1_0.distcp"} for where in files.values()), files

    seen = json.loads((launched / name / "seen.json").read_text())
    resumed = {int(step): loss for step, loss in seen["resumed"]["losses"].items()}
    uninterrupted = {int(step): loss for step, loss in seen["run"]["losses"].items()}
    assert resumed == uninterrupted  # steps 1-2 read back from the checkpoint's trainer state, 3-4 trained again
    final = weights(launched / name / "model")
    assert differences(final, weights(launched / name / "resumed_model")) == 0

    # `accelerate merge-weights` gathers the last checkpoint's shards into one model.safetensors; beside the run's
    # config.json it is an ordinary model folder holding the final weights.
    merge_fsdp_weights(str(run / f"checkpoint-{STEPS}" / "pytorch_model_fsdp_0"), str(tmp_path / "merged"))
    shutil.copy(launched / name / "model" / "config.json", tmp_path / "merged")
    assert differences(final, weights(tmp_path / "merged")) == 0


def test_the_fsdp2_config_shards_each_block_of_every_block_style(launched, monkeypatch):
    """The FSDP plugin the launched processes built, read back in one: its units for the block styles not trained
    above, and every key of the config known to `accelerate launch` (which ignores a misspelt one)."""
    config = load_config_from_file(str(FSDP2))
    assert config.distributed_type == DistributedType.FSDP and config.mixed_precision == "no"
    assert set(config.fsdp_config) <= {action.dest for action in launch_command_parser()._actions}
    for name, value in json.loads((launched / "environment.json").read_text()).items():
        monkeypatch.setenv(name, value)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT

    def units(block_style: str) -> list[str]:
        model = AutoModelForCausalLM.from_config(tiny_config("positional_gpt2", block_style=block_style))
        is_unit = fsdp2_prepare_auto_wrap_policy(FullyShardedDataParallelPlugin(), model)
        return [name for name, module in model.named_modules() if is_unit(module)]

    for style in BLOCKS:  # each model names its own block class, so one config serves every block style
        assert units(style) == ["transformer.h.0", "transformer.h.1"], style
    monkeypatch.setenv("FSDP_TRANSFORMER_CLS_TO_WRAP", "PostLNBlock")  # naming a class the model lacks fails loudly
    with pytest.raises(ValueError, match="Could not find the transformer layer class PostLNBlock"):
        units("concat_mlp")


def test_an_fsdp_launch_that_accelerate_runs_unsharded_is_reported(tmp_path, monkeypatch, caplog):
    """On the CPU accelerate runs an FSDP launch unsharded without a word; the experiment scripts say so."""
    from transformers import Trainer, TrainingArguments

    from hf_attn.experiments.run import warn_if_fsdp_fell_back

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    model = AutoModelForCausalLM.from_config(tiny_config("local_gpt2"))
    trainer = Trainer(model, TrainingArguments(tmp_path, use_cpu=True))
    with caplog.at_level("WARNING", logger="hf_attn.experiments.run"):
        warn_if_fsdp_fell_back(trainer)
    assert not trainer.is_fsdp_enabled and "on the CPU every process holds the whole model" in caplog.text
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    caplog.clear()
    warn_if_fsdp_fell_back(trainer)
    assert caplog.text == ""
