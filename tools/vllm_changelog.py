"""docs/vllm-changelog.md: what each vLLM release changed in its v1 scheduler's
decisions, generated from the traces of every release that kvsched's driver recorded
(conformance.vllm_releases's store, tests/data/vllm-releases/store/).

    .venv/bin/python -m tools.vllm_changelog [--out docs/vllm-changelog.md]
    (make vllm-changelog)

For each pair of adjacent releases the page says whether they decide identically on
every case both recorded (the same trace bodies, or `kvsched diff` finding no
divergence), and where they do not, the first divergent step of each case (the
divergence `kvsched diff A B` reports). For each decision epoch
(kvsched.spec.profiles.VLLM_V1_EPOCHS): the rule, vLLM's source lines, the knob, the
first case that diverges from the epoch's profile with that rule flipped back, and
metric deltas on a few standard workloads. tests/test_vllm_changelog.py regenerates it
from the store and compares.
"""

from __future__ import annotations

import argparse
import io
import itertools
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from conformance.vllm import FLIPPABLE, Verdict, case_named
from conformance.vllm_releases import NO_EPOCH, STORE, Stored, checked, stored
from kvsched.diff import Divergence, Stream, diff_streams, simulated, trace_stream
from kvsched.implementations import build_scheduler
from kvsched.metrics import Metrics, metrics_of_trace
from kvsched.reference import scheduler_for
from kvsched.spec.profiles import (
    VLLM_V1_EPOCHS,
    VLLM_V1_RELEASE_LIST,
    Epoch,
    vllm_v1_epoch,
)
from kvsched.spec.replay import ProfileReplay
from kvsched.spec.trace import TraceReader

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "vllm-changelog.md"
DETAILED = 4  # divergences shown with both versions, per epoch
# The standard workloads whose metrics each epoch's change is shown on.
STANDARD = ("fcfs-tight", "priority-tight", "no-chunked-priority-tight", "threshold",
            "prefix-conversations", "prefix-tight-readmit")


@dataclass(frozen=True)
class Pair:
    """Two adjacent releases' traces of one case, and where they part (None: never)."""

    case: str
    divergence: Divergence | None


def stream(trace: Stored) -> Stream:
    return trace_stream(f"{trace.release}/{trace.case}", TraceReader(io.BytesIO(trace.data)))


def body(trace: Stored) -> bytes:
    return trace.data[trace.data.index(b"\n") + 1:]


def compare(a: dict[str, Stored], b: dict[str, Stored]) -> list[Pair]:
    """Each case both releases recorded: identical bodies decide identically; others go
    through kvsched diff."""
    out = []
    for case in a:
        if case not in b:
            continue
        if body(a[case]) == body(b[case]):
            out.append(Pair(case, None))
        else:
            out.append(Pair(case, diff_streams(stream(a[case]), stream(b[case])).divergence))
    return out


def changed_knobs(before: Epoch, epoch: Epoch) -> dict[str, tuple[object, object]]:
    """The knobs `epoch` changed from `before`'s: name -> (before's value, its own)."""
    return {name: (getattr(before.knobs, name), getattr(epoch.knobs, name))
            for name in FLIPPABLE if getattr(before.knobs, name) != getattr(epoch.knobs, name)}


def flipped_divergence(epoch: Epoch, before: Epoch | None,
                       traces: Iterable[Stored]) -> tuple[str, int, int] | None:
    """Under the epoch's profile with its own change undone (the knobs it changed set
    back to the epoch before's), the first trace of the epoch's first release that
    diverges: (case, step, how many of them diverge); None if none does."""
    if before is None:
        return None
    knobs = replace(epoch.knobs, **{name: old for name, (old, _) in  # type: ignore[arg-type]
                                    changed_knobs(before, epoch).items()})
    profile = f"vllm-v1@{epoch.first}"
    first: tuple[str, int] | None = None
    count = 0
    for trace in traces:
        reader = TraceReader(io.BytesIO(trace.data))
        replay = ProfileReplay(profile, scheduler_for(reader.header.config, knobs, "v1"))
        step = next((rec.step for rec in reader if replay.step(rec) is not None), None)
        if step is not None:
            count += 1
            if first is None:
                first = (trace.case, step)
    return None if first is None else (*first, count)


