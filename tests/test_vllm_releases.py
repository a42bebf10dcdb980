"""vLLM 0.32 and 0.33, each driven for real on one workload (tests/data/vllm-releases/,
recorded by `make vllm-release-traces` in each release's own environment): each trace
is MUST-clean and exact under its release's profile, and the two part exactly where
0.33 changed the rule, at the step where the lowest-priority running request preempts
itself and 0.33 goes on to the requests after it while 0.32 stops."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kvsched.conformance import checker
from kvsched.reference.scheduler import ReferenceScheduler
from kvsched.spec.model import StepRecord
from kvsched.spec.profiles import get_profile, pinned_profile
from kvsched.spec.replay import ProfileReplay
from kvsched.spec.state import State
from kvsched.spec.trace import Header, TraceReader

DATA = Path(__file__).resolve().parent / "data" / "vllm-releases"


def read(release: str) -> tuple[Header, list[StepRecord]]:
    with (DATA / f"vllm-{release}.jsonl").open("rb") as f:
        reader = TraceReader(f)
        records = list(reader)
        assert reader.complete
        return reader.header, records


def first_divergence(release: str, profile: str, continues: bool | None = None
                     ) -> int | None:
    """Where the trace of `release` first parts from `profile` (with the running pass's
    rule on self-preemption set to `continues` when given)."""
    header, records = read(release)
    knobs = get_profile(profile).knobs
    if continues is not None:
        knobs = replace(knobs, continue_after_self_preemption=continues)
    scheduler = ReferenceScheduler(header.config, knobs)
    replay = ProfileReplay(profile, scheduler)
    return next((r.step for r in records if replay.step(r) is not None), None)


@pytest.mark.parametrize("release", ["0.32", "0.33"])
def test_each_release_is_exact_under_its_own_profile(release: str) -> None:
    header, records = read(release)
    assert header.engine == {"name": "vllm", "version": f"{release}.0"}
    profile = pinned_profile("vllm-v1", "vllm", header.engine["version"])
    assert profile == f"vllm-v1@{release}"
    check = checker(header.config, profile=profile, preempted_order=header.preempted_order)
    for rec in records:
        check.step(rec)
    report = check.end(True)
    assert report.counts == {} and report.unchecked == {}
    assert sum(len(r.preempted) for r in records) > 0 and any(r.prefix_hits for r in records)


def test_vllm_v1_names_the_newest_release() -> None:
    assert get_profile("vllm-v1").knobs == get_profile("vllm-v1@0.33").knobs
    assert first_divergence("0.33", "vllm-v1") is None


def test_the_releases_part_exactly_where_the_rule_changed() -> None:
    step = first_divergence("0.33", "vllm-v1@0.32")
    assert step is not None
    # Either trace under the other release's profile: the same step.
    assert first_divergence("0.32", "vllm-v1@0.33") == step
    # And the profiles with the one knob flipped take each other's place exactly.
    assert first_divergence("0.33", "vllm-v1@0.32", continues=True) is None
    assert first_divergence("0.32", "vllm-v1@0.33", continues=False) is None

    (_, old), (_, new) = read("0.32"), read("0.33")

    def same(a: StepRecord, b: StepRecord) -> bool:
        return replace(a, time_ms=None) == replace(b, time_ms=None)

    assert all(same(a, b) for a, b in zip(old[:step], new[:step], strict=True))
    a, b = old[step], new[step]
    assert not same(a, b)
    # The state both releases decided on.
    state = State(read("0.32")[0].config)
    order: dict[str, int] = {}
    for rec in old[:step]:
        state.apply(rec)
        for r in rec.arrivals:
            order.setdefault(r.id, len(order))
    state = state.after_inputs(a)
    running = {rid: t for rid, t in state.live.items() if t.status == "running"}
    # Both preempted the same victims, the last the lowest-priority running request:
    # the request whose blocks did not fit, preempting itself.
    assert a.preempted == b.preempted and a.preempted
    last = a.preempted[-1].id
    assert last == max(running, key=lambda rid: (running[rid].request.priority, order[rid]))
    assert last not in dict(a.scheduled) and last not in dict(b.scheduled)
    # 0.32 stopped there; 0.33 went on to running requests after it, which fit.
    assert set(dict(a.scheduled)) < set(dict(b.scheduled))
    assert {rid for rid, _ in b.scheduled} - {rid for rid, _ in a.scheduled} <= set(running)
    assert not a.arrivals or a.arrivals == b.arrivals


def test_kvsched_diff_names_the_step_and_the_state_before_it(tmp_path: Path) -> None:
    step = first_divergence("0.33", "vllm-v1@0.32")
    proc = subprocess.run([sys.executable, "-m", "kvsched", "diff",
                           str(DATA / "vllm-0.32.jsonl"), str(DATA / "vllm-0.33.jsonl")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stderr
    assert f"first divergence at step {step}: decision" in proc.stdout
    assert "state before  free GPU blocks" in proc.stdout
    assert "preemptions" in proc.stdout and "delta = B - A" in proc.stdout


def test_check_says_which_profile_follows_the_traces_release() -> None:
    def check(profile: str, release: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kvsched", "check", "--profile", profile,
                               str(DATA / f"vllm-{release}.jsonl")],
                              capture_output=True, text=True, check=False)

    old = check("vllm-v1", "0.32")
    assert old.returncode == 1 and "first at step" in old.stdout
    assert old.stderr.strip() == (
        f"kvsched: note: {DATA / 'vllm-0.32.jsonl'} was recorded by vllm 0.32.0, whose "
        "profile is vllm-v1@0.32 (vllm-v1 follows another release)")
    for profile, release in (("vllm-v1", "0.33"), ("vllm-v1@0.32", "0.32"),
                             ("vllm-v1@0.33", "0.33")):
        proc = check(profile, release)
        assert proc.returncode == 0 and proc.stderr == "", (profile, release, proc.stderr)
