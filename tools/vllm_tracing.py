"""kvsched's tracing scheduler beside vLLM's own, on the same workload, in vLLM's Python.

    <vllm-venv>/bin/python -m tools.vllm_tracing lockstep JOBS.jsonl TRACE_DIR
    <vllm-venv>/bin/python -m tools.vllm_tracing bench JOBS.jsonl ROUNDS
    .venv/bin/python -m tools.vllm_tracing overhead [ROUNDS]      (make bench)

(run from the repository root with src/ on PYTHONPATH, or kvsched installed there).
`lockstep` drives vLLM's Scheduler and kvsched.integrations.vllm.TracingScheduler step
by step as vLLM's engine core does (arrivals, aborts, schedule(), aborts in flight,
update_from_output()), compares their decisions after every step, and reads the
plugin's trace file after every step to see that the step's line is there; one JSON
line per job on standard output. `bench` times the scheduler calls of both on the
same workload in interleaved rounds. From kvsched's Python, `run_lockstep` and
`bench_tracing` run these and read the answers back.

A job is the vLLM driver's (kvsched.adapters.vllm.driver_input) plus "late_aborts":
{step: [ids]}, aborted between schedule() and update_from_output(), as the engine core
does with a client's abort that arrives during the forward pass.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvsched.adapters import vllm_driver as driver

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


class Mismatch(Exception):
    """The tracing scheduler decided otherwise than vLLM's own; one line."""


