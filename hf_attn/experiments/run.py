"""One run: one (model, seed) of one experiment, in `OUTPUT_DIR/.../MODEL/seed-S`.

While it trains the folder holds Trainer's `checkpoint-*` folders (for resume only) and `settings.json`; when it
finishes, `results.json` and a Hub-ready `model/` folder, and its checkpoints are removed. A saved checkpoint or model
is resumed or loaded only when it is complete and is the model the code builds now.
"""

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from accelerate.utils import parse_flag_from_env
from safetensors.torch import load_model
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel, Trainer
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ProgressCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import CONFIG_NAME

from .arguments import safetensors_problem
from .callbacks import LogFinalStep, RunTotals, TrainingProgress, loss_curve
from .processes import is_main_process

logger = logging.getLogger(__name__)

RESULTS_FILE = "results.json"
SETTINGS_FILE = "settings.json"
# Model config fields that do not change what a model computes: a resume or re-evaluation may change them.
NOT_THE_MODEL = ("local_attention_impl", "positional_attention_impl", "use_cache")


def json_default(value):
    """`json.dumps`' `default` for what a run records: numpy scalars as numbers, paths as strings."""
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def warn_if_fsdp_fell_back(trainer: Trainer) -> None:
    """accelerate (1.16) has FSDP only for accelerators: launched with an FSDP config on CPU, it runs DDP without a
    word, every process holding the whole model. Said here, so a user who asked for sharding knows it is not."""
    if parse_flag_from_env("ACCELERATE_USE_FSDP") and not trainer.is_fsdp_enabled:
        logger.warning(
            "Launched with an FSDP config, but accelerate runs this as %s: it shards only on accelerators, so on "
            "the CPU every process holds the whole model (configs/accelerate/fsdp2.yaml says more).",
            trainer.accelerator.distributed_type,
        )


