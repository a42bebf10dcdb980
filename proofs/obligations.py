"""Every CrossHair obligation and diffbehavior pair, with the status it must reach.

Status, strongest first:
- proven: CrossHair confirms every postcondition over all paths, for all integers the
  preconditions allow (loop-free arithmetic);
- exhaustive: confirmed over all paths, for inputs within the stated bounds (the code
  formats its numbers into a sentence, which makes CrossHair realize them, or loops);
- searched: no counterexample within the bounds at the fixed effort below; CrossHair
  cannot exhaust the paths (loops over requests and blocks), so this is a bounded search.
The runner fails an obligation that does not reach its status, so a proof that stops
going through is a failure, not a silent downgrade.
"""

from __future__ import annotations

from dataclasses import dataclass

PROVEN = "proven"
EXHAUSTIVE = "exhaustive"
SEARCHED = "searched"


@dataclass(frozen=True)
class Effort:
    """CrossHair's fixed effort: iterations without progress, and CPU seconds per condition."""

    iterations: int
    seconds: int

    def args(self) -> list[str]:
        return [f"--max_uninteresting_iterations={self.iterations}",
                f"--per_condition_timeout={self.seconds}"]


# Enough to exhaust the bounded inputs (they finish well before the cap).
TO_EXHAUSTION = Effort(100_000, 120)
SEARCH = Effort(300, 25)
DIFF = Effort(200, 30)


@dataclass(frozen=True)
class Obligation:
    name: str
    kind: str  # "check" (postconditions) or "diff" (a diffbehavior pair)
    targets: tuple[str, ...]  # check: one function; diff: (spec side, reference side)
    status: str
    bound: str
    statement: str
    quick: bool = False  # in the `make test` subset
    given_effort: Effort | None = None  # instead of the default for its kind and status

    @property
    def effort(self) -> Effort:
        if self.given_effort is not None:
            return self.given_effort
        if self.kind == "diff":
            return DIFF
        return SEARCH if self.status == SEARCHED else TO_EXHAUSTION


ALL_INTEGERS = "all integers the preconditions allow"
STATES = ("3 requests of fixed statuses, prompts 1-4, max_tokens 1-3, 1-4 blocks of 1-2 "
          "tokens, token budget 1-4, 1-3 sequences, every policy, preemption mode and knob")


def check(name: str, target: str, status: str, bound: str, statement: str,
          quick: bool = False) -> Obligation:
    return Obligation(name, "check", (target,), status, bound, statement, quick)


def pair(name: str, stem: str, status: str, bound: str, statement: str,
         quick: bool = False) -> Obligation:
    return Obligation(name, "diff", (f"proofs.pairs.{stem}_spec",
                                     f"proofs.pairs.{stem}_reference"),
                      status, bound, statement, quick)


A = "proofs.arithmetic."
D = "proofs.decisions."
P = "proofs.preemption."
C = "proofs.prefix_caching."

