"""SGLang's step as the reference replays it (kvsched.reference.sglang, profile
sglang@0.5.23): each rule on a small hand-worked case, with the numbers of
docs/spec.md's section on SGLang's step."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvsched.reference import SGLangScheduler, reference_scheduler, scheduler_for
from kvsched.spec.knobs import Knobs, SGLangKnobs
from kvsched.spec.model import Config, Request
from kvsched.spec.profiles import get_profile

PROFILE = get_profile("sglang@0.5.23")
WHOLE = PROFILE.configure(Config(block_size=1, num_gpu_blocks=1000, chunked_prefill=False,
                                 max_num_batched_tokens=2048, max_num_seqs=8,
                                 max_model_len=2048, first_block_id=1),
                          frozenset({"prefix_caching"}))  # the radix cache off


def sglang(config: Config = WHOLE, **rules: object) -> SGLangScheduler:
    knobs = replace(Knobs(), sglang=replace(SGLangKnobs(), **rules))  # type: ignore[arg-type]
    s = scheduler_for(config, knobs, "sglang")
    assert isinstance(s, SGLangScheduler)
    return s


def step(s: SGLangScheduler, *stopped: str) -> list[tuple[str, int]]:
    d = s.schedule()
    s.update(set(stopped))
    return list(d.scheduled)


def test_the_profile_runs_sglangs_step_with_its_defaults() -> None:
    assert PROFILE.scheduler == "sglang"
    assert WHOLE.step_mix == "prefill_or_decode" and not WHOLE.prefix_caching
    assert isinstance(reference_scheduler(PROFILE, WHOLE), SGLangScheduler)
    with pytest.raises(ValueError, match="step_mix"):
        scheduler_for(replace(WHOLE, step_mix="any"), Knobs(), "sglang")
    with pytest.raises(ValueError, match="vLLM v1's step does not honour step_mix"):
        scheduler_for(WHOLE, Knobs(), "v1")


def test_admission_reserves_the_whole_output_and_stops_at_the_first_misfit() -> None:
    """r0 needs 100 + 200 + 1 < 1000 and reserves 100 + 1 + 200; r1 then needs
    100 + 600 + 1 = 701, not below 1000 - 301 = 699: the pass stops, and r2, which
    would fit, waits behind it."""
    s = sglang()
    for rid, p, o in (("r0", 100, 200), ("r1", 100, 600), ("r2", 10, 10)):
        s.add_request(Request(rid, p, o))
    assert step(s) == [("r0", 100)]
    skipping = sglang(misfit="skip")
    for rid, p, o in (("r0", 100, 200), ("r1", 100, 600), ("r2", 10, 10)):
        skipping.add_request(Request(rid, p, o))
    assert step(skipping) == [("r0", 100), ("r2", 10)]


def test_running_requests_reserve_ratio_times_what_they_have_left() -> None:
    """Next step r0 (1 output, 199 left) reserves 0.7 x 199 = 139.3: r1 needs 701 below
    900 - 139.3 = 760.7 and is admitted, in a step of prefill alone (r0 waits)."""
    s = sglang()
    for rid, p, o in (("r0", 100, 200), ("r1", 100, 600)):
        s.add_request(Request(rid, p, o))
    assert step(s) == [("r0", 100)]
    assert step(s) == [("r1", 100)]
    assert step(s) == [("r0", 1), ("r1", 1)]
    full = sglang(reserve_output=False)
    for rid, p, o in (("r0", 100, 200), ("r1", 100, 600)):
        full.add_request(Request(rid, p, o))
    assert step(full) == [("r0", 100), ("r1", 100)]


def test_the_ratio_decays_per_decode_step_and_resets_when_idle() -> None:
    s = sglang()
    s.add_request(Request("a", 10, 5))
    step(s)  # prefill: no decay
    assert s.ratio == pytest.approx(0.7)
    for _ in range(4):
        step(s)
    assert s.ratio == pytest.approx(0.7 - 4 * (0.7 - 0.7 * 0.14) / 600)
    assert not s.has_unfinished()
    step(s)  # the step after the last batch: not yet fully idle
    assert s.ratio < 0.7
    step(s)
    assert s.ratio == pytest.approx(0.7)


def test_retraction_takes_the_fewest_outputs_then_the_longest_prompt() -> None:
    """A pool of 40 tokens, three requests decoding: when the next decode does not fit,
    the one with the fewest outputs goes first (of equals, the longest prompt: here c,
    whose outputs equal the others'), back to the waiting queue's end; the survivors
    decode in the retraction order and the ratio becomes (outputs + 20 n) /
    (max_tokens + 1) over them."""
    config = replace(WHOLE, num_gpu_blocks=40, max_num_batched_tokens=64)
    s = sglang(config, reserve_output=False)  # admit greedily, so that decodes run short
    s.add_request(Request("a", 8, 30))
    s.add_request(Request("b", 6, 30))
    assert step(s) == [("a", 8), ("b", 6)]
    s.add_request(Request("c", 9, 30))
    assert step(s) == [("c", 9)]
    while True:
        d = s.schedule()
        s.update(set())
        if d.preempted:
            break
    victims = [p.id for p in d.preempted]
    assert victims[0] == "c"
    assert [r.id for r in s.waiting][-len(victims):] == victims
    left = [s.live[rid] for rid, _ in d.scheduled]
    assert s.ratio == pytest.approx(min(1.0, (sum(r.outputs - 1 for r in left)
                                              + 20 * len(left)) / (30 * len(left) + 1)))
    assert [rid for rid, _ in d.scheduled] == ["b", "a"]  # kept in order: shorter prompts first


def test_a_cut_chunk_ends_on_a_page_and_one_chunked_request_goes_on_first() -> None:
    config = replace(WHOLE, block_size=16, num_gpu_blocks=100, chunked_prefill=True,
                     max_num_batched_tokens=64)
    s = sglang(config)
    s.add_request(Request("a", 40, 10))
    s.add_request(Request("b", 100, 10))
    # a takes 48 tokens of budget (3 pages), b is cut to the 16 left
    assert step(s) == [("a", 40), ("b", 16)]
    assert s.chunked is not None and s.chunked.id == "b"
    assert step(s) == [("b", 64)]  # the chunked request first; a does not decode
    assert step(s) == [("b", 20)]
    assert step(s) == [("a", 1), ("b", 1)]


@pytest.mark.parametrize(("higher_first", "first"), [(True, "urgent"), (False, "calm")])
def test_priority_orders_the_waiting_queue_higher_first(higher_first: bool,
                                                        first: str) -> None:
    config = replace(WHOLE, policy="priority", max_num_seqs=1)
    s = sglang(config, higher_priority_first=higher_first)
    s.add_request(Request("calm", 10, 5, priority=0))
    s.add_request(Request("urgent", 10, 5, priority=40))
    assert step(s) == [(first, 10)]


def test_a_request_more_urgent_by_more_than_10_preempts_at_the_seat_limit() -> None:
    config = replace(WHOLE, policy="priority", max_num_seqs=1)
    s = sglang(config)
    s.add_request(Request("calm", 10, 50, priority=0))
    assert step(s) == [("calm", 10)]
    s.add_request(Request("close", 10, 5, priority=10))
    assert step(s) == [("calm", 1)]  # 10 is not more than 10
    s.add_request(Request("urgent", 10, 5, priority=11))
    d = s.schedule()
    assert [p.id for p in d.preempted] == ["calm"] and d.scheduled == (("urgent", 10),)
