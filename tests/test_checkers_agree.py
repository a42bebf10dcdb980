"""The fast checker (kvsched.optimized.checker) gives the spec checker's verdicts: the
same report (counts, first violations, steps, entries, requests, completeness, ignored
keys, what was left unchecked) or the same one-line error, on correct traces, on the
seeded bugs' traces, on traces with random faults planted in them, and on malformed
input, under every config family: prefix caching, priority, swap, every allocation and
watermark scope. Runs of a few steps make every run boundary (and the hand-over
between the compiled state and the spec's checker) occur often.

With --profile the vectorized checker replays the profile with the compiled scheduler
(kvsched.optimized.replay) where the spec's checker replays it with the reference: the
same divergence, in the same words, at the same place in the report.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsched.conformance import profile_replay
from kvsched.optimized.checker import check_trace_vectorized
from kvsched.optimized.knobs import unsupported_knobs, unsupported_state
from kvsched.reference import ReferenceScheduler, scheduler_for
from kvsched.simulate import run
from kvsched.spec import Config, Report, StepRecord, TraceError, TraceReader, check_trace
from kvsched.spec.checker import Checker
from kvsched.spec.interface import not_aborting
from kvsched.spec.knobs import Knobs
from kvsched.spec.profiles import PROFILES, get_profile
from kvsched.spec.replay import ProfileReplay
from kvsched.spec.should import Stalled, passed_over
from kvsched.spec.trace import Header, TraceWriter
from kvsched.strategies import configs, policies, resolve, servable, step_kind, workloads
from kvsched.testing.seeded_bugs import SEEDED_BUGS
from kvsched.workload import WorkItem

MAX_STEPS = 300


def trace_bytes(config: Config, records: list[StepRecord], complete: bool) -> bytes:
    out = io.BytesIO()
    writer = TraceWriter(out, lambda o: orjson.dumps(o) + b"\n")
    writer.header(config)
    for rec in records:
        writer.step(rec)
    if complete:
        writer.end()
    return out.getvalue()


@dataclass
class Verdicts:
    spec: Report | str
    vectorized: Report | str
    stats: dict[str, int]


def both(data: bytes, run_steps: int = 2048, profile: str | None = None) -> Verdicts:
    """Each checker's report (replaying `profile`), or its error message."""
    spec: Report | str
    vectorized: Report | str
    try:
        reader = TraceReader(io.BytesIO(data))
        replay = None if profile is None else profile_replay(
            reader.header.config, profile, reader.header.preempted_order,
            reader.header.settings)
        spec = check_trace(reader, replay=replay)
    except TraceError as e:
        spec = str(e)
    stats: dict[str, int] = {}

    def spec_replay(header: Header) -> ProfileReplay:
        assert profile is not None  # a profile the compiled scheduler does not replay
        return profile_replay(header.config, profile, header.preempted_order,
                              header.settings)

    try:
        vectorized = check_trace_vectorized(io.BytesIO(data), run_steps=run_steps, stats=stats,
                                            profile=profile, spec_replay=spec_replay)
    except TraceError as e:
        vectorized = str(e)
    return Verdicts(spec, vectorized, stats)


def assert_agree(v: Verdicts) -> None:
    if isinstance(v.spec, str) or isinstance(v.vectorized, str):
        assert v.spec == v.vectorized
        return
    for name in ("counts", "violations", "steps", "scheduled_entries", "requests",
                 "complete", "unknown_keys", "unchecked", "profile"):
        assert getattr(v.spec, name) == getattr(v.vectorized, name), (
            f"{name}: spec {getattr(v.spec, name)} vectorized {getattr(v.vectorized, name)}")


def simulate(config: Config, scheduler: Any, items: Any, block_ids: bool = True
             ) -> tuple[list[StepRecord], bool]:
    """The run's records, up to MAX_STEPS or where it gets stuck (vLLM V0's profile
    reproduces V0's stalls), and whether it ended."""
    records: list[StepRecord] = []
    with contextlib.suppress(Stalled):
        for rec in run(scheduler, items, max_steps=MAX_STEPS, block_ids=block_ids):
            records.append(rec)
    return records, not scheduler.has_unfinished()