OBLIGATIONS: tuple[Obligation, ...] = (
    check("cdiv-ceiling", A + "cdiv_is_ceiling", PROVEN, ALL_INTEGERS,
          "cdiv(a, b) is the least q with q * b >= a", quick=True),
    check("blocks-for-least", A + "blocks_for_is_least", PROVEN, ALL_INTEGERS,
          "blocks_for(tokens) is the fewest blocks that hold the tokens", quick=True),
    check("blocks-needed-least", A + "blocks_needed_is_least", PROVEN, ALL_INTEGERS,
          "Db is the least number of new blocks with which G covers C + Dn and the R "
          "tokens an admission reserves", quick=True),
    check("chunks-add-up", A + "chunks_need_what_the_whole_needs", PROVEN, ALL_INTEGERS,
          "Db for Dn1 then Dn2 adds up to Db for Dn1 + Dn2", quick=True),
    check("spec-block-contracts", "kvsched.spec.blocks", SEARCHED,
          "cdiv, blocks_for, blocks_needed, longest_sequence, allocation_reserve, "
          "admission_watermark: all integers (confirmed); never_completes, rejectable: "
          "searched (their reason strings realize the numbers)",
          "the contracts in spec/blocks.py's own docstrings hold", quick=True),
    check("reject-exact", A + "rejects_exactly_the_hopeless", EXHAUSTIVE,
          "block_size 1-4, 1-8 blocks, max_model_len 1-16, prompt and max_tokens 1-16",
          "never_completes refuses exactly P > max_model_len or "
          "ceil(min(P + O, max_model_len) / block_size) > num_gpu_blocks; rejectable "
          "also P == max_model_len", quick=True),
    check("reject-watermark", A + "rejects_beside_an_always_watermark", EXHAUSTIVE,
          "block_size 1-2, 1-6 blocks, max_model_len 1-8, prompt and max_tokens 1-8, "
          "watermark 1-2",
          "under watermark_scope always, never_completes refuses exactly P > "
          "max_model_len or ceil(min(P + O, max_model_len) / block_size) + watermark > "
          "num_gpu_blocks"),
    check("finish-due", A + "finish_is_due_exactly_at_the_limits", EXHAUSTIVE,
          "prompt, max_tokens and outputs 1-8, max_model_len 2-16",
          "finish is due exactly when outputs reach max_tokens or tokens max_model_len"),
    check("token-range-exact", A + "token_range_allows_exactly", EXHAUSTIVE,
          "Dn -1-5, C 0-5, N 1-5, max_model_len 1-5, chunked or not",
          "token-range allows exactly Dn >= 1, C + Dn <= N, <= max_model_len, whole "
          "without chunking"),
    check("kv-budget-exact", A + "kv_budget_is_the_step_invariant", EXHAUSTIVE,
          "demand, free and reclaim 0-6",
          "kv-budget holds exactly when sum Db <= B_free + B_reclaim"),
    check("step-safe-rrw", D + "step_is_safe_running_running_waiting", SEARCHED, STATES,
          "from two running and one waiting request, the reference's step keeps the step "
          "invariant, token budget, sequence limit and every MUST invariant"),
    check("step-safe-rsw", D + "step_is_safe_running_swapped_waiting", SEARCHED, STATES,
          "from running, swapped and waiting requests, likewise (swap-in before admission)"),
    check("step-safe-rrr", D + "step_is_safe_three_running", SEARCHED, STATES,
          "from three running requests, likewise (chains of preemption)"),
    check("step-safe-www", D + "step_is_safe_three_waiting", SEARCHED, STATES,
          "from three waiting requests, likewise (admission)"),
    check("admission-cut-running", D + "admission_cut_behind_a_running_request", SEARCHED,
          STATES, "behind a running request, the waiting pass admits the longest prefix of "
          "the waiting order that fits the token, block and sequence budgets"),
    check("admission-cut-idle", D + "admission_cut_from_an_idle_engine", SEARCHED, STATES,
          "from an idle engine, likewise"),
    check("recompute-victim", P + "recompute_victim_restarts", SEARCHED, STATES,
          "a recompute victim ends waiting with C = 0 and no blocks, N kept, G freed"),
    check("swap-victim", P + "swap_victim_moves_its_blocks", SEARCHED, STATES,
          "a swap victim moves exactly its G blocks to the host and keeps C"),
    check("swap-round-trip", P + "swap_out_then_in_restores", SEARCHED, STATES,
          "swap out then swap in restores N, C, G, H and the free pools exactly"),
    check("hit-bound", C + "hit_bound_is_the_token_bound", PROVEN, ALL_INTEGERS,
          "the reference's hit bound h <= floor((N - 1) / block_size) is the spec's "
          "h * block_size <= N - 1", quick=True),
    check("hit-admission-cost", C + "admission_with_a_hit", PROVEN, ALL_INTEGERS,
          "after a hit of h blocks, Db + E = ceil((h * block_size + Dn) / block_size) - h "
          "+ E = ceil(Dn / block_size) + E, never negative", quick=True),
    check("hit-admission-reference", C + "reference_admission_with_a_hit", EXHAUSTIVE,
          "h 0-8, Dn 1-16, E 0-h, block_size 1-4, watermark 0-2",
          "the reference's admission_blocks(h * block_size + Dn, h) + E is the spec's "
          "Db + E, plus the watermark when a request runs"),
    check("hit-whole-sequence", C + "reference_whole_sequence_with_a_hit", EXHAUSTIVE,
          "h 0-8, N 1-32 with h * block_size <= N - 1, E 0-h, block_size 1-4",
          "with the whole-sequence knob, admission after a hit needs ceil(N / block_size) "
          "- h + E blocks, at least E + 1"),
    check("hit-longest-run", C + "reference_hit_is_the_cached_run", EXHAUSTIVE,
          "N 1-12, block_size 1-4, 0-6 cached blocks",
          "the reference's hit is the cached run cut to floor((N - 1) / block_size) "
          "blocks, so h * block_size <= N - 1"),
    check("prefix-contracts", "kvsched.spec.prefix", SEARCHED,
          "block_key: index 0 and up; nested: lengths 0 and up (strings and tuples drawn "
          "by CrossHair)",
          "the contracts in spec/prefix.py's own docstrings: a key ends with /index; "
          "nested keeps lengths sorted, each cut to the given length, the content in"),
    check("sharers-same-key", C + "sharers_name_a_block_alike", EXHAUSTIVE,
          "index 0-6, block_size 1-4, shared lengths 0-32",
          "two requests give block i the same key exactly when both hold a content at "
          "least (i + 1) * block_size long"),
    check("next-turn-keys", C + "next_turn_hits_the_whole_turn", EXHAUSTIVE,
          "shared 1-8, cut 1-12, block_size 1-4, every block within the cut",
          "a next turn nesting the first `cut` tokens of turn r0 keys each block within "
          "them as r0 keys its own"),
    pair("admission-blocks", "admission_blocks", EXHAUSTIVE,
         "block_size 1-4, watermark 0-4, C 0-32, Dn 1-32, G 0-16, scope running or always",
         "the reference's admission blocks are the spec's Db plus the watermark when a "
         "request runs, or always under scope always", quick=True),
    pair("finish-rule", "finish_rule", EXHAUSTIVE,
         "prompt and max_tokens 1-8, max_model_len 2-16",
         "the reference's update finishes exactly the requests the spec's finish rule "
         "says must finish"),
    pair("reject-rule", "reject_rule", SEARCHED,
         "block_size 1-4, 1-8 blocks, max_model_len 2-16, prompt and max_tokens 1-16, "
         "watermark 0-2 below the blocks, scope running or always",
         "the reference rejects exactly the arrivals rejectable refuses"),
    pair("first-chunk-blocks", "first_chunk_blocks", SEARCHED,
         "block_size 1-4, prompt 1-16, max_tokens 1-16, token budget 1-16, each allocation",
         "the reference hands a first chunk exactly Db new block ids, covering what its "
         "allocation reserves"),
)


def by_name(names: list[str]) -> list[Obligation]:
    known = {o.name: o for o in OBLIGATIONS}
    missing = [n for n in names if n not in known]
    if missing:
        raise SystemExit(f"unknown obligation {', '.join(missing)}; known: {', '.join(known)}")
    return [known[n] for n in names]
