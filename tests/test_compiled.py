"""The compiled scheduler's own loop and its place in the tool.

Its decisions are the reference's (the PEP 399 suite through scheduler_factory, and the
lockstep machine of test_differential.py); here: its simulation loop writes the trace
kvsched.simulate.run writes with the reference, byte for byte; `kvsched simulate`'s metrics
of its run (its lines read by the compiled state) are those the spec's state gives from that
trace; and
`kvsched simulate` takes it by default where it implements the profile, and says so.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsched.metrics import metrics_of
from kvsched.optimized.compiled import LINE_BLOCK, CompiledScheduler, simulate
from kvsched.reference import ReferenceScheduler
from kvsched.simulate import run
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Config, StepRecord
from kvsched.spec.trace import TraceWriter
from kvsched.strategies import configs, policies, resolve, workloads

MAX_STEPS = 300


def trace_lines(records: list[StepRecord]) -> bytes:
    out = io.BytesIO()
    writer = TraceWriter(out, lambda o: orjson.dumps(o) + b"\n")
    for rec in records:
        writer.step(rec)
    return out.getvalue()


@given(config=st.one_of(configs(), configs(prefix_caching=True)), setup=policies(),
       data=st.data(), block_ids=st.booleans())
def test_its_simulation_loop_writes_the_references_trace(config: Config, setup: str | Knobs,
                                                          data: st.DataObject,
                                                          block_ids: bool) -> None:
    config, knobs = resolve(config, setup)
    items = data.draw(workloads(config, shared=config.prefix_caching), label="workload")
    reference = list(run(ReferenceScheduler(config, knobs), items, block_ids=block_ids,
                         max_steps=MAX_STEPS))
    compiled = list(simulate(CompiledScheduler(config, knobs), items, block_ids, MAX_STEPS))
    assert compiled == reference
    assert trace_lines(compiled) == trace_lines(reference)
    # Its own lines (written without records): the same bytes.
    blocks = list(simulate(CompiledScheduler(config, knobs), items, block_ids, MAX_STEPS,
                                                            lines=True))
    assert b"".join(block for block, _, _, _ in blocks) == trace_lines(reference)
    assert all(facts is None for _, _, _, facts in blocks)  # not asked for
    # Each block: its steps' count and what they ended.
    assert sum(count for _, count, _, _ in blocks) == len(reference)
    assert sum(ended for _, _, ended, _ in blocks) == sum(r.num_ended for r in reference)


def test_its_lines_write_any_id_as_json_does() -> None:
    """Ids with quotes, backslashes, control characters and non-ASCII text, rejected,
    aborted, preempted and prefix-hitting: the compiled loop's own lines are orjson's."""
    from kvsched.spec.profiles import get_profile
    from kvsched.workload import WorkItem, validate

    odd = ['a"b', "c\\d", "e\nf", "\u00e9t\u00e9", "\x7f", "\U0001f600", "tab\t", "/x/"]
    config = Config(block_size=4, num_gpu_blocks=12, max_num_batched_tokens=32,
                    max_num_seqs=4, max_model_len=64, prefix_caching=True)
    items = validate([WorkItem(rid, i // 2, 6 + 3 * i, 5 + i, 6 + i,
                               abort=3 if i == 2 else None,
                               prefix=("sys", 8) if i % 2 else None)
                      for i, rid in enumerate([*odd, "huge"])]
                     + [WorkItem("too-long", 0, 200, 1, 1)])
    knobs = get_profile("vllm-v1").knobs
    reference = list(run(ReferenceScheduler(config, knobs), items))
    assert any(r.rejected for r in reference) and any(r.aborted for r in reference)
    assert any(r.preempted for r in reference) and any(r.prefix_hits for r in reference)
    lines = simulate(CompiledScheduler(config, knobs), items, True, None, lines=True)
    assert b"".join(block for block, _, _, _ in lines) == trace_lines(reference)


@pytest.mark.parametrize("max_steps", [None, LINE_BLOCK, LINE_BLOCK + 1, 3 * LINE_BLOCK - 7])
def test_its_lines_come_in_blocks_of_steps(max_steps: int | None) -> None:
    """A run of several blocks, and one stopped at, just past and inside a block's end:
    whole blocks of LINE_BLOCK steps, then the rest, the reference's trace byte for byte."""
    from kvsched.generators import generate
    from kvsched.spec.profiles import get_profile

    config = Config(block_size=16, num_gpu_blocks=400, max_num_batched_tokens=512,
                    max_num_seqs=16, max_model_len=2048, prefix_caching=True)
    knobs = get_profile("vllm-v1").knobs
    items = generate("shared-prompts", 120, seed=3, max_model_len=config.max_model_len)
    reference = list(run(ReferenceScheduler(config, knobs), items))
    assert len(reference) > 3 * LINE_BLOCK
    reference = reference[:max_steps]
    blocks = list(simulate(CompiledScheduler(config, knobs), items, True, max_steps,
                                                            lines=True))
    counts = [count for _, count, _, _ in blocks]
    assert counts[:-1] == [LINE_BLOCK] * (len(counts) - 1) and 0 < counts[-1] <= LINE_BLOCK
    assert sum(counts) == len(reference)
    assert b"".join(block for block, _, _, _ in blocks) == trace_lines(reference)
    assert sum(ended for _, _, ended, _ in blocks) == sum(r.num_ended for r in reference)


