"""Metrics of any trace (docs/cli.md, kvsched metrics), computed as the steps stream by.

NOTE: a trace does not say when a request samples a token, so the collector moves the
spec's state through the trace with the spec's transition rule (kvsched.spec.state): a
request knows N tokens (its prompt at arrival) and has C computed; a scheduled chunk of
Dn tokens sets C = min(C + Dn, N), and when C reaches N the request samples one token
(N += 1). A recompute preemption sets C = 0 and keeps N, so the replayed outputs are
computed again without sampling. Blocks follow the same rule. Where a trace breaks an
invariant the rule does not apply the broken action (`kvsched check` reports it), and
the metrics describe what remains. A trace read from a stream (`metrics_of_trace`, `kvsched
metrics`) goes through the fast checker's loop (kvsched.optimized.checker): the rule's
compiled twin (kvsched.optimized.state) moves through the steps it calls clean and
counts their facts in columns (RunFacts, `observe_run`), the spec's state through the
others (`observe`); the definitions below apply to both alike, so the Metrics are the
same.

Units and definitions:
- a step is the unit of time; milliseconds too when every step has `time_ms`;
- TTFT = first-sample step - arrival step + 1: the steps a request lived through up to
  and including the one that produced its first token (1 = prefilled on arrival);
  recorded at the first sample, so a request aborted later still counts;
- TPOT = (last-sample step - first-sample step) / (outputs - 1), for finished requests
  with at least two outputs (1.0 = one token every step);
- latency = finish step - arrival step + 1, for finished requests;
- KV use = GPU blocks held while the step's batch runs (after allocation, before the
  finishes release theirs) / num_gpu_blocks, as vLLM's kv_cache_usage gauge samples it;
  derived from the arithmetic above, or from the engine's `free_blocks` (after the step)
  plus the finished requests' blocks when the trace reports it;
- queue lengths = waiting, running and swapped requests after the step;
- recomputed tokens = the C each recompute victim had when preempted, and the C each
  waiting request had when a `reclaimed` took its blocks (a lazy victim recomputes only
  then; with prefix caching it may hit some of them again when it comes back: those
  are hit tokens);
- prefix cache (only for a trace whose config has prefix_caching; vLLM's counters):
  an admission is a scheduled request that was waiting (new, or resumed after a
  recompute preemption) and so could take a hit; its query is the N tokens it knows
  then (prompt, and the outputs a resumed one replays), and its hit the tokens of its
  `prefix_hits` blocks (h * block_size). Hit rate = hit tokens / queried tokens, as
  vLLM's prefix cache hit rate (hits / queries); the hit tokens are prefill tokens
  saved (computed tokens count only what was computed). Requests hit = requests with a
  hit at some admission / requests admitted at least once. Evictions = cached blocks
  handed out again, which drops their content.

Memory: the spec's state (one small record per live request and one entry per ended
id) and one timeline per live request. Percentiles are exact: the TTFT, TPOT and latency
values are kept in `array('d')`, 8 bytes per request each (24 MB for a million requests,
40 with milliseconds), and sorted once at the end; percentiles interpolate linearly
between ranks, as numpy.percentile does by default. Per-step series (on by default,
`series=False` turns them off) cost 8 bytes per step and series.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import IO, TYPE_CHECKING, Any

from kvsched.spec.model import Config, Status, StepRecord
from kvsched.spec.trace import Header, TraceReader

if TYPE_CHECKING:
    from kvsched.optimized.facts import RunFacts
    from kvsched.spec.state import State, StepFacts

PERCENTILES = (50, 90, 99)
NO_THRASH_LIMIT = 1 << 62  # the preemptions a request may take when only metrics are read
QUEUES = ("waiting", "running", "swapped", "kv")  # averaged and peaked per step


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile of sorted values, interpolated linearly between ranks.

    pre: len(ordered) >= 1 and 0 <= q <= 100
    post: ordered[0] <= __return__ <= ordered[-1]
    """
    rank = q / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Distribution:
    """A latency over requests: how many, mean, p50, p90, p99, max (None when empty)."""

    count: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: float | None = None

    @staticmethod
    def of(values: array[float]) -> Distribution:
        if not values:
            return Distribution()
        ordered = sorted(values)
        p50, p90, p99 = (percentile(ordered, q) for q in PERCENTILES)
        return Distribution(len(ordered), math.fsum(ordered) / len(ordered), p50, p90, p99,
                            ordered[-1])

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean, "p50": self.p50, "p90": self.p90,
                "p99": self.p99, "max": self.max}

    def text(self) -> str:
        if self.count == 0 or self.mean is None:
            return "-"
        return (f"mean {_num(self.mean)}, p50 {_num(self.p50)}, p90 {_num(self.p90)}, "
                f"p99 {_num(self.p99)}, max {_num(self.max)}")


