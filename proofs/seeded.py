"""The model checker against the seeded-bug schedulers (kvsched.testing.seeded_bugs).

Each bug runs with its own profile's knobs, so it is explored only in the scopes of
that profile's knobs, with prefix caching as its own config has it (off: the bugs are
planted in the plain model), smallest family first, until one finds it; the bugs that are
legal under the spec but break their profile (level PROFILE) run with the reference in
lockstep, and a bug expected to break a SHOULD invariant judged on one step
(needed-preemption) makes that invariant a finding. This module imports the tool
(kvsched.testing.seeded_bugs), so only the runner uses it; model_check.py itself stays
on kvsched.spec and kvsched.reference.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsched.reference.scheduler import ReferenceScheduler
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Config
from kvsched.spec.profiles import PROFILES
from proofs.model_check import PER_STEP_SHOULD, Result, run_scopes
from proofs.scopes import Scope


@dataclass(frozen=True)
class SeededFactory:
    """Builds the named seeded bug for a scope's config (picklable, for worker processes)."""

    name: str

    def __call__(self, config: Config, knobs: Knobs) -> ReferenceScheduler:
        from kvsched.testing.seeded_bugs import SEEDED_BUGS

        scheduler = SEEDED_BUGS[self.name].factory(config)
        assert isinstance(scheduler, ReferenceScheduler), "the explorer encodes reference state"
        return scheduler


@dataclass(frozen=True)
class Hunt:
    """Which scope found a bug, and what it found."""

    bug: str
    expected: str
    level: str
    scopes_tried: int
    result: Result | None
    family: str = ""

    @property
    def found(self) -> bool:
        return self.result is not None and self.result.finding is not None

    @property
    def named(self) -> tuple[str, ...]:
        if self.result is None or self.result.finding is None:
            return ()
        f = self.result.finding
        return tuple(dict.fromkeys((f.kind, *f.ids)))


def hunt(name: str, scopes: list[Scope], jobs: int = 1) -> Hunt:
    """Explore `name` in the scopes of its profile's knobs until one finds it."""
    from kvsched.testing.seeded_bugs import SEEDED_BUGS

    bug = SEEDED_BUGS[name]
    knobs = PROFILES[bug.profile].knobs
    # A bug is planted in the plain model (its faulty allocators know no prefix cache):
    # hunted where its own config has prefix caching or not.
    mine = [s for s in scopes if s.knobs == knobs
            and s.config.prefix_caching == bug.config.prefix_caching]
    tried = 0
    # A bug expected to break a per-step SHOULD invariant is a finding when it does.
    should = (bug.expected,) if bug.expected in PER_STEP_SHOULD else ()
    results = run_scopes(mine, SeededFactory(name), twin=bug.level == "PROFILE", jobs=jobs,
                         should=should)
    for result in results:
        tried += 1
        if result.finding is not None:
            results.close()  # stops the worker processes still exploring
            family = next(s.family for s in mine if s.name == result.scope)
            return Hunt(name, bug.expected, bug.level, tried, result, family)
    return Hunt(name, bug.expected, bug.level, tried, None)


# Invariants a seeded bug may break that the model checker does not judge, with why.
NOT_HUNTED = {"starvation": "a wait of more than K steps (100) while later requests are "
                            "admitted: longer than any run the small scopes explore"}


def seeded_bug_names() -> list[str]:
    """The seeded bugs to hunt: those whose invariant the model checker judges."""
    from kvsched.testing.seeded_bugs import SEEDED_BUGS

    return [name for name, bug in SEEDED_BUGS.items() if bug.expected not in NOT_HUNTED]
