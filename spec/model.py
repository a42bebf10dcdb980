"""The model of docs/spec.md section 1: the config, requests and their state; and what
one step of section 2 decides (Decision) and records (StepRecord, a trace line).

Everything here is a value. The checker (kvsched.spec.state) and the schedulers keep
their own mutable bookkeeping; this module only says what the numbers mean.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Literal

Policy = Literal["fcfs", "priority"]
# lazy: recompute, lazily: a victim goes back to waiting keeping its blocks and computed
# tokens until a step's `reclaimed` takes them (LMDeploy).
PreemptionMode = Literal["recompute", "swap", "auto", "lazy"]
# When blocks are handed out (kvsched.spec.blocks.allocation_reserve): as the chunks
# need them (vLLM v1), for all known tokens at admission and swap-in (vLLM V0), or for
# the longest sequence at admission (Orca, TGI).
Allocation = Literal["lazy", "prompt", "full"]
# When the watermark applies to an admission or a swap-in: while some request runs
# (vLLM v1), or always (vLLM V0).
WatermarkScope = Literal["running", "always"]
# What one step may combine: running requests' decodes and new prefill work together
# (vLLM); prefill work or decodes, never both (SGLang: a step that admits prefill work
# decodes nothing); or, with chunked prefill, decodes joining a prefill step
# (SGLang's --enable-mixed-chunk).
StepMix = Literal["any", "prefill_or_decode", "mixed_chunk"]
POLICIES: tuple[Policy, ...] = ("fcfs", "priority")
PREEMPTION_MODES: tuple[PreemptionMode, ...] = ("recompute", "swap", "auto", "lazy")
ALLOCATIONS: tuple[Allocation, ...] = ("lazy", "prompt", "full")
WATERMARK_SCOPES: tuple[WatermarkScope, ...] = ("running", "always")
STEP_MIXES: tuple[StepMix, ...] = ("any", "prefill_or_decode", "mixed_chunk")
# The fields whose value is one of a few words, with the words.
CHOICES: dict[str, tuple[str, ...]] = {"policy": POLICIES, "preemption": PREEMPTION_MODES,
                                       "allocation": ALLOCATIONS,
                                       "watermark_scope": WATERMARK_SCOPES,
                                       "step_mix": STEP_MIXES}
# A preemption as it happened: auto resolves to recompute or swap per victim; lazy is
# the victim mode of config preemption lazy, and of it alone (`victim_modes`).
VICTIM_MODES: tuple[str, ...] = ("recompute", "swap", "lazy")


def victim_modes(preemption: str) -> tuple[str, ...]:
    """The victim modes a trace of config `preemption` may give: lazy under lazy, and
    recompute or swap under any other."""
    return ("lazy",) if preemption == "lazy" else ("recompute", "swap")

# Numbers above this are refused as absurd (a typo, not a cache).
MAX_COUNT = 2**40


@dataclass(frozen=True)
class Config:
    """One engine's scheduling configuration; every field is in the trace header (one
    of OPTIONAL_CONFIG may be left out of it, for its default)."""

    block_size: int = 16
    num_gpu_blocks: int = 512
    num_cpu_blocks: int = 0
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    max_model_len: int = 4096
    chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    policy: Policy = "fcfs"
    preemption: PreemptionMode = "recompute"
    watermark_blocks: int = 0
    first_block_id: int = 0  # the engine's first block id (vLLM: 1, its block 0 is null)
    prefix_caching: bool = False  # full blocks are cached by content and may be hit
    allocation: Allocation = "lazy"  # when blocks are handed out: lazy, prompt or full
    watermark_scope: WatermarkScope = "running"  # when the watermark applies
    step_mix: StepMix = "any"  # what one step may combine: decodes and prefills, or not
    # The longest prompt the engine's front end takes (longer ones are rejected in their
    # arrival step); 0: no limit of its own, max_model_len governs.
    max_prompt_len: int = 0
    # The tokens beyond its own a chunk may take blocks for (R): its Db lies between
    # blocks_needed(C, Dn, G) and blocks_needed(C, Dn, G, reserve=C + Dn + R) (LMDeploy).
    prealloc_tokens: int = 0
    # Steps are scheduled one ahead of their samples: a finished request may be scheduled
    # once more (a void entry) and holds its blocks until released or reclaimed (LMDeploy).
    pipelined: bool = False

    def problems(self) -> list[str]:
        """Every way this config is malformed, one sentence each naming the field (a
        config read from a trace or a command line may hold any value in any field)."""
        out: list[str] = []
        positive = ("block_size", "num_gpu_blocks", "max_num_batched_tokens",
                    "max_num_seqs", "max_model_len")
        non_negative = ("num_cpu_blocks", "long_prefill_token_threshold", "watermark_blocks",
                        "first_block_id", "max_prompt_len", "prealloc_tokens")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("chunked_prefill", "prefix_caching", "pipelined"):
                if not isinstance(value, bool):
                    out.append(f"config.{f.name} must be true or false, got {value!r}")
                continue
            if f.name in CHOICES:
                allowed = CHOICES[f.name]
                if value not in allowed:
                    out.append(f"config.{f.name} must be one of {', '.join(allowed)}, "
                               f"got {value!r}")
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                out.append(f"config.{f.name} must be an integer, got {value!r}")
            elif f.name in positive and value < 1:
                out.append(f"config.{f.name} must be at least 1, got {value}")
            elif f.name in non_negative and value < 0:
                out.append(f"config.{f.name} must not be negative, got {value}")
            elif value > MAX_COUNT:
                out.append(f"config.{f.name} is absurdly large ({value} > 2**40)")
        # What an engine refuses at start-up (vLLM: no chunked prefill with a budget
        # below max_model_len; SGLang runs that) is its step kind's:
        # kvsched.spec.step_kinds.refusal.
        if not out and self.max_prompt_len > self.max_model_len:
            out.append(f"config.max_prompt_len must be at most max_model_len "
                       f"({self.max_model_len}), got {self.max_prompt_len}")
        if not out and self.step_mix == "mixed_chunk" and not self.chunked_prefill:
            out.append("config.step_mix mixed_chunk adds decodes to chunked prefill steps, "
                       "so it needs chunked_prefill: true")
        if not out and self.long_prefill_token_threshold > 0 and not self.chunked_prefill:
            out.append("config.long_prefill_token_threshold chunks prefills, so it needs "
                       "chunked_prefill: true")
        return out


# Config fields a trace header may leave out, with the value that then holds.
OPTIONAL_CONFIG: dict[str, object] = {"first_block_id": 0, "prefix_caching": False,
                                      "allocation": "lazy", "watermark_scope": "running",
                                      "step_mix": "any", "max_prompt_len": 0,
                                      "prealloc_tokens": 0, "pipelined": False}


def config_field_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(Config))


@dataclass(frozen=True)
class Request:
    """What a client asks: P = prompt_len tokens in, at most O = max_tokens out.

    `prefix` says which shared contents its prompt starts with (kvsched.spec.prefix),
    so that a scheduler with prefix caching knows its blocks' content keys; a trace
    gives the keys themselves (`block_keys`) instead.
    """

    id: str
    prompt_len: int
    max_tokens: int
    priority: int = 0
    arrival_step: int = 0
    prefix: tuple[tuple[str, int], ...] = ()

    def problems(self) -> list[str]:
        out: list[str] = []
        if not self.id:
            out.append("request id must be a non-empty string")
        for name in ("prompt_len", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                out.append(f"{name} of {self.id!r} must be an integer, got {value!r}")
            elif value < 1:
                out.append(f"{name} of {self.id!r} must be at least 1, got {value}")
            elif value > MAX_COUNT:
                out.append(f"{name} of {self.id!r} is absurdly large ({value})")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            out.append(f"priority of {self.id!r} must be an integer, got {self.priority!r}")
        elif abs(self.priority) > MAX_COUNT:
            out.append(f"priority of {self.id!r} is absurdly large ({self.priority})")
        return out


class Status(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"
    ABORTED = "aborted"
    REJECTED = "rejected"
    # Finished under config pipelined, its blocks still held until a step's `released`
    # or `reclaimed` names it: live, neither waiting nor running.
    HELD = "held"

    @property
    def ended(self) -> bool:
        return self in (Status.FINISHED, Status.ABORTED, Status.REJECTED)


@dataclass(frozen=True)
class RequestView:
    """A request's state at a step boundary: N tokens known, C computed, G and H blocks."""

    status: Status
    num_tokens: int
    num_computed: int
    gpu_blocks: int
    host_blocks: int
    num_preemptions: int


