"""Drive vLLM's real v1 scheduler on kvsched workloads; runs with vLLM's own Python.

    <vllm-venv>/bin/python vllm_driver.py JOBS.jsonl

This file imports only the standard library and vLLM (never kvsched, which need not be
installed in vLLM's environment). Its functions that read vLLM's objects
(effective_config, step_blocks, BlockKeys, finishes) are the only such code:
kvsched's tracing plugin (kvsched.integrations.vllm), which runs inside vLLM with
kvsched installed, imports them from here.

It reads one job per line of JOBS.jsonl and writes raw events, one JSON object per
line, to its standard output; kvsched.adapters.vllm turns them into trace v1.
Anything vLLM itself prints goes to standard error.

NOTE on the loop: it is kvsched's simulation loop (src/kvsched/simulate.py) with
vLLM's scheduler inside, built as vLLM's own tests/v1/core/utils.py builds it (no
model, no tokenizer, synchronous scheduling; prefix caching on unless the job's config
says "enable_prefix_caching": false). Each step: add
the arrivals (vLLM's input processor refuses a prompt that leaves no room for an
output token before the engine sees it; such a request is reported as refused and
never added), apply the aborts, schedule(), hand back one sampled token for each
scheduled request whose computed tokens caught up with its tokens (end-of-sequence
once its hidden output length is reached), and update_from_output(). Priority ties
break as kvsched's (priority, arrival step, arrival order) because each request's
arrival_time is its arrival order.

NOTE on tokens: with prefix caching vLLM's own block hashes decide the hits, so every
request carries real token ids (`Contents`). A request's content is its whole sequence,
prompt then outputs; its first `prefix.len` tokens are those of the content its
`prefix` names (a named shared text, or an earlier request's whole sequence: a
conversation's next turn), the rest are its own. Token p of a content of its own is a
pseudo-random id in [3, vocab) drawn from (content id, p), except the last, where
the request's hidden output length puts end-of-sequence. The fake model samples, as
output j of request r, token P_r + j of r's content, so a next turn holds exactly the
tokens r was given and hashes as r's blocks did.

Events:
    {"job": name, "vllm": version, "null_block": id, "config": {...}, "free_blocks": n}
    {"step": s, "arrivals": [ids], "refused": [{"id", "reason"}], "aborted": [ids],
     "preempted": [ids], "scheduled": [[id, n]], "new_block_ids": {id: [ids]},
     "prefix_hits": {id: [ids]}, "block_keys": {id: [base64]},
     "finished": [{"id", "reason"}], "free_blocks": n}
`new_block_ids` are the blocks handed out fresh; `prefix_hits` the cached blocks an
admitted request (new, or resumed after recompute) starts its table with; `block_keys`
continue, per request, vLLM's hashes of its full blocks (Request.block_hashes, in
base64: key_text): a prompt's when it arrives, a block of outputs when vLLM caches it
(BlockKeys).
    {"done": name, "complete": bool, "steps": n}
    {"error": "one line"}    (then exit status 3)
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import os
import sys
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Any

# End-of-sequence ends a request at its hidden output length; no other token is below
# FIRST_TOKEN_ID.
EOS_TOKEN_ID = 2
FIRST_TOKEN_ID = 3
# A large vocabulary, so that unrelated blocks (one token each with block size 1) do
# not share contents by chance: vLLM would hit them, kvsched's workload would not.
VOCAB_SIZE = 1 << 20


def key_text(block_hash: bytes) -> str:
    """A block's content key in a trace: vLLM's hash of it, in base64 (as msgspec,
    the plugin's encoder, writes bytes)."""
    return base64.b64encode(block_hash).decode("ascii")

# A config.json is all vLLM's ModelConfig reads with skip_tokenizer_init=True.
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
    "num_hidden_layers": 1, "vocab_size": VOCAB_SIZE, "torch_dtype": "float32",
    "bos_token_id": 1, "eos_token_id": EOS_TOKEN_ID,
}


class DriverError(Exception):
    """Something in vLLM is not as this driver expects; one line."""


def _module(name: str) -> Any:
    return importlib.import_module(name)


