"""The driver of the vectorized checker: a trace's lines, read in order, become runs of
steps, and each run goes to the VectorizedChecker.

Step lines are read by the compiled scanner (kvsched.optimized.scan) straight into
columns; the lines it leaves alone (the header, aborts, rejections, preemptions and
swap-ins, unknown keys, escapes, long ids, anything odd, what follows the end) are read
as JSON here, one at a time, and either join the run (kvsched.optimized.lines
accepts them) or wait for the spec's parser.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from kvsched.optimized import scan as sc
from kvsched.optimized.exact import spec_alone
from kvsched.optimized.lines import parse_fast
from kvsched.optimized.runs import Part, Run, ScannedLines, part_of_step
from kvsched.optimized.vectorized import VectorizedChecker
from kvsched.spec.checker import Report
from kvsched.spec.should import DEFAULT_STALL_STEPS
from kvsched.spec.trace import (
    BLANK,
    MAX_LINE_BYTES,
    Header,
    TraceError,
    line_too_long,
    load_line,
    parse_header,
)

if TYPE_CHECKING:
    from kvsched.optimized.replay import CompiledReplay

RUN_STEPS = 2048  # most steps in one run
RUN_ENTRIES = 1 << 20  # most scheduled entries in one run
READ_BYTES = 1 << 24


class LineTooLong(Exception):
    """The stream holds a line longer than MAX_LINE_BYTES after the blocks yielded."""


def blocks_of(stream: IO[bytes]) -> Iterator[sc.Block]:
    """The stream in blocks of whole lines (each ending in a newline), then the last
    line if it has no newline, as a block of its own (its `last` set). A line longer
    than MAX_LINE_BYTES raises LineTooLong once the lines before it are yielded, having
    read at most READ_BYTES past the limit."""
    rest = b""
    while True:
        chunk = stream.read(READ_BYTES)
        if not chunk:
            break
        buf = bytearray(rest)
        buf += chunk
        cut = buf.rfind(b"\n") + 1
        # Only the first line of `buf` can be longer than a chunk: it began in `rest`.
        if cut and buf.find(b"\n", 0, MAX_LINE_BYTES + 1) < 0:
            raise LineTooLong
        rest = bytes(buf[cut:])
        if cut:
            yield sc.Block(buf, cut)
        if len(rest) > MAX_LINE_BYTES:
            raise LineTooLong
    if rest:
        yield sc.Block(bytearray(rest), len(rest), last=True)


class TraceDriver:
    """Reads one trace in order and hands its steps to a VectorizedChecker, a run at a time.

    Lines wait in `run` (as columns, for the vectorized rules) or in `slow` (JSON objects,
    for the spec's parser); at most one of the two is non-empty, so the lines are checked
    in order. A run ends before a step with aborts, rejections, preemptions or swap-ins
    (which starts the next run), where block ids come or go, at `run_steps` steps or
    RUN_ENTRIES scheduled entries, and after an idle step while requests are live
    (no-idle is checked on the state at the end of a run). Such a run goes to the spec's
    Checker, which counts the quiet steps of `progress` (kvsched.spec.should.Stall): a run
    the vectorized rules take has no quiet step while work waits, so after it the count
    is zero.
    """

    def __init__(self, max_preemptions: int, run_steps: int, scanner: sc.Scanner,
                 profile: str | None = None,
                 on_header: Callable[[Header], None] | None = None,
                 stall_steps: int = DEFAULT_STALL_STEPS) -> None:
        self.max_preemptions = max_preemptions
        self.stall_steps = stall_steps
        self.profile = profile  # replayed beside the checks (kvsched.optimized.replay)
        self.on_header = on_header
        self.replay: CompiledReplay | None = None
        self.run_steps = run_steps
        self.scanner = scanner
        self.vc: VectorizedChecker | None = None  # made when the header is read
        self.unknown: dict[str, int] = {}  # unknown step keys, at their first line
        self.run: list[Part] = []
        self.run_len = 0
        self.run_start = 0  # step number of the run's first line
        self.run_entries = 0
        self.run_live = 0  # live requests at the end of `run`, if it is correct
        self.run_blocks = 0  # whether the run's lines carry new_blocks
        self.run_quiet = False  # the run ends in an idle step while requests are live
        self.slow: list[tuple[int, Any]] = []
        self.slow_start = 0
        self.expected = 0  # the next step number, counting the lines waiting
        self.complete = False
        self.number = 0  # the number of the last line read
        self.as_json = 0  # lines read as JSON (the scanner reads the others)
        self.exact_only = False  # every step through the spec's Checker (exact.spec_alone)

    @property
    def checker(self) -> VectorizedChecker:
        assert self.vc is not None, "no header read yet"
        return self.vc

    def check(self, stream: IO[bytes]) -> Report:
        """Check the whole stream: the report, or the TraceError the spec would raise."""
        try:
            for block in blocks_of(stream):
                self._block(block)
        except LineTooLong:
            if self.vc is not None:
                self._flush()  # the lines before it first, as the spec's reader reads them
            raise line_too_long(self.number + 1) from None
        if self.vc is None:
            raise TraceError(1, "empty file: expected a trace header line")
        self._flush()
        report = self.vc.end(self.complete)
        report.unknown_keys = dict(self.unknown)
        report.profile = self.profile
        return report

    def stats(self) -> dict[str, int]:
        """What check_trace_vectorized's `stats` receive (after `check`)."""
        vc = self.checker
        return {"fast": vc.fast_runs, "exact": vc.exact_runs,
                "block_ids": int(vc.state.ids_seen),
                "free_blocks": int(vc.state.steps_with_free > 0),
                "as_json": self.as_json, "scanned": self.number - self.as_json}

    # -- one block of lines -----------------------------------------------------------

    def _block(self, block: sc.Block) -> None:
        pos = 0
        if block.last or self.vc is None or self.complete:
            # The header, what follows the end, and a last line without a newline: one
            # at a time (then the scanner takes the rest of the block).
            data = block.data
            while pos < block.size:
                cut = data.find(b"\n", pos, block.size) + 1 or block.size
                self.number += 1
                self._one_line(bytes(data[pos:cut]), self.number)
                pos = cut
                if self.vc is not None and not self.complete and not block.last:
                    break
        while pos < block.size:
            got = self.scanner(block, pos, block.size)
            lines = ScannedLines(block, got)
            R = got.lines.shape[0]
            bad = np.flatnonzero(~lines.ok)
            # Empty lines (just a newline) are skipped in bulk, as the spec's reader
            # skips blank lines: ten million of them must not cost a Python call each.
            empty = ~lines.ok & (got.lines[:, sc.L_END] == got.lines[:, sc.L_START])
            filled = np.flatnonzero(~empty) if empty.any() else None
            k = 0
            while k < R:
                if filled is not None and empty[k]:
                    nxt = filled[np.searchsorted(filled, k):][:1]
                    k = int(nxt[0]) if nxt.size else R
                    continue
                line = self.number + 1 + k
                if self.complete:
                    self.as_json += 1
                    if load_line(lines.raw(k), line) is not BLANK:
                        raise TraceError(line, 'nothing may follow the {"end": true} line')
                    k += 1
                    continue
                if lines.ok[k] and not self.exact_only:
                    nxt = bad[np.searchsorted(bad, k):][:1]
                    j = self._scanned(lines, k, int(nxt[0]) if nxt.size else R)
                    if j > k:
                        k = j
                        continue
                self._one_line(lines.raw(k), line)
                k += 1
            self._flush()
            self.number += R
            pos = got.end

    # -- runs -------------------------------------------------------------------------

    def _full(self) -> bool:
        return self.run_len >= self.run_steps or self.run_entries >= RUN_ENTRIES

    def _flush(self) -> None:
        """Check what waits: the run (vectorized, else by the spec) or the slow lines."""
        vc = self.checker
        replay = self.replay
        if self.run:
            whole = Run(self.run)
            if self.run_quiet or not vc.check_fast(whole):
                vc.check_exactly(whole.raws(), self.run_start, self.unknown)
            if replay is not None:
                replay.run(self.run)
                replay.place(vc.report)
            self.run = []
            self.run_len = self.run_entries = 0
            self.run_quiet = False
        if self.slow:
            vc.check_exactly(self.slow, self.slow_start, self.unknown)
            if replay is not None:
                replay.lines(self.slow)
                replay.place(vc.report)
            self.slow = []

    def _start_run(self, blocks: int) -> None:
        self.run_start = self.expected
        self.run_live = self.checker.live
        self.run_blocks = blocks

    def _one_line(self, raw: bytes, line: int) -> None:
        """A line the scanner left alone (or a header, or past the end): read as JSON."""
        self.as_json += 1
        if self.vc is None:
            obj = load_line(raw, line)
            if obj is not BLANK:
                header = parse_header(obj, line)
                if self.on_header is not None:
                    self.on_header(header)
                self.vc = VectorizedChecker(header.config, self.max_preemptions,
                                            preempted_order=header.preempted_order,
                                            stall_steps=self.stall_steps)
                if self.profile is not None:
                    from kvsched.optimized.replay import CompiledReplay

                    self.replay = CompiledReplay(self.profile, header.config,
                                                 header.preempted_order)
                # A prefix-caching trace, or one under an allocation or a watermark scope
                # the vectorized rules do not know, goes to the spec's Checker line by line.
                self.exact_only = spec_alone(header.config)
            return
        if self.complete:
            if load_line(raw, line) is not BLANK:
                raise TraceError(line, 'nothing may follow the {"end": true} line')
            return
        try:
            obj = load_line(raw, line)
        except TraceError:
            self._flush()  # the lines before it are checked first, as the spec's reader does
            raise
        if obj is BLANK:
            return
        if type(obj) is dict and obj.get("end") is True and "step" not in obj:
            self._flush()
            self.complete = True
            return
        st = None if self.exact_only else parse_fast(obj, line, self.expected, raw)
        if st is None:
            if self.run:
                self._flush()
            if not self.slow:
                self.slow_start = self.expected
            self.slow.append((line, obj))
            self.expected += 1  # if the line is bad, the spec's parser raises before it matters
            return
        if self.slow:
            self._flush()
        for key in st.unknown_keys:
            if key not in self.unknown:
                self.unknown[key] = line
        blocks = int(st.new_blocks is not None)
        # A run starts at a step with rare events and where block ids come or go.
        if self.run and (st.rare or blocks != self.run_blocks or self._full()):
            self._flush()
        if not self.run:
            self._start_run(blocks)
        self.run.append(part_of_step(st))
        self.run_len += 1
        self.run_entries += len(st.scheduled)
        self.run_live += (len(st.arrivals) - len(st.finished) - len(st.aborted)
                          - len(st.rejected))
        self.expected += 1
        if st.idle and self.run_live > 0:
            self.run_quiet = True
            self._flush()  # no-idle is checked on the state at the end of a run

    def _scanned(self, lines: ScannedLines, k: int, j: int) -> int:
        """Take lines k.. of a stretch the scanner read (up to j), as one part: as many
        as fit the run. Returns the next line to look at."""
        rows = lines.rows
        steps = rows[k:j, sc.L_STEP]
        wrong = np.flatnonzero(steps != self.expected + np.arange(j - k))
        if wrong.size:
            j = k + int(wrong[0])  # that line is read as JSON (and found wrong) next
            if j == k:
                return k
        blocks = int(rows[k, sc.L_BLOCKS])
        if self.slow or (self.run and (blocks != self.run_blocks or self._full())):
            self._flush()
        if not self.run:
            self._start_run(blocks)
        j = min(j, k + self.run_steps - self.run_len)
        change = np.flatnonzero(rows[k:j, sc.L_BLOCKS] != blocks)
        if change.size:
            j = k + int(change[0])
        ent = rows[k:j, sc.L_ENT]
        before = self.run_entries + np.cumsum(ent) - ent
        over = np.flatnonzero(before >= RUN_ENTRIES)
        if over.size:
            j = k + int(over[0])
        live = self.run_live + np.cumsum(rows[k:j, sc.L_ARR] - rows[k:j, sc.L_FIN])
        idle = np.flatnonzero((rows[k:j, sc.L_ENT] == 0) & (live > 0))
        cut = idle.size > 0
        if cut:
            j = k + int(idle[0]) + 1
        first_line = self.number + 1 + k
        self.run.append(lines.part(k, j, first_line))
        self.run_len += j - k
        self.run_entries += int(rows[k:j, sc.L_ENT].sum())
        self.run_live = int(live[j - k - 1])
        self.expected += j - k
        if cut:
            self.run_quiet = True
            self._flush()
        return j
