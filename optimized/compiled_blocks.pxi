# The block pool of the compiled scheduler (included by compiled.pyx), as vLLM's
# block_pool and kv_cache_manager own it: the GPU free list in vLLM's order, the host's
# free ids, allocation and release, swapping a table out and in; with prefix caching,
# each block's holders and content key, the blocks cached under each key, hits and
# eviction. The scheduler's decisions (compiled.pyx) call these; nothing here decides.

# -- the free lists, allocation and release -------------------------------------------

cdef void _free_unlink(CompiledScheduler sched, int32_t b) noexcept:
    sched.fnext[sched.fprev[b]] = sched.fnext[b]
    sched.fprev[sched.fnext[b]] = sched.fprev[b]
    sched.nfree -= 1

cdef void _free_push_back(CompiledScheduler sched, int32_t b) noexcept:
    cdef int32_t tail = sched.fprev[sched.nb]
    sched.fnext[tail] = b
    sched.fprev[b] = tail
    sched.fnext[b] = <int32_t>sched.nb
    sched.fprev[sched.nb] = b
    sched.nfree += 1

cdef void _free_push_front(CompiledScheduler sched, int32_t b) noexcept:
    cdef int32_t head = sched.fnext[sched.nb]
    sched.fprev[head] = b
    sched.fnext[b] = head
    sched.fprev[b] = <int32_t>sched.nb
    sched.fnext[sched.nb] = b
    sched.nfree += 1

cdef void _allocate(CompiledScheduler sched, int32_t s, int64_t count) noexcept:
    """Give `s` `count` more GPU blocks from the head of the free list (each drops the
    content it had cached)."""
    cdef int64_t k
    cdef int32_t b
    cdef vector[int32_t] *t = &sched.gtable[s]
    for k in range(count):
        b = sched.fnext[sched.nb]
        _free_unlink(sched, b)
        if sched.caching:
            if sched.has_content[b]:
                _forget_content(sched, b)
                sched.evicted_now += 1
            sched.holders[b] = 1
        t.push_back(b)

cdef void _forget_content(CompiledScheduler sched, int32_t b) noexcept:
    cdef int64_t key = sched.content[b]
    sched.has_content[b] = 0
    if sched.knext[b] == b:
        sched.cached.erase(key)
    else:
        sched.knext[sched.kprev[b]] = sched.knext[b]
        sched.kprev[sched.knext[b]] = sched.kprev[b]
        if sched.cached[key] == b:
            sched.cached[key] = sched.knext[b]
    sched.knext[b] = -1
    sched.kprev[b] = -1

cdef void _release_gpu(CompiledScheduler sched, int32_t s) noexcept:
    """Drop `s`'s GPU table, walking it from its end: without caching every block to
    the tail; with it, blocks whose last holder this is go free, uncached ones to the
    head (the walk's first foremost) and cached ones to the tail, in walk order (knob
    free_order "uncached_first"), or all to the tail in walk order ("as_freed")."""
    cdef vector[int32_t] *t = &sched.gtable[s]
    cdef Py_ssize_t k
    cdef int32_t b
    cdef vector[int32_t] uncached
    sched.cached_upto[s] = 0
    if not sched.caching:
        for k in range(<Py_ssize_t>t.size() - 1, -1, -1):
            _free_push_back(sched, t[0][k])
        t.clear()
        return
    cdef vector[int32_t] kept
    for k in range(<Py_ssize_t>t.size() - 1, -1, -1):
        b = t[0][k]
        sched.holders[b] -= 1
        if sched.holders[b] == 0:
            if sched.has_content[b] or sched.free_as_freed:
                kept.push_back(b)
            else:
                uncached.push_back(b)
    for k in range(<Py_ssize_t>uncached.size() - 1, -1, -1):
        _free_push_front(sched, uncached[k])
    for b in kept:
        _free_push_back(sched, b)
    t.clear()

cdef void _free_all(CompiledScheduler sched, int32_t s) noexcept:
    """Release every block `s` holds, GPU and host."""
    _release_gpu(sched, s)
    cdef int32_t h
    for h in sched.htable[s]:
        sched.hfree.push_back(h)
    sched.htable[s].clear()

