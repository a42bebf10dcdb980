"""The vectorized rules: a clean run of steps checked at once with numpy.

NOTE on the method. A run's scheduled entries stay in step order; a compiled pass links
each entry to the previous and next entry of the same request (`scan.chain`), and the
spec's bookkeeping becomes sums along those chains (computed tokens, known tokens,
sampled tokens, blocks held) and across steps (tokens and new blocks per step, free
blocks, running requests), against which every MUST and SHOULD invariant is one
vectorized comparison. Block ids are checked by sorting the handed-out ids by (block,
step): each must have been free when given. The run's first step may carry aborts,
rejections, preemptions and swap-ins, applied one by one as the spec does (`apply_head`).

`check_run` answers only "clean" (True, the state advanced) or "the spec's checker must
look" (False, or Unusual raised); the caller then rolls the state back (Columns.mark,
Columns.rollback) and hands the run over. So these rules need to be right only on runs
they find clean.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np

from kvsched.optimized import scan as sc
from kvsched.optimized.columns import (
    ABORTED,
    FINISHED,
    REJECTED,
    RUNNING,
    STATUS_OF,
    SWAPPED,
    WAITING,
    Columns,
    Undo,
)
from kvsched.optimized.runs import EMPTY, Run
from kvsched.spec import should
from kvsched.spec.blocks import rejectable
from kvsched.spec.model import Status

I64 = np.int64


class Unusual(Exception):
    """The fast path met something it leaves to the spec's checker."""


