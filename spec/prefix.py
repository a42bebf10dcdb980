"""Content keys of KV blocks, for prefix caching (docs/spec.md, prefix caching).

A block's content key names the tokens from the start of its sequence to its end, as
vLLM's block hashes chain each block's tokens to the previous block's hash: two blocks
with the same key hold the same KV. A request says what it shares through
`Request.prefix`: the shared contents its tokens start with, shortest first, each as
(content id, length in tokens). Block i (tokens i * block_size up to (i + 1) *
block_size) lies wholly inside every shared content at least (i + 1) * block_size long;
its key is the shortest one's id and i, so that every request sharing those tokens
names it the same way. Past them it is the request's own: its id and i (a request
resumed after recompute hits its own blocks, outputs included).

A conversation nests: its second turn starts with the whole first turn (prompt and
outputs), which starts with a system prompt: the second turn's prefix is
(("sys", 96), ("turn-1", 140)), and its block 3 (tokens 48..63) is keyed "sys/3", as
it is in the first turn.
"""

from __future__ import annotations

from collections.abc import Sequence

Prefix = tuple[tuple[str, int], ...]


def block_key(rid: str, prefix: Prefix, index: int, block_size: int) -> str:
    """The content key of block `index` of request `rid`.

    pre: index >= 0 and block_size >= 1
    post: __return__.endswith(f"/{index}")
    """
    end = (index + 1) * block_size
    for content, length in prefix:
        if length >= end:
            return f"{content}/{index}"
    return f"{rid}/{index}"


def nested(outer: Prefix, content: str, length: int) -> Prefix:
    """The prefix of a request that starts with the first `length` tokens of `content`,
    whose own prefix is `outer`: outer's contents cut to `length`, then `content`. Cut
    lengths keep their order and none exceeds `length`, so the result stays shortest
    first, and of contents as long as each other the outer come first: a block keeps
    the key `content`'s own request gives it.

    pre: length >= 0
    pre: all(a[1] <= b[1] for a, b in zip(outer, outer[1:]))
    post: all(a[1] <= b[1] for a, b in zip(__return__, __return__[1:]))
    post: all(n <= length for _, n in __return__)
    post: (content, length) in __return__
    """
    # Shortest first: nothing to cut when the longest fits. A cut keeps the outer's own
    # pairs where it can, so that a conversation's chains share them.
    cut = outer if not outer or outer[-1][1] <= length else tuple(
        p if p[1] <= length else (p[0], length) for p in outer)
    return cut if (content, length) in cut else (*cut, (content, length))


def keys(rid: str, prefix: Prefix, blocks: int, block_size: int) -> Sequence[str]:
    """The content keys of the first `blocks` blocks of `rid`."""
    return [block_key(rid, prefix, i, block_size) for i in range(blocks)]


class KeyBook:
    """The content keys of live requests' blocks, as a scheduler with prefix caching
    looks them up: those a trace gave (`add`, behind
    kvsched.spec.interface.ContentKeys.add_block_keys), else those its shared prefix
    gives (`block_key`)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._given: dict[str, list[str]] = {}

    def add(self, rid: str, keys: Sequence[str], start: int | None = None) -> None:
        """Keys of `rid`'s blocks from table index `start` on (by default the next ones),
        replacing every key given from there."""
        given = self._given.setdefault(rid, [])
        given[len(given) if start is None else start:] = keys

    def key(self, rid: str, prefix: Prefix, index: int) -> str:
        """The content key of block `index` of `rid`, whose shared prefix is `prefix`."""
        given = self._given.get(rid, ())
        if index < len(given):
            return given[index]
        return block_key(rid, prefix, index, self.block_size)

    def forget(self, rid: str) -> None:
        """`rid` has ended: its given keys go."""
        self._given.pop(rid, None)

    def __len__(self) -> int:
        """How many requests have keys given."""
        return len(self._given)
