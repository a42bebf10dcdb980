"""Render a docs template, filling its placeholders with what the checker really says.

docs/spec.md is rendered from docs/examples/spec.template.md; the example traces are
defined in examples.py beside the template (a `DOCS` object of class `DocExamples`).
tests/test_docs.py renders it again and requires the committed page byte for byte,
so a checker message the page quotes cannot drift from the checker. Re-render with

    .venv/bin/python -m tools.docs_render docs/examples/spec.template.md > docs/spec.md

Placeholders (NAME is a key of the matching `DocExamples` mapping):

- `{{header}}`: the trace header line of the base config;
- `{{ex:NAME}}`: an example's step lines, then what the checker reports on them
  (one violation a line, or the `kvsched check` transcript when it is bad input);
- `{{cfg:NAME}}`: how the example's config differs from the base config;
- `{{check:NAME ARGS}}`: `kvsched check ARGS NAME.jsonl` run for real: its summary
  line (or error line) and exit code;
- `{{error:NAME}}`: the reader's refusal of a header with a malformed config;
- `{{change:NAME}}`: that malformed config's fields, as they differ from the base;
- `{{reason:NAME}}`: `rejectable`'s sentence for a request under a config (why it may be
  rejected: `never_completes`'s, or that its prompt fills max_model_len).

Rendering is deterministic: no time, path or terminal width reaches the output.
"""

from __future__ import annotations

import importlib.util
import io
import json
import re
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from kvsched.conformance import check_reader
from kvsched.spec import should
from kvsched.spec.blocks import rejectable
from kvsched.spec.model import Config
from kvsched.spec.trace import TraceError, TraceReader, header_dict
from kvsched.spec.violation import Violation

# One line of a trace, as the JSON object it is written from.
Line = Mapping[str, object]
# Config fields to change, by name; Any because a bad config's values are deliberately wrong.
ConfigChange = Mapping[str, Any]

PLACEHOLDER = re.compile(r"\{\{(\w+)(?::([\w-]+)((?: [^}]+)?))?\}\}")
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Example:
    """Step lines checked under the base config with `config`'s fields changed.

    With `profile`, the steps are also compared with that reference profile's
    decisions, as `kvsched check --profile` does.
    """

    steps: Sequence[Line]
    config: ConfigChange = field(default_factory=dict)
    end: bool = False
    max_preemptions: int = should.DEFAULT_MAX_PREEMPTIONS
    profile: str | None = None
    stall_steps: int = should.DEFAULT_STALL_STEPS
    starve_steps: int = should.DEFAULT_STARVE_STEPS


@dataclass(frozen=True)
class Rejection:
    """A request of `prompt_len` and `max_tokens` under the base config changed by `config`."""

    prompt_len: int
    max_tokens: int
    config: ConfigChange = field(default_factory=dict)


@dataclass(frozen=True)
class DocExamples:
    """Everything one template's placeholders name."""

    base: Config
    examples: Mapping[str, Example]
    bad_configs: Mapping[str, ConfigChange] = field(default_factory=dict)
    rejections: Mapping[str, Rejection] = field(default_factory=dict)

    def config(self, name: str) -> Config:
        return replace(self.base, **self.examples[name].config)

    def trace_text(self, name: str) -> str:
        """The whole trace of example `name`: header, step lines, end line if any."""
        ex = self.examples[name]
        lines = [header_dict(self.config(name)), *ex.steps]
        if ex.end:
            lines.append({"end": True})
        return "".join(json.dumps(line) + "\n" for line in lines)


def violation_line(v: Violation) -> str:
    """One violation as the docs write it: `LEVEL id at step S, request (numbers): message`."""
    where = f"step {v.step}" + (f", {v.request}" if v.request else "")
    numbers = f" ({v.numbers()})" if v.numbers() else ""
    return f"{v.level} {v.invariant} at {where}{numbers}: {v.message}"


def findings(docs: DocExamples, name: str) -> list[str]:
    """What the checker (and the example's profile, if any) reports, one line each."""
    ex = docs.examples[name]
    reader = TraceReader(io.BytesIO(docs.trace_text(name).encode()))
    report = check_reader(reader, profile=ex.profile, max_preemptions=ex.max_preemptions,
                          stall_steps=ex.stall_steps, starve_steps=ex.starve_steps)
    return [violation_line(v) for v in report.violations]


def check_transcript(docs: DocExamples, name: str, args: Sequence[str]) -> list[str]:
    """`kvsched check ARGS NAME.jsonl`, run in a scratch folder: the command, the first
    line it prints (the summary, or the one-line error), and `echo $?`."""
    from kvsched.cli import main  # the CLI is only needed for transcripts

    file = f"{name}.jsonl"
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / file
        path.write_text(docs.trace_text(name))
        result = CliRunner().invoke(main, ["check", *args, str(path)], prog_name="kvsched")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise RuntimeError(f"kvsched check on example {name} crashed: {result.exception!r}")
    # The scratch folder's name changes from run to run; the page shows the bare file name.
    printed = ANSI_ESCAPE.sub("", result.output.replace(str(path), file)).splitlines()
    if not printed:
        raise RuntimeError(f"kvsched check on example {name} printed nothing")
    return [" ".join(["$ kvsched check", *args, file]), printed[0], "$ echo $?",
            str(result.exit_code)]


