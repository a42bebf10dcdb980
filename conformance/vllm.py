"""`make conformance-vllm`: record vLLM's real v1 scheduler on a suite of workloads and
check every trace at the MUST level and against the profile of its vLLM release
(`vllm-v1@0.32` for vLLM 0.32.x: the release in the trace's header picks it).

    python -m conformance.vllm [--out DIR] [--vllm-python PATH]
        [--random N] [--seed S] [--list] [NAME...]

Named cases first, then N small random ones with prefix caching off (seeds
S..S+N-1) and M with it on (--random-prefix M, seeds S..S+M-1; none of either when
names are given), all recorded in one vLLM process.

Exit 0 when every trace, with prefix caching on or off, is MUST-clean and equal to the
profile step for step (hits included), except the divergences listed in
conformance.common.KNOWN_DIVERGENCES, each explained in docs/conformance/vllm.md with
the vLLM source line behind it. Exit 1 otherwise, 2 on bad input or a missing vLLM environment.
"""

from __future__ import annotations

import io
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from conformance.common import (
    Case,
    Variant,
    Verdict,
    line,
    list_cases,
    never_fitting,
    over_max_model_len,
    parsed,
    print_sensitivity,
    random_workload,
    seats_and_budget,
    suite_parser,
    summary,
    with_aborts,
)
from conformance.common import check_stream as check_stream_under
from kvsched.adapters.recording import AdapterError, Job
from kvsched.adapters.vllm import DEFAULT_VLLM_PYTHON
from kvsched.adapters.vllm import ENGINE as VLLM
from kvsched.generators import generate
from kvsched.spec.blocks import blocks_for
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Config
from kvsched.spec.profiles import PROFILES, get_profile, pinned_profile
from kvsched.spec.trace import TraceReader
from kvsched.workload import WorkItem, validate

FAMILY = "vllm-v1"  # a trace of vLLM X.Y is checked under FAMILY@X.Y
DEFAULT_OUT = Path("build/conformance-vllm")
DEFAULT_RANDOM = 200  # small random configs and workloads beside the named cases
DEFAULT_RANDOM_PREFIX = 40  # the same with prefix caching and shared prefixes
# Every case ends well before this; a trace that does not is a liveness failure.
MAX_STEPS = 100_000

def cfg(**fields: object) -> Config:
    return replace(Config(), **fields)  # type: ignore[arg-type]


def caching(**fields: object) -> Config:
    """A config with prefix caching on, vLLM's default."""
    return cfg(prefix_caching=True, **fields)


def system_prompts(items: list[WorkItem], seed: int, prompts: Sequence[int],
                   share: float = 1.0) -> list[WorkItem]:
    """Put one of the shared system prompts sys-0, sys-1, ... (of the given lengths)
    before a seeded `share` of the prompts; sys-0 is the most used (weights 1 / (i + 1))."""
    rng = random.Random(f"kvsched/vllm-system-prompts/{seed}")
    weights = [1 / (i + 1) for i in range(len(prompts))]
    out = []
    for w in items:
        if rng.random() < share:
            i = rng.choices(range(len(prompts)), weights)[0]
            w = replace(w, prompt_len=prompts[i] + w.prompt_len, prefix=(f"sys-{i}", prompts[i]))
        out.append(w)
    return validate(out)


def conversations(count: int, seed: int, max_model_len: int, prompts: Sequence[int],
                  turns: tuple[int, int] = (2, 6), spread: int = 200,
                  user: tuple[int, int] = (8, 64), output: tuple[int, int] = (8, 64),
                  think: tuple[int, int] = (0, 30),
                  priorities: Sequence[int] = (0,)) -> list[WorkItem]:
    """`count` conversations starting over `spread` steps, each turn's prompt the whole
    previous turn (prompt and outputs) and a new user message, the first turn's a system
    prompt and one: prefix (previous turn, its prompt + output_len). A turn arrives
    about when the previous one could have ended (a token a step) plus a think time, so
    some arrive while it still runs. A conversation stops where the next turn would not
    fit max_model_len."""
    rng = random.Random(f"kvsched/vllm-conversations/{seed}")
    items = []
    for c in range(count):
        arrival = rng.randint(0, spread)
        priority = rng.choice(priorities)
        i = rng.randrange(len(prompts))
        prefix: tuple[str, int] = (f"sys-{i}", prompts[i])
        for t in range(rng.randint(*turns)):
            prompt = prefix[1] + rng.randint(*user)
            out = rng.randint(*output)
            if prompt + out > max_model_len:
                break
            item = WorkItem(f"c{c}-t{t}", arrival, prompt, out,
                            out + rng.choice([0, 0, 8]), priority, prefix=prefix)
            items.append(item)
            prefix = (item.id, prompt + out)
            arrival += out + rng.randint(*think)
    return validate(items)


