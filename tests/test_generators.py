"""Workload generators: determinism, documented distributions, arrivals, clipping, errors."""

from __future__ import annotations

import math
import statistics
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsched.generators import (
    ARRIVALS,
    BURST_FRACTION,
    CAPPED_FRACTION,
    DEFAULT_SYSTEM_PROMPTS,
    DEFAULT_TURNS,
    GENERATORS,
    KINDS,
    LENGTHS,
    LogNormal,
    generate,
    parse_lengths,
    parse_priorities,
)
from kvsched.workload import WorkItem, validate

BIG = 10**7  # a max_model_len that clips nothing: the raw distribution shows


def counts_per_step(items: list[WorkItem]) -> list[int]:
    per_step = Counter(w.arrival for w in items)
    return [per_step.get(s, 0) for s in range(items[-1].arrival + 1)]


def dispersion(counts: list[int]) -> float:
    """Variance over mean of arrivals per step: 1 for Poisson, more for bursts."""
    return statistics.pvariance(counts) / statistics.fmean(counts)


# -- determinism --------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("arrival", ARRIVALS)
def test_same_seed_same_workload(kind: str, arrival: str) -> None:
    a = generate(kind, 300, 7, arrival=arrival, priorities=(1, 1, 1))
    assert a == generate(kind, 300, 7, arrival=arrival, priorities=(1, 1, 1))
    assert a != generate(kind, 300, 8, arrival=arrival, priorities=(1, 1, 1))


def test_known_first_requests_pin_the_streams() -> None:
    # Same on every machine (string seeds, Mersenne Twister); a change to the seeding or
    # the order of draws changes these, so update them knowingly.
    got = [(w.arrival, w.prompt_len, w.output_len, w.max_tokens, w.priority)
           for w in generate("sharegpt", 4, 0, rate=1.0, priorities=(1, 1))]
    assert got == [(0, 35, 73, 101, 1), (0, 693, 74, 74, 0), (2, 488, 583, 583, 0),
                   (3, 74, 642, 642, 0)]


def test_lengths_do_not_depend_on_arrival_or_priorities() -> None:
    a = generate("sharegpt", 500, 3, arrival="poisson")
    b = generate("sharegpt", 500, 3, arrival="bursty", priorities=(1, 3))
    by_id = {w.id: w for w in b}
    # Ids follow arrival order, which both processes keep monotone.
    assert [(w.id, w.prompt_len, w.output_len, w.max_tokens) for w in a] == \
        [(w.id, by_id[w.id].prompt_len, by_id[w.id].output_len, by_id[w.id].max_tokens)
         for w in a]
    assert [w.arrival for w in a] != [by_id[w.id].arrival for w in a]


@pytest.mark.parametrize("arrival", ARRIVALS)
def test_ids_follow_arrival_order_and_output_is_valid(arrival: str) -> None:
    items = generate("alpaca", 1000, 1, arrival=arrival)
    assert [w.id for w in items] == [f"r{i}" for i in range(1000)]
    arrivals = [w.arrival for w in items]
    assert arrivals == sorted(arrivals)
    assert validate(items) == items


# -- length distributions ----------------------------------------------------------------

def test_lognormal_mean_formula() -> None:
    assert LogNormal(90, 1.34).mean == pytest.approx(90 * math.exp(1.34 ** 2 / 2))
    # The documented means.
    assert LENGTHS["sharegpt"].prompt.mean == pytest.approx(221, abs=1)
    assert LENGTHS["sharegpt"].output.mean == pytest.approx(198, abs=1)
    assert LENGTHS["alpaca"].prompt.mean == pytest.approx(19.31, rel=0.01)
    assert LENGTHS["alpaca"].output.mean == pytest.approx(58.45, rel=0.01)


@pytest.mark.parametrize("kind", ["sharegpt", "alpaca", "long-context"])
def test_sample_statistics_match_documented_parameters(kind: str) -> None:
    items = generate(kind, 20_000, 11, max_model_len=BIG)
    prompts = [w.prompt_len for w in items]
    outputs = [w.output_len for w in items]
    dist = LENGTHS[kind]
    # Means within 5%; the sharegpt prompt sigma 1.34 puts the standard error near 1.6%.
    assert statistics.fmean(prompts) == pytest.approx(dist.prompt.mean, rel=0.05)
    assert statistics.fmean(outputs) == pytest.approx(dist.output.mean, rel=0.05)
    assert statistics.median(prompts) == pytest.approx(dist.prompt.median, rel=0.05)
    assert statistics.median(outputs) == pytest.approx(dist.output.median, rel=0.05)
    # The log-lengths are normal with the documented sigma (rounding blurs short ones).
    logs = [math.log(p) for p in prompts]
    assert statistics.pstdev(logs) == pytest.approx(dist.prompt.sigma, rel=0.08)


