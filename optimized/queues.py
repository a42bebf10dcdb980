"""Waiting queues whose head costs the same whatever their length.

Entries are (slot, seq, arrival step) triples in tensors with free room at both ends,
so pushes at either end and reading the first k entries cost O(k) amortized. An entry
whose request left the queue in the middle (aborted or rejected) stays where it is
and is recognised as stale by its sequence number: `valid` compares it with the
slot's current request, since slots are reused.

- `SlotQueue` is one such deque; fcfs uses it as vLLM's waiting deque (arrivals at the
  back, preempted requests at the front).
- `PriorityQueue` keeps one SlotQueue per priority value, each sorted by (arrival
  step, seq), plus the sorted list of the priorities present: the head of the whole
  queue is the head of the most urgent non-empty bucket. Arrivals in arrival order go
  to the back of their bucket; a preempted request goes back to its place, found by
  binary search, shifting the shorter side of the bucket.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

I64 = torch.int64


@dataclass
class Peek:
    """The first valid entries of a queue: their slots, and for each the number of raw
    entries (valid or stale) up to and including it, per bucket."""

    slots: Tensor
    # (bucket key, raw counts through each valid entry taken from that bucket)
    parts: list[tuple[int, list[int]]]


class SlotQueue:
    """A deque of (slot, seq, arrival) entries kept contiguous in tensors."""

    def __init__(self, device: torch.device, capacity: int = 64) -> None:
        self.device = device
        self.slot = torch.empty(capacity, dtype=I64, device=device)
        self.seq = torch.empty(capacity, dtype=I64, device=device)
        self.arrival = torch.empty(capacity, dtype=I64, device=device)
        self.head = capacity // 2
        self.size = 0
        self.last_key: tuple[int, int] | None = None  # (arrival, seq) of the last entry

    def __len__(self) -> int:
        return self.size

    def _recentre(self, front: int, back: int) -> None:
        """Make room for `front` more entries before the head and `back` after the end."""
        cap = self.slot.numel()
        if self.head >= front and self.head + self.size + back <= cap:
            return
        new_cap = max(64, 2 * (self.size + front + back))
        head = front + (new_cap - self.size - front - back) // 2
        for name in ("slot", "seq", "arrival"):
            old = getattr(self, name)
            new = torch.empty(new_cap, dtype=I64, device=self.device)
            new[head:head + self.size] = old[self.head:self.head + self.size]
            setattr(self, name, new)
        self.head = head

    def push_back(self, slot: Tensor, seq: Tensor, arrival: Tensor,
                  last_key: tuple[int, int] | None = None) -> None:
        m = slot.numel()
        if m == 0:
            return
        self._recentre(0, m)
        end = self.head + self.size
        self.slot[end:end + m] = slot
        self.seq[end:end + m] = seq
        self.arrival[end:end + m] = arrival
        self.size += m
        self.last_key = last_key

    def push_front(self, slot: Tensor, seq: Tensor, arrival: Tensor) -> None:
        """Put the entries before the head, keeping their order."""
        m = slot.numel()
        if m == 0:
            return
        self._recentre(m, 0)
        self.head -= m
        self.slot[self.head:self.head + m] = slot
        self.seq[self.head:self.head + m] = seq
        self.arrival[self.head:self.head + m] = arrival
        self.size += m

    def insert_sorted(self, slot: int, seq: int, arrival: int) -> None:
        """Insert one entry at its place in (arrival, seq) order (the queue is sorted)."""
        h, n = self.head, self.size
        arr = self.arrival[h:h + n]
        lo = int(torch.searchsorted(arr, arrival, right=False))
        hi = int(torch.searchsorted(arr, arrival, right=True))
        pos = lo + int(torch.searchsorted(self.seq[h + lo:h + hi], seq))
        if pos == n:
            self._recentre(0, 1)
            at = self.head + n
            self.last_key = (arrival, seq)
        elif pos < n // 2:
            self._recentre(1, 0)
            h = self.head
            if pos:
                for t in (self.slot, self.seq, self.arrival):
                    t[h - 1:h - 1 + pos] = t[h:h + pos].clone()
            self.head -= 1
            at = self.head + pos
        else:
            self._recentre(0, 1)
            h = self.head
            for t in (self.slot, self.seq, self.arrival):
                t[h + pos + 1:h + n + 1] = t[h + pos:h + n].clone()
            at = h + pos
        self.slot[at] = slot
        self.seq[at] = seq
        self.arrival[at] = arrival
        self.size += 1

    def first_valid(self, k: int, status: Tensor, seqs: Tensor, waiting: int
                    ) -> tuple[Tensor, list[int]]:
        """Up to k valid entries from the head: their slots, and the raw count through
        each. Looks at O(k + stale entries) entries."""
        h, n = self.head, self.size
        w = min(k, n)
        while True:
            slots = self.slot[h:h + w]
            ok = (status[slots] == waiting) & (seqs[slots] == self.seq[h:h + w])
            count = int(ok.sum())
            if count >= k or w == n:
                break
            w = min(n, 2 * w + 16)
        if count == w:
            take = min(k, w)
            return slots[:take].clone(), list(range(1, take + 1))
        where = torch.nonzero(ok).flatten()[:k]
        return slots[where], [int(i) + 1 for i in where.tolist()]

    def pop(self, raw: int) -> None:
        """Drop the first `raw` entries."""
        self.head += raw
        self.size -= raw
        if self.size == 0:
            self.last_key = None

    def entries(self) -> list[tuple[int, int]]:
        """(slot, seq) of every entry, stale ones too (for tests)."""
        h, n = self.head, self.size
        return list(zip(self.slot[h:h + n].tolist(), self.seq[h:h + n].tolist(), strict=True))


class FcfsQueue:
    """vLLM's fcfs waiting deque."""

    def __init__(self, device: torch.device) -> None:
        self.queue = SlotQueue(device)

    def push_arrivals(self, slot: Tensor, seq: Tensor, priority: list[int],
                      arrival: Tensor, arrival_list: list[int], seq_list: list[int]) -> None:
        self.queue.push_back(slot, seq, arrival)

    def push_victims(self, slot: Tensor, seq: Tensor, priority: list[int],
                     arrival: Tensor) -> None:
        """Each victim goes to the front in turn, so the last one ends up first."""
        self.queue.push_front(slot.flip(0), seq.flip(0), arrival.flip(0))

    def peek(self, k: int, status: Tensor, seqs: Tensor, waiting: int) -> Peek:
        slots, raw = self.queue.first_valid(k, status, seqs, waiting)
        return Peek(slots, [(0, raw)])

    def pop(self, peek: Peek, admitted: int) -> None:
        if admitted:
            self.queue.pop(peek.parts[0][1][admitted - 1])

    def __len__(self) -> int:
        return len(self.queue)


