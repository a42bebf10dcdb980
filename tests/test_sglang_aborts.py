"""Aborts on SGLang's step (kvsched.reference.sglang): a waiting request leaves the
queue, a running or chunked one ends and gives back its pages and its radix-cache lock;
a simulation with aborts is MUST-clean and its profile replay agrees with it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvsched.reference import SGLangScheduler, reference_scheduler
from kvsched.simulate import run
from kvsched.spec import check_steps
from kvsched.spec.model import Config, Request, Status
from kvsched.spec.profiles import get_profile
from kvsched.workload import WorkItem, item_dict, validate

PROFILE = get_profile("sglang@0.5.23")


def config(block_size: int = 4, prefix_caching: bool = True) -> Config:
    return PROFILE.configure(Config(block_size=block_size, num_gpu_blocks=128 // block_size,
                                    max_num_batched_tokens=32, max_num_seqs=4,
                                    max_model_len=128, prefix_caching=prefix_caching),
                             frozenset({"block_size", "num_gpu_blocks",
                                        "max_num_batched_tokens", "max_num_seqs",
                                        "max_model_len", "prefix_caching"}))


def sglang(c: Config) -> SGLangScheduler:
    s = reference_scheduler(PROFILE, c)
    assert isinstance(s, SGLangScheduler)
    return s


def step(s: SGLangScheduler) -> list[tuple[str, int]]:
    d = s.schedule()
    s.update(set())
    return list(d.scheduled)


def test_an_aborted_waiting_request_leaves_the_queue_holding_nothing() -> None:
    s = sglang(config())
    s.add_request(Request("r0", 8, 4))
    s.abort_request("r0")
    assert not s.has_unfinished() and s.states() == {}
    assert step(s) == []
    assert s.free_blocks() == 32


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_an_aborted_running_request_gives_back_its_pages_and_its_lock(
        prefix_caching: bool) -> None:
    s = sglang(config(prefix_caching=prefix_caching))
    s.add_request(Request("r0", 10, 20))
    s.add_request(Request("r1", 6, 20))
    assert step(s) == [("r0", 10), ("r1", 6)]
    assert step(s) == [("r0", 1), ("r1", 1)]
    held = len(s.block_table("r0"))
    s.abort_request("r0")
    assert "r0" not in s.states() and s.block_table("r0") == ()
    # Its whole pages stay cached (evictable: still counted free), its last one freed.
    assert s.free_blocks() == 32 - len(s.block_table("r1"))
    assert s.tree.protected_size() == (4 if prefix_caching else 0)  # r1's first page
    assert held == 3
    assert step(s) == [("r1", 1)]  # the running batch goes on without it
    s.abort_request("r1")
    assert s.tree.protected_size() == 0 and not s.has_unfinished()
    assert s.free_blocks() == 32


def test_an_aborted_chunked_request_ends_its_chunking() -> None:
    s = sglang(config())
    s.add_request(Request("r0", 100, 4))
    assert step(s) == [("r0", 32)]
    s.abort_request("r0")
    s.add_request(Request("r1", 8, 2))
    assert step(s) == [("r1", 8)]  # no chunk of r0 goes first
    assert s.tree.protected_size() == 8  # r1's two whole pages, nothing of r0
    s.abort_request("gone")  # an id that is not live is ignored
    assert s.states()["r1"].status == Status.RUNNING


WORKLOAD = validate([
    WorkItem("r0", 0, 40, 30, 40, abort=3),   # aborted while it decodes
    WorkItem("r1", 0, 90, 10, 20, abort=1),   # aborted while it is chunked
    WorkItem("r2", 0, 20, 8, 8),
    WorkItem("r3", 1, 20, 8, 8, abort=1),     # aborted in its arrival step
    WorkItem("r4", 2, 44, 12, 12, prefix=("r0", 40)),
    WorkItem("r5", 2, 16, 30, 30, abort=20),  # waiting, then running when aborted
    WorkItem("r6", 4, 60, 20, 20, abort=6),
    WorkItem("r7", 5, 12, 4, 4),
])


@pytest.mark.parametrize("block_size", [1, 4])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_a_simulation_with_aborts_is_must_clean_and_replays_exactly(
        block_size: int, prefix_caching: bool, tmp_path: Path) -> None:
    c = config(block_size, prefix_caching)
    records = list(run(sglang(c), WORKLOAD))
    assert sum(len(r.aborted) for r in records) == 5
    assert check_steps(c, records, complete=True).violations == []
    trace = tmp_path / "trace.jsonl"
    workload = tmp_path / "workload.jsonl"
    workload.write_text("".join(json.dumps(item_dict(w)) + "\n" for w in WORKLOAD))
    flags = ["--block-size", str(block_size), "--num-gpu-blocks", str(128 // block_size),
             "--max-num-batched-tokens", "32", "--max-num-seqs", "4", "--max-model-len",
             "128", "--prefix-caching" if prefix_caching else "--no-prefix-caching"]
    done = subprocess.run([sys.executable, "-m", "kvsched", "simulate", "--profile",
                           "sglang@0.5.23", "--workload", str(workload), *flags,
                           "--out", str(trace)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    checked = subprocess.run([sys.executable, "-m", "kvsched", "check", "--profile",
                              "sglang@0.5.23", str(trace)],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.startswith("OK ")
