"""`python -m hf_attn.serving.server`: transformers' OpenAI-compatible server over HTTP, serving a tiny hybridized Llama
(local heads with sinks) and a tiny `hybrid_gpt2`, saved to a folder with a tokenizer made here, offline.

The reference is the model's own greedy `generate` on the prompt its chat template makes. Each (model, mode), `generate`
or `--continuous-batching`, starts one server, in a subprocess on a free port, for every test of the module (a start
takes about 10 s); one more, started without a model, loads ours on request. Bad requests must get a 4xx and leave the
server serving: transformers 5.25 answers some with a 500, which hf_attn.serving.server's checks turn into 4xx.
"""

import asyncio
import json
import os
import socket
import string
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from hf_attn import hybridize

pytestmark = pytest.mark.xdist_group("serving")  # one worker: each server uses a port and both cores while it starts

CONTEXT = 128  # positions of both models: long enough for a stream cut off mid-answer, short enough to overflow
MAX_TOKENS = 12
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
PROMPTS = [
    "hello world",
    "the quick brown fox",
    "how are you today?",
    "jumps over the lazy dog",
    "Hello, World!",
    "a b c d e f",
    "what time is it",
    "tell me a story",
]


def chat_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE of 128 tokens over printable ASCII, trained here (no download), with a chat template. Its
    alphabet is only the characters it saw, so every token decodes to whole characters, streamed or not."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    corpus = [string.printable, *PROMPTS, "<|user|> <|assistant|> <|system|>"]
    tokenizer.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=128, special_tokens=["<|endoftext|>"]))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>", chat_template=CHAT_TEMPLATE)


def tiny_model(kind: str, tokenizer: PreTrainedTokenizerFast):
    """A hybridized Llama (grouped-query attention, the last two of four heads 4-local with 2 sinks) or a
    `hybrid_gpt2` (half its heads 2-local), random weights."""
    torch.manual_seed(0)
    special = dict(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id, bos_token_id=None, pad_token_id=None)
    if kind == "hybridized_llama":
        config = LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                             num_hidden_layers=2, max_position_embeddings=CONTEXT, **special)  # fmt: skip
        return hybridize(LlamaForCausalLM(config).eval(), num_local_heads=2, local_window=4, sink_tokens=2)
    config = AutoConfig.for_model("hybrid_gpt2", n_layer=2, n_head=4, n_embd=32, n_positions=CONTEXT, local_window=2,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **special)  # fmt: skip
    return AutoModelForCausalLM.from_config(config).eval()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Served:
    """A model saved to a folder, its server, and the reference answers of the model loaded back from that folder.
    The server serves that model alone, named on its command line (`pinned`), or loads it on the first request."""

    def __init__(self, folder: Path, *options: str, continuous_batching: bool = False, pinned: bool = True):
        self.model_id, self.continuous_batching = str(folder), continuous_batching
        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder).eval()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = folder / "server.log"
        command = [sys.executable, "-m", "hf_attn.serving.server", *([self.model_id] if pinned else []),
                   "--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu", "--enable-log-requests",
                   *options, *(["--continuous-batching"] if continuous_batching else [])]  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

    def wait_until_up(self, timeout: float = 120) -> None:
        """The server answers /health once its model has loaded (the model of the command line loads first)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"The server stopped (exit code {self.process.returncode}):\n{self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        pytest.fail(f"The server did not answer within {timeout} s:\n{self.log.read_text()}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def request(self, content: str, **fields) -> dict:
        return {"model": self.model_id, "messages": [{"role": "user", "content": content}],
                "max_tokens": MAX_TOKENS, "temperature": 0.0, **fields}  # fmt: skip

    def prompt_ids(self, content: str) -> list[int]:
        """The tokens of the prompt the chat template makes of `content`, as the server makes it."""
        messages = [{"role": "user", "content": content}]
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]

    def expected(self, content: str) -> str:
        """The model's own greedy answer to `content` through the chat template, as text."""
        prompt = torch.tensor([self.prompt_ids(content)])
        with torch.no_grad():
            output = self.model.generate(prompt, max_new_tokens=MAX_TOKENS, do_sample=False)
        return self.tokenizer.decode(output[0, prompt.shape[-1] :], skip_special_tokens=True)

    def assert_alive(self) -> None:
        assert self.process.poll() is None, self.log.read_text()
        answer = httpx.post(f"{self.url}/v1/chat/completions", json=self.request(PROMPTS[0]), timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == self.expected(PROMPTS[0])


def stream_text(lines) -> str:
    """The text of a chat completion's SSE stream; fails on an error event."""
    text = []
    for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line.removeprefix("data: "))
        assert "error" not in event, event
        text.append(event["choices"][0]["delta"].get("content") or "")
    return "".join(text)


@pytest.fixture(scope="module", params=[False, True], ids=["generate", "continuous_batching"])
def continuous_batching(request) -> bool:
    return request.param


