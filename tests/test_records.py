"""benchmarks/records.py: a record file is replaced whole or not at all, and a spoiled one reads as missing."""

import json
from pathlib import Path

import pytest

from benchmarks import records


def test_a_write_that_fails_leaves_the_old_record_and_no_partial_file(tmp_path: Path, monkeypatch):
    path = tmp_path / "deep" / "task.run.json"
    records.write_whole(path, json.dumps({"seconds": 1}))
    assert records.read_json(path) == {"seconds": 1}

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(records.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        records.write_whole(path, json.dumps({"seconds": 2}))
    assert records.read_json(path) == {"seconds": 1}  # the old record, whole
    monkeypatch.undo()
    records.write_whole(path, json.dumps({"seconds": 3}))
    assert records.read_json(path) == {"seconds": 3} and sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_missing_or_spoiled_records_read_as_none_and_jsonl_round_trips(tmp_path: Path):
    assert records.read_json(tmp_path / "missing.json") is None
    (spoiled := tmp_path / "spoiled.json").write_text('{"seconds": 1', encoding="utf-8")  # cut short
    assert records.read_json(spoiled) is None
    rows = [{"index": 0, "pred": "a\nb"}, {"index": 1, "pred": "ü"}]
    records.write_whole(path := tmp_path / "task.jsonl", records.jsonl(rows))
    assert records.read_jsonl(path) == rows and path.read_text(encoding="utf-8").count("\n") == 2
    assert records.sha256("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # FIPS 180-2
