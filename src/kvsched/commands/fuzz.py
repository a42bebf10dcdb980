"""`kvsched fuzz MOD:FACTORY`: drawn workloads against a user's scheduler.

Loaded when the command is named (kvsched.cli.Group).
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson
from rich.table import Table
from rich.text import Text

from kvsched.commands.options import (
    DEFAULT_CONFIG,
    POSITIVE,
    PROFILE,
    atomic_output,
    config_options,
    dumps_line,
    err,
    fail,
    on_ray,
    out,
    profile_note,
    progress_option,
    ray_options,
    stall_option,
    starve_option,
)
from kvsched.fuzz import DEFAULT_EXAMPLE_SECONDS, DEFAULT_SHARD_EXAMPLES, unpinned
from kvsched.outputs import check_writable, in_place
from kvsched.progress import Reporter
from kvsched.spec.profiles import DEFAULT_PROFILE, get_profile
from kvsched.spec.violation import DEFAULT_STALL_STEPS, DEFAULT_STARVE_STEPS
from kvsched.verdict import printable

if TYPE_CHECKING:
    pass


def pinned_flags(pinned: dict[str, Any]) -> list[str]:
    """The config options that pin these fields."""
    out: list[str] = []
    for name, value in pinned.items():
        flag = name.replace("_", "-")
        if isinstance(value, bool):
            out.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            out += [f"--{flag}", str(value)]
    return out


@click.command("fuzz")
@click.argument("factory")
@config_options(defaults=unpinned)
@click.option("--examples", type=int, default=200, show_default=True,
              help="Most workloads to draw before shrinking.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the draws (the same seed draws the same examples).")
@click.option("--out", "out_path", type=click.Path(path_type=Path),
              default=Path("fuzz-minimal.jsonl"), show_default=True,
              help="Where to write the minimal failing workload (its config goes beside "
                   "it, as NAME.config.json).")
@click.option("--profile", type=PROFILE, default=None,
              help="Also require the decisions of this reference profile (a profile or "
                   "a release: vllm-v1@0.27.1; see kvsched profiles).")
@click.option("--strict", is_flag=True, help="SHOULD warnings fail too.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.option("--shard-examples", type=int, default=DEFAULT_SHARD_EXAMPLES, show_default=True,
              metavar="N",
              help="Split the campaign into shards of N examples, each a search of its own "
                   "(shard 0 with --seed, the others with seeds derived from it); on Ray "
                   "the shards run side by side.")
@click.option("--junit", "junit_path", type=click.Path(path_type=Path), default=None,
              help="Also write a JUnit XML report: one testcase per shard.")
@stall_option
@starve_option
@click.option("--example-timeout", type=POSITIVE,
              default=DEFAULT_EXAMPLE_SECONDS, show_default=True, metavar="SECONDS",
              help="Wall-clock limit of one example (the factory and the run): past it the "
                   "example is a finding (time-limit), not shrunk.")
@ray_options("campaign's shards")
@progress_option
def fuzz_command(factory: str, examples: int, seed: int, out_path: Path,
                 profile: str | None, strict: bool, fmt: str, shard_examples: int,
                 junit_path: Path | None, stall_steps: int, starve_steps: int,
                 example_timeout: float,
                 workers: int | None, use_ray: bool, ray_address: str | None,
                 progress: bool | None, **config_given: Any) -> None:
    """Fuzz a scheduler (module:factory) with hypothesis-drawn workloads.

    Each example draws a small config (the config options given pin those fields;
    allocation and watermark scope are vLLM v1's, lazy and running, unless given)
    and a workload for it, runs FACTORY(config) through the simulation loop and
    checks every step against the spec's MUST invariants (and --profile, --strict).
    A run that cannot end fails too, strict or not: stuck for --stall-steps steps
    (progress), still going at its step bound, or past --example-timeout.
    The examples are drawn in shards (--shard-examples), in order; the first shard that
    finds a failure shrinks it to a minimal workload, written to --out with its config
    beside it, and ends the campaign. With --workers or --ray the shards run on Ray, with
    the same outcome.

    \b
    kvsched fuzz my_engine.sched:make --examples 500
    kvsched fuzz my_engine.sched:make --preemption recompute --num-cpu-blocks 0
    kvsched fuzz my_engine.sched:make --examples 2000 --workers 8

    \b
    Exit codes: 0 nothing failed, 1 a failing workload was found, 2 bad input, 3 a
    shard was not run to its end (its Ray worker died or its node was lost).
    """
    from functools import partial

    from kvsched.fuzz import (
        Campaign,
        FuzzUnavailable,
        NoValidConfig,
        RunLimits,
        ShardOutcome,
        config_flags,
        fuzz_shard,
        plan,
    )
    from kvsched.junit import fuzz_junit_xml
    from kvsched.loading import FactoryError, load_factory
    from kvsched.workload import item_dict

    profile_note(profile)
    if examples < 1:
        fail(f"--examples must be at least 1, got {examples}")
    if shard_examples < 1:
        fail(f"--shard-examples must be at least 1, got {shard_examples}")
    pinned = {k: v for k, v in config_given.items() if v is not None}
    for name, value in pinned.items():
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            fail(f"--{name.replace('_', '-')} must not be negative, got {value}")
    if profile is not None:  # a pinned field the profile's step would silently ignore
        named = get_profile(profile)
        ignored = named.refusal(named.configure(replace(DEFAULT_CONFIG, **pinned),
                                                frozenset(pinned)))
        if ignored is not None:
            fail(ignored)
    for path in (out_path, junit_path):
        if path is not None:
            check_writable(path)  # before the campaign, not after it
    if not in_place(out_path):
        check_writable(out_path.with_suffix(".config.json"))  # its sidecar
    try:
        load_factory(factory)  # here first: a spec that does not load is bad input
    except FactoryError as e:
        fail(str(e))

    shards = plan(examples, seed, shard_examples)
    outcomes: list[ShardOutcome] = []
    with on_ray(use_ray, workers, ray_address) as ex:
        limits = RunLimits(stall_steps, example_timeout, starve_steps)
        pieces = [partial(fuzz_shard, factory, shard, pinned, profile, strict, limits)
                  for shard in shards]
        with Reporter("fuzzing", len(shards), err, progress, unit="shards") as bar:
            try:
                for outcome in ex.run(pieces, stop=lambda r: r.finding is not None,
                                      on_done=lambda _: bar.advance(1)):
                    sys.stdout.write(outcome.stdout)
                    sys.stderr.write(outcome.stderr)
                    outcomes.append(ShardOutcome(shards[outcome.index], outcome.value,
                                                 outcome.lost))
            except (FactoryError, FuzzUnavailable, NoValidConfig) as e:
                fail(str(e))
    campaign = Campaign(tuple(shards), tuple(outcomes))
    found = campaign.found
    finding = campaign.finding
    # A device or FIFO as --out (/dev/null) gets no sidecar: it would land in /dev.
    config_path = None if in_place(out_path) else out_path.with_suffix(".config.json")
    checked = "MUST" + (f", profile {profile}" if profile else "") + (
        ", SHOULD" if strict else "")
    reference = profile or DEFAULT_PROFILE
    reproduce = shlex.join(["kvsched", "diff", reference, factory, "--workload",
                            str(out_path), *config_flags(finding.config)]) if finding else ""
    alone = (shlex.join(["kvsched", "fuzz", factory, *pinned_flags(pinned),
                         *(["--profile", profile] if profile else []),
                         *(["--strict"] if strict else []),
                         *(["--stall-steps", str(stall_steps)]
                           if stall_steps != DEFAULT_STALL_STEPS else []),
                         *(["--starve-steps", str(starve_steps)]
                           if starve_steps != DEFAULT_STARVE_STEPS else []),
                         *(["--example-timeout", f"{example_timeout:g}"]
                           if example_timeout != DEFAULT_EXAMPLE_SECONDS else []),
                         "--seed", str(found.shard.seed),
                         "--examples", str(found.shard.examples),
                         "--shard-examples", str(found.shard.examples)])
             if found is not None else "")
    if finding is not None and found is not None:
        with atomic_output(out_path) as stream:
            for item in finding.workload:
                stream.write(dumps_line(item_dict(item)))
        if config_path is not None:
            # The campaign as it was run, and the shard that found it, alone.
            with atomic_output(config_path) as stream:
                stream.write(orjson.dumps({"scheduler": factory, "seed": seed,
                                           "examples": examples,
                                           "shard_examples": shard_examples,
                                           "runs": campaign.runs,
                                           "found_by_shard": found.shard.as_dict(),
                                           "found_alone_by": alone,
                                           **finding.as_dict()},
                                          option=orjson.OPT_INDENT_2) + b"\n")
    if junit_path is not None:
        with atomic_output(junit_path) as stream:
            stream.write(fuzz_junit_xml(campaign, factory, checked, reproduce))
    lost = campaign.lost()
    for o in lost:
        err.print(Text(f"kvsched: shard {o.shard.index} (seed {o.shard.seed}) was not run to "
                       f"its end: its Ray task was lost ({printable(o.lost or '')})"))
    if fmt == "json":
        sys.stdout.write(orjson.dumps({
            "ok": finding is None and not lost, "scheduler": factory, "runs": campaign.runs,
            "seed": seed, "checked": checked,
            "finding": finding.as_dict() if finding else None,
            "workload_file": str(out_path) if finding else None,
            "config_file": str(config_path) if finding and config_path else None,
            "reproduce": reproduce or None,
            "shards": [o.as_dict() for o in outcomes],
            "not_run": [s.as_dict() for s in campaign.not_run()],
            "found_by_shard": found.shard.index if found else None,
            "found_alone_by": alone or None}, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif finding is None:
        sharded = f" in {len(shards)} shards" if len(shards) > 1 else ""
        out.print(f"[green]OK[/green] {factory}: {campaign.runs} examples (seed {seed}"
                  f"{sharded}), " + ("no failure" if not lost else
                                     f"no failure in the shards run, {len(lost)} lost")
                  + f" ({checked} checked)")
    else:
        assert found is not None
        out.print(f"[red]FAIL[/red] {factory} after {campaign.runs} runs (seed {seed}, "
                  f"shrinking included): {finding.message}", highlight=False)
        if len(shards) > 1:
            out.print(f"found by shard {found.shard.index} of {len(shards)} (seed "
                      f"{found.shard.seed}, {found.shard.examples} examples), which finds "
                      f"it alone: {alone}")
        n = len(finding.workload)
        out.print(f"minimal failing workload ({n} request{'s' if n != 1 else ''}) written "
                  f"to {out_path}" + (f", its config to {config_path}" if config_path else ""))
        out.print("config: " + ", ".join(f"{k}={v}" for k, v in
                                         asdict(finding.config).items()))
        table = Table()
        for col in ("id", "arrival", "prompt_len", "output_len", "max_tokens", "priority",
                    "abort"):
            table.add_column(col, justify="left" if col == "id" else "right")
        for w in finding.workload:
            table.add_row(w.id, str(w.arrival), str(w.prompt_len), str(w.output_len),
                          str(w.max_tokens), str(w.priority),
                          "-" if w.abort is None else str(w.abort))
        out.print(table)
        out.print(f"reproduce: {reproduce}")
    sys.exit(3 if lost else 1 if finding is not None else 0)
