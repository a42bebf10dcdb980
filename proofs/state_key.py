"""Canonical state encoding for the model checker: two worlds with equal keys behave alike.

A key holds everything a future step can depend on, and nothing that only counts
time: the step number, arrival steps and arrival sequence numbers enter only through
the order they induce (the reference orders by (priority, arrival step, sequence),
and the sequence grows with the arrival step), and preemption counters are left out
(they feed only the SHOULD no-thrash warning). Block ids stay in, so the block-ids
check sees the same owners from equal keys. Attributes a subclass adds (a seeded bug's
counters) are encoded generically, so a planted fault cannot hide in them; so is the
whole state of any other scheduler (a user's, of the kvsched.spec.interface.Scheduler
interface), where each Request counts by its id: the scope fixes its shape, and its
arrival step enters through the order the scheduler keeps it in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import fields
from enum import Enum
from typing import Any

from kvsched.reference.allocator import BlockAllocator
from kvsched.reference.lmdeploy import LMDeployScheduler, LMRequest, _Node
from kvsched.reference.radix import Node
from kvsched.reference.requests import LiveRequest
from kvsched.reference.scheduler import ReferenceScheduler
from kvsched.reference.sglang import TOUCH_INTERVAL, SGLangScheduler
from kvsched.spec.checker import Checker
from kvsched.spec.model import Request, StepRecord

# Attributes encoded explicitly below (or constant within one exploration).
SCHEDULER_FIELDS = frozenset({"config", "knobs", "blocks", "live", "running", "swapped",
                              "waiting", "arrived", "next_seq", "sampled", "victims"})
ALLOCATOR_FIELDS = frozenset({"_free", "_tables", "caching", "_holders", "_content",
                              "_cached", "_cached_upto"})


def plain(value: Any) -> Hashable:
    """A hashable, order-preserving encoding of an attribute value; entries become ids."""
    if value is None or isinstance(value, bool | int | str | float):
        return value
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, LiveRequest):
        return ("entry", value.request.id)
    if isinstance(value, Request):
        return ("request", value.id)
    if isinstance(value, list | tuple | deque):
        return tuple(plain(v) for v in value)
    if isinstance(value, set | frozenset):
        return tuple(sorted(repr(plain(v)) for v in value))
    if isinstance(value, dict):
        return tuple(sorted((repr(plain(k)), plain(v)) for k, v in value.items()))
    attrs = getattr(value, "__dict__", None)
    if attrs is not None:
        return (type(value).__name__, plain(attrs))
    return repr(value)


def extras(obj: object, known: frozenset[str]) -> Hashable:
    attrs = {k: v for k, v in vars(obj).items() if k not in known}
    return plain(attrs) if attrs else ()


def allocator_key(blocks: BlockAllocator) -> Hashable:
    holders = blocks.holders()
    tables = tuple((rid, blocks.block_table(rid)) for rid in holders if blocks.block_table(rid))
    host = tuple((rid, blocks.host_table(rid)) for rid in holders if blocks.host_table(rid))
    return (blocks.free_gpu_ids(), blocks.free_host_ids(), tables, host, cache_key(blocks),
            extras(blocks, ALLOCATOR_FIELDS))


def cache_key(blocks: BlockAllocator) -> Hashable:
    """The prefix cache: each block's holder count and content, each content's blocks in
    the order they were cached (a lookup takes the first: `plain` would sort them), and
    how far each table is cached. The free list's order (which cached block is evicted
    first) is the free ids above."""
    return (blocks.caching, tuple(sorted(blocks._holders.items())),
            tuple(sorted(blocks._content.items())),
            tuple(sorted((key, tuple(ids)) for key, ids in blocks._cached.items())),
            tuple(sorted(blocks._cached_upto.items())))


def waiting_order(s: ReferenceScheduler) -> tuple[str, ...]:
    """The order the waiting pass would take the waiting requests in."""
    return tuple(r.request.id for r in s.waiting)


def node_path(node: Node) -> tuple[Hashable, ...]:
    """The tokens from the root to `node`: which node a request holds locked."""
    keys: list[tuple[Hashable, ...]] = []
    cur: Node | None = node
    while cur is not None:
        keys.append(cur.key)
        cur = cur.parent
    return tuple(t for k in reversed(keys) for t in k)


def sglang_key(s: SGLangScheduler) -> Hashable:
    """SGLang's step: each request's progress and pages, the queue, the running batch,
    the chunked request and the last batch, the flags, the ratio, the free list, the
    radix tree (paths, pages, locks, and the order of its stamps: only their order
    decides an eviction), and the FCFS touch's phase. Queue entry numbers enter through
    the order they give."""
    live = sorted(s.live.values(), key=lambda r: r.entry)
    entries = tuple((r.id, r.request.prompt_len, r.request.max_tokens, r.request.priority,
                     r.status.value, r.outputs, r.computed, r.cached, r.fill,
                     tuple(r.pages)) for r in live)
    nodes = []
    stack: list[tuple[tuple[Hashable, ...], Node]] = [((), s.tree.root)]
    while stack:
        path, node = stack.pop()
        nodes.append((path, tuple(node.value), node.lock_ref, node.last_access))
        for child in node.children.values():
            stack.append(((*path, *child.key), child))
    stamps = sorted(n[3] for n in nodes)
    tree = tuple(sorted((p, v, lock, stamps.index(t)) for p, v, lock, t in nodes))
    locks = tuple(sorted((r.id, node_path(r.lock)) for r in live if r.lock is not None))

    def ids(rs: list[Any]) -> tuple[str, ...]:
        return tuple(r.id for r in rs)

    return ("sglang", entries, ids(s.waiting), ids(s.running),
            s.chunked.id if s.chunked else None, ids(s.last_batch), ids(s.decoding),
            ids(s.sampled), s.last_was_prefill, s.batch_is_full, s.ratio,
            tuple(s.free_pages), tree, locks, s.passes % TOUCH_INTERVAL,
            plain(s.deduplicated))


def lmdeploy_key(s: LMDeployScheduler) -> Hashable:
    """LMDeploy's step: each request's engine counts (history, pending, generated, the
    capped max_new_tokens, a chunk's kv_limit), engine state and kvsched status, blocks,
    and what the trace last showed of it (its table and computed tokens: the next
    new_blocks and prefix hit follow from them); the queues in order (waiting, held in
    finish order, running as the inputs maker keeps it, the request being chunked);
    the counters (decodes in a row, short turns since a chunk, the last forward's
    kind); the pending output of the pipeline (its entries, tokens, samples and stops);
    the free list in order; and the block trie with its references and access times.

    Left out, and why none can change a later decision:
    - the clock (`step`) and each request's arrival step (`arrive`): a request's arrival
      step and its arrival number (`order`) grow together, so every sort by (arrive,
      order) is the order the entries are listed in here; `finished_at` enters as the
      forwards since the finish (the release is `release_delay` forwards after it); the
      clock is read otherwise only through step_seconds (a long prompt's aging, the
      trie's access times), which reads 0 at step_seconds 0. Where step_seconds is not
      0 and aging (ttft_policy size) or the trie (prefix caching) can read it, the clock
      and the arrival steps are in the key, whole: such a scope has more states than
      any bound (the scopes keep step_seconds 0);
    - `arrivals` and the trie's node counter, whose values enter only through the order
      they give (the entries' order here, the nodes' ranks);
    - a request's `preemptions` (states() shows it; it feeds only the no-thrash SHOULD);
    - `short_turns` past the rule's count: only `short_turns >= rules.short_turns` reads
      it, and it only grows or resets, so it is kept capped;
    - the step's scratch (`batch`, `chunk_step`, `sampled`, `new_blocks`, `reclaimed`,
      `preempted`, `hits`, `arrived`), which schedule() sets afresh before reading,
      and the constants of the config and knobs. Kept generically anyway, in case.
    """
    rules = s.rules
    clock = rules.step_seconds != 0 and (s.caching or rules.ttft_policy == "size")
    live = sorted(s.live.values(), key=lambda r: r.order)
    nodes = trie_nodes(s)
    rank = {id(n): i for i, n in enumerate(sorted(nodes, key=lambda n: n.order))}

    def node(n: _Node | None) -> Hashable:
        if n is None:
            return None
        if n is s.root:
            return "root"
        return (trie_path(n), n.block, n.depth, rank[id(n)], n.attached(),
                tuple(sorted(n.children)))

    def request(r: LMRequest) -> Hashable:
        since = s.step - r.finished_at if r.finished_at >= 0 else None
        return (r.id, r.request.prompt_len, r.request.max_tokens, r.request.prefix,
                r.max_new, r.history, r.pending, r.generated, tuple(r.blocks), r.kv_limit,
                r.state, r.known, r.computed, r.status.value, since, r.finish_rank,
                node(r.cursor), tuple(r.seen), r.shown, r.arrive if clock else None)

    def ids(rs: list[LMRequest]) -> tuple[str, ...]:
        return tuple(r.id for r in rs)

    out = s.output
    pending = None if out is None else (
        tuple((r.id, n, sampled) for r, n, sampled in out.batch), out.chunk,
        tuple(sorted(out.stops)))
    trie = (tuple(sorted(node(n) for n in nodes if n is not s.root)),  # type: ignore[type-var]
            tuple(sorted(node(n) for n in s.leaves)),  # type: ignore[type-var]
            tuple(sorted(s.cached)), tuple(sorted(s.refs.items())),
            tuple(sorted(s.stamps.items())), plain(s.book._given))
    scratch = (ids(s.arrived), tuple((r.id, n) for r, n in s.batch), s.chunk_step,
               ids(s.sampled))
    return ("lmdeploy", tuple(request(r) for r in live), ids(s.waiting), ids(s.stopped),
            ids(s.running), s.chunking.id if s.chunking else None, s.decode_count,
            min(s.short_turns, rules.short_turns), s.last_kind, pending,
            tuple(s.free_list), trie, scratch, s.step if clock else None,
            (s.config, rules))


def trie_nodes(s: LMDeployScheduler) -> list[_Node]:
    """Every node of the block trie a later step can reach: the tree's, the leaves kept
    for eviction and the requests' cursors (a detached one too)."""
    seen: dict[int, _Node] = {}
    stack = [s.root, *s.leaves, *(r.cursor for r in s.live.values() if r.cursor)]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen[id(n)] = n
        stack += list(n.children.values())
    return list(seen.values())


def trie_path(n: _Node) -> tuple[str, ...]:
    """The content keys from the top of `n`'s branch (the root, or where it was cut off)
    to `n`."""
    keys: list[str] = []
    cur: _Node | None = n
    while cur is not None and cur.depth > 0:
        keys.append(cur.key)
        cur = cur.parent
    return tuple(reversed(keys))


def scheduler_key(s: object) -> Hashable:
    if isinstance(s, SGLangScheduler):
        return sglang_key(s)
    if isinstance(s, LMDeployScheduler):
        return lmdeploy_key(s)
    if not isinstance(s, ReferenceScheduler):  # any scheduler: all it holds
        return plain(s)
    live = sorted(s.live.values(), key=lambda e: e.seq)
    entries = tuple((e.request.id, e.request.prompt_len, e.request.max_tokens,
                     e.request.priority, e.status.value, e.num_tokens, e.num_computed)
                    for e in live)
    pending = tuple(plain(getattr(s, name)) for name in ("arrived", "sampled", "victims"))
    return (entries, waiting_order(s), tuple(e.request.id for e in s.running),
            tuple(e.request.id for e in s.swapped), pending, allocator_key(s.blocks),
            extras(s, SCHEDULER_FIELDS))


def line_key(rec: StepRecord | None) -> Hashable:
    """A step's line still held (config pipelined: checked once the next step is decided),
    without its step number and times: its arrivals by id."""
    if rec is None:
        return None
    return tuple(plain(getattr(rec, f.name)) for f in fields(rec)
                 if f.name not in ("step", "line", "time_ms"))


def checker_key(c: Checker) -> Hashable:
    """The spec's own view of the state, as the checker replays it."""
    st = c.state
    # A held request's finish step enters as the steps since it (whether it may still be
    # scheduled or preempted: only in the step right after its finish).
    live = tuple(sorted((rid, t.status.value, t.num_tokens, t.num_computed, t.gpu_blocks,
                         t.host_blocks, tuple(t.block_ids), t.recomputing, tuple(t.keys),
                         None if t.finished_at is None else c.step_no - t.finished_at)
                        for rid, t in st.live.items()))
    # Whether ids were seen, and from which step some were missing, only say what the
    # report covers: no later verdict depends on them, so they stay out of the key.
    return (live, st.free, st.free_host, st.running, c.leaked,
            tuple(sorted((b, tuple(held)) for b, held in st.holders.items())),
            tuple(sorted(st.cached.items())))
