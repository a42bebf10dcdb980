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

A job is the vLLM driver's (kvsched.adapters.vllm.ENGINE.driver_input) plus "late_aborts":
{step: [ids]}, aborted between schedule() and update_from_output(), as the engine core
does with a client's abort that arrives during the forward pass, and for `lockstep`
"break_trace_after": a step after which the trace's file fails under the plugin.
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

from kvsched.adapters import driver_host
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
        # The thread's CPU time: what the calls cost, not what the machine's other
        # processes took from them meanwhile (on a shared machine, far more noise).
        started = time.thread_time()
        out = call(*args)
        self.busy += time.thread_time() - started
        return out

    def add(self, item: dict[str, Any], order: int, contents: driver_host.Contents) -> None:
        request = driver.make_request(item, order, contents, self.hasher)
        self.live[item["id"]] = request
        self.timed(self.scheduler.add_request, request)

    def abort(self, rid: str) -> None:
        status = importlib.import_module("vllm.v1.request").RequestStatus
        if self.live.pop(rid, None) is not None:
            self.timed(self.scheduler.finish_requests, rid, status.FINISHED_ABORTED)

    def runner_output(self, output: Any, contents: driver_host.Contents) -> Any:
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
            on_step: Any = None, alternate: bool = False) -> int:
    """Drive every side through the job in lockstep; returns the steps run. `on_step`
    gets (step, [decision per side]) after each step. With `alternate`, the sides take
    each step's calls in the other order every other step (two sides: each goes first
    in half the steps)."""
    contents = driver_host.Contents(job["requests"])
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
        order = list(sides)[::-1] if alternate and step % 2 else list(sides)
        while nxt < len(pending) and pending[nxt]["arrival"] <= step:
            nxt += 1
            for side in order:
                side.add(pending[nxt - 1], nxt, contents)
        for rid in aborts.pop(step, ()):
            for side in order:
                side.abort(rid)
        outputs = {id(side): side.timed(side.scheduler.schedule) for side in order}
        # Only when compared: the bench runs none of the plugin's readings between the
        # timed calls, which would warm them for the traced side.
        decisions = [decision(side, outputs[id(side)]) for side in sides] \
            if on_step is not None else []
        runner = {id(side): side.runner_output(outputs[id(side)], contents)
                  for side in order}
        for rid in late.pop(step, ()):
            for side in order:
                side.abort(rid)
        for side in order:
            engine_outputs = side.timed(side.scheduler.update_from_output,
                                        outputs[id(side)], runner[id(side)])
            for batch in engine_outputs.values():  # (not the plugin's finished_outputs)
                for out in batch.outputs:
                    if out.finish_reason is not None:
                        side.live.pop(out.request_id, None)
        if on_step is not None:
            for d, side in zip(decisions, sides, strict=True):
                d["free_blocks"] = \
                    side.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
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
        if step == job.get("break_trace_after"):
            # The trace's file fails under the engine (as a full disk would): the next
            # write raises, the tracing stops, the scheduler goes on.
            os.close(traced.scheduler.kvsched_trace.stream.fileno())

    steps = run_job(job, model_dir, [plain, traced], compare)
    traced.scheduler.shutdown()
    return {"job": job["name"], "steps": steps, "trace": str(path),
            "flushed": len(flushed), "tracing": traced.scheduler.kvsched_trace is not None}


def bench(job: dict[str, Any], rounds: int, model_dir: Path) -> dict[str, Any]:
    """Seconds inside the scheduler per run, untraced and traced. Each round drives both
    schedulers in lockstep (each step: one side's calls, then the other's), so the two
    meet the same moments of a shared machine's noise; the ratio is taken per round.
    Which side goes first alternates step by step: the second finds the caches warm
    from the first's run through the same vLLM code, a bias of several percent that
    would otherwise favour whichever side went second in more rounds (with an odd
    number of rounds, alternating by round leaves one round's bias in the mean). The
    garbage collector's heap is frozen once
    the schedulers are built, as vLLM's engine core freezes it at the end of its
    start-up (EngineCore.__init__, freeze_gc_heap): otherwise each full collection
    walks torch's, vLLM's and the block pool's objects, and whichever side allocates
    more pays for that walk."""
    tracing = importlib.import_module("kvsched.integrations.vllm")
    times: dict[str, list[float]] = {"untraced": [], "traced": []}
    steps = 0
    with tempfile.TemporaryDirectory(prefix="kvsched-bench-") as tmp:
        os.environ["KVSCHED_TRACE_DIR"] = tmp
        for r in range(rounds):
            gc.unfreeze()
            plain = Side(job, model_dir, None)
            traced = Side(job, model_dir, tracing.TracingScheduler)
            for generation in (0, 1, 2):
                gc.collect(generation)
            gc.freeze()
            steps = run_job(job, model_dir, [plain, traced] if r % 2 == 0 else
                            [traced, plain], alternate=True)
            traced.scheduler.shutdown()
            Path(traced.scheduler.kvsched_trace_path).unlink()
            times["untraced"].append(plain.busy)
            times["traced"].append(traced.busy)
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