CASES: tuple[Case, ...] = (
    Case("fcfs-sharegpt", "fcfs, ShareGPT lengths, a roomy cache: the common path",
         cfg(block_size=16, num_gpu_blocks=256, max_num_batched_tokens=512, max_num_seqs=32,
             max_model_len=2048),
         lambda: generate("sharegpt", 150, 1, rate=0.5, max_model_len=2048)),
    Case("fcfs-tight", "fcfs, a cache of 64 blocks of 8: many preemptions of the tail",
         cfg(block_size=8, num_gpu_blocks=64, max_num_batched_tokens=128, max_num_seqs=16,
             max_model_len=256),
         lambda: generate("uniform", 120, 2, rate=1.0, max_model_len=256,
                          prompt_range=(16, 200), output_range=(8, 120))),
    Case("priority-mix", "priority, ShareGPT lengths, three priority classes",
         cfg(block_size=16, num_gpu_blocks=128, max_num_batched_tokens=256, max_num_seqs=16,
             max_model_len=1024, policy="priority"),
         lambda: generate("sharegpt", 120, 3, rate=0.4, max_model_len=1024,
                          priorities=(1, 2, 4))),
    Case("priority-tight", "priority, 48 blocks of 4: victims by (priority, arrival), some "
         "taken back after being scheduled",
         cfg(block_size=4, num_gpu_blocks=48, max_num_batched_tokens=64, max_num_seqs=8,
             max_model_len=128, policy="priority"),
         lambda: generate("uniform", 120, 4, rate=1.0, max_model_len=128,
                          prompt_range=(8, 100), output_range=(4, 60),
                          priorities=(1, 1, 1, 1))),
    Case("threshold", "long-prefill threshold 64 on long prompts, lifted for a lone request",
         cfg(block_size=16, num_gpu_blocks=200, max_num_batched_tokens=256, max_num_seqs=16,
             max_model_len=1024, long_prefill_token_threshold=64),
         lambda: generate("uniform", 80, 5, rate=0.15, max_model_len=1024,
                          prompt_range=(100, 900), output_range=(4, 64))),
    Case("threshold-priority-tight", "threshold 32, priority, a tight cache",
         cfg(block_size=8, num_gpu_blocks=40, max_num_batched_tokens=96, max_num_seqs=8,
             max_model_len=256, long_prefill_token_threshold=32, policy="priority"),
         lambda: generate("uniform", 100, 6, rate=0.8, max_model_len=256,
                          prompt_range=(8, 200), output_range=(4, 80),
                          priorities=(2, 1))),
    Case("no-chunked-prefill", "chunked prefill off: whole prompts or nothing",
         cfg(block_size=16, num_gpu_blocks=64, max_num_batched_tokens=512, max_num_seqs=16,
             max_model_len=512, chunked_prefill=False),
         lambda: generate("uniform", 100, 7, rate=0.6, max_model_len=512,
                          prompt_range=(16, 400), output_range=(4, 100))),
    Case("no-chunked-priority-tight", "chunked prefill off, priority, a tight cache",
         cfg(block_size=8, num_gpu_blocks=36, max_num_batched_tokens=256, max_num_seqs=8,
             max_model_len=256, chunked_prefill=False, policy="priority"),
         lambda: generate("uniform", 100, 8, rate=0.8, max_model_len=256,
                          prompt_range=(8, 220), output_range=(4, 80),
                          priorities=(1, 1, 1))),
    Case("never-complete", "prompts of max_model_len tokens or more among ordinary ones: "
         "refused by vLLM's input processor",
         cfg(block_size=8, num_gpu_blocks=48, max_num_batched_tokens=128, max_num_seqs=8,
             max_model_len=256),
         lambda: never_fitting(generate("uniform", 60, 9, rate=0.5, max_model_len=256,
                                        prompt_range=(8, 200), output_range=(4, 60)),
                               256, 9, 8)),
    Case("aborts", "a third of the requests cancelled while waiting, running or preempted",
         cfg(block_size=8, num_gpu_blocks=48, max_num_batched_tokens=96, max_num_seqs=12,
             max_model_len=256),
         lambda: with_aborts(generate("uniform", 120, 10, rate=1.0, max_model_len=256,
                                      prompt_range=(8, 180), output_range=(4, 100)),
                             10, 0.33, 60)),
    Case("batch-seq-limit", "everything at step 0, max_num_seqs 4: admission by seat",
         cfg(block_size=16, num_gpu_blocks=64, max_num_batched_tokens=256, max_num_seqs=4,
             max_model_len=512),
         lambda: generate("alpaca", 80, 11, arrival="batch", max_model_len=512)),
    Case("watermark", "a watermark of 6 blocks at admission while others run",
         cfg(block_size=8, num_gpu_blocks=60, max_num_batched_tokens=128, max_num_seqs=16,
             max_model_len=256, watermark_blocks=6),
         lambda: generate("uniform", 100, 12, rate=0.8, max_model_len=256,
                          prompt_range=(8, 160), output_range=(4, 80))),
    Case("block-size-1-bursty", "block size 1, bursty arrivals",
         cfg(block_size=1, num_gpu_blocks=400, max_num_batched_tokens=128, max_num_seqs=16,
             max_model_len=160),
         lambda: generate("alpaca", 150, 13, arrival="bursty", rate=0.6, max_model_len=160)),
    Case("max-model-len-cap", "max_tokens beyond max_model_len: finished at the length cap",
         cfg(block_size=8, num_gpu_blocks=64, max_num_batched_tokens=128, max_num_seqs=8,
             max_model_len=200),
         lambda: over_max_model_len(generate("uniform", 60, 14, rate=0.5, max_model_len=200,
                                             prompt_range=(8, 190), output_range=(4, 60)),
                                    200, 14)),
    Case("aborts-priority-threshold", "aborts, priority, threshold 16, a tight cache",
         cfg(block_size=4, num_gpu_blocks=64, max_num_batched_tokens=48, max_num_seqs=8,
             max_model_len=128, long_prefill_token_threshold=16, policy="priority"),
         lambda: with_aborts(generate("uniform", 120, 15, rate=1.2, max_model_len=128,
                                      prompt_range=(4, 120), output_range=(2, 60),
                                      priorities=(1, 1, 2)),
                             15, 0.25, 40)),
    # Prefix caching on (vLLM's default): vLLM's own block hashes decide the hits.
    Case("prefix-system-prompts", "caching, fcfs: four system prompts before 120 ShareGPT "
         "prompts, most of them the first",
         caching(block_size=16, num_gpu_blocks=256, max_num_batched_tokens=512,
                 max_num_seqs=32, max_model_len=2048),
         lambda: system_prompts(generate("sharegpt", 120, 21, rate=0.6, max_model_len=1400),
                                21, (512, 256, 200, 96))),
    Case("prefix-conversations", "caching, fcfs: 40 conversations of up to 6 turns, each "
         "turn's prompt the whole previous turn",
         caching(block_size=16, num_gpu_blocks=200, max_num_batched_tokens=256,
                 max_num_seqs=16, max_model_len=1024),
         lambda: conversations(40, 22, 1024, (128, 64))),
    Case("prefix-tight-readmit", "caching, fcfs, 64 blocks of 8: preempted requests "
         "come back and hit their own blocks (outputs included) if still cached",
         caching(block_size=8, num_gpu_blocks=64, max_num_batched_tokens=128,
                 max_num_seqs=16, max_model_len=256),
         lambda: system_prompts(generate("uniform", 120, 23, rate=1.0, max_model_len=200,
                                         prompt_range=(8, 120), output_range=(16, 120)),
                                23, (48, 24), share=0.7)),
    Case("prefix-priority-tight", "caching, priority, 48 blocks of 8: conversations and "
         "system prompts, victims by priority",
         caching(block_size=8, num_gpu_blocks=48, max_num_batched_tokens=96, max_num_seqs=8,
                 max_model_len=256, policy="priority"),
         lambda: conversations(30, 24, 256, (40, 16), turns=(1, 4), spread=150,
                               user=(4, 40), output=(4, 50), priorities=(0, 1, 2))),
    Case("prefix-no-chunked", "caching, chunked prefill off: a whole prompt after its hit "
         "or nothing",
         caching(block_size=16, num_gpu_blocks=80, max_num_batched_tokens=512,
                 max_num_seqs=16, max_model_len=512, chunked_prefill=False),
         lambda: validate([*system_prompts(
             generate("uniform", 80, 25, rate=0.6, max_model_len=300,
                      prompt_range=(8, 200), output_range=(4, 80)), 25, (160, 64)),
             *[replace(w, arrival=w.arrival + 20)
               for w in conversations(15, 25, 512, (96,), spread=150)]])),
    Case("prefix-no-chunked-priority", "caching, chunked prefill off, priority, 40 blocks "
         "of 8: conversations under pressure",
         caching(block_size=8, num_gpu_blocks=40, max_num_batched_tokens=256, max_num_seqs=8,
                 max_model_len=256, chunked_prefill=False, policy="priority"),
         lambda: conversations(25, 26, 256, (64, 32), turns=(1, 5), spread=120,
                               user=(4, 30), output=(4, 40), priorities=(1, 2))),
    Case("prefix-threshold", "caching, threshold 32, block size 4: long shared prompts "
         "taken in chunks after the hit",
         caching(block_size=4, num_gpu_blocks=160, max_num_batched_tokens=96,
                 max_num_seqs=12, max_model_len=512, long_prefill_token_threshold=32),
         lambda: system_prompts(generate("uniform", 100, 27, rate=0.5, max_model_len=300,
                                         prompt_range=(4, 100), output_range=(4, 60)),
                                27, (200, 120, 33))),
)