def token_id(content: str, position: int) -> int:
    """Token `position` of a content of its own: pseudo-random, the same in every run.

    post: FIRST_TOKEN_ID <= __return__ < VOCAB_SIZE
    """
    digest = hashlib.blake2b(f"{content}\0{position}".encode(), digest_size=8).digest()
    return FIRST_TOKEN_ID + int.from_bytes(digest, "big") % (VOCAB_SIZE - FIRST_TOKEN_ID)


class Contents:
    """The token ids of a job's requests: each one's whole sequence, prompt then
    outputs, built from the contents its prefix names (see NOTE on tokens)."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = {w["id"]: w for w in items}
        self.sequences: dict[str, list[int]] = {}

    def tokens(self, content: str, length: int) -> list[int]:
        """The first `length` tokens of `content`: a request's, or a named shared text."""
        if content in self.items:
            return self.sequence(content)[:length]
        return [token_id(content, p) for p in range(length)]

    def sequence(self, rid: str) -> list[int]:
        """Request `rid`'s whole sequence: prompt_len + output_len tokens, the last one
        end-of-sequence (where the fake model ends it)."""
        seq = self.sequences.get(rid)
        if seq is None:
            w = self.items[rid]
            prefix = w.get("prefix")
            seq = self.tokens(prefix["id"], prefix["len"]) if prefix else []
            seq += [token_id(rid, p) for p in range(len(seq),
                                                     w["prompt_len"] + w["output_len"])]
            seq[-1] = EOS_TOKEN_ID
            self.sequences[rid] = seq
        return seq

    def prompt(self, rid: str) -> list[int]:
        return self.sequence(rid)[:self.items[rid]["prompt_len"]]

    def output(self, rid: str, j: int) -> int:
        """What the fake model samples as output j of `rid`: end-of-sequence at its
        hidden output length."""
        seq = self.sequence(rid)
        at = self.items[rid]["prompt_len"] + j
        return seq[at] if at < len(seq) else EOS_TOKEN_ID


def build_scheduler(cfg: dict[str, Any], model_dir: Path, scheduler_class: Any = None) -> Any:
    """vLLM's Scheduler (or `scheduler_class`, a subclass of it) for one job's config, as
    tests/v1/core/utils.py builds it."""
    torch = _module("torch")
    vconfig = _module("vllm.config")
    kv = _module("vllm.v1.kv_cache_interface")
    sched_mod = _module("vllm.v1.core.sched.scheduler")
    structured = _module("vllm.v1.structured_output")
    block_size = cfg["block_size"]
    num_blocks = cfg["num_blocks"]
    config = dict(MODEL_CONFIG, max_position_embeddings=max(cfg["max_model_len"], 2048))
    (model_dir / "config.json").write_text(json.dumps(config))
    scheduler_config = vconfig.SchedulerConfig(
        max_num_seqs=cfg["max_num_seqs"],
        max_num_batched_tokens=cfg["max_num_batched_tokens"],
        max_model_len=cfg["max_model_len"],
        enable_chunked_prefill=cfg["enable_chunked_prefill"],
        long_prefill_token_threshold=cfg["long_prefill_token_threshold"],
        policy=cfg["policy"],
        watermark=cfg["watermark"],
        async_scheduling=False,
        is_encoder_decoder=False,
    )
    model_config = vconfig.ModelConfig(model=str(model_dir), skip_tokenizer_init=True,
                                       max_model_len=cfg["max_model_len"], dtype="float32",
                                       seed=0)
    cache_config = vconfig.CacheConfig(
        block_size=block_size, enable_prefix_caching=cfg.get("enable_prefix_caching", True))
    vllm_config = vconfig.VllmConfig(scheduler_config=scheduler_config,
                                     model_config=model_config, cache_config=cache_config)
    spec = kv.FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                dtype=torch.float32)
    kv_cache_config = kv.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                                       kv_cache_groups=[kv.KVCacheGroupSpec(["layer"], spec)])
    cache_config.num_gpu_blocks = num_blocks
    return (scheduler_class or sched_mod.Scheduler)(
        vllm_config=vllm_config, kv_cache_config=kv_cache_config,
        structured_output_manager=structured.StructuredOutputManager(vllm_config),
        block_size=block_size, hash_block_size=block_size, log_stats=True)


