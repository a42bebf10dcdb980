"""PROFILE level (docs/spec.md sections 6 to 8): a profile's scheduler replays a trace's inputs,
and its decisions must equal the trace's, step by step.

What "equal decisions" means is the spec's: `Decision.comparable()` (rejected ids,
victims with their modes in order, swap-ins, the scheduled [id, tokens] pairs in batch
order, the length of each prefix hit), and the same finishes as a set. With prefix
caching the trace's content keys (`block_keys`) are input, like its arrivals: a
scheduler that takes them (kvsched.spec.interface.ContentKeys) works out the hits
itself and must find the same. A trace without keys has its hits taken as given: a
request's hit blocks are given the contents the trace implies (kvsched.spec.state's
`content`: the request that filled a block, and the index), so the profile's scheduler
finds the same hits exactly when it still has those blocks cached: its eviction order
is still tested. The tool supplies the replaying scheduler (any
kvsched.spec.interface.Scheduler; kvsched.conformance builds the reference with a named
profile). The first divergence is reported with both decisions and the state that led
to it; after it the replay stops, since every later step would differ too. A trace's
`aborted` is input too, and the profile must end each at the abort, as the trace did
(kvsched.spec.interface.abort); an abort whose request ran on to a finish (SGLang's running
requests) is in the trace as that finish, which update() is told as a stop.

A pipelined trace (config pipelined) gives on step k's line the entries whose output
step k+1's decision dropped (`unsampled`); the profile's scheduler gives them with that
decision (Decision.unsampled): they must be the same set. A finish the profile reports
at step k for such an entry did not happen (it is out of the trace's `finished`), so
the finishes compare without them; step k+1's decision must then drop it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import cast

from kvsched.spec.interface import ContentKeys, RequestStates, Scheduler, abort
from kvsched.spec.model import Decision, RequestView, StepRecord
from kvsched.spec.state import State
from kvsched.spec.violation import Violation


def describe(decision: Decision, finished: Iterable[str] = ()) -> str:
    """A decision in one line: the last step's entries it dropped, rejected, preempted
    (mode), swapped in, scheduled id:n (with the length of a prefix hit)."""
    parts = []
    if decision.unsampled:
        parts.append("drops the last step's output of " + ", ".join(decision.unsampled))
    if decision.rejected:
        parts.append("rejected " + ", ".join(r.id for r in decision.rejected))
    if decision.preempted:
        parts.append("preempted " + ", ".join(f"{p.id} ({p.mode})" for p in decision.preempted))
    if decision.swapped_in:
        parts.append("swapped in " + ", ".join(decision.swapped_in))
    hits = decision.prefix_hits
    parts.append("scheduled " + (", ".join(
        f"{rid}:{n}" + (f" (hit {len(hits[rid])} blocks)" if rid in hits else "")
        for rid, n in decision.scheduled) or "nothing"))
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
        self.content_keys: ContentKeys | None = None
        self.scheduler = scheduler
        self.preempted_order = preempted_order
        self.divergence: Violation | None = None
        # With prefix caching: the trace's state, for the contents of hits without keys.
        config = scheduler.config
        self.state = State(config) if config.prefix_caching else None
        self.keyed: set[str] = set()  # requests whose keys the trace gives
        self.unsampled: tuple[str, ...] = ()  # the last step's line's dropped entries
        # The profile's view of each live request before the step, for a divergence's
        # words: kept up to date request by request where the scheduler gives one view
        # at a time (RequestStates), since a step changes only the requests it names;
        # else every view is built before every step (states()).
        self.views: dict[str, RequestView] | None = (
            {} if isinstance(scheduler, RequestStates) else None)

    @property
    def scheduler(self) -> Scheduler:
        return self._scheduler

    @scheduler.setter
    def scheduler(self, scheduler: Scheduler) -> None:
        """The profile's scheduler (a replay may put a copy of it back), and as
        ContentKeys if it takes them (asked once, not every step: a Protocol's
        isinstance is slow)."""
        self._scheduler = scheduler
        self.content_keys = scheduler if isinstance(scheduler, ContentKeys) else None

    def step(self, rec: StepRecord) -> Violation | None:
        """The divergence at this step, if it is the first; nothing after that."""
        if self.divergence is not None:
            return None
        self.divergence = self._compare(rec)
        return self.divergence

    def implies_contents(self, rec: StepRecord) -> bool:
        """Whether `rec` has a prefix hit of a request whose content keys the trace has
        not given (nor gives in `rec`): the contents of its blocks are then what the
        trace's state implies, so `state` must stand where the trace does before `rec`.
        (A replay that keeps no state while no step needs it asks this.)"""
        return any(rid not in self.keyed and rid not in rec.block_keys
                   for rid in rec.prefix_hits)

    def _content_keys(self, rec: StepRecord, scheduler: ContentKeys) -> None:
        """Give the scheduler the trace's content keys, or for a hit without them the
        contents the trace implies."""
        for rid, keys in rec.block_keys.items():
            self.keyed.add(rid)
            scheduler.add_block_keys(rid, keys)
        if self.state is None:
            return
        self.state.apply(rec)
        for rid, blocks in rec.prefix_hits.items():
            implied = [self.state.content.get(b) for b in blocks]
            known = [k for k in implied if k is not None]
            if rid not in self.keyed and len(known) == len(implied):
                scheduler.add_block_keys(rid, known, start=0)

    def _compare(self, rec: StepRecord) -> Violation | None:
        scheduler, profile = self.scheduler, self.profile
        try:
            for req in rec.arrivals:
                scheduler.add_request(req)
            deferred = [rid for rid in rec.aborted if not abort(scheduler, rid)]
            if self.content_keys is not None:
                self._content_keys(rec, self.content_keys)
        except (KeyError, ValueError) as e:
            return Violation("profile", rec.step,
                             f"the profile cannot replay step {rec.step}: {e}")
        if deferred:  # the trace ended it at the abort; the profile lets it run on
            return Violation(
                "profile", rec.step,
                f"first divergence from {profile}: the profile lets "
                f"{', '.join(deferred)} run to its next sample after the abort | the trace "
                "ends it at the abort")
        if self.views is None:
            before = scheduler.states()
        else:
            self._refresh([*(r.id for r in rec.arrivals), *rec.aborted])
            before = self.views
        free = scheduler.free_blocks()
        mine = scheduler.schedule()
        theirs = replace(rec.decision, unsampled=self.unsampled)
        self.unsampled = rec.unsampled
        ordered = self.preempted_order
        if (mine.comparable(ordered) != theirs.comparable(ordered)
                or set(mine.unsampled) != set(theirs.unsampled)):
            state = describe_state(before, free, involved(mine, theirs))
            return Violation(
                "profile", rec.step,
                f"first divergence from {profile}: the profile {describe(mine)} | the trace "
                f"{describe(theirs)} | state before: {state}")
        finished = scheduler.update(set(rec.finished))
        done = [rid for rid in finished if rid not in rec.unsampled]
        if set(done) != set(rec.finished):
            return Violation(
                "profile", rec.step,
                f"first divergence from {profile}: the profile finishes "
                f"{', '.join(done) or 'nothing'} | the trace finishes "
                f"{', '.join(rec.finished) or 'nothing'}")
        if self.views is not None:
            self._refresh([*involved(mine), *mine.reclaimed, *mine.released, *mine.unsampled,
                           *finished])
        return None

    def _refresh(self, ids: Iterable[str]) -> None:
        """The views of `ids`, which may have changed, from the scheduler again."""
        assert self.views is not None  # kept only for a RequestStates scheduler
        scheduler = cast(RequestStates, self.scheduler)
        for rid in ids:
            view = scheduler.state_of(rid)
            if view is None:
                self.views.pop(rid, None)
            else:
                self.views[rid] = view