def test_alpaca_is_shorter_than_sharegpt_and_long_context_is_long() -> None:
    share = generate("sharegpt", 5000, 2, max_model_len=BIG)
    alpaca = generate("alpaca", 5000, 2, max_model_len=BIG)
    long = generate("long-context", 5000, 2, max_model_len=BIG)

    def mean(items: list[WorkItem], f: str) -> float:
        return statistics.fmean(getattr(w, f) for w in items)

    assert mean(alpaca, "prompt_len") * 5 < mean(share, "prompt_len")
    assert mean(alpaca, "output_len") * 2 < mean(share, "output_len")
    assert statistics.median(w.prompt_len for w in long) > 1800
    assert sum(w.prompt_len >= 1000 for w in long) > 0.95 * len(long)
    assert mean(long, "output_len") < 100 < mean(long, "prompt_len") / 10


def test_uniform_covers_its_inclusive_ranges() -> None:
    items = generate("uniform", 5000, 4, prompt_range=(10, 20), output_range=(3, 5))
    assert {w.prompt_len for w in items} == set(range(10, 21))
    assert {w.output_len for w in items} == {3, 4, 5}
    assert statistics.fmean(w.prompt_len for w in items) == pytest.approx(15, abs=0.3)


# -- max_tokens and clipping -------------------------------------------------------------

def test_default_max_tokens_lets_a_quarter_stop_at_max_tokens() -> None:
    items = generate("sharegpt", 20_000, 5, max_model_len=BIG)
    capped = sum(w.output_len == w.max_tokens for w in items) / len(items)
    assert capped == pytest.approx(CAPPED_FRACTION, abs=0.02)
    assert all(w.output_len <= w.max_tokens <= 2 * w.output_len for w in items)


def test_fixed_max_tokens_cuts_long_outputs() -> None:
    items = generate("sharegpt", 2000, 5, max_tokens=64, max_model_len=BIG)
    assert {w.max_tokens for w in items} == {64}
    assert max(w.output_len for w in items) == 64
    assert any(w.output_len < 64 for w in items)


@given(kind=st.sampled_from(KINDS), seed=st.integers(0, 2**32),
       max_model_len=st.integers(2, 5000),
       max_tokens=st.none() | st.integers(1, 6000))
def test_every_request_fits_max_model_len(kind: str, seed: int, max_model_len: int,
                                          max_tokens: int | None) -> None:
    items = generate(kind, 50, seed, max_model_len=max_model_len, max_tokens=max_tokens)
    for w in items:
        assert 1 <= w.prompt_len <= max_model_len - 1
        assert 1 <= w.output_len <= w.max_tokens
        assert w.prompt_len + w.max_tokens <= max_model_len
        if max_tokens is not None:
            assert w.max_tokens == min(max_tokens, max_model_len - w.prompt_len)


def test_long_context_is_clipped_to_a_small_model_len() -> None:
    items = generate("long-context", 200, 1, max_model_len=1024)
    assert all(w.prompt_len == 1023 and w.max_tokens == 1 and w.output_len == 1
               for w in items if w.prompt_len >= 1023)
    assert sum(w.prompt_len == 1023 for w in items) > 150


# -- arrivals ----------------------------------------------------------------------------

def test_poisson_has_its_rate_and_unit_dispersion() -> None:
    items = generate("alpaca", 20_000, 9, arrival="poisson", rate=0.5)
    counts = counts_per_step(items)
    assert statistics.fmean(counts) == pytest.approx(0.5, rel=0.03)
    assert dispersion(counts) == pytest.approx(1.0, abs=0.1)
    high = generate("alpaca", 20_000, 9, arrival="poisson", rate=4.0)
    assert statistics.fmean(counts_per_step(high)) == pytest.approx(4.0, rel=0.03)


