"""`kvsched simulate`: run a scheduler on a workload; its metrics, and a trace v1 with
--out.

Loaded when the command is named (kvsched.cli.Group). kvsched.implementations picks the
scheduler. Each kind is driven by one short function, and every one yields the same
thing, a stretch of steps as (steps, requests ended), after handing the stretch to the
trace, the checker and the metrics (`Run`): the compiled scheduler's own loop (its trace
lines and the facts of their steps, which it counts as it decides, for the metrics; or
its StepRecords beside a checker), and any other through kvsched.simulate.run.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson
from rich.text import Text

from kvsched import __version__
from kvsched.commands.options import (
    POSITIVE,
    PROFILE,
    WORKLOAD_PARAMS,
    atomic_output,
    build_config,
    config_options,
    dumps_line,
    err,
    fail,
    load_workload,
    metrics_table,
    new_checker,
    out,
    profile_note,
    progress_option,
    stall_option,
    workload_options,
)
from kvsched.implementations import (
    SCHEDULER_ALIASES,
    SCHEDULERS,
    Unavailable,
    chosen_scheduler,
    new_scheduler,
)
from kvsched.outputs import check_writable
from kvsched.progress import Reporter
from kvsched.spec.interface import NoAborts
from kvsched.spec.knobs import GROW_CHECKS, REJECT_AT, SWAPPED_ORDERS, VICTIMS, Knobs
from kvsched.spec.profiles import DEFAULT_PROFILE, get_profile
from kvsched.spec.step_kinds import STEP_KINDS, knob_option_refusal, knobs_read
from kvsched.spec.trace import TraceWriter
from kvsched.spec.violation import Stalled

if TYPE_CHECKING:
    from kvsched.metrics import MetricsCollector
    from kvsched.optimized.compiled import CompiledScheduler
    from kvsched.spec.checker import Checker
    from kvsched.spec.interface import Scheduler
    from kvsched.workload import WorkItem

# The options that override one of the profile's knobs: vLLM v1's (Knobs' own fields) or
# V0's (V0Knobs, Knobs.v0), whichever the profile's step kind reads; one of the other
# kind's is refused (kvsched.spec.step_kinds.knob_option_refusal).
KNOB_OPTIONS = ("victim", "admit_after_preempt", "reserve_full_sequence",
                "lift_threshold_when_alone", "continue_after_self_preemption", "grow_check",
                "reject", "chunk_swap_in", "swapped_order")
# The options of `auto` preemption's cost model, and the field each sets (the cost of
# the knobs the profile's step reads: Knobs.cost, or V0Knobs.cost).
COST_OPTIONS = {"swap_bytes_per_block": "bytes_per_block", "host_bandwidth": "host_bandwidth",
                "prefill_tokens_per_s": "prefill_tokens_per_s"}

# A stretch of a run: its steps, and the requests that ended in them.
Stretches = Iterator[tuple[int, int]]


class SchedulerChoice(click.Choice[str]):
    """--scheduler's choices; a former name (SCHEDULER_ALIASES) is accepted unlisted."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if value in SCHEDULER_ALIASES:
            return value
        return super().convert(value, param, ctx)


@dataclass
class Run:
    """One run: the scheduler and its workload, and what each step goes to."""

    implementation: str
    scheduler: Scheduler
    workload: Collection[WorkItem]  # a generated one is made as the run reads it
    block_ids: bool
    max_steps: int | None
    stall_steps: int
    writer: TraceWriter | None
    checker: Checker | None
    collector: MetricsCollector

    def stretches(self) -> Stretches:
        """The run, by the function for its kind of scheduler."""
        if self.implementation != "compiled":
            return records(self)
        from kvsched.optimized.compiled import CompiledScheduler

        assert isinstance(self.scheduler, CompiledScheduler)
        if self.checker is None:
            return compiled_lines(self, self.scheduler)
        return compiled_records(self, self.scheduler)


