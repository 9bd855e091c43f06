"""What making heads local costs a pretrained decoder and what it saves: WikiText-2 test perplexity against the share
of heads made local by `hf_attn.hybridize`, chosen by `hf_attn.select_heads` and at random, with the KV-cache bytes per
token and the decode speed at a long context beside it, as ratios to the unmodified model; then a short fine-tune of
each converted model ("healing") and the perplexity after it.

    python -m benchmarks.hybrid_tradeoff checkpoints/llama-wikitext-valid/model checkpoints/gpt2-wikitext-valid/model
    python -m benchmarks.hybrid_tradeoff meta-llama/Llama-3.2-1B Qwen/Qwen2.5-0.5B --data_dir ''   # online: the Hub
    python -m benchmarks.hybrid_tradeoff smollm2-135m-instruct gemma-3-270m   # offline: GGUF files of pip packages

A model is a Hub id, a local folder, a `.gguf` file or a folder holding one, or a short name of
`hf_attn.pretrained.PACKAGED_MODELS`; its tokenizer comes from the same place unless `--tokenizer` names one.

Per model: the heads (key/value groups with grouped-query attention) are scored once by `select_heads`' loss score
on the training text (WikiText-2 validation offline, train online); for each fraction the lowest-scoring ones are
made local, or as many drawn at random. Perplexity is on the test split (sliding windows,
`hf_attn.experiments.perplexity`), which neither the scores nor the fine-tunes read. The fine-tune also runs on the
unmodified model (the 0% row): what it gains there is the extra training, not healing. Decode speed is one run per
fraction (the select_heads layout): a random prompt of `--decode_context` tokens prefilled, then `--new_tokens`
greedy steps, median ms per step, in a model of the same shape with random weights and position tables long enough
(speed does not depend on the weights), its steps interleaved with the unmodified model's (the machine's speed
drifts).
Writes OUTPUT_DIR/NAME/{results.json, results.md, tradeoff.png}.
"""

import argparse
import copy
import json
import os
import random
import tempfile
import time
from pathlib import Path

import torch
from transformers import Trainer, TrainingArguments

from benchmarks.common import describe_machine, median, write_report_and_plot
from benchmarks.generation import cache_of
from hf_attn import hybridize
from hf_attn.data.wikitext import language_modelling_blocks, load_wikitext, tokenize_text
from hf_attn.experiments import InMemoryDataset, perplexity
from hf_attn.experiments.reports import pyplot, save
from hf_attn.hybrid import cache_bytes_per_token, original_cache_bytes_per_token
from hf_attn.pretrained import load_causal_lm, load_tokenizer
from hf_attn.select_heads import choose_layout, loss_scores, units_per_layer

SELECTIONS = ("select_heads", "random")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", help="Hub ids, local folders or .gguf files of Llama, Qwen2, Qwen3, "
                        "Mistral, Gemma 3 or GPT-2 models")  # fmt: skip
    parser.add_argument("--data_dir", default="../shared/data/wikitext-2-raw",
                        help="folder of wiki.{valid,test}.raw; '' for the Hub's wikitext-2-raw-v1")  # fmt: skip
    parser.add_argument("--tokenizer", help="tokenizer id, folder or .gguf file (default: each model's)")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0])
    parser.add_argument("--local_window", type=int, default=16, help="k: previous tokens a local head sees")
    parser.add_argument("--unit", choices=("kv_group", "head"), default="kv_group")
    parser.add_argument("--block_size", type=int, default=256, help="context of the perplexity windows")
    parser.add_argument("--eval_tokens", type=int, default=65536, help="test tokens scored (the first ones)")
    parser.add_argument("--calibration_blocks", type=int, default=8, help="validation blocks select_heads scores on")
    parser.add_argument("--heal_steps", type=int, default=100, help="fine-tuning steps after converting (0: none)")
    parser.add_argument("--heal_learning_rate", type=float, default=3e-4)
    parser.add_argument("--decode_context", type=int, default=8192)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0, help="the random layouts' and the fine-tunes' seed")
    parser.add_argument("--output_dir", default="outputs/hybrid_tradeoff")
    args = parser.parse_args(argv)
    if any(not 0 <= f <= 1 for f in args.fractions) or args.local_window < 1 or args.block_size <= args.local_window:
        parser.error("need fractions in [0, 1], --local_window >= 1 and --block_size > --local_window")
    if args.new_tokens < 3:
        parser.error(f"--new_tokens must be >= 3 (the first two steps are warm-up), got {args.new_tokens}")
    return args


