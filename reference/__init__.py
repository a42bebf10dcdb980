"""kvsched.reference: the plain scheduler that obeys the spec, with knobs and profiles.

Imports only kvsched.spec and the standard library (design.md section 1).
"""

from kvsched.reference.allocator import BlockAllocator
from kvsched.reference.knobs import CostModel, Knobs
from kvsched.reference.profiles import DEFAULT_PROFILE, PROFILES, Profile, get_profile
from kvsched.reference.scheduler import ReferenceScheduler

__all__ = ["DEFAULT_PROFILE", "PROFILES", "BlockAllocator", "CostModel", "Knobs", "Profile",
           "ReferenceScheduler", "get_profile"]
