"""The LMDeploy adapter without LMDeploy: the config it built mapped both ways, what it
refuses, hand-written driver events to trace v1 step lines (lazy victims, reclaims,
releases, void and unsampled entries, free blocks counting the trie's evictable ones,
prefix hits and content keys) and the record command's refusals, one line, exit 2; and
the store of LMDeploy's kept traces, complete and reaching what each named case is
about. The live engine is the conformance suite's (`make conformance-lmdeploy`)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from conformance.common import first_divergence
from conformance.lmdeploy import CASES, FLIPS, PROFILE, check, reached, stored, variants
from kvsched.adapters.lmdeploy import (
    ENGINE,
    config_from_lmdeploy,
    header_extra,
    job_settings,
    lmdeploy_settings,
    max_session_len,
    settings_from_lmdeploy,
    step_line,
    step_record,
)
from kvsched.adapters.recording import AdapterError, Job
from kvsched.spec.model import Config
from kvsched.spec.profiles import get_profile
from kvsched.spec.trace import parse_step
from kvsched.workload import WorkItem, validate

ROOT = Path(__file__).resolve().parent.parent


def cfg(**changes: Any) -> Config:
    """LMDeploy's config under profile lmdeploy@0.18.0 (its front-end limit included)."""
    base = replace(Config(block_size=16, num_gpu_blocks=20, max_num_batched_tokens=256,
                          max_num_seqs=4, max_model_len=304, prefix_caching=False),
                   **changes)
    return get_profile("lmdeploy@0.18.0").configure(
        base, frozenset({"prefix_caching", "max_model_len", *changes}))


CONFIG = cfg()


def effective(config: Config, **changes: Any) -> dict[str, Any]:
    """What the driver reads back from a scheduler LMDeploy built as asked."""
    s = lmdeploy_settings(config)
    return {**s, "num_cpu_blocks": 0, "free_gpu_blocks": s["num_gpu_blocks"],
            "max_session_len": min(s["session_len"], max_session_len(config)),
            "prealloc_size": s["prefill_interval"], "eviction_type": "recompute",
            **changes}


@pytest.mark.parametrize("changes", [{}, {"prefix_caching": True},
                                     {"block_size": 64, "num_gpu_blocks": 50,
                                      "max_model_len": 3136}])
def test_settings_read_back_the_same_config(changes: dict[str, Any]) -> None:
    config = cfg(**changes)
    settings = lmdeploy_settings(config)
    assert settings["session_len"] == config.max_model_len
    assert settings["max_batches"] == config.max_num_seqs
    assert settings["max_prefill_token_num"] == config.max_num_batched_tokens
    built = config_from_lmdeploy(effective(config))
    assert built == config
    assert (built.preemption, built.pipelined, built.first_block_id,
            built.prealloc_tokens, built.max_prompt_len) == ("lazy", True, 0, 16,
                                                              config.max_model_len - 1)


def test_the_header_declares_lmdeploys_settings_as_it_read_them() -> None:
    read = effective(CONFIG, short_turns=1, ttft_policy="fifo", aging_seconds=0.5)
    extra = header_extra(CONFIG, read)
    assert extra["settings"] == settings_from_lmdeploy(read)
    assert extra["settings"]["ttft_policy"] == "fifo"
    assert extra["settings"]["short_turns"] == 1
    assert extra["preempted_order"] is True