def effective_config(scheduler: Any) -> dict[str, Any]:
    """What the built scheduler will really use, read back from vLLM's objects."""
    sc = scheduler.scheduler_config
    manager = scheduler.kv_cache_manager
    return {
        "block_size": scheduler.block_size,
        "num_blocks": manager.block_pool.num_gpu_blocks,
        "max_num_scheduled_tokens": scheduler.max_num_scheduled_tokens,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "max_num_running_reqs": scheduler.max_num_running_reqs,
        "max_num_active_reqs": scheduler.max_num_active_reqs,
        "max_model_len": scheduler.max_model_len,
        "enable_chunked_prefill": sc.enable_chunked_prefill,
        "long_prefill_token_threshold": sc.long_prefill_token_threshold,
        "long_prefill_token_threshold_adaptive": scheduler.adaptive_long_prefill_threshold,
        "policy": scheduler.policy.value,
        "watermark_blocks": manager.watermark_blocks,
        "scheduler_reserve_full_isl": scheduler.scheduler_reserve_full_isl,
        "enable_prefix_caching": manager.enable_caching,
        "async_scheduling": bool(sc.async_scheduling),
        "num_spec_tokens": scheduler.num_spec_tokens,
        "num_lookahead_tokens": scheduler.num_lookahead_tokens,
        "scheduler_class": vllm_class(scheduler).__name__,
    }


def vllm_class(scheduler: Any) -> type:
    """The vLLM scheduler class whose decisions `scheduler` makes: its own class, or the
    nearest vLLM class it derives from (a tracing subclass adds no decisions)."""
    return next(c for c in type(scheduler).__mro__ if c.__module__.startswith("vllm."))


# The pools whose caching BlockKeys watch, by id() (a plain dict's lookup is a few
# nanoseconds, a WeakKeyDictionary's a Python call); an entry goes when its pool does.
_WATCHED: dict[int, BlockKeys] = {}


def watch(pool: Any, keys: BlockKeys) -> None:
    """Have `keys` told of every block `pool` caches. The hook wraps the method on the
    pool's class, once, and looks the pool up: an attribute set on the pool itself
    would cost every other attribute of it CPython's fast lookup, which vLLM's scheduler
    makes thousands of times a step. Pools nobody watches cache as before."""
    cls = type(pool)
    if "_kvsched_watched" not in cls.__dict__:
        cache = cls.cache_full_blocks

        def cache_full_blocks(self: Any, request: Any, blocks: Any, num_cached_blocks: int,
                              num_full_blocks: int, *args: Any, **kwargs: Any) -> Any:
            out = cache(self, request, blocks, num_cached_blocks, num_full_blocks, *args,
                        **kwargs)
            watcher = _WATCHED.get(id(self))
            if watcher is not None:  # (a list append: no call of ours in vLLM's step)
                watcher.cached.append((request, num_full_blocks))
            return out

        cls.cache_full_blocks = cache_full_blocks
        cls._kvsched_watched = True
    if id(pool) not in _WATCHED:  # (a second BlockKeys on one pool replaces the first)
        weakref.finalize(pool, _WATCHED.pop, id(pool), None)
    _WATCHED[id(pool)] = keys


