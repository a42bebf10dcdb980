"""Outputs never harm what is at their path (kvsched.outputs), and the exit codes keep
their contract when an output fails: a full disk is bad input's 2 with one line, a reader
that leaves standard output early is 141 (128 + SIGPIPE), silently.

The devices are the machine's own: a test that needs one it lacks is skipped, never run
against a path that is not that device (conftest.py fails the session if one of them is
not a character device at its end).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import IO, cast

import pytest

from kvsched.outputs import Output, OutputError, atomic_output

REQUESTS = ["--requests", "20"]


def kvsched(*args: str, stdout: int | IO[bytes] = subprocess.PIPE
            ) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "kvsched", *args], stdout=stdout,
                          stderr=subprocess.PIPE, timeout=300)


def device(path: str) -> os.stat_result:
    """The status of the machine's device at `path`; the test is skipped without it."""
    if not os.path.exists(path):
        pytest.skip(f"{path} does not exist on this machine")
    status = os.stat(path)
    assert stat.S_ISCHR(status.st_mode), f"{path} is not a character device before the test"
    return status


def still_the_device(path: str, before: os.stat_result) -> bool:
    after = os.stat(path)
    return stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The trace `kvsched simulate --requests 20` writes to a new regular file."""
    path = tmp_path_factory.mktemp("outputs") / "trace.jsonl"
    assert kvsched("simulate", *REQUESTS, "--out", str(path)).returncode == 0
    return path.read_bytes()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-request trace: quick to check, so that hundreds of verdicts are quick."""
    path = tmp_path_factory.mktemp("outputs") / "one.jsonl"
    assert kvsched("simulate", "--requests", "1", "--out", str(path)).returncode == 0
    return path


def test_dev_null_is_a_character_device() -> None:
    if not os.path.lexists("/dev/null"):
        pytest.skip("/dev/null does not exist on this machine")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode), "/dev/null is not a character device"


# -- what is at the path decides how it is written ------------------------------------

def test_simulate_out_dev_null_leaves_it_a_device() -> None:
    before = device("/dev/null")
    result = kvsched("simulate", *REQUESTS, "--out", "/dev/null")
    assert result.returncode == 0, result.stderr
    assert still_the_device("/dev/null", before)
    assert not os.path.lexists("/dev/null.part")


def test_a_fifo_receives_the_trace_and_stays_a_fifo(tmp_path: Path, trace: bytes) -> None:
    if not hasattr(os, "mkfifo"):
        pytest.skip("os.mkfifo: no FIFOs on this platform")
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    result = kvsched("simulate", *REQUESTS, "--out", str(fifo))
    reader.join(timeout=60)
    assert result.returncode == 0, result.stderr
    assert received == [trace]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.fifo"]  # no part file


def test_a_symlink_stays_a_link_and_its_target_gets_the_trace(tmp_path: Path,
                                                              trace: bytes) -> None:
    (tmp_path / "runs").mkdir()
    target = tmp_path / "runs" / "trace.jsonl"
    target.write_text("yesterday's trace\n")
    link = tmp_path / "latest.jsonl"
    link.symlink_to(Path("runs") / "trace.jsonl")
    result = kvsched("simulate", *REQUESTS, "--out", str(link))
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and os.readlink(link) == os.path.join("runs", "trace.jsonl")
    assert target.read_bytes() == trace
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.jsonl", "runs"]
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["trace.jsonl"]


def test_a_dangling_symlink_gets_its_target_made(tmp_path: Path) -> None:
    link = tmp_path / "latest.jsonl"
    link.symlink_to("made.jsonl")
    with atomic_output(link) as stream:
        stream.write(b"a trace\n")
    assert link.is_symlink() and (tmp_path / "made.jsonl").read_bytes() == b"a trace\n"


