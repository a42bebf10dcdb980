"""Obligations over preemption: what the reference does to its victim, from any state.

The victim is the one the reference's own rule picks (tail of running, or the lowest
priority); the preemption mode follows the config (auto by the cost model, swap
falling back to recompute when the host is full). Bounded searches within
`states.consistent`, like decisions.py, from two running requests and a waiting one.
"""

from __future__ import annotations

from typing import NamedTuple

from kvsched.spec.model import Status
from proofs.states import RUNNING, WAITING, Cfg, Req, build, consistent


class Preempted(NamedTuple):
    """The victim before and after, and the pools' free blocks before and after."""

    mode: str
    status: Status
    known: tuple[int, int]
    computed: tuple[int, int]
    gpu: tuple[int, int]
    host: tuple[int, int]
    free_gpu: tuple[int, int]
    free_cpu: tuple[int, int]


def preempt(c: Cfg, reqs: list[Req]) -> Preempted:
    s, _ = build(c, reqs)
    victim = s.choose_victim()
    rid = victim.request.id
    b = s.blocks
    before = (victim.num_tokens, victim.num_computed, b.gpu_blocks(rid), b.host_blocks(rid),
              b.free_gpu, b.free_cpu)
    s.running.remove(victim)
    p = s.preempt(victim)
    after = (victim.num_tokens, victim.num_computed, b.gpu_blocks(rid), b.host_blocks(rid),
             b.free_gpu, b.free_cpu)
    pairs = tuple(zip(before, after, strict=True))
    return Preempted(p.mode, victim.status, *pairs)


def recompute_victim_restarts(c: Cfg, r0: Req, r1: Req, r2: Req) -> str:
    """A recompute victim ends waiting with no computed tokens and no blocks, GPU or host,
    its known tokens kept (outputs are replayed as prompt) and its GPU blocks freed.
    Returns what is wrong, or "".

    pre: r0.status == RUNNING and r1.status == RUNNING and r2.status == WAITING
    pre: consistent(c, [r0, r1, r2])
    post: __return__ == ""
    """
    p = preempt(c, [r0, r1, r2])
    if p.mode != "recompute":
        return ""
    if p.computed[1] != 0:
        return f"the victim keeps {p.computed[1]} computed tokens"
    if p.gpu[1] != 0 or p.host[1] != 0:
        return f"the victim keeps {p.gpu[1]} GPU and {p.host[1]} host blocks"
    if p.status != Status.WAITING:
        return f"the victim is {p.status}, not waiting"
    if p.free_gpu[1] != p.free_gpu[0] + p.gpu[0]:
        return f"{p.free_gpu[1] - p.free_gpu[0]} GPU blocks freed, not its {p.gpu[0]}"
    if p.known[1] != p.known[0]:
        return f"the victim's known tokens went from {p.known[0]} to {p.known[1]}"
    return ""


def swap_victim_moves_its_blocks(c: Cfg, r0: Req, r1: Req, r2: Req) -> str:
    """A swap victim moves exactly its G GPU blocks to host blocks and keeps C.
    Returns what is wrong, or "".

    pre: r0.status == RUNNING and r1.status == RUNNING and r2.status == WAITING
    pre: consistent(c, [r0, r1, r2])
    post: __return__ == ""
    """
    p = preempt(c, [r0, r1, r2])
    if p.mode != "swap":
        return ""
    if p.host[1] != p.gpu[0] or p.gpu[1] != 0:
        return f"G={p.gpu[0]} became {p.gpu[1]} GPU and {p.host[1]} host blocks"
    if p.computed[1] != p.computed[0]:
        return f"C went from {p.computed[0]} to {p.computed[1]}"
    if p.free_cpu[1] != p.free_cpu[0] - p.gpu[0]:
        return f"{p.free_cpu[0] - p.free_cpu[1]} host blocks taken, not {p.gpu[0]}"
    if p.status != Status.SWAPPED:
        return f"the victim is {p.status}, not swapped"
    return ""


def swap_out_then_in_restores(c: Cfg, r0: Req, r1: Req, r2: Req) -> str:
    """Swap out then swap in restores the state exactly: the victim's N, C, G and H, the
    free GPU and host counts, and which host blocks are free. Returns what differs, or "".

    pre: r0.status == RUNNING and r1.status == RUNNING and r2.status == WAITING
    pre: c.preemption == 1 and consistent(c, [r0, r1, r2])
    post: __return__ == ""
    """
    s, _ = build(c, [r0, r1, r2])
    victim = s.choose_victim()
    rid = victim.request.id
    b = s.blocks

    def snapshot() -> tuple[object, ...]:
        return (victim.status, victim.num_tokens, victim.num_computed, b.gpu_blocks(rid),
                b.host_blocks(rid), b.free_gpu, b.free_cpu, tuple(sorted(b.free_host_ids())))

    before = snapshot()
    s.running.remove(victim)
    if s.preempt(victim).mode != "swap":
        return ""  # no host room: a recompute, not this obligation
    s.victims.remove(victim)
    b.swap_in(rid)
    victim.status = Status.RUNNING
    after = snapshot()
    if after != before:
        return f"(status, N, C, G, H, free GPU, free host, host ids) {before} became {after}"
    return ""


__all__ = ["RUNNING", "WAITING", "consistent"]  # names the contracts use
