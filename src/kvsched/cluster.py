"""Independent pieces of a command's work (one trace to check, one fuzz shard), run here
one after the other or on a Ray cluster, with their outcomes in the order of the pieces.

A piece is a picklable callable without arguments (a module-level function under
`functools.partial`). `Serial` calls each in turn, in this process. `RayCluster` runs
each as a Ray task, at most `workers` at once, and hands back what the piece returned
together with what it printed (standard output and error, captured on the worker and
printed here in the pieces' order), so that a command's output is the same whether it
ran serially or on Ray. A piece that raises raises here, when its turn comes, as in the
serial run. A piece whose worker dies or whose node is lost is not retried (a trace that
exhausts a worker's memory would take the next worker down too): its outcome is `lost`,
with Ray's reason, and the command reports it as such.

`stop` ends a run early the same way in both: once a piece's result satisfies it, no
later piece is run (or, on Ray, the later ones already running are cancelled and their
results dropped), and every earlier piece still completes.

A local Ray is started on demand (one node, `workers` CPUs, on the loopback address,
without its dashboard or usage statistics) and shut down at the end, on ^C too, with
every process it started (what Ray's own shutdown leaves running is killed); `address`
connects to a running cluster instead. A process that has Ray initialised already (a notebook,
the test suite) keeps using that instance. Ray reads the settings that keep a local
instance on the loopback address when it is imported: in a process that imported Ray
itself, set LOCAL_ENV before that import.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

R = TypeVar("R")

# A local cluster is one node: Ray's single-node mode (as on macOS and Windows) keeps
# every process on 127.0.0.1 and looks up no outward address; usage statistics stay off.
LOCAL_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
# How long to wait for a cluster's address to accept a connection before saying so.
CONNECT_TIMEOUT_S = 5.0
# How long the processes a local Ray leaves behind get to go once killed.
REAP_TIMEOUT_S = 5.0
NEEDS_RAY = "needs Ray: pip install 'kvsched[ray]'"


class ClusterError(Exception):
    """Ray is missing, or the cluster cannot be reached; str() is one line."""


@dataclass(frozen=True)
class Outcome(Generic[R]):
    """A piece's result, or why there is none (`lost`), with what it printed."""

    index: int
    value: R | None
    lost: str | None = None
    stdout: str = ""
    stderr: str = ""


class Executor:
    """Runs pieces; `workers` of them at once."""

    workers = 1
    distributed = False

    def run(self, pieces: Sequence[Callable[[], R]], *,
            stop: Callable[[R], bool] | None = None,
            on_done: Callable[[int], None] | None = None) -> Iterator[Outcome[R]]:
        """The pieces' outcomes in their order; `on_done(i)` as each piece ends."""
        raise NotImplementedError


class Serial(Executor):
    """Each piece in turn, in this process; what it prints goes straight through."""

    def run(self, pieces: Sequence[Callable[[], R]], *,
            stop: Callable[[R], bool] | None = None,
            on_done: Callable[[int], None] | None = None) -> Iterator[Outcome[R]]:
        for i, piece in enumerate(pieces):
            value = piece()
            if on_done is not None:
                on_done(i)
            yield Outcome(i, value)
            if stop is not None and stop(value):
                return


@dataclass(frozen=True)
class _Done:
    """What a piece did on its worker: returned `value` or raised `raised`."""

    value: Any
    raised: BaseException | None
    stdout: str
    stderr: str


def _run_piece(cwd: str, piece: Callable[[], Any]) -> _Done:
    """A piece on a Ray worker: in the driver's directory where this node has it (so
    that relative paths and the messages naming them read as in a serial run), with
    its output captured."""
    with contextlib.suppress(OSError):
        os.chdir(cwd)
    out, err = io.StringIO(), io.StringIO()
    value: Any = None
    raised: BaseException | None = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            value = piece()
        except Exception as e:
            raised = e
    return _Done(value, raised, out.getvalue(), err.getvalue())


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


