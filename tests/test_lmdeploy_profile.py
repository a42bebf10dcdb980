"""Profile lmdeploy@0.18.0: LMDeploy 0.18.0's rules (kvsched.reference.lmdeploy), each on a
small hand-made workload run through the reference, its knobs (LMDeployKnobs), each of
which changes some decision when flipped, and its step kind's refusals."""

from __future__ import annotations

import gzip
import io
import json
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest

from kvsched.reference import scheduler_for
from kvsched.reference.lmdeploy import LMDeployScheduler
from kvsched.spec.knobs import Knobs, LMDeployKnobs
from kvsched.spec.model import Config, Decision, Request, Status
from kvsched.spec.profiles import SettingsError, get_profile, resolve_profile
from kvsched.spec.replay import ProfileReplay
from kvsched.spec.step_kinds import STEP_KINDS, knob_refusal, refusal
from kvsched.spec.trace import TraceReader

PROFILE = get_profile("lmdeploy@0.18.0")


def config(**given: Any) -> Config:
    base: dict[str, Any] = dict(block_size=16, num_gpu_blocks=40,
                                max_num_batched_tokens=256, max_num_seqs=4, max_model_len=600)
    base.update(given)
    return PROFILE.configure(Config(**base), frozenset(given))


def rules(**given: Any) -> Knobs:
    return replace(Knobs(), lmdeploy=LMDeployKnobs(**given))


Arrivals = list[tuple[int, Request]]


def run(arrivals: Arrivals, knobs: Knobs | None = None, steps: int = 400,
        **given: Any) -> tuple[list[Decision], list[tuple[str, ...]], LMDeployScheduler]:
    """Every step's decision and finishes, until nothing is live or left to arrive."""
    sched = LMDeployScheduler(config(**given), knobs)
    decisions: list[Decision] = []
    finished: list[tuple[str, ...]] = []
    for step in range(steps):
        for at, request in arrivals:
            if at == step:
                sched.add_request(request)
        if not sched.has_unfinished() and all(at <= step for at, _ in arrivals):
            break
        decisions.append(sched.schedule())
        finished.append(sched.update(set()))
    return decisions, finished, sched


def req(rid: str, prompt: int, outputs: int) -> Request:
    return Request(rid, prompt, outputs)


def first_step(decisions: list[Decision], rid: str) -> int:
    return next(i for i, d in enumerate(decisions) if rid in dict(d.scheduled))


def is_decode(d: Decision) -> bool:
    return bool(d.scheduled) and all(n == 1 for _, n in d.scheduled)


# -- the rules ---------------------------------------------------------------------------


def test_a_forward_prefills_or_decodes_never_both() -> None:
    decisions, _, _ = run([(0, req("a", 40, 30)), (3, req("b", 30, 20)),
                           (5, req("c", 50, 10))])
    assert decisions[0].scheduled == (("a", 40),)
    for d in decisions:
        prompts = [rid for rid, n in d.scheduled if n > 1]
        assert not prompts or len(prompts) == len(d.scheduled), d.scheduled


PREFILL_INTERVAL_WORKLOAD: Arrivals = [(0, req("a", 20, 60)), (0, req("b", 20, 60)),
                                       (2, req("c", 20, 10))]


def test_prefill_after_prefill_interval_decodes_in_a_row() -> None:
    # a and b hold half the seats and c's tokens are few: decodes until 16 in a row
    decisions, _, _ = run(PREFILL_INTERVAL_WORKLOAD)
    assert decisions[0].scheduled == (("a", 20), ("b", 20))
    assert all(is_decode(d) for d in decisions[1:first_step(decisions, "c")])
    assert first_step(decisions, "c") == 2 + 16
    flipped, _, _ = run(PREFILL_INTERVAL_WORKLOAD, rules(prefill_interval=4),
                        prealloc_tokens=4)
    assert first_step(flipped, "c") == 2 + 4


def test_prefill_when_seats_are_half_empty_or_prompts_fill_the_budget() -> None:
    one_running = [(0, req("a", 20, 60)), (2, req("c", 20, 10))]
    assert first_step(run(one_running)[0], "c") == 2  # 1 of 4 seats taken
    big_waiting = [*PREFILL_INTERVAL_WORKLOAD[:2], (2, req("c", 256, 10))]
    assert first_step(run(big_waiting)[0], "c") == 2  # its tokens reach the budget


HEAD_OF_LINE: Arrivals = [(0, req("a", 100, 40)), (1, req("big", 200, 5)),
                          (1, req("small", 10, 5))]


