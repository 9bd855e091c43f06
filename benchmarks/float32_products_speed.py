"""A bfloat16 model's decoding step under `Float32Products` (benchmarks/float32_products.py), with each weight's
float32 copy kept between products against widening every weight at every product, in one run: seconds a token,
their ratio, and whether both greedy continuations are the same tokens (they must be: the copies are exact).

    python -m benchmarks.float32_products_speed --model smollm2-135m-instruct --context 2048 --steps 16 --threads 1

The two modes alternate (`--rounds` of each), on one prompt of `--context` random token ids prefilled once per
round; the line printed first gives `uptime`, as the machine is rarely idle."""

import time

import torch

from benchmarks.common import command_line_parser, machine_load
from benchmarks.float32_products import Float32Products
from hf_attn.pretrained import load_causal_lm, source_argument


class WidenedEachTime(Float32Products):
    """The baseline: every floating tensor widened again at each product, weights included."""

    def widened(self, value):
        return value.float() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


@torch.inference_mode()
def decoding(model, prompt: torch.Tensor, steps: int, mode: Float32Products) -> tuple[float, list[int]]:
    """Seconds a greedy decoding step takes after PROMPT's prefill, and the tokens chosen."""
    with mode:
        output = model(prompt, use_cache=True)
        cache, token, tokens = output.cache, output.logits[:, -1:].argmax(-1), []
        start = time.perf_counter()
        for _ in range(steps):
            output = model(token, cache=cache, use_cache=True)
            token = output.logits[:, -1:].argmax(-1)
            tokens.append(int(token))
    return (time.perf_counter() - start) / steps, tokens


def main(argv: list[str] | None = None) -> None:
    parser = command_line_parser("benchmarks.float32_products_speed", __doc__)
    parser.add_argument("--model", type=source_argument, default="smollm2-135m-instruct")
    parser.add_argument("--context", type=int, default=2048, help="prompt tokens before decoding (default 2048)")
    parser.add_argument("--steps", type=int, default=16, help="decoding steps timed (default 16)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each mode, alternating (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    for name in ("context", "steps", "rounds", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    print(f"load at start: {machine_load()['uptime']}", flush=True)
    model = load_causal_lm(args.model, dtype=torch.bfloat16).eval()
    prompt = torch.randint(0, model.config.vocab_size, (1, args.context), generator=torch.Generator().manual_seed(0))
    seconds: dict[str, list[float]] = {"widened each time": [], "copies kept": []}
    tokens = set()
    for _ in range(args.rounds):
        for name, mode in (("widened each time", WidenedEachTime), ("copies kept", Float32Products)):
            step, chosen = decoding(model, prompt, args.steps, mode())
            seconds[name].append(step)
            tokens.add(tuple(chosen))
    for name, values in seconds.items():
        print(f"{name}: {min(values):.3f} s a token (best of {len(values)}; all: "
              f"{', '.join(f'{value:.3f}' for value in values)})")  # fmt: skip
    ratio = min(seconds["copies kept"]) / min(seconds["widened each time"])
    print(f"copies kept / widened each time: {ratio:.2f}; the same tokens: {len(tokens) == 1}")
    print(f"load at the end: {machine_load()['uptime']}", flush=True)


if __name__ == "__main__":
    main()