@dataclass(frozen=True)
class Rejection:
    id: str
    reason: str


@dataclass(frozen=True)
class Preemption:
    id: str
    mode: str  # "recompute", "swap" or "lazy", as it happened


@dataclass(frozen=True)
class Decision:
    """What a scheduler decides in one step (phases 2 to 5 of docs/spec.md section 2).

    `sampled` lists the scheduled requests whose computed tokens reach their known
    tokens, so sample one token at the end of the step; it is derived, not traced.
    `new_blocks` is None when the scheduler does not expose block ids. `prefix_hits`
    maps a request admitted with a prefix-cache hit to the cached blocks it took, in
    table order; its scheduled count is the tokens computed after them. `released`
    lists held finished requests whose blocks are freed (phase 1, config pipelined);
    `reclaimed` the requests that lose all their blocks (phase 3, after the victims), in
    the order the engine took them.

    `unsampled` (config pipelined) looks one step back: the entries of the PREVIOUS
    step whose output this decision dropped. A pipelined scheduler decides step k+1
    before it applies step k's output; a request of step k's batch that this decision
    preempts does not take that output (LMDeploy applies it only to running requests),
    so its step-k entry computed and sampled nothing, and a finish that step k's update
    reported for it did not happen. The decision is the first to know it, so it carries
    it; the trace writes it on step k's line (`StepRecord.unsampled`), which a
    simulation therefore writes only once step k+1 is decided
    (kvsched.spec.trace.HeldLine).
    """

    rejected: tuple[Rejection, ...] = ()
    preempted: tuple[Preemption, ...] = ()
    swapped_in: tuple[str, ...] = ()
    scheduled: tuple[tuple[str, int], ...] = ()
    sampled: tuple[str, ...] = ()
    new_blocks: dict[str, tuple[int, ...]] | None = None
    prefix_hits: dict[str, tuple[int, ...]] = field(default_factory=dict)
    released: tuple[str, ...] = ()
    reclaimed: tuple[str, ...] = ()
    unsampled: tuple[str, ...] = ()

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    def comparable(self, ordered_victims: bool = True) -> tuple[object, ...]:
        """The decision as one value for equality across implementations (rejection
        reasons are prose and differ between engines, so only the ids count). With
        `ordered_victims` False the victims (with their modes) count as a set, for
        engines that report them so. A prefix hit counts by its length: which cached
        blocks hold the same content is the engine's choice of ids. The released
        count as a set, the reclaimed in order; both only when some step has them, so
        that a decision without them compares as it always did."""
        victims = tuple((p.id, p.mode) for p in self.preempted)
        out: tuple[object, ...] = (
            tuple(r.id for r in self.rejected),
            victims if ordered_victims else tuple(sorted(victims)),
            self.swapped_in,
            self.scheduled,
            tuple(sorted((rid, len(ids)) for rid, ids in self.prefix_hits.items())),
        )
        if self.released or self.reclaimed:
            out += (tuple(sorted(self.released)), self.reclaimed)
        return out