class PriorityQueue:
    """Buckets by priority value, each sorted by (arrival step, seq)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.buckets: dict[int, SlotQueue] = {}
        self.order: list[int] = []  # the priorities present, ascending

    def _bucket(self, priority: int) -> SlotQueue:
        q = self.buckets.get(priority)
        if q is None:
            q = self.buckets[priority] = SlotQueue(self.device)
            bisect.insort(self.order, priority)
        return q

    def push_arrivals(self, slot: Tensor, seq: Tensor, priority: list[int],
                      arrival: Tensor, arrival_list: list[int], seq_list: list[int]) -> None:
        groups: dict[int, list[int]] = {}
        for i, p in enumerate(priority):
            groups.setdefault(p, []).append(i)
        for p, members in groups.items():
            q = self._bucket(p)
            keys = [(arrival_list[i], seq_list[i]) for i in members]
            in_order = all(a < b for a, b in itertools.pairwise(keys))
            if in_order and (q.last_key is None or keys[0] > q.last_key):
                idx = torch.tensor(members, dtype=I64, device=self.device)
                q.push_back(slot[idx], seq[idx], arrival[idx], keys[-1])
                continue
            for i in members:  # out of arrival order: each finds its place
                q.insert_sorted(int(slot[i]), seq_list[i], arrival_list[i])

    def push_victims(self, slot: Tensor, seq: Tensor, priority: list[int],
                     arrival: Tensor) -> None:
        for s, q, p, a in zip(slot.tolist(), seq.tolist(), priority, arrival.tolist(),
                              strict=True):
            self._bucket(p).insert_sorted(s, q, a)

    def peek(self, k: int, status: Tensor, seqs: Tensor, waiting: int) -> Peek:
        got: list[Tensor] = []
        parts: list[tuple[int, list[int]]] = []
        looked_at: list[int] = []
        left = k
        for p in self.order:
            if left == 0:
                break
            looked_at.append(p)
            slots, raw = self.buckets[p].first_valid(left, status, seqs, waiting)
            if not raw:
                # Only stale entries: drop them now so the next peek skips this bucket.
                self.buckets[p].pop(len(self.buckets[p]))
                continue
            got.append(slots)
            parts.append((p, raw))
            left -= len(raw)
        self._drop_empty(looked_at)
        if not got:
            return Peek(torch.empty(0, dtype=I64, device=self.device), [])
        return Peek(got[0] if len(got) == 1 else torch.cat(got), parts)

    def pop(self, peek: Peek, admitted: int) -> None:
        for p, raw in peek.parts:
            if admitted <= 0:
                break
            take = min(admitted, len(raw))
            self.buckets[p].pop(raw[take - 1])
            admitted -= take
        self._drop_empty([p for p, _ in peek.parts])

    def _drop_empty(self, looked_at: list[int]) -> None:
        for p in looked_at:
            if p in self.buckets and len(self.buckets[p]) == 0:
                del self.buckets[p]
                self.order.remove(p)

    def __len__(self) -> int:
        return sum(len(q) for q in self.buckets.values())
