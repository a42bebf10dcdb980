"""A live request's bookkeeping inside the reference scheduler, and the waiting queue."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from kvsched.spec.model import Request, Status


@dataclass(slots=True)
class LiveRequest:
    """A request between its arrival and its end: N = num_tokens known, C = num_computed
    (its blocks are the allocator's)."""

    request: Request
    seq: int  # arrival order, the tie-breaker after (priority, arrival step)
    status: Status = Status.WAITING
    num_tokens: int = 0
    num_computed: int = 0
    num_preemptions: int = 0
    # It has sampled since its admission (new, or again after recompute): vLLM V0's
    # decode stage, whose one new token its blocks do not hold yet.
    decoding: bool = False

    @property
    def key(self) -> tuple[int, int, int]:
        """Priority order: lower is more urgent (vLLM's (priority, arrival_time))."""
        return (self.request.priority, self.request.arrival_step, self.seq)


class WaitingQueue:
    """The waiting requests in policy order: fcfs keeps arrival order and puts preempted
    requests at the front (as vLLM's prepend); priority orders by `LiveRequest.key`.
    A fcfs queue may be put in priority order once, by `sort` (vLLM V0 sorts its queue
    so, only in some steps)."""

    def __init__(self, priority: bool) -> None:
        self.priority = priority
        self._fcfs: deque[LiveRequest] = deque()
        self._heap: list[tuple[tuple[int, int, int], LiveRequest]] = []

    def push(self, r: LiveRequest, front: bool) -> None:
        """Queue `r`; `front` (a preempted request) matters under fcfs only."""
        if self.priority:
            heapq.heappush(self._heap, (r.key, r))
        elif front:
            self._fcfs.appendleft(r)
        else:
            self._fcfs.append(r)

    def head(self) -> LiveRequest | None:
        """The request the waiting pass considers next, or None."""
        if self.priority:
            return self._heap[0][1] if self._heap else None
        return self._fcfs[0] if self._fcfs else None

    def pop(self) -> None:
        """Drop the head (it was admitted)."""
        if self.priority:
            heapq.heappop(self._heap)
        else:
            self._fcfs.popleft()

    def sort(self) -> None:
        """Put a fcfs queue in `LiveRequest.key` order (arrivals and preempted requests
        join it as before)."""
        self._fcfs = deque(sorted(self._fcfs, key=lambda r: r.key))

    def remove(self, r: LiveRequest) -> None:
        """Take `r` out of the queue wherever it is (aborted, rejected)."""
        if self.priority:
            self._heap = [entry for entry in self._heap if entry[1] is not r]
            heapq.heapify(self._heap)
        else:
            self._fcfs.remove(r)

    def __iter__(self) -> Iterator[LiveRequest]:
        """The waiting requests in the order the waiting pass takes them."""
        if self.priority:
            return iter([r for _, r in sorted(self._heap, key=lambda entry: entry[0])])
        return iter(list(self._fcfs))
