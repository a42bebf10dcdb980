"""Aborts on SGLang's step (kvsched.reference.sglang): a waiting request leaves the
queue and the chunked one is released at once (its last chunk not cached); a running one
is marked, runs one more forward and finishes at its sample, even through a retraction;
a simulation with aborts is MUST-clean, writes each abort as what happened, and its
profile replay agrees with it."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from conformance.sglang import case_named, stored
from kvsched.reference import SGLangScheduler, reference_scheduler
from kvsched.reference.sglang import max_req_len
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
def test_an_aborted_running_request_runs_one_more_forward_then_finishes(
        prefix_caching: bool) -> None:
    s = sglang(config(prefix_caching=prefix_caching))
    s.add_request(Request("r0", 10, 20))
    s.add_request(Request("r1", 6, 20))
    assert step(s) == [("r0", 10), ("r1", 6)]
    assert step(s) == [("r0", 1), ("r1", 1)]
    s.abort_request("r0")
    # Marked (SGLang's to_finish): still live, holding its pages, until its next sample.
    assert s.states()["r0"].status == Status.RUNNING and len(s.block_table("r0")) == 3
    d = s.schedule()
    assert d.scheduled == (("r0", 1), ("r1", 1))
    assert s.update(set()) == ("r0",)  # the abort's finish, at that forward's sample
    assert "r0" not in s.states() and s.block_table("r0") == ()
    # Its whole pages stay cached (evictable: still counted free), its last one freed.
    assert s.free_blocks() == 32 - len(s.block_table("r1"))
    assert s.tree.protected_size() == (4 if prefix_caching else 0)  # r1's first page
    s.abort_request("r0")  # no longer live: ignored
    assert step(s) == [("r1", 1)]  # the running batch goes on without it


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_an_aborted_chunked_request_ends_at_once_and_its_last_chunk_is_not_cached(
        prefix_caching: bool) -> None:
    s = sglang(config(prefix_caching=prefix_caching))
    s.add_request(Request("r0", 100, 4))
    assert step(s) == [("r0", 32)]
    assert step(s) == [("r0", 32)]
    s.abort_request("r0")
    assert "r0" not in s.states() and s.block_table("r0") == ()
    # SGLang releases it before caching its last chunk (process_pending_chunked_abort
    # runs before stash_chunked_request): only the first chunk stays cached.
    assert s.tree.evictable_size() == (32 if prefix_caching else 0)
    assert s.tree.protected_size() == 0 and s.free_blocks() == 32
    s.add_request(Request("r1", 8, 2))
    assert step(s) == [("r1", 8)]  # no chunk of r0 goes first
    assert s.tree.protected_size() == (8 if prefix_caching else 0)  # r1's two pages
    s.abort_request("gone")  # an id that is not live is ignored
    assert s.states()["r1"].status == Status.RUNNING


def test_an_abort_of_a_refused_arrival_leaves_it_rejected() -> None:
    c = config()  # max_prompt_len: min(128, 128) - 7
    s = sglang(c)
    s.add_request(Request("long", c.max_prompt_len + 1, 4))
    s.abort_request("long")  # SGLang's front end refused it: the abort finds nothing
    d = s.schedule()
    assert [r.id for r in d.rejected] == ["long"] and "max_prompt_len" in d.rejected[0].reason
    assert s.states() == {}


def retraction(c: Config, items: list[WorkItem]) -> tuple[int, str]:
    """The first step of a run of `items` that retracts, and its first victim."""
    for rec in run(sglang(c), validate(items)):
        if rec.preempted:
            return rec.step, rec.preempted[0].id
    raise AssertionError("the run retracts nothing")


def test_a_marked_request_retracted_before_its_forward_keeps_its_mark() -> None:
    """A running request marked by an abort and retracted in the same step's decode
    rejoins the queue marked (reset_for_retract leaves to_finish), recomputes when
    admitted again, and finishes at the sample that ends that prefill."""
    c = replace(config(block_size=1, prefix_caching=False), num_gpu_blocks=150,
                max_num_batched_tokens=64, max_prompt_len=121)
    # a steady stream: as the ratio decays admission overcommits, and a decode retracts
    items = [WorkItem(f"r{i}", i * 8, 20, 80, 80) for i in range(40)]
    at, victim = retraction(c, items)
    aborted = [replace(w, abort=at) if w.id == victim else w for w in items]
    records = list(run(sglang(c), validate(aborted)))
    assert check_steps(c, records, complete=True).violations == []
    assert all(not r.aborted for r in records)
    assert records[at].preempted[0].id == victim
    ends = [r.step for r in records if victim in r.finished]
    again = [r.step for r in records if r.step > at and victim in dict(r.scheduled)]
    assert ends and again and ends[0] == again[-1] > at  # its recompute, then done
    # it samples once a step it ran before the retraction; its recompute takes them all
    outputs = sum(1 for r in records[:at] if victim in dict(r.scheduled))
    assert sum(dict(records[s].scheduled)[victim] for s in again) == 20 + outputs


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
    # r3 waits, r1 is chunked, r6 waits (both pools are busy): ended at the abort; r0
    # and r5 run, and finish in their abort step's forward.
    assert {rid: r.step for r in records for rid in r.aborted} == {"r1": 1, "r3": 1,
                                                                   "r6": 6}
    finished = {rid: r.step for r in records for rid in r.finished}
    assert finished["r0"] == 3 and finished["r5"] == 20
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


def kept_steps(case: str) -> list[dict[str, Any]]:
    """The step lines of a kept SGLang trace (tests/data/sglang/)."""
    data = dict(stored())[case]
    return [json.loads(line) for line in data.splitlines()[1:] if b'"step"' in line]


@pytest.mark.parametrize("radix", ["", "-radix"])
def test_the_kept_abort_traces_show_each_kind_of_abort_as_sglang_did_it(radix: str) -> None:
    """What SGLang did, recorded live (conformance.sglang's abort cases): waiting and
    chunked requests end at the abort; running ones, also those marked while prefill
    steps run, run on and finish, SGLang's abort_finished naming them. The kept traces
    replay exactly under the profile (test_sglang_store); here, that they hold what
    their cases are about."""
    waiting = kept_steps(f"abort-waiting{radix}")
    assert sum(len(s.get("aborted", ())) for s in waiting) == 4
    chunked = kept_steps(f"abort-chunked{radix}")
    for s in chunked:
        for rid in s.get("aborted", ()):  # its chunk the step before was not its last
            before = dict(chunked[s["step"] - 1]["scheduled"])
            assert before[rid] > 0 and not any(rid in x.get("finished", ()) for x in chunked)
    assert sum(len(s.get("aborted", ())) for s in chunked) == 2
    for case in (f"abort-decoding{radix}", f"abort-prefill-steps{radix}"):
        lines = kept_steps(case)
        ended = [rid for s in lines for rid in s.get("abort_finished", ())]
        assert len(ended) >= 2 and not any(s.get("aborted") for s in lines[3:])
        for s in lines:
            for rid in s.get("abort_finished", ()):
                assert rid in s["finished"] and rid in dict(s["scheduled"])
    prefill = kept_steps(f"abort-prefill-steps{radix}")
    named = case_named(f"abort-prefill-steps{radix}")
    marked = {w.id: w.abort for w in named.workload(named.config)
              if w.id in ("r0", "r1") and w.abort is not None}
    for rid, at in marked.items():  # marked in a prefill step, finished at a later decode
        end = next(s for s in prefill if rid in s.get("abort_finished", ()))
        assert end["step"] > at and end["mode"] == "DECODE"
        assert prefill[at]["mode"] == "EXTEND" and rid not in dict(prefill[at]["scheduled"])


def test_the_kept_chunked_abort_caches_all_chunks_but_the_last() -> None:
    """r4 shares r0's first 250 tokens; r0 was aborted after three chunks of 64: SGLang
    cached the first two (each at the top of the next step) and not the third."""
    hits = {rid: len(ids) for s in kept_steps("abort-chunked-radix")
            for rid, ids in s.get("prefix_hits", {}).items()}
    assert hits["r4"] == 128


def test_the_kept_front_end_trace_rejects_at_and_past_sglangs_limit() -> None:
    case = case_named("front-end-limit")
    limit = case.config.max_prompt_len
    assert limit == max_req_len(case.config) - 6
    prompts = {w.id: w.prompt_len for w in case.workload(case.config)}
    lines = kept_steps("front-end-limit")
    rejected = {r["id"]: s["step"] for s in lines for r in s.get("rejected", ())}
    assert rejected == {"at": 1, "past": 2, "full": 3, "beyond": 3}
    assert prompts["at"] == limit + 1 and prompts["full"] == case.config.max_model_len
    assert any("edge" in s.get("finished", ()) for s in lines) and prompts["edge"] == limit
    assert not any(s.get("aborted") for s in lines)  # the abort found it refused


def test_the_kept_retracted_abort_finishes_after_its_recompute() -> None:
    """abort-retracted: r6, cancelled in the step a full cache retracts it, keeps its
    mark in the queue; SGLang admits it again long after, recomputes it, and its first
    sample finishes it (FINISH_ABORT), far short of its 80 outputs."""
    lines = kept_steps("abort-retracted")
    assert [p["id"] for p in lines[457]["preempted"]] == ["r6"]
    again = [s["step"] for s in lines if s["step"] > 457 and "r6" in dict(s["scheduled"])]
    end = next(s for s in lines if "r6" in s.get("abort_finished", ()))
    assert again and end["step"] == again[-1] and end["mode"] == "EXTEND"
    assert not any(s.get("aborted") for s in lines)


def test_the_kept_random_cases_with_aborts_end_requests_both_ways() -> None:
    names = [n for n in dict(stored()) if n.startswith("random-aborts-")]
    assert len(names) >= 20
    at_once = finishes = 0
    for name in names:
        for s in kept_steps(name):
            at_once += len(s.get("aborted", ()))
            finishes += len(s.get("abort_finished", ()))
    assert at_once > 0 and finishes > 0
