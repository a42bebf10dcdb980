"""Drive SGLang 0.5.23's real scheduler on kvsched workloads; runs with SGLang's own Python.

    <sglang-venv>/bin/python sglang_driver.py JOBS.jsonl

This file imports only the standard library, SGLang and driver_host.py beside it (by its
path, for the process around the jobs, the loop of a job's steps and the token contents;
never kvsched, which need not be installed in SGLang's environment). It reads one job
per line of JOBS.jsonl and writes raw events, one JSON object per line, to its standard
output; kvsched.adapters.sglang turns them into trace v1.

NOTE on what runs. SGLang's Scheduler cannot be constructed on a CPU (its __init__ loads
a model and sizes CUDA pools), but its scheduling methods run unchanged on an object made
with Scheduler.__new__, as SGLang's own unit tests make one, carrying SGLang's real
objects: the KV allocator (TokenToKVPoolAllocator, or PagedTokenToKVPoolAllocator above
page size 1, as kv_cache_configurator.py chooses), the ReqToTokenPool, the
UnifiedRadixCache (SGLang's tree cache also with the radix cache disabled) and the policy
objects its own init_chunked_prefill and init_schedule_policy build from the published
ServerArgs. Each step is Scheduler.event_loop_normal's body (scheduler.py:2026) minus the
ingest: get_next_batch_to_run (admission, chunked prefill, retraction, priority
preemption), run_batch, process_batch_result (finishes, KV release, radix insertion), all
SGLang's own. Only the model is fake (FakeWorker: one token per request in the batch), and
the collaborators that decide nothing (metrics, output streaming, load publishing) are
inert. on_idle is reduced to its one scheduling effect: the new-token ratio resets when
the scheduler is fully idle (scheduler.py:5318).

The loop is the non-overlap one (disable_overlap_schedule): SGLang's default overlap
loop schedules the next batch before it has processed the last batch's results, so it
sees a finish one step late; that loop is outside what is recorded
(docs/conformance/sglang.md says why).

NOTE on tokens: prompts and outputs are driver_host.Contents' token ids, so a request
whose workload prefix names a shared text or an earlier request's whole sequence really
shares those tokens, and SGLang's own radix tree decides the hits. They are drawn from
2**31 - 1 ids (VOCAB; SGLang keeps them in int32), not a model's vocabulary: SGLang's
radix tree matches single tokens at page size 1, and two contents must never share a
token by chance.

NOTE on the clock: SGLang stamps radix nodes with time.monotonic() and priority ties with
the request's queue entry time; both are in the decision path (LRU eviction, the order of
equal priorities). The driver replaces SGLang's clock with a logical one that advances by
one at every reading, so a recording's decisions are the same in every run.

NOTE on the job: driver_host.run_job runs its steps (arrivals, aborts, the max_steps and
stall stops); Job is SGLang's side. An arrival is taken as the scheduler's
handle_generate_request takes it: SGLang's own validate_input_length refuses a prompt of
max_req_input_len (max_req_len - 5) tokens or more, with its message, and such a request
never reaches the queue; else init_req_max_new_tokens clips its max_new_tokens (a clip
stops the job: the trace would not say what was served) and it is queued. An abort is
SGLang's own Scheduler.abort_request(AbortReq), delivered before the step's
get_next_batch_to_run as SGLang's loop delivers one: a waiting request is popped at once,
the request being chunked is released at the top of the step
(process_pending_chunked_abort; its last chunk is then never cached), and a running one
is marked to finish: it runs one more forward and finishes with FINISH_ABORT. SGLang
aborts every request whose rid starts with the one named, so a request's rid is its
workload id followed by RID_END. Its abort outputs go nowhere (inert_aborts).

Events:
    {"job": name, "sglang": version, "config": {...}}   the settings SGLang built with
    {"step": s, "arrivals": [ids], "refused": [{"id", "reason"}], "aborted": [ids],
     "preempted": [ids], "mode": "EXTEND"|"DECODE"|"MIXED"|null, "scheduled": [[id, n]],
     "new_block_ids": {id: [ids]}, "prefix_hits": {id: [ids]}, "finished": [ids],
     "abort_finished": [ids], "dedup": {id: [ids]}, "free_pages": n,
     "evictable_pages": n, "new_token_ratio": x}
    {"done": name, "complete": bool, "steps": n[, "stopped": "one line"][, "stalled": s]}
    {"error": "one line"}    (then exit status 3)
`arrivals` lists every request that arrived, `refused` those SGLang refused (never
queued); `aborted` the requests SGLang let go because of an abort before the step's
batch (waiting ones, and the one being chunked); `finished` every request that finished
in the step, `abort_finished` those of them that finished with SGLang's abort (running
requests that ran their last forward). A job "stopped" when SGLang did something trace v1
cannot say; it "stalled" from step s when its steps from s on decided nothing with
nothing left to arrive or abort (a chunk smaller than a page admits nothing).
Page ids are SGLang's own (slot // page_size; id 0 is SGLang's padding page, never
handed out). A request's pages are read from SGLang's req_to_token row: for a request
scheduled with prefix length p and extend length e, its new pages are those of row[p:p+e]
not already in row[:p], and, when it is (re)admitted with nothing computed, its prefix
hit is the distinct pages of row[:p]. Victims are listed in the order SGLang releases
them (ScheduleBatch.release_req, hooked: retract_decode and preempt_to_schedule both
release through it).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import itertools
import os
import runpy
import sys
import types
from array import array
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

SGLANG_VERSION = "0.5.23"
VOCAB = 2**31 - 1  # the token ids' range (NOTE on tokens): SGLang keeps them in int32


class DriverError(Exception):
    """Something SGLang did that trace v1 cannot say, or SGLang not as expected; one line."""


# -- importing SGLang on a CPU torch ------------------------------------------------------

class _Inert:
    """Any attribute, any call, any base class: what the torchvision stub hands out."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:
        return _Inert()

    def __getattr__(self, name: str) -> _Inert:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)


