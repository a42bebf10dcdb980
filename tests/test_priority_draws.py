"""Generated and drawn workloads reach SGLang's priority preemption: a run under the
priority policy that names no mix draws levels further apart than SGLang's threshold
(kvsched.generators.priorities_for), other runs' workloads are unchanged, and the
property strategies draw such gaps, with shared prefixes under `kvsched fuzz` with the
radix cache, so that a more urgent request may preempt with a radix-cache hit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, find, settings

from kvsched.fuzz import fuzz
from kvsched.generators import DEFAULT_PRIORITY_MIX, generate, priorities_for
from kvsched.reference.sglang import SGLangScheduler
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Config, Request
from kvsched.spec.profiles import get_profile
from kvsched.strategies import workloads

THRESHOLD = get_profile("sglang@0.5.23").knobs.sglang.priority_preemption_threshold


def test_a_priority_run_without_a_mix_draws_levels_further_apart_than_the_threshold(
        ) -> None:
    assert priorities_for("priority", None) == DEFAULT_PRIORITY_MIX
    levels = {w.priority for w in generate("sharegpt", 300, 0,
                                           priorities=priorities_for("priority", None))}
    assert levels == {0, 20, 40}
    assert min(b - a for a in levels for b in levels if b > a) > THRESHOLD
    # a given mix, and every fcfs run, draw as before
    assert priorities_for("priority", (0.7, 0.3)) == (0.7, 0.3)
    assert priorities_for("fcfs", None) is None
    assert {w.priority for w in generate("sharegpt", 300, 0)} == {0}


def test_kvsched_simulate_under_sglangs_priority_policy_preempts_by_default(
        tmp_path: Path) -> None:
    counts = {}
    for name, extra in (("default", []), ("near", ["--priorities", "0.7,0.2,0.1"])):
        out = tmp_path / f"{name}.jsonl"
        result = subprocess.run(
            [sys.executable, "-m", "kvsched", "simulate", "--profile", "sglang@0.5.23",
             "--policy", "priority", "--requests", "200", "--max-num-seqs", "4",
             "--out", str(out), *extra], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        lines = [json.loads(x) for x in out.read_text().splitlines()[1:]]
        counts[name] = sum(len(s.get("preempted", ())) for s in lines if "step" in s)
    assert counts["default"] > 0 and counts["near"] == 0


def test_the_strategies_draw_priorities_further_apart_than_the_threshold() -> None:
    config = Config(max_num_seqs=2, policy="priority")
    found = find(workloads(config, min_requests=2),
                 lambda items: max(w.priority for w in items)
                 - min(w.priority for w in items) > THRESHOLD,
                 settings=settings(database=None, max_examples=500,
                                   suppress_health_check=list(HealthCheck)))
    assert len(found) == 2


def test_fuzz_with_the_radix_cache_draws_shared_prefixes() -> None:
    seen: list[Request] = []

    class Recording(SGLangScheduler):
        def add_request(self, request: Request) -> None:
            seen.append(request)
            super().add_request(request)

    profile = get_profile("sglang@0.5.23")

    def make(config: Config) -> SGLangScheduler:
        return Recording(config, Knobs(sglang=profile.knobs.sglang))

    result = fuzz(make, examples=40, pinned={"prefix_caching": True, "policy": "priority"},
                  profile="sglang@0.5.23")
    assert result.finding is None
    assert any(r.prefix for r in seen)
    assert max(r.priority for r in seen) - min(r.priority for r in seen) > THRESHOLD
