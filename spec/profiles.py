"""Named profiles (docs/spec.md section 8): a set of knobs, and the config defaults that
go with them. A profile is a value; the scheduler that replays one lives with its
implementation (kvsched.reference.reference_scheduler).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Config, PreemptionMode


@dataclass(frozen=True)
class ConfigDefaults:
    """Config fields a profile sets unless the user gives them; None and False leave the
    field as it is.

    preemption: the preemption mode.
    watermark_fraction: watermark_blocks = int(fraction * num_gpu_blocks), as vLLM V0
        computes its watermark.
    host_blocks_as_gpu: num_cpu_blocks = num_gpu_blocks (as much swap space as cache).
    prefix_caching: prefix caching on or off.
    """

    preemption: PreemptionMode | None = None
    watermark_fraction: float | None = None
    host_blocks_as_gpu: bool = False
    prefix_caching: bool | None = None

    def apply(self, config: Config, given: frozenset[str] = frozenset()) -> Config:
        """`config` with these defaults for every field not in `given`, each computed from
        `config` as it comes in."""
        out = config
        if self.preemption is not None and "preemption" not in given:
            out = replace(out, preemption=self.preemption)
        if self.watermark_fraction is not None and "watermark_blocks" not in given:
            out = replace(out, watermark_blocks=int(self.watermark_fraction
                                                    * config.num_gpu_blocks))
        if self.host_blocks_as_gpu and "num_cpu_blocks" not in given:
            out = replace(out, num_cpu_blocks=config.num_gpu_blocks)
        if self.prefix_caching is not None and "prefix_caching" not in given:
            out = replace(out, prefix_caching=self.prefix_caching)
        return out

    def describe(self) -> str:
        """One line for `kvsched profiles`, or "-" when the profile sets nothing."""
        parts = []
        if self.preemption is not None:
            parts.append(f"preemption={self.preemption}")
        if self.watermark_fraction is not None:
            parts.append(f"watermark_blocks={self.watermark_fraction:.0%} of num_gpu_blocks")
        if self.host_blocks_as_gpu:
            parts.append("num_cpu_blocks=num_gpu_blocks")
        if self.prefix_caching is not None:
            parts.append(f"prefix_caching={'on' if self.prefix_caching else 'off'}")
        return ", ".join(parts) or "-"


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    knobs: Knobs
    defaults: ConfigDefaults = field(default_factory=ConfigDefaults)

    def configure(self, config: Config, given: frozenset[str] = frozenset()) -> Config:
        """`config` with this profile's defaults for every field not in `given`."""
        return self.defaults.apply(config, given)


# vLLM's v1 scheduler, release by release: each profile is checked against traces of
# that release's own Scheduler (docs/conformance/vllm.md). 0.33 goes on with the running
# pass after a request preempts itself (vllm/v1/core/sched/scheduler.py 0.33:983-992;
# 0.32 stops there, 0.32:842-848).
VLLM_V1_032 = Knobs(victim="policy", admit_after_preempt=False, reserve_full_sequence=True,
                    lift_threshold_when_alone=True)
VLLM_V1_033 = replace(VLLM_V1_032, continue_after_self_preemption=True)
VLLM_V1_RELEASES = {"0.32": VLLM_V1_032, "0.33": VLLM_V1_033}
VLLM_V1_NEWEST = "0.33"
VLLM_V1 = VLLM_V1_RELEASES[VLLM_V1_NEWEST]

_V1_RULES = ("running first, preempt the tail (fcfs) or the lowest priority by recompute, "
             "no admission in a step that preempted, admission needs the whole sequence "
             "to fit, threshold lifted when alone, prefix caching on (vLLM's default)")

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "vllm-v1",
            f"vLLM's v1 scheduler as of its newest checked release, {VLLM_V1_NEWEST} "
            f"(vllm-v1@{VLLM_V1_NEWEST})",
            VLLM_V1,
            ConfigDefaults(prefix_caching=True),
        ),
        Profile(
            "vllm-v1@0.32",
            f"vLLM 0.32's v1 scheduler: {_V1_RULES}; the running pass stops when a request "
            "preempts itself",
            VLLM_V1_032,
            ConfigDefaults(prefix_caching=True),
        ),
        Profile(
            "vllm-v1@0.33",
            "vLLM 0.33's v1 scheduler: as 0.32, except that the running pass goes on "
            "after a request preempts itself (under priority the requests after it rank "
            "above it)",
            VLLM_V1_033,
            ConfigDefaults(prefix_caching=True),
        ),
        Profile(
            "vllm-v1-no-prefix-caching",
            "vllm-v1 with prefix caching off (vLLM's --no-enable-prefix-caching)",
            VLLM_V1,
            ConfigDefaults(prefix_caching=False),
        ),
        Profile(
            "vllm-v0-swap",
            "vLLM v0 style with swapping: preempt the tail by swapping to host blocks, "
            "swap back in before new admissions, no swap-in or admission in a step that "
            "swapped out, a 1% watermark, admission checks only the first chunk",
            Knobs(victim="policy", admit_after_preempt=False, reserve_full_sequence=False,
                  lift_threshold_when_alone=False),
            ConfigDefaults(preemption="swap", watermark_fraction=0.01,
                           host_blocks_as_gpu=True),
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


def pinned_profile(name: str, engine: str, version: str) -> str | None:
    """The profile pinned to the release of `engine` that recorded a trace, when `name`
    is a profile that follows releases and names none: vllm-v1 and vLLM 0.32.1 give
    vllm-v1@0.32. None when there is no such profile (or `name` pins one already)."""
    if "@" in name or engine != "vllm":
        return None
    release = ".".join(version.split(".")[:2])
    pinned = f"{name}@{release}"
    return pinned if pinned in PROFILES else None


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None
