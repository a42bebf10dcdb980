"""Obligations over the reference's decisions, from any consistent state (states.py).

Each builds the reference scheduler and the spec's checker in the same state, takes one
step, and lets the checker judge it. CrossHair searches these within the bounds of
`states.consistent` (up to three requests, prompts up to 4, outputs up to 3, 1 to 4
blocks of 1 or 2 tokens, budgets 1 to 4, every policy, preemption mode and knob); the
loops over requests and blocks keep it from exhausting every path, so they are bounded
searches with a fixed effort, as the runner records. Each obligation fixes the statuses
of its three requests (CrossHair meets a precondition that fixes the shape far sooner
than one that leaves it open), so there is one per shape of state that matters.
"""

from __future__ import annotations

from typing import NamedTuple

from kvsched.reference.scheduler import StepPlan
from kvsched.spec.blocks import blocks_for
from kvsched.spec.model import StepRecord
from kvsched.spec.violation import INVARIANTS, MUST
from proofs.state_key import waiting_order
from proofs.states import RUNNING, SWAPPED, WAITING, Cfg, Req, build, consistent, held


def broken_by_one_step(c: Cfg, reqs: list[Req]) -> tuple[str, ...]:
    """The MUST ids the spec's checker flags on the reference's next step from the state."""
    s, checker = build(c, reqs)
    d = s.schedule()
    finished = s.update(())
    checker.step(StepRecord(1, (), (), d.rejected, d.preempted, d.swapped_in, d.scheduled,
                            finished, s.free_blocks(), d.new_blocks))
    return tuple(sorted(k for k in checker.report.counts if INVARIANTS[k] == MUST))


def step_is_safe_running_running_waiting(c: Cfg, r0: Req, r1: Req, r2: Req
                                         ) -> tuple[str, ...]:
    """Two running, one waiting: growth, preemption and admission in one step keep the
    step invariant, the token budget, the sequence limit and every MUST invariant.

    pre: r0.status == RUNNING and r1.status == RUNNING and r2.status == WAITING
    pre: consistent(c, [r0, r1, r2])
    post: __return__ == ()
    """
    return broken_by_one_step(c, [r0, r1, r2])


def step_is_safe_running_swapped_waiting(c: Cfg, r0: Req, r1: Req, r2: Req
                                         ) -> tuple[str, ...]:
    """Running, swapped and waiting: swap-in before admission keeps every MUST invariant.

    pre: r0.status == RUNNING and r1.status == SWAPPED and r2.status == WAITING
    pre: consistent(c, [r0, r1, r2])
    post: __return__ == ()
    """
    return broken_by_one_step(c, [r0, r1, r2])


def step_is_safe_three_running(c: Cfg, r0: Req, r1: Req, r2: Req) -> tuple[str, ...]:
    """Three running: chains of preemption keep every MUST invariant.

    pre: r0.status == RUNNING and r1.status == RUNNING and r2.status == RUNNING
    pre: consistent(c, [r0, r1, r2])
    post: __return__ == ()
    """
    return broken_by_one_step(c, [r0, r1, r2])


def step_is_safe_three_waiting(c: Cfg, r0: Req, r1: Req, r2: Req) -> tuple[str, ...]:
    """Three waiting (new or recompute victims): admission keeps every MUST invariant.

    pre: r0.status == WAITING and r1.status == WAITING and r2.status == WAITING
    pre: consistent(c, [r0, r1, r2])
    post: __return__ == ()
    """
    return broken_by_one_step(c, [r0, r1, r2])


class Admitted(NamedTuple):
    rid: str
    tokens: int
    blocks: int


def cut(c: Cfg, reqs: list[Req], budget: int, threshold: int) -> tuple[Admitted, ...]:
    """The reference's waiting pass alone, from the state, with this budget and threshold."""
    s, _ = build(c, reqs)
    plan = StepPlan(budget, threshold)
    s.waiting_pass(plan)
    return tuple(Admitted(rid, n, len(plan.new_blocks.get(rid, ())))
                 for rid, n in plan.scheduled.items())


def admission_cut_behind_a_running_request(c: Cfg, r0: Req, r1: Req, r2: Req, budget: int,
                                           threshold: int) -> str:
    """With one request running, the waiting pass admits the longest prefix of the
    waiting order that fits the token, block and sequence budgets (and the watermark).

    pre: r0.status == RUNNING and r1.status == WAITING and r2.status == WAITING
    pre: consistent(c, [r0, r1, r2]) and 1 <= budget <= c.tokens
    pre: 0 <= threshold <= 2 and (c.chunked or threshold == 0)
    post: __return__ == ""
    """
    return judge_cut(c, [r0, r1, r2], budget, threshold)


