from collections.abc import Callable
from typing import Any

from kvsched.optimized.facts import RunFacts
from kvsched.spec.checker import Position
from kvsched.spec.model import Config, Status

MAX_BLOCKS: int
PHASES: tuple[str, ...]

def read_alike(obj: Any, raw: bytes, size: int, dumps: Any) -> bool: ...

class FastState:
    config: Config
    usable: bool
    free: int
    free_host: int
    leaked: int
    steps_with_free: int
    step_no: int
    quiet: int
    ids_seen: bool
    ids_missing_from: int
    steps: int
    entries: int
    requests: int
    ended: dict[str, Status]
    unknown: dict[str, int]
    clock: float

    def __init__(self, config: Config, max_preemptions: int, preempted_order: bool,
                 arrived: Callable[[str], str], facts: bool = False) -> None: ...
    def restore(self, p: Position) -> None: ...
    def position(self) -> Position: ...
    def save(self, into: FastState) -> None: ...
    def take_counts(self) -> tuple[int, int, int]: ...
    def take_ended(self) -> dict[str, Status]: ...
    def apply(self, obj: Any, line: int) -> int: ...
    def apply_lines(self, raws: list[bytes], i: int, line: int,
                    run: list[tuple[int, Any, bytes]], limit: int,
                    loads: Callable[[bytes], Any], dumps: Callable[[Any], bytes]
                    ) -> tuple[int, Any]: ...
    def take_facts(self) -> RunFacts: ...
    def clear_facts(self) -> None: ...
    def last_samples(self) -> list[tuple[str, int, float]]: ...
