"""`transformers serve` for hf_attn's models: `python -m hf_attn.serving.server MODEL [OPTIONS]`, or `hf-attn-serve`,
with every argument of `transformers serve` (`--continuous-batching`, `--cb-num-blocks`, `--host`, `--port`, ...).

`transformers serve` alone cannot load them. Its model loader (`ModelLoader._load_model` in
`transformers/cli/serving/model_manager.py`) takes the class that `config.architectures` names as an attribute of the
`transformers` module, `getattr(transformers, config.architectures[0])`, which fails for `HybridGPT2LMHeadModel` and
for the `HfAttn<Family>ForCausalLM` of a checkpoint saved after `hybridize`, whether hf_attn's types are registered
with the Auto classes or the checkpoint brings them as remote code (`auto_map`, `--trust-remote-code`).

This entry point runs transformers' own command line, server and model manager unchanged, with two differences:

- its model loader puts hf_attn's model classes on the `transformers` module while it loads a model, in the model's
  process only, and takes them away after. The server then serves hf_attn's models as any other: the API process reads
  the config and tokenizer through the Auto classes (`import hf_attn` registered hf_attn's types there), and
  generation, streaming and continuous batching are transformers';
- its app answers bad requests with a 4xx where transformers' answers a 500 (transformers 5.25): it checks the shape
  of a request's body before the handlers read it (`RequestChecks`), since they index it unchecked (a chat
  completion without `messages`, or with a message without a `role`, fails with a `KeyError` or `TypeError`, a
  completion without a `prompt` fails in the model's process), and answers a request for a model that cannot be
  found with a 404 (`model_not_found`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import transformers
from huggingface_hub import typer_factory
from transformers import PreTrainedModel
from transformers.cli.serve import Serve
from transformers.cli.serving import server as transformers_server
from transformers.cli.serving.model_manager import ModelLoader

from ..hybrid import HYBRID_TYPES
from ..modeling_hf_attn import MODEL_CLASSES

if TYPE_CHECKING:
    import socket


# --- models ------------------------------------------------------------------------------------------------------


def hf_attn_model_classes() -> dict[str, type]:
    """Every model class hf_attn registers with an Auto class, by name: its GPT-2 types' and `hybridize`'s."""
    groups = [*MODEL_CLASSES.values(), *(models for _, models in HYBRID_TYPES.values())]
    return {cls.__name__: cls for classes in groups for cls in classes.values()}


@contextmanager
def model_classes_on_transformers() -> Iterator[None]:
    """hf_attn's model classes as attributes of the `transformers` module, where the server's loader looks a model's
    class up, for the time of the block. A workaround: the server has no hook for classes of other packages. Names
    transformers has are left alone, so its own classes are never shadowed."""
    added = {name: cls for name, cls in hf_attn_model_classes().items() if not hasattr(transformers, name)}
    for name, cls in added.items():
        setattr(transformers, name, cls)
    try:
        yield
    finally:
        for name in added:
            delattr(transformers, name)


class HfAttnModelLoader(ModelLoader):
    """transformers' model loader, which also loads hf_attn's models (see `model_classes_on_transformers`).

    Each model runs in a spawned process, which receives its loader pickled: unpickling this class there imports this
    module, and with it hf_attn, whose types the Auto classes then know in that process too."""

    @classmethod
    def like(cls, loader: ModelLoader) -> HfAttnModelLoader:
        """A loader with the settings of `loader`, which `Serve` built from the command line."""
        hf_attn_loader = cls.__new__(cls)
        hf_attn_loader.__dict__.update(vars(loader))
        return hf_attn_loader

    def load_model_and_processor(
        self, model_id: str, on_progress: Callable[[dict], None] | None = None
    ) -> tuple[PreTrainedModel, Any]:
        with model_classes_on_transformers():
            return super().load_model_and_processor(model_id, on_progress=on_progress)


# --- requests ----------------------------------------------------------------------------------------------------


def chat_problems(request: dict) -> list[str]:
    """What the chat completions handler cannot read: it takes `messages`, each message's `role`, and the `type` of
    each part of a content given as a list, unchecked (a `KeyError` or `TypeError` otherwise)."""
    messages = request.get("messages")
    if not isinstance(messages, list):
        return [f"`messages` must be a list of messages, got {type(messages).__name__}"]
    problems = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            problems.append(f"`messages[{i}]` must be an object with a `role` string, got {message!r:.80}")
            continue
        content = message.get("content")
        if isinstance(content, list) and not all(isinstance(part, dict) and "type" in part for part in content):
            problems.append(f"`messages[{i}].content` must be a string or a list of objects with a `type`")
        elif content is not None and not isinstance(content, (str, list)):
            problems.append(f"`messages[{i}].content` must be a string or a list, got {type(content).__name__}")
    return problems


def completion_problems(request: dict) -> list[str]:
    """The completions handler takes a missing `prompt` as "", and the model's process fails on a prompt of no
    tokens."""
    if request.get("prompt", "") == "":
        return ["`prompt` must be a non-empty string"]
    return []


# What each endpoint's handler cannot read, by path: the requests `RequestChecks` answers itself.
REQUEST_CHECKS = {"/v1/chat/completions": chat_problems, "/v1/completions": completion_problems}


def request_problems(path: str, body: bytes) -> list[str]:
    """Why the handler of `path` cannot read `body`. A body that is not a JSON object passes: FastAPI answers it with
    a 422 itself."""
    try:
        request = json.loads(body)
    except ValueError:
        return []
    return REQUEST_CHECKS[path](request) if isinstance(request, dict) else []


class RequestChecks:
    """Answers a request to an endpoint of `REQUEST_CHECKS` that its handler cannot read (`request_problems`) with
    a 422 naming every problem; passes any other on, its body replayed. A plain ASGI middleware, as transformers' own
    are: it reads the body before the app, and leaves the response (streamed or not) and the client's disconnect,
    which `CancelOnDisconnect` watches, to the app."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in REQUEST_CHECKS:
            return await self.app(scope, receive, send)
        received = [await receive()]
        while received[-1]["type"] == "http.request" and received[-1].get("more_body", False):
            received.append(await receive())
        body = b"".join(message.get("body", b"") for message in received)
        if problems := request_problems(scope["path"], body):
            from fastapi.responses import JSONResponse

            return await JSONResponse({"detail": problems}, status_code=422)(scope, receive, send)

        async def replay() -> dict:
            return received.pop(0) if received else await receive()

        await self.app(scope, replay, send)


