"""The SHOULD invariants of docs/spec.md sections 6 to 8: liveness, reported as warnings.

One function per invariant id, named after it, over the facts of one step (or, for
completion, the state at the end of a complete trace).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kvsched.spec.blocks import (
    admission_watermark,
    allocation_reserve,
    blocks_needed,
    never_completes,
)
from kvsched.spec.model import Config, Request, RequestView, Status, StepRecord
from kvsched.spec.violation import DEFAULT_MAX_PREEMPTIONS as DEFAULT_MAX_PREEMPTIONS
from kvsched.spec.violation import DEFAULT_STALL_STEPS as DEFAULT_STALL_STEPS
from kvsched.spec.violation import Stalled as Stalled
from kvsched.spec.violation import Violation

if TYPE_CHECKING:  # the state is only read here: a driven run's loop need not load it
    from kvsched.spec.interface import Scheduler
    from kvsched.spec.state import State, StepFacts


def next_chunk(config: Config, request: Request, view: RequestView, running: int
               ) -> tuple[int, int]:
    """(Dn, blocks) of a live request's smallest next chunk: one token with chunked
    prefill, else the rest of what it knows; the free GPU blocks it needs, with what an
    admission or a swap-in reserves, a swapped request's host blocks coming back, and
    the watermark of an admission or a swap-in while `running` requests run."""
    n = 1 if config.chunked_prefill else view.num_tokens - view.num_computed
    swapped = view.status == Status.SWAPPED
    admitted = view.status != Status.RUNNING
    held = view.host_blocks if swapped else view.gpu_blocks
    reserve = allocation_reserve(config, request, view.num_tokens) if admitted else 0
    need = blocks_needed(view.num_computed, n, held, config.block_size, reserve)
    if swapped:
        need += view.host_blocks
    if admitted:
        need += admission_watermark(config, running)
    return n, need


def fits(config: Config, view: RequestView, chunk: tuple[int, int], free: int,
         running: int) -> bool:
    """Whether `chunk` (next_chunk's) fits right now: a seat under the sequence limit
    (or it runs already), the token budget, the free blocks."""
    n, need = chunk
    seated = view.status == Status.RUNNING or running < config.max_num_seqs
    return seated and n <= config.max_num_batched_tokens and need <= free


def runnable(state: State) -> str | None:
    """A live request whose smallest next chunk fits right now (the free blocks, with
    what an admission or a swap-in reserves, the token budget, the sequence limit, the
    watermark of an admission or a swap-in), if any."""
    cfg = state.config
    for rid, t in state.live.items():
        view = t.view()
        if fits(cfg, view, next_chunk(cfg, t.request, view, state.running), state.free,
                state.running):
            return rid
    return None


def no_idle(f: StepFacts, state: State) -> list[Violation]:
    """no-idle: a step that schedules nothing and preempts nothing leaves no request
    that could have run (`runnable`, on the state after the step)."""
    if not f.idle:
        return []
    rid = runnable(state)
    if rid is None:
        return []
    return [Violation("no-idle", f.step,
                      f"the step schedules nothing although {rid} could run", request=rid)]


def completion(step: int, state: State) -> list[Violation]:
    """completion: in a complete trace every request ends finished, rejected or aborted;
    one that can never complete is rejected, not left waiting forever."""
    out = []
    for rid, t in state.live.items():
        never = never_completes(state.config, t.request.prompt_len, t.request.max_tokens)
        why = f"; it can never complete ({never}) and should have been rejected" if never \
            else ""
        out.append(Violation("completion", step,
                             f"{rid} is still {t.status.value} when the trace ends{why}",
                             request=rid))
    return out


def no_thrash(f: StepFacts, limit: int) -> list[Violation]:
    """no-thrash: no request is preempted more than K times (told once, at the K+1st)."""
    return [thrashed(f.step, v.action.request, v.preemptions, limit)
            for v in f.valid_victims if v.preemptions == limit + 1]


def thrashed(step: int, rid: str, preemptions: int, limit: int) -> Violation:
    """The no-thrash violation of request `rid`, preempted `preemptions` times in all
    at step `step` (the words of every checker that tells it)."""
    return Violation("no-thrash", step, f"{rid} has been preempted {preemptions} times "
                     f"(limit {limit})", request=rid, lhs=preemptions, relation="<=",
                     rhs=limit)


def own_chunk_blocks(known: int, computed: int, held: int, config: Config) -> int:
    """Db of a victim's own next chunk: its threshold-capped rest, within the token
    budget, from its N, C and G before it was preempted."""
    n = known - computed
    threshold = config.long_prefill_token_threshold
    if 0 < threshold < n:
        n = threshold
    n = min(n, config.max_num_batched_tokens)
    return blocks_needed(computed, n, held, config.block_size)


def preemption_was_needed(demand: int, free: int, reclaim: int, last_released: int) -> bool:
    """demand + Db_v > B_free + B_reclaim - G_v: the step could not fit without its last
    victim v (`demand` includes v's own chunk, `last_released` is G_v)."""
    return demand > free + reclaim - last_released


def needed_preemption(f: StepFacts, config: Config, ordered: bool = True
                      ) -> list[Violation]:
    """needed-preemption: the step could not fit without its last victim v:
    demand + Db_v > B_free + B_reclaim - G_v, where demand is the scheduled set's new
    blocks and Db_v what v's own next chunk needed (v may be the request that could not
    grow and gave itself up). Then no fewer victims would have done. Judged only on steps
    whose victims were all running and whose demand fit (else a MUST invariant speaks).
    When the trace lists victims as a set (`ordered` False) any of them may have been the
    last, so the step is told only if it fits without each of them."""
    victims = f.valid_victims
    if not victims or len(victims) != len(f.victims) \
            or f.demand > f.free_before + f.reclaim:
        return []
    for v in victims if not ordered else victims[-1:]:
        demand = f.demand + own_chunk_blocks(v.known, v.computed, v.held, config)
        if preemption_was_needed(demand, f.free_before, f.reclaim, v.released):
            return []
    last = victims[-1]
    demand = f.demand + own_chunk_blocks(last.known, last.computed, last.held, config)
    without_last = f.free_before + f.reclaim - last.released
    return [Violation("needed-preemption", f.step,
                      f"the step preempted, but its {demand} new blocks fit in the "
                      f"{without_last} available without its last victim",
                      lhs=demand, relation=">", rhs=without_last)]


# -- progress: liveness over a run of steps ---------------------------------------------


def moves(rec: StepRecord) -> bool:
    """Whether a step changes the work already there: it aborts, rejects, preempts, swaps
    in, schedules or finishes something (an arrival only adds work)."""
    return bool(rec.scheduled or rec.preempted or rec.swapped_in or rec.finished
                or rec.aborted or rec.rejected)


class Stall:
    """The steps in a row that do not move (`moves`) while some request is live. After
    such a step the state is what it was before it, so a scheduler that decides from its
    state alone decides the same again: past `limit` of them (K) a run is stuck, and a
    trace whose engine waits so long has let work wait without cause."""

    def __init__(self, limit: int = DEFAULT_STALL_STEPS) -> None:
        """pre: limit >= 1"""
        self.limit = limit
        self.quiet = 0

    def reset(self) -> None:
        """A step that moved (checked elsewhere): no quiet steps in a row."""
        self.quiet = 0

    def observe(self, moved: bool, live: bool) -> bool:
        """Count one step; True at the `limit`-th quiet step in a row (told once)."""
        self.quiet = self.quiet + 1 if live and not moved else 0
        return self.quiet == self.limit


# The stuck requests a progress violation names in full (the rest are counted).
NAMED_STUCK = 3
_ORDER = {Status.RUNNING: 0, Status.SWAPPED: 1, Status.WAITING: 2}


def waits_for(config: Config, request: Request, view: RequestView, free: int,
              running: int) -> str:
    """Why a live request does not run now, in words, with the numbers."""
    rid = request.id
    n, need = next_chunk(config, request, view, running)
    if view.status == Status.SWAPPED:
        where, what = f"swapped out with {_many(view.host_blocks, 'host block')}", \
            "swapping it in"
    elif view.status == Status.RUNNING:
        where, what = f"running with {_many(view.gpu_blocks, 'GPU block')}", \
            "its next chunk"
    else:
        where, what = f"waiting with {_many(view.num_tokens, 'token')}", "admitting it"
    if view.status != Status.RUNNING and running >= config.max_num_seqs:
        return (f"{rid} is {where}: {running} requests run, the sequence limit "
                f"(max_num_seqs {config.max_num_seqs})")
    if n > config.max_num_batched_tokens:
        return (f"{rid} is {where}: its next chunk of {_many(n, 'token')} is over the "
                f"token budget {config.max_num_batched_tokens}")
    watermark = admission_watermark(config, running) if view.status != Status.RUNNING \
        else 0
    beside = f" (the watermark's {watermark} included)" if watermark else ""
    could = "" if need > free else ", yet it is not scheduled"
    return (f"{rid} is {where}: {what} needs {_many(need, 'free GPU block')}{beside}, "
            f"{free} {'is' if free == 1 else 'are'} free{could}")


def _many(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def progress(step: int, limit: int, config: Config,
             live: Sequence[tuple[Request, RequestView]], free: int, running: int
             ) -> Violation:
    """progress: while work waits, some step within every K in a row changes the state
    (`Stall`); told at the K-th quiet step, naming the live requests and why each waits
    (running ones first, then swapped, then waiting)."""
    stuck = sorted(live, key=lambda rv: _ORDER.get(rv[1].status, 3))
    why = "; ".join(waits_for(config, r, v, free, running) for r, v in stuck[:NAMED_STUCK])
    more = f"; and {len(stuck) - NAMED_STUCK} more" if len(stuck) > NAMED_STUCK else ""
    return Violation("progress", step,
                     f"for {limit} steps nothing was scheduled, preempted, swapped in or "
                     f"finished while {len(stuck)} "
                     f"{'request waits' if len(stuck) == 1 else 'requests wait'}: "
                     f"{why}{more}",
                     request=stuck[0][0].id if stuck else None)


def state_progress(step: int, limit: int, state: State) -> Violation:
    """`progress` over the checker's state."""
    return progress(step, limit, state.config,
                    [(t.request, t.view()) for t in state.live.values()], state.free,
                    state.running)


def stalled_run(scheduler: Scheduler, request_of: Callable[[str], Request], step: int,
                limit: int) -> Stalled:
    """The Stalled of a driven run stuck at `step`, from the scheduler's own view of its
    live requests (`request_of` gives each one's Request)."""
    views = scheduler.states()
    running = sum(v.status == Status.RUNNING for v in views.values())
    return Stalled(progress(step, limit, scheduler.config,
                            [(request_of(rid), v) for rid, v in views.items()],
                            scheduler.free_blocks(), running))
