"""Choose the offline GPT-2 baseline's fine-tuning learning rate on validation prompts, never on a test set.

Paper A fine-tunes a pretrained gpt2-large at 2e-5. The small GPT-2 that training/pretrain_gpt2.py makes offline
learns too little at that rate to write a readable answer, so configs/mixed/cpu.yaml uses another; this script is
how it was chosen: for each rate, the mixed script's fine-tuning of seed 0 (`baseline_train_samples` samples of the
task), then greedy answers to in-distribution validation prompts (seed 3,000,000; the test sets use 2,000,001 to
2,000,010), scored by the share of readable answers and their MSE.

    python -m training.baseline_learning_rate configs/mixed/cpu.yaml --learning_rates 2e-5 2e-4 1e-3

Writes OUTPUT_DIR/baseline_learning_rate.json and prints a table.
"""

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments, set_seed

from hf_attn.data import mixed_dataset
from hf_attn.experiments import cli, format_value, parse_config
from training import CONFIGS, mixed

VALIDATION_SEED = 3_000_000


@dataclass
class ChoiceArguments:
    learning_rates: list[float] = field(default_factory=lambda: [2e-5, 2e-4, 1e-3], metadata={"help": "Rates to try."})
    task: str = field(
        default="min", metadata={"help": "Task to fine-tune and validate on.", "choices": mixed.MIXED_TASKS}
    )
    validation_samples: int = field(default=200, metadata={"help": "Validation prompts (c = 1, seen names)."})


def table(rows: list[dict]) -> str:
    """Markdown: per rate, the share of readable answers and their errors."""
    lines = ["| learning rate | readable answers | MSE | MAPE |", "|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['learning_rate']:g} | {1 - row['unparsed']:.0%} | {format_value(row['mse'])} "
                     f"| {format_value(row['mape'])} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    choice, experiment, _, training_args = parse_config(
        (ChoiceArguments, mixed.ExperimentArguments, mixed.ModelArguments, TrainingArguments), argv,
        [CONFIGS / "mixed" / "cpu.yaml"],  # the mixed run whose GPT-2 learning rate it chooses
    )  # fmt: skip
    validation = mixed_dataset(choice.validation_samples, choice.task, rendering="text", seed=VALIDATION_SEED)
    answers = np.asarray(validation["answer"])
    rows = []
    for learning_rate in choice.learning_rates:
        set_seed(0)  # as the mixed script's run of seed 0
        model, tokenizer = mixed.baseline(experiment)
        samples = experiment.baseline_train_samples or experiment.train_samples
        train_set = mixed.causal_lm_set(mixed_dataset(samples, choice.task, rendering="text", seed=0), tokenizer)
        args = dataclasses.replace(
            training_args, output_dir=str(Path(training_args.output_dir) / f"lr-{learning_rate:g}"),
            learning_rate=learning_rate, num_train_epochs=experiment.baseline_epochs,
            per_device_train_batch_size=experiment.baseline_batch_size, warmup_steps=experiment.baseline_warmup_steps,
            lr_scheduler_type="linear", weight_decay=experiment.baseline_weight_decay, save_strategy="no", seed=0,
        )  # fmt: skip
        Trainer(model=model, args=args, train_dataset=train_set,
                data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False)).train()  # fmt: skip
        prompts = [tokenizer.bos_token + prompt for prompt in validation["prompt"]]
        predictions = mixed.greedy_answers(model, tokenizer, prompts, experiment.max_new_tokens)
        rows.append({"learning_rate": learning_rate, **mixed.errors(predictions, answers)})
    Path(training_args.output_dir).mkdir(parents=True, exist_ok=True)
    (Path(training_args.output_dir) / "baseline_learning_rate.json").write_text(json.dumps(rows, indent=2))
    print(table(rows))


if __name__ == "__main__":
    cli(main)
