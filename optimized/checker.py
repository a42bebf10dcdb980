"""A vectorized trace checker with the spec checker's verdicts, for very large traces.

NOTE on the method. The spec's checker (kvsched.spec.checker) replays a trace one step
and one request at a time in Python. This one reads the trace in runs of steps and
checks a whole run at once with numpy: the scheduled entries of the run are grouped by
request, and the spec's bookkeeping becomes prefix sums within each request (computed
tokens, known tokens, sampled tokens, blocks held) and across steps (tokens and new
blocks per step, free blocks, running requests), against which every MUST and SHOULD
invariant is one vectorized comparison. Block ids are checked by sorting the handed-out
ids by (block, step): each must have been free when given.

Reading. The scheduled lists, the bulk of every line, are cut out of the line as bytes
(orjson parses the rest) and split into ids and counts with numpy, every byte
accounted for; an id of at most 16 plain ASCII characters is its own key, found in an
open-addressing table of the known ids. Anything else (spaces, escapes, long ids) is
read as JSON instead. The cyclic garbage collector pauses while a trace is checked.

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

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import IO, Any

import numpy as np
import orjson

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

Loads = Callable[[bytes], Any]
_first = itemgetter(0)
_second = itemgetter(1)


class _Unusual(Exception):
    """The fast path met something it leaves to the spec's checker."""


def _ids_ok(v: Any) -> bool:
    return type(v) is list and all(type(x) is str and x for x in v)


@dataclass(slots=True)
class FastStep:
    """One step line, parsed and validated without building the spec's records."""

    line: int
    raw: bytes
    step: int
    arrivals: list[Request]
    scheduled: list[Any] | bytes  # the JSON list, or its bytes cut out of the line
    entries: int
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
        return not self.entries and not self.preempted and not self.swapped_in


SCHEDULED_KEY = b'"scheduled":'


def cut_scheduled(raw: bytes) -> tuple[bytes, bytes] | None:
    """Split a line into (the line with its "scheduled" value replaced by 0, the value's
    bytes) when the value is a compact list of lists; None otherwise. Parsing the rest
    as JSON tells whether the cut was right: its "scheduled" must be the 0 put there."""
    at = raw.find(SCHEDULED_KEY)
    if at < 0:
        return None  # (a second "scheduled" key, or one nested deeper, fails that test)
    start = at + len(SCHEDULED_KEY)
    if raw.startswith(b"[]", start):
        end = start + 2
    elif raw.startswith(b"[[", start):
        end = raw.find(b"]]", start)
        if end < 0:
            return None
        end += 2
    else:
        return None
    return raw[:start] + b"0" + raw[end:], raw[start:end]


def parse_fast(obj: Any, line: int, expected: int, raw: bytes,
               segment: bytes | None) -> FastStep | None:
    """The step, if the line is one parse_step accepts and numbered `expected`; None when
    the spec's own parser should look at it (it may raise the error). With `segment`,
    obj is the line with its scheduled list cut out (see cut_scheduled)."""
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
    scheduled: list[Any] | bytes
    if segment is not None:
        placeholder = obj.get("scheduled")
        if type(placeholder) is not int or placeholder != 0:
            return None
        scheduled = segment
        entries = segment.count(b'"') // 2
    else:
        scheduled = obj.get("scheduled", NOTHING)
        if type(scheduled) is not list:
            return None
        entries = len(scheduled)
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
    elif type(new_blocks) is not dict:
        return None
    time_ms = obj.get("time_ms")
    if time_ms is not None and (type(time_ms) not in (int, float) or time_ms < 0):
        return None
    st = FastStep(line, raw, step, arrivals, scheduled, entries, finished, free_blocks,
                  new_blocks)
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


# -- scheduled lists read as bytes ----------------------------------------------------

U64 = np.uint64
K1, K2 = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F
MASK64 = (1 << 64) - 1


def id_key(rid: str) -> tuple[int, int] | None:
    """The id's bytes as two 64-bit words (exact, no hashing), for ids of at most 16
    printable ASCII characters that JSON writes without escapes; None for others."""
    if len(rid) > 16 or not rid.isascii() or '"' in rid or "\\" in rid:
        return None
    raw = rid.encode("ascii")
    if min(raw) < 32:
        return None
    return int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:16], "little")


