"""Every implementation (the `scheduler_factory` fixture of conftest.py) is the
scheduler it claims to be, offers the scheduler interface and the block-table accessors,
and its accessors agree with the counts the interface reports."""

from __future__ import annotations

from kvsched.reference import ReferenceScheduler
from kvsched.spec.interface import InspectableScheduler, Scheduler
from kvsched.spec.model import Config, Request, Status
from kvsched.testing.implementations import SchedulerFactory


def test_the_factory_builds_its_own_implementation(scheduler_factory: SchedulerFactory) -> None:
    s = scheduler_factory(Config(block_size=4, num_gpu_blocks=8))
    if scheduler_factory.implementation == "reference":
        assert type(s) is ReferenceScheduler
    elif scheduler_factory.implementation == "compiled":
        from kvsched.optimized.compiled import CompiledScheduler

        assert type(s) is CompiledScheduler
    else:
        from kvsched.optimized import TorchScheduler

        assert isinstance(s, TorchScheduler)
        assert s.device.type == ("cuda" if scheduler_factory.implementation.endswith("cuda")
                                 else "cpu")
    assert scheduler_factory.built == 1


def test_every_implementation_offers_the_interface(scheduler_factory: SchedulerFactory
                                                   ) -> None:
    s = scheduler_factory.profile("vllm-v1", Config(block_size=4, num_gpu_blocks=8,
                                                    num_cpu_blocks=3))
    assert isinstance(s, Scheduler) and isinstance(s, InspectableScheduler)
    assert s.free_blocks() == 8 and not s.has_unfinished()
    assert s.free_gpu_ids() == tuple(range(8)) and s.free_host_ids() == (0, 1, 2)
    assert s.block_table("nobody") == () and s.host_table("nobody") == ()


def test_block_tables_agree_with_the_counts(scheduler_factory: SchedulerFactory) -> None:
    """Two requests grow until the 8-block cache is full; the tail swaps out, then back
    in. After every step each live request's tables hold as many ids as its counts say,
    and the tables and the free lists split the pools between them."""
    config = Config(block_size=4, num_gpu_blocks=8, num_cpu_blocks=8,
                    max_num_batched_tokens=64, max_num_seqs=4, max_model_len=64,
                    preemption="swap")
    s = scheduler_factory(config)
    for rid in ("r0", "r1"):
        s.add_request(Request(rid, 12, 20))
    swapped = False
    for _ in range(60):
        if not s.has_unfinished():
            break
        s.schedule()
        s.update(())
        gpu, host = list(s.free_gpu_ids()), list(s.free_host_ids())
        for rid, view in s.states().items():
            assert len(s.block_table(rid)) == view.gpu_blocks
            assert len(s.host_table(rid)) == view.host_blocks
            swapped |= view.status == Status.SWAPPED and view.host_blocks > 0
            gpu += s.block_table(rid)
            host += s.host_table(rid)
        assert len(s.free_gpu_ids()) == s.free_blocks()
        assert sorted(gpu) == list(range(8)) and sorted(host) == list(range(8))
    assert swapped and not s.has_unfinished()
