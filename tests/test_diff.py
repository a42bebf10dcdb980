"""kvsched diff, the audit of a scheduler change: the first divergent step between the
reference and each seeded bug is the right one (found independently by comparing whole
runs), a scheduler against itself never diverges, traces and schedulers give the same
answer, the report carries both sides' violations and metrics, and `module:factory`
loading fails in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsched.diff import (
    DECISION,
    FINISHES,
    FREE_BLOCKS,
    INPUTS,
    LENGTH,
    Diff,
    Stream,
    blocks_of,
    diff_streams,
    simulated,
)
from kvsched.loading import FactoryError, build, load_factory
from kvsched.metrics import metrics_of
from kvsched.reference import reference_scheduler
from kvsched.simulate import run
from kvsched.spec import Config, StepRecord, check_steps
from kvsched.spec.profiles import get_profile
from kvsched.spec.trace import TraceWriter, step_dict
from kvsched.strategies import configs, profiles, workloads
from kvsched.testing.seeded_bugs import SEEDED_BUGS, SeededBug
from kvsched.workload import WorkItem, item_dict

NAMES = sorted(SEEDED_BUGS)


def kvsched(*args: str, cwd: Path | None = None,
            pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env=env)


def reference_vs_bug(bug: SeededBug) -> Diff:
    a = simulated("reference", bug.reference(), bug.workload, {}, max_steps=bug.max_steps)
    b = simulated(bug.name, bug.factory(bug.config), bug.workload, {},
                  max_steps=bug.max_steps)
    return diff_streams(a, b)


def first_unequal_step(a: list[StepRecord], b: list[StepRecord]) -> int | None:
    """The oracle: the first index where whole step records differ in what diff compares
    (block ids aside), from complete lists rather than a lockstep walk."""
    def key(r: StepRecord) -> tuple[object, ...]:
        return (r.arrivals, sorted(r.aborted), r.decision.comparable(), sorted(r.finished),
                r.free_blocks)
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if key(x) != key(y):
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@pytest.mark.parametrize("name", NAMES)
def test_diff_names_the_first_divergent_step_of_each_seeded_bug(name: str) -> None:
    bug = SEEDED_BUGS[name]
    expected = first_unequal_step(bug.simulate(bug.reference()), bug.simulate())
    assert expected is not None, f"{name}: the bug does not change behaviour on its workload"
    d = reference_vs_bug(bug)
    assert d.divergence is not None and d.divergence.step == expected
    assert d.steps_compared == expected + 1
    # The buggy side carries what the checker finds on the bug's run; the reference nothing.
    assert sum(d.a.report.counts.values()) == 0
    records = bug.simulate()
    ended = sum(len(r.finished) + len(r.rejected) + len(r.aborted) for r in records)
    complete = ended == len(bug.workload)
    assert d.b.report.complete == complete
    assert d.b.report.counts == check_steps(bug.config, records, complete).counts


# Hand-checked against each bug's config and workload (kvsched/testing/seeded_bugs.py).
KNOWN = {
    # A 40-token prompt under a 16-token budget: the first chunk is 17 at once.
    "token-budget-off-by-one": (0, DECISION, "r0: A scheduled 16 | B scheduled 17",
                                "r0 waiting N=40 C=0 G=0"),
    # r0 holds 4 blocks + decodes into its 5th at step 1; r1 needs 4 of the 4 left minus 1.
    "over-admit-by-one-block": (1, DECISION, "r1: A nothing | B scheduled 16",
                                "free GPU blocks 4; r1 waiting N=16 C=0 G=0"),
    # max_tokens 3 is reached at step 2 (prefill samples the first token at step 0).
    "finish-missed-at-max-tokens": (2, FINISHES, "r0: A finishes it",
                                    "r0 running N=10 C=9 G=3"),
    # r0 is aborted at step 3 holding 3 blocks that the bug never returns.
    "aborted-blocks-not-freed": (3, FREE_BLOCKS, "5 | 2 free GPU blocks",
                                 "r0 aborted N=11 C=10 G=3"),
    # Equal decisions, but a 30-token prompt gets 7 blocks instead of 8.
    "floor-blocks-needed": (0, FREE_BLOCKS, "8 | 9 free GPU blocks",
                            "r0 waiting N=30 C=0 G=0"),
}


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_divergence_shows_both_sides_and_the_state_before(name: str) -> None:
    step, what, differs, state = KNOWN[name]
    d = reference_vs_bug(SEEDED_BUGS[name])
    assert d.divergence is not None
    assert (d.divergence.step, d.divergence.what) == (step, what)
    assert differs in d.divergence.differs
    assert state in d.divergence.state


@pytest.mark.parametrize("name", ["vllm-v1", "vllm-v0", "sarathi"])
def test_a_profile_against_itself_does_not_diverge(name: str) -> None:
    bug = SEEDED_BUGS["tail-victim-under-priority"]
    config = get_profile(name).configure(bug.config)
    p = get_profile(name)
    a = simulated("a", reference_scheduler(p, config), bug.workload, {})
    b = simulated("b", reference_scheduler(p, config), bug.workload, {})
    d = diff_streams(a, b)
    assert d.divergence is None and not d.diverged
    assert d.steps_compared == d.a.report.steps == d.b.report.steps > 0
    assert all(m.delta == 0 for m in d.metric_deltas())


def test_a_buggy_scheduler_against_itself_does_not_diverge() -> None:
    bug = SEEDED_BUGS["over-admit-by-one-block"]
    d = diff_streams(simulated("a", bug.factory(bug.config), bug.workload, {}),
                     simulated("b", bug.factory(bug.config), bug.workload, {}))
    assert d.divergence is None
    # Both sides break the same invariants the same number of times.
    assert d.a.report.counts == d.b.report.counts and d.a.report.counts["kv-budget"] > 0
    assert [(i, a, b) for i, _, a, b in d.violation_counts()] == [
        (i, n, n) for i, n in d.a.report.counts.items()]


@given(st.data())
def test_any_profile_against_itself_on_drawn_workloads(data: st.DataObject) -> None:
    name = data.draw(profiles())
    config = get_profile(name).configure(data.draw(configs()))
    items = data.draw(workloads(config))
    p = get_profile(name)
    d = diff_streams(simulated("a", reference_scheduler(p, config), items, {}),
                     simulated("b", reference_scheduler(p, config), items, {}))
    assert d.divergence is None, d.divergence


def test_metric_deltas_are_the_difference_of_each_sides_metrics() -> None:
    bug = SEEDED_BUGS["admits-after-preempt"]
    d = reference_vs_bug(bug)
    ma = metrics_of(bug.config, bug.simulate(bug.reference()))
    mb = metrics_of(bug.config, bug.simulate())
    rows = {m.name: m for m in d.metric_deltas()}
    assert rows["preemptions"].a == sum(ma.preemptions.values())
    assert rows["preemptions"].b == sum(mb.preemptions.values())
    assert rows["TTFT p99 (steps)"].delta == (mb.ttft.p99 or 0) - (ma.ttft.p99 or 0)
    assert rows["KV use mean"].b == mb.kv_use_mean
    assert rows["recomputed tokens"].delta == mb.recomputed_tokens - ma.recomputed_tokens
    assert rows["throughput (generated tokens/step)"].a == ma.generated_per_step
    assert set(rows) >= {"TTFT p50 (steps)", "TPOT p50 (steps/token)",
                         "TPOT p99 (steps/token)", "KV use peak"}


# -- traces ------------------------------------------------------------------------------


def write_trace(path: Path, config: Config, records: list[StepRecord],
                complete: bool = True) -> Path:
    with path.open("wb") as f:
        writer = TraceWriter(f)
        writer.header(config, {"name": "test", "version": "0"})
        for rec in records:
            writer.step(rec)
        if complete:
            writer.end()
    return path


def stream_of(label: str, config: Config, records: list[StepRecord]) -> Stream:
    lines = ((2 + i, orjson.dumps(step_dict(rec)) + b"\n") for i, rec in enumerate(records))
    return Stream(label, config, {}, blocks_of(lines), lambda: True)


def test_two_traces_diverge_where_their_schedulers_do(tmp_path: Path) -> None:
    bug = SEEDED_BUGS["over-admit-by-one-block"]
    a = write_trace(tmp_path / "a.jsonl", bug.config, bug.simulate(bug.reference()))
    b = write_trace(tmp_path / "b.jsonl", bug.config, bug.simulate())
    result = kvsched("diff", str(a), str(b))
    assert result.returncode == 1, result.stderr
    assert "first divergence at step 1: decision" in result.stdout
    assert "r1: A nothing | B scheduled 16" in result.stdout
    assert "kv-budget" in result.stdout  # the violations table
    same = kvsched("diff", str(a), str(a), "--format", "json")
    assert same.returncode == 0, same.stderr
    report = json.loads(same.stdout)
    assert report["diverged"] is False and report["divergence"] is None
    assert report["steps_compared"] == len(bug.simulate(bug.reference()))


def test_trace_files_are_compared_as_written_whatever_their_spacing(tmp_path: Path) -> None:
    """Each side's step lines go to its checker as the file has them (not read and written
    again): another engine's spacing, key order and blank lines are the same steps, and a
    line that is not JSON is that file's bad input, in one line, exit 2."""
    bug = SEEDED_BUGS["over-admit-by-one-block"]
    a = write_trace(tmp_path / "a.jsonl", bug.config, bug.simulate(bug.reference()))
    header, *steps = a.read_bytes().splitlines(keepends=True)
    spaced = [header, b"\n"]
    for raw in steps:
        obj = json.loads(raw)
        spaced.append(json.dumps(dict(reversed(obj.items())), indent=None).encode() + b"\n")
    b = tmp_path / "b.jsonl"
    b.write_bytes(b"".join(spaced))
    same = kvsched("diff", str(a), str(b), "--format", "json")
    assert same.returncode == 0, same.stderr
    report = json.loads(same.stdout)
    assert report["diverged"] is False and report["steps_compared"] == len(steps) - 1
    assert report["b"]["complete"] is True
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(b"".join([header, *steps[:3], b'{"step": 3, "scheduled": [\n']))
    bad = kvsched("diff", str(a), str(broken))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert bad.stderr.startswith(f"kvsched: error: {broken}: line 5: ")


