"""Named profiles: a set of knobs, and the config defaults that go with them."""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvsched.reference.knobs import Knobs
from kvsched.reference.scheduler import ReferenceScheduler
from kvsched.spec.model import Config


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    knobs: Knobs
    # Config fields the profile sets unless the user gives them.
    config_defaults: tuple[tuple[str, object], ...] = ()

    def configure(self, config: Config, given: frozenset[str] = frozenset()) -> Config:
        """`config` with this profile's defaults for every field not in `given`."""
        changes = {k: v for k, v in self.config_defaults if k not in given}
        if "watermark_blocks" in changes and changes["watermark_blocks"] == "1%":
            changes["watermark_blocks"] = config.num_gpu_blocks // 100
        if "num_cpu_blocks" in changes and changes["num_cpu_blocks"] == "same":
            changes["num_cpu_blocks"] = config.num_gpu_blocks
        return replace(config, **changes)  # type: ignore[arg-type]

    def scheduler(self, config: Config) -> ReferenceScheduler:
        return ReferenceScheduler(config, self.knobs)


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "vllm-v1",
            "vLLM 0.32's v1 scheduler: running first, preempt the tail (fcfs) or the "
            "lowest priority by recompute, no admission in a step that preempted, "
            "admission needs the whole sequence to fit, threshold lifted when alone",
            Knobs(victim="policy", admit_after_preempt=False, reserve_full_sequence=True,
                  lift_threshold_when_alone=True),
        ),
        Profile(
            "vllm-v0-swap",
            "vLLM v0 style with swapping: preempt the tail by swapping to host blocks, "
            "swap back in before new admissions, no swap-in or admission in a step that "
            "swapped out, a 1% watermark, admission checks only the first chunk",
            Knobs(victim="policy", admit_after_preempt=False, reserve_full_sequence=False,
                  lift_threshold_when_alone=False),
            (("preemption", "swap"), ("watermark_blocks", "1%"), ("num_cpu_blocks", "same")),
        ),
        Profile(
            "sarathi",
            "Sarathi-Serve style: decodes and partial prefills first, new prefills fill the "
            "chunk budget, preempt the tail by recompute, admit after preempting",
            Knobs(victim="tail", admit_after_preempt=True, reserve_full_sequence=False,
                  lift_threshold_when_alone=False),
        ),
    )
}

DEFAULT_PROFILE = "vllm-v1"


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None
