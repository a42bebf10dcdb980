"""kvsched check --junit: one testsuite per trace, one testcase per invariant id; MUST
and profile violations fail, SHOULD ones fail only with --strict (else they pass with a
warning in system-out), invariants a trace cannot exercise are skipped with the reason,
and the file is written whole or not at all."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from kvsched.junit import junit_xml
from kvsched.spec import check_steps
from kvsched.spec.model import StepRecord
from kvsched.spec.trace import TraceWriter
from kvsched.spec.violation import INVARIANTS, MUST, SHOULD
from kvsched.testing.seeded_bugs import SEEDED_BUGS
from kvsched.verdict import Verdict


def kvsched(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, timeout=120)


def write_trace(path: Path, name: str, *, reference: bool = False,
                complete: bool = True) -> Path:
    bug = SEEDED_BUGS[name]
    records = bug.simulate(bug.reference() if reference else None)
    with path.open("wb") as f:
        writer = TraceWriter(f)
        writer.header(bug.config)
        for rec in records:
            writer.step(rec)
        if complete:
            writer.end()
    return path


def cases(suite: ET.Element) -> dict[str, ET.Element]:
    return {c.get("name", ""): c for c in suite.iter("testcase")}


def outcome(case: ET.Element) -> str:
    for tag in ("failure", "skipped"):
        if case.find(tag) is not None:
            return tag
    return "passed"


def test_a_clean_trace_passes_every_invariant(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "clean.jsonl", "over-admit-by-one-block", reference=True)
    out = tmp_path / "report.xml"
    result = kvsched("check", str(trace), "--junit", str(out))
    assert result.returncode == 0, result.stderr
    root = ET.parse(out).getroot()
    assert root.tag == "testsuites"
    [suite] = root.findall("testsuite")
    assert suite.get("name") == str(trace)
    got = cases(suite)
    # Every MUST and SHOULD id; no profile testcase without --profile.
    assert list(got) == [i for i, level in INVARIANTS.items() if level in (MUST, SHOULD)]
    assert {outcome(c) for c in got.values()} == {"passed"}
    assert all(c.get("classname") == str(trace) for c in got.values())
    tests = str(len(got))  # 18: the 12 MUST and 6 SHOULD ids
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == (tests, "0", "0")
    assert root.get("tests") == tests and root.get("failures") == "0"
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["complete"] == "true" and props["strict"] == "false"
    assert props["steps"] == str(len(SEEDED_BUGS["over-admit-by-one-block"].simulate(
        SEEDED_BUGS["over-admit-by-one-block"].reference())))


def test_a_must_violation_is_a_failure_with_its_messages(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "bug.jsonl", "over-admit-by-one-block")
    out = tmp_path / "report.xml"
    result = kvsched("check", str(trace), "--junit", str(out))
    assert result.returncode == 1
    [suite] = ET.parse(out).getroot().findall("testsuite")
    got = cases(suite)
    failure = got["kv-budget"].find("failure")
    assert failure is not None and failure.get("type") == MUST
    report = check_steps(SEEDED_BUGS["over-admit-by-one-block"].config,
                         SEEDED_BUGS["over-admit-by-one-block"].simulate(), complete=True)
    [v] = [v for v in report.violations if v.invariant == "kv-budget"]
    assert failure.get("message") == (f"kv-budget broken 1 time; first at step {v.step}"
                                      f" ({v.numbers()}): {v.message}")
    assert failure.text == f"step {v.step} ({v.numbers()}): {v.message}\n"
    failed = {name for name, c in got.items() if outcome(c) == "failure"}
    assert failed == set(report.counts)
    assert suite.get("failures") == str(len(failed))


def test_should_warnings_fail_only_with_strict(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "idle.jsonl", "admission-needs-spare-block")
    lax, strict = tmp_path / "lax.xml", tmp_path / "strict.xml"
    assert kvsched("check", str(trace), "--junit", str(lax)).returncode == 0
    assert kvsched("check", str(trace), "--strict", "--junit", str(strict)).returncode == 1
    case = cases(ET.parse(lax).getroot())["no-idle"]
    assert outcome(case) == "passed"
    note = case.findtext("system-out") or ""
    assert note.startswith("warning (SHOULD; fails only with --strict): no-idle broken 10 "
                           "times; first at step 0")
    case = cases(ET.parse(strict).getroot())["no-idle"]
    failure = case.find("failure")
    assert failure is not None and failure.get("type") == SHOULD
    assert (failure.text or "").count("\n") == 10


def test_profile_adds_a_testcase_that_fails_on_divergence(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "admits.jsonl", "admits-after-preempt")
    out = tmp_path / "report.xml"
    assert kvsched("check", str(trace), "--profile", "vllm-v1", "--junit",
                   str(out)).returncode == 1
    case = cases(ET.parse(out).getroot())["profile"]
    failure = case.find("failure")
    assert failure is not None and failure.get("type") == "PROFILE"
    assert "first divergence from vllm-v1" in (failure.get("message") or "")


def test_what_a_trace_cannot_exercise_is_skipped_with_the_reason() -> None:
    bug = SEEDED_BUGS["over-admit-by-one-block"]
    records = [StepRecord(r.step, r.arrivals, r.aborted, r.rejected, r.preempted,
                          r.swapped_in, r.scheduled, r.finished)  # no free_blocks, no ids
               for r in bug.simulate(bug.reference())]
    report = check_steps(bug.config, records, complete=False)
    assert set(report.unchecked) == {"block-ids", "accounting", "completion"}
    root = ET.fromstring(junit_xml([Verdict("bare", report)], strict=True,
                                   profile=None))
    got = cases(root)
    skipped = {name: skip.get("message") for name, c in got.items()
               if (skip := c.find("skipped")) is not None}
    assert set(skipped) == {"block-ids", "accounting", "completion"}
    assert "no block ids (new_blocks)" in str(skipped["block-ids"])
    assert "no free_blocks" in str(skipped["accounting"])
    assert 'no {"end": true} line' in str(skipped["completion"])
    assert root.get("skipped") == "3" and root.get("failures") == "0"


def test_several_traces_make_several_suites_and_totals(tmp_path: Path) -> None:
    a = write_trace(tmp_path / "a.jsonl", "seq-limit-ignored")
    b = write_trace(tmp_path / "b.jsonl", "seq-limit-ignored", reference=True)
    out = tmp_path / "report.xml"
    assert kvsched("check", str(a), str(b), "--junit", str(out)).returncode == 1
    root = ET.parse(out).getroot()
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == [str(a), str(b)]
    assert root.get("tests") == str(2 * sum(level in (MUST, SHOULD)
                                           for level in INVARIANTS.values()))
    assert root.get("failures") == str(sum(int(s.get("failures", "")) for s in suites))
    assert suites[1].get("failures") == "0" and suites[0].get("failures") != "0"


def test_a_malformed_trace_is_an_error_case_beside_the_good_ones(tmp_path: Path) -> None:
    good = write_trace(tmp_path / "good.jsonl", "seq-limit-ignored", reference=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    out = tmp_path / "report.xml"
    result = kvsched("check", str(good), str(bad), "--junit", str(out))
    assert result.returncode == 2  # the worst of the verdicts: malformed input
    assert result.stderr == f"kvsched: error: {bad}: line 1: malformed JSON: expected one " \
                            "JSON object per line\n"
    assert f"OK {good}" in result.stdout  # the good trace still gets its verdict
    root = ET.fromstring(out.read_bytes())
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert suites[str(good)].get("errors") == "0" and suites[str(good)].get("failures") == "0"
    [case] = suites[str(bad)].iter("testcase")
    error = case.find("error")
    assert case.get("name") == "read" and error is not None
    assert "malformed JSON" in (error.get("message") or "")
    assert root.get("errors") == "1"
    assert not list(tmp_path.glob("*.part"))


def test_nothing_is_written_on_bad_options(tmp_path: Path) -> None:
    good = write_trace(tmp_path / "good.jsonl", "seq-limit-ignored", reference=True)
    out = tmp_path / "report.xml"
    result = kvsched("check", str(good), "--require", "bogus", "--junit", str(out))
    assert result.returncode == 2 and "--require: unknown invariant 'bogus'" in result.stderr
    assert not out.exists() and not list(tmp_path.glob("*.part"))
    out.mkdir()
    result = kvsched("check", str(good), "--junit", str(out))
    assert result.returncode == 2
    assert result.stderr == f"kvsched: error: {out}: is a directory; expected a file to write\n"
