"""`kvsched fuzz module:factory`: hypothesis-drawn workloads against a user's scheduler.

Each example draws a config (kvsched.strategies.configs(), with vLLM v1's lazy
allocation and watermark scope; under a profile, one its step kind honours, grown to one
its engine serves; and the fields the user pinned replaced) and a
workload for it (kvsched.strategies.workloads(config)), builds the scheduler with the
user's factory, runs it through the simulation loop and checks
every step with the spec's checker: MUST invariants always, the first divergence from
a reference profile with `profile`, SHOULD ones too with `strict`. A scheduler that
raises as it runs is a finding as well (a factory that raises is the caller's bad input,
FactoryRaised: there is no scheduler to blame, nor a workload to blame it on).
Hypothesis then shrinks the first failing example to a minimal one (fewest requests,
shortest prompts, smallest cache), which the caller writes as a workload file beside its
config.

Every example has limits (`RunLimits`), and reaching one is a finding, never a silent
cut: a run stuck for K steps (`progress`: nothing changes while work waits), a run still
going at its step bound (`progress`: four times the tokens the workload can need, so it
can only be going round in circles), and a run, or a factory, still going at its
wall-clock limit (`time-limit`; such an example is not shrunk, as each try would cost
the whole limit again).

Runs are deterministic for a seed: no example database, the seed drives the draws. A
run writes no file: Hypothesis's own storage (its cache of the constants in local
modules, `.hypothesis/` in the working directory by default) goes to a temporary
directory, removed at the end (`private_storage`).

A campaign is a sequence of shards (`plan`): independent searches of at most
`shard_examples` examples each, shard 0 with the campaign's seed and the others with
seeds derived from it (`shard_seed`), so that a campaign of one shard is exactly one
search with that seed, and each shard can be run alone. The campaign runs its shards in
order and stops after the first one that finds a failure; its finding is that shard's.
On Ray the shards run side by side (`fuzz_shard` is the piece each worker runs); the
outcome is the same: the same shards run, each drawing the same examples, and the same
first finding.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass, fields, replace
from typing import Any

from kvsched.deadline import OutOfTime, deadline
from kvsched.loading import FactoryError
from kvsched.simulate import run, step_bound, unending
from kvsched.spec.interface import NoAborts, Scheduler, not_aborting
from kvsched.spec.model import Allocation, Config, WatermarkScope
from kvsched.spec.profiles import get_profile
from kvsched.spec.should import DEFAULT_STALL_STEPS, DEFAULT_STARVE_STEPS, Stalled
from kvsched.spec.violation import SHOULD, Violation
from kvsched.workload import WorkItem

CRASH = "crash"  # the finding's invariant when the scheduler raised
TIME_LIMIT = "time-limit"  # the finding's invariant when an example ran out of time
DEFAULT_SHARD_EXAMPLES = 100  # examples per shard of a campaign
# An example's wall-clock limit: drawn workloads are small, and the reference runs one
# in milliseconds; a scheduler a thousand times slower still fits.
DEFAULT_EXAMPLE_SECONDS = 10.0


# The config fields each example draws (kvsched.strategies.configs) unless pinned. The
# others are the engine's rules, not its load: vLLM v1's allocation and watermark scope,
# and Config's defaults.
DRAWN_FIELDS = frozenset({"block_size", "num_gpu_blocks", "num_cpu_blocks",
                          "max_num_batched_tokens", "max_num_seqs", "max_model_len",
                          "chunked_prefill", "long_prefill_token_threshold", "policy",
                          "preemption", "watermark_blocks"})
ALLOCATION: Allocation = "lazy"
WATERMARK_SCOPE: WatermarkScope = "running"


def unpinned(name: str) -> str:
    """What an example takes for config field `name` when it is not pinned: "drawn per
    example", or the value every example has."""
    if name in DRAWN_FIELDS:
        return "drawn per example"
    fixed = {"allocation": ALLOCATION, "watermark_scope": WATERMARK_SCOPE}
    value = fixed.get(name, next(f.default for f in fields(Config) if f.name == name))
    assert value is not MISSING
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class RunLimits:
    """The limits of each example's run: progress's K, and the wall-clock seconds of the
    factory and the run together (None: none); and starvation's K, which its check
    judges with."""

    stall_steps: int = DEFAULT_STALL_STEPS
    seconds: float | None = DEFAULT_EXAMPLE_SECONDS
    starve_steps: int = DEFAULT_STARVE_STEPS


