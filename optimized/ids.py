"""Request ids as keys: an id of at most 16 plain ASCII bytes is its own key (two 64-bit
words, no hashing), found in an open-addressing table by the compiled `scan.lookup`, so
the scanner's ids are never decoded into strings."""

from __future__ import annotations

import numpy as np

from kvsched.optimized import scan as sc

I64 = np.int64
U64 = np.uint64

K1, K2 = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F  # mix a key into its home slot


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