def _segments(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For a sorted key array: whether each element starts a group, and the index of its
    group's first element."""
    starts = np.empty(keys.size, dtype=bool)
    first = np.empty(keys.size, dtype=I64)
    sc.segments(keys, starts, first)
    return starts, first


def _per_step(values: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Sums of values (in step order) per step; ends[s] is where step s's entries end."""
    total = np.zeros(values.size + 1, dtype=I64)
    np.cumsum(values, out=total[1:])
    sums: np.ndarray = np.diff(total[ends], prepend=0)
    return sums


def _group(values: np.ndarray) -> np.ndarray:
    """A stable order of non-negative integers (radix-sorted when they span fewer than
    65,536 values, as a run's request indices and block ids nearly always do)."""
    if values.size == 0:
        return EMPTY
    low = values.min()
    if values.max() - low < 1 << 16:
        return np.argsort((values - low).astype(np.uint16), kind="stable")
    return np.argsort(values, kind="stable")


@dataclass
class Head:
    """What the run's first step's aborts, rejections, preemptions and swap-ins left for
    the vectorized rules."""

    free_before: int  # free blocks before the step's scheduling budget (after aborts)
    victims: set[int] = field(default_factory=set)
    swapped_in: dict[int, int] = field(default_factory=dict)  # request -> its host blocks
    reclaim: int = 0  # blocks the preemptions released
    last_need: tuple[int, int, int] | None = None  # the last victim's N, C, G
    last_victim: int = 0  # the last victim's blocks


def apply_head(state: Columns, run: Run, first_new: int, max_preemptions: int, undo: Undo,
               newly_ended: dict[str, Status]) -> Head | None:
    """Apply the events of the run's first step one by one, as the spec does; None if the
    spec's checker must look (Unusual for ids it would refuse)."""
    head = run.head
    if head is None:
        return Head(state.free)
    cfg = state.config
    c = state.cols
    arrived_now = set(range(first_new, first_new + int(run.n_arr[0])))

    def lookup(rid: str) -> int:
        x = state.index.get(rid)
        if x is None or (x >= first_new and x not in arrived_now):
            raise Unusual  # unknown or not yet arrived: the spec raises
        return x

    def end(x: int, code: int) -> int:
        released = int(c["G"][x])
        if int(c["STATUS"][x]) == RUNNING:
            state.running -= 1
        state.free += released
        state.free_host += int(c["H"][x])
        state.set(undo, "GEN", x, c["GEN"][x] + 1)
        state.set(undo, "G", x, 0)
        state.set(undo, "H", x, 0)
        state.set(undo, "STATUS", x, code)
        newly_ended[state.ids[x]] = STATUS_OF[code]
        state.live -= 1
        return released

    for rid in head.aborted:
        x = lookup(rid)
        if int(c["STATUS"][x]) > SWAPPED:
            return None
        end(x, ABORTED)
    done = Head(state.free)
    for rid in head.rejected:
        x = lookup(rid)
        if (int(c["STATUS"][x]) != WAITING or rejectable(
                cfg, int(c["P"][x]), int(c["O"][x])) is None):
            return None
        end(x, REJECTED)
    for rid, mode in head.preempted:
        x = lookup(rid)
        if int(c["STATUS"][x]) != RUNNING or x in done.swapped_in:
            return None
        preemptions = int(c["PRE"][x]) + 1
        if preemptions == max_preemptions + 1:
            return None  # no-thrash
        state.set(undo, "PRE", x, preemptions)
        g = int(c["G"][x])
        done.last_need = (int(c["N"][x]), int(c["C"][x]), g)
        state.running -= 1
        if mode == "swap":
            if g > state.free_host:
                return None  # cpu-budget
            state.free_host -= g
            state.set(undo, "H", x, g)
            state.set(undo, "STATUS", x, SWAPPED)
        else:
            state.set(undo, "C", x, 0)
            state.set(undo, "RECOMP", x, 1)
            state.set(undo, "STATUS", x, WAITING)
        state.set(undo, "G", x, 0)
        state.set(undo, "GEN", x, c["GEN"][x] + 1)
        state.free += g
        done.reclaim += g
        done.last_victim = g
        done.victims.add(x)
    for rid in head.swapped_in:
        x = lookup(rid)
        if int(c["STATUS"][x]) != SWAPPED or x in done.victims or x in done.swapped_in:
            return None
        h = int(c["H"][x])
        state.set(undo, "G", x, h)
        state.set(undo, "H", x, 0)
        state.set(undo, "STATUS", x, RUNNING)
        state.free -= h
        state.free_host += h
        state.running += 1
        done.swapped_in[x] = h
    return done


def check_run(state: Columns, run: Run, ended: Collection[str], max_preemptions: int,
              undo: Undo, newly_ended: dict[str, Status]) -> bool:
    """Check a run with the vectorized rules and advance the state past it: True if the
    run is clean. `ended` are the ids that ended before the run; the ids that end in it
    go into `newly_ended`, with how they ended."""
    cfg = state.config
    c = state.cols
    T = run.T
    first_new = len(state.ids)
    n_new = len(run.arr_ids)
    arrival_t = np.repeat(np.arange(T, dtype=I64), run.n_arr)
    if n_new:
        names = run.arr_ids
        unique = set(names)
        if (len(unique) != n_new or not unique.isdisjoint(state.index)
                or not unique.isdisjoint(ended)):
            return False  # arrives twice: the spec raises
        keys = [x.arr_keys for x in run.parts if x.arr_keys is not None]
        state.register_columns(
            names, None if len(keys) < len(run.parts) else
            keys[0] if len(keys) == 1 else np.concatenate(keys),
            run.arr_num, run.steps[arrival_t])

    head = run.head
    applied = apply_head(state, run, first_new, max_preemptions, undo, newly_ended)
    if applied is None:
        return False
    victims, swapped_in = applied.victims, applied.swapped_in
    swap_demand = sum(swapped_in.values())

    # -- the scheduled entries of the whole run, in step order ------------------
    ri = state.resolve_all(run, "ent_ids")
    E = ri.size
    if E and ri.min() < 0:
        return False  # an unknown id: the spec raises
    n = run.ent_n
    t = np.repeat(np.arange(T, dtype=I64), run.n_ent)
    low = int(ri.min()) if E else 0
    span = int(ri.max()) - low + 1 if E else 0
    prev = np.empty(E, dtype=I64)
    nxt = np.empty(E, dtype=I64)
    if sc.chain(ri, t, low, span, prev, nxt):
        return False  # scheduled twice in one step
    starts = prev < 0  # the request's first entry in the run
    heads = np.flatnonzero(starts)
    head_ri = ri[heads]

    # (what holds at a request's first entry in the run holds at the others)
    status0 = c["STATUS"][head_ri]
    if np.any(status0 > RUNNING):
        return False  # swapped or ended
    if n_new:
        fresh = head_ri >= first_new
        if np.any(fresh) and np.any(t[heads[fresh]]
                                    < arrival_t[head_ri[fresh] - first_new]):
            return False  # scheduled before it arrived: unknown to the spec
    if victims and np.any(np.isin(ri[t == 0], np.fromiter(victims, dtype=I64))):
        return False  # scheduled in the step that preempted it

    N0, C0, G0 = c["N"][ri], c["C"][ri], c["G"][ri]
    before = np.empty(E, dtype=I64)
    sc.chain_exclusive(prev, n, before)
    computed = C0 + before
    after = computed + n
    sampled = after >= N0
    known = np.empty(E, dtype=I64)
    sc.chain_exclusive(prev, sampled.astype(I64), known)
    known += N0
    bad = (n < 1) | (after > known) | (after > cfg.max_model_len)
    # Samples past max_model_len (a prompt of exactly max_model_len tokens may sample one).
    whole_prompt = (known == c["P"][ri]) & (known == cfg.max_model_len)
    bad |= sampled & (known >= cfg.max_model_len) & ~whole_prompt
    if not cfg.chunked_prefill:
        bad |= n != known - computed
    if np.any(bad):
        return False  # token-range
    bs = cfg.block_size
    if bs & (bs - 1) == 0:
        g_after = np.maximum(G0, (after + (bs - 1)) >> (bs.bit_length() - 1))
    else:
        g_after = np.maximum(G0, -(-after // bs))
    new_blocks = g_after - np.where(starts, G0, g_after[prev])

    # -- finishes --------------------------------------------------------------
    fin_t = np.repeat(np.arange(T, dtype=I64), run.n_fin)
    fin_ri = state.resolve_all(run, "fin_ids")
    F = fin_ri.size
    if F and fin_ri.min() < 0:
        return False
    at = np.empty(F, dtype=I64)
    sc.entry_of(ri, run.n_ent, low, span, fin_ri, run.n_fin, at)
    if F and at.min() < 0:
        return False  # finishes without being scheduled in that step
    finishing = np.zeros(E, dtype=bool)
    finishing[at] = True
    if np.count_nonzero(finishing) != F:
        return False  # finished twice in one step
    if np.any(finishing & ~sampled):
        return False
    if np.any(sampled & (known + 1 >= c["LIMIT"][ri]) & ~finishing):
        return False  # reached max_tokens or max_model_len but did not finish
    # An entry after its request finished: the finishing entry must be its last.
    if F and np.any(finishing & (nxt >= 0)):
        return False

    # -- per step: tokens, blocks, running requests ------------------------------
    step_ends = np.cumsum(run.n_ent)
    tokens = _per_step(n, step_ends)
    if np.any(tokens > cfg.max_num_batched_tokens):
        return False
    demand = _per_step(new_blocks, step_ends)
    released = np.bincount(t[at], weights=g_after[at], minlength=T).astype(I64)
    free_mid = state.free + np.concatenate(([0], np.cumsum(released - demand)[:-1]))
    after_sched = free_mid - demand
    if np.any(after_sched < 0):
        return False  # kv-budget
    free_end = after_sched + released
    admitted = np.bincount(t[heads[status0 == WAITING]], minlength=T)
    fin_count = np.bincount(fin_t, minlength=T)
    running = state.running + np.cumsum(admitted) - np.concatenate(
        ([0], np.cumsum(fin_count)[:-1]))
    if np.any(running > cfg.max_num_seqs):
        return False
    reported = run.free
    has = reported >= 0
    if np.any(reported[has] != free_end[has] - state.leaked):
        return False  # accounting (or a leak the spec's checker names)
    if head is not None and head.preempted:
        # every victim valid, the step within its blocks (else above)
        assert applied.last_need is not None
        k_, c_, g_ = applied.last_need
        own = should.own_chunk_blocks(k_, c_, g_, cfg)
        total = int(demand[0]) + swap_demand
        if not should.preemption_was_needed(total + own, applied.free_before,
                                            applied.reclaim, applied.last_victim):
            return False
    for ri_in in swapped_in:
        if not np.any((ri == ri_in) & (t == 0)):
            return False  # swapped in but not scheduled: left to the spec's checker

    # -- block ids -------------------------------------------------------------
    # Every step of the run carries block ids, or none does (runs are cut where they
    # come and go). Ids are checked against the owners that are known; a step without
    # them that hands blocks out leaves those blocks' owners unknown.
    present = run.has_blocks
    ids_seen, missing_from = state.ids_seen, state.ids_missing_from
    assign: tuple[np.ndarray, np.ndarray] | None = None
    if present.all():
        ids_seen = True
        assign = check_blocks(state, run, ri, t, new_blocks, swapped_in, low, span,
                              fin_ri, fin_t)
        if assign is None:
            return False
    elif present.any():
        return False
    elif missing_from < 0:
        handed = demand.copy()
        handed[0] += swap_demand
        out = np.flatnonzero(handed > 0)
        if out.size:
            missing_from = int(run.steps[out[0]])

    # -- idle steps: nothing could have run (the run ends with such a step) -----
    # (checked after the commit, below, on the state at the run's end)

    # -- commit ----------------------------------------------------------------
    last = nxt < 0  # the request's last entry in the run
    last_ri = ri[last]
    state.set(undo, "N", last_ri, (known + sampled)[last])
    state.set(undo, "C", last_ri, after[last])
    state.set(undo, "G", last_ri, g_after[last])
    state.set(undo, "STATUS", last_ri, RUNNING)
    state.set(undo, "RECOMP", last_ri, 0)
    if F:
        state.set(undo, "STATUS", fin_ri, FINISHED)
        state.set(undo, "G", fin_ri, 0)
        state.set(undo, "GEN", fin_ri, c["GEN"][fin_ri] + 1)
        ids = state.ids
        newly_ended.update(dict.fromkeys([ids[r] for r in fin_ri.tolist()], Status.FINISHED))
    if assign is not None:
        blocks, owners = assign
        undo.append((state.holder, blocks, state.holder[blocks].copy()))
        undo.append((state.holder_gen, blocks, state.holder_gen[blocks].copy()))
        state.holder[blocks] = owners
        state.holder_gen[blocks] = c["GEN"][owners] - (
            np.isin(owners, fin_ri) if F else 0)
    state.ids_seen, state.ids_missing_from = ids_seen, missing_from
    state.steps_with_free += int(np.count_nonzero(run.free >= 0))
    state.free = int(free_end[-1])
    state.running = int(running[-1] - fin_count[-1])
    state.live += n_new - F
    state.step_no = int(run.steps[-1])
    # The run ends with an idle step only when requests are live: nothing could run.
    idle = run.n_ent[-1] == 0 and not (T == 1 and head is not None and (
        head.preempted or head.swapped_in))
    return not (idle and state.live > 0 and runnable(state))


def check_blocks(state: Columns, run: Run, ri: np.ndarray, t: np.ndarray,
                 new_blocks: np.ndarray, swapped_in: dict[int, int], low: int, span: int,
                 fin_ri: np.ndarray, fin_t: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Check the run's new_blocks: counts equal the blocks needed (plus H on swap-in),
    each id in range and free when given. Returns the (block, owner) assignments to
    commit, or None if the spec's checker must look."""
    E = ri.size
    T = run.T
    owner = state.resolve_all(run, "own_ids")
    K = owner.size
    if K and owner.min() < 0:
        return None
    step_of = np.repeat(np.arange(T, dtype=I64), run.n_own)
    given = run.own_sizes
    blocks = run.blocks - state.config.first_block_id  # as indices of the pool
    B = blocks.size
    if B and (blocks.min() < 0 or blocks.max() >= state.config.num_gpu_blocks):
        return None
    # Every id list belongs to an entry scheduled in that step; every entry gets
    # exactly its new blocks (and its host blocks back on swap-in).
    where = np.empty(K, dtype=I64)
    sc.entry_of(ri, run.n_ent, low, span, owner, run.n_own, where)
    if K and where.min() < 0:
        return None
    got = np.zeros(E, dtype=I64)
    got[where] = given
    if K > 1 and np.count_nonzero(np.bincount(where, minlength=E) > 1):
        return None  # an id twice in one new_blocks: JSON keeps the last
    expected = new_blocks.copy()
    for r, host in swapped_in.items():
        expected[(ri == r) & (t == 0)] += host
    if np.any(got != expected):
        return None
    if B == 0:
        return np.zeros(0, dtype=I64), np.zeros(0, dtype=I64)
    block_owner = np.repeat(owner, given)
    block_step = np.repeat(step_of, given)
    low = int(fin_ri.min()) if fin_ri.size else 0
    fin_step = np.full(int(fin_ri.max()) - low + 1 if fin_ri.size else 0, T, dtype=I64)
    fin_step[fin_ri - low] = fin_t

    def finish_at(requests: np.ndarray) -> np.ndarray:
        """The step of the run at which each request finishes, T if none."""
        inside = (requests >= low) & (requests < low + fin_step.size)
        out: np.ndarray = np.full(requests.size, T, dtype=I64)
        out[inside] = fin_step[requests[inside] - low]
        return out

    # The id lists are in step order: a stable sort by block id orders by (block, step).
    order = _group(blocks)
    b, s, o = blocks[order], block_step[order], block_owner[order]
    starts, _ = _segments(b)
    # A later grant of a block: the earlier holder finished in between.
    later = ~starts
    if np.any(later):
        prev = np.flatnonzero(later) - 1
        if np.any(s[later] <= s[prev]) or np.any(finish_at(o[prev]) >= s[later]):
            return None
    # The first grant in the run: the block was free, or its holder finished before.
    firsts = np.flatnonzero(starts)
    holder = state.holder[b[firsts]]
    held = holder >= 0
    if np.any(held):
        h = holder[held]
        current = state.holder_gen[b[firsts]][held] == state.cols["GEN"][h]
        if np.any(current & (finish_at(h) >= s[firsts][held])):
            return None
    lasts = np.append(firsts[1:] - 1, b.size - 1)
    return b[lasts], o[lasts]


def runnable(state: Columns) -> bool:
    """Whether some live request's smallest next chunk fits now (the spec's no-idle)."""
    cfg = state.config
    c = state.cols
    live = state.live_indices()
    if live.size == 0:
        return False
    status = c["STATUS"][live]
    left = c["N"][live] - c["C"][live]
    n = np.ones_like(left) if cfg.chunked_prefill else left
    swapped = status == SWAPPED
    held = np.where(swapped, c["H"][live], c["G"][live])
    need = np.maximum(0, -(-(c["C"][live] + n) // cfg.block_size) - held)
    need = need + np.where(swapped, c["H"][live], 0)
    need = need + np.where((status != RUNNING) & (state.running > 0), cfg.watermark_blocks,
                           0)
    can = (n <= cfg.max_num_batched_tokens) & (need <= state.free)
    can &= (status == RUNNING) | (state.running < cfg.max_num_seqs)
    return bool(np.any(can))
