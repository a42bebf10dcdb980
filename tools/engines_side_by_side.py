"""vLLM's, SGLang's and LMDeploy's scheduling side by side, as kvsched sees them: the
same workloads on the same cache, recorded from each engine's real scheduler (vLLM
0.32's v1 scheduler, SGLang 0.5.23's, LMDeploy 0.18.0's PyTorch engine), kept in
tests/data/side-by-side/, and compared by kvsched's metrics.

    python -m tools.engines_side_by_side record [ENGINE...]   # their environments needed
    python -m tools.engines_side_by_side                      # docs/conformance/side-by-side.md

`make test` checks every kept trace (MUST-clean and exact under its engine's profile)
and that the page is what this makes of them.

Steps are not units of equal cost between them (a vLLM step mixes prefill chunks with
decodes; an SGLang or LMDeploy step is a prefill or a decode), so the page says so and adds
measures in tokens computed (Work: per step, and TTFT on a clock of the tokens computed
meanwhile); and it says where each engine's prefix hits come from (Work: a hit on blocks
the request computed itself before it was preempted, or on another request's).
"""

from __future__ import annotations

import argparse
import gzip
import io
import itertools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kvsched.adapters.engines import engine_named
from kvsched.adapters.recording import AdapterError, Job
from kvsched.generators import generate
from kvsched.metrics import Metrics, metrics_of_trace
from kvsched.spec.model import Config
from kvsched.spec.profiles import get_profile
from kvsched.spec.step_kinds import STEP_KINDS
from kvsched.spec.trace import TraceReader
from kvsched.workload import WorkItem

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / "tests" / "data" / "side-by-side"
OUT = ROOT / "docs" / "conformance" / "side-by-side.md"
# One cache for all: pages (blocks) of 16 tokens, 264 of them, a token budget of 512 a
# step, 32 running requests, sequences of 2048 tokens; prefix caching on, each engine's
# default (vLLM's block hashes, SGLang's radix cache, LMDeploy's block trie).
CONFIG = Config(block_size=16, num_gpu_blocks=264, max_num_batched_tokens=512,
                max_num_seqs=32, max_model_len=2048, chunked_prefill=True,
                first_block_id=1, prefix_caching=True)
ENGINES = {"vllm": ("vLLM 0.32", "vllm-v1@0.32"), "sglang": ("SGLang 0.5.23", "sglang@0.5.23"),
           "lmdeploy": ("LMDeploy 0.18.0", "lmdeploy@0.18.0")}


@dataclass(frozen=True)
class Workload:
    name: str
    what: str
    kind: str
    n: int
    rate: float


# Requests shorter than SGLang's limits (kvsched.adapters.sglang.served_as_asked): the
# generators keep prompt + max_tokens within max_model_len - 8.
WORKLOADS = (
    Workload("chat", "60 ShareGPT-like requests, one every 4 steps", "sharegpt", 60, 0.25),
    Workload("burst", "120 ShareGPT-like requests, 8 a step: the cache runs short",
             "sharegpt", 120, 8.0),
    Workload("shared-prompts", "60 requests after shared system prompts, one every 2 "
             "steps", "shared-prompts", 60, 0.5),
    Workload("conversations", "40 turns of conversations, each turn's prompt the whole "
             "previous turn, one every 2 steps", "conversations", 40, 0.5),
)


def items(w: Workload) -> list[WorkItem]:
    return generate(w.kind, w.n, seed=7, rate=w.rate, max_model_len=CONFIG.max_model_len - 8)


def config_of(engine: str) -> Config:
    """CONFIG as `engine`'s profile runs it, with the engine's own first block id where
    its step takes only one (LMDeploy's ids start at 0; each engine's ids are its own)."""
    profile = get_profile(ENGINES[engine][1])
    config = profile.configure(CONFIG, frozenset({"prefix_caching"}))
    first = [v for v in STEP_KINDS[profile.scheduler].takes.get("first_block_id", ())
             if isinstance(v, int)]
    return replace(config, first_block_id=first[0]) if first else config


def path_of(workload: str, engine: str) -> Path:
    return STORE / f"{workload}-{engine}.jsonl.gz"


