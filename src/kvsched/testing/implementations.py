"""One factory per scheduler implementation, so that one test suite runs on all of them.

The reference is the truth; the compiled and the torch schedulers must pass the
reference's whole suite (PEP 399's pattern, as CPython's `_pydecimal` beside
`_decimal`). A test takes a `SchedulerFactory` and builds every scheduler through it,
never naming an implementation; tests/conftest.py parametrizes the `scheduler_factory`
fixture over IMPLEMENTATIONS (the torch ones are skipped without torch, and on cuda
without a GPU). The factory builds through kvsched.implementations, as the
commands do, and counts what it was asked to build (a refusal is behaviour too), so
that a test that never used it (and so tested nothing on that implementation) is
caught.
"""

from __future__ import annotations

from kvsched.implementations import build_scheduler
from kvsched.spec.interface import InspectableScheduler
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Config
from kvsched.spec.profiles import Profile, SchedulerKind, get_profile

IMPLEMENTATIONS: tuple[str, ...] = ("reference", "compiled", "optimized", "optimized-cuda")
# Each one's scheduler and device (kvsched.implementations.build_scheduler).
BUILDS = {"reference": ("reference", "cpu"), "compiled": ("compiled", "cpu"),
          "optimized": ("torch", "cpu"), "optimized-cuda": ("torch", "cuda")}


def sglang_reference(config: Config) -> InspectableScheduler:
    """The reference of SGLang's step with profile sglang@0.5.23's rules on `config`, as
    `kvsched fuzz kvsched.testing.implementations:sglang_reference --profile
    sglang@0.5.23` builds it."""
    return build_scheduler("reference", config, get_profile("sglang@0.5.23").knobs,
                           "sglang", "cpu")


class SchedulerFactory:
    """Builds schedulers of one implementation: "reference", "compiled" (the compiled
    scheduler), "optimized" (the torch scheduler on cpu) or "optimized-cuda" (on
    cuda)."""

    def __init__(self, implementation: str) -> None:
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation must be one of {', '.join(IMPLEMENTATIONS)}, "
                             f"got {implementation!r}")
        self.implementation = implementation
        self.built = 0

    def __repr__(self) -> str:
        return f"SchedulerFactory({self.implementation!r})"

    @property
    def torch(self) -> bool:
        """Whether it builds the torch scheduler, which refuses the knobs of older vLLM
        v1 releases (draw with kvsched.strategies' torch=True)."""
        return BUILDS[self.implementation][0] == "torch"

    def __call__(self, config: Config, knobs: Knobs | None = None,
                 kind: SchedulerKind = "v1") -> InspectableScheduler:
        """A new scheduler on `config` with `knobs` (None: vLLM v1's) and the step of
        `kind` (a profile's `scheduler`; "v0", vLLM V0's, is the reference's alone:
        ValueError on the others)."""
        implementation, device = BUILDS[self.implementation]
        self.built += 1  # asked for: a refusal (ValueError) is tested behaviour too
        return build_scheduler(implementation, config, knobs, kind, device)

    def profile(self, profile: Profile | str, config: Config) -> InspectableScheduler:
        """A new scheduler with `profile`'s knobs (a Profile or its name) on `config` as
        given (configure it with `profile.configure` first for the profile's defaults)."""
        chosen = get_profile(profile) if isinstance(profile, str) else profile
        return self(config, chosen.knobs, chosen.scheduler)
