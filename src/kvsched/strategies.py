"""Hypothesis strategies for kvsched's model: configs, knobs, profiles and workloads.

For property tests here and in other projects (an engine's adapter, a new policy):

    from hypothesis import given, strategies as st
    from kvsched.strategies import configs, workloads

    @given(st.data())
    def test_my_engine(data):
        config = data.draw(configs(allocation="lazy", watermark_scope="running"))
        items = data.draw(workloads(config))

(an engine that allocates and applies its watermark as vLLM v1 does pins both; left
out, they are drawn too).

Sizes are small on purpose: a cache of a few blocks, budgets of a few dozen tokens
and a handful of requests reach preemption, head-of-line blocking, rejection and
the max_model_len edge within a few steps, and shrink to readable examples.
Needs the "hypothesis" extra (pip install kvsched[hypothesis]).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

from kvsched.spec.knobs import FREE_ORDERS, OVER_BUDGET_PROMPTS, VICTIMS, Knobs
from kvsched.spec.model import (
    ALLOCATIONS,
    POLICIES,
    PREEMPTION_MODES,
    WATERMARK_SCOPES,
    Allocation,
    Config,
    WatermarkScope,
)
from kvsched.spec.profiles import PROFILES, SchedulerKind, get_profile
from kvsched.spec.step_kinds import SCHEDULER_KINDS, STEP_KINDS, ignored_fields
from kvsched.workload import WorkItem, validate

__all__ = ["configs", "honoured", "knobs", "output_lens", "policies", "profiles",
           "prompt_lens", "resolve", "servable", "step_kind", "workloads"]


@st.composite
def configs(draw: st.DrawFn, *, max_gpu_blocks: int = 16, max_model_len: int = 64,
            chunked_prefill: bool | None = None, prefix_caching: bool = False,
            allocation: Allocation | None = None,
            watermark_scope: WatermarkScope | None = None,
            kind: SchedulerKind | None = None) -> Config:
    """A well-formed Config (no `problems()`) with small, tight numbers; with `kind`, one
    that step kind honours: each field it does not read takes one of the values it does
    (kvsched.spec.step_kinds).

    Mostly a cache just big enough for one max_model_len sequence (vLLM refuses a
    smaller one), so that a few requests fill it; otherwise any size from 1 to
    `max_gpu_blocks` blocks, including caches smaller than one sequence, where the
    second rejection rule (a sequence larger than the whole cache) applies. The
    allocation and the watermark scope are drawn unless given (shrinking to vLLM v1's
    lazy and running).

    pre: max_gpu_blocks >= 1 and max_model_len >= 1
    """
    block_size = draw(st.integers(1, 16))
    model_len = draw(st.integers(1, max_model_len))
    one_sequence = -(-model_len // block_size)
    tight = st.integers(one_sequence, one_sequence + 2)
    num_gpu_blocks = draw(st.one_of(tight, tight, st.integers(1, max_gpu_blocks)))
    chunked = draw(st.booleans()) if chunked_prefill is None else chunked_prefill
    if chunked:
        batched = draw(st.integers(1, max(model_len + 8, 32)))
        threshold = draw(st.one_of(st.just(0), st.integers(1, batched)))
    else:
        # vLLM's rule (Config.problems): a whole prefill must fit one step's budget.
        batched = draw(st.integers(model_len, model_len + 16))
        threshold = 0
    config = Config(
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=draw(st.one_of(st.just(0), st.integers(1, 2 * num_gpu_blocks))),
        max_num_batched_tokens=batched,
        max_num_seqs=draw(st.one_of(st.integers(2, 6), st.integers(1, 6))),
        max_model_len=model_len,
        chunked_prefill=chunked,
        long_prefill_token_threshold=threshold,
        policy=draw(st.sampled_from(POLICIES)),
        # lazy: LMDeploy's preemption, which only its own step kind runs
        preemption=draw(st.sampled_from([m for m in PREEMPTION_MODES if m != "lazy"])),
        watermark_blocks=draw(st.integers(0, min(3, num_gpu_blocks - 1))),
        prefix_caching=prefix_caching,
        allocation=draw(st.sampled_from(ALLOCATIONS)) if allocation is None else allocation,
        watermark_scope=(draw(st.sampled_from(WATERMARK_SCOPES)) if watermark_scope is None
                         else watermark_scope),
    )
    if kind is not None:
        config = honoured(config, kind)
        for name, values in STEP_KINDS[kind].takes.items():
            # Of the values it honours, those well-formed with the rest as drawn.
            fine = [v for v in values if not _set(config, name, v).problems()]
            if len(fine) > 1:
                config = _set(config, name, draw(st.sampled_from(fine)))
        if kind == "sglang" and config.chunked_prefill:  # SGLang starts with whole pages
            page = config.block_size
            config = _set(config, "max_num_batched_tokens",
                          -(-config.max_num_batched_tokens // page) * page)
        if kind == "lmdeploy":  # LMDeploy starts with its preallocation declared
            config = _seats_within_budget(replace(
                config, prealloc_tokens=Knobs().lmdeploy.prefill_interval))
    assert not config.problems(), config.problems()
    return config


def _seats_within_budget(config: Config) -> Config:
    """`config` with no more seats than its token budget: SGLang and LMDeploy start with
    no other (LMDeploy's decode forward runs every running request outside the budget)."""
    return replace(config, max_num_seqs=min(config.max_num_seqs,
                                            config.max_num_batched_tokens))


def honoured(config: Config, kind: SchedulerKind) -> Config:
    """`config` with each field step kind `kind` does not honour at its value set to the
    first value it does (kvsched.spec.step_kinds)."""
    takes = STEP_KINDS[kind].takes
    for name in ignored_fields(kind, config):
        config = _set(config, name, takes[name][0])
    return config


def _set(config: Config, name: str, value: object) -> Config:
    fields: dict[str, Any] = {name: value}
    return replace(config, **fields)


def servable(config: Config, kind: SchedulerKind) -> Config:
    """`config` grown to one its step kind's engine starts with and serves every request
    the strategies draw in: for vLLM V0's, a cache of one max_model_len sequence (V0
    refuses a smaller one at start-up; below it the profile reproduces V0's stalls); for
    SGLang's, a pool of two pages more than max_model_len, a chunk of whole pages (SGLang
    refuses any other at start-up: kvsched.spec.step_kinds), no more seats than the token
    budget; for LMDeploy's, a pool of a block more than max_model_len (LMDeploy caps a
    session at its pool less one block) and of max_model_len and prealloc_tokens more
    (below it a long request never gets the blocks it asks for, and LMDeploy waits on it
    for ever), no more seats than the token budget (its decode forward runs every
    running request outside the budget: LMDeploy's start-up refusal); vLLM v1's config as
    given.

    Known gap, which the spec cannot say yet: below these its adapter refuses more
    seats than the token budget, and the step, which does not model that, admits
    nothing. SGLang's front end, which refuses prompts from max_req_len - 5 tokens on, is
    config max_prompt_len, which profile sglang@0.5.23 sets (`resolve`): the step
    rejects those prompts on arrival."""
    pages = -(-config.max_model_len // config.block_size)
    if kind == "v0":
        return replace(config, num_gpu_blocks=max(config.num_gpu_blocks, pages))
    if kind == "lmdeploy":
        pages = max(pages + 1, -(-(config.max_model_len + config.prealloc_tokens)
                                 // config.block_size))
        return _seats_within_budget(replace(
            config, num_gpu_blocks=max(config.num_gpu_blocks, pages)))
    if kind != "sglang":
        return config
    pages += 2
    page = config.block_size
    batched = (-(-config.max_num_batched_tokens // page) * page
               if config.chunked_prefill else config.max_num_batched_tokens)
    return _seats_within_budget(replace(
        config, num_gpu_blocks=max(config.num_gpu_blocks, pages),
        max_num_batched_tokens=batched))


def knobs(torch: bool = False) -> st.SearchStrategy[Knobs]:
    """Any combination of the reference scheduler's policy knobs of vLLM v1's step
    (default cost model); with `torch`, those the torch scheduler refuses
    (kvsched.optimized.knobs.COMPILED_ONLY_KNOBS) stay at their defaults."""
    older = {} if torch else dict(free_order=st.sampled_from(FREE_ORDERS),
                                  over_budget_prompt=st.sampled_from(OVER_BUDGET_PROMPTS))
    return st.builds(
        Knobs,
        victim=st.sampled_from(VICTIMS),
        admit_after_preempt=st.booleans(),
        reserve_full_sequence=st.booleans(),
        lift_threshold_when_alone=st.booleans(),
        continue_after_self_preemption=st.booleans(),
        **older,
    )


def profiles(scheduler: SchedulerKind | None = "v1", torch: bool = False
             ) -> st.SearchStrategy[str]:
    """The name of a profile in kvsched.spec.profiles.PROFILES whose rules are this
    step kind's (Profile.scheduler); None: of every step kind (v1, v0, sglang, lmdeploy).
    vLLM V0's, SGLang's and LMDeploy's are drawn only when asked: the compiled and torch
    schedulers refuse them. With `torch`, only those the torch scheduler runs."""
    from kvsched.optimized.knobs import unsupported_knobs

    if scheduler is None:  # each kind as often, whatever its number of profiles
        return st.one_of(*(profiles(kind, torch) for kind in SCHEDULER_KINDS
                           if any(p.scheduler == kind for p in PROFILES.values())))
    return st.sampled_from(sorted(
        name for name, p in PROFILES.items() if p.scheduler == scheduler
        and not (torch and unsupported_knobs(p.knobs, "torch") is not None)))


def policies(torch: bool = False, scheduler: SchedulerKind | None = "v1"
             ) -> st.SearchStrategy[str | Knobs]:
    """A profile name (of step kind `scheduler`, None: of every kind, each as often) or
    a free combination of vLLM v1's knobs; resolve it with `resolve`, and build it with
    `step_kind`'s step. With `torch`, only those the torch scheduler runs."""
    if scheduler is None:
        return st.one_of(*(profiles(kind, torch) for kind in SCHEDULER_KINDS
                           if any(p.scheduler == kind for p in PROFILES.values())),
                         knobs(torch))
    return st.one_of(profiles(scheduler, torch=torch), knobs(torch))


def step_kind(policy: str | Knobs) -> SchedulerKind:
    """The step kind a drawn policy runs: its profile's; bare knobs are vLLM v1's."""
    return get_profile(policy).scheduler if isinstance(policy, str) else "v1"


def resolve(config: Config, policy: str | Knobs) -> tuple[Config, Knobs]:
    """The config and knobs a drawn policy stands for: a profile sets its config
    defaults (but prefix caching, which stays as drawn) and its knobs, and the fields its
    step kind does not honour take a value it does (`honoured`); bare knobs leave the
    config as drawn."""
    if isinstance(policy, str):
        profile = get_profile(policy)
        configured = profile.configure(config, frozenset({"prefix_caching"}))
        return honoured(configured, profile.scheduler), profile.knobs
    return config, policy


# The priorities a workload draws, in order: neighbours 5 apart (within SGLang's
# priority-preemption threshold, 10), the outer ones 15 further (beyond it), so that
# SGLang's priority preemption is drawn too.
PRIORITY_LEVELS = (-20, -5, 0, 5, 20)


@st.composite
def workloads(draw: st.DrawFn, config: Config, *, min_requests: int = 1,
              max_requests: int = 8, max_arrival: int = 6,
              shared: bool = False, aborts: bool = True) -> list[WorkItem]:
    """A validated workload for `config`: ids r0, r1, ... arriving over a few steps.

    Prompts run up to a little past max_model_len and past the cache, so some
    requests must be rejected; outputs end at EOS (output_len) before or after
    max_tokens; priorities may tie, or lie within SGLang's priority-preemption threshold
    (10) of each other or beyond it (PRIORITY_LEVELS), so that its priority preemption is
    drawn too; about one request in six is aborted a few steps after it arrives
    (possibly in its arrival step), none without `aborts` (for a scheduler that does not
    model aborts: kvsched.spec.interface.not_aborting says which). With `shared`, most
    prompts start with one of two shared prefixes (prefix caching), or with the whole of
    an earlier request (a conversation's next turn): a more urgent request may then
    preempt with a radix-cache hit.
    """
    n = draw(st.integers(min_requests, max_requests))
    spread = draw(st.integers(0, max_arrival))  # 0: a burst, all in step 0
    items = []
    for i in range(n):
        arrival = draw(st.integers(0, spread))
        # About one request in six is aborted.
        abort = draw(st.one_of(*[st.none()] * 5, st.integers(arrival, arrival + 8))
                     ) if aborts else None
        items.append(WorkItem(
            id=f"r{i}",
            arrival=arrival,
            prompt_len=draw(prompt_lens(config)),
            output_len=draw(output_lens(config)),
            max_tokens=draw(output_lens(config)),
            priority=PRIORITY_LEVELS[draw(st.integers(-2, 2)) + 2],
            abort=abort,
        ))
        if shared and items[-1].prompt_len > 1:
            items[-1] = draw(_sharing(items[-1], items[:-1]))
    return validate(items)


@st.composite
def _sharing(draw: st.DrawFn, item: WorkItem, earlier: list[WorkItem]) -> WorkItem:
    """`item` starting with a shared prefix: s0 or s1, or an earlier request's whole
    sequence (it then arrives no sooner), or nothing."""
    turns = [w for w in earlier if w.prompt_len + w.output_len < item.prompt_len]
    source = draw(st.sampled_from(["s0", "s1", "", *(w.id for w in turns[-2:])]))
    if not source:
        return item
    if source in ("s0", "s1"):
        return replace(item, prefix=(source, draw(st.integers(1, item.prompt_len - 1))))
    before = next(w for w in turns if w.id == source)
    arrival = max(item.arrival, before.arrival)
    return replace(item, prefix=(source, before.prompt_len + before.output_len),
                   arrival=arrival,
                   abort=None if item.abort is None else max(item.abort, arrival))


def prompt_lens(config: Config) -> st.SearchStrategy[int]:
    """Prompt lengths for `config`: mostly ones that fit alone (a third of them short
    enough that several share the cache), some past max_model_len or the cache."""
    capacity = config.block_size * config.num_gpu_blocks
    fits = max(1, min(config.max_model_len - 1, capacity))
    longest = max(config.max_model_len, capacity) + config.block_size
    return st.one_of(st.integers(1, max(1, fits // 3)), st.integers(1, fits),
                     st.integers(1, longest))


def output_lens(config: Config) -> st.SearchStrategy[int]:
    """Output lengths (EOS or max_tokens) long enough for decodes to cross a few blocks."""
    return st.integers(1, max(16, 3 * config.block_size))
