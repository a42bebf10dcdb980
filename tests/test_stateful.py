"""Stateful test: hypothesis drives a scheduler one event at a time (arrivals, aborts,
steps with end-of-sequence chosen by hypothesis) and checks, after every event, the
spec's checker on the steps so far and the scheduler's own bookkeeping. Config and
profile are drawn in @initialize, so they shrink too. The machine runs on every
implementation: `machine_for` builds one machine class per scheduler factory.
"""

from __future__ import annotations

import sys

from hypothesis import assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from kvsched.spec import Checker, Config, Decision, Request, Status, StepRecord
from kvsched.spec.interface import abort as deliver_abort
from kvsched.spec.interface import not_aborting
from kvsched.strategies import (
    configs,
    output_lens,
    policies,
    prompt_lens,
    resolve,
    servable,
    step_kind,
)
from kvsched.testing.implementations import SchedulerFactory

# To finish what is live at the end: a request alone needs at most max_model_len steps
# (prefill at one token a step, then decodes); 200 leaves room for waiting and
# recomputing. Running out is a liveness failure.
DRAIN_STEPS_PER_REQUEST = 200


class SchedulerMachine(RuleBasedStateMachine):
    """The machine for schedulers that `build` makes (set by `machine_for`)."""

    build: SchedulerFactory
    ids = Bundle("ids")

    def __init__(self) -> None:
        super().__init__()
        self.started = False

    @initialize(target=ids, config=configs(), data=st.data())
    def start(self, config: Config, data: st.DataObject) -> str:
        """The config, the policy, and a first request (so that abort has an id). The
        reference draws profiles of every step kind whose steps apply their output before
        the next (v1, v0, sglang): the machine's bookkeeping ends a request at its finish,
        and a pipelined step (LMDeploy's) holds it and its blocks until a later release;
        the compiled and torch schedulers run vLLM v1's step alone."""
        every = self.build.implementation == "reference"
        policy = data.draw(policies(self.build.torch, None if every else "v1"), label="setup")
        config, setup = resolve(config, policy)
        assume(not config.pipelined)
        config = servable(config, step_kind(policy))
        self.started = True
        self.config = config
        self.kind = step_kind(policy)
        self.sched = self.build(config, setup, self.kind)
        self.checker = Checker(config)
        self.step_no = 0
        self.arrivals: list[Request] = []
        self.aborted: list[str] = []
        self.unchecked: list[StepRecord] = []
        self.live: set[str] = set()
        self.ended: set[str] = set()
        return self._arrive(data, priority=0)

    # -- rules ------------------------------------------------------------------------

    @rule(target=ids, data=st.data(), priority=st.integers(-2, 2))
    def arrive(self, data: st.DataObject, priority: int) -> str:
        return self._arrive(data, priority)

    @rule(rid=ids)
    def abort(self, rid: str) -> None:
        if rid not in self.live or not_aborting(self.sched, rid) is not None:
            return  # ended already (a client cannot cancel it twice), or no aborts modelled
        if deliver_abort(self.sched, rid):  # SGLang's running ones finish at their sample
            self.aborted.append(rid)
            self._end(rid)

    @rule(eos=st.lists(st.booleans(), max_size=6))
    def step(self, eos: list[bool]) -> None:
        """One scheduler step; the i-th sampled request hits end-of-sequence if eos[i]."""
        decision = self.sched.schedule()
        stopped = [rid for rid, stop in zip(decision.sampled, eos, strict=False) if stop]
        self._record(decision, self.sched.update(stopped))

    # -- invariants, after every rule ------------------------------------------------

    @invariant()
    def checker_finds_no_must_violation(self) -> None:
        for record in self.unchecked:
            self.checker.step(record)
        self.unchecked = []
        report = self.checker.report
        assert report.errors() == 0, "; ".join(
            f"{v.invariant} at step {v.step}: {v.message}" for v in report.violations)

    @invariant()
    def free_blocks_are_the_blocks_no_live_request_holds(self) -> None:
        states = self.sched.states()
        held = sum(v.gpu_blocks for v in states.values())
        assert self.sched.free_blocks() == self.config.num_gpu_blocks - held, (
            f"free {self.sched.free_blocks()} != {self.config.num_gpu_blocks} - {held} held")
        on_host = sum(v.host_blocks for v in states.values())
        assert len(self.sched.free_host_ids()) == self.config.num_cpu_blocks - on_host

    @invariant()
    def ended_requests_hold_no_blocks(self) -> None:
        states = self.sched.states()
        for rid in self.ended:
            assert rid not in states, f"{rid} ended but is still {states[rid].status}"
            assert self.sched.block_table(rid) == (), f"{rid} ended holding GPU blocks"
            assert self.sched.host_table(rid) == (), f"{rid} ended holding host blocks"
        # What no live request holds is free: nothing is left with an ended one.
        held = sum(v.gpu_blocks for v in states.values())
        assert len(self.sched.free_gpu_ids()) + held == self.config.num_gpu_blocks

    @invariant()
    def running_within_max_num_seqs(self) -> None:
        running = [rid for rid, v in self.sched.states().items() if v.status == Status.RUNNING]
        assert len(running) <= self.config.max_num_seqs, running

    @invariant()
    def computed_within_known(self) -> None:
        for rid, v in self.sched.states().items():
            assert 0 <= v.num_computed <= v.num_tokens, (rid, v)

    @invariant()
    def live_requests_are_the_ones_not_ended(self) -> None:
        assert set(self.sched.states()) == self.live

    def teardown(self) -> None:
        """Liveness: with no more arrivals, the scheduler finishes everything live
        (EOS never comes, so each runs to max_tokens or max_model_len). vLLM V0's step
        reproduces V0's own stalls and livelocks (docs/proofs.md): on it, the drain is
        checked for MUST violations only."""
        if not self.started or sys.exc_info()[1] is not None:
            return  # a rule or invariant failed already: report that failure alone
        bound = DRAIN_STEPS_PER_REQUEST * (1 + len(self.live))
        for _ in range(bound):
            if not self.sched.has_unfinished() and not self.arrivals and not self.aborted:
                break
            decision = self.sched.schedule()
            self._record(decision, self.sched.update(()))
        if self.kind == "v0":
            self.checker_finds_no_must_violation()
            return
        assert not self.sched.has_unfinished(), (
            f"liveness: {sorted(self.live)} still live after {bound} more steps")
        self.checker_finds_no_must_violation()
        report = self.checker.end(complete=True)
        stuck = [v.message for v in report.violations
                 if v.invariant in ("completion", "no-idle")]
        assert not stuck, stuck

    # -- bookkeeping ------------------------------------------------------------------

    def _arrive(self, data: st.DataObject, priority: int) -> str:
        rid = f"r{len(self.live) + len(self.ended)}"
        request = Request(rid, data.draw(prompt_lens(self.config), label="prompt_len"),
                          data.draw(output_lens(self.config), label="max_tokens"),
                          priority, self.step_no)
        self.sched.add_request(request)
        self.arrivals.append(request)
        self.live.add(rid)
        return rid

    def _end(self, rid: str) -> None:
        self.live.discard(rid)
        self.ended.add(rid)

    def _record(self, decision: Decision, finished: tuple[str, ...]) -> None:
        self.unchecked.append(StepRecord(
            self.step_no, tuple(self.arrivals), tuple(self.aborted), decision.rejected,
            decision.preempted, decision.swapped_in, decision.scheduled, finished,
            self.sched.free_blocks(), decision.new_blocks))
        for rejection in decision.rejected:
            self._end(rejection.id)
        for rid in finished:
            self._end(rid)
        self.arrivals = []
        self.aborted = []
        self.step_no += 1


def machine_for(factory: SchedulerFactory) -> type[SchedulerMachine]:
    """The machine on the schedulers `factory` builds."""
    class Machine(SchedulerMachine):
        build = factory

    return Machine


def test_scheduler_machine(scheduler_factory: SchedulerFactory) -> None:
    run_state_machine_as_test(machine_for(scheduler_factory),
                              settings=settings(stateful_step_count=50))
