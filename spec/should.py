"""The SHOULD invariants of docs/spec.md sections 6 to 8: liveness, reported as warnings.

One function per invariant id, named after it, over the facts of one step (or, for
completion, the state at the end of a complete trace).
"""

from __future__ import annotations

from kvsched.spec.blocks import (
    admission_watermark,
    allocation_reserve,
    blocks_needed,
    never_completes,
)
from kvsched.spec.model import Config, Status
from kvsched.spec.state import State, StepFacts
from kvsched.spec.violation import DEFAULT_MAX_PREEMPTIONS as DEFAULT_MAX_PREEMPTIONS
from kvsched.spec.violation import Violation


def runnable(state: State) -> str | None:
    """A live request whose smallest next chunk fits right now (the free blocks, with
    what an admission or a swap-in reserves, the token budget, the sequence limit, the
    watermark of an admission or a swap-in), if any."""
    cfg = state.config
    for rid, t in state.live.items():
        if t.status != Status.RUNNING and state.running >= cfg.max_num_seqs:
            continue
        left = t.num_tokens - t.num_computed
        n = 1 if cfg.chunked_prefill else left
        if n > cfg.max_num_batched_tokens:
            continue
        held = t.host_blocks if t.status == Status.SWAPPED else t.gpu_blocks
        admitted = t.status != Status.RUNNING
        reserve = allocation_reserve(cfg, t.request, t.num_tokens) if admitted else 0
        need = blocks_needed(t.num_computed, n, held, cfg.block_size, reserve)
        if t.status == Status.SWAPPED:
            need += t.host_blocks
        if admitted:
            need += admission_watermark(cfg, state.running)
        if need <= state.free:
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
    return [Violation("no-thrash", f.step,
                      f"{v.action.request} has been preempted {v.preemptions} times "
                      f"(limit {limit})", request=v.action.request,
                      lhs=v.preemptions, relation="<=", rhs=limit)
            for v in f.valid_victims if v.preemptions == limit + 1]


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