def test_different_arrivals_are_told_as_different_inputs() -> None:
    bug = SEEDED_BUGS["seq-limit-ignored"]
    other = (*bug.workload[:2], WorkItem("r2", 1, 4, 2, 2))  # r2 arrives a step later
    ref = get_profile("vllm-v1")
    d = diff_streams(simulated("a", reference_scheduler(ref, bug.config), bug.workload, {}),
                     simulated("b", reference_scheduler(ref, bug.config), other, {}))
    assert d.divergence is not None
    assert (d.divergence.step, d.divergence.what) == (0, INPUTS)
    assert "r2 (P=4, O=2, priority 0)" in d.divergence.a
    assert "r2" not in d.divergence.b


def test_a_trace_that_stops_early_diverges_in_length() -> None:
    bug = SEEDED_BUGS["finished-blocks-not-freed"]
    full = bug.simulate(bug.reference())
    d = diff_streams(stream_of("full", bug.config, full),
                     stream_of("cut", bug.config, full[:3]))
    assert d.divergence is not None
    assert (d.divergence.step, d.divergence.what) == (3, LENGTH)
    assert d.divergence.b == "ends after 3 steps"
    assert d.divergence.a.startswith("goes on: scheduled")


def test_config_differences_are_reported(tmp_path: Path) -> None:
    bug = SEEDED_BUGS["token-budget-off-by-one"]
    wider = replace(bug.config, max_num_batched_tokens=32)
    ref = get_profile("vllm-v1")
    d = diff_streams(simulated("a", reference_scheduler(ref, bug.config), bug.workload, {}),
                     simulated("b", reference_scheduler(ref, wider), bug.workload, {}))
    assert d.config_differences == ("max_num_batched_tokens: 16 | 32",)
    assert d.divergence is not None and d.divergence.step == 0
    a = write_trace(tmp_path / "a.jsonl", bug.config,
                    list(run(reference_scheduler(ref, bug.config), bug.workload)))
    b = write_trace(tmp_path / "b.jsonl", wider,
                    list(run(reference_scheduler(ref, wider), bug.workload)))
    result = kvsched("diff", str(a), str(b))
    assert result.returncode == 1
    assert "the configs differ (A | B): max_num_batched_tokens: 16 | 32" in result.stdout


