"""The Trainers the families train with, beside transformers' own: rows held as tensors, Paper A's optimisation, and
test measurements taken along training."""

from collections.abc import Callable, Iterable

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


class MeasureAlongTheWay(TrainerCallback):
    """Calls `measure(model)` (in eval mode, without gradients) after each of `epochs` or `steps` and keeps what it
    returns in Trainer's log history under "measured", which checkpoints keep: a resumed run still has what it
    measured before the interruption. A record of how test numbers move with training, never a stopping rule."""

    def __init__(self, measure: Callable[[torch.nn.Module], dict], epochs: Iterable[int] = (),
                 steps: Iterable[int] = ()):  # fmt: skip
        self.measure, self.epochs, self.steps = measure, set(epochs), set(steps)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step in self.steps:
            self.record(state, model)

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        if round(state.epoch) in self.epochs:
            self.record(state, model)

    def record(self, state, model: torch.nn.Module) -> None:
        was_training = model.training
        model.eval()
        with torch.no_grad():
            measured = self.measure(model)
        model.train(was_training)
        state.log_history.append({"epoch": round(state.epoch), "step": state.global_step, "measured": measured})


def measured_along_the_way(trainer: Trainer, by: str) -> dict[str, dict]:
    """{epoch or step (`by`): what `MeasureAlongTheWay` measured then}, for results.json."""
    return {str(entry[by]): entry["measured"] for entry in trainer.state.log_history if "measured" in entry}
