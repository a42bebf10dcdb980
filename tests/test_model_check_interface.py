"""The model checker explores any scheduler of the interface (docs/scheduler-interface.md):
a factory taking the config, as `kvsched fuzz` takes it; a factory that raises on a
scope's config refuses that scope, and one that refuses every scope is an error."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the proofs package lives at the top, beside spec/

from doc_blocks import blocks, python_file  # noqa: E402

from kvsched.spec.knobs import Knobs  # noqa: E402
from kvsched.spec.model import Config  # noqa: E402
from proofs import model_check  # noqa: E402
from proofs.scopes import Scope, shapes  # noqa: E402

# A user's scheduler that allocates lazily only, and says so by refusing other configs.
LAZY_ONLY = '''
from one_at_a_time import OneAtATime


def make(config):
    if config.allocation != "lazy":
        raise ValueError(f"allocates lazily only, not {config.allocation}")
    return OneAtATime(config)
'''
CONFIG = Config(block_size=2, num_gpu_blocks=4, max_num_batched_tokens=4, max_num_seqs=4,
                max_model_len=8, prefix_caching=False)


@pytest.fixture(scope="module")
def user_modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """docs/scheduler-interface.md's one_at_a_time.py, as the page shows it, and
    lazy_only.py beside it."""
    page = ROOT / "docs" / "scheduler-interface.md"
    [code] = [b.body for b in blocks(ROOT, page)
              if (f := python_file(b)) is not None and f.path == "one_at_a_time.py"]
    folder = tmp_path_factory.mktemp("user")
    (folder / "one_at_a_time.py").write_text(code + "\n")
    (folder / "lazy_only.py").write_text(LAZY_ONLY)
    return folder


@pytest.fixture(scope="module")
def lazy_only(user_modules: Path) -> ModuleType:
    sys.path.insert(0, str(user_modules))
    try:
        return importlib.import_module("lazy_only")
    finally:
        sys.path.remove(str(user_modules))


def test_a_scheduler_of_the_interface_is_explored_without_a_finding(
        lazy_only: ModuleType) -> None:
    scope = Scope("test", "test", CONFIG, Knobs(), shapes((1, 3), (3, 2)))
    result = model_check.explore(scope, lazy_only.make)
    assert result.refused is None
    assert result.finding is None, result.finding
    # Both requests arrive, run one at a time, end: many states, each visited once.
    assert result.states > 10
    # Taking the scope's knobs too, as the reference's classes do: the same states.
    both = model_check.explore(scope, lambda config, knobs: lazy_only.make(config))
    assert (both.finding, both.states, both.transitions) == (None, result.states,
                                                             result.transitions)


def test_a_factory_that_raises_on_the_config_refuses_the_scope(
        lazy_only: ModuleType) -> None:
    full = replace(CONFIG, allocation="full")
    result = model_check.explore(Scope("test", "test", full, Knobs(), shapes((1, 3))),
                                 lazy_only.make)
    assert result.refused == "ValueError: allocates lazily only, not full"
    assert (result.states, result.finding) == (0, None)


def model_checker(user_modules: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(user_modules), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "proofs.model_check", "--scopes", "quick",
                           "--scheduler", "lazy_only:make", *args], capture_output=True,
                          text=True, timeout=300, env=env, cwd=user_modules)


def test_the_command_line_explores_and_refuses_scopes(user_modules: Path) -> None:
    # One scope of each allocation: lazy (explored), full (refused).
    lazy = "vllm-v1 bs2 gpu4 tok4 seq4 len8 fcfs/reco/cache [1/3,1/3,1/3]"
    ran = model_checker(user_modules, "--only", lazy)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.splitlines()[0].endswith(" ok")
    assert "1 scopes," in ran.stdout and "0 with a finding" in ran.stdout
    full = "vllm-v1/full bs2 gpu4 tok4 seq4 len8 fcfs/reco/full/cache [1/3,1/3,1/3]"
    ran = model_checker(user_modules, "--only", full)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert ran.stdout.splitlines()[0].endswith(
        "refused: the scheduler raised ValueError: allocates lazily only, not full on this "
        "config")
    assert ran.stderr == ("--scheduler lazy_only:make: its factory raised on every scope's "
                          "config; nothing was explored\n")
