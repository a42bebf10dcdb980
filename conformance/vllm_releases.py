"""Every vLLM v1 release kvsched drives, recorded on the conformance suite and kept:
`make vllm-releases` (all of them) or `python -m conformance.vllm_releases record X...`.

Each release's own scheduler (its environment: `make vllm-release V=X`) runs the named
cases of conformance.vllm and its first random cases (prefix caching off and on); every
trace is checked at the MUST level and against the profile of the release's decision
epoch (kvsched.spec.profiles.VLLM_V1_EPOCHS), and kept in the store
(tests/data/vllm-releases/store/), where `make test` checks them again without vLLM and
the changelog (tools.vllm_changelog, docs/vllm-changelog.md) reads them.

The store keeps each distinct trace once: releases of one epoch decide alike, so their
traces differ only in the header line (the release, what the driver bridged). A trace
is its header line, kept in its release's manifest (`<release>.json`), and its body (the
step lines and the end line), kept compressed under the digest of its bytes
(`bodies/<digest>.jsonl.gz`).

    python -m conformance.vllm_releases record [--random N] [--random-prefix M] X [X...]
    python -m conformance.vllm_releases check [X...]
    python -m conformance.vllm_releases sample [X...]

`sample` (`make vllm-releases-sample`, in .ci/run) records the first release of each
decision epoch live again (building its environment where missing) on the cases that
tell the epochs apart (SAMPLE_CASES), into build/vllm-releases-sample/, and checks that
each trace is exact under its profile and that its step lines are the kept ones, byte
for byte: the store is what the releases really do.

A case whose config a release cannot express is left out and said so in its manifest
(a watermark, before 0.24: vLLM's v1 scheduler has none there).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from conformance.common import Case, Verdict
from conformance.vllm import (
    CASES,
    MAX_STEPS,
    NoProfile,
    check_stream,
    random_case,
    random_prefix_case,
)
from kvsched.adapters.recording import AdapterError, Job
from kvsched.adapters.vllm import ENGINE as VLLM
from kvsched.adapters.vllm_releases import ReleaseError, build, release_env, site_packages
from kvsched.spec.profiles import (
    VLLM_V1_EPOCHS,
    VLLM_V1_RELEASE_LIST,
    pinned_profile,
    vllm_v1_epoch,
)

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / "tests" / "data" / "vllm-releases" / "store"
# The random cases kept for every release (seeds 0..N-1 of each kind): at least 50 a
# release, also before 0.24, where the third of them with a watermark cannot run.
RANDOM = 64
RANDOM_PREFIX = 16
# The release that broke MUST rules: its traces are kept and checked at the MUST level,
# under no profile (docs/vllm-changelog.md says what it does). It admits prompts that
# never finish: its runs stop at NO_EPOCH_STEPS (twice the longest case of the others),
# where the liveness checks name them.
NO_EPOCH = ("0.11.0",)
NO_EPOCH_STEPS = 10_000


# The cases that tell the epochs apart (each one's first divergence in
# docs/vllm-changelog.md): a priority victim preempting itself, the threshold of a lone
# request, a prompt above the budget left, admission by the whole prompt, and the free
# list's order under prefix caching.
SAMPLE_CASES = ("priority-tight", "threshold", "no-chunked-prefill", "fcfs-tight",
                "prefix-no-chunked-priority")
SAMPLE_OUT = ROOT / "build" / "vllm-releases-sample"


def epoch_firsts() -> list[str]:
    """The first release of each decision epoch (0.11.1, 0.12.0, ...)."""
    return [next(r for r in VLLM_V1_RELEASE_LIST if vllm_v1_epoch(r) is epoch)
            for epoch in VLLM_V1_EPOCHS]


@dataclass(frozen=True)
class Stored:
    """One kept trace: its release, its case and its bytes."""

    release: str
    case: str
    data: bytes


def cases(random: int = RANDOM, random_prefix: int = RANDOM_PREFIX) -> list[Case]:
    """The named cases, then the first random ones of each kind."""
    return ([*CASES] + [random_case(i) for i in range(random)]
            + [random_prefix_case(i) for i in range(random_prefix)])


def has_v1_watermark(site: Path) -> bool:
    """Whether a release's v1 KV cache manager has a watermark (vLLM 0.24 on): read from
    its source, since the driver cannot pass one to a release that has none."""
    return "watermark" in (site / "vllm" / "v1" / "core" / "kv_cache_manager.py").read_text()


def split(trace: bytes) -> tuple[bytes, bytes]:
    """A trace's header line and its body."""
    end = trace.index(b"\n") + 1
    return trace[:end], trace[end:]


