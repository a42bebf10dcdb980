"""What every engine's driver shares: the process around its jobs (driver_main), the
loop of a job's steps (run_job) and the token ids of a job's requests (Contents).
Standard library only: a driver runs in
its engine's own Python (`python -I DRIVER.py JOBS.jsonl`), where kvsched is not
installed, and loads this file, beside it, by its path:

    host = SimpleNamespace(**runpy.run_path(str(Path(__file__).resolve().with_name(
        "driver_host.py"))))

(a namespace, since run_path gives the module's globals as a dict; this file defines no
dataclass, which run_path's temporary module would not hold). Where kvsched is
installed (vLLM's tracing plugin) it is kvsched.adapters.driver_host.

NOTE on tokens: with prefix caching the engine's own block hashes (vLLM) or radix tree
(SGLang) decide the hits, so every request carries real token ids (`Contents`). A
request's content is its whole sequence, prompt then outputs; its first `prefix.len`
tokens are those of the content its `prefix` names (a named shared text, or an earlier
request's whole sequence: a conversation's next turn), the rest are its own. Token p of
a content of its own is a pseudo-random id in [3, vocab) drawn from (content id, p),
except the last, where the request's hidden output length puts end-of-sequence. The
fake model samples, as output j of request r, token P_r + j of r's content, so a next
turn holds exactly the tokens r was given and hashes as r's blocks did.

NOTE on the loop (run_job): every driver runs a job through the same loop, and supplies
only its engine's side of a step (Hooks). At step s, in this order: the job is over
when nothing is left to arrive and the engine holds no request (a done event, complete);
it has stalled when its last STALL_STEPS steps decided nothing while nothing was left to
arrive or to abort (a done event, complete, with "stalled" the step the stall began:
the engine is deterministic and would decide nothing forever, and the requests it holds
are what kvsched's completion check names); it stops at the job's max_steps (a done
event, not complete). Otherwise the requests that arrive at s are handed to the engine
in arrival order (Hooks.arrive: the engine admits one, or refuses it with its own
message), then the aborts the workload puts at s are delivered for the requests the
engine holds (Hooks.abort), then the engine runs one step (Hooks.step). The step event
is {"step": s, "arrivals": [ids], "refused": [{"id", "reason"}], "aborted": [ids], ...}
and the engine's own fields. An exception the engine's hooks name (Hooks.stopped) ends
the job early with a done event, not complete, carrying what they say (a "stopped" line
for something trace v1 cannot say, or the engine's own failure); the next job goes on.

The events a driver writes, one JSON object a line, are kvsched.adapters.recording's.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Protocol

# End-of-sequence ends a request at its hidden output length; no other token is below
# FIRST_TOKEN_ID.
EOS_TOKEN_ID = 2
FIRST_TOKEN_ID = 3
# A large vocabulary, so that unrelated blocks (one token each with block size 1) do
# not share contents by chance: vLLM would hit them, kvsched's workload would not.
VOCAB_SIZE = 1 << 20


def token_id(content: str, position: int, vocab: int = VOCAB_SIZE) -> int:
    """Token `position` of a content of its own: pseudo-random, the same in every run.

    post: FIRST_TOKEN_ID <= __return__ < vocab
    """
    digest = hashlib.blake2b(f"{content}\0{position}".encode(), digest_size=8).digest()
    return FIRST_TOKEN_ID + int.from_bytes(digest, "big") % (vocab - FIRST_TOKEN_ID)


class Contents:
    """The token ids of a job's requests: each one's whole sequence, prompt then
    outputs, built from the contents its prefix names (see NOTE on tokens)."""

    def __init__(self, items: list[dict[str, Any]], vocab: int = VOCAB_SIZE) -> None:
        self.items = {w["id"]: w for w in items}
        self.sequences: dict[str, list[int]] = {}
        self.vocab = vocab

    def tokens(self, content: str, length: int) -> list[int]:
        """The first `length` tokens of `content`: a request's, or a named shared text."""
        if content in self.items:
            return self.sequence(content)[:length]
        return [token_id(content, p, self.vocab) for p in range(length)]

    def sequence(self, rid: str) -> list[int]:
        """Request `rid`'s whole sequence: prompt_len + output_len tokens, the last one
        end-of-sequence (where the fake model ends it)."""
        seq = self.sequences.get(rid)
        if seq is None:
            w = self.items[rid]
            prefix = w.get("prefix")
            seq = self.tokens(prefix["id"], prefix["len"]) if prefix else []
            seq += [token_id(rid, p, self.vocab)
                    for p in range(len(seq), w["prompt_len"] + w["output_len"])]
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


