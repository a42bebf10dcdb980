"""kvsched simulate --scheduler torch writes the reference's trace, and kvsched check
--checker vectorized gives the spec checker's verdict; bad combinations are one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# Without prefix caching here (vllm-v1, the default, turns it on); the caching run is
# test_both_schedulers_cache_prefixes_alike.
SMALL = ["--requests", "40", "--num-gpu-blocks", "64", "--max-num-seqs", "8",
         "--max-model-len", "1024", "--rate", "0.5", "--no-prefix-caching"]


def kvsched(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("cli")
    out = {}
    for implementation in ("reference", "torch"):
        path = folder / f"{implementation}.jsonl"
        result = kvsched("simulate", *SMALL, "--policy", "priority", "--scheduler",
                         implementation, "--out", str(path))
        assert result.returncode == 0, result.stderr
        out[implementation] = path
    return out


def test_both_schedulers_write_the_same_steps(traces: dict[str, Path]) -> None:
    reference = traces["reference"].read_text().splitlines()
    optimized = traces["torch"].read_text().splitlines()
    assert reference[1:] == optimized[1:]  # every step line, byte for byte
    assert json.loads(reference[-1]) == {"end": True}
    engines = [json.loads(x[0])["engine"] for x in (reference, optimized)]
    assert engines[0]["name"] == "kvsched-reference"
    assert engines[1]["name"] == "kvsched-torch" and engines[1]["device"] == "cpu"


def test_both_schedulers_cache_prefixes_alike(tmp_path: Path) -> None:
    """vllm-v1 (prefix caching on) over conversations: same hits, same content keys."""
    args = [*SMALL[:-1], "--generator", "conversations", "--turns", "3"]
    lines = {}
    for implementation in ("reference", "torch"):
        path = tmp_path / f"{implementation}.jsonl"
        result = kvsched("simulate", *args, "--scheduler", implementation, "--out", str(path))
        assert result.returncode == 0, result.stderr
        lines[implementation] = path.read_text().splitlines()
    assert json.loads(lines["torch"][0])["config"]["prefix_caching"] is True
    assert lines["reference"][1:] == lines["torch"][1:]
    assert any('"prefix_hits"' in line for line in lines["torch"])


def test_both_checkers_give_the_same_report(traces: dict[str, Path], tmp_path: Path) -> None:
    path = traces["torch"]
    # A leak planted in the trace: one step reports a free block too few.
    lines = path.read_text().splitlines()
    step = json.loads(lines[5])
    step["free_blocks"] -= 1
    lines[5] = json.dumps(step, separators=(",", ":"))
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join(lines) + "\n")
    for trace in (path, broken):
        results = {choice: kvsched("check", "--format", "json", "--checker", choice, str(trace))
                   for choice in ("spec", "vectorized", "auto")}
        assert results["spec"].stdout == results["vectorized"].stdout == results["auto"].stdout
        assert results["spec"].returncode == results["vectorized"].returncode
    [report] = json.loads(results["vectorized"].stdout)
    assert report["counts"] == {"accounting": 1} and results["vectorized"].returncode == 1


@pytest.mark.parametrize("reordered", [False, True])
def test_a_profile_the_compiled_scheduler_lacks_replays_beside_the_vectorized_checker(
        reordered: bool, tmp_path: Path) -> None:
    """vLLM V0's rules, which only the reference implements, replay beside the
    vectorized checker: the spec checker's report, word for word, on a kept V0 trace
    and on the same trace with one batch out of V0's order (a divergence)."""
    lines = (Path(__file__).parent / "data" / "vllm-v0" / "kind-swap-whole-fcfs.jsonl"
             ).read_text().splitlines()
    if reordered:
        at = next(k for k, line in enumerate(lines[1:], 1)
                  if len(json.loads(line).get("scheduled", ())) >= 2)
        step = json.loads(lines[at])
        step["scheduled"].reverse()
        lines[at] = json.dumps(step, separators=(",", ":"))
    path = tmp_path / "v0.jsonl"
    path.write_text("\n".join(lines) + "\n")
    results = {choice: kvsched("check", "--format", "json", "--profile", "vllm-v0",
                               "--checker", choice, str(path))
               for choice in ("spec", "vectorized", "auto")}
    assert results["spec"].stdout == results["vectorized"].stdout == results["auto"].stdout
    assert results["spec"].returncode == results["vectorized"].returncode == int(reordered)
    [report] = json.loads(results["vectorized"].stdout)
    assert ("profile" in report["counts"]) == reordered


@pytest.mark.parametrize("args, message", [
    (["simulate", *SMALL, "--scheduler", "reference", "--device", "cuda"],
     "--device applies to --scheduler torch"),
])
def test_bad_combinations_are_one_line(args: list[str], message: str,
                                       traces: dict[str, Path]) -> None:
    result = kvsched(*[str(traces["reference"]) if a == "TRACE" else a for a in args])
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_one_line() -> None:
    result = kvsched("simulate", *SMALL, "--scheduler", "torch", "--device", "cuda")
    assert result.returncode == 2
    assert "torch.cuda.is_available() is False" in result.stderr


def test_auto_without_the_compiled_module_falls_back_to_the_spec_checker_and_says_so(
        traces: dict[str, Path]) -> None:
    # An install without a C++ compiler (the compiled state cannot be imported): each
    # trace is checked, the note told once.
    path = str(traces["reference"])
    script = ("import sys; sys.modules['kvsched.optimized.state'] = None; "
              "from kvsched.cli import main; main()")
    result = subprocess.run([sys.executable, "-c", script, "check", path, path],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr == (
        "kvsched: note: the vectorized checker needs kvsched's compiled module, which this "
        "install lacks (it is built when kvsched is installed where a C++ compiler is); "
        "checking with the spec's checker\n")
    assert result.stdout.count(f"OK {path}: ") == 2
    explicit = subprocess.run([sys.executable, "-c", script, "check", "--checker",
                               "vectorized", path], capture_output=True, text=True,
                              timeout=300)
    assert explicit.returncode == 2 and explicit.stderr == (
        "kvsched: error: --checker vectorized needs kvsched's compiled module, which this "
        "install lacks (it is built when kvsched is installed where a C++ compiler is)\n")


def test_metrics_without_the_compiled_module_are_the_same_and_say_so(
        traces: dict[str, Path]) -> None:
    path = str(traces["reference"])
    fast = kvsched("metrics", path, "--format", "json")
    script = ("import sys; sys.modules['kvsched.optimized.state'] = None; "
              "from kvsched.cli import main; main()")
    slow = subprocess.run([sys.executable, "-c", script, "metrics", path, "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert fast.returncode == slow.returncode == 0, slow.stderr
    assert fast.stderr == ""
    assert slow.stderr == ("kvsched: note: kvsched's compiled module is not built here (it "
                           "is built when kvsched is installed where a C++ compiler is): "
                           "metrics on the spec's state\n")
    assert json.loads(slow.stdout) == json.loads(fast.stdout)


def test_the_former_name_optimized_runs_the_torch_scheduler_with_a_note() -> None:
    result = kvsched("simulate", *SMALL, "--scheduler", "optimized", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ("kvsched: note: --scheduler optimized is deprecated: it is "
                             "--scheduler torch\n")
    assert json.loads(result.stdout)["scheduler"] == "torch"
