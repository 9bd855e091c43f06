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

    python -m benchmarks.generation                                   # L in {512, ..., 8192}, 32 new tokens
    python -m benchmarks.generation --contexts 1024 4096 --models local-1 gpt2
    python -m benchmarks.generation --device cuda
    python -m benchmarks.generation --contexts 16 32 --new-tokens 3 --n-layer 1 --n-embd 32 --n-head 4 --vocab-size 100
"""

import argparse
import inspect

import torch
from transformers import PreTrainedModel

from benchmarks.common import Shape, build_model, describe_machine, median, print_header, print_row, timed
from hf_attn import HfAttnCache

GENERATION_MODELS = ["local-1", "local-4", "hybrid-1", "positional", "gpt2"]
LOCAL_MODELS = {"local-1", "local-4"}
# local and positional models: ms/token at the longest context over ms/token at the shortest
LATENCY_TARGET = {"local-1": 1.25, "local-4": 1.25, "positional": 1.25}


def cache_bytes(cache) -> int:
    """Bytes of every cached key and value: HfAttnCache's own count, or a DynamicCache's layers summed."""
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
    """One model decoding greedily from one prompt: the prefill at construction, then `step()` per token."""

    def __init__(self, model: PreTrainedModel, prompt: torch.Tensor):
        self.model, self.argument, self.prompt_length = model, cache_argument(model), prompt.shape[-1]
        with torch.inference_mode():
            # logits_to_keep=1: the prefill's logits over the whole prompt (L x vocab) would dominate its memory.
            self.advance(model(prompt, use_cache=True, logits_to_keep=1))
        self.steps = 0

    def advance(self, outputs) -> None:
        self.cache, self.token = cache_of(outputs), outputs.logits[:, -1].argmax(-1, keepdim=True)

    def step(self) -> None:
        with torch.inference_mode():
            self.advance(self.model(self.token, use_cache=True, **{self.argument: self.cache}))
        self.steps += 1

    def cache_bytes(self) -> int:
        """Bytes the cache holds, after checking that every step went through it."""
        expected = self.prompt_length + self.steps
        if self.cache.get_seq_length() != expected:
            raise RuntimeError(f"the cache has seen {self.cache.get_seq_length()} tokens, expected {expected}")
        return cache_bytes(self.cache)


def decode(decoders: dict[tuple[str, int], Decoder], new_tokens: int, device: str) -> dict[tuple[str, int], float]:
    """Median seconds per decoded token after the first, for every (model, context) decoder, the decoders taking
    their steps in turns: a drift of the machine's speed during the run touches every context alike, so the
    growth from the shortest context to the longest is measured within one stretch of time."""
    times = {key: [] for key in decoders}
    for _ in range(new_tokens):
        for key, decoder in decoders.items():
            times[key].append(timed(decoder.step, device))
    return {key: median(seconds[1:]) for key, seconds in times.items()}


def ratio(value: float, reference: float | None) -> str:
    return "-" if reference is None else f"{value / reference:.2f}x"


def mib(num_bytes: int) -> str:
    return f"{num_bytes / 2**20:.4g}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.generation", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192], help="prompt lengths")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens decoded per context (the first is warm-up)")
    parser.add_argument(
        "--models", nargs="+", default=GENERATION_MODELS, choices=GENERATION_MODELS, metavar="MODEL",
        help=f"a subset of {', '.join(GENERATION_MODELS)} (default: all)",
    )  # fmt: skip
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


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    contexts, names = args.contexts, args.models
    shape = Shape(
        n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head, vocab_size=args.vocab_size,
        n_positions=contexts[-1] + args.new_tokens,
    )  # fmt: skip
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
