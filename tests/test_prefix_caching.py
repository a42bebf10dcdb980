"""Prefix caching in the spec: hand-written traces of hits, each rule firing where it
should (docs/spec.md, prefix caching), and both checkers giving the same verdict."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.conformance import checker
from kvsched.generators import SHARED_PROMPTS, generate
from kvsched.metrics import metrics_of_trace
from kvsched.optimized.checker import check_trace_vectorized
from kvsched.reference import reference_scheduler
from kvsched.reference.allocator import BlockAllocator
from kvsched.reference.scheduler import ReferenceScheduler
from kvsched.simulate import run
from kvsched.spec.checker import Report, check_trace
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Config, Policy
from kvsched.spec.prefix import KeyBook, keys, nested
from kvsched.spec.profiles import ConfigDefaults
from kvsched.spec.trace import TraceError, TraceReader, TraceWriter
from kvsched.spec.violation import Violation
from kvsched.strategies import configs, knobs, profiles, resolve, workloads
from kvsched.workload import WorkItem, validate

# block_size 4: a 9-token prompt fills blocks 0 and 1 and starts block 2.
CONFIG = {"block_size": 4, "num_gpu_blocks": 8, "num_cpu_blocks": 0,
          "max_num_batched_tokens": 32, "max_num_seqs": 4, "max_model_len": 32,
          "chunked_prefill": True, "long_prefill_token_threshold": 0, "policy": "fcfs",
          "preemption": "recompute", "watermark_blocks": 0, "prefix_caching": True}


def trace(*steps: dict[str, Any], end: bool = False, **config: Any) -> bytes:
    """A trace of `steps`; complete (with its end line) only when `end`."""
    lines = [{"kvsched": "trace", "version": 1, "config": {**CONFIG, **config}}, *steps]
    lines += [{"end": True}] if end else []
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def check(*steps: dict[str, Any], end: bool = False, **config: Any) -> Report:
    """The spec's verdict, after asserting the vectorized checker gives the same."""
    data = trace(*steps, end=end, **config)
    spec = check_trace(TraceReader(io.BytesIO(data)))
    fast = check_trace_vectorized(io.BytesIO(data))
    assert fast.counts == spec.counts
    assert [v.as_dict() for v in fast.violations] == [v.as_dict() for v in spec.violations]
    return spec


def arrive(rid: str, prompt: int, max_tokens: int = 2) -> dict[str, Any]:
    return {"id": rid, "prompt_len": prompt, "max_tokens": max_tokens}


def ids(report: Report) -> list[str]:
    return [v.invariant for v in report.violations]


# a computes 9 tokens: blocks 0 and 1 are full (cached at table indices 0 and 1).
A_RUNS = {"step": 0, "arrivals": [arrive("a", 9)], "scheduled": [["a", 9]],
          "new_blocks": {"a": [0, 1, 2]}, "free_blocks": 5}
# a decodes one token and finishes (max_tokens 2): blocks 0, 1, 2 are free, 0 and 1 cached.
A_ENDS = {"step": 1, "scheduled": [["a", 1]], "finished": ["a"], "new_blocks": {},
          "free_blocks": 8}


def test_a_hit_on_a_live_request_s_blocks_shares_them() -> None:
    # b hits a's two full blocks while a still holds them: E = 0; it computes 2 more
    # tokens (C 8 -> 10) in a new block. a's finish frees only block 2 (0 and 1 stay b's).
    report = check(A_RUNS,
                   {"step": 1, "arrivals": [arrive("b", 10)], "prefix_hits": {"b": [0, 1]},
                    "scheduled": [["a", 1], ["b", 2]], "finished": ["a"],
                    "new_blocks": {"b": [3]}, "free_blocks": 5},
                   {"step": 2, "scheduled": [["b", 1]], "finished": ["b"], "new_blocks": {},
                    "free_blocks": 8}, end=True)
    assert report.counts == {} and report.complete


