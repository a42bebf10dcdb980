"""The MUST invariants of docs/spec.md sections 6 to 8: safety rules any engine obeys.

One function per invariant id, named after it. Each reads the facts of one step (what
the transition rule in state.py did: kvsched.spec.state.StepFacts) and returns the
violations it finds, in the order the step applied its actions; `messages` below holds
the sentences they say. The checker (checker.py) calls them in the order of INVARIANTS.
"""

from __future__ import annotations

from kvsched.spec.blocks import rejectable
from kvsched.spec.model import Config, Status, victim_modes
from kvsched.spec.state import NEVER_ARRIVED, Action, HitBlock, State, StepFacts
from kvsched.spec.violation import Violation


def kv_budget(f: StepFacts) -> list[Violation]:
    """kv-budget: sum over r in S of Db_r (swap-ins included, and E_r, the evictable
    blocks a prefix hit takes) <= B_free + B_reclaim.

    B_free is the free GPU blocks before the step (evictable cached ones included, and
    what the step's `released` freed), B_reclaim what its preemptions released plus what
    its `reclaimed` entries released (a lazy victim releases nothing by itself). With
    it, free GPU blocks never go negative.
    """
    if f.demand <= f.free_before + f.reclaim:
        return []
    by_victims = f.reclaim - f.released_by_reclaims
    reclaimed = (f" and {f.released_by_reclaims} by reclaimed entries"
                 if f.reclaims else "")
    return [Violation("kv-budget", f.step,
                      f"the step needs {f.demand} new GPU blocks but only {f.free_before} were "
                      f"free and {by_victims} reclaimed by preemption{reclaimed}",
                      lhs=f.demand, relation="<=", rhs=f.free_before + f.reclaim)]


def cpu_budget(f: StepFacts) -> list[Violation]:
    """cpu-budget: a swap-out moves G blocks to host only if G <= free host blocks."""
    return [Violation("cpu-budget", f.step,
                      f"swapping out {v.action.request} needs {v.held} host blocks but only "
                      f"{v.free_host} are free", request=v.action.request,
                      lhs=v.held, relation="<=", rhs=v.free_host)
            for v in f.valid_victims if v.mode == "swap" and v.held > v.free_host]


def token_budget(f: StepFacts, config: Config) -> list[Violation]:
    """token-budget: sum over r in S of Dn_r <= max_num_batched_tokens; without chunked
    prefill a step that schedules one request alone may exceed it (a whole prompt can
    only run whole: SGLang admits the first prefill of a step over its budget, and vLLM
    refuses at start-up a budget that some prompt exceeds)."""
    budget = config.max_num_batched_tokens
    if f.tokens <= budget or (not config.chunked_prefill and len(f.chunks) == 1):
        return []
    return [Violation("token-budget", f.step,
                      f"the step schedules {f.tokens} tokens, over the budget of {budget}",
                      lhs=f.tokens, relation="<=", rhs=budget)]


def seq_limit(f: StepFacts, config: Config) -> list[Violation]:
    """seq-limit: running requests <= max_num_seqs."""
    limit = config.max_num_seqs
    if f.running <= limit:
        return []
    return [Violation("seq-limit", f.step,
                      f"{f.running} requests are running, over max_num_seqs {limit}",
                      lhs=f.running, relation="<=", rhs=limit)]


