"""`kvsched diff`: the audit of a scheduler change (docs/audit.md).

Two sides, A and B, each a stream of steps: a trace file, or a scheduler run by the
simulation loop on a workload. They are walked in lockstep, one step of each at a time
(memory stays bounded by the live requests, as for `kvsched check`). At every step the
two are compared in the order a step happens (lines of the same bytes are the same
step; others are compared as records), and the first difference is the divergence:

1. inputs: the arrivals (id, prompt_len, max_tokens, priority) and the aborts; a
   difference here means the two sides did not run the same workload;
2. the decision: rejections, preemptions with their mode, swap-ins, the scheduled
   [id, tokens] pairs in batch order (Decision.comparable(); block ids are not compared:
   two correct allocators hand out different ids);
3. the finishes, as a set;
4. the reported free GPU blocks, when both sides report them (equal decisions with
   different free counts mean one side's accounting is off);
5. the length: one side stops while the other goes on.

The divergence is shown with both sides' versions and the spec checker's view of the
requests involved just before the step (N tokens known, C computed, G GPU and H host
blocks, status), as `kvsched check --profile` shows one. After it both sides go on to
their end, each through its own spec checker and metrics collector, for the
per-invariant violation counts and the metric deltas.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, fields, replace
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from kvsched.conformance import describe, describe_state
from kvsched.metrics import Distribution, Metrics, MetricsCollector, PrefixCache
from kvsched.optimized.built import missing
from kvsched.optimized.checker import RUN_STEPS, FastChecker
from kvsched.plot import require_matplotlib
from kvsched.simulate import run, step_bound, unending
from kvsched.spec import should
from kvsched.spec.checker import Checker, Report
from kvsched.spec.interface import Scheduler
from kvsched.spec.model import Config, Decision, Request, Status, StepRecord
from kvsched.spec.state import State
from kvsched.spec.trace import (
    Header,
    TraceError,
    TraceReader,
    load_line,
    parse_step,
    step_dict,
)
from kvsched.spec.violation import INVARIANTS
from kvsched.workload import WorkItem

if missing("compiled") is None:
    from kvsched.optimized.compiled import CompiledScheduler
    from kvsched.optimized.compiled import simulate as compiled_simulate
else:  # not built here: every side runs through the simulation loop
    CompiledScheduler = None  # type: ignore[assignment,misc]

# What differs at the first divergent step, in the order a step is compared.
INPUTS = "inputs"
DECISION = "decision"
FINISHES = "finishes"
FREE_BLOCKS = "free blocks"
LENGTH = "length"


class SideFailed(Exception):
    """One side cannot go on: its scheduler raised, or its steps name requests that never
    arrived. For a trace that is bad input; for a scheduler, a fault of that scheduler."""

    def __init__(self, label: str, message: str) -> None:
        super().__init__(f"{label}: {message}")
        self.label = label
        self.message = message


# What every side is walked in: its trace lines (a trace file's as the file has them, or
# those a run writes), in blocks: the first one's line number and the lines, each with
# its newline.
Lines = tuple[int, list[bytes]]
# One step line of a side: its line number, its bytes and its JSON object.
Line = tuple[int, bytes, Any]
BLOCK = 256  # lines in a block of a trace file's records


@dataclass
class Stream:
    """One side of a diff: its step lines in blocks, whether it ended with every request done, and
    (a run) why it stopped before that: stuck, or at its step limit."""

    label: str
    config: Config
    engine: dict[str, str]
    blocks: Iterator[Lines]
    complete: Callable[[], bool]
    stopped: Callable[[], Stop | None] = lambda: None
    preempted_order: bool = True


def blocks_of(lines: Iterable[tuple[int, bytes]]) -> Iterator[Lines]:
    """Numbered lines in blocks of consecutive ones, of BLOCK lines at most."""
    first, raws = 0, list[bytes]()
    for number, raw in lines:
        if raws and (number != first + len(raws) or len(raws) == BLOCK):
            yield first, raws
            raws = []
        if not raws:
            first = number
        raws.append(raw)
    if raws:
        yield first, raws


def trace_stream(label: str, reader: TraceReader) -> Stream:
    """A side read from a trace: its step lines as the file has them (the side's fast
    checker reads each once; a malformed one is the side's failure), its header's
    config, engine and preemption order."""
    def lines() -> Iterator[tuple[int, bytes]]:
        try:
            yield from reader.step_lines()
        except TraceError as e:
            raise SideFailed(label, str(e)) from None

    return Stream(label, reader.header.config, reader.header.engine, blocks_of(lines()),
                  lambda: reader.complete, preempted_order=reader.header.preempted_order)


@dataclass(frozen=True)
class Stop:
    """Why a side's run stopped with work left: `stuck` (the progress violation's words)
    or at its step limit; either is told in the report, never silently."""

    why: str
    stuck: bool


@dataclass(frozen=True)
class Divergence:
    """The first step where A and B differ, with both versions and the state before it."""

    step: int
    what: str  # INPUTS, DECISION, FINISHES, FREE_BLOCKS or LENGTH
    a: str  # A's whole version of what differs (its decision, finishes, ...)
    b: str
    state: str  # the spec checker's view of the requests involved, before the step
    differs: str = ""  # only what differs, per request, when the versions are long

    def text(self) -> str:
        return (f"first divergence at step {self.step} ({self.what}): A {self.a} | "
                f"B {self.b}" + (f" | state before: {self.state}" if self.state else ""))

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "what": self.what, "a": self.a, "b": self.b,
                "differs": self.differs, "state_before": self.state}


@dataclass(frozen=True)
class Side:
    """What one side did: its checker's report and its metrics."""

    label: str
    config: Config
    engine: dict[str, str]
    report: Report
    metrics: Metrics
    stopped: Stop | None = None


