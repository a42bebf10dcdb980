"""The model checker's scopes: small configs, knobs and request shapes, explored whole.

A scope is one config, one set of knobs and up to three request shapes (prompt_len,
max_tokens, priority); arrival steps, aborts and end-of-sequence are left to the
explorer, which tries them all. Two families make the full run:

- `profiles`: each named profile in three caches (CACHES), fcfs on every multiset of
  one to three shapes with prompts 1 to 4 and max_tokens 1 to 3 (454 request sets),
  priority on every multiset of two or three of four shapes with both alternating
  priority patterns; vllm-v1+swap (FAMILY) with 2 host blocks;
- `grid`: every knob and config value (victim rule, admission after preemption, full
  sequence reservation, threshold lifting, over-budget prompts passed over, policy,
  preemption mode, host blocks, block size and count, token and sequence budgets,
  chunking and threshold, watermark and its scope, allocation, max_model_len), every
  pair of values in at least one config (a greedy pairwise covering array), each config
  on every multiset of two or three of six shapes (under priority, with both
  alternating priority patterns).
Beside them, `modes` puts the allocations that reserve ahead under the profiles of
engines that use them (MODES), and `prefix` shares prompts under prefix caching (with
both free-list orders of freed blocks).
The `sglang` family explores SGLang's step, and `lmdeploy` LMDeploy's (each engine's
step as the reference has it), each in small caches of its own.
A last one, `quick`, is a few seconds' worth of these for `make test`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from itertools import combinations, combinations_with_replacement, product
from typing import TypeVar

from kvsched.spec.blocks import never_completes
from kvsched.spec.knobs import OVER_BUDGET_PROMPTS, VICTIMS, Knobs
from kvsched.spec.model import (
    ALLOCATIONS,
    POLICIES,
    PREEMPTION_MODES,
    WATERMARK_SCOPES,
    Config,
)
from kvsched.spec.profiles import (
    PROFILES,
    VLLM_V1,
    ConfigDefaults,
    Profile,
    SchedulerKind,
    get_profile,
)

T = TypeVar("T")


@dataclass(frozen=True)
class Shape:
    prompt_len: int
    max_tokens: int
    priority: int = 0
    # shared contents its prompt starts with (kvsched.spec.prefix), for prefix caching
    prefix: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Scope:
    name: str
    family: str
    config: Config
    knobs: Knobs
    shapes: tuple[Shape, ...]
    scheduler: SchedulerKind = "v1"  # whose step: the reference of vLLM v1's, or SGLang's
    aborts: bool = True  # whether the environment may abort requests

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(f"r{i}" for i in range(len(self.shapes)))


def shapes(*items: tuple[int, int] | tuple[int, int, int]) -> tuple[Shape, ...]:
    return tuple(Shape(*item) for item in items)


BASE = Config(block_size=1, num_gpu_blocks=4, max_num_batched_tokens=4, max_num_seqs=4,
              max_model_len=8)


# The profile family: every profile of the reference's vLLM v1 step (Profile.scheduler
# "v1", the ReferenceScheduler every scope runs), and one that swaps: vLLM v1 never
# swaps, and vllm-v0 runs V0's step, which reproduces V0's stalls and livelocks
# (docs/conformance/vllm-v0.md) that this search reports, so the swapping member is
# vllm-v1's knobs with swap ("vllm-v1+swap", not a profile of the tool: no engine
# decides so).
def _distinct_v1_profiles() -> dict[str, Profile]:
    """The profiles of vLLM v1's step, each set of rules once (vllm-v1@0.34 decides as
    vllm-v1, the newest release's: the first name of a set stands for it)."""
    out: dict[str, Profile] = {}
    for name, p in PROFILES.items():
        if p.scheduler == "v1" and all((q.knobs, q.defaults) != (p.knobs, p.defaults)
                                       for q in out.values()):
            out[name] = p
    return out