def texts(args, tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of the training text (scores and fine-tunes read it: WikiText-2 validation offline, train online)
    and of the first `eval_tokens` of the test split."""
    splits = load_wikitext(args.data_dir or None)
    training = torch.as_tensor(tokenize_text(splits.train_text, tokenizer))
    return training, torch.as_tensor(tokenize_text(splits.eval_text, tokenizer)[: args.eval_tokens])


def random_layout(scores: torch.Tensor, fraction: float, heads: int, seed: int) -> list[list[str]]:
    """As many units local as `choose_layout` makes, drawn at random."""
    generator = random.Random(seed)
    return choose_layout(torch.tensor([generator.random() for _ in range(scores.numel())]).view(scores.shape),
                         fraction, heads)  # fmt: skip


def heal(model, validation: torch.Tensor, args) -> float:
    """A short fine-tune on validation blocks, nothing saved; returns the training seconds."""
    blocks = InMemoryDataset(language_modelling_blocks(validation.numpy(), args.block_size))
    with tempfile.TemporaryDirectory() as scratch:
        training = TrainingArguments(
            scratch, max_steps=args.heal_steps, per_device_train_batch_size=args.batch_size,
            learning_rate=args.heal_learning_rate, lr_scheduler_type="constant", seed=args.seed, save_strategy="no",
            report_to="none", disable_tqdm=True, logging_steps=max(1, args.heal_steps),
            use_cpu=not torch.cuda.is_available(),
        )  # fmt: skip
        start = time.perf_counter()
        Trainer(model=model, args=training, train_dataset=blocks).train()
    model.eval()
    return time.perf_counter() - start


def decode_ms(models: dict, args) -> dict[str, float]:
    """Median ms per greedy step of each model after a prefill of the same `decode_context` random tokens, batch 1.
    The models' steps are interleaved, in turn first, so that the machine's drift and the order fall on all alike."""
    torch.manual_seed(args.seed)
    some_model = next(iter(models.values()))
    prompt = torch.randint(0, some_model.config.vocab_size, (1, args.decode_context), device=some_model.device)
    steps = {name: [] for name in models}
    with torch.no_grad():
        outputs = {name: model(prompt, use_cache=True) for name, model in models.items()}
        for step in range(args.new_tokens):
            order = list(models) if step % 2 else list(reversed(models))
            for name in order:
                token, cache = outputs[name].logits[:, -1:].argmax(-1), cache_of(outputs[name])
                start = time.perf_counter()
                outputs[name] = models[name](token, cache=cache, use_cache=True)
                if some_model.device.type == "cuda":
                    torch.cuda.synchronize(some_model.device)
                steps[name].append(time.perf_counter() - start)
    return {name: 1000 * median(times[2:]) for name, times in steps.items()}  # the first steps warm up


def timing_model(model):
    """A model of `model`'s shape, random weights, position tables long enough for the decode benchmark."""
    config = copy.deepcopy(model.config)
    for name in ("n_positions", "max_position_embeddings"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), 1 << 15))
    return type(model)(config).eval()


def run_name(model: str) -> str:
    """A model's results folder: a Hub id's name, a checkpoint's (`checkpoints/NAME/model` gives NAME), a GGUF file's
    name without `.gguf`."""
    path = Path(model.rstrip("/"))
    if path.suffix == ".gguf":
        return path.stem
    return path.parent.name if path.name == "model" and path.parent.name else path.name


