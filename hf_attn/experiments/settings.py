"""A run's settings: what it records of its configuration (results.json's `config`, `settings.json` while it trains),
and which changes refuse a resume or rerun. Only the fields that change evaluation alone (`evaluation_fields`) may
differ: a finished run is then re-evaluated on its kept model.
"""

import dataclasses
import json
from pathlib import Path

from transformers import TrainingArguments

from .arguments import RunArguments, invalid_configuration, safetensors_problem
from .processes import lock_output_dir
from .run import Run, describe

# The TrainingArguments fields a run records among its settings (the rest do not change what it learns).
TRAINING_FIELDS = ("learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size",
                   "gradient_accumulation_steps", "lr_scheduler_type", "warmup_steps", "weight_decay", "max_grad_norm",
                   "seed")  # fmt: skip


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