class FuzzUnavailable(RuntimeError):
    """hypothesis is not installed."""


class FactoryRaised(FactoryError):
    """The factory raised instead of building a scheduler; str() is one line."""


class NoValidConfig(ValueError):
    """The pinned config fields leave no well-formed config to draw."""


@dataclass(frozen=True)
class Finding:
    """A failing example: the config, the workload, and what broke first."""

    config: Config
    workload: tuple[WorkItem, ...]
    invariant: str  # an invariant id, or CRASH
    message: str  # one line
    violations: tuple[Violation, ...]
    steps: int

    def as_dict(self) -> dict[str, Any]:
        return {"invariant": self.invariant, "message": self.message, "steps": self.steps,
                "config": asdict(self.config),
                "violations": [v.as_dict() for v in self.violations]}


@dataclass(frozen=True)
class FuzzResult:
    finding: Finding | None
    runs: int  # examples run, shrinking included


def check_case(make: Callable[[Config], Scheduler], config: Config,
               workload: tuple[WorkItem, ...], *, profile: str | None = None,
               strict: bool = False, limits: RunLimits = RunLimits()) -> Finding | None:
    """Run one example; the first failing violation (or crash, or limit reached), if any.

    A factory that cannot build a scheduler for `config` (it raises: FactoryRaised, or
    returns something without the interface) is the caller's bad input: a FactoryError,
    which propagates.
    Any other exception, raised by the scheduler as it runs, is a finding.
    """
    from kvsched.conformance import checker as new_checker  # loads the reference

    steps = 0
    ended = 0
    bound = step_bound(config, workload, limits.stall_steps)
    checker = new_checker(config, profile=profile, strict=strict,
                          stall_steps=limits.stall_steps, starve_steps=limits.starve_steps)
    made = False
    stuck: Violation | None = None
    try:
        with deadline(limits.seconds) as clock:
            scheduler = make(config)
            made = True
            try:
                for rec in run(scheduler, workload, max_steps=bound,
                               stall_steps=limits.stall_steps):
                    steps += 1
                    checker.step(rec)
                    ended += rec.num_ended
                    clock.check()
            except Stalled as e:
                stuck = e.violation
        report = checker.end(ended == len(workload))
    except FactoryError:
        raise
    except NoAborts as e:  # the workload aborts, the scheduler cannot: no finding, bad input
        raise FactoryError(str(e)) from None
    except OutOfTime as e:
        who = f"the run {e} (at step {steps})" if made else f"the factory {e}"
        return Finding(config, workload, TIME_LIMIT, who, (), steps)
    except Exception as e:
        text = (str(e).strip().splitlines() or [""])[0]
        if not made:  # no scheduler to blame, nor a workload that made it fail
            said = f"{type(e).__name__}: {text}" if text else type(e).__name__
            raise FactoryRaised(f"the factory raised {said}; it built no scheduler for "
                                "the config "
                                + ", ".join(f"{k}={v}" for k, v in asdict(config).items())
                                + " (pin the config fields it needs)") from None
        return Finding(config, workload, CRASH, f"the scheduler raised {type(e).__name__} "
                       f"at step {steps}: {text}", (), steps)
    # A run that cannot end fails, strict or not, as `progress` (its trace's ends-stuck
    # says the same at its last step).
    failing = [v for v in report.violations if (v.level != SHOULD or strict)
               and not (stuck is not None and v.invariant == "ends-stuck")]
    never = unending(report.violations, stuck, steps, bound, len(workload) - ended)
    if never is not None and never not in failing:
        failing.append(never)
    if not failing:
        return None
    first = failing[0]
    where = f", {first.request}" if first.request else ""
    numbers = f" ({first.numbers()})" if first.numbers() else ""
    return Finding(config, workload, first.invariant,
                   f"{first.level} {first.invariant} at step {first.step}{where}{numbers}: "
                   f"{first.message}", tuple(failing), steps)


