"""SGLang's scheduler: the step of sglang/srt/managers/scheduler.py in SGLang 0.5.23,
which profile sglang@0.5.23 reproduces (its `scheduler` is "sglang"). Source lines are
that release's (docs/conformance/sglang.md).

NOTE on the algorithm. Memory is counted in tokens held in pages of block_size tokens.
A step is a prefill step or a decode step, never both (config step_mix
prefill_or_decode; get_next_batch_to_run, scheduler.py:3894):

1. the last prefill step's requests join the running batch, at its end, except the
   request still being chunked (scheduler.py:3911-3961); finished requests leave it;
   a batch that shrank is no longer "full";
2. the prefill pass (_get_new_batch_prefill_raw, :4079), unless the running batch is
   marked full or nothing waits, and no request is being chunked. Its budgets: the
   input budget (with chunked prefill the knob max_prefill_tokens, without it
   max_num_batched_tokens) and the chunk budget (max_num_batched_tokens), charged each
   admission's extend
   rounded up to whole pages, and the memory budget, free tokens less the reserved
   future: each running request min(max_tokens - outputs, 4096) x ratio, each
   admission this pass its pages, a page and (unless it is a cut chunk) its whole
   min(max_tokens, 4096). The chunked request goes first with what the chunk budget
   and memory leave (or the chunk budget, when memory leaves nothing). Then the waiting
   queue in order: a request is admitted when extend + min(max_tokens - outputs, 4096)
   + page < the memory budget; if its pages exceed the chunk budget it is cut to whole
   pages and becomes the chunked request; the first one that does not fit ends the pass
   (SGLang's head-of-line blocking), and marks the running batch full;
3. a step with admissions runs them alone; with step_mix mixed_chunk the running
   requests' decodes join it when all their next pages are free (:4375);
4. otherwise the running batch decodes (update_running_batch, :4459): if its next
   pages are not free it retracts, by recompute, the request with the fewest outputs
   (ties: the longest prompt, then the later in the batch; with --retraction-policy
   priority the least urgent first, ties so), then more until the rest
   fit, always keeping one; the victims rejoin the waiting queue at its end and the
   survivors decode in that order; the ratio becomes min(1, (outputs + 20 x n) /
   (sum of max_tokens + 1)) over the n survivors. A decode step that retracts nothing
   lowers the ratio by (0.7 - 0.098) / 600, down to 0.098; a fully idle step (nothing
   running, waiting or chunked, and nothing run the step before) resets it to 0.7.

Under the priority policy the waiting queue is sorted by priority, the higher value
first, then by when each request (re)joined it; at the running-request limit a waiting
request may preempt running ones whose priority is lower by more than 10, the lowest
first, until their reserved future output covers its need: the extend of the fill ids it
had when last tried (its known tokens then, less the radix-cache hit found then; nothing
for a fresh request, its last admission's fill ids and no hit for a victim) and its
min(max_tokens, 4096), less the memory budget left (preempt_to_schedule,
schedule_policy.py:1707).

A client's abort (abort_request, scheduler.py:5675) ends a waiting request at once: it
leaves the queue (abort method 1). The request being chunked is released at the top of
the next step (process_pending_chunked_abort, :3778), before anything else, so also
before the step: its own pages freed, not cached (release_kv_cache with checkpoint off;
what earlier chunks cached stays cached), its radix lock released. A running one (the
running batch or the last prefill batch) is marked to finish (method 3): it stays in
the batch, is scheduled as usual, and finishes at its next sample with FINISH_ABORT,
released as a finished request is; a marked request retracted before that forward keeps
its mark in the waiting queue (reset_for_retract leaves to_finish), recomputes when
admitted again, and finishes at the sample that ends its prefill. An arrival that can
never complete, whose prompt fills max_model_len or is longer than the front end takes
(config max_prompt_len: SGLang's validate_input_length refuses prompts of max_req_len -
5 tokens or more) is rejected in its arrival step; an abort finds it refused already.

The rules are kvsched.spec.knobs.SGLangKnobs, so that each can be flipped.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass, field
from itertools import count

from kvsched.reference.allocator import FreeList
from kvsched.reference.radix import Cached, Node, RadixTree, Undo
from kvsched.spec.blocks import rejectable
from kvsched.spec.knobs import Knobs, SGLangKnobs
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
from kvsched.spec.step_kinds import knob_refusal

# SGLang's FCFS pass re-stamps the waiting requests' cached prefixes every this many
# passes, for at most this many of them (WAITING_PREFIX_REFRESH_INTERVAL and
# WAITING_QUEUE_PREFIX_MATCH_MAX, schedule_policy.py:280-302).
TOUCH_INTERVAL = 32
TOUCH_MOST = 128


@dataclass(eq=False)
class SGLangRequest:
    """A live request as SGLang's Req holds it: its outputs, its committed KV (C) and
    the pages it holds; `entry` orders queue entries (SGLang's wait_queue_entry_time)."""

    request: Request
    max_new: int  # its max_tokens as SGLang clips them (SGLangScheduler.add_request)
    outputs: int = 0
    computed: int = 0
    # Its first `cached` tokens are radix-cache pages it holds locked (`lock`): a prefix
    # hit, or what it inserted itself (SGLang's cache_protected_len); the pages of the
    # rest of its computed tokens are its own.
    cached: int = 0
    lock: Node | None = None
    pages: list[int] = field(default_factory=list)  # its table: page ids, in order
    entry: int = 0
    # The known tokens when SGLang last refreshed the request's fill ids (trying it for
    # admission, continuing its chunk, mixing its decode); 0 until it is first tried.
    # Priority preemption sizes a waiting request's need by it (the fill ids of a fresh
    # request are empty, and a victim's are those of its last admission).
    fill: int = 0
    # The radix-cache hit of that refresh (SGLang's prefix_len): priority preemption
    # sizes the need by the fill less it; 0 for a fresh request and after a retraction
    # (reset_for_retract).
    fill_hit: int = 0
    preemptions: int = 0
    status: Status = Status.WAITING
    aborting: bool = False  # marked by an abort: finishes at its next sample (to_finish)

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def known(self) -> int:
        """Prompt and outputs: SGLang's fill_ids."""
        return self.request.prompt_len + self.outputs



def max_req_len(config: Config) -> int:
    """SGLang's longest request: min(context_len - 1, pool tokens - 1)
    (tp_worker.py:568)."""
    return min(config.max_model_len - 1, config.num_gpu_blocks * config.block_size - 1)


def output_room(config: Config, prompt_len: int) -> int:
    """The most output tokens SGLang lets a prompt of `prompt_len` tokens ask for: it
    clips max_new_tokens to what its context and its pool hold (init_req_max_new_tokens,
    scheduler.py:2700): max_req_len - P - 1, and the pool less the prompt's pages and a
    page, less 1. May be below 1."""
    page = config.block_size
    prompt_pages = math.ceil(prompt_len / page) * page
    return min(max_req_len(config) - prompt_len - 1,
               config.num_gpu_blocks * page - prompt_pages - page - 1)


class SGLangScheduler:
    """SGLang 0.5.23's step (the module's NOTE) on `config`, its rules `knobs.sglang`."""

    def __init__(self, config: Config, knobs: Knobs | None = None) -> None:
        if config.step_mix == "any":
            raise ValueError("SGLang's steps run prefill work or decodes: config step_mix "
                             "must be prefill_or_decode or mixed_chunk")
        refused = knob_refusal("sglang", knobs or Knobs())
        if refused is not None:
            raise ValueError(refused)
        self.config = config
        self.rules: SGLangKnobs = (knobs or Knobs()).sglang
        r = self.rules
        self.init_ratio = min(r.new_token_ratio, 1.0)
        self.min_ratio = min(self.init_ratio * r.min_ratio_factor, 1.0)
        self.decay = (self.init_ratio - self.min_ratio) / r.decay_steps
        self.ratio = self.init_ratio
        self.page = config.block_size
        self.total = config.num_gpu_blocks * self.page
        # The allocator's free pages, handed out from the head; freed ones join the tail
        # (pages of one token: TokenToKVPoolAllocator.free) or the head in id order
        # (PagedTokenToKVPoolAllocator.free).
        self.free_pages = FreeList(config.first_block_id, config.num_gpu_blocks)
        self.tree = RadixTree(self.page, disable=not config.prefix_caching)
        self.book = KeyBook(self.page)  # the content keys of requests' pages
        self.passes = 0  # calc_priority calls with something waiting (the FCFS touch)
        self.live: dict[str, SGLangRequest] = {}
        self.waiting: list[SGLangRequest] = []
        self.running: list[SGLangRequest] = []
        self.chunked: SGLangRequest | None = None
        self.last_batch: list[SGLangRequest] = []
        self.last_was_prefill = False
        self.batch_is_full = False
        self.entries = count()
        self.sampled: list[SGLangRequest] = []
        self.decoding: list[SGLangRequest] = []  # a mixed step's decodes
        self.hits: dict[str, tuple[int, ...]] = {}  # this step's prefix hits
        self.new_blocks: dict[str, tuple[int, ...]] = {}  # this step's new pages
        self.deduplicated: dict[str, tuple[int, ...]] = {}  # the last update's
        self.arrived: list[SGLangRequest] = []  # added since the last step
        # The last update's caching of the chunked request's chunk, undoable (_unstash):
        # the request, its cached length and lock before, the Undo.
        self.stash: tuple[SGLangRequest, int, Node | None, Undo] | None = None

    # -- the Scheduler interface --------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue `request`, its max_tokens clipped as SGLang clips max_new_tokens
        (output_room). (SGLang's adapter records only requests that need no clip.)"""
        if request.id in self.live:
            raise ValueError(f"request {request.id!r} is already live")
        room = output_room(self.config, request.prompt_len)
        r = SGLangRequest(request, max(1, min(request.max_tokens, room)))
        self._queue(r)
        self.arrived.append(r)

    def add_block_keys(self, request_id: str, keys: Sequence[str],
                       start: int | None = None) -> None:
        """The content keys of a request's pages, as a trace gives them
        (kvsched.spec.interface.ContentKeys)."""
        self.book.add(request_id, keys, start)

    def _tokens(self, r: SGLangRequest) -> list[Hashable]:
        """What the radix cache matches of `r`: its known tokens, token j as its page's
        content key and its place in the page."""
        rid, prefix, page, known = r.id, r.request.prefix, self.page, r.known
        keys = [self.book.key(rid, prefix, p) for p in range(-(-known // page))]
        return [(keys[j // page], j % page) for j in range(known)]

    def abort_request(self, request_id: str) -> None:
        """A client's abort of `request_id` (abort_request, scheduler.py:5675; the
        module's NOTE): a waiting request leaves the queue holding nothing (abort method
        1), the one being chunked is released (process_pending_chunked_abort: its own
        pages freed without caching them, its radix lock released), both ended now; a
        running one is marked to finish at its next sample (method 3) and stays live. An
        id not live (finished, rejected or unknown), an arrival the front end refuses
        (rejected in this step) and a request marked already are ignored, as SGLang
        ignores an abort that finds nothing to do."""
        r = self.live.get(request_id)
        if r is None or r.aborting:
            return
        if r in self.arrived and rejectable(self.config, r.request.prompt_len,
                                            r.request.max_tokens) is not None:
            return  # refused on arrival: SGLang never queued it
        if r in self.waiting:
            self.waiting.remove(r)
        elif r is self.chunked:
            self.chunked = None
            self._unstash(r)
        else:
            r.aborting = True
            return
        self._release(r)
        r.status = Status.ABORTED

    def free_blocks(self) -> int:
        """Free pages and evictable radix-cache pages (the trace's free_blocks)."""
        return (self.available + self.tree.evictable_size()) // self.page

    def block_table(self, request_id: str) -> tuple[int, ...]:
        r = self.live.get(request_id)
        return tuple(r.pages) if r is not None else ()

    def host_table(self, request_id: str) -> tuple[int, ...]:
        return ()

    def free_gpu_ids(self) -> tuple[int, ...]:
        """The allocator's free pages, in the order they are handed out (evictable
        radix-cache pages are not among them until evicted)."""
        return tuple(self.free_pages)

    def free_host_ids(self) -> tuple[int, ...]:
        return ()

    def states(self) -> dict[str, RequestView]:
        return {rid: self._view(r) for rid, r in self.live.items()}

    def state_of(self, request_id: str) -> RequestView | None:
        r = self.live.get(request_id)
        return None if r is None else self._view(r)

    @staticmethod
    def _view(r: SGLangRequest) -> RequestView:
        return RequestView(r.status, r.known, r.computed, len(r.pages), 0, r.preemptions)

    def has_unfinished(self) -> bool:
        return bool(self.live)

    def schedule(self) -> Decision:
        self.stash = None  # the last chunk stays cached from here on
        rejected = self._reject_arrivals()
        self._merge_last_batch()
        preempted: list[Preemption] = []
        self.hits = {}
        self.new_blocks = {}
        self.decoding = []
        batch = self._prefill_pass(preempted)
        if batch is not None:
            scheduled = batch
            self.last_was_prefill = True
        else:
            self.last_was_prefill = False
            scheduled = self._decode(preempted) if self.running else []
            if not scheduled and self.rules.idle_reset and self._fully_idle():
                self.ratio = self.init_ratio
        self.last_batch = [self.live[rid] for rid, _ in scheduled]
        self.sampled = [r for r in self.last_batch if r.computed == r.known]
        return Decision(rejected=rejected, preempted=tuple(preempted),
                        scheduled=tuple(scheduled),
                        sampled=tuple(r.id for r in self.sampled),
                        new_blocks=dict(self.new_blocks), prefix_hits=dict(self.hits))

    def update(self, stopped: Collection[str]) -> tuple[str, ...]:
        """Each sampled request's token, in batch order: a finished request's KV is cached
        and released; a prefill that goes on decoding is cached
        (process_batch_result_prefill, batch_result_processor.py:360-395). Then the
        chunked request's middle chunk is cached: SGLang does it first thing in the next
        step (stash_chunked_request, scheduler.py:3918), and nothing touches the cache
        in between."""
        done = []
        self.deduplicated = {}
        for r in self.sampled:
            r.outputs += 1
            if r.id in stopped or r.outputs >= r.max_new or r.aborting:
                self._checkpoint(r)
                self._release(r)
                r.status = Status.FINISHED
                done.append(r.id)
            elif self.last_was_prefill and r not in self.decoding:
                self._checkpoint(r)
        self.stash = None
        if self.chunked is not None and self.last_was_prefill:
            r = self.chunked
            cached, lock = r.cached, r.lock
            undo = self._checkpoint(r, undoable=True).undo
            self.stash = (r, cached, lock, undo) if undo is not None else None
        self.sampled = []
        return tuple(done)

    def dedups(self) -> dict[str, tuple[int, ...]]:
        """The requests whose tables the last update deduplicated, each with the pages
        its table now starts with (trace v1's `dedup`)."""
        return dict(self.deduplicated)

    # -- memory ---------------------------------------------------------------------------

    def _pages_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.page)

    @property
    def available(self) -> int:
        """Free KV tokens (SGLang's allocator's available_size)."""
        return len(self.free_pages) * self.page

    def _free(self, pages: Sequence[int]) -> None:
        if self.page == 1:
            self.free_pages.extend(pages)
        else:
            self.free_pages.extendleft(sorted(set(pages), reverse=True))

    def _evict_for(self, tokens: int) -> None:
        """Evict radix-cache leaves until `tokens` are free (evict_from_tree_cache)."""
        self._free(self.tree.evict_to_free(tokens, self.available))

    def _compute(self, r: SGLangRequest, n: int) -> None:
        """`n` more tokens of `r` computed, in the pages they need."""
        need = self._pages_for(r.computed + n) - len(r.pages)
        if need > len(self.free_pages):
            raise ValueError(f"{r.id} needs {need} pages, {len(self.free_pages)} are free")
        taken = self.free_pages.take(need)
        r.pages += taken
        r.computed += n
        if taken:
            self.new_blocks[r.id] = self.new_blocks.get(r.id, ()) + tuple(taken)

    def _checkpoint(self, r: SGLangRequest, undoable: bool = False) -> Cached:
        """Insert `r`'s computed pages into the radix cache (checkpoint_into_tree): the
        ones already cached are freed, `r`'s table takes the cache's copies
        (deduplication), and `r` holds the cached path locked. `undoable`: the result
        says how to take it back, where it freed nothing (RadixTree.cache_req)."""
        done = self.tree.cache_req(self._tokens(r), r.computed, r.request.prompt_len,
                                   r.cached, r.lock, r.pages, undoable)
        if done.freed_pages:
            self._free(done.freed_pages)
            r.pages[: len(done.table)] = done.table
            self.deduplicated[r.id] = done.table
        r.cached, r.lock = done.protected_len, done.lock
        return done

    def _unstash(self, r: SGLangRequest) -> None:
        """Take back the caching of the chunked request `r`'s last chunk, which the last
        update did where SGLang caches it first thing in the next step, when an abort
        before that step releases `r` instead (process_pending_chunked_abort runs before
        stash_chunked_request). Where that caching deduplicated or split a node it stays
        (the model's one approximation of an abort: docs/conformance/sglang.md)."""
        if self.stash is None or self.stash[0] is not r:
            return
        _, cached, lock, undo = self.stash
        self.tree.undo(undo)
        r.cached, r.lock = cached, lock

    def _release(self, r: SGLangRequest) -> None:
        """`r` ends: its own pages freed, its radix lock released (release_kv_cache,
        mem_cache/common.py:426-435), and it is no longer live."""
        self._free_own(r)
        self.tree.unlock(r.lock)
        r.lock, r.cached = None, 0
        del self.live[r.id]
        self.book.forget(r.id)
        self.deduplicated.pop(r.id, None)

    def _free_own(self, r: SGLangRequest) -> None:
        """Free `r`'s own pages: those past its cached prefix."""
        self._free(r.pages[r.cached // self.page :])
        r.pages = r.pages[: r.cached // self.page]

    def _queue(self, r: SGLangRequest, front: bool = False) -> None:
        r.status = Status.WAITING
        r.entry = next(self.entries)
        self.live[r.id] = r
        if front:
            self.waiting.insert(0, r)
        else:
            self.waiting.append(r)

    # -- the step -------------------------------------------------------------------------

    def _merge_last_batch(self) -> None:
        """The last prefill step's requests join the running batch (step 1)."""
        if self.last_was_prefill:
            joining = [r for r in self.last_batch
                       if r.id in self.live and r is not self.chunked]
            if len(joining) < len(self.last_batch):
                self.batch_is_full = False
            if joining and not self.running:
                # The last batch becomes the running batch, with its own flag.
                self.batch_is_full = False
            self.running += [r for r in joining if r not in self.running]
        before = len(self.running)
        self.running = [r for r in self.running if r.id in self.live]
        if len(self.running) < before:
            self.batch_is_full = False

    def _reject_arrivals(self) -> tuple[Rejection, ...]:
        """SGLang's front end refuses a prompt it cannot hold (validate_input_length):
        the arrivals that can never complete, or whose prompt fills max_model_len, are
        rejected in their arrival step."""
        out = []
        for r in self.arrived:
            why = rejectable(self.config, r.request.prompt_len, r.request.max_tokens)
            if why is not None and r.id in self.live:
                self.waiting.remove(r)
                del self.live[r.id]
                self.book.forget(r.id)
                r.status = Status.REJECTED
                out.append(Rejection(r.id, why))
        self.arrived = []
        return tuple(out)

    def _clip(self, tokens: int) -> int:
        return min(tokens, self.rules.clip_max_new_tokens)

    def _reserved(self, r: SGLangRequest) -> float:
        """A running request's reserved future output."""
        if not self.rules.reserve_output:
            return 0.0
        return self._clip(r.max_new - r.outputs) * self.ratio

    def _charge(self, tokens: int) -> int:
        """What an extend of `tokens` costs the budgets: its pages' tokens."""
        return self._pages_for(tokens) * self.page if self.rules.page_budget else tokens

    def _order_waiting(self) -> None:
        """calc_priority: sort by priority under the priority policy; every 32nd pass
        with something waiting, re-stamp the cached prefixes of the first 128, the head
        last (_touch_waiting_prefixes)."""
        if self.config.policy == "priority":
            sign = -1 if self.rules.higher_priority_first else 1
            self.waiting.sort(key=lambda r: (sign * r.request.priority, r.entry))
        if self.waiting and self.config.prefix_caching:
            if self.passes % TOUCH_INTERVAL == 0:
                for r in reversed(self.waiting[:TOUCH_MOST]):
                    self.tree.touch(self._tokens(r))
            self.passes += 1

    def _prefill_pass(self, preempted: list[Preemption]) -> list[tuple[str, int]] | None:
        config, page, rules = self.config, self.page, self.rules
        priority = config.policy == "priority"
        if priority or not self.running:
            self.batch_is_full = False
        if (self.batch_is_full or not self.waiting) and self.chunked is None:
            return None
        seats = config.max_num_seqs - len(self.running) - (self.chunked is not None)
        if seats <= 0 and self.chunked is None and not priority:
            self.batch_is_full = True
            return None
        self._order_waiting()
        mixed = len(self.running) if config.step_mix == "mixed_chunk" else 0
        # The input budget (max_prefill_tokens) and, with chunked prefill, the chunk
        # budget (chunked_prefill_size) beside it (PrefillAdder.__init__,
        # schedule_policy.py:638-655).
        rem_input = (rules.max_prefill_tokens if config.chunked_prefill
                     else config.max_num_batched_tokens) - mixed
        rem_chunk: int | None = (config.max_num_batched_tokens - mixed
                                 if config.chunked_prefill else None)
        total_offset: float = mixed + sum(self._reserved(r) for r in self.running)
        current_offset = mixed
        admitted: list[tuple[SGLangRequest, int]] = []
        victims: list[SGLangRequest] = []
        new_chunked: SGLangRequest | None = None

        def free() -> int:
            return self.available + self.tree.evictable_size()

        def reserve(extend: int, max_new: int) -> None:
            nonlocal total_offset, current_offset, rem_input, rem_chunk
            immediate = self._pages_for(extend) * page + page
            total_offset += immediate + (max_new if rules.reserve_output else 0)
            current_offset += immediate
            rem_input -= self._charge(extend)
            if rem_chunk is not None:
                rem_chunk -= self._charge(extend)

        def state() -> str:
            if free() - total_offset <= 0 or free() - current_offset <= 0:
                return "no_token"
            if rem_input <= 0 or (rem_chunk is not None and rem_chunk <= 0):
                return "other"
            return "continue"

        chunked = self.chunked
        if chunked is not None:
            assert rem_chunk is not None
            extend = chunked.known - chunked.computed
            left = min(rem_chunk, int(free() - total_offset))
            room = left if left > 0 else rem_chunk
            cut = extend > room
            n = min(extend, room)
            admitted.append((chunked, n))
            reserve(n, 0 if cut else self._clip(chunked.max_new))
            self.chunked = chunked if cut else None
        for r in self.waiting:
            if state() == "other":
                break
            if len(self.running) + len(admitted) >= config.max_num_seqs:
                self.batch_is_full = True
            if self.batch_is_full:
                freed = self._preempt_for(r, free() - total_offset, victims) if priority \
                    else None
                if freed is None:
                    break
                total_offset -= freed
            r.fill = r.known
            hit = self.tree.match(self._tokens(r), r.known - 1)
            r.fill_hit = hit.length
            extend = r.known - hit.length
            max_new = self._clip(max(r.max_new - r.outputs, 0))
            total = extend + (max_new if rules.reserve_output else 0) + page
            held = self.tree.lock(hit.node)  # while it is checked (PrefillAdder._lock_node)
            fits = total < free() - total_offset
            self.tree.unlock(held)
            if not fits:
                if rules.misfit == "skip":
                    continue
                self.batch_is_full = bool(admitted) or bool(self.running)
                break
            if rem_chunk is None and admitted and self._charge(extend) >= rem_input:
                break
            if rem_chunk is not None and self._charge(extend) > rem_chunk:
                end = (hit.length + rem_chunk // page * page) // page * page
                n = end - hit.length
                if n <= 0:
                    break
                new_chunked = r
                max_reserved = 0
            else:
                n = extend
                max_reserved = self._clip(r.max_new)
            r.cached, r.computed, r.pages = hit.length, hit.length, list(hit.pages)
            r.lock = self.tree.lock(hit.node)
            if hit.length:
                self.hits[r.id] = hit.pages
            admitted.append((r, n))
            reserve(n, max_reserved)
            if state() != "continue":
                if state() == "no_token":
                    self.batch_is_full = bool(admitted) or bool(self.running)
                break
        chosen = {r for r, _ in admitted}  # one object per live id (eq=False: by identity)
        self.waiting = [r for r in self.waiting if r not in chosen]
        for v in victims:  # requeued even when nobody was admitted
            self._queue(v, front=rules.requeue == "front")
            preempted.append(Preemption(v.id, "recompute"))
        if not admitted:
            return None
        if new_chunked is not None:
            self.chunked = new_chunked
        # prepare_for_extend: evict for the whole batch, then allocate (allocation.py)
        extend_tokens = sum(n for _, n in admitted)
        self._evict_for(extend_tokens + (len(admitted) * page if page > 1 else 0))
        scheduled: list[tuple[str, int]] = []
        for r, n in admitted:
            r.status = Status.RUNNING
            self._compute(r, n)
            scheduled.append((r.id, n))
        if config.step_mix == "mixed_chunk" and self.running \
                and self._decode_fits(self.running):
            self._evict_for(len(self.running) * page)
            for r in self.running:  # they rejoin from the last batch, after the admitted
                r.fill = r.known
                self._compute(r, 1)
                scheduled.append((r.id, 1))
            self.decoding = self.running
            self.running = []
        return scheduled

    def _preempt_for(self, r: SGLangRequest, rem_total: float,
                     victims: list[SGLangRequest]) -> float | None:
        """Priority preemption at the running-request limit (preempt_to_schedule): the
        future output the victims had reserved, or None when `r` preempts nobody."""
        rules = self.rules
        sign = -1 if rules.higher_priority_first else 1
        ranked = sorted((x for x in self.running if x not in victims),
                        key=lambda x: (-sign * x.request.priority, -x.entry))
        # min_tokens_to_remove: the extend of `r`'s last fill ids (less the cached prefix
        # its last try matched), its clipped max_new_tokens, less the memory budget left
        cached = r.fill_hit if rules.preempt_need_net_of_prefix else 0
        need = r.fill - cached + self._clip(r.max_new) - rem_total
        chosen: list[SGLangRequest] = []
        for x in ranked:
            if (r.request.priority - x.request.priority) * -sign \
                    > rules.priority_preemption_threshold:
                chosen.append(x)
                need -= self._reserved(x)
                if need <= 0:
                    break
            else:
                break
        if not chosen or need > 0:
            return None
        freed = 0.0
        batch = [x for x in self.running if x in chosen]  # released in batch order
        for i, x in enumerate(batch):
            freed += self._reserved(x)
            self._retract(x, len(self.running) - i - 1)
            victims.append(x)
        self.running = [x for x in self.running if x not in chosen]
        return freed

    def _retract(self, r: SGLangRequest, remaining: int) -> None:
        """Free `r`'s own pages without caching them, release its lock, then evict until
        20 tokens for each of the `remaining` requests are free (release_req,
        schedule_batch.py:2360); `r` recomputes from nothing."""
        self._free_own(r)
        self.tree.unlock(r.lock)
        r.lock, r.cached, r.computed, r.pages = None, 0, 0, []
        r.fill_hit = 0
        r.preemptions += 1
        self._evict_for(remaining * self.rules.retract_decode_steps)

    def _decode_fits(self, batch: list[SGLangRequest]) -> bool:
        """Whether the next decode of `batch` finds its new pages free, after evicting
        (check_decode_mem)."""
        need = sum(1 for r in batch if r.computed % self.page == 0) * self.page
        self._evict_for(need)
        return need <= self.available

    def _decode(self, preempted: list[Preemption]) -> list[tuple[str, int]]:
        rules = self.rules
        initial = len(self.running)
        if not self._decode_fits(self.running):
            if rules.retract_victim == "fewest_outputs":
                order = sorted(self.running, key=lambda r: (r.outputs, -r.request.prompt_len),
                               reverse=True)
            elif rules.retract_victim == "least_urgent":  # _get_decode_retraction_order
                sign = 1 if rules.higher_priority_first else -1
                order = sorted(self.running, key=lambda r: (sign * r.request.priority,
                                                            r.outputs, -r.request.prompt_len),
                               reverse=True)
            else:
                order = list(self.running)
            first = True
            while first or not self._decode_fits(order):
                if len(order) == 1:
                    break
                first = False
                victim = order.pop()
                self._retract(victim, len(order))
                preempted.append(Preemption(victim.id, "recompute"))
                self._queue(victim, front=rules.requeue == "front")
            self.running = order
            n = len(order)
            self.ratio = min(1.0, (sum(r.outputs for r in order) + rules.retract_decode_steps
                                   * n) / (sum(r.max_new for r in order) + 1))
        elif rules.decay:
            self.ratio = max(self.ratio - self.decay, self.min_ratio)
        if len(self.running) < initial:
            self.batch_is_full = False
        self._evict_for(len(self.running) * self.page)  # alloc_for_decode's demand
        for r in self.running:
            self._compute(r, 1)
        return [(r.id, 1) for r in self.running]

    def _fully_idle(self) -> bool:
        return (not self.running and self.chunked is None and not self.last_batch
                and not self.waiting)
