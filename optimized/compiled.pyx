# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False, embedsignature=True
# distutils: language = c++
"""The compiled scheduler: the reference's decisions, one loop per step, in C++.

NOTE on the algorithm. This is the reference's step (docs/spec.md section 2; the
reference scheduler has it in Python), written again with the state in C++ vectors,
so that a step over a few hundred running requests takes microseconds instead of the
hundreds a Python loop (or a few dozen torch calls) takes:

- a request is a slot: N known, C computed, prompt, max_tokens, priority, arrival, seq,
  status, preemptions, a GPU block table and a host one;
- the running pass walks `running` in order while the token budget lasts; when a
  request's new blocks do not fit it preempts a victim (the tail, or the largest
  (priority, arrival, seq)) and retries, a victim scheduled earlier in the step giving
  its tokens back; it stops (or, knob continue_after_self_preemption, goes on) when the
  victim is the request itself;
- unless the step preempted (knob admit_after_preempt), the swap-in pass and then the
  waiting pass admit in queue order while the budget, the sequence limit and the blocks
  (the whole sequence under knob reserve_full_sequence, plus the watermark) allow; the
  first that does not fit stops the pass, but for a prompt above the budget left without
  chunked prefill under knob over_budget_prompt "skip", which is passed over and pushed
  back to the queue's front when the pass ends;
- victims queue again only at the end of the step; computed tokens advance; those that
  catch up sample in `update`.

The waiting queue is a deque (fcfs, preempted requests at its front) or a binary heap
on (priority, arrival, seq); an aborted or rejected request's entry stays in it and is
recognised as stale (its slot's seq or status no longer match). GPU blocks are a
doubly linked free list in vLLM's order; with prefix caching (vLLM v1's block pool) a
block has holders and a content key, and each key lists the blocks cached under it,
first cached first. Content keys are 64-bit integers: (content id, block index) for
the keys a request's shared prefix gives (kvsched.spec.prefix: the string
"content/index"), or an id of their own for other strings a trace gives; the Python
side interns the strings, so two keys are equal exactly when their strings are.

Every rule that is arithmetic of the spec (which arrivals are rejected and why, auto
preemption's cost model) is called from the spec, once per event, not written again.
This module never imports the reference: it is an independent implementation, checked
against the reference by tests/test_differential.py and the reference's own suite.
"""

from libc.stdint cimport int8_t, int32_t, int64_t
from libc.string cimport memcpy
from cpython cimport array
from libcpp.deque cimport deque
from libcpp.string cimport string, to_string
from libcpp.unordered_map cimport unordered_map
from libcpp.vector cimport vector
from cython.operator cimport dereference as deref

import array

import orjson

from kvsched.optimized.facts import RunFacts
from kvsched.optimized.knobs import unsupported_config, unsupported_knobs
from kvsched.spec.blocks import rejectable
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import (
    Decision,
    Preemption,
    Rejection,
    RequestView,
    Status,
    StepRecord,
)
from kvsched.spec.prefix import block_key
from kvsched.spec.violation import DEFAULT_STALL_STEPS
from kvsched.spec.trace import step_fields

cdef extern from *:
    """
    #include <algorithm>
    #include <vector>
    struct WaitEntry { long long prio; long long arrival; long long seq; int slot; };
    struct KvLaterFirst {
        bool operator()(const WaitEntry &a, const WaitEntry &b) const {
            if (a.prio != b.prio) return a.prio > b.prio;
            if (a.arrival != b.arrival) return a.arrival > b.arrival;
            return a.seq > b.seq;
        }
    };
    static inline void kv_heap_push(std::vector<WaitEntry> &h, WaitEntry e) {
        h.push_back(e); std::push_heap(h.begin(), h.end(), KvLaterFirst());
    }
    static inline void kv_heap_pop(std::vector<WaitEntry> &h) {
        std::pop_heap(h.begin(), h.end(), KvLaterFirst()); h.pop_back();
    }
    """
    ctypedef struct WaitEntry:
        long long prio
        long long arrival
        long long seq
        int slot
    void kv_heap_push(vector[WaitEntry] &h, WaitEntry e)
    void kv_heap_pop(vector[WaitEntry] &h)

cdef enum:
    WAITING = 0
    RUNNING = 1
    SWAPPED = 2
    FREE = 3

cdef enum:
    RECOMPUTE = 0
    SWAP = 1
    AUTO = 2

cdef enum:
    LAZY = 0
    PROMPT = 1
    FULL = 2

# A content key is content id * KEY_SPAN + block index (an interned string's own key
# is negative).
DEF KEY_SPAN = 16777216

STATUS_NAMES = {WAITING: Status.WAITING, RUNNING: Status.RUNNING, SWAPPED: Status.SWAPPED}
MODE_NAMES = ("recompute", "swap")
# Steps per block of trace lines simulate(lines=True) hands out: one write and one
# resumption of the loop per block rather than per step.
LINE_BLOCK = 256


