"""Trace format version 1 (docs/trace-format.md): JSON Lines, read and written as a stream.

A reader holds one line at a time; malformed input raises TraceError naming
the line and what was expected. Unknown keys are ignored (engines may add their
own) but remembered, so a checker can mention them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import IO, Any

from kvsched.spec.model import (
    MAX_COUNT,
    OPTIONAL_CONFIG,
    VICTIM_MODES,
    Config,
    Preemption,
    Rejection,
    Request,
    StepRecord,
    config_field_names,
)

VERSION = 1
# The longest line a reader takes, in bytes without its newline: a longer one is
# malformed input, found without reading much more of it (a step of a 65,536-request
# batch is about 2 MB).
MAX_LINE_BYTES = 64 * 1024 * 1024
UTF8_BOM = b"\xef\xbb\xbf"
STEP_KEYS = frozenset({"step", "arrivals", "aborted", "rejected", "preempted", "swapped_in",
                       "scheduled", "finished", "free_blocks", "new_blocks", "time_ms",
                       "prefix_hits", "block_keys", "dedup", "released", "reclaimed",
                       "unsampled"})
HEADER_KEYS = frozenset({"kvsched", "version", "engine", "config", "preempted_order",
                         "settings"})
# The step keys each engine's adapter (kvsched.adapters) adds to trace v1's, by the
# header's engine name: known, so that kvsched's own traces get no "ignored unknown
# keys" note (vLLM V0's free swap blocks; SGLang's step mode, its free and evictable
# page counts, the new-token ratio its admission used, the finishes that were aborts;
# LMDeploy's forward kind, its block manager's free and its trie's evictable counts, its
# void entries, the trie blocks an allocation evicted).
ENGINE_STEP_KEYS: dict[str, frozenset[str]] = {
    "vllm": frozenset({"free_host_blocks"}),
    "sglang": frozenset({"mode", "free_pages", "evictable_pages", "new_token_ratio",
                         "abort_finished"}),
    "lmdeploy": frozenset({"kind", "engine_free", "evictable", "void", "cache_evicted"}),
}


class TraceError(ValueError):
    """Malformed trace input; str() is one line: 'line N: what was expected'."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.message = message


@dataclass(frozen=True)
class Header:
    config: Config
    engine: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    # False when the engine reports each step's victims as a set, in no particular order.
    preempted_order: bool = True
    # The engine's settings that are a profile's knobs, knob name to value (trace v1's
    # "settings"): a profile replays the trace with them (Profile.for_trace).
    settings: dict[str, Any] = field(default_factory=dict)


