"""Progress of long commands, on stderr: a rich bar on a terminal, a plain line every few
seconds elsewhere (a CI log), nothing with --no-progress.

`--progress` forces it off a terminal too, `--no-progress` silences it; by default it
shows on a terminal only. What is counted is what the command knows the total of: the
bytes of a trace read so far, or the requests that have ended.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    from rich.progress import Progress

PLAIN_EVERY_S = 5.0  # off a terminal, one line at most this often


class Reporter:
    """Counts towards `total` (None: unknown) and shows it as the mode says."""

    def __init__(self, what: str, total: int | None, console: Console, mode: bool | None,
                 unit: str = "bytes") -> None:
        self.what = what
        self.total = total
        self.console = console
        self.unit = unit
        self.done = 0
        self.enabled = console.is_terminal if mode is None else mode
        self.bar: Progress | None = None
        self.task: Any = None
        self.last_plain = time.monotonic()

    def __enter__(self) -> Reporter:
        if self.enabled and self.console.is_terminal:
            # Loaded only when a bar shows: a short command does not pay for it.
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                MofNCompleteColumn,
                Progress,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            columns: list[Any] = ["[progress.description]{task.description}", BarColumn()]
            columns.append(DownloadColumn() if self.unit == "bytes" else MofNCompleteColumn())
            columns += [TimeElapsedColumn(), TimeRemainingColumn()]
            self.bar = Progress(*columns, console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.what, total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()
        elif self.enabled and exc[0] is None:
            self._plain()  # a log ends with where the work ended

    def _plain(self) -> None:
        done = self.done
        of = f" of {self._amount(self.total)}" if self.total else ""
        share = f" ({done / self.total:.0%})" if self.total else ""
        self.console.print(f"{self.what}: {self._amount(done)}{of}{share}", markup=False,
                           highlight=False)

    def advance(self, n: int) -> None:
        self.set(self.done + n)

    def set(self, done: int) -> None:
        self.done = done
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(self.task, completed=done)
            return
        now = time.monotonic()
        if now - self.last_plain >= PLAIN_EVERY_S:
            self.last_plain = now
            self._plain()

    def _amount(self, n: int | None) -> str:
        if n is None:
            return "?"
        if self.unit == "bytes":
            return f"{n / 1e6:,.1f} MB"
        return f"{n:,} {self.unit}"


class CountingReader:
    """A binary stream that reports the bytes read through it."""

    def __init__(self, inner: Any, reporter: Reporter) -> None:
        self.inner = inner
        self.reporter = reporter
        self.pending = 0

    def _count(self, n: int) -> None:
        self.pending += n
        if self.pending >= 1 << 20:  # update at most once per MB read
            self.reporter.advance(self.pending)
            self.pending = 0

    def read(self, size: int = -1) -> bytes:
        data: bytes = self.inner.read(size)
        self._count(len(data))
        return data

    def readline(self, size: int = -1) -> bytes:
        line: bytes = self.inner.readline(size)
        self._count(len(line))
        return line

    def readinto(self, buffer: Any) -> int:
        n = self.inner.readinto(buffer)
        self._count(n or 0)
        return n or 0

    def close(self) -> None:
        self.inner.close()


@contextmanager
def reading(stream: IO[bytes], what: str, total: int | None, console: Console,
            mode: bool | None) -> Iterator[IO[bytes]]:
    """`stream`, counting the bytes read as progress towards `total`."""
    with Reporter(what, total, console, mode) as reporter:
        counting = CountingReader(stream, reporter)
        reader: Any = counting  # read as the binary stream it wraps
        yield reader
        reporter.advance(counting.pending)
