"""Pretrain a small GPT-2 (or Llama) on the text there is offline: the mixed task's GPT-2 baseline when the Hub is out
of reach, and the pretrained models `benchmarks.hybrid_tradeoff` converts with `hf_attn.hybridize`.

Paper A fine-tunes a pretrained GPT-2 (gpt2-large). Online, `training/mixed.py --baseline_model gpt2-large` does just
that. Offline there are no pretrained weights, so the closest honest substitute is built here: GPT-2's architecture
(`GPT2LMHeadModel`) and tokenizer, pretrained as a language model on every `wiki.*.raw` file of `data_dir`
(../shared/data has WikiText-2's validation and test splits, about half a million tokens), then fine-tuned on the task
by training/mixed.py with Paper A's recipe. It is far smaller than GPT-2 and has read a ten-thousandth of its text.

    python -m training.pretrain_gpt2 configs/mixed/gpt2_pretrain_cpu.yaml
    # then: python -m training.mixed configs/mixed/cpu.yaml  (baseline_model: checkpoints/gpt2-wikitext/model)
    python -m training.pretrain_gpt2 configs/hybrid/llama_pretrain_cpu.yaml   # a Llama, on the validation text only

Writes OUTPUT_DIR/{results.json, model/}: the model with its tokenizer, and held-out perplexity and run time.
"""

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
from transformers import (
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Trainer,
    TrainingArguments,
    set_seed,
)

from hf_attn.data.wikitext import language_modelling_blocks, read_text_file, tokenize_text
from hf_attn.experiments import InMemoryDataset, Run, cli, parse_config, perplexity, pretrained_problems, say
from hf_attn.experiments.arguments import below, invalid_configuration
from hf_attn.experiments.finishing import save_model_folder
from hf_attn.experiments.runs import TRAINING_FIELDS, arguments_record, claim_runs, machine_state, run_arguments
from training import CONFIGS

CONFIG = CONFIGS / "mixed" / "gpt2_pretrain_cpu.yaml"  # the mixed baseline's, beside the mixed family's configs
ARCHITECTURES = ("gpt2", "llama")


@dataclass
class PretrainArguments:
    data_dir: str = field(
        default="../shared/data/wikitext-2-raw", metadata={"help": "Folder of wiki.*.raw files; every one is read."}
    )
    files: str = field(
        default="wiki.*.raw",
        metadata={"help": "Which files of data_dir to read (a glob); wiki.valid.raw keeps the test split unseen."},
    )
    tokenizer: str = field(default="../shared/data/gpt2-tokenizer", metadata={"help": "GPT-2 tokenizer folder or id."})
    architecture: str = field(
        default="gpt2",
        metadata={"help": "`gpt2` (GPT2LMHeadModel) or `llama` (LlamaForCausalLM: RMSNorm, SwiGLU of 8/3 n_embd, "
                  "rotary positions, tied embeddings).", "choices": ARCHITECTURES},
    )  # fmt: skip
    held_out: float = field(default=0.05, metadata={"help": "Share of the tokens (the last ones) kept for perplexity."})
    block_size: int = field(default=128, metadata={"help": "Tokens per training sequence."})
    n_layer: int = field(default=4, metadata={"help": "Depth (GPT-2 small: 12, gpt2-large: 36)."})
    n_embd: int = field(default=128, metadata={"help": "Width (GPT-2 small: 768)."})
    n_head: int = field(default=4, metadata={"help": "Heads (GPT-2 small: 12)."})
    n_kv_head: int | None = field(
        default=None, metadata={"help": "Llama only: key/value heads (grouped-query attention); default n_head."}
    )
    resume: bool = field(default=False, metadata={"help": "Continue an interrupted pretraining from its checkpoint."})

    # Every other field is a setting of the one run: a rerun or resume that changes one is refused.
    run_fields: ClassVar[tuple[str, ...]] = ("resume",)
    evaluation_fields: ClassVar[tuple[str, ...]] = ()


