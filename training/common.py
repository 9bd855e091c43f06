"""Plumbing shared by the experiment scripts: one YAML config plus command-line overrides, parsed the HF way; every
run of an experiment, each pushed to its own Hub repository when asked to."""

import dataclasses
import functools
import json
import sys
from argparse import ArgumentTypeError
from collections.abc import Callable
from pathlib import Path

import yaml
from transformers import AutoConfig, HfArgumentParser, TrainingArguments
from transformers.hf_argparser import string_to_bool

from hf_attn.experiments import Run, is_main_process, wait_for_everyone, write_report
from hf_attn.hub import hub_problems, push_run, run_repo_id


def yaml_to_argv(path: Path) -> list[str]:
    """A YAML mapping as `--key value ...` arguments, so that later command-line flags override it."""
    config = yaml.safe_load(path.read_text()) or {}
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a mapping of field names to values, got {type(config).__name__}.")
    argv = []
    for key, value in config.items():
        if value is None:
            continue
        if isinstance(value, list):
            argv += [f"--{key}", *map(str, value)]
        elif isinstance(value, dict):
            argv += [f"--{key}", json.dumps(value)]
        else:
            argv += [f"--{key}", str(value)]
    return argv


def push_to_hub_as_repo_id(argv: list[str]) -> list[str]:
    """`--push_to_hub REPO_ID` as TrainingArguments' `--push_to_hub true --hub_model_id REPO_ID`."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "--push_to_hub" and not argv[i + 1].startswith("--") and not is_bool_word(argv[i + 1]):
            return [*argv[:i], "--push_to_hub", "true", "--hub_model_id", argv[i + 1], *argv[i + 2 :]]
    return argv


def is_bool_word(value: str) -> bool:
    """Whether HfArgumentParser reads `value` as a bool (true/false, yes/no, ...)."""
    try:
        string_to_bool(value)
    except ArgumentTypeError:
        return False
    return True


def parse_config(dataclass_types: tuple, argv: list[str] | None = None) -> tuple:
    """`script.py CONFIG.yaml [--field value ...]`: every field is checked by argparse, unknown keys are errors."""
    argv = sys.argv[1:] if argv is None else argv
    parser = HfArgumentParser(dataclass_types, allow_abbrev=False)  # a misspelt key must not match a prefix
    if argv and argv[0].endswith((".yaml", ".yml")):
        config_path = Path(argv[0])
        if not config_path.is_file():
            parser.error(f"config file {config_path} does not exist")
        argv = yaml_to_argv(config_path) + argv[1:]
    *parsed, unknown = parser.parse_args_into_dataclasses(
        args=push_to_hub_as_repo_id(argv), look_for_args_file=False, return_remaining_strings=True
    )
    if unknown:
        parser.error(f"unrecognized arguments (no such field): {' '.join(unknown)}; see --help for every field")
    for args in parsed:
        if isinstance(args, TrainingArguments) and (problems := hub_problems(args.push_to_hub, args.hub_token)):
            parser.error("; ".join(problems))
    return tuple(parsed)


def run_all(runs: list[Run], train_and_evaluate: Callable[[Run], dict], training_args: TrainingArguments) -> list[dict]:
    """Trains and evaluates every unfinished run; finished ones are kept as they are. Returns all results.

    Under `torchrun` / `accelerate launch` every process trains and evaluates each run; the main process writes its
    results and, with `--push_to_hub`, uploads its model folder to `HUB_MODEL_ID-<run path>` (finished runs too).
    """
    repo_ids = {run: repo_id(run, training_args) for run in runs} if training_args.push_to_hub else {}  # checked now
    for run in runs:
        if run.finished:
            say(f"{run.folder}: finished earlier, kept as it is")
        else:
            results = train_and_evaluate(run)
            if is_main_process():
                run.write_results(results)
                say(f"{run.folder}: done")
        if run in repo_ids and is_main_process():
            config = AutoConfig.from_pretrained(run.model_folder)
            url = push_run(run.model_folder, run.read_results(), config, repo_ids[run], training_args.hub_token,
                           training_args.hub_private_repo)  # fmt: skip
            say(f"{run.folder}: pushed to {url}")
        wait_for_everyone()  # the others wait while the main process writes and uploads, then all see it finished
    return [run.read_results() for run in runs]


def repo_id(run: Run, training_args: TrainingArguments) -> str:
    """`hub_model_id` (default: the output folder's name, in the token owner's namespace) plus the run's path."""
    base = training_args.hub_model_id or Path(training_args.output_dir).name
    return run_repo_id(base, run.folder.relative_to(training_args.output_dir))


def say(message: str) -> None:
    """Prints from the main process only, so a multi-process run reports each event once."""
    if is_main_process():
        print(message, flush=True)


def runs_for(folder: Path, models: list[str], seeds: list[int]) -> list[Run]:
    """One run per model and seed, in `folder/MODEL/seed-S`."""
    return [Run(folder / model / f"seed-{seed}", model, seed) for model in models for seed in seeds]


def run_config(experiment, model_args, training_args) -> dict:
    """What a run's results.json records of its configuration."""
    return {
        "experiment": dataclasses.asdict(experiment),
        "model": dataclasses.asdict(model_args),
        "training": {name: getattr(training_args, name) for name in TRAINING_FIELDS},
    }


TRAINING_FIELDS = ("learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size", "seed")


def run_tasks(train_and_evaluate, write_reports, experiment, model_args, training_args) -> None:
    """Every (model, seed) run of each of `experiment.tasks` in OUTPUT_DIR/TASK, then that task's reports."""
    output_dir = Path(training_args.output_dir)
    for task in experiment.tasks:
        train = functools.partial(train_and_evaluate, task=task, experiment=experiment, model_args=model_args,
                                  training_args=training_args)  # fmt: skip
        results = run_all(runs_for(output_dir / task, experiment.models, experiment.seeds), train, training_args)
        if is_main_process():
            print(write_reports(output_dir, results, experiment))


def write_task_reports(output_dir: Path, results: list[dict], heading: Callable[[str], str], metrics) -> str:
    """OUTPUT_DIR/TASK/{results.md, plots} from each task's runs, titled `heading(task)`; returns the reports."""
    tasks = dict.fromkeys(result["task"] for result in results)
    return "\n".join(
        write_report(output_dir / task, heading(task), [r for r in results if r["task"] == task], metrics)
        for task in tasks
    )
