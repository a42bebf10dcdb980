"""`make conformance-sglang`: record SGLang 0.5.23's real scheduler on a suite of
workloads and check every trace at the MUST level and against profile sglang@0.5.23.

    python -m conformance.sglang [--out DIR] [--sglang-python PATH]
        [--random N] [--seed S] [--keep] [--list] [NAME...]

Named cases first, then N small random ones (seeds S..S+N-1; none when names are given),
all recorded in one SGLang process. Exit 0 when every trace is complete, MUST-clean and
equal to the profile step for step (hits included); when every rule of the profile,
flipped, makes some named case diverge (sensitivity: agreement would prove less than it
seems otherwise); and when every trace that the store (tests/data/sglang/) keeps for its
case has the kept step lines, byte for byte (the store is what SGLang really does, and
SGLang's decisions are the same in every run). Exit 1 otherwise, 2 on bad input or a
missing SGLang environment. `--keep` writes the traces into the store instead of
comparing them; `make test` checks the store again without SGLang.
"""

from __future__ import annotations

import io
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

from conformance.common import (
    EngineCase as Case,
)
from conformance.common import (
    Store,
    Variant,
    Verdict,
    check_stream,
    line,
    list_cases,
    parsed,
    print_sensitivity,
    record_cases,
    suite_parser,
    summary,
)
from kvsched.adapters.recording import AdapterError
from kvsched.adapters.sglang import DEFAULT_SGLANG_PYTHON, served_as_asked
from kvsched.adapters.sglang import ENGINE as SGLANG
from kvsched.spec.blocks import prompt_over_limit
from kvsched.spec.model import Config
from kvsched.spec.profiles import get_profile
from kvsched.workload import WorkItem, validate

PROFILE = "sglang@0.5.23"
ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / "tests" / "data" / "sglang"
DEFAULT_OUT = Path("build/conformance-sglang")
DEFAULT_RANDOM = 200
MAX_STEPS = 20_000  # every case ends well before this; one that does not is not live
PARSER = suite_parser("conformance.sglang", __doc__, "--sglang-python", DEFAULT_SGLANG_PYTHON,
                      DEFAULT_OUT, DEFAULT_RANDOM, "",
                      {"--keep": "write the traces into the store (tests/data/sglang/)"})




def cfg(**fields: object) -> Config:
    """SGLang's config as the profile's defaults set it (pages of 1 token, SGLang's
    default), the radix cache off unless `fields` turn it on, with `fields`."""
    base = replace(Config(block_size=1, first_block_id=1, max_model_len=2048,
                          prefix_caching=False), **fields)  # type: ignore[arg-type]
    return get_profile(PROFILE).configure(base, frozenset({"prefix_caching", *fields}))


def requests(seed: int, n: int, config: Config, *, prompt: tuple[int, int] = (8, 200),
             output: tuple[int, int] = (1, 150), arrive_by: int = 20, eos: float = 0.5,
             priorities: Sequence[int] = (0,), prefixes: Sequence[tuple[str, int]] = (),
             share: float = 0.0) -> list[WorkItem]:
    """`n` seeded requests that SGLang serves as asked (kvsched.adapters.sglang.
    served_as_asked) and its front end takes (config max_prompt_len): prompts and
    max_tokens drawn from the ranges, half of them ending
    early (end-of-sequence), a `share` of them starting with one of the shared
    `prefixes` (content id, tokens)."""
    rng = random.Random(f"kvsched/sglang/{seed}")
    items: list[WorkItem] = []
    while len(items) < n:
        rid = f"r{len(items)}"
        plen = rng.randint(*prompt)
        max_tokens = rng.randint(*output)
        out = rng.randint(1, max_tokens) if rng.random() < eos else max_tokens
        prefix = None
        if prefixes and rng.random() < share:
            content, length = rng.choice(prefixes)
            prefix = (content, length)
            plen += length
        w = WorkItem(rid, rng.randint(0, arrive_by), plen, out, max_tokens,
                     priority=rng.choice(priorities), prefix=prefix)
        if served_as_asked(config, w) is None \
                and prompt_over_limit(config, w.prompt_len) is None:
            items.append(w)
    return validate(items)


