"""The loop every engine's driver runs a job through (kvsched.adapters.driver_host.run_job),
driven with a fake engine: the order of arrivals, aborts and steps, the max_steps stop,
the stall stop and an engine's early end. No engine needed."""

from __future__ import annotations

from typing import Any

import pytest

from kvsched.adapters import driver_host
from kvsched.adapters.driver_host import STALL_STEPS, run_job


class Fake:
    """An engine that finishes each request `work` steps after it admits it (a step
    decides something while it holds one with work left), refuses a prompt above `longest`,
    and lets an aborted request go at once unless it is `running` (then it finishes in the
    next step). `calls` is what the loop asked, in order."""

    def __init__(self, longest: int = 100, running: frozenset[str] = frozenset(),
                 stuck: frozenset[str] = frozenset(), fail_at: int | None = None) -> None:
        self.longest, self.running, self.stuck, self.fail_at = longest, running, stuck, fail_at
        self.left: dict[str, int] = {}
        self.ending: list[str] = []
        self.calls: list[tuple[Any, ...]] = []

    def arrive(self, item: dict[str, Any], order: int) -> str | None:
        self.calls.append(("arrive", item["id"], order))
        if item["prompt_len"] > self.longest:
            return f"prompt of {item['prompt_len']} tokens"
        self.left[item["id"]] = item["output_len"]
        return None

    def abort(self, rid: str) -> bool:
        self.calls.append(("abort", rid))
        if rid in self.running:
            self.ending.append(rid)
            return False
        del self.left[rid]
        return True

    def step(self, step: int) -> tuple[dict[str, Any], list[str], bool]:
        self.calls.append(("step", step))
        if step == self.fail_at:
            raise ValueError(f"cannot say step {step}")
        finished = list(self.ending)
        self.ending.clear()
        worked = [rid for rid in self.left if rid not in self.stuck and rid not in finished]
        for rid in worked:
            self.left[rid] -= 1
            if self.left[rid] == 0:
                finished.append(rid)
        for rid in finished:
            del self.left[rid]
        return {"scheduled": worked, "finished": finished}, finished, bool(worked or finished)

    def stopped(self, error: Exception) -> dict[str, Any] | None:
        return {"stopped": str(error)} if isinstance(error, ValueError) else None


def item(rid: str, arrival: int, output_len: int = 2, prompt_len: int = 10,
         abort: int | None = None) -> dict[str, Any]:
    w: dict[str, Any] = {"id": rid, "arrival": arrival, "prompt_len": prompt_len,
                         "output_len": output_len, "max_tokens": output_len}
    if abort is not None:
        w["abort"] = abort
    return w


def run(fake: Fake, requests: list[dict[str, Any]],
        max_steps: int | None = None) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    run_job({"name": "j", "requests": requests, "max_steps": max_steps}, fake, events.append)
    return events


def test_arrivals_come_in_arrival_order_then_aborts_then_the_step() -> None:
    fake = Fake(running=frozenset({"c"}))
    events = run(fake, [item("c", 1, output_len=9, abort=2), item("a", 1, abort=1),
                        item("b", 0, output_len=1, abort=2), item("x", 0, prompt_len=500)])
    # b and x at step 0 (in arrival order, numbered from 1), c and a at step 1, both
    # before the aborts of step 1 (a's); b finished at step 0, so its abort is not
    # delivered; c's running abort ends it in the next step's finishes.
    assert fake.calls[:8] == [("arrive", "b", 1), ("arrive", "x", 2), ("step", 0),
                              ("arrive", "c", 3), ("arrive", "a", 4), ("abort", "a"),
                              ("step", 1), ("abort", "c")]
    steps = [e for e in events if "step" in e]
    assert steps[0]["arrivals"] == ["b", "x"] and steps[0]["finished"] == ["b"]
    assert steps[0]["refused"] == [{"id": "x", "reason": "prompt of 500 tokens"}]
    assert steps[1] == {"step": 1, "arrivals": ["c", "a"], "refused": [], "aborted": ["a"],
                        "scheduled": ["c"], "finished": []}
    assert steps[2]["aborted"] == [] and steps[2]["finished"] == ["c"]
    assert events[-1] == {"done": "j", "complete": True, "steps": 3}


def test_a_refused_request_is_never_held_nor_aborted() -> None:
    fake = Fake()
    events = run(fake, [item("x", 0, prompt_len=500, abort=1)])
    assert ("abort", "x") not in fake.calls
    assert events[-1] == {"done": "j", "complete": True, "steps": 1}


def test_max_steps_stops_the_job_incomplete_before_that_step() -> None:
    fake = Fake()
    events = run(fake, [item("a", 0, output_len=10), item("b", 3)], max_steps=3)
    assert [e["step"] for e in events if "step" in e] == [0, 1, 2]
    assert ("arrive", "b", 2) not in fake.calls
    assert events[-1] == {"done": "j", "complete": False, "steps": 3}


def test_a_job_that_decides_nothing_ends_stalled_where_the_stall_began() -> None:
    fake = Fake(stuck=frozenset({"s"}))
    events = run(fake, [item("a", 0, output_len=3), item("s", 1)], max_steps=1000)
    # a works at steps 0-2; from step 3 nothing is decided, with nothing left to come.
    assert events[-1] == {"done": "j", "complete": True, "steps": 3 + STALL_STEPS,
                          "stalled": 3}
    assert len([e for e in events if "step" in e]) == 3 + STALL_STEPS


def test_no_stall_while_a_request_is_still_to_arrive_or_to_be_aborted() -> None:
    fake = Fake(stuck=frozenset({"s"}))
    events = run(fake, [item("s", 0, abort=20), item("late", 10, output_len=1)])
    steps = [e for e in events if "step" in e]
    assert steps[10]["arrivals"] == ["late"] and steps[10]["finished"] == ["late"]
    assert steps[20]["aborted"] == ["s"]
    assert events[-1] == {"done": "j", "complete": True, "steps": 21}


def test_an_error_the_engine_names_ends_the_job_and_any_other_is_the_drivers() -> None:
    events = run(Fake(fail_at=2), [item("a", 0, output_len=5)])
    assert events[-1] == {"done": "j", "complete": False, "steps": 2,
                          "stopped": "cannot say step 2"}
    assert [e["step"] for e in events if "step" in e] == [0, 1]

    class Broken(Fake):
        def step(self, step: int) -> tuple[dict[str, Any], list[str], bool]:
            raise KeyError("driver bug")

    with pytest.raises(KeyError):
        run(Broken(), [item("a", 0)])


def test_aborts_by_step_keeps_request_order() -> None:
    assert driver_host.aborts_by_step([item("b", 0, abort=3), item("a", 0),
                                       item("c", 1, abort=3), item("d", 0, abort=0)]) == {
        3: ["b", "c"], 0: ["d"]}
