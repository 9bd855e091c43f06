"""The comparison of `benchmarks.serving` over HTTP: the unmodified model served by `transformers serve`, the
hybridized one by `hf_attn.serving.server` (`hf-attn-serve`), both with continuous batching under one cache budget,
each answering concurrent clients.

    python -m benchmarks.serving_http                  # SmolLM2-135M-Instruct, offline (long)
    python -m benchmarks.serving_http --quick          # a tiny random Llama, about a minute
    python -m benchmarks.serving_http --report         # results.md from results.json alone

Two checkpoints are saved to CHECKPOINT_DIR (not committed), each with its tokenizer: the model (`--model`, any
`hf_attn.pretrained` source, float32) unmodified, and hybridized by `hf_attn.hybridize` to the layout
`benchmarks.serving` uses (`head_layout`: the share `--fraction` of key/value groups `--local-window`-local with
`--sink-tokens` sinks, ranked by the score stored in LAYOUT_DIR/scores). `--quick` saves a tiny random Llama instead,
with a byte-level BPE trained here on WikiText-2 text, and a layout drawn at random (seed 0).

One server at a time, on 127.0.0.1 and a free port, offline (`HF_HUB_OFFLINE=1`), both with the same flags:
`--continuous-batching --cb-num-blocks N --cb-block-size P --cb-max-batch-tokens M --device cpu --dtype float32
--enable-log-requests` (a line per request in the server's log, naming continuous batching).
`--num-blocks` counts blocks of the unmodified model's size, as `benchmarks.serving`'s does, so both caches hold the
same bytes (see docs/serving.md). transformers' server leaves its own defaults in place for what it has no flag for:
prefix sharing stays allowed for the unmodified model (the prompts share no prefix), hf_attn's cache has none.

Workload: `benchmarks.serving`'s prompts (`--requests` stretches of WikiText-2 test text, lengths spread evenly over
[`--min-prompt`, `--max-prompt`] tokens, seeded order), decoded to text and sent to `/v1/completions` with
`max_tokens=--new-tokens`, `temperature=0`, `stream=True` with usage, and no end-of-sequence token
(`generation_config={"eos_token_id": -1}`), so that every request generates the same number of tokens on both servers.
`--clients` clients work through the list, each sending its next request when its previous one has ended. After one
short warm-up request, measured per server: generated tokens per second over the run (the tokens the responses'
`usage` counts, over the time from the first request sent to the last response ended), request latency and time to
first token (to the first chunk with text), each p50 and p95, wall time, and errors: a status other than 200, an
error event, a lost connection, or a `usage` other than `--new-tokens` generated tokens (the server cut or stretched
the request). Ratios are hybridized / unmodified. `uptime` is recorded before each server starts and after its run.
Writes OUTPUT_DIR/{results.json, results.md} and CHECKPOINT_DIR/{unmodified,hybridized}/ (a server's log in
CHECKPOINT_DIR/NAME.log). Each server's record is kept in OUTPUT_DIR/runs/ as soon as it is measured: the same
command again, after an interruption, measures only the servers it lacks.
"""

import asyncio
import gc
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import fastapi
import httpx
import torch
import transformers
import uvicorn
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from benchmarks.common import command_line_parser, describe_machine, machine_load, measured_or_stored
from benchmarks.long_context_configs import SCORE_NAMES
from benchmarks.serving import (
    LONGEST_HELD,
    MODELS,
    argument_problems,
    cell,
    code_note,
    code_version,
    head_layout,
    local_groups,
    percentile,
    prompts,
    ratio,
    score_path,
    stored_or_measured,
)
from hf_attn import hybridize
from hf_attn.data.wikitext import load_wikitext
from hf_attn.hybrid import num_key_value_heads
from hf_attn.pretrained import load_causal_lm, load_tokenizer, source_argument

# Defaults (None on the command line): the full run's, and --quick's.
SIZES = {"requests": (64, 12), "min_prompt": (1024, 64), "max_prompt": (8192, 256), "new_tokens": (128, 16),
         "clients": (16, 4), "local_window": (256, 32), "sink_tokens": (4, 2), "score": ("gate", "random")}  # fmt: skip