@dataclass(frozen=True)
class MetricDelta:
    name: str
    a: float | None
    b: float | None
    percent: bool = False  # a fraction shown as a percentage

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def relative(self) -> float | None:
        """(B - A) / A, when A is a nonzero number."""
        if self.delta is None or not self.a:
            return None
        return self.delta / abs(self.a)

    def cells(self) -> tuple[str, str, str, str]:
        def show(x: float | None, signed: bool = False) -> str:
            if x is None:
                return "-"
            if self.percent:
                return f"{x:+.1%}" if signed else f"{x:.1%}"
            text = f"{x:.0f}" if x == int(x) else f"{x:.2f}"
            return ("+" + text if signed and x > 0 else text)
        rel = self.relative
        return (show(self.a), show(self.b), show(self.delta, signed=True),
                "-" if rel is None else f"{rel:+.1%}")

    def as_dict(self) -> dict[str, Any]:
        return {"metric": self.name, "a": self.a, "b": self.b, "delta": self.delta,
                "relative": self.relative}


@dataclass(frozen=True)
class Diff:
    a: Side
    b: Side
    config_differences: tuple[str, ...]  # "num_gpu_blocks: 40 | 48", one per field
    divergence: Divergence | None
    steps_compared: int

    @property
    def diverged(self) -> bool:
        return self.divergence is not None

    @property
    def stuck(self) -> bool:
        """A side's run got stuck (it can never end): a failure, like a divergence."""
        return any(s.stopped is not None and s.stopped.stuck for s in (self.a, self.b))

    def violation_counts(self) -> list[tuple[str, str, int, int]]:
        """(invariant id, level, count in A, count in B) for every id either side broke."""
        ids = [i for i in INVARIANTS if self.a.report.counts[i] or self.b.report.counts[i]]
        return [(i, INVARIANTS[i], self.a.report.counts[i], self.b.report.counts[i])
                for i in ids]

    def metric_deltas(self) -> list[MetricDelta]:
        return metric_deltas(self.a.metrics, self.b.metrics)

    def as_dict(self) -> dict[str, Any]:
        def side(s: Side) -> dict[str, Any]:
            return {"label": s.label, "engine": s.engine, "steps": s.report.steps,
                    "requests": s.report.requests, "complete": s.report.complete,
                    "stopped": None if s.stopped is None else s.stopped.why,
                    "stuck": s.stopped is not None and s.stopped.stuck,
                    "violations": {k: n for k, n in sorted(s.report.counts.items())}}
        return {"diverged": self.diverged, "stuck": self.stuck,
                "steps_compared": self.steps_compared,
                "divergence": None if self.divergence is None else self.divergence.as_dict(),
                "config_differences": list(self.config_differences),
                "a": side(self.a), "b": side(self.b),
                "violations": [{"invariant": i, "level": lvl, "a": na, "b": nb}
                               for i, lvl, na, nb in self.violation_counts()],
                "metrics": [m.as_dict() for m in self.metric_deltas()]}


