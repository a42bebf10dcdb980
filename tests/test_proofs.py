"""The proofs (proofs/): the model checker finds what it must and counts what it explores,
the runner falls into none of CrossHair's silent traps, and `make proofs` fails on bugs
planted in a copy of the spec, the reference or the proofs, naming the right obligation.
"""

from __future__ import annotations

import copy
import io
import os
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the proofs package lives at the top, beside spec/

from kvsched.reference.allocator import BlockAllocator  # noqa: E402
from kvsched.reference.lmdeploy import LMDeployScheduler  # noqa: E402
from kvsched.reference.requests import LiveRequest  # noqa: E402
from kvsched.reference.scheduler import ReferenceScheduler, StepPlan  # noqa: E402
from kvsched.spec.checker import check_trace  # noqa: E402
from kvsched.spec.knobs import Knobs  # noqa: E402
from kvsched.spec.model import Config, Decision, Request  # noqa: E402
from kvsched.spec.trace import TraceReader  # noqa: E402
from proofs import model_check, run  # noqa: E402
from proofs.obligations import OBLIGATIONS, Effort, Obligation  # noqa: E402
from proofs.scopes import (  # noqa: E402
    DIMENSIONS,
    LMDEPLOY_REACHES,
    SHARED,
    Scope,
    Shape,
    full_scopes,
    lmdeploy_scope,
    pairwise,
    quick_lmdeploy_scopes,
    shapes,
    valid,
)
from proofs.state_key import allocator_key, scheduler_key  # noqa: E402

TINY = Config(block_size=1, num_gpu_blocks=2, max_num_batched_tokens=1, max_num_seqs=1,
              max_model_len=8)


def scope(config: Config = TINY, *requests: tuple[int, int]) -> Scope:
    return Scope("test", "test", config, Knobs(), shapes(*(requests or ((1, 1),))))


# -- the model checker ---------------------------------------------------------------


def test_one_request_of_one_token_has_three_states_and_five_transitions() -> None:
    # Before it arrives (it may keep not arriving: a self-loop); it arrives and finishes
    # in one step (its block back at the tail of the free list: [1, 0]); or it arrives and
    # is aborted (free list [0, 1]); from either end nothing is left to happen.
    result = model_check.explore(scope())
    assert (result.states, result.transitions, result.finding) == (3, 5, None)


def test_a_scheduler_that_never_admits_deadlocks() -> None:
    class NeverAdmits(ReferenceScheduler):
        def waiting_pass(self, plan: StepPlan) -> None:
            return None

    result = model_check.explore(scope(), NeverAdmits)
    assert result.finding is not None
    assert result.finding.kind == "deadlock"
    assert [str(i) for i in result.finding.path] == ["arrive r0"]


def test_a_scheduler_that_preempts_whatever_runs_livelocks() -> None:
    class Thrashes(ReferenceScheduler):
        def schedule(self) -> Decision:
            if not self.running:
                return super().schedule()
            victim = self.running.pop()
            preemption = self.preempt(victim)
            self.victims = []
            self.waiting.push(victim, front=True)
            return Decision(preempted=(preemption,))

    # One block, so that the block ids do not rotate and the cycle is the shortest.
    config = Config(block_size=4, num_gpu_blocks=1, max_num_batched_tokens=1, max_num_seqs=1,
                    max_model_len=8)
    result = model_check.explore(scope(config, (2, 1)), Thrashes)
    assert result.finding is not None
    assert result.finding.kind == "livelock"
    assert len(result.finding.cycle) == 2  # admitted one token, preempted, and again


def test_a_must_violation_comes_with_a_trace_the_checker_agrees_with() -> None:
    class OverBudget(ReferenceScheduler):
        def next_chunk(self, r: LiveRequest, threshold: int, budget: int) -> int:
            return super().next_chunk(r, threshold, budget + 1)

    config = Config(block_size=1, num_gpu_blocks=4, max_num_batched_tokens=1, max_num_seqs=2,
                    max_model_len=8)
    result = model_check.explore(scope(config, (3, 1)), OverBudget)
    assert result.finding is not None
    assert result.finding.kind == "must"
    assert "token-budget" in result.finding.ids
    trace = "\n".join(result.finding.trace).encode() + b"\n"
    assert check_trace(TraceReader(io.BytesIO(trace))).counts["token-budget"] >= 1