def test_a_prompt_that_does_not_fit_blocks_the_queue_behind_it() -> None:
    # 16 blocks: a holds 8 (100 + 16 tokens); big needs 14, small would fit in the 8 left
    decisions, _, _ = run(HEAD_OF_LINE, num_gpu_blocks=16)
    assert first_step(decisions, "small") == first_step(decisions, "big") > 40
    skipping, _, _ = run(HEAD_OF_LINE, rules(head_of_line_blocking=False),
                         num_gpu_blocks=16)
    assert first_step(skipping, "small") == 1 < first_step(skipping, "big")


# 6 blocks, 3 each (prompt + 16 tokens): b needs a 4th at 48 tokens, 10 outputs before a
LAZY: Arrivals = [(0, req("a", 20, 25)), (0, req("b", 30, 60))]
# both need a 4th block in the same decode
BOTH: Arrivals = [(0, req("a", 30, 60)), (0, req("b", 30, 60))]


def test_a_decode_that_cannot_grow_preempts_itself_keeping_its_blocks() -> None:
    decisions, _, sched = run(LAZY, steps=20, num_gpu_blocks=6)
    step, victim = next((i, d.preempted[0]) for i, d in enumerate(decisions) if d.preempted)
    assert (step, victim.id, victim.mode) == (19, "b", "lazy")
    assert decisions[step].scheduled == (("a", 1),) and not decisions[step].reclaimed
    view = sched.states()["b"]
    assert view.status is Status.WAITING and view.gpu_blocks == 3 and view.num_computed > 0


def test_a_lazy_victim_resumes_with_one_token_when_its_blocks_were_not_taken() -> None:
    decisions, _, _ = run(LAZY, num_gpu_blocks=6)
    back = next(d for d in decisions[20:] if "b" in dict(d.scheduled))
    assert back.scheduled == (("b", 1),)
    assert not any("b" in d.reclaimed for d in decisions)


def test_decode_visits_the_last_admitted_first_and_a_victim_may_be_reclaimed_at_once() -> None:
    decisions, _, _ = run(BOTH, steps=20, num_gpu_blocks=6)
    assert decisions[19].preempted[0].id == "b" and decisions[19].reclaimed == ("b",)
    assert decisions[19].new_blocks == {"a": (3,)}
    forward, _, _ = run(BOTH, rules(decode_reverse_order=False), steps=20, num_gpu_blocks=6)
    assert forward[19].preempted[0].id == "a" and forward[19].reclaimed == ("a",)


def test_without_self_preemption_a_request_that_cannot_grow_sits_out() -> None:
    decisions, _, _ = run(LAZY, rules(self_preemption=False), steps=40, num_gpu_blocks=6)
    assert not any(d.preempted for d in decisions)
    assert decisions[19].scheduled == (("a", 1),)


def test_a_finished_request_runs_once_more_and_holds_its_blocks_until_released() -> None:
    decisions, finished, sched = run([(0, req("a", 20, 3)), (0, req("b", 20, 30))])
    step = next(i for i, f in enumerate(finished) if "a" in f)
    void = decisions[step + 1]
    assert "a" in dict(void.scheduled) and "a" not in void.sampled
    assert all("a" not in d.released for d in decisions[:step + 3])
    assert decisions[step + 3].released == ("a",)
    later, _, _ = run([(0, req("a", 20, 3)), (0, req("b", 20, 30))], rules(release_delay=5))
    assert later[step + 5].released == ("a",)
    assert sched.states().get("a") is None


RECLAIM: Arrivals = [(1, req("r3", 25, 5)), (5, req("r1", 19, 38)), (5, req("r2", 12, 28)),
                     (5, req("r4", 39, 24)), (9, req("r0", 13, 7))]


def test_an_allocation_reclaims_finished_requests_before_waiting_ones() -> None:
    # 11 blocks, sessions ending 30 steps after their finish: r0 has finished and holds
    # its blocks, r2 waits holding its own (a lazy victim) when r4's decode needs one
    held = rules(release_delay=30)
    decisions, _, _ = run(RECLAIM, held, num_gpu_blocks=11)
    assert decisions[36].reclaimed == ("r0",)
    waiting_first, _, _ = run(RECLAIM, rules(release_delay=30, reclaim_finished_first=False),
                              num_gpu_blocks=11)
    assert waiting_first[36].reclaimed == ("r2",)


