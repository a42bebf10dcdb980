"""`make conformance-lmdeploy`: record LMDeploy 0.18.0's real PyTorch-engine scheduler on a
suite of workloads and check every trace at the MUST level and against profile
lmdeploy@0.18.0.

    python -m conformance.lmdeploy [--out DIR] [--lmdeploy-python PATH]
        [--random N] [--seed S] [--keep] [--list] [NAME...]

Named cases first, then N small random ones (seeds S..S+N-1; none when names are given),
all recorded in one LMDeploy process. Exit 0 when every trace is complete, MUST-clean and
equal to profile lmdeploy@0.18.0 step for step; when every trace that the store
(tests/data/lmdeploy/) keeps for its case has the kept step lines, byte for byte (the
store is what LMDeploy really does, and its decisions are the same in every run: the
driver's clock is logical); and when each of the profile's rules flipped (FLIPS) makes
some trace of the run diverge (a whole run, without names). Exit 1 otherwise, 2
on bad input or a missing LMDeploy environment. `--keep` writes the traces into the
store instead of comparing them. The counts line says what the traces reached: steps,
lazy preemptions, reclaims, void entries (a finished request's prefetched slot),
unsampled entries (a token LMDeploy dropped for a lazy victim), releases, rejections,
prefix hits and deduplications (the block trie's copies swapped for its own).
"""

from __future__ import annotations

import io
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
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
    steps_of,
    suite_parser,
)
from kvsched.adapters.lmdeploy import DEFAULT_LMDEPLOY_PYTHON, max_session_len
from kvsched.adapters.lmdeploy import ENGINE as LMDEPLOY
from kvsched.adapters.recording import AdapterError
from kvsched.spec.model import Config
from kvsched.spec.profiles import get_profile
from kvsched.spec.trace import TraceError
from kvsched.workload import WorkItem, validate

PROFILE = "lmdeploy@0.18.0"
ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / "tests" / "data" / "lmdeploy"
DEFAULT_OUT = Path("build/conformance-lmdeploy")
DEFAULT_RANDOM = 200
MAX_STEPS = 20_000  # every case ends well before this; one that does not is not live
PARSER = suite_parser("conformance.lmdeploy", __doc__, "--lmdeploy-python",
                      DEFAULT_LMDEPLOY_PYTHON, DEFAULT_OUT, DEFAULT_RANDOM, "",
                      {"--keep": "write the traces into the store (tests/data/lmdeploy/)"})




def cfg(**fields: object) -> Config:
    """LMDeploy's config as profile lmdeploy@0.18.0 sets it (blocks of 16 tokens), with
    `fields`; max_model_len, unless given, the longest session the pool takes."""
    base = replace(Config(block_size=16, prefix_caching=False),
                   **fields)  # type: ignore[arg-type]
    if "max_model_len" not in fields:
        base = replace(base, max_model_len=max_session_len(base))
    return get_profile(PROFILE).configure(
        base, frozenset({"prefix_caching", "max_model_len", *fields}))


def requests(seed: int, n: int, config: Config, *, prompt: tuple[int, int] = (8, 120),
             output: tuple[int, int] = (1, 120), arrive_by: int = 20, eos: float = 0.5,
             prefixes: Sequence[tuple[str, int]] = (), share: float = 0.0
             ) -> list[WorkItem]:
    """`n` seeded requests whose prompts LMDeploy's front end takes (at most
    max_model_len): prompts and max_tokens drawn from the ranges, half of them ending
    early (end-of-sequence), a `share` of them starting with one of the shared
    `prefixes` (content id, tokens)."""
    rng = random.Random(f"kvsched/lmdeploy/{seed}")
    items: list[WorkItem] = []
    while len(items) < n:
        plen = rng.randint(*prompt)
        max_tokens = rng.randint(*output)
        out = rng.randint(1, max_tokens) if rng.random() < eos else max_tokens
        prefix = None
        if prefixes and rng.random() < share:
            content, length = rng.choice(prefixes)
            prefix = (content, length)
            plen += length
        if plen > config.max_model_len:
            continue
        items.append(WorkItem(f"r{len(items)}", rng.randint(0, arrive_by), plen, out,
                              max_tokens, prefix=prefix))
    return validate(items)