# -- schedulers on the command line --------------------------------------------------------

USER_MODULE = '''
from kvsched.testing.seeded_bugs import SEEDED_BUGS


def make(config):
    return SEEDED_BUGS["over-admit-by-one-block"].factory(config)


def crashes(config):
    from kvsched.reference import ReferenceScheduler

    class Crashing(ReferenceScheduler):
        def schedule(self):
            if self.free_blocks() < 4:
                raise RuntimeError("out of blocks\\nsecond line")
            return super().schedule()

    return Crashing(config)


def not_a_scheduler(config):
    return object()


def raises(config):
    raise ValueError("swap is not supported")


NOT_CALLABLE = 3
'''

TIGHT = ["--no-prefix-caching", "--block-size", "4", "--num-gpu-blocks", "8",
         "--max-num-batched-tokens", "64",
         "--max-num-seqs", "4", "--max-model-len", "64"]


@pytest.fixture
def user_module(tmp_path: Path) -> Path:
    (tmp_path / "user_sched.py").write_text(USER_MODULE)
    return tmp_path


def workload_file(path: Path, items: tuple[WorkItem, ...]) -> Path:
    path.write_text("".join(json.dumps(item_dict(w)) + "\n" for w in items))
    return path


def test_diff_of_two_schedulers_keeps_both_traces_and_agrees_with_the_trace_diff(
        user_module: Path, tmp_path: Path) -> None:
    bug = SEEDED_BUGS["over-admit-by-one-block"]
    w = workload_file(tmp_path / "w.jsonl", bug.workload)
    a, b, png = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "diff.png"
    result = kvsched("diff", "vllm-v1", "user_sched:make", "--workload", str(w), *TIGHT,
                     "--out-a", str(a), "--out-b", str(b), "--plot", str(png),
                     "--format", "json", pythonpath=user_module)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["divergence"]["step"] == 1
    assert report["divergence"]["differs"] == "r1: A nothing | B scheduled 16"
    assert report["b"]["violations"]["kv-budget"] == 1 and report["a"]["violations"] == {}
    assert kvsched("check", str(a)).returncode == 0
    assert kvsched("check", str(b)).returncode == 1
    again = json.loads(kvsched("diff", str(a), str(b), "--format", "json").stdout)
    assert again["divergence"] == report["divergence"]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (900, 750)


