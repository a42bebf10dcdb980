"""A wall-clock limit on a run that kvsched drives (kvsched fuzz's examples, the pytest
plugin's runs), so that a scheduler that hangs inside one call (its factory, a
`schedule()` that never returns) ends the run instead of the whole command.

On the main thread the limit is a real-time timer (SIGALRM) that interrupts whatever
Python code runs then; elsewhere (a worker thread) it is only checked between steps
(`Deadline.check`). The timer's previous handler and its remaining time are restored on
the way out.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class OutOfTime(Exception):
    """The run went past its wall-clock limit."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"did not end within its wall-clock limit of {seconds:g} s")
        self.seconds = seconds


class Deadline:
    """`seconds` from now (None: no limit)."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.at = None if seconds is None else time.monotonic() + seconds

    def check(self) -> None:
        """Raise OutOfTime once the deadline has passed."""
        if self.at is not None and self.seconds is not None and time.monotonic() > self.at:
            raise OutOfTime(self.seconds)


@contextmanager
def deadline(seconds: float | None) -> Iterator[Deadline]:
    """A Deadline for the block; on the main thread also a timer that raises OutOfTime
    inside whatever the block is running when the time is up.

    pre: seconds is None or seconds > 0
    """
    limit = Deadline(seconds)
    timed = (seconds is not None and hasattr(signal, "setitimer")
             and threading.current_thread() is threading.main_thread())
    if not timed:
        yield limit
        return
    assert seconds is not None

    def expire(signum: int, frame: Any) -> None:
        raise OutOfTime(seconds)

    previous = signal.signal(signal.SIGALRM, expire)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    try:
        yield limit
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:  # an enclosing timer goes on with what it had left
            signal.setitimer(signal.ITIMER_REAL,
                             max(outer - (time.monotonic() - started), 1e-3))
