"""Record SGLang 0.5.23's real scheduler on a kvsched workload as trace v1.

SGLang runs in its own virtual environment (.venv-sglang, `make sglang-env`), driven by
sglang_driver.py beside this file; this module says what is SGLang's own (its
settings, the config it built, its step lines): ENGINE, which the recording core
(kvsched.adapters.recording) records with.

Mapping (SGLang source lines in docs/conformance/sglang.md):
- a block is one of SGLang's pages: block_size = page_size, num_gpu_blocks =
  max_total_tokens / page_size; page ids are SGLang's own, from 1 (its page 0 pads);
- the token budget of a step is SGLang's chunked_prefill_size, and without chunked
  prefill its max_prefill_tokens; with chunked prefill max_prefill_tokens is the knob of
  that name (SGLang's default, 16384, unless set); max_num_seqs is max_running_requests;
  max_model_len is the model's context length;
- SGLang's options that are profile knobs (StepKind.settings: --max-prefill-tokens,
  --priority-scheduling-preemption-threshold, --schedule-low-priority-values-first,
  --retraction-policy) are a job's settings, declared in the trace's header ("settings");
  --schedule-policy is fcfs, the one policy the profile models (OPTIONS);
- a step is prefill work or decodes (config step_mix prefill_or_decode), or with
  --enable-mixed-chunk decodes may join a chunked prefill step (mixed_chunk);
- SGLang retracts by recompute and has no swap space, no watermark and no long-prefill
  threshold; priority scheduling is config policy priority (SGLang's priority values as
  given: a higher value is more urgent, which profile sglang@0.5.23 says);
- prefix caching is SGLang's radix cache; free_blocks counts SGLang's free pages plus
  its evictable radix-cache pages (what the step invariant calls reclaimable), each
  step line also carries both of SGLang's own counts, its mode and its new_token_ratio;
- SGLang's front end refuses a prompt of max_req_len - 5 tokens or more (max_req_len =
  min(context - 1, pool - 1)): config max_prompt_len is max_req_len - 6, and the
  driver's refusals (SGLang's validate_input_length) are the trace's rejections, in the
  arrival step; SGLang clips a request's max_new_tokens to what its context and its
  pool can hold: the adapter refuses a workload with a request it would clip, naming
  it, since the trace would not say what was served;
- a client's abort is SGLang's Scheduler.abort_request before the step: the waiting
  request and the one being chunked it releases at once are the step's `aborted`; a
  running one runs one more forward and finishes with FINISH_ABORT, a finish of that
  step, which the step line's own `abort_finished` also lists.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvsched.adapters import recording
from kvsched.adapters.recording import AdapterError
from kvsched.reference.sglang import output_room
from kvsched.spec.blocks import prompt_over_limit
from kvsched.spec.knobs import SGLangKnobs
from kvsched.spec.model import Config, Preemption, StepRecord
from kvsched.spec.prefix import keys
from kvsched.spec.profiles import SettingsError, get_profile
from kvsched.spec.step_kinds import refusal
from kvsched.spec.trace import step_dict
from kvsched.workload import WorkItem

SGLANG_VERSION = "0.5.23"
ENGINE_PROFILE = "sglang@0.5.23"
DEFAULT_SGLANG_PYTHON = Path(".venv-sglang/bin/python")
DRIVER = Path(__file__).with_name("sglang_driver.py")
SETUP_HINT = "create it with `make sglang-env` (scripts/sglang_env.sh)"


def sglang_knobs(settings: Mapping[str, object]) -> SGLangKnobs:
    """The rules of SGLang's step under a job's settings (knob name to value): profile
    sglang@0.5.23's with them. AdapterError, one line, for one that is not a setting."""
    try:
        return get_profile(ENGINE_PROFILE).for_trace(settings).knobs.sglang
    except SettingsError as e:
        raise AdapterError(str(e)) from None