def test_bursty_keeps_the_mean_rate_with_far_more_variance() -> None:
    items = generate("alpaca", 20_000, 9, arrival="bursty", rate=0.5)
    counts = counts_per_step(items)
    assert statistics.fmean(counts) == pytest.approx(0.5, rel=0.15)
    assert dispersion(counts) > 3
    # Quiet gaps: most steps see no arrival, many more than Poisson's e^-0.5 = 61%.
    idle = sum(c == 0 for c in counts) / len(counts)
    assert idle > 1 - BURST_FRACTION - 0.05


def test_batch_arrives_at_once() -> None:
    assert {w.arrival for w in generate("uniform", 100, 0, arrival="batch")} == {0}


# -- priorities --------------------------------------------------------------------------

def test_priority_mix_follows_the_weights() -> None:
    items = generate("alpaca", 20_000, 2, priorities=(1, 2, 1))
    share = Counter(w.priority for w in items)
    assert set(share) == {0, 1, 2}
    for p, expected in ((0, 0.25), (1, 0.5), (2, 0.25)):
        assert share[p] / len(items) == pytest.approx(expected, abs=0.015)


def test_zero_weight_priorities_never_appear() -> None:
    assert {w.priority for w in generate("alpaca", 500, 2, priorities=(0, 1))} == {1}
    assert {w.priority for w in generate("alpaca", 500, 2)} == {0}


def test_parse_priorities() -> None:
    assert parse_priorities("3,1") == (3.0, 1.0)
    assert parse_priorities("0.5") == (0.5,)
    with pytest.raises(ValueError, match="comma-separated weights"):
        parse_priorities("3;1")


# -- bad parameters ----------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "message"), [
    ({"kind": "sharegtp"}, "unknown workload kind 'sharegtp'; kinds are sharegpt, alpaca, "
                           "long-context, uniform, shared-prompts, conversations"),
    ({"arrival": "uniform"}, "unknown arrival process 'uniform'; processes are poisson"),
    ({"n": 0}, "number of requests must be at least 1, got 0"),
    ({"seed": 1.5}, "seed must be an integer"),
    ({"rate": 0}, "rate must be a positive number"),
    ({"rate": math.nan}, "rate must be a positive number"),
    ({"rate": math.inf}, "rate must be a positive number"),
    ({"max_model_len": 1}, "max_model_len must be at least 2"),
    ({"max_tokens": 0}, "max_tokens must be at least 1, got 0"),
    ({"priorities": ()}, "priorities must list at least one weight"),
    ({"priorities": (1, -1)}, "priority weights must be finite numbers >= 0, got -1"),
    ({"priorities": (0, 0)}, "priority weights must not all be 0"),
    ({"priorities": (1, math.nan)}, "priority weights must be finite"),
    ({"kind": "uniform", "prompt_range": (5, 2)}, r"prompt_range must satisfy 1 <= low"),
    ({"kind": "uniform", "output_range": (0, 2)}, r"output_range must satisfy 1 <= low"),
    ({"kind": "uniform", "output_range": (1,)}, r"output_range must be a pair"),
    ({"kind": "uniform", "prompt_range": (1.5, 2)}, "prompt_range bounds must be integers"),
    ({"prompt_range": (1, 2)}, "apply only to kind 'uniform', not 'sharegpt'"),
    # shared prefixes and conversations
    ({"kind": "alpaca", "skew": 2.0}, "skew weighs the choice of a system prompt: it needs"),
    ({"kind": "alpaca", "think_steps": 5.0}, "think_steps is the pause between turns"),
    ({"kind": "shared-prompts", "skew": -1.0}, r"skew must be a finite number >= 0, got -1"),
    ({"kind": "shared-prompts", "skew": math.nan}, "skew must be a finite number"),
    ({"kind": "conversations", "turns": 0.5}, r"turns must be a mean number of turns >= 1"),
    ({"kind": "conversations", "think_steps": -2.0}, "think_steps must be a finite number"),
    ({"system_prompts": (0,)}, "system prompt lengths must be positive integers, got 0"),
    ({"system_prompts": (1.5,)}, "system prompt lengths must be positive integers"),
    ({"system_prompts": (4095,)},
     "a system prompt of 4095 tokens leaves no room in max_model_len 4096: at most 4094"),
])
def test_bad_parameters_are_one_line_errors(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"kind": "sharegpt", "n": 10, "seed": 0}
    args.update(kwargs)
    kind, n, seed = args.pop("kind"), args.pop("n"), args.pop("seed")
    with pytest.raises(ValueError, match=message) as info:
        generate(kind, n, seed, **args)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


