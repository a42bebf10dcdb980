"""A page of the docs followed from the top, as a reader at the repository root would.

Each page gets a workspace of its own: a temporary folder that looks like the checkout
(the code, the tests' data, the scripts and the project's .venv are links to it; docs/
and README.md are copies, since some commands write there), with the reader's own files
the page names put in first. Its blocks then run in page order, each command in bash
with .venv/bin first on the PATH and a time limit, so that a block finds what the blocks
above it wrote. A known gap is not run; its stand-in, if any, runs in its place. A
`make` command runs without remaking .venv or the compiled module (`keeping_the_build`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from doc_blocks import PYTHON, SHELL, Block, Command, commands, python_file

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = ROOT / ".venv" / "bin"
# Linked into each workspace (read, never written); docs/ and README.md are copied.
LINKED = (".venv", "Makefile", "conformance", "optimized", "proofs", "pyproject.toml",
          "reference", "scripts", "setup.py", "spec", "src", "tests", "tools")
COPIED = ("README.md", "docs")
TIME_LIMIT_S = 120
# Set by an outer make or shell, they would change what the page's commands do.
NOT_PASSED = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "VIRTUAL_ENV", "PYTHONPATH",
              "HYPOTHESIS_PROFILE", "KVSCHED_DEEP_EXAMPLES")


@dataclass(frozen=True)
class Gap:
    """A command the tests cannot run, and why; `stand_in` runs in its place and makes
    what the page's later commands read."""

    reason: str
    stand_in: str | None = None


@dataclass(frozen=True)
class File:
    """A file of the reader's own that a page names, as the test provides it."""

    path: str
    text: str


@dataclass(frozen=True)
class Outcome:
    """What one command of a block did (`gap` is its reason when it was not run)."""

    command: Command
    returncode: int
    stdout: str
    stderr: str
    gap: str | None = None

    def failed(self) -> bool:
        return self.gap is None and self.returncode != self.command.exit

    def describe(self) -> str:
        tail = "\n".join((self.stdout + self.stderr).strip().splitlines()[-15:])
        return (f"line {self.command.line}: `{shown(self.command.text)}` exited "
                f"{self.returncode}, the page says {self.command.exit}\n{tail}")


def shown(text: str) -> str:
    """A command as one line, comments and line continuations left out."""
    lines = [re.sub(r"\s+#.*$", "", line).rstrip("\\") for line in text.split("\n")]
    return " ".join(" ".join(lines).split())


def keeping_the_build(command: str) -> str:
    """A page's `make` command, told not to remake .venv or the compiled module: a test
    never installs or builds in the checkout, and runs its build as it is, as every
    other command here does."""
    if not command.startswith("make "):
        return command
    return "make -o .venv/.installed-stamp -o compiled " + command.removeprefix("make ")


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in NOT_PASSED}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def run(command: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = [str(VENV_BIN / "python"), "-"] if stdin is not None else ["bash", "-c", command]
    try:
        return subprocess.run(argv, cwd=cwd, env=environment(), input=stdin or "",
                              capture_output=True, text=True, timeout=TIME_LIMIT_S)
    except subprocess.TimeoutExpired as e:
        printed = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else ""
        return subprocess.CompletedProcess(argv, 124, printed,
                                           f"timed out after {TIME_LIMIT_S} s")


@dataclass
class PageRun:
    """One page's blocks run in order in one workspace; each block at most once."""

    page: str
    blocks: Sequence[Block]
    workspace: Path
    gaps: Mapping[str, Gap]
    provided: Sequence[File | str]
    outcomes: dict[str, list[Outcome]] = field(default_factory=dict)
    ready: bool = False

    def setup(self) -> None:
        self.ready = True
        for name in LINKED:
            (self.workspace / name).symlink_to(ROOT / name)
        for name in COPIED:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, self.workspace / name)
            else:
                shutil.copy(source, self.workspace / name)
        for item in self.provided:
            if isinstance(item, File):
                (self.workspace / item.path).parent.mkdir(parents=True, exist_ok=True)
                (self.workspace / item.path).write_text(item.text)
            else:
                done = run(item, self.workspace)
                assert done.returncode == 0, f"providing {self.page}'s files: `{item}` " \
                    f"failed:\n{done.stdout}{done.stderr}"

    def through(self, block: Block) -> list[Outcome]:
        """The outcomes of `block`, after every block above it on the page has run."""
        if not self.ready:
            self.setup()
        for earlier in self.blocks:
            if earlier.name not in self.outcomes:
                self.outcomes[earlier.name] = self.run_block(earlier)
            if earlier == block:
                break
        return self.outcomes[block.name]

    def run_block(self, block: Block) -> list[Outcome]:
        if block.lang == PYTHON:
            return self.run_python(block)
        if block.lang not in SHELL:
            return []  # output or data
        out = []
        for command in commands(block):
            gap = self.gaps.get(shown(command.text))
            if gap is None:
                done = run(keeping_the_build(command.text), self.workspace)
                out.append(Outcome(command, done.returncode, done.stdout, done.stderr))
                continue
            if gap.stand_in is not None:
                done = run(gap.stand_in, self.workspace)
                assert done.returncode == 0, f"the stand-in `{gap.stand_in}` failed:\n" \
                    f"{done.stdout}{done.stderr}"
            out.append(Outcome(command, 0, "", "", gap=gap.reason))
        return out

    def run_python(self, block: Block) -> list[Outcome]:
        named = python_file(block)
        command = Command("python -  # the block, as a script", block.line, 0)
        if named is None:
            done = run("", self.workspace, stdin=block.body + "\n")
        elif named.kind == "excerpt":
            return []  # compared with its file by test_an_excerpt_is_its_file
        else:
            path = self.workspace / named.path
            if named.kind == "continued":
                assert path.exists(), f"{block.name} continues {named.path}, which no " \
                    "block above it begins"
                path.write_text(path.read_text() + "\n\n" + block.body + "\n")
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(block.body + "\n")
            if not path.name.startswith("test_"):
                # A module the page's later commands import: it must at least compile.
                compile(path.read_text(), str(path), "exec")
                return []
            done = run(f"python -m pytest -q -p no:cacheprovider {named.path}",
                       self.workspace)
            command = Command(f"python -m pytest {named.path}", block.line, 0)
        return [Outcome(command, done.returncode, done.stdout, done.stderr)]