def test_long_prompts_are_chunked_alone_and_short_ones_take_their_turns() -> None:
    work: Arrivals = [(0, req("long", 600, 5)), (0, req("s1", 10, 5)),
                      (1, req("s2", 12, 5)), (1, req("s3", 14, 5)), (1, req("s4", 16, 5))]
    decisions, _, _ = run(work, num_gpu_blocks=80, max_model_len=700)
    chunks = [d.scheduled for d in decisions if "long" in dict(d.scheduled)]
    assert [n for (_, n), in chunks if n > 1] == [256, 256, 88]
    # the short prompts' prefills (s1, then s2 to s4 together) come first
    assert first_step(decisions, "long") > first_step(decisions, "s4") == 1
    one, _, _ = run(work, rules(short_turns=1), num_gpu_blocks=80, max_model_len=700)
    assert first_step(one, "long") == 1 < first_step(one, "s2")


# "first" is chunked while "older" (4 chunks) and then "newer" (2 chunks) arrive
TWO_LONG: Arrivals = [(0, req("a", 20, 200)), (0, req("b", 20, 200)),
                      (0, req("first", 600, 5)), (1, req("older", 800, 5)),
                      (4, req("newer", 300, 5))]
LONG_CACHE: dict[str, Any] = {"num_gpu_blocks": 300, "max_model_len": 1200}


def test_long_prompts_go_smallest_first_or_in_arrival_order() -> None:
    kw = LONG_CACHE
    size, _, _ = run(TWO_LONG, **kw)
    assert first_step(size, "newer") < first_step(size, "older")
    fifo, _, _ = run(TWO_LONG, rules(ttft_policy="fifo"), **kw)
    assert first_step(fifo, "older") < first_step(fifo, "newer")
    # a chunk of credit every step waited: the older one's 4 chunks age first
    aged, _, _ = run(TWO_LONG, rules(aging_seconds=0.025), **kw)
    assert first_step(aged, "older") < first_step(aged, "newer")
    clock, _, _ = run(TWO_LONG, rules(aging_seconds=0.025, step_seconds=0.001), **kw)
    assert first_step(clock, "newer") < first_step(clock, "older")


def test_enable_chunked_prefill_tries_a_prefill_every_forward() -> None:
    decisions, _, _ = run(PREFILL_INTERVAL_WORKLOAD, rules(enable_chunked_prefill=True))
    assert first_step(decisions, "c") == 2


def test_block_ids_come_from_the_head_of_lmdeploys_free_list() -> None:
    decisions, _, _ = run([(0, req("a", 20, 1)), (0, req("b", 20, 40)),
                           (6, req("c", 40, 3))])
    assert decisions[0].new_blocks == {"a": (0, 1, 2), "b": (3, 4, 5)}
    # a's blocks went back to the head in table order, then the never used ones
    assert decisions[first_step(decisions, "c")].new_blocks == {"c": (0, 1, 2, 6)}


def test_the_front_end_refuses_a_prompt_that_fills_the_session() -> None:
    decisions, _, _ = run([(0, req("fill", 600, 5)), (0, req("fits", 599, 5))],
                          num_gpu_blocks=60, max_num_batched_tokens=1024)
    assert [r.id for r in decisions[0].rejected] == ["fill"]


# -- every knob is a rule -----------------------------------------------------------------

FLIPS: dict[str, tuple[Any, Arrivals, dict[str, Any]]] = {
    "prefill_interval": (4, PREFILL_INTERVAL_WORKLOAD, {"prealloc_tokens": 4}),
    "enable_chunked_prefill": (True, PREFILL_INTERVAL_WORKLOAD, {}),
    "short_turns": (1, [(0, req("long", 600, 5)), (0, req("s1", 10, 5)),
                        (1, req("s2", 12, 5))], {"num_gpu_blocks": 80,
                                                 "max_model_len": 700}),
    "aging_seconds": (0.025, TWO_LONG, LONG_CACHE),
    "step_seconds": (2.0, TWO_LONG, LONG_CACHE),
    "ttft_policy": ("fifo", TWO_LONG, LONG_CACHE),
    "head_of_line_blocking": (False, HEAD_OF_LINE, {"num_gpu_blocks": 16}),
    "self_preemption": (False, LAZY, {"num_gpu_blocks": 6}),
    "decode_reverse_order": (False, BOTH, {"num_gpu_blocks": 6}),
    "reclaim_finished_first": (False, RECLAIM, {"num_gpu_blocks": 11}),
    "release_delay": (5, [(0, req("a", 20, 3)), (0, req("b", 20, 30))], {}),
}


def test_every_knob_has_a_flip() -> None:
    assert set(FLIPS) == {f.name for f in fields(LMDeployKnobs)}


