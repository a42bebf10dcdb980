"""Bounded model checker: every reachable state of the reference scheduler in small scopes.

NOTE on the method. A scope fixes a config, the knobs and up to a few request shapes
(prompt_len, max_tokens, priority). From the empty scheduler, each step branches on
every input the environment may give: any subset of the requests not yet arrived
arrives, at most one live request is aborted (SGLang's step ends a running one only at
its next sample: kvsched.spec.interface.abort), the scheduler decides (deterministic),
and any subset of the requests that sampled a token stops at end-of-sequence (those
that reached max_tokens or max_model_len stop anyway). Breadth-first search over
canonical states (state_key.py) visits each reachable state once.

On every transition the step is fed, as a trace line, to the spec's checker (the
oracle), holding the spec's view of that state: any MUST invariant it flags is a
counterexample, printed as a trace v1 that `kvsched check` reads. After the search,
liveness: no cycle through states with a live request (a deadlock is a step that
changes nothing, a livelock a longer loop; neither can end a request), and from every
state all requests can still end without aborts or early end-of-sequence (arrivals
allowed). With a `twin`, the reference with the same knobs runs in lockstep and any
difference in the decisions is a PROFILE finding. With `should`, the SHOULD invariants
judged on one step alone (PER_STEP_SHOULD) that the checker flags are findings too.

The scheduler under test is the reference, or any scheduler of the interface
(kvsched.spec.interface.Scheduler, docs/scheduler-interface.md) that a factory builds:
factory(config) as `kvsched fuzz` takes it, or factory(config, knobs) as the reference's
classes and the seeded bugs take the scope's knobs. Its state is its attributes
(state_key.py): a scheduler that counts steps, or keeps arrival steps as numbers, has
more states than the scope's bound allows. A factory that raises on a scope's config
refuses that scope (a scheduler that allocates lazily refuses `allocation: full`, as
docs/scheduler-interface.md asks): the scope is reported refused, not explored, and a
run in which every scope is refused is an error. The scopes of another engine's step
(SGLang's) explore the reference's own scheduler for that step, whatever the factory.

Standard library, kvsched.spec and kvsched.reference only: `python -m proofs.model_check`.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import inspect
import json
import pickle
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Generator, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from itertools import combinations
from multiprocessing import Pool
from pathlib import Path
from typing import Any

from kvsched.reference import SGLangScheduler, scheduler_for
from kvsched.reference.scheduler import ReferenceScheduler
from kvsched.spec.checker import Checker, Report
from kvsched.spec.interface import Deduplicating, Scheduler
from kvsched.spec.interface import abort as kvsched_abort
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Config, Decision, Request, StepRecord
from kvsched.spec.prefix import block_key
from kvsched.spec.trace import HeldLine, header_dict, step_dict
from kvsched.spec.violation import INVARIANTS, MUST
from proofs.scopes import SCOPE_SETS, Scope
from proofs.state_key import checker_key, line_key, scheduler_key

# factory(config, knobs), as ReferenceScheduler, or factory(config) (build).
Factory = Callable[..., Scheduler]

# SHOULD invariants the checker judges from one step and the state before it, all of
# which the state key holds, so a finding is sound under state merging. no-thrash counts
# preemptions, which the key leaves out; no-idle and completion are liveness, which the
# search judges on the whole graph (deadlock, livelock, stuck).
PER_STEP_SHOULD: tuple[str, ...] = ("needed-preemption",)


@dataclass(frozen=True)
class Inputs:
    """What the environment does in one step."""

    arrivals: tuple[str, ...] = ()
    abort: str | None = None
    eos: tuple[str, ...] = ()

    def __str__(self) -> str:
        parts = [f"arrive {','.join(self.arrivals)}"] if self.arrivals else []
        parts += [f"abort {self.abort}"] if self.abort else []
        parts += [f"eos {','.join(self.eos)}"] if self.eos else []
        return "; ".join(parts) or "nothing"


@dataclass(frozen=True)
class Finding:
    """A counterexample. kind: must, should, profile, error, deadlock, livelock or stuck."""

    kind: str
    ids: tuple[str, ...]
    message: str
    path: tuple[Inputs, ...]
    cycle: tuple[Inputs, ...] = ()
    trace: tuple[str, ...] = ()

    def summary(self) -> str:
        return f"{self.kind} [{', '.join(self.ids)}] after {len(self.path)} steps: {self.message}"


@dataclass(frozen=True)
class Result:
    scope: str
    states: int
    transitions: int
    seconds: float
    finding: Finding | None = None
    refused: str | None = None  # why the factory built no scheduler for the scope's config
    # the transitions in which each event of EVENTS happened, for those that did
    reached: tuple[tuple[str, int], ...] = ()


@dataclass
class World:
    """One state: the scheduler under test, the spec's checker replaying its trace, the
    twin (the reference in lockstep, or None), and the requests not yet arrived."""

    scheduler: Scheduler
    checker: Checker
    twin: ReferenceScheduler | SGLangScheduler | None
    unarrived: tuple[str, ...]
    should: tuple[str, ...] = ()  # SHOULD ids that are findings too (PER_STEP_SHOULD)
    events: frozenset[str] = frozenset()  # what the step into this state did (EVENTS)
    # config pipelined: the last step's line, checked once this step is decided (what
    # the decision drops of that step's output, Decision.unsampled, is on that line)
    held: HeldLine = field(default_factory=HeldLine)

    def key(self) -> Hashable:
        twin = scheduler_key(self.twin) if self.twin is not None else None
        return (self.unarrived, scheduler_key(self.scheduler), checker_key(self.checker), twin,
                line_key(self.held.line))

    def clone(self) -> World:
        """A deep copy (pickle is twice as fast as deepcopy; a scheduler class defined in a
        function does not pickle, so it is deep-copied)."""
        try:
            world: World = pickle.loads(pickle.dumps(self, pickle.HIGHEST_PROTOCOL))
        except (pickle.PicklingError, AttributeError, TypeError):
            world = copy.deepcopy(self)
        return world

    def live(self) -> tuple[str, ...]:
        return tuple(self.scheduler.states())


class Counterexample(Exception):
    def __init__(self, kind: str, ids: tuple[str, ...], message: str,
                 inputs: Inputs | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.ids = ids
        self.message = message
        self.inputs = inputs or Inputs()


def subsets(items: Sequence[str]) -> Iterator[tuple[str, ...]]:
    for k in range(len(items) + 1):
        yield from combinations(items, k)


@dataclass
class Step:
    """One step in progress: inputs given and decision taken, end-of-sequence pending."""

    world: World
    requests: tuple[Request, ...]
    abort: str | None  # the request the client aborted before the step
    decision: Decision
    ended: str | None = None  # that request, when the abort ended it at once
    settled: StepRecord | None = None  # config pipelined: the last step's line, settled


def begin_step(world: World, scope: Scope, step: int, arrivals: tuple[str, ...],
               abort: str | None) -> Step:
    """Phases 1 to 5 of one step on `world` (mutated)."""
    world.events = frozenset()
    shapes = dict(zip(scope.ids, scope.shapes, strict=True))
    requests = tuple(Request(rid, shapes[rid].prompt_len, shapes[rid].max_tokens,
                             shapes[rid].priority, step, shapes[rid].prefix)
                     for rid in arrivals)
    targets = [world.scheduler] + ([world.twin] if world.twin is not None else [])
    ended = None
    for s in targets:
        for r in requests:
            s.add_request(r)
        if abort is not None and kvsched_abort(s, abort) and s is world.scheduler:
            ended = abort  # else a running request marked to finish (SGLang's)
    world.unarrived = tuple(rid for rid in world.unarrived if rid not in arrivals)
    decision = world.scheduler.schedule()
    if world.twin is not None:
        expected = world.twin.schedule()
        if expected.comparable() != decision.comparable():
            raise Counterexample("profile", ("profile",),
                                 f"decided {decision.comparable()} where the reference "
                                 f"decides {expected.comparable()}")
    settled = (world.held.settle(unsampled=decision.unsampled) if scope.config.pipelined
               else None)
    return Step(world, requests, abort, decision, ended, settled)


def optional_stops(step: Step, scope: Scope) -> tuple[str, ...]:
    """Sampled requests free to stop early: the spec finishes the others anyway."""
    views = step.world.scheduler.states()
    shapes = dict(zip(scope.ids, scope.shapes, strict=True))
    out = []
    for rid in step.decision.sampled:
        view = views.get(rid)
        if view is None or rid not in shapes:
            continue
        known = view.num_tokens + 1
        if (known - shapes[rid].prompt_len < shapes[rid].max_tokens
                and known < scope.config.max_model_len):
            out.append(rid)
    return tuple(out)


def end_step(step: Step, scope: Scope, number: int, eos: tuple[str, ...]) -> None:
    """Phase 6 on step.world (mutated), then the spec's checker on the whole step."""
    world = step.world
    finished = world.scheduler.update(set(eos))
    if world.twin is not None:
        expected = world.twin.update(set(eos))
        if expected != finished:
            raise Counterexample("profile", ("profile",),
                                 f"finished {finished} where the reference finishes "
                                 f"{expected}")
    rec = record(world, scope, step, number, finished)
    if scope.config.pipelined:
        world.held.hold(rec)
    else:
        check_line(world, rec)


