"""The compiled replay of a profile (kvsched.optimized.replay) against the spec's
ProfileReplay: on a prefix-caching trace, and on the same trace with its decisions
altered, both name the same first divergence (or none) in the same words, and a trace
the profile wrote itself never goes through the spec's path."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from kvsched.conformance import profile_replay
from kvsched.optimized.replay import CompiledReplay, LinesReplay
from kvsched.reference import ReferenceScheduler
from kvsched.simulate import run
from kvsched.spec import Config
from kvsched.spec.profiles import get_profile
from kvsched.spec.state import State
from kvsched.spec.trace import TraceError, load_line, parse_step, step_dict
from kvsched.workload import WorkItem, validate

PROFILE = "vllm-v1"
CONFIG = Config(block_size=4, num_gpu_blocks=48, max_num_batched_tokens=64, max_num_seqs=12,
                max_model_len=256, prefix_caching=True)
Line = dict[str, Any]


def caching_trace() -> list[Line]:
    """The profile's own trace of requests sharing prefixes: hits, preemptions."""
    items = [WorkItem(f"r{i}", i // 6, 17 + (7 * i) % 23, 3 + (5 * i) % 30, 3 + (5 * i) % 30,
                      prefix=("sys", 8 + 4 * (i % 3)) if i % 4 else None)
             for i in range(40)]
    scheduler = ReferenceScheduler(CONFIG, get_profile(PROFILE).knobs)
    return [orjson.loads(orjson.dumps(step_dict(rec)))
            for rec in run(scheduler, validate(items))]


def spec_verdict(lines: list[Line]) -> tuple[int, str] | None:
    replay = profile_replay(CONFIG, PROFILE)
    for n, obj in enumerate(lines, 2):
        v = replay.step(parse_step(obj, n))
        if v is not None:
            return v.step, v.message
    return None


def feed(replay: LinesReplay, lines: list[Line], run_steps: int,
         config: Config = CONFIG) -> None:
    """`replay` fed runs of `run_steps` lines, each with the trace's state before it (as
    the fast checker gives it, a State of its own)."""
    numbered = list(enumerate(lines, 2))
    trace = State(config)

    def before() -> State:
        state = State(config)
        state.restore(trace.snapshot(), owned=True)
        return state

    for k in range(0, len(numbered), run_steps):
        replay.lines(numbered[k:k + run_steps], before)
        for n, obj in numbered[k:k + run_steps]:
            trace.apply(parse_step(obj, n))


def fast_replay(lines: list[Line], run_steps: int) -> CompiledReplay:
    """The compiled replay fed runs of `run_steps` lines (`feed`)."""
    replay = CompiledReplay(PROFILE, CONFIG)
    feed(replay, lines, run_steps)
    return replay


def fast_verdict(replay: CompiledReplay) -> tuple[int, str] | None:
    v = replay.spec.divergence
    return None if v is None else (v.step, v.message)


def first(lines: list[Line], has: Callable[[Line], bool]) -> int:
    return next(k for k, obj in enumerate(lines) if has(obj))


def drop_an_entry(lines: list[Line]) -> None:
    k = first(lines, lambda o: len(o.get("scheduled", [])) >= 3)
    del lines[k]["scheduled"][1]


def swap_victims(lines: list[Line]) -> None:
    k = first(lines, lambda o: len(o.get("preempted", [])) >= 2)
    lines[k]["preempted"].reverse()


def change_a_mode(lines: list[Line]) -> None:
    k = first(lines, lambda o: bool(o.get("preempted")))
    lines[k]["preempted"][0]["mode"] = "swap"


def shorten_a_hit(lines: list[Line]) -> None:
    k = first(lines, lambda o: any(len(b) >= 2 for b in o.get("prefix_hits", {}).values()))
    hits = lines[k]["prefix_hits"]
    rid = next(r for r, b in hits.items() if len(b) >= 2)
    hits[rid].pop()


