"""kvsched.reference: the plain scheduler that obeys the spec, and its block allocator.

Imports only kvsched.spec and the standard library (docs/architecture.md). Its knobs and
profiles are the spec's (kvsched.spec.knobs, kvsched.spec.profiles); its extension
points are listed in kvsched.reference.scheduler's docstring. A profile's `scheduler`
says whose step its rules are: vLLM v1's (ReferenceScheduler), vLLM V0's (V0Scheduler,
kvsched.reference.v0), SGLang's (SGLangScheduler) or LMDeploy's (LMDeployScheduler,
kvsched.reference.lmdeploy); `scheduler_for` and `reference_scheduler` pick it.
"""

from kvsched.reference.allocator import BlockAllocator
from kvsched.reference.lmdeploy import LMDeployScheduler
from kvsched.reference.requests import LiveRequest, WaitingQueue
from kvsched.reference.scheduler import ReferenceScheduler, StepPlan
from kvsched.reference.sglang import SGLangScheduler
from kvsched.reference.v0 import V0Scheduler
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Config
from kvsched.spec.profiles import Profile, get_profile
from kvsched.spec.step_kinds import STEP_KINDS, SchedulerKind, knob_refusal, refusal

__all__ = ["BlockAllocator", "LMDeployScheduler", "LiveRequest", "ReferenceScheduler",
           "SGLangScheduler", "StepPlan",
           "V0Scheduler",
           "WaitingQueue", "reference_scheduler", "scheduler_for"]


def scheduler_for(config: Config, knobs: Knobs | None = None, kind: SchedulerKind = "v1"
                  ) -> ReferenceScheduler | SGLangScheduler | LMDeployScheduler:
    """The reference scheduler of `kind` (a profile's `scheduler`: "v1", vLLM v1's step;
    "v0", vLLM V0's; "sglang", SGLang's; "lmdeploy", LMDeploy's) on `config` with
    `knobs`. ValueError for a config with a field the kind's step does not honour
    (kvsched.spec.step_kinds.refusal), or knobs that set one of another kind's
    (knob_refusal)."""
    if kind not in STEP_KINDS:
        raise ValueError(f"scheduler must be one of {', '.join(STEP_KINDS)}, got {kind!r}")
    why = refusal(kind, config, knobs=knobs) or knob_refusal(kind, knobs or Knobs())
    if why is not None:
        raise ValueError(why)
    if kind == "sglang":
        return SGLangScheduler(config, knobs)
    if kind == "lmdeploy":
        return LMDeployScheduler(config, knobs)
    if kind == "v0":
        return V0Scheduler(config, knobs)
    return ReferenceScheduler(config, knobs)


def reference_scheduler(profile: Profile | str, config: Config
                        ) -> ReferenceScheduler | SGLangScheduler | LMDeployScheduler:
    """The reference with `profile`'s knobs and scheduler (a Profile or its name) on
    `config` as given: configure the config with `profile.configure` first for the
    profile's defaults."""
    chosen = get_profile(profile) if isinstance(profile, str) else profile
    return scheduler_for(config, chosen.knobs, chosen.scheduler)
