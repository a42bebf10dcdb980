"""`make bench`: kvsched check and kvsched fuzz on Ray, 1 and 2 workers against the serial
run, side by side in one run.

    python -m tools.bench_ray --out docs/benchmarks.md    (a section of the file)
    python -m tools.bench_ray --quick                     (small sizes, printed)

One local Ray (kvsched.cluster, as `--workers` starts it) serves every run; its start
is timed apart. Each run is the command itself (`kvsched check DIR --workers N`, `kvsched
fuzz ... --workers N`, in this process), so a figure includes what the command does
around the checks: expanding the arguments, shipping each piece to a worker, merging the
reports. Rounds interleave serial, 1 and 2 workers, so that a busy machine slows them
alike; the figures are the medians of the rounds. A first run of each warms Ray's worker
processes (each imports kvsched once).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from click.testing import CliRunner

from kvsched.cli import main as kvsched_main
from kvsched.cluster import executor
from kvsched.commands.options import DEFAULT_CONFIG
from kvsched.reference import reference_scheduler
from kvsched.spec.interface import Scheduler
from kvsched.spec.model import Config
from tools.bench import machine, simulate

START = "<!-- bench_ray: start -->"
END = "<!-- bench_ray: end -->"
MODES = (("serial", ()), ("Ray, 1 worker", ("--workers", "1")),
         ("Ray, 2 workers", ("--workers", "2")))
# A smaller cache than the default's, so that a few hundred requests queue and preempt.
TRACE_CONFIG = replace(DEFAULT_CONFIG, num_gpu_blocks=512)


def reference(config: Config) -> Scheduler:
    """The fuzzed scheduler: the reference itself, which fails no example, so that every
    shard runs all its examples."""
    return reference_scheduler("vllm-v1", config)


@dataclass(frozen=True)
class Sizes:
    distinct_traces: int = 6  # simulated traces, each copied `copies` times
    copies: int = 4
    requests: int = 300  # per trace
    examples: int = 1600  # of the fuzz campaign
    shard_examples: int = 100
    rounds: int = 3


QUICK = Sizes(distinct_traces=2, copies=3, requests=100, examples=120, shard_examples=30,
              rounds=1)


def kvsched(*args: str) -> tuple[int, str]:
    handler = signal.getsignal(signal.SIGTERM)
    try:
        result = CliRunner().invoke(kvsched_main, list(args), catch_exceptions=False)
    finally:
        signal.signal(signal.SIGTERM, handler)
    return result.exit_code, result.stdout


TICKS = os.sysconf("SC_CLK_TCK")


def busy_ticks() -> int:
    """CPU time spent by every process on this machine, in clock ticks (/proc/stat)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(
        int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9])
    return user + nice + system + irq + softirq + steal


def own_ticks() -> int:
    """CPU time of this process and every process below it (the Ray it started), in
    clock ticks (/proc/PID/stat)."""
    parents: dict[int, int] = {}
    used: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        used[int(entry.name)] = int(fields[11]) + int(fields[12])  # utime + stime
    ours, me = 0, os.getpid()
    for pid, ticks in used.items():
        walk = pid
        while walk > 1 and walk != me:
            walk = parents.get(walk, 1)
        if walk == me:
            ours += ticks
    return ours


@dataclass(frozen=True)
class Timed:
    seconds: float  # the median round
    output: str
    others: float  # cores that other jobs kept busy during the rounds, on average
    used: float  # cores this run used (the driver and Ray), on average


def timed_runs(run: Callable[[tuple[str, ...]], str], rounds: int) -> dict[str, Timed]:
    """Each mode's median seconds, its output (the same in every mode), and the load
    other jobs put on the machine meanwhile."""
    times: dict[str, list[float]] = {name: [] for name, _ in MODES}
    others: dict[str, list[float]] = {name: [] for name, _ in MODES}
    used: dict[str, list[float]] = {name: [] for name, _ in MODES}
    outputs: dict[str, str] = {}
    for name, extra in MODES:  # warm-up
        outputs[name] = run(extra)
    for _ in range(rounds):
        for name, extra in MODES:
            busy, ours, start = busy_ticks(), own_ticks(), time.perf_counter()
            run(extra)
            seconds = time.perf_counter() - start
            times[name].append(seconds)
            mine = own_ticks() - ours
            others[name].append(max(0.0, (busy_ticks() - busy - mine) / TICKS / seconds))
            used[name].append(mine / TICKS / seconds)
    return {name: Timed(statistics.median(times[name]), outputs[name],
                        statistics.mean(others[name]), statistics.mean(used[name]))
            for name, _ in MODES}


