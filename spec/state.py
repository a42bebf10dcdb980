"""The transition rule of docs/spec.md section 2: how one step of a trace moves the state.

NOTE on the rule. The state is what a trace implies about every live request (status,
N tokens known, C computed, G GPU and H host blocks, its block ids) and about the
cache (free GPU and host blocks, who owns each block id, how many requests run). A
step applies its six phases in order: arrivals and aborts; rejections; preemptions
(recompute: release G, C = 0, back to waiting; swap: G blocks move to host, H = G);
swap-ins (H blocks back to the GPU); the scheduled set (Db = blocks_needed(C, Dn, G),
G += Db, C += Dn, and a request whose C reaches N samples: N += 1); finishes (release
everything). Under config `allocation` prompt or full an admission, and a swap-in,
also reserves R tokens (kvsched.spec.blocks.allocation_reserve): Db = blocks_needed(C,
Dn, G, R), a swap-in taking its blocks beyond H at the swap-in itself. An action
applies only in a state that allows it (ALLOWED): one that does not is recorded, not
applied, so the state stays one the spec can describe. Each phase is one method of
State, called in order by State.apply; the fast checker's compiled state
(optimized/state.pyx, FastState) has one method of the same name for each, in the same
order (its PHASES; tests/test_fast_checker.py holds the two lists equal), so a change
to this rule touches two files: the phase here and its twin there.

Three config fields stretch the phases (LMDeploy's rules, engine-neutrally). Under
preemption lazy a victim goes back to waiting keeping its G blocks, their ids and its C
computed tokens (it releases nothing); a step's `reclaimed`, after its victims, takes
every block from requests that do not run and hold some (a lazy victim, a waiting
request, a held one): a waiting one then recomputes from C = 0, as a recompute victim,
and a held one ends. Under pipelined a finished request keeps its blocks (status held,
live, neither waiting nor running) until a step's `released` (phase 1, after the
aborts) or `reclaimed` names it, and it ends then; in the step right after its finish
it may be scheduled once more, a void entry: counted in the step's seats and tokens, it
takes blocks as any chunk and computes its tokens (C = min(C + Dn, N)) but samples
nothing; in that step it may also be a victim (the scheduler decided before it applied
the output that finished it: vLLM's async scheduling), which a recompute victim's blocks
leave at once, and it stays held. Under pipelined, too, a step's `unsampled` names
entries of that step whose output the engine dropped: the next step, decided before
this step's output was applied, preempted them (LMDeploy applies an output only to
requests still running). Such an entry counts in the step's seats and tokens and takes
its blocks as any chunk (Db by C + Dn, within the prealloc bounds), but C and N do not
change: it computes and samples nothing, so it is not due and does not finish (when
its request runs again it computes those tokens anew). An id in `unsampled` that is
not scheduled in the step, or any on a trace without pipelined, is recorded, not
applied (one-state). With prealloc_tokens R > 0 a chunk's Db is the count
of ids `new_blocks` gives it when that lies between blocks_needed(C, Dn, G) and
blocks_needed(C, Dn, G, reserve = C + Dn + R), else (and without ids) the lower bound.

With prefix caching (config prefix_caching) a block may have several holders. A block
becomes cached, with its table index and (when the trace gives one) its content key,
in the step whose chunk fills it; it stays cached when its last holder releases it
(it then counts as free: evictable) until it is handed out again, which drops its
content. A request admitted at C = 0 may take a hit (`prefix_hits`) of h cached
blocks at table indices 0..h-1 with h * block_size <= N - 1: then C = h * block_size,
G = h, and the E hit blocks that had no holder leave the free count (the admission
costs Db + E). Everything happens in batch order, so a request admitted later in a
step may hit blocks an earlier one is filling.

`State.apply` returns a `StepFacts`: every number an invariant needs (the demand and
the free blocks before the step, what the victims and the finishes released, each
touched request before and after, the block ids handed out and their owners before).
The checker (kvsched.spec.checker) judges the facts with the functions of must.py and
should.py; the metrics and `kvsched diff` read the same state. Nothing else replays a
step: a change to how a step moves the state is a change to this file.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvsched.spec.blocks import allocation_reserve, blocks_needed
from kvsched.spec.model import Config, Request, RequestView, Status, StepRecord

# The state of an id that is not live and never was.
NEVER_ARRIVED = "never arrived"

# Which states allow which action. Besides the statuses, a request can be in one of this
# step's transient states: "arriving", "just preempted", "swapped out this step",
# "swapped in", "already scheduled this step"; and two that say why an action does not
# apply: "held since step K" (a held request past the step right after its finish) and
# "<state> with no blocks" (nothing to reclaim).
ALLOWED: dict[str, frozenset[str]] = {
    "arrives": frozenset({NEVER_ARRIVED}),
    "aborted": frozenset({"waiting", "running", "swapped", "arriving"}),
    # A held request's blocks are freed when its session ends (config pipelined).
    "released": frozenset({"held"}),
    "rejected": frozenset({"waiting"}),
    # A held request in the step right after its finish still runs for a pipelined
    # scheduler, which decided the step before it applied the output that finished it.
    "preempted": frozenset({"running", "held"}),
    # Every block of a request that does not run and holds some: a lazy victim (of this
    # step or before: waiting), or a held one.
    "reclaimed": frozenset({"waiting", "held", "just preempted"}),
    "swapped in": frozenset({"swapped"}),
    # A held request only in the step right after its finish: a void entry.
    "scheduled": frozenset({"waiting", "running", "swapped in", "held"}),
    # An entry of this step whose output the engine dropped (config pipelined).
    "unsampled": frozenset({"scheduled in this step"}),
    # A live request always finishes (whether it had sampled is the finish invariant's
    # question); an ended one cannot.
    "finished": frozenset({"waiting", "running", "swapped"}),
    # A hit is taken at admission, by a request that computes nothing yet (C = 0).
    "prefix hit": frozenset({"waiting"}),
    # Deduplication, after the finishes: a request that runs, scheduled or not.
    "dedup": frozenset({"running", "already scheduled this step"}),
}


@dataclass(slots=True)
class LiveRequest:
    """The state of one live request, as the trace implies it."""

    request: Request
    status: Status
    num_tokens: int  # N
    num_computed: int = 0  # C
    gpu_blocks: int = 0  # G
    host_blocks: int = 0  # H
    preemptions: int = 0
    block_ids: list[int] = field(default_factory=list)
    recomputing: bool = False  # a recompute victim whose first new chunk is not yet seen
    keys: list[str] = field(default_factory=list)  # content keys of its full blocks
    finished_at: int | None = None  # held: the step it finished in

    def view(self) -> RequestView:
        return RequestView(self.status, self.num_tokens, self.num_computed, self.gpu_blocks,
                           self.host_blocks, self.preemptions)


@dataclass(frozen=True, slots=True)
class Action:
    """One id named by one field of a step, and the state it was in then."""

    request: str
    action: str  # a key of ALLOWED
    state: str

    @property
    def applied(self) -> bool:
        return self.state in ALLOWED[self.action]


@dataclass(frozen=True, slots=True)
class Victim:
    """A preemption: the victim's N, C, G and free host blocks just before it."""

    action: Action
    mode: str  # "recompute", "swap" or "lazy"
    known: int
    computed: int
    held: int
    free_host: int
    preemptions: int  # counting this one
    released: int  # GPU blocks it gave back (none when lazy)


