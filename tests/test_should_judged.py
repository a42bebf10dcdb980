"""Where each SHOULD is judged (docs/spec.md section 7, each id's "Where it is judged";
kvsched.spec.should.unjudged): `kvsched check --strict --profile P` passes on every
kept trace that P replays exactly (SGLang's, V0's, a sample of every vLLM v1 release's),
so a real engine doing what its profile says fails no strict check; and a violation of
each SHOULD is still found where it is meaningful (the engine-neutral ones under every
profile, the policy-bound ones where no profile's policy causes them)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import orjson
import pytest
from test_starvation import PASSED_OVER, arrival  # PASSED_OVER: r1 passed over

from conformance.sglang import PROFILE as SGLANG
from conformance.sglang import stored as sglang_stored
from conformance.vllm_releases import NO_EPOCH, checked, epoch_firsts
from conformance.vllm_releases import stored as releases_stored
from conformance.vllm_v0 import EDGES, KINDS
from kvsched.conformance import check_reader
from kvsched.optimized.checker import check_trace_vectorized
from kvsched.spec.checker import Checker, CheckOptions, Report
from kvsched.spec.profiles import get_profile
from kvsched.spec.trace import TraceReader

DATA = Path(__file__).resolve().parent / "data"
# one release of each epoch, and the last before 0.19 (the most no-thrash of all)
RELEASES = sorted({*epoch_firsts(), "0.18.1"} - set(NO_EPOCH))


def strict(data: bytes, profile: str) -> Report:
    """`kvsched check --strict --profile PROFILE` on a trace's bytes (the spec's checker)."""
    return check_reader(TraceReader(io.BytesIO(data)), profile=profile, strict=True)


def test_strict_check_passes_every_kept_sglang_trace() -> None:
    kept = dict(sglang_stored())
    assert len(kept) >= 213
    failed = {name: dict(r.counts) for name, data in kept.items()
              if (r := strict(data, SGLANG)).failed}
    assert not failed


def test_strict_check_passes_every_kept_v0_trace_it_replays_exactly() -> None:
    for case in (*KINDS, *EDGES):
        report = strict((DATA / "vllm-v0" / f"{case.name}.jsonl").read_bytes(), "vllm-v0")
        assert not report.failed, (case.name, dict(report.counts))


def test_strict_check_passes_a_sample_of_every_vllm_v1_epochs_kept_traces() -> None:
    """The sample's verdicts are the vectorized checker's under each release's epoch
    profile: strict passes when nothing at all is counted (no MUST, PROFILE or SHOULD)."""
    seen = 0
    for trace, v in checked(releases_stored(releases=RELEASES)):
        seen += 1
        assert v.ok and not +v.should, (trace.release, trace.case, dict(v.should))
    assert seen >= 500


# -- seeded violations: found where meaningful --------------------------------------------

V1: dict[str, Any] = {"block_size": 4, "num_gpu_blocks": 8, "num_cpu_blocks": 0,
      "max_num_batched_tokens": 16, "max_num_seqs": 2, "max_model_len": 32,
      "chunked_prefill": True, "long_prefill_token_threshold": 0, "policy": "fcfs",
      "preemption": "recompute", "watermark_blocks": 0}
SGLANG_STEPS: dict[str, Any] = {"step_mix": "prefill_or_decode", "first_block_id": 1}


def trace(steps: list[dict[str, Any]], end: bool = False, **config: Any) -> bytes:
    header = {"kvsched": "trace", "version": 1, "engine": {"name": "hand"},
              "config": V1 | config}
    lines = [header, *({"step": i} | s for i, s in enumerate(steps))]
    return b"".join(orjson.dumps(x) + b"\n" for x in [*lines, *([{"end": True}] if end
                                                                  else [])])


def judged(data: bytes, profile: str | None, **options: Any) -> Report:
    """The SHOULD counts of `data` judged as under `profile` (its policy only: no replay,
    so a hand-made trace need not be the profile's own decisions); the vectorized checker
    agrees without a profile."""
    reader = TraceReader(io.BytesIO(data))
    under = get_profile(profile) if profile is not None else None
    report = Checker(reader.header.config, CheckOptions(**options), None,
                     reader.header.preempted_order, under).run_trace(reader)
    if profile is None:
        fast = check_trace_vectorized(io.BytesIO(data), **options)
        assert (fast.counts, fast.unchecked) == (report.counts, report.unchecked)
    return report


# r1 is preempted at step 1 while r0's decode needs 1 block with 4 free (needless)
NEEDLESS: list[dict[str, Any]] = [
    {"arrivals": [arrival("r0", 8), arrival("r1", 8)], "scheduled": [["r0", 8], ["r1", 8]]},
    {"preempted": [{"id": "r1", "mode": "recompute"}], "scheduled": [["r0", 1]]},
]
# r1 is preempted, resumed and preempted again (no-thrash at K = 1)
THRASH: list[dict[str, Any]] = [
    {"arrivals": [arrival("r0", 8), arrival("r1", 8)], "scheduled": [["r0", 8], ["r1", 8]]},
    {"preempted": [{"id": "r1", "mode": "recompute"}], "scheduled": [["r0", 1]]},
    {"scheduled": [["r0", 1], ["r1", 4]]},
    {"preempted": [{"id": "r1", "mode": "recompute"}], "scheduled": [["r0", 1]]},
]
IDLE: list[dict[str, Any]] = [{"arrivals": [arrival("r0", 4)]}, {}, {}]


@pytest.mark.parametrize("profile", [None, "vllm-v1", "vllm-v1@0.12", "vllm-v0", SGLANG])
def test_the_engine_neutral_shoulds_are_judged_under_every_profile(profile: str | None
                                                                   ) -> None:
    for config in ({}, SGLANG_STEPS):
        report = judged(trace(IDLE, end=True, **config), profile, stall_steps=2)
        assert {"no-idle", "completion", "progress"} <= set(report.counts), (profile,
                                                                           config)


def test_no_thrash_is_judged_but_under_a_profile_that_admits_on_a_first_chunk() -> None:
    data = trace(THRASH, num_gpu_blocks=4)
    for profile in (None, "vllm-v1", "vllm-v1@0.19", "vllm-v0"):
        assert judged(data, profile, max_preemptions=1).counts["no-thrash"] == 1, profile
    old = judged(data, "vllm-v1@0.12", max_preemptions=1)
    assert "no-thrash" not in old.counts and "0.19" in old.unchecked["no-thrash"]
    assert judged(trace(THRASH, num_gpu_blocks=4, **SGLANG_STEPS), SGLANG,
                  max_preemptions=1).counts["no-thrash"] == 1


def test_needed_preemption_is_judged_but_where_the_step_may_free_a_seat_or_under_v0() -> None:
    for profile in (None, "vllm-v1", "vllm-v1@0.12"):
        assert judged(trace(NEEDLESS), profile).counts["needed-preemption"] == 1, profile
    v0 = judged(trace(NEEDLESS), "vllm-v0")
    assert "needed-preemption" not in v0.counts
    assert "can_append_slots" in v0.unchecked["needed-preemption"]
    # SGLang's steps: a needless retraction is told, under fcfs and under priority
    # while the running requests and the victim leave a seat free; under priority at
    # the running-request limit the victim may have given up its seat
    for policy in ("fcfs", "priority"):
        roomy = trace(NEEDLESS, max_num_seqs=3, policy=policy, **SGLANG_STEPS)
        assert judged(roomy, SGLANG).counts["needed-preemption"] == 1, policy
        assert judged(roomy, None).counts["needed-preemption"] == 1, policy
    full = trace(NEEDLESS, policy="priority", **SGLANG_STEPS)
    assert judged(full, SGLANG).counts["needed-preemption"] == 0
    assert "frees a seat" in judged(full, None).unchecked["needed-preemption"]
    assert judged(trace(NEEDLESS, **SGLANG_STEPS), SGLANG).counts["needed-preemption"] == 1


def test_starvation_is_judged_but_on_sglang_steps_and_where_a_profile_skips_by_design(
        ) -> None:
    data = trace(PASSED_OVER)
    for profile in (None, "vllm-v1", "vllm-v0"):
        assert judged(data, profile, starve_steps=2).counts["starvation"] == 1, profile
    unchunked = trace(PASSED_OVER, chunked_prefill=False)
    assert judged(unchunked, "vllm-v1@0.12", starve_steps=2).counts["starvation"] == 1
    skip = judged(unchunked, "vllm-v1@0.11.1", starve_steps=2)
    assert "starvation" not in skip.counts and "0.11" in skip.unchecked["starvation"]
    # with chunked prefill vLLM 0.11 passes no one over by design: judged
    assert judged(data, "vllm-v1@0.11.1", starve_steps=2).counts["starvation"] == 1
    v0 = judged(trace(PASSED_OVER, policy="priority"), "vllm-v0", starve_steps=2)
    assert "starvation" not in v0.counts and "V0" in v0.unchecked["starvation"]
    sglang = judged(trace(PASSED_OVER, **SGLANG_STEPS), None, starve_steps=2)
    assert "starvation" not in sglang.counts and "SGLang" in sglang.unchecked["starvation"]