async def model_not_found(request, error: OSError):
    """A 404 for a request naming a model whose files cannot be found (a wrong name or path, or offline): the
    `OSError` of `from_pretrained`, which reaches the client as a 500 (transformers 5.25)."""
    from fastapi.responses import JSONResponse

    return JSONResponse({"detail": f"The model cannot be loaded: {error}"}, status_code=404)


@contextmanager
def checked_apps() -> Iterator[None]:
    """transformers' `build_server` adds `RequestChecks` and `model_not_found` to the app it builds, for the time of
    the block. A workaround: `Serve.run` builds its app and serves it at once, and takes `build_server` from its module
    when it runs."""
    build_server = transformers_server.build_server

    def build_checked_server(*args, **kwargs):
        app = build_server(*args, **kwargs)
        app.add_middleware(RequestChecks)
        app.add_exception_handler(OSError, model_not_found)
        return app

    transformers_server.build_server = build_checked_server
    try:
        yield
    finally:
        transformers_server.build_server = build_server


# --- the command -----------------------------------------------------------------------------------------------


class HfAttnServe(Serve):
    # `transformers serve`, its arguments and code unchanged, loading models with `HfAttnModelLoader`; its docstring is
    # the command's `--help`
    __doc__ = f"{Serve.__doc__}\nLoads hf_attn's models too (hf_attn.serving.server).\n"

    # `Serve.__init__` parses the command line, builds its loader and runs the server at once: the loader is swapped
    # as it is set, for `run` and `run_api_servers` alike.
    @property
    def loader(self) -> HfAttnModelLoader:
        return self._loader

    @loader.setter
    def loader(self, loader: ModelLoader) -> None:
        self._loader = loader if isinstance(loader, HfAttnModelLoader) else HfAttnModelLoader.like(loader)

    def run(self, socket: socket.socket | None = None, engine_connection: tuple | None = None) -> None:
        """`Serve.run`, its app checking requests (`checked_apps`); each API server of `--api-server-count` runs it."""
        with checked_apps():
            super().run(socket=socket, engine_connection=engine_connection)


def main(argv: list[str] | None = None) -> None:
    """`transformers serve`'s command line, built as transformers builds it, serving hf_attn's models too."""
    cli = typer_factory(help="Serve transformers and hf_attn models with an OpenAI-compatible API.")
    cli.command(name="serve")(HfAttnServe)
    cli.commands["serve"].main(args=argv, prog_name="hf-attn-serve")


if __name__ == "__main__":
    main()