def test_a_regular_file_is_replaced_by_a_rename(tmp_path: Path, trace: bytes) -> None:
    out = tmp_path / "trace.jsonl"
    out.write_text("yesterday's trace\n")
    out.chmod(0o600)
    kept = tmp_path / "kept.jsonl"
    os.link(out, kept)  # a second name for the old file: a rename leaves it alone
    result = kvsched("simulate", *REQUESTS, "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == trace
    assert kept.read_text() == "yesterday's trace\n"  # not written in place
    assert stat.S_IMODE(out.stat().st_mode) == 0o600  # the permission bits it had
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.jsonl", "trace.jsonl"]


def test_a_link_to_a_device_writes_the_device_in_place(tmp_path: Path) -> None:
    before = device("/dev/null")
    link = tmp_path / "discard"
    link.symlink_to("/dev/null")
    with atomic_output(link) as stream:
        stream.write(b"gone\n")
    assert link.is_symlink() and still_the_device("/dev/null", before)
    assert list(tmp_path.iterdir()) == [link]


def test_a_failure_keeps_the_old_file_and_leaves_no_part_file(tmp_path: Path) -> None:
    out = tmp_path / "trace.jsonl"
    out.write_text("yesterday's trace\n")
    with pytest.raises(KeyboardInterrupt), atomic_output(out) as stream:
        stream.write(b"half of today's")
        raise KeyboardInterrupt
    assert out.read_text() == "yesterday's trace\n"
    assert list(tmp_path.iterdir()) == [out]


def test_a_stale_part_link_is_never_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "trace.jsonl.part").symlink_to(victim)
    with atomic_output(tmp_path / "trace.jsonl") as stream:
        stream.write(b"a trace\n")
    assert victim.read_text() == "precious\n"
    assert (tmp_path / "trace.jsonl").read_bytes() == b"a trace\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.jsonl", "victim.txt"]


def test_a_directory_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(OutputError) as caught:
        Output(tmp_path)
    assert str(caught.value) == f"{tmp_path}: is a directory; expected a file to write"


# -- a full disk: exit 2, one line ----------------------------------------------------

def test_out_to_a_full_device_is_exit_2_in_one_line() -> None:
    before = device("/dev/full")
    result = kvsched("simulate", *REQUESTS, "--out", "/dev/full")
    assert result.returncode == 2
    assert result.stderr == b"kvsched: error: /dev/full: no space left on device\n"
    assert still_the_device("/dev/full", before)


def test_standard_output_on_a_full_device_is_exit_2_in_one_line() -> None:
    before = device("/dev/full")
    with open("/dev/full", "wb") as full:
        result = kvsched("simulate", *REQUESTS, "--format", "json", stdout=full)
    assert result.returncode == 2
    assert result.stderr == b"kvsched: error: standard output: no space left on device\n"
    assert still_the_device("/dev/full", before)


def test_a_full_disk_under_a_recording_is_one_adapter_error() -> None:
    before = device("/dev/full")
    from test_adapter_vllm import CONFIG, EVENTS, SMALL

    from kvsched.adapters.recording import AdapterError, Job
    from kvsched.adapters.vllm import ENGINE as VLLM

    with pytest.raises(AdapterError) as caught:
        VLLM.assemble([Job("t", CONFIG, SMALL, Path("/dev/full"))], iter(EVENTS))
    assert str(caught.value) == "/dev/full: no space left on device"
    assert still_the_device("/dev/full", before)


# -- a reader that leaves: exit 141 ---------------------------------------------------

@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_reader_leaving_early_is_exit_141_without_noise(tiny: Path, fmt: str) -> None:
    # 600 verdicts, over 100 kB in either format: more than a pipe and the reader's buffer
    # hold, so that kvsched still has some to write after the reader left.
    proc = subprocess.Popen([sys.executable, "-m", "kvsched", "check", "--format", fmt,
                             *[str(tiny)] * 600], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=300) == 141
    assert (first == b"[\n") if fmt == "json" else first.startswith(f"OK {tiny}: ".encode())
    assert stderr.count(b"\n") <= 1 and b"Traceback" not in stderr
    assert b"Exception ignored" not in stderr and b"BrokenPipeError" not in stderr


# -- the session's guard --------------------------------------------------------------

def test_the_session_fails_when_a_device_was_written_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import conftest

    broken = tmp_path / "null"
    broken.write_text("a trace\n")  # what a rename over /dev/null leaves
    monkeypatch.setattr(conftest, "SYSTEM_DEVICES", (str(broken),))
    session = SimpleNamespace(
        exitstatus=0, config=SimpleNamespace(
            stash={conftest.DEVICES_AT_START: {str(broken): True}},
            pluginmanager=SimpleNamespace(get_plugin=lambda name: None)))
    conftest.pytest_sessionfinish(cast(pytest.Session, session), 0)
    assert session.exitstatus == pytest.ExitCode.TESTS_FAILED
    assert capsys.readouterr().err == (f"kvsched tests: {broken} is not a character device "
                                       "(it was one when the session started: a test "
                                       "wrote over it)\n")