def records(run: Run) -> Stretches:
    """Any scheduler, through kvsched.simulate.run: each StepRecord to the trace, the
    checker and the metrics (on the checker's state, so that a step moves it once)."""
    from kvsched.simulate import run as simulation

    for rec in simulation(run.scheduler, run.workload, block_ids=run.block_ids,
                          max_steps=run.max_steps, stall_steps=run.stall_steps):
        if run.writer is not None:
            run.writer.step(rec)
        if run.checker is not None:
            run.collector.observe(rec, run.checker.step(rec))
        else:
            run.collector.step(rec)
        yield 1, rec.num_ended


def compiled_lines(run: Run, scheduler: CompiledScheduler) -> Stretches:
    """The compiled scheduler's own loop where nothing needs the StepRecords: its trace
    lines (as dumps_line encodes them), a block of steps at a time, to the trace, and
    the facts of the block's steps, which it counts off its decisions as the compiled
    state would off those lines (kvsched.optimized.facts.RunFacts), to the metrics:
    nothing is read back."""
    from kvsched.optimized.compiled import simulate as compiled_simulate

    run.collector.live = lambda: len(scheduler.states())
    for block, count, ended, facts in compiled_simulate(
            scheduler, run.workload, run.block_ids, run.max_steps, lines=True,
            stall_steps=run.stall_steps, facts=True):
        if run.writer is not None:
            run.writer.encoded(block)
        assert facts is not None
        run.collector.observe_run(facts)
        yield count, ended


def compiled_records(run: Run, scheduler: CompiledScheduler) -> Stretches:
    """The compiled scheduler's own loop beside a checker: each StepRecord to the trace,
    the checker and the metrics (on the checker's state)."""
    from kvsched.optimized.compiled import simulate as compiled_simulate

    assert run.checker is not None
    for rec in compiled_simulate(scheduler, run.workload, run.block_ids, run.max_steps,
                                 stall_steps=run.stall_steps):
        if run.writer is not None:
            run.writer.step(rec)
        run.collector.observe(rec, run.checker.step(rec))
        yield 1, rec.num_ended


def drive(run: Run, progress: bool | None) -> tuple[int, int, Stalled | None]:
    """The run's steps and ended requests, and why it got stuck (None: it did not)."""
    steps = ended = 0
    with Reporter("simulating", len(run.workload), err, progress, unit="requests") as bar:
        try:
            for count, now in run.stretches():
                steps += count
                if now:
                    ended += now
                    bar.set(ended)
        except Stalled as e:  # the steps so far stay: the trace ends where it stuck
            return steps, ended, e
        except NoAborts as e:  # a workload's abort, a scheduler that does not model it
            fail(str(e))
    return steps, ended, None


def run_knobs(profile: str, given: dict[str, Any]) -> Knobs:
    """The profile's knobs with the overrides and the cost model `given` (by option
    name, KNOB_OPTIONS and COST_OPTIONS; None: not given), set in the knobs the profile's
    step kind reads (Knobs' own fields, or Knobs.v0); a knob that step does not read is
    refused in one line (exit 2), whatever its value."""
    chosen = get_profile(profile)
    overrides: dict[str, Any] = {k: given[k] for k in KNOB_OPTIONS if given[k] is not None}
    cost = {field: given[option] for option, field in COST_OPTIONS.items()
            if given[option] is not None}
    if cost:
        overrides["cost"] = cost
    for name, value in overrides.items():
        shown = ", ".join(f"{k}={v}" for k, v in cost.items()) if name == "cost" else value
        why = knob_option_refusal(chosen.scheduler, name, shown)
        if why is not None:
            fail(f"profile {chosen.name}: {why}")
    if not overrides:
        return chosen.knobs
    read: Any = knobs_read(chosen.scheduler, chosen.knobs)
    if cost:
        overrides["cost"] = replace(read.cost, **cost)
    where = STEP_KINDS[chosen.scheduler].knobs_field
    if where:
        return replace(chosen.knobs, **{where: replace(read, **overrides)})
    knobs: Knobs = replace(read, **overrides)
    return knobs


