"""Paper A, mixed text + numbers: positional and standard models against a fine-tuned GPT-2, in and out of range.

A sample lists 8 priced categories and 2 decoys without a price, then asks `Find min|sum|max of categories ...`.
Positional and standard models read the characters plus the 8 prices as numbers (value * w + b) and regress the
answer at position 0; GPT-2 reads the same sample as text and is fine-tuned as a causal LM to write
` Answer: 00.89`, then evaluated by greedy decoding. Prices train in [0, 5] and test in [0, 5c]; test prompts
use category names never seen in training.

    python -m training.mixed configs/mixed/cpu.yaml
    python -m training.mixed configs/mixed/cpu.yaml --baseline_model gpt2-large   # online: the paper's GPT-2
    python -m training.mixed configs/mixed/cpu.yaml --baseline_model /path/to/local/gpt2

Writes OUTPUT_DIR/TASK/MODEL/seed-S/{results.json, model/} per run and OUTPUT_DIR/TASK/{results.md, mse.png,
mape.png} per task.
"""

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainingArguments,
    set_seed,
)
from transformers.trainer_utils import TrainOutput

import hf_attn  # noqa: F401  (registers the model types)
from hf_attn.configuration_hf_attn import BLOCK_STYLES, POSITIONAL_ENCODINGS
from hf_attn.data import MIXED_TASKS, CharVocab, mixed_dataset, parse_answer
from hf_attn.experiments import InMemoryDataset, Run, finish_run, plateau_trainer, run_arguments
from training.common import parse_config, run_config, run_experiment

MODEL_KINDS = ("positional", "standard", "gpt2")
METRICS = (("mse", "MSE", True), ("mape", "MAPE", True), ("unparsed", "share of unparseable answers", False))
TEST_SEED = 2_000_000  # test sets depend only on (task, c), so every model is tested on the same samples


@dataclass
class ExperimentArguments:
    tasks: list[str] = field(
        default_factory=lambda: list(MIXED_TASKS), metadata={"help": "Tasks to run.", "choices": MIXED_TASKS}
    )
    models: list[str] = field(
        default_factory=lambda: list(MODEL_KINDS), metadata={"help": "Models to compare.", "choices": MODEL_KINDS}
    )
    seeds: list[int] = field(default_factory=lambda: [0], metadata={"help": "One run per model and seed."})
    scales: list[int] = field(
        default_factory=lambda: list(range(1, 11)), metadata={"help": "Test price ranges [0, 5c]; 1 is training's."}
    )
    train_samples: int = field(default=50_000, metadata={"help": "Training samples (Paper A: 50,000)."})
    test_samples: int = field(default=1_000, metadata={"help": "Test samples per c."})
    plateau_factor: float = field(default=0.9, metadata={"help": "ReduceLROnPlateau factor (Paper A: 0.9)."})
    plateau_patience: int = field(default=10, metadata={"help": "ReduceLROnPlateau patience (Paper A: 10)."})
    plateau_min_lr: float = field(default=1e-6, metadata={"help": "ReduceLROnPlateau floor."})
    baseline_model: str = field(
        default="gpt2-large",
        metadata={"help": "GPT-2 to fine-tune: a Hub id (Paper A: gpt2-large) or a local checkpoint folder."},
    )
    baseline_tokenizer: str | None = field(
        default=None, metadata={"help": "Tokenizer id or folder; defaults to baseline_model's."}
    )
    baseline_train_samples: int | None = field(
        default=None, metadata={"help": "Training samples for GPT-2; defaults to train_samples."}
    )
    baseline_learning_rate: float = field(default=2e-5, metadata={"help": "AdamW learning rate (Paper A: 2e-5)."})
    baseline_epochs: float = field(default=3, metadata={"help": "Fine-tuning epochs (Paper A: 3)."})
    baseline_batch_size: int = field(default=16, metadata={"help": "Fine-tuning batch size (Paper A: 16)."})
    baseline_warmup_steps: int = field(default=100, metadata={"help": "Linear warm-up steps (Paper A: 100)."})
    max_new_tokens: int = field(default=8, metadata={"help": "Tokens GPT-2 may write after `Answer:`."})
    resume: bool = field(default=False, metadata={"help": "Continue interrupted runs from their last checkpoint."})


