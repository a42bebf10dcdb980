"""The knobs the fast schedulers follow: every knob of the reference but vLLM V0's.

The torch scheduler (kvsched.optimized.scheduler) and the compiled one
(kvsched.optimized.compiled) implement the same knobs and refuse the same ones, in
the same words; this module holds that rule without importing torch.
"""

from __future__ import annotations

from kvsched.spec.knobs import Knobs

# Knobs these schedulers follow only at their defaults: vLLM V0's rules (profile
# vllm-v0), which the reference alone implements. V0's step itself (a profile whose
# `scheduler` is "v0") is the reference's V0Scheduler; these schedulers run vLLM v1's.
REFERENCE_ONLY_KNOBS = ("grow_check", "reject", "chunk_swap_in", "swapped_order")


def unsupported_knobs(knobs: Knobs) -> str | None:
    """Why the fast schedulers refuse `knobs`, in one line, or None."""
    default = Knobs()
    for name in REFERENCE_ONLY_KNOBS:
        value = getattr(knobs, name)
        if value != getattr(default, name):
            return (f"the optimized scheduler does not implement knob {name}={value!r} "
                    f"(vLLM V0's rules, profile vllm-v0): use the reference scheduler")
    return None
