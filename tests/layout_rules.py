"""The dependency rules of docs/architecture.md, checked on the import statements.

spec/ imports only the standard library; reference/ imports spec and the standard
library; optimized/ never imports reference; vLLM V0's scheduler subclasses the
reference's, never the reverse (reference/scheduler.py imports neither
kvsched.reference.v0 nor the package, which imports it); nothing imports the pillars as
top-level names, and the installed package (src/) imports nothing that is only in the
checkout (tools/, proofs/, conformance/, tests/). Exit 1 naming each offending line.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STDLIB = sys.stdlib_module_names
# Folders of the checkout that are not installed (pyproject.toml packages src/ alone).
CHECKOUT_ONLY = ("tools", "proofs", "conformance", "tests")


# A Cython module's Python imports (its cimports name C++ and Cython headers).
CYTHON_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\b|import\s+([\w.]+))")


def imports(path: Path) -> list[tuple[int, str]]:
    if path.suffix == ".pyx":
        out = []
        for number, text in enumerate(path.read_text().splitlines(), 1):
            m = CYTHON_IMPORT.match(text)
            if m:
                out.append((number, m.group(1) or m.group(2)))
        return out
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def allowed(pillar: str, module: str) -> bool:
    top = module.split(".")[0]
    if top == "__future__" or top in STDLIB:
        return True
    if pillar == "spec":
        return module.startswith("kvsched.spec")
    if pillar == "reference":
        return module.startswith(("kvsched.spec", "kvsched.reference"))
    if pillar == "optimized":
        # torch, numpy and the spec, never the reference or the tool.
        if top == "kvsched":
            return module.startswith(("kvsched.spec", "kvsched.optimized"))
        return True
    return True


def main() -> int:
    bad = []
    for pillar in ("spec", "reference", "optimized"):
        paths = [p for suffix in ("py", "pyi", "pyx")
                 for p in (ROOT / pillar).glob(f"**/*.{suffix}")]
        for path in sorted(paths):
            for line, module in imports(path):
                if not allowed(pillar, module):
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {pillar}/ may not import "
                               f"{module}")
    base = ROOT / "reference" / "scheduler.py"
    for line, module in imports(base):
        if module in ("kvsched.reference", "kvsched.reference.v0"):
            bad.append(f"{base.relative_to(ROOT)}:{line}: the reference scheduler may not "
                       f"import {module} (vLLM V0's scheduler is its subclass)")
    for folder in ("spec", "reference", "optimized", "src", "tests", "proofs", "tools",
                   "conformance"):
        for path in sorted((ROOT / folder).glob("**/*.py")):
            if path.is_symlink() or "/.venv/" in str(path):
                continue
            for line, module in imports(path):
                if module.split(".")[0] in ("spec", "reference", "optimized"):
                    bad.append(f"{path.relative_to(ROOT)}:{line}: import kvsched.{module}, "
                               "not the top-level name")
                if folder == "src" and module.split(".")[0] in CHECKOUT_ONLY:
                    bad.append(f"{path.relative_to(ROOT)}:{line}: the package may not "
                               f"import {module}, which is not installed")
    for message in bad:
        print(message)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
