"""Per-token decoding latency and cache memory against the context length: local, hybrid and positional models
against GPT-2.

For each context length L: a random prompt of L tokens (batch 1) is prefilled in one forward with the cache on,
then `--new-tokens` tokens are decoded greedily one at a time, each a single-token forward on the cache. Every
(model, L) pair decodes in turn, one token each, so all are measured over the same stretch of time. Per-token
latency is the median over the steps, the first one left out as warm-up; cache memory is what the cache holds after
the last step. A local-only model keeps the last k keys and values per layer, so its step and its cache should not
grow with L; GPT-2 (and the hybrid's global heads) keep every token. A positional model keeps every token's values
but no keys (its weights come from positions; the layer keeps P's keys by position, once for every sequence). One
instance per model for every L.

`--static-compiled` decodes instead through a static cache of L + `--new-tokens` slots (`HfAttnCache(config,
max_cache_len=...)`, transformers' `StaticCache` for GPT-2), the prefill eager, every step through
`torch.compile(model.forward, fullgraph=True)`; the first `--compiled-warm-up` steps (the compiles) are left out,
and no step after them may compile again. Every (model, L) also decodes eagerly with the default cache, for its
tokens (which the compiled one must equal) and its ms/token. A tiny model of every kind is checked first.

    python -m benchmarks.generation                                   # L in {512, ..., 8192}, 32 new tokens
    python -m benchmarks.generation --contexts 1024 4096 --models local-1 gpt2
    python -m benchmarks.generation --device cuda
    python -m benchmarks.generation --contexts 16 32 --new-tokens 3 --n-layer 1 --n-embd 32 --n-head 4 --vocab-size 100
    python -m benchmarks.generation --static-compiled --contexts 512 8192 --new-tokens 35
"""

import argparse
import inspect
import itertools
import os
import time
import types

import torch
from torch._dynamo.utils import counters
from transformers import GPT2LMHeadModel, PreTrainedModel, StaticCache

from benchmarks.common import (
    Shape,
    build_model,
    command_line_parser,
    describe_machine,
    median,
    print_header,
    print_row,
    timed,
)
from hf_attn import HfAttnCache

GENERATION_MODELS = ["local-1", "local-4", "hybrid-1", "positional", "gpt2"]
LOCAL_MODELS = {"local-1", "local-4"}
# local and positional models: ms/token at the longest context over ms/token at the shortest
LATENCY_TARGET = {"local-1": 1.25, "local-4": 1.25, "positional": 1.25}
# static cache, compiled forward: local-1's speed-up over GPT-2 at the longest context (gpt2 ms / local-1 ms)
STATIC_LOCAL_SPEEDUP_TARGET = 1.8
# the check before the benchmark: a tiny shape compiles in seconds; a prompt longer than every window, so they slide
CHECK_SHAPE = Shape(n_layer=2, n_embd=32, n_head=4, vocab_size=100, n_positions=64)
CHECK_PROMPT, CHECK_TOKENS, CHECK_WEIGHT_SCALE = 12, 10, 10.0


def cache_bytes(cache) -> int:
    """Bytes of every cached key and value: HfAttnCache's own count, or a Dynamic/StaticCache's layers summed."""
    if isinstance(cache, HfAttnCache):
        return cache.memory_bytes()
    return sum(tensor.nbytes for layer in cache.layers for tensor in (layer.keys, layer.values) if tensor is not None)


def cache_of(outputs):
    """The cache a forward returned (`cache` in transformers 5.x outputs, formerly `past_key_values`)."""
    cache = getattr(outputs, "cache", None)
    return cache if cache is not None else outputs.past_key_values


