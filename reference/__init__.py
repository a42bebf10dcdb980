"""kvsched.reference: the plain scheduler that obeys the spec, and its block allocator.

Imports only kvsched.spec and the standard library (design.md section 1). Its knobs and
profiles are the spec's (kvsched.spec.knobs, kvsched.spec.profiles).
"""

from kvsched.reference.allocator import BlockAllocator
from kvsched.reference.scheduler import ReferenceScheduler, reference_scheduler

__all__ = ["BlockAllocator", "ReferenceScheduler", "reference_scheduler"]
