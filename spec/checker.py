"""The checker: move the spec's state through a trace step by step (state.py) and judge
every step with the MUST and SHOULD invariants (must.py, should.py), and with a
profile replay (replay.py) when one is given.

Memory is bounded by the live requests plus one entry per ended id (to tell "finished"
from "never arrived").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvsched.spec import must, should
from kvsched.spec.model import Config, StepRecord
from kvsched.spec.replay import ProfileReplay
from kvsched.spec.state import FIELD, NEVER_ARRIVED, State, StepFacts
from kvsched.spec.trace import TraceError, TraceReader
from kvsched.spec.violation import INVARIANTS, SHOULD, Violation


@dataclass(frozen=True)
class CheckOptions:
    """How to judge a trace: SHOULD warnings fail too when `strict`; `max_preemptions`
    is no-thrash's K; `keep` violations of each id are kept whole (all are counted)."""

    strict: bool = False
    max_preemptions: int = should.DEFAULT_MAX_PREEMPTIONS
    keep: int = 20


@dataclass
class Report:
    """What a check found. `violations` keeps the first `keep` of each id; `counts` all."""

    violations: list[Violation] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    steps: int = 0
    scheduled_entries: int = 0
    requests: int = 0
    complete: bool = False
    unknown_keys: dict[str, int] = field(default_factory=dict)
    profile: str | None = None  # the profile the decisions were compared with
    strict: bool = False
    block_ids: bool = False  # the first step carries new_blocks: block-ids is checked
    free_blocks: bool = False  # some step reports free_blocks: accounting is checked

    def errors(self) -> int:
        """MUST violations and profile divergences: these fail a check."""
        return sum(n for k, n in self.counts.items() if INVARIANTS[k] != SHOULD)

    def warnings(self) -> int:
        """SHOULD violations: these fail only a strict check."""
        return sum(n for k, n in self.counts.items() if INVARIANTS[k] == SHOULD)

    @property
    def failed(self) -> bool:
        return self.errors() > 0 or (self.strict and self.warnings() > 0)

    def ids(self) -> set[str]:
        return set(self.counts)


def judge(f: StepFacts, state: State, options: CheckOptions, leaked: int) -> list[Violation]:
    """Every invariant broken by one step, id by id in the order of INVARIANTS (each id
    in the order the step applied its actions); `state` is the state after the step."""
    cfg = state.config
    return [
        *must.kv_budget(f), *must.cpu_budget(f), *must.token_budget(f, cfg),
        *must.seq_limit(f, cfg), *must.token_range(f, cfg), *must.one_state(f),
        *must.preempt(f), *must.finish(f, cfg), *must.reject(f, cfg),
        *must.block_ids(f, cfg), *must.accounting(f, leaked),
        *should.no_idle(f, state), *should.no_thrash(f, options.max_preemptions),
        *should.needed_preemption(f, cfg),
    ]


def unreadable(f: StepFacts) -> str | None:
    """Why the step cannot be read as one of this trace: an id arriving twice, or an id
    named that never arrived (the first, in the order the step applies its fields)."""
    for a in f.arrivals:
        if not a.applied:
            return f"request id {a.request!r} arrives twice; ids must be unique"
    decided = [*f.aborts, *(a for a, _ in f.rejections), *(v.action for v in f.victims),
               *(a for a, _ in f.swap_ins), *(c.action for c in f.chunks)]
    named = [*((FIELD[a.action], a.request) for a in decided if a.state == NEVER_ARRIVED),
             *(("new_blocks", rid) for rid in f.unknown_new_blocks),
             *(("finished", d.action.request) for d in f.finishes
               if d.action.state == NEVER_ARRIVED)]
    for where, rid in named:
        return f"unknown request id {rid!r} in {where} (it never arrived)"
    return None


class Checker:
    """Feed it the steps of one trace in order, then call `end` for the report.

    With a `replay` (a profile's scheduler replaying the trace's inputs, as
    kvsched.conformance builds one), every step's decision is also compared with the
    profile's, and the first divergence is a `profile` violation.
    """

    def __init__(self, config: Config, options: CheckOptions | None = None,
                 replay: ProfileReplay | None = None) -> None:
        self.config = config
        self.options = options or CheckOptions()
        self.replay = replay
        self.state = State(config)
        self.report = Report(profile=replay.profile if replay else None,
                             strict=self.options.strict)
        self.leaked = 0  # free blocks the engine reported missing, so each leak is told once
        self.step_no = -1

    def flag(self, v: Violation) -> None:
        self.report.counts[v.invariant] += 1
        if self.report.counts[v.invariant] <= self.options.keep:
            self.report.violations.append(v)

    def step(self, rec: StepRecord) -> StepFacts:
        """Check one step; return its facts. Raises TraceError for what cannot be read."""
        self.step_no = rec.step
        f = self.state.apply(rec)
        why = unreadable(f)
        if why is not None:
            raise TraceError(rec.line, why)
        if self.report.steps == 0:
            self.report.block_ids = rec.new_blocks is not None
        self.report.free_blocks |= rec.free_blocks is not None
        self.report.steps += 1
        self.report.scheduled_entries += len(rec.scheduled)
        self.report.requests += len(f.arrivals)
        for v in judge(f, self.state, self.options, self.leaked):
            self.flag(v)
        if rec.free_blocks is not None:
            self.leaked = f.free - rec.free_blocks
        if self.replay is not None:
            divergence = self.replay.step(rec)
            if divergence is not None:
                self.report.counts[divergence.invariant] += 1
                self.report.violations.append(divergence)
        return f

    def run(self, steps: Iterable[StepRecord], complete: bool) -> Report:
        """Check every step, then end: the whole report."""
        for rec in steps:
            self.step(rec)
        return self.end(complete)

    def run_trace(self, reader: TraceReader) -> Report:
        """Check a whole trace as it streams from `reader`, with its ignored keys."""
        for rec in reader:
            self.step(rec)
        report = self.end(reader.complete)
        report.unknown_keys = dict(reader.unknown_keys)
        return report

    def end(self, complete: bool) -> Report:
        """Close the trace; a complete one (with its end line) is checked for completion."""
        self.report.complete = complete
        if complete:
            for v in should.completion(self.step_no, self.state):
                self.flag(v)
        return self.report


def check_trace(reader: TraceReader, options: CheckOptions | None = None,
                replay: ProfileReplay | None = None) -> Report:
    """Check a whole trace as it streams from `reader`."""
    return Checker(reader.header.config, options, replay).run_trace(reader)


def check_steps(config: Config, steps: Iterable[StepRecord], complete: bool,
                options: CheckOptions | None = None,
                replay: ProfileReplay | None = None) -> Report:
    """Check a sequence of steps; `complete` when it is a whole trace (an end line)."""
    return Checker(config, options, replay).run(steps, complete)
