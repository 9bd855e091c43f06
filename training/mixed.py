"""Paper A, mixed text + numbers: positional and standard models against a fine-tuned GPT-2, in and out of range.

A sample lists 8 priced categories and 2 decoys without a price, then asks `Find min|sum|max of categories ...`.
Positional and standard models read the characters plus the 8 prices as numbers (value * w + b) and regress the
answer at position 0; GPT-2 reads the same sample as text and is fine-tuned as a causal LM to write
` Answer: 000.89` and stop, then evaluated by greedy decoding, as in Paper A's code. Prices train in [0, 5] and test
in [0, 5c]. Every model is tested on category names seen in training (how Paper A's code tests the small models)
and on unseen ones (how it tests GPT-2); the tables show both.

    python -m training.mixed configs/mixed/cpu.yaml
    python -m training.mixed configs/mixed/cpu.yaml --baseline_model gpt2-large   # online: the paper's GPT-2
    python -m training.mixed configs/mixed/cpu.yaml --baseline_model /path/to/local/gpt2

Offline, `baseline_model` must be a local GPT-2: training/pretrain_gpt2.py makes one from the text in ../shared/data.
Writes OUTPUT_DIR/TASK/MODEL/seed-S/{results.json, model/} per run and OUTPUT_DIR/TASK/{results.md, *.png} per task.
"""

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainingArguments,
    set_seed,
)

import hf_attn  # noqa: F401  (registers the model types)
from hf_attn import experiments, load_metric
from hf_attn.configuration_hf_attn import BLOCK_STYLES, POSITIONAL_ENCODINGS
from hf_attn.data import MIXED_TASKS, CharVocab, mixed_dataset, parse_answer
from hf_attn.data.mixed import NAME_SETS
from hf_attn.experiments import collapse_check, input_blind_mse, list_field, write_task_reports
from hf_attn.hub import CardFacts
from training import register_family
from training.models import PAPER_A_MODELS, paper_a_config

MODEL_KINDS = (*PAPER_A_MODELS, "gpt2")
NAMES_TITLE = {"seen": "category names seen in training", "unseen": "unseen category names"}
METRICS = tuple(  # (key, title, log scale)
    (f"{metric}_{names}", f"{title}, {NAMES_TITLE[names]}", log_scale)
    for metric, title, log_scale in (
        ("mse", "MSE", True),
        ("mape", "MAPE", True),
        ("unparsed", "share of unparseable answers", False),
    )
    for names in NAME_SETS
)
MIXED_TEST_SEED = 2 * experiments.TEST_SEED  # this family's own range: its test sets depend only on (task, c)
# Paper A's fine-tuning code adds these to GPT-2's tokenizer: every text starts with BOS, padding is its own token
# (so the end-of-text token after the answer is learned, not masked as padding).
BASELINE_SPECIAL_TOKENS = {"bos_token": "<|startoftext|>", "pad_token": "<|pad|>"}
Predict = Callable[[int, str], tuple[np.ndarray, np.ndarray]]  # (c, name set) -> (predictions, answers)
TrainedToPredict = tuple[Trainer, dict, Predict]  # (trainer, `Run.train`'s totals, predict)


@dataclass
class ExperimentArguments(experiments.RunArguments):
    tasks: list[str] = list_field(MIXED_TASKS, "Tasks to run.", MIXED_TASKS)
    models: list[str] = list_field(MODEL_KINDS, "Models to compare.", MODEL_KINDS)
    scales: list[int] = list_field(range(1, 11), "Test price ranges [0, 5c]; 1 is training's.")
    train_samples: int = field(default=50_000, metadata={"help": "Training samples (Paper A: 50,000)."})
    test_samples: int = field(default=1_000, metadata={"help": "Test samples per c and name set (Paper A: 1,000)."})
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
    baseline_weight_decay: float = field(
        default=0.01, metadata={"help": "AdamW weight decay (Paper A's code: torch's default, 0.01)."}
    )
    max_new_tokens: int = field(
        default=15, metadata={"help": "Tokens GPT-2 may write after the prompt, ` Answer: ...` (Paper A's code: 15)."}
    )

    run_fields: ClassVar[tuple[str, ...]] = ("tasks", "models", *experiments.RunArguments.run_fields)
    evaluation_fields: ClassVar[tuple[str, ...]] = ("scales", "test_samples", "max_new_tokens")


