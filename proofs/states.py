"""Arbitrary consistent states for the CrossHair obligations: the reference scheduler and
the spec's checker, built directly at one step boundary from a few small integers.

A request is (status, prompt_len, max_tokens, outputs, computed, priority), status one
of WAITING, RUNNING, SWAPPED; N = prompt_len + outputs. At a step boundary the
reference keeps G = ceil(C / block_size) for a running request, H the same for a
swapped one, and C = 0 for a waiting one (a recompute victim keeps its outputs as N).
`consistent` is the precondition that the numbers describe such a state.
"""

from __future__ import annotations

from typing import NamedTuple

from kvsched.reference.requests import LiveRequest as ReferenceRequest
from kvsched.reference.scheduler import ReferenceScheduler
from kvsched.spec.blocks import blocks_for
from kvsched.spec.checker import Checker
from kvsched.spec.knobs import VICTIMS, Knobs
from kvsched.spec.model import POLICIES, PREEMPTION_MODES, Config, Request, Status
from kvsched.spec.state import LiveRequest

WAITING, RUNNING, SWAPPED = 0, 1, 2
STATUS = {WAITING: Status.WAITING, RUNNING: Status.RUNNING, SWAPPED: Status.SWAPPED}


class Req(NamedTuple):
    status: int
    prompt_len: int
    max_tokens: int
    outputs: int = 0
    computed: int = 0
    priority: int = 0


class Cfg(NamedTuple):
    """A config and knobs as small integers (codes index POLICIES, PREEMPTION_MODES and
    VICTIMS)."""

    block_size: int = 1
    gpu: int = 4
    cpu: int = 0
    tokens: int = 4
    seqs: int = 4
    max_model_len: int = 8
    chunked: bool = True
    threshold: int = 0
    watermark: int = 0
    policy: int = 0
    preemption: int = 0
    victim: int = 0
    admit_after_preempt: bool = False
    reserve_full: bool = True
    lift_threshold: bool = True
    continue_after_self_preemption: bool = False
    skip_over_budget: bool = False
    free_as_freed: bool = False

    def config(self) -> Config:
        return Config(block_size=self.block_size, num_gpu_blocks=self.gpu,
                      num_cpu_blocks=self.cpu, max_num_batched_tokens=self.tokens,
                      max_num_seqs=self.seqs, max_model_len=self.max_model_len,
                      chunked_prefill=self.chunked,
                      long_prefill_token_threshold=self.threshold if self.chunked else 0,
                      policy=POLICIES[self.policy], preemption=PREEMPTION_MODES[self.preemption],
                      watermark_blocks=self.watermark)

    def knobs(self) -> Knobs:
        return Knobs(victim=VICTIMS[self.victim],
                     admit_after_preempt=self.admit_after_preempt,
                     reserve_full_sequence=self.reserve_full,
                     lift_threshold_when_alone=self.lift_threshold,
                     continue_after_self_preemption=self.continue_after_self_preemption,
                     over_budget_prompt="skip" if self.skip_over_budget else "stop",
                     free_order="as_freed" if self.free_as_freed else "uncached_first")


def small_cfg(c: Cfg) -> bool:
    """The bounds every obligation over states uses: the model checker's scope sizes."""
    return (1 <= c.block_size <= 2 and 1 <= c.gpu <= 4 and 0 <= c.cpu <= 4
            and 1 <= c.tokens <= 4 and 1 <= c.seqs <= 3 and 2 <= c.max_model_len <= 8
            and 0 <= c.threshold <= 2 and 0 <= c.watermark <= 1
            and 0 <= c.policy < len(POLICIES) and 0 <= c.preemption < len(PREEMPTION_MODES)
            and 0 <= c.victim < len(VICTIMS)
            and (c.chunked or c.tokens >= c.max_model_len))


def held(c: Cfg, r: Req) -> int:
    return blocks_for(r.computed, c.block_size) if r.status != WAITING else 0


def consistent_request(c: Cfg, r: Req) -> bool:
    known = r.prompt_len + r.outputs
    if not (0 <= r.status <= 2 and 1 <= r.prompt_len <= 4 and 1 <= r.max_tokens <= 3
            and 0 <= r.outputs < r.max_tokens and known < c.max_model_len
            and 0 <= r.priority <= 1):
        return False
    if r.status == WAITING:
        return r.computed == 0
    if not c.chunked:
        # Prefills are whole: between steps a running (or swapped) request has computed
        # all but the token it last sampled.
        return r.computed == known - 1
    return 1 <= r.computed < known


def fits_alone(c: Cfg, r: Req) -> bool:
    """Not rejected: section 2's rule 2 (never_completes, whose reason strings would make
    CrossHair realize every number; arithmetic.py proves the two agree)."""
    longest = min(r.prompt_len + r.max_tokens, c.max_model_len)
    return r.prompt_len < c.max_model_len and longest <= c.gpu * c.block_size


def consistent(c: Cfg, reqs: list[Req]) -> bool:
    """The numbers describe a state the reference can be in between two steps."""
    if not small_cfg(c) or len(reqs) > 3:
        return False
    if not all(consistent_request(c, r) for r in reqs):
        return False
    if not all(fits_alone(c, r) for r in reqs):
        return False
    running = [r for r in reqs if r.status == RUNNING]
    swapped = [r for r in reqs if r.status == SWAPPED]
    return (len(running) <= c.seqs and sum(held(c, r) for r in running) <= c.gpu
            and sum(held(c, r) for r in swapped) <= c.cpu
            and all(held(c, r) <= c.gpu for r in swapped))


def build(c: Cfg, reqs: list[Req]) -> tuple[ReferenceScheduler, Checker]:
    """The reference in that state (swapped requests queued in policy order, waiting ones
    in list order) and the spec's checker holding the same state."""
    config = c.config()
    s = ReferenceScheduler(config, c.knobs())
    checker = Checker(config)
    checker.state.ids_seen = True
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].status != SWAPPED)
    for i in order:  # swapped first: they pass through the GPU on their way to the host
        r = reqs[i]
        rid = f"r{i}"
        request = Request(rid, r.prompt_len, r.max_tokens, r.priority, i)
        known = r.prompt_len + r.outputs
        e = ReferenceRequest(request, i, STATUS[r.status], known, r.computed)
        s.live[rid] = e
        ids = s.blocks.allocate(rid, held(c, r))
        t = LiveRequest(request, STATUS[r.status], known, r.computed)
        if r.status == SWAPPED:
            s.blocks.swap_out(rid)
            s.swapped.append(e)
            t.host_blocks = len(ids)
        elif r.status == RUNNING:
            s.running.append(e)
            t.gpu_blocks = len(ids)
            t.block_ids = list(ids)
            checker.state.holders.update((b, [rid]) for b in ids)
        checker.state.live[rid] = t
        checker.state.count[t.status] += 1
    s.running.sort(key=lambda e: e.seq)
    s.swapped.sort(key=s.swapped_key)
    for i, r in enumerate(reqs):
        if r.status == WAITING:
            s.waiting.push(s.live[f"r{i}"], front=False)
    s.next_seq = len(reqs)
    checker.state.free = s.blocks.free_gpu
    checker.state.free_host = s.blocks.free_cpu
    return s, checker