def test_a_hit_on_evictable_blocks_takes_them_out_of_the_free_count() -> None:
    hit = {"step": 2, "arrivals": [arrive("c", 10)], "prefix_hits": {"c": [0, 1]},
           "scheduled": [["c", 2]], "new_blocks": {"c": [3]}, "free_blocks": 5}
    assert check(A_RUNS, A_ENDS, hit).counts == {}
    # An engine that forgets E reports 2 more free blocks: accounting names c's hit.
    report = check(A_RUNS, A_ENDS, {**hit, "free_blocks": 7})
    [v] = report.violations
    assert (v.invariant, v.step, v.request) == ("accounting", 2, "c")
    assert "took 2 evictable cached blocks by prefix hit" in v.message


def test_evictable_blocks_count_in_the_step_invariant() -> None:
    # Six other blocks are held; the hit's E = 2 plus one new block needs 3 of the 2 free.
    others = {"step": 2, "arrivals": [arrive("x", 24, 8)], "scheduled": [["x", 24]],
              "new_blocks": {"x": [3, 4, 5, 6, 7, 2]}, "free_blocks": 2}
    over = {"step": 3, "arrivals": [arrive("c", 10)], "prefix_hits": {"c": [0, 1]},
            "scheduled": [["c", 2]], "new_blocks": {"c": [2]}}
    report = check(A_RUNS, A_ENDS, others, over)
    kv = [v for v in report.violations if v.invariant == "kv-budget"]
    assert kv and (kv[0].step, kv[0].lhs, kv[0].rhs) == (3, 3, 2)


def test_a_hit_past_n_minus_1_tokens_is_token_range() -> None:
    # c has 8 tokens: a hit of both blocks would leave nothing to compute.
    report = check(A_RUNS, A_ENDS,
                   {"step": 2, "arrivals": [arrive("c", 8)], "prefix_hits": {"c": [0, 1]},
                    "scheduled": [["c", 1]], "new_blocks": {"c": [3]}})
    v = report.violations[0]
    assert (v.invariant, v.request, v.lhs, v.rhs) == ("token-range", "c", 8, 7)


def test_a_hit_on_a_block_handed_out_since_is_block_ids() -> None:
    # d is handed block 0 (it was evictable: its content is dropped); c then hits it.
    report = check(A_RUNS, A_ENDS,
                   {"step": 2, "arrivals": [arrive("d", 2, 8)], "scheduled": [["d", 2]],
                    "new_blocks": {"d": [0]}, "free_blocks": 7},
                   {"step": 3, "arrivals": [arrive("c", 10)], "prefix_hits": {"c": [0, 1]},
                    "scheduled": [["d", 1], ["c", 2]], "new_blocks": {"c": [3]}})
    bad = [v for v in report.violations if v.invariant == "block-ids"]
    assert bad and bad[0].request == "c" and "block 0 at table index 0" in bad[0].message
    assert "not cached" in bad[0].message


def test_a_hit_at_another_table_index_is_block_ids() -> None:
    report = check(A_RUNS, A_ENDS,
                   {"step": 2, "arrivals": [arrive("c", 10)], "prefix_hits": {"c": [1, 0]},
                    "scheduled": [["c", 2]], "new_blocks": {"c": [3]}, "free_blocks": 5})
    assert ids(report) == ["block-ids", "block-ids"]
    assert "cached at index 1" in report.violations[0].message


