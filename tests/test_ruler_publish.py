"""benchmarks/ruler_publish.py: only whole rows answered on the published data reach the published folder, all or
none of those asked for; a published row is replaced whole and the report then tables it."""

import json
import shutil
from pathlib import Path

import pytest

from benchmarks import records as record_files
from benchmarks import ruler_publish
from hf_attn import ruler
from tests.test_kvpress_records import TASKS, ruler_records, run_presses, write_layout

CONTINUATION = {"perplexity": 18.0, "blocks": 2, "block_tokens": 1024, "context_tokens": 768, "scored_tokens": 510,
                "tokens_sha256": "0" * 64}  # fmt: skip


@pytest.fixture(scope="module")
def records() -> dict[str, list[dict]]:
    return ruler_records()


def make_row(out: Path, press: str, records: dict, right: bool = True) -> Path:
    """OUT/pred/ROW as run_presses leaves a finished row: each task's record names the data file it answered (its
    sha256), and the continuation perplexity is there."""
    row = out / "pred" / write_layout(out, press, 0.5, records, dict.fromkeys(TASKS, right))
    for task in TASKS:
        record = record_files.read_json(path := row / "1024" / f"{task}.kvpress.json")
        record["settings"]["data_sha256"] = record_files.sha256(run_presses.data_path(out, 1024, task).read_text())
        record_files.write_whole(path, json.dumps(record))
    record_files.write_whole(row / "1024" / "continuation.json", json.dumps(CONTINUATION))
    return row


@pytest.fixture
def folders(tmp_path: Path, records) -> tuple[Path, Path]:
    """(a run's OUT with its data, a published folder with the same data's generation.json and its unmodified row)."""
    out, published = tmp_path / "out", tmp_path / "published"
    generation = {}
    for task in TASKS:
        text = record_files.jsonl(records[task])
        record_files.write_whole(run_presses.data_path(out, 1024, task), text)
        # as `benchmarks.ruler generate` records it
        settings = {"tokenizer": "gpt2", "length": 1024 - ruler.TASKS[task].max_new_tokens, "samples": 2, "seed": 42,
                    "haystack_dir": "../shared/data/wikitext-2-raw"}  # fmt: skip
        generation[f"1024/{task}"] = {"settings": settings, "sha256": record_files.sha256(text), "seconds": 1.0}
    record_files.write_whole(published / "data" / "generation.json", json.dumps(generation))
    shutil.copytree(make_row(out, "no_press", records), published / "pred" / "unmodified")
    return out, published


def published_rows(published: Path) -> list[str]:
    return sorted(path.name for path in (published / "pred").iterdir())


def test_unfinished_or_unvouched_rows_publish_nothing_and_say_why(folders, records):
    out, published = folders
    whole = make_row(out, "snapkv", records).name
    in_progress = make_row(out, "knorm", records)
    (in_progress / "1024" / "vt.progress.json").write_text("{}")
    edited = make_row(out, "expected_attention", records)
    predictions = edited / "1024" / "vt.jsonl"
    predictions.write_text(predictions.read_text().replace('"pred": "', '"pred": "x'))
    no_perplexity = make_row(out, "streaming_llm", records)
    (no_perplexity / "1024" / "continuation.json").unlink()
    other_data = make_row(out, "adakv_snapkv", records)
    record = json.loads((other_data / "1024" / "niah_single_1.kvpress.json").read_text())
    record["settings"]["data_sha256"] = "f" * 64
    (other_data / "1024" / "niah_single_1.kvpress.json").write_text(json.dumps(record))
    rows = [whole, in_progress.name, edited.name, no_perplexity.name, other_data.name, "kvpress-missing-0.5"]
    with pytest.raises(SystemExit) as stop:
        ruler_publish.main(["--from", str(out), "--output-dir", str(published), *rows])
    message = str(stop.value)
    assert message.startswith("nothing published:")
    assert f"{in_progress / '1024' / 'vt.jsonl'}: still in progress (vt.progress.json)" in message
    assert f"{edited / '1024' / 'vt.jsonl'}: not the file its run record vouches for (sha256)" in message
    assert f"{no_perplexity / '1024' / 'continuation.json'}: missing" in message
    assert f"{other_data / '1024' / 'niah_single_1.jsonl'}: answered on other data than the published" in message
    assert f"{out / 'pred' / 'kvpress-missing-0.5'}: no layout.json (not a row, or one its runner" in message
    assert message.count("\n- ") == 5 and whole not in message  # the whole row has nothing against it...
    assert published_rows(published) == ["unmodified"]  # ...and is not published alone either


def test_whole_rows_are_published_without_their_progress_files_and_tabled(folders, records, capsys):
    out, published = folders
    row = make_row(out, "snapkv", records, right=False)
    (row / "1024" / "stale.partial").write_text("an interrupted write")
    ruler_publish.main(["--from", str(out), "--output-dir", str(published), "--check", row.name])
    assert f"ready to publish into {published}: {row.name}" in capsys.readouterr().out
    assert published_rows(published) == ["unmodified"] and not (published / "results.json").exists()
    ruler_publish.main(["--from", str(out), "--output-dir", str(published), row.name])
    assert published_rows(published) == [row.name, "unmodified"]
    copy = published / "pred" / row.name
    copied = sorted(path.relative_to(copy) for path in copy.rglob("*"))
    assert copied == sorted(path.relative_to(row) for path in row.rglob("*") if path.suffix != ".partial")
    results = json.loads((published / "results.json").read_text())
    assert results["command"] == f"python -m benchmarks.ruler report --output-dir {published}"
    assert results["lengths"]["1024"][row.name]["average"] == 0  # answered wrong
    # Published again from a better run: the row is replaced whole, nothing staged is left behind.
    shutil.rmtree(row)
    row = make_row(out, "snapkv", records, right=True)
    ruler_publish.main(["--from", str(out), "--output-dir", str(published), row.name])
    assert published_rows(published) == [row.name, "unmodified"] and not (published / ".publishing").exists()
    assert json.loads((published / "results.json").read_text())["lengths"]["1024"][row.name]["average"] == 100
    assert f"| {row.name} | 100 | 100 | 100 |" in (published / "results.md").read_text()


def test_a_published_folder_without_its_data_record_is_refused(tmp_path: Path):
    with pytest.raises(SystemExit, match=r"--output-dir: .*generation.json is missing or unreadable"):
        ruler_publish.main(["--from", str(tmp_path), "--output-dir", str(tmp_path / "published"), "unmodified"])
