"""`kvsched check TRACE...`: traces against the spec's invariants and a profile, one
verdict each (serially or on Ray).

Loaded when the command is named (kvsched.cli.Group).
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING

import click
from rich.text import Text

from kvsched import inputs
from kvsched.commands.options import (
    PROFILE,
    BadInput,
    atomic_output,
    err,
    fail,
    on_ray,
    open_trace,
    out,
    profile_note,
    progress_option,
    ray_options,
    stall_option,
    starve_option,
    trace_size,
)
from kvsched.implementations import Unavailable, check_trace, chosen_checker, require_checker
from kvsched.inputs import InputError
from kvsched.outputs import check_writable, check_writable_directory
from kvsched.progress import Reporter, reading
from kvsched.spec.profiles import SettingsError, get_profile, pinned_profile
from kvsched.spec.trace import Header, TraceError
from kvsched.spec.violation import (
    DEFAULT_MAX_PREEMPTIONS,
    DEFAULT_STALL_STEPS,
    DEFAULT_STARVE_STEPS,
    INVARIANTS,
)
from kvsched.verdict import SHOWN, Verdict, printable, render_text, tally, worst

if TYPE_CHECKING:
    from kvsched.spec.checker import Report


class Unreadable(Exception):
    """A trace that cannot be read as trace v1: its verdict is malformed input."""


@dataclass(frozen=True)
class CheckSettings:
    """The options of `kvsched check` that decide a trace's verdict."""

    profile: str | None = None
    max_preemptions: int = DEFAULT_MAX_PREEMPTIONS
    strict: bool = False
    checker_choice: str = "auto"
    required: frozenset[str] = frozenset()
    repro: bool = False  # also find a failing trace's shortest failing prefix
    stall_steps: int = DEFAULT_STALL_STEPS
    starve_steps: int = DEFAULT_STARVE_STEPS

    def flags(self) -> list[str]:
        """The `kvsched check` options that give these settings' verdicts."""
        return [*(["--profile", self.profile] if self.profile else []),
                *(["--strict"] if self.strict else []),
                *(["--max-preemptions", str(self.max_preemptions)]
                  if self.max_preemptions != DEFAULT_MAX_PREEMPTIONS else []),
                *(["--stall-steps", str(self.stall_steps)]
                  if self.stall_steps != DEFAULT_STALL_STEPS else []),
                *(["--starve-steps", str(self.starve_steps)]
                  if self.starve_steps != DEFAULT_STARVE_STEPS else [])]


def check_one(path: str, settings: CheckSettings, progress: bool | None = False) -> Report:
    """One trace's report; raises Unreadable with the one-line reason."""
    def checked(choice: str) -> Report:
        with open_trace(path) as raw, reading(raw, f"checking {printable(path)}",
                                              trace_size(path), err, progress) as stream:
            return check_stream(stream, path, settings, choice)

    try:
        return checked(chosen_checker(settings.checker_choice))
    except TraceError as e:
        raise Unreadable(f"{path}: {e}") from None
    except (BadInput, InputError) as e:  # the file itself: missing, unreadable, damaged
        raise Unreadable(str(e)) from None
    except OSError as e:  # a read error a reader let through: still this trace's alone
        raise Unreadable(str(inputs.cannot_read(path, e))) from None


def check_stream(stream: IO[bytes], path: str, settings: CheckSettings, checker_choice: str,
                 notes: bool = True) -> Report:
    """The report of the trace `stream` holds (named `path`; TraceError if malformed),
    by the checker `checker_choice` names (spec or vectorized); `notes`: print the
    release note of a profile that follows another release."""
    profile = settings.profile

    def note(header: Header) -> None:
        if profile is not None:
            refuse_other_config(path, profile, header)
            if notes:
                release_note(path, profile, header.engine)

    return check_trace(stream, checker_choice, profile=profile, strict=settings.strict,
                       max_preemptions=settings.max_preemptions, required=settings.required,
                       stall_steps=settings.stall_steps, on_header=note,
                       starve_steps=settings.starve_steps)