class RayCluster(Executor):
    """Pieces as Ray tasks on a cluster this object connected to (or found connected).
    `shut_down_after`: the command started this Ray and shuts it down when done."""

    distributed = True

    def __init__(self, ray: Any, workers: int, shut_down_after: bool = False) -> None:
        self.ray = ray
        self.workers = workers
        self.shut_down_after = shut_down_after
        self.remote = ray.remote(num_cpus=1, max_retries=0)(_run_piece)

    def node_addresses(self) -> list[str]:
        """The addresses of the cluster's live nodes."""
        return sorted(str(n["NodeManagerAddress"]) for n in self.ray.nodes() if n["Alive"])

    def run(self, pieces: Sequence[Callable[[], R]], *,
            stop: Callable[[R], bool] | None = None,
            on_done: Callable[[int], None] | None = None) -> Iterator[Outcome[R]]:
        ray = self.ray
        from ray.exceptions import RayError

        cwd = os.getcwd()
        running: dict[Any, int] = {}  # ObjectRef -> piece index
        finished: dict[int, Outcome[R] | BaseException] = {}
        cutoff = len(pieces) - 1  # the last piece whose outcome counts
        submitted = given = 0
        interrupted = False
        try:
            while given <= cutoff:
                while submitted <= cutoff and len(running) < self.workers:
                    running[self.remote.remote(cwd, pieces[submitted])] = submitted
                    submitted += 1
                if given not in finished:
                    [ref], _ = ray.wait(list(running), num_returns=1)
                    i = running.pop(ref)
                    try:
                        done: _Done = ray.get(ref)
                    except RayError as e:
                        finished[i] = Outcome(i, None, lost=_first_line(e))
                    else:
                        if done.raised is not None:
                            finished[i] = done.raised
                        else:
                            finished[i] = Outcome(i, done.value, None, done.stdout,
                                                  done.stderr)
                        if (done.raised is not None
                                or (stop is not None and stop(done.value))) and i < cutoff:
                            cutoff = i
                            for later, j in list(running.items()):
                                if j > cutoff:
                                    ray.cancel(later, force=True)
                                    del running[later]
                    if on_done is not None and i <= cutoff:
                        on_done(i)
                while given <= cutoff and given in finished:
                    outcome = finished.pop(given)
                    given += 1
                    if isinstance(outcome, BaseException):
                        raise outcome
                    yield outcome
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            # After ^C a Ray this command started is shut down next, which ends its
            # tasks; cancelling them as well races, in Ray's core worker, with a reply
            # arriving and can abort this process ("Tried to complete task that was not
            # pending", ray-project/ray#54846) instead of its exit 130.
            if not (interrupted and self.shut_down_after):
                for ref in running:
                    ray.cancel(ref, force=True)


class _ReportStdout:
    """Standard output for the main thread; other threads' writes go to standard error.
    Ray's driver prints what its nodes report (a worker that died, with its ids) from a
    thread of its own onto standard output, where the command's report (JSON, say) goes:
    those lines are diagnostics, for standard error."""

    def __init__(self, report: Any) -> None:
        self.report = report

    def _target(self) -> Any:
        if threading.current_thread() is threading.main_thread():
            return self.report
        return sys.stderr

    def write(self, text: str) -> int:
        written: int = self._target().write(text)
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target(), name)


def _descendants(pid: int) -> dict[int, int]:
    """The processes under `pid` (its children, theirs, and so on), each with its start
    time, so that a pid the system hands out again later is not taken for one of them;
    none where there is no /proc to read (then nothing is reaped: Ray's own shutdown
    is all there is)."""
    children: dict[int, list[tuple[int, int]]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    for entry in entries:
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            ppid, started, _ = stat
            children.setdefault(ppid, []).append((int(entry), started))
    found: dict[int, int] = {}
    todo = [pid]
    while todo:
        for child, started in children.get(todo.pop(), []):
            if child not in found:
                found[child] = started
                todo.append(child)
    return found


def _stat(pid: int) -> tuple[int, int, str] | None:
    """A process's parent, start time and state (R, S, Z, ...), from /proc/PID/stat;
    None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    # The command name, in parentheses, may hold spaces and parentheses itself.
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[19]), fields[0]


def _reap(processes: dict[int, int]) -> None:
    """Kill those of `processes` (pid -> start time) that still run, and wait, at most
    REAP_TIMEOUT_S, until they are gone (a child of this process reaped here)."""
    def alive(pid: int) -> bool:
        stat = _stat(pid)
        return stat is not None and stat[1] == processes[pid] and stat[2] not in "ZX"

    left = [pid for pid in processes if alive(pid)]
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + REAP_TIMEOUT_S
    while left and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ChildProcessError):  # not ours: its parent reaps it
                os.waitpid(pid, os.WNOHANG)
        left = [pid for pid in left if alive(pid)]
        if left:
            time.sleep(0.05)


# The signals that stop a run: ^C, and SIGTERM (the command line raises its own
# exception for it, as Python raises KeyboardInterrupt for ^C).
STOPPING = (signal.SIGINT, signal.SIGTERM)


def _handler(signum: int) -> Callable[[int, Any], Any] | None:
    """This process's Python handler of `signum`; None where it has none (the signal is
    ignored, as ^C in a background job, or left to the system) or where this is not
    the main thread (Python takes signals there only)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    handler = signal.getsignal(signum)
    return handler if callable(handler) else None


