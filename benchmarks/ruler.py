"""RULER's synthetic suite (`hf_attn.ruler`: 11 tasks) on a pretrained decoder, unmodified and hybridized by
`hf_attn.hybridize`, each layout's records kept in RULER's own files.

    python -m benchmarks.ruler generate --lengths 4096 8192 --samples 20 --output-dir OUT   # data/, SmolLM2's tokens
    python -m benchmarks.ruler run --lengths 4096 8192 --output-dir OUT                     # pred/, then the report
    python -m benchmarks.ruler report --output-dir OUT                    # results.{json,md} from pred/ alone
    python -m benchmarks.ruler run --quick     # a tiny random Llama, 2 samples at 1024: data, pred, report in seconds

generate: for each length L (RULER's bucket: prompt and generated tokens within L) and task, `--samples` records of
`hf_attn.ruler.generate(task, tokenizer, L - max_new_tokens, samples, seed, haystack_dir)`, tokens counted by
`--tokenizer`'s (default: the model's). The same command again leaves a file alone when its settings and bytes are
the ones recorded; records do not depend on `--samples` (a record is drawn from (task, length, seed, index)).

run: the model (`--model`, any `hf_attn.pretrained` source; `--dtype` on `--device`) unmodified, then hybridized in
place to every layout the flags give: each window k (`--local-windows`), sink count S (`--sink-tokens`), share of
key/value groups made local (`--fractions`) and score (`--scores`), the groups ranked by the score
`benchmarks.long_context` stored in LAYOUT_DIR/scores/SCORE-kK-sS.json (`random`: drawn, per `--random-seeds`).
Layouts are named as `benchmarks.long_context` names them (`k64-s4-f0.5-gate`, `k64-s4-f0.5-random-seed0`). For
each layout, length and task, the first `--samples` records get greedy predictions of the task's `max_new_tokens`
(RULER's tokens_to_generate) after `input + answer_prefix`; `--prompt-format chat` puts `input` in the user turn of
the tokenizer's chat template and starts the reply with `answer_prefix`, as RULER's chat templates do (then the
prompt is the template's tokens longer than the data's `length`, and the bucket L is exceeded by as many: 30 for
SmolLM2-135M-Instruct, whose template adds a system turn). `plain` is the default, as for `benchmarks.long_context`'s
passkeys. `--batch-size` prompts of one task and length are padded on the left and generated together. Resumable:
a task whose prediction file is complete for its settings (model, layout, dtype, device, prompt format, batch size,
the data file's sha256, samples, --keep-inputs) is skipped; files are written whole (a temporary file renamed), so an
interrupted task leaves no file or a stale one, and is redone from the batches it kept (`benchmarks.task_progress`:
{task}.progress.json, a stop loses the batch it was in). After a layout's tasks at L, its continuation
perplexity on `--ppl-blocks` blocks of L tokens (kept likewise). Then the report.

report: OUT/results.json (per length and layout: each task's score and nulls, the average, the average as a share
of the unmodified model's, the worst task's drop from it, the KV share; per KV budget, the hybridized layouts beside
kvpress's presses) and OUT/results.md (a table per length, the project's targets judged per row: at half the cache,
the RULER average at least 95% of the unmodified model's and no task more than 10 points below it; then a row per KV
budget: the best hybridized layout against the best press, and whether it is ahead of every press).

Why a command of its own, not lm-evaluation-harness tasks: lm-eval loads each model itself, so each layout would
have to be a saved checkpoint loaded through `import hf_attn`; here one loaded model is hybridized to every layout
in turn. The records are RULER's files, so RULER's users (and its scripts/eval/evaluate.py) read them as they are.
The model is called in one place, `model_answers`; another runner (kvpress's presses, in an environment of its own)
reads the same data/ files and writes the same pred/ files, which `report` then tables beside these. The files:

- OUT/data/{L}/{task}/validation.jsonl (as RULER's prepare.py writes them): one JSON object per line, `json.dumps`'
  defaults (ASCII, ", " and ": "), each line ending in a newline; keys in this order: `index` (0, 1, ...), `input`
  (the prompt before the answer prefix; no chat template), `outputs` (the reference strings), `length` (tokens of
  `input + answer_prefix` as the data's tokenizer encodes it, special tokens included: at most L - max_new_tokens),
  `answer_prefix`, `task`, and for the needle tasks `depths` (the percent of the haystack before each needle).
- OUT/data/generation.json: {"L/task": {"settings": {"tokenizer", "length" (the prompt's bound), "samples",
  "seed", "haystack_dir"}, "sha256" (of validation.jsonl), "seconds"}}.
- OUT/pred/{layout}/{L}/{task}.jsonl (as RULER's call_api.py writes them): one JSON object per line (same
  serialization), one per data record in the data's order, keys in this order: `index`; `pred`, the greedy
  continuation decoded without special tokens and cut before the first end-of-sequence token (not stripped);
  `input`, "" unless `--keep-inputs` gives the data's `input` (RULER's evaluate.py reads the key; the data file has
  the text); `outputs`, the data's; `others`, a dict: `prompt_tokens` (tokens the model read), `new_tokens`
  (generated before the end-of-sequence token) and the data's `depths` where it has them; `truncation`, -1 (never
  truncated: RULER's value for that); `length`, the data's.
- OUT/pred/{layout}/{L}/summary.csv (as RULER's evaluate.py writes it with pandas): a first line of column numbers
  0,1,...; then `Tasks,<task>,...,average`, `Score,<score>,...,<average>` and `Nulls,<n>/<count>,...,<n>/<count>`:
  tasks in RULER's order, those with a prediction file; a score is `string_match_all` (`hf_attn.ruler.score`, 0-100,
  2 decimals) written as Python writes a float (100.0); the average is the tasks' mean, 2 decimals; a null is a
  prediction empty after RULER's postprocessing (stripped, control characters made newlines, stripped).
- OUT/pred/{layout}/layout.json: `name`, `kv_share` (KV-cache bytes per token at long context as a share of the
  unmodified model's, null if unknown), `kv_share_at` ({"L": the share the cache holds at L tokens, windows and sinks
  counted}), `description`; from this runner also `config`, `head_layout`, `local_groups`, `groups`, `scores_file`.
  Optional for another runner: without it the report's KV share is "n/a".
- OUT/pred/{layout}/{L}/continuation.json (`--ppl-blocks` > 0): WikiText-2 perplexity of a continuation over the
  context's cache (`benchmarks.continuation`, the same measure kvpress's runner takes of a press): `perplexity`,
  `nll`, `scored_tokens`, `blocks`, `block_tokens`, `context_tokens`, `tokens_sha256`, and the run's `settings`,
  `started`, `seconds`, `device`, `machine`.
- OUT/pred/{layout}/{L}/{task}.run.json: this runner's own resume record (settings, sha256 of the prediction file,
  start time, seconds, device, `uptime` before and after; `parts`: the runs that answered it, when more than one);
  another runner leaves it out.
The report reads every OUT/pred/{layout}/{L}/{task}.jsonl (`pred` and `outputs`), layout.json where there is one,
the `*.run.json` records (device, dtype, seconds, `uptime`) where there are some, and data/generation.json's seeds
and tokenizers; the layout named `unmodified` is the reference.
"""

