"""A block allocator with real block ids: GPU blocks, host (swap) blocks, block tables,
and with prefix caching the cache of full blocks by content (vLLM v1's block pool)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Literal

from kvsched.spec.knobs import FreeOrder

Pool = Literal["gpu", "host"]


class FreeList:
    """A pool's free block ids in the order they are handed out: those put back at its
    head, then the ids never handed out yet (held as a range's bounds, so that a pool's
    memory follows the blocks it has handed out, not its size), then those put back at
    its tail. The order is that of one queue that starts as `first`, `first` + 1, ...
    """

    def __init__(self, first: int, count: int) -> None:
        self._head: deque[int] = deque()
        self._fresh = first  # the next id never handed out
        self._end = first + count
        self._tail: deque[int] = deque()

    def __len__(self) -> int:
        return len(self._head) + (self._end - self._fresh) + len(self._tail)

    def __iter__(self) -> Iterator[int]:
        yield from self._head
        yield from range(self._fresh, self._end)
        yield from self._tail

    def take(self, count: int) -> list[int]:
        """The next `count` ids, from the head.

        pre: 0 <= count <= len(self)
        """
        out: list[int] = []
        if count <= 0:
            return out
        head = self._head
        while head and len(out) < count:
            out.append(head.popleft())
        fresh = min(count - len(out), self._end - self._fresh)
        out.extend(range(self._fresh, self._fresh + fresh))
        self._fresh += fresh
        tail = self._tail
        while len(out) < count:
            out.append(tail.popleft())
        return out

    def extend(self, ids: Iterable[int]) -> None:
        """Put `ids` back at the tail, in the order given."""
        self._tail.extend(ids)

    def extendleft(self, ids: Iterable[int]) -> None:
        """Put `ids` back at the head, each before the one put before it (deque's rule)."""
        self._head.extendleft(ids)

    def remove(self, block: int) -> None:
        """Take `block`, one that was handed out before and put back, off the list."""
        if block in self._head:
            self._head.remove(block)
        else:
            self._tail.remove(block)


class BlockAllocator:
    """Free lists of GPU and host block ids and a block table per request.

    Freed blocks go to the tail of the free list and allocation takes from the head,
    so the most recently freed block is reused last (as vLLM's free block queue).

    With prefix caching (`caching`), as vLLM v1's BlockPool: a block may have several
    holders (a hit shares it); a full block is cached under its content key when its
    tokens are scheduled (`cache`), and stays cached when its last holder frees it, free
    and evictable, until it is handed out again, which drops its content. Freeing walks
    a table from its end: blocks without content go to the head of the free list, cached
    ones to the tail, each group in that walk's order, so cached content is evicted last
    (`free_order` "uncached_first", vLLM 0.24 on); or every block to the tail in the
    walk's order ("as_freed", vLLM up to 0.23). A hit on a free cached block takes it out
    of the free list (`hit`). Of several blocks with the same content, a lookup finds the
    one cached first.

    Extension points: every id leaves a free list through `take` and joins one through
    `put`, and `free_gpu` and `free_cpu` are the counts the scheduler decides by. A
    subclass that overrides them changes where ids come from and where they go (the
    seeded bugs of kvsched.testing.seeded_bugs: an allocator that hands out ids it does
    not have, one that loses what it frees).
    """

    def __init__(self, num_gpu_blocks: int, num_cpu_blocks: int,
                 first_gpu_id: int = 0, caching: bool = False,
                 free_order: FreeOrder = "uncached_first") -> None:
        # GPU ids run from the engine's first block id (config.first_block_id).
        self._free: dict[Pool, FreeList] = {"gpu": FreeList(first_gpu_id, num_gpu_blocks),
                                            "host": FreeList(0, num_cpu_blocks)}
        self._tables: dict[Pool, dict[str, list[int]]] = {"gpu": {}, "host": {}}
        self.caching = caching
        self.free_order = free_order
        self._holders: dict[int, int] = {}  # GPU block -> how many tables hold it
        self._content: dict[int, str] = {}  # cached GPU block -> its content key
        self._cached: dict[str, dict[int, None]] = {}  # content key -> its blocks, in order
        self._cached_upto: dict[str, int] = {}  # request -> its table's blocks cached

    # -- counts ---------------------------------------------------------------------------

    def free_count(self, pool: Pool) -> int:
        """The ids on `pool`'s free list."""
        return len(self._free[pool])

    @property
    def free_gpu(self) -> int:
        """Free GPU blocks, as the scheduler counts them."""
        return self.free_count("gpu")

    @property
    def free_cpu(self) -> int:
        """Free host blocks, as the scheduler counts them."""
        return self.free_count("host")

    def gpu_blocks(self, rid: str) -> int:
        return len(self._tables["gpu"].get(rid, ()))

    def host_blocks(self, rid: str) -> int:
        return len(self._tables["host"].get(rid, ()))

    # -- read accessors (kvsched.spec.interface.BlockTables) ---------------------------

    def block_table(self, rid: str) -> tuple[int, ...]:
        """`rid`'s GPU block ids in table order; () when it holds none."""
        return tuple(self._tables["gpu"].get(rid, ()))

    def host_table(self, rid: str) -> tuple[int, ...]:
        """`rid`'s host block ids in table order; () when it holds none."""
        return tuple(self._tables["host"].get(rid, ()))

    def free_gpu_ids(self) -> tuple[int, ...]:
        """The free GPU block ids in the order they will be handed out."""
        return tuple(self._free["gpu"])

    def free_host_ids(self) -> tuple[int, ...]:
        """The free host block ids in the order they will be handed out."""
        return tuple(self._free["host"])

    def holders(self) -> tuple[str, ...]:
        """The ids of the requests that hold GPU or host blocks, sorted."""
        return tuple(sorted({rid for table in self._tables.values()
                             for rid, ids in table.items() if ids}))

    # -- the free lists: where ids leave and join them --------------------------------

    def take(self, pool: Pool, count: int) -> list[int]:
        """The next `count` ids from the head of `pool`'s free list.

        pre: 0 <= count <= self.free_count(pool)
        post: len(__return__) == count
        """
        free = self._free[pool]
        assert 0 <= count <= len(free), f"taking {count} {pool} blocks beyond the free ones"
        return free.take(count)

    def put(self, pool: Pool, ids: list[int]) -> None:
        """Append `ids` to the tail of `pool`'s free list, in the order given."""
        self._free[pool].extend(ids)

    # -- what the scheduler does with blocks ------------------------------------------

    def allocate(self, rid: str, count: int) -> list[int]:
        """Give `rid` `count` more GPU blocks (each drops any content it had cached).

        pre: 0 <= count <= self.free_gpu
        post: len(__return__) == count
        """
        got = self.take("gpu", count)
        if self.caching:
            for b in got:
                self._forget(b)
                self._holders[b] = 1
        self._tables["gpu"].setdefault(rid, []).extend(got)
        return got

    def free(self, rid: str) -> int:
        """Release every block `rid` holds, GPU and host; return the GPU blocks released."""
        released = self._release_gpu(rid)
        self.put("host", self._tables["host"].pop(rid, []))
        return released

    def swap_out(self, rid: str) -> int:
        """Move all of `rid`'s GPU blocks to host blocks; return how many moved.

        pre: self.gpu_blocks(rid) <= self.free_cpu
        """
        moved = self.gpu_blocks(rid)
        self._tables["host"][rid] = self.take("host", moved)
        self._release_gpu(rid)
        return moved

    def _release_gpu(self, rid: str) -> int:
        """Drop `rid`'s GPU table, walking it from its end; return the blocks now free."""
        table = self._tables["gpu"].pop(rid, [])
        self._cached_upto.pop(rid, None)
        if not self.caching:
            self.put("gpu", table[::-1])
            return len(table)
        if self.free_order == "as_freed":
            freed = []
            for b in reversed(table):
                self._holders[b] -= 1
                if self._holders[b] == 0:
                    del self._holders[b]
                    freed.append(b)
            self.put("gpu", freed)
            return len(freed)
        uncached: list[int] = []
        cached: list[int] = []
        for b in reversed(table):
            self._holders[b] -= 1
            if self._holders[b] == 0:
                del self._holders[b]
                (cached if b in self._content else uncached).append(b)
        self._free["gpu"].extendleft(reversed(uncached))
        self.put("gpu", cached)
        return len(uncached) + len(cached)

    # -- prefix caching -----------------------------------------------------------------

    def lookup(self, keys: list[str]) -> list[int]:
        """The longest run of cached blocks holding `keys` from the first: for each key
        the block cached under it first.

        post: len(__return__) <= len(keys)
        """
        out = []
        for key in keys:
            blocks = self._cached.get(key)
            if not blocks:
                break
            out.append(next(iter(blocks)))
        return out

    def evictable(self, blocks: list[int]) -> int:
        """How many of `blocks` no table holds (free, and cached): a hit takes them.

        post: 0 <= __return__ <= len(blocks)
        """
        return sum(1 for b in blocks if b not in self._holders)

    def hit(self, rid: str, blocks: list[int]) -> None:
        """Start `rid`'s empty table with the cached `blocks` (a prefix hit); the free ones
        leave the free list.

        pre: self.gpu_blocks(rid) == 0
        """
        for b in blocks:
            if b not in self._holders:
                self._free["gpu"].remove(b)
            self._holders[b] = self._holders.get(b, 0) + 1
        self._tables["gpu"][rid] = list(blocks)
        self._cached_upto[rid] = len(blocks)

    def cache(self, rid: str, full: int, key: Callable[[int], str]) -> None:
        """Cache `rid`'s first `full` blocks (full of scheduled tokens) not cached yet, each
        under `key(table index)`."""
        table = self._tables["gpu"].get(rid, [])
        for i in range(self._cached_upto.get(rid, 0), min(full, len(table))):
            b = table[i]
            if b not in self._content:
                k = key(i)
                self._content[b] = k
                self._cached.setdefault(k, {})[b] = None
        self._cached_upto[rid] = max(full, self._cached_upto.get(rid, 0))

    def _forget(self, b: int) -> None:
        """Drop the content `b` had cached (it is handed out again)."""
        key = self._content.pop(b, None)
        if key is not None:
            blocks = self._cached[key]
            del blocks[b]
            if not blocks:
                del self._cached[key]

    def swap_in(self, rid: str) -> list[int]:
        """Move `rid`'s host blocks back to fresh GPU blocks; return the new GPU ids.

        pre: self.host_blocks(rid) <= self.free_gpu
        """
        host = self._tables["host"].pop(rid, [])
        self.put("host", host)
        return self.allocate(rid, len(host))