OUTPUT_DIRS = ("docs/results/serving_http", "outputs/serving_http-quick")  # full, --quick
CHECKPOINT_DIRS = ("outputs/serving_http/checkpoints", "outputs/serving_http-quick/checkpoints")
DEFAULT_MODEL = "smollm2-135m-instruct"
TINY_VOCAB = 512  # --quick's tokenizer: the 256 bytes, one special token, the rest merges
# Each server: the module it runs as `python -m MODULE ARGS... CHECKPOINT`.
SERVERS = {"unmodified": ("transformers.cli.transformers", "serve"), "hybridized": ("hf_attn.serving.server",)}
# The table's rows: a key of each server's record and what it is.
MEASURES = (
    ("tokens_per_second", "generated tokens/s"),
    ("latency_p50_seconds", "request latency, p50 (s)"),
    ("latency_p95_seconds", "request latency, p95 (s)"),
    ("ttft_p50_seconds", "time to first token, p50 (s)"),
    ("ttft_p95_seconds", "time to first token, p95 (s)"),
    ("wall_seconds", "wall time (s)"),
    ("generated_tokens", "tokens generated"),
    ("errors", "errors"),
    ("startup_seconds", "server start, to /health answering (s)"),
)
STARTUP_TIMEOUT = 600  # seconds for a server to load its model and answer /health
REQUEST_TIMEOUT = 3600  # seconds a request may wait: with every client queued on a CPU, minutes are normal


def parse_args(argv: list[str] | None = None):
    parser = command_line_parser("benchmarks.serving_http", __doc__)
    add = parser.add_argument
    add("--model", type=source_argument, help=f"Hub id, folder, .gguf file or hf_attn.pretrained short name "
        f"(default {DEFAULT_MODEL}; not with --quick, which makes a tiny random Llama)")  # fmt: skip
    add("--tokenizer", type=source_argument, help="tokenizer id, folder or .gguf file (default: the model's)")
    add("--data-dir", default="../shared/data/wikitext-2-raw", help="folder of wiki.{valid,test}.raw; '' for the Hub")
    add("--layout-dir", default="docs/results/long_context/smollm2-135m-instruct", help="a benchmarks.long_context "
        "output folder: its scores/SCORE-kK-sS.json ranks the key/value groups")  # fmt: skip
    add("--score", choices=SCORE_NAMES, help="which score ranks the groups (random: seed 0, "
        "no file); default gate (--quick: random)")  # fmt: skip
    add("--fraction", type=float, default=0.5, help="share of key/value groups made local")
    for name, (full, quick) in SIZES.items():
        if name != "score":
            add(f"--{name.replace('_', '-')}", type=int, help=f"default {full} (--quick: {quick})")
    add("--num-blocks", type=int, help=f"--cb-num-blocks of both servers: cache blocks of --page-size tokens of "
        f"the unmodified model (default: room for {LONGEST_HELD} of the longest requests)")  # fmt: skip
    add("--page-size", type=int, default=64, help="--cb-block-size of both servers: tokens per page")
    add("--max-batch-tokens", type=int, default=1024, help="--cb-max-batch-tokens of both servers")
    add("--seed", type=int, default=0, help="the prompts' order and where each is cut from the text")
    add("--threads", type=int, help="OMP_NUM_THREADS of the servers (default: torch's)")
    add("--quick", action="store_true", help="a tiny random Llama at a tiny workload: about a minute")
    add("--report", action="store_true", help="measure nothing: results.md from OUTPUT_DIR/results.json")
    add("--output-dir", help=f"results.json and results.md (default {OUTPUT_DIRS[0]}; --quick: {OUTPUT_DIRS[1]})")
    add("--checkpoint-dir", help=f"the two checkpoints and the servers' logs (default {CHECKPOINT_DIRS[0]}; --quick: "
        f"{CHECKPOINT_DIRS[1]})")  # fmt: skip
    args = parser.parse_args(argv)
    given_model = args.model
    for name, sizes in SIZES.items():
        if getattr(args, name) is None:
            setattr(args, name, sizes[args.quick])
    args.model = args.model or ("tiny-random-llama" if args.quick else DEFAULT_MODEL)
    args.output_dir = args.output_dir or OUTPUT_DIRS[args.quick]
    args.checkpoint_dir = args.checkpoint_dir or CHECKPOINT_DIRS[args.quick]
    if args.num_blocks is None:
        args.num_blocks = -(-LONGEST_HELD * (args.max_prompt + args.new_tokens) // args.page_size)
    problems = argument_problems(args)  # benchmarks.serving's checks: sizes, budget, layout scores, data folder
    if not args.report:
        if args.clients < 1:
            problems.append(f"--clients must be >= 1, got {args.clients}")
        if args.quick and (given_model or args.tokenizer):
            problems.append("--quick makes its own tiny model and tokenizer: drop --model and --tokenizer")
    if problems:
        parser.error("; ".join(problems))
    return args


# --- the checkpoints -----------------------------------------------------------------------------------------------


def tiny_tokenizer(text: str) -> PreTrainedTokenizerFast:
    """A byte-level BPE of `TINY_VOCAB` tokens trained here on `text` (no download). Every byte is in its alphabet, so
    any text encodes."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY_VOCAB, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tokenizer.train_from_iterator([text], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")


def tiny_llama(tokenizer, args) -> LlamaForCausalLM:
    """--quick's model: a Llama of 2 layers, 4 query heads over 2 key/value groups, random weights (seed 0), with
    room for the longest request twice over (the server re-tokenizes the decoded prompts)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2 * (args.max_prompt + args.new_tokens),
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None, pad_token_id=None)  # fmt: skip
    return LlamaForCausalLM(config).eval()


