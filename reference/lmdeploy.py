"""LMDeploy's scheduler: one forward of LMDeploy 0.18.0's PyTorch engine
(lmdeploy/pytorch/engine/inputs_maker.py, paging/scheduler.py,
paging/prefill_scheduler.py, paging/eviction_helper/recompute_eviction_helper.py), which
profile lmdeploy@0.18.0 reproduces (its `scheduler` is "lmdeploy"). Source lines are
that release's (docs/conformance/lmdeploy.md).

NOTE on the algorithm. One step is one forward, a prefill or a decode, never both
(config step_mix prefill_or_decode). The engine keeps its own counts per request: the
tokens whose KV it holds (num_history_ids) and the tokens still to compute
(num_token_ids); kvsched's N and C follow from them.

Pipelining (config pipelined; engine_loop.py:484-518): a forward is decided before the
last forward's output is applied. So when step s is decided, step s-1's samples are not
in the counts yet, its finished requests still run, and they are decoded once more (void
entries); the output is applied right after the decision. A finished request then holds
its blocks ("stopped", kvsched's held) until its session ends, `release_delay` steps
after its finish (the step's `released`), or an allocation reclaims them.

1. Prefill or decode (do_prefill_default, inputs_maker.py:1286-1319): decode when nothing
   waits (the decode count resets) unless a long prompt's last chunk is pending;
   prefill when `prefill_interval` decodes were chosen in a row, when the waiting
   prompts' tokens reach max_prefill_token_num (config max_num_batched_tokens), or when
   fewer than half of max_batches (max_num_seqs) run; otherwise decode, counted. With
   enable_chunked_prefill every forward tries a prefill (do_prefill_chunked).
2. Lanes (_ForwardInputsTask.run, :339-407): a long prompt being chunked goes first
   (after a chunk it yields a forward; a short-prompt turn may come first); a long prompt
   waiting and its turn not due (fewer than `short_turns` short prefills since the last
   chunk): the short prompts first (sorted by size), then a long turn; a prefill that
   admits nothing falls back to a decode in the same forward.
3. Admission (_PrefillScheduler.schedule, prefill_scheduler.py:835-892): seats =
   max_batches less the running requests; waiting requests in arrival order (or as the
   turn sorts them). A second prompt over the token budget stops the pass (skipped on a
   short turn); a first prompt over it is long: only its first max_prefill_token_num
   tokens, alone. Blocks: ceil((known + 16) / block_size) less those held (a long
   prompt's earlier chunks: none beyond the chunk). Short of them, it reclaims whole
   requests that are not running and hold blocks: the finished ones last finished
   first, then the waiting behind it from the back, then the ones passed over, last
   first; still short, the pass stops (head-of-line blocking).
4. Decode (Scheduler.schedule_running, scheduler.py:337-363): every running request, one
   token each, visited from the last admitted; one that needs a block (16 more tokens
   preallocated) reclaims finished then waiting requests in the order they entered
   those states; failing that it is preempted lazily, keeping its blocks, and the decode
   goes on. A preempted request's token of the step before is dropped with it (the
   output is applied after the decision, and only to running requests): the decision
   names that entry (Decision.unsampled), and a finish the step before reported for
   it did not happen (its request waits, and finishes when it samples that token
   again).

An arrival whose prompt fills max_model_len (LMDeploy's session length) or is longer
than config max_prompt_len is rejected in its arrival step (AsyncEngine.preprocess); a
served one's max_tokens is capped so that prompt and outputs fit the session, at most
the pool less one block.

Block ids are handed out from the head of LMDeploy's free list, and freed blocks go
back to its head in table order (paging/block_manager/base_block_manager.py:38-60);
sessions ending in one step end in the order their requests finished.

Prefix caching (config prefix_caching; paging/block_trie/): a request's full blocks of
known tokens join the block trie when blocks are allocated for it (a block whose content
the trie has already is swapped for the trie's), and stay cached, held by the trie, when
it releases them. An admission first matches the request's blocks against the trie
(leaving it a token to compute), and its gates count what is left; a failed admission
gives back what it matched, and a lazy victim its own blocks too. Short of blocks, after
each reclaimed request it evicts trie leaves no request holds, least recently used
first; LMDeploy keeps access times in whole seconds of its clock, so ties are many, and
they go to the older node. The trace's free_blocks count the trie's unheld blocks as
free.

The rules are kvsched.spec.knobs.LMDeployKnobs, so that each can be flipped.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import count

from kvsched.reference.allocator import FreeList
from kvsched.spec.blocks import cdiv, prompt_over_limit, prompt_too_long
from kvsched.spec.knobs import Knobs, LMDeployKnobs
from kvsched.spec.model import (
    Config,
    Decision,
    Preemption,
    Rejection,
    Request,
    RequestView,
    Status,
)
from kvsched.spec.prefix import KeyBook
from kvsched.spec.step_kinds import knob_refusal, refusal

# The engine's states of a sequence (paging/seq_states/states.py).
WAITING, RUNNING, STOPPED, ENDED = "waiting", "running", "stopped", "ended"


@dataclass(eq=False)
class _Node:
    """One full block of LMDeploy's block trie (paging/block_trie/node.py): its content
    key, the block that holds it, how many blocks deep it is, and when it was made (the
    tie-break of equal access times)."""

    key: str
    block: int
    depth: int
    order: int
    parent: _Node | None = None
    children: dict[str, _Node] = field(default_factory=dict)

    def attached(self) -> bool:
        return self.parent is not None and self.parent.children.get(self.key) is self


@dataclass(eq=False)
class LMRequest:
    """A live request as LMDeploy's SchedulerSequence holds it."""

    request: Request
    max_new: int  # max_new_tokens as the engine caps it (engine.py:467-482)
    arrive: int  # the step it arrived in: its arrive_time on the logical clock
    order: int  # arrival order: ties of arrive_time
    history: int = 0  # num_history_ids: tokens whose KV it holds
    pending: int = 0  # num_token_ids: tokens to compute (history + pending = all ids)
    generated: int = 0  # num_new_tokens
    blocks: list[int] = field(default_factory=list)
    kv_limit: int | None = None  # a long prompt's chunk end (kv_token_limit)
    state: str = WAITING
    # kvsched's view: N known, C computed, and its status (HELD once finished)
    known: int = 0
    computed: int = 0
    status: Status = Status.WAITING
    finished_at: int = -1
    finish_rank: int = 0  # its place in its finishing batch
    preemptions: int = 0
    cursor: _Node | None = None  # its trie path's end (prefix_cache.trie_cursor)
    # its table and its computed tokens as the trace last showed them
    seen: list[int] = field(default_factory=list)
    shown: int = 0

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def all_ids(self) -> int:
        return self.history + self.pending


