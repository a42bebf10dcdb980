"""^C during `kvsched check --workers 2`: exit 130 with one line, `kvsched: aborted`, no
report written, and nothing left running: the local Ray the command started (its GCS,
raylet, agents and workers) goes with it.

The command runs as a process of its own session, as a terminal's foreground job does;
^C is sent to its whole process group, as a terminal sends it, while Ray starts and
while the traces are being checked, and then to the command alone (`kill -INT`);
SIGTERM (`kill`) sent to it while the traces are checked ends the run alike, with exit
143 and `kvsched: terminated`.
What outlives it is read from /proc: the processes of that session.
"""

from __future__ import annotations

import importlib.util
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kvsched.testing.trace_sets import write_trace

pytestmark = [pytest.mark.xdist_group("ray"),
              pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                 reason="reads processes from /proc")]
if importlib.util.find_spec("ray") is None:
    pytest.skip("the Ray tests need the ray extra", allow_module_level=True)

# Bounds on waiting for the command, so that a hang fails the test instead of the run.
START_S = 180.0
STOP_S = 60.0
# How long after the command's exit a process of its session may still be ending.
GRACE_S = 5.0
COPIES = 8  # traces still being checked when ^C comes: a few seconds each


def session_processes(sid: int) -> list[str]:
    """The processes of session `sid` that have not ended (zombies have ended), as
    "PID COMMAND LINE"."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        state, _, _, session = stat[stat.rindex(")") + 2:].split()[:4]
        if int(session) == sid and state not in "ZX":
            command = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
            found.append(f"{entry} {command}")
    return found


def read_until_verdict(process: subprocess.Popen[bytes]) -> bytes:
    """Standard output up to the first verdict line (the first trace checked)."""
    assert process.stdout is not None
    got = b""
    deadline = time.monotonic() + START_S
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while b"\n" not in got and time.monotonic() < deadline:
            if selector.select(timeout=1.0):
                chunk = os.read(process.stdout.fileno(), 4096)
                if not chunk:
                    break
                got += chunk
    return got


def ray_started(process: subprocess.Popen[bytes]) -> bytes:
    """Nothing, once the command's local Ray has its raylet (Ray is still starting)."""
    deadline = time.monotonic() + START_S
    while not any("raylet" in p for p in session_processes(process.pid)):
        if process.poll() is not None or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return b""


COMMAND = "import sys; from kvsched.cli import main; sys.argv[0] = 'kvsched'; main()"


CHECKING = b"OK traces/a.jsonl: "
ABORTED = (signal.SIGINT, 130, "kvsched: aborted")


@pytest.mark.parametrize(("wait", "expected", "to_group", "stop"), [
    (ray_started, b"", True, ABORTED), (read_until_verdict, CHECKING, True, ABORTED),
    (read_until_verdict, CHECKING, False, ABORTED),
    (read_until_verdict, CHECKING, False, (signal.SIGTERM, 143, "kvsched: terminated"))],
    ids=["ctrl-c-while-ray-starts", "ctrl-c-while-checking", "kill-int-while-checking",
         "sigterm-while-checking"])
def test_ctrl_c_under_workers_exits_130_and_leaves_nothing_running(
        wait: Callable[[subprocess.Popen[bytes]], bytes], expected: bytes, to_group: bool,
        stop: tuple[int, int, str], tmp_path: Path, cli: Callable[..., object]) -> None:
    signum, code, message = stop
    traces = tmp_path / "traces"
    write_trace(traces / "a.jsonl", "over-admit-by-one-block", reference=True)
    cli("simulate", "--requests", "1500", "--out", str(tmp_path / "big.jsonl"))
    for i in range(COPIES):
        os.link(tmp_path / "big.jsonl", traces / f"b{i}.jsonl")
    junit = tmp_path / "report.xml"
    process = subprocess.Popen(
        [sys.executable, "-c", COMMAND, "check", "--workers", "2", "traces",
         "--junit", str(junit)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
        # ^C is taken even where this test runs with it ignored (a background job).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        got = wait(process)
        assert got.startswith(expected) and process.poll() is None, got
        if to_group:
            os.killpg(process.pid, signum)  # as a terminal's ^C
        else:
            process.send_signal(signum)
        _, stderr = process.communicate(timeout=STOP_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert (process.returncode, stderr.decode().strip()) == (code, message), stderr.decode()
    # No report: the check was cut short (and no report.xml.part either).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.jsonl", "traces"]
    deadline = time.monotonic() + GRACE_S
    while (left := session_processes(process.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == []
