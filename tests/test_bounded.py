"""Bounded by design: every size that drives memory (pool sizes, request counts, header
numbers, workload lines, prefix chains) is handled in memory proportional to what the
run uses, or refused in one line. Each hostile case runs in a subprocess under a 2 GiB
address-space limit."""

from __future__ import annotations

import json
import random
import resource
import subprocess
import sys
from collections import deque
from pathlib import Path

import pytest

from kvsched.generators import generate, lazily
from kvsched.implementations import vectorized_installed
from kvsched.reference.allocator import FreeList
from kvsched.spec.model import Config

LIMIT = 2 << 30  # bytes of address space a hostile case may take
LINE_REFUSED = "the line is longer than 64 MiB (the longest line a workload may have)"


def limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def bounded(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`kvsched ARGS` under the address-space limit."""
    return subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, timeout=120, preexec_fn=limit_memory, cwd=cwd)


def one_line_error(result: subprocess.CompletedProcess[str], expected: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("kvsched: error: ")
    assert expected in result.stderr


# -- pool sizes ---------------------------------------------------------------------------

@pytest.mark.parametrize("pools", [
    ["--num-gpu-blocks", "4294967296"],
    ["--num-gpu-blocks", str(2**40), "--num-cpu-blocks", str(2**40), "--preemption", "swap"],
    ["--profile", "sglang@0.5.23", "--num-gpu-blocks", "4294967296"],
])
def test_a_huge_pool_simulates_in_the_memory_of_the_blocks_it_hands_out(
        tmp_path: Path, pools: list[str]) -> None:
    result = bounded("simulate", *pools, "--requests", "5", "--check", "--out", "t.jsonl",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "no invariant broken" in result.stdout
    assert (tmp_path / "t.jsonl").read_bytes().endswith(b'{"end":true}\n')


def test_the_compiled_scheduler_refuses_a_pool_beyond_it_in_one_line(tmp_path: Path) -> None:
    result = bounded("simulate", "--num-gpu-blocks", "4294967296", "--requests", "5",
                     "--scheduler", "compiled", cwd=tmp_path)
    one_line_error(result, "the compiled scheduler makes a free-list entry per block at "
                           "start: num_gpu_blocks and num_cpu_blocks must be at most "
                           "4,194,304 (the reference scheduler takes more)")


def test_the_torch_scheduler_refuses_a_pool_beyond_it() -> None:
    pytest.importorskip("torch")
    from kvsched.optimized import TorchScheduler

    with pytest.raises(ValueError, match="the torch scheduler makes a free-list entry"):
        TorchScheduler(Config(num_gpu_blocks=2**22 + 1))


def one_step_trace(path: Path, blocks: int) -> None:
    config = {"block_size": 16, "num_gpu_blocks": blocks, "num_cpu_blocks": 0,
              "max_num_batched_tokens": 256, "max_num_seqs": 8, "max_model_len": 1024,
              "chunked_prefill": True, "long_prefill_token_threshold": 0, "policy": "fcfs",
              "preemption": "recompute", "watermark_blocks": 0}
    step = {"step": 0, "arrivals": [{"id": "r0", "prompt_len": 10, "max_tokens": 4}],
            "scheduled": [["r0", 10]]}
    path.write_text(json.dumps({"kvsched": "trace", "version": 1, "engine": {"name": "x"},
                                "config": config}) + "\n" + json.dumps(step) + "\n")


@pytest.mark.parametrize("blocks", [2**31 + 1, 2**32, 2**40])
def test_a_profile_replays_a_trace_of_a_huge_pool(tmp_path: Path, blocks: int) -> None:
    one_step_trace(tmp_path / "t.jsonl", blocks)
    result = bounded("check", "--profile", "vllm-v1", "t.jsonl", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("OK t.jsonl: 1 steps")


def test_the_vectorized_checker_replays_a_pool_beyond_the_compiled_scheduler(
        tmp_path: Path) -> None:
    """A pool the compiled scheduler does not take replays with the reference beside
    the vectorized checker, from a file and from standard input: the spec's report."""
    if vectorized_installed() is not None:
        pytest.skip("kvsched's compiled module is not built here")
    one_step_trace(tmp_path / "t.jsonl", 2**32)
    results = [bounded("check", "--profile", "vllm-v1", "--checker", choice, "t.jsonl",
                       cwd=tmp_path) for choice in ("spec", "vectorized")]
    piped = subprocess.run([sys.executable, "-m", "kvsched", "check", "--profile", "vllm-v1",
                            "-"], capture_output=True, text=True, timeout=120,
                           preexec_fn=limit_memory, cwd=tmp_path,
                           input=(tmp_path / "t.jsonl").read_text())
    for result in (*results, piped):
        assert result.returncode == 0, result.stderr[-2000:]
    assert results[0].stdout == results[1].stdout
    assert results[0].stdout.startswith("OK t.jsonl: 1 steps")
    assert piped.stdout.startswith("OK -: 1 steps")


def test_the_free_list_hands_out_ids_in_the_order_of_one_queue() -> None:
    # The range never handed out, the head and the tail read as one deque would.
    rng = random.Random(5)
    free, model = FreeList(3, 40), deque(range(3, 43))
    held: list[int] = []
    taken: set[int] = set()
    for _ in range(3000):
        op = rng.randrange(4)
        if op == 0:
            n = rng.randint(0, min(len(model), 5))
            got = free.take(n)
            assert got == [model.popleft() for _ in range(n)]
            held += got
            taken.update(got)
        elif op in (1, 2) and held:
            rng.shuffle(held)
            k = rng.randint(1, len(held))
            back, held = held[:k], held[k:]
            if op == 1:
                free.extend(back)
                model.extend(back)
            else:
                free.extendleft(back)
                model.extendleft(back)
        elif op == 3:
            returned = [b for b in model if b in taken]
            if returned:
                b = rng.choice(returned)
                free.remove(b)
                model.remove(b)
                held.append(b)
        assert len(free) == len(model) and list(free) == list(model)


# -- workload files ----------------------------------------------------------------------

@pytest.mark.parametrize("command", [
    ["simulate"],
    ["diff", "vllm-v1", "vllm-v1@0.32"],
    ["record", "sglang", "--out", "rec.jsonl"],
])
def test_an_endless_workload_line_is_refused_in_bounded_memory(tmp_path: Path,
                                                               command: list[str]) -> None:
    result = bounded(*command, "--workload", "/dev/zero", cwd=tmp_path)
    one_line_error(result, f"/dev/zero:1: {LINE_REFUSED}")
    assert not (tmp_path / "rec.jsonl").exists()


def test_a_workload_line_of_a_gigabyte_is_refused_after_64_mib(tmp_path: Path) -> None:
    with (tmp_path / "w.jsonl").open("wb") as f:
        f.write(b'{"id": "r0", "arrival": 0, "prompt_len": 4, "output_len": 2, '
                b'"max_tokens": 2}\n')
        f.truncate(1 << 30)  # a sparse second line of NUL bytes: nothing on disk
    result = bounded("simulate", "--workload", "w.jsonl", cwd=tmp_path)
    one_line_error(result, f"w.jsonl:2: {LINE_REFUSED}")


def test_a_long_conversation_takes_memory_linear_in_its_turns(tmp_path: Path) -> None:
    # Each turn's prompt is the whole previous turn and one token more: its chain of
    # shared contents names every earlier turn.
    with (tmp_path / "chat.jsonl").open("w") as f:
        whole = 0
        for turn in range(10_000):
            item = {"id": f"t{turn}", "arrival": turn, "prompt_len": whole + 1,
                    "output_len": 1, "max_tokens": 1}
            if turn:
                item["prefix"] = {"id": f"t{turn - 1}", "len": whole}
            f.write(json.dumps(item) + "\n")
            whole += 2
    result = bounded("simulate", "--workload", "chat.jsonl", "--max-model-len", "32768",
                     "--max-num-batched-tokens", "32768", "--num-gpu-blocks", "4096",
                     "--no-prefix-caching", "--max-steps", "30", "--check", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "30 steps (stopped at --max-steps 30)" in result.stdout


# -- request counts -----------------------------------------------------------------------

@pytest.mark.parametrize("command", [["simulate"], ["diff", "vllm-v1", "vllm-v1@0.32"]])
def test_a_billion_requests_cost_only_the_steps_run(tmp_path: Path,
                                                    command: list[str]) -> None:
    result = bounded(*command, "--requests", "1000000000", "--max-steps", "10",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize("kind", ["sharegpt", "conversations"])
def test_a_generated_workload_is_made_as_it_is_read(kind: str) -> None:
    whole = generate(kind, 200, 3, rate=0.5)
    endless = lazily(kind, 10**15, 3, rate=0.5)
    assert len(endless) == 10**15
    # The first requests in arrival order do not depend on how many follow (a
    # conversation's later turns may still be due when the 200th request is made).
    settled = [w for w in whole if w.arrival <= whole[100].arrival]
    read = iter(endless)
    got = [next(read) for _ in settled]
    assert got == settled
    assert [w.shared for w in got] == [w.shared for w in settled]
