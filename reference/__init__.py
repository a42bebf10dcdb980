"""kvsched.reference: the plain scheduler that obeys the spec, and its block allocator.

Imports only kvsched.spec and the standard library (docs/architecture.md). Its knobs and
profiles are the spec's (kvsched.spec.knobs, kvsched.spec.profiles); its extension
points are listed in kvsched.reference.scheduler's docstring.
"""

from kvsched.reference.allocator import BlockAllocator
from kvsched.reference.requests import LiveRequest, WaitingQueue
from kvsched.reference.scheduler import ReferenceScheduler, StepPlan, reference_scheduler

__all__ = ["BlockAllocator", "LiveRequest", "ReferenceScheduler", "StepPlan", "WaitingQueue",
           "reference_scheduler"]