import argparse
import functools
import itertools
import json
import re
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import transformers
from transformers import AutoTokenizer, GenerationConfig

from benchmarks import continuation, float32_products, paired_bootstrap, ruler_files, task_progress
from benchmarks.common import command_line_parser, describe_machine, machine_load
from benchmarks.hybrid_speed import TINY_LLAMA
from benchmarks.long_context_configs import SCORE_NAMES, UNMODIFIED, Config, layout_for
from benchmarks.records import jsonl, read_json, read_jsonl, sha256, write_whole
from benchmarks.ruler_files import (
    RUN_RECORDS,
    average,
    complete,
    data_path,
    missing_data,
    pred_folder,
    predictions_and_references,
    task_results,
    write_summary,
)
from benchmarks.serving import code_version, local_groups, score_path
from hf_attn import hybridize, ruler
from hf_attn.experiments.arguments import below_minimums
from hf_attn.hybrid import cache_bytes_per_token, num_key_value_heads, original_cache_bytes_per_token
from hf_attn.pretrained import load_causal_lm, load_tokenizer, source_argument

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PROMPT_FORMATS = ("plain", "chat")
# Defaults left None on the command line: the full run's, and --quick's.
SIZES = {
    "lengths": ([4096, 8192], [1024]),  # --quick: vt's one-shot example alone is ~500 GPT-2 tokens; 1024 fits all
    "samples": (20, 2),  # generate's; run's default is every record of the data
    "local_windows": ([64, 256], [64]),
    "sink_tokens": ([4], [4]),
    "fractions": ([0.5], [0.5]),
    "scores": (["gate", "retrieval"], ["random"]),
    "batch_size": (1, 2),
    "ppl_blocks": (continuation.BLOCKS, 2),
    "threads": (None, 1),  # --quick: on a busy 2-core machine one thread decodes the tiny model 20x faster than two
    "output_dir": ("outputs/ruler", "outputs/ruler-quick"),
}
MODEL = "smollm2-135m-instruct"
QUICK_MODEL = "tiny-random-llama"
QUICK_TOKENIZER = "../shared/data/gpt2-tokenizer"
HAYSTACK_DIR = "../shared/data/wikitext-2-raw"
LAYOUT_DIR = "docs/results/long_context/smollm2-135m-instruct"
# The project's targets for a hybridized model keeping at most TARGET_KV_SHARE of the unmodified model's KV bytes per
# token: a RULER average at least TARGET_AVERAGE of the unmodified model's, no task more than TARGET_DROP points below.
TARGET_KV_SHARE, TARGET_AVERAGE, TARGET_DROP = 0.5, 0.95, 10.0
# kvpress's presses that reload the tokenizer from a saved copy (benchmarks/kvpress/run_presses.py checks it).
TOKENIZER_RELOADING = ("kvpress-duo_attention", "kvpress-kvzip")


