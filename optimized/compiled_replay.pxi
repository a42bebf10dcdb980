# The replay of a profile (included by compiled.pyx): a trace's step lines, as JSON
# objects, compared with the compiled scheduler's decisions as kvsched.spec.replay's
# ProfileReplay compares them (Decision.comparable: rejected ids, victims with their
# modes, swap-ins, the scheduled [id, tokens] pairs, the length of each prefix hit; the
# finishes as a set), with no StepRecord or Decision per step. Whatever it cannot tell
# for certain (a line of another shape, a value parse_step would refuse, an arrival of a
# live id, a prefix hit whose contents only the trace's state knows) ends the comparison
# there: the caller replays those lines through ProfileReplay, which has the last word.

from kvsched.spec.trace import MAX_COUNT, VICTIM_MODES, load_line

cdef list NONE = []  # a step line's absent list: read, never written
cdef dict NO_MAP = {}  # and its absent map


cdef inline bint _count(v, int64_t minimum):
    """Whether `v` is a count parse_step takes (an int, not a bool, in range)."""
    return type(v) is int and minimum <= v <= MAX_COUNT


cdef inline bint _name(v):
    return type(v) is str and len(<str>v) > 0


cdef bint _names(v):
    """A list of non-empty strings."""
    if type(v) is not list:
        return False
    for x in <list>v:
        if not _name(x):
            return False
    return True


cdef bint _block_map(v):
    """{id: [block ids]} as parse_step takes it (new_blocks, prefix_hits)."""
    if type(v) is not dict:
        return False
    for ids in (<dict>v).values():
        if type(ids) is not list:
            return False
        for b in <list>ids:
            if not _count(b, 0):
                return False
    return True


cdef bint _shape(dict obj):
    """The parts of a step line the comparison does not read are as parse_step takes
    them (it reads the rest itself, as strictly)."""
    free = obj.get("free_blocks")
    if free is not None and not _count(free, 0):
        return False
    if "new_blocks" in obj and not _block_map(obj["new_blocks"]):
        return False
    if "prefix_hits" in obj and not _block_map(obj["prefix_hits"]):
        return False
    t = obj.get("time_ms")
    if t is not None and (type(t) is not int and type(t) is not float or t < 0):
        return False
    return True


cdef int _arrivals(CompiledScheduler sch, list arrivals, step) except -1:
    """Add the step's arrivals; 1 where one cannot be (bad shape, an id already live)."""
    cdef int64_t prompt, max_tokens, priority
    for a in arrivals:
        if type(a) is not dict:
            return 1
        rid = (<dict>a).get("id")
        prompt_len = (<dict>a).get("prompt_len")
        out = (<dict>a).get("max_tokens")
        prio = (<dict>a).get("priority", 0)
        if not (_name(rid) and _count(prompt_len, 1) and _count(out, 1)
                and type(prio) is int and abs(prio) <= MAX_COUNT):
            return 1
        if rid in sch.slot_of:
            return 1
        sch._arrive(rid, prompt_len, out, prio, step, ())
    return 0


cdef bint _victims_same(CompiledScheduler sch, list preempted, bint ordered) except -1:
    cdef Py_ssize_t k, n = sch.pre_slot.size()
    if len(preempted) != n:
        return False
    theirs = []
    for p in preempted:
        if type(p) is not dict:
            return False
        rid = (<dict>p).get("id")
        mode = (<dict>p).get("mode")
        if not _name(rid) or mode not in VICTIM_MODES:
            return False
        theirs.append((rid, mode))
    mine = [(sch.ids[sch.pre_slot[k]], MODE_NAMES[sch.pre_mode[k]]) for k in range(n)]
    return mine == theirs if ordered else sorted(mine) == sorted(theirs)


cdef bint _scheduled_same(CompiledScheduler sch, list scheduled) except -1:
    cdef Py_ssize_t k, n = sch.e_slot.size()
    cdef list ids = sch.ids, pair
    cdef int64_t tokens
    if len(scheduled) != n:
        return False
    for k in range(n):
        item = scheduled[k]
        if type(item) is not list or len(<list>item) != 2:
            return False
        pair = <list>item
        rid = pair[0]
        count = pair[1]
        if not _name(rid) or not _count(count, -MAX_COUNT):
            return False
        tokens = count  # in range: a C integer, not a Python one made per entry
        if sch.e_n[k] != tokens:
            return False
        mine = ids[sch.e_slot[k]]
        if mine is not rid and mine != rid:
            return False
    return True


cdef bint _hits_same(CompiledScheduler sch, dict hits) except -1:
    """Each hit by its length, as a set of (id, length): the trace's and the profile's."""
    cdef Py_ssize_t k, n = sch.e_slot.size(), mine = 0
    for k in range(n):
        if sch.e_hits[k]:
            mine += 1
    if mine != len(hits):
        return False
    ids = sch.ids
    for rid, blocks in hits.items():
        for k in range(n):
            if ids[sch.e_slot[k]] == rid:
                break
        else:
            return False
        if sch.e_hits[k] != len(blocks):
            return False
    return True


