"""Seeded bugs: the reference scheduler with exactly one realistic engine fault planted.

Each bug is a small subclass of the reference scheduler (or of its block allocator)
that overrides the least code that carries the fault, as an engine author could have
written it. `SEEDED_BUGS` names each one with a small, tight config and workload that
expose it within a few dozen steps, and the invariant id the checker must report:
a MUST or SHOULD id from the spec's checker, or "profile" for a fault that is legal
under the spec but differs from the profile it claims to follow (the PROFILE check
replays that profile on the trace). The correct reference, run on the same config and
workload, draws no violation at all. `kvsched diff` and `kvsched fuzz` reuse them.
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, replace

import kvsched.reference.scheduler as reference_scheduler
from kvsched.reference.allocator import BlockAllocator
from kvsched.reference.scheduler import Entry, ReferenceScheduler
from kvsched.simulate import run
from kvsched.spec.blocks import blocks_for, blocks_needed
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
from kvsched.spec.violation import MUST, PROFILE, SHOULD
from kvsched.workload import WorkItem, validate

# -- the planting tools -------------------------------------------------------------------


@contextlib.contextmanager
def engine_config(s: ReferenceScheduler, **wrong: int) -> Iterator[None]:
    """The scheduler decides with `wrong` config values while it reports the true config
    (the engine read a limit off by one, or not at all)."""
    true = s.config
    s.config = replace(true, **wrong)  # type: ignore[arg-type]
    try:
        yield
    finally:
        s.config = true


def floor_blocks_needed(computed: int, new_tokens: int, held: int, block_size: int) -> int:
    """The bug: floor where the spec has a ceiling, so a partly filled block is not counted."""
    return max(0, (computed + new_tokens) // block_size - held)


class OvercommittingAllocator(BlockAllocator):
    """An allocator that trusts its caller: past the end of a free list it hands out ids
    beyond the pool (memory it does not have) instead of failing. Such ids vanish when
    released, so the pool returns to its true size."""

    def __init__(self, num_gpu_blocks: int, num_cpu_blocks: int) -> None:
        super().__init__(num_gpu_blocks, num_cpu_blocks)
        self.num_gpu_blocks = num_gpu_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self._beyond_gpu = num_gpu_blocks
        self._beyond_cpu = num_cpu_blocks

    def _take_gpu(self, count: int) -> list[int]:
        got = []
        for _ in range(count):
            if self._free_gpu:
                got.append(self._free_gpu.popleft())
            else:
                got.append(self._beyond_gpu)
                self._beyond_gpu += 1
        return got

    def _give_back_gpu(self, ids: list[int]) -> None:
        self._free_gpu.extend(b for b in ids if b < self.num_gpu_blocks)

    def allocate(self, rid: str, count: int) -> list[int]:
        got = self._take_gpu(count)
        self._gpu.setdefault(rid, []).extend(got)
        return got

    def release_last(self, rid: str, count: int) -> None:
        table = self._gpu.get(rid, [])
        self._give_back_gpu([table.pop() for _ in range(count)])

    def free(self, rid: str) -> int:
        gpu = self._gpu.pop(rid, [])
        self._give_back_gpu(list(reversed(gpu)))
        self._free_cpu.extend(b for b in self._cpu.pop(rid, []) if b < self.num_cpu_blocks)
        return len(gpu)

    def swap_out(self, rid: str) -> int:
        gpu = self._gpu.pop(rid, [])
        host = []
        for _ in gpu:
            if self._free_cpu:
                host.append(self._free_cpu.popleft())
            else:
                host.append(self._beyond_cpu)
                self._beyond_cpu += 1
        self._cpu[rid] = host
        self._give_back_gpu(list(reversed(gpu)))
        return len(gpu)

    def swap_in(self, rid: str) -> list[int]:
        host = self._cpu.pop(rid, [])
        self._free_cpu.extend(b for b in host if b < self.num_cpu_blocks)
        got = self._take_gpu(len(host))
        self._gpu[rid] = list(got)
        return got


class LeakingAllocator(BlockAllocator):
    """While `leaking` is set, `free` drops a request's block table without returning its
    blocks to the pool: they are lost for good."""

    leaking = False

    def free(self, rid: str) -> int:
        if not self.leaking:
            return super().free(rid)
        self._cpu.pop(rid, None)
        return len(self._gpu.pop(rid, []))


class LeakingScheduler(ReferenceScheduler):
    """The reference over a LeakingAllocator: `with self.leaking():` marks the one code
    path that forgets to free."""

    def __init__(self, config: Config, knobs: Knobs | None = None) -> None:
        super().__init__(config, knobs)
        self.blocks: LeakingAllocator = LeakingAllocator(config.num_gpu_blocks,
                                                         config.num_cpu_blocks)

    @contextlib.contextmanager
    def leaking(self) -> Iterator[None]:
        self.blocks.leaking = True
        try:
            yield
        finally:
            self.blocks.leaking = False


# -- the bugs ---------------------------------------------------------------------------


class FloorBlocksNeeded(ReferenceScheduler):
    """Blocks needed computed with floor: the last, partly filled block is never allocated."""

    def schedule(self) -> Decision:
        # Planted where the reference looks blocks_needed up, for this call only (one
        # thread: the module name is restored before any other scheduler decides).
        setattr(reference_scheduler, "blocks_needed", floor_blocks_needed)  # noqa: B010
        try:
            return super().schedule()
        finally:
            setattr(reference_scheduler, "blocks_needed", blocks_needed)  # noqa: B010


class OverAdmitByOneBlock(ReferenceScheduler):
    """The admission check is one block short (`need - 1 <= free`), and the allocator
    hands out what it is asked for."""

    def __init__(self, config: Config, knobs: Knobs | None = None) -> None:
        super().__init__(config, knobs)
        self.blocks = OvercommittingAllocator(config.num_gpu_blocks, config.num_cpu_blocks)

    def _admission_blocks(self, tokens: int, held: int) -> int:
        return super()._admission_blocks(tokens, held) - 1


class TokenBudgetOffByOne(ReferenceScheduler):
    """The token budget is compared with `<=` where `<` was meant: one token too many."""

    def schedule(self) -> Decision:
        with engine_config(self, max_num_batched_tokens=self.config.max_num_batched_tokens + 1):
            return super().schedule()


class SeqLimitIgnored(ReferenceScheduler):
    """max_num_seqs is never consulted."""

    def schedule(self) -> Decision:
        with engine_config(self, max_num_seqs=MAX_COUNT):
            return super().schedule()


class VictimBlocksNotFreed(LeakingScheduler):
    """A recompute victim goes back to waiting but its blocks are never returned."""

    def _preempt(self, victim: Entry) -> Preemption:
        with self.leaking():
            return super()._preempt(victim)


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

    def _swap_in_pass(self, budget: int, threshold: int, scheduled: dict[str, int],
                      new_blocks: dict[str, list[int]], swapped_in: list[str]) -> int:
        return super()._swap_in_pass(budget, threshold, scheduled, new_blocks, [])


class PreemptsWaiting(ReferenceScheduler):
    """The victim is the newest live request not yet preempted this step, without
    checking that it runs: a waiting request can be 'preempted' (freeing nothing)."""

    def __init__(self, config: Config, knobs: Knobs | None = None) -> None:
        super().__init__(config, knobs)
        self._taken: set[str] = set()

    def schedule(self) -> Decision:
        self._taken = set()
        return super().schedule()

    def _victim(self) -> Entry:
        victim = max((e for e in self.entries.values()
                      if e.status in (Status.RUNNING, Status.WAITING)
                      and e.request.id not in self._taken), key=lambda e: e.seq)
        self._taken.add(victim.request.id)
        if victim.status == Status.WAITING:
            # The engine moves it to running so that its preemption code can take it.
            self._waiting_remove(victim)
            self._heap = [(k, e) for k, e in self._heap if e is not victim]
            heapq.heapify(self._heap)
            self.running.append(victim)
        return victim


class RejectsFeasible(ReferenceScheduler):
    """Rejection tests P + O against the cache, forgetting that max_model_len caps the
    sequence: a request with a large max_tokens that would stop at max_model_len is
    refused."""

    def _reject_arrivals(self) -> list[Rejection]:
        cfg = self.config
        out = []
        for e in self._arrived:
            r = e.request
            if (e.status == Status.WAITING
                    and blocks_for(r.prompt_len + r.max_tokens, cfg.block_size)
                    > cfg.num_gpu_blocks):
                self._waiting_remove(e)
                e.status = Status.REJECTED
                del self.entries[r.id]
                out.append(Rejection(r.id, "prompt plus max_tokens exceed the cache"))
        return out + super()._reject_arrivals()


class NeverRejects(ReferenceScheduler):
    """Nothing is ever rejected: a request that can never complete waits forever."""

    def _reject_arrivals(self) -> list[Rejection]:
        self._arrived = []
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

    def _preempt(self, victim: Entry) -> Preemption:
        computed = victim.num_computed
        p = super()._preempt(victim)
        if p.mode == "recompute":
            victim.num_computed = computed
        return p


class HostSizeAllocator(OvercommittingAllocator):
    """Reports the host pool's size as its free blocks."""

    @property
    def free_cpu(self) -> int:
        return self.num_cpu_blocks


