"""The spec checker on small hand-written traces: each rule fires where it should,
names the right request and numbers, and stays quiet where it should."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from kvsched.spec import Config, Preemption, Request, RequestView, Status, StepRecord
from kvsched.spec.checker import Checker, CheckOptions, Report, check_steps, check_trace
from kvsched.spec.state import State
from kvsched.spec.trace import TraceReader

CONFIG = {"block_size": 4, "num_gpu_blocks": 8, "num_cpu_blocks": 4,
          "max_num_batched_tokens": 32, "max_num_seqs": 4, "max_model_len": 32,
          "chunked_prefill": True, "long_prefill_token_threshold": 0, "policy": "fcfs",
          "preemption": "recompute", "watermark_blocks": 0}


def check(*steps: dict[str, Any], end: bool = True, options: CheckOptions | None = None,
          **config: Any) -> Report:
    lines = [{"kvsched": "trace", "version": 1, "config": {**CONFIG, **config}}, *steps]
    if end:
        lines.append({"end": True})
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    return check_trace(TraceReader(io.BytesIO(data)), options)


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
    assert report.unchecked == {}  # block ids and free counts on every step, an end line


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
    # a reaches max_model_len 32 at its first output, is not finished, and samples again.
    report = check({"step": 0, "arrivals": [arrive("a", 31, 4)], "scheduled": [["a", 31]]},
                   {"step": 1, "scheduled": [["a", 1]], "finished": ["a"]}, num_gpu_blocks=8)
    first, second = only(report, "finish")
    assert first.step == 0 and "reached max_model_len 32 but did not finish" in first.message
    assert second.step == 1 and (second.lhs, second.relation, second.rhs) == (33, "<=", 32)
    assert "past max_model_len 32" in second.message


def test_a_prompt_of_max_model_len_may_be_served_one_token_or_rejected() -> None:
    # Rule 2: vLLM V0 serves it (one token, then it finishes on max_model_len), vLLM v1's
    # front end rejects it; both are right, and serving it is not sampling past the limit.
    served = check({"step": 0, "arrivals": [arrive("a", 32, 4)], "scheduled": [["a", 32]],
                    "finished": ["a"], "free_blocks": 8, "new_blocks": {"a": list(range(8))}})
    rejected = check({"step": 0, "arrivals": [arrive("a", 32, 4)],
                      "rejected": [{"id": "a", "reason": "no room"}]})
    assert served.counts == {} and rejected.counts == {}
    # Served, it must finish at its first token.
    unfinished = check({"step": 0, "arrivals": [arrive("a", 32, 4)], "scheduled": [["a", 32]]},
                       end=False)
    [v] = only(unfinished, "finish")
    assert "reached max_model_len 32 but did not finish" in v.message
    # One token longer is longer than max_model_len: it must be rejected.
    left = check({"step": 0, "arrivals": [arrive("b", 33, 4)]})
    [c] = only(left, "completion")
    assert "longer than max_model_len 32" in c.message and "should have been rejected" in c.message


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


@pytest.mark.parametrize("reported,ids,invariant,blamed,words,numbers", [
    # With a's new block id in the trace, only b's release can explain the shortfall.
    (4, True, "preempt", "b", "preempting b should have released 1 GPU blocks", "0 == 1"),
    # Without it, a's allocation could explain it as well: the step is blamed, not b.
    (4, False, "accounting", None, "which any of b's victim (1), a's allocation (1) could",
     "4 == 5"),
    (9, True, "accounting", None, "reports 9 free GPU blocks; the trace implies 5", "9 == 5"),
])
def test_free_count_mismatch_is_blamed_on_what_the_counts_single_out(
        reported: int, ids: bool, invariant: str, blamed: str | None, words: str,
        numbers: str) -> None:
    # Step 1: b gives up its 1 block and a takes a 3rd: derived free after = 5 + 1 - 1.
    blocks = {"new_blocks": {"a": [7]}} if ids else {}
    report = check(
        {"step": 0, "arrivals": [arrive("a", 8), arrive("b", 4)],
         "scheduled": [["a", 8], ["b", 4]], "free_blocks": 5},
        {"step": 1, "preempted": [{"id": "b", "mode": "recompute"}], "scheduled": [["a", 1]],
         "free_blocks": reported, **blocks}, end=False)
    [v] = only(report, invariant)
    assert v.step == 1 and words in v.message and v.request == blamed
    assert v.numbers() == numbers
    assert report.errors() == 1


def test_a_finished_leak_is_finish() -> None:
    report = check(
        {"step": 0, "arrivals": [arrive("a", 8, 1)], "scheduled": [["a", 8]],
         "finished": ["a"], "free_blocks": 6, "new_blocks": {"a": [0, 1]}})
    [v] = only(report, "finish")
    assert "a leak" in v.message and (v.lhs, v.rhs) == (0, 2) and v.request == "a"
    assert v.step == 0 and v.numbers() == "0 == 2"


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
        {"step": 2, "scheduled": [["a", 1]], "free_blocks": 8}, end=False, preemption="swap")
    [v] = only(report, "one-state")
    assert "a is scheduled while swapped" in v.message
    assert only(report, "accounting") == []  # the entry took no block: a is still swapped


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


# -- each rule's words and numbers ----------------------------------------------------

def test_computing_past_max_model_len_is_token_range() -> None:
    # A 40-token prompt does not fit max_model_len 32: 33 tokens of it already pass it.
    report = check({"step": 0, "arrivals": [arrive("a", 40)], "scheduled": [["a", 33]]},
                   end=False, num_gpu_blocks=16, max_num_batched_tokens=64)
    [v] = only(report, "token-range")
    assert (v.step, v.request, v.message) == (0, "a", "a would compute past max_model_len")
    assert (v.lhs, v.relation, v.rhs) == (33, "<=", 32)


def test_without_chunking_the_rest_of_a_prefill_is_owed_whole() -> None:
    report = check({"step": 0, "arrivals": [arrive("a", 8)], "scheduled": [["a", 4]]},
                   {"step": 1, "scheduled": [["a", 2]]}, end=False, chunked_prefill=False)
    v = only(report, "token-range")[1]
    assert v.message == "without chunked prefill a must be scheduled whole (4 tokens), got 2"
    assert (v.lhs, v.relation, v.rhs) == (2, "==", 4)


def test_a_request_at_max_model_len_must_finish_that_step() -> None:
    # b samples with room to spare; a's sampled token takes it to max_model_len 32.
    report = check({"step": 0, "arrivals": [arrive("b", 4), arrive("a", 31)],
                    "scheduled": [["b", 4], ["a", 31]]},
                   end=False, num_gpu_blocks=16, max_num_batched_tokens=64)
    [v] = only(report, "finish")
    assert (v.request, v.message) == ("a", "a reached max_model_len 32 but did not finish")
    assert (v.lhs, v.relation, v.rhs) == (32, "<", 32)


def test_a_block_id_below_the_first_is_outside_the_cache() -> None:
    report = check({"step": 0, "arrivals": [arrive("a", 4)], "scheduled": [["a", 4]],
                    "new_blocks": {"a": [0]}}, end=False, first_block_id=1)
    [v] = only(report, "block-ids")
    assert v.message == "a gets block 0, outside 1..8"
    assert (v.lhs, v.relation, v.rhs) == (0, ">=", 1)


def test_a_block_handed_out_twice_stays_its_first_owners() -> None:
    # Block 0 (the first id) is x's; y and then z are handed it too. A block given to an
    # id that never arrived is counted against 0 and owned by no one.
    report = check(
        {"step": 0, "arrivals": [arrive("x", 4)], "scheduled": [["x", 4]],
         "new_blocks": {"x": [0], "ghost": [5]}},
        {"step": 1, "arrivals": [arrive("y", 4)], "scheduled": [["y", 4]],
         "new_blocks": {"y": [0]}},
        {"step": 2, "arrivals": [arrive("z", 4)], "scheduled": [["z", 4]],
         "new_blocks": {"z": [0]}}, end=False)
    assert [(v.step, v.message) for v in only(report, "block-ids")] == [
        (0, "ghost gets 1 new block ids where it needs 0"),
        (1, "y gets block 0, which x still holds"),
        (2, "z gets block 0, which x still holds")]


def test_a_short_abort_is_blamed_past_actions_that_did_not_apply() -> None:
    # Step 1: b's abort releases its 1 block; ghost's entry and finish and z's empty
    # entry take and release nothing, so the block the engine is missing is b's.
    report = check(
        {"step": 0, "arrivals": [arrive("a", 4), arrive("b", 4), arrive("z", 4)],
         "scheduled": [["a", 4], ["b", 4]], "new_blocks": {"a": [0], "b": [1]},
         "free_blocks": 6},
        {"step": 1, "aborted": ["b"], "scheduled": [["ghost", 1], ["z", 0]],
         "finished": ["ghost"], "new_blocks": {}, "free_blocks": 6}, end=False)
    [v] = only(report, "accounting")
    assert (v.step, v.request, v.numbers()) == (1, "b", "6 == 7")
    assert v.message == ("aborting b should have released 1 GPU blocks, but the engine "
                         "reports 1 fewer free")


def test_kv_budget_counts_what_the_preemptions_reclaimed() -> None:
    # b's 2 blocks come back, but c's 24 tokens need 6 of the 2 + 2.
    report = check({"step": 0, "arrivals": [arrive("a", 16), arrive("b", 8)],
                    "scheduled": [["a", 16], ["b", 8]]},
                   {"step": 1, "arrivals": [arrive("c", 24)],
                    "preempted": [{"id": "b", "mode": "recompute"}], "scheduled": [["c", 24]]},
                   end=False)
    [v] = only(report, "kv-budget")
    assert v.message == ("the step needs 6 new GPU blocks but only 2 were free and 2 "
                         "reclaimed by preemption")
    assert (v.step, v.numbers()) == (1, "6 <= 4")


def test_a_swap_in_is_an_allocation_the_free_count_can_blame() -> None:
    # a comes back with its 1 host block and takes 1 more for its 5th token; without
    # block ids both allocations may have gone wrong, and together they explain 2.
    report = check(
        {"step": 0, "arrivals": [arrive("a", 4)], "scheduled": [["a", 4]]},
        {"step": 1, "preempted": [{"id": "a", "mode": "swap"}]},
        {"step": 2, "swapped_in": ["a"], "scheduled": [["a", 1]], "free_blocks": 4},
        end=False, preemption="swap")
    [v] = only(report, "accounting")
    assert v.message == ("a, a should have been handed 2 GPU blocks, but the engine reports "
                         "2 fewer free")


def test_more_free_than_the_trace_implies_names_the_one_suspect() -> None:
    report = check({"step": 0, "arrivals": [arrive("a", 4)], "scheduled": [["a", 4]],
                    "free_blocks": 10}, end=False)
    [v] = only(report, "accounting")
    assert v.message == ("the engine reports 10 free GPU blocks; the trace implies 7; 3 more "
                         "free, which a's allocation (1) could explain")


@pytest.mark.parametrize("n,more", [(6, ""), (7, " and 1 more")])
def test_at_most_six_suspects_are_named(n: int, more: str) -> None:
    ids = "abcdefg"[:n]
    report = check({"step": 0, "arrivals": [arrive(r, 4) for r in ids],
                    "scheduled": [[r, 4] for r in ids], "free_blocks": 9},
                   end=False, max_num_seqs=8)
    [v] = only(report, "accounting")
    named = ", ".join(f"{r}'s allocation (1)" for r in "abcdef")
    assert v.message == (f"the engine reports 9 free GPU blocks; the trace implies {8 - n}; "
                         f"{1 + n} more free, which any of {named}{more} could explain")


def test_a_restart_is_only_a_recompute_victims_first_chunk() -> None:
    # a restarts at step 2 (4 of its 5 tokens); at step 3 it is an ordinary request, so
    # a block missing then is an allocation's, not a restart's.
    report = check(
        {"step": 0, "arrivals": [arrive("a", 4)], "scheduled": [["a", 4]]},
        {"step": 1, "preempted": [{"id": "a", "mode": "recompute"}]},
        {"step": 2, "scheduled": [["a", 4]]},
        {"step": 3, "scheduled": [["a", 1]], "free_blocks": 5}, end=False)
    assert only(report, "preempt") == []
    [v] = only(report, "accounting")
    assert v.message == ("a should have been handed 1 GPU blocks, but the engine reports 1 "
                         "fewer free")


# -- actions that do not apply leave the state as it was ------------------------------

def test_rejecting_a_running_request_does_not_end_it() -> None:
    report = check({"step": 0, "arrivals": [arrive("a", 4)], "scheduled": [["a", 4]]},
                   {"step": 1, "rejected": [{"id": "a", "reason": "x"}]},
                   {"step": 2, "scheduled": [["a", 1]]}, end=False)
    assert [v.message for v in report.violations if v.level == "MUST"] == [
        "a is rejected while running"]


def test_a_rejected_request_is_told_as_rejected() -> None:
    report = check({"step": 0, "arrivals": [arrive("huge", 40)],
                    "rejected": [{"id": "huge", "reason": "too long"}]},
                   {"step": 1, "scheduled": [["huge", 1]]}, end=False)
    assert [v.message for v in report.violations] == ["huge is scheduled while rejected"]


def test_a_waiting_victim_is_not_swapped_out() -> None:
    report = check({"step": 0, "arrivals": [arrive("a", 4)],
                    "preempted": [{"id": "a", "mode": "swap"}], "scheduled": [["a", 4]]},
                   end=False, preemption="swap")
    assert report.counts == {"preempt": 1}


def test_a_request_swapped_out_this_step_cannot_be_scheduled_in_it() -> None:
    report = check({"step": 0, "arrivals": [arrive("a", 8)], "scheduled": [["a", 8]]},
                   {"step": 1, "preempted": [{"id": "a", "mode": "swap"}],
                    "scheduled": [["a", 1]]}, end=False, preemption="swap")
    [v] = only(report, "one-state")
    assert v.message == "a is scheduled while swapped out this step"


def test_swapping_in_a_running_request_keeps_its_blocks() -> None:
    report = check({"step": 0, "arrivals": [arrive("a", 8)], "scheduled": [["a", 8]],
                    "free_blocks": 6},
                   {"step": 1, "swapped_in": ["a"], "free_blocks": 6},
                   {"step": 2, "scheduled": [["a", 1]], "finished": ["a"], "free_blocks": 8},
                   end=False)
    assert report.counts == {"one-state": 1}


@pytest.mark.parametrize("swapped_in,words", [
    (["ghost", "a"], "ghost is swapped in but never arrived"),
    (["a", "a"], "a is swapped in while swapped in"),
])
def test_a_swap_in_that_does_not_apply_leaves_the_others(swapped_in: list[str],
                                                         words: str) -> None:
    report = check({"step": 0, "arrivals": [arrive("a", 8)], "scheduled": [["a", 8]]},
                   {"step": 1, "preempted": [{"id": "a", "mode": "swap"}]},
                   {"step": 2, "swapped_in": swapped_in, "scheduled": [["a", 1]]},
                   end=False, preemption="swap")
    assert [v.message for v in only(report, "one-state")] == [words]


def test_every_swap_in_counts_toward_the_demand() -> None:
    # a and b go to host with 2 blocks each; c then holds 5 of 8; both back need 4 > 3.
    report = check(
        {"step": 0, "arrivals": [arrive("a", 8), arrive("b", 8)],
         "scheduled": [["a", 8], ["b", 8]]},
        {"step": 1, "arrivals": [arrive("c", 20)],
         "preempted": [{"id": "a", "mode": "swap"}, {"id": "b", "mode": "swap"}],
         "scheduled": [["c", 20]]},
        {"step": 2, "swapped_in": ["a", "b"]}, end=False, preemption="swap")
    [v] = only(report, "kv-budget")
    assert (v.step, v.lhs, v.rhs) == (2, 4, 3)


def test_a_request_that_ends_after_a_swap_in_gives_the_host_nothing_back() -> None:
    # a goes out and back with 1 block and finishes: 2 host blocks, b's 3 do not fit.
    report = check(
        {"step": 0, "arrivals": [arrive("a", 4)], "scheduled": [["a", 4]]},
        {"step": 1, "preempted": [{"id": "a", "mode": "swap"}]},
        {"step": 2, "swapped_in": ["a"], "scheduled": [["a", 1]], "finished": ["a"]},
        {"step": 3, "arrivals": [arrive("b", 12)], "scheduled": [["b", 12]]},
        {"step": 4, "preempted": [{"id": "b", "mode": "swap"}]},
        end=False, preemption="swap", num_cpu_blocks=2)
    [v] = only(report, "cpu-budget")
    assert (v.step, v.lhs, v.rhs) == (4, 3, 2)


def test_aborting_a_swapped_request_frees_its_host_blocks() -> None:
    # a's 2 host blocks come back when it is aborted: b's 3 fit in the 3 of the host.
    report = check(
        {"step": 0, "arrivals": [arrive("a", 8)], "scheduled": [["a", 8]]},
        {"step": 1, "preempted": [{"id": "a", "mode": "swap"}]},
        {"step": 2, "aborted": ["a"], "arrivals": [arrive("b", 12)], "scheduled": [["b", 12]]},
        {"step": 3, "preempted": [{"id": "b", "mode": "swap"}]},
        end=False, preemption="swap", num_cpu_blocks=3)
    assert only(report, "cpu-budget") == []


def test_entries_that_do_not_apply_leave_the_rest_of_the_batch() -> None:
    # ghost's entry does not apply and z's asks for 0 tokens: a and b still run, and
    # z's entry counts no token toward the budget of 8.
    report = check({"step": 0, "arrivals": [arrive("a", 4, 1), arrive("b", 4), arrive("z", 4)],
                    "scheduled": [["ghost", 1], ["z", 0], ["a", 4], ["b", 4]],
                    "finished": ["a"]}, end=False, max_num_batched_tokens=8)
    assert report.counts == {"one-state": 1, "token-range": 1}


def test_an_empty_entry_samples_nothing() -> None:
    # A prompt of max_model_len tokens scheduled 0 tokens: no token, so no finish rule.
    report = check({"step": 0, "arrivals": [arrive("a", 32)], "scheduled": [["a", 0]]},
                   end=False)
    assert report.counts == {"token-range": 1}


def test_an_id_arriving_twice_in_one_step() -> None:
    report = check({"step": 0, "arrivals": [arrive("a", 4), arrive("a", 4)]}, end=False)
    [v] = only(report, "one-state")
    assert v.message == "a arrives again while arriving; ids are unique"


def test_an_ended_request_scheduled_and_finished_again() -> None:
    report = check(
        {"step": 0, "arrivals": [arrive("done", 4, 1)], "scheduled": [["done", 4]],
         "finished": ["done"]},
        {"step": 1, "scheduled": [["done", 1]], "finished": ["done"]}, end=False)
    assert [v.message for v in only(report, "one-state")] == [
        "done is scheduled while finished", "done is finished while already scheduled this step"]


def test_the_state_a_scheduler_decided_on_is_a_copy() -> None:
    state = State(Config(block_size=4, num_gpu_blocks=8, max_num_batched_tokens=32,
                         max_model_len=32))
    state.apply(StepRecord(0, (Request("a", 8, 2),), scheduled=(("a", 8),)))
    before = state.views()
    assert before == {"a": RequestView(Status.RUNNING, 9, 8, 2, 0, 0)}
    after = state.after_inputs(StepRecord(1, (Request("b", 4, 1),), aborted=("a",)))
    assert after.views() == {"b": RequestView(Status.WAITING, 4, 0, 0, 0, 0)}
    assert (after.free, state.free) == (8, 6) and state.views() == before


# -- needed-preemption ------------------------------------------------------------------

@pytest.mark.parametrize("threshold,told", [(0, False), (1, True)])
def test_needed_preemption_caps_the_victims_own_chunk_at_the_threshold(threshold: int,
                                                                       told: bool) -> None:
    # v (8 of 20 computed, 2 blocks) is preempted so that a can take 1 block. Its own next
    # chunk would need 3 blocks (12 tokens), or 1 with a threshold of 1 token: then the
    # step fits without preempting it.
    report = check({"step": 0, "arrivals": [arrive("a", 16), arrive("v", 20)],
                    "scheduled": [["a", 16], ["v", 8]]},
                   {"step": 1, "preempted": [{"id": "v", "mode": "recompute"}],
                    "scheduled": [["a", 1]]}, end=False, long_prefill_token_threshold=threshold)
    expected = [("the step preempted, but its 2 new blocks fit in the 2 available without "
                 "its last victim", "2 > 2")]
    assert [(v.message, v.numbers()) for v in only(report, "needed-preemption")] == (
        expected if told else [])


def test_needed_preemption_is_not_judged_beside_an_invalid_victim() -> None:
    report = check({"step": 0, "arrivals": [arrive("a", 4), arrive("b", 4)],
                    "scheduled": [["a", 4], ["b", 4]]},
                   {"step": 1, "preempted": [{"id": "b", "mode": "recompute"},
                                             {"id": "ghost", "mode": "recompute"}],
                    "scheduled": [["a", 1]]}, end=False)
    assert report.counts == {"preempt": 1}


def test_check_steps_takes_the_victims_in_order() -> None:
    # v1 had to go (a could not grow without its 5 blocks); v2, the last, did not.
    # In order, the last victim was not needed; as a set, one of them was.
    config = Config(block_size=4, num_gpu_blocks=8, max_num_batched_tokens=32,
                    max_num_seqs=4, max_model_len=32)
    steps = [StepRecord(0, (Request("a", 8, 8), Request("v1", 20, 8), Request("v2", 4, 8)),
                        scheduled=(("a", 8), ("v1", 20), ("v2", 4))),
             StepRecord(1, preempted=(Preemption("v1", "recompute"),
                                      Preemption("v2", "recompute")), scheduled=(("a", 1),))]
    assert check_steps(config, steps, False).counts == {"needed-preemption": 1}
    assert Checker(config, preempted_order=False).run(steps, False).counts == {}


# -- what a report carries --------------------------------------------------------------

def test_strict_and_required_options_reach_the_report() -> None:
    idle = {"step": 0, "arrivals": [arrive("a", 4)], "colour": "red"}  # a could have run
    options = CheckOptions(strict=True, required=frozenset({"block-ids"}))
    report = check(idle, end=False, options=options)
    assert report.ids() == {"no-idle"} and (report.errors(), report.warnings()) == (0, 1)
    assert report.strict and report.failed
    assert report.missing() == {"block-ids": "the trace carries no block ids (new_blocks)"}
    assert report.unknown_keys == {"colour": 2} and report.complete is False
    lenient = check(idle, end=False)
    assert not lenient.strict and not lenient.failed and lenient.missing() == {}


def test_blocks_handed_out_without_ids_leave_block_ids_checked_in_part() -> None:
    report = check({"step": 0, "arrivals": [arrive("a", 4)], "scheduled": [["a", 4]],
                    "new_blocks": {"a": [0]}, "free_blocks": 7},
                   {"step": 1, "scheduled": [["a", 1]], "free_blocks": 6})
    assert report.unchecked == {"block-ids": "in part: from step 1 on, blocks were handed out "
                                             "without ids (no new_blocks), so while they are "
                                             "held their owners are unknown"}


def test_a_new_checker_has_seen_no_step() -> None:
    # kvsched.fuzz words a trace error before the first step as step -1.
    config = Config()
    checker = Checker(config)
    assert checker.config is config and checker.step_no == -1
    assert checker.state.ids_seen is False
    checker.step(StepRecord(0))
    assert checker.step_no == 0


# -- no-idle: more of who could have run ------------------------------------------------

def test_no_idle_skips_a_waiting_request_the_sequence_limit_keeps_out() -> None:
    steps = [{"step": 0, "arrivals": [arrive("b", 4), arrive("a", 4)], "scheduled": [["a", 4]]}]
    assert idle_after(*steps, {"step": 1}, max_num_seqs=1) == "a"
    assert idle_after(*steps, {"step": 1}, max_num_seqs=2) == "b"


def test_no_idle_with_chunked_prefill_needs_one_token() -> None:
    assert idle_after({"step": 0, "arrivals": [arrive("a", 4)]},
                      max_num_batched_tokens=1) == "a"
    # big's 40 tokens need 10 blocks of the 9, but its first token fits.
    assert idle_after({"step": 0, "arrivals": [arrive("big", 40), arrive("small", 4)]},
                      max_num_batched_tokens=64, max_model_len=64, num_gpu_blocks=9) == "big"


def test_no_idle_without_chunked_prefill_skips_what_the_budget_cannot_hold() -> None:
    assert idle_after({"step": 0, "arrivals": [arrive("big", 40), arrive("small", 4)]},
                      chunked_prefill=False) == "small"
    # After its whole prefill, a owes 1 token (N - C), not N + C.
    assert idle_after({"step": 0, "arrivals": [arrive("a", 24)], "scheduled": [["a", 24]]},
                      {"step": 1}, chunked_prefill=False) == "a"


def test_no_idle_brings_a_swapped_request_back_on_its_host_blocks() -> None:
    # a (2 host blocks) needs them back plus 1 for its 9th token: 3, exactly the 3 free.
    steps = [{"step": 0, "arrivals": [arrive("a", 8), arrive("b", 16)],
              "scheduled": [["a", 8], ["b", 16]]},
             {"step": 1, "preempted": [{"id": "a", "mode": "swap"}], "scheduled": [["b", 1]]}]
    assert idle_after(*steps, {"step": 2}, preemption="swap") == "a"


def test_no_idle_adds_the_watermark_to_an_admission_while_one_runs() -> None:
    # Nothing runs: a's first token takes the only block, and no watermark is asked.
    assert idle_after({"step": 0, "arrivals": [arrive("a", 4)]}, num_gpu_blocks=1,
                      watermark_blocks=1) == "a"
    # a runs with 4 of 8 blocks; b (first in line) needs 1 plus the watermark.
    steps: list[dict[str, Any]] = [{"step": 0, "arrivals": [arrive("b", 4), arrive("a", 16)],
                                    "scheduled": [["a", 16]]}, {"step": 1}]
    assert idle_after(*steps, watermark_blocks=3) == "b"
    assert idle_after(*steps, watermark_blocks=4) == "a"
