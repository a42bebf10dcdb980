"""`kvsched profiles`: the named reference profiles, and the engine releases each one
decides as.

Loaded when the command is named (kvsched.cli.Group).
"""

from __future__ import annotations

import sys
import textwrap
from dataclasses import fields
from typing import Any

import click
import orjson
from rich.text import Text

from kvsched.commands.options import out
from kvsched.spec.profiles import (
    FAMILY_ENGINES,
    PROFILES,
    RELEASE_NAMES,
    RELEASES,
    SCHEDULER_ENGINES,
    Profile,
    profile_releases,
)
from kvsched.spec.step_kinds import STEP_KINDS, knobs_read


def knob_values(p: Profile) -> dict[str, Any]:
    """The knobs a profile's step reads (kvsched.spec.step_kinds): vLLM v1's knobs, V0's
    rules (V0Knobs) or SGLang's (SGLangKnobs), but the cost model, which only
    --preemption auto reads."""
    step = STEP_KINDS[p.scheduler]
    rules = knobs_read(p.scheduler, p.knobs)
    return {f.name: getattr(rules, f.name) for f in fields(step.knobs)
            if f.name in step.knob_fields and f.name != "cost"}


def releases_of(p: Profile) -> list[str]:
    return [f"{FAMILY_ENGINES[r.family]} {r.version}" for r in profile_releases(p.name)]


def profile_dict(p: Profile) -> dict[str, Any]:
    return {"name": p.name, "scheduler": p.scheduler, "knobs": knob_values(p),
            "config_defaults": p.defaults.values(), "fixed": sorted(p.fixes),
            "description": p.description, "deprecated": p.deprecated or None,
            "also_named": [n for n, to in RELEASE_NAMES.items() if to == p.name],
            "releases": [{"engine": FAMILY_ENGINES[r.family], "version": r.version}
                         for r in profile_releases(p.name)]}


def show(label: str, value: str, indent: str = "  ") -> None:
    """One `label: value` line; on a terminal folded at words to its width, under the
    value's first column; elsewhere whole, so that it greps and pipes as one line."""
    head = f"{indent}{label}"
    if not out.is_terminal:
        out.print(Text(f"{head}{value}"))
        return
    width = max(out.width, len(head) + 20)
    out.print(Text(textwrap.fill(value, width, initial_indent=head,
                                 subsequent_indent=" " * len(head),
                                 break_long_words=False, break_on_hyphens=False)))


@click.command()
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True,
              help="json: a list of the profiles, each with its name, scheduler, knobs, "
                   "config defaults, description and releases.")
def profiles(fmt: str) -> None:
    """List the named reference profiles (their knobs, config defaults and what they
    model), then every engine release kvsched checked and the profile it decides as.

    --profile takes a profile's name or a release's: vllm-v1@0.27.1 and vllm-v1@0.27
    name vllm-v1@0.24, sglang names sglang@0.5.23, vllm-v0@0.10.1.1 names vllm-v0.
    """
    if fmt == "json":
        sys.stdout.write(orjson.dumps([profile_dict(p) for p in PROFILES.values()],
                                     option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    for p in PROFILES.values():
        out.print(Text(p.name))
        show("models:          ", p.description)
        show("scheduler:       ", SCHEDULER_ENGINES[p.scheduler])
        show("knobs:           ", ", ".join(f"{k}={v}" for k, v in knob_values(p).items()))
        fixed = f" (fixed: {', '.join(sorted(p.fixes))})" if p.fixes else ""
        show("config defaults: ", p.defaults.describe() + fixed)
        show("releases:        ", ", ".join(releases_of(p)) or "-")
        out.print()
    out.print(Text("releases and their profiles (--profile takes either name; a minor, "
                   "vllm-v1@0.27, names its releases' profile where they share one):"))
    width = max(len(f"{r.family}@{r.version}") for r in RELEASES) + 2
    for r in RELEASES:
        name = f"{r.family}@{r.version}"
        show(name.ljust(width), r.profile or f"none: {r.why}")


# -- calibrate ------------------------------------------------------------------------