def saved(kind: str, folder: Path) -> Path:
    """`folder`, holding a tiny model of `kind` and its tokenizer."""
    tokenizer = chat_tokenizer()
    tiny_model(kind, tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@contextmanager
def running(server: Served) -> Iterator[Served]:
    try:
        server.wait_until_up()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module", params=["hybridized_llama", "hybrid_gpt2"])
def served(request, continuous_batching, tmp_path_factory):
    # The hybridized checkpoint's config is read as remote code (its `auto_map`), as `transformers serve` users would
    options = ["--trust-remote-code"] if request.param == "hybridized_llama" else []
    folder = saved(request.param, tmp_path_factory.mktemp(request.param))
    with running(Served(folder, *options, continuous_batching=continuous_batching)) as server:
        yield server


def test_chat_completion_is_the_models_greedy_answer(served):
    answer = httpx.post(f"{served.url}/v1/chat/completions", json=served.request(PROMPTS[0]), timeout=60)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    expected = served.expected(PROMPTS[0])
    assert expected  # an answer, not an end of text at once: the comparison means something
    assert body["choices"][0]["message"]["content"] == expected
    assert body["usage"]["prompt_tokens"] == len(served.prompt_ids(PROMPTS[0]))
    mode = "continuous batching" if served.continuous_batching else "generate"
    assert f", {mode}, stream" in served.log.read_text()  # the request's line (`--enable-log-requests`)


def test_streamed_chunks_reassemble_the_answer(served):
    with httpx.stream("POST", f"{served.url}/v1/chat/completions", json=served.request(PROMPTS[1], stream=True),
                      timeout=60) as answer:  # fmt: skip
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        lines = list(answer.iter_lines())
    assert len([line for line in lines if line.startswith("data: ")]) > 2  # the role, then the text in pieces
    assert stream_text(lines) == served.expected(PROMPTS[1])


def test_concurrent_requests_each_get_their_answer(served):
    async def ask_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=served.url, timeout=120) as client:
            requests = [client.post("/v1/chat/completions", json=served.request(prompt)) for prompt in PROMPTS]
            return await asyncio.gather(*requests)

    answers = asyncio.run(ask_all())
    assert [answer.status_code for answer in answers] == [200] * len(PROMPTS)
    texts = [answer.json()["choices"][0]["message"]["content"] for answer in answers]
    assert texts == [served.expected(prompt) for prompt in PROMPTS]


def test_a_client_leaving_mid_stream_leaves_the_others_served(served):
    async def leave_while_another_asks() -> httpx.Response:
        async with httpx.AsyncClient(base_url=served.url, timeout=120) as client:
            # An answer as long as the context allows, left after its first piece of text
            longest = CONTEXT - len(served.prompt_ids(PROMPTS[2]))
            leaving = served.request(PROMPTS[2], stream=True, max_tokens=longest)
            async with client.stream("POST", "/v1/chat/completions", json=leaving) as stream:
                assert stream.status_code == 200
                other = asyncio.ensure_future(client.post("/v1/chat/completions", json=served.request(PROMPTS[3])))
                async for line in stream.aiter_lines():
                    if '"content"' in line:
                        break
            return await other

    other = asyncio.run(leave_while_another_asks())
    assert other.status_code == 200, other.text
    assert other.json()["choices"][0]["message"]["content"] == served.expected(PROMPTS[3])
    served.assert_alive()


def bad_requests(served) -> dict[str, str]:
    """Chat completion requests the server must refuse with a 4xx, by name: their bodies as sent."""
    too_long = " ".join(PROMPTS) * 8  # over CONTEXT tokens
    return {
        "unknown model": json.dumps({**served.request(PROMPTS[0]), "model": "no-such/model"}),
        "prompt longer than the context": json.dumps(served.request(too_long)),
        "malformed JSON": '{"model": "' + served.model_id + '", "messages": [',
        "not a JSON object": "[1, 2]",
        "no messages": json.dumps({"model": served.model_id}),
        "a message without a role": json.dumps({"model": served.model_id, "messages": [{"content": "hi"}]}),
        "messages not a list": json.dumps({"model": served.model_id, "messages": "hi"}),
        "a content part without a type": json.dumps(
            {"model": served.model_id, "messages": [{"role": "user", "content": [{"text": "hi"}]}]}
        ),
        "unknown field": json.dumps({**served.request(PROMPTS[0]), "no_such_field": 1}),
        "max_tokens not a number": json.dumps(served.request(PROMPTS[0], max_tokens="many")),
    }


def test_bad_requests_get_a_4xx_with_a_message(served):
    for name, body in bad_requests(served).items():
        answer = httpx.post(f"{served.url}/v1/chat/completions", content=body,
                            headers={"content-type": "application/json"}, timeout=60)  # fmt: skip
        assert 400 <= answer.status_code < 500, (name, answer.status_code, answer.text)
        assert answer.json()["detail"], name
    answer = httpx.post(f"{served.url}/v1/completions", json={"model": served.model_id}, timeout=60)
    assert answer.status_code == 422 and "prompt" in answer.text, answer.text
    served.assert_alive()


def test_a_server_without_a_model_loads_ours_on_request_and_refuses_unknown_ones(tmp_path):
    with running(Served(saved("hybrid_gpt2", tmp_path), pinned=False)) as server:
        unknown = httpx.post(f"{server.url}/v1/chat/completions", json={**server.request("hi"), "model": "no/such"},
                             timeout=60)  # fmt: skip
        assert unknown.status_code == 404 and "cannot be loaded" in unknown.json()["detail"], unknown.text
        server.assert_alive()  # its first request loads the model
