"""`make bench`: baselines of the reference scheduler and the spec checker.

Simulates a ShareGPT-like workload (100k requests by default) with the reference
scheduler, writing its trace, then checks that trace with the spec's checker, and
writes the figures with the command and the machine to docs/benchmarks.md. Then a
prefix-heavy workload (shared system prompts) with prefix caching on and off, side by
side: the reference's step time, and both checkers' throughput on the caching trace.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import orjson

from kvsched.generators import SHARED_PROMPTS, generate
from kvsched.optimized.checker import check_trace_vectorized
from kvsched.outputs import atomic_output
from kvsched.reference import reference_scheduler
from kvsched.simulate import run
from kvsched.spec.checker import check_trace
from kvsched.spec.model import Config
from kvsched.spec.trace import TraceReader, TraceWriter

# A mid-size engine: 8192 blocks of 16 tokens (131k tokens of KV), 256 sequences,
# an 8192-token step budget.
BENCH_CONFIG = Config(block_size=16, num_gpu_blocks=8192, num_cpu_blocks=0,
                      max_num_batched_tokens=8192, max_num_seqs=256, max_model_len=8192,
                      chunked_prefill=True, long_prefill_token_threshold=0, policy="fcfs",
                      preemption="recompute", watermark_blocks=0)


@dataclass(frozen=True)
class Timing:
    seconds: float
    steps: int
    entries: int

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds

    @property
    def entries_per_s(self) -> float:
        return self.entries / self.seconds


def place(text: str, path: Path, start: str, end: str) -> None:
    """Replace the section between `start` and `end` in `path` (or append it)."""
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    if start in old and end in old:
        head, rest = old.split(start, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        new = head + text + ("\n" + tail if tail else "")
    else:
        new = old.rstrip("\n") + "\n\n" + text
    with atomic_output(path) as stream:
        stream.write(new.encode())


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}")


@dataclass(frozen=True)
class Simulation:
    """One simulation by the reference: its timing, and its prefix-cache hits."""

    sim: Timing
    hits: int
    hit_tokens: int
    prompt_tokens: int


def simulate(kind: str, config: Config, requests: int, rate: float, trace: Path,
             seed: int = 0) -> Simulation:
    """The reference (profile vllm-v1) on `requests` of generator `kind` (drawn with
    `seed`), its trace written to `trace`; the clock runs over the simulation loop and
    the writing."""
    workload = generate(kind, requests, seed=seed, arrival="poisson", rate=rate,
                        max_model_len=config.max_model_len)
    scheduler = reference_scheduler("vllm-v1", config)
    steps = entries = hits = hit_tokens = 0
    with trace.open("wb") as stream:
        writer = TraceWriter(stream, lambda o: orjson.dumps(o) + b"\n")
        writer.header(config)
        start = time.perf_counter()
        for rec in run(scheduler, workload):
            writer.step(rec)
            steps += 1
            entries += len(rec.scheduled)
            hits += len(rec.prefix_hits)
            hit_tokens += sum(len(b) for b in rec.prefix_hits.values()) * config.block_size
        seconds = time.perf_counter() - start
        writer.end()
    return Simulation(Timing(seconds, steps, entries), hits, hit_tokens,
                      sum(w.prompt_len for w in workload))


def bench_checker(trace: Path, vectorized: bool = False) -> tuple[Timing, int]:
    with trace.open("rb") as stream:
        start = time.perf_counter()
        report = (check_trace_vectorized(stream) if vectorized
                  else check_trace(TraceReader(stream)))
        seconds = time.perf_counter() - start
    return Timing(seconds, report.steps, report.scheduled_entries), report.errors()


def render_prefix(requests: int, rate: float, on: Simulation, off: Simulation,
                  spec: Timing, vec: Timing, errors: int) -> str:
    saved = on.hit_tokens / on.prompt_tokens if on.prompt_tokens else 0.0
    per_step = (on.sim.seconds / on.sim.steps) / (off.sim.seconds / off.sim.steps)
    return f"""
## Prefix caching: a prefix-heavy workload