FAMILY: dict[str, Profile] = {
    **_distinct_v1_profiles(),
    "vllm-v1+swap": Profile("vllm-v1+swap", "vllm-v1's knobs, victims swapped to host "
                            "blocks", VLLM_V1, ConfigDefaults(preemption="swap")),
}
SWAPPING = "vllm-v1+swap"


def profile_scope(profile: str, requests: tuple[Shape, ...], family: str = "profiles",
                  **fields: object) -> Scope:
    """A scope under a profile of FAMILY: its knobs, its config defaults where not given."""
    p = FAMILY[profile]
    config = p.configure(replace(BASE, **fields), frozenset(fields))  # type: ignore[arg-type]
    return Scope(name_of(profile, config, requests), family, config, p.knobs, requests)


def name_of(prefix: str, c: Config, requests: tuple[Shape, ...]) -> str:
    reqs = ",".join(f"{s.prompt_len}/{s.max_tokens}" + (f"p{s.priority}" if s.priority else "")
                    + "".join(f"@{content}:{length}" for content, length in s.prefix)
                    for s in requests)
    mode = c.preemption[:4] + (f"{c.num_cpu_blocks}" if c.preemption != "recompute" else "")
    flags = [c.policy[:4], mode]
    flags += [] if c.chunked_prefill else ["whole"]
    flags += [f"thr{c.long_prefill_token_threshold}"] if c.long_prefill_token_threshold else []
    flags += [f"wm{c.watermark_blocks}"] if c.watermark_blocks else []
    flags += ["wm-always"] if c.watermark_scope != "running" else []
    flags += [c.allocation] if c.allocation != "lazy" else []
    flags += ["cache"] if c.prefix_caching else []
    return (f"{prefix} bs{c.block_size} gpu{c.num_gpu_blocks} tok{c.max_num_batched_tokens} "
            f"seq{c.max_num_seqs} len{c.max_model_len} {'/'.join(flags)} [{reqs}]")


def request_sets(choices: tuple[Shape, ...], sizes: tuple[int, ...]
                 ) -> Iterator[tuple[Shape, ...]]:
    for k in sizes:
        yield from combinations_with_replacement(choices, k)


ALL_SHAPES = tuple(Shape(p, o) for p in range(1, 5) for o in range(1, 4))
# Four shapes that together overfill the roomy cache; the grid adds two small ones so
# that its tight caches (3 blocks of 1 token) keep more than one request alive.
FOUR_SHAPES = shapes((1, 3), (2, 1), (3, 2), (4, 3))
GRID_SHAPES = (*shapes((1, 1), (2, 2)), *FOUR_SHAPES)


# The profile family's caches: roomy; tight (one-token blocks, small budgets); capped
# (max_model_len caps the sequence at the whole cache).
CACHES: tuple[dict[str, int], ...] = (
    {"block_size": 2, "num_gpu_blocks": 4},
    {"block_size": 1, "num_gpu_blocks": 4, "max_num_seqs": 2, "max_num_batched_tokens": 3},
    {"block_size": 2, "num_gpu_blocks": 2, "max_num_seqs": 3, "max_model_len": 4},
)


def profile_scopes() -> list[Scope]:
    """Priority sets first, then three requests before two before one, each on every
    cache, so that the request sets that stress a scheduler most come first."""
    out = []
    for profile in FAMILY:
        host = {"num_cpu_blocks": 2} if profile == SWAPPING else {}
        for reqs in request_sets(FOUR_SHAPES, (3, 2)):
            for first in (0, 1):
                for cache in CACHES:
                    out.append(profile_scope(profile, alternate(reqs, first), policy="priority",
                                             **cache, **host))  # type: ignore[arg-type]
        for reqs in request_sets(ALL_SHAPES, (3, 2, 1)):
            for cache in CACHES:
                out.append(profile_scope(profile, reqs, **cache, **host))  # type: ignore[arg-type]
    return out