def head_of_line(config: Config) -> list[WorkItem]:
    """A prompt whose blocks (and 16 preallocated tokens) do not fit while two requests
    decode stops the prefill pass: the small ones behind it wait."""
    return validate([WorkItem("a", 0, 60, 80, 80), WorkItem("b", 0, 70, 80, 80),
                     WorkItem("big", 2, 200, 10, 10), WorkItem("s1", 3, 10, 5, 5),
                     WorkItem("s2", 3, 12, 5, 5), WorkItem("s3", 4, 8, 5, 5)])


def lazy(reclaimed: bool) -> Callable[[Config], list[WorkItem]]:
    """Two requests outgrow the cache: the earlier one's decode cannot get a block (the
    later one, visited first, took the last) and preempts itself, keeping its blocks.
    Without `reclaimed` the other finishes before it needs another block and the victim
    resumes with a 1-token prefill on its own blocks; with it the other keeps growing
    and reclaims the victim's blocks, so it recomputes later."""
    items = [WorkItem("a", 0, 60, 90, 90), WorkItem("b", 1, 50, 90 if reclaimed else 70,
                                                    90 if reclaimed else 70)]
    return lambda config: validate(items)


def held(config: Config) -> list[WorkItem]:
    """Requests finishing while others run, in a roomy cache: each finished one sits in
    the next forward (its prefetched, void slot) and holds its blocks until its session
    ends (released); a last burst of arrivals needs blocks and reclaims held ones."""
    return validate([*(WorkItem(f"r{i}", i, 20 + 5 * i, 3 + 4 * i, 3 + 4 * i)
                       for i in range(8)),
                     *(WorkItem(f"late{i}", 14, 120, 20, 20) for i in range(3))])


def turns(config: Config) -> list[WorkItem]:
    """Long prompts (above the token budget) and a stream of short ones: short prompts
    go first, sorted by length, for short_turns prefills, then a long prompt's chunk;
    the long ones in order of estimated chunks less their aging."""
    longs = [WorkItem(f"long{i}", i * 3, 300 + 150 * i, 8, 8) for i in range(3)]
    shorts = [WorkItem(f"s{i}", 1 + i, 20 + (37 * i) % 90, 6, 6) for i in range(14)]
    return validate(longs + shorts)


def front_end(config: Config) -> list[WorkItem]:
    """Prompts at LMDeploy's front-end limit (session_len): the longest it takes, one that
    fills it and ones past it (refused), and a prompt whose max_tokens runs past the
    session (capped)."""
    limit = config.max_model_len
    return validate([WorkItem("a", 0, 40, 20, 20), WorkItem("edge", 1, limit - 1, 5, 5),
                     WorkItem("fill", 2, limit, 1, 5), WorkItem("past", 2, limit + 1, 1, 1),
                     WorkItem("far", 3, limit + 50, 1, 1),
                     WorkItem("capped", 4, limit - 30, 60, 60),
                     WorkItem("b", 5, 30, 10, 10)])


def conversations(config: Config) -> list[WorkItem]:
    """Six conversations of three turns, each next turn (its prompt the whole previous
    turn, outputs included) arriving while the previous one still decodes: the next
    turn's prefill puts those blocks in the trie first, so the previous turn's own
    copies give way to the trie's as it allocates (a deduplication)."""
    items = []
    for c in range(6):
        arrival, plen, prev = c % 2, 40, None
        for t in range(3):
            out = 70 - 15 * t
            rid = f"c{c}-t{t}"
            items.append(WorkItem(rid, arrival, plen, out, out, prefix=prev))
            prev = (rid, plen + out)
            arrival, plen = arrival + 12, plen + out + 10
    return validate(items)


SYSTEM = (("sys-a", 48), ("sys-b", 96))

