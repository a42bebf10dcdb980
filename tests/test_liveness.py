"""Liveness is a checked property (SHOULD `progress`), not a timeout: a trace whose
engine lets work wait K steps in a row while nothing changes is flagged by `check
--strict` on both checkers; a run kvsched drives that gets stuck stops there with the
waiting requests named, in `simulate` (each scheduler), `fuzz`, the pytest plugin and
`diff`; a step cap or a wall-clock limit reached is reported, never silent.

The deadlocking scheduler is the one a user writes from docs/scheduler-interface.md:
first come first served, as many requests at once as the blocks allow, and no
preemption, so that once the running requests fill the cache each waits on the others.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console

from kvsched.diff import Stop, diff_streams, render_text, simulated
from kvsched.fuzz import TIME_LIMIT, RunLimits, check_case, fuzz
from kvsched.pytest_plugin import RunTooLong, SpecViolation, wrap
from kvsched.reference import reference_scheduler
from kvsched.reference.scheduler import ReferenceScheduler, StepPlan
from kvsched.simulate import run, step_bound
from kvsched.spec import Config, check_steps
from kvsched.spec.checker import CheckOptions
from kvsched.spec.model import StepRecord
from kvsched.spec.profiles import get_profile
from kvsched.spec.should import DEFAULT_STALL_STEPS, Stall, Stalled
from kvsched.spec.trace import TraceReader
from kvsched.testing.seeded_bugs import GROWING, SEEDED_BUGS, tight_config
from kvsched.workload import WorkItem, validate

# A user's scheduler module, as they would write one from the interface's docs.
USER_MODULE = '''
import time
from collections import deque

from kvsched.spec import (Config, Decision, Rejection, Request, RequestView, Status,
                          blocks_for, never_completes)


class NoPreemption:
    """First come first served, as many at once as the blocks allow; a running request
    whose next chunk does not fit waits for room. It never preempts."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.waiting: deque[Request] = deque()
        self.arrived: list[Request] = []
        self.running: dict[str, list] = {}  # id -> [request, N, C, blocks]
        self.free = config.num_gpu_blocks
        self.sampled: list[str] = []

    def add_request(self, request):
        self.waiting.append(request)
        self.arrived.append(request)

    def abort_request(self, request_id):
        if request_id in self.running:
            self.free += self.running.pop(request_id)[3]
        self.waiting = deque(r for r in self.waiting if r.id != request_id)
        self.arrived = [r for r in self.arrived if r.id != request_id]

    def _chunk(self, known, computed, budget):
        n = min(known - computed, budget)
        if n < known - computed and not self.config.chunked_prefill:
            return 0
        return n

    def schedule(self):
        cfg = self.config
        rejected = []
        for r in self.arrived:
            why = never_completes(cfg, r.prompt_len, r.max_tokens)
            if why is not None:
                self.waiting.remove(r)
                rejected.append(Rejection(r.id, why))
        self.arrived = []
        budget = cfg.max_num_batched_tokens
        scheduled, self.sampled = [], []
        for rid, st in self.running.items():
            r, known, computed, held = st
            n = self._chunk(known, computed, budget)
            need = blocks_for(computed + n, cfg.block_size) - held
            if n <= 0 or need > self.free:
                continue  # wait for room
            self.free -= need
            st[2], st[3] = computed + n, held + need
            budget -= n
            scheduled.append((rid, n))
            if st[2] == known:
                self.sampled.append(rid)
        while self.waiting and len(self.running) < cfg.max_num_seqs and budget > 0:
            r = self.waiting[0]
            n = self._chunk(r.prompt_len, 0, budget)
            need = blocks_for(n, cfg.block_size)
            if n <= 0 or need > self.free:
                break
            self.waiting.popleft()
            self.free -= need
            self.running[r.id] = [r, r.prompt_len, n, need]
            budget -= n
            scheduled.append((r.id, n))
            if n == r.prompt_len:
                self.sampled.append(r.id)
        return Decision(tuple(rejected), scheduled=tuple(scheduled),
                        sampled=tuple(self.sampled))

    def update(self, stopped):
        done = []
        for rid in self.sampled:
            st = self.running[rid]
            r = st[0]
            st[1] += 1
            if (rid in stopped or st[1] - r.prompt_len >= r.max_tokens
                    or st[1] >= self.config.max_model_len):
                self.free += st[3]
                del self.running[rid]
                done.append(rid)
        self.sampled = []
        return tuple(done)

    def free_blocks(self):
        return self.free

    def states(self):
        out = {r.id: RequestView(Status.WAITING, r.prompt_len, 0, 0, 0, 0)
               for r in self.waiting}
        for rid, (r, known, computed, held) in self.running.items():
            out[rid] = RequestView(Status.RUNNING, known, computed, held, 0, 0)
        return out

    def has_unfinished(self):
        return bool(self.running or self.waiting)