def model_and_tokenizer(args):
    if args.quick:
        tokenizer = tiny_tokenizer(load_wikitext(args.data_dir or None).train_text[:300_000])
        return tiny_llama(tokenizer, args), tokenizer
    model = load_causal_lm(args.model, dtype=torch.float32).eval()
    return model, load_tokenizer(args.tokenizer or args.model)


def save_checkpoints(args) -> tuple[dict, PreTrainedTokenizerFast]:
    """CHECKPOINT_DIR/{unmodified,hybridized}, each with the tokenizer; what the results say of the model, and the
    tokenizer."""
    model, tokenizer = model_and_tokenizer(args)
    folder = Path(args.checkpoint_dir)
    config, layout = head_layout(args, model.config)
    described = {
        "model": args.model, "family": model.config.model_type, "parameters": model.num_parameters(),
        "layers": model.config.num_hidden_layers, "heads": model.config.num_attention_heads,
        "key_value_heads": num_key_value_heads(model.config), "dtype": "float32",
        "layout": {"name": config.name, "local_groups": local_groups(layout, model.config),
                   "groups": model.config.num_hidden_layers * num_key_value_heads(model.config),
                   "scores": None if args.score == "random" else str(score_path(args))},
    }  # fmt: skip
    for name in MODELS:  # unmodified first: hybridize works in place
        if name == "hybridized":
            hybridize(model, head_layout=layout, local_window=args.local_window, sink_tokens=args.sink_tokens)
        model.save_pretrained(folder / name)
        tokenizer.save_pretrained(folder / name)
    del model
    gc.collect()
    return described, tokenizer


def prompt_texts(tokenizer, args) -> tuple[list[str], list[int]]:
    """`benchmarks.serving`'s prompts as text, and the tokens of each as the servers count them (they tokenize the
    text again, so a prompt cut mid-word may differ from its stretch by a token)."""
    texts = [tokenizer.decode(prompt) for prompt in prompts(tokenizer, args)]
    return texts, [len(tokenizer(text)["input_ids"]) for text in texts]


# --- the servers ---------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_command(name: str, args, port: int) -> list[str]:
    """`python -m MODULE CHECKPOINT` with the flags both servers share."""
    flags = ["--continuous-batching", "--cb-num-blocks", str(args.num_blocks), "--cb-block-size", str(args.page_size),
             "--cb-max-batch-tokens", str(args.max_batch_tokens), "--device", "cpu", "--dtype", "float32",
             "--host", "127.0.0.1", "--port", str(port), "--enable-log-requests"]  # fmt: skip
    return [sys.executable, "-m", *SERVERS[name], str(Path(args.checkpoint_dir) / name), *flags]


@contextmanager
def running(command: list[str], log_path: Path, env: dict) -> Iterator[tuple[str, float]]:
    """The server of `command` until the block ends: its URL, and the seconds it took to answer /health."""
    port = command[command.index("--port") + 1]
    url, start = f"http://127.0.0.1:{port}", time.perf_counter()
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the server stopped (exit code {process.returncode}), see {log_path}")
            if time.perf_counter() - start > STARTUP_TIMEOUT:
                raise RuntimeError(f"the server did not answer /health within {STARTUP_TIMEOUT} s, see {log_path}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        yield url, time.perf_counter() - start
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --- the clients ---------------------------------------------------------------------------------------------------


def completion_body(model_id: str, text: str, max_tokens: int) -> dict:
    return {"model": model_id, "prompt": text, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True},
            "generation_config": json.dumps({"eos_token_id": -1})}  # -1: no token ends a request  # fmt: skip