def test_a_hit_needs_caching_on_and_c_zero_and_a_scheduled_entry() -> None:
    off = check(A_RUNS, A_ENDS,
                {"step": 2, "arrivals": [arrive("c", 10)], "prefix_hits": {"c": [0, 1]},
                 "scheduled": [["c", 10]], "new_blocks": {"c": [3, 4, 5]}},
                prefix_caching=False)
    assert ids(off)[0] == "token-range" and "prefix_caching false" in off.violations[0].message
    running = check(A_RUNS, {"step": 1, "prefix_hits": {"a": [0, 1]}, "scheduled": [["a", 1]],
                             "finished": ["a"], "new_blocks": {}})
    assert ids(running)[0] == "token-range" and "C=9" in running.violations[0].message
    unscheduled = check(A_RUNS, A_ENDS, {"step": 2, "arrivals": [arrive("c", 10)],
                                         "prefix_hits": {"c": [0, 1]}})
    [v] = [v for v in unscheduled.violations if v.invariant == "one-state"]
    assert v.request == "c" and "not scheduled in this step" in v.message


def test_a_block_filled_earlier_in_the_step_can_be_hit_later_in_it() -> None:
    # a fills blocks 0 and 1; b, later in the same batch, hits them (vLLM caches blocks
    # when it hands them out). With b first in the batch, nothing was cached yet.
    same_step = {"step": 0, "arrivals": [arrive("a", 9), arrive("b", 9)],
                 "scheduled": [["a", 9], ["b", 1]], "prefix_hits": {"b": [0, 1]},
                 "new_blocks": {"a": [0, 1, 2], "b": [3]}, "free_blocks": 4}
    assert check(same_step).counts == {}
    wrong_order = {**same_step, "scheduled": [["b", 1], ["a", 9]]}
    assert "block-ids" in ids(check(wrong_order))


def test_content_keys_check_that_a_hit_is_on_the_same_content() -> None:
    keyed = {**A_RUNS, "block_keys": {"a": ["sys/0", "a/1"]}}
    same = {"step": 2, "arrivals": [arrive("c", 10)], "block_keys": {"c": ["sys/0", "a/1"]},
            "prefix_hits": {"c": [0, 1]}, "scheduled": [["c", 2]], "new_blocks": {"c": [3]},
            "free_blocks": 5}
    assert check(keyed, A_ENDS, same).counts == {}
    other = {**same, "block_keys": {"c": ["sys/0", "c/1"]}}
    [v] = check(keyed, A_ENDS, other).violations
    assert (v.invariant, v.request) == ("block-ids", "c")
    assert "'a/1', where its own content is 'c/1'" in v.message


def test_a_recompute_victim_re_hits_its_own_blocks() -> None:
    # x needs six blocks of the five free: a is preempted, and its full blocks 0 and 1
    # stay cached (evictable) while x takes the others and finishes. a's readmission
    # hits both and recomputes from C = 8 to N = 10, samples its second token, finishes.
    report = check(A_RUNS,
                   {"step": 1, "arrivals": [arrive("x", 24, 1)],
                    "preempted": [{"id": "a", "mode": "recompute"}], "scheduled": [["x", 24]],
                    "finished": ["x"], "new_blocks": {"x": [3, 4, 5, 6, 7, 2]},
                    "free_blocks": 8},
                   {"step": 2, "prefix_hits": {"a": [0, 1]}, "scheduled": [["a", 2]],
                    "finished": ["a"], "new_blocks": {"a": [3]}, "free_blocks": 8},
                   end=True)
    assert report.counts == {} and report.complete
    # Re-handing block 0 to x drops a's cached content: the same hit is then wrong.
    taken = check(A_RUNS,
                  {"step": 1, "arrivals": [arrive("x", 24, 1)],
                   "preempted": [{"id": "a", "mode": "recompute"}], "scheduled": [["x", 24]],
                   "finished": ["x"], "new_blocks": {"x": [3, 4, 5, 6, 7, 0]},
                   "free_blocks": 8},
                  {"step": 2, "prefix_hits": {"a": [0, 1]}, "scheduled": [["a", 2]],
                   "finished": ["a"], "new_blocks": {"a": [3]}, "free_blocks": 8})
    assert ids(taken) == ["block-ids"] and taken.violations[0].step == 2


