"""The Trainers the families train with, beside transformers' own: rows held as tensors, and Paper A's optimisation."""

import torch
from transformers import Trainer, TrainerCallback

from .runs import Run, run_arguments


class InMemoryDataset(torch.utils.data.Dataset):
    """A `datasets.Dataset` held as tensors: reading rows from Arrow one by one costs more than a small model's step."""

    def __init__(self, dataset):
        self.columns = dataset.with_format("torch")[:]
        self.length = len(dataset)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: column[index] for name, column in self.columns.items()}


class PlateauOnTrainingLoss(TrainerCallback):
    """Steps a `ReduceLROnPlateau` scheduler on each epoch's mean training loss (Paper A), not on an eval metric.

    Use with `logging_strategy="epoch"` (Trainer then logs the epoch's mean loss), as `PlateauTrainer` does;
    Trainer itself steps such a scheduler only after evaluations.
    """

    def on_log(self, args, state, control, logs=None, lr_scheduler=None, **kwargs):
        if logs and "loss" in logs and isinstance(lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            lr_scheduler.step(logs["loss"])


class PlateauTrainer(Trainer):
    """Trainer with Paper A's optimisation: Adam without weight decay, and ReduceLROnPlateau with `plateau`'s factor,
    patience and min_lr, stepped on each epoch's mean training loss by `PlateauOnTrainingLoss`.

    Trainer builds both itself, once the model is wrapped, rather than taking them ready-made through `optimizers=`:
    that is what FSDP requires.
    """

    def __init__(self, *args, plateau: dict, **kwargs):
        super().__init__(*args, callbacks=[PlateauOnTrainingLoss()], **kwargs)
        self.plateau = plateau

    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        if self.optimizer is None:
            parameters = (model or self.model).parameters()
            self.optimizer = torch.optim.Adam(parameters, lr=self.args.learning_rate, weight_decay=0.0)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:
            self.lr_scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer or self.optimizer, **self.plateau)
        return self.lr_scheduler


def plateau_trainer(model, train_set, run: Run, training_args, factor: float, patience: int, min_lr: float) -> Trainer:
    """A `PlateauTrainer` for one run, logging once an epoch (the loss the plateau schedule reads)."""
    args = run_arguments(training_args, run, logging_strategy="epoch")
    plateau = {"factor": factor, "patience": patience, "min_lr": min_lr}
    return PlateauTrainer(model=model, args=args, train_dataset=train_set, plateau=plateau)