@contextmanager
def private_storage() -> Iterator[None]:
    """Hypothesis's storage directory in a temporary directory, removed after, and the
    one before back: a run leaves nothing in the working directory."""
    import tempfile

    from hypothesis import configuration

    # Hypothesis offers a setter only; its module global holds the directory set before.
    before = vars(configuration).get("__hypothesis_home_directory")
    with tempfile.TemporaryDirectory(prefix="kvsched-fuzz-") as home:
        configuration.set_hypothesis_home_dir(home)
        try:
            yield
        finally:
            configuration.set_hypothesis_home_dir(before)


def models_aborts(make: Callable[[Config], Scheduler], probe: Config,
                  seconds: float | None) -> bool:
    """Whether the factory's schedulers model a client's aborts (spec.interface.Aborting),
    as one built for `probe` (a config it serves) within an example's `seconds` shows:
    workloads are drawn with aborts only for one that does (LMDeploy's step has none). A
    factory that builds nothing for that config in time is taken to: each example's run
    says otherwise (NoAborts, bad input), and blames a factory that hangs."""
    try:
        with deadline(seconds):
            return not_aborting(make(probe), "r0") is None
    except Exception:  # OutOfTime too
        return True


class _OutOfTime(Exception):
    """An example ran out of time: the search stops there, unshrunk."""


def fuzz(make: Callable[[Config], Scheduler], *, examples: int = 200, seed: int = 0,
         pinned: Mapping[str, Any] | None = None, profile: str | None = None,
         strict: bool = False, limits: RunLimits = RunLimits()) -> FuzzResult:
    """Draw up to `examples` cases; shrink the first failing one to a minimal one.

    pre: examples >= 1
    """
    try:
        from hypothesis import HealthCheck, Phase, Verbosity, assume, find, settings
        from hypothesis import strategies as st
        from hypothesis.errors import NoSuchExample, Unsatisfiable

        from kvsched.strategies import configs, servable, workloads
    except ImportError:
        raise FuzzUnavailable("kvsched fuzz needs hypothesis: "
                              "pip install 'kvsched[hypothesis]'") from None
    fixed = dict(pinned or {})
    # A profile's step kind honours only some configs: draw those (kvsched.spec.step_kinds),
    # grown to ones its engine starts with and serves (strategies.servable).
    kind = None if profile is None else get_profile(profile).scheduler
    chunked = fixed.get("chunked_prefill")
    if chunked is None and fixed.get("long_prefill_token_threshold", 0) > 0:
        chunked = True  # a threshold needs chunked prefill (Config.problems)

    aborts = models_aborts(make, Config() if profile is None or kind is None else servable(
        get_profile(profile).configure(Config()), kind), limits.seconds)

    @st.composite
    def cases(draw: st.DrawFn) -> tuple[Config, tuple[WorkItem, ...]]:
        # Allocation and watermark scope are the engine's rules, not its load: an engine
        # that follows others says so by pinning them.
        drawn = draw(configs(chunked_prefill=chunked, allocation=ALLOCATION,
                             watermark_scope=WATERMARK_SCOPE, kind=kind))
        config = replace(drawn if kind is None else servable(drawn, kind), **fixed)
        assume(not config.problems())
        return config, tuple(draw(workloads(config, shared=config.prefix_caching,
                                            aborts=aborts)))

    runs = 0
    # The failing cases as they were checked (the minimal one is among them), so that a
    # scheduler that is not deterministic still reports what it did.
    found: dict[tuple[Config, tuple[WorkItem, ...]], Finding] = {}

    def fails(case: tuple[Config, tuple[WorkItem, ...]]) -> bool:
        nonlocal runs
        runs += 1
        finding = check_case(make, *case, profile=profile, strict=strict, limits=limits)
        if finding is not None:
            found[case] = finding
            if finding.invariant == TIME_LIMIT:
                raise _OutOfTime
        return finding is not None

    chosen = settings(max_examples=examples, database=None, deadline=None,
                      derandomize=False, verbosity=Verbosity.quiet,
                      phases=(Phase.generate, Phase.shrink),
                      suppress_health_check=list(HealthCheck))
    try:
        with private_storage():
            config, workload = find(cases(), fails, settings=chosen,
                                    random=random.Random(seed))
    except NoSuchExample:
        return FuzzResult(None, runs)
    except _OutOfTime:
        return FuzzResult(next(f for f in found.values() if f.invariant == TIME_LIMIT), runs)
    except Unsatisfiable:
        raise NoValidConfig("the pinned config fields leave no well-formed config: "
                            + ", ".join(f"{k}={v}" for k, v in fixed.items())) from None
    return FuzzResult(found[config, workload], runs)


