"""What the commands share: the consoles, the error and exit helpers, the config,
workload and liveness options, building a run's config and workload, and the input and
output helpers.

Exit codes: 0 clean, 1 violations (SHOULD ones only with --strict), 2 bad input, or an
output that cannot be written (a full disk: one line naming the file, or standard
output, and why), 141 when the reader of standard output (or error) leaves early
(`kvsched check ... | head`; 128 + SIGPIPE, as a shell reports it), silently.
Every error a user can cause is one line on stderr (`fail`), never a traceback.
"""

from __future__ import annotations

import errno
import math
import os
import re
import sys
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn, overload

import click
import orjson
from click.core import ParameterSource
from click.shell_completion import CompletionItem
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvsched import inputs
from kvsched.generators import (
    ARRIVALS,
    DEFAULT_SKEW,
    DEFAULT_SYSTEM_PROMPTS,
    DEFAULT_THINK_STEPS,
    DEFAULT_TURNS,
    GENERATORS,
    lazily,
    parse_lengths,
    parse_priorities,
    priorities_for,
)
from kvsched.inputs import InputError
from kvsched.outputs import STANDARD_ERROR, STANDARD_OUTPUT, OutputError
from kvsched.outputs import atomic_output as atomic_output  # the commands import it from here
from kvsched.spec.model import (
    ALLOCATIONS,
    POLICIES,
    PREEMPTION_MODES,
    STEP_MIXES,
    WATERMARK_SCOPES,
    Config,
)
from kvsched.spec.profiles import (
    PROFILES,
    SettingsError,
    UnknownProfile,
    get_profile,
    profile_names,
    resolve_profile,
    resolve_vllm_release,
)
from kvsched.spec.step_kinds import STEP_KINDS, SchedulerKind
from kvsched.spec.violation import DEFAULT_STALL_STEPS, DEFAULT_STARVE_STEPS
from kvsched.workload import WorkItem, read_workload

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


class BadInput(Exception):
    """A user's mistake: printed as one line, exit code 2."""


def fail(message: str) -> NoReturn:
    raise BadInput(message)


def dumps_line(obj: Any) -> bytes:
    return orjson.dumps(obj) + b"\n"


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


class Number(click.ParamType[float, Any]):
    """The type of every float option: a finite number of at least `least` (above it,
    with `above`). nan, inf and a number out of range are refused in one line, exit 2."""

    name = "float"

    def __init__(self, least: float, *, above: bool = False) -> None:
        self.least = least
        self.above = above

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"expected a number, got {value!r}", param, ctx)
        if not math.isfinite(number):
            self.fail(f"expected a finite number, got {value}", param, ctx)
        if number < self.least or (self.above and number == self.least):
            bound = "above" if self.above else "of at least"
            self.fail(f"expected a number {bound} {self.least:g}, got {value}", param, ctx)
        return number


POSITIVE = Number(0, above=True)
NON_NEGATIVE = Number(0)


def stall_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """--stall-steps: progress's K (docs/spec.md, the progress invariant)."""
    return click.option(
        "--stall-steps", type=click.IntRange(min=1), default=DEFAULT_STALL_STEPS,
        show_default=True, metavar="K",
        help="Liveness (progress): K steps in a row that schedule, preempt, swap in, "
             "finish, abort and reject nothing while requests wait are a stall.")(f)


def starve_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """--starve-steps: starvation's K (docs/spec.md, the starvation invariant)."""
    return click.option(
        "--starve-steps", type=click.IntRange(min=1), default=DEFAULT_STARVE_STEPS,
        show_default=True, metavar="K",
        help="Starvation: a waiting request passed over (a later arrival, or a lower "
             "priority, admitted where it could have run) for more than K steps.")(f)


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


def profile_default(name: str) -> str:
    """What an unset config option means for a run: the built-in default or the
    profile's."""
    value = getattr(DEFAULT_CONFIG, name)
    if isinstance(value, bool):
        value = "on" if value else "off"
    return f"{value}, unless the profile sets it"


@overload
def config_options(f: Callable[..., Any], /, *, defaults: Callable[[str], str] = ...,
                   kind: SchedulerKind | None = ..., leave_out: frozenset[str] = ...
                   ) -> Callable[..., Any]: ...


@overload
def config_options(*, defaults: Callable[[str], str] = ..., kind: SchedulerKind | None = ...,
                   leave_out: frozenset[str] = ...
                   ) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...


