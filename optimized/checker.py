"""A vectorized trace checker with the spec checker's verdicts, for very large traces.

NOTE on the method. The spec's checker (kvsched.spec.checker) replays a trace one step
and one request at a time in Python. This one reads the trace in runs of steps and
checks a whole run at once with numpy: the scheduled entries of the run are grouped by
request, and the spec's bookkeeping becomes prefix sums within each request (computed
tokens, known tokens, sampled tokens, blocks held) and across steps (tokens and new
blocks per step, free blocks, running requests), against which every MUST and SHOULD
invariant is one vectorized comparison. Block ids are checked by sorting the handed-out
ids by (block, step): each must have been free when given.

Reading. Step lines are read by a compiled scanner (kvsched.optimized.scan) straight
into numpy columns, ids as keys (an id of at most 16 plain ASCII bytes is its own key,
found in an open-addressing table of the known ids). Lines it leaves alone (aborts,
rejections, preemptions and swap-ins, unknown keys, escapes, long ids, anything odd)
are read with orjson and checked field by field here, or handed to the spec's parser.
The cyclic garbage collector pauses while a trace is checked.

A run holds at most one step with aborts, rejections, preemptions or swap-ins, its
first, whose few events are applied one by one (as the spec does) before the rest is
vectorized. A run that breaks any invariant (or holds anything unusual: malformed input,
unknown ids) is checked again, from the same state, by the spec's own Checker, which
then reports exactly what it would have reported: same counts, same first violations,
same errors. So the verdicts agree by construction wherever a violation is possible, and
the fast path only has to be right on runs that it finds clean, which the
differential tests (tests/test_checkers_agree.py) check on correct and seeded-bug traces.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import orjson

from kvsched.optimized import scan as sc
from kvsched.spec import should
from kvsched.spec.blocks import blocks_needed, never_completes
from kvsched.spec.checker import Checker, Report, Tracked
from kvsched.spec.model import MAX_COUNT, VICTIM_MODES, Config, Request, Status
from kvsched.spec.trace import (
    STEP_KEYS,
    TraceError,
    parse_arrival,
    parse_header,
    parse_step,
)

I64 = np.int64
U64 = np.uint64
WAITING, RUNNING, SWAPPED, FINISHED, ABORTED, REJECTED = range(6)
STATUS_OF = [Status.WAITING, Status.RUNNING, Status.SWAPPED, Status.FINISHED, Status.ABORTED,
             Status.REJECTED]
CODE_OF = {s: i for i, s in enumerate(STATUS_OF)}
RARE_KEYS = frozenset({"aborted", "rejected", "preempted", "swapped_in"})
MISSING: Any = object()
NOTHING: list[Any] = []
RUN_STEPS = 2048  # most steps in one run
RUN_ENTRIES = 1 << 20  # most scheduled entries in one run
READ_BYTES = 1 << 24
SCAN_LINES, SCAN_ENTRIES = 1 << 14, 1 << 20  # the scanner's output buffers

Loads = Callable[[bytes], Any]


class _Unusual(Exception):
    """The fast path met something it leaves to the spec's checker."""


def _ids_ok(v: Any) -> bool:
    return type(v) is list and all(type(x) is str and x for x in v)


@dataclass(slots=True)
class FastStep:
    """One step line read with orjson, validated without building the spec's records."""

    line: int
    raw: bytes
    step: int
    arrivals: list[Request]
    scheduled: list[Any]
    finished: list[str]
    free_blocks: int | None
    new_blocks: dict[str, Any] | None
    unknown_keys: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    preempted: list[tuple[str, str]] = field(default_factory=list)
    swapped_in: list[str] = field(default_factory=list)

    @property
    def rare(self) -> bool:
        return bool(self.aborted or self.rejected or self.preempted or self.swapped_in)

    @property
    def idle(self) -> bool:
        return not self.scheduled and not self.preempted and not self.swapped_in


def _pairs_ok(v: Any) -> bool:
    """A scheduled list as parse_step accepts it: [id, count] pairs."""
    return type(v) is list and all(
        type(p) is list and len(p) == 2 and type(p[0]) is str and p[0]
        and type(p[1]) is int and abs(p[1]) <= MAX_COUNT for p in v)


def _block_map_ok(v: Any) -> bool:
    """new_blocks as parse_step accepts it: lists of integers in 0..2**40."""
    return type(v) is dict and all(
        type(ids) is list and all(type(b) is int and 0 <= b <= MAX_COUNT for b in ids)
        for ids in v.values())


def parse_fast(obj: Any, line: int, expected: int, raw: bytes) -> FastStep | None:
    """The step, if the line is one parse_step accepts and numbered `expected`; None when
    the spec's own parser should look at it (it may raise the error)."""
    if type(obj) is not dict:
        return None
    step = obj.get("step")
    if type(step) is not int or step != expected or "prefix_hits" in obj:
        return None
    arrivals: list[Request] = []
    given = obj.get("arrivals", NOTHING)
    if given:
        if type(given) is not list:
            return None
        try:
            arrivals = [parse_arrival(a, step, line) for a in given]
        except TraceError:
            return None
    scheduled = obj.get("scheduled", NOTHING)
    if not _pairs_ok(scheduled):
        return None
    finished = obj.get("finished", NOTHING)
    if not _ids_ok(finished):
        return None
    free_blocks = obj.get("free_blocks")
    if free_blocks is not None and (type(free_blocks) is not int or free_blocks < 0
                                    or free_blocks > MAX_COUNT):
        return None
    new_blocks = obj.get("new_blocks", MISSING)
    if new_blocks is MISSING:
        new_blocks = None
    elif not _block_map_ok(new_blocks):
        return None
    time_ms = obj.get("time_ms")
    if time_ms is not None and (type(time_ms) not in (int, float) or time_ms < 0):
        return None
    st = FastStep(line, raw, step, arrivals, scheduled, finished, free_blocks, new_blocks)
    if not STEP_KEYS.issuperset(obj):
        st.unknown_keys = [k for k in obj if k not in STEP_KEYS]
    if RARE_KEYS.isdisjoint(obj):
        return st
    aborted = obj.get("aborted", NOTHING)
    swapped_in = obj.get("swapped_in", NOTHING)
    rejected = obj.get("rejected", NOTHING)
    preempted = obj.get("preempted", NOTHING)
    if not (_ids_ok(aborted) and _ids_ok(swapped_in) and type(rejected) is list
            and type(preempted) is list):
        return None
    for r in rejected:
        if type(r) is not dict or type(r.get("id")) is not str or not r["id"]:
            return None
    for p in preempted:
        if (type(p) is not dict or type(p.get("id")) is not str or not p["id"]
                or p.get("mode") not in VICTIM_MODES):
            return None
    st.aborted = aborted
    st.swapped_in = swapped_in
    st.rejected = [r["id"] for r in rejected]
    st.preempted = [(p["id"], p["mode"]) for p in preempted]
    return st


