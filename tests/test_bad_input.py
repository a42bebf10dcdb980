"""Bad input: one line on stderr naming where and what, exit code 2, no traceback,
and nothing half-written left behind."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvsched.spec import Rejection, Request, TraceError, TraceReader, check_trace
from kvsched.spec.trace import MAX_LINE_BYTES, kind, parse_header

HEADER = {"kvsched": "trace", "version": 1, "engine": {"name": "t", "version": "0"},
          "config": {"block_size": 4, "num_gpu_blocks": 8, "num_cpu_blocks": 0,
                     "max_num_batched_tokens": 32, "max_num_seqs": 4, "max_model_len": 32,
                     "chunked_prefill": True, "long_prefill_token_threshold": 0,
                     "policy": "fcfs", "preemption": "recompute", "watermark_blocks": 0}}
ARRIVE = {"step": 0, "arrivals": [{"id": "r1", "prompt_len": 5, "max_tokens": 2}],
          "scheduled": [["r1", 5]]}


def kvsched(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, timeout=60)


def lines(*objs: object) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objs)


def header_with(**config: object) -> dict[str, object]:
    return {**HEADER, "config": {**HEADER["config"], **config}}  # type: ignore[dict-item]


def header_without(field: str) -> dict[str, object]:
    cfg = dict(HEADER["config"])  # type: ignore[call-overload]
    del cfg[field]
    return {**HEADER, "config": cfg}


CASES: dict[str, tuple[bytes, str]] = {
    "empty file": (b"", "line 1: empty file"),
    "malformed json": (lines(HEADER) + b'{"step": 0, "scheduled": [[\n', "line 2: malformed JSON"),
    "truncated": (lines(HEADER) + b'{"step": 0, "sched', "line 2: truncated"),
    "not utf-8": (lines(HEADER) + b'{"step": 0, "x": "\xff\xfe"}\n', "line 2: not UTF-8"),
    "not a header": (lines(ARRIVE), 'line 1: expected a header object'),
    "missing header field": (lines(header_without("max_num_seqs")),
                             "line 1: config is missing field 'max_num_seqs'"),
    "negative config": (lines(header_with(num_gpu_blocks=-3)),
                        "line 1: config.num_gpu_blocks must be at least 1, got -3"),
    "absurd config": (lines(header_with(max_model_len=2**50)),
                      "line 1: config.max_model_len is absurdly large"),
    "wrong type": (lines(header_with(chunked_prefill="yes")),
                   "line 1: config.chunked_prefill must be true or false"),
    "bad policy": (lines(header_with(policy="lifo")), "line 1: config.policy must be one of"),
    "wrong version": (lines({**HEADER, "version": 7}), "line 1: unsupported trace version 7"),
    "negative prompt": (lines(HEADER, {"step": 0, "arrivals": [
        {"id": "r1", "prompt_len": -5, "max_tokens": 2}]}),
        "line 2: prompt_len of r1 must be at least 1, got -5"),
    "absurd count": (lines(HEADER, {"step": 0, "arrivals": [
        {"id": "r1", "prompt_len": 5, "max_tokens": 2**62}]}),
        "line 2: max_tokens of r1 is absurdly large"),
    "negative free": (lines(HEADER, {**ARRIVE, "free_blocks": -1}),
                      'line 2: "free_blocks" must be at least 0'),
    "step gap": (lines(HEADER, ARRIVE, {"step": 2}), "line 3: expected step 1, got 2"),
    "step not object": (lines(HEADER, [1, 2]), "line 2: expected a step object"),
    "bad mode": (lines(HEADER, ARRIVE, {"step": 1, "preempted": [{"id": "r1", "mode": "evict"}]}),
                 "line 3: preemption mode must be recompute, swap or lazy"),
    "bad scheduled entry": (lines(HEADER, {"step": 0, "scheduled": [["r1"]]}),
                            'line 2: each "scheduled" entry must be [id, tokens]'),
    "prefix hits not ids": (lines(HEADER, {**ARRIVE, "prefix_hits": {"r1": 1}}),
                            "line 2: prefix_hits of r1 must be a list of block ids"),
    "block key not a string": (lines(HEADER, {**ARRIVE, "block_keys": {"r1": [7]}}),
                               "line 2: a block key of r1 must be a non-empty string"),
    "after end": (lines(HEADER, ARRIVE, {"end": True}, {"step": 1}),
                  'line 4: nothing may follow the {"end": true} line'),
    "null line": (lines(HEADER, ARRIVE) + b"null\n" + lines({"step": 1}),
                  "line 3: expected a step object, got null"),
    "a number for a step": (lines(HEADER, 7), "line 2: expected a step object, got the number 7"),
    "duplicate key": (lines(HEADER) + b'{"step": 0, "step": 0}\n',
                      "line 2: the key 'step' appears twice in one object"),
    "duplicate owner": (lines(HEADER) + b'{"step": 0, "new_blocks": {"r1": [1], "r1": [2]}}\n',
                        "line 2: the key 'r1' appears twice"),
    "duplicate arrival field": (lines(HEADER) + b'{"step": 0, "arrivals": [{"id": "a", "id": '
                                b'"b", "prompt_len": 4, "max_tokens": 1}]}\n',
                                "line 2: the key 'id' appears twice"),
    "NaN": (lines(HEADER) + b'{"step": 0, "time_ms": NaN}\n',
            "line 2: NaN is not a JSON number (Python's json.dumps writes it"),
    "Infinity": (lines(HEADER) + b'{"step": 0, "free_blocks": Infinity}\n',
                 "line 2: Infinity is not a JSON number"),
    "-Infinity": (lines(HEADER) + b'{"step": 0, "time_ms": -Infinity}\n',
                  "line 2: -Infinity is not a JSON number"),
    "byte order mark": (b"\xef\xbb\xbf" + lines(HEADER, ARRIVE),
                        "line 1: the line starts with a UTF-8 byte order mark (BOM)"),
    "5000-digit integer": (lines(HEADER) + b'{"step": ' + b"9" * 5000 + b"}\n",
                           "line 2: a number with more than 4300 digits"),
    "2**64 count": (lines(HEADER, {"step": 0, "scheduled": [["r1", 2**64]]}),
                    "line 2: scheduled token count is absurdly large (18446744073709551616"),
    "2**64 priority": (lines(HEADER, {"step": 0, "arrivals": [
        {"id": "r1", "prompt_len": 5, "max_tokens": 2, "priority": 2**64}]}),
        "line 2: priority of r1 is absurdly large"),
    "2**64 block id": (lines(HEADER, {**ARRIVE, "new_blocks": {"r1": [2**64]}}),
                       "line 2: a block id of r1 is absurdly large"),
    "version 1.0": (lines({**HEADER, "version": 1.0}), "line 1: unsupported trace version 1.0"),
    "version as text": (lines({**HEADER, "version": "1"}),
                        "line 1: unsupported trace version '1'"),
    "preempted_order not a bool": (lines({**HEADER, "preempted_order": "no"}),
                                   'line 1: "preempted_order" must be true or false'),
    "negative first block id": (lines(header_with(first_block_id=-1)),
                                "line 1: config.first_block_id must not be negative, got -1"),
    "header is a list": (lines([HEADER]), 'line 1: expected a header object'),
    "arrival id not a string": (lines(HEADER, {"step": 0, "arrivals": [
        {"id": 3, "prompt_len": 5, "max_tokens": 2}]}), "line 2: arrival id must be a "
        "non-empty string, got 3"),
    "boolean count": (lines(HEADER, {"step": 0, "scheduled": [["r1", True]]}),
                      "line 2: scheduled token count must be an integer, got True"),
    "float step": (lines(HEADER, {"step": 0.0}), 'line 2: "step" must be an integer, got 0.0'),
    "engine not an object": (lines({**HEADER, "engine": "vllm"}),
                             'line 1: "engine" must be an object'),
    "rejected without id": (lines(HEADER, {"step": 0, "rejected": [{"reason": "x"}]}),
                            "line 2: each rejection must be an object"),
    "truncated gzip": (b"", ""),  # written below: a gzip file cut in the middle
}
GZIP_CUT = "truncated gzip"


def trace_file(case: str, tmp_path: Path) -> Path:
    data, _ = CASES[case]
    path = tmp_path / "trace.jsonl"
    if case == GZIP_CUT:
        packed = gzip.compress(lines(HEADER, *({"step": i} for i in range(2000))))
        path.write_bytes(packed[:len(packed) // 2])
    else:
        path.write_bytes(data)
    return path


@pytest.mark.parametrize("checker", ["spec", "vectorized"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_check_refuses_bad_trace_in_one_line(case: str, checker: str, tmp_path: Path) -> None:
    expected = CASES[case][1]
    path = trace_file(case, tmp_path)
    if case == GZIP_CUT:
        expected = "the gzip data is damaged or cut short"
    result = kvsched("check", "--checker", checker, str(path))
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"{path}: {expected}" in result.stderr, result.stderr


def test_check_missing_file_and_directory(tmp_path: Path) -> None:
    # A directory stands for its trace files: one without any names nothing.
    for target, expected in ((str(tmp_path / "nope.jsonl"), "cannot read"),
                             (str(tmp_path), "no trace files (*.jsonl, *.jsonl.gz, "
                                             "*.jsonl.zst) in this directory"),
                             ("", "an empty file name: give a trace file, or - for standard "
                                  "input")):
        result = kvsched("check", target)
        assert result.returncode == 2
        assert expected in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.parametrize("checker", ["spec", "vectorized"])
def test_an_endless_line_is_refused_in_bounded_memory(checker: str) -> None:
    # /dev/zero is one line that never ends: refused once it passes 64 MiB.
    result = subprocess.run(
        [sys.executable, "-c", "import resource, sys, runpy; resource.setrlimit("
         "resource.RLIMIT_AS, (2 << 30, 2 << 30)); sys.argv = ['kvsched', 'check', "
         f"'--checker', '{checker}', '/dev/zero']; runpy.run_module('kvsched', "
         "run_name='__main__')"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-500:]
    assert result.stderr == ("kvsched: error: /dev/zero: line 1: the line is longer than "
                             "64 MiB (the longest line a trace may have)\n")


@pytest.mark.parametrize("args,expected", [
    (["simulate", "--num-gpu-blocks", "-4"], "--num-gpu-blocks must not be negative"),
    (["simulate", "--block-size", "0"], "--block-size must be at least 1"),
    (["simulate", "--no-chunked-prefill", "--max-num-batched-tokens", "64",
      "--max-model-len", "128"], "vLLM refuses max_num_batched_tokens 64 below max_model_len"),
    (["simulate", "--policy", "lifo"], "Invalid value for '--policy'"),
    (["simulate", "--requests", "0"], "--requests must be at least 1"),
    (["simulate", "--unknown-flag"], "No such option"),
    (["check"], "Missing argument 'TRACES...'"),
    (["check", "x.jsonl", "--profile", "nope"], "Invalid value for '--profile'"),
    (["check", "x.jsonl", "--require", "blocks"], "--require: unknown invariant 'blocks'"),
    (["check", "x.jsonl", "--max-violations", "-1"], "--max-violations must not be negative"),
    (["check", "x.jsonl", "--max-preemptions", "-1"], "--max-preemptions must not be negative"),
    (["simulate", "--workload", "w.jsonl", "--generator", "uniform"],
     "--workload reads the requests from a file; --generator applies to a generated "
     "workload only"),
    (["simulate", "--workload", "w.jsonl", "--requests", "5"],
     "--requests applies to a generated workload only"),
    (["simulate", "--preemption", "swap"],
     "--preemption swap moves victims to host blocks, but --num-cpu-blocks is 0"),
    (["simulate", "--preemption", "auto", "--num-cpu-blocks", "0"],
     "--preemption auto moves victims to host blocks"),
    (["simulate", "--first-block-id", "-1"], "--first-block-id must not be negative"),
    (["simulate", "--max-steps", "0"], "--max-steps must be at least 1"),
    (["simulate", "--rate", "0"], "rate"),
    (["metrics", ""], "an empty file name"),
    (["diff", "a.jsonl", "vllm-v1"], "A: a.jsonl: no such trace file"),
])
def test_cli_refuses_bad_arguments_in_one_line(args: list[str], expected: str) -> None:
    result = kvsched(*args)
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert expected in result.stderr


def test_bad_workload_leaves_no_trace_behind(tmp_path: Path) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text('{"id": "a", "arrival": 0, "prompt_len": 4, "output_len": 2, '
                        '"max_tokens": 3}\n{"id": "b", "arrival": 0, "prompt_len": 4, '
                        '"output_len": 2, "max_tokens": 3, "colour": "red"}\n')
    out = tmp_path / "trace.jsonl"
    result = kvsched("simulate", "--workload", str(workload), "--out", str(out))
    assert result.returncode == 2
    assert f"{workload}:2: unknown field 'colour'" in result.stderr
    assert result.stderr.count("\n") == 1
    assert not out.exists() and not (tmp_path / "trace.jsonl.part").exists()


@pytest.mark.parametrize("content,expected", [
    ("", "empty workload"),
    ('{"id": "a", "arrival": 0, "prompt_len": 4, "output_len": 2}\n',
     ":1: missing field 'max_tokens'"),
    ('{"id": "a", "arrival": -1, "prompt_len": 4, "output_len": 2, "max_tokens": 3}\n',
     ":1: arrival of 'a' must be at least 0, got -1"),
    ('{"id": "a", "arrival": 0, "prompt_len": 4, "output_len": 2, "max_tokens": 3}\n' * 2,
     "request id 'a' appears twice"),
    ('not json\n', ":1: malformed JSON"),
    ('{"id": "a", "arrival": 1000000000000, "prompt_len": 4, "output_len": 2, '
     '"max_tokens": 3}\n', ":1: arrival of 'a' is step 1000000000000, more than 10,000,000 "
     "steps away"),
    ('{"id": "a", "arrival": 0, "prompt_len": 4, "output_len": 2, "max_tokens": 3, '
     '"abort": 99999999999}\n', ":1: abort of 'a' is step 99999999999"),
    ('{"id": "a", "arrival": 0, "prompt_len": 4, "output_len": 2, "max_tokens": 3, '
     '"priority": 1e400}\n', ":1:"),
    ('{"id": "r1", "arrival": 0, "prompt_len": 4, "output_len": 2, "max_tokens": 3}\n'
     '{"id": "r4", "arrival": 5, "prompt_len": 4, "output_len": 2, "max_tokens": 3, '
     '"abort": 3}\n', ":2: abort of 'r4' is step 3, before its arrival at step 5"),
])
def test_bad_workload_file(tmp_path: Path, content: str, expected: str) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text(content)
    result = kvsched("simulate", "--workload", str(workload))
    assert result.returncode == 2
    assert expected in result.stderr and result.stderr.count("\n") == 1, result.stderr


def test_an_abort_in_the_arrival_step_is_a_workload_of_its_own() -> None:
    from kvsched.workload import WorkItem, validate

    # The client cancels in the step its request arrives: allowed, the step aborts it.
    assert validate([WorkItem("a", 2, 4, 2, 3, abort=2)])[0].abort == 2
    with pytest.raises(ValueError, match="abort of 'a' is step 1, before its arrival at "
                                         "step 2"):
        validate([WorkItem("a", 2, 4, 2, 3, abort=1)])


# -- compressed traces cut short or damaged ----------------------------------------------

def compressed_cut(kind: str, cut: str) -> bytes:
    """A trace of 30,000 steps, compressed (`kind`) and cut (`cut`): to its first bytes,
    in its first frame's header, in the middle, or where a flushed block ends, so that
    what comes out is whole lines and the stream just stops (a shorter trace, were the
    cut not noticed)."""
    import zlib

    import zstandard

    first = lines(HEADER, *({"step": i} for i in range(15_000)))
    rest = lines(*({"step": i} for i in range(15_000, 30_000)), {"end": True})
    if kind == "zstd":
        z = zstandard.ZstdCompressor().compressobj()
        head = z.compress(first) + z.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        whole = head + z.compress(rest) + z.flush()
    else:
        g = zlib.compressobj(wbits=31)  # the gzip container
        head = g.compress(first) + g.flush(zlib.Z_FULL_FLUSH)
        whole = head + g.compress(rest) + g.flush()
    at = {"3 bytes": 3, "8 bytes": 8, "middle": len(whole) // 2, "block end": len(head)}
    return whole[:at[cut]]


@pytest.mark.parametrize("checker", ["spec", "vectorized"])
@pytest.mark.parametrize("cut", ["3 bytes", "8 bytes", "middle", "block end"])
@pytest.mark.parametrize("kind", ["zstd", "gzip"])
def test_a_compressed_trace_cut_short_is_told_so(kind: str, cut: str, checker: str,
                                                 tmp_path: Path, cli: Any) -> None:
    path = tmp_path / "trace.jsonl.zst"
    path.write_bytes(compressed_cut(kind, cut))
    ran = cli("check", "--checker", checker, str(path))
    assert ran.exit_code == 2 and ran.stdout == "", ran.stdout
    assert ran.stderr.startswith(f"kvsched: error: {path}: the {kind} data is damaged or "
                                 "cut short ("), ran.stderr
    assert ran.stderr.count("\n") == 1 and "Traceback" not in ran.stderr


@pytest.mark.parametrize("checker", ["spec", "vectorized"])
def test_corrupt_zstd_data_is_told_so(checker: str, tmp_path: Path, cli: Any) -> None:
    import zstandard

    # With the frame's checksum written a flipped byte is found wherever it falls (zstd
    # has no other check of the data itself).
    packed = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(
        lines(HEADER, *({"step": i} for i in range(2000)))))
    packed[len(packed) // 2] ^= 0xFF
    path = tmp_path / "trace.jsonl.zst"
    path.write_bytes(bytes(packed))
    ran = cli("check", "--checker", checker, str(path))
    assert ran.exit_code == 2 and ran.stdout == ""
    assert ran.stderr == (f"kvsched: error: {path}: the zstd data is damaged or cut short "
                          "(zstd decompressor error: Restored data doesn't match checksum)\n")


def test_zstd_frames_one_after_another_are_one_trace(tmp_path: Path, cli: Any) -> None:
    import zstandard

    data = lines(HEADER, ARRIVE, {"step": 1, "scheduled": [["r1", 1]], "finished": ["r1"]},
                 {"end": True})
    cut = data.index(b'{"step": 1')
    path = tmp_path / "trace.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(data[:cut])
                     + zstandard.ZstdCompressor().compress(data[cut:]))
    ran = cli("check", "--checker", "spec", str(path))
    assert ran.exit_code == 0, ran.stderr
    assert ran.stdout.startswith(f"OK {path}: 2 steps, 1 requests")


@pytest.mark.parametrize("case", sorted(set(CASES) - {GZIP_CUT}))
def test_the_spec_reader_words_each_refusal_itself(case: str) -> None:
    # In-process, the same refusals as the command's: the reader alone says them.
    data, expected = CASES[case]
    with pytest.raises(TraceError) as e:
        check_trace(TraceReader(io.BytesIO(data)))
    assert str(e.value).startswith(expected) or expected in str(e.value), str(e.value)
    assert str(e.value) == f"line {e.value.line}: {e.value.message}"


@pytest.mark.parametrize("data,message", [
    (lines(HEADER, True), "line 2: expected a step object, got true"),
    (lines(HEADER, False), "line 2: expected a step object, got false"),
    (lines(HEADER, "step"), "line 2: expected a step object, got a string"),
    (b"\n\n" + lines([1]), 'line 3: expected a header object with "kvsched": "trace"'),
    (b"\xef\xbb\xbf" + lines(HEADER), "line 1: the line starts with a UTF-8 byte order mark "
     "(BOM): save the file as UTF-8 without one"),
    (lines(HEADER) + b'{"step": ' + b"9" * 5000 + b"}\n", "line 2: a number with more than "
     "4300 digits (the largest count a trace may hold is 2**40)"),
    (lines(HEADER, {"step": 0, "rejected": [{"id": 3}]}),
     "line 2: rejected id must be a non-empty string, got 3"),
    (lines(HEADER, {"step": 0, "preempted": [{"id": 3, "mode": "swap"}]}),
     "line 2: preempted id must be a non-empty string, got 3"),
    *((lines(HEADER, {"step": 0, key: {}}), f'line 2: "{key}" must be a list, got dict')
      for key in ("rejected", "preempted", "scheduled", "swapped_in", "finished")),
])
def test_the_spec_reader_words_these_refusals_in_full(data: bytes, message: str) -> None:
    with pytest.raises(TraceError) as e:
        list(TraceReader(io.BytesIO(data)))
    assert str(e.value) == message


def test_kind_names_a_json_value_for_messages() -> None:
    values: list[object] = [None, True, False, 7, 1.5, "x", [], {}]
    assert [kind(v) for v in values] == [
        "null", "true", "false", "the number 7", "the number 1.5", "a string", "a list",
        "an object"]


def test_a_header_read_on_its_own_is_line_1() -> None:
    with pytest.raises(TraceError) as e:
        parse_header({})
    assert str(e.value) == 'line 1: expected a header object with "kvsched": "trace"'


def test_a_line_of_exactly_the_longest_length_is_read() -> None:
    # 64 MiB before the newline is allowed (and then malformed JSON); one byte more is not.
    data = lines(HEADER) + b"x" * MAX_LINE_BYTES + b"\n"
    with pytest.raises(TraceError) as e:
        list(TraceReader(io.BytesIO(data)))
    assert str(e.value) == "line 2: malformed JSON: expected one JSON object per line"
    with pytest.raises(TraceError) as e:
        list(TraceReader(io.BytesIO(lines(HEADER) + b"x" * (MAX_LINE_BYTES + 1) + b"\n")))
    assert str(e.value) == ("line 2: the line is longer than 64 MiB (the longest line a trace "
                            "may have)")


class EndlessLine(io.BytesIO):
    """A header, then a line that never ends: reading it whole would never return."""

    def readline(self, size: int | None = -1) -> bytes:
        if self.tell() == 0:
            return super().readline(size)
        if size is None or size < 0:
            raise AssertionError("the reader asked for the whole of an endless line")
        return b"x" * size


def test_an_endless_line_is_read_only_as_far_as_the_limit() -> None:
    stream = EndlessLine(lines(HEADER))
    with pytest.raises(TraceError) as e:
        list(TraceReader(stream))
    assert str(e.value).startswith("line 2: the line is longer than 64 MiB")


def test_the_reader_keeps_every_field_of_a_step() -> None:
    big = 2**40  # the largest count a trace may hold
    header = {**HEADER, "engine": {"name": "t", "version": 2}, "note": "x"}
    data = lines(header,
                 {"step": 0, "arrivals": [{"id": "a", "prompt_len": 5, "max_tokens": 2}]},
                 {"step": 1, "arrivals": [{"id": "b", "prompt_len": 4, "max_tokens": 1,
                                           "priority": 3}],
                  "rejected": [{"id": "b", "reason": "too long"}, {"id": "c"}], "time_ms": 2,
                  "colour": 1},
                 {"step": 2, "arrivals": [{"id": "d", "prompt_len": 5, "max_tokens": 2,
                                           "priority": -big}],
                  "scheduled": [["a", big]], "free_blocks": big, "colour": 2, "shade": 3})
    reader = TraceReader(io.BytesIO(b"\n" + data))
    assert reader.header.engine == {"name": "t", "version": "2"}
    assert reader.header.extra == {"note": "x"}
    assert reader.complete is False
    r0, r1, r2 = reader
    assert r0.arrivals == (Request("a", 5, 2, 0, 0),) and r1.arrivals == (Request("b", 4, 1, 3, 1),)
    assert r1.rejected == (Rejection("b", "too long"), Rejection("c", ""))
    assert r0.time_ms is None and r1.time_ms == 2.0 and isinstance(r1.time_ms, float)
    assert r2.arrivals[0].priority == -big and r2.scheduled == (("a", big),)
    assert r2.free_blocks == big
    assert (r0.line, r1.line, r2.line) == (3, 4, 5)
    assert reader.unknown_keys == {"colour": 4, "shade": 5}


# -- Ray's options ---------------------------------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (["--workers", "0"], "--workers must be at least 1, got 0"),
    (["--ray-address", "nohost"], "--ray-address 'nohost': expected HOST:PORT (the head "
                                  "node's address, as `ray start --head` prints it), "
                                  "ray://HOST:PORT or auto"),
    (["--ray-address", "127.0.0.1:99999"], "--ray-address '127.0.0.1:99999': expected"),
    (["--ray-address", "127.0.0.1:1"], "--ray-address 127.0.0.1:1: no Ray cluster answers "
                                       "there (Connection refused)"),
])
@pytest.mark.parametrize("command", ["check", "fuzz"])
def test_bad_ray_options_are_one_line(tmp_path: Path, command: str, args: list[str],
                                      message: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(lines(HEADER, ARRIVE))
    out = tmp_path / "report.xml"
    target = [str(trace)] if command == "check" else [
        "kvsched.testing.seeded_bugs:tight_config", "--examples", "1"]
    result = kvsched(command, *target, *args, "--junit", str(out))
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and result.stderr.startswith(f"kvsched: error: {message}")
    assert result.stderr.count("\n") == 1 and not out.exists()


def test_ray_options_without_ray_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text("raise ImportError('absent')\n")
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(lines(HEADER, ARRIVE))
    for args, option in ((["--workers", "2"], "--workers"), (["--ray"], "--ray")):
        result = subprocess.run([sys.executable, "-m", "kvsched", "check", str(trace), *args],
                                capture_output=True, text=True, timeout=60,
                                env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr == (f"kvsched: error: {option} needs Ray: pip install "
                                 "'kvsched[ray]'\n")


def test_standard_input_is_not_handed_to_ray_workers(tmp_path: Path) -> None:
    result = kvsched("check", "-", "--workers", "2")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("kvsched: error: -: standard input cannot be handed to "
                                    "Ray workers")