@click.command()
@config_options
@click.option("--profile", default=DEFAULT_PROFILE, show_default=True,
              type=PROFILE, help="Named set of policy knobs: a profile or a release "
                                 "(vllm-v1@0.27.1; see kvsched profiles).")
@click.option("--victim", type=click.Choice(VICTIMS),
              help="Override the profile's victim choice.")
@click.option("--admit-after-preempt/--no-admit-after-preempt", default=None,
              help="Override: admit in a step that preempted.")
@click.option("--reserve-full-sequence/--no-reserve-full-sequence", default=None,
              help="Override: admission needs the whole sequence to fit.")
@click.option("--lift-threshold-when-alone/--keep-threshold-when-alone", default=None,
              help="Override: no long-prefill cap for a lone request.")
@click.option("--continue-after-self-preemption/--stop-after-self-preemption", default=None,
              help="Override: the running pass goes on after a request preempts itself.")
@click.option("--grow-check", type=click.Choice(GROW_CHECKS),
              help="Override, vLLM V0's step only (V0Knobs): what a running request's chunk "
                   "must find free (V0's: worst_case).")
@click.option("--reject", type=click.Choice(REJECT_AT),
              help="Override, vLLM V0's step only: reject on arrival, or when a pass "
                   "reaches a request that can never be admitted (V0's: admission).")
@click.option("--chunk-swap-in/--whole-swap-in", default=None,
              help="Override, vLLM V0's step only: a swapped partial prefill may come "
                   "back in chunks (V0's: whole).")
@click.option("--swapped-order", type=click.Choice(SWAPPED_ORDERS),
              help="Override, vLLM V0's step only: swapped requests come back in policy "
                   "or swap-out order (V0's: swap_out).")
@click.option("--swap-bytes-per-block", type=click.IntRange(min=1),
              help="Auto preemption: bytes per KV block.")
@click.option("--host-bandwidth", type=POSITIVE, help="Auto preemption: host link bytes/s.")
@click.option("--prefill-tokens-per-s", type=POSITIVE,
              help="Auto preemption: recompute speed.")
@workload_options
@click.option("--out", "out_path", type=click.Path(path_type=Path), default=None,
              help="Write the trace here (JSON Lines).")
