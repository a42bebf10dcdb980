"""The optimized scheduler's tensor simulation loop writes the trace that the generic
loop (kvsched.simulate.run) writes with the reference scheduler, byte for byte: same
steps, same decisions, same new block ids, same finishes; with prefix caching, the same
hits and content keys."""

from __future__ import annotations

import orjson
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvsched.optimized import TorchScheduler
from kvsched.optimized.simulation import Arrivals, run_fast, step_dict
from kvsched.reference import ReferenceScheduler
from kvsched.simulate import run
from kvsched.spec import Config
from kvsched.spec.knobs import Knobs
from kvsched.spec.profiles import get_profile
from kvsched.spec.trace import step_dict as reference_step_dict
from kvsched.strategies import configs, policies, resolve, workloads
from kvsched.workload import WorkItem, validate

torch.set_num_threads(1)  # small tensors: intra-op threads only add waiting

MAX_STEPS = 400
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="torch.cuda.is_available() is False: no CUDA GPU here"))]


def columns(items: list[WorkItem]) -> Arrivals:
    return Arrivals([w.id for w in items], [w.arrival for w in items],
                    [w.prompt_len for w in items], [w.output_len for w in items],
                    [w.max_tokens for w in items], [w.priority for w in items],
                    [w.abort for w in items], [w.shared for w in items])


def traces(config: Config, setup: Knobs, items: list[WorkItem], device: str,
           block_ids: bool) -> tuple[list[bytes], list[bytes]]:
    reference = [orjson.dumps(reference_step_dict(rec)) for rec in
                 run(ReferenceScheduler(config, setup), items, block_ids=block_ids,
                     max_steps=MAX_STEPS)]
    optimized = TorchScheduler(config, setup, device=device)
    fast = [orjson.dumps(step_dict(optimized, s, block_ids))
            for s in run_fast(optimized, columns(items), max_steps=MAX_STEPS)]
    return reference, fast


@pytest.mark.parametrize("device", DEVICES)
@given(config=configs(), setup=policies(torch=True), data=st.data(),
       block_ids=st.booleans())
def test_the_fast_loop_writes_the_reference_trace(device: str, config: Config,
                                                  setup: str | Knobs, data: st.DataObject,
                                                  block_ids: bool) -> None:
    config, knobs = resolve(config, setup)
    items = data.draw(workloads(config), label="workload")
    reference, fast = traces(config, knobs, items, device, block_ids)
    for step, (a, b) in enumerate(zip(reference, fast, strict=False)):
        assert a == b, f"step {step}:\n  reference {a.decode()}\n  optimized {b.decode()}"
    assert len(reference) == len(fast)


@pytest.mark.parametrize("device", DEVICES)
@given(config=configs(prefix_caching=True), setup=policies(torch=True),
       data=st.data(), block_ids=st.booleans())
def test_the_fast_loop_writes_the_reference_trace_with_prefix_caching(
        device: str, config: Config, setup: str | Knobs, data: st.DataObject,
        block_ids: bool) -> None:
    """Shared prefixes and conversation turns: same hits, new blocks and content keys."""
    config, knobs = resolve(config, setup)
    items = data.draw(workloads(config, shared=True), label="workload")
    reference, fast = traces(config, knobs, items, device, block_ids)
    for step, (a, b) in enumerate(zip(reference, fast, strict=False)):
        assert a == b, f"step {step}:\n  reference {a.decode()}\n  optimized {b.decode()}"
    assert len(reference) == len(fast)


def test_a_crowded_run_with_shared_prefixes_hits_and_matches() -> None:
    """Conversations over two system prompts in a cache that holds a few of them."""
    config = Config(block_size=4, num_gpu_blocks=24, max_num_batched_tokens=48,
                    max_num_seqs=6, max_model_len=96, prefix_caching=True)
    items = [WorkItem(f"r{i}", i // 4, 20 + (i * 7) % 30, 3 + (i * 5) % 9, 12, i % 3,
                      abort=i + 3 if i % 9 == 0 else None,
                      prefix=(f"r{i - 4}", 10) if i >= 8 and i % 2 else (f"s{i % 2}", 16))
             for i in range(40)]
    setup = get_profile("vllm-v1").knobs
    reference, fast = traces(config, setup, validate(items), "cpu", True)
    assert reference == fast
    assert any(b'"prefix_hits"' in line for line in fast)
    assert any(b'"block_keys"' in line for line in fast)
    assert any(b'"preempted"' in line for line in fast)


def test_a_crowded_run_with_preemptions_and_aborts_matches() -> None:
    """A cache that holds a few requests, many arrivals at once, some aborted."""
    config = Config(block_size=4, num_gpu_blocks=24, max_num_batched_tokens=48,
                    max_num_seqs=6, max_model_len=96)
    items = [WorkItem(f"r{i}", i // 5, 6 + (i * 7) % 30, 4 + (i * 5) % 25, 30, i % 3,
                      abort=i + 3 if i % 7 == 0 else None) for i in range(40)]
    setup = get_profile("vllm-v1").knobs
    reference, fast = traces(config, setup, items, "cpu", True)
    assert reference == fast
    assert any(b'"preempted"' in line for line in fast)
    assert any(b'"aborted"' in line for line in fast)


def test_both_vllm_releases_match_on_the_workload_that_tells_them_apart() -> None:
    """The workload vLLM 0.32 and 0.33 were recorded on (tests/data/vllm-releases):
    under each release's profile the fast loop writes the reference's trace, and the
    two releases' traces part (0.33 goes on with the running pass after a request
    preempts itself)."""
    from pathlib import Path

    from kvsched.workload import read_workload
    from tools.vllm_releases import CONFIG

    data = Path(__file__).resolve().parent / "data" / "vllm-releases" / "workload.jsonl"
    items = read_workload(data)
    out = {}
    for release in ("0.32", "0.33"):
        setup = get_profile(f"vllm-v1@{release}").knobs
        reference, fast = traces(CONFIG, setup, items, "cpu", True)
        assert reference == fast, release
        out[release] = reference
    assert out["0.32"] != out["0.33"]