class HostCapacityNotFree(ReferenceScheduler):
    """The room check before a swap-out compares with the host pool's size instead of its
    free blocks, so a swap-out can overrun the host."""

    def __init__(self, config: Config, knobs: Knobs | None = None) -> None:
        super().__init__(config, knobs)
        self.blocks = HostSizeAllocator(config.num_gpu_blocks, config.num_cpu_blocks)


class MissesMaxTokens(ReferenceScheduler):
    """The max_tokens stop is tested before the new token is counted (`>` for `>=`), so a
    request runs one token past max_tokens."""

    def update(self, stopped: Collection[str]) -> tuple[str, ...]:
        late = {e.request.id: e.request for e in self._sampled}
        for e in self._sampled:
            e.request = replace(e.request, max_tokens=e.request.max_tokens + 1)
        try:
            return super().update(stopped)
        finally:
            for e in self.entries.values():
                if e.request.id in late:
                    e.request = late[e.request.id]


class AdmitsOnlyWithSpareBlock(ReferenceScheduler):
    """Admission demands one block more than needed (`need < free` for `<=`): a request
    that needs every free block waits forever, and the engine idles."""

    def _admission_blocks(self, tokens: int, held: int) -> int:
        return super()._admission_blocks(tokens, held) + 1


class ChunkPastKnown(ReferenceScheduler):
    """The next chunk is N - C + 1 tokens: one past the tokens known."""

    def _chunk(self, e: Entry, threshold: int, budget: int) -> int:
        return super()._chunk(e, threshold, budget) + 1


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
        return ReferenceScheduler(self.config, get_profile(self.profile).knobs)

    def simulate(self, scheduler: Scheduler | None = None) -> list[StepRecord]:
        """The trace of `scheduler` (by default the buggy one) on this workload."""
        chosen = scheduler if scheduler is not None else self.factory(self.config)
        return list(run(chosen, self.workload, max_steps=self.max_steps))


