"""kvsched.reference: the plain scheduler that obeys the spec, and its block allocator.

Imports only kvsched.spec and the standard library (docs/architecture.md). Its knobs and
profiles are the spec's (kvsched.spec.knobs, kvsched.spec.profiles); its extension
points are listed in kvsched.reference.scheduler's docstring. A profile's `scheduler`
says whose step its rules are: vLLM v1's (ReferenceScheduler) or vLLM V0's (V0Scheduler,
kvsched.reference.v0); `scheduler_for` and `reference_scheduler` pick it.
"""

from kvsched.reference.allocator import BlockAllocator
from kvsched.reference.requests import LiveRequest, WaitingQueue
from kvsched.reference.scheduler import ReferenceScheduler, StepPlan
from kvsched.reference.v0 import V0Scheduler
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Config
from kvsched.spec.profiles import Profile, SchedulerKind, get_profile

__all__ = ["BlockAllocator", "LiveRequest", "ReferenceScheduler", "StepPlan", "V0Scheduler",
           "WaitingQueue", "reference_scheduler", "scheduler_for"]


def scheduler_for(config: Config, knobs: Knobs | None = None,
                  kind: SchedulerKind = "v1") -> ReferenceScheduler:
    """The reference scheduler of `kind` (a profile's `scheduler`: "v1", vLLM v1's step;
    "v0", vLLM V0's) on `config` with `knobs`."""
    if kind == "v0":
        return V0Scheduler(config, knobs)
    if kind != "v1":
        raise ValueError(f"scheduler must be one of v1, v0, got {kind!r}")
    return ReferenceScheduler(config, knobs)


def reference_scheduler(profile: Profile | str, config: Config) -> ReferenceScheduler:
    """The reference with `profile`'s knobs and scheduler (a Profile or its name) on
    `config` as given: configure the config with `profile.configure` first for the
    profile's defaults."""
    chosen = get_profile(profile) if isinstance(profile, str) else profile
    return scheduler_for(config, chosen.knobs, chosen.scheduler)
