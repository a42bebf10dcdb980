"""SGLang 0.5.23's kept traces (tests/data/sglang/, recorded from SGLang's own scheduler by
`make conformance-sglang ARGS=--keep`), checked again without SGLang: every named case and
at least 200 random ones are complete, MUST-clean and exact under sglang@0.5.23, they
reach what the profile's rules are about (chunks, retractions, priority preemption,
radix hits at pages of 1 and 16, eviction, deduplication, mixed steps), and each rule of
the profile flipped makes a named case diverge."""

from __future__ import annotations

import json
from functools import cache
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from conformance.common import Verdict, first_divergence
from conformance.sglang import CASES, FLIPS, PROFILE, check, stored, variants

NAMED = [c.name for c in CASES]


@cache
def kept() -> dict[str, bytes]:
    return dict(stored())


@cache
def verdicts() -> dict[str, Verdict]:
    return {name: check(name, data) for name, data in kept().items()}


def steps(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in kept()[name].splitlines()[1:]
            if b'"step"' in line]


def test_every_named_case_and_200_random_ones_are_kept() -> None:
    names = set(kept())
    assert set(NAMED) <= names, f"not kept: {sorted(set(NAMED) - names)}"
    assert sum(n.startswith("random-") for n in names) >= 200


def test_every_kept_trace_is_sglangs_complete_must_clean_and_exact() -> None:
    bad = [(v.case, dict(v.must), v.complete,
            None if v.divergence is None else v.divergence.message)
           for v in verdicts().values() if not v.ok]
    assert not bad
    assert {v.profile for v in verdicts().values()} == {PROFILE}
    for data in kept().values():
        header = json.loads(data.split(b"\n", 1)[0])
        assert header["engine"] == {"name": "sglang", "version": "0.5.23"}


def test_the_cases_reach_what_the_rules_are_about() -> None:
    v = verdicts()
    assert v["retraction"].preemptions >= 3
    assert v["retraction-page16"].preemptions >= 1
    assert v["priority-preemption"].preemptions >= 1
    for name in ("radix-page1", "radix-page16", "radix-eviction"):
        assert v[name].prefix_caching and v[name].hits >= 10
    modes = {s.get("mode") for s in steps("mixed-chunk")}
    assert "MIXED" in modes and "EXTEND" in modes and "DECODE" in modes
    # SGLang's radix cache swapped a request's copies for its own (deduplication)
    assert any("dedup" in s for name in kept() for s in steps(name))
    # a chunk continues alone, or with what the chunk budget leaves, never beside decodes
    for s in steps("chunked"):
        if s.get("mode") == "EXTEND":
            assert sum(n for _, n in s["scheduled"]) <= 64


def test_the_ratio_in_the_trace_is_sglangs_schedule() -> None:
    """0.7, down 0.001 per decode step that retracts nothing, never in a prefill step,
    back to 0.7 when fully idle (the engine's own value, read from each step line)."""
    lines = steps("idle-reset")
    assert lines[0]["new_token_ratio"] == pytest.approx(0.7)
    for a, b in pairwise(lines):
        ra, rb = float(a["new_token_ratio"]), float(b["new_token_ratio"])
        if a.get("mode") == "DECODE" and not a.get("preempted"):
            assert rb == pytest.approx(max(ra - (0.7 - 0.098) / 600, 0.098))
        elif a.get("mode") in ("EXTEND", "MIXED"):
            assert rb == ra
    assert min(float(s["new_token_ratio"]) for s in lines) < 0.5
    resets = [i for i, s in enumerate(lines[1:], 1) if s["new_token_ratio"] == 0.7
              and float(lines[i - 1]["new_token_ratio"]) < 0.7]
    assert len(resets) >= 2  # once after each idle stretch


@pytest.mark.parametrize("flip", [*FLIPS, "step_mix=mixed_chunk"])
def test_each_rule_flipped_makes_a_named_case_diverge(flip: str, tmp_path: Path) -> None:
    knobs, changes, kind = variants()[flip]
    for name in NAMED:
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(kept()[name])
        if first_divergence(path, knobs, PROFILE, changes, kind) is not None:
            return
    pytest.fail(f"{PROFILE} with {flip} decides as SGLang on every named case")
