"""`make bench`: `auto` preemption with its cost model calibrated on this machine,
against recompute and swap, side by side in one run.

    python -m tools.bench_cost --out docs/benchmarks.md    (its section of the file)
    python -m tools.bench_cost                             (printed only)

`kvsched calibrate` measures bytes per block, host bandwidth and prefill tokens per
second; then `kvsched simulate` (the reference scheduler) runs one workload that runs
short of GPU blocks and has host blocks to swap to, with `--preemption recompute`,
`swap`, `auto` at the built-in costs and `auto` at the calibrated ones. Each run's
trace is read back through the spec's state for what the summary does not give: the
blocks each swap moved, and each victim's computed tokens per held block.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kvsched.spec.knobs import CostModel
from kvsched.spec.state import State
from kvsched.spec.trace import TraceReader

START = "<!-- bench_cost: start -->"
END = "<!-- bench_cost: end -->"

# The default calibration shape (see `kvsched calibrate --help`), one torch thread: on a
# shared machine intra-op threads mostly wait on each other's cores.
CALIBRATE = ("--threads", "1")
# 500 ShareGPT-like requests at one a step on 256 GPU blocks (4k tokens of KV) and as many
# host blocks: the running requests outgrow the cache, so victims are preempted.
WORKLOAD = ("--profile", "vllm-v1-no-prefix-caching", "--num-gpu-blocks", "256",
            "--num-cpu-blocks", "256", "--max-num-seqs", "32", "--max-model-len", "2048",
            "--requests", "500", "--rate", "1", "--seed", "0")


class KvschedFailed(RuntimeError):
    """A kvsched command exited non-zero."""


def kvsched(*args: str) -> str:
    """Run `kvsched ARGS` with this Python; its standard output."""
    done = subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise KvschedFailed(f"kvsched {' '.join(args)}: exit {done.returncode}: "
                            f"{done.stderr.strip()}")
    return done.stdout


def cost_flags(cost: CostModel) -> list[str]:
    return ["--swap-bytes-per-block", str(cost.bytes_per_block),
            "--host-bandwidth", repr(cost.host_bandwidth),
            "--prefill-tokens-per-s", repr(cost.prefill_tokens_per_s)]


@dataclass(frozen=True)
class VictimView:
    """One preemption as the trace shows it."""

    mode: str
    held: int  # G before it
    computed: int  # C before it
    free_host: int  # free host blocks before it


@dataclass(frozen=True)
class Outcome:
    """One `kvsched simulate` run: its summary's figures, and its victims."""

    label: str
    preemption: str
    steps: int
    complete: bool
    violations: int
    recomputes: int
    swaps: int
    swap_ins: int
    recomputed_tokens: int
    victims: tuple[VictimView, ...]
    step_lines: tuple[str, ...]  # the trace after its header (which names the mode)

    @property
    def preemptions(self) -> int:
        return self.recomputes + self.swaps

    @property
    def swapped_blocks(self) -> int:
        return sum(v.held for v in self.victims if v.mode == "swap")

    def figures(self) -> tuple[int, int, int, int, int, int]:
        """What the comparison compares: equal for runs that decided alike."""
        return (self.steps, self.preemptions, self.swaps, self.recomputes,
                self.recomputed_tokens, self.swapped_blocks)

    def modeled_seconds(self, cost: CostModel) -> float:
        """The preemptions' time at `cost`: the swaps' blocks out and back in, the
        recomputes' tokens prefilled again."""
        return cost.swap_seconds(self.swapped_blocks) + cost.recompute_seconds(
            self.recomputed_tokens)


def victims(trace: Path) -> tuple[tuple[VictimView, ...], tuple[str, ...]]:
    """Every preemption of `trace`, in order, and its step lines."""
    with trace.open("rb") as stream:
        reader = TraceReader(stream)
        state = State(reader.header.config)
        seen = [VictimView(v.mode, v.held, v.computed, v.free_host)
                for rec in reader for v in state.apply(rec).valid_victims]
    return tuple(seen), tuple(trace.read_text().splitlines()[1:])


