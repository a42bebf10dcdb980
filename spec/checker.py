"""The checker: move the spec's state through a trace step by step (state.py) and judge
every step with the MUST and SHOULD invariants (must.py, should.py), and with a
profile replay (replay.py) when one is given.

Memory is bounded by the live requests plus one entry per ended id (to tell "finished"
from "never arrived").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvsched.spec import must, should
from kvsched.spec.model import Config, StepRecord
from kvsched.spec.replay import ProfileReplay
from kvsched.spec.state import Snapshot, State, StepFacts
from kvsched.spec.trace import TraceReader
from kvsched.spec.violation import INVARIANTS, SHOULD, Violation

if TYPE_CHECKING:
    from kvsched.spec.profiles import Profile


@dataclass(frozen=True)
class CheckOptions:
    """How to judge a trace: SHOULD warnings fail too when `strict`; `max_preemptions`
    is no-thrash's K, `stall_steps` progress's K, `starve_steps` starvation's K; `keep`
    violations of each id are kept whole (all are counted); an
    invariant in `required` that the trace lets the checker judge only in part or not at
    all fails the check (CI's `--require block-ids,accounting`)."""

    strict: bool = False
    max_preemptions: int = should.DEFAULT_MAX_PREEMPTIONS
    keep: int = 20
    required: frozenset[str] = frozenset()  # invariants that must be checked in full
    stall_steps: int = should.DEFAULT_STALL_STEPS
    starve_steps: int = should.DEFAULT_STARVE_STEPS


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
    # Invariants judged in part or not at all, with the reason; those `required` must not be.
    unchecked: dict[str, str] = field(default_factory=dict)
    required: frozenset[str] = frozenset()

    def errors(self) -> int:
        """MUST violations and profile divergences: these fail a check."""
        return sum(n for k, n in self.counts.items() if INVARIANTS[k] != SHOULD)

    def warnings(self) -> int:
        """SHOULD violations: these fail only a strict check."""
        return sum(n for k, n in self.counts.items() if INVARIANTS[k] == SHOULD)

    def missing(self) -> dict[str, str]:
        """The required invariants that were not fully checked, with the reason."""
        return {k: why for k, why in self.unchecked.items() if k in self.required}

    @property
    def failed(self) -> bool:
        return (self.errors() > 0 or (self.strict and self.warnings() > 0)
                or bool(self.missing()))

    def ids(self) -> set[str]:
        return set(self.counts)


def judge(f: StepFacts, state: State, options: CheckOptions, leaked: int,
          preempted_order: bool = True) -> list[Violation]:
    """Every invariant broken by one step, id by id in the order of INVARIANTS (each id
    in the order the step applied its actions); `state` is the state after the step;
    `preempted_order` is the trace header's (False: victims listed as a set)."""
    cfg = state.config
    return [
        *must.kv_budget(f), *must.cpu_budget(f), *must.token_budget(f, cfg),
        *must.seq_limit(f, cfg), *must.token_range(f, cfg), *must.one_state(f),
        *must.preempt(f, cfg), *must.finish(f, cfg), *must.reject(f, cfg),
        *must.block_ids(f, cfg), *must.accounting(f, leaked),
        *should.no_idle(f, state), *should.no_thrash(f, options.max_preemptions),
        *should.needed_preemption(f, cfg, preempted_order),
    ]


def coverage(state: State, steps: int, steps_with_free: int, complete: bool,
             unjudged: Mapping[str, str] | None = None) -> dict[str, str]:
    """The invariants a trace let the checker judge only in part or not at all, each
    with the reason (every other invariant was checked on every step); `unjudged`: the
    SHOULD ids not judged under the trace's step kind and profile (should.unjudged;
    by default, without a profile)."""
    out: dict[str, str] = {}
    if not state.ids_seen:
        out["block-ids"] = "the trace carries no block ids (new_blocks)"
    elif state.ids_missing_from is not None:
        out["block-ids"] = (f"in part: from step {state.ids_missing_from} on, blocks were "
                            "handed out without ids (no new_blocks), so while they are "
                            "held their owners are unknown")
    if steps_with_free == 0:
        out["accounting"] = "the trace reports no free_blocks"
    elif steps_with_free < steps:
        out["accounting"] = (f"in part: {steps - steps_with_free} of {steps} steps report no "
                             "free_blocks")
    if not complete:
        out["completion"] = 'the trace has no {"end": true} line'
    out.update(should.unjudged(state.config) if unjudged is None else unjudged)
    cfg = state.config
    if should.sglang_steps(cfg) and cfg.policy == "priority" \
            and "needed-preemption" not in out:
        out["needed-preemption"] = ("in part: not on SGLang's steps whose running requests "
                                    "and victims fill max_num_seqs, where its priority "
                                    "preemption frees a seat")
    return out


def named_profile(name: str) -> Profile | None:
    """The profile named `name`, or None when no profile has that name (a replay of a
    scheduler that is no profile's)."""
    from kvsched.spec.profiles import UnknownProfile, get_profile

    try:
        return get_profile(name)
    except UnknownProfile:
        return None


@dataclass(frozen=True)
class Position:
    """Where a check stands between two steps, besides its report: the state, the free
    blocks already told as leaked, how many steps reported free_blocks, the last step's
    number and the quiet steps in a row (should.Stall). Another implementation of the
    check (kvsched.optimized.checker) takes it over and hands it back (`position`,
    `seek`), so that a run of steps it cannot judge is judged here, from where it
    left off."""

    state: Snapshot
    leaked: int
    steps_with_free: int
    step_no: int
    quiet: int


class Checker:
    """Feed it the steps of one trace in order, then call `end` for the report.

    With a `replay` (a profile's scheduler replaying the trace's inputs, as
    kvsched.conformance builds one), every step's decision is also compared with the
    profile's, and the first divergence is a `profile` violation. `preempted_order` is
    the trace header's: False when the engine lists each step's victims as a set.
    `profile`: the profile the trace is checked under, whose documented policy some
    SHOULD ids are not judged against (should.unjudged); by default the one the replay
    names, if any (else the trace's step kind alone decides).
    """

    def __init__(self, config: Config, options: CheckOptions | None = None,
                 replay: ProfileReplay | None = None, preempted_order: bool = True,
                 profile: Profile | None = None) -> None:
        self.config = config
        if profile is None and replay is not None:
            profile = named_profile(replay.profile)
        self.unjudged = should.unjudged(config, profile)
        self.preempted_order = preempted_order
        self.options = options or CheckOptions()
        self.replay = replay
        self.state = State(config)
        self.report = Report(profile=replay.profile if replay else None,
                             strict=self.options.strict, required=self.options.required)
        self.leaked = 0  # free blocks the engine reported missing, so each leak is told once
        self.steps_with_free = 0
        self.step_no = -1
        self.stall = should.Stall(self.options.stall_steps)
        self.starvation = should.Starvation(self.options.starve_steps)

    def position(self, shared: bool = False) -> Position:
        """Where the check stands (State.snapshot's `shared`: for a reader done with
        the live requests before the next step)."""
        return Position(self.state.snapshot(shared), self.leaked, self.steps_with_free,
                        self.step_no, self.stall.quiet)

    def seek(self, p: Position, owned: bool = False) -> None:
        """Go on from `p` (the ids that ended meanwhile: State.record_ended; `owned`:
        as State.restore's, for a position made for this one seek)."""
        self.state.restore(p.state, owned)
        self.leaked, self.steps_with_free, self.step_no = (p.leaked, p.steps_with_free,
                                                           p.step_no)
        self.stall.quiet = p.quiet

    def passed(self, steps: int, entries: int, requests: int) -> None:
        """Count steps that another implementation of the check found clean."""
        self.report.steps += steps
        self.report.scheduled_entries += entries
        self.report.requests += requests

    def flag(self, v: Violation) -> None:
        if v.invariant in self.unjudged:
            return
        self.report.counts[v.invariant] += 1
        if self.report.counts[v.invariant] <= self.options.keep:
            self.report.violations.append(v)

    def step(self, rec: StepRecord) -> StepFacts:
        """Check one step; return its facts."""
        self.step_no = rec.step
        f = self.state.apply(rec)
        self.steps_with_free += rec.free_blocks is not None
        self.report.steps += 1
        self.report.scheduled_entries += len(rec.scheduled)
        self.report.requests += len(f.arrivals)
        for v in judge(f, self.state, self.options, self.leaked, self.preempted_order):
            self.flag(v)
        if self.stall.observe(should.moves(rec), self.state.working):
            self.flag(should.state_progress(rec.step, self.stall.limit, self.state))
        for v in self.starvation.observe(rec.step, should.passed_over(f, self.state),
                                         self.state):
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
        """Close the trace; a complete one (with its end line) is checked for completion,
        one without it for ending stuck (its last K steps or more moved nothing while work
        waits)."""
        self.report.complete = complete
        if complete:
            for v in must.held_at_end(self.step_no, self.state):
                self.flag(v)
            for v in should.completion(self.step_no, self.state):
                self.flag(v)
        elif self.stall.quiet >= self.stall.limit:
            self.flag(should.ends_stuck(self.step_no, self.stall.quiet, self.state))
        self.report.unchecked = coverage(self.state, self.report.steps, self.steps_with_free,
                                         complete, self.unjudged)
        return self.report


def check_trace(reader: TraceReader, options: CheckOptions | None = None,
                replay: ProfileReplay | None = None) -> Report:
    """Check a whole trace as it streams from `reader`."""
    return Checker(reader.header.config, options, replay,
                   reader.header.preempted_order).run_trace(reader)


def check_steps(config: Config, steps: Iterable[StepRecord], complete: bool,
                options: CheckOptions | None = None,
                replay: ProfileReplay | None = None) -> Report:
    """Check a sequence of steps; `complete` when it is a whole trace (an end line)."""
    return Checker(config, options, replay).run(steps, complete)
