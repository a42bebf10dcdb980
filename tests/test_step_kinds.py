"""What each step kind reads (kvsched.spec.step_kinds): one table, and every tool and
implementation refusing, in one line, a config its step kind would silently ignore."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from kvsched.spec.knobs import Knobs, SGLangKnobs
from kvsched.spec.model import Config
from kvsched.spec.profiles import PROFILES, get_profile
from kvsched.spec.step_kinds import STEP_KINDS, ignored_fields, refusal

SGLANG = get_profile("sglang@0.5.23")
SGLANG_CONFIG = SGLANG.configure(Config())


def test_every_kind_says_of_every_config_field_what_it_honours() -> None:
    names = {f.name for f in fields(Config)}
    for step in STEP_KINDS.values():
        assert step.reads | set(step.takes) == names, step.name
        assert not step.reads & set(step.takes), step.name
        assert set(step.why) == set(step.takes), step.name
        assert step.knob_fields <= {f.name for f in fields(step.knobs)}, step.name
    assert STEP_KINDS["v1"].knobs is Knobs and STEP_KINDS["sglang"].knobs is SGLangKnobs
    assert "victim" not in STEP_KINDS["v0"].knob_fields


@pytest.mark.parametrize(("name", "value"), [
    ("allocation", "full"), ("allocation", "prompt"), ("preemption", "swap"),
    ("num_cpu_blocks", 8), ("watermark_blocks", 4), ("long_prefill_token_threshold", 32),
    ("step_mix", "any"), ("watermark_scope", "always")])
def test_sglangs_step_refuses_what_it_ignores(name: str, value: object) -> None:
    config = replace(SGLANG_CONFIG, **{name: value})  # type: ignore[arg-type]
    assert ignored_fields("sglang", config) == [name]
    why = refusal("sglang", config)
    assert why is not None and why.startswith(f"SGLang's step does not honour {name} ")
    assert "\n" not in why


def test_vllms_steps_take_mixed_steps_only_and_v0_no_threshold() -> None:
    for mix in ("prefill_or_decode", "mixed_chunk"):
        assert ignored_fields("v1", replace(Config(), step_mix=mix)) == ["step_mix"]
        assert ignored_fields("v0", replace(Config(), step_mix=mix)) == ["step_mix"]
    threshold = replace(Config(), long_prefill_token_threshold=32)
    assert refusal("v1", threshold) is None
    assert ignored_fields("v0", threshold) == ["long_prefill_token_threshold"]


def test_every_profile_runs_its_own_defaults() -> None:
    for profile in PROFILES.values():
        assert profile.refusal(profile.configure(Config())) is None, profile.name
    why = SGLANG.refusal(replace(SGLANG_CONFIG, allocation="full"))
    assert why is not None and why.startswith("profile sglang@0.5.23: SGLang's step")
