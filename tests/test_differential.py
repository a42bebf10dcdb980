"""Differential, stateful: the reference and a fast scheduler in lockstep (the compiled
scheduler, and the torch one on cpu and, where torch sees a GPU, on cuda).

Hypothesis draws a config and a profile (or any knobs) in @initialize, so they shrink,
then a program of arrivals, aborts and steps (with end-of-sequence chosen per sampled
request) that both schedulers receive alike. After every step the decisions must be
equal (rejections, preemptions with their mode, swap-ins, scheduled ids and token
counts in order, sampled ids, new block ids), and after every rule so must the state:
every request's view, the free block count, the block tables and the free lists.
A failure prints the minimal program.

Half the configs turn prefix caching on; then a rule brings a workload whose prompts
start with shared prefixes or with whole earlier requests (conversation turns), so
that hits, shared blocks, evictions and vLLM's free-list order all occur.

vLLM V0's and SGLang's steps are the reference's alone (the fast schedulers refuse
them): on those, `test_reference_only_step_kinds_agree_with_their_profile_replay`
compares what applies, the reference's runs against the spec's checker and the
profile's replay.

Profiles: `ci` runs 60 programs of up to 50 rules in `make test`; `deep` (make
fuzz-deep) runs 2000 programs of up to 500 rules. The same machine runs on cuda when
torch sees a GPU.
"""

from __future__ import annotations

import contextlib
import os
from unittest import TestCase

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    MultipleResults,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from kvsched.conformance import check_profile
from kvsched.optimized.compiled import CompiledScheduler
from kvsched.reference import ReferenceScheduler, scheduler_for
from kvsched.simulate import run
from kvsched.spec import Config, Decision, Request, StepRecord, check_steps
from kvsched.spec.interface import abort as deliver_abort
from kvsched.spec.interface import not_aborting
from kvsched.spec.profiles import get_profile
from kvsched.spec.should import Stalled
from kvsched.strategies import (
    configs,
    output_lens,
    policies,
    profiles,
    prompt_lens,
    resolve,
    servable,
    step_kind,
    workloads,
)
from kvsched.testing.implementations import SchedulerFactory

# Per-step tensors are small: intra-op threads only wait on each other (and pytest -n 2
# already gives each of the 2 cores a worker).
torch.set_num_threads(1)

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
STEPS = 500 if DEEP else 50
DRAIN_STEPS = 300


def describe(d: Decision) -> str:
    return (f"rejected={[r.id for r in d.rejected]} "
            f"preempted={[(p.id, p.mode) for p in d.preempted]} "
            f"swapped_in={list(d.swapped_in)} scheduled={list(d.scheduled)} "
            f"sampled={list(d.sampled)} new_blocks={d.new_blocks} "
            f"prefix_hits={d.prefix_hits}")


