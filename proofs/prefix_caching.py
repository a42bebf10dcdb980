"""Obligations over prefix caching: how long a hit may be, what an admission with a hit
costs, and the content keys that decide which blocks are shared (kvsched.spec.prefix).

The arithmetic is proven for all integers. The reference's hit and the keys format
numbers into strings (a key is "content/index"), which makes CrossHair realize them,
so those are exhaustive within the stated bounds.
"""

from __future__ import annotations

from kvsched.reference.requests import LiveRequest
from kvsched.reference.scheduler import ReferenceScheduler
from kvsched.spec.blocks import blocks_for, blocks_needed, cdiv  # noqa: F401 (post: lines)
from kvsched.spec.model import Config, Request, Status
from kvsched.spec.prefix import block_key, nested


def hit_bound_is_the_token_bound(known: int, block_size: int, hit: int) -> bool:
    """The reference looks up at most floor((N - 1) / block_size) blocks; the spec allows
    a hit of h blocks when h * block_size <= N - 1: the same hits.

    pre: known >= 1 and block_size >= 1 and hit >= 0
    post: __return__ == (hit * block_size <= known - 1)
    """
    return hit <= (known - 1) // block_size


def admission_with_a_hit(hit: int, new_tokens: int, evictable: int, block_size: int) -> int:
    """After a hit of h blocks (C = h * block_size, G = h) an admission of Dn tokens costs
    Db + E = ceil((h * block_size + Dn) / block_size) - h + E: the blocks for its new
    tokens alone, plus the evictable hit blocks, never negative.

    pre: hit >= 0 and new_tokens >= 0 and 0 <= evictable <= hit and block_size >= 1
    post: __return__ == cdiv(hit * block_size + new_tokens, block_size) - hit + evictable
    post: __return__ == cdiv(new_tokens, block_size) + evictable
    post: __return__ >= evictable >= 0
    """
    return blocks_needed(hit * block_size, new_tokens, hit, block_size) + evictable


def reference_admission_with_a_hit(hit: int, new_tokens: int, evictable: int,
                                   block_size: int, watermark: int, running: bool) -> int:
    """The reference's admission after a hit, admission_blocks(C + Dn, h) + E, is the
    spec's Db + E plus the watermark when a request runs.

    pre: 0 <= hit <= 8 and 1 <= new_tokens <= 16 and 0 <= evictable <= hit
    pre: 1 <= block_size <= 4 and 0 <= watermark <= 2
    post: __return__ == blocks_needed(hit * block_size, new_tokens, hit, block_size) + evictable + (watermark if running else 0)
    """  # noqa: E501
    s = ReferenceScheduler(Config(block_size=block_size, num_gpu_blocks=16,
                                  watermark_blocks=watermark, prefix_caching=True))
    if running:
        s.running.append(LiveRequest(Request("other", 1, 1), 0, Status.RUNNING, 1, 0))
    return s.admission_blocks(hit * block_size + new_tokens, hit) + evictable


def reference_whole_sequence_with_a_hit(hit: int, tokens: int, evictable: int,
                                        block_size: int) -> int:
    """With the whole-sequence knob an admission after a hit must find blocks for all N
    tokens less the h it hit, plus E.

    pre: 0 <= hit <= 8 and 1 <= tokens <= 32 and hit * block_size <= tokens - 1
    pre: 0 <= evictable <= hit and 1 <= block_size <= 4
    post: __return__ == blocks_for(tokens, block_size) - hit + evictable
    post: __return__ >= evictable + 1
    """
    s = ReferenceScheduler(Config(block_size=block_size, num_gpu_blocks=16,
                                  prefix_caching=True))
    return s.admission_blocks(tokens, hit) + evictable


def reference_hit_is_the_cached_run(known: int, block_size: int, cached: int) -> int:
    """A waiting request at C = 0 whose first `cached` blocks are cached hits the longest
    run of them that leaves a token to compute: min(cached, floor((N - 1) / block_size))
    blocks, so h * block_size <= N - 1.

    pre: 1 <= known <= 12 and 1 <= block_size <= 4 and 0 <= cached <= 6
    post: __return__ * block_size <= known - 1
    post: __return__ == min(cached, (known - 1) // block_size)
    """
    s = ReferenceScheduler(Config(block_size=block_size, num_gpu_blocks=8,
                                  max_model_len=64, prefix_caching=True))
    s.blocks.allocate("d", cached)
    s.blocks.cache("d", cached, lambda i: block_key("r", (), i, block_size))
    r = LiveRequest(Request("r", known, 1), 0, Status.WAITING, known, 0)
    return len(s.prefix_hit(r))


def sharers_name_a_block_alike(index: int, block_size: int, first: int, second: int) -> bool:
    """Two requests whose prompts start with `first` and `second` tokens of content "s"
    give block `index` the same key exactly when both hold it wholly in "s".

    pre: 0 <= index <= 6 and 1 <= block_size <= 4
    pre: 0 <= first <= 32 and 0 <= second <= 32
    post: __return__ == (first >= (index + 1) * block_size and second >= (index + 1) * block_size)
    """
    a = block_key("a", (("s", first),) if first else (), index, block_size)
    b = block_key("b", (("s", second),) if second else (), index, block_size)
    return a == b


def next_turn_hits_the_whole_turn(shared: int, cut: int, index: int, block_size: int) -> bool:
    """A conversation's next turn, whose prefix nests the first `cut` tokens of turn r0
    (itself starting with `shared` tokens of "s"), keys every block within them as r0
    keys its own: so it can hit all of them.

    pre: 1 <= shared <= 8 and 1 <= cut <= 12 and 1 <= block_size <= 4
    pre: 0 <= index and (index + 1) * block_size <= cut
    post: __return__
    """
    first = (("s", shared),)
    turn = nested(first, "r0", cut)
    return block_key("r1", turn, index, block_size) == block_key("r0", first, index,
                                                                  block_size)