@dataclass(frozen=True, slots=True)
class Reclaim:
    """A `released` or `reclaimed` entry: the GPU blocks it freed, and the tokens a
    waiting request had computed in them (its recompute's work; 0 for a held one)."""

    action: Action
    released: int
    computed: int = 0


@dataclass(frozen=True, slots=True)
class Chunk:
    """One scheduled entry: Dn tokens on a request with N known and C computed before,
    and C after it, min(C + Dn, N)."""

    action: Action
    tokens: int  # Dn as the trace gives it
    known: int
    computed: int
    prompt_len: int
    new_blocks: int  # Db, 0 when the entry did not apply
    sampled: bool
    restart_ids: int | None  # a recompute victim's first chunk: the ids the trace gives
    after: int  # C after the entry: min(C + Dn, N); C when it did not apply or Dn < 1
    void: bool = False  # a held request's entry right after its finish (config pipelined)
    unsampled: bool = False  # its output dropped (config pipelined): C and N stay


@dataclass(frozen=True, slots=True)
class Handout:
    """The block ids a step hands one request, and who owned each just before."""

    request: str
    state: str
    given: int
    expected: int  # Db of its chunk, plus H on a swap-in (the least, with prealloc_tokens)
    counted: bool  # False when the count was already told as the victim's `preempt`
    blocks: tuple[tuple[int, str | None], ...]
    most: int = -1  # the most it may be given (prealloc_tokens); -1: exactly `expected`

    @property
    def within(self) -> bool:
        """Whether the ids given number what the chunk may take."""
        return self.expected <= self.given <= max(self.most, self.expected)


@dataclass(frozen=True, slots=True)
class HitBlock:
    """One block of a prefix hit, at table index `index`: where the cache had it."""

    block: int
    index: int
    cached_at: int | None  # the table index it was full at, None when not cached
    cached_key: str | None  # its content key when cached, if the trace gave one
    key: str | None  # the hitting request's content key at `index`, if given
    holder: str | None  # a live request holding it just before


@dataclass(frozen=True, slots=True)
class Hit:
    """A prefix hit as the trace gives it, on a request with N known and C computed.

    `refused` says why the state could not take it (it then applies no hit): "off"
    (prefix caching is off), "unscheduled" (the request is not scheduled this step),
    "computed" (C > 0 or not waiting) or "long" (past N - 1 tokens)."""

    action: Action
    known: int
    computed: int
    blocks: tuple[HitBlock, ...]
    evictable: int  # E: hit blocks with no live holder, taken out of the free count
    refused: str | None = None
    tracked: bool = True  # block ids known on every step so far: the blocks can be checked