def test_the_twin_reports_a_legal_decision_the_profile_would_not_take() -> None:
    class AdmitsAfterPreempting(ReferenceScheduler):
        def __init__(self, config: Config, knobs: Knobs | None = None) -> None:
            super().__init__(config, Knobs(admit_after_preempt=True))

    config = Config(block_size=2, num_gpu_blocks=3, max_num_batched_tokens=4, max_num_seqs=4,
                    max_model_len=8)
    result = model_check.explore(scope(config, (2, 3), (1, 2), (4, 1)), AdmitsAfterPreempting,
                                 twin=True)
    assert result.finding is not None
    assert result.finding.ids == ("profile",)


def test_the_state_key_forgets_when_things_happened() -> None:
    early, late = ReferenceScheduler(TINY), ReferenceScheduler(TINY)
    early.add_request(Request("r0", 2, 2, arrival_step=0))
    for _ in range(3):
        late.schedule()
        late.update(())
    late.add_request(Request("r0", 2, 2, arrival_step=3))
    assert scheduler_key(early) == scheduler_key(late)
    early.schedule()
    assert scheduler_key(early) != scheduler_key(late)


# -- prefix caching ---------------------------------------------------------------------

CACHING = Config(block_size=2, num_gpu_blocks=3, max_num_batched_tokens=4, max_num_seqs=3,
                 max_model_len=8, prefix_caching=True)
SHARING = (Shape(3, 2, prefix=SHARED), Shape(3, 2, prefix=SHARED), Shape(1, 3))


class HitsWholePrompt(ReferenceScheduler):
    """Looks up floor(N / block_size) blocks: a hit may leave nothing to compute."""

    def prefix_hit(self, r: LiveRequest) -> list[int]:
        if not self.config.prefix_caching or r.num_computed > 0:
            return []
        most = r.num_tokens // self.config.block_size
        return self.blocks.lookup([self.content_key(r, i) for i in range(most)])


class EvictsForFree(ReferenceScheduler):
    """Admits after a hit as if the evictable hit blocks (E) cost nothing."""

    def waiting_pass(self, plan: StepPlan) -> None:
        self.blocks.evictable = lambda blocks: 0  # type: ignore[method-assign]
        super().waiting_pass(plan)
        del self.blocks.evictable


class Probe(ReferenceScheduler):
    """The reference, counting what its steps did across the exploration."""

    seen: ClassVar[Counter[str]] = Counter()

    def schedule(self) -> Decision:
        d = super().schedule()
        Probe.seen.update(("recompute",) * len(d.preempted))
        for rid, hit in d.prefix_hits.items():
            held = {b for other in self.live if other != rid for b in self.block_table(other)}
            Probe.seen["hit"] += 1
            Probe.seen["shared"] += bool(held & set(hit))
            Probe.seen["re-hit"] += self.live[rid].num_preemptions > 0
        return d


def test_the_prefix_scopes_share_blocks_preempt_and_hit_again() -> None:
    Probe.seen.clear()
    result = model_check.explore(Scope("test", "test", CACHING, Knobs(), SHARING), Probe)
    assert result.finding is None
    assert {"hit", "shared", "re-hit", "recompute"} <= set(+Probe.seen)


def test_a_hit_that_leaves_nothing_to_compute_is_found() -> None:
    shapes_ = (Shape(2, 2, prefix=SHARED), Shape(2, 2, prefix=SHARED))
    result = model_check.explore(Scope("test", "test", CACHING, Knobs(), shapes_),
                                 HitsWholePrompt)
    assert result.finding is not None
    assert result.finding.kind == "must"


def test_an_admission_that_forgets_the_evictable_blocks_is_found() -> None:
    # It admits past the free blocks: the allocator refuses the handout.
    result = model_check.explore(Scope("test", "test", CACHING, Knobs(), SHARING),
                                 EvictsForFree)
    assert result.finding is not None
    assert result.finding.kind == "error"
    assert "beyond the free ones" in result.finding.message


