"""Workload generators: seeded length distributions, arrival processes, a priority mix.

NOTE: every generator is a pure function of its arguments. Each part of a request
(lengths, max_tokens, arrival, priority) draws from its own `random.Random`, seeded
with a string made of the seed and the part's name, so that changing the arrival
process leaves the lengths of request i unchanged. Only the standard library is used:
CPython's Mersenne Twister and its string seeding (SHA-512 of the string) are the same
on every platform, and lengths and steps are rounded to whole numbers, so a seed gives
the same workload on every machine (unless a last-bit difference in the C library's
log or exp lands a value exactly on a rounding boundary).

Length distributions (tokens; a lognormal is given by its median e^mu and its sigma,
so that its mean is median * exp(sigma^2 / 2)):

- `sharegpt`: prompts median 90, sigma 1.34 (mean 221); outputs median 120, sigma 1.0
  (mean 198). The means are those of ShareGPT_V3_unfiltered_cleaned_split.json as
  vLLM's serving benchmark samples it (conversations with prompt <= 1024 and
  prompt + output <= 2048 tokens, both >= 4): vLLM PR #18566 reports 229,711 input
  and 203,068 generated tokens for 1000 requests (Llama-3.1 tokenizer, chat endpoint,
  so the template adds some input tokens). The prompt median of 90 gives the heavy
  right tail of chat prompts (a few long pasted documents); it and the output median
  120 are our assumptions: only the means are published numbers. (The
  vLLM paper, Kwon et al. SOSP 2023 section 6.1, reports longer means for the
  unfiltered set: 161 in, 338 out, with the OPT tokenizer.)
- `alpaca`: prompts median 16, sigma 0.6 (mean 19.2); outputs median 39, sigma 0.9
  (mean 58.5). The means are the vLLM paper's (section 6.1, figure 11: Alpaca mean
  input 19.31, mean output 58.45 tokens); the sigmas are our assumption.
- `long-context`: prompts median 2048, sigma 0.4 (mean 2217; document QA and RAG
  prompts of a few thousand tokens); outputs median 48, sigma 0.6 (mean 57). Not fitted
  to a data set: a shape that stresses prefill and KV capacity with short answers.
- `uniform`: prompt and output lengths uniform on the given inclusive ranges.

Clipping to max_model_len M (as a server refuses prompt + max_tokens > M): the prompt
is cut to M - 1 tokens, then max_tokens and the output to M - prompt, so every request
fits one sequence (prompt_len + max_tokens <= M) and output_len <= max_tokens.

max_tokens: a fixed number for every request (outputs longer than it are cut there),
or by default the output length plus a slack: none for a quarter of the requests (they
stop at max_tokens, the client's cap), otherwise uniform up to the output length again
(they stop at end-of-sequence). The output lengths keep the distribution's mean.

Arrivals, in steps (rate = mean arrivals per step):
- `poisson`: exponential gaps of mean 1 / rate in continuous time, floored to steps;
- `bursty`: an on/off Markov-modulated Poisson process with the same mean rate: on
  periods (mean 10 steps) take 10% of the time and all arrivals, at 10 x rate, separated
  by quiet gaps (mean 90 steps); counts per step vary far more than Poisson's;
- `batch`: every request at step 0 (rate is ignored).

Priorities: optional weights w0, w1, ... for priorities 0, 1, ...; None makes every
request priority 0 (lower value = more urgent, as in vLLM; SGLang's priority policy runs
the higher value first). The CLI also takes LEVEL:WEIGHT pairs (parse_priorities), so
that a mix can set levels further apart than SGLang's priority-preemption threshold.
A run under the priority policy that names no mix draws DEFAULT_PRIORITY_MIX
(`priorities_for`): levels 0, 20 and 40, further apart than that threshold (10), so
that SGLang's priority preemption happens in it as vLLM's does.

Shared prefixes (what prefix caching can reuse; kvsched.workload's `prefix` field):
- system prompts: K shared prompts of given lengths, ids sys-0 .. sys-(K-1); each
  request (each conversation's first turn) picks prompt i with weight 1 / (i + 1) ** skew
  (Zipf; skew 0 picks uniformly) and its drawn prompt becomes its own user text after
  it: prompt_len = system prompt + user text, prefix (sys-i, its length);
- conversations: with a mean of T turns (T > 1), a conversation goes on after each turn
  with probability 1 - 1 / T (geometric, mean T turns). Turn j + 1's prompt is the
  whole of turn j (prompt, then its output_len tokens of output) plus a new user
  message of the kind's prompt length, with prefix (turn j's id, turn j's prompt +
  output); the next turn's output has the kind's output length. It arrives once turn j
  could have ended, decoding a token every step from its arrival (arrival + output_len
  steps), plus a think time: exponential, mean `think_steps`. A loaded engine is slower
  than a token a step, so a turn may still run when the next arrives. A conversation
  ends early where its next prompt would not fit max_model_len. Conversations start by
  the arrival process at rate / T, so requests still arrive at `rate` on average; their
  priority is drawn per conversation. Request ids are c<conversation>-t<turn>.

The named generators `shared-prompts` (ShareGPT user text after the system prompts
DEFAULT_SYSTEM_PROMPTS, skew 1) and `conversations` (ShareGPT turns, mean
DEFAULT_TURNS turns) are `sharegpt` with those knobs; the knobs apply to every kind.
The prompt mixes and conversation lengths of real services are not published with
numbers we could cite: the defaults are our assumptions, chosen so that a default
simulation shows hits and evictions.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from heapq import heappop, heappush
from itertools import accumulate

from kvsched.workload import Source, WorkItem, WorkloadError

KINDS: tuple[str, ...] = ("sharegpt", "alpaca", "long-context", "uniform")
# Named generators: the length kinds, and sharegpt with shared prefixes.
SHARED_PROMPTS = "shared-prompts"
CONVERSATIONS = "conversations"
GENERATORS: tuple[str, ...] = (*KINDS, SHARED_PROMPTS, CONVERSATIONS)
ARRIVALS: tuple[str, ...] = ("poisson", "bursty", "batch")

DEFAULT_RATE = 0.05  # arrivals per step: about what the default Config serves of sharegpt
DEFAULT_MAX_MODEL_LEN = 4096  # Config's default
DEFAULT_PROMPT_RANGE = (16, 512)
DEFAULT_OUTPUT_RANGE = (16, 256)
# By default this fraction of requests asks for max_tokens = its output length exactly.
CAPPED_FRACTION = 0.25
# The bursty process: fraction of time in bursts, and the mean burst length in steps.
BURST_FRACTION = 0.1
BURST_STEPS = 10.0
# Shared prefixes: the system prompts of `shared-prompts` (tokens), their Zipf skew, and
# the mean turns and think time (steps) of `conversations`.
DEFAULT_SYSTEM_PROMPTS = (512, 256, 128, 64)
DEFAULT_SKEW = 1.0
DEFAULT_TURNS = 3.0
DEFAULT_THINK_STEPS = 50.0


@dataclass(frozen=True)
class LogNormal:
    """Token lengths round(exp(Normal(ln median, sigma))), at least 1."""

    median: float
    sigma: float

    @property
    def mean(self) -> float:
        return self.median * math.exp(self.sigma ** 2 / 2)

    def sampler(self, rng: random.Random) -> Callable[[], int]:
        mu, sigma, draw = math.log(self.median), self.sigma, rng.lognormvariate
        return lambda: max(1, round(draw(mu, sigma)))


@dataclass(frozen=True)
class Lengths:
    """A kind's distribution of (prompt, natural output) lengths, before clipping."""

    prompt: LogNormal
    output: LogNormal