@dataclass(frozen=True)
class Series:
    """Per-step values, index = step, for plotting."""

    waiting: list[int]
    running: list[int]
    swapped: list[int]
    kv_blocks: list[int]  # GPU blocks held while the batch runs
    preemptions: list[int]
    generated: list[int]  # tokens sampled
    computed: list[int]  # tokens scheduled
    # Per request, when it happened: (first-sample step, TTFT) and (finish step, TPOT).
    ttft_at: list[tuple[int, float]] = field(default_factory=list)
    tpot_at: list[tuple[int, float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, list[int]]:
        return {"waiting": self.waiting, "running": self.running, "swapped": self.swapped,
                "kv_blocks": self.kv_blocks, "preemptions": self.preemptions,
                "generated": self.generated, "computed": self.computed}


@dataclass(frozen=True)
class PrefixCache:
    """Prefix caching's counters over a trace; see the module docstring."""

    admissions: int  # waiting requests scheduled: each could take a hit
    admissions_hit: int
    queried_tokens: int  # sum of N at those admissions
    hit_tokens: int  # prefill tokens saved
    requests: int  # requests admitted at least once
    requests_hit: int  # requests with a hit at some admission
    evictions: int  # cached blocks handed out again

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    @property
    def request_hit_rate(self) -> float:
        return self.requests_hit / self.requests if self.requests else 0.0

    def rows(self) -> list[tuple[str, str]]:
        return [
            ("prefix cache hit rate", f"{self.hit_rate:.1%} ({self.hit_tokens} of "
                                      f"{self.queried_tokens} tokens at admission)"),
            ("prefill tokens saved", f"{self.hit_tokens}"),
            ("requests with a hit", f"{self.requests_hit} of {self.requests} "
                                    f"({self.request_hit_rate:.1%}); {self.admissions_hit} "
                                    f"of {self.admissions} admissions"),
            ("prefix cache evictions", f"{self.evictions} blocks"),
        ]

    def as_dict(self) -> dict[str, Any]:
        return {"hit_rate": self.hit_rate, "hit_tokens": self.hit_tokens,
                "queried_tokens": self.queried_tokens, "admissions": self.admissions,
                "admissions_hit": self.admissions_hit, "requests": self.requests,
                "requests_hit": self.requests_hit, "request_hit_rate": self.request_hit_rate,
                "evictions": self.evictions}


@dataclass(frozen=True)
class Metrics:
    """Everything measured on one trace; see the module docstring for the definitions."""

    num_gpu_blocks: int
    steps: int
    requests: int
    finished: int
    aborted: int
    rejected: int
    unfinished: int
    generated_tokens: int
    computed_tokens: int
    prompt_tokens: int
    duration_ms: float | None
    ttft: Distribution
    tpot: Distribution
    latency: Distribution
    ttft_ms: Distribution | None
    tpot_ms: Distribution | None
    waiting_mean: float
    waiting_max: int
    running_mean: float
    running_max: int
    swapped_mean: float
    swapped_max: int
    kv_use_mean: float
    kv_use_peak: float
    kv_blocks_peak: int
    preemptions: dict[str, int]
    swap_ins: int
    recomputed_tokens: int
    prefix_cache: PrefixCache | None = None  # None when the trace does not cache prefixes
    series: Series | None = None

    @property
    def generated_per_step(self) -> float:
        return self.generated_tokens / self.steps if self.steps else 0.0

    @property
    def computed_per_step(self) -> float:
        return self.computed_tokens / self.steps if self.steps else 0.0

    @property
    def generated_per_second(self) -> float | None:
        if not self.duration_ms:
            return None
        return self.generated_tokens / (self.duration_ms / 1000)

    @property
    def computed_per_second(self) -> float | None:
        if not self.duration_ms:
            return None
        return self.computed_tokens / (self.duration_ms / 1000)

    def rows(self) -> list[tuple[str, str]]:
        """(name, formatted value) for a summary table."""
        out = [
            ("steps", f"{self.steps}"),
            ("requests", f"{self.requests}: {self.finished} finished, {self.rejected} "
                         f"rejected, {self.aborted} aborted, {self.unfinished} unfinished"),
            ("generated tokens", f"{self.generated_tokens} ({_num(self.generated_per_step)} "
                                 "per step)"),
            ("computed tokens", f"{self.computed_tokens} ({_num(self.computed_per_step)} "
                                f"per step; {self.prompt_tokens} of prompts)"),
        ]
        if self.duration_ms is not None:
            per_s = self.generated_per_second
            out.append(("duration", f"{_num(self.duration_ms / 1000)} s"
                        + (f" ({_num(per_s)} generated tokens/s)" if per_s is not None
                           else "")))
        out += [
            ("TTFT (steps)", self.ttft.text()),
            ("TPOT (steps/token)", self.tpot.text()),
            ("latency (steps)", self.latency.text()),
        ]
        if self.ttft_ms is not None and self.tpot_ms is not None:
            out += [("TTFT (ms)", self.ttft_ms.text()),
                    ("TPOT (ms/token)", self.tpot_ms.text())]
        out += [
            ("waiting", f"mean {_num(self.waiting_mean)}, max {self.waiting_max}"),
            ("running", f"mean {_num(self.running_mean)}, max {self.running_max}"),
            ("swapped", f"mean {_num(self.swapped_mean)}, max {self.swapped_max}"),
            ("KV use", f"mean {self.kv_use_mean:.1%}, peak {self.kv_use_peak:.1%} "
                       f"({self.kv_blocks_peak} of {self.num_gpu_blocks} blocks)"),
            ("preemptions", f"{sum(self.preemptions.values())} ("
                            + ", ".join(f"{k} {v}" for k, v in self.preemptions.items())
                            + f"), {self.swap_ins} swap-ins"),
            ("recomputed tokens", f"{self.recomputed_tokens}"),
        ]
        if self.prefix_cache is not None:
            out += self.prefix_cache.rows()
        return out

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values; `series` only when collected."""
        out: dict[str, Any] = {
            "steps": self.steps, "requests": self.requests, "finished": self.finished,
            "aborted": self.aborted, "rejected": self.rejected, "unfinished": self.unfinished,
            "generated_tokens": self.generated_tokens, "computed_tokens": self.computed_tokens,
            "prompt_tokens": self.prompt_tokens,
            "generated_per_step": self.generated_per_step,
            "computed_per_step": self.computed_per_step,
            "duration_ms": self.duration_ms,
            "generated_per_second": self.generated_per_second,
            "computed_per_second": self.computed_per_second,
            "ttft_steps": self.ttft.as_dict(), "tpot_steps": self.tpot.as_dict(),
            "latency_steps": self.latency.as_dict(),
            "ttft_ms": None if self.ttft_ms is None else self.ttft_ms.as_dict(),
            "tpot_ms": None if self.tpot_ms is None else self.tpot_ms.as_dict(),
            "queue": {"waiting": {"mean": self.waiting_mean, "max": self.waiting_max},
                      "running": {"mean": self.running_mean, "max": self.running_max},
                      "swapped": {"mean": self.swapped_mean, "max": self.swapped_max}},
            "kv": {"num_gpu_blocks": self.num_gpu_blocks, "use_mean": self.kv_use_mean,
                   "use_peak": self.kv_use_peak, "blocks_peak": self.kv_blocks_peak},
            "preemptions": dict(self.preemptions), "swap_ins": self.swap_ins,
            "recomputed_tokens": self.recomputed_tokens,
            "prefix_cache": None if self.prefix_cache is None else self.prefix_cache.as_dict(),
        }
        if self.series is not None:
            out["series"] = self.series.as_dict()
        return out


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f}" if x == int(x) else f"{x:.2f}"


@dataclass(slots=True)
class _Timeline:
    """When one live request arrived and sampled, in steps and milliseconds."""

    arrival_step: int
    arrival_clock: float
    first_step: int = -1
    first_clock: float = 0.0
    last_step: int = -1
    last_clock: float = 0.0
    admitted: bool = False
    hit: bool = False


@dataclass
class _Series:
    waiting: array[int] = field(default_factory=lambda: array("q"))
    running: array[int] = field(default_factory=lambda: array("q"))
    swapped: array[int] = field(default_factory=lambda: array("q"))
    kv_blocks: array[int] = field(default_factory=lambda: array("q"))
    preemptions: array[int] = field(default_factory=lambda: array("q"))
    generated: array[int] = field(default_factory=lambda: array("q"))
    computed: array[int] = field(default_factory=lambda: array("q"))
    ttft_step: array[int] = field(default_factory=lambda: array("q"))
    tpot_step: array[int] = field(default_factory=lambda: array("q"))


class MetricsCollector:
    """Feed it a trace's steps in order with `step`, then read `result()`.

    Beside a checker of the same steps, share its state and `observe` the facts its
    `step` returns, so that the step is moved once. Beside the fast checker
    (kvsched.optimized.checker, a StepSink), it also takes the facts the compiled state
    counted over a run of steps (`observe_run`) and, when the spec's state takes over,
    when the live requests last sampled (`observe_samples`). Fed only runs of facts
    that a scheduler counted of its own steps (the compiled scheduler's simulation),
    no state moves with them: `live` then says how many requests are live at the end.
    """

    def __init__(self, config: Config, *, series: bool = True,
                 state: State | None = None) -> None:
        self.config = config
        if state is None:
            from kvsched.spec.state import State

            state = State(config)
        self.state: State = state
        self.times: dict[str, _Timeline] = {}
        self.ended = dict.fromkeys((Status.FINISHED, Status.ABORTED, Status.REJECTED), 0)
        self.steps = 0
        self.requests = 0
        self.generated = 0
        self.computed = 0
        self.prompt_tokens = 0
        self.clock = 0.0  # ms at the end of the last step
        self.timed = True  # every step so far had time_ms
        self.ttft = array("d")
        self.tpot = array("d")
        self.latency = array("d")
        self.ttft_ms = array("d")
        self.tpot_ms = array("d")
        self.preemptions = {"recompute": 0, "swap": 0}
        self.swap_ins = 0
        self.recomputed = 0
        self.cache = dict.fromkeys((f.name for f in fields(PrefixCache)), 0)
        self.sums = [0, 0, 0, 0]  # QUEUES
        self.peaks = [0, 0, 0, 0]
        self.series = _Series() if series else None
        self.live: Callable[[], int] = lambda: len(self.state.live)

    def step(self, rec: StepRecord) -> None:
        self.observe(rec, self.state.apply(rec))

    def observe(self, rec: StepRecord, f: StepFacts) -> None:
        """Record one step that `f` says the state went through."""
        start, end = self._clock(rec.time_ms)
        s = rec.step
        times = self.times
        for a in f.arrivals:
            if a.applied:
                self._arrive(a.request, s, start)
        for victim in f.valid_victims:
            self._victims(victim.mode, 1, victim.computed)
        # A lazy victim recomputes only what a reclaim takes from it.
        self.recomputed += sum(r.computed for r in f.reclaims if r.action.applied)
        self.swap_ins += sum(1 for a, _ in f.swap_ins if a.applied)
        if self.config.prefix_caching:
            self._cache(f)
        generated = 0
        computed = 0
        for c in f.chunks:
            if not c.action.applied or c.tokens < 1:
                continue
            computed += c.after - c.computed
            if c.computed < c.prompt_len:
                self.prompt_tokens += min(c.after, c.prompt_len) - c.computed
            if c.sampled:
                generated += 1
                t = times[c.action.request]
                if t.first_step < 0:
                    self._first_token(t, s, end, self.timed)
                t.last_step, t.last_clock = s, end
        # KV use while the batch runs: before the finishes release their blocks.
        if rec.free_blocks is not None:
            kv_used = self.config.num_gpu_blocks - rec.free_blocks + f.released_by_finish
        else:
            kv_used = self.config.num_gpu_blocks - f.free_at_batch
        for a in (*f.aborts, *(a for a, _ in f.rejections)):
            if a.applied:
                self._end(a.request, Status.ABORTED if a.action == "aborted"
                          else Status.REJECTED)
        for d in f.finishes:
            if d.action.applied:
                self._finish(times.pop(d.action.request), s, d.outputs, self.timed)
        count = self.state.count
        self._close(end, generated, computed, len(rec.preempted), count[Status.WAITING],
                    count[Status.RUNNING], count[Status.SWAPPED], kv_used)

    def observe_run(self, f: RunFacts) -> None:
        """Record a run of steps that the compiled state applied and counted itself
        (kvsched.optimized.facts.RunFacts): the same definitions as `observe`, each
        event in its order, each step's numbers at once."""
        timed, untimed = self.timed, f.untimed

        def timed_at(step: int) -> bool:  # every step up to `step` had time_ms
            return timed and (untimed < 0 or step < untimed)

        for rid, step, clock in zip(f.arrivals, f.arrival_steps, f.arrival_clocks,
                                    strict=True):
            self._arrive(rid, step, clock)
        self._victims("recompute", f.recomputes, f.recomputed)
        self._victims("swap", f.swaps, 0)
        self.swap_ins += f.swap_ins
        if self.config.prefix_caching:
            for rid, known, tokens in zip(f.admissions, f.admission_known, f.admission_hit,
                                          strict=True):
                self._admission(rid, known, tokens)
            self.cache["evictions"] += f.evicted
        times = self.times
        for rid, step, clock in zip(f.first_tokens, f.first_steps, f.first_clocks,
                                    strict=True):
            self._first_token(times[rid], step, clock, timed_at(step))
        for rid in f.aborted:
            self._end(rid, Status.ABORTED)
        for rid in f.rejected:
            self._end(rid, Status.REJECTED)
        for rid, step, outputs, clock in zip(f.finishes, f.finish_steps, f.finish_outputs,
                                             f.finish_clocks, strict=True):
            t = times.pop(rid)
            t.last_step, t.last_clock = step, clock  # it sampled the token it finished on
            self._finish(t, step, outputs, timed_at(step))
        self.prompt_tokens += f.prompt_tokens
        self._totals(f.generated, f.computed, f.victims, f.waiting, f.running, f.swapped,
                     f.kv_used)
        self.clock = f.clock
        if untimed >= 0:
            self.timed = False

    def observe_samples(self, samples: Iterable[tuple[str, int, float]]) -> None:
        """The last step (and its end in ms) at which live requests sampled, as the
        compiled state saw them, when the spec's state takes over from it."""
        times = self.times
        for rid, step, clock in samples:
            t = times[rid]
            if step > t.last_step:
                t.last_step, t.last_clock = step, clock

    # -- the definitions, one event at a time -------------------------------------------

    def _clock(self, time_ms: float | None) -> tuple[float, float]:
        """The step's start and end in ms."""
        if time_ms is None:
            self.timed = False
        return self.clock, self.clock + (time_ms or 0.0)

    def _arrive(self, rid: str, step: int, clock: float) -> None:
        self.times[rid] = _Timeline(step, clock)
        self.requests += 1

    def _victims(self, mode: str, count: int, computed: int) -> None:
        """`count` preemptions in `mode`, their victims having computed `computed`
        tokens in all."""
        self.preemptions[mode] = self.preemptions.get(mode, 0) + count
        if mode == "recompute":
            self.recomputed += computed

    def _first_token(self, t: _Timeline, step: int, clock: float, timed: bool) -> None:
        """`t` sampled its first token at `step`, ending at `clock` ms (`timed`: every
        step so far had time_ms)."""
        t.first_step, t.first_clock = step, clock
        self.ttft.append(step - t.arrival_step + 1)
        if self.series is not None:
            self.series.ttft_step.append(step)
        if timed:
            self.ttft_ms.append(clock - t.arrival_clock)

    def _end(self, rid: str, status: Status) -> None:
        """An aborted or rejected request."""
        self.ended[status] += 1
        self.times.pop(rid, None)

    def _finish(self, t: _Timeline, step: int, outputs: int, timed: bool) -> None:
        """`t` finished at `step` with `outputs` tokens sampled."""
        self.ended[Status.FINISHED] += 1
        self.latency.append(step - t.arrival_step + 1)
        if outputs >= 2:
            self.tpot.append((t.last_step - t.first_step) / (outputs - 1))
            if self.series is not None:
                self.series.tpot_step.append(step)
            if timed:
                self.tpot_ms.append((t.last_clock - t.first_clock) / (outputs - 1))

    def _close(self, end: float, generated: int, computed: int, preemptions: int,
               waiting: int, running: int, swapped: int, kv_used: int) -> None:
        """One step's totals and queues."""
        self.clock = end
        self._totals((generated,), (computed,), (preemptions,), (waiting,), (running,),
                     (swapped,), (kv_used,))

    def _totals(self, generated: Sequence[int], computed: Sequence[int],
                preemptions: Sequence[int], waiting: Sequence[int], running: Sequence[int],
                swapped: Sequence[int], kv_used: Sequence[int]) -> None:
        """Steps' totals and queues, one entry per step: summed, their peaks (in QUEUES
        order) and, with series, kept."""
        self.steps += len(generated)
        self.generated += sum(generated)
        self.computed += sum(computed)
        sums, peaks = self.sums, self.peaks
        for k, values in enumerate((waiting, running, swapped, kv_used)):
            if values:
                sums[k] += sum(values)
                peaks[k] = max(peaks[k], max(values))
        if self.series is not None:
            sr = self.series
            sr.waiting.extend(waiting)
            sr.running.extend(running)
            sr.swapped.extend(swapped)
            sr.kv_blocks.extend(kv_used)
            sr.preemptions.extend(preemptions)
            sr.generated.extend(generated)
            sr.computed.extend(computed)

    def _cache(self, f: StepFacts) -> None:
        """Count the step's admissions, hits and evictions (PrefixCache)."""
        hit = {h.action.request: len(h.blocks) * self.config.block_size for h in f.hits
               if h.refused is None}
        for c in f.chunks:
            if not c.action.applied or c.tokens < 1 or c.action.state != "waiting":
                continue
            rid = c.action.request
            self._admission(rid, c.known, hit.get(rid, 0))
        self.cache["evictions"] += f.evicted

    def _admission(self, rid: str, known: int, tokens: int) -> None:
        """A waiting request scheduled, knowing `known` tokens, `tokens` of them a hit."""
        cache = self.cache
        t = self.times[rid]
        cache["admissions"] += 1
        cache["queried_tokens"] += known
        if not t.admitted:
            t.admitted = True
            cache["requests"] += 1
        if tokens:
            cache["admissions_hit"] += 1
            cache["hit_tokens"] += tokens
            if not t.hit:
                t.hit = True
                cache["requests_hit"] += 1

    def result(self) -> Metrics:
        steps = self.steps
        mean = {k: (v / steps if steps else 0.0) for k, v in zip(QUEUES, self.sums, strict=True)}
        peak = dict(zip(QUEUES, self.peaks, strict=True))
        blocks = self.config.num_gpu_blocks
        timed = self.timed and steps > 0
        series = None
        if self.series is not None:
            sr = self.series
            series = Series(sr.waiting.tolist(), sr.running.tolist(), sr.swapped.tolist(),
                            sr.kv_blocks.tolist(), sr.preemptions.tolist(),
                            sr.generated.tolist(), sr.computed.tolist(),
                            list(zip(sr.ttft_step.tolist(), self.ttft.tolist(), strict=True)),
                            list(zip(sr.tpot_step.tolist(), self.tpot.tolist(),
                                     strict=True)))
        return Metrics(
            num_gpu_blocks=blocks, steps=steps, requests=self.requests,
            finished=self.ended[Status.FINISHED], aborted=self.ended[Status.ABORTED],
            rejected=self.ended[Status.REJECTED],
            unfinished=self.live(),
            generated_tokens=self.generated, computed_tokens=self.computed,
            prompt_tokens=self.prompt_tokens, duration_ms=self.clock if timed else None,
            ttft=Distribution.of(self.ttft), tpot=Distribution.of(self.tpot),
            latency=Distribution.of(self.latency),
            ttft_ms=Distribution.of(self.ttft_ms) if timed else None,
            tpot_ms=Distribution.of(self.tpot_ms) if timed else None,
            waiting_mean=mean["waiting"], waiting_max=peak["waiting"],
            running_mean=mean["running"], running_max=peak["running"],
            swapped_mean=mean["swapped"], swapped_max=peak["swapped"],
            kv_use_mean=mean["kv"] / blocks, kv_use_peak=peak["kv"] / blocks,
            kv_blocks_peak=peak["kv"], preemptions=dict(self.preemptions),
            swap_ins=self.swap_ins, recomputed_tokens=self.recomputed,
            prefix_cache=PrefixCache(**self.cache) if self.config.prefix_caching else None,
            series=series)


def metrics_of(config: Config, records: Iterable[StepRecord], *,
               series: bool = True) -> Metrics:
    """The metrics of a sequence of steps under `config`."""
    collector = MetricsCollector(config, series=series)
    for rec in records:
        collector.step(rec)
    return collector.result()


def metrics_of_trace(trace: IO[bytes] | TraceReader, *, series: bool = True,
                     on_header: Callable[[Header], None] | None = None) -> Metrics:
    """The metrics of a whole trace as it streams from a binary stream (`on_header`
    sees its header first) or from a TraceReader. A stream is read by the fast
    checker's loop (kvsched.optimized.checker): the compiled state moves through the
    steps it finds clean and counts their facts (RunFacts, `observe_run`), the spec's
    state through the others (`observe`); where the compiled state is not built (the
    loop then hands every step to the spec's state), and from a TraceReader, the
    spec's state moves through every step. The same Metrics
    either way; TraceError where the trace is malformed."""
    if isinstance(trace, TraceReader):
        return metrics_of(trace.header.config, trace, series=series)
    from kvsched.optimized.checker import check_trace_vectorized

    made: list[MetricsCollector] = []

    def collector(state: State) -> MetricsCollector:
        made.append(MetricsCollector(state.config, series=series, state=state))
        return made[-1]

    # The metrics need no verdict: no count of preemptions hands a step to the spec's
    # Checker (no-thrash), only what the compiled state cannot take.
    check_trace_vectorized(trace, max_preemptions=NO_THRASH_LIMIT, on_header=on_header,
                           sink=collector)
    return made[0].result()
