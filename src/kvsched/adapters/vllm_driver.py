"""Drive vLLM's real v1 scheduler on kvsched workloads; runs with vLLM's own Python.

    <vllm-venv>/bin/python vllm_driver.py JOBS.jsonl

This file imports only the standard library, vLLM and driver_host.py beside it (by its
path; never kvsched, which need not be installed in vLLM's environment). Its functions
that read vLLM's objects (effective_config, step_blocks, BlockKeys, finishes) are the
only such code: kvsched's tracing plugin (kvsched.integrations.vllm), which runs inside
vLLM with kvsched installed, imports them from here.

It is written against vLLM 0.32 and drives every v1 release kvsched knows, 0.11.0 to
0.34.0 (kvsched.spec.profiles.VLLM_V1_RELEASE_LIST; kvsched.adapters.vllm_releases
builds their environments): what differs between releases is bridged in one section
below ("What differs between releases"), each difference detected once from the
release's own API, never from its version number, and named in the job's header.

It reads one job per line of JOBS.jsonl and writes raw events, one JSON object per
line, to its standard output; kvsched.adapters.vllm turns them into trace v1.
Anything vLLM itself prints goes to standard error.

NOTE on the loop: it is kvsched's simulation loop (src/kvsched/simulate.py) with
vLLM's scheduler inside, built as vLLM's own tests/v1/core/utils.py builds it (no
model, no tokenizer, synchronous scheduling; prefix caching on unless the job's config
says "enable_prefix_caching": false), run by driver_host.run_job (the arrivals, the
aborts, the max_steps and stall stops), Job being vLLM's side of it. Each step: add
the arrivals (vLLM's input processor refuses a prompt that leaves no room for an
output token before the engine sees it; such a request is reported as refused and
never added), apply the aborts, schedule(), hand back one sampled token for each
scheduled request whose computed tokens caught up with its tokens (end-of-sequence
once its hidden output length is reached), and update_from_output(). Priority ties
break as kvsched's (priority, arrival step, arrival order) because each request's
arrival_time is its arrival order.

NOTE on tokens: with prefix caching vLLM's own block hashes decide the hits, so every
request carries real token ids (`Contents`, driver_host.py's, which every driver shares
with the process around its jobs, `driver_main`).

Events:
    {"job": name, "vllm": version, "null_block": id, "config": {..., "shims": [names]},
     "free_blocks": n}
    {"step": s, "arrivals": [ids], "refused": [{"id", "reason"}], "aborted": [ids],
     "preempted": [ids], "scheduled": [[id, n]], "new_block_ids": {id: [ids]},
     "prefix_hits": {id: [ids]}, "block_keys": {id: [base64]},
     "finished": [{"id", "reason"}], "free_blocks": n}
`new_block_ids` are the blocks handed out fresh; `prefix_hits` the cached blocks an
admitted request (new, or resumed after recompute) starts its table with; `block_keys`
continue, per request, vLLM's hashes of its full blocks (Request.block_hashes, in
base64: key_text): a prompt's when it arrives, a block of outputs when vLLM caches it
(BlockKeys).
    {"done": name, "complete": bool, "steps": n[, "stopped": "one line"][, "stalled": s]}
    {"error": "one line"}    (then exit status 3)
A job "stalled" from step s when vLLM decided nothing from s on with nothing left to
arrive or abort (driver_host's NOTE on the loop). A job "stopped" when vLLM did
something in a step that trace v1 cannot say (a DriverError: 0.11.0 readmits a request
with computed tokens that are not whole blocks): its trace holds the steps before,
without an end line, and the other jobs run.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import importlib
import inspect
import json
import os
import runpy
import sys
import tempfile
import weakref
from collections.abc import Callable, Iterator
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # kvsched.adapters.vllm_driver (the tracing plugin)
    from kvsched.adapters.driver_host import (
        EOS_TOKEN_ID,
        FIRST_TOKEN_ID,
        VOCAB_SIZE,
        Contents,
        Emit,
        driver_main,
        run_job,
        token_id,
    )
else:  # a script in vLLM's own Python, without kvsched: driver_host.py beside it
    _host = runpy.run_path(str(Path(__file__).resolve().with_name("driver_host.py")))
    EOS_TOKEN_ID, FIRST_TOKEN_ID, VOCAB_SIZE = (
        _host["EOS_TOKEN_ID"], _host["FIRST_TOKEN_ID"], _host["VOCAB_SIZE"])
    Contents, Emit, driver_main, run_job, token_id = (
        _host["Contents"], _host["Emit"], _host["driver_main"], _host["run_job"],
        _host["token_id"])



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


# == What differs between releases =====================================================
#
# The driver is written against vLLM 0.32. The other v1 releases, 0.11.0 to 0.34.0,
# differ from it in the few places below; each difference is detected from the
# release's own API (a signature, an attribute, a module, the source text of a method),
# never from its version number, once per process or per scheduler (never per step),
# and bridged by the smallest shim that keeps vLLM's decisions its own. Each shim that
# fires is named in SHIMS, which the job's header event carries (config "shims"). On
# 0.31.0-0.33.0 none fires. The releases each one fired on (docs/conformance/
# vllm-releases.md has the recordings):
#
#   sched-config-watermark, no-watermark   0.11.0-0.23.0   no v1 watermark
#   sched-config-is_encoder_decoder        0.11.0
#   cpu-async-off                          any     async scheduling: the CPU platform's off
#   scheduler-block_size                   0.11.0
#   scheduler-hash_block_size              0.11.0-0.19.1
#   no-reserve-full-isl                    0.11.0-0.18.1   admission checks one chunk
#   no-adaptive-threshold                  0.11.0-0.30.0
#   no-max-num-active-reqs                 0.11.0-0.30.0
#   request-eos                            0.11.0-0.16.0
#   validate-model-input                   0.11.0-0.16.0
#   length-check-valueerror                0.17.0-0.26.0
#   engine-processor                       0.11.0-0.11.2
#   runner-output-defaults                 0.11.0-0.13.0
#   sampled-token-ids-ndarray              0.11.1-0.11.2
#   inline-preemption, no-preempted-req-ids  0.11.0-0.11.2
#   hash-fn-in-utils, resumed-from-preemption, cpu-block-size-16   0.11.0
#   cpu-triton-check, resumed-as-new, runner-output-no-req_id_to_index   0.34.0
#   seeded-none-hash                       0.11.0-0.30.0   block keys made reproducible

SHIMS: list[str] = []  # the shims that fired in this process, in order


def fired(name: str) -> None:
    """Name a shim that fired, once."""
    if name not in SHIMS:
        SHIMS.append(name)


def accepted(fn: Any, kwargs: dict[str, Any], tag: str) -> dict[str, Any]:
    """`kwargs` less those `fn` does not take; each one left out fires `tag-name`.

    SchedulerConfig (tag sched-config): `watermark` (0.11.0-0.23.0, which have no v1
    watermark) and `is_encoder_decoder` (0.11.0). Scheduler() (tag scheduler):
    `block_size` (0.11.0, which reads the cache config's) and `hash_block_size`
    (0.11.0-0.19.1, which hash blocks of the KV block size)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return kwargs
    kept = {}
    for key, value in kwargs.items():
        if key in params:
            kept[key] = value
        else:
            fired(f"{tag}-{key}")
    return kept


def attribute(obj: Any, name: str, default: Any, shim: str) -> Any:
    """obj.name, or `default` where the release has no such attribute (fires `shim`):
    no-watermark (KVCacheManager.watermark_blocks, 0.11.0-0.23.0: 0),
    no-reserve-full-isl (Scheduler.scheduler_reserve_full_isl, 0.11.0-0.18.1: False, as
    they admit on the first chunk's blocks), no-adaptive-threshold and
    no-max-num-active-reqs (0.11.0-0.30.0: False, and max_num_running_reqs)."""
    if hasattr(obj, name):
        return getattr(obj, name)
    fired(shim)
    return default


_platform_checked = False


def relax_cpu_platform() -> None:
    """Let vLLM's CPU platform accept the config when it refuses it for kernels the driver
    never runs, during its config check only (once per process):
    cpu-block-size-16 (0.11.0 refuses block sizes other than 16 without
    intel_extension_for_pytorch: its probe finds it), cpu-triton-check (0.34.0 refuses
    x86 without triton-cpu, which only its model runner needs: HAS_TRITON reads true)."""
    global _platform_checked
    if _platform_checked:
        return
    _platform_checked = True
    cpu = _module("vllm.platforms.cpu")
    source = inspect.getsource(cpu.CpuPlatform.check_and_update_config)
    relaxed: list[Callable[[], contextlib.AbstractContextManager[None]]] = []
    if "ipex_available and cache_config.block_size != 16" in source:
        fired("cpu-block-size-16")
        relaxed.append(lambda: _replaced(cpu, "find_spec", _finds_ipex(cpu.find_spec)))
    if "requires Triton" in source:
        fired("cpu-triton-check")
        relaxed.append(lambda: _replaced(_module("vllm.triton_utils"), "HAS_TRITON", True))
    if not relaxed:
        return
    check = cpu.CpuPlatform.check_and_update_config.__func__

    def check_and_update_config(cls: Any, vllm_config: Any) -> Any:
        with contextlib.ExitStack() as stack:
            for relax in relaxed:
                stack.enter_context(relax())
            return check(cls, vllm_config)

    cpu.CpuPlatform.check_and_update_config = classmethod(check_and_update_config)


def _finds_ipex(find_spec: Callable[..., Any]) -> Callable[..., Any]:
    def find(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "intel_extension_for_pytorch":
            return ModuleSpec(name, None)
        return find_spec(name, *args, **kwargs)

    return find


@contextlib.contextmanager
def _replaced(obj: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)


def _fields(cls: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()


def give_resumed_req_ids(cached_cls: Any) -> None:
    """Give the scheduler output's CachedRequestData the set resumed_req_ids that
    step_blocks reads, where the release has none (on vLLM's class, once):
    resumed-from-preemption (0.11.0 has a list of bools, resumed_from_preemption, one per
    request), resumed-as-new (0.34.0 reports a resumed request among the new ones, with
    its whole table: no cached request is a resumed one)."""
    if hasattr(cached_cls, "resumed_req_ids") or "resumed_req_ids" in _fields(cached_cls):
        return
    if "resumed_from_preemption" in _fields(cached_cls):
        fired("resumed-from-preemption")
        cached_cls.resumed_req_ids = property(lambda self: {
            rid for rid, resumed in zip(self.req_ids, self.resumed_from_preemption,
                                        strict=True) if resumed})
    else:
        fired("resumed-as-new")
        cached_cls.resumed_req_ids = frozenset()


def watch_preemptions(scheduler: Any, record: Callable[[Any], None]) -> None:
    """Have record(request) called for each request the scheduler preempts, in order (the
    scheduler output keeps them in a set): around Scheduler._preempt_request, or where
    the release has none, inline-preemption (0.11.0-0.11.2 preempt inside schedule(),
    which puts each victim back with self.waiting.prepend_request and calls it nowhere
    else, as its source is checked to say): around that queue's method."""
    preempt = getattr(scheduler, "_preempt_request", None)
    if preempt is not None:
        def record_preemption(request: Any, *args: Any, **kwargs: Any) -> Any:
            record(request)
            return preempt(request, *args, **kwargs)

        scheduler._preempt_request = record_preemption
        return
    fired("inline-preemption")
    cls: Any = vllm_class(scheduler)
    call = "self.waiting.prepend_request("
    if inspect.getsource(cls).count(call) != 1 or call not in inspect.getsource(cls.schedule):
        raise DriverError("vLLM's scheduler has no _preempt_request, and its schedule() is "
                          "not the only caller of self.waiting.prepend_request: the driver "
                          "cannot see its victims")
    waiting = scheduler.waiting
    prepend = waiting.prepend_request

    def prepend_request(request: Any) -> Any:
        record(request)
        return prepend(request)

    waiting.prepend_request = prepend_request


def names_victims(output_cls: Any) -> bool:
    """Whether SchedulerOutput names the step's victims (preempted_req_ids). Where it does
    not, no-preempted-req-ids (0.11.0-0.11.2): the driver takes the running requests that
    schedule() left PREEMPTED."""
    if hasattr(output_cls, "preempted_req_ids") or "preempted_req_ids" in _fields(output_cls):
        return True
    fired("no-preempted-req-ids")
    return False


def runner_output_maker(output_cls: Any) -> Callable[[list[str], list[list[int]]], Any]:
    """What builds the fake model's ModelRunnerOutput for a step (the requests scheduled,
    what each sampled): runner-output-defaults (0.11.0-0.13.0 require logprobs,
    prompt_logprobs_dict and pooler_output: None, {}, []), sampled-token-ids-ndarray
    (0.11.1-0.11.2 take each request's tokens as a numpy array, and call .tolist() on
    it), runner-output-no-req_id_to_index (0.34.0 indexes req_ids itself)."""
    params = inspect.signature(output_cls).parameters
    required = {name for name, p in params.items() if p.default is p.empty}
    defaults: dict[str, Callable[[], Any]] = {"logprobs": lambda: None,
                                              "prompt_logprobs_dict": dict,
                                              "pooler_output": list}
    missing = [name for name in defaults if name in required]
    if missing:
        fired("runner-output-defaults")
    unknown = required - {"req_ids", "req_id_to_index", "sampled_token_ids", *missing}
    if unknown:
        raise DriverError(f"vLLM's ModelRunnerOutput requires {sorted(unknown)}, which the "
                          "driver cannot give")
    indexed = "req_id_to_index" in params
    if not indexed:
        fired("runner-output-no-req_id_to_index")
    as_array: Callable[[list[int]], Any] | None = None
    if "ndarray" in str(next((f.type for f in dataclasses.fields(output_cls)
                              if f.name == "sampled_token_ids"), "")):
        fired("sampled-token-ids-ndarray")
        np = _module("numpy")
        as_array = functools.partial(np.array, dtype=np.int64)

    def make(ids: list[str], sampled: list[list[int]]) -> Any:
        kwargs: dict[str, Any] = {name: defaults[name]() for name in missing}
        if indexed:
            kwargs["req_id_to_index"] = {rid: i for i, rid in enumerate(ids)}
        tokens = sampled if as_array is None else [as_array(t) for t in sampled]
        return output_cls(req_ids=ids, sampled_token_ids=tokens, **kwargs)

    return make


@functools.cache
def _request_takes_eos(request_cls: Any) -> bool:
    """request-eos: Request() takes the model's eos_token_id (0.11.0-0.16.0)."""
    takes = "eos_token_id" in inspect.signature(request_cls.__init__).parameters
    if takes:
        fired("request-eos")
    return takes


@functools.cache
def _prompt_check() -> tuple[Callable[[Any, int], None], type[Exception]]:
    """vLLM's input processor's prompt-length check, run on a stand-in for the processor,
    and the exception it refuses with: InputProcessor._validate_prompt_len, which raises
    VLLMValidationError, or length-check-valueerror (0.17.0-0.26.0: it raises
    ValueError, as its source says), or validate-model-input (0.11.0-0.16.0 check
    the length in _validate_model_input, given the prompt's tokens, and raise ValueError)
    of the processor that engine-processor names (0.11.x: vllm.v1.engine.processor.
    Processor)."""
    try:
        processor = _module("vllm.v1.engine.input_processor").InputProcessor
    except ImportError:
        fired("engine-processor")
        processor = _module("vllm.v1.engine.processor").Processor
    if hasattr(processor, "_validate_prompt_len"):
        def check(stand_in: Any, prompt_len: int) -> None:
            processor._validate_prompt_len(stand_in, prompt_len, "decoder")

        if "VLLMValidationError" in inspect.getsource(processor._validate_prompt_len):
            return check, _module("vllm.exceptions").VLLMValidationError
        fired("length-check-valueerror")
        return check, ValueError
    fired("validate-model-input")

    def check_input(stand_in: Any, prompt_len: int) -> None:
        processor._validate_model_input(stand_in, {
            "type": "token", "prompt_token_ids": [FIRST_TOKEN_ID] * prompt_len},
            prompt_type="decoder")

    return check_input, ValueError


@functools.cache
def _hash_fn_by_name() -> Callable[[str], Any]:
    """vLLM's get_hash_fn_by_name: in vllm.utils.hashing, or hash-fn-in-utils (0.11.0:
    in vllm.utils)."""
    try:
        return _module("vllm.utils.hashing").get_hash_fn_by_name  # type: ignore[no-any-return]
    except (ImportError, AttributeError):
        fired("hash-fn-in-utils")
        return _module("vllm.utils").get_hash_fn_by_name  # type: ignore[no-any-return]


# The seed a release's first block hash is drawn from where it would otherwise be random
# per process: any fixed value makes a release's block keys the same in every run.
NONE_HASH_SEED = "0"


def _seed_none_hash(utils: Any) -> None:
    """(<= 0.30) init_none_hash draws the first block hash from os.urandom unless
    PYTHONHASHSEED is set, so that block keys (not decisions) differ in every run: it
    gets NONE_HASH_SEED, and a release's traces are the same bytes in every recording.
    Releases that seed it from a fixed string (0.31 on) are left as they are."""
    if "urandom" in inspect.getsource(utils.init_none_hash):
        fired("seeded-none-hash")
        os.environ["PYTHONHASHSEED"] = NONE_HASH_SEED


def detect_release() -> None:
    """Run the detections made on first use, so that SHIMS names them before a job's
    header is written, whatever the job (its header names the release's shims, not the
    ones its own config happened to need)."""
    _request_takes_eos(_module("vllm.v1.request").Request)
    _prompt_check()
    _hash_fn_by_name()
    _seed_none_hash(_module("vllm.v1.core.kv_cache_utils"))


# == end of what differs between releases ==============================================


def build_scheduler(cfg: dict[str, Any], model_dir: Path, scheduler_class: Any = None) -> Any:
    """vLLM's Scheduler (or `scheduler_class`, a subclass of it) for one job's config, as
    tests/v1/core/utils.py builds it."""
    relax_cpu_platform()
    torch = _module("torch")
    vconfig = _module("vllm.config")
    kv = _module("vllm.v1.kv_cache_interface")
    sched_mod = _module("vllm.v1.core.sched.scheduler")
    structured = _module("vllm.v1.structured_output")
    block_size = cfg["block_size"]
    num_blocks = cfg["num_blocks"]
    config = dict(MODEL_CONFIG, max_position_embeddings=max(cfg["max_model_len"], 2048))
    (model_dir / "config.json").write_text(json.dumps(config))
    settings = accepted(vconfig.SchedulerConfig, dict(
        max_num_seqs=cfg["max_num_seqs"],
        max_num_batched_tokens=cfg["max_num_batched_tokens"],
        max_model_len=cfg["max_model_len"],
        enable_chunked_prefill=cfg["enable_chunked_prefill"],
        long_prefill_token_threshold=cfg["long_prefill_token_threshold"],
        policy=cfg["policy"],
        watermark=cfg["watermark"],
        async_scheduling=bool(cfg.get("async_scheduling", False)),
        is_encoder_decoder=False,
    ), "sched-config")
    if cfg["watermark"] and "watermark" not in settings:
        raise DriverError("this vLLM release's v1 scheduler has no watermark (its "
                          "SchedulerConfig takes none): use watermark_blocks 0")
    scheduler_config = vconfig.SchedulerConfig(**settings)
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
    if settings.get("async_scheduling") and not scheduler_config.async_scheduling:
        # vLLM's CPU platform turns async scheduling off ("not required on CPU"); a GPU
        # engine keeps it and builds the AsyncScheduler, as the driver does.
        fired("cpu-async-off")
        scheduler_config.async_scheduling = True
    cls = scheduler_class or sched_mod.Scheduler
    base: Any = vllm_base(cls)  # a tracing subclass takes what vLLM's class takes
    return cls(**accepted(base.__init__, dict(
        vllm_config=vllm_config, kv_cache_config=kv_cache_config,
        structured_output_manager=structured.StructuredOutputManager(vllm_config),
        block_size=block_size, hash_block_size=block_size, log_stats=True), "scheduler"))


def effective_config(scheduler: Any) -> dict[str, Any]:
    """What the built scheduler will really use, read back from vLLM's objects (where a
    release has no such setting, what it does instead: `attribute`)."""
    sc = scheduler.scheduler_config
    manager = scheduler.kv_cache_manager
    return {
        "block_size": scheduler.block_size,
        "num_blocks": manager.block_pool.num_gpu_blocks,
        "max_num_scheduled_tokens": scheduler.max_num_scheduled_tokens,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "max_num_running_reqs": scheduler.max_num_running_reqs,
        "max_num_active_reqs": attribute(scheduler, "max_num_active_reqs",
                                         scheduler.max_num_running_reqs,
                                         "no-max-num-active-reqs"),
        "max_model_len": scheduler.max_model_len,
        "enable_chunked_prefill": sc.enable_chunked_prefill,
        "long_prefill_token_threshold": sc.long_prefill_token_threshold,
        "long_prefill_token_threshold_adaptive": attribute(
            scheduler, "adaptive_long_prefill_threshold", False, "no-adaptive-threshold"),
        "policy": scheduler.policy.value,
        "watermark_blocks": attribute(manager, "watermark_blocks", 0, "no-watermark"),
        "scheduler_reserve_full_isl": attribute(scheduler, "scheduler_reserve_full_isl",
                                                False, "no-reserve-full-isl"),
        "enable_prefix_caching": manager.enable_caching,
        "async_scheduling": bool(sc.async_scheduling),
        "num_spec_tokens": scheduler.num_spec_tokens,
        "num_lookahead_tokens": scheduler.num_lookahead_tokens,
        "scheduler_class": vllm_class(scheduler).__name__,
    }


def vllm_class(scheduler: Any) -> type:
    """The vLLM scheduler class whose decisions `scheduler` makes: its own class, or the
    nearest vLLM class it derives from (a tracing subclass adds no decisions)."""
    return vllm_base(type(scheduler))


def vllm_base(cls: type) -> type:
    """`cls` if vLLM's own, else the nearest vLLM class it derives from."""
    return next(c for c in cls.__mro__ if c.__module__.startswith("vllm."))


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
    _validate_prompt_len, or what the release has: _prompt_check), run on a stand-in for
    the processor: its message, or None."""
    check, invalid = _prompt_check()
    stand_in = SimpleNamespace(skip_prompt_length_check=False, model_config=model_config,
                               mm_encoder_cache_size=0, supports_mm_inputs=False,
                               tokenizer=None, input_preprocessor=None)
    try:
        check(stand_in, prompt_len)
    except invalid as e:
        return str(e).splitlines()[0]
    return None


def block_hasher(scheduler: Any) -> Any:
    """vLLM's hasher of a request's full blocks, as its engine core sets it up, or None
    without prefix caching."""
    if not scheduler.kv_cache_manager.enable_caching:
        return None
    utils = _module("vllm.v1.core.kv_cache_utils")
    hash_fn = _hash_fn_by_name()(scheduler.cache_config.prefix_caching_hash_algo)
    _seed_none_hash(utils)
    utils.init_none_hash(hash_fn)
    return utils.get_request_block_hasher(scheduler.block_size, hash_fn)


def make_request(item: dict[str, Any], order: int, contents: Contents,
                 hasher: Any) -> Any:
    params_mod = _module("vllm.sampling_params")
    request_cls = _module("vllm.v1.request").Request
    params = params_mod.SamplingParams(max_tokens=item["max_tokens"])
    # Positional: the argument is eos_token_id, model_eos_token_id up to 0.16.
    params.update_from_generation_config({}, EOS_TOKEN_ID)
    eos = {"eos_token_id": EOS_TOKEN_ID} if _request_takes_eos(request_cls) else {}
    return request_cls(
        request_id=item["id"], prompt_token_ids=contents.prompt(item["id"]),
        sampling_params=params, pooling_params=None, arrival_time=float(order),
        priority=item.get("priority", 0), block_hasher=hasher, **eos)


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


class Job:
    """One job on vLLM's v1 scheduler: its side of driver_host.run_job's loop (arrive,
    abort, step, stopped), writing the job's header event when built."""

    def __init__(self, job: dict[str, Any], emit: Emit, model_dir: Path) -> None:
        sched_output = _module("vllm.v1.core.sched.output")
        self.status = _module("vllm.v1.request").RequestStatus
        vllm = _module("vllm")
        # With async scheduling vLLM's engine core decides step k+1 before it applies step
        # k's output (EngineCore.step_with_batch_queue, a queue of two batches): the
        # driver does the same with vLLM's AsyncScheduler (pipelined_step).
        self.pipelined = bool(job["config"].get("async_scheduling", False))
        self.scheduler = scheduler = build_scheduler(
            job["config"], model_dir,
            _module("vllm.v1.core.sched.async_scheduler").AsyncScheduler
            if self.pipelined else None)
        # Pipelined: the batch in flight (its output not applied yet, and who samples in
        # it), and the requests whose blocks the last output's finishes freed.
        self.in_flight: tuple[Any, list[str]] | None = None
        self.freed: list[str] = []
        self.pool = pool = scheduler.kv_cache_manager.block_pool
        self.hasher = block_hasher(scheduler)
        self.keys = BlockKeys(pool, scheduler.block_size) if self.hasher is not None else None
        # The scheduler output keeps preemptions in a set; this keeps their order.
        self.preempted: list[str] = []
        watch_preemptions(scheduler, lambda request: self.preempted.append(request.request_id))
        self.victims_named = names_victims(sched_output.SchedulerOutput)
        give_resumed_req_ids(sched_output.CachedRequestData)
        self.runner_output = runner_output_maker(_module("vllm.v1.outputs").ModelRunnerOutput)
        detect_release()
        self.model_config = scheduler.vllm_config.model_config
        config = effective_config(scheduler)
        config["shims"] = list(SHIMS)
        emit({"job": job["name"], "vllm": vllm.__version__,
              "null_block": pool.null_block.block_id, "config": config,
              "free_blocks": pool.get_num_free_blocks()})
        self.contents = Contents(job["requests"])
        self.live: dict[str, Any] = {}  # the Request objects vLLM holds, by id

    def arrive(self, w: dict[str, Any], order: int) -> str | None:
        reason = refusal(self.model_config, w["prompt_len"])
        if reason is None:
            request = make_request(w, order, self.contents, self.hasher)
            self.live[w["id"]] = request
            self.scheduler.add_request(request)
            if self.keys is not None:
                self.keys.arrived(request)
        return reason

    def abort(self, rid: str) -> bool:
        self.scheduler.finish_requests(rid, self.status.FINISHED_ABORTED)
        del self.live[rid]
        if self.keys is not None:
            self.keys.forget(rid, unwritten=True)
        return True

    def step(self, step: int) -> tuple[dict[str, Any], list[str], bool]:
        if self.pipelined:
            return self.pipelined_step()
        scheduler, live, keys = self.scheduler, self.live, self.keys
        output, preempted, scheduled, decided = self.decide()
        sampled: list[list[int]] = []
        for rid, _ in scheduled:
            request = live[rid]
            if request.num_computed_tokens < request.num_tokens:
                sampled.append([])  # a partial prefill chunk samples nothing
            else:
                sampled.append([self.contents.output(rid, request.num_output_tokens)])
        engine_outputs = scheduler.update_from_output(
            output, self.runner_output([rid for rid, _ in scheduled], sampled))
        finished = finishes(engine_outputs)
        for f in finished:
            live.pop(f["id"], None)
            if keys is not None:
                keys.forget(f["id"])
        return ({**decided, "finished": finished,
                 "free_blocks": self.pool.get_num_free_blocks()},
                [f["id"] for f in finished], bool(scheduled or preempted or finished))

    def decide(self) -> tuple[Any, list[str], list[tuple[str, int]], dict[str, Any]]:
        """vLLM's schedule() for one step: its output, the victims in the order vLLM took
        them, the batch, and the step event's fields they make."""
        scheduler, status, keys = self.scheduler, self.status, self.keys
        preempted = self.preempted
        preempted.clear()
        running = () if self.victims_named else list(scheduler.running)
        output = scheduler.schedule()
        reported = output.preempted_req_ids if self.victims_named else {
            r.request_id for r in running if r.status == status.PREEMPTED}
        if set(preempted) != set(reported):
            raise DriverError(f"preempted {sorted(preempted)} but the scheduler output "
                              f"says {sorted(reported)}")
        fresh, hits = step_blocks(output, scheduler.block_size)
        scheduled = list(output.num_scheduled_tokens.items())
        return output, list(preempted), scheduled, {
            "preempted": list(preempted), "scheduled": [[rid, n] for rid, n in scheduled],
            "new_block_ids": fresh, "prefix_hits": hits,
            "block_keys": {rid: list(map(key_text, ks)) for rid, ks in keys.take().items()}
            if keys is not None else {}}

    def pipelined_step(self) -> tuple[dict[str, Any], list[str], bool]:
        """One step of async scheduling, as vLLM's engine core runs it with its queue of
        two batches (EngineCore.step_with_batch_queue): decide step k, then apply step
        k-1's output. The step event's "finished_before" are step k-1's finishes (its
        own "finished" are none: they are known a step later); applying the output
        frees their blocks, which are "released" in step k+1's event, whose decisions
        had them back; a request that stopped at end-of-sequence may be in step k's
        batch, a slot the engine core had already filled (vLLM's AsyncScheduler skips
        only a request sure to have reached max_tokens). free_blocks is vLLM's count
        after step k's decisions, before that output."""
        scheduler, live, keys = self.scheduler, self.live, self.keys
        output, preempted, scheduled, decided = self.decide()
        free = self.pool.get_num_free_blocks()
        # Who samples in step k: not a prompt chunk that leaves tokens to compute.
        sampling = [rid for rid, _ in scheduled if not live[rid].is_prefill_chunk]
        released, self.freed = self.freed, []
        finished: list[dict[str, str]] = []
        if self.in_flight is not None:
            last, samplers = self.in_flight
            ids = list(last.num_scheduled_tokens)
            sampled = [[self.contents.output(rid, live[rid].num_output_tokens)]
                       if rid in samplers and rid in live else [] for rid in ids]
            finished = finishes(scheduler.update_from_output(
                last, self.runner_output(ids, sampled)))
            for f in finished:
                if keys is not None:
                    keys.forget(f["id"])
            self.freed = [f["id"] for f in finished]
        self.in_flight = (output, sampling) if scheduled else None
        for rid in released:
            live.pop(rid, None)
        return ({**decided, "finished": [], "finished_before": finished,
                 "released": released, "free_blocks": free},
                released, bool(scheduled or preempted or finished or released))

    def stopped(self, error: Exception) -> dict[str, Any] | None:
        """vLLM did something in a step that trace v1 cannot say (a DriverError): the
        trace keeps the steps before it, and the next job runs."""
        return {"stopped": str(error)} if isinstance(error, DriverError) else None


def main(argv: list[str]) -> int:
    def run_jobs(jobs: list[dict[str, Any]], emit: Emit) -> None:
        # vLLM seeds its first block hash from PYTHONHASHSEED when set, else from a
        # fixed string (sha256, 0.31 on): without it the block keys are the same in
        # every run (older releases draw it at random: _seed_none_hash).
        os.environ.pop("PYTHONHASHSEED", None)
        with tempfile.TemporaryDirectory(prefix="kvsched-vllm-") as tmp:
            for job in jobs:
                run_job(job, Job(job, emit, Path(tmp)), emit)

    return driver_main(argv, "vllm_driver.py", run_jobs)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
