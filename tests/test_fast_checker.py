"""The fast checker's compiled state (kvsched.optimized.state.FastState) is the spec's
transition rule: on every step it calls clean, the spec's checker, from the same
state, flags nothing and moves to the same state; it takes the spec's state and gives
it back unchanged (Position); and the checker built on it (kvsched.optimized.checker)
checks with the spec's Checker only the lines that are not clean.
"""

from __future__ import annotations

import io
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_checkers_agree import EVERY, FAULTS, both, faulty_trace, trace_bytes

from kvsched.optimized import checker as fast_checker
from kvsched.optimized.checker import check_trace_vectorized
from kvsched.reference import ReferenceScheduler
from kvsched.simulate import run
from kvsched.spec import Config
from kvsched.spec.checker import Checker
from kvsched.spec.knobs import Knobs
from kvsched.spec.profiles import get_profile
from kvsched.spec.trace import TraceError, TraceReader, load_line, parse_step
from kvsched.strategies import knobs, profiles, resolve
from kvsched.workload import WorkItem

state = pytest.importorskip("kvsched.optimized.state")


def stepwise(data: bytes) -> tuple[int, int]:
    """Every step of a trace, through the spec's Checker and beside it the compiled
    state from the Checker's position: where the compiled state calls a step clean,
    the spec flags nothing and both end in the same state. Returns (clean, not)."""
    lines = data.splitlines(keepends=True)
    reader = TraceReader(io.BytesIO(lines[0]))
    config = reader.header.config
    spec = Checker(config, preempted_order=reader.header.preempted_order)
    fast = state.FastState(config, 8, reader.header.preempted_order,
                           spec.state.status_of)
    clean = unclean = 0
    for number, raw in enumerate(lines[1:], start=2):
        obj = load_line(raw, number)
        if isinstance(obj, dict) and obj.get("end") is True:
            break
        fast.restore(spec.position())
        ok = fast.apply(obj, number)
        try:
            rec = parse_step(obj, number)
        except TraceError:
            assert not ok, raw
            break
        if rec.step != spec.step_no + 1:
            assert not ok, raw
            break
        before = dict(spec.report.counts)
        spec.step(rec)
        if ok:
            clean += 1
            thrashed = fast.take_thrashed()
            assert (ok == 2) == bool(thrashed), raw
            flagged = {k: n - before.get(k, 0) for k, n in spec.report.counts.items()
                       if n != before.get(k, 0)}
            assert flagged == ({"no-thrash": len(thrashed)} if thrashed else {}), raw
            spec.state.record_ended(fast.take_ended())
            assert fast.position() == spec.position(), raw
        else:
            unclean += 1
    return clean, unclean


@given(config=EVERY, setup=st.one_of(profiles(), knobs()), data=st.data(),
       faults=st.lists(st.sampled_from(FAULTS), max_size=3))
def test_a_step_called_clean_is_clean_and_moves_as_the_spec(
        config: Config, setup: str | Knobs, data: st.DataObject, faults: list[str]) -> None:
    config, chosen = resolve(config, setup)
    stepwise(faulty_trace(config, chosen, data, faults))


