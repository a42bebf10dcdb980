"""The verdict of `kvsched check` on each trace, as text and as JSON.

Every trace gets its own verdict: its report, the one-line reason it could not be
read (malformed input), or the reason it was not checked at all (its Ray worker died or
its node was lost). A verdict says what was checked: the invariants the trace let
the checker judge only in part or not at all, with the reason, and, with `--require`,
fails when one of those was required. The text leads with one line per broken
invariant (how often, where first, whom first), then the first few violations, and
where the trace's minimal reproduction was written when one was asked for.

Strings from a trace (request ids, unknown keys, file names) are shown with their
control characters escaped (`printable`), so that a trace cannot move the cursor or
clear the screen of whoever reads its verdict, nor make the JUnit XML ill-formed; and
shortened (`shown_id`) where they run long, so that a 100 KB request id does not bury
the verdict. Every message a user reads goes through `printable`, the checkers' (built
in kvsched.spec with ids in them) included; the JSON keeps every id whole.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvsched.spec.violation import INVARIANTS, Violation

if TYPE_CHECKING:
    from kvsched.repro import Reproduction
    from kvsched.spec.checker import Report

# Exit codes, the worst of the traces checked: LOST, a trace that was not checked (its
# worker or node was lost), outranks the others, since its verdict is unknown.
CLEAN, FAILED, MALFORMED, LOST = 0, 1, 2, 3

# Violations listed by default in the text after the per-invariant summary.
SHOWN = 10


# An id longer than this is shown as its first SHOWN_ID_CHARS characters and its length.
SHOWN_ID_CHARS = 64
# An unbroken run of more characters than this in a message (no space, quote, comma,
# colon, semicolon, bracket or slash: an id as messages quote it, not a path) is a long
# id, shortened the same way.
LONG_RUN = 160
_LONG_RUN = re.compile(rf"[^\s'\",:;()\[\]{{}}/]{{{LONG_RUN + 1},}}")


def shown_id(rid: str) -> str:
    """`rid` whole when it has at most SHOWN_ID_CHARS characters, else its start and its
    length: `r-aaaa…(100000 chars)`."""
    if len(rid) <= SHOWN_ID_CHARS:
        return rid
    return f"{rid[:SHOWN_ID_CHARS]}\u2026({len(rid)} chars)"


def printable(text: str, ids: Iterable[str | None] = ()) -> str:
    """`text` as a user reads it: each of `ids` in it, and every other long unbroken run
    (LONG_RUN), shortened (`shown_id`); control and format characters escaped as \\xNN
    or \\uNNNN."""
    for rid in ids:
        if rid is not None and len(rid) > SHOWN_ID_CHARS:
            text = text.replace(rid, shown_id(rid))
    if len(text) > LONG_RUN:
        text = _LONG_RUN.sub(lambda m: shown_id(m.group()), text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ord(ch)) for ch in text)


def _escape(code: int) -> str:
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


@dataclass
class Verdict:
    """One trace's verdict: its report, why it could not be read, or why it was not
    checked."""

    name: str
    report: Report | None = None
    error: str | None = None  # why it is malformed input, one line naming file and line
    seconds: float = 0.0
    lost: str | None = None  # why it was not checked: Ray's reason, one line
    repro: Reproduction | None = None  # its shortest failing prefix, when asked for

    @property
    def exit_code(self) -> int:
        if self.lost is not None:
            return LOST
        if self.report is None:
            return MALFORMED
        return FAILED if self.report.failed else CLEAN

    def not_checked(self) -> str:
        """The one line a lost trace gets in place of its verdict."""
        return f"{self.name}: not checked: its Ray task was lost ({self.lost})"

    def as_dict(self) -> dict[str, Any]:
        r = self.report
        if self.lost is not None:
            return {"trace": self.name, "ok": False, "lost": self.lost}
        if r is None:
            return {"trace": self.name, "ok": False, "malformed": self.error}
        repro = {"repro": self.repro.as_dict()} if self.repro is not None else {}
        return {
            "trace": self.name, "ok": not r.failed, "steps": r.steps,
            "requests": r.requests, "scheduled_entries": r.scheduled_entries,
            "complete": r.complete, "errors": r.errors(), "warnings": r.warnings(),
            "profile": r.profile, "counts": dict(sorted(r.counts.items())),
            "unchecked": dict(r.unchecked), "required_unchecked": r.missing(),
            "violations": [v.as_dict() for v in r.violations],
            "ignored_keys": sorted(r.unknown_keys),
        } | repro


def worst(verdicts: list[Verdict]) -> int:
    return max((v.exit_code for v in verdicts), default=CLEAN)


def tally(verdicts: list[Verdict], seconds: float) -> Text:
    """The last line of a check of several traces, as pytest ends a run: how many were
    checked, and how many of them were clean (OK), failed, could not be read (error)
    and were not checked (lost on Ray), with the time the check took.
    `checked 3 traces in 0.41s: 1 OK, 1 failed, 1 error, 0 not checked`."""
    codes = [v.exit_code for v in verdicts]
    ok, failed, errors, lost = (codes.count(code) for code in (CLEAN, FAILED, MALFORMED, LOST))
    bad = failed or errors or lost
    return Text.assemble(
        f"checked {len(verdicts)} trace{'s' if len(verdicts) != 1 else ''} in "
        f"{seconds:.2f}s: ",
        (f"{ok} OK, {failed} failed, {errors} error{'s' if errors != 1 else ''}, "
         f"{lost} not checked", "red" if bad else "green"))


def summary(report: Report) -> list[tuple[str, str, int, Violation | None]]:
    """(id, level, count, first kept violation) for each broken invariant, in the order
    of INVARIANTS."""
    out = []
    for inv, level in INVARIANTS.items():
        n = report.counts[inv]
        if n:
            first = next((v for v in report.violations if v.invariant == inv), None)
            out.append((inv, level, n, first))
    return out


def _where(v: Violation | None) -> str:
    if v is None:
        return ""
    return f"first at step {v.step}" + (f", {printable(shown_id(v.request))}" if v.request
                                        else "")


def render_text(verdict: Verdict, console: Console, max_violations: int = SHOWN) -> None:
    name = printable(verdict.name)
    r = verdict.report
    if r is None:
        console.print(Text.assemble(("ERROR ", "red"), printable(verdict.error or name)))
        return
    failed = r.failed
    console.print(Text.assemble(
        ("FAIL " if failed else "OK ", "red" if failed else "green"),
        f"{name}: {r.steps} steps, {r.requests} requests, {r.scheduled_entries} scheduled "
        f"entries, {'complete' if r.complete else 'no end line'}; {r.errors()} errors, "
        f"{r.warnings()} warnings" + (f", checked against profile {r.profile}"
                                      if r.profile else "")))
    for inv, level, n, first in summary(r):
        console.print(Text(f"  {level} {inv}: {n} violation{'s' if n != 1 else ''}, "
                           f"{_where(first)}"))
    if r.unchecked:
        for inv, why in r.unchecked.items():
            tag = "required, " if inv in r.required else ""
            console.print(Text(f"  not checked in full ({tag}{inv}): {printable(why)}",
                               style="red" if inv in r.required else "yellow"))
    else:
        console.print(Text("  every invariant was checked on every step"))
    repro = verdict.repro
    if repro is not None and repro.file is not None:
        console.print(Text(f"  minimal reproduction: {printable(repro.file)} "
                           f"({printable(repro.describe())}): {printable(repro.command or '')}"))
    shown = r.violations[:max_violations]
    if shown:
        console.print(violation_table(shown))
        total = sum(r.counts.values())
        if total > len(shown):
            console.print(Text(f"({total - len(shown)} more not shown; --max-violations N "
                               "shows more, --format json lists the first 20 of each id)"))
    if r.unknown_keys:
        console.print(Text("note: ignored unknown keys: " + ", ".join(
            f"{printable(k)} (line {n})" for k, n in sorted(r.unknown_keys.items()))))


def violation_table(violations: list[Violation]) -> Table:
    table = Table(show_lines=False)
    for col in ("invariant", "level", "step", "request", "numbers", "what happened"):
        table.add_column(col, overflow="fold")
    for v in violations:
        table.add_row(v.invariant, v.level, str(v.step),
                      Text(printable(shown_id(v.request or ""))), v.numbers(),
                      Text(printable(v.message, [v.request])))
    return table
