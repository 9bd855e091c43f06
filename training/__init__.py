"""The experiment scripts, a family each (see `hf_attn.experiments.family`), and their shipped configs."""

from pathlib import Path

CONFIGS = Path(__file__).parents[1] / "configs"  # the CONFIG.yaml files, a folder per family named after it
