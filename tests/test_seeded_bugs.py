"""The checker catches each planted fault (kvsched.testing.seeded_bugs), with the right invariant
id as its first report, while the correct reference on the same config and workload
draws nothing: no MUST, no SHOULD, no divergence from its own profile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvsched.conformance import check_profile
from kvsched.reference.scheduler import ReferenceScheduler
from kvsched.spec import INVARIANTS, MUST, PROFILE, SHOULD, Scheduler, Violation, check_steps
from kvsched.spec.model import StepRecord
from kvsched.spec.trace import TraceWriter
from kvsched.testing.seeded_bugs import SEEDED_BUGS, SeededBug

# The first twelve faults, each with the invariant that must flag it.
FIRST_TWELVE = {
    "floor-blocks-needed": "block-ids",
    "over-admit-by-one-block": "kv-budget",
    "token-budget-off-by-one": "token-budget",
    "seq-limit-ignored": "seq-limit",
    "victim-blocks-not-freed": "preempt",
    "finished-blocks-not-freed": "finish",
    "swapped-scheduled-without-swap-in": "one-state",
    "waiting-request-preempted": "preempt",
    "feasible-request-rejected": "reject",
    "admits-after-preempt": "profile",
    "tail-victim-under-priority": "profile",
    "recompute-keeps-computed": "preempt",
}
NAMES = sorted(SEEDED_BUGS)


def ids(violations: list[Violation]) -> list[str]:
    return [v.invariant for v in violations]


def test_registry_covers_the_first_twelve_and_more() -> None:
    assert {n: SEEDED_BUGS[n].expected for n in FIRST_TWELVE} == FIRST_TWELVE
    assert len(SEEDED_BUGS) > len(FIRST_TWELVE)
    assert all(name == bug.name for name, bug in SEEDED_BUGS.items())


@pytest.mark.parametrize("name", NAMES)
def test_bug_is_one_planted_fault_in_the_reference(name: str) -> None:
    bug = SEEDED_BUGS[name]
    assert INVARIANTS[bug.expected] == bug.level
    assert bug.config.problems() == []
    scheduler = bug.factory(bug.config)
    assert isinstance(scheduler, Scheduler) and isinstance(scheduler, ReferenceScheduler)
    assert type(scheduler) is not ReferenceScheduler
    assert scheduler.config == bug.config  # the fault is in the decisions, not the header
    assert bug.description


def buggy_trace(bug: SeededBug) -> list[StepRecord]:
    records = bug.simulate()
    assert records, f"{bug.name}: the buggy engine ran no step"
    return records


@pytest.mark.parametrize("name", NAMES)
def test_checker_reports_the_expected_invariant_first(name: str) -> None:
    bug = SEEDED_BUGS[name]
    records = buggy_trace(bug)
    # The engine stops after the workload or max_steps and writes its end line.
    report = check_steps(bug.config, records, complete=True)
    if bug.level == PROFILE:
        # Legal under the spec: nothing at all; only the profile replay sees it.
        assert report.counts == {}, report.violations
        found = check_profile(bug.config, records, bug.profile)
        assert ids(found) == ["profile"]
        assert f"first divergence from {bug.profile}" in found[0].message
        return
    assert bug.expected in report.counts, (bug.name, report.counts)
    first = report.violations[0]
    assert first.invariant == bug.expected, (bug.name, first)
    if bug.level == SHOULD:
        assert report.errors() == 0, report.violations  # a liveness fault, no safety one
    else:
        assert bug.level == MUST and report.errors() > 0


@pytest.mark.parametrize("name", NAMES)
def test_reference_is_clean_on_the_same_config_and_workload(name: str) -> None:
    bug = SEEDED_BUGS[name]
    reference = bug.reference()
    records = bug.simulate(reference)
    assert not reference.has_unfinished(), "the reference must finish within max_steps"
    report = check_steps(bug.config, records, complete=True)
    assert report.violations == []
    assert check_profile(bug.config, records, bug.profile) == []
    # And the bug really changes the trace of this workload (decisions, blocks or counts).
    assert records != buggy_trace(bug)


def write_trace(bug: SeededBug, path: Path, records: list[StepRecord] | None = None) -> Path:
    """The bug's trace (or `records`) as a complete trace v1 file."""
    with path.open("wb") as f:
        writer = TraceWriter(f)
        writer.header(bug.config, {"name": "seeded", "version": bug.name})
        for rec in buggy_trace(bug) if records is None else records:
            writer.step(rec)
        writer.end()
    return path


def kvsched_check(*args: str) -> tuple[int, list[dict[str, object]]]:
    done = subprocess.run([sys.executable, "-m", "kvsched", "check", "--format", "json", *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.mark.parametrize("name", ["over-admit-by-one-block", "victim-blocks-not-freed",
                                  "swapped-scheduled-without-swap-in",
                                  "recompute-keeps-computed"])
def test_cli_check_fails_a_written_trace_of_a_must_bug(name: str, tmp_path: Path) -> None:
    bug = SEEDED_BUGS[name]
    trace = write_trace(bug, tmp_path / f"{name}.jsonl")
    code, results = kvsched_check(str(trace))
    assert code == 1
    [result] = results
    assert result["ok"] is False
    first = result["violations"][0]  # type: ignore[index]
    assert first["invariant"] == bug.expected
    done = subprocess.run([sys.executable, "-m", "kvsched", "check", str(trace)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and bug.expected in done.stdout


@pytest.mark.parametrize("name", [n for n in NAMES if SEEDED_BUGS[n].level == SHOULD])
def test_cli_check_warns_on_a_should_bug_and_fails_it_when_strict(name: str,
                                                                  tmp_path: Path) -> None:
    bug = SEEDED_BUGS[name]
    trace = write_trace(bug, tmp_path / f"{name}.jsonl")
    code, [result] = kvsched_check(str(trace))
    assert code == 0 and result["errors"] == 0 and result["warnings"] > 0  # type: ignore[operator]
    code, [result] = kvsched_check("--strict", str(trace))
    assert code == 1
    assert result["violations"][0]["invariant"] == bug.expected  # type: ignore[index]
    # The reference on the same config and workload passes even --strict.
    clean = write_trace(bug, tmp_path / "reference.jsonl", bug.simulate(bug.reference()))
    code, [result] = kvsched_check("--strict", str(clean))
    assert code == 0 and result["violations"] == []


def test_a_needless_preemption_has_a_seeded_bug() -> None:
    bug = SEEDED_BUGS["preempts-at-exact-fit"]
    assert (bug.expected, bug.level) == ("needed-preemption", SHOULD)
    records = bug.simulate()
    [step] = [r.step for r in records if r.preempted]  # one preemption, needless
    report = check_steps(bug.config, records, complete=True)
    assert [(v.invariant, v.step) for v in report.violations] == [("needed-preemption", step)]


def test_cli_check_with_profile_reports_the_divergence(tmp_path: Path) -> None:
    bug = SEEDED_BUGS["tail-victim-under-priority"]
    trace = write_trace(bug, tmp_path / "victim.jsonl")
    code, [result] = kvsched_check(str(trace))
    assert code == 0 and result["counts"] == {}
    code, [result] = kvsched_check("--profile", bug.profile, "--strict", str(trace))
    assert code == 1
    assert result["counts"] == {"profile": 1}