class Side:
    """One scheduler and the Request objects it holds."""

    def __init__(self, job: dict[str, Any], model_dir: Path, scheduler_class: Any) -> None:
        self.scheduler = driver.build_scheduler(job["config"], model_dir, scheduler_class)
        self.hasher = driver.block_hasher(self.scheduler)
        self.live: dict[str, Any] = {}
        self.busy = 0.0  # seconds inside the scheduler's own calls

    def timed(self, call: Any, *args: Any) -> Any:
        started = time.perf_counter()
        out = call(*args)
        self.busy += time.perf_counter() - started
        return out

    def add(self, item: dict[str, Any], order: int, contents: driver.Contents) -> None:
        request = driver.make_request(item, order, contents, self.hasher)
        self.live[item["id"]] = request
        self.timed(self.scheduler.add_request, request)

    def abort(self, rid: str) -> None:
        status = importlib.import_module("vllm.v1.request").RequestStatus
        if self.live.pop(rid, None) is not None:
            self.timed(self.scheduler.finish_requests, rid, status.FINISHED_ABORTED)

    def runner_output(self, output: Any, contents: driver.Contents) -> Any:
        outputs_mod = importlib.import_module("vllm.v1.outputs")
        ids = list(output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in ids:
            request = self.live.get(rid)
            if request is None or request.num_computed_tokens < request.num_tokens:
                sampled.append([])  # aborted in flight, or a partial prefill chunk
            else:
                sampled.append([contents.output(rid, request.num_output_tokens)])
        return outputs_mod.ModelRunnerOutput(
            req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=sampled)


def decision(side: Side, output: Any) -> dict[str, Any]:
    """What a step decided, as comparable values."""
    fresh, hits = driver.step_blocks(output, side.scheduler.block_size)
    return {"scheduled": list(output.num_scheduled_tokens.items()),
            "preempted": sorted(output.preempted_req_ids), "new_blocks": fresh,
            "prefix_hits": hits, "finished_req_ids": sorted(output.finished_req_ids)}


def run_job(job: dict[str, Any], model_dir: Path, sides: Sequence[Side],
            on_step: Any = None) -> int:
    """Drive every side through the job in lockstep; returns the steps run. `on_step`
    gets (step, [decision per side]) after each step."""
    contents = driver.Contents(job["requests"])
    pending = sorted(job["requests"], key=lambda w: w["arrival"])
    aborts: dict[int, list[str]] = {}
    for w in pending:
        if w.get("abort") is not None:
            aborts.setdefault(w["abort"], []).append(w["id"])
    late = {int(k): v for k, v in job.get("late_aborts", {}).items()}
    nxt = step = 0
    while nxt < len(pending) or any(s.live for s in sides):
        if step >= (job.get("max_steps") or 10_000):
            raise Mismatch(f"{job['name']}: not drained after {step} steps")
        while nxt < len(pending) and pending[nxt]["arrival"] <= step:
            nxt += 1
            for side in sides:
                side.add(pending[nxt - 1], nxt, contents)
        for rid in aborts.pop(step, ()):
            for side in sides:
                side.abort(rid)
        outputs = [side.timed(side.scheduler.schedule) for side in sides]
        decisions = [decision(side, out) for side, out in zip(sides, outputs, strict=True)]
        runner = [side.runner_output(out, contents)
                  for side, out in zip(sides, outputs, strict=True)]
        for rid in late.pop(step, ()):
            for side in sides:
                side.abort(rid)
        for side, out, ran in zip(sides, outputs, runner, strict=True):
            engine_outputs = side.timed(side.scheduler.update_from_output, out, ran)
            for f in driver.finishes(engine_outputs):
                side.live.pop(f["id"], None)
        for d, side in zip(decisions, sides, strict=True):
            d["free_blocks"] = side.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
        if on_step is not None:
            on_step(step, decisions)
        step += 1
    return step


def lockstep(job: dict[str, Any], trace_dir: Path, model_dir: Path) -> dict[str, Any]:
    os.environ["KVSCHED_TRACE_DIR"] = str(trace_dir)
    tracing = importlib.import_module("kvsched.integrations.vllm")
    plain = Side(job, model_dir, None)
    traced = Side(job, model_dir, tracing.TracingScheduler)
    path = Path(traced.scheduler.kvsched_trace_path)
    flushed: list[int] = []  # steps whose line was in the file right after the step

    def compare(step: int, decisions: list[dict[str, Any]]) -> None:
        if decisions[0] != decisions[1]:
            raise Mismatch(f"{job['name']} step {step}: vLLM {decisions[0]} but "
                           f"TracingScheduler {decisions[1]}")
        lines = path.read_bytes().splitlines()
        if json.loads(lines[-1]).get("step") == step and len(lines) == step + 2:
            flushed.append(step)

    steps = run_job(job, model_dir, [plain, traced], compare)
    traced.scheduler.shutdown()
    return {"job": job["name"], "steps": steps, "trace": str(path),
            "flushed": len(flushed)}


def bench(job: dict[str, Any], rounds: int, model_dir: Path) -> dict[str, Any]:
    """Seconds inside the scheduler per run, untraced and traced, rounds interleaved
    (which goes first alternates), one scheduler per run. The garbage collector's heap
    is frozen after the imports, as vLLM's engine core freezes it after start-up:
    otherwise each full collection walks torch's and vLLM's millions of objects, and
    whichever side allocates more pays for that walk."""
    tracing = importlib.import_module("kvsched.integrations.vllm")
    gc.collect()
    gc.freeze()
    times: dict[str, list[float]] = {"untraced": [], "traced": []}
    steps = 0
    with tempfile.TemporaryDirectory(prefix="kvsched-bench-") as tmp:
        os.environ["KVSCHED_TRACE_DIR"] = tmp
        for r in range(rounds):
            order = ["untraced", "traced"] if r % 2 == 0 else ["traced", "untraced"]
            for kind in order:
                side = Side(job, model_dir,
                            tracing.TracingScheduler if kind == "traced" else None)
                steps = run_job(job, model_dir, [side])
                if kind == "traced":
                    side.scheduler.shutdown()
                    Path(side.scheduler.kvsched_trace_path).unlink()
                times[kind].append(side.busy)
    return {"job": job["name"], "steps": steps, **times}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tools.vllm_tracing")
    parser.add_argument("mode", choices=["lockstep", "bench", "overhead"])
    parser.add_argument("jobs", type=Path, nargs="?")
    parser.add_argument("arg", nargs="?")
    parser.add_argument("--out", type=Path, default=None,
                        help="overhead: also put its section in this Markdown file")
    args = parser.parse_args(argv)
    if args.mode == "overhead":  # from kvsched's Python: `make bench`
        return print_overhead(int(str(args.jobs)) if args.jobs is not None else 7, args.out)
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS",
                "DO_NOT_TRACK"):
        os.environ.setdefault(key, "1")
    events = os.fdopen(os.dup(1), "w", buffering=1)  # vLLM's prints go to stderr
    os.dup2(2, 1)
    jobs = [json.loads(line) for line in args.jobs.read_text().splitlines() if line.strip()]
    with tempfile.TemporaryDirectory(prefix="kvsched-vllm-") as tmp:
        for job in jobs:
            try:
                if args.mode == "lockstep":
                    out = lockstep(job, Path(args.arg), Path(tmp))
                else:
                    out = bench(job, int(args.arg), Path(tmp))
            except Mismatch as e:
                out = {"job": job["name"], "error": str(e)}
            events.write(json.dumps(out) + "\n")
    return 0


# -- from kvsched's Python --------------------------------------------------------------