def config_options(f: Callable[..., Any] | None = None, /, *,
                   defaults: Callable[[str], str] = profile_default,
                   kind: SchedulerKind | None = None,
                   leave_out: frozenset[str] = frozenset()) -> Any:
    """One option per Config field; unset options keep the profile's or built-in default
    (shown in --help). `defaults(field)` says, for --help, what an unset option means
    when that is not the run's default (`kvsched fuzz`: drawn):
    `@config_options(defaults=...)`. With `kind`, a command that runs only that step
    kind (a recorder) offers only what the kind honours (kvsched.spec.step_kinds): no
    option for a field it takes at one value, and only the values it takes; `leave_out`:
    fields the command does not offer at all."""
    if f is None:
        return lambda g: config_options(g, defaults=defaults, kind=kind, leave_out=leave_out)

    def default(name: str) -> str:
        return f" [default: {defaults(name)}]"

    def choice(name: str, words: tuple[str, ...]) -> click.Choice[str]:
        taken = STEP_KINDS[kind].takes.get(name) if kind is not None else None
        return click.Choice([w for w in words if taken is None or w in taken])

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
        click.option("--policy", type=choice("policy", POLICIES),
                     help="Queue order." + default("policy")),
        click.option("--preemption", type=choice("preemption", PREEMPTION_MODES),
                     help="How victims give up their blocks." + default("preemption")),
        click.option("--watermark-blocks", type=int,
                     help="Blocks an admission or a swap-in leaves free (while others run, "
                          "or always: --watermark-scope)." + default("watermark_blocks")),
        click.option("--watermark-scope", type=choice("watermark_scope", WATERMARK_SCOPES),
                     help="When the watermark applies: only while some request runs "
                          "(running, vLLM v1) or at every admission and swap-in (always, "
                          "vLLM V0)." + default("watermark_scope")),
        click.option("--allocation", type=choice("allocation", ALLOCATIONS),
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
        click.option("--max-prompt-len", type=int,
                     help="The longest prompt the engine's front end takes; longer ones "
                          "are rejected on arrival (0 = no limit of its own: max_model_len "
                          "governs)." + default("max_prompt_len")),
        click.option("--step-mix", type=choice("step_mix", STEP_MIXES),
                     help="What one step may combine: running decodes and new prefills "
                          "(any, vLLM), prefill work or decodes (prefill_or_decode, "
                          "SGLang), or decodes joining a chunked prefill step "
                          "(mixed_chunk, SGLang's --enable-mixed-chunk)."
                          + default("step_mix")),
        click.option("--prealloc-tokens", type=int,
                     help="The tokens beyond its own a chunk may take blocks for "
                          "(LMDeploy: its prefill interval, 16)." + default("prealloc_tokens")),
        click.option("--pipelined/--no-pipelined", default=None,
                     help="Decide each step before the last one's samples are applied: a "
                          "finished request holds its blocks until its session ends "
                          "(LMDeploy)." + default("pipelined")),
    ]
    names = ("block_size", "num_gpu_blocks", "num_cpu_blocks", "max_num_batched_tokens",
             "max_num_seqs", "max_model_len", "chunked_prefill",
             "long_prefill_token_threshold", "policy", "preemption", "watermark_blocks",
             "watermark_scope", "allocation", "first_block_id", "prefix_caching",
             "max_prompt_len", "step_mix", "prealloc_tokens", "pipelined")
    for name, opt in reversed(list(zip(names, opts, strict=True))):
        honoured = kind is None or name in STEP_KINDS[kind].reads or len(
            STEP_KINDS[kind].takes[name]) > 1
        if honoured and name not in leave_out:
            f = opt(f)
    return f


def recorded_config_options(f: Callable[..., Any], profile: str,
                            own: Mapping[str, object] | None = None) -> Callable[..., Any]:
    """The config options of a recorder whose engine runs `profile`'s step: only what its
    step kind honours (config_options(kind=...)), none for the first block id (each
    engine's ids are its own: vLLM's run from 1, V0's from 0, SGLang's pages from 1) or
    the front end's prompt limit (the engine's own, from its context and pool: SGLang's
    max_req_len - 6, which the profile sets), and each unset option shown as the value
    the engine's `own` defaults, then the profile's, give it."""
    named = get_profile(profile)
    configured = named.configure(replace(DEFAULT_CONFIG, **(own or {})))  # type: ignore[arg-type]

    def default(name: str) -> str:
        if name == "watermark_blocks" and named.defaults.watermark_fraction is not None:
            return (f"{named.defaults.watermark_fraction:.0%} of num_gpu_blocks, as profile "
                    f"{named.name} sets it")
        if name == "num_cpu_blocks" and named.defaults.host_blocks_as_gpu:
            return f"num_gpu_blocks, as profile {named.name} sets it"
        value = getattr(configured, name)
        shown = ("on" if value else "off") if isinstance(value, bool) else str(value)
        if name in (own or {}):
            return f"{shown}, the engine's"
        if value != getattr(DEFAULT_CONFIG, name):
            return f"{shown}, as profile {named.name} sets it"
        return shown

    return config_options(f, defaults=default, kind=named.scheduler,
                          leave_out=frozenset({"first_block_id", "max_prompt_len"}))


class ProfileName(click.ParamType[str, Any]):
    """A profile, as kvsched.spec.profiles.resolve_profile reads its name: the profile's
    own or a release's (vllm-v1@0.27.1, vllm-v1@0.27, sglang); the value is the profile's
    own name. An unknown one is one line naming the nearest known ones, exit 2."""

    name = "profile"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "NAME"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        try:
            return resolve_profile(str(value))
        except UnknownProfile as e:
            self.fail(str(e), param, ctx)

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str
                       ) -> list[CompletionItem]:
        return [CompletionItem(n) for n in profile_names() if n.startswith(incomplete)]


