"""kvsched.optimized: the reference's decisions on torch tensors, and a vectorized checker.

Imports kvsched.spec, torch and numpy, never the reference package (design.md section 1).
The scheduler's names load torch on first use only, so that the vectorized checker
(kvsched.optimized.checker, numpy) can be imported without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvsched.optimized.knobs import VLLM_V1, CostLike, KnobsLike, LinkCost, PolicyKnobs
    from kvsched.optimized.scheduler import OptimizedScheduler, StepTensors

_WHERE = {"VLLM_V1": "knobs", "CostLike": "knobs", "KnobsLike": "knobs", "LinkCost": "knobs",
          "PolicyKnobs": "knobs", "OptimizedScheduler": "scheduler", "StepTensors": "scheduler"}

__all__ = ["VLLM_V1", "CostLike", "KnobsLike", "LinkCost", "OptimizedScheduler",
           "PolicyKnobs", "StepTensors"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"kvsched.optimized.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'kvsched.optimized' has no attribute {name!r}")
