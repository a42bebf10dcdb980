"""Workloads: the requests a simulation feeds a scheduler, and their JSONL file format.

A workload file has one JSON object per line:
    {"id": "r0", "arrival": 0, "prompt_len": 120, "output_len": 40, "max_tokens": 64,
     "priority": 0}
with an optional "abort" step (the client cancels then; no earlier than its arrival,
in whose step it may fall). `output_len` is where the
model would emit end-of-sequence; it is hidden from the scheduler.

An optional "prefix": {"id": "sys-1", "len": 96} says the prompt starts with the first
96 tokens of the content "sys-1" (what prefix caching can share). When the id names
another request of the workload, arriving no later, the content is that request's
whole sequence, prompt then outputs (a conversation's next turn), and so nests:
`validate` resolves each request's prefix into the chain of shared contents
(kvsched.spec.prefix) its scheduler sees as `Request.prefix`. A prefix leaves at least
one token of the prompt the request's own. A resolved request keeps a link to the request
it names, not a copy of that one's chain: a conversation of n turns holds n links, and
each chain is made when its request arrives (`WorkItem.shared`).

A line of a workload file is at most MAX_LINE_BYTES long, as a trace's line is: the file
is read a line at a time, and a longer line is refused after that much is read.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvsched.spec.model import MAX_COUNT, Request
from kvsched.spec.prefix import Prefix, nested
from kvsched.spec.trace import MAX_LINE_BYTES

FIELDS = ("id", "arrival", "prompt_len", "output_len", "max_tokens", "priority", "abort",
          "prefix")
REQUIRED = ("id", "arrival", "prompt_len", "output_len", "max_tokens")


class WorkloadError(ValueError):
    """Malformed workload input; str() is one line naming the place and the problem."""


# The latest step a workload may name (an arrival or an abort): the simulation writes a
# trace line for every step up to it, so a far-off step is refused rather than written.
MAX_STEP = 10_000_000


# The chains made last (`WorkItem.shared`), by their request's identity: a conversation's
# next turn extends its previous turn's chain rather than walk the whole conversation.
# A few, so that memory stays linear in the requests.
CHAINS_KEPT = 64
_CHAINS: OrderedDict[int, tuple[WorkItem, Prefix]] = OrderedDict()


@dataclass(frozen=True)
class Source:
    """The request of the workload that a resolved prefix names (None: a content no
    request is)."""

    item: WorkItem | None


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
    prefix: tuple[str, int] | None = None  # (content id, tokens) the prompt starts with
    # How `validate` resolved the prefix: None (not resolved), or the request it names
    # (Source(None): a content no request of the workload is).
    source: Source | None = field(default=None, compare=False, repr=False)

    @property
    def shared(self) -> Prefix:
        """The prefix resolved by `validate`, nested contents included (() unresolved):
        kvsched.spec.prefix.nested folded from the first request of the chain, or from
        the nearest one whose chain was made lately (a conversation's previous turn)."""
        path = []
        chain: Prefix = ()
        item: WorkItem | None = self
        while item is not None and item.source is not None and item.prefix is not None:
            made = _CHAINS.get(id(item))
            if made is not None and made[0] is item:
                chain = made[1]
                break
            path.append(item.prefix)
            item = item.source.item
        if len(path) == 1:  # a turn after one whose chain was made lately
            chain = nested(chain, *path[0])
        elif path:
            # nested's fold in one pass: each content cut to the shortest length taken
            # after it (a validated chain names no content twice, so each is appended).
            cut = MAX_COUNT
            top = []
            for content, length in path:
                cut = min(cut, length)
                top.append((content, cut))
            chain = (*(p if p[1] <= cut else (p[0], cut) for p in chain), *reversed(top))
        if path:
            _CHAINS[id(self)] = (self, chain)
            if len(_CHAINS) > CHAINS_KEPT:
                _CHAINS.popitem(last=False)
        return chain

    def request(self, step: int) -> Request:
        return Request(self.id, self.prompt_len, self.max_tokens, self.priority, step,
                       self.shared)

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
        elif self.abort is not None and not out and self.abort < self.arrival:
            # No client cancels what it has not sent: an abort before its arrival is a
            # mistake in the file, not a request that never runs.
            out.append(f"abort of {self.id!r} is step {self.abort}, before its arrival at "
                       f"step {self.arrival}")
        if self.prefix is not None:
            content, length = self.prefix
            if not isinstance(content, str) or not content:
                out.append(f"prefix id of {self.id!r} must be a non-empty string, "
                           f"got {content!r}")
            elif not isinstance(length, int) or isinstance(length, bool) or length < 1:
                out.append(f"prefix len of {self.id!r} must be a positive integer, "
                           f"got {length!r}")
            elif isinstance(self.prompt_len, int) and length >= self.prompt_len:
                out.append(f"prefix of {self.id!r} covers {length} tokens of its "
                           f"{self.prompt_len}-token prompt; at least one must be its own")
            elif content == self.id:
                out.append(f"prefix of {self.id!r} names the request itself")
        for name in ("arrival", "abort"):
            v = getattr(self, name)
            if not out and v is not None and v > MAX_STEP:
                out.append(f"{name} of {self.id!r} is step {v}, more than {MAX_STEP:,} steps "
                           "away: a simulation writes one trace line per step, idle or not")
        return out


def validate(items: Iterable[WorkItem]) -> list[WorkItem]:
    """The workload in arrival order, checked, each prefix resolved (`WorkItem.shared`)."""
    out = list(items)
    seen: set[str] = set()
    for item in out:
        problems = item.problems()
        if problems:
            raise WorkloadError(problems[0])
        if item.id in seen:
            raise WorkloadError(f"request id {item.id!r} appears twice")
        seen.add(item.id)
    ordered = sorted(out, key=lambda w: w.arrival)
    resolved: dict[str, WorkItem] = {}
    for i, item in enumerate(ordered):
        if item.prefix is not None:
            ordered[i] = item = replace(item, source=_resolve(item, resolved, seen))
        resolved[item.id] = item
    return ordered


def _resolve(item: WorkItem, earlier: dict[str, WorkItem], ids: set[str]) -> Source:
    """The request `item`'s prefix names, among those `earlier`, checked."""
    assert item.prefix is not None
    content, length = item.prefix
    source = earlier.get(content)
    if source is None:
        if content in ids:
            raise WorkloadError(f"prefix of {item.id!r} names {content!r}, which arrives "
                                "after it")
        return Source(None)
    whole = source.prompt_len + source.output_len
    if length > whole:
        raise WorkloadError(f"prefix of {item.id!r} takes {length} tokens of {content!r}, "
                            f"whose whole sequence is {whole} tokens")
    return Source(source)


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
    prefix = obj.get("prefix")
    if prefix is not None:
        if not isinstance(prefix, dict) or set(prefix) != {"id", "len"}:
            raise WorkloadError(f'{where}: prefix must be an object {{"id": ..., "len": ...}}')
        prefix = (prefix["id"], prefix["len"])
    item = WorkItem(obj["id"], obj["arrival"], obj["prompt_len"], obj["output_len"],
                    obj["max_tokens"], obj.get("priority", 0), obj.get("abort"), prefix)
    problems = item.problems()
    if problems:
        raise WorkloadError(f"{where}: {problems[0]}")
    return item


def read_workload(path: Path) -> list[WorkItem]:
    """The workload file at `path`, checked (`validate`), read a line at a time."""
    items = []
    try:
        with path.open("rb") as stream:
            number = 0
            while raw := stream.readline(MAX_LINE_BYTES + 2):
                number += 1
                if len(raw) - raw.endswith(b"\n") > MAX_LINE_BYTES:
                    raise WorkloadError(f"{path}:{number}: the line is longer than "
                                        f"{MAX_LINE_BYTES // (1024 * 1024)} MiB (the longest "
                                        "line a workload may have)")
                if raw.strip():
                    items.append(parse_item(_json_line(raw, f"{path}:{number}"),
                                            f"{path}:{number}"))
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read ({e.strerror})") from None
    if not items:
        raise WorkloadError(f"{path}: empty workload: expected one request per line")
    try:
        return validate(items)
    except WorkloadError as e:
        raise WorkloadError(f"{path}: {e}") from None


def _json_line(raw: bytes, where: str) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise WorkloadError(f"{where}: not UTF-8") from None
    except ValueError:
        raise WorkloadError(f"{where}: malformed JSON") from None
    except RecursionError:
        raise WorkloadError(f"{where}: JSON nested too deeply") from None


def item_dict(item: WorkItem) -> dict[str, Any]:
    d: dict[str, Any] = {name: getattr(item, name) for name in FIELDS}
    if d["abort"] is None:
        del d["abort"]
    if item.prefix is None:
        del d["prefix"]
    else:
        d["prefix"] = {"id": item.prefix[0], "len": item.prefix[1]}
    return d