class _InertModule(types.ModuleType):
    def __getattr__(self, name: str) -> _Inert:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()


class _Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves an inert `torchvision`: SGLang's config package imports a multimodal helper
    that imports torchvision at module level (configs/nano_nemotron_vl.py:22 ->
    multimodal/internvl_utils.py:5), and the registry's torchvision wheels are built for
    another torch ("operator torchvision::nms does not exist"). The scheduler never
    calls it."""

    ROOTS = frozenset({"torchvision"})

    def find_spec(self, fullname: str, path: Any = None,
                  target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in self.ROOTS:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _InertModule(spec.name)
        module.__path__ = []
        module.__dict__["__version__"] = "0.0.0+stub"  # transformers compares its version
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _import_sglang() -> SimpleNamespace:
    sys.meta_path.insert(0, _Stub())
    m = importlib.import_module
    torch = m("torch")
    torch.set_num_threads(1)
    g = SimpleNamespace(torch=torch)
    g.ServerArgs = m("sglang.srt.server_args").ServerArgs
    g.rc = m("sglang.srt.runtime_context")
    sched = m("sglang.srt.managers.scheduler")
    g.Scheduler = sched.Scheduler
    g.sched_module = sched
    batch = m("sglang.srt.managers.schedule_batch")
    g.Req, g.ScheduleBatch = batch.Req, batch.ScheduleBatch
    g.FINISH_ABORT = batch.FINISH_ABORT
    g.AbortReq = m("sglang.srt.managers.io_struct").AbortReq
    g.validate_input_length = m("sglang.srt.managers.utils").validate_input_length
    g.GenerationBatchResult = m("sglang.srt.managers.utils").GenerationBatchResult
    g.SamplingParams = m("sglang.srt.sampling.sampling_params").SamplingParams
    g.TokenAllocator = m("sglang.srt.mem_cache.allocator.token").TokenToKVPoolAllocator
    g.PagedAllocator = m("sglang.srt.mem_cache.allocator.paged").PagedTokenToKVPoolAllocator
    g.ReqToTokenPool = m("sglang.srt.mem_cache.memory_pool").ReqToTokenPool
    g.CacheInitParams = m("sglang.srt.mem_cache.cache_init_params").CacheInitParams
    g.UnifiedRadixCache = m("sglang.srt.mem_cache.unified_radix_cache").UnifiedRadixCache
    g.ComponentType = m("sglang.srt.mem_cache.unified_cache.components").ComponentType
    g.SpeculativeAlgorithm = m("sglang.srt.speculative.spec_info").SpeculativeAlgorithm
    g.DisaggregationMode = m("sglang.srt.disaggregation.utils").DisaggregationMode
    g.ResultProcessor = m("sglang.srt.managers.scheduler_components.batch_result_processor"
                          ).SchedulerBatchResultProcessor
    g.ModelImpl = m("sglang.srt.model_loader.utils").ModelImpl
    return g


# -- the logical clock --------------------------------------------------------------------

class LogicalClock:
    """Stands in for time.monotonic/time.time/perf_counter in SGLang's modules: each
    reading is one more than the last, so every order SGLang takes from the clock (LRU,
    priority ties) is the order of its readings."""

    def __init__(self) -> None:
        self._ticks = itertools.count(1)

    def __call__(self) -> float:
        return float(next(self._ticks))

    def ns(self) -> int:
        return next(self._ticks)


def patch_clock(clock: LogicalClock) -> None:
    """Give every loaded SGLang module that holds the `time` module a logical one."""
    fake = types.ModuleType("time")
    fake.__dict__.update(vars(importlib.import_module("time")))
    for name in ("monotonic", "time", "perf_counter"):
        setattr(fake, name, clock)
    for name in ("monotonic_ns", "time_ns", "perf_counter_ns"):
        setattr(fake, name, clock.ns)
    real = importlib.import_module("time")
    for name, module in list(sys.modules.items()):
        if not name.startswith("sglang"):
            continue
        held = getattr(module, "time", None)
        if isinstance(held, types.ModuleType) and held.__name__ == "time":
            setattr(module, "time", fake)  # noqa: B010
        for fn in ("monotonic", "perf_counter"):  # `from time import monotonic`
            got = getattr(module, fn, None)
            if got is getattr(real, fn) or isinstance(got, LogicalClock):
                setattr(module, fn, clock)


# -- building the scheduler ---------------------------------------------------------------

class Inert:
    """A collaborator that decides nothing (metrics, streaming, load publishing): any
    method is a no-op. Plain attributes given at construction stay readable and writable
    (the decode path counts into the metrics reporter; a MagicMock there grows without
    bound)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None


