"""A task's answers kept batch by batch, so that a run stopped inside a task (a machine taken back, a crash, Ctrl-C)
takes up where it stopped instead of answering the task again: one task of RULER's is 20 records, 15-25 minutes of
one CPU core in bfloat16, and a stop loses at most the batch it was in.

Used by `benchmarks.ruler run` (a batch: `--batch-size` records) and `benchmarks/kvpress/run_presses.py` (a batch:
one record, kvpress's pipeline answers one at a time), so it imports the standard library alone (run_presses runs
in kvpress's environment). The answers so far are in FOLDER/TASK.progress.json with the settings they were made
with, rewritten whole after each batch; a resumed run reads them back only for the same settings (the batches are
then the same records), and the task's own files are written only when every batch is answered, after which the
progress file goes. Batches answer independently of each other (each is padded on its own), so a task answered in
two runs writes the same predictions as one answered in one."""

import json
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.records import write_whole


def path_of(folder: Path, task: str) -> Path:
    return folder / f"{task}.progress.json"


def kept(folder: Path, task: str, settings: dict) -> dict | None:
    """The progress kept for TASK with `settings`, or None (none kept, another run's settings, or an unreadable
    file)."""
    try:
        progress = json.loads(path_of(folder, task).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return progress if isinstance(progress, dict) and progress.get("settings") == settings else None


def keep(folder: Path, task: str, progress: dict) -> None:
    """FOLDER/TASK.progress.json by renaming a finished temporary file: a stop while writing leaves the previous
    batch's progress."""
    write_whole(path_of(folder, task), json.dumps(progress) + "\n")


def answer_batches(folder: Path, task: str, settings: dict, batches: list[list[dict]],
                   ask: Callable[[list[dict]], list[dict]],
                   machine_load: Callable[[], dict]) -> tuple[list[dict], dict]:  # fmt: skip
    """Every record's answer (`ask`: a batch of records -> their answers, JSON-serializable), the batches answered
    by an earlier run with the same settings read back; and the run's record: `started` (the first part's start),
    `seconds` (the time of the answers kept, every part's summed), `machine` (load before the first part, after the
    last), and `parts` when more than one run answered them. The progress file is left for the caller to `clear`
    once the task's own files are written."""

    def timed(batch: list[dict], which: list[int]) -> tuple[list[list[dict]], list[float]]:
        start = time.perf_counter()
        answers = ask(batch)
        return [answers], [time.perf_counter() - start]

    return answer_together([(folder, settings)], task, batches, timed, machine_load)[0]


def answer_together(runs: list[tuple[Path, dict]], task: str, batches: list[list[dict]],
                    ask: Callable[[list[dict], list[int]], tuple[list[list[dict]], list[float]]],
                    machine_load: Callable[[], dict]) -> list[tuple[list[dict], dict]]:  # fmt: skip
    """`answer_batches` for RUNS (each a folder and its settings) that answer the same batches together (kvpress's
    presses on one shared prefill): `ask(batch, which)` gives, for each run of WHICH (indices into RUNS, those that
    have not answered the batch yet), its answers and the seconds charged to it. Each run's progress is its own file,
    as `answer_batches` keeps it, so a run resumes whichever way it was stopped."""
    progresses = []
    for folder, settings in runs:
        progress = kept(folder, task, settings)
        if progress is None:
            progress = {"settings": settings, "batches": [], "seconds": 0.0, "started": time.time(),
                        "before": machine_load(), "parts": 0}  # fmt: skip
        if len(progress["batches"]) < len(batches):
            progress["parts"] += 1  # this run answers some
        progresses.append(progress)
    for number, batch in enumerate(batches):
        which = [i for i, progress in enumerate(progresses) if len(progress["batches"]) == number]
        if not which:
            continue
        answers, seconds = ask(batch, which)
        for i, own, spent in zip(which, answers, seconds, strict=True):
            if len(own) != len(batch):
                raise ValueError(f"{task}: {len(own)} answers for a batch of {len(batch)} records")
            progresses[i]["batches"].append(own)
            progresses[i]["seconds"] += spent
            keep(runs[i][0], task, progresses[i])
    results = []
    for progress in progresses:
        run = {"started": progress["started"], "seconds": progress["seconds"],
               "machine": {"before": progress["before"], "after": machine_load()}}  # fmt: skip
        if progress["parts"] > 1:
            run["parts"] = progress["parts"]
        results.append(([answer for batch in progress["batches"] for answer in batch], run))
    return results


def clear(folder: Path, task: str) -> None:
    """Drop TASK's progress file, once the task's own files hold its answers."""
    path_of(folder, task).unlink(missing_ok=True)
