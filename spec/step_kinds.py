"""What each step kind reads (docs/spec.md, What each step kind reads): the Config fields
its step honours, the values it honours where it honours only some, and its knob type.

A step kind is whose rules one scheduler step follows: vLLM v1's ("v1", the reference
with its knobs), vLLM V0's ("v0", kvsched.reference.v0), SGLang's ("sglang",
kvsched.reference.sglang) or LMDeploy's ("lmdeploy",
kvsched.reference.lmdeploy). A profile names one (Profile.scheduler). A config field a
kind does not read must hold the one value its step behaves as (SGLang's step keeps no
watermark: watermark_blocks 0); any other value would be silently ignored, so every tool
and every implementation refuses it through `refusal`, written here once. So are the
configs a kind's engine refuses at start-up (`starts`: vLLM's whole prefill that cannot
fit one step's budget, SGLang's chunk that is not a multiple of its page), which it never
runs: `refusal` says those too, after the ignored fields.

A kind's `settings` are its knobs that are an engine's options, which a user sets when
starting the engine (SGLang's --priority-scheduling-preemption-threshold): a trace's
header declares them (its "settings" object), and the profile's knobs replay that trace
with them (kvsched.spec.profiles.Profile.for_trace).

A knob of another kind's set away from its default would be silently ignored too: every
implementation refuses it through `knob_refusal`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Literal

from kvsched.spec.knobs import Knobs, LMDeployKnobs, SGLangKnobs, V0Knobs
from kvsched.spec.model import Config

# Whose rules a step is (a profile's `scheduler`).
SchedulerKind = Literal["v1", "v0", "sglang", "lmdeploy"]
KnobType = type[Knobs] | type[V0Knobs] | type[SGLangKnobs] | type[LMDeployKnobs]


@dataclass(frozen=True)
class StepKind:
    """One step kind. `reads`: the config fields whose every value its step honours;
    `takes`: every other config field, with the values it honours (the field's default
    alone where the step does not read it at all) and `why`, a clause saying why;
    `knobs`: its knob type, and `knob_fields` the fields of it the step reads (for
    SGLang's, Knobs.sglang's own); `settings`: those of them that are its engine's
    options (a trace's header may declare them), each with the option's name;
    `starts(config, knobs)`: why its engine refuses `config` under those knobs (the
    kind's part of them) at start-up, in one line, or None; `knobs_field`: where Knobs
    holds its knobs, "" for Knobs' own fields (vLLM v1's), else the field of Knobs that
    holds its type (V0Knobs in Knobs.v0, SGLangKnobs in Knobs.sglang, LMDeployKnobs in
    Knobs.lmdeploy)."""

    name: SchedulerKind
    engine: str
    reads: frozenset[str]
    takes: Mapping[str, tuple[object, ...]]
    why: Mapping[str, str]
    knobs: KnobType
    knob_fields: frozenset[str]
    starts: Callable[[Config, Knobs], str | None]
    settings: Mapping[str, str]
    knobs_field: str = ""

    def honours(self, name: str, value: object) -> bool:
        """Whether this step honours config field `name` at `value`."""
        return name in self.reads or value in self.takes.get(name, ())


def _all_but(*names: str) -> frozenset[str]:
    return frozenset(f.name for f in fields(Config)) - set(names)


def _all_fields(knobs: KnobType) -> frozenset[str]:
    return frozenset(f.name for f in fields(knobs))


_VLLM_STEPS = "vLLM's steps run decodes and prefills together"
_VLLM_PROMPTS = "vLLM's front end takes every prompt that max_model_len holds"


def _vllm_starts(config: Config, knobs: Knobs) -> str | None:
    """vLLM's start-up refusal (SchedulerConfig's check, V0's and v1's alike): without
    chunked prefill a whole prefill of max_model_len tokens must fit one step's budget."""
    if not config.chunked_prefill and config.max_num_batched_tokens < config.max_model_len:
        return ("vLLM refuses max_num_batched_tokens "
                f"{config.max_num_batched_tokens} below max_model_len "
                f"{config.max_model_len} without chunked prefill (a whole prefill must fit "
                "one step's budget): raise max_num_batched_tokens or turn chunked "
                "prefill on")
    return None


