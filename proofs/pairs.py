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
from kvsched.spec.blocks import blocks_needed, rejectable
from kvsched.spec.model import ALLOCATIONS, Config, Request, Status

OUTSIDE = -1


# -- admission-blocks: free blocks a waiting request needs to be admitted ---------------


def admission_within(block_size: int, watermark: int, computed: int, new_tokens: int,
                     held: int, running: bool, always: bool) -> bool:
    return (1 <= block_size <= 4 and 0 <= watermark <= 4 and 0 <= computed <= 32
            and 1 <= new_tokens <= 32 and 0 <= held <= 16)


def admission_blocks_spec(block_size: int, watermark: int, computed: int, new_tokens: int,
                          held: int, running: bool, always: bool) -> int:
    """Db (section 1.3) plus the watermark whenever a request is running, or always under
    watermark_scope always (config fields)."""
    if not admission_within(block_size, watermark, computed, new_tokens, held, running,
                            always):
        return OUTSIDE
    return (blocks_needed(computed, new_tokens, held, block_size)
            + (watermark if running or always else 0))


def admission_blocks_reference(block_size: int, watermark: int, computed: int,
                               new_tokens: int, held: int, running: bool, always: bool) -> int:
    if not admission_within(block_size, watermark, computed, new_tokens, held, running,
                            always):
        return OUTSIDE
    s = ReferenceScheduler(Config(block_size=block_size, num_gpu_blocks=8,
                                  watermark_blocks=watermark,
                                  watermark_scope="always" if always else "running"))
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
                  max_tokens: int, watermark: int, always: bool) -> bool:
    return (1 <= block_size <= 4 and 1 <= num_gpu_blocks <= 8 and 2 <= max_model_len <= 16
            and 1 <= prompt_len <= 16 and 1 <= max_tokens <= 16 and 0 <= watermark <= 2
            and watermark < num_gpu_blocks)


def reject_config(block_size: int, num_gpu_blocks: int, max_model_len: int, watermark: int,
                  always: bool) -> Config:
    return Config(block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                  max_model_len=max_model_len, watermark_blocks=watermark,
                  watermark_scope="always" if always else "running")


def reject_rule_spec(block_size: int, num_gpu_blocks: int, max_model_len: int,
                     prompt_len: int, max_tokens: int, watermark: int, always: bool) -> int:
    """What the spec lets an engine reject (rejectable: what must be, and a prompt of
    max_model_len tokens, which the reference rejects too)."""
    if not reject_within(block_size, num_gpu_blocks, max_model_len, prompt_len, max_tokens,
                         watermark, always):
        return OUTSIDE
    config = reject_config(block_size, num_gpu_blocks, max_model_len, watermark, always)
    return int(rejectable(config, prompt_len, max_tokens) is not None)


def reject_rule_reference(block_size: int, num_gpu_blocks: int, max_model_len: int,
                          prompt_len: int, max_tokens: int, watermark: int, always: bool
                          ) -> int:
    """The reference's first step with the request arriving alone."""
    if not reject_within(block_size, num_gpu_blocks, max_model_len, prompt_len, max_tokens,
                         watermark, always):
        return OUTSIDE
    s = ReferenceScheduler(reject_config(block_size, num_gpu_blocks, max_model_len,
                                         watermark, always))
    s.add_request(Request("r", prompt_len, max_tokens))
    return int(bool(s.schedule().rejected))


# -- first-chunk-blocks: blocks a request's first chunk gets ----------------------------


def first_chunk_within(block_size: int, prompt_len: int, max_tokens: int, budget: int,
                       allocation: int) -> bool:
    return (1 <= block_size <= 4 and 1 <= prompt_len <= 16 and 1 <= max_tokens <= 16
            and 1 <= budget <= 16 and 0 <= allocation < len(ALLOCATIONS))


def first_chunk_blocks_spec(block_size: int, prompt_len: int, max_tokens: int, budget: int,
                            allocation: int) -> int:
    """Db for the first chunk, min(P, token budget) tokens from C = 0 and G = 0, covering
    R tokens: none (lazy), the prompt (prompt) or min(P + O, max_model_len) (full)."""
    if not first_chunk_within(block_size, prompt_len, max_tokens, budget, allocation):
        return OUTSIDE
    reserve = (0, prompt_len, min(prompt_len + max_tokens, 64))[allocation]
    return blocks_needed(0, min(prompt_len, budget), 0, block_size, reserve)


def first_chunk_blocks_reference(block_size: int, prompt_len: int, max_tokens: int,
                                 budget: int, allocation: int) -> int:
    """The new block ids the reference hands a request admitted alone into a roomy cache."""
    if not first_chunk_within(block_size, prompt_len, max_tokens, budget, allocation):
        return OUTSIDE
    s = ReferenceScheduler(Config(block_size=block_size, num_gpu_blocks=32,
                                  max_num_batched_tokens=budget, max_model_len=64,
                                  allocation=ALLOCATIONS[allocation]))
    s.add_request(Request("r", prompt_len, max_tokens))
    d = s.schedule()
    return len((d.new_blocks or {}).get("r", ()))