def bursts(seed: int, config: Config, count: int = 3, gap: int = 1500) -> list[WorkItem]:
    """Bursts of requests that run to max_tokens, `gap` steps apart, with idle stretches
    between them (the ratio decays through a burst and resets when the scheduler is
    fully idle)."""
    out: list[WorkItem] = []
    for b in range(count):
        part = requests(seed * 10 + b, 10, config, prompt=(8, 100), output=(100, 300),
                        eos=0.0, arrive_by=2)
        out += [replace(w, id=f"b{b}-{w.id}", arrival=w.arrival + gap * b) for w in part]
    return validate(out)


def ending_early(items: list[WorkItem], most: int) -> list[WorkItem]:
    """`items` with every output ended (end-of-sequence) after at most `most` tokens."""
    return [replace(w, output_len=min(w.output_len, most)) for w in items]


def aborting(kind: str, radix: bool, config: Config) -> list[WorkItem]:
    """Requests a client cancels while SGLang holds them `kind` of ways: waiting (two
    seats, the rest queue), being chunked (prompts over the chunk budget), decoding,
    or running while prefill steps run (a long prompt's chunks keep the running batch
    from decoding; one is cancelled right after its own prefill, in the last prefill
    batch). With `radix` some share a system prompt."""
    shared = ("sys-a", 64) if radix else None
    if kind == "waiting":
        items = [WorkItem(f"r{i}", i // 2, 30 + 7 * i + (64 if radix and i != 1 else 0), 40,
                          40, prefix=shared if i != 1 else None,
                          abort={3: 5, 5: 12, 6: 30, 7: 3}.get(i)) for i in range(8)]
    elif kind == "chunked":
        items = [WorkItem("r0", 0, 400, 10, 10, abort=3, prefix=shared),
                 WorkItem("r1", 0, 40, 20, 20),
                 WorkItem("r2", 6, 300, 10, 10, abort=9, prefix=shared),
                 WorkItem("r3", 7, 200, 10, 10),
                 # what of r0 stays cached: its chunks but the one computed last
                 WorkItem("r4", 12, 350, 10, 10, prefix=("r0", 250) if radix else None)]
    elif kind == "decoding":
        items = [WorkItem(f"r{i}", i // 2, 20 + 9 * i + (64 if radix and i % 2 else 0), 60,
                          60, prefix=shared if i % 2 else None,
                          abort={1: 10, 3: 20}.get(i)) for i in range(6)]
        # prefilled in step 8, cancelled before step 9 (the last prefill batch's)
        items.append(WorkItem("r6", 8, 10, 30, 30, abort=9))
    else:  # prefill steps
        items = [WorkItem("r0", 0, 30, 60, 60, abort=12),
                 WorkItem("r1", 0, 100, 60, 60, abort=10, prefix=shared),
                 WorkItem("r2", 10, 600, 10, 10, prefix=shared),
                 WorkItem("r3", 1, 25, 60, 60, abort=2),
                 WorkItem("r4", 11, 20, 30, 30)]
    return validate(items)


def front_end(config: Config) -> list[WorkItem]:
    """Prompts at the edge of SGLang's front-end limit: the longest it takes
    (max_prompt_len, with the few outputs its context leaves), the shortest it refuses
    (max_req_len - 5), one past it, one of max_model_len and one beyond; one refused
    arrival is cancelled in its arrival step (the abort finds nothing), between requests
    it serves."""
    limit, model = config.max_prompt_len, config.max_model_len
    return validate([WorkItem("a", 0, 60, 20, 20), WorkItem("edge", 1, limit, 5, 5),
                     WorkItem("at", 1, limit + 1, 5, 5),
                     WorkItem("past", 2, limit + 2, 1, 1, abort=2),
                     WorkItem("full", 3, model, 1, 1),
                     WorkItem("beyond", 3, model + 40, 1, 1),
                     WorkItem("b", 4, 80, 10, 10), WorkItem("c", 5, 30, 10, 10)])


SYSTEM = (("sys-a", 64), ("sys-b", 160))


