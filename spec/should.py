"""The SHOULD invariants of docs/spec.md sections 6 to 8: liveness, reported as warnings.

One function per invariant id, named after it, over the facts of one step (or, for
completion, the state at the end of a complete trace).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
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
from kvsched.spec.violation import DEFAULT_STARVE_STEPS as DEFAULT_STARVE_STEPS
from kvsched.spec.violation import Stalled as Stalled
from kvsched.spec.violation import Violation

if TYPE_CHECKING:  # the state is only read here: a driven run's loop need not load it
    from kvsched.spec.interface import Scheduler
    from kvsched.spec.profiles import Profile
    from kvsched.spec.state import State, StepFacts


# -- where each SHOULD is judged ----------------------------------------------------------
#
# no-idle, completion and progress are engine-neutral: no engine's policy idles while a
# request could run, leaves work unfinished or stops moving, so they are judged on every
# trace. no-thrash, needed-preemption and starvation are measured against what vLLM v1's
# step does (admission that holds its blocks, preemption only for blocks, admission in
# rank order); where an engine's documented policy does otherwise they are judged only
# where that policy cannot be the cause: the trace's steps (its config) say so, and so
# does the profile a trace is checked under (`unjudged`).


def sglang_steps(config: Config) -> bool:
    """Whether a trace of `config` runs SGLang's steps (step_mix other than "any")."""
    return config.step_mix != "any"


def starvation_judged(config: Config) -> bool:
    """Whether starvation is judged on a trace of `config`: not on prefill-or-decode steps
    (step_mix other than "any": SGLang's, LMDeploy's), whose documented policies pass
    requests over (SGLang: a retracted request rejoins the queue at its end; admission
    reserves the future output of the running ones, so a smaller later prompt may fit
    where an earlier one does not. LMDeploy: short prompts go first on short turns)."""
    return not sglang_steps(config)


