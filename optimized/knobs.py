"""The policy knobs the optimized scheduler reads, as protocols.

kvsched.optimized never imports the reference package (design.md section 1), yet it must
obey every knob and profile the reference has. So it reads knobs through these
protocols: the reference's `Knobs` and `CostModel` (or any object with the same
fields) can be passed as they are, and the profiles' knobs apply unchanged.
`VLLM_V1` is the default: vLLM 0.32's choices, as the reference's default Knobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

VICTIM_RULES: tuple[str, ...] = ("policy", "tail", "lowest_priority")


class CostLike(Protocol):
    """What `auto` preemption asks: swap a victim when moving its blocks both ways
    costs less than recomputing its computed tokens."""

    def prefers_swap(self, blocks: int, computed_tokens: int) -> bool: ...


class KnobsLike(Protocol):
    """The reference's knobs (the reference's Knobs) by their fields."""

    @property
    def victim(self) -> str: ...

    @property
    def admit_after_preempt(self) -> bool: ...

    @property
    def reserve_full_sequence(self) -> bool: ...

    @property
    def lift_threshold_when_alone(self) -> bool: ...

    @property
    def cost(self) -> CostLike: ...


@dataclass(frozen=True)
class LinkCost:
    """A Llama-3-8B-like KV block (2 MiB), a 25 GB/s host link, 10k prefill tokens/s."""

    bytes_per_block: int = 2 * 32 * 8 * 128 * 2 * 16
    host_bandwidth: float = 25e9
    prefill_tokens_per_s: float = 10_000.0

    def prefers_swap(self, blocks: int, computed_tokens: int) -> bool:
        swap_seconds = 2 * blocks * self.bytes_per_block / self.host_bandwidth
        return swap_seconds < computed_tokens / self.prefill_tokens_per_s


@dataclass(frozen=True)
class PolicyKnobs:
    """Knobs with vLLM 0.32's defaults (see KnobsLike for their meaning)."""

    victim: str = "policy"
    admit_after_preempt: bool = False
    reserve_full_sequence: bool = True
    lift_threshold_when_alone: bool = True
    cost: LinkCost = field(default_factory=LinkCost)


VLLM_V1 = PolicyKnobs()


def knob_problems(knobs: KnobsLike) -> list[str]:
    if knobs.victim not in VICTIM_RULES:
        return [f"victim must be one of {', '.join(VICTIM_RULES)}, got {knobs.victim!r}"]
    return []
