"""Record LMDeploy 0.18.0's real PyTorch-engine scheduler on a kvsched workload as trace v1.

LMDeploy runs in its own virtual environment (.venv-lmdeploy, `make lmdeploy-env`),
driven by lmdeploy_driver.py beside this file; this module says what is LMDeploy's own
(its settings, the config it built, its step lines): ENGINE, which the recording core
(kvsched.adapters.recording) records with.

Mapping (LMDeploy source lines in docs/conformance/lmdeploy.md):
- a block is one of LMDeploy's KV blocks, ids its own, from 0; num_gpu_blocks is its
  cache's, no host blocks (its recompute eviction swaps nothing);
- the token budget is max_prefill_token_num (a prefill forward's; a decode forward runs
  every running request), max_num_seqs is max_batches, max_model_len is max_session_len
  as the engine computes it (min(session_len, pool less a block), engine.py:328), and
  the serving front end refuses prompts of that length or longer (AsyncEngine.preprocess,
  serve/core/async_engine.py:549: max_prompt_len, and a prompt that fills max_model_len);
  a prompt over the budget is chunked (chunked_prefill);
- a forward prefills or decodes (step_mix prefill_or_decode), and every allocation
  reserves prefill_interval tokens beyond the tokens the scheduler knows
  (prealloc_tokens); the next forward is decided before a forward's output is applied
  (pipelined): a request that finished may sit in the next forward's batch (the step
  line's `void`) and holds its blocks until its session ends (`released`) or an
  allocation reclaims them (`reclaimed`);
- a decode that cannot grow preempts the request itself, lazily: it keeps its blocks
  and computed tokens (victim mode lazy) until an allocation reclaims them;
- prefix caching is LMDeploy's block trie; free_blocks counts its free blocks plus the
  trie's blocks no request holds (evictable: what the step invariant counts as free),
  and each step line carries both of LMDeploy's own counts; where the trie swapped a
  request's full blocks for its own of the same content, the step says so (`dedup`);
- LMDeploy's options that are profile knobs (prefill_interval, enable_chunked_prefill,
  the LMDEPLOY_PT_TTFT_* variables, and the driver's logical clock step_seconds) are a
  job's settings, declared in the trace's header ("settings");
- a client's abort is not driven: the adapter refuses a workload that has one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvsched.adapters import recording
from kvsched.adapters.recording import AdapterError
from kvsched.spec.model import Config, Preemption, StepRecord
from kvsched.spec.prefix import keys
from kvsched.spec.profiles import SettingsError, get_profile
from kvsched.spec.step_kinds import refusal
from kvsched.spec.trace import step_dict
from kvsched.workload import WorkItem

LMDEPLOY_VERSION = "0.18.0"
ENGINE_PROFILE = "lmdeploy@0.18.0"
DEFAULT_LMDEPLOY_PYTHON = Path(".venv-lmdeploy/bin/python")
DRIVER = Path(__file__).with_name("lmdeploy_driver.py")
SETUP_HINT = "create it with `make lmdeploy-env` (scripts/lmdeploy_env.sh)"
# The knobs of profile lmdeploy@0.18.0 that are LMDeploy's options (StepKind.settings),
# as the driver's job and header name them.
SETTINGS = ("prefill_interval", "enable_chunked_prefill", "short_turns", "aging_seconds",
            "ttft_policy", "step_seconds")


def lmdeploy_rules(settings: Mapping[str, object]) -> Any:
    """The rules of LMDeploy's step under a job's settings (knob name to value): profile
    lmdeploy@0.18.0's knobs with them (LMDeployKnobs). AdapterError, one line, for one
    that is not a setting."""
    try:
        return get_profile(ENGINE_PROFILE).for_trace(settings).knobs
    except SettingsError as e:
        raise AdapterError(str(e)) from None


def max_session_len(config: Config) -> int:
    """The longest session LMDeploy runs on `config`'s cache: its pool less one block
    (Engine._get_max_session_len, engine.py:328-341)."""
    return (config.num_gpu_blocks - 1) * config.block_size


def lmdeploy_settings(config: Config, settings: Mapping[str, object] | None = None
                      ) -> dict[str, Any]:
    """The driver's LMDeploy settings for a kvsched config and a job's settings.

    Raises AdapterError for what LMDeploy's scheduler cannot express, and for what it
    refuses at start-up (kvsched.spec.step_kinds: the one place that says it).
    post: __return__["session_len"] == config.max_model_len
    """
    problems = config.problems()
    if problems:
        raise AdapterError(problems[0])
    knobs = lmdeploy_rules(settings or {})
    ignored = refusal("lmdeploy", config, knobs=knobs)
    if ignored is not None:
        raise AdapterError(ignored)
    longest = max_session_len(config)
    if config.max_model_len > longest:
        raise AdapterError(f"max_model_len {config.max_model_len}: LMDeploy caps a session "
                           f"at its pool less one block, {longest} tokens on "
                           f"{config.num_gpu_blocks} blocks of {config.block_size}; give "
                           f"--max-model-len {longest} or less, or more blocks")
    rules = knobs.lmdeploy
    return {
        "block_size": config.block_size,
        "num_gpu_blocks": config.num_gpu_blocks,
        "max_batches": config.max_num_seqs,
        "max_prefill_token_num": config.max_num_batched_tokens,
        "session_len": config.max_model_len,
        "enable_prefix_caching": config.prefix_caching,
        **{name: getattr(rules, name) for name in SETTINGS},
    }


def settings_from_lmdeploy(effective: Mapping[str, Any]) -> dict[str, object]:
    """The settings (profile knobs that are LMDeploy's options) of a scheduler LMDeploy
    really built: what its trace's header declares ("settings")."""
    return {name: effective[name] for name in SETTINGS}


def config_from_lmdeploy(effective: Mapping[str, Any]) -> Config:
    """The kvsched config of a scheduler LMDeploy really built (the driver reads it back)."""
    if effective["free_gpu_blocks"] != effective["num_gpu_blocks"] \
            or effective["eviction_type"] != "recompute" or effective["num_cpu_blocks"]:
        raise AdapterError(f"LMDeploy built a cache of {effective['free_gpu_blocks']} free "
                           f"blocks of {effective['num_gpu_blocks']}, eviction "
                           f"{effective['eviction_type']!r}, {effective['num_cpu_blocks']} "
                           "host blocks; the adapter drives a recompute cache, all free")
    return Config(
        block_size=effective["block_size"],
        num_gpu_blocks=effective["num_gpu_blocks"],
        num_cpu_blocks=0,
        max_num_batched_tokens=effective["max_prefill_token_num"],
        max_num_seqs=effective["max_batches"],
        max_model_len=effective["max_session_len"],
        chunked_prefill=True,
        long_prefill_token_threshold=0,
        policy="fcfs",
        preemption="lazy",
        watermark_blocks=0,
        first_block_id=0,
        prefix_caching=bool(effective["enable_prefix_caching"]),
        step_mix="prefill_or_decode",
        # AsyncEngine.preprocess refuses a prompt of session_len tokens or more
        # (async_engine.py:549), session_len being max_session_len here: the longest
        # prompt it takes is one token shorter
        max_prompt_len=effective["max_session_len"] - 1,
        prealloc_tokens=effective["prealloc_size"],
        pipelined=True,
    )


def step_record(event: Mapping[str, Any], workload: Mapping[str, WorkItem],
                config: Config) -> StepRecord:
    """One driver step event as a trace step: LMDeploy's own block ids, victims and
    reclaims in the order LMDeploy took them, free blocks counting the trie's evictable
    ones; with prefix caching, each arrival's content keys of its prompt's full blocks
    (the tokens the driver gave it: kvsched.spec.prefix)."""
    bs = config.block_size
    refused = {r["id"] for r in event["refused"]}
    block_keys = {rid: tuple(keys(rid, workload[rid].shared,
                                  workload[rid].prompt_len // bs, bs))
                  for rid in event["arrivals"]
                  if rid not in refused} if config.prefix_caching else {}
    return StepRecord(
        event["step"],
        **recording.loop_fields(event, workload),
        preempted=tuple(Preemption(rid, "lazy") for rid in event["preempted"]),
        finished=tuple(event["finished"]),
        free_blocks=event["free_blocks"] + event["evictable_blocks"],
        new_blocks={rid: tuple(ids) for rid, ids in event["new_block_ids"].items() if ids},
        prefix_hits={rid: tuple(ids) for rid, ids in event["prefix_hits"].items() if ids},
        dedup={rid: tuple(ids) for rid, ids in event["dedup"].items()},
        block_keys={rid: ks for rid, ks in block_keys.items() if ks},
        released=tuple(event["released"]),
        reclaimed=tuple(event["reclaimed"]),
        unsampled=tuple(event.get("unsampled") or ()),
    )


def step_line(rec: StepRecord, event: Mapping[str, Any]) -> dict[str, Any]:
    """The trace line of a step: trace v1's keys (`unsampled` among them: the entries
    whose token LMDeploy dropped, the next forward having preempted them), then
    LMDeploy's own (readers ignore them): the forward's kind, its void entries (requests
    that had finished), the block manager's free count and the trie's evictable blocks,
    and the trie blocks an allocation evicted."""
    own: dict[str, Any] = {"kind": event["kind"], "engine_free": event["free_blocks"],
                           "evictable": event["evictable_blocks"]}
    if event["void"]:
        own["void"] = list(event["void"])
    if event["cache_evicted"]:
        own["cache_evicted"] = event["cache_evicted"]
    return {**step_dict(rec), **own}


def header_extra(config: Config, effective: Mapping[str, Any]) -> dict[str, Any]:
    """The header's own keys: victims in order, LMDeploy's settings that are profile
    knobs, and what the adapter says of its mapping."""
    return {"preempted_order": True, "settings": settings_from_lmdeploy(effective),
            "adapter": {
        "name": "kvsched.adapters.lmdeploy",
        "scheduler": "lmdeploy.pytorch.paging.Scheduler, InputsMakerAsync and "
                     "EngineLoop._main_loop_get_outputs (the next forward dispatched "
                     "before this one's output is applied)",
        "blocks": "LMDeploy's KV blocks, ids its own, from 0",
        "free_blocks": "LMDeploy's free blocks plus its block trie's blocks no request "
                       "holds; each line's engine_free and evictable give both",
        "prefix_caching": ("LMDeploy's block trie: hits found by its own trie on real "
                           "token ids" if config.prefix_caching else False),
        "preempted": "a decode that cannot grow preempts the request itself, which keeps "
                     "its blocks (lazy): the driver hooks Scheduler.preempt_seqs",
        "reclaimed": "requests not running whose blocks an allocation took, in LMDeploy's "
                     "order: the driver hooks RecomputeEvictionHelper._reclaim_candidate",
        "released": "a finished request's session ends where the engine's loop next "
                    "yields after its finish: Scheduler.end_session frees its blocks",
        "clock": f"LMDeploy's time readings replaced by a logical clock: step k reads "
                 f"k x {effective['step_seconds']} s plus 1 ns a reading; the trie's "
                 "eviction ties broken by node creation order instead of id()",
        "max_session_len": effective["max_session_len"],
    }}


class LMDeployTrace(recording.TraceFile):
    """The trace file of one job of LMDeploy's scheduler."""

    def __init__(self, job: recording.Job, header: Mapping[str, Any]) -> None:
        built = recording.built_as_asked(job, config_from_lmdeploy(header["config"]),
                                         "LMDeploy")
        asked = settings_from_lmdeploy(lmdeploy_settings(job.config, job.settings))
        for name, value in settings_from_lmdeploy(header["config"]).items():
            if asked[name] != value:
                raise AdapterError(f"{job.name}: LMDeploy changed the settings: {name}: "
                                   f"asked {asked[name]!r}, LMDeploy uses {value!r}")
        super().__init__(job, recording.Recorded(job, built, {
            "name": "lmdeploy", "version": str(header["lmdeploy"])}),
            header_extra(built, header["config"]))

    def step(self, event: Mapping[str, Any]) -> StepRecord:
        rec = step_record(event, self.by_id, self.result.config)
        return self.write(rec, step_line(rec, event))


def job_settings(job: recording.Job) -> dict[str, Any]:
    """The driver's settings for a job: its config's (lmdeploy_settings), once no request
    is aborted (the driver does not deliver LMDeploy's cancellation)."""
    settings = lmdeploy_settings(job.config, job.settings)
    for item in job.workload:
        if item.abort is not None:
            raise AdapterError(f"request {item.id!r}: an abort at step {item.abort}; the "
                               "LMDeploy driver does not deliver a client's cancellation "
                               "(docs/conformance/lmdeploy.md says why)")
    return settings


def summary(result: recording.Recorded) -> str:
    return (f"LMDeploy {result.engine.get('version', '?')}, {result.steps} steps, "
            f"{len(result.job.workload)} requests, {result.preemptions} preemptions")


OPTIONS = (
    recording.EngineOption(
        "--prefill-interval", "After this many decode forwards in a row while requests "
        "wait, a forward tries a prefill; also the tokens every allocation reserves "
        "beyond a request's known ones, which --prealloc-tokens must give alike.",
        knob="prefill_interval", default="16, LMDeploy's"),
    recording.EngineOption(
        "--enable-chunked-prefill", "LMDeploy's enable_chunked_prefill: every forward "
        "tries a prefill first while nothing is ready.", knob="enable_chunked_prefill",
        switch=True, as_knob={"on": True}),
    recording.EngineOption(
        "--ttft-policy", "LMDEPLOY_PT_TTFT_POLICY: the order of long prompts (above the "
        "token budget): fewest chunks after aging first (size) or arrival (fifo).",
        knob="ttft_policy", choices=("size", "fifo"), default="size"),
    recording.EngineOption(
        "--ttft-short-turns", "LMDEPLOY_PT_TTFT_SHORT_TURNS: short prefills admitted "
        "while a long prompt waits, before its turn.", knob="short_turns",
        default="3, LMDeploy's"),
    recording.EngineOption(
        "--ttft-aging-sec", "LMDEPLOY_PT_TTFT_AGING_SEC: a long prompt's estimated "
        "chunks drop by one per this many seconds waited (on the logical clock).",
        knob="aging_seconds", real=True, default="2.0, LMDeploy's"),
    recording.EngineOption(
        "--step-seconds", "The logical clock LMDeploy's time readings are replaced with: "
        "seconds per step.", knob="step_seconds", real=True, default="0.025"),
)

ENGINE = recording.Engine(
    name="lmdeploy", label="LMDeploy", release=LMDEPLOY_VERSION, profile=ENGINE_PROFILE,
    step_kind="lmdeploy", driver=DRIVER, python=DEFAULT_LMDEPLOY_PYTHON,
    make_env="lmdeploy-env", setup_hint=SETUP_HINT, settings=job_settings,
    trace=LMDeployTrace, summary=summary, python_flag="--lmdeploy-python",
    refuses_undersized_cache=False, log_level="ERROR", options=OPTIONS,
    defaults={"block_size": 16},
    help="""Record LMDeploy 0.18.0's real PyTorch-engine scheduler (in its own environment)
    on a workload.

    Config as LMDeploy and profile lmdeploy@0.18.0 set it: blocks of 16 tokens, each
    forward a prefill or a decode, long prompts chunked at the token budget
    (max_prefill_token_num), max_num_seqs its max_batches, max_model_len its session
    length (at most the pool less one block), lazy preemption, one forward decided
    ahead of its output (pipelined), prefix caching off (--prefix-caching is its
    enable_prefix_caching). LMDeploy's own options below set the profile's knobs, which
    the trace's header declares; aborts are refused. Check the trace with
    `kvsched check --profile lmdeploy@0.18.0`.""")