def test_the_state_key_holds_the_order_a_content_was_cached_in() -> None:
    first, second = BlockAllocator(4, 0, caching=True), BlockAllocator(4, 0, caching=True)
    for blocks, order in ((first, ("a", "b")), (second, ("b", "a"))):
        for rid in ("a", "b"):
            blocks.allocate(rid, 1)
        for rid in order:
            blocks.cache(rid, 1, lambda i: "s/0")
        for rid in ("a", "b"):
            blocks.free(rid)
    assert first.free_gpu_ids() == second.free_gpu_ids()
    assert first.lookup(["s/0"]) != second.lookup(["s/0"])
    assert allocator_key(first) != allocator_key(second)


def test_the_grid_covers_every_pair_of_values() -> None:
    points = pairwise(DIMENSIONS)
    assert all(valid(p) for p in points)
    names = list(DIMENSIONS)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for va in DIMENSIONS[a]:
                for vb in DIMENSIONS[b]:
                    if valid({a: va, b: vb}):
                        assert any(p[a] == va and p[b] == vb for p in points), (a, va, b, vb)


def test_the_full_scopes_use_every_knob_and_config_value() -> None:
    scopes = [s for s in full_scopes() if s.scheduler == "v1"]
    knobs = {(s.knobs.victim, s.knobs.admit_after_preempt, s.knobs.reserve_full_sequence,
              s.knobs.lift_threshold_when_alone, s.knobs.continue_after_self_preemption)
             for s in scopes}
    for i, name in enumerate(("victim", "admit_after_preempt", "reserve_full_sequence",
                              "lift_threshold_when_alone", "continue_after_self_preemption")):
        assert {k[i] for k in knobs} == set(DIMENSIONS[name])
    configs = {s.config for s in scopes}
    assert {c.policy for c in configs} == {"fcfs", "priority"}
    assert {c.preemption for c in configs} == {"recompute", "swap", "auto"}
    assert {c.block_size for c in configs} == {1, 2}
    assert {c.num_gpu_blocks for c in configs} == {2, 3, 4, 5}  # 5 of 1: prefix caching
    assert {c.max_num_batched_tokens for c in configs} == {1, 2, 3, 4}
    assert {c.chunked_prefill for c in configs} == {True, False}
    assert {c.allocation for c in configs} == {"lazy", "prompt", "full"}
    assert {c.watermark_scope for c in configs} == {"running", "always"}
    assert {(c.allocation, c.prefix_caching) for c in configs} >= {("full", True),
                                                                    ("prompt", False)}
    assert max(len(s.shapes) for s in scopes) == 3


def test_the_full_scopes_run_sglangs_step_in_every_step_mix_and_cache() -> None:
    scopes = [s for s in full_scopes() if s.scheduler == "sglang"]
    assert scopes and all(s.aborts for s in scopes)  # a running abort: a finish at its next sample
    configs = {s.config for s in scopes}
    assert {c.step_mix for c in configs} == {"prefill_or_decode", "mixed_chunk"}
    assert {(c.prefix_caching, c.block_size) for c in configs} == {
        (False, 1), (False, 2), (True, 1), (True, 2)}
    assert {c.chunked_prefill for c in configs} == {True, False}
    assert {c.policy for c in configs} == {"fcfs", "priority"}
    rules = {(s.knobs.sglang.new_token_ratio, s.knobs.sglang.reserve_output) for s in scopes}
    assert rules == {(0.7, True), (0.0, True), (0.7, False)}
    # a priority of 20 against 0: more urgent than SGLang's threshold of 10
    assert {s.priority for sc in scopes for s in sc.shapes} == {0, 20}


# -- LMDeploy's step ---------------------------------------------------------------------


def test_lmdeploys_quick_scopes_reach_lazy_preemption_reclaims_and_releases() -> None:
    reached: Counter[str] = Counter()
    for s in quick_lmdeploy_scopes():
        result = model_check.explore(s)
        assert result.finding is None, result.finding.summary()
        reached.update(dict(result.reached))
    assert set(+reached) >= LMDEPLOY_REACHES, sorted(LMDEPLOY_REACHES - set(+reached))
    assert {"preempted lazy", "reclaimed waiting"} <= LMDEPLOY_REACHES


