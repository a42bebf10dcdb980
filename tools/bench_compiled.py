"""The compiled scheduler end to end: whole `kvsched simulate` processes, and the lockstep
differential machine's throughput, against the reference and the torch scheduler, side
by side in one run.

    python -m tools.bench_compiled --out docs/benchmarks.md    (a section of the file)
    python -m tools.bench_compiled --quick                     (small sizes, printed)

A whole process is the command a user types, imports included: `kvsched simulate`
(which takes the compiled scheduler by default) against `kvsched simulate --scheduler
reference`, the two run in turn, round after round, so that a busy machine slows them
alike; wall time and the CPU time the process used, medians of the rounds. The traces
of the two must be equal step for step.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tools.bench import BENCH_CONFIG, machine
from tools.bench_optimized import ROOT, Section, publish

START = "<!-- bench_compiled: start -->"
END = "<!-- bench_compiled: end -->"
KVSCHED = [str(Path(sys.executable).with_name("kvsched"))]  # the installed script


@dataclass
class Workload:
    name: str
    args: list[str]
    rounds: int


def workloads(quick: bool) -> list[Workload]:
    engine = ["--num-gpu-blocks", str(BENCH_CONFIG.num_gpu_blocks), "--max-num-seqs",
              str(BENCH_CONFIG.max_num_seqs), "--max-num-batched-tokens",
              str(BENCH_CONFIG.max_num_batched_tokens), "--max-model-len",
              str(BENCH_CONFIG.max_model_len), "--rate", "1.0"]
    big = 5_000 if quick else 100_000
    return [Workload("the default workload (`kvsched simulate`: 400 ShareGPT-like requests)",
                     [], 3 if quick else 7),
            Workload(f"{big:,} ShareGPT-like requests on the baseline engine",
                     ["--requests", str(big), *engine], 1)]


@dataclass
class Process:
    wall: list[float]
    cpu: list[float]


# As a user's Python runs: modules load from their bytecode caches (written by the first,
# untimed, run of each command), whatever this process's environment says.
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed_run(args: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False,
                          env=CHILD_ENV)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed: {done.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def bench_processes(out: Section, quick: bool, tmp: Path) -> None:
    out.add("", "### Whole `kvsched simulate` processes", "",
            "`kvsched simulate --out T` (the compiled scheduler, chosen by default) against "
            "`kvsched simulate --scheduler reference --out T`, each a new process "
            "(Python's start, imports, the workload's generation, the run, the metrics "
            "table, the trace written), in turn; medians of the rounds. Both compute "
            "the same metrics and write the same trace, step for step: the reference's "
            "metrics follow the spec's state through each step, the compiled scheduler's "
            "are read off its own trace lines by the compiled state "
            "(kvsched.optimized.state.FastState, as `kvsched metrics` reads a trace). "
            "Modules load from their bytecode caches, as an installed package's do (a "
            "first, untimed round of the small workload writes them). The command is the "
            "installed `kvsched` script.", "",
            "| workload | rounds | steps | reference, s (CPU s) | compiled, s (CPU s) | "
            "ratio (CPU) | same steps |",
            "|---|---:|---:|---:|---:|---:|---|")
    for w in workloads(quick):
        times = {"reference": Process([], []), "compiled": Process([], [])}
        traces = {name: tmp / f"{name}.jsonl" for name in times}
        warm = w is workloads(quick)[0] and w.rounds > 1
        for k in range(w.rounds + warm):
            for name, p in times.items():
                choice = ["--scheduler", "reference"] if name == "reference" else []
                wall, cpu = timed_run([*KVSCHED, "simulate", *w.args, *choice, "--out",
                                       str(traces[name])])
                if warm and k == 0:
                    continue  # the untimed first round: bytecode caches written
                p.wall.append(wall)
                p.cpu.append(cpu)
        ref, comp = traces["reference"].read_bytes(), traces["compiled"].read_bytes()
        same = ref.split(b"\n", 1)[1] == comp.split(b"\n", 1)[1]
        steps = ref.count(b'{"step"')
        med = {name: (statistics.median(p.wall), statistics.median(p.cpu))
               for name, p in times.items()}
        (rw, rc), (cw, cc) = med["reference"], med["compiled"]
        out.add(f"| {w.name} | {w.rounds} | {steps:,} | {rw:,.2f} ({rc:,.2f}) | "
                f"{cw:,.3f} ({cc:,.3f}) | **{rw / cw:,.1f}** ({rc / cc:,.1f}) | "
                f"{'yes' if same else 'NO'} |")
        for path in traces.values():
            path.unlink()


def lockstep_machine() -> Any:
    """tests/test_differential.py's machine (the tests are not a package)."""
    path = ROOT / "tests" / "test_differential.py"
    spec = importlib.util.spec_from_file_location("kvsched_lockstep", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_lockstep(out: Section, quick: bool) -> None:
    from hypothesis import HealthCheck, settings
    from hypothesis.stateful import run_state_machine_as_test

    module = lockstep_machine()
    programs = 20 if quick else 200
    steps = module.STEPS
    out.add("", "### The lockstep differential machine", "",
            f"tests/test_differential.py's machine (the reference in lockstep with a fast "
            f"scheduler, decisions and state compared after every rule) on the same "
            f"{programs} drawn programs of up to {steps} rules each (derandomized: both "
            "draw the same ones), against the compiled scheduler and against the torch one "
            "on the CPU; the reference's own share of the time is in both.", "",
            "| against | programs | seconds | programs / s |", "|---|---:|---:|---:|")
    rates = {}
    for implementation in ("compiled", "optimized"):
        machine_class = type("Against", (module.LockstepMachine,),
                             {"implementation": implementation})
        chosen = settings(max_examples=programs, stateful_step_count=steps,
                          derandomize=True, database=None, deadline=None,
                          suppress_health_check=list(HealthCheck))
        start = time.perf_counter()
        run_state_machine_as_test(machine_class, settings=chosen)
        seconds = time.perf_counter() - start
        rates[implementation] = programs / seconds
        out.add(f"| {implementation} | {programs} | {seconds:,.1f} | "
                f"{rates[implementation]:,.2f} |")
    ratio = rates["compiled"] / rates["optimized"]
    out.add("", f"The compiled scheduler's programs run {ratio:.1f} "
                "times as fast as the torch scheduler's.")


def report(quick: bool, command: str) -> str:
    out = Section()
    out.add(START, "## The compiled scheduler end to end", "",
            f"Measured by `{command}` on {datetime.now(UTC):%Y-%m-%d}.",
            f"Machine: {machine()}.")
    with tempfile.TemporaryDirectory() as tmp:
        bench_processes(out, quick, Path(tmp))
    bench_lockstep(out, quick)
    out.add(END)
    return "\n".join(out.lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_compiled")
    parser.add_argument("--out", type=Path, default=None,
                        help="put the section in this Markdown file (default: print only)")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = parser.parse_args(argv)
    command = "python -m tools.bench_compiled" + (" --quick" if args.quick else "")
    text = report(args.quick, command)
    publish(text, args.out, START, END)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