def sglang_settings(config: Config, settings: Mapping[str, object] | None = None
                    ) -> dict[str, Any]:
    """The driver's SGLang settings for a kvsched config and a job's settings (its
    profile knobs that are SGLang's options: StepKind.settings).

    Raises AdapterError for what SGLang's scheduler cannot express, and for what SGLang
    refuses at start-up (kvsched.spec.step_kinds: the one place that says it).
    post: __return__["max_total_tokens"] == config.num_gpu_blocks * config.block_size
    """
    problems = config.problems()
    if problems:
        raise AdapterError(problems[0])
    profile = get_profile(ENGINE_PROFILE)
    rules = sglang_knobs(settings or {})
    # what SGLang's step does not express, or SGLang refuses at start-up
    ignored = refusal("sglang", config, knobs=profile.for_trace(settings or {}).knobs)
    if ignored is not None:
        raise AdapterError(ignored)
    if not config.chunked_prefill and "max_prefill_tokens" in (settings or {}):
        raise AdapterError("--max-prefill-tokens: without chunked prefill SGLang's "
                           "max_prefill_tokens is the token budget; give "
                           "--max-num-batched-tokens instead")
    if config.max_num_seqs > config.max_num_batched_tokens:
        raise AdapterError(f"max_num_seqs ({config.max_num_seqs}) above "
                           f"max_num_batched_tokens ({config.max_num_batched_tokens}): a "
                           "decode step of SGLang's would exceed the token budget")
    return {
        "page_size": config.block_size,
        "max_total_tokens": config.num_gpu_blocks * config.block_size,
        "chunked_prefill_size": config.max_num_batched_tokens if config.chunked_prefill
        else -1,
        "max_prefill_tokens": rules.max_prefill_tokens if config.chunked_prefill
        else config.max_num_batched_tokens,
        "max_running_requests": config.max_num_seqs,
        "context_len": config.max_model_len,
        "schedule_policy": "fcfs",
        "enable_priority_scheduling": config.policy == "priority",
        "priority_scheduling_preemption_threshold": rules.priority_preemption_threshold,
        "schedule_low_priority_values_first": not rules.higher_priority_first,
        "retraction_policy": RETRACTION_POLICIES[rules.retract_victim],
        "disable_radix_cache": not config.prefix_caching,
        "enable_mixed_chunk": config.step_mix == "mixed_chunk",
    }


def served_as_asked(config: Config, item: WorkItem) -> str | None:
    """Why SGLang would not serve `item` as the workload asks (it clips its output:
    scheduler.py:2700-2730), or None. A prompt longer than config max_prompt_len is
    refused on arrival (validate_input_length, utils.py:259), which the trace says as
    its rejection: whatever its max_tokens, that is what the workload asked."""
    room = output_room(config, item.prompt_len)
    if prompt_over_limit(config, item.prompt_len) is not None:
        return None
    if item.max_tokens > room:
        return (f"request {item.id!r}: SGLang clips max_tokens {item.max_tokens} to "
                f"{max(0, room)} (its context and pool hold no more)")
    return None


# SGLang's --retraction-policy for each retraction victim it has.
RETRACTION_POLICIES = {"fewest_outputs": "length", "least_urgent": "priority"}


def settings_from_sglang(effective: Mapping[str, Any]) -> dict[str, object]:
    """The settings (profile knobs that are SGLang's options, StepKind.settings) of a
    scheduler SGLang really built: what its trace's header declares ("settings")."""
    victims = {v: k for k, v in RETRACTION_POLICIES.items()}
    if effective.get("retraction_policy", "length") not in victims:
        raise AdapterError(f"SGLang built its scheduler with retraction policy "
                           f"{effective['retraction_policy']!r}, which the adapter does "
                           "not drive")
    return {"max_prefill_tokens": effective["max_prefill_tokens"],
            "priority_preemption_threshold":
                effective["priority_scheduling_preemption_threshold"],
            "higher_priority_first": not effective["schedule_low_priority_values_first"],
            "retract_victim": victims[effective.get("retraction_policy", "length")]}


def config_from_sglang(effective: Mapping[str, Any]) -> Config:
    """The kvsched config of a scheduler SGLang really built (the driver reads it back)."""
    page = effective["page_size"]
    total = effective["max_total_tokens"]
    if total % page or effective["available_tokens"] != total:
        raise AdapterError(f"SGLang built a pool of {effective['available_tokens']} free "
                           f"tokens for {total} in pages of {page}")
    if effective["enable_overlap"] or effective["schedule_policy"] != "fcfs":
        raise AdapterError("SGLang built its scheduler with overlap, or another policy "
                           "than fcfs; the adapter needs neither")
    chunk = effective["chunked_prefill_size"]
    chunked = chunk is not None and chunk > 0
    return Config(
        block_size=page,
        num_gpu_blocks=total // page,
        num_cpu_blocks=0,
        max_num_batched_tokens=chunk if chunked else effective["max_prefill_tokens"],
        max_num_seqs=effective["max_running_requests"],
        max_model_len=effective["context_len"],
        chunked_prefill=chunked,
        long_prefill_token_threshold=0,
        policy="priority" if effective["enable_priority_scheduling"] else "fcfs",
        preemption="recompute",
        watermark_blocks=0,
        first_block_id=1,
        prefix_caching=not effective["disable_radix_cache"],
        step_mix="mixed_chunk" if effective["enable_mixed_chunk"] else "prefill_or_decode",
        # its front end aborts prompts of max_req_input_len = max_req_len - 5 tokens or
        # more (validate_input_length)
        max_prompt_len=effective["max_req_len"] - 6,
    )


