"""benchmarks/kvpress/run_presses.py's records, in our environment: kvpress (which pins transformers<5.3) cannot be
imported here, so its file-writing functions, free of torch, transformers and kvpress, are loaded from the script's
path and fed answers as the pipeline would give them. `benchmarks.ruler`'s report must then table the presses beside
our layouts: their scores, the KV share from their layout.json, the targets' verdict. Also: its context/question
split of RULER's records (kvpress's), its summary.csv in RULER's format, and its argument errors naming the flag."""

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, DynamicCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from benchmarks import continuation, ruler_files
from benchmarks import records as record_files
from benchmarks import ruler as ruler_benchmark
from hf_attn import ruler
from tests.test_continuation import LENGTH, TINY, kept_context_nll, tiny_llama

ROOT = Path(__file__).parents[1]
SHARED = ROOT.parent / "shared" / "data"
TASKS = ["niah_single_1", "vt"]
PRESS_RECORD = ruler_files.RUN_RECORDS["presses"]


def load_script():
    """run_presses.py as a module, from its path (benchmarks/kvpress is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("run_presses", ROOT / "benchmarks" / "kvpress" / "run_presses.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run_presses = load_script()


def ruler_records() -> dict[str, list[dict]]:
    """hf_attn.ruler's records of every task family at 1024 tokens of GPT-2's, 2 each (multiquery: 4 questions)."""
    tokenizer = AutoTokenizer.from_pretrained(SHARED / "gpt2-tokenizer")
    tasks = [*TASKS, "niah_multiquery", "cwe", "fwe"]
    return {task: ruler.generate(task, tokenizer, 1024 - ruler.TASKS[task].max_new_tokens, 2, 42,
                                 SHARED / "wikitext-2-raw") for task in tasks}  # fmt: skip


@pytest.fixture(scope="module")
def records() -> dict[str, list[dict]]:
    return ruler_records()


def test_the_scripts_task_table_is_hf_attn_rulers():
    assert run_presses.TASKS == {task: config.max_new_tokens for task, config in ruler.TASKS.items()}


def test_records_split_into_context_question_and_answer_prefix_as_kvpress_splits_them(records):
    for task, task_records in records.items():
        for record in task_records:
            context, question, answer_prefix = run_presses.split_prompt(record)
            assert context + question + answer_prefix == record["input"] + record["answer_prefix"]
            assert answer_prefix == record["answer_prefix"].lstrip()  # the space goes with the question
            assert question.startswith(("What is", "What are all", "Question:")) and "\n" not in question
            # Everything to remember is in the context (and the needles and variables not in the question: cwe's and
            # fwe's words may be parts of its words).
            assert all(output in context for output in record["outputs"]), task
            if task != "cwe" and task != "fwe":
                assert not any(output in question for output in record["outputs"]), task
    # vt, cwe and fwe repeat the question in their one-shot example: the split takes the last one.
    context, question, _ = run_presses.split_prompt(records["vt"][0])
    assert context.count("Question: Find all variables") == 1 and question.startswith("Question: Find all variables")
    with pytest.raises(ValueError, match="record 0 of vt: no question"):
        run_presses.split_prompt({"index": 0, "task": "vt", "input": "VAR A = 1", "answer_prefix": " Answer:"})


def answers(task_records: list[dict], right: bool) -> list[dict]:
    """What run_presses' `answerer` returns per record: the references or nothing, 10 tokens generated, half the
    context (900 tokens) kept beside 20 question tokens."""
    return [{"pred": " " + " ".join(record["outputs"]) if right else "", "prompt_tokens": 920, "new_tokens": 10,
             "kept_tokens": 450 + 20 + 10, "cache_tokens": 900 + 20 + 10} for record in task_records]  # fmt: skip


def write_layout(folder: Path, press: str, ratio: float, records: dict, right: dict[str, bool], **extra) -> str:
    """pred/{layout}/ as run_presses.run_layouts writes it: tasks, summary, layout.json; EXTRA: more settings."""
    layout = run_presses.layout_name(press, ratio)
    out = run_presses.pred_folder(folder, layout, 1024)
    for started, task in enumerate(TASKS):
        settings = {"model": "tiny-random-llama", "dtype": "float32", "prompt_format": "plain", "versions":
                    {"kvpress": "0.5.5", "transformers": "5.2.0", "torch": "2.13.0"}} | extra  # fmt: skip
        run = {"started": float(started), "seconds": 30.0, "device": "torch 2.13.0, x86_64, 1 threads",
               "machine": {"before": {"uptime": "up 1"}, "after": {"uptime": "up 2"}}}  # fmt: skip
        run_presses.write_task(out, task, records[task], answers(records[task], right[task]), settings, run)
    ruler_files.write_summary(out, run_presses.TASKS)
    record = run_presses.layout_record(folder / "pred" / layout, press, ratio, f"{press}({ratio})")
    record_files.write_whole(folder / "pred" / layout / "layout.json", json.dumps(record))
    return layout


def test_benchmarks_ruler_reports_the_presses_beside_our_layouts(tmp_path, records):
    for task in TASKS:  # the data the script reads, and our unmodified model answering everything right
        record_files.write_whole(run_presses.data_path(tmp_path, 1024, task), record_files.jsonl(records[task]))
        predictions = [ruler_benchmark.prediction(record, {"pred": " ".join(record["outputs"]), "prompt_tokens": 900},
                                                  False) for record in records[task]]  # fmt: skip
        record_files.write_whole(tmp_path / "pred" / "unmodified" / "1024" / f"{task}.jsonl",
                                 record_files.jsonl(predictions))  # fmt: skip
    (tmp_path / "pred" / "unmodified" / "layout.json").write_text(json.dumps({"kv_share": 1.0}))
    right = write_layout(tmp_path, "snapkv", 0.5, records, {"niah_single_1": True, "vt": True})
    wrong = write_layout(tmp_path, "adakv_snapkv", 0.5, records, {"niah_single_1": True, "vt": False})
    more = write_layout(tmp_path, "knorm", 0.25, records, {"niah_single_1": True, "vt": True}, dtype="bfloat16",
                        products="float32")  # fmt: skip
    reference = write_layout(tmp_path, "no_press", None, records, {"niah_single_1": True, "vt": True})
    assert (right, wrong, more, reference) == ("kvpress-snapkv-0.5", "kvpress-adakv_snapkv-0.5", "kvpress-knorm-0.25",
                                               "kvpress-no_press")  # fmt: skip
    # RULER's prediction records in its key order, as benchmarks.ruler writes them, and its summary.csv.
    predictions = record_files.read_jsonl(tmp_path / "pred" / wrong / "1024" / "niah_single_1.jsonl")
    assert [list(p) for p in predictions] == [["index", "pred", "input", "outputs", "others", "truncation",
                                               "length"]] * 2  # fmt: skip
    assert all(p["others"] == {"prompt_tokens": 920, "new_tokens": 10, "depths": r["depths"]}
               for p, r in zip(predictions, records["niah_single_1"], strict=True))  # fmt: skip
    assert (tmp_path / "pred" / wrong / "1024" / "summary.csv").read_text() == (
        "0,1,2,3\nTasks,niah_single_1,vt,average\nScore,100.0,0.0,50.0\nNulls,0/2,2/2,2/4\n")  # fmt: skip

    ruler_benchmark.main(["report", "--output-dir", str(tmp_path)])
    rows = json.loads((tmp_path / "results.json").read_text())["lengths"]["1024"]
    assert list(rows) == ["unmodified", wrong, more, reference, right]
    assert rows[right]["kv_share"] == 0.5 and rows[right]["kv_share_at"] == pytest.approx(480 / 930)
    assert rows[reference]["kv_share"] == 1.0 and rows[reference]["kv_share_at"] == pytest.approx(480 / 930)
    report = (tmp_path / "results.md").read_text()
    assert "| kvpress-snapkv-0.5 | 100 | 100 | 100 | 100.0% | 0 (niah_single_1) | 0.50 (0.52 here) | yes |" in report
    assert f"| {wrong} | 100 | 0 | 50 | 50.0% | 100 (vt) | 0.50 (0.52 here) | **no** |" in report
    assert f"| {more} | 100 | 100 | 100 | 100.0% | 0 (niah_single_1) | 0.75 (0.52 here) | n/a |" in report
    assert f"- {right}: kvpress's snapkv(0.5) through its kv-press-text-generation pipeline: the prefill is exact" in (
        report
    )
    assert "1.0 min of predictions; `uptime` at the first: `up 1`, at the last: `up 2`" in report
    assert "; tiny-random-llama, bfloat16 (float32 products), plain prompts" in json.loads(
        (tmp_path / "pred" / more / "layout.json").read_text())["description"]  # fmt: skip
    layout = json.loads((tmp_path / "pred" / wrong / "layout.json").read_text())
    assert layout["head_wise"] and "per key/value head, the others masked (not freed)" in layout["description"]


def test_a_task_is_complete_only_for_its_settings_and_bytes(tmp_path, records):
    out, settings = tmp_path / "pred" / "kvpress-knorm-0.5" / "1024", {"model": "m", "samples": 2}
    run = {"started": 0.0, "seconds": 1.0, "device": "cpu", "machine": {}}
    run_presses.write_task(out, "vt", records["vt"], answers(records["vt"], True), settings, run)
    assert ruler_files.complete(out, "vt", settings, PRESS_RECORD)
    assert not ruler_files.complete(out, "vt", settings | {"samples": 1}, PRESS_RECORD)
    path = out / "vt.jsonl"
    path.write_text(path.read_text().splitlines(keepends=True)[0])  # a write cut short
    assert not ruler_files.complete(out, "vt", settings, PRESS_RECORD)


def test_a_press_stopped_part_way_resumes_with_the_records_it_had_not_answered(tmp_path, records, monkeypatch):
    monkeypatch.setattr(run_presses, "versions", lambda: {"kvpress": "0.5.5"})  # not installed here
    record_files.write_whole(run_presses.data_path(tmp_path, 1024, "vt"), record_files.jsonl(records["vt"]))
    args = argparse.Namespace(output_dir=str(tmp_path), lengths=[1024], tasks=["vt"], samples=2, model="m.gguf",
                              tokenizer=None, dtype="float32", device="cpu", effective_format="chat",
                              keep_inputs=False, float32_products=False, ppl_blocks=0)  # fmt: skip
    asked, stops = [], [1]  # the machine taken back once, on the second record

    def answer(record: dict, presses: list) -> tuple[list[dict], list[float]]:
        if record["index"] in stops:
            stops.remove(record["index"])
            raise KeyError("stopped")
        asked.append(record["index"])
        return answers([record], True), [1.0]

    with pytest.raises(KeyError, match="stopped"):
        run_presses.run_layouts(answer, [("no_press", None, None)], args)
    run_presses.run_layouts(answer, [("no_press", None, None)], args)
    assert asked == [0, 1]
    out = run_presses.pred_folder(tmp_path, "kvpress-no_press", 1024)
    whole = answers(records["vt"], True)
    assert [p["pred"] for p in record_files.read_jsonl(out / "vt.jsonl")] == [a["pred"] for a in whole]
    record = json.loads((out / "vt.kvpress.json").read_text())
    assert record["parts"] == 2 and record["kv"] == {"kept": 2 * 480, "tokens": 2 * 930}
    assert not (out / "vt.progress.json").exists()


def test_presses_answered_on_one_prefill_write_each_layouts_files_as_one_at_a_time(tmp_path, records, monkeypatch):
    """run_layouts with one ASK for several presses (the shared prefill) writes each layout's files as runs of one
    press each do, only the layouts not complete asked, each charged its own seconds and naming the others."""
    monkeypatch.setattr(run_presses, "versions", lambda: {"kvpress": "0.5.5"})  # not installed here
    record_files.write_whole(run_presses.data_path(tmp_path, 1024, "vt"), record_files.jsonl(records["vt"]))
    args = argparse.Namespace(output_dir=str(tmp_path), lengths=[1024], tasks=["vt"], samples=2, model="m.gguf",
                              tokenizer=None, dtype="float32", device="cpu", effective_format="chat",
                              keep_inputs=False, float32_products=False, ppl_blocks=0)  # fmt: skip
    members = [("knorm", 0.5, KeepLastPress(4)), ("knorm", 0.25, KeepLastPress(6)), ("no_press", None, None)]
    asked = []

    def answer(record: dict, presses: list) -> tuple[list[dict], list[float]]:  # the press's keep as the answer
        asked.append((record["index"], presses))
        right = answers([record], True)[0] | {"prefill_seconds": 3.0, "sharing": len(presses)}
        return [right | {"pred": str(getattr(press, "keep", None))} for press in presses], [2.0] * len(presses)

    run_presses.run_layouts(answer, members[2:], args)  # no_press first, alone
    run_presses.run_layouts(answer, members, args)
    assert asked[2:] == [(index, [KeepLastPress(4), KeepLastPress(6)]) for index in (0, 1)]
    for (name, ratio, press), pred in zip(members, ["4", "6", "None"], strict=True):
        out = run_presses.pred_folder(tmp_path, run_presses.layout_name(name, ratio), 1024)
        assert [p["pred"] for p in record_files.read_jsonl(out / "vt.jsonl")] == [pred, pred]
        record = json.loads((out / "vt.kvpress.json").read_text())
        assert record["settings"]["press"] == repr(press) and record["seconds"] == 4.0
        assert record.get("prefill_shared_with") == {"4": ["kvpress-knorm-0.25"], "6": ["kvpress-knorm-0.5"]}.get(pred)
        assert record["shared_prefills"] == {"seconds": 6.0, "layouts": [2, 2] if press else [1, 1]}
        layout = json.loads((out.parent / "layout.json").read_text())
        assert layout["runs"]["tasks"] == 1
        assert ("prefilled once for this layout and 1 other (`--prefill shared`: kvpress-knorm-0." in
                layout["description"]) == (press is not None)  # fmt: skip


@dataclasses.dataclass
class NormPress:
    """A stand-in for a press that compresses as kvpress's BasePress does, in a hook after each attention layer of
    the prefill: the KEEP tokens of largest hidden-state norm kept (in order), or, HEAD_WISE, every head's keys of
    smallest norm but KEEP masked (`masked_key_indices`, as AdaKV and DuoAttention do). `press(model)` hooks it as
    BasePress.__call__ does."""

    keep: int
    head_wise: bool = False

    def post_init_from_model(self, model) -> None:
        pass

    def forward_hook(self, module, args, kwargs, output):
        layer = kwargs["cache"].layers[module.layer_idx]
        if self.head_wise:
            order = layer.keys.norm(dim=-1).argsort(dim=-1)[..., : -self.keep]  # (B, H, T - keep)
            batch, head = torch.meshgrid(*(torch.arange(n) for n in order.shape[:2]), indexing="ij")
            shape = order.shape
            module.masked_key_indices = (batch[..., None].expand(shape).flatten(), head[..., None].expand(shape)
                                         .flatten(), order.flatten())  # fmt: skip
        else:
            kept = kwargs["hidden_states"].norm(dim=-1).topk(self.keep, dim=-1).indices.sort(dim=-1).values
            index = kept[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys, layer.values = layer.keys.gather(2, index), layer.values.gather(2, index)
        return output

    @contextlib.contextmanager
    def __call__(self, model):
        hooks = [block.self_attn.register_forward_hook(self.forward_hook, with_kwargs=True)
                 for block in model.model.layers]  # fmt: skip
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()


def test_one_prefill_leaves_each_press_the_cache_and_masks_its_own_prefill_leaves():
    """shared_prefill against the reference, each press's own prefill under its own hooks (kvpress's route): the
    same keys, values and masked key indices, layer by layer, bit for bit; None keeps the whole cache."""
    model, generator = tiny_llama(False), torch.Generator().manual_seed(5)
    ids = torch.randint(0, TINY["vocab_size"], (1, 40), generator=generator)
    presses = [NormPress(12), NormPress(7, head_wise=True), NormPress(25), None]
    with torch.no_grad():
        shared = run_presses.shared_prefill(model, ids, presses)
        assert all(block.self_attn.masked_key_indices is None for block in model.model.layers)  # left as it found them
        for press, (cache, masked) in zip(presses, shared, strict=True):
            own = DynamicCache()
            for block in model.model.layers:
                block.self_attn.masked_key_indices = None
            with press(model) if press is not None else contextlib.nullcontext():
                model.model(input_ids=ids, cache=own)
            for layer, (mine, reference) in enumerate(zip(cache.layers, own.layers, strict=True)):
                assert torch.equal(mine.keys, reference.keys) and torch.equal(mine.values, reference.values)
                expected = model.model.layers[layer].self_attn.masked_key_indices
                assert (masked[layer] is None) == (expected is None)
                if expected is not None:
                    assert all(torch.equal(a, b) for a, b in zip(masked[layer], expected, strict=True))
            kept = {12: 12, 7: 40, 25: 25, None: 40}[getattr(press, "keep", None)]
            assert cache.get_seq_length() == kept and (masked[0] is not None) == getattr(press, "head_wise", False)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ratios", "0", "0.5"], "--ratios must all be in (0, 1) (no_press is the uncompressed reference), got "),
        (["--lengths", "100"], "--lengths must all be > 128 (the tokens --tasks generate), got [100]"),
        (["--device", "gpu"], "--device must be cpu, cuda or cuda:N, got 'gpu'"),
        (["--quick", "--model", "m.gguf"], "--quick makes its own tiny model: drop --model"),
        (["--model", "model.bin"], "--model must be a model folder or a .gguf file, got model.bin"),
        (["--samples", "0"], "--samples must be >= 1, got 0"),
        ([], "--output-dir must hold data/4096/niah_single_1/validation.jsonl: write it with `python -m "
             "benchmarks.ruler generate --lengths 4096 --tasks niah_single_1 --output-dir "),
        (["--presses", "h2o"], ("argument --presses: invalid choice: 'h2o' (choose from ", "snapkv", "duo_attention")),
        (["--presses", "duo_attention", "--duo-calibration-dir", "nowhere"], "--duo-calibration-dir must hold "
         "wiki.valid.raw (WikiText-2's validation text) for duo_attention, got nowhere"),
        (["--duo-samples", "0"], "--duo-samples must be >= 1, got 0"),
        (["--float32-products", "--dtype", "float16"], "--float32-products needs --dtype bfloat16 (its products are "
                                                       "bfloat16's), got float16"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused_naming_the_flag(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit):
        run_presses.parse_args([*argv, "--output-dir", str(tmp_path)])
    error = capsys.readouterr().err
    assert all(part in error for part in ((message,) if isinstance(message, str) else message)), error


def test_duo_attentions_calibration_texts_are_wikitext2_validation_in_50_chunks_read_the_same_each_time(tmp_path):
    valid = SHARED / "wikitext-2-raw" / "wiki.valid.raw"
    chunks = run_presses.calibration_texts(valid.parent)
    assert chunks == run_presses.calibration_texts(valid.parent) and len(chunks) == run_presses.DUO_CHUNKS == 50
    # Consecutive pieces of the whole validation text, cut at line ends, of comparable lengths (~4,300 words each).
    words = [len(chunk.split()) for chunk in chunks]
    assert sum(words) == len(valid.read_text(encoding="utf-8").split()) and 4000 <= min(words) <= max(words) <= 4600
    assert chunks[0].startswith("= Homarus gammarus =") and all(chunk in valid.read_text() for chunk in chunks)
    # Only wiki.valid.raw is read: never wiki.test.raw, whose text RULER's essay haystack is made of.
    (tmp_path / "wiki.test.raw").write_text((SHARED / "wikitext-2-raw" / "wiki.test.raw").read_text())
    with pytest.raises(FileNotFoundError, match="wiki.valid.raw"):
        run_presses.calibration_texts(tmp_path)
    # A shorter text: as many chunks of at least DUO_MIN_WORDS as it holds, whole lines each.
    lines = [" ".join(f"w{i}" for i in range(100)) + " \n" for _ in range(60)]  # 6,000 words
    (tmp_path / "wiki.valid.raw").write_text("".join(lines))
    short = run_presses.calibration_texts(tmp_path)
    assert [len(chunk.split()) for chunk in short] == [3000, 3000]


class SavedAsCodeLlama:
    """GPT-2's tokenizer, saved as transformers 5.2 saves a GGUF file's BPE tokenizer: its config naming
    `CodeLlamaTokenizer`, which reloads into other ids."""

    def __init__(self, tokenizer, shift: int = 0):
        self.tokenizer, self.shift = tokenizer, shift  # shift: ids no reload gives, to test the refusal

    def __call__(self, text: str):
        ids = [i + self.shift for i in self.tokenizer(text).input_ids]
        return dataclasses.make_dataclass("Ids", ["input_ids"])(ids)

    def save_pretrained(self, folder: Path) -> None:
        self.tokenizer.save_pretrained(folder)
        config = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps(config | {"tokenizer_class": "CodeLlamaTokenizer"}))


def test_the_tokenizer_kvzip_and_duo_attention_reload_reads_text_as_the_models_does(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(SHARED / "gpt2-tokenizer")
    probe = (SHARED / "wikitext-2-raw" / "wiki.valid.raw").read_text()[: run_presses.TOKENIZER_PROBE]
    saved_as_code_llama = tmp_path / "code_llama"
    SavedAsCodeLlama(tokenizer).save_pretrained(saved_as_code_llama)  # what kvpress would reload: other ids
    assert AutoTokenizer.from_pretrained(saved_as_code_llama)(probe).input_ids != tokenizer(probe).input_ids
    run_presses.save_reloadable(SavedAsCodeLlama(tokenizer), tmp_path / "fixed", probe)
    assert AutoTokenizer.from_pretrained(tmp_path / "fixed")(probe).input_ids == tokenizer(probe).input_ids
    run_presses.save_reloadable(tokenizer, tmp_path / "plain", probe)  # a tokenizer that reloads as it is: kept so
    assert json.loads((tmp_path / "plain" / "tokenizer_config.json").read_text())["tokenizer_class"] == "GPT2Tokenizer"
    with pytest.raises(RuntimeError, match="reloads into other ids, so kvzip and duo_attention would read other text"):
        run_presses.save_reloadable(SavedAsCodeLlama(tokenizer, shift=1), tmp_path / "refused", probe)


def test_duo_attentions_stand_in_for_booksum_samples_as_kvpress_samples_its_chapters():
    chapters = run_presses.Chapters([f"text {i}" for i in range(50)]).to_pandas()
    drawn = chapters.sample(4, random_state=42)["chapter"].tolist()
    assert drawn == chapters.sample(4, random_state=42)["chapter"].tolist() and len(set(drawn)) == 4
    assert sorted(chapters.sample(50, random_state=42)["chapter"]) == sorted(chapters.texts)
    assert len(chapters.sample(80, random_state=42)) == 50  # fewer texts than kvpress's num_samples: all of them


def test_duo_attentions_kv_share_is_what_its_retrieval_and_streaming_heads_keep():
    # SmolLM2-135M: 30 layers x 3 key/value heads; kvpress rounds 90 x 0.25 = 22.5 to 22 streaming heads.
    assert run_presses.duo_streaming_share(0.25, 90) == 22 / 90 and run_presses.duo_streaming_share(0.5, 90) == 0.5
    assert run_presses.duo_kv_share(0.5, 90) == 0.5  # at long context: the retrieval heads' share
    # At C context tokens a streaming head keeps its 128 sink and 256 recent tokens: 1 - s (1 - 384 / C).
    assert run_presses.duo_kv_share(0.5, 90, 1024) == pytest.approx(1 - 0.5 * (1 - 384 / 1024))
    assert run_presses.duo_kv_share(0.75, 4, 4096) == pytest.approx(1 - 0.75 * (1 - 384 / 4096))
    assert run_presses.duo_kv_share(0.5, 90, 300) == 1.0  # a context shorter than sink + recent: nothing masked
    record = run_presses.layout_record(Path("missing"), "duo_attention", 0.25, "DuoAttentionPress(...)", kv_heads=90)
    assert record["kv_share"] == pytest.approx(1 - 22 / 90) and record["head_wise"]
    assert record["description"].startswith(
        "DuoAttention (kvpress's on-the-fly scoring, calibrated on WikiText-2 validation text in place of BookSum): "
    )
    description = record["description"]
    assert "22 of the model's 90 key/value heads" in description and "masked (not freed)" in description


def test_the_report_names_press_rows_whose_tokenizer_reload_was_not_checked():
    """run_presses records the check for the presses that reload the tokenizer; rows without it are named."""
    checked = run_presses.layout_record(Path("missing"), "duo_attention", 0.5, "DuoAttentionPress(...)", kv_heads=90)
    assert checked["tokenizer_reload_checked"] is True
    assert "tokenizer_reload_checked" not in run_presses.layout_record(Path("missing"), "snapkv", 0.5, "SnapKVPress")
    layouts = {"kvpress-duo_attention-0.5": {}, "kvpress-kvzip-0.5": checked, "kvpress-snapkv-0.5": {},
               "k64-s4-f0.5-gate": {}}  # fmt: skip
    note = ruler_benchmark.unchecked_reloads(layouts)
    assert note[0].startswith("**Not checked: the tokenizer that kvpress-duo_attention-0.5 reloaded.**")
    assert "kvzip" not in note[0].split("**")[1] and "snapkv" not in note[0]
    assert ruler_benchmark.unchecked_reloads({"kvpress-kvzip-0.5": checked, "kvpress-snapkv-0.5": {}}) == []


@dataclasses.dataclass
class KeepLastPress:
    """A stand-in for a kvpress press (a dataclass, as they are): `press(model)` is a context manager during which
    the base model's forward passes are watched; on leaving it, the cache they filled keeps its last KEEP tokens."""

    keep: int

    @contextlib.contextmanager
    def __call__(self, model):
        caches = []
        hook = model.model.register_forward_pre_hook(
            lambda module, args, kwargs: caches.append(kwargs[continuation.cache_keyword(model)]), with_kwargs=True
        )
        try:
            yield
        finally:
            hook.remove()
            for layer in caches[-1].layers:
                layer.keys, layer.values = layer.keys[:, :, -self.keep :], layer.values[:, :, -self.keep :]