def test_the_runner_fails_a_family_that_stops_reaching_lazy_preemption(
        capsys: pytest.CaptureFixture[str]) -> None:
    # One short request in a roomy cache: nothing is preempted or reclaimed.
    families = run.model_check([lmdeploy_scope(shapes((2, 2)), "lonely")], jobs=1)
    missing = families["lonely"].unreached()["lmdeploy"]
    assert {"preempted lazy", "reclaimed waiting", "resumed with its blocks"} <= set(missing)
    assert "UNREACHED model check lonely" in capsys.readouterr().out


def test_the_full_scopes_run_lmdeploys_step_in_every_rule_set_and_cache() -> None:
    scopes = [s for s in full_scopes() if s.scheduler == "lmdeploy"]
    assert scopes and not any(s.aborts for s in scopes)  # its step takes no aborts
    assert {c.prefix_caching for c in (s.config for s in scopes)} == {True, False}
    rules = {(s.knobs.lmdeploy.head_of_line_blocking, s.knobs.lmdeploy.reclaim_finished_first)
             for s in scopes}
    assert rules == {(True, True), (False, True), (True, False)}
    for s in scopes:  # the clock reads 0 and a block is preallocated
        assert s.knobs.lmdeploy.step_seconds == 0
        assert s.config.prealloc_tokens == s.knobs.lmdeploy.prefill_interval == s.config.block_size


def test_a_pipelined_trace_is_written_and_checked_a_step_late_with_its_dropped_entries(
        ) -> None:
    # Two 3/6 in 4 blocks: at step 6 r1's decode finds no block and preempts itself, so
    # step 5's output for it is dropped: that line names it unsampled, not finished.
    s = lmdeploy_scope(shapes((3, 6), (3, 6)), "test")
    path = (model_check.Inputs(("r0", "r1")),) + (model_check.Inputs(),) * 11
    lines = model_check.replay(s, ReferenceScheduler, False, path)
    trace = "\n".join(lines).encode() + b"\n"
    steps = list(TraceReader(io.BytesIO(trace)))
    assert [rec.step for rec in steps] == list(range(12))  # each line once, in order
    assert (steps[5].unsampled, steps[5].finished) == (("r1",), ("r0",))
    report = check_trace(TraceReader(io.BytesIO(trace)))
    assert not report.violations, report.violations[:1]


def lmdeploy_run(idle: int, knobs: Knobs, steps: int) -> list[Hashable]:
    """The state keys of LMDeploy's step on one request (3/6 in 4 blocks of 4) arriving
    after `idle` empty steps, one key after each of its `steps` steps."""
    s = lmdeploy_scope(shapes((3, 6)), "test")
    sched = LMDeployScheduler(s.config, knobs)
    for _ in range(idle):
        sched.schedule()
        sched.update(())
    sched.add_request(Request("r0", 3, 6, arrival_step=idle))
    keys = []
    for _ in range(steps):
        sched.schedule()
        sched.update(())
        keys.append(scheduler_key(sched))
    return keys


def test_the_lmdeploy_key_forgets_the_clock_where_nothing_reads_it() -> None:
    knobs = lmdeploy_scope(shapes((3, 6)), "test").knobs  # step_seconds 0
    assert lmdeploy_run(0, knobs, 10) == lmdeploy_run(3, knobs, 10)
    # held after its finish, the steps since it (its release's countdown) are state
    s = lmdeploy_scope(shapes((3, 6)), "test")
    sched = LMDeployScheduler(s.config, knobs)
    sched.add_request(Request("r0", 3, 6))
    for _ in range(6):
        sched.schedule()
        sched.update(())
    assert sched.states()["r0"].status.value == "held"
    sooner = copy.deepcopy(sched)
    sooner.live["r0"].finished_at -= 1
    assert scheduler_key(sooner) != scheduler_key(sched)
    # where the clock is read (aging, at LMDeploy's step_seconds), it is in the key
    ticking = replace(knobs, lmdeploy=replace(knobs.lmdeploy, step_seconds=0.025))
    assert lmdeploy_run(0, ticking, 1) != lmdeploy_run(3, ticking, 1)


