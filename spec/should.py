"""The SHOULD invariants of design.md section 3: liveness, reported as warnings."""

from __future__ import annotations

from kvsched.spec.violation import Violation

DEFAULT_MAX_PREEMPTIONS = 8


def no_idle(step: int, runnable: str | None) -> Violation | None:
    """no-idle: a step that schedules nothing and preempts nothing leaves no request
    that could have run (its smallest next chunk fitting the free blocks, the token
    budget and the sequence limit). `runnable` names one that could, or is None."""
    if runnable is None:
        return None
    return Violation("no-idle", step,
                     f"the step schedules nothing although {runnable} could run",
                     request=runnable)


def completion(step: int, request: str, status: str, never: str | None) -> Violation:
    """completion: in a complete trace every request ends finished, rejected or aborted;
    one that can never complete is rejected, not left waiting forever."""
    why = f"; it can never complete ({never}) and should have been rejected" if never else ""
    return Violation("completion", step,
                     f"{request} is still {status} when the trace ends{why}",
                     request=request)


def no_thrash(step: int, request: str, preemptions: int, limit: int) -> Violation | None:
    """no-thrash: no request is preempted more than K times."""
    if preemptions <= limit:
        return None
    return Violation("no-thrash", step,
                     f"{request} has been preempted {preemptions} times (limit {limit})",
                     request=request, lhs=preemptions, relation="<=", rhs=limit)


def needed_preemption(step: int, demand: int, free: int, reclaim: int,
                      last_victim_blocks: int) -> Violation | None:
    """needed-preemption: the step could not fit without its last victim v:
    demand + Db_v > B_free + B_reclaim - G_v, where demand is the scheduled set's new
    blocks and Db_v what v's own next chunk needed (v may be the request that could
    not grow and gave itself up). Then no fewer victims would have done."""
    without_last = free + reclaim - last_victim_blocks
    if demand > without_last:
        return None
    return Violation("needed-preemption", step,
                     f"the step preempted, but its {demand} new blocks fit in the "
                     f"{without_last} available without its last victim",
                     lhs=demand, relation=">", rhs=without_last)