class BlockKeys:
    """The content keys a trace gives for each request's full blocks: vLLM's own
    hashes (Request.block_hashes, key_text), each request's list
    continuing from 0 without gaps. A request's prompt blocks are given when it arrives
    (vLLM hashes them then), a block of its outputs when vLLM caches it
    (BlockPool.cache_full_blocks, in schedule(): the step the block becomes hittable,
    which is when the spec caches it too). Watching the cache costs a list append per
    call that caches blocks, not a look at every running request every step, which a
    live engine's step budget could not pay for; the keys are picked out once a step
    (take), or before a request is forgotten. (Its hashes are picked out later than
    they were cached, from the same list: vLLM only appends to a request's hashes.)"""

    def __init__(self, pool: Any, block_size: int) -> None:
        if getattr(pool, "hash_block_size", block_size) != block_size:
            raise DriverError(f"vLLM hashes blocks of {pool.hash_block_size} tokens, "
                              f"its KV cache blocks hold {block_size}: kvsched's block "
                              "keys need the two equal")
        self.written: dict[str, int] = {}  # keys given so far, by request
        self.pending: dict[str, list[bytes]] = {}  # keys for this step's line
        # (request, its full blocks) as vLLM caches them, in order, not yet picked out.
        self.cached: list[tuple[Any, int]] = []
        watch(pool, self)

    def arrived(self, request: Any) -> None:
        """A new request: its prompt blocks' keys."""
        self.cached.append((request, len(request.block_hashes)))

    def _pick(self) -> None:
        """The keys of the blocks cached since the last pick that were not given yet
        (vLLM's hashes as they are, bytes; key_text writes one), into pending."""
        written, pending = self.written, self.pending
        for request, full in self.cached:
            rid = request.request_id
            before = written.get(rid, 0)
            if full > before:
                new = request.block_hashes[before:full]
                got = pending.get(rid)
                if got is None:
                    pending[rid] = new
                else:
                    got += new
                written[rid] = full
        self.cached.clear()

    def forget(self, rid: str, unwritten: bool = False) -> None:
        """A request that ended: no more keys for it; with `unwritten`, not even those
        it has waiting for this step's line (an abort before the step's schedule())."""
        if self.cached:
            self._pick()
        self.written.pop(rid, None)
        if unwritten:
            self.pending.pop(rid, None)

    def take(self) -> dict[str, list[bytes]]:
        """The keys that became known since the last take, by request: vLLM's hashes,
        which a trace line writes with key_text."""
        if self.cached:
            self._pick()
        keys, self.pending = self.pending, {}
        return keys


def finished_outputs(engine_outputs: Any) -> list[Any]:
    """The outputs of the requests update_from_output finished (those with vLLM's finish
    reason), in output order. (A plain loop: inside the engine's step it costs less than
    a comprehension, a call of its own, or itertools' iterators, whose code is cold.)"""
    found = []
    for batch in engine_outputs.values():  # one per front-end client
        for out in batch.outputs:
            if out.finish_reason is not None:
                found.append(out)
    return found


def finishes(engine_outputs: Any) -> list[dict[str, str]]:
    """The requests update_from_output finished, with vLLM's reason, in output order."""
    return [{"id": out.request_id, "reason": str(out.finish_reason)}
            for out in finished_outputs(engine_outputs)]


def refusal(model_config: Any, prompt_len: int) -> str | None:
    """vLLM's input processor's own prompt-length check (InputProcessor.
    _validate_prompt_len), run on a stand-in for the processor: its message, or None."""
    processor = _module("vllm.v1.engine.input_processor").InputProcessor
    invalid = _module("vllm.exceptions").VLLMValidationError
    stand_in = SimpleNamespace(skip_prompt_length_check=False, model_config=model_config,
                               mm_encoder_cache_size=0, supports_mm_inputs=False)
    try:
        processor._validate_prompt_len(stand_in, prompt_len, "decoder")
    except invalid as e:
        return str(e).splitlines()[0]
    return None


def block_hasher(scheduler: Any) -> Any:
    """vLLM's hasher of a request's full blocks, as its engine core sets it up, or None
    without prefix caching."""
    if not scheduler.kv_cache_manager.enable_caching:
        return None
    utils = _module("vllm.v1.core.kv_cache_utils")
    hash_fn = _module("vllm.utils.hashing").get_hash_fn_by_name(
        scheduler.cache_config.prefix_caching_hash_algo)
    utils.init_none_hash(hash_fn)
    return utils.get_request_block_hasher(scheduler.block_size, hash_fn)


def make_request(item: dict[str, Any], order: int, contents: Contents,
                 hasher: Any) -> Any:
    params_mod = _module("vllm.sampling_params")
    request_mod = _module("vllm.v1.request")
    params = params_mod.SamplingParams(max_tokens=item["max_tokens"])
    params.update_from_generation_config({}, eos_token_id=EOS_TOKEN_ID)
    return request_mod.Request(
        request_id=item["id"], prompt_token_ids=contents.prompt(item["id"]),
        sampling_params=params, pooling_params=None, arrival_time=float(order),
        priority=item.get("priority", 0), block_hasher=hasher)


