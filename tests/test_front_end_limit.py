"""Config max_prompt_len, the longest prompt an engine's front end takes: longer prompts
are rejected in their arrival step, and MUST `reject` calls that rejection clean on both
checkers; SGLang's profile sets it to SGLang's own limit (max_req_len - 6), vLLM's steps
take only 0 (no limit of their own)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kvsched.optimized.checker import check_trace_vectorized
from kvsched.reference import SGLangScheduler, reference_scheduler
from kvsched.reference.sglang import max_req_len
from kvsched.simulate import run
from kvsched.spec import Config, TraceReader, check_trace
from kvsched.spec.blocks import rejectable
from kvsched.spec.model import Rejection, Request, StepRecord
from kvsched.spec.profiles import get_profile
from kvsched.spec.step_kinds import refusal
from kvsched.spec.trace import TraceWriter
from kvsched.workload import WorkItem, validate

SGLANG = get_profile("sglang@0.5.23")


def test_max_prompt_len_must_be_within_max_model_len_and_not_negative() -> None:
    assert Config(max_model_len=16, max_prompt_len=16).problems() == []
    assert Config(max_prompt_len=0).problems() == []
    assert Config(max_model_len=16, max_prompt_len=17).problems() == [
        "config.max_prompt_len must be at most max_model_len (16), got 17"]
    assert Config(max_prompt_len=-1).problems() == [
        "config.max_prompt_len must not be negative, got -1"]


def test_a_prompt_longer_than_the_limit_is_rejectable_and_one_within_it_is_not() -> None:
    c = Config(block_size=1, num_gpu_blocks=64, max_model_len=64, max_prompt_len=20)
    assert rejectable(c, 20, 4) is None
    why = rejectable(c, 21, 4)
    assert why is not None and "max_prompt_len 20" in why
    assert rejectable(replace(c, max_prompt_len=0), 21, 4) is None  # no limit of its own


@pytest.mark.parametrize(("model_len", "blocks", "block_size"),
                         [(16, 16, 1), (2048, 300, 1), (2048, 18, 16), (100, 1000, 4)])
def test_sglang_profile_sets_sglangs_own_limit(model_len: int, blocks: int,
                                                block_size: int) -> None:
    """SGLang's front end refuses prompts of max_req_input_len = max_req_len - 5 tokens
    or more (validate_input_length: len >= max_req_input_len), max_req_len = min(context
    - 1, pool tokens - 1) (tp_worker.py:568-572): it takes max_req_len - 6 at most."""
    c = SGLANG.configure(Config(block_size=block_size, num_gpu_blocks=blocks,
                                max_model_len=model_len))
    assert c.max_prompt_len == max_req_len(c) - 6
    given = SGLANG.configure(Config(max_model_len=model_len, max_prompt_len=5),
                             frozenset({"max_prompt_len"}))
    assert given.max_prompt_len == 5


def test_vllm_steps_take_only_no_limit() -> None:
    assert refusal("v1", Config(max_prompt_len=0)) is None
    why = refusal("v1", Config(max_prompt_len=100))
    assert why is not None and "max_prompt_len 100" in why
    assert refusal("v0", Config(max_prompt_len=100)) is not None
    assert refusal("sglang", SGLANG.configure(Config(max_prompt_len=100),
                                              frozenset({"max_prompt_len"}))) is None


def test_sglang_rejects_a_prompt_of_max_model_len_on_arrival() -> None:
    """kvsched simulate --profile sglang@0.5.23 --max-model-len 16 --num-gpu-blocks 16
    --block-size 1 with a prompt of 16 tokens: rejected in its arrival step, as SGLang
    refuses it (it stalled: its step admitted nothing, the reserve never fitting)."""
    c = SGLANG.configure(Config(block_size=1, num_gpu_blocks=16, max_num_batched_tokens=16,
                                max_num_seqs=4, max_model_len=16))
    assert c.max_prompt_len == 9
    s = reference_scheduler(SGLANG, c)
    assert isinstance(s, SGLangScheduler)
    items = validate([WorkItem("full", 0, 16, 1, 1), WorkItem("over", 1, 10, 1, 1),
                      WorkItem("at", 2, 9, 1, 1)])
    records = list(run(s, items))
    rejected = {r.id: rec.step for rec in records for r in rec.rejected}
    assert rejected == {"full": 0, "over": 1}
    assert any("at" in rec.finished for rec in records)


def trace(config: Config, records: list[StepRecord]) -> bytes:
    out = io.BytesIO()
    writer = TraceWriter(out)
    writer.header(config, {"name": "test"})
    for rec in records:
        writer.step(rec)
    writer.end()
    return out.getvalue()


@pytest.mark.parametrize(("prompt", "clean"), [(21, True), (20, False)])
def test_both_checkers_judge_a_rejection_by_the_declared_limit(prompt: int,
                                                              clean: bool) -> None:
    c = Config(block_size=1, num_gpu_blocks=64, max_num_batched_tokens=64,
               max_model_len=64, max_prompt_len=20)
    data = trace(c, [StepRecord(0, arrivals=(Request("r0", prompt, 4),),
                                rejected=(Rejection("r0", "too long"),), free_blocks=64)])
    spec = check_trace(TraceReader(io.BytesIO(data)))
    fast = check_trace_vectorized(io.BytesIO(data))
    for report in (spec, fast):
        assert [v.invariant for v in report.violations if v.level == "MUST"] == \
            ([] if clean else ["reject"])
    # without a declared limit the same rejection breaks MUST reject
    bare = check_trace_vectorized(io.BytesIO(trace(replace(c, max_prompt_len=0), [
        StepRecord(0, arrivals=(Request("r0", 21, 4),),
                   rejected=(Rejection("r0", "too long"),), free_blocks=64)])))
    assert [v.invariant for v in bare.violations if v.level == "MUST"] == ["reject"]


def test_simulate_under_sglang_writes_the_limit_and_rejects_past_it(tmp_path: Path) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps(w) + "\n" for w in (
        {"id": "full", "arrival": 0, "prompt_len": 16, "output_len": 1, "max_tokens": 1},
        {"id": "ok", "arrival": 0, "prompt_len": 4, "output_len": 2, "max_tokens": 2})))
    out = tmp_path / "t.jsonl"
    done = subprocess.run([sys.executable, "-m", "kvsched", "simulate", "--profile",
                           "sglang@0.5.23", "--max-model-len", "16", "--num-gpu-blocks", "16",
                           "--block-size", "1", "--max-num-batched-tokens", "16",
                           "--max-num-seqs", "4", "--workload", str(workload),
                           "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[0]["config"]["max_prompt_len"] == 9
    assert lines[1]["rejected"][0]["id"] == "full"
    checked = subprocess.run([sys.executable, "-m", "kvsched", "check", "--profile",
                              "sglang@0.5.23", str(out)], capture_output=True, text=True,
                             timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_front_end_that_takes_no_prompt_is_refused_in_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "kvsched", "simulate", "--profile",
                           "sglang@0.5.23", "--max-model-len", "6", "--num-gpu-blocks", "16",
                           "--block-size", "1", "--requests", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "takes no prompt" in done.stderr