# The workloads of the overhead measurement: (name, running requests at most, requests,
# arrivals a step, KV cache blocks, token budget). Shared-prompt (ShareGPT-like)
# traffic with prefix caching on, vLLM's default.
TRACING_LOADS = (("light", 64, 300, 0.5, 1024, 1024),
                 ("serving batch", 256, 1000, 4.0, 8192, 8192))


def bench_tracing(rounds: int = 7, vllm_python: Path = VLLM_PYTHON) -> list[dict[str, Any]]:
    """Tracing overhead: vLLM's Scheduler with and without kvsched's tracing on the same
    workload, in lockstep, for each of TRACING_LOADS. The ratio of a round is its
    traced over its untraced time; the answer is the geometric mean over the rounds.
    Which scheduler goes first alternates step by step (bench)."""
    from kvsched.adapters.recording import Job
    from kvsched.adapters.vllm import ENGINE as VLLM
    from kvsched.generators import SHARED_PROMPTS, generate
    from kvsched.spec.model import Config

    jobs = []
    for name, seqs, n, rate, blocks, budget in TRACING_LOADS:
        config = Config(block_size=16, num_gpu_blocks=blocks, num_cpu_blocks=0,
                        max_num_batched_tokens=budget, max_num_seqs=seqs,
                        max_model_len=2048, chunked_prefill=True,
                        long_prefill_token_threshold=0, policy="fcfs",
                        preemption="recompute", watermark_blocks=0, prefix_caching=True)
        workload = generate(SHARED_PROMPTS, n, seed=1, rate=rate, max_model_len=2048)
        jobs.append(VLLM.driver_input(Job(name, config, workload, Path("unused"))))
    results = []
    for (name, seqs, n, *_), answer in zip(
            TRACING_LOADS, in_vllm("bench", jobs, str(rounds), vllm_python), strict=True):
        steps = answer["steps"]
        ratios = [t / u for t, u in zip(answer["traced"], answer["untraced"], strict=True)]
        results.append({
            "load": name, "max_num_seqs": seqs, "requests": n, "steps": steps,
            "rounds": rounds, "ratio": statistics.geometric_mean(ratios),
            "ratios": ratios,
            "untraced_us_per_step": statistics.median(answer["untraced"]) / steps * 1e6,
            "traced_us_per_step": statistics.median(answer["traced"]) / steps * 1e6})
    return results


def verdict(results: list[dict[str, Any]]) -> str:
    """A paragraph on the target: met, or by how many microseconds a step it is not."""
    missed = [r for r in results if r["ratio"] > TRACING_TARGET]
    if not missed:
        return "Every load is within the target.\n"
    # From the ratio (paired rounds), not from the two sides' medians (unpaired).
    added = "; ".join(f"about {(r['ratio'] - 1) * r['untraced_us_per_step']:.0f} us a step "
                      f"at the {r['load']} load" for r in missed)
    return ("**The target is not met** where the table says no: the tracing adds "
            f"{added}. Most of it is fixed per step (the write, the line's parts and "
            "their encoding), which weighs most against a light step.\n")


TRACING_START = "<!-- vllm tracing overhead: start -->"
TRACING_END = "<!-- vllm tracing overhead: end -->"
TRACING_TARGET = 1.05


