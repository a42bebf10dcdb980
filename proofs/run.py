"""`make proofs`: every CrossHair obligation, every diffbehavior pair, the bounded model
checker, and the model checker against the seeded-bug schedulers, with fixed effort.

It fails on any counterexample or error, and on CrossHair's silent traps:
- `crosshair check` ignores plain asserts unless --analysis_kind=asserts: obligations are
  PEP 316 contracts, run with --analysis_kind=PEP316, and an obligation whose body holds
  an assert is refused (its assert would check nothing the runner can see);
- it exits 0 with only a warning when a target has no checkable function: every target
  must report a verdict for each of its `post:` lines, counted from the source, and
  any warning fails;
- a mistyped target exits 1 like a counterexample: every target is imported before
  CrossHair runs, and an exit 1 without a counterexample line is an error.
"Unable to meet precondition" (nothing was checked) fails too. A fourth trap, callees'
contracts assumed instead of their code run, is closed by crosshair_plugin.py.

    python -m proofs.run            # the full run (make proofs)
    python -m proofs.run --quick    # the subset make test runs
    python -m proofs.run --only recompute-victim --scopes none
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import os
import re
import resource
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from proofs.model_check import Result, report, run_scopes
from proofs.obligations import EXHAUSTIVE, OBLIGATIONS, PROVEN, SEARCHED, Obligation, by_name
from proofs.scopes import REACHES, SCOPE_SETS, Scope

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+): (?P<level>info|error|warning): (?P<msg>.*)$")
CONFIRMED = "Confirmed over all paths."
NOT_CONFIRMED = "Not confirmed."
UNMET = "Unable to meet precondition."


class TargetError(Exception):
    pass


@dataclass
class Outcome:
    obligation: Obligation
    ok: bool
    status: str  # what was reached: proven, exhaustive, searched, or failed
    detail: str
    seconds: float
    conditions: int = 0


# -- targets ------------------------------------------------------------------------


def resolve(target: str) -> Any:
    """The module or function a dotted target names; TargetError if there is none."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                raise TargetError(f"target {target}: {obj.__name__} has no {attr!r}")
            obj = getattr(obj, attr)
        return obj
    raise TargetError(f"target {target}: no such module")


def functions_of(obj: Any) -> list[Any]:
    if isinstance(obj, ModuleType):
        return [f for _, f in inspect.getmembers(obj, inspect.isfunction)
                if f.__module__ == obj.__name__]
    if inspect.isfunction(obj):
        return [obj]
    raise TargetError(f"{obj!r} is neither a module nor a function")


def post_lines(fn: Any) -> dict[int, str]:
    """Every line of a function's source that reads as a `post:` condition, by absolute
    line number (in the docstring or not: CrossHair must report on each)."""
    source, start = inspect.getsourcelines(fn)
    out = {}
    for i, text in enumerate(source):
        stripped = text.strip().lstrip("rRuU").lstrip("\"'")
        if stripped.startswith("post:"):
            out[start + i] = stripped[len("post:"):].strip().rstrip("\"'").strip()
    return out


def asserts_in(fn: Any) -> int:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return sum(isinstance(node, ast.Assert) for node in ast.walk(tree))


def expected_conditions(ob: Obligation) -> dict[tuple[str, int], str]:
    """(file, line) -> condition text for every `post:` CrossHair must report on."""
    out: dict[tuple[str, int], str] = {}
    for fn in functions_of(resolve(ob.targets[0])):
        posts = post_lines(fn)
        if not posts:
            continue
        if asserts_in(fn):
            raise TargetError(f"{fn.__qualname__} holds a plain assert, which "
                              "--analysis_kind=PEP316 ignores: state it as a post: line")
        path = str(Path(inspect.getfile(fn)).resolve())
        out.update({(path, line): text for line, text in posts.items()})
    if not out:
        raise TargetError(f"target {ob.targets[0]} has no post: condition to check")
    return out


# -- crosshair ------------------------------------------------------------------------


PLUGIN = Path(__file__).resolve().parent / "crosshair_plugin.py"


def crosshair(command: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run `crosshair command` with the plugin that runs callees' bodies, not their
    contracts (crosshair_plugin.py)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    argv = [sys.executable, "-m", "crosshair", command, "--extra_plugin", str(PLUGIN), *args]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)