# --- the command line ----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = command_line_parser("benchmarks.ruler", __doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{generate,run,report}")
    generate = commands.add_parser("generate", help="write OUT/data/{L}/{task}/validation.jsonl")
    run = commands.add_parser("run", help="write OUT/pred/{layout}/{L}/{task}.jsonl and summary.csv, then the report")
    report = commands.add_parser("report", help="write OUT/results.json and results.md from OUT/pred alone")
    for command in (generate, run):
        add = command.add_argument
        add("--lengths", type=int, nargs="+", help=f"RULER's buckets L: prompt + generated tokens <= L (default "
            f"{SIZES['lengths'][0]}, --quick {SIZES['lengths'][1]})")  # fmt: skip
        add("--tasks", nargs="+", choices=list(ruler.TASKS), default=list(ruler.TASKS), help="default: all 11")
        add("--tokenizer", type=source_argument, help=f"whose tokens the lengths count: Hub id, folder, .gguf file or "
            f"hf_attn.pretrained short name (default: the model's, {MODEL}; --quick {QUICK_TOKENIZER})")  # fmt: skip
        add("--haystack-dir", default=HAYSTACK_DIR, help="folder of WikiText-2's wiki.test.raw, the essay tasks' "
            "haystack (run: with --quick only, which generates its data)")  # fmt: skip
        add("--seed", type=int, default=42, help="the records' seed (RULER's default; run: with --quick only)")
    generate.add_argument("--samples", type=int, help=f"records per task and length (default {SIZES['samples'][0]})")
    add = run.add_argument
    add("--samples", type=int, help="the first N records of each data file (default: all; --quick 2)")
    add("--model", type=source_argument, help=f"Hub id, folder, .gguf file or hf_attn.pretrained short name (default "
        f"{MODEL}; not with --quick)")  # fmt: skip
    add("--local-windows", type=int, nargs="+", help=f"k: previous tokens a local head sees (default "
        f"{SIZES['local_windows'][0]})")  # fmt: skip
    add("--sink-tokens", type=int, nargs="+", help="first tokens local heads also see (default [4])")
    add("--fractions", type=float, nargs="+", help="shares of key/value groups made local (default [0.5])")
    add("--scores", nargs="+", choices=SCORE_NAMES, help=f"what ranks the groups (default {SIZES['scores'][0]}; "
        "--quick random)")  # fmt: skip
    add("--random-seeds", type=int, nargs="+", default=[0], help="the random layouts' seeds")
    add("--layouts-only", action="store_true", help="the hybridized layouts alone, the unmodified model's predictions "
        "left as they are (by default it runs first, its complete tasks kept)")  # fmt: skip
    add("--layout-dir", default=LAYOUT_DIR, help="a benchmarks.long_context output folder: its "
        "scores/SCORE-kK-sS.json ranks the key/value groups")  # fmt: skip
    add("--prompt-format", choices=PROMPT_FORMATS, default="plain", help="plain: input + answer_prefix; chat: input "
        "in the chat template's user turn, the reply begun with answer_prefix")  # fmt: skip
    add("--device", default="cpu", help="cpu, cuda or cuda:N")
    add("--dtype", choices=list(DTYPES), help="default bfloat16 on cuda, float32 on cpu")
    add("--batch-size", type=int, help="prompts of one task and length generated together, padded on the left "
        "(default 1, --quick 2)")  # fmt: skip
    add("--threads", type=int, help="torch threads (default: torch's; --quick 1)")
    add("--float32-products", action="store_true", help=float32_products.HELP)
    add("--ppl-blocks", type=int, help=f"WikiText-2 test blocks of L tokens for the continuation perplexity "
        f"(benchmarks/continuation.py; default {continuation.BLOCKS}, --quick 2; 0: none)")  # fmt: skip
    add("--ppl-text", help="the continuation perplexity's text (default: --haystack-dir's wiki.test.raw)")
    add("--keep-inputs", action="store_true", help="write each prompt's input into its prediction record (RULER "
        "does; default '': the data file has it, and 11 tasks x 8K-token inputs per layout add up)")  # fmt: skip
    add("--quick", action="store_true", help="a tiny random Llama and GPT-2's tokenizer at 1024 tokens, 2 samples, a "
        "random layout: generates its data, runs, reports; the plumbing, not the targets")  # fmt: skip
    for command in (generate, run, report):
        command.add_argument("--output-dir", help=f"default {SIZES['output_dir'][0]} (run --quick: "
                             f"{SIZES['output_dir'][1]})")  # fmt: skip
    args = parser.parse_args(argv)
    finish_arguments(args)
    if problems := argument_problems(args):
        parser.error("; ".join(problems))
    return args


def finish_arguments(args: argparse.Namespace) -> None:
    """Each size left out takes the full run's default or --quick's; the model, tokenizer and dtype theirs."""
    args.quick = getattr(args, "quick", False)
    for name, defaults in SIZES.items():
        if getattr(args, name, False) is None and not (name == "samples" and args.command == "run" and not args.quick):
            setattr(args, name, defaults[args.quick])
    if args.command == "run":
        given_model, args.model = args.model, args.model or (QUICK_MODEL if args.quick else MODEL)
        args.tokenizer = args.tokenizer or (QUICK_TOKENIZER if args.quick else args.model)
        args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
        args.given_model = given_model
        args.ppl_text = args.ppl_text or str(Path(args.haystack_dir) / "wiki.test.raw")
    elif args.command == "generate":
        args.tokenizer = args.tokenizer or MODEL


def argument_problems(args) -> list[str]:
    """Every invalid argument at once, each naming the flag and what it allows, before any model or tokenizer loads."""
    folder = Path(args.output_dir)
    if args.command == "report":
        return [] if (folder / "pred").is_dir() else [f"--output-dir must hold pred/ (written by `python -m "
                                                      f"benchmarks.ruler run`), got {folder}"]  # fmt: skip
    minimums = {"samples": 1} | ({"batch_size": 1, "threads": 1, "ppl_blocks": 0} if args.command == "run" else {})
    problems = [problem.replace("_", "-") for problem in below_minimums(args, minimums, prefix="--")]
    longest = max(ruler.TASKS[task].max_new_tokens for task in args.tasks)
    if min(args.lengths) <= longest:
        problems.append(f"--lengths must all be > {longest} (the tokens --tasks generate), got {args.lengths}")
    if args.command == "generate" or args.quick:
        essays = [t for t in args.tasks if getattr(ruler.TASKS[t], "haystack", None) == "essay"]
        if essays and not (Path(args.haystack_dir) / "wiki.test.raw").is_file():
            problems.append(f"--haystack-dir must be a folder holding wiki.test.raw (WikiText-2 raw) for {essays}, "
                            f"got {args.haystack_dir}")  # fmt: skip
    if args.command == "run":
        problems += run_problems(args)
    return problems


