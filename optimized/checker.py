"""The fast trace checker: the spec checker's verdicts, at compiled speed.

NOTE on the method. The spec's checker (kvsched.spec.checker) moves the spec's state
(spec/state.py) through a trace one step at a time and judges each step with the
invariants of must.py and should.py, all in Python. This one reads the step lines with
orjson and moves a compiled twin of that state (kvsched.optimized.state.FastState:
State.apply and every condition `judge` evaluates, in Cython compiled to C++) which
answers one question per step: is it clean, that is, would the spec read the line alike
and flag nothing? Lines are taken in runs (at most `run_steps`). Before a run the
compiled state keeps a copy of itself (`FastState.save`). While every step is clean the
spec's Checker only counts them (`Checker.passed`) and learns which ids ended
(`State.record_ended`). A step whose only flag is no-thrash (a victim preempted once
more than the limit: what a correct engine under memory pressure most often shows) is
taken as clean too, and each such victim is told with the spec's own violation
(`should.thrashed`), so a handover, whose cost grows with the live requests, stays for
what is rare. At the first step that is not clean (a violation, a line the
compiled reader does not accept, anything it does not handle) the compiled state goes
back to the copy, moves again through the run's clean steps, and hands its state to
the spec's Checker as the spec's own value (a kvsched.spec.checker.Position, through
`Checker.seek`), which checks that one line itself, with
the spec's parser (so malformed input raises the spec's TraceError) and its own words;
the compiled state then takes the state back (`Checker.position`). A step that is not
clean right after one that was not either (an engine stuck idle, a violation every step)
starts a stretch of lines the spec's Checker checks straight on, without a handover
each: one line, then twice as many each time the next line after a stretch is not clean
either (at most SLOW_STRETCH), after which the compiled state takes the state back and
tries again. So the verdicts
agree by construction: same counts, same first violations, same errors; the compiled
rule only has to be right about the steps it calls clean, which the differential tests
(tests/test_checkers_agree.py, tests/test_fast_checker.py) check. A change to the
transition rule is a change to spec/state.py plus its twin, optimized/state.pyx.

Reading. A line is taken as orjson parses it only when orjson writes the object back
to the same bytes (then Python's json reads it alike: no key twice, no escapes or
numbers written otherwise); any other line is read by the spec's strict line reader
(kvsched.spec.trace.load_line), which raises the spec's error for malformed input.
The header, the end line, blank lines, lines too long and what follows the end are
read as kvsched.spec.trace.TraceReader reads them. The lines come in blocks; the
compiled state reads a block's step lines itself, with orjson as read_line does
(`FastState.apply_lines`), up to the first it does not read or finds not clean, which
goes the way above. The cyclic garbage collector pauses while a trace is checked.

Metrics on the same loop. With a `sink` (a StepSink: kvsched.metrics.MetricsCollector
on the spec Checker's state) the compiled state also counts what its steps did
(`FastState(..., facts=True)`), handed over at the end of each run (`take_facts`,
`observe_run`); a step the spec's Checker checks goes to the sink with its StepFacts
(`observe`), after the last step each live request sampled at (`observe_samples`).

Without the compiled module (an install without a C++ compiler), and for a trace whose
config the compiled state does not model (kvsched.optimized.knobs.unsupported_state:
LMDeploy's pipelined steps, lazy preemption, prealloc_tokens), every line goes to the
spec's Checker, read as above.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import IO, TYPE_CHECKING, Any, Protocol

import orjson

from kvsched.optimized.built import missing
from kvsched.optimized.knobs import unsupported_knobs, unsupported_pools, unsupported_state
from kvsched.optimized.memory import no_cycle_collection
from kvsched.spec import should
from kvsched.spec.checker import Checker, CheckOptions, Position, Report
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Config
from kvsched.spec.profiles import SCHEDULER_ENGINES, get_profile
from kvsched.spec.state import NEVER_ARRIVED, State
from kvsched.spec.trace import (
    BLANK,
    MAX_LINE_BYTES,
    STEP_KEYS,
    Header,
    TraceError,
    engine_step_keys,
    line_too_long,
    load_line,
    parse_header,
    parse_step,
)

if missing("state") is None:
    from kvsched.optimized.state import FastState, read_alike
else:  # not built: the spec's Checker checks every line
    FastState = None  # type: ignore[assignment,misc]
    read_alike = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from kvsched.optimized.facts import RunFacts
    from kvsched.optimized.replay import LinesReplay
    from kvsched.spec.model import StepRecord
    from kvsched.spec.replay import ProfileReplay
    from kvsched.spec.state import StepFacts

__all__ = ["RUN_STEPS", "FastChecker", "StepSink", "check_trace_vectorized"]

RUN_STEPS = 2048  # most steps in one run
SHORT_RUN = 32  # a run's length after a step that is not clean
SLOW_STRETCH = 4096  # most lines the spec's Checker checks straight on (FastChecker.slow)
REPLAY_LINES = 32  # lines the compiled state reads before the replay reads them again
READ_BYTES = 1 << 20


class ReplayRefused(ValueError):
    """The compiled scheduler does not replay the profile on the trace's header (another
    engine's rules, pools beyond it), and the caller gave no other replay."""