def alternate(reqs: tuple[Shape, ...], first: int) -> tuple[Shape, ...]:
    """Priorities first, 1 - first, first, ... in the request set's order."""
    return tuple(replace(s, priority=(i + first) % 2) for i, s in enumerate(reqs))


# The grid's dimensions: every value of every knob and config field the scopes vary.
DIMENSIONS: dict[str, tuple[object, ...]] = {
    "victim": ("policy", "tail", "lowest_priority"),
    "admit_after_preempt": (False, True),
    "reserve_full_sequence": (True, False),
    "lift_threshold_when_alone": (True, False),
    "continue_after_self_preemption": (False, True),
    "over_budget_prompt": ("stop", "skip"),
    "policy": ("fcfs", "priority"),
    "preemption": ("recompute", "swap", "auto"),
    "num_cpu_blocks": (1, 2, 4),
    "cache": ((1, 3), (1, 4), (2, 2), (2, 3), (2, 4)),
    "max_num_batched_tokens": (1, 2, 3, 4),
    "max_num_seqs": (1, 2, 3),
    "prefill": ("chunked", "threshold1", "threshold2", "whole"),
    "watermark_blocks": (0, 1),
    "watermark_scope": ("running", "always"),
    "allocation": ("lazy", "prompt", "full"),
    "max_model_len": (4, 5, 8),
}


def valid(point: dict[str, object]) -> bool:
    """Config.problems' rule: without chunking a whole prefill must fit the token budget."""
    if point.get("prefill") == "whole":
        tokens = point.get("max_num_batched_tokens", 4)
        return tokens == 4 and point.get("max_model_len", 4) == 4
    return True


def pairwise(dims: dict[str, tuple[object, ...]], seed: int = 0, candidates: int = 60
             ) -> list[dict[str, object]]:
    """A covering array of strength 2: every feasible pair of values is in some point
    (greedy, as AETG: of `candidates` random valid points, keep the one covering most
    uncovered pairs). Deterministic for a seed."""
    names = list(dims)
    rng = random.Random(seed)
    uncovered = {((a, va), (b, vb)) for a, b in combinations(names, 2)
                 for va, vb in product(dims[a], dims[b]) if valid({a: va, b: vb})}
    points: list[dict[str, object]] = []
    while uncovered:
        first = next(iter(sorted(uncovered, key=repr)))
        best: dict[str, object] = {}
        best_gain = -1
        for _ in range(candidates):
            point = {n: rng.choice(dims[n]) for n in names}
            point.update(dict(first))
            if not valid(point):
                continue
            gain = sum(1 for a, b in combinations(names, 2)
                       if ((a, point[a]), (b, point[b])) in uncovered)
            if gain > best_gain:
                best, best_gain = point, gain
        if best_gain < 0:  # no valid candidate drawn with this pair: build one
            best = {n: dims[n][0] for n in names} | dict(first)
            best |= {"max_num_batched_tokens": 4, "max_model_len": 4}
        for a, b in combinations(names, 2):
            uncovered.discard(((a, best[a]), (b, best[b])))
        points.append(best)
    return points