def preempting_with_a_hit(hit: int, own: int, low_max: int, urgent_max: int,
                          later: int) -> list[WorkItem]:
    """Priority preemption by a request with a radix-cache hit: s0 caches a system prompt
    of `hit` tokens and ends; l1 and l2 (priority 0) decode up to `low_max` tokens; w
    (priority 20: `hit` tokens of that prompt and `own` more) asks for `urgent_max`, does
    not fit beside them, and is tried again each step, so its fill ids and its hit are
    those of its last try; x (priority 40), small, arrives at step `later` and takes the
    last seat, and w, now at the running-request limit, preempts: SGLang sizes its need
    by its extend (the fill less the hit), so fewer victims cover it."""
    return validate([
        WorkItem("s0", 0, hit + 4, 1, 1, 0, prefix=("sys-a", hit)),
        WorkItem("l1", 0, 30, low_max, low_max, 0),
        WorkItem("l2", 0, 40, low_max, low_max, 0),
        WorkItem("w", 3, hit + own, urgent_max, urgent_max, 20, prefix=("sys-a", hit)),
        WorkItem("x", later, 10, 10, 10, 40),
    ])


CASES: tuple[Case, ...] = (
    Case("chunked", "prompts longer than the chunk budget: one chunked request at a time, "
         "continued first, the next cut to whole pages",
         cfg(num_gpu_blocks=4000, max_num_batched_tokens=64, max_num_seqs=16),
         lambda c: requests(1, 24, c, prompt=(40, 400))),
    Case("retraction", "a steady stream of requests that all run to max_tokens: as the "
         "ratio decays admission overcommits, decode steps retract the fewest outputs, "
         "the ratio jumps, the victims recompute at the queue's end",
         cfg(num_gpu_blocks=1000, max_num_batched_tokens=128, max_num_seqs=16),
         lambda c: requests(2, 60, c, prompt=(20, 100), output=(100, 200), eos=0.0,
                              arrive_by=600)),
    Case("retraction-page16", "retraction with pages of 16 tokens: a decode needs a page "
         "only at a page boundary",
         cfg(block_size=16, num_gpu_blocks=64, max_num_batched_tokens=128,
                  max_num_seqs=16),
         lambda c: requests(2, 60, c, prompt=(20, 100), output=(100, 200), eos=0.0,
                              arrive_by=600)),
    Case("priority-preemption", "priority scheduling at the running-request limit: a "
         "request more urgent by more than 10 preempts the least urgent",
         cfg(num_gpu_blocks=1500, max_num_batched_tokens=128, max_num_seqs=3,
                  policy="priority"),
         lambda c: requests(4, 30, c, priorities=(0, 5, 20, 40), arrive_by=60)),
    Case("mixed-chunk", "--enable-mixed-chunk: decodes join prefill steps when their "
         "pages fit, charged to the chunk budget",
         cfg(num_gpu_blocks=900, max_num_batched_tokens=96, max_num_seqs=12,
                  step_mix="mixed_chunk"),
         lambda c: requests(5, 24, c, prompt=(20, 200), output=(20, 150))),
    Case("no-chunked-prefill", "chunked prefill off: whole prompts, the first one over the "
         "input budget admitted alone",
         cfg(num_gpu_blocks=700, max_num_batched_tokens=2048, max_num_seqs=8,
                  chunked_prefill=False),
         lambda c: requests(6, 24, c, prompt=(20, 400), output=(20, 200))),
    Case("head-of-line", "a request whose reserved output does not fit stops the pass: "
         "smaller ones behind it wait",
         cfg(num_gpu_blocks=800, max_num_batched_tokens=256, max_num_seqs=16),
         lambda c: requests(7, 30, c, prompt=(8, 300), output=(1, 400), eos=0.8)),
    Case("idle-reset", "bursts with idle stretches between them: the ratio decays while "
         "decoding and resets when the scheduler is fully idle",
         cfg(num_gpu_blocks=1200, max_num_batched_tokens=128, max_num_seqs=16),
         lambda c: bursts(8, c)),
    Case("long-outputs", "max_tokens above 4096: a request reserves at most 4096 future "
         "tokens",
         cfg(num_gpu_blocks=14000, max_model_len=8192, max_num_batched_tokens=512,
             max_num_seqs=16),
         lambda c: ending_early(requests(13, 24, c, prompt=(100, 2000),
                                         output=(3000, 6000), arrive_by=10), 200)),
    Case("page16-mixed-priority", "pages of 16, mixed chunks and priorities together",
         cfg(block_size=16, num_gpu_blocks=60, max_num_batched_tokens=128,
                  max_num_seqs=4, policy="priority", step_mix="mixed_chunk"),
         lambda c: requests(9, 30, c, priorities=(0, 20, 40), output=(10, 120))),
    Case("radix-page1", "the radix cache with pages of 1 token: shared system prompts hit "
         "to the token, up to the prompt's length - 1",
         cfg(num_gpu_blocks=1200, max_num_batched_tokens=128, max_num_seqs=16,
                  prefix_caching=True),
         lambda c: requests(10, 30, c, prefixes=SYSTEM, share=0.7, output=(1, 80))),
    Case("radix-page16", "the radix cache with pages of 16: hits of whole pages only",
         cfg(block_size=16, num_gpu_blocks=80, max_num_batched_tokens=128,
                  max_num_seqs=16, prefix_caching=True),
         lambda c: requests(11, 30, c, prefixes=SYSTEM, share=0.7, output=(1, 80))),
    Case("radix-eviction", "the radix cache under pressure: evictable pages count as free, "
         "the least recently used leaves are evicted, retraction too",
         cfg(num_gpu_blocks=500, max_num_batched_tokens=128, max_num_seqs=12,
                  prefix_caching=True),
         lambda c: requests(12, 36, c, prefixes=(*SYSTEM, ("sys-c", 100)), share=0.8,
                              output=(20, 160), arrive_by=80)),
    # priority preemption by a request with a radix-cache hit
    Case("priority-preemption-radix-page1", "a request more urgent by more than 10, "
         "with a radix-cache hit, preempts at the running-request limit: the victims "
         "must cover its extend less the hit, so one victim does where two would "
         "without it",
         cfg(num_gpu_blocks=1200, max_num_batched_tokens=128, max_num_seqs=3,
             policy="priority", prefix_caching=True),
         lambda c: preempting_with_a_hit(64, 169, 578, 511, 18)),
    Case("priority-preemption-radix-page16", "priority preemption by a request with a "
         "radix-cache hit of whole pages (pages of 16)",
         cfg(block_size=16, num_gpu_blocks=75, max_num_batched_tokens=128, max_num_seqs=3,
             policy="priority", prefix_caching=True),
         lambda c: preempting_with_a_hit(128, 13, 476, 619, 10)),
    # SGLang's own options (profile knobs its trace's header declares) and the configs
    # SGLang runs that vLLM refuses
    Case("no-chunked-short-budget", "chunked prefill off with a token budget (SGLang's "
         "max_prefill_tokens) below the context length: a prompt over it is admitted "
         "alone, the first of its step",
         cfg(num_gpu_blocks=1500, max_num_batched_tokens=128, max_num_seqs=8,
             chunked_prefill=False),
         lambda c: requests(14, 24, c, prompt=(20, 400), output=(20, 150))),
    Case("max-prefill-below-chunk", "--max-prefill-tokens below the chunk: a prefill "
         "step stops admitting once its input budget is spent, the chunk budget left",
         cfg(num_gpu_blocks=1500, max_num_batched_tokens=256, max_num_seqs=16),
         lambda c: requests(15, 30, c, prompt=(20, 300), output=(10, 120)),
         {"max_prefill_tokens": 100}),
    Case("priority-threshold-3", "--priority-scheduling-preemption-threshold 3: a request "
         "more urgent by more than 3 preempts at the running-request limit",
         cfg(num_gpu_blocks=1500, max_num_batched_tokens=128, max_num_seqs=3,
             policy="priority"),
         lambda c: requests(16, 30, c, priorities=(0, 2, 5, 9), arrive_by=60),
         {"priority_preemption_threshold": 3}),
    Case("low-priority-values-first", "--schedule-low-priority-values-first: a lower "
         "value is more urgent, in the queue and in preemption",
         cfg(num_gpu_blocks=1500, max_num_batched_tokens=128, max_num_seqs=3,
             policy="priority"),
         lambda c: requests(17, 30, c, priorities=(0, 5, 20, 40), arrive_by=60),
         {"higher_priority_first": False}),
    Case("retraction-policy-priority", "--retraction-policy priority: a full cache "
         "retracts the least urgent decoding request first",
         cfg(num_gpu_blocks=1000, max_num_batched_tokens=128, max_num_seqs=16,
             policy="priority"),
         lambda c: requests(18, 60, c, prompt=(20, 100), output=(100, 200), eos=0.0,
                            arrive_by=600, priorities=(0, 1, 2, 3)),
         {"retract_victim": "least_urgent"}),
    Case("retraction-length-priority", "--retraction-policy length (SGLang's default) "
         "under priority scheduling: a full cache retracts the fewest outputs whatever "
         "their priority",
         cfg(num_gpu_blocks=1000, max_num_batched_tokens=128, max_num_seqs=16,
             policy="priority"),
         lambda c: requests(18, 60, c, prompt=(20, 100), output=(100, 200), eos=0.0,
                            arrive_by=600, priorities=(0, 1, 2, 3))),
    # Aborts (SGLang's abort_request) and SGLang's front-end limit (max_prompt_len)
    *(Case(f"abort-{kind}{'-radix' if radix else ''}", f"a client cancels requests "
           f"{what}{', the radix cache on' if radix else ''}",
           cfg(num_gpu_blocks=3000, max_num_batched_tokens=64,
               max_num_seqs=2 if kind == "waiting" else 8, prefix_caching=radix),
           partial(aborting, kind, radix))
      for kind, what in (("waiting", "while they wait: they leave the queue at once"),
                         ("chunked", "while they are chunked: released at the top of the "
                                     "next step, the chunk computed last not cached"),
                         ("decoding", "while they decode, or right after their prefill: "
                                      "one more forward, then a finish (FINISH_ABORT)"),
                         ("prefill-steps", "while a long prompt's prefill steps run: they "
                                           "finish at their next decode"))
      for radix in (False, True)),
    Case("abort-retracted", "a client cancels a decoding request in the step a full "
         "cache retracts it: it keeps its mark (to_finish) in the queue, recomputes when "
         "admitted again, and finishes at the sample that ends that prefill",
         cfg(num_gpu_blocks=150, max_model_len=128, max_num_batched_tokens=64,
             max_num_seqs=4),
         lambda c: validate([WorkItem(f"r{i}", i * 8, 20, 80, 80,
                                      abort=457 if i == 6 else None) for i in range(40)])),
    Case("front-end-limit", "prompts at and past SGLang's front-end limit (max_req_len - "
         "5 and more, max_model_len, beyond it) are rejected on arrival, the longest it "
         "takes is served",
         cfg(num_gpu_blocks=300, max_model_len=256, max_num_batched_tokens=128,
             max_num_seqs=8, prefix_caching=True),
         front_end),
)