class LineTooLong(Exception):
    """The stream holds a line longer than MAX_LINE_BYTES after the lines yielded."""


def lines_of(stream: IO[bytes]) -> Iterator[list[bytes]]:
    """The stream's lines in blocks (lists), each with its newline (the last maybe
    without). A line longer than MAX_LINE_BYTES raises LineTooLong once the lines
    before it are yielded, having read at most READ_BYTES past the limit."""
    rest = b""
    while True:
        chunk = stream.read(READ_BYTES)
        if not chunk:
            break
        buf = rest + chunk if rest else chunk
        cut = buf.rfind(b"\n") + 1
        if cut:
            lines = buf[:cut].split(b"\n")
            lines.pop()  # the empty string after the last newline
            if max(map(len, lines)) > MAX_LINE_BYTES:
                long = next(k for k, raw in enumerate(lines) if len(raw) > MAX_LINE_BYTES)
                yield [raw + b"\n" for raw in lines[:long]]
                raise LineTooLong
            yield [raw + b"\n" for raw in lines]
        rest = buf[cut:]
        if len(rest) > MAX_LINE_BYTES:
            raise LineTooLong
    if rest:
        yield [rest]


def read_line(raw: bytes, line: int) -> tuple[Any, bool]:
    """(the JSON value of a line, or BLANK; whether orjson read it): orjson's object
    when Python's json reads the line alike (kvsched.optimized.state.read_alike; without
    the compiled module, when orjson writes it back to the same bytes), else the spec's
    strict reader's."""
    body = raw[:-1] if raw.endswith(b"\n") else raw
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    else:
        if (read_alike(obj, body, len(body), orjson.dumps) if read_alike is not None
                else orjson.dumps(obj) == body):
            return obj, True
    return load_line(raw, line), False


class StepSink(Protocol):
    """What takes the facts of every step the check goes through (the metrics,
    kvsched.metrics.MetricsCollector, on the spec Checker's state): the StepFacts of a
    step the spec's Checker checked, and the RunFacts of a run the compiled state
    applied; when the spec's state takes over, the last step each live request sampled
    at (`observe_samples`). `clock` is the ms at the end of the last step it took."""

    clock: float

    def observe(self, rec: StepRecord, f: StepFacts) -> None: ...
    def observe_run(self, f: RunFacts) -> None: ...
    def observe_samples(self, samples: Iterable[tuple[str, int, float]]) -> None: ...