def grid_scope(point: dict[str, object], requests: tuple[Shape, ...]) -> Scope:
    def value(name: str, kind: type[T]) -> T:
        v = point[name]
        assert isinstance(v, kind), (name, v)
        return v

    def one_of(name: str, choices: tuple[T, ...]) -> T:
        v = point[name]
        assert v in choices, (name, v)
        return choices[choices.index(v)]

    knobs = Knobs(victim=one_of("victim", VICTIMS),
                  admit_after_preempt=value("admit_after_preempt", bool),
                  reserve_full_sequence=value("reserve_full_sequence", bool),
                  lift_threshold_when_alone=value("lift_threshold_when_alone", bool),
                  continue_after_self_preemption=value("continue_after_self_preemption",
                                                       bool),
                  over_budget_prompt=one_of("over_budget_prompt", OVER_BUDGET_PROMPTS))
    block_size, blocks = value("cache", tuple)
    prefill = value("prefill", str)
    config = replace(BASE, block_size=block_size, num_gpu_blocks=blocks,
                     num_cpu_blocks=value("num_cpu_blocks", int), policy=one_of("policy", POLICIES),
                     preemption=one_of("preemption", PREEMPTION_MODES),
                     max_num_batched_tokens=value("max_num_batched_tokens", int),
                     max_num_seqs=value("max_num_seqs", int),
                     max_model_len=value("max_model_len", int),
                     chunked_prefill=prefill != "whole",
                     long_prefill_token_threshold=int(prefill[-1]) if "threshold" in prefill
                     else 0, watermark_blocks=value("watermark_blocks", int),
                     watermark_scope=one_of("watermark_scope", WATERMARK_SCOPES),
                     allocation=one_of("allocation", ALLOCATIONS))
    label = (f"grid {knobs.victim}{'/admit' if knobs.admit_after_preempt else ''}"
             f"{'/full' if knobs.reserve_full_sequence else ''}"
             f"{'/lift' if knobs.lift_threshold_when_alone else ''}"
             f"{'/continue' if knobs.continue_after_self_preemption else ''}"
             f"{'/skip' if knobs.over_budget_prompt == 'skip' else ''}")
    return Scope(name_of(label, config, requests), "grid", config, knobs, requests)


def grid_scopes() -> list[Scope]:
    out = []
    for point in pairwise(DIMENSIONS):
        for reqs in request_sets(GRID_SHAPES, (2, 3)):
            if point["policy"] == "priority":
                out += [grid_scope(point, alternate(reqs, first)) for first in (0, 1)]
            else:
                out.append(grid_scope(point, reqs))
    return out


# Prefix caching: a shared content "s" of 2 tokens (one block of 2, or two of 1) or 4
# (two blocks of 2); a hit must leave a token past it (h * block_size <= N - 1). A
# conversation's second turn (r1) starts with the whole first turn (r0: "s" then its own
# tokens), so its prefix nests r0's id: its blocks past "s" are keyed as r0's own
# (kvsched.spec.prefix.nested). The private 1/3 adds pressure.
SHARED = (("s", 2),)
PREFIX_SHAPES = (Shape(3, 2, prefix=SHARED), Shape(3, 1, prefix=SHARED),
                 Shape(2, 2, prefix=SHARED), Shape(4, 1, prefix=(("s", 4),)), Shape(1, 3))
TURNS = (Shape(3, 2, prefix=SHARED), Shape(5, 1, prefix=(("s", 2), ("r0", 4))))
# vllm-v1 caches by default; sarathi and vllm-v1+swap (swapped-in blocks are cached
# again) are given caching; vllm-v1@0.19 frees blocks to the free list's tail as freed
# (knob free_order "as_freed": cached content evicted sooner).
CACHING_PROFILES = ("vllm-v1", "sarathi", SWAPPING, "vllm-v1@0.19")
# Caches in which requests sharing "s" outgrow the blocks, so that victims come back
# and hit what they (or their sharers) left cached: roomy (the conversation fits), 3
# blocks of 2, 5 of 1, and capped (max_model_len 4 on 2 blocks).
PREFIX_CACHES: tuple[dict[str, int], ...] = (
    {"block_size": 2, "num_gpu_blocks": 4},
    {"block_size": 2, "num_gpu_blocks": 3, "max_num_seqs": 3},
    {"block_size": 1, "num_gpu_blocks": 5, "max_num_seqs": 2, "max_num_batched_tokens": 3},
    {"block_size": 2, "num_gpu_blocks": 2, "max_num_seqs": 3, "max_model_len": 4},
)