@given(config=st.one_of(configs(), configs(prefix_caching=True)), setup=policies(),
       data=st.data())
def test_simulate_gives_the_metrics_of_its_trace(config: Config, setup: str | Knobs,
                                                 data: st.DataObject) -> None:
    """Queues, KV use, TTFT, TPOT, latency, preemptions, recomputed tokens, prefix-cache
    counters, each step's series: what `kvsched simulate` counts of the compiled
    scheduler's own decisions (the RunFacts its loop hands the metrics, nothing read
    back) is what the spec's state derives from its records."""
    from kvsched.commands.simulate import Run, compiled_lines
    from kvsched.metrics import MetricsCollector
    from kvsched.spec.should import DEFAULT_STALL_STEPS

    config, knobs = resolve(config, setup)
    items = data.draw(workloads(config, shared=config.prefix_caching), label="workload")
    records = list(simulate(CompiledScheduler(config, knobs), items, True, MAX_STEPS))
    scheduler = CompiledScheduler(config, knobs)
    collector = MetricsCollector(config)
    stretches = list(compiled_lines(Run("compiled", scheduler, items, True, MAX_STEPS,
                                        DEFAULT_STALL_STEPS,
                                        None, None, collector), scheduler))
    assert sum(steps for steps, _ in stretches) == len(records)
    assert collector.result() == metrics_of(config, records)


@pytest.mark.parametrize(("profile", "overrides"), [
    ("vllm-v1", {}), ("vllm-v1", {"policy": "priority"}), ("sarathi", {}),
    ("vllm-v1", {"preemption": "swap", "num_cpu_blocks": 200, "prefix_caching": False}),
    ("vllm-v1", {"allocation": "full", "max_num_seqs": 32})])
def test_simulate_counts_the_facts_the_compiled_state_reads_off_its_lines(
        profile: str, overrides: dict[str, Any]) -> None:
    """Over many blocks of lines, under pressure (preemptions by recompute and swap,
    swap-ins, prefix hits and evictions), cut short with requests still live: the facts
    the loop counts as it decides give the metrics `kvsched metrics` reads off its
    trace, series included."""
    from kvsched.commands.options import dumps_line
    from kvsched.commands.simulate import Run, compiled_lines
    from kvsched.generators import generate
    from kvsched.metrics import MetricsCollector, metrics_of_trace
    from kvsched.spec.profiles import get_profile
    from kvsched.spec.should import DEFAULT_STALL_STEPS

    config = replace(Config(block_size=16, num_gpu_blocks=160, max_num_batched_tokens=512,
                            max_num_seqs=16, max_model_len=2048, prefix_caching=True),
                     **overrides)
    knobs = get_profile(profile).knobs
    items = generate("shared-prompts", 200, seed=5, max_model_len=config.max_model_len)
    for max_steps in (None, 3 * LINE_BLOCK + 5):
        scheduler = CompiledScheduler(config, knobs)
        collector = MetricsCollector(config)
        out = io.BytesIO()
        writer = TraceWriter(out, dumps_line)
        writer.header(config, {"name": "kvsched-compiled", "version": "0"})
        stretches = list(compiled_lines(Run("compiled", scheduler, items, True, max_steps,
                                            DEFAULT_STALL_STEPS, writer, None, collector),
                                        scheduler))
        assert sum(steps for steps, _ in stretches) > 3 * LINE_BLOCK
        out.seek(0)
        ours, read = collector.result(), metrics_of_trace(out)
        assert ours == read
        if config.allocation != "full":  # a whole sequence's blocks: no preemption
            assert ours.preemptions[config.preemption] > 0
        if config.preemption == "swap":
            assert ours.swap_ins > 0
        assert (ours.unfinished > 0) == (max_steps is not None)
        if config.prefix_caching:
            assert ours.prefix_cache is not None and ours.prefix_cache.hit_tokens > 0