# vLLM's async scheduling (its AsyncScheduler, as its engine core runs it on a GPU: step
# k+1 decided before step k's output is applied) on named cases of the suite: pipelined
# traces, checked at the MUST and SHOULD levels (profile vllm-v1 does not model async
# scheduling; docs/conformance/vllm.md, "Async scheduling").
ASYNC_CASES: tuple[Case, ...] = tuple(
    Case(f"async-{c.name}", f"async scheduling: {c.what}", replace(c.config, pipelined=True),
         c.workload)
    for c in CASES if c.name in ("fcfs-tight", "priority-tight", "aborts",
                                 "block-size-1-bursty", "prefix-tight-readmit"))


def random_case(seed: int) -> Case:
    """A small seeded config and workload that vLLM accepts: corner values on purpose
    (block size 1, a cache of exactly one max_model_len sequence, a budget of
    max_num_seqs tokens, threshold 1, prompts of max_model_len - 1 and more, aborts in
    the arrival step, negative priorities)."""
    rng = random.Random(f"kvsched/vllm-random/{seed}")
    block_size = rng.choice([1, 2, 4, 8, 16, 32])
    max_model_len = rng.choice([16, 32, 64, 100, 128, 256])
    blocks = blocks_for(max_model_len, block_size) + rng.choice([0, 0, 1, 3, 10, 50])
    chunked = rng.random() < 0.75
    seqs, budget = seats_and_budget(rng, chunked, max_model_len)
    threshold = min(rng.choice([0, 0, 1, 4, 16, 50]), max_model_len) if chunked else 0
    config = cfg(block_size=block_size, num_gpu_blocks=blocks, max_num_batched_tokens=budget,
                 max_num_seqs=seqs, max_model_len=max_model_len, chunked_prefill=chunked,
                 long_prefill_token_threshold=threshold,
                 policy=rng.choice(["fcfs", "priority"]),
                 watermark_blocks=min(rng.choice([0, 0, 0, 1, 3]), blocks))
    workload = random_workload(rng, max_model_len)
    return Case(f"random-{seed}", "a small random config and workload", config,
                lambda: workload)


