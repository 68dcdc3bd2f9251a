#!/usr/bin/env bash
# Wheels for running benchmarks/gpu_speed.py on a GPU machine's stock image (Python 3.12,
# x86-64; torch, transformers, lightning, accelerate, tokenizers, pyarrow already there).
#
#   benchmarks/gpu_prepare.sh [DIR]       # default DIR: .whl (ignored by git)
#
# DIR gets baton's own wheels (`uv build --all-packages --wheel`: they carry the
# `baton.plugins` entry points a bare PYTHONPATH to packages/*/src does not) and the
# wheels the stock image lacks, at the versions uv.lock pins, without their
# dependencies (the image has those). Then, on the GPU machine, from the repository root:
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#   PYTHONUNBUFFERED=1 python3 benchmarks/gpu_speed.py --out "$OUT"
#
# benchmarks/README.md ("GPU speed") gives the whole command and what it prints.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.whl}
rm -rf "$dir"
mkdir -p "$dir"

uv build --all-packages --wheel --out-dir "$dir" >/dev/null

# name==version as uv.lock pins them
missing=(tyro docstring-parser typeguard torchdata array-api-compat crc32c datasets dill
    multiprocess trl megatron-core)
pins=()
for name in "${missing[@]}"; do
    version=$(awk -v n="$name" '$0 == "name = \"" n "\"" { getline; gsub(/version = |"/, ""); print; exit }' uv.lock)
    [[ -n "$version" ]] || { echo "uv.lock pins no version of $name" >&2; exit 2; }
    pins+=("$name==$version")
done
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
    manylinux1_x86_64 any; do
    platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$dir" "${pins[@]}"

ls -1 "$dir"
du -sh "$dir"
