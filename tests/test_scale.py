"""kvsched check and kvsched fuzz on Ray: the same verdicts, order, exit code and reports
(text, JSON, JUnit) as the serial run, on clean, violating and malformed traces; the
same shards and first finding of a fuzz campaign; a worker that dies reported for its
trace; a local Ray on the loopback address only.

One local Ray of two CPUs serves the whole session (`ray_cluster`), started through
kvsched.cluster as the command line starts one, and shut down at the end even when a
test fails. The Ray tests share one xdist worker (group `ray`), so one Ray runs at a
time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvsched.cluster import Executor, RayCluster, executor
from kvsched.testing.trace_sets import BROKEN, CLEAN, mixed_set

pytestmark = pytest.mark.xdist_group("ray")
if importlib.util.find_spec("ray") is None:
    pytest.skip("the Ray tests need the ray extra", allow_module_level=True)

USER_MODULE = '''
from kvsched.testing.seeded_bugs import SEEDED_BUGS

over_admit = SEEDED_BUGS["over-admit-by-one-block"].factory
'''


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Executor]:
    # Ray is imported by kvsched.cluster, after the settings of a local instance.
    with executor(use_ray=True, workers=2, address=None) as cluster:
        yield cluster
    import ray
    assert not ray.is_initialized()


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mixed_set(tmp_path_factory.mktemp("scale") / "traces")


def without_times(xml: str) -> str:
    root = ET.fromstring(xml)
    for element in root.iter():
        element.attrib.pop("time", None)
    return ET.tostring(root, encoding="unicode")


def without_time(text: str) -> str:
    """`kvsched check`'s text with its summary line's time taken out."""
    return re.sub(r"^(checked \d+ traces) in \d+\.\d+s:", r"\1:", text, flags=re.M)


def test_a_local_ray_listens_on_the_loopback_address_only(ray_cluster: Executor) -> None:
    assert isinstance(ray_cluster, RayCluster) and ray_cluster.workers == 2
    assert ray_cluster.node_addresses() == ["127.0.0.1"]
    assert os.environ["RAY_USAGE_STATS_ENABLED"] == "0"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_check_on_ray_is_the_serial_check(ray_cluster: Executor, traces: Path,
                                          tmp_path: Path, cli: Callable[..., Any],
                                          fmt: str) -> None:
    runs = {}
    for mode, extra in (("serial", []), ("ray", ["--workers", "2"])):
        junit, repro = tmp_path / f"{mode}.xml", tmp_path / f"repro-{mode}"
        ran = cli("check", str(traces), "--format", fmt, "--junit", str(junit),
                  "--repro-dir", str(repro), *extra)
        runs[mode] = (ran, junit.read_text(), {p.relative_to(repro): p.read_bytes()
                                               for p in repro.rglob("*.jsonl")})
    (serial, serial_xml, serial_repros), (on_ray, ray_xml, ray_repros) = runs.values()
    assert serial.exit_code == on_ray.exit_code == 2  # the worst: malformed traces
    assert without_time(on_ray.stdout) == without_time(serial.stdout).replace("repro-serial",
                                                                              "repro-ray")
    assert on_ray.stderr == serial.stderr
    assert without_times(ray_xml) == without_times(serial_xml).replace("repro-serial",
                                                                         "repro-ray")
    assert ray_repros == serial_repros and len(serial_repros) == len(BROKEN)
    # Every trace is in every report, in the order of their paths.
    names = sorted(str(p) for p in traces.rglob("*.jsonl*"))
    assert len(names) == len(BROKEN) + len(CLEAN) + 2
    suites = [s.get("name") for s in ET.fromstring(ray_xml).iter("testsuite")]
    assert suites == names
    malformed = [n for n in names if not n.endswith(".gz") and "broken" not in n]
    if fmt == "json":
        verdicts = json.loads(on_ray.stdout)
        assert [v["trace"] for v in verdicts] == names
        assert {v["trace"] for v in verdicts if "malformed" in v} == set(malformed)
        assert {v["trace"] for v in verdicts if v["ok"]} == {n for n in names
                                                             if n.endswith(".gz")}
    else:
        for name in names:
            assert (name in on_ray.stderr) if name in malformed else (name in on_ray.stdout)
        assert [line.split()[1].rstrip(":") for line in on_ray.stdout.splitlines()
                if line.startswith(("OK ", "FAIL "))] == [n for n in names
                                                          if n not in malformed]


def test_ray_verdicts_equal_serial_for_each_option(ray_cluster: Executor, traces: Path,
                                                  cli: Callable[..., Any]) -> None:
    broken = traces / "broken"
    for options in (["--strict", "--require", "block-ids"], ["--profile", "vllm-v1"]):
        serial = cli("check", "--format", "json", str(broken), *options)
        on_ray = cli("check", "--format", "json", str(broken), "--ray", *options)
        assert (on_ray.exit_code, on_ray.stdout) == (serial.exit_code, serial.stdout) == (
            1, serial.stdout)


def test_a_list_file_on_ray(ray_cluster: Executor, traces: Path, tmp_path: Path,
                            cli: Callable[..., Any]) -> None:
    listed = [traces / "clean", traces / "broken" / "seq-limit-ignored.jsonl"]
    list_file = tmp_path / "traces.txt"
    list_file.write_text("# the clean ones, then one broken\n\n"
                         + "".join(f"{p}\n" for p in listed))
    on_ray = cli("check", f"@{list_file}", "--workers", "2", "--format", "json")
    assert on_ray.exit_code == 1
    assert [v["trace"] for v in json.loads(on_ray.stdout)] == [
        *sorted(str(p) for p in (traces / "clean").glob("*.gz")), str(listed[1])]


def kill_the_reader_of(fifo: Path, killed: list[int]) -> None:
    """Once a process below this one opens `fifo`, kill it (the Ray worker checking it),
    then let go of the pipe."""
    with fifo.open("wb"):  # returns once the worker has opened it to read
        me = os.getpid()
        for pid in (int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()):
            try:
                opened = any(os.readlink(fd) == str(fifo)
                             for fd in (Path("/proc") / str(pid) / "fd").iterdir())
            except OSError:
                continue
            if opened and me in ancestors(pid):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)


def ancestors(pid: int) -> list[int]:
    out = []
    while pid > 1:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        out.append(pid)
    return out


def test_a_worker_that_dies_is_reported_for_its_trace(ray_cluster: Executor, traces: Path,
                                                      tmp_path: Path,
                                                      cli: Callable[..., Any]) -> None:
    fifo = tmp_path / "stuck.jsonl"
    os.mkfifo(fifo)
    killed: list[int] = []
    killer = threading.Thread(target=kill_the_reader_of, args=(fifo, killed))
    killer.start()
    clean = sorted(str(p) for p in (traces / "clean").glob("*.gz"))[:2]
    junit = tmp_path / "report.xml"
    on_ray = cli("check", clean[0], str(fifo), clean[1], "--workers", "2", "--format",
                 "json", "--junit", str(junit))
    killer.join(timeout=60)
    assert len(killed) == 1
    assert on_ray.exit_code == 3
    first, lost, last = json.loads(on_ray.stdout)  # Ray's own notes are not on stdout
    assert first["ok"] and last["ok"] and (first["trace"], last["trace"]) == tuple(clean)
    assert lost["trace"] == str(fifo) and not lost["ok"]
    assert lost["lost"].startswith("WorkerCrashedError: ")
    assert (f"kvsched: {fifo}: not checked: its Ray task was lost ({lost['lost']})\n"
            in on_ray.stderr)
    suite = [s for s in ET.parse(junit).getroot().iter("testsuite")
             if s.get("name") == str(fifo)]
    [case] = suite[0].iter("testcase")
    error = case.find("error")
    assert case.get("name") == "check" and error is not None and error.get("type") == "lost"


def fuzz_report(cli: Callable[..., Any], module: Path, *args: str) -> tuple[Any, Any]:
    here = os.getcwd()
    os.chdir(module)  # the user's module is found from the current directory
    try:
        ran = cli("fuzz", "user_engine:over_admit", "--examples", "200", "--shard-examples",
                  "20", "--format", "json", *args)
    finally:
        os.chdir(here)
    return ran, json.loads(ran.stdout)


def test_fuzz_on_ray_finds_the_serial_first_finding(ray_cluster: Executor, tmp_path: Path,
                                                   cli: Callable[..., Any]) -> None:
    (tmp_path / "user_engine.py").write_text(USER_MODULE)
    serial, expected = fuzz_report(cli, tmp_path, "--out", "serial.jsonl",
                                   "--junit", "serial.xml")
    on_ray, got = fuzz_report(cli, tmp_path, "--out", "ray.jsonl", "--workers", "2",
                              "--junit", "ray.xml")
    assert serial.exit_code == on_ray.exit_code == 1
    # Seed 0's first shard finds nothing; the second does, and ends the campaign.
    assert [s["finding"] is not None for s in got["shards"]] == [False, True]
    assert len(got["not_run"]) == 8 and got["found_by_shard"] == 1
    assert got["finding"]["invariant"] == "kv-budget"
    for key in ("workload_file", "config_file", "reproduce"):
        got[key] = got[key].replace("ray.", "serial.")
    assert got == expected
    assert (tmp_path / "ray.jsonl").read_text() == (tmp_path / "serial.jsonl").read_text()
    assert (without_times((tmp_path / "ray.xml").read_text()).replace("ray.", "serial.")
            == without_times((tmp_path / "serial.xml").read_text()))
    suite = ET.parse(tmp_path / "ray.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "10"
    assert (suite.get("failures"), suite.get("skipped")) == ("1", "8")
    # The shard that found it finds it alone, as the report says.
    alone = got["found_alone_by"].split()
    assert alone[:3] == ["kvsched", "fuzz", "user_engine:over_admit"]
    shard = got["shards"][1]
    _, single = fuzz_report(cli, tmp_path, *alone[3:], "--out", "alone.jsonl")
    assert single["shards"] == [shard | {"shard": 0}]
    assert (tmp_path / "alone.jsonl").read_text() == (tmp_path / "serial.jsonl").read_text()


def test_the_command_starts_its_own_local_ray(tmp_path: Path, traces: Path) -> None:
    """Without a Ray in the process, --workers starts a local one and shuts it down."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    clean = traces / "clean"
    started = time.monotonic()
    results = [subprocess.run([sys.executable, "-m", "kvsched", "check", str(clean), *extra],
                              capture_output=True, text=True, timeout=300, env=env)
               for extra in ([], ["--workers", "2"])]
    serial, on_ray = results
    assert on_ray.returncode == serial.returncode == 0, on_ray.stderr
    assert (without_time(on_ray.stdout), on_ray.stderr) == (without_time(serial.stdout),
                                                             serial.stderr)
    assert on_ray.stdout.count("OK ") == len(CLEAN)
    assert time.monotonic() - started < 120
