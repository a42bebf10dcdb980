"""The scheduler interface every implementation offers to the simulation loop.

A step is: `add_request` for arrivals, `abort_request` for cancellations (a scheduler
that models them: `Aborting`, delivered through `abort`), `schedule()` for phases 2 to
5, then `update(stopped)` for phase 6, where `stopped` names the sampled requests whose
new token was end-of-sequence.

`BlockTables` are optional read accessors: the block ids behind the counts. A scheduler
that offers them (the reference, the compiled and the torch schedulers do:
`InspectableScheduler`) can be compared with another block by block, and tested without
reading its private state. `ContentKeys` is optional too: a scheduler with prefix
caching that takes its blocks' content keys from a trace, as a profile's replay gives
them; and `Deduplicating`: one whose cache deduplicates running requests' blocks.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol, runtime_checkable

from kvsched.spec.model import Config, Decision, Request, RequestView


@runtime_checkable
class Scheduler(Protocol):
    config: Config

    def add_request(self, request: Request) -> None: ...

    def schedule(self) -> Decision: ...

    def update(self, stopped: Collection[str]) -> tuple[str, ...]:
        """Sample one token for each request in the last decision's `sampled`; finish
        those that stopped (end-of-sequence), reached max_tokens or max_model_len;
        return the finished ids in batch order."""
        ...

    def free_blocks(self) -> int: ...

    def states(self) -> dict[str, RequestView]:
        """Every live request's state: what a stuck run's report says of each waiting
        request, the state before a profile's divergence, and what differential tests
        compare."""
        ...

    def has_unfinished(self) -> bool: ...


@runtime_checkable
class Aborting(Protocol):
    """Optional: a scheduler that models a client's aborts. The simulation loop delivers
    a workload's aborts only to one (`abort`); a run of a workload with aborts on any
    other is refused (NoAborts)."""

    def abort_request(self, request_id: str) -> None:
        """The client cancels `request_id`, before this step's schedule(). vLLM's steps
        end it at once, waiting, running, swapped or mid-chunk, and it gives back every
        block it holds (what a cache keeps of its content stays cached). SGLang's ends a
        waiting request and the one being chunked at once, but marks a running one,
        which stays live, is scheduled as usual, and finishes at its next sample (the
        token it samples ends it, as an end-of-sequence would; kvsched.reference.sglang).
        An id no longer live is ignored."""
        ...


class NoAborts(ValueError):
    """A workload aborts a request, and the scheduler does not model aborts; str() is
    one line."""


def not_aborting(scheduler: object, request_id: str) -> str | None:
    """Why `scheduler` cannot take the abort of `request_id`, in one line: it is not
    `Aborting`; None when it is."""
    if isinstance(scheduler, Aborting):
        return None
    return (f"the workload aborts request {request_id!r}, but the scheduler "
            f"({type(scheduler).__name__}) has no abort_request: it does not model aborts "
            "(kvsched.spec.interface.Aborting)")


def abort(scheduler: Scheduler, request_id: str) -> bool:
    """Deliver a client's abort of the live request `request_id` to `scheduler`: True
    when it ended at once (the step's `aborted`), False when it stays live until a later
    finish (SGLang's running requests). NoAborts when the scheduler is not `Aborting`."""
    if not isinstance(scheduler, Aborting):
        raise NoAborts(not_aborting(scheduler, request_id))
    scheduler.abort_request(request_id)
    return request_id not in scheduler.states()


@runtime_checkable
class BlockTables(Protocol):
    """Optional read accessors: which block ids a scheduler holds for whom, and which
    are free. For tests and proofs; the simulation loop never needs them."""

    def block_table(self, request_id: str) -> tuple[int, ...]:
        """The GPU block ids of `request_id` in table order; () when it holds none (or
        is not live)."""
        ...

    def host_table(self, request_id: str) -> tuple[int, ...]:
        """The host (swap) block ids of `request_id` in table order; () when none."""
        ...

    def free_gpu_ids(self) -> tuple[int, ...]:
        """The free GPU block ids, in the order they will be handed out."""
        ...

    def free_host_ids(self) -> tuple[int, ...]:
        """The free host block ids, in the order they will be handed out."""
        ...


@runtime_checkable
class ContentKeys(Protocol):
    """Optional, for prefix caching: a scheduler that takes the content keys of requests'
    blocks from a trace (`block_keys`) instead of working them out itself."""

    def add_block_keys(self, request_id: str, keys: Sequence[str],
                       start: int | None = None) -> None:
        """The keys of the request's blocks from table index `start` on, replacing every
        key given from there; by default the next ones, continuing those given before."""
        ...


@runtime_checkable
class Deduplicating(Protocol):
    """Optional, for prefix caching: a scheduler whose cache swaps a request's blocks for
    cached copies of the same content (SGLang's radix cache, LMDeploy's block trie), as
    trace v1's `dedup` says it."""

    def dedups(self) -> dict[str, tuple[int, ...]]:
        """The requests whose tables the last step deduplicated (its schedule() or its
        update()), each with the block ids its table now starts with."""
        ...


@runtime_checkable
class RequestStates(Protocol):
    """Optional: a scheduler that gives one live request's view without building every
    one (states() does), so that a replay can keep the state before each step at the
    cost of the requests the step names (kvsched.spec.replay)."""

    def state_of(self, request_id: str) -> RequestView | None:
        """The request's view as states() would give it; None when it is not live."""
        ...


@runtime_checkable
class InspectableScheduler(Scheduler, BlockTables, Protocol):
    """A scheduler that also offers the block-table accessors (every scheduler kvsched
    builds); whether it models aborts is `Aborting`'s to say (all but LMDeploy's step
    do)."""