def setups() -> st.SearchStrategy[str | Knobs]:
    """A profile of any step kind (v1, v0, sglang, lmdeploy) or vLLM v1's knobs; `reference` builds
    it on a config it serves."""
    return policies(scheduler=None)


def reference(config: Config, setup: str | Knobs) -> tuple[Config, Any]:
    """The drawn setup's config and its reference scheduler, of its profile's step kind."""
    kind = step_kind(setup)
    config, chosen = resolve(config, setup)
    config = servable(config, kind)
    return config, scheduler_for(config, chosen, kind)


def workload(data: st.DataObject, config: Config, scheduler: Any) -> list[WorkItem]:
    """A drawn workload for `config`, with aborts only where `scheduler` models them
    (LMDeploy's step does not)."""
    return data.draw(workloads(config, aborts=not_aborting(scheduler, "") is None),
                     label="workload")


def passing_over(config: Config, records: list[StepRecord]) -> int:
    """The steps that pass a waiting request over (should.passed_over): under policy
    priority vLLM V0's step admits in arrival order."""
    checker = Checker(config)
    return sum(bool(passed_over(checker.step(r), checker.state)) for r in records)


# Every config family: allocations and watermark scopes are drawn, prefix caching on or off.
EVERY = st.one_of(configs(), configs(prefix_caching=True))


@given(config=EVERY, setup=setups(), data=st.data(),
       run_steps=st.sampled_from([1, 2, 3, 2048]), block_ids=st.booleans())
def test_correct_traces_agree_and_take_the_fast_path(config: Config, setup: str | Knobs,
                                                     data: st.DataObject, run_steps: int,
                                                     block_ids: bool) -> None:
    config, scheduler = reference(config, setup)
    items = workload(data, config, scheduler)
    records, complete = simulate(config, scheduler, items, block_ids)
    v = both(trace_bytes(config, records, complete), run_steps)
    assert_agree(v)
    assert isinstance(v.spec, Report)
    if unsupported_state(config) is not None:
        # A trace of rules the compiled state does not model (LMDeploy's) goes to the
        # spec's state whole.
        assert v.stats["fast"] == 0 and v.stats["exact"] == len(records)
    elif v.spec.errors() == 0 and not v.spec.counts:
        # A clean trace is checked without the spec's checker (but for steps that
        # schedule nothing while requests wait, and steps that pass a waiting request
        # over, whose waits the spec's checker counts: starvation).
        idle = sum(not r.scheduled and not r.preempted and not r.swapped_in
                   for r in records)
        assert v.stats["exact"] <= idle + passing_over(config, records)
        assert v.stats["fast"] > 0 or v.stats["exact"] == len(records)
    # What the trace carries, for reports of what was checked (kvsched check --junit).
    assert v.stats["block_ids"] == int(bool(records) and block_ids)
    assert v.stats["free_blocks"] == int(bool(records))


@pytest.mark.parametrize("name", sorted(SEEDED_BUGS))
@pytest.mark.parametrize("buggy", [True, False])
def test_seeded_bug_traces_agree(name: str, buggy: bool) -> None:
    bug = SEEDED_BUGS[name]
    scheduler = bug.factory(bug.config) if buggy else bug.reference()
    records = bug.simulate(scheduler)
    data = trace_bytes(bug.config, records, complete=True)  # as tests/test_seeded_bugs.py
    for run_steps in (1, 4, 2048):
        v = both(data, run_steps)
        assert_agree(v)
    assert isinstance(v.vectorized, Report)
    if buggy and bug.level != "PROFILE":
        assert bug.expected in v.vectorized.counts
    if not buggy:
        assert not v.vectorized.counts


# -- traces with planted faults --------------------------------------------------------

