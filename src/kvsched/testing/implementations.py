"""One factory per scheduler implementation, so that one test suite runs on all of them.

The reference is the truth; the optimized scheduler must pass the reference's whole
suite (PEP 399's pattern, as CPython's `_pydecimal` beside `_decimal`). A test takes a
`SchedulerFactory` and builds every scheduler through it, never naming an
implementation; tests/conftest.py parametrizes the `scheduler_factory` fixture over
IMPLEMENTATIONS. The factory counts what it built, so a test that never used it (and
so tested nothing on that implementation) is caught.
"""

from __future__ import annotations

from kvsched.reference import ReferenceScheduler
from kvsched.spec.interface import InspectableScheduler
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Config
from kvsched.spec.profiles import Profile, get_profile

IMPLEMENTATIONS: tuple[str, ...] = ("reference", "compiled", "optimized", "optimized-cuda")


class SchedulerFactory:
    """Builds schedulers of one implementation: "reference", "compiled" (the compiled
    scheduler), "optimized" (torch on cpu) or "optimized-cuda"."""

    def __init__(self, implementation: str) -> None:
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation must be one of {', '.join(IMPLEMENTATIONS)}, "
                             f"got {implementation!r}")
        self.implementation = implementation
        self.built = 0

    def __repr__(self) -> str:
        return f"SchedulerFactory({self.implementation!r})"

    def __call__(self, config: Config, knobs: Knobs | None = None) -> InspectableScheduler:
        """A new scheduler on `config` with `knobs` (None: vLLM v1's)."""
        scheduler: InspectableScheduler
        if self.implementation == "reference":
            scheduler = ReferenceScheduler(config, knobs)
        elif self.implementation == "compiled":
            from kvsched.optimized.compiled import CompiledScheduler

            scheduler = CompiledScheduler(config, knobs)
        else:
            from kvsched.optimized import TorchScheduler

            device = "cuda" if self.implementation == "optimized-cuda" else "cpu"
            scheduler = TorchScheduler(config, knobs, device=device)
        self.built += 1
        return scheduler

    def profile(self, profile: Profile | str, config: Config) -> InspectableScheduler:
        """A new scheduler with `profile`'s knobs (a Profile or its name) on `config` as
        given (configure it with `profile.configure` first for the profile's defaults)."""
        chosen = get_profile(profile) if isinstance(profile, str) else profile
        return self(config, chosen.knobs)
