"""The kvsched pytest plugin: another project's tests wrap their scheduler with the
`kvsched_checked` fixture, and a planted fault fails the test in the step it happens,
naming the invariant; the reference passes. Run as pytest runs it for such a project
(pytester, in a subprocess, the plugin found through its pytest11 entry point)."""

from __future__ import annotations

from functools import partial

import pytest

from kvsched.pytest_plugin import CheckedScheduler, SpecViolation, wrap
from kvsched.reference import reference_scheduler
from kvsched.simulate import run
from kvsched.testing.seeded_bugs import SEEDED_BUGS

pytest_plugins = ["pytester"]

# A small engine project: its scheduler module and its tests.
ENGINE = '''
from kvsched.reference import reference_scheduler
from kvsched.testing.seeded_bugs import SEEDED_BUGS


def good(config):
    return reference_scheduler("vllm-v1", config)


def over_admits(config):
    return SEEDED_BUGS["over-admit-by-one-block"].factory(config)


def budget_off_by_one(config):
    return SEEDED_BUGS["token-budget-off-by-one"].factory(config)
'''

ENGINE_TESTS = '''
from hypothesis import given, settings, strategies as st

from kvsched.testing.seeded_bugs import SEEDED_BUGS
from kvsched.strategies import configs, workloads

import engine

BUG = SEEDED_BUGS["over-admit-by-one-block"]


def test_good_scheduler(kvsched_checked):
    scheduler = kvsched_checked(engine.good, BUG.config, profile="vllm-v1", strict=True)
    steps = scheduler.run(BUG.workload)
    assert len(steps) == scheduler.steps > 0


def test_over_admitting_scheduler(kvsched_checked):
    kvsched_checked(engine.over_admits, BUG.config).run(BUG.workload)


@settings(max_examples=50, database=None, derandomize=True)
@given(st.data())
def test_budget_on_drawn_workloads(kvsched_checked, data):
    config = data.draw(configs(chunked_prefill=True))
    kvsched_checked(engine.budget_off_by_one, config).run(data.draw(workloads(config)))


@settings(max_examples=30, database=None, derandomize=True)
@given(st.data())
def test_good_on_drawn_workloads(kvsched_checked, data):
    config = data.draw(configs())
    kvsched_checked(engine.good(config), strict=True).run(data.draw(workloads(config)))
'''


def test_plugin_fails_the_faulty_scheduler_at_the_step_naming_the_invariant(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(engine=ENGINE, test_engine=ENGINE_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines([
        "FAILED test_engine.py::test_over_admitting_scheduler - *",
        "FAILED test_engine.py::test_budget_on_drawn_workloads - *",
    ])
    # Each failure is the violation, raised in the step it happened; hypothesis shrank
    # the drawn case to a one-token budget overrun by one.
    result.stdout.fnmatch_lines([
        "E * kvsched.pytest_plugin.SpecViolation: MUST kv-budget at step 1 (5 <= 4): the "
        "step needs 5 new GPU blocks but only 4 were free and 0 reclaimed by preemption",
    ])
    result.stdout.fnmatch_lines([
        "E * kvsched.pytest_plugin.SpecViolation: MUST token-budget at step 0 (2 <= 1): the "
        "step schedules 2 tokens, over the budget of 1",
    ])


# -- the wrapper itself, in process --------------------------------------------------------


def test_should_warnings_raise_only_when_strict() -> None:
    bug = SEEDED_BUGS["admission-needs-spare-block"]  # idles with room to run (no-idle)
    lax = wrap(bug.factory, bug.config)
    records = lax.run(bug.workload, max_steps=bug.max_steps)
    assert len(records) == bug.max_steps and lax.report.counts["no-idle"] == bug.max_steps
    with pytest.raises(SpecViolation, match=r"^SHOULD no-idle at step 0") as caught:
        wrap(bug.factory, bug.config, strict=True).run(bug.workload)
    assert caught.value.violation.invariant == "no-idle"


def test_a_profile_divergence_raises_at_the_first_divergent_step() -> None:
    bug = SEEDED_BUGS["admits-after-preempt"]
    assert wrap(bug.factory, bug.config).run(bug.workload)  # legal under the spec
    with pytest.raises(SpecViolation, match=r"^PROFILE profile at step 5: first divergence "
                                            r"from vllm-v1"):
        wrap(bug.factory, bug.config, profile="vllm-v1").run(bug.workload)


def test_the_wrapper_is_a_scheduler_that_forwards_every_call() -> None:
    bug = SEEDED_BUGS["finished-blocks-not-freed"]
    checked = wrap(bug.reference())
    plain = bug.reference()
    assert [r for r in run(checked, bug.workload)] == list(run(plain, bug.workload))
    assert checked.free_blocks() == plain.free_blocks() and not checked.has_unfinished()
    assert checked.states() == plain.states() == {}


def test_misuse_is_refused_with_a_sentence() -> None:
    config = SEEDED_BUGS["seq-limit-ignored"].config
    good = partial(reference_scheduler, "vllm-v1")
    with pytest.raises(ValueError, match="a factory needs a config"):
        wrap(good)
    with pytest.raises(TypeError, match="the factory returned a int"):
        wrap(lambda c: 3, config)  # type: ignore[arg-type, return-value]
    checked = CheckedScheduler(good(config))
    with pytest.raises(RuntimeError, match="update\\(\\) called before schedule\\(\\)"):
        checked.update(())
    checked.schedule()
    with pytest.raises(RuntimeError, match="schedule\\(\\) called twice"):
        checked.schedule()
