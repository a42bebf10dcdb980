"""What the engines' conformance suites share (conformance.vllm, conformance.vllm_v0,
conformance.sglang, conformance.vllm_releases): a case, a trace's verdict against a
profile, the sensitivity check (each rule of the profile flipped must make some trace
diverge), the lines a suite prints, and the arguments every suite takes. No suite
imports another's.
"""

from __future__ import annotations

import argparse
import gzip
import io
import random
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar

import orjson

from kvsched.adapters.recording import Engine, Job
from kvsched.implementations import check_trace, chosen_checker
from kvsched.reference import scheduler_for
from kvsched.spec.knobs import Knobs
from kvsched.spec.model import Config
from kvsched.spec.profiles import SchedulerKind, get_profile
from kvsched.spec.replay import ProfileReplay
from kvsched.spec.should import DEFAULT_MAX_PREEMPTIONS, DEFAULT_STALL_STEPS
from kvsched.spec.step_kinds import refusal
from kvsched.spec.trace import Header, TraceReader
from kvsched.spec.violation import INVARIANTS, MUST, SHOULD, Violation
from kvsched.workload import WorkItem, validate

# Case name -> why its engine decides otherwise than its profile, explained in the
# engine's page under docs/conformance/ with the engine's source line behind it (none
# today).
KNOWN_DIVERGENCES: dict[str, str] = {}


@dataclass(frozen=True)
class Case:
    """One workload of the suite: what it exercises, its config, its requests."""

    name: str
    what: str
    config: Config
    workload: Callable[[], list[WorkItem]]


def with_aborts(items: list[WorkItem], seed: int, fraction: float,
                latest: int) -> list[WorkItem]:
    """Cancel a seeded `fraction` of the requests 0..latest steps after they arrive."""
    rng = random.Random(f"kvsched/vllm-aborts/{seed}")
    return [replace(w, abort=w.arrival + rng.randint(0, latest)) if rng.random() < fraction
            else w for w in items]


def never_fitting(items: list[WorkItem], max_model_len: int, seed: int,
                  count: int) -> list[WorkItem]:
    """Add `count` requests whose prompts leave no room for an output token."""
    rng = random.Random(f"kvsched/vllm-too-long/{seed}")
    last = max(w.arrival for w in items)
    extra = [WorkItem(f"long{i}", rng.randint(0, last), max_model_len + rng.randint(0, 40),
                      1, rng.randint(1, 16)) for i in range(count)]
    return validate(items + extra)


def over_max_model_len(items: list[WorkItem], max_model_len: int, seed: int) -> list[WorkItem]:
    """Ask some requests for more tokens than max_model_len leaves them (they finish at
    max_model_len, as a client that set max_tokens too high)."""
    rng = random.Random(f"kvsched/vllm-over-len/{seed}")
    out = []
    for w in items:
        if rng.random() < 0.4:
            room = max_model_len - w.prompt_len
            w = replace(w, max_tokens=room + rng.randint(1, 50), output_len=room + 50)
        out.append(w)
    return out


def random_workload(rng: random.Random, max_model_len: int) -> list[WorkItem]:
    """A random case's requests: up to 60, in bursts, at the edges of max_model_len
    (one over it too), some aborted, priorities from -1 to 2."""
    items = []
    step = 0
    for k in range(rng.randint(1, 60)):
        step += rng.choice([0, 0, 0, 1, 2, 5])
        prompt = max(1, rng.choice([1, 2, rng.randint(1, max_model_len), rng.randint(1, 16),
                                    max_model_len - 1, max_model_len - 1, max_model_len,
                                    max_model_len + 3, *[rng.randint(1, max_model_len)] * 4]))
        max_tokens = rng.choice([1, 2, rng.randint(1, max_model_len), max_model_len])
        abort = step + rng.choice([0, 0, 1, 3, 10]) if rng.random() < 0.15 else None
        items.append(WorkItem(f"q{k}", step, prompt, rng.randint(1, max_tokens), max_tokens,
                              rng.choice([-1, 0, 0, 1, 2]), abort))
    return validate(items)


@dataclass
class Verdict:
    """One case's checks: MUST and SHOULD counts and the first profile divergence."""

    case: str
    steps: int
    requests: int
    preemptions: int
    rejected: int
    complete: bool
    must: Counter[str]
    should: Counter[str]
    divergence: Violation | None
    prefix_caching: bool = False
    hits: int = 0  # requests admitted with a prefix hit
    hit_blocks: int = 0
    profile: str = ""

    @property
    def exact(self) -> bool:
        """Equal to the profile step for step, or diverging only as KNOWN_DIVERGENCES
        explains."""
        return self.divergence is None or self.case in KNOWN_DIVERGENCES

    @property
    def ok(self) -> bool:
        return not self.must and self.complete and self.exact


