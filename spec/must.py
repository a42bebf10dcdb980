"""The MUST invariants of design.md section 3: safety rules any engine obeys.

One function per invariant id; each takes the numbers of one step and returns
the Violation it finds, or None. The checker (checker.py) derives the numbers.
"""

from __future__ import annotations

from kvsched.spec.blocks import never_completes
from kvsched.spec.model import Config, Request
from kvsched.spec.violation import Violation


def kv_budget(step: int, demand: int, free: int, reclaim: int) -> Violation | None:
    """kv-budget: sum over r in S of Db_r (swap-ins included) <= B_free + B_reclaim.

    B_free is the free GPU blocks before the step, B_reclaim what its preemptions
    released. With it, free GPU blocks never go negative.
    """
    if demand <= free + reclaim:
        return None
    return Violation("kv-budget", step,
                     f"the step needs {demand} new GPU blocks but only {free} were free "
                     f"and {reclaim} reclaimed by preemption",
                     lhs=demand, relation="<=", rhs=free + reclaim)


def cpu_budget(step: int, request: str, need: int, free_host: int) -> Violation | None:
    """cpu-budget: a swap-out moves G blocks to host only if G <= free host blocks."""
    if need <= free_host:
        return None
    return Violation("cpu-budget", step,
                     f"swapping out {request} needs {need} host blocks but only "
                     f"{free_host} are free", request=request,
                     lhs=need, relation="<=", rhs=free_host)


def token_budget(step: int, tokens: int, budget: int) -> Violation | None:
    """token-budget: sum over r in S of Dn_r <= max_num_batched_tokens."""
    if tokens <= budget:
        return None
    return Violation("token-budget", step,
                     f"the step schedules {tokens} tokens, over the budget of {budget}",
                     lhs=tokens, relation="<=", rhs=budget)


def seq_limit(step: int, running: int, limit: int) -> Violation | None:
    """seq-limit: running requests <= max_num_seqs."""
    if running <= limit:
        return None
    return Violation("seq-limit", step,
                     f"{running} requests are running, over max_num_seqs {limit}",
                     lhs=running, relation="<=", rhs=limit)


def token_range(step: int, request: str, new_tokens: int, computed: int, known: int,
                config: Config) -> Violation | None:
    """token-range: Dn >= 1, C + Dn <= N, C + Dn <= max_model_len; whole prefills
    without chunked prefill (a prefill is any step with N - C > 1)."""
    if new_tokens < 1:
        return Violation("token-range", step,
                         f"{request} is scheduled {new_tokens} tokens; at least 1 is needed",
                         request=request, lhs=new_tokens, relation=">=", rhs=1)
    if computed + new_tokens > known:
        return Violation("token-range", step,
                         f"{request} is scheduled {new_tokens} tokens but only "
                         f"{known - computed} are known and not yet computed "
                         f"(N={known}, C={computed})",
                         request=request, lhs=computed + new_tokens, relation="<=", rhs=known)
    if computed + new_tokens > config.max_model_len:
        return Violation("token-range", step,
                         f"{request} would compute past max_model_len",
                         request=request, lhs=computed + new_tokens, relation="<=",
                         rhs=config.max_model_len)
    if not config.chunked_prefill and new_tokens != known - computed:
        return Violation("token-range", step,
                         f"without chunked prefill {request} must be scheduled whole "
                         f"({known - computed} tokens), got {new_tokens}",
                         request=request, lhs=new_tokens, relation="==", rhs=known - computed)
    return None


def one_state(step: int, request: str, action: str, state: str) -> Violation | None:
    """one-state: each request is in exactly one state, and an action applies only to
    the states that allow it (ALLOWED below); scheduled at most once per step."""
    if state in ALLOWED[action]:
        return None
    return Violation("one-state", step, f"{request} is {action} while {state}",
                     request=request)


# Which states allow which action. "swapped in" and "admitted" are this step's.
ALLOWED: dict[str, frozenset[str]] = {
    "scheduled": frozenset({"waiting", "running", "swapped in"}),
    "rejected": frozenset({"waiting"}),
    "aborted": frozenset({"waiting", "running", "swapped", "arriving"}),
    "swapped in": frozenset({"swapped"}),
    # A finish is checked against sampling (finish); here only ended requests arrive.
    "finished": frozenset({"running"}),
}


def preempt_victim(step: int, request: str, state: str) -> Violation | None:
    """preempt: a victim was running (and not admitted or swapped in this step)."""
    if state == "running":
        return None
    return Violation("preempt", step, f"{request} is preempted while {state}; "
                     "only a running request can be a victim", request=request)


