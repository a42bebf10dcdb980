"""The checker: replay a trace step by step through the transition rule and report every
broken MUST and SHOULD invariant.

The replay follows design.md section 2 phase by phase: arrivals and aborts, rejections,
preemptions, swap-ins, the scheduled set, finishes. Its own bookkeeping is the spec's
idea of the state (N, C, G, H per live request, free GPU and host blocks); the engine's
reported numbers (free_blocks, new_blocks) are compared against it. Memory is bounded by
the live requests plus one entry per ended id (to tell "finished" from "unknown").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvsched.spec import must, should
from kvsched.spec.blocks import blocks_needed, never_completes
from kvsched.spec.model import Config, Request, Status, StepRecord
from kvsched.spec.trace import TraceError, TraceReader
from kvsched.spec.violation import INVARIANTS, SHOULD, Violation


@dataclass(slots=True)
class Tracked:
    """The spec's view of one live request."""

    request: Request
    status: Status
    num_tokens: int
    num_computed: int = 0
    gpu_blocks: int = 0
    host_blocks: int = 0
    preemptions: int = 0
    block_ids: list[int] = field(default_factory=list)
    recomputing: bool = False  # a recompute victim whose first new chunk is not yet seen


@dataclass
class Report:
    """What a check found. `violations` keeps the first `keep` of each id; `counts` all."""

    violations: list[Violation] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    steps: int = 0
    scheduled_entries: int = 0
    requests: int = 0
    complete: bool = False
    unknown_keys: dict[str, int] = field(default_factory=dict)

    def errors(self) -> int:
        """MUST violations and profile divergences: these fail a check."""
        return sum(n for k, n in self.counts.items() if INVARIANTS[k] != SHOULD)

    def warnings(self) -> int:
        """SHOULD violations: these fail only a strict check."""
        return sum(n for k, n in self.counts.items() if INVARIANTS[k] == SHOULD)

    def ids(self) -> set[str]:
        return set(self.counts)


