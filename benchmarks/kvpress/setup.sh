#!/usr/bin/env bash
# Makes the virtual environment of benchmarks/kvpress/run_presses.py (default .venv-kvpress in the repository root,
# git-ignored): kvpress 0.5.5 pins transformers<5.3, hf_attn needs >=5.2 and is tested on 5.25, so kvpress never
# enters hf_attn's environment.
#   bash benchmarks/kvpress/setup.sh [VENV]
# Order: the CPU build of torch first (kvpress accepts torch>=2.3.1,<3), so that kvpress's `torch` requirement is
# already met and pip never fetches a multi-GB CUDA build; then kvpress and gguf (transformers reads GGUF files
# with it). An installed torch is never replaced. Environment:
#   PYTHON           the interpreter the venv is made from (default python3)
#   TORCH_VERSION    default 2.13.0 (the project's, README.md)
#   TORCH_INDEX_URL  default https://download.pytorch.org/whl/cpu; set it empty to use pip's configured indexes.
#                    Where that index is unreachable, the CPU wheel is looked for as torch==VERSION+cpu in pip's
#                    configured indexes and find-links (PyPI alone has only CUDA builds for Linux).
set -euo pipefail
cd "$(dirname "$0")/../.."

venv=${1:-.venv-kvpress}
torch_version=${TORCH_VERSION:-2.13.0}
index=${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
python=$venv/bin/python

if ! "$python" -c "import torch" 2>/dev/null; then
  if ! "$python" -m pip install -q --retries 1 "torch==$torch_version" ${index:+--index-url "$index"}; then
    echo "setup.sh: no torch $torch_version from ${index:-the configured indexes}; looking for" \
         "torch==$torch_version+cpu in pip's configured indexes and find-links" >&2
    "$python" -m pip install -q "torch==$torch_version+cpu"
  fi
fi
"$python" -m pip install -q "kvpress==0.5.5" "gguf>=0.10"
"$python" - <<'PY'
import importlib.metadata as metadata

import torch

print("kvpress environment:", ", ".join(f"{name} {metadata.version(name)}" for name in
      ("kvpress", "transformers", "torch", "accelerate", "datasets", "gguf")), "; CUDA:", torch.version.cuda)
PY
