"""The two rules of older vLLM v1 releases that are knobs of their own, on every
implementation (the `scheduler_factory` fixture): without chunked prefill a prompt above
the budget left is passed over (vLLM 0.11) or stops the waiting pass (0.12 on); freed
blocks join the free list as freed (up to 0.23) or uncached ones first (0.24 on). The
torch scheduler refuses both in one line."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvsched.spec.interface import InspectableScheduler
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Config, Request
from kvsched.spec.profiles import get_profile
from kvsched.testing.implementations import SchedulerFactory

WHOLE = Config(block_size=4, num_gpu_blocks=64, max_num_batched_tokens=8, max_num_seqs=8,
               max_model_len=8, chunked_prefill=False)


def built(factory: SchedulerFactory, config: Config, knobs: Knobs
          ) -> InspectableScheduler | None:
    """The factory's scheduler, or None where it is the torch one and `knobs` hold an
    older release's rule, which it must refuse in one line."""
    older = (knobs.free_order, knobs.over_budget_prompt) != ("uncached_first", "stop")
    if not (factory.torch and older):
        return factory(config, knobs)
    with pytest.raises(ValueError) as refused:
        factory(config, knobs)
    message = str(refused.value)
    assert "the torch scheduler does not implement knob" in message and "\n" not in message
    return None


def scheduled(s: InspectableScheduler) -> dict[str, int]:
    decision = s.schedule()
    s.update(())
    return dict(decision.scheduled)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("rule", ["stop", "skip"])
def test_a_prompt_above_the_budget_left_stops_the_pass_or_is_passed_over(
        scheduler_factory: SchedulerFactory, rule: str, policy: str) -> None:
    knobs = replace(Knobs(), over_budget_prompt=rule)  # type: ignore[arg-type]
    s = built(scheduler_factory, replace(WHOLE, policy=policy),  # type: ignore[arg-type]
              knobs)
    if s is None:
        return
    for rid, prompt in (("a", 6), ("b", 6), ("c", 6), ("d", 2)):
        s.add_request(Request(rid, prompt, 4))
    first, second = scheduled(s), scheduled(s)
    if rule == "stop":
        # b does not fit the 2 tokens a left: the pass stops at it, d waits behind it.
        assert first == {"a": 6}
        assert second == {"a": 1, "b": 6}
    else:
        # b and c are passed over and d fills the budget; back at the queue's head, under
        # fcfs the last passed over (c) comes first, under priority arrival order holds.
        assert first == {"a": 6, "d": 2}
        assert second == {"a": 1, "d": 1, ("c" if policy == "fcfs" else "b"): 6}


PREFIX = Config(block_size=2, num_gpu_blocks=7, max_num_batched_tokens=16, max_num_seqs=8,
                max_model_len=16, prefix_caching=True)


@pytest.mark.parametrize("order", ["uncached_first", "as_freed"])
def test_freed_blocks_join_the_free_list_by_the_release_rule(
        scheduler_factory: SchedulerFactory, order: str) -> None:
    """a (two cached blocks of "s") and b (a cached block, then a partly filled one)
    finish together, a first; c takes five blocks; d asks for "s"'s first block."""
    knobs = replace(get_profile("vllm-v1").knobs, free_order=order)  # type: ignore[arg-type]
    s = built(scheduler_factory, PREFIX, knobs)
    if s is None:
        return
    s.add_request(Request("a", 4, 1, prefix=(("s", 4),)))
    s.add_request(Request("b", 3, 1))
    scheduled(s)
    if order == "uncached_first":
        # b's partly filled block goes to the head, the cached ones to the tail.
        assert s.free_gpu_ids() == (3, 4, 5, 6, 1, 0, 2)
    else:
        assert s.free_gpu_ids() == (4, 5, 6, 1, 0, 3, 2)
    s.add_request(Request("c", 9, 4, arrival_step=1))
    scheduled(s)
    s.add_request(Request("d", 3, 2, arrival_step=2, prefix=(("s", 2),)))
    decision = s.schedule()
    if order == "uncached_first":
        # block 0 (s/0) was left cached: d hits it
        assert dict(decision.prefix_hits) == {"d": (0,)}
    else:
        # c took block 0 and evicted s/0: d starts from nothing
        assert dict(decision.prefix_hits) == {}
        assert decision.new_blocks is not None and decision.new_blocks["d"] == (3, 2)
    assert dict(decision.scheduled)["c"] == 1