# -- shared prefixes: system prompts and conversations ------------------------------------

def by_id(items: list[WorkItem]) -> dict[str, WorkItem]:
    return {w.id: w for w in items}


@pytest.mark.parametrize("kind", ["shared-prompts", "conversations"])
def test_shared_prefix_generators_are_deterministic(kind: str) -> None:
    a = generate(kind, 300, 7, priorities=(1, 1))
    assert a == generate(kind, 300, 7, priorities=(1, 1))
    assert a != generate(kind, 300, 8, priorities=(1, 1))
    assert validate(a) == a and len(a) == 300


def test_known_first_requests_pin_the_shared_prefix_streams() -> None:
    # Same on every machine; a change to the order of draws changes these knowingly.
    got = [(w.id, w.arrival, w.prompt_len, w.output_len, w.prefix)
           for w in generate("conversations", 5, 1, system_prompts=(64, 32))]
    assert got == [("c0-t0", 4, 147, 615, ("sys-0", 64)), ("c1-t0", 85, 85, 738, ("sys-0", 64)),
                   ("c2-t0", 141, 572, 174, ("sys-1", 32)),
                   ("c0-t1", 652, 1222, 187, ("c0-t0", 762)),
                   ("c0-t2", 1056, 1993, 159, ("c0-t1", 1409))]


def test_system_prompts_are_picked_by_their_zipf_weights() -> None:
    items = generate("shared-prompts", 20_000, 3)
    counts = Counter(w.prefix for w in items)
    # DEFAULT_SYSTEM_PROMPTS, skew 1: weights 1, 1/2, 1/3, 1/4 of 25/12.
    lengths = DEFAULT_SYSTEM_PROMPTS
    for i, length in enumerate(lengths):
        share = counts[(f"sys-{i}", length)] / len(items)
        assert share == pytest.approx(1 / (i + 1) / (25 / 12), abs=0.015)
    assert sum(counts.values()) == len(items)
    uniform = Counter(w.prefix for w in generate("shared-prompts", 20_000, 3, skew=0))
    assert all(n / 20_000 == pytest.approx(0.25, abs=0.015) for n in uniform.values())


def test_system_prompts_put_a_kind_s_prompt_after_them() -> None:
    plain = generate("alpaca", 500, 4, max_model_len=BIG)
    shared = generate("alpaca", 500, 4, max_model_len=BIG, system_prompts=(300, 40))
    assert [w.id for w in shared] == [w.id for w in plain]
    for p, s in zip(plain, shared, strict=True):
        assert s.prefix is not None and s.prefix[0] in ("sys-0", "sys-1")
        assert s.prompt_len == p.prompt_len + s.prefix[1]
        assert (s.arrival, s.output_len, s.max_tokens) == (p.arrival, p.output_len,
                                                           p.max_tokens)
        assert s.shared == (s.prefix,)


def test_a_system_prompt_is_clipped_around_but_never_into() -> None:
    items = generate("long-context", 300, 5, max_model_len=600, system_prompts=(598,))
    assert all(w.prompt_len == 599 and w.max_tokens == 1 for w in items)
    assert all(w.prefix == ("sys-0", 598) for w in items)


def test_each_turn_starts_with_the_whole_previous_turn() -> None:
    items = generate("conversations", 2000, 6, max_model_len=BIG, think_steps=10)
    ids = by_id(items)
    turns = [w for w in items if not w.id.endswith("-t0")]
    assert turns
    for w in turns:
        conversation, turn = w.id.rsplit("-t", 1)
        prev = ids[f"{conversation}-t{int(turn) - 1}"]
        whole = prev.prompt_len + prev.output_len
        assert w.prefix == (prev.id, whole) and w.prompt_len > whole
        assert w.shared == (*prev.shared, (prev.id, whole))
        # It comes once the previous turn could have ended, a token a step.
        assert w.arrival >= prev.arrival + prev.output_len
        assert w.priority == prev.priority
    firsts = [w for w in items if w.id.endswith("-t0")]
    assert all(w.prefix is None for w in firsts)
    # Geometric turns of mean 3; requests still arrive at the rate on average.
    assert len(items) / len(firsts) == pytest.approx(DEFAULT_TURNS, rel=0.1)
    starts = sorted(w.arrival for w in firsts)
    assert len(firsts) / starts[-1] == pytest.approx(0.05 / DEFAULT_TURNS, rel=0.1)


