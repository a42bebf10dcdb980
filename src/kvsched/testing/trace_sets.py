"""Sets of traces for checking many at once (the tests and the benchmark of `kvsched
check` on Ray): the seeded bugs' traces, which break the bug's invariant, their correct
schedulers' traces, which are clean, and malformed ones.
"""

from __future__ import annotations

import gzip
import io
from pathlib import Path

from kvsched.spec.trace import TraceWriter
from kvsched.testing.seeded_bugs import SEEDED_BUGS

# Seeded bugs whose expected invariant is the first failure of their own trace.
BROKEN = ("over-admit-by-one-block", "token-budget-off-by-one", "seq-limit-ignored",
          "finished-blocks-not-freed", "victim-blocks-not-freed", "chunk-past-known-tokens")
# Seeded bugs whose correct scheduler's trace is clean and not trivially short.
CLEAN = ("over-admit-by-one-block", "swap-out-beyond-host", "feasible-request-rejected")


def write_trace(path: Path, bug: str, *, reference: bool = False) -> Path:
    """The seeded bug's complete trace at `path` (gzip-compressed when it ends in .gz);
    with `reference`, the trace of the scheduler the bug was planted in."""
    seeded = SEEDED_BUGS[bug]
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    writer = TraceWriter(buffer)
    writer.header(seeded.config)
    for rec in seeded.simulate(seeded.reference() if reference else None):
        writer.step(rec)
    writer.end()
    data = buffer.getvalue()
    path.write_bytes(gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)
    return path


def mixed_set(root: Path) -> Path:
    """Under `root`: the broken traces in broken/, the clean ones gzip-compressed in
    clean/, two malformed ones at the top, and two files that are not traces."""
    for bug in BROKEN:
        write_trace(root / "broken" / f"{bug}.jsonl", bug)
    for bug in CLEAN:
        write_trace(root / "clean" / f"{bug}.jsonl.gz", bug, reference=True)
    (root / "malformed.jsonl").write_text("not json\n")
    (root / "no-header.jsonl").write_text('{"step": 0}\n')
    (root / "README.md").write_text("not a trace\n")
    (root / "clean" / "notes.txt").write_text("not a trace\n")
    return root
