"""The compiled line scanner (kvsched.optimized.scan) reads a line only when it means
exactly what orjson and the spec's parse_step make of it, and it does read the lines
engines write (compact or spaced JSON, keys in any order), so the fast path is taken.

Every test decodes the scanner's columns back into Python values and compares them
with parse_step's record of the same line.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kvsched.optimized import checker
from kvsched.optimized import scan as sc
from kvsched.optimized.checker import check_trace_vectorized, id_key
from kvsched.spec import TraceError, check_trace
from kvsched.spec.trace import TraceReader, parse_step


def word_id(lo: int, hi: int) -> str:
    raw = int(lo).to_bytes(8, "little") + int(hi).to_bytes(8, "little")
    return raw.rstrip(b"\0").decode("ascii")


def scan_lines(text: bytes, lines: int = 64, entries: int = 4096
               ) -> list[dict[str, Any] | None]:
    """Each line of `text` (which ends with a newline) as the scanner read it: a dict
    like parse_step's fields, or None where it left the line alone. Small buffers make
    the scanner stop and resume often."""
    block = sc.Block(bytearray(text), len(text))
    scanner = sc.Scanner(lines, entries)
    out: list[dict[str, Any] | None] = []
    pos = 0
    while pos < block.size:
        got = scanner(block, pos, block.size)
        assert got.end > pos, "the scanner made no progress"
        a = e = f = o = b = 0
        for row in got.lines.tolist():
            if not row[sc.L_OK]:
                assert row[sc.L_ARR] == row[sc.L_ENT] == row[sc.L_FIN] == row[sc.L_OWN] == 0
                out.append(None)
                continue
            arrivals = []
            for x in got.arr[a:a + row[sc.L_ARR]].tolist():
                name = bytes(block.data[x[2]:x[3]]).decode("ascii")
                assert word_id(x[0], x[1]) == name
                arrivals.append((name, x[4], x[5], x[6]))
            a += row[sc.L_ARR]
            scheduled = [(word_id(x[0], x[1]), x[2])
                         for x in got.ent[e:e + row[sc.L_ENT]].tolist()]
            e += row[sc.L_ENT]
            finished = [word_id(x[0], x[1]) for x in got.fin[f:f + row[sc.L_FIN]].tolist()]
            f += row[sc.L_FIN]
            new_blocks: dict[str, tuple[int, ...]] | None = None
            if row[sc.L_BLOCKS]:
                new_blocks = {}
                for x in got.own[o:o + row[sc.L_OWN]].tolist():
                    new_blocks[word_id(x[0], x[1])] = tuple(got.blocks[b:b + x[2]].tolist())
                    b += x[2]
            o += row[sc.L_OWN]
            out.append({"step": row[sc.L_STEP],
                        "free_blocks": None if row[sc.L_FREE] < 0 else row[sc.L_FREE],
                        "arrivals": arrivals, "scheduled": scheduled, "finished": finished,
                        "new_blocks": new_blocks})
        pos = got.end
    return out


def parsed(line: bytes) -> dict[str, Any] | None:
    """parse_step's reading of the line, in scan_lines' shape; None if it refuses."""
    try:
        rec = parse_step(orjson.loads(line), 1)
    except (TraceError, ValueError):
        return None
    return {"step": rec.step, "free_blocks": rec.free_blocks,
            "arrivals": [(r.id, r.prompt_len, r.max_tokens, r.priority)
                         for r in rec.arrivals],
            "scheduled": list(rec.scheduled), "finished": list(rec.finished),
            "new_blocks": rec.new_blocks}


def assert_faithful(line: bytes) -> dict[str, Any] | None:
    """The scanner reads the line as parse_step does, or leaves it alone."""
    got = scan_lines(line + b"\n")
    assert len(got) == 1
    if got[0] is not None:
        assert got[0] == parsed(line), line
    return got[0]


STEP = {"step": 3, "arrivals": [{"id": "r7", "prompt_len": 35, "max_tokens": 9,
                                 "priority": -2}],
        "scheduled": [["r1", 1], ["request-0000012", 16], ["a-sixteen-bytes!", 1]],
        "finished": ["r1"], "free_blocks": 812,
        "new_blocks": {"r7": [3, 4, 5], "request-0000012": []}, "time_ms": 1.25}


@pytest.mark.parametrize("dumps", [
    lambda o: orjson.dumps(o),
    lambda o: json.dumps(o).encode(),  # ", " and ": "
    lambda o: json.dumps(o, separators=(" ,\t", " :  ")).encode(),
    lambda o: json.dumps(dict(reversed(list(o.items())))).encode(),  # keys in any order
    lambda o: b"  " + orjson.dumps(o) + b" \r",  # whitespace around the object
], ids=["compact", "spaced", "odd-spaces", "reordered", "padded"])
def test_the_lines_engines_write_are_read_and_mean_what_parse_step_says(dumps: Any) -> None:
    line = dumps(STEP)
    got = assert_faithful(line)
    assert got is not None, "the scanner should read this line"
    assert got["scheduled"] == [("r1", 1), ("request-0000012", 16), ("a-sixteen-bytes!", 1)]
    assert got["arrivals"] == [("r7", 35, 9, -2)]
    assert got["new_blocks"] == {"r7": (3, 4, 5), "request-0000012": ()}


@pytest.mark.parametrize("line", [
    b'{"step":1}',
    b'{"step":0,"scheduled":[],"finished":[],"new_blocks":{},"arrivals":[]}',
    b'{"step":2,"arrivals":[{"max_tokens":2,"id":"x","prompt_len":4}]}',  # no priority
    b'{"step":2,"time_ms":0}',
    b'{"step":2,"time_ms":12.500}',
    b'{"step":1099511627776,"free_blocks":1099511627776}',  # 2**40, the largest
])
def test_plain_corner_cases_are_read(line: bytes) -> None:
    assert assert_faithful(line) is not None


@pytest.mark.parametrize("line", [
    b'',  # blank
    b'{}',
    b'{"end":true}',
    b'[1]',
    b'{"step":1,"aborted":["a"]}',  # rare keys: read as JSON, applied one by one
    b'{"step":1,"preempted":[{"id":"a","mode":"swap"}]}',
    b'{"step":1,"rejected":[{"id":"a","reason":"x"}]}',
    b'{"step":1,"swapped_in":["a"]}',
    b'{"step":1,"prefix_hits":{}}',
    b'{"step":1,"engine_note":1}',  # an unknown key: reported, so read as JSON
    b'{"step":1,"step":2}',  # a repeated key: malformed, as the spec's reader says
    b'{"step":1,"scheduled":[["a",1]],"scheduled":[]}',
    b'{"step":1,"new_blocks":{"a":[1],"a":[2]}}',  # an owner twice, likewise
    b'{"step":1,"scheduled":[["\\u0061",1]]}',  # an escape
    b'{"step":1,"scheduled":[["seventeen-bytes!!",1]]}',  # a long id
    b'{"step":1,"scheduled":[["",1]]}',  # an empty id
    b'{"step":1,"scheduled":[["caf\xc3\xa9",1]]}',  # not ASCII
    b'{"step":1,"scheduled":[["a",1.0]]}',
    b'{"step":1,"scheduled":[["a",1e0]]}',
    b'{"step":1,"scheduled":[["a",-1]]}',  # a negative count: the checker's to judge
    b'{"step":1,"scheduled":[["a",01]]}',
    b'{"step":1,"scheduled":[["a",1099511627777]]}',  # past 2**40
    b'{"step":1,"scheduled":[["a",1,2]]}',
    b'{"step":1,"scheduled":[["a",1],]}',
    b'{"step":1,"scheduled":[["a",1]]',  # unclosed
    b'{"step":1,"scheduled":[["a",1]]}}',
    b'{"step":1} x',
    b'{"step":-1}',
    b'{"step":true}',
    b'{"step":1,"free_blocks":null}',
    b'{"step":1,"new_blocks":{"a":[1,1.5]}}',
    b'{"step":1,"arrivals":[{"id":"a","prompt_len":0,"max_tokens":1}]}',
    b'{"step":1,"arrivals":[{"id":"a","prompt_len":1}]}',
    b'{"step":1,"arrivals":[{"id":"a","prompt_len":1,"max_tokens":1,"x":0}]}',
    b'{"step":1,"time_ms":1e3}',
    b'{"step":1,"time_ms":-1}',
    b'{"step":1,"time_ms":"1"}',
])
def test_other_lines_are_left_to_the_json_reader(line: bytes) -> None:
    assert assert_faithful(line) is None


IDS = st.text(st.characters(min_codepoint=32, max_codepoint=127), min_size=1, max_size=18)
NUMBER = st.one_of(st.integers(-3, 40), st.integers(0, 2**41), st.floats(0, 100),
                   st.booleans(), st.none(), st.just("7"))


@st.composite
def step_objects(draw: st.DrawFn) -> dict[str, Any]:
    """Step objects near the scanner's grammar, often just outside it."""
    obj: dict[str, Any] = {"step": draw(st.one_of(st.integers(0, 50), NUMBER))}
    if draw(st.booleans()):
        obj["arrivals"] = draw(st.lists(st.fixed_dictionaries(
            {"id": IDS, "prompt_len": NUMBER, "max_tokens": NUMBER},
            optional={"priority": NUMBER, "other": NUMBER}), max_size=3))
    if draw(st.booleans()):
        obj["scheduled"] = draw(st.lists(st.lists(st.one_of(IDS, NUMBER), min_size=2,
                                                  max_size=2), max_size=4))
    if draw(st.booleans()):
        obj["finished"] = draw(st.lists(IDS, max_size=3))
    if draw(st.booleans()):
        obj["free_blocks"] = draw(NUMBER)
    if draw(st.booleans()):
        obj["new_blocks"] = draw(st.dictionaries(IDS, st.lists(NUMBER, max_size=3),
                                                 max_size=3))
    if draw(st.booleans()):
        obj["time_ms"] = draw(NUMBER)
    if draw(st.integers(0, 9)) == 0:
        obj[draw(st.sampled_from(["aborted", "note", "prefix_hits"]))] = []
    return obj


