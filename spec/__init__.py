"""kvsched.spec: the law. Model, transition rule, invariants, trace format, checker.

Standard library only (docs/architecture.md), so that CrossHair can reason about it
and it reads like the maths in docs/spec.md.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvsched.spec.blocks import blocks_for, blocks_needed, cdiv, never_completes
    from kvsched.spec.checker import Checker, CheckOptions, Report, check_steps, check_trace
    from kvsched.spec.interface import Scheduler
    from kvsched.spec.model import (
        Config,
        Decision,
        Preemption,
        Rejection,
        Request,
        RequestView,
        Status,
        StepRecord,
    )
    from kvsched.spec.trace import Header, TraceError, TraceReader, TraceWriter
    from kvsched.spec.violation import INVARIANTS, MUST, PROFILE, SHOULD, Violation

# Where each name lives: importing kvsched.spec.model (say) loads only what it needs,
# not the checker (a short command's start-up is made of such imports).
_WHERE = {
    **dict.fromkeys(("blocks_for", "blocks_needed", "cdiv", "never_completes"), "blocks"),
    **dict.fromkeys(("Checker", "CheckOptions", "Report", "check_steps", "check_trace"),
                    "checker"),
    "Scheduler": "interface",
    **dict.fromkeys(("Config", "Decision", "Preemption", "Rejection", "Request", "RequestView",
                     "Status", "StepRecord"), "model"),
    **dict.fromkeys(("Header", "TraceError", "TraceReader", "TraceWriter"), "trace"),
    **dict.fromkeys(("INVARIANTS", "MUST", "PROFILE", "SHOULD", "Violation"), "violation"),
}

__all__ = [
    "INVARIANTS", "MUST", "PROFILE", "SHOULD", "CheckOptions", "Checker", "Config",
    "Decision", "Header", "Preemption", "Rejection", "Report", "Request", "RequestView",
    "Scheduler", "Status", "StepRecord", "TraceError", "TraceReader", "TraceWriter",
    "Violation", "blocks_for", "blocks_needed", "cdiv", "check_steps", "check_trace",
    "never_completes",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"kvsched.spec.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'kvsched.spec' has no attribute {name!r}")
