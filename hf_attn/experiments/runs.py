"""An experiment's runs, from their folders to their results, each pushed to the Hub on request.

A run is one (model, seed) of one experiment, in `OUTPUT_DIR/.../MODEL/seed-S`. While it trains the folder holds
Trainer's `checkpoint-*` folders (for resume only) and `settings.json`; when it finishes, `results.json` and a
Hub-ready `model/` folder, and its checkpoints are removed. A finished run is never trained again; a rerun with
other settings is refused, except for the fields that only change evaluation, which re-evaluate its kept model.

Each part of that lifecycle is a module, re-exported here: `run` (`Run`: one run's folder, resume and training),
`callbacks` (what a run adds to Trainer), `settings` (what a run records and a rerun must match) and `finishing`
(its Trainer's arguments, results and model folder). This module runs them all.
"""

import json
from collections.abc import Callable
from pathlib import Path

from transformers import AutoConfig, TrainingArguments

from ..hub import push_run, run_repo_id
from .arguments import RunArguments
from .callbacks import library_progress_bars_off
from .finishing import CardFactsOf, Trained, finish_run, machine_state, run_arguments
from .processes import is_main_process, say, wait_for_everyone
from .run import RESULTS_FILE, Run, model_changes
from .settings import TRAINING_FIELDS, arguments_record, changed_settings, claim_runs, run_config


def runs_for(folder: Path, models: list[str], seeds: list[int], settings: dict | None = None) -> list[Run]:
    """One run per model and seed, in `folder/MODEL/seed-S`, each trained with `settings` (see `run_config`)."""
    return [Run(folder / model / f"seed-{seed}", model, seed, settings or {}) for model in models for seed in seeds]


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


__all__ = [
    "TRAINING_FIELDS",
    "Run",
    "Trained",
    "arguments_record",
    "claim_runs",
    "finish_run",
    "load_results",
    "machine_state",
    "model_changes",
    "run_all",
    "run_arguments",
    "run_config",
    "runs_for",
]