def random_prefix_case(seed: int) -> Case:
    """A small seeded config with prefix caching and a workload whose requests share
    prefixes at random: one of a few system texts, or (a conversation's next turn) the
    start or the whole of an earlier request's sequence, before a prompt of their own;
    tight caches, so that blocks are evicted and preempted requests come back."""
    rng = random.Random(f"kvsched/vllm-random-prefix/{seed}")
    block_size = rng.choice([1, 2, 4, 8, 16])
    max_model_len = rng.choice([32, 64, 128, 256])
    blocks = blocks_for(max_model_len, block_size) + rng.choice([0, 1, 3, 10, 30])
    chunked = rng.random() < 0.75
    seqs = rng.choice([1, 2, 4, 8, 16])
    budget = max(seqs, rng.choice([seqs, 8, 16, 32, 64, 256]))
    if not chunked:
        budget = max(budget, max_model_len)
    threshold = min(rng.choice([0, 0, 0, 4, 16]), max_model_len) if chunked else 0
    config = caching(block_size=block_size, num_gpu_blocks=blocks,
                     max_num_batched_tokens=budget, max_num_seqs=seqs,
                     max_model_len=max_model_len, chunked_prefill=chunked,
                     long_prefill_token_threshold=threshold,
                     policy=rng.choice(["fcfs", "priority"]),
                     watermark_blocks=min(rng.choice([0, 0, 0, 1, 3]), blocks))
    texts = {f"s{i}": rng.randint(1, max_model_len - 2) for i in range(rng.randint(1, 3))}
    items: list[WorkItem] = []
    step = 0
    for k in range(rng.randint(1, 50)):
        step += rng.choice([0, 0, 0, 1, 2, 5, 20])
        prefix: tuple[str, int] | None = None
        shared = 0
        roll = rng.random()
        if roll < 0.4:
            name = rng.choice(sorted(texts))
            shared = rng.choice([texts[name], rng.randint(1, texts[name])])
            prefix = (name, shared)
        elif roll < 0.75 and items:
            earlier = rng.choice(items)
            whole = earlier.prompt_len + earlier.output_len
            shared = rng.choice([whole, whole, rng.randint(1, whole)])
            prefix = (earlier.id, shared)
        if shared >= max_model_len - 1:
            prefix, shared = None, 0
        prompt = shared + rng.randint(1, max(1, min(24, max_model_len - 1 - shared)))
        max_tokens = rng.randint(1, max(1, max_model_len - prompt))
        abort = step + rng.choice([1, 5, 20]) if rng.random() < 0.1 else None
        items.append(WorkItem(f"q{k}", step, prompt, rng.randint(1, max_tokens), max_tokens,
                              rng.choice([0, 0, 1, 2]), abort, prefix))
    workload = validate(items)
    return Case(f"random-prefix-{seed}", "a small random config and workload with shared "
                "prefixes, prefix caching on", config, lambda: workload)