def run_problems(args) -> list[str]:
    problems = []
    if min(args.local_windows) < 1:
        problems.append(f"--local-windows must all be >= 1, got {args.local_windows}")
    if min(args.sink_tokens) < 0:
        problems.append(f"--sink-tokens must all be >= 0, got {args.sink_tokens}")
    if any(not 0 < fraction <= 1 for fraction in args.fractions):
        problems.append(f"--fractions must all be in (0, 1], got {args.fractions}")
    problems += float32_products.argument_problems(args.float32_products, args.dtype)
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        problems.append(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    elif args.device.startswith("cuda") and not torch.cuda.is_available():
        problems.append(f"--device {args.device} needs a GPU that torch sees; use cpu")
    if args.ppl_blocks and not Path(args.ppl_text).is_file():
        problems.append(f"--ppl-text must be a text file (WikiText-2's wiki.test.raw) for --ppl-blocks "
                        f"{args.ppl_blocks}, got {args.ppl_text}")  # fmt: skip
    if args.quick and args.given_model:
        problems.append("--quick makes its own tiny model: drop --model")
    for window, sinks, score in itertools.product(args.local_windows, args.sink_tokens, args.scores):
        path = score_file(args, window, sinks, score)
        if path is not None and not path.is_file():
            problems.append(f"--layout-dir must hold scores/{path.name} (benchmarks.long_context writes it with "
                            f"--scores {score}), got {args.layout_dir}")  # fmt: skip
    if not args.quick:
        problems += missing_data(Path(args.output_dir), args.lengths, args.tasks, args.samples)
    return problems


# --- generate ------------------------------------------------------------------------------------------------------


def generate_data(args) -> dict:
    """OUT/data/{L}/{task}/validation.jsonl for every length and task, and OUT/data/generation.json; a file whose
    settings and bytes are the recorded ones is left alone, one generated again identical is not rewritten."""
    folder = Path(args.output_dir)
    manifest_path = folder / "data" / "generation.json"
    manifest = read_json(manifest_path) or {}
    tokenizer = None
    for length, task in itertools.product(args.lengths, args.tasks):
        path, key = data_path(folder, length, task), f"{length}/{task}"
        settings = {"tokenizer": args.tokenizer, "length": length - ruler.TASKS[task].max_new_tokens,
                    "samples": args.samples, "seed": args.seed, "haystack_dir": args.haystack_dir}  # fmt: skip
        entry = manifest.get(key, {})
        if entry.get("settings") == settings and path.is_file() and sha256(path.read_text("utf-8")) == entry["sha256"]:
            continue
        tokenizer = tokenizer or load_tokenizer(args.tokenizer)
        start = time.perf_counter()
        text = jsonl(ruler.generate(task, tokenizer, settings["length"], args.samples, args.seed, args.haystack_dir))
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            write_whole(path, text)
        manifest[key] = {"settings": settings, "sha256": sha256(text), "seconds": time.perf_counter() - start}
        write_whole(manifest_path, json.dumps(manifest, indent=1) + "\n")
        print(f"{path}: {args.samples} records in {manifest[key]['seconds']:.1f} s", flush=True)
    return manifest


# --- run: the model ------------------------------------------------------------------------------------------------


def prompt_ids(tokenizer, record: dict, prompt_format: str) -> list[int]:
    """The ids the model reads: `input + answer_prefix` (the tokenizer's own special tokens, as the data's `length`
    counts them), or `input` as the chat template's user turn and the reply begun with `answer_prefix`."""
    if prompt_format == "plain":
        return tokenizer(record["input"] + record["answer_prefix"], verbose=False).input_ids
    turn = tokenizer.apply_chat_template([{"role": "user", "content": record["input"]}], tokenize=False,
                                         add_generation_prompt=True)  # fmt: skip
    return tokenizer(turn + record["answer_prefix"], add_special_tokens=False, verbose=False).input_ids


@torch.inference_mode()
def model_answers(model, tokenizer, prompt_format: str, records: list[dict]) -> list[dict]:
    """The only model call: greedy `generate` of the task's `max_new_tokens` after each record's prompt, the records
    (one task) padded on the left into one batch. Per record: `pred`, the continuation cut before the first
    end-of-sequence token and decoded without special tokens, and what goes into its `others`."""
    ids = [prompt_ids(tokenizer, record, prompt_format) for record in records]
    eos = model.generation_config.eos_token_id
    eos = {*(eos if isinstance(eos, list) else [eos]), tokenizer.eos_token_id} - {None}
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos, default=0)
    width = max(map(len, ids))
    input_ids = torch.tensor([[pad] * (width - len(row)) + row for row in ids], device=model.device)  # (B, T)
    attention_mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in ids], device=model.device)
    generation = GenerationConfig(do_sample=False, max_new_tokens=ruler.TASKS[records[0]["task"]].max_new_tokens,
                                  eos_token_id=sorted(eos) or None, pad_token_id=pad)  # fmt: skip
    output = model.generate(input_ids, attention_mask=attention_mask, generation_config=generation)
    answers = []
    for prompt, generated in zip(ids, output[:, width:].tolist(), strict=True):
        cut = next((i for i, token in enumerate(generated) if token in eos), len(generated))
        answers.append({"pred": tokenizer.decode(generated[:cut], skip_special_tokens=True),
                        "prompt_tokens": len(prompt), "new_tokens": cut})  # fmt: skip
    return answers


def load(args) -> tuple:
    """The model in `--dtype` on `--device`, eval mode, and the tokenizer; --quick: a tiny random Llama (seed 0) as
    wide as the tokenizer's vocabulary."""
    if args.quick:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        torch.manual_seed(0)
        config = transformers.LlamaConfig(
            **TINY_LLAMA | {"vocab_size": len(tokenizer), "max_position_embeddings": max(args.lengths)},
            bos_token_id=None,
            eos_token_id=tokenizer.eos_token_id,
        )
        model = transformers.LlamaForCausalLM(config).to(DTYPES[args.dtype])
    else:  # `dtype` when loading: `.to` after would round the rotary frequencies too
        model, tokenizer = load_causal_lm(args.model, dtype=DTYPES[args.dtype]), load_tokenizer(args.tokenizer)
    if args.prompt_format == "chat" and not tokenizer.chat_template:  # refused here, not mid-run
        raise SystemExit(f"--prompt-format chat needs a tokenizer with a chat template; {args.tokenizer}'s has none: "
                         "use --prompt-format plain")  # fmt: skip
    return model.to(args.device).eval(), tokenizer


def score_file(args, window: int, sinks: int, score: str) -> Path | None:
    if score == "random":
        return None
    return score_path(argparse.Namespace(layout_dir=args.layout_dir, score=score, local_window=window,
                                         sink_tokens=sinks))  # fmt: skip