@dataclass
class ModelArguments:
    n_layer: int = field(default=3, metadata={"help": "Depth (Paper A: 3)."})
    n_embd: int = field(default=32, metadata={"help": "Width (Paper A: 32)."})
    n_head: int = field(default=2, metadata={"help": "Heads (Paper A: 2)."})
    n_inner: int = field(default=64, metadata={"help": "MLP hidden width (our choice: not stated for this task)."})
    n_positions: int = field(default=160, metadata={"help": "Longest sequence: characters + 8 numbers + scratchpad."})
    block_style: str = field(default="concat_mlp", metadata={"help": "Block (Paper A).", "choices": BLOCK_STYLES})
    positional_encoding: str = field(
        default="onehot", metadata={"help": "P of positional heads (Paper A: onehot).", "choices": POSITIONAL_ENCODINGS}
    )
    positional_qk_dim: int | None = field(
        default=None, metadata={"help": "Query/key width of positional heads; default d_P (Paper A's code)."}
    )
    activation_function: str = field(default="relu", metadata={"help": "MLP activation (Paper A: relu)."})


def validate(experiment: ExperimentArguments, model: ModelArguments) -> None:
    """Every problem at once, before data or checkpoints are loaded."""
    problems = []
    if any(c < 1 for c in experiment.scales):
        problems.append(f"scales must all be >= 1, got {experiment.scales}")
    for name in ("train_samples", "test_samples", "baseline_batch_size", "max_new_tokens"):
        if getattr(experiment, name) < 1:
            problems.append(f"{name} must be >= 1, got {getattr(experiment, name)}")
    if model.n_embd % model.n_head:
        problems.append(f"n_embd ({model.n_embd}) must be divisible by n_head ({model.n_head})")
    if "gpt2" in experiment.models:
        problems += baseline_problems(experiment.baseline_model, experiment.baseline_tokenizer)
    if problems:
        raise ValueError("Invalid configuration:\n  - " + "\n  - ".join(problems))


def baseline_problems(model: str, tokenizer: str | None) -> list[str]:
    """A missing baseline checkpoint is reported before any training, with how to get one."""
    problems = []
    for what, name in (("baseline_model", model), ("baseline_tokenizer", tokenizer)):
        if name is None or Path(name).is_dir():
            continue
        if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "false", "False", ""):
            from huggingface_hub import try_to_load_from_cache

            if not isinstance(
                try_to_load_from_cache(name, "config.json" if what == "baseline_model" else "vocab.json"), str
            ):
                problems.append(
                    f"{what}={name!r} is neither a local folder nor in the Hub cache, and HF_HUB_OFFLINE is set: "
                    "pass a local GPT-2 checkpoint folder (see `python -m training.init_gpt2 --help`), or go online"
                )
    return problems


