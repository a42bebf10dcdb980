"""docs/spec.md is what its template renders to: every example's output is the checker's.

The page quotes the checker's messages; a change in one must show up as a failing test
here, not as a page that silently tells an old story.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvsched.spec import Config, TraceError, TraceReader, check_trace
from kvsched.spec.trace import header_dict
from tools.docs_render import DocExamples, Example, load_examples, render, render_file

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "docs" / "examples" / "spec.template.md"
PAGE = ROOT / "docs" / "spec.md"
RERENDER = ".venv/bin/python -m tools.docs_render docs/examples/spec.template.md > docs/spec.md"


def first_difference(a: str, b: str) -> str:
    for number, (x, y) in enumerate(zip(a.splitlines(), b.splitlines(), strict=False), 1):
        if x != y:
            return f"line {number}:\n  rendered:  {x}\n  committed: {y}"
    return f"lengths differ: rendered {len(a)} chars, committed {len(b)}"


def test_spec_md_is_the_rendered_template() -> None:
    rendered = render_file(TEMPLATE)
    committed = PAGE.read_text(encoding="utf-8")
    assert rendered == committed, (
        "docs/spec.md differs from a fresh render of docs/examples/spec.template.md "
        f"(a checker message or an example changed). First difference, "
        f"{first_difference(rendered, committed)}\n"
        f"If the change is intended, re-render with:\n  {RERENDER}\nand review the diff.")


def test_rendering_is_deterministic() -> None:
    assert render_file(TEMPLATE) == render_file(TEMPLATE)


@pytest.fixture(scope="module")
def docs() -> DocExamples:
    return load_examples(TEMPLATE.parent / "examples.py")


def only_examples(docs: DocExamples, *names: str) -> DocExamples:
    """The same examples cut down to `names`, without the other placeholder kinds."""
    kept: dict[str, Example] = {n: docs.examples[n] for n in names}
    return DocExamples(base=docs.base, examples=kept)


def test_an_example_shows_what_the_checker_reports(docs: DocExamples) -> None:
    block = render("{{ex:finish-length}}", only_examples(docs, "finish-length"))
    assert "MUST finish at step 1, r0 (33 <= 32): r0 samples a token with 32 tokens known" \
        in block
    assert block.startswith("```json\n{\"step\": 0, ")


def test_bad_input_shows_the_cli_error_and_exit_code_2(docs: DocExamples) -> None:
    block = render("{{ex:bad-gap}}", only_examples(docs, "bad-gap"))
    assert ("kvsched: error: bad-gap.jsonl: line 3: expected step 1, got 2 (steps are "
            "numbered from 0 without gaps)\n$ echo $?\n2\n```") in block


def test_a_profile_divergence_fails_the_check_without_strict(docs: DocExamples) -> None:
    text = render("{{check:profile --profile vllm-v1}}", only_examples(docs, "profile"))
    assert text.endswith("$ echo $?\n1")
    assert "1 errors, 0 warnings" in text


def test_an_unused_example_is_refused(docs: DocExamples) -> None:
    with pytest.raises(ValueError, match="never used in the template: ex:reject"):
        render("{{ex:no-idle}}", only_examples(docs, "no-idle", "reject"))


def test_an_unknown_placeholder_is_refused(docs: DocExamples) -> None:
    with pytest.raises(ValueError, match="no ex named 'no-such-example'"):
        render("{{ex:no-such-example}}", only_examples(docs))
    with pytest.raises(ValueError, match="unknown placeholder"):
        render("{{table:no-idle}}", only_examples(docs))
    with pytest.raises(ValueError, match="line 2 of the rendered page"):
        render("ok\n{{ex:}}", only_examples(docs))


# -- docs/trace-format.md: its quoted messages and outputs are the code's -------------------

TRACE_FORMAT = ROOT / "docs" / "trace-format.md"
HEADER = json.dumps(header_dict(Config(block_size=4, num_gpu_blocks=8,
                                       max_num_batched_tokens=16, max_num_seqs=2,
                                       max_model_len=32))).encode() + b"\n"


def step_line(**fields: object) -> bytes:
    return json.dumps({"step": 0, **fields}).encode() + b"\n"


def header_line(**fields: object) -> bytes:
    return json.dumps({**json.loads(HEADER), **fields}).encode() + b"\n"


def header_config_without(name: str) -> bytes:
    header = json.loads(HEADER)
    del header["config"][name]
    return json.dumps(header).encode() + b"\n"


ARRIVAL = {"id": "r0", "prompt_len": 4, "max_tokens": 4}

# Each row of the "Malformed input" table, by its first column: a trace showing it.
MALFORMED: dict[str, bytes] = {
    "an empty file": b"",
    "a first line that is not a header": step_line(),
    "another version": header_line(version=2),
    "`engine` not an object": header_line(engine="vllm"),
    "no `config`": header_config_without("watermark_blocks").replace(
        b'"config"', b'"konfig"'),
    "a config field missing": header_config_without("watermark_blocks"),
    "a config field out of range": header_line(
        config={**json.loads(HEADER)["config"], "block_size": 0}),
    "a config word it does not know": header_line(
        config={**json.loads(HEADER)["config"], "allocation": "eager"}),
    "a line that is not JSON": HEADER + b'{"step": 0,,}\n',
    "a last line cut short": HEADER + b'{"step": 0, "sched',
    "bytes that are not UTF-8": HEADER + b'{"step": 0, "x": "\xff"}\n',
    "a step line that is not an object": HEADER + b"[0]\n",
    "a line that is just `null`": HEADER + b"null\n" + step_line(),
    "a key twice in one object": HEADER + b'{"step": 0, "scheduled": [], "scheduled": []}\n',
    "`NaN` or `Infinity`": HEADER + b'{"step": 0, "time_ms": NaN}\n',
    "no `step`": HEADER + b'{"scheduled": []}\n',
    "a gap in the numbering": HEADER + step_line() + b'{"step": 2}\n',
    "a negative number": HEADER + b'{"step": -1}\n',
    "a number above $2^{40}$": HEADER + step_line(free_blocks=2_000_000_000_000),
    "a list field that is not a list": HEADER + step_line(arrivals=ARRIVAL),
    "an arrival that is not an object": HEADER + step_line(arrivals=["r0"]),
    "an arrival without a field": HEADER + step_line(arrivals=[{"id": "r0", "prompt_len": 4}]),
    "an empty id": HEADER + step_line(arrivals=[{**ARRIVAL, "id": ""}]),
    "a prompt of 0 tokens": HEADER + step_line(arrivals=[{**ARRIVAL, "prompt_len": 0}]),
    "a count that is not an integer": HEADER + step_line(arrivals=[{**ARRIVAL,
                                                                    "prompt_len": 4.5}]),
    "a priority that is not an integer": HEADER + step_line(arrivals=[{**ARRIVAL,
                                                                       "priority": "high"}]),
    "an id list with a non-string": HEADER + step_line(aborted=[3]),
    "a rejection that is not an object": HEADER + step_line(rejected=["r0"]),
    "a preemption that is not an object": HEADER + step_line(preempted=["r0"]),
    "an unknown preemption mode": HEADER + step_line(preempted=[{"id": "r0", "mode": "evict"}]),
    "a scheduled entry that is not a pair": HEADER + step_line(scheduled=[["r0", 4, 1]]),
    "a token count that is not an integer": HEADER + step_line(scheduled=[["r0", "4"]]),
    "a scheduled id that is not a string": HEADER + step_line(scheduled=[[0, 4]]),
    "a negative `free_blocks`": HEADER + step_line(free_blocks=-1),
    "`new_blocks` not an object": HEADER + step_line(new_blocks=[1, 2]),
    "a `new_blocks` entry not a list": HEADER + step_line(new_blocks={"r0": 1}),
    "a negative block id": HEADER + step_line(new_blocks={"r0": [-1]}),
    "a bad `time_ms`": HEADER + step_line(time_ms="3ms"),
    "a `prefix_hits` entry not a list": HEADER + step_line(prefix_hits={"r0": 1}),
    "a block key not a string": HEADER + step_line(block_keys={"r0": [1]}),
    "a line after the end line": HEADER + step_line() + b'{"end": true}\n{"step": 1}\n',
}


def fenced_after(text: str, marker: str, lang: str) -> str:
    """The body of the first ```lang block after `marker` in `text`."""
    start = text.index(marker)
    opening = text.index(f"```{lang}\n", start) + len(f"```{lang}\n")
    return text[opening:text.index("```", opening)]


