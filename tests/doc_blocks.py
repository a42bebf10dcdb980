"""The fenced code blocks of the docs, read as tests/test_docs.py runs them.

A block's kind is its fence's language:

- `python`: code. Its first line may name it: `# NAME.py` is a whole file the reader
  saves, `# NAME.py, continued` more of one an earlier block of the page began, and
  `# from PATH` an excerpt of the repository's file PATH. A block without such a line
  is a script, run as it is.
- `sh`, `console`, or no language: shell commands. A block with `$ ` prompts is a
  transcript (the prompted lines are commands, the rest their output); otherwise every
  line is a command. A line ending in `\\` continues on the next, and a here-document
  belongs to the command that opens it. A command succeeds (exit 0) unless the page
  says otherwise: a trailing comment that says `exit N` (`# exit 1`, `# exit 1: stuck`),
  or, in a transcript, `$ echo $?` with N on the next line.
- `text`, `json`: output or data, never run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PYTHON = "python"
SHELL = ("sh", "console", "")
OUTPUT = ("text", "json")

FENCE = re.compile(r"^ {0,3}```(?P<lang>[\w-]*)\s*$")
CLOSING = re.compile(r"^ {0,3}```\s*$")
EXIT_COMMENT = re.compile(r"#[^\n]*?\bexit (\d+)\b")
HEREDOC = re.compile(r"<<-?\s*'?\"?(\w+)'?\"?")
FILE_HEADER = re.compile(r"^# (?P<excerpt>from )?(?P<path>[\w./-]+\.py)"
                         r"(?P<continued>, continued)?(?: \([^)]*\))?$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: `line` is its opening fence's line number."""

    page: str
    line: int
    lang: str
    body: str

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass(frozen=True)
class Command:
    """One shell command of a block, as bash runs it, and the exit status it should have."""

    text: str
    line: int
    exit: int


@dataclass(frozen=True)
class PythonFile:
    """What a Python block's first line says it is (`kind`: file, continued, excerpt)."""

    kind: str
    path: str


def blocks(root: Path, page: Path) -> list[Block]:
    """Every fenced block of `page` (a path under `root`), in order.

    pre: page is a file under root
    """
    name = page.relative_to(root).as_posix()
    lines = page.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    number = 0
    while number < len(lines):
        opening = FENCE.match(lines[number])
        number += 1
        if opening is None:
            continue
        start = number
        while number < len(lines) and not CLOSING.match(lines[number]):
            number += 1
        if number == len(lines):
            raise ValueError(f"{name}:{start}: a fenced block that is never closed")
        out.append(Block(name, start, opening["lang"], "\n".join(lines[start:number])))
        number += 1
    return out


def python_file(block: Block) -> PythonFile | None:
    """The file a Python block names in its first line, or None for a plain script."""
    first = block.body.split("\n", 1)[0]
    m = FILE_HEADER.match(first)
    if m is None:
        return None
    kind = "excerpt" if m["excerpt"] else "continued" if m["continued"] else "file"
    return PythonFile(kind, m["path"])


def commands(block: Block) -> list[Command]:
    """The commands of a shell block, each with the exit status the page gives it."""
    lines = block.body.split("\n")
    transcript = any(line.startswith("$ ") for line in lines)
    out: list[Command] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if transcript and not line.startswith("$ "):
            continue  # output
        text = line[2:] if transcript else line
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        if transcript and text.strip() == "echo $?":
            if not out or i >= len(lines) or not lines[i].strip().isdigit():
                raise ValueError(f"{block.page}:{block.line + i}: `echo $?` must follow a "
                                 "command and be followed by its exit status")
            last = out.pop()
            out.append(Command(last.text, last.line, int(lines[i])))
            i += 1
            continue
        start = block.line + i
        parts = [text]
        while parts[-1].endswith("\\") and i < len(lines):
            parts.append(lines[i])
            i += 1
        heredoc = HEREDOC.search(parts[0]) if "<<" in parts[0] else None
        if heredoc is not None:
            while i < len(lines) and lines[i] != heredoc[1]:
                parts.append(lines[i])
                i += 1
            parts.append(heredoc[1])
            i += 1
        said = EXIT_COMMENT.search(parts[0] if heredoc else parts[-1])
        out.append(Command("\n".join(parts), start, int(said[1]) if said else 0))
    return out


def prompts(block: Block) -> list[str]:
    """The `$ ` lines of a block: a transcript shown in an output block."""
    return [line for line in block.body.split("\n") if line.startswith("$ ")]
