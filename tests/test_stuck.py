"""Exit codes that mean what they say for liveness and self-checks: a trace that ends
stuck (no end line, its last K steps move nothing while requests wait) fails plain
`kvsched check` with the waiting requests named (MUST ends-stuck), on both checkers;
`kvsched simulate --check` exits 1 when its own run breaks a MUST invariant."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_liveness import trace

from kvsched.cli import main
from kvsched.fuzz import config_flags
from kvsched.spec.violation import DEFAULT_STALL_STEPS
from kvsched.testing.seeded_bugs import SEEDED_BUGS
from kvsched.workload import item_dict

# r0 takes all 4 blocks and cannot grow; r1 waits for a block; nothing moves again.
STUCK: list[dict[str, Any]] = [{"arrivals": [{"id": "r0", "prompt_len": 16, "max_tokens": 8},
                       {"id": "r1", "prompt_len": 4, "max_tokens": 8}],
          "scheduled": [["r0", 16]], "free_blocks": 0},
         *[{"free_blocks": 0}] * DEFAULT_STALL_STEPS]


def check(path: Path, checker: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvsched", "check", "--checker", checker,
                           *args, str(path)], capture_output=True, text=True, timeout=120,
                          cwd=path.parent)


@pytest.mark.parametrize("checker", ["spec", "vectorized"])
def test_a_trace_that_ends_stuck_fails_plain_check_naming_who_waits(
        tmp_path: Path, checker: str) -> None:
    path = tmp_path / "stuck.jsonl"
    path.write_bytes(trace(STUCK))
    plain = check(path, checker)
    assert plain.returncode == 1, plain.stdout + plain.stderr
    assert "ends-stuck" in plain.stdout
    got = check(path, checker, "--format", "json")
    [verdict] = json.loads(got.stdout)
    [v] = [v for v in verdict["violations"] if v["invariant"] == "ends-stuck"]
    assert (v["level"], v["step"], v["request"]) == ("MUST", DEFAULT_STALL_STEPS, "r0")
    assert v["message"].startswith(f"the trace ends stuck: for {DEFAULT_STALL_STEPS} steps")
    assert "r0 is running with 4 GPU blocks" in v["message"]
    assert "r1 is waiting with 4 tokens: admitting it needs 1 free GPU block, 0 are free" \
        in v["message"]
    assert verdict["counts"] == {"progress": 1, "ends-stuck": 1}


@pytest.mark.parametrize("checker", ["spec", "vectorized"])
def test_a_stall_that_ends_or_a_short_quiet_tail_passes_plain_check(
        tmp_path: Path, checker: str) -> None:
    path = tmp_path / "t.jsonl"
    # One quiet step fewer than K at the end: no stall.
    path.write_bytes(trace(STUCK[:-1]))
    assert check(path, checker).returncode == 0
    # A stall in the middle that an abort ends: progress, a SHOULD only.
    path.write_bytes(trace([*STUCK, {"aborted": ["r0"], "scheduled": [["r1", 4]]}]))
    moved = check(path, checker, "--format", "json")
    assert moved.returncode == 0, moved.stdout
    assert json.loads(moved.stdout)[0]["counts"] == {"progress": 1}
    # With its end line the trace says it is whole: what it leaves live is completion's.
    path.write_bytes(trace(STUCK, end=True))
    ended = check(path, checker, "--format", "json")
    assert ended.returncode == 0, ended.stdout
    assert "ends-stuck" not in json.loads(ended.stdout)[0]["counts"]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_simulate_check_exits_1_when_its_own_run_breaks_a_must_invariant(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    import kvsched.commands.simulate as command

    bug = SEEDED_BUGS["over-admit-by-one-block"]
    monkeypatch.setattr(command, "new_scheduler",
                        lambda *args, **kwargs: bug.factory(bug.config))
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps(item_dict(w)) + "\n" for w in bug.workload))
    args = ["simulate", "--profile", bug.profile, *config_flags(bug.config),
            "--workload", str(workload), "--scheduler", "reference", "--check",
            "--format", fmt]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    if fmt == "json":
        assert json.loads(result.stdout)["violations"]["kv-budget"] >= 1
    else:
        assert "broke invariants on its own run: " in result.stdout
        assert "kv-budget x1" in result.stdout
    # The correct scheduler on the same run: exit 0.
    monkeypatch.undo()
    clean = CliRunner().invoke(main, args)
    assert clean.exit_code == 0, clean.output