@given(obj=step_objects(), spaced=st.booleans(), cut=st.integers(0, 400),
       junk=st.sampled_from([b"", b" ", b",", b"]", b"}", b'"', b"0", b"-", b"\\", b"\t"]))
@example(obj={"step": 0, "scheduled": [["a", 1]]}, spaced=False, cut=0, junk=b"")
@example(obj={"step": 0, "new_blocks": {"\x7f": []}}, spaced=True, cut=0, junk=b"")
def test_whatever_the_scanner_reads_parse_step_reads_alike(obj: dict[str, Any], spaced: bool,
                                                          cut: int, junk: bytes) -> None:
    line = json.dumps(obj).encode() if spaced else orjson.dumps(obj)
    assert_faithful(line)
    if cut:  # the same line with a byte inserted somewhere
        at = cut % (len(line) + 1)
        assert_faithful(line[:at] + junk + line[at:])
    # A well-formed line of plain ids and counts is read, not left to JSON.
    plain = parsed(line)
    if plain is not None and "time_ms" not in obj and obj.get("free_blocks", 0) is not None \
            and not set(obj) - {
            "step", "arrivals", "scheduled", "finished", "free_blocks", "new_blocks"}:
        ids = ([a[0] for a in plain["arrivals"]] + [s[0] for s in plain["scheduled"]]
               + plain["finished"] + list(plain["new_blocks"] or ()))
        numbers = [obj["step"], *(s[1] for s in plain["scheduled"])]
        if (all(id_key(r) is not None for r in ids) and all(n >= 0 for n in numbers)
                and all("other" not in a for a in obj.get("arrivals", []))
                and b"\\" not in line):  # json.dumps escapes some bytes orjson writes raw
            assert scan_lines(line + b"\n")[0] is not None, line


