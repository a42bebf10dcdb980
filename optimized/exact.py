"""The bridge to the spec's checker (kvsched.spec.checker): the only module that knows
how that checker keeps its replay state.

A run of steps that the vectorized rules do not find clean is checked by the spec's own
Checker, from the same state, so that it reports exactly what it would have reported.
`SpecBridge` hands the columns' state (kvsched.optimized.columns) to that Checker
(`to_exact`), feeds it the run's lines, and reads the state back (`from_exact`). The
report and the ids that have ended live in the spec's Checker throughout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kvsched.optimized.columns import CODE_OF, STATUS_OF, Columns
from kvsched.spec.checker import Checker, CheckOptions, Report
from kvsched.spec.model import Config, Request, Status, StepRecord
from kvsched.spec.should import DEFAULT_STALL_STEPS
from kvsched.spec.state import LiveRequest
from kvsched.spec.trace import STEP_KEYS, TraceError, load_line, parse_step


def spec_alone(config: Config) -> bool:
    """Whether every step of a trace under `config` goes to the spec's Checker: the
    vectorized rules know neither prefix caching nor an allocation other than lazy or a
    watermark that applies when nothing runs, so under those configs the verdict is the
    spec's own, step by step."""
    return (config.prefix_caching or config.allocation != "lazy"
            or config.watermark_scope != "running")


class SpecBridge:
    """The spec's Checker beside the columns of `state`, and the hand-over between them."""

    def __init__(self, state: Columns, max_preemptions: int, keep: int,
                 preempted_order: bool = True,
                 stall_steps: int = DEFAULT_STALL_STEPS) -> None:
        self.state = state
        self.alone = spec_alone(state.config)
        # The kernel's needed-preemption test asks about the last victim only; where the
        # victims are a set that is stricter, so a run it passes passes here too.
        self.checker = Checker(state.config, CheckOptions(max_preemptions=max_preemptions,
                                                          keep=keep, stall_steps=stall_steps),
                               None, preempted_order)

    @property
    def report(self) -> Report:
        return self.checker.report

    @property
    def ended(self) -> Mapping[str, Status]:
        """The ids that have ended, and how."""
        return self.checker.state.ended

    def add_ended(self, ended: Mapping[str, Status]) -> None:
        self.checker.state.ended.update(ended)

    def moved(self) -> None:
        """A run checked by the vectorized rules: none of its steps was quiet while work
        waited (the driver hands such a run to the Checker), so no stall goes on."""
        self.checker.stall.quiet = 0

    def check_lines(self, steps: list[tuple[int, Any]], expected: int,
                    unknown_keys: dict[str, int]) -> int:
        """Check lines (number, JSON object, or the raw bytes of a line read as the spec's
        reader reads it) with the spec's parser and Checker; returns the next expected
        step number."""
        state = self.state
        ended = self.checker.state.ended
        before = state.live_indices()
        first_new = len(state.ids)
        self.to_exact()
        for line, given in steps:
            rec = self._parse(line, given, expected, unknown_keys)
            expected += 1
            if not self.alone:
                # The arrivals get their columns first (the Checker then moves them).
                fresh = [r for r in rec.arrivals if r.id not in state.index and r.id not in ended]
                if len({r.id for r in fresh}) == len(fresh):
                    state.register(fresh)
                else:
                    state.register(list({r.id: r for r in reversed(fresh)}.values())[::-1])
            self.checker.step(rec)
        self.from_exact(np.concatenate((before, np.arange(first_new, len(state.ids)))))
        return expected

    @staticmethod
    def _parse(line: int, given: Any, expected: int, unknown_keys: dict[str, int]) -> StepRecord:
        """One line through the spec's parser, as step number `expected`."""
        obj = load_line(given, line) if isinstance(given, bytes) else given
        rec = parse_step(obj, line)
        if rec.step != expected:
            raise TraceError(line, f"expected step {expected}, got {rec.step} "
                                   "(steps are numbered from 0 without gaps)")
        for key in obj:
            if key not in STEP_KEYS and key not in unknown_keys:
                unknown_keys[key] = line
        return rec

    def end(self, complete: bool) -> Report:
        self.to_exact()
        return self.checker.end(complete)

    def to_exact(self) -> None:
        """Give the spec's Checker the state of the columns."""
        if self.alone:
            return
        ex = self.checker
        st = ex.state
        s = self.state
        c = s.cols
        live: dict[str, LiveRequest] = {}
        owned: dict[int, list[int]] = {}
        st.holders = {}
        first = s.config.first_block_id
        if s.ids_seen:
            holder = s.holder
            ok = holder >= 0
            blocks = np.flatnonzero(ok)
            owners = holder[blocks]
            current = s.holder_gen[blocks] == c["GEN"][owners]
            for b, ri in zip(blocks[current].tolist(), owners[current].tolist(), strict=True):
                st.holders[b + first] = [s.ids[ri]]
                owned.setdefault(ri, []).append(b + first)
        count = dict.fromkeys(Status, 0)
        for ri in s.live_indices().tolist():
            rid = s.ids[ri]
            status = STATUS_OF[int(c["STATUS"][ri])]
            count[status] += 1
            live[rid] = LiveRequest(
                Request(rid, int(c["P"][ri]), int(c["O"][ri]), int(c["PRIO"][ri]),
                        int(c["ARR"][ri])),
                status, int(c["N"][ri]), int(c["C"][ri]),
                int(c["G"][ri]), int(c["H"][ri]), int(c["PRE"][ri]), owned.get(ri, []),
                bool(c["RECOMP"][ri]))
        st.live, st.count = live, count
        st.free, st.free_host = s.free, s.free_host
        st.ids_seen = s.ids_seen
        st.ids_missing_from = s.ids_missing_from if s.ids_missing_from >= 0 else None
        ex.leaked, ex.step_no, ex.steps_with_free = s.leaked, s.step_no, s.steps_with_free

    def from_exact(self, before: np.ndarray) -> None:
        """Read the state back into the columns; `before` are the requests that were live
        before, or arrived since."""
        if self.alone:
            return
        ex = self.checker
        st = ex.state
        s = self.state
        c = s.cols
        for ri in before.tolist():
            rid = s.ids[ri]
            if rid not in st.live:
                c["STATUS"][ri] = CODE_OF[st.ended[rid]]
                c["G"][ri] = c["H"][ri] = 0
                c["GEN"][ri] += 1
        for rid, t in st.live.items():
            ri = s.index[rid]
            c["N"][ri], c["C"][ri], c["G"][ri], c["H"][ri] = (t.num_tokens, t.num_computed,
                                                             t.gpu_blocks, t.host_blocks)
            c["PRE"][ri], c["RECOMP"][ri] = t.preemptions, int(t.recomputing)
            c["STATUS"][ri] = CODE_OF[t.status]
            c["GEN"][ri] += 1
        s.holder.fill(-1)
        first = s.config.first_block_id
        for b, held in st.holders.items():
            ri = s.index[held[0]]
            s.holder[b - first] = ri
            s.holder_gen[b - first] = c["GEN"][ri]
        s.free, s.free_host, s.running = st.free, st.free_host, st.running
        s.ids_seen = st.ids_seen
        s.ids_missing_from = -1 if st.ids_missing_from is None else st.ids_missing_from
        s.leaked, s.step_no, s.steps_with_free = ex.leaked, ex.step_no, ex.steps_with_free
        s.live = len(st.live)
