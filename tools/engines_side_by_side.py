"""vLLM's and SGLang's scheduling side by side, as kvsched sees them: the same workloads
on the same cache, recorded from each engine's real scheduler (vLLM 0.32's v1 scheduler,
SGLang 0.5.23's), kept in tests/data/side-by-side/, and compared by kvsched's metrics.

    python -m tools.engines_side_by_side record   # both engines' environments needed
    python -m tools.engines_side_by_side          # docs/conformance/vllm-vs-sglang.md

`make test` checks every kept trace (MUST-clean and exact under its engine's profile)
and that the page is what this makes of them.
"""

from __future__ import annotations

import argparse
import gzip
import io
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvsched.adapters import sglang as sglang_adapter
from kvsched.adapters import vllm as vllm_adapter
from kvsched.adapters.vllm import Job
from kvsched.generators import generate
from kvsched.metrics import Metrics, metrics_of_trace
from kvsched.spec.model import Config
from kvsched.spec.profiles import get_profile
from kvsched.workload import WorkItem

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / "tests" / "data" / "side-by-side"
OUT = ROOT / "docs" / "conformance" / "vllm-vs-sglang.md"
# One cache for both: pages (blocks) of 16 tokens, 264 of them, a token budget of 512 a
# step, 32 running requests, sequences of 2048 tokens; prefix caching on, each engine's
# default (vLLM's block hashes, SGLang's radix cache).
CONFIG = Config(block_size=16, num_gpu_blocks=264, max_num_batched_tokens=512,
                max_num_seqs=32, max_model_len=2048, chunked_prefill=True,
                first_block_id=1, prefix_caching=True)
ENGINES = {"vllm": ("vLLM 0.32", "vllm-v1@0.32"), "sglang": ("SGLang 0.5.23", "sglang@0.5.23")}


@dataclass(frozen=True)
class Workload:
    name: str
    what: str
    kind: str
    n: int
    rate: float


# Requests shorter than SGLang's limits (kvsched.adapters.sglang.served_as_asked): the
# generators keep prompt + max_tokens within max_model_len - 8.
WORKLOADS = (
    Workload("chat", "60 ShareGPT-like requests, one every 4 steps", "sharegpt", 60, 0.25),
    Workload("burst", "120 ShareGPT-like requests, 8 a step: the cache runs short",
             "sharegpt", 120, 8.0),
    Workload("shared-prompts", "60 requests after shared system prompts, one every 2 "
             "steps", "shared-prompts", 60, 0.5),
    Workload("conversations", "40 turns of conversations, each turn's prompt the whole "
             "previous turn, one every 2 steps", "conversations", 40, 0.5),
)


def items(w: Workload) -> list[WorkItem]:
    return generate(w.kind, w.n, seed=7, rate=w.rate, max_model_len=CONFIG.max_model_len - 8)


def config_of(engine: str) -> Config:
    profile = get_profile(ENGINES[engine][1])
    return profile.configure(CONFIG, frozenset({"prefix_caching"}))


def path_of(workload: str, engine: str) -> Path:
    return STORE / f"{workload}-{engine}.jsonl.gz"


def record(vllm_python: Path, sglang_python: Path, out: Path) -> None:
    """Record every workload with both engines and keep the traces."""
    out.mkdir(parents=True, exist_ok=True)
    STORE.mkdir(parents=True, exist_ok=True)
    for engine, python in (("vllm", vllm_python), ("sglang", sglang_python)):
        jobs = [Job(w.name, config_of(engine), items(w), out / f"{w.name}-{engine}.jsonl")
                for w in WORKLOADS]
        adapter = vllm_adapter if engine == "vllm" else sglang_adapter
        for r in adapter.record_jobs(jobs, python):
            if not r.complete:
                raise SystemExit(f"{r.job.name}: {engine} stopped early: {r.stopped}")
            path_of(r.job.name, engine).write_bytes(
                gzip.compress(r.job.out.read_bytes(), compresslevel=9, mtime=0))


def kept(workload: str, engine: str) -> bytes:
    return gzip.decompress(path_of(workload, engine).read_bytes())


def metrics(workload: str, engine: str) -> Metrics:
    return metrics_of_trace(io.BytesIO(kept(workload, engine)), series=False)


