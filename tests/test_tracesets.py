"""The traces kvsched check's arguments name: directories (their trace files at any
depth, sorted), quoted patterns kvsched expands, @list files (one argument a line), in
the order given; an argument that names nothing is one line of bad input, exit 2, with
nothing written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvsched.testing.trace_sets import BROKEN, CLEAN, mixed_set
from kvsched.tracesets import TraceSetError, expand


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mixed_set(tmp_path_factory.mktemp("sets") / "traces")


def test_a_directory_stands_for_its_trace_files_at_any_depth(traces: Path) -> None:
    found = expand([str(traces)])
    broken = [str(traces / "broken" / f"{b}.jsonl") for b in sorted(BROKEN)]
    clean = [str(traces / "clean" / f"{c}.jsonl.gz") for c in sorted(CLEAN)]
    assert found == [*broken, *clean, str(traces / "malformed.jsonl"),
                     str(traces / "no-header.jsonl")]  # no README.md, no notes.txt


def test_arguments_expand_in_their_order(traces: Path) -> None:
    one = str(traces / "malformed.jsonl")
    assert expand([one, str(traces / "clean"), one]) == [
        one, *sorted(str(p) for p in (traces / "clean").glob("*.gz")), one]
    assert expand([str(traces / "broken" / "s*.jsonl")]) == [
        str(traces / "broken" / "seq-limit-ignored.jsonl")]
    assert expand([str(traces / "**" / "*.gz")]) == sorted(
        str(p) for p in (traces / "clean").glob("*.gz"))
    assert expand(["-", "missing.jsonl"]) == ["-", "missing.jsonl"]  # each checked alone


def test_a_list_file_holds_one_argument_a_line(traces: Path, tmp_path: Path) -> None:
    listed = tmp_path / "list.txt"
    listed.write_text(f"# nightly\n\n  {traces / 'clean'}  \n{traces / 'broken' / 'se*'}\n")
    assert expand([f"@{listed}"]) == [
        *sorted(str(p) for p in (traces / "clean").glob("*.gz")),
        str(traces / "broken" / "seq-limit-ignored.jsonl")]


def test_a_list_file_may_name_another(traces: Path, tmp_path: Path) -> None:
    inner, outer = tmp_path / "inner.txt", tmp_path / "outer.txt"
    inner.write_text(f"{traces / 'broken' / 'se*'}\n")
    outer.write_text(f"@{inner}\n{traces / 'malformed.jsonl'}\n@{inner}\n")
    seq = str(traces / "broken" / "seq-limit-ignored.jsonl")
    assert expand([f"@{outer}"]) == [seq, str(traces / "malformed.jsonl"), seq]


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: [str(d / "empty")],
     "{d}/empty: no trace files (*.jsonl, *.jsonl.gz, *.jsonl.zst) in this directory"),
    (lambda d: [str(d / "*.nothing")], "{d}/*.nothing: no file matches this pattern"),
    (lambda d: [f"@{d / 'absent.txt'}"],
     "@{d}/absent.txt: cannot read the list file (No such file or directory)"),
    (lambda d: [f"@{d / 'blank.txt'}"],
     "@{d}/blank.txt: the list names no traces (expected one trace path per line)"),
    (lambda d: [f"@{d / 'stale.txt'}"],
     "{d}/stale.txt: line 2: gone.jsonl: no such file or directory"),
    (lambda d: [f"@{d / 'binary.txt'}"],
     "{d}/binary.txt: line 2: not UTF-8 text; expected one trace path per line"),
    (lambda d: ["@"], "@: expected a list file after @"),
    (lambda d: [f"@{d}"], "@{d}: is a directory; expected a list file"),
    (lambda d: [f"@{d / 'self.txt'}"],
     "{d}/self.txt: line 2: @{d}/self.txt: the list file names itself"),
    (lambda d: [f"@{d / 'a.txt'}"],
     "{d}/b.txt: line 1: @{d}/a.txt: lists nest in a cycle: {d}/a.txt -> {d}/b.txt -> "
     "{d}/a.txt"),
])
def test_an_argument_that_names_nothing_is_one_line(
        tmp_path: Path, traces: Path, cli: Callable[..., Any],
        make: Callable[[Path], list[str]], message: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "blank.txt").write_text("\n# nothing\n")
    (tmp_path / "stale.txt").write_text(f"{traces / 'malformed.jsonl'}\ngone.jsonl\n")
    (tmp_path / "binary.txt").write_bytes(b"a.jsonl\n\xff\n")
    (tmp_path / "self.txt").write_text(f"{traces / 'malformed.jsonl'}\n@{tmp_path}/self.txt\n")
    (tmp_path / "a.txt").write_text(f"@{tmp_path / 'b.txt'}\n")
    (tmp_path / "b.txt").write_text(f"@{tmp_path / 'a.txt'}\n")
    args, expected = make(tmp_path), message.format(d=tmp_path)
    with pytest.raises(TraceSetError) as caught:
        expand(args)
    assert str(caught.value).startswith(expected)
    junit = tmp_path / "report.xml"
    ran = cli("check", str(traces / "malformed.jsonl"), *args, "--junit", str(junit),
              "--repro-dir", str(tmp_path / "repro"))
    assert ran.exit_code == 2 and ran.stdout == ""
    assert ran.stderr.startswith(f"kvsched: error: {expected}")
    assert ran.stderr.count("\n") == 1
    assert not junit.exists() and not (tmp_path / "repro").exists()
    assert not list(tmp_path.glob("*.part"))


def test_check_of_a_directory_gives_every_trace_its_verdict(traces: Path,
                                                            cli: Callable[..., Any]) -> None:
    ran = cli("check", str(traces))
    assert ran.exit_code == 2  # the worst: two malformed traces
    assert ran.stdout.count("FAIL ") == len(BROKEN) and ran.stdout.count("OK ") == len(CLEAN)
    assert ran.stderr.count("kvsched: error: ") == 2
