"""Opening a trace the way users keep them: a file, gzip- or zstd-compressed (found by
its first bytes, whatever its name), or standard input as `-`.

A damaged compressed stream (cut short, corrupt) is told in one line when the reader
reaches the damage, as InputError, never as a traceback; so is a file the system cannot
read (an I/O error, /proc/self/mem's EIO), wherever the reader is when it fails.
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


def cannot_read(label: str, e: OSError) -> InputError:
    """The InputError of a file the system cannot read: `NAME: cannot read (reason)`."""
    return InputError(f"{label}: cannot read ({e.strerror or type(e).__name__})")


class _File(io.FileIO):
    """A file (or standard input) whose read errors become InputError naming it (a
    BufferedReader over it reads through readinto and readall alone)."""

    def __init__(self, file: str | int, label: str, closefd: bool = True) -> None:
        super().__init__(file, "rb", closefd=closefd)
        self.label = label

    def readinto(self, buffer: Any) -> int | None:
        try:
            return super().readinto(buffer)
        except BlockingIOError:
            raise  # a non-blocking stream's "later", not an error
        except OSError as e:
            raise cannot_read(self.label, e) from None

    def readall(self) -> bytes:
        try:
            return super().readall()
        except BlockingIOError:
            raise
        except OSError as e:
            raise cannot_read(self.label, e) from None


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


class _ZstdFrames(io.RawIOBase):
    """The zstd frames of `raw`, one after another, decompressed. A stream that ends
    inside a frame raises EOFError, as gzip's reader does (zstandard's stream_reader
    would end quietly, and a cut trace would read as a shorter one); corrupt data raises
    ValueError."""

    CHUNK = 1 << 17

    def __init__(self, raw: IO[bytes]) -> None:
        import zstandard  # here: a command that reads no zstd trace does not load it

        self.raw = raw
        self.error = zstandard.ZstdError
        self.frame = zstandard.ZstdDecompressor().decompressobj
        self.inside: Any = None  # the frame being read; None between frames
        self.pending = b""  # decompressed, not handed out yet
        self.at = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self.at == len(self.pending):
            chunk = self.raw.read(self.CHUNK)
            if not chunk:
                if self.inside is not None:
                    raise EOFError("the file ends inside a zstd frame")
                return 0
            self._feed(chunk)
        n = min(len(buffer), len(self.pending) - self.at)
        buffer[:n] = self.pending[self.at:self.at + n]
        self.at += n
        return n

    def _feed(self, data: bytes) -> None:
        out: list[bytes] = []
        try:
            while data:
                if self.inside is None:
                    self.inside = self.frame()
                out.append(self.inside.decompress(data))
                data = b""
                if self.inside.eof:  # the frame ended: what follows starts the next one
                    data = self.inside.unused_data
                    self.inside = None
        except self.error as e:
            raise ValueError(str(e)) from None
        self.pending, self.at = b"".join(out), 0

    def close(self) -> None:
        self.raw.close()
        super().close()


def open_trace(name: str) -> IO[bytes]:
    """The trace named `name` as a binary stream (`-`: standard input)."""
    if name == "":
        raise InputError("an empty file name: give a trace file, or - for standard input")
    if name == "-":
        raw = io.BufferedReader(_File(sys.stdin.fileno(), "standard input", closefd=False))
        label = "standard input"
    else:
        path = Path(name)
        if path.is_dir():
            raise InputError(f"{name}: is a directory; expected a trace file")
        try:
            raw = io.BufferedReader(_File(name, name))
        except OSError as e:
            raise cannot_read(name, e) from None
        label = name
    try:
        head = raw.peek(4)[:4]
    except InputError:
        raw.close()
        raise
    if head.startswith(GZIP_MAGIC):
        import gzip  # here: a command that reads no trace does not load it

        return io.BufferedReader(_Guarded(gzip.GzipFile(fileobj=raw), label, "gzip"))
    if head.startswith(ZSTD_MAGIC):
        return io.BufferedReader(_Guarded(_ZstdFrames(raw), label, "zstd"))
    if 2 <= len(head) < len(ZSTD_MAGIC) and ZSTD_MAGIC.startswith(head):
        raw.close()  # the whole file is the start of a zstd frame's magic number
        raise InputError(f"{label}: the zstd data is damaged or cut short (the file ends "
                         "inside a zstd frame)")
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