def cell(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def render() -> str:
    lines = [
        "# vLLM and SGLang side by side",
        "",
        "The same workloads on the same cache, recorded from each engine's real scheduler "
        "(`kvsched record vllm`: vLLM 0.32's v1 scheduler; `kvsched record sglang`: "
        "SGLang 0.5.23's) and compared by `kvsched metrics`. The traces are kept in "
        "tests/data/side-by-side/; `make test` checks each one MUST-clean and exact under "
        "its engine's profile (vllm-v1@0.32, sglang@0.5.23), and that this page is what "
        "`python -m tools.engines_side_by_side` makes of them.",
        "",
        f"The cache: blocks (SGLang's pages) of {CONFIG.block_size} tokens, "
        f"{CONFIG.num_gpu_blocks} of them ({CONFIG.num_gpu_blocks * CONFIG.block_size} "
        f"tokens), a token budget of {CONFIG.max_num_batched_tokens} a step, at most "
        f"{CONFIG.max_num_seqs} running requests, sequences of at most "
        f"{CONFIG.max_model_len} tokens, chunked prefill, prefix caching on (vLLM's block "
        "hashes, SGLang's radix cache). Times are in steps: a step is one batch of either "
        "engine, and SGLang's steps are prefill or decode, never both.",
        "",
        "How they decide differently (docs/spec.md, section 8; docs/conformance/sglang.md): "
        "vLLM admits what this step's blocks allow, running requests first, and preempts "
        "the latest when a running request's next block is not free; SGLang admits a "
        "request only when its whole future output fits beside what the running ones are "
        "expected to need (the new-token ratio), runs a step of prefills alone, and "
        "retracts the request with the fewest outputs when a decode does not fit.",
        "",
    ]
    names = [name for name, _ in ENGINES.values()]
    every = {(w.name, e): metrics(w.name, e) for w in WORKLOADS for e in ENGINES}
    lines += ["What the numbers show, on these workloads:", ""]
    lines += [f"- {claim}" for claim in claims(every)]
    lines.append("")
    for w in WORKLOADS:
        m = {engine: metrics(w.name, engine) for engine in ENGINES}
        lines += [f"## {w.name}", "", f"{w.what} (generator `{w.kind}`, seed 7).", "",
                  f"| | {' | '.join(names)} |", "|---|" + "---:|" * len(names)]
        rows: list[tuple[str, list[float | None], int]] = [
            ("requests finished", [float(x.finished) for x in m.values()], 0),
            ("steps to finish", [float(x.steps) for x in m.values()], 0),
            ("TTFT mean (steps)", [x.ttft.mean for x in m.values()], 1),
            ("TTFT p99 (steps)", [x.ttft.p99 for x in m.values()], 1),
            ("latency mean (steps)", [x.latency.mean for x in m.values()], 1),
            ("tokens generated per step", [x.generated_per_step for x in m.values()], 2),
            ("preemptions (SGLang: retractions and priority preemptions)",
             [float(sum(x.preemptions.values())) for x in m.values()], 0),
            ("recomputed tokens", [float(x.recomputed_tokens) for x in m.values()], 0),
            ("KV use mean", [x.kv_use_mean for x in m.values()], 2),
            ("prefix-cache hit rate",
             [x.prefix_cache.hit_rate if x.prefix_cache is not None else None
              for x in m.values()], 2),
        ]
        for label, values, digits in rows:
            lines.append(f"| {label} | " + " | ".join(cell(v, digits) for v in values) + " |")
        lines.append("")
    lines += ["Made again from the kept traces by `python -m tools.engines_side_by_side`; "
              "recorded again, with both engines' environments, by "
              "`python -m tools.engines_side_by_side record`.", ""]
    return "\n".join(lines)


def claims(every: dict[tuple[str, str], Metrics]) -> list[str]:
    """Sentences the metrics bear out on every workload (each one computed, so that a
    change in either engine's kept traces changes or drops it)."""
    out = []

    def each(key: str, f: object) -> list[tuple[float, float]]:
        assert callable(f)
        return [(float(f(every[(w.name, "vllm")])), float(f(every[(w.name, "sglang")])))
                for w in WORKLOADS]

    ttft = each("ttft", lambda m: m.ttft.mean)
    if all(v < s for v, s in ttft):
        out.append("vLLM's first tokens come sooner: its TTFT mean is "
                   + ", ".join(f"{v:.0f} against {s:.0f}" for v, s in ttft)
                   + " steps (workload by workload), since SGLang admits a request only "
                   "with room for its whole future output.")
    pre = each("preemptions", lambda m: sum(m.preemptions.values()))
    rec = each("recomputed", lambda m: m.recomputed_tokens)
    if all(s < v for v, s in pre):
        out.append("SGLang preempts far less: "
                   + ", ".join(f"{s:.0f} against {v:.0f}" for v, s in pre)
                   + " preemptions, and it recomputes "
                   + ", ".join(f"{s:.0f}" for _, s in rec) + " tokens where vLLM "
                   "recomputes " + ", ".join(f"{v:.0f}" for v, _ in rec) + ".")
    use = each("use", lambda m: m.kv_use_mean)
    steps = each("steps", lambda m: m.steps)
    if all(s < v for v, s in use) and all(v < s for v, s in steps):
        out.append("vLLM keeps its cache fuller (KV use mean "
                   + ", ".join(f"{v:.2f}" for v, _ in use) + " against "
                   + ", ".join(f"{s:.2f}" for _, s in use)
                   + ") and finishes the workloads in fewer steps ("
                   + ", ".join(f"{v:.0f} against {s:.0f}" for v, s in steps) + ").")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.engines_side_by_side",
                                     description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("what", nargs="?", choices=("render", "record"), default="render")
    parser.add_argument("--vllm-python", type=Path, default=vllm_adapter.DEFAULT_VLLM_PYTHON)
    parser.add_argument("--sglang-python", type=Path,
                        default=sglang_adapter.DEFAULT_SGLANG_PYTHON)
    parser.add_argument("--out", type=Path, default=Path("build/side-by-side"))
    args = parser.parse_args(argv)
    if args.what == "record":
        try:
            record(args.vllm_python, args.sglang_python, args.out)
        except vllm_adapter.AdapterError as e:
            print(f"engines_side_by_side: error: {e}", file=sys.stderr)
            return 2
    OUT.write_text(render())
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

