#!/usr/bin/env bash
# Create SGLang's environment once (a stamp file marks it done) and print the path of its
# Python. Used by `make sglang-env` and `make conformance-sglang`.
#
#   scripts/sglang_env.sh   ->  .venv-sglang   sglang 0.5.23 over torch 2.13.0+cpu (2.4 GB)
#
# SGLang pins torch==2.14.1, which on the package index is the CUDA build, and names CUDA
# kernels (sglang-kernel, flashinfer, ...) that its scheduler never loads. Letting pip
# resolve them pulls gigabytes of CUDA libraries. So every package is installed with
# --no-deps from scripts/sglang-requirements.txt (all pinned), over the CPU torch wheel
# (torch==2.13.0, which pip takes from the machine's local wheel folder). Importing
# SGLang's scheduler needs one more thing, done by the driver itself: an inert torchvision
# (kvsched/adapters/sglang_driver.py says why).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${SGLANG_VENV:-.venv-sglang}
stamp="$VENV/.installed-sglang-0.5.23"
if [ ! -f "$stamp" ]; then
    echo "sglang-env: creating $VENV with sglang==0.5.23 (a few minutes, once)" >&2
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --no-deps "torch==2.13.0" \
        -r scripts/sglang-requirements.txt >&2
    touch "$stamp"
fi
echo "$VENV/bin/python"
