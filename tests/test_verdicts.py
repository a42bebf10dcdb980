"""Verdicts on traces kvsched did not write: what was checked, whom the counts blame, and
odd input answered the same way by both checkers in every output format (text, JSON,
JUnit)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from kvsched.optimized.checker import check_trace_vectorized
from kvsched.spec import CheckOptions, Config, StepRecord, TraceError, TraceReader, check_trace
from kvsched.spec.checker import Report, check_steps
from kvsched.spec.model import Preemption, Request

CONFIG = {"block_size": 4, "num_gpu_blocks": 8, "num_cpu_blocks": 0,
          "max_num_batched_tokens": 32, "max_num_seqs": 4, "max_model_len": 32,
          "chunked_prefill": True, "long_prefill_token_threshold": 0, "policy": "fcfs",
          "preemption": "recompute", "watermark_blocks": 0}
CHECKERS = ("spec", "vectorized")


def arrive(rid: str, prompt: int, max_tokens: int = 4) -> dict[str, Any]:
    return {"id": rid, "prompt_len": prompt, "max_tokens": max_tokens}


def trace_bytes(*steps: Any, end: bool = True, header: dict[str, Any] | None = None,
                **config: Any) -> bytes:
    head = {"kvsched": "trace", "version": 1, "config": {**CONFIG, **config}, **(header or {})}
    lines = [json.dumps(head)] + [s if isinstance(s, str) else json.dumps(s) for s in steps]
    if end:
        lines.append('{"end": true}')
    return ("\n".join(lines) + "\n").encode()


def check_with(checker: str, data: bytes, options: CheckOptions | None = None) -> Report:
    if checker == "spec":
        return check_trace(TraceReader(io.BytesIO(data)), options)
    return check_trace_vectorized(io.BytesIO(data))


def kvsched(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


# -- block ids: checked from the first step that could be ------------------------------

NO_IDS_AT_FIRST = [
    {"step": 0, "arrivals": [arrive("a", 8), arrive("b", 4)]},  # nothing handed out yet
    {"step": 1, "scheduled": [["a", 8]], "new_blocks": {"a": [0, 1]}},
    {"step": 2, "scheduled": [["a", 1], ["b", 4]], "new_blocks": {"a": [2], "b": [1]}},
]


@pytest.mark.parametrize("checker", CHECKERS)
def test_a_first_step_without_ids_that_needed_none_does_not_stop_block_checks(
        checker: str) -> None:
    report = check_with(checker, trace_bytes(*NO_IDS_AT_FIRST, end=False))
    [v] = [v for v in report.violations if v.invariant == "block-ids"]
    assert (v.step, v.request) == (2, "b") and "gets block 1, which a still holds" in v.message
    assert "block-ids" not in report.unchecked


@pytest.mark.parametrize("checker", CHECKERS)
def test_blocks_handed_out_without_ids_leave_block_ids_checked_in_part(checker: str) -> None:
    steps = [
        {"step": 0, "arrivals": [arrive("a", 8), arrive("b", 4)], "scheduled": [["a", 8]]},
        # a's blocks are unknown; b's, and later ones, are checked against known owners.
        {"step": 1, "scheduled": [["b", 4]], "new_blocks": {"b": [5]}},
        {"step": 2, "arrivals": [arrive("c", 4)], "scheduled": [["c", 4]],
         "new_blocks": {"c": [5]}},
    ]
    report = check_with(checker, trace_bytes(*steps, end=False))
    [v] = [v for v in report.violations if v.invariant == "block-ids"]
    assert (v.step, v.request) == (2, "c") and "which b still holds" in v.message
    assert report.unchecked["block-ids"].startswith("in part: from step 0 on")


@pytest.mark.parametrize("checker", CHECKERS)
def test_coverage_names_each_invariant_a_bare_trace_cannot_exercise(checker: str) -> None:
    report = check_with(checker, trace_bytes(
        {"step": 0, "arrivals": [arrive("a", 4, 1)], "scheduled": [["a", 4]],
         "finished": ["a"]}, end=False))
    assert report.counts == {}
    assert report.unchecked == {
        "block-ids": "the trace carries no block ids (new_blocks)",
        "accounting": "the trace reports no free_blocks",
        "completion": 'the trace has no {"end": true} line'}


def test_accounting_on_some_steps_only_is_in_part() -> None:
    report = check_with("spec", trace_bytes(
        {"step": 0, "arrivals": [arrive("a", 4, 2)], "scheduled": [["a", 4]],
         "free_blocks": 7, "new_blocks": {"a": [0]}},
        {"step": 1, "scheduled": [["a", 1]], "finished": ["a"], "new_blocks": {"a": [1]}}))
    assert report.unchecked == {"accounting": "in part: 1 of 2 steps report no free_blocks"}


def test_require_fails_a_clean_trace_that_could_not_be_checked_in_full(
        tmp_path: Path) -> None:
    path = tmp_path / "bare.jsonl"
    path.write_bytes(trace_bytes({"step": 0, "arrivals": [arrive("a", 4, 1)],
                                  "scheduled": [["a", 4]], "finished": ["a"]}))
    assert kvsched("check", str(path)).returncode == 0
    result = kvsched("check", "--require", "block-ids,accounting", str(path))
    assert result.returncode == 1
    assert result.stdout.startswith(f"FAIL {path}: 1 steps")
    assert "not checked in full (required, block-ids): the trace carries no block ids" \
        in result.stdout
    junit = tmp_path / "junit.xml"
    result = kvsched("check", "--require", "accounting", "--format", "json", "--junit",
                     str(junit), str(path))
    [verdict] = json.loads(result.stdout)
    assert verdict["ok"] is False
    assert verdict["required_unchecked"] == {"accounting": "the trace reports no free_blocks"}
    cases = {c.get("name"): c for c in ET.fromstring(junit.read_bytes()).iter("testcase")}
    assert cases["accounting"].find("error") is not None
    assert cases["block-ids"].find("skipped") is not None  # not required: skipped


# -- engine mistakes are violations on both checkers -----------------------------------

@pytest.mark.parametrize("checker", CHECKERS)
@pytest.mark.parametrize("step,invariant", [
    ({"scheduled": [["ghost", 1]]}, "one-state"),
    ({"preempted": [{"id": "ghost", "mode": "recompute"}]}, "preempt"),
    ({"swapped_in": ["a"]}, "one-state"),
    ({"aborted": ["gone"]}, "one-state"),
    ({"finished": ["gone"]}, "one-state"),
    ({"arrivals": [arrive("a", 4)]}, "one-state"),
])
def test_engine_mistakes_are_violations_and_the_trace_is_still_checked(
        checker: str, step: dict[str, Any], invariant: str) -> None:
    data = trace_bytes(
        {"step": 0, "arrivals": [arrive("a", 4), arrive("gone", 4, 1)],
         "scheduled": [["a", 4], ["gone", 4]], "finished": ["gone"]},
        {"step": 1, **step},
        {"step": 2, "scheduled": [["a", 0]]}, end=False)  # token-range, after the mistake
    report = check_with(checker, data)
    assert report.counts[invariant] == 1 and report.counts["token-range"] == 1
    assert [v.step for v in report.violations if v.invariant == invariant] == [1]


@pytest.mark.parametrize("checker", CHECKERS)
def test_an_abort_before_its_arrival_is_a_one_state_violation(checker: str,
                                                              tmp_path: Path) -> None:
    # The engine cancels r4 at step 3, two steps before r4 arrives: its own mistake, told
    # where it happens, alike by both checkers (the vectorized one past a run of plain
    # steps); r4's arrival and run after it are checked as any other request's.
    steps: list[dict[str, Any]] = [
        {"step": 0, "arrivals": [arrive("a", 4, 30)], "scheduled": [["a", 4]]},
        *({"step": i, "scheduled": [["a", 1]]} for i in range(1, 12))]
    steps[3]["aborted"] = ["r4"]
    steps[5].update(arrivals=[arrive("r4", 4, 1)], scheduled=[["a", 1], ["r4", 4]],
                    finished=["r4"])
    data = trace_bytes(*steps, end=False)
    report = check_with(checker, data)
    assert report.counts == {"one-state": 1}
    [v] = report.violations
    assert (v.invariant, v.step, v.request) == ("one-state", 3, "r4")
    assert v.message == "r4 is aborted but never arrived"
    assert report.violations == check_with("spec", data).violations
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    result = kvsched("check", "--checker", checker, str(path))
    assert result.returncode == 1
    assert "MUST one-state: 1 violation, first at step 3, r4\n" in result.stdout


# -- blame --------------------------------------------------------------------------------

def test_a_shortfall_an_admission_could_explain_is_not_blamed_on_the_victim() -> None:
    # The engine reserves c's whole prompt at admission (4 blocks, not Db = 1): the free
    # count falls short in the step that also preempted b.
    records = [
        StepRecord(0, (Request("a", 8, 8), Request("b", 8, 8)), scheduled=(("a", 8), ("b", 8)),
                   free_blocks=4),
        StepRecord(1, (Request("c", 16, 4),), preempted=(Preemption("b", "recompute"),),
                   scheduled=(("a", 1), ("c", 4)), free_blocks=1),
    ]
    config = Config(block_size=4, num_gpu_blocks=8, max_num_batched_tokens=32,
                    max_num_seqs=4, max_model_len=32)
    report = check_steps(config, records, complete=False)
    assert "preempt" not in report.counts
    [v] = [v for v in report.violations if v.invariant == "accounting"]
    assert v.request is None and v.step == 1 and (v.lhs, v.rhs) == (1, 4)
    assert "b's victim (2)" in v.message and "c's allocation (1)" in v.message


# -- malformed lines: both checkers, every format ----------------------------------------

GOOD_STEP = {"step": 0, "arrivals": [arrive("a", 4, 1)], "scheduled": [["a", 4]],
             "finished": ["a"]}


@pytest.mark.parametrize("checker", CHECKERS)
@pytest.mark.parametrize("line,words", [
    ("null", "line 3: expected a step object, got null"),
    ('{"step": 1, "scheduled": [], "scheduled": []}',
     "line 3: the key 'scheduled' appears twice in one object"),
    ('{"step": 1, "new_blocks": {"a": [1], "a": [2]}}', "line 3: the key 'a' appears twice"),
    ('{"step": 1, "time_ms": NaN}', "line 3: NaN is not a JSON number"),
    ("[1, 2]", "line 3: expected a step object, got a list"),
    ("3", "line 3: expected a step object, got the number 3"),
])
def test_a_malformed_line_is_refused_wherever_it_stands(checker: str, line: str,
                                                        words: str) -> None:
    # A null line used to end the trace silently: the violation after it went unseen.
    data = trace_bytes(GOOD_STEP, line, {"step": 2, "scheduled": [["zzz", 0]]})
    with pytest.raises(TraceError) as e:
        check_with(checker, data)
    assert str(e.value).startswith(words)


@pytest.mark.parametrize("checker", CHECKERS)
def test_every_trace_gets_its_verdict_and_the_exit_code_is_the_worst(
        tmp_path: Path, checker: str) -> None:
    good = tmp_path / "good.jsonl"
    good.write_bytes(trace_bytes(GOOD_STEP))
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(trace_bytes(GOOD_STEP, "null"))
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(trace_bytes(GOOD_STEP, {"step": 1, "scheduled": [["a", 1]]}))
    junit = tmp_path / "junit.xml"
    args = ["check", "--checker", checker, str(good), str(bad), str(broken)]
    text = kvsched(*args)
    assert text.returncode == 2  # malformed beats a violation
    assert text.stdout.startswith(f"OK {good}") and f"FAIL {broken}" in text.stdout
    assert text.stderr == (f"kvsched: error: {bad}: line 3: expected a step object, got "
                           "null\n")
    result = kvsched(*args, "--format", "json", "--junit", str(junit))
    verdicts = {v["trace"]: v for v in json.loads(result.stdout)}
    assert result.returncode == 2 and set(verdicts) == {str(good), str(bad), str(broken)}
    assert verdicts[str(good)]["ok"] and not verdicts[str(broken)]["ok"]
    assert verdicts[str(bad)]["malformed"].endswith("line 3: expected a step object, got null")
    suites = {s.get("name"): s for s in ET.fromstring(junit.read_bytes()).iter("testsuite")}
    assert suites[str(bad)].get("errors") == "1" and suites[str(broken)].get("failures") == "1"
    only_good = kvsched("check", "--checker", checker, str(good), str(broken))
    assert only_good.returncode == 1


ESCAPE = "\x1b[2J\x1b[H"  # clear the screen, cursor home


@pytest.mark.parametrize("checker", CHECKERS)
def test_control_characters_from_a_trace_never_reach_the_output_raw(
        tmp_path: Path, checker: str) -> None:
    rid = f"r{ESCAPE}1"
    path = tmp_path / f"odd{chr(7)}name.jsonl"
    path.write_bytes(trace_bytes(
        {"step": 0, "arrivals": [arrive(rid, 4)], "scheduled": [[rid, 4]],
         f"x{ESCAPE}": 1, "new_blocks": {rid: [0]}},
        {"step": 1, "scheduled": [[rid, 0]], "new_blocks": {}}, end=False))
    junit = tmp_path / "junit.xml"
    for fmt in ("text", "json"):
        result = kvsched("check", "--checker", checker, "--format", fmt, "--junit",
                         str(junit), path.name, cwd=tmp_path)
        assert result.returncode == 1, result.stderr
        for stream in (result.stdout, result.stderr):
            assert "\x1b" not in stream and "\x07" not in stream
        if fmt == "text":
            assert "r\\x1b[2J\\x1b[H1" in result.stdout  # shown escaped, not dropped
            assert "x\\x1b[2J\\x1b[H (line 2)" in result.stdout  # the unknown key too
        else:
            [verdict] = json.loads(result.stdout)  # JSON escapes them itself
            assert verdict["violations"][0]["request"] == rid
        root = ET.fromstring(junit.read_bytes())  # well-formed XML
        assert "odd\\x07name.jsonl" in {s.get("name") for s in root.iter("testsuite")}


def test_unordered_victims_are_judged_without_a_last_one() -> None:
    # y (1 block) then x (3 blocks) make room for a's next 3: x was needed. Listed the
    # other way round, y looks like a last victim the step did not need.
    def steps(victims: list[str]) -> list[dict[str, Any]]:
        return [
            {"step": 0, "arrivals": [arrive("a", 24, 8), arrive("x", 12, 8),
                                     arrive("y", 4, 8)],
             "scheduled": [["a", 12], ["x", 12], ["y", 4]]},
            {"step": 1, "preempted": [{"id": v, "mode": "recompute"} for v in victims],
             "scheduled": [["a", 12]]},
        ]

    def warned(victims: list[str], header: dict[str, Any]) -> bool:
        data = trace_bytes(*steps(victims), end=False, header=header)
        return "needed-preemption" in check_with("spec", data).counts

    assert not warned(["y", "x"], {})
    assert warned(["x", "y"], {})
    assert not warned(["x", "y"], {"preempted_order": False})


@pytest.mark.parametrize("checker", CHECKERS)
def test_an_id_aborted_twice_in_one_step_is_told_once(checker: str) -> None:
    # Found by the deep agreement run: the second abort of a request that arrived in the
    # same step crashed the spec's checker.
    report = check_with(checker, trace_bytes(
        {"step": 0, "arrivals": [arrive("a", 1, 1)], "aborted": ["a", "a"]}, end=False))
    [v] = report.violations
    assert (v.invariant, v.message) == ("one-state", "a is aborted while aborted")


# -- the suspects of a free-count difference, one by one --------------------------------

def facts(**fields: Any) -> Any:
    from kvsched.spec.state import StepFacts
    return StepFacts(5, 1, **fields)


def victim(rid: str, released: int) -> Any:
    from kvsched.spec.state import Action, Victim
    return Victim(Action(rid, "preempted", "running"), "recompute", 8, 8, released, 0, 1,
                  released)


def finish(rid: str, released: int) -> Any:
    from kvsched.spec.state import Action, Finish
    return Finish(Action(rid, "finished", "running"), True, released, 1)


def chunk(rid: str, blocks: int) -> Any:
    from kvsched.spec.state import Action, Chunk
    return Chunk(Action(rid, "scheduled", "running"), 4, 8, 4, 8, blocks, False, None, 8)


def handout(rid: str, given: int, expected: int, counted: bool = True) -> Any:
    from kvsched.spec.state import Handout
    return Handout(rid, "running", given, expected, counted, ())


def blame(missing: int, **fields: Any) -> tuple[str, str | None, str]:
    from kvsched.spec import must
    f = facts(free=10, reported_free=10 - missing, **fields)
    [v] = must.accounting(f, 0)
    return v.invariant, v.request, v.message


def test_a_release_of_nothing_is_no_suspect() -> None:
    assert blame(2, victims=[victim("v", 0)], finishes=[finish("f", 3)])[:2] == ("finish", "f")
    assert blame(2, released_by_aborts=[("a", 0)], victims=[victim("v", 3)])[:2] == (
        "preempt", "v")


def test_an_allocation_is_a_suspect_unless_its_ids_prove_it() -> None:
    chunks = [chunk("c", 1)]
    assert blame(2, victims=[victim("v", 3)], chunks=chunks)[:2] == ("accounting", None)
    proven = [handout("c", 1, 1)]
    assert blame(2, victims=[victim("v", 3)], chunks=chunks, handouts=proven)[:2] == (
        "preempt", "v")
    # Ids that did not match Db, or whose count was told as the victim's, prove nothing.
    for wrong in ([handout("c", 2, 1)], [handout("c", 1, 1, counted=False)]):
        assert blame(2, victims=[victim("v", 3)], chunks=chunks, handouts=wrong)[:2] == (
            "accounting", None)
    # A chunk that needed no block is no suspect.
    assert blame(2, victims=[victim("v", 3)], chunks=[chunk("c", 0)])[:2] == ("preempt", "v")


def test_a_swap_in_without_ids_is_an_allocation_suspect() -> None:
    from kvsched.spec.state import Action
    swap = [(Action("s", "swapped in", "swapped"), 2)]
    inv, who, message = blame(-2, swap_ins=swap)
    assert (inv, who) == ("accounting", "s")
    assert "s should have been handed 2 GPU blocks" in message and "2 more free" in message
    for odd in ([(Action("s", "swapped in", "running"), 2)],  # not applied
                [(Action("s", "swapped in", "swapped"), 0)]):  # held nothing
        assert blame(-2, swap_ins=odd) == (
            "accounting", None, "the engine reports 12 free GPU blocks; the trace implies 10")
    assert blame(-2, swap_ins=swap, handouts=[handout("s", 2, 2)])[1] is None


def test_suspects_are_named_with_their_kind_and_blocks() -> None:
    inv, who, message = blame(3, victims=[victim("v", 2)], finishes=[finish("f", 2)],
                              chunks=[chunk("c", 1)])
    assert (inv, who) == ("accounting", None)
    assert message == ("the engine reports 7 free GPU blocks; the trace implies 10; 3 fewer "
                       "free, which any of v's victim (2), f's finish (2), c's allocation "
                       "(1) could explain")


def test_one_kind_that_cannot_explain_it_all_is_not_blamed() -> None:
    assert blame(5, victims=[victim("v", 2), victim("w", 2)])[:2] == ("accounting", None)
    inv, who, message = blame(4, victims=[victim("v", 2), victim("w", 2)])
    assert (inv, who) == ("preempt", None) and "preempting v, w should have released 4" \
        in message
    assert blame(2, finishes=[finish("f", 3)]) == (
        "finish", "f", "finishing f should have released 3 GPU blocks, but the engine "
        "reports 2 fewer free (a leak)")
    inv, who, message = blame(1, released_by_aborts=[("a", 2)])
    assert (inv, who) == ("accounting", "a")
    assert message == ("aborting a should have released 2 GPU blocks, but the engine "
                       "reports 1 fewer free")


# -- a very long request id ---------------------------------------------------------------

LONG_ID = "r" + "x" * 99_999
SHOWN_LONG_ID = "r" + "x" * 63 + "\u2026(100000 chars)"


@pytest.mark.parametrize("checker", CHECKERS)
def test_a_long_request_id_is_shortened_wherever_a_user_reads_it(
        tmp_path: Path, checker: str, cli: Any) -> None:
    path = tmp_path / "long.jsonl"
    path.write_bytes(trace_bytes({"step": 0, "arrivals": [arrive(LONG_ID, 5, 2)],
                                  "scheduled": [[LONG_ID, 6]]}, end=False))
    junit = tmp_path / "junit.xml"
    ran = cli("check", "--checker", checker, "--junit", str(junit), str(path))
    assert ran.exit_code == 1
    assert "x" * 64 not in ran.stdout and len(ran.stdout) < 5000
    assert f"MUST token-range: 1 violation, first at step 0, {SHOWN_LONG_ID}\n" in ran.stdout
    failure = next(ET.fromstring(junit.read_bytes()).iter("failure")).get("message", "")
    assert failure == (f"token-range broken 1 time; first at step 0, {SHOWN_LONG_ID} (6 <= 5): "
                       f"{SHOWN_LONG_ID} is scheduled 6 "
                       "tokens but only 5 are known and not yet computed (N=5, C=0)")
    # The JSON keeps the id whole, for a program to match.
    [verdict] = json.loads(cli("check", "--checker", checker, "--format", "json",
                               str(path)).stdout)
    assert verdict["violations"][0]["request"] == LONG_ID
    # Bad input that quotes it: one short line.
    path.write_bytes(trace_bytes({"step": 0, "arrivals": [
        {**arrive(LONG_ID, 5, 2), "priority": "x"}]}, end=False))
    ran = cli("check", "--checker", checker, str(path))
    assert ran.exit_code == 2
    assert ran.stderr == (f"kvsched: error: {path}: line 2: priority of {SHOWN_LONG_ID} "
                          "must be an integer, got 'x'\n")


def test_shown_id_leaves_short_ids_and_paths_whole() -> None:
    from kvsched.verdict import SHOWN_ID_CHARS, printable, shown_id

    short = "r" * SHOWN_ID_CHARS
    assert shown_id(short) == short and shown_id(LONG_ID) == SHOWN_LONG_ID
    path = "/" + "/".join(["d" * 60] * 5) + "/trace.jsonl"  # 300 characters, not an id
    assert printable(f"{path}: line 2: x") == f"{path}: line 2: x"
    spaced = "a b " * 100  # an id with spaces is shortened where the message names it
    assert printable(f"{spaced} is scheduled", [spaced]) == f"{shown_id(spaced)} is scheduled"