def admission_cut_from_an_idle_engine(c: Cfg, r0: Req, r1: Req, r2: Req, budget: int,
                                      threshold: int) -> str:
    """With nothing running, the waiting pass admits the longest prefix of the waiting
    order that fits the budgets (the watermark applies from the second admission on).

    pre: r0.status == WAITING and r1.status == WAITING and r2.status == WAITING
    pre: consistent(c, [r0, r1, r2]) and 1 <= budget <= c.tokens
    pre: 0 <= threshold <= 2 and (c.chunked or threshold == 0)
    post: __return__ == ""
    """
    return judge_cut(c, [r0, r1, r2], budget, threshold)


def order(c: Cfg, reqs: list[Req]) -> tuple[str, ...]:
    """The waiting order: list order under fcfs, (priority, arrival) under priority."""
    return waiting_order(build(c, reqs)[0])


def is_prefix(admitted: tuple[Admitted, ...], waiting: tuple[str, ...]) -> bool:
    return tuple(a.rid for a in admitted) == waiting[:len(admitted)]


def free_blocks(c: Cfg, reqs: list[Req]) -> int:
    return c.gpu - sum(held(c, r) for r in reqs if r.status == RUNNING)


def running(reqs: list[Req]) -> int:
    return sum(1 for r in reqs if r.status == RUNNING)


def within_budgets(admitted: tuple[Admitted, ...], c: Cfg, reqs: list[Req], budget: int
                   ) -> bool:
    return (sum(a.tokens for a in admitted) <= budget
            and running(reqs) + len(admitted) <= c.seqs
            and sum(a.blocks for a in admitted) <= free_blocks(c, reqs))


def fits(c: Cfg, r: Req, budget: int, free: int, running_now: int, threshold: int) -> int:
    """The admission rule: the tokens the request gets if it is admitted now, else 0.

    A chunk of its uncomputed tokens capped by the threshold and the token budget
    (whole without chunked prefill), a free sequence slot, and free blocks for the
    chunk, or for its whole known sequence when the knob reserves it, plus the
    watermark when something is running.
    """
    known = r.prompt_len + r.outputs
    n = known - r.computed
    if 0 < threshold < n:
        n = threshold
    if budget <= 0 or running_now >= c.seqs or (not c.chunked and n > budget):
        return 0
    n = min(n, budget)
    watermark = c.watermark if running_now > 0 else 0
    if c.reserve_full and blocks_for(min(known, c.max_model_len), c.block_size) + watermark > free:
        return 0
    if blocks_for(r.computed + n, c.block_size) + watermark > free:
        return 0
    return n


def replay_cut(admitted: tuple[Admitted, ...], c: Cfg, reqs: list[Req], budget: int,
               threshold: int) -> tuple[list[int], list[tuple[int, int, int]]]:
    """For each admission in turn: the tokens `fits` allows, with the budget, free
    blocks and running count it is judged against; then the same for the next one."""
    by_id = {f"r{i}": r for i, r in enumerate(reqs)}
    allowed = []
    budgets = []
    left, free, now = budget, free_blocks(c, reqs), running(reqs)
    for a in admitted:
        allowed.append(fits(c, by_id[a.rid], left, free, now, threshold))
        budgets.append((left, free, now))
        left, free, now = left - a.tokens, free - a.blocks, now + 1
    budgets.append((left, free, now))
    return allowed, budgets


def judge_cut(c: Cfg, reqs: list[Req], budget: int, threshold: int) -> str:
    """What is wrong with the reference's cut, in words, or "" (one condition, so that
    CrossHair spends its effort once and the counterexample says what broke)."""
    admitted = cut(c, reqs, budget, threshold)
    waiting = order(c, reqs)
    if not is_prefix(admitted, waiting):
        return f"admitted {[a.rid for a in admitted]}, not a prefix of {list(waiting)}"
    if not within_budgets(admitted, c, reqs, budget):
        return f"admitted {admitted} over the token, sequence or block budget"
    allowed, budgets = replay_cut(admitted, c, reqs, budget, threshold)
    for a, n in zip(admitted, allowed, strict=True):
        if n == 0:
            return f"admitted {a.rid}, which does not fit"
        if n != a.tokens:
            return f"admitted {a.rid} with {a.tokens} tokens where {n} fit"
    if len(admitted) < len(waiting):
        left, free, now = budgets[-1]
        nxt = waiting[len(admitted)]
        if fits(c, reqs[int(nxt[1:])], left, free, now, threshold) > 0:
            return f"stopped before {nxt}, which fits"
    return ""



__all__ = ["SWAPPED", "WAITING", "consistent"]  # names the contracts use