CASES: tuple[Case, ...] = (
    Case("head-of-line", "a prompt that does not fit stops the prefill pass: smaller ones "
         "behind it wait (head-of-line blocking)",
         cfg(num_gpu_blocks=20, max_num_batched_tokens=256, max_num_seqs=4), head_of_line),
    Case("lazy-resumed", "a decode that cannot grow preempts itself, keeping its blocks; "
         "nothing reclaims them and it resumes with a 1-token prefill, no recompute",
         cfg(num_gpu_blocks=16, max_num_batched_tokens=256, max_num_seqs=4), lazy(False)),
    Case("lazy-reclaimed", "a lazy victim's blocks reclaimed by the other request's "
         "growth: it recomputes its prompt and outputs",
         cfg(num_gpu_blocks=16, max_num_batched_tokens=256, max_num_seqs=4), lazy(True)),
    Case("self-preemption", "many requests outgrowing the cache: the request that cannot "
         "grow preempts itself, decodes visited from the last admitted",
         cfg(num_gpu_blocks=24, max_num_batched_tokens=256, max_num_seqs=8),
         lambda c: requests(1, 24, c, prompt=(20, 100), output=(60, 150), eos=0.2)),
    Case("held-and-released", "finished requests sit in the prefetched forward (void) and "
         "hold their blocks until their sessions end, or a later admission reclaims them",
         cfg(num_gpu_blocks=40, max_num_batched_tokens=256, max_num_seqs=8), held),
    Case("prefill-interval", "seats more than half full and few tokens waiting: decodes "
         "until 16 in a row, then a prefill",
         cfg(num_gpu_blocks=200, max_num_batched_tokens=512, max_num_seqs=6),
         lambda c: requests(2, 30, c, prompt=(8, 40), output=(30, 90), arrive_by=120)),
    Case("prefill-interval-4", "--prefill-interval 4: a prefill after 4 decodes in a row, "
         "4 tokens preallocated",
         cfg(num_gpu_blocks=200, max_num_batched_tokens=512, max_num_seqs=6,
             prealloc_tokens=4),
         lambda c: requests(2, 30, c, prompt=(8, 40), output=(30, 90), arrive_by=120),
         {"prefill_interval": 4}),
    Case("long-prompt-chunks", "prompts above max_prefill_token_num are computed in chunks "
         "of the budget, alone in their forward, decodes between them",
         cfg(num_gpu_blocks=120, max_num_batched_tokens=128, max_num_seqs=8),
         lambda c: requests(3, 16, c, prompt=(20, 600), output=(5, 60))),
    Case("short-long-turns", "long prompts wait while short ones take short_turns prefills "
         "(shortest first), then a long one's turn (fewest chunks after aging)",
         cfg(num_gpu_blocks=200, max_num_batched_tokens=128, max_num_seqs=8), turns),
    Case("short-long-turns-fifo", "LMDEPLOY_PT_TTFT_POLICY fifo and 1 short turn: long "
         "prompts in arrival order, a long turn after every short prefill",
         cfg(num_gpu_blocks=200, max_num_batched_tokens=128, max_num_seqs=8), turns,
         {"ttft_policy": "fifo", "short_turns": 1}),
    Case("aging", "LMDEPLOY_PT_TTFT_AGING_SEC 0.05 on a clock of 0.025 s a step: a long "
         "prompt's estimate drops a chunk every 2 steps waited",
         cfg(num_gpu_blocks=300, max_num_batched_tokens=128, max_num_seqs=8),
         lambda c: requests(4, 20, c, prompt=(100, 700), output=(1, 20), arrive_by=40),
         {"aging_seconds": 0.05}),
    Case("chunked-prefill-option", "enable_chunked_prefill: a forward tries a prefill "
         "whenever nothing is ready",
         cfg(num_gpu_blocks=120, max_num_batched_tokens=128, max_num_seqs=8),
         lambda c: requests(5, 20, c, prompt=(20, 300), output=(5, 60)),
         {"enable_chunked_prefill": True}),
    Case("prefix-hits", "the block trie: prompts sharing a system prompt hit its full "
         "blocks",
         cfg(num_gpu_blocks=120, max_num_batched_tokens=256, max_num_seqs=8,
             prefix_caching=True),
         lambda c: requests(6, 24, c, prefixes=SYSTEM, share=0.7, output=(1, 60))),
    Case("prefix-eviction", "the block trie under pressure: unheld cached blocks count as "
         "free and are evicted least recently used first (ties by insertion); lazy "
         "victims' failed readmissions give their blocks back to the trie",
         cfg(num_gpu_blocks=24, max_num_batched_tokens=256, max_num_seqs=4,
             prefix_caching=True),
         lambda c: requests(7, 30, c, prefixes=(*SYSTEM, ("sys-c", 64)), share=0.8,
                            output=(10, 120), arrive_by=80)),
    Case("conversation-dedup", "the block trie and conversations: a turn still decoding "
         "has its full blocks swapped for the trie's, which the next turn's prefill put "
         "there first (dedup); the copies are freed at once, and in this tight cache "
         "another request's allocation takes one in the same forward",
         cfg(num_gpu_blocks=40, max_num_batched_tokens=512, max_num_seqs=8,
             prefix_caching=True), conversations),
    Case("front-end-limit", "prompts of max_session_len tokens or more are refused on "
         "arrival; the longest one taken is served, a max_tokens past the session capped",
         cfg(num_gpu_blocks=20, max_num_batched_tokens=512, max_num_seqs=4), front_end),
)