class ReleaseName(click.ParamType[str, Any]):
    """A release of vLLM's v1 scheduler (kvsched.spec.profiles.resolve_vllm_release:
    0.27.1, 0.12, vllm-v1@0.27.1); the value is the release's full version."""

    name = "release"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        try:
            return resolve_vllm_release(str(value))
        except UnknownProfile as e:
            raise BadInput(str(e)) from None  # as the release's own refusals: one line


PROFILE = ProfileName()
VLLM_RELEASE = ReleaseName()


def profile_note(name: str | None) -> None:
    """A deprecated profile's note, one line on standard error, whenever it is used."""
    if name is not None and name in PROFILES and PROFILES[name].deprecated:
        err.print(Text(f"kvsched: note: {PROFILES[name].deprecated}"))


def build_config(profile: str, given: dict[str, Any],
                 settings: Mapping[str, object] | None = None) -> Config:
    """The config the options give under `profile`, checked as its step takes it with the
    engine `settings` a recording asks for (its refusals read the profile's knobs)."""
    chosen = {k: v for k, v in given.items() if v is not None}
    for name, value in chosen.items():
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            fail(f"--{name.replace('_', '-')} must not be negative, got {value}")
    config = replace(DEFAULT_CONFIG, **chosen)
    named = get_profile(profile)
    if settings:
        try:
            named = named.for_trace(settings)
        except SettingsError as e:
            fail(str(e))
    config = named.configure(config, frozenset(chosen))
    denied = named.disagreement(config, "the options ask for")
    if denied is not None:  # a run under the profile's name is what the name says
        fail(f"{denied}: leave the option out, or name another profile")
    ignored = named.refusal(config)
    if ignored is not None:  # a field the profile's step would silently ignore
        fail(ignored)
    limit = named.defaults.prompt_limit(config)
    if limit is not None and limit < 1 and "max_prompt_len" not in chosen:
        fail(f"profile {named.name}: {STEP_KINDS[named.scheduler].engine}'s "
             f"front end takes no prompt under max_model_len {config.max_model_len} and "
             f"a cache of {config.num_gpu_blocks * config.block_size} tokens (it takes "
             f"prompts of min(max_model_len, cache tokens) - "
             f"{named.defaults.prompt_margin} tokens at most)")
    if config.preemption in ("swap", "auto") and config.num_cpu_blocks == 0:
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
                     help="Priority mix as weights of priorities 0, 1, ...: e.g. 0.7,0.2,0.1, "
                          "or LEVEL:WEIGHT pairs, e.g. 0:0.8,20:0.2 [default: 0:6,20:3,40:1 "
                          "under --policy priority, else priority 0]."),
        click.option("--max-tokens", "max_tokens", type=int, default=None,
                     help="Generated workload: max_tokens of every request (default: drawn)."),
        click.option("--rate", type=POSITIVE, default=DEFAULT_RATE, show_default=True,
                     help="Mean arrivals per step."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--system-prompts", default=None, metavar="LENS",
                     help="Generated workload: shared system prompts of these token counts "
                          "(e.g. 1024,256) that each request (or conversation) starts with, "
                          "picked by a Zipf skew [default: "
                          + ",".join(map(str, DEFAULT_SYSTEM_PROMPTS))
                          + " for shared-prompts, none otherwise]."),
        click.option("--skew", type=NON_NEGATIVE, default=None,
                     help="Zipf exponent of the system prompt choice: prompt i has weight "
                          f"1/(i+1)^skew; 0 picks uniformly [default: {DEFAULT_SKEW:g}]."),
        click.option("--turns", type=Number(1), default=None,
                     help="Mean turns per conversation (geometric); each turn's prompt is "
                          f"the whole previous turn plus a new message [default: "
                          f"{DEFAULT_TURNS:g} for conversations, 1 otherwise]."),
        click.option("--think-steps", type=NON_NEGATIVE, default=None,
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
                  think_steps: float | None = None,
                  policy: str = "fcfs") -> Collection[WorkItem]:
    """The workload file, or a generated workload that fits max_model_len (made as a
    run reads it: kvsched.generators.lazily), its priorities drawn from the mix given,
    else the default mix of a run under `policy` (kvsched.generators.priorities_for)."""
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
        mix = priorities_for(policy, parse_priorities(priorities)
                             if priorities is not None else None)
        shared = parse_lengths(system_prompts) if system_prompts is not None else None
        return lazily(generator, num_requests, seed, arrival=arrival, rate=rate,
                      max_model_len=max_model_len, priorities=mix, max_tokens=max_tokens,
                      system_prompts=shared, skew=skew, turns=turns,
                      think_steps=think_steps)
    except ValueError as e:
        fail(str(e))


def metrics_table(title: str, metrics: Metrics) -> Table:
    """The summary table of a run's or a trace's metrics."""
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in metrics.rows():
        table.add_row(name, value)
    return table


def open_trace(path: Path | str) -> IO[bytes]:
    """A trace file, gzip or zstd (found by its first bytes), or `-` for standard input."""
    try:
        return inputs.open_trace(str(path))
    except InputError as e:
        fail(str(e))
