"""VectorizedChecker: a trace checked as the spec's Checker checks it, a run of steps at a
time, each run by the vectorized rules (kvsched.optimized.kernel) or, when they do not
find it clean, by the spec's own Checker (kvsched.optimized.exact)."""

from __future__ import annotations

from typing import Any

from kvsched.optimized.columns import Columns, Undo
from kvsched.optimized.exact import SpecBridge
from kvsched.optimized.kernel import Unusual, check_run
from kvsched.optimized.runs import Run
from kvsched.spec import should
from kvsched.spec.checker import Report
from kvsched.spec.model import Config, Status


class VectorizedChecker:
    """Checks a trace as `kvsched.spec.checker.Checker` does, a run of steps at a time.

    The live requests are numpy columns (`state`); the spec's Checker (behind `spec`)
    keeps the report and the ended ids, and takes the state (and hands it back) around
    the runs it checks itself.
    """

    def __init__(self, config: Config, max_preemptions: int = should.DEFAULT_MAX_PREEMPTIONS,
                 keep: int = 20, preempted_order: bool = True,
                 stall_steps: int = should.DEFAULT_STALL_STEPS) -> None:
        self.config = config
        self.max_preemptions = max_preemptions
        self.state = Columns(config)
        self.spec = SpecBridge(self.state, max_preemptions, keep, preempted_order,
                               stall_steps)
        self.fast_runs = 0
        self.exact_runs = 0

    @property
    def report(self) -> Report:
        return self.spec.report

    @property
    def live(self) -> int:
        """Live requests."""
        return self.state.live

    def check_exactly(self, steps: list[tuple[int, Any]], expected: int,
                      unknown_keys: dict[str, int]) -> int:
        """Check lines (number, JSON object, or the raw bytes of a line read as the spec's
        reader reads it) with the spec's parser and Checker; returns the next expected
        step number."""
        self.exact_runs += 1
        return self.spec.check_lines(steps, expected, unknown_keys)

    def check_fast(self, run: Run) -> bool:
        """Check a run with the vectorized rules; False (and no change) if the spec's
        checker must check it."""
        mark = self.state.mark()
        undo: Undo = []
        ended: dict[str, Status] = {}
        try:
            ok = check_run(self.state, run, self.spec.ended, self.max_preemptions, undo,
                           ended)
        except (Unusual, OverflowError):
            ok = False
        if not ok:
            self.state.rollback(mark, undo)
            return False
        self.fast_runs += 1
        self.spec.add_ended(ended)
        self.spec.moved()
        report = self.spec.report
        report.steps += run.T
        report.scheduled_entries += int(run.n_ent.sum())
        report.requests += len(run.arr_ids)
        return True

    def end(self, complete: bool) -> Report:
        return self.spec.end(complete)
