"""Block arithmetic: how many KV blocks tokens need, and which requests can never fit.

These few lines carry every budget in the spec; their contracts are checked
by CrossHair (proofs/).
"""

from __future__ import annotations

from kvsched.spec.model import Config, Request


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


def blocks_needed(computed: int, new_tokens: int, held: int, block_size: int,
                  reserve: int = 0) -> int:
    """Db = max(0, ceil(max(C + Dn, R) / block_size) - G): the blocks to add so that the
    G held cover the chunk's C + Dn tokens and the R tokens an admission or a swap-in
    reserves (`allocation_reserve`; R = 0 for any other chunk, and under lazy allocation).

    pre: computed >= 0 and new_tokens >= 0 and held >= 0 and reserve >= 0
    pre: block_size >= 1
    post: __return__ >= 0
    post: (held + __return__) * block_size >= max(computed + new_tokens, reserve)
    post: __return__ == 0 or (held + __return__ - 1) * block_size < max(computed + new_tokens, reserve)
    """  # noqa: E501
    return max(0, blocks_for(max(computed + new_tokens, reserve), block_size) - held)


def blocks_touched(filled: int, new_tokens: int, block_size: int) -> int:
    """The blocks that appending `new_tokens` to a table of `filled` tokens touches, its
    partly filled last block counted as if it needed a new one (copy-on-write of a shared
    block would): ceil((filled mod block_size + new_tokens) / block_size). vLLM V0's
    worst case for a running request (BlockTable.get_num_blocks_touched_by_append_slots):
    1 for a decode, and 1 for a prefill chunk whose blocks already hold all its tokens
    but the last of them is partly filled.

    pre: filled >= 0 and new_tokens >= 0
    pre: block_size >= 1
    post: __return__ >= blocks_for(filled + new_tokens, block_size) - blocks_for(filled, block_size)
    post: __return__ <= blocks_for(new_tokens, block_size) + 1
    """
    return blocks_for(filled % block_size + new_tokens, block_size)


def longest_sequence(config: Config, prompt_len: int, max_tokens: int) -> int:
    """min(P + O, max_model_len): the most tokens a request's sequence reaches.

    pre: prompt_len >= 1 and max_tokens >= 1
    post: __return__ <= config.max_model_len and __return__ <= prompt_len + max_tokens
    """
    return min(prompt_len + max_tokens, config.max_model_len)


def allocation_reserve(config: Config, request: Request, known: int) -> int:
    """R: the tokens an admission (of a new request, or of one resumed after recompute)
    or a swap-in covers with blocks whatever its chunk, by config `allocation`: none
    beyond the chunk (lazy, vLLM v1), all N known tokens (prompt, vLLM V0), or the
    longest sequence min(P + O, max_model_len) (full, Orca and TGI). Every later chunk
    is lazy, so under full no block is ever added after the admission.

    pre: known >= 0
    post: __return__ in (0, known, longest_sequence(config, request.prompt_len, request.max_tokens))
    """
    if config.allocation == "prompt":
        return known
    if config.allocation == "full":
        return longest_sequence(config, request.prompt_len, request.max_tokens)
    return 0


def admission_watermark(config: Config, running: int) -> int:
    """The blocks an admission or a swap-in must leave free beyond its own: the watermark
    while some request runs (`running` of them), or at every admission under
    watermark_scope always (vLLM V0); none when nothing runs under scope running (vLLM v1).

    pre: running >= 0
    post: __return__ in (0, config.watermark_blocks)
    """
    if config.watermark_scope == "always" or running > 0:
        return config.watermark_blocks
    return 0


def prompt_too_long(config: Config, prompt_len: int) -> str | None:
    """Why a prompt can never be served, P > max_model_len, or None.

    post: (__return__ is None) == (prompt_len <= config.max_model_len)
    """
    if prompt_len > config.max_model_len:
        return (f"prompt of {prompt_len} tokens is longer than max_model_len "
                f"{config.max_model_len}")
    return None


