"""kvsched check --repro-dir: a failing trace's minimal reproduction is its shortest
prefix that fails the same way, a real trace that kvsched check flags with the same
invariant at the same step; the reports say where it is; a violation that only the end
line shows keeps the whole trace; nothing is written for clean traces or bad options."""

from __future__ import annotations

import gzip
import json
import shlex
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvsched.repro import file_name
from kvsched.testing.seeded_bugs import SEEDED_BUGS
from kvsched.testing.trace_sets import BROKEN, write_trace


def first_failing(verdict: dict[str, Any]) -> tuple[str, int]:
    failing = [v for v in verdict["violations"] if v["level"] != "SHOULD"]
    first = min(failing, key=lambda v: v["step"])
    return first["invariant"], first["step"]


@pytest.mark.parametrize("bug", BROKEN)
def test_the_reproduction_is_the_shortest_failing_prefix(bug: str, tmp_path: Path,
                                                         cli: Callable[..., Any]) -> None:
    trace = write_trace(tmp_path / "runs" / f"{bug}.jsonl.gz", bug)
    repro_dir = tmp_path / "repro"
    ran = cli("check", str(trace), "--format", "json", "--repro-dir", str(repro_dir))
    assert ran.exit_code == 1
    [verdict] = json.loads(ran.stdout)
    invariant, step = first_failing(verdict)
    assert invariant == SEEDED_BUGS[bug].expected
    repro = verdict["repro"]
    assert (repro["invariant"], repro["step"], repro["steps"]) == (invariant, step, step + 1)
    assert not repro["whole_trace"] and step + 1 < verdict["steps"]
    path = Path(repro["file"])
    assert path == repro_dir / file_name(str(trace)) and path.name == f"{bug}.jsonl"
    # A real trace: the original's header and first steps, byte for byte, no end line.
    original = gzip.decompress(trace.read_bytes()).splitlines(keepends=True)
    assert path.read_bytes().splitlines(keepends=True) == original[:step + 2]
    again = cli(*shlex.split(repro["command"])[1:], "--format", "json")
    assert again.exit_code == 1
    [shown] = json.loads(again.stdout)
    assert first_failing(shown) == (invariant, step) and shown["steps"] == step + 1
    # One step fewer no longer shows it.
    shorter = tmp_path / "shorter.jsonl"
    shorter.write_bytes(b"".join(original[:step + 1]))
    [none] = json.loads(cli("check", str(shorter), "--format", "json").stdout)
    assert invariant not in none["counts"]


def test_the_reports_say_where_the_reproduction_is(tmp_path: Path,
                                                   cli: Callable[..., Any]) -> None:
    trace = write_trace(tmp_path / "over.jsonl", "over-admit-by-one-block")
    clean = write_trace(tmp_path / "clean.jsonl", "over-admit-by-one-block", reference=True)
    junit, repro_dir = tmp_path / "report.xml", tmp_path / "repro"
    ran = cli("check", str(trace), str(clean), "--repro-dir", str(repro_dir), "--junit",
              str(junit))
    written = repro_dir / file_name(str(trace))
    assert sorted(repro_dir.rglob("*.jsonl")) == [written]  # none for the clean trace
    command = f"kvsched check {written}"
    assert (f"  minimal reproduction: {written} (kv-budget at step 1; the header and the "
            f"first 2 of 9 steps): {command}") in ran.stdout
    suites = {s.get("name"): s for s in ET.parse(junit).getroot().iter("testsuite")}
    props = {p.get("name"): p.get("value") for p in suites[str(trace)].iter("property")}
    assert props["reproduction"] == str(written)
    assert "reproduction" not in {p.get("name") for p in suites[str(clean)].iter("property")}
    failure = next(c for c in suites[str(trace)].iter("testcase")
                   if c.get("name") == "kv-budget").find("failure")
    assert failure is not None and (failure.text or "").endswith(f"): {command}\n")


def test_the_options_that_decide_a_verdict_are_in_the_command(
        tmp_path: Path, cli: Callable[..., Any]) -> None:
    trace = write_trace(tmp_path / "admits.jsonl", "admits-after-preempt")
    ran = cli("check", str(trace), "--profile", "vllm-v1", "--max-preemptions", "3",
              "--format", "json", "--repro-dir", str(tmp_path / "r"))
    [verdict] = json.loads(ran.stdout)
    repro = verdict["repro"]
    assert repro["invariant"] == "profile" and repro["steps"] < verdict["steps"]
    args = shlex.split(repro["command"])
    assert args[:6] == ["kvsched", "check", "--profile", "vllm-v1", "--max-preemptions", "3"]
    [again] = json.loads(cli(*args[1:], "--format", "json").stdout)
    assert list(again["counts"]) == ["profile"]


def test_a_violation_the_end_line_shows_keeps_the_whole_trace(
        tmp_path: Path, cli: Callable[..., Any]) -> None:
    trace = write_trace(tmp_path / "never.jsonl", "impossible-request-never-rejected")
    ran = cli("check", str(trace), "--strict", "--format", "json", "--repro-dir",
              str(tmp_path / "r"))
    [verdict] = json.loads(ran.stdout)
    assert verdict["repro"]["invariant"] == "completion" and verdict["repro"]["whole_trace"]
    assert Path(verdict["repro"]["file"]).read_bytes() == trace.read_bytes()


def test_traces_with_one_relative_path_get_numbered_files(tmp_path: Path,
                                                          cli: Callable[..., Any]) -> None:
    a = write_trace(tmp_path / "a" / "run.jsonl", "seq-limit-ignored")
    b = write_trace(tmp_path / "b" / "run.jsonl", "seq-limit-ignored")
    ran = cli("check", str(a), str(b), str(a), "--format", "json", "--repro-dir",
              str(tmp_path / "r"))
    files = [v["repro"]["file"] for v in json.loads(ran.stdout)]
    assert files[0] != files[1] and files[2].endswith(".2.jsonl")
    assert len({Path(f).read_bytes() for f in files}) == 1


def test_a_repro_dir_that_is_a_file_is_refused_before_any_check(
        tmp_path: Path, cli: Callable[..., Any]) -> None:
    trace = write_trace(tmp_path / "t.jsonl", "seq-limit-ignored")
    taken = tmp_path / "taken"
    taken.write_text("")
    ran = cli("check", str(trace), "--repro-dir", str(taken))
    assert ran.exit_code == 2 and ran.stdout == ""
    assert ran.stderr == (f"kvsched: error: --repro-dir {taken}: is a file; expected a "
                          "directory to write reproductions in\n")
