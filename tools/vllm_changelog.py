"""docs/vllm-changelog.md: what each vLLM release changed in its v1 scheduler's
decisions, generated from the traces of every release that kvsched's driver recorded
(conformance.vllm_releases's store, tests/data/vllm-releases/store/).

    .venv/bin/python -m tools.vllm_changelog [--out docs/vllm-changelog.md]
    (make vllm-changelog)

For each pair of adjacent releases the page says whether they decide identically on
every case both recorded (the same trace bodies, or `kvsched diff` finding no
divergence), and where they do not, the first divergent step of each case (the
divergence `kvsched diff A B` reports). For each decision epoch
(kvsched.spec.profiles.VLLM_V1_EPOCHS): one plain sentence of who the change affects and
when to care (AFFECTS, by the knob it changed), the rule, vLLM's source lines, the knob,
the first case that diverges from the epoch's profile with that rule flipped back, and
metric deltas on a few standard workloads, between runs that both ran to their end line
only (a run the driver cut short is counted and named, never measured). The random
cases' ids are folded in a <details> block. tests/test_vllm_release_store.py regenerates
it from the store and compares.
"""

from __future__ import annotations

import argparse
import io
import itertools
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from conformance.common import Verdict, stream_divergence
from conformance.vllm import CASES, FLIPPABLE, case_named
from conformance.vllm_releases import NO_EPOCH, STORE, Stored, checked, stored
from kvsched.diff import Divergence, Stream, diff_streams, simulated, trace_stream
from kvsched.implementations import build_scheduler
from kvsched.metrics import Metrics, metrics_of_trace
from kvsched.spec.profiles import (
    VLLM_V1_EPOCHS,
    VLLM_V1_RELEASE_LIST,
    Epoch,
    vllm_v1_epoch,
)
from kvsched.spec.trace import TraceReader

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "vllm-changelog.md"
DETAILED = 4  # divergences shown with both versions, per epoch
# The standard workloads whose metrics each epoch's change is shown on.
STANDARD = ("fcfs-tight", "priority-tight", "no-chunked-priority-tight", "threshold",
            "prefix-conversations", "prefix-tight-readmit")
NAMED = frozenset(c.name for c in CASES)  # the others are random-N and random-prefix-N
SHOWN = 8  # named cases shown in a cell of the adjacent releases' table

# Who an epoch's change affects and when to care: one plain sentence for each knob and
# the value an epoch sets it to, so that every epoch's section opens with one (a new
# epoch's knob without one is an error, not a page without it).
AFFECTS: dict[tuple[str, object], str] = {
    ("over_budget_prompt", "stop"):
        "Affects you if you serve without chunked prefill and mix long and short prompts: "
        "a waiting prompt larger than the token budget left in a step now holds back the "
        "requests queued behind it until a later step, so short requests behind a long "
        "one wait longer for their first token.",
    ("over_budget_prompt", "skip"):
        "Affects you if you serve without chunked prefill and mix long and short prompts: "
        "a waiting prompt larger than the token budget left in a step no longer holds "
        "back the requests queued behind it, so shorter ones are admitted past it.",
    ("reserve_full_sequence", True):
        "Affects you if your KV cache runs full: a waiting request is admitted only when "
        "blocks for its whole prompt are free, not just for its first chunk, so running "
        "requests are preempted and recomputed far less often, and first tokens may come "
        "a little later.",
    ("reserve_full_sequence", False):
        "Affects you if your KV cache runs full: a waiting request is admitted as soon as "
        "blocks for its first chunk are free, so first tokens may come a little sooner "
        "and running requests are preempted and recomputed more often.",
    ("free_order", "uncached_first"):
        "Affects you if you serve with prefix caching on (vLLM's default) and the cache "
        "runs full: freed blocks that hold cached content are reused last, so shared "
        "prefixes (system prompts, earlier turns of a conversation) stay cached longer.",
    ("free_order", "as_freed"):
        "Affects you if you serve with prefix caching on (vLLM's default) and the cache "
        "runs full: freed blocks are reused in the order they were freed, cached content "
        "or not, so shared prefixes may be evicted sooner.",
    ("lift_threshold_when_alone", True):
        "Affects you if you set a long-prefill token threshold "
        "(long_prefill_token_threshold): a request alone in the scheduler is no longer "
        "cut into chunks of the threshold, so a long prompt on an idle server gets its "
        "first token in fewer steps.",
    ("lift_threshold_when_alone", False):
        "Affects you if you set a long-prefill token threshold "
        "(long_prefill_token_threshold): even a request alone in the scheduler is cut "
        "into chunks of the threshold, so a long prompt on an idle server takes more "
        "steps to its first token.",
    ("continue_after_self_preemption", True):
        "Affects you if you serve with priority scheduling and the cache runs full: when "
        "a running request has to preempt itself, the requests after it in the batch "
        "still run in that step, where before the step stopped there (and could schedule "
        "nothing at all).",
    ("continue_after_self_preemption", False):
        "Affects you if you serve with priority scheduling and the cache runs full: when "
        "a running request has to preempt itself, the step stops there, and the requests "
        "after it in the batch wait for the next step.",
    ("admit_after_preempt", True):
        "Affects you if the cache runs full: a waiting request may be admitted in a step "
        "that preempted a running one, so newcomers start sooner and the victims wait "
        "longer.",
    ("admit_after_preempt", False):
        "Affects you if the cache runs full: no waiting request is admitted in a step that "
        "preempted a running one, so the victims come back before newcomers start.",
}
# The first epoch changed what 0.11.0 did, a release in no epoch (it breaks MUST rules).
FROM_NO_EPOCH = (
    "Affects you if you run vLLM 0.11.0 with priority scheduling, or with prompts as long "
    "as max_model_len: 0.11.0 may leave a preempted request in the step's batch and "
    "admits prompts of max_model_len tokens that never finish, so leave it for 0.11.1 or "
    "later.")


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


def who_is_affected(epoch: Epoch, before: Epoch | None) -> str:
    """The plain words an epoch's section opens with: who its change affects and when to
    care, by the knobs it changed from `before` (FROM_NO_EPOCH for the first epoch)."""
    if before is None:
        return FROM_NO_EPOCH
    changed = [(name, new) for name, (_, new) in changed_knobs(before, epoch).items()]
    missing = [f"{name}={new!r}" for name, new in changed if (name, new) not in AFFECTS]
    if missing or not changed:
        raise KeyError(f"epoch {epoch.first}: no sentence in tools.vllm_changelog.AFFECTS "
                       f"for {', '.join(missing) or 'an epoch that changes no knob'}")
    return " ".join(AFFECTS[key] for key in changed)


def is_random(case: str) -> bool:
    return case not in NAMED


def folded(parted: Sequence[Pair], recorded: Iterable[str], what: str) -> list[str]:
    """The random cases among `parted` as `id` step, folded in a <details> block (none
    when no random case parted)."""
    shown = [p for p in parted if is_random(p.case) and p.divergence is not None]
    if not shown:
        return []
    of = sum(is_random(c) for c in recorded)
    return ["", f"<details><summary>{what} of the {len(shown)} random cases (of {of}) "
                "that decide differently</summary>", "",
            ", ".join(f"`{p.case}` {p.divergence.step}" for p in shown
                      if p.divergence is not None),
            "", "</details>"]