def prefix_request_sets() -> list[tuple[Shape, ...]]:
    """Every multiset of two or three prefix shapes with at least two sharing "s"; the
    conversation alone and with a third request."""
    out = [reqs for reqs in request_sets(PREFIX_SHAPES, (3, 2))
           if sum(1 for s in reqs if s.prefix) >= 2]
    return [*out, TURNS, (*TURNS, PREFIX_SHAPES[1]), (*TURNS, PREFIX_SHAPES[4])]


def prefix_scope(profile: str, requests: tuple[Shape, ...], family: str,
                 **fields: object) -> Scope:
    """A profile's scope with prefix caching on (vllm-v1's default; given to the others)."""
    return profile_scope(profile, requests, family, prefix_caching=True, **fields)


def completes(scope: Scope) -> bool:
    """Every request of the scope can complete alone (rejection is the other families')."""
    return all(never_completes(scope.config, s.prompt_len, s.max_tokens) is None
               for s in scope.shapes)


def prefix_scopes(profiles: tuple[str, ...] = CACHING_PROFILES) -> list[Scope]:
    """Each profile that can cache, in each prefix cache, on every prefix request set
    whose requests fit it, fcfs; under priority, the sets of three with both
    alternating patterns."""
    out = []
    for profile in profiles:
        host = {"num_cpu_blocks": 2} if profile == SWAPPING else {}
        for cache in PREFIX_CACHES:
            for reqs in prefix_request_sets():
                out.append(prefix_scope(profile, reqs, "prefix", **cache, **host))
                if len(reqs) == 3:
                    out += [prefix_scope(profile, alternate(reqs, first), "prefix",
                                         policy="priority", **cache, **host)
                            for first in (0, 1)]
    return [s for s in out if completes(s)]


def quick_scopes() -> list[Scope]:
    """Seconds, for `make test`: each profile in each cache, three requests of the grid's
    shapes, fcfs and priority."""
    out = []
    for profile in FAMILY:
        host = {"num_cpu_blocks": 2} if profile == SWAPPING else {}
        for cache in CACHES:
            for reqs in request_sets(FOUR_SHAPES, (3,)):
                out.append(profile_scope(profile, reqs, "quick", **cache, **host))
                out.append(profile_scope(profile, alternate(reqs, 1), "quick",
                                         policy="priority", **cache, **host))
    for profile in CACHING_PROFILES:
        host = {"num_cpu_blocks": 2} if profile == SWAPPING else {}
        for cache, reqs in QUICK_PREFIX:
            out.append(prefix_scope(profile, reqs, "quick", **cache, **host))
    # Whole prompts under vLLM 0.11's rule, which passes over one above the budget left.
    for reqs in request_sets(FOUR_SHAPES, (3,)):
        for policy in ("fcfs", "priority"):
            out.append(profile_scope(
                "vllm-v1@0.11.1", alternate(reqs, 1) if policy == "priority" else reqs,
                "quick", chunked_prefill=False, max_model_len=4, policy=policy))
    return (out + mode_scopes("quick", list(request_sets(FOUR_SHAPES, (3,))))
            + quick_sglang_scopes() + quick_lmdeploy_scopes())


def quick_sglang_scopes() -> list[Scope]:
    """SGLang's step for `make test`: in each cache its own rules and the unreserved ones
    (which overcommit, so that decodes retract) on two sets of three requests, and the
    eager ones under priority at one seat."""
    out = []
    for cache in SGLANG_CACHES:
        pool = SGLANG_PREFIX if cache.get("prefix_caching") else SGLANG_SHAPES
        sets = list(request_sets(pool, (3,)))[:2]
        for rules in ("", "unreserved"):
            out += [sglang_scope(reqs, "quick", rules, **cache) for reqs in sets]
        out.append(sglang_scope(urgent(alternate(sets[0], 1)), "quick", "eager",
                                policy="priority", max_num_seqs=1, **cache))
    return out


