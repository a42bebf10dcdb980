"""The trace a live vLLM engine writes through kvsched.integrations.vllm.TracingScheduler.

This module never imports vLLM (kvsched's own environment has none): it takes vLLM's
objects as they come and reads them with the driver's functions
(kvsched.adapters.vllm_driver, the one place that knows vLLM's objects), so the plugin
and the driver write the same trace from the same reading.

NOTE on steps: a trace step is one schedule() and its update_from_output(), the
engine core's step. Requests added and aborted since the last step are that step's
arrivals and aborts; victims are recorded as vLLM preempts them. An abort made while a
step is in flight (the engine core processes aborts between the forward pass and
update_from_output; vLLM's own error finishes happen inside it) is written in the next
step, as the trace format orders them, and the in-flight step's free_blocks leave out
the blocks it released, so that the count is the one the trace's decisions imply.
Each step's line is written, in one system call on an unbuffered file, when the step
ends: a crash loses at most the step in flight.

NOTE on cost: this runs inside the engine's step, where vLLM's scheduler has the
caches, so each Python object made and each call costs several times what it costs in
a loop of its own. A step reads vLLM's answers once (the batch, its blocks, the
finished outputs), builds nothing it does not write (victims and arrivals are kept as
the records the line writes), encodes the line into one buffer kept across steps, and
writes that buffer.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from kvsched.adapters.recording import AdapterError
from kvsched.adapters.vllm import config_from_vllm
from kvsched.adapters.vllm_driver import (
    BlockKeys,
    effective_config,
    finished_outputs,
    key_text,
    step_blocks,
)
from kvsched.spec.model import Config, Preemption, Request
from kvsched.spec.trace import TraceWriter, step_fields

TRACE_DIR_ENV = "KVSCHED_TRACE_DIR"
TRACE_DIR_KEY = "kvsched_trace_dir"  # in vLLM's --additional-config


class TraceSetupError(Exception):
    """The engine cannot be traced as configured; str() is one line."""


def trace_dir(environ: Mapping[str, str], additional_config: Mapping[str, Any] | None) -> Path:
    """Where this engine's trace goes: --additional-config's kvsched_trace_dir (one
    engine's own setting), else the environment's KVSCHED_TRACE_DIR."""
    folder = (additional_config or {}).get(TRACE_DIR_KEY) or environ.get(TRACE_DIR_ENV)
    if not folder:
        raise TraceSetupError(
            f"kvsched's TracingScheduler needs a folder for its traces: set {TRACE_DIR_ENV} "
            f"or --additional-config '{{\"{TRACE_DIR_KEY}\": \"DIR\"}}'")
    return Path(str(folder))


def trace_file_name(pid: int, started: datetime) -> str:
    """One engine process's trace: its start time (UTC, to the second) and process id,
    so that names sort by start and two engines never share one.
    pre: started.tzinfo is not None
    post: __return__.endswith(f"-{pid}.jsonl")
    """
    return f"vllm-{started.astimezone(UTC):%Y%m%dT%H%M%SZ}-{pid}.jsonl"


def open_trace(folder: Path, pid: int, started: datetime) -> tuple[Path, IO[bytes]]:
    """Create the folder if needed and the trace file, never over an existing one: a
    second scheduler in one process within a second gets NAME-1.jsonl, and so on."""
    name = trace_file_name(pid, started)
    path = folder / name
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for n in range(1, 1000):
            try:
                return path, path.open("xb", buffering=0)  # a step's line: one write
            except FileExistsError:
                path = folder / f"{name.removesuffix('.jsonl')}-{n}.jsonl"
        raise FileExistsError(17, "a thousand traces of this name exist")
    except OSError as e:
        raise TraceSetupError(f"{path}: cannot write the trace ({e.strerror})") from None


def write_all(stream: IO[bytes], data: bytes | memoryview) -> None:
    """Write all of `data`: an unbuffered file's write may take only part of it."""
    done = stream.write(data)
    if done < len(data):
        view = memoryview(data)
        while done < len(data):
            done += stream.write(view[done:])


def engine_config(scheduler: Any) -> Config:
    """The kvsched config of the scheduler vLLM built, as the driver reads it back;
    refuses, in one line, an engine whose scheduling kvsched does not model."""
    groups = len(scheduler.kv_cache_config.kv_cache_groups)
    if groups != 1:
        raise TraceSetupError(f"kvsched's TracingScheduler needs one KV cache group (a "
                              f"model with full attention only); this engine has {groups}")
    stages = scheduler.vllm_config.parallel_config.pipeline_parallel_size
    if stages != 1:
        # The engine core then schedules several batches before the first update.
        raise TraceSetupError(f"kvsched's TracingScheduler needs one pipeline stage; this "
                              f"engine has {stages}")
    effective = effective_config(scheduler)
    try:
        return config_from_vllm(effective,
                                scheduler.kv_cache_manager.block_pool.null_block.block_id)
    except AdapterError as e:
        hint = "; start vLLM with --no-async-scheduling" if effective.get(
            "async_scheduling") else ""
        raise TraceSetupError(f"kvsched's TracingScheduler: {e}{hint}") from None


def header_extra(prefix_caching: bool, pid: int, started: datetime) -> dict[str, Any]:
    adapter: dict[str, Any] = {
        "name": "kvsched.integrations.vllm",
        "scheduler": "kvsched.integrations.vllm.TracingScheduler",
        "pid": pid, "started": started.astimezone(UTC).isoformat(timespec="seconds"),
        "prefix_caching": prefix_caching,
        "preempted": "in the order vLLM preempted them (Scheduler._preempt_request)",
        "aborted": "finish_requests from outside the scheduler (a client closing its "
                   "stream, a stop string the front end found); one made while a step was "
                   "in flight is written in the next step, the blocks it released left "
                   "out of the in-flight step's free_blocks",
        "arrivals": "the requests the engine core added since the last step, in the order "
                    "vLLM ranks equals: as added under fcfs, by the front end's arrival "
                    "time under priority",
        "rejected": "not seen: vLLM's front end refuses prompts before the engine core",
        "block_ids": "vLLM's own; its null block 0 is never handed out",
        "time_ms": "schedule() to the end of update_from_output(), the forward pass included",
    }
    if prefix_caching:
        adapter["block_keys"] = "vLLM's Request.block_hashes (base64)"
    return {"preempted_order": True, "adapter": adapter}


# Encodes a trace line (without its newline) into a buffer, replacing what it held.
LineEncoder = Callable[[Any, bytearray], None]


def line_encoder() -> LineEncoder:
    """The JSON encoder of a trace line in the engine's process, into a buffer kept
    across steps: msgspec's encode_into (a dependency of vLLM, ten times as fast as the
    standard library's on a step's line, which the overhead budget needs; it writes a
    block key, vLLM's hash as bytes, in base64 in C, as key_text does), else the
    standard library's with key_text."""
    try:
        return importlib.import_module("msgspec").json.Encoder().encode_into  # type: ignore[no-any-return]
    except ImportError:
        def encode_json(obj: Any, buffer: bytearray) -> None:
            buffer[:] = json.dumps(obj, separators=(",", ":"), default=_bytes_as_key).encode()

        return encode_json


def _bytes_as_key(obj: Any) -> str:
    if isinstance(obj, bytes):
        return key_text(obj)
    raise TypeError(f"a trace line cannot hold {type(obj).__name__}")


class LiveTrace:
    """The trace of one engine process, written step by step while it serves.

    The scheduler calls arrived / aborted / preempted as they happen, scheduled after
    schedule() (with the time.perf_counter_ns() of its start) and updated after
    update_from_output(); updated writes the step's line.
    """

    def __init__(self, stream: IO[bytes], config: Config, engine: dict[str, str],
                 extra: dict[str, Any], keys: BlockKeys | None = None,
                 encode: LineEncoder | None = None) -> None:
        self.stream = stream
        self.block_size = config.block_size
        self.keys = keys  # with prefix caching: the blocks' content keys
        # Under priority vLLM breaks ties by the time the front end stamped on each
        # request, and its engine core may receive two requests of one step in the
        # other order: a step's arrivals are written in stamp order then.
        self.by_stamp = config.policy == "priority"
        self.stamps: dict[str, tuple[float, str]] = {}
        self.encode = encode or line_encoder()
        self.buffer = bytearray()  # each line is encoded here, then written whole
        self.writer = TraceWriter(stream, self._line)
        self.writer.header(config, engine, extra)
        self.step = 0
        self.arrivals: list[Request] = []
        self.aborts: list[str] = []
        self.victims: list[Preemption] = []
        self.in_flight = False
        self.late_aborts: list[str] = []  # aborted while the step is in flight
        self.late_freed = 0  # blocks they released
        self.started = 0
        self.batch: tuple[tuple[str, int], ...] = ()
        self.fresh: dict[str, list[int]] = {}
        self.hits: dict[str, list[int]] = {}
        self.closed = False

    def _line(self, obj: Any) -> bytes:
        self.encode(obj, self.buffer)
        return bytes(self.buffer) + b"\n"

    def arrived(self, request: Any) -> None:
        rid = request.request_id
        self.arrivals.append(Request(rid, request.num_prompt_tokens, request.max_tokens,
                                     request.priority, self.step))
        if self.by_stamp:
            self.stamps[rid] = (request.arrival_time, rid)
        if self.keys is not None:
            self.keys.arrived(request)

    def aborted(self, ids: Iterable[str], freed: int) -> None:
        """Requests finished from outside the scheduler, and the blocks that freed."""
        ids = list(ids)
        if self.in_flight:
            self.late_aborts += ids
            self.late_freed += freed
        else:
            self.aborts += ids
        if self.keys is not None:
            for rid in ids:
                self.keys.forget(rid, unwritten=not self.in_flight)

    def preempted(self, rid: str) -> None:
        self.victims.append(Preemption(rid, "recompute"))

    def scheduled(self, output: Any, started: int) -> None:
        """After schedule(): the batch in vLLM's order and the blocks it handed out."""
        self.in_flight = True
        self.started = started
        self.batch = tuple(output.num_scheduled_tokens.items())
        self.fresh, self.hits = step_blocks(output, self.block_size)

    def updated(self, engine_outputs: Any, free_blocks: int) -> None:
        """After update_from_output(): write the step's line in one system call."""
        finished = finished_outputs(engine_outputs)
        if finished:  # (most steps finish nothing)
            finished = [out.request_id for out in finished
                        if out.request_id not in self.late_aborts]
        arrivals = self.arrivals
        if self.by_stamp and len(arrivals) > 1:
            arrivals.sort(key=lambda r: self.stamps[r.id])
        keys = self.keys
        buffer = self.buffer
        # Microseconds rounded, as milliseconds: round() on a float costs more.
        micros = (time.perf_counter_ns() - self.started + 500) // 1000
        self.encode(step_fields(
            self.step, arrivals=arrivals, aborted=self.aborts, preempted=self.victims,
            scheduled=self.batch, finished=finished,
            free_blocks=free_blocks - self.late_freed, new_blocks=self.fresh,
            time_ms=micros / 1000, prefix_hits=self.hits,
            block_keys=keys.take() if keys is not None and (keys.cached or keys.pending)
            else None), buffer)
        buffer.append(0x0A)  # the buffer keeps its memory: no copy for the newline
        written = self.stream.write(buffer)
        if written < len(buffer):  # an unbuffered file's write may take only part
            write_all(self.stream, memoryview(buffer)[written:])
        self.step += 1
        if finished and keys is not None:
            for rid in finished:
                keys.forget(rid)
        if arrivals:
            arrivals.clear()
            self.stamps.clear()
        if self.victims:
            self.victims = []
        if self.aborts or self.late_aborts:
            self.aborts, self.late_aborts, self.late_freed = self.late_aborts, [], 0
        self.in_flight = False

    def close(self, complete: bool) -> None:
        """Write the end line if the engine drained, and close the file."""
        if self.closed:
            return
        self.closed = True
        if complete and not (self.arrivals or self.aborts or self.in_flight):
            self.writer.end()
        self.stream.close()
