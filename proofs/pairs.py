"""diffbehavior pairs: each spec rule against the reference's computation of the same number.

`crosshair diffbehavior A B` looks for an input on which A and B differ, and ignores
preconditions, so both sides of a pair share one `within` test and map every input
outside it to the sentinel OUTSIDE. Inside, the spec side uses only kvsched.spec and
the reference side only what the reference scheduler itself computes.
"""

from __future__ import annotations

from kvsched.reference.requests import LiveRequest
from kvsched.reference.scheduler import ReferenceScheduler
from kvsched.spec import must, state
from kvsched.spec.blocks import blocks_needed, never_completes
from kvsched.spec.model import Config, Request, Status

OUTSIDE = -1


# -- admission-blocks: free blocks a waiting request needs to be admitted ---------------


def admission_within(block_size: int, watermark: int, computed: int, new_tokens: int,
                     held: int, running: bool) -> bool:
    return (1 <= block_size <= 4 and 0 <= watermark <= 4 and 0 <= computed <= 32
            and 1 <= new_tokens <= 32 and 0 <= held <= 16)


def admission_blocks_spec(block_size: int, watermark: int, computed: int, new_tokens: int,
                          held: int, running: bool) -> int:
    """Db (section 2) plus the watermark whenever a request is running (config field)."""
    if not admission_within(block_size, watermark, computed, new_tokens, held, running):
        return OUTSIDE
    return (blocks_needed(computed, new_tokens, held, block_size)
            + (watermark if running else 0))


def admission_blocks_reference(block_size: int, watermark: int, computed: int,
                               new_tokens: int, held: int, running: bool) -> int:
    if not admission_within(block_size, watermark, computed, new_tokens, held, running):
        return OUTSIDE
    s = ReferenceScheduler(Config(block_size=block_size, num_gpu_blocks=8,
                                  watermark_blocks=watermark))
    if running:
        s.running.append(LiveRequest(Request("other", 1, 1), 0, Status.RUNNING, 1, 0))
    return s.admission_blocks(computed + new_tokens, held)


# -- finish-rule: does a request that just sampled finish? ------------------------------


def finish_within(prompt_len: int, max_tokens: int, outputs: int, max_model_len: int) -> bool:
    return (1 <= prompt_len <= 8 and 1 <= max_tokens <= 8 and 1 <= outputs <= max_tokens
            and 2 <= max_model_len <= 16 and prompt_len + outputs <= max_model_len)


def finish_rule_spec(prompt_len: int, max_tokens: int, outputs: int, max_model_len: int
                     ) -> int:
    if not finish_within(prompt_len, max_tokens, outputs, max_model_len):
        return OUTSIDE
    sampled = state.LiveRequest(Request("r", prompt_len, max_tokens), Status.RUNNING,
                                prompt_len + outputs)
    due = must.finish(state.StepFacts(0, 0, due=[sampled]), Config(max_model_len=max_model_len))
    return int(due != [])


def finish_rule_reference(prompt_len: int, max_tokens: int, outputs: int, max_model_len: int
                          ) -> int:
    """The reference's update() on a request that sampled its `outputs`-th token."""
    if not finish_within(prompt_len, max_tokens, outputs, max_model_len):
        return OUTSIDE
    s = ReferenceScheduler(Config(max_model_len=max_model_len))
    known = prompt_len + outputs - 1
    e = LiveRequest(Request("r", prompt_len, max_tokens), 0, Status.RUNNING, known, known)
    s.live["r"] = e
    s.running.append(e)
    s.sampled = [e]
    return int("r" in s.update(()))


# -- reject-rule: is an arriving request rejected? --------------------------------------


def reject_within(block_size: int, num_gpu_blocks: int, max_model_len: int, prompt_len: int,
                  max_tokens: int) -> bool:
    return (1 <= block_size <= 4 and 1 <= num_gpu_blocks <= 8 and 2 <= max_model_len <= 16
            and 1 <= prompt_len <= 16 and 1 <= max_tokens <= 16)


def reject_rule_spec(block_size: int, num_gpu_blocks: int, max_model_len: int,
                     prompt_len: int, max_tokens: int) -> int:
    if not reject_within(block_size, num_gpu_blocks, max_model_len, prompt_len, max_tokens):
        return OUTSIDE
    config = Config(block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                    max_model_len=max_model_len)
    return int(never_completes(config, prompt_len, max_tokens) is not None)


def reject_rule_reference(block_size: int, num_gpu_blocks: int, max_model_len: int,
                          prompt_len: int, max_tokens: int) -> int:
    """The reference's first step with the request arriving alone."""
    if not reject_within(block_size, num_gpu_blocks, max_model_len, prompt_len, max_tokens):
        return OUTSIDE
    s = ReferenceScheduler(Config(block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                                  max_model_len=max_model_len))
    s.add_request(Request("r", prompt_len, max_tokens))
    return int(bool(s.schedule().rejected))


# -- first-chunk-blocks: blocks a request's first chunk gets ----------------------------


def first_chunk_within(block_size: int, prompt_len: int, budget: int) -> bool:
    return 1 <= block_size <= 4 and 1 <= prompt_len <= 16 and 1 <= budget <= 16


def first_chunk_blocks_spec(block_size: int, prompt_len: int, budget: int) -> int:
    """Db for the first chunk, min(P, token budget) tokens from C = 0 and G = 0."""
    if not first_chunk_within(block_size, prompt_len, budget):
        return OUTSIDE
    return blocks_needed(0, min(prompt_len, budget), 0, block_size)


def first_chunk_blocks_reference(block_size: int, prompt_len: int, budget: int) -> int:
    """The new block ids the reference hands a request admitted alone into a roomy cache."""
    if not first_chunk_within(block_size, prompt_len, budget):
        return OUTSIDE
    s = ReferenceScheduler(Config(block_size=block_size, num_gpu_blocks=32,
                                  max_num_batched_tokens=budget, max_model_len=64))
    s.add_request(Request("r", prompt_len, 1))
    d = s.schedule()
    return len((d.new_blocks or {}).get("r", ()))
