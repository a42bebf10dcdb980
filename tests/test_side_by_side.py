"""vLLM's and SGLang's real schedulers on the same workloads (tests/data/side-by-side/,
recorded by `python -m tools.engines_side_by_side record`): every kept trace is complete,
MUST-clean and exact under its engine's profile, and docs/conformance/vllm-vs-sglang.md
is what tools.engines_side_by_side makes of them."""

from __future__ import annotations

import io

import pytest

from conformance.vllm import check_stream
from tools.engines_side_by_side import ENGINES, OUT, WORKLOADS, config_of, kept, render


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("workload", [w.name for w in WORKLOADS])
def test_each_kept_trace_is_its_engines_and_exact(workload: str, engine: str) -> None:
    v = check_stream(workload, io.BytesIO(kept(workload, engine)), ENGINES[engine][1])
    assert v.ok, (dict(v.must), v.complete, v.divergence)
    assert v.prefix_caching


def test_both_engines_ran_on_one_cache() -> None:
    a, b = config_of("vllm"), config_of("sglang")
    assert (a.step_mix, b.step_mix) == ("any", "prefill_or_decode")
    fields = ("block_size", "num_gpu_blocks", "max_num_batched_tokens", "max_num_seqs",
              "max_model_len", "chunked_prefill", "prefix_caching")
    assert all(getattr(a, f) == getattr(b, f) for f in fields)


def test_the_page_is_what_the_kept_traces_make() -> None:
    assert OUT.read_text() == render(), (
        "docs/conformance/vllm-vs-sglang.md is stale: python -m tools.engines_side_by_side")
    assert render().count("What the numbers show") == 1