def preempt_release(step: int, victims: str, missing: int, released: int) -> Violation:
    """preempt: a victim releases all its GPU blocks (recompute: to free; swap: to host)."""
    return Violation("preempt", step,
                     f"preempting {victims} should have released {released} GPU blocks, "
                     f"but the engine reports {missing} fewer free",
                     lhs=released - missing, relation="==", rhs=released)


def preempt_recompute(step: int, request: str, allocated: int, needed: int) -> Violation:
    """preempt: a recompute victim restarts from C = 0 with no blocks, so its re-prefill
    allocates ceil((C + Dn) / block_size) blocks from nothing."""
    return Violation("preempt", step,
                     f"{request} was preempted by recompute but its next chunk got "
                     f"{allocated} new blocks where {needed} are needed from C = 0: "
                     "it kept its computed tokens or blocks",
                     request=request, lhs=allocated, relation="==", rhs=needed)


def preempt_recompute_count(step: int, requests: str, missing: int) -> Violation:
    """preempt: after a recompute the engine's free count disagrees with a re-prefill
    from C = 0 and no blocks."""
    return Violation("preempt", step,
                     f"after recompute, {requests} restarted with other than C = 0 and no "
                     f"blocks: the engine's free count is off by {missing}",
                     lhs=-missing, relation="==", rhs=0)


def finish_sampled(step: int, request: str) -> Violation:
    """finish: a request finishes only right after it sampled a token."""
    return Violation("finish", step,
                     f"{request} finishes without having sampled a token in this step",
                     request=request)


def finish_length(step: int, request: str, known: int, max_model_len: int) -> Violation | None:
    """finish: a sequence never grows past max_model_len tokens, so a request samples only
    while N < max_model_len (a prompt of max_model_len tokens leaves no room, section 2)."""
    if known < max_model_len:
        return None
    return Violation("finish", step,
                     f"{request} samples a token with {known} tokens known, taking its "
                     f"sequence past max_model_len {max_model_len}",
                     request=request, lhs=known + 1, relation="<=", rhs=max_model_len)


def finish_due(step: int, request: str, outputs: int, known: int, req: Request,
               config: Config) -> Violation | None:
    """finish: outputs never exceed max_tokens; a request that reached max_tokens or
    max_model_len finishes in the step that reached it."""
    if outputs >= req.max_tokens or known >= config.max_model_len:
        limit, value = ((f"max_tokens {req.max_tokens}", outputs)
                        if outputs >= req.max_tokens
                        else (f"max_model_len {config.max_model_len}", known))
        bound = req.max_tokens if outputs >= req.max_tokens else config.max_model_len
        return Violation("finish", step,
                         f"{request} reached {limit} but did not finish",
                         request=request, lhs=value, relation="<", rhs=bound)
    return None


def finish_leak(step: int, requests: str, missing: int, held: int) -> Violation:
    """finish: a finished request holds no blocks."""
    return Violation("finish", step,
                     f"finishing {requests} should have released {held} GPU blocks, "
                     f"but the engine reports {missing} fewer free (a leak)",
                     lhs=held - missing, relation="==", rhs=held)


def reject(step: int, request: Request, config: Config) -> Violation | None:
    """reject: only a request that can never complete, even alone, is rejected."""
    if never_completes(config, request.prompt_len, request.max_tokens) is not None:
        return None
    return Violation("reject", step,
                     f"{request.id} is rejected but it fits alone in an empty cache "
                     f"(prompt {request.prompt_len}, max_tokens {request.max_tokens})",
                     request=request.id)


def block_ids_owner(step: int, request: str, block: int, owner: str | None,
                    num_gpu_blocks: int) -> Violation | None:
    """block-ids: only free blocks are handed out; a block has at most one owner."""
    if not 0 <= block < num_gpu_blocks:
        return Violation("block-ids", step,
                         f"{request} gets block {block}, outside 0..{num_gpu_blocks - 1}",
                         request=request, lhs=block, relation="<", rhs=num_gpu_blocks)
    if owner is None:
        return None
    return Violation("block-ids", step,
                     f"{request} gets block {block}, which {owner} still holds",
                     request=request)


def block_ids_count(step: int, request: str, given: int, needed: int) -> Violation | None:
    """block-ids: the ids handed to a request number exactly its Db (plus H on swap-in)."""
    if given == needed:
        return None
    return Violation("block-ids", step,
                     f"{request} gets {given} new block ids where it needs {needed}",
                     request=request, lhs=given, relation="==", rhs=needed)


def accounting(step: int, reported: int, derived: int) -> Violation | None:
    """accounting: the engine's reported free GPU blocks == the free blocks derived."""
    if reported == derived:
        return None
    return Violation("accounting", step,
                     f"the engine reports {reported} free GPU blocks; the trace implies "
                     f"{derived}", lhs=reported, relation="==", rhs=derived)