def check_case(case: str, path: Path, profile: str) -> Verdict:
    """One trace's checks against `profile`."""
    with path.open("rb") as stream:
        return check_stream(case, stream, profile)


def check_stream(case: str, stream: BinaryIO, profile: str | None) -> Verdict:
    """check_case on a trace read from `stream`, by the checker `kvsched check` takes:
    the vectorized one (the spec's report, kvsched.optimized.checker) where the compiled
    scheduler replays the profile, else the spec's; the counts of preemptions, rejections
    and hits from its step lines. With `profile` None, the MUST and SHOULD levels only (a
    trace no profile models: vLLM's async scheduling)."""
    data = stream.read()
    headers: list[Header] = []
    # the checker `kvsched check --checker auto` takes (kvsched.implementations)
    report = check_trace(io.BytesIO(data), chosen_checker("auto"), profile=profile,
                         strict=False, max_preemptions=DEFAULT_MAX_PREEMPTIONS,
                         required=frozenset(), stall_steps=DEFAULT_STALL_STEPS,
                         on_header=headers.append)
    header = headers[0]
    preemptions = rejected = hits = hit_blocks = 0
    for line in data.splitlines()[1:]:
        rec = orjson.loads(line)
        preemptions += len(rec.get("preempted", ()))
        rejected += len(rec.get("rejected", ()))
        found = rec.get("prefix_hits", {})
        hits += len(found)
        hit_blocks += sum(len(ids) for ids in found.values())
    divergence = next((v for v in report.violations if v.invariant == "profile"), None)
    must = Counter({k: n for k, n in report.counts.items() if INVARIANTS[k] == MUST})
    should = Counter({k: n for k, n in report.counts.items() if INVARIANTS[k] == SHOULD})
    return Verdict(case, report.steps, report.requests, preemptions, rejected,
                   report.complete, must, should, divergence, header.config.prefix_caching,
                   hits, hit_blocks, profile or "")


def first_divergence(path: Path, knobs: Knobs, profile: str,
                     config_changes: Mapping[str, object] | None = None,
                     scheduler: SchedulerKind | None = None) -> int | None:
    """The first step where the reference with `knobs` (on the trace's config with
    `config_changes`; the step of `scheduler`, by default the profile's) decides
    otherwise than the trace; None also where the engine would refuse the trace's config
    under the flipped rules at start-up (SGLang's retraction by priority without
    priority scheduling): that trace cannot tell the rule."""
    with path.open("rb") as stream:
        return stream_divergence(stream, knobs, profile, config_changes, scheduler)


def stream_divergence(stream: BinaryIO, knobs: Knobs, profile: str,
                      config_changes: Mapping[str, object] | None = None,
                      scheduler: SchedulerKind | None = None) -> int | None:
    """first_divergence of the trace `stream` holds. A step of vLLM v1's on the trace's
    own config replays beside the vectorized checker where it is built (kvsched check
    --checker auto's choice, the same divergence: in the compiled scheduler where it
    implements the rules, else in the reference), others in the reference."""
    data = stream.read()
    reader = TraceReader(io.BytesIO(data))
    config = replace(reader.header.config, **(config_changes or {}))  # type: ignore[arg-type]
    kind = scheduler if scheduler is not None else get_profile(profile).scheduler
    # the engine settings the header declares, then the flipped rules over them
    named = get_profile(profile)
    knobs = overlay(named.for_trace(reader.header.settings).knobs, named.knobs, knobs)
    if refusal(kind, config, knobs=knobs) is not None:
        return None

    def reference(header: Header) -> ProfileReplay:
        return ProfileReplay(profile, scheduler_for(config, knobs, kind))

    if kind == "v1" and not config_changes and chosen_checker("auto") == "vectorized":
        from kvsched.optimized.checker import check_trace_vectorized

        report = check_trace_vectorized(io.BytesIO(data), profile=profile, knobs=knobs,
                                        spec_replay=reference)
        return next((v.step for v in report.violations if v.invariant == "profile"), None)
    replay = reference(reader.header)
    for rec in reader:
        if replay.step(rec) is not None:
            return rec.step
    return None


K = TypeVar("K")