def _sglang_starts(config: Config, knobs: Knobs) -> str | None:
    """SGLang 0.5.23's start-up refusals of the settings kvsched drives it with
    (arg_groups/validation_hook.py:243-246, 303-306): a chunk that is not a whole
    number of pages, and retraction by priority without priority scheduling."""
    if config.chunked_prefill and config.max_num_batched_tokens % config.block_size:
        return ("SGLang refuses a chunked_prefill_size that is not a multiple of "
                f"page_size (\"chunked_prefill_size must be divisible by page_size\"): "
                f"max_num_batched_tokens {config.max_num_batched_tokens} with "
                f"block_size {config.block_size}")
    if knobs.sglang.retract_victim == "least_urgent" and config.policy != "priority":
        return ("SGLang refuses --retraction-policy priority without priority "
                "scheduling (\"--retraction-policy priority requires "
                "--enable-priority-scheduling\"): use policy priority")
    if knobs.sglang.max_prefill_tokens < 1:
        return ("SGLang's max_prefill_tokens must be at least 1, got "
                f"{knobs.sglang.max_prefill_tokens}")
    return None


# What vLLM's and SGLang's steps take of the fields only LMDeploy's reads: no blocks
# beyond a chunk's own tokens, no pipelining, no lazy preemption.
_NOT_PIPELINED: dict[str, tuple[object, ...]] = {
    "prealloc_tokens": (0,), "pipelined": (False,),
    "preemption": ("recompute", "swap", "auto")}


def _not_pipelined(engine: str, pipelined: str | None = None) -> dict[str, str]:
    """Why vLLM's steps (`engine`) take only those values (SGLang's says its own
    preemption); `pipelined`, why not pipelined where the engine can be."""
    return {"prealloc_tokens": f"{engine} hands out no blocks beyond a chunk's own tokens",
            "pipelined": pipelined or f"{engine} applies a step's output before deciding "
                                      "the next step",
            "preemption": f"{engine}'s victims release their blocks at once"}


def _lmdeploy_starts(config: Config, knobs: Knobs) -> str | None:
    """What LMDeploy 0.18.0 cannot run as the spec says it: a decode forward runs every
    running request outside max_prefill_token_num, so a config whose seats exceed the
    token budget would see decode steps over it; its preallocation is prefill_interval
    tokens, which config prealloc_tokens must declare; and its knobs' ranges
    (SchedulerConfig, the LMDEPLOY_PT_TTFT_* variables as it clamps them)."""
    rules = knobs.lmdeploy
    if config.max_num_seqs > config.max_num_batched_tokens:
        return ("LMDeploy's decode forward runs every running request outside "
                "max_prefill_token_num: max_num_seqs (max_batches) "
                f"{config.max_num_seqs} above max_num_batched_tokens "
                f"{config.max_num_batched_tokens} would let a decode step exceed the "
                "token budget; lower max_num_seqs or raise max_num_batched_tokens")
    if rules.prefill_interval < 1:
        return f"LMDeploy's prefill_interval must be at least 1, got {rules.prefill_interval}"
    declared = getattr(config, "prealloc_tokens", rules.prefill_interval)
    if declared != rules.prefill_interval:
        return (f"LMDeploy preallocates prefill_interval ({rules.prefill_interval}) tokens "
                f"beyond a request's known ones, but config prealloc_tokens is {declared}: "
                "they must agree")
    if rules.short_turns < 1:
        return f"LMDeploy's short_turns must be at least 1, got {rules.short_turns}"
    if not rules.aging_seconds >= 0.001:
        return ("LMDeploy's aging_seconds must be at least 0.001 (LMDEPLOY_PT_TTFT_AGING_SEC "
                f"is clamped so), got {rules.aging_seconds}")
    if not rules.step_seconds >= 0:
        return f"LMDeploy's step_seconds must not be negative, got {rules.step_seconds}"
    if rules.release_delay < 1:
        return ("LMDeploy's release_delay must be at least 1 (a session ends after its "
                f"request's last output), got {rules.release_delay}")
    return None


_LMDEPLOY_WHY = {
    "step_mix": "LMDeploy's forwards run prefills or decodes, never both",
    "chunked_prefill": "LMDeploy always splits a prompt above max_prefill_token_num into "
                       "chunks",
    "policy": "LMDeploy has no priority scheduling: arrival order and prompt sizes only",
    "preemption": "LMDeploy preempts by recompute, lazily: a victim keeps its blocks until "
                  "they are reclaimed",
    "num_cpu_blocks": "LMDeploy 0.18 has no swap (eviction_type copy maps to recompute)",
    "watermark_blocks": "LMDeploy keeps no watermark",
    "watermark_scope": "LMDeploy keeps no watermark",
    "allocation": "LMDeploy hands out blocks as chunks need them, with prealloc_tokens more",
    "long_prefill_token_threshold": "LMDeploy chunks only at max_prefill_token_num",
    "first_block_id": "LMDeploy's block ids start at 0",
    "pipelined": "LMDeploy's engine loop decides each forward before applying the last "
                 "one's output",
}