def cache_argument(model: PreTrainedModel) -> str:
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class Decoder:
    """One model decoding greedily from one prompt: the prefill at construction (on `cache` if given, else the
    model's default one), then `step()` per token. `tokens` keeps every token chosen, `logits` the last ones."""

    def __init__(self, model: PreTrainedModel, prompt: torch.Tensor, cache=None):
        self.model, self.argument, self.prompt_length = model, cache_argument(model), prompt.shape[-1]
        self.forward, self.tokens = model, []  # `CompiledStaticDecoder` steps through a compiled forward
        past = {} if cache is None else {self.argument: cache}
        with torch.inference_mode():
            # logits_to_keep=1: the prefill's logits over the whole prompt (L x vocab) would dominate its memory.
            self.advance(model(prompt, use_cache=True, logits_to_keep=1, **past))
        self.steps = 0

    def advance(self, outputs) -> None:
        self.logits = outputs.logits[:, -1]
        self.cache, self.token = cache_of(outputs), self.logits.argmax(-1, keepdim=True)
        self.tokens.append(self.token)

    def step(self) -> None:
        with torch.inference_mode():
            self.advance(self.forward(self.token, use_cache=True, **{self.argument: self.cache}))
        self.steps += 1

    def cache_bytes(self) -> int:
        """Bytes the cache holds, after checking that every step went through it."""
        expected, seen = self.prompt_length + self.steps, int(self.cache.get_seq_length())
        if seen != expected:
            raise RuntimeError(f"the cache has seen {seen} tokens, expected {expected}")
        return cache_bytes(self.cache)

    def token_list(self) -> list[int]:
        return torch.cat(self.tokens, dim=-1)[0].tolist()


def static_cache(model: PreTrainedModel, max_cache_len: int):
    """The static cache `generate(cache_implementation="static")` would make: hf_attn's, or transformers' for
    GPT-2."""
    if isinstance(model, GPT2LMHeadModel):
        return StaticCache(config=model.config, max_cache_len=max_cache_len)
    return HfAttnCache(model.config, max_cache_len=max_cache_len)


_copies = itertools.count()


def own_code(method):
    """`method` (a bound `forward`) run by a copy of its function with a code object of its own. Dynamo keeps the
    graphs it compiled, and which sizes it has seen change, per code object, and transformers' forwards all run one
    decorator's code: without a copy, every (model, L) would share one list of graphs, each step trying the others'
    guards first, and a size seen to differ between two of them (the cache's length) would be compiled symbolic in
    the later graphs. With it, each is compiled as `generate` would compile it alone in its process."""
    function = method.__func__
    code = function.__code__.replace(co_name=f"{function.__code__.co_name}_{next(_copies)}")
    copy = types.FunctionType(code, function.__globals__, function.__name__, function.__defaults__,
                              function.__closure__)  # fmt: skip
    copy.__kwdefaults__ = function.__kwdefaults__
    return types.MethodType(copy, method.__self__)


class CompiledStaticDecoder(Decoder):
    """`Decoder` through a static cache of prompt + `new_tokens` slots: the prefill eager, as `generate` does it,
    every step through `torch.compile(model.forward, fullgraph=True)`. `graphs` counts the graphs its steps
    compiled: after the warm-up there must be no more."""

    def __init__(self, model: PreTrainedModel, prompt: torch.Tensor, new_tokens: int, backend: str):
        super().__init__(model, prompt, static_cache(model, prompt.shape[-1] + new_tokens))
        self.forward = torch.compile(own_code(model.forward), fullgraph=True, backend=backend)
        self.graphs = 0

    def step(self) -> None:
        before = counters["stats"]["unique_graphs"]
        super().step()
        self.graphs += counters["stats"]["unique_graphs"] - before