def simulate(label: str, preemption: str, workload: Sequence[str], cost: CostModel | None,
             trace: Path) -> Outcome:
    """`kvsched simulate WORKLOAD --preemption PREEMPTION` (with `cost`'s flags), its
    trace written to `trace` and read back."""
    flags = [*workload, "--preemption", preemption, *(cost_flags(cost) if cost else [])]
    summary = json.loads(kvsched("simulate", *flags, "--check", "--format", "json", "--out",
                                 str(trace)))
    m = summary["metrics"]
    seen, lines = victims(trace)
    return Outcome(label, preemption, summary["steps"], summary["complete"],
                   sum(summary["violations"].values()), m["preemptions"].get("recompute", 0),
                   m["preemptions"].get("swap", 0), m["swap_ins"], m["recomputed_tokens"],
                   seen, lines)


def compare(workload: Sequence[str], calibrated: CostModel, tmp: Path) -> list[Outcome]:
    """The workload under recompute, swap, auto at the built-in costs and auto at
    `calibrated`, one after the other."""
    runs: list[tuple[str, str, CostModel | None]] = [
        ("recompute", "recompute", None), ("swap", "swap", None),
        ("auto, built-in costs", "auto", CostModel()), ("auto, calibrated", "auto", calibrated)]
    return [simulate(label, mode, workload, cost, tmp / f"{i}.jsonl")
            for i, (label, mode, cost) in enumerate(runs)]


def calibrate(flags: Sequence[str]) -> dict[str, Any]:
    """`kvsched calibrate FLAGS --format json`."""
    result: dict[str, Any] = json.loads(kvsched("calibrate", *flags, "--format", "json"))
    return result


def cost_of(calibration: dict[str, Any]) -> CostModel:
    """The cost model of the `kvsched simulate` flags the calibration printed (rounded
    as printed, so that the run and the docs' command agree)."""
    flags = calibration["simulate_flags"]
    given = dict(zip(flags[::2], flags[1::2], strict=True))
    return CostModel(int(given["--swap-bytes-per-block"]), float(given["--host-bandwidth"]),
                     float(given["--prefill-tokens-per-s"]))


def victims_sentence(o: Outcome, cost: CostModel) -> str:
    """Where the run's victims stood against the crossover, and what auto made of it."""
    if not o.victims:
        return "It preempted nothing."
    per_block = [v.computed / v.held for v in o.victims if v.held]
    preferred = [v for v in o.victims if cost.prefers_swap(v.held, v.computed)]
    no_room = sum(1 for v in preferred if v.held > v.free_host)
    crossover = cost.crossover
    return (f"Its {len(o.victims):,} victims held {min(per_block):.1f} to "
            f"{max(per_block):.1f} computed tokens per block (median "
            f"{statistics.median(per_block):.1f}); the calibrated cost model preferred swap "
            f"for {len(preferred):,} of them, and {no_room:,} of those were recomputed all "
            "the same, the free host blocks being too few. For auto to recompute even the "
            "thinnest of these victims, the crossover would have to be at least "
            f"{min(per_block):.1f} tokens per block, {min(per_block) / crossover:,.0f} times "
            "the calibrated one "
            "(prefill that much faster against the copy).")


def ratio_sentence(recompute: Outcome, swap: Outcome, cost: CostModel) -> str:
    """Recompute's preemption time against swap's, at `cost`."""
    r, w = recompute.modeled_seconds(cost), swap.modeled_seconds(cost)
    if not r or not w:
        return ""
    return (f"At the calibrated costs the preemptions of `recompute` take {r / w:,.1f} times "
            "the time of those of `swap`.")


COLUMNS = ("preemption", "steps", "preemptions", "swaps", "recomputes", "swap-ins",
           "recomputed tokens", "blocks swapped out",
           "preemption time at the calibrated costs (s)")