def test_the_continuation_perplexity_is_read_under_the_press_into_a_fresh_cache_per_block(tmp_path, capsys,
                                                                                        monkeypatch):  # fmt: skip
    monkeypatch.setattr(run_presses, "versions", lambda: {"kvpress": "0.5.5"})  # not installed here
    model, generator = tiny_llama(False), torch.Generator().manual_seed(3)
    blocks = torch.randint(0, TINY["vocab_size"], (2, LENGTH), generator=generator)
    args = argparse.Namespace(model="m.gguf", tokenizer=None, dtype="float32", device="cpu", ppl_text="t.raw",
                              ppl_blocks=2, float32_products=False)  # fmt: skip
    run_presses.measure_continuation(KeepLastPress(12), model, blocks, tmp_path, args)
    record = json.loads((tmp_path / continuation.FILE).read_text())
    expected = sum(kept_context_nll(model, block, 12) for block in blocks)
    assert record["perplexity"] == pytest.approx(math.exp(expected / record["scored_tokens"]), rel=1e-5)
    assert record["settings"]["press"] == "KeepLastPress(keep=12)" and record["settings"]["blocks"] == 2
    run_presses.measure_continuation(KeepLastPress(12), model, blocks, tmp_path, args)
    assert capsys.readouterr().out.splitlines()[-1].endswith(", kept")  # the same settings: not measured again
    run_presses.measure_continuation(None, model, blocks, tmp_path / "no_press", args)
    whole = json.loads((tmp_path / "no_press" / continuation.FILE).read_text())
    assert whole["perplexity"] < record["perplexity"] and whole["settings"]["press"] == "None"