@click.option("--no-block-ids", is_flag=True, help="Leave new_blocks out of the trace.")
@click.option("--max-steps", type=int, default=None, help="Stop after this many steps.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@progress_option
@click.option("--scheduler", "choice",
              type=SchedulerChoice(["auto", *SCHEDULERS]), default="auto",
              show_default=True,
              help="Which scheduler decides (the same decisions): auto takes the fastest "
                   "installed one that implements the profile (compiled, else the "
                   "reference; torch on --device cuda).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu",
              show_default=True, help="Where the torch scheduler keeps its tensors.")
@click.option("--check/--no-check", "self_check", default=False, show_default=True,
              help="Also check the run with the spec's checker as it goes (kvsched check "
                   "on the trace gives the same verdict).")
@stall_option
def simulate(profile: str, out_path: Path | None, no_block_ids: bool,
             max_steps: int | None, fmt: str, progress: bool | None, choice: str,
             device: str, self_check: bool, stall_steps: int, **given: Any) -> None:
    """Run a scheduler on a workload: its metrics, and a trace v1 with --out.

    The scheduler is the fastest installed one that implements the profile (the
    compiled scheduler, else the reference; --scheduler picks one), named in the
    summary and the trace's header; all make the same decisions. A run that gets stuck
    (--stall-steps steps in a row change nothing while requests wait) stops there with
    one line naming the waiting requests and why, exit 1; its trace ends there, without
    an end line.
    """
    from kvsched.metrics import MetricsCollector
    from kvsched.optimized.memory import no_cycle_collection

    profile_note(profile)
    knobs_given = {k: given.pop(k) for k in (*KNOB_OPTIONS, *COST_OPTIONS)}
    workload_given = {k: given.pop(k) for k in WORKLOAD_PARAMS}
    config = build_config(profile, given)  # what is left: one option per Config field
    knobs = run_knobs(profile, knobs_given)
    if max_steps is not None and max_steps < 1:
        fail(f"--max-steps must be at least 1, got {max_steps}")
    if out_path is not None:
        check_writable(out_path)  # before the run, not after it
    workload = load_workload(config.max_model_len, **workload_given, policy=config.policy)

    kind = get_profile(profile).scheduler
    implementation = chosen_scheduler(choice, config, knobs, kind, device)
    try:
        scheduler = new_scheduler(choice, implementation, config, knobs, kind, device)
    except Unavailable as e:
        fail(str(e))
    checker = new_checker(config, stall_steps=stall_steps) if self_check else None
    # The metrics follow the spec's state (the checker's, when it checks), or the facts
    # the compiled scheduler counts of its own steps (compiled_lines).
    collector = MetricsCollector(config, series=False,
                                 state=checker.state if checker is not None else None)
    engine = {"name": f"kvsched-{implementation}", "version": __version__, "profile": profile}
    if implementation == "torch":
        engine["device"] = device
    extra = {"knobs": {k: v for k, v in asdict(knobs).items() if k != "cost"}
             | {"cost": asdict(knobs.cost)}}

    def run(writer: TraceWriter | None) -> tuple[int, int, Stalled | None]:
        return drive(Run(implementation, scheduler, workload, not no_block_ids, max_steps,
                         stall_steps, writer, checker, collector), progress)

    # A run's objects hold no cycles: the collector would only walk them again and again.
    with no_cycle_collection():
        if out_path is not None:
            with atomic_output(out_path) as stream:
                writer = TraceWriter(stream, dumps_line)
                writer.header(config, engine, extra)
                steps, ended, stalled = run(writer)
                if ended == len(workload):
                    writer.end()
        else:
            steps, ended, stalled = run(None)
    complete = ended == len(workload)
    report = checker.end(complete) if checker is not None else None
    metrics = collector.result()
    # A MUST violation (or a profile divergence) of its own run fails it, as check does.
    broke = report is not None and report.errors() > 0
    if fmt == "json":
        sys.stdout.write(orjson.dumps({
            "config": asdict(config), "profile": profile, "scheduler": implementation,
            "steps": steps, "requests": len(workload), "complete": complete,
            "stuck": None if stalled is None else stalled.violation.as_dict(),
            "trace": None if out_path is None else str(out_path), "metrics": metrics.as_dict(),
            "violations": None if report is None else
            {k: n for k, n in sorted(report.counts.items())},
        }, option=orjson.OPT_INDENT_2).decode() + "\n")
        if stalled is not None or broke:
            sys.exit(1)
        return
    ending = " (stuck)" if stalled is not None else "" if complete else \
        f" (stopped at --max-steps {max_steps})"
    out.print(metrics_table(f"kvsched simulate: {profile} on the {implementation} scheduler, "
                            f"{len(workload)} requests, {steps} steps" + ending, metrics))
    if out_path is not None:
        out.print(f"trace written to {out_path}")
    if report is not None and report.counts:
        out.print(f"the {implementation} scheduler broke invariants on its own run: "
                  + ", ".join(f"{k} x{n}" for k, n in sorted(report.counts.items())))
    elif report is not None:
        out.print(f"checked as it ran: no invariant broken ({report.steps} steps)")
    if stalled is not None:
        from kvsched.verdict import printable  # here: a run that ends well does not load it

        err.print(Text(f"kvsched: the {implementation} scheduler is {printable(str(stalled))}"
                       f" (progress; --stall-steps {stall_steps})"))
    if stalled is not None or broke:
        sys.exit(1)