def verdict_of(path: str, settings: CheckSettings, progress: bool | None = False) -> Verdict:
    """One trace's verdict (and its reproduction with `settings.repro`): the check every
    trace of `kvsched check` goes through, in this process or on a Ray worker."""
    from kvsched.repro import reproduction

    started = time.perf_counter()
    try:
        report = check_one(path, settings, progress)
    except Unreadable as e:
        return Verdict(path, error=str(e))
    verdict = Verdict(path, report, seconds=time.perf_counter() - started)
    if settings.repro and report.failed:
        def recheck(stream: IO[bytes]) -> Report:
            return check_stream(stream, path, settings, "spec", notes=False)
        verdict.repro = reproduction(path, report, recheck)
    return verdict


def refuse_other_config(path: str, profile: str, header: Header) -> None:
    """Bad input (BadInput) when the trace's header gives a config field that `profile`
    fixes (Profile.fixes) another value: the trace was not recorded under the profile,
    and its replay would certify what the profile's name denies; or a value the
    profile's step kind does not honour (another family's trace: its step_mix, its
    engine's fields), which the profile cannot replay."""
    try:  # the engine settings its header declares, which the profile replays with
        named = get_profile(profile).for_trace(header.settings)
    except SettingsError as e:
        fail(f"{path}: profile {profile} cannot replay this trace: its header's {e}")
    why = (named.refusal(header.config, "the trace's header has")
           or named.disagreement(header.config))
    if why is not None:
        fail(f"{path}: {why}")


def release_note(path: str, profile: str, engine: dict[str, str]) -> None:
    """A note on standard error when `profile` follows an engine's releases (vllm-v1)
    and the trace's header names a release whose own profile decides otherwise."""
    name, version = engine.get("name", ""), engine.get("version", "")
    pinned = pinned_profile(profile, name, version)
    if pinned is not None and get_profile(pinned).knobs != get_profile(profile).knobs:
        err.print(Text(f"kvsched: note: {printable(path)} was recorded by {name} {version}, "
                       f"whose profile is {pinned} ({profile} follows another release)"))


def parse_required(text: str | None) -> frozenset[str]:
    if not text:
        return frozenset()
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in INVARIANTS]
    if unknown:
        fail(f"--require: unknown invariant {unknown[0]!r}; known: {', '.join(INVARIANTS)}")
    return frozenset(names)


@click.command()
@click.argument("traces", nargs=-1, required=True)
@click.option("--strict", is_flag=True, help="SHOULD warnings fail too (exit 1).")
@click.option("--profile", type=PROFILE, default=None,
              help="Also replay this reference profile and require equal decisions "
                   "(a profile or a release: vllm-v1@0.27.1; see kvsched profiles).")
@click.option("--max-preemptions", type=int, default=DEFAULT_MAX_PREEMPTIONS, show_default=True,
              help="no-thrash: most preemptions of one request.")
@click.option("--require", "require", default=None, metavar="IDS",
              help="Comma-separated invariant ids that must be checked in full (for example "
                   "block-ids,accounting): a trace that lets the checker judge one only in "
                   "part or not at all fails.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.option("--max-violations", type=int, default=SHOWN, show_default=True,
              help="Violations listed in the text after the per-invariant summary.")
@click.option("--junit", "junit_path", type=click.Path(path_type=Path), default=None,
              help="Also write a JUnit XML report: one testsuite per trace, one testcase "
                   "per invariant id.")
@click.option("--repro-dir", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Write each failing trace's minimal reproduction (its shortest prefix "
                   "that still fails the same way) under DIR, at the trace's own relative "
                   "path; the report says where each one is.")
@click.option("--checker", "checker_choice", type=click.Choice(["auto", "spec", "vectorized"]),
              default="auto", show_default=True,
              help="The spec's checker, or the vectorized one (same verdicts, faster); "
                   "auto picks the vectorized one wherever its compiled module is built and "
                   "can replay --profile.")