@dataclass
class ModelArguments(experiments.ModelArguments):
    n_layer: int = field(default=3, metadata={"help": "Depth (Paper A: 3)."})
    n_embd: int = field(default=32, metadata={"help": "Width (Paper A: 32)."})
    n_head: int = field(default=2, metadata={"help": "Heads (Paper A: 2)."})
    n_inner: int = field(default=32, metadata={"help": "MLP hidden width (Paper A's params_nlp_scale.json: 32)."})
    content_qk_dim: int | None = field(
        default=None, metadata={"help": "Query/key width of each standard head; default n_embd (Paper A's code)."}
    )
    n_positions: int = field(default=160, metadata={"help": "Longest sequence: characters + 8 numbers + scratchpad."})
    block_style: str = field(default="concat_mlp", metadata={"help": "Block (Paper A).", "choices": BLOCK_STYLES})
    positional_encoding: str = field(
        default="onehot", metadata={"help": "P of positional heads (Paper A: onehot).", "choices": POSITIONAL_ENCODINGS}
    )
    positional_qk_dim: int | None = field(
        default=None, metadata={"help": "Query/key width of positional heads; default d_P (Paper A's code)."}
    )
    activation_function: str = field(default="relu", metadata={"help": "MLP activation (Paper A: relu)."})


def plan(experiment: ExperimentArguments) -> list[experiments.Group]:
    """A folder of runs per task: OUTPUT_DIR/TASK/MODEL/seed-S."""
    return [experiments.Group(task, experiment.models, {"task": task}) for task in experiment.tasks]


def problems(experiment: ExperimentArguments, model: ModelArguments, training: TrainingArguments) -> list[str]:
    """Every problem at once, before data or checkpoints are loaded. The baseline checkpoint is needed only while a
    GPT-2 run is still to train (finished runs are reported from their results alone)."""
    problems = []
    if any(c < 1 for c in experiment.scales):
        problems.append(f"scales must all be >= 1, got {experiment.scales}")
    problems += experiments.below(
        "train_samples", "test_samples", "baseline_batch_size", "max_new_tokens", of=experiment
    )
    plan = FAMILY.planned_runs(experiment, Path(training.output_dir))
    if not all(run.finished for _, runs in plan for run in runs if run.model == "gpt2"):
        problems += baseline_problems(experiment.baseline_model, experiment.baseline_tokenizer)
    vocab_size = CharVocab().vocab_size
    small_models = [kind for kind in experiment.models if kind in PAPER_A_MODELS]
    configs = {kind: functools.partial(model_config, kind, model, vocab_size) for kind in small_models}
    return problems + experiments.config_problems(configs)


def baseline_problems(model: str, tokenizer: str | None) -> list[str]:
    """A missing or unreadable baseline checkpoint is reported before any training, with how to get one."""
    problems = experiments.pretrained_problems("baseline_model", model, weights=True)
    problems += experiments.pretrained_problems("baseline_tokenizer", tokenizer)
    hint = "(`python -m training.pretrain_gpt2 configs/mixed/gpt2_pretrain_cpu.yaml` makes a local GPT-2 offline)"
    return [f"{problem} {hint}" for problem in problems]


def model_config(kind: str, model: ModelArguments, vocab_size: int):
    """Paper A's positional or standard model reading characters and prices, the answer regressed at position 0."""
    return paper_a_config(
        kind, standard_qk_dim=model.content_qk_dim or model.n_embd,  # Paper A's code: d_model wide
        n_layer=model.n_layer, n_embd=model.n_embd, n_head=model.n_head, n_inner=model.n_inner,
        n_positions=model.n_positions, block_style=model.block_style, positional_encoding=model.positional_encoding,
        positional_qk_dim=model.positional_qk_dim, activation_function=model.activation_function, is_causal=False,
        vocab_size=vocab_size, numeric_inputs=True, num_labels=1, problem_type="regression", pad_token_id=0,
    )  # fmt: skip