class FakeWorker:
    """Stands in for the TP worker: one token per request in the batch, chosen by the
    workload (end-of-sequence at the request's hidden output length)."""

    def __init__(self, g: SimpleNamespace, sample: Any) -> None:
        self.g = g
        self.sample = sample
        self.model_runner = SimpleNamespace(attn_backend=SimpleNamespace(),
                                            prefill_aware_swa=False,
                                            ngram_embedding_manager=None,
                                            canary_manager=None)
        self.model_config = SimpleNamespace(use_ngram_embedding=False)

    def forward_batch_generation(self, batch: Any, **kwargs: Any) -> Any:
        ids = [self.sample(r) for r in batch.reqs]
        return self.g.GenerationBatchResult(
            next_token_ids=self.g.torch.tensor(ids, dtype=self.g.torch.int64),
            can_run_cuda_graph=False)


def build(g: SimpleNamespace, cfg: dict[str, Any], sample: Any) -> Any:
    """SGLang's Scheduler on `cfg` (kvsched.adapters.sglang.sglang_settings), with its real
    allocator, request pool, tree cache and policy objects."""
    args = g.ServerArgs(
        model_path="dummy", device="cpu", attention_backend="torch_native",
        page_size=cfg["page_size"], chunked_prefill_size=cfg["chunked_prefill_size"],
        max_prefill_tokens=cfg["max_prefill_tokens"],
        max_running_requests=cfg["max_running_requests"],
        schedule_policy=cfg["schedule_policy"], disable_overlap_schedule=True,
        disable_radix_cache=cfg["disable_radix_cache"],
        enable_mixed_chunk=cfg["enable_mixed_chunk"],
        max_total_tokens=cfg["max_total_tokens"], skip_tokenizer_init=True,
        enable_priority_scheduling=cfg["enable_priority_scheduling"],
        priority_scheduling_preemption_threshold=cfg[
            "priority_scheduling_preemption_threshold"],
        schedule_low_priority_values_first=cfg["schedule_low_priority_values_first"],
        retraction_policy=cfg["retraction_policy"])
    g.rc.reset_context()
    g.rc.publish(args, role="scheduler")
    page, total = cfg["page_size"], cfg["max_total_tokens"]
    torch = g.torch
    if page == 1:  # kv_cache_configurator.py:2914-2936
        alloc = g.TokenAllocator(total, dtype=torch.float16, device="cpu", kvcache=None,
                                 need_sort=False)
    else:
        alloc = g.PagedAllocator(total, page_size=page, dtype=torch.float16, device="cpu",
                                 kvcache=None, need_sort=False)
    req_pool = g.ReqToTokenPool(size=cfg["max_running_requests"],
                                max_context_len=cfg["context_len"] + 4, device="cpu",
                                enable_memory_saver=False)
    params = g.CacheInitParams(disable=cfg["disable_radix_cache"], req_to_token_pool=req_pool,
                               token_to_kv_pool_allocator=alloc, page_size=page,
                               chunked_prefill_size=cfg["chunked_prefill_size"])
    params.tree_components = (g.ComponentType.FULL,)
    tree = g.UnifiedRadixCache(params)

    s = g.Scheduler.__new__(g.Scheduler)
    sc = g.rc.get_schedule()
    plain = dict(
        server_args=args, forward_ct=0, processed_tokens_counter=0,
        schedule_policy=sc.schedule_policy,
        enable_priority_scheduling=sc.enable_priority_scheduling,
        abort_on_priority_when_disabled=sc.abort_on_priority_when_disabled,
        schedule_low_priority_values_first=sc.schedule_low_priority_values_first,
        priority_scheduling_preemption_threshold=sc.priority_scheduling_preemption_threshold,
        enable_lora=False, enable_overlap=False, enable_overlap_mlx=False,
        spec_algorithm=g.SpeculativeAlgorithm.NONE, page_size=page,
        enable_hierarchical_cache=False, enable_lmcache=False, enable_hicache_storage=False,
        enable_unified_cache_external_linker=False, enable_hisparse=False,
        attn_dp_enabled=False, enable_unified_memory=False, device="cpu",
        model_config=SimpleNamespace(
            vocab_size=VOCAB, is_encoder_decoder=False, is_multimodal=False,
            context_len=cfg["context_len"], hf_text_config=SimpleNamespace(),
            hf_config=SimpleNamespace(architectures=["LlamaForCausalLM"]),
            _resolved_model_impl=g.ModelImpl.SGLANG, self_opened_think_start_ids=None,
            think_end_ids=None, num_key_value_heads=1),
        req_to_token_pool=req_pool, token_to_kv_pool_allocator=alloc, tree_cache=tree,
        is_hybrid_swa=False, is_hybrid_ssm=False,
        disable_radix_cache=cfg["disable_radix_cache"],
        max_prefill_tokens=sc.max_prefill_tokens,
        max_running_requests=cfg["max_running_requests"],
        # what tp_worker.get_worker_info reports (tp_worker.py:568-572)
        max_req_len=min(cfg["context_len"] - 1, total - 1),
        max_new_tokens_limit=None, disaggregation_mode=g.DisaggregationMode.NULL,
        dllm_config=None, require_mlp_sync=False, truncation_align_size=None,
        hisparse_coordinator=None, decode_offload_manager=None, max_queued_requests=None,
        max_total_num_tokens=total, kv_shard_widening=1, sliding_window_size=None)
    for k, v in plain.items():
        setattr(s, k, v)
    s.max_req_input_len = s.max_req_len - 5
    s.init_chunked_prefill()
    s.dynamic_chunk_sizer = None
    s.metrics_reporter = Inert(enable_metrics=False, forward_ct_decode=0,
                               num_generated_tokens=0, num_retracted_reqs=0,
                               scheduler_stage_metrics=None)
    s.init_schedule_policy()
    s.model_worker = s.tp_worker = FakeWorker(g, sample)
    s.draft_worker = None
    s.is_generation = True
    s.enable_pdmux = False
    s.forward_stream = torch.cpu.Stream()
    s.init_overlap()
    s.init_running_status()
    s.init_beam_coordinator()
    s.metrics_collector = None
    s.load_inquirer = Inert(_get_num_pending_tokens=lambda chunk_deduct=0: 0)
    s.output_streamer = Inert()
    s.batch_result_processor = g.ResultProcessor(
        is_generation=True, disaggregation_mode=s.disaggregation_mode, enable_overlap=False,
        enable_overlap_mlx=False, model_config=s.model_config,
        token_to_kv_pool_allocator=alloc, tree_cache=tree, hisparse_coordinator=None,
        req_to_token_pool=req_pool, decode_offload_manager=None, metrics_collector=None,
        metrics_reporter=s.metrics_reporter, draft_worker=None, model_worker=s.model_worker,
        logprob_result_processor=Inert(), output_streamer=s.output_streamer,
        beam_coordinator=s.beam_coordinator, abort_request=Inert())
    s.grammar_manager = SimpleNamespace(has_waiting_grammars=lambda: False, grammar_queue=[])
    for k, v in dict(
            min_free_slots_delayer=None, lora_drainer=None, enable_fpm=False,
            scripted_scheduler_hook=None, profiler_manager=Inert(), _sched_idled=False,
            total_prefill_uncached_tokens=0, total_prefill_busy_us=0,
            decode_moment_totals=[0.0] * 6, _prev_step=None, _prev_prefill_end_ts=None,
            _pause_intervals=deque(maxlen=64), _pause_started_at=None,
            load_snapshot_writer=None, load_publisher=Inert(), pool_stats_observer=Inert(),
            scheduler_stage_metrics=None).items():
        setattr(s, k, v)
    s.ngram_embedding_manager = SimpleNamespace(
        prepare_for_forward=lambda b, chunked_req=None: b)
    s.dp_attn_adapter = SimpleNamespace(
        maybe_prepare_mlp_sync_batch=lambda b, need_sync=False: b,
        maybe_convert_decode_to_extend=lambda b: b)
    s.dllm_manager = SimpleNamespace(any_staging_reqs=lambda: False)
    # as Scheduler.init_model_worker does (scheduler.py:1237)
    parallel = g.rc.get_parallel()
    if not parallel.pp_max_micro_batch_size:
        g.rc.get_context().override(
            "scheduler.pp_max_micro_batch_size_default",
            pp_max_micro_batch_size=max(s.max_running_requests // parallel.pp_size, 1))
    return s


def effective_config(s: Any) -> dict[str, Any]:
    """The settings SGLang's scheduler really runs with, read back from its objects."""
    tracker = s.new_token_ratio_tracker
    alloc = s.token_to_kv_pool_allocator
    return {
        "page_size": s.page_size,
        "max_total_tokens": s.max_total_num_tokens,
        "available_tokens": int(alloc.available_size()),
        "chunked_prefill_size": s.chunked_prefill_size,
        "max_prefill_tokens": s.max_prefill_tokens,
        "max_running_requests": s.max_running_requests,
        "context_len": s.model_config.context_len,
        "max_req_len": s.max_req_len,
        "schedule_policy": str(s.schedule_policy),
        "enable_priority_scheduling": bool(s.enable_priority_scheduling),
        "schedule_low_priority_values_first": bool(s.schedule_low_priority_values_first),
        "priority_scheduling_preemption_threshold":
            s.priority_scheduling_preemption_threshold,
        "retraction_policy": str(s.server_args.retraction_policy),
        "disable_radix_cache": bool(s.tree_cache.disable),
        "enable_mixed_chunk": bool(s.is_mixed_chunk),
        "enable_overlap": bool(s.enable_overlap),
        "init_new_token_ratio": tracker.init,
        "min_new_token_ratio": tracker.min,
        "new_token_ratio_decay": tracker.decay,
    }


# -- one job ------------------------------------------------------------------------------

# A request's rid in SGLang is its workload id and RID_END: SGLang's abort_request aborts
# every request whose rid starts with the one named, and no workload id may be the
# start of another's rid then ("r1" and "r10").
RID_END = "\x00"


def wid(req: Any) -> str:
    """The workload id of one of SGLang's requests."""
    return str(req.rid).removesuffix(RID_END)


RELEASED: list[str] = []  # victims in the order SGLang released them, this step
PRIORITY_VICTIMS: list[str] = []  # those of them preempted for priority, in that order


def watch_releases(g: SimpleNamespace) -> None:
    """Hook ScheduleBatch.release_req, through which retract_decode and
    preempt_to_schedule free a victim's KV, to list victims in true order."""
    original = g.ScheduleBatch.release_req

    def release_req(self: Any, idx: int, *args: Any, **kwargs: Any) -> Any:
        RELEASED.append(wid(self.reqs[idx]))
        return original(self, idx, *args, **kwargs)

    g.ScheduleBatch.release_req = release_req
    adder = importlib.import_module("sglang.srt.managers.schedule_policy").PrefillAdder
    preempt = adder.preempt_to_schedule

    def preempt_to_schedule(self: Any, req: Any) -> Any:
        before = len(RELEASED)
        done = preempt(self, req)
        PRIORITY_VICTIMS.extend(RELEASED[before:])
        return done

    adder.preempt_to_schedule = preempt_to_schedule


def requeue_in_release_order(s: Any) -> None:
    """Put this step's victims of priority preemption back into the waiting queue in the
    order SGLang released them (the running batch's), with their queue entry times in
    that order. SGLang requeues them in the iteration order of a Python set of request
    objects (preempt_to_schedule, schedule_policy.py:1767-1777), which follows their
    memory addresses: no rule decides it, and a recording should not depend on the
    allocator. Any order is one SGLang could have taken."""
    if len(PRIORITY_VICTIMS) < 2:
        return
    queue = s.waiting_queue
    places = [i for i, q in enumerate(queue) if wid(q) in PRIORITY_VICTIMS]
    if len(places) != len(PRIORITY_VICTIMS):
        raise DriverError("the victims of a priority preemption are not all waiting")
    victims = sorted((queue[i] for i in places), key=lambda q: PRIORITY_VICTIMS.index(wid(q)))
    times = sorted(q.time_stats.wait_queue_entry_time for q in victims)
    for i, q, t in zip(places, victims, times, strict=True):
        queue[i] = q
        q.time_stats.wait_queue_entry_time = t


def batch_rows(s: Any, batch: Any) -> list[tuple[Any, int, int, list[int], list[int]]]:
    """(request, prefix length, tokens this step, new page ids, prefix page ids) for each
    request of a prepared batch, in batch order (the NOTE on page ids)."""
    page = s.page_size
    table = s.req_to_token_pool.req_to_token
    decode = batch.forward_mode.is_decode()
    rows = []
    for i, q in enumerate(batch.reqs):
        if decode:
            p, e = int(batch.seq_lens_cpu[i]) - 1, 1
        else:
            p, e = int(batch.prefix_lens[i]), int(batch.extend_lens[i])
        slots = table[q.kv.req_pool_idx, : p + e].tolist()
        old = list(dict.fromkeys(x // page for x in slots[:p]))
        seen = set(old)
        new: list[int] = []
        for x in slots[p:]:
            pg = x // page
            if pg not in seen:
                seen.add(pg)
                new.append(pg)
        rows.append((q, p, e, new, old))
    return rows


def deduplicated(s: Any, reqs: dict[str, Any], computed: dict[str, int],
                 tables: dict[str, list[int]]) -> dict[str, list[int]]:
    """The requests whose pages SGLang's radix cache swapped for its own copies of the
    same content this step (cache_req frees a request's duplicate pages and points its
    row at the cached ones), each with the pages its table now starts with; `tables`
    are brought up to date."""
    out: dict[str, list[int]] = {}
    page, table = s.page_size, s.req_to_token_pool.req_to_token
    for rid, pages in tables.items():
        q = reqs[rid]
        if q.kv.req_pool_idx is None or not pages:
            continue
        slots = table[q.kv.req_pool_idx, : computed[rid]].tolist()
        now = list(dict.fromkeys(x // page for x in slots))
        if now == pages:
            continue
        if len(now) != len(pages):
            raise DriverError(f"{rid}'s pages changed from {len(pages)} to {len(now)} "
                              "without being scheduled")
        changed = max(i for i, (a, b) in enumerate(zip(now, pages, strict=True)) if a != b)
        out[rid] = now[: changed + 1]
        tables[rid] = now
    return out


def inert_aborts(s: Any) -> None:
    """The collaborators SGLang's abort path calls that decide nothing: the abort output
    to the tokenizer, the grammar queue (this driver has none) and the multimodal
    receiver (none)."""
    s.send_abort_output = lambda abort_req, req: None
    s.grammar_manager.abort_requests = lambda abort_req: None
    s.mm_receiver = None


class Job:
    """One job on SGLang's scheduler: its side of driver_host.run_job's loop (arrive,
    abort, step, stopped), writing the job's header event when built."""

    def __init__(self, g: SimpleNamespace, host: SimpleNamespace, job: dict[str, Any],
                 emit: Any) -> None:
        self.g = g
        self.enable_priority = job["config"]["enable_priority_scheduling"]
        self.contents = host.Contents(job["requests"], VOCAB)
        self.aborts = host.aborts_by_step(job["requests"])
        self.eos = host.EOS_TOKEN_ID
        self.s = s = build(g, job["config"], self.sample)
        inert_aborts(s)
        patch_clock(LogicalClock())
        emit({"job": job["name"], "sglang": importlib.metadata.version("sglang"),
              "config": effective_config(s)})
        self.computed: dict[str, int] = {}  # kvsched's C: what each live request computed
        self.tables: dict[str, list[int]] = {}  # each request's pages, as said so far
        self.reqs: dict[str, Any] = {}  # the requests SGLang holds, by workload id

    def sample(self, req: Any) -> int:
        return int(self.contents.output(wid(req), len(req.output_ids)))

    def forget(self, rid: str) -> None:
        self.computed.pop(rid, None)
        self.tables.pop(rid, None)
        self.reqs.pop(rid, None)

    def arrive(self, w: dict[str, Any], order: int) -> str | None:
        """A request as SGLang's scheduler takes one (handle_generate_request): its
        prompt checked by SGLang's own validate_input_length (a prompt of
        max_req_input_len tokens or more is refused, with SGLang's message), its
        max_new_tokens clipped by SGLang's own init_req_max_new_tokens, then queued."""
        g, s = self.g, self.s
        sp = g.SamplingParams(max_new_tokens=w["max_tokens"])
        sp.normalize(None)  # as the tokenizer manager does
        sp.verify(VOCAB)
        req = g.Req(rid=w["id"] + RID_END, origin_input_text="",
                    origin_input_ids=array("q", self.contents.prompt(w["id"])),
                    sampling_params=sp, eos_token_ids={self.eos}, vocab_size=VOCAB,
                    priority=w["priority"] if self.enable_priority else None)
        reason = g.validate_input_length(req, s.max_req_input_len, False)
        if reason:
            return str(reason)
        s.init_req_max_new_tokens(req)  # SGLang's own clip (scheduler.py:2700)
        if req.sampling_params.max_new_tokens != w["max_tokens"]:
            raise DriverError(f"SGLang clips max_new_tokens of {w['id']} from "
                              f"{w['max_tokens']} to {req.sampling_params.max_new_tokens}")
        s._add_request_to_queue(req)
        self.reqs[w["id"]] = req
        self.computed[w["id"]] = 0
        return None

    def abort(self, rid: str) -> bool:
        """SGLang's own Scheduler.abort_request, as its loop delivers an AbortReq before
        the step's get_next_batch_to_run: a waiting request is popped at once, the one
        being chunked is released at the top of the step (process_pending_chunked_abort):
        both are let go now. A running one is marked to finish: it runs one more forward
        and finishes with FINISH_ABORT."""
        s, q = self.s, self.reqs[rid]
        released = s.chunked_req is q or any(r is q for r in s.waiting_queue)
        s.abort_request(self.g.AbortReq(rid=q.rid))
        if released:
            self.forget(rid)
        return released

    def step(self, step: int) -> tuple[dict[str, Any], list[str], bool]:
        """One pass of event_loop_normal's body after the ingest (the module's NOTE)."""
        s, computed, tables = self.s, self.computed, self.tables
        RELEASED.clear()
        PRIORITY_VICTIMS.clear()
        ratio = float(s.new_token_ratio_tracker.current)
        plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
        requeue_in_release_order(s)
        s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        preempted = list(RELEASED)
        for rid in preempted:
            computed[rid] = 0
            tables.pop(rid, None)
        scheduled, new_pages, hits = [], {}, {}
        finished: list[str] = []
        abort_finished: list[str] = []
        if batch:
            for q, p, e, new, old in batch_rows(s, batch):
                rid = wid(q)
                if computed[rid] == 0:
                    tables[rid] = list(old)
                    if p > 0:
                        hits[rid] = old
                elif p != computed[rid]:
                    raise DriverError(f"SGLang scheduled {rid} from token {p}, but it had "
                                      f"computed {computed[rid]}")
                computed[rid] = p + e
                tables[rid] += new
                scheduled.append([rid, e])
                if new:
                    new_pages[rid] = new
            s.process_batch_result(batch, s.run_batch(batch))
            chunked = s.chunked_req
            if chunked is not None and chunked.extend_end > chunked.prefix_len \
                    and wid(chunked) not in self.aborts.get(step + 1, ()):
                # The next step's get_next_batch_to_run caches the middle chunk first
                # thing (scheduler.py:3918); done here, the step that computed it says
                # what it deduplicated (nothing touches the cache in between). Not when
                # the next step aborts it: SGLang releases it before that (3897).
                s.stash_chunked_request(chunked)
            for q in batch.reqs:
                if q.finished():
                    finished.append(wid(q))
                    if isinstance(q.finished_reason, self.g.FINISH_ABORT):
                        abort_finished.append(wid(q))
        else:
            s._sched_idled = True
            if s.is_fully_idle():  # Scheduler.on_idle's one scheduling effect
                s.new_token_ratio_tracker.reset()
        s.last_batch = batch
        for rid in finished:
            self.forget(rid)
        dedup = deduplicated(s, self.reqs, computed, tables)
        alloc, page = s.token_to_kv_pool_allocator, s.page_size
        return ({"preempted": preempted, "mode": batch.forward_mode.name if batch else None,
                 "scheduled": scheduled, "new_block_ids": new_pages, "prefix_hits": hits,
                 "finished": finished, "abort_finished": abort_finished, "dedup": dedup,
                 "free_pages": int(alloc.available_size()) // page,
                 "evictable_pages": int(s.tree_cache.evictable_size()) // page,
                 "new_token_ratio": ratio},
                finished, bool(batch or preempted or finished))

    def stopped(self, error: Exception) -> dict[str, Any] | None:
        return {"stopped": str(error)} if isinstance(error, DriverError) else None


def _host() -> SimpleNamespace:
    """driver_host.py beside this file (the process around the jobs, the token ids),
    loaded by its path: this script runs in SGLang's Python, isolated, without kvsched."""
    here = Path(__file__).resolve()
    return SimpleNamespace(**runpy.run_path(str(here.with_name("driver_host.py"))))


def main(argv: list[str]) -> int:
    host = _host()

    def run_jobs(jobs: list[dict[str, Any]], emit: Any) -> None:
        g = _import_sglang()
        watch_releases(g)
        for job in jobs:
            host.run_job(job, Job(g, host, job, emit), emit)

    return int(host.driver_main(argv, "sglang_driver.py", run_jobs))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