# -- the runner's guards against CrossHair's silent traps ----------------------------


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], str]:
    """Write a module of obligations importable here and in CrossHair's process."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))

    def write(source: str) -> str:
        name = f"scratch_{abs(hash(source))}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return write


def checked(target: str, status: str = "proven") -> run.Outcome:
    little = Effort(iterations=5, seconds=2)
    return run.run_check(Obligation("scratch", "check", (target,), status, "", "",
                                    given_effort=little))


def test_a_mistyped_target_is_an_error_not_a_counterexample() -> None:
    outcome = checked("proofs.arithmetic.no_such_obligation")
    assert not outcome.ok
    assert "has no 'no_such_obligation'" in outcome.detail


def test_a_contract_crosshair_cannot_see_fails(scratch: Callable[[str], str]) -> None:
    # Not a docstring (a statement comes first): CrossHair finds no checkable function and
    # exits 0 with only a warning.
    module = scratch('''
        def hidden(x: int) -> int:
            x = x + 0
            """
            post: __return__ == x + 1
            """
            return x
        ''')
    outcome = checked(f"{module}.hidden")
    assert not outcome.ok
    assert "reported nothing" in outcome.detail


def test_an_obligation_written_as_an_assert_is_refused(scratch: Callable[[str], str]) -> None:
    module = scratch('''
        def asserted(x: int) -> int:
            """post: True"""
            assert x != 7
            return x
        ''')
    outcome = checked(f"{module}.asserted")
    assert not outcome.ok
    assert "plain assert" in outcome.detail


def test_an_unmet_precondition_checks_nothing_and_fails(scratch: Callable[[str], str]) -> None:
    module = scratch('''
        def impossible(x: int) -> int:
            """
            pre: x > 0 and x < 0
            post: __return__ == x
            """
            return x
        ''')
    outcome = checked(f"{module}.impossible", "searched")
    assert not outcome.ok
    assert "unable to meet the precondition" in outcome.detail


def test_a_proof_that_stops_going_through_fails(scratch: Callable[[str], str]) -> None:
    module = scratch('''
        def loops(xs: list[int]) -> int:
            """post: __return__ >= 0"""
            return sum(abs(x) for x in xs)
        ''')
    assert checked(f"{module}.loops", "searched").ok
    outcome = checked(f"{module}.loops", "proven")
    assert not outcome.ok
    assert "expected proven" in outcome.detail


def test_a_callee_breaking_its_own_contract_fails_the_caller(
        scratch: Callable[[str], str]) -> None:
    # Left to itself CrossHair would ignore every path on which `callee` breaks its own
    # postcondition (or assume that postcondition), and confirm `caller`.
    module = scratch('''
        def callee(x: int) -> int:
            """post: __return__ == x"""
            return x + 1

        def caller(x: int) -> int:
            """post: __return__ == x"""
            return callee(x)
        ''')
    outcome = checked(f"{module}.caller")
    assert not outcome.ok
    assert "counterexample" in outcome.detail


def test_every_obligation_names_an_existing_target_with_conditions() -> None:
    for ob in OBLIGATIONS:
        if ob.kind == "check":
            assert run.expected_conditions(ob), ob.name
        else:
            assert all(callable(run.resolve(t)) for t in ob.targets), ob.name


# -- planted bugs: `make proofs` on a copy with one bug fails, naming the obligation ---


def planted(tmp_path: Path, path: str, old: str, new: str) -> Path:
    """A copy of the spec, the reference and the proofs with `old` replaced by `new` in
    `path` (relative to the package kvsched, or proofs/...)."""
    package = tmp_path / "src" / "kvsched"
    package.mkdir(parents=True)
    shutil.copy(ROOT / "src" / "kvsched" / "__init__.py", package)
    for pillar in ("spec", "reference"):
        shutil.copytree(ROOT / pillar, package / pillar,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "proofs", tmp_path / "proofs",
                    ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / path if path.startswith("proofs/") else package / path
    text = target.read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {path}"
    target.write_text(text.replace(old, new))
    return tmp_path


def run_in(copy: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(copy / "src"))
    return subprocess.run([sys.executable, "-m", *args], cwd=copy, env=env,
                          capture_output=True, text=True, check=False, timeout=300)


def assert_fails_naming(proc: subprocess.CompletedProcess[str], obligation: str,
                        why: str) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert any(line.split()[1] == obligation and why in line for line in failed), proc.stdout


def test_floor_for_ceiling_in_cdiv_fails_cdiv_ceiling(tmp_path: Path) -> None:
    copy = planted(tmp_path, "spec/blocks.py", "return -(-a // b)", "return a // b")
    proc = run_in(copy, "proofs.run", "--only", "cdiv-ceiling,blocks-needed-least")
    assert_fails_naming(proc, "cdiv-ceiling", "__return__ * b >= a")
    assert_fails_naming(proc, "blocks-needed-least", "counterexample")


def test_off_by_one_in_never_completes_fails_reject_exact(tmp_path: Path) -> None:
    copy = planted(tmp_path, "spec/blocks.py", "if prompt_len > config.max_model_len:",
                   "if prompt_len >= config.max_model_len:")
    proc = run_in(copy, "proofs.run", "--only", "reject-exact")
    assert_fails_naming(proc, "reject-exact", "counterexample")


def test_admission_forgetting_the_watermark_fails_admission_blocks(tmp_path: Path) -> None:
    copy = planted(tmp_path, "reference/scheduler.py",
                   "+ admission_watermark(self.config, len(self.running)))", "+ 0)")
    proc = run_in(copy, "proofs.run", "--only", "admission-blocks")
    assert_fails_naming(proc, "admission-blocks", "the spec and the reference differ")


def test_a_recompute_victim_keeping_its_tokens_fails_recompute_victim(tmp_path: Path) -> None:
    copy = planted(tmp_path, "reference/scheduler.py", "victim.num_computed = 0", "pass")
    proc = run_in(copy, "proofs.run", "--only", "recompute-victim")
    assert_fails_naming(proc, "recompute-victim", "keeps")
    proc = run_in(copy, "proofs.model_check", "--scopes", "quick", "--only", "vllm-v1 bs2 gpu4")
    assert proc.returncode == 1
    assert "must [" in proc.stdout and "preempt" in proc.stdout


def test_swap_in_restoring_one_block_fewer_fails_swap_round_trip(tmp_path: Path) -> None:
    copy = planted(tmp_path, "reference/allocator.py",
                   'return self.allocate(rid, len(host))',
                   'return self.allocate(rid, len(host[1:]))')
    proc = run_in(copy, "proofs.run", "--only", "swap-round-trip")
    assert_fails_naming(proc, "swap-round-trip", "became")


def test_a_token_budget_off_by_one_fails_the_model_checker(tmp_path: Path) -> None:
    copy = planted(tmp_path, "reference/scheduler.py",
                   "return self.config.max_num_batched_tokens\n",
                   "return self.config.max_num_batched_tokens + 1\n")
    proc = run_in(copy, "proofs.model_check", "--scopes", "quick", "--only",
                  "vllm-v1 bs2 gpu4", "--trace-out", str(tmp_path / "found"))
    assert proc.returncode == 1
    assert "token-budget" in proc.stdout
    trace = (tmp_path / "found" / "counterexample-1.jsonl").read_bytes()
    assert check_trace(TraceReader(io.BytesIO(trace))).counts["token-budget"] >= 1


def test_blocks_needed_ignoring_held_blocks_fails_blocks_needed_least(tmp_path: Path) -> None:
    # Db forgets the blocks already held: too many blocks, so "least" breaks, both in the
    # obligation and in spec/blocks.py's own contract.
    copy = planted(tmp_path, "spec/blocks.py",
                   "return max(0, blocks_for(max(computed + new_tokens, reserve), block_size) "
                   "- held)",
                   "return max(0, blocks_for(max(computed + new_tokens, reserve), block_size))")
    proc = run_in(copy, "proofs.run", "--only", "blocks-needed-least,spec-block-contracts")
    assert_fails_naming(proc, "blocks-needed-least", "counterexample")
    assert_fails_naming(proc, "spec-block-contracts", "counterexample")