def record(engines: Sequence[str], out: Path) -> None:
    """Record every workload with each of `engines` (from its own environment) and keep
    the traces."""
    out.mkdir(parents=True, exist_ok=True)
    STORE.mkdir(parents=True, exist_ok=True)
    for engine in engines:
        jobs = [Job(w.name, config_of(engine), items(w), out / f"{w.name}-{engine}.jsonl")
                for w in WORKLOADS]
        for r in engine_named(engine).record_jobs(jobs):
            if not r.complete:
                raise SystemExit(f"{r.job.name}: {engine} stopped early: {r.stopped}")
            path_of(r.job.name, engine).write_bytes(
                gzip.compress(r.job.out.read_bytes(), compresslevel=9, mtime=0))


def kept(workload: str, engine: str) -> bytes:
    return gzip.decompress(path_of(workload, engine).read_bytes())


def metrics(workload: str, engine: str) -> Metrics:
    return metrics_of_trace(io.BytesIO(kept(workload, engine)), series=False)


@dataclass(frozen=True)
class Work:
    """What a trace's step counts leave out: the tokens its steps computed, and where its
    prefix-cache hits came from."""

    prefill_steps: int  # steps with an entry of more than one token: a prefill (chunk)
    computed_per_step: float  # prefill, recompute and decode tokens
    ttft_work: float | None  # mean tokens computed, by all requests, from arrival to 1st token
    own_hit_tokens: int  # hits on blocks the request itself computed before its preemption
    other_hit_tokens: int  # hits on blocks another request computed (shared prefixes)
    queried_tokens: int  # as the hit rate's denominator (kvsched.metrics.PrefixCache)
    void_entries: int = 0  # pipelined: slots of requests that had finished the step before
    lazy_resumed: int = 0  # lazy victims admitted again on their own blocks (no recompute)

    def rate(self, tokens: int) -> float:
        return tokens / self.queried_tokens if self.queried_tokens else 0.0


def work(workload: str, engine: str) -> Work:
    return work_of(kept(workload, engine))


def work_of(trace: bytes) -> Work:
    """A trace's Work. A block's content is the request's that was handed it in
    `new_blocks` (it computed it); a hit on it is that request's own when it hits it again,
    which only a preempted request coming back can."""
    m = metrics_of_trace(io.BytesIO(trace), series=True)
    assert m.series is not None
    clock = [0, *itertools.accumulate(m.series.computed)]  # tokens computed before step k
    waits = [clock[step + 1] - clock[step - int(ttft) + 1] for step, ttft in m.series.ttft_at]
    computed_by: dict[int, str] = {}
    own = other = prefills = voids = resumed = 0
    reader = TraceReader(io.BytesIO(trace))
    size = reader.header.config.block_size
    finished: set[str] = set()  # in the step before
    lazy: set[str] = set()  # lazy victims whose blocks no reclaim has taken
    for rec in reader:
        prefills += any(n > 1 for _, n in rec.scheduled)
        voids += sum(rid in finished for rid, _ in rec.scheduled)
        lazy.difference_update(rec.reclaimed)
        resumed += sum(rid in lazy for rid, _ in rec.scheduled)
        lazy.difference_update(rid for rid, _ in rec.scheduled)
        lazy.update(p.id for p in rec.preempted if p.mode == "lazy")
        finished = set(rec.finished)
        for rid, blocks in rec.prefix_hits.items():
            mine = sum(computed_by.get(b) == rid for b in blocks)
            own, other = own + mine * size, other + (len(blocks) - mine) * size
        for rid, blocks in (rec.new_blocks or {}).items():
            computed_by.update(dict.fromkeys(blocks, rid))
    return Work(
        prefill_steps=prefills,
        computed_per_step=m.computed_per_step,
        ttft_work=sum(waits) / len(waits) if waits else None,
        own_hit_tokens=own, other_hit_tokens=other,
        queried_tokens=m.prefix_cache.queried_tokens if m.prefix_cache is not None else 0,
        void_entries=voids, lazy_resumed=resumed)