@dataclass(frozen=True)
class StepRecord:
    """One line of a trace: everything that happened in one step."""

    step: int
    arrivals: tuple[Request, ...] = ()
    aborted: tuple[str, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    preempted: tuple[Preemption, ...] = ()
    swapped_in: tuple[str, ...] = ()
    scheduled: tuple[tuple[str, int], ...] = ()
    finished: tuple[str, ...] = ()
    free_blocks: int | None = None
    new_blocks: dict[str, tuple[int, ...]] | None = None
    time_ms: float | None = None
    # Prefix caching: each hit's cached blocks, in table order; and the content keys of
    # requests' full blocks, each list continuing what earlier steps gave for its request.
    prefix_hits: dict[str, tuple[int, ...]] = field(default_factory=dict)
    block_keys: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Deduplication (prefix caching), after the finishes: a running request's table now
    # starts with these cached blocks, which hold the content of the blocks they
    # replace; the replaced ones are released (SGLang's radix cache keeps one copy).
    dedup: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # Config pipelined: held finished requests whose blocks are freed (phase 1, after the
    # aborts). Lazy preemption and held requests: requests that lose all their blocks
    # (phase 3, after the victims), in the order the engine took them.
    released: tuple[str, ...] = ()
    reclaimed: tuple[str, ...] = ()
    # Config pipelined: entries of THIS step whose output the engine dropped (the next
    # step, decided before this step's output was applied, preempted them): each counts
    # in the step's seats, tokens and blocks, but computes and samples nothing.
    unsampled: tuple[str, ...] = ()
    line: int = field(default=0, compare=False)

    @property
    def num_ended(self) -> int:
        """How many requests this step ended: finished, rejected or aborted."""
        return len(self.finished) + len(self.rejected) + len(self.aborted)

    @property
    def decision(self) -> Decision:
        return Decision(self.rejected, self.preempted, self.swapped_in, self.scheduled,
                        new_blocks=self.new_blocks, prefix_hits=self.prefix_hits,
                        released=self.released, reclaimed=self.reclaimed)