class IdTable:
    """Open addressing (linear probing) from id keys (id_key) to request indices; keys
    are added in batches and looked up with numpy."""

    def __init__(self) -> None:
        self.bits = 12
        self.lo = np.zeros(1 << self.bits, dtype=U64)
        self.hi = np.zeros(1 << self.bits, dtype=U64)
        self.ri = np.full(1 << self.bits, -1, dtype=I64)
        self.count = 0
        self.probes = 0  # the longest probe sequence so far
        self.pending: list[tuple[int, int, int]] = []  # (lo, hi, ri) not yet in the table
        self.long_ids = False  # some key has a high word (an id of 9 to 16 bytes)
        self.filled: list[np.ndarray] = []  # slots filled since `mark`

    def add(self, rid: str, ri: int) -> None:
        key = id_key(rid)
        if key is not None:
            self.pending.append((key[0], key[1], ri))
            self.long_ids |= key[1] != 0

    def _home(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        out: np.ndarray = ((lo * U64(K1)) ^ (hi * U64(K2))) >> U64(64 - self.bits)
        return out

    def _flush(self) -> None:
        if not self.pending:
            return
        keys = np.array(self.pending, dtype=U64).reshape(-1, 3)
        self.pending = []
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
            self.probes = 0
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
            if won.size:
                self.probes = max(self.probes, probe)
            placed = np.zeros(ri.size, dtype=bool)
            placed[won] = True
            left = left[~placed[left]]
            probe += 1

    def mark(self) -> tuple[int, int, int]:
        self._flush()
        self.filled = []
        return self.count, self.probes, self.bits

    def rollback(self, mark: tuple[int, int, int]) -> bool:
        """Undo the additions since `mark` (False if the table grew meanwhile)."""
        self.pending = []
        if mark[2] != self.bits:
            return False
        for slots in self.filled:
            self.lo[slots], self.hi[slots], self.ri[slots] = 0, 0, -1
        self.filled = []
        self.count, self.probes = mark[0], mark[1]
        return True

    def find(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """The request index of each key, -1 where unknown."""
        self._flush()
        mask = U64(self.ri.size - 1)
        home = self._home(lo, hi)
        out = np.full(lo.size, -1, dtype=I64)
        if not self.long_ids and not hi.any():
            # Every key is at most 8 bytes: the low word alone decides.
            at = home & mask
            found = self.ri[at]
            hit = (found >= 0) & (self.lo[at] == lo)
            out[hit] = found[hit]
            pending = np.flatnonzero(~hit & (found >= 0))
            for probe in range(1, self.probes + 1):
                if pending.size == 0:
                    break
                at = (home[pending] + U64(probe)) & mask
                found = self.ri[at]
                hit = (found >= 0) & (self.lo[at] == lo[pending])
                out[pending[hit]] = found[hit]
                pending = pending[~hit & (found >= 0)]
            return out
        pending = np.arange(lo.size)
        for probe in range(self.probes + 1):
            at = (home[pending] + U64(probe)) & mask
            found = self.ri[at]
            hit = (found >= 0) & (self.lo[at] == lo[pending]) & (self.hi[at] == hi[pending])
            out[pending[hit]] = found[hit]
            pending = pending[~hit & (found >= 0)]
            if pending.size == 0:
                break
        return out


def _words(b: np.ndarray) -> np.ndarray:
    """A view in which element i is the 8 bytes from b[i] on as a little-endian integer
    (b must end with 8 bytes of padding)."""
    return np.ndarray(shape=(b.size - 8,), dtype="<u8", buffer=b, strides=(1,))


HIGH = U64(0x8080808080808080)
ONES = U64(0x0101010101010101)
FILLER = U64(0x4141414141414141)  # "AAAAAAAA": stands in for the bytes past an id's end


def _plain(words: np.ndarray) -> bool:
    """No byte of any word is non-ASCII, a control character (< 32) or a backslash: the
    id was written by JSON without escapes, as its bytes."""
    if np.any(words & HIGH):
        return False
    control = (words - ONES * U64(0x20)) & ~words & HIGH  # a byte below 0x20
    slash = words ^ (ONES * U64(0x5C))
    backslash = (slash - ONES) & ~slash & HIGH  # a byte equal to 0x5C
    return not (np.any(control) or np.any(backslash))


def read_scheduled(segments: list[bytes], table: IdTable
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The scheduled entries of several lines from their bytes (see cut_scheduled):
    request index and token count per entry, entries per line. None unless every list
    is compact JSON of [id, count] pairs with plain ids of known requests and counts of
    1 to 13 digits; the caller then reads them as JSON.

    Every byte is accounted for: each line is [[ entry ],[ entry ]...] with entries
    "id",digits, where ids hold no quote, backslash, control or non-ASCII byte."""
    T = len(segments)
    lens = np.fromiter(map(len, segments), dtype=I64, count=T)
    size = int(lens.sum())
    padded = np.frombuffer(b"".join(segments) + bytes(16), dtype=np.uint8)
    b = padded[:size]
    ends = np.cumsum(lens)
    begins = ends - lens
    if size == 0:
        return np.zeros(0, dtype=I64), np.zeros(0, dtype=I64), np.zeros(T, dtype=I64)
    q = np.flatnonzero(b == 34)
    if q.size % 2:
        return None
    q0, q1 = q[0::2], q[1::2]
    E = q0.size
    per_line = np.searchsorted(q, ends) - np.searchsorted(q, begins)
    if np.any(per_line % 2):
        return None
    per_line //= 2
    empty = per_line == 0
    if np.any(empty & (lens != 0) & (lens != 2)):
        return None
    two = begins[empty & (lens == 2)]
    if two.size and (np.any(b[two] != 91) or np.any(b[two + 1] != 93)):
        return None
    if E == 0:
        return np.zeros(0, dtype=I64), np.zeros(0, dtype=I64), per_line
    line_of = np.repeat(np.arange(T), per_line)
    id_len = q1 - q0 - 1
    if id_len.min() < 1 or id_len.max() > 16 or np.any(b[q0 - 1] != 91) \
            or np.any(padded[q1 + 1] != 44):
        return None
    # The count: digits from q1 + 2 up to the entry's closing bracket.
    n = np.zeros(E, dtype=I64)
    digits = np.zeros(E, dtype=I64)
    going = np.ones(E, dtype=bool)
    for j in range(14):
        byte = padded[q1 + 2 + j]
        going &= (byte >= 48) & (byte <= 57)
        if not going.any():
            break
        n = np.where(going, n * 10 + (byte.astype(I64) - 48), n)
        digits += going
    c = q1 + 2 + digits
    if digits.min() < 1 or digits.max() > 13 or np.any(padded[c] != 93):
        return None
    if np.any((b[q1 + 2] == 48) & (digits > 1)):
        return None  # a leading zero is not JSON
    last = np.ones(E, dtype=bool)
    last[:-1] = line_of[1:] != line_of[:-1]
    after = padded[c + 1]
    inner = np.flatnonzero(~last)
    if inner.size and (np.any(after[inner] != 44) or np.any(padded[c[inner] + 2] != 91)
                       or np.any(q0[inner + 1] != c[inner] + 3)):
        return None
    tail = np.flatnonzero(last)
    if np.any(c[tail] + 2 != ends[line_of[tail]]) or np.any(after[tail] != 93):
        return None
    first = np.ones(E, dtype=bool)
    first[1:] = last[:-1]
    heads = np.flatnonzero(first)
    starts = begins[line_of[heads]]
    if np.any(q0[heads] != starts + 2) or np.any(b[starts] != 91) or np.any(b[starts + 1] != 91):
        return None
    if n.max() > MAX_COUNT:
        return None
    # The id: its bytes as two words, bytes past its end masked off.
    words = _words(padded)
    ones = ~U64(0)
    low_bits = np.minimum(id_len, 8).astype(U64) * U64(8)
    mask = np.where(low_bits == 64, ones, (U64(1) << (low_bits & U64(63))) - U64(1))
    lo = words[q0 + 1] & mask
    if not _plain(lo | (~mask & FILLER)):
        return None
    hi = np.zeros(E, dtype=U64)
    long = id_len > 8
    if long.any():
        high_bits = (np.maximum(id_len - 8, 0)).astype(U64) * U64(8)
        mask = np.where(high_bits == 64, ones, (U64(1) << (high_bits & U64(63))) - U64(1))
        hi = np.where(long, words[q0 + 9] & mask, U64(0))
        if not _plain(hi | (~mask & FILLER)):
            return None
    ri = table.find(lo, hi)
    if np.any(ri < 0):
        return None
    return ri, n, per_line


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


def lines_of(stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """(line number, raw line with its newline if it had one), read in large blocks."""
    number = 0
    rest = b""
    while True:
        block = stream.read(READ_BYTES)
        if not block:
            break
        parts = (rest + block).split(b"\n")
        rest = parts.pop()
        for raw in parts:
            number += 1
            yield number, raw + b"\n"
    if rest:
        yield number + 1, rest


def _segments(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For a sorted key array: whether each element starts a group, and the index of its
    group's first element."""
    starts = np.ones(keys.size, dtype=bool)
    if keys.size > 1:
        starts[1:] = keys[1:] != keys[:-1]
    first = np.maximum.accumulate(np.where(starts, np.arange(keys.size), 0))
    return starts, first


def _segmented_exclusive(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Sum of the earlier values of the same group, for each element."""
    total = np.cumsum(values)
    before = total - values
    out: np.ndarray = before - before[first]
    return out


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

    NAMES = ("P", "O", "PRIO", "ARR", "N", "C", "G", "H", "PRE", "GEN", "STATUS", "RECOMP")

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
        first = len(self.ids)
        if not requests:
            return first
        end = first + len(requests)
        if end > self.capacity:
            self._grow(end)
        for k, r in enumerate(requests, first):
            self.ids.append(r.id)
            self.index[r.id] = k
            self.table.add(r.id, k)
        c = self.cols
        at = slice(first, end)
        numbers = np.array([(r.prompt_len, r.max_tokens, r.priority, r.arrival_step)
                            for r in requests], dtype=I64).reshape(-1, 4)
        c["P"][at], c["O"][at], c["PRIO"][at], c["ARR"][at] = numbers.T
        c["N"][at] = numbers[:, 0]
        for name in ("C", "G", "H", "PRE", "RECOMP"):
            c[name][at] = 0
        c["STATUS"][at] = WAITING
        return first

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

    def check_fast(self, run: list[FastStep]) -> bool:
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

    def _fast(self, run: list[FastStep], undo: list[tuple[np.ndarray, Any, Any]],
              ended: list[str]) -> bool:
        cfg = self.config
        c = self.cols
        T = len(run)
        first_new = len(self.ids)
        arrival_t: dict[int, int] = {}
        arriving: list[Request] = []
        for k, st in enumerate(run):
            for r in st.arrivals:
                arrival_t[first_new + len(arriving)] = k
                arriving.append(r)
        if arriving:
            names = {r.id for r in arriving}
            if len(names) != len(arriving) or any(r in self.index or r in self.ended
                                               for r in names):
                return False  # arrives twice: the spec raises
            self._register(arriving)
        n_new = len(self.ids) - first_new

        # -- the first step's aborts, rejections, preemptions and swap-ins, one by one
        head = run[0]
        victims: set[int] = set()
        swapped_in: dict[int, int] = {}
        free_before, reclaim = self.free, 0
        last_need: tuple[int, int, int] | None = None
        last_victim = 0
        if head.rare:
            arrived_now = {r for r, k in arrival_t.items() if k == 0}

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

        # -- the scheduled entries of the whole run, grouped by request --------------
        got = self._entries(run)
        if got is None:
            return False
        ri_e, n_e, lens = got
        E = ri_e.size
        index = self.index
        block_lists = self._block_lists(run)
        if block_lists is None:
            return False
        t_e = np.repeat(np.arange(T, dtype=I64), lens)
        order = np.argsort(ri_e, kind="stable")
        ri = ri_e[order]
        t = t_e[order]
        n = n_e[order]
        starts, first = _segments(ri)
        if E > 1 and np.any(~starts[1:] & (t[1:] == t[:-1])):
            return False  # scheduled twice in one step

        status0 = c["STATUS"][ri]
        if np.any(status0 > RUNNING):
            return False  # swapped or ended
        if n_new:
            arr = np.full(E, -1, dtype=I64)
            fresh = ri >= first_new
            if np.any(fresh):
                arrived = np.zeros(n_new, dtype=I64)
                for k, v in arrival_t.items():
                    arrived[k - first_new] = v
                arr[fresh] = arrived[ri[fresh] - first_new]
                if np.any(t < arr):
                    return False  # scheduled before it arrived: unknown to the spec
        if victims and np.any(np.isin(ri[t == 0], np.fromiter(victims, dtype=I64))):
            return False  # scheduled in the step that preempted it

        N0, C0, G0 = c["N"][ri], c["C"][ri], c["G"][ri]
        before = _segmented_exclusive(n, first)
        computed = C0 + before
        after = computed + n
        sampled = after >= N0
        known = N0 + _segmented_exclusive(sampled.astype(I64), first)
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
        g_before = np.empty_like(g_after)
        g_before[starts] = G0[starts]
        if E > 1:
            g_before[1:][~starts[1:]] = g_after[:-1][~starts[1:]]
        new_blocks = g_after - g_before

        # -- finishes --------------------------------------------------------------
        fin_steps = np.fromiter(map(len, (st.finished for st in run)), dtype=I64, count=T)
        F = int(fin_steps.sum())
        fin_t = np.repeat(np.arange(T, dtype=I64), fin_steps)
        try:
            fin_ri = np.fromiter(map(index.__getitem__,
                                     chain.from_iterable(st.finished for st in run)),
                                 dtype=I64, count=F)
        except KeyError:
            return False
        key = ri * T + t
        fin_key = fin_ri * T + fin_t
        at = np.searchsorted(key, fin_key)
        if F and (np.any(at >= E) or np.any(key[np.minimum(at, E - 1)] != fin_key)):
            return False  # finishes without being scheduled in that step
        if F and np.unique(fin_key).size != F:
            return False
        finishing = np.zeros(E, dtype=bool)
        finishing[at] = True
        if np.any(finishing & ~sampled):
            return False
        limit = np.minimum(c["P"][ri] + c["O"][ri], cfg.max_model_len)
        if np.any(sampled & (known + 1 >= limit) & ~finishing):
            return False  # reached max_tokens or max_model_len but did not finish
        last_of_group = np.append(starts[1:], True) if E else starts
        # An entry after its request finished: every entry of a group must come no later
        # than the group's finishing entry, which is then its last.
        if F and np.any(finishing & ~last_of_group):
            return False

        # -- per step: tokens, blocks, running requests ------------------------------
        tokens = np.bincount(t, weights=n, minlength=T)
        if np.any(tokens > cfg.max_num_batched_tokens):
            return False
        demand = np.bincount(t, weights=new_blocks, minlength=T).astype(I64)
        released = np.bincount(t[at], weights=g_after[at], minlength=T).astype(I64)
        free_mid = self.free + np.concatenate(([0], np.cumsum(released - demand)[:-1]))
        after_sched = free_mid - demand
        if np.any(after_sched < 0):
            return False  # kv-budget
        free_end = after_sched + released
        admitted = np.bincount(t[starts & (status0 == WAITING)], minlength=T)
        fin_count = np.bincount(fin_t, minlength=T)
        running = self.running + np.cumsum(admitted) - np.concatenate(
            ([0], np.cumsum(fin_count)[:-1]))
        if np.any(running > cfg.max_num_seqs):
            return False
        reported = np.array([-1 if st.free_blocks is None else st.free_blocks for st in run],
                            dtype=I64)
        has = reported >= 0
        if np.any(reported[has] != free_end[has] - self.leaked):
            return False  # accounting (or a leak the spec's checker names)
        if head.preempted:  # every victim valid, the step within its blocks (else above)
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
        present = [st.new_blocks is not None for st in run]
        track = self.track_ids
        if track is None:
            track = present[0]
        if not all(present):
            if any(present):
                return False  # runs are cut where block ids come and go
            track = False
        assign: tuple[np.ndarray, np.ndarray] | None = None
        if track:
            assign = self._check_blocks(run, block_lists, ri, t, new_blocks, swapped_in, key,
                                        T, fin_ri, fin_t)
            if assign is None:
                return False

        # -- idle steps: nothing could have run (the run ends with such a step) -----
        # (checked after the commit, below, on the state at the run's end)

        # -- commit ----------------------------------------------------------------
        last = np.append(starts[1:], True) if E else starts
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
            for r in fin_ri.tolist():
                rid = ids[r]
                self.ended[rid] = Status.FINISHED
                ended.append(rid)
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
        self.step_no = run[-1].step
        self.report.steps += T
        self.report.scheduled_entries += E
        self.report.requests += n_new
        # The run ends with an idle step only when requests are live: nothing could run.
        return not (run[-1].idle and self.live > 0 and self._runnable())

    def _check_blocks(self, run: list[FastStep],
                      block_lists: tuple[list[str], list[Any], list[Any]], ri: np.ndarray,
                      t: np.ndarray, new_blocks: np.ndarray, swapped_in: dict[int, int],
                      key: np.ndarray, T: int, fin_ri: np.ndarray, fin_t: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray] | None:
        """Check the run's new_blocks: counts equal the blocks needed (plus H on swap-in),
        each id in range and free when given. Returns the (block, owner) assignments to
        commit, or None if the spec's checker must look."""
        E = ri.size
        names, lists, flat = block_lists
        sizes = np.fromiter((len(st.new_blocks or ()) for st in run), dtype=I64, count=T)
        K = len(names)
        try:
            owner = np.fromiter(map(self.index.__getitem__, names), dtype=I64, count=K)
        except KeyError:
            return None
        step_of = np.repeat(np.arange(T, dtype=I64), sizes)
        given = np.fromiter(map(len, lists), dtype=I64, count=K)
        B = len(flat)
        blocks = np.fromiter(flat, dtype=I64, count=B) if B else np.zeros(0, dtype=I64)
        if B and (blocks.min() < 0 or blocks.max() >= self.config.num_gpu_blocks):
            return None
        # Every id list belongs to an entry scheduled in that step; every entry gets
        # exactly its new blocks (and its host blocks back on swap-in).
        where = np.searchsorted(key, owner * T + step_of)
        if K and (np.any(where >= E) or np.any(key[np.minimum(where, E - 1)]
                                               != owner * T + step_of)):
            return None
        got = np.zeros(E, dtype=I64)
        got[where] = given
        expected = new_blocks.copy()
        for r, host in swapped_in.items():
            expected[(ri == r) & (t == 0)] += host
        if np.any(got != expected):
            return None
        if B == 0:
            return np.zeros(0, dtype=I64), np.zeros(0, dtype=I64)
        block_owner = np.repeat(owner, given)
        block_step = np.repeat(step_of, given)
        fin_order = np.argsort(fin_ri)
        fin_sorted, fin_steps = fin_ri[fin_order], fin_t[fin_order]

        def finish_at(requests: np.ndarray) -> np.ndarray:
            """The step of the run at which each request finishes, T if none."""
            if fin_sorted.size == 0:
                return np.full(requests.size, T, dtype=I64)
            pos = np.minimum(np.searchsorted(fin_sorted, requests), fin_sorted.size - 1)
            out: np.ndarray = np.where(fin_sorted[pos] == requests, fin_steps[pos], T)
            return out

        order = np.argsort(blocks * T + block_step, kind="stable")
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

    def _entries(self, run: list[FastStep]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Request index and token count of each scheduled entry of the run, in order,
        and the entries per step; None if they are not what parse_step accepts or name
        a request not known yet."""
        segments = [st.scheduled for st in run]
        cut = [x for x in segments if isinstance(x, bytes)]
        if len(cut) == len(segments):
            got = read_scheduled(cut, self.table)
            if got is not None:
                return got
        try:
            lists = [x if isinstance(x, list) else self.loads(x) for x in segments]
        except ValueError:
            return None
        if set(map(type, lists)) != {list}:
            return None
        T = len(run)
        lens = np.fromiter(map(len, lists), dtype=I64, count=T)
        E = int(lens.sum())
        pairs = list(chain.from_iterable(lists))
        if E and not (set(map(type, pairs)) == {list} and set(map(len, pairs)) == {2}):
            return None
        rids = list(map(_first, pairs))
        counts = list(map(_second, pairs))
        if E and not (set(map(type, rids)) == {str} and set(map(type, counts)) == {int}):
            return None
        try:
            ri_e = np.fromiter(map(self.index.__getitem__, rids), dtype=I64, count=E)
        except KeyError:
            return None
        n_e = np.fromiter(counts, dtype=I64, count=E)
        if E and np.abs(n_e).max() > MAX_COUNT:
            return None
        return ri_e, n_e, lens

    @staticmethod
    def _block_lists(run: list[FastStep]) -> tuple[list[str], list[Any], list[Any]] | None:
        """The run's new_blocks as (ids, their lists, every block id in order), if every
        list holds integers in 0..2**40 (parse_step's rule); else None."""
        maps = [st.new_blocks or {} for st in run]
        names = list(chain.from_iterable(maps))
        lists = list(chain.from_iterable(map(dict.values, maps)))
        if lists and set(map(type, lists)) != {list}:
            return None
        flat = list(chain.from_iterable(lists))
        if flat and (set(map(type, flat)) != {int} or min(flat) < 0 or max(flat) > MAX_COUNT):
            return None
        return names, lists, flat

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
    spec's checker ("exact"), and whether step 0 carries new_blocks ("block_ids") and
    some step reports free_blocks ("free_blocks"), as 1 or 0."""
    with no_cycle_collection():
        return _check(stream, loads, max_preemptions, run_steps, stats)


def _check(stream: IO[bytes], loads: Loads, max_preemptions: int, run_steps: int,
           stats: dict[str, int] | None) -> Report:
    lines = lines_of(stream)
    header = None
    for number, raw in lines:
        obj = exact_object(raw, number, loads)
        if obj is not None:
            header = parse_header(obj, number)
            break
    if header is None:
        raise TraceError(1, "empty file: expected a trace header line")
    vc = VectorizedChecker(header.config, max_preemptions)
    vc.loads = loads
    unknown: dict[str, int] = {}
    # Lines wait in `run` (fast) or `slow` (for the spec's parser); at most one of the two
    # is non-empty, so the lines are checked in order.
    run: list[FastStep] = []
    run_start = 0  # step number of run[0]
    run_entries = 0
    run_live = 0  # live requests at the end of `run`, if it is correct
    slow: list[tuple[int, Any]] = []
    slow_start = 0
    expected = 0  # the next step number, counting the lines waiting
    complete = False

    def flush() -> None:
        nonlocal run, run_entries, slow
        if run:
            if not vc.check_fast(run):
                vc.check_exactly([(st.line, st.raw) for st in run], run_start, unknown)
            run = []
            run_entries = 0
        if slow:
            vc.check_exactly(slow, slow_start, unknown)
            slow = []

    for number, raw in lines:
        if complete:
            if exact_object(raw, number, loads) is not None:
                raise TraceError(number, 'nothing may follow the {"end": true} line')
            continue
        cut = cut_scheduled(raw)
        st = None
        if cut is not None:
            try:
                st = parse_fast(loads(cut[0]), number, expected, raw, cut[1])
            except ValueError:
                st = None
        if st is None:
            try:
                obj = loads(raw)
            except ValueError:
                flush()
                obj = exact_object(raw, number, loads)  # raises, or the line is blank
                if obj is None:
                    continue
            if type(obj) is dict and obj.get("end") is True and "step" not in obj:
                flush()
                complete = True
                continue
            st = parse_fast(obj, number, expected, raw, None)
        else:
            obj = None
        if st is None:
            if run:
                flush()
            if not slow:
                slow_start = expected
            slow.append((number, obj))
            expected += 1  # if the line is bad, the spec's parser raises before it matters
            continue
        if slow:
            flush()
        for key in st.unknown_keys:
            if key not in unknown:
                unknown[key] = number
        vc.saw(st.step, st.new_blocks, st.free_blocks)
        # A run starts at a step with rare events and where block ids come or go.
        if run and (st.rare or (st.new_blocks is None) != (run[0].new_blocks is None)
                    or len(run) >= run_steps or run_entries >= RUN_ENTRIES):
            flush()
        if not run:
            run_start = expected
            run_live = vc.live
        run.append(st)
        run_entries += st.entries
        run_live += (len(st.arrivals) - len(st.finished) - len(st.aborted)
                     - len(st.rejected))
        expected += 1
        if st.idle and run_live > 0:
            flush()  # no-idle is checked on the state at the end of a run
    flush()
    report = vc.end(complete)
    report.unknown_keys = dict(unknown)
    if stats is not None:
        stats["fast"] = vc.fast_runs
        stats["exact"] = vc.exact_runs
        stats["block_ids"] = int(vc.first_step_blocks)
        stats["free_blocks"] = int(vc.any_free_blocks)
    return report