@pytest.mark.parametrize("caching", [True, False])
def test_without_hits_a_caching_trace_checks_as_any_other(caching: bool) -> None:
    report = check(A_RUNS, A_ENDS, prefix_caching=caching)
    assert report.counts == {} and report.steps == 2


# -- the reference scheduler with prefix caching, and the replay ------------------------

def simulated(config: Config, items: list[WorkItem]) -> tuple[bytes, int, int]:
    """The reference's trace of `items` under vllm-v1, with its hits and preemptions."""
    buf = io.BytesIO()
    writer = TraceWriter(buf)
    writer.header(config)
    hits = preemptions = 0
    for rec in run(reference_scheduler("vllm-v1", config), items):
        hits += len(rec.prefix_hits)
        preemptions += len(rec.preempted)
        writer.step(rec)
    writer.end()
    return buf.getvalue(), hits, preemptions


def without_keys(data: bytes) -> bytes:
    lines = [json.loads(line) for line in data.splitlines()]
    for line in lines:
        line.pop("block_keys", None)
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def under_profile(data: bytes, profile: str = "vllm-v1") -> Report:
    reader = TraceReader(io.BytesIO(data))
    c = checker(reader.header.config, profile=profile,
                preempted_order=reader.header.preempted_order)
    return c.run_trace(reader)


CACHING = Config(block_size=16, num_gpu_blocks=24, max_num_batched_tokens=128,
                 max_num_seqs=8, max_model_len=512, prefix_caching=True)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("chunked", [True, False])
def test_the_reference_hits_shared_prompts_and_its_trace_replays_exactly(
        policy: Policy, chunked: bool) -> None:
    config = replace(CACHING, policy=policy, chunked_prefill=chunked,
                     max_num_batched_tokens=128 if chunked else 512)
    items = generate(SHARED_PROMPTS, 60, seed=3, max_model_len=512, rate=2.0,
                     system_prompts=(96, 48), priorities=(1, 1, 1))
    data, hits, preemptions = simulated(config, items)
    assert hits > 20 and preemptions > 0  # a tight cache: victims come back and re-hit
    report = under_profile(data)
    assert report.counts == {} and report.complete, report.violations[:1]
    # Without content keys the replay takes the trace's hits as given: still exact.
    assert under_profile(without_keys(data)).counts == {}


def test_a_conversation_s_next_turn_hits_the_previous_turn_s_computed_blocks() -> None:
    # t1 is 40 prompt tokens (32 of a system prompt) and 24 outputs: 64 tokens, but the
    # last output is sampled, never computed, so block 3 is never full of computed KV
    # (as in vLLM). t2 starts with all 64: it hits blocks 0..2.
    items = validate([WorkItem("t1", 0, 40, 24, 24, prefix=("sys", 32)),
                      WorkItem("t2", 70, 100, 4, 4, prefix=("t1", 64))])
    data, _, _ = simulated(CACHING, items)
    steps = [json.loads(line) for line in data.splitlines()[1:-1]]
    [t2] = [s["prefix_hits"]["t2"] for s in steps if "t2" in s.get("prefix_hits", {})]
    t1 = [b for s in steps for b in s.get("new_blocks", {}).get("t1", [])]
    assert t2 == t1[:3]
    assert under_profile(data).counts == {}


def test_a_hit_the_profile_would_take_and_the_engine_did_not_is_a_divergence() -> None:
    keyed = {**A_RUNS, "block_keys": {"a": ["s/0", "s/1"]}}
    no_hit = {"step": 2, "arrivals": [arrive("c", 10)], "block_keys": {"c": ["s/0", "s/1"]},
              "scheduled": [["c", 10]], "new_blocks": {"c": [3, 4, 5]}, "free_blocks": 5}
    assert check(keyed, A_ENDS, no_hit).counts == {}  # no hit is never unsafe
    report = under_profile(trace(keyed, A_ENDS, no_hit))
    [v] = report.violations
    assert v.invariant == "profile" and v.step == 2
    assert "the profile scheduled c:2 (hit 2 blocks)" in v.message