def never_admitted(config: Config, request: Request, known: int,
                   swap_in: bool = False) -> str | None:
    """Why a request with `known` tokens can never be admitted (or, `swap_in`, swapped
    back in) even into an empty cache, or None: the blocks its allocation takes for them
    need more than the cache has, with the watermark of an admission when nothing runs
    (vLLM V0's AllocStatus.NEVER, whose swap-in check leaves the watermark out).

    pre: known >= 1 and config.block_size >= 1
    post: (__return__ is None) == (blocks_for(max(known, allocation_reserve(config, request, known)), config.block_size) + (0 if swap_in else admission_watermark(config, 0)) <= config.num_gpu_blocks)
    """  # noqa: E501
    need = blocks_for(max(known, allocation_reserve(config, request, known)),
                      config.block_size)
    watermark = 0 if swap_in else admission_watermark(config, 0)
    if need + watermark <= config.num_gpu_blocks:
        return None
    beside = f" and the watermark {watermark}" if watermark else ""
    return (f"its {known} tokens need {need} blocks{beside}, cache has "
            f"{config.num_gpu_blocks}")


def never_completes(config: Config, prompt_len: int, max_tokens: int) -> str | None:
    """Why a request must be rejected, as it can never complete even alone in an empty
    cache, or None if it can.

    Section 2, rule 2: P > max_model_len, or the longest sequence it can reach,
    min(P + O, max_model_len), needs more blocks than the cache has (with the watermark
    when its scope is always: then even a lone admission leaves it free).

    pre: prompt_len >= 1 and max_tokens >= 1 and config.block_size >= 1
    post: (__return__ is None) == (prompt_len <= config.max_model_len and blocks_for(min(prompt_len + max_tokens, config.max_model_len), config.block_size) + (config.watermark_blocks if config.watermark_scope == "always" else 0) <= config.num_gpu_blocks)
    """  # noqa: E501
    too_long = prompt_too_long(config, prompt_len)
    if too_long is not None:
        return too_long
    need = blocks_for(longest_sequence(config, prompt_len, max_tokens), config.block_size)
    watermark = config.watermark_blocks if config.watermark_scope == "always" else 0
    if need + watermark <= config.num_gpu_blocks:
        return None
    beside = f" and the watermark {watermark}" if watermark else ""
    return f"sequence needs {need} blocks{beside}, cache has {config.num_gpu_blocks}"


def prompt_over_limit(config: Config, prompt_len: int) -> str | None:
    """Why the engine's front end refuses a prompt, P > max_prompt_len (when the config
    declares one: max_prompt_len >= 1), or None.

    post: (__return__ is None) == (config.max_prompt_len < 1 or prompt_len <= config.max_prompt_len)
    """
    if config.max_prompt_len >= 1 and prompt_len > config.max_prompt_len:
        return (f"prompt of {prompt_len} tokens is longer than the front end's limit "
                f"max_prompt_len {config.max_prompt_len}")
    return None


def rejectable(config: Config, prompt_len: int, max_tokens: int) -> str | None:
    """Why a request may be rejected, or None when it must be served: it never completes
    (`never_completes`), its prompt fills max_model_len, which leaves no room for an
    output token, or its prompt is longer than the front end takes (`prompt_over_limit`).
    Rule 2 lets an engine reject a prompt that fills max_model_len (vLLM v1's front end
    does) or serve it: it computes its prompt, samples one token and finishes on
    max_model_len (vLLM V0 does).

    pre: prompt_len >= 1 and max_tokens >= 1 and config.block_size >= 1
    post: (__return__ is None) == (never_completes(config, prompt_len, max_tokens) is None and prompt_len != config.max_model_len and prompt_over_limit(config, prompt_len) is None)
    """  # noqa: E501
    if prompt_len == config.max_model_len:
        return (f"prompt of {prompt_len} tokens leaves no room for an output token "
                f"(max_model_len {config.max_model_len})")
    too_long = never_completes(config, prompt_len, max_tokens)
    if too_long is not None:
        return too_long
    return prompt_over_limit(config, prompt_len)
