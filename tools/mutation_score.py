"""The mutation score of `make mutation`, per module: what mutmut's last run found.

    python -m tools.mutation_score [--survivors MODULE]

Reads `mutmut results --all true` (run from the repository root after `mutmut run`)
and prints, for each mutated module, how many mutants the tests killed, how many
survived (a test that could have failed did not), how many no test reaches, and the
score: killed / (all - equivalent). Equivalent mutants (the code means the same after
the change) are listed in tools/mutation_equivalent.txt, one mutant name a line with
the reason after a `#`; they are left out of the score, never called killed. With
`--survivors MODULE` it lists that module's survivors instead, to read with
`mutmut show NAME`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENT = ROOT / "tools" / "mutation_equivalent.txt"


def results() -> dict[str, str]:
    """Every mutant's name and its status, as mutmut reports them."""
    mutmut = Path(sys.executable).parent / "mutmut"
    done = subprocess.run([str(mutmut), "results", "--all", "true"], capture_output=True,
                          text=True, cwd=ROOT, check=True)
    out = {}
    for line in done.stdout.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and name:
            out[name] = status
    return out


def equivalent() -> dict[str, str]:
    """Mutant name -> why it is equivalent."""
    out = {}
    if EQUIVALENT.exists():
        for line in EQUIVALENT.read_text().splitlines():
            name, _, why = line.partition("#")
            if name.strip():
                out[name.strip()] = why.strip()
    return out


def module_of(name: str) -> str:
    """kvsched.spec.must.x_accounting__mutmut_3 -> kvsched.spec.must"""
    return name.split(".x")[0] if ".x" in name else name.rsplit(".", 1)[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--survivors", metavar="MODULE", default=None)
    args = parser.parse_args()
    found = results()
    if not found:
        print("no mutmut results: run `make mutation` first", file=sys.stderr)
        return 2
    same = equivalent()
    if args.survivors:
        for name, status in sorted(found.items()):
            if module_of(name) == args.survivors and status != "killed" and name not in same:
                print(f"{name}: {status}")
        return 0
    by_module: dict[str, Counter[str]] = defaultdict(Counter)
    for name, status in found.items():
        # A listed mutant that a test kills counts as killed: the list may be stale.
        listed = name in same and status != "killed"
        by_module[module_of(name)]["equivalent" if listed else status] += 1
    print(f"{'module':30} {'mutants':>7} {'killed':>7} {'survived':>8} {'no test':>7} "
          f"{'equiv.':>6} {'score':>6}")
    totals: dict[str, Counter[str]] = defaultdict(Counter)
    for module in sorted(by_module):
        c = by_module[module]
        pillar = module.split(".")[1]
        totals[pillar] += c
        print(row(module, c))
    for pillar, c in sorted(totals.items()):
        print(row(f"all of {pillar}/", c))
    return 0


def row(name: str, c: Counter[str]) -> str:
    total = sum(c.values())
    scored = total - c["equivalent"]
    score = c["killed"] / scored if scored else 1.0
    return (f"{name:30} {total:7} {c['killed']:7} {c['survived']:8} {c['no tests']:7} "
            f"{c['equivalent']:6} {score:6.1%}")


if __name__ == "__main__":
    sys.exit(main())
