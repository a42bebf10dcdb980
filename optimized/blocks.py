"""The block pool as tensors: a free list per pool (GPU and host) and block tables.

The free list is a FIFO ring of block ids: allocation takes from the head, released
blocks go to the tail, a request's GPU blocks in reverse table order. With prefix
caching, freed blocks without content go to the head instead, and a prefix hit takes
free cached blocks out of the middle (`put_front`, `remove`). Handing out ids
in that order (the same as vLLM's free block queue) makes every new block id equal to
the reference allocator's, so the traces of both schedulers match byte for byte.

A block table has one row per request that holds blocks, not per live request: rows
are lent at admission or swap-in and given back when the blocks go, so a million
waiting requests cost no table memory.
"""

from __future__ import annotations

import torch
from torch import Tensor

I64 = torch.int64


def cdiv(x: Tensor, block_size: int) -> Tensor:
    """Blocks that hold x >= 0 tokens, elementwise."""
    return torch.div(x + (block_size - 1), block_size, rounding_mode="floor")


def exclusive_cumsum(x: Tensor) -> Tensor:
    return torch.cumsum(x, 0) - x


def spans(starts: Tensor, counts: Tensor, total: int) -> tuple[Tensor, Tensor]:
    """For runs of `counts` positions starting at `starts`: (run index, position) of
    each of the `total` positions, run after run."""
    run = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts,
                                  output_size=total)
    offset = torch.arange(total, device=counts.device) - exclusive_cumsum(counts)[run]
    return run, starts[run] + offset


class FreeList:
    """A ring buffer of free block ids: `take` from the head, `put` at the tail."""

    def __init__(self, size: int, device: torch.device) -> None:
        self.ids = torch.arange(size, dtype=I64, device=device)
        self.capacity = size
        self.head = 0
        self.count = size

    def take(self, k: int) -> Tensor:
        """The next k free ids, in order.

        pre: 0 <= k <= self.count
        """
        assert 0 <= k <= self.count, "allocation beyond the free blocks"
        h, cap = self.head, self.capacity
        if k == 0:
            return self.ids[:0]
        if h + k <= cap:
            out = self.ids[h:h + k].clone()
        else:
            out = torch.cat((self.ids[h:], self.ids[:h + k - cap]))
        self.head = (h + k) % cap
        self.count -= k
        return out

    def put(self, ids: Tensor) -> None:
        """Append ids at the tail, in the order given."""
        m = ids.numel()
        if m == 0:
            return
        assert self.count + m <= self.capacity, "more blocks released than the pool holds"
        cap = self.capacity
        tail = (self.head + self.count) % cap
        first = min(m, cap - tail)
        self.ids[tail:tail + first] = ids[:first]
        if first < m:
            self.ids[:m - first] = ids[first:]
        self.count += m

    def put_front(self, ids: Tensor) -> None:
        """Put ids before the head, in the order given (the first is taken first)."""
        m = ids.numel()
        if m == 0:
            return
        assert self.count + m <= self.capacity, "more blocks released than the pool holds"
        cap = self.capacity
        head = (self.head - m) % cap
        first = min(m, cap - head)
        self.ids[head:head + first] = ids[:first]
        if first < m:
            self.ids[:m - first] = ids[first:]
        self.head = head
        self.count += m

    def remove(self, ids: Tensor) -> None:
        """Take `ids` (all free) out of the list, wherever they are; the rest keep their
        order. Costs O(free blocks): a prefix hit on free cached blocks does it."""
        if ids.numel() == 0:
            return
        rest = self.ordered()
        rest = rest[~torch.isin(rest, ids)]
        assert rest.numel() == self.count - ids.numel(), "removing blocks that are not free"
        self.ids[:rest.numel()] = rest
        self.head = 0
        self.count = rest.numel()

    def ordered(self) -> Tensor:
        """The free ids from head to tail, as a tensor."""
        h, c, cap = self.head, self.count, self.capacity
        if h + c <= cap:
            return self.ids[h:h + c].clone()
        return torch.cat((self.ids[h:], self.ids[:h + c - cap]))

    def snapshot(self) -> list[int]:
        """The free ids from head to tail (for tests)."""
        h, c, cap = self.head, self.count, self.capacity
        if c == 0:
            return []
        if h + c <= cap:
            return [int(b) for b in self.ids[h:h + c].tolist()]
        return [int(b) for b in torch.cat((self.ids[h:], self.ids[:h + c - cap])).tolist()]


class BlockTable:
    """Rows of block ids, lent to requests that hold blocks.

    A row holds at most `max_cols` ids (the most blocks one request can hold); columns
    are allocated up to that bound as they are first needed.
    """

    def __init__(self, max_cols: int, device: torch.device) -> None:
        self.device = device
        self.max_cols = max(1, max_cols)
        self.cols = min(self.max_cols, 1024)
        self.table = torch.zeros((16, self.cols), dtype=I64, device=device)
        self.spare = torch.arange(15, -1, -1, dtype=I64, device=device)  # a stack of rows
        self.num_spare = 16

    def lend(self, k: int) -> Tensor:
        """k free rows."""
        if k > self.num_spare:
            self._grow_rows(k - self.num_spare)
        self.num_spare -= k
        return self.spare[self.num_spare:self.num_spare + k].clone()

    def give_back(self, rows: Tensor) -> None:
        m = rows.numel()
        self.spare[self.num_spare:self.num_spare + m] = rows
        self.num_spare += m

    def _grow_rows(self, at_least: int) -> None:
        old = self.table.shape[0]
        new = max(2 * old, old + at_least)
        table = torch.zeros((new, self.cols), dtype=I64, device=self.device)
        table[:old] = self.table
        self.table = table
        spare = torch.empty(new, dtype=I64, device=self.device)
        spare[:self.num_spare] = self.spare[:self.num_spare]
        spare[self.num_spare:self.num_spare + new - old] = torch.arange(
            new - 1, old - 1, -1, dtype=I64, device=self.device)
        self.spare = spare
        self.num_spare += new - old

    def _ensure_cols(self, ends: Tensor) -> None:
        if self.cols == self.max_cols or ends.numel() == 0:
            return
        need = int(ends.max())
        if need <= self.cols:
            return
        cols = min(self.max_cols, max(need, 2 * self.cols))
        table = torch.zeros((self.table.shape[0], cols), dtype=I64, device=self.device)
        table[:, :self.cols] = self.table
        self.table = table
        self.cols = cols

    def write(self, rows: Tensor, starts: Tensor, counts: Tensor, ids: Tensor) -> None:
        """Row rows[i] gets ids, counts[i] of them from column starts[i], run after run."""
        total = ids.numel()
        if total == 0:
            return
        self._ensure_cols(starts + counts)
        run, col = spans(starts, counts, total)
        self.table[rows[run], col] = ids

    def read(self, rows: Tensor, starts: Tensor, counts: Tensor, total: int) -> Tensor:
        """The ids of rows[i] from column starts[i], counts[i] of them, run after run."""
        if total == 0:
            return self.table.new_empty(0)
        run, col = spans(starts, counts, total)
        return self.table[rows[run], col]

    def read_reversed(self, rows: Tensor, counts: Tensor, total: int) -> Tensor:
        """Each row's first counts[i] ids in reverse order (last column first), row after
        row: the order in which released blocks join the free list."""
        if total == 0:
            return self.table.new_empty(0)
        run, col = spans(torch.zeros_like(counts), counts, total)
        return self.table[rows[run], counts[run] - 1 - col]