class FastChecker:
    """One trace's check: the compiled state beside the spec's Checker (module NOTE).
    With `sink`, what each step did goes to the StepSink it makes of the Checker's
    state."""

    def __init__(self, header: Header, max_preemptions: int, run_steps: int,
                 stall_steps: int, profile: str | None,
                 sink: Callable[[State], StepSink] | None = None,
                 starve_steps: int = should.DEFAULT_STARVE_STEPS,
                 knobs: Knobs | None = None,
                 spec_replay: Callable[[Header], ProfileReplay] | None = None) -> None:
        self.checker = Checker(header.config,
                               CheckOptions(max_preemptions=max_preemptions,
                                            stall_steps=stall_steps,
                                            starve_steps=starve_steps),
                               None, header.preempted_order,
                               get_profile(profile) if profile is not None else None)
        self.sink = sink(self.checker.state) if sink is not None else None
        self.run_steps = max(run_steps, 1)
        # The run's length now: after a step that is not clean, runs start short and
        # double while clean, so that steps that are not clean and come close together
        # do not each move the state again through a long run (`_unclean`).
        self.limit = self.run_steps
        # Lines the spec's Checker is still to check straight on, the compiled state
        # set aside until then (`_unclean`); the next stretch's length, and the last
        # line the spec's Checker checked.
        self.slow = 0
        self.stretch = 0
        self.slow_line = -1
        self.replay = None if profile is None else \
            replay_for(header, profile, knobs, spec_replay)
        self.unknown: dict[str, int] = {}  # unknown step keys, at their first line
        self.engine_keys = engine_step_keys(header)  # not unknown: its engine's own
        self.fast: Any = None
        self.saved: Any = None  # the compiled state before the run
        # Why the compiled state does not take this trace, if it does not: every step
        # then goes to the spec's Checker, as without the compiled module.
        self.refused = unsupported_state(header.config)
        if FastState is not None and self.refused is None:
            self.fast = FastState(header.config, max_preemptions, header.preempted_order,
                                  self.checker.state.status_of, self.sink is not None)
            if not self.fast.usable:
                self.fast = None
            else:
                self.fast.unknown = self.unknown
                self.saved = FastState(header.config, max_preemptions,
                                       header.preempted_order, self.checker.state.status_of)
        self.started = False
        # the run's clean steps: line, JSON value (kept only for the replay), raw line;
        # how many of them the replay has had
        self.run: list[tuple[int, Any, bytes | None]] = []
        self.replayed = 0
        self.expected = 0  # the next step number
        self.fast_runs = 0
        self.exact_steps = 0
        self.handovers = 0  # times the compiled state handed the state to the spec's

    # -- the two checkers ---------------------------------------------------------------

    def step(self, line: int, obj: Any, raw: bytes, by_orjson: bool) -> None:
        """Check one step line (its JSON value; `by_orjson`: read by read_line's
        orjson, so that orjson reads the raw line alike again)."""
        fast = self.fast
        if fast is None:
            self._exact(line, obj)
            return
        if self.slow:
            self._exact(line, obj)
            self.slow_line = line
            self.slow -= 1
            if not self.slow:
                self._resume(fast)
            return
        if not self.started:
            fast.save(self.saved)
            self.started = True
        if fast.apply(obj, line):
            self.expected += 1
            # The value is kept for the replay, or where orjson would not read the line
            # alike again (then without the line: it is never read again).
            keep = self.replay is not None or not by_orjson
            self.run.append((line, obj if keep else None, raw if by_orjson else None))
            if len(self.run) >= self.limit:
                self.commit()
                self.started = False
                self.limit = min(2 * self.limit, self.run_steps)
            return
        self._unclean(fast, line, obj)

    def steps(self, raws: list[bytes], i: int, line: int, encoded: bool = False) -> int:
        """Check the lines raws[i:] (as lines_of gives them), the first at line `line`,
        as `step` does, while the compiled state reads them itself (orjson's step lines,
        as read_line takes them; `encoded`: lines orjson wrote, taken as it reads them);
        the index of the first line it did not read."""
        keep = self.replay is not None
        while self.fast is not None and not self.slow and i < len(raws):
            fast = self.fast
            if not self.started:
                fast.save(self.saved)
                self.started = True
            # With a replay, a few lines at a time, which it reads while they are still
            # in the processor's caches (`_replay_run`).
            limit = self.limit if not keep else min(self.limit,
                                                    len(self.run) + REPLAY_LINES)
            j, obj = fast.apply_lines(raws, i, line, self.run, limit, orjson.loads,
                                      orjson.dumps, keep, encoded)
            self.expected += j - i
            line += j - i
            i = j
            if len(self.run) >= self.limit:
                self.commit()
                self.started = False
                self.limit = min(2 * self.limit, self.run_steps)
            elif obj is None:
                if len(self.run) < limit:
                    break
                self._replay_run()
            else:
                self._unclean(fast, line, obj)
                i += 1
                line += 1
        return i

    def _unclean(self, fast: Any, line: int, obj: Any) -> None:
        """Line `line` (its JSON value) is not clean: back to the run's start, the clean
        steps again, then this line through the spec's Checker, from there; right after
        a line the spec's Checker checked, a stretch of lines more goes to it too."""
        self.stretch = min(2 * self.stretch or 1, SLOW_STRETCH) \
            if line == self.slow_line + 1 else 0
        self.slow_line = line
        self.handovers += 1
        self.saved.save(fast)
        sink = self.sink
        if sink is not None:
            fast.clear_facts()
        _again(fast, self.run)
        self.commit()
        if sink is not None:
            sink.observe_samples(fast.last_samples())
        self.checker.seek(fast.position(), owned=True)
        self._exact(line, obj)
        self.slow = self.stretch
        if not self.slow:
            self._resume(fast)

    def _resume(self, fast: Any) -> None:
        """The compiled state takes the state back from the spec's Checker."""
        fast.restore(self.checker.position(shared=True))
        if self.sink is not None:
            fast.clock = self.sink.clock
        self.started = False
        self.limit = min(SHORT_RUN, self.run_steps)
        if not fast.usable:
            self.fast = None

    def lines(self, raws: list[bytes], line: int) -> int:
        """Check the step lines `raws` (each as orjson encodes it, with its newline), the
        first at line `line`; the number of the line after them."""
        i = 0
        while i < len(raws):
            i = self.steps(raws, i, line + i, True)
            if i < len(raws):
                self.step(line + i, orjson.loads(raws[i]), raws[i], True)
                i += 1
        return line + len(raws)

    def _exact(self, line: int, obj: Any) -> None:
        """One line through the spec's parser and Checker, as TraceReader reads it (and
        the replay, from the trace's state before it)."""
        rec = parse_step(obj, line)
        if rec.step != self.expected:
            raise TraceError(line, f"expected step {self.expected}, got {rec.step} "
                                   "(steps are numbered from 0 without gaps)")
        for key in obj:
            if key not in STEP_KEYS and key not in self.unknown:
                self.unknown[key] = line
        self.expected += 1
        self.exact_steps += 1
        if self.replay is not None:
            checker = self.checker
            self.replay.lines([(line, obj)], lambda: _state_of(checker.config,
                                                                  checker.position()))
        facts = self.checker.step(rec)
        if self.sink is not None:
            self.sink.observe(rec, facts)
        if self.replay is not None:
            self.replay.place(self.checker.report)

    def commit(self) -> None:
        """Count the clean steps of the run with the spec's Checker."""
        fast = self.fast
        if fast is None or not self.run:
            return
        self.checker.passed(*fast.take_counts())
        self.checker.state.record_ended(fast.take_ended())
        limit = self.checker.options.max_preemptions
        for step, rid, preemptions in fast.take_thrashed():
            self.checker.flag(should.thrashed(step, rid, preemptions, limit))
        if self.sink is not None:
            self.sink.observe_run(fast.take_facts())
        self.fast_runs += 1
        if self.replay is not None:
            self._replay_run()
            self.replay.place(self.checker.report)
        self.run = []
        self.replayed = 0

    def _replay_run(self) -> None:
        """The run's clean steps the replay has not had yet, to the replay, with the
        trace's state before the first of them (asked for where lines go through the
        spec's ProfileReplay: the state at the run's start moved through the run's
        lines before them). Their values go once read: kept, they would fill the memory
        the next lines' values are made in (a line orjson reads alike again is read
        again where the run is moved through once more)."""
        assert self.replay is not None
        lines, first = self.run[self.replayed:], self.replayed
        if not lines:
            return
        self.replayed = len(self.run)
        config, saved, run = self.checker.config, self.saved, self.run

        def before() -> State:
            if not first:
                return _state_of(config, saved.position())
            # The lines were clean: no arrival among them reuses an id. (The spec's
            # state, which would say so, has since recorded the ids the run ended.)
            moving = FastState(config, self.checker.options.max_preemptions,
                               self.checker.preempted_order, lambda _: NEVER_ARRIVED)
            moving.restore(saved.position())
            _again(moving, run[:first])
            return _state_of(config, moving.position())

        self.replay.lines([(line, obj) for line, obj, _ in lines], before,
                          [raw for _, _, raw in lines])
        run[first:] = [(line, None, raw) if raw is not None else (line, obj, raw)
                       for line, obj, raw in lines]

    def settled(self) -> Checker:
        """The spec's Checker, its state where the check stands (the steps so far
        counted), for a caller that reads that state between two steps (kvsched diff at a
        divergence); the check goes on from there."""
        if self.fast is not None and not self.slow:
            self.commit()
            self.started = False
            self.checker.seek(self.fast.position(), owned=True)
        return self.checker

    def end(self, complete: bool) -> Report:
        self.commit()
        if self.fast is not None and not self.slow:
            self.checker.seek(self.fast.position(), owned=True)
        report = self.checker.end(complete)
        # The compiled state notes every key it does not read, its engine's own too.
        report.unknown_keys = {k: n for k, n in self.unknown.items()
                               if k not in self.engine_keys}
        return report

    def stats(self) -> dict[str, int]:
        at = self.checker.position()
        return {"fast": self.fast_runs, "exact": self.exact_steps, "handovers": self.handovers,
                "block_ids": int(at.state.ids_seen), "free_blocks": int(at.steps_with_free > 0)}


