"""Seeded bugs: the reference scheduler with exactly one realistic engine fault planted.

Each bug is a small subclass of the reference scheduler (or of its block allocator)
that overrides one of its documented extension points (see kvsched.reference.scheduler
and kvsched.reference.allocator) with the least code that carries the fault, as an
engine author could have written it, or sets a knob. `SEEDED_BUGS` names each one with a
small, tight config and workload that expose it within a few dozen steps, and the
invariant id the checker must report: a MUST or SHOULD id from the spec's checker, or
"profile" for a fault that is legal under the spec but differs from the profile it
claims to follow (the PROFILE check replays that profile on the trace). The correct
reference, run on the same config and workload, draws no violation at all.
`kvsched diff`, `kvsched fuzz` and the model checker (proofs/seeded.py) reuse them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, replace
from typing import Any

from kvsched.reference import reference_scheduler
from kvsched.reference.allocator import BlockAllocator, Pool
from kvsched.reference.requests import LiveRequest, WaitingQueue
from kvsched.reference.scheduler import ReferenceScheduler, StepPlan
from kvsched.reference.sglang import SGLangRequest, SGLangScheduler
from kvsched.simulate import run
from kvsched.spec.blocks import blocks_for
from kvsched.spec.interface import Scheduler
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import (
    MAX_COUNT,
    Config,
    Decision,
    Preemption,
    Rejection,
    Status,
    StepRecord,
)
from kvsched.spec.profiles import get_profile
from kvsched.spec.should import Stalled
from kvsched.spec.violation import MUST, PROFILE, SHOULD
from kvsched.workload import WorkItem, validate

# -- faulty allocators --------------------------------------------------------------------


class OvercommittingAllocator(BlockAllocator):
    """An allocator that trusts its caller: past the end of a free list it hands out ids
    beyond the pool (memory it does not have) instead of failing. Such ids vanish when
    released, so the pool returns to its true size."""

    def __init__(self, num_gpu_blocks: int, num_cpu_blocks: int) -> None:
        super().__init__(num_gpu_blocks, num_cpu_blocks)
        self.size: dict[Pool, int] = {"gpu": num_gpu_blocks, "host": num_cpu_blocks}
        self.beyond: dict[Pool, int] = dict(self.size)

    def take(self, pool: Pool, count: int) -> list[int]:
        have = min(count, self.free_count(pool))
        extra = list(range(self.beyond[pool], self.beyond[pool] + count - have))
        self.beyond[pool] += len(extra)
        return super().take(pool, have) + extra

    def put(self, pool: Pool, ids: list[int]) -> None:
        super().put(pool, [b for b in ids if b < self.size[pool]])


class HostSizeAllocator(OvercommittingAllocator):
    """Reports the host pool's size as its free blocks."""

    @property
    def free_cpu(self) -> int:
        return self.size["host"]


class LeakingAllocator(BlockAllocator):
    """While `leaking` is set, `free` loses what it releases: the blocks never return to
    the free lists."""

    leaking = False
    freeing = False  # inside a `free` while leaking

    def free(self, rid: str) -> int:
        self.freeing = self.leaking
        try:
            return super().free(rid)
        finally:
            self.freeing = False

    def put(self, pool: Pool, ids: list[int]) -> None:
        if not self.freeing:
            super().put(pool, ids)


class LeakingScheduler(ReferenceScheduler):
    """The reference over a LeakingAllocator: `with self.leaking():` marks the one code
    path that forgets to free."""

    def make_allocator(self) -> BlockAllocator:
        self.leaky = LeakingAllocator(self.config.num_gpu_blocks, self.config.num_cpu_blocks)
        return self.leaky

    @contextlib.contextmanager
    def leaking(self) -> Iterator[None]:
        self.leaky.leaking = True
        try:
            yield
        finally:
            self.leaky.leaking = False


# -- the bugs ---------------------------------------------------------------------------


