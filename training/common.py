"""Plumbing shared by the experiment scripts: one YAML config plus command-line overrides, parsed the HF way."""

import dataclasses
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path

import yaml
from transformers import HfArgumentParser

from hf_attn.experiments import Run, write_report


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
        args=argv, look_for_args_file=False, return_remaining_strings=True
    )
    if unknown:
        parser.error(f"unrecognized arguments (no such field): {' '.join(unknown)}; see --help for every field")
    return tuple(parsed)


def run_all(runs: list[Run], train_and_evaluate: Callable[[Run], dict]) -> list[dict]:
    """Trains and evaluates every unfinished run; finished ones are kept as they are. Returns all results."""
    for run in runs:
        if run.finished:
            print(f"{run.folder}: finished earlier, kept as it is")
            continue
        run.write_results(train_and_evaluate(run))
        print(f"{run.folder}: done")
    return [run.read_results() for run in runs]


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


def run_experiment(folder: Path, models: list[str], seeds: list[int], train_and_evaluate, heading: str, metrics,
                   **arguments) -> None:  # fmt: skip
    """Every (model, seed) run of one experiment in `folder`, then its report (printed and in results.md)."""
    results = run_all(runs_for(folder, models, seeds), functools.partial(train_and_evaluate, **arguments))
    print(write_report(folder, heading, results, metrics))
