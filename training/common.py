"""Plumbing shared by the experiment scripts: one YAML config plus command-line overrides, parsed the HF way; every
run of an experiment, each pushed to its own Hub repository when asked to."""

import atexit
import dataclasses
import functools
import json
import os
import socket
import sys
import time
from argparse import ArgumentTypeError
from collections.abc import Callable
from pathlib import Path

import yaml
from transformers import AutoConfig, HfArgumentParser, TrainingArguments
from transformers.hf_argparser import string_to_bool

from hf_attn.experiments import Run, is_main_process, safetensors_problem, wait_for_everyone, write_report
from hf_attn.hub import hub_offline, hub_problems, push_run, run_repo_id

USAGE = "%(prog)s CONFIG.yaml [--field value ...]"
DESCRIPTION = (
    "CONFIG.yaml, the first argument, is a YAML file of `field: value` lines (any field below); flags after it "
    "override its values. Invalid values are refused before anything is trained."
)


class ConfigParser(HfArgumentParser):
    """HfArgumentParser whose errors raise a one-line `ValueError` (see `cli`), not argparse's usage dump and exit."""

    def error(self, message: str):
        raise ValueError(message)


def yaml_settings(path: Path) -> dict:
    """The mapping of a YAML config file; an empty or non-mapping file is refused, naming the file."""
    if not path.is_file():
        raise ValueError(f"config file {path} does not exist")
    try:
        config = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ValueError(f"config file {path} is not readable YAML: {error}") from None
    if not isinstance(config, dict) or not config:
        raise ValueError(f"config file {path} must hold a mapping of field names to values, got {config!r}")
    return config


def yaml_to_argv(config: dict) -> list[str]:
    """A YAML mapping as `--key value ...` arguments, so that later command-line flags override it."""
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
    """`script.py CONFIG.yaml [--field value ...]`: every field is checked by argparse, unknown keys are errors.

    The YAML file is parsed on its own first, so that a problem in it names the file; then with the flags.
    """
    argv = sys.argv[1:] if argv is None else argv
    parser = ConfigParser(dataclass_types, allow_abbrev=False, usage=USAGE, description=DESCRIPTION)
    yaml_argv = []
    if argv and argv[0].endswith((".yaml", ".yml")):
        config_path, argv = Path(argv[0]), argv[1:]
        config = yaml_settings(config_path)
        fields = {field.name for dataclass_type in dataclass_types for field in dataclasses.fields(dataclass_type)}
        if unknown := [key for key in config if key not in fields]:
            raise ValueError(
                f"config file {config_path}: unknown key(s) {', '.join(unknown)}; --help lists every field"
            )
        yaml_argv = yaml_to_argv(config)
        try:  # argparse's checks only (choices, types): flags may still override what the file sets
            parser.parse_known_args(push_to_hub_as_repo_id(yaml_argv))
        except ValueError as error:
            raise ValueError(f"config file {config_path}: {error}") from None
    *parsed, unknown = parser.parse_args_into_dataclasses(
        args=push_to_hub_as_repo_id(yaml_argv + argv), look_for_args_file=False, return_remaining_strings=True
    )
    if unknown:
        raise ValueError(f"unrecognized arguments (no such field): {' '.join(unknown)}; --help lists every field")
    output_dir_given = any(arg.split("=")[0] == "--output_dir" for arg in yaml_argv + argv)
    problems = [problem for args in parsed if isinstance(args, TrainingArguments)
                for problem in training_problems(args, output_dir_given)]  # fmt: skip
    if problems:
        raise ValueError("; ".join(problems))
    return tuple(parsed)


def training_problems(args: TrainingArguments, output_dir_given: bool) -> list[str]:
    """TrainingArguments values Trainer would accept and then train nothing with, or fail on after the model is
    built; and a missing output_dir (TrainingArguments would write into ./trainer_output)."""
    problems = []
    if not output_dir_given:
        problems.append("output_dir is not set: give it in the config file or as --output_dir")
    if args.max_steps < 1 and args.num_train_epochs <= 0:
        problems.append(f"num_train_epochs must be > 0 (or max_steps >= 1), got {args.num_train_epochs}")
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
        if getattr(args, name) < 1:
            problems.append(f"{name} must be >= 1, got {getattr(args, name)}")
    if args.learning_rate < 0:
        problems.append(f"learning_rate must be >= 0, got {args.learning_rate}")
    return problems + hub_problems(args.push_to_hub, args.hub_token)


def invalid_configuration(problems: list[str]) -> None:
    """Raises every problem of a script's arguments at once, if any."""
    if problems:
        raise ValueError("Invalid configuration:\n  - " + "\n  - ".join(problems))