@pytest.mark.parametrize("name", sorted(FLIPS))
def test_flipping_a_knob_changes_a_decision(name: str) -> None:
    value, work, given = FLIPS[name]
    # reclaim order matters only while finished requests are held long enough
    held = {"release_delay": 30} if name == "reclaim_finished_first" else {}
    base_given = {k: v for k, v in given.items() if k != "prealloc_tokens"}
    base, _, _ = run(work, rules(**held), **base_given)
    flipped, _, _ = run(work, rules(**held, **{name: value}), **given)
    assert [d.comparable() for d in base] != [d.comparable() for d in flipped]


# -- refusals -----------------------------------------------------------------------------


def test_another_kinds_knob_is_refused_and_lmdeploys_by_the_others() -> None:
    assert "LMDeploy's step does not read knob victim tail" in str(
        knob_refusal("lmdeploy", Knobs(victim="tail")))
    why = knob_refusal("v1", rules(short_turns=1))
    assert why is not None and "lmdeploy.short_turns 1" in why and "LMDeploy" in why
    with pytest.raises(ValueError, match="does not read knob victim"):
        LMDeployScheduler(config(), Knobs(victim="tail"))
    with pytest.raises(ValueError, match="does not read knob"):
        scheduler_for(Config(step_mix="prefill_or_decode"), rules(short_turns=1), "sglang")


@pytest.mark.parametrize(("given", "words"), [
    ({"policy": "priority"}, "no priority scheduling"),
    ({"chunked_prefill": False}, "always splits a prompt"),
    ({"preemption": "recompute"}, "lazily"),
    ({"pipelined": False}, "before applying"),
    ({"num_cpu_blocks": 8}, "no swap"),
    ({"first_block_id": 1}, "start at 0"),
    ({"step_mix": "any"}, "never both"),
])
def test_the_step_kind_refuses_what_lmdeploy_does_not_do(given: dict[str, Any],
                                                           words: str) -> None:
    why = refusal("lmdeploy", replace(config(), **given))
    assert why is not None and words in why


def test_the_step_kind_refuses_what_lmdeploy_cannot_run_as_the_spec_says() -> None:
    seats = refusal("lmdeploy", config(max_num_seqs=300, max_num_batched_tokens=256))
    assert seats is not None and "decode" in seats
    prealloc = refusal("lmdeploy", replace(config(), prealloc_tokens=8))
    assert prealloc is not None and "prealloc_tokens is 8" in prealloc
    assert refusal("lmdeploy", replace(config(), prealloc_tokens=8),
                   knobs=rules(prefill_interval=8)) is None
    assert refusal("lmdeploy", config(), knobs=rules(release_delay=0)) is not None
    assert refusal("lmdeploy", config()) is None


def test_the_other_kinds_refuse_lmdeploys_config_words() -> None:
    for kind in ("v1", "v0", "sglang"):
        for given in ({"pipelined": True}, {"prealloc_tokens": 16},
                      {"preemption": "lazy"}):
            assert refusal(kind, replace(Config(step_mix=STEP_KINDS[kind].takes.get(
                "step_mix", ("any",))[0]), **given)) is not None, (kind, given)  # type: ignore[arg-type]


# -- the profile --------------------------------------------------------------------------


def test_the_profile_answers_to_its_release_names_and_takes_the_headers_settings() -> None:
    assert resolve_profile("lmdeploy") == resolve_profile("lmdeploy@0.18") == PROFILE.name
    configured = config()
    assert (configured.preemption, configured.pipelined, configured.prealloc_tokens,
            configured.step_mix, configured.max_prompt_len) == (
        "lazy", True, 16, "prefill_or_decode", 599)
    traced = PROFILE.for_trace({"step_seconds": 1, "ttft_policy": "fifo", "short_turns": 2,
                                "aging_seconds": 0.5, "prefill_interval": 8,
                                "enable_chunked_prefill": True})
    assert traced.knobs.lmdeploy == LMDeployKnobs(
        prefill_interval=8, enable_chunked_prefill=True, short_turns=2, aging_seconds=0.5,
        step_seconds=1.0, ttft_policy="fifo")
    with pytest.raises(SettingsError, match="ttft_policy must be one of size, fifo"):
        PROFILE.for_trace({"ttft_policy": "sjf"})
    with pytest.raises(SettingsError, match="step_seconds must be a number"):
        PROFILE.for_trace({"step_seconds": "fast"})
    with pytest.raises(SettingsError, match="not a setting"):
        PROFILE.for_trace({"release_delay": 2})


