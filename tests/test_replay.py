"""PROFILE as the spec defines it (kvsched.spec.replay): equal decisions, the words of a
divergence, and the replay stopping at the first."""

from __future__ import annotations

from collections.abc import Collection

from kvsched.spec import Config, Decision, Preemption, Rejection, Request, RequestView, Status
from kvsched.spec.model import StepRecord
from kvsched.spec.replay import ProfileReplay, describe, describe_state, involved


def test_describe_names_every_part_of_a_decision_in_order() -> None:
    d = Decision((Rejection("r9", "too long"),), (Preemption("r2", "swap"),
                                                  Preemption("r3", "recompute")),
                 ("r5",), (("r1", 1), ("r4", 16)))
    assert describe(d, ["r1"]) == ("rejected r9; preempted r2 (swap), r3 (recompute); "
                                   "swapped in r5; scheduled r1:1, r4:16; finished r1")
    assert describe(Decision()) == "scheduled nothing"
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


def test_finishes_must_be_the_same_set() -> None:
    mine = Decision(scheduled=(("a", 4),))
    replay = ProfileReplay("p", Scripted([mine], [("a",)]))
    v = replay.step(StepRecord(0, (Request("a", 4, 1),), scheduled=(("a", 4),)))
    assert v is not None and v.message == ("first divergence from p: the profile finishes a "
                                           "| the trace finishes nothing")


def test_a_step_the_profile_cannot_replay_is_a_divergence() -> None:
    replay = ProfileReplay("p", Scripted([], []))
    v = replay.step(StepRecord(0, aborted=("ghost",)))
    assert v is not None and v.message == "the profile cannot replay step 0: 'ghost'"


def test_victims_compare_in_order_unless_the_trace_says_they_are_a_set() -> None:
    two = (Preemption("x", "recompute"), Preemption("y", "recompute"))
    mine = Decision(preempted=two)
    theirs = StepRecord(0, preempted=tuple(reversed(two)))
    assert ProfileReplay("p", Scripted([mine], [()])).step(theirs) is not None
    assert ProfileReplay("p", Scripted([mine], [()]), preempted_order=False
                         ).step(theirs) is None
    swapped = StepRecord(0, preempted=(Preemption("y", "swap"), Preemption("x", "recompute")))
    assert ProfileReplay("p", Scripted([mine], [()]), preempted_order=False
                         ).step(swapped) is not None  # a mode differs: not the same set
