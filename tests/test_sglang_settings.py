"""SGLang 0.5.23 as its users configure it, without SGLang: its start-up refusals in one
place (record and every command under the profile), the configs it runs that vLLM
refuses, its own options recorded as profile knobs a trace's header declares (and
replayed from a kept trace), its page of 1 token by default, no --first-block-id."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvsched.adapters.recording import AdapterError
from kvsched.adapters.sglang import sglang_settings
from kvsched.conformance import check_reader
from kvsched.spec.model import Config
from kvsched.spec.profiles import SettingsError, get_profile
from kvsched.spec.step_kinds import refusal
from kvsched.spec.trace import TraceError, TraceReader

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / "tests" / "data" / "sglang"
PROFILE = get_profile("sglang@0.5.23")
CONFIG = PROFILE.configure(Config(block_size=16, num_gpu_blocks=64, max_num_batched_tokens=128,
                                  max_num_seqs=8, max_model_len=1024, first_block_id=1))
WORKLOAD = [{"id": "a", "arrival": 0, "prompt_len": 40, "output_len": 5, "max_tokens": 10}]


def kvsched(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def record(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`kvsched record sglang` with no SGLang environment: what it refuses is refused
    before it looks for one."""
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps(w) + "\n" for w in WORKLOAD))
    return kvsched("record", "sglang", "--workload", str(workload), "--out",
                   str(tmp_path / "t.jsonl"), "--sglang-python",
                   str(tmp_path / "none" / "python"), *args)