@dataclass(frozen=True)
class Run:
    """One model trained with one seed, in `folder`: `results.json` when finished, `checkpoint-*` while training.

    `settings` is the configuration it trains with (results.json's `config`); it is kept in `settings.json` from
    the first step, so that a resume can be compared with what the checkpoints were trained with.
    """

    folder: Path
    model: str
    seed: int
    settings: dict = field(default_factory=dict, compare=False)

    @property
    def results_file(self) -> Path:
        return self.folder / RESULTS_FILE

    @property
    def settings_file(self) -> Path:
        return self.folder / SETTINGS_FILE

    @property
    def finished(self) -> bool:
        return self.results_file.exists()

    @property
    def model_folder(self) -> Path:
        return self.folder / "model"

    def checkpoints(self) -> list[Path]:
        """Trainer's `checkpoint-STEP` folders, newest first."""
        steps = {}
        for path in self.folder.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if self.folder.is_dir() else []:
            if (step := path.name.removeprefix(f"{PREFIX_CHECKPOINT_DIR}-")).isdigit():
                steps[int(step)] = path
        return [steps[step] for step in sorted(steps, reverse=True)]

    def remove_checkpoints(self) -> None:
        """Once finished: the checkpoints served resume only, `model/` is what is kept."""
        for checkpoint in self.checkpoints():
            shutil.rmtree(checkpoint)

    def recorded_settings(self) -> dict | None:
        """The settings the run was trained with: its results' once finished, `settings.json` while interrupted
        (None before a first checkpoint, or for a run from before settings were kept)."""
        if self.finished:
            return self.read_results().get("config")
        if self.checkpoints() and self.settings_file.is_file():
            return json.loads(self.settings_file.read_text())
        return None

    def resume_problem(self, resume: bool) -> str | None:
        """Why an unfinished run cannot go ahead: it holds an interrupted run's checkpoints and `resume` is off (it
        never silently restarts over them)."""
        checkpoints = self.checkpoints()
        if checkpoints and not resume and not self.finished:
            return (
                f"{self.folder} holds checkpoints of an interrupted run ({checkpoints[0].name}): pass `--resume true` "
                "to continue it, or delete the folder to start over"
            )
        return None

    def checkpoint_to_resume(self, resume: bool) -> Path | None:
        """The newest complete checkpoint when resuming (see `resume_problem`). Newer incomplete ones (a kill while
        saving) are removed, saying why: Trainer would otherwise count them as the newest and rotate the good ones
        away."""
        if problem := self.resume_problem(resume):
            raise ValueError(problem)
        checkpoints = self.checkpoints()
        for checkpoint in checkpoints:
            problem = checkpoint_problem(checkpoint)
            if problem is None:
                return checkpoint
            logger.warning(f"{checkpoint}: incomplete ({problem}), removed; resuming from an older checkpoint.")
            if is_main_process():
                shutil.rmtree(checkpoint)
        if checkpoints:
            logger.warning(f"{self.folder}: no complete checkpoint left, training from the start.")
        return None

    def train(self, trainer: Trainer, resume: bool) -> dict:
        """Trains, from the newest complete checkpoint when resuming; returns the whole run's `train_loss` (mean
        per-step loss) and `train_seconds`, summed over every session that led to the final model, and its
        `loss_curve` (see `loss_curve`).

        A finished run is not trained again (its results are only re-evaluated): its kept model is loaded and its
        recorded training returned.
        """
        if trainer.pop_callback(ProgressCallback) is not None:  # `disable_tqdm` off: one bar, for training
            trainer.add_callback(TrainingProgress)
        if self.finished:
            self.refuse_another_model(self.model_folder, trainer.model)
            load_model(trainer.model, self.model_folder / "model.safetensors")
            recorded = self.read_results()
            return {name: recorded.get(name) for name in ("train_loss", "train_seconds", "loss_curve")}
        checkpoint = self.checkpoint_to_resume(resume)
        if checkpoint is not None:
            self.refuse_another_model(checkpoint, trainer.model)
        elif is_main_process():
            self.folder.mkdir(parents=True, exist_ok=True)
            self.settings_file.write_text(json.dumps(self.settings, indent=2, default=json_default))
        warn_if_fsdp_fell_back(trainer)
        totals = RunTotals(trainer)
        trainer.add_callback(totals)
        trainer.add_callback(LogFinalStep)
        output = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        return totals.whole_run(output, trainer.state.global_step) | {"loss_curve": loss_curve(trainer.state)}

    def refuse_another_model(self, saved: Path, model: PreTrainedModel) -> None:
        """Its weights are loaded only into the model they were trained as (see `model_changes`)."""
        if changes := model_changes(saved, model):
            raise ValueError(
                f"{saved} holds another model than the one built now ({describe(changes)}), as when a default has "
                f"changed since it was saved: set these to the saved values, or delete {self.folder} to start it over"
            )

    def write_results(self, results: dict, replace: bool = False) -> None:
        """Written atomically, so a crash never leaves a half-written file that counts as finished, and only once:
        a second writer (another process of a multi-process run) fails instead of silently overwriting, unless
        `replace` (a re-evaluation of a finished run)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        partial = self.results_file.with_suffix(".json.partial")
        partial.write_text(json.dumps(results, indent=2, default=json_default))
        if replace:
            os.replace(partial, self.results_file)
            return
        os.link(partial, self.results_file)  # raises FileExistsError if the results exist
        partial.unlink()

    def read_results(self) -> dict:
        return json.loads(self.results_file.read_text())


def model_changes(saved: Path, model: PreTrainedModel) -> list[tuple[str, object, object]]:
    """(field, saved, now) for each model config field on which the model saved in `saved` (a checkpoint or a kept
    model folder) differs from `model`. A run's settings record the arguments it was started with; this compares
    what the code made of them, so that a changed default (as `scale_embedding`'s was) cannot continue or
    re-evaluate a run as another model. Nothing to compare without a config.json (FSDP's sharded checkpoints)."""
    if not (saved / CONFIG_NAME).is_file():
        return []
    before, now = AutoConfig.from_pretrained(saved).to_dict(), model.config.to_dict()
    fields = (before.keys() & now.keys()) - PretrainedConfig().to_dict().keys() - set(NOT_THE_MODEL)
    return sorted((name, before[name], now[name]) for name in fields if before[name] != now[name])


def checkpoint_problem(checkpoint: Path) -> str | None:
    """Why a checkpoint cannot be resumed from, or None. Trainer writes trainer_state.json last, after the weights,
    optimizer and RNG states, so a kill while saving leaves it missing or the weights truncated."""
    state = checkpoint / TRAINER_STATE_NAME
    if not state.is_file():
        return f"no {TRAINER_STATE_NAME}"
    try:
        json.loads(state.read_text())
    except ValueError:
        return f"{TRAINER_STATE_NAME} is not valid JSON"
    weights = sorted(checkpoint.glob("model*.safetensors"))
    if not weights and not list(checkpoint.glob("pytorch_model_fsdp_*")):  # FSDP's sharded state is a folder
        return "no model weights"
    return next(filter(None, map(safetensors_problem, weights)), None)


def describe(changes: list[tuple[str, object, object]]) -> str:
    """`name before -> now, ...`, as refusals name what changed."""
    return ", ".join(f"{name} {before!r} -> {now!r}" for name, before, now in changes)