def answer_at_position_zero(dataset) -> experiments.InMemoryDataset:
    """Per-position regression labels: the answer at position 0, NaN (left out of the loss) elsewhere."""
    rows = experiments.InMemoryDataset(dataset)
    answers = rows.columns["labels"].reshape(-1)
    labels = torch.full(rows.columns["input_ids"].shape, float("nan"))
    labels[:, 0] = answers
    rows.columns["labels"] = labels
    return rows


def errors(predictions: np.ndarray, answers: np.ndarray) -> dict[str, float]:
    """MSE and MAPE over parsed answers (NaN predictions are unparsed ones; NaN when none is), and the unparsed
    share."""
    parsed = ~np.isnan(predictions)
    scores = load_metric("ood_regression").compute(predictions=predictions[parsed], references=answers[parsed])
    return {**scores, "unparsed": float(1 - parsed.mean())}


def held_out_set(task: str, experiment, scale: int, names: str, rendering: str):
    """The same samples for every model: prices and prompts depend on (task, c); the name set only swaps names."""
    return mixed_dataset(experiment.test_samples, task, rendering=rendering, scale=scale, names=names,
                         seed=MIXED_TEST_SEED + scale)  # fmt: skip


def evaluate(predict: Predict, experiment) -> tuple[dict, dict]:
    """Errors per c on both name sets (`predict(scale, names)` gives predictions and answers), and the collapse
    check on names seen in training at c = 1, in distribution (over parsed answers for GPT-2)."""
    by_scale, collapse = {}, None
    for scale in sorted({1, *experiment.scales}):
        metrics = {}
        for names in NAME_SETS:
            predictions, answers = predict(scale, names)
            metrics.update({f"{key}_{names}": value for key, value in errors(predictions, answers).items()})
            if scale == 1 and names == "seen":
                parsed = ~np.isnan(predictions)
                error = metrics["mse_seen"] if parsed.any() else math.inf
                collapse = collapse_check(error, input_blind_mse(answers[parsed] if parsed.any() else answers), "mse")
        if scale in experiment.scales:
            by_scale[str(scale)] = metrics
    return by_scale, collapse


def train_positional(run: experiments.Run, task: str, experiment, model_args, training_args) -> TrainedToPredict:
    model = AutoModelForTokenClassification.from_config(model_config(run.model, model_args, CharVocab().vocab_size))
    train_set = answer_at_position_zero(mixed_dataset(experiment.train_samples, task, seed=run.seed))
    trainer = experiments.plateau_trainer(model, train_set, run, training_args, experiment.plateau_factor,
                                          experiment.plateau_patience, experiment.plateau_min_lr)  # fmt: skip
    totals = run.train(trainer, experiment.resume)

    def predict(scale: int, names: str) -> tuple[np.ndarray, np.ndarray]:
        rows = answer_at_position_zero(held_out_set(task, experiment, scale, names, "positional"))
        predictions = trainer.predict(rows).predictions[:, 0, 0].astype(np.float64)
        return predictions, rows.columns["labels"][:, 0].double().numpy()

    return trainer, totals, predict


def baseline(experiment, kept: Path | None = None):
    """The GPT-2 to fine-tune and its tokenizer, with Paper A's special tokens added (and embedded). `kept`: a
    finished run's model folder, re-evaluated without needing the baseline checkpoint again."""
    tokenizer = AutoTokenizer.from_pretrained(kept or experiment.baseline_tokenizer or experiment.baseline_model)
    model = AutoModelForCausalLM.from_pretrained(kept or experiment.baseline_model)
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        raise ValueError(
            f"baseline_tokenizer has {len(tokenizer)} tokens but baseline_model embeds only "
            f"{model.get_input_embeddings().num_embeddings}: they do not belong together."
        )
    tokenizer.add_special_tokens(BASELINE_SPECIAL_TOKENS)
    model.resize_token_embeddings(len(tokenizer))
    return model, tokenizer


def causal_lm_set(texts, tokenizer):
    """Token ids of BOS, prompt, answer and end of text, as Paper A's fine-tuning code writes every sample."""
    return texts.map(
        lambda rows: tokenizer([tokenizer.bos_token + text + tokenizer.eos_token for text in rows["text"]]),
        batched=True, remove_columns=texts.column_names,
    )  # fmt: skip


