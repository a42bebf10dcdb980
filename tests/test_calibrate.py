"""`kvsched calibrate` reports the three numbers of auto preemption's cost model and the
crossover they imply; tools.bench_cost compares the preemption modes on one workload."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest

from kvsched.spec.knobs import CostModel
from tools import bench_cost

# 2 layers x 2 KV heads x 8 dims x 4 bytes (float32) x 4 tokens, K and V: 1,024 bytes.
TINY = ["--layers", "2", "--kv-heads", "2", "--heads", "4", "--head-dim", "8",
        "--dtype", "float32", "--block-size", "4", "--blocks", "4", "--tokens", "8",
        "--repeats", "1", "--threads", "1"]
TINY_BYTES_PER_BLOCK = 2 * 2 * 2 * 8 * 4 * 4

# Small enough to run in a second, short enough of GPU blocks that `swap` both swaps
# and (host full) recomputes.
TINY_WORKLOAD = ("--profile", "vllm-v1-no-prefix-caching", "--num-gpu-blocks", "32",
                 "--num-cpu-blocks", "32", "--max-num-seqs", "8", "--max-model-len", "256",
                 "--requests", "30", "--rate", "1", "--seed", "0")
SWAP_ALWAYS_CHEAPER = CostModel(bytes_per_block=1, host_bandwidth=1e15,
                                prefill_tokens_per_s=1.0)
RECOMPUTE_ALWAYS_CHEAPER = CostModel(bytes_per_block=1 << 30, host_bandwidth=1.0,
                                     prefill_tokens_per_s=1e15)


def kvsched(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def calibration() -> dict[str, Any]:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("kvsched calibrate needs torch")
    result = kvsched("calibrate", *TINY, "--format", "json")
    assert result.returncode == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def test_bytes_per_block_is_k_and_v_of_every_layer_for_one_block(
        calibration: dict[str, Any]) -> None:
    assert calibration["bytes_per_block"] == TINY_BYTES_PER_BLOCK
    assert calibration["shape"] == {"layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 8,
                                    "dtype": "float32", "block_size": 4, "hidden": 32,
                                    "mlp_size": 128}


def test_the_crossover_is_what_the_three_numbers_imply(
        calibration: dict[str, Any]) -> None:
    bpb, bw, prefill = (calibration["bytes_per_block"], calibration["host_bandwidth"],
                        calibration["prefill_tokens_per_s"])
    assert isinstance(bpb, int) and isinstance(bw, float) and isinstance(prefill, float)
    assert bw > 0 and prefill > 0
    crossover = calibration["crossover_tokens_per_block"]
    assert crossover == pytest.approx(2 * bpb * prefill / bw, rel=1e-12)
    # At the crossover both cost the same (recompute wins ties); above it swap wins.
    cost = CostModel(bpb, bw, prefill)
    assert cost.swap_seconds(10) == pytest.approx(cost.recompute_seconds(10 * crossover))
    assert cost.prefers_swap(10, int(10 * crossover * 1.01) + 1)
    assert not cost.prefers_swap(10, int(10 * crossover * 0.99))


def test_the_printed_simulate_flags_are_the_measured_numbers(
        calibration: dict[str, Any]) -> None:
    flags = calibration["simulate_flags"]
    assert isinstance(flags, list)
    given = dict(zip(flags[::2], flags[1::2], strict=True))
    assert set(given) == {"--swap-bytes-per-block", "--host-bandwidth",
                          "--prefill-tokens-per-s"}
    assert int(given["--swap-bytes-per-block"]) == TINY_BYTES_PER_BLOCK
    assert float(given["--host-bandwidth"]) == pytest.approx(calibration["host_bandwidth"],
                                                             rel=1e-3)
    assert float(given["--prefill-tokens-per-s"]) == pytest.approx(
        calibration["prefill_tokens_per_s"], rel=1e-3)
    # ... and `kvsched simulate` takes them.
    result = kvsched("simulate", *TINY_WORKLOAD, "--preemption", "auto", *flags,
                     "--check", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["violations"] == {}


def test_on_a_cpu_it_says_the_copy_stays_in_host_memory(
        calibration: dict[str, Any]) -> None:
    if calibration["device"] != "cpu":
        pytest.skip("a CUDA device is there: the copy crosses the host link")
    notes = calibration["notes"]
    assert isinstance(notes, list)
    assert any("not a transfer over a host link" in n for n in notes)
    assert calibration["pinned"] or any("pinned memory is unavailable" in n for n in notes)


def test_the_text_names_the_side_that_always_wins() -> None:
    from kvsched.calibrate import Calibration, Shape, render

    shape = Shape(block_size=16)
    swaps = Calibration(shape, "cpu", 1, 65536, 1e10, 1e4, False, 4, 8, 1)
    assert swaps.crossover == pytest.approx(0.131072)
    assert "auto swaps every victim" in render(swaps)
    recomputes = Calibration(shape, "cpu", 1, 65536, 1e6, 1e4, False, 4, 8, 1)
    assert recomputes.crossover > 16
    assert "auto recomputes every victim" in render(recomputes)
    between = Calibration(shape, "cpu", 1, 65536, 1e9, 1e4, False, 4, 8, 1)
    assert "every victim" not in render(between)


@pytest.mark.parametrize(("args", "message"), [
    (["--layers", "0"], "--layers must be at least 1, got 0"),
    (["--kv-heads", "2", "--heads", "3"], "--heads (3) must be a multiple of --kv-heads (2)"),
    (["--mlp-size", "0"], "--mlp-size must be at least 1, got 0"),
    (["--blocks", "0"], "--blocks must be at least 1, got 0"),
    (["--threads", "0"], "--threads must be at least 1, got 0"),
    (["--dtype", "int8"], "'int8' is not one of"),
    (["--layers", "two"], "'two' is not a valid integer"),
])
def test_bad_flags_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = kvsched("calibrate", *args)
    assert result.returncode == 2
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("kvsched: error: ") and message in line, line


def test_without_torch_the_cli_still_works_and_calibrate_says_what_is_missing() -> None:
    hide_torch = ("import sys; sys.modules['torch'] = None; sys.argv[0] = 'kvsched'; "
                  "from kvsched.cli import main; main()")
    result = subprocess.run([sys.executable, "-c", hide_torch, "calibrate"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == ("kvsched: error: kvsched calibrate needs torch: "
                                     "pip install 'kvsched[gpu]'")
    result = subprocess.run([sys.executable, "-c", hide_torch, "profiles"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


# -- the comparison (tools/bench_cost.py) ---------------------------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bench_cost.Outcome]:
    tmp = tmp_path_factory.mktemp("bench_cost")
    modes: list[tuple[str, str, CostModel | None]] = [
        ("recompute", "recompute", None), ("swap", "swap", None),
        ("auto-swap", "auto", SWAP_ALWAYS_CHEAPER),
        ("auto-recompute", "auto", RECOMPUTE_ALWAYS_CHEAPER)]
    return {label: bench_cost.simulate(label, mode, TINY_WORKLOAD, cost, tmp / f"{label}.jsonl")
            for label, mode, cost in modes}


def test_the_tiny_workload_preempts_both_ways(runs: dict[str, bench_cost.Outcome]) -> None:
    for o in runs.values():
        assert o.complete and o.violations == 0
    assert runs["recompute"].recomputes > 0 and runs["recompute"].swaps == 0
    assert runs["swap"].swaps > 0 and runs["swap"].swap_ins == runs["swap"].swaps
    # The host ran short at times: swap mode recomputed those victims.
    assert runs["swap"].recomputes > 0


def test_auto_where_swap_is_always_cheaper_is_swap(runs: dict[str, bench_cost.Outcome]
                                                   ) -> None:
    assert runs["auto-swap"].figures() == runs["swap"].figures()
    assert runs["auto-swap"].step_lines == runs["swap"].step_lines


def test_auto_where_recompute_is_always_cheaper_is_recompute(
        runs: dict[str, bench_cost.Outcome]) -> None:
    assert runs["auto-recompute"].figures() == runs["recompute"].figures()
    assert runs["auto-recompute"].step_lines == runs["recompute"].step_lines


def test_the_trace_agrees_with_the_summary(runs: dict[str, bench_cost.Outcome]) -> None:
    for o in runs.values():
        assert sum(v.mode == "swap" for v in o.victims) == o.swaps
        assert sum(v.computed for v in o.victims if v.mode == "recompute") == \
            o.recomputed_tokens
    swap = runs["swap"]
    cost = CostModel(1000, 1e6, 100.0)
    assert swap.modeled_seconds(cost) == pytest.approx(
        2 * swap.swapped_blocks * 1000 / 1e6 + swap.recomputed_tokens / 100)


def test_the_section_says_which_mode_auto_matched(runs: dict[str, bench_cost.Outcome]
                                                  ) -> None:
    calibration = {
        "shape": {"layers": 4, "heads": 4, "kv_heads": 4, "head_dim": 64,
                  "dtype": "bfloat16", "block_size": 16},
        "blocks": 256, "tokens": 512, "repeats": 5, "threads": 1, "device": "cpu",
        "notes": ["a note"],
        "bytes_per_block": 1024, "host_bandwidth": 1e9, "prefill_tokens_per_s": 1e4,
        "crossover_tokens_per_block": 0.02,
        "simulate_flags": ["--swap-bytes-per-block", "1024", "--host-bandwidth", "1e+09",
                           "--prefill-tokens-per-s", "1e+04"]}
    outcomes = [runs["recompute"], runs["swap"], runs["auto-recompute"],
                replace(runs["auto-swap"], label="auto, calibrated")]
    text = bench_cost.render(calibration, outcomes, "python -m tools.bench_cost", "a machine")
    assert text.startswith(bench_cost.START) and text.rstrip().endswith(bench_cost.END)
    assert "wrote the same trace as `swap`, step for step" in text
    assert "- a note" in text
    assert "issue" not in text.lower()

