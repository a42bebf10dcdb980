"""The spec checker on small hand-written traces: each rule fires where it should,
names the right request and numbers, and stays quiet where it should."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from kvsched.spec.checker import CheckOptions, Report, check_trace
from kvsched.spec.trace import TraceReader

CONFIG = {"block_size": 4, "num_gpu_blocks": 8, "num_cpu_blocks": 4,
          "max_num_batched_tokens": 32, "max_num_seqs": 4, "max_model_len": 32,
          "chunked_prefill": True, "long_prefill_token_threshold": 0, "policy": "fcfs",
          "preemption": "recompute", "watermark_blocks": 0}


def check(*steps: dict[str, Any], end: bool = True, **config: Any) -> Report:
    lines = [{"kvsched": "trace", "version": 1, "config": {**CONFIG, **config}}, *steps]
    if end:
        lines.append({"end": True})
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    return check_trace(TraceReader(io.BytesIO(data)))


def arrive(rid: str, prompt: int, max_tokens: int = 8, priority: int = 0) -> dict[str, Any]:
    return {"id": rid, "prompt_len": prompt, "max_tokens": max_tokens, "priority": priority}


def only(report: Report, invariant: str) -> list[Any]:
    return [v for v in report.violations if v.invariant == invariant]


def test_a_clean_trace_has_no_violation() -> None:
    report = check(
        {"step": 0, "arrivals": [arrive("a", 6, 2)], "scheduled": [["a", 6]],
         "free_blocks": 6, "new_blocks": {"a": [0, 1]}},
        {"step": 1, "scheduled": [["a", 1]], "finished": ["a"], "free_blocks": 8,
         "new_blocks": {}})
    assert report.counts == {} and report.complete and report.requests == 1


def test_finishing_a_finished_request_is_one_state_not_a_crash() -> None:
    report = check(
        {"step": 0, "arrivals": [arrive("a", 3, 1)], "scheduled": [["a", 3]], "finished": ["a"]},
        {"step": 1, "finished": ["a"]})
    [v] = only(report, "one-state")
    assert (v.step, v.request) == (1, "a") and "finished while finished" in v.message


def test_block_blame_follows_batch_order() -> None:
    # b and c both receive block 5: c, later in the batch, is the one blamed, every run.
    report = check({"step": 0, "arrivals": [arrive("b", 4), arrive("c", 4)],
                    "scheduled": [["b", 4], ["c", 4]], "new_blocks": {"c": [5], "b": [5]}})
    [v] = only(report, "block-ids")
    assert v.request == "c" and "which b still holds" in v.message


def test_blocks_given_to_an_unscheduled_request_count_against_zero() -> None:
    report = check({"step": 0, "arrivals": [arrive("a", 4), arrive("idle", 4)],
                    "scheduled": [["a", 4]], "new_blocks": {"a": [0], "idle": [3]}},
                   end=False)
    [v] = only(report, "block-ids")
    assert v.request == "idle" and (v.lhs, v.rhs) == (1, 0)


def test_an_invalid_victim_is_preempt_and_not_needed_preemption() -> None:
    report = check({"step": 0, "arrivals": [arrive("a", 4)],
                    "preempted": [{"id": "a", "mode": "recompute"}], "scheduled": []},
                   end=False)
    assert set(report.counts) == {"preempt"}
    assert "a is preempted while waiting" in report.violations[0].message


def test_sampling_past_max_model_len_breaks_finish() -> None:
    # A 32-token prompt with max_model_len 32 has no room for an output token.
    report = check({"step": 0, "arrivals": [arrive("a", 32, 1)], "scheduled": [["a", 32]],
                    "finished": ["a"]}, num_gpu_blocks=8)
    [v] = only(report, "finish")
    assert (v.lhs, v.relation, v.rhs) == (33, "<=", 32)
    assert "past max_model_len 32" in v.message


def test_a_request_at_max_tokens_must_finish_that_step() -> None:
    report = check({"step": 0, "arrivals": [arrive("a", 3, 1)], "scheduled": [["a", 3]]},
                   end=False)
    [v] = only(report, "finish")
    assert "reached max_tokens 1 but did not finish" in v.message


def test_finishing_without_sampling_breaks_finish() -> None:
    report = check({"step": 0, "arrivals": [arrive("a", 8)], "scheduled": [["a", 4]],
                    "finished": ["a"]})
    [v] = only(report, "finish")
    assert "without having sampled" in v.message


@pytest.mark.parametrize("reported,ids,invariant,blamed,words", [
    # With a's new block id in the trace, only b's release can explain the shortfall.
    (4, True, "preempt", "b", "preempting b should have released 1 GPU blocks"),
    # Without it, a's allocation could explain it as well: the step is blamed, not b.
    (4, False, "accounting", None, "which any of b's victim (1), a's allocation (1) could"),
    (9, True, "accounting", None, "reports 9 free GPU blocks; the trace implies 5"),
])
def test_free_count_mismatch_is_blamed_on_what_the_counts_single_out(
        reported: int, ids: bool, invariant: str, blamed: str | None, words: str) -> None:
    # Step 1: b gives up its 1 block and a takes a 3rd: derived free after = 5 + 1 - 1.
    blocks = {"new_blocks": {"a": [7]}} if ids else {}
    report = check(
        {"step": 0, "arrivals": [arrive("a", 8), arrive("b", 4)],
         "scheduled": [["a", 8], ["b", 4]], "free_blocks": 5},
        {"step": 1, "preempted": [{"id": "b", "mode": "recompute"}], "scheduled": [["a", 1]],
         "free_blocks": reported, **blocks}, end=False)
    [v] = only(report, invariant)
    assert v.step == 1 and words in v.message and v.request == blamed
    assert report.errors() == 1


def test_a_finished_leak_is_finish() -> None:
    report = check(
        {"step": 0, "arrivals": [arrive("a", 8, 1)], "scheduled": [["a", 8]],
         "finished": ["a"], "free_blocks": 6, "new_blocks": {"a": [0, 1]}})
    [v] = only(report, "finish")
    assert "a leak" in v.message and (v.lhs, v.rhs) == (0, 2) and v.request == "a"


def test_each_leak_is_told_once() -> None:
    steps = [{"step": 0, "arrivals": [arrive("a", 8, 1)], "scheduled": [["a", 8]],
              "finished": ["a"], "free_blocks": 6, "new_blocks": {"a": [0, 1]}}]
    steps += [{"step": i, "free_blocks": 6} for i in range(1, 5)]
    report = check(*steps)
    assert report.counts == {"finish": 1}


def test_swap_out_and_in_move_exactly_the_held_blocks() -> None:
    report = check(
        {"step": 0, "arrivals": [arrive("a", 8)], "scheduled": [["a", 8]], "free_blocks": 6},
        {"step": 1, "preempted": [{"id": "a", "mode": "swap"}], "free_blocks": 8},
        {"step": 2, "swapped_in": ["a"], "scheduled": [["a", 1]], "free_blocks": 5},
        end=False, preemption="swap")
    assert report.errors() == 0


def test_swap_out_beyond_host_is_cpu_budget() -> None:
    report = check(
        {"step": 0, "arrivals": [arrive("a", 8)], "scheduled": [["a", 8]]},
        {"step": 1, "preempted": [{"id": "a", "mode": "swap"}]},
        end=False, num_cpu_blocks=1, preemption="swap")
    [v] = only(report, "cpu-budget")
    assert (v.lhs, v.rhs) == (2, 1)  # a's 8 tokens hold 2 blocks of 4


def test_scheduling_a_swapped_request_without_swap_in_is_one_state() -> None:
    report = check(
        {"step": 0, "arrivals": [arrive("a", 8)], "scheduled": [["a", 8]]},
        {"step": 1, "preempted": [{"id": "a", "mode": "swap"}]},
        {"step": 2, "scheduled": [["a", 1]]}, end=False, preemption="swap")
    [v] = only(report, "one-state")
    assert "a is scheduled while swapped" in v.message


def test_whole_prefill_without_chunking() -> None:
    report = check({"step": 0, "arrivals": [arrive("a", 8)], "scheduled": [["a", 4]]},
                   end=False, chunked_prefill=False)
    [v] = only(report, "token-range")
    assert "must be scheduled whole" in v.message


def test_rejecting_a_feasible_request_and_keeping_an_impossible_one() -> None:
    report = check({"step": 0, "arrivals": [arrive("ok", 4), arrive("huge", 40)],
                    "rejected": [{"id": "ok", "reason": "no"}]})
    assert only(report, "reject")[0].request == "ok"
    [c] = only(report, "completion")
    assert c.request == "huge" and "should have been rejected" in c.message


def test_thrash_is_told_once_past_the_limit() -> None:
    steps: list[dict[str, Any]] = [
        {"step": 0, "arrivals": [arrive("a", 4, 30)], "scheduled": [["a", 4]]}]
    for i in range(1, 12, 2):
        steps.append({"step": i, "preempted": [{"id": "a", "mode": "recompute"}]})
        steps.append({"step": i + 1, "scheduled": [["a", 4 + (i + 1) // 2]]})
    lines = [{"kvsched": "trace", "version": 1, "config": CONFIG}, *steps]
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    report = check_trace(TraceReader(io.BytesIO(data)), CheckOptions(max_preemptions=3))
    [v] = only(report, "no-thrash")
    assert v.step == 7 and (v.lhs, v.rhs) == (4, 3)


@pytest.mark.parametrize("step,invariant,words", [
    ({"aborted": ["ghost"]}, "one-state", "ghost is aborted but never arrived"),
    ({"scheduled": [["ghost", 1]]}, "one-state", "ghost is scheduled but never arrived"),
    ({"swapped_in": ["ghost"]}, "one-state", "ghost is swapped in but never arrived"),
    ({"finished": ["ghost"]}, "one-state", "ghost is finished but never arrived"),
    ({"rejected": [{"id": "ghost", "reason": "x"}]}, "one-state",
     "ghost is rejected but never arrived"),
    ({"preempted": [{"id": "ghost", "mode": "recompute"}]}, "preempt",
     "ghost is preempted but never arrived"),
    ({"scheduled": [["done", 1]]}, "one-state", "done is scheduled while finished"),
    ({"preempted": [{"id": "done", "mode": "swap"}]}, "preempt",
     "done is preempted while finished"),
    ({"arrivals": [arrive("live", 4)]}, "one-state", "live arrives again while running"),
    ({"arrivals": [arrive("done", 4)]}, "one-state", "done arrives again while finished"),
    ({"swapped_in": ["live"]}, "one-state", "live is swapped in while running"),
    ({"finished": ["done"]}, "one-state", "done is finished while finished"),
])
def test_engine_mistakes_about_ids_are_violations_and_the_check_goes_on(
        step: dict[str, Any], invariant: str, words: str) -> None:
    report = check(
        {"step": 0, "arrivals": [arrive("done", 4, 1), arrive("live", 4)],
         "scheduled": [["done", 4], ["live", 4]], "finished": ["done"]},
        {"step": 1, **step},
        # A later step still breaks token-range: the rest of the trace is checked.
        {"step": 2, "scheduled": [["live", 0]]},
        end=False)
    [v] = only(report, invariant)
    assert v.step == 1 and words in v.message
    assert only(report, "token-range")[0].step == 2


def test_a_transient_miscount_is_told_once() -> None:
    # Step 0 reports one block too many; step 1 is right again and preempts: only the
    # miscount is reported, not a spurious preempt against the adopted difference.
    report = check(
        {"step": 0, "arrivals": [arrive("a", 8), arrive("b", 4)],
         "scheduled": [["a", 8], ["b", 4]], "free_blocks": 6},
        {"step": 1, "preempted": [{"id": "b", "mode": "recompute"}], "scheduled": [["a", 1]],
         "free_blocks": 5}, end=False)
    assert report.errors() == 1 and report.counts["accounting"] == 1


# -- no-idle: who could have run ------------------------------------------------------

def idle_after(*steps: dict[str, Any], **config: Any) -> str | None:
    """The request no-idle names on the last (idle) step, if any."""
    found = only(check(*steps, end=False, **config), "no-idle")
    return found[-1].request if found and found[-1].step == steps[-1]["step"] else None


def test_no_idle_counts_a_swapped_requests_host_blocks() -> None:
    # a (2 blocks) is swapped out; b runs with 6 of 8. Bringing a back needs its 2 host
    # blocks and 1 for its next token: 3 > the 2 free, so only b could run.
    steps = [{"step": 0, "arrivals": [arrive("a", 8), arrive("b", 20)],
              "scheduled": [["a", 8], ["b", 20]]},
             {"step": 1, "preempted": [{"id": "a", "mode": "swap"}], "scheduled": [["b", 1]]}]
    assert idle_after(*steps, {"step": 2}, preemption="swap") == "b"
    assert idle_after(*steps, {"step": 2, "finished": ["b"]}, preemption="swap") == "a"


def test_no_idle_asks_for_the_watermark_only_while_something_runs() -> None:
    steps = [{"step": 0, "arrivals": [arrive("a", 16), arrive("b", 4)],
              "scheduled": [["a", 16]]}]
    # a holds 4 of 8 blocks; b needs 1 (4 tokens) plus a watermark of 3 while a runs.
    assert idle_after(*steps, {"step": 1}, watermark_blocks=3) == "a"  # a runs: 1 fits
    assert idle_after(*steps, {"step": 1, "preempted": [{"id": "a", "mode": "recompute"}]},
                      {"step": 2}, watermark_blocks=3) in ("a", "b")
    assert idle_after(*steps, {"step": 1}, watermark_blocks=4) == "a"
    only_b = [{"step": 0, "arrivals": [arrive("a", 16, 1), arrive("b", 16)],
               "scheduled": [["a", 16]], "finished": ["a"]},
              {"step": 1, "arrivals": [arrive("c", 16)], "scheduled": [["b", 16]]}]
    # b runs with 4 blocks; c needs 4 + a watermark of 1 > 4 free, and b itself can run.
    assert idle_after(*only_b, {"step": 2}, watermark_blocks=1) == "b"


def test_no_idle_without_chunked_prefill_needs_the_whole_prompt() -> None:
    steps = [{"step": 0, "arrivals": [arrive("big", 40), arrive("small", 4)]}]
    # Chunked: 1 token of big fits. Whole: big's 40 tokens need 10 blocks of 8, but
    # small's 4 tokens fit.
    assert idle_after(*steps, max_num_batched_tokens=64, max_model_len=64,
                      num_gpu_blocks=16) == "big"
    assert idle_after(*steps, chunked_prefill=False, max_num_batched_tokens=64,
                      max_model_len=64, num_gpu_blocks=9) == "small"
    assert idle_after(*steps, chunked_prefill=False, max_num_batched_tokens=64,
                      max_model_len=64, num_gpu_blocks=10) == "big"  # an exact fit runs


def test_no_idle_respects_the_sequence_limit() -> None:
    steps = [{"step": 0, "arrivals": [arrive("a", 4), arrive("b", 4)], "scheduled": [["a", 4]]}]
    assert idle_after(*steps, {"step": 1}, max_num_seqs=1) == "a"  # a runs; b may not join
    full = [{"step": 0, "arrivals": [arrive("a", 4), arrive("b", 4)],
             "scheduled": [["a", 4], ["b", 4]]}, {"step": 1, "arrivals": [arrive("c", 4)]}]
    assert idle_after(*full, max_num_seqs=2) == "a"


def test_every_violation_is_counted_and_the_first_twenty_of_each_id_kept() -> None:
    steps = [{"step": i, "scheduled": [["ghost", 1]]} for i in range(25)]
    report = check(*steps, end=False)
    assert report.counts["one-state"] == 25
    assert [v.step for v in report.violations] == list(range(20))
    assert report.steps == 25 and report.scheduled_entries == 25


def test_swap_in_restores_host_blocks_and_counts_them_as_demand() -> None:
    steps = [{"step": 0, "arrivals": [arrive("a", 8)], "scheduled": [["a", 8]],
              "free_blocks": 6},
             {"step": 1, "preempted": [{"id": "a", "mode": "swap"}], "free_blocks": 8},
             {"step": 2, "swapped_in": ["a"], "scheduled": [["a", 1]], "free_blocks": 5},
             # a has its 3 blocks back; preempted again, its 3 go to host, which has 4.
             {"step": 3, "preempted": [{"id": "a", "mode": "swap"}], "free_blocks": 8},
             {"step": 4, "swapped_in": ["a"], "scheduled": [["a", 1]], "free_blocks": 5}]
    report = check(*steps, end=False, preemption="swap")
    assert report.errors() == 0  # (the preemptions were not needed: warnings only)
    # a swaps out 2 blocks, comes back with 3: the second swap-out needs 3 host blocks.
    host = check(*steps, end=False, preemption="swap", num_cpu_blocks=2)
    [v] = only(host, "cpu-budget")
    assert (v.step, v.lhs, v.rhs) == (3, 3, 2)
    assert host.counts["accounting"] == 0