def configurations(args) -> list[Config]:
    """The unmodified model first (hybridize works in place; not with --layouts-only), then every (k, S, share,
    score[, seed])."""
    configs = [] if args.layouts_only else [UNMODIFIED]
    for window, sinks, fraction, score in itertools.product(args.local_windows, args.sink_tokens, args.fractions,
                                                            args.scores):  # fmt: skip
        seeds = args.random_seeds if score == "random" else [None]
        configs += [Config(window, sinks, fraction, score, seed) for seed in seeds]
    return configs


# What each score reads of its calibration text (`hf_attn.select_heads`).
CALIBRATED_ON = {"loss": "the language-modelling loss on", "mass": "attention weights on",
                 "gate": "passkeys hidden in", "retrieval": "passkeys hidden in",
                 "gate_tasks": "these tasks' templates (2 samples of each, seed 0) around",
                 "reach": "mean queries and keys over"}  # fmt: skip


def calibration(path: Path) -> str:
    """What a stored score was calibrated on and what it cost, from its `benchmarks.long_context` record."""
    record = json.loads(path.read_text())
    settings, score = record["settings"], path.name.split("-k")[0]
    text = "WikiText-2 validation text" if settings["data_dir"] else "WikiText-2 train text (the Hub's)"
    return (f"{score}: {CALIBRATED_ON.get(score, 'its calibration on')} {settings['calibration_blocks']} blocks of "
            f"{settings['calibration_block_size']:,} tokens of {text}, "
            f"{record['score_seconds'] / 60:.1f} min in {settings['dtype']} on {settings['device']}")  # fmt: skip


def apply_layout(model, config: Config, args) -> dict:
    """Hybridizes `model` to `config` (the unmodified model stays as loaded); what layout.json says of it."""
    if config == UNMODIFIED:
        return {"name": config.name, "description": "the model as loaded", "kv_share": 1.0,
                "kv_share_at": {str(length): 1.0 for length in args.lengths}, "config": None}  # fmt: skip
    path = score_file(args, config.local_window, config.sink_tokens, config.score)
    scores = None if path is None else json.loads(path.read_text())["scores"]
    layout = layout_for(config, scores, model.config)
    hybridize(model, head_layout=layout, local_window=config.local_window, sink_tokens=config.sink_tokens)
    original = original_cache_bytes_per_token(model.config)
    groups = model.config.num_hidden_layers * num_key_value_heads(model.config)
    local = local_groups(layout, model.config)
    ranked = f"at random (seed {config.seed})" if path is None else f"ranked by {path} ({calibration(path)})"
    return {"name": config.name, "kv_share": cache_bytes_per_token(model.config) / original,
            "kv_share_at": {str(length): cache_bytes_per_token(model.config, context_tokens=length) / original
                            for length in args.lengths},
            "description": f"{local} of {groups} key/value groups {config.local_window}-local with "
                           f"{config.sink_tokens} sinks, {ranked}",
            "config": asdict(config), "local_groups": local, "groups": groups,
            "scores_file": None if path is None else str(path), "head_layout": layout}  # fmt: skip


# --- run: predictions ----------------------------------------------------------------------------------------------


def prediction(record: dict, answer: dict, keep_input: bool) -> dict:
    """RULER's prediction record for a data record and its answer (the answer's other fields under `others`)."""
    return ruler_files.prediction(record, answer["pred"], {k: v for k, v in answer.items() if k != "pred"}, keep_input)


def predict_task(answer, records: list[dict], folder: Path, task: str, settings: dict, args) -> None:
    """FOLDER/TASK.jsonl from `answer` (records of one batch -> their answers) on `--batch-size` records at a time,
    then FOLDER/TASK.run.json, each written whole; the batches answered so far are kept (`benchmarks.task_progress`),
    so a run stopped inside the task resumes it."""
    batches = [records[first : first + args.batch_size] for first in range(0, len(records), args.batch_size)]
    answers, run = task_progress.answer_batches(folder, task, settings, batches, answer, machine_load)
    predictions = [prediction(record, reply, args.keep_inputs) for record, reply in zip(records, answers, strict=True)]
    text = jsonl(predictions)
    write_whole(folder / f"{task}.jsonl", text)
    write_whole(folder / f"{task}.{RUN_RECORDS['layouts']}", json.dumps({
        "settings": settings, "sha256": sha256(text), "device": describe_machine(args.device)} | run,
        indent=1) + "\n")  # fmt: skip
    task_progress.clear(folder, task)
    print(f"{folder / task}: {ruler.score(task, *predictions_and_references(predictions))} in "
          f"{run['seconds']:.1f} s", flush=True)  # fmt: skip


def measure_continuation(model, blocks: torch.Tensor, out: Path, layout: dict, args) -> None:
    """OUT/continuation.json: the layout's continuation perplexity (`benchmarks.continuation`), kept where its
    settings are the same."""
    settings = {"model": args.model, "tokenizer": args.tokenizer, "head_layout": layout.get("head_layout"),
                "config": layout["config"], "dtype": args.dtype, "device": args.device, "text": args.ppl_text,
                "blocks": args.ppl_blocks} | float32_products.setting(args.float32_products)  # fmt: skip
    measuring = functools.partial(continuation.measure, model, blocks)
    continuation.measured(out / continuation.FILE, settings, measuring, machine_load, describe_machine(args.device))


