"""RULER's files as both RULER runners write them (benchmarks.ruler for our layouts, benchmarks/kvpress/run_presses.py
for kvpress's presses) and RULER's own scripts read them: where the data and the predictions live, a prediction
record, the score and summary.csv. Standard library alone: run_presses.py imports it in kvpress's environment, which
has no hf_attn."""

import itertools
import re
from collections.abc import Iterable
from pathlib import Path

from benchmarks.records import read_json, read_jsonl, sha256, write_whole

# the record beside each task's predictions that vouches for them: benchmarks.ruler's, run_presses'
RUN_RECORDS = {"layouts": "run.json", "presses": "kvpress.json"}


def data_path(folder: Path, length: int, task: str) -> Path:
    return folder / "data" / str(length) / task / "validation.jsonl"


def pred_folder(folder: Path, layout: str, length: int) -> Path:
    return folder / "pred" / layout / str(length)


def missing_data(folder: Path, lengths: list[int], tasks: list[str], samples: int | None, hint: str = "") -> list[str]:
    """`--output-dir`'s problems: a data file not generated, or fewer records in one than `--samples` asks for."""
    problems = []
    for length, task in itertools.product(lengths, tasks):
        path = data_path(folder, length, task)
        if not path.is_file():
            command = f"python -m benchmarks.ruler generate --lengths {length} --tasks {task} --output-dir {folder}"
            problems.append(f"--output-dir must hold data/{length}/{task}/validation.jsonl: write it with `{command}`"
                            + hint)  # fmt: skip
        elif samples and len(path.read_text(encoding="utf-8").splitlines()) < samples:
            problems.append(f"--samples must be at most the records of {path}, got {samples}")
    return problems


def prediction(record: dict, pred: str, others: dict, keep_input: bool) -> dict:
    """RULER's prediction record (call_api.py) for a data record and its answer; `others` gains the needles' depths."""
    others = others | ({"depths": record["depths"]} if "depths" in record else {})
    return {"index": record["index"], "pred": pred, "input": record["input"] if keep_input else "",
            "outputs": record["outputs"], "others": others, "truncation": -1, "length": record["length"]}  # fmt: skip


def complete(folder: Path, task: str, settings: dict, run_record: str) -> bool:
    """Whether FOLDER/TASK.jsonl is the one its run record (FOLDER/TASK.RUN_RECORD) says was written with
    `settings`."""
    record, path = read_json(folder / f"{task}.{run_record}"), folder / f"{task}.jsonl"
    return (record is not None and record.get("settings") == settings and path.is_file()
            and sha256(path.read_text(encoding="utf-8")) == record.get("sha256"))  # fmt: skip


def run_record(folder: Path, task: str) -> dict | None:
    """FOLDER/TASK's run record, whichever runner wrote it; None where there is none (or it is unreadable)."""
    return next(filter(None, (read_json(folder / f"{task}.{name}") for name in RUN_RECORDS.values())), None)


def postprocess(pred: str) -> str:
    """RULER's evaluate.py `postprocess_pred`: stripped, control characters made newlines, stripped."""
    return re.sub(r"[\x00-\x1f]", "\n", pred.strip()).strip()


def predictions_and_references(predictions: list[dict]) -> tuple[list[str], list[list[str]]]:
    return [postprocess(p["pred"]) for p in predictions], [p["outputs"] for p in predictions]


def string_match_all(predictions: list[str], references: list[list[str]]) -> float:
    """RULER's metric of every synthetic task, 0-100 to 2 decimals: the share of each record's references found in its
    prediction, ignoring case, averaged over records (hf_attn.ruler.score, which needs hf_attn)."""
    pairs = zip(predictions, references, strict=True)
    found = [sum(ref.lower() in pred.lower() for ref in refs) / len(refs) for pred, refs in pairs]
    return round(100 * sum(found) / len(found), 2)


def task_results(folder: Path, tasks: Iterable[str]) -> dict[str, dict]:
    """Per task of `tasks` (in that order) with a prediction file in FOLDER: score, nulls and samples."""
    results = {}
    for task in tasks:
        if (path := folder / f"{task}.jsonl").is_file():
            preds, references = predictions_and_references(read_jsonl(path))
            results[task] = {"score": string_match_all(preds, references), "samples": len(preds),
                             "nulls": sum(not pred for pred in preds)}  # fmt: skip
    return results


def average(results: dict[str, dict]) -> float:
    return round(sum(result["score"] for result in results.values()) / len(results), 2)


def write_summary(folder: Path, tasks: Iterable[str]) -> None:
    """FOLDER/summary.csv as RULER's evaluate.py writes it (pandas' `to_csv(index=False)` of the rows), the average
    added as a last column."""
    results = task_results(folder, tasks)
    if not results:
        return
    nulls = sum(result["nulls"] for result in results.values())
    rows = [["Tasks", *results, "average"], ["Score", *(result["score"] for result in results.values()),
            average(results)], ["Nulls", *(f"{r['nulls']}/{r['samples']}" for r in results.values()),
            f"{nulls}/{sum(result['samples'] for result in results.values())}"]]  # fmt: skip
    lines = [",".join(map(str, range(len(rows[0])))), *(",".join(map(str, row)) for row in rows)]
    write_whole(folder / "summary.csv", "\n".join(lines) + "\n")
