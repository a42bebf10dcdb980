#!/usr/bin/env bash
# `make conformance-vllm` (VLLM_RELEASE=0.32) and `make conformance-vllm-0.33`: create
# that release's environment if it is missing (scripts/vllm_env.sh), then record its
# real v1 scheduler on the suite of kvsched.adapters.vllm_conformance and check every
# trace at the MUST level and against the release's profile (vllm-v1@X.Y).
# Extra arguments go to the suite (case names, --out DIR, --list).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
RELEASE=${VLLM_RELEASE:-0.32}

if [ ! -x "$VENV/bin/python" ]; then
    echo "conformance-vllm: $VENV is missing; run \`make test\` or \`make demo\` first" >&2
    exit 2
fi
python=$(scripts/vllm_env.sh "$RELEASE")
out=build/conformance-vllm
[ "$RELEASE" = 0.32 ] || out=build/conformance-vllm-$RELEASE
exec "$VENV/bin/python" -m kvsched.adapters.vllm_conformance \
    --vllm-python "$python" --out "$out" "$@"