def metric_deltas(a: Metrics, b: Metrics) -> list[MetricDelta]:
    """Throughput, TTFT and TPOT p50 and p99, preemptions, recomputed tokens, KV use; and
    prefix caching's hit rate, prefill tokens saved and evictions when either side caches
    (a side that does not has saved nothing: zeros)."""
    rows = [
        MetricDelta("steps", a.steps, b.steps),
        MetricDelta("finished requests", a.finished, b.finished),
        MetricDelta("throughput (generated tokens/step)", a.generated_per_step,
                    b.generated_per_step),
    ]
    if a.generated_per_second is not None or b.generated_per_second is not None:
        rows.append(MetricDelta("throughput (generated tokens/s)", a.generated_per_second,
                                b.generated_per_second))
    rows += [
        MetricDelta("TTFT p50 (steps)", a.ttft.p50, b.ttft.p50),
        MetricDelta("TTFT p99 (steps)", a.ttft.p99, b.ttft.p99),
        MetricDelta("TPOT p50 (steps/token)", a.tpot.p50, b.tpot.p50),
        MetricDelta("TPOT p99 (steps/token)", a.tpot.p99, b.tpot.p99),
    ]
    if a.ttft_ms is not None or b.ttft_ms is not None:
        for name, unit, da, db in (("TTFT", "ms", a.ttft_ms, b.ttft_ms),
                                   ("TPOT", "ms/token", a.tpot_ms, b.tpot_ms)):
            rows += [MetricDelta(f"{name} {q} ({unit})", _quantile(da, q), _quantile(db, q))
                     for q in ("p50", "p99")]
    rows += [
        MetricDelta("preemptions", sum(a.preemptions.values()), sum(b.preemptions.values())),
        MetricDelta("recomputed tokens", a.recomputed_tokens, b.recomputed_tokens),
        MetricDelta("KV use mean", a.kv_use_mean, b.kv_use_mean, percent=True),
        MetricDelta("KV use peak", a.kv_use_peak, b.kv_use_peak, percent=True),
    ]
    if a.prefix_cache is not None or b.prefix_cache is not None:
        ca, cb = (m.prefix_cache or NO_CACHE for m in (a, b))
        rows += [
            MetricDelta("prefix cache hit rate", ca.hit_rate, cb.hit_rate, percent=True),
            MetricDelta("prefill tokens saved", ca.hit_tokens, cb.hit_tokens),
            MetricDelta("prefix cache evictions", ca.evictions, cb.evictions),
        ]
    return rows


NO_CACHE = PrefixCache(0, 0, 0, 0, 0, 0, 0)


def _quantile(d: Distribution | None, q: str) -> float | None:
    if d is None:
        return None
    value: float | None = getattr(d, q)
    return value


# -- the lockstep walk -------------------------------------------------------------------


