"""Drive LMDeploy 0.18.0's real PyTorch-engine scheduler on kvsched workloads; runs with
LMDeploy's own Python.

    <lmdeploy-venv>/bin/python lmdeploy_driver.py JOBS.jsonl

This file imports only the standard library, LMDeploy (with its torch and numpy) and
driver_host.py beside it (by its path, for the process around the jobs, the loop of a
job's steps and the token contents; never kvsched, which need not be installed in
LMDeploy's environment). It reads one job per line of JOBS.jsonl and writes raw events,
one JSON object per line, to its standard output; kvsched.adapters.lmdeploy turns them
into trace v1.

NOTE on what runs. LMDeploy's PyTorch engine is built by dependency injection, so the
driver builds its own objects as Engine.__init__ does (engine/engine.py:194-230): the
paging Scheduler (prefill admission, decode capacity, recompute eviction, the block
manager and its BlockTrie prefix cache), InputsMakerAsync (prefill or decode, the
short/long turns, long-context chunks; engine/inputs_maker.py:1356) and EngineLoop
(engine/engine_loop.py), with the AR strategies a plain model gets. Each step runs the
body of EngineLoop.main_loop (engine_loop.py:520-557) minus sleep and migration:
send_next_inputs when nothing is in flight, then LMDeploy's own _main_loop_get_outputs,
which dispatches (prefetches) the next forward before this forward's output is applied,
then preempt_invalid_decode_seqs. Only the executor is fake (FakeExecutor: one token per
sequence, and the stop flag the model agent's stopping criteria would raise: the
request's max_new_tokens, or end-of-sequence at its hidden output length).

NOTE on steps. A trace step is one forward. Forward k+1 is scheduled inside step k's
_main_loop_get_outputs, before step k's output is applied, so the step event of forward
k is made when it is dispatched (its batch, and what the scheduler did to make it:
preemptions, reclaims) and completed when its output is applied (its finishes). A
request that finished in forward k may sit in forward k+1's batch (the slot LMDeploy
had prefetched: `void`). A step that dispatches nothing (nothing waiting, or nothing
fits) is a step without a batch.

NOTE on requests and sessions. Requests reach the engine where its loop yields to its
event loop: right after a forward is dispatched (FakeExecutor.forward_async), and before
send_next_inputs when nothing is in flight. There the driver takes the arrivals due by
the next forward and ends the session of every request that finished since, as the API
server does when a request's last output reaches it (Engine.end_session ->
Scheduler.end_session, engine.py:731, paging/scheduler.py:384): its blocks are freed
then (`released`), unless a reclaim took them before. Until then a finished request is
held: LMDeploy may reclaim its blocks for an admission. A request is taken as the
serving front end takes one: AsyncEngine.preprocess refuses a prompt of session_len
tokens or more (serve/core/async_engine.py:549, its message), and Engine._add_message
caps max_new_tokens so that prompt and outputs fit max_session_len
(engine/engine.py:467-482). A client's abort is not driven: LMDeploy cancels through
its request manager (stop_session, then end_session, answered while a forward may be in
flight), which this loop does not model faithfully; the adapter refuses workloads with
aborts.

NOTE on the clock. LMDeploy's decisions read time.perf_counter(): a request's
arrive_time (the FCFS order, strategies/ar/sequence.py:58), the aging of long prompts
(paging/prefill_scheduler.py:177) and the blocks' access times (the prefix cache's LRU,
block_manager/base_block_manager.py:160, kept in an int64 array: whole seconds). The
driver replaces `time` in those modules with a logical clock: step k reads
k * step_seconds plus 1 ns per reading (every reading distinct, in call order). Blocks
of equal access time (the same whole second) are evicted, in LMDeploy, in the order of
id(node), a memory address (paging/block_trie/kv_lifecycle.py:102,126); the driver
replaces that tie-break with the order the trie created its nodes, so eviction is by
access time, then insertion, the same in every run.

Events:
    {"job": name, "lmdeploy": version, "config": {...}}   what LMDeploy built
    {"step": s, "arrivals": [ids], "refused": [{"id", "reason"}], "aborted": [],
     "released": [ids], "preempted": [ids], "reclaimed": [ids], "kind": "prefill" |
     "chunk" | "last_chunk" | "decode" | null, "scheduled": [[id, n]], "void": [ids],
     "new_block_ids": {id: [ids]}, "prefix_hits": {id: [ids]}, "dedup": {id: [ids]},
     "finished": [ids],
     "unsampled": [ids], "free_blocks": n, "evictable_blocks": n, "cache_evicted": n}
    {"done": name, "complete": bool, "steps": n[, "stopped": "one line"][, "stalled": s]}
    {"error": "one line"}    (then exit status 3)
`released` lists the held requests whose sessions ended before the step was scheduled;
`preempted` the running requests LMDeploy sent back to waiting while scheduling it
(Scheduler.preempt_seqs, only the call that finds the sequence RUNNING), `reclaimed` the
requests not running that lost all the blocks they held (SequenceLifecycle.
release_paging_resources: an allocation's RecomputeEvictionHelper._reclaim_candidate, or,
with prefix caching, a failed admission rolling back its prefix match), each in the order
LMDeploy took them; `void` the scheduled requests that had finished;
`free_blocks` the block manager's free count after the step was scheduled and
`evictable_blocks` the prefix cache's blocks no request holds (evictable). Block ids are
LMDeploy's own, from 0; a request's new blocks are the ids its block table holds that
it did not hold before, its prefix hit the blocks its table starts with when it is
admitted with nothing computed, and its `dedup` the blocks its table starts with when
the trie swapped some of its full blocks for the trie's own of the same content
(BlockTrie._extend_trie_path): the only change of a table's known blocks the driver
takes.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import itertools
import logging
import os
import runpy
import sys
import types
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("LMDEPLOY_LOG_LEVEL", "ERROR")

LMDEPLOY_VERSION = "0.18.0"


class DriverError(Exception):
    """Something LMDeploy did that trace v1 cannot say, or LMDeploy not as expected."""


def _import_lmdeploy() -> SimpleNamespace:
    warnings.filterwarnings("ignore")
    m = importlib.import_module
    torch = m("torch")
    torch.set_num_threads(1)
    logging.getLogger("lmdeploy").setLevel(logging.ERROR)
    g = SimpleNamespace(torch=torch, np=m("numpy"))
    config = m("lmdeploy.pytorch.config")
    g.CacheConfig, g.SchedulerConfig = config.CacheConfig, config.SchedulerConfig
    g.EngineRole = m("lmdeploy.pytorch.disagg.config").EngineRole
    loop = m("lmdeploy.pytorch.engine.engine_loop")
    g.EngineLoop, g.EngineLoopConfig = loop.EngineLoop, loop.EngineLoopConfig
    maker = m("lmdeploy.pytorch.engine.inputs_maker")
    g.InputsMakerAsync, g.InputsMakerConfig = maker.InputsMakerAsync, maker.InputsMakerConfig
    g.BatchedOutputs = m("lmdeploy.pytorch.engine.model_agent").BatchedOutputs
    request = m("lmdeploy.pytorch.engine.request")
    g.Response, g.ResponseType = request.Response, request.ResponseType
    messages = m("lmdeploy.pytorch.messages")
    g.MessageStatus, g.SamplingParam = messages.MessageStatus, messages.SamplingParam
    g.SequenceMeta = messages.SequenceMeta
    g.Scheduler = m("lmdeploy.pytorch.paging").Scheduler
    g.SequenceLifecycle = m("lmdeploy.pytorch.paging.seq_states.states").SequenceLifecycle
    g.BlockTrie = m("lmdeploy.pytorch.paging.block_trie.trie").BlockTrie
    g.Node = m("lmdeploy.pytorch.paging.block_trie.node").Node
    g.kv_lifecycle = m("lmdeploy.pytorch.paging.block_trie.kv_lifecycle")
    g.AREngineStrategy = m("lmdeploy.pytorch.strategies.ar.engine").AREngineStrategy
    g.ARModelAgentStrategy = m("lmdeploy.pytorch.strategies.ar.model_agent"
                               ).ARModelAgentStrategy
    g.ARSamplingStrategy = m("lmdeploy.pytorch.strategies.ar.sampling").ARSamplingStrategy
    g.ARSequenceStrategy = m("lmdeploy.pytorch.strategies.ar.sequence").ARSequenceStrategy
    g.envs = m("lmdeploy.pytorch.envs")
    g.clocked = [m(name) for name in (
        "lmdeploy.pytorch.paging.prefill_scheduler",
        "lmdeploy.pytorch.paging.block_manager.base_block_manager",
        "lmdeploy.pytorch.paging.block_trie.checkpoint_lifecycle",
        "lmdeploy.pytorch.strategies.ar.sequence")]
    return g


# -- the logical clock and the trie's tie-break -------------------------------------------

class LogicalClock:
    """Stands in for time.perf_counter/time.time in LMDeploy's deciding modules: step k
    reads k * step_seconds plus 1 ns per reading so far (the NOTE on the clock)."""

    def __init__(self, step_seconds: float) -> None:
        self.step_seconds = step_seconds
        self.step = 0
        self.readings = 0

    def perf_counter(self) -> float:
        self.readings += 1
        return self.step * self.step_seconds + self.readings * 1e-9

    def time(self) -> float:
        return self.perf_counter()


def install_clock(g: SimpleNamespace, clock: LogicalClock) -> None:
    """Give the modules whose decisions read the clock a logical `time`."""
    fake = types.ModuleType("time")
    fake.__dict__.update(vars(importlib.import_module("time")))
    fake.perf_counter = clock.perf_counter  # type: ignore[attr-defined]
    fake.time = clock.time  # type: ignore[attr-defined]
    for module in g.clocked:
        module.time = fake


_NODE_ORDER = itertools.count()


def order_trie_ties(g: SimpleNamespace) -> None:
    """Number the trie's nodes as it creates them, and make that number the tie-break of
    its eviction heap where LMDeploy uses id(node) (kv_lifecycle.py:102,126)."""
    init = g.Node.__init__

    def node_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.kvsched_order = next(_NODE_ORDER)

    g.Node.__init__ = node_init
    g.kv_lifecycle.id = lambda node: node.kvsched_order  # the module's `id` only


# -- hooks: LMDeploy's decisions, in the order it takes them ------------------------------

class Watch:
    """What the scheduler did since the last forward was dispatched."""

    def __init__(self) -> None:
        self.preempted: list[int] = []
        self.reclaimed: list[int] = []
        self.evicted = 0
        self.ending = False  # a session is being ended: its release is no reclaim
        # the copies the block trie swapped for its own blocks: session, {index: copy}
        self.swapped: dict[int, dict[int, int]] = {}
        self.matched: dict[int, list[int]] = {}  # the trie's blocks a match appended

    def take(self) -> tuple[list[int], list[int], int]:
        out = (self.preempted, self.reclaimed, self.evicted)
        self.preempted, self.reclaimed, self.evicted = [], [], 0
        return out


WATCH = Watch()
LAST_RUNNING: list[Any] = []  # the batch _make_forward_inputs built last


def watch_decisions(g: SimpleNamespace) -> None:
    """Hook Scheduler.preempt_seqs, SequenceLifecycle.release_paging_resources and
    BlockTrie.evict (each calls LMDeploy's own), and keep the batch of the forward
    inputs (_send_next_inputs_impl pops it before forward_async)."""
    preempt = g.Scheduler.preempt_seqs
    running = g.MessageStatus.RUNNING

    def preempt_seqs(self: Any, seqs: Any) -> Any:
        # schedule_running calls it when a running sequence cannot grow
        # (paging/scheduler.py:361); preempt_invalid_decode_seqs calls it again after
        # the output for the same victims, no longer RUNNING: only the first is a
        # decision.
        seqs = list(seqs)
        WATCH.preempted.extend(s.session_id for s in seqs if s.status == running)
        return preempt(self, seqs)

    g.Scheduler.preempt_seqs = preempt_seqs
    release = g.SequenceLifecycle.release_paging_resources

    def release_paging_resources(self: Any, seq: Any) -> Any:
        # A sequence that is not running loses all its blocks: an allocation reclaims
        # them (RecomputeEvictionHelper._reclaim_candidate,
        # recompute_eviction_helper.py:117) or, with prefix caching, a failed admission
        # rolls back its prefix match (prefill_scheduler.py:382), both through here; a
        # session's end (remove_sequence, states.py:47) is not a reclaim.
        if seq.num_blocks > 0 and not WATCH.ending \
                and (not WATCH.reclaimed or WATCH.reclaimed[-1] != seq.session_id):
            WATCH.reclaimed.append(seq.session_id)
        return release(self, seq)

    g.SequenceLifecycle.release_paging_resources = release_paging_resources
    evict = g.BlockTrie.evict

    def trie_evict(self: Any, max_num_blocks: int) -> Any:
        freed = evict(self, max_num_blocks)
        WATCH.evicted += int(freed or 0)
        return freed

    g.BlockTrie.evict = trie_evict
    extend = g.BlockTrie._extend_trie_path

    def extend_trie_path(self: Any, seq: Any, node: Any, num_complete_blocks: int) -> Any:
        # A full block whose content the trie has already gives way to the trie's own,
        # and the copy is freed (paging/block_trie/trie.py:616-623).
        before = [int(b) for b in seq.logical_blocks.get_real_blocks()]
        out = extend(self, seq, node, num_complete_blocks)
        after = [int(b) for b in seq.logical_blocks.get_real_blocks()]
        swapped = WATCH.swapped.setdefault(seq.session_id, {})
        for j, (copy, block) in enumerate(zip(before, after, strict=True)):
            if copy != block:
                swapped.setdefault(j, copy)
        return out

    g.BlockTrie._extend_trie_path = extend_trie_path
    match = g.BlockTrie.match

    def trie_match(self: Any, seq: Any) -> Any:
        before = len(seq.logical_blocks.get_real_blocks())
        out = match(self, seq)
        WATCH.matched[seq.session_id] = [
            int(b) for b in seq.logical_blocks.get_real_blocks()[before:]]
        return out

    g.BlockTrie.match = trie_match
    make = g.InputsMakerAsync._make_forward_inputs

    def make_forward_inputs(self: Any, prefill: bool, enable_empty: bool = False) -> Any:
        out = make(self, prefill, enable_empty)
        LAST_RUNNING[:] = [] if out is None else list(out["running"])
        return out

    g.InputsMakerAsync._make_forward_inputs = make_forward_inputs


# -- one job ------------------------------------------------------------------------------

class NoAdapters:
    """No LoRA adapters (what Engine._build_adapter_manager builds without any)."""

    def num_adapters(self) -> int:
        return 0


class FakeExecutor:
    """Stands in for the model executor: takes no decision."""

    device_type = "cuda"  # InputsMakerAsync.torch_int_dtype reads it (int32 block tables)

    def __init__(self, job: Job) -> None:
        self.job = job
        self.queue: list[tuple[list[Any], Any]] = []

    async def forward_async(self, forward_inputs: dict[str, Any]) -> None:
        batch = list(LAST_RUNNING)
        self.job.dispatched(batch, forward_inputs)
        self.queue.append((batch, forward_inputs["inputs"]))
        # the loop yields to its event loop while the forward runs: requests come in
        self.job.deliver()

    async def get_output_async(self) -> Any:
        batch, inputs = self.queue.pop(0)
        return self.job.outputs(batch, inputs)


class Job:
    """One job on LMDeploy's scheduler: its side of driver_host.run_job's loop (arrive,
    abort, step, stopped), writing the job's header event when built."""

    def __init__(self, g: SimpleNamespace, host: SimpleNamespace, job: dict[str, Any],
                 emit: Any) -> None:
        self.g = g
        cfg = job["config"]
        self.contents = host.Contents(job["requests"])
        self.eos = host.EOS_TOKEN_ID
        self.clock = LogicalClock(cfg["step_seconds"])
        install_clock(g, self.clock)
        # the opt-TTFT settings LMDeploy reads from its environment (envs.py:257-259),
        # read by the prefill scheduler and the inputs maker when they are built
        g.envs.opt_ttft_policy = cfg["ttft_policy"]
        g.envs.opt_ttft_short_turns = max(1, cfg["short_turns"])
        g.envs.opt_ttft_aging_sec = cfg["aging_seconds"]
        bs = cfg["block_size"]
        self.sched_cfg = g.SchedulerConfig(max_batches=cfg["max_batches"],
                                           max_session_len=cfg["session_len"],
                                           prefill_interval=cfg["prefill_interval"],
                                           eviction_type="recompute")
        self.cache_cfg = g.CacheConfig(max_batches=cfg["max_batches"], block_size=bs,
                                       num_cpu_blocks=0, num_gpu_blocks=cfg["num_gpu_blocks"],
                                       max_prefill_token_num=cfg["max_prefill_token_num"],
                                       enable_prefix_caching=cfg["enable_prefix_caching"],
                                       device_type="cpu")
        seq_strategy = g.ARSequenceStrategy()
        sampling = g.ARSamplingStrategy(0)
        seq_meta = g.SequenceMeta(bs, strategy=seq_strategy, sampling_strategy=sampling)
        self.scheduler = g.Scheduler(self.sched_cfg, self.cache_cfg, seq_meta=seq_meta)
        self.executor = FakeExecutor(self)
        maker_cfg = g.InputsMakerConfig(
            max_batches=cfg["max_batches"], max_prefill_token_num=cfg["max_prefill_token_num"],
            role=g.EngineRole.Hybrid, block_size=bs, kernel_block_size=bs, window_size=-1,
            enable_prefix_caching=cfg["enable_prefix_caching"],
            prefix_cache_decode_state_interval=0,
            enable_chunked_prefill=cfg["enable_chunked_prefill"],
            prefill_interval=cfg["prefill_interval"])
        self.maker = g.InputsMakerAsync(
            executor=self.executor, scheduler=self.scheduler,
            state_checkpoints=self.scheduler.state_checkpoints, adapter_manager=NoAdapters(),
            engine_strategy=g.AREngineStrategy(scheduler_config=self.sched_cfg,
                                               cache_config=self.cache_cfg),
            sampling_strategy=sampling, model_agent_strategy=g.ARModelAgentStrategy(),
            config=maker_cfg)
        self.loop = g.EngineLoop(req_manager=None, scheduler=self.scheduler,
                                 state_checkpoints=self.scheduler.state_checkpoints,
                                 executor=self.executor, seq_strategy=seq_strategy,
                                 inputs_maker=self.maker,
                                 config=g.EngineLoopConfig(role=g.EngineRole.Hybrid))
        self.max_session_len = self.max_session_len_of(cfg)
        self.session_len = cfg["session_len"]
        WATCH.take()
        emit({"job": job["name"], "lmdeploy": importlib.metadata.version("lmdeploy"),
              "config": self.effective_config(cfg)})
        self.pending = sorted(job["requests"], key=lambda w: w["arrival"])
        self.next_arrival = 0
        self.sid: dict[str, int] = {}  # workload id -> LMDeploy session id
        self.rid: dict[int, str] = {}
        self.reasons: dict[str, str | None] = {}  # each arrival's front-end verdict
        self.computed: dict[str, int] = {}  # kvsched's C per request in the engine
        self.tables: dict[str, list[int]] = {}  # each request's block ids, as said so far
        self.finished: set[str] = set()  # finished, session not yet ended or reclaimed
        self.done: set[str] = set()  # every request that finished
        self.to_end: list[str] = []  # finished since the last delivery
        self.released: list[str] = []  # sessions ended since the last dispatch
        self.records: dict[int, dict[str, Any]] = {}  # dispatched forwards, by step
        self.in_flight: tuple[Any, Any] | None = None  # the forward dispatched, not run
        self.step_now = 0  # the step whose forward is scheduled next

    def max_session_len_of(self, cfg: dict[str, Any]) -> int:
        """Engine._get_max_session_len (engine/engine.py:328-341), on this cache."""
        bs = self.cache_cfg.block_size
        tokens = (self.cache_cfg.num_gpu_blocks - self.cache_cfg.num_reserved_gpu_blocks) * bs
        return int(min(tokens - bs, cfg["session_len"]))

    def effective_config(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """What LMDeploy's objects were built with, read back from them."""
        s, bm, maker = self.scheduler, self.scheduler.block_manager, self.maker
        prefill = s._prefill_scheduler
        return {
            "block_size": self.cache_cfg.block_size,
            "num_gpu_blocks": self.cache_cfg.num_gpu_blocks,
            "num_cpu_blocks": self.cache_cfg.num_cpu_blocks,
            "free_gpu_blocks": int(bm.get_num_free_gpu_blocks()),
            "max_batches": maker.config.max_batches,
            "max_prefill_token_num": maker.config.max_prefill_token_num,
            "session_len": self.sched_cfg.max_session_len,
            "max_session_len": self.max_session_len,
            "prefill_interval": maker.config.prefill_interval,
            "prealloc_size": self.maker.engine_strategy.get_prealloc_size(True),
            "eviction_type": self.sched_cfg.eviction_type,
            "enable_prefix_caching": bool(s.block_trie.enabled),
            "enable_chunked_prefill": bool(maker.config.enable_chunked_prefill),
            "ttft_policy": prefill._long_prefill_policy,
            "aging_seconds": prefill._long_prefill_aging_seconds_per_chunk,
            "short_turns": maker._short_prefill_turns_per_long_chunk,
            "step_seconds": self.clock.step_seconds,
        }

    # -- requests --------------------------------------------------------------------

    def take(self, w: dict[str, Any]) -> None:
        """A request as the serving front end hands it to the engine (the NOTE on
        requests): AsyncEngine.preprocess's length check, then a session and its
        sequence with max_new_tokens capped as Engine._add_message caps it."""
        g, rid = self.g, w["id"]
        prompt = self.contents.prompt(rid)
        if len(prompt) >= self.session_len:  # serve/core/async_engine.py:549
            self.reasons[rid] = (f"Input length ({len(prompt)}) must be smaller than the "
                                 f"model context length ({self.session_len}).")
            return
        sid = len(self.sid) + 1
        self.sid[rid], self.rid[sid] = sid, rid
        session = self.scheduler.add_session(sid)
        sp = g.SamplingParam(max_new_tokens=w["max_tokens"], top_k=1)
        seq = session.add_sequence(g.np.array(prompt, dtype=g.np.int64), sampling_param=sp)
        if sp.max_new_tokens + seq.num_valid_ids > self.max_session_len:  # engine.py:477
            sp.max_new_tokens = self.max_session_len - seq.num_valid_ids
        seq.resp = g.Response(type=g.ResponseType.SUCCESS, sender_id=0, event=None, data=None)
        self.reasons[rid] = None
        self.computed[rid] = 0
        self.tables[rid] = []

    def deliver(self) -> None:
        """Where the loop yields to its event loop: end the sessions of the requests that
        finished since, then take the arrivals due by the next forward."""
        for rid in self.to_end:
            if rid in self.finished:  # else a reclaim took its blocks: it has ended
                self.finished.discard(rid)
                self.released.append(rid)
            WATCH.ending = True
            try:
                self.scheduler.end_session(self.sid[rid])
            finally:
                WATCH.ending = False
        self.to_end = []
        due = self.step_now
        while self.next_arrival < len(self.pending) \
                and self.pending[self.next_arrival]["arrival"] <= due:
            self.take(self.pending[self.next_arrival])
            self.next_arrival += 1

    def arrive(self, w: dict[str, Any], order: int) -> str | None:
        if w["id"] not in self.reasons:  # not taken at a yield yet: take it now
            while self.pending[self.next_arrival]["id"] != w["id"]:
                self.take(self.pending[self.next_arrival])
                self.next_arrival += 1
            self.take(w)
            self.next_arrival += 1
        return self.reasons[w["id"]]

    def abort(self, rid: str) -> bool:
        raise DriverError(f"an abort of {rid}: the driver does not deliver LMDeploy's "
                          "cancellation")

    # -- forwards --------------------------------------------------------------------

    def dispatched(self, batch: list[Any], forward_inputs: dict[str, Any]) -> None:
        """Forward `self.step_now` is dispatched: its step event, but for its finishes."""
        step = self.step_now
        inputs = forward_inputs["inputs"]
        if inputs is None:
            kind, lengths = "decode", [1] * len(batch)
        else:
            lengths = [int(n) for n in inputs.seq_length.tolist()]
            kind = ("chunk" if inputs.is_chunk and not inputs.is_last_chunk else
                    "last_chunk" if inputs.is_chunk else "prefill")
        if len(lengths) != len(batch):
            raise DriverError(f"step {step}: a forward of {len(batch)} sequences with "
                              f"{len(lengths)} lengths")
        record = self.decisions(step)
        bm, bs = self.scheduler.block_manager, self.cache_cfg.block_size
        scheduled, new_blocks, hits, dedup = [], {}, {}, {}
        for seq, n in zip(batch, lengths, strict=True):
            rid = self.rid[seq.session_id]
            scheduled.append([rid, n])
            table = [int(b) for b in bm.get_block_table(seq)]
            swapped = WATCH.swapped.pop(seq.session_id, {})
            matched = WATCH.matched.pop(seq.session_id, [])
            if self.computed[rid] and matched and set(matched) <= set(table):
                raise DriverError(f"step {step}: {rid} resumes on blocks the trie matched "
                                  "past its own; trace v1 takes a prefix hit only with "
                                  "nothing computed")
            before = list(table)  # as allocated, before the trie swapped copies
            for j, copy in swapped.items():
                before[j] = copy
            known = self.tables[rid]
            if self.computed[rid] == 0 and kind != "decode":
                hit = int(seq.num_history_ids)
                if hit % bs:
                    raise DriverError(f"step {step}: {rid} admitted with {hit} tokens "
                                      "computed, not whole blocks")
                if hit:
                    hits[rid] = table[: hit // bs]
                    known = list(table[: hit // bs])
                self.computed[rid] = hit
            if before[: len(known)] != known:
                raise DriverError(f"step {step}: {rid}'s block table changed under it")
            if swapped:
                dedup[rid] = self.deduplicated(step, rid, swapped, table,
                                               (self.computed[rid] + n) // bs)
            if len(before) > len(known):
                new_blocks[rid] = before[len(known):]
            self.tables[rid] = table
            self.computed[rid] += n
        WATCH.swapped.clear()
        WATCH.matched.clear()
        record.update(kind=kind, scheduled=scheduled, new_block_ids=new_blocks,
                      prefix_hits=hits, dedup=dedup)
        self.records[step] = record
        self.step_now = step + 1
        self.clock.step = self.step_now

    def deduplicated(self, step: int, rid: str, swapped: dict[int, int], table: list[int],
                     full: int) -> list[int]:
        """The blocks `rid`'s table now starts with, where LMDeploy's block trie swapped
        its copies of full blocks for the trie's own of the same content as it allocated
        (BlockTrie._extend_trie_path, paging/block_trie/trie.py:616-623: the copy is
        freed); trace v1 says it of computed blocks only."""
        last = max(swapped)
        if last >= full:
            raise DriverError(f"step {step}: the block trie swapped {rid}'s block {last}, "
                              f"beyond its {full} computed blocks")
        return table[: last + 1]

    def trie_blocks(self) -> set[int]:
        """The blocks the prefix cache's trie holds."""
        trie = self.scheduler.block_trie
        ids: set[int] = set()
        stack = list(trie._roots.values()) if trie.enabled else []
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node.block_id >= 0:
                ids.add(int(node.block_id))
        return ids

    def decisions(self, step: int) -> dict[str, Any]:
        """What the scheduler did since the last forward, and the cache after it."""
        preempted, reclaimed, evicted = WATCH.take()
        # a request whose blocks were only matched in this schedule's failed admission
        # (a prefix hit rolled back) held none the trace gave it; one that lost its blocks
        # twice in a schedule (a second failed admission on blocks it matched again)
        # lost them once
        rids = list(dict.fromkeys(self.rid[s] for s in reclaimed
                                  if self.tables.get(self.rid[s])))
        ended = [rid for rid in rids if rid in self.finished]  # held: it ends now
        for rid in rids:  # a reclaimed request holds nothing, and recomputes
            self.computed[rid] = 0
            self.tables[rid] = []
            self.finished.discard(rid)
        released, self.released = self.released, []
        return {"ended": released + ended, "released": released,
                "preempted": [self.rid[s] for s in preempted],
                "reclaimed": rids, "kind": None, "scheduled": [], "void": [],
                "new_block_ids": {}, "prefix_hits": {}, "dedup": {}, "finished": [],
                "free_blocks": int(self.scheduler.block_manager.get_num_free_gpu_blocks()),
                "evictable_blocks": self.evictable(), "cache_evicted": evicted}

    def evictable(self) -> int:
        """The prefix cache's blocks that only the trie holds (its evictable ones)."""
        ids = sorted(self.trie_blocks())
        if not ids:
            return 0
        counts = self.scheduler.block_trie.allocator.get_ref_count(self.g.np.array(ids))
        return int((counts == 1).sum())

    def outputs(self, batch: list[Any], inputs: Any) -> Any:
        """What the model returns for a forward: one token per sequence and its stop
        flag (ARStoppingCriteria's max_new_tokens, or end-of-sequence), none for a long
        prompt's chunk before its last."""
        g = self.g
        n = len(batch)
        if inputs is not None and inputs.is_chunk and not inputs.is_last_chunk:
            return g.BatchedOutputs(next_token_ids=g.torch.zeros(n, dtype=g.torch.long),
                                    stopped=g.torch.zeros(n, dtype=g.torch.bool))
        tokens, stops = [], []
        for seq in batch:
            rid = self.rid[seq.session_id]
            made = int(seq.num_new_tokens)
            token = int(self.contents.output(rid, made))
            tokens.append(token)
            stops.append(token == self.eos or made + 1 >= seq.sampling_param.max_new_tokens)
        return g.BatchedOutputs(next_token_ids=g.torch.tensor(tokens, dtype=g.torch.long),
                                stopped=g.torch.tensor(stops, dtype=g.torch.bool))

    async def run_step(self, step: int) -> tuple[dict[str, Any], list[str], bool]:
        """Step `step`: its forward dispatched if it was not (nothing in flight), then
        EngineLoop.main_loop's body, which dispatches the next forward before this
        one's output is applied (the NOTE on steps)."""
        s = self.scheduler
        if self.in_flight is None:
            self.step_now = step
            self.clock.step = step
            self.deliver()
            if s.has_unfinished() or self.maker.has_pending_long_context_chunk():
                fi, running = await self.maker.send_next_inputs()
                if running is not None:
                    self.in_flight = (fi, running)
        if self.in_flight is None:  # a step without a forward
            record = self.decisions(step)
            self.step_now = step + 1
            self.clock.step = self.step_now
            ended = record.pop("ended")
            return record, ended, bool(ended or record["preempted"] or record["reclaimed"])
        fi, running = self.in_flight
        record = self.records.pop(step)
        s.activate_seqs(running)
        fi, running = await self.loop._main_loop_get_outputs(running=running,
                                                              forward_inputs=fi)
        while not self.loop.resp_queue.empty():
            self.loop.resp_queue.get_nowait()
        self.maker.preempt_invalid_decode_seqs()
        self.in_flight = None if running is None else (fi, running)
        # a running request the next forward's schedule preempted is no longer RUNNING
        # when this forward's output is applied: ARSequenceStrategy.update_running drops
        # its token (strategies/ar/sequence.py:145), and it recomputes it when resumed
        # (its victims are the next forward's, or, when the prefetch dispatched nothing,
        # still pending for the forward scheduled next)
        following = self.records[step + 1]["preempted"] if step + 1 in self.records \
            else [self.rid[s] for s in WATCH.preempted]
        record["unsampled"] = [rid for rid, _ in record["scheduled"] if rid in following]
        # a request that finished in an earlier forward sits in this one's batch when
        # it was dispatched before that forward's output was applied
        record["void"] = [rid for rid, _ in record["scheduled"] if rid in self.done]
        for rid, _ in record["scheduled"]:
            if rid not in self.done and self.has_stopped(rid):
                self.done.add(rid)
                record["finished"].append(rid)
                self.finished.add(rid)
                self.to_end.append(rid)
        return record, record.pop("ended"), True

    def has_stopped(self, rid: str) -> bool:
        session = self.scheduler.get_session(self.sid[rid])
        return session is not None and any(q.status == self.g.MessageStatus.STOPPED
                                           for q in session.sequences.values())

    def step(self, step: int) -> tuple[dict[str, Any], list[str], bool]:
        return asyncio.get_event_loop().run_until_complete(self.run_step(step))

    def stopped(self, error: Exception) -> dict[str, Any] | None:
        return {"stopped": str(error)} if isinstance(error, DriverError) else None


def _host() -> SimpleNamespace:
    """driver_host.py beside this file, loaded by its path: this script runs in
    LMDeploy's Python, isolated, without kvsched."""
    here = Path(__file__).resolve()
    return SimpleNamespace(**runpy.run_path(str(here.with_name("driver_host.py"))))


def main(argv: list[str]) -> int:
    host = _host()

    def run_jobs(jobs: list[dict[str, Any]], emit: Any) -> None:
        g = _import_lmdeploy()
        watch_decisions(g)
        order_trie_ties(g)
        asyncio.set_event_loop(asyncio.new_event_loop())
        for job in jobs:
            host.run_job(job, Job(g, host, job, emit), emit)

    return int(host.driver_main(argv, "lmdeploy_driver.py", run_jobs))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