@dataclass(frozen=True, slots=True)
class Dedup:
    """A deduplication as the trace gives it: `blocks` are what the request's table now
    starts with, each either the block it held at that index (`kept`) or a cached one.

    `refused` says why the state could not take it: "off" (prefix caching is off),
    "uncomputed" (more blocks than the request has full and computed: C // block_size),
    or None. `released` and `evictable` are what it did to the free count."""

    action: Action
    computed: int
    blocks: tuple[HitBlock, ...]
    kept: tuple[bool, ...]
    released: int
    evictable: int
    refused: str | None = None
    tracked: bool = True


@dataclass(frozen=True, slots=True)
class Finish:
    action: Action
    sampled: bool  # it sampled a token in this step
    released: int
    outputs: int  # N - P when it finished


@dataclass(slots=True)
class StepFacts:
    """Everything one step did to the state, with the numbers every invariant needs."""

    step: int
    line: int
    arrivals: list[Action] = field(default_factory=list)
    aborts: list[Action] = field(default_factory=list)
    releases: list[Reclaim] = field(default_factory=list)  # `released`: held ones end
    rejections: list[tuple[Action, Request | None]] = field(default_factory=list)
    victims: list[Victim] = field(default_factory=list)
    reclaims: list[Reclaim] = field(default_factory=list)  # `reclaimed`, after the victims
    # each swap-in with the GPU blocks it took: its H, plus what its allocation reserves
    swap_ins: list[tuple[Action, int]] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)
    unsampled: list[Action] = field(default_factory=list)  # `unsampled`, as named
    handouts: list[Handout] | None = None  # None while block ids are not tracked
    hits: list[Hit] = field(default_factory=list)
    evicted: int = 0  # cached blocks handed out again, which drops their content
    finishes: list[Finish] = field(default_factory=list)
    dedups: list[Dedup] = field(default_factory=list)
    due: list[LiveRequest] = field(default_factory=list)  # sampled and not finished
    free_before: int = 0  # B_free: after arrivals and aborts
    reclaim: int = 0  # B_reclaim: what the victims and the reclaims released
    released_by_reclaims: int = 0  # the reclaims' part of `reclaim`
    demand: int = 0  # sum of Db, swap-ins included
    tokens: int = 0  # sum of Dn
    running: int = 0  # after the scheduled set
    free_at_batch: int = 0  # while the batch runs, before the finishes release
    free: int = 0  # after the step
    released_by_finish: int = 0
    released_by_aborts: list[tuple[str, int]] = field(default_factory=list)
    reported_free: int | None = None
    restarted: list[str] = field(default_factory=list)  # recompute victims' first chunks
    idle: bool = False  # nothing scheduled, preempted or swapped in

    @property
    def actions(self) -> list[Action]:
        """Every action of the step, in the order it applied."""
        return [*self.arrivals, *self.aborts, *(r.action for r in self.releases),
                *(a for a, _ in self.rejections), *(v.action for v in self.victims),
                *(r.action for r in self.reclaims), *(a for a, _ in self.swap_ins),
                *(c.action for c in self.chunks), *self.unsampled,
                *(f.action for f in self.finishes),
                *(d.action for d in self.dedups)]

    @property
    def valid_victims(self) -> list[Victim]:
        return [v for v in self.victims if v.action.applied]

    @property
    def released_by_victims(self) -> int:
        return sum(v.released for v in self.victims)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a State holds but its record of ended ids, as plain values (the live
    requests are copies, in arrival order): what another implementation of this
    transition rule takes over (`State.snapshot`) and hands back (`State.restore`), so
    that none reads or writes the state's fields. The ended ids only grow and may be
    many: they stay in `State.ended`, where `State.record_ended` adds to them."""

    live: tuple[LiveRequest, ...]
    free: int
    free_host: int
    holders: dict[int, tuple[str, ...]]  # block id -> its live holders, in order
    cached: dict[int, tuple[int, str | None]]  # block id -> (table index, content key)
    content: dict[int, str]  # cached block id -> its content
    ids_seen: bool
    ids_missing_from: int | None


def _copy(t: LiveRequest) -> LiveRequest:
    return LiveRequest(t.request, t.status, t.num_tokens, t.num_computed, t.gpu_blocks,
                       t.host_blocks, t.preemptions, list(t.block_ids), t.recomputing,
                       list(t.keys), t.finished_at)


class State:
    """The spec's state of one trace: feed it the steps in order with `apply`."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.live: dict[str, LiveRequest] = {}
        self.ended: dict[str, Status] = {}
        self.free = config.num_gpu_blocks
        self.free_host = config.num_cpu_blocks
        self.count = dict.fromkeys(Status, 0)  # live requests in each status
        # block id -> the live requests known to hold it (several only by prefix hits)
        self.holders: dict[int, list[str]] = {}
        # block id -> (table index, content key) of a cached block (prefix caching)
        self.cached: dict[int, tuple[int, str | None]] = {}
        # cached block -> its content: the trace's key, else (filler id, table index),
        # what a profile replay takes as the content of a trace without keys
        self.content: dict[int, str] = {}
        self.ids_seen = False  # some step carried new_blocks
        self.ids_missing_from: int | None = None  # the first step that handed out blocks
        # without ids: their owners are unknown (a request's G exceeds its known ids)

    # -- reading ----------------------------------------------------------------------

    def status_of(self, rid: str) -> str:
        t = self.live.get(rid)
        if t is not None:
            return t.status.value
        ended = self.ended.get(rid)
        return ended.value if ended is not None else NEVER_ARRIVED

    def views(self) -> dict[str, RequestView]:
        return {rid: t.view() for rid, t in self.live.items()}

    def clone(self) -> State:
        return copy.deepcopy(self)

    def snapshot(self, shared: bool = False) -> Snapshot:
        """The state as plain values (its ended ids aside): see Snapshot. `shared`: the
        live requests are the state's own, for a reader done with them before the state
        moves again (another implementation taking the state over at once)."""
        live = tuple(self.live.values()) if shared else tuple(_copy(t) for t in
                                                                 self.live.values())
        return Snapshot(live, self.free,
                        self.free_host, {b: tuple(h) for b, h in self.holders.items()},
                        dict(self.cached), dict(self.content), self.ids_seen,
                        self.ids_missing_from)

    def restore(self, s: Snapshot, owned: bool = False) -> None:
        """Become the state `s` describes; the ended ids are kept. `owned`: the
        snapshot's live requests become the state's own (a snapshot made for this one
        restore, as another implementation hands its state over)."""
        self.live = {t.request.id: t if owned else _copy(t) for t in s.live}
        self.count = dict.fromkeys(Status, 0)
        for t in self.live.values():
            self.count[t.status] += 1
        self.free, self.free_host = s.free, s.free_host
        self.holders = {b: list(h) for b, h in s.holders.items()}
        self.cached, self.content = dict(s.cached), dict(s.content)
        self.ids_seen, self.ids_missing_from = s.ids_seen, s.ids_missing_from

    def record_ended(self, ended: Mapping[str, Status]) -> None:
        """Ids that ended while another implementation moved the state."""
        self.ended.update(ended)

    # -- moving -----------------------------------------------------------------------

    @property
    def running(self) -> int:
        return self.count[Status.RUNNING]

    @property
    def working(self) -> bool:
        """Whether some live request has work left (a held one has none: it waits only
        for its blocks to be released)."""
        return len(self.live) > self.count[Status.HELD]

    def _set_status(self, t: LiveRequest, status: Status) -> None:
        self.count[t.status] -= 1
        self.count[status] += 1
        t.status = status

    def holder(self, block: int) -> str | None:
        """A live request known to hold `block`, or None when it is free."""
        held = self.holders.get(block)
        return held[0] if held else None

    def _hold(self, block: int, rid: str) -> None:
        self.holders.setdefault(block, []).append(rid)

    def _release_gpu(self, t: LiveRequest) -> int:
        """Release every GPU block `t` holds; return how many became free (a block that
        another request shares stays held; one without a known id is counted free)."""
        rid = t.request.id
        released = t.gpu_blocks - len(t.block_ids)
        for b in t.block_ids:
            held = self.holders.get(b, [])
            if rid in held:
                held.remove(rid)
            if not held:
                self.holders.pop(b, None)
                released += 1
        self.free += released
        t.gpu_blocks = 0
        t.block_ids = []
        return released

    def _end(self, t: LiveRequest, status: Status) -> int:
        released = self._release_gpu(t)
        self.free_host += t.host_blocks
        t.host_blocks = 0
        self.count[t.status] -= 1
        t.status = status
        del self.live[t.request.id]
        self.ended[t.request.id] = status
        return released

    def apply(self, rec: StepRecord) -> StepFacts:
        """Move the state by one step, phase by phase; return what it did."""
        st = _Step(self, rec)
        self._inputs(rec, st.f, st.tags)
        st.tags = {rid: s for rid, s in st.tags.items() if s != "arriving"}
        st.f.free_before = self.free
        self._rejections(st)
        self._preemptions(st)
        self._reclaims(st)
        self._swap_ins(st)
        self._schedule(st)
        self._finishes(st)
        self._dedups(st)
        st.f.free = self.free
        st.f.idle = not rec.scheduled and not rec.preempted and not rec.swapped_in
        return st.f

    def _rejections(self, st: _Step) -> None:
        """Phase 2: a rejected waiting request ends."""
        for rej in st.rec.rejected:
            a = Action(rej.id, "rejected", st.state(rej.id))
            t = self.live.get(rej.id) if a.applied else None
            st.f.rejections.append((a, t.request if t is not None else None))
            if t is not None:
                self._end(t, Status.REJECTED)

    def _preemptions(self, st: _Step) -> None:
        """Phase 3: recompute releases G and sets C = 0 (back to waiting); swap moves the
        G blocks to the host (H = G); lazy goes back to waiting keeping G, its block ids
        and C (it releases nothing until a reclaim)."""
        f = st.f
        for p in st.rec.preempted:
            a = Action(p.id, "preempted", self._held_state(st, p.id))
            t = self.live.get(p.id)
            if not a.applied or t is None:
                f.victims.append(Victim(a, p.mode, 0, 0, 0, self.free_host, 0, 0))
                continue
            t.preemptions += 1
            known, computed, held, free_host = (t.num_tokens, t.num_computed, t.gpu_blocks,
                                                self.free_host)
            if t.status == Status.HELD:
                # Finished already: it gives back its blocks (recompute) or keeps them
                # (lazy), and stays held until its release.
                released = self._release_gpu(t) if p.mode == "recompute" else 0
                st.tags[p.id] = "just preempted"
            elif p.mode == "swap":
                self.free_host -= t.gpu_blocks
                t.host_blocks = t.gpu_blocks
                released = self._release_gpu(t)
                self._set_status(t, Status.SWAPPED)
                st.tags[p.id] = "swapped out this step"
            elif p.mode == "lazy":
                released = 0
                self._set_status(t, Status.WAITING)
                st.tags[p.id] = "just preempted"
            else:
                released = self._release_gpu(t)
                t.num_computed = 0
                t.recomputing = True
                self._set_status(t, Status.WAITING)
                st.tags[p.id] = "just preempted"
            f.victims.append(Victim(a, p.mode, known, computed, held, free_host,
                                    t.preemptions, released))
            f.reclaim += released

    def _held_state(self, st: _Step, rid: str) -> str:
        """The state `rid` is in at this point of the step, a held request past the step
        right after its finish told as "held since step K": only in that step may a
        pipelined scheduler still schedule it, or preempt it."""
        state = st.state(rid)
        held = self.live.get(rid)
        if state == "held" and held is not None and held.finished_at != st.rec.step - 1:
            return f"held since step {held.finished_at}"
        return state

    def _reclaims(self, st: _Step) -> None:
        """Phase 3, after the victims: each reclaimed request, in the order the engine
        took them, releases all its GPU blocks; a waiting one (a lazy victim) recomputes
        from C = 0, as a recompute victim does, and a held one ends (finished)."""
        f = st.f
        for rid in st.rec.reclaimed:
            t = self.live.get(rid)
            state = st.state(rid)
            if t is not None and t.gpu_blocks == 0 and state in ALLOWED["reclaimed"]:
                state = f"{state} with no blocks"
            a = Action(rid, "reclaimed", state)
            if not a.applied or t is None:
                f.reclaims.append(Reclaim(a, 0))
                continue
            computed = 0
            if t.status == Status.HELD:
                released = self._end(t, Status.FINISHED)
            else:
                released = self._release_gpu(t)
                computed, t.num_computed = t.num_computed, 0
                t.recomputing = True
            f.reclaims.append(Reclaim(a, released, computed))
            f.reclaim += released
            f.released_by_reclaims += released

    def _swap_ins(self, st: _Step) -> None:
        """Phase 4: the host blocks come back to the GPU, with the blocks the allocation
        reserves beyond them (all N known tokens under prompt, the longest sequence under
        full)."""
        f, handouts = st.f, st.handouts
        for rid in st.rec.swapped_in:
            a = Action(rid, "swapped in", st.state(rid))
            t = self.live.get(rid) if a.applied else None
            f.swap_ins.append((a, t.host_blocks if t is not None else 0))
            if t is None:
                continue
            reserve = allocation_reserve(self.config, t.request, t.num_tokens)
            taken = t.host_blocks + blocks_needed(t.num_computed, 0, t.host_blocks,
                                                  self.config.block_size, reserve)
            f.swap_ins[-1] = (a, taken)
            t.gpu_blocks = taken
            self.free -= taken
            self.free_host += t.host_blocks
            f.demand += taken
            handouts.expect(rid, taken)
            t.host_blocks = 0
            self._set_status(t, Status.RUNNING)
            st.tags[rid] = "swapped in"
            if rid not in st.scheduled:
                self._hand_out(handouts, rid)
                self._cache_full(t, 0)  # its restored blocks hold their content again

    def _schedule(self, st: _Step) -> None:
        """Phase 5: the scheduled set, in batch order: each entry's hit, its new blocks
        (Db = blocks_needed(C, Dn, G, R)), then the blocks it fills are cached (so a
        later entry may hit them); a request whose C reaches N samples (N += 1). An entry
        whose output was dropped (`unsampled`) takes its blocks, but C and N stay."""
        rec, f, handouts = st.rec, st.f, st.handouts
        bs = self.config.block_size
        hits = rec.prefix_hits
        prealloc = self.config.prealloc_tokens
        voids = 0
        f.unsampled = self._unsampled(st)
        dropped = {a.request for a in f.unsampled if a.applied}
        for rid, n in rec.scheduled:
            a = Action(rid, "scheduled", self._held_state(st, rid))
            t = self.live.get(rid) if a.applied else None
            if t is None:
                st.tags[rid] = "already scheduled this step"
                f.chunks.append(Chunk(a, n, 0, 0, 0, 0, False, None, 0))
                continue
            if rid in hits and n >= 1:
                f.hits.append(self._hit(t, hits[rid], st.state(rid), f))
            st.tags[rid] = "already scheduled this step"
            f.tokens += max(n, 0)
            known, computed = t.num_tokens, t.num_computed
            if n < 1:
                f.chunks.append(Chunk(a, n, known, computed, t.request.prompt_len, 0, False,
                                      None, computed))
                continue
            # An admission (new, or resumed after recompute) reserves what its allocation
            # says; every other chunk takes only the blocks it fills. A void entry (held)
            # stays held.
            reserve = 0
            void = t.status == Status.HELD
            voids += void
            if t.status == Status.WAITING:
                self._set_status(t, Status.RUNNING)
                reserve = allocation_reserve(self.config, t.request, known)
            db = blocks_needed(computed, n, t.gpu_blocks, bs, reserve)
            most = -1
            if prealloc > 0:
                # Up to R tokens beyond the chunk's own: the trace's ids say how many,
                # within the bounds; else (or without ids) the least.
                most = blocks_needed(computed, n, t.gpu_blocks, bs,
                                     max(reserve, computed + n + prealloc))
                if rec.new_blocks is not None:
                    given = len(rec.new_blocks.get(rid, ()))
                    if db <= given <= most:
                        db = given
            f.demand += db
            self.free -= db
            t.gpu_blocks += db
            handouts.expect(rid, db, most)
            restart: int | None = None
            if t.recomputing:
                t.recomputing = False
                f.restarted.append(rid)
                if rec.new_blocks is not None:
                    restart = len(rec.new_blocks.get(rid, ()))
                    if prealloc > 0 and restart > db:
                        restart = None  # beyond the bound: block-ids says it, with both
                    elif restart != db:
                        handouts.told.add(rid)
            drop = rid in dropped
            t.num_computed = computed if drop else min(computed + n, known)
            self._hand_out(handouts, rid)
            # A swap-in's table is all new: its restored blocks are cached again too.
            self._cache_full(t, 0 if a.state == "swapped in" else computed)
            done = t.num_computed == known and not void and not drop
            if done:
                t.num_tokens += 1
                st.sampled.append(t)
            f.chunks.append(Chunk(a, n, known, computed, t.request.prompt_len, db, done,
                                  restart, t.num_computed, void, drop))
        for rid in hits:
            if rid not in st.scheduled:
                f.hits.append(Hit(Action(rid, "prefix hit", st.state(rid)), 0, 0, (), 0,
                                  "unscheduled"))
        for rid in [*handouts.expected, *(rec.new_blocks or ())]:
            self._hand_out(handouts, rid)
        f.running = self.running + voids
        f.handouts = handouts.done if rec.new_blocks is not None else None
        f.evicted = handouts.evicted
        if rec.new_blocks is None:
            if self.ids_missing_from is None and any(handouts.expected.values()):
                self.ids_missing_from = rec.step
        else:
            self.ids_seen = True
        f.free_at_batch = self.free

    def _unsampled(self, st: _Step) -> list[Action]:
        """The step's `unsampled` ids, each in its state: scheduled in this step (the
        entry's output is dropped) or not; on a trace without config pipelined none
        applies."""
        out, seen = [], set()
        for rid in st.rec.unsampled:
            if not self.config.pipelined:
                state = ("on a trace without config pipelined (only an engine that decides "
                         "a step before it applies the last one's output drops an output)")
            elif rid in seen:
                state = "already named in unsampled"
            elif rid in st.scheduled:
                state = "scheduled in this step"
            else:
                state = "not scheduled in this step"
            seen.add(rid)
            out.append(Action(rid, "unsampled", state))
        return out

    def _finishes(self, st: _Step) -> None:
        """Phase 6: a finished request releases everything; under config pipelined it
        keeps its GPU blocks instead, held until a `released` or `reclaimed` names it. A
        live request finishes whatever it did this step (the finish invariant asks
        whether it sampled); an ended or held one is told in the state it is in."""
        f = st.f
        sampled_ids = {t.request.id for t in st.sampled}
        finished = set(st.rec.finished)
        for rid in st.rec.finished:
            a = Action(rid, "finished", self.status_of(rid) if rid in self.live
                       else st.state(rid))
            t = self.live.get(rid) if a.applied else None
            outputs = t.num_tokens - t.request.prompt_len if t is not None else 0
            released = 0
            if t is not None and self.config.pipelined:
                self.free_host += t.host_blocks
                t.host_blocks = 0
                self._set_status(t, Status.HELD)
                t.finished_at = st.rec.step
            elif t is not None:
                released = self._end(t, Status.FINISHED)
            f.finishes.append(Finish(a, rid in sampled_ids, released, outputs))
            f.released_by_finish += released
        f.due = [t for t in st.sampled if t.request.id not in finished]

    def _dedups(self, st: _Step) -> None:
        """Phase 7 (prefix caching): a running request's table now starts with the given
        blocks, each its own block at that index or a cached one (full at that index,
        of the same content when keys are given) that replaces its own: the replaced
        blocks are released, and the cached ones no one held (E) leave the free count (a
        replaced block that a later allocation of the step took was released there:
        _copy_gone)."""
        bs = self.config.block_size
        for rid, blocks in st.rec.dedup.items():
            a = Action(rid, "dedup", st.state(rid))
            t = self.live.get(rid) if a.applied else None
            computed = t.num_computed if t is not None else 0
            refused = None
            if not self.config.prefix_caching:
                refused = "off"
            elif t is not None and (len(blocks) > computed // bs
                                    or len(t.block_ids) != t.gpu_blocks):
                refused = "uncomputed"
            facts, kept = [], []
            for j, b in enumerate(blocks):
                own = t is not None and j < len(t.block_ids) and t.block_ids[j] == b
                at, key = self.cached.get(b, (None, None))
                facts.append(HitBlock(b, j, j if own else at, key,
                                      t.keys[j] if t is not None and j < len(t.keys) else None,
                                      self.holder(b)))
                kept.append(own)
            released = evictable = 0
            if t is not None and refused is None:
                for j, b in enumerate(blocks):
                    if kept[j]:
                        continue
                    old = t.block_ids[j]
                    held = self.holders.get(old, [])
                    if rid in held:
                        held.remove(rid)
                    if not held:
                        self.holders.pop(old, None)
                        released += 1
                    if self.holder(b) is None:
                        evictable += 1
                    self._hold(b, rid)
                    t.block_ids[j] = b
                self.free += released - evictable
            st.f.dedups.append(Dedup(a, computed, tuple(facts), tuple(kept), released,
                                     evictable, refused, self.ids_missing_from is None))

    def _inputs(self, rec: StepRecord, f: StepFacts, tags: dict[str, str]) -> None:
        """Phase 1: arrivals become waiting, then aborts end their requests, then the
        released held requests end, freeing their blocks."""

        def state(rid: str) -> str:
            return tags.get(rid) or self.status_of(rid)

        # 1. arrivals, then aborts
        for r in rec.arrivals:
            a = Action(r.id, "arrives", state(r.id))
            f.arrivals.append(a)
            if a.applied:
                self.live[r.id] = LiveRequest(r, Status.WAITING, r.prompt_len)
                self.count[Status.WAITING] += 1
                tags[r.id] = "arriving"
        for rid in rec.aborted:
            a = Action(rid, "aborted", state(rid))
            f.aborts.append(a)
            if a.applied:
                tags.pop(rid, None)  # aborted now: a second abort finds it ended
                f.released_by_aborts.append((rid, self._end(self.live[rid], Status.ABORTED)))
        for rid in rec.released:
            a = Action(rid, "released", state(rid))
            t = self.live.get(rid) if a.applied else None
            f.releases.append(Reclaim(a, self._end(t, Status.FINISHED) if t is not None
                                      else 0))
        for rid, keys in rec.block_keys.items():
            t = self.live.get(rid)
            if t is not None:
                t.keys.extend(keys)

    def after_inputs(self, rec: StepRecord) -> State:
        """A copy of the state once `rec`'s arrivals and aborts are in: the state its
        scheduler decided on."""
        state = self.clone()
        state._inputs(rec, StepFacts(rec.step, rec.line), {})
        return state

    def _hit(self, t: LiveRequest, blocks: tuple[int, ...], state: str,
             f: StepFacts) -> Hit:
        """Take the prefix hit of `blocks` on `t` (at its scheduled entry, before its
        chunk): C = h * block_size, G = h, and the hit blocks no one holds (E) leave the
        free count. A hit in a state that cannot take one is recorded, not taken."""
        rid, bs = t.request.id, self.config.block_size
        a = Action(rid, "prefix hit", state)
        known, computed = t.num_tokens, t.num_computed
        refused = None
        if not self.config.prefix_caching:
            refused = "off"
        elif not a.applied or computed > 0 or t.gpu_blocks > 0:
            refused = "computed"
        elif len(blocks) * bs > known - 1:
            refused = "long"
        facts = []
        for j, b in enumerate(blocks):
            at, key = self.cached.get(b, (None, None))
            facts.append(HitBlock(b, j, at, key, t.keys[j] if j < len(t.keys) else None,
                                  self.holder(b)))
        evictable = 0
        if refused is None:
            evictable = len({b for b in blocks if self.holder(b) is None})
            for b in blocks:
                self._hold(b, rid)
            t.block_ids = list(blocks)
            t.gpu_blocks = len(blocks)
            t.num_computed = len(blocks) * bs
            self.free -= evictable
            f.demand += evictable
        return Hit(a, known, computed, tuple(facts), evictable, refused,
                   self.ids_missing_from is None)

    def _cache_full(self, t: LiveRequest, computed: int) -> None:
        """Cache the blocks of `t` its chunk filled (from C = `computed`), with their
        table index and content key; only where its table's ids are all known."""
        if not self.config.prefix_caching or len(t.block_ids) != t.gpu_blocks:
            return
        bs = self.config.block_size
        for j in range(computed // bs, t.num_computed // bs):
            key = t.keys[j] if j < len(t.keys) else None
            self.cached[t.block_ids[j]] = (j, key)
            self.content[t.block_ids[j]] = key if key is not None else f"{t.request.id}/{j}"

    def _hand_out(self, h: _Handouts, rid: str) -> None:
        """Record `rid`'s block ids of this step once, and who held each just before;
        a block handed out drops its cached content. Without new_blocks, a step in which
        no request needed a block is the same as {}; one that handed blocks out without
        ids leaves their owners unknown, so a later step's ids are checked against the
        owners that are known."""
        rec = h.rec
        if rid in h.seen or rec.new_blocks is None:
            return
        h.seen.add(rid)
        first = self.config.first_block_id
        last = first + self.config.num_gpu_blocks
        given = rec.new_blocks.get(rid, ())
        t = self.live.get(rid)
        blocks = []
        for b in given:
            before = self.holder(b)
            if before is not None and before != rid and self._copy_gone(rec, before, b):
                before = None
            blocks.append((b, before))
            if t is not None and before is None and first <= b < last:
                self._hold(b, rid)
                self.content.pop(b, None)
                if self.cached.pop(b, None) is not None:
                    h.evicted += 1
                t.block_ids.append(b)
        h.done.append(Handout(rid, self.status_of(rid), len(given), h.expected.get(rid, 0),
                              rid not in h.told, tuple(blocks), h.most.get(rid, -1)))


    def _copy_gone(self, rec: StepRecord, rid: str, block: int) -> bool:
        """Whether `block` is a copy that this step's `dedup` of `rid` replaces: an
        engine that deduplicates as it allocates (LMDeploy's block trie) frees the copy
        at once, so a later allocation of the step may take it. It is released here,
        and phase 7 finds it no longer `rid`'s."""
        t = self.live.get(rid)
        table = rec.dedup.get(rid, ())
        if t is None or not any(j < len(t.block_ids) and t.block_ids[j] == block != b
                                for j, b in enumerate(table)):
            return False
        held = self.holders[block]
        held.remove(rid)
        if not held:
            del self.holders[block]
            self.free += 1
        return self.holder(block) is None


@dataclass
class _Handouts:
    """One step's block handouts as they are recorded, in batch order."""

    rec: StepRecord
    expected: dict[str, int] = field(default_factory=dict)  # Db, plus H on a swap-in
    most: dict[str, int] = field(default_factory=dict)  # the most, with prealloc_tokens
    told: set[str] = field(default_factory=set)  # counts told as the victim's preempt
    seen: set[str] = field(default_factory=set)
    done: list[Handout] = field(default_factory=list)
    evicted: int = 0  # cached blocks among the handed out

    def expect(self, rid: str, blocks: int, most: int = -1) -> None:
        """`rid` takes `blocks` more (at most `most` with prealloc_tokens; -1: exactly)."""
        self.expected[rid] = self.expected.get(rid, 0) + blocks
        if most >= 0:
            self.most[rid] = self.most.get(rid, self.expected[rid] - blocks) + most


class _Step:
    """One step while `State.apply` moves the state: the record, the facts so far, this
    step's transient states (`tags`), the block handouts, who sampled."""

    def __init__(self, state: State, rec: StepRecord) -> None:
        self.owner = state
        self.rec = rec
        self.f = StepFacts(rec.step, rec.line, reported_free=rec.free_blocks)
        self.tags: dict[str, str] = {}
        self.handouts = _Handouts(rec)
        self.scheduled = {rid for rid, _ in rec.scheduled}
        self.sampled: list[LiveRequest] = []

    def state(self, rid: str) -> str:
        """The state `rid` is in at this point of the step."""
        return self.tags.get(rid) or self.owner.status_of(rid)