def overlay(onto: K, base: K, changed: K) -> K:
    """`onto` with every knob (nested ones too: Knobs.sglang's) where `changed` differs
    from `base`: a flipped rule over the settings a trace's header declares."""
    out: dict[str, object] = {}
    for f in fields(changed):  # type: ignore[arg-type]
        new, old = getattr(changed, f.name), getattr(base, f.name)
        if new != old:
            out[f.name] = overlay(getattr(onto, f.name), old, new) \
                if is_dataclass(new) else new
    return replace(onto, **out) if out else onto  # type: ignore[type-var]


# A flipped rule: other knobs, changes to the trace's config (a rule an engine declares
# in its header, as V0's allocation), and the scheduler whose step runs them
# (Profile.scheduler).
Variant = tuple[Knobs, Mapping[str, object], SchedulerKind]


def print_sensitivity(paths: Sequence[Path], profile: str, engine: str,
                      variants: Mapping[str, Variant]) -> list[str]:
    """Print where the traces tell each flipped rule (sensitivity) from `engine`; the
    rules no trace tells, which make a suite's run fail."""
    blind = []
    for name, where in sensitivity(paths, profile, variants).items():
        print(f"{'OK  ' if where else 'FAIL'} {profile} with {name} diverges from {engine}: "
              f"{where or 'on no trace: the suite cannot tell this rule'}")
        if where is None:
            blind.append(name)
    return blind


def sensitivity(paths: Sequence[Path], profile: str,
                variants: Mapping[str, Variant]) -> dict[str, str | None]:
    """For each flipped rule of `variants`, the first trace (and step) that tells it
    from the engine."""
    found: dict[str, str | None] = {}
    for name, (knobs, changes, scheduler) in variants.items():
        found[name] = None
        for path in paths:
            step = first_divergence(path, knobs, profile, changes, scheduler)
            if step is not None:
                found[name] = f"{path.stem} step {step}"
                break
    return found


def counts(c: Counter[str]) -> str:
    return ", ".join(f"{k} x{n}" for k, n in sorted(c.items())) or "0"


def line(v: Verdict) -> str:
    """One case's verdict in a line."""
    mark = "OK  " if v.ok else "FAIL"
    if v.divergence is None:
        divergence = "none"
    elif v.case in KNOWN_DIVERGENCES:
        divergence = "known: " + KNOWN_DIVERGENCES[v.case]
    else:
        divergence = f"step {v.divergence.step}"
    caching = (f"caching on, {v.hits} hits of {v.hit_blocks} blocks" if v.prefix_caching
               else "caching off")
    return (f"{mark} {v.case}: {caching}; {v.steps} steps, {v.requests} requests, "
            f"{v.preemptions} preemptions, {v.rejected} rejected; MUST {counts(v.must)}; "
            f"SHOULD {counts(v.should)}; {v.profile} divergence {divergence}"
            + ("" if v.complete else "; INCOMPLETE"))


def summary(what: str, verdicts: Sequence[Verdict]) -> str:
    """The random cases of one kind in a line."""
    exact = (f", {sum(v.exact for v in verdicts)} exact under {verdicts[0].profile}, "
             f"{sum(v.hits for v in verdicts)} hits" if verdicts and verdicts[0].prefix_caching
             else "")
    return (f"{what}: {sum(v.ok for v in verdicts)} of {len(verdicts)} conform{exact}, "
            f"{sum(v.steps for v in verdicts)} steps, "
            f"{sum(v.preemptions for v in verdicts)} preemptions, "
            f"{sum(v.rejected for v in verdicts)} rejected; SHOULD "
            f"{counts(sum((v.should for v in verdicts), Counter()))}")


def seats_and_budget(rng: random.Random, chunked: bool, max_model_len: int
                     ) -> tuple[int, int]:
    """A random case's max_num_seqs and token budget, as vLLM takes them: a budget of
    at least the seats, and without chunked prefill of at least max_model_len."""
    seqs = rng.choice([1, 2, 3, 4, 8, 16])
    budget = max(seqs, rng.choice([seqs, seqs + 1, 8, 16, 32, 64, 256]))
    if not chunked:
        budget = max(budget, max_model_len)
    return seqs, budget


