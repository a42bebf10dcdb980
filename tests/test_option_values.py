"""Every float option of every command takes a finite number in its range, refusing the
rest in one line (exit 2); `kvsched simulate --format json` says null for a trace it did
not write."""

from __future__ import annotations

import json
from collections.abc import Callable

import click
import pytest
from conftest import Ran

from kvsched.cli import main

# Every float option: its command, the option, and values it refuses beyond nan and inf.
FLOAT_OPTIONS = [
    (("simulate",), "--host-bandwidth", ("0", "-1")),
    (("simulate",), "--prefill-tokens-per-s", ("0", "-1e9")),
    (("simulate",), "--rate", ("0", "-0.5")),
    (("simulate", "--generator", "shared-prompts"), "--skew", ("-1",)),
    (("simulate", "--generator", "conversations"), "--turns", ("0.5", "-3")),
    (("simulate", "--generator", "conversations"), "--think-steps", ("-1",)),
    (("fuzz", "my_engine:make"), "--example-timeout", ("0", "-1")),
    (("diff", "vllm-v1", "vllm-v1"), "--rate", ("0",)),
    (("diff", "vllm-v1", "vllm-v1", "--generator", "shared-prompts"), "--skew", ("-1",)),
    (("diff", "vllm-v1", "vllm-v1", "--generator", "conversations"), "--turns", ("0",)),
    (("diff", "vllm-v1", "vllm-v1", "--generator", "conversations"), "--think-steps",
     ("-2",)),
]


def test_the_table_names_every_float_option() -> None:
    """A float option added later is refused out of range too, or this fails."""
    named = {(command[0], option) for command, option, _ in FLOAT_OPTIONS}
    assert isinstance(main, click.Group)
    ctx = click.Context(main)
    found = set()
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        assert command is not None
        found |= {(name, p.opts[0]) for p in command.params
                  if isinstance(p.type, click.types.FloatParamType) or p.type.name == "float"}
    assert found == named


@pytest.mark.parametrize(("command", "option", "values"), FLOAT_OPTIONS,
                         ids=[f"{command[0]} {option}" for command, option, _ in FLOAT_OPTIONS])
def test_a_float_option_refuses_what_is_not_a_finite_number_in_range(
        cli: Callable[..., Ran], command: tuple[str, ...], option: str,
        values: tuple[str, ...]) -> None:
    for value in ("nan", "inf", "-inf", "NaN", *values):
        ran = cli(*command, f"{option}={value}")
        assert ran.exit_code == 2, (value, ran)
        assert ran.stderr.count("\n") == 1 and "Traceback" not in ran.stderr, ran.stderr
        assert ran.stderr.startswith(f"kvsched: error: Invalid value for '{option}': "
                                     "expected a "), ran.stderr
        assert value in ran.stderr


def test_a_float_option_in_range_is_taken(cli: Callable[..., Ran]) -> None:
    ran = cli("simulate", "--requests", "3", "--preemption", "auto", "--num-cpu-blocks", "64",
              "--host-bandwidth", "1e9", "--prefill-tokens-per-s", "2.5e4", "--rate", "0.5",
              "--format", "json")
    assert ran.exit_code == 0, ran
    assert json.loads(ran.stdout)["requests"] == 3


def test_simulate_json_says_null_for_no_trace(cli: Callable[..., Ran]) -> None:
    ran = cli("simulate", "--requests", "3", "--format", "json")
    assert ran.exit_code == 0, ran
    assert json.loads(ran.stdout)["trace"] is None
