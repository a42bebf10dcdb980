"""The reference scheduler: one loop per step, written to be obviously right.

NOTE on the algorithm (after vLLM's v1 scheduler). There is no prefill phase and no
decode phase: each request has N known tokens and C computed ones, and each step
assigns tokens so that C catches up with N. A step goes:

1. reject the new arrivals that can never complete, even alone in an empty cache
   (and those whose prompt fills max_model_len, as vLLM v1's front end does);
2. running pass, in running order while the token budget lasts: give each request
   its next chunk; when its blocks do not fit, preempt a victim (tail of running, or
   the lowest priority) and retry, stopping the pass when the victim is the request;
3. swapped pass, then waiting pass, in policy order, unless this step preempted
   (knob): admit while the token budget, the sequence limit and the blocks (the whole
   sequence, plus the watermark when something runs) allow; the first that does not
   fit stops the pass (head-of-line blocking, as vLLM);
4. computed tokens advance; those that catch up sample a token in `update`.

Config `allocation` says what an admission or a swap-in takes: the blocks of its chunk
(lazy), of all its known tokens (prompt) or of its longest sequence (full); later
chunks take the blocks they fill. Config `watermark_scope` says whether the watermark
holds back an admission or a swap-in only while something runs, or always.

With prefix caching (config prefix_caching), as vLLM v1: the blocks a chunk fills are
cached under their content keys when it is scheduled (so a request admitted later in
the same step may hit them); a waiting request at C = 0 looks up the longest run of
cached blocks holding its first floor((N - 1) / block_size) content keys and starts
from them; its admission needs Db + E free blocks, E being the hit blocks no one holds
(free, evictable), and with the whole-sequence knob blocks for all N tokens less the
hit, plus E. Which cached blocks survive is the allocator's free-list order (vLLM's).
A block's content key is the trace's (`add_block_keys`) or, in a simulation, the one
its request's shared prefix gives it (kvsched.spec.prefix).

Extension points. Each decision above is one public method, and the step is written
in terms of them, so that a subclass changes one decision by overriding one method (the
seeded bugs of kvsched.testing.seeded_bugs plant their faults this way, and nothing
else is meant to be overridden):

- `make_allocator()`: the BlockAllocator (whose `take`, `put`, `free_gpu` and
  `free_cpu` are its own extension points); `make_waiting_queue()`: the WaitingQueue;
- `token_budget()`, `seq_limit()`, `chunk_cap()`: a step's token budget, the most
  running requests, its long-prefill cap on a chunk;
- `reject_arrivals()`: the rejection of `arrived`, each through `reject(r, reason)`,
  for the reason `arrival_rejection(r)` gives; `never_admitted(r)`: why a pass rejects
  a request it reaches (none in vLLM v1's step; V0's knob reject);
- `next_chunk(r, threshold, budget)`: a running or swapped request's next chunk;
- `blocks_needed(computed, new_tokens, held)`: Db, the blocks to add for new tokens;
- `can_grow(need)`: whether a running request's new blocks fit, or it must preempt;
  `grow_need(r, n)`: what a running request's chunk must find free (its Db; V0's knob
  grow_check);
- `admission_blocks(tokens, held)`: the free blocks a swap-in or admission must find;
- `choose_victim()`: the running request to preempt;
- `preempt(victim)`: take it off the GPU, by swap or recompute; `requeue_swapped(victim)`:
  queue a swapped victim at the step's end (in policy order; V0's knob swapped_order);
- `passes(plan)`: a step's passes in their order (step 2 and 3 above), which fill one
  StepPlan; `running_pass(plan)`, `swap_in_pass(plan)`, `waiting_pass(plan)`: the passes
  (`swap_in_chunks()`: whether a swapped partial prefill may come back in a chunk)
  (vLLM V0's step, kvsched.reference.v0.V0Scheduler, overrides `passes` and
  `running_pass` and calls the other two in V0's order);
- `finishes(r, stopped)`: whether a request that just sampled a token finishes.

The state is public for the tests and proofs that build or read one: `live` (every
live request by id), `running`, `swapped` (in policy or swap-out order), `waiting` (a
WaitingQueue), `arrived` (not yet checked for rejection), `victims` (this step's,
queued again at its end), `sampled` (the last step's catch-ups) and `blocks`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from kvsched.reference.allocator import BlockAllocator
from kvsched.reference.requests import LiveRequest, WaitingQueue
from kvsched.spec.blocks import (
    admission_watermark,
    allocation_reserve,
    rejectable,
)
from kvsched.spec.blocks import blocks_needed as spec_blocks_needed
from kvsched.spec.knobs import Knobs, V0Knobs
from kvsched.spec.model import (
    Config,
    Decision,
    Preemption,
    Rejection,
    Request,
    RequestView,
    Status,
)
from kvsched.spec.prefix import KeyBook
from kvsched.spec.step_kinds import SchedulerKind, knob_refusal


@dataclass(slots=True)
class StepPlan:
    """One step's decision as the passes build it, and the token budget they share."""

    budget: int  # tokens left
    threshold: int  # the long-prefill cap of this step (0: none)
    rejected: list[Rejection] = field(default_factory=list)  # by the passes (knob reject)
    preempted: list[Preemption] = field(default_factory=list)
    swapped_in: list[str] = field(default_factory=list)
    scheduled: dict[str, int] = field(default_factory=dict)  # in batch order
    new_blocks: dict[str, list[int]] = field(default_factory=dict)
    prefix_hits: dict[str, list[int]] = field(default_factory=dict)


