"""`kvsched metrics TRACE`: throughput, TTFT/TPOT, KV use, preemptions of a trace.

Loaded when the command is named (kvsched.cli.Group).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
import orjson

from kvsched.commands.options import (
    atomic_output,
    err,
    fail,
    metrics_table,
    open_trace,
    out,
    progress_option,
    trace_size,
)
from kvsched.outputs import check_writable
from kvsched.progress import reading
from kvsched.spec.trace import TraceError
from kvsched.verdict import printable


@click.command()
@click.argument("trace")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=None,
              help="Draw the trace over time (queues, KV use, preemptions, TTFT and TPOT) "
                   "as a PNG.")
@progress_option
def metrics(trace: str, fmt: str, plot_path: Path | None, progress: bool | None) -> None:
    """Throughput, TTFT and TPOT percentiles, queue lengths, KV use, preemptions."""
    from kvsched.implementations import note_spec_reading
    from kvsched.metrics import metrics_of_trace
    from kvsched.plot import PlotUnavailable, metrics_png, require_matplotlib
    if plot_path is not None:
        check_writable(plot_path)  # before the trace is read, not after
        try:
            require_matplotlib()
        except PlotUnavailable as e:
            fail(str(e))
    note_spec_reading("metrics")
    with open_trace(trace) as raw, reading(raw, "reading", trace_size(trace), err,
                                           progress) as stream:
        try:
            result = metrics_of_trace(stream, series=plot_path is not None)
        except TraceError as e:
            fail(f"{trace}: {e}")
    if plot_path is not None:
        with atomic_output(plot_path) as png:
            png.write(metrics_png(result, f"kvsched metrics: {printable(trace)}"))
    if fmt == "json":
        sys.stdout.write(orjson.dumps(result.as_dict(), option=orjson.OPT_INDENT_2).decode()
                         + "\n")
        return
    out.print(metrics_table(f"kvsched metrics: {trace}", result))
    if plot_path is not None:
        out.print(f"plot written to {plot_path}")