# -- ids as keys ----------------------------------------------------------------------

K1, K2 = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F


def id_key(rid: str) -> tuple[int, int] | None:
    """The id's bytes as two 64-bit words (exact, no hashing), for ids of at most 16
    printable ASCII characters that JSON writes without escapes; None for others. The
    scanner (kvsched.optimized.scan) makes the same key from the id's bytes."""
    if len(rid) > 16 or not rid.isascii() or '"' in rid or "\\" in rid:
        return None
    raw = rid.encode("ascii")
    if min(raw) < 32:
        return None
    return int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:16], "little")


class IdTable:
    """Open addressing (linear probing) from id keys (id_key) to request indices; keys
    are added in batches and looked up by the compiled `scan.lookup`."""

    def __init__(self) -> None:
        self.bits = 12
        self.lo = np.zeros(1 << self.bits, dtype=U64)
        self.hi = np.zeros(1 << self.bits, dtype=U64)
        self.ri = np.full(1 << self.bits, -1, dtype=I64)
        self.count = 0
        self.pending: list[tuple[int, int, int]] = []  # (lo, hi, ri) not yet in the table
        self.pending_arrays: list[np.ndarray] = []  # rows (lo, hi, ri), likewise
        self.filled: list[np.ndarray] = []  # slots filled since `mark`

    def add(self, rid: str, ri: int) -> None:
        key = id_key(rid)
        if key is not None:
            self.pending.append((key[0], key[1], ri))

    def add_keys(self, keys: np.ndarray, first: int) -> None:
        """Keys (rows lo, hi as int64, from the scanner) for indices first, first + 1..."""
        rows = np.empty((keys.shape[0], 3), dtype=U64)
        rows[:, :2] = keys[:, :2].view(U64) if keys.flags.c_contiguous else keys[:, :2]
        rows[:, 2] = np.arange(first, first + keys.shape[0], dtype=U64)
        self.pending_arrays.append(rows)

    def _home(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        out: np.ndarray = ((lo * U64(K1)) ^ (hi * U64(K2))) >> U64(64 - self.bits)
        return out

    def _flush(self) -> None:
        if not self.pending and not self.pending_arrays:
            return
        parts = self.pending_arrays
        if self.pending:
            parts = [*parts, np.array(self.pending, dtype=U64).reshape(-1, 3)]
        keys = np.concatenate(parts) if len(parts) > 1 else parts[0]
        self.pending = []
        self.pending_arrays = []
        lo, hi, ri = keys[:, 0], keys[:, 1], keys[:, 2].astype(I64)
        if 2 * (self.count + ri.size) > self.ri.size:
            used = self.ri >= 0
            lo = np.concatenate((self.lo[used], lo))
            hi = np.concatenate((self.hi[used], hi))
            ri = np.concatenate((self.ri[used], ri))
            while 2 * ri.size > (1 << self.bits):
                self.bits += 1
            self.lo = np.zeros(1 << self.bits, dtype=U64)
            self.hi = np.zeros(1 << self.bits, dtype=U64)
            self.ri = np.full(1 << self.bits, -1, dtype=I64)
            self.count = 0
            self.filled = []
        mask = U64(self.ri.size - 1)
        home = self._home(lo, hi)
        left = np.arange(ri.size)
        probe = 0
        while left.size:
            at = ((home[left] + U64(probe)) & mask).astype(I64)
            empty = self.ri[at] < 0
            slots, first = np.unique(at[empty], return_index=True)
            won = left[empty][first]
            self.lo[slots], self.hi[slots], self.ri[slots] = lo[won], hi[won], ri[won]
            self.filled.append(slots)
            self.count += won.size
            placed = np.zeros(ri.size, dtype=bool)
            placed[won] = True
            left = left[~placed[left]]
            probe += 1

    def mark(self) -> tuple[int, int]:
        self._flush()
        self.filled = []
        return self.count, self.bits

    def rollback(self, mark: tuple[int, int]) -> bool:
        """Undo the additions since `mark` (False if the table grew meanwhile)."""
        self.pending = []
        self.pending_arrays = []
        if mark[1] != self.bits:
            return False
        for slots in self.filled:
            self.lo[slots], self.hi[slots], self.ri[slots] = 0, 0, -1
        self.filled = []
        self.count = mark[0]
        return True

    def find(self, keys: np.ndarray) -> np.ndarray:
        """The request index of each key (rows lo, hi as int64), -1 where unknown."""
        self._flush()
        out = np.empty(keys.shape[0], dtype=I64)
        sc.lookup(keys[:, 0], keys[:, 1], self.lo, self.hi, self.ri, self.bits, out)
        return out


def exact_object(raw: bytes, line: int, loads: Loads) -> Any:
    """The JSON object of one line exactly as the spec's TraceReader reads it, None for a
    blank line; raises its TraceError."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(line, f"not UTF-8 (byte {e.start})") from None
    if not text.strip():
        return None
    try:
        return loads(raw)
    except ValueError:
        if not raw.endswith(b"\n"):
            raise TraceError(line, "truncated: the last line is incomplete JSON") from None
        raise TraceError(line, "malformed JSON: expected one JSON object per line") from None


# -- runs of steps as columns ---------------------------------------------------------

Ids = np.ndarray | list[str]  # keys (rows lo, hi) from the scanner, or the ids themselves
EMPTY = np.zeros(0, dtype=I64)


@dataclass
class Part:
    """Consecutive step lines as columns: per step, then per arrival, scheduled entry,
    finish, new_blocks owner and block id. Ids are keys or strings (see Ids)."""

    steps: np.ndarray
    free: np.ndarray  # free_blocks, -1 where not reported
    has_blocks: np.ndarray  # whether the line has new_blocks (1 or 0)
    n_arr: np.ndarray
    n_ent: np.ndarray
    n_fin: np.ndarray
    n_own: np.ndarray
    arr_ids: list[str]
    arr_keys: np.ndarray | None  # the same ids as keys, when the scanner read them
    arr_num: np.ndarray  # rows (prompt_len, max_tokens, priority)
    ent_ids: Ids
    ent_n: np.ndarray
    fin_ids: Ids
    own_ids: Ids
    own_sizes: np.ndarray
    blocks: np.ndarray
    raws: Callable[[], list[tuple[int, bytes]]]  # (line number, bytes) of each line
    head: FastStep | None = None  # a line with aborts, rejections, preemptions, swap-ins


def part_of_step(st: FastStep) -> Part:
    nb = st.new_blocks or {}
    one = np.ones(1, dtype=I64)
    keys = [id_key(r.id) for r in st.arrivals]
    arr_keys = None if None in keys else np.array(keys, dtype=I64).reshape(-1, 2)

    def count(n: int) -> np.ndarray:
        return one * n

    return Part(
        one * st.step, count(-1 if st.free_blocks is None else st.free_blocks),
        count(int(st.new_blocks is not None)), count(len(st.arrivals)),
        count(len(st.scheduled)), count(len(st.finished)), count(len(nb)),
        [r.id for r in st.arrivals], arr_keys,
        np.array([(r.prompt_len, r.max_tokens, r.priority) for r in st.arrivals],
                 dtype=I64).reshape(-1, 3),
        [p[0] for p in st.scheduled], np.array([p[1] for p in st.scheduled], dtype=I64),
        st.finished, list(nb), np.array([len(v) for v in nb.values()], dtype=I64),
        np.array([b for v in nb.values() for b in v], dtype=I64),
        lambda: [(st.line, st.raw)], st if st.rare else None)


class ScannedLines:
    """The lines of one `scan` call, for slicing into parts."""

    def __init__(self, block: sc.Block, got: sc.Scanned) -> None:
        self.block = block
        self.got = got
        rows = got.lines
        self.rows = rows
        self.ok = rows[:, sc.L_OK].astype(bool)

        def offsets(col: int) -> np.ndarray:
            out = np.zeros(rows.shape[0] + 1, dtype=I64)
            np.cumsum(rows[:, col], out=out[1:])
            return out

        self.arr_at = offsets(sc.L_ARR)
        self.ent_at = offsets(sc.L_ENT)
        self.fin_at = offsets(sc.L_FIN)
        self.own_at = offsets(sc.L_OWN)
        self.block_at = np.zeros(got.own.shape[0] + 1, dtype=I64)
        np.cumsum(got.own[:, 2], out=self.block_at[1:])

    def raw(self, k: int) -> bytes:
        row = self.rows[k]
        return bytes(self.block.data[row[sc.L_START]:row[sc.L_END] + 1])

    def part(self, k: int, j: int, first_line: int) -> Part:
        """Lines k..j-1 (all read by the scanner); line k is numbered first_line."""
        g, rows = self.got, self.rows[k:j]
        a0, a1 = self.arr_at[k], self.arr_at[j]
        o0, o1 = self.own_at[k], self.own_at[j]
        arr = g.arr[a0:a1]
        data = self.block.data
        names = [data[s:e].decode("ascii") for s, e in zip(arr[:, 2].tolist(),
                                                           arr[:, 3].tolist(), strict=True)]
        return Part(
            rows[:, sc.L_STEP], rows[:, sc.L_FREE], rows[:, sc.L_BLOCKS], rows[:, sc.L_ARR],
            rows[:, sc.L_ENT], rows[:, sc.L_FIN], rows[:, sc.L_OWN], names, arr[:, :2], arr[:, 4:7],
            g.ent[self.ent_at[k]:self.ent_at[j], :2], g.ent[self.ent_at[k]:self.ent_at[j], 2],
            g.fin[self.fin_at[k]:self.fin_at[j]], g.own[o0:o1, :2], g.own[o0:o1, 2],
            g.blocks[self.block_at[o0]:self.block_at[o1]],
            lambda: [(first_line + x, self.raw(k + x)) for x in range(j - k)])


@dataclass
class Run:
    """A run's parts, with their per-step and numeric columns joined."""

    parts: list[Part]

    def __post_init__(self) -> None:
        p = self.parts

        def join(name: str) -> np.ndarray:
            cols = [getattr(x, name) for x in p]
            return cols[0] if len(cols) == 1 else np.concatenate(cols)

        self.head = p[0].head
        self.steps, self.free = join("steps"), join("free")
        self.has_blocks = join("has_blocks")
        self.n_arr, self.n_ent = join("n_arr"), join("n_ent")
        self.n_fin, self.n_own = join("n_fin"), join("n_own")
        self.arr_num, self.ent_n = join("arr_num"), join("ent_n")
        self.own_sizes, self.blocks = join("own_sizes"), join("blocks")
        self.T = int(self.steps.size)
        self.arr_ids = p[0].arr_ids if len(p) == 1 else [r for x in p for r in x.arr_ids]

    def raws(self) -> list[tuple[int, bytes]]:
        return [r for x in self.parts for r in x.raws()]


def _segments(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For a sorted key array: whether each element starts a group, and the index of its
    group's first element."""
    starts = np.empty(keys.size, dtype=bool)
    first = np.empty(keys.size, dtype=I64)
    sc.segments(keys, starts, first)
    return starts, first


def _per_step(values: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Sums of values (in step order) per step; ends[s] is where step s's entries end."""
    total = np.zeros(values.size + 1, dtype=I64)
    np.cumsum(values, out=total[1:])
    sums: np.ndarray = np.diff(total[ends], prepend=0)
    return sums


def _group(values: np.ndarray) -> np.ndarray:
    """A stable order of non-negative integers (radix-sorted when they span fewer than
    65,536 values, as a run's request indices and block ids nearly always do)."""
    if values.size == 0:
        return EMPTY
    low = values.min()
    if values.max() - low < 1 << 16:
        return np.argsort((values - low).astype(np.uint16), kind="stable")
    return np.argsort(values, kind="stable")


class VectorizedChecker:
    """Checks a trace as `kvsched.spec.checker.Checker` does, a run of steps at a time.

    The spec's Checker `exact` keeps the report and the set of ended ids; the live
    requests are numpy columns here, and are handed to `exact` (and back) around the
    runs it checks itself.
    """

    def __init__(self, config: Config, max_preemptions: int = should.DEFAULT_MAX_PREEMPTIONS,
                 keep: int = 20) -> None:
        self.config = config
        self.exact = Checker(config, max_preemptions, keep)
        self.max_preemptions = max_preemptions
        self.report = self.exact.report
        self.ended = self.exact.ended
        self.ids: list[str] = []
        self.index: dict[str, int] = {}
        self.table = IdTable()
        self.loads: Loads = orjson.loads
        self.capacity = 0
        self.cols: dict[str, np.ndarray] = {}
        self._grow(1024)
        nb = config.num_gpu_blocks
        self.holder = np.full(nb, -1, dtype=I64)
        self.holder_gen = np.zeros(nb, dtype=I64)
        self.free = config.num_gpu_blocks
        self.free_host = config.num_cpu_blocks
        self.running = 0
        self.leaked = 0
        self.track_ids: bool | None = None
        self.step_no = -1
        self.live = 0  # live requests
        self.fast_runs = 0
        self.exact_runs = 0
        # What the trace carries (for reports of what was checked): step 0's new_blocks,
        # and whether any step reports free_blocks.
        self.first_step_blocks = False
        self.any_free_blocks = False

    def saw(self, step: int, new_blocks: object, free_blocks: object) -> None:
        if step == 0:
            self.first_step_blocks = new_blocks is not None
        self.any_free_blocks |= free_blocks is not None

    # -- columns --------------------------------------------------------------------

    NAMES = ("P", "O", "PRIO", "ARR", "N", "C", "G", "H", "PRE", "GEN", "STATUS", "RECOMP",
             "LIMIT")

    def _grow(self, at_least: int) -> None:
        new = max(at_least, 2 * self.capacity, 1024)
        for name in self.NAMES:
            col = np.zeros(new, dtype=I64)
            if name in self.cols:
                col[:self.capacity] = self.cols[name][:self.capacity]
            self.cols[name] = col
        self.capacity = new

    def _register(self, requests: list[Request]) -> int:
        """Give the requests the next indices (in order); returns the first."""
        numbers = np.array([(r.prompt_len, r.max_tokens, r.priority) for r in requests],
                           dtype=I64).reshape(-1, 3)
        arrival = np.array([r.arrival_step for r in requests], dtype=I64)
        return self._register_columns([r.id for r in requests], None, numbers, arrival)

    def _register_columns(self, names: list[str], keys: np.ndarray | None,
                          numbers: np.ndarray, arrival: np.ndarray) -> int:
        """Requests as columns: ids (and their keys, if known), rows of (prompt_len,
        max_tokens, priority), arrival steps. Returns the first new index."""
        first = len(self.ids)
        if not names:
            return first
        end = first + len(names)
        if end > self.capacity:
            self._grow(end)
        self.ids.extend(names)
        self.index.update(zip(names, range(first, end), strict=True))
        if keys is not None:
            self.table.add_keys(keys, first)
        else:
            for k, rid in enumerate(names, first):
                self.table.add(rid, k)
        c = self.cols
        at = slice(first, end)
        c["P"][at], c["O"][at], c["PRIO"][at] = numbers.T
        c["LIMIT"][at] = np.minimum(numbers[:, 0] + numbers[:, 1], self.config.max_model_len)
        c["ARR"][at] = arrival
        c["N"][at] = numbers[:, 0]
        for name in ("C", "G", "H", "PRE", "RECOMP"):
            c[name][at] = 0
        c["STATUS"][at] = WAITING
        return first

    def _resolve(self, ids: Ids) -> np.ndarray:
        """Request indices of ids (keys or strings), -1 for ids not known."""
        if isinstance(ids, np.ndarray):
            return self.table.find(ids) if ids.shape[0] else EMPTY
        get = self.index.get
        return np.fromiter((get(r, -1) for r in ids), dtype=I64, count=len(ids))

    def _resolve_all(self, run: Run, name: str) -> np.ndarray:
        got = [self._resolve(getattr(x, name)) for x in run.parts]
        return got[0] if len(got) == 1 else np.concatenate(got)

    # -- handing the state to the spec's checker and back ---------------------------

    def _live_indices(self) -> np.ndarray:
        n = len(self.ids)
        return np.flatnonzero(self.cols["STATUS"][:n] <= SWAPPED)

    def _to_exact(self) -> None:
        ex = self.exact
        c = self.cols
        live: dict[str, Tracked] = {}
        owned: dict[int, list[int]] = {}
        ex.owner = {}
        if self.track_ids:
            holder = self.holder
            ok = holder >= 0
            blocks = np.flatnonzero(ok)
            owners = holder[blocks]
            current = self.holder_gen[blocks] == c["GEN"][owners]
            for b, ri in zip(blocks[current].tolist(), owners[current].tolist(), strict=True):
                ex.owner[b] = self.ids[ri]
                owned.setdefault(ri, []).append(b)
        for ri in self._live_indices().tolist():
            rid = self.ids[ri]
            live[rid] = Tracked(
                Request(rid, int(c["P"][ri]), int(c["O"][ri]), int(c["PRIO"][ri]),
                        int(c["ARR"][ri])),
                STATUS_OF[int(c["STATUS"][ri])], int(c["N"][ri]), int(c["C"][ri]),
                int(c["G"][ri]), int(c["H"][ri]), int(c["PRE"][ri]), owned.get(ri, []),
                bool(c["RECOMP"][ri]))
        ex.live = live
        ex.free, ex.free_host, ex.running = self.free, self.free_host, self.running
        ex.leaked, ex.track_ids, ex.step_no = self.leaked, self.track_ids, self.step_no

    def _from_exact(self, before: np.ndarray) -> None:
        """Read the state back; `before` are the requests that were live before."""
        ex = self.exact
        c = self.cols
        for ri in before.tolist():
            rid = self.ids[ri]
            if rid not in ex.live:
                c["STATUS"][ri] = CODE_OF[ex.ended[rid]]
                c["G"][ri] = c["H"][ri] = 0
                c["GEN"][ri] += 1
        for rid, t in ex.live.items():
            ri = self.index[rid]
            c["N"][ri], c["C"][ri], c["G"][ri], c["H"][ri] = (t.num_tokens, t.num_computed,
                                                             t.gpu_blocks, t.host_blocks)
            c["PRE"][ri], c["RECOMP"][ri] = t.preemptions, int(t.recomputing)
            c["STATUS"][ri] = CODE_OF[t.status]
            c["GEN"][ri] += 1
        self.holder.fill(-1)
        for b, rid in ex.owner.items():
            ri = self.index[rid]
            self.holder[b] = ri
            self.holder_gen[b] = c["GEN"][ri]
        self.free, self.free_host, self.running = ex.free, ex.free_host, ex.running
        self.leaked, self.track_ids, self.step_no = ex.leaked, ex.track_ids, ex.step_no
        self.live = len(ex.live)

    def check_exactly(self, steps: list[tuple[int, Any]], expected: int,
                      unknown_keys: dict[str, int]) -> int:
        """Check lines (number, JSON object, or the raw bytes of a line read as the spec's
        reader reads it) with the spec's parser and Checker; returns the next expected
        step number."""
        self.exact_runs += 1
        before = self._live_indices()
        first_new = len(self.ids)
        self._to_exact()
        for line, given in steps:
            obj = exact_object(given, line, self.loads) if isinstance(given, bytes) else given
            rec = parse_step(obj, line)
            self.saw(rec.step, rec.new_blocks, rec.free_blocks)
            if rec.step != expected:
                raise TraceError(line, f"expected step {expected}, got {rec.step} "
                                       "(steps are numbered from 0 without gaps)")
            for key in obj:
                if key not in STEP_KEYS and key not in unknown_keys:
                    unknown_keys[key] = line
            expected += 1
            fresh = [r for r in rec.arrivals if r.id not in self.index and r.id not in self.ended]
            if len({r.id for r in fresh}) == len(fresh):
                self._register(fresh)
            else:
                self._register(list({r.id: r for r in reversed(fresh)}.values())[::-1])
            self.exact.step(rec)
        self._from_exact(np.concatenate((before, np.arange(first_new, len(self.ids)))))
        return expected

    # -- the fast path --------------------------------------------------------------

    def check_fast(self, run: Run) -> bool:
        """Check a run with the vectorized rules; False (and no change) if the spec's
        checker must check it."""
        saved = (self.free, self.free_host, self.running, self.leaked, self.track_ids,
                 self.step_no, self.live, len(self.ids), self.report.steps,
                 self.report.scheduled_entries, self.report.requests)
        undo: list[tuple[np.ndarray, Any, Any]] = []
        ended: list[str] = []
        mark = self.table.mark()
        try:
            ok = self._fast(run, undo, ended)
        except (_Unusual, OverflowError):
            ok = False
        if ok:
            self.fast_runs += 1
            return True
        for arr, idx, old in reversed(undo):
            arr[idx] = old
        for rid in ended:
            self.ended.pop(rid, None)
        n_ids = saved[7]
        for rid in self.ids[n_ids:]:
            del self.index[rid]
        del self.ids[n_ids:]
        if not self.table.rollback(mark):
            self.table = IdTable()
            for ri, rid in enumerate(self.ids):
                self.table.add(rid, ri)
            self.table.mark()
        (self.free, self.free_host, self.running, self.leaked, self.track_ids,
         self.step_no, self.live) = saved[:7]
        self.report.steps, self.report.scheduled_entries, self.report.requests = saved[8:]
        return False

    def _set(self, undo: list[tuple[np.ndarray, Any, Any]], name: str, idx: Any,
             value: Any) -> None:
        arr = self.cols[name]
        undo.append((arr, idx, np.copy(arr[idx])))
        arr[idx] = value

    def _fast(self, run: Run, undo: list[tuple[np.ndarray, Any, Any]],
              ended: list[str]) -> bool:
        cfg = self.config
        c = self.cols
        T = run.T
        first_new = len(self.ids)
        n_new = len(run.arr_ids)
        arrival_t = np.repeat(np.arange(T, dtype=I64), run.n_arr)
        if n_new:
            names = run.arr_ids
            unique = set(names)
            if (len(unique) != n_new or not unique.isdisjoint(self.index)
                    or not unique.isdisjoint(self.ended)):
                return False  # arrives twice: the spec raises
            keys = [x.arr_keys for x in run.parts if x.arr_keys is not None]
            self._register_columns(
                names, None if len(keys) < len(run.parts) else
                keys[0] if len(keys) == 1 else np.concatenate(keys),
                run.arr_num, run.steps[arrival_t])

        # -- the first step's aborts, rejections, preemptions and swap-ins, one by one
        head = run.head
        victims: set[int] = set()
        swapped_in: dict[int, int] = {}
        free_before, reclaim = self.free, 0
        last_need: tuple[int, int, int] | None = None
        last_victim = 0
        if head is not None:
            arrived_now = set(range(first_new, first_new + int(run.n_arr[0])))

            def lookup(rid: str) -> int:
                x = self.index.get(rid)
                if x is None or (x >= first_new and x not in arrived_now):
                    raise _Unusual  # unknown or not yet arrived: the spec raises
                return x

            def end(x: int, code: int) -> int:
                released = int(c["G"][x])
                if int(c["STATUS"][x]) == RUNNING:
                    self.running -= 1
                self.free += released
                self.free_host += int(c["H"][x])
                self._set(undo, "GEN", x, c["GEN"][x] + 1)
                self._set(undo, "G", x, 0)
                self._set(undo, "H", x, 0)
                self._set(undo, "STATUS", x, code)
                self.ended[self.ids[x]] = STATUS_OF[code]
                ended.append(self.ids[x])
                self.live -= 1
                return released

            for rid in head.aborted:
                x = lookup(rid)
                if int(c["STATUS"][x]) > SWAPPED:
                    return False
                end(x, ABORTED)
            free_before = self.free
            for rid in head.rejected:
                x = lookup(rid)
                if (int(c["STATUS"][x]) != WAITING or never_completes(
                        cfg, int(c["P"][x]), int(c["O"][x])) is None):
                    return False
                end(x, REJECTED)
            for rid, mode in head.preempted:
                x = lookup(rid)
                if int(c["STATUS"][x]) != RUNNING or x in swapped_in:
                    return False
                preemptions = int(c["PRE"][x]) + 1
                if preemptions == self.max_preemptions + 1:
                    return False  # no-thrash
                self._set(undo, "PRE", x, preemptions)
                g = int(c["G"][x])
                last_need = (int(c["N"][x]), int(c["C"][x]), g)
                self.running -= 1
                if mode == "swap":
                    if g > self.free_host:
                        return False  # cpu-budget
                    self.free_host -= g
                    self._set(undo, "H", x, g)
                    self._set(undo, "STATUS", x, SWAPPED)
                else:
                    self._set(undo, "C", x, 0)
                    self._set(undo, "RECOMP", x, 1)
                    self._set(undo, "STATUS", x, WAITING)
                self._set(undo, "G", x, 0)
                self._set(undo, "GEN", x, c["GEN"][x] + 1)
                self.free += g
                reclaim += g
                last_victim = g
                victims.add(x)
            for rid in head.swapped_in:
                x = lookup(rid)
                if int(c["STATUS"][x]) != SWAPPED or x in victims or x in swapped_in:
                    return False
                h = int(c["H"][x])
                self._set(undo, "G", x, h)
                self._set(undo, "H", x, 0)
                self._set(undo, "STATUS", x, RUNNING)
                self.free -= h
                self.free_host += h
                self.running += 1
                swapped_in[x] = h
        swap_demand = sum(swapped_in.values())

        # -- the scheduled entries of the whole run, in step order ------------------
        ri = self._resolve_all(run, "ent_ids")
        E = ri.size
        if E and ri.min() < 0:
            return False  # an unknown id: the spec raises
        n = run.ent_n
        t = np.repeat(np.arange(T, dtype=I64), run.n_ent)
        low = int(ri.min()) if E else 0
        span = int(ri.max()) - low + 1 if E else 0
        prev = np.empty(E, dtype=I64)
        nxt = np.empty(E, dtype=I64)
        if sc.chain(ri, t, low, span, prev, nxt):
            return False  # scheduled twice in one step
        starts = prev < 0  # the request's first entry in the run
        heads = np.flatnonzero(starts)
        head_ri = ri[heads]

        # (what holds at a request's first entry in the run holds at the others)
        status0 = c["STATUS"][head_ri]
        if np.any(status0 > RUNNING):
            return False  # swapped or ended
        if n_new:
            fresh = head_ri >= first_new
            if np.any(fresh) and np.any(t[heads[fresh]]
                                        < arrival_t[head_ri[fresh] - first_new]):
                return False  # scheduled before it arrived: unknown to the spec
        if victims and np.any(np.isin(ri[t == 0], np.fromiter(victims, dtype=I64))):
            return False  # scheduled in the step that preempted it

        N0, C0, G0 = c["N"][ri], c["C"][ri], c["G"][ri]
        before = np.empty(E, dtype=I64)
        sc.chain_exclusive(prev, n, before)
        computed = C0 + before
        after = computed + n
        sampled = after >= N0
        known = np.empty(E, dtype=I64)
        sc.chain_exclusive(prev, sampled.astype(I64), known)
        known += N0
        bad = (n < 1) | (after > known) | (after > cfg.max_model_len)
        bad |= sampled & (known >= cfg.max_model_len)  # samples past max_model_len
        if not cfg.chunked_prefill:
            bad |= n != known - computed
        if np.any(bad):
            return False  # token-range
        bs = cfg.block_size
        if bs & (bs - 1) == 0:
            g_after = np.maximum(G0, (after + (bs - 1)) >> (bs.bit_length() - 1))
        else:
            g_after = np.maximum(G0, -(-after // bs))
        new_blocks = g_after - np.where(starts, G0, g_after[prev])

        # -- finishes --------------------------------------------------------------
        fin_t = np.repeat(np.arange(T, dtype=I64), run.n_fin)
        fin_ri = self._resolve_all(run, "fin_ids")
        F = fin_ri.size
        if F and fin_ri.min() < 0:
            return False
        at = np.empty(F, dtype=I64)
        sc.entry_of(ri, run.n_ent, low, span, fin_ri, run.n_fin, at)
        if F and at.min() < 0:
            return False  # finishes without being scheduled in that step
        finishing = np.zeros(E, dtype=bool)
        finishing[at] = True
        if np.count_nonzero(finishing) != F:
            return False  # finished twice in one step
        if np.any(finishing & ~sampled):
            return False
        if np.any(sampled & (known + 1 >= c["LIMIT"][ri]) & ~finishing):
            return False  # reached max_tokens or max_model_len but did not finish
        # An entry after its request finished: the finishing entry must be its last.
        if F and np.any(finishing & (nxt >= 0)):
            return False

        # -- per step: tokens, blocks, running requests ------------------------------
        step_ends = np.cumsum(run.n_ent)
        tokens = _per_step(n, step_ends)
        if np.any(tokens > cfg.max_num_batched_tokens):
            return False
        demand = _per_step(new_blocks, step_ends)
        released = np.bincount(t[at], weights=g_after[at], minlength=T).astype(I64)
        free_mid = self.free + np.concatenate(([0], np.cumsum(released - demand)[:-1]))
        after_sched = free_mid - demand
        if np.any(after_sched < 0):
            return False  # kv-budget
        free_end = after_sched + released
        admitted = np.bincount(t[heads[status0 == WAITING]], minlength=T)
        fin_count = np.bincount(fin_t, minlength=T)
        running = self.running + np.cumsum(admitted) - np.concatenate(
            ([0], np.cumsum(fin_count)[:-1]))
        if np.any(running > cfg.max_num_seqs):
            return False
        reported = run.free
        has = reported >= 0
        if np.any(reported[has] != free_end[has] - self.leaked):
            return False  # accounting (or a leak the spec's checker names)
        if head is not None and head.preempted:
            # every victim valid, the step within its blocks (else above)
            assert last_need is not None
            k_, c_, g_ = last_need
            own_n = k_ - c_
            threshold = cfg.long_prefill_token_threshold
            if 0 < threshold < own_n:
                own_n = threshold
            own_n = min(own_n, cfg.max_num_batched_tokens)
            own = blocks_needed(c_, own_n, g_, bs)
            total = int(demand[0]) + swap_demand
            if should.needed_preemption(head.step, total + own, free_before, reclaim,
                                        last_victim) is not None:
                return False
        for ri_in in swapped_in:
            if not np.any((ri == ri_in) & (t == 0)):
                return False  # swapped in but not scheduled: left to the spec's checker

        # -- block ids -------------------------------------------------------------
        present = run.has_blocks
        track = self.track_ids
        if track is None:
            track = bool(present[0])
        if not present.all():
            if present.any():
                return False  # runs are cut where block ids come and go
            track = False
        assign: tuple[np.ndarray, np.ndarray] | None = None
        if track:
            assign = self._check_blocks(run, ri, t, new_blocks, swapped_in, low, span,
                                        fin_ri, fin_t)
            if assign is None:
                return False

        # -- idle steps: nothing could have run (the run ends with such a step) -----
        # (checked after the commit, below, on the state at the run's end)

        # -- commit ----------------------------------------------------------------
        last = nxt < 0  # the request's last entry in the run
        last_ri = ri[last]
        self._set(undo, "N", last_ri, (known + sampled)[last])
        self._set(undo, "C", last_ri, after[last])
        self._set(undo, "G", last_ri, g_after[last])
        self._set(undo, "STATUS", last_ri, RUNNING)
        self._set(undo, "RECOMP", last_ri, 0)
        if F:
            self._set(undo, "STATUS", fin_ri, FINISHED)
            self._set(undo, "G", fin_ri, 0)
            self._set(undo, "GEN", fin_ri, c["GEN"][fin_ri] + 1)
            ids = self.ids
            rids = [ids[r] for r in fin_ri.tolist()]
            self.ended.update(dict.fromkeys(rids, Status.FINISHED))
            ended.extend(rids)
        if assign is not None:
            blocks, owners = assign
            undo.append((self.holder, blocks, self.holder[blocks].copy()))
            undo.append((self.holder_gen, blocks, self.holder_gen[blocks].copy()))
            self.holder[blocks] = owners
            self.holder_gen[blocks] = c["GEN"][owners] - (
                np.isin(owners, fin_ri) if F else 0)
        self.track_ids = track if self.track_ids is not False else False
        self.free = int(free_end[-1])
        self.running = int(running[-1] - fin_count[-1])
        self.live += n_new - F
        self.step_no = int(run.steps[-1])
        self.report.steps += T
        self.report.scheduled_entries += E
        self.report.requests += n_new
        # The run ends with an idle step only when requests are live: nothing could run.
        idle = run.n_ent[-1] == 0 and not (T == 1 and head is not None and (
            head.preempted or head.swapped_in))
        return not (idle and self.live > 0 and self._runnable())

    def _check_blocks(self, run: Run, ri: np.ndarray, t: np.ndarray, new_blocks: np.ndarray,
                      swapped_in: dict[int, int], low: int, span: int, fin_ri: np.ndarray,
                      fin_t: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Check the run's new_blocks: counts equal the blocks needed (plus H on swap-in),
        each id in range and free when given. Returns the (block, owner) assignments to
        commit, or None if the spec's checker must look."""
        E = ri.size
        T = run.T
        owner = self._resolve_all(run, "own_ids")
        K = owner.size
        if K and owner.min() < 0:
            return None
        step_of = np.repeat(np.arange(T, dtype=I64), run.n_own)
        given = run.own_sizes
        blocks = run.blocks
        B = blocks.size
        if B and (blocks.min() < 0 or blocks.max() >= self.config.num_gpu_blocks):
            return None
        # Every id list belongs to an entry scheduled in that step; every entry gets
        # exactly its new blocks (and its host blocks back on swap-in).
        where = np.empty(K, dtype=I64)
        sc.entry_of(ri, run.n_ent, low, span, owner, run.n_own, where)
        if K and where.min() < 0:
            return None
        got = np.zeros(E, dtype=I64)
        got[where] = given
        if K > 1 and np.count_nonzero(np.bincount(where, minlength=E) > 1):
            return None  # an id twice in one new_blocks: JSON keeps the last
        expected = new_blocks.copy()
        for r, host in swapped_in.items():
            expected[(ri == r) & (t == 0)] += host
        if np.any(got != expected):
            return None
        if B == 0:
            return np.zeros(0, dtype=I64), np.zeros(0, dtype=I64)
        block_owner = np.repeat(owner, given)
        block_step = np.repeat(step_of, given)
        low = int(fin_ri.min()) if fin_ri.size else 0
        fin_step = np.full(int(fin_ri.max()) - low + 1 if fin_ri.size else 0, T, dtype=I64)
        fin_step[fin_ri - low] = fin_t

        def finish_at(requests: np.ndarray) -> np.ndarray:
            """The step of the run at which each request finishes, T if none."""
            inside = (requests >= low) & (requests < low + fin_step.size)
            out: np.ndarray = np.full(requests.size, T, dtype=I64)
            out[inside] = fin_step[requests[inside] - low]
            return out

        # The id lists are in step order: a stable sort by block id orders by (block, step).
        order = _group(blocks)
        b, s, o = blocks[order], block_step[order], block_owner[order]
        starts, _ = _segments(b)
        # A later grant of a block: the earlier holder finished in between.
        later = ~starts
        if np.any(later):
            prev = np.flatnonzero(later) - 1
            if np.any(s[later] <= s[prev]) or np.any(finish_at(o[prev]) >= s[later]):
                return None
        # The first grant in the run: the block was free, or its holder finished before.
        firsts = np.flatnonzero(starts)
        holder = self.holder[b[firsts]]
        held = holder >= 0
        if np.any(held):
            h = holder[held]
            current = self.holder_gen[b[firsts]][held] == self.cols["GEN"][h]
            if np.any(current & (finish_at(h) >= s[firsts][held])):
                return None
        lasts = np.append(firsts[1:] - 1, b.size - 1)
        return b[lasts], o[lasts]

    def _runnable(self) -> bool:
        """Whether some live request's smallest next chunk fits now (the spec's no-idle)."""
        cfg = self.config
        c = self.cols
        live = self._live_indices()
        if live.size == 0:
            return False
        status = c["STATUS"][live]
        left = c["N"][live] - c["C"][live]
        n = np.ones_like(left) if cfg.chunked_prefill else left
        swapped = status == SWAPPED
        held = np.where(swapped, c["H"][live], c["G"][live])
        need = np.maximum(0, -(-(c["C"][live] + n) // cfg.block_size) - held)
        need = need + np.where(swapped, c["H"][live], 0)
        need = need + np.where((status != RUNNING) & (self.running > 0), cfg.watermark_blocks,
                               0)
        can = (n <= cfg.max_num_batched_tokens) & (need <= self.free)
        can &= (status == RUNNING) | (self.running < cfg.max_num_seqs)
        return bool(np.any(can))

    def end(self, complete: bool) -> Report:
        self._to_exact()
        return self.exact.end(complete)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
GLIBC_DEFAULT = 128 * 1024  # both thresholds' initial values in glibc


def _mallopt() -> Callable[[int, int], int] | None:
    if sys.platform != "linux":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn: Callable[[int, int], int] = libc.mallopt
    except (OSError, AttributeError):
        return None  # not glibc (musl has no mallopt)
    return fn


@contextmanager
def arrays_in_heap() -> Iterator[None]:
    """Keep numpy's arrays of a few megabytes in the malloc heap while a trace is checked.

    Each run allocates and frees dozens of arrays of megabytes. glibc maps each one
    with mmap and unmaps it when freed, so every run pays page faults and the zeroing of
    fresh pages again: a third of the checker's time on a 256-sequence engine's trace.
    Raising the mmap threshold (to glibc's largest, 32 MiB) and the trim threshold for
    the duration lets freed arrays be reused; both go back to glibc's initial values
    after. No effect where malloc is not glibc's."""
    mallopt = _mallopt()
    if mallopt is None:
        yield
        return
    mallopt(M_MMAP_THRESHOLD, 32 << 20)
    mallopt(M_TRIM_THRESHOLD, 256 << 20)
    try:
        yield
    finally:
        mallopt(M_MMAP_THRESHOLD, GLIBC_DEFAULT)
        mallopt(M_TRIM_THRESHOLD, GLIBC_DEFAULT)


@contextmanager
def no_cycle_collection() -> Iterator[None]:
    """Pause the cyclic garbage collector: a run keeps the parsed JSON of thousands of
    lines alive (lists, no cycles), which the collector would otherwise walk again and
    again, making parsing several times slower."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def check_trace_vectorized(stream: IO[bytes], loads: Loads = orjson.loads,
                           max_preemptions: int = should.DEFAULT_MAX_PREEMPTIONS,
                           run_steps: int = RUN_STEPS,
                           stats: dict[str, int] | None = None) -> Report:
    """Check a trace (a binary stream) as `kvsched.spec.checker.check_trace` does with a
    TraceReader using `loads`: the same Report, or the same TraceError. `stats`, if
    given, receives how many runs were checked vectorized ("fast") and how many by the
    spec's checker ("exact"), whether step 0 carries new_blocks ("block_ids") and some
    step reports free_blocks ("free_blocks"), as 1 or 0, and how many lines the compiled
    scanner read ("scanned") and how many were read with orjson ("as_json")."""
    with no_cycle_collection(), arrays_in_heap():
        return _check(stream, loads, max_preemptions, run_steps, stats)


def blocks_of(stream: IO[bytes]) -> Iterator[sc.Block]:
    """The stream in blocks of whole lines (each ending in a newline), then the last
    line if it has no newline, as a block of its own (its `last` set)."""
    rest = b""
    while True:
        chunk = stream.read(READ_BYTES)
        if not chunk:
            break
        buf = bytearray(rest)
        buf += chunk
        cut = buf.rfind(b"\n") + 1
        rest = bytes(buf[cut:])
        if cut:
            yield sc.Block(buf, cut)
    if rest:
        yield sc.Block(bytearray(rest), len(rest), last=True)


def _check(stream: IO[bytes], loads: Loads, max_preemptions: int, run_steps: int,
           stats: dict[str, int] | None) -> Report:
    vc: VectorizedChecker | None = None
    unknown: dict[str, int] = {}
    # Lines wait in `run` (fast) or `slow` (for the spec's parser); at most one of the two
    # is non-empty, so the lines are checked in order.
    run: list[Part] = []
    run_len = 0
    run_start = 0  # step number of the run's first line
    run_entries = 0
    run_live = 0  # live requests at the end of `run`, if it is correct
    run_blocks = 0  # whether the run's lines carry new_blocks
    slow: list[tuple[int, Any]] = []
    slow_start = 0
    expected = 0  # the next step number, counting the lines waiting
    complete = False
    number = 0  # the number of the last line read
    scanner = sc.Scanner(SCAN_LINES, SCAN_ENTRIES)
    as_json = 0  # lines read with orjson (the scanner reads the others)

    def flush() -> None:
        nonlocal run, run_len, run_entries, slow
        assert vc is not None
        if run:
            whole = Run(run)
            if not vc.check_fast(whole):
                vc.check_exactly(whole.raws(), run_start, unknown)
            run = []
            run_len = run_entries = 0
        if slow:
            vc.check_exactly(slow, slow_start, unknown)
            slow = []

    def start_run(blocks: int) -> None:
        nonlocal run_start, run_live, run_blocks
        assert vc is not None
        run_start = expected
        run_live = vc.live
        run_blocks = blocks

    def one_line(raw: bytes) -> None:
        """A line the scanner left alone (or a header, or past the end): read as JSON."""
        nonlocal vc, complete, expected, slow_start, run_len, run_entries, run_live, as_json
        as_json += 1
        if vc is None:
            obj = exact_object(raw, number, loads)
            if obj is not None:
                vc = VectorizedChecker(parse_header(obj, number).config, max_preemptions)
                vc.loads = loads
            return
        if complete:
            if exact_object(raw, number, loads) is not None:
                raise TraceError(number, 'nothing may follow the {"end": true} line')
            return
        try:
            obj = loads(raw)
        except ValueError:
            flush()
            obj = exact_object(raw, number, loads)  # raises, or the line is blank
            if obj is None:
                return
        if type(obj) is dict and obj.get("end") is True and "step" not in obj:
            flush()
            complete = True
            return
        st = parse_fast(obj, number, expected, raw)
        if st is None:
            if run:
                flush()
            if not slow:
                slow_start = expected
            slow.append((number, obj))
            expected += 1  # if the line is bad, the spec's parser raises before it matters
            return
        if slow:
            flush()
        for key in st.unknown_keys:
            if key not in unknown:
                unknown[key] = number
        vc.saw(st.step, st.new_blocks, st.free_blocks)
        blocks = int(st.new_blocks is not None)
        # A run starts at a step with rare events and where block ids come or go.
        if run and (st.rare or blocks != run_blocks or run_len >= run_steps
                    or run_entries >= RUN_ENTRIES):
            flush()
        if not run:
            start_run(blocks)
        run.append(part_of_step(st))
        run_len += 1
        run_entries += len(st.scheduled)
        run_live += (len(st.arrivals) - len(st.finished) - len(st.aborted)
                     - len(st.rejected))
        expected += 1
        if st.idle and run_live > 0:
            flush()  # no-idle is checked on the state at the end of a run

    def scanned(lines: ScannedLines, k: int, j: int) -> int:
        """Take lines k.. of a stretch the scanner read (up to j), as one part: as many
        as fit the run. Returns the next line to look at."""
        nonlocal expected, run_len, run_entries, run_live
        assert vc is not None
        rows = lines.rows
        steps = rows[k:j, sc.L_STEP]
        wrong = np.flatnonzero(steps != expected + np.arange(j - k))
        if wrong.size:
            j = k + int(wrong[0])  # that line is read as JSON (and found wrong) next
            if j == k:
                return k
        blocks = int(rows[k, sc.L_BLOCKS])
        if slow or (run and (blocks != run_blocks or run_len >= run_steps
                             or run_entries >= RUN_ENTRIES)):
            flush()
        if not run:
            start_run(blocks)
        j = min(j, k + run_steps - run_len)
        change = np.flatnonzero(rows[k:j, sc.L_BLOCKS] != blocks)
        if change.size:
            j = k + int(change[0])
        ent = rows[k:j, sc.L_ENT]
        before = run_entries + np.cumsum(ent) - ent
        over = np.flatnonzero(before >= RUN_ENTRIES)
        if over.size:
            j = k + int(over[0])
        live = run_live + np.cumsum(rows[k:j, sc.L_ARR] - rows[k:j, sc.L_FIN])
        idle = np.flatnonzero((rows[k:j, sc.L_ENT] == 0) & (live > 0))
        cut = idle.size > 0
        if cut:
            j = k + int(idle[0]) + 1
        first_line = number + 1 + k
        if int(rows[k, sc.L_STEP]) == 0:
            vc.saw(0, {} if blocks else None, None)
        if not vc.any_free_blocks and np.any(rows[k:j, sc.L_FREE] >= 0):
            vc.any_free_blocks = True
        run.append(lines.part(k, j, first_line))
        run_len += j - k
        run_entries += int(rows[k:j, sc.L_ENT].sum())
        run_live = int(live[j - k - 1])
        expected += j - k
        if cut:
            flush()
        return j

    for block in blocks_of(stream):
        pos = 0
        if block.last or vc is None or complete:
            # The header, what follows the end, and a last line without a newline: one
            # at a time (then the scanner takes the rest of the block).
            data = block.data
            while pos < block.size:
                cut = data.find(b"\n", pos, block.size) + 1 or block.size
                number += 1
                one_line(bytes(data[pos:cut]))
                pos = cut
                if vc is not None and not complete and not block.last:
                    break
        while pos < block.size:
            got = scanner(block, pos, block.size)
            lines = ScannedLines(block, got)
            R = got.lines.shape[0]
            bad = np.flatnonzero(~lines.ok)
            k = 0
            while k < R:
                if complete:
                    as_json += 1
                    number_k = number + 1 + k
                    if exact_object(lines.raw(k), number_k, loads) is not None:
                        raise TraceError(number_k, 'nothing may follow the {"end": true} line')
                    k += 1
                    continue
                if lines.ok[k]:
                    nxt = bad[np.searchsorted(bad, k):][:1]
                    j = scanned(lines, k, int(nxt[0]) if nxt.size else R)
                    if j > k:
                        k = j
                        continue
                saved = number
                number = number + 1 + k
                one_line(lines.raw(k))
                number = saved
                k += 1
            flush()
            number += R
            pos = got.end
    if vc is None:
        raise TraceError(1, "empty file: expected a trace header line")
    flush()
    report = vc.end(complete)
    report.unknown_keys = dict(unknown)
    if stats is not None:
        stats["fast"] = vc.fast_runs
        stats["exact"] = vc.exact_runs
        stats["block_ids"] = int(vc.first_step_blocks)
        stats["free_blocks"] = int(vc.any_free_blocks)
        stats["as_json"] = as_json
        stats["scanned"] = number - as_json
    return report
