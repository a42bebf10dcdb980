"""The commands a user runs on the trace a user has, side by side in one run: the default
`kvsched simulate --requests N` trace (vLLM v1's rules, prefix caching on, as vLLM
serves), checked, checked against a profile and measured, by the fast path and by the
spec's Python path.

    python -m tools.bench_users --requests 200000 --out docs/benchmarks.md
    python -m tools.bench_users --requests 5000              (printed only)

    python -m tools.bench_users --requests 10000 --before /tmp/old    (metrics and diff
                                          against the kvsched of that checkout, built)
    python -m tools.bench_users --simulate --requests 200000 --before /tmp/old
                                         (only `kvsched simulate --out`, this kvsched
                                          against that one, the traces compared)
    python -m tools.bench_users --sglang --before /tmp/old
                                         (`check --profile sglang@0.5.23` at about 5k,
                                          20k and 80k steps, the time per step,
                                          against that kvsched too)
    python -m tools.bench_users --floors --requests 200000
                                         (the fast paths against the floors: reading
                                          the file, parsing its lines with simdjson and
                                          with orjson)

Each figure is a whole `kvsched` process, timed by the wall clock, with its peak
resident memory from the kernel (`wait4`'s ru_maxrss). `check` and `check --profile`
compare the spec's checker with the fast one; `metrics` and `diff` compare the kvsched
of `--before` (a checkout of an earlier version, its compiled modules built in place)
with this one, or without it `metrics` on the spec's state in this one (what
`kvsched metrics` computed before its fast path). The pairs run one after the other on
the same file, so a ratio compares the same work on the same machine in the same
minutes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import orjson

from tools.bench import machine, place

START = "<!-- bench_users: start -->"
END = "<!-- bench_users: end -->"
SIM_START = "<!-- bench_users_simulate: start -->"
SIM_END = "<!-- bench_users_simulate: end -->"
SGLANG_START = "<!-- bench_users_sglang: start -->"
SGLANG_END = "<!-- bench_users_sglang: end -->"
SGLANG = "sglang@0.5.23"
# Requests of SGLang's default workload for about 5k, 20k and 80k steps.
SGLANG_SIZES = (600, 2600, 11000)
FLOORS_START = "<!-- bench_users_floors: start -->"
FLOORS_END = "<!-- bench_users_floors: end -->"
# Parse-only loops over a trace's lines, one process each: the floors of reading it.
PARSE_LOOPS = {
    "simdjson": "import sys, simdjson\np = simdjson.Parser()\n"
                "with open(sys.argv[1], 'rb') as f:\n"
                "    for line in f:\n        doc = p.parse(line)\n        del doc\n",
    "orjson": "import sys, orjson\nwith open(sys.argv[1], 'rb') as f:\n"
              "    for line in f:\n        orjson.loads(line)\n",
}
KVSCHED = [sys.executable, "-m", "kvsched"]
TIME = "/usr/bin/time"  # GNU time: the peak resident set of the command alone
SPEC_METRICS = ("import sys; from kvsched.inputs import open_trace; "
                "from kvsched.spec.trace import TraceReader; "
                "from kvsched.metrics import metrics_of_trace; "
                "f = open_trace(sys.argv[1]); "
                "print(metrics_of_trace(TraceReader(f)).steps)")


@dataclass(frozen=True)
class Timed:
    seconds: float
    peak_mb: float
    code: int


def timed(argv: list[str]) -> Timed:
    """Run `argv` (output discarded); its wall time, peak memory and exit code. The
    peak is measured by /usr/bin/time around it: a child forked from this process
    would count this process's own memory in its peak (Linux keeps the largest
    resident set across fork and exec)."""
    with tempfile.NamedTemporaryFile("r") as peak:
        start = time.perf_counter()
        done = subprocess.run([TIME, "-f", "%M", "-o", peak.name, *argv],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
        seconds = time.perf_counter() - start
        kb = int(peak.read().strip().splitlines()[-1] or 0)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: "
                         f"{done.stderr.decode().strip()[-400:]}")
    return Timed(seconds, kb / 1024, done.returncode)


def cli_of(before: Path) -> list[str]:
    """The command line that runs the kvsched of the checkout `before`."""
    return [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); "
            "from kvsched.cli import main; main()", str(before / "src")]


def pairs(trace: Path, requests: int, before: Path | None, spec_profile: bool
          ) -> list[tuple[str, list[str] | None, list[str]]]:
    """(what, the slow or earlier path, the fast path) for each command; without
    `spec_profile` the slow path of `check --profile` is None (the spec's plain check
    stands for it)."""
    t = str(trace)
    old = cli_of(before) if before else []
    steps = str(max(100_000, 10 * requests))
    diff = ["diff", "vllm-v1", "sarathi", "--requests", str(requests), "--max-steps", steps]
    return [
        ("`kvsched check`", [*KVSCHED, "check", "--checker", "spec", t],
         [*KVSCHED, "check", "--checker", "vectorized", t]),
        ("`kvsched check --profile vllm-v1`",
         [*KVSCHED, "check", "--checker", "spec", "--profile", "vllm-v1", t]
         if spec_profile else None,
         [*KVSCHED, "check", "--checker", "vectorized", "--profile", "vllm-v1", t]),
        ("`kvsched metrics`",
         [*old, "metrics", t] if before else [sys.executable, "-c", SPEC_METRICS, t],
         [*KVSCHED, "metrics", t]),
        *([(f"`kvsched {' '.join(diff[:3])}` on the same workload", [*old, *diff],
            [*KVSCHED, *diff])] if before else []),
    ]


def report(requests: int, command: str, keep: Path | None, before: Path | None,
           spec_profile: bool = True) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        trace = keep or Path(tmp) / "trace.jsonl"
        if keep is None or not keep.exists():
            print(f"simulating {requests:,} requests ...", flush=True)
            sim = timed([*KVSCHED, "simulate", "--requests", str(requests), "--out",
                         str(trace)])
            print(f"  {sim.seconds:.1f} s", flush=True)
        size = trace.stat().st_size
        with trace.open("rb") as f:
            steps = sum(1 for _ in f) - 2
        rows = []
        plain: Timed | None = None  # the spec's plain check
        for what, slow_argv, fast_argv in pairs(trace, requests, before, spec_profile):
            if slow_argv is None:
                assert plain is not None
                slow, what = plain, what + " (slow path: the spec's plain `check`)"
            else:
                print(f"{what}: the slow path ...", flush=True)
                slow = timed(slow_argv)
                plain = plain or slow
            print(f"  {slow.seconds:.1f} s, {slow.peak_mb:.0f} MB; the fast path ...",
                  flush=True)
            fast = timed(fast_argv)
            print(f"  {fast.seconds:.2f} s, {fast.peak_mb:.0f} MB", flush=True)
            rows.append(f"| {what} | {slow.seconds:,.1f} | {fast.seconds:,.2f} | "
                        f"{slow.seconds / fast.seconds:,.1f}x | {slow.peak_mb:,.0f} | "
                        f"{fast.peak_mb:,.0f} | {fast.peak_mb / slow.peak_mb:.2f} |")
    return section(
        START, "## The traces users have: the default trace, prefix caching on",
        command, [
        f"The trace: `kvsched simulate --requests "
        f"{requests}` (the defaults: profile vllm-v1, prefix caching on, as vLLM serves), "
        f"{size / 1e6:,.0f} MB, {steps:,} steps. Each figure is one whole process, the "
        "slow path and the fast path one after the other on the same file; memory is "
        "the process's peak resident set. The slow path of `check` is `--checker spec`"
        + ("" if spec_profile else
           " (of `check --profile` too: the spec's replay of the profile was not run, "
           "hours at this size, and is slower still: the ratio against it is larger)")
        + "; "
        + (f"of `metrics` and `diff`, the kvsched of the checkout `{before.name}` "
           f"(commit {commit_of(before)})." if before else
           "of `metrics`, the metrics on the spec's state."),
        "",
        "| command | slow path (s) | fast path (s) | speed-up | slow peak (MB) | "
        "fast peak (MB) | memory ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
    ])


def simulate_report(requests: int, command: str, before: Path, rounds: int) -> str:
    """`kvsched simulate --requests N --out T` by the kvsched of `before` and by this
    one, in turn, `rounds` times; the traces must be the same bytes."""
    earlier, now_ = [], []
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / "before.jsonl", Path(tmp) / "now.jsonl"
        for r in range(rounds):
            print(f"round {r + 1}: before ...", flush=True)
            earlier.append(timed([*cli_of(before), "simulate", "--requests", str(requests),
                                  "--out", str(a)]))
            print(f"  {earlier[-1].seconds:.2f} s; now ...", flush=True)
            now_.append(timed([*KVSCHED, "simulate", "--requests", str(requests),
                               "--out", str(b)]))
            print(f"  {now_[-1].seconds:.2f} s", flush=True)
            if a.read_bytes() != b.read_bytes():
                raise SystemExit("the two kvsched simulate runs wrote different traces")
        size = b.stat().st_size
        with b.open("rb") as f:
            steps = sum(1 for _ in f) - 2

    def median(xs: list[float]) -> float:
        xs = sorted(xs)
        return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2

    slow = median([t.seconds for t in earlier])
    fast = median([t.seconds for t in now_])
    slow_mb = max(t.peak_mb for t in earlier)
    fast_mb = max(t.peak_mb for t in now_)
    return section(
        SIM_START, "### `kvsched simulate`: the metrics from the scheduler's own facts",
        command, [
        f"`kvsched simulate --requests {requests} "
        f"--out T` (the defaults: profile vllm-v1, prefix caching on), {steps:,} steps, a "
        f"{size / 1e6:,.0f} MB trace, by the kvsched of the checkout `{before.name}` "
        f"(commit {commit_of(before)}: its metrics read back the trace lines it wrote, "
        "through the fast checker's compiled state) and by this one (the compiled "
        "scheduler hands the metrics the facts of its own decisions), in turn, "
        f"{rounds} rounds; medians, and the peak resident set. Both wrote the same "
        "trace, byte for byte, every round.",
        "",
        "| command | before (s) | now (s) | speed-up | before peak (MB) | now peak (MB) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        f"| `kvsched simulate --requests {requests} --out T` | {slow:,.2f} | {fast:,.2f} | "
        f"{slow / fast:,.2f}x | {slow_mb:,.0f} | {fast_mb:,.0f} |",
    ])


def floors_report(requests: int, command: str, keep: Path | None, rounds: int) -> str:
    """`check`, `check --profile vllm-v1`, `metrics` and `simulate --out` of the
    default trace beside its floors, all in turn, `rounds` times (medians): `cat`, and
    a parse-only loop over its lines with simdjson (pysimdjson: what a compiled line
    reader could reach) and with orjson (what the fast paths read with today)."""
    with tempfile.TemporaryDirectory() as tmp:
        trace = keep or Path(tmp) / "trace.jsonl"
        if keep is None or not keep.exists():
            print(f"simulating {requests:,} requests ...", flush=True)
            timed([*KVSCHED, "simulate", "--requests", str(requests), "--out", str(trace)])
        size = trace.stat().st_size
        with trace.open("rb") as f:
            steps = sum(1 for _ in f) - 2
        t = str(trace)
        rows: list[tuple[str, list[str]]] = [
            ("`cat` (to /dev/null)", ["cat", t]),
            ("parse-only loop, simdjson (pysimdjson)",
             [sys.executable, "-c", PARSE_LOOPS["simdjson"], t]),
            ("parse-only loop, orjson", [sys.executable, "-c", PARSE_LOOPS["orjson"], t]),
            ("`kvsched check`", [*KVSCHED, "check", t]),
            ("`kvsched check --profile vllm-v1`", [*KVSCHED, "check", "--profile",
                                                   "vllm-v1", t]),
            ("`kvsched metrics`", [*KVSCHED, "metrics", t]),
            (f"`kvsched simulate --requests {requests} --out T`",
             [*KVSCHED, "simulate", "--requests", str(requests), "--out",
              str(Path(tmp) / "again.jsonl")]),
        ]
        runs: dict[str, list[Timed]] = {what: [] for what, _ in rows}
        for r in range(rounds):
            for what, argv in rows:
                print(f"round {r + 1}: {what} ...", flush=True)
                runs[what].append(timed(argv))
                print(f"  {runs[what][-1].seconds:.2f} s", flush=True)

    def median(what: str) -> float:
        xs = sorted(x.seconds for x in runs[what])
        return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2

    sec = {what: median(what) for what, _ in rows}
    peak = {what: max(x.peak_mb for x in runs[what]) for what, _ in rows}
    simd, orj = sec[rows[1][0]], sec[rows[2][0]]
    check, profile, metrics = sec[rows[3][0]], sec[rows[4][0]], sec[rows[5][0]]
    lines = [f"| {what} | {sec[what]:,.2f} | {size / 1e6 / sec[what]:,.0f} | "
             f"{sec[what] / simd:,.2f} | {sec[what] / orj:,.2f} | {peak[what]:,.0f} |"
             for what, _ in rows]
    return section(
        FLOORS_START, "### The fast paths against the floors of reading the trace",
        command, [
        f"The trace: `kvsched simulate --requests "
        f"{requests}` (the defaults: profile vllm-v1, prefix caching on), "
        f"{size / 1e6:,.0f} MB, {steps:,} steps. Each figure is one whole process "
        f"(Python's start included), all in turn, {rounds} rounds; medians, and the "
        "peak resident set. The floors: `cat`, and a loop that only parses each line, "
        "with simdjson (pysimdjson's parser, no Python object made: where a compiled "
        "line reader could be) and with orjson (a Python object per value: what the "
        "fast paths read with today).",
        "",
        "| command | seconds | MB/s | / simdjson loop | / orjson loop | peak (MB) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        *lines,
        "",
        f"`check --profile vllm-v1` takes {profile / check:.2f} times `check` and "
        f"`metrics` {metrics / check:.2f} times; `check` {check / orj:.2f} times the "
        f"orjson loop and {check / simd:.2f} times the simdjson one.",
    ])


def sglang_report(command: str, before: Path | None) -> str:
    """`kvsched check --profile sglang@0.5.23` (and the plain check) of SGLang's own
    simulated traces at three sizes: seconds and microseconds per step; with `before`,
    the earlier kvsched's `check --profile` on each, in turn."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for requests in SGLANG_SIZES:
            trace = Path(tmp) / f"sglang-{requests}.jsonl"
            print(f"simulating {requests:,} requests with {SGLANG} ...", flush=True)
            timed([*KVSCHED, "simulate", "--profile", SGLANG, "--requests", str(requests),
                   "--out", str(trace)])
            with trace.open("rb") as f:
                steps = sum(1 for _ in f) - 2
            t = str(trace)
            plain = timed([*KVSCHED, "check", t])
            now = timed([*KVSCHED, "check", "--profile", SGLANG, t])
            old = timed([*cli_of(before), "check", "--profile", SGLANG, t]) \
                if before is not None else None
            queue = orjson.loads(subprocess.run(
                [*KVSCHED, "metrics", "--format", "json", t], capture_output=True,
                check=True).stdout)["queue"]["waiting"]["mean"]
            print(f"  {steps:,} steps: check {plain.seconds:.2f} s, --profile "
                  f"{now.seconds:.2f} s" + (f", before {old.seconds:.2f} s" if old else ""),
                  flush=True)
            rows.append(
                f"| {requests:,} | {steps:,} | {queue:,.0f} | {plain.seconds:,.2f} | "
                f"{now.seconds:,.2f} | "
                f"{1e6 * now.seconds / steps:,.0f} | "
                + (f"{old.seconds:,.2f} | {1e6 * old.seconds / steps:,.0f} | "
                   f"{old.seconds / now.seconds:,.1f}x |" if old else "not run | | |"))
    return section(
        SGLANG_START, "### `check --profile sglang@0.5.23`: linear in steps",
        command, [
        f"Each trace: `kvsched simulate --profile "
        f"{SGLANG} --requests N` (SGLang's rules, radix cache on, its keys given). Each "
        "figure is one whole process; µs/step is the whole process's time over the "
        "steps. SGLang's profile replays through the spec's ProfileReplay with the "
        "reference's SGLang scheduler, beside the fast checker"
        + (f"; before: the kvsched of the checkout `{before.name}` (commit "
           f"{commit_of(before)}), in turn on the same trace." if before else "."),
        "",
        "| requests | steps | waiting (mean) | `check` (s) | `check --profile` (s) | "
        "µs/step | before (s) | before µs/step | speed-up |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        "",
        "The default workload outruns the engine, so the more requests, the longer the "
        "waiting queue, which SGLang's step looks through (the policy's order, the "
        "radix cache's matches, the queue rebuilt without those admitted): the time "
        "per step grows with the queue, not with the steps gone by.",
    ])


