"""Property tests: every scheduler implementation (the `scheduler_factory` fixture of
conftest.py), simulated on drawn configs, knobs and workloads, obeys every MUST
invariant of the spec, and its complete runs the SHOULD ones it promises; and the block
arithmetic of spec/blocks.py is what it says.

Which SHOULD invariants hold on these small caches (searched with the deep profile
and hypothesis.target on preemption counts, up to 16 requests per run):
- completion, no-idle, needed-preemption: never broken, for any profile or knobs;
  asserted for all.
- no-thrash (a request preempted more than 8 times): never for vllm-v1 (at most 3);
  broken legitimately by sarathi (admission checks only the first chunk, so admitted
  prefills keep pushing each other out) and by knob mixes such as
  victim=lowest_priority under fcfs. Asserted for vllm-v1 only.

The profiles drawn are those of vLLM v1's step (Profile.scheduler "v1"): vllm-v0
(scheduler "v0") reproduces V0's own stalls, livelocks and needless preemptions, so
tests/test_vllm_v0_profile.py asserts only the MUST invariants of its runs.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import assume, example, given, target
from hypothesis import strategies as st

from kvsched.simulate import run
from kvsched.spec import Config, Report, Scheduler, StepRecord, check_steps
from kvsched.spec.blocks import (
    admission_watermark,
    blocks_for,
    blocks_needed,
    cdiv,
    never_completes,
    rejectable,
)
from kvsched.spec.profiles import get_profile
from kvsched.strategies import configs, honoured, knobs, profiles, servable, workloads
from kvsched.testing.implementations import SchedulerFactory
from kvsched.workload import WorkItem

MAX_STEPS = 2000  # far above any drawn workload's need; running out is a liveness failure
LIVENESS = ("completion", "no-idle", "needed-preemption")


def simulate(config: Config, scheduler: Scheduler,
             items: list[WorkItem]) -> tuple[list[StepRecord], Report]:
    records = list(run(scheduler, items, max_steps=MAX_STEPS))
    assert not scheduler.has_unfinished(), (
        f"liveness: {sorted(scheduler.states())} still live after {MAX_STEPS} steps")
    preemptions = Counter(p.id for r in records for p in r.preempted)
    # Steer the search towards the runs that preempt most: that is where bugs live.
    target(float(sum(preemptions.values())), label="preemptions")
    target(float(max(preemptions.values(), default=0)), label="preemptions of one request")
    return records, check_steps(config, records, complete=True)


def describe(report: Report) -> str:
    return "; ".join(f"{v.invariant} at step {v.step}: {v.message}"
                     for v in report.violations)


def assert_obeys(report: Report, should: tuple[str, ...]) -> None:
    assert report.errors() == 0, f"MUST violations: {describe(report)}"
    broken = sorted(set(should) & report.ids())
    assert not broken, f"SHOULD {broken} broken: {describe(report)}"


@st.composite
def profile_runs(draw: st.DrawFn, factory: SchedulerFactory
                 ) -> tuple[str, Config, list[WorkItem]]:
    """A profile (one `factory`'s scheduler runs: the reference's of vLLM v1's and
    SGLang's steps), a config it configured and its engine serves, and a workload for
    that config. vLLM V0's profile, which reproduces V0's stalls, keeps out."""
    reference = factory.implementation == "reference"
    name = draw(st.one_of(profiles(torch=factory.torch),
                          *([profiles("sglang")] if reference else [])))
    profile = get_profile(name)
    kind = profile.scheduler
    config = servable(honoured(profile.configure(draw(configs())), kind), kind)
    return name, config, draw(workloads(config))


@given(data=st.data())
def test_every_profile_obeys_the_spec(scheduler_factory: SchedulerFactory,
                                      data: st.DataObject) -> None:
    name, config, items = data.draw(profile_runs(scheduler_factory), label="setup")
    _, report = simulate(config, scheduler_factory.profile(name, config), items)
    promised = LIVENESS + (("no-thrash",) if name == "vllm-v1" else ())
    assert_obeys(report, promised)


@given(config=configs(), data=st.data())
def test_every_knob_combination_obeys_the_spec(scheduler_factory: SchedulerFactory,
                                               config: Config, data: st.DataObject) -> None:
    knob_set = data.draw(knobs(scheduler_factory.torch), label="knobs")
    items = data.draw(workloads(config), label="workload")
    _, report = simulate(config, scheduler_factory(config, knob_set), items)
    assert_obeys(report, LIVENESS)


@given(config=configs(chunked_prefill=True), data=st.data())
def test_a_burst_that_overflows_the_cache_preempts_and_still_completes(
        scheduler_factory: SchedulerFactory, config: Config, data: st.DataObject) -> None:
    """Several prompts that each fit alone but not together, all arriving at once:
    every profile finishes them all, with no MUST violation and no needless preemption."""
    name = data.draw(profiles(torch=scheduler_factory.torch), label="profile")
    profile = get_profile(name)
    config = profile.configure(config)
    # What a lone request may fill: the cache, less a watermark that applies always.
    capacity = config.block_size * (config.num_gpu_blocks - admission_watermark(config, 0))
    longest = min(config.max_model_len - 1, capacity) // 2
    assume(longest >= 1 and config.max_num_seqs >= 2)
    lengths = data.draw(st.lists(st.integers(max(1, longest // 2), longest),
                                 min_size=3, max_size=6), label="prompt lengths")
    # Outputs cross up to three blocks but keep each sequence within the cache.
    items = [WorkItem(f"r{i}", 0, p, out, out)
             for i, p in enumerate(lengths)
             for out in [max(1, min(3 * config.block_size, capacity - p))]]
    records, report = simulate(config, scheduler_factory.profile(profile, config), items)
    assert_obeys(report, LIVENESS + (("no-thrash",) if name == "vllm-v1" else ()))
    assert sorted(rid for r in records for rid in r.finished) == sorted(w.id for w in items)


# -- the block arithmetic of spec/blocks.py -----------------------------------------------

sizes = st.integers(0, 200)
block_sizes = st.integers(1, 17)


@given(tokens=sizes, block_size=block_sizes)
def test_blocks_for_is_the_fewest_blocks_that_hold_the_tokens(tokens: int,
                                                               block_size: int) -> None:
    fewest = next(k for k in range(tokens + 1) if k * block_size >= tokens)
    assert blocks_for(tokens, block_size) == fewest == cdiv(tokens, block_size)


@given(computed=sizes, new_tokens=sizes, held=st.integers(0, 30), block_size=block_sizes)
def test_blocks_needed_is_the_fewest_blocks_to_add(computed: int, new_tokens: int,
                                                  held: int, block_size: int) -> None:
    tokens = computed + new_tokens
    fewest = next(d for d in range(tokens + 1) if (held + d) * block_size >= tokens)
    assert blocks_needed(computed, new_tokens, held, block_size) == fewest


@given(computed=sizes, first=sizes, second=sizes, block_size=block_sizes)
def test_blocks_needed_in_two_chunks_equals_one_chunk(computed: int, first: int,
                                                      second: int, block_size: int) -> None:
    """Chunking a prefill does not change the blocks it takes in total."""
    held = blocks_for(computed, block_size)
    a = blocks_needed(computed, first, held, block_size)
    b = blocks_needed(computed + first, second, held + a, block_size)
    assert a + b == blocks_needed(computed, first + second, held, block_size)


def completes_alone(config: Config, prompt_len: int, max_tokens: int) -> bool:
    """Brute force: run one request that never hits EOS, token by token, in an empty
    cache. Computing a token needs a KV slot and a position below max_model_len - 1
    (room for the token it samples, as vLLM caps chunks); the token that ends the
    request is sampled, never computed."""
    known, computed, blocks, outputs = prompt_len, 0, 0, 0
    while True:
        while computed < known:
            if computed + 1 > config.max_model_len - 1:
                return False
            if computed == blocks * config.block_size:
                blocks += 1
                if blocks > config.num_gpu_blocks:
                    return False
            computed += 1
        known += 1
        outputs += 1
        if outputs >= max_tokens or known >= config.max_model_len:
            return True


small_configs = st.builds(Config, block_size=st.integers(1, 6),
                          num_gpu_blocks=st.integers(1, 8), max_model_len=st.integers(1, 40))


@given(config=small_configs, prompt_len=st.integers(1, 45), max_tokens=st.integers(1, 45))
@example(config=Config(block_size=4, num_gpu_blocks=1, max_model_len=64), prompt_len=4,
         max_tokens=1)
def test_rejectable_agrees_with_running_alone(config: Config, prompt_len: int,
                                             max_tokens: int) -> None:
    """rejectable (what the reference rejects) is the brute force under vLLM v1's
    position cap, except that it also counts the last sampled token's KV slot, which is
    never computed. Known gap, kept as the design states it (docs/spec.md section 2, rule
    2: ceil(min(P + O, max_model_len) / block_size)): a request whose final length L =
    min(P + O, max_model_len) is one token past a block boundary that fills the cache
    (blocks_for(L - 1) == num_gpu_blocks) is rejected although it could complete. It
    cannot arise under a config vLLM accepts (ceil(max_model_len / block_size) <=
    num_gpu_blocks), checked below. never_completes, what must be rejected, leaves out
    only the prompt of exactly max_model_len tokens that fits: an engine may serve it."""
    never = rejectable(config, prompt_len, max_tokens) is not None
    must = never_completes(config, prompt_len, max_tokens) is not None
    servable = (prompt_len == config.max_model_len
                and blocks_for(prompt_len, config.block_size) <= config.num_gpu_blocks)
    assert must == (never and not servable)
    alone = completes_alone(config, prompt_len, max_tokens)
    final = min(prompt_len + max_tokens, config.max_model_len)
    off_by_last_token = (prompt_len < config.max_model_len
                         and blocks_for(final - 1, config.block_size) <= config.num_gpu_blocks
                         < blocks_for(final, config.block_size))
    assert never == (not alone or off_by_last_token)
    if blocks_for(config.max_model_len, config.block_size) <= config.num_gpu_blocks:
        assert never == (not alone)
