"""SGLang's driver (src/kvsched/adapters/sglang_driver.py) on SGLang 0.5.23's real
scheduler, its events read as it writes them: aborts delivered through SGLang's own
abort_request, a too-long prompt refused with SGLang's own message, and a job SGLang
stalls in ending at once. Skipped only where .venv-sglang is absent."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from test_adapter_sglang import sglang_python

from kvsched.adapters.sglang import DRIVER, sglang_settings
from kvsched.spec.model import Config
from kvsched.spec.profiles import get_profile

PROFILE = get_profile("sglang@0.5.23")


def settings(**fields: Any) -> dict[str, Any]:
    return sglang_settings(PROFILE.configure(Config(**fields), frozenset(fields)))


def item(rid: str, prompt_len: int, output_len: int, abort: int | None = None
         ) -> dict[str, Any]:
    w: dict[str, Any] = {"id": rid, "arrival": 0, "prompt_len": prompt_len,
                         "output_len": output_len, "max_tokens": output_len, "priority": 0}
    if abort is not None:
        w["abort"] = abort
    return w


# A chunk of 16 tokens: at step 0 r1's first chunk takes it all, the others wait.
ABORTS = {"name": "aborts", "max_steps": 200, "config": settings(
    block_size=1, num_gpu_blocks=400, max_num_batched_tokens=16, max_num_seqs=4,
    max_model_len=128, prefix_caching=False), "requests": [
    item("r1", 40, 5, abort=1),    # being chunked at step 1
    item("w", 4, 5, abort=1),      # waiting at step 1
    item("r10", 4, 10),            # never aborted (r1's abort names no other rid)
    item("run", 4, 10, abort=4),   # running from step 1
    item("long", 200, 5)]}         # max_req_len 127: input at most 121
# A chunk of 8 tokens in pages of 16: SGLang admits nothing, ever. (SGLang's server
# refuses such a chunk at start-up, and so does the adapter: the driver is given it
# here to check its stall stop.)
STALL = {"name": "stall", "max_steps": 100000, "config": {**settings(
    block_size=16, num_gpu_blocks=25, max_num_batched_tokens=16, max_num_seqs=4,
    max_model_len=128, prefix_caching=True), "chunked_prefill_size": 8,
    "max_prefill_tokens": 8}, "requests": [item("a", 20, 3)]}


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    python = sglang_python()
    if python is None:
        pytest.skip("SGLang's environment .venv-sglang is absent (`make sglang-env` "
                    "creates it); this test drives SGLang's scheduler for real")
    jobs = tmp_path_factory.mktemp("sglang") / "jobs.jsonl"
    jobs.write_text("".join(json.dumps(j) + "\n" for j in (ABORTS, STALL)))
    run = subprocess.run([str(python), "-I", str(DRIVER), str(jobs)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    by_job: dict[str, list[dict[str, Any]]] = {}
    name = ""
    for line in run.stdout.splitlines():
        event = json.loads(line)
        name = event.get("job", name)
        by_job.setdefault(name, []).append(event)
    return by_job


def steps(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if "step" in e]


def scheduled(events: list[dict[str, Any]], rid: str) -> list[int]:
    return [e["step"] for e in steps(events) if any(r == rid for r, _ in e["scheduled"])]


def test_a_too_long_prompt_is_refused_with_sglangs_message(
        events: dict[str, list[dict[str, Any]]]) -> None:
    job = events["aborts"]
    longest = job[0]["config"]["max_req_len"] - 5
    first = steps(job)[0]
    assert "long" in first["arrivals"]
    assert first["refused"] == [{"id": "long", "reason": (
        f"Input length (200 tokens) exceeds the maximum allowed length ({longest} "
        "tokens). Use a shorter input or enable --allow-auto-truncate.")}]
    assert scheduled(job, "long") == [] and all("long" not in e["finished"] for e in job
                                                if "step" in e)


def test_a_waiting_and_a_chunked_abort_are_let_go_before_the_step(
        events: dict[str, list[dict[str, Any]]]) -> None:
    job = events["aborts"]
    assert scheduled(job, "r1") == [0] and scheduled(job, "w") == []
    assert [e["aborted"] for e in steps(job)[:3]] == [[], ["r1", "w"], []]
    assert all(not e["abort_finished"] or e["abort_finished"] == ["run"] for e in steps(job))
    # r1's pages are back at once: step 1 holds only what r10 and run computed.
    assert steps(job)[1]["free_pages"] == 400 - 4 - 4


def test_a_running_abort_finishes_after_one_more_token(
        events: dict[str, list[dict[str, Any]]]) -> None:
    job = events["aborts"]
    at = steps(job)[4]
    assert at["aborted"] == [] and ["run", 1] in at["scheduled"]
    assert at["finished"] == ["run"] and at["abort_finished"] == ["run"]
    assert scheduled(job, "run") == [1, 2, 3, 4]
    # r10, whose id starts with r1's, was not aborted: it ran to its own end.
    assert any("r10" in e["finished"] and e["abort_finished"] == [] for e in steps(job))
    assert len(scheduled(job, "r10")) == 10
    assert job[-1] == {"done": "aborts", "complete": True, "steps": len(steps(job))}
    assert steps(job)[-1]["free_pages"] == 400


def test_a_chunk_smaller_than_a_page_ends_stalled_at_once(
        events: dict[str, list[dict[str, Any]]]) -> None:
    job = events["stall"]
    assert all(e["scheduled"] == [] for e in steps(job))
    assert job[-1] == {"done": "stall", "complete": True, "steps": 3, "stalled": 1}