def config_flags(config: Config) -> list[str]:
    """The `kvsched simulate`/`diff` options that give exactly `config`."""
    out: list[str] = []
    for name, value in asdict(config).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + name.replace("_", "-"))
        else:
            out += [flag, str(value)]
    return out


@dataclass(frozen=True)
class Shard:
    """One independent part of a campaign: a search of its own, with its own seed."""

    index: int
    seed: int
    examples: int

    def as_dict(self) -> dict[str, Any]:
        return {"shard": self.index, "seed": self.seed, "examples": self.examples}


def shard_seed(seed: int, index: int) -> int:
    """Shard 0 draws with the campaign's seed; the others with 32-bit seeds derived from
    it and their index (campaigns of nearby seeds share no shard)."""
    if index == 0:
        return seed
    import hashlib  # here: `kvsched simulate`, which imports this module's defaults, never

    digest = hashlib.blake2b(f"kvsched fuzz {seed} {index}".encode(), digest_size=4)
    return int.from_bytes(digest.digest(), "big")


def plan(examples: int, seed: int, shard_examples: int = DEFAULT_SHARD_EXAMPLES
         ) -> list[Shard]:
    """The campaign's shards: `examples` split into shards of `shard_examples` (the last
    one takes the rest).

    pre: examples >= 1 and shard_examples >= 1
    post: sum(s.examples for s in __return__) == examples
    """
    count = -(-examples // shard_examples)
    return [Shard(i, shard_seed(seed, i), min(shard_examples, examples - i * shard_examples))
            for i in range(count)]


def fuzz_shard(factory: str, shard: Shard, pinned: Mapping[str, Any] | None = None,
               profile: str | None = None, strict: bool = False,
               limits: RunLimits = RunLimits()) -> FuzzResult:
    """One shard against the scheduler `factory` names (module:factory), loaded where the
    shard runs (on a Ray worker: from that worker's sys.path)."""
    from kvsched.loading import build, load_factory

    make = load_factory(factory)

    def scheduler(config: Config) -> Scheduler:
        return build(make, config, factory)

    try:
        return fuzz(scheduler, examples=shard.examples, seed=shard.seed, pinned=pinned,
                    profile=profile, strict=strict, limits=limits)
    except FactoryRaised as e:
        raise FactoryRaised(f"{factory}: {e}") from None


@dataclass(frozen=True)
class ShardOutcome:
    """A shard's result, or why it has none (its Ray task was lost)."""

    shard: Shard
    result: FuzzResult | None
    lost: str | None = None

    def as_dict(self) -> dict[str, Any]:
        finding = self.result.finding if self.result is not None else None
        return self.shard.as_dict() | {
            "runs": self.result.runs if self.result is not None else None,
            "finding": None if finding is None else {"invariant": finding.invariant,
                                                     "message": finding.message},
            "lost": self.lost}


@dataclass(frozen=True)
class Campaign:
    """The shards planned, and the outcomes of those run: in order, up to the first
    that found a failure."""

    shards: tuple[Shard, ...]
    outcomes: tuple[ShardOutcome, ...]

    @property
    def found(self) -> ShardOutcome | None:
        """The first shard with a finding."""
        return next((o for o in self.outcomes
                     if o.result is not None and o.result.finding is not None), None)

    @property
    def finding(self) -> Finding | None:
        found = self.found
        return found.result.finding if found is not None and found.result else None

    @property
    def runs(self) -> int:
        """Examples run over the shards, shrinking included."""
        return sum(o.result.runs for o in self.outcomes if o.result is not None)

    @property
    def examples(self) -> int:
        return sum(s.examples for s in self.shards)

    def lost(self) -> list[ShardOutcome]:
        return [o for o in self.outcomes if o.lost is not None]

    def not_run(self) -> Sequence[Shard]:
        """The shards after the first finding."""
        return self.shards[len(self.outcomes):]