def section(start: str, heading: str, command: str, body: list[str]) -> str:
    """A section of benchmarks.md between its markers (`start` and its end): its
    heading, then `command`, when and where it ran before the first of `body`'s
    paragraphs and tables (lines)."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([start, heading, "",
                      f"`{command}`, {stamp}, on {machine()}. " + body[0], *body[1:],
                      start.replace(": start -->", ": end -->"), ""])


def emit(text: str, out: Path | None, start: str, end: str) -> int:
    """The section `text` into `out` between `start` and `end`, or printed."""
    if out:
        place(text, out, start, end)
        print(f"written to {out}")
    else:
        print(text)
    return 0


def commit_of(checkout: Path) -> str:
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_users")
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--trace", type=Path, default=None,
                        help="keep the trace here (reused if it exists)")
    parser.add_argument("--out", type=Path, default=None,
                        help="put the section in this Markdown file (default: print only)")
    parser.add_argument("--no-spec-profile", action="store_true",
                        help="do not run the spec's `check --profile` (hours on a large "
                             "trace): the spec's plain check stands for it")
    parser.add_argument("--before", type=Path, default=None,
                        help="a checkout of an earlier kvsched (compiled modules built in "
                             "place) to time metrics and diff against")
    parser.add_argument("--simulate", action="store_true",
                        help="only `kvsched simulate --out`, against --before's")
    parser.add_argument("--sglang", action="store_true",
                        help="only check --profile sglang@0.5.23 at three sizes")
    parser.add_argument("--floors", action="store_true",
                        help="only the fast paths against the floors of reading the trace")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of --simulate and --floors (medians)")
    args = parser.parse_args(argv)
    if args.sglang:
        command = "python -m tools.bench_users --sglang" + (
            f" --before {args.before}" if args.before else "")
        text = sglang_report(command, args.before)
        return emit(text, args.out, SGLANG_START, SGLANG_END)
    if args.floors:
        command = (f"python -m tools.bench_users --floors --requests {args.requests} "
                   f"--rounds {args.rounds}")
        text = floors_report(args.requests, command, args.trace, args.rounds)
        return emit(text, args.out, FLOORS_START, FLOORS_END)
    if args.simulate:
        if args.before is None:
            parser.error("--simulate needs --before")
        command = (f"python -m tools.bench_users --simulate --requests {args.requests} "
                   f"--before {args.before} --rounds {args.rounds}")
        text = simulate_report(args.requests, command, args.before, args.rounds)
        return emit(text, args.out, SIM_START, SIM_END)
    command = f"python -m tools.bench_users --requests {args.requests}" + (
        f" --before {args.before}" if args.before else "") + (
        " --no-spec-profile" if args.no_spec_profile else "")
    text = report(args.requests, command, args.trace, args.before,
                  not args.no_spec_profile)
    return emit(text, args.out, START, END)


if __name__ == "__main__":
    sys.exit(main())
