"""The simulation loop: drive any scheduler through the same interface, write trace v1.

Each step: arrivals are added and aborts applied, the scheduler decides, every
request that caught up samples one token (end-of-sequence at its hidden output
length), and the scheduler finishes what stopped. The loop is the model and the
clock; the scheduler sees only what a real engine's scheduler sees.

With prefix caching the trace also carries each request's content keys (`block_keys`,
from its shared prefix: kvsched.spec.prefix), its prompt's at arrival and each later
block's once its tokens are known, as an engine writes its block hashes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from kvsched.spec.interface import Scheduler
from kvsched.spec.model import StepRecord
from kvsched.spec.prefix import block_key
from kvsched.workload import WorkItem


def run(scheduler: Scheduler, workload: Sequence[WorkItem], *, block_ids: bool = True,
        max_steps: int | None = None) -> Iterator[StepRecord]:
    """Yield one StepRecord per step until every request has ended (or max_steps).

    The workload must be sorted by arrival (workload.validate does that).
    """
    pending = list(workload)
    by_id = {w.id: w for w in pending}
    outputs: dict[str, int] = {}
    aborts: dict[int, list[str]] = {}
    for w in pending:
        if w.abort is not None:
            aborts.setdefault(w.abort, []).append(w.id)
    caching = scheduler.config.prefix_caching
    bs = scheduler.config.block_size
    keyed: dict[str, int] = {}  # full blocks whose keys the trace has given, per request

    def new_keys(rid: str) -> tuple[str, ...]:
        """The keys of `rid`'s blocks that became full since the trace last gave any."""
        w = by_id[rid]
        full = (w.prompt_len + outputs.get(rid, 0)) // bs
        done = keyed.get(rid, 0)
        keyed[rid] = full
        return tuple(block_key(rid, w.shared, i, bs) for i in range(done, full))

    nxt = 0
    step = 0
    while nxt < len(pending) or outputs:
        if max_steps is not None and step >= max_steps:
            return
        arrivals = []
        while nxt < len(pending) and pending[nxt].arrival <= step:
            w = pending[nxt]
            nxt += 1
            req = w.request(step)
            scheduler.add_request(req)
            outputs[w.id] = 0
            arrivals.append(req)
        aborted = []
        for rid in aborts.pop(step, ()):
            if rid in outputs:
                scheduler.abort_request(rid)
                del outputs[rid]
                aborted.append(rid)
        decision = scheduler.schedule()
        for rej in decision.rejected:
            outputs.pop(rej.id, None)
        stopped = []
        for rid in decision.sampled:
            outputs[rid] += 1
            if outputs[rid] >= by_id[rid].output_len:
                stopped.append(rid)
        finished = scheduler.update(stopped)
        keys = {}
        if caching:
            for rid in [*(r.id for r in arrivals), *decision.sampled]:
                if rid in outputs:
                    got = new_keys(rid)
                    if got:
                        keys[rid] = got
        for rid in finished:
            del outputs[rid]
            keyed.pop(rid, None)
        yield StepRecord(step, tuple(arrivals), tuple(aborted), decision.rejected,
                         decision.preempted, decision.swapped_in, decision.scheduled,
                         finished, scheduler.free_blocks(),
                         decision.new_blocks if block_ids else None,
                         prefix_hits=decision.prefix_hits, block_keys=keys)
        step += 1
