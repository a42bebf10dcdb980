"""Every vLLM v1 release's kept traces (tests/data/vllm-releases/store/, recorded by
`make vllm-releases` with each release's own scheduler), checked again without vLLM:
each is complete, MUST-clean and exact under the profile of its release's decision
epoch; 0.11.0, in no epoch, breaks exactly the rules docs/vllm-changelog.md says; and
each epoch's rule, set back to the epoch before's, makes a trace of its first release
diverge. docs/vllm-changelog.md is what tools.vllm_changelog makes of the store: its
metric tables set only complete runs side by side, each epoch opens with a plain sentence
of who it affects, and the random cases' ids are folded."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.vllm_releases import (
    NO_EPOCH,
    NO_EPOCH_STEPS,
    STORE,
    Stored,
    check,
    checked,
    epoch_firsts,
    stored,
)
from kvsched.spec.profiles import VLLM_V1_EPOCHS, VLLM_V1_RELEASE_LIST, pinned_profile
from tools.vllm_changelog import OUT, flipped_divergence, render

KEPT = [r for r in VLLM_V1_RELEASE_LIST if (STORE / f"{r}.json").exists()]


def traces(release: str) -> Iterator[Stored]:
    return stored(STORE, [release])


def test_the_store_holds_no_body_that_no_release_names() -> None:
    from conformance.vllm_releases import unnamed

    assert unnamed(STORE) == []


def test_every_release_is_kept() -> None:
    missing = sorted(set(VLLM_V1_RELEASE_LIST) - set(KEPT))
    assert not missing, (f"releases without kept traces: {missing}; record them with "
                         "`make vllm-releases`")


@pytest.mark.parametrize("release", [r for r in KEPT if r not in NO_EPOCH])
def test_each_release_is_exact_under_its_epochs_profile(release: str) -> None:
    verdicts = [v for _, v in checked(traces(release))]
    assert len(verdicts) >= 50
    bad = [(v.case, dict(v.must), v.complete,
            None if v.divergence is None else v.divergence.step) for v in verdicts
           if not v.ok]
    assert not bad, f"vLLM {release}: {bad}"
    assert {v.profile for v in verdicts} == {pinned_profile("vllm-v1", "vllm", release)}
    # the suite reaches what the epochs differ in
    assert sum(v.preemptions for v in verdicts) > 0 and sum(v.hits for v in verdicts) > 0


def test_vllm_0_11_0_breaks_one_state_and_leaves_prompts_unfinished() -> None:
    """Its priority victim stays in the batch (MUST one-state, and the driver stops at
    the victim's misaligned readmission), and it admits prompts of max_model_len tokens
    that never finish: those runs go on to the step bound, stalled (SHOULD progress, and
    a trace that ends so, MUST ends-stuck) or preempting others again and again."""
    verdicts = [check(t) for t in stored(STORE, list(NO_EPOCH))]
    broken = sum((v.must for v in verdicts), Counter[str]())
    assert set(broken) == {"one-state", "ends-stuck"}, broken
    stalled = [v for v in verdicts if v.should["progress"]]
    assert stalled and all(v.steps == NO_EPOCH_STEPS and not v.complete for v in stalled)
    assert all(v.must["ends-stuck"] == 1 for v in stalled)
    for v in verdicts:
        assert v.complete or v.must["one-state"] or v.steps == NO_EPOCH_STEPS, v.case
    # the rest decide as the epoch after it
    assert sum(v.exact for v in verdicts if v.complete and not v.must) > 0


@pytest.mark.parametrize("epoch", VLLM_V1_EPOCHS[1:], ids=lambda e: e.first)
def test_each_epochs_rule_set_back_makes_a_trace_diverge(epoch: object) -> None:
    from kvsched.spec.profiles import Epoch

    assert isinstance(epoch, Epoch)
    before = VLLM_V1_EPOCHS[VLLM_V1_EPOCHS.index(epoch) - 1]
    first = epoch_firsts()[VLLM_V1_EPOCHS.index(epoch)]
    assert flipped_divergence(epoch, before, traces(first)) is not None


def test_the_changelog_is_what_the_store_says() -> None:
    assert Path(OUT).read_text() == render(STORE), (
        "docs/vllm-changelog.md is stale: run `make vllm-changelog`")


def test_the_store_keeps_each_body_once_and_gives_back_each_trace(tmp_path: Path) -> None:
    from conformance.vllm_releases import keep

    header = b'{"trace":"kvsched","version":1,"engine":{"name":"vllm","version":"%s"}}\n'
    body = b'{"step":0}\n{"end":true}\n'
    for release in ("0.12.0", "0.13.0"):
        keep(tmp_path, release, {"case": (header % release.encode()) + body}, {})
    assert len(list((tmp_path / "bodies").iterdir())) == 1  # one body, two releases
    got = {(t.release, t.case): t.data for t in stored(tmp_path)}
    assert got == {(r, "case"): (header % r.encode()) + body for r in ("0.12.0", "0.13.0")}
    assert not list(tmp_path.glob("*.part")) and not list(tmp_path.glob("bodies/*.part"))


def test_an_unknown_release_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]
                                                   ) -> None:
    from conformance.vllm_releases import main

    assert main(["check", "0.10.9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown release '0.10.9'" in err


def test_kvsched_diff_of_adjacent_epoch_profiles_finds_each_change_where_vllm_did() -> None:
    """The page says, per epoch, on how many of the cases where two adjacent releases
    part `kvsched diff` of their profiles parts at the same step: all of them."""
    import re

    found = re.findall(r"finds (\d+) of these (\d+) at the same step", Path(OUT).read_text())
    assert len(found) == len(VLLM_V1_EPOCHS) - 1
    assert all(a == b and int(b) > 0 for a, b in found), found


def epoch_sections(page: str) -> dict[str, str]:
    """The changelog's epoch sections, by their heading's first release."""
    epochs = page.split("## The decision epochs\n", 1)[1]
    return {part.split(":", 1)[0]: part for part in epochs.split("\n### ")[1:]}


def test_no_metric_row_compares_a_run_cut_short() -> None:
    """A run the driver cut short (no end line) stops where the driver did: its numbers
    are never set against a complete run's (0.11.0's priority cases), and the page counts
    and names them instead."""
    import re

    page = Path(OUT).read_text()
    kept: dict[str, dict[str, Stored]] = {}

    def complete(release: str, case: str) -> bool:
        if release not in kept:
            kept[release] = {t.case: t for t in traces(release)}
        return check(kept[release][case]).complete

    compared = 0
    for section in epoch_sections(page).values():
        head = re.search(r"^\| workload \| metric \| (\S+) \| (\S+) \| delta \|$", section,
                         re.M)
        if head is None:
            continue
        for case in {line.split(" | ")[0][2:] for line in section.splitlines()
                     if line.startswith("| ") and not line.startswith("| workload")}:
            for release in head.groups():
                assert complete(release, case), (release, case)
                compared += 1
    assert compared > 0
    short = sum(not check(t).complete for t in traces("0.11.0"))
    assert short > 0 and f"{short} of 0.11.0's" in page
    assert "No metrics for `priority-tight`" in epoch_sections(page)["0.11.1"]


def test_each_epoch_opens_with_one_plain_sentence_of_who_it_affects() -> None:
    from conformance.vllm import FLIPPABLE
    from tools.vllm_changelog import AFFECTS

    sections = epoch_sections(Path(OUT).read_text())
    assert set(sections) == {e.first for e in VLLM_V1_EPOCHS}
    for first, section in sections.items():
        opening = section.split("\n\n")[1]
        assert opening.startswith("Affects you if ") and opening.count(". ") == 0, first
        assert opening.endswith(".") and "\n" not in opening, first
    # every knob an epoch may change, either way, has its sentence
    assert {(k, v) for k, values in FLIPPABLE.items() for v in values} <= set(AFFECTS)


def test_random_case_ids_are_folded() -> None:
    """Lists of random cases' ids sit in <details> blocks; the text names the named
    cases and counts the random ones."""
    import re

    folded = False
    count = 0
    for line in Path(OUT).read_text().splitlines():
        folded = (folded or line.startswith("<details>")) and line != "</details>"
        ids = len(re.findall(r"\brandom-(?:prefix-)?\d+\b", line))
        if not folded:
            assert ids <= 1, line  # one, in a single example of both versions
        count += ids if folded else 0
    assert count > 50


def test_a_flipped_rule_diverges_where_the_reference_replaying_it_does() -> None:
    """stream_divergence replays vLLM v1's rules, flipped, in the compiled scheduler
    beside the vectorized checker: the same first divergent step as the reference
    replaying them through the spec's ProfileReplay, on kept traces with prefix caching
    off and on, for every flipped rule of the suite."""
    pytest.importorskip("kvsched.optimized.state")
    import io

    from conformance.common import stream_divergence
    from conformance.vllm import knob_variants
    from kvsched.reference import scheduler_for
    from kvsched.spec.replay import ProfileReplay
    from kvsched.spec.trace import TraceReader

    profile = "vllm-v1@0.33"
    kept = [t for t in traces("0.33.0")
            if t.case in ("fcfs-tight", "priority-tight", "prefix-tight-readmit",
                          "prefix-conversations", "random-0", "random-prefix-0")]
    assert len(kept) == 6
    told = 0
    for name, knobs in knob_variants(profile).items():
        for trace in kept:
            reader = TraceReader(io.BytesIO(trace.data))
            replay = ProfileReplay(profile, scheduler_for(reader.header.config, knobs, "v1"))
            want = next((rec.step for rec in reader if replay.step(rec) is not None), None)
            assert stream_divergence(io.BytesIO(trace.data), knobs, profile) == want, (
                name, trace.case)
            told += want is not None
    assert told >= 10  # the flipped rules do part these traces