def random_case(seed: int) -> Case:
    """A small random config and workload: page size, step mix, chunking, priority,
    radix cache, pool and budgets all drawn from `seed`."""
    rng = random.Random(f"kvsched/sglang-random/{seed}")
    page = rng.choice((1, 1, 4, 16))
    mixed = rng.random() < 0.3
    chunked = mixed or rng.random() < 0.8
    priority = rng.random() < 0.3
    radix = rng.random() < 0.4
    budget = rng.choice((32, 64, 128, 256)) if chunked else 2048
    pool = rng.choice((300, 500, 800, 1200)) // page
    c = cfg(block_size=page, num_gpu_blocks=pool, max_num_batched_tokens=budget,
            max_num_seqs=min(rng.choice((2, 4, 8, 16)), budget), chunked_prefill=chunked,
            step_mix="mixed_chunk" if mixed else "prefill_or_decode",
            policy="priority" if priority else "fcfs", prefix_caching=radix)
    n = rng.randint(5, 30)
    prefixes = (("sys-a", rng.randint(8, 64)), ("sys-b", rng.randint(8, 100)))
    return Case(f"random-{seed}", "random", c,
                lambda c: requests(10_000 + seed, n, c, prompt=(1, 200), arrive_by=30,
                                 priorities=(0, 5, 20, 40) if priority else (0,),
                                 prefixes=prefixes if radix else (),
                                 share=0.6 if radix else 0.0))


