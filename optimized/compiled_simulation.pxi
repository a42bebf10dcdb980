# The simulation loop of the compiled scheduler (included by compiled.pyx): what
# kvsched.simulate.run does around a scheduler (arrivals, aborts, outputs sampled, end of
# sequence, the content keys a trace gives), over the scheduler's own per-slot
# bookkeeping, yielding records or blocks of trace lines (compiled_writer.pxi). The one
# batch entry point besides the Scheduler interface.

def simulate(CompiledScheduler sched, workload, bint block_ids=True, max_steps=None, bint lines=False,
             int64_t stall_steps=DEFAULT_STALL_STEPS):
    """kvsched.simulate.run on the scheduler `sched`, with the loop's bookkeeping (outputs
    sampled, end of sequence at each request's hidden output length, the content
    keys a trace gives with prefix caching) kept per slot beside the scheduler's:
    yields the same StepRecords, one per step, until every request has ended (or
    max_steps). The workload must be sorted by arrival (workload.validate does that);
    it is read as the steps reach each arrival (a generated one is made as it is read).

    With `lines`, the steps come in blocks of up to LINE_BLOCK, each (lines, steps,
    ended): the steps' trace lines as `kvsched.spec.trace.step_fields` makes them
    from the same parts and orjson encodes them, in place of their records, how many
    steps, and how many requests the steps ended.

    As kvsched.simulate.run, after the `stall_steps`-th step in a row that changed
    nothing while work waits (kvsched.spec.should.Stall) it raises Stalled, once that
    step is yielded."""
    items = iter(workload)
    upcoming = next(items, None)  # the next request to arrive
    cdef list arrived = []
    cdef Py_ssize_t k
    cdef int64_t step = 0
    cdef int32_t s
    cdef dict aborts = {}
    cdef list arrivals, aborted, finished, arrival_slots
    cdef list block = []
    cdef Py_ssize_t block_ended = 0
    cdef int64_t quiet = 0  # steps in a row that changed nothing while work waits
    cdef bint stuck = False
    while upcoming is not None or sched.live > 0:
        if max_steps is not None and step >= max_steps:
            break
        arrivals = []
        arrival_slots = []
        while upcoming is not None and upcoming.arrival <= step:
            w = upcoming
            upcoming = next(items, None)
            arrived.append(w)
            if w.abort is not None:  # no sooner than its arrival
                aborts.setdefault(w.abort, []).append(w.id)
            req = w.request(step)
            sched.add_request(req)
            s = sched.slot_of[w.id]
            sched.outputs[s] = 0
            sched.eos[s] = w.output_len
            sched.keyed[s] = 0
            if lines:
                sched.id_json[s] = orjson.dumps(w.id)
            arrivals.append(req)
            arrival_slots.append(s)
        aborted = []
        for rid in aborts.pop(step, ()):
            if rid in sched.slot_of:
                sched.abort_request(rid)
                aborted.append(rid)
        sched._schedule()
        if lines:
            _line_head(sched, step, arrival_slots, aborted, block_ids)
            parts = None
        else:
            parts = sched._parts(False)
        for s in sched.sampled:
            sched.outputs[s] += 1
            if sched.outputs[s] >= sched.eos[s]:
                sched.stop_mark[s] = 1
        keys = {}
        if sched.caching:
            # As kvsched.simulate.run: the arrivals' keys first, then the sampled
            # ones', each once its blocks are full of known tokens.
            for s in arrival_slots:
                if sched.ids[s] is not None:
                    _new_keys(sched, s, keys)
            for s in sched.sampled:
                _new_keys(sched, s, keys)
        sched._update()
        for s in sched.finished_now:
            sched.stop_mark[s] = 0
        line = _line_end(sched, keys) if lines else None
        finished = sched._take_finished()
        # kvsched.spec.should.moves and Stall, on the step's parts.
        if (sched.live > 0 and not (sched.e_slot.size() or sched.pre_slot.size()
                                   or sched.in_slot.size() or len(sched.rejected_now)
                                   or len(finished) or len(aborted))):
            quiet += 1
            stuck = quiet == stall_steps
        else:
            quiet = 0
        if lines:
            block.append(line)
            block_ended += len(finished) + len(aborted) + len(sched.rejected_now)
            if stuck:
                yield b"".join(block), len(block), block_ended
                raise _stalled(sched, arrived, step, stall_steps)
            step += 1
            if len(block) == LINE_BLOCK:
                yield b"".join(block), len(block), block_ended
                block = []
                block_ended = 0
            continue
        rec = StepRecord(step, tuple(arrivals), tuple(aborted), parts[0], parts[1],
                         parts[2], parts[3], tuple(finished), sched.nfree,
                         parts[5] if block_ids else None, None, parts[6], keys)
        yield rec
        if stuck:
            raise _stalled(sched, arrived, step, stall_steps)
        step += 1
    if block:
        yield b"".join(block), len(block), block_ended

def _stalled(CompiledScheduler sched, list arrived, int64_t step, int64_t limit):
    """The Stalled of a run stuck at `step` (kvsched.spec.should.stalled_run)."""
    from kvsched.spec.should import stalled_run  # here: a run that ends never needs it

    live = {w.id: w for w in arrived if w.id in sched.slot_of}
    return stalled_run(sched, lambda rid: live[rid].request(live[rid].arrival), step,
                       limit)

cdef void _new_keys(CompiledScheduler sched, int32_t s, dict keys):
    """The keys of `s`'s blocks that became full of known tokens since the trace last
    gave any (N counts the token sampled this step, as the loop's outputs do)."""
    cdef int64_t i, full = (sched.P[s] + sched.outputs[s]) // sched.bs
    if full <= sched.keyed[s]:
        return
    rid = sched.ids[s]
    prefix = sched._prefix_of(s)
    keys[rid] = tuple([block_key(rid, prefix, i, sched.bs)
                       for i in range(sched.keyed[s], full)])
    sched.keyed[s] = full
