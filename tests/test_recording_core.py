"""An engine is a value: the table of engines (kvsched.adapters.engines), the `kvsched
record` subcommands made from it, the recording core that belongs to no engine (no
engine's module imports another engine's), and an engine's own step keys known to the
trace readers (kvsched's own traces get no "ignored unknown keys" note)."""

from __future__ import annotations

import ast
import gzip
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Ran

from kvsched.adapters.engines import ENGINES, engine_named
from kvsched.adapters.recording import Engine, Job, Recorded, TraceFile
from kvsched.adapters.vllm_v0 import RecordedV0
from kvsched.commands.record import record
from kvsched.optimized.checker import check_trace_vectorized
from kvsched.spec.model import Config
from kvsched.spec.profiles import get_profile
from kvsched.spec.step_kinds import STEP_KINDS
from kvsched.spec.trace import TraceReader

ROOT = Path(__file__).resolve().parent.parent
ADAPTERS = ROOT / "src" / "kvsched" / "adapters"
# Each engine's host-side modules: its adapter and what only it uses.
ENGINE_MODULES = {"vllm": ("vllm", "vllm_releases"), "vllm-v0": ("vllm_v0",),
                  "sglang": ("sglang",), "lmdeploy": ("lmdeploy",)}
STORES = {"sglang": ROOT / "tests" / "data" / "sglang",
          "vllm-v0": ROOT / "tests" / "data" / "vllm-v0",
          "lmdeploy": ROOT / "tests" / "data" / "lmdeploy"}


def test_every_engine_is_one_value_of_the_table() -> None:
    names = [e.name for e in ENGINES]
    assert sorted(names) == sorted(ENGINE_MODULES)
    assert len(set(names)) == len(names)
    for engine in ENGINES:
        assert engine_named(engine.name) is engine
        assert engine.driver.is_file(), engine.driver
        assert engine.driver.parent == ADAPTERS
        assert not engine.python.is_absolute()
        assert engine.make_env in (ROOT / "Makefile").read_text()
        assert engine.help.strip() and engine.label
        # Its step kind is its profile's: what its recordings replay under.
        assert get_profile(engine.profile).scheduler == engine.step_kind
        assert engine.kind is STEP_KINDS[engine.step_kind]


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
def test_every_engine_reports_a_stalled_job_as_its_failure(
        engine: Engine[Any], tmp_path: Path) -> None:
    """Every driver ends a job its engine stalls in (driver_host.run_job) with a done
    event carrying "stalled": the core reads it, and the engine's failure says it."""
    recorded = RecordedV0 if engine.name == "vllm-v0" else Recorded  # V0's has its own
    job = Job("j", Config(), [], tmp_path / "t.jsonl")
    done = {"done": "j", "complete": True, "steps": 9, "stalled": 7}
    result = TraceFile(job, recorded(job, Config()), {}).done(done)
    assert result.complete and result.stalled == 7 and (tmp_path / "t.jsonl").exists()
    assert engine.failed(result) == (
        f"{engine.label} stalled from step 7: it decides nothing more with requests left "
        "(the trace ends there; kvsched check names them)")
    assert engine.failed(recorded(job, Config(), complete=True)) is None


def options_of(command_name: str) -> set[str]:
    command = record.commands[command_name]
    return {opt for p in command.params for opt in p.opts}


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
def test_record_has_one_subcommand_per_engine_made_from_its_value(engine: Engine[Any]
                                                                   ) -> None:
    assert set(record.commands) == {e.name for e in ENGINES}
    options = options_of(engine.name)
    assert {"--workload", "--out", "--max-steps", engine.python_flag} <= options
    assert ("--allow-undersized-cache" in options) == engine.refuses_undersized_cache
    assert ("--release" in options) == (engine.release_python is not None)
    assert record.commands[engine.name].help == engine.help


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
def test_a_missing_environment_names_the_engine_and_how_to_make_it(
        engine: Engine[Any], tmp_path: Path, cli: Callable[..., Ran]) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"id": "a", "arrival": 0, "prompt_len": 8,
                                    "output_len": 2, "max_tokens": 2}) + "\n")
    missing = tmp_path / "nowhere" / "python"
    ran = cli("record", engine.name, "--workload", str(workload), "--out",
              str(tmp_path / "t.jsonl"), engine.python_flag, str(missing))
    assert ran.exit_code == 2
    assert ran.stderr == (f"kvsched: error: {missing}: {engine.label}'s Python environment is "
                          f"missing; {engine.setup_hint}\n")
    assert not (tmp_path / "t.jsonl").exists()


def imported_modules(path: Path) -> set[str]:
    """The kvsched.adapters modules `path` imports, by their last name."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module == "kvsched.adapters":
                found |= {a.name for a in node.names}
            elif node.module.startswith("kvsched.adapters."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] for a in node.names
                      if a.name.startswith("kvsched.adapters.")}
    return found


@pytest.mark.parametrize("name", sorted(ENGINE_MODULES))
def test_no_engine_module_imports_another_engines(name: str) -> None:
    others = {m for n, ms in ENGINE_MODULES.items() if n != name for m in ms}
    for module in ENGINE_MODULES[name]:
        imported = imported_modules(ADAPTERS / f"{module}.py")
        assert not imported & others, (module, imported & others)


def test_the_recording_core_imports_no_engine() -> None:
    engines = {m for ms in ENGINE_MODULES.values() for m in ms}
    assert not imported_modules(ADAPTERS / "recording.py") & engines


def kept_traces(engine: str) -> list[tuple[str, bytes]]:
    store = STORES[engine]
    return [(p.name, gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes())
            for p in sorted(store.iterdir()) if ".jsonl" in p.name]


@pytest.mark.parametrize("engine", sorted(STORES))
def test_kept_traces_of_an_engine_have_no_unknown_keys(engine: str) -> None:
    traces = kept_traces(engine)
    assert traces
    for name, data in traces:
        reader = TraceReader(io.BytesIO(data))
        for _ in reader:
            pass
        assert reader.unknown_keys == {}, name


@pytest.mark.parametrize("engine", sorted(STORES))
def test_the_vectorized_checker_notes_no_engine_key_either(engine: str) -> None:
    name, data = min(kept_traces(engine), key=lambda t: len(t[1]))
    report = check_trace_vectorized(io.BytesIO(data))
    assert report.unknown_keys == {}, name
    # A key no engine writes is still noted, with its line.
    lines = data.splitlines(keepends=True)
    lines[1] = lines[1].rstrip(b"}\n") + b', "mystery": 1}\n'
    assert check_trace_vectorized(io.BytesIO(b"".join(lines))).unknown_keys == {"mystery": 2}


# Each engine's conformance suites; what they share is conformance/common.py's.
SUITES = {"vllm": ("vllm", "vllm_releases"), "vllm-v0": ("vllm_v0",), "sglang": ("sglang",),
          "lmdeploy": ("lmdeploy",)}


def imported_suites(path: Path) -> set[str]:
    """The conformance modules `path` imports, by their last name."""
    return {node.module.split(".")[1] for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module is not None
            and node.module.startswith("conformance.")}


@pytest.mark.parametrize("name", sorted(SUITES))
def test_no_suite_imports_another_engines(name: str) -> None:
    others = {m for n, ms in SUITES.items() if n != name for m in ms}
    for suite in SUITES[name]:
        imported = imported_suites(ROOT / "conformance" / f"{suite}.py")
        assert "common" in imported and not imported & others, (suite, imported)
