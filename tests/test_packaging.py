"""pyproject.toml: the wheel holds every module, the metrics' `evaluate` scripts and the top-level `model_cards/`, and
an hf_attn installed from it renders its cards from the templates inside it and loads its metrics from inside it."""

import ast
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from hf_attn.metrics import METRIC_NAMES

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of a copy of the sources (building writes `build/` and `*.egg-info` beside them), built offline."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("hf_attn", "model_cards"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    command = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-w",
        out,
        source,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return next(out.glob("hf_attn-*.whl"))


def test_the_wheel_holds_every_module_metric_and_card_template(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        modules = list((REPO / "hf_attn").rglob("*.py"))
        for path in modules:
            assert f"hf_attn/{path.relative_to(REPO / 'hf_attn')}" in names, path
        assert {path.name for path in modules} >= {"ood_regression.py", "recognition.py", "perplexity.py"}
        templates = sorted((REPO / "model_cards").glob("*.md"))
        assert {"experiment_run.md", "model.md", "positional_gpt2.md", "local_gpt2.md", "hybrid_gpt2.md"} <= {
            path.name for path in templates
        }
        for path in templates:
            assert archive.read(f"hf_attn/model_cards/{path.name}") == path.read_bytes(), path.name


INSTALLED = textwrap.dedent(
    """
    import sys
    import hf_attn
    assert "evaluate" not in sys.modules  # load_metric imports it when called
    from hf_attn.hub import CARD_TEMPLATES
    from hf_attn.metrics import METRIC_NAMES, metric_path
    from transformers import AutoConfig, AutoModelForCausalLM
    site, folder = sys.argv[1:]
    assert hf_attn.__file__.startswith(site), hf_attn.__file__
    config = AutoConfig.for_model("hybrid_gpt2", n_layer=1, n_head=2, n_embd=8, vocab_size=11)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    for name in ("hybrid_gpt2.md", "model.md", "experiment_run.md"):
        print(CARD_TEMPLATES.get_template(name).filename)
    print([str(metric_path(name)) for name in METRIC_NAMES])
    recognition = hf_attn.load_metric("recognition")
    print(recognition.compute(predictions=[1, 0, 1], references=[1, 1, 1], lengths=[3, 4, 5]))
    """
)


def test_an_installed_hf_attn_renders_cards_and_loads_metrics_from_the_wheel(wheel, tmp_path):
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)  # what installing a pure-Python wheel does, without touching this environment
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    command = [sys.executable, "-c", INSTALLED, str(site), str(tmp_path / "model")]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    *templates, metric_paths, scores = result.stdout.splitlines()
    assert [Path(line).parent for line in templates] == [site / "hf_attn" / "model_cards"] * 3
    assert ast.literal_eval(metric_paths) == [str(site / "hf_attn" / "metrics" / name) for name in METRIC_NAMES]
    assert ast.literal_eval(scores) == {
        "accuracy_by_length": {3: 1.0, 4: 0.0, 5: 1.0}, "mean_accuracy": pytest.approx(2 / 3),
        "longest_perfect_length": 3,
    }  # fmt: skip
    assert (tmp_path / "modules" / "evaluate_modules" / "metrics" / "recognition").is_dir()  # evaluate.load's copy
    card = (tmp_path / "model" / "README.md").read_text()
    assert "A `hybrid_gpt2` model made with hf_attn" in card and "| layers | global heads |" in card
