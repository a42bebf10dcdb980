"""One workload recorded by vLLM 0.32's and vLLM 0.33's own schedulers: the traces the
upgrade's audit (docs/audit.md) and the tests of the two release profiles read.

    .venv/bin/python -m tools.vllm_releases record --python-0.32 PY --python-0.33 PY
    (make vllm-release-traces)

writes tests/data/vllm-releases/: the workload (workload.jsonl, kvsched's format) and
a trace per release (vllm-0.32.jsonl, vllm-0.33.jsonl; the config is in their headers),
each recorded by kvsched.adapters.vllm's driver in that release's environment.

The workload is small and tight on purpose: priority scheduling, a cache of 48 blocks
of 4 and four priority classes, so that the lowest-priority running request soon has
to preempt itself, the one decision the two releases take differently.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvsched.adapters.recording import Job
from kvsched.adapters.vllm import ENGINE as VLLM
from kvsched.generators import generate
from kvsched.spec.model import Config
from kvsched.workload import WorkItem, item_dict

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "vllm-releases"
RELEASES = ("0.32", "0.33")

CONFIG = Config(block_size=4, num_gpu_blocks=48, num_cpu_blocks=0,
                max_num_batched_tokens=64, max_num_seqs=8, max_model_len=128,
                chunked_prefill=True, long_prefill_token_threshold=0, policy="priority",
                preemption="recompute", watermark_blocks=0, prefix_caching=True)


def workload() -> list[WorkItem]:
    return generate("uniform", 40, 4, rate=1.0, max_model_len=128, prompt_range=(8, 100),
                    output_range=(4, 60), priorities=(1, 1, 1, 1))


def record(pythons: dict[str, Path], out: Path = DATA) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    items = workload()
    (out / "workload.jsonl").write_text("".join(json.dumps(item_dict(w)) + "\n"
                                                for w in items))
    paths = []
    for release in RELEASES:
        path = out / f"vllm-{release}.jsonl"
        [recorded] = VLLM.record_jobs([Job(f"vllm-{release}", CONFIG, items, path)],
                                 pythons[release])
        if not recorded.complete:
            raise SystemExit(f"vllm_releases: vLLM {release}'s trace did not complete")
        paths.append(path)
    return paths


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tools.vllm_releases")
    parser.add_argument("mode", choices=["record"])
    for release in RELEASES:
        parser.add_argument(f"--python-{release}", type=Path, required=True,
                            dest=f"python_{release.replace('.', '_')}",
                            help=f"vLLM {release}'s Python (scripts/vllm_env.sh {release})")
    args = parser.parse_args(argv)
    pythons = {r: getattr(args, f"python_{r.replace('.', '_')}") for r in RELEASES}
    for path in record(pythons):
        print(f"vllm_releases: wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