class LockstepMachine(RuleBasedStateMachine):
    """Both schedulers receive the same calls; every answer must be the same."""

    implementation = "compiled"
    ids = Bundle("ids")

    def __init__(self) -> None:
        super().__init__()
        self.started = False

    @initialize(target=ids, config=st.one_of(configs(), configs(prefix_caching=True)),
                data=st.data())
    def start(self, config: Config, data: st.DataObject) -> str:
        torch = self.implementation.startswith("optimized")
        config, setup = resolve(config, data.draw(policies(torch), label="setup"))
        self.config = config
        self.reference = ReferenceScheduler(config, setup)
        self.other = SchedulerFactory(self.implementation)(config, setup)
        self.step_no = 0
        self.next_id = 0
        self.started = True
        return self._arrive(data, 0)

    # -- rules ------------------------------------------------------------------------

    @rule(target=ids, data=st.data(), priority=st.integers(-2, 2))
    def arrive(self, data: st.DataObject, priority: int) -> str:
        return self._arrive(data, priority)

    @rule(data=st.data(), count=st.integers(2, 6))
    def burst(self, data: st.DataObject, count: int) -> None:
        """Several arrivals in one step, with mixed priorities."""
        for _ in range(count):
            self._arrive(data, data.draw(st.integers(-2, 2), label="priority"))

    @precondition(lambda self: self.started and self.config.prefix_caching)
    @rule(target=ids, data=st.data())
    def shared_arrivals(self, data: st.DataObject) -> MultipleResults[str]:
        """A workload arriving now whose prompts start with shared prefixes (s0, s1) or
        with whole earlier requests of it (a conversation's next turn)."""
        items = data.draw(workloads(self.config, max_requests=4, max_arrival=0,
                                    shared=True), label="workload")
        names = {w.id: f"r{self.next_id + i}" for i, w in enumerate(items)}
        self.next_id += len(items)
        for w in items:
            prefix = tuple((names.get(c, c), n) for c, n in w.shared)
            request = Request(names[w.id], w.prompt_len, w.max_tokens, w.priority,
                              self.step_no, prefix)
            self.reference.add_request(request)
            self.other.add_request(request)
        return multiple(*names.values())

    @rule(rid=ids)
    def abort(self, rid: str) -> None:
        live = rid in self.reference.states()
        assert live == (rid in self.other.states()), f"{rid} live in one scheduler only"
        if live:
            assert deliver_abort(self.reference, rid) == deliver_abort(self.other, rid)

    @rule(eos=st.lists(st.booleans(), max_size=8))
    def step(self, eos: list[bool]) -> None:
        """One step of both; the i-th sampled request hits end-of-sequence if eos[i]."""
        self._step(eos)

    @rule(steps=st.integers(2, 12))
    def run_steps(self, steps: int) -> None:
        """A few steps without end-of-sequence (requests reach max_tokens, blocks fill)."""
        for _ in range(steps):
            self._step([])

    @precondition(lambda self: self.started and isinstance(self.other, CompiledScheduler))
    @rule()
    def checkpoint(self) -> None:
        """Go on with a copy of the fast scheduler (the compiled one's checkpoint, which
        the profile replay restores): it must decide as the original would have."""
        assert isinstance(self.other, CompiledScheduler)
        self.other = self.other.copy()

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def same_states(self) -> None:
        if not self.started:
            return
        ref, opt = self.reference.states(), self.other.states()
        assert ref == opt, f"after step {self.step_no}: states differ\n  reference {ref}\n" \
                           f"  {self.implementation} {opt}"

    @invariant()
    def same_free_blocks(self) -> None:
        if not self.started:
            return
        assert self.reference.free_blocks() == self.other.free_blocks()
        assert self.reference.free_gpu_ids() == self.other.free_gpu_ids(), \
            "GPU free lists differ"
        assert self.reference.free_host_ids() == self.other.free_host_ids(), \
            "host free lists differ"

    @invariant()
    def same_block_tables(self) -> None:
        if not self.started:
            return
        for rid in self.reference.states():
            assert self.reference.block_table(rid) == self.other.block_table(rid), \
                f"GPU block table of {rid}"
            assert self.reference.host_table(rid) == self.other.host_table(rid), \
                f"host block table of {rid}"

    def teardown(self) -> None:
        """Drain: both finish everything live, still in lockstep."""
        if not self.started:
            return
        for _ in range(DRAIN_STEPS):
            if not self.reference.has_unfinished():
                break
            self._step([])
        assert self.reference.has_unfinished() == self.other.has_unfinished()

    # -- helpers ----------------------------------------------------------------------

    def _arrive(self, data: st.DataObject, priority: int) -> str:
        rid = f"r{self.next_id}"
        self.next_id += 1
        request = Request(rid, data.draw(prompt_lens(self.config), label="prompt_len"),
                          data.draw(output_lens(self.config), label="max_tokens"),
                          priority, self.step_no)
        self.reference.add_request(request)
        self.other.add_request(request)
        return rid

    def _step(self, eos: list[bool]) -> None:
        ref = self.reference.schedule()
        opt = self.other.schedule()
        assert ref.comparable() == opt.comparable(), (
            f"step {self.step_no}: decisions differ\n  reference {describe(ref)}\n"
            f"  {self.implementation} {describe(opt)}")
        assert ref.sampled == opt.sampled, f"step {self.step_no}: sampled differ"
        assert ref.new_blocks == opt.new_blocks, (
            f"step {self.step_no}: new block ids differ\n  reference {ref.new_blocks}\n"
            f"  {self.implementation} {opt.new_blocks}")
        assert ref.prefix_hits == opt.prefix_hits, (
            f"step {self.step_no}: prefix hits differ\n  reference {ref.prefix_hits}\n"
            f"  {self.implementation} {opt.prefix_hits}")
        assert list(ref.prefix_hits) == list(opt.prefix_hits), "prefix hits out of order"
        assert [r.reason for r in ref.rejected] == [r.reason for r in opt.rejected]
        stopped = [rid for rid, stop in zip(ref.sampled, eos, strict=False) if stop]
        finished = self.reference.update(stopped)
        assert finished == self.other.update(stopped), f"step {self.step_no}: finishes"
        self.step_no += 1


def lockstep_test_case(implementation: str) -> type[TestCase]:
    """The lockstep machine's test case against `implementation` (SchedulerFactory's)."""
    class Against(LockstepMachine):
        pass

    Against.implementation = implementation
    Against.TestCase.settings = settings(stateful_step_count=STEPS)
    case: type[TestCase] = Against.TestCase
    return case


TestLockstepCompiled = lockstep_test_case("compiled")
TestLockstepCpu = lockstep_test_case("optimized")
TestLockstepCuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="torch.cuda.is_available() is False: no CUDA GPU on this machine")(
    lockstep_test_case("optimized-cuda"))


# -- the step kinds the fast schedulers refuse ----------------------------------------------

@settings(max_examples=30, deadline=None)
@given(config=st.one_of(configs(), configs(prefix_caching=True)),
       name=profiles(scheduler=None).filter(lambda n: get_profile(n).scheduler != "v1"),
       data=st.data())
def test_reference_only_step_kinds_agree_with_their_profile_replay(
        config: Config, name: str, data: st.DataObject) -> None:
    """vLLM V0's, SGLang's and LMDeploy's steps are the reference's alone: the compiled
    and torch schedulers refuse them (checked here). What applies on those kinds is the
    reference against the spec: its run (aborts included where the step models them) is
    MUST-clean, and the profile's replay of the trace, from the spec's replay of the
    arrivals and finishes, agrees with it step by step. V0's runs are cut at 300 steps
    (its profile reproduces V0's stalls)."""
    kind = step_kind(name)
    config, knobs = resolve(config, name)
    config = servable(config, kind)
    with pytest.raises(ValueError):
        SchedulerFactory("compiled")(config, knobs, kind)
    scheduler = scheduler_for(config, knobs, kind)
    items = data.draw(workloads(config, shared=config.prefix_caching,
                                aborts=not_aborting(scheduler, "") is None), label="workload")
    records: list[StepRecord] = []
    with contextlib.suppress(Stalled):
        records.extend(run(scheduler, items, max_steps=300))
    report = check_steps(config, records, complete=False)
    assert report.errors() == 0, [v.message for v in report.violations]
    assert check_profile(config, records, name) == []