def one_line(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr
    return p.stderr


def test_record_refuses_a_chunk_that_is_not_a_whole_number_of_pages(tmp_path: Path) -> None:
    err = one_line(record(tmp_path, "--block-size", "16", "--max-num-batched-tokens", "100"))
    assert "chunked_prefill_size must be divisible by page_size" in err
    assert "environment" not in err


def test_simulate_under_the_profile_refuses_it_as_sglang_does() -> None:
    err = one_line(kvsched("simulate", "--profile", "sglang@0.5.23", "--block-size", "16",
                           "--max-num-batched-tokens", "100", "--requests", "3"))
    assert "profile sglang@0.5.23" in err and "divisible by page_size" in err
    assert refusal("sglang", replace(CONFIG, max_num_batched_tokens=100)) is not None
    assert refusal("sglang", replace(CONFIG, max_num_batched_tokens=100,
                                     chunked_prefill=False)) is None  # no chunk to divide


def test_no_chunked_prefill_below_the_context_is_sglangs_and_refused_for_vllm() -> None:
    short = replace(CONFIG, chunked_prefill=False, max_num_batched_tokens=128)
    assert short.problems() == []
    assert refusal("sglang", short) is None
    why = refusal("v1", replace(short, step_mix="any"))
    assert why is not None and "max_model_len" in why
    assert sglang_settings(short)["max_prefill_tokens"] == 128


def test_simulate_refuses_that_config_for_vllm_only() -> None:
    v1 = one_line(kvsched("simulate", "--no-chunked-prefill", "--max-num-batched-tokens",
                          "256", "--max-model-len", "1024", "--requests", "3"))
    assert "without chunked prefill" in v1
    ok = kvsched("simulate", "--profile", "sglang@0.5.23", "--no-chunked-prefill",
                 "--max-num-batched-tokens", "256", "--max-model-len", "1024",
                 "--requests", "20", "--block-size", "1", "--num-gpu-blocks", "4000")
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize(("settings", "key", "value"), [
    ({"max_prefill_tokens": 100}, "max_prefill_tokens", 100),
    ({"priority_preemption_threshold": 3}, "priority_scheduling_preemption_threshold", 3),
    ({"higher_priority_first": False}, "schedule_low_priority_values_first", True),
    ({"retract_victim": "least_urgent"}, "retraction_policy", "priority"),
])
def test_each_option_is_recorded_as_sglang_takes_it(settings: dict[str, Any], key: str,
                                                    value: object) -> None:
    config = replace(CONFIG, policy="priority")
    assert sglang_settings(config, settings)[key] == value
    assert sglang_settings(config)[key] != value  # not SGLang's default


@pytest.mark.parametrize(("args", "words"), [
    (("--schedule-policy", "lpm"), "--schedule-policy lpm"),
    (("--retraction-policy", "priority"), "requires --enable-priority-scheduling"),
    (("--no-chunked-prefill", "--max-num-batched-tokens", "4096", "--max-prefill-tokens",
      "64"), "--max-prefill-tokens"),
    (("--max-prefill-tokens", "0"), "max_prefill_tokens must be at least 1"),
])
def test_options_sglang_or_the_profile_cannot_take_are_refused(tmp_path: Path,
                                                               args: tuple[str, ...],
                                                               words: str) -> None:
    assert words in one_line(record(tmp_path, *args))


def test_a_setting_that_is_not_one_is_refused() -> None:
    with pytest.raises(AdapterError, match="decay"):
        sglang_settings(CONFIG, {"decay": False})
    with pytest.raises(SettingsError, match="integer"):
        PROFILE.for_trace({"priority_preemption_threshold": "high"})
    with pytest.raises(SettingsError, match="not a setting"):
        get_profile("vllm-v1").for_trace({"max_prefill_tokens": 10})


def test_record_sglang_defaults_to_pages_of_one_token(tmp_path: Path) -> None:
    # 100 is a whole number of pages of 1 token, not of 16: only the environment is missing
    err = one_line(record(tmp_path, "--max-num-batched-tokens", "100"))
    assert "Python environment is missing" in err
    shown = " ".join(kvsched("record", "sglang", "--help").stdout.split())
    assert "pages of 1 token" in shown
    assert "[default: 1, the" in shown


def test_record_sglang_offers_no_first_block_id(tmp_path: Path) -> None:
    assert "--first-block-id" in one_line(record(tmp_path, "--first-block-id", "5"))


def test_record_sglang_offers_no_prompt_limit_of_its_own(tmp_path: Path) -> None:
    # SGLang's front end sets it from the context and the pool; simulate may set any
    assert "--max-prompt-len" in one_line(record(tmp_path, "--max-prompt-len", "100"))
    assert "--max-prompt-len" in kvsched("simulate", "--help").stdout


def kept(case: str) -> list[dict[str, Any]]:
    data = gzip.decompress((STORE / f"{case}.jsonl.gz").read_bytes()).decode()
    return [json.loads(line) for line in data.splitlines()]


def write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.mark.parametrize(("case", "knob"), [
    ("priority-threshold-3", "priority_preemption_threshold"),
    ("max-prefill-below-chunk", "max_prefill_tokens"),
    ("retraction-policy-priority", "retract_victim"),
])
def test_a_kept_trace_replays_exactly_with_the_settings_its_header_declares(
        tmp_path: Path, case: str, knob: str) -> None:
    lines = kept(case)
    assert knob in lines[0]["settings"]
    exact = kvsched("check", "--profile", "sglang@0.5.23", str(write(tmp_path / "a.jsonl",
                                                                      lines)))
    assert exact.returncode == 0, exact.stdout + exact.stderr
    header = {**lines[0], "settings": {k: v for k, v in lines[0]["settings"].items() if k != knob}}
    with (write(tmp_path / "b.jsonl", [header, *lines[1:]])).open("rb") as stream:
        report = check_reader(TraceReader(stream), profile="sglang@0.5.23")
    assert any(v.invariant == "profile" for v in report.violations)  # SGLang's default differs


def test_a_header_declaring_what_the_profile_cannot_take_is_bad_input(tmp_path: Path) -> None:
    lines = kept("priority-threshold-3")
    bad = write(tmp_path / "bad.jsonl", [{**lines[0], "settings": {"decay": False}}, *lines[1:]])
    err = one_line(kvsched("check", "--profile", "sglang@0.5.23", str(bad)))
    assert "decay" in err and "not a setting" in err
    with pytest.raises(TraceError, match="settings"):
        TraceReader(io.BytesIO(json.dumps({**lines[0], "settings": [1]}).encode() + b"\n"))