@stall_option
@starve_option
@ray_options("traces' checks")
@progress_option
def check(traces: tuple[str, ...], strict: bool, profile: str | None, max_preemptions: int,
          require: str | None, fmt: str, max_violations: int, junit_path: Path | None,
          repro_dir: Path | None, checker_choice: str, stall_steps: int,
          starve_steps: int, workers: int | None, use_ray: bool, ray_address: str | None,
          progress: bool | None) -> None:
    """Check traces against the spec's MUST and SHOULD invariants (and a profile).

    TRACES are trace files (gzip or zstd too; - is standard input), directories (their
    *.jsonl, *.jsonl.gz and *.jsonl.zst files, at any depth), quoted patterns that
    kvsched expands ('runs/**/*.jsonl'), or @LIST, a file of such paths, one per line.

    Each trace gets its own verdict, in the order of the arguments; several traces end
    with one summary line (checked, OK, failed, errors, not checked, time). Exit codes,
    the worst over the traces: 0 every trace is clean, 1 some trace broke an invariant (a
    SHOULD one only with --strict, or a --require'd invariant could not be checked in
    full), 2 some trace is malformed input or cannot be read, or the options are wrong,
    3 some trace was not checked (its Ray worker died or its node was lost).
    """
    from functools import partial

    from kvsched.repro import file_name, write_prefix
    from kvsched.tracesets import TraceSetError, expand

    if max_preemptions < 0:
        fail(f"--max-preemptions must not be negative, got {max_preemptions}")
    if max_violations < 0:
        fail(f"--max-violations must not be negative, got {max_violations}")
    if repro_dir is not None and repro_dir.exists() and not repro_dir.is_dir():
        fail(f"--repro-dir {repro_dir}: is a file; expected a directory to write "
             "reproductions in")
    # Before any trace is read: an output that cannot be written is told now, not after.
    if junit_path is not None:
        check_writable(junit_path)
    if repro_dir is not None:
        check_writable_directory(repro_dir)
    started = time.perf_counter()
    required = parse_required(require)
    profile_note(profile)
    try:
        require_checker(checker_choice)
    except Unavailable as e:
        fail(str(e))
    try:
        paths = expand(traces)
    except TraceSetError as e:
        fail(str(e))
    distributed = use_ray or workers is not None or ray_address is not None
    if distributed and "-" in paths:
        fail("-: standard input cannot be handed to Ray workers; give trace files, or "
             "check standard input without --workers, --ray and --ray-address")
    settings = CheckSettings(profile, max_preemptions, strict, checker_choice, required,
                             repro=repro_dir is not None, stall_steps=stall_steps,
                             starve_steps=starve_steps)
    verdicts: list[Verdict] = []
    written: set[Path] = set()

    def keep_reproduction(verdict: Verdict) -> None:
        assert repro_dir is not None and verdict.repro is not None
        name = repro_dir / file_name(verdict.name)
        n = 1
        while name in written:  # two traces with one relative path: number the later
            n += 1
            name = name.with_name(f"{name.name.removesuffix('.jsonl')}.{n}.jsonl")
        written.add(name)
        try:
            name.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            fail(f"--repro-dir {repro_dir}: cannot create {name.parent} ({e.strerror})")
        with atomic_output(name) as stream:
            write_prefix(verdict.name, verdict.repro, stream)
        verdict.repro = replace(verdict.repro, file=str(name), command=shlex.join(
            ["kvsched", "check", *settings.flags(), str(name)]))

    with on_ray(use_ray, workers, ray_address) as ex:
        pieces = [partial(verdict_of, path, settings,
                          False if ex.distributed else progress) for path in paths]
        with Reporter("checking", len(paths), err, progress if ex.distributed else False,
                      unit="traces") as bar:
            for outcome in ex.run(pieces, on_done=lambda _: bar.advance(1)):
                sys.stdout.write(outcome.stdout)
                sys.stderr.write(outcome.stderr)
                verdict = (outcome.value if outcome.value is not None
                           else Verdict(paths[outcome.index], lost=outcome.lost))
                verdicts.append(verdict)
                if verdict.repro is not None and repro_dir is not None:
                    keep_reproduction(verdict)
                if verdict.lost is not None:
                    err.print(Text(f"kvsched: {printable(verdict.not_checked())}"))
                elif verdict.error is not None:
                    err.print(Text(f"kvsched: error: {printable(verdict.error)}"))
                elif fmt == "text":
                    render_text(verdict, out, max_violations)
    if junit_path is not None:
        with atomic_output(junit_path) as stream:
            from kvsched.junit import junit_xml

            stream.write(junit_xml(verdicts, strict=strict, profile=profile))
    if fmt == "json":
        sys.stdout.write(json.dumps([v.as_dict() for v in verdicts], indent=2,
                                    ensure_ascii=True) + "\n")
    elif len(verdicts) > 1:
        out.print(tally(verdicts, time.perf_counter() - started))
    sys.exit(worst(verdicts))
