"""`kvsched fuzz` on SGLang's step: it draws only configs the step kind honours, grown
to ones SGLang starts with and serves (kvsched.strategies.servable), the SGLang
reference passes it, and a seeded SGLang bug is found.
"""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kvsched.fuzz import fuzz
from kvsched.reference import SGLangScheduler
from kvsched.simulate import run
from kvsched.spec import check_steps
from kvsched.spec.model import Config
from kvsched.spec.profiles import get_profile
from kvsched.spec.step_kinds import SCHEDULER_KINDS, SchedulerKind, refusal
from kvsched.strategies import configs, servable
from kvsched.testing.implementations import sglang_reference
from kvsched.testing.seeded_bugs import sglang_no_reserved_output
from kvsched.workload import WorkItem, validate

PROFILE = "sglang@0.5.23"


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(SCHEDULER_KINDS), data=st.data())
def test_configs_of_a_step_kind_are_ones_it_honours(kind: SchedulerKind,
                                                    data: st.DataObject) -> None:
    config = data.draw(configs(kind=kind))
    assert refusal(kind, config) is None and not config.problems()


def test_the_sglang_reference_factory_builds_sglangs_step() -> None:
    config = get_profile(PROFILE).configure(Config(), frozenset())
    assert isinstance(sglang_reference(config), SGLangScheduler)


def test_fuzz_passes_the_sglang_reference() -> None:
    result = fuzz(sglang_reference, examples=200, seed=0, profile=PROFILE)
    assert result.finding is None, result.finding
    assert result.runs == 200


@settings(max_examples=60, deadline=None)
@given(config=configs(kind="sglang"))
def test_a_servable_config_admits_the_longest_request_sglang_takes(config: Config) -> None:
    """Below it SGLang's start-up refuses the config, or its front end the prompt, and
    the step, which models neither, would admit nothing: a pool of two pages beyond
    max_model_len, a chunk of a page or more, no more seats than the token budget."""
    grown = servable(config, "sglang")
    assert refusal("sglang", grown) is None and not grown.problems()
    assert grown.num_gpu_blocks * grown.block_size >= grown.max_model_len + 2 * grown.block_size
    assert grown.max_num_seqs <= grown.max_num_batched_tokens
    assert not grown.chunked_prefill or grown.max_num_batched_tokens >= grown.block_size
    assume(grown.max_model_len >= 2)  # a prompt of max_model_len is rejected
    items = validate([WorkItem("r0", 0, grown.max_model_len - 1, 1, 1)])
    records = list(run(sglang_reference(grown), items))
    assert [rid for r in records for rid in r.finished] == ["r0"]


def test_fuzz_finds_the_seeded_sglang_bug() -> None:
    """Admission that ignores the running requests' reserved future output admits what
    SGLang would not: legal under the spec, a divergence from the profile."""
    result = fuzz(sglang_no_reserved_output, examples=200, seed=0, profile=PROFILE)
    assert result.finding is not None
    assert result.finding.invariant == "profile", result.finding.message
    assert f"first divergence from {PROFILE}" in result.finding.message


def test_a_prompt_that_can_never_complete_is_rejected_in_its_arrival_step() -> None:
    """SGLang's front end refuses a prompt past its input limit (below max_model_len);
    the step rejects at least what the spec says must be (P > max_model_len, or a
    sequence larger than the pool) and a prompt of max_model_len (no room for an output
    token), which it may."""
    config = get_profile(PROFILE).configure(
        Config(block_size=1, num_gpu_blocks=100, max_num_batched_tokens=64,
               max_model_len=32), frozenset({"block_size", "num_gpu_blocks",
                                             "max_num_batched_tokens", "max_model_len"}))
    items = validate([WorkItem("long", 0, 40, 4, 4), WorkItem("full", 0, 32, 4, 4),
                      WorkItem("fits", 0, 20, 4, 4)])
    records = list(run(sglang_reference(config), items))
    assert [r.id for r in records[0].rejected] == ["long", "full"]
    assert records[0].scheduled == (("fits", 20),)
    assert check_steps(config, records, complete=True).violations == []
