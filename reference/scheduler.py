"""The reference scheduler: one loop per step, written to be obviously right.

NOTE on the algorithm (after vLLM's v1 scheduler). There is no prefill phase and no
decode phase: each request has N known tokens and C computed ones, and each step
assigns tokens so that C catches up with N. A step goes:

1. reject the new arrivals that can never complete, even alone in an empty cache;
2. running pass, in running order while the token budget lasts: give each request
   its next chunk; when its blocks do not fit, preempt a victim (tail of running, or
   the lowest priority) and retry, stopping the pass when the victim is the request;
3. swapped pass, then waiting pass, in policy order, unless this step preempted
   (knob): admit while the token budget, the sequence limit and the blocks (the whole
   sequence, plus the watermark when something runs) allow; the first that does not
   fit stops the pass (head-of-line blocking, as vLLM);
4. computed tokens advance; those that catch up sample a token in `update`.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass

from kvsched.reference.allocator import BlockAllocator
from kvsched.spec.blocks import blocks_for, blocks_needed, never_completes
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import (
    Config,
    Decision,
    Preemption,
    Rejection,
    Request,
    RequestView,
    Status,
)
from kvsched.spec.profiles import Profile, get_profile


@dataclass(slots=True)
class Entry:
    """A live request inside the scheduler."""

    request: Request
    seq: int  # arrival order, the tie-breaker after (priority, arrival step)
    status: Status = Status.WAITING
    num_tokens: int = 0
    num_computed: int = 0
    num_preemptions: int = 0

    @property
    def key(self) -> tuple[int, int, int]:
        """Priority order: lower is more urgent (vLLM's (priority, arrival_time))."""
        return (self.request.priority, self.request.arrival_step, self.seq)


class ReferenceScheduler:
    """The plain scheduler of design.md section 4, with knobs."""

    def __init__(self, config: Config, knobs: Knobs | None = None) -> None:
        problems = config.problems() + (knobs or Knobs()).problems()
        if problems:
            raise ValueError(problems[0])
        self.config = config
        self.knobs = knobs or Knobs()
        self.blocks = BlockAllocator(config.num_gpu_blocks, config.num_cpu_blocks)
        self.entries: dict[str, Entry] = {}
        self.running: list[Entry] = []
        self.swapped: list[Entry] = []  # kept in policy order
        self._fcfs: deque[Entry] = deque()  # waiting, fcfs: preempted go to the front
        self._heap: list[tuple[tuple[int, int, int], Entry]] = []  # waiting, priority
        self._arrived: list[Entry] = []  # not yet checked for rejection
        self._seq = 0
        self._sampled: list[Entry] = []
        self._victims: list[Entry] = []  # this step's, queued again at its end

    # -- queues -----------------------------------------------------------------------

    @property
    def _priority(self) -> bool:
        return self.config.policy == "priority"

    def _waiting_push(self, e: Entry, front: bool) -> None:
        if self._priority:
            heapq.heappush(self._heap, (e.key, e))
        elif front:
            self._fcfs.appendleft(e)
        else:
            self._fcfs.append(e)

    def _waiting_head(self) -> Entry | None:
        if self._priority:
            while self._heap and self._heap[0][1].status != Status.WAITING:
                heapq.heappop(self._heap)  # lazily drop aborted and rejected entries
            return self._heap[0][1] if self._heap else None
        return self._fcfs[0] if self._fcfs else None

    def _waiting_pop(self) -> None:
        if self._priority:
            heapq.heappop(self._heap)
        else:
            self._fcfs.popleft()

    def _waiting_remove(self, e: Entry) -> None:
        if not self._priority:
            self._fcfs.remove(e)  # the heap drops it lazily by status

    def num_waiting(self) -> int:
        return sum(1 for e in self.entries.values() if e.status == Status.WAITING)

    # -- the interface ----------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.id in self.entries:
            raise ValueError(f"request id {request.id!r} is already live")
        e = Entry(request, self._seq, Status.WAITING, request.prompt_len)
        self._seq += 1
        self.entries[request.id] = e
        self._arrived.append(e)
        self._waiting_push(e, front=False)

    def abort_request(self, request_id: str) -> None:
        e = self.entries.pop(request_id)
        if e.status == Status.WAITING:
            self._waiting_remove(e)
        elif e.status == Status.RUNNING:
            self.running.remove(e)
        elif e.status == Status.SWAPPED:
            self.swapped.remove(e)
        self.blocks.free(request_id)
        e.status = Status.ABORTED

    def free_blocks(self) -> int:
        return self.blocks.free_gpu

    def has_unfinished(self) -> bool:
        return bool(self.entries)

    def states(self) -> dict[str, RequestView]:
        return {rid: RequestView(e.status, e.num_tokens, e.num_computed,
                                 self.blocks.gpu_blocks(rid), self.blocks.host_blocks(rid),
                                 e.num_preemptions)
                for rid, e in self.entries.items()}

    # -- block tables (kvsched.spec.interface.BlockTables) ------------------------------

    def block_table(self, request_id: str) -> tuple[int, ...]:
        return self.blocks.block_table(request_id)

    def host_table(self, request_id: str) -> tuple[int, ...]:
        return self.blocks.host_table(request_id)

    def free_gpu_ids(self) -> tuple[int, ...]:
        return self.blocks.free_gpu_ids()

    def free_host_ids(self) -> tuple[int, ...]:
        return self.blocks.free_host_ids()

    # -- one step ---------------------------------------------------------------------

    def schedule(self) -> Decision:
        cfg = self.config
        rejected = self._reject_arrivals()
        live = len(self.entries)
        threshold = cfg.long_prefill_token_threshold if cfg.chunked_prefill else 0
        if self.knobs.lift_threshold_when_alone and live <= 1:
            threshold = 0
        budget = cfg.max_num_batched_tokens
        scheduled: dict[str, int] = {}
        new_blocks: dict[str, list[int]] = {}
        preempted: list[Preemption] = []

        # Running pass.
        i = 0
        while i < len(self.running) and budget > 0:
            e = self.running[i]
            n = self._chunk(e, threshold, budget)
            n = min(n, cfg.max_model_len - 1 - e.num_computed)
            if n <= 0:
                i += 1
                continue
            fits = True
            while True:
                need = blocks_needed(e.num_computed, n, self.blocks.gpu_blocks(e.request.id),
                                     cfg.block_size)
                if need <= self.blocks.free_gpu:
                    new_blocks[e.request.id] = self.blocks.allocate(e.request.id, need)
                    break
                victim = self._victim()
                vi = self.running.index(victim)
                if victim.request.id in scheduled:
                    # Taken back: its tokens return to the budget, its new blocks to the pool.
                    budget += scheduled.pop(victim.request.id)
                    self.blocks.release_last(victim.request.id,
                                             len(new_blocks.pop(victim.request.id)))
                del self.running[vi]
                if vi < i:
                    i -= 1
                preempted.append(self._preempt(victim))
                if victim is e:
                    fits = False
                    break
            if not fits:
                break
            scheduled[e.request.id] = n
            budget -= n
            i += 1

        swapped_in: list[str] = []
        if not preempted or self.knobs.admit_after_preempt:
            budget = self._swap_in_pass(budget, threshold, scheduled, new_blocks, swapped_in)
            self._waiting_pass(budget, threshold, scheduled, new_blocks)
        # Victims queue up only now, so none is admitted again in the step that took it.
        for victim in self._victims:
            if victim.status == Status.SWAPPED:
                self.swapped.append(victim)
                self.swapped.sort(key=self._swapped_order)
            else:
                self._waiting_push(victim, front=True)
        self._victims = []

        # Computed tokens advance; those that catch up sample in update().
        self._sampled = []
        for rid, n in scheduled.items():
            e = self.entries[rid]
            e.num_computed += n
            if e.num_computed == e.num_tokens:
                self._sampled.append(e)
        return Decision(tuple(rejected), tuple(preempted), tuple(swapped_in),
                        tuple(scheduled.items()), tuple(e.request.id for e in self._sampled),
                        {rid: tuple(ids) for rid, ids in new_blocks.items() if ids})

    def _reject_arrivals(self) -> list[Rejection]:
        out = []
        for e in self._arrived:
            if e.status != Status.WAITING:
                continue  # aborted before its first step
            reason = never_completes(self.config, e.request.prompt_len, e.request.max_tokens)
            if reason is not None:
                self._waiting_remove(e)
                e.status = Status.REJECTED
                del self.entries[e.request.id]
                out.append(Rejection(e.request.id, reason))
        self._arrived = []
        return out

    def _chunk(self, e: Entry, threshold: int, budget: int) -> int:
        """The next chunk: all uncomputed tokens, capped by the threshold and the budget.

        pre: threshold >= 0 and budget >= 1
        post: 0 <= __return__ <= budget
        post: __return__ <= e.num_tokens - e.num_computed
        post: threshold == 0 or __return__ <= threshold
        """
        n = e.num_tokens - e.num_computed
        if 0 < threshold < n:
            n = threshold
        return min(n, budget)

    def _victim(self) -> Entry:
        rule = self.knobs.victim
        if rule == "policy":
            rule = "lowest_priority" if self._priority else "tail"
        if rule == "tail":
            return self.running[-1]
        return max(self.running, key=lambda e: e.key)

    def _preempt(self, victim: Entry) -> Preemption:
        """Take a running victim off the GPU: swap when the mode (or auto's cost model)
        says so and the host has room, otherwise recompute."""
        rid = victim.request.id
        held = self.blocks.gpu_blocks(rid)
        mode = self.config.preemption
        if mode == "auto":
            swap = self.knobs.cost.prefers_swap(held, victim.num_computed)
            mode = "swap" if swap else "recompute"
        if mode == "swap" and held > self.blocks.free_cpu:
            mode = "recompute"  # no room on the host
        victim.num_preemptions += 1
        if mode == "swap":
            self.blocks.swap_out(rid)
            victim.status = Status.SWAPPED
        else:
            self.blocks.free(rid)
            victim.num_computed = 0
            victim.status = Status.WAITING
        self._victims.append(victim)
        return Preemption(rid, mode)

    def _swapped_order(self, e: Entry) -> tuple[int, ...]:
        return e.key if self._priority else (e.seq,)

    def _admission_blocks(self, tokens: int, held: int) -> int:
        """Blocks an admission must find free for `tokens`, with the watermark when
        something is running.

        pre: tokens >= 0 and held >= 0
        post: __return__ >= blocks_for(tokens, self.config.block_size) - held
        post: __return__ >= 0
        """
        watermark = self.config.watermark_blocks if self.running else 0
        return max(0, blocks_for(tokens, self.config.block_size) - held) + watermark

    def _swap_in_pass(self, budget: int, threshold: int, scheduled: dict[str, int],
                      new_blocks: dict[str, list[int]], swapped_in: list[str]) -> int:
        cfg = self.config
        while self.swapped and budget > 0 and len(self.running) < cfg.max_num_seqs:
            e = self.swapped[0]
            rid = e.request.id
            n = self._chunk(e, threshold, budget)
            if not cfg.chunked_prefill and n < e.num_tokens - e.num_computed:
                break
            host = self.blocks.host_blocks(rid)
            need = host + self._admission_blocks(e.num_computed + n, host)
            if need > self.blocks.free_gpu:
                break
            self.swapped.pop(0)
            ids = self.blocks.swap_in(rid)
            ids += self.blocks.allocate(rid, blocks_needed(e.num_computed, n, host,
                                                           cfg.block_size))
            e.status = Status.RUNNING
            self.running.append(e)
            swapped_in.append(rid)
            scheduled[rid] = n
            new_blocks[rid] = ids
            budget -= n
        return budget

    def _waiting_pass(self, budget: int, threshold: int, scheduled: dict[str, int],
                      new_blocks: dict[str, list[int]]) -> None:
        cfg = self.config
        while budget > 0 and len(self.running) < cfg.max_num_seqs:
            e = self._waiting_head()
            if e is None:
                break
            rid = e.request.id
            n = e.num_tokens - e.num_computed
            if 0 < threshold < n:
                n = threshold
            if not cfg.chunked_prefill and n > budget:
                break
            n = min(n, budget)
            if self.knobs.reserve_full_sequence:
                full = min(e.num_tokens, cfg.max_model_len)
                if self._admission_blocks(full, 0) > self.blocks.free_gpu:
                    break
            if self._admission_blocks(e.num_computed + n, 0) > self.blocks.free_gpu:
                break
            self._waiting_pop()
            new_blocks[rid] = self.blocks.allocate(
                rid, blocks_needed(e.num_computed, n, 0, cfg.block_size))
            e.status = Status.RUNNING
            self.running.append(e)
            scheduled[rid] = n
            budget -= n

    def update(self, stopped: Collection[str]) -> tuple[str, ...]:
        cfg = self.config
        finished = []
        for e in self._sampled:
            e.num_tokens += 1
            outputs = e.num_tokens - e.request.prompt_len
            if (e.request.id in stopped or outputs >= e.request.max_tokens
                    or e.num_tokens >= cfg.max_model_len):
                self.running.remove(e)
                self.blocks.free(e.request.id)
                e.status = Status.FINISHED
                del self.entries[e.request.id]
                finished.append(e.request.id)
        self._sampled = []
        return tuple(finished)


def reference_scheduler(profile: Profile | str, config: Config) -> ReferenceScheduler:
    """The reference with `profile`'s knobs (a Profile or its name) on `config` as given:
    configure the config with `profile.configure` first for the profile's defaults."""
    chosen = get_profile(profile) if isinstance(profile, str) else profile
    return ReferenceScheduler(config, chosen.knobs)