def test_the_allocator_frees_as_vllm_s_block_pool() -> None:
    blocks = BlockAllocator(6, 0, caching=True)
    table = blocks.allocate("a", 3)  # [0, 1, 2]
    blocks.cache("a", 2, lambda i: f"k{i}")  # blocks 0 and 1 full and cached
    blocks.free("a")
    # Walking a's table from its end: uncached 2 to the head, cached 1 then 0 to the tail.
    assert table == [0, 1, 2] and blocks.free_gpu_ids() == (2, 3, 4, 5, 1, 0)
    assert blocks.lookup(["k0", "k1", "k2"]) == [0, 1] and blocks.evictable([0, 1]) == 2
    blocks.hit("b", [0, 1])
    assert blocks.free_gpu_ids() == (2, 3, 4, 5) and blocks.block_table("b") == (0, 1)
    blocks.allocate("c", 4)  # takes 2, 3, 4, 5
    blocks.free("b")
    # Handing out a block drops its content; b's cached blocks stay findable.
    assert blocks.lookup(["k0", "k1"]) == [0, 1] and blocks.free_gpu_ids() == (1, 0)
    blocks.allocate("d", 1)  # block 1: its content k1 is dropped
    assert blocks.lookup(["k0", "k1"]) == [0]


@settings(max_examples=60, deadline=None)
@given(config=configs(prefix_caching=True), setup=st.one_of(profiles(), knobs()),
       data=st.data())
def test_reference_traces_with_shared_prefixes_are_clean_and_the_checkers_agree(
        config: Config, setup: str | Knobs, data: st.DataObject) -> None:
    config, knobs_ = resolve(config, setup)
    items = data.draw(workloads(config, shared=True), label="workload")
    buf = io.BytesIO()
    writer = TraceWriter(buf)
    writer.header(config)
    for rec in run(ReferenceScheduler(config, knobs_), items, max_steps=300):
        writer.step(rec)
    writer.end()
    data_ = buf.getvalue()
    spec = check_trace(TraceReader(io.BytesIO(data_)))
    assert not [v for v in spec.violations if v.level == "MUST"], spec.violations[:2]
    assert check_trace_vectorized(io.BytesIO(data_)).counts == spec.counts
    if isinstance(setup, str):
        assert under_profile(data_, setup).counts == spec.counts, "the replay diverges"


# -- every prefix-caching violation in full, and the hit rules at their edges -----------

C_HITS = {"step": 2, "arrivals": [arrive("c", 10)], "prefix_hits": {"c": [0, 1]},
          "scheduled": [["c", 2]], "new_blocks": {"c": [3]}, "free_blocks": 5}


def test_the_hit_refusals_say_who_where_and_both_sides() -> None:
    off = check(A_RUNS, A_ENDS, {**C_HITS, "scheduled": [["c", 10]],
                                 "new_blocks": {"c": [3, 4, 5]}, "free_blocks": None},
                prefix_caching=False)
    assert off.violations == [Violation(
        "token-range", 2, "c takes a prefix hit but the trace's config has prefix_caching "
        "false", request="c")]
    # A running request's hit is refused whatever its blocks: [1, 0] are not checked.
    running = check(A_RUNS, {"step": 1, "prefix_hits": {"a": [1, 0]}, "scheduled": [["a", 1]],
                             "finished": ["a"], "new_blocks": {}})
    assert running.violations == [Violation(
        "token-range", 1, "a takes a prefix hit while running with C=9; a hit is taken only "
        "at C = 0, on admission", request="a", lhs=9, relation="==", rhs=0)]
    unscheduled = check(A_RUNS, A_ENDS, {"step": 2, "arrivals": [arrive("c", 10)],
                                         "prefix_hits": {"c": [0, 1]}})
    assert unscheduled.violations[0] == Violation(
        "one-state", 2, "c takes a prefix hit but is not scheduled in this step", request="c")