def random_aborts_case(seed: int) -> Case:
    """random-N's config and requests, a client cancelling about a third of them 0 to 30
    steps after they arrive, drawn from a stream of their own (random-N stays as it is)."""
    base = random_case(seed)

    def workload(config: Config) -> list[WorkItem]:
        rng = random.Random(f"kvsched/sglang-random-aborts/{seed}")
        return validate([replace(w, abort=w.arrival + rng.randint(0, 30))
                         if rng.random() < 0.35 else w for w in base.workload(config)])

    return Case(f"random-aborts-{seed}", "random, with aborts", base.config, workload)


def case_named(name: str) -> Case:
    """The case of this name: a named one, random-N or random-aborts-N."""
    for c in CASES:
        if c.name == name:
            return c
    if name.startswith("random-") and name[len("random-"):].isdigit():
        return random_case(int(name[len("random-"):]))
    if name.startswith("random-aborts-") and name[len("random-aborts-"):].isdigit():
        return random_aborts_case(int(name[len("random-aborts-"):]))
    raise KeyError(f"no case {name!r}")


# Each rule of SGLang's step, flipped (SGLangKnobs' other value): the suite must tell
# every one from SGLang. A config rule (the step mix) is flipped in the trace's config.
FLIPS: dict[str, dict[str, object]] = {
    "reserve_output=False": {"reserve_output": False},
    "decay=False": {"decay": False},
    "idle_reset=False": {"idle_reset": False},
    "min_ratio_factor=0.5": {"min_ratio_factor": 0.5},
    "clip_max_new_tokens=1000000": {"clip_max_new_tokens": 1_000_000},
    "new_token_ratio=1.0": {"new_token_ratio": 1.0},
    "page_budget=False": {"page_budget": False},
    "misfit=skip": {"misfit": "skip"},
    "retract_victim=last": {"retract_victim": "last"},
    "requeue=front": {"requeue": "front"},
    "higher_priority_first=False": {"higher_priority_first": False},
    "priority_preemption_threshold=100": {"priority_preemption_threshold": 100},
    "preempt_need_net_of_prefix=False": {"preempt_need_net_of_prefix": False},
    "retract_decode_steps=0": {"retract_decode_steps": 0},
    "max_prefill_tokens=1000000": {"max_prefill_tokens": 1_000_000},
    "retract_victim=least_urgent": {"retract_victim": "least_urgent"},
}


