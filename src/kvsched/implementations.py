"""Which implementation runs: the one place the tool picks a scheduler and a checker.

A scheduler is the reference (kvsched.reference: vLLM v1's step, or V0's for a profile
whose `scheduler` is "v0"), the compiled one (kvsched.optimized.compiled, the CPU path)
or the torch one (kvsched.optimized.TorchScheduler, on cpu or cuda); where they
implement a run they make the same decisions. A trace checker is the spec's
(kvsched.conformance.checker) or the vectorized one (kvsched.optimized.checker), with
the same verdicts. `auto` takes the fast one where it is installed and implements the
run, else the reference (the spec's checker); when the fast one is not installed it says
so, once, in one line on standard error. A named one that cannot run here is
`Unavailable`, with the one-line reason in the command line's words.

`kvsched simulate`, `check` and `diff`, the profile replay (kvsched.conformance) and the
tests' SchedulerFactory (kvsched.testing) all get their implementations here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import IO, TYPE_CHECKING

from kvsched.optimized.built import missing
from kvsched.reference import (
    LMDeployScheduler,
    ReferenceScheduler,
    SGLangScheduler,
    scheduler_for,
)
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Config
from kvsched.spec.profiles import SCHEDULER_ENGINES, Profile, SchedulerKind, get_profile
from kvsched.spec.violation import DEFAULT_STARVE_STEPS

if TYPE_CHECKING:
    from kvsched.spec.checker import Report
    from kvsched.spec.interface import InspectableScheduler
    from kvsched.spec.replay import ProfileReplay
    from kvsched.spec.trace import Header

__all__ = ["CHECKERS", "SCHEDULERS", "SCHEDULER_ALIASES", "Unavailable", "build_scheduler",
           "check_trace", "chosen_checker", "new_scheduler", "profile_scheduler",
           "require_checker"]

# The schedulers, fastest first (the same decisions).
SCHEDULERS: tuple[str, ...] = ("compiled", "reference", "torch")
# Former names of a scheduler, still accepted with a note.
SCHEDULER_ALIASES = {"optimized": "torch"}
CHECKERS: tuple[str, ...] = ("spec", "vectorized")

# The notes this process has given (each is told once, not per run or per trace).
_noted: set[str] = set()


class Unavailable(Exception):
    """The implementation asked for cannot run here, or does not implement the run."""


def note(message: str) -> None:
    """`message` as one line on standard error, the first time it is given."""
    if message not in _noted:
        _noted.add(message)
        sys.stderr.write(f"kvsched: note: {message}\n")


# -- schedulers ----------------------------------------------------------------------

def profile_scheduler(profile: Profile | str, config: Config
                      ) -> ReferenceScheduler | SGLangScheduler | LMDeployScheduler:
    """The scheduler that replays `profile` (a Profile or its name) on `config` as given:
    the reference of the profile's step, with its knobs."""
    chosen = get_profile(profile) if isinstance(profile, str) else profile
    return scheduler_for(config, chosen.knobs, chosen.scheduler)


def build_scheduler(implementation: str, config: Config, knobs: Knobs | None = None,
                    kind: SchedulerKind = "v1", device: str = "cpu") -> InspectableScheduler:
    """A new scheduler of `implementation` (reference, compiled, torch; torch on
    `device`) on `config` with `knobs` (None: vLLM v1's) and the step of `kind` (a
    profile's `scheduler`). ImportError where it is not installed; ValueError where it
    does not implement `kind`, `knobs` or `config`."""
    if implementation == "reference":
        return scheduler_for(config, knobs, kind)
    if implementation not in SCHEDULERS:
        raise ValueError(f"scheduler must be one of {', '.join(SCHEDULERS)}, "
                         f"got {implementation!r}")
    if kind != "v1":
        raise ValueError(f"the {implementation} scheduler does not implement "
                         f"{SCHEDULER_ENGINES[kind]}'s scheduler: use the reference "
                         "scheduler")
    if implementation == "compiled":
        from kvsched.optimized.compiled import CompiledScheduler

        return CompiledScheduler(config, knobs)
    from kvsched.optimized import TorchScheduler

    return TorchScheduler(config, knobs, device=device)


def chosen_scheduler(choice: str, config: Config, knobs: Knobs, kind: SchedulerKind = "v1",
                   device: str = "cpu") -> str:
    """The scheduler `choice` names (a former name as today's), or for "auto" the
    fastest installed one that implements the run: the torch one on `device` cuda;
    else the compiled one, unless the step (`kind`), `knobs` or `config` are beyond it
    (then the reference) or it was not built (then the reference, with a note)."""
    choice = SCHEDULER_ALIASES.get(choice, choice)
    if choice != "auto":
        return choice
    if device == "cuda":
        return "torch"
    if kind != "v1":
        return "reference"
    if missing("compiled") is not None:
        note("the compiled scheduler is not built here (kvsched was installed without a "
             "C++ compiler); running the reference scheduler")
        return "reference"
    try:
        build_scheduler("compiled", config, knobs)
    except ValueError:  # a knob of another step kind, or a pool larger than its free lists take
        return "reference"
    return "compiled"