def test_it_refuses_what_it_does_not_implement_in_one_line() -> None:
    from kvsched.spec.profiles import get_profile

    v0 = get_profile("vllm-v0").knobs
    with pytest.raises(ValueError, match=r"^the compiled scheduler runs vLLM v1's step: vLLM "
                                         r"v1's step does not read knob v0\.grow_check exact"):
        CompiledScheduler(Config(), replace(v0, v0=replace(v0.v0, grow_check="exact")))
    with pytest.raises(ValueError, match="at most 4,194,304"):
        CompiledScheduler(Config(num_gpu_blocks=2**22 + 1))
    with pytest.raises(ValueError, match="block_size must be at least 1"):
        CompiledScheduler(Config(block_size=0))


# -- kvsched simulate -----------------------------------------------------------------------

SMALL = ["--requests", "30", "--num-gpu-blocks", "64", "--max-num-seqs", "8",
         "--max-model-len", "1024", "--rate", "0.5"]


def kvsched(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, timeout=300)


def test_simulate_takes_the_compiled_scheduler_and_says_so(tmp_path: Path) -> None:
    auto, ref = tmp_path / "auto.jsonl", tmp_path / "ref.jsonl"
    result = kvsched("simulate", *SMALL, "--out", str(auto))
    assert result.returncode == 0, result.stderr
    assert "vllm-v1 on the compiled scheduler" in " ".join(result.stdout.split())
    assert kvsched("simulate", *SMALL, "--scheduler", "reference", "--out",
                   str(ref)).returncode == 0
    a, r = auto.read_text().splitlines(), ref.read_text().splitlines()
    assert json.loads(a[0])["engine"]["name"] == "kvsched-compiled"
    assert json.loads(r[0])["engine"]["name"] == "kvsched-reference"
    assert a[1:] == r[1:]  # every step, byte for byte
    summary = json.loads(kvsched("simulate", *SMALL, "--format", "json").stdout)
    assert summary["scheduler"] == "compiled" and summary["violations"] is None


def test_simulate_takes_the_reference_where_the_compiled_scheduler_does_not_apply() -> None:
    summary = json.loads(kvsched("simulate", *SMALL, "--profile", "vllm-v0",
                                 "--format", "json").stdout)
    assert summary["scheduler"] == "reference"
    refused = kvsched("simulate", *SMALL, "--profile", "vllm-v0", "--scheduler", "compiled")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("kvsched: error: --scheduler compiled: ")


@pytest.mark.parametrize("scheduler", ["compiled", "reference"])
def test_simulate_checks_its_run_when_asked(scheduler: str) -> None:
    text = kvsched("simulate", *SMALL, "--scheduler", scheduler, "--check")
    assert text.returncode == 0 and "checked as it ran: no invariant broken" in text.stdout
    summary = json.loads(kvsched("simulate", *SMALL, "--scheduler", scheduler, "--check",
                                 "--format", "json").stdout)
    assert summary["violations"] == {}
    plain = json.loads(kvsched("simulate", *SMALL, "--scheduler", scheduler,
                               "--format", "json").stdout)
    assert plain["metrics"] == summary["metrics"]  # the metrics need no checker
