"""Traces as users keep them (compressed, piped), long work that shows progress, and a
run stopped by SIGTERM that leaves nothing half-written."""

from __future__ import annotations

import gzip
import io
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zstandard

from kvsched.optimized.checker import check_trace_vectorized
from kvsched.spec import TraceReader, check_trace

SMALL = ["--requests", "60", "--num-gpu-blocks", "64", "--max-num-seqs", "8",
         "--max-model-len", "1024"]


def kvsched(*args: str, stdin: bytes | None = None, cwd: Path | None = None
            ) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "kvsched", *args], input=stdin,
                          capture_output=True, timeout=300, cwd=cwd)


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("inputs") / "trace.jsonl"
    assert kvsched("simulate", *SMALL, "--out", str(path)).returncode == 0
    return path


def first_line(result: subprocess.CompletedProcess[bytes]) -> str:
    return result.stdout.decode().splitlines()[0]


@pytest.mark.parametrize("checker", ["spec", "vectorized"])
def test_compressed_and_piped_traces_get_the_same_verdict(trace: Path, tmp_path: Path,
                                                          checker: str) -> None:
    data = trace.read_bytes()
    gz = tmp_path / "trace.jsonl.gz"
    gz.write_bytes(gzip.compress(data))
    zst = tmp_path / "trace.zst"  # found by its first bytes, not by its name
    zst.write_bytes(zstandard.ZstdCompressor().compress(data))
    plain = kvsched("check", "--checker", checker, str(trace))
    assert plain.returncode == 0
    verdict = first_line(plain).split(": ", 1)[1]
    for name in (gz, zst):
        result = kvsched("check", "--checker", checker, str(name))
        assert result.returncode == 0 and first_line(result) == f"OK {name}: {verdict}"
    piped = kvsched("check", "--checker", checker, "-", stdin=data)
    assert piped.returncode == 0 and first_line(piped) == f"OK -: {verdict}"
    zipped = kvsched("check", "--checker", checker, "-", stdin=gzip.compress(data))
    assert zipped.returncode == 0 and first_line(zipped) == f"OK -: {verdict}"
    metrics = kvsched("metrics", "--format", "json", str(zst))
    assert json.loads(metrics.stdout)["requests"] == 60


def test_blank_lines_are_skipped_alike_by_both_checkers(trace: Path) -> None:
    lines = trace.read_bytes().splitlines(keepends=True)
    spaced = lines[0] + b"".join(line + b"\n" * 300 + b"  \n" for line in lines[1:])
    spec = check_trace(TraceReader(io.BytesIO(spaced)))
    fast = check_trace_vectorized(io.BytesIO(spaced))
    assert (fast.counts, fast.steps, fast.scheduled_entries) == (spec.counts, spec.steps,
                                                                  spec.scheduled_entries)
    assert spec.steps == len(lines) - 2 and not spec.counts


def test_progress_is_plain_lines_off_a_terminal_when_asked(trace: Path,
                                                           tmp_path: Path) -> None:
    # A file of the test's own: a test never writes a system path (/dev/null) through
    # an output option.
    out = str(tmp_path / "trace.jsonl")
    quiet = kvsched("simulate", *SMALL, "--requests", "3000", "--out", out)
    assert quiet.returncode == 0 and quiet.stderr == b""  # no terminal: no progress
    loud = kvsched("simulate", *SMALL, "--requests", "3000", "--out", out, "--progress")
    assert loud.returncode == 0
    assert loud.stderr.endswith(b"simulating: 3,000 requests of 3,000 requests (100%)\n")
    assert b"\x1b" not in loud.stderr  # lines for a log, not a terminal's bar
    silent = kvsched("check", "--no-progress", str(trace))
    assert silent.stderr == b""


def test_sigterm_leaves_no_part_file(tmp_path: Path) -> None:
    out = tmp_path / "big.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "kvsched", "simulate", "--requests",
                             "100000", "--out", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    part = tmp_path / "big.jsonl.part"
    deadline = time.monotonic() + 120
    while not part.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert part.exists(), "the simulation never started writing"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143 and stderr == b"kvsched: terminated\n"
    assert list(tmp_path.iterdir()) == []


def test_check_metrics_and_diff_show_progress_when_asked(trace: Path) -> None:
    size = trace.stat().st_size / 1e6
    check = kvsched("check", "--progress", str(trace))
    assert check.stderr.decode().endswith(
        f"checking {trace}: {size:,.1f} MB of {size:,.1f} MB (100%)\n")
    metrics = kvsched("metrics", "--progress", str(trace))
    assert metrics.stderr.decode().startswith("reading: ")
    diff = kvsched("diff", "--progress", str(trace), str(trace))
    assert diff.returncode == 0 and diff.stderr.decode().startswith("diffing: ")
    for args in (["check", str(trace)], ["metrics", str(trace)], ["diff", str(trace),
                                                                    str(trace)]):
        assert kvsched(*args).stderr == b""  # off a terminal, silent unless asked


def test_a_verdict_leads_with_one_line_per_broken_invariant(tmp_path: Path) -> None:
    header = {"kvsched": "trace", "version": 1, "config": {
        "block_size": 4, "num_gpu_blocks": 8, "num_cpu_blocks": 0,
        "max_num_batched_tokens": 32, "max_num_seqs": 4, "max_model_len": 32,
        "chunked_prefill": True, "long_prefill_token_threshold": 0, "policy": "fcfs",
        "preemption": "recompute", "watermark_blocks": 0}}
    steps = [{"step": i, "scheduled": [[f"ghost{i}", 1]]} for i in range(30)]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in [header, *steps]))
    text = kvsched("check", "--max-violations", "3", str(path)).stdout.decode()
    lines = text.splitlines()
    assert lines[1] == "  MUST one-state: 30 violations, first at step 0, ghost0"
    assert text.count("│ one-state") == 3  # 3 rows of the table
    assert "(27 more not shown; --max-violations N shows more" in text
    assert "ghost29" not in text


def test_the_docs_stand_alone() -> None:
    root = Path(__file__).resolve().parent.parent
    for page in sorted((root / "docs").rglob("*.md")):
        assert "design.md" not in page.read_text(encoding="utf-8"), page