async def timed_completion(client: httpx.AsyncClient, body: dict) -> dict:
    """One streamed completion: when its first text and its end came (seconds after sending), its usage, its error."""
    sent, first_text, usage, error = time.perf_counter(), None, None, None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                error = f"HTTP {response.status_code}: {(await response.aread()).decode(errors='replace')[:300]}"
            else:
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line.removeprefix("data: "))
                    if "error" in event:
                        error = f"error event: {event['error']}"
                        break
                    usage = event.get("usage") or usage
                    if first_text is None and any(choice.get("text") for choice in event.get("choices", [])):
                        first_text = time.perf_counter()
    except (httpx.HTTPError, ValueError) as exception:  # a lost connection, a chunk that is not JSON
        error = f"{type(exception).__name__}: {exception}"
    end = time.perf_counter()
    if error is None and usage is None:
        error = "no usage chunk"
    elif error is None and usage["completion_tokens"] != body["max_tokens"]:
        error = f"generated {usage['completion_tokens']} tokens, not max_tokens {body['max_tokens']}"
    return {"sent": sent, "ttft_seconds": None if first_text is None else first_text - sent,
            "latency_seconds": end - sent, "end": end,
            "prompt_tokens": usage and usage["prompt_tokens"], "generated_tokens": usage and usage["completion_tokens"],
            "error": error}  # fmt: skip


async def load(url: str, model_id: str, texts: list[str], args) -> tuple[list[dict], float]:
    """`--clients` clients working through `texts` in order, each sending its next request when its last ended: each
    request's record (its client, index, and times from the first request sent), and the wall time."""
    records: list[dict | None] = [None] * len(texts)
    queue = iter(range(len(texts)))  # shared by the clients: one event loop, no lock needed

    async def client_loop(client: httpx.AsyncClient, number: int) -> None:
        for index in queue:
            body = completion_body(model_id, texts[index], args.new_tokens)
            records[index] = {"index": index, "client": number, **await timed_completion(client, body)}

    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT, limits=limits) as client:
        warm_up = await timed_completion(client, completion_body(model_id, texts[0][:200], 2))
        if warm_up["error"]:
            raise RuntimeError(f"the warm-up request failed: {warm_up['error']}")
        await asyncio.gather(*(client_loop(client, number) for number in range(args.clients)))
    start = min(record["sent"] for record in records)
    for record in records:  # times relative to the run's start
        record["sent"], record["end"] = record["sent"] - start, record["end"] - start
    return records, max(record["end"] for record in records)


def serve(name: str, texts: list[str], args) -> dict:
    """One server started, loaded by the clients and stopped; what it did."""
    command = server_command(name, args, free_port())
    env = os.environ | {"HF_HUB_OFFLINE": "1"} | ({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {})
    log_path = Path(args.checkpoint_dir) / f"{name}.log"
    before = machine_load()
    with running(command, log_path, env) as (url, startup):
        requests, wall = asyncio.run(load(url, str(Path(args.checkpoint_dir) / name), texts, args))
        after = machine_load()
    ok = [request for request in requests if request["error"] is None]
    latency, ttft = [r["latency_seconds"] for r in ok], [r["ttft_seconds"] for r in ok if r["ttft_seconds"]]
    generated = sum(request["generated_tokens"] or 0 for request in requests)
    nan = float("nan")
    record = {
        "server": SERVERS[name][0], "command": shlex.join(["python", *command[1:]]), "log": str(log_path),
        "startup_seconds": startup, "tokens_per_second": generated / wall, "wall_seconds": wall,
        "generated_tokens": generated, "errors": len(requests) - len(ok),
        "latency_p50_seconds": percentile(latency, 0.5) if latency else nan,
        "latency_p95_seconds": percentile(latency, 0.95) if latency else nan,
        "ttft_p50_seconds": percentile(ttft, 0.5) if ttft else nan,
        "ttft_p95_seconds": percentile(ttft, 0.95) if ttft else nan,
        "machine": {"before": before, "after": after}, "requests": requests,
    }  # fmt: skip
    return record


def run(args, argv: list[str]) -> dict:
    start, load_at_start = time.perf_counter(), machine_load()
    Path(args.checkpoint_dir).mkdir(parents=True, exist_ok=True)
    described, tokenizer = save_checkpoints(args)
    texts, prompt_tokens = prompt_texts(tokenizer, args)
    runs, resumed = stored_or_measured(args, MODELS, lambda name: serve(name, texts, args))  # one at a time
    return described | {
        "command": shlex.join(["python", "-m", "benchmarks.serving_http", *argv]),
        "workload": {"requests": args.requests, "clients": args.clients, "prompt_tokens": prompt_tokens,
                     "new_tokens": args.new_tokens, "text": "WikiText-2 test", "endpoint": "/v1/completions"},
        "server_flags": {"continuous_batching": True, "cb_num_blocks": args.num_blocks, "cb_block_size": args.page_size,
                         "cb_max_batch_tokens": args.max_batch_tokens, "device": "cpu", "dtype": "float32",
                         "threads": args.threads},
        "runs": runs, "resumed": resumed, "ratios": {key: ratio(runs, key) for key, _ in MEASURES},
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__, "httpx": httpx.__version__,
                     "fastapi": fastapi.__version__, "uvicorn": uvicorn.__version__,
                     "python": sys.version.split()[0]},
        "code": code_version(),
        "machine": {"before": load_at_start, "after": machine_load(), "torch": describe_machine("cpu")},
        "settings": vars(args), "wall_seconds": time.perf_counter() - start,
    }  # fmt: skip