def drop_a_hit(lines: list[Line]) -> None:
    k = first(lines, lambda o: bool(o.get("prefix_hits")))
    del lines[k]["prefix_hits"]


def finish_another(lines: list[Line]) -> None:
    k = first(lines, lambda o: bool(o.get("finished")) and len(o.get("scheduled", [])) >= 2)
    done = set(lines[k]["finished"])
    lines[k]["finished"] = [next(rid for rid, _ in lines[k]["scheduled"] if rid not in done)]


def no_keys(lines: list[Line]) -> None:
    """Without block_keys the hits' contents are what the trace's state implies."""
    for obj in lines:
        obj.pop("block_keys", None)


def wrong_keys(lines: list[Line]) -> None:
    """The keys of a request that hits, given as other contents: no hit to find."""
    rid = next(iter(lines[first(lines, lambda o: bool(o.get("prefix_hits")))]["prefix_hits"]))
    k = first(lines, lambda o: rid in o.get("block_keys", {}))
    lines[k]["block_keys"][rid] = [f"elsewhere/{j}" for j in range(len(
        lines[k]["block_keys"][rid]))]


ALTERATIONS = [drop_an_entry, swap_victims, change_a_mode, shorten_a_hit, drop_a_hit,
               finish_another, no_keys, wrong_keys]