@pytest.mark.parametrize(("changes", "words"), [
    ({"max_model_len": 400}, "caps a session at its pool less one block, 304 tokens"),
    ({"max_num_seqs": 300}, "max_num_seqs"),
    ({"preemption": "recompute"}, "preemption"),
    ({"first_block_id": 1}, "first_block_id"),
])
def test_settings_refuse_what_lmdeploy_cannot_do(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(AdapterError, match=words):
        lmdeploy_settings(replace(CONFIG, **changes))


def test_a_built_cache_other_than_asked_is_refused() -> None:
    with pytest.raises(AdapterError, match="free blocks"):
        config_from_lmdeploy(effective(CONFIG, free_gpu_blocks=19))


def test_a_workload_with_an_abort_is_refused_naming_the_request(tmp_path: Path) -> None:
    items = validate([WorkItem("a", 0, 10, 2, 2), WorkItem("b", 1, 10, 2, 2, abort=3)])
    with pytest.raises(AdapterError, match="request 'b': an abort at step 3"):
        job_settings(Job("j", CONFIG, items, tmp_path / "t.jsonl"))


def event(**fields: Any) -> dict[str, Any]:
    """A driver step event: nothing happened but what `fields` say."""
    return {"step": 0, "arrivals": [], "refused": [], "aborted": [], "released": [],
            "preempted": [], "reclaimed": [], "kind": None, "scheduled": [], "void": [],
            "unsampled": [], "new_block_ids": {}, "prefix_hits": {}, "dedup": {},
            "finished": [],
            "free_blocks": 0, "evictable_blocks": 0, "cache_evicted": 0, **fields}


def test_lazy_victims_reclaims_and_releases_become_the_steps() -> None:
    items = {w.id: w for w in validate([WorkItem(i, 0, 40, 5, 5) for i in "abcd"])}
    rec = step_record(event(step=7, released=["a"], preempted=["b"], reclaimed=["c"],
                            kind="decode",
                            scheduled=[["d", 1], ["b", 1]], void=["d"],
                            new_block_ids={"d": [5], "b": []}, free_blocks=3),
                      items, CONFIG)
    assert rec.released == ("a",) and rec.reclaimed == ("c",)
    assert [(p.id, p.mode) for p in rec.preempted] == [("b", "lazy")]
    assert rec.scheduled == (("d", 1), ("b", 1))
    assert rec.new_blocks == {"d": (5,)}  # an entry without new blocks is left out
    assert rec.free_blocks == 3


def test_the_step_line_carries_lmdeploys_own_keys_only_when_they_say_something() -> None:
    items = {w.id: w for w in validate([WorkItem("a", 0, 40, 5, 5)])}
    quiet = event(kind="decode", scheduled=[["a", 1]], free_blocks=4)
    line = step_line(step_record(quiet, items, CONFIG), quiet)
    assert (line["kind"], line["engine_free"], line["evictable"]) == ("decode", 4, 0)
    assert not {"void", "unsampled", "cache_evicted"} & set(line)
    busy = event(kind="decode", scheduled=[["a", 1]], void=["a"], unsampled=["a"],
                 cache_evicted=2)
    rec = step_record(busy, items, CONFIG)
    line = step_line(rec, busy)
    assert (line["void"], line["cache_evicted"]) == (["a"], 2)
    # the dropped entries are trace v1's own step key, which the spec's state reads
    assert rec.unsampled == ("a",)
    assert parse_step(json.loads(json.dumps(line)), 2).unsampled == ("a",)


def test_free_blocks_count_the_tries_evictable_blocks_and_arrivals_get_content_keys() -> None:
    config = replace(CONFIG, prefix_caching=True)
    items = {w.id: w for w in validate([WorkItem("a", 0, 40, 5, 5),
                                        WorkItem("b", 0, 50, 5, 5, prefix=("a", 32)),
                                        WorkItem("long", 0, 400, 1, 1)])}
    ev = event(step=2, arrivals=["a", "b", "long"],
               refused=[{"id": "long", "reason": "The request exceeds the model context "
                                                 "length."}],
               kind="prefill", scheduled=[["a", 40], ["b", 18]],
               new_block_ids={"a": [0, 1, 2], "b": [3, 4]}, prefix_hits={"b": [0, 1]},
               free_blocks=10, evictable_blocks=5)
    rec = step_record(ev, items, config)
    assert rec.free_blocks == 15  # free and evictable: what the step invariant frees
    assert rec.prefix_hits == {"b": (0, 1)}
    assert rec.block_keys == {"a": ("a/0", "a/1"), "b": ("a/0", "a/1", "b/2")}
    assert [r.id for r in rec.rejected] == ["long"]  # refused: never holds content


def test_the_tries_swap_of_a_copy_for_its_own_block_is_the_steps_dedup() -> None:
    # b's block 2 (index 1) gave way to the trie's block 7 of the same content
    config = replace(CONFIG, prefix_caching=True)
    items = {w.id: w for w in validate([WorkItem("b", 0, 40, 5, 5)])}
    rec = step_record(event(step=9, kind="decode", scheduled=[["b", 1]],
                            dedup={"b": [1, 7]}, free_blocks=4), items, config)
    assert rec.dedup == {"b": (1, 7)}
    line = step_line(rec, event(kind="decode"))
    assert parse_step(json.loads(json.dumps(line)), 2).dedup == {"b": (1, 7)}


def kvsched(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def workload_file(tmp_path: Path, items: list[dict[str, Any]], name: str) -> Path:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(w) + "\n" for w in items))
    return path