def _arrival_text(r: Request) -> str:
    return f"{r.id} (P={r.prompt_len}, O={r.max_tokens}, priority {r.priority})"


def _inputs_text(rec: StepRecord) -> str:
    parts = []
    if rec.arrivals:
        parts.append("arrivals " + ", ".join(_arrival_text(r) for r in rec.arrivals))
    if rec.aborted:
        parts.append("aborts " + ", ".join(rec.aborted))
    return "; ".join(parts) or "no arrivals or aborts"


# The state shown is cut to this many requests (a batch may hold hundreds).
MAX_SHOWN = 12


def _treatment(d: Decision) -> dict[str, str]:
    """What the decision does to each request it names, in its order."""
    out: dict[str, list[str]] = {}
    for r in d.rejected:
        out.setdefault(r.id, []).append("rejected")
    for p in d.preempted:
        out.setdefault(p.id, []).append(f"preempted ({p.mode})")
    for rid in d.swapped_in:
        out.setdefault(rid, []).append("swapped in")
    for rid, n in d.scheduled:
        out.setdefault(rid, []).append(f"scheduled {n}")
    return {rid: ", ".join(what) for rid, what in out.items()}


def decision_difference(da: Decision, db: Decision) -> tuple[str, list[str]]:
    """Per request, what A and B do differently; and those requests. Equal treatments in
    another order are told as an order difference."""
    ta, tb = _treatment(da), _treatment(db)
    ids = [rid for rid in dict.fromkeys([*ta, *tb]) if ta.get(rid) != tb.get(rid)]
    if ids:
        return "; ".join(f"{rid}: A {ta.get(rid, 'nothing')} | B {tb.get(rid, 'nothing')}"
                         for rid in ids), ids
    order_a = [p.id for p in da.preempted] + [rid for rid, _ in da.scheduled]
    order_b = [p.id for p in db.preempted] + [rid for rid, _ in db.scheduled]
    moved = [x for x, y in zip(order_a, order_b, strict=False) if x != y]
    return (f"the same requests in another order: A {', '.join(order_a)} | "
            f"B {', '.join(order_b)}"), moved


def state_before(checker: Checker, rec: StepRecord, involved: Iterable[str]) -> str:
    """The checker's state of `involved` once `rec`'s arrivals and aborts are in, before
    its decision: the state the scheduler decided on (the first MAX_SHOWN of them). An
    aborted request is shown as aborted, with what it held."""
    involved = list(dict.fromkeys(involved))
    wanted = set(involved)
    after = checker.state.after_inputs(rec)
    views = {rid: t.view() for rid, t in after.live.items() if rid in wanted}
    for rid in rec.aborted:
        t = checker.state.live.get(rid)
        if t is not None and rid in wanted:
            views[rid] = replace(t.view(), status=Status.ABORTED)
    shown = involved[:MAX_SHOWN]
    more = len(wanted) - len(shown)
    return describe_state(views, after.free, shown) + (f" (and {more} more)" if more > 0
                                                       else "")


def _both_states(ca: Checker, ra: StepRecord, cb: Checker, rb: StepRecord,
                 involved: list[str]) -> str:
    sa = state_before(ca, ra, involved)
    sb = state_before(cb, rb, involved)
    return sa if sa == sb else f"A: {sa}; B: {sb}"