def step_record(event: Mapping[str, Any], workload: Mapping[str, WorkItem],
                config: Config) -> StepRecord:
    """One driver step event as a trace step: SGLang's own page ids, victims in the order
    SGLang released them, free pages counting the evictable radix-cache pages; with the
    radix cache on, each arrival's content keys of its prompt's full pages (the tokens
    the driver gave it: kvsched.spec.prefix)."""
    step = event["step"]
    page = config.block_size
    refused = {r["id"] for r in event["refused"]}
    block_keys = {rid: tuple(keys(rid, workload[rid].shared,
                                  workload[rid].prompt_len // page, page))
                  for rid in event["arrivals"]
                  if rid not in refused} if config.prefix_caching else {}
    return StepRecord(
        step,
        **recording.loop_fields(event, workload),
        preempted=tuple(Preemption(rid, "recompute") for rid in event["preempted"]),
        finished=tuple(event["finished"]),
        free_blocks=event["free_pages"] + event["evictable_pages"],
        new_blocks={rid: tuple(ids) for rid, ids in event["new_block_ids"].items() if ids},
        prefix_hits={rid: tuple(ids) for rid, ids in event["prefix_hits"].items() if ids},
        block_keys={rid: ks for rid, ks in block_keys.items() if ks},
        dedup={rid: tuple(ids) for rid, ids in event["dedup"].items()},
    )


def step_line(rec: StepRecord, event: Mapping[str, Any]) -> dict[str, Any]:
    """The trace line of a step: trace v1's keys, then SGLang's own (readers ignore
    them): its step mode, its free and evictable page counts, the new-token ratio its
    admission used, and, when some finished, the finishes that were a client's abort
    (FINISH_ABORT after the running request's last forward)."""
    own = {"mode": event["mode"], "free_pages": event["free_pages"],
           "evictable_pages": event["evictable_pages"],
           "new_token_ratio": event["new_token_ratio"]}
    if event["abort_finished"]:
        own["abort_finished"] = list(event["abort_finished"])
    return {**step_dict(rec), **own}


def header_extra(config: Config, effective: Mapping[str, Any]) -> dict[str, Any]:
    """The header's own keys: victims in order, SGLang's settings that are profile
    knobs ("settings": the profile replays the trace with them), and what the adapter
    says of its mapping."""
    return {"preempted_order": True, "settings": settings_from_sglang(effective), "adapter": {
        "name": "kvsched.adapters.sglang",
        "scheduler": "sglang.srt.managers.scheduler.Scheduler (event_loop_normal's step; "
                     "the overlap loop is not recorded)",
        "pages": "a block is one of SGLang's KV pages of page_size tokens; page ids are "
                 "SGLang's own (slot // page_size), from 1",
        "free_blocks": "SGLang's free pages plus its evictable radix-cache pages; each "
                       "line's free_pages and evictable_pages give both",
        "prefix_caching": ("SGLang's radix cache: hits found by its own tree on real token "
                           "ids" if config.prefix_caching else False),
        "preempted": "retracted (decode steps) or preempted for priority (prefill steps), "
                     "in the order SGLang released them: the driver hooks "
                     "ScheduleBatch.release_req",
        "clock": "SGLang's time readings replaced by a logical clock (one tick per "
                 "reading), so LRU eviction and priority ties are the same in every run",
        "new_token_ratio": {k: effective[k] for k in (
            "init_new_token_ratio", "min_new_token_ratio", "new_token_ratio_decay")},
    }}


class SglangTrace(recording.TraceFile):
    """The trace file of one job of SGLang's scheduler."""

    def __init__(self, job: recording.Job, header: Mapping[str, Any]) -> None:
        built = recording.built_as_asked(job, config_from_sglang(header["config"]), "SGLang")
        asked = settings_from_sglang({**header["config"], **sglang_settings(job.config,
                                                                             job.settings)})
        for name, value in settings_from_sglang(header["config"]).items():
            if asked[name] != value:
                raise AdapterError(f"{job.name}: SGLang changed the settings: {name}: "
                                   f"asked {asked[name]!r}, SGLang uses {value!r}")
        super().__init__(job, recording.Recorded(job, built, {"name": "sglang",
                                                    "version": str(header["sglang"])}),
                         header_extra(built, header["config"]))

    def step(self, event: Mapping[str, Any]) -> StepRecord:
        rec = step_record(event, self.by_id, self.result.config)
        return self.write(rec, step_line(rec, event))


def job_settings(job: recording.Job) -> dict[str, Any]:
    """The driver's settings for a job: its config's (sglang_settings), once each
    request is one SGLang serves as asked."""
    settings = sglang_settings(job.config, job.settings)
    for item in job.workload:
        why = served_as_asked(job.config, item)
        if why is not None:
            raise AdapterError(why)
    return settings


def summary(result: recording.Recorded) -> str:
    return (f"SGLang {result.engine.get('version', '?')}, {result.steps} steps, "
            f"{len(result.job.workload)} requests, {result.preemptions} retractions and "
            "preemptions")


# SGLang 0.5.23's --schedule-policy words (arg_groups/fields/schedule.py:86-101), each
# but fcfs with the queue order the profile does not model.
_UNMODELLED_ORDERS = {
    "lpm": "the longest cached prefix first", "random": "a random order",
    "dfs-weight": "the radix tree's depth-first weights",
    "lof": "the longest output first", "priority": "its priority policy's own order",
    "routing-key": "routing keys", "hrrn": "the highest response ratio first",
    "shortest-prefill-first": "the shortest prefill first"}
OPTIONS = (
    recording.EngineOption(
        "--max-prefill-tokens", "With chunked prefill, the most tokens of one prefill "
        "step beside the chunk (SGLang's --max-prefill-tokens); without it, "
        "--max-num-batched-tokens is SGLang's max_prefill_tokens.",
        knob="max_prefill_tokens", default=f"{SGLangKnobs().max_prefill_tokens}, SGLang's"),
    recording.EngineOption(
        "--schedule-policy", "SGLang's queue order; the profile models fcfs (and "
        "--policy priority, SGLang's priority scheduling over it), and refuses the others.",
        choices=("fcfs", *_UNMODELLED_ORDERS), default="fcfs",
        refused={word: f"SGLang's --schedule-policy {word} orders the waiting queue by "
                       f"{what}, which profile {ENGINE_PROFILE} does not model; use fcfs"
                 for word, what in _UNMODELLED_ORDERS.items()}),
    recording.EngineOption(
        "--priority-scheduling-preemption-threshold", "Under --policy priority, a waiting "
        "request preempts running ones less urgent by more than this.",
        knob="priority_preemption_threshold",
        default=f"{SGLangKnobs().priority_preemption_threshold}, SGLang's"),
    recording.EngineOption(
        "--schedule-low-priority-values-first", "Under --policy priority, a lower value "
        "is more urgent (SGLang's default: a higher one).", knob="higher_priority_first",
        switch=True, as_knob={"on": False}),
    recording.EngineOption(
        "--retraction-policy", "Which decoding request a full cache retracts first: the "
        "fewest outputs (length) or, under --policy priority, the least urgent (priority).",
        knob="retract_victim", choices=tuple(RETRACTION_POLICIES.values()),
        as_knob={v: k for k, v in RETRACTION_POLICIES.items()}, default="length"),
)

ENGINE = recording.Engine(
    name="sglang", label="SGLang", release=SGLANG_VERSION, profile=ENGINE_PROFILE,
    step_kind="sglang", driver=DRIVER, python=DEFAULT_SGLANG_PYTHON,
    make_env="sglang-env", setup_hint=SETUP_HINT, settings=job_settings,
    trace=SglangTrace, summary=summary, python_flag="--sglang-python",
    refuses_undersized_cache=False, log_level="ERROR", options=OPTIONS,
    defaults={"block_size": 1, "num_gpu_blocks": 16384},
    help="""Record SGLang 0.5.23's real scheduler (in its own environment) on a workload.

    Config defaults as SGLang and profile sglang@0.5.23 set them: pages of 1 token
    (SGLang's page_size) in a pool of 16384 tokens, step_mix prefill_or_decode
    (--step-mix mixed_chunk is SGLang's --enable-mixed-chunk), preemption recompute,
    prefix caching on, SGLang's radix cache as it serves by default
    (--no-prefix-caching is its --disable-radix-cache); a block is one of SGLang's
    pages. SGLang's own options below set the profile's knobs, which the trace's header
    declares; what SGLang refuses at start-up is refused here. Check the trace with
    `kvsched check --profile sglang@0.5.23`.""")
