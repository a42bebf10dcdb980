"""The vectorized checker's replay state: the spec checker's bookkeeping (docs/spec.md
section 2: N, C, G, H of each request, free GPU and host blocks, running requests) as
numpy columns, one row per request the trace has named, live or ended.

A run checked by the vectorized rules changes the columns through `set`, which logs the
old values, so that a run left to the spec's checker can be undone (`mark`, `rollback`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from kvsched.optimized.ids import IdTable
from kvsched.optimized.runs import EMPTY, Ids, Run
from kvsched.spec.model import Config, Request, Status

I64 = np.int64
WAITING, RUNNING, SWAPPED, FINISHED, ABORTED, REJECTED = range(6)
STATUS_OF = [Status.WAITING, Status.RUNNING, Status.SWAPPED, Status.FINISHED, Status.ABORTED,
             Status.REJECTED]
CODE_OF = {s: i for i, s in enumerate(STATUS_OF)}

Undo = list[tuple[np.ndarray, Any, Any]]  # (column, where, old values), undone in reverse


class Mark(NamedTuple):
    """Where the state stood before a run, to go back to if the run is left to the spec's
    checker."""

    free: int
    free_host: int
    running: int
    leaked: int
    ids_seen: bool
    ids_missing_from: int
    steps_with_free: int
    step_no: int
    live: int
    n_ids: int
    table: tuple[int, int]


class Columns:
    """The replay state. `cols[name][ri]` is request ri's: P, O, PRIO (its prompt_len,
    max_tokens and priority), ARR (arrival step), N, C, G, H, PRE (preemptions), GEN (one
    more each time it gives its GPU blocks back), STATUS (a code of STATUS_OF), RECOMP (a
    recompute victim whose new first chunk is not yet seen), LIMIT (min(P + O,
    max_model_len)). `holder[b]` is the request that holds block b, while
    `holder_gen[b]` equals that request's GEN (when the trace carries block ids)."""

    NAMES = ("P", "O", "PRIO", "ARR", "N", "C", "G", "H", "PRE", "GEN", "STATUS", "RECOMP",
             "LIMIT")

    def __init__(self, config: Config) -> None:
        self.config = config
        self.ids: list[str] = []
        self.index: dict[str, int] = {}
        self.table = IdTable()
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
        self.ids_seen = False  # some step carried new_blocks
        self.ids_missing_from = -1  # the first step that handed out blocks without ids
        self.steps_with_free = 0  # steps that report free_blocks
        self.step_no = -1
        self.live = 0  # live requests

    def _grow(self, at_least: int) -> None:
        new = max(at_least, 2 * self.capacity, 1024)
        for name in self.NAMES:
            col = np.zeros(new, dtype=I64)
            if name in self.cols:
                col[:self.capacity] = self.cols[name][:self.capacity]
            self.cols[name] = col
        self.capacity = new

    def register(self, requests: list[Request]) -> int:
        """Give the requests the next indices (in order); returns the first."""
        numbers = np.array([(r.prompt_len, r.max_tokens, r.priority) for r in requests],
                           dtype=I64).reshape(-1, 3)
        arrival = np.array([r.arrival_step for r in requests], dtype=I64)
        return self.register_columns([r.id for r in requests], None, numbers, arrival)

    def register_columns(self, names: list[str], keys: np.ndarray | None,
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

    def resolve(self, ids: Ids) -> np.ndarray:
        """Request indices of ids (keys or strings), -1 for ids not known."""
        if isinstance(ids, np.ndarray):
            return self.table.find(ids) if ids.shape[0] else EMPTY
        get = self.index.get
        return np.fromiter((get(r, -1) for r in ids), dtype=I64, count=len(ids))

    def resolve_all(self, run: Run, name: str) -> np.ndarray:
        """`resolve` of the ids in column `name` of each of the run's parts, joined."""
        got = [self.resolve(getattr(x, name)) for x in run.parts]
        return got[0] if len(got) == 1 else np.concatenate(got)

    def live_indices(self) -> np.ndarray:
        n = len(self.ids)
        return np.flatnonzero(self.cols["STATUS"][:n] <= SWAPPED)

    # -- changes that can be undone ---------------------------------------------------

    def set(self, undo: Undo, name: str, idx: Any, value: Any) -> None:
        arr = self.cols[name]
        undo.append((arr, idx, np.copy(arr[idx])))
        arr[idx] = value

    def mark(self) -> Mark:
        return Mark(self.free, self.free_host, self.running, self.leaked, self.ids_seen,
                    self.ids_missing_from, self.steps_with_free, self.step_no, self.live,
                    len(self.ids), self.table.mark())

    def rollback(self, mark: Mark, undo: Undo) -> None:
        """Back to `mark`: `undo` holds the column changes made since."""
        for arr, idx, old in reversed(undo):
            arr[idx] = old
        for rid in self.ids[mark.n_ids:]:
            del self.index[rid]
        del self.ids[mark.n_ids:]
        if not self.table.rollback(mark.table):
            self.table = IdTable()
            for ri, rid in enumerate(self.ids):
                self.table.add(rid, ri)
            self.table.mark()
        (self.free, self.free_host, self.running, self.leaked, self.ids_seen,
         self.ids_missing_from, self.steps_with_free, self.step_no, self.live) = mark[:9]