def check_line(world: World, rec: StepRecord) -> None:
    """The spec's checker on one whole step's line; the step's EVENTS kept on `world`."""
    before = {rid: (t.status.value, t.num_computed, t.recomputing)
              for rid, t in world.checker.state.live.items()}
    world.checker.report = Report()
    world.checker.step(rec)
    world.events = events(rec, before)

    def counts(k: str) -> bool:
        return INVARIANTS[k] == MUST or k in world.should

    broken = tuple(sorted(k for k in world.checker.report.counts if counts(k)))
    if broken:
        told = "; ".join(f"{v.invariant}: {v.message}" for v in world.checker.report.violations
                         if counts(v.invariant))
        kind = "must" if any(INVARIANTS[k] == MUST for k in broken) else "should"
        raise Counterexample(kind, broken, told)


# What a step can do that a scope family must be seen to reach (Result.reached):
# engine-neutral names, read off the step's record and the spec's state before it.
EVENTS: dict[str, str] = {
    "preempted recompute": "a victim released its blocks",
    "preempted lazy": "a victim kept its blocks (preemption lazy)",
    "lazy victim beside a decode": "a lazy victim in a step that ran others: the decode "
                                   "went on without it (LMDeploy's self-preemption)",
    "lazy victim alone": "a lazy victim in a step that ran nothing else",
    "held victim": "a held request preempted in the step right after its finish",
    "resumed with its blocks": "a waiting request that kept its computed tokens scheduled "
                               "again, recomputing nothing",
    "reclaimed waiting": "a waiting request (a lazy victim) lost its blocks to another's "
                         "admission or growth",
    "reclaimed own victim": "a lazy victim of this very step lost its blocks",
    "reclaimed held": "a held request lost its blocks before its release",
    "recomputed after losing its blocks": "a request whose blocks a reclaim (or its own "
                                          "recompute preemption) took, scheduled from scratch",
    "void entry": "a held request scheduled in the step right after its finish",
    "released": "a held request's blocks freed at its release",
    "prefix hit": "an admission took cached blocks",
}


