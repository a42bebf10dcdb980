"""Runs of steps as columns: the step lines a run holds, from either reader, as numpy
columns per step, then per arrival, scheduled entry, finish, new_blocks owner and block
id, ready for the vectorized rules (kvsched.optimized.kernel)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvsched.optimized import scan as sc
from kvsched.optimized.ids import id_key
from kvsched.optimized.lines import FastStep

I64 = np.int64

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
    read: FastStep | None = None  # the line, when it was read as JSON (part_of_step)


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
        lambda: [(st.line, st.raw)], st if st.rare else None, st)


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
