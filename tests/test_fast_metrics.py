"""The metrics of a trace read from a stream (kvsched.metrics.metrics_of_trace, `kvsched
metrics`): the compiled state (kvsched.optimized.state.FastState) counts the facts of the
steps it finds clean (RunFacts) and the spec's state moves through the others; the
Metrics, every field and series included, are those of the spec's state moved through
every step (metrics_of_trace on a TraceReader), or the same one-line error. On drawn
traces of every config family (prefix caching, swap, priority, allocations), with
time_ms on some, all or no steps, with planted faults (steps the spec's state takes
over); on the seeded bugs' traces; on the stored real traces of tests/data; and on a
simulation of a few thousand requests. Runs of a few steps make every run boundary
occur often.
"""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_checkers_agree import EVERY, FAULTS, faulty_trace, simulate, trace_bytes

from kvsched.commands.options import DEFAULT_CONFIG
from kvsched.generators import generate
from kvsched.metrics import Metrics, MetricsCollector, metrics_of_trace
from kvsched.optimized.checker import check_trace_vectorized
from kvsched.optimized.compiled import CompiledScheduler
from kvsched.optimized.compiled import simulate as compiled_simulate
from kvsched.optimized.facts import RunFacts
from kvsched.reference import ReferenceScheduler
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Config
from kvsched.spec.state import State
from kvsched.spec.trace import TraceError, TraceReader
from kvsched.strategies import profiles, resolve, workloads
from kvsched.testing.seeded_bugs import SEEDED_BUGS

DATA = Path(__file__).parent / "data"


class Counting(MetricsCollector):
    """A collector that counts the steps it took from each side."""

    def __init__(self, config: Config, state: State) -> None:
        super().__init__(config, state=state)
        self.spec_steps = 0
        self.fast_steps = 0

    def observe_run(self, f: RunFacts) -> None:
        self.fast_steps += len(f.generated)
        super().observe_run(f)

    def observe(self, rec: Any, f: Any) -> None:
        self.spec_steps += 1
        super().observe(rec, f)


def fast(data: bytes, run_steps: int) -> tuple[Metrics, Counting] | str:
    """The metrics through the fast checker's loop in runs of `run_steps`, or the error."""
    made: list[Counting] = []

    def sink(state: State) -> Counting:
        made.append(Counting(state.config, state))
        return made[-1]

    try:
        check_trace_vectorized(io.BytesIO(data), run_steps=run_steps, sink=sink)
    except TraceError as e:
        return str(e)
    return made[0].result(), made[0]


def spec(data: bytes) -> Metrics | str:
    try:
        return metrics_of_trace(TraceReader(io.BytesIO(data)))
    except TraceError as e:
        return str(e)


def assert_same(data: bytes, run_steps: int = 2048) -> Counting | None:
    """The two paths agree on `data`; the fast path's collector (None on an error)."""
    expected = spec(data)
    got = fast(data, run_steps)
    if isinstance(expected, str) or isinstance(got, str):
        assert got == expected
        return None
    metrics, collector = got
    for name in Metrics.__dataclass_fields__:
        assert getattr(metrics, name) == getattr(expected, name), name
    assert metrics == expected
    assert metrics.series is not None and metrics.series == expected.series
    return collector


def timed(data: bytes, pick: st.DataObject) -> bytes:
    """`data` with time_ms on each step drawn: none, an integer or a float."""
    lines = [orjson.loads(x) for x in data.splitlines()]
    kind = pick.draw(st.sampled_from(["none", "all", "some"]), label="timed")
    for line in lines[1:]:
        if "step" not in line or kind == "none":
            continue
        if kind == "some" and not pick.draw(st.booleans(), label="has time"):
            continue
        line["time_ms"] = pick.draw(st.one_of(st.integers(0, 50), st.sampled_from(
            [0.1, 0.7, 3.3, 12.25, 1e-3])), label="time_ms")
    return b"".join(orjson.dumps(x) + b"\n" for x in lines)


@given(config=EVERY, setup=st.one_of(profiles(), st.builds(Knobs)), data=st.data(),
       run_steps=st.sampled_from([1, 2, 3, 2048]), block_ids=st.booleans())
def test_correct_traces_give_the_spec_paths_metrics(config: Config, setup: str | Knobs,
                                                   data: st.DataObject, run_steps: int,
                                                   block_ids: bool) -> None:
    config, chosen = resolve(config, setup)
    items = data.draw(workloads(config), label="workload")
    records, complete = simulate(config, ReferenceScheduler(config, chosen), items,
                                 block_ids)
    collector = assert_same(timed(trace_bytes(config, records, complete), data), run_steps)
    assert collector is not None
    # The compiled state took every step but those that schedule nothing while requests
    # wait (the spec's Checker judges them), or that follow a run it found unclean.
    idle = sum(not r.scheduled and not r.preempted and not r.swapped_in for r in records)
    assert collector.fast_steps + collector.spec_steps == len(records)
    if collector.spec_steps == 0:
        assert collector.fast_steps == len(records)
    assert collector.spec_steps <= idle + sum(
        len(r.preempted) for r in records)  # a no-thrash or needed-preemption flag


@given(config=EVERY, setup=profiles(), data=st.data(),
       faults=st.lists(st.sampled_from(FAULTS), min_size=1, max_size=3),
       run_steps=st.sampled_from([1, 2, 5, 2048]))
def test_traces_with_planted_faults_give_the_spec_paths_metrics(
        config: Config, setup: str, data: st.DataObject, faults: list[str],
        run_steps: int) -> None:
    config, chosen = resolve(config, setup)
    assert_same(timed(faulty_trace(config, chosen, data, faults), data), run_steps)


@pytest.mark.parametrize("name", sorted(SEEDED_BUGS))
def test_seeded_bug_traces_give_the_spec_paths_metrics(name: str) -> None:
    bug = SEEDED_BUGS[name]
    data = trace_bytes(bug.config, bug.simulate(bug.factory(bug.config)), complete=True)
    for run_steps in (1, 4, 2048):
        assert_same(data, run_steps)


@pytest.mark.parametrize("path", sorted(DATA.rglob("*.jsonl")), ids=lambda p: p.name)
def test_stored_traces_give_the_spec_paths_metrics(path: Path) -> None:
    data = path.read_bytes()
    assert_same(data, 3)
    assert_same(data)


def test_a_simulation_of_thousands_of_requests_gives_the_spec_paths_metrics() -> None:
    config = replace(DEFAULT_CONFIG, prefix_caching=True)  # kvsched simulate's, cached
    items = generate("sharegpt", 2000, 7)
    records = list(compiled_simulate(CompiledScheduler(config), items, True, None))
    data = trace_bytes(config, records, complete=True)
    collector = assert_same(data)
    assert collector is not None and collector.fast_steps >= len(records) - 10
    assert collector.result().finished == 2000
    assert metrics_of_trace(io.BytesIO(data)) == collector.result()  # `kvsched metrics`


def test_metrics_of_trace_reads_a_stream_as_the_spec_reads_it() -> None:
    data = (DATA / "vllm-releases" / "vllm-0.33.jsonl").read_bytes()
    seen: list[Config] = []
    got = metrics_of_trace(io.BytesIO(data), on_header=lambda h: seen.append(h.config))
    assert got == spec(data)
    assert len(seen) == 1
    with pytest.raises(TraceError, match="empty file"):
        metrics_of_trace(io.BytesIO(b""))
