"""The command line on good input: simulate writes a trace that check accepts, check
names violations, metrics and profiles print what they promise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SMALL = ["--requests", "40", "--num-gpu-blocks", "64", "--max-num-seqs", "8",
         "--max-model-len", "1024", "--rate", "0.5"]


def kvsched(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "trace.jsonl"
    result = kvsched("simulate", *SMALL, "--out", str(path))
    assert result.returncode == 0, result.stderr
    assert "trace written to" in result.stdout
    assert "preemptions" in result.stdout and "TTFT" in result.stdout
    return path


def test_simulate_writes_a_complete_trace_that_checks_clean(trace: Path) -> None:
    lines = trace.read_text().splitlines()
    header = json.loads(lines[0])
    assert header["kvsched"] == "trace" and header["config"]["num_gpu_blocks"] == 64
    assert json.loads(lines[-1]) == {"end": True}
    result = kvsched("check", str(trace))
    assert result.returncode == 0, result.stdout
    assert result.stdout.startswith(f"OK {trace}")
    assert "complete; 0 errors, 0 warnings" in result.stdout


def test_check_against_its_own_profile_and_another(trace: Path, tmp_path: Path) -> None:
    assert kvsched("check", "--profile", "vllm-v1", str(trace)).returncode == 0
    # The same trace against a profile that admits after preempting diverges.
    result = kvsched("check", "--profile", "sarathi", "--format", "json", str(trace))
    assert result.returncode == 1
    [report] = json.loads(result.stdout)
    assert report["counts"] == {"profile": 1}
    [divergence] = report["violations"]
    assert divergence["message"].startswith("first divergence from sarathi: the profile")
    assert "state before: free GPU blocks" in divergence["message"]


def test_simulate_json_summary_has_metrics_and_no_violations() -> None:
    result = kvsched("simulate", *SMALL, "--format", "json", "--policy", "priority",
                     "--check")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["complete"] and summary["requests"] == 40
    assert summary["violations"] == {}
    assert summary["config"]["policy"] == "priority"


def test_profile_defaults_and_explicit_options(tmp_path: Path) -> None:
    out = tmp_path / "v0.jsonl"
    result = kvsched("simulate", *SMALL, "--profile", "vllm-v0", "--preemption", "swap",
                     "--out", str(out))
    assert result.returncode == 0, result.stderr
    config = json.loads(out.read_text().splitlines()[0])["config"]
    assert config["preemption"] == "swap" and config["num_cpu_blocks"] == 64
    assert config["watermark_blocks"] == 0  # 1% of 64 blocks, rounded down
    assert (config["allocation"], config["watermark_scope"]) == ("prompt", "always")
    result = kvsched("simulate", *SMALL, "--profile", "vllm-v0", "--allocation", "lazy",
                     "--out", str(out))
    config = json.loads(out.read_text().splitlines()[0])["config"]
    assert (config["preemption"], config["allocation"]) == ("recompute", "lazy")
    assert kvsched("check", "--profile", "vllm-v0", str(out)).returncode == 0


def test_a_deprecated_profile_says_so_in_one_line_whenever_it_is_used(
        tmp_path: Path) -> None:
    out = tmp_path / "swap.jsonl"
    note = ("kvsched: note: profile vllm-v0-swap is deprecated: it is vllm-v0 with "
            "preemption swap (--profile vllm-v0 --preemption swap)\n")
    simulated = kvsched("simulate", *SMALL, "--profile", "vllm-v0-swap", "--out", str(out))
    assert simulated.returncode == 0 and simulated.stderr == note
    config = json.loads(out.read_text().splitlines()[0])["config"]
    assert config["preemption"] == "swap" and config["allocation"] == "prompt"
    checked = kvsched("check", "--profile", "vllm-v0-swap", str(out))
    assert checked.returncode == 0 and checked.stderr == note
    same = kvsched("check", "--profile", "vllm-v0", str(out))
    assert same.returncode == 0 and same.stderr == ""


def test_max_steps_leaves_an_incomplete_trace(tmp_path: Path) -> None:
    out = tmp_path / "partial.jsonl"
    result = kvsched("simulate", *SMALL, "--max-steps", "20", "--out", str(out))
    assert result.returncode == 0 and "(stopped at --max-steps 20)" in result.stdout
    assert len(out.read_text().splitlines()) == 21  # header + 20 steps, no end line
    assert "no end line" in kvsched("check", str(out)).stdout


def write(path: Path, *objs: object) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


HEADER = {"kvsched": "trace", "version": 1,
          "config": {"block_size": 4, "num_gpu_blocks": 8, "num_cpu_blocks": 0,
                     "max_num_batched_tokens": 32, "max_num_seqs": 4, "max_model_len": 32,
                     "chunked_prefill": True, "long_prefill_token_threshold": 0,
                     "policy": "fcfs", "preemption": "recompute", "watermark_blocks": 0}}


def test_should_warnings_fail_only_with_strict(tmp_path: Path) -> None:
    # r1 arrives and the engine never schedules it: an idle step, then the trace ends.
    idle = write(tmp_path / "idle.jsonl", HEADER,
                 {"step": 0, "arrivals": [{"id": "r1", "prompt_len": 5, "max_tokens": 2}]},
                 {"end": True})
    relaxed = kvsched("check", str(idle))
    assert relaxed.returncode == 0
    assert "no-idle" in relaxed.stdout and "completion" in relaxed.stdout
    strict = kvsched("check", "--strict", str(idle))
    assert strict.returncode == 1 and strict.stdout.startswith("FAIL")


def test_must_violation_names_invariant_step_request_and_numbers(tmp_path: Path) -> None:
    # 9 tokens of prompt need 3 blocks of 4; scheduling two such prompts in an 8-block
    # cache is fine, three is not: 9 > 8.
    arrivals = [{"id": f"r{i}", "prompt_len": 9, "max_tokens": 1} for i in range(3)]
    bad = write(tmp_path / "bad.jsonl", HEADER,
                {"step": 0, "arrivals": arrivals,
                 "scheduled": [["r0", 9], ["r1", 9], ["r2", 9]],
                 "finished": ["r0", "r1", "r2"]}, {"end": True})
    result = kvsched("check", "--format", "json", str(bad))
    assert result.returncode == 1
    [report] = json.loads(result.stdout)
    [v] = [v for v in report["violations"] if v["invariant"] == "kv-budget"]
    assert (v["step"], v["lhs"], v["relation"], v["rhs"]) == (0, 9, "<=", 8)
    assert v["level"] == "MUST" and "9 new GPU blocks" in v["message"]


def test_check_many_traces_and_unknown_keys(trace: Path, tmp_path: Path) -> None:
    extra = write(tmp_path / "extra.jsonl", HEADER,
                  {"step": 0, "arrivals": [{"id": "a", "prompt_len": 3, "max_tokens": 1}],
                   "scheduled": [["a", 3]], "finished": ["a"], "engine_batch_id": 7},
                  {"end": True})
    result = kvsched("check", str(trace), str(extra))
    assert result.returncode == 0
    assert result.stdout.count("OK ") == 2
    assert "ignored unknown keys: engine_batch_id (line 2)" in result.stdout


def test_metrics_text_and_json(trace: Path) -> None:
    text = kvsched("metrics", str(trace))
    assert text.returncode == 0 and "TTFT" in text.stdout
    data = json.loads(kvsched("metrics", "--format", "json", str(trace)).stdout)
    assert data["requests"] == 40 and data["finished"] == 40


def test_profiles_lists_every_profile() -> None:
    result = kvsched("profiles")
    assert result.returncode == 0
    for name in ("vllm-v1", "vllm-v1-no-prefix-caching", "vllm-v0", "vllm-v0-swap",
                 "sarathi"):
        assert name in result.stdout


def test_workload_file_with_aborts(tmp_path: Path) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text(
        '{"id": "a", "arrival": 0, "prompt_len": 40, "output_len": 30, "max_tokens": 30,'
        ' "abort": 3}\n'
        '{"id": "b", "arrival": 1, "prompt_len": 8, "output_len": 2, "max_tokens": 4}\n')
    out = tmp_path / "t.jsonl"
    result = kvsched("simulate", "--workload", str(workload), "--out", str(out),
                     "--format", "json")
    assert result.returncode == 0, result.stderr
    steps = [json.loads(line) for line in out.read_text().splitlines()[1:-1]]
    assert steps[3]["aborted"] == ["a"]
    assert kvsched("check", str(out)).returncode == 0


def test_metrics_plot_draws_the_trace_over_time(trace: Path, tmp_path: Path) -> None:
    png = tmp_path / "metrics.png"
    result = kvsched("metrics", str(trace), "--plot", str(png))
    assert result.returncode == 0, result.stderr
    assert f"plot written to {png}" in result.stdout
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and png.stat().st_size > 20_000
    assert not (tmp_path / "metrics.png.part").exists()
    again = kvsched("metrics", str(trace), "--plot", str(tmp_path))
    assert again.returncode == 2 and "is a directory" in again.stderr


def test_help_lists_exit_codes_and_defaults() -> None:
    check = " ".join(kvsched("check", "--help").stdout.split())
    assert "Exit codes, the worst over the traces: 0 every trace is clean, 1 some trace " \
           "broke an invariant" in check and "2 some trace is malformed input" in check
    simulate = " ".join(kvsched("simulate", "--help").stdout.split())
    for option, value in (("--num-gpu-blocks", "1024"), ("--block-size", "16"),
                          ("--max-model-len", "4096"), ("--requests", "400"),
                          ("--rate", "0.3")):
        assert option in simulate and f"[default: {value}" in simulate, option


# -- prefix caching ------------------------------------------------------------------------

SHARED = [*SMALL, "--generator", "shared-prompts", "--system-prompts", "256,128"]


def test_a_run_under_a_profile_is_what_its_name_says(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    result = kvsched("simulate", *SHARED, "--profile", "vllm-v1-no-prefix-caching",
                     "--prefix-caching", "--out", str(out))
    assert result.returncode == 2 and not out.exists()
    assert result.stderr == ("kvsched: error: profile vllm-v1-no-prefix-caching runs with "
                             "prefix_caching off, but the options ask for prefix_caching "
                             "on: leave the option out, or name another profile\n")


@pytest.mark.parametrize(("args", "caching"), [
    ([], True),  # vllm-v1, the default profile, caches as vLLM does
    (["--no-prefix-caching"], False),
    (["--profile", "vllm-v1-no-prefix-caching"], False),
    (["--profile", "sarathi"], False),
])
def test_the_profile_or_the_option_turns_prefix_caching_on(tmp_path: Path, args: list[str],
                                                           caching: bool) -> None:
    out = tmp_path / "t.jsonl"
    result = kvsched("simulate", *SHARED, *args, "--out", str(out))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["config"]["prefix_caching"] is caching
    assert any("prefix_hits" in step for step in lines[1:-1]) is caching
    assert ("prefix cache hit rate" in result.stdout) is caching


@pytest.mark.parametrize("checker", ["spec", "vectorized", "auto"])
def test_a_profile_refuses_a_trace_recorded_without_the_config_it_fixes(
        tmp_path: Path, checker: str) -> None:
    out = tmp_path / "t.jsonl"
    assert kvsched("simulate", *SHARED, "--profile", "vllm-v1", "--out", str(out)
                   ).returncode == 0
    assert '"prefix_hits"' in out.read_text()
    refused = kvsched("check", "--checker", checker, "--profile",
                      "vllm-v1-no-prefix-caching", str(out))
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr == (f"kvsched: error: {out}: profile vllm-v1-no-prefix-caching "
                              "runs with prefix_caching off, but the trace's header has "
                              "prefix_caching on\n")
    checked = kvsched("check", "--checker", checker, "--profile", "vllm-v1", str(out))
    assert checked.returncode == 0, checked.stdout
    assert "0 errors, 0 warnings, checked against profile vllm-v1" in checked.stdout


def test_a_deprecated_profile_refuses_the_preemption_its_name_denies(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    assert kvsched("simulate", *SMALL, "--profile", "vllm-v0", "--out", str(out)
                   ).returncode == 0
    refused = kvsched("check", "--profile", "vllm-v0-swap", "--format", "json", str(out))
    assert refused.returncode == 2
    assert refused.stderr.endswith(f"kvsched: error: {out}: profile vllm-v0-swap runs "
                                   "with preemption swap, but the trace's header has "
                                   "preemption recompute\n")
    assert json.loads(refused.stdout)[0]["ok"] is False


def test_only_the_fields_a_profile_fixes_are_refused() -> None:
    from dataclasses import replace

    from kvsched.commands.options import DEFAULT_CONFIG
    from kvsched.spec.profiles import PROFILES

    for profile in PROFILES.values():
        own = profile.configure(DEFAULT_CONFIG)
        assert profile.disagreement(own) is None, profile.name
        for name in profile.fixes:
            value = getattr(own, name)
            other: Any = (not value if isinstance(value, bool)
                          else "recompute" if value != "recompute" else "swap")
            assert profile.disagreement(replace(own, **{name: other})) is not None
    assert {p.name: set(p.fixes) for p in PROFILES.values() if p.fixes} == {
        "vllm-v1-no-prefix-caching": {"prefix_caching"}, "vllm-v0-swap": {"preemption"}}
    # A default is not fixed: vLLM runs its v1 scheduler without prefix caching too, and
    # vllm-v0 is checked with the allocation a run gives.
    v1, v0 = PROFILES["vllm-v1"], PROFILES["vllm-v0"]
    assert v1.disagreement(replace(DEFAULT_CONFIG, prefix_caching=False)) is None
    assert v0.disagreement(replace(v0.configure(DEFAULT_CONFIG), allocation="lazy")) is None


def test_metrics_of_a_caching_trace_count_its_hits(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    assert kvsched("simulate", *SHARED, "--out", str(out)).returncode == 0
    assert kvsched("check", str(out)).returncode == 0
    steps = [json.loads(line) for line in out.read_text().splitlines()[1:-1]]
    hits = [len(blocks) for step in steps for blocks in step.get("prefix_hits", {}).values()]
    data = json.loads(kvsched("metrics", "--format", "json", str(out)).stdout)
    cache = data["prefix_cache"]
    assert cache["admissions_hit"] == len(hits) > 0
    assert cache["hit_tokens"] == 16 * sum(hits)
    assert cache["hit_rate"] == cache["hit_tokens"] / cache["queried_tokens"]
    assert cache["requests"] == 40 and 0 < cache["requests_hit"] <= 40
    text = kvsched("metrics", str(out)).stdout
    assert f"prefill tokens saved │ {cache['hit_tokens']}" in " ".join(text.split())


def test_metrics_of_a_trace_without_caching_leave_the_cache_out(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    assert kvsched("simulate", *SHARED, "--no-prefix-caching", "--out", str(out)
                   ).returncode == 0
    assert json.loads(kvsched("metrics", "--format", "json", str(out)).stdout)[
        "prefix_cache"] is None
    assert "prefix cache" not in kvsched("metrics", str(out)).stdout


def test_simulate_help_shows_the_shared_prefix_generators_and_caching() -> None:
    simulate = " ".join(kvsched("simulate", "--help").stdout.split())
    for text in ("shared-prompts", "conversations", "--prefix-caching / --no-prefix-caching",
                 "--system-prompts", "--skew", "--turns", "--think-steps",
                 "[default: 512,256,128,64 for shared-prompts, none otherwise]",
                 "[default: 3 for conversations, 1 otherwise]"):
        assert text in simulate, text
    assert "vllm-v1-no-prefix-caching" in kvsched("profiles").stdout


def test_conversations_simulate_and_check_clean(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    result = kvsched("simulate", *SMALL, "--generator", "conversations", "--turns", "4",
                     "--think-steps", "5", "--out", str(out), "--format", "json", "--check")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["violations"] == {} and summary["complete"]
    assert summary["metrics"]["prefix_cache"]["requests"] == 40
    arrivals = [a["id"] for line in out.read_text().splitlines()[1:-1]
                for a in json.loads(line).get("arrivals", [])]
    assert any(rid.endswith("-t1") for rid in arrivals)


@pytest.mark.parametrize(("args", "message"), [
    (["--workload", "w.jsonl", "--turns", "2"],
     "--workload reads the requests from a file; --turns applies to a generated workload"),
    ([*SMALL, "--skew", "2"],
     "skew weighs the choice of a system prompt: it needs system prompts"),
    ([*SMALL, "--generator", "shared-prompts", "--system-prompts", "1024,x"],
     "system prompts must be comma-separated token counts like 1024,256, got '1024,x'"),
    ([*SMALL, "--generator", "shared-prompts", "--system-prompts", "1023"],
     "a system prompt of 1023 tokens leaves no room in max_model_len 1024"),
    ([*SMALL, "--generator", "conversations", "--turns", "0"],
     "Invalid value for '--turns': expected a number of at least 1, got 0"),
])
def test_bad_shared_prefix_options_are_one_line(args: list[str], message: str) -> None:
    result = kvsched("simulate", *args)
    assert result.returncode == 2
    assert result.stderr.startswith(f"kvsched: error: {message}")
    assert result.stderr.count("\n") == 1