def token_range(f: StepFacts, config: Config) -> list[Violation]:
    """token-range: Dn >= 1, C + Dn <= N, C + Dn <= max_model_len; whole prefills
    without chunked prefill (a prefill is any step with N - C > 1). A prefix hit is
    taken only with prefix caching on, by a waiting request at C = 0, and covers at
    most N - 1 tokens (at least one is computed)."""
    out = []
    bs = config.block_size
    for h in f.hits:
        rid, size = h.action.request, len(h.blocks) * bs
        if h.refused == "off":
            out.append(Violation("token-range", f.step, f"{rid} takes a prefix hit but the "
                                 "trace's config has prefix_caching false", request=rid))
        elif h.refused == "computed":
            out.append(Violation("token-range", f.step,
                                 f"{rid} takes a prefix hit while {h.action.state} with "
                                 f"C={h.computed}; a hit is taken only at C = 0, on admission",
                                 request=rid, lhs=h.computed, relation="==", rhs=0))
        elif h.refused == "long":
            out.append(Violation("token-range", f.step,
                                 f"{rid}'s prefix hit of {len(h.blocks)} blocks covers {size} "
                                 f"tokens of its {h.known}; at most N - 1 may be hit",
                                 request=rid, lhs=size, relation="<=", rhs=h.known - 1))
    for d in f.dedups:
        rid = d.action.request
        if d.refused == "off":
            out.append(Violation("token-range", f.step, f"{rid} deduplicates blocks but the "
                                 "trace's config has prefix_caching false", request=rid))
        elif d.refused == "uncomputed":
            out.append(Violation("token-range", f.step,
                                 f"{rid} deduplicates {len(d.blocks)} blocks but has "
                                 f"{d.computed // bs} full computed ones (C={d.computed})",
                                 request=rid, lhs=len(d.blocks) * bs, relation="<=",
                                 rhs=d.computed))
    for c in f.chunks:
        if not c.action.applied:
            continue
        rid, n, known, computed = c.action.request, c.tokens, c.known, c.computed
        if n < 1:
            out.append(Violation("token-range", f.step,
                                 f"{rid} is scheduled {n} tokens; at least 1 is needed",
                                 request=rid, lhs=n, relation=">=", rhs=1))
        elif computed + n > known:
            out.append(Violation("token-range", f.step,
                                 f"{rid} is scheduled {n} tokens but only "
                                 f"{known - computed} are known and not yet computed "
                                 f"(N={known}, C={computed})",
                                 request=rid, lhs=computed + n, relation="<=", rhs=known))
        elif computed + n > config.max_model_len:
            out.append(Violation("token-range", f.step,
                                 f"{rid} would compute past max_model_len",
                                 request=rid, lhs=computed + n, relation="<=",
                                 rhs=config.max_model_len))
        elif not config.chunked_prefill and n != known - computed:
            out.append(Violation("token-range", f.step,
                                 f"without chunked prefill {rid} must be scheduled whole "
                                 f"({known - computed} tokens), got {n}",
                                 request=rid, lhs=n, relation="==", rhs=known - computed))
    return out


def _misplaced(a: Action) -> str:
    """An action in a state that does not allow it, in words."""
    if a.action == "unsampled":
        return f"{a.request} is in unsampled (its output dropped) but {a.state}"
    if a.state == NEVER_ARRIVED:
        return f"{a.request} is {a.action} but never arrived"
    if a.action == "arrives":
        return f"{a.request} arrives again while {a.state}; ids are unique"
    return f"{a.request} is {a.action} while {a.state}"


def one_state(f: StepFacts) -> list[Violation]:
    """one-state: ids are unique; each request is in exactly one state, and an action
    applies only in the states that allow it (kvsched.spec.state.ALLOWED): nothing is
    scheduled, swapped in, aborted, rejected or finished that never arrived or has ended,
    and nothing is scheduled twice in one step. (A victim that was not running is the
    preempt invariant's.) The action is not applied, and the check goes on."""
    out = [Violation("one-state", f.step, _misplaced(a), request=a.request)
           for a in f.actions if not a.applied and a.action != "preempted"]
    out += [Violation("one-state", f.step, f"{h.action.request} takes a prefix hit but is "
                      "not scheduled in this step", request=h.action.request)
            for h in f.hits if h.refused == "unscheduled"]
    return out


