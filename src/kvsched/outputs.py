"""Writing an output without harming what is at its path: the one implementation behind
every output option (`--out`, `--junit`, `--plot`, ...), the adapters' trace files and
the tools' reports, and the standard streams' write errors.

NOTE on the rule: what is at the path decides how it is written.
- A regular file, or nothing yet: written to PATH.part beside it and renamed over it
  once complete, so that a reader never sees half of it and a failed run leaves the old
  file as it was; the new file keeps the old one's permission bits.
- A symlink: followed to its final target, which is replaced as a regular file is (the
  part file beside the target, not beside the link); the link stays a link.
- A device, FIFO or socket: opened and written in place, no part file, no rename; a
  rename would put a regular file where the device was (run as root, `--out /dev/null`
  used to turn /dev/null into a file).
- A directory: refused.
A part file is removed on any failure, ^C and SIGTERM included (the CLI turns SIGTERM
into an exception that unwinds). A failed write, a full disk above all, is an
OutputError naming the output and the reason in one line, never an OSError traceback.

Each command asks `check_writable` (or `check_writable_directory`) of every output it
was given before it starts its work, so that an output that cannot be written is told
at once, with its reason, not after the whole run. The probe makes, opens and renames
nothing: it reads the status of the path, of its directory and of their file system.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

STANDARD_OUTPUT = "standard output"
STANDARD_ERROR = "standard error"


class OutputError(Exception):
    """An output that cannot be written: str() is one line, `OUTPUT: reason`, where
    OUTPUT is the path as given (or "standard output"); `errno` is the system's."""

    def __init__(self, output: str, reason: str, errno: int | None = None) -> None:
        super().__init__(f"{output}: {reason}")
        self.output = output
        self.errno = errno


def cannot_write(output: str, e: OSError) -> OutputError:
    """The OutputError of an output that could not be opened or put in place."""
    return OutputError(output, f"cannot write ({e.strerror})", e.errno)


def write_failed(output: str, e: OSError) -> OutputError:
    """The OutputError of a write that failed: `/dev/full: no space left on device`."""
    reason = e.strerror or str(e)
    return OutputError(output, reason[:1].lower() + reason[1:], e.errno)


class Sink(io.FileIO):
    """The file under an output's buffer: a failed write raises OutputError naming the
    output. Once a write has failed, or the output is being discarded, it drops what it
    is given, so that closing it (or the interpreter's last flush of standard output)
    does not fail a second time."""

    def __init__(self, fd: int, output: str, closefd: bool = True) -> None:
        super().__init__(fd, "wb", closefd=closefd)
        self.output = output
        self.failure: OutputError | None = None
        self.dropping = False

    def write(self, data: ReadableBuffer, /) -> int:
        if self.dropping:
            return memoryview(data).nbytes
        try:
            return super().write(data)
        except BlockingIOError:
            raise  # a non-blocking stream's "later": the buffer above retries it
        except OSError as e:
            self.dropping = True
            self.failure = write_failed(self.output, e)
            raise self.failure from None


def target_of(path: Path) -> tuple[Path, os.stat_result | None]:
    """The file that writing `path` writes (its final target when it is a symlink) and
    that file's status, None when there is nothing there yet.
    post: __return__[1] is None or not stat.S_ISDIR(__return__[1].st_mode)
    """
    target = Path(os.path.realpath(path))
    try:
        status = target.stat()
    except (FileNotFoundError, NotADirectoryError):  # nothing there (nor can there be)
        return target, None
    except OSError as e:
        raise cannot_write(str(path), e) from None
    if stat.S_ISDIR(status.st_mode):
        raise OutputError(str(path), "is a directory; expected a file to write")
    return target, status


def in_place(path: Path | str) -> bool:
    """Whether `path` is written where it is: a device, FIFO or socket (or a link to
    one), not a file that a rename puts in place. Files named after it (a sidecar
    beside it) would land beside a device, so such outputs have none."""
    status = target_of(Path(path))[1]
    return status is not None and not stat.S_ISREG(status.st_mode)