def table_rows(text: str, heading: str) -> dict[str, str]:
    """The rows of the table whose header row is `heading`: first column to second."""
    lines = text[text.index(heading):].splitlines()[2:]
    rows = {}
    for line in lines:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1]
    return rows


def refusal(data: bytes) -> str:
    try:
        check_trace(TraceReader(io.BytesIO(data)))
    except TraceError as e:
        return str(e)
    return "(read without error)"


def test_trace_format_quotes_each_refusal_as_the_reader_words_it() -> None:
    rows = table_rows(TRACE_FORMAT.read_text(encoding="utf-8"), "| input | message |")
    assert set(rows) == set(MALFORMED), (
        "the Malformed input table of docs/trace-format.md and MALFORMED here list "
        f"different rows: {sorted(set(rows) ^ set(MALFORMED))}")
    wrong = {row: (quoted, refusal(MALFORMED[row])) for row, quoted in rows.items()
             if quoted != f"`{refusal(MALFORMED[row])}`"}
    assert not wrong, "docs/trace-format.md quotes messages the reader no longer says " \
        "(row: (quoted, said)):\n" + "\n".join(f"{k}: {v}" for k, v in wrong.items())


def run_python(code: str, cwd: Path, *args: str) -> str:
    result = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_trace_format_example_is_what_its_code_writes_and_checks_clean(
        tmp_path: Path) -> None:
    text = TRACE_FORMAT.read_text(encoding="utf-8")
    code = fenced_after(text, "This trace comes from a real simulation", "python")
    shown = fenced_after(text, "Its output, verbatim:", "json")
    written = run_python(code, tmp_path)
    assert written == shown, "the complete example of docs/trace-format.md is not what " \
        f"its code writes today; replace it with:\n{written}"
    (tmp_path / "example.jsonl").write_text(written)
    result = subprocess.run([sys.executable, "-m", "kvsched", "check", "--strict",
                             "example.jsonl"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    verdict = fenced_after(text, "`kvsched check --strict` passes it:", "text")
    assert result.returncode == 0 and result.stdout == verdict, result.stdout + result.stderr


def test_trace_format_schema_snippet_prints_what_it_shows(tmp_path: Path) -> None:
    text = TRACE_FORMAT.read_text(encoding="utf-8")
    code = fenced_after(text, "To validate a trace with the `jsonschema` package:", "python")
    shown = fenced_after(text, "On four malformed lines", "text")
    header = json.loads(HEADER)
    del header["config"]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(step_line(free_blocks=-1)
                    + step_line(preempted=[{"id": "r0", "mode": "evict"}])
                    + step_line(scheduled=[["r0", 4, 1]]) + json.dumps(header).encode())
    code = code.replace('open("docs/trace-v1.schema.json")',
                        f"open({str(ROOT / 'docs' / 'trace-v1.schema.json')!r})")
    assert run_python(code, tmp_path, str(bad)) == shown


SCHEDULER_PAGE = ROOT / "docs" / "scheduler-interface.md"


def test_the_minimal_scheduler_of_the_interface_page_is_correct(tmp_path: Path) -> None:
    from kvsched.conformance import check_records
    from kvsched.generators import generate
    from kvsched.simulate import run
    from kvsched.spec import Scheduler

    code = fenced_after(SCHEDULER_PAGE.read_text(encoding="utf-8"), "## A minimal scheduler",
                        "python")
    namespace: dict[str, object] = {}
    exec(compile(code, str(SCHEDULER_PAGE), "exec"), namespace)
    make = namespace["OneAtATime"]
    assert callable(make)
    configs = [Config(block_size=16, num_gpu_blocks=64, max_num_batched_tokens=256,
                      max_model_len=512),
               Config(block_size=4, num_gpu_blocks=40, max_num_batched_tokens=128,
                      max_model_len=128, chunked_prefill=False)]
    rejected = 0
    for config in configs:
        for seed in range(4):
            workload = generate("uniform", 15, seed, max_model_len=config.max_model_len * 2)
            scheduler = make(config)
            assert isinstance(scheduler, Scheduler)
            records = list(run(scheduler, workload, max_steps=20_000))
            report = check_records(config, records, complete=not scheduler.has_unfinished(),
                                   strict=True)
            assert report.complete and not report.failed, report.violations[:3]
            rejected += sum(len(r.rejected) for r in records)
    assert rejected > 0  # prompts up to twice max_model_len: some can never complete
    # And through kvsched fuzz, as the page says.
    (tmp_path / "one_at_a_time.py").write_text(
        code + "\n\ndef make(config: Config) -> OneAtATime:\n    return OneAtATime(config)\n")
    result = subprocess.run([sys.executable, "-m", "kvsched", "fuzz", "one_at_a_time:make",
                             "--examples", "20", "--strict"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


CLI_PAGE = ROOT / "docs" / "cli.md"


def test_cli_md_quotes_what_the_default_run_prints(tmp_path: Path) -> None:
    from kvsched.cli import DEFAULT_CONFIG, DEFAULT_RATE, DEFAULT_REQUESTS

    text = CLI_PAGE.read_text(encoding="utf-8")
    c = DEFAULT_CONFIG
    assert (f"{DEFAULT_REQUESTS} ShareGPT-like requests arriving as a Poisson process "
            f"({DEFAULT_RATE} per step) on a {c.num_gpu_blocks}-block") in text
    assert (f"cache (`block_size` {c.block_size}, `max_num_seqs` {c.max_num_seqs}, "
            f"`max_num_batched_tokens` {c.max_num_batched_tokens},\n`max_model_len` "
            f"{c.max_model_len})") in text
    shown = fenced_after(text, "## `kvsched check TRACE...`", "").splitlines()
    assert shown[:2] == ["$ kvsched simulate --out trace.jsonl > /dev/null",
                         "$ kvsched check trace.jsonl"]
    for args in (["simulate", "--out", "trace.jsonl"], ["check", "trace.jsonl"]):
        result = subprocess.run([sys.executable, "-m", "kvsched", *args], cwd=tmp_path,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == shown[2:], result.stdout