STEP_KINDS: dict[SchedulerKind, StepKind] = {
    "v1": StepKind(
        "v1", "vLLM v1", _all_but("step_mix", "max_prompt_len", *_NOT_PIPELINED),
        {"step_mix": ("any",), "max_prompt_len": (0,), **_NOT_PIPELINED},
        {"step_mix": _VLLM_STEPS, "max_prompt_len": _VLLM_PROMPTS,
         **_not_pipelined("vLLM", "the profile models vLLM without async scheduling, "
                                  "which decides a step before it applies the last one's "
                                  "output; a trace of it is checked at the MUST level "
                                  "only")},
        Knobs, _all_fields(Knobs) - {"v0", "sglang", "lmdeploy"}, _vllm_starts, {}),
    # V0's step fixes the victim and when swapped and waiting requests are admitted, and
    # caps no chunk (its cap needs max_num_partial_prefills > 1): kvsched.reference.v0.
    # Its rules are V0Knobs.
    "v0": StepKind(
        "v0", "vLLM V0", _all_but("step_mix", "long_prefill_token_threshold",
                                  "max_prompt_len", *_NOT_PIPELINED),
        {"step_mix": ("any",), "long_prefill_token_threshold": (0,), "max_prompt_len": (0,),
         **_NOT_PIPELINED},
        {"step_mix": _VLLM_STEPS, "max_prompt_len": _VLLM_PROMPTS,
         **_not_pipelined("vLLM V0"),
         "long_prefill_token_threshold": "V0 has no per-chunk long-prefill threshold"},
        V0Knobs, _all_fields(V0Knobs), _vllm_starts, {}, knobs_field="v0"),
    "sglang": StepKind(
        "sglang", "SGLang",
        _all_but("step_mix", "preemption", "num_cpu_blocks", "allocation",
                 "watermark_blocks", "watermark_scope", "long_prefill_token_threshold",
                 "prealloc_tokens", "pipelined"),
        {"step_mix": ("prefill_or_decode", "mixed_chunk"), "preemption": ("recompute",),
         "num_cpu_blocks": (0,), "allocation": ("lazy",), "watermark_blocks": (0,),
         "watermark_scope": ("running",), "long_prefill_token_threshold": (0,),
         "prealloc_tokens": (0,), "pipelined": (False,)},
        {"step_mix": "SGLang's steps run prefill work or decodes, or with "
                     "--enable-mixed-chunk decodes joining a chunked prefill",
         "preemption": "SGLang retracts by recompute and has no swap space",
         "num_cpu_blocks": "SGLang retracts by recompute and has no swap space",
         "allocation": "SGLang hands out pages as tokens fill them",
         "watermark_blocks": "SGLang keeps no watermark",
         "watermark_scope": "SGLang keeps no watermark",
         "long_prefill_token_threshold": "SGLang has no long-prefill threshold",
         "prealloc_tokens": "SGLang hands out no pages beyond a chunk's own tokens",
         "pipelined": "SGLang applies a step's output before deciding the next step"},
        SGLangKnobs, _all_fields(SGLangKnobs), _sglang_starts,
        {"max_prefill_tokens": "--max-prefill-tokens",
         "priority_preemption_threshold": "--priority-scheduling-preemption-threshold",
         "higher_priority_first": "--schedule-low-priority-values-first",
         "retract_victim": "--retraction-policy"}, knobs_field="sglang"),
    "lmdeploy": StepKind(
        "lmdeploy", "LMDeploy",
        _all_but(*_LMDEPLOY_WHY),
        {"step_mix": ("prefill_or_decode",), "chunked_prefill": (True,),
         "policy": ("fcfs",), "preemption": ("lazy",), "num_cpu_blocks": (0,),
         "watermark_blocks": (0,), "watermark_scope": ("running",), "allocation": ("lazy",),
         "long_prefill_token_threshold": (0,), "first_block_id": (0,), "pipelined": (True,)},
        _LMDEPLOY_WHY,
        LMDeployKnobs, _all_fields(LMDeployKnobs), _lmdeploy_starts,
        {"prefill_interval": "prefill_interval", "step_seconds": "step_seconds",
         "aging_seconds": "LMDEPLOY_PT_TTFT_AGING_SEC",
         "short_turns": "LMDEPLOY_PT_TTFT_SHORT_TURNS",
         "ttft_policy": "LMDEPLOY_PT_TTFT_POLICY",
         "enable_chunked_prefill": "enable_chunked_prefill"}, knobs_field="lmdeploy"),
}
SCHEDULER_KINDS: tuple[SchedulerKind, ...] = tuple(STEP_KINDS)


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def knobs_read(kind: SchedulerKind, knobs: Knobs
               ) -> Knobs | V0Knobs | SGLangKnobs | LMDeployKnobs:
    """The knobs step kind `kind` reads out of `knobs`: Knobs' own fields (vLLM v1's, so
    `knobs` itself), knobs.v0 (vLLM V0's), knobs.sglang (SGLang's) or knobs.lmdeploy
    (LMDeploy's)."""
    where = STEP_KINDS[kind].knobs_field
    read: Knobs | V0Knobs | SGLangKnobs | LMDeployKnobs = (getattr(knobs, where) if where
                                                           else knobs)
    return read