def model_size_problems(model_args) -> list[str]:
    """Sizes of a script's ModelArguments that must be >= 1 when set, and heads that must divide the width."""
    problems = []
    for name in MODEL_SIZE_FIELDS:
        value = getattr(model_args, name, None)
        if value is not None and value < 1:
            problems.append(f"{name} must be >= 1, got {value}")
    n_embd, n_head = getattr(model_args, "n_embd", None), getattr(model_args, "n_head", None)
    if n_embd and n_head and n_embd > 0 and n_head > 0 and n_embd % n_head:
        problems.append(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
    return problems


MODEL_SIZE_FIELDS = ("n_layer", "n_embd", "n_head", "n_inner", "n_positions", "content_qk_dim", "positional_qk_dim",
                     "vocab_size")  # fmt: skip


def pretrained_problems(field_name: str, name: str | None, weights: bool = False) -> list[str]:
    """Why `name` (a Hub id or a local folder, for `from_pretrained`) cannot be loaded, naming the field: a path that
    is not a folder, a truncated `model.safetensors` (`weights`), or a Hub id neither cached nor reachable offline.
    Checked before any training, instead of transformers' errors about repo ids after it."""
    if name is None:
        return []
    folder = Path(name)
    if folder.is_dir():
        files = sorted(folder.glob("model*.safetensors")) if weights else []
        return [f"{field_name}: {problem}" for problem in map(safetensors_problem, files) if problem]
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or folder.exists():
        return [f"{field_name}={name!r} is not a folder (a local checkpoint folder or a Hub id is expected)"]
    if hub_offline():
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(name, "config.json" if weights else "tokenizer_config.json"), str):
            return [
                f"{field_name}={name!r} is neither a local folder nor in the Hub cache, and HF_HUB_OFFLINE is set: "
                "pass a local folder, or go online"
            ]
    return []


def cli(main: Callable[[], None]) -> None:
    """Runs a script's `main`; a bad setting or an unreadable file ends it with one line naming it, no traceback."""
    try:
        main()
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


# --- runs ------------------------------------------------------------------------------------------------------


LOCK_FILE = "hf_attn.lock"


def lock_output_dir(output_dir: Path) -> None:
    """Holds OUTPUT_DIR until this process exits: a second run into it refuses at start, naming the holder; a lock
    left by a process that no longer runs (killed) is taken over, saying so. Under `torchrun` only the main process
    locks (the launcher ends the others when it stops)."""
    if not is_main_process():
        return
    output_dir.mkdir(parents=True, exist_ok=True)
    lock, me = output_dir / LOCK_FILE, {"pid": os.getpid(), "host": socket.gethostname()}
    while True:
        mine = lock.with_name(f"{LOCK_FILE}.{me['pid']}")
        mine.write_text(json.dumps({**me, "since": time.strftime("%Y-%m-%d %H:%M:%S"), "command": sys.argv}))
        try:
            os.link(mine, lock)  # atomic: fails if the lock exists, never leaves a half-written lock
            atexit.register(release_lock, lock, me)
            return
        except FileExistsError:
            holder = lock_holder(lock)
        finally:
            mine.unlink()
        if holder is None:
            continue  # released meanwhile
        if held_by(holder, me):
            return  # this process holds it already (main called again)
        if holder.get("host") == me["host"] and not process_runs(holder["pid"]):
            say(f"{lock}: taking over the lock of process {holder['pid']}, which no longer runs")
            lock.unlink(missing_ok=True)
            continue
        raise ValueError(
            f"{output_dir} is in use by process {holder['pid']} on {holder['host']} since {holder.get('since')} "
            f"({' '.join(holder.get('command', []))}). Wait for it to finish; if it is gone, delete {lock}."
        )


