"""`kvsched record ENGINE`: drive a real engine's scheduler on a workload, one
subcommand for each engine of the table (kvsched.adapters.engines), made from its
Engine value (`kvsched record vllm --release X`: vLLM release X's, from its own
environment).

Loaded when the command is named (kvsched.cli.Group).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.text import Text

from kvsched.adapters.engines import ENGINES
from kvsched.adapters.recording import AdapterError, Engine, EngineOption
from kvsched.commands.options import build_config, err, fail, out, recorded_config_options
from kvsched.outputs import check_writable
from kvsched.verdict import printable
from kvsched.workload import read_workload

if TYPE_CHECKING:
    from kvsched.spec.model import Config
    from kvsched.workload import WorkItem


def recorder_options(engine: Engine[Any]) -> Callable[[Callable[..., Any]],
                                                    Callable[..., Any]]:
    """The options of `engine`'s recorder, after the config's: its environment's Python
    as its python_flag, --release where it drives several releases, and, where the
    engine refuses a cache that cannot hold one max_model_len sequence, the flag that
    allows one."""
    where = f"{engine.python}; make {engine.make_env} creates it" + (
        ", or --release's environment" if engine.release_python is not None else "")
    options = [
        click.option("--workload", "workload_path", type=click.Path(path_type=Path),
                     required=True, help="Workload JSONL file."),
        click.option("--out", "out_path", type=click.Path(path_type=Path), required=True,
                     help="Write the trace here (JSON Lines)."),
        click.option(engine.python_flag, "python", type=click.Path(path_type=Path),
                     default=None,
                     help=f"Python of {engine.label}'s own environment [default: {where}]."),
        click.option("--max-steps", type=int, default=None,
                     help="Stop after this many steps."),
    ]
    if engine.refuses_undersized_cache:
        options.append(click.option(
            "--allow-undersized-cache", is_flag=True,
            help="Drive a cache that cannot hold one max_model_len sequence "
                 f"({engine.label}'s engine refuses it at start-up; for experiments)."))
    if engine.release_python is not None:
        options.insert(0, click.option("--release", default=None, metavar="X",
                                       help=engine.release_help))
    own: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
        engine_option(o) for o in engine.options]

    def apply(f: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            f = option(f)
        for decorate in reversed(own):
            f = decorate(f)
        return recorded_config_options(f, engine.profile, engine.defaults)

    return apply


def engine_option(option: EngineOption) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The click option of one of an engine's own options (EngineOption)."""
    shown = f" [default: {option.default}]" if option.default else ""
    if option.switch:
        return click.option(option.flag, option.dest, is_flag=True, default=None,
                            help=option.help)
    kind: Any = click.Choice(option.choices) if option.choices else \
        float if option.real else int
    return click.option(option.flag, option.dest, type=kind, default=None,
                        help=option.help + shown)


def engine_settings(engine: Engine[Any], given: dict[str, Any]
                    ) -> tuple[dict[str, object], dict[str, object]]:
    """The settings (profile knobs, StepKind.settings) and the config fields the engine's
    own options given ask for, taken out of `given`; a refused value
    (EngineOption.refused) is bad input."""
    settings: dict[str, object] = {}
    switched: dict[str, object] = {}  # config fields its own options turn on
    for option in engine.options:
        value = given.pop(option.dest, None)
        if value is None:
            continue
        word = "on" if option.switch else value
        if isinstance(word, str) and word in option.refused:
            fail(f"{option.flag} {word}: {option.refused[word]}")
        if option.config:
            switched[option.config] = True
            continue
        if option.knob:
            settings[option.knob] = option.as_knob.get(word, value) \
                if isinstance(word, str) else value
    return settings, switched


def recording(profile: str, workload_path: Path, out_path: Path, max_steps: int | None,
              config_given: dict[str, Any], defaults: Mapping[str, object] | None = None,
              settings: Mapping[str, object] | None = None
              ) -> tuple[Config, list[WorkItem]]:
    """The config (the engine's own `defaults`, then the profile's, under the options,
    checked with the engine's `settings`) and the workload of a recording, its arguments
    checked."""
    if max_steps is not None and max_steps < 1:
        fail(f"--max-steps must be at least 1, got {max_steps}")
    given = {k: v for k, v in config_given.items() if v is not None}
    config = build_config(profile, {**(defaults or {}), **given}, settings)
    check_writable(out_path)  # before the workload is read and the engine driven
    workload = read_workload(workload_path)
    return config, workload


def record_with(engine: Engine[Any], workload_path: Path, out_path: Path,
                python: Path | None, max_steps: int | None, allow_undersized_cache: bool,
                release: str | None, config_given: dict[str, Any]) -> None:
    """Record `engine`'s scheduler on a workload and say what it came to; the engine's
    failure (its doing, not the user's) exits 1, as a check that finds a violation."""
    if release is not None and engine.release_python is not None:
        try:
            python = engine.release_python(release, python)
        except AdapterError as e:
            fail(str(e))
    given = dict(config_given)
    settings, switched = engine_settings(engine, given)
    config, workload = recording(engine.profile, workload_path, out_path, max_steps,
                                 given, engine.defaults, settings)
    # What the engine's own options turn on is beyond its profile's step (vLLM's async
    # scheduling): the trace says it, and it is checked at the MUST level.
    config = replace(config, **switched)  # type: ignore[arg-type]
    try:
        result = engine.record(config, workload, out_path, python, max_steps,
                               allow_undersized_cache, settings)
    except AdapterError as e:
        fail(str(e))
    out.print(f"trace written to {out_path}: {engine.summary(result)}"
              + ("" if result.complete else " (stopped early: no end line)"))
    failure = engine.failed(result)
    if failure is not None:
        err.print(Text(f"kvsched: {printable(failure)}"))
        sys.exit(1)


def recorder(engine: Engine[Any]) -> click.Command:
    """`kvsched record NAME` for `engine`, from its Engine value."""

    @recorder_options(engine)
    def command(workload_path: Path, out_path: Path, python: Path | None,
                max_steps: int | None, allow_undersized_cache: bool = False,
                release: str | None = None, **config_given: Any) -> None:
        record_with(engine, workload_path, out_path, python, max_steps,
                    allow_undersized_cache, release, config_given)

    command.__doc__ = engine.help
    return click.command(engine.name)(command)


@click.group()
def record() -> None:
    """Drive a real engine's scheduler on a workload and write its trace v1."""


for _engine in ENGINES:
    record.add_command(recorder(_engine))