def cut_in(cases: Iterable[str], releases: Sequence[str],
           complete: set[tuple[str, str]]) -> str:
    """Which of `releases` cut some of `cases` short: "0.11.0", or "0.11.0 and 0.11.1"."""
    cases = list(cases)
    return " and ".join(r for r in releases if any((r, c) not in complete for c in cases))


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
        step = stream_divergence(io.BytesIO(trace.data), knobs, profile)
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
    complete: set[tuple[str, str]] = set()  # (release, case) of the runs with an end line
    for trace, verdict in checked(t for r in releases for t in by_release[r].values()):
        verdicts.setdefault(trace.release, []).append(verdict)
        if verdict.complete:
            complete.add((trace.release, trace.case))
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
    for r in releases:
        short = sum(not v.complete for v in verdicts[r])
        if short:
            lines += ["", f"{short} of {r}'s {len(verdicts[r])} runs were cut short: the "
                      "driver stopped them before every request had ended, so their traces "
                      "have no end line ([conformance/vllm-releases.md]"
                      "(conformance/vllm-releases.md) says why). Where they part from the "
                      "next release, their first divergent step stands; their metrics are "
                      "never compared with a complete run's."]
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
        named = [p for p in parted if not is_random(p.case)]
        steps = ", ".join(f"{p.case}@{p.divergence.step}" for p in named[:SHOWN]
                          if p.divergence is not None)
        more = [f"{len(named) - SHOWN} more named"] if len(named) > SHOWN else []
        randoms = len(parted) - len(named)
        more += [f"{randoms} random"] if randoms else []
        cell = "; ".join(([steps] if steps else []) + more)
        same = "all" if not parted else f"{len(compared) - len(parted)}"
        lines.append(f"| {a} | {b} | {len(compared)} | {same} | {cell or '-'} |")
    lines += ["", "## The decision epochs", ""]
    for i, epoch in enumerate(VLLM_V1_EPOCHS):
        before = VLLM_V1_EPOCHS[i - 1] if i else None
        first = next((r for r in releases if vllm_v1_epoch(r) is epoch), None)
        lines += [f"### {epoch.first}: {epoch.change}", "", who_is_affected(epoch, before),
                  "", f"- Profile: `vllm-v1@{epoch.first}`; vLLM's source: {epoch.source}."]
        if before is not None:
            changed = [f"`{n}` {old} -> {new}"
                       for n, (old, new) in changed_knobs(before, epoch).items()]
            lines.append(f"- Knobs changed from `vllm-v1@{before.first}`: "
                         f"{', '.join(changed)}.")
        if first is None:
            lines += ["- No release of this epoch is recorded.", ""]
            continue
        fold: list[str] = []
        if first in pairs:
            prev = releases[releases.index(first) - 1]
            parted = [p for p in pairs[first] if p.divergence is not None]
            cut = [p.case for p in parted if (prev, p.case) not in complete
                   or (first, p.case) not in complete]
            lines.append(f"- {prev} -> {first}: {len(parted)} of {len(pairs[first])} cases "
                         "decide differently" + (
                             "." if not cut else
                             f"; {len(cut)} of them were cut short in "
                             f"{cut_in(cut, (prev, first), complete)}, so only their "
                             "first divergent step is compared."))
            if before is not None:
                agree = sum(profile_divergence(p.case, before, epoch) == p.divergence.step
                            for p in parted if p.divergence is not None)
                lines.append(f"- `kvsched diff vllm-v1@{before.first} vllm-v1@{epoch.first}` "
                             f"on the same cases finds {agree} of these {len(parted)} at the "
                             "same step.")
            named = [p for p in parted if not is_random(p.case)]
            randoms = len(parted) - len(named)
            lines.append("- First divergent step of each named case: " + (", ".join(
                f"`{p.case}` {p.divergence.step}" for p in named
                if p.divergence is not None) or "none") + (
                    f"; and of {randoms} random cases (below)" if randoms else "")
                + "; the first few, both versions:")
            fold = folded(parted, by_release[first], "First divergent step")
            for p in (named + [p for p in parted if is_random(p.case)])[:DETAILED]:
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
        lines += fold
        if first in pairs:
            prev = releases[releases.index(first) - 1]
            parting = [case for case in STANDARD
                       if case in by_release[prev] and case in by_release[first]
                       and any(p.case == case and p.divergence is not None
                               for p in pairs[first])]
            measured = [c for c in parting
                        if (prev, c) in complete and (first, c) in complete]
            unmeasured = [c for c in parting if c not in measured]
            if unmeasured:
                lines += ["", "No metrics for " + ", ".join(f"`{c}`" for c in unmeasured)
                          + (": its run was" if len(unmeasured) == 1 else ": their runs were")
                          + f" cut short in {cut_in(unmeasured, (prev, first), complete)}, "
                          "and a cut-short run's numbers stop where the driver did."]
            rows = [r for case in measured
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
