# distutils: language = c++
# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""The spec's transition rule and invariants, compiled: the fast checker's state.

NOTE on the method. This is kvsched.spec.state.State.apply (its phases, one method
each, named and ordered as there, PHASES: arrivals and aborts, rejections, preemptions,
reclaims, swap-ins, the scheduled set with its prefix hits and block handouts,
finishes, dedups) and every condition `judge` in kvsched.spec.checker evaluates
(must.py, should.py, and the progress count of should.Stall; `_judge`), ported line
by line, with one difference of purpose: it only answers whether a step is clean. `FastState.apply` takes one step line as orjson parsed it,
checks it as spec.trace.parse_step would accept it, moves the state and returns 1 when
the spec would accept the line and flag nothing; otherwise it returns 0 at once and
leaves the state part-moved. It also returns 0 on anything it does not handle (a step
that schedules nothing while requests are live, a prefix hit with repeated blocks or
blocks out of range, an id or value of an unexpected type). The fast checker
(kvsched.optimized.checker) then puts the state back (`restore`, from a
kvsched.spec.checker.Position) and has the spec's own Checker check that line, so the
verdicts agree by construction: a change to the transition rule is a change to a
phase of spec/state.py plus its twin of the same name here. The phases of the rules this
state does not model (lazy preemption's reclaims, prefix caching's dedups, pipelined
steps' `released` and `unsampled`) hand any step that names them to the spec's state.

Made with `facts`, it also counts what the steps it applies did, as kvsched.metrics
reads it off the spec's StepFacts (`take_facts`: a RunFacts, in columns, no Python
object per scheduled entry), so that the metrics of a trace need not move the spec's
state through its clean steps either.