# -- LMDeploy's own decisions ---------------------------------------------------------------

STORE = Path(__file__).parent / "data" / "lmdeploy"


def kept(path: Path) -> tuple[dict[str, Any], list[str]]:
    """A kept trace's header and its other lines."""
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    return json.loads(lines[0]), lines[1:]


NAMED = sorted(p for p in STORE.glob("*.jsonl.gz") if not p.name.startswith("random-"))


def test_the_suites_named_cases_are_kept_with_and_without_prefix_caching() -> None:
    caching = [kept(p)[0]["config"].get("prefix_caching", False) for p in NAMED]
    assert len(NAMED) >= 15 and caching.count(True) >= 2


# Every kept trace, named and random, replays exactly under the profile with its header's
# settings: tests/test_adapter_lmdeploy.py (test_every_kept_trace_is_lmdeploys_must_clean_
# and_exact), as `make conformance-lmdeploy` checks a live one.


# Random cases where a request's last token is dropped: the next forward preempts it, so
# it finishes only after it computes the token again (the reference knows of the drop
# only in that next decision, which takes the finish back: Decision.unsampled).
DROPPED_LAST = [STORE / f"random-{n}.jsonl.gz" for n in (12, 44, 146)]


@pytest.mark.parametrize("path", DROPPED_LAST, ids=lambda p: p.name.removesuffix(".jsonl.gz"))
def test_the_profile_replays_a_dropped_last_token_exactly(path: Path) -> None:
    header, lines = kept(path)
    assert any("unsampled" in json.loads(x) for x in lines[:-1])
    reader = TraceReader(io.BytesIO("\n".join([json.dumps(header), *lines]).encode()))
    profile = PROFILE.for_trace(reader.header.settings)
    replaying = ProfileReplay(profile.name, scheduler_for(reader.header.config,
                                                          profile.knobs, "lmdeploy"))
    for rec in reader:
        divergence = replaying.step(rec)
        assert divergence is None, divergence.message


def test_a_replay_without_the_traces_dropped_entry_diverges_at_its_step() -> None:
    # random-12's step 371 drops r16's last token; a trace that does not say so has the
    # profile finish r16 there, where the engine did not
    header, lines = kept(STORE / "random-12.jsonl.gz")
    steps = [json.loads(x) for x in lines[:-1]]
    assert steps[371]["unsampled"] == ["r16"] and "r16" not in steps[371].get("finished", ())
    del steps[371]["unsampled"]
    reader = TraceReader(io.BytesIO("\n".join(json.dumps(x) for x in [header, *steps])
                                    .encode()))
    profile = PROFILE.for_trace(reader.header.settings)
    replaying = ProfileReplay(profile.name, scheduler_for(reader.header.config,
                                                          profile.knobs, "lmdeploy"))
    divergence = next(filter(None, map(replaying.step, reader)))
    assert divergence.step == 371
    assert "the profile finishes r16 | the trace finishes nothing" in divergence.message


SHARED: Arrivals = [(0, Request("a", 70, 30, prefix=(("sys", 48),))),
                    (2, Request("b", 60, 5, prefix=(("sys", 48),)))]


def test_a_prompt_hits_the_blocks_an_earlier_one_put_in_the_trie() -> None:
    decisions, _, _ = run(SHARED, prefix_caching=True)
    step = first_step(decisions, "b")
    assert decisions[step].prefix_hits == {"b": (0, 1, 2)}
    assert dict(decisions[step].scheduled)["b"] == 60 - 48
    cold, _, _ = run(SHARED)
    assert dict(cold[first_step(cold, "b")].scheduled)["b"] == 60 and not any(
        d.prefix_hits for d in cold)


def test_cached_blocks_count_as_free_and_are_evicted_least_recently_used_first() -> None:
    # 16 blocks: a's 4 full blocks stay cached after its session ends (second 0 of the
    # clock), d's 2 (second 1); c needs 11 with 10 free: the older leaf goes, a's block 3
    work: Arrivals = [(0, req("a", 70, 2)), (45, req("d", 40, 2)), (90, req("c", 150, 3))]
    decisions, _, sched = run(work, steps=90, prefix_caching=True, num_gpu_blocks=16)
    assert sched.free_blocks() == 16 and len(sched.free_gpu_ids()) == 10
    decisions, _, sched = run(work, steps=91, prefix_caching=True, num_gpu_blocks=16)
    assert decisions[90].new_blocks == {"c": (3, *range(6, 16))}
    assert sched.free_blocks() == 5 and not sched.free_gpu_ids()
