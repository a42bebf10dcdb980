"""`kvsched fuzz module:factory`: hypothesis-drawn workloads against a user's scheduler.

Each example draws a config (kvsched.strategies.configs(), with vLLM v1's lazy
allocation and watermark scope, and the fields the user pinned replaced) and a
workload for it (kvsched.strategies.workloads(config)), builds the scheduler with the
user's factory, runs it through the simulation loop and checks
every step with the spec's checker: MUST invariants always, the first divergence from
a reference profile with `profile`, SHOULD ones too with `strict`. A scheduler that
raises is a finding as well. Hypothesis then shrinks the first failing example to a
minimal one (fewest requests, shortest prompts, smallest cache), which the caller
writes as a workload file beside its config.

Runs are deterministic for a seed: no example database, the seed drives the draws.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from kvsched.conformance import checker as new_checker
from kvsched.loading import FactoryError
from kvsched.simulate import run
from kvsched.spec.interface import Scheduler
from kvsched.spec.model import Config
from kvsched.spec.trace import TraceError
from kvsched.spec.violation import SHOULD, Violation
from kvsched.workload import WorkItem

CRASH = "crash"  # the finding's invariant when the scheduler raised


class FuzzUnavailable(RuntimeError):
    """hypothesis is not installed."""


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


def step_bound(config: Config, workload: tuple[WorkItem, ...]) -> int:
    """Steps after which a run is cut (an incomplete trace: no completion check). Four
    times the tokens the workload can ever need leaves room for recomputes; a scheduler
    that stops making progress is cut off there instead of looping forever."""
    tokens = sum(min(w.prompt_len + w.max_tokens, config.max_model_len) for w in workload)
    last = max((w.arrival for w in workload), default=0)
    return last + 4 * tokens + 50


def check_case(make: Callable[[Config], Scheduler], config: Config,
               workload: tuple[WorkItem, ...], *, profile: str | None = None,
               strict: bool = False) -> Finding | None:
    """Run one example; the first failing violation (or crash), if any.

    A FactoryError (the factory returned something without the interface) is the
    caller's bad input and propagates; any other exception is a finding.
    """
    steps = 0
    checker = new_checker(config, profile=profile, strict=strict)
    try:
        scheduler = make(config)
        ended = 0
        for rec in run(scheduler, workload, max_steps=step_bound(config, workload)):
            steps += 1
            checker.step(rec)
            ended += rec.num_ended
        report = checker.end(ended == len(workload))
    except FactoryError:
        raise
    except TraceError as e:
        v = Violation("one-state", checker.step_no, e.message)
        return Finding(config, workload, v.invariant, f"step {v.step}: {e.message}", (v,),
                       steps)
    except Exception as e:
        text = (str(e).strip().splitlines() or [""])[0]
        return Finding(config, workload, CRASH, f"the scheduler raised {type(e).__name__} "
                       f"at step {steps}: {text}", (), steps)
    failing = tuple(v for v in report.violations if v.level != SHOULD or strict)
    if not failing:
        return None
    first = failing[0]
    where = f", {first.request}" if first.request else ""
    numbers = f" ({first.numbers()})" if first.numbers() else ""
    return Finding(config, workload, first.invariant,
                   f"{first.level} {first.invariant} at step {first.step}{where}{numbers}: "
                   f"{first.message}", failing, steps)


def fuzz(make: Callable[[Config], Scheduler], *, examples: int = 200, seed: int = 0,
         pinned: Mapping[str, Any] | None = None, profile: str | None = None,
         strict: bool = False) -> FuzzResult:
    """Draw up to `examples` cases; shrink the first failing one to a minimal one.

    pre: examples >= 1
    """
    try:
        from hypothesis import HealthCheck, Phase, Verbosity, assume, find, settings
        from hypothesis import strategies as st
        from hypothesis.errors import NoSuchExample, Unsatisfiable

        from kvsched.strategies import configs, workloads
    except ImportError:
        raise FuzzUnavailable("kvsched fuzz needs hypothesis: "
                              "pip install 'kvsched[hypothesis]'") from None
    fixed = dict(pinned or {})
    chunked = fixed.get("chunked_prefill")
    if chunked is None and fixed.get("long_prefill_token_threshold", 0) > 0:
        chunked = True  # a threshold needs chunked prefill (Config.problems)

    @st.composite
    def cases(draw: st.DrawFn) -> tuple[Config, tuple[WorkItem, ...]]:
        # Allocation and watermark scope are the engine's rules, not its load: an engine
        # that follows others says so by pinning them.
        config = replace(draw(configs(chunked_prefill=chunked, allocation="lazy",
                                      watermark_scope="running")), **fixed)
        assume(not config.problems())
        return config, tuple(draw(workloads(config)))

    runs = 0
    # The failing cases as they were checked (the minimal one is among them), so that a
    # scheduler that is not deterministic still reports what it did.
    found: dict[tuple[Config, tuple[WorkItem, ...]], Finding] = {}

    def fails(case: tuple[Config, tuple[WorkItem, ...]]) -> bool:
        nonlocal runs
        runs += 1
        finding = check_case(make, *case, profile=profile, strict=strict)
        if finding is not None:
            found[case] = finding
        return finding is not None

    chosen = settings(max_examples=examples, database=None, deadline=None,
                      derandomize=False, verbosity=Verbosity.quiet,
                      phases=(Phase.generate, Phase.shrink),
                      suppress_health_check=list(HealthCheck))
    try:
        config, workload = find(cases(), fails, settings=chosen,
                                random=random.Random(seed))
    except NoSuchExample:
        return FuzzResult(None, runs)
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
