"""Both trace readers, fuzzed with structure-aware lines: the spec's (strict JSON, then
parse_step) and the fast checker's (orjson, kept only when it writes the object back to
the same bytes, else the spec's strict reader; then the compiled state's own reading
of a step, kvsched.optimized.state.FastState.apply). For every line they must agree:
the fast reader's JSON value is exactly the spec's (types included), and a line the
compiled state takes as a clean step is one parse_step reads, which the spec's
checker, from the same state, flags nothing in and moves to the same state.

`make fuzz-deep` (the deep Hypothesis profile) draws 2,000 batches of exactly 500: one
million lines (docs/testing.md reports the run).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsched.optimized.checker import read_line
from kvsched.spec.checker import Checker
from kvsched.spec.model import MAX_COUNT, Config
from kvsched.spec.trace import BLANK, TraceError, load_line, parse_step

state = pytest.importorskip("kvsched.optimized.state")

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
BATCH = 500 if DEEP else 40

IDS = st.one_of(st.sampled_from(["r0", "r1", "request-0000012", "a-sixteen-bytes!",
                                 "x" * 17, "", "é", "a\x1b[2J", "a\"b", "a\\b"]),
                st.text(max_size=20))
INTS = st.one_of(st.integers(-3, 300), st.sampled_from([0, MAX_COUNT, MAX_COUNT + 1,
                                                        2**63, 2**64, -(2**40)]))
SCALARS = st.one_of(INTS, st.floats(allow_nan=False), st.booleans(), st.none(), IDS)
ANY = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(IDS, inner, max_size=4)), max_leaves=8)


def arrival() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.fixed_dictionaries({"id": IDS, "prompt_len": INTS, "max_tokens": INTS},
                              optional={"priority": INTS, "extra": ANY}),
        ANY)


STEP_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "arrivals": st.one_of(st.lists(arrival(), max_size=3), ANY),
    "scheduled": st.one_of(st.lists(st.one_of(st.tuples(IDS, INTS).map(list), ANY),
                                    max_size=5), ANY),
    "finished": st.one_of(st.lists(IDS, max_size=3), ANY),
    "aborted": st.one_of(st.lists(IDS, max_size=2), ANY),
    "preempted": st.lists(st.one_of(st.fixed_dictionaries(
        {"id": IDS, "mode": st.sampled_from(["recompute", "swap", "evict"])}), ANY),
        max_size=2),
    "free_blocks": st.one_of(INTS, ANY),
    "new_blocks": st.one_of(st.dictionaries(IDS, st.lists(INTS, max_size=3), max_size=3),
                            ANY),
    "time_ms": st.one_of(st.floats(allow_nan=False, allow_infinity=False), INTS, ANY),
    "engine_note": ANY,
}


@st.composite
def line(draw: st.DrawFn) -> bytes:
    """One step line, nearly well formed, then perhaps damaged at the byte level."""
    obj: dict[str, Any] = {"step": draw(st.one_of(st.just(0), st.integers(0, 5), INTS, ANY))}
    for key in draw(st.lists(st.sampled_from(sorted(STEP_FIELDS)), max_size=5,
                             unique=True)):
        obj[key] = draw(STEP_FIELDS[key])
    how = draw(st.sampled_from(["compact", "spaced", "sorted", "ascii"]))
    text = json.dumps(obj, separators=(",", ":") if how == "compact" else None,
                      sort_keys=how == "sorted", ensure_ascii=how == "ascii")
    raw = text.encode()
    damage = draw(st.sampled_from(["none", "none", "insert", "delete", "replace", "repeat",
                                   "cut", "other"]))
    if damage == "other":
        return draw(st.sampled_from([b"null", b"[]", b"3", b'"x"', b"", b"  ", b"\t",
                                     b"\xef\xbb\xbf{}", b'{"step": NaN}', b"{",
                                     b'{"step": 1, "step": 1}', b"9" * 5000]))
    if damage == "none" or not raw:
        return raw
    at = draw(st.integers(0, len(raw) - 1))
    if damage == "insert":
        byte = draw(st.sampled_from(b' ,:[]{}"\\0-9ae\x00\x7f\xff'))
        return raw[:at] + bytes([byte]) + raw[at:]
    if damage == "delete":
        return raw[:at] + raw[at + 1:]
    if damage == "replace":
        byte = draw(st.sampled_from(b' ,:[]{}"\\019-e'))
        return raw[:at] + bytes([byte]) + raw[at + 1:]
    if damage == "repeat":  # a key and its value twice: a duplicate key, if it was one
        end = draw(st.integers(at, len(raw)))
        return raw[:end] + b"," + raw[at:end] + raw[end:]
    return raw[:at]  # cut


def spec_reading(raw: bytes) -> tuple[str, Any]:
    """What the spec's reader makes of a line: a step, blank, or its error."""
    try:
        obj = load_line(raw + b"\n", 1)
        if obj is BLANK:
            return "blank", None
        rec = parse_step(obj, 1)
    except TraceError as e:
        return "error", e.message
    return "step", rec


def strictly(a: Any) -> Any:
    """A JSON value with every scalar's type beside it (1, 1.0 and True differ)."""
    if isinstance(a, dict):
        return ("dict", [(k, strictly(v)) for k, v in a.items()])
    if isinstance(a, list):
        return ("list", [strictly(v) for v in a])
    return (type(a).__name__, a)


# Prefix caching on, so that hits and content keys are read too.
CONFIG = Config(block_size=4, num_gpu_blocks=64, max_num_batched_tokens=512,
                max_num_seqs=8, max_model_len=256, prefix_caching=True)


# A batch is large by design (a block of lines, as the checker reads them).
@settings(suppress_health_check=[HealthCheck.large_base_example, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(lines=st.lists(line(), min_size=BATCH if DEEP else 1, max_size=BATCH))
def test_both_readers_read_every_line_alike(lines: list[bytes]) -> None:
    # One line per line: a newline inside a drawn byte sequence would split it.
    lines = [x.replace(b"\n", b" ").replace(b"\r", b" ") for x in lines]
    for raw in lines:
        kind, spec = spec_reading(raw)
        try:
            obj, _ = read_line(raw + b"\n", 1)
        except TraceError as e:
            assert kind == "error" and e.message == spec, raw
            continue
        assert strictly(obj) == strictly(load_line(raw + b"\n", 1)) if obj is not BLANK \
            else kind == "blank", raw
        if obj is BLANK:
            continue
        checker = Checker(CONFIG)
        fast = state.FastState(CONFIG, 8, True, checker.state.status_of)
        if not fast.apply(obj, 1):
            continue  # left to the spec's checker
        assert kind == "step", (raw, spec)
        checker.step(spec)
        assert not checker.report.counts, raw
        assert fast.position() == checker.position(), raw