def new_scheduler(choice: str, implementation: str, config: Config, knobs: Knobs,
                  kind: SchedulerKind = "v1", device: str = "cpu") -> InspectableScheduler:
    """A new scheduler of `implementation` (chosen_scheduler's answer to the user's
    `choice`, which the messages name) for a run; Unavailable, in one line, where it
    cannot run it. The note on a former name comes once the scheduler is built."""
    named = choice if choice != "auto" else implementation
    if implementation != "torch" and device != "cpu":
        raise Unavailable("--device applies to --scheduler torch only")
    if implementation != "reference" and kind != "v1":
        raise Unavailable(f"--scheduler {named}: the profile's scheduler is "
                          f"{SCHEDULER_ENGINES[kind]}'s, which only the reference "
                          "implements: use --scheduler reference")
    if implementation == "torch":
        prepare_torch(named, device)
    if implementation == "compiled" and missing("compiled") is not None:
        raise Unavailable(f"--scheduler {named}: kvsched was installed without its "
                          "compiled module (it needs a C++ compiler at install time)")
    try:
        built = build_scheduler(implementation, config, knobs, kind, device)
    except ImportError as e:  # torch imports; what the torch scheduler needs
        raise Unavailable(f"--scheduler {named} needs {e.name or 'numpy'}: pip install "
                          "'kvsched[gpu]'") from None
    except ValueError as e:
        raise Unavailable(f"--scheduler {named}: {e}") from None
    if choice in SCHEDULER_ALIASES:
        note(f"--scheduler {choice} is deprecated: it is --scheduler "
             f"{SCHEDULER_ALIASES[choice]}")
    return built


def prepare_torch(named: str, device: str) -> None:
    """Torch for a run on `device`: Unavailable where it is not installed or the
    device is absent."""
    try:
        import torch
    except ImportError:
        raise Unavailable(f"--scheduler {named} needs torch: pip install "
                          "'kvsched[gpu]'") from None
    if device == "cuda" and not torch.cuda.is_available():
        raise Unavailable("--device cuda: torch.cuda.is_available() is False on this "
                          "machine")
    torch.set_num_threads(1)  # a step's tensors are small: threads only wait on each other


# -- checkers ------------------------------------------------------------------------

def vectorized_installed() -> ImportError | None:
    """Why the fast checker cannot run here (its compiled module,
    kvsched.optimized.state, is built when kvsched is installed with a C++ compiler),
    or None."""
    return missing("state")


def chosen_checker(choice: str) -> str:
    """The checker `choice` names, or for "auto": the vectorized one, at every size and
    for every profile (which it replays with the compiled scheduler where it can, else
    with the reference, beside its compiled state), where it is installed; else a note,
    and the spec's."""
    if choice != "auto":
        return choice
    missing = vectorized_installed()
    if missing is not None:
        note("the vectorized checker needs kvsched's compiled module, which this install "
             "lacks (it is built when kvsched is installed where a C++ compiler is); "
             "checking with the spec's checker")
        return "spec"
    return "vectorized"


def note_spec_reading(what: str) -> None:
    """One note where `what` (a command that reads a trace through the fast checker's
    loop: metrics) runs on the spec's state because the compiled state is not built."""
    if vectorized_installed() is not None:
        note(f"kvsched's compiled module is not built here (it is built when kvsched is "
             f"installed where a C++ compiler is): {what} on the spec's state")


def require_checker(choice: str) -> None:
    """Unavailable where the checker `choice` names cannot run here, before any trace is
    read."""
    if choice != "vectorized":
        return
    if vectorized_installed() is not None:
        raise Unavailable("--checker vectorized needs kvsched's compiled module, which "
                          "this install lacks (it is built when kvsched is installed where "
                          "a C++ compiler is)")


def check_trace(stream: IO[bytes], kind: str, *, profile: str | None, strict: bool,
                max_preemptions: int, required: frozenset[str], stall_steps: int,
                on_header: Callable[[Header], None],
                starve_steps: int = DEFAULT_STARVE_STEPS) -> Report:
    """The report of the trace `stream` holds by the checker `kind` (spec or
    vectorized; the same verdicts), replaying `profile` when given; `on_header` sees the
    header first (and may raise). TraceError if the trace is malformed."""
    if kind == "vectorized":
        from kvsched.conformance import profile_replay
        from kvsched.optimized.checker import check_trace_vectorized

        def spec_replay(header: Header) -> ProfileReplay:
            # a profile the compiled scheduler does not replay: the reference's, as below
            assert profile is not None
            return profile_replay(header.config, profile, header.preempted_order,
                                  header.settings)

        report = check_trace_vectorized(stream, max_preemptions, profile=profile,
                                        on_header=on_header, stall_steps=stall_steps,
                                        starve_steps=starve_steps, spec_replay=spec_replay)
        report.strict, report.required = strict, required
        report.missing()  # computed from the fields just set
        return report
    from kvsched.conformance import checker
    from kvsched.spec.trace import TraceReader

    reader = TraceReader(stream)
    on_header(reader.header)
    return checker(reader.header.config, profile=profile, strict=strict,
                   max_preemptions=max_preemptions, required=required,
                   preempted_order=reader.header.preempted_order,
                   stall_steps=stall_steps, starve_steps=starve_steps,
                   settings=reader.header.settings).run_trace(reader)
