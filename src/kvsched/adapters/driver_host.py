"""What every engine's driver shares: the process around its jobs (driver_main) and
the token ids of a job's requests (Contents). Standard library only: a driver runs in
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

The events a driver writes, one JSON object a line, are kvsched.adapters.recording's.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

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