def run_model(name: str, args) -> dict:
    tokenizer = load_tokenizer(args.tokenizer or name)
    model = load_causal_lm(name).eval()
    validation, test = texts(args, tokenizer)
    calibration = validation[: args.calibration_blocks * args.block_size].view(-1, args.block_size)

    def test_perplexity(m) -> float:
        return perplexity(m, test, args.block_size, args.block_size // 2, args.batch_size)["perplexity"]

    original = test_perplexity(model)
    baseline = timing_model(model)
    timing = copy.deepcopy(baseline)
    scores = loss_scores(
        model, calibration, local_window=args.local_window, sink_tokens=0, batch_size=args.batch_size, unit=args.unit
    )
    heads = model.config.num_attention_heads
    rows = []
    for fraction in args.fractions:
        layouts = {"select_heads": choose_layout(scores, fraction, heads),
                   "random": random_layout(scores, fraction, heads, args.seed)}  # fmt: skip
        row = {"fraction": fraction, "local_heads": sum(layer.count("local") for layer in layouts["select_heads"])}
        for selection, layout in layouts.items():
            hybridize(model, head_layout=layout, local_window=args.local_window)
            row[f"perplexity_{selection}"] = test_perplexity(model)
        hybridize(model, head_layout=layouts["select_heads"], local_window=args.local_window)
        row["cache_ratio"] = cache_bytes_per_token(model.config) / original_cache_bytes_per_token(model.config)
        hybridize(timing, head_layout=layouts["select_heads"], local_window=args.local_window)
        row["decode_ms"] = decode_ms({"unmodified": baseline, "converted": timing}, args)
        row["decode_ratio"] = row["decode_ms"]["unmodified"] / row["decode_ms"]["converted"]  # > 1: faster
        if args.heal_steps:  # at 0%: the unmodified model fine-tuned alike, the control
            healed = copy.deepcopy(model)
            torch.manual_seed(args.seed)
            row["heal_seconds"] = heal(healed, validation, args)
            row["perplexity_healed"] = test_perplexity(healed)
        rows.append(row)
    return {
        "model": name, "family": model.config.model_type.removeprefix("hf_attn_"),
        "parameters": model.num_parameters(), "layers": model.config.num_hidden_layers, "heads": heads,
        "units_per_layer": units_per_layer(model.config, args.unit), "unit": args.unit,
        "local_window": args.local_window, "original_perplexity": original,
        "test_tokens": len(test), "scores": scores.tolist(), "rows": rows, "settings": vars(args),
        "machine": {"load_average": os.getloadavg(), "torch": describe_machine(str(model.device))},
    }  # fmt: skip


def report(result: dict) -> str:
    """results.md: what was measured, then `table`."""
    return (
        f"# {run_name(result['model'])} ({result['family']}, {result['parameters']:,} parameters): heads made "
        f"{result['local_window']}-local\n\n{table(result)}"
    )


def table(result: dict) -> str:
    """A row per share of local heads: perplexity by selection and after healing, cache and decode-speed ratios."""
    lines = [
        f"Unmodified: test perplexity {result['original_perplexity']:.2f} on {result['test_tokens']:,} tokens. "
        f"Units made local: {result['unit']}s, by select_heads' loss score or at random. Decode speed at "
        f"{result['settings']['decode_context']} tokens of context, the unmodified model timed beside each.", "",
        "| local share | local heads | perplexity, select_heads | perplexity, random | perplexity, select_heads "
        "+ fine-tune | KV bytes per token | decode speed |", "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for row in result["rows"]:
        healed = f"{row['perplexity_healed']:.2f}" if "perplexity_healed" in row else "n/a"
        lines.append(f"| {row['fraction']:.0%} | {row['local_heads']} | {row['perplexity_select_heads']:.2f} | "
                     f"{row['perplexity_random']:.2f} | {healed} | {row['cache_ratio']:.2f}x | "
                     f"{row['decode_ratio']:.2f}x |")  # fmt: skip
    lines += [
        "",
        "KV bytes per token and decode speed are ratios to the unmodified model (speed > 1: faster). At 0% "
        "the fine-tune column is the unmodified model fine-tuned alike: the gain of the extra training alone.",
    ]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    if (plt := pyplot()) is None:
        return
    rows = result["rows"]
    x = [row["fraction"] for row in rows]
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(x, [row["perplexity_select_heads"] for row in rows], marker="o", label="select_heads")
    axes.plot(x, [row["perplexity_random"] for row in rows], marker="s", linestyle="--", label="random heads")
    healed = [(row["fraction"], row["perplexity_healed"]) for row in rows if "perplexity_healed" in row]
    if healed:
        axes.plot(*zip(*healed, strict=True), marker="^", linestyle=":", label="select_heads + fine-tune")
    axes.axhline(result["original_perplexity"], color="grey", linewidth=0.8, label="unmodified")
    axes.set_xlabel("share of heads made local")
    axes.set_ylabel("WikiText-2 test perplexity")
    perplexities = [value for line in axes.get_lines() for value in line.get_ydata()]
    if max(perplexities) > 3 * min(perplexities):  # a wide range reads better on a log scale
        axes.set_yscale("log")
    cache = axes.twinx()
    cache.plot(x, [row["cache_ratio"] for row in rows], color="black", alpha=0.4, linestyle="-.",
               label="KV bytes per token (right axis)")  # fmt: skip
    cache.set_ylim(0, 1.05)
    cache.set_ylabel("KV-cache bytes per token, ratio to unmodified")
    axes.set_title(f"{run_name(result['model'])}: k = {result['local_window']}")
    handles = axes.get_legend_handles_labels()[0] + cache.get_legend_handles_labels()[0]
    axes.legend(handles=handles, fontsize=8, loc="center left")
    save(figure, path)


def write_reports(result: dict, folder: Path) -> str:
    """FOLDER/results.md and FOLDER/tradeoff.png from `result`; returns the report's text."""
    return write_report_and_plot(result, folder, report, plot, "tradeoff.png")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"load average at start: {os.getloadavg()}")
    for name in args.models:
        result = run_model(name, args)
        folder = Path(args.output_dir) / run_name(name)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "results.json").write_text(json.dumps(result, indent=1) + "\n")
        print(write_reports(result, folder))


if __name__ == "__main__":
    main()
