"""The reference's test suite, run on both schedulers (the PEP 399 pattern).

The reference's own tests (the vLLM v1 scenarios, the property tests, the stateful
machine) build their scheduler through a module-level name; here each runs once per
implementation, with that name pointing at the reference or at the optimized
scheduler, so that a test added there is run on the optimized scheduler too. Two
invariants of the stateful machine read the reference allocator's internals; for the
optimized scheduler they read its own free lists instead (same assertions).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import test_property
import test_stateful
import test_vllm_v1_profile
import torch
from hypothesis.stateful import invariant, run_state_machine_as_test

from kvsched.optimized import OptimizedScheduler
from kvsched.reference import ReferenceScheduler
from kvsched.spec import Config, Scheduler
from kvsched.spec.profiles import Profile, get_profile

torch.set_num_threads(1)  # small tensors: intra-op threads only add waiting

NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(),
                             reason="torch.cuda.is_available() is False: no CUDA GPU here")
IMPLEMENTATIONS = ("reference", "optimized", pytest.param("optimized-cuda", marks=NO_CUDA))


class Built:
    """Counts the optimized schedulers a test builds: a test that never built one would
    have tested the reference twice."""

    count = 0
    device = "cpu"


def build(config: Config, knobs: Any = None) -> OptimizedScheduler:
    Built.count += 1
    return OptimizedScheduler(config, knobs, device=Built.device)


class OptimizedProfile:
    """A reference profile whose `scheduler` is the optimized one (same knobs)."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.name = profile.name
        self.knobs = profile.knobs

    def configure(self, config: Config, given: frozenset[str] = frozenset()) -> Config:
        return self.profile.configure(config, given)

    def scheduler(self, config: Config) -> OptimizedScheduler:
        return build(config, self.knobs)


def optimized_profile(name: str) -> OptimizedProfile:
    return OptimizedProfile(get_profile(name))


def use(implementation: str, monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
    """Point `module`'s scheduler names at `implementation`."""
    if implementation == "reference":
        return
    monkeypatch.setattr(Built, "device", "cuda" if implementation.endswith("cuda") else "cpu")
    for name, value in (("ReferenceScheduler", build),
                        ("get_profile", optimized_profile)):
        if hasattr(module, name):
            monkeypatch.setattr(module, name, value)


def scenario_names() -> list[str]:
    return sorted(name for name, f in vars(test_vllm_v1_profile).items()
                  if name.startswith("test_") and callable(f))


def optimized_scheduler(profile: str = "vllm-v1", **config: Any) -> OptimizedScheduler:
    return build(Config(**config), get_profile(profile).knobs)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", scenario_names())
def test_vllm_v1_scenario(name: str, implementation: str,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    if implementation != "reference":
        use(implementation, monkeypatch, test_vllm_v1_profile)
        monkeypatch.setattr(test_vllm_v1_profile, "scheduler", optimized_scheduler)
    before = Built.count
    getattr(test_vllm_v1_profile, name)()
    assert (Built.count > before) == (implementation != "reference")


SCHEDULER_PROPERTIES = ("test_every_profile_obeys_the_spec",
                        "test_every_knob_combination_obeys_the_spec",
                        "test_a_burst_that_overflows_the_cache_preempts_and_still_completes")


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", SCHEDULER_PROPERTIES)
def test_scheduler_property(name: str, implementation: str,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    use(implementation, monkeypatch, test_property)
    test: Callable[[], None] = getattr(test_property, name)
    before = Built.count
    test()
    assert (Built.count > before) == (implementation != "reference")


class OptimizedMachine(test_stateful.ReferenceMachine):
    """The reference's stateful machine; its two allocator-reading invariants read the
    optimized scheduler's free lists."""

    @invariant()
    def free_blocks_are_the_blocks_no_live_request_holds(self) -> None:
        if not self.started:
            return
        states = self.sched.states()
        held = sum(v.gpu_blocks for v in states.values())
        assert self.sched.free_blocks() == self.config.num_gpu_blocks - held
        on_host = sum(v.host_blocks for v in states.values())
        optimized = self.sched
        assert isinstance(optimized, OptimizedScheduler)
        assert optimized.cpu_free.count == self.config.num_cpu_blocks - on_host

    @invariant()
    def ended_requests_hold_no_blocks(self) -> None:
        if not self.started:
            return
        states = self.sched.states()
        for rid in self.ended:
            assert rid not in states, f"{rid} ended but is still {states[rid].status}"
        # What no live request holds is free: nothing is left with an ended one.
        assert self.sched.free_blocks() + sum(v.gpu_blocks for v in states.values()) \
            == self.config.num_gpu_blocks


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_stateful_machine(implementation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    machine: type[test_stateful.ReferenceMachine] = test_stateful.ReferenceMachine
    if implementation != "reference":
        use(implementation, monkeypatch, test_stateful)
        machine = OptimizedMachine
    before = Built.count
    run_state_machine_as_test(machine, settings=test_stateful.ReferenceMachine.TestCase.settings)
    assert (Built.count > before) == (implementation != "reference")


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_both_implement_the_interface(implementation: str) -> None:
    config = Config(block_size=4, num_gpu_blocks=8)
    knobs = get_profile("vllm-v1").knobs
    device = "cuda" if implementation.endswith("cuda") else "cpu"
    scheduler: Scheduler = (ReferenceScheduler(config, knobs) if implementation == "reference"
                            else OptimizedScheduler(config, knobs, device=device))
    assert isinstance(scheduler, Scheduler)
    assert scheduler.free_blocks() == 8 and not scheduler.has_unfinished()
