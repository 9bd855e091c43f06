"""Passkey prompts (hf_attn/data/passkey.py) and the long-context benchmark (benchmarks/long_context.py): exact
prompt lengths, the needle where asked, the scorer, a tiny Llama end to end, resuming, and the reports."""

import copy
import functools
import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from benchmarks import long_context
from hf_attn.data.passkey import (
    FILLER,
    NEEDLE,
    PasskeyPrompt,
    encode,
    frame,
    passkey_found,
    passkey_keys,
    passkey_prompt,
    passkey_prompts,
)

SHARED = Path(__file__).parents[2] / "shared" / "data"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(SHARED / "gpt2-tokenizer")


@pytest.fixture(scope="module")
def chat_tokenizer(tokenizer):
    chat = copy.deepcopy(tokenizer)
    chat.chat_template = "{% for m in messages %}<|user|>{{ m['content'] }}\n{% endfor %}<|assistant|>"
    return chat


@pytest.mark.parametrize("prompt_format", ["plain", "chat"])
@pytest.mark.parametrize("length", [90, 257, 1024])
@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
def test_prompt_is_exactly_as_long_as_asked_with_the_needle_at_the_depth(
    tokenizer, chat_tokenizer, prompt_format, length, depth
):
    chosen = chat_tokenizer if prompt_format == "chat" else tokenizer
    prompt = passkey_prompt(chosen, length, depth, "71432", prompt_format)
    assert len(prompt.input_ids) == length == prompt.length
    head, tail = frame(chosen, prompt_format)
    needle = encode(chosen, " " + NEEDLE.format(key="71432"))
    assert prompt.input_ids[: len(head)] == head and prompt.input_ids[-len(tail) :] == tail
    assert prompt.input_ids[prompt.needle_start : prompt.needle_start + len(needle)] == needle
    filler = length - len(head) - len(tail) - len(needle)
    longest = max(len(encode(chosen, " " + sentence)) for sentence in FILLER)
    assert abs(prompt.needle_start - len(head) - depth * filler) <= longest / 2  # the nearest sentence boundary
    before = chosen.decode(prompt.input_ids[len(head) : prompt.needle_start])
    assert before == "" or before.endswith("."), before  # between sentences
    text = chosen.decode(prompt.input_ids)
    assert text.count("71432") == 2 and text.endswith("What is the pass key?" + (
        "\n<|assistant|>The pass key is" if prompt_format == "chat" else " The pass key is"))  # fmt: skip


def test_prompt_refuses_what_cannot_be_built(tokenizer):
    with pytest.raises(ValueError, match="`length` must leave room"):
        passkey_prompt(tokenizer, 40, 0.5, "71432")
    with pytest.raises(ValueError, match="`depth` must be in"):
        passkey_prompt(tokenizer, 200, 1.5, "71432")
    with pytest.raises(ValueError, match="`prompt_format` must be one of"):
        passkey_prompt(tokenizer, 200, 0.5, "71432", "markdown")


def test_keys_are_seeded_distinct_five_digit_numbers(tokenizer):
    keys = passkey_keys(500, seed=3)
    assert keys == passkey_keys(500, seed=3) != passkey_keys(500, seed=4)
    assert len(set(keys)) == 500 and all(len(key) == 5 and key.isdigit() and key[0] != "0" for key in keys)
    prompts = passkey_prompts(tokenizer, [100, 150], [0.1, 0.9], keys_per_depth=3, seed=3)
    assert [(p.length, p.depth) for p in prompts[:4]] == [(100, 0.1)] * 3 + [(100, 0.9)]
    assert [p.key for p in prompts] == keys[:12]


@pytest.mark.parametrize(
    "continuation, found",
    [(" 71432. Remember it.", True), ("71432", True), (" is 71432", True), (" 7143", False), (" 714321.", False),
     (" 171432", False), (" 71 432", False), (" the pass key.", False)],
)  # fmt: skip
def test_scorer_wants_the_key_as_a_whole_number(continuation, found):
    assert passkey_found(continuation, "71432") is found


# --- the benchmark ---------------------------------------------------------------------------------------------

TINY = ["--dtype", "float32", "--data_dir", str(SHARED / "wikitext-2-raw"), "--local_windows", "4", "--sink_tokens",
        "0", "2", "--fractions", "0", "0.5", "--scores", "random", "loss", "mass", "gate", "--random_seeds", "0",
        "--calibration_blocks", "2", "--calibration_block_size", "160", "--passkey_lengths", "96", "128",
        "--passkey_depths", "0.2", "0.8", "--keys_per_depth", "2", "--new_tokens", "4", "--ppl_blocks", "2",
        "--ppl_block_size", "64", "--prefill_context", "32", "--timing_context", "64",
        "--decode_steps", "4", "--timing_repeats", "2", "--threads", "1"]  # fmt: skip


