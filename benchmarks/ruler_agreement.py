"""How closely two runs of one layout on `benchmarks.ruler`'s records agree: per task, the records whose predictions
are the same string, and each run's RULER score; in all, the difference of the two averages with its paired bootstrap
interval (`benchmarks.paired_bootstrap`), and each run's continuation perplexity where it has one. It checks a run
made on other hardware or in other arithmetic (such as `--float32-products` on a CPU without bfloat16 units) against
a published one before the new run's rows are set beside the published ones; two layouts on the same records compare
the same way.

    python -m benchmarks.ruler_agreement --reference docs/results/ruler/pred/unmodified/4096 \\
        --candidate OUT/pred/unmodified/4096 --output-dir docs/results/ruler/agreement/unmodified-4096

writes agreement.json and agreement.md (a table per task and in all) into --output-dir.
"""

import json
from pathlib import Path

from benchmarks import continuation, float32_products
from benchmarks.common import command_line_parser
from benchmarks.paired_bootstrap import difference_interval
from benchmarks.records import read_json, read_jsonl, write_whole
from benchmarks.ruler_files import postprocess, predictions_and_references, run_record
from hf_attn import ruler


def run_of(folder: Path, task: str) -> str:
    """What a task's run record (benchmarks.ruler's or run_presses.py's) says of how it ran: dtype, device."""
    record = run_record(folder, task) or {}
    settings = record.get("settings")
    return f"{float32_products.dtype_name(settings)} on {record['device']}" if settings else "no run record"


def record_score(record: dict) -> float:
    return ruler.match_fraction(postprocess(record["pred"]), record["outputs"])


def agreement(reference: Path, candidate: Path) -> dict:
    """Per task both folders predicted (RULER's order), over the records of the same index: how many predictions are
    the same string, how many score the same (a long answer may differ after what is scored), and each run's score on
    those records; then the sums and the average scores."""
    tasks, record_scores = {}, {"reference": {}, "candidate": {}}
    for task in ruler.TASKS:
        if not ((reference / f"{task}.jsonl").is_file() and (candidate / f"{task}.jsonl").is_file()):
            continue
        ours = {record["index"]: record for record in read_jsonl(reference / f"{task}.jsonl")}
        theirs = {record["index"]: record for record in read_jsonl(candidate / f"{task}.jsonl")}
        shared = sorted(ours.keys() & theirs.keys())
        record_scores["reference"][task] = [record_score(ours[i]) for i in shared]
        record_scores["candidate"][task] = [record_score(theirs[i]) for i in shared]
        scores = [ruler.score(task, *predictions_and_references([side[index] for index in shared]))
                  for side in (ours, theirs)]  # fmt: skip
        tasks[task] = {"records": len(shared), "same": sum(ours[i]["pred"] == theirs[i]["pred"] for i in shared),
                       "same_score": sum(record_score(ours[i]) == record_score(theirs[i]) for i in shared),
                       "reference_score": scores[0], "candidate_score": scores[1],
                       "reference_run": run_of(reference, task), "candidate_run": run_of(candidate, task)}  # fmt: skip
    if not tasks:
        raise SystemExit(f"no task has predictions in both {reference} and {candidate}")
    averages = [round(sum(t[f"{side}_score"] for t in tasks.values()) / len(tasks), 2)
                for side in ("reference", "candidate")]  # fmt: skip
    interval = difference_interval(record_scores["candidate"], record_scores["reference"])
    perplexity = {side: (read_json(folder / continuation.FILE) or {}).get("perplexity")
                  for side, folder in (("reference", reference), ("candidate", candidate))}  # fmt: skip
    return {"reference": str(reference), "candidate": str(candidate), "tasks": tasks,
            "records": sum(t["records"] for t in tasks.values()), "same": sum(t["same"] for t in tasks.values()),
            "same_score": sum(t["same_score"] for t in tasks.values()),
            "reference_average": averages[0], "candidate_average": averages[1],
            "difference_interval": list(interval), "continuation_perplexity": perplexity}  # fmt: skip


def markdown(result: dict) -> str:
    runs = {side: "; ".join(sorted({t[f"{side}_run"] for t in result["tasks"].values()}))
            for side in ("reference", "candidate")}  # fmt: skip
    lines = ["# Agreement of two runs on RULER's records", "",
             f"Reference: `{result['reference']}` ({runs['reference']}). Candidate: "
             f"`{result['candidate']}` ({runs['candidate']}). Same text: records whose predictions "
             f"are the same string; same score: records scored the same.", "",
             "| task | records | same text | same score | reference score | candidate score |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for task, figures in result["tasks"].items():
        lines.append(f"| {task} | {figures['records']} | {figures['same']} | {figures['same_score']} | "
                     f"{figures['reference_score']:.2f} | {figures['candidate_score']:.2f} |")  # fmt: skip
    records = result["records"]
    lines.append(f"| all | {records} | {result['same']} ({result['same'] / records:.0%}) | {result['same_score']} "
                 f"({result['same_score'] / records:.0%}) | {result['reference_average']:.2f} (average) | "
                 f"{result['candidate_average']:.2f} (average) |")  # fmt: skip
    low, high = result["difference_interval"]
    difference = result["candidate_average"] - result["reference_average"]
    lines += ["", f"The candidate's average minus the reference's: {difference:+.2f} points (95% paired bootstrap "
              f"interval {low:+.2f} to {high:+.2f}, these records resampled)."]  # fmt: skip
    perplexity = result["continuation_perplexity"]
    if None not in perplexity.values():
        lines.append(f"Continuation perplexity: reference {perplexity['reference']:.2f}, candidate "
                     f"{perplexity['candidate']:.2f}.")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = command_line_parser("benchmarks.ruler_agreement", __doc__)
    parser.add_argument("--reference", type=Path, required=True, help="a pred/{layout}/{L} folder: the published run")
    parser.add_argument("--candidate", type=Path, required=True, help="a pred/{layout}/{L} folder: the run to check")
    parser.add_argument("--output-dir", type=Path, required=True, help="where agreement.json and agreement.md go")
    args = parser.parse_args(argv)
    for flag, folder in (("--reference", args.reference), ("--candidate", args.candidate)):
        if not folder.is_dir():
            parser.error(f"{flag} must be a folder of prediction files (pred/LAYOUT/LENGTH), got {folder}")
    result = agreement(args.reference, args.candidate)
    write_whole(args.output_dir / "agreement.json", json.dumps(result, indent=1) + "\n")
    write_whole(args.output_dir / "agreement.md", text := markdown(result))
    print(text, end="")


if __name__ == "__main__":
    main()