def preempt(f: StepFacts, config: Config | None = None) -> list[Violation]:
    """preempt: a victim was running (and not admitted or swapped in this step), in a
    mode of the config's preemption (lazy under lazy, recompute or swap under any other:
    model.victim_modes); a recompute victim, and a waiting one whose blocks are reclaimed,
    restarts from C = 0 with no blocks, so its first new chunk is handed
    ceil((C + Dn) / block_size) block ids from nothing (a lazy victim keeps its blocks:
    it releases nothing)."""
    out = [Violation("preempt", f.step, f"{_misplaced(v.action)}; only a running request "
                     "can be a victim", request=v.action.request)
           for v in f.victims if not v.action.applied]
    if config is not None:
        modes = victim_modes(config.preemption)
        out += [Violation("preempt", f.step,
                          f"{v.action.request} is preempted in mode {v.mode}, which config "
                          f"preemption {config.preemption} does not use (it takes "
                          f"{' or '.join(modes)})", request=v.action.request)
                for v in f.victims if v.mode not in modes]
    out += [Violation("preempt", f.step,
                      f"{c.action.request} was preempted by recompute but its next chunk got "
                      f"{c.restart_ids} new blocks where {c.new_blocks} are needed from "
                      "C = 0: it kept its computed tokens or blocks",
                      request=c.action.request, lhs=c.restart_ids, relation="==",
                      rhs=c.new_blocks)
            for c in f.chunks if c.restart_ids is not None and c.restart_ids != c.new_blocks]
    return out


def finish(f: StepFacts, config: Config) -> list[Violation]:
    """finish: a request finishes only right after it sampled a token; it samples only
    while N < max_model_len, except a prompt of exactly max_model_len tokens, which an
    engine may serve one token (section 2, rule 2); outputs never exceed max_tokens, and
    one that reached max_tokens or max_model_len finishes in the step that reached it.
    (A leak at the finish is told by `accounting`.)"""
    out = []
    for c in f.chunks:
        whole_prompt = c.known == c.prompt_len == config.max_model_len
        if c.sampled and c.known >= config.max_model_len and not whole_prompt:
            out.append(Violation("finish", f.step,
                                 f"{c.action.request} samples a token with {c.known} tokens "
                                 f"known, taking its sequence past max_model_len "
                                 f"{config.max_model_len}", request=c.action.request,
                                 lhs=c.known + 1, relation="<=", rhs=config.max_model_len))
    out += [Violation("finish", f.step, f"{d.action.request} finishes without having sampled "
                      "a token in this step", request=d.action.request)
            for d in f.finishes if d.action.applied and not d.sampled]
    for t in f.due:
        req = t.request
        outputs, known = t.num_tokens - req.prompt_len, t.num_tokens
        if outputs >= req.max_tokens:
            limit, value, bound = f"max_tokens {req.max_tokens}", outputs, req.max_tokens
        elif known >= config.max_model_len:
            limit, value, bound = (f"max_model_len {config.max_model_len}", known,
                                   config.max_model_len)
        else:
            continue
        out.append(Violation("finish", f.step, f"{req.id} reached {limit} but did not finish",
                             request=req.id, lhs=value, relation="<", rhs=bound))
    return out


def reject(f: StepFacts, config: Config) -> list[Violation]:
    """reject: only a request that can never complete, even alone, is rejected, or one
    whose prompt fills max_model_len (the engine's choice), or one whose prompt is longer
    than the config's declared max_prompt_len (kvsched.spec.blocks.rejectable)."""
    limit = f" within max_prompt_len {config.max_prompt_len}" if config.max_prompt_len else ""
    return [Violation("reject", f.step,
                      f"{r.id} is rejected but it fits alone in an empty cache "
                      f"(prompt {r.prompt_len}{limit}, max_tokens {r.max_tokens})",
                      request=r.id)
            for a, r in f.rejections
            if r is not None and rejectable(config, r.prompt_len, r.max_tokens) is None]


