"""A broken invariant, as a checker reports it: id, step, request, both sides, one sentence."""

from __future__ import annotations

from dataclasses import dataclass

MUST = "MUST"
SHOULD = "SHOULD"
PROFILE = "PROFILE"

# The stable invariant ids of docs/spec.md sections 6 to 8, with their level.
INVARIANTS: dict[str, str] = {
    "kv-budget": MUST,
    "cpu-budget": MUST,
    "token-budget": MUST,
    "seq-limit": MUST,
    "token-range": MUST,
    "one-state": MUST,
    "preempt": MUST,
    "finish": MUST,
    "reject": MUST,
    "block-ids": MUST,
    "accounting": MUST,
    "ends-stuck": MUST,
    "no-idle": SHOULD,
    "completion": SHOULD,
    "no-thrash": SHOULD,
    "needed-preemption": SHOULD,
    "progress": SHOULD,
    "starvation": SHOULD,
    "profile": PROFILE,
}

# no-thrash: the most preemptions of one request before it is a warning.
DEFAULT_MAX_PREEMPTIONS = 8

# progress: K, the steps in a row that change nothing while work waits before it is a
# violation. Far more than any engine's quiet stretch while it can run (none has one),
# few enough that a stuck run is told in well under a second.
DEFAULT_STALL_STEPS = 100

# starvation: K, the steps a waiting request may stay passed over (later arrivals, or
# lower priorities, admitted in its place) before it is a violation. A fair engine
# never passes a request over that could take the admitted one's place; K leaves room
# for an engine whose documented policy does so now and then (docs/spec.md).
DEFAULT_STARVE_STEPS = 100


@dataclass(frozen=True)
class Violation:
    """One broken invariant. `lhs relation rhs` is the inequality that should have held."""

    invariant: str
    step: int
    message: str
    request: str | None = None
    lhs: int | None = None
    relation: str = ""
    rhs: int | None = None

    @property
    def level(self) -> str:
        return INVARIANTS[self.invariant]

    def numbers(self) -> str:
        if self.lhs is None or self.rhs is None:
            return ""
        return f"{self.lhs} {self.relation} {self.rhs}"

    def as_dict(self) -> dict[str, object]:
        return {
            "invariant": self.invariant,
            "level": self.level,
            "step": self.step,
            "request": self.request,
            "lhs": self.lhs,
            "relation": self.relation,
            "rhs": self.rhs,
            "message": self.message,
        }


class Stalled(Exception):
    """A run that kvsched drives is stuck: K steps in a row changed nothing while work
    waits, and nothing outside the scheduler is left to change its state. `violation`
    is the `progress` violation that says where and who waits
    (kvsched.spec.should.stalled_run)."""

    def __init__(self, violation: Violation) -> None:
        super().__init__(f"stuck at step {violation.step}: {violation.message}")
        self.violation = violation
