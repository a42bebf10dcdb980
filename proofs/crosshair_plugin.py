"""CrossHair plugin (--extra_plugin): run the bodies of the functions an obligation calls,
never their contracts; and make symbolic values of Literal types (Config.policy).

By default CrossHair enforces the PEP 316 contract of every function the analyzed one
calls, ignores any path on which such a contract fails ("it will be surfaced more
locally in the subroutine"), and may skip a callee by assuming its postcondition. An
obligation over blocks_needed would then prove only that spec/blocks.py's own
docstrings imply it, and a bug in the body that breaks those docstrings would leave the
obligation confirmed: a fourth silent trap. With this plugin a call runs the callee's
code as written, and its failure is the obligation's. Written against the pinned
crosshair-tool 0.0.112; tests/test_proofs.py checks that it still takes effect.
"""

from __future__ import annotations

from types import FrameType
from typing import Any, Literal

from crosshair import enforce, register_type
from crosshair.core import SymbolicFactory


# CrossHair execs a plugin with separate globals and locals, so the function keeps what
# it needs in its defaults rather than in module names.
def trace_call(self: enforce.EnforcedConditions, frame: FrameType, fn: Any,
               binding_target: object,
               _original: Any = enforce.EnforcedConditions.trace_call) -> Any:
    if isinstance(fn, type):  # constructing objects still goes through CrossHair
        return _original(self, frame, fn, binding_target)
    return None


enforce.EnforcedConditions.trace_call = trace_call  # type: ignore[method-assign]


# The pinned CrossHair has no proxy for typing.Literal and fails on a Config, whose
# policy and preemption are Literals: let the solver choose one of the values.
def literal(factory: SymbolicFactory, *values: object,
            _desc: str = "choose_literal_") -> object:
    for value in values[:-1]:
        if factory.space.smt_fork(desc=_desc + str(value)):
            return value
    return values[-1]


register_type(Literal, literal)  # type: ignore[arg-type]