def test_continuations_on_one_prefill_a_block_are_each_press_own(tmp_path, monkeypatch):
    """measure_continuations (one shared prefill a block) writes, for each press, the perplexity its own route
    measures (`measure_continuation`: the press's hooks over its own prefill), a head-wise press's masks read too;
    a record kept for its settings is not measured again."""
    monkeypatch.setattr(run_presses, "versions", lambda: {"kvpress": "0.5.5"})  # not installed here
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def masking(module, query, key, value, *args, **kwargs):  # a stand-in for kvpress's patch: masked values drop out
        if query.shape[2] == key.shape[2]:  # a prefill: its hook sets the masks anew
            module.masked_key_indices = None
        elif getattr(module, "masked_key_indices", None) is not None:
            value = value.clone()
            value[module.masked_key_indices] = 0
        return sdpa(module, query, key, value, *args, **kwargs)

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "sdpa", masking)
    model, generator = tiny_llama(False), torch.Generator().manual_seed(3)
    blocks = torch.randint(0, TINY["vocab_size"], (2, LENGTH), generator=generator)
    args = argparse.Namespace(model="m.gguf", tokenizer=None, dtype="float32", device="cpu", ppl_text="t.raw",
                              ppl_blocks=2, float32_products=False)  # fmt: skip
    presses = [NormPress(20), NormPress(9, head_wise=True), None]
    outs = [tmp_path / "shared" / str(i) for i in range(3)]
    run_presses.measure_continuations(presses, model, blocks, outs, args)
    for i, press in enumerate(presses):
        run_presses.measure_continuation(press, model, blocks, tmp_path / "own" / str(i), args)
    records = [json.loads((out / continuation.FILE).read_text()) for out in outs]
    for i, record in enumerate(records):
        own = json.loads((tmp_path / "own" / str(i) / continuation.FILE).read_text())
        assert record["nll"] == pytest.approx(own["nll"], rel=1e-6) and record["settings"] == own["settings"]
        assert {key: own[key] for key in ("scored_tokens", "blocks", "tokens_sha256")} == \
            {key: record[key] for key in ("scored_tokens", "blocks", "tokens_sha256")}  # fmt: skip
    assert len({round(record["nll"], 3) for record in records}) == 3  # the presses read different caches
    kept = (outs[0] / continuation.FILE).read_text()
    run_presses.measure_continuations(presses[:1], model, blocks, outs[:1], args)
    assert (outs[0] / continuation.FILE).read_text() == kept