def step_blocks(output: Any, block_size: int) -> tuple[dict[str, list[int]],
                                                       dict[str, list[int]]]:
    """The blocks each scheduled request got this step (one KV cache group): those
    handed out fresh (requests that got none are left out), and the prefix hits of the
    admitted ones.

    An admitted request (new, or resumed after recompute) comes with its whole table
    and its computed tokens before the step, which are its hit's: the table's first
    num_computed_tokens / block_size blocks are the hit. A running request comes with
    its new blocks only (None when it got none, as in most steps). The lists are
    vLLM's own where whole (it makes them for the step's output and changes none of
    them after): a copy of each would be the step's time.
    """
    fresh: dict[str, list[int]] = {}
    hits: dict[str, list[int]] = {}
    for new in output.scheduled_new_reqs:
        _split_table(new.req_id, new.block_ids[0] if new.block_ids else [],
                     new.num_computed_tokens, block_size, fresh, hits)
    cached = output.scheduled_cached_reqs
    running, got = cached.req_ids, cached.new_block_ids
    if len(running) != len(got):
        raise DriverError(f"the scheduler output lists {len(running)} running "
                          f"requests but {len(got)} new block lists")
    # A step's new block lists are mostly None, and in a third of steps all are: a
    # count in C, then a plain loop (inside the engine's step, cheaper than itertools'
    # iterators, whose code is cold there).
    if got.count(None) == len(got):
        return fresh, hits
    resumed = cached.resumed_req_ids
    for rid, blocks in zip(running, got, strict=True):
        if not blocks:  # None: no new block
            continue
        ids = blocks[0]
        if resumed and rid in resumed:  # rare
            _split_table(rid, ids, cached.num_computed_tokens[running.index(rid)],
                         block_size, fresh, hits)
        elif ids:
            fresh[rid] = ids
    return fresh, hits


def _split_table(rid: str, ids: list[int], computed: int, block_size: int,
                 fresh: dict[str, list[int]], hits: dict[str, list[int]]) -> None:
    """An admitted request's table: its first computed / block_size blocks are its hit,
    the rest were handed out fresh."""
    if computed % block_size:
        raise DriverError(f"{rid} was admitted with {computed} computed tokens, not "
                          f"whole blocks of {block_size}")
    h = computed // block_size
    if h:
        hits[rid] = ids[:h]
    if len(ids) > h:
        fresh[rid] = ids[h:] if h else ids