LENGTHS: dict[str, Lengths] = {
    "sharegpt": Lengths(LogNormal(90, 1.34), LogNormal(120, 1.0)),
    "alpaca": Lengths(LogNormal(16, 0.6), LogNormal(39, 0.9)),
    "long-context": Lengths(LogNormal(2048, 0.4), LogNormal(48, 0.6)),
}


def _stream(seed: int, part: str) -> random.Random:
    return random.Random(f"kvsched/{part}/{seed}")


def _range(name: str, value: tuple[int, int]) -> tuple[int, int]:
    try:
        low, high = value
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (low, high), got {value!r}") from None
    for v in (low, high):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"{name} bounds must be integers, got {value!r}")
    if not 1 <= low <= high:
        raise ValueError(f"{name} must satisfy 1 <= low <= high, got ({low}, {high})")
    return low, high


def lengths(kind: str, n: int, seed: int, prompt_range: tuple[int, int] | None = None,
            output_range: tuple[int, int] | None = None) -> Iterator[tuple[int, int]]:
    """n (prompt, natural output) pairs of the kind's distribution, before clipping."""
    rng = _stream(seed, "lengths")
    if kind == "uniform":
        plo, phi = _range("prompt_range", prompt_range or DEFAULT_PROMPT_RANGE)
        olo, ohi = _range("output_range", output_range or DEFAULT_OUTPUT_RANGE)
        randint = rng.randint
        return ((randint(plo, phi), randint(olo, ohi)) for _ in range(n))
    if prompt_range is not None or output_range is not None:
        raise ValueError(f"prompt_range and output_range apply only to kind 'uniform', "
                         f"not {kind!r}")
    dist = LENGTHS[kind]
    prompt, output = dist.prompt.sampler(rng), dist.output.sampler(rng)
    return ((prompt(), output()) for _ in range(n))


