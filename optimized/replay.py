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
contents of hits without keys. The compiled comparison does not need it, so it is not
kept while runs compare there: where lines go through ProfileReplay, the caller (the
fast checker, whose own state moved through the same lines) gives the trace's state
before the first of them (`lines`' `before`), and ProfileReplay moves it on by each
line it replays; lines that follow straight on go on from there.

A profile the compiled scheduler does not replay (another engine's rules, pools beyond
it) goes beside the fast checker all the same, through LinesReplay: every line through
ProfileReplay with the scheduler the caller gives (the reference's, which this package
does not import), the same verdict as on the spec's path by construction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvsched.optimized.compiled import CompiledScheduler, replay_lines
from kvsched.spec.checker import Report
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Config, StepRecord
from kvsched.spec.profiles import get_profile
from kvsched.spec.replay import ProfileReplay
from kvsched.spec.state import State
from kvsched.spec.trace import load_line, parse_step

CHECKPOINT_LINES = 4096  # most lines replayed since the scheduler's checkpoint

Line = tuple[int, Any]  # a step line's number, and its JSON object or raw bytes


class LinesReplay:
    """A ProfileReplay (`spec`: the profile's scheduler, whichever it is) fed runs of
    step lines (`lines`), each through the spec's comparison: for a profile the
    compiled scheduler does not replay (another engine's rules, pools beyond it)."""

    def __init__(self, spec: ProfileReplay) -> None:
        self.spec = spec
        self.caching = spec.scheduler.config.prefix_caching
        self.fast_runs = 0
        self.slow_steps = 0
        self.placed = False
        # the line after the last one ProfileReplay replayed (its trace state is there)
        self.followed = -1

    @property
    def diverged(self) -> bool:
        return self.spec.divergence is not None

    def lines(self, lines: list[Line], before: Callable[[], State],
              raws: Sequence[bytes | None] | None = None) -> None:
        """A run of step lines (number, JSON object or raw bytes), in order, replayed
        until the first divergence. `before` gives the trace's state before the run's
        first line, a State of its own (asked for only with prefix caching, where the
        lines do not follow straight on from the last ones replayed). `raws`, where
        given, are the lines' bytes, each where orjson reads it as the object given
        (else None), which a replay that keeps lines may keep instead of the object."""
        if self.diverged or not lines:
            return
        self._spec_lines(lines, before)

    def _spec_lines(self, lines: list[Line], before: Callable[[], State]) -> None:
        """The lines through ProfileReplay. With prefix caching its trace's state is
        made only once a line needs it (ProfileReplay.implies_contents: a hit without
        keys), from `before` and the lines before that one here, and kept while the
        lines follow straight on: a trace whose hits come with their keys never moves
        it."""
        spec = self.spec
        if self.caching and self.followed != lines[0][0]:
            spec.state = None  # not where the trace stands
        done: list[StepRecord] = []
        for line, given in lines:
            if self.diverged:
                return
            obj = load_line(given, line) if isinstance(given, bytes) else given
            rec = parse_step(obj, line)
            if self.caching and spec.state is None and spec.implies_contents(rec):
                state = before()
                for earlier in done:
                    state.apply(earlier)
                spec.state = state
            self.slow_steps += 1
            spec.step(rec)
            if spec.state is None:
                done.append(rec)
            self.followed = line + 1

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


class CompiledReplay(LinesReplay):
    """ProfileReplay of `profile` on `config` with the compiled scheduler, fed runs of
    lines (`lines`), with the profile's `knobs` (as it takes the engine settings a
    trace's header declares, or a rule flipped: where a trace tells it from the
    profile)."""

    def __init__(self, profile: str, config: Config, preempted_order: bool = True,
                 knobs: Knobs | None = None) -> None:
        chosen = get_profile(profile).knobs if knobs is None else knobs
        super().__init__(ProfileReplay(profile, CompiledScheduler(config, chosen),
                                       preempted_order))
        # a copy of the scheduler, the lines replayed since it and the ids they keyed
        self.mark: CompiledScheduler | None = None
        self.since: list[Line] = []
        self.newly: list[str] = []

    @property
    def scheduler(self) -> CompiledScheduler:
        scheduler = self.spec.scheduler
        assert isinstance(scheduler, CompiledScheduler)
        return scheduler

    def lines(self, lines: list[Line], before: Callable[[], State],
              raws: Sequence[bytes | None] | None = None) -> None:
        """As LinesReplay's, compared in the compiled scheduler; where it finds a
        difference, again from the run's start, through the spec's comparison: its
        verdict, in its words. The lines since the checkpoint are kept as `raws` give
        them where they do (a line is read again only where a difference is found),
        so that the objects of thousands of lines do not stay in memory."""
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
            if raws is None:
                self.since += lines
            else:
                self.since += [(line, given if raw is None else raw)
                               for (line, given), raw in zip(lines, raws, strict=True)]
            return
        # The run's start again: the checkpoint, and the lines replayed since it.
        mark, self.mark = self.mark, None
        keyed.difference_update(self.newly)
        if replay_lines(mark, self.since, keyed, [], ordered) >= 0:
            raise AssertionError("the compiled replay moved otherwise from its checkpoint")
        self.spec.scheduler = mark
        self._spec_lines(lines, before)