def planted(cls: type[ReferenceScheduler], profile: str) -> Callable[[Config], Scheduler]:
    knobs = get_profile(profile).knobs

    def factory(config: Config) -> Scheduler:
        return cls(config, knobs)

    return factory


def tight_config(profile: str = "vllm-v1", **fields: object) -> Config:
    """A small cache (8 blocks of 4 tokens) so that faults show within a few dozen steps."""
    base = Config(block_size=4, num_gpu_blocks=8, max_num_batched_tokens=64, max_num_seqs=4,
                  max_model_len=64)
    given = frozenset(fields)
    return get_profile(profile).configure(replace(base, **fields), given)  # type: ignore[arg-type]


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
           tight_config("vllm-v0-swap", num_cpu_blocks=8), GROWING, profile="vllm-v0-swap"),
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
    # Beyond the twelve of the issue.
    # r2 swaps out 4 blocks of the 6 on the host; then r1 swaps out 6.
    seeded("swap-out-beyond-host", HostCapacityNotFree, "cpu-budget", MUST,
           tight_config("vllm-v0-swap", num_gpu_blocks=12, num_cpu_blocks=6),
           workload((0, 12, 20, 20), (0, 12, 20, 20), (0, 12, 20, 20)),
           profile="vllm-v0-swap"),
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
)}
