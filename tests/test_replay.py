"""PROFILE as the spec defines it (kvsched.spec.replay): equal decisions, the words of a
divergence, and the replay stopping at the first."""

from __future__ import annotations

import gzip
import io
from collections.abc import Collection
from pathlib import Path

import pytest

from kvsched.reference import scheduler_for
from kvsched.spec import (
    CheckOptions,
    Config,
    Decision,
    Preemption,
    Rejection,
    Request,
    RequestView,
    Status,
    TraceReader,
    TraceWriter,
    check_steps,
    check_trace,
)
from kvsched.spec.interface import RequestStates
from kvsched.spec.model import StepRecord
from kvsched.spec.profiles import get_profile
from kvsched.spec.replay import ProfileReplay, describe, describe_state, involved


def test_describe_names_every_part_of_a_decision_in_order() -> None:
    d = Decision((Rejection("r9", "too long"),), (Preemption("r2", "swap"),
                                                  Preemption("r3", "recompute")),
                 ("r5",), (("r1", 1), ("r4", 16)))
    assert describe(d, ["r1"]) == ("rejected r9; preempted r2 (swap), r3 (recompute); "
                                   "swapped in r5; scheduled r1:1, r4:16; finished r1")
    assert describe(Decision()) == "scheduled nothing"
    two = Decision((Rejection("r8", "x"), Rejection("r9", "y")), swapped_in=("r5", "r6"))
    assert describe(two, ["r1", "r4"]) == ("rejected r8, r9; swapped in r5, r6; scheduled "
                                           "nothing; finished r1, r4")
    assert involved(d, Decision(scheduled=(("r7", 1),))) == ["r9", "r2", "r3", "r5", "r1",
                                                            "r4", "r7"]


def test_describe_state_shows_the_involved_requests_numbers() -> None:
    views = {"a": RequestView(Status.RUNNING, 9, 8, 3, 0, 1),
             "b": RequestView(Status.SWAPPED, 5, 4, 0, 2, 1)}
    assert describe_state(views, 7, ["b", "x", "a", "b"]) == (
        "free GPU blocks 7; b swapped N=5 C=4 G=0 H=2, a running N=9 C=8 G=3")
    assert describe_state(views, 0, []) == "free GPU blocks 0"


class Scripted:
    """A scheduler that decides what it is told, to compare with a trace."""

    def __init__(self, decisions: list[Decision], finishes: list[tuple[str, ...]]) -> None:
        self.config = Config()
        self.decisions = decisions
        self.finishes = finishes
        self.added: list[str] = []

    def add_request(self, request: Request) -> None:
        if request.id in self.added:
            raise ValueError(f"request id {request.id!r} is already live")
        self.added.append(request.id)

    def abort_request(self, request_id: str) -> None:
        raise KeyError(request_id)

    def schedule(self) -> Decision:
        return self.decisions.pop(0)

    def update(self, stopped: Collection[str]) -> tuple[str, ...]:
        return self.finishes.pop(0)

    def free_blocks(self) -> int:
        return 11

    def states(self) -> dict[str, RequestView]:
        return {rid: RequestView(Status.WAITING, 4, 0, 0, 0, 0) for rid in self.added}

    def has_unfinished(self) -> bool:
        return True


def test_the_first_divergence_is_told_with_both_decisions_and_then_the_replay_stops() -> None:
    mine = Decision(scheduled=(("a", 4),))
    replay = ProfileReplay("p", Scripted([mine, mine, mine], [(), (), ()]))
    same = StepRecord(0, (Request("a", 4, 2),), scheduled=(("a", 4),))
    assert replay.step(same) is None
    other = StepRecord(1, scheduled=(("b", 1),))
    v = replay.step(other)
    assert v is not None and v.invariant == "profile" and v.step == 1
    assert v.message == ("first divergence from p: the profile scheduled a:4 | the trace "
                         "scheduled b:1 | state before: free GPU blocks 11; a waiting N=4 "
                         "C=0 G=0")
    assert replay.step(other) is None and replay.divergence is v


@pytest.mark.parametrize("mine,theirs,words", [
    (("a",), (), "the profile finishes a | the trace finishes nothing"),
    ((), ("a", "b"), "the profile finishes nothing | the trace finishes a, b"),
    (("b", "a"), ("a",), "the profile finishes b, a | the trace finishes a"),
])
def test_finishes_must_be_the_same_set(mine: tuple[str, ...], theirs: tuple[str, ...],
                                       words: str) -> None:
    decision = Decision(scheduled=(("a", 4), ("b", 4)))
    replay = ProfileReplay("p", Scripted([decision], [mine]))
    v = replay.step(StepRecord(2, (Request("a", 4, 1), Request("b", 4, 1)),
                               scheduled=(("a", 4), ("b", 4)), finished=theirs))
    assert v is not None and (v.invariant, v.step) == ("profile", 2)
    assert v.message == f"first divergence from p: {words}"


def test_the_same_finishes_in_another_order_agree() -> None:
    decision = Decision(scheduled=(("a", 4), ("b", 4)))
    replay = ProfileReplay("p", Scripted([decision], [("b", "a")]))
    assert replay.step(StepRecord(0, (Request("a", 4, 1), Request("b", 4, 1)),
                                  scheduled=(("a", 4), ("b", 4)), finished=("a", "b"))) is None