def knobs_set(knobs: Knobs) -> list[tuple[SchedulerKind, str, object]]:
    """Every knob `knobs` sets away from its default (Knobs()'s): the step kind that
    reads it, its name as Knobs spells it (victim, v0.grow_check, sglang.decay) and its
    value, kind by kind in STEP_KINDS' order, each in its type's field order."""
    default = Knobs()
    out: list[tuple[SchedulerKind, str, object]] = []
    for kind, step in STEP_KINDS.items():
        mine, base = knobs_read(kind, knobs), knobs_read(kind, default)
        prefix = f"{step.knobs_field}." if step.knobs_field else ""
        out += [(kind, prefix + f.name, getattr(mine, f.name)) for f in fields(step.knobs)
                if f.name in step.knob_fields
                and getattr(mine, f.name) != getattr(base, f.name)]
    return out


def knob_refusal(kind: SchedulerKind, knobs: Knobs) -> str | None:
    """Why step kind `kind` cannot run `knobs`, in one line: the first knob of another
    kind's set away from its default, which `kind`'s step would silently ignore, whose
    it is and where `kind`'s own knobs are; None when there is none.

    post: (__return__ is None) == all(k == kind for k, _, _ in knobs_set(knobs))
    """
    for owner, name, value in knobs_set(knobs):
        if owner != kind:
            return _not_read(kind, owner, name, value)
    return None


def knob_option_refusal(kind: SchedulerKind, name: str, value: object) -> str | None:
    """Why step kind `kind` refuses knob `name` set to `value` by name (a command's
    option, whatever its default), in one line as `knob_refusal` says it; None when
    `kind`'s knob type has that field."""
    if name in STEP_KINDS[kind].knob_fields:
        return None
    owner = next(k for k, step in STEP_KINDS.items() if name in step.knob_fields)
    where = STEP_KINDS[owner].knobs_field
    return _not_read(kind, owner, f"{where}.{name}" if where else name, value)


def _not_read(kind: SchedulerKind, owner: SchedulerKind, name: str, value: object) -> str:
    step = STEP_KINDS[kind]
    own = (f"{step.knobs.__name__} (Knobs.{step.knobs_field})" if step.knobs_field
           else "Knobs' own fields")
    return (f"{step.engine}'s step does not read knob {name} {_shown(value)}, a rule of "
            f"{STEP_KINDS[owner].engine}'s step: its knobs are {own}")


def ignored_fields(kind: SchedulerKind, config: Config) -> list[str]:
    """The config fields whose value in `config` step kind `kind` does not honour, in
    Config's order."""
    step = STEP_KINDS[kind]
    return [f.name for f in fields(Config) if not step.honours(f.name, getattr(config, f.name))]


def refusal(kind: SchedulerKind, config: Config, source: str | None = None,
            knobs: Knobs | None = None) -> str | None:
    """Why step kind `kind` cannot run `config`, in one line: the first field whose value
    it does not honour, the values it takes, and why; else why its engine refuses
    `config` (with `knobs`, by default the kinds' defaults) at start-up; None when it
    honours them all and its engine starts. `source`, when given, says where `config`
    comes from ("the trace's header has"), and the line says what that source has
    instead of what to use.

    post: (__return__ is None) <= (not ignored_fields(kind, config))
    """
    ignored = ignored_fields(kind, config)
    step = STEP_KINDS[kind]
    if not ignored:
        return step.starts(config, knobs if knobs is not None else Knobs())
    name = ignored[0]
    took = " or ".join(_shown(v) for v in step.takes[name])
    value = _shown(getattr(config, name))
    if source is not None:
        return (f"{source} {name} {value}, which {step.engine}'s step does not honour "
                f"({step.why[name]}; it takes {name} {took})")
    return (f"{step.engine}'s step does not honour {name} {value}: {step.why[name]}; "
            f"use {name} {took}")
