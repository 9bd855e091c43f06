"""Rows of a RULER run copied into a published results folder, then its report: whole rows made on that folder's own
data only, so that a table never holds a task a run had not finished, or one answered on other records.

    python -m benchmarks.ruler_publish --from OUT --output-dir docs/results/ruler k256-s4-f0.5-reach kvpress-snapkv-0.5
    python -m training.reports    # then the tables the project's pages quote
    python -m benchmarks.ruler_publish --from OUT --output-dir docs/results/ruler --check ROW ...   # copies nothing

A row is OUT/pred/ROW as `benchmarks.ruler run` or benchmarks/kvpress/run_presses.py leaves it: layout.json and, at
each length it has, every task the published data has at that length (DEST/data/generation.json), each with its
prediction file and the run record that vouches for it (TASK.run.json or TASK.kvpress.json: the prediction file's
sha256 and the data file's), summary.csv and continuation.json, and no task still in progress. Every row is checked
before any is copied; a row replaces the published row of its name whole (progress and partial files left behind).
"""

import argparse
import shutil
import sys
from pathlib import Path

from benchmarks.common import command_line_parser
from benchmarks.records import read_json, sha256
from benchmarks.ruler import write_report
from benchmarks.ruler_files import RUN_RECORDS, run_record

LEFT_BEHIND = ("*.progress.json", "*.partial")


def task_problems(folder: Path, task: str, data_sha256: str) -> list[str]:
    """What keeps FOLDER's TASK from being published: no predictions, no record of them, or other data."""
    predictions = folder / f"{task}.jsonl"
    if (folder / f"{task}.progress.json").exists():
        return [f"{predictions}: still in progress ({task}.progress.json)"]
    if not predictions.is_file():
        return [f"{predictions}: missing"]
    record = run_record(folder, task)
    if record is None:
        return [f"{predictions}: no run record ({' or '.join(f'{task}.{name}' for name in RUN_RECORDS.values())})"]
    if record.get("sha256") != sha256(predictions.read_text(encoding="utf-8")):
        return [f"{predictions}: not the file its run record vouches for (sha256)"]
    if record.get("settings", {}).get("data_sha256") != data_sha256:
        return [f"{predictions}: answered on other data than the published (data_sha256)"]
    return []


def row_problems(source: Path, generation: dict) -> list[str]:
    """What keeps the row at SOURCE from being published whole (empty: nothing)."""
    if not (source / "layout.json").is_file():
        return [f"{source}: no layout.json (not a row, or one its runner has not finished)"]
    lengths = sorted((folder for folder in source.iterdir() if folder.is_dir() and folder.name.isdigit()),
                     key=lambda folder: int(folder.name))  # fmt: skip
    if not lengths:
        return [f"{source}: no length folder"]
    problems = []
    for folder in lengths:
        tasks = {key.split("/", 1)[1]: entry["sha256"] for key, entry in generation.items()
                 if key.split("/", 1)[0] == folder.name}  # fmt: skip
        if not tasks:
            problems.append(f"{folder}: the published data has no tasks at {folder.name} tokens")
        for task, data_sha256 in tasks.items():
            problems += task_problems(folder, task, data_sha256)
        problems += [f"{folder / name}: missing" for name in ("summary.csv", "continuation.json")
                     if not (folder / name).is_file()]  # fmt: skip
    return problems


def replace_row(source: Path, target: Path) -> None:
    """TARGET made a copy of SOURCE: staged outside pred/ (which the report reads whole), then swapped in, so that a
    failed copy leaves the old row."""
    staging = target.parent.parent / ".publishing"
    staged, old = staging / target.name, staging / f"{target.name}.old"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staged, ignore=shutil.ignore_patterns(*LEFT_BEHIND))
    if target.exists():
        target.rename(old)
    staged.rename(target)
    shutil.rmtree(staging)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = command_line_parser("benchmarks.ruler_publish", __doc__)
    parser.add_argument("rows", nargs="+", metavar="ROW", help="layouts or presses: folder names under OUT/pred")
    parser.add_argument("--from", dest="source", type=Path, required=True, metavar="OUT",
                        help="the run's output folder (benchmarks.ruler's or run_presses' --output-dir)")  # fmt: skip
    parser.add_argument("--output-dir", type=Path, required=True, help="the published results folder: its "
                        "data/generation.json says which data the rows must have answered")  # fmt: skip
    parser.add_argument("--check", action="store_true", help="say whether the rows could be published, copy nothing")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    generation = read_json(args.output_dir / "data" / "generation.json")
    if generation is None:
        raise SystemExit(f"--output-dir: {args.output_dir / 'data' / 'generation.json'} is missing or unreadable")
    problems = [problem for row in args.rows for problem in row_problems(args.source / "pred" / row, generation)]
    if problems:
        raise SystemExit("nothing published:\n" + "\n".join(f"- {problem}" for problem in problems))
    if args.check:
        print(f"ready to publish into {args.output_dir}: {', '.join(args.rows)}")
        return
    for row in args.rows:
        replace_row(args.source / "pred" / row, args.output_dir / "pred" / row)
        print(f"{args.output_dir / 'pred' / row}: published from {args.source / 'pred' / row}", flush=True)
    print(write_report(args.output_dir, ["report", "--output-dir", str(args.output_dir)]))


if __name__ == "__main__":
    main()
