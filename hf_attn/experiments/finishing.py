"""Finishing a run: the arguments of its Trainer, then its results and the Hub-ready model folder its card describes."""

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from transformers import Trainer, TrainingArguments

from ..hub import CardFacts, write_model_card
from ..modeling_hf_attn import HfAttnPreTrainedModel, enable_remote_code
from .run import Run, json_default

CardFactsOf = Callable[[dict], CardFacts]  # a run's results -> what its model card says (`Family.facts`)


@dataclass
class Trained:
    """What a family's `train` hands back: the Trainer holding the trained model, `Run.train`'s totals, the run's
    measurements per evaluation set (`by_scale`, rows of the tables), the family's other fields to record (e.g.
    `collapse`, from `metrics.collapse_check`), and the tokenizer to save beside the model where it is not Trainer's
    `processing_class` (passing it there would change the data collator)."""

    trainer: Trainer
    totals: dict
    by_scale: dict
    fields: dict = field(default_factory=dict)
    tokenizer: object = None


def run_arguments(training_args: TrainingArguments, run: Run, **changes) -> TrainingArguments:
    """The arguments of one run's Trainer: its folder and seed. Trainer itself never pushes (it would push every run
    to the same repository); `run_all` pushes each finished run to its own."""
    return dataclasses.replace(training_args, output_dir=str(run.folder), seed=run.seed, push_to_hub=False,
                               hub_token=None, **changes)  # fmt: skip


def finish_run(run: Run, trained: Trained, fields: dict, facts: CardFactsOf) -> dict:
    """Saves the Hub-ready model folder (`run.model_folder`) and returns the run's results: what every run records
    (`trained.totals`, the run's settings as `config`), `fields` (the family and what its group records) and
    `trained.fields`.

    The folder holds the weights (safetensors), the config with `use_cache=True`, hf_attn's modeling code with a
    full `auto_map` (so `trust_remote_code=True` loads it anywhere), the tokenizer where one is used, and the model
    card (`README.md`, from `facts`) with the results as `model-index`.
    """
    trainer = trained.trainer
    model = trainer.model
    model.config.use_cache = True  # Trainer turns it off for training; a saved model should decode with a cache
    if isinstance(model, HfAttnPreTrainedModel):
        enable_remote_code(model)
    results = {
        "model": run.model, "seed": run.seed, "model_type": model.config.model_type,
        "parameters": model.num_parameters(), **trained.totals, "processes": trainer.args.world_size,
        "machine": machine_state(), **fields, **trained.fields, "config": run.settings, "by_scale": trained.by_scale,
    }  # fmt: skip
    save_model_folder(trainer, str(run.model_folder))  # every process calls it: under FSDP they gather the weights
    if trainer.is_world_process_zero():
        if trained.tokenizer is not None:
            trained.tokenizer.save_pretrained(run.model_folder)
        record = json.loads(json.dumps(results, default=json_default))
        write_model_card(run.model_folder, record, model.config, facts(record))
    return results


def save_model_folder(trainer: Trainer, folder: str) -> None:
    """Saves the trained model as an ordinary model folder (`from_pretrained` loads it). Every process must call it.
    Under FSDP with sharded checkpoints (configs/accelerate/fsdp2.yaml) Trainer's `save_model` writes nothing: there
    the processes gather the full weights together and the main one saves them."""
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if plugin is None or "SHARDED_STATE_DICT" not in str(plugin.state_dict_type):
        trainer.save_model(folder)
        return
    try:
        from torch.distributed.fsdp import FSDPModule  # FSDP2's wrapper, public since torch 2.6
    except ImportError:  # older torch has FSDP1 only, which unwraps to the model's own class
        FSDPModule = ()
    state_dict = trainer.accelerator.get_state_dict(trainer.model)  # full on the main process, empty elsewhere
    if not trainer.args.should_save:
        return
    model = trainer.accelerator.unwrap_model(trainer.model)
    # Workaround: FSDP2 gives the model a class of its own, "FSDP" + its name, defined in torch; save_pretrained
    # would copy that file as the model's remote code and name it in `auto_map`. Saved as its own class, it is not.
    sharded_class = type(model)
    model.__class__ = next(c for c in sharded_class.__mro__ if not issubclass(c, FSDPModule))
    try:
        model.save_pretrained(folder, state_dict=state_dict)
    finally:
        model.__class__ = sharded_class


def machine_state() -> dict:
    """What a run's timing depends on: the cores and the load averages (1, 5, 15 minutes) when it finished. A load
    well above the run's own threads means other jobs shared the machine."""
    return {"cpus": os.cpu_count(), "load_average": [round(load, 2) for load in os.getloadavg()]}