def cell(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def render() -> str:
    lines = [
        "# vLLM, SGLang and LMDeploy side by side",
        "",
        "The same workloads on the same cache, recorded from each engine's real scheduler "
        "(`kvsched record vllm`: vLLM 0.32's v1 scheduler; `kvsched record sglang`: "
        "SGLang 0.5.23's; `kvsched record lmdeploy`: LMDeploy 0.18.0's PyTorch engine) "
        "and compared by `kvsched metrics`. The traces are kept in "
        "tests/data/side-by-side/; `make test` checks each one MUST-clean and exact under "
        "its engine's profile (" + ", ".join(p for _, p in ENGINES.values()) + "), and "
        "that this page is what `python -m tools.engines_side_by_side` makes of them.",
        "",
        f"The cache: blocks (SGLang's pages) of {CONFIG.block_size} tokens, "
        f"{CONFIG.num_gpu_blocks} of them ({CONFIG.num_gpu_blocks * CONFIG.block_size} "
        f"tokens), a token budget of {CONFIG.max_num_batched_tokens} a step, at most "
        f"{CONFIG.max_num_seqs} running requests, sequences of at most "
        f"{CONFIG.max_model_len} tokens, chunked prefill, prefix caching on (vLLM's block "
        "hashes, SGLang's radix cache, LMDeploy's block trie). LMDeploy's budget is its "
        "max_prefill_token_num: it bounds prefill steps, and its decode steps run every "
        "running request; it preallocates 16 tokens of blocks beyond what a request "
        "computes.",
        "",
        "Steps are not units of equal cost here. A vLLM step mixes prefill chunks with "
        "decodes; an SGLang or LMDeploy step (LMDeploy's forward) is a prefill or a "
        "decode, never both, so while they prefill, none of their running requests "
        "decodes. LMDeploy also decides each forward before it applies the last one's "
        "output (pipelined): a request that finished is decoded once more (a void slot, "
        "counted below), and its blocks come back only when its session ends. "
        "Counted in steps, an engine "
        "that does more in each step looks faster than it is: where the tables say "
        "\"steps\", read \"batches\", not time. Two measures in tokens computed "
        "(prefill, recompute and decode tokens) are beside them: tokens computed per step, "
        "and TTFT on a clock of tokens computed, the tokens the engine computed for all "
        "its requests from a request's arrival to its first token. Neither is time: on "
        "a GPU a step of decodes costs about as much as a prefill of many tokens, so time "
        "lies between the two clocks.",
        "",
        "How they decide differently (docs/spec.md, section 8; docs/conformance/sglang.md): "
        "vLLM admits what this step's blocks allow, running requests first, and preempts "
        "the latest when a running request's next block is not free; SGLang admits a "
        "request only when its whole future output fits beside what the running ones are "
        "expected to need (the new-token ratio), runs a step of prefills alone, and "
        "retracts the request with the fewest outputs when a decode does not fit; "
        "LMDeploy admits in arrival order until one request does not fit (head-of-line "
        "blocking), and a running request that cannot grow gives itself up lazily: it keeps "
        "its blocks while it waits and resumes on them, unless an admission reclaims them, "
        "when it recomputes (docs/conformance/lmdeploy.md).",
        "",
    ]
    names = [name for name, _ in ENGINES.values()]
    every = {(w.name, e): metrics(w.name, e) for w in WORKLOADS for e in ENGINES}
    done = {(w.name, e): work(w.name, e) for w in WORKLOADS for e in ENGINES}
    lines += ["Where the prefix-cache hits come from: a hit is on blocks the request "
              "itself computed before it was preempted (it comes back and finds them still "
              "cached: only an engine that preempts by recompute has these), or on blocks "
              "another request computed (a shared system prompt, an earlier turn). The "
              "tables split the hit rate so. (A lazy victim of LMDeploy's that resumes on "
              "the blocks it kept takes no hit: it never gave them up.)", ""]
    lines += ["What the numbers show, on these workloads:", ""]
    lines += [f"- {claim}" for claim in claims(every, done)]
    lines.append("")
    for w in WORKLOADS:
        m = {engine: metrics(w.name, engine) for engine in ENGINES}
        d = [done[(w.name, engine)] for engine in ENGINES]
        lines += [f"## {w.name}", "", f"{w.what} (generator `{w.kind}`, seed 7).", "",
                  f"| | {' | '.join(names)} |", "|---|" + "---:|" * len(names)]
        rows: list[tuple[str, list[float | None], int]] = [
            ("requests finished", [float(x.finished) for x in m.values()], 0),
            ("steps to finish", [float(x.steps) for x in m.values()], 0),
            ("steps that computed a prefill (SGLang, LMDeploy: prefill steps)",
             [float(x.prefill_steps) for x in d], 0),
            ("TTFT mean (steps)", [x.ttft.mean for x in m.values()], 1),
            ("TTFT p99 (steps)", [x.ttft.p99 for x in m.values()], 1),
            ("TTFT mean (tokens computed meanwhile)", [x.ttft_work for x in d], 0),
            ("latency mean (steps)", [x.latency.mean for x in m.values()], 1),
            ("tokens generated per step", [x.generated_per_step for x in m.values()], 2),
            ("tokens computed per step", [x.computed_per_step for x in d], 2),
            ("tokens computed in all", [float(x.computed_tokens) for x in m.values()], 0),
            ("preemptions (SGLang: retractions and priority preemptions; LMDeploy: lazy)",
             [float(sum(x.preemptions.values())) for x in m.values()], 0),
            ("... resumed on their own blocks, without recompute",
             [float(x.lazy_resumed) for x in d], 0),
            ("recomputed tokens", [float(x.recomputed_tokens) for x in m.values()], 0),
            ("KV use mean", [x.kv_use_mean for x in m.values()], 2),
            ("void slots (pipelined: finished the step before)",
             [float(x.void_entries) for x in d], 0),
            ("prefix-cache hit rate",
             [x.prefix_cache.hit_rate if x.prefix_cache is not None else None
              for x in m.values()], 2),
            ("... of it on its own blocks, back after preemption",
             [x.rate(x.own_hit_tokens) for x in d], 2),
            ("... of it on other requests' blocks", [x.rate(x.other_hit_tokens) for x in d],
             2),
        ]
        for label, values, digits in rows:
            lines.append(f"| {label} | " + " | ".join(cell(v, digits) for v in values) + " |")
        lines.append("")
    lines += ["Made again from the kept traces by `python -m tools.engines_side_by_side`; "
              "recorded again, with the engines' environments, by "
              "`python -m tools.engines_side_by_side record`.", ""]
    return "\n".join(lines)


def claims(every: dict[tuple[str, str], Metrics], done: dict[tuple[str, str], Work]
           ) -> list[str]:
    """Sentences the metrics bear out on every workload (each one computed, so that a
    change in either engine's kept traces changes or drops it)."""
    out = []
    names = [w.name for w in WORKLOADS]

    def each(f: Callable[[Metrics], float | None]) -> list[tuple[float, float]]:
        values = [(f(every[(w, "vllm")]), f(every[(w, "sglang")])) for w in names]
        return [(float(v or 0), float(s or 0)) for v, s in values]

    def against(pairs: Sequence[tuple[float, float]], digits: int = 0) -> str:
        return ", ".join(f"{v:.{digits}f} against {s:.{digits}f}" for v, s in pairs)

    ttft = each(lambda m: m.ttft.mean)
    if all(v < s for v, s in ttft):
        sentence = ("Counted in steps, vLLM's first tokens come sooner: its TTFT mean is "
                    + against(ttft) + " steps (workload by workload), since SGLang admits "
                    "a request only with room for its whole future output.")
        waits = [(done[(w, "vllm")].ttft_work, done[(w, "sglang")].ttft_work) for w in names]
        if all(v is not None and s is not None for v, s in waits):
            clock = [(float(v or 0), float(s or 0)) for v, s in waits]
            sooner = [w for w, (v, s) in zip(names, clock, strict=True) if v < s]
            later = [w for w in names if w not in sooner]
            sentence += (" On the clock of tokens computed it is " + against(clock)
                         + " tokens: sooner on " + (", ".join(sooner) or "none")
                         + (f", later on {', '.join(later)}" if later else "") + ".")
        out.append(sentence)
    pre = each(lambda m: sum(m.preemptions.values()))
    rec = each(lambda m: m.recomputed_tokens)
    if all(s < v for v, s in pre):
        out.append("SGLang preempts far less: "
                   + ", ".join(f"{s:.0f} against {v:.0f}" for v, s in pre)
                   + " preemptions, and it recomputes "
                   + ", ".join(f"{s:.0f}" for _, s in rec) + " tokens where vLLM "
                   "recomputes " + ", ".join(f"{v:.0f}" for v, _ in rec) + ".")
    use = each(lambda m: m.kv_use_mean)
    steps = each(lambda m: m.steps)
    per_step = [(done[(w, "vllm")].computed_per_step, done[(w, "sglang")].computed_per_step)
                for w in names]
    if all(s < v for v, s in use) and all(v < s for v, s in steps):
        out.append("vLLM keeps its cache fuller (KV use mean "
                   + ", ".join(f"{v:.2f}" for v, _ in use) + " against "
                   + ", ".join(f"{s:.2f}" for _, s in use)
                   + ") and finishes the workloads in fewer steps (" + against(steps)
                   + "), but its steps do more: " + against(per_step, 1)
                   + " tokens computed per step, and "
                   + against(each(lambda m: m.computed_tokens)) + " tokens computed in all.")
        prefills = [done[(w, "sglang")].prefill_steps for w in names]
        if all(s - v > p for (v, s), p in zip(steps, prefills, strict=True)):
            out.append("SGLang's prefill steps alone do not make its extra steps: they are "
                       + ", ".join(f"{p} of {s:.0f}" for p, (_, s) in
                                   zip(prefills, steps, strict=True))
                       + "; the rest are decode steps with fewer requests in them "
                       "(tokens generated per step, vLLM's against SGLang's: "
                       + against(each(lambda m: m.generated_per_step), 2) + ").")
    hits = [(w, done[(w, "vllm")], done[(w, "sglang")]) for w in names]
    alone = [(w, v, s) for w, v, s in hits if not v.other_hit_tokens and not s.other_hit_tokens]
    if alone and all(v.own_hit_tokens for _, v, _ in alone):
        out.append("On " + ", ".join(w for w, _, _ in alone) + ", whose requests share no "
                   "prefix, vLLM's hit rate ("
                   + ", ".join(f"{v.rate(v.own_hit_tokens):.2f}" for _, v, _ in alone)
                   + ") is all its own preempted requests finding their blocks still cached "
                   "when they come back (prefix caching saving part of a recompute, not a "
                   "prefix shared between requests); SGLang's is "
                   + ", ".join(f"{s.rate(s.own_hit_tokens):.2f}" for _, _, s in alone) + ".")
    shared = [(w, v, s) for w, v, s in hits if (w, v, s) not in alone]
    if shared:
        out.append("On " + ", ".join(w for w, _, _ in shared) + ", hits on other requests' "
                   "blocks (the shared prefixes) are "
                   + against([(v.rate(v.other_hit_tokens), s.rate(s.other_hit_tokens))
                              for _, v, s in shared], 2)
                   + " of the tokens queried, and vLLM's own blocks back after preemption "
                   "add " + ", ".join(f"{v.rate(v.own_hit_tokens):.2f}" for _, v, _ in shared)
                   + " (SGLang's: " + ", ".join(f"{s.rate(s.own_hit_tokens):.2f}"
                                               for _, _, s in shared) + ").")
    lm = [(every[(w, "lmdeploy")], done[(w, "lmdeploy")]) for w in names]
    preempted = [sum(m.preemptions.values()) for m, _ in lm]
    if any(preempted):
        out.append("LMDeploy's preemptions are lazy: of its "
                   + ", ".join(f"{p}" for p in preempted) + " victims, "
                   + ", ".join(f"{d.lazy_resumed}" for _, d in lm) + " resumed on the "
                   "blocks they had kept, with nothing to recompute; it recomputed "
                   + ", ".join(f"{m.recomputed_tokens}" for m, _ in lm) + " tokens, for "
                   "the victims whose blocks an admission reclaimed.")
    out.append("LMDeploy's pipeline decodes each finished request once more: "
               + ", ".join(f"{d.void_entries} void slots in {m.steps} steps" for m, d in lm)
               + "; its steps that computed a prefill are "
               + ", ".join(f"{d.prefill_steps}" for _, d in lm) + ", and its TTFT mean is "
               + ", ".join(f"{m.ttft.mean:.1f}" for m, _ in lm) + " steps ("
               + ", ".join(f"{d.ttft_work:.0f}" if d.ttft_work is not None else "-"
                           for _, d in lm) + " tokens computed meanwhile).")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.engines_side_by_side",
                                     description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("what", nargs="?", choices=("render", "record"), default="render")
    parser.add_argument("engines", nargs="*", choices=(*ENGINES, []), metavar="ENGINE",
                        help=f"what record records: any of {', '.join(ENGINES)} (default: all)")
    parser.add_argument("--out", type=Path, default=Path("build/side-by-side"))
    args = parser.parse_args(argv)
    if args.what == "record":
        try:
            record(args.engines or list(ENGINES), args.out)
        except AdapterError as e:
            print(f"engines_side_by_side: error: {e}", file=sys.stderr)
            return 2
    OUT.write_text(render())
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

