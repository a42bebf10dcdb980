"""JUnit XML of `kvsched check --junit` (and of `kvsched fuzz --junit`: fuzz_junit_xml),
for CI systems that show test reports.

One <testsuite> per trace, named by its path; in it one <testcase> per invariant id,
named by the id, with the trace path as classname:

- a MUST invariant, or `profile` (only with --profile), fails when broken: a <failure>
  whose type is the level, whose message counts the violations and names the first,
  and whose text lists the violations the checker kept (the first 20 of each id);
- a SHOULD invariant fails the same way with --strict; without it a broken SHOULD
  invariant passes (as the exit code does) and its violations go to <system-out>,
  marked as warnings;
- an invariant the trace let the checker judge only in part or not at all (no block
  ids, no free counts, no end line: the report's `unchecked`) is <skipped> with the
  reason, or an <error> when `--require` named it;
- a trace that cannot be read (malformed input) is one <testcase> named `read` with an
  <error> giving the reason; a trace that was not checked (its Ray worker died or its
  node was lost) is one <testcase> named `check` with an <error> of type `lost`;
- with a minimal reproduction written (--repro-dir), the suite's properties name its
  file, and the failure of the invariant it reproduces ends with where it is and the
  command that shows it.

Every string from a trace is escaped (kvsched.verdict.printable): XML 1.0 cannot hold
most control characters at all. The counts on <testsuite> and <testsuites> (tests,
failures, errors, skipped) follow.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvsched.spec.violation import INVARIANTS, PROFILE, SHOULD, Violation
from kvsched.verdict import Verdict, printable

if TYPE_CHECKING:
    from kvsched.fuzz import Campaign


def _violation_line(v: Violation) -> str:
    where = f", {v.request}" if v.request else ""
    numbers = f" ({v.numbers()})" if v.numbers() else ""
    return printable(f"step {v.step}{where}{numbers}: {v.message}", [v.request])


def _not_judged(name: str, case_name: str, message: str, kind: str) -> ET.Element:
    suite = ET.Element("testsuite", name=name, tests="1", failures="0", errors="1",
                       skipped="0", time="0.000")
    case = ET.SubElement(suite, "testcase", classname=name, name=case_name, time="0")
    ET.SubElement(case, "error", message=printable(message), type=kind)
    return suite


def suite_element(verdict: Verdict, *, strict: bool, profile: str | None) -> ET.Element:
    name = printable(verdict.name)
    report = verdict.report
    if verdict.lost is not None:
        return _not_judged(name, "check", verdict.not_checked(), "lost")
    if report is None:
        return _not_judged(name, "read", verdict.error or "", "malformed input")
    repro = verdict.repro if verdict.repro is not None and verdict.repro.file else None
    suite = ET.Element("testsuite", name=name)
    tests = failures = errors = skipped = 0
    for invariant, level in INVARIANTS.items():
        if level == PROFILE and profile is None:
            continue
        tests += 1
        case = ET.SubElement(suite, "testcase", classname=name, name=invariant,
                             time="0")
        count = report.counts[invariant]
        kept = [v for v in report.violations if v.invariant == invariant]
        lines = [_violation_line(v) for v in kept]
        if count > len(kept):
            lines.append(f"({count - len(kept)} more not shown)")
        if count == 0:
            reason = report.unchecked.get(invariant)
            if reason is not None and invariant in report.required:
                errors += 1
                ET.SubElement(case, "error", message=f"required but not checked in full: "
                              f"{printable(reason)}", type="coverage")
            elif reason is not None:
                skipped += 1
                ET.SubElement(case, "skipped", message=printable(reason))
            continue
        first = kept[0] if kept else None
        summary = (f"{invariant} broken {count} time{'s' if count != 1 else ''}"
                   + (f"; first at {_violation_line(first)}" if first else ""))
        if level == SHOULD and not strict:
            out = ET.SubElement(case, "system-out")
            out.text = (f"warning ({level}; fails only with --strict): {summary}\n"
                        + "\n".join(lines) + "\n")
            continue
        failures += 1
        if repro is not None and repro.invariant == invariant:
            lines.append(printable(f"minimal reproduction: {repro.file} ({repro.describe()}): "
                                   f"{repro.command}"))
        fail = ET.SubElement(case, "failure", message=summary, type=level)
        fail.text = "\n".join(lines) + "\n"
    suite.set("tests", str(tests))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("skipped", str(skipped))
    suite.set("time", f"{verdict.seconds:.3f}")
    props = ET.Element("properties")
    for key, value in (("steps", report.steps), ("requests", report.requests),
                       ("complete", str(report.complete).lower()),
                       ("profile", profile or ""), ("strict", str(strict).lower()),
                       *([("reproduction", printable(repro.file or ""))] if repro else [])):
        ET.SubElement(props, "property", name=key, value=str(value))
    suite.insert(0, props)
    return suite


def junit_xml(traces: Sequence[Verdict], *, strict: bool, profile: str | None) -> bytes:
    """The JUnit XML document (UTF-8, with declaration) for the checked traces."""
    root = ET.Element("testsuites", name="kvsched check")
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    seconds = 0.0
    for trace in traces:
        suite = suite_element(trace, strict=strict, profile=profile)
        root.append(suite)
        for key in totals:
            totals[key] += int(suite.get(key, "0"))
        seconds += trace.seconds
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("time", f"{seconds:.3f}")
    ET.indent(root)
    document = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    assert isinstance(document, bytes)
    return document + b"\n"


def fuzz_junit_xml(campaign: Campaign, scheduler: str, checked: str,
                   reproduce: str) -> bytes:
    """The JUnit XML document of a `kvsched fuzz` campaign: one <testsuite> named by the
    scheduler, one <testcase> per shard (`shard I (seed S)`): a <failure> for the shard
    that found a failure (its message, the minimal workload's reproduce command), an
    <error> of type `lost` for a shard whose Ray task was lost, <skipped> for the shards
    after the first finding (the campaign stops there)."""
    name = printable(scheduler)
    root = ET.Element("testsuites", name="kvsched fuzz")
    suite = ET.SubElement(root, "testsuite", name=name)
    props = ET.SubElement(suite, "properties")
    for key, value in (("checked", checked), ("examples", str(campaign.examples)),
                       ("runs", str(campaign.runs))):
        ET.SubElement(props, "property", name=key, value=value)
    failures = errors = skipped = 0
    ran = {o.shard.index: o for o in campaign.outcomes}
    for shard in campaign.shards:
        case = ET.SubElement(suite, "testcase", classname=name,
                             name=f"shard {shard.index} (seed {shard.seed})", time="0")
        outcome = ran.get(shard.index)
        if outcome is None:
            skipped += 1
            ET.SubElement(case, "skipped", message="not run: an earlier shard found a "
                          "failure, which ends the campaign")
        elif outcome.lost is not None:
            errors += 1
            ET.SubElement(case, "error", type="lost", message=printable(
                f"not run to its end: its Ray task was lost ({outcome.lost})"))
        elif outcome.result is not None and outcome.result.finding is not None:
            failures += 1
            finding = outcome.result.finding
            fail = ET.SubElement(case, "failure", type=finding.invariant,
                                 message=printable(finding.message))
            fail.text = (f"{len(finding.workload)} requests after shrinking, "
                         f"{outcome.result.runs} runs\n"
                         f"reproduce: {printable(reproduce)}\n")
        else:
            out = ET.SubElement(case, "system-out")
            runs = outcome.result.runs if outcome.result is not None else 0
            out.text = f"{runs} examples of {shard.examples}, no failure ({checked} checked)\n"
    counts: dict[str, int] = {"tests": len(campaign.shards), "failures": failures,
                              "errors": errors, "skipped": skipped}
    for element in (suite, root):
        for key, count in counts.items():
            element.set(key, str(count))
    suite.set("time", "0")
    ET.indent(root)
    document = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    assert isinstance(document, bytes)
    return document + b"\n"