def test_think_time_has_its_mean() -> None:
    items = generate("conversations", 3000, 2, max_model_len=BIG, think_steps=40)
    ids = by_id(items)
    pauses = []
    for w in items:
        if w.prefix is not None:
            prev = ids[w.prefix[0]]
            pauses.append(w.arrival - prev.arrival - prev.output_len)
    # Floored exponential steps: mean 40 - 1/2 or so.
    assert statistics.fmean(pauses) == pytest.approx(39.5, rel=0.08)
    zero = generate("conversations", 300, 2, max_model_len=BIG, think_steps=0)
    assert all(w.arrival == by_id(zero)[w.prefix[0]].arrival
               + by_id(zero)[w.prefix[0]].output_len for w in zero if w.prefix is not None)


def test_a_conversation_ends_where_its_next_turn_would_not_fit() -> None:
    m = 700
    items = generate("conversations", 3000, 9, max_model_len=m, turns=6,
                     system_prompts=(128,))
    assert all(w.prompt_len + w.max_tokens <= m for w in items)
    assert all(w.prompt_len <= m - 1 for w in items)
    # Long conversations would run past 700 tokens: many end early, so fewer turns.
    firsts = sum(w.id.endswith("-t0") for w in items)
    assert len(items) / firsts < 3
    assert max(w.shared[-1][1] for w in items if w.prefix is not None) < m


@given(kind=st.sampled_from(GENERATORS), seed=st.integers(0, 2**16),
       max_model_len=st.integers(130, 3000), turns=st.sampled_from([None, 1, 2.5]))
def test_every_generator_fits_max_model_len(kind: str, seed: int, max_model_len: int,
                                            turns: float | None) -> None:
    items = generate(kind, 60, seed, max_model_len=max_model_len, turns=turns,
                     system_prompts=(100, 64))
    assert len(items) == 60 and validate(items) == items
    assert all(w.prompt_len + w.max_tokens <= max_model_len for w in items)
    assert all(1 <= w.output_len <= w.max_tokens for w in items)
    assert all(w.prefix is None or w.prefix[1] < w.prompt_len for w in items)


def test_parse_lengths() -> None:
    assert parse_lengths("1024,256") == (1024, 256)
    with pytest.raises(ValueError, match="comma-separated token counts"):
        parse_lengths("1024;256")




def test_level_weight_priorities_reach_sglangs_priority_preemption() -> None:
    """Levels 0 and 20 are further apart than SGLang's threshold (10): at the seat limit a
    waiting priority-20 request preempts running priority-0 ones, which a mix of
    neighbouring levels never makes happen."""
    from kvsched.reference import reference_scheduler
    from kvsched.simulate import run
    from kvsched.spec.model import Config
    from kvsched.spec.profiles import get_profile

    mix = parse_priorities("0:0.8,20:0.2")
    assert mix == (0.8, *[0.0] * 19, 0.2)
    profile = get_profile("sglang@0.5.23")
    config = profile.configure(Config(max_num_seqs=4, policy="priority"),
                               frozenset({"max_num_seqs", "policy"}))
    items = {w.id: w for w in generate("sharegpt", 100, 0, priorities=mix)}
    assert {w.priority for w in items.values()} == {0, 20}

    def preempting_steps(workload: dict[str, WorkItem]) -> int:
        steps = 0
        for rec in run(reference_scheduler(profile, config), list(workload.values())):
            if rec.preempted:
                assert {workload[p.id].priority for p in rec.preempted} == {0}
                assert any(workload[rid].priority == 20 for rid, _ in rec.scheduled)
                steps += 1
        return steps

    assert preempting_steps(items) > 0
    near = {w.id: w for w in generate("sharegpt", 100, 0, priorities=(0.8, 0.2))}
    assert preempting_steps(near) == 0
    with pytest.raises(ValueError, match="LEVEL:WEIGHT"):
        parse_priorities("0:1,x:2")
    with pytest.raises(ValueError, match="each named once"):
        parse_priorities("3:1,3:2")
