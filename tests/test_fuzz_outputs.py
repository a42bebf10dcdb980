"""kvsched fuzz's outputs: a factory that raises is bad input, not a finding; --help says
which config fields are drawn; the config file beside a finding records the campaign
that was run; and a run changes nothing in the working directory but what it names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvsched.fuzz import FactoryRaised, check_case
from kvsched.spec import Config
from kvsched.testing.seeded_bugs import SEEDED_BUGS

# The user's modules, in a folder of their own (on PYTHONPATH), apart from the working
# directory the command runs in.
USER_MODULE = '''
from kvsched.testing.seeded_bugs import SEEDED_BUGS


def make(config):
    """The reference with a token budget compared by <=."""
    return SEEDED_BUGS["token-budget-off-by-one"].factory(config)


def boom(config):
    raise RuntimeError("boom")
'''


def kvsched(*args: str, modules: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(modules)}
    env.pop("HYPOTHESIS_STORAGE_DIRECTORY", None)
    return subprocess.run([sys.executable, "-m", "kvsched", *args], capture_output=True,
                          text=True, timeout=300, env=env, cwd=cwd)


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[subprocess.CompletedProcess[str], Path]:
    """A campaign of 200 examples (two shards of 100) that finds the planted fault, run
    in an empty working directory with its outputs named there."""
    modules = tmp_path_factory.mktemp("modules")
    (modules / "my_engine.py").write_text(USER_MODULE)
    cwd = tmp_path_factory.mktemp("cwd")
    result = kvsched("fuzz", "my_engine:make", "--examples", "200", "--seed", "0",
                     "--out", "minimal.jsonl", modules=modules, cwd=cwd)
    return result, cwd


def test_a_factory_that_raises_is_one_line_of_bad_input(tmp_path: Path) -> None:
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "my_engine.py").write_text(USER_MODULE)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = kvsched("fuzz", "my_engine:boom", "--examples", "20", modules=modules,
                     cwd=cwd)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("kvsched: error: my_engine:boom: the factory raised "
                                    "RuntimeError: boom; it built no scheduler for the "
                                    "config block_size=")
    assert "at step 0" not in result.stderr
    assert list(cwd.iterdir()) == []  # no minimal workload for it


def test_check_case_refuses_a_factory_that_raises() -> None:
    bug = SEEDED_BUGS["token-budget-off-by-one"]

    def refuses(config: Config) -> object:
        raise ValueError("swap is not supported\nmore")

    with pytest.raises(FactoryRaised, match=r"^the factory raised ValueError: swap is not "
                                            r"supported; it built no scheduler"):
        check_case(refuses, bug.config, bug.workload)  # type: ignore[arg-type]


def test_help_says_which_config_fields_are_drawn(tmp_path: Path) -> None:
    result = kvsched("fuzz", "--help", modules=tmp_path, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # as one line: help wraps where it likes
    for option in ("--block-size INTEGER Tokens per KV block.",
                   "--num-gpu-blocks INTEGER Usable GPU KV blocks.",
                   "--policy [fcfs|priority] Queue order."):
        assert f"{option} [default: drawn per example]" in text
    assert "(full, Orca and TGI); later chunks take the blocks they fill. [default: lazy]" \
        in text
    assert "unless the profile sets it" not in text  # simulate's defaults


def test_the_config_file_records_the_campaign_that_ran(
        campaign: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    result, cwd = campaign
    assert result.returncode == 1, result.stdout + result.stderr
    sidecar = json.loads((cwd / "minimal.config.json").read_text())
    assert (sidecar["scheduler"], sidecar["seed"], sidecar["examples"],
            sidecar["shard_examples"]) == ("my_engine:make", 0, 200, 100)
    assert sidecar["found_by_shard"] == {"shard": 0, "seed": 0, "examples": 100}
    assert sidecar["found_alone_by"].endswith(
        "--seed 0 --examples 100 --shard-examples 100")
    assert sidecar["runs"] > 0 and sidecar["invariant"] == "token-budget"


def test_a_run_leaves_the_working_directory_as_it_was_but_its_outputs(
        campaign: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    result, cwd = campaign
    assert result.returncode == 1, result.stdout + result.stderr
    assert sorted(p.name for p in cwd.iterdir()) == ["minimal.config.json",
                                                     "minimal.jsonl"]