def test_the_profiles_own_caching_trace_is_replayed_without_the_spec() -> None:
    lines = caching_trace()
    assert any(o.get("prefix_hits") for o in lines)
    assert any(len(o.get("preempted", [])) >= 2 for o in lines)
    replay = fast_replay(lines, 5)
    assert not replay.diverged and spec_verdict(lines) is None
    assert replay.slow_steps == 0 and replay.fast_runs == -(-len(lines) // 5)


@pytest.mark.parametrize("alter", ALTERATIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("run_steps", [1, 7, 10_000])
def test_an_altered_trace_diverges_where_and_as_the_spec_says(
        alter: Callable[[list[Line]], None], run_steps: int) -> None:
    lines = copy.deepcopy(caching_trace())
    alter(lines)
    expected = spec_verdict(lines)
    replay = fast_replay(lines, run_steps)
    assert fast_verdict(replay) == expected
    if alter is not no_keys:
        assert expected is not None and "first divergence from vllm-v1" in expected[1]
    if expected is not None:
        assert replay.slow_steps > 0  # the words are the spec's own
    if alter is no_keys and run_steps == 1:
        # Lines without hits stay fast; the trace's state catches up before each hit.
        assert replay.fast_runs > 0 and replay.slow_steps > 0


def test_lines_may_come_as_bytes_and_a_bad_one_is_the_spec_parsers_error() -> None:
    lines = caching_trace()
    raws = [(n, orjson.dumps(obj) + b"\n") for n, obj in enumerate(lines, 2)]
    replay = CompiledReplay(PROFILE, CONFIG)
    replay.lines(raws, lambda: State(CONFIG))
    assert not replay.diverged and replay.slow_steps == 0
    bad = copy.deepcopy(lines)
    k = first(bad, lambda o: bool(o.get("scheduled")))
    bad[k]["scheduled"][0][1] = True
    with pytest.raises(TraceError) as spec_error:
        parse_step(load_line(orjson.dumps(bad[k]), k + 2), k + 2)
    with pytest.raises(TraceError) as fast_error:
        fast_replay(bad, 10_000)
    assert str(fast_error.value) == str(spec_error.value)


def no_keys_late(lines: list[Line]) -> None:
    """No keys for the requests that first hit 40 lines or more into the trace: the
    first hit whose contents only the trace's state knows comes after lines the replay
    has already had."""
    first_hit: dict[str, int] = {}
    for k, obj in enumerate(lines):
        for rid in obj.get("prefix_hits", {}):
            first_hit.setdefault(rid, k)
    late = {rid for rid, k in first_hit.items() if k >= 40}
    assert late
    for obj in lines:
        for rid in late:
            obj.get("block_keys", {}).pop(rid, None)


@pytest.mark.parametrize("alter", [None, *ALTERATIONS, no_keys_late],
                         ids=lambda f: "unaltered" if f is None else f.__name__)
@pytest.mark.parametrize("run_steps", [2048, 45])
def test_the_fast_checker_replays_lines_as_it_reads_them_and_says_what_the_spec_says(
        alter: Callable[[list[Line]], None] | None, run_steps: int) -> None:
    """The fast checker hands the replay a few lines at a time as its compiled state
    reads them (REPLAY_LINES), then lets their values go: a divergence in the middle
    of a run, where the spec's ProfileReplay needs the trace's state before those lines
    (no_keys: hits whose contents only that state knows), and a run moved through again
    after a step that is not clean, give the spec checker's report, word for word."""
    from dataclasses import asdict

    from test_checkers_agree import both

    from kvsched.optimized.checker import REPLAY_LINES

    lines = copy.deepcopy(caching_trace())
    assert len(lines) > 3 * REPLAY_LINES
    if alter is not None:
        alter(lines)
    header = {"kvsched": "trace", "version": 1, "engine": {"name": "hand"},
              "config": asdict(CONFIG)}
    # A step that is not clean, its decision the profile's: free_blocks one off (a
    # MUST violation, accounting), late in a run and after lines already replayed.
    unclean = 2 * REPLAY_LINES + 7
    lines[unclean]["free_blocks"] += 1
    data = b"".join(orjson.dumps(x) + b"\n" for x in [header, *lines])
    verdicts = both(data, run_steps, PROFILE)
    assert verdicts.spec == verdicts.vectorized
    assert not isinstance(verdicts.spec, str)
    assert verdicts.spec.counts["accounting"] >= 1
    assert verdicts.stats["handovers"] >= 1
    if alter in (no_keys, no_keys_late):
        assert verdicts.stats["replayed_slow"] > 0
    elif alter is not None:
        assert verdicts.spec.counts["profile"] == 1


def test_a_replay_through_the_spec_keeps_the_traces_state_only_once_a_hit_needs_it(
        ) -> None:
    """SGLang's profile replays beside the fast checker through ProfileReplay
    (LinesReplay). Its trace's state, which only gives the contents of a hit without
    keys, is never moved while every hit comes with its keys, and is made from the
    fast checker's state once one comes without: the same verdict as the spec's
    checker, a divergence included."""
    from dataclasses import asdict

    from test_checkers_agree import both

    from kvsched.reference import reference_scheduler

    sglang = get_profile("sglang@0.5.23")
    config = sglang.configure(CONFIG)
    items = [WorkItem(f"r{i}", i // 6, 17 + (7 * i) % 23, 3 + (5 * i) % 30,
                      3 + (5 * i) % 30, prefix=("sys", 8 + 4 * (i % 3)) if i % 4 else None)
             for i in range(40)]
    lines = [orjson.loads(orjson.dumps(step_dict(rec)))
             for rec in run(reference_scheduler(sglang, config), validate(items))]
    assert sum(bool(o.get("prefix_hits")) for o in lines) > 5
    header = {"kvsched": "trace", "version": 1, "engine": {"name": "hand"},
              "config": asdict(config)}

    def replayed(trace: list[Line]) -> LinesReplay:
        replay = LinesReplay(profile_replay(config, sglang.name))
        feed(replay, trace, 7, config)
        return replay

    keyed = replayed(lines)
    assert not keyed.diverged and keyed.spec.state is None
    unkeyed = copy.deepcopy(lines)
    no_keys_late(unkeyed)
    replay = replayed(unkeyed)
    assert replay.spec.state is not None
    altered = copy.deepcopy(unkeyed)
    shorten_a_hit(altered)
    for trace in (unkeyed, altered):
        data = b"".join(orjson.dumps(x) + b"\n" for x in [header, *trace])
        verdicts = both(data, 2048, sglang.name)
        assert verdicts.spec == verdicts.vectorized
    assert not isinstance(verdicts.spec, str) and verdicts.spec.counts["profile"] == 1
