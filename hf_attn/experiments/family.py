"""An experiment family, declared once by its script, and the command that runs it.

A family is one kind of experiment (Paper A's algorithmic tasks, Paper B's formal languages, ...). Its script says
in one `Family` what the family is: its arguments, the groups of runs it makes, how one run trains and is evaluated,
what a run's model card says, and its reports. `Family.main` is then the script's whole command:

    CONFIG.yaml and flags -> every problem refused at once -> the planned runs -> OUTPUT_DIR held, each run's
    settings checked -> each unfinished run trained, evaluated, its model folder and results.json written (and
    pushed) -> reports over every run in OUTPUT_DIR, and where they are
"""

import dataclasses
import functools
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from transformers import TrainingArguments

from ..hub import CardFacts
from .arguments import (
    ModelArguments,
    RunArguments,
    cli,
    experiment_of,
    invalid_configuration,
    parse_config,
    recorded_arguments,
)
from .processes import is_main_process, say
from .reports import report_files
from .runs import Run, Trained, claim_runs, finish_run, load_results, run_all, run_config, runs_for

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Group:
    """Runs that share a folder under OUTPUT_DIR and what they record: one per model of `models` and seed."""

    path: str
    models: list[str]
    fields: dict = field(default_factory=dict)  # recorded in each run's results, passed to `Family.train`
    training: dict = field(default_factory=dict)  # TrainingArguments its runs train with (recorded too)


@dataclass(frozen=True)
class Family:
    """What an experiment family is, in one place.

    - `name`: recorded in every run's results as `experiment`.
    - `arguments`, `model_arguments`: its dataclasses (with `TrainingArguments`, what CONFIG.yaml holds).
    - `plan(experiment)`: the groups of runs to make.
    - `problems(experiment, model_args, training_args)`: every problem with the arguments, found before anything is
      built (`arguments.config_problems` builds each model's config and collects what it refuses).
    - `train(run, experiment, model_args, training_args, **group.fields, **prepared)`: trains and evaluates one run
      (`Run.train` trains it, or loads a finished one to re-evaluate), returning `Trained`.
    - `card(experiment, results)`: what a run's model card says (`hub.CardFacts`), from its arguments and results.
    - `write_reports(output_dir, results, experiment)`: results.md and plots over every run in OUTPUT_DIR; returns
      the reports' text.
    - `prepare(experiment, model_args)`: optional, once before any run trains (e.g. loading a dataset); its keyword
      arguments go to every `train`.
    - `configs`: optional, the folder of its shipped CONFIG.yaml files, listed when the script is run without one.
    """

    name: str
    arguments: type[RunArguments]
    model_arguments: type[ModelArguments]
    plan: Callable[..., list[Group]]
    problems: Callable[..., list[str]]
    train: Callable[..., Trained]
    card: Callable[..., CardFacts]
    write_reports: Callable[..., str]
    prepare: Callable[..., dict] | None = None
    configs: Path | None = None

    def __post_init__(self):
        if not issubclass(self.arguments, RunArguments) or not issubclass(self.model_arguments, ModelArguments):
            raise TypeError(f"family {self.name!r}: `arguments` must subclass RunArguments, `model_arguments` "
                            "ModelArguments (hf_attn.experiments)")  # fmt: skip
        for name in ("plan", "problems", "train", "card", "write_reports"):
            if not callable(getattr(self, name)):
                raise TypeError(f"family {self.name!r}: `{name}` must be a function, got {getattr(self, name)!r}")

    def facts(self, results: dict) -> CardFacts:
        """What the model card of the run with `results` says, from the arguments it recorded."""
        return self.card(recorded_arguments(self.arguments, results["config"]["experiment"]), results)

    def planned_runs(self, experiment: RunArguments, output_dir: Path,
                     settings: Callable[[Group], dict] | None = None) -> list[tuple[Group, list[Run]]]:  # fmt: skip
        """Each group of runs `experiment` makes in `output_dir`, with its runs (trained with `settings(group)`)."""
        return [
            (group, runs_for(output_dir / group.path, group.models, experiment.seeds, settings and settings(group)))
            for group in self.plan(experiment)
        ]

    def main(self, argv: list[str] | None = None) -> None:
        """The script's command (see the module's docstring); a problem raises `ValueError`."""
        run_experiment(self, argv)

    def cli(self) -> None:
        """`main` on the command line: a problem ends it with one line naming it, no traceback."""
        cli(self.main)


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Makes `family` known by its name (for reports and cards rebuilt from results); two families of one name
    from different scripts are refused."""
    earlier = FAMILIES.get(family.name)
    if earlier is not None and inspect.getsourcefile(earlier.train) != inspect.getsourcefile(family.train):
        files = " and ".join(inspect.getsourcefile(f.train) for f in (earlier, family))
        raise ValueError(f"two experiment families are named {family.name!r}, in {files}")
    FAMILIES[family.name] = family
    return family


def family_named(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"no experiment family {name!r} is registered (known: {', '.join(FAMILIES) or 'none'}): "
                         "import its script first")  # fmt: skip
    return FAMILIES[name]


def run_experiment(family: Family, argv: list[str] | None = None) -> None:
    """The command of `family`'s script (see the module's docstring)."""
    types = (family.arguments, family.model_arguments, TrainingArguments)
    shipped = sorted(family.configs.glob("*.yaml")) if family.configs else []
    experiment, model_args, training_args = parse_config(types, argv, shipped)
    invalid_configuration(family.problems(experiment, model_args, training_args))
    output_dir = Path(training_args.output_dir)

    def arguments(group: Group) -> tuple:
        """What a run of `group` trains with: the experiment, model and training arguments."""
        return experiment, model_args, dataclasses.replace(training_args, **group.training)

    plan = family.planned_runs(experiment, output_dir, lambda group: run_config(*arguments(group)))
    claim_runs(output_dir, [run for _, runs in plan for run in runs], experiment)
    prepared = family.prepare(experiment, model_args) if family.prepare else {}
    for group, runs in plan:
        train = functools.partial(train_and_finish, family, group, arguments(group), prepared)
        run_all(runs, train, training_args, experiment, family.facts)
    if is_main_process():
        report(family, output_dir)


def report(family: Family, output_dir: Path) -> None:
    """The family's reports over every run in OUTPUT_DIR, printed, and where they are. Every run is finished by now,
    its results.json kept: a report that fails is logged, not raised, so that the command (and each rerun, which
    keeps finished runs as they are) still ends well; once the cause is fixed, a rerun writes the reports."""
    results = load_results(output_dir)
    try:
        print(family.write_reports(output_dir, results, experiment_of(family.arguments, results)))
    except Exception:
        logger.exception(f"{output_dir}: the reports could not be written. Every run's results.json is kept: once "
                         "the cause is fixed, rerun the same command to write them (finished runs are not trained "
                         "again).")  # fmt: skip
        return
    say("Reports:\n  " + "\n  ".join(report_files(output_dir)))


def train_and_finish(family: Family, group: Group, arguments: tuple, prepared: dict, run: Run) -> dict:
    """One run of `group` trained and evaluated by its family, its model folder saved; returns its results."""
    trained = family.train(run, *arguments, **group.fields, **prepared)
    return finish_run(run, trained, {"experiment": family.name, **group.fields, **group.training}, family.facts)
