"""The recording core, every engine's and none's own: an engine is a value (Engine),
and one path records any of them.

An engine's scheduler runs in the engine's own virtual environment, driven by a driver
script (run as `python -I driver.py jobs.jsonl`) that writes raw events on its standard
output, one JSON object a line: for each job a header event ({"job": name, "config":
what the engine really built, ...}), its step events ({"step": k, ...}) and a done event
({"done": name, "complete": bool, "stopped": why or None, "stalled": step or None, ...});
an error event
({"error": one line}) ends the run. The engine's adapter module says only what is its
own: its settings for a config (and its refusals), the config its scheduler really
built, how one step event becomes a step line, and its header fields. This module runs
the driver, writes each job's trace as the events stream in, and records a job, a list
of jobs or a workload with any Engine of the table (kvsched.adapters.engines).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Generic, Protocol, TypedDict, TypeVar

from kvsched.outputs import Output, OutputError
from kvsched.spec.blocks import blocks_for
from kvsched.spec.model import Config, Rejection, Request, StepRecord
from kvsched.spec.step_kinds import STEP_KINDS, SchedulerKind, StepKind
from kvsched.spec.trace import HeldLine, TraceWriter, json_line, step_dict
from kvsched.workload import WorkItem, item_dict

R = TypeVar("R")  # what a driver's events come to, per job
R_co = TypeVar("R_co", covariant=True)


class AdapterError(Exception):
    """The engine cannot be driven as asked; str() is one line."""


@dataclass(frozen=True)
class Job:
    """One workload to record: its config, its requests, where the trace goes."""

    name: str
    config: Config
    workload: Sequence[WorkItem] = field(repr=False)
    out: Path
    max_steps: int | None = None
    allow_undersized_cache: bool = False
    # The engine's settings that are its profile's knobs, knob name to value
    # (StepKind.settings): the driver starts the engine with them and the trace's header
    # declares them (its "settings"), so that the profile replays it with them.
    settings: Mapping[str, object] = field(default_factory=dict)


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
    # The step from which the engine stalled: it decided nothing more with requests left
    # and nothing to arrive or abort (driver_host.run_job); the trace is complete.
    stalled: int | None = None


def config_changes(asked: Config, built: Config, engine: str) -> list[str]:
    """Each field `engine` set otherwise than asked, as 'name: asked X, ENGINE uses Y'
    (the first block id is the engine's own, whatever was asked)."""
    return [f"{name}: asked {getattr(asked, name)!r}, {engine} uses {getattr(built, name)!r}"
            for name in asked.__dataclass_fields__
            if name != "first_block_id" and getattr(asked, name) != getattr(built, name)]


def built_as_asked(job: Job, built: Config, engine: str) -> Config:
    """`built`, the config `engine` really built for `job`, if it is the one asked; else
    an AdapterError naming the first field it set otherwise."""
    changes = config_changes(job.config, built, engine)
    if changes:
        raise AdapterError(f"{job.name}: {engine} changed the config: {changes[0]}")
    return built


class TraceFile:
    """One job's trace file while a driver's events come in, written as every output is
    (kvsched.outputs): the header at once, a line a step, the end line and the commit
    when the job is done; nothing left when it is discarded. Every engine's adapter
    writes its traces through one: its own subclass says how a step event becomes a step
    (`step`)."""

    def __init__(self, job: Job, result: Recorded, extra: dict[str, Any]) -> None:
        self.result = result
        self.by_id = {w.id: w for w in job.workload}
        self.output = Output(job.out)
        self.stream: IO[bytes] = self.output.stream
        TraceWriter(self.stream).header(result.config, result.engine, extra)
        # A pipelined engine (config pipelined) decides step k+1 before it applies step
        # k's output, so step k's finishes come in step k+1's event, as its
        # "finished_before": each step line waits here for the next event.
        self.held = HeldLine()

    def take(self, event: Mapping[str, Any]) -> StepRecord:
        """One step event: the line held before it gets the event's "finished_before"
        (ids, or objects with an "id") and is written, then the engine's adapter makes
        the event's own line (`step`)."""
        before = tuple(f["id"] if isinstance(f, Mapping) else str(f)
                       for f in event.get("finished_before") or ())
        held = self.held.settle(before)
        if held is not None:
            self._put(held)
        elif before:
            raise AdapterError(f"step {event.get('step')}: the driver gave finishes of an "
                               "earlier step, and there is none")
        return self.step(event)

    def step(self, event: Mapping[str, Any]) -> StepRecord:
        raise NotImplementedError

    def write(self, rec: StepRecord, line: dict[str, Any] | None = None) -> StepRecord:
        """Write a step: `line`, the step's object as the engine's adapter makes it, or
        trace v1's own; a pipelined engine's trace v1 line waits for the next event
        (`take`)."""
        if line is None and self.result.config.pipelined:
            self.held.hold(rec)
            return rec
        self._put(rec, line)
        return rec

    def _put(self, rec: StepRecord, line: dict[str, Any] | None = None) -> None:
        self.stream.write(json_line(step_dict(rec) if line is None else line))
        self.result.steps += 1
        self.result.preemptions += len(rec.preempted)
        self.result.rejected += len(rec.rejected)

    def done(self, event: Mapping[str, Any]) -> Recorded:
        held = self.held.settle()
        if held is not None:
            self._put(held)
        complete = bool(event["complete"])
        if complete:
            TraceWriter(self.stream).end()
        self.output.commit()
        self.result.complete = complete
        stopped = event.get("stopped")
        self.result.stopped = None if stopped is None else str(stopped)
        stalled = event.get("stalled")
        self.result.stalled = None if stalled is None else int(stalled)
        return self.result

    def discard(self) -> None:
        self.output.discard()


def refuse_seats_over_budget(config: Config, engine: str) -> None:
    """The start-up refusal of vLLM's engines (v1's and V0's): a token budget below the
    sequence limit (a decode step of every running request would exceed it)."""
    if config.max_num_batched_tokens < config.max_num_seqs:
        raise AdapterError(f"{engine} refuses max_num_batched_tokens "
                           f"({config.max_num_batched_tokens}) below max_num_seqs "
                           f"({config.max_num_seqs}): a decode step of every running "
                           "request would exceed the token budget")


def refuse_undersized_cache(config: Config, engine: str, allowed: bool = False) -> None:
    """The start-up refusal of vLLM's engines (v1's and V0's): a cache that cannot hold
    one max_model_len sequence; `allowed` where a recording wants to see what the
    scheduler does then."""
    longest = blocks_for(config.max_model_len, config.block_size)
    if longest > config.num_gpu_blocks and not allowed:
        raise AdapterError(f"{engine}'s engine refuses at start-up a cache of "
                           f"{config.num_gpu_blocks} blocks that cannot hold one "
                           f"max_model_len sequence ({longest} blocks)")


class LoopFields(TypedDict):
    """The step fields every driver's loop writes alike (driver_host.run_job)."""

    arrivals: tuple[Request, ...]
    aborted: tuple[str, ...]
    rejected: tuple[Rejection, ...]
    scheduled: tuple[tuple[str, int], ...]


def loop_fields(event: Mapping[str, Any], workload: Mapping[str, WorkItem],
                rejected_after: Iterable[Mapping[str, str]] = ()) -> LoopFields:
    """A step event's fields that every driver writes alike, as StepRecord's: the
    arrivals (as the workload asked them), the aborts the engine ended at once, the
    front end's refusals (then `rejected_after`, an engine's own rejections) and the
    tokens scheduled per request."""
    step = event["step"]
    return LoopFields(
        arrivals=tuple(workload[rid].request(step) for rid in event["arrivals"]),
        aborted=tuple(event["aborted"]),
        rejected=tuple(Rejection(r["id"], r["reason"])
                       for r in (*event["refused"], *rejected_after)),
        scheduled=tuple((rid, n) for rid, n in event["scheduled"]))


def read_events(lines: Iterable[bytes], name: str) -> Iterator[dict[str, Any]]:
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

    def take(self, event: Mapping[str, Any]) -> StepRecord: ...
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
                rec = current.take(event)
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


def run_driver(driver: Path, python: Path, inputs: Sequence[dict[str, Any]], name: str,
               setup_hint: str, consume: Callable[[Iterator[dict[str, Any]]], list[R]],
               log_level: str = "WARNING") -> list[R]:
    """Run a driver script in an engine's own Python on `inputs` (one job each, as JSON
    lines) and hand its events to `consume`, which returns one result per job. Any
    failure (the process, its exit status, a job it never finished) is one line."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", VLLM_LOGGING_LEVEL=log_level)
    with tempfile.TemporaryDirectory(prefix="kvsched-record-") as tmp:
        jobs_path = Path(tmp) / "jobs.jsonl"
        jobs_path.write_text("".join(json.dumps(i) + "\n" for i in inputs))
        with (Path(tmp) / "stderr.txt").open("w+b") as errors:
            try:
                # -I: isolated, so the driver's folder (with kvsched's vllm.py) cannot
                # shadow the engine's package.
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


def stopped_by_engine(engine: Engine[Any], result: Recorded) -> str | None:
    """Why the engine, not the user, ended a recorded job early (one line), or None: a
    step that trace v1 cannot say, or a stall."""
    if result.stalled is not None:
        return (f"{engine.label} stalled from step {result.stalled}: it decides nothing "
                "more with requests left (the trace ends there; kvsched check names them)")
    if result.stopped is None:
        return None
    return (f"{engine.label} {result.engine.get('version', '?')} did something in step "
            f"{result.steps} that trace v1 cannot say: {result.stopped} (the trace holds "
            "the steps before it)")


RecordedT = TypeVar("RecordedT", bound=Recorded)  # what an engine's recording comes to


@dataclass(frozen=True)
class EngineOption:
    """One of an engine's own options that `kvsched record NAME` offers beside the
    config's: `flag` as the engine spells it, `help`; `choices` (its words), `switch`
    (a flag without a value), `real` (a number with a fraction) or else an integer;
    `knob`, the setting of its step kind it sets (StepKind.settings; "" for none), and
    `as_knob`, each word's knob value where they differ; `refused`, each word the
    adapter refuses, with why (one clause); `config`, the config field a switch turns
    on."""

    flag: str
    help: str
    knob: str = ""
    choices: tuple[str, ...] = ()
    switch: bool = False
    real: bool = False
    as_knob: Mapping[str, object] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)
    default: str = ""  # what an unset option means, as --help says it
    # The config field a switch turns on, where the option is the engine's own way of
    # saying one its step kind does not offer (vLLM's --async-scheduling: pipelined).
    config: str = ""

    @property
    def dest(self) -> str:
        """The option's parameter name: its flag's words joined by _."""
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class Engine(Generic[RecordedT]):
    """An engine as kvsched records it: what `kvsched record NAME` needs, and nothing
    that another engine's recording shares (that is this module's).

    `settings(job)` is the driver's settings for a job's config, raising AdapterError
    for a config or workload the engine cannot take (asked before its environment is
    looked for); `trace(job, header_event)` opens the job's trace file from the config
    the engine really built; `summary(result)` says what a recording came to, after
    "trace written to OUT: "; `failure(result)` the engine's failure, if it had one
    (the command exits 1), by default stopped_by_engine."""

    name: str           # `kvsched record NAME`
    label: str          # how messages name the engine
    release: str        # the release the adapter is written against
    profile: str        # the profile whose defaults a recording starts from
    step_kind: SchedulerKind  # whose rules its steps follow (kind: what it can express)
    driver: Path
    python: Path        # its environment's Python, relative to the working directory
    make_env: str       # the make target that builds that environment
    setup_hint: str     # how to create it, after "...'s Python environment is missing; "
    settings: Callable[[Job], dict[str, Any]]
    trace: Callable[[Job, Mapping[str, Any]], JobTrace[RecordedT]]
    summary: Callable[[RecordedT], str]
    failure: Callable[[RecordedT], str | None] | None = None  # else stopped_by_engine
    python_flag: str = "--python"  # the record option naming another environment's Python
    # Whether the engine refuses at start-up a cache that cannot hold one max_model_len
    # sequence (record then offers --allow-undersized-cache).
    refuses_undersized_cache: bool = True
    log_level: str = "WARNING"
    help: str = ""      # `kvsched record NAME --help`'s text
    # Where the adapter drives several releases, each in its own environment:
    # release_python(name, python) is the Python to drive release `name` with (`python`
    # if given, once the name is known), an AdapterError for an unknown release or a
    # missing environment; record then offers --release, with `release_help`.
    release_python: Callable[[str, Path | None], Path] | None = None
    release_help: str = ""
    # Its own options beside the config's (EngineOption), and the config options'
    # defaults where they are the engine's, not the profile's (SGLang's page of 1).
    options: tuple[EngineOption, ...] = ()
    defaults: Mapping[str, object] = field(default_factory=dict)

    @property
    def kind(self) -> StepKind:
        """Its step kind: the config fields its steps can express (kvsched.spec.step_kinds)."""
        return STEP_KINDS[self.step_kind]

    def failed(self, result: RecordedT) -> str | None:
        """The engine's failure in a recorded job (one line), or None."""
        if self.failure is not None:
            return self.failure(result)
        return stopped_by_engine(self, result)

    def driver_input(self, job: Job) -> dict[str, Any]:
        """What the driver reads for `job` (one line of its jobs file)."""
        return {"name": job.name, "config": self.settings(job),
                "requests": [item_dict(w) for w in job.workload],
                "max_steps": job.max_steps}

    def assemble(self, jobs: Sequence[Job], events: Iterable[dict[str, Any]],
                 on_step: Callable[[Job, StepRecord], None] | None = None
                 ) -> list[RecordedT]:
        """Write each job's trace from this engine's driver's events (assemble_with)."""
        return assemble_with(jobs, events, on_step, self.trace, self.label)

    def record_jobs(self, jobs: Sequence[Job], python: Path | None = None,
                    on_step: Callable[[Job, StepRecord], None] | None = None
                    ) -> list[RecordedT]:
        """Run the engine's scheduler on every job in one driver process (an engine
        takes seconds to import) and write each job's trace to its `out` path. What
        needs no engine is refused first: a config or workload the engine cannot take
        is told as such with or without its environment."""
        inputs = [self.driver_input(job) for job in jobs]
        python = self.python if python is None else python
        if not python.exists():
            raise AdapterError(f"{python}: {self.label}'s Python environment is missing; "
                               + self.setup_hint)
        return run_driver(self.driver, python, inputs, self.label, self.setup_hint,
                          lambda events: self.assemble(jobs, events, on_step),
                          self.log_level)

    def record(self, config: Config, workload: Sequence[WorkItem], out: Path,
               python: Path | None = None, max_steps: int | None = None,
               allow_undersized_cache: bool = False,
               settings: Mapping[str, object] | None = None) -> RecordedT:
        """Record one workload; see record_jobs."""
        job = Job(out.stem, config, workload, out, max_steps, allow_undersized_cache,
                  dict(settings or {}))
        return self.record_jobs([job], python)[0]
