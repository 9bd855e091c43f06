"""A first look at hf_attn in under a minute of CPU: a hybrid language model and a positional regressor.

1. `hybrid_gpt2` (per layer half global heads, half strict 1-local heads, Paper B) learns next-token
   prediction on sequences that repeat a random 3-token motif, then continues unseen prompts with cached
   greedy decoding, checked token for token against decoding without a cache.
2. `positional_gpt2` (every head positional, Paper A: weights from positions only, values from the data)
   learns running sums of 8 numbers drawn from [-2, 2] beside a standard model of the same size, and both
   are tested on wider ranges [-2c, 2c] (Paper A's value generalisation). Seconds of training are far from
   the paper's 2001 epochs: read the table as a smoke test, not as a reproduction of the paper's gap.

Both train with `transformers.Trainer` and are built through the Auto classes, as a user would.
"""

import argparse
import tempfile
import time

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    Trainer,
    TrainingArguments,
)

import hf_attn  # noqa: F401  (registers the model types)

VOCAB, MOTIF, LENGTH = 16, 3, 24
SCALES = (1, 2, 4, 8)  # test numbers drawn from [-2c, 2c]; c = 1 is the training range


def motif_sequences(count: int, generator: torch.Generator) -> torch.Tensor:
    motifs = torch.randint(0, VOCAB, (count, MOTIF), generator=generator)
    return motifs.repeat(1, LENGTH // MOTIF)


def running_sums(count: int, scale: float, generator: torch.Generator) -> list[dict]:
    values = (torch.rand(count, 8, generator=generator) * 2 - 1) * 2 * scale
    return [{"numeric_values": x, "labels": x.cumsum(0)} for x in values]


def train(model, dataset, steps: int, learning_rate: float, output_dir: str) -> float:
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=64,
        learning_rate=learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=steps // 10,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    start = time.perf_counter()
    Trainer(model=model, args=args, train_dataset=dataset).train()
    return time.perf_counter() - start


def describe(model) -> str:
    config = model.config
    layout = ", ".join(
        f"{config.head_layout[0].count(kind)} {kind}"
        for kind in ("global", "local", "positional")
        if kind in config.head_layout[0]
    )
    window = f", k={config.local_window}" if "local" in config.head_layout[0] else ""
    return (
        f"{type(model).__name__}: {config.n_layer} layers x ({layout}) heads{window}, "
        f"{'strict' if not config.attend_to_self else 'inclusive'} masks, "
        f"{sum(p.numel() for p in model.parameters()):,} parameters"
    )


def hybrid_language_model(steps: int, output_dir: str) -> None:
    generator = torch.Generator().manual_seed(0)
    config = AutoConfig.for_model(
        "hybrid_gpt2",
        n_layer=2,
        n_head=4,
        n_embd=64,
        vocab_size=VOCAB,
        n_positions=64,
        local_window=1,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = AutoModelForCausalLM.from_config(config)
    print(describe(model))
    sequences = motif_sequences(4096, generator)
    seconds = train(model, [{"input_ids": s, "labels": s} for s in sequences], steps, 3e-3, output_dir)
    model.eval()
    prompts = motif_sequences(64, generator)[:, :6]
    cached = model.generate(prompts, max_new_tokens=12, do_sample=False)
    uncached = model.generate(prompts, max_new_tokens=12, do_sample=False, use_cache=False)
    expected = prompts.repeat(1, 3)
    accuracy = (cached[:, 6:] == expected[:, 6:]).float().mean().item()
    print(f"  trained {steps} steps in {seconds:.1f}s; continues unseen motifs with {accuracy:.1%} token accuracy")
    print(f"  cached decoding == decoding without cache: {torch.equal(cached, uncached)}")
    print(f"  e.g. prompt {prompts[0].tolist()} -> {cached[0, 6:].tolist()}")


def running_sum_regressor(model_type: str, steps: int, output_dir: str, **fields) -> dict[int, float]:
    """Paper A's set-up: concat-then-MLP blocks without LayerNorm, bidirectional, values embedded as v * w + b."""
    generator = torch.Generator().manual_seed(1)
    config = AutoConfig.for_model(
        model_type,
        n_layer=2,
        n_head=2,
        n_embd=64,
        n_positions=8,
        vocab_size=1,
        numeric_inputs=True,
        num_labels=1,
        problem_type="regression",
        block_style="concat_mlp",
        activation_function="relu",
        is_causal=False,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **fields,
    )
    model = AutoModelForTokenClassification.from_config(config)
    print(describe(model))
    seconds = train(model, running_sums(8192, 1.0, generator), steps, 3e-3, output_dir)
    print(f"  trained {steps} steps in {seconds:.1f}s")
    model.eval()
    errors = {}
    for scale in SCALES:
        test = running_sums(1000, scale, generator)
        values = torch.stack([t["numeric_values"] for t in test])
        labels = torch.stack([t["labels"] for t in test])
        with torch.no_grad():
            errors[scale] = torch.mean((model(numeric_values=values).logits[..., 0] - labels) ** 2).item()
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="training steps per model")
    parser.add_argument("--regression-steps", type=int, default=1500, help="training steps per running-sum model")
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as output_dir:
        hybrid_language_model(args.steps, output_dir)
        positional = running_sum_regressor("positional_gpt2", args.regression_steps, output_dir)
        # The standard baseline at the same size: global heads, learned positions (Paper A gives it positions).
        standard = running_sum_regressor(
            "hybrid_gpt2", args.regression_steps, output_dir, num_local_heads=0, attend_to_self=True
        )
    print("\nRunning sums, mean squared error by test range [-2c, 2c] (c = 1 is the training range):")
    print("| c | positional | standard |\n|---|---|---|")
    for scale in SCALES:
        print(f"| {scale} | {positional[scale]:.4f} | {standard[scale]:.4f} |")


if __name__ == "__main__":
    main()