class ReferenceScheduler:
    """The plain scheduler of docs/spec.md section 8 and kvsched.spec.profiles, with knobs:
    vLLM v1's step (vLLM V0's is kvsched.reference.v0.V0Scheduler). `kind`: the step
    kind it is (kvsched.spec.step_kinds), whose knobs it reads (`rules`) and which
    refuses a knob of another kind set away from its default."""

    kind: SchedulerKind = "v1"

    def __init__(self, config: Config, knobs: Knobs | None = None) -> None:
        problems = config.problems() + (knobs or Knobs()).problems()
        refused = knob_refusal(self.kind, knobs or Knobs())
        if problems or refused is not None:
            raise ValueError(problems[0] if problems else refused)
        self.config = config
        self.knobs = knobs or Knobs()
        self.blocks = self.make_allocator()
        self.live: dict[str, LiveRequest] = {}
        self.running: list[LiveRequest] = []
        self.swapped: list[LiveRequest] = []
        self.waiting = self.make_waiting_queue()
        self.arrived: list[LiveRequest] = []
        self.victims: list[LiveRequest] = []
        self.sampled: list[LiveRequest] = []
        self.next_seq = 0
        self.keys = KeyBook(config.block_size)  # content keys, for prefix caching

    @property
    def rules(self) -> Knobs | V0Knobs:
        """The knobs this step reads: vLLM v1's, the knobs' own fields (V0's step reads
        knobs.v0: kvsched.spec.step_kinds.knobs_read)."""
        return self.knobs

    # -- the interface ----------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.id in self.live:
            raise ValueError(f"request id {request.id!r} is already live")
        r = LiveRequest(request, self.next_seq, Status.WAITING, request.prompt_len)
        self.next_seq += 1
        self.live[request.id] = r
        self.arrived.append(r)
        self.waiting.push(r, front=False)

    def add_block_keys(self, request_id: str, keys: Sequence[str],
                       start: int | None = None) -> None:
        """Content keys of the request's blocks from table index `start` on (by default
        the next ones), as a trace gives them (`block_keys`); they take the place of
        those its prefix would give, and of any given from `start` before."""
        self.keys.add(request_id, keys, start)

    def content_key(self, r: LiveRequest, index: int) -> str:
        """The content key of block `index` of `r`."""
        return self.keys.key(r.request.id, r.request.prefix, index)

    def abort_request(self, request_id: str) -> None:
        self.keys.forget(request_id)
        r = self.live.pop(request_id)
        if r.status == Status.WAITING:
            self.waiting.remove(r)
        elif r.status == Status.RUNNING:
            self.running.remove(r)
        elif r.status == Status.SWAPPED:
            self.dequeue_swapped(r)
        self.blocks.free(request_id)
        r.status = Status.ABORTED

    def free_blocks(self) -> int:
        return self.blocks.free_gpu

    def has_unfinished(self) -> bool:
        return bool(self.live)

    def states(self) -> dict[str, RequestView]:
        return {rid: self._view(rid, r) for rid, r in self.live.items()}

    def state_of(self, request_id: str) -> RequestView | None:
        r = self.live.get(request_id)
        return None if r is None else self._view(request_id, r)

    def _view(self, rid: str, r: LiveRequest) -> RequestView:
        return RequestView(r.status, r.num_tokens, r.num_computed,
                           self.blocks.gpu_blocks(rid), self.blocks.host_blocks(rid),
                           r.num_preemptions)

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
        rejected = self.reject_arrivals()
        plan = StepPlan(self.token_budget(), self.chunk_cap())
        self.passes(plan)
        rejected += plan.rejected
        # Victims queue up only now, so none is admitted again in the step that took it.
        for victim in self.victims:
            if victim.status == Status.SWAPPED:
                self.requeue_swapped(victim)
            else:
                self.waiting.push(victim, front=True)
        self.victims = []

        # Computed tokens advance; those that catch up sample in update().
        self.sampled = []
        for rid, n in plan.scheduled.items():
            r = self.live[rid]
            r.num_computed += n
            if r.num_computed == r.num_tokens:
                self.sampled.append(r)
                r.decoding = True
        return Decision(tuple(rejected), tuple(plan.preempted), tuple(plan.swapped_in),
                        tuple(plan.scheduled.items()),
                        tuple(r.request.id for r in self.sampled),
                        {rid: tuple(ids) for rid, ids in plan.new_blocks.items() if ids},
                        {rid: tuple(ids) for rid, ids in plan.prefix_hits.items()})

    def update(self, stopped: Collection[str]) -> tuple[str, ...]:
        finished = []
        for r in self.sampled:
            r.num_tokens += 1
            if self.finishes(r, r.request.id in stopped):
                self.running.remove(r)
                self.blocks.free(r.request.id)
                self.keys.forget(r.request.id)
                r.status = Status.FINISHED
                del self.live[r.request.id]
                finished.append(r.request.id)
        self.sampled = []
        return tuple(finished)

    # -- extension points: budgets, rejection, chunks, blocks -------------------------

    def make_allocator(self) -> BlockAllocator:
        """The block allocator, made once for `self.config`."""
        return BlockAllocator(self.config.num_gpu_blocks, self.config.num_cpu_blocks,
                              self.config.first_block_id, self.config.prefix_caching,
                              self.rules.free_order)

    def make_waiting_queue(self) -> WaitingQueue:
        """The waiting queue, made once: in policy order."""
        return WaitingQueue(self.config.policy == "priority")

    def cache_filled(self, r: LiveRequest, tokens: int) -> None:
        """With prefix caching, cache the blocks of `r` that `tokens` scheduled tokens fill."""
        if self.config.prefix_caching:
            self.blocks.cache(r.request.id, tokens // self.config.block_size,
                              lambda i: self.content_key(r, i))

    def token_budget(self) -> int:
        """The tokens one step may schedule."""
        return self.config.max_num_batched_tokens

    def seq_limit(self) -> int:
        """The most requests that may run at once."""
        return self.config.max_num_seqs

    def chunk_cap(self) -> int:
        """This step's long-prefill cap on a chunk (0: none): with chunked prefill the
        config's threshold, lifted for a lone request (knob lift_threshold_when_alone)."""
        cfg = self.config
        if not cfg.chunked_prefill or (self.knobs.lift_threshold_when_alone
                                       and len(self.live) <= 1):
            return 0
        return cfg.long_prefill_token_threshold

    def reject_arrivals(self) -> list[Rejection]:
        """Reject the arrivals that can never complete, even alone in an empty cache
        (docs/spec.md section 2, rule 2); every arrival is checked once, in its first step,
        for the reason `arrival_rejection` gives."""
        out = []
        for r in self.arrived:
            if r.status != Status.WAITING:
                continue  # aborted before its first step
            reason = self.arrival_rejection(r)
            if reason is not None:
                out.append(self.reject(r, reason))
        self.arrived = []
        return out

    def arrival_rejection(self, r: LiveRequest) -> str | None:
        """Why arrival `r` is rejected in its first step, or None: it can never complete,
        even alone in an empty cache, or its prompt fills max_model_len (it may be served
        one token or rejected: rejected here, as vLLM v1's front end does)."""
        return rejectable(self.config, r.request.prompt_len, r.request.max_tokens)

    def never_admitted(self, r: LiveRequest, swap_in: bool = False) -> str | None:
        """Why a pass must reject `r`, which it reached, or None: vLLM v1's step rejects
        only on arrival (V0's rejects here under its knob reject "admission")."""
        return None

    def reject(self, r: LiveRequest, reason: str) -> Rejection:
        """End waiting or swapped `r` as rejected, releasing what it holds."""
        if r.status == Status.SWAPPED:
            self.dequeue_swapped(r)
        else:
            self.waiting.remove(r)
        self.blocks.free(r.request.id)
        self.keys.forget(r.request.id)
        r.status = Status.REJECTED
        del self.live[r.request.id]
        return Rejection(r.request.id, reason)

    def dequeue_swapped(self, r: LiveRequest) -> None:
        """Take swapped `r` out of its queue: `swapped`, or the waiting queue where vLLM V0
        puts a victim of its priority preemption (kvsched.reference.v0)."""
        if any(s is r for s in self.swapped):
            self.swapped.remove(r)
        else:
            self.waiting.remove(r)

    def next_chunk(self, r: LiveRequest, threshold: int, budget: int) -> int:
        """The next chunk: all uncomputed tokens, capped by the threshold and the budget.

        pre: threshold >= 0 and budget >= 1
        post: 0 <= __return__ <= budget
        post: __return__ <= r.num_tokens - r.num_computed
        post: threshold == 0 or __return__ <= threshold
        """
        n = r.num_tokens - r.num_computed
        if 0 < threshold < n:
            n = threshold
        return min(n, budget)

    def blocks_needed(self, computed: int, new_tokens: int, held: int,
                      reserve: int = 0) -> int:
        """Db: the blocks to add so that `held` blocks cover `computed + new_tokens`, and
        the `reserve` tokens of an admission or a swap-in (the spec's allocation_reserve)."""
        return spec_blocks_needed(computed, new_tokens, held, self.config.block_size,
                                  reserve)

    def can_grow(self, need: int) -> bool:
        """Whether a running request's `need` new blocks fit now (else it preempts)."""
        return need <= self.blocks.free_gpu

    def grow_need(self, r: LiveRequest, n: int) -> int:
        """The free blocks running `r`'s chunk of `n` tokens must find to go on: its Db
        (V0's step may ask more: its knob grow_check).

        post: __return__ >= self.blocks_needed(r.num_computed, n, self.blocks.gpu_blocks(r.request.id))
        """  # noqa: E501
        return self.blocks_needed(r.num_computed, n, self.blocks.gpu_blocks(r.request.id))

    def admission_blocks(self, tokens: int, held: int) -> int:
        """Blocks a swap-in or admission must find free so that `held` blocks cover
        `tokens`, with the watermark (when something is running, or always: the config's
        watermark_scope).

        pre: tokens >= 0 and held >= 0
        post: __return__ >= spec_blocks_needed(0, tokens, held, self.config.block_size)
        post: __return__ >= 0
        """
        return (spec_blocks_needed(0, tokens, held, self.config.block_size)
                + admission_watermark(self.config, len(self.running)))

    # -- extension points: preemption -------------------------------------------------

    def choose_victim(self) -> LiveRequest:
        """The running request to preempt: the tail of running, or the least urgent."""
        rule = self.knobs.victim
        if rule == "policy":
            rule = "lowest_priority" if self.waiting.priority else "tail"
        if rule == "tail":
            return self.running[-1]
        return max(self.running, key=lambda r: r.key)

    def preempt(self, victim: LiveRequest) -> Preemption:
        """Take a victim, already out of `running`, off the GPU: swap when the mode (or
        auto's cost model) says so and the host has room, otherwise recompute. It joins
        `victims`, queued again at the end of the step."""
        rid = victim.request.id
        held = self.blocks.gpu_blocks(rid)
        mode = self.config.preemption
        if mode == "auto":
            swap = self.rules.cost.prefers_swap(held, victim.num_computed)
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
            victim.decoding = False
            victim.status = Status.WAITING
        self.victims.append(victim)
        return Preemption(rid, mode)

    def requeue_swapped(self, victim: LiveRequest) -> None:
        """Queue swapped-out `victim` again, at the step's end: `swapped` in policy order
        (`swapped_key`)."""
        self.swapped.append(victim)
        self.swapped.sort(key=self.swapped_key)

    def swapped_key(self, r: LiveRequest) -> tuple[int, ...]:
        """The order `swapped` is kept in (`requeue_swapped`): the policy's."""
        return r.key if self.config.policy == "priority" else (r.seq,)

    # -- extension points: the passes -------------------------------------------------

    def passes(self, plan: StepPlan) -> None:
        """A step's passes: running, then swapped and waiting unless the running pass
        preempted (or with knob admit_after_preempt)."""
        self.running_pass(plan)
        if not plan.preempted or self.knobs.admit_after_preempt:
            self.swap_in_pass(plan)
            self.waiting_pass(plan)

    def running_pass(self, plan: StepPlan) -> None:
        """Give each running request its next chunk, in running order while the budget
        lasts; when its blocks do not fit, preempt victims until they do. When the victim
        is the request itself the pass stops, or with continue_after_self_preemption goes
        on to the next running request."""
        cfg = self.config
        i = 0
        while i < len(self.running) and plan.budget > 0:
            r = self.running[i]
            rid = r.request.id
            n = self.next_chunk(r, plan.threshold, plan.budget)
            # The last position computed stays below max_model_len - 1, so that the token
            # it samples has a position: vLLM v1's cap (vllm/v1/core/sched/scheduler.py,
            # Scheduler.schedule, running requests: "Make sure the input position does not
            # exceed the max model len. This is necessary when using spec decoding."). A
            # live request has N <= max_model_len - 1 (longer prompts are rejected, and a
            # request finishes when N reaches max_model_len), so without speculative
            # decoding the cap never cuts a chunk: it is tight on the last chunk of a
            # request that reaches max_model_len.
            n = min(n, cfg.max_model_len - 1 - r.num_computed)
            if n <= 0:
                i += 1
                continue
            fits = True
            while True:
                if self.can_grow(self.grow_need(r, n)):
                    need = self.blocks_needed(r.num_computed, n, self.blocks.gpu_blocks(rid))
                    plan.new_blocks[rid] = self.blocks.allocate(rid, need)
                    self.cache_filled(r, r.num_computed + n)
                    break
                victim = self.choose_victim()
                vi = self.running.index(victim)
                if victim.request.id in plan.scheduled:
                    # Taken back: its tokens return to the budget (its new blocks go back
                    # to the pool with the rest of its table when it is preempted).
                    plan.budget += plan.scheduled.pop(victim.request.id)
                    del plan.new_blocks[victim.request.id]
                del self.running[vi]
                if vi < i:
                    i -= 1
                plan.preempted.append(self.preempt(victim))
                if victim is r:
                    fits = False
                    break
            if not fits:
                if self.knobs.continue_after_self_preemption:
                    continue  # r left running: i is the next request's index
                break
            plan.scheduled[rid] = n
            plan.budget -= n
            i += 1

    def swap_in_pass(self, plan: StepPlan) -> None:
        """Swap requests back in, in their queue's order (`requeue_swapped`), while they
        fit; the first that does not stops the pass. A partial prefill comes back with a
        chunk of its rest, or (`swap_in_chunks` false) only whole."""
        cfg = self.config
        while self.swapped:
            r = self.swapped[0]
            rid = r.request.id
            reason = self.never_admitted(r, swap_in=True)
            if reason is not None:
                plan.rejected.append(self.reject(r, reason))
                continue
            if plan.budget <= 0 or len(self.running) >= self.seq_limit():
                break
            n = self.next_chunk(r, plan.threshold, plan.budget)
            if not self.swap_in_chunks() and n < r.num_tokens - r.num_computed:
                break
            host = self.blocks.host_blocks(rid)
            # Its host blocks come back, with what its allocation reserves beyond them.
            reserve = allocation_reserve(cfg, r.request, r.num_tokens)
            covered = max(r.num_computed + n, reserve)
            need = host + self.admission_blocks(covered, host)
            if need > self.blocks.free_gpu:
                break
            self.swapped.pop(0)
            ids = self.blocks.swap_in(rid)
            ids += self.blocks.allocate(rid, self.blocks_needed(r.num_computed, n, host,
                                                                reserve))
            self.cache_filled(r, r.num_computed + n)
            r.status = Status.RUNNING
            self.running.append(r)
            plan.swapped_in.append(rid)
            plan.scheduled[rid] = n
            plan.new_blocks[rid] = ids
            plan.budget -= n

    def swap_in_chunks(self) -> bool:
        """Whether a swapped partial prefill may come back with a chunk of its rest: with
        chunked prefill (V0's step asks its knob chunk_swap_in too)."""
        return self.config.chunked_prefill

    def waiting_pass(self, plan: StepPlan) -> None:
        """Admit waiting requests, in policy order, while they fit; the first that does
        not stops the pass (head-of-line blocking). A request that can never be
        admitted (`never_admitted`) is rejected when the pass reaches it, even once the
        budget or the seats have run out. Without chunked prefill a prompt
        above the budget left stops the pass too, or under knob over_budget_prompt
        "skip" is passed over, back at the queue's head when the pass ends (each pushed
        to the front in the order skipped: under fcfs the last skipped comes first)."""
        cfg = self.config
        if plan.budget <= 0:
            return
        skipped: list[LiveRequest] = []
        while True:
            r = self.waiting.head()
            if r is None:
                break
            if r.status == Status.SWAPPED:
                # A victim of vLLM V0's priority preemption in swap mode, which V0 queues
                # here; V0 fails an assertion when its pass reaches it (vllm/core/
                # scheduler.py:1077). The reference goes on: it moves the victim to the
                # front of the swapped queue, where it comes back from, and stops.
                self.waiting.remove(r)
                self.swapped.insert(0, r)
                break
            reason = self.never_admitted(r)
            if reason is not None:
                plan.rejected.append(self.reject(r, reason))
                continue
            if plan.budget <= 0 or len(self.running) >= self.seq_limit():
                break
            rid = r.request.id
            hits = self.prefix_hit(r)
            computed = r.num_computed + len(hits) * cfg.block_size
            taken = self.blocks.evictable(hits)  # E: the free cached blocks it takes
            n = r.num_tokens - computed
            if 0 < plan.threshold < n:
                n = plan.threshold
            if not cfg.chunked_prefill and n > plan.budget:
                if self.rules.over_budget_prompt == "stop":
                    break
                self.waiting.pop()
                skipped.append(r)
                continue
            n = min(n, plan.budget)
            if self.rules.reserve_full_sequence:
                full = min(r.num_tokens, cfg.max_model_len)
                if self.admission_blocks(full, len(hits)) + taken > self.blocks.free_gpu:
                    break
            # The blocks it takes: its chunk's, or more when its allocation reserves more.
            reserve = allocation_reserve(cfg, r.request, r.num_tokens)
            covered = max(computed + n, reserve)
            if self.admission_blocks(covered, len(hits)) + taken > self.blocks.free_gpu:
                break
            self.waiting.pop()
            if hits:
                self.blocks.hit(rid, hits)
                plan.prefix_hits[rid] = hits
                r.num_computed = computed
            plan.new_blocks[rid] = self.blocks.allocate(
                rid, self.blocks_needed(computed, n, len(hits), reserve))
            self.cache_filled(r, computed + n)
            r.status = Status.RUNNING
            self.running.append(r)
            plan.scheduled[rid] = n
            plan.budget -= n
        # (The loop leaves by break only: the skipped go back whatever ended it.)
        for r in skipped:
            self.waiting.push(r, front=True)

    def prefix_hit(self, r: LiveRequest) -> list[int]:
        """The cached blocks a waiting request would start from: with prefix caching and
        C = 0, the longest run holding its first floor((N - 1) / block_size) contents.

        pre: r.num_tokens >= 1
        post: len(__return__) * self.config.block_size <= r.num_tokens - 1
        """
        if not self.config.prefix_caching or r.num_computed > 0:
            return []
        most = (r.num_tokens - 1) // self.config.block_size
        return self.blocks.lookup([self.content_key(r, i) for i in range(most)])

    # -- extension points: finishing --------------------------------------------------

    def finishes(self, r: LiveRequest, stopped: bool) -> bool:
        """Whether `r`, which just sampled a token, finishes: it stopped (end of
        sequence), reached max_tokens outputs or max_model_len tokens."""
        outputs = r.num_tokens - r.request.prompt_len
        return (stopped or outputs >= r.request.max_tokens
                or r.num_tokens >= self.config.max_model_len)

