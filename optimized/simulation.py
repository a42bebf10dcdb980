"""The simulation loop of kvsched.simulate, on tensors, for the optimized scheduler.

Same model, same steps, same trace lines as `kvsched.simulate.run` driving any
scheduler through the interface: arrivals and aborts, then the step's decision, then
one token for every request that caught up, end-of-sequence at its hidden output
length. Here the per-request bookkeeping of a step (outputs counted, stops found) is
tensor work over the sampled slots, and trace lines are built from the decision's
tensors, so a step costs Python work only for the requests that arrive, are aborted,
preempted, rejected or finish, and for the ids written to the trace.

With prefix caching the trace carries what `kvsched.simulate.run` writes: the hits,
and each request's content keys (`block_keys`): its prompt's at arrival and each later
block's once its tokens are known (only the sampled requests whose known tokens
crossed a block end are looked at in Python).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kvsched.optimized.scheduler import P_, StepTensors, TorchScheduler
from kvsched.spec.model import Request
from kvsched.spec.prefix import Prefix, block_key

I64 = torch.int64


@dataclass(frozen=True)
class Arrivals:
    """A workload as columns, sorted by arrival step (kvsched.workload.validate order)."""

    ids: Sequence[str]
    arrival: Sequence[int]
    prompt_len: Sequence[int]
    output_len: Sequence[int]
    max_tokens: Sequence[int]
    priority: Sequence[int]
    abort: Sequence[int | None]
    shared: Sequence[Prefix] | None = None  # each request's resolved prefix (WorkItem.shared)


@dataclass
class FastStep:
    """One simulated step: the decision's tensors and the Python-side events."""

    step: int
    arrivals: list[Request]
    aborted: list[str]
    decision: StepTensors
    finished: list[str]
    free_blocks: int
    block_keys: dict[str, list[str]] = field(default_factory=dict)


def run_fast(scheduler: TorchScheduler, work: Arrivals, *,
             max_steps: int | None = None) -> Iterator[FastStep]:
    """Yield one FastStep per step until every request has ended (or max_steps); the
    decision's tensors are valid until the next step is asked for."""
    dev = scheduler.device
    total = len(work.ids)
    aborts: dict[int, list[str]] = {}
    for rid, step in zip(work.ids, work.abort, strict=True):
        if step is not None:
            aborts.setdefault(step, []).append(rid)
    live: set[str] = set()
    outputs = torch.zeros(64, dtype=I64, device=dev)  # tokens sampled, by slot
    eos = torch.zeros(64, dtype=I64, device=dev)  # output length, by slot
    caching = scheduler.config.prefix_caching
    bs = scheduler.config.block_size
    keyed = torch.zeros(64, dtype=I64, device=dev)  # full blocks whose keys were written
    shared: dict[str, Prefix] = {}
    nxt = 0
    step = 0
    while nxt < total or live:
        if max_steps is not None and step >= max_steps:
            return
        arrivals: list[Request] = []
        slots: list[int] = []
        lengths: list[int] = []
        while nxt < total and work.arrival[nxt] <= step:
            req = Request(work.ids[nxt], work.prompt_len[nxt], work.max_tokens[nxt],
                          work.priority[nxt], step,
                          work.shared[nxt] if work.shared is not None else ())
            if caching and req.prefix:
                shared[req.id] = req.prefix
            scheduler.add_request(req)
            live.add(req.id)
            arrivals.append(req)
            slots.append(scheduler.slot_of(req.id))
            lengths.append(work.output_len[nxt])
            nxt += 1
        if slots:
            need = max(slots) + 1
            if need > outputs.numel():
                size = max(need, 2 * outputs.numel())
                outputs = torch.cat((outputs, outputs.new_zeros(size - outputs.numel())))
                eos = torch.cat((eos, eos.new_zeros(size - eos.numel())))
                keyed = torch.cat((keyed, keyed.new_zeros(size - keyed.numel())))
            at = torch.tensor(slots, dtype=I64, device=dev)
            outputs[at] = 0
            keyed[at] = 0
            eos[at] = torch.tensor(lengths, dtype=I64, device=dev)
        aborted = []
        for rid in aborts.pop(step, ()):
            if rid in live:
                scheduler.abort_request(rid)
                live.discard(rid)
                aborted.append(rid)
        decision = scheduler.schedule_tensors()
        for rej in decision.rejected:
            live.discard(rej.id)
        sampled = decision.sampled
        counted = outputs[sampled] + 1
        outputs[sampled] = counted
        stopped = sampled[counted >= eos[sampled]]
        done = scheduler.update_tensors(stopped)
        finished = scheduler.ids_of(done)
        keys: dict[str, list[str]] = {}
        if caching:
            # As kvsched.simulate.run: the arrivals' keys first, then the sampled ones'.
            for req, slot in zip(arrivals, slots, strict=True):
                if req.id in live:
                    full = (req.prompt_len + int(outputs[slot])) // bs
                    keyed[slot] = full
                    if full:
                        keys[req.id] = [block_key(req.id, req.prefix, i, bs)
                                        for i in range(full)]
            known = scheduler.state[P_, sampled] + outputs[sampled]
            filled = torch.div(known, bs, rounding_mode="floor")
            crossed = filled > keyed[sampled]
            if bool(crossed.any()):
                moved = sampled[crossed]
                for rid, done_upto, upto in zip(scheduler.ids_of(moved),
                                                keyed[moved].tolist(),
                                                filled[crossed].tolist(), strict=True):
                    keys[rid] = [block_key(rid, shared.get(rid, ()), i, bs)
                                 for i in range(done_upto, upto)]
                keyed[moved] = filled[crossed]
            for rid in finished:
                shared.pop(rid, None)
        live.difference_update(finished)
        yield FastStep(step, arrivals, aborted, decision, finished, scheduler.free_blocks(),
                       keys)
        scheduler.forget(done)  # only now: the step's ids stay readable until here
        step += 1


