"""kvsched.implementations: which scheduler and which checker run, and what a user is
told when the fast one is missing or cannot run."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace

import pytest

from kvsched import implementations as impl
from kvsched.commands.options import DEFAULT_CONFIG
from kvsched.reference import ReferenceScheduler, V0Scheduler
from kvsched.spec.profiles import get_profile

V1 = get_profile("vllm-v1").knobs
V0 = get_profile("vllm-v0")


@pytest.fixture
def fresh_notes() -> Iterator[None]:
    """Each test sees the notes as a new process would: none given yet."""
    saved = set(impl._noted)
    impl._noted.clear()
    yield
    impl._noted.clear()
    impl._noted.update(saved)


@pytest.fixture
def no_compiled(monkeypatch: pytest.MonkeyPatch, fresh_notes: None) -> None:
    """The compiled module as a build without a C++ compiler leaves it: absent."""
    monkeypatch.setitem(sys.modules, "kvsched.optimized.compiled", None)


def test_auto_takes_the_compiled_scheduler_where_it_implements_the_run() -> None:
    assert impl.chosen_scheduler("auto", DEFAULT_CONFIG, V1) == "compiled"
    assert impl.chosen_scheduler("auto", DEFAULT_CONFIG, V1, device="cuda") == "torch"
    # vLLM V0's step: the reference alone implements it. V0's profile's knobs on v1's
    # step are V0's rules at their defaults, which v1's step does not read.
    assert impl.chosen_scheduler("auto", DEFAULT_CONFIG, V0.knobs, V0.scheduler) == "reference"
    assert impl.chosen_scheduler("auto", DEFAULT_CONFIG, V0.knobs) == "compiled"
    assert impl.chosen_scheduler("reference", DEFAULT_CONFIG, V1) == "reference"
    assert impl.chosen_scheduler("optimized", DEFAULT_CONFIG, V1) == "torch"


def test_auto_without_the_compiled_module_runs_the_reference_and_says_so_once(
        no_compiled: None, capsys: pytest.CaptureFixture[str]) -> None:
    for _ in range(2):
        assert impl.chosen_scheduler("auto", DEFAULT_CONFIG, V1) == "reference"
    assert capsys.readouterr().err == (
        "kvsched: note: the compiled scheduler is not built here (kvsched was installed "
        "without a C++ compiler); running the reference scheduler\n")
    with pytest.raises(impl.Unavailable, match=r"^--scheduler compiled: kvsched was "
                                               r"installed without its compiled module"):
        impl.new_scheduler("compiled", "compiled", DEFAULT_CONFIG, V1)


def test_a_profile_is_replayed_by_the_reference_of_its_own_step() -> None:
    assert type(impl.profile_scheduler("vllm-v1", DEFAULT_CONFIG)) is ReferenceScheduler
    assert type(impl.profile_scheduler(V0, DEFAULT_CONFIG)) is V0Scheduler
    assert type(impl.build_scheduler("reference", DEFAULT_CONFIG, V0.knobs, "v0")) \
        is V0Scheduler
    with pytest.raises(ValueError, match="the compiled scheduler does not implement vLLM "
                                         "V0's scheduler"):
        impl.build_scheduler("compiled", DEFAULT_CONFIG, V1, "v0")


@pytest.mark.parametrize("args, message", [
    (("reference", "reference", DEFAULT_CONFIG, V1, "v1", "cuda"),
     "--device applies to --scheduler torch only"),
    (("compiled", "compiled", DEFAULT_CONFIG, V0.knobs, "v0"),
     "--scheduler compiled: the profile's scheduler is vLLM V0's, which only the "
     "reference implements: use --scheduler reference"),
    (("compiled", "compiled", DEFAULT_CONFIG,
      replace(V0.knobs, v0=replace(V0.knobs.v0, reject="arrival"))),
     "--scheduler compiled: the compiled scheduler runs vLLM v1's step: vLLM v1's step does "
     "not read knob v0.reject arrival"),
])
def test_a_named_scheduler_that_cannot_run_is_one_line(args: tuple[str, ...],
                                                       message: str) -> None:
    with pytest.raises(impl.Unavailable) as e:
        impl.new_scheduler(*args)  # type: ignore[arg-type]
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_auto_checks_every_trace_with_the_vectorized_checker_where_it_is_built() -> None:
    assert impl.chosen_checker("auto") == "vectorized"
    assert impl.chosen_checker("spec") == "spec"
    impl.require_checker("vectorized")


def test_simulate_without_the_compiled_module_names_the_reference() -> None:
    script = ("import sys; sys.modules['kvsched.optimized.compiled'] = None; "
              "sys.argv[0] = 'kvsched'; from kvsched.cli import main; main()")
    done = subprocess.run([sys.executable, "-c", script, "simulate", "--requests", "5",
                           "--format", "json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ("kvsched: note: the compiled scheduler is not built here "
                           "(kvsched was installed without a C++ compiler); running the "
                           "reference scheduler\n")
    assert json.loads(done.stdout)["scheduler"] == "reference"