Emit = Callable[[dict[str, Any]], None]


def driver_main(argv: list[str], script: str,
                run_jobs: Callable[[list[dict[str, Any]], Emit], None]) -> int:
    """A driver process around an engine's run: the jobs file in argv[1], one JSON event
    a line on standard output (whatever the engine prints goes to standard error), and
    any failure as one {"error": ...} event and exit status 3; `run_jobs` is the
    engine's own."""
    # This folder holds kvsched's own vllm.py and sglang.py: they must not shadow the
    # engine's packages.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    # Keep standard output for events; whatever the engine prints goes to standard error.
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


# Steps in a row that decide nothing, with no input left, after which an engine never
# will: one may still sort a queue (a step that admits nothing can), the next is as it.
STALL_STEPS = 2


class Hooks(Protocol):
    """An engine's side of run_job's loop, for one job (the NOTE on the loop)."""

    def arrive(self, item: dict[str, Any], order: int) -> str | None:
        """Hand the engine a request that arrives (`order`: 1 for the job's first):
        None when it took it, else why it refused it, in the engine's own words."""
        ...

    def abort(self, rid: str) -> bool:
        """Deliver the abort of a request the engine holds: True when the engine let it
        go at once (the step's "aborted"), False when it ends in a later step's
        finishes."""
        ...

    def step(self, step: int) -> tuple[dict[str, Any], list[str], bool]:
        """Run one engine step: the step event's own fields, the requests that left the
        engine in it (finished, or dropped), and whether it decided anything (a batch,
        a preemption, a finish ...)."""
        ...

    def stopped(self, error: Exception) -> dict[str, Any] | None:
        """The done event's fields when `error` ends the job early ({"stopped": one
        line}, or the engine's own failure), or None when it is the driver's failure."""
        ...


def aborts_by_step(items: list[dict[str, Any]]) -> dict[int, list[str]]:
    """The aborts a job's requests carry ("abort": step), by step, in request order."""
    aborts: dict[int, list[str]] = {}
    for w in items:
        if w.get("abort") is not None:
            aborts.setdefault(w["abort"], []).append(w["id"])
    return aborts


def run_job(job: dict[str, Any], hooks: Hooks, emit: Emit) -> None:
    """Run one job's steps through an engine's hooks: a step event a step, then its done
    event (the NOTE on the loop)."""
    name = job["name"]
    pending = sorted(job["requests"], key=lambda w: w["arrival"])
    aborts = aborts_by_step(pending)
    max_steps = job.get("max_steps")
    live: set[str] = set()  # the requests the engine holds
    nxt = step = idle = 0  # idle: steps in a row that decided nothing, with no input left
    try:
        while nxt < len(pending) or live:
            if idle == STALL_STEPS:
                emit({"done": name, "complete": True, "steps": step, "stalled": step - idle})
                return
            if max_steps is not None and step >= max_steps:
                emit({"done": name, "complete": False, "steps": step})
                return
            arrivals: list[str] = []
            refused: list[dict[str, str]] = []
            while nxt < len(pending) and pending[nxt]["arrival"] <= step:
                w = pending[nxt]
                nxt += 1
                arrivals.append(w["id"])
                reason = hooks.arrive(w, nxt)
                if reason is None:
                    live.add(w["id"])
                else:
                    refused.append({"id": w["id"], "reason": reason})
            aborted = [rid for rid in aborts.pop(step, ()) if rid in live and hooks.abort(rid)]
            live.difference_update(aborted)
            fields, ended, decided = hooks.step(step)
            live.difference_update(ended)
            emit({"step": step, "arrivals": arrivals, "refused": refused, "aborted": aborted,
                  **fields})
            waiting = nxt < len(pending) or any(rid in live for ids in aborts.values()
                                                for rid in ids)
            idle = 0 if decided or arrivals or aborted or waiting else idle + 1
            step += 1
    except Exception as e:
        extra = hooks.stopped(e)
        if extra is None:
            raise
        emit({"done": name, "complete": False, "steps": step, **extra})
        return
    emit({"done": name, "complete": True, "steps": step})