# File systems of the kernel's own objects (/proc, /sys, ...): no new file can be made
# there, whatever the permission bits say (as root, /proc looks writable).
KERNEL_FILE_SYSTEMS = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs",
                                 "securityfs", "pstore", "bpf", "configfs", "efivarfs",
                                 "fusectl", "devpts"})


def file_system_type(path: Path) -> str | None:
    """The type of the file system `path` is on (Linux's /proc/self/mountinfo: the mount
    whose device is the path's), None where that cannot be told."""
    try:
        device = path.stat().st_dev
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            mounts = f.read().splitlines()
    except OSError:
        return None
    wanted = f"{os.major(device)}:{os.minor(device)}"
    for mount in mounts:
        fields, _, rest = mount.partition(" - ")
        numbers = fields.split()
        if len(numbers) > 2 and numbers[2] == wanted and rest.split():
            return rest.split()[0]
    return None


def _may(path: Path, mode: int) -> bool:
    effective = os.access in os.supports_effective_ids
    return os.access(path, mode, effective_ids=effective)


def unwritable_directory(directory: Path) -> str | None:
    """Why no new file can be made in `directory` (it does not exist, is not a
    directory, is read-only, refuses this user, or belongs to the kernel), None when
    nothing says it cannot."""
    try:
        status = directory.stat()
    except FileNotFoundError:
        return f"the directory {directory} does not exist"
    except NotADirectoryError:
        return f"{directory} is not a directory"
    except OSError as e:
        return f"{directory}: {(e.strerror or type(e).__name__).lower()}"
    if not stat.S_ISDIR(status.st_mode):
        return f"{directory} is not a directory"
    kind = file_system_type(directory)
    if kind in KERNEL_FILE_SYSTEMS:
        return f"{directory} is on the kernel's {kind} file system, where no file can be made"
    try:
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        return f"{directory} is on a read-only file system"
    if not _may(directory, os.W_OK | os.X_OK):
        return f"permission denied: no new file can be made in {directory}"
    return None


def check_writable(path: Path | str) -> None:
    """OutputError, with the reason, when an output cannot be written at `path` the way
    Output writes it (a file made beside the target and renamed over it; a device or
    FIFO opened in place); nothing happens when nothing says it cannot. Makes, opens and
    leaves nothing. A write may still fail later (a full disk): Output tells that."""
    target, status = target_of(Path(path))
    if status is not None and not stat.S_ISREG(status.st_mode):
        if stat.S_ISSOCK(status.st_mode):
            raise OutputError(str(path), "is a socket, not a regular file, a device or a "
                                         "FIFO; expected a file to write")
        if not _may(target, os.W_OK):
            raise OutputError(str(path), "cannot write (permission denied)")
        return
    why = unwritable_directory(target.parent)
    if why is not None:
        raise OutputError(str(path), f"cannot write ({why})")


def check_writable_directory(path: Path | str) -> None:
    """OutputError, with the reason, when files cannot be written under the directory
    `path`, made with its parents where missing; makes and leaves nothing."""
    directory = Path(os.path.abspath(path))
    if directory.exists() and not directory.is_dir():
        raise OutputError(str(path), "is not a directory; expected a directory to write in")
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    why = unwritable_directory(existing)
    if why is not None:
        raise OutputError(str(path), f"cannot write in it ({why})")