def unjudged(config: Config, profile: Profile | None = None) -> dict[str, str]:
    """The SHOULD ids not judged on a trace of `config` checked under `profile` (None:
    without one), each with why: those a step kind's or a profile's documented policy
    breaks by design (docs/spec.md, section 7, each id's "Where it is judged")."""
    out: dict[str, str] = {}
    if not starvation_judged(config):
        out["starvation"] = ("not on prefill-or-decode steps (SGLang's, LMDeploy's: "
                             f"step_mix {config.step_mix}), whose policies pass requests "
                             "over")
    if profile is None:
        return out
    name, knobs = profile.name, profile.knobs
    if profile.scheduler == "v1":
        if not knobs.reserve_full_sequence:
            out["no-thrash"] = (f"not under profile {name}, whose admission holds blocks "
                                "for a prompt's first chunk only (reserve_full_sequence "
                                "off, as vLLM before 0.19), so under memory pressure it "
                                "admits and preempts the same requests again and again")
        if knobs.over_budget_prompt == "skip" and not config.chunked_prefill:
            out["starvation"] = (f"not under profile {name}, which without chunked "
                                 "prefill passes over a prompt above the token budget "
                                 "left and puts the passed-over requests back in reverse "
                                 "order (over_budget_prompt skip, as vLLM 0.11)")
    elif profile.scheduler == "v0":
        if knobs.v0.grow_check == "worst_case":
            out["needed-preemption"] = (f"not under profile {name}, which preempts when "
                                        "fewer blocks are free than a request's next "
                                        "tokens touch, its partly filled last block "
                                        "counted as new (vLLM V0's can_append_slots)")
        if config.policy == "priority" and config.chunked_prefill:
            out["starvation"] = (f"not under profile {name} with the priority policy and "
                                 "chunked prefill, which admits in arrival order "
                                 "whatever the priority (vLLM V0)")
    return out


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
        if t.status == Status.HELD:
            continue  # finished: it waits for nothing
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
    one that can never complete is rejected, not left waiting forever. (A held one has
    finished: that it still holds blocks is accounting's, must.held_at_end.)"""
    out = []
    for rid, t in state.live.items():
        if t.status == Status.HELD:
            continue
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


def seat_preemption(f: StepFacts, config: Config) -> bool:
    """Whether a step's victims may have given up their seats rather than their blocks:
    on SGLang's steps under the priority policy, a step whose running requests and
    victims fill max_num_seqs (SGLang's priority preemption frees a seat at the
    running-request limit, its victims sized by the future output they had reserved)."""
    return (sglang_steps(config) and config.policy == "priority"
            and f.running + len(f.victims) >= config.max_num_seqs)


def needed_preemption(f: StepFacts, config: Config, ordered: bool = True
                      ) -> list[Violation]:
    """needed-preemption: the step could not fit without its last victim v:
    demand + Db_v > B_free + B_reclaim - G_v, where demand is the scheduled set's new
    blocks and Db_v what v's own next chunk needed (v may be the request that could not
    grow and gave itself up). Then no fewer victims would have done. Judged only on steps
    whose victims were all running and whose demand fit (else a MUST invariant speaks),
    and not on a step whose victims may have given up their seats (`seat_preemption`).
    When the trace lists victims as a set (`ordered` False) any of them may have been the
    last, so the step is told only if it fits without each of them."""
    victims = f.valid_victims
    if not victims or len(victims) != len(f.victims) \
            or f.demand > f.free_before + f.reclaim or seat_preemption(f, config):
        return []
    # A lazy victim gives back what a reclaim of it in the same step releases.
    reclaimed = {r.action.request: r.released for r in f.reclaims}
    for v in victims if not ordered else victims[-1:]:
        demand = f.demand + own_chunk_blocks(v.known, v.computed, v.held, config)
        gave = v.released + reclaimed.get(v.action.request, 0)
        if preemption_was_needed(demand, f.free_before, f.reclaim, gave):
            return []
    last = victims[-1]
    demand = f.demand + own_chunk_blocks(last.known, last.computed, last.held, config)
    without_last = (f.free_before + f.reclaim - last.released
                    - reclaimed.get(last.action.request, 0))
    return [Violation("needed-preemption", f.step,
                      f"the step preempted, but its {demand} new blocks fit in the "
                      f"{without_last} available without its last victim",
                      lhs=demand, relation=">", rhs=without_last)]


# -- progress: liveness over a run of steps ---------------------------------------------


def moves(rec: StepRecord) -> bool:
    """Whether a step changes the work already there: it aborts, rejects, preempts, swaps
    in, schedules, finishes, releases or reclaims something (an arrival only adds
    work)."""
    return bool(rec.scheduled or rec.preempted or rec.swapped_in or rec.finished
                or rec.aborted or rec.rejected or rec.released or rec.reclaimed)


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
                    [(t.request, t.view()) for t in state.live.values()
                     if t.status != Status.HELD], state.free, state.running)


def stalled_run(scheduler: Scheduler, request_of: Callable[[str], Request], step: int,
                limit: int) -> Stalled:
    """The Stalled of a driven run stuck at `step`, from the scheduler's own view of its
    live requests (`request_of` gives each one's Request)."""
    views = scheduler.states()
    running = sum(v.status == Status.RUNNING for v in views.values())
    return Stalled(progress(step, limit, scheduler.config,
                            [(request_of(rid), v) for rid, v in views.items()
                             if v.status != Status.HELD],
                            scheduler.free_blocks(), running))


def ends_stuck(step: int, quiet: int, state: State) -> Violation:
    """ends-stuck (a MUST-level verdict on the end of a trace): a trace without its end
    line whose last `quiet` steps, at least progress's K, moved nothing while requests
    were live; told once, at its last step, naming who waits and why (as `progress`)."""
    v = state_progress(step, quiet, state)
    return replace(v, invariant="ends-stuck", message=f"the trace ends stuck: {v.message}")


# -- starvation: one request passed over while others move ------------------------------


def rank(config: Config, request: Request) -> tuple[int, int]:
    """The order a fair scheduler admits waiting requests in, lowest first: by arrival
    step (fcfs), or by priority, then arrival step (priority)."""
    first = request.priority if config.policy == "priority" else 0
    return first, request.arrival_step