def arrival_steps(arrival: str, n: int, rate: float, seed: int) -> Iterator[int]:
    """n non-decreasing arrival steps of the named process with `rate` per step."""
    rng = _stream(seed, "arrivals")
    if arrival == "batch":
        return (0 for _ in range(n))
    if arrival == "poisson":
        return (int(t) for t in accumulate(rng.expovariate(rate) for _ in range(n)))
    return _bursty(n, rate, rng)


def _bursty(n: int, rate: float, rng: random.Random) -> Iterator[int]:
    # Memoryless gaps: a gap that overruns its burst is redrawn in the next burst.
    burst_rate = rate / BURST_FRACTION
    quiet_steps = BURST_STEPS * (1 - BURST_FRACTION) / BURST_FRACTION
    t = 0.0
    burst_end = rng.expovariate(1 / BURST_STEPS)
    emitted = 0
    while emitted < n:
        gap = rng.expovariate(burst_rate)
        if t + gap < burst_end:
            t += gap
            emitted += 1
            yield int(t)
        else:
            t = burst_end + rng.expovariate(1 / quiet_steps)
            burst_end = t + rng.expovariate(1 / BURST_STEPS)


def _priority_draw(priorities: Sequence[float] | None, seed: int) -> Callable[[], int]:
    if priorities is None:
        return lambda: 0
    weights = list(priorities)
    if not weights:
        raise ValueError("priorities must list at least one weight (for priority 0)")
    for w in weights:
        if (not isinstance(w, (int, float)) or isinstance(w, bool) or not math.isfinite(w)
                or w < 0):
            raise ValueError(f"priority weights must be finite numbers >= 0, got {w!r}")
    total = sum(weights)
    if total <= 0:
        raise ValueError("priority weights must not all be 0")
    cumulative = list(accumulate(weights))
    last = len(weights) - 1
    rng = _stream(seed, "priorities")
    return lambda: min(bisect_right(cumulative, rng.random() * total), last)


# The highest priority a LEVEL:WEIGHT mix may name (its weights are listed densely).
MAX_PRIORITY_LEVEL = 1000