def events(rec: StepRecord, before: dict[str, tuple[str, int, bool]]) -> frozenset[str]:
    """The EVENTS `rec` holds; `before`: each live request's status, computed tokens and
    whether it recomputes after losing its blocks, in the spec's state before the step."""
    out: set[str] = set()
    scheduled = {rid for rid, _ in rec.scheduled}
    victims = {p.id for p in rec.preempted}
    for p in rec.preempted:
        out.add(f"preempted {p.mode}")
        if before.get(p.id, ("",))[0] == "held":
            out.add("held victim")
        if p.mode == "lazy":
            out.add("lazy victim beside a decode" if scheduled - {p.id}
                    else "lazy victim alone")
    for rid in rec.reclaimed:
        status = before.get(rid, ("",))[0]
        out.add("reclaimed own victim" if rid in victims and status != "held"
                else f"reclaimed {status}")
    for rid in scheduled:
        status, computed, recomputing = before.get(rid, ("", 0, False))
        if status == "waiting" and computed > 0:
            out.add("resumed with its blocks")
        if status == "waiting" and recomputing:
            out.add("recomputed after losing its blocks")
        if status == "held":
            out.add("void entry")
    if rec.released:
        out.add("released")
    if rec.prefix_hits:
        out.add("prefix hit")
    return frozenset(e for e in out if e in EVENTS)