Where each part comes from: `apply`'s phases (PHASES), `_hand_out`, `_cache_full` and
`_hit` mirror State's methods of the same names, `_release` State._release_gpu; the
conditions it refuses are must.py's (kv-budget, cpu-budget, token-budget, seq-limit,
token-range, one-state, preempt, finish, reject, block-ids, accounting) and should.py's
(no-idle, no-thrash, needed-preemption, progress, and the steps where starvation's
passed_over finds someone: `_passed_over`); `_reserve`, `_needed` and `_own_chunk` are
spec/blocks.py's allocation_reserve and blocks_needed and should.own_chunk_blocks. The
state goes in and out only as the spec's own values (`restore` takes a Position,
`position` makes one), never through the spec's fields.
"""

from libcpp.vector cimport vector
from cython.operator cimport dereference as deref, preincrement as inc
from libcpp.pair cimport pair
from libcpp.algorithm cimport sort
from libc.stdint cimport int64_t
from libc.string cimport memcpy
from cpython cimport array
from cpython.long cimport PyLong_CheckExact
from cpython.float cimport PyFloat_CheckExact
from cpython.unicode cimport PyUnicode_CheckExact
from cpython.list cimport PyList_CheckExact
from cpython.dict cimport PyDict_CheckExact

import array

from kvsched.optimized.facts import RunFacts
from kvsched.optimized.knobs import MAX_POOL_BLOCKS
from kvsched.spec.checker import Position
from kvsched.spec.model import Request, Status
from kvsched.spec.state import NEVER_ARRIVED, LiveRequest, Snapshot

cdef int64_t MAXC = 1 << 40
# Above this many GPU blocks the per-block arrays would be too large: the spec checks
# (the fast schedulers' limit, as their free lists are made at start too).
MAX_BLOCKS = MAX_POOL_BLOCKS

cdef extern from *:
    """
    #include <set>
    // A waiting request's place in should.rank's order: priority (0 unless ranked by
    // priority), arrival step, then its slot.
    struct WaitKey {
        long long prio; long long arrival; int slot;
        bool operator<(const WaitKey &o) const {
            if (prio != o.prio) return prio < o.prio;
            if (arrival != o.arrival) return arrival < o.arrival;
            return slot < o.slot;
        }
    };
    typedef std::set<WaitKey> WaitSet;
    """
    ctypedef struct WaitKey:
        long long prio
        long long arrival
        int slot
    cdef cppclass WaitSet:
        cppclass iterator:
            WaitKey& operator*()
            iterator operator++()
            bint operator==(iterator)
            bint operator!=(iterator)
        WaitSet()
        iterator begin()
        iterator end()
        void insert(WaitKey&)
        size_t erase(WaitKey&)
        void clear()
        size_t size()

cdef enum:
    WAITING = 0
    RUNNING = 1
    SWAPPED = 2
    ENDED = 3

cdef enum:  # this step's transient states (spec.state's tags)
    T_SWAPPED_OUT = 1
    T_PREEMPTED = 2
    T_SWAPPED_IN = 3
    T_SCHEDULED = 4

cdef enum:  # the step keys
    K_STEP = 0
    K_ARRIVALS
    K_ABORTED
    K_REJECTED
    K_PREEMPTED
    K_SWAPPED_IN
    K_SCHEDULED
    K_FINISHED
    K_RECLAIMED
    K_DEDUP
    K_FREE
    K_NEW
    K_TIME
    K_HITS
    K_KEYS
    K_COUNT  # how many

KEYS = {"step": K_STEP, "arrivals": K_ARRIVALS, "aborted": K_ABORTED,
        "rejected": K_REJECTED, "preempted": K_PREEMPTED, "swapped_in": K_SWAPPED_IN,
        "scheduled": K_SCHEDULED, "finished": K_FINISHED, "reclaimed": K_RECLAIMED,
        "dedup": K_DEDUP, "free_blocks": K_FREE,
        "new_blocks": K_NEW, "time_ms": K_TIME, "prefix_hits": K_HITS,
        "block_keys": K_KEYS}
SPEC_ONLY = frozenset({"released", "unsampled"})
# State.apply's phases, named and ordered as there (tests/test_fast_checker.py reads
# both): a change to the transition rule is a change to spec/state.py's phase and to
# its twin here.
PHASES = ("_inputs", "_rejections", "_preemptions", "_reclaims", "_swap_ins", "_schedule",
          "_finishes", "_dedups")
STATUS = (Status.WAITING, Status.RUNNING, Status.SWAPPED)
CODE = {Status.WAITING: WAITING, Status.RUNNING: RUNNING, Status.SWAPPED: SWAPPED}


cdef inline bint count_of(object v, int64_t lo, int64_t* out):
    """An integer as parse_step takes it (not a bool) in lo..2**40 (lo = -MAXC: of
    absolute value at most 2**40)."""
    cdef long long x
    if not PyLong_CheckExact(v):
        return False
    try:
        x = v
    except OverflowError:
        return False
    if x < lo or x > MAXC:
        return False
    out[0] = x
    return True


cdef inline bint an_id(object v):
    return PyUnicode_CheckExact(v) and len(<str>v) > 0


cdef Py_ssize_t _keys(object v):
    """How many object keys a dict or list holds, at every depth; -1 when it holds a
    float."""
    cdef Py_ssize_t n = 0, m
    if PyDict_CheckExact(v):
        n = len(<dict>v)
        values = (<dict>v).values()
    else:
        values = <list>v
    for x in values:
        if PyDict_CheckExact(x) or PyList_CheckExact(x):
            m = _keys(x)
            if m < 0:
                return -1
            n += m
        elif PyFloat_CheckExact(x):
            return -1
    return n


cpdef bint read_alike(object obj, bytes raw, Py_ssize_t size, object dumps):
    """Whether `obj`, orjson's value of the line raw[:size], is what Python's json reads
    there (kvsched.optimized.checker.read_line's rule): orjson refuses what json refuses
    (and huge integers, lone surrogates and NaN besides), so the two differ only on a
    key twice in one object, where orjson keeps the last. Every colon of a line is a
    key's or one inside a string, so orjson's value holds every key of the line exactly
    when its keys, at every depth, are as many as the line's colons (a key dropped or a
    colon in a string makes them differ, never agree wrongly); a value with a float
    (time_ms, or an integer past 64 bits, which orjson reads as a float) is not counted.
    Otherwise orjson (`dumps`) must write the value back to the same bytes."""
    cdef const char* text = raw
    cdef Py_ssize_t k, colons = 0, keys = -1
    for k in range(size):
        if text[k] == 58:  # b":"
            colons += 1
    if PyDict_CheckExact(obj) or PyList_CheckExact(obj):
        keys = _keys(obj)
    elif not PyFloat_CheckExact(obj):
        keys = 0
    return keys == colons or dumps(obj) == raw[:size]


cdef inline int64_t cdiv(int64_t a, int64_t b):
    return -((-a) // b) if a < 0 else (a + b - 1) // b


cdef inline int64_t needed(int64_t computed, int64_t n, int64_t held, int64_t bs,
                           int64_t reserve):
    """spec.blocks.blocks_needed."""
    cdef int64_t tokens = computed + n
    if reserve > tokens:
        tokens = reserve
    cdef int64_t x = cdiv(tokens, bs) - held
    return x if x > 0 else 0


cdef struct Victim:
    int64_t known
    int64_t computed
    int64_t held
    int64_t released


include "columns.pxi"


cdef class FastState:
    """The spec's State and the Checker's counters, for one trace's config; see the
    module's NOTE. `arrived(rid)` says whether an id that is neither live nor in
    `ended` has ever arrived (the spec's record of ended ids)."""

    # config
    cdef int64_t bs, nblocks, first, mml, max_batched, max_seqs, threshold, watermark
    cdef int64_t mpl  # max_prompt_len: the front end's limit, 0 for none
    cdef int64_t num_cpu, max_preemptions
    cdef bint chunked, caching, scope_always, ordered
    cdef bint by_priority, starve  # starvation's rank by priority first; judged at all
    cdef int alloc  # 0 lazy, 1 prompt, 2 full
    cdef public object config
    cdef public bint usable  # False: this state cannot hold the trace's state
    cdef object arrived

    # the state
    cdef public int64_t free, free_host, leaked, steps_with_free, step_no, quiet
    cdef public bint ids_seen
    cdef public int64_t ids_missing_from  # -1: None
    cdef int64_t running, live, seq
    # per slot
    cdef vector[int64_t] N, C, G, H, P, O, prio, arr, pre, order
    cdef vector[int] status, tag, recomputing
    cdef WaitSet waiting  # the waiting slots in should.rank's order (`_status`)
    cdef bint waiting_stale  # `waiting` is to be made again from `status` (after `save`)
    cdef vector[int64_t] tag_at, exp, exp_at, seen_at, sampled_at
    cdef vector[vector[int64_t]] bids
    cdef list rids, keys, reqs
    cdef vector[int] spare
    # slots whose ids, keys, request or block ids changed since the last `save` between
    # this state and `partner` (which then differs from it in those slots only)
    cdef vector[int] dirty
    cdef vector[char] is_dirty
    cdef FastState partner
    cdef dict index  # live id -> slot
    # per block (id - first_block_id)
    cdef vector[vector[int]] holders
    cdef vector[int64_t] cached_at, mark
    cdef list cached_key, content
    # per step
    cdef int64_t stamp, hit_no, free_before, reclaim, demand, tokens
    cdef int64_t at_step  # the step's number, and its ms at start and end
    cdef double at_start, at_end
    cdef bint thrash  # a victim went past no-thrash's limit
    # the requests admitted in the step, with their tokens and new blocks
    # (should.passed_over); free blocks and running requests before the finishes
    cdef vector[int] adm_s
    cdef vector[int64_t] adm_n, adm_db
    cdef int64_t at_batch, run_at_batch
    # the metrics' facts (`collect`): tokens computed, of prompts, blocks the finishes
    # released
    cdef int64_t f_comp, f_prompt, f_fin_released
    cdef vector[Victim] victims
    cdef vector[int] expected, sampled
    cdef object new_blocks

    # counted since the last `take_counts`
    cdef public int64_t steps, entries, requests
    cdef public dict ended  # ids ended since the last `take_ended`, and how
    cdef public list thrashed  # (step, id, preemptions) of no-thrash, since `take_thrashed`
    cdef public dict unknown  # unknown step keys, at their first line

    # the metrics' facts of the steps applied since the last `take_facts` (RunFacts),
    # when collected
    cdef bint collect
    cdef public double clock  # ms at the end of the last step applied
    cdef int64_t nswapped  # live requests swapped out
    cdef vector[int64_t] last_at  # per slot: the last step it sampled since `restore`
    cdef vector[double] last_clock
    cdef FactColumns f

    def __init__(self, config, int64_t max_preemptions, bint preempted_order, arrived,
                 bint facts=False):
        self.config = config
        self.collect = facts
        self.f = FactColumns()
        self.clock = 0.0
        self.nswapped = 0
        self._clear_facts()
        self.bs = config.block_size
        self.nblocks = config.num_gpu_blocks
        self.first = config.first_block_id
        self.mml = config.max_model_len
        self.mpl = config.max_prompt_len
        self.max_batched = config.max_num_batched_tokens
        self.max_seqs = config.max_num_seqs
        self.threshold = config.long_prefill_token_threshold
        self.watermark = config.watermark_blocks
        self.num_cpu = config.num_cpu_blocks
        self.chunked = config.chunked_prefill
        self.caching = config.prefix_caching
        self.scope_always = config.watermark_scope == "always"
        self.alloc = {"lazy": 0, "prompt": 1, "full": 2}[config.allocation]
        self.max_preemptions = max_preemptions
        self.ordered = preempted_order
        self.by_priority = config.policy == "priority"
        self.starve = config.step_mix == "any"  # should.starvation_judged
        self.arrived = arrived
        self.usable = self.nblocks <= MAX_BLOCKS
        self.unknown = {}
        self.ended = {}
        self.thrashed = []
        n = self.nblocks if self.usable else 0
        self.holders.resize(n)
        self.cached_at.assign(n, -1)
        self.mark.assign(n, -1)
        self.cached_key = [None] * n
        self.content = [None] * n
        self.rids, self.keys, self.reqs = [], [], []
        self.index = {}
        self.partner = None
        self.free, self.free_host = self.nblocks, self.num_cpu
        self.ids_seen, self.ids_missing_from = False, -1
        self.leaked = self.steps_with_free = self.quiet = 0
        self.step_no = -1
        self.running = self.live = self.seq = self.stamp = self.hit_no = 0
        self.steps = self.entries = self.requests = 0

    # -- the state in and out, as the spec's values ------------------------------------

    cdef void _clear(self):
        cdef int64_t b
        for b in range(<int64_t>self.holders.size()):
            self.holders[b].clear()
            self.cached_at[b] = -1
        n = <int64_t>self.holders.size()
        self.cached_key = [None] * n
        self.content = [None] * n
        self.N.clear(); self.C.clear(); self.G.clear(); self.H.clear(); self.P.clear()
        self.O.clear(); self.prio.clear(); self.arr.clear(); self.pre.clear()
        self.order.clear(); self.status.clear(); self.tag.clear(); self.tag_at.clear()
        self.waiting.clear()
        self.waiting_stale = False
        self.recomputing.clear(); self.exp.clear(); self.exp_at.clear()
        self.seen_at.clear(); self.sampled_at.clear(); self.bids.clear(); self.spare.clear()
        self.last_at.clear(); self.last_clock.clear()
        self.nswapped = 0
        self.rids, self.keys, self.reqs = [], [], []
        self.index = {}
        self.dirty.clear(); self.is_dirty.clear()
        self.partner = None
        self.ended = {}
        self.thrashed = []
        self.running = self.live = 0
        self.steps = self.entries = self.requests = 0

    cdef inline WaitKey _wait_key(self, int s) noexcept:
        cdef WaitKey k
        k.prio, k.arrival, k.slot = self._rank_prio(s), self.arr[s], s
        return k

    cdef void _rank_waiting(self) noexcept:
        """`waiting` made again from `status`."""
        cdef int s
        cdef WaitKey k
        self.waiting.clear()
        for s in range(<int>self.status.size()):
            if self.status[s] == WAITING:
                k = self._wait_key(s)
                self.waiting.insert(k)
        self.waiting_stale = False

    cdef inline void _status(self, int s, int st) noexcept:
        """`s`'s status becomes `st`, the waiting set following it (its rank is set)."""
        cdef WaitKey k
        if self.status[s] == st:
            return
        if self.status[s] == WAITING:
            k = self._wait_key(s)
            self.waiting.erase(k)
        elif st == WAITING:
            k = self._wait_key(s)
            self.waiting.insert(k)
        self.status[s] = st

    cdef int _slot(self, str rid, object request, int64_t P, int64_t O, int64_t prio,
                   int64_t arr, int st):
        cdef int s
        if self.spare.size():
            s = self.spare.back()
            self.spare.pop_back()
            self.rids[s], self.keys[s], self.reqs[s] = rid, [], request
        else:
            s = <int>self.N.size()
            self.N.push_back(0); self.C.push_back(0); self.G.push_back(0)
            self.H.push_back(0); self.P.push_back(0); self.O.push_back(0)
            self.prio.push_back(0); self.arr.push_back(0); self.pre.push_back(0)
            self.order.push_back(0); self.status.push_back(ENDED); self.tag.push_back(0)
            self.tag_at.push_back(-1); self.recomputing.push_back(0)
            self.exp.push_back(0); self.exp_at.push_back(-1); self.seen_at.push_back(-1)
            self.sampled_at.push_back(-1); self.bids.push_back(vector[int64_t]())
            self.last_at.push_back(-1); self.last_clock.push_back(0.0)
            self.is_dirty.push_back(0)
            self.rids.append(rid); self.keys.append([]); self.reqs.append(request)
        self.N[s] = P; self.C[s] = 0; self.G[s] = 0; self.H[s] = 0
        self.P[s] = P; self.O[s] = O; self.prio[s] = prio; self.arr[s] = arr
        self.pre[s] = 0; self.order[s] = self.seq; self._status(s, st)
        self.tag_at[s] = -1; self.recomputing[s] = 0; self.exp_at[s] = -1
        self.seen_at[s] = -1; self.sampled_at[s] = -1; self.bids[s].clear()
        self.last_at[s] = -1
        self.seq += 1
        self.index[rid] = s
        self._touch(s)
        self.live += 1
        if st == RUNNING:
            self.running += 1
        elif st == SWAPPED:
            self.nswapped += 1
        return s

    def restore(self, p):
        """Become the state of the Position `p` (kvsched.spec.checker); `usable` is
        False afterwards when this state cannot hold it (a block id outside the cache,
        holders that are not their blocks' live owners)."""
        cdef int s
        cdef int64_t b, j
        cdef vector[pair[int64_t, int]] held, owned
        self._clear()
        snap = p.state
        for t in snap.live:
            r = t.request
            if t.status not in CODE:
                self.usable = False
                return
            s = self._slot(r.id, r, r.prompt_len, r.max_tokens, r.priority, r.arrival_step,
                           CODE[t.status])
            self.N[s], self.C[s], self.G[s], self.H[s] = (t.num_tokens, t.num_computed,
                                                          t.gpu_blocks, t.host_blocks)
            self.pre[s] = t.preemptions
            self.recomputing[s] = t.recomputing
            self.keys[s] = list(t.keys)
            for x in t.block_ids:
                b = x - self.first
                if b < 0 or b >= self.nblocks:
                    self.usable = False
                    return
                self.bids[s].push_back(b)
                owned.push_back(pair[int64_t, int](b, s))
        for x, hs in snap.holders.items():
            b = x - self.first
            if b < 0 or b >= self.nblocks:
                self.usable = False
                return
            for rid in hs:
                found = self.index.get(rid)
                if found is None:
                    self.usable = False
                    return
                s = found
                self.holders[b].push_back(s)
                held.push_back(pair[int64_t, int](b, s))
        # Every holder is a live request holding the block, and the other way round.
        sort(held.begin(), held.end())
        sort(owned.begin(), owned.end())
        if held != owned:
            self.usable = False
            return
        for x, (at, key) in snap.cached.items():
            b = x - self.first
            if b < 0 or b >= self.nblocks or at < 0:
                self.usable = False
                return
            self.cached_at[b] = at
            self.cached_key[b] = key
        if len(snap.content) != len(snap.cached):
            self.usable = False
            return
        for x, c in snap.content.items():
            b = x - self.first
            if b < 0 or b >= self.nblocks or self.cached_at[b] < 0:
                self.usable = False
                return
            self.content[b] = c
        self.free, self.free_host = snap.free, snap.free_host
        self.ids_seen = snap.ids_seen
        self.ids_missing_from = -1 if snap.ids_missing_from is None else snap.ids_missing_from
        self.leaked, self.steps_with_free = p.leaked, p.steps_with_free
        self.step_no, self.quiet = p.step_no, p.quiet
        self.usable = self.nblocks <= MAX_BLOCKS

    def position(self):
        """The state as a Position (kvsched.spec.checker), for the spec's Checker."""
        cdef int s
        cdef int64_t b
        cdef vector[pair[int64_t, int]] live
        for s in range(<int>self.N.size()):
            if self.status[s] != ENDED:
                live.push_back(pair[int64_t, int](self.order[s], s))
        sort(live.begin(), live.end())
        out = []
        for k in range(<int>live.size()):
            s = live[k].second
            r = self.reqs[s]
            if r is None:
                r = Request(self.rids[s], self.P[s], self.O[s], self.prio[s], self.arr[s])
                self.reqs[s] = r
                self._touch(s)
            out.append(LiveRequest(r, STATUS[self.status[s]], self.N[s], self.C[s],
                                   self.G[s], self.H[s], self.pre[s],
                                   [x + self.first for x in self.bids[s]],
                                   bool(self.recomputing[s]), list(self.keys[s])))
        holders, cached, content = {}, {}, {}
        rids = self.rids
        for b in range(<int64_t>self.holders.size()):
            if self.holders[b].size():
                holders[b + self.first] = tuple([rids[x] for x in self.holders[b]])
            if self.cached_at[b] >= 0:
                cached[b + self.first] = (self.cached_at[b], self.cached_key[b])
                content[b + self.first] = self.content[b]
        snap = Snapshot(tuple(out), self.free, self.free_host, holders, cached, content,
                        self.ids_seen,
                        None if self.ids_missing_from < 0 else self.ids_missing_from)
        return Position(snap, self.leaked, self.steps_with_free, self.step_no, self.quiet)

    def save(self, FastState into not None):
        """Copy this state into `into` (another FastState of the same config), counts
        and ended ids included: `into.save(self)` puts it back. Between two states that
        were last saved one into the other, only the slots either changed since (their
        ids, keys, request and block ids: `_touch`) are copied besides the per-slot
        numbers, so a save costs little more than a memory copy however many requests
        wait (a queue of 100k requests is common in an overloaded trace)."""
        cdef int s
        cdef size_t k
        cdef Py_ssize_t n = len(self.rids)
        into.free, into.free_host, into.leaked = self.free, self.free_host, self.leaked
        into.steps_with_free, into.step_no, into.quiet = (self.steps_with_free,
                                                          self.step_no, self.quiet)
        into.ids_seen, into.ids_missing_from = self.ids_seen, self.ids_missing_from
        into.running, into.live, into.seq = self.running, self.live, self.seq
        into.nswapped, into.clock = self.nswapped, self.clock
        into.last_at, into.last_clock = self.last_at, self.last_clock
        into.N, into.C, into.G, into.H, into.P = self.N, self.C, self.G, self.H, self.P
        into.O, into.prio, into.arr, into.pre = self.O, self.prio, self.arr, self.pre
        into.order, into.status, into.tag, into.tag_at = (self.order, self.status,
                                                          self.tag, self.tag_at)
        into.waiting_stale = True  # made again if `into` moves: it seldom does
        into.recomputing, into.exp, into.exp_at = self.recomputing, self.exp, self.exp_at
        into.seen_at, into.sampled_at = self.seen_at, self.sampled_at
        if self.partner is into and into.partner is self:
            for changed in (self.dirty, into.dirty):  # the ids they hold there go
                for k in range(changed.size()):
                    s = changed[k]
                    if s < len(into.rids):
                        rid = into.rids[s]
                        if rid is not None and into.index.get(rid) == s:
                            del into.index[rid]
            if len(into.rids) > n:
                del into.rids[n:], into.keys[n:], into.reqs[n:]
            else:
                into.rids.extend([None] * (n - len(into.rids)))
                into.keys.extend([None] * (n - len(into.keys)))
                into.reqs.extend([None] * (n - len(into.reqs)))
            into.bids.resize(n)
            for changed in (self.dirty, into.dirty):
                for k in range(changed.size()):
                    s = changed[k]
                    if s < n:
                        rid = self.rids[s]
                        into.rids[s], into.reqs[s] = rid, self.reqs[s]
                        ks = self.keys[s]
                        into.keys[s] = None if ks is None else list(ks)
                        into.bids[s] = self.bids[s]
                        if rid is not None:
                            into.index[rid] = s
        else:
            into.bids = self.bids
            into.rids = list(self.rids)
            into.keys = [None if ks is None else list(ks) for ks in self.keys]
            into.reqs = list(self.reqs)
            into.index = dict(self.index)
        for k in range(self.dirty.size()):
            self.is_dirty[self.dirty[k]] = 0
        self.dirty.clear()
        into.dirty.clear()
        into.is_dirty.assign(n, 0)
        self.partner, into.partner = into, self
        into.spare = self.spare
        into.holders, into.cached_at = self.holders, self.cached_at
        into.cached_key, into.content = list(self.cached_key), list(self.content)
        into.steps, into.entries, into.requests = self.steps, self.entries, self.requests
        into.ended = dict(self.ended)
        into.thrashed = list(self.thrashed)
        into.usable = self.usable
        if into.stamp < self.stamp:  # stamps only grow: this step's marks stay its own
            into.stamp = self.stamp

    def take_counts(self):
        """(steps, scheduled entries, arrivals) applied since the last call."""
        out = (self.steps, self.entries, self.requests)
        self.steps = self.entries = self.requests = 0
        return out

    def take_thrashed(self):
        """(step, id, preemptions) of each victim no-thrash flags (preempted one time
        more than the limit) in the steps applied since the last call."""
        out = self.thrashed
        self.thrashed = []
        return out

    def take_ended(self):
        """The ids that ended since the last call, and how (State.record_ended's)."""
        out = self.ended
        self.ended = {}
        return out

    def take_facts(self):
        """The RunFacts of the steps applied since the last call (or `clear_facts`);
        collected only by a state made with `facts`."""
        return self.f.take(self.clock)

    def clear_facts(self):
        """Drop the facts collected since the last `take_facts` (as after a step that
        was not clean, which leaves them part-counted like the state)."""
        self._clear_facts()

    cdef void _clear_facts(self):
        self.f.clear()

    def last_samples(self):
        """(id, step, ms at its end) of the last step in which each live request sampled
        since `restore` (with `facts`): what the metrics need when the spec's state
        takes over."""
        cdef int s
        return [(self.rids[s], self.last_at[s], self.last_clock[s])
                for s in range(<int>self.N.size())
                if self.status[s] != ENDED and self.last_at[s] >= 0]

    # -- moving (spec.state.State) -----------------------------------------------------

    cdef inline int64_t _reserve(self, int s, int64_t known) noexcept:
        """spec.blocks.allocation_reserve."""
        cdef int64_t whole
        if self.alloc == 1:
            return known
        if self.alloc == 2:
            whole = self.P[s] + self.O[s]
            return whole if whole < self.mml else self.mml
        return 0

    cdef int64_t _release(self, int s):
        """State._release_gpu."""
        cdef int64_t released = self.G[s] - <int64_t>self.bids[s].size()
        cdef int64_t b
        cdef size_t k, i
        for k in range(self.bids[s].size()):
            b = self.bids[s][k]
            for i in range(self.holders[b].size()):
                if self.holders[b][i] == s:
                    self.holders[b].erase(self.holders[b].begin() + i)
                    break
            if self.holders[b].size() == 0:
                released += 1
        self.free += released
        self.G[s] = 0
        self.bids[s].clear()
        self._touch(s)
        return released

    cdef int64_t _end(self, int s, object how):
        """State._end: what it released."""
        cdef int64_t released = self._release(s)
        self.free_host += self.H[s]
        self.H[s] = 0
        if self.status[s] == RUNNING:
            self.running -= 1
        elif self.status[s] == SWAPPED:
            self.nswapped -= 1
        self._status(s, ENDED)
        self.live -= 1
        rid = self.rids[s]
        del self.index[rid]
        self.ended[rid] = how
        self.rids[s] = None
        self.keys[s] = None
        self.reqs[s] = None
        self._touch(s)
        self.spare.push_back(s)
        return released

    cdef inline void _expect(self, int s, int64_t blocks):
        if self.exp_at[s] != self.stamp:
            self.exp_at[s] = self.stamp
            self.exp[s] = 0
            self.expected.push_back(s)
        self.exp[s] += blocks

    cdef inline void _touch(self, int s):
        """Slot `s`'s ids, keys, request or block ids change (see `save`)."""
        if not self.is_dirty[s]:
            self.is_dirty[s] = 1
            self.dirty.push_back(s)

    cdef bint _hand_out(self, int s) except -1:
        """State._hand_out, refusing what block-ids flags: a count other than the
        expected, a block outside the cache or still held."""
        cdef int64_t b, x
        if self.new_blocks is None or self.seen_at[s] == self.stamp:
            return True
        self.seen_at[s] = self.stamp
        given = (<dict>self.new_blocks).get(self.rids[s])
        cdef int64_t want = self.exp[s] if self.exp_at[s] == self.stamp else 0
        if given is None:
            return want == 0
        if not PyList_CheckExact(given) or len(<list>given) != want:
            return False
        self._touch(s)
        for v in <list>given:
            if not count_of(v, 0, &x):
                return False
            b = x - self.first
            if b < 0 or b >= self.nblocks or self.holders[b].size():
                return False
            self.holders[b].push_back(s)
            if self.cached_at[b] >= 0:
                self.cached_at[b] = -1
                self.cached_key[b] = None
                self.content[b] = None
                self.f.evicted += 1
            self.bids[s].push_back(b)
        return True

    cdef void _cache_full(self, int s, int64_t computed):
        """State._cache_full."""
        if not self.caching or <int64_t>self.bids[s].size() != self.G[s]:
            return
        cdef int64_t j, b
        cdef list keys = self.keys[s]
        cdef int64_t nkeys = len(keys)
        for j in range(computed // self.bs, self.C[s] // self.bs):
            key = keys[j] if j < nkeys else None
            b = self.bids[s][j]
            self.cached_at[b] = j
            self.cached_key[b] = key
            self.content[b] = key if key is not None else f"{self.rids[s]}/{j}"

    cdef bint _hit(self, int s, object blocks) except -1:
        """State._hit on a request in state waiting, refusing what token-range and
        block-ids flag (and repeated blocks, or blocks outside the cache)."""
        cdef int64_t b, x, j = 0, h, evictable = 0
        if not self.caching or not PyList_CheckExact(blocks):
            return False
        if self.C[s] > 0 or self.G[s] > 0 or self.bids[s].size():
            return False
        h = len(<list>blocks)
        if h * self.bs > self.N[s] - 1:
            return False
        cdef list keys = self.keys[s]
        cdef int64_t nkeys = len(keys)
        cdef bint tracked = self.ids_missing_from < 0
        self.hit_no += 1
        for v in <list>blocks:
            if not count_of(v, 0, &x):
                return False
            b = x - self.first
            if b < 0 or b >= self.nblocks or self.mark[b] == self.hit_no:
                return False
            self.mark[b] = self.hit_no
            if tracked:
                if self.cached_at[b] != j:
                    return False
                key = keys[j] if j < nkeys else None
                cached = self.cached_key[b]
                if key is not None and cached is not None and key != cached:
                    return False
            if self.holders[b].size() == 0:
                evictable += 1
            j += 1
        for v in <list>blocks:
            b = <int64_t>v - self.first
            self.holders[b].push_back(s)
            self.bids[s].push_back(b)
        self._touch(s)
        self.G[s] = h
        self.C[s] = h * self.bs
        self.free -= evictable
        self.demand += evictable
        return True

    cdef inline int64_t _own_chunk(self, const Victim& v):
        """should.own_chunk_blocks."""
        cdef int64_t n = v.known - v.computed
        if 0 < self.threshold < n:
            n = self.threshold
        if n > self.max_batched:
            n = self.max_batched
        return needed(v.computed, n, v.held, self.bs, 0)

    def apply_lines(self, list raws, Py_ssize_t i, int64_t line, list run,
                    Py_ssize_t limit, object loads, object dumps, bint keep=False,
                    bint encoded=False):
        """`apply` on the lines raws[i:] (each as read, with its newline), the first at
        line `line`, while each is a step line that orjson (`loads`, `dumps`) reads as
        kvsched.optimized.checker.read_line does and that is clean, and `run` holds
        fewer than `limit`: each one applied goes to `run` as (line, None, raw), or with
        `keep` (line, its value, raw). `encoded`: the lines are as orjson writes them (a
        key once in each object), so orjson's value is taken without counting keys.
        Returns (j, obj): raws[i:j] were applied; obj is raws[j]'s value when it was
        read and is not clean (the state part-moved), else None (raws[j] not read)."""
        cdef Py_ssize_t n = len(raws), size
        cdef bytes raw
        while i < n and len(run) < limit:
            raw = <bytes>raws[i]
            size = len(raw)
            if size and raw[size - 1] == 10:  # b"\n"
                size -= 1
            try:
                obj = loads(raw)
            except Exception:
                return i, None
            if not PyDict_CheckExact(obj) or "step" not in <dict>obj:
                return i, None
            if not encoded and not read_alike(obj, raw, size, dumps):
                return i, None
            if not self.apply(obj, line):
                return i, obj
            run.append((line, obj if keep else None, raw))
            i += 1
            line += 1
        return i, None

    cpdef int apply(self, object obj, int64_t line) except -1:
        """Move the state by the step line `obj` (orjson's object of line `line`): 1
        when the spec reads it alike and flags nothing, 2 when it flags only no-thrash,
        for the victims this adds to `thrashed` (moved as the spec's state), else 0 (the
        state part-moved). The phases are State.apply's, named and ordered as there
        (PHASES), then the step's invariants (`_judge`, checker.judge's)."""
        cdef dict d
        cdef int64_t step, x = 0
        cdef double start = self.clock, end = self.clock
        if not self.usable or not PyDict_CheckExact(obj):
            return 0
        if self.waiting_stale:
            self._rank_waiting()
        d = <dict>obj
        values = [None] * K_COUNT
        for key, v in d.items():
            code = KEYS.get(key)
            if code is None:
                if key in SPEC_ONLY:
                    # the keys of the rules this state does not model (pipelined steps),
                    # which on a config it takes name what no state allows: the spec's
                    # state moves and judges them
                    return 0
                if key not in self.unknown:
                    self.unknown[key] = line
                continue
            c = <int>code
            if K_ARRIVALS <= c <= K_DEDUP and not PyList_CheckExact(v):
                return 0  # the lists
            if (c == K_NEW or c >= K_HITS) and not PyDict_CheckExact(v):
                return 0  # the maps
            values[c] = v
        (step_v, arrivals, aborted, rejected, preempted, swapped_in, scheduled, finished,
         reclaimed, dedup, free_blocks, new_blocks, time_ms, hits, bkeys) = values
        if step_v is None or not count_of(step_v, 0, &step) or step != self.step_no + 1:
            return 0
        if free_blocks is not None and not count_of(free_blocks, 0, &x):
            return 0
        if time_ms is not None:
            if PyLong_CheckExact(time_ms):
                if time_ms < 0:
                    return 0
            elif not PyFloat_CheckExact(time_ms) or not time_ms >= 0:
                return 0
        self.stamp += 1
        if self.collect and time_ms is not None:
            try:
                end = start + <double>time_ms
            except OverflowError:
                return 0
        self.new_blocks = new_blocks
        self.victims.clear()
        self.expected.clear()
        self.sampled.clear()
        self.adm_s.clear()
        self.adm_n.clear()
        self.adm_db.clear()
        self.reclaim = self.demand = self.tokens = 0
        self.at_step, self.at_start, self.at_end = step, start, end
        self.thrash = False
        self.f_comp = self.f_prompt = self.f_fin_released = 0
        if not self._inputs(arrivals, aborted, bkeys):
            return 0
        self.free_before = self.free
        if not self._rejections(rejected) or not self._preemptions(preempted) \
                or not self._reclaims(reclaimed) or not self._swap_ins(swapped_in, scheduled) \
                or not self._schedule(scheduled, hits) or not self._finishes(finished) \
                or not self._dedups(dedup):
            return 0
        if not self._judge(free_blocks, x, bool(scheduled) or bool(preempted)
                           or bool(swapped_in)):
            return 0
        if self.collect:
            if time_ms is None and self.f.untimed < 0:
                self.f.untimed = step
            self.clock = end
        self.step_no = step
        self.quiet = 0
        self.steps += 1
        self.entries += len(<list>scheduled) if scheduled else 0
        self.requests += len(<list>arrivals) if arrivals else 0
        return 2 if self.thrash else 1

    # -- the phases (State.apply's), each 1 when it moved the state as the spec's would
    # and flagged nothing, else 0 at once

    cdef int _inputs(self, list arrivals, list aborted, dict bkeys) except -1:
        """Phase 1: arrivals become waiting, then aborts end their requests, then the
        block keys join their requests' (State._inputs)."""
        cdef int64_t p, o, pr
        if arrivals:
            for a in arrivals:
                if not PyDict_CheckExact(a):
                    return 0
                rid = (<dict>a).get("id")
                pv = (<dict>a).get("prompt_len")
                ov = (<dict>a).get("max_tokens")
                prv = (<dict>a).get("priority", 0)
                if not an_id(rid) or pv is None or ov is None:
                    return 0
                if not count_of(pv, 1, &p) or not count_of(ov, 1, &o) \
                        or not count_of(prv, -MAXC, &pr):
                    return 0
                if rid in self.index or rid in self.ended \
                        or self.arrived(rid) != NEVER_ARRIVED:
                    return 0  # one-state: it arrives again
                self._slot(rid, None, p, o, pr, self.at_step, WAITING)
                if self.collect:
                    self.f.a_ids.append(rid)
                    self.f.a_step.push_back(self.at_step)
                    self.f.a_clock.push_back(self.at_start)
        if aborted:
            for rid in aborted:
                if not an_id(rid):
                    return 0
                found = self.index.get(rid)
                if found is None:
                    return 0
                self._end(found, Status.ABORTED)
                if self.collect:
                    self.f.ab_ids.append(rid)
        if bkeys:
            for rid, ks in bkeys.items():
                if not PyList_CheckExact(ks):
                    return 0
                for kk in <list>ks:
                    if not an_id(kk):
                        return 0
                found = self.index.get(rid)
                if found is not None:
                    (<list>self.keys[<int>found]).extend(<list>ks)
                    self._touch(<int>found)
        return 1

    cdef int _rejections(self, list rejected) except -1:
        """Phase 2: a rejected waiting request ends (State._rejections)."""
        cdef int s
        if rejected:
            for r in rejected:
                if not PyDict_CheckExact(r) or "id" not in <dict>r:
                    return 0
                rid = (<dict>r)["id"]
                if not an_id(rid):
                    return 0
                found = self.index.get(rid)
                if found is None or self.status[<int>found] != WAITING:
                    return 0
                s = found
                if not self._rejectable(s):
                    return 0
                self._end(s, Status.REJECTED)
                if self.collect:
                    self.f.rj_ids.append(rid)
        return 1

    cdef int _preemptions(self, list preempted) except -1:
        """Phase 3: recompute releases G and sets C = 0 (back to waiting); swap moves
        the G blocks to host (State._preemptions). Lazy preemption is the spec's."""
        cdef int s
        cdef Victim vic
        if preempted:
            for q in preempted:
                if not PyDict_CheckExact(q) or "id" not in <dict>q:
                    return 0
                mode = (<dict>q).get("mode")
                rid = (<dict>q)["id"]
                if not PyUnicode_CheckExact(mode) or not an_id(rid):
                    return 0
                found = self.index.get(rid)
                if found is None or self.status[<int>found] != RUNNING:
                    return 0  # preempt: only a running request is a victim
                s = found
                self.pre[s] += 1
                if self.pre[s] == self.max_preemptions + 1:  # no-thrash
                    self.thrashed.append((self.at_step, rid, self.pre[s]))
                    self.thrash = True
                vic.known, vic.computed, vic.held = self.N[s], self.C[s], self.G[s]
                if mode == "swap":
                    if self.G[s] > self.free_host:
                        return 0  # cpu-budget
                    self.free_host -= self.G[s]
                    self.H[s] = self.G[s]
                    vic.released = self._release(s)
                    self.running -= 1
                    self._status(s, SWAPPED)
                    self.nswapped += 1
                    self.tag[s], self.tag_at[s] = T_SWAPPED_OUT, self.stamp
                elif mode == "recompute":
                    vic.released = self._release(s)
                    self.C[s] = 0
                    self.recomputing[s] = 1
                    self.running -= 1
                    self._status(s, WAITING)
                    self.tag[s], self.tag_at[s] = T_PREEMPTED, self.stamp
                else:
                    return 0
                self.victims.push_back(vic)
                if self.collect:
                    if mode == "swap":
                        self.f.swaps += 1
                    else:
                        self.f.recomputes += 1
                        self.f.recomputed += vic.computed
                self.reclaim += vic.released
        return 1

    cdef int _reclaims(self, list reclaimed) except -1:
        """Phase 3, after the victims (State._reclaims): lazy preemption's reclaims,
        which this state does not model (the configs it takes have no lazy victims or
        held requests to reclaim): a step that names any goes to the spec's state."""
        return 0 if reclaimed is not None else 1

    cdef int _swap_ins(self, list swapped_in, list scheduled) except -1:
        """Phase 4: the host blocks come back to the GPU, with the blocks the allocation
        reserves (State._swap_ins)."""
        cdef int s
        cdef int64_t reserve, taken
        if swapped_in:
            on = set()
            if scheduled:
                for e in scheduled:
                    if PyList_CheckExact(e) and len(<list>e) == 2 \
                            and PyUnicode_CheckExact((<list>e)[0]):
                        on.add((<list>e)[0])
            for rid in swapped_in:
                if not an_id(rid):
                    return 0
                found = self.index.get(rid)
                if found is None:
                    return 0
                s = found
                if self.status[s] != SWAPPED or self.tag_at[s] == self.stamp:
                    return 0
                reserve = self._reserve(s, self.N[s])
                taken = self.H[s] + needed(self.C[s], 0, self.H[s], self.bs, reserve)
                self.G[s] = taken
                self.free -= taken
                self.free_host += self.H[s]
                self.demand += taken
                self._expect(s, taken)
                self.H[s] = 0
                self.running += 1
                self._status(s, RUNNING)
                self.nswapped -= 1
                self.f.swap_ins += 1
                self.tag[s], self.tag_at[s] = T_SWAPPED_IN, self.stamp
                if rid not in on:
                    if not self._hand_out(s):
                        return 0
                    self._cache_full(s, 0)
        return 1

    cdef int _schedule(self, list scheduled, dict hits) except -1:
        """Phase 5: the scheduled set, in batch order: each entry's hit, its new blocks
        and their ids, its tokens, and a sample where C reaches N (State._schedule);
        then the new blocks of the step's other requests, and the sequence limit."""
        cdef int s, tg
        cdef int64_t n, known, computed, reserve, db, k, hit_tokens
        cdef int64_t hits_used = 0, step = self.at_step
        cdef bint admitting
        cdef object new_blocks = self.new_blocks
        if scheduled:
            for e in scheduled:
                if not PyList_CheckExact(e) or len(<list>e) != 2:
                    return 0
                rid = (<list>e)[0]
                if not an_id(rid) or not count_of((<list>e)[1], -MAXC, &n):
                    return 0
                found = self.index.get(rid)
                if found is None:
                    return 0
                s = found
                tg = self.tag[s] if self.tag_at[s] == self.stamp else 0
                if not (tg == T_SWAPPED_IN or (tg == 0 and self.status[s] != SWAPPED)):
                    return 0  # one-state
                if n < 1:
                    return 0  # token-range
                hit_tokens = 0
                if hits is not None:
                    blocks = hits.get(rid)
                    if blocks is not None:
                        if tg != 0 or self.status[s] != WAITING or not self._hit(s, blocks):
                            return 0
                        hits_used += 1
                        hit_tokens = self.C[s]
                self.tag[s], self.tag_at[s] = T_SCHEDULED, self.stamp
                self.tokens += n
                known, computed = self.N[s], self.C[s]
                if computed + n > known or computed + n > self.mml:
                    return 0  # token-range
                if not self.chunked and n != known - computed:
                    return 0  # token-range: whole prefills
                reserve = 0
                admitting = self.status[s] == WAITING
                if admitting:
                    self._status(s, RUNNING)
                    self.running += 1
                    reserve = self._reserve(s, known)
                    if self.collect and self.caching:
                        self.f.m_ids.append(rid)
                        self.f.m_known.push_back(known)
                        self.f.m_hit.push_back(hit_tokens)
                db = needed(computed, n, self.G[s], self.bs, reserve)
                if admitting:
                    self.adm_s.push_back(s)
                    self.adm_n.push_back(n)
                    self.adm_db.push_back(db)
                self.demand += db
                self.free -= db
                self.G[s] += db
                self._expect(s, db)
                if self.recomputing[s]:
                    self.recomputing[s] = 0
                    if new_blocks is not None:
                        restart = (<dict>new_blocks).get(rid)
                        k = 0
                        if restart is not None:
                            if not PyList_CheckExact(restart):
                                return 0
                            k = len(<list>restart)
                        if k != db:
                            return 0  # preempt: it kept blocks
                self.C[s] = computed + n
                self.f_comp += n
                if computed < self.P[s]:
                    self.f_prompt += (computed + n if computed + n < self.P[s]
                                      else self.P[s]) - computed
                if not self._hand_out(s):
                    return 0
                self._cache_full(s, 0 if tg == T_SWAPPED_IN else computed)
                if self.C[s] == known:
                    self.N[s] += 1
                    self.sampled_at[s] = self.stamp
                    self.sampled.push_back(s)
                    if self.collect:
                        if known == self.P[s]:  # its first token
                            self.f.t_ids.append(rid)
                            self.f.t_step.push_back(step)
                            self.f.t_clock.push_back(self.at_end)
                        self.last_at[s] = step
                        self.last_clock[s] = self.at_end
                    if known >= self.mml and not (known == self.P[s] == self.mml):
                        return 0  # finish: past max_model_len
        if hits is not None and hits_used != len(hits):
            return 0  # one-state: a hit on a request not scheduled
        if new_blocks is not None:
            for rid, given in (<dict>new_blocks).items():
                found = self.index.get(rid)
                if found is not None and self.exp_at[<int>found] == self.stamp:
                    if not self._hand_out(found):
                        return 0
                    continue
                if not PyList_CheckExact(given):
                    return 0
                if len(<list>given):
                    return 0  # block-ids: blocks to a request that needs none
                    # (an empty list needs no check of its entries)
            self.ids_seen = True
        elif self.ids_missing_from < 0:
            for k in range(<int64_t>self.expected.size()):
                if self.exp[self.expected[k]] > 0:
                    self.ids_missing_from = step
                    break
        if self.running > self.max_seqs:
            return 0  # seq-limit
        return 1

    cdef int _finishes(self, list finished) except -1:
        """Phase 6: a finished request releases everything (State._finishes); one that
        reached its limit finishes."""
        cdef int s
        cdef int64_t k
        self.at_batch = self.free
        self.run_at_batch = self.running
        if finished:
            for rid in finished:
                if not an_id(rid):
                    return 0
                found = self.index.get(rid)
                if found is None or self.sampled_at[<int>found] != self.stamp:
                    return 0  # one-state, or finish without a sampled token
                s = found
                if self.collect:
                    self.f.d_ids.append(rid)
                    self.f.d_step.push_back(self.at_step)
                    self.f.d_out.push_back(self.N[s] - self.P[s])
                    self.f.d_clock.push_back(self.at_end)
                self.f_fin_released += self._end(s, Status.FINISHED)
        for k in range(<int64_t>self.sampled.size()):
            s = self.sampled[k]
            if self.status[s] == ENDED:
                continue
            if self.N[s] - self.P[s] >= self.O[s] or self.N[s] >= self.mml:
                return 0  # finish: it reached its limit but did not finish
        return 1

    cdef int _dedups(self, list dedup) except -1:
        """Phase 7 (prefix caching; State._dedups): a running request's table starting
        with another's blocks, which this state does not model: a step that names any
        goes to the spec's state."""
        return 0 if dedup is not None else 1

    cdef int _judge(self, object free_blocks, int64_t x, bint moved) except -1:
        """The step's invariants (checker.judge) on the state the phases left, and the
        step's facts counted (`x`: free_blocks' value)."""
        if self.demand > self.free_before + self.reclaim:
            return 0  # kv-budget
        if self.tokens > self.max_batched:
            return 0  # token-budget
        if self.victims.size() and not self._needed_preemption():
            return 0
        if free_blocks is not None:
            if x != self.free and self.free - self.leaked != x:
                return 0  # accounting
        if not moved and self.live > 0:
            return 0  # no-idle and progress: the spec's Checker judges such a step
        if self.adm_s.size() and self.starve and self._passed_over(
                self.adm_s, self.adm_n, self.adm_db, self.at_batch, self.run_at_batch):
            return 0  # starvation: the spec's Checker judges such a step
        if free_blocks is not None:
            self.leaked = self.free - x
            self.steps_with_free += 1
        if self.collect:
            self.f.gen.push_back(self.sampled.size())
            self.f.comp.push_back(self.f_comp)
            self.f.vic.push_back(self.victims.size())
            self.f.wait.push_back(self.live - self.running - self.nswapped)
            self.f.run.push_back(self.running)
            self.f.swap.push_back(self.nswapped)
            self.f.kv.push_back(self.nblocks - x + self.f_fin_released
                                if free_blocks is not None else self.nblocks - self.at_batch)
            self.f.prompt += self.f_prompt
        return 1

    cdef inline int64_t _rank_prio(self, int s) noexcept:
        """The first part of should.rank: the priority under the priority policy."""
        return self.prio[s] if self.by_priority else 0

    cdef bint _passed_over(self, vector[int]& xs, vector[int64_t]& ns,
                           vector[int64_t]& dbs, int64_t at_batch, int64_t running):
        """should.passed_over finds a request passed over: one waiting after the step
        (not one of its victims) that ranks before some request admitted in it (`xs`,
        with the tokens `ns` and new blocks `dbs` of each), never preempted and still
        live, and whose smallest next chunk fits in that one's place. The waiting
        requests are walked in rank order (`waiting`), up to the last such admitted
        one's rank, as should.passed_over walks the live ones in arrival order."""
        cdef int w, x
        cdef size_t k
        cdef int64_t n, need, pw, px, lp = 0, la = 0
        cdef bint any_x = False
        cdef int64_t seats = running - 1
        cdef int64_t left = self.max_batched - self.tokens
        cdef int64_t wm = self.watermark if self.scope_always or seats > 0 else 0
        if seats >= self.max_seqs:
            return False
        for k in range(xs.size()):  # the last rank among those admitted
            x = xs[k]
            if self.status[x] == ENDED or self.pre[x]:
                continue
            px = self._rank_prio(x)
            if not any_x or px > lp or (px == lp and self.arr[x] > la):
                lp, la, any_x = px, self.arr[x], True
        if not any_x:
            return False
        cdef WaitSet.iterator it = self.waiting.begin()
        while it != self.waiting.end():
            pw, w = deref(it).prio, deref(it).slot
            if pw > lp or (pw == lp and deref(it).arrival >= la):
                break  # ranks no earlier than any of them: nor do the rest
            inc(it)
            if self.tag[w] == T_PREEMPTED and self.tag_at[w] == self.stamp:
                continue
            n = 1 if self.chunked else self.N[w] - self.C[w]
            if n > self.max_batched:
                continue
            need = needed(self.C[w], n, self.G[w], self.bs,
                          self._reserve(w, self.N[w])) + wm
            for k in range(xs.size()):
                x = xs[k]
                if self.status[x] == ENDED or self.pre[x]:
                    continue
                px = self._rank_prio(x)
                if (pw < px or (pw == px and self.arr[w] < self.arr[x])) \
                        and n <= left + ns[k] and need <= at_batch + dbs[k]:
                    return True
        return False

    cdef bint _rejectable(self, int s):
        """spec.blocks.rejectable is not None."""
        cdef int64_t P = self.P[s], O = self.O[s]
        if P >= self.mml or (self.mpl > 0 and P > self.mpl):
            return True
        cdef int64_t longest = P + O if P + O < self.mml else self.mml
        cdef int64_t wm = self.watermark if self.scope_always else 0
        return cdiv(longest, self.bs) + wm > self.nblocks

    cdef bint _needed_preemption(self):
        """should.needed_preemption finds nothing (all victims were running)."""
        cdef size_t k
        cdef int64_t demand
        cdef size_t last = self.victims.size() - 1
        for k in range(last if self.ordered else 0, self.victims.size()):
            demand = self.demand + self._own_chunk(self.victims[k])
            if demand > self.free_before + self.reclaim - self.victims[k].released:
                return True
        return False