def parse_priorities(text: str) -> tuple[float, ...]:
    """Weights of priorities 0, 1, ... as the CLI takes them: '3,1' -> (3.0, 1.0); or
    LEVEL:WEIGHT pairs for levels far apart, the others weighing 0: '0:3,20:1' -> 3.0,
    nineteen 0.0, 1.0 (gaps wider than SGLang's priority-preemption threshold, 10)."""
    parts = text.split(",")
    if not any(":" in part for part in parts):
        try:
            return tuple(float(part) for part in parts)
        except ValueError:
            raise ValueError(f"priorities must be comma-separated weights like 3,1 or "
                             f"LEVEL:WEIGHT pairs like 0:3,20:1, got {text!r}") from None
    mix: dict[int, float] = {}
    for part in parts:
        level, _, weight = part.partition(":")
        try:
            at, w = int(level), float(weight)
        except ValueError:
            raise ValueError(f"priorities: {part!r} is not LEVEL:WEIGHT (a level 0 to "
                             f"{MAX_PRIORITY_LEVEL}, a weight), in {text!r}") from None
        if not 0 <= at <= MAX_PRIORITY_LEVEL or at in mix:
            raise ValueError(f"priorities: level {level!r} must be 0 to "
                             f"{MAX_PRIORITY_LEVEL}, each named once, in {text!r}")
        mix[at] = w
    return tuple(mix.get(i, 0.0) for i in range(max(mix) + 1))


# The priority mix of a generated workload whose run's policy is priority, when it names
# none: levels 0, 20 and 40 (each 20 apart, more than SGLang's priority-preemption
# threshold of 10), the most urgent under SGLang's order the rarest.
DEFAULT_PRIORITY_MIX: tuple[float, ...] = parse_priorities("0:6,20:3,40:1")


def priorities_for(policy: str, priorities: Sequence[float] | None
                   ) -> Sequence[float] | None:
    """The priority mix a generated workload of a run under `policy` draws from: the one
    given, else DEFAULT_PRIORITY_MIX under the priority policy (every request priority
    0 otherwise)."""
    if priorities is None and policy == "priority":
        return DEFAULT_PRIORITY_MIX
    return priorities


def _number(name: str, value: object, low: float, what: str) -> float:
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or not math.isfinite(value) or value < low):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return float(value)


def _system_prompts(lengths: Sequence[int], max_model_len: int) -> tuple[int, ...]:
    out = tuple(lengths)
    for length in out:
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            raise ValueError(f"system prompt lengths must be positive integers, "
                             f"got {length!r}")
        if length > max_model_len - 2:
            raise ValueError(f"a system prompt of {length} tokens leaves no room in "
                             f"max_model_len {max_model_len}: at most {max_model_len - 2} "
                             "(one token of user text and one of output)")
    return out


def _system_prompt_draw(lengths: tuple[int, ...], skew: float, seed: int
                        ) -> Callable[[], tuple[str, int] | None]:
    """Each call picks system prompt i with weight 1 / (i + 1) ** skew: (id, length)."""
    if not lengths:
        return lambda: None
    cumulative = list(accumulate(1 / (i + 1) ** skew for i in range(len(lengths))))
    total, last = cumulative[-1], len(lengths) - 1
    rng = _stream(seed, "system-prompts")

    def pick() -> tuple[str, int]:
        i = min(bisect_right(cumulative, rng.random() * total), last)
        return f"sys-{i}", lengths[i]

    return pick


