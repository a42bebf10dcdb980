"""The simulation loop: drive any scheduler through the same interface, write trace v1.

Each step: arrivals are added and aborts delivered, the scheduler decides, every
request that caught up samples one token (end-of-sequence at its hidden output
length), and the scheduler finishes what stopped. An abort is written as what the
scheduler did with it (kvsched.spec.interface.abort): the step's `aborted` when it
ended the request at once; a later step's finish when it let the request run to its
next sample (SGLang's running requests). A workload with aborts needs a scheduler that
models them (kvsched.spec.interface.Aborting): on any other the run raises NoAborts. The
loop is the model and the clock; the scheduler sees only what a real engine's scheduler
sees.

A run that stops making progress (kvsched.spec.should.Stall: K steps in a row that
change nothing while work waits) can never go on, since nothing outside the scheduler
is left to change its state: the loop yields that K-th step, then raises Stalled, whose
`progress` violation names the waiting requests and why each waits.

A pipelined scheduler (config pipelined) decides step k+1 before it applies step k's
output, and that decision may drop the output of step k's entries it preempts
(Decision.unsampled): their tokens were not sampled, and a finish step k reported for
one did not happen. So the loop writes step k's line only once step k+1 is decided
(kvsched.spec.trace.HeldLine), with those entries as its `unsampled`, and forgets a
finished request only then.

With prefix caching the trace also carries each request's content keys (`block_keys`,
from its shared prefix: kvsched.spec.prefix), its prompt's at arrival and each later
block's once its tokens are known, as an engine writes its block hashes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence

from kvsched.spec.interface import Deduplicating, Scheduler, abort, not_aborting
from kvsched.spec.model import Config, Status, StepRecord
from kvsched.spec.prefix import Prefix, block_key
from kvsched.spec.should import DEFAULT_STALL_STEPS, Stall, moves, stalled_run
from kvsched.spec.trace import HeldLine
from kvsched.spec.violation import Violation
from kvsched.workload import WorkItem


def step_bound(config: Config, workload: Collection[WorkItem],
               stall_steps: int = DEFAULT_STALL_STEPS) -> int:
    """The steps a run of `workload` may take before it is going round in circles: four
    times the tokens the workload can ever need leaves room for recomputes, and
    `stall_steps` more let a run that got stuck be told as stuck (its requests named)."""
    tokens = sum(min(w.prompt_len + w.max_tokens, config.max_model_len) for w in workload)
    last = max((w.arrival for w in workload), default=0)
    return last + 4 * tokens + 50 + stall_steps


def aborts_refusal(scheduler: object, workload: Iterable[WorkItem]) -> str | None:
    """Why `scheduler` cannot run `workload`, in one line: the workload aborts a request
    and the scheduler does not model aborts (kvsched.spec.interface.Aborting); None when
    it can. The workload is read only for a scheduler without aborts."""
    if not_aborting(scheduler, "") is None:
        return None
    first = next((w for w in workload if w.abort is not None), None)
    return None if first is None else not_aborting(scheduler, first.id)


def _holding(scheduler: Scheduler) -> bool:
    """Whether finished requests still hold their blocks (config pipelined): the run
    goes on until their release, so that a complete trace leaves none held."""
    return any(v.status is Status.HELD for v in scheduler.states().values())


def unending(checked: Sequence[Violation], stalled: Violation | None, steps: int,
             bound: int | None, live: int) -> Violation | None:
    """Why a driven run of `steps` steps, `live` requests unfinished, can never end, as
    the `progress` violation it fails with, or None: it stalled (the checker's own word
    on the stall, among `checked`, where it has one: that one is read from the steps,
    the run's from the scheduler's view), or it is still going at its step `bound`
    (step_bound; None: no bound)."""
    if stalled is not None:
        return next((v for v in checked if v.invariant == "progress"), stalled)
    if bound is None or not live or steps < bound:
        return None
    return Violation("progress", steps - 1,
                     f"the run did not end within its step bound of {bound} steps (four "
                     f"times the tokens its workload can need): {live} "
                     f"request{'s are' if live != 1 else ' is'} still live")


def run(scheduler: Scheduler, workload: Iterable[WorkItem], *, block_ids: bool = True,
        max_steps: int | None = None,
        stall_steps: int = DEFAULT_STALL_STEPS) -> Iterator[StepRecord]:
    """Yield one StepRecord per step until every request has ended (or max_steps);
    raise Stalled after the `stall_steps`-th step in a row that changed nothing while
    work waits.

    The workload must be sorted by arrival (workload.validate does that); it is read
    as the steps reach each arrival (a generated one is made as it is read), and only
    live requests are kept.
    """
    items = iter(workload)
    upcoming = next(items, None)  # the next request to arrive
    live: dict[str, WorkItem] = {}
    outputs: dict[str, int] = {}  # tokens sampled, per live request
    aborts: dict[int, list[str]] = {}
    caching = scheduler.config.prefix_caching
    bs = scheduler.config.block_size
    keyed: dict[str, int] = {}  # full blocks whose keys the trace has given, per request
    shared: dict[str, Prefix] = {}  # each live request's shared prefix, as it arrived

    def new_keys(rid: str) -> tuple[str, ...]:
        """The keys of `rid`'s blocks that became full since the trace last gave any."""
        w = live[rid]
        full = (w.prompt_len + outputs.get(rid, 0)) // bs
        done = keyed.get(rid, 0)
        keyed[rid] = full
        return tuple(block_key(rid, shared[rid], i, bs) for i in range(done, full))

    def forget(ended: Iterable[str]) -> None:
        for rid in ended:
            outputs.pop(rid, None)
            keyed.pop(rid, None)
            live.pop(rid, None)
            shared.pop(rid, None)

    pipelined = scheduler.config.pipelined
    held = HeldLine()  # pipelined: the last step's line, until this step is decided
    stall = Stall(stall_steps)

    def emit(rec: StepRecord) -> Iterator[StepRecord]:
        yield rec
        if stall.observe(moves(rec), bool(outputs)):
            raise stalled_run(scheduler, lambda rid: live[rid].request(live[rid].arrival),
                              rec.step, stall.limit)

    step = 0
    while upcoming is not None or outputs or _holding(scheduler):
        if max_steps is not None and step >= max_steps:
            break
        arrivals = []
        while upcoming is not None and upcoming.arrival <= step:
            w = upcoming
            upcoming = next(items, None)
            if w.abort is not None:  # no sooner than its arrival
                aborts.setdefault(w.abort, []).append(w.id)
            req = w.request(step)
            scheduler.add_request(req)
            live[w.id] = w
            outputs[w.id] = 0
            if caching:
                shared[w.id] = req.prefix
            arrivals.append(req)
        aborted = []
        for rid in aborts.pop(step, ()):
            if rid in outputs and abort(scheduler, rid):
                del outputs[rid]
                aborted.append(rid)
        decision = scheduler.schedule()
        for rej in decision.rejected:
            outputs.pop(rej.id, None)
        if pipelined:
            for rid in decision.unsampled:  # the last step's token it dropped
                if rid in outputs:
                    outputs[rid] -= 1
            settled = held.settle(unsampled=decision.unsampled)
            if settled is not None:
                forget(settled.finished)
                yield from emit(settled)
        stopped = []
        for rid in decision.sampled:
            outputs[rid] += 1
            if outputs[rid] >= live[rid].output_len:
                stopped.append(rid)
        finished = scheduler.update(stopped)
        keys = {}
        if caching:
            for rid in [*(r.id for r in arrivals), *decision.sampled]:
                if rid in outputs:
                    got = new_keys(rid)
                    if got:
                        keys[rid] = got
        forget([*aborted, *(r.id for r in decision.rejected)])
        if not pipelined:
            forget(finished)
        dedup = scheduler.dedups() if isinstance(scheduler, Deduplicating) else {}
        rec = StepRecord(step, tuple(arrivals), tuple(aborted), decision.rejected,
                         decision.preempted, decision.swapped_in, decision.scheduled,
                         finished, scheduler.free_blocks(),
                         decision.new_blocks if block_ids else None,
                         prefix_hits=decision.prefix_hits, block_keys=keys,
                         dedup=dedup if block_ids else {}, released=decision.released,
                         reclaimed=decision.reclaimed)
        if pipelined:
            held.hold(rec)
        else:
            yield from emit(rec)
        step += 1
    last = held.settle()
    if last is not None:
        yield last
