"""The changes audited in docs/audit.md. The first: vLLM v1's policy, but waiting requests may be
admitted in a step that preempted (as Sarathi-Serve does).

    PYTHONPATH=docs kvsched diff vllm-v1 audit_change:admit_after_preempt
"""

from __future__ import annotations

from dataclasses import replace

from kvsched.reference import ReferenceScheduler
from kvsched.spec import Config
from kvsched.spec.profiles import get_profile
from kvsched.testing.seeded_bugs import OverAdmitByOneBlock


def admit_after_preempt(config: Config) -> ReferenceScheduler:
    """The vllm-v1 profile's knobs with one flipped: admit after preempting."""
    knobs = replace(get_profile("vllm-v1").knobs, admit_after_preempt=True)
    return ReferenceScheduler(config, knobs)


def over_admits(config: Config) -> ReferenceScheduler:
    """A change with a bug: the admission check counts one block too few
    (kvsched.testing.seeded_bugs' over-admit-by-one-block, under vllm-v1's knobs)."""
    return OverAdmitByOneBlock(config, get_profile("vllm-v1").knobs)
