"""Hypothesis profiles: `ci` (bounded, used by make test) and `deep` (make fuzz-deep).

And `scheduler_factory`: every scheduler-level test runs once per implementation (the
reference, the compiled scheduler, the optimized scheduler on cpu, and on cuda where
torch sees a GPU), building
its schedulers through the factory it is given (kvsched.testing.implementations).

And `cli`: the command line run in this process (click's runner), for tests that share
this process's state with it (the Ray instance a test session started).

And the order: the modules with the longest tests are collected first, so that pytest-xdist
hands them out early rather than leaving one for last on one worker while the other idles.

And a guard for the machine: the session fails, naming the file, if /dev/null, /dev/zero
or /dev/full is not a character device when it ends (a test, run as root, wrote over
one through an output option).
"""

from __future__ import annotations

import os
import signal
import stat
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, settings

from kvsched.testing.implementations import IMPLEMENTATIONS, SchedulerFactory


def compiled_available() -> None:
    """The compiled scheduler is part of the development install: a checkout whose build
    left it out fails here (and names why) rather than skipping its tests."""
    try:
        import kvsched.optimized.compiled  # noqa: F401
    except ImportError as e:
        pytest.fail(f"kvsched.optimized.compiled is not built ({e}): pip install -e . "
                    "needs a C++ compiler and Cython")

# The scheduler_factory fixture holds no state an example could leave behind (it only
# counts what it built), so sharing it across a test's examples is sound.
QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]

settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=QUIET)
# KVSCHED_DEEP_EXAMPLES sets a longer campaign (the lockstep machine's 30-minute runs).
settings.register_profile("deep", max_examples=int(os.environ.get("KVSCHED_DEEP_EXAMPLES",
                                                                  "2000")),
                          deadline=None, suppress_health_check=QUIET)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(params=IMPLEMENTATIONS)
def scheduler_factory(request: pytest.FixtureRequest) -> Iterator[SchedulerFactory]:
    """Builds the schedulers of one implementation; the test fails if it built none
    (it would have tested nothing there)."""
    implementation: str = request.param
    if implementation == "compiled":
        compiled_available()
    elif implementation != "reference":
        torch = pytest.importorskip("torch", reason="the optimized scheduler needs torch")
        if implementation == "optimized-cuda" and not torch.cuda.is_available():
            pytest.skip("torch.cuda.is_available() is False: no CUDA GPU here")
        torch.set_num_threads(1)  # small tensors: intra-op threads only add waiting
    factory = SchedulerFactory(implementation)
    yield factory
    assert factory.built > 0, (f"{request.node.name} built no scheduler through "
                               "scheduler_factory: it tested nothing on " + implementation)


@dataclass(frozen=True)
class Ran:
    """What `kvsched ARGS` did in this process."""

    exit_code: int
    stdout: str
    stderr: str


@pytest.fixture
def cli() -> Callable[..., Ran]:
    """`cli(*args)` runs `kvsched ARGS` in this process and restores the SIGTERM handler
    the command installs."""
    from kvsched.cli import main

    def invoke(*args: str) -> Ran:
        handler = signal.getsignal(signal.SIGTERM)
        try:
            result = CliRunner().invoke(main, list(args), catch_exceptions=False)
        finally:
            signal.signal(signal.SIGTERM, handler)
        return Ran(result.exit_code, result.stdout, result.stderr)

    return invoke


# The system's devices the command line's tests write to or read from.
SYSTEM_DEVICES = ("/dev/null", "/dev/zero", "/dev/full")
# Each of them this machine had when the session started: whether it was a device then.
DEVICES_AT_START = pytest.StashKey[dict[str, bool]]()


def is_character_device(path: str) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:  # missing, or a symlink into nowhere
        return False


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[DEVICES_AT_START] = {
        path: is_character_device(path) for path in SYSTEM_DEVICES if os.path.lexists(path)}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when one of SYSTEM_DEVICES that the machine had at its start, or
    has now, is not a character device: the tests must never harm the machine they run
    on (run as root, a rename over /dev/null makes it a regular file)."""
    at_start = session.config.stash.get(DEVICES_AT_START, {})
    for path in SYSTEM_DEVICES:
        if (path in at_start or os.path.lexists(path)) and not is_character_device(path):
            when = ("it was one when the session started: a test wrote over it"
                    if at_start.get(path) else "nor was it when the session started")
            line = f"kvsched tests: {path} is not a character device ({when})"
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(line, red=True, bold=True)
            else:
                print(line, file=sys.stderr)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


# Each holds a test of 10 s or more on two cores (pytest --durations): the changelog
# rendered from every release's kept traces, SGLang and vLLM recorded live, the wheel
# built, CrossHair finding the seeded mutants, every kept SGLang and LMDeploy trace
# replayed, the SHOULD judgement of every kept SGLang trace.
LONG_FIRST = ("test_vllm_release_store.py", "test_adapter_sglang.py", "test_wheel.py",
              "test_proofs.py", "test_adapter_vllm.py", "test_sglang_store.py",
              "test_should_judged.py", "test_adapter_lmdeploy.py", "test_sglang_driver.py",
              "test_adapter_vllm_v0.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