# Allocations that reserve ahead: vLLM V0's whole-prompt allocation with a watermark of
# one block applied always, swapping (under vllm-v1+swap: V0's own step is not in
# FAMILY), and reservation to completion (Orca, TGI) under vllm-v1, prefix caching on.
MODES: tuple[tuple[str, dict[str, object]], ...] = (
    (SWAPPING, {"allocation": "prompt", "watermark_scope": "always",
                "watermark_blocks": 1, "num_cpu_blocks": 2}),
    ("vllm-v1", {"allocation": "full"}),
)


def mode_scopes(family: str = "modes", requests: list[tuple[Shape, ...]] | None = None
                ) -> list[Scope]:
    """Each of MODES in each profile cache, on the request sets given (by default every
    multiset of two or three of the four shapes, fcfs, and under priority both
    alternating patterns). A scope's name starts with its profile and allocation, so
    that one profile's scopes can be picked out without them."""
    out = []
    for profile, fields in MODES:
        label = f"{profile}/{fields['allocation']}"
        for cache in CACHES:
            sets = requests if requests is not None else [
                variant for reqs in request_sets(FOUR_SHAPES, (3, 2))
                for variant in (reqs, alternate(reqs, 0), alternate(reqs, 1))]
            for reqs in sets:
                policy = {"policy": "priority"} if any(s.priority for s in reqs) else {}
                scope = profile_scope(profile, reqs, family, **cache, **fields, **policy)
                out.append(replace(scope, name=name_of(label, scope.config, reqs)))
    return out


# Two requests sharing "s" outgrowing 3 blocks (preemption, then a re-hit); the
# conversation in the roomy cache.
QUICK_PREFIX = ((PREFIX_CACHES[1], (PREFIX_SHAPES[0], PREFIX_SHAPES[0], PREFIX_SHAPES[4])),
                (PREFIX_CACHES[0], (*TURNS, PREFIX_SHAPES[1])))


# SGLang's step (profile sglang@0.5.23) in caches of 12 tokens, max_model_len 32, on
# shapes SGLang serves as asked (kvsched.adapters.sglang.served_as_asked: a prompt below
# max_req_len - 5 and P + O within what the pool holds beside a page, so nothing is
# clipped), under its own rules and under rules that admit more eagerly, so that
# decodes run short and retract (a ratio of 0, no reserved output) and priority
# preemption is reached at one seat.
SGLANG = "sglang@0.5.23"
SGLANG_BASE = replace(BASE, num_gpu_blocks=12, max_num_batched_tokens=4, max_num_seqs=3,
                      max_model_len=32, first_block_id=1)
SGLANG_SHAPES = shapes((3, 3), (5, 2), (2, 5), (4, 4))
SGLANG_PREFIX = (Shape(3, 3, 0, (("s", 2),)), Shape(4, 2, 0, (("s", 2),)),
                 Shape(2, 4, 0, (("s", 2),)))
SGLANG_CACHES: tuple[dict[str, object], ...] = (
    {}, {"block_size": 2, "num_gpu_blocks": 6}, {"chunked_prefill": False,
                                                  "max_num_batched_tokens": 32},
    {"step_mix": "mixed_chunk"}, {"prefix_caching": True},
    {"prefix_caching": True, "block_size": 2, "num_gpu_blocks": 6})
SGLANG_RULES: tuple[tuple[str, dict[str, object]], ...] = (
    ("", {}), ("eager", {"new_token_ratio": 0.0, "min_ratio_factor": 0.0}),
    ("unreserved", {"reserve_output": False}))


def sglang_scope(requests: tuple[Shape, ...], family: str, rules: str = "",
                 **fields: object) -> Scope:
    """A scope of SGLang's step: profile sglang@0.5.23's knobs (with SGLANG_RULES'
    `rules`), its config defaults where not given."""
    p = get_profile(SGLANG)
    fields = {"prefix_caching": False, **fields}  # the radix cache where a cache says so
    config = p.configure(replace(SGLANG_BASE, **fields),  # type: ignore[arg-type]
                         frozenset(fields))
    knobs = replace(p.knobs, sglang=replace(p.knobs.sglang,
                                            **dict(SGLANG_RULES)[rules]))  # type: ignore[arg-type]
    name = name_of(SGLANG + (f"+{rules}" if rules else ""), config, requests)
    if config.step_mix != "prefill_or_decode":
        name += f" {config.step_mix}"
    return Scope(name, family, config, knobs, requests, "sglang")