def first_difference(ra: StepRecord, rb: StepRecord, ca: Checker, cb: Checker
                     ) -> Divergence | None:
    """How step `ra` of A and step `rb` of B differ, if they do (checkers before the step)."""
    s = ra.step
    if ra.arrivals != rb.arrivals or set(ra.aborted) != set(rb.aborted):
        return Divergence(s, INPUTS, _inputs_text(ra), _inputs_text(rb), "")
    da, db = ra.decision, rb.decision
    if da.comparable() != db.comparable():
        differs, involved = decision_difference(da, db)
        involved += [p.id for p in (*da.preempted, *db.preempted)]  # the victims matter too
        return Divergence(s, DECISION, describe(da), describe(db),
                          _both_states(ca, ra, cb, rb, involved), differs)
    if set(ra.finished) != set(rb.finished):
        odd = [rid for rid in dict.fromkeys([*ra.finished, *rb.finished])
               if (rid in ra.finished) != (rid in rb.finished)]
        return Divergence(s, FINISHES, "finishes " + (", ".join(ra.finished) or "nothing"),
                          "finishes " + (", ".join(rb.finished) or "nothing"),
                          _both_states(ca, ra, cb, rb, odd),
                          "; ".join(f"{rid}: {'A' if rid in ra.finished else 'B'} finishes "
                                    "it" for rid in odd))
    if ra.free_blocks is not None and rb.free_blocks is not None \
            and ra.free_blocks != rb.free_blocks:
        # Blocks go back at finishes, preemptions and aborts: the usual suspects.
        suspects = [*ra.finished, *(p.id for p in da.preempted), *ra.aborted]
        return Divergence(s, FREE_BLOCKS, f"reports {ra.free_blocks} free GPU blocks after "
                          f"the step", f"reports {rb.free_blocks}",
                          _both_states(ca, ra, cb, rb, suspects or list(_treatment(da))),
                          f"the same decision ({describe(da, ra.finished)}), "
                          f"{ra.free_blocks} | {rb.free_blocks} free GPU blocks after it")
    return None


def config_differences(a: Config, b: Config) -> tuple[str, ...]:
    return tuple(f"{f.name}: {getattr(a, f.name)} | {getattr(b, f.name)}" for f in fields(a)
                 if getattr(a, f.name) != getattr(b, f.name))


class _Checked:
    """One side's check and metrics: the fast checker (kvsched.optimized.checker, the
    spec's verdicts) with a metrics collector on its state; its malformed lines are the
    side's failure."""

    def __init__(self, side: Stream, series: bool, max_preemptions: int,
                 stall_steps: int) -> None:
        self.side = side
        made: list[MetricsCollector] = []

        def sink(state: State) -> MetricsCollector:
            made.append(MetricsCollector(side.config, series=series, state=state))
            return made[-1]

        header = Header(side.config, side.engine, preempted_order=side.preempted_order)
        self.fc = FastChecker(header, max_preemptions, RUN_STEPS, stall_steps, None, sink)
        self.metrics = made[0]

    def record(self, line: Line) -> StepRecord:
        """The step line as a StepRecord (SideFailed if it is malformed)."""
        try:
            return parse_step(line[2], line[0])
        except TraceError as e:
            raise SideFailed(self.side.label, str(e)) from None

    def step(self, line: Line) -> None:
        try:
            self.fc.step(line[0], line[2], line[1], True)
        except TraceError as e:
            raise SideFailed(self.side.label, str(e)) from None

    def lines(self, raws: list[bytes], line: int) -> None:
        """The step lines `raws`, the first at line `line`, checked a block at a time."""
        try:
            self.fc.lines(raws, line)
        except TraceError as e:
            raise SideFailed(self.side.label, str(e)) from None

    def result(self) -> Side:
        s = self.side
        return Side(s.label, s.config, s.engine, self.fc.end(s.complete()),
                    self.metrics.result(), s.stopped())


class _Cursor:
    """Where a side's walk stands: its block at hand and the next line in it."""

    def __init__(self, side: Stream) -> None:
        self.label, self.blocks = side.label, side.blocks
        self.first, self.raws, self.i = 0, list[bytes](), 0

    def ready(self) -> bool:
        """Whether a line is at hand (the next block taken once this one is done)."""
        while self.i >= len(self.raws):
            block = next(self.blocks, None)
            if block is None:
                return False
            (self.first, self.raws), self.i = block, 0
        return True

    def line(self) -> Line:
        """The line at hand, with its JSON object (SideFailed if it is malformed)."""
        raw, number = self.raws[self.i], self.first + self.i
        try:
            return number, raw, load_line(raw, number)
        except TraceError as e:
            raise SideFailed(self.label, str(e)) from None

    def feed(self, side: _Checked, n: int) -> None:
        """The next `n` lines of the block at hand to `side`'s check."""
        if n:
            side.lines(self.raws[self.i:self.i + n], self.first + self.i)
            self.i += n