FAULTS = ("count", "duplicate", "drop", "finish", "unfinish", "free", "block", "no-blocks",
          "preempt", "abort", "swap-in", "reject", "unknown-id", "extra-key", "step",
          "lose-ids", "arrive-again", "hit-block", "hit-drop", "hit-add", "key")


def plant(lines: list[dict[str, Any]], fault: str, pick: st.DataObject) -> None:
    """Change one step line of a correct trace (header first) in place."""
    steps = [line for line in lines[1:] if "step" in line]
    if not steps:
        return
    line = pick.draw(st.sampled_from(steps), label="step")
    ids = sorted({a["id"] for s in steps for a in s.get("arrivals", [])}) or ["r0"]
    rid = pick.draw(st.sampled_from(ids), label="id")
    scheduled = line.get("scheduled", [])
    if fault == "count" and scheduled:
        entry = pick.draw(st.sampled_from(scheduled), label="entry")
        entry[1] += pick.draw(st.sampled_from([-1, 1, -entry[1]]), label="delta")
    elif fault == "duplicate" and scheduled:
        scheduled.append(list(pick.draw(st.sampled_from(scheduled), label="entry")))
    elif fault == "drop" and scheduled:
        scheduled.pop(pick.draw(st.integers(0, len(scheduled) - 1), label="index"))
    elif fault == "finish":
        line.setdefault("finished", []).append(rid)
    elif fault == "unfinish" and line.get("finished"):
        line["finished"].pop()
    elif fault == "free" and "free_blocks" in line:
        line["free_blocks"] += pick.draw(st.sampled_from([-1, 1]), label="delta")
    elif fault == "block" and line.get("new_blocks"):
        owner = pick.draw(st.sampled_from(sorted(line["new_blocks"])), label="owner")
        line["new_blocks"][owner] = [pick.draw(st.integers(0, 40), label="block")]
    elif fault == "no-blocks" and line.get("new_blocks"):
        del line["new_blocks"][pick.draw(st.sampled_from(sorted(line["new_blocks"])),
                                         label="owner")]
    elif fault == "preempt":
        mode = pick.draw(st.sampled_from(["recompute", "swap"]), label="mode")
        line.setdefault("preempted", []).append({"id": rid, "mode": mode})
    elif fault == "abort":
        line.setdefault("aborted", []).append(rid)
    elif fault == "swap-in":
        line.setdefault("swapped_in", []).append(rid)
    elif fault == "reject":
        line.setdefault("rejected", []).append({"id": rid, "reason": "planted"})
    elif fault == "unknown-id":
        line["scheduled"] = [*scheduled, ["never-arrived", 1]]
    elif fault == "extra-key":
        line["engine_note"] = 1
    elif fault == "lose-ids":
        line.pop("new_blocks", None)  # ids come and go: checked against known owners
    elif fault == "arrive-again":
        line.setdefault("arrivals", []).append({"id": rid, "prompt_len": 4, "max_tokens": 2})
    elif fault == "step":
        line["step"] += 1
    elif fault == "hit-block" and line.get("prefix_hits"):
        owner = pick.draw(st.sampled_from(sorted(line["prefix_hits"])), label="hit")
        blocks = line["prefix_hits"][owner]
        at = pick.draw(st.integers(0, len(blocks) - 1), label="index")
        blocks[at] = pick.draw(st.integers(0, 40), label="block")
    elif fault == "hit-drop" and line.get("prefix_hits"):
        del line["prefix_hits"][pick.draw(st.sampled_from(sorted(line["prefix_hits"])),
                                          label="hit")]
    elif fault == "hit-add" and scheduled:
        entry = pick.draw(st.sampled_from(scheduled), label="entry")
        line.setdefault("prefix_hits", {})[entry[0]] = [
            pick.draw(st.integers(0, 40), label="block")]
    elif fault == "key" and line.get("block_keys"):
        owner = pick.draw(st.sampled_from(sorted(line["block_keys"])), label="keys")
        if line["block_keys"][owner]:
            line["block_keys"][owner][0] = pick.draw(st.sampled_from(["x/0", "r0/0"]),
                                                     label="key")