def positional_model(kind: str, model: ModelArguments, vocab_size: int):
    heads = {
        "positional": dict(model_type="positional_gpt2", position_embedding_type="none"),
        "standard": dict(model_type="hybrid_gpt2", num_local_heads=0, position_embedding_type="learned"),
    }[kind]
    config = AutoConfig.for_model(
        **heads,
        n_layer=model.n_layer, n_embd=model.n_embd, n_head=model.n_head, n_inner=model.n_inner,
        n_positions=model.n_positions, block_style=model.block_style, positional_encoding=model.positional_encoding,
        positional_qk_dim=model.positional_qk_dim,
        activation_function=model.activation_function, is_causal=False, attend_to_self=True,
        vocab_size=vocab_size, numeric_inputs=True, num_labels=1, problem_type="regression",
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    return AutoModelForTokenClassification.from_config(config)


def answer_at_position_zero(dataset) -> InMemoryDataset:
    """Per-position regression labels: the answer at position 0, NaN (left out of the loss) elsewhere."""
    rows = InMemoryDataset(dataset)
    answers = rows.columns["labels"].reshape(-1)
    labels = torch.full(rows.columns["input_ids"].shape, float("nan"))
    labels[:, 0] = answers
    rows.columns["labels"] = labels
    return rows


def errors(predictions: np.ndarray, answers: np.ndarray) -> dict[str, float]:
    """MSE and MAPE over parsed answers (NaN predictions are unparsed ones), and the unparsed share."""
    parsed = ~np.isnan(predictions)
    diff = predictions[parsed] - answers[parsed]
    return {
        "mse": float(np.mean(diff**2)) if parsed.any() else float("nan"),
        "mape": float(np.mean(np.abs(diff) / np.maximum(np.abs(answers[parsed]), 1e-8)))
        if parsed.any()
        else float("nan"),
        "unparsed": float(1 - parsed.mean()),
    }


def train_positional(run: Run, task: str, experiment, model_args, training_args) -> tuple[dict, Trainer, TrainOutput]:
    vocab = CharVocab()
    model = positional_model(run.model, model_args, vocab.vocab_size)
    train_set = answer_at_position_zero(mixed_dataset(experiment.train_samples, task, seed=run.seed))
    trainer = plateau_trainer(model, train_set, run, training_args, experiment.plateau_factor,
                              experiment.plateau_patience, experiment.plateau_min_lr)  # fmt: skip
    output, _ = run.train(trainer, experiment.resume)
    by_scale = {}
    for scale in experiment.scales:
        test = mixed_dataset(experiment.test_samples, task, scale=scale, names="unseen", seed=TEST_SEED + scale)
        test_rows = answer_at_position_zero(test)
        predictions = trainer.predict(test_rows).predictions[:, 0, 0]
        by_scale[str(scale)] = errors(
            predictions.astype(np.float64), test_rows.columns["labels"][:, 0].double().numpy()
        )
    return by_scale, trainer, output


def train_gpt2(run: Run, task: str, experiment, training_args) -> tuple[dict, Trainer, TrainOutput]:
    tokenizer = AutoTokenizer.from_pretrained(experiment.baseline_tokenizer or experiment.baseline_model)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(experiment.baseline_model)
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        raise ValueError(
            f"baseline_tokenizer has {len(tokenizer)} tokens but baseline_model embeds only "
            f"{model.get_input_embeddings().num_embeddings}: they do not belong together."
        )
    samples = experiment.baseline_train_samples or experiment.train_samples
    texts = mixed_dataset(samples, task, rendering="text", seed=run.seed)
    train_set = texts.map(lambda rows: tokenizer([t + tokenizer.eos_token for t in rows["text"]]), batched=True,
                          remove_columns=texts.column_names)  # fmt: skip
    args = run_arguments(
        training_args, run, learning_rate=experiment.baseline_learning_rate,
        num_train_epochs=experiment.baseline_epochs, per_device_train_batch_size=experiment.baseline_batch_size,
        warmup_steps=experiment.baseline_warmup_steps, lr_scheduler_type="linear", weight_decay=0.0,
    )  # fmt: skip
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    trainer = Trainer(model=model, args=args, train_dataset=train_set, data_collator=collator,
                      processing_class=tokenizer)  # saved with the model  # fmt: skip
    output, _ = run.train(trainer, experiment.resume)
    by_scale = {}
    for scale in experiment.scales:
        test = mixed_dataset(experiment.test_samples, task, rendering="text", scale=scale, names="unseen",
                             seed=TEST_SEED + scale)  # fmt: skip
        predictions = greedy_answers(model, tokenizer, test["prompt"], experiment.max_new_tokens)
        by_scale[str(scale)] = errors(predictions, np.asarray(test["answer"], dtype=np.float64))
    return by_scale, trainer, output


@torch.no_grad()
def greedy_answers(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int = 32) -> np.ndarray:
    """Greedy continuation of each prompt, parsed; NaN where the text has no readable answer."""
    model.eval()
    tokenizer.padding_side = "left"
    answers = []
    for start in range(0, len(prompts), batch_size):
        batch = tokenizer(prompts[start : start + batch_size], return_tensors="pt", padding=True).to(model.device)
        generated = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                   pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        texts = tokenizer.batch_decode(generated[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        answers += [parse_answer("Answer:" + text) for text in texts]
    return np.array([np.nan if a is None else a for a in answers], dtype=np.float64)


def train_and_evaluate(run: Run, task: str, experiment, model_args, training_args) -> dict:
    set_seed(run.seed)
    start = time.perf_counter()
    if run.model == "gpt2":
        by_scale, trainer, train_output = train_gpt2(run, task, experiment, training_args)
    else:
        by_scale, trainer, train_output = train_positional(run, task, experiment, model_args, training_args)
    return finish_run(
        trainer, run, train_output, time.perf_counter() - start, by_scale, experiment="mixed", task=task,
        config=run_config(experiment, model_args, training_args),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    experiment, model_args, training_args = parse_config((ExperimentArguments, ModelArguments, TrainingArguments), argv)
    validate(experiment, model_args)
    output_dir = Path(training_args.output_dir)
    for task in experiment.tasks:
        heading = f"mixed {task}: errors by test price range [0, 5c], unseen category names"
        run_experiment(
            output_dir / task,
            experiment.models,
            experiment.seeds,
            train_and_evaluate,
            heading,
            METRICS,
            task=task,
            experiment=experiment,
            model_args=model_args,
            training_args=training_args,
        )


if __name__ == "__main__":
    main()
