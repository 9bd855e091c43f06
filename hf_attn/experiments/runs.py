"""A run's lifecycle: its folder, settings, resume, results and model folder, and the push of each to the Hub.

A run is one (model, seed) of one experiment, in `OUTPUT_DIR/.../MODEL/seed-S`. While it trains the folder holds
Trainer's `checkpoint-*` folders (for resume only) and `settings.json`; when it finishes, `results.json` and a
Hub-ready `model/` folder, and its checkpoints are removed. A finished run is never trained again; a rerun with
other settings is refused, except for the fields that only change evaluation, which re-evaluate its kept model.
"""

import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np
from safetensors.torch import load_model
from transformers import (
    AutoConfig,
    PretrainedConfig,
    PreTrainedModel,
    Trainer,
    TrainerCallback,
    TrainerState,
    TrainingArguments,
)
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState, ProgressCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import CONFIG_NAME
from transformers.utils import logging as transformers_logging

from ..hub import CardFacts, push_run, run_repo_id, write_model_card
from ..modeling_hf_attn import HfAttnPreTrainedModel, enable_remote_code
from .arguments import RunArguments, invalid_configuration, safetensors_problem
from .processes import is_main_process, lock_output_dir, say, wait_for_everyone

logger = logging.getLogger(__name__)

RESULTS_FILE = "results.json"
SETTINGS_FILE = "settings.json"
# The TrainingArguments fields a run records among its settings (the rest do not change what it learns).
TRAINING_FIELDS = ("learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size",
                   "gradient_accumulation_steps", "lr_scheduler_type", "warmup_steps", "weight_decay", "max_grad_norm",
                   "seed")  # fmt: skip
CardFactsOf = Callable[[dict], CardFacts]  # a run's results -> what its model card says (`Family.facts`)
# Model config fields that do not change what a model computes: a resume or re-evaluation may change them.
NOT_THE_MODEL = ("local_attention_impl", "positional_attention_impl", "use_cache")


