"""The wheel holds the product and nothing else: the kvsched package (the tool, the spec,
the reference, the optimized engine, the adapters that record traces) and its
dist-info; no development tools (tools/: benchmarks, docs renderer), no conformance
suites (conformance/: vLLM's, run from a checkout), no tests.

It is built from a copy of the checkout, so the build's own files (build/, egg-info)
never land in the working tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("pyproject.toml", "setup.py", "README.md", "src", "spec", "reference", "optimized",
          "tools", "conformance", "tests")
# The build's own outputs (the compiled scheduler's generated C++ and module among them)
# are made again from the sources.
NOT_SOURCE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "*.so",
                                    "compiled.cpp", "state.cpp")
DIST_INFO = "kvsched-0.1.0.dist-info"


def build_wheel(tmp: Path) -> Path:
    tree = tmp / "checkout"
    tree.mkdir()
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            # symlinks=True: src/kvsched/spec and the others stay the relative links they are.
            shutil.copytree(source, tree / name, symlinks=True, ignore=NOT_SOURCE)
        else:
            shutil.copy2(source, tree / name)
    out = tmp / "dist"
    # The compiler unoptimized and without debug information (the flags follow the
    # build's own): what this test reads is which files the wheel holds, not how fast
    # the modules in it run, and the optimized build takes four times as long.
    env = dict(os.environ, **{flags: f"{os.environ.get(flags, '')} -O0 -g0".strip()
                              for flags in ("CFLAGS", "CXXFLAGS")})
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", "-w", str(out), str(tree)],
        capture_output=True, text=True, timeout=300, check=False, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    wheels = list(out.glob("kvsched-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def package_files() -> set[str]:
    """The package's files as the wheel should hold them: every module of src/kvsched,
    through the links to the pillars, the py.typed marker, and the compiled modules
    (the scheduler and the fast checker's state: each module, built for this Python,
    and its types; not their Cython or C++ source)."""
    src = ROOT / "src"
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    found = {"kvsched/py.typed", "kvsched/optimized/compiled.pyi",
             f"kvsched/optimized/compiled{suffix}", "kvsched/optimized/state.pyi",
             f"kvsched/optimized/state{suffix}"}
    for folder, dirs, files in os.walk(src / "kvsched", followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        here = Path(folder).relative_to(src)
        found.update((here / f).as_posix() for f in files if f.endswith(".py"))
    return found


def test_the_wheel_holds_the_package_and_nothing_else(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = z.read(f"{DIST_INFO}/entry_points.txt").decode()
    package = {n for n in names if n.startswith("kvsched/")}
    meta = names - package
    assert package == package_files(), (
        f"in the wheel only: {sorted(package - package_files())}; "
        f"missing from it: {sorted(package_files() - package)}")
    assert all(n.startswith(f"{DIST_INFO}/") for n in meta), sorted(meta)
    assert {f"{DIST_INFO}/{f}" for f in ("METADATA", "WHEEL", "RECORD", "entry_points.txt",
                                         "top_level.txt")} <= meta
    # The three pillars and the adapters come through the links.
    for module in ("spec/checker.py", "reference/scheduler.py", "optimized/checker.py",
                   "optimized/replay.py", "adapters/vllm.py", "cli.py"):
        assert f"kvsched/{module}" in package
    for tool in ("bench", "bench_optimized", "docs_render"):
        assert not any(n.endswith(f"/{tool}.py") for n in names), tool
    assert not any(n.startswith(("tools/", "tests/", "conformance/")) for n in names)
    # vLLM's conformance suites stay in the checkout; the adapters they record with ship.
    for module in ("adapters/vllm_driver.py", "adapters/vllm_v0.py",
                   "adapters/vllm_v0_driver.py"):
        assert f"kvsched/{module}" in package
    assert not any("conformance" in n for n in package - {"kvsched/conformance.py"}), sorted(
        n for n in package if "conformance" in n)
    assert "kvsched = kvsched.cli:main" in entry_points
    assert "kvsched = kvsched.pytest_plugin" in entry_points
