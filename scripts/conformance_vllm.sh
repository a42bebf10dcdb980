#!/usr/bin/env bash
# `make conformance-vllm` (VLLM_RELEASE=0.32), `make conformance-vllm-0.33` and `make
# conformance-vllm-v0` (VLLM_RELEASE=v0): create that release's environment if it is
# missing (scripts/vllm_env.sh), then record its real scheduler on its suite
# (conformance.vllm for v1, conformance.vllm_v0 for V0: the checkout's conformance/, not
# installed) and check every
# trace at the MUST level and against the release's profile (vllm-v1@X.Y, vllm-v0).
# Extra arguments go to the suite (case names, --out DIR, --list); a later --out wins.
# --list needs no vLLM: the suite prints its cases from its own source, with $VENV alone.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
RELEASE=${VLLM_RELEASE:-0.32}

if [ ! -x "$VENV/bin/python" ]; then
    echo "conformance-vllm: $VENV is missing; run \`make test\` or \`make demo\` first" >&2
    exit 2
fi
out=build/conformance-vllm
[ "$RELEASE" = 0.32 ] || out=build/conformance-vllm-$RELEASE
suite=conformance.vllm
[ "$RELEASE" = v0 ] && suite=conformance.vllm_v0
for arg in "$@"; do
    if [ "$arg" = --list ]; then
        exec "$VENV/bin/python" -m "$suite" --out "$out" "$@"
    fi
done
python=$(scripts/vllm_env.sh "$RELEASE")
exec "$VENV/bin/python" -m "$suite" --vllm-python "$python" --out "$out" "$@"
