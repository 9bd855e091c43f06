"""An experiment script's arguments, the HF way: one YAML file and command-line overrides, parsed by
`HfArgumentParser` into the family's dataclasses and `TrainingArguments`; every problem refused before anything is
built, in one message.
"""

import argparse
import dataclasses
import json
import sys
from argparse import ArgumentTypeError
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import yaml
from safetensors import SafetensorError, safe_open
from transformers import HfArgumentParser, TrainingArguments
from transformers.hf_argparser import string_to_bool

from ..hub import hub_offline, hub_problems

# Seeds at and above this draw test sets (their own per task, scale, length, ...): far from every run's training seed
# (`seeds`), and the same for every model and seed, so all are tested on the same samples.
TEST_SEED = 1_000_000
USAGE = "%(prog)s CONFIG.yaml [--field value ...]"
DESCRIPTION = (
    "CONFIG.yaml, the first argument, is a YAML file of `field: value` lines, one for any field below or of "
    "transformers' TrainingArguments (e.g. `learning_rate: 0.001`, `seeds: [0, 1, 2]`); flags after it override its "
    "values (`--seeds 0 1 --learning_rate 1e-3`). Invalid values are refused before anything is trained."
)
TRAINING_HELP = (
    "training: any field of transformers' TrainingArguments, as `--name value` or `name: value` in CONFIG.yaml, "
    "e.g. output_dir (required), learning_rate, num_train_epochs, max_steps, per_device_train_batch_size, "
    "save_strategy, report_to, push_to_hub (`--push_to_hub REPO_ID` pushes each run to its own repository). What "
    "each means and its default: https://huggingface.co/docs/transformers/main_classes/trainer. All of them: {names}."
)


def list_field(default: Sequence, help: str, choices: Sequence | None = None):
    """A dataclass field holding a list (tasks, models, seeds, ...), `default` unless given, each value one of
    `choices` if set."""
    metadata = {"help": help} if choices is None else {"help": help, "choices": choices}
    return field(default_factory=lambda: list(default), metadata=metadata)


@dataclass
class RunArguments:
    """What every family's arguments hold besides its own: which seeds to run and whether to resume."""

    _argument_group_name: ClassVar[str] = "experiment"

    seeds: list[int] = list_field([0], "One run per seed of each model (and task, depth, ...).")
    resume: bool = field(
        default=False, metadata={"help": "Continue interrupted runs from their newest complete checkpoint."}
    )

    # A rerun may change these, each family adding its own: the fields that choose which runs to make
    # (TrainingArguments' `seed` too: each run's comes from `seeds`), and those that only change evaluation (a
    # finished run is then re-evaluated on its kept model). Any other change of a run's settings is refused.
    run_fields: ClassVar[tuple[str, ...]] = ("seeds", "resume", "seed")
    evaluation_fields: ClassVar[tuple[str, ...]] = ()


@dataclass
class ModelArguments:
    """Base of a family's model fields (those its models' configs take), which `--help` lists together."""

    _argument_group_name: ClassVar[str] = "model"


class ConfigParser(HfArgumentParser):
    """HfArgumentParser that reads CONFIG.yaml first, lists the script's own fields by group in `--help` and
    TrainingArguments' by name only, and whose errors raise a one-line `ValueError` (see `cli`) instead of printing
    argparse's usage and exiting."""

    def __init__(self, dataclass_types: tuple):
        with_training = TrainingArguments in dataclass_types
        training = {f.name for f in dataclasses.fields(TrainingArguments)} if with_training else set()
        super().__init__(
            dataclass_types, prog=command_name(), usage=USAGE, description=DESCRIPTION, allow_abbrev=False,
            epilog=TRAINING_HELP.format(names=", ".join(sorted(training))) if training else None,
        )  # fmt: skip
        for action in self._actions:
            if action.dest in training:  # listed in the epilog: their help is a screen each
                action.help = argparse.SUPPRESS
            elif action.option_strings[0] == f"--no_{action.dest}":  # HfArgumentParser gives it the field's help
                action.help, action.default = f"Same as --{action.dest} false.", argparse.SUPPRESS

    def error(self, message: str):
        raise ValueError(message)