# What load_line returns for a blank line, and the reader at the end of the file.
BLANK: Any = object()
END_OF_FILE: Any = object()


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class _NotFinite(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


def _not_finite(name: str) -> Any:
    raise _NotFinite(name)


def kind(value: Any) -> str:
    """A JSON value's kind, for messages: null, true, a number, a string, a list, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def line_too_long(line: int) -> TraceError:
    return TraceError(line, f"the line is longer than {MAX_LINE_BYTES // (1024 * 1024)} MiB "
                            "(the longest line a trace may have)")


def load_line(raw: bytes, line: int) -> Any:
    """The JSON value of one line of a trace, or BLANK for a blank line. Strict: a key
    twice in one object, NaN and Infinity (which Python's json writes by default) and
    anything that is not UTF-8 are malformed input, told as a TraceError."""
    if raw.startswith(UTF8_BOM):
        raise TraceError(line, "the line starts with a UTF-8 byte order mark (BOM): save the "
                               "file as UTF-8 without one")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(line, f"not UTF-8 (byte {e.start})") from None
    if not text.strip():
        return BLANK
    try:
        return json.loads(text, object_pairs_hook=_unique, parse_constant=_not_finite)
    except _DuplicateKey as e:
        raise TraceError(line, f"the key {e.key!r} appears twice in one object (a JSON "
                               "reader would keep only the last)") from None
    except _NotFinite as e:
        raise TraceError(line, f"{e.name} is not a JSON number (Python's json.dumps writes "
                               "it for a float that is not finite)") from None
    except ValueError as e:
        if "Exceeds the limit" in str(e):  # Python's guard against huge integers
            raise TraceError(line, "a number with more than 4300 digits (the largest count "
                                   "a trace may hold is 2**40)") from None
        if not raw.endswith(b"\n"):
            raise TraceError(line, "truncated: the last line is incomplete JSON") from None
        raise TraceError(line, "malformed JSON: expected one JSON object per line") from None


def _int(v: Any, line: int, what: str, minimum: int = 0) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise TraceError(line, f"{what} must be an integer, got {v!r}")
    if v < minimum:
        raise TraceError(line, f"{what} must be at least {minimum}, got {v}")
    if v > MAX_COUNT:
        raise TraceError(line, f"{what} is absurdly large ({v} > 2**40)")
    return v


def _str(v: Any, line: int, what: str) -> str:
    if not isinstance(v, str) or not v:
        raise TraceError(line, f"{what} must be a non-empty string, got {v!r}")
    return v


def _list(obj: dict[str, Any], key: str, line: int) -> list[Any]:
    v = obj.get(key, [])
    if not isinstance(v, list):
        raise TraceError(line, f'"{key}" must be a list, got {type(v).__name__}')
    return v


def _ids(obj: dict[str, Any], key: str, line: int) -> tuple[str, ...]:
    return tuple(_str(x, line, f'each entry of "{key}"') for x in _list(obj, key, line))


def parse_config(raw: Any, line: int) -> Config:
    if not isinstance(raw, dict):
        raise TraceError(line, '"config" must be an object with every config field')
    missing = [n for n in config_field_names() if n not in raw and n not in OPTIONAL_CONFIG]
    if missing:
        raise TraceError(line, f"config is missing field {missing[0]!r}")
    config = Config(**{n: raw.get(n, OPTIONAL_CONFIG.get(n)) for n in config_field_names()})
    problems = config.problems()
    if problems:
        raise TraceError(line, problems[0])
    return config


def parse_header(obj: Any, line: int = 1) -> Header:
    if not isinstance(obj, dict) or obj.get("kvsched") != "trace":
        raise TraceError(line, 'expected a header object with "kvsched": "trace"')
    version = obj.get("version")
    if type(version) is not int or version != VERSION:
        raise TraceError(line, f"unsupported trace version {version!r}; "
                               f"this reader knows version {VERSION}")
    engine = obj.get("engine", {})
    if not isinstance(engine, dict):
        raise TraceError(line, '"engine" must be an object like {"name": ..., "version": ...}')
    ordered = obj.get("preempted_order", True)
    if not isinstance(ordered, bool):
        raise TraceError(line, f'"preempted_order" must be true or false, got {ordered!r}')
    settings = obj.get("settings", {})
    if not isinstance(settings, dict) or any(
            not isinstance(v, bool | int | float | str) for v in settings.values()):
        raise TraceError(line, '"settings" must be an object of knob names to numbers, '
                               'strings or true or false')
    extra = {k: v for k, v in obj.items() if k not in HEADER_KEYS}
    return Header(parse_config(obj.get("config"), line),
                  {str(k): str(v) for k, v in engine.items()}, extra, ordered, settings)


def parse_arrival(raw: Any, step: int, line: int) -> Request:
    if not isinstance(raw, dict):
        raise TraceError(line, "each arrival must be an object with id, prompt_len, max_tokens")
    for key in ("id", "prompt_len", "max_tokens"):
        if key not in raw:
            raise TraceError(line, f"an arrival is missing {key!r}")
    rid = _str(raw["id"], line, "arrival id")
    prompt = _int(raw["prompt_len"], line, f"prompt_len of {rid}", 1)
    max_tokens = _int(raw["max_tokens"], line, f"max_tokens of {rid}", 1)
    priority = raw.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise TraceError(line, f"priority of {rid} must be an integer, got {priority!r}")
    if abs(priority) > MAX_COUNT:
        raise TraceError(line, f"priority of {rid} is absurdly large ({priority})")
    return Request(rid, prompt, max_tokens, priority, step)


def parse_step(obj: Any, line: int) -> StepRecord:
    if not isinstance(obj, dict):
        raise TraceError(line, f"expected a step object, got {kind(obj)}")
    if "step" not in obj:
        raise TraceError(line, 'expected a step object with "step"')
    step = _int(obj["step"], line, '"step"')
    arrivals = tuple(parse_arrival(a, step, line) for a in _list(obj, "arrivals", line))
    rejected = []
    for r in _list(obj, "rejected", line):
        if not isinstance(r, dict) or "id" not in r:
            raise TraceError(line, 'each rejection must be an object {"id": ..., "reason": ...}')
        rejected.append(Rejection(_str(r["id"], line, "rejected id"), str(r.get("reason", ""))))
    preempted = []
    for p in _list(obj, "preempted", line):
        if not isinstance(p, dict) or "id" not in p:
            raise TraceError(line, 'each preemption must be an object {"id": ..., "mode": ...}')
        mode = p.get("mode")
        if mode not in VICTIM_MODES:
            raise TraceError(line, "preemption mode must be recompute, swap or lazy, "
                                   f"got {mode!r}")
        preempted.append(Preemption(_str(p["id"], line, "preempted id"), str(mode)))
    scheduled = []
    for s in _list(obj, "scheduled", line):
        if not isinstance(s, list) or len(s) != 2:
            raise TraceError(line, 'each "scheduled" entry must be [id, tokens]')
        # Zero or negative counts are the engine's fault (token-range), not bad input.
        n = s[1]
        if not isinstance(n, int) or isinstance(n, bool):
            raise TraceError(line, f"scheduled token count must be an integer, got {n!r}")
        if abs(n) > MAX_COUNT:
            raise TraceError(line, f"scheduled token count is absurdly large ({n} > 2**40)")
        scheduled.append((_str(s[0], line, "scheduled id"), n))
    free_blocks = obj.get("free_blocks")
    if free_blocks is not None:
        free_blocks = _int(free_blocks, line, '"free_blocks"')
    new_blocks = _block_map(obj, "new_blocks", line) if "new_blocks" in obj else None
    hits = _block_map(obj, "prefix_hits", line) if "prefix_hits" in obj else {}
    dedup = _block_map(obj, "dedup", line) if "dedup" in obj else {}
    keys = {}
    if "block_keys" in obj:
        raw = obj["block_keys"]
        if not isinstance(raw, dict):
            raise TraceError(line, '"block_keys" must be an object {id: [content keys]}')
        for rid, ks in raw.items():
            if not isinstance(ks, list):
                raise TraceError(line, f"block_keys of {rid} must be a list of strings")
            keys[rid] = tuple(_str(k, line, f"a block key of {rid}") for k in ks)
    time_ms = obj.get("time_ms")
    if time_ms is not None and (not isinstance(time_ms, (int, float))
                                or isinstance(time_ms, bool) or time_ms < 0):
        raise TraceError(line, f'"time_ms" must be a non-negative number, got {time_ms!r}')
    return StepRecord(step, arrivals, _ids(obj, "aborted", line), tuple(rejected),
                      tuple(preempted), _ids(obj, "swapped_in", line), tuple(scheduled),
                      _ids(obj, "finished", line), free_blocks, new_blocks,
                      None if time_ms is None else float(time_ms), hits, keys, dedup,
                      _ids(obj, "released", line), _ids(obj, "reclaimed", line),
                      _ids(obj, "unsampled", line), line=line)


def _block_map(obj: dict[str, Any], key: str, line: int) -> dict[str, tuple[int, ...]]:
    """A step's {id: [block ids]} field (new_blocks, prefix_hits, dedup)."""
    raw = obj[key]
    if not isinstance(raw, dict):
        raise TraceError(line, f'"{key}" must be an object {{id: [block ids]}}')
    out = {}
    for rid, ids in raw.items():
        if not isinstance(ids, list):
            raise TraceError(line, f"{key} of {rid} must be a list of block ids")
        out[rid] = tuple(_int(b, line, f"a block id of {rid}") for b in ids)
    return out


def engine_step_keys(header: Header) -> frozenset[str]:
    """The step keys of the header's engine's own (ENGINE_STEP_KEYS), which a reader
    ignores without a note."""
    return ENGINE_STEP_KEYS.get(header.engine.get("name", ""), frozenset())


class TraceReader:
    """Streams a trace from a binary file: `header` first, then iterate the steps.

    After iteration `complete` says whether the `{"end": true}` line was there and
    `unknown_keys` maps each ignored key to the first line that had it.
    """

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._line = 0
        self.complete = False
        self.unknown_keys: dict[str, int] = {}
        first = self._next_object()
        if first is END_OF_FILE:
            raise TraceError(1, "empty file: expected a trace header line")
        self.header = parse_header(first, self._line)
        self._known = STEP_KEYS | engine_step_keys(self.header)

    def _next_raw(self) -> bytes:
        """The next line's bytes (b"" at the end of the file), counted."""
        raw = self._stream.readline(MAX_LINE_BYTES + 2)
        if raw:
            self._line += 1
            if len(raw) - raw.endswith(b"\n") > MAX_LINE_BYTES:
                raise line_too_long(self._line)
        return raw

    def _next_object(self) -> Any:
        """The next non-blank line's JSON value, or END_OF_FILE."""
        while True:
            raw = self._next_raw()
            if not raw:
                return END_OF_FILE
            obj = load_line(raw, self._line)
            if obj is not BLANK:
                return obj

    def step_lines(self) -> Iterator[tuple[int, bytes]]:
        """The step lines as the file has them, each with its line number and ending in a
        newline, not read as steps (for a reader that reads them itself: the fast
        checker); blank lines are skipped and the end line taken as iteration takes it.
        A trace is read either this way or by iteration, once."""
        while True:
            raw = self._next_raw()
            if not raw:
                return
            if not raw.strip() or (not raw.isascii() and load_line(raw, self._line) is BLANK):
                continue
            if b'"end"' in raw:
                obj = load_line(raw, self._line)
                if isinstance(obj, dict) and obj.get("end") is True and "step" not in obj:
                    self.complete = True
                    if self._next_object() is not END_OF_FILE:
                        raise TraceError(self._line,
                                         'nothing may follow the {"end": true} line')
                    return
            yield self._line, raw if raw.endswith(b"\n") else raw + b"\n"

    def __iter__(self) -> Iterator[StepRecord]:
        expected = 0
        while True:
            obj = self._next_object()
            if obj is END_OF_FILE:
                return
            if isinstance(obj, dict) and obj.get("end") is True and "step" not in obj:
                self.complete = True
                if self._next_object() is not END_OF_FILE:
                    raise TraceError(self._line, 'nothing may follow the {"end": true} line')
                return
            rec = parse_step(obj, self._line)
            if rec.step != expected:
                raise TraceError(self._line, f"expected step {expected}, got {rec.step} "
                                             "(steps are numbered from 0 without gaps)")
            for key in obj:
                if key not in self._known and key not in self.unknown_keys:
                    self.unknown_keys[key] = self._line
            expected += 1
            yield rec


# Config fields the header writes only when they differ from their default: those trace
# v1 gained after its first recordings, so that a trace that does not use one is the
# same, byte for byte, as it was before.
WRITTEN_WHEN_SET = frozenset({"max_prompt_len", "prealloc_tokens", "pipelined"})


def header_dict(config: Config, engine: dict[str, str] | None = None,
                extra: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"kvsched": "trace", "version": VERSION,
                           "engine": engine or {"name": "kvsched", "version": "0"},
                           "config": {n: getattr(config, n) for n in config_field_names()
                                      if n not in WRITTEN_WHEN_SET
                                      or getattr(config, n) != OPTIONAL_CONFIG[n]}}
    out.update(extra or {})
    return out


def step_dict(rec: StepRecord) -> dict[str, Any]:
    """The JSON object of one step; empty lists are left out."""
    return step_fields(rec.step, arrivals=rec.arrivals, aborted=rec.aborted,
                       rejected=rec.rejected, preempted=rec.preempted,
                       swapped_in=rec.swapped_in, scheduled=rec.scheduled,
                       finished=rec.finished, free_blocks=rec.free_blocks,
                       new_blocks=rec.new_blocks, time_ms=rec.time_ms,
                       prefix_hits=rec.prefix_hits, block_keys=rec.block_keys,
                       dedup=rec.dedup, released=rec.released, reclaimed=rec.reclaimed,
                       unsampled=rec.unsampled)


def step_fields(step: int, *, arrivals: Sequence[Request] = (), aborted: Sequence[str] = (),
                rejected: Sequence[Rejection] = (), preempted: Sequence[Preemption] = (),
                swapped_in: Sequence[str] = (),
                scheduled: Sequence[tuple[str, int]] = (), finished: Sequence[str] = (),
                free_blocks: int | None = None,
                new_blocks: Mapping[str, Sequence[int]] | None = None,
                time_ms: float | None = None,
                prefix_hits: Mapping[str, Sequence[int]] | None = None,
                block_keys: Mapping[str, Sequence[str] | Sequence[bytes]] | None = None,
                dedup: Mapping[str, Sequence[int]] | None = None,
                released: Sequence[str] = (), reclaimed: Sequence[str] = (),
                unsampled: Sequence[str] = (),
                ) -> dict[str, Any]:
    """The JSON object of one step from its parts (StepRecord's fields): the one place
    the step line's shape is written. The parts go in as they are (JSON writes a tuple
    as an array), without a StepRecord: a live engine writes one of these every step,
    and each object built here is the garbage collector's and the step's time. Block
    keys may be an engine's own bytes, which its line encoder writes as text (the vLLM
    plugin's: base64)."""
    out: dict[str, Any] = {"step": step}
    if arrivals:
        out["arrivals"] = [{"id": r.id, "prompt_len": r.prompt_len, "max_tokens": r.max_tokens,
                            "priority": r.priority} for r in arrivals]
    if aborted:
        out["aborted"] = aborted
    if released:
        out["released"] = released
    if rejected:
        out["rejected"] = [{"id": r.id, "reason": r.reason} for r in rejected]
    if preempted:
        out["preempted"] = [{"id": p.id, "mode": p.mode} for p in preempted]
    if reclaimed:
        out["reclaimed"] = reclaimed
    if swapped_in:
        out["swapped_in"] = swapped_in
    if scheduled:
        out["scheduled"] = scheduled
    if unsampled:
        out["unsampled"] = unsampled
    if finished:
        out["finished"] = finished
    if free_blocks is not None:
        out["free_blocks"] = free_blocks
    if new_blocks is not None:
        out["new_blocks"] = new_blocks
    if prefix_hits:
        out["prefix_hits"] = prefix_hits
    if block_keys:
        out["block_keys"] = block_keys
    if dedup:
        out["dedup"] = dedup
    if time_ms is not None:
        out["time_ms"] = time_ms
    return out


class HeldLine:
    """A pipelined engine's step line (config pipelined) while it waits for the next
    step: the engine decides step k+1 before it applies step k's output, so what that
    output did (the finishes it made) and what the decision undid (the entries of step
    k whose output it dropped, preempting them: `unsampled`) are known only once step
    k+1 is decided. `hold` keeps step k's line; `settle` gives it back with what step
    k+1 told of it. A dropped entry samples nothing, so it finishes nothing: it leaves
    the line's finishes."""

    def __init__(self) -> None:
        self.line: StepRecord | None = None

    def hold(self, rec: StepRecord) -> None:
        """Keep `rec` until the next step settles it; a line held before must have been
        settled."""
        if self.line is not None:
            raise ValueError(f"step {self.line.step}'s line is still held")
        self.line = rec

    def settle(self, finished: Sequence[str] = (),
               unsampled: Sequence[str] = ()) -> StepRecord | None:
        """The held line, None when none is held, with `finished` added to its finishes
        and `unsampled` as its dropped entries (out of its finishes); nothing is held
        after."""
        rec, self.line = self.line, None
        if rec is None or not (finished or unsampled):
            return rec
        dropped = set(unsampled)
        return replace(rec, finished=tuple(r for r in (*rec.finished, *finished)
                                           if r not in dropped),
                       unsampled=rec.unsampled + tuple(unsampled))


def json_line(obj: Any) -> bytes:
    """One trace line: compact JSON and its newline."""
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


class TraceWriter:
    """Writes a trace to a binary stream, one JSON object per line."""

    def __init__(self, stream: IO[bytes], dumps: Callable[[Any], bytes] = json_line) -> None:
        self._stream = stream
        self._dumps = dumps

    def header(self, config: Config, engine: dict[str, str] | None = None,
               extra: dict[str, Any] | None = None) -> None:
        self._stream.write(self._dumps(header_dict(config, engine, extra)))

    def step(self, rec: StepRecord) -> None:
        self._stream.write(self._dumps(step_dict(rec)))

    def encoded(self, lines: bytes) -> None:
        """Step lines already encoded, as this writer's `dumps` would encode them."""
        self._stream.write(lines)

    def end(self) -> None:
        self._stream.write(self._dumps({"end": True}))