def keep(store: Path, release: str, recorded: dict[str, bytes],
         skipped: dict[str, str]) -> Path:
    """Write `release`'s traces into `store`: each body once under its digest, and the
    manifest of the release last (a half-written store has no manifest naming it)."""
    bodies = store / "bodies"
    bodies.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, object] = {"release": release, "skipped": skipped, "cases": {}}
    entries: dict[str, object] = {}
    for name, trace in recorded.items():
        header, body = split(trace)
        digest = hashlib.sha256(body).hexdigest()[:24]
        path = bodies / f"{digest}.jsonl.gz"
        if not path.exists():
            part = path.with_suffix(".part")
            part.write_bytes(gzip.compress(body, compresslevel=9, mtime=0))
            part.replace(path)
        entries[name] = {"header": header.decode().rstrip("\n"), "body": digest}
    manifest["cases"] = entries
    out = store / f"{release}.json"
    part = out.with_suffix(".part")
    part.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    part.replace(out)
    return out


def unnamed(store: Path) -> list[Path]:
    """The bodies no manifest names (left by a release recorded again)."""
    named = {entry["body"] for path in store.glob("*.json")
             for entry in json.loads(path.read_text())["cases"].values()}
    return sorted(path for path in (store / "bodies").glob("*.jsonl.gz")
                  if path.name.removesuffix(".jsonl.gz") not in named)


def prune(store: Path) -> int:
    """Delete the bodies no manifest names; how many."""
    gone = unnamed(store)
    for path in gone:
        path.unlink()
    return len(gone)


def stored(store: Path = STORE, releases: Sequence[str] | None = None) -> Iterator[Stored]:
    """The kept traces, release by release in release order, each case's bytes whole."""
    for release in VLLM_V1_RELEASE_LIST:
        path = store / f"{release}.json"
        if (releases is not None and release not in releases) or not path.exists():
            continue
        manifest = json.loads(path.read_text())
        for name, entry in manifest["cases"].items():
            body = gzip.decompress((store / "bodies" / f"{entry['body']}.jsonl.gz")
                                   .read_bytes())
            yield Stored(release, name, entry["header"].encode() + b"\n" + body)


def check(trace: Stored) -> Verdict:
    """A kept trace's checks, under its release's epoch profile (none for 0.11.0: MUST
    and SHOULD only, with the profile check of the epoch after it for comparison)."""
    profile = "vllm-v1@0.11.1" if trace.release in NO_EPOCH else None
    return check_stream(trace.case, io.BytesIO(trace.data), profile)


def checked(traces: Iterable[Stored]) -> Iterator[tuple[Stored, Verdict]]:
    """Each trace with check(trace), checked once per profile, header config and body:
    the releases of an epoch keep the same bodies, and a header's engine field names
    only the release (its config is the job's, the profile the epoch's)."""
    seen: dict[tuple[str, bytes], Verdict] = {}
    for trace in traces:
        header, _, body = trace.data.partition(b"\n")
        fields = json.loads(header)
        fields.pop("engine", None)
        profile = (trace.release if trace.release in NO_EPOCH
                   else pinned_profile("vllm-v1", "vllm", trace.release) or "")
        key = (json.dumps(fields, sort_keys=True) + profile, body)
        if key not in seen:
            seen[key] = check(trace)
        yield trace, seen[key]


def record(release: str, chosen: Sequence[Case], store: Path = STORE) -> list[Verdict]:
    """Record `chosen` with `release`'s scheduler, keep the traces, and check them."""
    env = release_env(release)
    if not env.ready:
        raise ReleaseError(f"{env.root}: vLLM {release}'s environment is missing; create "
                           f"it with `{env.make_hint}`")
    watermark = has_v1_watermark(site_packages(env.python))
    skipped = {c.name: "no watermark in this release's v1 scheduler"
               for c in chosen if c.config.watermark_blocks and not watermark}
    runnable = [c for c in chosen if c.name not in skipped]
    with tempfile.TemporaryDirectory(prefix="kvsched-release-") as tmp:
        steps = NO_EPOCH_STEPS if release in NO_EPOCH else MAX_STEPS
        jobs = [Job(c.name, c.config, c.workload(), Path(tmp) / f"{c.name}.jsonl", steps)
                for c in runnable]
        VLLM.record_jobs(jobs, env.python)
        traces = {job.name: job.out.read_bytes() for job in jobs}
    keep(store, release, traces, skipped)
    return [check(s) for s in stored(store, [release])]


