"""Load a user's scheduler from `module:factory`, as `kvsched diff` and `kvsched fuzz` take it.

A factory is a callable taking a kvsched.spec.Config and returning an object with the
kvsched.spec.interface.Scheduler methods. The module is imported the way
`python -m` would find it: from sys.path, with the current directory searched first.
Every way this can go wrong is a FactoryError, one line naming the spec and what was
expected.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

from kvsched.spec.interface import Scheduler
from kvsched.spec.model import Config

SchedulerFactory = Callable[[Config], Scheduler]

# The interface's methods, checked on what a factory returns (abort_request is optional:
# kvsched.spec.interface.Aborting).
INTERFACE_METHODS = ("add_request", "schedule", "update", "free_blocks", "states",
                     "has_unfinished")


class FactoryError(ValueError):
    """A `module:factory` that cannot be loaded or used; str() is one line."""


def is_factory_spec(text: str) -> bool:
    """Whether `text` has the shape module:factory (dotted names on both sides)."""
    module, sep, attr = text.partition(":")
    return bool(sep) and _dotted(module) and _dotted(attr)


def _dotted(name: str) -> bool:
    return bool(name) and all(part.isidentifier() for part in name.split("."))


def load_factory(spec: str) -> SchedulerFactory:
    """The callable named by `spec` ("package.module:factory" or "module:Class.method").

    post: callable(__return__)
    """
    if not is_factory_spec(spec):
        raise FactoryError(f"{spec!r}: expected module:factory, e.g. my_engine.sched:make")
    module_name, _, attr = spec.partition(":")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        # Only a missing module named by the spec is "not found"; a missing import inside
        # the user's module is their module failing to import.
        if e.name is not None and (module_name == e.name
                                   or module_name.startswith(e.name + ".")):
            raise FactoryError(f"{spec}: no module named {e.name!r} (searched sys.path and "
                               "the current directory; set PYTHONPATH)") from None
        raise FactoryError(f"{spec}: importing {module_name} failed: "
                           f"{type(e).__name__}: {e}") from None
    except Exception as e:  # the user's module raised while importing: still one line
        raise FactoryError(f"{spec}: importing {module_name} failed: "
                           f"{type(e).__name__}: {_first_line(e)}") from None
    target: object = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise FactoryError(f"{spec}: module {module_name} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise FactoryError(f"{spec}: {attr} is a {type(target).__name__}, not callable; "
                           "expected a function taking a Config and returning a scheduler")
    factory: SchedulerFactory = target
    return factory


def build(factory: SchedulerFactory, config: Config, spec: str) -> Scheduler:
    """Call the factory; refuse a result without the scheduler interface.

    Exceptions the factory raises propagate, for the caller to name: kvsched diff and
    kvsched fuzz call it bad input, as no scheduler was built.
    """
    scheduler = factory(config)
    missing = [m for m in INTERFACE_METHODS if not callable(getattr(scheduler, m, None))]
    if not hasattr(scheduler, "config"):
        missing.append("config")
    if missing:
        raise FactoryError(f"{spec} returned a {type(scheduler).__name__}, which lacks "
                           f"{', '.join(missing)} (the kvsched.spec.interface.Scheduler "
                           "interface)")
    return scheduler


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""