def _hit_lengths(hits: Any) -> Any:
    if isinstance(hits, dict) and all(isinstance(v, list) for v in hits.values()):
        return {rid: len(v) for rid, v in hits.items()}
    return hits


def surely_same(oa: Any, ob: Any) -> bool:
    """Whether two step lines' JSON objects are the same by every rule of
    `first_difference` without reading them as records: the same inputs, decision and
    finishes as written, prefix hits of the same lengths, no two free block counts that
    differ. False means: compare them as records."""
    if type(oa) is not dict or type(ob) is not dict:
        return False
    for key in ("arrivals", "aborted", "rejected", "preempted", "swapped_in", "scheduled",
                "finished"):
        if oa.get(key) != ob.get(key):
            return False
    ha, hb = oa.get("prefix_hits"), ob.get("prefix_hits")
    if ha != hb and _hit_lengths(ha) != _hit_lengths(hb):
        return False
    fa, fb = oa.get("free_blocks"), ob.get("free_blocks")
    return fa is None or fb is None or fa == fb


def diff_streams(a: Stream, b: Stream, *, series: bool = False,
                 max_preemptions: int = should.DEFAULT_MAX_PREEMPTIONS,
                 stall_steps: int = should.DEFAULT_STALL_STEPS) -> Diff:
    """Walk A and B in lockstep; report the first divergence, both checks, both metrics.
    Lines of the same bytes go to both checks a block at a time; lines that differ but
    are surely the same step (`surely_same`) are not read as records; the others, and
    the divergence, are compared by `first_difference` on the spec's state before the
    step. After the divergence each side goes on, a block of each in turn."""
    ca = _Checked(a, series, max_preemptions, stall_steps)
    cb = _Checked(b, series, max_preemptions, stall_steps)
    pa, pb = _Cursor(a), _Cursor(b)
    divergence: Divergence | None = None
    compared = 0
    while divergence is None:
        more_a, more_b = pa.ready(), pb.ready()
        if not (more_a and more_b):
            if more_a or more_b:
                longer, rec = ("A", ca.record(pa.line())) if more_a else ("B",
                                                                        cb.record(pb.line()))
                shorter = f"ends after {rec.step} steps"
                goes_on = f"goes on: {describe(rec.decision, rec.finished)}"
                divergence = Divergence(rec.step, LENGTH,
                                        goes_on if longer == "A" else shorter,
                                        goes_on if longer == "B" else shorter, "")
            break
        # the lines of the same bytes from here are the same steps
        m = min(len(pa.raws) - pa.i, len(pb.raws) - pb.i)
        same = 0
        while same < m and pa.raws[pa.i + same] == pb.raws[pb.i + same]:
            same += 1
        pa.feed(ca, same)
        pb.feed(cb, same)
        compared += same
        if same < m:
            la, lb = pa.line(), pb.line()
            if not surely_same(la[2], lb[2]):
                divergence = first_difference(ca.record(la), cb.record(lb),
                                              ca.fc.settled(), cb.fc.settled())
            compared += 1
            ca.step(la)
            cb.step(lb)
            pa.i += 1
            pb.i += 1
    # after the divergence, each side to its end, a block of each in turn
    while True:
        more = False
        for cursor, side in ((pa, ca), (pb, cb)):
            if cursor.ready():
                cursor.feed(side, len(cursor.raws) - cursor.i)
                more = True
        if not more:
            break
    return Diff(ca.result(), cb.result(), config_differences(a.config, b.config),
                divergence, compared)