def in_vllm(mode: str, jobs: Sequence[dict[str, Any]], arg: str,
            vllm_python: Path = VLLM_PYTHON, timeout: float = 600) -> list[dict[str, Any]]:
    """Run this module in vLLM's Python on `jobs`; one answer per job."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), VLLM_LOGGING_LEVEL="WARNING")
    env.pop("PYTHONHASHSEED", None)  # vLLM seeds its block hashes from it
    with tempfile.TemporaryDirectory(prefix="kvsched-jobs-") as tmp:
        path = Path(tmp) / "jobs.jsonl"
        path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
        proc = subprocess.run([str(vllm_python), "-m", "tools.vllm_tracing", mode, str(path),
                               arg], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"tools.vllm_tracing {mode} exited {proc.returncode}: "
                           + (proc.stderr.strip().splitlines() or [""])[-1])
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def bench_tracing(rounds: int = 7, vllm_python: Path = VLLM_PYTHON) -> dict[str, Any]:
    """Tracing overhead: vLLM's Scheduler with and without kvsched's tracing, the same
    ShareGPT-like workload (prefix caching on, system prompts), interleaved rounds.
    Returns the medians (seconds in the scheduler per run) and their ratio."""
    from kvsched.adapters.vllm import Job, driver_input
    from kvsched.generators import SHARED_PROMPTS, generate
    from kvsched.spec.model import Config

    config = Config(block_size=16, num_gpu_blocks=1024, num_cpu_blocks=0,
                    max_num_batched_tokens=1024, max_num_seqs=64, max_model_len=2048,
                    chunked_prefill=True, long_prefill_token_threshold=0, policy="fcfs",
                    preemption="recompute", watermark_blocks=0, prefix_caching=True)
    workload = generate(SHARED_PROMPTS, 300, seed=1, rate=0.5, max_model_len=2048)
    job = driver_input(Job("bench", config, workload, Path("unused")))
    [answer] = in_vllm("bench", [job], str(rounds), vllm_python)
    untraced = statistics.median(answer["untraced"])
    traced = statistics.median(answer["traced"])
    return {"steps": answer["steps"], "rounds": rounds, "untraced_s": untraced,
            "traced_s": traced, "ratio": traced / untraced,
            "untraced_us_per_step": untraced / answer["steps"] * 1e6,
            "traced_us_per_step": traced / answer["steps"] * 1e6}


TRACING_START = "<!-- vllm tracing overhead: start -->"
TRACING_END = "<!-- vllm tracing overhead: end -->"


def print_overhead(rounds: int, out: Path | None = None) -> int:
    """Print the tracing overhead; with `out`, put its section in that Markdown file."""
    if not VLLM_PYTHON.exists():
        print("tracing overhead: skipped, .venv-vllm is absent (make conformance-vllm)")
        return 0
    r = bench_tracing(rounds)
    line = (f"untraced {r['untraced_us_per_step']:.0f} us/step, traced "
            f"{r['traced_us_per_step']:.0f} us/step, ratio {r['ratio']:.3f}")
    print(f"tracing overhead (vLLM 0.32 Scheduler, {r['steps']} steps, median of "
          f"{r['rounds']} interleaved rounds): {line}")
    if out is not None:
        from datetime import UTC, datetime

        from tools.bench import machine
        from tools.bench_optimized import place
        place("\n".join([
            TRACING_START, "## The vLLM tracing plugin's overhead", "",
            f"Measured by `python -m tools.vllm_tracing overhead {rounds}` (in `make bench`) "
            f"on {datetime.now(UTC):%Y-%m-%d}. Machine: {machine()}.", "",
            "vLLM 0.32's v1 Scheduler and kvsched.integrations.vllm.TracingScheduler (which "
            "writes trace v1 and flushes it every step) on the same 300 shared-prompt "
            "requests with prefix caching on, in vLLM's own Python, rounds interleaved "
            f"(untraced, traced, ...): {r['steps']:,} steps a run, the time inside the "
            "scheduler's calls, the median of "
            f"{rounds} rounds each, Python's garbage collector frozen after start-up as "
            "vLLM's engine does.", "",
            "| scheduler | us/step |", "|---|---:|",
            f"| vLLM's Scheduler | {r['untraced_us_per_step']:.0f} |",
            f"| TracingScheduler | {r['traced_us_per_step']:.0f} |", "",
            f"Ratio traced / untraced: **{r['ratio']:.3f}**. Against a real engine step "
            "(milliseconds of forward pass) the added microseconds are small; the ratio "
            "moves with the machine's load.", TRACING_END]) + "\n", out,
              TRACING_START, TRACING_END)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
