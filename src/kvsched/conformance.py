"""Checking a stream of steps, the one way every part of the tool does it.

`checker()` builds the spec's Checker with the options a user gives (strict, the
no-thrash limit, a profile). The spec defines what equal decisions are
(kvsched.spec.replay); the tool supplies the profile's replaying scheduler: the
reference scheduler of the profile's step with its knobs
(kvsched.implementations.profile_scheduler). `kvsched check`, `kvsched fuzz`, the pytest
plugin, the docs and the vLLM conformance run all check through here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kvsched.implementations import profile_scheduler
from kvsched.spec import should
from kvsched.spec.checker import Checker, CheckOptions, Report
from kvsched.spec.model import Config, StepRecord
from kvsched.spec.profiles import get_profile
from kvsched.spec.replay import ProfileReplay, describe, describe_state
from kvsched.spec.trace import TraceReader
from kvsched.spec.violation import Violation

__all__ = ["check_profile", "check_reader", "check_records", "checker", "describe",
           "describe_state", "profile_replay"]


def profile_replay(config: Config, profile: str, preempted_order: bool = True,
                   settings: Mapping[str, object] | None = None) -> ProfileReplay:
    """The named profile's scheduler on `config`, ready to replay a trace (whose header
    says whether its victims are in preemption order, and which engine settings its
    knobs take: Profile.for_trace, SettingsError if it cannot take them)."""
    chosen = get_profile(profile).for_trace(settings or {})
    return ProfileReplay(profile, profile_scheduler(chosen, config), preempted_order)


def checker(config: Config, *, profile: str | None = None, strict: bool = False,
            max_preemptions: int = should.DEFAULT_MAX_PREEMPTIONS, keep: int = 20,
            required: Iterable[str] = (), preempted_order: bool = True,
            stall_steps: int = should.DEFAULT_STALL_STEPS,
            starve_steps: int = should.DEFAULT_STARVE_STEPS,
            settings: Mapping[str, object] | None = None) -> Checker:
    """A checker of one trace under `config`, comparing with `profile` when given (its
    knobs with the engine `settings` the trace's header declares); feed it the steps,
    then `end(complete)` gives the whole report."""
    replay = profile_replay(config, profile, preempted_order, settings) if profile else None
    return Checker(config, CheckOptions(strict, max_preemptions, keep, frozenset(required),
                                        stall_steps, starve_steps), replay, preempted_order)


def check_records(config: Config, records: Iterable[StepRecord], complete: bool, *,
                  profile: str | None = None, strict: bool = False,
                  max_preemptions: int = should.DEFAULT_MAX_PREEMPTIONS) -> Report:
    """The whole report of a sequence of steps (`complete`: it had its end line)."""
    return checker(config, profile=profile, strict=strict,
                   max_preemptions=max_preemptions).run(records, complete)


def check_reader(reader: TraceReader, *, profile: str | None = None, strict: bool = False,
                 max_preemptions: int = should.DEFAULT_MAX_PREEMPTIONS,
                 stall_steps: int = should.DEFAULT_STALL_STEPS,
                 starve_steps: int = should.DEFAULT_STARVE_STEPS) -> Report:
    """The whole report of a trace as it streams from `reader` (TraceError if malformed)."""
    return checker(reader.header.config, profile=profile, strict=strict,
                   max_preemptions=max_preemptions,
                   preempted_order=reader.header.preempted_order,
                   stall_steps=stall_steps, starve_steps=starve_steps,
                   settings=reader.header.settings).run_trace(reader)


def check_profile(config: Config, records: Iterable[StepRecord], profile: str
                  ) -> list[Violation]:
    """The first step where the records and the profile decide differently, if any."""
    replay = profile_replay(config, profile)
    for rec in records:
        if replay.step(rec) is not None:
            break
    return [replay.divergence] if replay.divergence is not None else []