def lock_holder(lock: Path) -> dict | None:
    """Who holds `lock` (pid, host, since, command); None once it is released."""
    try:
        return json.loads(lock.read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        raise ValueError(f"{lock} is not a lock this script wrote: delete it if no run uses its folder") from None


def process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only checks the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def release_lock(lock: Path, me: dict) -> None:
    if (holder := lock_holder(lock)) is not None and held_by(holder, me):
        lock.unlink()


def held_by(holder: dict, me: dict) -> bool:
    return all(holder.get(key) == value for key, value in me.items())


def changed_settings(run: Run, arguments) -> list[tuple[str, object, object]]:
    """(field, recorded, now) for each setting that differs from what `run` was trained with. Fields that choose
    which runs to make (`arguments.run_fields`) are not a run's settings; fields recorded only on one side (a record
    from before they were kept) cannot be compared."""
    recorded = run.recorded_settings() or {}
    current = json.loads(json.dumps(run.settings, default=str))
    changes = []
    for section in recorded.keys() & current.keys():
        before, now = recorded[section], current[section]
        for name in before.keys() & now.keys():
            if name not in arguments.run_fields and before[name] != now[name]:
                changes.append((name, before[name], now[name]))
    return sorted(changes)


def training_changes(run: Run, arguments) -> list[tuple[str, object, object]]:
    return [change for change in changed_settings(run, arguments) if change[0] not in arguments.evaluation_fields]


def claim_runs(output_dir: Path, runs: list[Run], arguments) -> None:
    """Before any run trains: holds OUTPUT_DIR, and refuses every run that cannot go ahead at once. A run can be
    resumed or rerun only with the settings it was trained with, except `arguments.evaluation_fields`, which a
    finished run is re-evaluated with on its kept model (`run_all`)."""
    lock_output_dir(output_dir)
    problems = []
    for run in runs:
        if changes := training_changes(run, arguments):
            differences = ", ".join(f"{name} {before!r} -> {now!r}" for name, before, now in changes)
            problems.append(f"{run.folder} was trained with other settings ({differences}): rerun with the "
                            f"recorded values, or delete {run.folder} to start it over")  # fmt: skip
        elif run.finished and changed_settings(run, arguments):
            if problem := safetensors_problem(run.model_folder / "model.safetensors"):
                problems.append(f"{run.folder} cannot be re-evaluated: {problem}")
        elif problem := run.resume_problem(arguments.resume):
            problems.append(problem)
    invalid_configuration(problems)


def run_all(runs: list[Run], train_and_evaluate: Callable[[Run], dict], training_args: TrainingArguments,
            arguments) -> list[dict]:  # fmt: skip
    """Trains and evaluates every unfinished run; finished ones are kept as they are, or re-evaluated on their kept
    model when only `arguments.evaluation_fields` changed. Returns all results. Call `claim_runs` first.

    Under `torchrun` / `accelerate launch` every process trains and evaluates each run; the main process writes its
    results and, with `--push_to_hub`, uploads its model folder to `HUB_MODEL_ID-<run path>` (finished runs too).
    """
    repo_ids = {run: repo_id(run, training_args) for run in runs} if training_args.push_to_hub else {}  # checked now
    for run in runs:
        finished, changes = run.finished, changed_settings(run, arguments)
        if finished and not changes:
            say(f"{run.folder}: finished earlier, kept as it is")
        else:
            if finished:
                say(f"{run.folder}: re-evaluating the kept model ({', '.join(name for name, _, _ in changes)} changed)")
            results = train_and_evaluate(run)
            if is_main_process():
                run.write_results(results, replace=finished)
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


def runs_for(folder: Path, models: list[str], seeds: list[int], settings: dict | None = None) -> list[Run]:
    """One run per model and seed, in `folder/MODEL/seed-S`, each trained with `settings` (see `run_config`)."""
    return [Run(folder / model / f"seed-{seed}", model, seed, settings or {}) for model in models for seed in seeds]


def run_config(experiment, model_args, training_args, **training_changes) -> dict:
    """What a run records of its configuration (results.json's `config`), and what a resume or rerun must match."""
    return {
        "experiment": arguments_record(experiment),
        "model": dataclasses.asdict(model_args),
        "training": {name: training_changes.get(name, getattr(training_args, name)) for name in TRAINING_FIELDS},
    }


def arguments_record(arguments) -> dict:
    """A script's own arguments as recorded, less `resume`: how a command was started, not how the run trained."""
    return {name: value for name, value in dataclasses.asdict(arguments).items() if name != "resume"}


TRAINING_FIELDS = ("learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size",
                   "gradient_accumulation_steps", "lr_scheduler_type", "warmup_steps", "weight_decay", "max_grad_norm",
                   "seed")  # fmt: skip


def run_tasks(train_and_evaluate, write_reports, experiment, model_args, training_args) -> None:
    """Every (model, seed) run of each of `experiment.tasks` in OUTPUT_DIR/TASK, then that task's reports."""
    output_dir = Path(training_args.output_dir)
    settings = run_config(experiment, model_args, training_args)
    runs = {
        task: runs_for(output_dir / task, experiment.models, experiment.seeds, settings) for task in experiment.tasks
    }
    claim_runs(output_dir, [run for task_runs in runs.values() for run in task_runs], experiment)
    for task, task_runs in runs.items():
        train = functools.partial(train_and_evaluate, task=task, experiment=experiment, model_args=model_args,
                                  training_args=training_args)  # fmt: skip
        results = run_all(task_runs, train, training_args, experiment)
        if is_main_process():
            print(write_reports(output_dir, results, experiment))


def write_task_reports(output_dir: Path, results: list[dict], heading: Callable[[str], str], metrics) -> str:
    """OUTPUT_DIR/TASK/{results.md, plots} from each task's runs, titled `heading(task)`; returns the reports."""
    tasks = dict.fromkeys(result["task"] for result in results)
    return "\n".join(
        write_report(output_dir / task, heading(task), [r for r in results if r["task"] == task], metrics)
        for task in tasks
    )


def load_results(folder: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(folder.glob("**/seed-*/results.json"))]


def experiment_of(arguments: type, results: list[dict]):
    """The experiment `results` make up together: the first run's arguments, with each field that only selects runs
    (tasks, languages, variants, seeds, ...) the union over every run, in the order of the field's default list.
    Runs made by several commands (e.g. one per subset of languages, in parallel) then report as one experiment."""
    record = dict(results[0]["config"]["experiment"])
    for name in getattr(arguments, "run_fields", ()):
        if isinstance(record.get(name), list):
            default = getattr(arguments(), name)
            values = dict.fromkeys(value for result in results for value in result["config"]["experiment"][name])
            record[name] = sorted(values, key=lambda v: default.index(v) if v in default else len(default))
    return arguments(**record)