class Output:
    """One output being written to `stream`, then kept (`commit`) or dropped (`discard`);
    nothing else may write the output or its part file meanwhile."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.target, status = target_of(self.path)
        in_place = status is not None and not stat.S_ISREG(status.st_mode)
        # None for a device, FIFO or socket: written where it is.
        self.part = None if in_place else self.target.with_name(self.target.name + ".part")
        try:
            fd = self.open_part(status) if self.part is not None else os.open(
                self.target, os.O_WRONLY)  # no O_CREAT: a vanished device is not made a file
        except OSError as e:
            why = unwritable_directory(self.target.parent) if self.part is not None else None
            if why is not None:  # the reason, not the system's word for it (/proc: ENOENT)
                raise OutputError(str(path), f"cannot write ({why})", e.errno) from None
            raise cannot_write(str(path), e) from None
        self.sink = Sink(fd, str(path))
        self.stream: IO[bytes] = io.BufferedWriter(self.sink)

    def open_part(self, status: os.stat_result | None) -> int:
        """A new, empty part file (never a stale one, nor whatever a stale name links
        to), with the permission bits of the file it replaces."""
        assert self.part is not None
        self.part.unlink(missing_ok=True)
        fd = os.open(self.part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            if status is not None:
                os.fchmod(fd, stat.S_IMODE(status.st_mode))
        except OSError:
            os.close(fd)
            self.part.unlink(missing_ok=True)
            raise
        return fd

    def commit(self) -> None:
        """Put what was written in place: the part file renamed over the target, or the
        device's file closed. On an OutputError the part file is gone too.
        post: self.part is None or not self.part.exists()
        """
        try:
            self.stream.close()  # the last of the buffer: a full disk shows here at the latest
            if self.sink.failure is not None:  # a failure someone caught and went on from
                raise self.sink.failure
            if self.part is not None:
                os.replace(self.part, self.target)
        except OutputError:
            self.discard()
            raise
        except OSError as e:
            self.discard()
            raise cannot_write(str(self.path), e) from None

    def discard(self) -> None:
        """Drop what was written: the part file is removed and the target is as it was
        (a device or FIFO keeps what it was already given)."""
        self.sink.dropping = True
        with contextlib.suppress(OSError, ValueError):
            self.stream.close()
        if self.part is not None:
            with contextlib.suppress(OSError):
                self.part.unlink(missing_ok=True)


@contextmanager
def atomic_output(path: Path | str) -> Iterator[IO[bytes]]:
    """The stream of an output at `path`, committed when the block ends and discarded
    if it raises (any exception: ^C, SIGTERM's, a full disk's OutputError)."""
    output = Output(path)
    try:
        yield output.stream
    except BaseException:
        output.discard()
        raise
    output.commit()


def named(stream: IO[str], name: str) -> IO[str] | None:
    """`stream` again, on a Sink that names it; None when it is not a file (click's test
    runner's, or one already closed) and so has no write error to name."""
    try:
        fd = stream.fileno()
        stream.flush()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return None
    return io.TextIOWrapper(
        io.BufferedWriter(Sink(fd, name, closefd=False)),
        encoding=getattr(stream, "encoding", None), errors=getattr(stream, "errors", None),
        line_buffering=getattr(stream, "line_buffering", False),
        write_through=getattr(stream, "write_through", False))


@contextmanager
def named_standard_streams() -> Iterator[None]:
    """Inside, a write to sys.stdout or sys.stderr that fails raises OutputError naming
    "standard output" or "standard error" (errno EPIPE: the reader left), rather than
    an OSError that click and rich would each turn into exit 1; on the way out the
    streams are flushed and put back. Nothing else may replace either stream meanwhile.
    """
    stdout, stderr = sys.stdout, sys.stderr
    out = named(stdout, STANDARD_OUTPUT) if stdout is not None else None
    err = named(stderr, STANDARD_ERROR) if stderr is not None else None
    if out is not None:
        sys.stdout = out
    if err is not None:
        sys.stderr = err
    try:
        yield
    finally:
        for replaced in (out, err):
            # Whatever failed here has been raised once already, inside.
            with contextlib.suppress(OutputError, OSError, ValueError):
                if replaced is not None:
                    replaced.flush()
        sys.stdout, sys.stderr = stdout, stderr
