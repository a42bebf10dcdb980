"""A read error is that input's verdict, many traces end with one summary line, and an
output that cannot be written is told before any work starts.

/proc/self/mem answers a read at offset 0 with EIO on Linux: a file that opens and
then cannot be read, as a failing disk or a network file system's file can be.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Ran
from test_bad_input import HEADER

from kvsched.inputs import InputError, open_trace
from kvsched.outputs import Output, OutputError, check_writable, check_writable_directory

UNREADABLE = "/proc/self/mem"
READ_ERROR = f"kvsched: error: {UNREADABLE}: cannot read (Input/output error)"
KERNEL_FILE = "/proc/version"  # exists, a regular file, where no file can be made beside it

ARRIVE = {"step": 0, "arrivals": [{"id": "r1", "prompt_len": 5, "max_tokens": 1}],
          "scheduled": [["r1", 5]], "finished": ["r1"]}
UNKNOWN = {"step": 0, "scheduled": [["ghost", 5]]}  # one-state: never arrived

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="/proc/self/mem and /proc are Linux's")

Cli = Callable[..., Ran]


def write_lines(path: Path, *objs: object) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs), encoding="utf-8")
    return path


@pytest.fixture
def good(tmp_path: Path) -> Path:
    return write_lines(tmp_path / "good.jsonl", HEADER, ARRIVE, {"end": True})


@pytest.fixture
def bad(tmp_path: Path) -> Path:
    return write_lines(tmp_path / "bad.jsonl", HEADER, UNKNOWN, {"end": True})


def kvsched(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


def unreadable() -> None:
    """Skip where /proc/self/mem is not there to give EIO."""
    try:
        with open(UNREADABLE, "rb") as f:
            f.read(1)
    except OSError:
        return
    pytest.skip(f"{UNREADABLE} reads here")


def vectorized_or_skip() -> None:
    from kvsched.implementations import Unavailable, require_checker

    try:
        require_checker("vectorized")
    except Unavailable as e:
        pytest.skip(str(e))


# -- a read error is that trace's verdict ---------------------------------------------

def test_opening_an_unreadable_file_is_one_input_error() -> None:
    unreadable()
    with pytest.raises(InputError) as caught:
        open_trace(UNREADABLE)
    assert str(caught.value) == f"{UNREADABLE}: cannot read (Input/output error)"


@pytest.mark.parametrize("checker", ["spec", "vectorized"])
def test_an_unreadable_trace_is_its_verdict_and_the_others_are_still_reported(
        tmp_path: Path, good: Path, checker: str) -> None:
    unreadable()
    if checker == "vectorized":
        vectorized_or_skip()
    junit = tmp_path / "report.xml"
    ran = kvsched("check", "--checker", checker, str(good), UNREADABLE, str(good),
                  "--junit", str(junit), "--format", "json")
    assert ran.returncode == 2
    assert ran.stderr == READ_ERROR + "\n"
    verdicts = json.loads(ran.stdout)
    assert [(v["trace"], v["ok"]) for v in verdicts] == [
        (str(good), True), (UNREADABLE, False), (str(good), True)]
    assert verdicts[1]["malformed"] == f"{UNREADABLE}: cannot read (Input/output error)"
    suites = ET.parse(junit).getroot().findall("testsuite")
    assert [s.get("name") for s in suites] == [str(good), UNREADABLE, str(good)]
    assert suites[1].get("errors") == "1"


def test_an_unreadable_trace_in_a_list_file_is_its_verdict(cli: Cli, tmp_path: Path,
                                                          good: Path) -> None:
    unreadable()
    listing = tmp_path / "traces.txt"
    listing.write_text(f"{UNREADABLE}\n{good}\n", encoding="utf-8")
    ran = cli("check", f"@{listing}")
    assert ran.exit_code == 2
    assert ran.stderr == READ_ERROR + "\n"
    assert ran.stdout.startswith(f"OK {good}: ")


def test_an_unreadable_list_file_is_one_line(cli: Cli) -> None:
    unreadable()
    ran = cli("check", f"@{UNREADABLE}")
    assert (ran.exit_code, ran.stdout) == (2, "")
    assert ran.stderr == (f"kvsched: error: @{UNREADABLE}: cannot read the list file "
                          "(Input/output error)\n")


def test_metrics_of_an_unreadable_trace_is_one_line() -> None:
    unreadable()
    ran = kvsched("metrics", UNREADABLE)
    assert (ran.returncode, ran.stdout) == (2, "")
    assert ran.stderr == READ_ERROR + "\n"


# -- many traces end with one summary line ---------------------------------------------

SUMMARY = re.compile(r"checked (\d+) traces? in \d+\.\d\ds: (\d+) OK, (\d+) failed, "
                     r"(\d+) errors?, (\d+) not checked")


def test_several_traces_end_with_one_summary_line(cli: Cli, tmp_path: Path, good: Path,
                                                  bad: Path) -> None:
    malformed = tmp_path / "malformed.jsonl"
    malformed.write_text("not json\n", encoding="utf-8")
    ran = cli("check", str(good), str(bad), str(malformed), str(good))
    assert ran.exit_code == 2
    last = ran.stdout.splitlines()[-1]
    found = SUMMARY.fullmatch(last)
    assert found is not None, last
    assert found.groups() == ("4", "2", "1", "1", "0")
    assert sum(SUMMARY.fullmatch(line) is not None for line in ran.stdout.splitlines()) == 1


def test_one_trace_and_json_get_no_summary_line(cli: Cli, good: Path) -> None:
    one = cli("check", str(good))
    assert one.exit_code == 0
    assert not any(SUMMARY.fullmatch(line) for line in one.stdout.splitlines())
    many = cli("check", str(good), str(good), "--format", "json")
    assert many.exit_code == 0
    assert [v["ok"] for v in json.loads(many.stdout)] == [True, True]  # a plain list


# -- outputs that cannot be written are told before any work ---------------------------

def test_an_unwritable_junit_is_told_before_any_trace_is_checked(cli: Cli, good: Path
                                                                 ) -> None:
    ran = cli("check", str(good), "--junit", KERNEL_FILE)
    assert (ran.exit_code, ran.stdout) == (2, "")  # no verdict: nothing was checked
    assert ran.stderr == (f"kvsched: error: {KERNEL_FILE}: cannot write (/proc is on the "
                          "kernel's proc file system, where no file can be made)\n")


def test_a_missing_directory_is_named_and_not_made(cli: Cli, tmp_path: Path, good: Path
                                                   ) -> None:
    missing = tmp_path / "no" / "such"
    ran = cli("check", str(good), "--junit", str(missing / "report.xml"))
    assert (ran.exit_code, ran.stdout) == (2, "")
    assert ran.stderr == (f"kvsched: error: {missing}/report.xml: cannot write (the "
                          f"directory {missing} does not exist)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.jsonl"]


def test_an_unwritable_repro_dir_is_told_before_any_trace_is_checked(cli: Cli, bad: Path
                                                                     ) -> None:
    ran = cli("check", str(bad), "--repro-dir", "/proc/kvsched-repro")
    assert (ran.exit_code, ran.stdout) == (2, "")
    assert ran.stderr.startswith("kvsched: error: /proc/kvsched-repro: cannot write in it "
                                 "(/proc is on the kernel's proc file system")


@pytest.mark.parametrize("args", [
    ["simulate", "--requests", "2", "--out", KERNEL_FILE],
    ["metrics", "TRACE", "--plot", KERNEL_FILE],
    ["diff", "vllm-v1", "vllm-v1@0.32", "--requests", "2", "--out-a", KERNEL_FILE],
    ["fuzz", "no_such_module:factory", "--out", KERNEL_FILE],
    ["fuzz", "no_such_module:factory", "--junit", KERNEL_FILE],
    ["record", "vllm", "--workload", "/no/such/workload.jsonl", "--out", KERNEL_FILE],
    ["record", "sglang", "--workload", "/no/such/workload.jsonl", "--out", KERNEL_FILE],
], ids=["simulate", "metrics", "diff", "fuzz-out", "fuzz-junit", "record-vllm",
        "record-sglang"])
def test_every_command_checks_its_outputs_first(cli: Cli, good: Path,
                                                args: list[str]) -> None:
    ran = cli(*[str(good) if a == "TRACE" else a for a in args])
    assert (ran.exit_code, ran.stdout) == (2, "")
    assert ran.stderr == (f"kvsched: error: {KERNEL_FILE}: cannot write (/proc is on the "
                          "kernel's proc file system, where no file can be made)\n")


def test_fuzz_checks_the_sidecar_of_its_out(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "min.config.json").mkdir()
    ran = cli("fuzz", "no_such_module:factory", "--out", str(tmp_path / "min.jsonl"))
    assert ran.exit_code == 2
    assert ran.stderr == (f"kvsched: error: {tmp_path}/min.config.json: is a directory; "
                          "expected a file to write\n")


def test_the_probe_makes_and_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "old.jsonl").write_text("kept\n", encoding="utf-8")
    before = sorted(os.listdir(tmp_path))
    check_writable(tmp_path / "old.jsonl")
    check_writable(tmp_path / "new.jsonl")
    check_writable_directory(tmp_path / "a" / "b")
    check_writable("/dev/null")
    assert sorted(os.listdir(tmp_path)) == before
    assert (tmp_path / "old.jsonl").read_text(encoding="utf-8") == "kept\n"


def test_the_probe_names_each_reason(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("", encoding="utf-8")
    cases = {
        str(tmp_path / "file" / "x.xml"): f"cannot write ({tmp_path}/file is not a directory)",
        str(tmp_path): "is a directory; expected a file to write",
        "/sys/kvsched.xml": "cannot write (/sys is on the kernel's sysfs file system, where "
                            "no file can be made)",
    }
    for path, reason in cases.items():
        with pytest.raises(OutputError) as caught:
            check_writable(path)
        assert str(caught.value) == f"{path}: {reason}"
    with pytest.raises(OutputError) as caught:
        check_writable_directory(tmp_path / "file")
    assert str(caught.value) == (f"{tmp_path}/file: is not a directory; expected a "
                                 "directory to write in")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write any directory")
def test_a_directory_without_write_permission_is_permission_denied(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    with pytest.raises(OutputError) as caught:
        check_writable(locked / "report.xml")
    assert str(caught.value) == (f"{locked}/report.xml: cannot write (permission denied: "
                                 f"no new file can be made in {locked})")


def test_writing_a_kernel_file_says_why_not_no_such_file() -> None:
    with pytest.raises(OutputError) as caught:
        Output(KERNEL_FILE)
    assert "No such file" not in str(caught.value)
    assert str(caught.value) == (f"{KERNEL_FILE}: cannot write (/proc is on the kernel's "
                                 "proc file system, where no file can be made)")