def run_job(job: dict[str, Any], emit: Any, model_dir: Path) -> None:
    outputs_mod = _module("vllm.v1.outputs")
    status = _module("vllm.v1.request").RequestStatus
    vllm = _module("vllm")
    scheduler = build_scheduler(job["config"], model_dir)
    pool = scheduler.kv_cache_manager.block_pool
    hasher = block_hasher(scheduler)
    keys = BlockKeys(pool, scheduler.block_size) if hasher is not None else None
    preempted: list[str] = []
    preempt = scheduler._preempt_request

    def record_preemption(request: Any, *args: Any, **kwargs: Any) -> Any:
        # The scheduler output keeps preemptions in a set; this keeps their order.
        preempted.append(request.request_id)
        return preempt(request, *args, **kwargs)

    scheduler._preempt_request = record_preemption
    model_config = scheduler.vllm_config.model_config
    emit({"job": job["name"], "vllm": vllm.__version__, "null_block": pool.null_block.block_id,
          "config": effective_config(scheduler), "free_blocks": pool.get_num_free_blocks()})

    contents = Contents(job["requests"])
    pending: list[dict[str, Any]] = sorted(job["requests"], key=lambda w: w["arrival"])
    live: dict[str, Any] = {}  # the Request objects vLLM holds, by id
    aborts: dict[int, list[str]] = {}
    for w in pending:
        if w.get("abort") is not None:
            aborts.setdefault(w["abort"], []).append(w["id"])
    max_steps = job.get("max_steps")
    nxt = 0
    step = 0
    while nxt < len(pending) or live:
        if max_steps is not None and step >= max_steps:
            emit({"done": job["name"], "complete": False, "steps": step})
            return
        arrivals: list[str] = []
        refused: list[dict[str, str]] = []
        while nxt < len(pending) and pending[nxt]["arrival"] <= step:
            w = pending[nxt]
            nxt += 1
            arrivals.append(w["id"])
            reason = refusal(model_config, w["prompt_len"])
            if reason is not None:
                refused.append({"id": w["id"], "reason": reason})
                continue
            live[w["id"]] = make_request(w, nxt, contents, hasher)
            scheduler.add_request(live[w["id"]])
            if keys is not None:
                keys.arrived(live[w["id"]])
        aborted: list[str] = []
        for rid in aborts.pop(step, ()):
            if rid in live:
                scheduler.finish_requests(rid, status.FINISHED_ABORTED)
                del live[rid]
                aborted.append(rid)
                if keys is not None:
                    keys.forget(rid, unwritten=True)
        preempted.clear()
        output = scheduler.schedule()
        if set(preempted) != set(output.preempted_req_ids):
            raise DriverError(f"step {step}: preempted {sorted(preempted)} but the scheduler "
                              f"output says {sorted(output.preempted_req_ids)}")
        fresh, hits = step_blocks(output, scheduler.block_size)
        scheduled = list(output.num_scheduled_tokens.items())
        sampled: list[list[int]] = []
        for rid, _ in scheduled:
            request = live[rid]
            if request.num_computed_tokens < request.num_tokens:
                sampled.append([])  # a partial prefill chunk samples nothing
            else:
                sampled.append([contents.output(rid, request.num_output_tokens)])
        ids = [rid for rid, _ in scheduled]
        runner_output = outputs_mod.ModelRunnerOutput(
            req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=sampled)
        engine_outputs = scheduler.update_from_output(output, runner_output)
        finished = finishes(engine_outputs)
        for f in finished:
            live.pop(f["id"], None)
            if keys is not None:
                keys.forget(f["id"])
        emit({"step": step, "arrivals": arrivals, "refused": refused, "aborted": aborted,
              "preempted": list(preempted), "scheduled": [[rid, n] for rid, n in scheduled],
              "new_block_ids": fresh, "prefix_hits": hits,
              "block_keys": {rid: list(map(key_text, ks)) for rid, ks in keys.take().items()}
              if keys is not None else {},
              "finished": finished, "free_blocks": pool.get_num_free_blocks()})
        step += 1
    emit({"done": job["name"], "complete": True, "steps": step})


Emit = Callable[[dict[str, Any]], None]


def driver_main(argv: list[str], script: str,
                run_jobs: Callable[[list[dict[str, Any]], Emit], None]) -> int:
    """A driver process around an engine's run: the jobs file in argv[1], one JSON event
    a line on standard output (whatever the engine prints goes to standard error), and
    any failure as one {"error": ...} event and exit status 3. V0's driver runs its jobs
    in it too (vllm_v0_driver.py)."""
    # This folder holds kvsched's own vllm.py: it must not shadow the real vLLM.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    # Keep standard output for events; whatever vLLM prints goes to standard error.
    events: IO[str] = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def emit(obj: dict[str, Any]) -> None:
        events.write(json.dumps(obj, separators=(",", ":")) + "\n")

    if len(argv) != 2:
        emit({"error": f"usage: {script} JOBS.jsonl"})
        return 2
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
                       ("VLLM_NO_USAGE_STATS", "1"), ("DO_NOT_TRACK", "1")):
        os.environ.setdefault(key, value)
    try:
        with open(argv[1]) as f:
            jobs = [json.loads(line) for line in f if line.strip()]
        run_jobs(jobs, emit)
    except Exception as e:  # every failure reaches the adapter as one line
        message = " ".join(str(e).split()) or type(e).__name__
        emit({"error": f"{type(e).__name__}: {message}"})
        return 3
    finally:
        events.flush()
    return 0


def main(argv: list[str]) -> int:
    def run_jobs(jobs: list[dict[str, Any]], emit: Emit) -> None:
        # vLLM seeds its first block hash from PYTHONHASHSEED when set, else from a
        # fixed string (sha256): without it the block keys are the same in every run.
        os.environ.pop("PYTHONHASHSEED", None)
        with tempfile.TemporaryDirectory(prefix="kvsched-vllm-") as tmp:
            for job in jobs:
                run_job(job, emit, Path(tmp))

    return driver_main(argv, "vllm_driver.py", run_jobs)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
