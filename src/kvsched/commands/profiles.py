"""`kvsched profiles`: the named reference profiles.

Loaded when the command is named (kvsched.cli.Group).
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING

import click
from rich.table import Table

from kvsched.commands.options import (
    out,
)
from kvsched.spec.knobs import Knobs, SGLangKnobs
from kvsched.spec.profiles import PROFILES

if TYPE_CHECKING:
    pass


@click.command()
def profiles() -> None:
    """List the named reference profiles and their knobs."""
    table = Table(title="kvsched profiles")
    table.add_column("profile", no_wrap=True)  # a name is copied whole, never folded
    for col in ("knobs", "config defaults", "what it models"):
        table.add_column(col, overflow="fold")
    for p in PROFILES.values():
        # A profile's knobs are those its step reads: SGLang's rules, or vLLM's knobs.
        rules: object = p.knobs.sglang if p.scheduler == "sglang" else p.knobs
        names = [f.name for f in fields(SGLangKnobs if p.scheduler == "sglang" else Knobs)
                 if f.name not in ("cost", "sglang")]
        knobs = ", ".join(f"{name}={getattr(rules, name)}" for name in names)
        defaults = p.defaults.describe()
        if p.fixes:  # kvsched check --profile refuses a trace whose header disagrees
            defaults += f" (fixed: {', '.join(sorted(p.fixes))})"
        table.add_row(p.name, knobs, defaults, p.description)
    out.print(table)


# -- calibrate ------------------------------------------------------------------------
