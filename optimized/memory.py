"""Memory settings for the length of a check or a simulation: the cyclic garbage
collector paused."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def no_cycle_collection() -> Iterator[None]:
    """Pause the cyclic garbage collector: a check or a simulation makes many short-lived
    objects (parsed JSON lines, lists, no cycles), which the collector would otherwise
    walk again and again, making parsing several times slower."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
