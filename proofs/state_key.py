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
from enum import Enum
from typing import Any

from kvsched.reference.allocator import BlockAllocator
from kvsched.reference.radix import Node
from kvsched.reference.requests import LiveRequest
from kvsched.reference.scheduler import ReferenceScheduler
from kvsched.reference.sglang import TOUCH_INTERVAL, SGLangScheduler
from kvsched.spec.checker import Checker
from kvsched.spec.model import Request

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


def scheduler_key(s: object) -> Hashable:
    if isinstance(s, SGLangScheduler):
        return sglang_key(s)
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


def checker_key(c: Checker) -> Hashable:
    """The spec's own view of the state, as the checker replays it."""
    st = c.state
    live = tuple(sorted((rid, t.status.value, t.num_tokens, t.num_computed, t.gpu_blocks,
                         t.host_blocks, tuple(t.block_ids), t.recomputing, tuple(t.keys))
                        for rid, t in st.live.items()))
    # Whether ids were seen, and from which step some were missing, only say what the
    # report covers: no later verdict depends on them, so they stay out of the key.
    return (live, st.free, st.free_host, st.running, c.leaked,
            tuple(sorted((b, tuple(held)) for b, held in st.holders.items())),
            tuple(sorted(st.cached.items())))