def case_named(name: str) -> Case:
    """The case of this name: a named one, random-N or random-prefix-N."""
    for c in CASES:
        if c.name == name:
            return c
    for prefix, make in (("random-prefix-", random_prefix_case), ("random-", random_case)):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return make(int(name[len(prefix):]))
    raise KeyError(f"no case {name!r}")


class NoProfile(Exception):
    """A trace of a vLLM release that has no profile of its own; str() is one line."""


def release_profile(engine: dict[str, str]) -> str:
    """The profile of the vLLM release a trace's header names: vllm-v1@X.Y."""
    name, version = engine.get("name", "?"), engine.get("version", "?")
    pinned = pinned_profile(FAMILY, name, version)
    if pinned is None:
        known = ", ".join(p for p in PROFILES if p.startswith(FAMILY + "@"))
        raise NoProfile(f"a trace of {name} {version}, a release no profile follows "
                        f"(known: {known})")
    return pinned


def check_case(case: str, path: Path, profile: str | None = None) -> Verdict:
    """One trace's checks (conformance.common.check_case) against `profile`, by default
    the profile of the vLLM release its header names."""
    with path.open("rb") as stream:
        return check_stream(case, stream, profile)


def check_stream(case: str, stream: BinaryIO, profile: str | None = None) -> Verdict:
    """check_case on a trace read from `stream`; a pipelined trace (vLLM's async
    scheduling, which no profile models) at the MUST and SHOULD levels only."""
    data = stream.read()
    header = TraceReader(io.BytesIO(data)).header
    if header.config.pipelined:
        return check_stream_under(case, io.BytesIO(data), None)
    if profile is None:
        profile = release_profile(header.engine)
    return check_stream_under(case, io.BytesIO(data), profile)


# Each knob of the profile, flipped: the suite must tell every one of these from vLLM,
# or agreement with the profile would prove less than it seems. The rules of vLLM v1's
# step that releases decide differently, each as a knob and its two values: a variant
# of a profile flips one of them.
FLIPPABLE: dict[str, tuple[object, object]] = {
    "admit_after_preempt": (False, True),
    "reserve_full_sequence": (True, False),
    "lift_threshold_when_alone": (True, False),
    "continue_after_self_preemption": (False, True),
    "free_order": ("uncached_first", "as_freed"),
    "over_budget_prompt": ("stop", "skip"),
}


def knob_variants(profile: str) -> dict[str, Knobs]:
    """`profile`'s knobs with one rule changed: the victim the tail, and each of
    FLIPPABLE the other way from the profile's, named "knob=value"."""
    base = get_profile(profile).knobs
    variants = {"victim=tail": replace(base, victim="tail")}
    for name, (a, b) in FLIPPABLE.items():
        value = b if getattr(base, name) == a else a
        variants[f"{name}={value}"] = replace(base, **{name: value})  # type: ignore[arg-type]
    return variants


