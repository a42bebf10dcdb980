"""Step lines read as JSON and validated without building the spec's records.

The compiled scanner (kvsched.optimized.scan) reads most step lines; the lines it leaves
alone come here. `parse_fast` accepts exactly the step objects the spec's `parse_step`
accepts, with the step number expected, and keeps them as plain lists (a FastStep);
anything else returns None, and the line goes to the spec's parser, which raises its
error. `exact_object` reads a line's JSON exactly as the spec's TraceReader does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvsched.spec.model import MAX_COUNT, VICTIM_MODES, Request
from kvsched.spec.trace import STEP_KEYS, TraceError, parse_arrival

RARE_KEYS = frozenset({"aborted", "rejected", "preempted", "swapped_in"})
MISSING: Any = object()
NOTHING: list[Any] = []



def _ids_ok(v: Any) -> bool:
    return type(v) is list and all(type(x) is str and x for x in v)


@dataclass(slots=True)
class FastStep:
    """One step line read as JSON, validated without building the spec's records."""

    line: int
    raw: bytes
    step: int
    arrivals: list[Request]
    scheduled: list[Any]
    finished: list[str]
    free_blocks: int | None
    new_blocks: dict[str, Any] | None
    unknown_keys: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    preempted: list[tuple[str, str]] = field(default_factory=list)
    swapped_in: list[str] = field(default_factory=list)

    @property
    def rare(self) -> bool:
        return bool(self.aborted or self.rejected or self.preempted or self.swapped_in)

    @property
    def idle(self) -> bool:
        return not self.scheduled and not self.preempted and not self.swapped_in


def _pairs_ok(v: Any) -> bool:
    """A scheduled list as parse_step accepts it: [id, count] pairs."""
    return type(v) is list and all(
        type(p) is list and len(p) == 2 and type(p[0]) is str and p[0]
        and type(p[1]) is int and abs(p[1]) <= MAX_COUNT for p in v)


def _block_map_ok(v: Any) -> bool:
    """new_blocks as parse_step accepts it: lists of integers in 0..2**40."""
    return type(v) is dict and all(
        type(ids) is list and all(type(b) is int and 0 <= b <= MAX_COUNT for b in ids)
        for ids in v.values())


def parse_fast(obj: Any, line: int, expected: int, raw: bytes) -> FastStep | None:
    """The step, if the line is one parse_step accepts and numbered `expected`; None when
    the spec's own parser should look at it (it may raise the error)."""
    if type(obj) is not dict:
        return None
    step = obj.get("step")
    if type(step) is not int or step != expected or "prefix_hits" in obj or "block_keys" in obj:
        return None  # prefix caching: the spec's parser and Checker
    arrivals: list[Request] = []
    given = obj.get("arrivals", NOTHING)
    if given:
        if type(given) is not list:
            return None
        try:
            arrivals = [parse_arrival(a, step, line) for a in given]
        except TraceError:
            return None
    scheduled = obj.get("scheduled", NOTHING)
    if not _pairs_ok(scheduled):
        return None
    finished = obj.get("finished", NOTHING)
    if not _ids_ok(finished):
        return None
    free_blocks = obj.get("free_blocks")
    if free_blocks is not None and (type(free_blocks) is not int or free_blocks < 0
                                    or free_blocks > MAX_COUNT):
        return None
    new_blocks = obj.get("new_blocks", MISSING)
    if new_blocks is MISSING:
        new_blocks = None
    elif not _block_map_ok(new_blocks):
        return None
    time_ms = obj.get("time_ms")
    if time_ms is not None and (type(time_ms) not in (int, float) or time_ms < 0):
        return None
    st = FastStep(line, raw, step, arrivals, scheduled, finished, free_blocks, new_blocks)
    if not STEP_KEYS.issuperset(obj):
        st.unknown_keys = [k for k in obj if k not in STEP_KEYS]
    if RARE_KEYS.isdisjoint(obj):
        return st
    aborted = obj.get("aborted", NOTHING)
    swapped_in = obj.get("swapped_in", NOTHING)
    rejected = obj.get("rejected", NOTHING)
    preempted = obj.get("preempted", NOTHING)
    if not (_ids_ok(aborted) and _ids_ok(swapped_in) and type(rejected) is list
            and type(preempted) is list):
        return None
    for r in rejected:
        if type(r) is not dict or type(r.get("id")) is not str or not r["id"]:
            return None
    for p in preempted:
        if (type(p) is not dict or type(p.get("id")) is not str or not p["id"]
                or p.get("mode") not in VICTIM_MODES):
            return None
    st.aborted = aborted
    st.swapped_in = swapped_in
    st.rejected = [r["id"] for r in rejected]
    st.preempted = [(p["id"], p["mode"]) for p in preempted]
    return st


