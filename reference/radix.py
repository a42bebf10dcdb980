"""SGLang 0.5.23's radix cache as its scheduler uses it: `UnifiedRadixCache` with the FULL
component only (no HiCache, no SWA/Mamba, LRU eviction), in tokens and pages.

Token contents are opaque hashable keys. A tree edge holds a run of tokens; with
`page_size` > 1 every key is cut to whole pages and nodes split on page boundaries only.
Memory is counted in tokens, as SGLang does (a page is `page_size` tokens).

Source lines cited as `file:LINE` are under `sglang/srt/` of sglang 0.5.23:
  URC  = mem_cache/unified_radix_cache.py       UTC = mem_cache/unified_cache/unified_tree_core.py
  FULL = mem_cache/unified_cache/components/full.py   BASE = .../components/base.py

The clock. SGLang stamps `last_access_time` with a process-global logical counter
(`get_and_increase_time_counter`, BASE:161, +1.0 per call), not wall-clock time. One call
per: node creation (two: `last_access_time` and `creation_time`, UTC:126), `_touch_node`
(UTC:1096), a match's end (UTC:1031: the matched node gets the tick t and each ancestor
t - 0.00001 * depth-above-it, up to the root), a split (UTC:1524, the lower part). This
model keeps the same tick sequence and stores a stamp as (tick, -depth_above), which orders
exactly as SGLang's floats do. Eviction is a min-heap on the stamp (FULL:230); stamps are
unique among evictable leaves, so ties never arise.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

Stamp = tuple[int, int]


class Node:
    """A tree node: the edge `key` from its parent, the ids of the pages holding it
    (`value`, one per page of the key: SGLang's node value, in pages), a lock count, an
    LRU stamp. The object is the handle a request keeps (SGLang's NodeId): a split keeps
    the object as the lower part and makes a new node for the upper part (UTC:1467)."""

    __slots__ = ("children", "key", "last_access", "lock_ref", "parent", "value")

    def __init__(self, parent: Node | None, key: tuple[Hashable, ...], value: list[int],
                 stamp: Stamp) -> None:
        self.parent = parent
        self.key = key
        self.value = value
        self.children: dict[tuple[Hashable, ...], Node] = {}
        self.lock_ref = 0
        self.last_access = stamp


@dataclass(frozen=True)
class Match:
    """A match: `length` tokens hit (SGLang's `device_prefix_len`) ending at `node`, held
    in `pages` (the path's page ids)."""

    length: int
    node: Node
    pages: tuple[int, ...] = ()


@dataclass(frozen=True)
class Cached:
    """The outcome of caching a request's KV (`checkpoint_into_tree`, URC:1164).

    freed: tokens of the request that were already in the tree; SGLang frees them to the
      allocator during the insert (FreeDeviceKV, UTC:1352) and the request adopts the
      tree's copies (URC:1290).
    protected_len: the request's new `cache_protected_len` (the page-aligned inserted length).
    lock: the node the request now holds locked (its old lock was released).
    freed_pages: the ids of the freed pages; table: the ids of the request's first
      protected_len // page_size pages now (the tree's copies where it had duplicates)."""

    freed: int
    protected_len: int
    lock: Node | None
    freed_pages: tuple[int, ...] = ()
    table: tuple[int, ...] = ()
    undo: Undo | None = None  # asked for (cache_req's `undoable`) and possible


@dataclass(frozen=True)
class Undo:
    """What takes back one `cache_req` that freed nothing and split nothing, as if it
    never happened: the clock before it, the stamps it moved (in order), the leaf it hung
    (None: none), the lock it released and the one it took."""

    clock: int
    stamps: tuple[tuple[Node, Stamp], ...]
    leaf: Node | None
    released: Node | None
    taken: Node | None


class RadixTree:
    """The radix cache. With `disable=True` (`--disable-radix-cache`) it holds nothing:
    matches are empty, locks and caching are no-ops, nothing is ever evictable."""

    def __init__(self, page_size: int, disable: bool = False) -> None:
        assert page_size >= 1
        self.page_size = page_size
        self.disable = disable
        self._clock = 0
        self.root = self._new_node(None, (), [])
        self.root.lock_ref = 1  # UTC:497: the root is always locked
        self._evictable = 0
        self._protected = 0
        self._stamps: list[tuple[Node, Stamp]] | None = None  # an undoable insert's
        self._splits = 0
        self._leaf: Node | None = None  # the leaf the last insert hung

    # ---- clock ----
    def _tick(self) -> int:
        """`get_and_increase_time_counter` (BASE:161)."""
        self._clock += 1
        return self._clock - 1

    def _new_node(self, parent: Node | None, key: tuple[Hashable, ...],
                  value: list[int]) -> Node:
        node = Node(parent, key, value, (self._tick(), 0))  # last_access_time (UTC:126)
        self._tick()  # creation_time (UTC:127)
        return node

    # ---- sizes ----
    def evictable_size(self) -> int:
        """Tokens in unlocked nodes (URC:3804; FULL:385-387, UTC:1554)."""
        return self._evictable

    def protected_size(self) -> int:
        """Tokens in locked nodes (URC:3807)."""
        return self._protected

    # ---- walking ----
    def _aligned(self, key: Sequence[Hashable], limit: int | None = None) -> tuple[Hashable, ...]:
        """The key cut to `limit` tokens, then to whole pages (RadixKey limit and
        `page_aligned`, radix_cache.py:84, :147)."""
        n = len(key) if limit is None else max(0, min(limit, len(key)))
        return tuple(key[: n // self.page_size * self.page_size])

    def _common(self, node_key: tuple[Hashable, ...], key: tuple[Hashable, ...], off: int) -> int:
        """Tokens of `node_key` equal to `key[off:]`, floored to pages (`match_at`,
        radix_cache.py:182)."""
        n = min(len(node_key), len(key) - off)
        i = 0
        while i < n and node_key[i] == key[off + i]:
            i += 1
        return i // self.page_size * self.page_size

    def _split(self, child: Node, at: int) -> Node:
        """`_split_node` (UTC:1467): a new upper node takes `child.key[:at]` and the lock
        count; `child` keeps the rest and is re-stamped (UTC:1524)."""
        parent = child.parent
        assert parent is not None
        cut = at // self.page_size
        self._splits += 1
        upper = self._new_node(parent, child.key[:at], child.value[:cut])
        upper.lock_ref = child.lock_ref  # FULL:141
        child.key = child.key[at:]
        child.value = child.value[cut:]
        child.parent = upper
        upper.children[child.key[: self.page_size]] = child
        parent.children[upper.key[: self.page_size]] = upper
        child.last_access = (self._tick(), 0)
        return upper

    # ---- match (admission) ----
    def match(self, key: Sequence[Hashable], limit: int | None = None) -> Match:
        """`match_prefix` (URC:613 -> UTC:886, :905, :1012).

        The scheduler matches `origin_input_ids + output_ids` at admission with
        `limit = len - 1` (`Req.init_next_round_input`, managers/schedule_batch.py:1720;
        `_compute_max_prefix_len`, :1766; `match_kv_cache`, mem_cache/common.py:221); the
        key is then cut to whole pages (UTC:891). The walk follows whole edges; an edge
        matched only in part is split there (UTC:952). The matched node and every ancestor
        up to the root are stamped (UTC:1030-1034). An empty (aligned) key stamps nothing.
        With the cache disabled the result is empty (URC:620)."""
        k = self._aligned(key, limit)
        if self.disable or not k:
            return Match(0, self.root)
        node, off, ps = self.root, 0, self.page_size
        while off < len(k) and k[off : off + ps] in node.children:
            child = node.children[k[off : off + ps]]
            m = self._common(child.key, k, off)
            off += m
            if m < len(child.key):
                node = self._split(child, m)
                break
            node = child
        t, depth = self._tick(), 0
        cur: Node | None = node
        path: list[list[int]] = []
        while cur is not None:
            cur.last_access = (t, -depth)
            path.append(cur.value)
            depth += 1
            cur = cur.parent
        return Match(off, node, tuple(p for v in reversed(path) for p in v))

    def touch(self, key: Sequence[Hashable]) -> None:
        """`touch_prefix` (URC:647): a match without limit, result unused. The FCFS
        scheduler does it for `reversed(waiting_queue[:128])`, keys prompt + outputs, on
        every 32nd `calc_priority` with a non-empty queue (the 1st, 33rd, ...;
        `_touch_waiting_prefixes`, managers/schedule_policy.py:280-302)."""
        self.match(key)

    # ---- locks ----
    def lock(self, node: Node) -> Node | None:
        """`inc_lock_ref` (URC:1077; FULL:358-376): +1 on every node up to the root; a node
        going 0 -> 1 moves its tokens from evictable to protected. The scheduler locks the
        matched node at admission (`_commit_prefill_admission`,
        managers/schedule_policy.py:1690) and moves the lock when caching (URC:1305)."""
        if self.disable:
            return None
        cur = node
        while cur is not self.root:
            assert cur.parent is not None, "locking an evicted node"
            if cur.lock_ref == 0:
                self._evictable -= len(cur.key)
                self._protected += len(cur.key)
            cur.lock_ref += 1
            cur = cur.parent
        return node

    def unlock(self, lock: Node | None) -> None:
        """`dec_lock_ref` (URC:1084; FULL:409-421): the inverse of `lock`. At finish and
        retraction (`release_kv_cache`, mem_cache/common.py:434)."""
        if lock is None or self.disable:
            return
        cur = lock
        while cur is not self.root:
            assert cur.lock_ref > 0 and cur.parent is not None
            if cur.lock_ref == 1:
                self._evictable += len(cur.key)
                self._protected -= len(cur.key)
            cur.lock_ref -= 1
            cur = cur.parent

    # ---- insertion ----
    def _insert(self, key: tuple[Hashable, ...], prev_prefix_len: int, value: list[int]
                ) -> tuple[Node, list[int]]:
        """`insert` (URC:661; UTC:1129-1465): touch the root, then walk: touch each edge
        met, split it where the key leaves it, count the overlap past `prev_prefix_len` as
        duplicates (UTC:1350-1363); hang the rest under a new unlocked leaf (UTC:1532).
        `value` holds the pages of `key`: a duplicate's page is returned (to be freed)
        and replaced in `value` by the tree's."""
        self._restamp(self.root)  # UTC:1146
        node, off, ps = self.root, 0, self.page_size
        freed: list[int] = []
        self._leaf = None
        while off < len(key) and key[off : off + ps] in node.children:
            child = node.children[key[off : off + ps]]
            self._restamp(child)  # _touch_node (UTC:1291)
            m = self._common(child.key, key, off)
            if m < len(child.key):
                child = self._split(child, m)
            for j in range(max(off, prev_prefix_len) // ps, (off + m) // ps):
                freed.append(value[j])
                value[j] = child.value[j - off // ps]
            node, off = child, off + m
        if off < len(key):
            leaf = self._new_node(node, key[off:], value[off // ps :])
            node.children[leaf.key[:ps]] = leaf
            self._evictable += len(leaf.key)
            node = leaf
            self._leaf = leaf
        return node, freed

    def _restamp(self, node: Node) -> None:
        """Stamp `node` with the next tick, noting its old stamp for an undoable insert."""
        if self._stamps is not None:
            self._stamps.append((node, node.last_access))
        node.last_access = (self._tick(), 0)

    def cache_req(
        self,
        key: Sequence[Hashable],
        up_to: int,
        prompt_len: int,
        protected_len: int,
        lock: Node | None,
        pages: Sequence[int] = (),
        undoable: bool = False,
    ) -> Cached:
        """`checkpoint_into_tree` (URC:1164): cache `key[:up_to]` of a request whose
        `cache_protected_len` is `protected_len` and which holds `lock`.

        Called with key = origin_input_ids + output_ids and
        - after every prefill of a request that did not finish, up_to = `extend_end`:
          a middle chunk when the next batch is built (`stash_chunked_request`,
          managers/scheduler.py:3919, :3776), the last chunk right after its forward
          (batch_result_processor.py:394); `checkpoint_kv_cache`, mem_cache/common.py:271,
          then sets `prefix_len = extend_end`;
        - at finish, up_to = `owned_kv_len()` (prompt + outputs - 1 normally)
          (`release_kv_cache(checkpoint=True)`, mem_cache/common.py:426), after which the
          caller frees the request's own tokens [protected_len, up_to) (page-wise:
          pages protected_len/ps .. ceil(up_to/ps)) and unlocks the returned lock (:433-435).
        Only the page-aligned part is inserted (URC:1231-1234); the tail stays the
        request's. When the prompt's aligned length lies strictly inside the inserted key,
        a second insert of the prompt splits the leaf there, freeing nothing (URC:1255-1278).
        The lock moves from `lock` to the inserted path's end (URC:1295-1311). Disabled or
        up_to <= 0: nothing happens (URC:1173, :1218).

        `undoable`: the result carries an Undo (`undo` takes the insert back) when the
        insert freed nothing and split nothing, and left the prompt alone."""
        if self.disable or up_to <= 0:
            return Cached(0, protected_len, lock)
        k = self._aligned(key, up_to)
        value = list(pages[: len(k) // self.page_size])
        if len(value) < len(k) // self.page_size:  # a caller that keeps no page ids
            value += [-1] * (len(k) // self.page_size - len(value))
        clock, splits = self._clock, self._splits
        self._stamps = [] if undoable else None
        node, freed = self._insert(k, protected_len, value)
        stamps, leaf, self._stamps = self._stamps, self._leaf, None
        p = prompt_len // self.page_size * self.page_size
        second = 0 < p < len(k)
        if second:
            self._insert(k[:p], p, value[: p // self.page_size])
        assert protected_len <= len(k) + self.page_size - 1
        self.unlock(lock)
        taken = self.lock(node)
        undo = None
        if stamps is not None and not freed and not second and splits == self._splits:
            undo = Undo(clock, tuple(stamps), leaf, lock, taken)
        return Cached(len(freed) * self.page_size, len(k), taken, tuple(freed),
                      tuple(value), undo)

    def undo(self, u: Undo) -> None:
        """Take back the insert `u` came from, nothing having touched the tree since: the
        lock goes back, the leaf it hung goes (its pages are the request's own again),
        the stamps and the clock are as before."""
        self.unlock(u.taken)
        if u.released is not None:
            self.lock(u.released)
        if u.leaf is not None:
            parent = u.leaf.parent
            assert parent is not None and not u.leaf.children and u.leaf.lock_ref == 0
            del parent.children[u.leaf.key[: self.page_size]]
            u.leaf.parent = None
            self._evictable -= len(u.leaf.key)
        for node, stamp in reversed(u.stamps):
            node.last_access = stamp
        self._clock = u.clock

    # ---- eviction ----
    def evict(self, num_tokens: int) -> list[int]:
        """`evict(EvictParams(num_tokens))` (URC:690, :952-1058; FULL:224-256): delete
        whole unlocked leaves, least recent stamp first (a parent left an unlocked leaf
        joins the candidates), until at least `num_tokens` are freed or none is left.
        Returns the ids of the pages freed to the allocator, in the order freed."""
        if self.disable or num_tokens <= 0:
            return []
        heap: list[tuple[Stamp, int, Node]] = []
        stack = [self.root]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if not n.children and n.lock_ref == 0 and n is not self.root:
                heap.append((n.last_access, id(n), n))
        heapq.heapify(heap)
        freed, pages = 0, []
        while freed < num_tokens and heap:
            _, _, x = heapq.heappop(heap)
            parent = x.parent
            assert parent is not None and not x.children and x.lock_ref == 0
            del parent.children[x.key[: self.page_size]]
            x.parent = None
            self._evictable -= len(x.key)
            freed += len(x.key)
            pages += x.value
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return pages

    def evict_to_free(self, num_tokens: int, available: int) -> list[int]:
        """`evict_from_tree_cache(tree, num_tokens)` (mem_cache/common.py:283 ->
        allocator/base.py:155): evict until the allocator has `num_tokens` available,
        i.e. `evict(num_tokens - available)` (URC:697: walks to the target, checked
        after every node). Called before every KV allocation with the allocation's size
        (extend: `extend_num_tokens`, paged `+ page_size` per request,
        mem_cache/allocation.py:157, :192; decode, :642) and after each retraction with
        `20 * remaining requests` (managers/schedule_batch.py:2391). Returns the pages
        freed."""
        return self.evict(num_tokens - available)

    def nodes(self) -> list[Node]:
        """Every node but the root (for checks)."""
        out: list[Node] = []
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out