def command_name() -> str:
    """How this process was started, for the usage line: `python -m training.algorithmic`, or the script's name."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return f"python -m {spec.name}" if spec is not None else Path(sys.argv[0]).name


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


def parse_config(dataclass_types: tuple, argv: list[str] | None = None, shipped: Sequence[Path] = ()) -> tuple:
    """`script.py CONFIG.yaml [--field value ...]`: every field is checked by argparse, unknown keys are errors.

    The YAML file is parsed on its own first, so that a problem in it names the file; then with the flags. Without
    any argument, the usage and the `shipped` config files to start from are the error.
    """
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        raise ValueError(no_config(shipped))
    parser = ConfigParser(dataclass_types)
    yaml_argv = []
    if argv[0].endswith((".yaml", ".yml")):
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


def no_config(shipped: Sequence[Path]) -> str:
    """What a script run without arguments says: a CONFIG.yaml is expected, and which ones come with it."""
    usage = f"a CONFIG.yaml is expected; usage: {USAGE % {'prog': command_name()}} (--help lists every field)"
    if not shipped:
        return usage
    return usage + ". Shipped configs:\n  - " + "\n  - ".join(map(shown_path, shipped))


def shown_path(path: Path) -> str:
    """`path` relative to the working directory when under it (`configs/algorithmic/cpu.yaml`), else as it is."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# --- problems, found before anything is built ----------------------------------------------------------------------


def training_problems(args: TrainingArguments, output_dir_given: bool) -> list[str]:
    """TrainingArguments values Trainer would accept and then train nothing with, or fail on after the model is
    built; and a missing output_dir (TrainingArguments would write into ./trainer_output)."""
    problems = []
    if not output_dir_given:
        problems.append("output_dir is not set: give it in the config file or as --output_dir")
    if args.max_steps < 1 and args.num_train_epochs <= 0:
        problems.append(f"num_train_epochs must be > 0 (or max_steps >= 1), got {args.num_train_epochs}")
    problems += below("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                      of=args)  # fmt: skip
    if args.learning_rate < 0:
        problems.append(f"learning_rate must be >= 0, got {args.learning_rate}")
    return problems + hub_problems(args.push_to_hub, args.hub_token)


def below(*names: str, of, least: int = 1) -> list[str]:
    """`NAME must be >= least, got VALUE` for each of the fields `names` of `of` below `least`."""
    return below_minimums(of, dict.fromkeys(names, least))


def below_minimums(of, minimums: dict[str, float], prefix: str = "") -> list[str]:
    """`PREFIXNAME must be >= MIN, got VALUE` for each field of `of` below its minimum (`prefix` "--" for command-line
    flags); a field left None, whose default then applies, is not checked."""
    return [f"{prefix}{name} must be >= {minimum}, got {value}" for name, minimum in minimums.items()
            if (value := getattr(of, name)) is not None and value < minimum]  # fmt: skip


def invalid_configuration(problems: list[str]) -> None:
    """Raises every problem of a script's arguments at once, if any."""
    if problems:
        raise ValueError("Invalid configuration:\n  - " + "\n  - ".join(problems))


def config_problems(configs: dict[str, Callable[[], object]]) -> list[str]:
    """What each model's config refuses (sizes, widths, position encodings: the config checks its own fields), each
    message once, with the models it concerns. `configs[model]()` builds the config a run of `model` trains."""
    models_by_problem: dict[str, list[str]] = {}
    for model, build_config in configs.items():
        try:
            build_config()
        except ValueError as error:
            models_by_problem.setdefault(str(error), []).append(model)
    return [f"{problem} (models: {', '.join(models)})" for problem, models in models_by_problem.items()]


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


def safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file cannot be read (truncated, not safetensors), naming the file; None if it can."""
    try:
        with safe_open(str(path), "pt"):
            return None
    except (OSError, SafetensorError) as error:
        return f"{path} cannot be read: {error}"


def cli(main: Callable[[], None]) -> None:
    """Runs a script's `main`; a bad setting or an unreadable file ends it with one line naming it, no traceback."""
    try:
        main()
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


# --- arguments read back from results ------------------------------------------------------------------------------


def recorded_arguments(arguments: type, record: dict):
    """`arguments` as a run recorded them (results.json's `config["experiment"]`); fields it does not know (from an
    older version of the script) are left out."""
    known = {field.name for field in dataclasses.fields(arguments)}
    return arguments(**{name: value for name, value in record.items() if name in known})


def experiment_of(arguments: type, results: list[dict]):
    """The experiment `results` make up together: the first run's arguments, with each field that only selects runs
    (tasks, languages, variants, seeds, ...) the union over every run, in the order of the field's default list.
    Runs made by several commands (e.g. one per subset of languages, in parallel) then report as one experiment."""
    record = dict(results[0]["config"]["experiment"])
    for name in arguments.run_fields:
        if isinstance(record.get(name), list):
            default = getattr(arguments(), name)
            values = dict.fromkeys(value for result in results for value in result["config"]["experiment"][name])
            record[name] = sorted(values, key=lambda v: default.index(v) if v in default else len(default))
    return recorded_arguments(arguments, record)
