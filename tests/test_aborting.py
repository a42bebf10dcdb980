"""Aborts are a capability (kvsched.spec.interface.Aborting): the core Scheduler has no
abort_request; the simulation loop delivers a workload's aborts through
kvsched.spec.interface.abort, writes each as what the scheduler did with it, and every
tool refuses, in one line (exit 2 from the command line), a workload with aborts on a
scheduler without them (fuzz, which draws its own, draws none with aborts for one)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path

import pytest

from kvsched.loading import build
from kvsched.pytest_plugin import CheckedScheduler
from kvsched.reference import ReferenceScheduler, reference_scheduler
from kvsched.simulate import aborts_refusal, run
from kvsched.spec.interface import Aborting, NoAborts, Scheduler, abort
from kvsched.spec.model import Config, Decision, Request, RequestView
from kvsched.spec.profiles import get_profile
from kvsched.spec.replay import ProfileReplay
from kvsched.workload import WorkItem, validate

CONFIG = Config(block_size=4, num_gpu_blocks=32, max_num_batched_tokens=64, max_num_seqs=4,
                max_model_len=64)
SGLANG = get_profile("sglang@0.5.23")


class NoAbortScheduler:
    """vLLM v1's reference step behind the core interface only: no abort_request."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._inner = ReferenceScheduler(config)

    def add_request(self, request: Request) -> None:
        self._inner.add_request(request)

    def schedule(self) -> Decision:
        return self._inner.schedule()

    def update(self, stopped: Collection[str]) -> tuple[str, ...]:
        return self._inner.update(stopped)

    def free_blocks(self) -> int:
        return self._inner.free_blocks()

    def states(self) -> dict[str, RequestView]:
        return self._inner.states()

    def has_unfinished(self) -> bool:
        return self._inner.has_unfinished()


def make(config: Config) -> NoAbortScheduler:
    return NoAbortScheduler(config)


ABORTING = validate([WorkItem("r0", 0, 8, 4, 4), WorkItem("r1", 0, 8, 20, 20, abort=2)])
PLAIN = validate([WorkItem("r0", 0, 8, 4, 4), WorkItem("r1", 0, 8, 20, 20)])


def test_the_core_interface_has_no_abort_and_every_built_scheduler_models_it() -> None:
    s = NoAbortScheduler(CONFIG)
    assert isinstance(s, Scheduler) and not isinstance(s, Aborting)
    assert build(make, CONFIG, "m:make") is not None  # a factory's scheduler may lack it
    assert isinstance(ReferenceScheduler(CONFIG), Aborting)
    assert isinstance(reference_scheduler(SGLANG, SGLANG.configure(CONFIG)), Aborting)


def test_the_loop_refuses_a_workload_with_aborts_on_a_scheduler_without_them() -> None:
    assert len(list(run(NoAbortScheduler(CONFIG), PLAIN))) > 0
    with pytest.raises(NoAborts, match=r"request 'r1'.* has no abort_request"):
        list(run(NoAbortScheduler(CONFIG), ABORTING))
    assert aborts_refusal(NoAbortScheduler(CONFIG), PLAIN) is None
    why = aborts_refusal(NoAbortScheduler(CONFIG), ABORTING)
    assert why is not None and "\n" not in why and "'r1'" in why
    assert aborts_refusal(ReferenceScheduler(CONFIG), ABORTING) is None


def test_lmdeploys_step_models_no_aborts_and_the_loop_refuses_them_in_one_line() -> None:
    """LMDeploy's reference is not Aborting (its driver cannot drive LMDeploy's
    cancellation faithfully): the loop refuses a workload with aborts before the run, as
    on any scheduler without them, and runs one without."""
    lmdeploy = get_profile("lmdeploy@0.18.0")
    config = lmdeploy.configure(CONFIG)
    assert not isinstance(reference_scheduler(lmdeploy, config), Aborting)
    why = aborts_refusal(reference_scheduler(lmdeploy, config), ABORTING)
    assert why is not None and "\n" not in why and "'r1'" in why
    with pytest.raises(NoAborts, match=r"request 'r1'.* has no abort_request"):
        list(run(reference_scheduler(lmdeploy, config), ABORTING))
    assert len(list(run(reference_scheduler(lmdeploy, config), PLAIN))) > 0


def test_abort_says_whether_the_request_ended_at_once() -> None:
    v1 = ReferenceScheduler(CONFIG)
    v1.add_request(Request("r0", 8, 20))
    v1.schedule()
    v1.update(())
    assert abort(v1, "r0") is True  # vLLM ends a running request at once
    c = SGLANG.configure(CONFIG)
    s = reference_scheduler(SGLANG, c)
    s.add_request(Request("r0", 8, 20))
    s.schedule()
    s.update(())
    assert abort(s, "r0") is False  # SGLang lets it run to its next sample
    assert s.schedule().scheduled == (("r0", 1),) and s.update(()) == ("r0",)


def test_the_pytest_plugin_refuses_aborts_its_scheduler_cannot_take() -> None:
    with pytest.raises(NoAborts):
        CheckedScheduler(NoAbortScheduler(CONFIG)).run(ABORTING)
    assert CheckedScheduler(NoAbortScheduler(CONFIG)).run(PLAIN)


def test_a_replay_whose_trace_ends_a_request_the_profile_lets_run_diverges() -> None:
    c = SGLANG.configure(CONFIG)
    records = list(run(reference_scheduler(SGLANG, c), PLAIN))
    assert dict(records[2].scheduled).get("r1") == 1  # r1 is decoding at step 2
    replay = ProfileReplay(SGLANG.name, reference_scheduler(SGLANG, c))
    for rec in records[:2]:
        assert replay.step(rec) is None
    found = replay.step(replace(records[2], aborted=("r1",)))
    assert found is not None and "lets r1 run to its next sample" in found.message


def kvsched(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    here = Path(__file__).resolve().parent
    env = {"PYTHONPATH": str(here), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd, env=env)


def test_diff_refuses_a_workload_with_aborts_on_a_scheduler_without_them(
        tmp_path: Path) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"id": w.id, "arrival": w.arrival,
                                            "prompt_len": w.prompt_len,
                                            "output_len": w.output_len,
                                            "max_tokens": w.max_tokens,
                                            **({"abort": w.abort} if w.abort else {})})
                                + "\n" for w in ABORTING))
    done = kvsched("diff", "test_aborting:make", "vllm-v1", "--workload", str(workload),
                   cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "has no abort_request" in done.stderr


def test_fuzz_draws_no_aborts_for_a_scheduler_without_them(tmp_path: Path) -> None:
    """fuzz draws its own workloads: for a scheduler that models no aborts (as
    LMDeploy's step), none with aborts, so the campaign runs (a drawn abort would end
    it as bad input, exit 2)."""
    done = kvsched("fuzz", "test_aborting:make", "--examples", "50", "--seed", "1",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "50 examples" in done.stdout and "no failure" in done.stdout
