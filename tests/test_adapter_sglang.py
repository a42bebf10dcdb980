"""The SGLang adapter: config mapping both ways, what it refuses, driver events to trace
v1 and the CLI's errors, all without SGLang; then, where SGLang's environment exists
(`make sglang-env` creates .venv-sglang; .ci/run builds it first), SGLang's real scheduler
through `kvsched record sglang`, recorded twice to the same bytes and exact under
sglang@0.5.23."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvsched.adapters.recording import AdapterError
from kvsched.adapters.sglang import (
    config_from_sglang,
    served_as_asked,
    sglang_settings,
    step_line,
    step_record,
)
from kvsched.reference.sglang import max_req_len
from kvsched.spec.model import Config
from kvsched.spec.profiles import get_profile
from kvsched.spec.trace import ENGINE_STEP_KEYS
from kvsched.workload import WorkItem, validate

ROOT = Path(__file__).resolve().parent.parent
CONFIG = get_profile("sglang@0.5.23").configure(
    Config(block_size=16, num_gpu_blocks=64, max_num_batched_tokens=128, max_num_seqs=8,
           max_model_len=1024, first_block_id=1, prefix_caching=False),
    frozenset({"prefix_caching"}))


def effective(config: Config) -> dict[str, Any]:
    """What the driver reads back from a scheduler SGLang built as asked."""
    s = sglang_settings(config)
    return {**s, "available_tokens": s["max_total_tokens"], "enable_overlap": False,
            "schedule_low_priority_values_first": False, "max_req_len": max_req_len(config),
            "priority_scheduling_preemption_threshold": 10, "init_new_token_ratio": 0.7,
            "min_new_token_ratio": 0.098, "new_token_ratio_decay": 0.001}


@pytest.mark.parametrize("changes", [
    {}, {"block_size": 1, "num_gpu_blocks": 1000}, {"chunked_prefill": False,
                                                    "max_num_batched_tokens": 2048},
    {"policy": "priority"}, {"prefix_caching": True}, {"step_mix": "mixed_chunk"}])
def test_settings_read_back_the_same_config(changes: dict[str, Any]) -> None:
    config = get_profile("sglang@0.5.23").configure(replace(CONFIG, **changes),
                                                    frozenset({"prefix_caching", *changes}))
    settings = sglang_settings(config)
    assert settings["max_total_tokens"] == config.num_gpu_blocks * config.block_size
    assert settings["chunked_prefill_size"] == (config.max_num_batched_tokens
                                                if config.chunked_prefill else -1)
    assert config_from_sglang(effective(config)) == config


@pytest.mark.parametrize(("changes", "words"), [
    ({"preemption": "swap", "num_cpu_blocks": 8}, "recompute"),
    ({"watermark_blocks": 2}, "watermark"),
    ({"long_prefill_token_threshold": 16}, "long-prefill"),
    ({"step_mix": "any"}, "prefill_or_decode"),
    ({"max_num_seqs": 200}, "token budget"),
])
def test_settings_refuse_what_sglang_cannot_do(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(AdapterError, match=words):
        sglang_settings(replace(CONFIG, **changes))


def test_a_request_sglang_would_clip_is_named_and_one_it_refuses_is_served_as_asked(
        ) -> None:
    longest = max_req_len(CONFIG)  # min(1023, 64 * 16 - 1)
    assert longest == 1023 and CONFIG.max_prompt_len == longest - 6
    assert served_as_asked(CONFIG, WorkItem("ok", 0, 100, 10, 500)) is None
    clipped = served_as_asked(CONFIG, WorkItem("big", 0, 100, 10, 1000))
    assert clipped is not None and "'big'" in clipped and "clips" in clipped
    edge = served_as_asked(CONFIG, WorkItem("edge", 0, longest - 6, 1, 5))
    assert edge is not None and "clips" in edge  # taken: its max_tokens is clipped
    # refused on arrival (the trace's rejection), whatever its max_tokens
    assert served_as_asked(CONFIG, WorkItem("long", 0, longest - 5, 1, 500)) is None
    assert served_as_asked(CONFIG, WorkItem("full", 0, 1024, 1, 1)) is None


def test_a_step_event_becomes_a_trace_step() -> None:
    config = replace(CONFIG, prefix_caching=True)
    items = {w.id: w for w in validate([WorkItem("a", 0, 40, 5, 5),
                                        WorkItem("b", 0, 50, 5, 5, prefix=("a", 32))])}
    event = {"step": 3, "arrivals": ["a", "b"], "refused": [], "aborted": [],
             "preempted": ["c"], "mode": "EXTEND",
             "scheduled": [["a", 40], ["b", 18]], "new_block_ids": {"a": [1, 2, 3], "b": []},
             "prefix_hits": {"b": [1, 2]}, "finished": [], "abort_finished": [],
             "free_pages": 50, "evictable_pages": 4, "dedup": {"d": [7]},
             "new_token_ratio": 0.7}
    rec = step_record(event, items, config)
    assert rec.free_blocks == 54  # free and evictable pages: what the step invariant frees
    assert [p.id for p in rec.preempted] == ["c"] and rec.preempted[0].mode == "recompute"
    assert rec.new_blocks == {"a": (1, 2, 3)} and rec.prefix_hits == {"b": (1, 2)}
    assert rec.block_keys == {"a": ("a/0", "a/1"), "b": ("a/0", "a/1", "b/2")}
    assert rec.dedup == {"d": (7,)}
    assert "abort_finished" not in step_line(rec, event)  # none: the key is left out


def test_refusals_and_aborts_become_the_steps_rejections_aborts_and_finishes() -> None:
    config = replace(CONFIG, prefix_caching=True)
    items = {w.id: w for w in validate([WorkItem("a", 0, 40, 5, 5),
                                        WorkItem("long", 0, 1020, 1, 1)])}
    event = {"step": 0, "arrivals": ["a", "long"],
             "refused": [{"id": "long", "reason": "Input length (1020 tokens) exceeds"}],
             "aborted": ["w"], "preempted": [], "mode": "DECODE", "scheduled": [["r", 1]],
             "new_block_ids": {}, "prefix_hits": {}, "finished": ["r"],
             "abort_finished": ["r"], "free_pages": 50, "evictable_pages": 0, "dedup": {},
             "new_token_ratio": 0.7}
    rec = step_record(event, items, config)
    assert [(r.id, r.reason) for r in rec.rejected] == [
        ("long", "Input length (1020 tokens) exceeds")]
    assert rec.aborted == ("w",) and rec.finished == ("r",)
    assert set(rec.block_keys) == {"a"}  # a refused prompt's content is never held
    line = step_line(rec, event)
    assert line["abort_finished"] == ["r"] and line["rejected"][0]["id"] == "long"
    assert "abort_finished" in ENGINE_STEP_KEYS["sglang"]


def kvsched(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def workload_file(tmp_path: Path, items: list[dict[str, Any]], name: str = "w") -> Path:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(w) + "\n" for w in items))
    return path


WORKLOAD = [{"id": "a", "arrival": 0, "prompt_len": 40, "output_len": 5, "max_tokens": 10},
            {"id": "b", "arrival": 1, "prompt_len": 300, "output_len": 20, "max_tokens": 20},
            {"id": "c", "arrival": 1, "prompt_len": 30, "output_len": 8, "max_tokens": 8,
             "prefix": {"id": "a", "len": 20}}]


def test_cli_record_sglang_errors_are_one_line_exit_2(tmp_path: Path) -> None:
    base = ["record", "sglang", "--workload", str(workload_file(tmp_path, WORKLOAD)),
            "--out", str(tmp_path / "t.jsonl"), "--num-gpu-blocks", "64", "--block-size", "16"]
    missing = kvsched(*base, "--sglang-python", str(tmp_path / "none" / "python"))
    mixing = kvsched(*base, "--step-mix", "any")
    clipped = kvsched(*base, "--max-model-len", "320")
    for result, words in ((missing, "make sglang-env"), (mixing, "prefill_or_decode"),
                          (clipped, "clips max_tokens 20 to 18")):
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("kvsched: error: ") and words in result.stderr
        assert result.stderr.count("\n") == 1
    assert not (tmp_path / "t.jsonl").exists()


def sglang_python() -> Path | None:
    """KVSCHED_SGLANG_PYTHON, or .venv-sglang once scripts/sglang_env.sh finished it."""
    given = os.environ.get("KVSCHED_SGLANG_PYTHON")
    if given:
        return Path(given)
    venv = ROOT / ".venv-sglang"
    return venv / "bin" / "python" if (venv / ".installed-sglang-0.5.23").exists() else None


@pytest.mark.skipif(sglang_python() is None, reason="SGLang's environment .venv-sglang is "
                    "absent (`make sglang-env` creates it); this test drives SGLang's "
                    "scheduler for real")
@pytest.mark.parametrize("options", [
    ("--block-size", "1", "--num-gpu-blocks", "400", "--max-num-batched-tokens", "64",
     "--no-prefix-caching"),
    ("--prefix-caching", "--block-size", "16", "--num-gpu-blocks", "40",
     "--max-num-batched-tokens", "64", "--step-mix", "mixed_chunk"),
])
def test_cli_record_sglang_drives_sglang_and_the_trace_is_exact(
        tmp_path: Path, options: tuple[str, ...]) -> None:
    python = sglang_python()
    assert python is not None
    work = workload_file(tmp_path, WORKLOAD)
    outs = [tmp_path / f"t{i}.jsonl" for i in range(2)]
    for out in outs:
        result = kvsched("record", "sglang", "--workload", str(work), "--out", str(out),
                         "--sglang-python", str(python), "--max-num-seqs", "8", *options)
        assert result.returncode == 0, result.stderr
        assert "SGLang 0.5.23" in result.stdout
    assert outs[0].read_bytes() == outs[1].read_bytes()  # the same decisions every run
    header = json.loads(outs[0].read_text().splitlines()[0])
    assert header["engine"] == {"name": "sglang", "version": "0.5.23"}
    checked = kvsched("check", "--profile", "sglang@0.5.23", str(outs[0]))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "0 errors" in checked.stdout


def test_vllms_adapters_refuse_sglangs_step_mix() -> None:
    from kvsched.adapters.vllm import vllm_settings
    from kvsched.adapters.vllm_v0 import v0_settings

    sglang_like = replace(Config(max_model_len=256, max_num_batched_tokens=256),
                          step_mix="prefill_or_decode")
    with pytest.raises(AdapterError, match="step_mix any"):
        vllm_settings(sglang_like)
    with pytest.raises(AdapterError, match="step_mix any"):
        v0_settings(replace(sglang_like, allocation="prompt", watermark_scope="always",
                            watermark_blocks=5))
