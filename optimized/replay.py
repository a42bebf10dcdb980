"""A profile replayed by the compiled scheduler beside the vectorized checker.

PROFILE level is the spec's (kvsched.spec.replay.ProfileReplay): the profile's scheduler
replays the trace's inputs and must decide as the trace did, step by step; the first
divergence is reported with both decisions and the state that led to it. Here the
profile's scheduler is the compiled one (kvsched.optimized.compiled, the reference's
decisions), and the steps come as the vectorized checker reads them, a run of step lines
at a time (JSON objects, or their bytes).

A run is replayed and compared inside the compiled scheduler (`replay_lines`: the
comparison of Decision.comparable and the finishes, with no StepRecord or Decision per
step), the trace's content keys given to it as ProfileReplay gives them. Same verdicts by
construction: the scheduler is copied every CHECKPOINT_LINES lines or so, and the lines
since then kept. Where the compiled comparison finds a difference, or a line it leaves
to the spec (another shape, a value the spec's parser refuses, a prefix hit whose
contents only the trace's state knows), the copy replays those lines again (as they
went, by construction) and the run goes through ProfileReplay, which then reports
exactly what it reports on the spec's path (or, finding nothing, simply goes on from
there). The divergence joins the report where the spec's checker would have put it:
after every violation of the steps up to its own.

With prefix caching ProfileReplay keeps the trace's state (kvsched.spec.state) for the
contents of hits without keys. The compiled comparison does not need it, so the runs it
replayed wait, as JSON bytes, until the state is read: before a line goes through
ProfileReplay, or once they hold LAG_BYTES.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from kvsched.optimized.compiled import CompiledScheduler, replay_lines
from kvsched.spec.checker import Report
from kvsched.spec.model import Config, StepRecord
from kvsched.spec.profiles import get_profile
from kvsched.spec.replay import ProfileReplay
from kvsched.spec.trace import load_line, parse_step

LAG_BYTES = 1 << 26  # most bytes of lines waiting for the trace's state
CHECKPOINT_LINES = 4096  # most lines replayed since the scheduler's checkpoint


def _encoded(obj: Any) -> bytes:
    """Lines' JSON objects as bytes again (integers past 64 bits through json)."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        return json.dumps(obj).encode()


class CompiledReplay:
    """ProfileReplay of `profile` on `config` with the compiled scheduler, fed runs of
    lines (`lines`) or single records (`record`)."""

    def __init__(self, profile: str, config: Config, preempted_order: bool = True) -> None:
        self.profile = profile
        self.spec = ProfileReplay(profile, CompiledScheduler(config, get_profile(profile).knobs),
                                  preempted_order)
        self.fast_runs = 0
        self.slow_steps = 0
        self.placed = False
        # a copy of the scheduler, the lines replayed since it and the ids they keyed
        self.mark: CompiledScheduler | None = None
        self.since: list[tuple[int, Any]] = []
        self.newly: list[str] = []
        # runs of lines the trace's state has not applied: their numbers, their JSON
        self.lag: list[tuple[list[int], bytes]] = []
        self.lag_bytes = 0

    @property
    def scheduler(self) -> CompiledScheduler:
        scheduler = self.spec.scheduler
        assert isinstance(scheduler, CompiledScheduler)
        return scheduler

    @property
    def diverged(self) -> bool:
        return self.spec.divergence is not None

    def record(self, rec: StepRecord) -> None:
        """One step through the spec's ProfileReplay."""
        if self.diverged:
            return
        self._catch_up()
        self.slow_steps += 1
        self.spec.step(rec)

    def lines(self, lines: list[tuple[int, Any]]) -> None:
        """A run of step lines (number, JSON object or raw bytes), in order: compared in
        the compiled scheduler; where it finds a difference, again from the run's start,
        through the spec's comparison: its verdict, in its words."""
        if self.diverged or not lines:
            return
        if self.mark is None or len(self.since) >= CHECKPOINT_LINES:
            self.mark = self.scheduler.copy()
            self.since = []
            self.newly = []
        keyed = self.spec.keyed
        ordered = self.spec.preempted_order
        if replay_lines(self.scheduler, lines, keyed, self.newly, ordered) < 0:
            self.fast_runs += 1
            self.since += lines
            if self.spec.state is not None:
                self._wait(lines)
            return
        # The run's start again: the checkpoint, and the lines replayed since it.
        mark, self.mark = self.mark, None
        keyed.difference_update(self.newly)
        if replay_lines(mark, self.since, keyed, [], ordered) >= 0:
            raise AssertionError("the compiled replay moved otherwise from its checkpoint")
        self.spec.scheduler = mark
        for line, given in lines:
            if self.diverged:
                return
            obj = load_line(given, line) if isinstance(given, bytes) else given
            self.record(parse_step(obj, line))

    def _wait(self, lines: list[tuple[int, Any]]) -> None:
        """Keep replayed lines for the trace's state, applied once it is read."""
        numbers = [line for line, _ in lines]
        objs = [load_line(g, n) if isinstance(g, bytes) else g for n, g in lines]
        raw = _encoded(objs)
        self.lag.append((numbers, raw))
        self.lag_bytes += len(raw)
        if self.lag_bytes >= LAG_BYTES:
            self._catch_up()

    def _catch_up(self) -> None:
        """Apply the waiting lines to ProfileReplay's trace state, as its steps would."""
        state = self.spec.state
        if state is not None:
            for numbers, raw in self.lag:
                for line, obj in zip(numbers, orjson.loads(raw), strict=True):
                    state.apply(parse_step(obj, line))
        self.lag = []
        self.lag_bytes = 0

    def place(self, report: Report) -> None:
        """Put the divergence, once found, where the spec's checker reports it."""
        v = self.spec.divergence
        if v is None or self.placed:
            return
        self.placed = True
        report.counts["profile"] += 1
        at = len(report.violations)
        while at > 0 and report.violations[at - 1].step > v.step:
            at -= 1
        report.violations.insert(at, v)