def render(sizes: Sizes, command: str, start_s: float, traces: int, steps: int,
           check: dict[str, Timed], runs: int, fuzz: dict[str, Timed]) -> str:
    def rows(per_s: Callable[[float], float], unit: str, results: dict[str, Timed]) -> str:
        one = per_s(results["Ray, 1 worker"].seconds)
        return "\n".join(
            f"| {name} | {t.seconds:.2f} | {per_s(t.seconds):,.1f} {unit} | "
            f"{per_s(t.seconds) / one:.2f} | {t.used:.1f} | {t.others:.1f} |"
            for name, t in results.items())

    same_check = len({t.output for t in check.values()}) == 1
    same_fuzz = len({t.output for t in fuzz.values()}) == 1
    return f"""{START}
## Scale-out on Ray: kvsched check and kvsched fuzz, 1 and 2 workers

Measured by `{command}` (in `make bench`) on {datetime.now(UTC):%Y-%m-%d}.
Machine: {machine()}. One local Ray of 2 CPUs (started in {start_s:.1f} s, not counted
below) serves every run; `--workers N` runs N pieces at once on it. Medians of
{sizes.rounds} interleaved rounds, after one warm-up run of each.

`kvsched check DIR --format json`: {traces} traces ({sizes.distinct_traces} simulated by the
reference, {sizes.requests} ShareGPT-like requests each on a {TRACE_CONFIG.num_gpu_blocks}-block
cache, each copied {sizes.copies} times), {steps:,} steps in all.

| run | seconds | traces / s | against 1 worker | cores used | other jobs (cores) |
|---|---:|---:|---:|---:|---:|
{rows(lambda s: traces / s, "traces/s", check)}

`kvsched fuzz tools.bench_ray:reference --examples {sizes.examples} --shard-examples
{sizes.shard_examples} --format json` ({sizes.examples // sizes.shard_examples} shards; the
reference fails no example, so each shard runs all of its {sizes.shard_examples}):
{runs} cases.

| run | seconds | fuzz cases / s | against 1 worker | cores used | other jobs (cores) |
|---|---:|---:|---:|---:|---:|
{rows(lambda s: runs / s, "cases/s", fuzz)}

The reports of the three runs are {"the same, byte for byte" if same_check and same_fuzz
else "NOT the same: a defect"}. "cores used" is the CPU time of this benchmark and its
Ray (driver, raylet, workers) over the run's wall time; "other jobs" is that of every
other process on the machine meanwhile (/proc/stat): the machine's 2 cores are shared
with other jobs, and a second worker can only be faster by the share of a core they
leave it. A piece (a trace, a shard) is one
Ray task: a worker does what a core does, less what a task costs Ray (shipping the
piece and its report, a few milliseconds) and what the driver does between pieces.
{END}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_ray")
    parser.add_argument("--out", type=Path, default=None,
                        help="put the section in this Markdown file (default: print it)")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    command = "python -m tools.bench_ray" + (" --quick" if args.quick else "")
    with tempfile.TemporaryDirectory() as tmp:
        traces = Path(tmp) / "traces"
        traces.mkdir()
        steps = 0
        print(f"simulating {sizes.distinct_traces} traces of {sizes.requests} requests ...",
              flush=True)
        for i in range(sizes.distinct_traces):
            first = traces / f"t{i}-0.jsonl"
            sim = simulate("sharegpt", TRACE_CONFIG, sizes.requests, 0.5, first,
                           seed=i)
            for copy in range(1, sizes.copies):
                shutil.copyfile(first, traces / f"t{i}-{copy}.jsonl")
            steps += sim.sim.steps * sizes.copies
        count = sizes.distinct_traces * sizes.copies
        started = time.perf_counter()
        with executor(use_ray=True, workers=2, address=None):
            start_s = time.perf_counter() - started

            def check(extra: tuple[str, ...]) -> str:
                code, out = kvsched("check", str(traces), "--format", "json",
                                    "--no-progress", *extra)
                assert code == 0, out
                return out

            def fuzz(extra: tuple[str, ...]) -> str:
                code, out = kvsched("fuzz", "tools.bench_ray:reference", "--examples",
                                    str(sizes.examples), "--shard-examples",
                                    str(sizes.shard_examples), "--format", "json",
                                    "--no-progress", "--out", str(Path(tmp) / "min.jsonl"),
                                    *extra)
                assert code == 0, out
                return out

            print(f"checking {count} traces, serial and on Ray ...", flush=True)
            checked = timed_runs(check, sizes.rounds)
            print(f"fuzzing {sizes.examples} examples, serial and on Ray ...", flush=True)
            fuzzed = timed_runs(fuzz, sizes.rounds)
    runs = json.loads(fuzzed["serial"].output)["runs"]
    for name, t in checked.items():
        print(f"  check, {name}: {count / t.seconds:.1f} traces/s ({t.used:.1f} cores, "
              f"other jobs {t.others:.1f})", flush=True)
    for name, t in fuzzed.items():
        print(f"  fuzz, {name}: {runs / t.seconds:.1f} cases/s ({t.used:.1f} cores, "
              f"other jobs {t.others:.1f})", flush=True)
    text = render(sizes, command, start_s, count, steps, checked, runs, fuzzed)
    from tools.bench_optimized import publish

    publish(text, args.out, START, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
