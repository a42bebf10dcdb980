"""`kvsched record ENGINE`: drive a real engine's scheduler on a workload, one
subcommand for each engine of the table (kvsched.adapters.engines), made from its
Engine value (`kvsched record vllm --release X`: vLLM release X's, from its own
environment).

Loaded when the command is named (kvsched.cli.Group).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.text import Text

from kvsched.adapters.engines import ENGINES
from kvsched.adapters.recording import AdapterError, Engine
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

    def apply(f: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            f = option(f)
        return recorded_config_options(f, engine.profile)

    return apply


def recording(profile: str, workload_path: Path, out_path: Path, max_steps: int | None,
              config_given: dict[str, Any]) -> tuple[Config, list[WorkItem]]:
    """The config (the profile's defaults under the options) and the workload of a
    recording, its arguments checked."""
    if max_steps is not None and max_steps < 1:
        fail(f"--max-steps must be at least 1, got {max_steps}")
    config = build_config(profile, config_given)
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
    config, workload = recording(engine.profile, workload_path, out_path, max_steps,
                                 config_given)
    try:
        result = engine.record(config, workload, out_path, python, max_steps,
                               allow_undersized_cache)
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
