"""Benchmarks of the optimized scheduler and the vectorized checker against the
reference scheduler, vLLM's own scheduler and the spec checker, side by side in one run.

    python -m tools.bench_optimized --out docs/benchmarks.md    (a section of the file)
    python -m tools.bench_optimized --quick                     (small sizes, printed)
    python -m tools.bench_optimized --gpu-check --out docs/benchmarks.md

Every figure of a table is measured in the same run; ratios compare runs of the same
work. Step times interleave the schedulers (a few steps of each in turn, median of the
rounds), so that a busy machine slows them alike. The CPU figures use one torch thread
(torch.set_num_threads(1)): per-step tensors are small, and on a shared two-core
machine intra-op threads mostly wait on each other.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import torch

from kvsched.adapters import vllm_driver
from kvsched.conformance import profile_replay
from kvsched.generators import SHARED_PROMPTS, generate
from kvsched.optimized import TorchScheduler
from kvsched.optimized.checker import check_trace_vectorized
from kvsched.optimized.compiled import CompiledScheduler
from kvsched.optimized.simulation import Arrivals, run_fast, step_dict
from kvsched.reference import ReferenceScheduler
from kvsched.simulate import run
from kvsched.spec.checker import Report, check_trace
from kvsched.spec.model import Config, Policy, Request
from kvsched.spec.profiles import get_profile
from kvsched.spec.trace import TraceReader, TraceWriter
from kvsched.spec.trace import step_dict as reference_step_dict
from kvsched.workload import WorkItem
from tools.bench import BENCH_CONFIG, machine, place

START = "<!-- bench_optimized: start -->"
END = "<!-- bench_optimized: end -->"
GPU_START = "<!-- bench_optimized gpu: start -->"  # written by --gpu-check, on a GPU machine
GPU_END = "<!-- bench_optimized gpu: end -->"
FULL_START = "<!-- bench_optimized full simulation: start -->"  # --full-simulation (long)
FULL_END = "<!-- bench_optimized full simulation: end -->"
PREFIX_START = "<!-- bench_optimized prefix caching: start -->"  # --prefix-caching
PREFIX_END = "<!-- bench_optimized prefix caching: end -->"
KNOBS = get_profile("vllm-v1").knobs
ROOT = Path(__file__).resolve().parent.parent  # the checkout: tools/ sits at its top


@dataclass
class Sizes:
    """How big each benchmark is (the defaults are the full sizes; --quick shrinks them)."""

    running: tuple[int, ...] = (256, 4096, 65536)
    waiting: tuple[int, ...] = (1_000, 100_000, 1_000_000)
    sim_requests: int = 1_000_000
    sim_prefix: int = 100_000
    sim_rate: float = 75.0
    prefix_requests: int = 20_000  # the prefix-caching simulation (shared prompts)
    small_trace_requests: int = 20_000
    vllm_running: tuple[int, ...] = (256, 4096)
    memory_running: int = 4096
    memory_waiting: int = 1_000_000


QUICK = Sizes(running=(256, 2048), waiting=(1_000, 20_000), sim_requests=20_000,
              sim_prefix=5_000, sim_rate=20.0, prefix_requests=2_000,
              small_trace_requests=2_000,
              vllm_running=(256,), memory_running=512, memory_waiting=20_000)


@dataclass
class Section:
    lines: list[str] = field(default_factory=list)

    def add(self, *text: str) -> None:
        self.lines.extend(text)
        print("\n".join(text), flush=True)


def timed(what: Callable[[], object]) -> float:
    start = time.perf_counter()
    what()
    return time.perf_counter() - start


@contextmanager
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# -- step time -----------------------------------------------------------------------

def step_config(running: int, policy: Policy = "fcfs") -> Config:
    """A cache that never runs out: steps differ only by what runs and what waits."""
    return Config(block_size=16, num_gpu_blocks=40 * running + 1024,
                  max_num_batched_tokens=2 * running, max_num_seqs=running,
                  max_model_len=2048, chunked_prefill=True, policy=policy)


def request(rid: str, i: int, arrival: int) -> Request:
    """Prompts of 16-63 tokens, max_tokens 30-229: a steady stream of finishes."""
    return Request(rid, 16 + i % 48, 30 + (i * 7919) % 200, i % 3, arrival)


def decoding(rid: str, i: int, arrival: int) -> Request:
    """A request that decodes for a thousand steps: no finishes while it is measured."""
    return Request(rid, 16 + i % 48, 1000, i % 3, arrival)


class Refill:
    """New arrivals, one for each request that finished: the queue keeps its length, so
    every step admits about as many requests as finish, at any queue length."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.made = 0
        self.step = 1

    def __call__(self, finished: int) -> None:
        for _ in range(finished):
            self.scheduler.add_request(request(f"a{self.made}", self.made, self.step))
            self.made += 1
        self.step += 1


class Stepper:
    """One scheduler and how one of its steps is taken."""

    def __init__(self, name: str, scheduler: Any, step: Callable[[], object]) -> None:
        self.name = name
        self.scheduler = scheduler
        self.step = step
        self.rounds: list[float] = []

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()