def replay_for(header: Header, profile: str, knobs: Knobs | None,
               spec_replay: Callable[[Header], ProfileReplay] | None) -> LinesReplay:
    """The profile's replay beside the fast checker: the compiled scheduler's where it
    replays the profile's rules on the header's pools (with `knobs`, or the profile's
    as it takes the engine settings the header declares), else the ProfileReplay
    `spec_replay` makes for the header, else ReplayRefused."""
    from kvsched.optimized.replay import CompiledReplay, LinesReplay

    chosen = get_profile(profile)
    if knobs is None:
        knobs = chosen.for_trace(header.settings).knobs
    refused = (unsupported_pools(header.config) or unsupported_knobs(knobs)
               if chosen.scheduler == "v1" else
               f"the compiled scheduler does not implement "
               f"{SCHEDULER_ENGINES[chosen.scheduler]}'s rules")
    if refused is None:
        return CompiledReplay(profile, header.config, header.preempted_order, knobs)
    if spec_replay is None:
        raise ReplayRefused(f"--profile {profile}: {refused}")
    return LinesReplay(spec_replay(header))


def _again(fast: Any, run: list[tuple[int, Any, bytes | None]]) -> None:
    """Move the compiled state `fast` through a run's clean lines once more, each by its
    kept JSON value or read again from the line (one orjson reads alike); they were
    clean, and must be so again."""
    for at, obj, raw in run:
        if not fast.apply(obj if obj is not None else orjson.loads(raw),  # type: ignore[arg-type]
                          at):
            raise AssertionError(f"line {at}: the compiled state moved otherwise")