def test_a_hit_on_a_block_outside_the_cache_is_block_ids() -> None:
    # Block 8 is one past the last of 0..7.
    report = check(A_RUNS, A_ENDS, {**C_HITS, "prefix_hits": {"c": [0, 8]},
                                    "free_blocks": None})
    assert report.violations == [Violation(
        "block-ids", 2, "c's prefix hit takes block 8, outside 0..7", request="c")]


def test_a_hit_at_the_wrong_index_gives_both_indices() -> None:
    report = check(A_RUNS, A_ENDS, {**C_HITS, "prefix_hits": {"c": [1, 0]}})
    assert report.violations == [
        Violation("block-ids", 2, "c's prefix hit takes block 1 at table index 0, but it is "
                  "cached at index 1", request="c", lhs=1, relation="==", rhs=0),
        Violation("block-ids", 2, "c's prefix hit takes block 0 at table index 1, but it is "
                  "cached at index 0", request="c", lhs=0, relation="==", rhs=1)]


def test_a_hit_on_other_content_is_told_at_its_step() -> None:
    keyed = {**A_RUNS, "block_keys": {"a": ["sys/0", "a/1"]}}
    other = {**C_HITS, "block_keys": {"c": ["sys/0", "c/1"]}}
    [v] = check(keyed, A_ENDS, other).violations
    assert (v.invariant, v.step, v.request) == ("block-ids", 2, "c")


def test_a_wrong_handout_is_told_beside_a_good_hit() -> None:
    report = check(A_RUNS, A_ENDS, {**C_HITS, "new_blocks": {"c": [3, 4]},
                                    "free_blocks": None})
    assert report.violations == [Violation(
        "block-ids", 2, "c gets 2 new block ids where it needs 1", request="c", lhs=2,
        relation="==", rhs=1)]


def test_a_hit_s_evictable_blocks_add_to_the_demand_of_the_entries_before_it() -> None:
    # x takes six new blocks, then c's hit two evictable ones and one new: 9 of 8.
    report = check(A_RUNS, A_ENDS,
                   {"step": 2, "arrivals": [arrive("x", 24, 8), arrive("c", 10)],
                    "prefix_hits": {"c": [0, 1]}, "scheduled": [["x", 24], ["c", 2]],
                    "new_blocks": {"x": [2, 3, 4, 5, 6, 7]}})
    [kv] = [v for v in report.violations if v.invariant == "kv-budget"]
    assert (kv.step, kv.lhs, kv.rhs) == (2, 9, 8)


def test_only_hits_with_evictable_blocks_are_accounting_suspects() -> None:
    # b's hit takes a's live blocks (E = 0): a's finish alone can explain a leak.
    leak = check(A_RUNS, {"step": 1, "arrivals": [arrive("b", 10)],
                          "prefix_hits": {"b": [0, 1]}, "scheduled": [["a", 1], ["b", 2]],
                          "finished": ["a"], "new_blocks": {"b": [3]}, "free_blocks": 4})
    assert [(v.invariant, v.request) for v in leak.violations] == [("finish", "a")]
    # A refused hit takes nothing either.
    refused = check(A_RUNS, {"step": 1, "prefix_hits": {"a": [0, 1]}, "scheduled": [["a", 1]],
                             "finished": ["a"], "new_blocks": {}, "free_blocks": 7})
    assert [(v.invariant, v.request) for v in refused.violations] == [
        ("token-range", "a"), ("finish", "a")]
    # Nor does a hit of a request that is not scheduled: nothing explains the 6 free.
    unscheduled = check(A_RUNS, A_ENDS,
                        {"step": 2, "arrivals": [arrive("c", 10), arrive("d", 4)],
                         "prefix_hits": {"c": [0, 1]}, "scheduled": [["d", 4]],
                         "new_blocks": {"d": [3]}, "free_blocks": 6})
    assert unscheduled.violations[1] == Violation(
        "accounting", 2, "the engine reports 6 free GPU blocks; the trace implies 7",
        lhs=6, relation="==", rhs=7)
    # A hit of one evictable block is the one suspect of one block more free.
    one = check(A_RUNS, A_ENDS, {**C_HITS, "prefix_hits": {"c": [0]}, "scheduled": [["c", 6]],
                                 "new_blocks": {"c": [3, 4]}, "free_blocks": 6})
    assert one.violations == [Violation(
        "accounting", 2, "c took 1 evictable cached blocks by prefix hit, but the engine "
        "reports 1 more free", request="c", lhs=6, relation="==", rhs=5)]