def greedy_continuation(model, tokenizer, prompt: PasskeyPrompt, new_tokens: int) -> str:
    """The reference: full forwards, no cache, argmax, stopping after an end-of-sequence token as `generate` does."""
    ids = torch.tensor([prompt.input_ids])
    with torch.no_grad():
        for _ in range(new_tokens):
            token = model(ids).logits[0, -1].argmax()
            ids = torch.cat([ids, token.view(1, 1)], dim=-1)
            if token.item() == model.generation_config.eos_token_id:
                break
    return tokenizer.decode(ids[0, prompt.length :], skip_special_tokens=True)


def test_benchmark_end_to_end_on_a_tiny_llama_then_resumes(tmp_path, tokenizer, capsys, request):
    """Every configuration measured and aggregated; the unmodified model's answers are its greedy continuations; an
    all-global layout changes nothing; a rerun measures only the missing or corrupt configuration."""
    request.addfinalizer(functools.partial(torch.set_num_threads, torch.get_num_threads()))  # --threads sets them
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50257, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    argv = [str(tmp_path / "tiny"), *TINY, "--output_dir", str(tmp_path / "out")]
    long_context.main([*argv, "--skip_timing"])
    folder = tmp_path / "out" / "tiny"
    result = json.loads((folder / "results.json").read_text())
    rows = {long_context.Config(**row["config"]).name: row for row in result["rows"]}
    assert sorted(rows) == sorted(["unmodified"] + [f"k4-s{s}-f{f}-{score}" for s in (0, 2) for f in ("0", "0.5")
                                                    for score in ("random-seed0", "loss", "mass", "gate")])  # fmt: skip
    unmodified = rows["unmodified"]
    for name, row in rows.items():
        assert set(row["passkey"]) == {"96", "128"} and set(row["passkey_by_depth"]) == {"0.2", "0.8"}
        if "-f0-" in name:  # nothing local: the unmodified model's figures
            assert row["kv_ratio"] == 1.0 and row["local_heads"] == 0
            assert row["perplexity"] == pytest.approx(unmodified["perplexity"], rel=1e-5)
            assert row["passkey"] == unmodified["passkey"]
        elif name != "unmodified":
            assert row["kv_ratio"] == 0.5 and row["local_heads"] == 4
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny").eval()
    prompts = passkey_prompts(tokenizer, [96, 128], [0.2, 0.8], 2)  # two keys share a prefill per length and depth
    answers = json.loads((folder / "configs" / "unmodified.json").read_text())["answers"]
    for prompt, answer in zip(prompts, answers, strict=True):
        assert answer["key"] == prompt.key and answer["answer"] == greedy_continuation(model, tokenizer, prompt, 4)
        assert answer["found"] == passkey_found(answer["answer"], prompt.key)
    assert unmodified["passkey"]["96"] == sum(a["found"] for a in answers[:4]) / 4
    assert set(result["scores"]) == {f"{score}-k4-s{s}" for score in ("loss", "mass", "gate") for s in (0, 2)}
    assert result["timing"] == {} and result["threads"] == 1
    assert "| 50% | loss | 0 | " in (folder / "results.md").read_text()
    assert (folder / "long_context.png").read_bytes()[:4] == b"\x89PNG"

    before = {path: path.read_bytes() for path in folder.glob("*/*.json")}
    (folder / "configs" / "k4-s0-f0.5-random-seed0.json").unlink()
    (folder / "configs" / "k4-s0-f0.5-loss.json").write_text('{"config": ')  # a write cut short
    long_context.main([*argv, "--skip_timing"])
    after = {path: path.read_bytes() for path in folder.glob("*/*.json")}
    assert set(after) == set(before)
    remeasured = {path.name for path in after if after[path] != before[path]}
    assert remeasured == {"k4-s0-f0.5-random-seed0.json", "k4-s0-f0.5-loss.json"}
    again = json.loads((folder / "results.json").read_text())
    assert [row["perplexity"] for row in again["rows"]] == pytest.approx([row["perplexity"] for row in result["rows"]])

    # Later, on an idle machine: the timing alone (one shape: each pair is two fresh processes).
    one_shape = ["--fractions", "0.5", "--sink_tokens", "2"]
    long_context.main([*argv, *one_shape, "--timing_only"])
    timed = {path.name for path in folder.glob("*/*.json")} - {path.name for path in after}
    assert timed == {"k4-s2-f0.5.json"}
    assert all(path.read_bytes() == after[path] for path in after)

    # Then the reports from the records alone, wherever each was measured (quality on a GPU, timing on a CPU).
    stamps = {path: path.stat().st_mtime_ns for path in folder.glob("*/*.json")}
    long_context.main([*argv, *one_shape, "--stored_only"])
    assert {path: path.stat().st_mtime_ns for path in folder.glob("*/*.json")} == stamps  # nothing measured
    reported = json.loads((folder / "results.json").read_text())
    assert len(reported["rows"]) == 5 and set(reported["timing"]) == {"k4-s2-f0.5"}  # unmodified + 4 scores
    assert [row["perplexity"] for row in reported["rows"]] == [row["perplexity"] for row in again["rows"][:1]] + [
        row["perplexity"] for row in again["rows"] if row["config"]["fraction"] == 0.5 and row["config"]["sink_tokens"]
    ]
    timing = reported["timing"]["k4-s2-f0.5"]
    assert len(timing["pairs"]) == 2
    for pair in timing["pairs"]:
        assert pair["converted"]["cache_bytes"] < pair["unmodified"]["cache_bytes"]  # half the groups keep 5 of 64
        assert pair["decode_speed_ratio"] > 0 and pair["unmodified"]["peak_memory_bytes"] > 0
    ratios = [pair["decode_speed_ratio"] for pair in timing["pairs"]]
    assert timing["decode_speed_ratio"] == pytest.approx(sum(ratios) / 2)  # the median of two
    exact = timing["exact_peak_memory_bytes"]  # from one more process per model, allocations mapped on their own
    assert exact["unmodified"] > 0 and timing["peak_memory_ratio"] == exact["converted"] / exact["unmodified"]
    assert "exact: glibc mapping every allocation above 128 KiB" in (folder / "results.md").read_text()
    assert "| 50% | loss | 2 | " in (folder / "results.md").read_text()
    (folder / "configs" / "k4-s2-f0.5-gate.json").unlink()
    with pytest.raises(SystemExit, match="k4-s2-f0.5-gate.json is missing"):
        long_context.main([*argv, *one_shape, "--stored_only"])

    # The scores alone, for other benchmarks to rank groups by: new records in scores/, nothing else written.
    stamps = {path: path.stat().st_mtime_ns for path in folder.rglob("*") if path.is_file()}
    long_context.main([*argv, "--scores", "gate", "retrieval", "--scores_only"])
    written = {path for path in folder.rglob("*") if path.is_file()} - set(stamps)
    assert {path.relative_to(folder).as_posix() for path in written} == {"scores/retrieval-k4-s0.json",
                                                                          "scores/retrieval-k4-s2.json"}  # fmt: skip
    assert all(path.stat().st_mtime_ns == stamp for path, stamp in stamps.items())  # gate's kept, as all the rest
    assert len(json.loads(next(iter(written)).read_text())["scores"]) == 2  # (layers, groups)


