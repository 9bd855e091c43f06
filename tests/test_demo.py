"""examples/demo.py: its Paper A part is the quickstart's models and task at a smaller scale, it runs end to end,
and what it prints about the effect follows its own figures."""

import importlib.util
import sys
from pathlib import Path

import pytest
from transformers import TrainingArguments

import training.algorithmic as algorithmic
from hf_attn.experiments import parse_config

ROOT = Path(__file__).parents[1]
QUICKSTART = str(ROOT / "configs/algorithmic/min_cpu.yaml")


@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("demo", ROOT / "examples" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("kind", ["positional", "standard"])
def test_the_demo_builds_the_quickstarts_models_for_its_task(demo, kind):
    experiment, model, _ = parse_config(
        (algorithmic.ExperimentArguments, algorithmic.ModelArguments, TrainingArguments), [QUICKSTART]
    )
    assert [demo.TASK] == experiment.tasks and demo.NUMBERS == experiment.length
    quickstart = algorithmic.model_config(kind, model, experiment.length, experiment.length + experiment.scratchpad)
    assert demo.paper_a_config(kind).to_dict() == quickstart.to_dict()


def test_the_verdict_reports_the_effect_only_when_the_figures_show_it(demo):
    far = demo.SCALES[-1]
    shown = demo.verdict({"positional": {far: 0.5}, "standard": {far: 30.0}})
    assert shown.startswith(f"At c = {far} the positional model's error is 60x lower") and "./run.sh main" in shown
    missed = demo.verdict({"positional": {far: 3.0}, "standard": {far: 2.0}})
    assert "not ahead in this run: too little training" in missed and "./run.sh main" in missed


def test_the_demo_runs_and_prints_a_row_per_test_range_and_its_verdict(demo, monkeypatch, capsys):
    """Two steps per model: a smoke run, so the verdict may go either way; the default run shows the effect
    (positional 24-45x lower at c = 10 on seeds 0-2, about 50 s on 2 cores)."""
    monkeypatch.setattr(sys, "argv", ["demo.py", "--steps", "2", "--regression-steps", "2"])
    demo.main()
    out = capsys.readouterr().out
    assert "cached decoding == decoding without cache: True" in out
    for scale in demo.SCALES:
        assert f"\n| {scale} | " in out
    assert f"At c = {demo.SCALES[-1]} the positional model" in out and "`./run.sh main`" in out