def test_a_line_too_big_for_the_buffers_is_left_alone_and_the_rest_is_read() -> None:
    small = orjson.dumps({"step": 0, "scheduled": [["a", 1]]})
    big = orjson.dumps({"step": 1, "scheduled": [[f"r{i}", 1] for i in range(100)]})
    got = scan_lines(b"\n".join([small, big, small, small, big]) + b"\n", entries=64)
    assert [g is not None for g in got] == [True, False, True, True, False]


def test_reading_stops_and_resumes_when_the_buffers_fill() -> None:
    lines = [orjson.dumps({"step": i, "scheduled": [[f"r{j}", 1] for j in range(i % 7)],
                           "new_blocks": {f"r{j}": [j] for j in range(i % 3)}})
             for i in range(200)]
    text = b"\n".join(lines) + b"\n"
    assert scan_lines(text, lines=5, entries=16) == scan_lines(text, lines=4096,
                                                               entries=1 << 16)
    assert all(g == parsed(x) for g, x in zip(scan_lines(text, 5, 16), lines, strict=True))


def test_the_lookup_finds_exactly_the_ids_added() -> None:
    table = checker.IdTable()
    names = [f"r{i}" for i in range(5000)] + ["a-sixteen-bytes!", "x"]
    for i, rid in enumerate(names):
        table.add(rid, i)
    probe = [*names, "r5000", "a-sixteen-bytes?", "y", "r"]
    keys = np.array([id_key(r) for r in probe], dtype=np.uint64).view(np.int64)
    found = table.find(keys)
    assert found.tolist() == [*range(len(names)), -1, -1, -1, -1]


def test_a_spaced_trace_is_scanned_and_both_checkers_agree(tmp_path: Any) -> None:
    from kvsched.reference import ReferenceScheduler
    from kvsched.simulate import run
    from kvsched.spec import Config
    from kvsched.spec.profiles import get_profile
    from kvsched.spec.trace import TraceWriter
    from kvsched.workload import WorkItem

    config = Config(block_size=4, num_gpu_blocks=64, max_num_batched_tokens=64,
                    max_num_seqs=8, max_model_len=256)
    items = [WorkItem(f"req-{i}", i // 3, 10 + 7 * i, 5 + i, 5 + i) for i in range(30)]
    out = io.BytesIO()
    writer = TraceWriter(out, lambda o: json.dumps(o).encode() + b"\n")  # ", " and ": "
    writer.header(config)
    rare = 0  # lines with preemptions (or aborts, rejections, swap-ins): read as JSON
    for rec in run(ReferenceScheduler(config, get_profile("vllm-v1").knobs), items):
        writer.step(rec)
        rare += bool(rec.preempted or rec.aborted or rec.rejected or rec.swapped_in)
    writer.end()
    data = out.getvalue()
    stats: dict[str, int] = {}
    fast = check_trace_vectorized(io.BytesIO(data), stats=stats)
    spec = check_trace(TraceReader(io.BytesIO(data)))
    assert (fast.counts, fast.violations, fast.steps) == (spec.counts, spec.violations,
                                                          spec.steps)
    assert not spec.counts
    assert stats["exact"] == 0
    assert stats["as_json"] == 2 + rare  # and the header and the end line
    assert stats["scanned"] == spec.steps - rare
