"""Opening a trace the way users keep them: a file, gzip- or zstd-compressed (found by
its first bytes, whatever its name), or standard input as `-`.

A damaged compressed stream (cut short, corrupt) is told in one line when the reader
reaches the damage, as InputError, never as a traceback.
"""

from __future__ import annotations

import io
import sys
import zlib
from pathlib import Path
from typing import IO, Any

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class InputError(Exception):
    """A trace file that cannot be opened or decompressed; str() is one line."""


class _Guarded(io.RawIOBase):
    """A decompressing stream whose read errors become InputError naming the file."""

    def __init__(self, inner: Any, name: str, kind: str) -> None:
        self.inner = inner
        self.name = name
        self.kind = kind

    def _call(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self.inner, method)(*args)
        except (OSError, EOFError, zlib.error, ValueError) as e:
            raise InputError(f"{self.name}: the {self.kind} data is damaged or cut short "
                             f"({str(e).strip() or type(e).__name__})") from None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        got: int = self._call("readinto", buffer)
        return got

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._call("read", size)
        return data

    def readline(self, size: int | None = -1) -> bytes:
        line: bytes = self._call("readline", -1 if size is None else size)
        return line

    def close(self) -> None:
        self.inner.close()
        super().close()


def open_trace(name: str) -> IO[bytes]:
    """The trace named `name` as a binary stream (`-`: standard input)."""
    if name == "":
        raise InputError("an empty file name: give a trace file, or - for standard input")
    if name == "-":
        raw: IO[bytes] = io.BufferedReader(io.FileIO(sys.stdin.fileno(), "rb", closefd=False))
        label = "standard input"
    else:
        path = Path(name)
        if path.is_dir():
            raise InputError(f"{name}: is a directory; expected a trace file")
        try:
            raw = path.open("rb")
        except OSError as e:
            raise InputError(f"{name}: cannot read ({e.strerror})") from None
        label = name
    assert isinstance(raw, io.BufferedReader)
    head = raw.peek(4)[:4]
    if head.startswith(GZIP_MAGIC):
        import gzip  # here: a command that reads no trace does not load it

        return io.BufferedReader(_Guarded(gzip.GzipFile(fileobj=raw), label, "gzip"))
    if head.startswith(ZSTD_MAGIC):
        import zstandard
        reader = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
        return io.BufferedReader(_Guarded(reader, label, "zstd"))
    return raw


def is_compressed(name: str) -> bool:
    """Whether `name` is a compressed file (its size on disk says little of its length)."""
    if name in ("", "-"):
        return False
    try:
        with open(name, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return head.startswith((GZIP_MAGIC, ZSTD_MAGIC))