def test_blocks_are_checked_only_while_every_step_gave_block_ids() -> None:
    # a's blocks were handed out without ids: nothing is known cached, nothing checked.
    untracked = [{k: v for k, v in s.items() if k != "new_blocks"} for s in (A_RUNS, A_ENDS)]
    assert check(*untracked, C_HITS).counts == {}


def test_a_table_with_a_block_outside_the_cache_caches_nothing() -> None:
    # a's block 8 is outside 0..7: its table's ids are not all known, so 0 and 1 are
    # not cached and c's hit on them is wrong.
    report = check({**A_RUNS, "new_blocks": {"a": [0, 1, 8]}}, A_ENDS, C_HITS)
    assert [(v.step, v.lhs, v.rhs) for v in report.violations] == [
        (0, 8, 8), (2, None, 0), (2, None, 1)]


def swapped_then_hit(scheduled: bool) -> Report:
    """a (9 tokens, blocks 0..2) is swapped out for x, swapped back in to blocks 5, 6, 7
    (scheduled for a decode, or not), and c then hits a's full blocks 5 and 6."""
    return check({**A_RUNS, "arrivals": [arrive("a", 9, 4)]},
                 {"step": 1, "arrivals": [arrive("x", 24, 1)],
                  "preempted": [{"id": "a", "mode": "swap"}], "scheduled": [["x", 24]],
                  "finished": ["x"], "new_blocks": {"x": [3, 4, 5, 6, 7, 0]}},
                 {"step": 2, "swapped_in": ["a"], "scheduled": [["a", 1]] if scheduled else [],
                  "new_blocks": {"a": [5, 6, 7]}},
                 {"step": 3, "arrivals": [arrive("c", 10)], "prefix_hits": {"c": [5, 6]},
                  "scheduled": [["c", 2]], "new_blocks": {"c": [1]}},
                 num_cpu_blocks=8, preemption="swap")


@pytest.mark.parametrize("scheduled", [True, False])
def test_a_swapped_in_request_s_restored_blocks_are_cached_again(scheduled: bool) -> None:
    report = swapped_then_hit(scheduled)
    assert not [v for v in report.violations if v.level == "MUST"], report.violations


def test_two_cached_blocks_handed_out_in_one_step_are_two_evictions() -> None:
    data = trace(A_RUNS, A_ENDS,
                 {"step": 2, "arrivals": [arrive("x", 24, 1)], "scheduled": [["x", 24]],
                  "finished": ["x"], "new_blocks": {"x": [0, 1, 3, 4, 5, 6]}})
    cache = metrics_of_trace(TraceReader(io.BytesIO(data))).prefix_cache
    assert cache is not None and cache.evictions == 2


def test_content_keys_go_through_the_trace_writer_and_reader() -> None:
    buf = io.BytesIO()
    writer = TraceWriter(buf)
    writer.header(Config(prefix_caching=True))
    [rec] = TraceReader(io.BytesIO(trace({**A_RUNS, "block_keys": {"a": ["s/0", "a/1"]}})))
    writer.step(rec)
    [back] = TraceReader(io.BytesIO(buf.getvalue()))
    assert back.block_keys == {"a": ("s/0", "a/1")}


