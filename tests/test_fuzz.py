"""kvsched fuzz: hypothesis-drawn workloads against a user's scheduler module find a
planted fault, shrink it to a minimal workload file (with its config beside it) that
reproduces the fault and that the reference passes; a correct scheduler passes; the
same seed finds the same case."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvsched.fuzz import CRASH, check_case, config_flags, fuzz
from kvsched.reference import reference_scheduler
from kvsched.reference.scheduler import ReferenceScheduler
from kvsched.simulate import run
from kvsched.spec import Decision, check_steps
from kvsched.spec.knobs import Knobs
from kvsched.spec.trace import parse_config
from kvsched.testing.seeded_bugs import SEEDED_BUGS
from kvsched.workload import read_workload

# A user's scheduler module, as they would write one: a factory taking the config.
USER_MODULE = '''
from kvsched.reference import reference_scheduler
from kvsched.testing.seeded_bugs import SEEDED_BUGS


def make(config):
    """My engine's scheduler: the reference with a token budget compared by <=."""
    return SEEDED_BUGS["token-budget-off-by-one"].factory(config)


def correct(config):
    return reference_scheduler("vllm-v1", config)
'''


def kvsched(*args: str, pythonpath: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, timeout=300, env=env, cwd=pythonpath)


@pytest.fixture
def user_module(tmp_path: Path) -> Path:
    (tmp_path / "my_engine.py").write_text(USER_MODULE)
    return tmp_path


def test_fuzz_finds_the_planted_fault_and_writes_a_minimal_workload(
        user_module: Path) -> None:
    out = user_module / "minimal.jsonl"
    result = kvsched("fuzz", "my_engine:make", "--examples", "100", "--out", str(out),
                     pythonpath=user_module)
    assert result.returncode == 1, result.stderr
    assert "FAIL my_engine:make" in result.stdout
    assert "MUST token-budget at step 0" in result.stdout
    assert "reproduce: kvsched diff vllm-v1 my_engine:make --workload" in result.stdout
    workload = read_workload(out)
    sidecar = json.loads(out.with_suffix(".config.json").read_text())
    config = parse_config(sidecar["config"], 1)
    assert sidecar["scheduler"] == "my_engine:make" and sidecar["invariant"] == "token-budget"
    # Minimal: one request whose prompt is one token longer than the budget.
    [item] = workload
    assert item.prompt_len == config.max_num_batched_tokens + 1
    # The files reproduce the fault, and the reference passes the same case.
    bug = SEEDED_BUGS["token-budget-off-by-one"]
    report = check_steps(config, run(bug.factory(config), workload), complete=True)
    assert report.counts["token-budget"] > 0
    clean = check_steps(config, run(reference_scheduler("vllm-v1", config), workload),
                        complete=True)
    assert sum(clean.counts.values()) == 0


def test_the_reproduce_command_shows_the_divergence(user_module: Path) -> None:
    out = user_module / "minimal.jsonl"
    found = kvsched("fuzz", "my_engine:make", "--examples", "100", "--out", str(out),
                    "--format", "json", pythonpath=user_module)
    assert found.returncode == 1
    reproduce = json.loads(found.stdout)["reproduce"].split()
    assert reproduce[:2] == ["kvsched", "diff"]
    result = kvsched(*reproduce[1:], pythonpath=user_module)
    assert result.returncode == 1
    assert "first divergence at step 0: decision" in result.stdout


def test_a_correct_scheduler_passes_and_nothing_is_written(user_module: Path) -> None:
    out = user_module / "minimal.jsonl"
    result = kvsched("fuzz", "my_engine:correct", "--examples", "60", "--profile", "vllm-v1",
                     "--strict", "--out", str(out), pythonpath=user_module)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("OK my_engine:correct: 60 examples (seed 0), no failure "
                                    "(MUST, profile vllm-v1, SHOULD checked)")
    assert not out.exists() and not out.with_suffix(".config.json").exists()


def test_pinned_config_fields_hold_in_every_case() -> None:
    bug = SEEDED_BUGS["seq-limit-ignored"]
    pinned = {"max_num_seqs": 2, "preemption": "recompute", "num_cpu_blocks": 0,
              "chunked_prefill": True}
    result = fuzz(bug.factory, examples=100, seed=3, pinned=pinned)
    assert result.finding is not None and result.finding.invariant == "seq-limit"
    found = result.finding.config
    assert (found.max_num_seqs, found.preemption, found.num_cpu_blocks,
            found.chunked_prefill) == (2, "recompute", 0, True)
    # Minimal: one request more than the limit, each as small as can be.
    assert len(result.finding.workload) == 3
    assert {w.prompt_len for w in result.finding.workload} == {1}


def test_the_same_seed_finds_the_same_case() -> None:
    make = SEEDED_BUGS["token-budget-off-by-one"].factory
    first = fuzz(make, examples=100, seed=7)
    again = fuzz(make, examples=100, seed=7)
    assert first.finding is not None and first.finding == again.finding
    assert first.runs == again.runs


def test_a_crash_and_a_profile_divergence_are_findings() -> None:
    bug = SEEDED_BUGS["admits-after-preempt"]

    class Crashes(ReferenceScheduler):
        def schedule(self) -> Decision:
            raise RuntimeError("no swap space\nmore")

    crash = check_case(lambda config: Crashes(config, Knobs()), bug.config, bug.workload)
    assert crash is not None and crash.invariant == CRASH
    assert crash.message == "the scheduler raised RuntimeError at step 0: no swap space"
    assert check_case(bug.factory, bug.config, bug.workload) is None  # legal under MUST
    divergence = check_case(bug.factory, bug.config, bug.workload, profile="vllm-v1")
    assert divergence is not None and divergence.invariant == "profile"
    assert divergence.message.startswith("PROFILE profile at step 5: first divergence")


def test_config_flags_give_back_the_config() -> None:
    config = SEEDED_BUGS["swap-out-beyond-host"].config
    flags = config_flags(config)
    assert flags[:4] == ["--block-size", str(config.block_size), "--num-gpu-blocks",
                         str(config.num_gpu_blocks)]
    assert ("--chunked-prefill" if config.chunked_prefill else "--no-chunked-prefill") in flags
    assert flags[flags.index("--preemption") + 1] == config.preemption


@pytest.mark.parametrize(("args", "message"), [
    (["nosuch:make"], "nosuch:make: no module named 'nosuch'"),
    (["my_engine"], "'my_engine': expected module:factory"),
    (["my_engine:make", "--examples", "0"], "--examples must be at least 1, got 0"),
    (["my_engine:make", "--num-gpu-blocks", "-1"], "--num-gpu-blocks must not be negative"),
    (["my_engine:make", "--no-chunked-prefill", "--long-prefill-token-threshold", "4"],
     "the pinned config fields leave no well-formed config"),
])
def test_bad_input_is_one_line(user_module: Path, args: list[str], message: str) -> None:
    result = kvsched("fuzz", "--examples", "5", *args, pythonpath=user_module)
    assert result.returncode == 2, result.stdout
    assert result.stderr.startswith("kvsched: error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1


def test_fuzz_without_hypothesis_is_a_one_line_error(user_module: Path) -> None:
    (user_module / "hypothesis").mkdir()
    (user_module / "hypothesis" / "__init__.py").write_text("raise ImportError('absent')\n")
    result = kvsched("fuzz", "my_engine:make", pythonpath=user_module)
    assert result.returncode == 2
    assert result.stderr == ("kvsched: error: kvsched fuzz needs hypothesis: pip install "
                             "'kvsched[hypothesis]'\n")
