"""A vectorized trace checker with the spec checker's verdicts, for very large traces.

NOTE on the method. The spec's checker (kvsched.spec.checker) replays a trace one step
and one request at a time in Python. This one reads the trace in runs of steps and
checks a whole run at once with numpy: the scheduled entries of the run are grouped by
request, and the spec's bookkeeping becomes prefix sums within each request (computed
tokens, known tokens, sampled tokens, blocks held) and across steps (tokens and new
blocks per step, free blocks, running requests), against which every MUST and SHOULD
invariant is one vectorized comparison. Block ids are checked by sorting the handed-out
ids by (block, step): each must have been free when given.

Reading. Step lines are read by a compiled scanner (kvsched.optimized.scan) straight
into numpy columns, ids as keys (an id of at most 16 plain ASCII bytes is its own key,
found in an open-addressing table of the known ids). Lines it leaves alone (aborts,
rejections, preemptions and swap-ins, unknown keys, escapes, long ids, anything odd)
are read as JSON by the spec's strict line reader (kvsched.spec.trace.load_line) and
checked field by field, or handed to the spec's parser.
The cyclic garbage collector pauses while a trace is checked.

A run holds at most one step with aborts, rejections, preemptions or swap-ins, its
first, whose few events are applied one by one (as the spec does) before the rest is
vectorized. A run that breaks any invariant (or holds anything unusual: malformed input,
unknown ids) is checked again, from the same state, by the spec's own Checker, which
then reports exactly what it would have reported: same counts, same first violations,
same errors. So the verdicts agree by construction wherever a violation is possible, and
the fast path only has to be right on runs that it finds clean, which the
differential tests (tests/test_checkers_agree.py) check on correct and seeded-bug traces.

The parts, in the order a line meets them:
- driver.py: the stream in blocks, lines into runs (TraceDriver);
- scan.py: the compiled scanner; lines.py: the lines it leaves, read as JSON;
- ids.py: ids as keys and their table; runs.py: a run's lines as columns;
- vectorized.py: VectorizedChecker, which checks each run by
  kernel.py (the vectorized rules, on the state of columns.py) or, when they do not
  find it clean, by the spec's Checker through exact.py, the only module that knows how
  that Checker keeps its state;
- memory.py: the allocator and garbage collector settings while a check runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO

from kvsched.optimized import scan as sc
from kvsched.optimized.driver import RUN_STEPS, TraceDriver
from kvsched.optimized.ids import IdTable, id_key
from kvsched.optimized.memory import arrays_in_heap, no_cycle_collection
from kvsched.optimized.vectorized import VectorizedChecker
from kvsched.spec import should
from kvsched.spec.checker import Report
from kvsched.spec.trace import Header

__all__ = ["SCAN_ENTRIES", "SCAN_LINES", "IdTable", "VectorizedChecker",
           "check_trace_vectorized", "id_key"]

SCAN_LINES, SCAN_ENTRIES = 1 << 14, 1 << 20  # the scanner's output buffers


def check_trace_vectorized(stream: IO[bytes],
                           max_preemptions: int = should.DEFAULT_MAX_PREEMPTIONS,
                           run_steps: int = RUN_STEPS,
                           stats: dict[str, int] | None = None,
                           profile: str | None = None,
                           on_header: Callable[[Header], None] | None = None,
                           stall_steps: int = should.DEFAULT_STALL_STEPS) -> Report:
    """Check a trace (a binary stream) as `kvsched.spec.checker.check_trace` does with a
    TraceReader: the same Report, or the same TraceError. With `profile`, its
    decisions are replayed beside by the compiled scheduler (kvsched.optimized.replay),
    as kvsched.conformance.checker replays them with the reference: the same
    divergence. `on_header` sees the header once it is read. `stats`, if
    given, receives how many runs were checked vectorized ("fast") and how many by the
    spec's checker ("exact"), whether step 0 carries new_blocks ("block_ids") and some
    step reports free_blocks ("free_blocks"), as 1 or 0, and how many lines the compiled
    scanner read ("scanned") and how many were read as JSON ("as_json"); with a profile,
    how many runs the compiled scheduler replayed by itself ("replayed_fast") and how
    many steps went through the spec's ProfileReplay ("replayed_slow")."""
    with no_cycle_collection(), arrays_in_heap():
        driver = TraceDriver(max_preemptions, run_steps,
                             sc.Scanner(SCAN_LINES, SCAN_ENTRIES), profile, on_header,
                             stall_steps)
        report = driver.check(stream)
        if stats is not None:
            stats.update(driver.stats())
            if driver.replay is not None:
                stats["replayed_fast"] = driver.replay.fast_runs
                stats["replayed_slow"] = driver.replay.slow_steps
    return report
