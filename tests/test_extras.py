"""What each optional extra installs, and what runs without it.

pyproject.toml's extras: `gpu` (torch) for the torch scheduler, `dev` everything the
tests need. The fast checker needs no extra (its compiled module is built at install,
and it reads lines with orjson, a base dependency) and never imports torch or numpy;
without torch the torch scheduler is refused in one line naming the extra.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTRAS: dict[str, list[str]] = tomllib.loads((ROOT / "pyproject.toml").read_text())[
    "project"]["optional-dependencies"]
HIDE_TORCH = "import sys; sys.modules['torch'] = None; "


def python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          text=True, timeout=120)


def name(requirement: str) -> str:
    return requirement.split("=")[0].split(">")[0].split("<")[0].split("[")[0].strip()


def test_the_gpu_extra_holds_torch_and_the_checker_extra_does_not() -> None:
    assert EXTRAS["gpu"] == ["torch==2.13.0", "numpy"]
    assert "optimized" not in EXTRAS  # the fast checker needs no extra
    dev = set(EXTRAS["dev"])
    for extra, requirements in EXTRAS.items():
        assert set(requirements) <= dev, extra


def test_the_vectorized_checker_imports_no_torch() -> None:
    done = python("import sys, kvsched.optimized.checker, kvsched.optimized.state; "
                  "print('torch' in sys.modules, 'numpy' in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False False"


def test_without_torch_the_torch_scheduler_is_refused_in_one_line() -> None:
    done = python(HIDE_TORCH + "from kvsched.optimized import TorchScheduler")
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1
    assert last == ("ImportError: the torch scheduler (kvsched.optimized.TorchScheduler) "
                    "needs torch: pip install 'kvsched[gpu]'")
    cli = python(HIDE_TORCH + "sys.argv[0] = 'kvsched'; from kvsched.cli import main; main()",
                 "simulate", "--scheduler", "torch", "--requests", "3")
    assert cli.returncode == 2
    assert cli.stderr == ("kvsched: error: --scheduler torch needs torch: pip install "
                          "'kvsched[gpu]'\n")
    # The rest runs without it: the checker and the other schedulers.
    plain = python(HIDE_TORCH + "sys.argv[0] = 'kvsched'; from kvsched.cli import main; "
                   "main()", "simulate", "--requests", "3", "--format", "json")
    assert plain.returncode == 0, plain.stderr
