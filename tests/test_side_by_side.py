"""vLLM's, SGLang's and LMDeploy's real schedulers on the same workloads (tests/data/side-by-side/,
recorded by `python -m tools.engines_side_by_side record`): every kept trace is complete,
MUST-clean and exact under its engine's profile, and docs/conformance/side-by-side.md
is what tools.engines_side_by_side makes of them."""

from __future__ import annotations

import io
import json

import pytest

from conformance.common import check_stream
from kvsched.spec.trace import TraceReader
from tools.engines_side_by_side import (
    ENGINES,
    OUT,
    WORKLOADS,
    config_of,
    kept,
    metrics,
    render,
    work,
    work_of,
)


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("workload", [w.name for w in WORKLOADS])
def test_each_kept_trace_is_its_engines_and_exact(workload: str, engine: str) -> None:
    v = check_stream(workload, io.BytesIO(kept(workload, engine)), ENGINES[engine][1])
    assert v.ok, (dict(v.must), v.complete, v.divergence)
    assert v.prefix_caching


def test_the_engines_ran_on_one_cache() -> None:
    a, b, c = config_of("vllm"), config_of("sglang"), config_of("lmdeploy")
    assert (a.step_mix, b.step_mix, c.step_mix) == ("any", "prefill_or_decode",
                                                    "prefill_or_decode")
    assert (a.pipelined, b.pipelined, c.pipelined) == (False, False, True)
    fields = ("block_size", "num_gpu_blocks", "max_num_batched_tokens", "max_num_seqs",
              "max_model_len", "chunked_prefill", "prefix_caching")
    assert all(getattr(a, f) == getattr(b, f) == getattr(c, f) for f in fields)
    for engine in ENGINES:  # what each engine really built is what the page says
        for w in WORKLOADS:
            built = TraceReader(io.BytesIO(kept(w.name, engine))).header.config
            assert all(getattr(built, f) == getattr(a, f) for f in fields), (engine, w.name)


def test_the_page_is_what_the_kept_traces_make() -> None:
    assert OUT.read_text() == render(), (
        "docs/conformance/side-by-side.md is stale: python -m tools.engines_side_by_side")
    assert render().count("What the numbers show") == 1


def test_work_counts_tokens_computed_and_tells_a_hit_on_own_blocks_from_a_shared_one(
) -> None:
    """r0 prefills 8 tokens, is preempted, comes back and hits its own 2 blocks; r1 hits
    r0's first block. Steps 0 and 3 computed more than they sampled (prefills); r0's first
    token came after 8 tokens computed, r1's after the 5 of its step."""
    config = {"block_size": 4, "num_gpu_blocks": 8, "num_cpu_blocks": 0,
              "max_num_batched_tokens": 16, "max_num_seqs": 4, "max_model_len": 32,
              "chunked_prefill": True, "long_prefill_token_threshold": 0, "policy": "fcfs",
              "preemption": "recompute", "watermark_blocks": 0, "prefix_caching": True}
    lines = [
        {"kvsched": "trace", "version": 1, "engine": {"name": "t", "version": "0"},
         "config": config},
        {"step": 0, "arrivals": [{"id": "r0", "prompt_len": 8, "max_tokens": 4}],
         "scheduled": [["r0", 8]], "new_blocks": {"r0": [0, 1]}},
        {"step": 1, "preempted": [{"id": "r0", "mode": "recompute"}]},
        {"step": 2, "scheduled": [["r0", 1]], "prefix_hits": {"r0": [0, 1]},
         "new_blocks": {"r0": [2]}},
        {"step": 3, "arrivals": [{"id": "r1", "prompt_len": 8, "max_tokens": 4}],
         "scheduled": [["r0", 1], ["r1", 4]], "prefix_hits": {"r1": [0]},
         "new_blocks": {"r1": [3]}},
    ]
    w = work_of("".join(json.dumps(line) + "\n" for line in lines).encode())
    assert (w.own_hit_tokens, w.other_hit_tokens, w.queried_tokens) == (8, 4, 25)
    assert (w.prefill_steps, w.computed_per_step, w.ttft_work) == (2, 3.5, 6.5)


def test_the_page_says_steps_differ_in_cost_and_measures_work_beside_them() -> None:
    page = OUT.read_text()
    assert "Steps are not units of equal cost" in page
    for w in WORKLOADS:
        section = page.split(f"## {w.name}\n", 1)[1].split("\n## ", 1)[0]
        for row in ("| tokens computed per step |", "| TTFT mean (tokens computed meanwhile) |",
                    "| steps that computed a prefill (SGLang, LMDeploy: prefill steps) |",
                    "| void slots (pipelined: finished the step before) |"):
            assert row in section, (w.name, row)
    # a step-count comparison never stands without the tokens each step computed
    claim = next(line for line in page.splitlines() if "fewer steps" in line)
    assert "tokens computed per step" in claim


def test_every_hit_is_on_own_blocks_or_another_requests_and_the_page_says_which() -> None:
    """The workloads without shared prefixes (chat, burst) give vLLM hits only on its
    own preempted requests' blocks, and LMDeploy on the blocks its reclaimed victims
    left in its trie; SGLang, which retracts, never hits its own."""
    page = OUT.read_text()
    for w in WORKLOADS:
        for engine in ENGINES:
            d, m = work(w.name, engine), metrics(w.name, engine)
            assert m.prefix_cache is not None
            assert d.own_hit_tokens + d.other_hit_tokens == m.prefix_cache.hit_tokens
            if w.kind == "sharegpt":
                assert d.other_hit_tokens == 0
                assert (d.own_hit_tokens > 0) == (engine != "sglang")
    assert "whose requests share no prefix, vLLM's hit rate" in page
    assert page.count("| ... of it on its own blocks, back after preemption |") == len(WORKLOADS)


def test_only_the_pipelined_engine_has_void_slots_and_lazy_resumes() -> None:
    """LMDeploy decodes a request once more after its finish (a void slot) and resumes a
    lazy victim on the blocks it kept; vLLM and SGLang do neither."""
    for w in WORKLOADS:
        for engine in ENGINES:
            d = work(w.name, engine)
            assert (d.void_entries > 0) == (engine == "lmdeploy"), (w.name, engine)
            assert d.lazy_resumed <= sum(metrics(w.name, engine).preemptions.values())
            if engine != "lmdeploy":
                assert d.lazy_resumed == 0
    assert any(work(w.name, "lmdeploy").lazy_resumed for w in WORKLOADS)