def sglang_scopes(family: str = "sglang", sizes: tuple[int, ...] = (3, 2)) -> list[Scope]:
    """Every cache and rule set of SGLang's step on the request sets of `sizes` (fcfs, and
    under priority both alternating patterns at one seat)."""
    out = []
    for cache in SGLANG_CACHES:
        sets = (list(request_sets(SGLANG_PREFIX, sizes)) if cache.get("prefix_caching")
                else list(request_sets(SGLANG_SHAPES, sizes)))
        for rules, _ in SGLANG_RULES:
            for reqs in sets:
                out.append(sglang_scope(reqs, family, rules, **cache))
            for reqs in sets[:4]:
                for first in (0, 1):
                    out.append(sglang_scope(urgent(alternate(reqs, first)), family, rules,
                                            policy="priority", max_num_seqs=1, **cache))
    return out


def urgent(reqs: tuple[Shape, ...]) -> tuple[Shape, ...]:
    """Priority 1 made 20: more urgent than 0 by more than SGLang's preemption threshold
    (10), so that the urgent request preempts at the seat limit."""
    return tuple(replace(s, priority=20 * s.priority) for s in reqs)


# LMDeploy's step (profile lmdeploy@0.18.0) in caches of 4 or 5 blocks of 4 tokens with
# prefill_interval, and so the preallocation, at 4 tokens (a block: an admission takes a
# block beyond its prompt, a decode one beyond its next token), a token budget of 8 and
# max_model_len 32 (the session: the pool less a block). Requests that outgrow the pool
# together (a prompt of 9 is chunked): a decode that cannot grow preempts itself
# lazily, keeping its blocks, and resumes on them, or a later admission or growth
# reclaims them (a recompute); a finished request holds its blocks release_delay
# forwards, so that admissions reclaim held ones too. The clock reads 0 (step_seconds
# 0): a long prompt's aging (a wait of aging_seconds, 80 forwards at LMDeploy's
# defaults) and the trie's access times are out of scope (proofs.state_key.lmdeploy_key),
# so ties of the trie's eviction go to the older node. Rule sets: LMDeploy's own; a pass
# that skips a request whose blocks cannot be freed (no head-of-line blocking); and
# reclaiming waiting requests before held ones with the decode visiting the first
# admitted first. Each entry: a cache's fields, the most requests of a set, and the rule
# sets (three requests, three seats and the block trie cost the most states: the other
# rule sets take sets of two).
LMDEPLOY = "lmdeploy@0.18.0"
LMDEPLOY_BASE = replace(BASE, block_size=4, num_gpu_blocks=4, max_num_batched_tokens=8,
                        max_num_seqs=2, max_model_len=32, prealloc_tokens=4)
LMDEPLOY_SHAPES = shapes((3, 6), (5, 3), (2, 9), (9, 2))
LMDEPLOY_PREFIX = (Shape(5, 4, 0, (("s", 4),)), Shape(6, 2, 0, (("s", 4),)), Shape(3, 6))
LMDEPLOY_RULES: tuple[tuple[str, dict[str, object]], ...] = (
    ("", {}), ("skip", {"head_of_line_blocking": False}),
    ("waiting-first", {"reclaim_finished_first": False, "decode_reverse_order": False}))
ALL_LMDEPLOY_RULES = tuple(name for name, _ in LMDEPLOY_RULES)
LMDEPLOY_CACHES: tuple[tuple[dict[str, object], int, tuple[str, ...]], ...] = (
    ({}, 3, ("",)), ({}, 2, ALL_LMDEPLOY_RULES[1:]),
    ({"num_gpu_blocks": 5, "max_num_seqs": 3}, 2, ALL_LMDEPLOY_RULES),
    ({"prefix_caching": True, "num_gpu_blocks": 5}, 3, ("",)))
