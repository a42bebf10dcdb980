"""PROFILE level (docs/spec.md sections 6 to 8): a profile's scheduler replays a trace's inputs,
and its decisions must equal the trace's, step by step.

What "equal decisions" means is the spec's: `Decision.comparable()` (rejected ids,
victims with their modes in order, swap-ins, the scheduled [id, tokens] pairs in batch
order, the length of each prefix hit), and the same finishes as a set. With prefix
caching the trace's content keys (`block_keys`) are input, like its arrivals: a
scheduler that takes them (kvsched.spec.interface.ContentKeys) works out the hits
itself and must find the same. The tool supplies the replaying scheduler (any
kvsched.spec.interface.Scheduler; kvsched.conformance builds the reference with a named
profile). The first divergence is reported with both decisions and the state that led
to it; after it the replay stops, since every later step would differ too.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvsched.spec.interface import ContentKeys, Scheduler
from kvsched.spec.model import Decision, RequestView, StepRecord
from kvsched.spec.violation import Violation


def describe(decision: Decision, finished: Iterable[str] = ()) -> str:
    """A decision in one line: rejected, preempted (mode), swapped in, scheduled id:n."""
    parts = []
    if decision.rejected:
        parts.append("rejected " + ", ".join(r.id for r in decision.rejected))
    if decision.preempted:
        parts.append("preempted " + ", ".join(f"{p.id} ({p.mode})" for p in decision.preempted))
    if decision.swapped_in:
        parts.append("swapped in " + ", ".join(decision.swapped_in))
    parts.append("scheduled " + (", ".join(f"{rid}:{n}" for rid, n in decision.scheduled)
                                 or "nothing"))
    fin = list(finished)
    if fin:
        parts.append("finished " + ", ".join(fin))
    return "; ".join(parts)


def describe_state(states: dict[str, RequestView], free: int, involved: Iterable[str]) -> str:
    """The free blocks and the involved requests' N, C, G (and H) in one line."""
    shown = [rid for rid in dict.fromkeys(involved) if rid in states]
    cells = [f"{rid} {v.status.value} N={v.num_tokens} C={v.num_computed} G={v.gpu_blocks}"
             + (f" H={v.host_blocks}" if v.host_blocks else "")
             for rid, v in ((rid, states[rid]) for rid in shown)]
    return f"free GPU blocks {free}" + ("; " + ", ".join(cells) if cells else "")


def involved(*decisions: Decision) -> list[str]:
    """Every id the decisions name, in their order."""
    out: list[str] = []
    for d in decisions:
        out += [r.id for r in d.rejected] + [p.id for p in d.preempted]
        out += list(d.swapped_in) + [rid for rid, _ in d.scheduled]
    return out


class ProfileReplay:
    """Replays a profile in lockstep with a trace, one step at a time (bounded memory).

    `scheduler` is the profile's scheduler on the trace's config, fresh.
    `preempted_order` is the trace header's: False compares each step's victims as a set.
    """

    def __init__(self, profile: str, scheduler: Scheduler,
                 preempted_order: bool = True) -> None:
        self.profile = profile
        self.scheduler = scheduler
        self.preempted_order = preempted_order
        self.divergence: Violation | None = None

    def step(self, rec: StepRecord) -> Violation | None:
        """The divergence at this step, if it is the first; nothing after that."""
        if self.divergence is not None:
            return None
        self.divergence = self._compare(rec)
        return self.divergence

    def _compare(self, rec: StepRecord) -> Violation | None:
        scheduler, profile = self.scheduler, self.profile
        try:
            for req in rec.arrivals:
                scheduler.add_request(req)
            for rid in rec.aborted:
                scheduler.abort_request(rid)
            if rec.block_keys and isinstance(scheduler, ContentKeys):
                for rid, keys in rec.block_keys.items():
                    scheduler.add_block_keys(rid, keys)
        except (KeyError, ValueError) as e:
            return Violation("profile", rec.step,
                             f"the profile cannot replay step {rec.step}: {e}")
        before = scheduler.states()
        free = scheduler.free_blocks()
        mine = scheduler.schedule()
        theirs = rec.decision
        ordered = self.preempted_order
        if mine.comparable(ordered) != theirs.comparable(ordered):
            state = describe_state(before, free, involved(mine, theirs))
            return Violation(
                "profile", rec.step,
                f"first divergence from {profile}: the profile {describe(mine)} | the trace "
                f"{describe(theirs)} | state before: {state}")
        done = scheduler.update(set(rec.finished))
        if set(done) != set(rec.finished):
            return Violation(
                "profile", rec.step,
                f"first divergence from {profile}: the profile finishes "
                f"{', '.join(done) or 'nothing'} | the trace finishes "
                f"{', '.join(rec.finished) or 'nothing'}")
        return None
