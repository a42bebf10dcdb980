"""kvsched.spec: the law. Model, transition rule, invariants, trace format, checker.

Standard library only (docs/architecture.md), so that CrossHair can reason about it
and it reads like the maths in docs/spec.md.
"""

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

__all__ = [
    "INVARIANTS", "MUST", "PROFILE", "SHOULD", "CheckOptions", "Checker", "Config",
    "Decision", "Header", "Preemption", "Rejection", "Report", "Request", "RequestView",
    "Scheduler", "Status", "StepRecord", "TraceError", "TraceReader", "TraceWriter",
    "Violation", "blocks_for", "blocks_needed", "cdiv", "check_steps", "check_trace",
    "never_completes",
]