def sample(releases: Sequence[str], store: Path = STORE, out: Path = SAMPLE_OUT) -> int:
    """Record SAMPLE_CASES with each of `releases` again (building its environment where
    it is missing) into `out`, and compare with the kept traces; the failures, told."""
    chosen = [c for c in CASES if c.name in SAMPLE_CASES]
    kept = {(t.release, t.case): t.data for t in stored(store, releases)}
    failed = 0
    for release in releases:
        started = time.monotonic()
        env = release_env(release)
        if not env.ready:
            def say(line: str, release: str = release) -> None:
                print(f"vllm-release {release}: {line}", file=sys.stderr)
            build(release, log=say)
        built = time.monotonic() - started
        verdicts = {v.case: v for v in record(release, chosen, out)}
        bad = 0
        for trace in stored(out, [release]):
            v = verdicts[trace.case]
            mine = kept.get((release, trace.case))
            same = mine is not None and split(mine)[1] == split(trace.data)[1]
            if not v.ok or not same:
                bad += 1
                print(f"  FAIL {release} {trace.case}: MUST {dict(v.must)}, complete "
                      f"{v.complete}, divergence "
                      f"{'none' if v.divergence is None else v.divergence.step}, "
                      + ("steps as kept" if same else "steps NOT as kept"))
        profile = next(iter(verdicts.values())).profile if verdicts else "-"
        print(f"vLLM {release}: {len(verdicts) - bad} of {len(verdicts)} cases recorded live "
              f"exact under {profile} and as kept; environment {built:.0f} s, recording "
              f"{time.monotonic() - started - built:.0f} s", flush=True)
        failed += bad
    return failed


def report(release: str, verdicts: Sequence[Verdict]) -> str:
    exact = sum(v.exact for v in verdicts)
    clean = sum(not v.must for v in verdicts)
    complete = sum(v.complete for v in verdicts)
    profile = verdicts[0].profile if verdicts else "-"
    return (f"vLLM {release}: {len(verdicts)} traces, {complete} complete, {clean} MUST "
            f"clean, {exact} exact under {profile}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.vllm_releases")
    parser.add_argument("mode", choices=["record", "check", "sample"])
    parser.add_argument("releases", nargs="*", metavar="X",
                        help="releases (default: every release with a kept manifest, for "
                             "check; every release, for record)")
    parser.add_argument("--random", type=int, default=RANDOM)
    parser.add_argument("--random-prefix", type=int, default=RANDOM_PREFIX)
    parser.add_argument("--store", type=Path, default=STORE)
    args = parser.parse_intermixed_args(argv)
    unknown = [r for r in args.releases if r not in VLLM_V1_RELEASE_LIST]
    if unknown:
        print(f"conformance.vllm_releases: error: unknown release {unknown[0]!r} (known: "
              f"{VLLM_V1_RELEASE_LIST[0]} ... {VLLM_V1_RELEASE_LIST[-1]})", file=sys.stderr)
        return 2
    failed = 0
    if args.mode == "sample":
        try:
            failed = sample(args.releases or epoch_firsts(), args.store)
        except (AdapterError, ReleaseError, NoProfile) as e:
            print(f"conformance.vllm_releases: error: {e}", file=sys.stderr)
            return 2
        return 1 if failed else 0
    if args.mode == "record":
        chosen = cases(args.random, args.random_prefix)
        for release in args.releases or VLLM_V1_RELEASE_LIST:
            try:
                verdicts = record(release, chosen, args.store)
            except (AdapterError, ReleaseError, NoProfile) as e:
                print(f"conformance.vllm_releases: error: vLLM {release}: {e}",
                      file=sys.stderr)
                return 2
            print(report(release, verdicts), flush=True)
            failed += sum(not v.ok for v in verdicts) if release not in NO_EPOCH else 0
        prune(args.store)
        return 1 if failed else 0
    by_release: dict[str, list[Verdict]] = {}
    for trace, verdict in checked(stored(args.store, args.releases or None)):
        by_release.setdefault(trace.release, []).append(verdict)
    for release, verdicts in by_release.items():
        print(report(release, verdicts))
        for v in verdicts:
            if not v.ok and release not in NO_EPOCH:
                failed += 1
                print(f"  {v.case}: MUST {dict(v.must)}, divergence "
                      f"{'none' if v.divergence is None else v.divergence.step}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
