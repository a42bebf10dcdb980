"""The minimal reproduction of a failing trace: its shortest prefix that still fails.

The checker judges a step from the steps before it, so the first failing violation of a
trace (the earliest one at a level that fails it: MUST, PROFILE, and SHOULD with
--strict) shows again in the header plus the steps up to that one, and in no shorter
prefix. That prefix is checked again with the same options; only a violation that the
end of the trace shows (`completion`, on the `{"end": true}` line) needs the whole trace,
and then the reproduction is the whole trace. The lines are the trace's own, byte for
byte, blank lines left out; a compressed trace's reproduction is plain JSON Lines.

A trace that fails only because a `--require`d invariant could not be checked in full
has no violation to reproduce, and standard input cannot be read a second time: neither
gets a reproduction.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import PurePath
from typing import IO, Any

from kvsched.inputs import open_trace
from kvsched.spec.checker import Report
from kvsched.spec.violation import SHOULD, Violation


@dataclass(frozen=True)
class Reproduction:
    """Which prefix of a trace reproduces its first failure, and where it was written."""

    invariant: str
    step: int  # the step of the first failing violation
    steps: int | None  # the steps the prefix keeps; None: the whole trace, end line too
    of_steps: int  # the steps of the whole trace
    file: str | None = None  # where the prefix was written
    command: str | None = None  # the check that shows it again

    def describe(self) -> str:
        kept = ("the whole trace (the violation shows at its end line)"
                if self.steps is None
                else f"the header and the first {self.steps} of {self.of_steps} steps")
        return f"{self.invariant} at step {self.step}; {kept}"

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "invariant": self.invariant, "step": self.step,
                "steps": self.of_steps if self.steps is None else self.steps,
                "whole_trace": self.steps is None, "command": self.command}


def first_failure(report: Report) -> Violation | None:
    """The earliest violation that fails the trace (the first listed among a step's)."""
    failing = [v for v in report.violations if v.level != SHOULD or report.strict]
    return min(failing, key=lambda v: v.step, default=None)


def trace_lines(stream: IO[bytes], steps: int | None) -> Iterator[bytes]:
    """The header line and the first `steps` step lines (None: every line), each ending
    in a newline; blank lines are left out."""
    kept = -1  # the header is not a step
    for line in iter(stream.readline, b""):
        if not line.strip():
            continue
        if steps is not None and kept >= steps:
            return
        yield line if line.endswith(b"\n") else line + b"\n"
        kept += 1


class _LineStream(io.RawIOBase):
    """Lines as a readable binary stream, read as they are needed."""

    def __init__(self, lines: Iterator[bytes]) -> None:
        self.lines = lines
        self.pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.pending:
            line = next(self.lines, None)
            if line is None:
                return 0
            self.pending = line
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n


def reproduction(path: str, report: Report, recheck: Callable[[IO[bytes]], Report]
                 ) -> Reproduction | None:
    """The shortest failing prefix of the trace at `path` whose whole report is
    `report`; `recheck` checks a stream with the same options."""
    first = first_failure(report)
    if first is None or path == "-":
        return None
    steps = first.step + 1
    if steps <= report.steps:
        with open_trace(path) as trace:
            stream = io.BufferedReader(_LineStream(trace_lines(trace, steps)))
            again = first_failure(recheck(stream))
        if again is not None and (again.invariant, again.step) == (first.invariant,
                                                                    first.step):
            return Reproduction(first.invariant, first.step, steps, report.steps)
    return Reproduction(first.invariant, first.step, None, report.steps)


def write_prefix(path: str, repro: Reproduction, out: IO[bytes]) -> None:
    """Copy the reproduction's lines of the trace at `path` to `out`."""
    with open_trace(path) as trace:
        for line in trace_lines(trace, repro.steps):
            out.write(line)


def file_name(path: str) -> PurePath:
    """Where, under a reproduction directory, the reproduction of `path` goes: the same
    relative path (without a root or `..`), as plain `.jsonl`."""
    pure = PurePath(path)
    parts = [p for p in pure.parts if p not in ("..", ".", pure.anchor)]
    name = parts[-1] if parts else "trace"
    for suffix in (".gz", ".zst"):
        name = name.removesuffix(suffix)
    if not name.endswith(".jsonl"):
        name += ".jsonl"
    return PurePath(*parts[:-1], name)