def v1_variants(profile: str) -> dict[str, Variant]:
    """knob_variants as the sensitivity check takes them: on the trace's own config, by
    the profile's step."""
    kind = get_profile(profile).scheduler
    return {name: (knobs, {}, kind) for name, knobs in knob_variants(profile).items()}


def run(cases: Sequence[Case], out: Path, vllm_python: Path) -> list[Verdict]:
    out.mkdir(parents=True, exist_ok=True)
    jobs = [Job(c.name, c.config, c.workload(), out / f"{c.name}.jsonl", MAX_STEPS)
            for c in cases]
    for r in VLLM.record_jobs(jobs, vllm_python):
        if r.stopped is not None:  # its trace keeps the steps before: INCOMPLETE below
            print(f"STOP {r.job.name}: vLLM {r.engine.get('version', '?')} did something in "
                  f"step {r.steps} that trace v1 cannot say: {r.stopped}")
    return [check_case(c.name, out / f"{c.name}.jsonl") for c in cases]


def main(argv: Sequence[str] | None = None) -> int:
    parser = suite_parser("conformance.vllm", __doc__, "--vllm-python", DEFAULT_VLLM_PYTHON,
                          DEFAULT_OUT, DEFAULT_RANDOM, ", prefix caching off")
    parser.add_argument("--random-prefix", type=int, default=DEFAULT_RANDOM_PREFIX,
                        metavar="M", help=f"also M small random cases with shared prefixes, "
                                          f"prefix caching on (default {DEFAULT_RANDOM_PREFIX})")
    args = parsed(parser, argv)
    if args is None:
        return 2
    if args.list:
        return list_cases(CASES + ASYNC_CASES)
    known = {c.name for c in CASES + ASYNC_CASES}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(f"conformance.vllm: error: unknown case {unknown[0]!r}; see --list",
              file=sys.stderr)
        return 2
    cases = [c for c in CASES + ASYNC_CASES if not args.names or c.name in args.names]
    randoms = [] if args.names else [random_case(args.seed + i) for i in range(args.random)]
    prefixed = [] if args.names else [random_prefix_case(args.seed + i)
                                      for i in range(args.random_prefix)]
    started = time.monotonic()
    try:
        verdicts = run(cases + randoms + prefixed, args.out, args.vllm_python)
    except (AdapterError, NoProfile) as e:
        print(f"conformance.vllm: error: {e}", file=sys.stderr)
        return 2
    profile = verdicts[0].profile if verdicts else FAMILY
    for i, v in enumerate(verdicts):
        if i < len(cases) or not v.ok:  # random cases are told one by one only when they fail
            print(line(v))
            if not v.exact and not v.ok:
                assert v.divergence is not None
                print(f"     {v.divergence.message}")
    failed = sum(not v.ok for v in verdicts)
    for what, group in ((f"random cases {args.seed}..{args.seed + len(randoms) - 1}, "
                         "caching off", verdicts[len(cases):len(cases) + len(randoms)]),
                        (f"random prefix cases {args.seed}..{args.seed + len(prefixed) - 1}, "
                         "caching on", verdicts[len(cases) + len(randoms):])):
        if group:
            print(summary(what, group))
    caching = [v for v in verdicts if v.prefix_caching]
    print(f"{len(verdicts) - failed} of {len(verdicts)} vLLM traces conform (MUST clean, "
          f"equal to {profile}); traces in {args.out}")
    if caching:
        print(f"caching on: {len(caching)} traces, {sum(not v.must for v in caching)} MUST "
              f"clean, {sum(v.exact for v in caching)} exact under {profile}, "
              f"{sum(v.hits for v in caching)} hits of {sum(v.hit_blocks for v in caching)} "
              "blocks")
    blind = []
    if not args.names:  # the whole suite must tell each flipped knob from vLLM
        # (the cases without prefix caching first: the replays of those are the
        # quickest; the free list's order is told only with it on)
        named = sorted((c for c in cases if not c.config.pipelined),
                       key=lambda c: c.config.prefix_caching)
        blind = print_sensitivity([args.out / f"{c.name}.jsonl" for c in named], profile,
                                  "vLLM", v1_variants(profile))
    print(f"{time.monotonic() - started:.0f} s")
    return 1 if failed or blind else 0


if __name__ == "__main__":
    sys.exit(main())
