"""Tiny models of each hf_attn type and a hybridized Llama trained a few steps with Trainer, for tests/test_fsdp.py.

    accelerate launch --config_file configs/accelerate/fsdp2.yaml --num_processes 2 tests/sharded_training.py OUT

trains every model under FSDP2 on 2 CPU processes (gloo), saving a sharded checkpoint halfway, then trains a fresh
copy resumed from that checkpoint; OUT/<model>/ receives the logged losses, the model folders of both runs and what
the processes saw. The test trains the same models in one process (`train`) as the reference.
"""

import json
import os
import sys
from pathlib import Path

import torch
from accelerate.state import PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin, parse_flag_from_env
from conftest import tiny_config
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Trainer,
    TrainingArguments,
)

from hf_attn import hybridize
from hf_attn.experiments.finishing import save_model_folder

MODELS = ("positional_gpt2", "local_gpt2", "hybrid_gpt2", "hybrid_llama")
VOCAB, LENGTH, SAMPLES = 37, 16, 24  # tiny_config's vocabulary; 24 samples: 3 steps an epoch
GLOBAL_BATCH, STEPS, CHECKPOINT_STEP = 8, 4, 2  # the checkpoint falls inside the first epoch: resuming skips batches
# Every kind of head and a sink, over grouped key/value heads (4 query heads share 2 key/value heads).
LLAMA_LAYOUT = [["global", "global", "local", "local"], ["local", "positional", "global", "local"]]


def build(name: str) -> PreTrainedModel:
    """The same weights on every process and in the reference (seeded); no dropout, so runs can be compared."""
    torch.manual_seed(0)
    if name != "hybrid_llama":
        return AutoModelForCausalLM.from_config(tiny_config(name))
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)  # fmt: skip
    return hybridize(LlamaForCausalLM(config), head_layout=LLAMA_LAYOUT, local_window=2, sink_tokens=1)


def train_set() -> list[dict[str, torch.Tensor]]:
    """Random tokens of one length: no padding, so each process's mean loss weighs every token as the global one."""
    tokens = torch.randint(3, VOCAB, (SAMPLES, LENGTH), generator=torch.Generator().manual_seed(1))
    return [{"input_ids": row, "labels": row} for row in tokens]


def arguments(output_dir: Path, processes: int) -> TrainingArguments:
    """The same global batch of GLOBAL_BATCH samples whatever the number of processes; a checkpoint every
    CHECKPOINT_STEP steps; the loss logged at every step. Adam's epsilon is 1e-4, not 1e-8: a gradient that is float
    noise around zero (summed in another order by two processes) would otherwise be blown up to a step of lr."""
    return TrainingArguments(str(output_dir), use_cpu=True, per_device_train_batch_size=GLOBAL_BATCH // processes,
                             max_steps=STEPS, learning_rate=1e-2, adam_epsilon=1e-4, logging_steps=1,
                             save_steps=CHECKPOINT_STEP, seed=0, report_to="none", disable_tqdm=True)  # fmt: skip


def shard_on_cpu(trainer: Trainer) -> str:
    """Workaround: accelerate 1.16 has FSDP only for accelerators; on CPU it silently turns an FSDP launch into DDP
    (MULTI_CPU over gloo). Gives its state the FSDP plugin the launch configured (read from the FSDP_* variables, as
    on GPUs), before Trainer prepares the model, so that the same Trainer runs FSDP2 over gloo. Returns the
    distributed type accelerate chose, for the test to notice when a release no longer needs this."""
    state = trainer.accelerator.state
    chosen = str(state.distributed_type)
    if state.distributed_type == DistributedType.MULTI_CPU and parse_flag_from_env("ACCELERATE_USE_FSDP"):
        state.fsdp_plugin = FullyShardedDataParallelPlugin()
        state.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP
        trainer.is_fsdp_enabled = True
    return chosen


def train(name: str, output_dir: Path, processes: int, resume_from: Path | None = None) -> tuple[Trainer, dict]:
    """Trains `name` STEPS steps (from `resume_from`, a checkpoint, if given); returns the Trainer and what it saw."""
    trainer = Trainer(model=build(name), args=arguments(output_dir, processes), train_dataset=train_set())
    chosen = shard_on_cpu(trainer)
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    model = trainer.model
    parameters = list(model.parameters())
    seen = {
        "accelerate_chose": chosen,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "world_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
        "fsdp2": trainer.accelerator.is_fsdp2,
        "units": [unit or "(root)" for unit, module in model.named_modules() if isinstance(module, FSDPModule)],
        "all_sharded": all(isinstance(p, DTensor) for p in parameters),
        "parameters": sum(p.numel() for p in parameters),  # a DTensor counts the full tensor
        "held_here": sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in parameters),
        "losses": {entry["step"]: entry["loss"] for entry in trainer.state.log_history if "loss" in entry},
    }  # fmt: skip
    return trainer, seen


def main(out: Path) -> None:
    """Each model in turn in one process group: trained STEPS steps, then resumed from its step-CHECKPOINT_STEP
    checkpoint; both saved as model folders."""
    processes = int(os.environ.get("WORLD_SIZE", 1))
    if int(os.environ.get("RANK", 0)) == 0:  # what `accelerate launch` handed the processes from the config file
        out.mkdir(parents=True, exist_ok=True)
        launched = {k: v for k, v in os.environ.items() if k.startswith("FSDP_") or k.startswith("ACCELERATE_")}
        (out / "environment.json").write_text(json.dumps(launched, indent=1))
    for name in MODELS:
        folder = out / name
        trainer, seen = train(name, folder / "run", processes)
        save_model_folder(trainer, str(folder / "model"))
        checkpoint = folder / "run" / f"checkpoint-{CHECKPOINT_STEP}"
        resumed, seen_resumed = train(name, folder / "resumed", processes, resume_from=checkpoint)
        save_model_folder(resumed, str(folder / "resumed_model"))
        if trainer.is_world_process_zero():
            (folder / "seen.json").write_text(json.dumps({"run": seen, "resumed": seen_resumed}, indent=1))
    # Left to the interpreter's exit, the process group's threads can be torn down unjoined: a process then aborts
    # ("terminate called without an active exception") after its work is done, seen once on a busy machine.
    PartialState().destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    # Every output is written and the group destroyed; on a loaded 2-core machine gloo's threads have still aborted
    # the interpreter's own exit ("terminate called without an active exception", SIGABRT) in C++ destructors.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
