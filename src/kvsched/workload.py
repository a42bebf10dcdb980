"""Workloads: the requests a simulation feeds a scheduler, and their JSONL file format.

A workload file has one JSON object per line:
    {"id": "r0", "arrival": 0, "prompt_len": 120, "output_len": 40, "max_tokens": 64,
     "priority": 0}
with an optional "abort" step (the client cancels then). `output_len` is where the
model would emit end-of-sequence; it is hidden from the scheduler.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvsched.spec.model import MAX_COUNT, Request

FIELDS = ("id", "arrival", "prompt_len", "output_len", "max_tokens", "priority", "abort")
REQUIRED = ("id", "arrival", "prompt_len", "output_len", "max_tokens")


class WorkloadError(ValueError):
    """Malformed workload input; str() is one line naming the place and the problem."""


# The latest step a workload may name (an arrival or an abort): the simulation writes a
# trace line for every step up to it, so a far-off step is refused rather than written.
MAX_STEP = 10_000_000


@dataclass(frozen=True)
class WorkItem:
    """One request of a workload, with what only the simulation knows."""

    id: str
    arrival: int
    prompt_len: int
    output_len: int
    max_tokens: int
    priority: int = 0
    abort: int | None = None

    def request(self, step: int) -> Request:
        return Request(self.id, self.prompt_len, self.max_tokens, self.priority, step)

    def problems(self) -> list[str]:
        out = []
        for name in ("arrival", "prompt_len", "output_len", "max_tokens", "priority"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                out.append(f"{name} of {self.id!r} must be an integer, got {v!r}")
            elif abs(v) > MAX_COUNT:
                out.append(f"{name} of {self.id!r} is absurdly large ({v})")
            elif name != "priority" and v < (0 if name == "arrival" else 1):
                out.append(f"{name} of {self.id!r} must be at least "
                           f"{0 if name == 'arrival' else 1}, got {v}")
        if self.abort is not None and (not isinstance(self.abort, int)
                                       or isinstance(self.abort, bool) or self.abort < 0):
            out.append(f"abort of {self.id!r} must be a step number, got {self.abort!r}")
        for name in ("arrival", "abort"):
            v = getattr(self, name)
            if not out and v is not None and v > MAX_STEP:
                out.append(f"{name} of {self.id!r} is step {v}, more than {MAX_STEP:,} steps "
                           "away: a simulation writes one trace line per step, idle or not")
        return out


def validate(items: Iterable[WorkItem]) -> list[WorkItem]:
    out = list(items)
    seen: set[str] = set()
    for item in out:
        problems = item.problems()
        if problems:
            raise WorkloadError(problems[0])
        if item.id in seen:
            raise WorkloadError(f"request id {item.id!r} appears twice")
        seen.add(item.id)
    return sorted(out, key=lambda w: w.arrival)


def parse_item(obj: Any, where: str) -> WorkItem:
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: expected a JSON object")
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise WorkloadError(f"{where}: unknown field {unknown[0]!r}; fields are "
                            f"{', '.join(FIELDS)}")
    for key in REQUIRED:
        if key not in obj:
            raise WorkloadError(f"{where}: missing field {key!r}")
    if not isinstance(obj["id"], str) or not obj["id"]:
        raise WorkloadError(f"{where}: id must be a non-empty string")
    item = WorkItem(obj["id"], obj["arrival"], obj["prompt_len"], obj["output_len"],
                    obj["max_tokens"], obj.get("priority", 0), obj.get("abort"))
    problems = item.problems()
    if problems:
        raise WorkloadError(f"{where}: {problems[0]}")
    return item


def read_workload(path: Path) -> list[WorkItem]:
    items = []
    try:
        data = path.read_bytes()
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read ({e.strerror})") from None
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise WorkloadError(f"{path}:{number}: not UTF-8") from None
        except ValueError:
            raise WorkloadError(f"{path}:{number}: malformed JSON") from None
        items.append(parse_item(obj, f"{path}:{number}"))
    if not items:
        raise WorkloadError(f"{path}: empty workload: expected one request per line")
    try:
        return validate(items)
    except WorkloadError as e:
        raise WorkloadError(f"{path}: {e}") from None


def item_dict(item: WorkItem) -> dict[str, Any]:
    d = asdict(item)
    if d["abort"] is None:
        del d["abort"]
    return d

