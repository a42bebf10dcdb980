"""What each step kind reads (kvsched.spec.step_kinds): one table, and every tool and
implementation refusing, in one line, a config its step kind would silently ignore."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest

from kvsched.spec.knobs import Knobs, SGLangKnobs, V0Knobs
from kvsched.spec.model import Config
from kvsched.spec.profiles import PROFILES, Profile, get_profile
from kvsched.spec.step_kinds import (
    STEP_KINDS,
    ignored_fields,
    knob_refusal,
    knobs_read,
    knobs_set,
    refusal,
)

SGLANG = get_profile("sglang@0.5.23")
SGLANG_CONFIG = SGLANG.configure(Config())


def test_every_kind_says_of_every_config_field_what_it_honours() -> None:
    names = {f.name for f in fields(Config)}
    for step in STEP_KINDS.values():
        assert step.reads | set(step.takes) == names, step.name
        assert not step.reads & set(step.takes), step.name
        assert set(step.why) == set(step.takes), step.name
        assert step.knob_fields <= {f.name for f in fields(step.knobs)}, step.name
    assert STEP_KINDS["v1"].knobs is Knobs and STEP_KINDS["sglang"].knobs is SGLangKnobs
    assert STEP_KINDS["v0"].knobs is V0Knobs
    assert "victim" not in STEP_KINDS["v0"].knob_fields


def test_v0s_rules_are_a_knob_type_of_their_own_as_sglangs_are() -> None:
    # V0's step reads every V0Knobs field and nothing of Knobs' own, which are vLLM v1's.
    v0 = STEP_KINDS["v0"]
    assert v0.knobs is V0Knobs and v0.knob_fields == {f.name for f in fields(V0Knobs)}
    assert {f.name for f in fields(Knobs)} == (STEP_KINDS["v1"].knob_fields
                                               | {"v0", "sglang", "lmdeploy"})
    for name in ("grow_check", "reject", "chunk_swap_in", "swapped_order"):
        assert name in v0.knob_fields and name not in STEP_KINDS["v1"].knob_fields
    for name in ("v0", "vllm-v0-swap"):
        profile = get_profile(name if name != "v0" else "vllm-v0")
        assert profile.scheduler == "v0" and knobs_read("v0", profile.knobs) == V0Knobs()
        # V0's rules are V0Knobs' defaults: the profile sets no knob at all.
        assert knobs_set(profile.knobs) == []
    assert (V0Knobs().grow_check, V0Knobs().reject, V0Knobs().chunk_swap_in,
            V0Knobs().swapped_order) == ("worst_case", "admission", False, "swap_out")


def test_every_profile_sets_only_knobs_its_step_reads() -> None:
    for profile in PROFILES.values():
        assert knob_refusal(profile.scheduler, profile.knobs) is None, profile.name
        assert {kind for kind, _, _ in knobs_set(profile.knobs)} <= {profile.scheduler}


@pytest.mark.parametrize(("kind", "knobs", "words"), [
    ("v0", replace(Knobs(), victim="tail"), "vLLM V0's step does not read knob victim tail, "
     "a rule of vLLM v1's step: its knobs are V0Knobs (Knobs.v0)"),
    ("v0", replace(Knobs(), lift_threshold_when_alone=False),
     "vLLM V0's step does not read knob lift_threshold_when_alone off"),
    ("v1", replace(Knobs(), v0=replace(V0Knobs(), grow_check="exact")),
     "vLLM v1's step does not read knob v0.grow_check exact, a rule of vLLM V0's step: its "
     "knobs are Knobs' own fields"),
    ("sglang", replace(Knobs(), v0=replace(V0Knobs(), chunk_swap_in=True)),
     "SGLang's step does not read knob v0.chunk_swap_in on, a rule of vLLM V0's step"),
    ("v0", replace(Knobs(), sglang=replace(SGLangKnobs(), decay=False)),
     "vLLM V0's step does not read knob sglang.decay off, a rule of SGLang's step"),
])
def test_a_knob_of_another_kind_is_refused_in_one_line(kind: str, knobs: Knobs, words: str
                                                       ) -> None:
    why = knob_refusal(kind, knobs)  # type: ignore[arg-type]
    assert why is not None and why.startswith(words) and "\n" not in why
    with pytest.raises(ValueError, match=f"^profile p: {re.escape(why)}$"):
        Profile("p", "", knobs, scheduler=kind)  # type: ignore[arg-type]
    from kvsched.reference import scheduler_for

    config = get_profile({"v1": "vllm-v1", "v0": "vllm-v0", "sglang": "sglang@0.5.23"}[
        kind]).configure(Config())
    with pytest.raises(ValueError, match=f"^{re.escape(why)}$"):
        scheduler_for(config, knobs, kind)  # type: ignore[arg-type]


def test_v0s_own_rules_flipped_are_not_refused_on_its_step() -> None:
    from kvsched.reference import V0Scheduler

    flipped = replace(Knobs(), v0=replace(V0Knobs(), grow_check="exact", reject="arrival"))
    assert knob_refusal("v0", flipped) is None
    v0_config = get_profile("vllm-v0").configure(Config())
    assert V0Scheduler(v0_config, flipped).rules == flipped.v0


def test_each_reference_step_refuses_another_kinds_knob_when_built_directly() -> None:
    from kvsched.reference import ReferenceScheduler, SGLangScheduler, V0Scheduler

    v0_config = get_profile("vllm-v0").configure(Config())
    with pytest.raises(ValueError, match=r"^vLLM V0's step does not read knob victim tail"):
        V0Scheduler(v0_config, replace(Knobs(), victim="tail"))
    with pytest.raises(ValueError, match=r"^vLLM v1's step does not read knob v0\.reject"):
        ReferenceScheduler(Config(), replace(Knobs(), v0=replace(V0Knobs(), reject="arrival")))
    with pytest.raises(ValueError, match=r"^SGLang's step does not read knob victim tail"):
        SGLangScheduler(SGLANG_CONFIG, replace(Knobs(), victim="tail"))


@pytest.mark.parametrize(("name", "value"), [
    ("allocation", "full"), ("allocation", "prompt"), ("preemption", "swap"),
    ("num_cpu_blocks", 8), ("watermark_blocks", 4), ("long_prefill_token_threshold", 32),
    ("step_mix", "any"), ("watermark_scope", "always")])
def test_sglangs_step_refuses_what_it_ignores(name: str, value: object) -> None:
    config = replace(SGLANG_CONFIG, **{name: value})  # type: ignore[arg-type]
    assert ignored_fields("sglang", config) == [name]
    why = refusal("sglang", config)
    assert why is not None and why.startswith(f"SGLang's step does not honour {name} ")
    assert "\n" not in why


def test_vllms_steps_take_mixed_steps_only_and_v0_no_threshold() -> None:
    for mix in ("prefill_or_decode", "mixed_chunk"):
        assert ignored_fields("v1", replace(Config(), step_mix=mix)) == ["step_mix"]
        assert ignored_fields("v0", replace(Config(), step_mix=mix)) == ["step_mix"]
    threshold = replace(Config(), long_prefill_token_threshold=32)
    assert refusal("v1", threshold) is None
    assert ignored_fields("v0", threshold) == ["long_prefill_token_threshold"]


def test_every_profile_runs_its_own_defaults() -> None:
    for profile in PROFILES.values():
        assert profile.refusal(profile.configure(Config())) is None, profile.name
    why = SGLANG.refusal(replace(SGLANG_CONFIG, allocation="full"))
    assert why is not None and why.startswith("profile sglang@0.5.23: SGLang's step")


def kvsched(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, timeout=300)


def one_line_refusal(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsched: error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]


SMALL = ["--requests", "20", "--num-gpu-blocks", "256", "--max-model-len", "512"]


@pytest.mark.parametrize("options", [
    ["--allocation", "full"], ["--allocation", "prompt"],
    ["--preemption", "swap", "--num-cpu-blocks", "8"], ["--watermark-blocks", "4"],
    ["--long-prefill-token-threshold", "32"], ["--step-mix", "any"]])
def test_simulate_refuses_what_sglangs_step_ignores(options: list[str], tmp_path: Path
                                                    ) -> None:
    out = tmp_path / "t.jsonl"
    result = kvsched("simulate", "--profile", "sglang@0.5.23", *SMALL, *options, "--check",
                     "--out", str(out))
    one_line_refusal(result, "profile sglang@0.5.23: SGLang's step does not honour")
    assert not out.exists()


@pytest.mark.parametrize(("profile", "options", "words"), [
    ("vllm-v0", ["--victim", "tail"], "profile vllm-v0: vLLM V0's step does not read knob "
     "victim tail, a rule of vLLM v1's step: its knobs are V0Knobs (Knobs.v0)"),
    ("vllm-v0", ["--keep-threshold-when-alone"], "does not read knob lift_threshold_when_alone"),
    ("vllm-v1", ["--grow-check", "worst_case"], "profile vllm-v1: vLLM v1's step does not "
     "read knob v0.grow_check worst_case, a rule of vLLM V0's step"),
    ("sglang@0.5.23", ["--host-bandwidth", "1e9"], "SGLang's step does not read knob cost "
     "host_bandwidth=1000000000.0")])
def test_simulate_refuses_a_knob_the_profiles_step_does_not_read(
        profile: str, options: list[str], words: str, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    result = kvsched("simulate", "--profile", profile, *SMALL, *options, "--out", str(out))
    one_line_refusal(result, words)
    assert not out.exists()


def test_simulate_sets_v0s_knob_options_in_v0s_knobs() -> None:
    from kvsched.commands.simulate import COST_OPTIONS, KNOB_OPTIONS, run_knobs

    given: dict[str, object] = dict.fromkeys((*KNOB_OPTIONS, *COST_OPTIONS))
    given |= {"grow_check": "exact", "reserve_full_sequence": False, "host_bandwidth": 1e9}
    knobs = run_knobs("vllm-v0", given)
    assert knobs.v0 == replace(V0Knobs(), grow_check="exact", reserve_full_sequence=False,
                               cost=replace(V0Knobs().cost, host_bandwidth=1e9))
    assert replace(knobs, v0=V0Knobs()) == Knobs()  # vLLM v1's knobs untouched


@pytest.mark.parametrize("scheduler", ["compiled", "reference", "auto"])
def test_simulate_refuses_an_sglang_step_mix_under_vllm_with_every_scheduler(
        scheduler: str) -> None:
    result = kvsched("simulate", "--profile", "vllm-v1", "--step-mix", "prefill_or_decode",
                     "--scheduler", scheduler, *SMALL)
    one_line_refusal(result, "vLLM v1's step does not honour step_mix prefill_or_decode")


def test_the_fast_schedulers_refuse_through_the_same_table() -> None:
    compiled = pytest.importorskip("kvsched.optimized.compiled")
    config = replace(Config(), step_mix="prefill_or_decode")
    with pytest.raises(ValueError, match="does not honour step_mix prefill_or_decode"):
        compiled.CompiledScheduler(config)
    from kvsched.optimized.knobs import unsupported_config

    assert unsupported_config(config, "torch") == (
        f"the torch scheduler runs vLLM v1's step: {refusal('v1', config)}")


def test_a_default_the_profile_sets_is_not_refused(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    result = kvsched("simulate", "--profile", "sglang@0.5.23", *SMALL, "--out", str(out))
    assert result.returncode == 0, result.stderr
    header = json.loads(out.read_text().splitlines()[0])
    assert header["config"]["step_mix"] == "prefill_or_decode"


def test_diff_and_fuzz_refuse_what_the_profiles_step_ignores(tmp_path: Path) -> None:
    diff = kvsched("diff", "sglang@0.5.23", "sglang@0.5.23", *SMALL, "--watermark-blocks",
                   "4")
    one_line_refusal(diff, "SGLang's step does not honour watermark_blocks 4")
    out = tmp_path / "found.jsonl"
    fuzz = kvsched("fuzz", "kvsched.testing.implementations:reference", "--profile",
                   "sglang@0.5.23", "--allocation", "full", "--examples", "1", "--out",
                   str(out))
    one_line_refusal(fuzz, "SGLang's step does not honour allocation full")
    assert not out.exists()


def test_the_pytest_plugin_refuses_what_the_profiles_step_ignores() -> None:
    from kvsched.pytest_plugin import wrap
    from kvsched.reference import SGLangScheduler

    config = replace(SGLANG_CONFIG, allocation="full")  # SGLang's step would ignore it
    with pytest.raises(ValueError, match=r"^kvsched_checked: profile sglang@0.5.23: "
                                         r"SGLang's step does not honour allocation full"):
        wrap(SGLangScheduler, config, profile="sglang@0.5.23")


SGLANG_TRACE = Path(__file__).parent / "data" / "sglang" / "chunked.jsonl.gz"


@pytest.mark.parametrize(("checker", "profile"), [
    *((checker, profile) for checker in ("spec", "vectorized")
      for profile in ("vllm-v1", "vllm-v1@0.32", "sarathi")),
    ("spec", "vllm-v0")])  # the vectorized checker does not replay V0's step at all
def test_a_vllm_profile_on_an_sglang_trace_is_a_verdict_of_bad_input(
        checker: str, profile: str, tmp_path: Path) -> None:
    if checker == "vectorized":
        pytest.importorskip("kvsched.optimized.state")
    junit = tmp_path / "junit.xml"
    result = kvsched("check", "--checker", checker, "--profile", profile, str(SGLANG_TRACE),
                     "--junit", str(junit), "--format", "json")
    assert result.returncode == 2, result.stderr
    why = (f"{SGLANG_TRACE}: profile {profile} cannot replay this trace: the trace's header "
           "has step_mix prefill_or_decode")
    assert result.stderr.startswith(f"kvsched: error: {why}") and "Traceback" not in (
        result.stderr), result.stderr
    assert json.loads(result.stdout)[0]["malformed"].startswith(why)
    assert why in junit.read_text()


def test_the_sglang_profile_on_a_vllm_trace_is_a_verdict_of_bad_input(tmp_path: Path
                                                                      ) -> None:
    trace = tmp_path / "vllm.jsonl"
    assert kvsched("simulate", *SMALL, "--out", str(trace)).returncode == 0
    junit = tmp_path / "junit.xml"
    result = kvsched("check", "--profile", "sglang@0.5.23", str(trace), str(SGLANG_TRACE),
                     "--junit", str(junit), "--format", "json")
    assert result.returncode == 2, result.stderr
    verdicts = json.loads(result.stdout)
    assert verdicts[0]["malformed"].startswith(
        f"{trace}: profile sglang@0.5.23 cannot replay this trace: the trace's header has "
        "step_mix any, which SGLang's step does not honour")
    assert verdicts[1]["ok"] is True  # the run goes on to the next trace
    assert "Traceback" not in result.stderr and "cannot replay" in junit.read_text()


def test_kvsched_help_lists_every_recorder() -> None:
    shown = kvsched("--help").stdout
    for engine in ("vllm", "vllm-v0", "sglang"):
        assert f"kvsched record {engine} " in shown, shown


def test_options_of_a_command_of_one_step_kind_offer_only_what_it_honours() -> None:
    import click
    from click.testing import CliRunner

    from kvsched.commands.options import config_options

    @click.command()
    @config_options(kind="sglang")
    def command(**given: object) -> None:
        click.echo(" ".join(sorted(k for k, v in given.items() if v is not None)))

    shown = CliRunner().invoke(command, ["--help"]).output
    for gone in ("--preemption", "--num-cpu-blocks", "--watermark-blocks",
                 "--watermark-scope", "--allocation", "--long-prefill-token-threshold"):
        assert gone not in shown, shown
    assert "[prefill_or_decode|mixed_chunk]" in shown and "--first-block-id" in shown
    refused = CliRunner().invoke(command, ["--step-mix", "any"])
    assert refused.exit_code == 2 and "'any' is not one of" in refused.output
    assert CliRunner().invoke(command, ["--policy", "priority"]).output == "policy\n"


def test_record_sglang_offers_only_what_sglangs_step_honours() -> None:
    shown = kvsched("record", "sglang", "--help").stdout
    for gone in ("--preemption", "--num-cpu-blocks", "--watermark-blocks",
                 "--watermark-scope", "--allocation", "--first-block-id",
                 "--long-prefill-token-threshold", "unless the profile sets it"):
        assert gone not in shown, shown
    assert "[prefill_or_decode|mixed_chunk]" in shown
    assert "--prefix-caching" in shown and "--policy" in shown
    v0 = kvsched("record", "vllm-v0", "--help").stdout
    assert "--allocation" in v0 and "--long-prefill-token-threshold" not in v0
    assert "--first-block-id" not in v0  # each engine's block ids are its own


def test_spec_md_shows_the_table_as_it_is() -> None:
    page = (Path(__file__).parent.parent / "docs" / "spec.md").read_text()
    rows = {line.split("|")[1].strip(" `"): [c.strip() for c in line.split("|")[2:-1]]
            for line in page.split("### What each step kind reads")[1].splitlines()
            if line.startswith("| `")}
    restricted = {name for step in STEP_KINDS.values() for name in step.takes}
    assert set(rows) == restricted
    for column, kind in enumerate(STEP_KINDS):
        for name in restricted:
            taken = STEP_KINDS[kind].takes.get(name)
            shown = "every value" if taken is None else ", ".join(
                f"`{v}`" if isinstance(v, str) else str(v) for v in taken)
            assert rows[name][column] == shown, (kind, name)
    # The knobs row names each kind's knob type, and where Knobs holds it.
    knobs = next(line for line in page.split("### What each step kind reads")[1].splitlines()
                 if line.startswith("| knobs |"))
    for cell, step in zip(knobs.split("|")[2:-1], STEP_KINDS.values(), strict=True):
        where = f" (`Knobs.{step.knobs_field}`)" if step.knobs_field else " (its own fields)"
        assert cell.strip() == f"`{step.knobs.__name__}`{where}", (step.name, cell)