@dataclass
class _Output:
    """One forward's output, applied after the next forward is decided."""

    batch: list[tuple[LMRequest, int, bool]]  # each entry's tokens, and if it sampled
    chunk: bool  # a long prompt's non-final chunk: nothing to apply
    stops: set[str]


class LMDeployScheduler:
    """LMDeploy 0.18.0's forward (the module's NOTE) on `config`, its rules
    `knobs.lmdeploy`."""

    def __init__(self, config: Config, knobs: Knobs | None = None) -> None:
        why = refusal("lmdeploy", config, knobs=knobs) or knob_refusal("lmdeploy",
                                                                      knobs or Knobs())
        if why is not None:
            raise ValueError(why)
        self.config = config
        self.rules: LMDeployKnobs = (knobs or Knobs()).lmdeploy
        self.block_size = config.block_size
        self.budget = config.max_num_batched_tokens  # max_prefill_token_num
        self.prealloc = self.rules.prefill_interval
        # Engine._get_max_session_len (engine.py:328-341): the session length
        # (max_model_len), at most the pool less one block.
        self.session_len = min(config.max_model_len,
                               (config.num_gpu_blocks - 1) * config.block_size)
        self.free_list = FreeList(config.first_block_id, config.num_gpu_blocks)
        self.live: dict[str, LMRequest] = {}
        self.waiting: list[LMRequest] = []  # WAITING, in the order they entered it
        self.stopped: list[LMRequest] = []  # STOPPED, in the order they finished
        self.running: list[LMRequest] = []  # the inputs maker's running_seqs
        self.chunking: LMRequest | None = None  # the long-context chunker's sequence
        self.decode_count = 0
        self.short_turns = 0  # _short_prefill_turns_since_long_chunk
        self.last_kind = ""  # _last_forward_kind
        self.step = 0  # forwards decided: the logical clock
        self.arrivals = 0
        self.arrived: list[LMRequest] = []
        self.output: _Output | None = None
        self.batch: list[tuple[LMRequest, int]] = []
        self.chunk_step = False
        self.sampled: list[LMRequest] = []
        self.new_blocks: dict[str, tuple[int, ...]] = {}
        self.reclaimed: list[str] = []
        self.preempted: list[Preemption] = []
        # prefix caching: the block trie, its blocks' references and access times
        self.caching = config.prefix_caching
        self.book = KeyBook(config.block_size)
        self.refs: dict[int, int] = {}
        self.stamps: dict[int, int] = {}
        self.nodes = count()
        self.root = _Node("", -1, 0, -1)
        self.leaves: set[_Node] = set()
        self.cached: dict[int, _Node] = {}
        self.hits: dict[str, tuple[int, ...]] = {}
        self.deduplicated: dict[str, tuple[int, ...]] = {}  # the last decision's
        self.swaps: dict[str, dict[int, int]] = {}  # this decision's: {index: copy}

    # -- the Scheduler interface --------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.id in self.live:
            raise ValueError(f"request {request.id!r} is already live")
        room = self.session_len - request.prompt_len
        r = LMRequest(request, max(1, min(request.max_tokens, room)), self.step,
                      self.arrivals, pending=request.prompt_len, known=request.prompt_len)
        self.arrivals += 1
        self.live[request.id] = r
        self.arrived.append(r)

    def add_block_keys(self, request_id: str, keys: Sequence[str],
                       start: int | None = None) -> None:
        """The content keys of a request's blocks, as a trace gives them
        (kvsched.spec.interface.ContentKeys)."""
        self.book.add(request_id, keys, start)

    def dedups(self) -> dict[str, tuple[int, ...]]:
        """The requests whose tables the last decision deduplicated (the trie swapped
        copies of its full blocks for its own as it allocated), each with the blocks
        its table now starts with (trace v1's `dedup`;
        kvsched.spec.interface.Deduplicating)."""
        return dict(self.deduplicated)

    def free_blocks(self) -> int:
        """Free blocks and the trie's blocks no request holds (evictable)."""
        return len(self.free_list) + sum(1 for b in self.cached if self.refs[b] == 1)

    def block_table(self, request_id: str) -> tuple[int, ...]:
        r = self.live.get(request_id)
        return tuple(r.blocks) if r is not None else ()

    def host_table(self, request_id: str) -> tuple[int, ...]:
        return ()

    def free_gpu_ids(self) -> tuple[int, ...]:
        return tuple(self.free_list)

    def free_host_ids(self) -> tuple[int, ...]:
        return ()

    def states(self) -> dict[str, RequestView]:
        # no state_of (RequestStates): a reclaim may reset a request the trace has not
        # shown with blocks yet, which no step names
        return {rid: RequestView(r.status, r.known, r.computed, len(r.blocks), 0,
                                 r.preemptions)
                for rid, r in self.live.items()}

    def has_unfinished(self) -> bool:
        return bool(self.live)

    def schedule(self) -> Decision:
        s = self.step
        self.new_blocks, self.reclaimed, self.preempted, self.hits = {}, [], [], {}
        self.deduplicated, self.swaps = {}, {}
        released = self._release(s - self.rules.release_delay)
        rejected = self._admit_arrivals()
        self.batch, self.chunk_step = [], False
        self._forward()
        dropped = self._apply_output()
        drained = dropped is not None and not self.batch
        if drained:
            # Nothing to dispatch: the engine's loop takes the last output, delivers
            # what waited (the sessions of every request finished by now end), and
            # decides again (EngineLoop.main_loop, engine_loop.py:535-548).
            released += self._release(s - 1)
            self._forward()
        for r, n in self.batch:
            if r.status is Status.RUNNING or r.status is Status.WAITING:
                r.status = Status.RUNNING
            self._dispatch(r, n)
        # every entry samples but a long prompt's non-final chunk and a void entry
        self.sampled = [] if self.chunk_step else [
            r for r, n in self.batch if r.status is Status.RUNNING]
        self.step += 1
        return Decision(rejected=rejected, preempted=tuple(self.preempted),
                        scheduled=tuple((r.id, n) for r, n in self.batch),
                        sampled=tuple(r.id for r in self.sampled),
                        new_blocks=dict(self.new_blocks), prefix_hits=dict(self.hits),
                        released=released, reclaimed=tuple(self.reclaimed),
                        unsampled=dropped or ())

    def update(self, stopped: Collection[str]) -> tuple[str, ...]:
        """kvsched's counts now; the engine's at the next decision (pipelining). A
        sampled request finishes when it stops or reaches max_new_tokens."""
        done: list[str] = []
        stops: set[str] = set()
        sampled = set(map(id, self.sampled))
        for r, n in self.batch:
            r.computed = min(r.computed + n, r.known)
            if id(r) not in sampled:
                continue
            r.known = max(r.known, r.computed) + 1
            if r.id in stopped or r.generated + 1 >= r.max_new:
                stops.add(r.id)
                r.status = Status.HELD
                r.finished_at = self.step - 1
                r.finish_rank = len(done)
                done.append(r.id)
        batch = [r for r, _ in self.batch]
        if self.chunk_step:
            # the chunker moves the sequence on before the next decision
            # (LongContextChunker.update_step, inputs_maker.py:224-240)
            r, n = self.batch[0]
            r.history += n
            r.pending -= n
        elif self.batch and self.last_kind == "decode":
            self.running = batch
        elif self.batch:
            self.running += batch
        self.output = _Output([(r, n, id(r) in sampled) for r, n in self.batch],
                              self.chunk_step, stops)
        self.sampled = []
        return tuple(done)

    # -- phase 1 --------------------------------------------------------------------------

    def _release(self, upto: int) -> tuple[str, ...]:
        """The sessions of requests that finished by step `upto` end
        (Scheduler.end_session), those of each step's finishes in batch order: their
        blocks return."""
        ending = sorted((r for r in self.live.values()
                         if 0 <= r.finished_at <= upto and r.state != ENDED),
                        key=lambda r: (r.finished_at, r.finish_rank))
        released = []
        for r in ending:
            if r.status is Status.HELD:
                released.append(r.id)
                r.status = Status.FINISHED
            self._free(r)
            if r in self.stopped:
                self.stopped.remove(r)
            r.state = ENDED
            del self.live[r.id]
        return tuple(released)

    def _admit_arrivals(self) -> tuple[Rejection, ...]:
        rejected = []
        for r in self.arrived:
            p = r.request.prompt_len
            why = prompt_over_limit(self.config, p) or prompt_too_long(self.config, p)
            if why is None and p >= self.config.max_model_len:
                # AsyncEngine.preprocess (serve/core/async_engine.py:549)
                why = (f"Input length ({p}) must be smaller than the model context length "
                       f"({self.config.max_model_len}).")
            if why is not None:
                rejected.append(Rejection(r.id, why))
                r.status = Status.REJECTED
                del self.live[r.id]
            else:
                self.waiting.append(r)
        self.arrived = []
        return tuple(rejected)

    # -- blocks ---------------------------------------------------------------------------

    def _dispatch(self, r: LMRequest, n: int) -> None:
        """What the trace shows of a scheduled entry: the blocks its table gained since
        it last showed it, a prefix hit, the computed blocks a request that had
        computed nothing is dispatched with, and a deduplication, the blocks its table
        now starts with where the trie swapped its copies for its own."""
        known = r.seen
        if r.shown == 0 and self.last_kind != "decode":
            hit = r.history // self.block_size
            if hit:
                self.hits[r.id] = tuple(r.blocks[:hit])
            known = r.blocks[:hit]
            r.shown = r.history
        swapped = self.swaps.pop(r.id, {})
        if swapped:  # the trie swapped copies for its own blocks (_insert)
            self.deduplicated[r.id] = tuple(r.blocks[: max(swapped) + 1])
        before = [swapped.get(j, b) for j, b in enumerate(r.blocks)]  # as allocated
        if len(before) > len(known):
            self.new_blocks[r.id] = tuple(before[len(known):])
        r.seen = list(r.blocks)
        r.shown += n

    def _touch(self, blocks: Iterable[int]) -> None:
        """update_access_time: the clock's reading, which LMDeploy keeps in an integer
        array (LogicalMemory.access_time, int64): whole seconds, so that the blocks
        touched within one second are equally old to the trie's eviction."""
        now = int(self.step * self.rules.step_seconds + 1e-6)
        for b in blocks:
            self.stamps[b] = now

    def _take(self, n: int) -> list[int]:
        taken = self.free_list.take(n)
        for b in taken:
            self.refs[b] = 1
        self._touch(taken)
        return taken

    def _give(self, blocks: list[int]) -> None:
        """LogicalAllocator.free: one reference less each; those left with none go back
        to the head of the free list, in the order given."""
        for b in blocks:
            self.refs[b] -= 1
        self._touch(blocks)
        freed = [b for b in blocks if self.refs[b] == 0]
        for b in freed:
            del self.refs[b]
        self.free_list.extendleft(reversed(freed))

    def _free(self, r: LMRequest) -> None:
        """Its blocks back (release_paging_resources): those the trie holds stay
        cached; it computes from scratch."""
        self._give(r.blocks)
        r.blocks = []
        r.cursor = None

    def _required(self, r: LMRequest, extra: int) -> int:
        """DefaultBlockManager.num_required_blocks (default_block_manager.py:26-34)."""
        tokens = r.all_ids if r.kv_limit is None else min(r.all_ids, r.kv_limit)
        return max(0, cdiv(tokens + extra, self.block_size) - len(r.blocks))

    def _allocate(self, r: LMRequest, extra: int) -> None:
        need = self._required(r, extra)
        if need:
            r.blocks += self._take(need)
        if self.caching:
            self._insert(r)

    # -- the block trie (paging/block_trie/trie.py, kv_lifecycle.py) ----------------------

    def _key(self, r: LMRequest, index: int) -> str:
        return self.book.key(r.id, r.request.prefix, index)

    def _insert(self, r: LMRequest) -> None:
        """BlockTrie.allocate: its full blocks join the trie from its cursor on; a block
        whose content the trie has already is swapped for the trie's."""
        node = r.cursor if r.cursor is not None and (r.cursor is self.root
                                                     or r.cursor.attached()) else self.root
        limit = r.all_ids if r.kv_limit is None else min(r.all_ids, r.kv_limit)
        full = limit // self.block_size
        r.cursor = node
        if node.depth >= full:
            return
        if node is not self.root and not node.children:
            self.leaves.discard(node)
        held: list[int] = []
        dropped: list[int] = []
        for index in range(node.depth, full):
            key = self._key(r, index)
            child = node.children.get(key)
            if child is None:
                child = _Node(key, r.blocks[index], index + 1, next(self.nodes), node)
                node.children[key] = child
                self.cached[child.block] = child
                held.append(child.block)
            elif r.blocks[index] != child.block:
                self.swaps.setdefault(r.id, {}).setdefault(index, r.blocks[index])
                dropped.append(r.blocks[index])
                r.blocks[index] = child.block
                held.append(child.block)
            node = child
        r.cursor = node
        if not node.children:
            self.leaves.add(node)
        for b in held:
            self.refs[b] += 1
        if dropped:
            self._give(dropped)

    def _match(self, r: LMRequest) -> None:
        """BlockTrie.match: the trie's blocks that continue its table, leaving it a
        token to compute."""
        node = r.cursor or self.root
        matched: list[_Node] = []
        while node.depth * self.block_size + self.block_size < r.all_ids:
            child = node.children.get(self._key(r, node.depth))
            if child is None:
                break
            matched.append(child)
            node = child
        if matched:
            blocks = [c.block for c in matched]
            self._touch(blocks)
            for b in blocks:
                self.refs[b] += 1
            r.blocks += blocks
            total = r.all_ids
            r.history = node.depth * self.block_size
            r.pending = total - r.history
        r.cursor = node

    def _rollback(self, r: LMRequest) -> None:
        """_TentativePrefixMatch.rollback: a failed admission gives back what it holds,
        matched or its own (a lazy victim recomputes)."""
        if r.blocks:
            self._lose(r)
        elif r.history:
            r.pending += r.history
            r.history = 0
        r.cursor = None

    def _evict(self, n: int) -> None:
        """KVBlockLifecycle.evict: up to `n` trie leaves no request holds, least
        recently used first (ties: the older node), a parent left bare joining them."""
        candidates = [leaf for leaf in self.leaves if not leaf.children and leaf.attached()]
        self.leaves.intersection_update(candidates)
        heap = [(self.stamps[leaf.block], leaf.order, leaf) for leaf in candidates
                if self.refs[leaf.block] == 1]
        heapq.heapify(heap)
        evicted: list[int] = []
        while heap and len(evicted) < n:
            _, _, leaf = heapq.heappop(heap)
            if (leaf not in self.leaves or leaf.children or not leaf.attached()
                    or self.refs[leaf.block] != 1):
                if leaf in self.leaves and (leaf.children or not leaf.attached()):
                    self.leaves.discard(leaf)
                continue
            evicted.append(leaf.block)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key]
            leaf.parent = None
            self.leaves.discard(leaf)
            del self.cached[leaf.block]
            if parent is self.root or parent.children:
                continue
            if parent.attached() and parent not in self.leaves:
                self.leaves.add(parent)
                if self.refs[parent.block] == 1:
                    heapq.heappush(heap, (self.stamps[parent.block], parent.order, parent))
        if evicted:
            self._give(evicted)

    def _room(self, need: int) -> bool:
        """_try_make_block_capacity: evict cached blocks for what is missing."""
        missing = need - len(self.free_list)
        if missing > 0 and self.caching:
            self._evict(missing)
        return len(self.free_list) >= need

    def _make_capacity(self, r: LMRequest, candidates: Iterable[LMRequest],
                       extra: int) -> bool:
        """RecomputeEvictionHelper.try_make_capacity_for: reclaim candidates holding
        blocks, one at a time, until `r`'s blocks are free."""
        need = self._required(r, extra)
        if len(self.free_list) >= need:
            return True
        for c in candidates:
            if not c.blocks:
                continue
            self._lose(c)
            if self._room(need):
                return True
        return self._room(need)

    def _lose(self, c: LMRequest) -> None:
        """release_paging_resources of a request not running: all its blocks, and it
        computes from scratch; the trace shows it reclaimed once if it showed it with
        blocks."""
        self._free(c)
        c.pending += c.history
        c.history = 0
        c.kv_limit = None
        c.computed = 0
        if c.seen and c.id not in self.reclaimed:
            self.reclaimed.append(c.id)
        c.seen = []
        c.shown = 0
        if c.status is Status.HELD:
            c.status = Status.FINISHED

    def _candidates(self, stopped: list[LMRequest], waiting: list[LMRequest]
                    ) -> list[LMRequest]:
        first, then = (stopped, waiting) if self.rules.reclaim_finished_first \
            else (waiting, stopped)
        return first + then

    # -- the forward ----------------------------------------------------------------------

    def _has_waiting(self) -> bool:
        return bool(self.waiting)

    def _num_running(self) -> int:
        return sum(1 for r in self.live.values() if r.state == RUNNING)

    def _is_long(self, r: LMRequest) -> bool:
        return r.pending > self.budget

    def _turn_due(self) -> bool:
        return self.short_turns >= self.rules.short_turns

    def _do_prefill(self) -> bool:
        """do_prefill_default (inputs_maker.py:1286-1319), or do_prefill_chunked."""
        if self.rules.enable_chunked_prefill:
            return True
        pending_last = self.chunking is not None and not self._is_long(self.chunking)
        if not self.waiting and not pending_last:
            self.decode_count = 0
            return False
        if pending_last:
            return True
        if self.decode_count >= self.rules.prefill_interval:
            return True
        tokens = 0
        for r in self.waiting:
            tokens += r.pending
            if tokens >= self.budget:
                return True
        if self._num_running() < self.config.max_num_seqs * 0.5:
            return True
        self.decode_count += 1
        return False

    def _forward(self) -> None:
        """_ForwardInputsTask.run (inputs_maker.py:339-407)."""
        prefill = self._do_prefill()
        deferred = tried_long = tried_short = blocked = False
        done = False

        def short() -> bool:
            nonlocal tried_short
            tried_short = True
            ok = self._schedule_prefill(allow_long=False, prefer_long=False)
            if ok:
                self.short_turns += 1
            return ok

        def chunk() -> bool:
            nonlocal tried_long, blocked
            tried_long = True
            ok = self._active_chunk()
            blocked = not ok
            return ok

        if self.chunking is not None:
            if self._defer_chunk(prefill):
                deferred = True
            elif (self._is_long(self.chunking) and self.waiting
                  and not self._turn_due()):
                done = short() or chunk()
            else:
                done = chunk()
        elif prefill:
            has_long = any(self._is_long(r) for r in self.waiting)
            if has_long and not self._turn_due():
                done = short()
                if not done:
                    tried_long = True
                    done = self._schedule_prefill(allow_long=True, prefer_long=True)
            else:
                done = self._schedule_prefill(allow_long=True, prefer_long=has_long)
                tried_long = has_long
        if not done and tried_long and not blocked and not tried_short and self.waiting:
            done = short()
        if not done and self.running:
            done = self._decode()
        if (not done and deferred and not tried_short and not blocked
                and not self._turn_due() and self.waiting):
            done = short()
        if not done and deferred and self.chunking is not None:
            done = chunk()
        if done and self.last_kind != "decode":
            self.decode_count = 0

    def _defer_chunk(self, prefill: bool) -> bool:
        """_should_defer_active_chunk (inputs_maker.py:446-458)."""
        assert self.chunking is not None
        if not self._is_long(self.chunking):
            return bool(self.running) and not prefill
        return self.last_kind == "long_context_chunk"

    def _active_chunk(self) -> bool:
        """_build_active_chunk (inputs_maker.py:604-629): the chunking request's next
        chunk, its blocks reserved first (reserve_long_context_chunk)."""
        r = self.chunking
        assert r is not None
        size = min(r.pending, self.budget)
        last = not self._is_long(r)
        old = r.kv_limit
        r.kv_limit = None if last else r.history + size
        extra = self.prealloc if last else 0
        if not self._make_capacity(r, self._candidates(list(self.stopped),
                                                       list(self.waiting)), extra):
            r.kv_limit = old
            return False
        self._allocate(r, extra)
        self.short_turns = 0
        if last:
            self.chunking = None
            self._keep_running()
            self.last_kind = "last_long_context_chunk"
        else:
            self.chunk_step = True
            self.last_kind = "long_context_chunk"
        self.batch = [(r, size)]
        return True

    def _keep_running(self) -> None:
        """_build_prefill_inputs: running_seqs keeps only the running ones."""
        self.running = [r for r in self.running if r.state == RUNNING]

    def _schedule_prefill(self, allow_long: bool, prefer_long: bool) -> bool:
        """Scheduler.schedule and _schedule_prefill (inputs_maker.py:563-602)."""
        admitted = self._admission(allow_long, prefer_long)
        if not admitted:
            return False
        first = admitted[0]
        if len(admitted) == 1 and self._is_long(first):
            self.chunking = first
            self.batch = [(first, self.budget)]
            self.chunk_step = True
            self.short_turns = 0
            self.last_kind = "long_context_chunk"
            return True
        self._keep_running()
        self.batch = [(r, r.pending) for r in admitted]
        self.last_kind = "prefill"
        return True

    def _order(self, allow_long: bool, prefer_long: bool) -> list[LMRequest]:
        """_PrefillReorderer.reorder (prefill_scheduler.py:74-193)."""
        waiting = sorted(self.waiting, key=lambda r: (r.arrive, r.order))
        normal = [r for r in waiting if not self._is_long(r)]
        long = [r for r in waiting if self._is_long(r)]
        normal_sorted = sorted(normal, key=lambda r: (r.pending, r.arrive, r.order))
        if prefer_long and long:
            if self.rules.ttft_policy == "size":
                long = sorted(long, key=self._long_key)
            return [long[0], *normal_sorted, *long[1:]]
        if allow_long:
            return waiting
        return normal_sorted + long

    def _long_key(self, r: LMRequest) -> tuple[int, int, int, int]:
        """_long_priority_key: estimated chunks less one per aging period waited."""
        chunks = max(1, cdiv(r.pending, self.budget))
        ss = self.rules.step_seconds
        waited = max(0.0, (self.step - r.arrive) * ss + ss * 1e-6)
        credit = int(waited // self.rules.aging_seconds)
        return (chunks - credit, chunks, r.arrive, r.order)

    def _admission(self, allow_long: bool, prefer_long: bool) -> list[LMRequest]:
        """_PrefillScheduler.schedule (prefill_scheduler.py:835-892)."""
        seats = self.config.max_num_seqs - self._num_running()
        admitted: list[LMRequest] = []
        if seats <= 0 or not self.waiting:
            return admitted
        queue = self._order(allow_long, prefer_long)
        stopped = list(self.stopped)
        skipped: list[LMRequest] = []
        tokens = 0
        while queue and len(admitted) < seats:
            r = queue.pop(0)
            candidates = self._candidates(stopped[::-1], (skipped + queue)[::-1])
            verdict = self._attempt(r, candidates, allow_long, bool(admitted), tokens)
            if verdict == "stop":
                break
            if verdict == "skip":
                skipped.append(r)
                continue
            self.waiting.remove(r)
            r.state = RUNNING
            admitted.append(r)
            tokens += self.budget if self._is_long(r) else r.pending
            if r.kv_limit is not None:
                break
        return admitted

    def _attempt(self, r: LMRequest, candidates: list[LMRequest], allow_long: bool,
                 batched: bool, tokens: int) -> str:
        """_PrefillAdmissionAttempt.run (prefill_scheduler.py:398-760): the long-prompt
        and token-budget gates (with prefix caching, rechecked after a tentative
        match), the blocks, and "admit", "skip" or "stop"."""
        matched = False
        deferred = ""  # a gate's verdict, should the blocks then fail

        def count() -> int:
            return self.budget if self._is_long(r) else r.pending

        if not allow_long and self._is_long(r):
            if not self.caching:
                return "skip"
            self._match(r)
            matched = True
            if self._is_long(r):
                self._rollback(r)
                return "skip"
            deferred = "skip"
        if batched and tokens + count() > self.budget:
            rejection = "stop" if allow_long else "skip"
            if matched or not self.caching:
                if matched:
                    self._rollback(r)
                return rejection
            self._match(r)
            matched = True
            if tokens + count() > self.budget:
                self._rollback(r)
                return rejection
            deferred = rejection
        if self.caching and not matched:
            self._match(r)
            matched = True
        long = self._is_long(r)
        r.kv_limit = r.history + self.budget if long else None
        extra = 0 if long else self.prealloc
        if not self._make_capacity(r, candidates, extra):
            r.kv_limit = None
            if matched:
                self._rollback(r)
            if deferred:
                return deferred
            return "stop" if self.rules.head_of_line_blocking else "skip"
        self._allocate(r, extra)
        return "admit"

    def _decode(self) -> bool:
        """Scheduler.schedule_running (scheduler.py:337-363): one token each."""
        order: Callable[[list[LMRequest]], Iterable[LMRequest]] = (
            reversed if self.rules.decode_reverse_order else iter)
        valid = set()
        for r in order(self.running):
            if r.state != RUNNING:
                continue
            if self._required(r, 1) == 0:
                valid.add(id(r))
                continue
            if self._make_capacity(r, self._candidates(list(self.stopped),
                                                       list(self.waiting)),
                                   self.prealloc):
                self._allocate(r, self.prealloc)
                valid.add(id(r))
                continue
            if self.rules.self_preemption:
                self._preempt(r)
        batch = [r for r in self.running if id(r) in valid]
        if not batch:
            return False
        self.batch = [(r, 1) for r in batch]
        self.last_kind = "decode"
        return True

    def _preempt(self, r: LMRequest) -> None:
        """preempt_seqs: RUNNING to READY to WAITING, keeping its blocks."""
        r.state = WAITING
        self.waiting.append(r)
        r.status = Status.WAITING
        r.preemptions += 1
        self.preempted.append(Preemption(r.id, "lazy"))

    def _apply_output(self) -> tuple[str, ...] | None:
        """The last forward's output, once this forward is decided
        (ARSequenceStrategy.update_running, strategies/ar/sequence.py:121-157): only
        running sequences take their token; a stop finishes it. The entries whose output
        it dropped (requests this decision preempted); None when there was no output."""
        out, self.output = self.output, None
        if out is None:
            return None
        if out.chunk:
            return ()
        dropped = []
        for r, n, sampled in out.batch:
            if r.state != RUNNING:
                if r.state == WAITING and sampled:
                    # preempted in this decision: its token is dropped, and the
                    # tokens computed for it (kvsched's N and C step back); a finish
                    # the last update reported for it did not happen
                    r.known -= 1
                    r.computed -= n
                    r.finished_at = -1
                    dropped.append(r.id)
                continue
            r.history += r.pending
            r.pending = 1
            r.generated += 1
            if r.id in out.stops:
                r.state = STOPPED
                self.stopped.append(r)
        return tuple(dropped)