def test_diff_of_the_same_profile_exits_0_on_a_generated_workload() -> None:
    result = kvsched("diff", "vllm-v1", "vllm-v1", "--requests", "30", "--num-gpu-blocks",
                     "128", "--max-model-len", "1024")
    assert result.returncode == 0, result.stderr
    assert "no divergence" in result.stdout and "violations: none on either side" \
        in result.stdout


def test_a_scheduler_that_crashes_is_told_in_one_line(user_module: Path,
                                                      tmp_path: Path) -> None:
    # r0's prefill takes 4 of the 8 blocks at step 0, its decode a 5th at step 1: the
    # scheduler sees 3 free blocks at step 2 and raises.
    w = workload_file(tmp_path / "w.jsonl", SEEDED_BUGS["over-admit-by-one-block"].workload)
    result = kvsched("diff", "vllm-v1", "user_sched:crashes", "--workload", str(w), *TIGHT,
                     pythonpath=user_module)
    assert result.returncode == 1
    assert result.stderr == ("kvsched: user_sched:crashes: the scheduler raised RuntimeError "
                             "at step 2: out of blocks\n")


@pytest.mark.parametrize(("args", "message"), [
    (["vllm-v1", "nosuch.jsonl"], "B: nosuch.jsonl: no such trace file"),
    (["vllm-v1", "nonsense"], "B: 'nonsense' is neither a trace file, a profile"),
    (["vllm-v1", "missing_module:make"],
     "missing_module:make: no module named 'missing_module'"),
    (["vllm-v1", "user_sched:nope"], "user_sched:nope: module user_sched has no attribute"),
    (["vllm-v1", "user_sched:NOT_CALLABLE"], "NOT_CALLABLE is a int, not callable"),
    (["vllm-v1", "user_sched:not_a_scheduler"],
     "user_sched:not_a_scheduler returned a object, which lacks add_request"),
    (["vllm-v1", "sarathi", "--max-steps", "0"], "--max-steps must be at least 1"),
])
def test_bad_scheduler_arguments_are_one_line_errors(user_module: Path, args: list[str],
                                                     message: str) -> None:
    result = kvsched("diff", *args, "--requests", "5", cwd=user_module)
    assert result.returncode == 2, result.stdout
    assert result.stderr.startswith("kvsched: error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1


def test_a_factory_that_raises_is_bad_input_as_in_fuzz(user_module: Path) -> None:
    # No scheduler was built, so nothing ran to compare: one line, exit 2, in diff as in
    # fuzz (a scheduler that raises mid-run is exit 1).
    result = kvsched("diff", "vllm-v1", "user_sched:raises", "--requests", "5",
                     cwd=user_module)
    assert result.returncode == 2
    assert result.stderr == ("kvsched: error: user_sched:raises: the factory raised "
                             "ValueError: swap is not supported\n")
    fuzz = kvsched("fuzz", "user_sched:raises", "--examples", "3", cwd=user_module)
    assert fuzz.returncode == 2, fuzz.stderr
    assert fuzz.stderr.startswith("kvsched: error: user_sched:raises: the factory raised "
                                  "ValueError: swap is not supported; it built no scheduler")


def test_bad_trace_arguments_are_one_line_errors(tmp_path: Path) -> None:
    bug = SEEDED_BUGS["token-budget-off-by-one"]
    good = write_trace(tmp_path / "good.jsonl", bug.config, bug.simulate())
    broken = tmp_path / "broken.jsonl"
    broken.write_text(good.read_text().replace('{"step":1,', '{"step":7,'))
    cases = [
        ([str(good), "vllm-v1"], "A and B must both be traces or both be schedulers"),
        ([str(good), str(good), "--num-gpu-blocks", "9"],
         "--num-gpu-blocks applies to schedulers, not to traces"),
        ([str(good), str(good), "--workload", str(good)],
         "--workload applies to schedulers"),
        ([str(good), str(broken)], f"{broken}: line 3: expected step 1, got 7"),
        ([str(tmp_path), str(good)], "is a directory"),
    ]
    for args, message in cases:
        result = kvsched("diff", *args)
        assert result.returncode == 2, (args, result.stdout)
        assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr


def test_load_factory_finds_modules_in_the_current_directory(
        user_module: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(user_module)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(user_module))])
    monkeypatch.delitem(sys.modules, "user_sched", raising=False)
    make = load_factory("user_sched:make")
    bug = SEEDED_BUGS["over-admit-by-one-block"]
    scheduler = build(make, bug.config, "user_sched:make")
    report = check_steps(bug.config, run(scheduler, bug.workload), complete=True)
    assert report.counts["kv-budget"] == 1
    with pytest.raises(FactoryError, match="expected module:factory"):
        load_factory("user_sched")
    with pytest.raises(FactoryError, match="expected module:factory"):
        load_factory("user sched:make")