def record(world: World, scope: Scope, step: Step, number: int,
           finished: tuple[str, ...]) -> StepRecord:
    """The step as a trace line: the decision, its prefix hits and, with prefix caching,
    the content keys of the blocks that became full of known tokens (the prompt's at
    arrival, each later one once sampled), as kvsched.simulate writes them."""
    d = step.decision
    keys: dict[str, tuple[str, ...]] = {}
    if scope.config.prefix_caching:
        bs = scope.config.block_size
        told = world.checker.state.live
        arrived = {r.id: r for r in step.requests}
        ended = {r.id for r in d.rejected} | ({step.ended} if step.ended else set())
        shapes = dict(zip(scope.ids, scope.shapes, strict=True))
        for rid in dict.fromkeys([*arrived, *d.sampled]):
            if rid in ended:
                continue
            t = told.get(rid)
            known = t.num_tokens if t is not None else shapes[rid].prompt_len
            known += rid in d.sampled
            done = len(t.keys) if t is not None else 0
            prefix = shapes[rid].prefix
            got = tuple(block_key(rid, prefix, i, bs) for i in range(done, known // bs))
            if got:
                keys[rid] = got
    dedup = (world.scheduler.dedups() if isinstance(world.scheduler, Deduplicating)
             else {})
    # every part of the decision a trace line holds (new_blocks, prefix_hits, released,
    # reclaimed, ...), by name, so that one a step kind adds reaches the checker too
    carried: dict[str, Any] = {name: getattr(d, name) for name in DECISION_IN_RECORD}
    return StepRecord(number, step.requests, (step.ended,) if step.ended else (),
                      finished=finished, free_blocks=world.scheduler.free_blocks(),
                      block_keys=keys, dedup=dedup, **carried)


def new_world(scope: Scope, factory: Factory, twin: bool, should: tuple[str, ...] = ()
              ) -> World:
    unknown = set(should) - set(PER_STEP_SHOULD)
    if unknown:
        raise ValueError(f"only {', '.join(PER_STEP_SHOULD)} can be a finding, not "
                         f"{', '.join(sorted(unknown))}")
    if scope.scheduler != "v1":  # another engine's step: the reference's own
        return World(scheduler_for(scope.config, scope.knobs, scope.scheduler),
                     Checker(scope.config), None, scope.ids, should)
    return World(build(factory, scope.config, scope.knobs), Checker(scope.config),
                 ReferenceScheduler(scope.config, scope.knobs) if twin else None, scope.ids,
                 should)


@dataclass
class Graph:
    """The explored states: parent links for paths, and the edges liveness needs."""

    keys: dict[Hashable, int] = field(default_factory=dict)
    parent: list[tuple[int, Inputs | None]] = field(default_factory=list)
    live: list[bool] = field(default_factory=list)  # a request is live in the state
    ended: list[bool] = field(default_factory=list)  # every request has arrived and ended
    quiet: list[list[int]] = field(default_factory=list)  # nothing arrived or ended
    natural_in: list[list[int]] = field(default_factory=list)  # reverse, no abort or eos

    def add(self, key: Hashable, parent: int, inputs: Inputs | None, world: World) -> int:
        sid = len(self.parent)
        self.keys[key] = sid
        self.parent.append((parent, inputs))
        live = bool(world.live())
        self.live.append(live)
        self.ended.append(not live and not world.unarrived)
        self.quiet.append([])
        self.natural_in.append([])
        return sid

    def path(self, sid: int) -> tuple[Inputs, ...]:
        out = []
        while sid > 0:
            sid, inputs = self.parent[sid]
            assert inputs is not None
            out.append(inputs)
        return tuple(reversed(out))


def successors(world: World, scope: Scope, number: int) -> Iterator[tuple[Inputs, World]]:
    """Every transition out of `world`; a broken invariant raises, naming its inputs."""
    for arrivals in subsets(world.unarrived):
        live = world.live() + arrivals if scope.aborts else ()
        for abort in (None, *live):
            with blame(Inputs(arrivals, abort)):
                step = begin_step(world.clone(), scope, number, arrivals, abort)
                if step.settled is not None:
                    check_line(step.world, step.settled)
                choices = list(subsets(optional_stops(step, scope)))
            for i, eos in enumerate(choices):
                inputs = Inputs(arrivals, abort, eos)
                with blame(inputs):
                    last = i == len(choices) - 1
                    branch = step if last else Step(step.world.clone(), step.requests, abort,
                                                     step.decision, step.ended)
                    end_step(branch, scope, number, eos)
                yield inputs, branch.world


@contextmanager
def blame(inputs: Inputs) -> Iterator[None]:
    """Tag a counterexample (or a crash inside the scheduler) with the step's inputs."""
    try:
        yield
    except Counterexample as c:
        c.inputs = inputs
        raise
    except Exception as e:
        raise Counterexample("error", ("error",), f"{type(e).__name__}: {e}", inputs) from e


def explore(scope: Scope, factory: Factory = ReferenceScheduler, twin: bool = False,
            max_states: int = 2_000_000, should: tuple[str, ...] = ()) -> Result:
    """Breadth-first search of every reachable state of `scope`; the first finding wins."""
    start = time.process_time()
    graph = Graph()
    try:
        root = new_world(scope, factory, twin, should)
    except Refused as e:
        return Result(scope.name, 0, 0, 0.0, refused=str(e))
    graph.add(root.key(), -1, None, root)
    frontier: list[tuple[int, World]] = [(0, root)]
    transitions = 0
    number = 0
    reached: Counter[str] = Counter()

    def result(finding: Finding | None = None) -> Result:
        return Result(scope.name, len(graph.parent), transitions,
                      round(time.process_time() - start, 2), finding,
                      reached=tuple(sorted(reached.items())))

    while frontier:
        following: list[tuple[int, World]] = []
        for sid, world in frontier:
            try:
                edges = list(successors(world, scope, number))
            except Counterexample as c:
                return result(found(scope, factory, twin, c.kind, c.ids, c.message,
                                    (*graph.path(sid), c.inputs)))
            for inputs, succ in edges:
                transitions += 1
                reached.update(succ.events)
                key = succ.key()
                dst = graph.keys.get(key)
                if dst is None:
                    if len(graph.parent) >= max_states:
                        raise RuntimeError(f"scope {scope.name} passed {max_states} states")
                    dst = graph.add(key, sid, inputs, succ)
                    following.append((dst, succ))
                if inputs.abort is None and not inputs.eos:
                    graph.natural_in[dst].append(sid)
                    if not inputs.arrivals and graph.live[sid] and graph.live[dst] and \
                            succ.live() == world.live():
                        graph.quiet[sid].append(dst)
        frontier = following
        number += 1
    liveness = check_liveness(graph)
    if liveness is not None:
        kind, message, sid, cycle = liveness
        return result(found(scope, factory, twin, kind, (kind,), message, graph.path(sid),
                            cycle))
    return result()


def check_liveness(graph: Graph) -> tuple[str, str, int, tuple[Inputs, ...]] | None:
    """Deadlock or livelock (a cycle of quiet steps with a live request), else a state
    from which no abort-free, eos-free path ends every request (stuck)."""
    cycle = find_cycle(graph)
    if cycle:
        entry = cycle[0]
        inputs = tuple(Inputs() for _ in cycle)
        if len(cycle) == 1:
            return ("deadlock", "a step with a live request changes nothing, forever",
                    entry, inputs)
        return ("livelock", f"{len(cycle)} steps bring the state back without ending a "
                "request", entry, inputs)
    reached = [False] * len(graph.parent)
    todo = deque(i for i, e in enumerate(graph.ended) if e)
    for i in todo:
        reached[i] = True
    while todo:
        sid = todo.popleft()
        for src in graph.natural_in[sid]:
            if not reached[src]:
                reached[src] = True
                todo.append(src)
    for sid, ok in enumerate(reached):
        if not ok:
            return ("stuck", "from this state no path without aborts or early "
                    "end-of-sequence ends every request", sid, ())
    return None


def find_cycle(graph: Graph) -> list[int]:
    """A cycle of quiet edges (iterative depth-first search), as its states in order."""
    color = [0] * len(graph.parent)  # 0 new, 1 on the stack, 2 done
    for root in range(len(graph.parent)):
        if color[root] or not graph.quiet[root]:
            continue
        stack: list[tuple[int, int]] = [(root, 0)]
        color[root] = 1
        while stack:
            sid, i = stack[-1]
            if i < len(graph.quiet[sid]):
                stack[-1] = (sid, i + 1)
                dst = graph.quiet[sid][i]
                if color[dst] == 1:
                    on_stack = [s for s, _ in stack]
                    return on_stack[on_stack.index(dst):]
                if color[dst] == 0:
                    color[dst] = 1
                    stack.append((dst, 0))
            else:
                color[sid] = 2
                stack.pop()
    return []


def found(scope: Scope, factory: Factory, twin: bool, kind: str, ids: tuple[str, ...],
          message: str, path: tuple[Inputs, ...], cycle: tuple[Inputs, ...] = ()) -> Finding:
    return Finding(kind, ids, message, path, cycle, replay(scope, factory, twin, path + cycle))


def replay(scope: Scope, factory: Factory, twin: bool,
           path: tuple[Inputs, ...]) -> tuple[str, ...]:
    """The counterexample as trace v1 lines, replayed from the empty scheduler."""
    world = new_world(scope, factory, twin=False)
    lines = [json.dumps(header_dict(scope.config, {"name": "model-check", "version": "1"}))]
    for number, inputs in enumerate(path):
        try:
            step = begin_step(world, scope, number, inputs.arrivals, inputs.abort)
            if step.settled is not None:
                world.checker.step(step.settled)
                lines.append(json.dumps(step_dict(step.settled)))
            finished = world.scheduler.update(set(inputs.eos))
        except Exception as e:
            lines.append(json.dumps({"step": number, "error": f"{type(e).__name__}: {e}"}))
            break
        rec = record(world, scope, step, number, finished)
        if scope.config.pipelined:
            world.held.hold(rec)
            continue
        world.checker.step(rec)  # the checker's state gives the content keys already told
        lines.append(json.dumps(step_dict(rec)))
    last = world.held.settle()
    if last is not None:  # the last step's line, which no later decision settled
        lines.append(json.dumps(step_dict(last)))
    return tuple(lines)


# Not `unsampled`: it names the entries of the step before, whose held line it settles.
DECISION_IN_RECORD: tuple[str, ...] = tuple(
    f.name for f in fields(Decision)
    if f.name in {g.name for g in fields(StepRecord)} - {"unsampled"})


class Refused(Exception):
    """The factory raised on the scope's config: one line, the exception."""


def build(factory: Factory, config: Config, knobs: Knobs) -> Scheduler:
    """factory(config, knobs) where the factory takes both, else factory(config); an
    exception it raises is Refused."""
    try:
        inspect.signature(factory).bind(config, knobs)
        both = True
    except TypeError:
        both = False
    except ValueError:  # no signature to read (a builtin): the reference's call
        both = True
    try:
        scheduler: Scheduler = factory(config, knobs) if both else factory(config)
    except Exception as e:
        text = (str(e).strip().splitlines() or [""])[0]
        raise Refused(f"{type(e).__name__}: {text}" if text else type(e).__name__) from e
    return scheduler


def load_factory(spec: str) -> Factory:
    """`module:attr`, a callable taking (config) or (config, knobs) (build)."""
    module, _, attr = spec.partition(":")
    if not attr:
        raise SystemExit(f"--scheduler must be module:attr, got {spec!r}")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise SystemExit(f"--scheduler {spec}: {type(e).__name__}: {e}") from None
    if not callable(obj):
        raise SystemExit(f"--scheduler {spec} is not callable")
    factory: Factory = obj
    return factory


def _explore_job(job: tuple[Scope, str | Factory | None, bool, tuple[str, ...]]) -> Result:
    scope, factory, twin, should = job
    if isinstance(factory, str):
        factory = load_factory(factory)
    return explore(scope, factory or ReferenceScheduler, twin, should=should)


def run_scopes(scopes: Sequence[Scope], factory: str | Factory | None = None,
               twin: bool = False, jobs: int = 1, should: tuple[str, ...] = ()
               ) -> Generator[Result, None, None]:
    """Explore each scope (in `jobs` processes), yielding results in scope order. A
    factory given as an object must pickle (a module-level class or function)."""
    work = [(s, factory, twin, should) for s in scopes]
    if jobs <= 1:
        yield from map(_explore_job, work)
        return
    with Pool(jobs) as pool:
        yield from pool.imap(_explore_job, work)


def report(result: Result, out: Any = sys.stdout, verbose: bool = True) -> None:
    verdict = "ok" if result.finding is None else result.finding.summary()
    if result.refused is not None:
        verdict = f"refused: the scheduler raised {result.refused} on this config"
    print(f"{result.scope:<44} {result.states:>9,} states {result.transitions:>10,} "
          f"transitions {result.seconds:>7.1f}s  {verdict}", file=out)
    if result.finding is not None and verbose:
        f = result.finding
        print("  path: " + " | ".join(str(i) for i in f.path), file=out)
        if f.cycle:
            print("  then forever: " + " | ".join(str(i) for i in f.cycle), file=out)
        print("  counterexample trace (v1):", file=out)
        for line in f.trace:
            print("    " + line, file=out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m proofs.model_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scopes", choices=sorted(SCOPE_SETS), default="full")
    ap.add_argument("--only", default="", help="explore only scopes whose name contains this")
    ap.add_argument("--scheduler", default=None,
                    help="module:attr of a factory of a scheduler of the interface "
                         "(docs/scheduler-interface.md): factory(config), or "
                         "factory(config, knobs) as the reference's classes and the seeded "
                         "bugs take the scope's knobs; a factory that raises on a scope's "
                         "config refuses that scope, as a lazy-only scheduler refuses "
                         "allocation full (default: the reference; the sglang scopes "
                         "explore the reference's own SGLang step)")
    ap.add_argument("--twin", action="store_true",
                    help="run the reference in lockstep and report any decision that differs")
    ap.add_argument("--should", default="", choices=["", *PER_STEP_SHOULD],
                    help="also report this SHOULD invariant (judged on one step) as a finding")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--trace-out", type=Path, default=None,
                    help="write each counterexample as a trace v1 file into this folder")
    args = ap.parse_args(argv)
    scopes = [s for s in SCOPE_SETS[args.scopes]() if args.only in s.name]
    if not scopes:
        print(f"no scope in {args.scopes!r} matches {args.only!r}", file=sys.stderr)
        return 2
    findings = states = transitions = refused = 0
    should = (args.should,) if args.should else ()
    for result in run_scopes(scopes, args.scheduler, args.twin, args.jobs, should):
        report(result)
        refused += result.refused is not None
        states += result.states
        transitions += result.transitions
        findings += result.finding is not None
        if result.finding is not None and args.trace_out is not None:
            args.trace_out.mkdir(parents=True, exist_ok=True)
            path = args.trace_out / f"counterexample-{findings}.jsonl"
            path.write_text("\n".join(result.finding.trace) + "\n")
            print(f"  written to {path} (kvsched check {path})")
    print(f"{len(scopes)} scopes, {states:,} states, {transitions:,} transitions, "
          f"{findings} with a finding" + (f", {refused} refused by the scheduler (its "
                                          "factory raised on their config)" if refused else ""))
    if refused == len(scopes):
        print(f"--scheduler {args.scheduler}: its factory raised on every scope's config; "
              "nothing was explored", file=sys.stderr)
        return 2
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
