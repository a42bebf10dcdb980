"""kvsched.reference.radix, the model of SGLang 0.5.23's radix cache: matches cut to
pages and to the limit, locks moving tokens between evictable and protected, insertion
freeing what another request cached first, LRU eviction of whole leaves. (Its rules
were checked operation for operation against SGLang's own tree; the conformance suite
checks them through the scheduler on SGLang's traces.)"""

from __future__ import annotations

from kvsched.reference.radix import RadixTree


def seq(name: str, n: int, start: int = 0) -> list[tuple[str, int]]:
    return [(name, i) for i in range(start, start + n)]


def test_a_match_stops_at_the_limit_and_at_a_page() -> None:
    tree = RadixTree(page_size=4)
    key = seq("s", 12)
    done = tree.cache_req(key, 12, 12, 0, None)
    assert done.freed == 0 and done.protected_len == 12
    tree.unlock(done.lock)
    assert tree.evictable_size() == 12
    assert tree.match(key, limit=11).length == 8  # 11 tokens, whole pages: 8
    assert tree.match(seq("s", 6) + seq("x", 6), limit=11).length == 4
    assert tree.match(seq("x", 12), limit=11).length == 0


def test_a_lock_protects_the_path_and_an_unlock_frees_it_for_eviction() -> None:
    tree = RadixTree(page_size=1)
    done = tree.cache_req(seq("s", 5), 5, 5, 0, None)
    assert tree.protected_size() == 5 and tree.evictable_size() == 0
    assert tree.evict(5) == []  # locked: nothing to evict
    tree.unlock(done.lock)
    assert len(tree.evict(5)) == 5 and tree.evictable_size() == 0


def test_insertion_frees_what_another_request_cached_first() -> None:
    tree = RadixTree(page_size=1)
    first = tree.cache_req(seq("s", 6), 6, 6, 0, None)
    second = tree.cache_req(seq("s", 6) + seq("b", 2), 8, 8, 0, None)
    assert second.freed == 6 and second.protected_len == 8
    tree.unlock(first.lock)
    tree.unlock(second.lock)
    assert tree.evictable_size() == 8


def test_eviction_takes_the_least_recently_used_leaf_first() -> None:
    tree = RadixTree(page_size=1)
    for name in ("a", "b"):
        tree.unlock(tree.cache_req(seq(name, 4), 4, 4, 0, None).lock)
    tree.match(seq("a", 4), limit=3)  # a is used again: b is the older leaf
    assert len(tree.evict(1)) == 4
    assert tree.match(seq("b", 4), limit=3).length == 0
    assert tree.match(seq("a", 4), limit=3).length == 3


def test_a_disabled_cache_holds_nothing() -> None:
    tree = RadixTree(page_size=1, disable=True)
    done = tree.cache_req(seq("s", 5), 5, 5, 0, None)
    assert done.freed == 0 and done.protected_len == 0
    assert tree.match(seq("s", 5), limit=4).length == 0 and tree.evict(10) == []
