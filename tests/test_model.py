"""The spec's values on their own: a config's problems, a request's, a violation as
reported, the cost model of `auto` preemption, and the profiles' config defaults."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from kvsched.spec import Config, Decision, Preemption, Request, Violation, never_completes
from kvsched.spec.blocks import rejectable
from kvsched.spec.knobs import CostModel, Knobs
from kvsched.spec.profiles import ConfigDefaults, get_profile, pinned_profile


@pytest.mark.parametrize("change,problem", [
    ({"chunked_prefill": 1}, "config.chunked_prefill must be true or false, got 1"),
    ({"policy": "lifo"}, "config.policy must be one of fcfs, priority, got 'lifo'"),
    ({"preemption": "drop"}, "config.preemption must be one of recompute, swap, auto, lazy, got "
                             "'drop'"),
    ({"block_size": 2.0}, "config.block_size must be an integer, got 2.0"),
    ({"max_num_seqs": True}, "config.max_num_seqs must be an integer, got True"),
    ({"num_gpu_blocks": 0}, "config.num_gpu_blocks must be at least 1, got 0"),
    ({"max_model_len": 0}, "config.max_model_len must be at least 1, got 0"),
    ({"max_num_batched_tokens": 0}, "config.max_num_batched_tokens must be at least 1, got 0"),
    ({"max_num_seqs": 0}, "config.max_num_seqs must be at least 1, got 0"),
    ({"long_prefill_token_threshold": -1},
     "config.long_prefill_token_threshold must not be negative, got -1"),
    ({"num_cpu_blocks": -1}, "config.num_cpu_blocks must not be negative, got -1"),
    ({"watermark_blocks": -2}, "config.watermark_blocks must not be negative, got -2"),
    ({"first_block_id": -1}, "config.first_block_id must not be negative, got -1"),
    ({"num_cpu_blocks": 2**40 + 1}, "config.num_cpu_blocks is absurdly large "
                                    "(1099511627777 > 2**40)"),
    ({"chunked_prefill": False, "long_prefill_token_threshold": 8},
     "config.long_prefill_token_threshold chunks prefills, so it needs chunked_prefill: "
     "true"),
    ({"chunked_prefill": False, "long_prefill_token_threshold": 1},
     "config.long_prefill_token_threshold chunks prefills, so it needs chunked_prefill: "
     "true"),
])
def test_each_config_problem_names_its_field(change: dict[str, Any], problem: str) -> None:
    config = replace(Config(max_num_batched_tokens=4096), **change)
    assert config.problems() == [problem]


def test_a_valid_config_has_no_problem_and_boundaries_pass() -> None:
    assert Config().problems() == []
    assert Config(num_cpu_blocks=2**40, watermark_blocks=0, first_block_id=0,
                  block_size=1).problems() == []
    assert Config(chunked_prefill=False, max_num_batched_tokens=4096,
                  max_model_len=4096).problems() == []


def test_a_request_may_hold_counts_up_to_2_to_the_40() -> None:
    assert Request("a", 2**40, 2**40, 2**40).problems() == []
    assert Request("a", 4, 1, -(2**40)).problems() == []


@pytest.mark.parametrize("request_,problem", [
    (Request("", 4, 1), "request id must be a non-empty string"),
    (Request("a", 0, 1), "prompt_len of 'a' must be at least 1, got 0"),
    (Request("a", 4, 2**41), "max_tokens of 'a' is absurdly large (2199023255552)"),
    (Request("a", 4, 1.5), "max_tokens of 'a' must be an integer, got 1.5"),  # type: ignore[arg-type]
    (Request("a", 4, 1, True), "priority of 'a' must be an integer, got True"),
    (Request("a", 4, 1, -(2**41)), "priority of 'a' is absurdly large (-2199023255552)"),
])
def test_each_request_problem_names_its_field(request_: Request, problem: str) -> None:
    assert request_.problems() == [problem]


def test_a_violation_reports_its_level_numbers_and_fields() -> None:
    v = Violation("kv-budget", 3, "too many", "r1", 5, "<=", 4)
    assert v.level == "MUST" and v.numbers() == "5 <= 4"
    assert v.as_dict() == {"invariant": "kv-budget", "level": "MUST", "step": 3,
                           "request": "r1", "lhs": 5, "relation": "<=", "rhs": 4,
                           "message": "too many"}
    assert Violation("no-idle", 0, "idle").numbers() == ""
    assert Violation("kv-budget", 0, "one side", lhs=5).numbers() == ""
    assert Violation("kv-budget", 0, "one side", rhs=4).numbers() == ""
    assert Violation("no-idle", 0, "idle").level == "SHOULD"
    assert Violation("profile", 0, "differs").level == "PROFILE"


def test_the_cost_model_swaps_when_two_crossings_beat_recomputing() -> None:
    cost = CostModel(bytes_per_block=1_000, host_bandwidth=1e6, prefill_tokens_per_s=100.0)
    assert cost.swap_seconds(3) == pytest.approx(0.006)  # out and back: 2 x 3 x 1 kB / 1 MB/s
    assert cost.recompute_seconds(5) == pytest.approx(0.05)
    assert cost.prefers_swap(3, 5) and not cost.prefers_swap(30, 5)
    assert not cost.prefers_swap(25, 5)  # equal costs: recompute
    default = CostModel()
    assert default.bytes_per_block == 2 * 1024 * 1024 and default.host_bandwidth == 25e9
    assert default.prefill_tokens_per_s == 10_000.0


def test_knob_problems_name_the_bad_victim_rule() -> None:
    assert Knobs().problems() == []
    assert Knobs(victim="oldest").problems() == [  # type: ignore[arg-type]
        "victim must be one of policy, tail, lowest_priority, got 'oldest'"]


def test_profile_defaults_apply_to_fields_not_given() -> None:
    d = ConfigDefaults(preemption="swap", watermark_fraction=0.01, host_blocks_as_gpu=True)
    config = Config(num_gpu_blocks=250, watermark_blocks=0, num_cpu_blocks=0)
    assert d.apply(config) == replace(config, preemption="swap", watermark_blocks=2,
                                      num_cpu_blocks=250)
    given = frozenset({"preemption", "watermark_blocks", "num_cpu_blocks"})
    assert d.apply(config, given) == config
    assert d.describe() == ("preemption=swap, watermark_blocks=1% of num_gpu_blocks, "
                            "num_cpu_blocks=num_gpu_blocks")
    assert ConfigDefaults().describe() == "-" and ConfigDefaults().apply(config) == config
    # vLLM v1 caches prefixes by default; the user's choice wins, as for every field.
    assert get_profile("vllm-v1").configure(config) == replace(config, prefix_caching=True)
    assert get_profile("vllm-v1").configure(config, frozenset({"prefix_caching"})) == config
    off = get_profile("vllm-v1-no-prefix-caching")
    assert off.configure(replace(config, prefix_caching=True)) == config
    assert off.knobs == get_profile("vllm-v1").knobs
    assert off.defaults.describe() == "prefix_caching=off"
    # vLLM V0: its rules as config defaults, recompute (its default for one sequence);
    # the deprecated vllm-v0-swap is the same scheduler with swap.
    v0, swap = get_profile("vllm-v0"), get_profile("vllm-v0-swap")
    assert v0.configure(config) == replace(
        config, watermark_blocks=2, num_cpu_blocks=250, allocation="prompt",
        watermark_scope="always")
    assert v0.configure(config, frozenset({"allocation"})).allocation == "lazy"
    assert v0.defaults.describe() == (
        "watermark_blocks=1% of num_gpu_blocks, "
        "num_cpu_blocks=num_gpu_blocks, prefix_caching=off, allocation=prompt, "
        "watermark_scope=always")
    assert swap.knobs == v0.knobs and not v0.deprecated and "vllm-v0" in swap.deprecated
    assert swap.configure(config) == replace(v0.configure(config), preemption="swap")
    assert swap.configure(config, frozenset({"preemption"})).preemption == "recompute"
    with pytest.raises(ValueError) as e:
        get_profile("nope")
    assert str(e.value) == (
        "unknown profile 'nope'; known: vllm-v1, vllm-v1@0.11.1, vllm-v1@0.12, "
        "vllm-v1@0.19, vllm-v1@0.24, vllm-v1@0.31, vllm-v1@0.32, vllm-v1@0.33, "
        "vllm-v1@0.34, vllm-v1-no-prefix-caching, vllm-v0, vllm-v0-swap, sglang@0.5.23, "
        "lmdeploy@0.18.0, sarathi")
    # Releases: 0.32 and 0.33 differ in one knob, and vllm-v1 names the newest.
    old, new = get_profile("vllm-v1@0.32"), get_profile("vllm-v1@0.33")
    assert replace(old.knobs, continue_after_self_preemption=True) == new.knobs
    assert not old.knobs.continue_after_self_preemption
    assert get_profile("vllm-v1").knobs == new.knobs and old.defaults == new.defaults
    assert get_profile("vllm-v1@0.34").knobs == new.knobs
    assert get_profile("vllm-v1@0.31").knobs == old.knobs
    # Each epoch changes the knobs of the one before it (and only its own).
    chain = ["vllm-v1@0.11.1", "vllm-v1@0.12", "vllm-v1@0.19", "vllm-v1@0.24",
             "vllm-v1@0.31", "vllm-v1@0.33"]
    for before, after in itertools.pairwise(chain):
        assert get_profile(before).knobs != get_profile(after).knobs, (before, after)
    assert pinned_profile("vllm-v1", "vllm", "0.32.4") == "vllm-v1@0.32"
    assert pinned_profile("vllm-v1", "vllm", "0.34.0") == "vllm-v1@0.34"
    assert pinned_profile("vllm-v1", "vllm", "0.20.2") == "vllm-v1@0.19"
    assert pinned_profile("vllm-v1", "vllm", "0.11.0") is None  # in no epoch
    assert pinned_profile("vllm-v1", "vllm", "0.40.0") is None
    assert pinned_profile("vllm-v1@0.32", "vllm", "0.33.0") is None  # pinned already
    assert pinned_profile("vllm-v1", "sglang", "0.32.0") is None
    assert pinned_profile("sarathi", "vllm", "0.32.0") is None


def test_a_prompt_of_max_model_len_may_be_rejected_and_a_longer_one_must() -> None:
    config = Config(block_size=4, num_gpu_blocks=8, max_model_len=32)
    assert never_completes(config, 33, 1) == "prompt of 33 tokens is longer than " \
                                             "max_model_len 32"
    assert never_completes(config, 32, 1) is None  # served, it samples one token
    assert rejectable(config, 32, 1) == ("prompt of 32 tokens leaves no room for an "
                                         "output token (max_model_len 32)")
    assert rejectable(config, 33, 1) == never_completes(config, 33, 1)
    assert never_completes(config, 31, 1) is None and rejectable(config, 31, 1) is None


def test_decisions_compare_their_victims_in_order_by_default() -> None:
    ab = (Preemption("a", "recompute"), Preemption("b", "swap"))
    forward, backward = Decision(preempted=ab), Decision(preempted=ab[::-1])
    assert forward.comparable() != backward.comparable()
    assert forward.comparable(False) == backward.comparable(False)