def example_block(docs: DocExamples, name: str) -> str:
    """The step lines as JSON, then what the checker says of them."""
    ex = docs.examples[name]
    steps = [json.dumps(s) for s in ex.steps] + (['{"end": true}'] if ex.end else [])
    try:
        said = findings(docs, name) or ["(no violation)"]
    except TraceError:
        said = check_transcript(docs, name, [])
    return "\n".join(["```json", *steps, "```", "", "```text", *said, "```"])


def config_change(change: ConfigChange) -> str:
    return "`" + ", ".join(f"{key}: {json.dumps(value)}" for key, value in change.items()) + "`"


def config_note(docs: DocExamples, name: str) -> str:
    changed = docs.examples[name].config
    return "base config with " + config_change(changed) if changed else "base config"


def bad_config_note(docs: DocExamples, name: str) -> str:
    return config_change(docs.bad_configs[name])


def config_error(docs: DocExamples, name: str) -> str:
    header = json.dumps(header_dict(replace(docs.base, **docs.bad_configs[name])))
    try:
        TraceReader(io.BytesIO(header.encode() + b"\n"))
    except TraceError as e:
        return str(e)
    raise ValueError(f"bad config {name} is read without error")


def rejection_reason(docs: DocExamples, name: str) -> str:
    r = docs.rejections[name]
    reason = rejectable(replace(docs.base, **r.config), r.prompt_len, r.max_tokens)
    if reason is None:
        raise ValueError(f"rejection {name} must be served, so it has no reason")
    return reason


def render(template: str, docs: DocExamples) -> str:
    """The template with every placeholder filled; each example must be used, and an
    example whose config is not the base config must have it shown (`{{cfg:NAME}}`),
    so that no example silently reuses the config of the one before it."""
    used: set[str] = set()
    shown_configs: set[str] = set()
    fill: dict[str, Callable[[DocExamples, str], str]] = {
        "ex": example_block, "cfg": config_note, "error": config_error,
        "change": bad_config_note, "reason": rejection_reason,
    }
    tables: dict[str, Mapping[str, object]] = {
        "ex": docs.examples, "error": docs.bad_configs, "reason": docs.rejections,
    }
    table_of = {"ex": "ex", "cfg": "ex", "check": "ex", "error": "error", "change": "error",
                "reason": "reason"}

    def one(m: re.Match[str]) -> str:
        kind, name, args = m.group(1), m.group(2), (m.group(3) or "").split()
        if kind == "header" and name is None:
            return json.dumps(header_dict(docs.base))
        if kind not in table_of or name is None:
            raise ValueError(f"unknown placeholder {m.group(0)}")
        table = table_of[kind]
        if name not in tables[table]:
            raise ValueError(f"placeholder {m.group(0)}: no {table} named {name!r} in the "
                             "examples")
        used.add(f"{table}:{name}")
        if kind == "cfg":
            shown_configs.add(name)
        if kind == "check":
            return "\n".join(check_transcript(docs, name, args))
        if args:
            raise ValueError(f"placeholder {m.group(0)} takes no arguments")
        return fill[kind](docs, name)

    out = PLACEHOLDER.sub(one, template)
    if "{{" in out:
        line = out[:out.index("{{")].count("\n") + 1
        raise ValueError(f"line {line} of the rendered page has a malformed placeholder")
    defined = ({f"ex:{n}" for n in docs.examples} | {f"error:{n}" for n in docs.bad_configs}
               | {f"reason:{n}" for n in docs.rejections})
    if defined - used:
        raise ValueError("defined but never used in the template: "
                         + ", ".join(sorted(defined - used)))
    unshown = sorted(n for n, ex in docs.examples.items()
                     if ex.config and f"ex:{n}" in used and n not in shown_configs)
    if unshown:
        raise ValueError("examples whose config differs from the base config, never "
                         "shown with {{cfg:NAME}}: " + ", ".join(unshown))
    return out


def load_examples(path: Path) -> DocExamples:
    """The `DOCS` object of the examples module at `path`."""
    spec = importlib.util.spec_from_file_location("kvsched_doc_examples", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    docs = getattr(module, "DOCS", None)
    if not isinstance(docs, DocExamples):
        raise ValueError(f"{path}: expected DOCS = DocExamples(...), got {docs!r}")
    return docs


def render_file(template: Path) -> str:
    """Render `template` with the examples of examples.py in its folder."""
    return render(template.read_text(encoding="utf-8"),
                  load_examples(template.parent / "examples.py"))


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tools.docs_render TEMPLATE > PAGE", file=sys.stderr)
        return 2
    sys.stdout.buffer.write(render_file(Path(argv[0])).encode())
    return 0


if __name__ == "__main__":
    # Run as a script this module is __main__; the examples import tools.docs_render,
    # so hand over to that copy, whose DocExamples class they use.
    from tools import docs_render

    sys.exit(docs_render.main(sys.argv[1:]))
