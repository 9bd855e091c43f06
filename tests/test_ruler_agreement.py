"""benchmarks/ruler_agreement.py: the same-string count and each side's score per task, on records matched by index,
counted here by hand; the paired interval of the difference within the bounds the records allow."""

import json
from pathlib import Path

import pytest

from benchmarks import ruler_agreement


def write(folder: Path, task: str, preds: dict[int, str], outputs: list[str], settings: dict | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"index": index, "pred": pred, "outputs": outputs}) for index, pred in preds.items()]
    (folder / f"{task}.jsonl").write_text("\n".join(lines) + "\n")
    if settings:
        (folder / f"{task}.run.json").write_text(json.dumps({"settings": settings, "device": "cpu, 1 threads"}))


def test_same_predictions_and_scores_are_counted_per_task_on_shared_records(tmp_path, capsys):
    reference, candidate = tmp_path / "a", tmp_path / "b"
    write(reference, "niah_single_1", {0: "7", 1: "8", 2: "9", 3: "1"}, ["7"], {"dtype": "bfloat16"})
    write(candidate, "niah_single_1", {0: "7", 1: "7 ", 2: "9 no", 4: "7"}, ["7"],
          {"dtype": "bfloat16", "products": "float32"})  # fmt: skip
    write(reference, "vt", {0: "X Y", 1: "X"}, ["X", "Y"])
    write(candidate, "vt", {0: "X Y", 1: "X Y"}, ["X", "Y"])
    write(reference, "cwe", {0: "a"}, ["a"])  # the candidate has no cwe: left out
    ruler_agreement.main(["--reference", str(reference), "--candidate", str(candidate), "--output-dir",
                          str(tmp_path / "out")])  # fmt: skip
    result = json.loads((tmp_path / "out" / "agreement.json").read_text())
    niah, vt = result["tasks"]["niah_single_1"], result["tasks"]["vt"]
    assert list(result["tasks"]) == ["niah_single_1", "vt"]
    # records 0-2 shared: 0 the same; the reference right on 0 ("7"), the candidate on 0 and 1 ("7 "); both wrong on 2
    assert (niah["records"], niah["same"], niah["reference_score"], niah["candidate_score"]) == (3, 1, 33.33, 66.67)
    assert (vt["records"], vt["same"], vt["reference_score"], vt["candidate_score"]) == (2, 1, 75.0, 100.0)
    assert (niah["same_score"], vt["same_score"]) == (2, 1)  # 0 and 2 ("9", "9 no": both 0)
    assert (result["records"], result["same"], result["same_score"]) == (5, 2, 3)
    assert (result["reference_average"], result["candidate_average"]) == (54.16, 83.34)  # of the rounded scores
    assert niah["candidate_run"] == "bfloat16 (float32 products) on cpu, 1 threads"
    assert vt["reference_run"] == "no run record"
    text = (tmp_path / "out" / "agreement.md").read_text()
    assert "| niah_single_1 | 3 | 1 | 2 | 33.33 | 66.67 |" in text and "| all | 5 | 2 (40%) | 3 (60%) | 54.16" in text
    assert "(bfloat16 on cpu, 1 threads; no run record). Candidate:" in text and capsys.readouterr().out == text
    # the paired difference: niah 1/3 and vt 1/4 of a record's score on average, 29.17 points; its resamples lie
    # between both rows' worst (0: the one record that differs in each task never drawn) and best (100 and 50 apart)
    low, high = result["difference_interval"]
    assert 0 <= low < 29.17 < high <= 75
    assert f"minus the reference's: +29.18 points (95% paired bootstrap interval {low:+.2f} to {high:+.2f}" in text
    assert result["continuation_perplexity"] == {"reference": None, "candidate": None}
    assert "Continuation perplexity" not in text


def test_the_same_predictions_differ_by_nothing_and_their_perplexities_are_reported(tmp_path, capsys):
    for side, perplexity in (("a", 17.613), ("b", 17.629)):
        write(tmp_path / side, "vt", {0: "X Y", 1: "X", 2: ""}, ["X", "Y"])
        (tmp_path / side / "continuation.json").write_text(json.dumps({"perplexity": perplexity}))
    ruler_agreement.main(["--reference", str(tmp_path / "a"), "--candidate", str(tmp_path / "b"), "--output-dir",
                          str(tmp_path / "out")])  # fmt: skip
    result = json.loads((tmp_path / "out" / "agreement.json").read_text())
    assert result["difference_interval"] == [0.0, 0.0]
    assert "Continuation perplexity: reference 17.61, candidate 17.63." in capsys.readouterr().out


def test_a_missing_folder_or_no_shared_task_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        ruler_agreement.main(["--reference", str(tmp_path / "none"), "--candidate", str(tmp_path), "--output-dir",
                              str(tmp_path / "out")])  # fmt: skip
    assert "--reference must be a folder of prediction files (pred/LAYOUT/LENGTH), got" in capsys.readouterr().err
    write(tmp_path / "a", "vt", {0: "X"}, ["X"])
    write(tmp_path / "b", "cwe", {0: "X"}, ["X"])
    with pytest.raises(SystemExit, match="no task has predictions in both"):
        ruler_agreement.main(["--reference", str(tmp_path / "a"), "--candidate", str(tmp_path / "b"), "--output-dir",
                              str(tmp_path / "out")])  # fmt: skip