def _state_of(config: Config, p: Position) -> State:
    """A spec State of its own where the Position `p` stands (no ended ids)."""
    state = State(config)
    state.restore(p.state, owned=True)
    return state


def check_trace_vectorized(stream: IO[bytes],
                           max_preemptions: int = should.DEFAULT_MAX_PREEMPTIONS,
                           run_steps: int = RUN_STEPS,
                           stats: dict[str, int] | None = None,
                           profile: str | None = None,
                           on_header: Callable[[Header], None] | None = None,
                           stall_steps: int = should.DEFAULT_STALL_STEPS,
                           sink: Callable[[State], StepSink] | None = None,
                           starve_steps: int = should.DEFAULT_STARVE_STEPS,
                           knobs: Knobs | None = None,
                           spec_replay: Callable[[Header], ProfileReplay] | None = None
                           ) -> Report:
    """Check a trace (a binary stream) as `kvsched.spec.checker.check_trace` does with a
    TraceReader: the same Report, or the same TraceError. With `profile`, its
    decisions are replayed beside by the compiled scheduler (kvsched.optimized.replay),
    as kvsched.conformance.checker replays them with the reference: the same
    divergence. `on_header` sees the header once it is read. `stats`, if given,
    receives how many runs the compiled state found clean ("fast"), how many steps the
    spec's Checker checked ("exact"), how many times the compiled state handed it the
    state for that ("handovers"), how many lines the spec's line reader read
    ("as_json", the rest orjson read), whether the trace carries block ids
    ("block_ids") and some step reports free_blocks ("free_blocks"), as 1 or 0; with a
    profile, how many runs the compiled scheduler replayed by itself ("replayed_fast")
    and how many steps went through the spec's ProfileReplay ("replayed_slow"). With
    `sink`, each step's facts go to the StepSink it makes (FastChecker). With `knobs`,
    the profile's scheduler replays with those rules instead of the profile's own. A
    profile the compiled scheduler does not replay (replay_for) is replayed by the
    ProfileReplay `spec_replay` makes for the header (ReplayRefused without it)."""
    with no_cycle_collection():
        return _check(stream, max_preemptions, run_steps, stats, profile, on_header,
                      stall_steps, sink, starve_steps, knobs, spec_replay)