def test_a_step_the_profile_cannot_replay_is_a_divergence() -> None:
    replay = ProfileReplay("p", Scripted([], []))
    v = replay.step(StepRecord(0, aborted=("ghost",)))
    assert v is not None and v.message == "the profile cannot replay step 0: 'ghost'"
    assert (v.invariant, v.step) == ("profile", 0)


def test_victims_compare_in_order_unless_the_trace_says_they_are_a_set() -> None:
    two = (Preemption("x", "recompute"), Preemption("y", "recompute"))
    mine = Decision(preempted=two)
    theirs = StepRecord(0, preempted=tuple(reversed(two)))
    assert ProfileReplay("p", Scripted([mine], [()])).step(theirs) is not None
    assert ProfileReplay("p", Scripted([mine], [()]), preempted_order=False
                         ).step(theirs) is None
    # In order, the same victims in the same order agree, sorted or not.
    back = Decision(preempted=tuple(reversed(two)))
    assert ProfileReplay("p", Scripted([back], [()])).step(theirs) is None
    swapped = StepRecord(0, preempted=(Preemption("y", "swap"), Preemption("x", "recompute")))
    assert ProfileReplay("p", Scripted([mine], [()]), preempted_order=False
                         ).step(swapped) is not None  # a mode differs: not the same set


def test_the_state_before_a_divergence_shows_the_traces_requests_too() -> None:
    replay = ProfileReplay("p", Scripted([Decision(scheduled=(("a", 4),))], [()]))
    v = replay.step(StepRecord(0, (Request("a", 4, 2), Request("b", 4, 2)),
                               scheduled=(("b", 4),)))
    assert v is not None and v.message.endswith(
        "state before: free GPU blocks 11; a waiting N=4 C=0 G=0, b waiting N=4 C=0 G=0")


def test_the_checker_reports_the_replays_divergence_beside_its_own() -> None:
    # ghost breaks one-state; the profile schedules nothing where the trace schedules a.
    steps = [StepRecord(0, (Request("a", 4, 2),), scheduled=(("a", 4), ("ghost", 1)))]
    report = check_steps(Config(), steps, False, CheckOptions(keep=0),
                         ProfileReplay("p", Scripted([Decision()], [()])))
    assert report.profile == "p" and report.counts == {"one-state": 1, "profile": 1}
    assert [v.invariant for v in report.violations] == ["profile"]  # keep=0 keeps none else
    out = io.BytesIO()
    writer = TraceWriter(out)
    writer.header(Config())
    writer.step(steps[0])
    traced = check_trace(TraceReader(io.BytesIO(out.getvalue())),
                         replay=ProfileReplay("q", Scripted([Decision()], [()])))
    assert traced.profile == "q" and traced.counts == {"one-state": 1, "profile": 1}


# The state before each step, kept request by request (RequestStates): a step changes only
# the requests it names, so the kept views are the ones states() would build, on real
# engines' traces (kept in tests/data) under their profiles' reference schedulers.
KEPT = Path(__file__).parent / "data"
VIEW_TRACES = {"sglang@0.5.23": ["sglang/retraction.jsonl.gz", "sglang/radix-eviction.jsonl.gz",
                                 "sglang/priority-preemption.jsonl.gz"],
               "vllm-v0": ["vllm-v0/kind-swap-chunked-priority.jsonl",
                           "vllm-v0/kind-recompute-whole-fcfs.jsonl"],
               "vllm-v1@0.32": ["side-by-side/burst-vllm.jsonl.gz",
                                "side-by-side/conversations-vllm.jsonl.gz"]}


@pytest.mark.parametrize(("profile", "name"), [
    (p, n) for p, ns in VIEW_TRACES.items() for n in ns])
def test_the_views_kept_before_each_step_are_the_schedulers_states(profile: str,
                                                                   name: str) -> None:
    data = (KEPT / name).read_bytes()
    reader = TraceReader(io.BytesIO(gzip.decompress(data) if name.endswith(".gz") else data))
    knobs = get_profile(profile).for_trace(reader.header.settings).knobs
    scheduler = scheduler_for(reader.header.config, knobs, get_profile(profile).scheduler)
    assert isinstance(scheduler, RequestStates)
    replay = ProfileReplay(profile, scheduler, reader.header.preempted_order)
    schedule, compared = scheduler.schedule, 0

    def checked() -> Decision:
        nonlocal compared
        assert replay.views == scheduler.states()
        compared += 1
        return schedule()

    scheduler.schedule = checked  # type: ignore[method-assign]
    for rec in reader:
        assert replay.step(rec) is None
    assert compared > 50 and replay.views == {}


def test_a_scheduler_without_single_views_has_every_view_built_each_step() -> None:
    scheduler = scheduler_for(Config(step_mix="prefill_or_decode", preemption="lazy",
                                     pipelined=True, prealloc_tokens=16),
                              get_profile("lmdeploy@0.18.0").knobs, "lmdeploy")
    assert not isinstance(scheduler, RequestStates)
    assert ProfileReplay("lmdeploy@0.18.0", scheduler).views is None