def run_suite(args) -> None:
    """Every layout's predictions (skipping complete ones), summaries and continuation perplexity."""
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = Path(args.output_dir)
    model, tokenizer = load(args)
    answer = functools.partial(model_answers, model, tokenizer, args.prompt_format)
    blocks = functools.cache(functools.partial(continuation.wikitext_blocks, tokenizer, Path(args.ppl_text),
                                               count=args.ppl_blocks))  # fmt: skip
    for config in configurations(args):
        layout, path = apply_layout(model, config, args), folder / "pred" / config.name / "layout.json"
        layout["kv_share_at"] = (read_json(path) or {}).get("kv_share_at", {}) | layout["kv_share_at"]  # all lengths
        write_whole(path, json.dumps(layout, indent=1) + "\n")
        for length in args.lengths:
            out = pred_folder(folder, config.name, length)
            for task in args.tasks:
                text = data_path(folder, length, task).read_text(encoding="utf-8")
                records = [json.loads(line) for line in text.splitlines()][: args.samples]
                settings = {"model": args.model, "tokenizer": args.tokenizer, "head_layout":
                            layout.get("head_layout"), "config": layout["config"], "dtype": args.dtype,
                            "device": args.device, "prompt_format": args.prompt_format, "batch_size": args.batch_size,
                            "data_sha256": sha256(text), "samples": len(records),
                            "keep_inputs": args.keep_inputs}  # fmt: skip
                settings |= float32_products.setting(args.float32_products)
                if complete(out, task, settings, RUN_RECORDS["layouts"]):
                    print(f"{out / task}: complete, kept", flush=True)
                    continue
                predict_task(answer, records, out, task, settings, args)
            write_summary(out, ruler.TASKS)
            if args.ppl_blocks:
                measure_continuation(model, blocks(length=length), out, layout, args)


# --- scores --------------------------------------------------------------------------------------------------------


def record_scores(folder: Path) -> dict[str, dict[int, float]]:
    """Per task with a prediction file in FOLDER: each record's `match_fraction` (0-1) by its index."""
    scores = {}
    for task in ruler.TASKS:
        if (path := folder / f"{task}.jsonl").is_file():
            records = read_jsonl(path)
            preds, references = predictions_and_references(records)
            scores[task] = {record["index"]: ruler.match_fraction(pred, outputs)
                            for record, pred, outputs in zip(records, preds, references, strict=True)}  # fmt: skip
    return scores


# --- report --------------------------------------------------------------------------------------------------------


def layout_names(folder: Path) -> list[str]:
    """The layouts in OUT/pred: unmodified first, then by name."""
    names = sorted(path.name for path in (folder / "pred").iterdir() if path.is_dir())
    return sorted(names, key=lambda name: name != UNMODIFIED.name)


def row(results: dict[str, dict], reference: dict[str, dict] | None, layout: dict, length: str) -> dict:
    """One layout at one length: its scores, average and KV share; against the unmodified model, the average's share
    of its average, the worst task's drop (points) and whether the targets hold (None: not judged)."""
    kv_share = layout.get("kv_share")
    figures = {"scores": {task: result["score"] for task, result in results.items()},
               "nulls": {task: f"{result['nulls']}/{result['samples']}" for task, result in results.items()},
               "samples": sorted({result["samples"] for result in results.values()}), "average": average(results),
               "kv_share": kv_share, "kv_share_at": layout.get("kv_share_at", {}).get(length),
               "description": layout.get("description")}  # fmt: skip
    shared = [task for task in reference or {} if task in results]
    if results is reference or not shared:
        return figures
    drops = {task: reference[task]["score"] - results[task]["score"] for task in shared}
    worst = max(drops, key=drops.get)
    baseline = sum(reference[task]["score"] for task in shared)  # both averages over the tasks both have
    share = sum(results[task]["score"] for task in shared) / baseline if baseline else None
    judged = share is not None and shared == list(reference) and (kv_share is None or kv_share <= TARGET_KV_SHARE)
    meets = share >= TARGET_AVERAGE and drops[worst] <= TARGET_DROP if judged else None
    return figures | {"average_share": share, "worst_task": worst, "worst_drop": drops[worst], "meets_targets": meets}


def budget_level(kv_share: float) -> str:
    """The KV budget a share belongs to, to the nearest 0.05: one budget for a layout and a press whose head counts
    round 0.25 of the groups differently (0.744 and 0.756 of the cache)."""
    return f"{round(kv_share * 20) / 20:.2f}"


def budgets(rows: dict[str, dict], layouts: dict[str, dict], scores: dict[str, dict]) -> dict[str, dict]:
    """Hybridized layouts (`config` in layout.json) beside kvpress's presses (`runner`) at each KV budget below the
    whole cache, the rows with every task of the unmodified model's only: each kind best first, and the best
    hybridized layout's average less the best press's (`ahead`: above every press; None where a kind is missing) with
    its 95% interval (`paired_interval`, from SCORES: per row, `record_scores`; None where the records differ)."""
    tasks = set(rows.get(UNMODIFIED.name, {}).get("scores", {}))
    grouped: dict[str, dict[str, list]] = {}
    for name, figures in rows.items():
        kind = "presses" if layouts[name].get("runner") else "hybridized" if layouts[name].get("config") else None
        share = figures["kv_share"]
        if kind and share is not None and share < 1 and set(figures["scores"]) == tasks:
            group = grouped.setdefault(budget_level(share), {"hybridized": [], "presses": []})
            group[kind].append({"name": name, "average": figures["average"], "kv_share": share})
    table = {}
    for level, group in sorted(grouped.items(), key=lambda item: -float(item[0])):
        for entries in group.values():
            entries.sort(key=lambda entry: -entry["average"])
        both = group["hybridized"] and group["presses"]
        margin = group["hybridized"][0]["average"] - group["presses"][0]["average"] if both else None
        pair = [scores[group[kind][0]["name"]] for kind in ("hybridized", "presses")] if both else None
        interval = paired_interval(*pair) if pair else None
        table[level] = group | {"margin": margin, "ahead": None if margin is None else margin > 0, "interval": interval}
    return table


def paired_interval(first: dict[str, dict], second: dict[str, dict]) -> list[float] | None:
    """`paired_bootstrap.difference_interval` of two rows' `record_scores`, where they scored the same records."""
    if first.keys() != second.keys() or any(first[task].keys() != second[task].keys() for task in first):
        return None
    in_order = [{task: [by_index[index] for index in sorted(by_index)] for task, by_index in row.items()}
                for row in (first, second)]  # fmt: skip
    return list(paired_bootstrap.difference_interval(*in_order))


