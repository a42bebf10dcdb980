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
contents of hits without keys. The compiled comparison does not need it: the lines it
replayed move a fast checker of the replay's own (kvsched.optimized.checker.FastChecker,
the compiled twin of that state), and ProfileReplay's state is made from it
(`FastChecker.settled`) only when a line goes through ProfileReplay.
"""

from __future__ import annotations

from typing import Any

from kvsched.optimized.checker import RUN_STEPS, FastChecker
from kvsched.optimized.compiled import CompiledScheduler, replay_lines
from kvsched.spec.checker import Report
from kvsched.spec.model import Config, StepRecord
from kvsched.spec.profiles import get_profile
from kvsched.spec.replay import ProfileReplay
from kvsched.spec.should import DEFAULT_STALL_STEPS
from kvsched.spec.trace import Header, load_line, parse_step

CHECKPOINT_LINES = 4096  # most lines replayed since the scheduler's checkpoint
UNLIMITED = 1 << 62  # no-thrash's limit for the trace's state: it judges nothing


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
        # the trace's state, moved by the lines replayed (prefix caching only)
        self.trace: FastChecker | None = None
        if self.spec.state is not None:
            self.trace = FastChecker(Header(config, preempted_order=preempted_order),
                                     UNLIMITED, RUN_STEPS, DEFAULT_STALL_STEPS, None)

    @property
    def scheduler(self) -> CompiledScheduler:
        scheduler = self.spec.scheduler
        assert isinstance(scheduler, CompiledScheduler)
        return scheduler

    @property
    def diverged(self) -> bool:
        return self.spec.divergence is not None

    def record(self, rec: StepRecord) -> None:
        """One step through the spec's ProfileReplay (its trace state, if it keeps one,
        made from the replay's own, which the caller moves by the same line)."""
        if self.diverged:
            return
        if self.trace is not None:
            # The replay's trace state as the spec's: ProfileReplay moves it by `rec`, and
            # the caller moves the fast checker by the same line, which takes its own
            # state back before it next hands one over (FastChecker.settled).
            self.spec.state = self.trace.settled().state
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
            self._follow(lines)
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
            self._follow([(line, obj)])

    def _follow(self, lines: list[tuple[int, Any]]) -> None:
        """Move the trace's state (prefix caching) by lines the replay went through."""
        if self.trace is None:
            return
        for line, given in lines:
            obj = load_line(given, line) if isinstance(given, bytes) else given
            self.trace.step(line, obj, b"", False)

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
