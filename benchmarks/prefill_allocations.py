"""What a prefill allocates, by operation, in the unmodified model and in the same model with its last key/value
groups made local: the transient tensors behind the peak resident memory `benchmarks.long_context` reports, beside
the cache each leaves. Bytes are torch's profiler's totals over the prefill (every allocation, freed or not), not a
peak; the cache's are the tensors it holds after it.

    python -m benchmarks.prefill_allocations smollm2-135m-instruct --tokens 4096 --local_groups 1 \
        --local_window 256 --sink_tokens 4 --output docs/results/long_context/smollm2-135m-instruct/prefill.md
"""

import argparse
import copy
import os
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import describe_machine
from benchmarks.generation import cache_bytes
from hf_attn import hybridize
from hf_attn.hybrid import num_key_value_heads
from hf_attn.pretrained import load_causal_lm

MIB = 2**20


def allocations(model, ids: torch.Tensor) -> tuple[dict[str, int], int]:
    """Bytes allocated per operation in one prefill of `ids` (after one short warm-up), and the cache's bytes."""
    with torch.inference_mode():
        model(ids[:, :16], use_cache=True, logits_to_keep=1)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
            outputs = model(ids, use_cache=True, logits_to_keep=1)
    by_op = {event.key: event.self_cpu_memory_usage for event in profiler.key_averages()}
    return {op: size for op, size in by_op.items() if size > 0}, cache_bytes(outputs.cache)


def last_groups_local(config, local_groups: int) -> list[list[str]]:
    """Every layer's last `local_groups` key/value groups local (their query heads), the rest global."""
    heads, groups = config.num_attention_heads, num_key_value_heads(config)
    first_local = (groups - local_groups) * (heads // groups)
    return [["global"] * first_local + ["local"] * (heads - first_local) for _ in range(config.num_hidden_layers)]


def table(unmodified: dict[str, int], hybrid: dict[str, int], caches: tuple[int, int]) -> list[str]:
    ops = sorted(set(unmodified) | set(hybrid), key=lambda op: -max(unmodified.get(op, 0), hybrid.get(op, 0)))
    lines = ["| operation | unmodified MiB | hybridized MiB |", "|---|---|---|"]
    lines += [f"| `{op}` | {unmodified.get(op, 0) / MIB:.0f} | {hybrid.get(op, 0) / MIB:.0f} |" for op in ops[:12]]
    totals = sum(unmodified.values()) / MIB, sum(hybrid.values()) / MIB
    lines.append(f"| all operations | {totals[0]:.0f} | {totals[1]:.0f} ({totals[1] / totals[0]:.2f}x) |")
    lines.append(f"| cache after the prefill | {caches[0] / MIB:.0f} | {caches[1] / MIB:.0f} "
                 f"({caches[1] / caches[0]:.2f}x) |")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="Hub id, folder, .gguf file or a packaged model's short name")
    parser.add_argument("--tokens", type=int, default=4096, help="prompt length")
    parser.add_argument("--local_groups", type=int, default=1, help="key/value groups per layer made local")
    parser.add_argument("--local_window", type=int, default=256)
    parser.add_argument("--sink_tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, help="Markdown file to write the table to")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_causal_lm(args.model).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, args.tokens), generator=torch.Generator().manual_seed(0))
    unmodified = allocations(model, ids)
    layout = last_groups_local(model.config, args.local_groups)
    hybrid = hybridize(copy.deepcopy(model), head_layout=layout, local_window=args.local_window,
                       sink_tokens=args.sink_tokens)  # fmt: skip
    converted = allocations(hybrid, ids)
    header = (f"{args.model}, float32, {args.threads} threads, one prefill of {args.tokens} tokens; hybridized: the "
              f"last {args.local_groups} key/value group(s) of every layer {args.local_window}-local with "
              f"{args.sink_tokens} sinks. {describe_machine('cpu')}; load average {os.getloadavg()[0]:.2f} at the "
              "end.")  # fmt: skip
    report = "\n".join([header, "", *table(unmodified[0], converted[0], (unmodified[1], converted[1]))]) + "\n"
    if args.output:
        args.output.write_text(report)
    print(report)
    return report


if __name__ == "__main__":
    main()
