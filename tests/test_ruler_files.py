"""benchmarks/ruler_files.py: RULER's files as both runners write them, with its score worked out by hand and set
beside hf_attn.ruler's (the package's, which run_presses cannot import), and the data checks naming the flag."""

import pytest

from benchmarks import ruler_files
from benchmarks.records import jsonl, write_whole
from hf_attn import ruler

PREDICTIONS = [" The numbers are 12 and 34.", "ANSWER: ab\x07cd", "", "12"]
REFERENCES = [["12", "34"], ["AB", "cd", "ef"], ["x"], ["12", "3"]]


def test_the_score_is_string_match_all_as_hf_attn_ruler_scores_it():
    # by hand: 2/2, 2/3 ("ab" and "cd" found, case ignored; "ef" not), 0/1, 1/2 -> (1 + 2/3 + 0 + 1/2) / 4 = 54.17
    preds = [ruler_files.postprocess(p) for p in PREDICTIONS]
    assert preds == ["The numbers are 12 and 34.", "ANSWER: ab\ncd", "", "12"]
    assert ruler_files.string_match_all(preds, REFERENCES) == 54.17 == ruler.score("vt", preds, REFERENCES)
    with pytest.raises(ValueError):
        ruler_files.string_match_all(preds, REFERENCES[:2])


def test_summary_and_task_results_of_a_prediction_folder(tmp_path):
    data = [{"index": i, "input": "...", "outputs": refs, "length": 100} for i, refs in enumerate(REFERENCES)]
    predictions = [ruler_files.prediction(record, pred, {"new_tokens": 3}, keep_input=False)
                   for record, pred in zip(data, PREDICTIONS, strict=True)]  # fmt: skip
    assert predictions[0] == {"index": 0, "pred": PREDICTIONS[0], "input": "", "outputs": ["12", "34"],
                              "others": {"new_tokens": 3}, "truncation": -1, "length": 100}  # fmt: skip
    write_whole(tmp_path / "vt.jsonl", jsonl(predictions))
    write_whole(tmp_path / "cwe.jsonl", jsonl(predictions[:1]))
    results = ruler_files.task_results(tmp_path, ruler.TASKS)
    assert list(results) == ["vt", "cwe"]  # RULER's order, not the files'
    assert results["vt"] == {"score": 54.17, "samples": 4, "nulls": 1}
    ruler_files.write_summary(tmp_path, ruler.TASKS)
    assert (tmp_path / "summary.csv").read_text() == ("0,1,2,3\nTasks,vt,cwe,average\nScore,54.17,100.0,77.09\n"
                                                      "Nulls,1/4,0/1,1/5\n")  # fmt: skip


def test_missing_data_names_the_flag_and_the_command_that_writes_it(tmp_path):
    write_whole(ruler_files.data_path(tmp_path, 4096, "vt"), jsonl([{"index": 0}, {"index": 1}]))
    assert ruler_files.missing_data(tmp_path, [4096], ["vt"], samples=2) == []
    assert ruler_files.missing_data(tmp_path, [4096], ["vt"], samples=3) == [
        f"--samples must be at most the records of {tmp_path}/data/4096/vt/validation.jsonl, got 3"]  # fmt: skip
    assert ruler_files.missing_data(tmp_path, [8192], ["vt"], samples=None, hint=" (or --quick)") == [
        "--output-dir must hold data/8192/vt/validation.jsonl: write it with `python -m benchmarks.ruler generate "
        f"--lengths 8192 --tasks vt --output-dir {tmp_path}` (or --quick)"]  # fmt: skip