def steppers(config: Config, device: str = "cpu") -> list[Stepper]:
    """The reference, the compiled scheduler (its fast path: the decision left as
    numbers) and the torch scheduler stepped two ways (the fast path and the exact
    interface). A step includes the arrivals that replace its finished requests."""
    ref = ReferenceScheduler(config, KNOBS)
    comp = CompiledScheduler(config, KNOBS)
    opt = TorchScheduler(config, KNOBS, device=device)
    ref_refill, comp_refill, opt_refill = Refill(ref), Refill(comp), Refill(opt)

    def ref_step() -> None:
        ref.schedule()
        ref_refill(len(ref.update(())))

    def compiled_step() -> None:
        comp.step_counts()
        comp_refill(comp.finish_step())

    def fast_step() -> None:
        opt.schedule_tensors()
        opt_refill(len(opt.forget(opt.update_tensors())))

    def interface_step() -> None:
        opt.schedule()
        opt_refill(len(opt.update(())))

    return [Stepper("reference", ref, ref_step), Stepper("compiled", comp, compiled_step),
            Stepper("optimized", opt, fast_step),
            Stepper("optimized (schedule)", opt, interface_step)]


def fill(scheduler: Any, waiting_from: int, waiting_to: int, arrival: int) -> None:
    for i in range(waiting_from, waiting_to):
        scheduler.add_request(request(f"w{i}", i, arrival))


def start_running(scheduler: Any, running: int,
                  make: Callable[[str, int, int], Request] = request) -> int:
    """Add `running` requests (made by `make`) and step until all of them run; returns
    the steps taken."""
    for i in range(running):
        scheduler.add_request(make(f"r{i}", i, 0))
    steps = 0
    while True:
        if isinstance(scheduler, TorchScheduler):
            t = scheduler.schedule_tensors()
            scheduler.forget(scheduler.update_tensors())
            tokens = int(t.tokens.sum())
        else:
            d = scheduler.schedule()
            scheduler.update(())
            tokens = d.num_scheduled_tokens
        steps += 1
        if tokens == running:
            return steps


@dataclass
class StepRow:
    running: int
    waiting: int
    policy: str
    seconds: dict[str, float]  # per step, median of the rounds

    def cells(self) -> str:
        ref = self.seconds["reference"]
        comp = self.seconds["compiled"]
        fast = self.seconds["optimized"]
        api = self.seconds["optimized (schedule)"]
        return (f"| {self.running:,} | {self.waiting:,} | {self.policy} | {ref * 1e6:,.0f} | "
                f"{ref * 1e9 / self.running:,.0f} | {comp * 1e6:,.1f} | "
                f"{comp * 1e9 / self.running:,.0f} | **{ref / comp:,.1f}** | "
                f"{fast * 1e6:,.0f} | {ref / fast:,.1f} | {api * 1e6:,.0f} | "
                f"{ref / api:,.1f} |")


def rounds_for(running: int) -> tuple[int, int]:
    """(steps per round, rounds): about the same work at every size."""
    if running >= 32768:
        return 2, 8
    if running >= 2048:
        return 5, 15
    return 20, 15