def faulty_trace(config: Config, setup: str | Knobs, data: st.DataObject, faults: list[str]
                 ) -> bytes:
    """A drawn workload's trace under `setup`, with `faults` planted in it."""
    config, scheduler = reference(config, setup)
    items = workload(data, config, scheduler)
    records, complete = simulate(config, scheduler, items)
    lines = [orjson.loads(x) for x in trace_bytes(config, records, complete).splitlines()]
    for fault in faults:
        plant(lines, fault, data)
    return b"".join(orjson.dumps(x) + b"\n" for x in lines)


@given(config=EVERY, setup=setups(), data=st.data(),
       faults=st.lists(st.sampled_from(FAULTS), min_size=1, max_size=3),
       run_steps=st.sampled_from([1, 2, 5, 2048]))
def test_traces_with_planted_faults_agree(config: Config, setup: str | Knobs,
                                          data: st.DataObject, faults: list[str],
                                          run_steps: int) -> None:
    assert_agree(both(faulty_trace(config, setup, data, faults), run_steps))


HEADER = (b'{"kvsched":"trace","version":1,"config":{"block_size":4,"num_gpu_blocks":8,'
          b'"num_cpu_blocks":0,"max_num_batched_tokens":64,"max_num_seqs":4,'
          b'"max_model_len":64,"chunked_prefill":true,"long_prefill_token_threshold":0,'
          b'"policy":"fcfs","preemption":"recompute","watermark_blocks":0}}\n')
ARRIVE = b'{"step":0,"arrivals":[{"id":"a","prompt_len":4,"max_tokens":2}],' \
         b'"scheduled":[["a",4]],"free_blocks":7}\n'


@pytest.mark.parametrize("body", [
    b"",  # header only
    ARRIVE + b'{"end": true}\n',
    ARRIVE + b'{"step":1,"scheduled":[["a",1]],"finished":["a"],"free_blocks":8}\n{"end":true}\n',
    ARRIVE + b"\n\n" + b'{"step":1,"scheduled":[["a",1]]}\n',  # blank lines
    ARRIVE + b'{"step":2}\n',  # a gap in step numbers
    ARRIVE + b'{"step":1,"scheduled":[["a",1]]',  # truncated last line
    ARRIVE + b'{"step":1,"scheduled":[["a",1]]}}\n',  # malformed
    ARRIVE + b'{"step":1,"scheduled":[["a",1.5]]}\n',  # a float count
    ARRIVE + b'{"step":1,"scheduled":[["a", 1]]}\n',  # spaces: read as JSON
    ARRIVE + b'{"step":1,"scheduled":[["\\u0061",1]]}\n',  # an escaped id
    ARRIVE + b'{"step":1,"scheduled":[["b",1]]}\n',  # never arrived
    ARRIVE + b'{"step":1,"scheduled":[["a",01]]}\n',  # a leading zero
    ARRIVE + b'{"step":1,"scheduled":[["a",-1]]}\n',  # a negative count
    ARRIVE + b'{"step":1,"scheduled":[["a",1]],"note":{"scheduled":[["a",1]]}}\n',
    ARRIVE + b'{"step":1,"new_blocks":{"a":[true]}}\n',
    ARRIVE + b'{"step":1,"scheduled":[["a",1]],"new_blocks":{"a":[1],"a":[]}}\n',
    ARRIVE.replace(b'"free_blocks":7', b'"free_blocks":7,"new_blocks":{"a":[0],"a":[1]}'),
    ARRIVE + b'{"end":true}\n{"step":1}\n',  # something after the end
    ARRIVE + b'{"step":1,"prefix_hits":{"a":[1]}}\n',  # a hit with caching off
    ARRIVE + b'{"step":1,"prefix_hits":{"a":1}}\n',
    ARRIVE + b'{"step":1,"arrivals":[{"id":"a","prompt_len":4,"max_tokens":2}]}\n',
    ARRIVE + b'{"step":1,"scheduled":[["a",1]]}\n\xff\n',  # not UTF-8
])
def test_malformed_and_odd_input_gets_the_same_verdict(body: bytes) -> None:
    for run_steps in (1, 2048):
        assert_agree(both(HEADER + body, run_steps))