def simulated(label: str, scheduler: Scheduler, workload: Collection[WorkItem],
              engine: dict[str, str], *, max_steps: int | None = None,
              on_lines: Callable[[list[bytes], int], None] | None = None,
              stall_steps: int = should.DEFAULT_STALL_STEPS) -> Stream:
    """A side that runs `scheduler` on `workload` (the compiled one in its own loop,
    writing its trace lines; any other through the simulation loop) and walks the
    lines it writes; `on_lines` sees each batch of lines with the requests they ended.
    A run that gets stuck, or reaches `max_steps` with work left, stops and says why.
    Without `max_steps` the run is bounded by the workload's step bound (step_bound, as
    fuzz and the pytest plugin bound theirs): a run still going there never ends, and
    its side is stuck."""
    ended = 0
    stop: Stop | None = None
    bound = step_bound(scheduler.config, workload, stall_steps) if max_steps is None \
        else None
    limit = max_steps if bound is None else bound

    def batches() -> Iterator[tuple[list[bytes], int]]:
        if CompiledScheduler is not None and isinstance(scheduler, CompiledScheduler):
            for block, _, done, _ in compiled_simulate(scheduler, workload, True, limit, True,
                                                     stall_steps):
                yield block.splitlines(keepends=True), done
            return
        for rec in run(scheduler, workload, max_steps=limit, stall_steps=stall_steps):
            yield [orjson.dumps(step_dict(rec)) + b"\n"], rec.num_ended

    def blocks() -> Iterator[Lines]:
        nonlocal ended, stop
        runs = batches()
        line = 2  # after the header
        while True:
            try:
                raws, done = next(runs)
            except StopIteration:
                left = len(workload) - ended
                unended = unending((), None, line - 2, bound, left)
                if unended is not None:
                    stop = Stop(unended.message, stuck=True)
                elif left:
                    stop = Stop(f"stopped at the step limit of {max_steps} steps "
                                f"(--max-steps) with {left} request"
                                f"{'s' if left != 1 else ''} unfinished", stuck=False)
                return
            except should.Stalled as e:
                stop = Stop(str(e), stuck=True)
                return
            except Exception as e:  # the scheduler's fault, told in one line
                text = (str(e).strip().splitlines() or [""])[0]
                raise SideFailed(label, f"the scheduler raised {type(e).__name__} at step "
                                        f"{line - 2}: {text}") from None
            ended += done
            if on_lines is not None:
                on_lines(raws, done)
            yield line, raws
            line += len(raws)

    return Stream(label, scheduler.config, engine, blocks(), lambda: ended == len(workload),
                  lambda: stop)


# -- the report --------------------------------------------------------------------------


SHORT = 200  # longer versions are cut in the text report (--format json has them whole)


def _shorten(text: str) -> str:
    return text if len(text) <= SHORT else text[:SHORT].rsplit(" ", 1)[0] + " ..."


