# The trace writer of the compiled scheduler (included by compiled.pyx): each step's
# line, as the simulation loop (compiled_simulation.pxi, `simulate` with lines) writes it.

# The line kvsched.spec.trace.step_fields makes of the step's parts, as orjson writes
# it, byte for byte (tests/test_compiled.py holds it to that): the keys in
# step_fields' order, each only where step_fields writes it; ids as JSON once, when
# they arrive; the few parts that hold text (aborted ids, rejection reasons, block
# keys) through orjson itself. A step then costs no Python object per entry.

cdef void _line_head(CompiledScheduler sched, int64_t step, list arrival_slots, list aborted,
                     bint block_ids):
    """The line up to its scheduled entries, and its new blocks and prefix hits
    (which `update` would release), before `update`."""
    cdef string *o = &sched.line
    cdef Py_ssize_t k
    cdef int32_t s, j, b
    cdef bint first
    first_id = sched.config.first_block_id
    o.assign(b'{"step":')
    o.append(to_string(step))
    if arrival_slots:
        o.append(b',"arrivals":[')
        for k in range(len(arrival_slots)):
            s = arrival_slots[k]
            if k:
                o.push_back(b',')
            o.append(b'{"id":')
            o.append(sched.id_json[s])
            o.append(b',"prompt_len":')
            o.append(to_string(sched.P[s]))
            o.append(b',"max_tokens":')
            o.append(to_string(sched.O[s]))
            o.append(b',"priority":')
            o.append(to_string(sched.prio[s]))
            o.push_back(b'}')
        o.push_back(b']')
    if aborted:
        o.append(b',"aborted":')
        o.append(<bytes>orjson.dumps(aborted))
    if sched.rejected_now:
        o.append(b',"rejected":')
        o.append(<bytes>orjson.dumps([{"id": r.id, "reason": r.reason}
                                      for r in sched.rejected_now]))
    if sched.pre_slot.size():
        o.append(b',"preempted":[')
        for k in range(<Py_ssize_t>sched.pre_slot.size()):
            if k:
                o.push_back(b',')
            o.append(b'{"id":')
            o.append(sched.id_json[sched.pre_slot[k]])
            o.append(b',"mode":"swap"}' if sched.pre_mode[k] == SWAP
                     else b',"mode":"recompute"}')
        o.push_back(b']')
    if sched.in_slot.size():
        o.append(b',"swapped_in":')
        _id_list(sched, o, sched.in_slot)
    if sched.e_slot.size():
        o.append(b',"scheduled":[')
        for k in range(<Py_ssize_t>sched.e_slot.size()):
            if k:
                o.push_back(b',')
            o.push_back(b'[')
            o.append(sched.id_json[sched.e_slot[k]])
            o.push_back(b',')
            o.append(to_string(sched.e_n[k]))
            o.push_back(b']')
        o.push_back(b']')
    cdef string *t = &sched.line_blocks
    t.clear()
    if block_ids:
        t.append(b',"new_blocks":{')
        first = True
        for k in range(<Py_ssize_t>sched.e_slot.size()):
            if not sched.e_count[k]:
                continue
            s = sched.e_slot[k]
            if not first:
                t.push_back(b',')
            first = False
            t.append(sched.id_json[s])
            t.append(b':[')
            for j in range(sched.e_start[k], sched.e_start[k] + sched.e_count[k]):
                if j > sched.e_start[k]:
                    t.push_back(b',')
                t.append(to_string(sched.gtable[s][j] + <int64_t>first_id))
            t.push_back(b']')
        t.push_back(b'}')
    first = True
    for k in range(<Py_ssize_t>sched.e_slot.size()):
        if not sched.e_hits[k]:
            continue
        s = sched.e_slot[k]
        t.append(b',"prefix_hits":{' if first else b',')
        first = False
        t.append(sched.id_json[s])
        t.append(b':[')
        for j in range(sched.e_hits[k]):
            if j:
                t.push_back(b',')
            t.append(to_string(sched.gtable[s][j] + <int64_t>first_id))
        t.push_back(b']')
    if not first:
        t.push_back(b'}')

cdef void _id_list(CompiledScheduler sched, string *o, vector[int32_t] &slots):
    """The slots' ids as a JSON array."""
    cdef Py_ssize_t k
    o.push_back(b'[')
    for k in range(<Py_ssize_t>slots.size()):
        if k:
            o.push_back(b',')
        o.append(sched.id_json[slots[k]])
    o.push_back(b']')

cdef bytes _line_end(CompiledScheduler sched, dict keys):
    """The whole line, after `update` (its finishes and free blocks), before the
    finished requests' slots go."""
    cdef string *o = &sched.line
    cdef int32_t s
    cdef Py_ssize_t k
    if sched.finished_now.size():
        o.append(b',"finished":')
        _id_list(sched, o, sched.finished_now)
    o.append(b',"free_blocks":')
    o.append(to_string(sched.nfree))
    o.append(sched.line_blocks)
    if keys:
        o.append(b',"block_keys":')
        o.append(<bytes>orjson.dumps(keys))
    o.append(b'}\n')
    return o[0]