def test_a_trace_without_a_header_is_refused_alike() -> None:
    for data in (b"", b"\n\n", b'{"step":0}\n'):
        assert_agree(both(data))


# -- profile replays ---------------------------------------------------------------------

# The profiles the compiled scheduler replays (the others replay with the reference
# beside the vectorized checker: kvsched.optimized.replay.LinesReplay).
REPLAYED = sorted(name for name, p in PROFILES.items()
                  if p.scheduler == "v1" and unsupported_knobs(p.knobs) is None)


@given(config=configs(), setup=setups(), data=st.data(),
       replayed=st.sampled_from(sorted(PROFILES)),
       faults=st.lists(st.sampled_from(FAULTS), max_size=2),
       run_steps=st.sampled_from([1, 3, 2048]))
def test_profile_replays_agree(config: Config, setup: str | Knobs, data: st.DataObject,
                               replayed: str, faults: list[str], run_steps: int) -> None:
    """A trace of any scheduler setup (any step kind), maybe with faults planted,
    replayed against any profile of any engine (beside the vectorized checker by the
    compiled scheduler or the reference): both checkers find the same divergence (or
    none), reported alike. A trace of a step kind the profile does not replay (kvsched check
    refuses that replay before either checker runs) is checked without it."""
    trace = faulty_trace(config, setup, data, faults)
    header = TraceReader(io.BytesIO(trace)).header
    replays = get_profile(replayed).refusal(header.config) is None
    v = both(trace, run_steps, replayed if replays else None)
    assert_agree(v)


@given(config=EVERY, replayed=st.sampled_from(REPLAYED), data=st.data(),
       run_steps=st.sampled_from([1, 4, 2048]))
def test_a_profiles_own_trace_is_replayed_without_the_spec(config: Config, replayed: str,
                                                          data: st.DataObject,
                                                          run_steps: int) -> None:
    """The profile's own trace: no divergence, every run compared inside the compiled
    scheduler (no step through the spec's ProfileReplay)."""
    config, _ = resolve(config, replayed)
    items = data.draw(workloads(config), label="workload")
    records, complete = simulate(config, ReferenceScheduler(
        config, get_profile(replayed).knobs), items)
    v = both(trace_bytes(config, records, complete), run_steps, replayed)
    assert_agree(v)
    assert isinstance(v.vectorized, Report) and "profile" not in v.vectorized.counts
    assert v.stats["replayed_slow"] == 0
    assert v.stats["replayed_fast"] == v.stats["fast"] + v.stats["exact"]


def test_a_divergence_is_placed_among_the_violations_as_the_spec_places_it() -> None:
    """Violations before and after the divergence's step, and in its own step: the
    divergence comes after its step's own violations, before the later ones."""
    config = Config(block_size=4, num_gpu_blocks=48, max_num_batched_tokens=48,
                    max_num_seqs=6, max_model_len=256)
    from kvsched.workload import WorkItem

    items = [WorkItem(f"r{i}", i // 2, 8 + 5 * i, 4 + i, 4 + i) for i in range(30)]
    records, complete = simulate(config, ReferenceScheduler(
        config, get_profile("vllm-v1").knobs), items)
    lines = [orjson.loads(x) for x in trace_bytes(config, records, complete).splitlines()]
    for k in (5, 12, 20):  # an accounting error in three steps
        lines[k]["free_blocks"] += 1
    lines[12]["scheduled"].reverse()  # and the batch out of the profile's order
    v = both(b"".join(orjson.dumps(x) + b"\n" for x in lines), 4, "vllm-v1")
    assert_agree(v)
    assert isinstance(v.vectorized, Report)
    assert [x.invariant for x in v.vectorized.violations] == [
        "accounting", "accounting", "profile", "accounting"]