def run_check(ob: Obligation) -> Outcome:
    start = time.monotonic()

    def outcome(ok: bool, status: str, detail: str, n: int = 0) -> Outcome:
        return Outcome(ob, ok, status, detail, time.monotonic() - start, n)

    try:
        expected = expected_conditions(ob)
    except TargetError as e:
        return outcome(False, "failed", str(e))
    proc = crosshair("check", ["--analysis_kind=PEP316", "--report_all", *ob.effort.args(),
                               ob.targets[0]])
    verdicts: dict[tuple[str, int], str] = {}
    problems = []
    for raw in proc.stdout.splitlines():
        m = LINE.match(raw)
        if m is None:
            continue
        key = (str(Path(m["file"]).resolve()), int(m["line"]))
        text = expected.get(key, f"line {m['line']}")
        if m["level"] == "error":
            problems.append(f"counterexample to `{text}` ({Path(key[0]).name}:{key[1]}): "
                            f"{m['msg']}")
        elif m["msg"] == UNMET:
            problems.append(f"{Path(key[0]).name}:{key[1]}: unable to meet the precondition, "
                            "so nothing was checked")
        verdicts[key] = m["msg"] if m["level"] == "info" else "error"
    if "WARNING" in proc.stderr or "warning" in proc.stdout:
        problems.append("CrossHair warned: " + " ".join(proc.stderr.split())[:300])
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not problems):
        problems.append(f"crosshair exited {proc.returncode} without a counterexample (a "
                        f"mistyped target or a crash): {tail(proc.stderr or proc.stdout)}")
    unchecked = [f"{Path(f).name}:{n} `{t}`" for (f, n), t in expected.items()
                 if (f, n) not in verdicts]
    if unchecked and not any(p.startswith("counterexample") for p in problems):
        problems.append("CrossHair reported nothing on " + ", ".join(unchecked))
    if problems:
        return outcome(False, "failed", "; ".join(problems), len(expected))
    unconfirmed = [f"{Path(f).name}:{n} `{t}`" for (f, n), t in expected.items()
                   if verdicts[(f, n)] != CONFIRMED]
    if not unconfirmed:
        reached = ob.status if ob.status != SEARCHED else EXHAUSTIVE
        return outcome(True, reached, f"all {len(expected)} conditions confirmed over all "
                       "paths", len(expected))
    if ob.status in (PROVEN, EXHAUSTIVE):
        return outcome(False, "failed", f"expected {ob.status}, but not confirmed over all "
                       f"paths: {', '.join(unconfirmed)}", len(expected))
    confirmed = len(expected) - len(unconfirmed)
    return outcome(True, SEARCHED, f"no counterexample; {confirmed} of {len(expected)} "
                   "conditions confirmed over all paths", len(expected))


def run_diff(ob: Obligation) -> Outcome:
    start = time.monotonic()

    def outcome(ok: bool, status: str, detail: str) -> Outcome:
        return Outcome(ob, ok, status, detail, time.monotonic() - start, 1)

    try:
        sides = [resolve(t) for t in ob.targets]
    except TargetError as e:
        return outcome(False, "failed", str(e))
    if inspect.signature(sides[0]) != inspect.signature(sides[1]):
        return outcome(False, "failed", "the two sides of a pair must take the same arguments")
    proc = crosshair("diffbehavior", [*ob.effort.args(), *ob.targets])
    out = proc.stdout
    if "Given:" in out and proc.returncode == 1:
        return outcome(False, "failed", "the spec and the reference differ: "
                       + " ".join(out.split()))
    m = re.search(r"No differences found\. \(attempted (\d+) iterations\)", out)
    if proc.returncode != 0 or m is None or int(m[1]) < 1:
        return outcome(False, "failed", f"crosshair diffbehavior exited {proc.returncode} "
                       f"without a verdict: {tail(proc.stderr or out)}")
    exhausted = "All paths exhausted" in out
    if ob.status in (PROVEN, EXHAUSTIVE) and not exhausted:
        return outcome(False, "failed", f"expected {ob.status}, but CrossHair did not exhaust "
                       f"the paths in {m[1]} iterations")
    return outcome(True, EXHAUSTIVE if exhausted else SEARCHED,
                   f"no difference in {m[1]} iterations"
                   + (", all paths exhausted" if exhausted else ""))


def tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-3:])[:400]


def run_obligations(obligations: Sequence[Obligation], jobs: int) -> list[Outcome]:
    def one(ob: Obligation) -> Outcome:
        return run_check(ob) if ob.kind == "check" else run_diff(ob)

    outcomes = []
    with ThreadPoolExecutor(max(jobs, 1)) as pool:
        for o in pool.map(one, obligations):
            mark = "PASS" if o.ok else "FAIL"
            print(f"{mark}  {o.obligation.name:<24} {o.status:<11} {o.seconds:6.1f}s  {o.detail}",
                  flush=True)
            outcomes.append(o)
    return outcomes


# -- the model checker ----------------------------------------------------------------