def profile_divergence(case: str, before: Epoch, after: Epoch) -> int | None:
    """Where `kvsched diff vllm-v1@BEFORE vllm-v1@AFTER` on the case's config and
    workload finds the two profiles' runs first parting (None: never)."""
    c = case_named(case)
    workload = c.workload()
    sides = [simulated(f"vllm-v1@{e.first}", build_scheduler("compiled", c.config, e.knobs),
                       workload, {"name": "kvsched", "version": e.first})
             for e in (before, after)]
    divergence = diff_streams(*sides).divergence
    return None if divergence is None else divergence.step


def metrics(trace: Stored) -> Metrics:
    return metrics_of_trace(io.BytesIO(trace.data), series=False)


def row(a: float | None, b: float | None, digits: int = 1) -> str:
    def shown(x: float | None) -> str:
        return "-" if x is None else f"{x:.{digits}f}"
    delta = "-" if a is None or b is None else f"{b - a:+.{digits}f}"
    return f"{shown(a)} | {shown(b)} | {delta}"


def metric_rows(case: str, a: Stored, b: Stored) -> list[str]:
    ma, mb = metrics(a), metrics(b)
    out = []
    for label, va, vb, digits in (
            ("TTFT mean (steps)", ma.ttft.mean, mb.ttft.mean, 1),
            ("TTFT p99 (steps)", ma.ttft.p99, mb.ttft.p99, 1),
            ("preemptions", float(sum(ma.preemptions.values())),
             float(sum(mb.preemptions.values())), 0),
            ("recomputed tokens", float(ma.recomputed_tokens), float(mb.recomputed_tokens),
             0),
            ("steps to finish", float(ma.steps), float(mb.steps), 0),
            ("tokens generated per step", ma.generated_per_step, mb.generated_per_step, 2)):
        out.append(f"| {case} | {label} | {row(va, vb, digits)} |")
    return out