cdef void _swap_out(CompiledScheduler sched, int32_t s) noexcept:
    cdef Py_ssize_t k
    cdef Py_ssize_t moved = sched.gtable[s].size()
    cdef vector[int32_t] *h = &sched.htable[s]
    for k in range(moved):
        h.push_back(sched.hfree.front())
        sched.hfree.pop_front()
    _release_gpu(sched, s)

cdef void _swap_in(CompiledScheduler sched, int32_t s) noexcept:
    cdef int32_t h
    cdef Py_ssize_t moved = sched.htable[s].size()
    for h in sched.htable[s]:
        sched.hfree.push_back(h)
    sched.htable[s].clear()
    _allocate(sched, s, moved)

# -- prefix caching ---------------------------------------------------------------

cdef int64_t _key(CompiledScheduler sched, int32_t s, int64_t index) except? -9:
    """The content key of block `index` of `s`: the trace's, or its prefix's
    (kvsched.spec.prefix.block_key)."""
    cdef vector[int64_t] *g = &sched.given[s]
    if index < <int64_t>g.size():
        return g[0][index]
    if index >= KEY_SPAN:
        raise ValueError(f"a request of the compiled scheduler with prefix caching holds "
                         f"at most {KEY_SPAN} blocks")
    cdef int64_t end = (index + 1) * sched.bs
    cdef Py_ssize_t k
    for k in range(<Py_ssize_t>sched.pre_len[s].size()):
        if sched.pre_len[s][k] >= end:
            return sched.pre_content[s][k] * KEY_SPAN + index
    return sched.own[s] * KEY_SPAN + index

cdef int _cache_filled(CompiledScheduler sched, int32_t s, int64_t tokens) except -1:
    """Cache the blocks of `s` that `tokens` scheduled tokens fill, not cached yet."""
    if not sched.caching:
        return 0
    cdef int64_t full = tokens // sched.bs
    cdef vector[int32_t] *t = &sched.gtable[s]
    cdef int64_t i, key, upto = min(full, <int64_t>t.size())
    cdef int32_t b, head, tail
    cdef unordered_map[int64_t, int32_t].iterator it
    for i in range(sched.cached_upto[s], upto):
        b = t[0][i]
        if sched.has_content[b]:
            continue
        key = _key(sched, s, i)
        sched.content[b] = key
        sched.has_content[b] = 1
        it = sched.cached.find(key)
        if it == sched.cached.end():
            sched.cached[key] = b
            sched.kprev[b] = b
            sched.knext[b] = b
        else:
            head = deref(it).second
            tail = sched.kprev[head]
            sched.knext[tail] = b
            sched.kprev[b] = tail
            sched.knext[b] = head
            sched.kprev[head] = b
    if full > sched.cached_upto[s]:
        sched.cached_upto[s] = <int32_t>full
    return 0

cdef int _lookup(CompiledScheduler sched, int32_t s) except -1:
    """The cached blocks waiting `s` would start from, into `hitbuf`: with C = 0, the
    longest run holding its first floor((N - 1) / block_size) contents."""
    sched.hitbuf.clear()
    if not sched.caching or sched.C[s] > 0:
        return 0
    cdef int64_t i, most = (sched.N[s] - 1) // sched.bs
    cdef unordered_map[int64_t, int32_t].iterator it
    for i in range(most):
        it = sched.cached.find(_key(sched, s, i))
        if it == sched.cached.end():
            break
        sched.hitbuf.push_back(deref(it).second)
    return 0

cdef void _hit(CompiledScheduler sched, int32_t s) noexcept:
    """Start `s`'s empty table with the blocks in `hitbuf`; free ones leave the list."""
    cdef int32_t b
    for b in sched.hitbuf:
        if sched.holders[b] == 0:
            _free_unlink(sched, b)
        sched.holders[b] += 1
        sched.gtable[s].push_back(b)
    sched.cached_upto[s] = <int32_t>sched.hitbuf.size()

