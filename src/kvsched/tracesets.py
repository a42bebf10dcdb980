"""The traces that `kvsched check`'s arguments name, in the order they are checked.

Each argument, in the order given, stands for:

- `-`: standard input;
- a directory: the trace files under it, at any depth (`*.jsonl`, `*.jsonl.gz`,
  `*.jsonl.zst`), sorted by path;
- a pattern with `*`, `?` or `[` that is not itself a file: the files it matches,
  sorted (`**` matches any depth; quote it, so that kvsched expands it, not the shell);
  a directory it matches stands for its trace files;
- `@LIST`: the paths in the file LIST (`@-`: standard input), one per line, each read as
  one argument (a directory or a pattern expands, an `@OTHER` list nests), blank lines
  and lines starting with `#` skipped; relative paths are relative to the current
  directory, as in a compiler's @file. A list that names itself, or lists that name each
  other in a cycle, are bad input;
- anything else: one trace path, as given.

An argument that names nothing (an empty directory, a pattern that matches nothing, a
list file that cannot be read or lists nothing, a list entry that does not exist) is
bad input, told in one line before any trace is checked. A plain path that does not
exist is left to the check, which gives it its own verdict (it cannot be read), as for
any trace that cannot be opened.
"""

from __future__ import annotations

import glob
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

TRACE_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
GLOB_CHARS = frozenset("*?[")


class TraceSetError(ValueError):
    """An argument that names no trace; str() is one line naming it."""


def is_trace_file(path: Path) -> bool:
    return path.is_file() and path.name.endswith(TRACE_SUFFIXES)


def traces_in(directory: Path, label: str) -> list[str]:
    """The trace files under `directory`, sorted by path."""
    found = sorted(str(p) for p in directory.rglob("*") if is_trace_file(p))
    if not found:
        kinds = ", ".join("*" + suffix for suffix in TRACE_SUFFIXES)
        raise TraceSetError(f"{label}: no trace files ({kinds}) in this directory")
    return found


def expand_one(arg: str, where: str = "") -> list[str]:
    """The traces of one argument (not a list file); `where` prefixes its errors with
    the list file and line it came from. A list entry must exist."""
    label = f"{where}{arg}"
    path = Path(arg)
    if arg in ("", "-"):  # Path("") is the current directory; "" is refused as a name
        return [arg]
    if path.is_dir():
        return traces_in(path, label)
    if path.exists():
        return [arg]
    if GLOB_CHARS & set(arg):
        files: list[str] = []
        for match in sorted(glob.glob(arg, recursive=True)):
            if Path(match).is_dir():
                files += sorted(str(p) for p in Path(match).rglob("*") if is_trace_file(p))
            else:
                files.append(match)
        if not files:
            raise TraceSetError(f"{label}: no file matches this pattern")
        return files
    if where:
        raise TraceSetError(f"{label}: no such file or directory")
    return [arg]


def list_entries(arg: str, where: str = "") -> Iterable[tuple[int, str]]:
    """(line number, entry) of the list file `arg` names (`@-`: standard input); `where`
    prefixes its errors with the list file and line that named it."""
    name = arg[1:]
    if name == "-":
        try:
            text = sys.stdin.read()
        except OSError as e:
            raise TraceSetError(f"{where}@-: cannot read the list from standard input "
                                f"({e.strerror})") from None
    else:
        if not name:
            raise TraceSetError(f"{where}@: expected a list file after @ (one trace path "
                                "per line), or @- for standard input")
        try:
            text = Path(name).read_text(encoding="utf-8")
        except IsADirectoryError:
            raise TraceSetError(f"{where}{arg}: is a directory; expected a list file (one "
                                "trace path per line)") from None
        except OSError as e:
            raise TraceSetError(f"{where}{arg}: cannot read the list file ({e.strerror})"
                                ) from None
        except UnicodeDecodeError as e:
            line = text_line_of(Path(name).read_bytes(), e.start)
            raise TraceSetError(f"{name}: line {line}: not UTF-8 text; expected one trace "
                                "path per line") from None
    entries = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)]
    kept = [(n, entry) for n, entry in entries if entry and not entry.startswith("#")]
    if not kept:
        raise TraceSetError(f"{where}{arg}: the list names no traces (expected one trace "
                            "path per line)")
    return kept


def text_line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def list_identity(arg: str) -> str:
    """What a list argument `@NAME` reads, the same string however NAME is spelt."""
    return "-" if arg == "@-" else str(Path(arg[1:]).resolve())


def expand_arg(arg: str, where: str = "", within: tuple[str, ...] = ()) -> list[str]:
    """The traces of one argument, or of one line of a list file (`where` names the file
    and line); `within`: the list files being read around it, outermost first
    (list_identity), so that a list reaching itself is refused, not read forever."""
    if not arg.startswith("@"):
        return expand_one(arg, where)
    name = "standard input" if arg == "@-" else arg[1:]
    me = list_identity(arg) if arg != "@" else ""
    if me and me in within:
        if within[-1] == me:
            raise TraceSetError(f"{where}{arg}: the list file names itself")
        cycle = " -> ".join([*within[within.index(me):], me])
        raise TraceSetError(f"{where}{arg}: lists nest in a cycle: {cycle}")
    out: list[str] = []
    for n, entry in list_entries(arg, where):
        out += expand_arg(entry, f"{name}: line {n}: ", (*within, me))
    return out


def expand(args: Sequence[str]) -> list[str]:
    """Every trace the arguments name, in order (a trace named twice is checked twice)."""
    out: list[str] = []
    for arg in args:
        out += expand_arg(arg)
    return out
