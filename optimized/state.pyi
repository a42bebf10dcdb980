from array import array
from collections.abc import Callable
from typing import Any

from kvsched.spec.checker import Position
from kvsched.spec.model import Config, Status

MAX_BLOCKS: int
PHASES: tuple[str, ...]

def read_alike(obj: Any, raw: bytes, size: int, dumps: Any) -> bool: ...

class RunFacts:
    generated: array[int]
    computed: array[int]
    victims: array[int]
    waiting: array[int]
    running: array[int]
    swapped: array[int]
    kv_used: array[int]
    prompt_tokens: int
    swap_ins: int
    evicted: int
    recomputes: int
    swaps: int
    recomputed: int
    clock: float
    untimed: int
    arrivals: list[str]
    arrival_steps: array[int]
    arrival_clocks: array[float]
    admissions: list[str]
    admission_known: array[int]
    admission_hit: array[int]
    first_tokens: list[str]
    first_steps: array[int]
    first_clocks: array[float]
    aborted: list[str]
    rejected: list[str]
    finishes: list[str]
    finish_steps: array[int]
    finish_outputs: array[int]
    finish_clocks: array[float]

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