def trace(config: Config, n: int = 40) -> bytes:
    items = [WorkItem(f"r{i}", i // 2, 8 + 5 * i, 4 + i, 4 + i) for i in range(n)]
    scheduler = ReferenceScheduler(config, get_profile("vllm-v1").knobs)
    records = list(run(scheduler, items, max_steps=2000))
    return trace_bytes(config, records, not scheduler.has_unfinished())


CACHING = Config(block_size=4, num_gpu_blocks=48, max_num_batched_tokens=48,
                 max_num_seqs=6, max_model_len=256, prefix_caching=True)


def test_the_spec_state_goes_in_and_comes_back_unchanged() -> None:
    data = trace(CACHING)
    reader = TraceReader(io.BytesIO(data))
    spec = Checker(reader.header.config)
    fast = state.FastState(reader.header.config, 8, True, spec.state.status_of)
    for rec in reader:
        spec.step(rec)
        at = spec.position()
        fast.restore(at)
        assert fast.usable
        assert fast.position() == at


@pytest.mark.parametrize("stride", [1, 3, 7, 20])
def test_a_state_saved_and_put_back_is_the_state_it_was(stride: int) -> None:
    """`save` between two states copies only the slots that changed since they were
    last saved one into the other: put back after any run (requests arrived, ended and
    their slots taken again in it), the state is the one saved, and moves on as the
    spec's."""
    data = trace(CACHING, n=120)
    reader = TraceReader(io.BytesIO(data))
    config = reader.header.config
    spec = Checker(config)
    fast = state.FastState(config, 8, True, spec.state.status_of)
    saved = state.FastState(config, 8, True, spec.state.status_of)
    lines = [orjson.loads(x) for x in data.splitlines()[1:-1]]
    start, at_start = 0, fast.position()
    fast.save(saved)
    for i, obj in enumerate(lines):
        assert fast.apply(obj, i + 2)
        if i % stride < stride - 1 and i < len(lines) - 1:
            continue
        saved.save(fast)  # back to the run's start, then through it again
        assert fast.position() == at_start
        fast.take_ended()
        for number, again in enumerate(lines[start:i + 1], start=start + 2):
            assert fast.apply(again, number)
            spec.step(parse_step(again, number))
        spec.state.record_ended(fast.take_ended())
        assert fast.position() == spec.position()
        fast.save(saved)
        start, at_start = i + 1, fast.position()
    assert not spec.report.counts and not spec.state.live


def test_a_correct_caching_trace_is_checked_without_the_spec_checker() -> None:
    clean, unclean = stepwise(trace(CACHING))
    assert clean > 50 and unclean == 0
    stats: dict[str, int] = {}
    report = check_trace_vectorized(io.BytesIO(trace(CACHING)), stats=stats)
    assert not report.counts and report.complete
    assert stats["exact"] == 0 and stats["fast"] == 1 and stats["as_json"] == 0


def test_only_the_line_with_a_violation_goes_to_the_spec_checker() -> None:
    lines = [orjson.loads(x) for x in trace(CACHING).splitlines()]
    lines[30]["free_blocks"] += 1  # an accounting error, told once
    data = b"".join(orjson.dumps(x) + b"\n" for x in lines)
    for run_steps in (1, 7, 2048):
        v = both(data, run_steps)
        assert v.spec == v.vectorized
        assert v.stats["exact"] == 1
        assert isinstance(v.vectorized, type(v.spec))


def test_a_stretch_of_steps_that_are_not_clean_goes_to_the_spec_checker_and_back() -> None:
    """An engine stuck idle for 150 steps while requests could run (no-idle on every
    one): the spec's Checker checks them in stretches of growing length instead of a
    handover each, and the compiled state takes the steps after them back; the
    verdicts are the spec's."""
    lines = [orjson.loads(x) for x in trace(CACHING).splitlines()]
    head, body, end = lines[0], lines[1:-1], lines[-1]
    idle = [{"step": 0} for _ in range(150)]
    steps = body[:30] + idle + body[30:]
    for k, step in enumerate(steps):
        step["step"] = k
    data = b"".join(orjson.dumps(x) + b"\n" for x in [head, *steps, end])
    for run_steps, profile in ((2048, None), (7, None), (2048, "vllm-v1"), (1, "vllm-v1")):
        v = both(data, run_steps, profile)
        assert not isinstance(v.spec, str)
        assert v.spec.counts["no-idle"] == 150
        assert v.spec == v.vectorized
        # each idle step, and at most a stretch's overshoot (1 + 2 + ... + 128 > 150)
        assert 150 <= v.stats["exact"] < 150 + 128
        assert v.stats["exact"] < len(steps) - 20  # the compiled state took over again
        assert v.stats["handovers"] <= 10  # 1 + 1 + 2 + ... + 128 lines in 9


def test_a_thrashing_step_is_told_in_the_spec_words_without_a_handover() -> None:
    """no-thrash, what a correct engine under memory pressure shows, is flagged by the
    compiled state's runs with the spec's own violation, in the spec's order (a
    profile's divergence placed among them too)."""
    config = Config(block_size=4, num_gpu_blocks=32, max_num_batched_tokens=64,
                    max_num_seqs=8, max_model_len=128)
    items = [WorkItem(f"r{i}", i // 4, 8 + (5 * i) % 40, 30 + i % 50, 30 + i % 50)
             for i in range(60)]
    scheduler = ReferenceScheduler(config, get_profile("sarathi").knobs)
    records = list(run(scheduler, items, max_steps=5000))
    data = trace_bytes(config, records, not scheduler.has_unfinished())
    for run_steps, profile in ((2048, None), (7, None), (2048, "vllm-v1"), (5, "sarathi")):
        v = both(data, run_steps, profile)
        assert not isinstance(v.spec, str)
        if profile == "sarathi":  # admits on a first chunk's blocks: should.unjudged
            assert "no-thrash" not in v.spec.counts and "no-thrash" in v.spec.unchecked
        else:
            assert v.spec.counts["no-thrash"] >= 3
        assert v.spec == v.vectorized
        assert v.stats["exact"] == 0


def test_a_line_orjson_reads_otherwise_goes_through_the_spec_reader() -> None:
    lines = trace(CACHING).splitlines(keepends=True)
    # Spacing means nothing to either reader: orjson's objects are taken.
    spaced = [lines[0], *(x.replace(b",", b", ") for x in lines[1:])]
    stats: dict[str, int] = {}
    report = check_trace_vectorized(io.BytesIO(b"".join(spaced)), stats=stats)
    assert not report.counts and stats["exact"] == 0 and stats["as_json"] == 0
    # A colon inside a string (an unknown key's value) makes orjson write the line back.
    noted = [lines[0], *(x.replace(b'{"step":', b'{"note":"a:b","step":') for x in lines[1:])]
    stats = {}
    report = check_trace_vectorized(io.BytesIO(b"".join(noted)), stats=stats)
    assert not report.counts and stats["exact"] == 0 and stats["as_json"] == 0
    assert report.unknown_keys == {"note": 2}
    # An escape: the same string to both readers.
    escaped = [lines[0], *(x.replace(b'"r1"', b'"r\\u0031"') for x in lines[1:])]
    stats = {}
    report = check_trace_vectorized(io.BytesIO(b"".join(escaped)), stats=stats)
    assert not report.counts and stats["as_json"] == 0
    # A colon in a string, and spacing orjson writes otherwise: the spec's reader.
    both_ = [lines[0], *(x.replace(b'{"step":', b'{"note": "a:b", "step":') for x in lines[1:])]
    stats = {}
    report = check_trace_vectorized(io.BytesIO(b"".join(both_)), stats=stats)
    assert not report.counts and stats["exact"] == 0
    assert stats["as_json"] == len(lines) - 2  # every step line, not the header or end
    # A key twice is the spec's error, whatever colons the line's strings hold to make
    # up for the key orjson drops.
    for twice_at in (b'{"step":4,"step":4', b'{"step":4,"step":4,"note":"a:b"',
                     b'{"note":"x\\u003a","step":4,"step":4'):
        twice = [*lines[:5], lines[5].replace(b'{"step":4', twice_at), *lines[6:]]
        with pytest.raises(TraceError, match="line 6: the key 'step' appears twice"):
            check_trace_vectorized(io.BytesIO(b"".join(twice)))


def test_without_the_compiled_module_the_spec_checker_checks_every_line(
        monkeypatch: Any) -> None:
    data = trace(CACHING)
    expected = check_trace_vectorized(io.BytesIO(data))
    monkeypatch.setattr(fast_checker, "FastState", None)
    stats: dict[str, int] = {}
    report = check_trace_vectorized(io.BytesIO(data), stats=stats)
    assert report == expected
    assert stats["fast"] == 0 and stats["exact"] == report.steps


def phase_calls(source: str, phases: set[str]) -> list[str]:
    """The `self.<phase>(` calls of the `apply` method in a .pyx source, in order."""
    import re

    body = source[source.index(" apply(self"):]
    end = re.search(r"\n    (?:cdef|cpdef|def) ", body)
    assert end is not None
    return [m for m in re.findall(r"self\.(_\w+)\(", body[:end.start()]) if m in phases]


def test_the_compiled_state_has_the_spec_states_phases_in_the_same_order() -> None:
    """FastState mirrors State phase by phase: one method per phase of State.apply,
    named alike, called in the same order, so that a change to the transition rule is a
    change to a phase of spec/state.py and to its twin of the same name in
    optimized/state.pyx."""
    import ast
    import inspect
    from pathlib import Path

    from kvsched.spec.state import State

    apply = ast.parse(inspect.getsource(State.apply).strip())
    calls = sorted((node.lineno, node.col_offset, node.func.attr)
                   for node in ast.walk(apply)
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                   and isinstance(node.func.value, ast.Name) and node.func.value.id == "self")
    spec = [name for _, _, name in calls if name.startswith("_")]
    assert spec == ["_inputs", "_rejections", "_preemptions", "_reclaims", "_swap_ins",
                    "_schedule", "_finishes", "_dedups"]
    assert list(state.PHASES) == spec
    pyx = (Path(state.__file__).parent / "state.pyx").read_text()
    assert phase_calls(pyx, set(spec)) == spec
    for name in spec:  # each a method of its own in both
        assert callable(getattr(State, name))
        assert f"    cdef int {name}(self" in pyx
