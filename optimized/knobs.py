"""The knobs the fast schedulers follow: vLLM v1's (Knobs' own fields; they run no other
step kind, so they refuse any of V0's or SGLang's set away from its default); the torch
scheduler not the two of older vLLM v1 releases.

The torch scheduler (kvsched.optimized.scheduler) and the compiled one
(kvsched.optimized.compiled) refuse what they do not implement in the same words; this
module holds that rule without importing torch, and the largest pool they take.
"""

from __future__ import annotations

from typing import Literal

from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Config
from kvsched.spec.step_kinds import knob_refusal, refusal

# Knobs the torch scheduler follows only at their defaults, the compiled one at every
# value: older vLLM v1 releases' rules (the free-queue order up to 0.23, the over-budget
# prompt passed over in 0.11), whose one-request-at-a-time nature its batched passes
# do not have.
COMPILED_ONLY_KNOBS = ("free_order", "over_budget_prompt")

FastScheduler = Literal["compiled", "torch"]

# The most blocks of a pool the fast schedulers take: they make their free lists (an
# entry per block, 8 bytes or more; some 150 with prefix caching and the compiled state
# the simulation's metrics follow) at start, where the reference scheduler's memory
# follows the blocks it hands out (docs/cli.md, the pool sizes each scheduler takes).
MAX_POOL_BLOCKS = 1 << 22


def unsupported_pools(config: Config, scheduler: FastScheduler = "compiled") -> str | None:
    """Why the fast `scheduler` refuses `config`'s pools, in one line, or None."""
    if max(config.num_gpu_blocks, config.num_cpu_blocks) <= MAX_POOL_BLOCKS:
        return None
    return (f"the {scheduler} scheduler makes a free-list entry per block at start: "
            f"num_gpu_blocks and num_cpu_blocks must be at most {MAX_POOL_BLOCKS:,} "
            "(the reference scheduler takes more)")


def unsupported_state(config: Config) -> str | None:
    """Why the compiled state (the vectorized checker's, kvsched.optimized.state) does
    not model a trace of `config`, in one line, or None: then the spec's state moves
    and judges every step of it (the same verdicts, at the spec's speed)."""
    beyond = [what for what, on in (
        ("pipelined steps", config.pipelined),
        ("lazy preemption", config.preemption == "lazy"),
        (f"prealloc_tokens {config.prealloc_tokens}", config.prealloc_tokens > 0)) if on]
    if not beyond:
        return None
    return (f"the compiled state does not model {' or '.join(beyond)} (LMDeploy's "
            "rules): the spec's state checks the trace")


def unsupported_config(config: Config, scheduler: FastScheduler = "compiled") -> str | None:
    """Why the fast `scheduler` refuses `config`, in one line, or None: a field vLLM v1's
    step does not honour at its value (kvsched.spec.step_kinds, the table every
    implementation reads), or pools larger than it takes."""
    why = refusal("v1", config)
    if why is not None:
        return f"the {scheduler} scheduler runs vLLM v1's step: {why}"
    return unsupported_pools(config, scheduler)


def unsupported_knobs(knobs: Knobs, scheduler: FastScheduler = "compiled") -> str | None:
    """Why the fast `scheduler` refuses `knobs`, in one line, or None: a knob of another
    step kind than vLLM v1's (kvsched.spec.step_kinds.knob_refusal; vLLM V0's rules, which
    only the reference's V0 step reads), or with the torch scheduler an older release's
    rule."""
    why = knob_refusal("v1", knobs)
    if why is not None:
        return f"the {scheduler} scheduler runs vLLM v1's step: {why}"
    default = Knobs()
    if scheduler == "torch":
        for name in COMPILED_ONLY_KNOBS:
            value = getattr(knobs, name)
            if value != getattr(default, name):
                return (f"the torch scheduler does not implement knob {name}={value!r} "
                        f"(an older vLLM release's rule): use the compiled or the "
                        f"reference scheduler")
    return None