WORKLOAD = [{"id": "a", "arrival": 0, "prompt_len": 40, "output_len": 5, "max_tokens": 10},
            {"id": "b", "arrival": 1, "prompt_len": 30, "output_len": 8, "max_tokens": 8}]


def test_cli_record_lmdeploy_refusals_are_one_line_exit_2(tmp_path: Path) -> None:
    base = ["record", "lmdeploy", "--out", str(tmp_path / "t.jsonl"),
            "--num-gpu-blocks", "20", "--max-num-batched-tokens", "256",
            "--max-num-seqs", "4"]
    plain = ["--workload", str(workload_file(tmp_path, WORKLOAD, "plain"))]
    aborted = ["--workload", str(workload_file(tmp_path, [
        *WORKLOAD, {"id": "c", "arrival": 0, "prompt_len": 9, "output_len": 2,
                    "max_tokens": 2, "abort": 1}], "aborted"))]
    missing = kvsched(*base, *plain, "--max-model-len", "304",
                      "--lmdeploy-python", str(tmp_path / "none" / "python"))
    too_long = kvsched(*base, *plain, "--max-model-len", "400")
    abort = kvsched(*base, *aborted, "--max-model-len", "304")
    interval = kvsched(*base, *plain, "--max-model-len", "304", "--prefill-interval", "8")
    for result, words in ((missing, "make lmdeploy-env"),
                          (interval, "prealloc_tokens is 16: they must agree"),
                          (too_long, "--max-model-len 304 or less"),
                          (abort, "request 'c': an abort at step 1")):
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("kvsched: error: ") and words in result.stderr
        assert result.stderr.count("\n") == 1
    assert not (tmp_path / "t.jsonl").exists()


def test_record_checks_the_config_with_lmdeploys_settings(tmp_path: Path) -> None:
    """--prefill-interval 8 with --prealloc-tokens 8 is a config LMDeploy runs: it gets
    past every check to the environment (missing here)."""
    result = kvsched("record", "lmdeploy", "--out", str(tmp_path / "t.jsonl"),
                     "--workload", str(workload_file(tmp_path, WORKLOAD, "w")),
                     "--num-gpu-blocks", "20", "--max-model-len", "304",
                     "--max-num-batched-tokens", "256", "--max-num-seqs", "4",
                     "--prefill-interval", "8", "--prealloc-tokens", "8",
                     "--step-seconds", "0.5", "--lmdeploy-python",
                     str(tmp_path / "none" / "python"))
    assert result.returncode == 2
    assert "LMDeploy's Python environment is missing" in result.stderr, result.stderr


def test_record_lmdeploy_is_in_the_table_with_its_own_options() -> None:
    assert ENGINE.name == "lmdeploy" and ENGINE.profile == "lmdeploy@0.18.0"
    help_text = kvsched("record", "lmdeploy", "--help").stdout
    for flag in ("--prefill-interval", "--step-seconds", "--ttft-policy",
                 "--ttft-short-turns", "--ttft-aging-sec", "--enable-chunked-prefill",
                 "--prefix-caching", "--lmdeploy-python"):
        assert flag in help_text


# The store: LMDeploy's kept traces (tests/data/lmdeploy/, `make conformance-lmdeploy
# ARGS=--keep`), read as JSON lines.

@cache
def kept() -> dict[str, bytes]:
    return dict(stored())


def lines(name: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in kept()[name].splitlines()[1:]]


def steps(name: str) -> list[dict[str, Any]]:
    return [rec for rec in lines(name) if "step" in rec]


def test_every_named_case_and_200_random_ones_are_kept_complete() -> None:
    names = set(kept())
    assert {c.name for c in CASES} <= names
    assert sum(n.startswith("random-") for n in names) >= 200
    for name, data in kept().items():
        header = json.loads(data.split(b"\n", 1)[0])
        assert header["engine"] == {"name": "lmdeploy", "version": "0.18.0"}, name
        assert header["config"]["pipelined"] and header["config"]["preemption"] == "lazy"
        assert lines(name)[-1] == {"end": True}, name


def test_every_kept_trace_is_lmdeploys_must_clean_and_exact() -> None:
    """Every kept trace, named and random, checked as the suite checks a live one: every
    MUST holds and profile lmdeploy@0.18.0 (with the header's settings) decides as
    LMDeploy did at every step."""
    verdicts = [check(name, data) for name, data in kept().items()]
    bad = [(v.case, dict(v.must), v.complete,
            None if v.divergence is None else v.divergence.message)
           for v in verdicts if v.must or not v.complete or v.divergence is not None]
    assert not bad
    assert {v.profile for v in verdicts} == {PROFILE}
    assert sum(v.preemptions for v in verdicts) >= 400  # lazy victims, replayed exactly


