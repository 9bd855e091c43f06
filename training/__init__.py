"""The experiment scripts, a family each (see `hf_attn.experiments.family`), and their shipped configs."""

from pathlib import Path

from hf_attn import experiments

CONFIGS = Path(__file__).parents[1] / "configs"  # the CONFIG.yaml files, a folder per family named after it


def register_family(name: str, *parts) -> experiments.Family:
    """A script's family, registered under `name` with its shipped configs (the folder of that name). `parts` are the
    `experiments.Family` fields after the name, in order: arguments, model arguments, plan, problems, train, card,
    reports and, where the family has one, prepare."""
    return experiments.register(experiments.Family(name, *parts, configs=CONFIGS / name))