@dataclass
class Family:
    scopes: int = 0
    states: int = 0
    transitions: int = 0
    seconds: float = 0.0
    largest: tuple[int, str] = (0, "")
    findings: list[Result] = field(default_factory=list)
    # per step kind of its scopes: the transitions in which each event happened
    reached: dict[str, Counter[str]] = field(default_factory=dict)

    def unreached(self) -> dict[str, list[str]]:
        """Per step kind with REACHES, the events its scopes here never reached."""
        return {kind: sorted(need - set(+self.reached.get(kind, Counter())))
                for kind, need in REACHES.items()
                if kind in self.reached and not need <= set(+self.reached[kind])}


def model_check(scopes: list[Scope], jobs: int) -> dict[str, Family]:
    """Explore the scopes; per family, what they explored and reached. A family whose
    scopes of a step kind stop reaching an event of REACHES fails, as a finding does."""
    families: dict[str, Family] = {}
    by_name = {s.name: s for s in scopes}
    for result in run_scopes(scopes, jobs=jobs):
        report(result)
        scope = by_name[result.scope]
        f = families.setdefault(scope.family, Family())
        f.scopes += 1
        f.states += result.states
        f.transitions += result.transitions
        f.seconds += result.seconds
        f.largest = max(f.largest, (result.states, result.scope))
        f.reached.setdefault(scope.scheduler, Counter()).update(dict(result.reached))
        if result.finding is not None:
            f.findings.append(result)
    for name, f in families.items():
        print(f"model check {name}: {f.scopes} scopes, {f.states:,} states, "
              f"{f.transitions:,} transitions, {f.seconds:.0f} CPU s, largest "
              f"{f.largest[1]} ({f.largest[0]:,} states), {len(f.findings)} findings")
        for kind, counts in sorted(f.reached.items()):
            if counts:
                print(f"  {kind} scopes reached (transitions): "
                      + ", ".join(f"{e} {n:,}" for e, n in sorted(counts.items())))
        for kind, missing in f.unreached().items():
            print(f"UNREACHED model check {name}: its {kind} scopes no longer reach "
                  + ", ".join(missing))
    return families


def hunt_seeded_bugs(scopes: list[Scope], jobs: int) -> int:
    """Explore each seeded bug until a scope finds it; the number of bugs not found."""
    from proofs.seeded import hunt, seeded_bug_names

    missed = 0
    for name in seeded_bug_names():
        h = hunt(name, scopes, jobs)
        if h.found and h.result is not None:
            print(f"FOUND  {name:<36} expected {h.expected:<12} found {', '.join(h.named):<30}"
                  f" after {h.scopes_tried:>3} scopes, in {h.family}: {h.result.scope}",
                  flush=True)
        else:
            missed += 1
            print(f"MISSED {name:<36} expected {h.expected}: no finding in {h.scopes_tried} "
                  "scopes", flush=True)
    return missed


# -- main -------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m proofs.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="the make test subset: quick obligations and quick scopes")
    ap.add_argument("--only", default="",
                    help="comma-separated obligation names (then no model check unless "
                         "--scopes is given)")
    ap.add_argument("--scopes", choices=[*sorted(SCOPE_SETS), "none"], default=None)
    ap.add_argument("--seeded", action=argparse.BooleanOptionalAction, default=None,
                    help="hunt the seeded-bug schedulers (default: on in the full run)")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)

    if args.only:
        obligations = by_name([n for n in args.only.split(",") if n])
    elif args.quick:
        obligations = [o for o in OBLIGATIONS if o.quick]
    else:
        obligations = list(OBLIGATIONS)
    scope_set = args.scopes or ("none" if args.only else "quick" if args.quick else "full")
    seeded = args.seeded if args.seeded is not None else not (args.quick or args.only)

    start = time.monotonic()
    failures = 0
    if obligations:
        outcomes = run_obligations(obligations, args.jobs)
        failures += sum(not o.ok for o in outcomes)
    scopes = SCOPE_SETS[scope_set]() if scope_set != "none" else []
    if scopes:
        families = model_check(scopes, args.jobs)
        failures += sum(len(f.findings) + bool(f.unreached()) for f in families.values())
    if seeded:
        hunted = SCOPE_SETS["quick"]() + SCOPE_SETS["profiles"]()
        failures += hunt_seeded_bugs(hunted, args.jobs)
    verdict = "FAILED" if failures else "passed"
    cpu = sum(getattr(resource.getrusage(who), field)
              for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for field in ("ru_utime", "ru_stime"))
    print(f"proofs {verdict}: {len(obligations)} obligations, {len(scopes)} scopes"
          f"{', seeded bugs hunted' if seeded else ''}; {failures} failures; "
          f"{time.monotonic() - start:.0f}s wall, {cpu:.0f} CPU s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