def variants() -> dict[str, Variant]:
    """The profile with one rule flipped, for the sensitivity check."""
    base = get_profile(PROFILE).knobs
    out: dict[str, Variant] = {
        name: (replace(base, sglang=replace(base.sglang, **change)),  # type: ignore[arg-type]
               {}, "sglang")
        for name, change in FLIPS.items()}
    out["step_mix=mixed_chunk"] = (base, {"step_mix": "mixed_chunk"}, "sglang")
    return out


# The kept traces (tests/data/NAME/): each case's trace file, and every kept trace.
KEPT = Store(STORE)
stored_trace = KEPT.trace
stored = KEPT.traces


def check(case: str, data: bytes) -> Verdict:
    return check_stream(case, io.BytesIO(data), PROFILE)


def run(cases: Sequence[Case], out: Path, python: Path) -> dict[str, bytes]:
    return record_cases(SGLANG, cases, out, python, MAX_STEPS)


def main(argv: Sequence[str] | None = None) -> int:
    args = parsed(PARSER, argv)
    if args is None:
        return 2
    if args.list:
        return list_cases(CASES)
    try:
        named = [case_named(n) for n in args.names] if args.names else list(CASES)
    except KeyError as e:
        print(f"conformance.sglang: error: {e.args[0]}; see --list", file=sys.stderr)
        return 2
    randoms = [] if args.names else [random_case(args.seed + i) for i in range(args.random)]
    started = time.monotonic()
    try:
        traces = run(named + randoms, args.out, args.sglang_python)
    except AdapterError as e:
        print(f"conformance.sglang: error: {e}", file=sys.stderr)
        return 2
    verdicts = [check(name, data) for name, data in traces.items()]
    failed = 0
    for i, v in enumerate(verdicts):
        if i < len(named) or not v.ok:
            print(line(v))
            if v.divergence is not None:
                print(f"     {v.divergence.message}")
        failed += not v.ok
    if randoms:
        print(summary(f"random cases {args.seed}..{args.seed + len(randoms) - 1}",
                      verdicts[len(named):]))
    print(f"{len(verdicts) - failed} of {len(verdicts)} SGLang traces conform (complete, "
          f"MUST clean, equal to {PROFILE}); traces in {args.out}")
    changed = KEPT.keep_or_compare(traces, args.keep)
    blind = []
    if not args.names:
        blind = print_sensitivity([args.out / f"{c.name}.jsonl" for c in named], PROFILE,
                                  "SGLang", variants())
    print(f"{time.monotonic() - started:.0f} s")
    return 1 if failed or blind or changed else 0


if __name__ == "__main__":
    sys.exit(main())
