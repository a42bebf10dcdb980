"""The `vllm-v1` profile on the scenarios of vLLM's own scheduler tests
(tests/v1/core/test_scheduler.py) that fit our model, with their numbers, on every
implementation (the `scheduler_factory` fixture of conftest.py).

vLLM counts a null block in num_blocks; our num_gpu_blocks is the usable count
(vLLM's num_blocks - 1).
"""

from __future__ import annotations

from collections.abc import Iterable

from kvsched.spec.interface import InspectableScheduler
from kvsched.spec.model import Config, Decision, Preemption, Request, Status
from kvsched.testing.implementations import SchedulerFactory


def scheduler(factory: SchedulerFactory, profile: str = "vllm-v1", **config: object
              ) -> InspectableScheduler:
    return factory.profile(profile, Config(**config))  # type: ignore[arg-type]


def step(s: InspectableScheduler, arrivals: Iterable[Request] = (),
         stopped: Iterable[str] = ()) -> tuple[Decision, tuple[str, ...]]:
    for r in arrivals:
        s.add_request(r)
    d = s.schedule()
    return d, s.update(set(stopped))


def test_long_prefill_threshold_chunks_400_400_224_then_decodes(
        scheduler_factory: SchedulerFactory) -> None:
    # vLLM test_schedule_concurrent_partial_requests-style: budget 1024, threshold 400,
    # three 800-token prompts.
    s = scheduler(scheduler_factory, block_size=16, num_gpu_blocks=10_000,
                  max_num_batched_tokens=1024, max_num_seqs=16, max_model_len=4096,
                  long_prefill_token_threshold=400)
    reqs = [Request(f"r{i}", 800, 100, arrival_step=0) for i in range(3)]
    d0, _ = step(s, reqs)
    assert d0.scheduled == (("r0", 400), ("r1", 400), ("r2", 224))
    d1, _ = step(s)
    assert d1.scheduled == (("r0", 400), ("r1", 400), ("r2", 224))
    assert d1.sampled == ("r0", "r1")
    d2, _ = step(s)
    assert d2.scheduled == (("r0", 1), ("r1", 1), ("r2", 352))
    assert d2.sampled == ("r0", "r1", "r2")


def test_threshold_is_lifted_for_a_lone_request(scheduler_factory: SchedulerFactory) -> None:
    s = scheduler(scheduler_factory, block_size=16, num_gpu_blocks=1000,
                  max_num_batched_tokens=1024, max_num_seqs=16, max_model_len=4096,
                  long_prefill_token_threshold=400)
    d, _ = step(s, [Request("solo", 800, 10)])
    assert d.scheduled == (("solo", 800),)


def two_requests_filling_the_cache(factory: SchedulerFactory, profile: str = "vllm-v1",
                                   policy: str = "fcfs") -> InspectableScheduler:
    """lo1 (priority 5, 32-token prompt) runs first; hi1 (priority 0, 32 tokens) joins
    one step later; block_size 16 and 5 usable blocks (vLLM: num_blocks=6). max_tokens
    40 keeps each request able to complete alone (72 tokens, 5 blocks)."""
    s = scheduler(factory, profile, block_size=16, num_gpu_blocks=5, max_num_batched_tokens=200,
                  max_num_seqs=3, max_model_len=1024, policy=policy)
    d, _ = step(s, [Request("lo1", 32, 40, priority=5, arrival_step=0)])
    assert d.scheduled == (("lo1", 32),) and s.free_blocks() == 3
    # lo1 now has 33 tokens and needs its 3rd block; hi1 is admitted with 2 blocks.
    d, _ = step(s, [Request("hi1", 32, 40, priority=0, arrival_step=1)])
    assert d.scheduled == (("lo1", 1), ("hi1", 32))
    assert s.free_blocks() == 0
    return s


def test_priority_victim_is_the_lowest_priority_running_request(
        scheduler_factory: SchedulerFactory) -> None:
    s = two_requests_filling_the_cache(scheduler_factory, policy="priority")
    # hi1 (C=32, N=33) needs a 3rd block, none is free: the victim is lo1, the largest
    # (priority, arrival), although it was scheduled earlier in this very step.
    d, _ = step(s)
    assert d.preempted == (Preemption("lo1", "recompute"),)
    assert d.scheduled == (("hi1", 1),)
    states = s.states()
    assert states["lo1"].status == Status.WAITING
    assert states["lo1"].num_computed == 0 and states["lo1"].gpu_blocks == 0
    assert states["lo1"].num_tokens == 34  # outputs are kept and replayed as prompt
    assert states["hi1"].status == Status.RUNNING and states["hi1"].gpu_blocks == 3


def test_fcfs_preempts_the_latest_admitted_request(scheduler_factory: SchedulerFactory) -> None:
    s = two_requests_filling_the_cache(scheduler_factory, policy="fcfs")
    # Same state under fcfs: the victim is running[-1], hi1 itself, which stops the pass.
    d, _ = step(s)
    assert d.preempted == (Preemption("hi1", "recompute"),)
    assert d.scheduled == (("lo1", 1),)
    assert s.states()["hi1"].status == Status.WAITING
    assert s.free_blocks() == 2


