"""What a run adds to Trainer's training loop: its loss and time over every session that led to the final model, a
log at the final step (so the loss curve ends there), and one progress bar instead of the libraries' many.
"""

import contextlib
import logging
import math
import time

import datasets
from transformers import Trainer, TrainerCallback, TrainerState
from transformers.trainer_callback import ExportableState, ProgressCallback
from transformers.utils import logging as transformers_logging

logger = logging.getLogger(__name__)


def loss_curve(state: TrainerState) -> list[list[float]]:
    """[step, logged training loss] of every log, the last at the final step (`LogFinalStep`): Trainer keeps the log
    history in its checkpoints, so a resumed run's curve starts at step 1 too. Shows whether a run was still learning
    or stuck on a plateau."""
    return [[entry["step"], entry["loss"]] for entry in state.log_history if "loss" in entry]


class LogFinalStep(TrainerCallback):
    """Trainer logs the loss at the final step too, not only every `logging_steps`: a run shorter than
    `logging_steps` would otherwise log none, and the steps after the last multiple of it would be left out of the
    curve. The entry is Trainer's own, the mean loss since its previous log, as every other point of the curve."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= state.max_steps:
            control.should_log = True


class RunTotals(TrainerCallback, ExportableState):
    """The loss summed over steps and the seconds trained, across resumes: saved in every checkpoint's
    trainer_state.json (Trainer's `stateful_callbacks`) and read back when training resumes from it.

    Trainer's own `training_loss` covers only the steps of one `train()` call (0.0 when resuming from the final
    checkpoint), and the part of the loss not yet logged is kept only in its private `_total_loss_scalar` and
    `_tr_loss`: a workaround until Trainer saves a whole-run loss itself.
    """

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self.started = time.perf_counter()  # made just before `train()`: Trainer's set-up counts too
        self.loss_sum: float | None = 0.0  # over the steps before this train() call; None: unknown (old checkpoint)
        self.seconds: float | None = 0.0
        self.first_step: int | None = None  # set when training begins

    def state(self) -> dict:
        loss_sum, seconds = self.loss_sum, self.seconds
        if self.first_step is not None and loss_sum is not None:  # while training: add this call's part
            loss_sum += self.trainer._total_loss_scalar + self.trainer._tr_loss.item()
            seconds += time.perf_counter() - self.started
        return {"args": {}, "attributes": {"loss_sum": loss_sum, "seconds": seconds}}

    def on_train_begin(self, args, state, control, **kwargs):
        name = type(self).__name__
        saved = state.stateful_callbacks.get(name)
        if saved is None and state.global_step > 0:
            logger.warning("The checkpoint predates whole-run totals: train_loss and train_seconds are not recorded.")
            self.loss_sum = self.seconds = None
        elif saved is not None:
            self.loss_sum, self.seconds = saved["attributes"]["loss_sum"], saved["attributes"]["seconds"]
        state.stateful_callbacks[name] = self.state()  # a checkpoint saved later must find its entry
        self.first_step = state.global_step

    def whole_run(self, output, global_step: int) -> dict[str, float | None]:
        """`train_loss`, the mean per-step loss of all `global_step` steps, and `train_seconds`, once trained."""
        if self.loss_sum is None:
            return {"train_loss": None, "train_seconds": None}
        this_call = output.training_loss * (global_step - self.first_step)  # Trainer divides by this call's steps
        return {
            "train_loss": (self.loss_sum + this_call) / global_step if global_step else math.nan,
            "train_seconds": self.seconds + time.perf_counter() - self.started,
        }


class TrainingProgress(ProgressCallback):
    """Trainer's progress bar while training, and none for each `predict` call of the evaluation after it. The logs
    (a dict of loss, grad_norm, learning rate and epoch each `logging_steps`) are not written under the bar: it shows
    the progress, and `run_all` ends each run with one line of its loss and time (`training_summary`)."""

    def on_prediction_step(self, args, state, control, **kwargs):
        pass

    def on_log(self, args, state, control, logs=None, **kwargs):
        pass


@contextlib.contextmanager
def library_progress_bars_off():
    """transformers' and datasets' own progress bars off (a bar per file of every checkpoint saved, per dataset
    map): a run shows Trainer's bar only, and none when `disable_tqdm` is set."""
    on = transformers_logging.is_progress_bar_enabled(), datasets.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if on[0]:
            transformers_logging.enable_progress_bar()
        if on[1]:
            datasets.enable_progress_bars()
