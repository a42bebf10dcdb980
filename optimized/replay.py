"""A profile replayed by the compiled scheduler beside the vectorized checker.

PROFILE level is the spec's (kvsched.spec.replay.ProfileReplay): the profile's scheduler
replays the trace's inputs and must decide as the trace did, step by step; the first
divergence is reported with both decisions and the state that led to it. Here the
profile's scheduler is the compiled one (kvsched.optimized.compiled, the reference's
decisions), and the steps come as the vectorized checker reads them:

- a run's steps are replayed and compared inside the compiled scheduler: the parts the
  compiled scanner read (plain steps: arrivals, scheduled entries, finishes; ids as
  keys) with no Python object per entry (`replay_part`), a line read as JSON (a step
  with aborts, rejections, preemptions or swap-ins) from its lists (`replay_step`);
- the lines the spec's checker reads itself (odd lines, and every line of a trace it
  checks alone: prefix caching, other allocations) go through the spec's ProfileReplay
  as StepRecords, with the compiled scheduler behind it.

Same verdicts by construction: before each run the scheduler is copied; where the
compiled comparison finds a difference, the run is replayed again from the copy through
ProfileReplay, which then reports exactly what it reports on the spec's path (or,
finding none, simply goes on from there). The divergence joins the report where the
spec's checker would have put it: after every violation of the steps up to its own.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from kvsched.optimized.compiled import CompiledScheduler
from kvsched.optimized.ids import id_key
from kvsched.optimized.runs import Part
from kvsched.spec.checker import Report
from kvsched.spec.model import Config, StepRecord
from kvsched.spec.profiles import get_profile
from kvsched.spec.replay import ProfileReplay
from kvsched.spec.trace import load_line, parse_step

NO_KEYS = np.zeros((0, 2), dtype=np.int64)


class CompiledReplay:
    """ProfileReplay of `profile` on `config` with the compiled scheduler, fed a run's
    parts (`part`) or single records (`record`)."""

    def __init__(self, profile: str, config: Config, preempted_order: bool = True) -> None:
        self.profile = profile
        self.spec = ProfileReplay(profile, CompiledScheduler(config, get_profile(profile).knobs),
                                  preempted_order)
        self.fast_runs = 0
        self.slow_steps = 0
        self.placed = False

    @property
    def scheduler(self) -> CompiledScheduler:
        scheduler = self.spec.scheduler
        assert isinstance(scheduler, CompiledScheduler)
        return scheduler

    @property
    def diverged(self) -> bool:
        return self.spec.divergence is not None

    def record(self, rec: StepRecord) -> None:
        """One step through the spec's ProfileReplay."""
        if self.diverged:
            return
        self.slow_steps += 1
        self.spec.step(rec)
        scheduler = self.scheduler
        for r in rec.arrivals:  # the keys the scanner's later lines name them by
            key = id_key(r.id)
            if key is not None:
                # An arrival that ended in its first step (rejected) is not live.
                with contextlib.suppress(KeyError):
                    scheduler.set_key(r.id, *key)

    def lines(self, lines: list[tuple[int, Any]]) -> None:
        """Lines (number, JSON object or raw bytes), each through `record`."""
        for line, given in lines:
            if self.diverged:
                return
            obj = load_line(given, line) if isinstance(given, bytes) else given
            self.record(parse_step(obj, line))

    def run(self, parts: list[Part]) -> None:
        """A run's parts, compared in the compiled scheduler (`replay_part` for what the
        scanner read, `replay_step` for a line read as JSON); where it finds a
        difference, the run again from a copy made at its start, through the spec's
        comparison: its verdict, in its words."""
        if self.diverged:
            return
        mark = self.scheduler.copy()
        for part in parts:
            if not self._fast(part):
                self.spec.scheduler = mark
                for again in parts:
                    self.lines(again.raws())
                return
        self.fast_runs += 1

    def _fast(self, part: Part) -> bool:
        scheduler = self.scheduler
        st = part.read
        if st is not None:
            same = scheduler.replay_step(st.arrivals, st.aborted, st.rejected, st.preempted,
                                         st.swapped_in, st.scheduled, st.finished,
                                         self.spec.preempted_order)
            if same:
                for r in st.arrivals:  # the keys the scanner's later lines name them by
                    key = id_key(r.id)
                    if key is not None:
                        with contextlib.suppress(KeyError):  # not live: ended in its step
                            scheduler.set_key(r.id, *key)
            return same
        return scheduler.replay_part(
            part.steps, part.n_arr, part.n_ent, part.n_fin,
            part.arr_keys if part.arr_keys is not None and len(part.arr_ids) else NO_KEYS,
            part.arr_ids, part.arr_num, part.ent_ids, part.ent_n,
            part.fin_ids if len(part.fin_ids) else NO_KEYS) < 0

    def place(self, report: Report) -> None:
        """Put the divergence, once found, where the spec's checker reports it."""
        v = self.spec.divergence
        if v is None or self.placed:
            return
        self.placed = True
        report.counts["profile"] += 1
        at = len(report.violations)
        while at > 0 and report.violations[at - 1].step > v.step:
            at -= 1
        report.violations.insert(at, v)