def random_case(seed: int) -> Case:
    """A small random config and workload: block size, pool, seats, budget, prefix
    caching, the prefill interval and the long-prompt policy drawn from `seed`."""
    rng = random.Random(f"kvsched/lmdeploy-random/{seed}")
    block = rng.choice((16, 16, 32, 64))
    seats = rng.choice((1, 2, 4, 8))
    budget = max(seats, rng.choice((64, 128, 256, 512)))
    pool = max(4, rng.choice((400, 800, 1600, 3200)) // block)
    interval = rng.choice((16, 16, 16, 4))
    caching = rng.random() < 0.4
    c = cfg(block_size=block, num_gpu_blocks=pool, max_num_batched_tokens=budget,
            max_num_seqs=seats, prefix_caching=caching, prealloc_tokens=interval)
    settings: dict[str, object] = {}
    if interval != 16:
        settings["prefill_interval"] = interval
    if rng.random() < 0.2:
        settings["ttft_policy"] = "fifo"
    n = rng.randint(3, 30)
    prefixes = (("sys-a", rng.randint(8, 100)), ("sys-b", rng.randint(8, 200)))
    longest = min(c.max_model_len, 700)
    return Case(f"random-{seed}", "random", c,
                lambda c: requests(10_000 + seed, n, c, prompt=(1, longest),
                                   output=(1, 150), arrive_by=30,
                                   prefixes=prefixes if caching else (),
                                   share=0.6 if caching else 0.0), settings)


def case_named(name: str) -> Case:
    """The case of this name: a named one or random-N."""
    for c in CASES:
        if c.name == name:
            return c
    if name.startswith("random-") and name[len("random-"):].isdigit():
        return random_case(int(name[len("random-"):]))
    raise KeyError(f"no case {name!r}")


# Each rule of profile lmdeploy@0.18.0 flipped, with the config change a flip needs (the
# preallocation is prefill_interval tokens, which config prealloc_tokens declares): the
# suite must tell every one from LMDeploy, or agreeing with the profile proves less than
# it seems.
FLIPS: dict[str, tuple[Mapping[str, object], Mapping[str, object]]] = {
    "prefill_interval=8": ({"prefill_interval": 8}, {"prealloc_tokens": 8}),
    "enable_chunked_prefill=True": ({"enable_chunked_prefill": True}, {}),
    "short_turns=1": ({"short_turns": 1}, {}),
    "aging_seconds=0.1": ({"aging_seconds": 0.1}, {}),
    "step_seconds=1.0": ({"step_seconds": 1.0}, {}),
    "ttft_policy=fifo": ({"ttft_policy": "fifo"}, {}),
    "head_of_line_blocking=False": ({"head_of_line_blocking": False}, {}),
    "self_preemption=False": ({"self_preemption": False}, {}),
    "decode_reverse_order=False": ({"decode_reverse_order": False}, {}),
    "reclaim_finished_first=False": ({"reclaim_finished_first": False}, {}),
    "release_delay=1": ({"release_delay": 1}, {}),
}


def variants() -> dict[str, Variant]:
    """The profile with one rule flipped, for the sensitivity check."""
    base = get_profile(PROFILE).knobs
    return {name: (replace(base, lmdeploy=replace(base.lmdeploy, **knobs)),  # type: ignore[arg-type]
                   dict(config), "lmdeploy")
            for name, (knobs, config) in FLIPS.items()}


# The kept traces (tests/data/NAME/): each case's trace file, and every kept trace.
KEPT = Store(STORE)
stored_trace = KEPT.trace
stored = KEPT.traces


def check(case: str, data: bytes) -> Verdict:
    """A trace's checks, and its first divergence from profile lmdeploy@0.18.0."""
    return check_stream(case, io.BytesIO(data), PROFILE)


def reached(data: bytes) -> Counter[str]:
    """What a trace's step lines reached: steps, lazy preemptions, reclaims, releases,
    void and unsampled entries, rejections, prefix hits and deduplications."""
    out: Counter[str] = Counter()
    for raw in steps_of(data).splitlines():
        rec = json.loads(raw)
        if "step" not in rec:
            continue
        out["steps"] += 1
        for key in ("preempted", "reclaimed", "released", "void", "unsampled", "rejected",
                    "prefix_hits", "dedup"):
            out[key] += len(rec.get(key, ()))
    return out


def run(cases: Sequence[Case], out: Path, python: Path) -> dict[str, bytes]:
    return record_cases(LMDEPLOY, cases, out, python, MAX_STEPS)


def main(argv: Sequence[str] | None = None) -> int:
    args = parsed(PARSER, argv)
    if args is None:
        return 2
    if args.list:
        return list_cases(CASES)
    try:
        named = [case_named(n) for n in args.names] if args.names else list(CASES)
    except KeyError as e:
        print(f"conformance.lmdeploy: error: {e.args[0]}; see --list", file=sys.stderr)
        return 2
    randoms = [] if args.names else [random_case(args.seed + i) for i in range(args.random)]
    started = time.monotonic()
    try:
        traces = run(named + randoms, args.out, args.lmdeploy_python)
    except AdapterError as e:
        print(f"conformance.lmdeploy: error: {e}", file=sys.stderr)
        return 2
    verdicts = []
    failed = 0
    for i, (name, data) in enumerate(traces.items()):
        try:
            v = check(name, data)
        except TraceError as e:
            print(f"FAIL {name}: its trace cannot be read: {e}")
            failed += 1
            continue
        verdicts.append(v)
        if i < len(named) or not v.ok:  # random cases are told one by one only when they fail
            print(line(v))
            if v.divergence is not None:
                print(f"     {v.divergence.message}")
        failed += not v.ok
    total = sum((reached(data) for data in traces.values()), Counter())
    print(f"{len(traces)} cases ({len(named)} named, {len(randoms)} random): "
          + ", ".join(f"{total[k]} {k}" for k in (
              "steps", "preempted", "reclaimed", "released", "void", "unsampled",
              "rejected", "prefix_hits", "dedup")))
    print(f"{len(traces) - failed} of {len(traces)} LMDeploy traces conform (complete, "
          f"MUST clean, equal to {PROFILE} step for step); traces in {args.out}")
    changed = KEPT.keep_or_compare(traces, args.keep)
    blind = []
    if not args.names:  # the suite must tell each flipped rule from LMDeploy
        blind = print_sensitivity([args.out / f"{name}.jsonl" for name in traces], PROFILE,
                                  "LMDeploy", variants())
    print(f"{time.monotonic() - started:.0f} s")
    return 1 if failed or changed or blind else 0


if __name__ == "__main__":
    sys.exit(main())