def render(calibration: dict[str, Any], outcomes: Sequence[Outcome], command: str,
           machine: str) -> str:
    """The Markdown section, between its markers."""
    cost = cost_of(calibration)
    s = calibration["shape"]
    rows = "\n".join(
        f"| {o.label} | {o.steps:,} | {o.preemptions:,} | {o.swaps:,} | {o.recomputes:,} | "
        f"{o.swap_ins:,} | {o.recomputed_tokens:,} | {o.swapped_blocks:,} | "
        f"{o.modeled_seconds(cost):.3g} |" for o in outcomes)
    by_label = {o.label: o for o in outcomes}
    auto, swap, recompute = (by_label["auto, calibrated"], by_label["swap"],
                             by_label["recompute"])
    same = ("the same trace as `swap`, step for step" if auto.step_lines == swap.step_lines
            else "the same trace as `recompute`, step for step"
            if auto.step_lines == recompute.step_lines
            else "a trace of its own, neither `swap`'s nor `recompute`'s")
    notes = "".join(f"\n- {n}" for n in calibration["notes"])
    bad = sum(o.violations for o in outcomes)
    incomplete = [o.label for o in outcomes if not o.complete]
    ended = ("All runs completed" if not incomplete
             else "All runs completed except " + ", ".join(incomplete))
    builtin = CostModel()
    builtin_crossover = builtin.crossover
    return f"""{START}
## `auto` preemption: the cost model calibrated on this machine

Measured by `{command}` (in `make bench`) on {datetime.now(UTC):%Y-%m-%d}.
Machine: {machine}.

`kvsched calibrate {' '.join(CALIBRATE)}`, on {calibration['device']}: the default shape
({s['layers']} layers, {s['heads']} heads of {s['head_dim']} dims, {s['kv_heads']} of them
KV heads, {s['dtype']}, {s['block_size']}-token blocks), {calibration['blocks']} blocks
copied out and back, a {calibration['tokens']}-token prompt, medians of
{calibration['repeats']} rounds, one torch thread (steadier where the cores are shared
with other jobs: intra-op threads then mostly wait on each other). The absolute figures
move from run to run with the machine's load; the crossover is their ratio.

| bytes per block | host bandwidth | prefill tokens / s | crossover (computed tokens per block) |
|---:|---:|---:|---:|
| {calibration['bytes_per_block']:,} | {calibration['host_bandwidth'] / 1e9:.3g} GB/s \
| {calibration['prefill_tokens_per_s']:,.0f} | {calibration['crossover_tokens_per_block']:.3g} |
{notes}

`auto` swaps a victim when its computed tokens per held block are above the crossover.
The built-in costs (`CostModel()`: a 2 MiB block of a Llama-3-8B-like model, 25 GB/s,
10,000 prefill tokens per second) put it at {builtin_crossover:.3g}.

Then `kvsched simulate {' '.join(WORKLOAD)} --preemption MODE`, one run after the other,
each `auto` run with the cost flags of its cost model (the calibrated ones as `kvsched
calibrate` prints them). The last column is the preemptions' time at the calibrated
costs: the swapped blocks out and back in, the recomputed tokens prefilled again.

| {' | '.join(COLUMNS)} |
|---|{'---:|' * (len(COLUMNS) - 1)}
{rows}

`auto` with the calibrated costs wrote {same}. {victims_sentence(auto, cost)}
{ratio_sentence(recompute, swap, cost)}
A victim that does not fit in the free host blocks is recomputed in every mode, which
is why `swap` recomputes too. The simulation's clock is the step: a recompute pays
again in later steps' token budgets, a swap costs no step (the copy's time is not
simulated), so steps favour swap; the last column is where a swap pays. {ended}, with
{bad} MUST violations.
{END}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_cost")
    parser.add_argument("--out", type=Path, default=None,
                        help="put the section in this Markdown file (default: print it)")
    args = parser.parse_args(argv)
    print(f"kvsched calibrate {' '.join(CALIBRATE)} ...", flush=True)
    calibration = calibrate(CALIBRATE)
    cost = cost_of(calibration)
    print(f"  crossover {calibration['crossover_tokens_per_block']:.3g} tokens per block",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        outcomes = compare(WORKLOAD, cost, Path(tmp))
    for o in outcomes:
        print(f"  {o.label}: {o.steps:,} steps, {o.swaps} swaps, {o.recomputes} recomputes, "
              f"{o.recomputed_tokens:,} tokens recomputed", flush=True)
    from tools.bench import machine

    text = render(calibration, outcomes, "python -m tools.bench_cost", machine())
    from tools.bench_optimized import publish

    publish(text, args.out, START, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
