"""starvation (SHOULD): a waiting request passed over, for more than K steps, by later
arrivals (or lower priorities) admitted where it could have run. Both checkers tell it
alike, with its step and request; `kvsched check --strict`, `fuzz` and the pytest plugin
find the scheduler that starves; what a fair scheduler does is never told."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from kvsched.fuzz import RunLimits, fuzz
from kvsched.optimized.checker import check_trace_vectorized
from kvsched.pytest_plugin import SpecViolation, wrap
from kvsched.spec.checker import CheckOptions, Report, check_trace
from kvsched.spec.trace import TraceReader, TraceWriter
from kvsched.testing.seeded_bugs import SEEDED_BUGS

STARVING = SEEDED_BUGS["admits-newest-first"]
CONFIG = {"block_size": 4, "num_gpu_blocks": 8, "num_cpu_blocks": 0,
          "max_num_batched_tokens": 16, "max_num_seqs": 2, "max_model_len": 32,
          "chunked_prefill": True, "long_prefill_token_threshold": 0, "policy": "fcfs",
          "preemption": "recompute", "watermark_blocks": 0}


def arrival(rid: str, prompt_len: int, max_tokens: int = 8, priority: int = 0
            ) -> dict[str, Any]:
    return {"id": rid, "prompt_len": prompt_len, "max_tokens": max_tokens,
            "priority": priority}


def trace(steps: list[dict[str, Any]], **config: Any) -> bytes:
    header = {"kvsched": "trace", "version": 1, "engine": {"name": "hand"},
              "config": CONFIG | config}
    return b"".join(orjson.dumps(x) + b"\n"
                    for x in [header, *({"step": i} | s for i, s in enumerate(steps))])


def both(data: bytes, starve_steps: int) -> Report:
    """The spec checker's report, after asserting the vectorized one's is the same."""
    spec = check_trace(TraceReader(io.BytesIO(data)), CheckOptions(starve_steps=starve_steps))
    fast = check_trace_vectorized(io.BytesIO(data), starve_steps=starve_steps)
    assert spec.violations == fast.violations and spec.counts == fast.counts
    return spec


# r0 holds one seat; r1 waits beside it from step 0; r2 (step 1) and r3 (step 4), later
# arrivals, take the free seat in turn while r1, a 4-token prompt, would fit there.
PASSED_OVER: list[dict[str, Any]] = [
    {"arrivals": [arrival("r0", 4, 4), arrival("r1", 4)], "scheduled": [["r0", 4]]},
    {"arrivals": [arrival("r2", 4)], "scheduled": [["r0", 1], ["r2", 4]]},
    {"scheduled": [["r0", 1], ["r2", 1]]},
    {"scheduled": [["r0", 1], ["r2", 1]], "finished": ["r0"]},
    {"arrivals": [arrival("r3", 4)], "scheduled": [["r2", 1], ["r3", 4]]},
]


def test_a_request_passed_over_past_k_steps_is_told_with_its_step_and_request() -> None:
    report = both(trace(PASSED_OVER), starve_steps=2)
    [v] = report.violations
    assert (v.invariant, v.level, v.step, v.request) == ("starvation", "SHOULD", 4, "r1")
    assert (v.lhs, v.relation, v.rhs) == (3, "<=", 2)
    assert "first at step 1" in v.message and "r3" in v.message
    # K steps exactly is no violation yet.
    assert both(trace(PASSED_OVER), starve_steps=3).counts == {}


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_the_compiled_state_finds_the_request_passed_over_in_a_state_saved_into_it(
        policy: str) -> None:
    """The compiled state keeps its waiting requests in rank order, to walk only those
    ranked before an admission; a state that was saved into (the fast checker's copy at
    a run's start, which moves again when a later step is not clean) makes that order
    again before it moves: it sends the steps that pass r1 over (1 and 4) to the spec's
    checker, as the state that moved through the lines itself does."""
    from kvsched.spec.checker import Checker
    from kvsched.spec.trace import parse_header, parse_step

    state = pytest.importorskip("kvsched.optimized.state")
    lines = trace(PASSED_OVER, policy=policy).splitlines()
    config = parse_header(orjson.loads(lines[0])).config
    objs = [orjson.loads(x) for x in lines[1:]]
    spec = Checker(config, CheckOptions(starve_steps=0))
    for at, obj in enumerate(objs):
        # The state before step `at`, as the spec's checker hands it over.
        moving = state.FastState(config, 8, True, spec.state.status_of)
        saved_into = state.FastState(config, 8, True, spec.state.status_of)
        moving.restore(spec.position())
        moving.save(saved_into)
        passes_over = at in (1, 4)
        assert bool(saved_into.apply(obj, at + 2)) is not passes_over
        assert bool(moving.apply(obj, at + 2)) is not passes_over
        spec.step(parse_step(obj, at + 2))
    assert [(v.invariant, v.request) for v in spec.report.violations] == [
        ("starvation", "r1")]


def test_a_later_request_that_takes_room_the_earlier_could_not_use_passes_no_one() -> None:
    # Without chunked prefill r1's 16-token prompt needs 4 blocks at once: in a 5-block
    # cache the later r2 and r3 are admitted, but r1 would not fit in their place.
    steps = [dict(s) for s in PASSED_OVER]
    steps[0] = {"arrivals": [arrival("r0", 4, 4), arrival("r1", 16)],
                "scheduled": [["r0", 4]]}
    assert both(trace(steps, chunked_prefill=False, max_model_len=16, num_gpu_blocks=5),
                starve_steps=1).counts == {}


def test_under_priority_a_lower_priority_admission_passes_over_and_a_higher_one_does_not(
        ) -> None:
    def steps(late_priority: int) -> list[dict[str, Any]]:
        # r1 (priority 5) waits from step 0; later arrivals of `late_priority` go first.
        out = [dict(s) for s in PASSED_OVER]
        out[0] = {"arrivals": [arrival("r0", 4, 4), arrival("r1", 4, 8, 5)],
                  "scheduled": [["r0", 4]]}
        out[1] = {"arrivals": [arrival("r2", 4, 8, late_priority)],
                  "scheduled": [["r0", 1], ["r2", 4]]}
        out[4] = {"arrivals": [arrival("r3", 4, 8, late_priority)],
                  "scheduled": [["r2", 1], ["r3", 4]]}
        return out

    lower = both(trace(steps(9), policy="priority"), starve_steps=2)
    assert [(v.invariant, v.step, v.request) for v in lower.violations] == \
        [("starvation", 4, "r1")]
    assert both(trace(steps(0), policy="priority"), starve_steps=1).counts == {}


def test_sglang_steps_are_not_judged_and_say_so() -> None:
    report = both(trace(PASSED_OVER, step_mix="prefill_or_decode"), starve_steps=1)
    assert "starvation" not in report.counts
    assert "SGLang" in report.unchecked["starvation"]


def starving_trace(path: Path) -> Path:
    with path.open("wb") as f:
        writer = TraceWriter(f)
        writer.header(STARVING.config, {"name": "seeded", "version": STARVING.name})
        for rec in STARVING.simulate():
            writer.step(rec)
        writer.end()
    return path


@pytest.mark.parametrize("checker", ["spec", "vectorized"])
def test_check_warns_fails_when_strict_and_takes_k(tmp_path: Path, checker: str) -> None:
    path = starving_trace(tmp_path / "starving.jsonl")

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kvsched", "check", "--checker",
                               checker, *args, str(path)], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)

    assert check().returncode == 0  # a SHOULD: a warning
    strict = check("--strict", "--format", "json")
    assert strict.returncode == 1, strict.stderr
    [verdict] = json.loads(strict.stdout)
    first = verdict["violations"][0]
    assert (first["invariant"], first["request"]) == ("starvation", "r1")
    assert first["step"] - 100 > int(first["message"].split("first at step ")[1].split(")")[0])
    # A K above the longest wait: clean.
    assert check("--strict", "--starve-steps", "1000").returncode == 0


def test_fuzz_finds_the_starving_scheduler(tmp_path: Path) -> None:
    # One seat makes a pass over likely; K = 2 makes it starvation in a few steps.
    result = fuzz(STARVING.factory, examples=30, seed=0, strict=True,
                  pinned={"max_num_seqs": 1}, limits=RunLimits(starve_steps=2))
    assert result.finding is not None and result.finding.invariant == "starvation"
    assert "has been passed over for 3 steps" in result.finding.message
    # The command line: --starve-steps is fuzz's K.
    (tmp_path / "starving_engine.py").write_text(
        "from kvsched.testing.seeded_bugs import SEEDED_BUGS\n"
        "make = SEEDED_BUGS['admits-newest-first'].factory\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    cli = subprocess.run([sys.executable, "-m", "kvsched", "fuzz", "starving_engine:make",
                          "--strict", "--starve-steps", "2", "--max-num-seqs", "1",
                          "--examples", "30",
                          "--out", str(tmp_path / "min.jsonl")],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert cli.returncode == 1, cli.stdout + cli.stderr
    assert "SHOULD starvation at step" in cli.stdout


def test_the_pytest_plugin_raises_on_the_starving_scheduler() -> None:
    checked = wrap(STARVING.factory, STARVING.config, strict=True)
    with pytest.raises(SpecViolation, match="starvation") as caught:
        checked.run(STARVING.workload)
    assert caught.value.violation.request == "r1"
    # Not strict: a warning in the report, and the run ends.
    quiet = wrap(STARVING.factory, STARVING.config)
    quiet.run(STARVING.workload)
    assert quiet.report.counts["starvation"] >= 1


DATA = Path(__file__).parent / "data"
KEPT_VLLM = sorted([*DATA.glob("vllm-v0/*.jsonl"), *DATA.glob("vllm-releases/vllm-*.jsonl"),
                    *DATA.glob("side-by-side/*-vllm.jsonl.gz")])


def test_the_kept_vllm_traces_starve_no_one() -> None:
    """vLLM v1 (0.32, 0.33, and the side-by-side recordings) and V0 admit in rank order,
    but for what their preemptions put back (and V0's priority queue, sorted only in some
    steps): no request is passed over for long."""
    from kvsched.inputs import open_trace
    from kvsched.spec.checker import Checker

    assert len(KEPT_VLLM) >= 20
    for path in KEPT_VLLM:
        with open_trace(str(path)) as stream:
            reader = TraceReader(stream)
            report = Checker(reader.header.config, CheckOptions(starve_steps=10), None,
                             reader.header.preempted_order).run_trace(reader)
        assert "starvation" not in report.counts, path