def _json_default(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


# --- one run ---------------------------------------------------------------------------------------------------


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
            self.settings_file.write_text(json.dumps(self.settings, indent=2, default=_json_default))
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
        partial.write_text(json.dumps(results, indent=2, default=_json_default))
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


def loss_curve(state: TrainerState) -> list[list[float]]:
    """[step, logged training loss] of every log, the last at the final step (`LogFinalStep`): Trainer keeps the log
    history in its checkpoints, so a resumed run's curve starts at step 1 too. Shows whether a run was still learning
    or stuck on a plateau."""
    return [[entry["step"], entry["loss"]] for entry in state.log_history if "loss" in entry]


class LogFinalStep(TrainerCallback):
    """Trainer logs the loss at the final step too, not only every `logging_steps`: a run shorter than
    `logging_steps` would otherwise log none, and the steps after the last multiple of it would be left out of the
    curve. The entry is Trainer's own, the mean loss since its previous log, as every other point of the curve."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= state.max_steps:
            control.should_log = True


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


class RunTotals(TrainerCallback, ExportableState):
    """The loss summed over steps and the seconds trained, across resumes: saved in every checkpoint's
    trainer_state.json (Trainer's `stateful_callbacks`) and read back when training resumes from it.

    Trainer's own `training_loss` covers only the steps of one `train()` call (0.0 when resuming from the final
    checkpoint), and the part of the loss not yet logged is kept only in its private `_total_loss_scalar` and
    `_tr_loss`: a workaround until Trainer saves a whole-run loss itself.
    """

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self.started = time.perf_counter()  # made just before `train()`: Trainer's set-up counts too
        self.loss_sum: float | None = 0.0  # over the steps before this train() call; None: unknown (old checkpoint)
        self.seconds: float | None = 0.0
        self.first_step: int | None = None  # set when training begins

    def state(self) -> dict:
        loss_sum, seconds = self.loss_sum, self.seconds
        if self.first_step is not None and loss_sum is not None:  # while training: add this call's part
            loss_sum += self.trainer._total_loss_scalar + self.trainer._tr_loss.item()
            seconds += time.perf_counter() - self.started
        return {"args": {}, "attributes": {"loss_sum": loss_sum, "seconds": seconds}}

    def on_train_begin(self, args, state, control, **kwargs):
        name = type(self).__name__
        saved = state.stateful_callbacks.get(name)
        if saved is None and state.global_step > 0:
            logger.warning("The checkpoint predates whole-run totals: train_loss and train_seconds are not recorded.")
            self.loss_sum = self.seconds = None
        elif saved is not None:
            self.loss_sum, self.seconds = saved["attributes"]["loss_sum"], saved["attributes"]["seconds"]
        state.stateful_callbacks[name] = self.state()  # a checkpoint saved later must find its entry
        self.first_step = state.global_step

    def whole_run(self, output, global_step: int) -> dict[str, float | None]:
        """`train_loss`, the mean per-step loss of all `global_step` steps, and `train_seconds`, once trained."""
        if self.loss_sum is None:
            return {"train_loss": None, "train_seconds": None}
        this_call = output.training_loss * (global_step - self.first_step)  # Trainer divides by this call's steps
        return {
            "train_loss": (self.loss_sum + this_call) / global_step if global_step else math.nan,
            "train_seconds": self.seconds + time.perf_counter() - self.started,
        }


# --- progress bars -------------------------------------------------------------------------------------------------


class TrainingProgress(ProgressCallback):
    """Trainer's progress bar while training, and none for each `predict` call of the evaluation after it. The logs
    (a dict of loss, grad_norm, learning rate and epoch each `logging_steps`) are not written under the bar: it shows
    the progress, and `run_all` ends each run with one line of its loss and time (`training_summary`)."""

    def on_prediction_step(self, args, state, control, **kwargs):
        pass

    def on_log(self, args, state, control, logs=None, **kwargs):
        pass


@contextlib.contextmanager
def library_progress_bars_off():
    """transformers' and datasets' own progress bars off (a bar per file of every checkpoint saved, per dataset
    map): a run shows Trainer's bar only, and none when `disable_tqdm` is set."""
    on = transformers_logging.is_progress_bar_enabled(), datasets.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if on[0]:
            transformers_logging.enable_progress_bar()
        if on[1]:
            datasets.enable_progress_bars()


# --- finishing a run -----------------------------------------------------------------------------------------------


@dataclass
class Trained:
    """What a family's `train` hands back: the Trainer holding the trained model, `Run.train`'s totals, the run's
    measurements per evaluation set (`by_scale`, rows of the tables), the family's other fields to record (e.g.
    `collapse`, from `metrics.collapse_check`), and the tokenizer to save beside the model where it is not Trainer's
    `processing_class` (passing it there would change the data collator)."""

    trainer: Trainer
    totals: dict
    by_scale: dict
    fields: dict = field(default_factory=dict)
    tokenizer: object = None


def run_arguments(training_args: TrainingArguments, run: Run, **changes) -> TrainingArguments:
    """The arguments of one run's Trainer: its folder and seed. Trainer itself never pushes (it would push every run
    to the same repository); `run_all` pushes each finished run to its own."""
    return dataclasses.replace(training_args, output_dir=str(run.folder), seed=run.seed, push_to_hub=False,
                               hub_token=None, **changes)  # fmt: skip


def finish_run(run: Run, trained: Trained, fields: dict, facts: CardFactsOf) -> dict:
    """Saves the Hub-ready model folder (`run.model_folder`) and returns the run's results: what every run records
    (`trained.totals`, the run's settings as `config`), `fields` (the family and what its group records) and
    `trained.fields`.

    The folder holds the weights (safetensors), the config with `use_cache=True`, hf_attn's modeling code with a
    full `auto_map` (so `trust_remote_code=True` loads it anywhere), the tokenizer where one is used, and the model
    card (`README.md`, from `facts`) with the results as `model-index`.
    """
    trainer = trained.trainer
    model = trainer.model
    model.config.use_cache = True  # Trainer turns it off for training; a saved model should decode with a cache
    if isinstance(model, HfAttnPreTrainedModel):
        enable_remote_code(model)
    results = {
        "model": run.model, "seed": run.seed, "model_type": model.config.model_type,
        "parameters": model.num_parameters(), **trained.totals, "processes": trainer.args.world_size,
        "machine": machine_state(), **fields, **trained.fields, "config": run.settings, "by_scale": trained.by_scale,
    }  # fmt: skip
    trainer.save_model(str(run.model_folder))  # every process calls it: under FSDP they gather the weights together
    if trainer.is_world_process_zero():
        if trained.tokenizer is not None:
            trained.tokenizer.save_pretrained(run.model_folder)
        record = json.loads(json.dumps(results, default=_json_default))
        write_model_card(run.model_folder, record, model.config, facts(record))
    return results


def machine_state() -> dict:
    """What a run's timing depends on: the cores and the load averages (1, 5, 15 minutes) when it finished. A load
    well above the run's own threads means other jobs shared the machine."""
    return {"cpus": os.cpu_count(), "load_average": [round(load, 2) for load in os.getloadavg()]}


# --- settings ------------------------------------------------------------------------------------------------------


def runs_for(folder: Path, models: list[str], seeds: list[int], settings: dict | None = None) -> list[Run]:
    """One run per model and seed, in `folder/MODEL/seed-S`, each trained with `settings` (see `run_config`)."""
    return [Run(folder / model / f"seed-{seed}", model, seed, settings or {}) for model in models for seed in seeds]


def run_config(experiment, model_args, training_args: TrainingArguments) -> dict:
    """What a run records of its configuration (results.json's `config`), and what a resume or rerun must match."""
    return {
        "experiment": arguments_record(experiment),
        "model": dataclasses.asdict(model_args),
        "training": {name: getattr(training_args, name) for name in TRAINING_FIELDS},
    }


def arguments_record(arguments) -> dict:
    """A script's own arguments as recorded, less `resume`: how a command was started, not how the run trained."""
    return {name: value for name, value in dataclasses.asdict(arguments).items() if name != "resume"}


def changed_settings(run: Run, arguments: RunArguments) -> list[tuple[str, object, object]]:
    """(field, recorded, now) for each setting that differs from what `run` was trained with. Fields that choose
    which runs to make (`arguments.run_fields`) are not a run's settings; fields recorded only on one side (a record
    from before they were kept) cannot be compared; the saved model's config can (`model_changes`)."""
    recorded = run.recorded_settings() or {}
    current = json.loads(json.dumps(run.settings, default=str))
    changes = []
    for section in recorded.keys() & current.keys():
        before, now = recorded[section], current[section]
        for name in before.keys() & now.keys():
            if name not in arguments.run_fields and before[name] != now[name]:
                changes.append((name, before[name], now[name]))
    return sorted(changes)


def describe(changes: list[tuple[str, object, object]]) -> str:
    """`name before -> now, ...`, as refusals name what changed."""
    return ", ".join(f"{name} {before!r} -> {now!r}" for name, before, now in changes)


def training_changes(run: Run, arguments: RunArguments) -> list[tuple[str, object, object]]:
    return [change for change in changed_settings(run, arguments) if change[0] not in arguments.evaluation_fields]


def claim_runs(output_dir: Path, runs: list[Run], arguments: RunArguments) -> None:
    """Before any run trains: holds OUTPUT_DIR, and refuses every run that cannot go ahead at once. A run can be
    resumed or rerun only with the settings it was trained with, except `arguments.evaluation_fields`, which a
    finished run is re-evaluated with on its kept model (`run_all`)."""
    lock_output_dir(output_dir)
    problems = []
    for run in runs:
        if changes := training_changes(run, arguments):
            problems.append(f"{run.folder} was trained with other settings ({describe(changes)}): rerun with the "
                            f"recorded values, or delete {run.folder} to start it over")  # fmt: skip
        elif run.finished and changed_settings(run, arguments):
            if problem := safetensors_problem(run.model_folder / "model.safetensors"):
                problems.append(f"{run.folder} cannot be re-evaluated: {problem}")
        elif problem := run.resume_problem(arguments.resume):
            problems.append(problem)
    invalid_configuration(problems)


# --- running them all ----------------------------------------------------------------------------------------------


def run_all(runs: list[Run], train_and_evaluate: Callable[[Run], dict], training_args: TrainingArguments,
            arguments: RunArguments, facts: CardFactsOf) -> list[dict]:  # fmt: skip
    """Trains and evaluates every unfinished run; finished ones are kept as they are, or re-evaluated on their kept
    model when only `arguments.evaluation_fields` changed. Returns all results. Call `claim_runs` first.

    Under `torchrun` / `accelerate launch` every process trains and evaluates each run; the main process writes its
    results, removes its checkpoints and, with `--push_to_hub`, uploads its model folder to
    `HUB_MODEL_ID-<run path>` (finished runs too), the card made from `facts`.
    """
    repo_ids = {run: repo_id(run, training_args) for run in runs} if training_args.push_to_hub else {}  # checked now
    for run in runs:
        finished, changes = run.finished, changed_settings(run, arguments)
        if finished and not changes:
            say(f"{run.folder}: finished earlier, kept as it is")
        else:
            if finished:
                say(f"{run.folder}: re-evaluating the kept model ({', '.join(name for name, _, _ in changes)} changed)")
            with library_progress_bars_off():
                results = train_and_evaluate(run)
            if is_main_process():
                run.write_results(results, replace=finished)
                say(f"{run.folder}: done{training_summary(results)}")
        if is_main_process():
            run.remove_checkpoints()  # also those a run killed after its results were written left behind
        if run in repo_ids and is_main_process():
            config = AutoConfig.from_pretrained(run.model_folder)
            results = run.read_results()
            url = push_run(run.model_folder, results, config, facts(results), repo_ids[run], training_args.hub_token,
                           training_args.hub_private_repo)  # fmt: skip
            say(f"{run.folder}: pushed to {url}")
        wait_for_everyone()  # the others wait while the main process writes and uploads, then all see it finished
    return [run.read_results() for run in runs]


def training_summary(results: dict) -> str:
    """What ends a run's `done` line, in place of Trainer's logs: `, final training loss L at step S, mean M over the
    run, T s of training`, less what the run did not record (a checkpoint from before the totals were kept)."""
    parts = []
    if curve := results.get("loss_curve"):
        step, loss = curve[-1]
        parts.append(f"final training loss {loss:.4g} at step {step}")
    if (mean := results.get("train_loss")) is not None:
        parts.append(f"mean {mean:.4g} over the run")
    if (seconds := results.get("train_seconds")) is not None:
        parts.append(f"{seconds:.0f} s of training")
    return "".join(f", {part}" for part in parts)


def repo_id(run: Run, training_args: TrainingArguments) -> str:
    """`hub_model_id` (default: the output folder's name, in the token owner's namespace) plus the run's path."""
    base = training_args.hub_model_id or Path(training_args.output_dir).name
    return run_repo_id(base, run.folder.relative_to(training_args.output_dir))


def load_results(folder: Path) -> list[dict]:
    """Every finished run's results under `folder`."""
    return [json.loads(path.read_text()) for path in sorted(folder.glob(f"**/seed-*/{RESULTS_FILE}"))]
