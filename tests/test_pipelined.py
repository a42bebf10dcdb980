"""LMDeploy's rules in the spec, on small hand-written traces: lazy preemption and
`reclaimed`, pipelined steps (held finished requests, `released`, the void entry right
after a finish) and prealloc_tokens. Each test asserts the checker's verdict: which
invariant, at which step, on which request; or that a trace the rules allow is clean
(and the vectorized checker agrees)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvsched.optimized.checker import check_trace_vectorized
from kvsched.optimized.knobs import unsupported_state
from kvsched.spec import Config, StepRecord
from kvsched.spec.checker import Report, check_trace
from kvsched.spec.model import Status
from kvsched.spec.state import State
from kvsched.spec.trace import HeldLine, TraceReader, TraceWriter, parse_step

# 4-token blocks, 8 of them; LMDeploy's three fields on.
CONFIG: dict[str, Any] = {
    "block_size": 4, "num_gpu_blocks": 8, "num_cpu_blocks": 0,
    "max_num_batched_tokens": 32, "max_num_seqs": 4, "max_model_len": 32,
    "chunked_prefill": True, "long_prefill_token_threshold": 0, "policy": "fcfs",
    "preemption": "lazy", "watermark_blocks": 0, "pipelined": True}


def trace(*steps: dict[str, Any], end: bool = True, **config: Any) -> bytes:
    lines = [{"kvsched": "trace", "version": 1, "config": {**CONFIG, **config}}, *steps]
    if end:
        lines.append({"end": True})
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def check(*steps: dict[str, Any], end: bool = True, **config: Any) -> Report:
    """The spec checker's report, checked to be the vectorized checker's too."""
    data = trace(*steps, end=end, **config)
    report = check_trace(TraceReader(io.BytesIO(data)))
    fast = check_trace_vectorized(io.BytesIO(data))
    assert (fast.counts, fast.violations) == (report.counts, report.violations)
    return report


def arrive(rid: str, prompt: int, max_tokens: int = 8) -> dict[str, Any]:
    return {"id": rid, "prompt_len": prompt, "max_tokens": max_tokens, "priority": 0}


def verdicts(report: Report) -> list[tuple[str, int, str | None]]:
    return [(v.invariant, v.step, v.request) for v in report.violations]


# a and b each compute a 6-token prompt into blocks of their own and sample (C 6, N 7).
START = {"step": 0, "arrivals": [arrive("a", 6), arrive("b", 6)],
         "scheduled": [["a", 6], ["b", 6]], "new_blocks": {"a": [0, 1], "b": [2, 3]},
         "free_blocks": 4}


# -- lazy preemption and reclaimed ----------------------------------------------------


def test_a_lazy_victim_resumes_where_it_stopped_keeping_its_blocks() -> None:
    report = check(
        {"step": 0, "arrivals": [arrive("a", 7, 2), arrive("b", 8)],
         "scheduled": [["a", 7], ["b", 8]], "new_blocks": {"a": [0, 1], "b": [2, 3]},
         "free_blocks": 0},
        # b cannot grow and gives itself up, keeping its 2 blocks: none is free
        {"step": 1, "preempted": [{"id": "b", "mode": "lazy"}], "scheduled": [["a", 1]],
         "new_blocks": {}, "finished": ["a"], "free_blocks": 0},
        # a's session ends; b resumes with its one uncomputed token on its own blocks
        {"step": 2, "released": ["a"], "scheduled": [["b", 1]], "new_blocks": {"b": [0]},
         "free_blocks": 1},
        end=False, num_gpu_blocks=4)
    assert report.counts == {}


def test_lazy_victim_state_keeps_g_ids_and_c() -> None:
    state = State(Config(**CONFIG))
    state.apply(parse_step(START, 2))
    f = state.apply(parse_step({"step": 1, "preempted": [{"id": "b", "mode": "lazy"}]}, 3))
    b = state.live["b"]
    assert (b.status, b.num_computed, b.gpu_blocks, b.block_ids) == (Status.WAITING, 6, 2,
                                                                    [2, 3])
    assert [v.released for v in f.victims] == [0] and f.reclaim == 0
    assert not b.recomputing


def test_a_reclaimed_lazy_victim_recomputes_from_nothing() -> None:
    steps = [
        {"step": 0, "arrivals": [arrive("a", 7, 2), arrive("b", 8)],
         "scheduled": [["a", 7], ["b", 8]], "new_blocks": {"a": [0, 1], "b": [2, 3]},
         "free_blocks": 0},
        # b gives itself up and its blocks are reclaimed at once; a finishes, held
        {"step": 1, "preempted": [{"id": "b", "mode": "lazy"}], "reclaimed": ["b"],
         "scheduled": [["a", 1]], "new_blocks": {}, "finished": ["a"], "free_blocks": 2},
    ]
    # b recomputes its 9 known tokens into 3 new blocks
    clean = check(*steps, {"step": 2, "released": ["a"], "scheduled": [["b", 9]],
                           "new_blocks": {"b": [2, 3, 0]}, "free_blocks": 1},
                  end=False, num_gpu_blocks=4)
    assert clean.counts == {}
    # resuming as if nothing had been reclaimed: its chunk gets no blocks from C = 0
    kept = check(*steps, {"step": 2, "released": ["a"], "scheduled": [["b", 1]],
                          "new_blocks": {}}, end=False, num_gpu_blocks=4)
    assert verdicts(kept) == [("preempt", 2, "b")]
    assert "kept its computed tokens or blocks" in kept.violations[0].message


def test_reclaiming_what_holds_no_blocks_or_runs_is_one_state() -> None:
    report = check(
        START,
        {"step": 1, "reclaimed": ["a"], "scheduled": [["a", 1]], "new_blocks": {},
         "free_blocks": 4},
        {"step": 2, "preempted": [{"id": "b", "mode": "lazy"}], "reclaimed": ["b", "b"],
         "scheduled": [["a", 1]], "new_blocks": {}, "free_blocks": 6},
        end=False)
    assert [v for v in verdicts(report) if v[0] != "needed-preemption"] == [
        ("one-state", 1, "a"), ("one-state", 2, "b")]
    assert "reclaimed while running" in report.violations[0].message
    assert "reclaimed while just preempted with no blocks" in report.violations[1].message


@pytest.mark.parametrize(("preemption", "mode"), [("recompute", "lazy"), ("lazy", "recompute")])
def test_a_victim_mode_other_than_the_configs_is_preempt(preemption: str, mode: str) -> None:
    report = check(START, {"step": 1, "preempted": [{"id": "b", "mode": mode}],
                           "scheduled": [["a", 1]]}, end=False, preemption=preemption)
    [v] = [v for v in report.violations if v.invariant == "preempt"]
    assert (v.step, v.request) == (1, "b") and f"mode {mode}" in v.message


# -- pipelined: held, released, reclaimed, the void entry -------------------------------


# a computes its 4-token prompt (one block), samples its one token and finishes: held.
FINISH = {"step": 0, "arrivals": [arrive("a", 4, 1)], "scheduled": [["a", 4]],
          "new_blocks": {"a": [0]}, "finished": ["a"], "free_blocks": 7}


def test_a_held_request_keeps_its_blocks_until_released() -> None:
    report = check(FINISH, {"step": 1, "released": ["a"], "free_blocks": 8})
    assert report.counts == {}
    state = State(Config(**CONFIG))
    state.apply(parse_step(FINISH, 2))
    assert state.live["a"].status == Status.HELD and state.free == 7
    assert state.count[Status.HELD] == 1 and state.running == 0
    f = state.apply(parse_step({"step": 1, "released": ["a"]}, 3))
    assert [r.released for r in f.releases] == [1] and f.free_before == 8
    assert state.status_of("a") == "finished" and "a" not in state.live


def test_a_held_request_reclaimed_ends() -> None:
    report = check(FINISH, {"step": 1, "reclaimed": ["a"], "free_blocks": 8})
    assert report.counts == {}


def test_releasing_what_is_not_held_is_one_state() -> None:
    report = check(START, {"step": 1, "released": ["a"], "scheduled": [["a", 1]]},
                   end=False)
    assert verdicts(report) == [("one-state", 1, "a")]
    assert "released while running" in report.violations[0].message


def test_a_held_request_at_the_end_of_a_complete_trace_is_a_leak() -> None:
    report = check(FINISH, {"step": 1, "free_blocks": 7})
    assert verdicts(report) == [("accounting", 1, "a")]
    assert "never released or reclaimed" in report.violations[0].message
    # Without the end line the engine may still release it: no verdict, no stall.
    assert check(FINISH, *({"step": k} for k in range(1, 120)), end=False).counts == {}


def test_held_blocks_are_not_free() -> None:
    report = check({**FINISH, "free_blocks": 8}, {"step": 1, "released": ["a"],
                                                  "free_blocks": 8})
    assert verdicts(report) == [("accounting", 0, None)]


def test_a_void_entry_right_after_the_finish_computes_and_samples_nothing() -> None:
    report = check(FINISH,
                   # the prefetched slot: 1 token, into a second block; no second finish
                   {"step": 1, "scheduled": [["a", 1]], "new_blocks": {"a": [1]},
                    "free_blocks": 6},
                   {"step": 2, "released": ["a"], "free_blocks": 8})
    assert report.counts == {}
    state = State(Config(**CONFIG))
    state.apply(parse_step(FINISH, 2))
    f = state.apply(parse_step({"step": 1, "scheduled": [["a", 1]]}, 3))
    a = state.live["a"]
    assert (a.status, a.num_tokens, a.num_computed, a.gpu_blocks) == (Status.HELD, 5, 5, 2)
    assert [(c.void, c.sampled) for c in f.chunks] == [(True, False)]
    assert (f.tokens, f.running, f.demand) == (1, 1, 1)


def test_a_void_entry_two_steps_after_the_finish_is_one_state() -> None:
    report = check(FINISH, {"step": 1},
                   {"step": 2, "scheduled": [["a", 1]]},
                   {"step": 3, "released": ["a"]})
    assert verdicts(report) == [("one-state", 2, "a")]
    assert "scheduled while held since step 0" in report.violations[0].message


def test_a_void_entry_that_finishes_again_is_one_state() -> None:
    report = check(FINISH, {"step": 1, "scheduled": [["a", 1]], "new_blocks": {"a": [1]},
                            "finished": ["a"]},
                   {"step": 2, "released": ["a"]})
    assert verdicts(report) == [("one-state", 1, "a")]
    assert "finished while held" in report.violations[0].message


def test_a_held_request_may_be_preempted_in_the_step_after_its_finish() -> None:
    # vLLM's async scheduling decides step 1 before it applies the output that finished
    # a at step 0, so a still runs for it and may be its victim: a gives its block back
    # at once (recompute), b takes all eight, and a stays held until its release.
    report = check(FINISH,
                   {"step": 1, "arrivals": [arrive("b", 29, 1)],
                    "preempted": [{"id": "a", "mode": "recompute"}],
                    "scheduled": [["b", 29]], "new_blocks": {"b": list(range(8))},
                    "finished": ["b"], "free_blocks": 0},
                   {"step": 2, "released": ["a", "b"], "free_blocks": 8},
                   preemption="recompute")
    assert report.counts == {}
    state = State(Config(**{**CONFIG, "preemption": "recompute"}))
    state.apply(parse_step(FINISH, 2))
    state.apply(parse_step({"step": 1, "preempted": [{"id": "a", "mode": "recompute"}]}, 3))
    assert (state.live["a"].status, state.live["a"].gpu_blocks, state.free) == (
        Status.HELD, 0, 8)


def test_a_held_request_preempted_two_steps_after_its_finish_is_preempt() -> None:
    report = check(FINISH, {"step": 1},
                   {"step": 2, "preempted": [{"id": "a", "mode": "lazy"}]},
                   {"step": 3, "released": ["a"]})
    assert verdicts(report) == [("preempt", 2, "a")]
    assert "held since step 0" in report.violations[0].message


def test_without_pipelined_a_finish_releases_at_once() -> None:
    report = check({**FINISH, "free_blocks": 8}, {"step": 1, "released": ["a"]},
                   pipelined=False)
    assert verdicts(report) == [("one-state", 1, "a")]
    assert "released while finished" in report.violations[0].message


# -- prealloc_tokens ------------------------------------------------------------------


@pytest.mark.parametrize("given", [[0, 1], [0, 1, 2]])
def test_prealloc_takes_up_to_r_tokens_more(given: list[int]) -> None:
    # 6 tokens need 2 blocks; with R = 4 up to ceil(10 / 4) = 3
    report = check({"step": 0, "arrivals": [arrive("a", 6)], "scheduled": [["a", 6]],
                    "new_blocks": {"a": given}, "free_blocks": 8 - len(given)},
                   end=False, prealloc_tokens=4)
    assert report.counts == {}


def test_prealloc_beyond_its_bound_is_block_ids() -> None:
    report = check({"step": 0, "arrivals": [arrive("a", 6)], "scheduled": [["a", 6]],
                    "new_blocks": {"a": [0, 1, 2, 3]}, "free_blocks": 6},
                   end=False, prealloc_tokens=4)
    assert verdicts(report) == [("block-ids", 0, "a")]
    v = report.violations[0]
    assert "needs 2 to 3 (prealloc_tokens 4)" in v.message
    assert (v.lhs, v.relation, v.rhs) == (4, "<=", 3)


def test_without_ids_prealloc_takes_the_least() -> None:
    clean = check({"step": 0, "arrivals": [arrive("a", 6)], "scheduled": [["a", 6]],
                   "free_blocks": 6}, end=False, prealloc_tokens=4)
    assert clean.counts == {}
    more = check({"step": 0, "arrivals": [arrive("a", 6)], "scheduled": [["a", 6]],
                  "free_blocks": 5}, end=False, prealloc_tokens=4)
    assert verdicts(more) == [("accounting", 0, "a")]


def test_a_restart_beyond_the_prealloc_bound_is_block_ids_not_preempt() -> None:
    steps = [
        {"step": 0, "arrivals": [arrive("a", 7, 2), arrive("b", 8)],
         "scheduled": [["a", 7], ["b", 8]], "new_blocks": {"a": [0, 1], "b": [2, 3]}},
        {"step": 1, "preempted": [{"id": "b", "mode": "lazy"}], "reclaimed": ["b"],
         "scheduled": [["a", 1]], "new_blocks": {}, "finished": ["a"]},
    ]
    # b recomputes 4 tokens from nothing: 1 block, up to ceil(8 / 4) = 2 with R = 4
    report = check(*steps, {"step": 2, "released": ["a"], "scheduled": [["b", 4]],
                            "new_blocks": {"b": [0, 1, 2]}},
                   end=False, num_gpu_blocks=4, prealloc_tokens=4)
    assert verdicts(report) == [("block-ids", 2, "b")]
    assert "needs 1 to 2 (prealloc_tokens 4)" in report.violations[0].message


# -- kv-budget with reclaims ----------------------------------------------------------


def test_kv_budget_counts_what_the_reclaims_released() -> None:
    full = {"step": 0, "arrivals": [arrive("a", 8), arrive("b", 8)],
            "scheduled": [["a", 8], ["b", 8]], "new_blocks": {"a": [0, 1], "b": [2, 3]},
            "free_blocks": 0}
    # a's decode needs a third block: b's, reclaimed after its lazy preemption
    ok = check(full, {"step": 1, "preempted": [{"id": "b", "mode": "lazy"}],
                      "reclaimed": ["b"], "scheduled": [["a", 1]], "new_blocks": {"a": [2]},
                      "free_blocks": 1}, end=False, num_gpu_blocks=4)
    assert ok.counts == {}
    # without the reclaim the lazy victim frees nothing
    short = check(full, {"step": 1, "preempted": [{"id": "b", "mode": "lazy"}],
                         "scheduled": [["a", 1]], "new_blocks": {"a": [2]}},
                  end=False, num_gpu_blocks=4)
    assert ("kv-budget", 1, None) in verdicts(short)
    # a reclaim that is not enough: 3 new blocks, 2 reclaimed
    over = check(full, {"step": 1, "arrivals": [arrive("c", 8)],
                        "preempted": [{"id": "b", "mode": "lazy"}], "reclaimed": ["b"],
                        "scheduled": [["a", 1], ["c", 8]]}, end=False, num_gpu_blocks=4)
    [v] = [v for v in over.violations if v.invariant == "kv-budget"]
    assert v.step == 1 and (v.lhs, v.rhs) == (3, 2)
    assert "0 were free and 0 reclaimed by preemption and 2 by reclaimed entries" in v.message


# -- the format: bad input, writing, the compiled state's refusal ----------------------


def test_new_step_keys_round_trip_and_are_left_out_when_empty() -> None:
    out = io.BytesIO()
    writer = TraceWriter(out)
    writer.header(Config(**CONFIG))
    writer.step(StepRecord(0, released=("a",), reclaimed=("c", "b")))
    writer.step(StepRecord(1))
    lines = out.getvalue().decode().splitlines()
    assert json.loads(lines[1]) == {"step": 0, "released": ["a"], "reclaimed": ["c", "b"]}
    assert lines[2] == '{"step":1}'
    reader = TraceReader(io.BytesIO(out.getvalue()))
    assert reader.header.config == Config(**CONFIG)
    assert [(r.released, r.reclaimed) for r in reader] == [(("a",), ("c", "b")), ((), ())]
    plain = io.BytesIO()
    TraceWriter(plain).header(Config())
    assert b"pipelined" not in plain.getvalue() and b"prealloc" not in plain.getvalue()


def test_the_compiled_state_refuses_lmdeploys_rules_in_one_line() -> None:
    assert unsupported_state(Config()) is None
    why = unsupported_state(Config(**CONFIG, prealloc_tokens=16))
    assert why is not None and "\n" not in why
    assert "pipelined" in why and "lazy" in why and "prealloc_tokens 16" in why
    # the vectorized checker then moves the spec's state through every step
    stats: dict[str, int] = {}
    data = trace(FINISH, {"step": 1, "released": ["a"], "free_blocks": 8})
    assert check_trace_vectorized(io.BytesIO(data), stats=stats).counts == {}
    assert (stats["fast"], stats["exact"]) == (0, 2)


@pytest.mark.parametrize(("where", "value", "expected"), [
    ("config", {"pipelined": 1}, "config.pipelined must be true or false, got 1"),
    ("config", {"prealloc_tokens": -1}, "config.prealloc_tokens must not be negative"),
    ("config", {"prealloc_tokens": "16"}, "config.prealloc_tokens must be an integer"),
    ("step", {"released": "a"}, 'line 2: "released" must be a list, got str'),
    ("step", {"reclaimed": [1]}, 'line 2: each entry of "reclaimed" must be a non-empty'),
    ("step", {"preempted": [{"id": "a", "mode": "lazyish"}]},
     "line 2: preemption mode must be recompute, swap or lazy, got 'lazyish'"),
])
@pytest.mark.parametrize("checker", ["spec", "vectorized"])
def test_bad_new_fields_are_one_line_errors(tmp_path: Path, where: str, value: dict[str, Any],
                                            expected: str, checker: str) -> None:
    data = trace({"step": 0}, **value) if where == "config" else trace({"step": 0, **value})
    path = tmp_path / "trace.jsonl"
    path.write_bytes(data)
    result = subprocess.run([sys.executable, "-m", "kvsched", "check", "--checker", checker,
                             str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert expected in result.stderr


def test_lmdeploys_settings_in_seconds_and_own_step_keys_are_read() -> None:
    header = {"kvsched": "trace", "version": 1, "engine": {"name": "lmdeploy"},
              "config": CONFIG, "settings": {"step_seconds": 0.025, "prefill_interval": 16}}
    step = {"step": 0, "kind": None, "engine_free": 8, "evictable": 0, "void": ["x"],
            "unsampled": ["x"], "cache_evicted": 1}
    data = "".join(json.dumps(x) + "\n" for x in (header, step)).encode()
    reader = TraceReader(io.BytesIO(data))
    assert reader.header.settings == {"step_seconds": 0.025, "prefill_interval": 16}
    assert check_trace(reader).unknown_keys == {}
    assert check_trace_vectorized(io.BytesIO(data)).unknown_keys == {}


# -- unsampled: entries whose output the engine dropped -------------------------------


def test_an_unsampled_entry_takes_its_blocks_but_computes_and_samples_nothing() -> None:
    # b's decode in step 1 is dropped (step 2 preempts it): it counts in the step's
    # tokens and takes blocks by C + Dn (prealloc 4 tokens: up to 3 blocks, given 1),
    # but b stays at C 6, N 7, and in step 3 it computes that token again
    steps = [START,
             {"step": 1, "scheduled": [["a", 1], ["b", 1]], "unsampled": ["b"],
              "new_blocks": {"b": [4]}, "free_blocks": 3},
             {"step": 2, "preempted": [{"id": "b", "mode": "lazy"}], "scheduled": [["a", 1]],
              "new_blocks": {}, "free_blocks": 3},
             {"step": 3, "scheduled": [["b", 1]], "new_blocks": {}, "free_blocks": 3}]

    def after_step_1(*lines: dict[str, Any]) -> tuple[list[bool], int, tuple[int, ...]]:
        state = State(Config(**{**CONFIG, "prealloc_tokens": 4}))
        facts = [state.apply(parse_step(s, i + 2)) for i, s in enumerate(lines)]
        b = state.views()["b"]
        return ([c.sampled for c in facts[1].chunks], facts[1].tokens,
                (b.num_tokens, b.num_computed, b.gpu_blocks))

    assert after_step_1(*steps[:2]) == ([True, False], 2, (7, 6, 3))
    assert check(*steps, end=False, prealloc_tokens=4).errors() == 0
    # without `unsampled` b's token counts: N 8, C 7
    sampled = {k: v for k, v in steps[1].items() if k != "unsampled"}
    assert after_step_1(START, sampled) == ([True, True], 2, (8, 7, 3))


def test_an_unsampled_last_token_does_not_finish() -> None:
    # a's second output would reach max_tokens 2; the next step preempts a, so it is
    # dropped, and a finishes only when it samples it again
    steps = [{"step": 0, "arrivals": [arrive("a", 6, 2)], "scheduled": [["a", 6]],
              "new_blocks": {"a": [0, 1]}, "free_blocks": 6},
             {"step": 1, "scheduled": [["a", 1]], "unsampled": ["a"], "new_blocks": {},
              "free_blocks": 6},
             {"step": 2, "preempted": [{"id": "a", "mode": "lazy"}], "free_blocks": 6},
             {"step": 3, "scheduled": [["a", 1]], "finished": ["a"], "new_blocks": {},
              "free_blocks": 6},
             {"step": 4, "released": ["a"], "free_blocks": 8}]
    assert check(*steps).errors() == 0
    steps[1] = {k: v for k, v in steps[1].items() if k != "unsampled"}
    assert ("finish", 1, "a") in verdicts(check(*steps))


def test_unsampled_not_scheduled_is_one_state() -> None:
    report = check(START, {"step": 1, "scheduled": [["a", 1]], "unsampled": ["b"],
                           "new_blocks": {}, "free_blocks": 4}, end=False)
    assert verdicts(report) == [("one-state", 1, "b")]
    assert "b is in unsampled (its output dropped) but not scheduled in this step" in \
        report.violations[0].message


@pytest.mark.parametrize("key", ["unsampled", "released", "reclaimed"])
def test_lmdeploys_step_keys_on_a_trace_without_its_rules_are_one_state(key: str) -> None:
    # a config the compiled state takes: the vectorized checker hands the line over
    report = check(START, {"step": 1, "scheduled": [["a", 1], ["b", 1]], key: ["b"],
                           "new_blocks": {}, "free_blocks": 4},
                   end=False, pipelined=False, preemption="recompute")
    assert verdicts(report) == [("one-state", 1, "b")]
    if key == "unsampled":
        assert "without config pipelined" in report.violations[0].message


def test_a_held_line_settles_with_the_next_steps_finishes_and_dropped_entries() -> None:
    held = HeldLine()
    assert held.settle(["x"]) is None
    held.hold(StepRecord(4, scheduled=(("a", 1), ("b", 1)), finished=("a",)))
    with pytest.raises(ValueError, match="step 4's line is still held"):
        held.hold(StepRecord(5))
    rec = held.settle(["c"], unsampled=["a"])
    assert rec is not None and (rec.finished, rec.unsampled) == (("c",), ("a",))
    assert held.settle() is None


def test_a_simulated_lmdeploy_run_writes_its_dropped_entries_and_checks_clean(
        tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    kvsched = Path(sys.executable).with_name("kvsched")
    made = subprocess.run([str(kvsched), "simulate", "--profile", "lmdeploy@0.18.0",
                           "--requests", "300", "--out", str(out)],
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    assert any("unsampled" in json.loads(x) for x in out.read_text().splitlines()[1:])
    with out.open("rb") as f:
        report = check_trace(TraceReader(f))
    assert report.errors() == 0, report.violations[:3]