def test_the_lazy_cases_resume_on_their_blocks_or_recompute() -> None:
    def of(name: str, rid: str) -> list[tuple[int, int | None, bool, bool]]:
        """(step, tokens, preempted, reclaimed) of each step that prefills, preempts or
        reclaims `rid`."""
        out = []
        for rec in steps(name):
            n = dict(map(tuple, rec.get("scheduled", []))).get(rid)
            pre = any(p["id"] == rid for p in rec.get("preempted", []))
            rec_ = rid in rec.get("reclaimed", [])
            if pre or rec_ or (n is not None and rec.get("kind") != "decode"):
                out.append((rec["step"], n, pre, rec_))
        return out

    resumed = of("lazy-resumed", "a")
    assert [(p, r) for _, _, p, r in resumed] == [(False, False), (True, False),
                                                  (False, False)]
    assert resumed[-1][1] == 1  # the 1-token prefill on its own blocks
    recomputed = of("lazy-reclaimed", "a")
    assert [(p, r) for _, _, p, r in recomputed][:3] == [(False, False), (True, False),
                                                          (False, True)]
    assert recomputed[3][1] is not None and recomputed[3][1] > 60  # prompt and outputs


def test_the_named_cases_reach_their_rules() -> None:
    counts = {name: reached(data) for name, data in kept().items()}
    firsts: dict[str, int] = {}
    for rec in steps("head-of-line"):
        for rid, _ in rec.get("scheduled", []):
            firsts.setdefault(rid, rec["step"])
    assert firsts["s1"] >= firsts["big"] > 10  # the small ones waited behind it
    rejected = {r["id"] for rec in steps("front-end-limit") for r in rec.get("rejected", [])}
    assert rejected == {"fill", "past", "far"}
    assert counts["held-and-released"]["released"] and counts["held-and-released"]["void"]
    assert counts["prefix-hits"]["prefix_hits"] >= 10
    assert counts["prefix-eviction"]["unsampled"] and any(
        rec.get("cache_evicted") for rec in steps("prefix-eviction"))
    assert counts["self-preemption"]["preempted"] >= 5
    kinds = {rec.get("kind") for rec in steps("long-prompt-chunks")}
    assert {"chunk", "last_chunk", "prefill", "decode"} <= kinds
    short = [rec["scheduled"] for rec in steps("short-long-turns")
             if rec.get("kind") in ("prefill", "chunk", "last_chunk")]
    assert short[0] == [["long0", 128]] and all(len(s) == 1 and s[0][0].startswith("s")
                                                 for s in short[1:4])


def test_the_conversation_case_swaps_copies_for_the_tries_blocks() -> None:
    # the trie's swaps are the steps' dedup, and at least once another request's new
    # block in the same forward is a copy a swap freed
    tables: dict[str, list[int]] = {}
    swaps = taken = 0
    for rec in steps("conversation-dedup"):
        for rid in rec.get("reclaimed", []):
            tables[rid] = []
        for rid, ids in rec.get("prefix_hits", {}).items():
            tables[rid] = list(ids)
        new = rec.get("new_blocks", {})
        for rid, ids in new.items():
            tables.setdefault(rid, []).extend(ids)
        freed: dict[int, str] = {}
        for rid, table in rec.get("dedup", {}).items():
            mine = tables[rid]
            freed |= {mine[j]: rid for j, b in enumerate(table) if mine[j] != b}
            mine[: len(table)] = table
            swaps += 1
        taken += sum(freed.get(b, rid) != rid for rid, ids in new.items() for b in ids)
    assert swaps >= 2 and taken >= 1


@pytest.mark.parametrize("flip", sorted(FLIPS))
def test_each_rule_flipped_makes_a_kept_trace_diverge(flip: str, tmp_path: Path) -> None:
    """Agreeing with profile lmdeploy@0.18.0 on the kept traces pins each of its rules:
    flipped, some kept trace (the named cases first) tells it from LMDeploy."""
    knobs, changes, kind = variants()[flip]
    named = [c.name for c in CASES]
    traces = kept()
    for name in [*named, *sorted(set(traces) - set(named))]:
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(traces[name])
        if first_divergence(path, knobs, PROFILE, changes, kind) is not None:
            return
    pytest.fail(f"{PROFILE} with {flip} decides as LMDeploy on every kept trace")
