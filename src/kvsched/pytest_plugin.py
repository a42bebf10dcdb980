"""The kvsched pytest plugin: check every step of your scheduler against the spec.

Installed with kvsched (entry point `pytest11`), so any project's tests can write:

    def test_my_scheduler(kvsched_checked):
        scheduler = kvsched_checked(my_engine.make_scheduler, config)  # or an instance
        scheduler.run(workload)  # a list of kvsched.workload.WorkItem

The fixture wraps any object with the kvsched.spec.interface.Scheduler methods in a
CheckedScheduler: it is itself a scheduler, forwarding every call, and at the end of
each step (`update`) it feeds the step to the spec's checker. A MUST violation (with
`profile=`, also the first divergence from that reference profile; with `strict=True`,
also a SHOULD warning) raises SpecViolation, an AssertionError, in the step it
happens, naming the invariant id, the step, the request and both sides of the broken
inequality. The fixture is session-scoped (it holds no state), so hypothesis tests
may use it with `@given`.

With `strict=True`, a request passed over for more than `starve_steps` steps (SHOULD
starvation: later arrivals, or lower priorities, admitted where it could have run)
raises too.

`run(workload)` also fails a run that cannot end, strict or not: one stuck for
`stall_steps` steps (SHOULD progress: nothing changes while work waits), one still
going at its step bound (four times the tokens the workload can need; `max_steps`
given instead is a cap you chose, where the run simply stops), and one past its
wall-clock limit (`time_limit` seconds, RunTooLong).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import pytest

from kvsched.conformance import checker as new_checker
from kvsched.deadline import OutOfTime, deadline
from kvsched.simulate import run, step_bound, unending
from kvsched.spec import should
from kvsched.spec.checker import Report
from kvsched.spec.interface import Scheduler, abort
from kvsched.spec.model import Config, Decision, Request, RequestView, StepRecord
from kvsched.spec.profiles import PROFILES, resolve_profile
from kvsched.spec.violation import SHOULD, Violation
from kvsched.workload import WorkItem

__all__ = ["CheckedScheduler", "RunTooLong", "SpecViolation", "kvsched_checked"]

# run()'s wall-clock limit by default: ample for a test's workload on any scheduler.
DEFAULT_TIME_LIMIT = 60.0


class SpecViolation(AssertionError):
    """A step broke the spec; `violation` says which invariant, where and by how much."""

    def __init__(self, violation: Violation) -> None:
        numbers = f" ({violation.numbers()})" if violation.numbers() else ""
        where = f", {violation.request}" if violation.request else ""
        super().__init__(f"{violation.level} {violation.invariant} at step {violation.step}"
                         f"{where}{numbers}: {violation.message}")
        self.violation = violation


class RunTooLong(AssertionError):
    """A run went past its wall-clock limit (CheckedScheduler.run's `time_limit`)."""


class CheckedScheduler:
    """A scheduler whose every step is checked by the spec as it happens.

    The driver calls it as it would the wrapped scheduler: add_request and
    abort_request for the step's arrivals and aborts, schedule(), then update(stopped);
    `run(workload)` does that with kvsched's simulation loop.
    """

    def __init__(self, scheduler: Scheduler, *, profile: str | None = None,
                 strict: bool = False,
                 max_preemptions: int = should.DEFAULT_MAX_PREEMPTIONS,
                 stall_steps: int = should.DEFAULT_STALL_STEPS,
                 starve_steps: int = should.DEFAULT_STARVE_STEPS) -> None:
        self.scheduler = scheduler
        self.config: Config = scheduler.config
        self.strict = strict
        self.stall_steps = stall_steps
        # A release names its profile (vllm-v1@0.27.1); an unknown name is an
        # UnknownProfile (a ValueError) naming the nearest known ones.
        named = resolve_profile(profile) if profile else None
        ignored = PROFILES[named].refusal(self.config) if named else None
        if ignored is not None:  # a config field the profile's step would ignore
            raise ValueError(f"kvsched_checked: {ignored}")
        self.checker = new_checker(self.config, profile=named,
                                   strict=strict,
                                   max_preemptions=max_preemptions, stall_steps=stall_steps,
                                   starve_steps=starve_steps)
        self.steps = 0
        self._arrivals: list[Request] = []
        self._aborted: list[str] = []
        self._decision: Decision | None = None

    # -- the scheduler interface, forwarded --------------------------------------------

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)
        self._arrivals.append(request)

    def abort_request(self, request_id: str) -> None:
        """Deliver the abort (kvsched.spec.interface.abort): the step's `aborted` when the
        wrapped scheduler ends the request at once; NoAborts, one line, when it does not
        model aborts."""
        if abort(self.scheduler, request_id):
            self._aborted.append(request_id)

    def schedule(self) -> Decision:
        if self._decision is not None:
            raise RuntimeError("schedule() called twice in one step: call update() first")
        self._decision = self.scheduler.schedule()
        return self._decision

    def update(self, stopped: Collection[str]) -> tuple[str, ...]:
        decision = self._decision
        if decision is None:
            raise RuntimeError("update() called before schedule() in this step")
        finished = tuple(self.scheduler.update(stopped))
        rec = StepRecord(self.steps, tuple(self._arrivals), tuple(self._aborted),
                         decision.rejected, decision.preempted, decision.swapped_in,
                         decision.scheduled, finished, self.scheduler.free_blocks(),
                         decision.new_blocks, released=decision.released,
                         reclaimed=decision.reclaimed)
        self._arrivals, self._aborted, self._decision = [], [], None
        self.steps += 1
        self._check(rec)
        return finished

    def free_blocks(self) -> int:
        return self.scheduler.free_blocks()

    def states(self) -> dict[str, RequestView]:
        return self.scheduler.states()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- checking ----------------------------------------------------------------------

    def _check(self, rec: StepRecord) -> None:
        seen = len(self.checker.report.violations)
        self.checker.step(rec)  # a request never added is the checker's one-state violation
        self._raise_first(self.checker.report.violations[seen:])

    def _raise_first(self, found: Sequence[Violation]) -> None:
        for v in found:
            if v.level != SHOULD or self.strict:
                raise SpecViolation(v)

    @property
    def report(self) -> Report:
        """Everything the checker found so far (SHOULD warnings included)."""
        return self.checker.report

    def end(self, complete: bool = True) -> Report:
        """Close the run; a complete one (every request ended) is checked for
        completion (a SHOULD invariant: it raises only when strict)."""
        seen = len(self.checker.report.violations)
        report = self.checker.end(complete)
        self._raise_first(report.violations[seen:])
        return report

    def run(self, workload: Sequence[WorkItem], *, max_steps: int | None = None,
            time_limit: float | None = DEFAULT_TIME_LIMIT) -> list[StepRecord]:
        """Drive `workload` (sorted by arrival, as kvsched.workload.validate returns it)
        through the simulation loop, checking every step; return the steps. A run that
        gets stuck, or reaches its step bound (without `max_steps`), raises SpecViolation
        (progress); one past `time_limit` seconds raises RunTooLong."""
        records = []
        ended = 0
        stalled = None
        bound = step_bound(self.config, workload, self.stall_steps) if max_steps is None \
            else None  # a cap the caller chose is no bound to fail at
        try:
            with deadline(time_limit) as clock:
                for rec in run(self, workload, max_steps=bound or max_steps,
                               stall_steps=self.stall_steps):
                    records.append(rec)
                    ended += rec.num_ended
                    clock.check()
        except should.Stalled as e:
            stalled = e.violation
        except OutOfTime as e:
            raise RunTooLong(f"the run {e} (at step {len(records)}): pass a larger "
                             "time_limit for a longer run") from None
        never = unending(self.report.violations, stalled, len(records), bound,
                         len(workload) - ended)
        if never is not None:
            raise SpecViolation(never)
        self.end(complete=ended == len(workload))
        return records


