"""Memory settings for the length of a check or a simulation: numpy's large arrays kept
in the malloc heap, and the cyclic garbage collector paused."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
GLIBC_DEFAULT = 128 * 1024  # both thresholds' initial values in glibc


def _mallopt() -> Callable[[int, int], int] | None:
    if sys.platform != "linux":
        return None
    import ctypes  # here: the garbage collector's pause alone needs no ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn: Callable[[int, int], int] = libc.mallopt
    except (OSError, AttributeError):
        return None  # not glibc (musl has no mallopt)
    return fn


@contextmanager
def arrays_in_heap() -> Iterator[None]:
    """Keep numpy's arrays of a few megabytes in the malloc heap while a trace is checked.

    Each run allocates and frees dozens of arrays of megabytes. glibc maps each one
    with mmap and unmaps it when freed, so every run pays page faults and the zeroing of
    fresh pages again: a third of the checker's time on a 256-sequence engine's trace.
    Raising the mmap threshold (to glibc's largest, 32 MiB) and the trim threshold for
    the duration lets freed arrays be reused; both go back to glibc's initial values
    after. No effect where malloc is not glibc's."""
    mallopt = _mallopt()
    if mallopt is None:
        yield
        return
    mallopt(M_MMAP_THRESHOLD, 32 << 20)
    mallopt(M_TRIM_THRESHOLD, 256 << 20)
    try:
        yield
    finally:
        mallopt(M_MMAP_THRESHOLD, GLIBC_DEFAULT)
        mallopt(M_TRIM_THRESHOLD, GLIBC_DEFAULT)


@contextmanager
def no_cycle_collection() -> Iterator[None]:
    """Pause the cyclic garbage collector: a run keeps the parsed JSON of thousands of
    lines alive (lists, no cycles), which the collector would otherwise walk again and
    again, making parsing several times slower."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