def train_gpt2(run: experiments.Run, task: str, experiment, training_args) -> TrainedToPredict:
    model, tokenizer = baseline(experiment, run.model_folder if run.finished else None)
    samples = experiment.baseline_train_samples or experiment.train_samples
    train_set = causal_lm_set(mixed_dataset(samples, task, rendering="text", seed=run.seed), tokenizer)
    args = experiments.run_arguments(
        training_args, run, learning_rate=experiment.baseline_learning_rate,
        num_train_epochs=experiment.baseline_epochs, per_device_train_batch_size=experiment.baseline_batch_size,
        warmup_steps=experiment.baseline_warmup_steps, lr_scheduler_type="linear",
        weight_decay=experiment.baseline_weight_decay,
    )  # fmt: skip
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)  # labels: every token but the padding
    trainer = Trainer(model=model, args=args, train_dataset=train_set, data_collator=collator,
                      processing_class=tokenizer)  # saved with the model  # fmt: skip
    totals = run.train(trainer, experiment.resume)

    def predict(scale: int, names: str) -> tuple[np.ndarray, np.ndarray]:
        test = held_out_set(task, experiment, scale, names, "text")
        prompts = [tokenizer.bos_token + prompt for prompt in test["prompt"]]
        return greedy_answers(model, tokenizer, prompts, experiment.max_new_tokens), np.asarray(test["answer"])

    return trainer, totals, predict


@torch.no_grad()
def greedy_answers(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int = 32) -> np.ndarray:
    """Greedy continuation of each prompt, parsed after `Answer:`; NaN where the text has no readable answer."""
    model.eval()
    tokenizer.padding_side = "left"
    answers = []
    for start in range(0, len(prompts), batch_size):
        batch = tokenizer(prompts[start : start + batch_size], return_tensors="pt", padding=True).to(model.device)
        generated = model.generate(
            **batch, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )  # fmt: skip
        texts = tokenizer.batch_decode(generated[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        answers += [parse_answer(text) for text in texts]
    return np.array([np.nan if a is None else a for a in answers], dtype=np.float64)


def train_and_evaluate(run: experiments.Run, experiment, model_args, training_args, task: str) -> experiments.Trained:
    set_seed(run.seed)
    if run.model == "gpt2":
        trainer, totals, predict = train_gpt2(run, task, experiment, training_args)
    else:
        trainer, totals, predict = train_positional(run, task, experiment, model_args, training_args)
    by_scale, collapse = evaluate(predict, experiment)
    return experiments.Trained(trainer, totals, by_scale, {"collapse": collapse})


def card(experiment: ExperimentArguments, results: dict) -> CardFacts:
    task = results["task"]
    return CardFacts(
        paper="A",
        title=f"mixed {task}",
        training=f"Paper A's mixed text-and-numbers task `{task}`: 8 priced categories and 2 decoys, prices from "
        f"[0, 5] ({experiment.train_samples} samples), tested on [0, 5c] for c in {experiment.scales} with the "
        "category names seen in training (`_seen`) and with unseen ones (`_unseen`)",
        inputs="`hf_attn.data.mixed_dataset` builds them; the positional and standard models read character ids with"
        " the prices as `numeric_values` and regress the answer at position 0, GPT-2 reads the text and "
        "writes ` Answer: ...`",
        task_type="token-classification",
        dataset_name=f"mixed {task} (synthetic)",
        key_name="c",
        metrics=tuple(f"{m}_{names}" for m in ("mse", "mape", "unparsed") for names in NAME_SETS),
    )


def write_reports(output_dir: Path, results: list[dict], experiment: ExperimentArguments) -> str:
    """Per task, OUTPUT_DIR/TASK/{results.md, *.png}; returns the reports' text."""
    names = "category names seen in training and unseen"
    return write_task_reports(
        output_dir, results, lambda task: f"mixed {task}: errors by test price range [0, 5c], {names}", METRICS
    )


FAMILY = register_family(
    "mixed", ExperimentArguments, ModelArguments, plan, problems, train_and_evaluate, card, write_reports
)

if __name__ == "__main__":
    FAMILY.cli()