def print_overhead(rounds: int, out: Path | None = None) -> int:
    """Print the tracing overhead; with `out`, put its section in that Markdown file."""
    if not VLLM_PYTHON.exists():
        print("tracing overhead: skipped, .venv-vllm is absent (make conformance-vllm)")
        return 0
    results = bench_tracing(rounds)
    rows = []
    for r in results:
        print(f"tracing overhead, {r['load']} (vLLM 0.32 Scheduler, {r['steps']} steps, "
              f"{r['rounds']} rounds in lockstep): untraced {r['untraced_us_per_step']:.0f} "
              f"us/step, traced {r['traced_us_per_step']:.0f} us/step, ratio "
              f"{r['ratio']:.3f}")
        met = "yes" if r["ratio"] <= TRACING_TARGET else "**no**"
        rows.append(f"| {r['load']} | {r['max_num_seqs']} | {r['requests']:,} | "
                    f"{r['steps']:,} | {r['untraced_us_per_step']:.0f} | "
                    f"{r['traced_us_per_step']:.0f} | **{r['ratio']:.3f}** | "
                    f"{min(r['ratios']):.3f}-{max(r['ratios']):.3f} | {met} |")
    if out is not None:
        from datetime import UTC, datetime

        from tools.bench import machine, place
        place("\n".join([
            TRACING_START, "## The vLLM tracing plugin's overhead", "",
            f"Measured by `python -m tools.vllm_tracing overhead {rounds}` (in `make bench`) "
            f"on {datetime.now(UTC):%Y-%m-%d}. Machine: {machine()}.", "",
            "vLLM 0.32's v1 Scheduler and kvsched.integrations.vllm.TracingScheduler "
            "(which writes trace v1 and flushes it every step) driven in lockstep on the "
            "same shared-prompt (ShareGPT-like) requests with prefix caching on, in "
            "vLLM's own Python: each step runs one scheduler's calls, then the other's, "
            "so both meet the same moments of the machine's noise. Time is the thread's "
            "CPU time inside the scheduler's calls. Which scheduler goes first alternates "
            "step by step, so that every round is fair on its own (the second finds the "
            "caches warm from the first's run through the same vLLM code: a bias of "
            "several percent, which alternating by round left in the mean of an odd "
            f"number of rounds), and the ratio is the geometric mean of the {rounds} "
            "rounds' traced / untraced ratios. Between the timed calls the harness runs "
            "none of the plugin's code (which would warm it for the traced side). Python's "
            "garbage collector's heap is frozen once the schedulers are built, as vLLM's "
            "engine core does at the end of its start-up. Both schedulers share one "
            "process, so vLLM's code meets two scheduler classes, and the block pool's "
            "cache hook, which the plugin sets on the pool's class, runs for both: each "
            "costs both sides alike and so lowers the ratio a little (a few tenths of a "
            "percent at most).",
            "",
            f"Target: at most {TRACING_TARGET:.2f} (5% of the scheduler's step time).", "",
            "| load | max_num_seqs | requests | steps | untraced us/step | traced us/step "
            "| ratio | rounds' range | within 5% |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|", *rows, "",
            verdict(results),
            "What a step's tracing does: after schedule(), it reads the batch and the "
            "blocks handed out from the scheduler output; when vLLM caches blocks, the "
            "block pool's hook notes the request (a list append), and the new blocks' "
            "content keys are picked out once a step (vLLM's hash bytes go to the encoder "
            "as they are); after "
            "update_from_output(), it reads the finished requests, builds the line from "
            "its parts, encodes it with msgspec (vLLM's own dependency) into a buffer kept "
            "across steps and writes that buffer in one system call on an unbuffered file. "
            "The write is the largest single part (a few microseconds on this machine's "
            "ext4, more in the steps where the file's modification time goes to the "
            "journal). Inside the engine's step, where vLLM's scheduler has the caches, "
            "each Python call and object costs several times what a loop of its own "
            "measures, and rarely used C code (itertools' iterators, the JSON encoder) is "
            "cold, so a step makes few calls and objects: plain loops over vLLM's lists, "
            "no record built for the line's parts, no copy of the line. "
            "Against a real engine step (milliseconds of forward pass) the added "
            "microseconds are a fraction of a percent.", TRACING_END])
              + "\n", out, TRACING_START, TRACING_END)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
