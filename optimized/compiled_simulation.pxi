# The simulation loop of the compiled scheduler (included by compiled.pyx): what
# kvsched.simulate.run does around a scheduler (arrivals, aborts, outputs sampled, end of
# sequence, the content keys a trace gives), over the scheduler's own per-slot
# bookkeeping, yielding records or blocks of trace lines (compiled_writer.pxi) with,
# if asked, what the steps did (`_Facts`: the metrics' RunFacts, counted off the
# decisions). The one batch entry point besides the Scheduler interface.

def simulate(CompiledScheduler sched, workload, bint block_ids=True, max_steps=None, bint lines=False,
             int64_t stall_steps=DEFAULT_STALL_STEPS, bint facts=False):
    """kvsched.simulate.run on the scheduler `sched`, with the loop's bookkeeping (outputs
    sampled, end of sequence at each request's hidden output length, the content
    keys a trace gives with prefix caching) kept per slot beside the scheduler's:
    yields the same StepRecords, one per step, until every request has ended (or
    max_steps). The workload must be sorted by arrival (workload.validate does that);
    it is read as the steps reach each arrival (a generated one is made as it is read).

    With `lines`, the steps come in blocks of up to LINE_BLOCK, each (lines, steps,
    ended, facts): the steps' trace lines as `kvsched.spec.trace.step_fields` makes
    them from the same parts and orjson encodes them, in place of their records, how
    many steps, how many requests the steps ended, and (with `facts`; else None) what
    they did, as a kvsched.optimized.facts.RunFacts: the facts the compiled state would
    count reading those lines (FastState(..., facts=True)), counted off the decisions,
    so that the metrics need not read the lines back.

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
    cdef _Facts counted = _Facts() if lines and facts else None
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
                if counted is not None:
                    counted.arrive(w.id, step)
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
            if counted is not None:
                counted.decided(sched, step, aborted)
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
        if counted is not None:
            counted.finished(sched, step)
        finished = sched._take_finished()
        if counted is not None:
            counted.queues(sched)
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
                yield b"".join(block), len(block), block_ended, _take(counted)
                raise _stalled(sched, arrived, step, stall_steps)
            step += 1
            if len(block) == LINE_BLOCK:
                yield b"".join(block), len(block), block_ended, _take(counted)
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
        yield b"".join(block), len(block), block_ended, _take(counted)

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


cdef object _take(_Facts counted):
    return counted.take(0.0) if counted is not None else None


cdef class _Facts(FactColumns):
    """The RunFacts of the steps simulated since the last `take`, counted off the
    scheduler's decisions by the definitions FastState applies to their trace lines
    (its phases, with `facts`): no time_ms (each run is untimed from its first step,
    its clock 0), arrivals at their step; victims and what the recompute victims had
    computed; swap-ins; cached blocks allocated again; admissions by the waiting pass
    (N known, and the tokens their prefix hits cover: those computed before the chunk);
    tokens computed and sampled, of prompts, first tokens (sampled with N = the
    prompt); finishes (outputs: N - prompt); the queues once the step's ended requests
    are gone; blocks held while the batch ran (before the finishes freed theirs)."""

    cdef void arrive(self, rid, int64_t step):
        self.a_ids.append(rid)
        self.a_step.push_back(step)
        self.a_clock.push_back(0.0)

    cdef void decided(self, CompiledScheduler sched, int64_t step, list aborted):
        """The step's decision, after `_schedule` and before `_update`."""
        cdef Py_ssize_t k
        cdef int32_t s
        if self.untimed < 0:
            self.untimed = step
        self.ab_ids.extend(aborted)
        for r in sched.rejected_now:
            self.rj_ids.append(r.id)
        for k in range(<Py_ssize_t>sched.pre_slot.size()):
            if sched.pre_mode[k] == SWAP:
                self.swaps += 1
            else:
                self.recomputes += 1
                self.recomputed += sched.pre_computed[k]
        self.swap_ins += sched.in_slot.size()
        self.evicted += sched.evicted_now
        if sched.caching:
            for k in range(<Py_ssize_t>sched.e_slot.size()):
                if sched.e_admitted[k]:
                    s = sched.e_slot[k]
                    self.m_ids.append(sched.ids[s])
                    self.m_known.push_back(sched.N[s])
                    self.m_hit.push_back(sched.C[s] - sched.e_n[k] if sched.e_hits[k]
                                         else 0)
        for s in sched.sampled:
            if sched.N[s] == sched.P[s]:
                self.t_ids.append(sched.ids[s])
                self.t_step.push_back(step)
                self.t_clock.push_back(0.0)
        self.gen.push_back(sched.sampled.size())
        self.comp.push_back(sched.tokens_now)
        self.vic.push_back(sched.pre_slot.size())
        self.prompt += sched.prompt_now
        self.kv.push_back(sched.nb - sched.nfree)

    cdef void finished(self, CompiledScheduler sched, int64_t step):
        """The step's finishes, after `_update` and before their slots go."""
        cdef int32_t s
        for s in sched.finished_now:
            self.d_ids.append(sched.ids[s])
            self.d_step.push_back(step)
            self.d_out.push_back(sched.N[s] - sched.P[s])
            self.d_clock.push_back(0.0)

    cdef void queues(self, CompiledScheduler sched):
        """The queues once the step's ended requests are gone."""
        cdef int64_t running = sched.running.size(), swapped = sched.swapped.size()
        self.wait.push_back(sched.live - running - swapped)
        self.run.push_back(running)
        self.swap.push_back(swapped)