def _check(stream: IO[bytes], max_preemptions: int, run_steps: int,
           stats: dict[str, int] | None, profile: str | None,
           on_header: Callable[[Header], None] | None, stall_steps: int,
           sink: Callable[[State], StepSink] | None,
           starve_steps: int = should.DEFAULT_STARVE_STEPS,
           knobs: Knobs | None = None,
           spec_replay: Callable[[Header], ProfileReplay] | None = None) -> Report:
    fc: FastChecker | None = None
    number = 0
    as_json = 0
    complete = False
    try:
        for block in lines_of(stream):
            i = 0
            while i < len(block):
                if fc is not None and not complete:
                    j = fc.steps(block, i, number + 1)
                    number += j - i
                    i = j
                    if i == len(block):
                        break
                raw = block[i]
                i += 1
                number += 1
                if complete:
                    as_json += 1
                    if load_line(raw, number) is not BLANK:
                        raise TraceError(number, 'nothing may follow the {"end": true} line')
                    continue
                obj, by_orjson = read_line(raw, number)
                as_json += not by_orjson
                if obj is BLANK:
                    continue
                if fc is None:
                    header = parse_header(obj, number)
                    if on_header is not None:
                        on_header(header)
                    fc = FastChecker(header, max_preemptions, run_steps, stall_steps, profile,
                                     sink, starve_steps, knobs, spec_replay)
                    continue
                if type(obj) is dict and obj.get("end") is True and "step" not in obj:
                    complete = True
                    continue
                fc.step(number, obj, raw, by_orjson)
    except LineTooLong:
        raise line_too_long(number + 1) from None
    if fc is None:
        raise TraceError(1, "empty file: expected a trace header line")
    report = fc.end(complete)
    report.profile = profile
    if stats is not None:
        stats.update(fc.stats())
        stats["as_json"] = as_json
        if fc.replay is not None:
            stats["replayed_fast"] = fc.replay.fast_runs
            stats["replayed_slow"] = fc.replay.slow_steps
    return report