def block_ids(f: StepFacts, config: Config) -> list[Violation]:
    """block-ids (when the trace carries block ids): the ids handed to a request number
    exactly its Db (plus H on swap-in); only free blocks are handed out, so a block has
    at most one owner."""
    out: list[Violation] = []
    first, last = config.first_block_id, config.first_block_id + config.num_gpu_blocks
    for h in f.handouts or ():
        rid = h.request
        if h.counted and not h.within:
            # A request that was not scheduled needs no new block at all.
            if h.most > h.expected:  # prealloc_tokens: a range
                over = h.given > h.most
                out.append(Violation("block-ids", f.step,
                                     f"{rid} gets {h.given} new block ids where it needs "
                                     f"{h.expected} to {h.most} (prealloc_tokens "
                                     f"{config.prealloc_tokens})", request=rid,
                                     lhs=h.given, relation="<=" if over else ">=",
                                     rhs=h.most if over else h.expected))
            else:
                out.append(Violation("block-ids", f.step,
                                     f"{rid} gets {h.given} new block ids where it needs "
                                     f"{h.expected}", request=rid,
                                     lhs=h.given, relation="==", rhs=h.expected))
        for b, owner in h.blocks:
            if not first <= b < last:
                out.append(Violation("block-ids", f.step,
                                     f"{rid} gets block {b}, outside {first}..{last - 1}",
                                     request=rid, lhs=b,
                                     relation="<" if b >= last else ">=",
                                     rhs=last if b >= last else first))
            elif owner is not None:
                out.append(Violation("block-ids", f.step,
                                     f"{rid} gets block {b}, which {owner} still holds",
                                     request=rid))
    for hit in f.hits:
        if hit.refused is None and hit.tracked:
            out += _hit_blocks(f.step, hit.action.request, hit.blocks, first, last)
    for d in f.dedups:
        if d.refused is None and d.tracked and d.action.applied:
            replaced = tuple(b for b, kept in zip(d.blocks, d.kept, strict=True) if not kept)
            out += _hit_blocks(f.step, d.action.request, replaced, first, last,
                               "deduplication")
    return out


def _hit_blocks(step: int, rid: str, blocks: tuple[HitBlock, ...], first: int,
                last: int, what: str = "prefix hit") -> list[Violation]:
    """A prefix hit (or a deduplication) takes, at each table index j, a block cached
    at index j (full there in some request's table and not handed out since), of the
    same content when the trace gives content keys."""
    out = []
    for b in blocks:
        if not first <= b.block < last:
            out.append(Violation("block-ids", step, f"{rid}'s {what} takes block "
                                 f"{b.block}, outside {first}..{last - 1}", request=rid))
        elif b.cached_at != b.index:
            where = ("it is not cached (never full, or handed out since)"
                     if b.cached_at is None else f"it is cached at index {b.cached_at}")
            out.append(Violation("block-ids", step, f"{rid}'s {what} takes block "
                                 f"{b.block} at table index {b.index}, but {where}",
                                 request=rid, lhs=b.cached_at, relation="==", rhs=b.index))
        elif b.key is not None and b.cached_key is not None and b.key != b.cached_key:
            out.append(Violation("block-ids", step, f"{rid}'s {what} takes block "
                                 f"{b.block} at table index {b.index}, cached with content "
                                 f"{b.cached_key!r}, where its own content is {b.key!r}",
                                 request=rid))
    return out


def _suspects(f: StepFacts, missing: int) -> list[tuple[str, str, int]]:
    """Every event of the step that could account for `missing` blocks the engine holds
    beyond what the trace implies (fewer, when negative): (kind, request, blocks). A
    release may have fallen short; an allocation the trace does not prove (no block ids,
    or ids that did not match Db) may have taken more or fewer."""
    out: list[tuple[str, str, int]] = []
    if missing > 0:
        out += [("abort", rid, n) for rid, n in f.released_by_aborts if n > 0]
        out += [("release", r.action.request, r.released) for r in f.releases
                if r.released > 0]
        out += [("reclaim", r.action.request, r.released) for r in f.reclaims
                if r.released > 0]
        out += [("victim", v.action.request, v.released) for v in f.valid_victims
                if v.released > 0]
        out += [("finish", d.action.request, d.released) for d in f.finishes
                if d.released > 0]
    proven = {h.request for h in f.handouts or () if h.counted and h.within}
    restarted = set(f.restarted)
    for c in f.chunks:
        rid = c.action.request
        if c.new_blocks > 0 and rid not in proven:
            out.append(("restart" if rid in restarted else "allocation", rid, c.new_blocks))
    out += [("allocation", a.request, held) for a, held in f.swap_ins
            if a.applied and held > 0 and a.request not in proven]
    out += [("prefix hit", h.action.request, h.evictable) for h in f.hits if h.evictable > 0]
    return out