# -- docs/audit.md quotes the real output ----------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("command", [
    "diff vllm-v1 audit_change:admit_after_preempt --requests 300",
    "diff vllm-v1 audit_change:over_admits --requests 100 --num-gpu-blocks 64 "
    "--no-prefix-caching",
])
def test_audit_md_quotes_what_the_command_prints(command: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "docs"), "COLUMNS": "80"}
    result = subprocess.run([sys.executable, "-m", "kvsched", *command.split()],
                            capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert result.returncode == 1 and result.stdout, result.stderr
    printed = "\n".join(line.rstrip() for line in result.stdout.splitlines())
    page = (ROOT / "docs" / "audit.md").read_text(encoding="utf-8")
    assert f"$ PYTHONPATH=docs kvsched {command}" in page
    assert printed in page, (
        "docs/audit.md no longer shows what this command prints; run it with COLUMNS=80 "
        f"and paste the output:\nPYTHONPATH=docs kvsched {command}\n{printed}")


def test_plot_without_matplotlib_is_a_one_line_error_before_anything_runs(
        tmp_path: Path) -> None:
    # A matplotlib that cannot be imported, first on the path.
    (tmp_path / "matplotlib").mkdir()
    (tmp_path / "matplotlib" / "__init__.py").write_text("raise ImportError('absent')\n")
    png = tmp_path / "out.png"
    result = kvsched("diff", "vllm-v1", "sarathi", "--plot", str(png), pythonpath=tmp_path)
    assert result.returncode == 2
    assert result.stderr == ("kvsched: error: --plot needs matplotlib: pip install "
                             "'kvsched[plot]'\n")
    assert not png.exists()


def test_prefix_cache_deltas_when_either_side_caches() -> None:
    from kvsched.generators import generate

    config = Config(block_size=16, num_gpu_blocks=64, max_num_batched_tokens=256,
                    max_num_seqs=8, max_model_len=512)
    items = generate("shared-prompts", 60, 2, rate=0.5, max_model_len=512,
                     system_prompts=(128, 64))
    sides = []
    for name in ("vllm-v1", "vllm-v1-no-prefix-caching"):
        p = get_profile(name)
        sides.append(simulated(name, reference_scheduler(p, p.configure(config)), items, {}))
    d = diff_streams(*sides)
    assert d.config_differences == ("prefix_caching: True | False",)
    ma, mb = d.a.metrics, d.b.metrics
    assert ma.prefix_cache is not None and mb.prefix_cache is None
    rows = {m.name: m for m in d.metric_deltas()}
    saved = rows["prefill tokens saved"]
    hit = ma.prefix_cache.hit_tokens
    assert (saved.a, saved.b, saved.delta, saved.relative) == (hit, 0, -hit, -1.0)
    assert hit > 0
    assert rows["prefix cache hit rate"].a == ma.prefix_cache.hit_rate
    assert rows["prefix cache hit rate"].cells()[1] == "0.0%"
    assert rows["prefix cache evictions"].b == 0
    assert {"prefix_cache": None}.items() <= mb.as_dict().items()
    # The tokens B computes beyond A's are the ones A's cache saved (and recomputes).
    assert mb.computed_tokens - mb.recomputed_tokens == \
        ma.computed_tokens + ma.prefix_cache.hit_tokens - ma.recomputed_tokens
    # Neither side caching: no prefix cache rows at all.
    off = get_profile("vllm-v1-no-prefix-caching")
    plain = diff_streams(*(simulated(x, reference_scheduler(off, off.configure(config)),
                                     items, {}) for x in "ab"))
    assert not any(m.name.startswith("prefix") for m in plain.metric_deltas())