# --- the report ----------------------------------------------------------------------------------------------------


def report(result: dict) -> str:
    """results.md: the model, the workload, the table of both servers and their ratio, the machine."""
    runs, ratios, flags, workload = result["runs"], result["ratios"], result["server_flags"], result["workload"]
    layout, lengths = result["layout"], workload["prompt_tokens"]
    lines = [
        f"# Serving over HTTP under one cache budget: {result['model']}", "",
        f"{result['family']}, {result['parameters']:,} parameters, {result['layers']} layers of {result['heads']} "
        f"query heads over {result['key_value_heads']} key/value heads, {result['dtype']}. Unmodified: served by "
        f"`transformers serve`; hybridized (`{layout['name']}`, {layout['local_groups']} of {layout['groups']} "
        f"key/value groups local" + (f", ranked by {layout['scores']}" if layout["scores"] else "") + "): served by "
        "`hf_attn.serving.server`.", "",
        f"Workload: {workload['requests']} requests to `{workload['endpoint']}` from {workload['clients']} concurrent "
        f"clients, each sending its next when its last ended; prompts of {min(lengths):,}-{max(lengths):,} tokens "
        f"({workload['text']}), {workload['new_tokens']} new tokens each (`max_tokens`, `temperature=0`, no "
        f"end-of-sequence token), streamed. Both servers: `--continuous-batching --cb-num-blocks "
        f"{flags['cb_num_blocks']} --cb-block-size {flags['cb_block_size']} --cb-max-batch-tokens "
        f"{flags['cb_max_batch_tokens']} --device {flags['device']} --dtype {flags['dtype']}`"
        + (f", OMP_NUM_THREADS={flags['threads']}" if flags["threads"] else "") + ".", "",
        "| measure | unmodified | hybridized | hybridized / unmodified |", "|---|---|---|---|",
    ]  # fmt: skip
    for key, label in MEASURES:
        shown = "-" if ratios[key] is None else f"{ratios[key]:.2f}x"
        lines.append(f"| {label} | {cell(runs['unmodified'][key])} | {cell(runs['hybridized'][key])} | {shown} |")
    versions = result["versions"]
    lines += [
        "", "Tokens/s: the tokens the responses' `usage` counts, over the time from the first request sent to the "
        "last response ended. Latency: a request sent to its stream ended; time to first token: sent to the first "
        "chunk with text; both on the client. Errors: a status other than 200, an error event, a lost connection, or "
        "a `usage` other than the requested tokens. One warm-up request per server before the clock starts.", "",
        f"`{result['command']}`: {result['wall_seconds'] / 60:.1f} min, {result['machine']['torch']}, transformers "
        f"{versions['transformers']}, httpx {versions['httpx']}, unmodified server first"
        f"{code_note(result.get('code'))}."
        + (f" Measured by an earlier invocation with the same arguments: {', '.join(result['resumed'])}."
           if result.get("resumed") else ""), "",
    ]  # fmt: skip
    for name in MODELS:
        run = runs[name]
        lines.append(f"- {name}: `{run['command']}`; `uptime` before: `{run['machine']['before']['uptime']}`; "
                     f"after: `{run['machine']['after']['uptime']}`.")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    result = measured_or_stored(args, argv, run, report)
    folder = Path(args.output_dir)
    if errors := {name: run["errors"] for name, run in result["runs"].items() if run["errors"]}:
        raise SystemExit(f"requests failed: {errors}; see each request's `error` in {folder / 'results.json'}")


if __name__ == "__main__":
    main()
