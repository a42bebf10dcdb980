"""Config `allocation` (lazy, prompt, full) and `watermark_scope` (running, always): the
checker on hand-written traces of each, the schedulers in each, the rejection rule
they change, and the trace header and command line that carry them."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvsched.conformance import check_records
from kvsched.generators import generate
from kvsched.reference import ReferenceScheduler
from kvsched.simulate import run
from kvsched.spec.blocks import allocation_reserve, blocks_needed, never_completes, rejectable
from kvsched.spec.checker import Report, check_trace
from kvsched.spec.model import (
    ALLOCATIONS,
    WATERMARK_SCOPES,
    Allocation,
    Config,
    Request,
    StepRecord,
    WatermarkScope,
)
from kvsched.spec.trace import TraceError, TraceReader, TraceWriter, header_dict
from kvsched.testing.implementations import SchedulerFactory

# 8 blocks of 4 tokens, a 16-token step budget, chunked prefill: the base of every trace.
BASE: dict[str, Any] = {"block_size": 4, "num_gpu_blocks": 8, "num_cpu_blocks": 8,
                        "max_num_batched_tokens": 16, "max_num_seqs": 4,
                        "max_model_len": 32, "chunked_prefill": True,
                        "long_prefill_token_threshold": 0, "policy": "fcfs",
                        "preemption": "swap", "watermark_blocks": 0}


def trace_bytes(*steps: dict[str, Any], end: bool = True, **config: object) -> bytes:
    lines = [{"kvsched": "trace", "version": 1, "config": {**BASE, **config}}, *steps]
    if end:
        lines.append({"end": True})
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def check(*steps: dict[str, Any], end: bool = True, **config: object) -> Report:
    return check_trace(TraceReader(io.BytesIO(trace_bytes(*steps, end=end, **config))))


def arrive(rid: str, prompt: int, max_tokens: int) -> dict[str, Any]:
    return {"id": rid, "prompt_len": prompt, "max_tokens": max_tokens}


def must(report: Report) -> dict[str, int]:
    return {k: n for k, n in report.counts.items() if k not in
            ("no-idle", "completion", "no-thrash", "needed-preemption")}


# -- the rule ---------------------------------------------------------------------------

def test_the_reserve_is_nothing_the_known_tokens_or_the_longest_sequence() -> None:
    r = Request("r", prompt_len=10, max_tokens=30)
    config = Config(block_size=4, max_model_len=32)
    assert [allocation_reserve(replace(config, allocation=a), r, 12)
            for a in ALLOCATIONS] == [0, 12, 32]  # full: min(10 + 30, 32)
    # An admission of a 4-token chunk of a 12-token prompt: 1 block, 3, or 8.
    assert [blocks_needed(0, 4, 0, 4, reserve) for reserve in (0, 12, 32)] == [1, 3, 8]
    # A later chunk reserves nothing: the blocks held already cover it.
    assert blocks_needed(4, 4, 3, 4) == 0


# -- prompt: blocks for every known token at admission and swap-in ------------------------

# A 16-token prompt admitted with an 8-token chunk and all 4 of its blocks, then its
# second chunk with none; its first output (17th token) takes a fifth block.
PROMPT_ADMISSION = (
    {"step": 0, "arrivals": [arrive("a", 16, 2)], "scheduled": [["a", 8]],
     "new_blocks": {"a": [0, 1, 2, 3]}, "free_blocks": 4},
    {"step": 1, "scheduled": [["a", 8]], "new_blocks": {}, "free_blocks": 4},
    {"step": 2, "scheduled": [["a", 1]], "finished": ["a"], "new_blocks": {"a": [4]},
     "free_blocks": 8},
)


def test_a_prompt_engines_chunked_admission_is_clean_under_prompt() -> None:
    report = check(*PROMPT_ADMISSION, allocation="prompt")
    assert report.counts == {} and report.unchecked == {}


def test_a_prompt_engines_trace_read_as_lazy_breaks_block_ids_and_accounting() -> None:
    report = check(*PROMPT_ADMISSION, allocation="lazy")
    assert must(report) == {"block-ids": 2, "accounting": 1}
    first = next(v for v in report.violations if v.invariant == "block-ids")
    assert (first.step, first.request, first.lhs, first.rhs) == (0, "a", 4, 2)
    # Left out, the field means lazy: the same verdict.
    without = trace_bytes(*PROMPT_ADMISSION).replace(b', "allocation": "lazy"', b"")
    assert must(check_trace(TraceReader(io.BytesIO(without)))) == must(report)


def test_a_lazy_engine_read_as_prompt_is_short_of_the_prompts_blocks() -> None:
    report = check(
        {"step": 0, "arrivals": [arrive("a", 16, 2)], "scheduled": [["a", 8]],
         "new_blocks": {"a": [0, 1]}, "free_blocks": 6},
        {"step": 1, "scheduled": [["a", 8]], "new_blocks": {"a": [2, 3]}, "free_blocks": 4},
        allocation="prompt", end=False)
    assert must(report) == {"block-ids": 2, "accounting": 1}
    first = next(v for v in report.violations if v.invariant == "block-ids")
    assert (first.step, first.lhs, first.rhs) == (0, 2, 4)
    assert "a gets 2 new block ids where it needs 4" in first.message


def test_a_recompute_victim_is_admitted_again_with_every_known_token() -> None:
    # a (8 tokens) and b (6) fill the 4 blocks; a's decode preempts b and a finishes; b
    # comes back with N = 7 known tokens (its prompt and one output): 2 blocks at once,
    # though its first chunk of 4 tokens fills 1.
    steps = [
        {"step": 0, "arrivals": [arrive("a", 8, 2), arrive("b", 6, 4)],
         "scheduled": [["a", 8], ["b", 6]], "new_blocks": {"a": [0, 1], "b": [2, 3]}},
        {"step": 1, "preempted": [{"id": "b", "mode": "recompute"}],
         "scheduled": [["a", 1]], "finished": ["a"], "new_blocks": {"a": [3]}},
    ]
    ok = check(*steps, {"step": 2, "scheduled": [["b", 4]], "new_blocks": {"b": [2, 0]}},
               allocation="prompt", num_gpu_blocks=4, end=False)
    assert must(ok) == {}
    # Given only its first chunk's block, it restarted short of its known tokens.
    short = check(*steps, {"step": 2, "scheduled": [["b", 4]], "new_blocks": {"b": [2]}},
                  allocation="prompt", num_gpu_blocks=4, end=False)
    assert must(short) == {"preempt": 1}
    [v] = [v for v in short.violations if v.invariant == "preempt"]
    assert v.request == "b" and (v.lhs, v.rhs) == (1, 2)


# Two 8-token prompts fill 4 blocks of 4; a's second token needs a third block, so b
# (N = 9, C = 8) is swapped out with its 2 blocks, and a finishes; at step 2 b is
# swapped back in without being scheduled.
SWAP_BACK = (
    {"step": 0, "arrivals": [arrive("a", 8, 2), arrive("b", 8, 4)],
     "scheduled": [["a", 8], ["b", 8]], "new_blocks": {"a": [0, 1], "b": [2, 3]},
     "free_blocks": 0},
    {"step": 1, "preempted": [{"id": "b", "mode": "swap"}], "scheduled": [["a", 1]],
     "finished": ["a"], "new_blocks": {"a": [2]}, "free_blocks": 4},
)


def test_a_swap_in_under_prompt_takes_blocks_for_every_known_token() -> None:
    # b's 9 known tokens need 3 blocks: its 2 host blocks come back, and a third.
    prompt = check(*SWAP_BACK, {"step": 2, "swapped_in": ["b"], "new_blocks": {"b": [0, 1, 2]},
                                "free_blocks": 1},
                   allocation="prompt", num_gpu_blocks=4, end=False)
    assert must(prompt) == {}
    # Under lazy the swap-in takes back its host blocks only.
    lazy = check(*SWAP_BACK, {"step": 2, "swapped_in": ["b"], "new_blocks": {"b": [0, 1, 2]},
                              "free_blocks": 1},
                 allocation="lazy", num_gpu_blocks=4, end=False)
    assert set(must(lazy)) == {"block-ids", "accounting"}


def test_a_partial_prompt_swapped_under_prompt_comes_back_with_its_blocks_only() -> None:
    # a (16 tokens) admitted with 8 and all 4 blocks, swapped out for b, back with its 4
    # host blocks and no more: it already held blocks for every known token.
    report = check(
        {"step": 0, "arrivals": [arrive("a", 16, 1)], "scheduled": [["a", 8]],
         "new_blocks": {"a": [0, 1, 2, 3]}, "free_blocks": 0},
        {"step": 1, "arrivals": [arrive("b", 3, 1)], "preempted": [{"id": "a", "mode": "swap"}],
         "scheduled": [["b", 3]], "finished": ["b"], "new_blocks": {"b": [3]},
         "free_blocks": 4},
        {"step": 2, "swapped_in": ["a"], "scheduled": [["a", 8]], "finished": ["a"],
         "new_blocks": {"a": [3, 2, 1, 0]}, "free_blocks": 4},
        allocation="prompt", num_gpu_blocks=4)
    assert must(report) == {}


# -- full: blocks for the longest sequence at admission, then never again -----------------

def full_engine_trace(config: Config) -> tuple[list[StepRecord], bool]:
    """The reference in full allocation on a load that outgrows the cache."""
    workload = generate("uniform", 12, 3, max_model_len=config.max_model_len, rate=2.0)
    scheduler = ReferenceScheduler(config)
    records = list(run(scheduler, workload, max_steps=2_000))
    return records, not scheduler.has_unfinished()


FULL = Config(block_size=4, num_gpu_blocks=24, max_num_batched_tokens=32, max_num_seqs=8,
              max_model_len=64, allocation="full")


def test_a_full_allocation_engine_reserves_to_completion_and_never_preempts() -> None:
    records, complete = full_engine_trace(FULL)
    assert complete and not any(rec.preempted for rec in records)
    admitted: dict[str, int] = {}
    for rec in records:
        for rid in rec.new_blocks or {}:
            assert rid not in admitted, f"{rid} got blocks after its admission"
            admitted[rid] = rec.step
    arrived = {r.id: rec.step for rec in records for r in rec.arrivals}
    assert admitted.keys() == arrived.keys()
    assert any(admitted[rid] > arrived[rid] for rid in arrived)  # some had to wait
    report = check_records(FULL, records, complete, strict=True)
    assert report.counts == {} and report.unchecked == {}


def test_a_full_allocation_trace_with_a_lazy_header_is_flagged() -> None:
    records, _complete = full_engine_trace(FULL)
    buffer = io.BytesIO()
    writer = TraceWriter(buffer)
    writer.header(replace(FULL, allocation="lazy"))
    for rec in records:
        writer.step(rec)
    writer.end()
    report = check_trace(TraceReader(io.BytesIO(buffer.getvalue())))
    assert {"block-ids", "accounting"} <= set(must(report))
    first = next(v for v in report.violations if v.invariant == "block-ids")
    assert isinstance(first.lhs, int) and isinstance(first.rhs, int) and first.lhs > first.rhs


def test_a_full_engine_handing_out_a_block_after_admission_breaks_block_ids() -> None:
    # a: 12 + 4 tokens = 4 blocks at admission; a fifth later is one too many.
    report = check(
        {"step": 0, "arrivals": [arrive("a", 12, 4)], "scheduled": [["a", 12]],
         "new_blocks": {"a": [0, 1, 2, 3]}, "free_blocks": 4},
        {"step": 1, "scheduled": [["a", 1]], "new_blocks": {"a": [4]}, "free_blocks": 3},
        allocation="full", end=False)
    [v] = [v for v in report.violations if v.invariant == "block-ids"]
    assert (v.step, v.request, v.lhs, v.rhs) == (1, "a", 1, 0)


# -- both schedulers, each mode ---------------------------------------------------------

PRESSURE = Config(block_size=4, num_gpu_blocks=20, num_cpu_blocks=20,
                  max_num_batched_tokens=24, max_num_seqs=6, max_model_len=64,
                  preemption="swap", watermark_blocks=2)


@pytest.mark.parametrize("scope", WATERMARK_SCOPES)
@pytest.mark.parametrize("allocation", ALLOCATIONS)
def test_each_scheduler_in_each_mode_checks_clean_and_decides_alike(
        allocation: Allocation, scope: WatermarkScope) -> None:
    config = replace(PRESSURE, allocation=allocation, watermark_scope=scope)
    workload = generate("uniform", 16, 5, max_model_len=config.max_model_len, rate=1.5)
    traces = {}
    for implementation in ("reference", "optimized"):
        if implementation == "optimized":
            pytest.importorskip("torch")
        scheduler = SchedulerFactory(implementation)(config)
        records = list(run(scheduler, workload, max_steps=2_000))
        report = check_records(config, records, not scheduler.has_unfinished(),
                               strict=False)
        assert report.complete and must(report) == {}, report.violations[:3]
        traces[implementation] = [(r.decision.comparable(), r.new_blocks, r.finished)
                                  for r in records]
    assert traces["reference"] == traces["optimized"]


def test_the_modes_decide_differently_on_the_same_load() -> None:
    workload = generate("uniform", 16, 5, max_model_len=64, rate=1.5)
    first_blocks = {}
    for allocation in ALLOCATIONS:
        config = replace(PRESSURE, allocation=allocation)
        records = list(run(ReferenceScheduler(config), workload, max_steps=2_000))
        first_blocks[allocation] = sum(len((records[0].new_blocks or {}).get(rid, ()))
                                       for rid, _ in records[0].scheduled)
    assert first_blocks["lazy"] < first_blocks["full"]
    assert first_blocks["lazy"] <= first_blocks["prompt"] <= first_blocks["full"]


# -- watermark_scope and the rejection rule -----------------------------------------------

def test_always_applied_the_watermark_makes_a_request_that_fills_the_cache_hopeless() -> None:
    # 24 + 8 = 32 tokens: all 8 blocks, and nothing left for a watermark of 1.
    running = Config(block_size=4, num_gpu_blocks=8, max_model_len=32, watermark_blocks=1)
    always = replace(running, watermark_scope="always")
    assert never_completes(running, 24, 8) is None
    assert never_completes(always, 24, 8) == ("sequence needs 8 blocks and the watermark 1, "
                                              "cache has 8")
    # The checker: rejecting it is right only under always; leaving it waiting is not.
    steps = ({"step": 0, "arrivals": [arrive("r", 24, 8)],
              "rejected": [{"id": "r", "reason": "watermark"}]},)
    assert must(check(*steps, watermark_blocks=1, watermark_scope="always")) == {}
    assert must(check(*steps, watermark_blocks=1)) == {"reject": 1}
    left = check({"step": 0, "arrivals": [arrive("r", 24, 8)]}, watermark_blocks=1,
                 watermark_scope="always")
    assert must(left) == {}
    [v] = [v for v in left.violations if v.invariant == "completion"]
    assert "can never complete (sequence needs 8 blocks and the watermark 1" in v.message
    assert "should have been rejected" in v.message


@pytest.mark.parametrize("implementation", ["reference", "optimized"])
def test_the_schedulers_reject_beside_an_always_watermark_and_serve_otherwise(
        implementation: str) -> None:
    if implementation == "optimized":
        pytest.importorskip("torch")
    base = Config(block_size=4, num_gpu_blocks=8, max_num_batched_tokens=32,
                  max_model_len=32, watermark_blocks=1, allocation="prompt")
    served = {}
    for scope in WATERMARK_SCOPES:
        scheduler = SchedulerFactory(implementation)(replace(base, watermark_scope=scope))
        scheduler.add_request(Request("r", 24, 8))
        decision = scheduler.schedule()
        served[scope] = (decision.scheduled, len((decision.new_blocks or {}).get("r", ())),
                         [r.id for r in decision.rejected])
    # Admitted with nothing running, with the 6 blocks of its whole prompt at once.
    assert served["running"] == ((("r", 24),), 6, [])
    assert served["always"] == ((), 0, ["r"])


def test_an_idle_engine_is_told_so_only_where_the_watermark_would_not_hold_back() -> None:
    # Under prompt, r's admission takes the blocks of its 29 tokens, all 8: with nothing
    # running, scope running lets it in (so idling is no-idle), scope always does not.
    idle = ({"step": 0, "arrivals": [arrive("r", 29, 3)]},)
    running = check(*idle, end=False, allocation="prompt", watermark_blocks=1)
    always = check(*idle, end=False, allocation="prompt", watermark_blocks=1,
                   watermark_scope="always")
    assert set(running.counts) == {"no-idle"} and always.counts == {}


def test_a_prompt_of_max_model_len_may_be_served_or_rejected_by_both_checkers() -> None:
    served = trace_bytes({"step": 0, "arrivals": [arrive("a", 32, 4)], "scheduled": [["a", 16]],
                          "new_blocks": {"a": [0, 1, 2, 3]}, "free_blocks": 4},
                         {"step": 1, "scheduled": [["a", 16]], "finished": ["a"],
                          "new_blocks": {"a": [4, 5, 6, 7]}, "free_blocks": 8})
    rejected = trace_bytes({"step": 0, "arrivals": [arrive("a", 32, 4)],
                            "rejected": [{"id": "a", "reason": "fills max_model_len"}]})
    longer = trace_bytes({"step": 0, "arrivals": [arrive("a", 33, 4)],
                          "rejected": [{"id": "a", "reason": "too long"}]})
    assert rejectable(Config(max_model_len=32), 32, 4) is not None
    assert check_trace(TraceReader(io.BytesIO(served))).counts == {}
    assert check_trace(TraceReader(io.BytesIO(rejected))).counts == {}
    assert check_trace(TraceReader(io.BytesIO(longer))).counts == {}
    from kvsched.optimized.checker import check_trace_vectorized
    for data in (served, rejected, longer):
        assert check_trace_vectorized(io.BytesIO(data)).counts == {}


# -- the fast checker knows every allocation and watermark scope ---------------------------

@pytest.mark.parametrize("config", [{"allocation": "prompt"}, {"allocation": "lazy"},
                                    {"allocation": "prompt", "watermark_scope": "always"}])
def test_the_vectorized_checker_gives_the_spec_checkers_verdict(config: dict[str, str]
                                                               ) -> None:
    from kvsched.optimized.checker import check_trace_vectorized
    data = trace_bytes(*PROMPT_ADMISSION, end=True, **config)
    spec = check_trace(TraceReader(io.BytesIO(data)))
    stats: dict[str, int] = {}
    fast = check_trace_vectorized(io.BytesIO(data), stats=stats)
    assert fast.counts == spec.counts
    assert [v.as_dict() for v in fast.violations] == [v.as_dict() for v in spec.violations]
    # The steps with a violation go through the spec's Checker, and after two in a row
    # a stretch as long as the run of them so far (FastChecker.slow).
    flagged = len({v.step for v in spec.violations})
    assert flagged <= stats["exact"] <= min(2 * flagged, spec.steps)


# -- the trace header and the command line ------------------------------------------------

def test_writers_write_both_fields_and_readers_default_them() -> None:
    config = Config(allocation="full", watermark_scope="always")
    header = header_dict(config)
    assert (header["config"]["allocation"], header["config"]["watermark_scope"]) == (
        "full", "always")
    del header["config"]["allocation"], header["config"]["watermark_scope"]
    reader = TraceReader(io.BytesIO(json.dumps(header).encode() + b"\n"))
    assert (reader.header.config.allocation, reader.header.config.watermark_scope) == (
        "lazy", "running")


@pytest.mark.parametrize(("field", "value", "words"), [
    ("allocation", "eager", "config.allocation must be one of lazy, prompt, full, got 'eager'"),
    ("watermark_scope", "never",
     "config.watermark_scope must be one of running, always, got 'never'"),
    ("allocation", 1, "config.allocation must be one of lazy, prompt, full, got 1"),
])
def test_an_unknown_mode_in_a_header_is_bad_input(field: str, value: object, words: str,
                                                 tmp_path: Path) -> None:
    data = trace_bytes(end=True, **{field: value})
    with pytest.raises(TraceError, match="^line 1: " + words.replace("(", r"\(")):
        TraceReader(io.BytesIO(data))
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    result = subprocess.run([sys.executable, "-m", "kvsched", "check", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert words in result.stderr


def test_simulate_takes_both_options_and_check_passes_the_trace(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "kvsched", "simulate", "--requests", "30", "--allocation",
         "prompt", "--watermark-scope", "always", "--watermark-blocks", "4",
         "--max-num-batched-tokens", "256", "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    config = json.loads(out.read_text().splitlines()[0])["config"]
    assert (config["allocation"], config["watermark_scope"]) == ("prompt", "always")
    checked = subprocess.run([sys.executable, "-m", "kvsched", "check", "--strict", str(out)],
                             capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    bad = subprocess.run([sys.executable, "-m", "kvsched", "simulate", "--allocation", "eager"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "'--allocation'" in bad.stderr and "'lazy', 'prompt', 'full'" in bad.stderr