@dataclass(frozen=True)
class PassedOver:
    """A waiting request passed over in a step: `by` ranked after it and was admitted,
    and its smallest next chunk would have fit in `by`'s place. `wait` tells one stay in
    the queue from another: its arrival step and preemptions (a request that runs again
    and goes back to waiting has been preempted once more)."""

    request: str
    by: str
    wait: tuple[int, int]


def passed_over(f: StepFacts, state: State) -> list[PassedOver]:
    """The waiting requests a step passed over: each W waiting before and after the step
    (not one of its victims), and X admitted for the first time (never preempted: a
    resumed request rejoins the queue where the engine's preemption policy puts it) and
    still live after it, rank(W) < rank(X), such that W's smallest next chunk
    (`next_chunk`) fits (`fits`) with X's seat, the token budget the step left plus X's
    tokens, and the blocks the batch left free plus those X took: W could have been
    admitted instead of X. The first such X in batch order names the pass. Judged on
    steps of step_mix "any" only (`starvation_judged`)."""
    cfg = state.config
    if not state.count[Status.WAITING] or not starvation_judged(cfg):
        return []
    admitted = [(t, c.tokens, c.new_blocks) for c in f.chunks
                if c.action.state == "waiting" and c.action.applied and c.tokens >= 1
                and (t := state.live.get(c.action.request)) is not None
                and t.preemptions == 0]
    if not admitted:
        return []
    last = max(rank(cfg, t.request) for t, _, _ in admitted)
    left = cfg.max_num_batched_tokens - f.tokens
    victims = {v.action.request for v in f.victims}
    seats = f.running - 1
    out = []
    for rid, w in state.live.items():
        key = rank(cfg, w.request)
        if cfg.policy != "priority" and key >= last:
            break  # live requests are in arrival order: the rest arrived no earlier
        if w.status != Status.WAITING or key >= last or rid in victims:
            continue
        view = w.view()
        chunk = next_chunk(cfg, w.request, view, seats)
        by = next((x.request.id for x, tokens, took in admitted
                   if key < rank(cfg, x.request) and chunk[0] <= left + tokens
                   and fits(cfg, view, chunk, f.free_at_batch + took, seats)), None)
        if by is not None:
            out.append(PassedOver(rid, by, (w.request.arrival_step, w.preemptions)))
    return out


class Starvation:
    """starvation: how long each waiting request has been passed over (`passed_over`):
    from the first step that passed it over in its present wait to each later one;
    past `limit` steps (K) it is starved, told once per wait. A wait ends when the request
    runs, ends or goes back to waiting after a preemption (a new wait)."""

    def __init__(self, limit: int = DEFAULT_STARVE_STEPS) -> None:
        """pre: limit >= 1"""
        self.limit = limit
        # request -> (its wait, the step first passed over in it, told)
        self.since: dict[str, tuple[tuple[int, int], int, bool]] = {}

    def observe(self, step: int, passed: list[PassedOver], state: State) -> list[Violation]:
        """Count one step's passes (`state` after it); the starvation violations."""
        if not passed:
            return []
        for rid, (wait, _, _) in list(self.since.items()):
            t = state.live.get(rid)
            if t is None or t.status != Status.WAITING \
                    or (t.request.arrival_step, t.preemptions) != wait:
                del self.since[rid]
        out = []
        for p in passed:
            entry = self.since.get(p.request)
            if entry is None:
                self.since[p.request] = (p.wait, step, False)
                continue
            wait, first, told = entry
            if not told and step - first > self.limit:
                self.since[p.request] = (wait, first, True)
                out.append(starved(step, p, first, self.limit))
        return out


def starved(step: int, p: PassedOver, first: int, limit: int) -> Violation:
    """The starvation violation of `p` at `step`, passed over since step `first`."""
    return Violation("starvation", step,
                     f"{p.request} has been passed over for {step - first} steps (first at "
                     f"step {first}): {p.by}, which ranks after it, was admitted although "
                     f"{p.request} could have run in its place", request=p.request,
                     lhs=step - first, relation="<=", rhs=limit)