def parse_lengths(text: str) -> tuple[int, ...]:
    """'1024,256' -> (1024, 256): system prompt lengths as the CLI takes them."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"system prompts must be comma-separated token counts like "
                         f"1024,256, got {text!r}") from None


def generate(kind: str, n: int, seed: int, *, arrival: str = "poisson",
             rate: float = DEFAULT_RATE, max_model_len: int = DEFAULT_MAX_MODEL_LEN,
             priorities: Sequence[float] | None = None, max_tokens: int | None = None,
             prompt_range: tuple[int, int] | None = None,
             output_range: tuple[int, int] | None = None,
             system_prompts: Sequence[int] | None = None, skew: float | None = None,
             turns: float | None = None,
             think_steps: float | None = None) -> list[WorkItem]:
    """A workload of n requests: ids r0, r1, ... in arrival order, or c<k>-t<j> for
    conversations (turns > 1). `system_prompts` and `turns` default to the named
    generator's (none and 1 for the length kinds); `skew` applies only with system
    prompts, `think_steps` only with turns > 1. The whole of `lazily`'s workload.

    post: len(__return__) == n
    post: all(w.prompt_len + w.max_tokens <= max_model_len for w in __return__)
    post: all(1 <= w.output_len <= w.max_tokens for w in __return__)
    """
    return list(lazily(kind, n, seed, arrival=arrival, rate=rate,
                       max_model_len=max_model_len, priorities=priorities,
                       max_tokens=max_tokens, prompt_range=prompt_range,
                       output_range=output_range, system_prompts=system_prompts, skew=skew,
                       turns=turns, think_steps=think_steps))


@dataclass(frozen=True)
class Generated(Collection[WorkItem]):
    """A generated workload of `len` requests, made as it is iterated (each iteration
    anew, the same requests), so that a run cut short costs only the requests it
    reached."""

    make: Callable[[], Iterator[WorkItem]]
    count: int

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[WorkItem]:
        return self.make()

    def __contains__(self, item: object) -> bool:
        return any(w == item for w in self)


def lazily(kind: str, n: int, seed: int, *, arrival: str = "poisson",
           rate: float = DEFAULT_RATE, max_model_len: int = DEFAULT_MAX_MODEL_LEN,
           priorities: Sequence[float] | None = None, max_tokens: int | None = None,
           prompt_range: tuple[int, int] | None = None,
           output_range: tuple[int, int] | None = None,
           system_prompts: Sequence[int] | None = None, skew: float | None = None,
           turns: float | None = None, think_steps: float | None = None) -> Generated:
    """`generate`'s workload, its arguments checked now, its requests made as they are
    iterated, in arrival order, each checked and its prefix resolved as
    kvsched.workload.validate does (a generated workload is valid by construction)."""
    if kind not in GENERATORS:
        raise ValueError(f"unknown workload kind {kind!r}; kinds are {', '.join(GENERATORS)}")
    if arrival not in ARRIVALS:
        raise ValueError(f"unknown arrival process {arrival!r}; processes are "
                         f"{', '.join(ARRIVALS)}")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"number of requests must be at least 1, got {n!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if (not isinstance(rate, (int, float)) or isinstance(rate, bool)
            or not math.isfinite(rate) or rate <= 0):
        raise ValueError(f"rate must be a positive number of arrivals per step, got {rate!r}")
    if not isinstance(max_model_len, int) or isinstance(max_model_len, bool) \
            or max_model_len < 2:
        raise ValueError(f"max_model_len must be at least 2 (one prompt and one output "
                         f"token), got {max_model_len!r}")
    if max_tokens is not None and (not isinstance(max_tokens, int)
                                   or isinstance(max_tokens, bool) or max_tokens < 1):
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens!r}")
    if system_prompts is None:
        system_prompts = DEFAULT_SYSTEM_PROMPTS if kind == SHARED_PROMPTS else ()
    if turns is None:
        turns = DEFAULT_TURNS if kind == CONVERSATIONS else 1.0
    shared = _system_prompts(system_prompts, max_model_len)
    turns = _number("turns", turns, 1, "a mean number of turns >= 1")
    if skew is not None and not shared:
        raise ValueError("skew weighs the choice of a system prompt: it needs system prompts")
    if think_steps is not None and turns == 1:
        raise ValueError("think_steps is the pause between turns: it needs turns > 1")
    skew = _number("skew", DEFAULT_SKEW if skew is None else skew, 0,
                   "a finite number >= 0")
    think_steps = _number("think_steps", DEFAULT_THINK_STEPS if think_steps is None
                          else think_steps, 0, "a finite number of steps >= 0")
    base = kind if kind in KINDS else "sharegpt"
    lengths(base, n, seed, prompt_range, output_range)  # checks the ranges
    _priority_draw(priorities, seed)  # checks the weights
    return Generated(partial(_requests, base, n, seed, arrival, float(rate) / turns,
                             max_model_len, priorities, max_tokens, prompt_range,
                             output_range, shared, skew, turns, think_steps), n)


def _requests(kind: str, n: int, seed: int, arrival: str, start_rate: float,
              max_model_len: int, priorities: Sequence[float] | None,
              max_tokens: int | None, prompt_range: tuple[int, int] | None,
              output_range: tuple[int, int] | None, shared: tuple[int, ...], skew: float,
              turns: float, think_steps: float) -> Iterator[WorkItem]:
    """`lazily`'s requests of the length kind `kind`, in arrival order: a conversation's
    later turns wait in a heap until no request made after them can arrive sooner (every
    one arrives no sooner than the start of the conversation being made)."""
    pairs = lengths(kind, n, seed, prompt_range, output_range)
    starts = arrival_steps(arrival, n, start_rate, seed)
    priority = _priority_draw(priorities, seed)
    slack = _max_tokens_slack(seed)
    system_prompt = _system_prompt_draw(shared, skew, seed)
    goes_on = _stream(seed, "turns").random
    think = _stream(seed, "think").expovariate
    last_prompt = max_model_len - 1
    waiting: list[tuple[int, int, WorkItem]] = []  # (arrival, made as number, request)
    prev: WorkItem | None = None  # the last turn of the current conversation
    conversation = turn = start = 0
    for made, (prompt, output) in enumerate(pairs):
        prefix: tuple[str, int] | None = None
        if prev is not None and turns > 1 and goes_on() >= 1 / turns \
                and prev.prompt_len + prev.output_len + prompt <= last_prompt:
            whole = prev.prompt_len + prev.output_len
            prompt += whole
            prefix = (prev.id, whole)
            pause = int(think(1 / think_steps)) if think_steps > 0 else 0
            step, level, turn = prev.arrival + prev.output_len + pause, prev.priority, turn + 1
        else:
            step, level, turn = next(starts), priority(), 0
            start = step
            conversation += 1 if prev is not None else 0
            prefix = system_prompt()
            if prefix is not None:
                prompt += prefix[1]
            if prompt > last_prompt:
                prompt = last_prompt
        room = max_model_len - prompt
        asked = output + slack(output) if max_tokens is None else max_tokens
        cap = asked if asked < room else room
        rid = f"c{conversation}-t{turn}" if turns > 1 else f"r{made}"
        # The source as validate resolves it: the previous turn, or a system prompt.
        source = None if prefix is None else Source(prev if turn else None)
        prev = WorkItem(rid, step, prompt, output if output < cap else cap, cap, level,
                        prefix=prefix, source=source)
        problems = prev.problems()
        if problems:
            raise WorkloadError(problems[0])
        heappush(waiting, (step, made, prev))
        while waiting and waiting[0][0] <= start:
            yield heappop(waiting)[2]
    while waiting:
        yield heappop(waiting)[2]


def _max_tokens_slack(seed: int) -> Callable[[int], int]:
    rng = _stream(seed, "max_tokens")
    draw = rng.random

    def slack(output: int) -> int:
        u = draw()
        if u < CAPPED_FRACTION:
            return 0
        # u is uniform on [CAPPED_FRACTION, 1): rescale it to a slack in 1..output.
        return 1 + int((u - CAPPED_FRACTION) / (1 - CAPPED_FRACTION) * output)

    return slack