class FloorBlocksNeeded(ReferenceScheduler):
    """Blocks needed computed with floor: the last, partly filled block is never allocated."""

    def blocks_needed(self, computed: int, new_tokens: int, held: int,
                      reserve: int = 0) -> int:
        return max(0, max(computed + new_tokens, reserve) // self.config.block_size - held)


class OverAdmitByOneBlock(ReferenceScheduler):
    """The admission check is one block short (`need - 1 <= free`), and the allocator
    hands out what it is asked for."""

    def make_allocator(self) -> BlockAllocator:
        return OvercommittingAllocator(self.config.num_gpu_blocks, self.config.num_cpu_blocks)

    def admission_blocks(self, tokens: int, held: int) -> int:
        return super().admission_blocks(tokens, held) - 1


class TokenBudgetOffByOne(ReferenceScheduler):
    """The token budget is compared with `<=` where `<` was meant: one token too many."""

    def token_budget(self) -> int:
        return super().token_budget() + 1


class SeqLimitIgnored(ReferenceScheduler):
    """max_num_seqs is never consulted."""

    def seq_limit(self) -> int:
        return MAX_COUNT


class VictimBlocksNotFreed(LeakingScheduler):
    """A recompute victim goes back to waiting but its blocks are never returned."""

    def preempt(self, victim: LiveRequest) -> Preemption:
        with self.leaking():
            return super().preempt(victim)


class FinishedBlocksNotFreed(LeakingScheduler):
    """A finished request's blocks are never returned."""

    def update(self, stopped: Collection[str]) -> tuple[str, ...]:
        with self.leaking():
            return super().update(stopped)


class AbortedBlocksNotFreed(LeakingScheduler):
    """An aborted request's blocks are never returned."""

    def abort_request(self, request_id: str) -> None:
        with self.leaking():
            super().abort_request(request_id)


class ScheduledWithoutSwapIn(ReferenceScheduler):
    """The swap-in pass resumes a swapped request but drops it from the step's swap-ins,
    so the copy from host is never issued."""

    def swap_in_pass(self, plan: StepPlan) -> None:
        super().swap_in_pass(plan)
        plan.swapped_in.clear()


class PreemptsWaiting(ReferenceScheduler):
    """The victim is the newest live request not yet preempted this step, without
    checking that it runs: a waiting request can be 'preempted' (freeing nothing)."""

    def __init__(self, config: Config, knobs: Knobs | None = None) -> None:
        super().__init__(config, knobs)
        self.taken: set[str] = set()

    def schedule(self) -> Decision:
        self.taken = set()
        return super().schedule()

    def choose_victim(self) -> LiveRequest:
        victim = max((r for r in self.live.values()
                      if r.status in (Status.RUNNING, Status.WAITING)
                      and r.request.id not in self.taken), key=lambda r: r.seq)
        self.taken.add(victim.request.id)
        if victim.status == Status.WAITING:
            # The engine moves it to running so that its preemption code can take it.
            self.waiting.remove(victim)
            self.running.append(victim)
        return victim


class RejectsFeasible(ReferenceScheduler):
    """Rejection tests P + O against the cache, forgetting that max_model_len caps the
    sequence: a request with a large max_tokens that would stop at max_model_len is
    refused."""

    def reject_arrivals(self) -> list[Rejection]:
        cfg = self.config
        early = [self.reject(r, "prompt plus max_tokens exceed the cache")
                 for r in self.arrived
                 if r.status == Status.WAITING and blocks_for(
                     r.request.prompt_len + r.request.max_tokens, cfg.block_size)
                 > cfg.num_gpu_blocks]
        return early + super().reject_arrivals()


class NeverRejects(ReferenceScheduler):
    """Nothing is ever rejected: a request that can never complete waits forever."""

    def reject_arrivals(self) -> list[Rejection]:
        self.arrived = []
        return []


class AdmitsAfterPreempt(ReferenceScheduler):
    """Admits waiting requests in a step that preempted (legal, but not vLLM v1)."""

    def __init__(self, config: Config, knobs: Knobs | None = None) -> None:
        super().__init__(config, replace(knobs or Knobs(), admit_after_preempt=True))


class TailVictimUnderPriority(ReferenceScheduler):
    """Under the priority policy the victim is still the tail of running, not the least
    urgent request (legal, but not vLLM v1)."""

    def __init__(self, config: Config, knobs: Knobs | None = None) -> None:
        super().__init__(config, replace(knobs or Knobs(), victim="tail"))


class RecomputeKeepsComputed(ReferenceScheduler):
    """A recompute victim's blocks are freed but its computed-token count is kept, so it
    resumes as if its KV were still there."""

    def preempt(self, victim: LiveRequest) -> Preemption:
        computed = victim.num_computed
        p = super().preempt(victim)
        if p.mode == "recompute":
            victim.num_computed = computed
        return p


class HostCapacityNotFree(ReferenceScheduler):
    """The room check before a swap-out compares with the host pool's size instead of its
    free blocks, so a swap-out can overrun the host."""

    def make_allocator(self) -> BlockAllocator:
        return HostSizeAllocator(self.config.num_gpu_blocks, self.config.num_cpu_blocks)


class MissesMaxTokens(ReferenceScheduler):
    """The max_tokens stop is tested before the new token is counted (`>` for `>=`), so a
    request runs one token past max_tokens."""

    def finishes(self, r: LiveRequest, stopped: bool) -> bool:
        outputs = r.num_tokens - r.request.prompt_len
        return (stopped or outputs > r.request.max_tokens
                or r.num_tokens >= self.config.max_model_len)


class AdmitsOnlyWithSpareBlock(ReferenceScheduler):
    """Admission demands one block more than needed (`need < free` for `<=`): a request
    that needs every free block waits forever, and the engine idles."""

    def admission_blocks(self, tokens: int, held: int) -> int:
        return super().admission_blocks(tokens, held) + 1


class ChunkPastKnown(ReferenceScheduler):
    """The next chunk is N - C + 1 tokens: one past the tokens known."""

    def next_chunk(self, r: LiveRequest, threshold: int, budget: int) -> int:
        return super().next_chunk(r, threshold, budget) + 1


class PreemptsAtExactFit(ReferenceScheduler):
    """The growth check is `need < free` where `need <= free` was meant (blocks are asked
    for only when needed): a running request that needs exactly the free blocks preempts
    a victim although it fits."""

    def can_grow(self, need: int) -> bool:
        return need == 0 or need < self.blocks.free_gpu


class NeverPreempts(ReferenceScheduler):
    """When a running request's next chunk does not fit, it waits for room instead of
    preempting a victim: once the running requests fill the cache, each waits on the
    others, and none can ever go on (a deadlock no MUST invariant sees: no step breaks
    a budget, none does anything at all)."""

    def running_pass(self, plan: StepPlan) -> None:
        for r in list(self.running):
            if plan.budget <= 0:
                break
            rid = r.request.id
            n = min(self.next_chunk(r, plan.threshold, plan.budget),
                    self.config.max_model_len - 1 - r.num_computed)
            if n <= 0 or not self.can_grow(self.grow_need(r, n)):
                continue  # the fault: wait for blocks instead of making room
            need = self.blocks_needed(r.num_computed, n, self.blocks.gpu_blocks(rid))
            plan.new_blocks[rid] = self.blocks.allocate(rid, need)
            self.cache_filled(r, r.num_computed + n)
            plan.scheduled[rid] = n
            plan.budget -= n


class StackQueue(WaitingQueue):
    """A waiting queue that takes every request at its front, as a preempted one."""

    def push(self, r: LiveRequest, front: bool) -> None:
        super().push(r, True)


class AdmitsNewestFirst(ReferenceScheduler):
    """The waiting queue is a stack: an arrival is pushed to its front, where preempted
    requests go, so the newest is admitted first and, while arrivals keep coming, an
    early request waits behind every later one (starvation; no budget is broken)."""

    def make_waiting_queue(self) -> WaitingQueue:
        return StackQueue(self.config.policy == "priority")


# -- the registry -----------------------------------------------------------------------


@dataclass(frozen=True)
class SeededBug:
    """One planted fault: how to build it, the config and workload that expose it, and
    the invariant id the checker must report (at `level`: MUST, SHOULD or PROFILE)."""

    name: str
    description: str
    factory: Callable[[Config], Scheduler]
    expected: str
    level: str
    config: Config
    workload: tuple[WorkItem, ...]
    profile: str = "vllm-v1"
    # The engine runs at most this many steps; the trace then ends (engine stopped).
    max_steps: int = 100

    def reference(self) -> Scheduler:
        """The correct scheduler the bug was planted in."""
        return reference_scheduler(self.profile, self.config)

    def simulate(self, scheduler: Scheduler | None = None) -> list[StepRecord]:
        """The trace of `scheduler` (by default the buggy one) on this workload, up to
        where it ends, stops (max_steps) or gets stuck."""
        chosen = scheduler if scheduler is not None else self.factory(self.config)
        records: list[StepRecord] = []
        with contextlib.suppress(Stalled):
            for rec in run(chosen, self.workload, max_steps=self.max_steps):
                records.append(rec)
        return records


class SGLangNoReservedOutput(SGLangScheduler):
    """SGLang's step whose admission ignores the running requests' reserved future
    output: it admits as if they would generate nothing more, so the batch it fills must
    retract sooner than SGLang's (a PROFILE divergence, legal under the spec)."""

    def _reserved(self, r: SGLangRequest) -> float:
        return 0.0


def sglang_no_reserved_output(config: Config) -> Scheduler:
    """SGLangNoReservedOutput with profile sglang@0.5.23's rules on `config`, as `kvsched
    fuzz kvsched.testing.seeded_bugs:sglang_no_reserved_output --profile sglang@0.5.23`
    builds it."""
    return SGLangNoReservedOutput(config, get_profile("sglang@0.5.23").knobs)


def planted(cls: type[ReferenceScheduler], profile: str) -> Callable[[Config], Scheduler]:
    knobs = get_profile(profile).knobs

    def factory(config: Config) -> Scheduler:
        return cls(config, knobs)

    return factory


def tight_config(profile: str = "vllm-v1", **fields: Any) -> Config:
    """A small cache (8 blocks of 4 tokens) so that faults show within a few dozen steps;
    prefix caching off unless asked for (the faults are planted in the plain model)."""
    base = Config(block_size=4, num_gpu_blocks=8, max_num_batched_tokens=64, max_num_seqs=4,
                  max_model_len=64)
    given = frozenset(fields) | {"prefix_caching"}
    return get_profile(profile).configure(replace(base, **fields), given)


def workload(*items: tuple[int, int, int, int] | tuple[int, int, int, int, int]
             ) -> tuple[WorkItem, ...]:
    """(arrival, prompt_len, output_len, max_tokens[, priority]) per request r0, r1, ..."""
    return tuple(validate(WorkItem(f"r{i}", *item) for i, item in enumerate(items)))


def seeded(name: str, cls: type[ReferenceScheduler], expected: str, level: str, cfg: Config,
           items: tuple[WorkItem, ...], profile: str = "vllm-v1", max_steps: int = 100
           ) -> SeededBug:
    doc = (cls.__doc__ or "").split("\n\n")[0]
    return SeededBug(name, " ".join(doc.split()), planted(cls, profile), expected, level, cfg,
                     items, profile, max_steps)


# Two requests of 12 tokens that grow until the 8-block cache is full (step 5): the tail
# is preempted, and (recompute) resumes at step 20 or (swap) swaps back in then.
GROWING = workload((0, 12, 20, 20), (0, 12, 20, 20))
# The same, and a third request that waits for room: a victim step has someone waiting.
GROWING_AND_WAITING = workload((0, 12, 20, 20), (0, 12, 20, 20), (1, 12, 4, 4))

SEEDED_BUGS: dict[str, SeededBug] = {b.name: b for b in (
    # A 30-token prompt fills 7.5 blocks: floor gives 7.
    seeded("floor-blocks-needed", FloorBlocksNeeded, "block-ids", MUST,
           tight_config(num_gpu_blocks=16), workload((0, 30, 3, 4))),
    # r0 holds 5 blocks after step 1's decode; r1 needs 4 of the 3 left.
    seeded("over-admit-by-one-block", OverAdmitByOneBlock, "kv-budget", MUST, tight_config(),
           workload((0, 16, 8, 8), (1, 16, 2, 2))),
    # A 40-token prompt under a 16-token budget: the first chunk is 17.
    seeded("token-budget-off-by-one", TokenBudgetOffByOne, "token-budget", MUST,
           tight_config(num_gpu_blocks=16, max_num_batched_tokens=16),
           workload((0, 40, 2, 2))),
    seeded("seq-limit-ignored", SeqLimitIgnored, "seq-limit", MUST,
           tight_config(max_num_seqs=2), workload((0, 4, 2, 2), (0, 4, 2, 2), (0, 4, 2, 2))),
    seeded("victim-blocks-not-freed", VictimBlocksNotFreed, "preempt", MUST, tight_config(),
           GROWING, max_steps=40),
    # r0 finishes at step 1 while r1 runs on: its 3 blocks are missing from then on.
    seeded("finished-blocks-not-freed", FinishedBlocksNotFreed, "finish", MUST,
           tight_config(), workload((0, 8, 2, 4), (0, 8, 6, 8))),
    seeded("swapped-scheduled-without-swap-in", ScheduledWithoutSwapIn, "one-state", MUST,
           tight_config(preemption="swap", num_cpu_blocks=8), GROWING),
    seeded("waiting-request-preempted", PreemptsWaiting, "preempt", MUST, tight_config(),
           GROWING_AND_WAITING),
    # 20 + 100 tokens would need 30 blocks, but max_model_len 64 stops it at 16.
    seeded("feasible-request-rejected", RejectsFeasible, "reject", MUST,
           tight_config(num_gpu_blocks=16), workload((0, 20, 6, 100))),
    # The victim's 4 blocks let the waiting r2 in at once.
    seeded("admits-after-preempt", AdmitsAfterPreempt, "profile", PROFILE, tight_config(),
           GROWING_AND_WAITING),
    # r0 (priority 5) runs first, r1 (priority 0) is the tail: vLLM preempts r0.
    seeded("tail-victim-under-priority", TailVictimUnderPriority, "profile", PROFILE,
           tight_config(policy="priority"), workload((0, 12, 20, 20, 5), (1, 12, 20, 20, 0))),
    seeded("recompute-keeps-computed", RecomputeKeepsComputed, "preempt", MUST,
           tight_config(), GROWING),
    # Beyond the first twelve: the other MUST and SHOULD invariants.
    # r2 swaps out 4 blocks of the 6 on the host; then r1 swaps out 6.
    seeded("swap-out-beyond-host", HostCapacityNotFree, "cpu-budget", MUST,
           tight_config(preemption="swap", num_gpu_blocks=12, num_cpu_blocks=6),
           workload((0, 12, 20, 20), (0, 12, 20, 20), (0, 12, 20, 20))),
    # No end-of-sequence before max_tokens 3.
    seeded("finish-missed-at-max-tokens", MissesMaxTokens, "finish", MUST, tight_config(),
           workload((0, 8, 10, 3))),
    seeded("aborted-blocks-not-freed", AbortedBlocksNotFreed, "accounting", MUST,
           tight_config(), (WorkItem("r0", 0, 8, 10, 10, abort=3),
                            WorkItem("r1", 0, 8, 10, 10))),
    seeded("chunk-past-known-tokens", ChunkPastKnown, "token-range", MUST, tight_config(),
           workload((0, 8, 2, 2)), max_steps=10),
    # 31 tokens need all 8 blocks of the empty cache.
    seeded("admission-needs-spare-block", AdmitsOnlyWithSpareBlock, "no-idle", SHOULD,
           tight_config(), workload((0, 31, 1, 1)), max_steps=10),
    # r1's 70-token prompt exceeds max_model_len 64 (and the 16 blocks); the engine stops
    # when r0 is done.
    seeded("impossible-request-never-rejected", NeverRejects, "completion", SHOULD,
           tight_config(num_gpu_blocks=16), workload((0, 8, 4, 4), (0, 70, 4, 4)),
           max_steps=4),
    # r0 decodes into the last free block (its 8th) at C = 28: it fits exactly, yet the
    # bug preempts r0 itself; it is admitted again whole and finishes.
    seeded("preempts-at-exact-fit", PreemptsAtExactFit, "needed-preemption", SHOULD,
           tight_config(), workload((0, 12, 20, 20))),
    # Both grow to 4 blocks each by step 4, filling the cache; each then needs a fifth.
    seeded("never-preempts", NeverPreempts, "progress", SHOULD, tight_config(), GROWING,
           max_steps=200),
    # One seat: r0 holds it for 8 steps; r1 arrives at step 1, and from step 2 a short
    # request every 2 steps, each running 3; the newest always goes first, so r1 (and
    # the early ones after it) wait while later ones are admitted in their place, past
    # K = 100 steps.
    seeded("admits-newest-first", AdmitsNewestFirst, "starvation", SHOULD,
           tight_config(max_num_seqs=1),
           workload((0, 4, 8, 8), (1, 4, 2, 2),
                    *((2 + 2 * i, 4, 2, 2) for i in range(70))), max_steps=400),
)}