def test_batched_passkeys_answer_as_one_at_a_time(tokenizer):
    """Prompts of one length generated together (a GPU's fastest) give each prompt's greedy continuation."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50257, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    prompts = passkey_prompts(tokenizer, [96, 128], [0.2, 0.8], 2)
    answers = long_context.passkey_answers(model, tokenizer, prompts, 4, batch_size=3)  # batches of 3 and 1
    assert [(a["length"], a["key"]) for a in answers] == [(p.length, p.key) for p in prompts]
    assert [a["answer"] for a in answers] == [greedy_continuation(model, tokenizer, p, 4) for p in prompts]


DATA_DIR = ["--data_dir", str(SHARED / "wikitext-2-raw")]


def test_arguments_are_checked_together():
    args = long_context.parse_args(["model", "--sink_tokens", "0", *DATA_DIR])
    args.fractions, args.local_windows, args.decode_steps = [1.5], [0], 2
    problems = long_context.argument_problems(args)
    assert len(problems) == 3 and "--fractions" in problems[0] and "--decode_steps" in problems[-1]
    with pytest.raises(SystemExit):
        long_context.parse_args(["model", "--fractions", "1.5", "--local_windows", "0", "--decode_steps", "2"])


MISSING = "does not exist (a .gguf file, a model folder, or a folder holding one .gguf file)"
NO_DATA_DIR = ("--data_dir must be a folder of wiki.train.raw, wiki.valid.raw, wiki.test.raw (WikiText-2 raw) or '' "
               "for the Hub, got /tmp/missing-wikitext (no such folder)")  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["/tmp/missing.gguf"], f"argument model: /tmp/missing.gguf {MISSING}"),
        (["bad name"], "argument model: 'bad name' is neither a packaged model ('smollm2-135m-instruct', "
                       "'gemma-3-270m') nor a Hub id ('name' or 'namespace/name')"),
        (["model", "--device", "gpu"], "--device must be cpu, cuda or cuda:N, got 'gpu'"),
        (["model", "--scores", "best"], "argument --scores: invalid choice: 'best' (choose from "),
        (["model", "--dtype", "fp8"], "argument --dtype: invalid choice: 'fp8' (choose from "),
        (["model", "--prompt_format", "xml"], "argument --prompt_format: invalid choice: 'xml' (choose from "),
        (["model", "--data_dir", "/tmp/missing-wikitext"], NO_DATA_DIR),
        (["model", "--data_dir", ""], "--data_dir '' reads WikiText-2 from the Hub, which is offline (HF_HUB_OFFLINE)"),
        (["model", "--passkey_lengths", "0", "96"], "--passkey_lengths must be >= 1, got [0, 96]"),
        (["model", "--sink_tokens", "-1"], "--sink_tokens must be >= 0, got [-1]"),
        (["model", "--threads", "0"], "--threads must be >= 1, got 0"),
        (["model", "--ppl_block_size", "1"], "--ppl_block_size must be >= 2, got 1"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused_in_one_line_naming_the_flag_before_any_model_loads(argv, message, monkeypatch,
                                                                                      capsys):  # fmt: skip
    monkeypatch.setattr(long_context, "load_causal_lm", lambda *args, **kwargs: pytest.fail("loaded"))
    with pytest.raises(SystemExit):
        long_context.main([*argv[:1], *DATA_DIR, *argv[1:]])
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def synthetic_result() -> dict:
    """A results dict as `run` makes it: the unmodified model, two random seeds and a loss layout at one share."""

    def row(window, fraction, score, seed, passkey, perplexity):
        config = long_context.Config(window, 0, fraction, score, seed)
        return {
            "config": asdict(config),
            "kv_ratio": 1 - fraction,
            "local_heads": 0,
            "passkey": {"1024": passkey, "4096": passkey / 2},
            "passkey_by_depth": {},
            "perplexity": perplexity,
            "seconds": 900.0,
        }

    timing = {"k64-s0-f0.5": {"peak_memory_ratio": 0.8, "decode_speed_ratio": 1.4, "prefill_time_ratio": 0.9,
                              "seconds": 3600.0}}  # fmt: skip
    settings = {
        "timing_context": 8192,
        "prefill_context": 4096,
        "passkey_depths": [0.5],
        "keys_per_depth": 20,
        "prompt_format": "plain",
        "timing_dtype": "float32",
        "timing_repeats": 3,
        "new_tokens": 10,
        "ppl_blocks": 8,
        "ppl_block_size": 2048,
    }
    return {
        "name": "demo", "family": "llama", "parameters": 1000, "layers": 2, "heads": 4, "key_value_heads": 2,
        "dtype": "bfloat16", "threads": 2, "settings": settings, "timing": timing,
        "scores": {"loss-k64-s0": {"score_seconds": 120.0, "seconds": 1800.0}}, "wall_seconds": 7200,
        "machine": {"load_average": [2.0, 2.0, 2.0], "torch": "torch", "quality": "a GPU"},
        "rows": [row(None, 0.0, "unmodified", None, 1.0, 20.0), row(64, 0.5, "random", 0, 0.5, 22.0),
                 row(64, 0.5, "random", 1, 0.7, 26.0), row(64, 0.5, "loss", None, 1.0, 20.5)],
    }  # fmt: skip


def test_report_averages_random_seeds_and_gives_ratios(tmp_path):
    result = synthetic_result()
    text = long_context.write_reports(result, tmp_path)
    lines = text.splitlines()
    assert ("| local share | score | sinks | passkey 1K | passkey 4K | perplexity | vs unmodified | KV bytes / token | "
            "peak memory at 8192 | decode speed at 8192 | prefill time at 4096 |") in lines  # fmt: skip
    assert "| 0% | unmodified | 0 | 100% | 50% | 20.00 | 1.000x | 1.00x | 1.00x | 1.00x | 1.00x |" in lines
    random_row = "| 50% | random (2 seeds) | 0 | 60% (50-70) | 30% (25-35) | 24.00 (22.00-26.00) | 1.200x | 0.50x |"
    assert random_row + " 0.80x | 1.40x | 0.90x |" in lines
    assert "| 50% | loss | 0 | 100% | 50% | 20.50 | 1.025x | 0.50x | 0.80x | 1.40x | 0.90x |" in lines
    assert "loss-k64-s0 2.0 min" in text and "perplexity in bfloat16 on a GPU" in text
    assert "took 1.5 h for the scores, passkeys and perplexity and 1.0 h for the timing" in text
    assert "wall time 2.0 h" in text
    result["settings"]["stored_only"] = True  # the reports from records measured elsewhere: no wall time of its own
    assert "wall time" not in long_context.notes(result)
    assert (tmp_path / "long_context.png").read_bytes()[:4] == b"\x89PNG"
