"""Bad input: one line on stderr naming where and what, exit code 2, no traceback,
and nothing half-written left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
                 "line 3: preemption mode must be recompute or swap"),
    "bad scheduled entry": (lines(HEADER, {"step": 0, "scheduled": [["r1"]]}),
                            'line 2: each "scheduled" entry must be [id, tokens]'),
    "prefix hits": (lines(HEADER, {**ARRIVE, "prefix_hits": {"r1": [1]}}),
                    "line 2: \"prefix_hits\": prefix caching is not supported yet"),
    "after end": (lines(HEADER, ARRIVE, {"end": True}, {"step": 1}),
                  'line 4: nothing may follow the {"end": true} line'),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_check_refuses_bad_trace_in_one_line(case: str, tmp_path: Path) -> None:
    data, expected = CASES[case]
    path = tmp_path / "trace.jsonl"
    path.write_bytes(data)
    result = kvsched("check", str(path))
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"{path}: {expected}" in result.stderr, result.stderr


def test_check_missing_file_and_directory(tmp_path: Path) -> None:
    for target, expected in ((tmp_path / "nope.jsonl", "cannot read"),
                             (tmp_path, "is a directory")):
        result = kvsched("check", str(target))
        assert result.returncode == 2
        assert expected in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.parametrize("args,expected", [
    (["simulate", "--num-gpu-blocks", "-4"], "--num-gpu-blocks must not be negative"),
    (["simulate", "--block-size", "0"], "--block-size must be at least 1"),
    (["simulate", "--no-chunked-prefill", "--max-num-batched-tokens", "64",
      "--max-model-len", "128"], "--max-num-batched-tokens must be at least max_model_len"),
    (["simulate", "--policy", "lifo"], "Invalid value for '--policy'"),
    (["simulate", "--requests", "0"], "--requests must be at least 1"),
    (["simulate", "--unknown-flag"], "No such option"),
    (["check"], "Missing argument 'TRACES...'"),
    (["check", "x.jsonl", "--profile", "nope"], "Invalid value for '--profile'"),
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
])
def test_bad_workload_file(tmp_path: Path, content: str, expected: str) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text(content)
    result = kvsched("simulate", "--workload", str(workload))
    assert result.returncode == 2
    assert expected in result.stderr and result.stderr.count("\n") == 1, result.stderr
