"""kvsched.optimized: the reference's decisions on torch tensors, and a vectorized checker.

Imports kvsched.spec (its knobs and profiles included), torch and numpy, never the
reference package (docs/architecture.md).
The scheduler's names load torch on first use only, so that the vectorized checker
(kvsched.optimized.checker, numpy) can be imported without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvsched.optimized.scheduler import StepTensors, TorchScheduler

_WHERE = {"TorchScheduler": "scheduler", "StepTensors": "scheduler"}

__all__ = ["StepTensors", "TorchScheduler"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"kvsched.optimized.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'kvsched.optimized' has no attribute {name!r}")