@contextlib.contextmanager
def _interrupts_held() -> Iterator[list[int]]:
    """^C and SIGTERM held while this runs (where this process handles them): the ones
    that came meanwhile, for the caller to act on after it."""
    came: list[int] = []
    previous = {signum: h for signum in STOPPING if (h := _handler(signum)) is not None}
    for signum in previous:
        signal.signal(signum, lambda signum, _: came.append(signum))
    try:
        yield came
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM taken as ^C while a Ray started here runs, then handed to this process's
    own handler: Ray's start put a handler of its own in place (a C++ stack trace, exit
    1), and out of Ray's calls only a KeyboardInterrupt gets through (another
    exception raised by a signal handler there becomes a SystemError)."""
    own = _handler(signal.SIGTERM)
    if own is None:
        yield
        return
    came: list[int] = []

    def interrupt(signum: int, _: Any) -> None:
        came.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, own)
        if came:
            own(signal.SIGTERM, None)


def _shut_down(ray: Any, before: dict[int, int]) -> None:
    """Ray shut down, and with it every process that it started under this one and that
    outlives its shutdown (not among `before`, this process's descendants before Ray
    started). Ray gives its raylet a second to stop its workers and agents, and kills
    it after that; what it misses can live on for a minute. A second ^C (or a SIGTERM)
    meanwhile is ignored: it must not cut the shutdown short."""
    with _interrupts_held():
        ours = {pid: started for pid, started in _descendants(os.getpid()).items()
                if before.get(pid) != started}
        try:
            ray.shutdown()
        finally:
            _reap(ours)


def _import_ray(option: str) -> Any:
    try:
        import ray
    except ImportError:
        raise ClusterError(f"{option} {NEEDS_RAY}") from None
    return ray


def check_address(address: str) -> None:
    """Refuse an address that is not HOST:PORT, ray://HOST:PORT or auto, or where
    nothing accepts a connection, in one line and within CONNECT_TIMEOUT_S."""
    if address == "auto":
        return
    expected = ("expected HOST:PORT (the head node's address, as `ray start --head` "
                "prints it), ray://HOST:PORT or auto")
    text = address.removeprefix("ray://")
    try:
        parts = urlsplit("//" + text)
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or port is None or parts.path or parts.query or parts.fragment:
        raise ClusterError(f"--ray-address {address!r}: {expected}")
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise ClusterError(f"--ray-address {address}: no Ray cluster answers there "
                           f"({why})") from None


@contextlib.contextmanager
def executor(*, use_ray: bool, workers: int | None, address: str | None
             ) -> Iterator[Executor]:
    """Serial unless Ray is asked for (`use_ray`, `workers` or `address`); then a Ray
    cluster, started here or connected to, shut down (or disconnected) at the end.

    pre: workers is None or workers >= 1
    """
    if not use_ray and workers is None and address is None:
        yield Serial()
        return
    option = ("--ray-address" if address is not None
              else "--workers" if workers is not None else "--ray")
    if address is not None:
        check_address(address)
    else:  # before Ray is imported: it reads them then
        for key, value in LOCAL_ENV.items():
            os.environ.setdefault(key, value)
    ray = _import_ray(option)
    started = False
    before: dict[int, int] = {}
    if not ray.is_initialized():
        before = _descendants(os.getpid())
        # ^C (and SIGTERM) is taken once Ray has started: raised inside its start-up,
        # it can be lost (in a fork's hook, where Python only prints it) or leave a Ray
        # half started, whose processes its shutdown misses.
        with _interrupts_held() as interrupted:
            try:
                if address is None:
                    ray.init(address="local", num_cpus=workers or os.cpu_count() or 1,
                             include_dashboard=False, log_to_driver=False,
                             logging_level=logging.ERROR)
                else:
                    ray.init(address=address, log_to_driver=False,
                             logging_level=logging.ERROR)
            except BaseException as e:  # SIGTERM too: what Ray started so far goes
                _shut_down(ray, before)
                if not isinstance(e, Exception):
                    raise
                where = f"--ray-address {address}" if address else "starting a local Ray"
                raise ClusterError(f"{where}: {_first_line(e)}") from None
        if interrupted:
            _shut_down(ray, before)
            handler = _handler(interrupted[0])
            if handler is not None:  # KeyboardInterrupt, or the command line's own
                handler(interrupted[0], None)
        started = True
    wrapper = _ReportStdout(sys.stdout)  # a text stream's duck
    sys.stdout = wrapper
    with _sigterm_as_interrupt() if started else contextlib.nullcontext():
        try:
            if workers is None:
                workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
            yield RayCluster(ray, workers, shut_down_after=started)
        finally:
            if started:
                # What Ray prints while it shuts down (a worker that died, told as its
                # threads stop, from this thread too) is diagnostics as well.
                sys.stdout = sys.stderr
                _shut_down(ray, before)
            # Ray's threads may still print after this (a worker's death told late, or
            # by a Ray that stays up, as a caller's own does): the wrapper stays, so
            # that their lines never land in the report, which this thread goes on
            # writing.
            sys.stdout = wrapper
