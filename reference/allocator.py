"""A block allocator with real block ids: GPU blocks, host (swap) blocks, block tables."""

from __future__ import annotations

from collections import deque


class BlockAllocator:
    """Free lists of GPU and host block ids and a block table per request.

    Freed blocks go to the tail of the free list and allocation takes from the head,
    so the most recently freed block is reused last (as vLLM's free block queue).
    """

    def __init__(self, num_gpu_blocks: int, num_cpu_blocks: int) -> None:
        self._free_gpu: deque[int] = deque(range(num_gpu_blocks))
        self._free_cpu: deque[int] = deque(range(num_cpu_blocks))
        self._gpu: dict[str, list[int]] = {}
        self._cpu: dict[str, list[int]] = {}

    @property
    def free_gpu(self) -> int:
        return len(self._free_gpu)

    @property
    def free_cpu(self) -> int:
        return len(self._free_cpu)

    def gpu_blocks(self, rid: str) -> int:
        return len(self._gpu.get(rid, ()))

    def host_blocks(self, rid: str) -> int:
        return len(self._cpu.get(rid, ()))

    # -- read accessors (kvsched.spec.interface.BlockTables) ---------------------------

    def block_table(self, rid: str) -> tuple[int, ...]:
        """`rid`'s GPU block ids in table order; () when it holds none."""
        return tuple(self._gpu.get(rid, ()))

    def host_table(self, rid: str) -> tuple[int, ...]:
        """`rid`'s host block ids in table order; () when it holds none."""
        return tuple(self._cpu.get(rid, ()))

    def free_gpu_ids(self) -> tuple[int, ...]:
        """The free GPU block ids in the order they will be handed out."""
        return tuple(self._free_gpu)

    def free_host_ids(self) -> tuple[int, ...]:
        """The free host block ids in the order they will be handed out."""
        return tuple(self._free_cpu)

    def holders(self) -> tuple[str, ...]:
        """The ids of the requests that hold GPU or host blocks, sorted."""
        return tuple(sorted({rid for rid, ids in self._gpu.items() if ids}
                            | {rid for rid, ids in self._cpu.items() if ids}))

    # -- changes ------------------------------------------------------------------------

    def allocate(self, rid: str, count: int) -> list[int]:
        """Give `rid` `count` more GPU blocks.

        pre: 0 <= count <= self.free_gpu
        post: len(__return__) == count
        """
        assert 0 <= count <= len(self._free_gpu), "allocation beyond the free blocks"
        got = [self._free_gpu.popleft() for _ in range(count)]
        self._gpu.setdefault(rid, []).extend(got)
        return got

    def release_last(self, rid: str, count: int) -> None:
        """Undo the last `count` blocks given to `rid` (a victim scheduled earlier this step)."""
        table = self._gpu.get(rid, [])
        for _ in range(count):
            self._free_gpu.append(table.pop())

    def free(self, rid: str) -> int:
        """Release every block `rid` holds, GPU and host; return the GPU blocks released."""
        gpu = self._gpu.pop(rid, [])
        self._free_gpu.extend(reversed(gpu))
        self._free_cpu.extend(self._cpu.pop(rid, []))
        return len(gpu)

    def swap_out(self, rid: str) -> int:
        """Move all of `rid`'s GPU blocks to host blocks; return how many moved.

        pre: self.gpu_blocks(rid) <= self.free_cpu
        """
        gpu = self._gpu.pop(rid, [])
        assert len(gpu) <= len(self._free_cpu), "swap-out beyond the free host blocks"
        self._cpu[rid] = [self._free_cpu.popleft() for _ in gpu]
        self._free_gpu.extend(reversed(gpu))
        return len(gpu)

    def swap_in(self, rid: str) -> list[int]:
        """Move `rid`'s host blocks back to fresh GPU blocks; return the new GPU ids.

        pre: self.host_blocks(rid) <= self.free_gpu
        """
        host = self._cpu.pop(rid, [])
        assert len(host) <= len(self._free_gpu), "swap-in beyond the free GPU blocks"
        self._free_cpu.extend(host)
        got = [self._free_gpu.popleft() for _ in host]
        self._gpu[rid] = list(got)
        return got