def make(config):
    return NoPreemption(config)


def seeded(config):
    from kvsched.testing.seeded_bugs import SEEDED_BUGS
    return SEEDED_BUGS["never-preempts"].factory(config)


def hangs(config):
    time.sleep(3600)
'''

# The swap example of docs/cli.md: V0 swaps a request out holding the whole cache, and
# it can never come back (its blocks and the watermark are more than the cache).
STUCK_SWAP = ["simulate", "--profile", "vllm-v0", "--preemption", "swap",
              "--num-gpu-blocks", "128", "--requests", "400"]


def kvsched(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=cwd)


@pytest.fixture
def user_module(tmp_path: Path) -> Path:
    (tmp_path / "my_engine.py").write_text(USER_MODULE)
    return tmp_path


def load_user(user_module: Path) -> Any:
    sys.path.insert(0, str(user_module))
    try:
        import importlib

        sys.modules.pop("my_engine", None)
        return importlib.import_module("my_engine")
    finally:
        sys.path.remove(str(user_module))


# -- the rule ------------------------------------------------------------------------------


def test_a_stall_is_counted_only_while_work_waits_and_told_once() -> None:
    stall = Stall(3)
    # Quiet steps with nothing live (a gap between arrivals) are no stall.
    assert [stall.observe(False, False) for _ in range(5)] == [False] * 5
    # A moving step starts the count again.
    assert [stall.observe(m, True) for m in (False, False, True, False, False)] == \
        [False] * 5
    assert stall.observe(False, True) is True  # the third in a row
    assert [stall.observe(False, True) for _ in range(4)] == [False] * 4  # told once


def trace(steps: list[dict[str, Any]], end: bool = False) -> bytes:
    header = {"kvsched": "trace", "version": 1, "engine": {"name": "hand"},
              "config": {"block_size": 4, "num_gpu_blocks": 4, "num_cpu_blocks": 0,
                         "max_num_batched_tokens": 64, "max_num_seqs": 4,
                         "max_model_len": 64, "chunked_prefill": True,
                         "long_prefill_token_threshold": 0, "policy": "fcfs",
                         "preemption": "recompute", "watermark_blocks": 0}}
    lines = [header, *({"step": i} | s for i, s in enumerate(steps))]
    if end:
        lines.append({"end": True})
    return b"".join(orjson.dumps(x) + b"\n" for x in lines)


def stuck_trace(quiet: int) -> bytes:
    """r0 takes all 4 blocks at step 0 and cannot grow; `quiet` empty steps follow,
    with an idle gap of 30 steps before r0 arrives."""
    gap: list[dict[str, Any]] = [{}] * 30
    return trace([*gap, {"arrivals": [{"id": "r0", "prompt_len": 16, "max_tokens": 8}],
                         "scheduled": [["r0", 16]], "free_blocks": 0},
                  *[{"free_blocks": 0}] * quiet])


@pytest.mark.parametrize("checker", ["spec", "vectorized"])
def test_check_strict_flags_a_stalled_trace_at_the_kth_quiet_step(
        tmp_path: Path, checker: str) -> None:
    path = tmp_path / "stuck.jsonl"
    path.write_bytes(stuck_trace(DEFAULT_STALL_STEPS))
    got = kvsched("check", "--checker", checker, "--strict", "--format", "json",
                  str(path), cwd=tmp_path)
    assert got.returncode == 1, got.stderr
    [verdict] = json.loads(got.stdout)
    [v] = [v for v in verdict["violations"] if v["invariant"] == "progress"]
    # r0 ran at step 30; steps 31..130 change nothing: the 100th is step 130.
    assert (v["step"], v["request"], v["level"]) == (30 + DEFAULT_STALL_STEPS, "r0", "SHOULD")
    assert "r0 is running with 4 GPU blocks: its next chunk needs 1 free GPU block, " \
        "0 are free" in v["message"]
    # The trace ends there, stuck (no end line): that fails even a plain check.
    assert verdict["counts"] == {"progress": 1, "ends-stuck": 1}
    assert kvsched("check", "--checker", checker, str(path), cwd=tmp_path).returncode == 1
    # One quiet step fewer is no stall.
    path.write_bytes(stuck_trace(DEFAULT_STALL_STEPS - 1))
    assert kvsched("check", "--checker", checker, "--strict", str(path),
                   cwd=tmp_path).returncode == 0
    # K is settable.
    shorter = kvsched("check", "--checker", checker, "--strict", "--stall-steps", "10",
                      "--format", "json", str(path), cwd=tmp_path)
    assert shorter.returncode == 1
    assert json.loads(shorter.stdout)[0]["violations"][0]["step"] == 40


def test_the_two_checkers_agree_on_stalls_between_moving_runs() -> None:
    from kvsched.optimized.checker import check_trace_vectorized
    from kvsched.spec.checker import check_trace

    # Two stalls of K steps, each ended by an abort, with busy stretches between.
    arrive = {"arrivals": [{"id": "r0", "prompt_len": 16, "max_tokens": 8}],
              "scheduled": [["r0", 16]]}
    steps: list[dict[str, Any]] = [
        arrive, *[{}] * 12, {"aborted": ["r0"]},
        {"arrivals": [{"id": "r1", "prompt_len": 16, "max_tokens": 8}],
         "scheduled": [["r1", 16]]}, *[{}] * 5, {"aborted": ["r1"]},
        {"arrivals": [{"id": "r2", "prompt_len": 1, "max_tokens": 1}],
         "scheduled": [["r2", 1]], "finished": ["r2"]}]
    data = trace(steps)
    for k in (3, 5, 6, 12, 13):
        spec = check_trace(TraceReader(io.BytesIO(data)), CheckOptions(stall_steps=k))
        fast = check_trace_vectorized(io.BytesIO(data), stall_steps=k)
        assert spec.violations == fast.violations, k
        assert spec.counts["progress"] == (k <= 12) + (k <= 5), k


# -- driven runs ------------------------------------------------------------------------


def test_simulate_stops_a_stuck_run_naming_the_request(tmp_path: Path) -> None:
    out = tmp_path / "swap.jsonl"
    started = time.monotonic()
    got = kvsched(*STUCK_SWAP, "--out", str(out), cwd=tmp_path)
    assert time.monotonic() - started < 60
    assert got.returncode == 1, got.stderr
    [line] = got.stderr.strip().splitlines()
    assert line.startswith("kvsched: the reference scheduler is stuck at step ")
    assert "is swapped out with 128 host blocks: swapping it in needs 129 free GPU " \
        "blocks (the watermark's 1 included), 128 are free" in line
    assert "(stuck)" in got.stdout
    # The trace ends honestly: every step up to the stuck one, no end line; checked
    # --strict it names the same step and request.
    lines = out.read_bytes().splitlines()
    last = json.loads(lines[-1])
    assert "end" not in last and f"at step {last['step']}:" in line
    checked = kvsched("check", "--strict", "--format", "json", str(out), cwd=tmp_path)
    [v] = [v for v in json.loads(checked.stdout)[0]["violations"]
           if v["invariant"] == "progress"]
    assert v["step"] == last["step"] and v["request"] in line


def test_simulate_json_says_where_it_stuck(tmp_path: Path) -> None:
    got = kvsched(*STUCK_SWAP, "--format", "json", "--stall-steps", "5", cwd=tmp_path)
    assert got.returncode == 1
    result = json.loads(got.stdout)
    assert result["complete"] is False and result["stuck"]["invariant"] == "progress"
    assert "for 5 steps nothing was scheduled" in result["stuck"]["message"]


def test_every_python_driven_scheduler_stalls_at_the_same_step() -> None:
    bug = SEEDED_BUGS["never-preempts"]
    stuck = []
    for k in (1, 7, DEFAULT_STALL_STEPS):
        records: list[StepRecord] = []
        with pytest.raises(Stalled) as e:
            for rec in run(bug.factory(bug.config), bug.workload, stall_steps=k):
                records.append(rec)
        stuck.append(e.value.violation.step)
        assert records[-1].step == e.value.violation.step
        assert e.value.violation.request == "r0"
        # The checker, with the same K, names the same step from the trace alone.
        report = check_steps(bug.config, records, False, CheckOptions(stall_steps=k))
        assert [v.step for v in report.violations if v.invariant == "progress"] == \
            [e.value.violation.step]
    assert stuck[1] == stuck[0] + 6 and stuck[2] == stuck[0] + DEFAULT_STALL_STEPS - 1


def test_a_correct_scheduler_never_stalls() -> None:
    config = tight_config()
    records = list(run(reference_scheduler("vllm-v1", config), GROWING, stall_steps=1))
    assert check_steps(config, records, True, CheckOptions(strict=True)).counts == {}


# -- fuzz, the plugin, diff, check --strict on the user's deadlocking scheduler -----------


@pytest.mark.parametrize("factory", ["my_engine:make", "my_engine:seeded"])
def test_fuzz_finds_the_deadlock(user_module: Path, factory: str) -> None:
    started = time.monotonic()
    # Pinned to what the scheduler implements, and to a small cache where it fills.
    got = kvsched("fuzz", factory, "--examples", "100", "--preemption", "recompute",
                  "--num-cpu-blocks", "0", "--policy", "fcfs", "--num-gpu-blocks", "8",
                  "--block-size", "4", "--chunked-prefill", "--format", "json",
                  "--out", str(user_module / "min.jsonl"), cwd=user_module)
    assert got.returncode == 1, got.stderr
    assert time.monotonic() - started < 120
    finding = json.loads(got.stdout)["finding"]
    assert finding["invariant"] == "progress"
    assert "nothing was scheduled, preempted, swapped in or finished while" in \
        finding["message"]
    assert finding["violations"][-1]["request"] is not None


@pytest.mark.skipif(not Path("/dev/null").is_char_device(), reason="no /dev/null here")
def test_fuzz_out_on_a_device_writes_no_sidecar_beside_it(user_module: Path) -> None:
    got = kvsched("fuzz", "my_engine:make", "--examples", "100", "--preemption", "recompute",
                  "--num-cpu-blocks", "0", "--policy", "fcfs", "--num-gpu-blocks", "8",
                  "--block-size", "4", "--chunked-prefill", "--out", "/dev/null",
                  cwd=user_module)
    assert got.returncode == 1, got.stderr
    assert "minimal failing workload (" in got.stdout and "written to /dev/null\n" in \
        got.stdout.replace("\n ", " ")
    assert Path("/dev/null").is_char_device()
    assert not Path("/dev/null.config.json").exists()


def test_fuzz_reports_a_hanging_factory_and_goes_on(user_module: Path) -> None:
    mod = load_user(user_module)
    config = tight_config()
    started = time.monotonic()
    finding = check_case(mod.hangs, config, GROWING, limits=RunLimits(seconds=0.5))
    assert finding is not None and finding.invariant == TIME_LIMIT
    assert "the factory did not end within its wall-clock limit of 0.5 s" in finding.message
    # The whole campaign stops at the first one, unshrunk.
    result = fuzz(mod.hangs, examples=20, limits=RunLimits(seconds=0.3))
    assert result.finding is not None and result.finding.invariant == TIME_LIMIT
    assert result.runs < 20  # neither drawn on nor shrunk past the first
    assert time.monotonic() - started < 10


class Thrashes(ReferenceScheduler):
    """Preempts every running request in every step: the next step admits them again,
    so every step moves, and a prompt longer than the token budget never completes."""

    def running_pass(self, plan: StepPlan) -> None:
        for r in list(self.running):
            self.running.remove(r)
            plan.preempted.append(self.preempt(r))


def test_fuzz_reports_a_run_past_its_step_bound() -> None:
    """A scheduler going round in circles (moving, never ending) is cut at its bound
    and reported, never passed as an incomplete trace."""
    config = tight_config(num_gpu_blocks=16, max_num_batched_tokens=16)
    work = tuple(validate([WorkItem("r0", 0, 40, 2, 2)]))
    knobs = get_profile("vllm-v1").knobs
    finding = check_case(lambda c: Thrashes(c, knobs), config, work)
    assert finding is not None and finding.invariant == "progress"
    bound = step_bound(config, work)
    assert finding.message == (f"SHOULD progress at step {bound - 1}: the run did not end "
                               f"within its step bound of {bound} steps (four times the "
                               "tokens its workload can need): 1 request is still live")
    with pytest.raises(SpecViolation, match="did not end within its step bound"):
        wrap(Thrashes(config, knobs)).run(work)


def test_diff_bounds_each_run_by_its_workload_and_says_so_first() -> None:
    """Without --max-steps, diff bounds a run as fuzz does (step_bound): a side going round
    in circles is stuck there, and the report says so before anything else."""
    config = tight_config(num_gpu_blocks=16, max_num_batched_tokens=16)
    work = tuple(validate([WorkItem("r0", 0, 40, 2, 2), WorkItem("r1", 3, 8, 2, 2)]))
    a = simulated("vllm-v1", reference_scheduler("vllm-v1", config), work, {"name": "a"})
    b = simulated("thrashes", Thrashes(config, get_profile("vllm-v1").knobs), work,
                  {"name": "b"})
    result = diff_streams(a, b)
    bound = step_bound(config, work)
    assert result.a.stopped is None and result.b.stopped == Stop(
        f"the run did not end within its step bound of {bound} steps (four times the "
        "tokens its workload can need): 2 requests are still live", stuck=True)
    assert result.stuck
    text = io.StringIO()
    render_text(result, Console(file=text, width=200))
    lines = text.getvalue().splitlines()
    assert lines[1].startswith("B stopped early: the run did not end within its step bound")
    assert lines[2].startswith("first divergence at step ")


def test_the_plugin_raises_on_a_deadlock(user_module: Path) -> None:
    mod = load_user(user_module)
    config = tight_config()
    for factory in (mod.make, SEEDED_BUGS["never-preempts"].factory):
        checked = wrap(factory, config)
        started = time.monotonic()
        with pytest.raises(SpecViolation) as e:
            checked.run(GROWING)
        assert time.monotonic() - started < 10
        assert e.value.violation.invariant == "progress"
        assert str(e.value).startswith("SHOULD progress at step ")
        assert "r0 is running with 4 GPU blocks" in str(e.value)


def test_the_plugin_bounds_a_run_in_steps_and_time(user_module: Path) -> None:
    mod = load_user(user_module)
    config = tight_config()

    class Slow:
        def __init__(self, config: Config) -> None:
            self.inner = reference_scheduler("vllm-v1", config)
            self.config = config

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def schedule(self) -> Any:
            time.sleep(0.05)
            return self.inner.schedule()

    with pytest.raises(RunTooLong, match=r"did not end within its wall-clock limit of 0.2 s"):
        wrap(Slow(config)).run(GROWING, time_limit=0.2)
    # A cap the caller chose stops the run quietly (an incomplete trace).
    records = wrap(mod.make, config).run(GROWING, max_steps=3)
    assert len(records) == 3


def test_diff_reports_the_stuck_side(user_module: Path) -> None:
    out_b = user_module / "b.jsonl"
    started = time.monotonic()
    got = kvsched("diff", "vllm-v1", "my_engine:make", "--out-b", str(out_b),
                  cwd=user_module)
    assert time.monotonic() - started < 60
    assert got.returncode == 1, got.stderr
    assert "B stopped early: stuck at step " in got.stdout
    assert "nothing was scheduled, preempted, swapped in or finished" in got.stdout
    as_json = kvsched("diff", "vllm-v1", "my_engine:make", "--format", "json",
                      cwd=user_module)
    result = json.loads(as_json.stdout)
    assert result["stuck"] is True and result["b"]["stuck"] is True
    assert result["b"]["violations"]["progress"] == 1 and "progress" not in result["a"][
        "violations"]
    # B's trace ends at the stuck step, and check --strict flags it there.
    checked = kvsched("check", "--strict", "--format", "json", str(out_b), cwd=user_module)
    assert checked.returncode == 1
    [v] = [v for v in json.loads(checked.stdout)[0]["violations"]
           if v["invariant"] == "progress"]
    assert f"stuck at step {v['step']}:" in got.stdout


def test_diff_reports_a_step_cap(user_module: Path) -> None:
    got = kvsched("diff", "vllm-v1", "vllm-v1@0.32", "--requests", "50", "--max-steps",
                  "20", cwd=user_module)
    assert "A stopped early: stopped at the step limit of 20 steps (--max-steps) with " \
        in got.stdout
    assert "B stopped early: stopped at the step limit of 20 steps" in got.stdout