def runs_of(folder: Path) -> dict:
    """What the run records say of a layout's predictions: devices, dtypes, seconds, `uptime` first and last."""
    records = sorted((record for path in folder.glob("*/*.run.json") if (record := read_json(path))),
                     key=lambda record: record["started"])  # fmt: skip
    if not records:
        return {}
    return {"devices": sorted({record["device"] for record in records}),
            "dtypes": sorted({float32_products.dtype_name(record["settings"]) for record in records}),
            "prompt_formats": sorted({record["settings"]["prompt_format"] for record in records}),
            "models": sorted({record["settings"]["model"] for record in records}),
            "seconds": sum(record["seconds"] for record in records),
            "uptime_first": records[0]["machine"]["before"]["uptime"],
            "uptime_last": records[-1]["machine"]["after"]["uptime"]}  # fmt: skip


def results(folder: Path, argv: list[str]) -> dict:
    """results.json: per length and layout, `row`; the layouts' records; the data's settings; the machine."""
    names = layout_names(folder)
    layouts = {name: read_json(folder / "pred" / name / "layout.json") or {"name": name} for name in names}
    lengths = sorted({path.name for name in names for path in (folder / "pred" / name).iterdir()
                      if path.is_dir() and path.name.isdigit()}, key=int)  # fmt: skip
    table, by_budget = {}, {}
    for length in lengths:
        per_layout = {name: task_results(pred_folder(folder, name, int(length)), ruler.TASKS) for name in names}
        per_layout = {name: figures for name, figures in per_layout.items() if figures}
        reference = per_layout.get(UNMODIFIED.name)
        table[length] = {name: row(figures, reference, layouts[name], length) for name, figures in per_layout.items()}
        for name, figures in table[length].items():
            if record := read_json(pred_folder(folder, name, int(length)) / continuation.FILE):
                figures["continuation"] = {key: record[key] for key in CONTINUATION_KEYS}
        scores = {name: record_scores(pred_folder(folder, name, int(length))) for name in per_layout}
        by_budget[length] = budgets(table[length], layouts, scores)
    data = read_json(folder / "data" / "generation.json") or {}
    return {"command": shlex.join(["python", "-m", "benchmarks.ruler", *argv]), "lengths": table, "budgets": by_budget,
            "layouts": {name: {key: value for key, value in layout.items() if key != "head_layout"}
                        for name, layout in layouts.items()},
            "runs": {name: runs_of(folder / "pred" / name) for name in names},
            "data": {"seeds": sorted({entry["settings"]["seed"] for entry in data.values()}),
                     "tokenizers": sorted({entry["settings"]["tokenizer"] for entry in data.values()})},
            "targets": {"kv_share_at_most": TARGET_KV_SHARE, "average_share_at_least": TARGET_AVERAGE,
                        "worst_drop_at_most": TARGET_DROP},
            "code": code_version(), "machine": machine_load(),
            "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                         "python": sys.version.split()[0]}}  # fmt: skip


CONTINUATION_KEYS = ("perplexity", "blocks", "block_tokens", "context_tokens", "scored_tokens", "tokens_sha256")


def number(value: float | None) -> str:
    """A score as RULER rounds it, without trailing zeros (100, 96.25)."""
    return "n/a" if value is None else format(round(value, 2), "g")


def kv_cell(figures: dict) -> str:
    """The KV share at long context, and at the table's length where windows and sinks make it differ."""
    share, here = figures["kv_share"], figures["kv_share_at"]
    if share is None:
        return "n/a"
    return f"{share:.2f}" + ("" if here is None or abs(here - share) < 0.005 else f" ({here:.2f} here)")


def verdict(figures: dict) -> str:
    if "meets_targets" not in figures:
        return "-"
    return {True: "yes", False: "**no**", None: "n/a"}[figures["meets_targets"]]


def perplexity_cell(figures: dict, reference: dict | None) -> str:
    """The continuation perplexity, and its change against the unmodified model's where both read the same blocks."""
    if "continuation" not in figures:
        return "-"
    mine, theirs = figures["continuation"], (reference or {}).get("continuation")
    if figures is reference or not theirs or theirs["tokens_sha256"] != mine["tokens_sha256"]:
        return f"{mine['perplexity']:.2f}"
    return f"{mine['perplexity']:.2f} ({mine['perplexity'] / theirs['perplexity'] - 1:+.1%})"


def continuation_note(rows: dict[str, dict]) -> list[str]:
    records = [figures["continuation"] for figures in rows.values() if "continuation" in figures]
    if not records:
        return []
    shapes = sorted({(r["blocks"], r["block_tokens"], r["context_tokens"]) for r in records})
    read = "; ".join(f"{blocks} blocks of {size:,} tokens, the first {context:,} the context"
                     for blocks, size, context in shapes)  # fmt: skip
    differ = len({r["tokens_sha256"] for r in records}) > 1
    return [f"Continuation perplexity (benchmarks/continuation.py): WikiText-2 test, {read}; each later token after "
            f"the first predicted over the context's cache as the layout or press leaves it; in brackets, against "
            f"the unmodified model's" + (" (**the rows' blocks differ**: their tokens' sha256 are not all the same)."
                                         if differ else "."), ""]  # fmt: skip


def length_table(length: str, rows: dict[str, dict]) -> list[str]:
    tasks = [task for task in ruler.TASKS if any(task in figures["scores"] for figures in rows.values())]
    perplexity = any("continuation" in figures for figures in rows.values())
    header = ["layout", *tasks, "average", "/ unmodified", "worst drop (points)",
              *(["continuation perplexity"] if perplexity else []), "KV share", "targets met"]  # fmt: skip
    lines = [f"## {int(length):,} tokens", "", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for name, figures in rows.items():
        share = figures.get("average_share")
        worst = f"{number(figures['worst_drop'])} ({figures['worst_task']})" if "worst_task" in figures else "-"
        cells = [name, *(number(figures["scores"][task]) if task in figures["scores"] else "-" for task in tasks),
                 number(figures["average"]), "-" if share is None else f"{share:.1%}", worst,
                 *([perplexity_cell(figures, rows.get(UNMODIFIED.name))] if perplexity else []), kv_cell(figures),
                 verdict(figures)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    samples = sorted({n for figures in rows.values() for n in figures["samples"]})
    lines += ["", f"Targets, at half the cache (KV share <= {TARGET_KV_SHARE:g}): a RULER average at least "
              f"{TARGET_AVERAGE:.0%} of the unmodified model's and no task more than {TARGET_DROP:g} points below "
              f"it; n/a: a row keeping more than half the cache, or lacking a task. Samples per task: "
              f"{', '.join(map(str, samples))}.", ""]  # fmt: skip
    return lines + continuation_note(rows)


def budget_table(length: str, levels: dict[str, dict]) -> list[str]:
    if not levels:
        return []
    header = ["KV share", "best hybridized layout", "average", "best press", "average", "difference (points)",
              "95% interval", "hybridized ahead of every press", "every row, best first"]  # fmt: skip
    lines = [f"### {int(length):,} tokens: hybridized layouts beside kvpress's presses, by KV budget", "",
             "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]  # fmt: skip
    for level, group in levels.items():
        best = [(group[kind][0]["name"], number(group[kind][0]["average"])) if group[kind] else ("-", "-")
                for kind in ("hybridized", "presses")]  # fmt: skip
        everyone = sorted(group["hybridized"] + group["presses"], key=lambda entry: -entry["average"])
        ahead = {True: "yes", False: "**no**", None: "n/a"}[group["ahead"]]
        margin = "-" if group["margin"] is None else f"{group['margin']:+.2f}"
        interval = "-" if group.get("interval") is None else "{:+.2f} to {:+.2f}".format(*group["interval"])
        cells = [level, *best[0], *best[1], margin, interval, ahead,
                 ", ".join(f"{entry['name']} {number(entry['average'])}" for entry in everyone)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, "", "Rows with every task of the unmodified model's, grouped by their KV share at long context "
            "to the nearest 0.05; n/a: a budget without a hybridized layout or without a press. 95% interval: of the "
            f"difference, by a paired bootstrap over the records ({paired_bootstrap.RESAMPLES:,} resamples of each "
            "task's records, the same for both rows), for that pair; it leaves out that each is the best of its kind "
            "on these same records.", ""]  # fmt: skip


def unchecked_reloads(layouts: dict[str, dict]) -> list[str]:
    """A note naming the press layouts whose tokenizer reload was not checked: runs of run_presses.py from before it
    checked it (its `save_reloadable`) lack `tokenizer_reload_checked`."""
    names = [name for name, layout in layouts.items()
             if name.startswith(TOKENIZER_RELOADING) and not layout.get("tokenizer_reload_checked")]  # fmt: skip
    if not names:
        return []
    return [
        f"**Not checked: the tokenizer that {', '.join(names)} reloaded.** DuoAttention's calibration and KVzip "
        "read text through a tokenizer kvpress reloads from a saved copy, and transformers 5.2 (kvpress's) "
        "reloads a GGUF file's BPE tokenizer into other ids (SmolLM2-135M-Instruct's: 1,918 ids, many of them "
        "<unk>, for 1,025 of WikiText-2), so these rows' heads may have been chosen on garbled text.",
        "",
    ]


def report(result: dict) -> str:
    """results.md: a table per length, then what each layout is and where and how long it ran."""
    seeds, tokenizers = ", ".join(map(str, result["data"]["seeds"])), ", ".join(result["data"]["tokenizers"])
    lines = ["# RULER's synthetic tasks, unmodified and hybridized", "",
             f"Scores: RULER's string_match_all (0-100) per task; average: the tasks' mean; / unmodified: the average "
             f"as a share of the unmodified model's; worst drop: the most points a task lost against it. KV share: "
             f"KV-cache bytes per token at long context against the unmodified model (in brackets: at the table's "
             f"length, local heads' windows and sinks counted). Data: seed {seeds or 'n/a'}, lengths counted in "
             f"the tokens of {tokenizers or 'n/a'}.", ""]  # fmt: skip
    for length, rows in result["lengths"].items():
        lines += length_table(length, rows) + budget_table(length, result["budgets"].get(length, {}))
    lines += [*unchecked_reloads(result["layouts"]), "Layouts:", ""]
    for name, layout in result["layouts"].items():
        run = result["runs"].get(name) or {}
        where = (
            f" {', '.join(run['models'])}, {', '.join(run['dtypes'])}, {', '.join(run['prompt_formats'])} "
            f"prompts, on {'; '.join(run['devices'])}: {run['seconds'] / 60:.1f} min of predictions; `uptime` "
            f"at the first: `{run['uptime_first']}`, at the last: `{run['uptime_last']}`."
            if run
            else ""
        )
        lines.append(f"- {name}: {layout.get('description') or 'no description'}.{where}")
    code = result["code"]
    changed = f" with uncommitted changes to {', '.join(line[3:] for line in code['uncommitted'])}"
    lines += [
        "",
        f"`{result['command']}` at commit {code['commit']}{changed if code['uncommitted'] else ''}, "
        f"transformers {result['versions']['transformers']}, torch {result['versions']['torch']}.",
    ]
    return "\n".join(lines) + "\n"


def write_report(folder: Path, argv: list[str]) -> str:
    result = results(folder, argv)
    (folder / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (folder / "results.md").write_text(text := report(result))
    return text


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    start, load_at_start = time.perf_counter(), machine_load()
    print(f"load at start: {load_at_start['uptime']}", flush=True)
    if args.command == "generate" or args.quick:
        generate_data(args)
    if args.command == "run":
        with float32_products.products(args.float32_products):
            run_suite(args)
    if args.command != "generate":
        print(write_report(Path(args.output_dir), argv))
    print(f"{time.perf_counter() - start:.1f} s; load at the end: {machine_load()['uptime']}", flush=True)


if __name__ == "__main__":
    main()