def suite_parser(prog: str, doc: str | None, python_flag: str, default_python: Path,
                 default_out: Path, default_random: int, random_help: str,
                 flags: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The arguments every suite takes: case names, --out, its engine's Python,
    --random N, --seed, --list, and the suite's own switches (`flags`: flag -> help)."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}",
                                     description=doc.splitlines()[0] if doc else "")
    parser.add_argument("names", nargs="*", help="run only these cases")
    parser.add_argument("--out", type=Path, default=default_out, help="folder for the traces")
    parser.add_argument(python_flag, type=Path, default=default_python)
    parser.add_argument("--random", type=int, default=default_random, metavar="N",
                        help=f"also N small random cases{random_help} (default "
                             f"{default_random})")
    parser.add_argument("--seed", type=int, default=0, help="first random case's seed")
    parser.add_argument("--list", action="store_true", help="list the cases and stop")
    for flag, text in (flags or {}).items():
        parser.add_argument(flag, action="store_true", help=text)
    return parser


def parsed(parser: argparse.ArgumentParser, argv: Sequence[str] | None
           ) -> argparse.Namespace | None:
    """A suite's arguments, or None when a count of random cases (--random, --random-*)
    is negative, said in one line."""
    args = parser.parse_args(argv)
    prog = parser.prog.removeprefix("python -m ")
    for name, n in vars(args).items():
        if name.startswith("random") and n < 0:
            flag = "--" + name.replace("_", "-")
            print(f"{prog}: error: {flag} must not be negative, got {n}", file=sys.stderr)
            return None
    return args


class Named(Protocol):
    """A suite's case, as --list shows it."""

    @property
    def name(self) -> str: ...
    @property
    def what(self) -> str: ...


def list_cases(cases: Iterable[Named]) -> int:
    """--list: each case's name and what it exercises."""
    for c in cases:
        print(f"{c.name}: {c.what}")
    return 0


@dataclass(frozen=True)
class EngineCase:
    """One workload of an engine's kept suite (SGLang's, LMDeploy's): what it exercises,
    its config, its requests (given the config), and the engine's options that are
    profile knobs (StepKind.settings), as the trace's header declares them."""

    name: str
    what: str
    config: Config
    workload: Callable[[Config], list[WorkItem]]
    settings: Mapping[str, object] = field(default_factory=dict)


def record_cases(engine: Engine[Any], cases: Sequence[EngineCase], out: Path, python: Path,
                 max_steps: int) -> dict[str, bytes]:
    """Record every case with `engine` in one driver process: each case's trace bytes.
    A job the engine stopped early (something trace v1 cannot say) is told, and its
    trace, without an end line, is checked as incomplete."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = [Job(c.name, c.config, c.workload(c.config), out / f"{c.name}.jsonl", max_steps,
                settings=c.settings) for c in cases]
    for r in engine.record_jobs(jobs, python):
        if r.stopped is not None:
            print(f"STOP {r.job.name}: {engine.label} did something in step {r.steps} that "
                  f"trace v1 cannot say: {r.stopped}")
    return {c.name: (out / f"{c.name}.jsonl").read_bytes() for c in cases}


def steps_of(data: bytes) -> bytes:
    """A trace's step lines and end line (its header names the recording's settings)."""
    return data.split(b"\n", 1)[1]


@dataclass(frozen=True)
class Store:
    """An engine's kept traces (tests/data/NAME/): one gzip file a case, what the engine
    really did, and did the same on every run; `make test` checks them without the
    engine."""

    path: Path

    def trace(self, case: str) -> Path:
        return self.path / f"{case}.jsonl.gz"

    def traces(self) -> Iterator[tuple[str, bytes]]:
        """The kept traces: (case, trace bytes), by case name."""
        for path in sorted(self.path.glob("*.jsonl.gz")):
            yield path.name.removesuffix(".jsonl.gz"), gzip.decompress(path.read_bytes())

    def keep_or_compare(self, traces: Mapping[str, bytes], keep: bool) -> list[str]:
        """With `keep`, write `traces` into the store; else compare each with its kept
        trace, step line for step line, telling each that differs. The cases that
        differ."""
        if keep:
            self.path.mkdir(parents=True, exist_ok=True)
            for name, data in traces.items():
                self.trace(name).write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
            print(f"kept {len(traces)} traces in {self.path}")
            return []
        changed = []
        for name, data in traces.items():
            kept = self.trace(name)
            if kept.exists() and steps_of(gzip.decompress(kept.read_bytes())) != steps_of(data):
                changed.append(name)
                print(f"FAIL {name}: its step lines differ from the kept trace {kept}")
        compared = sum(self.trace(n).exists() for n in traces)
        print(f"{compared - len(changed)} of {compared} traces with a kept one equal it, "
              "step line for step line")
        return changed