Wrap = Callable[..., CheckedScheduler]


def wrap(scheduler: Scheduler | Callable[[Config], Scheduler], config: Config | None = None,
         *, profile: str | None = None, strict: bool = False,
         max_preemptions: int = should.DEFAULT_MAX_PREEMPTIONS,
         stall_steps: int = should.DEFAULT_STALL_STEPS,
         starve_steps: int = should.DEFAULT_STARVE_STEPS) -> CheckedScheduler:
    """A CheckedScheduler around a scheduler instance, or around `factory(config)`."""
    if isinstance(scheduler, Scheduler):
        if config is not None and config != scheduler.config:
            raise ValueError("kvsched_checked: config differs from the scheduler's own config")
        instance = scheduler
    else:
        if config is None:
            raise ValueError("kvsched_checked: a factory needs a config: "
                             "kvsched_checked(factory, config)")
        instance = scheduler(config)
        if not isinstance(instance, Scheduler):
            raise TypeError(f"kvsched_checked: the factory returned a "
                            f"{type(instance).__name__}, which lacks the "
                            "kvsched.spec.interface.Scheduler interface")
    return CheckedScheduler(instance, profile=profile, strict=strict,
                            max_preemptions=max_preemptions, stall_steps=stall_steps,
                            starve_steps=starve_steps)


@pytest.fixture(scope="session")
def kvsched_checked() -> Wrap:
    """Wrap a scheduler (instance, or factory and config) so that every step is checked:
    `kvsched_checked(scheduler_or_factory, config=None, *, profile=None, strict=False)`."""
    return wrap
