"""A block allocator with real block ids: GPU blocks, host (swap) blocks, block tables."""

from __future__ import annotations

from collections import deque
from typing import Literal

Pool = Literal["gpu", "host"]


class BlockAllocator:
    """Free lists of GPU and host block ids and a block table per request.

    Freed blocks go to the tail of the free list and allocation takes from the head,
    so the most recently freed block is reused last (as vLLM's free block queue).

    Extension points: every id leaves a free list through `take` and joins one through
    `put`, and `free_gpu` and `free_cpu` are the counts the scheduler decides by. A
    subclass that overrides them changes where ids come from and where they go (the
    seeded bugs of kvsched.testing.seeded_bugs: an allocator that hands out ids it does
    not have, one that loses what it frees).
    """

    def __init__(self, num_gpu_blocks: int, num_cpu_blocks: int,
                 first_gpu_id: int = 0) -> None:
        # GPU ids run from the engine's first block id (config.first_block_id).
        gpu = range(first_gpu_id, first_gpu_id + num_gpu_blocks)
        self._free: dict[Pool, deque[int]] = {"gpu": deque(gpu),
                                              "host": deque(range(num_cpu_blocks))}
        self._tables: dict[Pool, dict[str, list[int]]] = {"gpu": {}, "host": {}}

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
        return [free.popleft() for _ in range(count)]

    def put(self, pool: Pool, ids: list[int]) -> None:
        """Append `ids` to the tail of `pool`'s free list, in the order given."""
        self._free[pool].extend(ids)

    # -- what the scheduler does with blocks ------------------------------------------

    def allocate(self, rid: str, count: int) -> list[int]:
        """Give `rid` `count` more GPU blocks.

        pre: 0 <= count <= self.free_gpu
        post: len(__return__) == count
        """
        got = self.take("gpu", count)
        self._tables["gpu"].setdefault(rid, []).extend(got)
        return got

    def release_last(self, rid: str, count: int) -> None:
        """Undo the last `count` blocks given to `rid` (a victim scheduled earlier this step)."""
        table = self._tables["gpu"].get(rid, [])
        self.put("gpu", [table.pop() for _ in range(count)])

    def free(self, rid: str) -> int:
        """Release every block `rid` holds, GPU and host; return the GPU blocks released."""
        gpu = self._tables["gpu"].pop(rid, [])
        self.put("gpu", gpu[::-1])
        self.put("host", self._tables["host"].pop(rid, []))
        return len(gpu)

    def swap_out(self, rid: str) -> int:
        """Move all of `rid`'s GPU blocks to host blocks; return how many moved.

        pre: self.gpu_blocks(rid) <= self.free_cpu
        """
        gpu = self._tables["gpu"].pop(rid, [])
        self._tables["host"][rid] = self.take("host", len(gpu))
        self.put("gpu", gpu[::-1])
        return len(gpu)

    def swap_in(self, rid: str) -> list[int]:
        """Move `rid`'s host blocks back to fresh GPU blocks; return the new GPU ids.

        pre: self.host_blocks(rid) <= self.free_gpu
        """
        host = self._tables["host"].pop(rid, [])
        self.put("host", host)
        got = self.take("gpu", len(host))
        self._tables["gpu"][rid] = list(got)
        return got
