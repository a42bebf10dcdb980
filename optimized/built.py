"""Which of kvsched's compiled modules this install has: the one place that asks.

The compiled scheduler (kvsched.optimized.compiled) and the fast checker's state
(kvsched.optimized.state) are built when kvsched is installed where a C++ compiler is
(setup.py); elsewhere kvsched installs without them and every command takes the
pure-Python path: `simulate` the reference scheduler, `check` the spec's checker
(docs/optimized.md). Every module that has a compiled path asks here instead of
importing in a try block of its own, and kvsched.implementations says so to the user
in one note.
"""

from __future__ import annotations

import importlib
from typing import Literal

__all__ = ["CompiledModule", "missing"]

CompiledModule = Literal["compiled", "state"]  # kvsched.optimized's compiled modules


def missing(module: CompiledModule) -> ImportError | None:
    """Why kvsched.optimized.`module` cannot be imported here (not built), or None.
    Not cached: a test that hides a module (sys.modules[name] = None) is seen."""
    try:
        importlib.import_module(f"kvsched.optimized.{module}")
    except ImportError as e:
        return e
    return None
