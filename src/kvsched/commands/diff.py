"""`kvsched diff A B`: the audit of a scheduler change.

Loaded when the command is named (kvsched.cli.Group).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson

from kvsched import __version__
from kvsched.commands.options import (
    WORKLOAD_PARAMS,
    atomic_output,
    build_config,
    config_options,
    dumps_line,
    err,
    fail,
    load_workload,
    open_trace,
    out,
    profile_note,
    progress_option,
    stall_option,
    trace_size,
    workload_options,
)
from kvsched.outputs import check_writable
from kvsched.progress import Reporter, reading
from kvsched.spec.profiles import DEFAULT_PROFILE, UnknownProfile, get_profile, resolve_profile
from kvsched.spec.trace import TraceError, TraceReader, TraceWriter
from kvsched.spec.violation import DEFAULT_MAX_PREEMPTIONS

if TYPE_CHECKING:
    pass


TRACE_SUFFIXES = (".jsonl", ".json", ".ndjson")


def diff_side_kind(text: str, which: str) -> str:
    """"trace", "profile" or "factory": what the argument A or B names."""
    from kvsched.loading import is_factory_spec

    path = Path(text)
    if path.is_dir():
        fail(f"{which}: {text}: is a directory; expected a trace file")
    if path.exists():
        return "trace"
    try:
        resolve_profile(text)
        return "profile"
    except UnknownProfile as e:
        not_profile = str(e)
    if is_factory_spec(text):
        return "factory"
    if path.suffix in TRACE_SUFFIXES or "/" in text:
        fail(f"{which}: {text}: no such trace file")
    fail(f"{which}: {text!r} is neither a trace file, a profile nor module:factory "
         f"({not_profile})")


def kept(writer: TraceWriter | None, reporter: Reporter | None
         ) -> Callable[[list[bytes], int], None]:
    """A run's on_lines: its lines to `writer` (--out-a, --out-b), the requests they
    ended to `reporter` (A's tell how far the diff is)."""
    def on_lines(raws: list[bytes], ended: int) -> None:
        if writer is not None:
            writer.encoded(b"".join(raws))
        if reporter is not None and ended:
            reporter.advance(ended)
    return on_lines


@click.command("diff")
@click.argument("a")
@click.argument("b")
@config_options
@workload_options
@click.option("--out-a", type=click.Path(path_type=Path), default=None,
              help="Schedulers: keep A's trace here.")
@click.option("--out-b", type=click.Path(path_type=Path), default=None,
              help="Schedulers: keep B's trace here.")
@click.option("--max-steps", type=int, default=None,
              help="Schedulers: stop each run after this many steps.  [default: the "
                   "workload's step bound, four times the tokens it can need; a run still "
                   "going there is reported as never ending]")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=None,
              help="Draw both sides over time (queues, KV use, preemptions) as a PNG.")
@click.option("--max-preemptions", type=int, default=DEFAULT_MAX_PREEMPTIONS, show_default=True,
              help="no-thrash: most preemptions of one request.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@stall_option
@progress_option
@click.pass_context
def diff_command(ctx: click.Context, /, a: str, b: str, workload_path: Path | None,
                 generator: str, num_requests: int, arrival: str, priorities: str | None,
                 max_tokens: int | None, rate: float, seed: int, system_prompts: str | None,
                 skew: float | None, turns: float | None, think_steps: float | None,
                 out_a: Path | None,
                 out_b: Path | None, max_steps: int | None, plot_path: Path | None,
                 max_preemptions: int, fmt: str, stall_steps: int, progress: bool | None,
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
    per invariant on each side, and metric deltas. A scheduler's run that gets stuck
    (--stall-steps steps in a row change nothing while requests wait) stops there and
    is reported with the waiting requests; one that reaches --max-steps with work left
    is reported as stopped there.

    \b
    Exit codes: 0 no divergence, 1 the two sides diverge or a run got stuck, 2 bad input.
    """
    from contextlib import ExitStack

    from kvsched.diff import (
        SideFailed,
        Stream,
        diff_streams,
        plot_png,
        render_text,
        simulated,
        trace_stream,
    )
    from kvsched.loading import FactoryError, build, load_factory
    from kvsched.plot import PlotUnavailable, require_matplotlib
    from kvsched.simulate import aborts_refusal
    from kvsched.spec.interface import Scheduler

    kinds = (diff_side_kind(a, "A"), diff_side_kind(b, "B"))
    # A release names its profile (vllm-v1@0.27.1 is vllm-v1@0.24): runs say the profile.
    a, b = (resolve_profile(text) if kind == "profile" else text
            for text, kind in zip((a, b), kinds, strict=True))
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
    if max_steps is not None and max_steps < 1:
        fail(f"--max-steps must be at least 1, got {max_steps}")
    for path in (out_a, out_b, plot_path):
        if path is not None:
            check_writable(path)  # before the runs, not after them
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
                streams.append(trace_stream(text, reader))
            sa, sb = streams
        else:
            configs = [build_config(text if kind == "profile" else DEFAULT_PROFILE,
                                    config_given) for text, kind in zip((a, b), kinds,
                                                                        strict=True)]
            workload = load_workload(min(c.max_model_len for c in configs), workload_path,
                                     generator, num_requests, arrival, priorities,
                                     max_tokens, rate, seed, system_prompts, skew, turns,
                                     think_steps,
                                     "priority" if any(c.policy == "priority"
                                                       for c in configs) else "fcfs")
            sides: list[tuple[Stream, TraceWriter | None]] = []
            reporter = stack.enter_context(Reporter("diffing", len(workload), err, progress,
                                                    unit="requests"))
            scheduler: Scheduler
            for text, kind, config, keep in zip((a, b), kinds, configs, (out_a, out_b),
                                                strict=True):
                if kind == "profile":
                    from kvsched.implementations import build_scheduler, chosen_scheduler

                    profile = get_profile(text)
                    implementation = chosen_scheduler("auto", config, profile.knobs,
                                                      profile.scheduler)
                    scheduler = build_scheduler(implementation, config, profile.knobs,
                                                profile.scheduler)
                    label = f"{text} ({implementation})"
                    engine = {"name": f"kvsched-{implementation}", "version": __version__,
                              "profile": text}
                else:
                    label = text
                    engine = {"name": text}
                    try:
                        scheduler = build(load_factory(text), config, text)
                    except FactoryError as e:
                        fail(str(e))
                    except Exception as e:
                        # No scheduler was built, so there is no run to compare: bad
                        # input, as kvsched fuzz counts it (a crash mid-run is exit 1).
                        fail(f"{text}: the factory raised {type(e).__name__}: "
                             + (str(e).strip().splitlines() or [""])[0])
                refused = aborts_refusal(scheduler, workload)
                if refused is not None:
                    fail(f"{text}: {refused}")
                writer = None
                if keep is not None:
                    writer = TraceWriter(stack.enter_context(atomic_output(keep)),
                                         dumps_line)
                    writer.header(config, engine)
                sides.append((simulated(label, scheduler, workload, engine,
                                        max_steps=max_steps,
                                        on_lines=kept(writer, reporter if not sides
                                                      else None),
                                        stall_steps=stall_steps), writer))
            (sa, writer_a), (sb, writer_b) = sides
        try:
            result = diff_streams(sa, sb, series=plot_path is not None,
                                  max_preemptions=max_preemptions, stall_steps=stall_steps)
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
    sys.exit(1 if result.diverged or result.stuck else 0)
