"""What a run of steps did, in columns: the facts kvsched.metrics.MetricsCollector reads
(`observe_run`) from the two compiled producers of steps, so that every metric has one
definition whoever counts its facts.

- The compiled state (kvsched.optimized.state.FastState, made with `facts`) counts them
  off the trace lines it applies, as the spec's State would derive StepFacts from them
  (`kvsched check`, `kvsched metrics`, the suites).
- The compiled scheduler's own simulation (kvsched.optimized.compiled.simulate with
  `facts`) counts them off its decisions as it writes the lines, so that `kvsched
  simulate` does not read back what it wrote; tests/test_compiled.py holds its metrics
  to those the spec's state derives from its records.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

__all__ = ["RunFacts"]


@dataclass(slots=True, eq=False)
class RunFacts:
    """Per step (one entry per step): tokens sampled (`generated`) and computed,
    victims, the waiting, running and swapped queues after the step and the GPU blocks
    held while its batch ran (`kv_used`: num_gpu_blocks - free_blocks + what the
    finishes released when the step reports free_blocks, else num_gpu_blocks - the free
    blocks before the finishes). Over the run: prompt tokens computed, swap-ins, cached
    blocks handed out again (`evicted`), recompute and swap victims and the tokens the
    recompute victims had computed; `clock`, the ms at the end of the run (the sum of
    time_ms), and `untimed`, the first step without time_ms (-1: none). Per request, in
    the order they happened: arrivals (id, step, ms at the step's start); admissions of
    waiting requests (id, N known, prefix hit tokens), with prefix caching; first tokens
    (id, step, ms at the step's end); aborted and rejected ids; finishes (id, step,
    outputs, ms at the step's end: a finished request sampled in its last step)."""

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
