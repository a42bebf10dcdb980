"""The optimized scheduler: the reference's decisions, computed with tensor operations.

NOTE on the algorithm. The state is a struct of arrays: one column per request slot
(N tokens known, C computed, G GPU blocks, H host blocks, prompt, max_tokens, priority,
arrival step, seq, status, preemptions, block-table rows). A step is the reference's
step (docs/spec.md section 2; the reference scheduler has the loop-per-request
version), computed without a Python loop over requests:

- running pass: each request's chunk is min(N - C, threshold, max_model_len - 1 - C)
  cut by the budget left before it, so chunks are a prefix sum over the running order
  and the budget runs out at a searchable index; block needs are a second prefix sum,
  and the first request whose cumulative need exceeds the free blocks is where a
  preemption happens. The victims of a step are a prefix of one fixed order (the
  running order reversed for the tail rule, descending (priority, arrival, seq) for
  the priority rule, since each victim is the maximum of what is left), so the number
  of victims is a search over their cumulative blocks. A victim scheduled earlier in
  the step gives back its tokens and its new blocks (vLLM's priority victim). Only
  preemption events loop, and the pass resumes after the request that caused them;
- swap-in and waiting passes: the admission cut is the first index where a prefix-sum
  condition fails (token budget, blocks for the whole sequence plus the watermark when
  something runs, or always under watermark_scope always, the sequence limit), taken
  over the head of the queue in doubling windows, so their cost grows with the admitted
  requests, not with the queue. An admission or a swap-in takes the blocks of
  max(C + n, R) tokens, R being what config `allocation` reserves (0 lazy, N prompt,
  LIMIT full: the spec's allocation_reserve);
- computed tokens advance for the scheduled set; those that catch up sample in
  `update`, which finishes requests with vectorized tests.

With prefix caching (vLLM v1's block pool): holders and "has content" per GPU block
are tensors, content keys live in Python dicts; the blocks a chunk fills are cached
after every allocation, and only they are keyed in Python; a release walks the
released tables from their ends in one go, freeing a block at its last holder's
appearance, uncached blocks to the free list's head and cached ones to its tail; the
victim search counts the blocks a victim actually frees; admissions go one at a time,
since each may hit what the previous ones cached or evict what the next would hit.

Block ids come from a tensor free list in the reference allocator's order, so every
decision, new block ids included, equals the reference's. This module never imports
the reference package: it is an independent implementation, checked against the reference
by tests/test_differential.py.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

try:
    import torch
except ImportError:
    raise ImportError("the torch scheduler (kvsched.optimized.TorchScheduler) needs torch: "
                      "pip install 'kvsched[gpu]'", name="torch") from None
from torch import Tensor

from kvsched.optimized.blocks import BlockTable, FreeList, cdiv, spans
from kvsched.optimized.knobs import unsupported_config, unsupported_knobs
from kvsched.optimized.queues import FcfsQueue, PriorityQueue
from kvsched.spec.blocks import rejectable
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import (
    Config,
    Decision,
    Preemption,
    Rejection,
    Request,
    RequestView,
    Status,
)
from kvsched.spec.prefix import KeyBook, Prefix

I64 = torch.int64

# Rows of the state tensor (one column per slot). N, LIMIT, C, G, H stay adjacent: a
# step gathers them with one slice. LIMIT = min(P + O, max_model_len) is the N at which
# a request finishes (max_tokens or max_model_len reached). CACHED (prefix caching): how
# many blocks of the slot's table are cached (or were hit), so are not cached again.
N_, LIMIT, C_, G_, H_, P_, O_, PRIO, ARR, SEQ, STATUS, NPRE, GROW, HROW, CACHED = range(15)
FIELDS = 15
WAITING, RUNNING, SWAPPED, FREE = 0, 1, 2, 3
STATUS_NAMES = {WAITING: Status.WAITING, RUNNING: Status.RUNNING, SWAPPED: Status.SWAPPED}


def leading_true(cond: Tensor) -> Tensor:
    """How many elements of a boolean vector are true before the first false one."""
    return cond.to(I64).cumprod(0).sum()


def lex_order(keys: list[Tensor], descending: bool) -> Tensor:
    """Indices that sort by keys[0], then keys[1], ... (stable sorts, last key first)."""
    idx = torch.argsort(keys[-1], descending=descending, stable=True)
    for k in reversed(keys[:-1]):
        idx = idx[torch.argsort(k[idx], descending=descending, stable=True)]
    return idx


@dataclass
class StepTensors:
    """One step's decision as tensors of slots (valid until the next `update`).

    `scheduled` and `tokens` are in batch order; `new_block_slots` are the scheduled
    slots that got new blocks, `new_block_counts` how many, and `new_block_ids` the ids
    of all of them, run after run. `rejected` and `preempted` are small Python lists.
    """

    rejected: list[Rejection]
    preempted: list[tuple[int, str]]
    swapped_in: Tensor
    scheduled: Tensor
    tokens: Tensor
    sampled: Tensor
    new_block_slots: Tensor
    new_block_counts: Tensor
    new_block_ids: Tensor
    # (slot, pool indices of its hit blocks) per admission with a prefix hit, in order
    prefix_hits: list[tuple[int, list[int]]] = field(default_factory=list)


@dataclass
class _Step:
    """What the passes of one step accumulate, in batch order."""

    slots: list[Tensor] = field(default_factory=list)
    tokens: list[Tensor] = field(default_factory=list)
    block_starts: list[Tensor] = field(default_factory=list)
    block_counts: list[Tensor] = field(default_factory=list)
    computed: list[Tensor] = field(default_factory=list)  # C after the step
    known: list[Tensor] = field(default_factory=list)  # N
    preempted: list[tuple[int, str]] = field(default_factory=list)
    recompute_victims: list[int] = field(default_factory=list)
    swap_victims: list[int] = field(default_factory=list)
    swapped_in: list[Tensor] = field(default_factory=list)
    prefix_hits: list[tuple[int, list[int]]] = field(default_factory=list)

    def add(self, slots: Tensor, tokens: Tensor, starts: Tensor, counts: Tensor,
            computed: Tensor, known: Tensor) -> None:
        self.slots.append(slots)
        self.tokens.append(tokens)
        self.block_starts.append(starts)
        self.block_counts.append(counts)
        self.computed.append(computed)
        self.known.append(known)


def _cat(parts: list[Tensor], empty: Tensor) -> Tensor:
    if not parts:
        return empty
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class TorchScheduler:
    """The reference's policy on tensors, on `device` ("cpu" or "cuda").

    `knobs` are the spec's (a profile's knobs work as they are); None means vLLM v1's.
    It runs vLLM v1's step: a knob of another step kind (vLLM V0's, SGLang's) or of
    COMPILED_ONLY_KNOBS (older vLLM v1 releases') set away from its default is refused
    (kvsched.optimized.knobs).
    """

    def __init__(self, config: Config, knobs: Knobs | None = None,
                 device: str | torch.device = "cpu") -> None:
        chosen = knobs if knobs is not None else Knobs()
        problems = config.problems() + chosen.problems()
        refused = unsupported_knobs(chosen, "torch")
        if refused is not None:
            problems.append(refused)
        if not problems:
            refused = unsupported_config(config, "torch")
            if refused is not None:
                problems.append(refused)
        if problems:
            raise ValueError(problems[0])
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device cuda: torch.cuda.is_available() is False here")
        self.config = config
        self.knobs = chosen
        self._priority = config.policy == "priority"
        rule = chosen.victim
        if rule == "policy":
            rule = "lowest_priority" if self._priority else "tail"
        self._tail_victims = rule == "tail"
        self._threshold = config.long_prefill_token_threshold if config.chunked_prefill else 0

        dev = self.device
        self._capacity = 64
        self.state = torch.zeros((FIELDS, self._capacity), dtype=I64, device=dev)
        self.state[STATUS] = FREE
        self.state[SEQ] = -1
        self._ids = np.full(self._capacity, "", dtype=object)
        self._marks = torch.zeros(self._capacity, dtype=torch.bool, device=dev)
        self._slot_of: dict[str, int] = {}
        self._spare_slots: list[int] = []  # freed slots, reused first
        self._unused = 0  # slots from here on were never used
        self._seq = 0
        # Arrivals not yet written to the tensors: slot, P, O, priority, arrival, seq.
        self._pending: list[tuple[int, int, int, int, int, int]] = []
        self._arrived: list[tuple[Tensor, Tensor]] = []  # (slots, seqs) to check for rejection

        # A live request computes at most max_model_len - 1 tokens; under full allocation
        # it holds blocks for its longest sequence, up to max_model_len.
        most_tokens = config.max_model_len - (config.allocation != "full")
        most_blocks = -(-max(most_tokens, 1) // config.block_size)
        self._always_watermark = config.watermark_scope == "always"
        self.gpu_free = FreeList(config.num_gpu_blocks, dev)
        self.cpu_free = FreeList(config.num_cpu_blocks, dev)
        self.gpu_table = BlockTable(most_blocks, dev)
        self.cpu_table = BlockTable(most_blocks, dev)

        # Prefix caching: holders and content per GPU block as tensors (what releases and
        # allocations test in bulk); content keys, strings, in Python dicts.
        self._caching = config.prefix_caching
        size = config.num_gpu_blocks if self._caching else 0
        self._holders = torch.zeros(size, dtype=I64, device=dev)  # tables holding it
        self._has_content = torch.zeros(size, dtype=torch.bool, device=dev)
        self._content: dict[int, str] = {}  # cached block -> its content key
        self._by_key: dict[str, dict[int, None]] = {}  # key -> its blocks, first cached first
        self._prefix_of: dict[str, Prefix] = {}  # a request's shared prefix, when it has one
        self._keys = KeyBook(config.block_size)  # content keys, for prefix caching

        self._empty = torch.empty(0, dtype=I64, device=dev)
        self._zero1 = torch.zeros(1, dtype=I64, device=dev)
        self.running = self._empty
        self.swapped = self._empty  # kept in policy order
        self.waiting: FcfsQueue | PriorityQueue = (PriorityQueue(dev) if self._priority
                                                   else FcfsQueue(dev))
        self._sampled = self._empty

    # -- slots and the interface ------------------------------------------------------

    def _grow(self, at_least: int) -> None:
        new = max(self._capacity + self._capacity // 2, at_least)
        state = torch.zeros((FIELDS, new), dtype=I64, device=self.device)
        state[:, :self._capacity] = self.state
        state[STATUS, self._capacity:] = FREE
        state[SEQ, self._capacity:] = -1
        self.state = state
        self._ids = np.concatenate((self._ids, np.full(new - self._capacity, "", dtype=object)))
        self._marks = torch.zeros(new, dtype=torch.bool, device=self.device)
        self._capacity = new

    def add_request(self, request: Request) -> None:
        if request.id in self._slot_of:
            raise ValueError(f"request id {request.id!r} is already live")
        if self._spare_slots:
            slot = self._spare_slots.pop()
        else:
            slot = self._unused
            self._unused += 1
            if slot >= self._capacity:
                self._grow(slot + 1)
        self._slot_of[request.id] = slot
        self._ids[slot] = request.id
        if self._caching and request.prefix:
            self._prefix_of[request.id] = request.prefix
        self._pending.append((slot, request.prompt_len, request.max_tokens, request.priority,
                              request.arrival_step, self._seq))
        self._seq += 1
        if len(self._pending) >= 4096:
            self._flush()  # in the order of arrival, as schedule() would: bounded memory

    def _flush(self) -> None:
        """Write pending arrivals to the tensors and queue them (one batch)."""
        if not self._pending:
            return
        rows = torch.tensor(self._pending, dtype=I64, device=self.device).T
        slots, prompt, max_tokens, priority, arrival, seq = rows
        m = slots.numel()
        block = torch.zeros((FIELDS, m), dtype=I64, device=self.device)
        block[N_] = prompt
        block[LIMIT] = torch.clamp_max(prompt + max_tokens, self.config.max_model_len)
        block[P_] = prompt
        block[O_] = max_tokens
        block[PRIO] = priority
        block[ARR] = arrival
        block[SEQ] = seq
        block[STATUS] = WAITING
        block[GROW] = -1
        block[HROW] = -1
        self.state[:, slots] = block
        self.waiting.push_arrivals(slots, seq, [p[3] for p in self._pending], arrival,
                                   [p[4] for p in self._pending],
                                   [p[5] for p in self._pending])
        self._arrived.append((slots, seq))
        self._pending = []

    def _forget(self, slots: list[int]) -> list[str]:
        """Drop ended requests' ids and free their slots; return the ids."""
        out: list[str] = self._ids[slots].tolist()
        slot_of = self._slot_of
        for rid in out:
            del slot_of[rid]
        if self._caching:
            for rid in out:
                self._prefix_of.pop(rid, None)
        self._ids[slots] = ""
        self._spare_slots.extend(slots)
        return out

    def ids_of(self, slots: Tensor) -> list[str]:
        """The ids of live slots, in order."""
        out: list[str] = self._ids[slots.cpu().numpy()].tolist()
        return out

    def _release_blocks(self, slots: Tensor) -> None:
        """Every block the slots hold goes back: GPU blocks in reverse table order, host
        blocks in table order, slot after slot."""
        st = self.state
        g = st[G_, slots]
        h = st[H_, slots]
        totals = torch.stack((g.sum(), h.sum())).tolist()
        if totals[0]:
            rows = st[GROW, slots]
            if self._caching:
                self._let_go(*self._walk(slots, g, totals[0]))
            else:
                self.gpu_free.put(self.gpu_table.read_reversed(rows, g, totals[0]))
            self.gpu_table.give_back(rows[g > 0])
        if totals[1]:
            rows = st[HROW, slots]
            zero = torch.zeros_like(h)
            self.cpu_free.put(self.cpu_table.read(rows, zero, h, totals[1]))
            self.cpu_table.give_back(rows[h > 0])
        st[G_, slots] = 0
        st[H_, slots] = 0
        st[GROW, slots] = -1
        st[HROW, slots] = -1
        st[CACHED, slots] = 0

    def add_block_keys(self, request_id: str, keys: Sequence[str],
                       start: int | None = None) -> None:
        """Content keys of the request's blocks from table index `start` on (by default
        the next ones), as a trace gives them (`block_keys`); they take the place of
        those its prefix would give, and of any given from `start` before."""
        self._keys.add(request_id, keys, start)

    def abort_request(self, request_id: str) -> None:
        self._flush()
        slot = self._slot_of[request_id]
        status = int(self.state[STATUS, slot])
        if status == RUNNING:
            self.running = self.running[self.running != slot]
        elif status == SWAPPED:
            self.swapped = self.swapped[self.swapped != slot]
        # A waiting entry stays in its queue and is recognised as stale.
        one = torch.tensor([slot], dtype=I64, device=self.device)
        self._release_blocks(one)
        self.state[STATUS, slot] = FREE
        self._keys.forget(request_id)
        self._forget([slot])

    def free_blocks(self) -> int:
        return self.gpu_free.count

    def has_unfinished(self) -> bool:
        return bool(self._slot_of)

    def states(self) -> dict[str, RequestView]:
        self._flush()
        if not self._slot_of:
            return {}
        slots = list(self._slot_of.values())
        idx = torch.tensor(slots, dtype=I64, device=self.device)
        cols = self.state[:, idx].T.tolist()
        return {str(self._ids[s]): RequestView(STATUS_NAMES[c[STATUS]], c[N_], c[C_], c[G_],
                                               c[H_], c[NPRE])
                for s, c in zip(slots, cols, strict=True)}

    # -- block tables (kvsched.spec.interface.BlockTables) ------------------------------

    # GPU block ids are the pool's indices plus config.first_block_id (the engine's first).

    def block_table(self, request_id: str) -> tuple[int, ...]:
        first = self.config.first_block_id
        return tuple(b + first for b in self._table_row(request_id, G_, GROW, self.gpu_table))

    def host_table(self, request_id: str) -> tuple[int, ...]:
        return self._table_row(request_id, H_, HROW, self.cpu_table)

    def free_gpu_ids(self) -> tuple[int, ...]:
        first = self.config.first_block_id
        return tuple(b + first for b in self.gpu_free.snapshot())

    def free_host_ids(self) -> tuple[int, ...]:
        return tuple(self.cpu_free.snapshot())

    def _table_row(self, request_id: str, count: int, row: int, table: BlockTable
                   ) -> tuple[int, ...]:
        self._flush()
        slot = self._slot_of.get(request_id)
        if slot is None:
            return ()
        held, at = int(self.state[count, slot]), int(self.state[row, slot])
        return () if held == 0 else tuple(int(b) for b in table.table[at, :held].tolist())

    def slot_of(self, request_id: str) -> int:
        return self._slot_of[request_id]

    def id_of(self, slot: int) -> str:
        return str(self._ids[slot])

    # -- one step ---------------------------------------------------------------------

    def schedule(self) -> Decision:
        t = self.schedule_tensors()
        ids = self.ids_of
        scheduled = tuple(zip(ids(t.scheduled), t.tokens.tolist(), strict=True))
        new_blocks: dict[str, tuple[int, ...]] = {}
        flat = (t.new_block_ids + self.config.first_block_id).tolist()
        at = 0
        for rid, c in zip(ids(t.new_block_slots), t.new_block_counts.tolist(), strict=True):
            new_blocks[rid] = tuple(flat[at:at + c])
            at += c
        first = self.config.first_block_id
        hits = {str(self._ids[s]): tuple(b + first for b in blocks) for s, blocks in t.prefix_hits}
        return Decision(tuple(t.rejected),
                        tuple(Preemption(str(self._ids[s]), mode) for s, mode in t.preempted),
                        tuple(ids(t.swapped_in)), scheduled, tuple(ids(t.sampled)), new_blocks,
                        hits)

    def schedule_tensors(self) -> StepTensors:
        """The step's decision as tensors (the fast path for simulation loops)."""
        self._flush()
        cfg = self.config
        rejected = self._reject_arrivals()
        threshold = self._threshold
        if self.knobs.lift_threshold_when_alone and len(self._slot_of) <= 1:
            threshold = 0
        step = _Step()
        budget = self._running_pass(cfg.max_num_batched_tokens, threshold, step)
        if not step.preempted or self.knobs.admit_after_preempt:
            budget = self._swap_in_pass(budget, threshold, step)
            if self._caching:
                self._waiting_pass_cached(budget, threshold, step)
            else:
                self._waiting_pass(budget, threshold, step)
        self._requeue_victims(step)

        st = self.state
        scheduled = _cat(step.slots, self._empty)
        tokens = _cat(step.tokens, self._empty)
        computed = _cat(step.computed, self._empty)
        st[C_, scheduled] = computed
        self._sampled = scheduled[computed == _cat(step.known, self._empty)]
        starts = _cat(step.block_starts, self._empty)
        counts = _cat(step.block_counts, self._empty)
        got = torch.nonzero(counts).flatten()
        nb_slots, nb_starts, nb_counts = scheduled[got], starts[got], counts[got]
        total = int(nb_counts.sum())
        nb_ids = self.gpu_table.read(st[GROW, nb_slots], nb_starts, nb_counts, total)
        return StepTensors(rejected, step.preempted, _cat(step.swapped_in, self._empty),
                           scheduled, tokens, self._sampled, nb_slots, nb_counts, nb_ids,
                           step.prefix_hits)

    def _reject_arrivals(self) -> list[Rejection]:
        """Arrivals that can never complete, even alone in an empty cache (section 2)."""
        if not self._arrived:
            return []
        cfg = self.config
        slots = _cat([a for a, _ in self._arrived], self._empty)
        seqs = _cat([s for _, s in self._arrived], self._empty)
        self._arrived = []
        st = self.state
        prompt, max_tokens = st[P_, slots], st[O_, slots]
        live = (st[STATUS, slots] == WAITING) & (st[SEQ, slots] == seqs)
        longest = torch.minimum(prompt + max_tokens,
                                torch.full_like(prompt, cfg.max_model_len))
        # A prompt of max_model_len tokens is rejected too (the reference's choice).
        room = cfg.num_gpu_blocks - (cfg.watermark_blocks if self._always_watermark else 0)
        never = (prompt >= cfg.max_model_len) | (cdiv(longest, cfg.block_size) > room)
        bad = slots[live & never]
        if bad.numel() == 0:
            return []
        st[STATUS, bad] = FREE
        out = []
        bad_list = bad.tolist()
        numbers = st[P_:O_ + 1, bad].T.tolist()
        for rid, (p, o) in zip(self._forget(bad_list), numbers, strict=True):
            out.append(Rejection(rid, rejectable(cfg, p, o) or ""))
        return out

    # -- running pass -----------------------------------------------------------------

    def _running_pass(self, budget: int, threshold: int, step: _Step) -> int:
        """Schedule running requests in order; preempt on block shortage. Returns the
        budget left."""
        cfg = self.config
        st = self.state
        order = self.running
        length = order.numel()
        if length == 0 or budget <= 0:
            return budget
        # Tokens and new blocks by position, made at the first preemption (before it, the
        # scheduled set is a prefix of the running order).
        tokens_at: Tensor | None = None
        new_at: Tensor | None = None
        first: tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor] | None = None
        dead: list[int] = []  # positions of this step's victims
        victim_order: Tensor | None = None  # priority rule: positions, most expendable first
        taken = 0  # victims taken from victim_order
        end = length  # tail rule: victims are the positions from `end` on
        pos = 0
        while pos < end and budget > 0:
            holes = [d - pos for d in dead if pos <= d < end]
            if holes:
                alive = torch.ones(end - pos, dtype=torch.bool, device=self.device)
                alive[torch.tensor(holes, dtype=I64, device=self.device)] = False
                where = torch.nonzero(alive).flatten() + pos
                slots = order[where]
            else:
                where = torch.arange(pos, end, device=self.device)
                slots = order[pos:end]
            ncg = st[N_:G_ + 1, slots]
            known, computed, held = ncg[0], ncg[2], ncg[3]
            want = known - computed
            if threshold > 0:
                want = want.clamp_max(threshold)
            # vLLM v1's cap on the input position (C + n <= max_model_len - 1), as in the
            # reference's running pass, which says why it never cuts a chunk here.
            want = torch.minimum(want, cfg.max_model_len - 1 - computed).clamp_min(0)
            left = budget - (torch.cumsum(want, 0) - want)
            n = torch.minimum(want, left).clamp_min(0)
            need = (cdiv(computed + n, cfg.block_size) - held).clamp_min(0)
            need = torch.where(n > 0, need, 0)
            cum_need = torch.cumsum(need, 0)
            free = self.gpu_free.count
            stop, fit = torch.stack(((left > 0).sum(), (cum_need <= free).sum())).tolist()
            k = min(stop, fit)
            if k > 0:
                got_tokens, got_blocks = torch.stack(
                    (n[:k].sum(), cum_need[k - 1])).tolist()
                self._allocate(slots[:k], held[:k], need[:k], got_blocks)
                if self._caching:
                    self._cache_filled(slots[:k], computed[:k] + n[:k])
                if tokens_at is None or new_at is None:
                    first = (slots[:k], n[:k], held[:k], need[:k], known[:k], computed[:k])
                else:
                    tokens_at[where[:k]] = n[:k]
                    new_at[where[:k]] = need[:k]
                budget -= got_tokens
            if fit >= stop:
                break
            # The request at index `fit` needs more blocks than are free: preempt.
            if tokens_at is None or new_at is None:
                tokens_at = torch.zeros(length, dtype=I64, device=self.device)
                new_at = torch.zeros(length, dtype=I64, device=self.device)
                if first is not None:
                    tokens_at[:first[1].numel()] = first[1]
                    new_at[:first[3].numel()] = first[3]
            e_pos = int(where[fit])
            e_tokens, e_need = torch.stack((n[fit], need[fit])).tolist()
            if self._tail_victims:
                victims = self._tail_victims_for(order, e_pos, end,
                                                 e_need - self.gpu_free.count)
            else:
                if victim_order is None:
                    victim_order = self._priority_order(order)
                victims = self._priority_victims_for(order, victim_order, taken, e_pos,
                                                     e_need - self.gpu_free.count)
                taken += len(victims)
            returned = self._preempt(order, victims, tokens_at, new_at, step)
            budget += returned
            dead.extend(victims)
            if self._tail_victims:
                end -= len(victims)
            if victims[-1] == e_pos:  # the request gave itself up
                if self.knobs.continue_after_self_preemption:
                    pos = e_pos + 1  # on to the requests after it (vLLM 0.33)
                    continue
                break  # the pass stops (vLLM 0.32)
            e_slot = order[e_pos:e_pos + 1]
            self._allocate(e_slot, st[G_, e_slot], need[fit:fit + 1], e_need)
            if self._caching:
                self._cache_filled(e_slot, computed[fit:fit + 1] + e_tokens)
            tokens_at[e_pos] = e_tokens
            new_at[e_pos] = e_need
            budget -= e_tokens
            pos = e_pos + 1

        if tokens_at is None or new_at is None:
            # No victims: the scheduled set is a prefix of the running order.
            if first is not None:
                slots, n, held, need, known, computed = first
                keep = n > 0
                if not bool(keep.all()):
                    slots, n, held, need, known, computed = (
                        slots[keep], n[keep], held[keep], need[keep], known[keep],
                        computed[keep])
                step.add(slots, n, held, need, computed + n, known)
            return budget
        keep = torch.nonzero(tokens_at).flatten()
        s = order[keep]
        n, new = tokens_at[keep], new_at[keep]
        nc = st[N_:C_ + 1, s]
        step.add(s, n, st[G_, s] - new, new, nc[2] + n, nc[0])
        alive = torch.ones(length, dtype=torch.bool, device=self.device)
        alive[torch.tensor(dead, dtype=I64, device=self.device)] = False
        self.running = order[alive]
        return budget

    def _allocate(self, slots: Tensor, held: Tensor, need: Tensor, total: int) -> None:
        """Give each running slot need[i] more GPU blocks, from the free list's head."""
        if total == 0:
            return
        ids = self.gpu_free.take(total)
        self._claim(ids)
        self.gpu_table.write(self.state[GROW, slots], held, need, ids)
        self.state[G_, slots] = held + need

    def _tail_victims_for(self, order: Tensor, e_pos: int, end: int, gap: int) -> list[int]:
        """Positions end-1, end-2, ... until their blocks cover `gap`, or e_pos."""
        window = 8
        while True:
            low = max(e_pos, end - window)
            cand = torch.arange(end - 1, low - 1, -1, device=self.device)
            freed = torch.cumsum(self._freed_by(order[cand]), 0)
            i = int((freed < gap).sum())
            if i < cand.numel():
                return list(range(end - 1, end - 2 - i, -1))
            if low == e_pos:
                return list(range(end - 1, e_pos - 1, -1))
            window *= 4

    def _priority_order(self, order: Tensor) -> Tensor:
        st = self.state
        keys = st[PRIO:SEQ + 1, order]
        return lex_order([keys[0], keys[1], keys[2]], descending=True)

    def _priority_victims_for(self, order: Tensor, victim_order: Tensor, taken: int,
                              e_pos: int, gap: int) -> list[int]:
        """The next victims in descending (priority, arrival, seq) order until their
        blocks (this step's new ones included) cover `gap`, or e_pos itself."""
        window = 8
        total = victim_order.numel()
        while True:
            cand = victim_order[taken:taken + window]
            freed = torch.cumsum(self._freed_by(order[cand]), 0)
            i = int((freed < gap).sum())
            cand_list = cand.tolist()
            limit = i + 1 if i < len(cand_list) else len(cand_list)
            if e_pos in cand_list[:limit]:
                return cand_list[:cand_list.index(e_pos) + 1]
            if i < len(cand_list):
                return cand_list[:limit]
            if taken + window >= total:
                return cand_list  # cannot happen: e_pos is among the candidates
            window *= 4

    def _preempt(self, order: Tensor, victims: list[int], tokens_at: Tensor,
                 new_at: Tensor, step: _Step) -> int:
        """Take the victims (positions in `order`) off the GPU: swap when the mode (or
        auto's cost model) says so and the host has room, otherwise recompute. Returns
        the tokens given back to the budget."""
        cfg = self.config
        st = self.state
        pos = torch.tensor(victims, dtype=I64, device=self.device)
        slots = order[pos]
        g_all = st[G_, slots]
        numbers = torch.stack((g_all, st[C_, slots], tokens_at[pos])).T.tolist()
        free_host = self.cpu_free.count
        modes: list[str] = []
        returned = 0
        released = 0
        for held, c, tokens in numbers:
            # A victim taken back keeps this step's new blocks in its table until now:
            # they go (to the pool, or to the host) with the rest of it.
            returned += tokens
            released += held
            mode: str = cfg.preemption
            if mode == "auto":
                mode = "swap" if self.knobs.cost.prefers_swap(held, c) else "recompute"
            if mode == "swap" and held > free_host:
                mode = "recompute"  # no room on the host
            if mode == "swap":
                free_host -= held
            modes.append(mode)
        tokens_at[pos] = 0
        new_at[pos] = 0
        swap = torch.tensor([m == "swap" for m in modes], dtype=torch.bool, device=self.device)
        rows = st[GROW, slots]
        # Every victim's GPU blocks, this step's new ones included, in reverse table order.
        if self._caching:
            self._let_go(*self._walk(slots, g_all, released))
        else:
            self.gpu_free.put(self.gpu_table.read_reversed(rows, g_all, released))
        self.gpu_table.give_back(rows)
        slot_list = slots.tolist()
        if any(modes[i] == "swap" for i in range(len(modes))):
            ss = slots[swap]
            hs = g_all[swap]
            total = int(hs.sum())
            host_rows = self.cpu_table.lend(ss.numel())
            self.cpu_table.write(host_rows, torch.zeros_like(hs), hs,
                                 self.cpu_free.take(total))
            st[HROW, ss] = host_rows
            st[H_, ss] = hs
            st[STATUS, ss] = SWAPPED
        rc = slots[~swap]
        st[C_, rc] = 0
        st[STATUS, rc] = WAITING
        st[G_, slots] = 0
        st[GROW, slots] = -1
        st[CACHED, slots] = 0
        st[NPRE, slots] += 1
        for s, mode in zip(slot_list, modes, strict=True):
            step.preempted.append((s, mode))
            (step.swap_victims if mode == "swap" else step.recompute_victims).append(s)
        return returned

    # -- swap-in and waiting passes ---------------------------------------------------

    def _swap_in_pass(self, budget: int, threshold: int, step: _Step) -> int:
        cfg = self.config
        st = self.state
        running = self.running.numel()
        room = cfg.max_num_seqs - running
        if self.swapped.numel() == 0 or budget <= 0 or room <= 0:
            return budget
        cand = self.swapped[:room]
        nch = st[N_:H_ + 1, cand]
        known, computed, host = nch[0], nch[2], nch[4]
        rest = known - computed
        want = rest.clamp_max(threshold) if threshold > 0 else rest
        left = budget - (torch.cumsum(want, 0) - want)
        n = torch.minimum(want, left)
        covered = torch.maximum((computed + n).clamp_min(0), self._reserve(known, nch[1]))
        extra = (cdiv(covered, cfg.block_size) - host).clamp_min(0)
        take = host + extra
        free_before = self.gpu_free.count - (torch.cumsum(take, 0) - take)
        watermark = torch.full_like(take, cfg.watermark_blocks)
        if running == 0 and not self._always_watermark:
            watermark[0] = 0
        ok = (left > 0) & (take + watermark <= free_before)
        if not cfg.chunked_prefill:
            ok &= n >= rest
        k = int(leading_true(ok))
        if k == 0:
            return budget
        slots, n, take = cand[:k], n[:k], take[:k]
        host, known, computed = host[:k], known[:k], computed[:k]
        tokens, blocks, host_total = torch.stack((n.sum(), take.sum(), host.sum())).tolist()
        host_rows = st[HROW, slots]
        self.cpu_free.put(self.cpu_table.read(host_rows, torch.zeros_like(host), host,
                                              host_total))
        self.cpu_table.give_back(host_rows)
        rows = self.gpu_table.lend(k)
        ids = self.gpu_free.take(blocks)
        self._claim(ids)
        self.gpu_table.write(rows, torch.zeros_like(take), take, ids)
        st[GROW, slots] = rows
        st[G_, slots] = take
        st[H_, slots] = 0
        st[HROW, slots] = -1
        st[STATUS, slots] = RUNNING
        if self._caching:
            self._cache_filled(slots, computed + n)  # its table is all new: cached again
        self.running = torch.cat((self.running, slots))
        self.swapped = self.swapped[k:]
        step.swapped_in.append(slots)
        step.add(slots, n, torch.zeros_like(take), take, computed + n, known)
        return budget - int(tokens)

    def _waiting_pass(self, budget: int, threshold: int, step: _Step) -> None:
        cfg = self.config
        st = self.state
        running = self.running.numel()
        window = 64
        free = self.gpu_free.count
        while budget > 0 and running < cfg.max_num_seqs:
            asked = min(window, cfg.max_num_seqs - running, budget)
            peek = self.waiting.peek(asked, st[STATUS], st[SEQ], WAITING)
            cand = peek.slots
            m = cand.numel()
            if m == 0:
                break
            # Waiting requests have C = 0 and hold no blocks.
            known, limit = st[N_:LIMIT + 1, cand]
            want = known.clamp_max(threshold) if threshold > 0 else known
            left = budget - (torch.cumsum(want, 0) - want)
            n = torch.minimum(want, left)
            ok = left > 0
            if not cfg.chunked_prefill:
                ok &= want <= left
            blocks = cdiv(torch.maximum(n.clamp_min(0), self._reserve(known, limit)),
                          cfg.block_size)
            free_before = free - (torch.cumsum(blocks, 0) - blocks)
            watermark = torch.full_like(blocks, cfg.watermark_blocks)
            if running == 0 and not self._always_watermark:
                watermark[0] = 0
            if self.knobs.reserve_full_sequence:
                full = cdiv(known.clamp_max(cfg.max_model_len), cfg.block_size)
                ok &= full + watermark <= free_before
            ok &= blocks + watermark <= free_before
            a = int(leading_true(ok))
            if a:
                slots, n, blocks = cand[:a], n[:a], blocks[:a]
                tokens, total = torch.stack((n.sum(), blocks.sum())).tolist()
                rows = self.gpu_table.lend(a)
                zero = torch.zeros_like(blocks)
                self.gpu_table.write(rows, zero, blocks, self.gpu_free.take(total))
                st[GROW, slots] = rows
                st[G_, slots] = blocks
                st[STATUS, slots] = RUNNING
                self.running = torch.cat((self.running, slots))
                step.add(slots, n, zero, blocks, n, known[:a])
                budget -= tokens
                free -= total
                running += a
            self.waiting.pop(peek, a)
            if a < m or m < asked:
                break
            window *= 2

    def _reserve(self, known: Tensor, limit: Tensor) -> Tensor:
        """R per request, the tokens its admission or swap-in covers whatever its chunk
        (the spec's allocation_reserve): none (lazy), N (prompt), LIMIT (full)."""
        allocation = self.config.allocation
        if allocation == "prompt":
            return known
        if allocation == "full":
            return limit
        return torch.zeros_like(known)

    def _waiting_pass_cached(self, budget: int, threshold: int, step: _Step) -> None:
        """The waiting pass with prefix caching: one admission at a time, since each may
        hit blocks the ones before it cached, or take (and so evict) blocks it would hit.
        A request's hit is the longest run of cached blocks holding its first
        floor((N - 1) / block_size) content keys; it costs Db + E free blocks, E being
        the hit blocks no table holds (they leave the free list)."""
        cfg = self.config
        st = self.state
        bs = cfg.block_size
        dev = self.device
        running = self.running.numel()
        admitted: list[int] = []
        window = 8
        while budget > 0 and running < cfg.max_num_seqs:
            asked = min(window, cfg.max_num_seqs - running, budget)
            peek = self.waiting.peek(asked, st[STATUS], st[SEQ], WAITING)
            cand = peek.slots.tolist()
            if not cand:
                break
            a = 0
            for slot, known in zip(cand, st[N_, peek.slots].tolist(), strict=True):
                if budget <= 0 or running >= cfg.max_num_seqs:
                    break
                hits = self._lookup(slot, (known - 1) // bs)
                h = len(hits)
                hit_ids = torch.tensor(hits, dtype=I64, device=dev)
                unheld = hit_ids[self._holders[hit_ids] == 0] if h else hit_ids
                taken = unheld.numel()  # E: free cached blocks the hit takes
                computed = h * bs
                n = known - computed
                if 0 < threshold < n:
                    n = threshold
                if not cfg.chunked_prefill and n > budget:
                    break
                n = min(n, budget)
                watermark = (cfg.watermark_blocks if running or self._always_watermark
                             else 0)
                free = self.gpu_free.count
                if self.knobs.reserve_full_sequence:
                    full = min(known, cfg.max_model_len)
                    if max(0, -(-full // bs) - h) + watermark + taken > free:
                        break
                reserve = {"lazy": 0, "prompt": known,
                           "full": int(st[LIMIT, slot])}[cfg.allocation]
                need = max(0, -(-max(computed + n, reserve) // bs) - h)
                if need + watermark + taken > free:
                    break
                a += 1
                row = self.gpu_table.lend(1)
                one = torch.tensor([slot], dtype=I64, device=dev)
                if h:
                    self.gpu_free.remove(unheld)
                    self._holders[hit_ids] += 1
                    self.gpu_table.write(row, self._zero1, one.new_tensor([h]), hit_ids)
                    step.prefix_hits.append((slot, hits))
                ids = self.gpu_free.take(need)
                self._claim(ids)
                counts = one.new_tensor([need])
                start = one.new_tensor([h])
                self.gpu_table.write(row, start, counts, ids)
                st[GROW, slot] = row[0]
                st[G_, slot] = h + need
                st[CACHED, slot] = h
                st[STATUS, slot] = RUNNING
                after = one.new_tensor([computed + n])
                self._cache_filled(one, after)
                step.add(one, one.new_tensor([n]), start, counts, after,
                         one.new_tensor([known]))
                admitted.append(slot)
                budget -= n
                running += 1
            self.waiting.pop(peek, a)
            if a < len(cand) or len(cand) < asked:
                break
            window *= 2
        if admitted:
            self.running = torch.cat((self.running, torch.tensor(admitted, dtype=I64,
                                                                 device=dev)))

    # -- prefix caching ---------------------------------------------------------------

    def _key(self, slot: int, index: int) -> str:
        """The content key of block `index` of the request in `slot`."""
        rid = str(self._ids[slot])
        return self._keys.key(rid, self._prefix_of.get(rid, ()), index)

    def _lookup(self, slot: int, most: int) -> list[int]:
        """The longest run of cached blocks holding the first `most` content keys of the
        request in `slot`: for each key the block cached under it first."""
        out: list[int] = []
        if not self._by_key:
            return out
        for i in range(most):
            blocks = self._by_key.get(self._key(slot, i))
            if not blocks:
                break
            out.append(next(iter(blocks)))
        return out

    def _claim(self, ids: Tensor) -> None:
        """With prefix caching: blocks just taken from the free list get one holder and
        drop the content they had cached."""
        if not self._caching or ids.numel() == 0:
            return
        self._holders[ids] = 1
        had = self._has_content[ids]
        if not bool(had.any()):
            return
        for b in ids[had].tolist():
            key = self._content.pop(b)
            blocks = self._by_key[key]
            del blocks[b]
            if not blocks:
                del self._by_key[key]
        self._has_content[ids] = False

    def _cache_filled(self, slots: Tensor, tokens: Tensor) -> None:
        """Cache the blocks of each slot's table that its first tokens[i] scheduled
        tokens fill and that are not cached yet, each under its content key, slot after
        slot in batch order and in table order within a slot."""
        st = self.state
        full = torch.div(tokens, self.config.block_size, rounding_mode="floor")
        upto = st[CACHED, slots]
        counts = (torch.minimum(full, st[G_, slots]) - upto).clamp_min(0)
        st[CACHED, slots] = torch.maximum(full, upto)
        total = int(counts.sum())
        if total == 0:
            return
        run, col = spans(upto, counts, total)
        ids = self.gpu_table.table[st[GROW, slots][run], col]
        fresh = ~self._has_content[ids]
        content, by_key, key = self._content, self._by_key, self._key
        for slot, index, b, new in zip(slots[run].tolist(), col.tolist(), ids.tolist(),
                                       fresh.tolist(), strict=True):
            if new:
                k = key(slot, index)
                content[b] = k
                by_key.setdefault(k, {})[b] = None
        self._has_content[ids] = True

    def _walk(self, slots: Tensor, held: Tensor, total: int) -> tuple[Tensor, Tensor, Tensor]:
        """The slots' GPU tables, each walked from its end, slot after slot, as if they
        were released in that order: (blocks, slot index, freed), where freed marks the
        position at which a block loses its last holder."""
        dev = self.device
        walk = self.gpu_table.read_reversed(self.state[GROW, slots], held, total)
        owner = torch.repeat_interleave(torch.arange(slots.numel(), device=dev), held,
                                        output_size=total)
        # A block's k-th appearance in the walk (k from 1) frees it when k = its holders.
        order = torch.argsort(walk, stable=True)
        ranked = walk[order]
        at = torch.arange(total, device=dev)
        starts = torch.ones(total, dtype=torch.bool, device=dev)
        starts[1:] = ranked[1:] != ranked[:-1]
        group = torch.cummax(torch.where(starts, at, 0), 0).values
        rank = torch.empty_like(walk)
        rank[order] = at - group
        freed = rank + 1 == self._holders[walk]
        return walk, owner, freed

    def _let_go(self, walk: Tensor, owner: Tensor, freed: Tensor) -> None:
        """Release a `_walk`: holders drop; the blocks freed without content go to the
        head of the free list (the last table's first, each table in walk order), the
        cached ones to the tail in walk order, so that cached content is evicted last."""
        self._holders.index_add_(0, walk, torch.full_like(walk, -1))
        cached = self._has_content[walk]
        plain = freed & ~cached
        self.gpu_free.put(walk[freed & cached])
        if bool(plain.any()):
            ids = walk[plain]
            later_first = torch.argsort(owner[plain], descending=True, stable=True)
            self.gpu_free.put_front(ids[later_first])

    def _freed_by(self, slots: Tensor) -> Tensor:
        """The GPU blocks each slot would free if the slots were released in order."""
        held = self.state[G_, slots]
        if not self._caching:
            return held
        total = int(held.sum())
        out = torch.zeros_like(held)
        if total:
            _, owner, freed = self._walk(slots, held, total)
            out.index_add_(0, owner, freed.to(I64))
        return out

    def _requeue_victims(self, step: _Step) -> None:
        """Victims queue up only now, so none is admitted again in the step that took it."""
        st = self.state
        if step.recompute_victims:
            slots = torch.tensor(step.recompute_victims, dtype=I64, device=self.device)
            keys = st[PRIO:SEQ + 1, slots]
            self.waiting.push_victims(slots, keys[2], keys[0].tolist(), keys[1])
        if step.swap_victims:
            slots = torch.tensor(step.swap_victims, dtype=I64, device=self.device)
            swapped = torch.cat((self.swapped, slots))
            keys = st[PRIO:SEQ + 1, swapped]
            if self._priority:
                self.swapped = swapped[lex_order([keys[0], keys[1], keys[2]], False)]
            else:
                self.swapped = swapped[torch.argsort(keys[2])]

    # -- after the forward pass -------------------------------------------------------

    def update(self, stopped: Collection[str]) -> tuple[str, ...]:
        slot_of = self._slot_of
        chosen = [slot_of[r] for r in stopped if r in slot_of]
        finished = self.update_tensors(
            torch.tensor(chosen, dtype=I64, device=self.device) if chosen else None)
        if finished.numel() == 0:
            return ()
        return tuple(self.forget(finished))

    def update_tensors(self, stopped: Tensor | None = None) -> Tensor:
        """Sample one token for each request the last step caught up; finish those that
        stopped (the slots in `stopped`), reached max_tokens or max_model_len. Returns the
        finished slots in batch order; their ids stay readable until `forget`."""
        sampled = self._sampled
        self._sampled = self._empty
        if sampled.numel() == 0:
            return sampled
        st = self.state
        nl = st[N_:LIMIT + 1, sampled]
        known = nl[0] + 1
        st[N_, sampled] = known
        done = known >= nl[1]  # N reached P + max_tokens or max_model_len
        marks = self._marks  # all False between calls
        if stopped is not None and stopped.numel():
            marks[stopped] = True
            done |= marks[sampled]
            marks[stopped] = False
        finished = sampled[done]
        if finished.numel() == 0:
            return finished
        self._release_blocks(finished)
        st[STATUS, finished] = FREE
        marks[finished] = True
        self.running = self.running[~marks[self.running]]
        marks[finished] = False
        return finished

    def forget(self, slots: Tensor) -> list[str]:
        """The ids of slots `update_tensors` finished; frees the slots for reuse."""
        out = self._forget(slots.tolist())
        if self._keys:
            for rid in out:
                self._keys.forget(rid)
        return out
