"""Block arithmetic: how many KV blocks tokens need, and which requests can never fit.

These few lines carry every budget in the spec; their contracts are checked
by CrossHair (proofs/).
"""

from __future__ import annotations

from kvsched.spec.model import Config


def cdiv(a: int, b: int) -> int:
    """Ceiling division.

    pre: a >= 0
    pre: b >= 1
    post: __return__ * b >= a
    post: (__return__ - 1) * b < a or __return__ == 0
    """
    return -(-a // b)


def blocks_for(tokens: int, block_size: int) -> int:
    """The fewest blocks that hold `tokens` tokens.

    pre: tokens >= 0
    pre: block_size >= 1
    post: __return__ * block_size >= tokens
    post: __return__ == 0 or (__return__ - 1) * block_size < tokens
    """
    return cdiv(tokens, block_size)


def blocks_needed(computed: int, new_tokens: int, held: int, block_size: int) -> int:
    """Db = max(0, ceil((C + Dn) / block_size) - G): blocks to add for Dn more tokens.

    pre: computed >= 0 and new_tokens >= 0 and held >= 0
    pre: block_size >= 1
    post: __return__ >= 0
    post: (held + __return__) * block_size >= computed + new_tokens
    post: __return__ == 0 or (held + __return__ - 1) * block_size < computed + new_tokens
    """
    return max(0, blocks_for(computed + new_tokens, block_size) - held)


def never_completes(config: Config, prompt_len: int, max_tokens: int) -> str | None:
    """Why a request can never complete even alone in an empty cache, or None if it can.

    Section 2, rule 2: P >= max_model_len leaves no room for one output token;
    otherwise the longest sequence it can reach, min(P + O, max_model_len), must
    fit in the GPU blocks.

    pre: prompt_len >= 1 and max_tokens >= 1 and config.block_size >= 1
    post: (__return__ is None) == (prompt_len < config.max_model_len and blocks_for(min(prompt_len + max_tokens, config.max_model_len), config.block_size) <= config.num_gpu_blocks)
    """  # noqa: E501
    if prompt_len >= config.max_model_len:
        return (f"prompt of {prompt_len} tokens leaves no room for an output token "
                f"(max_model_len {config.max_model_len})")
    longest = min(prompt_len + max_tokens, config.max_model_len)
    need = blocks_for(longest, config.block_size)
    if need > config.num_gpu_blocks:
        return f"sequence needs {need} blocks, cache has {config.num_gpu_blocks}"
    return None