@pytest.mark.parametrize(("keys", "message"), [
    (["s/0"], 'line 2: "block_keys" must be an object {id: [content keys]}'),
    ({"a": "s/0"}, "line 2: block_keys of a must be a list of strings")])
def test_malformed_content_keys_are_told_with_their_line(keys: Any, message: str) -> None:
    with pytest.raises(TraceError) as e:
        list(TraceReader(io.BytesIO(trace({**A_RUNS, "block_keys": keys}))))
    assert str(e.value) == message and e.value.line == 2


def test_a_hit_without_keys_replays_with_the_content_the_filler_gave() -> None:
    # The trace gives a's keys, not c's: the replay gives c the contents a's blocks
    # were cached with, so the profile hits them too.
    keyed = {**A_RUNS, "block_keys": {"a": ["s/0", "s/1"]}}
    assert under_profile(trace(keyed, A_ENDS, C_HITS)).counts == {}


def test_prefix_helpers() -> None:
    assert keys("r", (("s", 4),), 2, 4) == ["s/0", "r/1"]
    assert nested((("s", 8), ("t", 12)), "t", 12) == (("s", 8), ("t", 12))
    book = KeyBook(4)
    book.add("r", ["k/0"])
    book.forget("r")
    assert len(book) == 0 and book.key("r", (), 0) == "r/0"
    assert ConfigDefaults(prefix_caching=True).describe() == "prefix_caching=on"
    assert ConfigDefaults(prefix_caching=False).describe() == "prefix_caching=off"


@pytest.mark.parametrize("scheduled", [True, False])
def test_with_one_token_blocks_a_swap_in_caches_from_its_first_block(scheduled: bool) -> None:
    # block_size 1: a's 3 prompt tokens fill blocks 0..2; swapped back in to 5, 6, 7
    # (and 1 for its decode), all three are cached again at indices 0..2.
    report = check({"step": 0, "arrivals": [arrive("a", 3, 4)], "scheduled": [["a", 3]],
                    "new_blocks": {"a": [0, 1, 2]}},
                   {"step": 1, "arrivals": [arrive("x", 6, 1)],
                    "preempted": [{"id": "a", "mode": "swap"}], "scheduled": [["x", 6]],
                    "finished": ["x"], "new_blocks": {"x": [3, 4, 5, 6, 7, 0]}},
                   {"step": 2, "swapped_in": ["a"],
                    "scheduled": [["a", 1]] if scheduled else [],
                    "new_blocks": {"a": [5, 6, 7, 1] if scheduled else [5, 6, 7]}},
                   {"step": 3, "arrivals": [arrive("c", 4)], "prefix_hits": {"c": [5, 6, 7]},
                    "scheduled": [["c", 1]], "new_blocks": {"c": [2]}},
                   block_size=1, num_cpu_blocks=8, preemption="swap")
    assert not [v for v in report.violations if v.level == "MUST"], report.violations


def test_a_keyless_hit_on_a_block_handed_out_since_is_not_taken_as_the_old_content() -> None:
    # d was handed block 0 (dropping the content a left there); the engine then claims c
    # hit it. Without keys the replay gives c no content for a block the trace says no
    # longer holds any, so the profile (which kept a's blocks cached) finds no hit and
    # diverges, beside the block-ids violation.
    report = under_profile(trace(
        A_RUNS, A_ENDS,
        {"step": 2, "arrivals": [arrive("d", 2, 8)], "scheduled": [["d", 2]],
         "new_blocks": {"d": [0]}},
        {"step": 3, "arrivals": [arrive("c", 10)], "prefix_hits": {"c": [0, 1]},
         "scheduled": [["d", 1], ["c", 2]], "new_blocks": {"c": [3]}}))
    assert "block-ids" in report.counts
    [v] = [v for v in report.violations if v.invariant == "profile"]
    assert v.step == 3 and "the trace scheduled d:1, c:2 (hit 2 blocks)" in v.message
