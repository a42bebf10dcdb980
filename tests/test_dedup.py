"""Deduplication in trace v1 (step field `dedup`): a running request's table comes to
start with cached blocks of the content it computed itself, and the blocks they replace
are released (SGLang's radix cache keeps one copy of each content). The spec's state
moves it and MUST judges it; the vectorized checker gives the spec's verdicts."""

from __future__ import annotations

import io
import json
from collections import Counter
from typing import Any

import pytest

from kvsched.conformance import checker
from kvsched.optimized.checker import check_trace_vectorized
from kvsched.spec.model import Config
from kvsched.spec.trace import TraceReader, header_dict

CONFIG = Config(block_size=1, num_gpu_blocks=10, max_num_batched_tokens=8, max_num_seqs=4,
                max_model_len=16, first_block_id=1, prefix_caching=True)
KEYS = ["s/0", "s/1", "s/2", "s/3"]


def trace(dedup: dict[str, list[int]], free: int, config: Config = CONFIG) -> bytes:
    """A and B compute the same four-token prompt side by side; then B's copy gives way
    to A's cached blocks."""
    lines: list[dict[str, Any]] = [
        header_dict(config),
        {"step": 0, "arrivals": [{"id": "A", "prompt_len": 4, "max_tokens": 4},
                                 {"id": "B", "prompt_len": 4, "max_tokens": 4}],
         "block_keys": {"A": KEYS, "B": KEYS},
         "scheduled": [["A", 4], ["B", 4]], "new_blocks": {"A": [1, 2, 3, 4],
                                                          "B": [5, 6, 7, 8]},
         "dedup": dedup, "free_blocks": free},
        {"step": 1, "scheduled": [["A", 1], ["B", 1]], "new_blocks": {"A": [5], "B": [6]},
         "finished": ["A", "B"], "free_blocks": 10},
    ]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def verdicts(data: bytes) -> tuple[Counter[str], Counter[str]]:
    spec = checker(TraceReader(io.BytesIO(data)).header.config).run_trace(
        TraceReader(io.BytesIO(data)))
    fast = check_trace_vectorized(io.BytesIO(data))
    return Counter(spec.counts), Counter(fast.counts)


def test_a_deduplication_releases_the_copies_and_shares_the_cached_blocks() -> None:
    data = trace({"B": [1, 2, 3, 4]}, free=6)
    spec, fast = verdicts(data)
    assert spec == fast == Counter()
    # B's old blocks 5 and 6 are free again: step 1 hands them out
    state = checker(CONFIG).state
    for rec in TraceReader(io.BytesIO(data)):
        state.apply(rec)
        if rec.step == 0:
            assert state.live["B"].block_ids == [1, 2, 3, 4]
            assert state.holders[1] == ["A", "B"] and 5 not in state.holders


@pytest.mark.parametrize(("dedup", "free", "broken"), [
    ({"B": [2, 1, 3, 4]}, 6, "block-ids"),  # block 2 is cached at index 1, not 0
    ({"B": [1, 2, 3, 4, 9]}, 6, "token-range"),  # B has 4 computed blocks, not 5
    ({"B": [1, 2, 3, 4]}, 2, "accounting"),  # the copies were released
    ({"C": [1]}, 2, "one-state"),  # no such request
])
def test_a_wrong_deduplication_is_a_violation(dedup: dict[str, list[int]], free: int,
                                              broken: str) -> None:
    spec, fast = verdicts(trace(dedup, free))
    assert spec == fast
    assert spec[broken] >= 1


def test_without_prefix_caching_there_is_nothing_to_deduplicate() -> None:
    off = Config(**{**CONFIG.__dict__, "prefix_caching": False})
    spec, fast = verdicts(trace({"B": [1, 2, 3, 4]}, free=6, config=off))
    assert spec == fast and spec["token-range"] == 1


def allocating_trace(dedup: dict[str, list[int]], free: int) -> bytes:
    """A and B compute the same four-token prompt side by side; in the next step B's
    copy gives way to A's cached blocks as it is allocated (LMDeploy's block trie frees
    the copy at once), and A's new block is B's first copy."""
    lines: list[dict[str, Any]] = [
        header_dict(CONFIG),
        {"step": 0, "arrivals": [{"id": "A", "prompt_len": 4, "max_tokens": 4},
                                 {"id": "B", "prompt_len": 4, "max_tokens": 4}],
         "block_keys": {"A": KEYS, "B": KEYS},
         "scheduled": [["A", 4], ["B", 4]], "new_blocks": {"A": [1, 2, 3, 4],
                                                          "B": [5, 6, 7, 8]},
         "free_blocks": 2},
        {"step": 1, "scheduled": [["A", 1], ["B", 1]], "new_blocks": {"A": [5], "B": [9]},
         "dedup": dedup, "free_blocks": free},
    ]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def test_a_copy_the_steps_deduplication_replaces_may_be_handed_out_in_that_step() -> None:
    spec, fast = verdicts(allocating_trace({"B": [1, 2, 3, 4]}, free=4))
    assert spec == fast == Counter()
    state = checker(CONFIG).state
    for rec in TraceReader(io.BytesIO(allocating_trace({"B": [1, 2, 3, 4]}, free=4))):
        state.apply(rec)
    assert state.holders[5] == ["A"] and state.live["B"].block_ids == [1, 2, 3, 4, 9]
    assert state.free == 4


def test_a_block_no_deduplication_of_the_step_replaces_is_still_held() -> None:
    # B's copies stay B's (no dedup, or one that keeps block 5): A may not take 5
    for dedup in ({}, {"B": [5, 2, 3, 4]}):
        spec, fast = verdicts(allocating_trace(dedup, free=4))
        assert spec == fast and spec["block-ids"] >= 1