Workload: {requests:,} requests of the `shared-prompts` generator (seed 0: four system
prompts of 512, 256, 128 and 64 tokens picked with a Zipf skew, each followed by the
request's own ShareGPT-like text), Poisson arrivals at {rate} per step; the config
above with prefix caching on, then off, side by side in one run; profile `vllm-v1`.
With caching on, {on.hits:,} admissions hit the cache and {saved:.1%} of all prompt
tokens ({on.hit_tokens:,}) were not computed.

| what | steps | scheduled entries | seconds | steps / s | scheduled entries / s |
|---|---:|---:|---:|---:|---:|
{row("reference, prefix caching on", on.sim)}
{row("reference, prefix caching off", off.sim)}
{row("spec checker, the caching trace", spec)}
{row("vectorized checker, the caching trace", vec)}

A step of the reference with caching costs {per_step:.2f} times one without (the lookup
of each admission's content keys, and the cache's bookkeeping); the caching trace has
{on.sim.steps:,} steps against {off.sim.steps:,} (arrivals pace both). The
vectorized checker hands a caching trace to the spec's checker line by line
({vec.entries_per_s / spec.entries_per_s:.2f} times the spec checker's speed; both read
with orjson, the spec checker here through `TraceReader`). The optimized scheduler on
this workload: "Prefix caching: a whole simulation, both schedulers" below. The
checkers found {errors} MUST violations in the caching trace.
"""


def row(what: str, t: Timing) -> str:
    return (f"| {what} | {t.steps:,} | {t.entries:,} | {t.seconds:.1f} | "
            f"{t.steps_per_s:,.0f} | {t.entries_per_s:,.0f} |")


def render(requests: int, rate: float, sim: Timing, chk: Timing, errors: int,
           command: str) -> str:
    return f"""# Benchmarks

Measured by `{command}` on {datetime.now(UTC):%Y-%m-%d}.
Machine: {machine()}.

## Baselines: the reference scheduler and the spec checker

Workload: {requests:,} ShareGPT-like requests (`kvsched.generators`, seed 0), Poisson
arrivals at {rate} per step. Config: block_size {BENCH_CONFIG.block_size},
{BENCH_CONFIG.num_gpu_blocks} GPU blocks, max_num_seqs {BENCH_CONFIG.max_num_seqs},
max_num_batched_tokens {BENCH_CONFIG.max_num_batched_tokens}, max_model_len
{BENCH_CONFIG.max_model_len}, chunked prefill, fcfs, recompute; profile `vllm-v1`.

| what | steps | scheduled entries | seconds | steps / s | scheduled entries / s |
|---|---:|---:|---:|---:|---:|
{row("reference scheduler (simulation loop, trace written)", sim)}
{row("spec checker (`kvsched.spec.checker`, orjson reader)", chk)}

The checker found {errors} MUST violations in the reference's trace.
These are the baselines the optimized implementation must beat.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench")
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=1.0,
                        help="mean arrivals per step (1.0 keeps ~200 requests running)")
    parser.add_argument("--prefix-requests", type=int, default=20_000,
                        help="requests of the prefix-caching workload")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the Markdown report here (default: print it)")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.prefix_requests < 1 or args.rate <= 0:
        parser.error("--requests and --rate must be positive")
    command = "make bench" if args.out else "python -m tools.bench " + " ".join(
        argv or sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "bench.jsonl"
        print(f"simulating {args.requests:,} requests with the reference ...", flush=True)
        sim = simulate("sharegpt", BENCH_CONFIG, args.requests, args.rate, trace).sim
        print(f"  {sim.steps:,} steps in {sim.seconds:.1f} s", flush=True)
        print("checking the trace with the spec checker ...", flush=True)
        chk, errors = bench_checker(trace)
        print(f"  {chk.entries:,} entries in {chk.seconds:.1f} s", flush=True)
        print(f"prefix caching: {args.prefix_requests:,} shared-prompt requests, on and "
              "off ...", flush=True)
        caching = replace(BENCH_CONFIG, prefix_caching=True)
        on = simulate(SHARED_PROMPTS, caching, args.prefix_requests, args.rate, trace)
        spec, spec_errors = bench_checker(trace)
        vec, vec_errors = bench_checker(trace, vectorized=True)
        off = simulate(SHARED_PROMPTS, BENCH_CONFIG, args.prefix_requests, args.rate, trace)
        print(f"  on {on.sim.seconds:.1f} s, off {off.sim.seconds:.1f} s", flush=True)
    text = render(args.requests, args.rate, sim, chk, errors, command)
    text += render_prefix(args.prefix_requests, args.rate, on, off, spec, vec,
                          max(spec_errors, vec_errors))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        # The sections tools.bench_optimized places (between its markers) stay as they are.
        old = args.out.read_text() if args.out.exists() else ""
        kept = old.find("<!-- bench_optimized")
        with atomic_output(args.out) as stream:
            stream.write((text + ("\n" + old[kept:] if kept >= 0 else "")).encode())
        print(f"written to {args.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