class Checker:
    """Feed it the steps of one trace in order, then call `end`."""

    def __init__(self, config: Config, max_preemptions: int = should.DEFAULT_MAX_PREEMPTIONS,
                 keep: int = 20) -> None:
        self.config = config
        self.max_preemptions = max_preemptions
        self.keep = keep
        self.report = Report()
        self.live: dict[str, Tracked] = {}
        self.ended: dict[str, Status] = {}
        self.free = config.num_gpu_blocks
        self.free_host = config.num_cpu_blocks
        self.running = 0
        self.leaked = 0  # blocks the engine reported missing, so each leak is told once
        self.track_ids: bool | None = None
        self.owner: dict[int, str] = {}
        self.step_no = -1

    # -- bookkeeping ------------------------------------------------------------------

    def _flag(self, v: Violation | None) -> None:
        if v is None:
            return
        self.report.counts[v.invariant] += 1
        if self.report.counts[v.invariant] <= self.keep:
            self.report.violations.append(v)

    def _get(self, rid: str, what: str, line: int) -> Tracked | None:
        """The live request, or None if it has ended; unknown ids are bad input."""
        t = self.live.get(rid)
        if t is None and rid not in self.ended:
            raise TraceError(line, f"unknown request id {rid!r} in {what} "
                                   "(it never arrived)")
        return t

    def _set_status(self, t: Tracked, status: Status) -> None:
        self.running += (status == Status.RUNNING) - (t.status == Status.RUNNING)
        t.status = status

    def _release_gpu(self, t: Tracked) -> int:
        released = t.gpu_blocks
        self.free += released
        t.gpu_blocks = 0
        for b in t.block_ids:
            self.owner.pop(b, None)
        t.block_ids = []
        return released

    def _end(self, t: Tracked, status: Status) -> int:
        released = self._release_gpu(t)
        self.free_host += t.host_blocks
        t.host_blocks = 0
        self._set_status(t, status)
        del self.live[t.request.id]
        self.ended[t.request.id] = status
        return released

    def _state(self, rid: str, tags: dict[str, str]) -> str:
        if rid in tags:
            return tags[rid]
        t = self.live.get(rid)
        return t.status.value if t is not None else self.ended[rid].value

    # -- one step ---------------------------------------------------------------------

    def step(self, rec: StepRecord) -> None:
        cfg = self.config
        self.step_no = rec.step
        s = rec.step
        self.report.steps += 1
        self.report.scheduled_entries += len(rec.scheduled)
        tags: dict[str, str] = {}  # this step's transient states, for one-state

        # 1. arrivals, then aborts
        for r in rec.arrivals:
            if r.id in self.live or r.id in self.ended:
                raise TraceError(rec.line, f"request id {r.id!r} arrives twice; ids must be "
                                           "unique")
            self.live[r.id] = Tracked(r, Status.WAITING, r.prompt_len)
            self.report.requests += 1
            tags[r.id] = "arriving"
        for rid in rec.aborted:
            t = self._get(rid, "aborted", rec.line)
            v = must.one_state(s, rid, "aborted", self._state(rid, tags))
            self._flag(v)
            if v is None and t is not None:
                self._end(t, Status.ABORTED)
        for rid in list(tags):
            if tags[rid] == "arriving":
                del tags[rid]
        free_before = self.free

        # 2. rejections
        for rej in rec.rejected:
            t = self._get(rej.id, "rejected", rec.line)
            v = must.one_state(s, rej.id, "rejected", self._state(rej.id, tags))
            self._flag(v)
            if v is None and t is not None:
                self._flag(must.reject(s, t.request, cfg))
                self._end(t, Status.REJECTED)

        # 3. preemptions
        reclaim = 0
        last_victim = 0
        last_victim_need: tuple[int, int, int] = (0, 0, 0)  # its N, C, G before
        invalid_victim = False
        released_by_victims = 0
        for p in rec.preempted:
            t = self._get(p.id, "preempted", rec.line)
            v = must.preempt_victim(s, p.id, self._state(p.id, tags))
            self._flag(v)
            if v is not None or t is None:
                invalid_victim = True
                continue
            t.preemptions += 1
            last_victim_need = (t.num_tokens, t.num_computed, t.gpu_blocks)
            self._flag(should.no_thrash(s, p.id, t.preemptions, self.max_preemptions)
                       if t.preemptions == self.max_preemptions + 1 else None)
            if p.mode == "swap":
                self._flag(must.cpu_budget(s, p.id, t.gpu_blocks, self.free_host))
                self.free_host -= t.gpu_blocks
                t.host_blocks = t.gpu_blocks
                last_victim = self._release_gpu(t)
                self._set_status(t, Status.SWAPPED)
                tags[p.id] = "swapped out this step"
            else:
                last_victim = self._release_gpu(t)
                t.num_computed = 0
                t.recomputing = True
                self._set_status(t, Status.WAITING)
                tags[p.id] = "just preempted"
            reclaim += last_victim
            released_by_victims += last_victim

        # 4. swap-ins: the host blocks come back to the GPU
        demand = 0
        expected_ids: dict[str, int] = {}
        told: set[str] = set()
        for rid in rec.swapped_in:
            t = self._get(rid, "swapped_in", rec.line)
            v = must.one_state(s, rid, "swapped in", self._state(rid, tags))
            self._flag(v)
            if v is not None or t is None:
                continue
            t.gpu_blocks = t.host_blocks
            self.free -= t.host_blocks
            self.free_host += t.host_blocks
            demand += t.host_blocks
            expected_ids[rid] = t.host_blocks
            t.host_blocks = 0
            self._set_status(t, Status.RUNNING)
            tags[rid] = "swapped in"

        # 5. the scheduled set
        tokens = 0
        sampled: list[Tracked] = []
        recomputed: list[str] = []
        for rid, n in rec.scheduled:
            t = self._get(rid, "scheduled", rec.line)
            v = must.one_state(s, rid, "scheduled", self._state(rid, tags))
            self._flag(v)
            tags[rid] = "already scheduled this step"
            if v is not None or t is None:
                continue
            tokens += max(n, 0)
            v = must.token_range(s, rid, n, t.num_computed, t.num_tokens, cfg)
            self._flag(v)
            if n < 1:
                continue
            if t.status == Status.WAITING:
                self._set_status(t, Status.RUNNING)
            db = blocks_needed(t.num_computed, n, t.gpu_blocks, cfg.block_size)
            demand += db
            self.free -= db
            t.gpu_blocks += db
            expected_ids[rid] = expected_ids.get(rid, 0) + db
            if t.recomputing:
                t.recomputing = False
                recomputed.append(rid)
                given = rec.new_blocks.get(rid, ()) if rec.new_blocks is not None else None
                if given is not None and len(given) != db:
                    self._flag(must.preempt_recompute(s, rid, len(given), db))
                    told.add(rid)  # told once, as preempt
            t.num_computed = min(t.num_computed + n, t.num_tokens)
            if t.num_computed == t.num_tokens:
                self._flag(must.finish_length(s, rid, t.num_tokens, cfg.max_model_len))
                t.num_tokens += 1
                sampled.append(t)
        self._flag(must.token_budget(s, tokens, cfg.max_num_batched_tokens))
        over_budget = must.kv_budget(s, demand, free_before, reclaim)
        self._flag(over_budget)
        self._flag(must.seq_limit(s, self.running, cfg.max_num_seqs))
        self._check_block_ids(rec, expected_ids, told)

        # 6. finishes
        sampled_ids = {t.request.id for t in sampled}
        finished = set(rec.finished)
        released_by_finish = 0
        for rid in rec.finished:
            t = self._get(rid, "finished", rec.line)
            if t is None:
                self._flag(must.one_state(s, rid, "finished", self._state(rid, tags)))
                continue
            if rid not in sampled_ids:
                self._flag(must.finish_sampled(s, rid))
            released_by_finish += self._end(t, Status.FINISHED)
        for t in sampled:
            if t.request.id not in finished:
                self._flag(must.finish_due(s, t.request.id, t.num_tokens - t.request.prompt_len,
                                           t.num_tokens, t.request, cfg))

        self._check_accounting(rec, released_by_victims, released_by_finish, recomputed)
        if rec.preempted and not invalid_victim and over_budget is None:
            # The last victim's own next chunk, at most its threshold-capped rest (it may
            # have been scheduled first and taken back, as vLLM's priority victim is).
            known, computed, held = last_victim_need
            n = known - computed
            threshold = cfg.long_prefill_token_threshold
            if 0 < threshold < n:
                n = threshold
            n = min(n, cfg.max_num_batched_tokens)
            own = blocks_needed(computed, n, held, cfg.block_size)
            self._flag(should.needed_preemption(s, demand + own, free_before, reclaim,
                                                last_victim))
        if not rec.scheduled and not rec.preempted and not rec.swapped_in:
            self._flag(should.no_idle(s, self._runnable()))

    def _check_block_ids(self, rec: StepRecord, expected: dict[str, int],
                         told: set[str]) -> None:
        if self.track_ids is None:
            self.track_ids = rec.new_blocks is not None
        if rec.new_blocks is None:
            self.track_ids = False  # one step without ids loses the owners for good
        if not self.track_ids or rec.new_blocks is None:
            return
        s = rec.step
        # Batch order (swap-ins, then scheduled), then the rest: the same report every run.
        for rid in dict.fromkeys([*expected, *rec.new_blocks]):
            self._get(rid, "new_blocks", rec.line)  # an id that never arrived is bad input
            given = rec.new_blocks.get(rid, ())
            if rid not in told:
                # A request that was not scheduled needs no new block at all.
                self._flag(must.block_ids_count(s, rid, len(given), expected.get(rid, 0)))
            t = self.live.get(rid)
            for b in given:
                v = must.block_ids_owner(s, rid, b, self.owner.get(b),
                                         self.config.num_gpu_blocks)
                self._flag(v)
                if t is not None and v is None:
                    self.owner[b] = rid
                    t.block_ids.append(b)

    def _check_accounting(self, rec: StepRecord, by_victims: int, by_finish: int,
                          recomputed: list[str]) -> None:
        if rec.free_blocks is None:
            return
        if rec.free_blocks == self.free:
            self.leaked = 0  # back in agreement: an earlier difference was transient
            return
        derived = self.free - self.leaked
        missing = derived - rec.free_blocks
        if missing == 0:
            return
        s = rec.step
        if 0 < missing <= by_victims:
            victims = ", ".join(p.id for p in rec.preempted)
            self._flag(must.preempt_release(s, victims, missing, by_victims))
        elif 0 < missing <= by_finish:
            self._flag(must.finish_leak(s, ", ".join(rec.finished), missing, by_finish))
        elif recomputed:
            # The first chunk after a recompute took other than Db blocks from C = 0.
            self._flag(must.preempt_recompute_count(s, ", ".join(recomputed), missing))
        else:
            self._flag(must.accounting(s, rec.free_blocks, derived))
        self.leaked += missing

    def _runnable(self) -> str | None:
        """A live request whose smallest next chunk fits right now, if any."""
        cfg = self.config
        for rid, t in self.live.items():
            if t.status != Status.RUNNING and self.running >= cfg.max_num_seqs:
                continue
            left = t.num_tokens - t.num_computed
            n = 1 if cfg.chunked_prefill else left
            if n > cfg.max_num_batched_tokens:
                continue
            held = t.host_blocks if t.status == Status.SWAPPED else t.gpu_blocks
            need = blocks_needed(t.num_computed, n, held, cfg.block_size)
            if t.status == Status.SWAPPED:
                need += t.host_blocks
            if t.status != Status.RUNNING and self.running > 0:
                need += cfg.watermark_blocks
            if need <= self.free:
                return rid
        return None

    def end(self, complete: bool) -> Report:
        """Close the trace; a complete one (with its end line) is checked for completion."""
        self.report.complete = complete
        if complete:
            for rid, t in self.live.items():
                never = never_completes(self.config, t.request.prompt_len, t.request.max_tokens)
                self._flag(should.completion(self.step_no, rid, t.status.value, never))
        return self.report


def check_trace(reader: TraceReader,
                max_preemptions: int = should.DEFAULT_MAX_PREEMPTIONS) -> Report:
    """Check a whole trace as it streams from `reader`."""
    checker = Checker(reader.header.config, max_preemptions)
    for rec in reader:
        checker.step(rec)
    report = checker.end(reader.complete)
    report.unknown_keys = dict(reader.unknown_keys)
    return report


def check_steps(config: Config, steps: Iterable[StepRecord], complete: bool,
                max_preemptions: int = should.DEFAULT_MAX_PREEMPTIONS) -> Report:
    checker = Checker(config, max_preemptions)
    for rec in steps:
        checker.step(rec)
    return checker.end(complete)
