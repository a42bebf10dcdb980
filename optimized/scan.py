"""A compiled reader for the step lines of a trace: the bytes of many lines in, columns out.

NOTE on the method. The vectorized checker spends its time reading, not checking: a
step line of a 256-sequence engine holds a hundred or more scheduled entries, and any
reader that builds Python objects for them (orjson included) or that makes several
numpy passes over the bytes costs more than all of the checking. This module reads
the lines in one pass, compiled by numba, straight into numpy columns.

It reads a strict subset of what the spec's reader accepts: a step object whose keys
are among step, arrivals, scheduled, finished, free_blocks, new_blocks and time_ms,
each at most once; ids of 1 to 16 printable ASCII bytes without escapes (so their
bytes are the string, and the id's key is those bytes as two little-endian words, as
`id_key` makes it); integers written plainly (no sign, except a priority's minus, no
leading zero, no fraction or exponent) and at most 2**40; JSON whitespace anywhere
between tokens. Such a line means exactly what `parse_step` makes of it, which the
tests check by fuzzing. Any other line (with aborts, rejections, preemptions or
swap-ins, unknown keys, escapes, long ids, a blank line, malformed JSON) is left to
the caller, which reads it with orjson and the spec's parser: the scanner marks it and
goes on with the next line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numba
import numpy as np

from kvsched.spec.model import MAX_COUNT

F = TypeVar("F", bound=Callable[..., Any])
I64 = np.int64


def compiled(fn: F) -> F:
    """numba's njit, cached on disk, with the function's own signature for mypy."""
    return cast(F, numba.njit(cache=True, nogil=True, boundscheck=False)(fn))


def _word(name: bytes) -> tuple[int, int]:
    raw = name + bytes(16 - len(name))
    return int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")


# Keys, as the scanner sees them (the bytes between the quotes, as two words).
STEP, ARRIVALS, SCHEDULED, FINISHED, FREE_BLOCKS, NEW_BLOCKS, TIME_MS = (
    _word(k) for k in (b"step", b"arrivals", b"scheduled", b"finished", b"free_blocks",
                       b"new_blocks", b"time_ms"))
A_ID, A_PROMPT, A_MAX, A_PRIORITY = (
    _word(k) for k in (b"id", b"prompt_len", b"max_tokens", b"priority"))
STEP_LO, STEP_HI = STEP
ARRIVALS_LO, ARRIVALS_HI = ARRIVALS
SCHEDULED_LO, SCHEDULED_HI = SCHEDULED
FINISHED_LO, FINISHED_HI = FINISHED
FREE_LO, FREE_HI = FREE_BLOCKS
NEW_LO, NEW_HI = NEW_BLOCKS
TIME_LO, TIME_HI = TIME_MS
ID_LO, ID_HI = A_ID
PROMPT_LO, PROMPT_HI = A_PROMPT
MAX_LO, MAX_HI = A_MAX
PRIORITY_LO, PRIORITY_HI = A_PRIORITY
LIMIT = MAX_COUNT

# Columns: rows of `lines` (one per line read), then the per-item arrays.
L_START, L_END, L_OK, L_STEP, L_FREE, L_BLOCKS, L_ARR, L_ENT, L_FIN, L_OWN = range(10)
LINE_COLS = 10


# Every line handed to `scan` ends with a newline (byte 10), which no rule below accepts
# (it is not JSON whitespace inside a line, a digit, or a byte of an id), so the loops
# stop at it without testing for the end of the line; `stop` tests guard the rest.
FULL = -2  # returned as the position when an output array is full


@compiled
def _space(b: np.ndarray, i: int) -> int:
    while b[i] == 32 or b[i] == 9 or b[i] == 13:
        i += 1
    return i


@compiled
def _string(b: np.ndarray, w: np.ndarray, i: int) -> tuple[int, int, int]:
    """A string of 1 to 16 plain bytes at i: (index after it, low word, high word);
    (-1, 0, 0) for anything else."""
    if b[i] != 34:
        return -1, 0, 0
    s = i + 1
    j = s
    while 32 <= b[j] <= 127 and b[j] != 34 and b[j] != 92:
        j += 1
    n = j - s
    if b[j] != 34 or n < 1 or n > 16:
        return -1, 0, 0
    if n < 8:
        return j + 1, w[s] & ((1 << (8 * n)) - 1), 0
    if n < 16:
        return j + 1, w[s], w[s + 8] & ((1 << (8 * (n - 8))) - 1)
    return j + 1, w[s], w[s + 8]


@compiled
def _natural(b: np.ndarray, i: int) -> tuple[int, int]:
    """A JSON integer without sign, at most 2**40: (index after it, value); (-1, 0)."""
    j = i
    v = 0
    while 48 <= b[j] <= 57:
        v = v * 10 + (b[j] - 48)
        j += 1
        if j - i > 13:
            return -1, 0
    if j == i or (b[i] == 48 and j - i > 1) or v > LIMIT:
        return -1, 0
    if b[j] == 46 or b[j] == 101 or b[j] == 69:
        return -1, 0
    return j, v


@compiled
def _integer(b: np.ndarray, i: int) -> tuple[int, int]:
    """_natural with an optional minus sign."""
    if b[i] == 45:
        j, v = _natural(b, i + 1)
        return j, -v
    return _natural(b, i)


@compiled
def _duration(b: np.ndarray, i: int) -> int:
    """A non-negative JSON number without exponent (time_ms): the index after it; -1."""
    j = i
    while 48 <= b[j] <= 57:
        j += 1
    if j == i or j - i > 15 or (b[i] == 48 and j - i > 1):
        return -1
    if b[j] == 46:
        j += 1
        f = j
        while 48 <= b[j] <= 57:
            j += 1
        if j == f:
            return -1
    if b[j] == 101 or b[j] == 69 or b[j] == 46:
        return -1
    return j


@compiled
def _after_item(b: np.ndarray, i: int, close: int) -> tuple[int, int]:
    """After an item of a list or object: (1, the next item's index) after a comma,
    (0, the index after it) at the closing byte `close`, (-1, 0) otherwise."""
    i = _space(b, i)
    if b[i] == 44:
        return 1, _space(b, i + 1)
    if b[i] == close:
        return 0, i + 1
    return -1, 0


@compiled
def _entries(b: np.ndarray, w: np.ndarray, i: int, ent: np.ndarray, ne: int
             ) -> tuple[int, int]:
    """The scheduled list at i (its "["): (index after it, entries written), position
    -1 if malformed, FULL if `ent` filled up. Written inline: the hot loop."""
    i = _space(b, i + 1)
    if b[i] == 93:
        return i + 1, ne
    cap = ent.shape[0]
    while True:
        if ne >= cap:
            return FULL, ne
        if b[i] != 91:
            return -1, ne
        i += 1
        while b[i] == 32 or b[i] == 9 or b[i] == 13:
            i += 1
        if b[i] != 34:
            return -1, ne
        s = i + 1
        j = s
        while 32 <= b[j] <= 127 and b[j] != 34 and b[j] != 92:
            j += 1
        n = j - s
        if b[j] != 34 or n < 1 or n > 16:
            return -1, ne
        if n < 8:
            lo = w[s] & ((1 << (8 * n)) - 1)
            hi = 0
        else:
            lo = w[s]
            hi = (w[s + 8] & ((1 << (8 * (n - 8))) - 1)) if n < 16 else w[s + 8]
        j += 1
        while b[j] == 32 or b[j] == 9 or b[j] == 13:
            j += 1
        if b[j] != 44:
            return -1, ne
        j += 1
        while b[j] == 32 or b[j] == 9 or b[j] == 13:
            j += 1
        d = j
        v = 0
        while 48 <= b[j] <= 57 and j - d < 14:
            v = v * 10 + (b[j] - 48)
            j += 1
        if j == d or j - d > 13 or (b[d] == 48 and j - d > 1) or v > LIMIT:
            return -1, ne
        while b[j] == 32 or b[j] == 9 or b[j] == 13:
            j += 1
        if b[j] != 93:
            return -1, ne
        ent[ne, 0] = lo
        ent[ne, 1] = hi
        ent[ne, 2] = v
        ne += 1
        j += 1
        while b[j] == 32 or b[j] == 9 or b[j] == 13:
            j += 1
        if b[j] == 44:
            i = _space(b, j + 1)
            continue
        if b[j] == 93:
            return j + 1, ne
        return -1, ne


@compiled
def _ids(b: np.ndarray, w: np.ndarray, i: int, out: np.ndarray, k: int) -> tuple[int, int]:
    """A list of ids at i (its "["), into out[k:]: (index after it, ids written)."""
    i = _space(b, i + 1)
    if b[i] == 93:
        return i + 1, k
    while True:
        if k >= out.shape[0]:
            return FULL, k
        i, lo, hi = _string(b, w, i)
        if i < 0:
            return -1, k
        out[k, 0] = lo
        out[k, 1] = hi
        k += 1
        more, i = _after_item(b, i, 93)
        if more <= 0:
            return i if more == 0 else -1, k


@compiled
def _new_blocks(b: np.ndarray, w: np.ndarray, i: int, own: np.ndarray, no: int,
                blocks: np.ndarray, nb: int) -> tuple[int, int, int]:
    """The new_blocks object at i (its "{"): (index after it, owners and block ids
    written). An owner named twice is left to JSON (which refuses it)."""
    i = _space(b, i + 1)
    if b[i] == 125:
        return i + 1, no, nb
    cap = blocks.shape[0]
    first_owner = no
    while True:
        if no >= own.shape[0]:
            return FULL, no, nb
        i, lo, hi = _string(b, w, i)
        if i < 0:
            return -1, no, nb
        for k in range(first_owner, no):
            if own[k, 0] == lo and own[k, 1] == hi:
                return -1, no, nb
        i = _space(b, i)
        if b[i] != 58:
            return -1, no, nb
        i = _space(b, i + 1)
        if b[i] != 91:
            return -1, no, nb
        i = _space(b, i + 1)
        first = nb
        if b[i] == 93:
            i += 1
        else:
            while True:
                if nb >= cap:
                    return FULL, no, nb
                d = i
                v = 0
                while 48 <= b[i] <= 57 and i - d < 14:
                    v = v * 10 + (b[i] - 48)
                    i += 1
                if i == d or i - d > 13 or (b[d] == 48 and i - d > 1) or v > LIMIT:
                    return -1, no, nb
                blocks[nb] = v
                nb += 1
                while b[i] == 32 or b[i] == 9 or b[i] == 13:
                    i += 1
                if b[i] == 44:
                    i = _space(b, i + 1)
                    continue
                if b[i] == 93:
                    i += 1
                    break
                return -1, no, nb
        own[no, 0] = lo
        own[no, 1] = hi
        own[no, 2] = nb - first
        no += 1
        more, i = _after_item(b, i, 125)
        if more <= 0:
            return i if more == 0 else -1, no, nb


@compiled
def _arrivals(b: np.ndarray, w: np.ndarray, i: int, arr: np.ndarray, na: int
              ) -> tuple[int, int]:
    """The arrivals list at i (its "["): (index after it, arrivals written)."""
    i = _space(b, i + 1)
    if b[i] == 93:
        return i + 1, na
    while True:
        if na >= arr.shape[0]:
            return FULL, na
        if b[i] != 123:
            return -1, na
        i = _space(b, i + 1)
        fields = 0
        priority = prompt = max_tokens = 0
        lo = hi = id_start = id_end = 0
        while True:
            i, flo, fhi = _string(b, w, i)
            if i < 0:
                return -1, na
            i = _space(b, i)
            if b[i] != 58:
                return -1, na
            i = _space(b, i + 1)
            if flo == ID_LO and fhi == ID_HI and not fields & 1:
                fields |= 1
                id_start = i + 1
                i, lo, hi = _string(b, w, i)
                id_end = i - 1
            elif flo == PROMPT_LO and fhi == PROMPT_HI and not fields & 2:
                fields |= 2
                i, prompt = _natural(b, i)
                if prompt < 1:
                    i = -1
            elif flo == MAX_LO and fhi == MAX_HI and not fields & 4:
                fields |= 4
                i, max_tokens = _natural(b, i)
                if max_tokens < 1:
                    i = -1
            elif flo == PRIORITY_LO and fhi == PRIORITY_HI and not fields & 8:
                fields |= 8
                i, priority = _integer(b, i)
            else:
                i = -1  # an unknown or repeated field
            if i < 0:
                return -1, na
            more, i = _after_item(b, i, 125)
            if more < 0:
                return -1, na
            if more == 0:
                break
        if fields & 7 != 7:
            return -1, na
        a = arr[na]
        a[0] = lo
        a[1] = hi
        a[2] = id_start
        a[3] = id_end
        a[4] = prompt
        a[5] = max_tokens
        a[6] = priority
        na += 1
        more, i = _after_item(b, i, 93)
        if more <= 0:
            return i if more == 0 else -1, na


@compiled
def scan(b: np.ndarray, w: np.ndarray, pos: int, end: int, lines: np.ndarray,
         arr: np.ndarray, ent: np.ndarray, fin: np.ndarray, own: np.ndarray,
         blocks: np.ndarray) -> tuple[int, int, int, int, int, int, int]:
    """Read the lines of b[pos:end] (each ending in a newline) until one of the output
    arrays is full (a line that alone overfills one is left unread, L_OK 0); b goes on
    for 16 bytes past `end`, and w[k] is the 8 bytes from b[k] on (see `Block`).

    Returns (position reached, lines, arrivals, entries, finishes, owners, block ids)
    written. Row k of `lines` gets the line's start and end (its newline), whether it
    was read (L_OK), and if so its step, free_blocks (-1 if absent), whether it has
    new_blocks, and its numbers of arrivals, entries, finishes and new_blocks owners;
    arr rows are (lo, hi, id start, id end, prompt_len, max_tokens, priority), ent rows
    (lo, hi, tokens), fin rows (lo, hi), own rows (lo, hi, number of block ids), blocks
    the ids."""
    nl = na = ne = nf = no = nb = 0
    while pos < end and nl < lines.shape[0]:
        stop = pos
        while b[stop] != 10:
            stop += 1
        row = lines[nl]
        row[L_START] = pos
        row[L_END] = stop
        row[L_OK] = 0
        na0, ne0, nf0, no0, nb0 = na, ne, nf, no, nb
        seen = 0
        step = free = -1
        has_blocks = 0
        i = _space(b, pos)
        if b[i] == 123:
            i = _space(b, i + 1)
            if b[i] == 125:
                i = -1  # {}: no step
        else:
            i = -1
        while i >= 0:
            i, klo, khi = _string(b, w, i)
            if i < 0:
                break
            i = _space(b, i)
            if b[i] != 58:
                i = -1
                break
            i = _space(b, i + 1)
            if klo == STEP_LO and khi == STEP_HI and not seen & 1:
                seen |= 1
                i, step = _natural(b, i)
            elif klo == SCHEDULED_LO and khi == SCHEDULED_HI and not seen & 2:
                seen |= 2
                i, ne = _entries(b, w, i, ent, ne) if b[i] == 91 else (-1, ne)
            elif klo == FINISHED_LO and khi == FINISHED_HI and not seen & 4:
                seen |= 4
                i, nf = _ids(b, w, i, fin, nf) if b[i] == 91 else (-1, nf)
            elif klo == FREE_LO and khi == FREE_HI and not seen & 8:
                seen |= 8
                i, free = _natural(b, i)
            elif klo == NEW_LO and khi == NEW_HI and not seen & 16:
                seen |= 16
                has_blocks = 1
                if b[i] == 123:
                    i, no, nb = _new_blocks(b, w, i, own, no, blocks, nb)
                else:
                    i = -1
            elif klo == ARRIVALS_LO and khi == ARRIVALS_HI and not seen & 32:
                seen |= 32
                i, na = _arrivals(b, w, i, arr, na) if b[i] == 91 else (-1, na)
            elif klo == TIME_LO and khi == TIME_HI and not seen & 64:
                seen |= 64
                i = _duration(b, i)
            else:
                i = -1  # a key the scanner leaves to the spec's parser, or repeated
            if i < 0:
                break
            i = _space(b, i)
            if b[i] == 44:
                i = _space(b, i + 1)
                continue
            if b[i] == 125:
                i = _space(b, i + 1)
                if i != stop or not seen & 1:
                    i = -1
            else:
                i = -1
            break
        if i == stop:
            row[L_OK] = 1
            row[L_STEP] = step
            row[L_FREE] = free
            row[L_BLOCKS] = has_blocks
            row[L_ARR] = na - na0
            row[L_ENT] = ne - ne0
            row[L_FIN] = nf - nf0
            row[L_OWN] = no - no0
        else:
            full = i == FULL
            na, ne, nf, no, nb = na0, ne0, nf0, no0, nb0
            for col in range(L_STEP, LINE_COLS):
                row[col] = 0
            if full and nl > 0:
                break  # read this line again with empty arrays (the caller's next call)
        nl += 1
        pos = stop + 1
    return pos, nl, na, ne, nf, no, nb


K1 = np.uint64(0x9E3779B97F4A7C15)
K2 = np.uint64(0xC2B2AE3D27D4EB4F)


@compiled
def lookup(lo: np.ndarray, hi: np.ndarray, table_lo: np.ndarray, table_hi: np.ndarray,
           table_ri: np.ndarray, bits: int, out: np.ndarray) -> None:
    """out[e] = the request index of key (lo[e], hi[e]) in an open-addressing table with
    linear probing (see kvsched.optimized.ids.IdTable), -1 where it is not there."""
    mask = (1 << bits) - 1
    shift = np.uint64(64 - bits)
    for e in range(lo.shape[0]):
        klo = np.uint64(lo[e])
        khi = np.uint64(hi[e])
        at = np.int64(((klo * K1) ^ (khi * K2)) >> shift)
        found = -1
        while table_ri[at] >= 0:
            if table_lo[at] == klo and table_hi[at] == khi:
                found = table_ri[at]
                break
            at = (at + 1) & mask
        out[e] = found


class Block:
    """Whole lines, data[:size], with room for `scan` to read 16 bytes past them, and its
    two views of them."""

    PAD = 16

    def __init__(self, data: bytearray, size: int, last: bool = False) -> None:
        self.size = size
        if len(data) < size + self.PAD:
            data += bytes(size + self.PAD - len(data))
        self.data = data
        self.last = last  # the trace's last line, without its newline
        self.bytes = np.frombuffer(data, dtype=np.uint8)
        self.words = np.ndarray(shape=(len(data) - 8,), dtype="<i8", buffer=data,
                                strides=(1,))


@dataclass
class Scanned:
    """What one call of `scan` read, trimmed to what was written (views of the buffers,
    valid until the next call)."""

    end: int  # the position reached in the block
    lines: np.ndarray
    arr: np.ndarray
    ent: np.ndarray
    fin: np.ndarray
    own: np.ndarray
    blocks: np.ndarray


class Scanner:
    """Output buffers for `scan`, reused from call to call."""

    def __init__(self, lines: int = 1 << 14, entries: int = 1 << 20) -> None:
        self.lines = np.empty((lines, LINE_COLS), dtype=I64)
        self.arr = np.empty((max(lines, 1024), 7), dtype=I64)
        self.ent = np.empty((entries, 3), dtype=I64)
        self.fin = np.empty((max(lines, 1024), 2), dtype=I64)
        self.own = np.empty((entries // 4, 3), dtype=I64)
        self.blocks = np.empty(entries, dtype=I64)

    def __call__(self, block: Block, pos: int, end: int) -> Scanned:
        """Read the lines of block[pos:end]; `end` is just past a newline."""
        reached, nl, na, ne, nf, no, nb = scan(block.bytes, block.words, pos, end,
                                               self.lines, self.arr, self.ent, self.fin,
                                               self.own, self.blocks)
        return Scanned(reached, self.lines[:nl], self.arr[:na], self.ent[:ne],
                       self.fin[:nf], self.own[:no], self.blocks[:nb])


# -- primitives numpy lacks: groups and per-request chains ---------------------------

@compiled
def segments(keys: np.ndarray, starts: np.ndarray, first: np.ndarray) -> None:
    """For a sorted key array: whether each element starts a group, and the index of its
    group's first element."""
    head = 0
    for e in range(keys.shape[0]):
        if e == 0 or keys[e] != keys[e - 1]:
            head = e
            starts[e] = True
        else:
            starts[e] = False
        first[e] = head


# -- requests' entries across the steps of a run ----------------------------------------
# A run's scheduled entries are kept in step order; these link each entry to the
# previous and next entry of the same request, so that per-request running sums need
# no sort.

@compiled
def chain(ri: np.ndarray, t: np.ndarray, low: int, span: int, prev: np.ndarray,
          nxt: np.ndarray) -> bool:
    """prev[e] / nxt[e]: the previous / next entry of request ri[e] (-1 if none), for
    request indices in low..low+span-1. Returns whether some request has two entries in
    one step (t is each entry's step)."""
    last = np.full(span, -1, dtype=np.int64)
    twice = False
    for e in range(ri.shape[0]):
        k = ri[e] - low
        p = last[k]
        prev[e] = p
        nxt[e] = -1
        if p >= 0:
            nxt[p] = e
            if t[p] == t[e]:
                twice = True
        last[k] = e
    return twice


@compiled
def chain_exclusive(prev: np.ndarray, values: np.ndarray, out: np.ndarray) -> None:
    """out[e] = the sum of values over the earlier entries of e's request."""
    for e in range(prev.shape[0]):
        p = prev[e]
        out[e] = out[p] + values[p] if p >= 0 else 0


@compiled
def entry_of(ri: np.ndarray, per_step: np.ndarray, low: int, span: int, q: np.ndarray,
             q_per_step: np.ndarray, out: np.ndarray) -> None:
    """out[k] = the entry of request q[k] in q's step (-1 if it has none); entries and
    queries are in step order, per_step and q_per_step their numbers per step."""
    where = np.full(span, -1, dtype=np.int64)
    stamp = np.full(span, -1, dtype=np.int64)
    e = 0
    k = 0
    for step in range(per_step.shape[0]):
        for _ in range(per_step[step]):
            x = ri[e] - low
            where[x] = e
            stamp[x] = step
            e += 1
        for _ in range(q_per_step[step]):
            x = q[k] - low
            out[k] = where[x] if 0 <= x < span and stamp[x] == step else -1
            k += 1
