#!/usr/bin/env bash
# make gpu-check on a GPU machine that already has a CUDA build of torch (and numpy,
# hypothesis, pytest, click, rich) but no network, such as the device machines
# lent to some sessions: it uses that python as it is, with kvsched from src/ and any
# wheels carried in .whl/ (orjson, say). Runs the CUDA tests, then the CUDA benchmark,
# and writes its section into the Markdown file given (default docs/benchmarks.md).
#
#   scripts/gpu_check.sh [OUT.md]         PYTHON=python3 by default
#
# To carry orjson for a Python 3.12 machine, once, here:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_17_x86_64 -d .whl orjson
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/kvsched-site .whl/*.whl
    export PYTHONPATH=/tmp/kvsched-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
exec "$PY" -m tools.bench_optimized --gpu-check --out "${1:-docs/benchmarks.md}"
