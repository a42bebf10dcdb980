"""Every release name resolves everywhere: a profile's own name, or a release of an engine
kvsched checked, in full or by its minor (vllm-v1@0.27.1, vllm-v1@0.27, sglang@0.5,
vllm-v0@0.10.1.1), names one profile in every command, the pytest plugin and `record
--release`; a name that names none is one line that says why, or names the nearest known
ones. `kvsched profiles` lists the releases each profile decides as, never wraps off a
terminal, and has --format json; cli.md's profile lists are the code's."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import pytest
from conftest import Ran

from kvsched.spec.knobs import V0Knobs
from kvsched.spec.profiles import (
    NO_PROFILE_NAMES,
    PROFILES,
    RELEASES,
    VLLM_V1_NEWEST,
    VLLM_V1_RELEASE_LIST,
    UnknownProfile,
    get_profile,
    pinned_profile,
    resolve_profile,
    resolve_vllm_release,
    vllm_v1_epoch,
)

ROOT = Path(__file__).resolve().parent.parent
Cli = Callable[..., Ran]

SPELLED = {
    "vllm-v1@0.27.1": "vllm-v1@0.24",
    "vllm-v1@0.27": "vllm-v1@0.24",
    "vllm-v1@0.32.0": "vllm-v1@0.32",
    "vllm-v1@0.34.0": "vllm-v1@0.34",
    "vllm-v1@0.20.2": "vllm-v1@0.19",
    "vllm-v1@0.11.2": "vllm-v1@0.11.1",
    "vllm-v1@0.13": "vllm-v1@0.12",
    "sglang": "sglang@0.5.23",
    "sglang@0.5": "sglang@0.5.23",
    "vllm-v0@0.10.1.1": "vllm-v0",
}


# -- the resolver -----------------------------------------------------------------------

@pytest.mark.parametrize(("name", "profile"), SPELLED.items())
def test_a_release_names_the_profile_of_its_epoch(name: str, profile: str) -> None:
    assert resolve_profile(name) == profile
    assert get_profile(name) is PROFILES[profile]


def test_every_release_with_a_profile_resolves_in_full_and_by_its_minor() -> None:
    for name in PROFILES:
        assert resolve_profile(name) == name
    for release in VLLM_V1_RELEASE_LIST:
        epoch = vllm_v1_epoch(release)
        if epoch is None:
            continue
        profile = resolve_profile(f"vllm-v1@{release}")
        assert profile == pinned_profile("vllm-v1", "vllm", release), release
        assert PROFILES[profile].knobs == epoch.knobs, release
        minor = ".".join(release.split(".")[:2])
        alike = {vllm_v1_epoch(r) for r in VLLM_V1_RELEASE_LIST if r.startswith(minor + ".")}
        if alike == {epoch}:
            assert resolve_profile(f"vllm-v1@{minor}") == profile, minor
    for r in RELEASES:
        if r.profile is not None:
            assert resolve_profile(f"{r.family}@{r.version}") == r.profile


def test_a_release_without_a_profile_says_why() -> None:
    with pytest.raises(UnknownProfile) as e:
        resolve_profile("vllm-v1@0.11.0")
    assert "vLLM 0.11.0 has no profile" in str(e.value) and "one-state" in str(e.value)
    assert "vllm-v1@0.11.1" in str(e.value) and "known:" not in str(e.value)
    with pytest.raises(UnknownProfile) as e:  # 0.11.0 and 0.11.1 decide differently
        resolve_profile("vllm-v1@0.11")
    assert "0.11.0 has none; 0.11.1 vllm-v1@0.11.1" in str(e.value)
    assert "name the release" in str(e.value)


@pytest.mark.parametrize(("name", "says"), [
    ("vlm-v1", "unknown profile 'vlm-v1'; nearest: vllm-v1, "),
    ("vllm-v1@0.32.4", "vLLM 0.32.4 is not a release kvsched has checked; nearest: "
                       "vllm-v1@0.32.0, "),
    ("vllm-v1@0.35.0", "vLLM 0.35.0 is newer than any release kvsched has checked (the "
                       "newest: vllm-v1@0.34.0, profile vllm-v1@0.34)"),
    ("sglang@0.4", "SGLang 0.4 is not a release kvsched has checked; nearest: sglang@0.5"),
])
def test_an_unknown_name_names_the_nearest_known_ones(name: str, says: str) -> None:
    with pytest.raises(UnknownProfile) as e:
        resolve_profile(name)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_release_to_record_resolves_in_every_spelling() -> None:
    assert resolve_vllm_release("0.27.1") == "0.27.1"
    assert resolve_vllm_release("vllm-v1@0.27.1") == "0.27.1"
    assert resolve_vllm_release("0.12") == "0.12.0"  # its minor's one release
    assert resolve_vllm_release("vllm-v1@0.34") == "0.34.0"
    with pytest.raises(UnknownProfile, match=r"^vLLM 0.27 names 2 releases, 0.27.0, "
                                             r"0.27.1: name one$"):
        resolve_vllm_release("0.27")
    with pytest.raises(UnknownProfile, match=r"^unknown vLLM release '0.35.0'; known: "
                                             r"0.11.0, "):
        resolve_vllm_release("0.35.0")


# -- every command ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from click.testing import CliRunner

    from kvsched.cli import main

    path = tmp_path_factory.mktemp("names") / "t.jsonl"
    done = CliRunner().invoke(main, ["simulate", "--requests", "30", "--num-gpu-blocks",
                                     "64", "--profile", "vllm-v1@0.33.0", "--out", str(path)],
                              catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return path


def test_simulate_runs_the_profile_a_release_names(small_trace: Path) -> None:
    header = json.loads(small_trace.read_text().splitlines()[0])
    assert header["engine"]["profile"] == "vllm-v1@0.33"


@pytest.mark.parametrize("name", ["vllm-v1@0.33.0", "vllm-v1@0.33"])
def test_check_replays_the_profile_a_release_names(cli: Cli, small_trace: Path,
                                                   name: str) -> None:
    done = cli("check", "--profile", name, "--format", "json", str(small_trace))
    assert done.exit_code == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)[0]["profile"] == "vllm-v1@0.33"


def test_diff_and_fuzz_take_release_names(cli: Cli, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    same = cli("diff", "vllm-v1@0.27.1", "vllm-v1@0.24", "--requests", "20")
    assert same.exit_code == 0, same.stdout + same.stderr
    assert same.stdout.startswith("kvsched diff: A = vllm-v1@0.24 (")
    assert "no divergence" in same.stdout
    (tmp_path / "names_engine.py").write_text(
        "from kvsched.reference import reference_scheduler\n\n\n"
        "def make(config):\n    return reference_scheduler('vllm-v1', config)\n")
    monkeypatch.chdir(tmp_path)  # where fuzz keeps its examples
    monkeypatch.syspath_prepend(str(tmp_path))
    fuzzed = cli("fuzz", "names_engine:make", "--examples", "3", "--profile",
                 "vllm-v1@0.34.0")
    assert fuzzed.exit_code == 0, fuzzed.stdout + fuzzed.stderr
    assert "(MUST, profile vllm-v1@0.34 checked)" in fuzzed.stdout, fuzzed.stdout


@pytest.mark.parametrize("args", [
    ["check", "t.jsonl", "--profile", "vllm-v1@0.35"],
    ["simulate", "--profile", "vllm-v1@0.35"],
    ["fuzz", "names_engine:make", "--profile", "vllm-v1@0.35"],
])
def test_an_unknown_profile_is_one_line_and_exit_2(cli: Cli, args: list[str]) -> None:
    done = cli(*args)
    assert done.exit_code == 2
    assert done.stderr == ("kvsched: error: Invalid value for '--profile': unknown profile "
                           "'vllm-v1@0.35': vLLM 0.35 is newer than any release kvsched has "
                           "checked (the newest: vllm-v1@0.34.0, profile vllm-v1@0.34)\n")


def test_diff_says_why_a_side_is_no_profile(cli: Cli) -> None:
    done = cli("diff", "vllm-v1", "vllm-v1@0.11.0")
    assert done.exit_code == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith("kvsched: error: B: 'vllm-v1@0.11.0' is neither a trace "
                                  "file, a profile nor module:factory (profile "
                                  "'vllm-v1@0.11.0': vLLM 0.11.0 has no profile: ")


def test_record_takes_a_release_in_every_spelling(cli: Cli, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no release environments here: 0.13.0's is missing
    (tmp_path / "w.jsonl").write_text('{"prompt_len": 8, "output_len": 2}\n')
    for spelled in ("0.13", "vllm-v1@0.13.0"):
        done = cli("record", "vllm", "--release", spelled, "--workload", "w.jsonl",
                   "--out", "t.jsonl")
        assert done.exit_code == 2
        assert done.stderr.startswith("kvsched: error: .venv-vllm-releases/0.13.0: vLLM "
                                      "0.13.0's environment is missing"), done.stderr
    done = cli("record", "vllm", "--release", "0.27", "--workload", "w.jsonl", "--out",
               "t.jsonl")
    assert (done.exit_code, done.stderr) == (
        2, "kvsched: error: vLLM 0.27 names 2 releases, 0.27.0, 0.27.1: name one\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.jsonl"]


def test_the_pytest_plugin_takes_release_names() -> None:
    from kvsched.commands.options import DEFAULT_CONFIG
    from kvsched.pytest_plugin import wrap
    from kvsched.reference import reference_scheduler
    from kvsched.spec.interface import Scheduler
    from kvsched.spec.model import Config

    def factory(config: Config) -> Scheduler:
        return reference_scheduler("vllm-v1@0.24", config)

    checked = wrap(reference_scheduler("vllm-v1@0.24", DEFAULT_CONFIG),
                   profile="vllm-v1@0.27.1")
    assert checked.checker.report.profile == "vllm-v1@0.24"
    with pytest.raises(ValueError, match=r"nearest: vllm-v1@0\.27\.1"):
        wrap(factory, DEFAULT_CONFIG, profile="vllm-v1@0.27.2")


# -- kvsched profiles -------------------------------------------------------------------

def test_profiles_off_a_terminal_is_plain_lines_with_the_release_table(cli: Cli) -> None:
    done = cli("profiles")
    assert done.exit_code == 0
    lines = done.stdout.splitlines()
    for p in PROFILES.values():  # each field whole on its line: nothing folded
        assert p.name in lines
        assert f"  models:          {p.description}" in lines
    assert not any(set(line) & set("│┃━") for line in lines)
    rows = {line.split()[0]: line.split(None, 1)[1] for line in lines
            if line.startswith("  ") and "@" in line.split()[0]}
    for r in RELEASES:
        assert rows[f"{r.family}@{r.version}"] == (r.profile or f"none: {r.why}")
    assert rows["vllm-v1@0.27.1"] == "vllm-v1@0.24"
    assert rows["vllm-v1@0.11.0"].startswith("none: its priority preemption")
    assert rows["vllm-v0@0.10.1.1"] == "vllm-v0" and rows["sglang@0.5.23"] == "sglang@0.5.23"
    assert "  releases:        vLLM 0.24.0, vLLM 0.25.0, vLLM 0.25.1, " in done.stdout


def test_profiles_as_json(cli: Cli) -> None:
    done = cli("profiles", "--format", "json")
    assert done.exit_code == 0
    listed = json.loads(done.stdout)
    assert [p["name"] for p in listed] == list(PROFILES)
    by_name = {p["name"]: p for p in listed}
    epoch = by_name["vllm-v1@0.24"]
    assert {"engine": "vLLM", "version": "0.27.1"} in epoch["releases"]
    assert "vllm-v1@0.27" in epoch["also_named"]
    assert epoch["knobs"]["free_order"] == "uncached_first"
    assert epoch["config_defaults"] == {"prefix_caching": True}
    v0 = by_name["vllm-v0"]
    assert v0["scheduler"] == "v0" and v0["releases"] == [
        {"engine": "vLLM V0", "version": "0.10.1.1"}]
    assert v0["config_defaults"]["prefix_caching"] is False
    # V0's step reads its own rules, V0Knobs (but the cost model), and no vLLM v1 knob.
    assert v0["knobs"] == {f.name: getattr(V0Knobs(), f.name) for f in fields(V0Knobs)
                           if f.name != "cost"}
    assert by_name["vllm-v0-swap"]["fixed"] == ["preemption"]
    assert by_name["vllm-v0-swap"]["deprecated"]
    assert by_name["sglang@0.5.23"]["also_named"] == ["sglang@0.5", "sglang"]
    assert by_name["vllm-v1"]["releases"] == [{"engine": "vLLM",
                                               "version": f"{VLLM_V1_NEWEST}.0"}]


# -- the docs ---------------------------------------------------------------------------

def section(page: str, title: str) -> str:
    text = (ROOT / page).read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


# A profile's name in backquotes, or after --profile in a command.
NAME = re.compile(r"`(vllm-v[01](?:-[a-z-]+)?(?:@[\d.]*\d)?|sglang(?:@[\d.]*\d)?"
                  r"|lmdeploy(?:@[\d.]*\d)?|sarathi)`")
PROFILE_OPTION = re.compile(r"--profile\s+([\w.@-]*\w)")


def test_cli_md_lists_every_profile_and_only_names_that_resolve() -> None:
    listed = section("docs/cli.md", "`kvsched profiles`")
    # The names each bullet opens with, up to its colon.
    heads = re.findall(r"^- ((?:`[^`]+`,?\s*)+):", listed, re.M)
    named = [n for head in heads for n in NAME.findall(head)]
    assert sorted(named) == sorted(PROFILES)
    for page in ("docs/cli.md", "README.md"):
        text = (ROOT / page).read_text(encoding="utf-8")
        for name in NAME.findall(text) + PROFILE_OPTION.findall(text):
            if name not in ("NAME", *NO_PROFILE_NAMES):  # a metavar, a refused release
                resolve_profile(name)  # UnknownProfile fails the test
    assert f"newest checked release, {VLLM_V1_NEWEST} (the default)" in listed


def test_cli_md_quotes_the_refusal_of_an_unknown_profile(cli: Cli) -> None:
    listed = section("docs/cli.md", "`kvsched profiles`")
    [quoted] = re.findall(r"`(kvsched: error: Invalid value for '--profile'[^`]*)`", listed)
    name = re.findall(r"unknown profile '([^']*)'", quoted)[0]
    assert cli("simulate", "--profile", name).stderr == quoted + "\n"
