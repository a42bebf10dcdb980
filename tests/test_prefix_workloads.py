"""Shared prefixes in workloads: the `prefix` field, its nesting, and content keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsched.spec.prefix import block_key, keys
from kvsched.workload import WorkItem, WorkloadError, item_dict, read_workload, validate


def test_a_conversation_nests_its_turns_and_keys_agree_across_them() -> None:
    turn1 = WorkItem("t1", 0, 120, 20, 20, prefix=("sys", 96))
    turn2 = WorkItem("t2", 5, 200, 10, 10, prefix=("t1", 140))
    other = WorkItem("o", 1, 100, 5, 5, prefix=("sys", 96))
    items = {w.id: w for w in validate([turn2, other, turn1])}
    assert items["t2"].shared == (("sys", 96), ("t1", 140))
    t1, t2, o = (items[k].request(0) for k in ("t1", "t2", "o"))
    bs = 16
    # Blocks 0..5 lie in the system prompt: the same key for all three requests.
    assert keys("t1", t1.prefix, 6, bs) == keys("t2", t2.prefix, 6, bs) == keys(
        "o", o.prefix, 6, bs)
    # Blocks 6..8 are t1's own (prompt 120, then outputs); t2 takes 6 and 7 as t1's, but
    # block 8 ends at token 144, past the 140 it shares: t2's own from there.
    assert [block_key("t1", t1.prefix, i, bs) for i in (6, 7, 8)] == ["t1/6", "t1/7", "t1/8"]
    assert [block_key("t2", t2.prefix, i, bs) for i in (6, 7, 8)] == ["t1/6", "t1/7", "t2/8"]
    assert block_key("o", o.prefix, 6, bs) == "o/6"


@pytest.mark.parametrize(("items", "message"), [
    ([WorkItem("a", 0, 10, 1, 1, prefix=("s", 10))], "at least one must be its own"),
    ([WorkItem("a", 0, 10, 1, 1, prefix=("a", 4))], "names the request itself"),
    ([WorkItem("a", 0, 10, 1, 1, prefix=("b", 4)), WorkItem("b", 3, 10, 1, 1)],
     "which arrives after it"),
    ([WorkItem("b", 0, 10, 2, 2), WorkItem("a", 1, 30, 1, 1, prefix=("b", 13))],
     "whose whole sequence is 12 tokens"),
    ([WorkItem("a", 0, 10, 1, 1, prefix=("s", 0))], "must be a positive integer"),
])
def test_a_bad_prefix_is_refused_in_one_line(items: list[WorkItem], message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        validate(items)


def test_the_file_format_round_trips_a_prefix(tmp_path: Path) -> None:
    items = [WorkItem("t1", 0, 120, 20, 20, prefix=("sys", 96)),
             WorkItem("t2", 5, 200, 10, 10, prefix=("t1", 140))]
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps(item_dict(w)) + "\n" for w in items))
    assert json.loads(path.read_text().splitlines()[0])["prefix"] == {"id": "sys", "len": 96}
    assert read_workload(path) == validate(items)
    path.write_text(json.dumps({**item_dict(items[0]), "prefix": {"id": "sys"}}) + "\n")
    with pytest.raises(WorkloadError, match=r"w.jsonl:1: prefix must be an object"):
        read_workload(path)