def decode(decoders: dict[tuple, Decoder], new_tokens: int, device: str, skip: int = 1) -> dict[tuple, float]:
    """Median seconds per decoded token after the first `skip`, for every (model, context) decoder, the decoders
    taking their steps in turns: a drift of the machine's speed during the run touches every context alike, so the
    growth from the shortest context to the longest is measured within one stretch of time."""
    times = {key: [] for key in decoders}
    for _ in range(new_tokens):
        for key, decoder in decoders.items():
            times[key].append(timed(decoder.step, device))
    return {key: median(seconds[skip:]) for key, seconds in times.items()}


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds so far of every process on the machine, and of this one (Linux). What the others took while the
    steps were timed says how far to trust the times: two threads on two cores wait for each other whenever another
    process takes one of the cores."""
    with open("/proc/stat") as stat:
        user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in stat.readline().split()[1:9])
    own = os.times()
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK"), own.user + own.system


def check_static_decoding(names: list[str], backend: str, device: str) -> str:
    """Compiled static decoding must choose the tokens that eager decoding with the default cache chooses (a
    benchmark of wrong outputs is worthless): checked first, for every model at a tiny shape, its 2-D weights scaled
    up so that the greedy tokens vary rather than repeat one, every step's logits compared too. Returns the backend
    that compiled: `backend`, or aot_eager when inductor fails on this machine (said in the output)."""
    try:
        for name in names:
            check_one(name, backend, device)
    except Exception as error:
        if backend != "inductor" or isinstance(error, AssertionError):
            raise
        print(f"> inductor FAILED here ({type(error).__name__}: {str(error)[:200]}); falling back to aot_eager")
        return check_static_decoding(names, "aot_eager", device)
    return backend


def relative_difference(logits: torch.Tensor, reference: torch.Tensor) -> float:
    return ((logits - reference).abs().max() / reference.abs().max()).item()


def check_one(name: str, backend: str, device: str) -> None:
    torch.manual_seed(0)
    model = build_model(name, CHECK_SHAPE, device).eval()
    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() == 2:
                weight.mul_(CHECK_WEIGHT_SCALE)
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, CHECK_SHAPE.vocab_size, (1, CHECK_PROMPT), generator=generator).to(device)
    eager, compiled = Decoder(model, prompt), CompiledStaticDecoder(model, prompt, CHECK_TOKENS, backend)
    worst = relative_difference(compiled.logits, eager.logits)  # the prefill, eager on both caches
    for _ in range(CHECK_TOKENS):
        eager.step()
        compiled.step()
        worst = max(worst, relative_difference(compiled.logits, eager.logits))
    tokens = eager.token_list()
    assert compiled.token_list() == tokens, f"{name}: compiled static {compiled.token_list()} != eager {tokens}"
    assert worst < 1e-4, f"{name}: compiled static logits differ from eager ones by {worst:.2e} (relative)"
    print(
        f"> check, {name} at {CHECK_SHAPE.n_layer} layers, width {CHECK_SHAPE.n_embd}, prompt {CHECK_PROMPT}: "
        f"compiled static decoding ({backend}, {compiled.graphs} graphs) = eager default-cache decoding, "
        f"{len(tokens)} tokens ({len(set(tokens))} distinct), logits within {worst:.1e} of the largest"
    )


def ratio(value: float, reference: float | None) -> str:
    return "-" if reference is None else f"{value / reference:.2f}x"


def mib(num_bytes: int) -> str:
    return f"{num_bytes / 2**20:.4g}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = command_line_parser("benchmarks.generation", __doc__)
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192], help="prompt lengths")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens decoded per context (the first is warm-up)")
    parser.add_argument(
        "--models", nargs="+", default=GENERATION_MODELS, choices=GENERATION_MODELS, metavar="MODEL",
        help=f"a subset of {', '.join(GENERATION_MODELS)} (default: all)",
    )  # fmt: skip
    parser.add_argument(
        "--static-compiled", action="store_true",
        help="decode through a static cache with torch.compile(model.forward, fullgraph=True) (see above)",
    )  # fmt: skip
    parser.add_argument(
        "--compiled-warm-up", type=int, default=3, help="with --static-compiled: steps left out (they compile)"
    )  # fmt: skip
    parser.add_argument("--compile-backend", default="inductor", help="with --static-compiled: torch.compile's")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights and the prompts")
    defaults = Shape()
    parser.add_argument("--n-layer", type=int, default=defaults.n_layer)
    parser.add_argument("--n-embd", type=int, default=defaults.n_embd)
    parser.add_argument("--n-head", type=int, default=defaults.n_head)
    parser.add_argument("--vocab-size", type=int, default=defaults.vocab_size)
    args = parser.parse_args(argv)
    if args.new_tokens < 2:
        parser.error("--new-tokens must be at least 2 (the first step is warm-up)")
    if args.static_compiled and args.new_tokens <= args.compiled_warm_up:
        parser.error("--new-tokens must be more than --compiled-warm-up")
    if min(args.contexts) < 1:
        parser.error("--contexts must be positive")
    args.contexts = sorted(set(args.contexts))
    args.models = list(dict.fromkeys(args.models))
    return args


def print_notes(shape: Shape, args) -> None:
    print(f"> {describe_machine(args.device)}")
    print(
        f"> {shape.n_layer} layers, width {shape.n_embd}, {shape.n_head} heads, vocab {shape.vocab_size}, "
        f"n_positions {shape.n_positions}, fp32, batch 1, seed {args.seed}"
    )
    print(
        f"> per context L: prefill L random tokens in one forward (use_cache=True), then decode {args.new_tokens} "
        "tokens greedily, one single-token forward each on the cache;"
    )
    print(
        f"> ms/token = median of steps 2..{args.new_tokens} (step 1 is warm-up); cache = bytes of cached keys and "
        "values after the last step;"
    )
    print(f"> every (model, L) decodes in turn, a token each; each model first warmed up at L = {args.contexts[0]}")
    print("> ratios: ms/token over the reference's (below 1: faster)")


def print_targets(latency: dict[str, dict[int, float]], memory: dict[str, dict[int, int]], args) -> None:
    """How latency and cache grow from the shortest context to the longest, against the targets."""
    shortest, longest = args.contexts[0], args.contexts[-1]
    print(f"\n> targets, context {longest} against {shortest}:\n")
    for name in args.models:
        growth = latency[name][longest] / latency[name][shortest]
        cache_growth = memory[name][longest] / memory[name][shortest]
        target = LATENCY_TARGET.get(name)
        against_target = f" (target <= {target}: {'met' if growth <= target else 'MISSED'})" if target else ""
        gpt2 = memory.get("gpt2")
        against_gpt2 = f", {memory[name][longest] / gpt2[longest]:.2f}x gpt2's" if gpt2 else ""
        if name in LOCAL_MODELS:
            constant = len(set(memory[name].values())) == 1
            print(
                f"- {name}: ms/token {longest}/{shortest} = {growth:.2f}x{against_target}; "
                f"cache {'constant' if constant else 'NOT constant'} over contexts "
                f"({', '.join(sorted({mib(b) for b in memory[name].values()}))} MiB)"
            )
        elif name == "positional":
            print(
                f"- positional: ms/token {longest}/{shortest} = {growth:.2f}x{against_target}; cache "
                f"{longest}/{shortest} = {cache_growth:.2f}x (values only{against_gpt2} at {longest})"
            )
        elif name == "gpt2":
            linear = (longest + args.new_tokens) / (shortest + args.new_tokens)
            grows = "grows" if cache_growth > 1 else "DOES NOT grow"
            print(
                f"- gpt2: cache {longest}/{shortest} = {cache_growth:.2f}x ({grows}; "
                f"linear in the tokens held would be {linear:.2f}x); ms/token {longest}/{shortest} = {growth:.2f}x"
            )
        else:
            print(
                f"- {name}: ms/token {longest}/{shortest} = {growth:.2f}x; cache {longest}/{shortest} = "
                f"{cache_growth:.2f}x (its global heads keep every token{against_gpt2} at {longest})"
            )


def static_compiled(shape: Shape, args) -> None:
    """`--static-compiled`: every (model, L) decoding through its static cache and compiled forward, and eagerly
    with the default cache, all in turns after the warm-up; then the table and the targets."""
    print(f"> load average before: {' '.join(f'{load:.2f}' for load in os.getloadavg())}")
    backend = check_static_decoding(args.models, args.compile_backend, args.device)
    generator = torch.Generator().manual_seed(args.seed)
    prompts = {length: torch.randint(0, shape.vocab_size, (1, length), generator=generator) for length in args.contexts}
    compiled, eager = {}, {}
    for name in args.models:
        torch.manual_seed(args.seed)
        model = build_model(name, shape, args.device).eval()
        for length in args.contexts:
            prompt = prompts[length].to(args.device)
            compiled[name, length] = CompiledStaticDecoder(model, prompt, args.new_tokens, backend)
            eager[name, length] = Decoder(model, prompt)
            for _ in range(args.compiled_warm_up):  # the compiles, and the eager decoder's first calls
                compiled[name, length].step()
                eager[name, length].step()
    decoders = {("compiled", key): decoder for key, decoder in compiled.items()}
    decoders |= {("eager", key): decoder for key, decoder in eager.items()}
    (machine, own), wall = cpu_seconds(), time.perf_counter()
    with torch.compiler.set_stance("fail_on_recompile"):  # a step that compiles would be timed: refused
        per_token = decode(decoders, args.new_tokens - args.compiled_warm_up, args.device, skip=0)
    (machine_after, own_after), wall = cpu_seconds(), time.perf_counter() - wall
    others = max(0.0, (machine_after - machine) - (own_after - own)) / (wall * os.cpu_count())
    print_static_notes(shape, args, backend, others)
    print_static_table(compiled, eager, per_token, args)


def print_static_notes(shape: Shape, args, backend: str, others: float) -> None:
    measured = args.new_tokens - args.compiled_warm_up
    print(f"> {describe_machine(args.device)}")
    print(
        f"> {shape.n_layer} layers, width {shape.n_embd}, {shape.n_head} heads, vocab {shape.vocab_size}, "
        f"n_positions {shape.n_positions}, fp32, batch 1, seed {args.seed}"
    )
    print(
        f"> per context L: a static cache of L + {args.new_tokens} slots (HfAttnCache(config, max_cache_len), "
        "StaticCache for gpt2), the prompt prefilled eagerly (logits_to_keep=1), then "
        f"{args.new_tokens} greedy steps through torch.compile(model.forward, fullgraph=True, backend={backend!r});"
    )
    print(
        f"> ms/token = median of steps {args.compiled_warm_up + 1}..{args.new_tokens}, the first "
        f"{args.compiled_warm_up} (compiles) left out and no later step allowed to compile "
        f"(set_stance('fail_on_recompile')); every (model, L) compiled on its own (`own_code`);"
    )
    print(
        "> eager = the same prompt decoded with the model's default cache, taking its steps in turn with the compiled "
        f"ones ({measured} timed); tokens = eager: the compiled decoding chose the same {args.new_tokens + 1} tokens;"
    )
    print(
        "> cache = bytes of the static cache's keys and values (every slot); speed-ups: the reference's ms/token over "
        "this one's (above 1: faster); cache vs gpt2: bytes over gpt2's (below 1: smaller)"
    )
    print(
        f"> load average after: {' '.join(f'{load:.2f}' for load in os.getloadavg())}; other processes took "
        f"{others:.0%} of the {os.cpu_count()} CPUs while the steps were timed"
    )


def print_static_table(compiled: dict, eager: dict, per_token: dict, args) -> None:
    names, contexts = args.models, args.contexts
    ms = {key: per_token["compiled", key] * 1e3 for key in compiled}
    eager_ms = {key: per_token["eager", key] * 1e3 for key in eager}
    memory = {key: decoder.cache_bytes() for key, decoder in compiled.items()}
    same = {key: compiled[key].token_list() == eager[key].token_list() for key in compiled}
    has_gpt2 = "gpt2" in names
    print_header(
        "model", "context", "ms/token", "speed-up vs gpt2", "eager ms/token (default cache)", "speed-up vs own eager",
        "static cache MiB", "cache vs gpt2", "graphs compiled", "tokens = eager",
    )  # fmt: skip
    for length in contexts:
        for name in names:
            key, gpt2 = (name, length), ("gpt2", length)
            print_row(
                name, length, f"{ms[key]:.2f}", f"{ms[gpt2] / ms[key]:.2f}x" if has_gpt2 else "-",
                f"{eager_ms[key]:.2f}", f"{eager_ms[key] / ms[key]:.2f}x", mib(memory[key]),
                f"{memory[key] / memory[gpt2]:.2f}x" if has_gpt2 else "-", compiled[key].graphs,
                "yes" if same[key] else "NO",
            )  # fmt: skip
    if not all(same.values()):
        print("\n> WRONG TOKENS: some compiled static decoding differs from eager decoding; the figures above are void")
    if has_gpt2:
        print_static_targets(ms, memory, args)


def print_static_targets(ms: dict, memory: dict, args) -> None:
    """(a) no hf_attn kind slower than GPT-2 at the shortest context; (b) local-1 at least
    `STATIC_LOCAL_SPEEDUP_TARGET` times GPT-2's speed at the longest; (c) no kind's static cache larger than GPT-2's."""
    kinds = [name for name in args.models if name != "gpt2"]
    shortest, longest = args.contexts[0], args.contexts[-1]
    speed_up = {key: ms["gpt2", key[1]] / value for key, value in ms.items()}
    verdict = {True: "met", False: "MISSED"}
    print("\n> targets, static cache and compiled forward, speed-up = gpt2 ms/token over the model's:\n")
    slowest = min(kinds, key=lambda name: speed_up[name, shortest], default=None)
    if slowest is not None:
        listed = ", ".join(f"{name} {speed_up[name, shortest]:.2f}x" for name in kinds)
        print(f"- (a) no kind slower than gpt2 at {shortest}: {verdict[speed_up[slowest, shortest] >= 1]} ({listed})")
    if "local-1" in kinds:
        value = speed_up["local-1", longest]
        print(
            f"- (b) local-1 >= {STATIC_LOCAL_SPEEDUP_TARGET}x gpt2's speed at {longest}: "
            f"{verdict[value >= STATIC_LOCAL_SPEEDUP_TARGET]} ({value:.2f}x)"
        )
    largest = {name: max(memory[name, length] / memory["gpt2", length] for length in args.contexts) for name in kinds}
    if largest:
        listed = ", ".join(f"{name} {value:.2f}x" for name, value in largest.items())
        print(
            f"- (c) no kind's static cache larger than gpt2's: {verdict[max(largest.values()) <= 1]} "
            f"(largest ratio over the contexts: {listed})"
        )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    contexts, names = args.contexts, args.models
    shape = Shape(
        n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head, vocab_size=args.vocab_size,
        n_positions=contexts[-1] + args.new_tokens,
    )  # fmt: skip
    if args.static_compiled:
        return static_compiled(shape, args)
    models = {}
    generator = torch.Generator().manual_seed(args.seed)
    warm_up = torch.randint(0, shape.vocab_size, (1, contexts[0]), generator=generator).to(args.device)
    for name in names:
        torch.manual_seed(args.seed)
        models[name] = build_model(name, shape, args.device).eval()
        decode({(name, 0): Decoder(models[name], warm_up)}, 2, args.device)  # first calls are slow: not in the figures

    prompts = {length: torch.randint(0, shape.vocab_size, (1, length), generator=generator) for length in contexts}
    decoders = {(name, length): Decoder(models[name], prompts[length].to(args.device)) for length in contexts
                for name in names}  # fmt: skip
    per_token = decode(decoders, args.new_tokens, args.device)
    latency = {name: {length: per_token[name, length] for length in contexts} for name in names}
    memory = {name: {length: decoders[name, length].cache_bytes() for length in contexts} for name in names}
    print_notes(shape, args)
    print_header("model", "context", "ms/token", "vs own at shortest context", "vs gpt2 at this context", "cache MiB")
    for length in contexts:
        gpt2 = latency["gpt2"][length] if "gpt2" in names else None
        for name in names:
            seconds, own, held = latency[name][length], latency[name][contexts[0]], memory[name][length]
            print_row(name, length, f"{seconds * 1e3:.2f}", ratio(seconds, own), ratio(seconds, gpt2), mib(held))
    if len(contexts) > 1:
        print_targets(latency, memory, args)


if __name__ == "__main__":
    main()