def validate(args: PretrainArguments) -> list[Path]:
    """The text files, or a ValueError naming the field, before anything is built."""
    problems = []
    folder = Path(args.data_dir)
    files = sorted(folder.glob(args.files)) if folder.is_dir() else []
    if not files:
        problems.append(
            f"data_dir {folder} holds no file matching {args.files} (offline: ../shared/data/wikitext-2-raw)"
        )
    if not 0 < args.held_out < 1:
        problems.append(f"held_out must be in (0, 1), got {args.held_out}")
    if args.block_size < 2:
        problems.append(f"block_size must be >= 2, got {args.block_size}")
    problems += below("n_layer", "n_embd", "n_head", of=args)  # GPT2Config does not check them
    if min(args.n_embd, args.n_head) >= 1 and args.n_embd % args.n_head:
        problems.append(f"n_embd ({args.n_embd}) must be divisible by n_head ({args.n_head})")
    if args.n_kv_head is not None and (
        args.architecture != "llama" or args.n_kv_head < 1 or args.n_head % args.n_kv_head
    ):
        problems.append(f"n_kv_head is for architecture llama and must divide n_head ({args.n_head}), got "
                        f"{args.n_kv_head} with architecture {args.architecture}")  # fmt: skip
    invalid_configuration(problems + pretrained_problems("tokenizer", args.tokenizer))
    return files


def build_model(args: PretrainArguments, vocab_size: int, tokenizer) -> PreTrainedModel:
    special = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    if args.architecture == "llama":
        return LlamaForCausalLM(LlamaConfig(
            vocab_size=vocab_size, hidden_size=args.n_embd, num_hidden_layers=args.n_layer,
            num_attention_heads=args.n_head, num_key_value_heads=args.n_kv_head or args.n_head,
            intermediate_size=8 * args.n_embd // 3, max_position_embeddings=args.block_size, tie_word_embeddings=True,
            **special,
        ))  # fmt: skip
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_layer=args.n_layer, n_embd=args.n_embd,
                                      n_head=args.n_head, **special))  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    args, training_args = parse_config((PretrainArguments, TrainingArguments), argv, [CONFIG])
    files = validate(args)
    settings = {"pretrain": arguments_record(args),
                "training": {name: getattr(training_args, name) for name in TRAINING_FIELDS}}  # fmt: skip
    run = Run(Path(training_args.output_dir), args.architecture, training_args.seed, settings)
    claim_runs(run.folder, [run], args)
    if run.finished:
        say(f"{run.folder}: pretrained earlier, kept as it is ({run.model_folder})")
        return
    set_seed(training_args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    token_ids = np.concatenate([tokenize_text(read_text_file(path), tokenizer) for path in files])
    split = int(len(token_ids) * (1 - args.held_out))
    model = build_model(args, len(tokenizer), tokenizer)
    train_set = InMemoryDataset(language_modelling_blocks(token_ids[:split], args.block_size))
    trainer = Trainer(model=model, args=run_arguments(training_args, run), train_dataset=train_set)
    totals = run.train(trainer, args.resume)
    held_out = perplexity(model, token_ids[split:], context_length=args.block_size, stride=args.block_size // 2)
    model.config.use_cache = True
    save_model_folder(trainer, str(run.model_folder))  # every process: under FSDP they gather the weights
    tokenizer.save_pretrained(run.model_folder)
    run.write_results({
        "model": args.architecture, "seed": run.seed, "parameters": model.num_parameters(),
        "files": [p.name for p in files],
        "train_tokens": split, "held_out_tokens": len(token_ids) - split, "held_out_perplexity": held_out["perplexity"],
        **totals, "machine": machine_state(), "config": run.settings,
    })  # fmt: skip
    run.remove_checkpoints()
    say(
        f"{run.model_folder}: {type(model).__name__} of {model.num_parameters():,} parameters pretrained on "
        f"{split:,} tokens of "
        f"{', '.join(p.name for p in files)} in {(totals['train_seconds'] or math.nan) / 60:.1f} min; held-out "
        f"perplexity {held_out['perplexity']:.1f} on {len(token_ids) - split:,} tokens"
    )


if __name__ == "__main__":
    cli(main)