# What LMDeploy's scopes must be seen to reach (proofs.model_check.EVENTS): the run
# fails when a family's LMDeploy scopes, or the quick ones, stop reaching one.
LMDEPLOY_REACHES = frozenset({
    "preempted lazy", "lazy victim beside a decode", "resumed with its blocks",
    "reclaimed waiting", "recomputed after losing its blocks", "reclaimed held", "released",
    "void entry", "prefix hit"})


def lmdeploy_scope(requests: tuple[Shape, ...], family: str, rules: str = "",
                   **fields: object) -> Scope:
    """A scope of LMDeploy's step: profile lmdeploy@0.18.0's knobs with the clock at 0,
    prefill_interval (and so the preallocation, config prealloc_tokens) 4 and
    LMDEPLOY_RULES' `rules`, its config defaults where not given. LMDeploy's step takes
    no aborts."""
    p = get_profile(LMDEPLOY)
    fields = {"prefix_caching": False, "prealloc_tokens": 4, **fields}
    config = p.configure(replace(LMDEPLOY_BASE, **fields),  # type: ignore[arg-type]
                         frozenset(fields))
    own = {"step_seconds": 0.0, "prefill_interval": config.prealloc_tokens,
           **dict(LMDEPLOY_RULES)[rules]}
    knobs = replace(p.knobs, lmdeploy=replace(p.knobs.lmdeploy, **own))  # type: ignore[arg-type]
    name = name_of(LMDEPLOY + (f"+{rules}" if rules else ""), config, requests)
    return Scope(name, family, config, knobs, requests, "lmdeploy", aborts=False)


def lmdeploy_scopes(family: str = "lmdeploy", sizes: tuple[int, ...] = (3, 2)) -> list[Scope]:
    """Every cache of LMDeploy's step with its rule sets, on the request sets of `sizes`
    up to the cache's most (the shared-prefix shapes in the caching cache)."""
    out = []
    for cache, most, rule_sets in LMDEPLOY_CACHES:
        pool = LMDEPLOY_PREFIX if cache.get("prefix_caching") else LMDEPLOY_SHAPES
        sets = list(request_sets(pool, tuple(k for k in sizes if k <= most)))
        for rules in rule_sets:
            out += [lmdeploy_scope(reqs, family, rules, **cache) for reqs in sets]
    return out


def quick_lmdeploy_scopes() -> list[Scope]:
    """LMDeploy's step for `make test`, its own rules: two requests outgrowing 4 blocks
    (every event of LMDEPLOY_REACHES but the prefix hit), and two sharing a block's
    prefix in the caching cache."""
    return [lmdeploy_scope(shapes((2, 9), (3, 6)), "quick"),
            lmdeploy_scope(LMDEPLOY_PREFIX[:2], "quick", "", **LMDEPLOY_CACHES[-1][0])]


# The events each step kind's scopes must reach (LMDeploy's, LMDEPLOY_REACHES).
REACHES: dict[SchedulerKind, frozenset[str]] = {"lmdeploy": LMDEPLOY_REACHES}


def full_scopes() -> list[Scope]:
    return (profile_scopes() + grid_scopes() + prefix_scopes() + mode_scopes()
            + sglang_scopes() + lmdeploy_scopes())


SCOPE_SETS: dict[str, Callable[[], list[Scope]]] = {
    "quick": quick_scopes, "profiles": profile_scopes, "grid": grid_scopes,
    "modes": mode_scopes,
    "prefix": prefix_scopes, "prefix-swap": lambda: prefix_scopes((SWAPPING,)),
    "sglang": sglang_scopes,
    "lmdeploy": lmdeploy_scopes,
    "full": full_scopes,
}
