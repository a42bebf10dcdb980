"""Obligations over the block arithmetic and the spec's rules (loop-free).

The first four are proven by CrossHair over all paths, for all integers. The rules
that build a reason or a Violation format their numbers into a sentence, which makes
CrossHair realize them, so those are checked over all paths only within the stated
bounds (every path inside the bounds is still explored).
"""

from __future__ import annotations

from kvsched.spec import must
from kvsched.spec.blocks import blocks_for, blocks_needed, cdiv, never_completes, rejectable
from kvsched.spec.model import Config, Request, Status
from kvsched.spec.state import Action, Chunk, LiveRequest, StepFacts


def cdiv_is_ceiling(a: int, b: int) -> int:
    """cdiv(a, b) is the least q with q * b >= a.

    pre: a >= 0 and b >= 1
    post: __return__ * b >= a
    post: (__return__ - 1) * b < a or __return__ == 0
    post: (__return__ == 0) == (a == 0)
    """
    return cdiv(a, b)


def blocks_for_is_least(tokens: int, block_size: int) -> int:
    """blocks_for(tokens) blocks hold the tokens, and one block fewer does not.

    pre: tokens >= 0 and block_size >= 1
    post: __return__ * block_size >= tokens
    post: __return__ == 0 or (__return__ - 1) * block_size < tokens
    """
    return blocks_for(tokens, block_size)


def blocks_needed_is_least(computed: int, new_tokens: int, held: int, block_size: int,
                           reserve: int) -> int:
    """Db is the least number of new blocks with which the held ones cover C + Dn tokens,
    and the R tokens an admission or a swap-in reserves.

    pre: computed >= 0 and new_tokens >= 0 and held >= 0 and block_size >= 1
    pre: reserve >= 0
    post: __return__ >= 0
    post: (held + __return__) * block_size >= max(computed + new_tokens, reserve)
    post: __return__ == 0 or (held + __return__ - 1) * block_size < max(computed + new_tokens, reserve)
    post: (__return__ == 0) == (held * block_size >= max(computed + new_tokens, reserve))
    """  # noqa: E501
    return blocks_needed(computed, new_tokens, held, block_size, reserve)


def chunks_need_what_the_whole_needs(computed: int, first: int, second: int, held: int,
                                     block_size: int) -> tuple[int, int]:
    """Chunking does not change the blocks: Db for Dn1 then Dn2 adds up to Db for Dn1 + Dn2
    (so the checker's per-chunk sums equal a one-shot prefill's).

    pre: computed >= 0 and first >= 0 and second >= 0 and held >= 0 and block_size >= 1
    post: __return__[0] == __return__[1]
    """
    one = blocks_needed(computed, first, held, block_size)
    two = blocks_needed(computed + first, second, held + one, block_size)
    return one + two, blocks_needed(computed, first + second, held, block_size)


def rejects_exactly_the_hopeless(block_size: int, num_gpu_blocks: int, max_model_len: int,
                                 prompt_len: int, max_tokens: int) -> tuple[bool, bool]:
    """never_completes refuses exactly the requests that cannot fit alone: P >
    max_model_len, or the longest sequence min(P + O, max_model_len) needs more blocks
    than the cache has; rejectable refuses those and a prompt of exactly max_model_len
    tokens (which an engine may serve one token).

    pre: 1 <= block_size <= 4 and 1 <= num_gpu_blocks <= 8 and 1 <= max_model_len <= 16
    pre: 1 <= prompt_len <= 16 and 1 <= max_tokens <= 16
    post: __return__[0] == (prompt_len <= max_model_len and min(prompt_len + max_tokens, max_model_len) <= num_gpu_blocks * block_size)
    post: __return__[1] == (__return__[0] and prompt_len != max_model_len)
    """  # noqa: E501
    config = Config(block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                    max_model_len=max_model_len)
    return (never_completes(config, prompt_len, max_tokens) is None,
            rejectable(config, prompt_len, max_tokens) is None)


def rejects_beside_an_always_watermark(block_size: int, num_gpu_blocks: int,
                                       max_model_len: int, prompt_len: int, max_tokens: int,
                                       watermark: int) -> bool:
    """Under watermark_scope always, never_completes refuses exactly the requests whose
    longest sequence does not fit beside the watermark: ceil(min(P + O, max_model_len)
    / block_size) + watermark > num_gpu_blocks (or P > max_model_len).

    pre: 1 <= block_size <= 2 and 1 <= num_gpu_blocks <= 6 and 1 <= max_model_len <= 8
    pre: 1 <= prompt_len <= 8 and 1 <= max_tokens <= 8 and 1 <= watermark <= 2
    post: __return__ == (prompt_len <= max_model_len and min(prompt_len + max_tokens, max_model_len) <= (num_gpu_blocks - watermark) * block_size)
    """  # noqa: E501
    config = Config(block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                    max_model_len=max_model_len, watermark_blocks=watermark,
                    watermark_scope="always")
    return never_completes(config, prompt_len, max_tokens) is None


def finish_is_due_exactly_at_the_limits(prompt_len: int, max_tokens: int, outputs: int,
                                        max_model_len: int) -> bool:
    """finish: a request that just sampled must finish exactly when its outputs reach
    max_tokens or its tokens reach max_model_len.

    pre: 1 <= prompt_len <= 8 and 1 <= max_tokens <= 8 and 1 <= outputs <= 8
    pre: 2 <= max_model_len <= 16
    post: __return__ == (outputs >= max_tokens or prompt_len + outputs >= max_model_len)
    """
    config = Config(max_model_len=max_model_len)
    request = Request("r", prompt_len, max_tokens)
    known = prompt_len + outputs
    facts = StepFacts(0, 0, due=[LiveRequest(request, Status.RUNNING, known)])
    return must.finish(facts, config) != []


def token_range_allows_exactly(new_tokens: int, computed: int, known: int, max_model_len: int,
                               chunked: bool) -> bool:
    """token-range: a chunk is legal exactly when Dn >= 1, C + Dn <= N and <= max_model_len,
    and, without chunked prefill, Dn = N - C.

    pre: -1 <= new_tokens <= 5 and 0 <= computed <= 5 and 1 <= known <= 5
    pre: 1 <= max_model_len <= 5
    post: __return__ == (new_tokens >= 1 and computed + new_tokens <= known and computed + new_tokens <= max_model_len and (chunked or new_tokens == known - computed))
    """  # noqa: E501
    config = Config(max_model_len=max_model_len, chunked_prefill=chunked,
                    max_num_batched_tokens=max(max_model_len, 2048))
    chunk = Chunk(Action("r", "scheduled", "running"), new_tokens, known, computed, known, 0,
                  False, None, min(computed + new_tokens, known))
    return must.token_range(StepFacts(0, 0, chunks=[chunk]), config) == []


def kv_budget_is_the_step_invariant(demand: int, free: int, reclaim: int) -> bool:
    """kv-budget holds exactly when sum Db <= B_free + B_reclaim.

    pre: 0 <= demand <= 6 and 0 <= free <= 6 and 0 <= reclaim <= 6
    post: __return__ == (demand <= free + reclaim)
    """
    return must.kv_budget(StepFacts(0, 0, free_before=free, reclaim=reclaim,
                                    demand=demand)) == []
