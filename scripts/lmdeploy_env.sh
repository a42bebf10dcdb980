#!/usr/bin/env bash
# Create LMDeploy's environment once (a stamp file marks it done) and print the path of its
# Python. Used by `make lmdeploy-env` and `make conformance-lmdeploy`.
#
#   scripts/lmdeploy_env.sh   ->  .venv-lmdeploy   lmdeploy 0.18.0 over torch 2.13.0+cpu (1.2 GB)
#
# LMDeploy's wheel declares torch<=2.12.1 (on the package index, a CUDA build), triton, ray
# and nvidia-* libraries; its PyTorch engine's scheduling path imports none of them. So every
# package is installed with --no-deps from scripts/lmdeploy-requirements.txt (all pinned),
# over the CPU torch wheel (torch==2.13.0, taken from the machine's local wheel folder). The
# TurboMind C++ engine (about 380 MB of shared objects and archives) is never loaded by the
# PyTorch engine and is removed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${LMDEPLOY_VENV:-.venv-lmdeploy}
stamp="$VENV/.installed-lmdeploy-0.18.0"
if [ ! -f "$stamp" ]; then
    echo "lmdeploy-env: creating $VENV with lmdeploy==0.18.0 (about 2 minutes, once)" >&2
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --no-deps "torch==2.13.0" \
        -r scripts/lmdeploy-requirements.txt >&2
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    rm -f "$site"/lmdeploy/turbomind/_turbomind*.so "$site"/lmdeploy/turbomind/lib64/*.a
    touch "$stamp"
fi
echo "$VENV/bin/python"