cdef bint _finishes_same(CompiledScheduler sch, list finished) except -1:
    """Sample and finish as `update(set(finished))` does; whether the finished are the
    trace's, as a set."""
    cdef int32_t s
    cdef vector[int32_t] marked
    cdef bint same = True
    for rid in finished:
        slot = sch.slot_of.get(rid)
        if slot is None:
            same = False  # an id the profile does not hold cannot finish
        elif not sch.stop_mark[<int32_t>slot]:
            sch.stop_mark[<int32_t>slot] = 1
            marked.push_back(<int32_t>slot)
    sch._update()
    if sch.finished_now.size() != marked.size():
        same = False
    for s in sch.finished_now:
        if not sch.stop_mark[s]:
            same = False
    for s in marked:
        sch.stop_mark[s] = 0
    if same:
        sch._take_finished()
    return same


cdef int _line_same(CompiledScheduler sch, given, Py_ssize_t line, set keyed, list newly,
                    bint ordered, bint implied) except -1:
    """One step line through the scheduler; 1 where it differs or cannot be told here."""
    cdef Py_ssize_t k
    obj = load_line(given, line) if type(given) is bytes else given
    if type(obj) is not dict:
        return 1
    cdef dict o = <dict>obj
    step = o.get("step")
    if not _count(step, 0) or not _shape(o):
        return 1
    # (an absent part: one shared empty list or dict, never written to)
    arrivals = o.get("arrivals", NONE)
    aborted = o.get("aborted", NONE)
    rejected = o.get("rejected", NONE)
    preempted = o.get("preempted", NONE)
    swapped_in = o.get("swapped_in", NONE)
    scheduled = o.get("scheduled", NONE)
    finished = o.get("finished", NONE)
    hits = o.get("prefix_hits", NO_MAP)
    keys = o.get("block_keys", NO_MAP)
    if (type(arrivals) is not list or type(rejected) is not list
            or type(preempted) is not list or type(scheduled) is not list
            or not (_names(aborted) and _names(swapped_in) and _names(finished))):
        return 1
    if type(keys) is not dict:
        return 1
    for ks in (<dict>keys).values():
        if not _names(ks):
            return 1
    # Inputs, as ProfileReplay gives them: arrivals, aborts, the trace's content keys.
    if _arrivals(sch, arrivals, step):
        return 1
    for rid in aborted:
        if rid not in sch.slot_of:
            return 1
        sch.abort_request(rid)
    for rid, ks in (<dict>keys).items():
        if rid not in keyed:
            keyed.add(rid)
            newly.append(rid)
        sch.add_block_keys(rid, ks)
    if implied:
        for rid in hits:
            if rid not in keyed:
                return 1  # its contents are what the trace's state implies
    sch._schedule()
    # The decision, compared as Decision.comparable compares it; then the finishes.
    if len(sch.rejected_now) != len(rejected):
        return 1
    for k in range(len(rejected)):
        r = rejected[k]
        if type(r) is not dict or not _name((<dict>r).get("id")):
            return 1
        if sch.rejected_now[k].id != (<dict>r)["id"]:
            return 1
    if not _victims_same(sch, preempted, ordered):
        return 1
    if <Py_ssize_t>sch.in_slot.size() != len(swapped_in):
        return 1
    for k in range(len(swapped_in)):
        if sch.ids[sch.in_slot[k]] != swapped_in[k]:
            return 1
    if not _scheduled_same(sch, scheduled) or not _hits_same(sch, hits):
        return 1
    return 0 if _finishes_same(sch, finished) else 1


def replay_lines(CompiledScheduler scheduler, list lines, set keyed, list newly,
                 bint ordered):
    """Replay `lines` ((line number, step line as a JSON object or its bytes), in order)
    on `scheduler`, each compared as ProfileReplay compares it (`ordered`: victims in
    order, else as a set); returns the index of the first line that differs or that
    only ProfileReplay can tell (after which the scheduler's state is lost), or -1.
    `keyed` is ProfileReplay's set of requests whose keys the trace gives; the ids this
    adds to it are appended to `newly`. With prefix caching, a hit of a request without
    keys is left to ProfileReplay (the trace's state gives its contents)."""
    cdef Py_ssize_t k
    cdef bint implied = scheduler.caching
    for k in range(len(lines)):
        line, given = lines[k]
        try:
            if _line_same(scheduler, given, line, keyed, newly, ordered, implied):
                return k
        except Exception:  # ProfileReplay says what it is, in its words
            return k
    return -1