def accounting(f: StepFacts, leaked: int) -> list[Violation]:
    """accounting (when the engine reports its free count): reported == derived, where
    `derived` is the step's free count less the `leaked` blocks the engine already
    reported missing (so each leak is told once; agreeing again ends it).

    The difference is blamed only as far as the counts prove (`_suspects`): when every
    event of the step that could explain it is of one kind, and together they can, it is
    theirs: victims that kept blocks break `preempt`, finishes that kept them `finish` (a
    finished request holds no blocks), recompute victims' restarts `preempt` (they restart
    from C = 0 and no blocks); aborts and other allocations `accounting`. A request is
    named only when it is the one suspect. Otherwise the step is told with both numbers
    and every suspect.
    """
    reported = f.reported_free
    if reported is None or reported == f.free:
        return []
    derived = f.free - leaked
    missing = derived - reported
    if missing == 0:
        return []
    suspects = _suspects(f, missing)
    kinds = {kind for kind, _, _ in suspects}
    if len(kinds) == 1 and sum(n for _, _, n in suspects) >= abs(missing):
        [kind] = kinds
        ids = ", ".join(rid for _, rid, _ in suspects)
        n = sum(n for _, _, n in suspects)
        one = suspects[0][1] if len(suspects) == 1 else None
        if kind == "victim":
            return [Violation("preempt", f.step,
                              f"preempting {ids} should have released {n} GPU blocks, but "
                              f"the engine reports {missing} fewer free", request=one,
                              lhs=n - missing, relation="==", rhs=n)]
        if kind == "finish":
            return [Violation("finish", f.step,
                              f"finishing {ids} should have released {n} GPU blocks, but "
                              f"the engine reports {missing} fewer free (a leak)",
                              request=one, lhs=n - missing, relation="==", rhs=n)]
        if kind == "restart":
            return [Violation("preempt", f.step,
                              f"after recompute, {ids} restarted with other than C = 0 and "
                              f"no blocks: the engine's free count is off by {missing}",
                              request=one, lhs=-missing, relation="==", rhs=0)]
        what = {"abort": f"aborting {ids} should have released {n} GPU blocks",
                "release": f"releasing {ids} should have freed {n} GPU blocks",
                "reclaim": f"reclaiming {ids} should have freed {n} GPU blocks",
                "prefix hit": f"{ids} took {n} evictable cached blocks by prefix hit"}.get(
                    kind, f"{ids} should have been handed {n} GPU blocks")
        return [Violation("accounting", f.step,
                          f"{what}, but the engine reports {abs(missing)} "
                          f"{'fewer' if missing > 0 else 'more'} free", request=one,
                          lhs=reported, relation="==", rhs=derived)]
    why = ""
    if suspects:
        names = ", ".join(f"{rid}'s {kind} ({n})" for kind, rid, n in suspects[:6])
        more = f" and {len(suspects) - 6} more" if len(suspects) > 6 else ""
        why = (f"; {abs(missing)} {'fewer' if missing > 0 else 'more'} free, which "
               f"{'any of ' if len(suspects) > 1 else ''}{names}{more} could explain")
    return [Violation("accounting", f.step,
                      f"the engine reports {reported} free GPU blocks; the trace implies "
                      f"{derived}{why}", lhs=reported, relation="==", rhs=derived)]


def held_at_end(step: int, state: State) -> list[Violation]:
    """accounting, at the end of a complete trace (config pipelined): a finished request
    still held holds its blocks for good, a leak (the end line says the engine ran until
    every session ended, which releases them)."""
    return [Violation("accounting", step,
                      f"{rid} finished at step {t.finished_at} but still holds "
                      f"{t.gpu_blocks} GPU blocks when the trace ends: never released or "
                      "reclaimed (a leak)", request=rid, lhs=t.gpu_blocks, relation="==",
                      rhs=0)
            for rid, t in state.live.items() if t.status == Status.HELD]