cdef inline int64_t cdiv(int64_t a, int64_t b) nogil:
    return (a + b - 1) // b


cdef class CompiledScheduler:
    """The reference's policy in C++: same decisions, block ids included, for every
    profile and knob but vLLM V0's (refused in one line, as the torch scheduler does).

    `knobs` are the spec's (a profile's knobs work as they are); None means vLLM v1's.
    Besides the scheduler interface (kvsched.spec.interface: add_request, abort_request,
    schedule, update, free_blocks, states, has_unfinished, block tables, content keys)
    it offers the fast path of simulation loops (`step_counts`, `step_columns`,
    `finish_step`): the step's decision as numbers, without a Decision's tuples.
    """

    cdef readonly object config
    cdef readonly object knobs
    cdef object cost
    # the config and knobs, as C values
    cdef int64_t bs, nb, ncpu, token_budget, max_seqs, mml, threshold_cfg, watermark
    cdef bint chunked, caching, priority, tail_victims, wm_always
    cdef bint admit_after_preempt, reserve_full, lift_alone, continue_self
    cdef bint free_as_freed, skip_over_budget
    cdef int alloc, pmode
    # per slot
    cdef vector[int64_t] N, C, P, O, prio, arr, seq
    cdef vector[int32_t] status, npre, cached_upto, sched_pos, stop_mark
    cdef vector[int8_t] doomed  # its arrival is rejected at its first step
    cdef vector[int64_t] own  # the content id of the request's own blocks
    cdef vector[vector[int32_t]] gtable, htable
    cdef vector[vector[int64_t]] pre_content, pre_len, given
    cdef vector[int32_t] spare
    cdef int64_t next_seq, live
    # Python side of the slots
    cdef list ids  # slot -> id (None when free)
    cdef dict slot_of  # id -> slot
    cdef dict reasons  # slot -> why its arrival is rejected
    cdef dict contents  # content id string -> its number
    cdef dict key_ids  # given content key string -> its key
    cdef dict early_keys  # keys given for ids not live yet
    cdef dict prefixes  # slot -> its request's shared prefix (prefix caching)
    # queues
    cdef vector[int32_t] running, swapped, victims
    cdef vector[int64_t] arrived_seq
    cdef vector[int32_t] arrived_slot
    cdef deque[WaitEntry] fcfs
    cdef vector[WaitEntry] heap
    # GPU free list: a doubly linked list over pool indices, sentinel nb; host free ids
    cdef vector[int32_t] fprev, fnext
    cdef int64_t nfree
    cdef deque[int32_t] hfree
    # prefix caching: holders and content per block; the blocks cached under each key,
    # a circular list from the first cached
    cdef vector[int32_t] holders, kprev, knext
    cdef vector[int8_t] has_content
    cdef vector[int64_t] content
    cdef unordered_map[int64_t, int32_t] cached
    # the step's decision
    cdef vector[int32_t] e_slot, e_start, e_count, e_hits
    cdef vector[int8_t] e_admitted  # scheduled by the waiting pass
    cdef int64_t prompt_now  # prompt tokens the step computes
    cdef int64_t tokens_now  # tokens the step schedules
    cdef int64_t admitted_now  # requests the waiting pass schedules
    cdef vector[int64_t] e_n
    cdef vector[int32_t] rej_slot, pre_slot, in_slot, sampled
    cdef vector[int8_t] pre_mode
    cdef vector[int64_t] pre_computed
    cdef vector[int32_t] hitbuf
    cdef list rejected_now
    cdef int64_t evicted_now
    cdef vector[int32_t] finished_now
    # the simulation loop's per-slot bookkeeping: tokens sampled, the hidden output
    # length (end of sequence), full blocks whose content keys the trace has given
    cdef vector[int64_t] outputs, eos, keyed
    cdef vector[string] id_json  # each slot's id as JSON (the trace lines' bytes)
    cdef string line, line_blocks  # the step's trace line as it is built

    def __init__(self, config, knobs=None):
        chosen = knobs if knobs is not None else Knobs()
        problems = config.problems() + chosen.problems()
        refused = unsupported_knobs(chosen)
        if refused is not None:
            problems.append(refused)
        if not problems:
            refused = unsupported_config(config)
            if refused is not None:
                problems.append(refused)
        if problems:
            raise ValueError(problems[0])
        self.config = config
        self.knobs = chosen
        self.cost = chosen.cost
        self.bs = config.block_size
        self.nb = config.num_gpu_blocks
        self.ncpu = config.num_cpu_blocks
        self.token_budget = config.max_num_batched_tokens
        self.max_seqs = config.max_num_seqs
        self.mml = config.max_model_len
        self.chunked = config.chunked_prefill
        self.threshold_cfg = config.long_prefill_token_threshold if self.chunked else 0
        self.watermark = config.watermark_blocks
        self.wm_always = config.watermark_scope == "always"
        self.caching = config.prefix_caching
        self.priority = config.policy == "priority"
        rule = chosen.victim
        if rule == "policy":
            rule = "lowest_priority" if self.priority else "tail"
        self.tail_victims = rule == "tail"
        self.admit_after_preempt = chosen.admit_after_preempt
        self.reserve_full = chosen.reserve_full_sequence
        self.lift_alone = chosen.lift_threshold_when_alone
        self.continue_self = chosen.continue_after_self_preemption
        self.free_as_freed = chosen.free_order == "as_freed"
        self.skip_over_budget = chosen.over_budget_prompt == "skip"
        self.alloc = {"lazy": LAZY, "prompt": PROMPT, "full": FULL}[config.allocation]
        self.pmode = {"recompute": RECOMPUTE, "swap": SWAP, "auto": AUTO}[config.preemption]
        self.ids = []
        self.slot_of = {}
        self.reasons = {}
        self.contents = {}
        self.key_ids = {}
        self.early_keys = {}
        self.prefixes = {}
        self.rejected_now = []
        cdef int64_t b
        self.fprev.resize(self.nb + 1)
        self.fnext.resize(self.nb + 1)
        for b in range(self.nb + 1):
            self.fnext[b] = <int32_t>(b + 1 if b < self.nb else 0)
            self.fprev[b] = <int32_t>(b - 1 if b > 0 else self.nb)
        self.nfree = self.nb
        for b in range(self.ncpu):
            self.hfree.push_back(<int32_t>b)
        if self.caching:
            self.holders.resize(self.nb, 0)
            self.kprev.resize(self.nb, -1)
            self.knext.resize(self.nb, -1)
            self.has_content.resize(self.nb, 0)
            self.content.resize(self.nb, 0)

    # -- the interface ----------------------------------------------------------------

    def add_request(self, request):
        self._arrive(request.id, request.prompt_len, request.max_tokens, request.priority,
                     request.arrival_step, request.prefix)

    cdef int32_t _arrive(self, str rid, int64_t prompt_len, int64_t max_tokens,
                         int64_t priority, int64_t arrival, tuple prefix) except -1:
        if rid in self.slot_of:
            raise ValueError(f"request id {rid!r} is already live")
        cdef int32_t s
        if self.spare.size():
            s = self.spare.back()
            self.spare.pop_back()
            self.ids[s] = rid
        else:
            s = <int32_t>len(self.ids)
            self.ids.append(rid)
            self._grow_slots(s + 1)
        self.slot_of[rid] = s
        self.N[s] = prompt_len
        self.C[s] = 0
        self.P[s] = prompt_len
        self.O[s] = max_tokens
        self.prio[s] = priority
        self.arr[s] = arrival
        self.seq[s] = self.next_seq
        self.next_seq += 1
        self.status[s] = WAITING
        self.npre[s] = 0
        self.cached_upto[s] = 0
        self.live += 1
        reason = rejectable(self.config, prompt_len, max_tokens)
        self.doomed[s] = reason is not None
        if reason is not None:
            self.reasons[s] = reason
        if self.caching:
            self.own[s] = self._content_id(rid)
            self.pre_content[s].clear()
            self.pre_len[s].clear()
            if prefix:
                self.prefixes[s] = prefix
            for content, length in prefix:
                self.pre_content[s].push_back(self._content_id(content))
                self.pre_len[s].push_back(length)
            self.given[s].clear()
            early = self.early_keys.pop(rid, None)
            if early:
                self._give_keys(s, early, 0)
        self.arrived_slot.push_back(s)
        self.arrived_seq.push_back(self.seq[s])
        self._push_waiting(s, False)
        return s

    cdef void _grow_slots(self, Py_ssize_t n):
        if <Py_ssize_t>self.N.size() >= n:
            return
        cdef Py_ssize_t m = max(n, 2 * <Py_ssize_t>self.N.size(), 64)
        self.N.resize(m)
        self.C.resize(m)
        self.P.resize(m)
        self.O.resize(m)
        self.prio.resize(m)
        self.arr.resize(m)
        self.seq.resize(m, -1)
        self.status.resize(m, FREE)
        self.npre.resize(m)
        self.cached_upto.resize(m)
        self.sched_pos.resize(m, -1)
        self.stop_mark.resize(m, 0)
        self.doomed.resize(m, 0)
        self.own.resize(m)
        self.gtable.resize(m)
        self.htable.resize(m)
        self.pre_content.resize(m)
        self.pre_len.resize(m)
        self.given.resize(m)
        self.outputs.resize(m)
        self.eos.resize(m)
        self.keyed.resize(m)
        self.id_json.resize(m)

    def add_block_keys(self, request_id, keys, start=None):
        """Content keys of the request's blocks from table index `start` on (by default
        the next ones), as a trace gives them (`block_keys`); they take the place of
        those its prefix would give, and of any given from `start` before."""
        slot = self.slot_of.get(request_id)
        if slot is None:
            # Kept until it arrives, as a key book keyed by id keeps them.
            early = self.early_keys.setdefault(request_id, [])
            early[len(early) if start is None else start:] = keys
            return
        self._give_keys(slot, keys, start)

    cdef void _give_keys(self, int32_t s, keys, start):
        cdef vector[int64_t] *g = &self.given[s]
        cdef Py_ssize_t at = g.size() if start is None else min(<Py_ssize_t>start, <Py_ssize_t>g.size())
        g.resize(at)
        for k in keys:
            g.push_back(self._key_id(k))

    cdef int64_t _content_id(self, str content):
        got = self.contents.get(content)
        if got is None:
            got = len(self.contents)
            self.contents[content] = got
        return got

    cdef int64_t _key_id(self, str key):
        """A given key string as the key the same string names: "content/index" is
        (content, index), as kvsched.spec.prefix.block_key writes it; any other string
        is numbered in `key_ids`. (The first kind is not kept there: a trace gives one per
        block of every request, and the table would hold them all to its end.)"""
        head, sep, tail = key.rpartition("/")
        if (sep and tail.isascii() and tail.isdigit() and (tail == "0" or tail[0] != "0")
                and len(tail) < 9 and int(tail) < KEY_SPAN):
            return self._content_id(head) * KEY_SPAN + int(tail)
        got = self.key_ids.get(key)
        if got is None:
            got = -1 - len(self.key_ids)
            self.key_ids[key] = got
        return got

    def abort_request(self, request_id):
        cdef int32_t s = self.slot_of[request_id]
        cdef int st = self.status[s]
        if st == RUNNING:
            _erase(self.running, s)
        elif st == SWAPPED:
            _erase(self.swapped, s)
        # A waiting entry stays in its queue and is recognised as stale.
        _free_all(self, s)
        self._end(s)

    def free_blocks(self):
        return self.nfree

    def has_unfinished(self):
        return self.live > 0

    def states(self):
        cdef int32_t s
        out = {}
        for rid, s in self.slot_of.items():
            out[rid] = RequestView(STATUS_NAMES[self.status[s]], self.N[s], self.C[s],
                                   self.gtable[s].size(), self.htable[s].size(),
                                   self.npre[s])
        return out

    def block_table(self, request_id):
        slot = self.slot_of.get(request_id)
        if slot is None:
            return ()
        return self._table(<int32_t>slot, 0, self.gtable[<int32_t>slot].size(),
                           self.config.first_block_id)

    def host_table(self, request_id):
        slot = self.slot_of.get(request_id)
        if slot is None:
            return ()
        out = []
        cdef int32_t h
        for h in self.htable[<int32_t>slot]:
            out.append(h)
        return tuple(out)

    def free_gpu_ids(self):
        first = self.config.first_block_id
        out = []
        cdef int32_t b = self.fnext[self.nb]
        while b != self.nb:
            out.append(b + first)
            b = self.fnext[b]
        return tuple(out)

    def free_host_ids(self):
        out = []
        cdef Py_ssize_t k
        for k in range(<Py_ssize_t>self.hfree.size()):
            out.append(self.hfree[k])
        return tuple(out)

    def slot_of_id(self, request_id):
        return self.slot_of[request_id]

    def id_of(self, slot):
        return self.ids[slot]

    # -- one step ---------------------------------------------------------------------

    def schedule(self):
        """The step's decision (phases 2 to 5 of docs/spec.md section 2)."""
        self._schedule()
        return self._decision()

    def step_counts(self):
        """The step's decision, left in the scheduler for `step_columns` (the fast path
        of simulation loops); returns (scheduled entries, tokens, victims, rejections)."""
        cdef int64_t tokens = self._schedule()
        return (self.e_slot.size(), tokens, self.pre_slot.size(), len(self.rejected_now))

    cdef int64_t _schedule(self) except -1:
        self.e_slot.clear()
        self.e_n.clear()
        self.e_start.clear()
        self.e_count.clear()
        self.e_hits.clear()
        self.e_admitted.clear()
        self.prompt_now = 0
        self.admitted_now = 0
        self.pre_slot.clear()
        self.pre_mode.clear()
        self.pre_computed.clear()
        self.in_slot.clear()
        self.rej_slot.clear()
        self.rejected_now = []
        self.evicted_now = 0
        self._reject_arrivals()
        cdef int64_t threshold = self.threshold_cfg
        if self.lift_alone and self.live <= 1:
            threshold = 0
        cdef int64_t budget = self._running_pass(self.token_budget, threshold)
        if self.pre_slot.size() == 0 or self.admit_after_preempt:
            budget = self._swap_in_pass(budget, threshold)
            self._waiting_pass(budget, threshold)
        self._requeue_victims()
        # Computed tokens advance; those that catch up sample in update().
        self.sampled.clear()
        cdef Py_ssize_t k, m = 0
        cdef int32_t s
        cdef int64_t tokens = 0, before
        for k in range(<Py_ssize_t>self.e_slot.size()):
            s = self.e_slot[k]
            if s < 0:
                continue  # taken back from a victim
            self.e_slot[m] = s
            self.e_n[m] = self.e_n[k]
            self.e_start[m] = self.e_start[k]
            self.e_count[m] = self.e_count[k]
            self.e_hits[m] = self.e_hits[k]
            self.e_admitted[m] = self.e_admitted[k]
            m += 1
            self.sched_pos[s] = -1
            before = self.C[s]
            if before < self.P[s]:
                self.prompt_now += min(before + self.e_n[k], self.P[s]) - before
            self.C[s] += self.e_n[k]
            tokens += self.e_n[k]
            if self.C[s] == self.N[s]:
                self.sampled.push_back(s)
        self.e_slot.resize(m)
        self.e_n.resize(m)
        self.e_start.resize(m)
        self.e_count.resize(m)
        self.e_hits.resize(m)
        self.e_admitted.resize(m)
        self.tokens_now = tokens
        return tokens

    cdef tuple _table(self, int32_t s, Py_ssize_t start, Py_ssize_t stop, first):
        """GPU block ids start..stop-1 of `s`'s table, as the engine numbers them."""
        cdef Py_ssize_t j
        out = []
        for j in range(start, stop):
            out.append(self.gtable[s][j] + first)
        return tuple(out)

    cdef object _decision(self):
        parts = self._parts(True)
        return Decision(parts[0], parts[1], parts[2], parts[3], parts[4], parts[5], parts[6])

    cdef tuple _parts(self, bint sampled_ids):
        """The step's decision as Decision's fields: rejected, preempted, swapped in,
        scheduled, sampled (empty unless `sampled_ids`: a trace does not carry them), new
        blocks, prefix hits (read before `update`)."""
        cdef Py_ssize_t k
        cdef int32_t s
        first = self.config.first_block_id
        ids = self.ids
        scheduled = []
        new_blocks = {}
        hits = {}
        for k in range(<Py_ssize_t>self.e_slot.size()):
            s = self.e_slot[k]
            rid = ids[s]
            scheduled.append((rid, self.e_n[k]))
            if self.e_count[k]:
                new_blocks[rid] = self._table(s, self.e_start[k],
                                              self.e_start[k] + self.e_count[k], first)
            if self.e_hits[k]:
                hits[rid] = self._table(s, 0, self.e_hits[k], first)
        preempted = ()
        if self.pre_slot.size():
            preempted = tuple([Preemption(ids[self.pre_slot[k]], MODE_NAMES[self.pre_mode[k]])
                               for k in range(<Py_ssize_t>self.pre_slot.size())])
        swapped_in = ()
        if self.in_slot.size():
            swapped_in = tuple([ids[s] for s in self.in_slot])
        sampled = tuple([ids[s] for s in self.sampled]) if sampled_ids else ()
        return (tuple(self.rejected_now), preempted, swapped_in, tuple(scheduled), sampled,
                new_blocks, hits)

    def update(self, stopped):
        """Sample one token for each request the last step caught up; finish those that
        stopped (end of sequence), reached max_tokens or max_model_len; return the
        finished ids in batch order."""
        slot_of = self.slot_of
        marked = []
        for rid in stopped:
            slot = slot_of.get(rid)
            if slot is not None:
                self.stop_mark[<int32_t>slot] = 1
                marked.append(slot)
        self._update()
        for slot in marked:
            self.stop_mark[<int32_t>slot] = 0
        return tuple(self._take_finished())

    def finish_step(self):
        """`update(())` for the fast path: finish those the last step caught up that
        reached max_tokens or max_model_len; returns how many finished."""
        self._update()
        return len(self._take_finished())

    cdef void _update(self) noexcept:
        cdef int32_t s
        cdef bint any_done = False
        self.finished_now.clear()
        for s in self.sampled:
            self.N[s] += 1
            if (self.stop_mark[s] or self.N[s] - self.P[s] >= self.O[s]
                    or self.N[s] >= self.mml):
                self.status[s] = FREE
                self.finished_now.push_back(s)
                any_done = True
        self.sampled.clear()
        if not any_done:
            return
        cdef Py_ssize_t k, m = 0
        for k in range(<Py_ssize_t>self.running.size()):
            s = self.running[k]
            if self.status[s] != FREE:
                self.running[m] = s
                m += 1
        self.running.resize(m)
        for s in self.finished_now:
            _free_all(self, s)

    cdef list _take_finished(self):
        """The finished slots' ids, freeing the slots (call after `_update`)."""
        cdef int32_t s
        out = []
        for s in self.finished_now:
            out.append(self.ids[s])
            self._end(s)
        self.finished_now.clear()
        return out

    cdef void _end(self, int32_t s):
        """`s` has ended (finished, aborted, rejected): its id and slot go."""
        rid = self.ids[s]
        del self.slot_of[rid]
        self.ids[s] = None
        self.reasons.pop(s, None)
        self.prefixes.pop(s, None)
        self.status[s] = FREE
        self.given[s].clear()
        self.live -= 1
        self.spare.push_back(s)


    # -- a checkpoint -------------------------------------------------------------------

    def copy(self):
        """A scheduler in the same state, which decides from here on as this one does
        (a checkpoint: between steps only)."""
        cdef CompiledScheduler c = CompiledScheduler.__new__(CompiledScheduler)
        c.config, c.knobs, c.cost = self.config, self.knobs, self.cost
        c.bs, c.nb, c.ncpu, c.token_budget = self.bs, self.nb, self.ncpu, self.token_budget
        c.max_seqs, c.mml, c.threshold_cfg = self.max_seqs, self.mml, self.threshold_cfg
        c.watermark, c.chunked, c.caching = self.watermark, self.chunked, self.caching
        c.priority, c.tail_victims, c.wm_always = self.priority, self.tail_victims, self.wm_always
        c.admit_after_preempt, c.reserve_full = self.admit_after_preempt, self.reserve_full
        c.lift_alone, c.continue_self = self.lift_alone, self.continue_self
        c.free_as_freed, c.skip_over_budget = self.free_as_freed, self.skip_over_budget
        c.alloc, c.pmode = self.alloc, self.pmode
        c.N, c.C, c.P, c.O, c.prio, c.arr, c.seq = (self.N, self.C, self.P, self.O, self.prio,
                                                    self.arr, self.seq)
        c.status, c.npre, c.cached_upto = self.status, self.npre, self.cached_upto
        c.sched_pos, c.stop_mark, c.doomed, c.own = (self.sched_pos, self.stop_mark,
                                                     self.doomed, self.own)
        c.gtable, c.htable = self.gtable, self.htable
        c.pre_content, c.pre_len, c.given = self.pre_content, self.pre_len, self.given
        c.spare, c.next_seq, c.live = self.spare, self.next_seq, self.live
        c.ids, c.slot_of, c.reasons = list(self.ids), dict(self.slot_of), dict(self.reasons)
        # The content and key tables only grow, and a string keeps its number: the copy
        # shares them (what either adds later is numbered past both's entries).
        c.contents, c.key_ids = self.contents, self.key_ids
        c.early_keys = {k: list(v) for k, v in self.early_keys.items()}
        c.prefixes = dict(self.prefixes)
        c.running, c.swapped, c.victims = self.running, self.swapped, self.victims
        c.arrived_seq, c.arrived_slot = self.arrived_seq, self.arrived_slot
        c.fcfs, c.heap = self.fcfs, self.heap
        c.fprev, c.fnext, c.nfree, c.hfree = self.fprev, self.fnext, self.nfree, self.hfree
        c.holders, c.kprev, c.knext = self.holders, self.kprev, self.knext
        c.has_content, c.content, c.cached = self.has_content, self.content, self.cached
        c.sampled, c.finished_now = self.sampled, self.finished_now
        c.rejected_now = []
        c.outputs, c.eos, c.keyed = self.outputs, self.eos, self.keyed
        return c

    cdef tuple _prefix_of(self, int32_t s):
        """The prefix `s` arrived with, as kvsched.spec.prefix writes it."""
        return self.prefixes.get(s, ())

    # -- rejection and queues ---------------------------------------------------------

    cdef void _reject_arrivals(self):
        cdef Py_ssize_t k
        cdef int32_t s
        for k in range(<Py_ssize_t>self.arrived_slot.size()):
            s = self.arrived_slot[k]
            if self.status[s] != WAITING or self.seq[s] != self.arrived_seq[k]:
                continue  # aborted before its first step
            if self.doomed[s]:
                self.doomed[s] = 0
                self.rejected_now.append(Rejection(self.ids[s], self.reasons[s]))
                self.rej_slot.push_back(s)
                _free_all(self, s)
                self._end(s)
        self.arrived_slot.clear()
        self.arrived_seq.clear()

    cdef void _push_waiting(self, int32_t s, bint front) noexcept:
        cdef WaitEntry e
        e.prio = self.prio[s]
        e.arrival = self.arr[s]
        e.seq = self.seq[s]
        e.slot = s
        if self.priority:
            kv_heap_push(self.heap, e)
        elif front:
            self.fcfs.push_front(e)
        else:
            self.fcfs.push_back(e)

    cdef inline bint _valid(self, WaitEntry e) noexcept:
        return self.status[e.slot] == WAITING and self.seq[e.slot] == e.seq

    cdef int32_t _waiting_head(self) noexcept:
        if self.priority:
            while self.heap.size():
                if self._valid(self.heap[0]):
                    return self.heap[0].slot
                kv_heap_pop(self.heap)
        else:
            while self.fcfs.size():
                if self._valid(self.fcfs.front()):
                    return self.fcfs.front().slot
                self.fcfs.pop_front()
        return -1

    cdef void _waiting_pop(self) noexcept:
        if self.priority:
            kv_heap_pop(self.heap)
        else:
            self.fcfs.pop_front()

    cdef bint _later(self, int32_t a, int32_t b) noexcept:
        """Whether `a` ranks after `b` in priority order (priority, arrival, seq)."""
        if self.prio[a] != self.prio[b]:
            return self.prio[a] > self.prio[b]
        if self.arr[a] != self.arr[b]:
            return self.arr[a] > self.arr[b]
        return self.seq[a] > self.seq[b]

    cdef void _requeue_victims(self) noexcept:
        """Victims queue up only now, so none is admitted again in the step that took it."""
        cdef int32_t v
        cdef Py_ssize_t at
        for v in self.victims:
            if self.status[v] == SWAPPED:
                # The swapped queue stays in policy order: (priority, arrival, seq) or seq.
                at = self.swapped.size()
                while at > 0 and self._swapped_after(self.swapped[at - 1], v):
                    at -= 1
                self.swapped.insert(self.swapped.begin() + at, v)
            else:
                self._push_waiting(v, True)
        self.victims.clear()

    cdef inline bint _swapped_after(self, int32_t a, int32_t b) noexcept:
        if self.priority:
            return self._later(a, b)
        return self.seq[a] > self.seq[b]

    # -- blocks -----------------------------------------------------------------------

    cdef inline int64_t _reserve(self, int32_t s) noexcept:
        """R: the tokens an admission or a swap-in covers (spec.blocks.allocation_reserve)."""
        if self.alloc == PROMPT:
            return self.N[s]
        if self.alloc == FULL:
            return min(self.P[s] + self.O[s], self.mml)
        return 0

    cdef inline int64_t _needed(self, int64_t computed, int64_t tokens, int64_t held,
                                int64_t reserve) noexcept:
        """Db (spec.blocks.blocks_needed)."""
        return max(<int64_t>0, cdiv(max(computed + tokens, reserve), self.bs) - held)

    cdef inline int64_t _watermark(self) noexcept:
        """spec.blocks.admission_watermark for the requests running now."""
        if self.wm_always or self.running.size() > 0:
            return self.watermark
        return 0

    # -- the passes -------------------------------------------------------------------

    cdef inline void _add_entry(self, int32_t s, int64_t n, int64_t start, int64_t count,
                                int64_t hits) noexcept:
        self.sched_pos[s] = <int32_t>self.e_slot.size()
        self.e_slot.push_back(s)
        self.e_n.push_back(n)
        self.e_start.push_back(<int32_t>start)
        self.e_count.push_back(<int32_t>count)
        self.e_hits.push_back(<int32_t>hits)
        self.e_admitted.push_back(0)

    cdef int32_t _choose_victim(self) noexcept:
        """The tail of running, or the largest (priority, arrival, seq)."""
        if self.tail_victims:
            return self.running.back()
        cdef int32_t best = self.running[0], r
        for r in self.running:
            if self._later(r, best):
                best = r
        return best

    cdef int _preempt(self, int32_t v) except -1:
        """Take victim `v`, already out of `running`, off the GPU: swap when the mode (or
        auto's cost model) says so and the host has room, otherwise recompute."""
        cdef Py_ssize_t held = self.gtable[v].size()
        cdef int mode = self.pmode
        if mode == AUTO:
            mode = SWAP if self.cost.prefers_swap(held, self.C[v]) else RECOMPUTE
        if mode == SWAP and held > <Py_ssize_t>self.hfree.size():
            mode = RECOMPUTE  # no room on the host
        self.npre[v] += 1
        self.pre_slot.push_back(v)
        self.pre_mode.push_back(mode)
        self.pre_computed.push_back(self.C[v])
        if mode == SWAP:
            _swap_out(self, v)
            self.status[v] = SWAPPED
        else:
            _free_all(self, v)
            self.C[v] = 0
            self.status[v] = WAITING
        self.victims.push_back(v)
        return 0

    cdef int64_t _running_pass(self, int64_t budget, int64_t threshold) except -1:
        cdef Py_ssize_t i = 0, vi
        cdef int32_t r, victim, pos
        cdef int64_t n, need, start
        cdef bint fits
        while i < <Py_ssize_t>self.running.size() and budget > 0:
            r = self.running[i]
            n = self.N[r] - self.C[r]
            if 0 < threshold < n:
                n = threshold
            if budget < n:
                n = budget
            # The last position computed stays below max_model_len - 1 (vLLM v1's cap).
            if self.mml - 1 - self.C[r] < n:
                n = self.mml - 1 - self.C[r]
            if n <= 0:
                i += 1
                continue
            fits = True
            while True:
                need = self._needed(self.C[r], n, self.gtable[r].size(), 0)
                if need <= self.nfree:
                    start = self.gtable[r].size()
                    _allocate(self, r, need)
                    self._add_entry(r, n, start, need, 0)
                    _cache_filled(self, r, self.C[r] + n)
                    break
                victim = self._choose_victim()
                vi = _index(self.running, victim)
                pos = self.sched_pos[victim]
                if pos >= 0:
                    # Taken back: its tokens return to the budget (its new blocks go back
                    # with the rest of its table when it is preempted).
                    budget += self.e_n[pos]
                    self.e_slot[pos] = -1
                    self.sched_pos[victim] = -1
                self.running.erase(self.running.begin() + vi)
                if vi < i:
                    i -= 1
                self._preempt(victim)
                if victim == r:
                    fits = False
                    break
            if not fits:
                if self.continue_self:
                    continue  # r left running: i is the next request's index
                break
            budget -= n
            i += 1
        return budget

    cdef int64_t _swap_in_pass(self, int64_t budget, int64_t threshold) except -1:
        cdef int32_t r
        cdef int64_t n, host, reserve, covered, need, extra
        while self.swapped.size():
            r = self.swapped[0]
            if budget <= 0 or <int64_t>self.running.size() >= self.max_seqs:
                break
            n = self.N[r] - self.C[r]
            if 0 < threshold < n:
                n = threshold
            if budget < n:
                n = budget
            if not self.chunked and n < self.N[r] - self.C[r]:
                break
            host = self.htable[r].size()
            # Its host blocks come back, with what its allocation reserves beyond them.
            reserve = self._reserve(r)
            covered = max(self.C[r] + n, reserve)
            need = host + max(<int64_t>0, cdiv(covered, self.bs) - host) + self._watermark()
            if need > self.nfree:
                break
            self.swapped.erase(self.swapped.begin())
            _swap_in(self, r)
            extra = self._needed(self.C[r], n, host, reserve)
            _allocate(self, r, extra)
            self._add_entry(r, n, 0, host + extra, 0)
            _cache_filled(self, r, self.C[r] + n)
            self.status[r] = RUNNING
            self.running.push_back(r)
            self.in_slot.push_back(r)
            budget -= n
        return budget

    cdef int _waiting_pass(self, int64_t budget, int64_t threshold) except -1:
        cdef int32_t r, b
        cdef int64_t h, computed, taken, n, full, reserve, covered
        cdef vector[int32_t] skipped  # passed over (knob over_budget_prompt "skip")
        if budget <= 0:
            return 0
        while True:
            r = self._waiting_head()
            if r < 0:
                break
            if budget <= 0 or <int64_t>self.running.size() >= self.max_seqs:
                break
            _lookup(self, r)
            h = self.hitbuf.size()
            computed = self.C[r] + h * self.bs
            taken = 0  # E: the free cached blocks it takes
            for b in self.hitbuf:
                if self.holders[b] == 0:
                    taken += 1
            n = self.N[r] - computed
            if 0 < threshold < n:
                n = threshold
            if not self.chunked and n > budget:
                if not self.skip_over_budget:
                    break
                self._waiting_pop()
                skipped.push_back(r)
                continue
            if budget < n:
                n = budget
            if self.reserve_full:
                full = min(self.N[r], self.mml)
                if (max(<int64_t>0, cdiv(full, self.bs) - h) + self._watermark() + taken
                        > self.nfree):
                    break
            # The blocks it takes: its chunk's, or more when its allocation reserves more.
            reserve = self._reserve(r)
            covered = max(computed + n, reserve)
            if max(<int64_t>0, cdiv(covered, self.bs) - h) + self._watermark() + taken > self.nfree:
                break
            self._waiting_pop()
            if h:
                _hit(self, r)
                self.C[r] = computed
            need = self._needed(computed, n, h, reserve)
            _allocate(self, r, need)
            self._add_entry(r, n, h, need, h)
            self.e_admitted[self.e_admitted.size() - 1] = 1
            self.admitted_now += 1
            _cache_filled(self, r, computed + n)
            self.status[r] = RUNNING
            self.running.push_back(r)
            budget -= n
        # Back at the head, each pushed to the front in the order skipped.
        for r in skipped:
            self._push_waiting(r, True)
        return 0


cdef inline Py_ssize_t _index(vector[int32_t] &v, int32_t x) noexcept:
    cdef Py_ssize_t k
    for k in range(<Py_ssize_t>v.size()):
        if v[k] == x:
            return k
    return -1


cdef inline void _erase(vector[int32_t] &v, int32_t x) noexcept:
    cdef Py_ssize_t k = _index(v, x)
    if k >= 0:
        v.erase(v.begin() + k)


include "columns.pxi"
include "compiled_blocks.pxi"
include "compiled_writer.pxi"
include "compiled_simulation.pxi"
include "compiled_replay.pxi"
