"""kvsched installs without a C++ compiler: the wheel is built with the compiled modules
left out (setup.py builds them as optional extensions), and from that wheel the tool
falls back to the reference scheduler and the spec's checker (docs/optimized.md).

The wheel is built from a copy of the checkout (as test_wheel builds it), with the
compiler hidden (CC and CXX name no program), and run from where it is unpacked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_wheel import build_wheel, package_files

COMPILED = ("kvsched/optimized/compiled.", "kvsched/optimized/state.")


def run_kvsched(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`kvsched ARGS` from the unpacked wheel at `site`, ahead of the installed kvsched."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, "-c", "import sys; from kvsched.cli import main; "
                               "sys.argv[0] = 'kvsched'; main()", *args],
        capture_output=True, text=True, timeout=120, check=False, env=env, cwd=cwd)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built without a compiler, unpacked."""
    tmp = tmp_path_factory.mktemp("no-compiler")
    with pytest.MonkeyPatch.context() as env:  # no such programs: no compiler
        env.setenv("CC", str(tmp / "no-cc"))
        env.setenv("CXX", str(tmp / "no-cxx"))
        wheel = build_wheel(tmp)
    unpacked = tmp / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(unpacked)
    return unpacked


def test_the_wheel_built_without_a_compiler_holds_the_pure_package(site: Path) -> None:
    package = {p.relative_to(site).as_posix() for p in (site / "kvsched").rglob("*")
               if p.is_file()}
    pure = {name for name in package_files()
            if not (name.startswith(COMPILED) and not name.endswith(".pyi"))}
    assert not [name for name in package if name.endswith((".so", ".pyd"))]
    assert package == pure, (f"in the wheel only: {sorted(package - pure)}; "
                             f"missing from it: {sorted(pure - package)}")


def test_without_the_compiled_modules_kvsched_falls_back(site: Path, tmp_path: Path) -> None:
    probe = subprocess.run(
        [sys.executable, "-c",
         "import kvsched, kvsched.implementations as i; "
         "print(kvsched.__file__); print(i.vectorized_installed() is not None)"],
        capture_output=True, text=True, timeout=60, check=True,
        env={**os.environ, "PYTHONPATH": str(site)})
    where, missing = probe.stdout.split()
    assert Path(where).is_relative_to(site) and missing == "True"

    simulated = run_kvsched(site, "simulate", "--requests", "20", "--out", "t.jsonl",
                            "--format", "json", cwd=tmp_path)
    assert simulated.returncode == 0, simulated.stderr
    assert "the compiled scheduler is not built here" in simulated.stderr
    assert json.loads(simulated.stdout)["scheduler"] == "reference"
    header = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
    assert header["engine"]["name"] == "kvsched-reference"

    checked = run_kvsched(site, "check", "t.jsonl", "--profile", "vllm-v1", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.startswith("OK t.jsonl")
    refused = run_kvsched(site, "check", "t.jsonl", "--checker", "vectorized", cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "kvsched: error: --checker vectorized needs kvsched's compiled module, which this "
        "install lacks (it is built when kvsched is installed where a C++ compiler is)")
