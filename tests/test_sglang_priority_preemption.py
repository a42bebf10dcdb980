"""SGLang's priority preemption by a waiting request with a radix-cache hit, on the kept
live traces priority-preemption-radix-page1 and -page16 (recorded from SGLang 0.5.23 by
`python -m conformance.sglang --keep NAME`): SGLang sizes what the victims must free by
the preempting request's last fill ids less the hit its last try found
(min_tokens_to_remove, schedule_policy.py:1736). The profile replays them exactly, and
the profile that sizes by the whole fill ids (preempt_need_net_of_prefix off) diverges
at the preempting step."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest

from conformance.common import first_divergence
from conformance.sglang import FLIPS, PROFILE, check, stored_trace
from kvsched.spec.profiles import get_profile

CASES = ("priority-preemption-radix-page1", "priority-preemption-radix-page16")


def preempting_step(data: bytes) -> int:
    """The step where w, the request with the hit, preempts: it is admitted with its hit
    beside victims of lower priority."""
    lines = [json.loads(line) for line in data.splitlines()[1:] if b'"step"' in line]
    for s in lines:
        if s.get("preempted") and "w" in s.get("prefix_hits", {}):
            assert s["mode"] == "EXTEND" and "w" in dict(s["scheduled"])
            return int(s["step"])
    raise AssertionError("w never preempts with its hit")


@pytest.mark.parametrize("name", CASES)
def test_a_preemptor_with_a_radix_hit_is_exact_and_the_whole_fill_sizing_diverges(
        name: str, tmp_path: Path) -> None:
    data = gzip.decompress(stored_trace(name).read_bytes())
    verdict = check(name, data)
    assert verdict.ok and not +verdict.should and verdict.hits >= 2
    step = preempting_step(data)
    path = tmp_path / f"{name}.jsonl"
    path.write_bytes(data)
    base = get_profile(PROFILE).knobs
    whole = replace(base, sglang=replace(base.sglang, preempt_need_net_of_prefix=False))
    assert first_divergence(path, base, PROFILE) is None
    assert first_divergence(path, whole, PROFILE) == step
    assert FLIPS["preempt_need_net_of_prefix=False"] == {"preempt_need_net_of_prefix": False}