def step_dict(scheduler: TorchScheduler, s: FastStep, block_ids: bool = True
              ) -> dict[str, Any]:
    """The trace v1 line of a step, as kvsched.spec.trace.step_dict writes it (so the
    trace equals the one kvsched.simulate.run makes, byte for byte). Call it before the
    next step: it reads ids of the decision's slots."""
    d = s.decision
    ids = scheduler.ids_of
    first = scheduler.config.first_block_id
    out: dict[str, Any] = {"step": s.step}
    if s.arrivals:
        out["arrivals"] = [{"id": r.id, "prompt_len": r.prompt_len, "max_tokens": r.max_tokens,
                            "priority": r.priority} for r in s.arrivals]
    if s.aborted:
        out["aborted"] = s.aborted
    if d.rejected:
        out["rejected"] = [{"id": r.id, "reason": r.reason} for r in d.rejected]
    if d.preempted:
        out["preempted"] = [{"id": scheduler.id_of(slot), "mode": mode}
                            for slot, mode in d.preempted]
    if d.swapped_in.numel():
        out["swapped_in"] = ids(d.swapped_in)
    if d.scheduled.numel():
        out["scheduled"] = list(zip(ids(d.scheduled), d.tokens.tolist(), strict=True))
    if s.finished:
        out["finished"] = s.finished
    out["free_blocks"] = s.free_blocks
    if block_ids:
        blocks: dict[str, list[int]] = {}
        flat = (d.new_block_ids + first).tolist()
        at = 0
        for rid, count in zip(ids(d.new_block_slots), d.new_block_counts.tolist(),
                              strict=True):
            blocks[rid] = flat[at:at + count]
            at += count
        out["new_blocks"] = blocks
    if d.prefix_hits:
        out["prefix_hits"] = {scheduler.id_of(slot): [b + first for b in hit]
                              for slot, hit in d.prefix_hits}
    if s.block_keys:
        out["block_keys"] = s.block_keys
    return out