def render_text(d: Diff, console: Console) -> None:
    console.print(f"kvsched diff: A = {d.a.label}, B = {d.b.label}")
    if d.config_differences:
        console.print("[yellow]the configs differ[/yellow] (A | B): "
                      + "; ".join(d.config_differences), markup=True)
    for name, side in (("A", d.a), ("B", d.b)):  # first: what follows covers less
        if side.stopped is not None:
            colour = "red" if side.stopped.stuck else "yellow"
            console.print(f"[{colour}]{name} stopped early[/{colour}]: ", end="")
            console.print(side.stopped.why, markup=False)
    if d.divergence is None:
        console.print(f"[green]no divergence[/green]: {d.steps_compared} steps, the same "
                      "inputs, decisions, finishes and free block counts")
    else:
        v = d.divergence
        note = {INPUTS: " (the two sides did not run the same workload)",
                LENGTH: " (every earlier step is equal)"}.get(v.what, "")
        console.print(f"[red]first divergence at step {v.step}[/red]: {v.what}{note}")
        table = Table(show_header=False, box=None, padding=(0, 1))
        table.add_column(overflow="fold")
        table.add_column(overflow="fold")
        table.add_row("A", _shorten(v.a))
        table.add_row("B", _shorten(v.b))
        if v.differs and (v.differs != v.a or len(v.a) > SHORT):
            table.add_row("differs", v.differs)
        if v.state:
            table.add_row("state before", v.state)
        console.print(table)
    counts = d.violation_counts()
    if counts:
        table = Table(title="violations per invariant")
        for col in ("invariant", "level", "A", "B"):
            table.add_column(col, justify="right" if col in ("A", "B") else "left")
        for inv, level, na, nb in counts:
            table.add_row(inv, level, str(na), str(nb))
        console.print(table)
    else:
        console.print("violations: none on either side (MUST and SHOULD)")
    table = Table(title="metrics (delta = B - A)")
    for col in ("metric", "A", "B", "delta", "relative"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for m in d.metric_deltas():
        table.add_row(m.name, *m.cells())
    console.print(table)


# -- the plot ----------------------------------------------------------------------------


def plot_png(d: Diff, title: str | None = None) -> bytes:
    """Both sides over time: queue lengths, KV use, preemptions (cumulative), as a PNG.

    pre: d.a.metrics.series is not None and d.b.metrics.series is not None
    """
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    sa, sb = d.a.metrics.series, d.b.metrics.series
    assert sa is not None and sb is not None, "collect the diff with series=True"
    fig = Figure(figsize=(9, 7.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    queue, kv, pre = fig.subplots(3, 1, sharex=True)
    # A wide and pale under B thin and dark: where they agree, B runs inside A's band.
    looks = {"A": ("tab:blue", 2.6, 0.5), "B": ("tab:orange", 1.1, 1.0)}
    for name, side, s in (("A", d.a, sa), ("B", d.b, sb)):
        steps = range(len(s.waiting))
        c, lw, alpha = looks[name]
        queue.plot(steps, s.running, color=c, lw=lw, alpha=alpha, label=f"{name} running")
        queue.plot(steps, s.waiting, color=c, lw=lw, alpha=alpha, ls="--",
                   label=f"{name} waiting")
        if any(s.swapped):
            queue.plot(steps, s.swapped, color=c, lw=lw, alpha=alpha, ls=":",
                       label=f"{name} swapped")
        blocks = side.config.num_gpu_blocks
        kv.plot(steps, [100 * k / blocks for k in s.kv_blocks], color=c, lw=lw, alpha=alpha,
                label=f"{name} ({blocks} blocks)")
        total = 0
        cumulative = []
        for n in s.preemptions:
            total += n
            cumulative.append(total)
        pre.step(steps, cumulative, where="post", color=c, lw=lw, alpha=alpha,
                 label=f"{name}: {total}")
    queue.set_ylabel("requests")
    queue.set_title("queue lengths after each step", fontsize=10, loc="left")
    kv.set_ylabel("KV use (%)")
    kv.set_ylim(0, 105)
    kv.set_title("GPU KV blocks held while the batch runs", fontsize=10, loc="left")
    pre.set_ylabel("preemptions")
    pre.set_title("preemptions so far", fontsize=10, loc="left")
    pre.set_xlabel("step")
    if d.divergence is not None:
        for ax in (queue, kv, pre):
            ax.axvline(d.divergence.step, color="tab:red", lw=0.9, ls="-.",
                       label=f"first divergence (step {d.divergence.step})"
                       if ax is queue else None)
    for ax in (queue, kv, pre):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, ncols=2 if ax is queue else 1, loc="upper right")
    fig.suptitle(title or f"kvsched diff: A = {d.a.label}, B = {d.b.label}", fontsize=11)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