def bench_steps(sizes: Sizes, out: Section) -> list[StepRow]:
    """For each size of the running set, one pair of schedulers per queue length, all
    stepped in turn in every round: load that comes and goes hits them alike."""
    rows: list[StepRow] = []
    cases: list[tuple[int, Policy]] = [(r, "fcfs") for r in sizes.running]
    middle = sizes.running[len(sizes.running) // 2]
    cases.append((middle, "priority"))
    for running, policy in cases:
        config = step_config(running, policy)
        pairs: list[list[Stepper]] = []
        for waiting in sizes.waiting:
            sched = steppers(config)
            for s in {id(st.scheduler): st.scheduler for st in sched}.values():
                start_running(s, running)
                fill(s, 0, waiting, 1)
            # The first steps take the arrivals in (rejection check) and let finishes start.
            for st in sched[:3]:
                st.run(40)
            pairs.append(sched)
        gc.collect()
        gc.freeze()  # the setup's objects: the collector need not walk them each step
        steps_per_round, nrounds = rounds_for(running)
        for _ in range(nrounds):
            for sched in pairs:
                for st in sched:
                    start = time.perf_counter()
                    st.run(steps_per_round)
                    st.rounds.append((time.perf_counter() - start) / steps_per_round)
        for waiting, sched in zip(sizes.waiting, pairs, strict=True):
            row = StepRow(running, waiting, policy,
                          {st.name: statistics.median(st.rounds) for st in sched})
            rows.append(row)
            out.add(row.cells())
        del pairs, sched
        gc.unfreeze()
        gc.collect()
    return rows


# -- vLLM's scheduler ------------------------------------------------------------------

VLLM_STEP = r'''
import importlib.util, json, sys, tempfile, time
from pathlib import Path
spec = importlib.util.spec_from_file_location("vllm_driver", sys.argv[1])
d = importlib.util.module_from_spec(spec); spec.loader.exec_module(d)
running, waiting, steps = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
outputs = d._module("vllm.v1.outputs")
with tempfile.TemporaryDirectory() as tmp:
    cfg = {"block_size": 16, "num_blocks": 40 * running + 1024 + 1, "max_num_seqs": running,
           "max_num_batched_tokens": 2 * running, "max_model_len": 2048,
           "enable_chunked_prefill": True, "long_prefill_token_threshold": 0,
           "policy": "fcfs", "watermark": 0.0, "enable_prefix_caching": False}
    s = d.build_scheduler(cfg, Path(tmp))
    contents = d.Contents([])  # each request's tokens, made as it is added
    hasher = d.block_hasher(s)
    order = [0]
    def add(rid, i, arrival):
        order[0] += 1
        length = 30 + (i * 7919) % 200  # it runs to max_tokens
        item = {"id": rid, "prompt_len": 16 + i % 48, "max_tokens": length,
                "output_len": length, "priority": i % 3}
        contents.items[rid] = item
        s.add_request(d.make_request(item, order[0], contents, hasher))
    def step():
        t0 = time.perf_counter()
        out = s.schedule()
        t1 = time.perf_counter()
        sched = list(out.num_scheduled_tokens.items())
        sampled = [[] if s.requests[rid].num_computed_tokens < s.requests[rid].num_tokens
                   else [contents.output(rid, s.requests[rid].num_output_tokens)]
                   for rid, _ in sched]
        ids = [rid for rid, _ in sched]
        runner = outputs.ModelRunnerOutput(req_ids=ids,
                                           req_id_to_index={r: i for i, r in enumerate(ids)},
                                           sampled_token_ids=sampled)
        t2 = time.perf_counter()
        s.update_from_output(out, runner)
        t3 = time.perf_counter()
        return sum(n for _, n in sched), (t1 - t0) + (t3 - t2)
    for i in range(running):
        add(f"r{i}", i, 0)
    while step()[0] != running:
        pass
    for i in range(waiting):
        add(f"w{i}", i, 1)
    for _ in range(40):
        step()
    spent = sum(step()[1] for _ in range(steps))
    print(json.dumps({"seconds": spent / steps}))
'''


def vllm_python() -> Path | None:
    python = ROOT / ".venv-vllm" / "bin" / "python"
    return python if python.exists() else None


def bench_vllm(sizes: Sizes, out: Section) -> None:
    python = vllm_python()
    if python is None:
        out.add("", "vLLM's scheduler: not measured (no .venv-vllm here; `make "
                "conformance-vllm` creates it).")
        return
    driver = Path(vllm_driver.__file__)  # standard library only: vLLM's python runs it
    out.add("", "| running | waiting | vLLM schedule() + update_from_output(), us | "
                "compiled step, us | ratio |", "|---:|---:|---:|---:|---:|")
    waiting = sizes.waiting[0]
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "vllm_step.py"
        script.write_text(VLLM_STEP)
        for running in sizes.vllm_running:
            steps, _ = rounds_for(running)
            done = subprocess.run([str(python), str(script), str(driver), str(running),
                                   str(waiting), str(max(steps, 10))],
                                  capture_output=True, text=True, timeout=1800, check=False)
            if done.returncode != 0:
                out.add(f"| {running:,} | {waiting:,} | failed: "
                        f"{(done.stderr.strip().splitlines() or ['?'])[-1]} | | |")
                continue
            vllm = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
            sched = next(st for st in steppers(step_config(running)) if st.name == "compiled")
            start_running(sched.scheduler, running)
            fill(sched.scheduler, 0, waiting, 1)
            sched.run(40)
            count = max(steps, 10)
            start = time.perf_counter()
            sched.run(count)
            fast = (time.perf_counter() - start) / count
            out.add(f"| {running:,} | {waiting:,} | {vllm * 1e6:,.0f} | {fast * 1e6:,.0f} | "
                    f"{vllm / fast:,.1f} |")


# -- a whole simulation ----------------------------------------------------------------

def sim_config() -> Config:
    """A large engine: 16k sequences, 512k blocks of 16 tokens, a 32k-token step."""
    return Config(block_size=16, num_gpu_blocks=524_288, max_num_seqs=16_384,
                  max_num_batched_tokens=32_768, max_model_len=4096, chunked_prefill=True)


def columns(items: list[WorkItem]) -> Arrivals:
    return Arrivals([w.id for w in items], [w.arrival for w in items],
                    [w.prompt_len for w in items], [w.output_len for w in items],
                    [w.max_tokens for w in items], [w.priority for w in items],
                    [w.abort for w in items], [w.shared for w in items])


@dataclass
class SimRun:
    seconds: float
    writing: float  # of which serializing and writing the trace
    steps: int
    entries: int
    digest: int  # of the trace lines, to compare two runs

    @property
    def deciding(self) -> float:
        return self.seconds - self.writing


def simulate_reference(config: Config, items: list[WorkItem], trace: Path) -> SimRun:
    scheduler = ReferenceScheduler(config, KNOBS)
    writing = 0.0
    steps = entries = digest = 0
    with trace.open("wb") as stream:
        stream.write(orjson.dumps({"kvsched": "trace"}) + b"\n")
        start = time.perf_counter()
        for rec in run(scheduler, items):
            mark = time.perf_counter()
            line = orjson.dumps(reference_step_dict(rec)) + b"\n"
            stream.write(line)
            digest = hash((digest, line))
            writing += time.perf_counter() - mark
            steps += 1
            entries += len(rec.scheduled)
        seconds = time.perf_counter() - start
    return SimRun(seconds, writing, steps, entries, digest)


def simulate_optimized(config: Config, items: list[WorkItem], trace: Path,
                       device: str = "cpu") -> SimRun:
    scheduler = TorchScheduler(config, KNOBS, device=device)
    writing = 0.0
    steps = entries = digest = 0
    with trace.open("wb") as stream:
        stream.write(orjson.dumps({"kvsched": "trace"}) + b"\n")
        start = time.perf_counter()
        for s in run_fast(scheduler, columns(items)):
            mark = time.perf_counter()
            line = orjson.dumps(step_dict(scheduler, s)) + b"\n"
            stream.write(line)
            digest = hash((digest, line))
            writing += time.perf_counter() - mark
            steps += 1
            entries += s.decision.scheduled.numel()
        seconds = time.perf_counter() - start
    return SimRun(seconds, writing, steps, entries, digest)


def bench_simulation(sizes: Sizes, out: Section, tmp: Path) -> Path:
    """Returns the prefix's trace (for the checker benchmark)."""
    config = sim_config()
    items = generate("sharegpt", sizes.sim_requests, seed=0, arrival="poisson",
                     rate=sizes.sim_rate, max_model_len=config.max_model_len)
    prefix = items[:sizes.sim_prefix]
    ref_trace, opt_trace, full_trace = tmp / "ref.jsonl", tmp / "opt.jsonl", tmp / "full.jsonl"
    print(f"simulating {len(prefix):,} requests with the reference ...", flush=True)
    ref = simulate_reference(config, prefix, ref_trace)
    print(f"  {ref.seconds:.0f} s", flush=True)
    opt = simulate_optimized(config, prefix, opt_trace)
    same = ref.digest == opt.digest and ref.steps == opt.steps
    print(f"simulating {len(items):,} requests with the optimized scheduler ...", flush=True)
    full = simulate_optimized(config, items, full_trace)
    full_trace.unlink()
    opt_trace.unlink()
    # The reference on the whole workload, extrapolated: its prefix time scaled by how much
    # longer the whole took the optimized scheduler (the same steps, at the same sizes).
    scale = full.seconds / opt.seconds
    scale_deciding = full.deciding / opt.deciding
    out.add(
        f"Workload: {len(items):,} ShareGPT-like requests (`kvsched.generators`, seed 0), "
        f"Poisson arrivals at {sizes.sim_rate:g} per step; the reference runs its first "
        f"{len(prefix):,}. Config: {describe(config)}; profile `vllm-v1`. Both loops write "
        "the trace (orjson); \"deciding\" leaves out the time spent serializing and "
        "writing it. The two traces of the prefix are "
        + ("identical, line for line." if same else "NOT identical (a divergence)."), "",
        "| run | requests | steps | scheduled entries | seconds | deciding, s | "
        "ratio | ratio, deciding |", "|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| reference | {len(prefix):,} | {ref.steps:,} | {ref.entries:,} | {ref.seconds:,.1f} "
        f"| {ref.deciding:,.1f} | 1 | 1 |",
        f"| optimized | {len(prefix):,} | {opt.steps:,} | {opt.entries:,} | {opt.seconds:,.1f} "
        f"| {opt.deciding:,.1f} | {ref.seconds / opt.seconds:,.1f} | "
        f"{ref.deciding / opt.deciding:,.1f} |",
        f"| optimized | {len(items):,} | {full.steps:,} | {full.entries:,} | "
        f"{full.seconds:,.1f} | {full.deciding:,.1f} | | |",
        f"| reference, extrapolated | {len(items):,} | | | {ref.seconds * scale:,.0f} | "
        f"{ref.deciding * scale_deciding:,.0f} | {ref.seconds / opt.seconds:,.1f} | "
        f"{ref.deciding / opt.deciding:,.1f} |",
        "", f"The reference on all {len(items):,} requests is extrapolated from its prefix: "
        "its time there times the ratio of the optimized scheduler's whole-run time to its "
        "prefix time. That assumes the reference's cost grows with the work as the optimized "
        "scheduler's does; its cost per step grows faster with the batch (the prefix ramps "
        "up and drains), so the estimate is on the low side.")
    return ref_trace


def describe(c: Config) -> str:
    return (f"block_size {c.block_size}, {c.num_gpu_blocks:,} GPU blocks, max_num_seqs "
            f"{c.max_num_seqs:,}, max_num_batched_tokens {c.max_num_batched_tokens:,}, "
            f"max_model_len {c.max_model_len:,}, chunked prefill, {c.policy}, "
            f"{c.preemption}")


# -- the checkers ----------------------------------------------------------------------

def small_trace(sizes: Sizes, path: Path) -> Config:
    """The baseline benchmark's engine (tools.bench: 256 sequences, 8192 blocks)."""
    from tools.bench import BENCH_CONFIG
    items = generate("sharegpt", sizes.small_trace_requests, seed=0, arrival="poisson",
                     rate=1.0, max_model_len=BENCH_CONFIG.max_model_len)
    with path.open("wb") as stream:
        writer = TraceWriter(stream, lambda o: orjson.dumps(o) + b"\n")
        writer.header(BENCH_CONFIG)
        for rec in run(ReferenceScheduler(BENCH_CONFIG, KNOBS), items):
            writer.step(rec)
        writer.end()
    return BENCH_CONFIG


def with_header(config: Config, trace: Path, path: Path) -> None:
    """The simulation's trace (its first line a stand-in) with a real header."""
    with trace.open("rb") as src, path.open("wb") as dst:
        src.readline()
        writer = TraceWriter(dst, lambda o: orjson.dumps(o) + b"\n")
        writer.header(config)
        while chunk := src.read(1 << 24):
            dst.write(chunk)
        writer.end()


def bench_checkers(sizes: Sizes, out: Section, traces: list[tuple[str, Path]]) -> None:
    # Importing the compiled state is a once-per-process cost, measured here on the
    # first 100 lines of the first trace.
    head = b"".join(traces[0][1].read_bytes().splitlines(keepends=True)[:100])
    start = time.perf_counter()
    check_trace_vectorized(io.BytesIO(head))
    load_s = time.perf_counter() - start
    out.add("", "| trace | steps | scheduled entries | spec checker, entries/s | "
                "vectorized, entries/s | ratio | same report |",
            "|---|---:|---:|---:|---:|---:|---|")
    for name, path in traces:
        data = path.read_bytes()
        gc.collect()
        start = time.perf_counter()
        spec = check_trace(TraceReader(io.BytesIO(data)))
        spec_s = time.perf_counter() - start
        gc.collect()
        start = time.perf_counter()
        stats: dict[str, int] = {}
        fast = check_trace_vectorized(io.BytesIO(data), stats=stats)
        fast_s = time.perf_counter() - start
        same = (spec.counts == fast.counts and spec.violations == fast.violations
                and spec.scheduled_entries == fast.scheduled_entries
                and stats["exact"] == 0)
        n = spec.scheduled_entries
        out.add(f"| {name} | {spec.steps:,} | {n:,} | {n / spec_s:,.0f} | {n / fast_s:,.0f} | "
                f"{spec_s / fast_s:,.1f} | {'yes' if same else 'NO'} |")
    bench_profile_replay(out, traces)
    out.add("", "Each checker reads the whole trace once, one after the other, in one process. "
            "Before them, the vectorized checker checked the first 100 lines of the first "
            f"trace, which took {load_s:.2f} s, once per process. \"same report\" also "
            "requires that no step was handed to the spec's checker.")


def bench_profile_replay(out: Section, traces: list[tuple[str, Path]]) -> None:
    """`kvsched check --profile vllm-v1`: the spec's checker replaying the profile with the
    reference (on the baseline engine's trace only: hours on the large one), and the
    vectorized checker replaying it with the compiled scheduler, beside the plain
    vectorized check of the same trace."""
    out.add("", "#### `check --profile vllm-v1`", "",
            "The same traces checked against profile `vllm-v1` (the engine that wrote them, "
            "so no divergence): the spec's checker replays the profile with the reference "
            "scheduler; the vectorized checker replays it with the compiled one beside its "
            "checks (kvsched.optimized.replay). \"share\" is the replaying vectorized "
            "check's speed over the plain one's, measured one after the other.", "",
            "| trace | scheduled entries | spec + reference replay, entries/s | vectorized, "
            "entries/s | vectorized + compiled replay, entries/s | share | same report |",
            "|---|---:|---:|---:|---:|---:|---|")
    for k, (name, path) in enumerate(traces):
        data = path.read_bytes()
        spec_rate = "not run"
        spec_report: Report | None = None
        if k == 0:
            gc.collect()
            start = time.perf_counter()
            reader = TraceReader(io.BytesIO(data))
            spec_report = check_trace(reader, replay=profile_replay(reader.header.config,
                                                                    "vllm-v1"))
            spec_rate = f"{spec_report.scheduled_entries / (time.perf_counter() - start):,.0f}"
        gc.collect()
        start = time.perf_counter()
        plain = check_trace_vectorized(io.BytesIO(data))
        plain_s = time.perf_counter() - start
        gc.collect()
        stats: dict[str, int] = {}
        start = time.perf_counter()
        replayed = check_trace_vectorized(io.BytesIO(data), profile="vllm-v1", stats=stats)
        replay_s = time.perf_counter() - start
        n = plain.scheduled_entries
        same = (not replayed.counts and stats["replayed_slow"] == 0
                and (spec_report is None or (spec_report.counts == replayed.counts
                                             and spec_report.violations == replayed.violations)))
        out.add(f"| {name} | {n:,} | {spec_rate} | {n / plain_s:,.0f} | {n / replay_s:,.0f} | "
                f"**{plain_s / replay_s:.2f}** | {'yes' if same else 'NO'} |")


# -- memory ----------------------------------------------------------------------------

MEMORY = r'''
import gc, sys, torch
from pathlib import Path
torch.set_num_threads(1)
from tools.bench_optimized import request, start_running, step_config, KNOBS
from kvsched.optimized import TorchScheduler
from kvsched.reference import ReferenceScheduler

def status(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise SystemExit(f"no {key} in /proc/self/status")

which, running, waiting = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
config = step_config(running)
gc.collect()
Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
before = status("VmRSS")
s = (ReferenceScheduler if which == "reference" else TorchScheduler)(config, KNOBS)
start_running(s, running)
for i in range(waiting):
    s.add_request(request(f"w{i}", i, 1))
for _ in range(5):
    if which == "reference":
        s.schedule(); s.update(())
    else:
        s.schedule_tensors(); s.forget(s.update_tensors())
print(status("VmHWM") - before, status("VmRSS") - before)
'''


def bench_memory(sizes: Sizes, out: Section) -> None:
    live = sizes.memory_running + sizes.memory_waiting
    out.add("", "### Memory per live request", "",
            f"{sizes.memory_running:,} running and {sizes.memory_waiting:,} waiting requests, "
            "each scheduler in a process of its own (Linux VmHWM and VmRSS, from just "
            "before the scheduler is built to after five steps):", "",
            "| scheduler | peak, bytes per live request | resident, bytes per live request |",
            "|---|---:|---:|")
    for which in ("reference", "optimized"):
        # From the checkout's top, where the script finds `tools`.
        done = subprocess.run([sys.executable, "-c", MEMORY, which, str(sizes.memory_running),
                               str(sizes.memory_waiting)], capture_output=True, text=True,
                              timeout=1800, check=False, cwd=ROOT)
        if done.returncode == 0:
            peak, resident = (int(x) for x in done.stdout.split()[-2:])
            out.add(f"| {which} | {peak / live:,.0f} | {resident / live:,.0f} |")
        else:
            out.add(f"| {which} | failed: "
                    f"{(done.stderr.strip().splitlines() or ['?'])[-1]} | |")


# -- CUDA ------------------------------------------------------------------------------

def bench_cuda(sizes: Sizes, out: Section) -> None:
    name = torch.cuda.get_device_name(0)
    out.add(f"GPU: {name}, torch {torch.__version__} (CUDA {torch.version.cuda}).")
    bench_devices(sizes, out, ("cuda", "cpu"))


def bench_devices(sizes: Sizes, out: Section, devices: tuple[str, str]) -> None:
    """The optimized step (fast path) on two devices of one machine, two ways: the step
    of the step-time table (finishes, and as many arrivals), and a steady decode step
    (every request decodes, none finishes, nothing arrives: the step alone)."""
    first, second = devices
    out.add("The optimized step (fast path) on each device, one torch thread on cpu: "
            "\"with arrivals\" is the step of the step-time table above (finishes, and "
            "as many new arrivals, with `waiting` requests queued); \"decode only\" "
            "keeps every request decoding, none finishing, nothing arriving: the step "
            "alone.", "",
            f"| running | waiting | with arrivals, {first}, us | with arrivals, {second}, us "
            f"| decode only, {first}, us | decode only, {second}, us |",
            "|---:|---:|---:|---:|---:|---:|")
    steps = 50
    for running in sizes.running:
        waiting = sizes.waiting[0]
        cells: dict[tuple[str, int], float] = {}
        for device in dict.fromkeys(devices):
            for kind in (0, 1):
                opt = TorchScheduler(step_config(running), KNOBS, device=device)
                if kind == 0:
                    start_running(opt, running)
                    fill(opt, 0, waiting, 1)
                    refill = Refill(opt)
                else:
                    start_running(opt, running, decoding)
                    refill = None

                def go(opt: TorchScheduler = opt, refill: Refill | None = refill,
                       n: int = steps) -> None:
                    for _ in range(n):
                        opt.schedule_tensors()
                        done = opt.forget(opt.update_tensors())
                        if refill is not None:
                            refill(len(done))
                    if opt.device.type == "cuda":
                        torch.cuda.synchronize()

                go(n=10)  # warm up
                cells[device, kind] = timed(go) / steps
        out.add(f"| {running:,} | {waiting:,} | "
                + " | ".join(f"{cells[d, k] * 1e6:,.0f}" for k in (0, 1) for d in devices)
                + " |")


def full_simulation_report(sizes: Sizes, command: str) -> str:
    """Both schedulers on the whole workload (the reference takes about an hour)."""
    config = sim_config()
    items = generate("sharegpt", sizes.sim_requests, seed=0, arrival="poisson",
                     rate=sizes.sim_rate, max_model_len=config.max_model_len)
    with tempfile.TemporaryDirectory() as tmp, one_thread():
        print(f"simulating {len(items):,} requests with the optimized scheduler ...",
              flush=True)
        opt = simulate_optimized(config, items, Path(tmp) / "opt.jsonl")
        (Path(tmp) / "opt.jsonl").unlink()
        print(f"  {opt.seconds:.0f} s; now with the reference ...", flush=True)
        ref = simulate_reference(config, items, Path(tmp) / "ref.jsonl")
    same = ref.digest == opt.digest and ref.steps == opt.steps
    out = Section()
    out.add(FULL_START, "### The whole simulation, both schedulers", "",
            f"Measured by `{command}` (`make bench-full`) on {datetime.now(UTC):%Y-%m-%d}.",
            f"Machine: {machine()}; torch {torch.__version__}, one torch thread.", "",
            f"The workload of \"A whole simulation\" above, all {len(items):,} requests "
            "through both schedulers, one after the other in one process. The two traces "
            "are " + ("identical, line for line." if same else "NOT identical (a divergence)."),
            "", "| run | requests | steps | scheduled entries | seconds | deciding, s | "
            "ratio | ratio, deciding |", "|---|---:|---:|---:|---:|---:|---:|---:|",
            f"| reference | {len(items):,} | {ref.steps:,} | {ref.entries:,} | "
            f"{ref.seconds:,.1f} | {ref.deciding:,.1f} | 1 | 1 |",
            f"| optimized | {len(items):,} | {opt.steps:,} | {opt.entries:,} | "
            f"{opt.seconds:,.1f} | {opt.deciding:,.1f} | {ref.seconds / opt.seconds:,.1f} | "
            f"{ref.deciding / opt.deciding:,.1f} |", FULL_END)
    return "\n".join(out.lines) + "\n"


# -- the report ------------------------------------------------------------------------

def gpu_report(sizes: Sizes, command: str) -> str:
    out = Section()
    out.add(GPU_START, "### The optimized scheduler on a CUDA GPU", "",
            f"Measured by `{command}` on {datetime.now(UTC):%Y-%m-%d}.",
            f"Machine: {machine()}.")
    with one_thread():
        bench_cuda(sizes, out)
    out.add(GPU_END)
    return "\n".join(out.lines) + "\n"


def prefix_report(sizes: Sizes, command: str) -> str:
    """The prefix-caching simulation through both schedulers, as its own section."""
    out = Section()
    out.add(PREFIX_START, "### Prefix caching: a whole simulation, both schedulers", "",
            f"Measured by `{command}` (in `make bench`) on {datetime.now(UTC):%Y-%m-%d}.",
            f"Machine: {machine()}; torch {torch.__version__}, one torch thread.", "")
    with tempfile.TemporaryDirectory() as tmp, one_thread():
        bench_prefix_simulation(sizes, out, Path(tmp))
    out.add(PREFIX_END)
    return "\n".join(out.lines) + "\n"


def bench_prefix_simulation(sizes: Sizes, out: Section, tmp: Path) -> None:
    """Both schedulers on shared system prompts with prefix caching, side by side."""
    config = replace(BENCH_CONFIG, prefix_caching=True)
    items = generate(SHARED_PROMPTS, sizes.prefix_requests, seed=0, arrival="poisson",
                     rate=1.0, max_model_len=config.max_model_len)
    print(f"simulating {len(items):,} shared-prompt requests with prefix caching ...",
          flush=True)
    ref = simulate_reference(config, items, tmp / "prefix-ref.jsonl")
    opt = simulate_optimized(config, items, tmp / "prefix-opt.jsonl")
    same = ref.digest == opt.digest and ref.steps == opt.steps
    out.add(
        f"Workload: {len(items):,} requests of the `shared-prompts` generator (seed 0), "
        "Poisson arrivals at 1 per step; the baseline engine of the first section with "
        "prefix caching on; profile `vllm-v1`. The two traces are "
        + ("identical, line for line (hits included)." if same
           else "NOT identical (a divergence)."), "",
        "| run | steps | scheduled entries | seconds | deciding, s | ratio | "
        "ratio, deciding |", "|---|---:|---:|---:|---:|---:|---:|",
        f"| reference | {ref.steps:,} | {ref.entries:,} | {ref.seconds:,.1f} | "
        f"{ref.deciding:,.1f} | 1 | 1 |",
        f"| optimized | {opt.steps:,} | {opt.entries:,} | {opt.seconds:,.1f} | "
        f"{opt.deciding:,.1f} | {ref.seconds / opt.seconds:,.2f} | "
        f"{ref.deciding / opt.deciding:,.2f} |", "",
        "A ratio below 1 means the optimized scheduler is the slower: at this engine's "
        "size (at most 256 running) its per-call torch overhead dominates, as in the "
        "step-time table at 256 running, and with caching it admits one request at a time "
        "(each may hit what an earlier admission of the step just cached) and looks "
        "content keys up in Python.")


def report(sizes: Sizes, command: str) -> str:
    out = Section()
    out.add(START, "## Optimized scheduler and vectorized checker", "",
            f"Measured by `{command}` on {datetime.now(UTC):%Y-%m-%d}.",
            f"Machine: {machine()}; torch {torch.__version__}, one torch thread on CPU.")
    out.add("", "### Step time, compiled and torch against reference",
            "", "Each scheduler holds the same requests: `running` of them run (decode "
            "and a steady stream of finishes and admissions), `waiting` more wait; each "
            "step ends with as many new arrivals as requests finished, so the queue keeps "
            "its length (the arrivals are part of the step's time). "
            "Config: block_size 16, 40 blocks per running request, max_num_seqs = "
            "running, a token budget of twice that; profile `vllm-v1`. \"compiled\" is "
            "the compiled scheduler's `step_counts()` + `finish_step()` (its decision left "
            "as numbers, the CPU path); \"torch\" is the torch scheduler's "
            "`schedule_tensors()` + `update_tensors()` (its fast path, for CUDA), and "
            "\"torch schedule()\" the same step through the exact interface, which also "
            "builds the Decision's tuples of ids. Medians of interleaved rounds.",
            "", "| running | waiting | policy | reference, us/step | ns/running | "
            "compiled, us/step | ns/running | ratio | torch, us/step | ratio | "
            "torch schedule(), us/step | ratio |",
            "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with one_thread():
        rows = bench_steps(sizes, out)
    out.add("", "Waiting-queue independence, step time at the longest queue over the "
                "shortest:", "")
    for r in sorted({(row.running, row.policy) for row in rows}):
        same = [row for row in rows if (row.running, row.policy) == r]
        short, long = same[0], same[-1]

        def grew(name: str, short: StepRow = short, long: StepRow = long) -> str:
            return f"{long.seconds[name] / short.seconds[name]:.2f}x"

        out.add(f"- {r[0]:,} running, {r[1]}: {long.waiting:,} over {short.waiting:,} "
                f"waiting: compiled {grew('compiled')}, torch {grew('optimized')}, "
                f"reference {grew('reference')}")
    out.add("", "### The same steps through vLLM's own scheduler", "",
            "vLLM 0.32's v1 Scheduler built as kvsched.adapters.vllm_driver builds it "
            "(its own Python in .venv-vllm), same requests and config (prefix caching off, "
            "as in the step table), beside the compiled scheduler's step; the time is "
            "schedule() plus update_from_output(), not the hand-made model output.")
    with one_thread():
        bench_vllm(sizes, out)
    with tempfile.TemporaryDirectory() as tmp:
        out.add("", "### A whole simulation", "")
        with one_thread():
            prefix_trace = bench_simulation(sizes, out, Path(tmp))
        big = Path(tmp) / "big.jsonl"
        with_header(sim_config(), prefix_trace, big)
        prefix_trace.unlink()
        small = Path(tmp) / "small.jsonl"
        print("writing the baseline-sized trace ...", flush=True)
        small_trace(sizes, small)
        out.add("", "### Checker throughput", "",
                "Both checkers read the same file with orjson and must give the same "
                "report (counts, first violations). \"baseline engine\" is the engine of "
                "tools.bench (256 sequences, ~130 entries per step, "
                f"{sizes.small_trace_requests:,} requests); \"large engine\" is the "
                "simulation's prefix above (thousands of entries per step).")
        bench_checkers(sizes, out, [("baseline engine", small), ("large engine", big)])
    bench_memory(sizes, out)
    out.add("", "CUDA: " + ("see the next section (`make gpu-check`)." if torch.cuda.is_available()
                           else "not measured on this machine (torch.cuda.is_available() is "
                                "False); `make gpu-check` on a GPU machine adds its section "
                                "(`scripts/gpu_check.sh` on one without network)."))
    out.add(END)
    return "\n".join(out.lines) + "\n"


def publish(text: str, out: Path | None, start: str, end: str) -> None:
    """A benchmark's section: in `out` between its markers (replacing its last version),
    or printed where there is no `out`."""
    if out is None:
        print(text)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    place(text, out, start, end)
    print(f"written to {out}")


def gpu_check() -> int:
    """The CUDA tests, then the CUDA benchmark: one command for a GPU machine."""
    if not torch.cuda.is_available():
        print("gpu-check: torch.cuda.is_available() is False on this machine", file=sys.stderr)
        return 2
    tests = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
             "tests/test_differential.py", "tests/test_interface.py",
             "tests/test_vllm_v1_profile.py", "tests/test_property.py",
             "tests/test_stateful.py", "tests/test_optimized_simulation.py",
             "-k", "cuda or Cuda"]
    return subprocess.run(tests, cwd=ROOT, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_optimized")
    parser.add_argument("--out", type=Path, default=None,
                        help="put the section in this Markdown file (default: print only)")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--gpu-check", action="store_true",
                        help="run the CUDA tests, then measure on cuda only")
    parser.add_argument("--prefix-caching", action="store_true",
                        help="only the prefix-caching simulation, through both schedulers")
    parser.add_argument("--full-simulation", action="store_true",
                        help="only the whole simulation, through both schedulers (about "
                             "an hour: the reference on all 1M requests)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    given = list(argv if argv is not None else sys.argv[1:])
    if "--out" in given:  # where the text goes is not part of what was measured
        at = given.index("--out")
        del given[at:at + 2]
    command = "python -m tools.bench_optimized " + " ".join(given)
    markers = (START, END)
    if args.gpu_check:
        failed = gpu_check()
        if failed:
            return failed
        text = gpu_report(replace(sizes, waiting=(1_000,)), command.strip())
        markers = (GPU_START, GPU_END)
    elif args.full_simulation:
        text = full_simulation_report(sizes, command.strip())
        markers = (FULL_START, FULL_END)
    elif args.prefix_caching:
        text = prefix_report(sizes, command.strip())
        markers = (PREFIX_START, PREFIX_END)
    else:
        text = report(sizes, command.strip())
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        place(text, args.out, *markers)
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