def test_no_admission_in_a_step_that_preempted(scheduler_factory: SchedulerFactory) -> None:
    s = two_requests_filling_the_cache(scheduler_factory, policy="fcfs")
    small = Request("small", 4, 4, arrival_step=2)
    d, _ = step(s, [small])
    # hi1 gave up its 2 blocks; "small" needs 1 and would fit, but vLLM admits nothing
    # in a step that preempted.
    assert d.preempted == (Preemption("hi1", "recompute"),)
    assert "small" not in dict(d.scheduled)
    # The next step: the preempted hi1 is at the head of waiting (it needs 3 blocks for
    # its 34 tokens with 2 free) and blocks the queue: head-of-line, as vLLM.
    d, _ = step(s)
    assert d.scheduled == (("lo1", 1),)


def test_admission_after_preemption_when_the_profile_allows_it(
        scheduler_factory: SchedulerFactory) -> None:
    s = two_requests_filling_the_cache(scheduler_factory, profile="sarathi", policy="fcfs")
    d, _ = step(s, [Request("small", 4, 4, arrival_step=2)])
    assert d.preempted == (Preemption("hi1", "recompute"),)
    # The victim is not taken back in its own step; the newcomer behind it is.
    assert d.scheduled == (("lo1", 1), ("small", 4))


def test_priority_waiting_order_is_priority_then_arrival(
        scheduler_factory: SchedulerFactory) -> None:
    # vLLM test_priority_scheduling_mixed_priority_and_arrival: priorities [2, 1, 1, 0]
    # arriving in the order 0, 2, 1, 3 are admitted 3, 2, 1, 0.
    s = scheduler(scheduler_factory, block_size=16, num_gpu_blocks=100,
                  max_num_batched_tokens=1000, max_num_seqs=8, max_model_len=1024,
                  policy="priority")
    for rid, prio, arrival in (("0", 2, 1), ("1", 1, 3), ("2", 1, 2), ("3", 0, 4)):
        s.add_request(Request(rid, 10, 5, priority=prio, arrival_step=arrival))
    d, _ = step(s)
    assert [rid for rid, _ in d.scheduled] == ["3", "2", "1", "0"]


def test_sequence_limit_stops_admission(scheduler_factory: SchedulerFactory) -> None:
    # vLLM test_priority_scheduling_with_limited_slots: max_num_seqs=2 admits priorities
    # 0 and 1 of [3, 1, 2, 0].
    s = scheduler(scheduler_factory, block_size=16, num_gpu_blocks=100,
                  max_num_batched_tokens=1000, max_num_seqs=2, max_model_len=1024,
                  policy="priority")
    d, _ = step(s, [Request(str(i), 10, 5, priority=p) for i, p in enumerate([3, 1, 2, 0])])
    assert [rid for rid, _ in d.scheduled] == ["3", "1"]


def test_full_sequence_must_fit_for_admission(scheduler_factory: SchedulerFactory) -> None:
    # scheduler_reserve_full_isl: a 60-token prompt with chunked prefill and a 16-token
    # budget is admitted only when all 4 of its blocks are free.
    s = scheduler(scheduler_factory, block_size=16, num_gpu_blocks=5, max_num_batched_tokens=16,
                  max_num_seqs=4, max_model_len=256)
    d, _ = step(s, [Request("a", 20, 10)])
    assert d.scheduled == (("a", 16),)
    d, _ = step(s, [Request("b", 60, 4)])
    # a takes its 2nd block; b would need 4 with only 3 left: not admitted, though its
    # first 12-token chunk (1 block) would fit.
    assert d.scheduled == (("a", 4),)
    assert s.states()["b"].status == Status.WAITING


def test_never_completing_request_is_rejected_not_queued_forever(
        scheduler_factory: SchedulerFactory) -> None:
    s = scheduler(scheduler_factory, block_size=16, num_gpu_blocks=4, max_num_batched_tokens=256,
                  max_num_seqs=4, max_model_len=1024)
    d, _ = step(s, [Request("huge", 100, 10), Request("ok", 10, 5)])
    assert [r.id for r in d.rejected] == ["huge"]
    assert "7 blocks, cache has 4" in d.rejected[0].reason
    assert d.scheduled == (("ok", 10),)


def test_running_chunks_end_at_max_model_len_minus_one(
        scheduler_factory: SchedulerFactory) -> None:
    # vLLM caps a running request's chunk at max_model_len - 1 - C, so that the token it
    # samples still has a position. Here N <= max_model_len - 1 while a request lives, so
    # the cap is tight exactly on a request's last chunk: a chunked prefill and a decode
    # that reach max_model_len (32) compute up to position 31 and finish there. A cap
    # one token tighter fails this; no cap at all cannot be seen (nothing it would cut).
    s = scheduler(scheduler_factory, block_size=4, num_gpu_blocks=16,
                  max_num_batched_tokens=16, max_num_seqs=4, max_model_len=32)
    d, _ = step(s, [Request("prefill", 31, 8)])
    assert d.scheduled == (("prefill", 16),)
    d, finished = step(s)
    assert d.scheduled == (("prefill", 15),) and finished == ("prefill",)

    s = scheduler(scheduler_factory, block_size=4, num_gpu_blocks=16,
                  max_num_batched_tokens=16, max_num_seqs=4, max_model_len=32)
    chunks = [step(s, [Request("decode", 20, 40)])[0].scheduled]
    for _ in range(20):
        if not s.has_unfinished():
            break
        chunks.append(step(s)[0].scheduled)
    assert chunks == [(("decode", 16),), (("decode", 4),)] + [(("decode", 1),)] * 11