def render(store: Path = STORE) -> str:
    by_release: dict[str, dict[str, Stored]] = {}
    for trace in stored(store):
        by_release.setdefault(trace.release, {})[trace.case] = trace
    releases = [r for r in VLLM_V1_RELEASE_LIST if r in by_release]
    verdicts: dict[str, list[Verdict]] = {}
    for trace, verdict in checked(t for r in releases for t in by_release[r].values()):
        verdicts.setdefault(trace.release, []).append(verdict)
    lines = [
        "# vLLM's v1 scheduler, release by release",
        "",
        "What each vLLM release changed in its v1 scheduler's *decisions*, from traces of",
        "each release's own `Scheduler` driven by kvsched (`kvsched record vllm --release X`;",
        "every release recorded by `make vllm-releases` and kept in",
        "`tests/data/vllm-releases/store/`). Generated by `make vllm-changelog`",
        "(`tools/vllm_changelog.py`); `make test` regenerates it from the kept traces and",
        "compares. What the cases are: [conformance/vllm.md](conformance/vllm.md). Only",
        "what the suite exercises is covered: synchronous scheduling, one full-attention",
        "KV cache group, no speculative decoding, LoRA, KV connectors or async scheduling.",
        "",
        "## Releases",
        "",
        "| release | profile | traces | complete | MUST clean | exact under its profile |",
        "|---|---|---|---|---|---|",
    ]
    for r in releases:
        vs = verdicts[r]
        profile = "none (see 0.11.1)" if r in NO_EPOCH else vs[0].profile
        exact = "-" if r in NO_EPOCH else f"{sum(v.exact for v in vs)}"
        lines.append(f"| {r} | {profile} | {len(vs)} | {sum(v.complete for v in vs)} | "
                     f"{sum(not v.must for v in vs)} | {exact} |")
    lines += ["", "## Adjacent releases", "",
              "Each release against the one before it on every case both recorded: the",
              "cases whose decisions part, and the first step where each does (`kvsched",
              "diff`).", "",
              "| from | to | cases | decide identically | first divergent steps |",
              "|---|---|---|---|---|"]
    pairs: dict[str, list[Pair]] = {}
    for a, b in itertools.pairwise(releases):
        compared = compare(by_release[a], by_release[b])
        pairs[b] = compared
        parted = [p for p in compared if p.divergence is not None]
        steps = ", ".join(f"{p.case}@{p.divergence.step}" for p in parted[:8]
                          if p.divergence is not None)
        more = f" (+{len(parted) - 8})" if len(parted) > 8 else ""
        same = "all" if not parted else f"{len(compared) - len(parted)}"
        lines.append(f"| {a} | {b} | {len(compared)} | {same} | {steps or '-'}{more} |")
    lines += ["", "## The decision epochs", ""]
    for i, epoch in enumerate(VLLM_V1_EPOCHS):
        before = VLLM_V1_EPOCHS[i - 1] if i else None
        first = next((r for r in releases if vllm_v1_epoch(r) is epoch), None)
        lines += [f"### {epoch.first}: {epoch.change}", "",
                  f"- Profile: `vllm-v1@{epoch.first}`; vLLM's source: {epoch.source}."]
        if before is not None:
            changed = [f"`{n}` {old} -> {new}"
                       for n, (old, new) in changed_knobs(before, epoch).items()]
            lines.append(f"- Knobs changed from `vllm-v1@{before.first}`: "
                         f"{', '.join(changed)}.")
        if first is None:
            lines += ["- No release of this epoch is recorded.", ""]
            continue
        if first in pairs:
            prev = releases[releases.index(first) - 1]
            parted = [p for p in pairs[first] if p.divergence is not None]
            lines.append(f"- {prev} -> {first}: {len(parted)} of {len(pairs[first])} cases "
                         "decide differently.")
            if before is not None:
                agree = sum(profile_divergence(p.case, before, epoch) == p.divergence.step
                            for p in parted if p.divergence is not None)
                lines.append(f"- `kvsched diff vllm-v1@{before.first} vllm-v1@{epoch.first}` "
                             f"on the same cases finds {agree} of these {len(parted)} at the "
                             "same step.")
            lines.append("- First divergent step of each: " + ", ".join(
                f"`{p.case}` {p.divergence.step}" for p in parted
                if p.divergence is not None) + "; the first few, both versions:")
            for p in parted[:DETAILED]:
                assert p.divergence is not None
                lines.append(f"  - `{p.case}`, step {p.divergence.step} "
                             f"({p.divergence.what}): {prev} {clip(p.divergence.a)} | "
                             f"{first} {clip(p.divergence.b)}")
        flip = flipped_divergence(epoch, before, by_release[first].values())
        if before is not None:
            lines.append(
                "- The rule flipped back: " + (
                    "no recorded case of " + first + " diverges" if flip is None else
                    f"{flip[2]} of {len(by_release[first])} cases of {first} diverge from "
                    f"the profile, first `{flip[0]}` at step {flip[1]}") + ".")
        if first in pairs:
            prev = releases[releases.index(first) - 1]
            rows = [r for case in STANDARD
                    if case in by_release[prev] and case in by_release[first]
                    and any(p.case == case and p.divergence is not None
                            for p in pairs[first])
                    for r in metric_rows(case, by_release[prev][case],
                                         by_release[first][case])]
            if rows:
                lines += ["", f"| workload | metric | {prev} | {first} | delta |",
                          "|---|---|---|---|---|", *rows]
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def clip(text: str, most: int = 160) -> str:
    return text if len(text) <= most else text[:most - 3] + "..."


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.vllm_changelog")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--store", type=Path, default=STORE)
    args = parser.parse_args(argv)
    text = render(args.store)
    part = args.out.with_suffix(".part")
    part.write_text(text)
    part.replace(args.out)
    print(f"vllm_changelog: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
