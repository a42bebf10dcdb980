"""The table of engines kvsched records (`kvsched record NAME`), in the order the
command lists them; each is its adapter module's ENGINE (kvsched.adapters.recording)."""

from __future__ import annotations

from typing import Any

from kvsched.adapters import lmdeploy, sglang, vllm, vllm_v0
from kvsched.adapters.recording import Engine

ENGINES: tuple[Engine[Any], ...] = (vllm.ENGINE, vllm_v0.ENGINE, sglang.ENGINE,
                                     lmdeploy.ENGINE)


def engine_named(name: str) -> Engine[Any]:
    """The engine `kvsched record NAME` records.
    pre: name in {e.name for e in ENGINES}"""
    return next(e for e in ENGINES if e.name == name)
