"""The benchmarks run end to end at a tiny shape, and their figures behave as the head kinds say."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
MODELS = ("local-1", "local-4", "hybrid-1", "gpt2")
CONTEXTS = (16, 32)
TINY = ["--n-layer", "1", "--n-embd", "32", "--n-head", "4", "--vocab-size", "100"]


def run_benchmark(*args: str, script: str = "generation.py") -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True, env=env, timeout=120,
        check=False,
    )  # fmt: skip


def table_rows(stdout: str) -> dict[tuple[str, int], list[str]]:
    """(model, context) -> the row's cells, from the printed Markdown table."""
    rows = {}
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 6 and cells[1].isdigit():
            rows[cells[0], int(cells[1])] = cells
    return rows


def test_generation_benchmark_runs_and_caches_grow_as_expected():
    contexts = [str(length) for length in CONTEXTS]
    result = run_benchmark("--contexts", *contexts, "--new-tokens", "3", *TINY)
    assert result.returncode == 0, result.stderr
    rows = table_rows(result.stdout)
    assert set(rows) == {(model, length) for model in MODELS for length in CONTEXTS}, result.stdout
    cache_mib = {key: float(cells[5]) for key, cells in rows.items()}
    for model in ("local-1", "local-4"):
        assert cache_mib[model, 16] == cache_mib[model, 32] > 0
    assert cache_mib["local-4", 16] == pytest.approx(4 * cache_mib["local-1", 16], rel=1e-3)  # the last k tokens
    assert cache_mib["gpt2", 32] > cache_mib["gpt2", 16]
    assert cache_mib["hybrid-1", 32] > cache_mib["hybrid-1", 16]
    for cells in rows.values():
        assert float(cells[2]) > 0  # ms/token
    assert "local-1: ms/token 32/16" in result.stdout
    assert "gpt2: cache 32/16" in result.stdout


def test_unknown_model_is_refused_with_the_choices():
    result = run_benchmark("--models", "local-2", *TINY)
    assert result.returncode != 0
    assert "invalid choice: 'local-2'" in result.stderr and "hybrid-1" in result.stderr


def test_throughput_benchmark_reports_ratios_and_linear_layer_memory():
    result = run_benchmark(
        "--models", "local-1", "--lengths", "32", "--tokens-per-step", "64", "--repeats", "1",
        "--layer-lengths", "4096", "16384", "--max-masked-length", "0", *TINY, script="throughput.py",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in result.stdout.splitlines()]
    speed = {cells[0]: cells for cells in rows if len(cells) == 7 and cells[1] == "32"}
    assert set(speed) == {"gpt2", "local-1"}, result.stdout
    assert speed["gpt2"][4] == "1.00x" and speed["local-1"][4].endswith("x")
    layer = {int(cells[0]): cells for cells in rows if len(cells) == 4 and cells[0].isdigit()}
    banded = {length: float(cells[1]) for length, cells in layer.items()}
    scores = {length: float(cells[3]) for length, cells in layer.items()}
    assert scores[16384] == 16 * scores[4096] == 8 * 16384 * 16384 * 4 / 2**20  # what a T x T matrix would take
    assert banded[16384] < scores[16384] / 50  # the banded layer holds O(T) tensors, never O(T^2)
