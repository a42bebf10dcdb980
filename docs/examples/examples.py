"""The example traces of docs/spec.md, checked for real when the page is rendered.

Each example is a few step lines under the base config (section 5 of the page),
with the config fields it changes. Render the page with

    .venv/bin/python -m tools.docs_render docs/examples/spec.template.md > docs/spec.md
"""

from __future__ import annotations

from kvsched.spec import Config
from tools.docs_render import DocExamples, Example, Line, Rejection

BASE = Config(block_size=4, num_gpu_blocks=8, num_cpu_blocks=0, max_num_batched_tokens=16,
              max_num_seqs=2, max_model_len=32)


def arrival(rid: str, prompt_len: int, max_tokens: int = 8) -> Line:
    return {"id": rid, "prompt_len": prompt_len, "max_tokens": max_tokens}


def recompute(rid: str) -> Line:
    return {"id": rid, "mode": "recompute"}


def swap(rid: str) -> Line:
    return {"id": rid, "mode": "swap"}


# Two 8-token prompts, prefilled together (2 blocks each), then r1 preempted for r0's decode.
PREFILL_TWO: Line = {"step": 0, "arrivals": [arrival("r0", 8), arrival("r1", 8)],
                     "scheduled": [["r0", 8], ["r1", 8]]}
PREEMPT_R1: Line = {"step": 1, "preempted": [recompute("r1")], "scheduled": [["r0", 1]]}
SWAP_OUT_R1: Line = {"step": 1, "preempted": [swap("r1")], "scheduled": [["r0", 1]]}

# A 12-token prompt that finishes at step 1 (ids 0-3 then free) and a 4-token one swapped out.
SWAP_WITH_IDS: tuple[Line, Line] = (
    {"step": 0, "arrivals": [arrival("r0", 12, 2), arrival("r1", 4)],
     "scheduled": [["r0", 12], ["r1", 4]], "new_blocks": {"r0": [0, 1, 2], "r1": [3]}},
    {"step": 1, "preempted": [swap("r1")], "scheduled": [["r0", 1]], "finished": ["r0"],
     "new_blocks": {"r0": [3]}},
)

SWAP = {"num_gpu_blocks": 4, "num_cpu_blocks": 4, "preemption": "swap"}

# LMDeploy's rules on a 4-block cache: r0 (7 tokens, finishing after 2 outputs) and r1
# (8 tokens) fill it at step 0.
LMDEPLOY = {"num_gpu_blocks": 4, "preemption": "lazy", "pipelined": True}
LAZY_START: tuple[Line] = (
    {"step": 0, "arrivals": [arrival("r0", 7, 2), arrival("r1", 8)],
     "scheduled": [["r0", 7], ["r1", 8]], "new_blocks": {"r0": [0, 1], "r1": [2, 3]},
     "free_blocks": 0},
)


def lazy(rid: str) -> Line:
    return {"id": rid, "mode": "lazy"}

# Prefix caching: r0 computes a 9-token prompt (blocks 0 and 1 full and cached, block 2
# partly), decodes one token and finishes, leaving 0 and 1 cached and free (evictable).
CACHING = {"prefix_caching": True}
R0_CACHES: tuple[Line, Line] = (
    {"step": 0, "arrivals": [arrival("r0", 9, 2)], "scheduled": [["r0", 9]],
     "new_blocks": {"r0": [0, 1, 2]}, "free_blocks": 5},
    {"step": 1, "scheduled": [["r0", 1]], "finished": ["r0"], "new_blocks": {},
     "free_blocks": 8},
)

# A 16-token prompt admitted in two chunks of 8 by an engine that allocates for the whole
# prompt at admission (vLLM V0): 4 blocks at once, none for its second chunk.
PROMPT_ALLOCATED: tuple[Line, ...] = (
    {"step": 0, "arrivals": [arrival("r0", 16, 2)], "scheduled": [["r0", 8]],
     "new_blocks": {"r0": [0, 1, 2, 3]}, "free_blocks": 4},
    {"step": 1, "scheduled": [["r0", 8]], "new_blocks": {}, "free_blocks": 4},
    {"step": 2, "scheduled": [["r0", 1]], "finished": ["r0"], "new_blocks": {"r0": [4]},
     "free_blocks": 8},
)

EXAMPLES: dict[str, Example] = {
    # -- section 4: bad input --
    "unknown-id": Example([
        {"step": 0, "arrivals": [arrival("r0", 4)], "scheduled": [["r0", 4], ["r7", 1]]},
    ]),
    "duplicate-arrival": Example([
        {"step": 0, "arrivals": [arrival("r0", 4)], "scheduled": [["r0", 4]]},
        {"step": 1, "arrivals": [arrival("r0", 4)], "scheduled": [["r0", 1]]},
    ]),
    "bad-gap": Example([
        {"step": 0, "arrivals": [arrival("r0", 4)], "scheduled": [["r0", 4]]},
        {"step": 2, "scheduled": [["r0", 1]]},
    ]),
    # -- section 6: MUST --
    "kv-budget": Example([
        {"step": 0, "arrivals": [arrival("r0", 16)], "scheduled": [["r0", 16]]},
        {"step": 1, "arrivals": [arrival("r1", 15)], "scheduled": [["r0", 1], ["r1", 15]]},
    ]),
    "kv-budget-swap-in": Example([
        PREFILL_TWO, SWAP_OUT_R1,
        {"step": 2, "swapped_in": ["r1"], "scheduled": [["r0", 1], ["r1", 1]]},
    ], config=SWAP),
    "cpu-budget": Example([
        PREFILL_TWO, SWAP_OUT_R1,
    ], config={"num_gpu_blocks": 4, "num_cpu_blocks": 1, "preemption": "swap"}),
    "token-budget": Example([
        {"step": 0, "arrivals": [arrival("r0", 10), arrival("r1", 8)],
         "scheduled": [["r0", 10], ["r1", 8]]},
    ]),
    "seq-limit": Example([
        {"step": 0, "arrivals": [arrival("r0", 4), arrival("r1", 4), arrival("r2", 4)],
         "scheduled": [["r0", 4], ["r1", 4], ["r2", 4]]},
    ]),
    "token-range": Example([
        {"step": 0, "arrivals": [arrival("r0", 8)], "scheduled": [["r0", 8]]},
        {"step": 1, "scheduled": [["r0", 2]]},
    ]),
    "token-range-zero": Example([
        {"step": 0, "arrivals": [arrival("r0", 8)], "scheduled": [["r0", 0]]},
    ]),
    "token-range-whole": Example([
        {"step": 0, "arrivals": [arrival("r0", 20)], "scheduled": [["r0", 12]]},
    ], config={"chunked_prefill": False, "max_num_batched_tokens": 32}),
    "one-state": Example([
        {"step": 0, "arrivals": [arrival("r0", 4, 1)], "scheduled": [["r0", 4]],
         "finished": ["r0"]},
        {"step": 1, "scheduled": [["r0", 1]]},
    ]),
    "one-state-twice": Example([
        {"step": 0, "arrivals": [arrival("r0", 4)], "scheduled": [["r0", 2], ["r0", 2]]},
    ]),
    "one-state-just-preempted": Example([
        PREFILL_TWO,
        {"step": 1, "preempted": [recompute("r1")], "scheduled": [["r0", 1], ["r1", 4]]},
    ], config={"num_gpu_blocks": 4}),
    "preempt-victim": Example([
        {"step": 0, "arrivals": [arrival("r0", 4), arrival("r1", 4)], "scheduled": [["r1", 4]]},
        {"step": 1, "preempted": [recompute("r0")], "scheduled": [["r1", 1]]},
    ]),
    "preempt-release": Example([
        {**PREFILL_TWO, "free_blocks": 0},
        {**PREEMPT_R1, "free_blocks": 0},
    ], config={"num_gpu_blocks": 4}),
    "preempt-recompute-ids": Example([
        {"step": 0, "arrivals": [arrival("r0", 8, 2), arrival("r1", 8)],
         "scheduled": [["r0", 8], ["r1", 8]], "new_blocks": {"r0": [0, 1], "r1": [2, 3]}},
        {"step": 1, "preempted": [recompute("r1")], "scheduled": [["r0", 1]],
         "finished": ["r0"], "new_blocks": {"r0": [2]}},
        {"step": 2, "scheduled": [["r1", 9]], "new_blocks": {"r1": [0]}},
    ], config={"num_gpu_blocks": 4}),
    "preempt-recompute-count": Example([
        {"step": 0, "arrivals": [arrival("r0", 8, 2), arrival("r1", 8)],
         "scheduled": [["r0", 8], ["r1", 8]], "free_blocks": 0},
        {"step": 1, "preempted": [recompute("r1")], "scheduled": [["r0", 1]],
         "finished": ["r0"], "free_blocks": 4},
        {"step": 2, "scheduled": [["r1", 9]], "free_blocks": 3},
    ], config={"num_gpu_blocks": 4}),
    "finish-sampled": Example([
        {"step": 0, "arrivals": [arrival("r0", 8)], "scheduled": [["r0", 4]],
         "finished": ["r0"]},
    ]),
    "finish-due": Example([
        {"step": 0, "arrivals": [arrival("r0", 4, 1)], "scheduled": [["r0", 4]]},
    ]),
    "finish-length": Example([
        {"step": 0, "arrivals": [arrival("r0", 31)], "scheduled": [["r0", 31]]},
        {"step": 1, "scheduled": [["r0", 1]], "finished": ["r0"]},
    ], config={"max_num_batched_tokens": 32}),
    "finish-length-served": Example([
        {"step": 0, "arrivals": [arrival("r0", 32)], "scheduled": [["r0", 32]],
         "finished": ["r0"]},
    ], config={"max_num_batched_tokens": 32}),
    "finish-leak": Example([
        {"step": 0, "arrivals": [arrival("r0", 4, 1)], "scheduled": [["r0", 4]],
         "finished": ["r0"], "free_blocks": 7},
    ]),
    "reject": Example([
        {"step": 0, "arrivals": [arrival("r0", 8)],
         "rejected": [{"id": "r0", "reason": "too long"}]},
    ]),
    "block-ids-owner": Example([
        {"step": 0, "arrivals": [arrival("r0", 4)], "scheduled": [["r0", 4]],
         "new_blocks": {"r0": [0]}},
        {"step": 1, "arrivals": [arrival("r1", 4)], "scheduled": [["r0", 1], ["r1", 4]],
         "new_blocks": {"r0": [1], "r1": [1]}},
    ]),
    "block-ids-count": Example([
        {"step": 0, "arrivals": [arrival("r0", 8)], "scheduled": [["r0", 8]],
         "new_blocks": {"r0": [0]}},
    ]),
    "block-ids-range": Example([
        {"step": 0, "arrivals": [arrival("r0", 8)], "scheduled": [["r0", 8]],
         "new_blocks": {"r0": [0, 8]}},
    ]),
    "block-ids-unscheduled": Example([
        {"step": 0, "arrivals": [arrival("r0", 4), arrival("r1", 4)], "scheduled": [["r0", 4]],
         "new_blocks": {"r0": [0], "r1": [1]}},
    ]),
    "block-ids-swapin": Example([
        *SWAP_WITH_IDS,
        {"step": 2, "swapped_in": ["r1"], "scheduled": [["r1", 1]], "new_blocks": {"r1": [0]}},
    ], config=SWAP),
    "block-ids-swapin-ok": Example([
        *SWAP_WITH_IDS,
        {"step": 2, "swapped_in": ["r1"], "scheduled": [["r1", 1]],
         "new_blocks": {"r1": [0, 1]}},
    ], config=SWAP),
    "block-ids-prompt-as-lazy": Example(PROMPT_ALLOCATED),
    "block-ids-prompt": Example(PROMPT_ALLOCATED, config={"allocation": "prompt"}),
    "block-ids-full": Example([
        {"step": 0, "arrivals": [arrival("r0", 12, 4)], "scheduled": [["r0", 12]],
         "new_blocks": {"r0": [0, 1, 2, 3]}, "free_blocks": 4},
        {"step": 1, "scheduled": [["r0", 1]], "new_blocks": {}, "free_blocks": 4},
        {"step": 2, "scheduled": [["r0", 1]], "new_blocks": {}, "free_blocks": 4},
        {"step": 3, "scheduled": [["r0", 1]], "finished": ["r0"], "new_blocks": {},
         "free_blocks": 8},
    ], config={"allocation": "full"}),
    "accounting": Example([
        {"step": 0, "arrivals": [arrival("r0", 6)], "scheduled": [["r0", 6]], "free_blocks": 5},
        {"step": 1, "scheduled": [["r0", 1]], "free_blocks": 5},
    ]),
    # -- section 7: SHOULD --
    "no-idle": Example([
        {"step": 0, "arrivals": [arrival("r0", 4)]},
    ]),
    "completion-running": Example([
        {"step": 0, "arrivals": [arrival("r0", 4)], "scheduled": [["r0", 4]]},
    ], end=True),
    "completion": Example([
        {"step": 0, "arrivals": [arrival("r0", 4, 1), arrival("r1", 40)],
         "scheduled": [["r0", 4]], "finished": ["r0"]},
    ], end=True),
    "no-thrash": Example([
        PREFILL_TWO, PREEMPT_R1,
        {"step": 2, "scheduled": [["r0", 1], ["r1", 4]]},
        {"step": 3, "preempted": [recompute("r1")], "scheduled": [["r0", 1]]},
    ], config={"num_gpu_blocks": 4}, max_preemptions=1),
    "progress": Example([
        {"step": 0, "arrivals": [arrival("r0", 7), arrival("r1", 7)],
         "scheduled": [["r0", 7], ["r1", 7]]},
        {"step": 1, "scheduled": [["r0", 1], ["r1", 1]]},
        {"step": 2}, {"step": 3}, {"step": 4},
        {"step": 5, "aborted": ["r1"], "scheduled": [["r0", 1]]},
    ], config={"num_gpu_blocks": 4}, stall_steps=3),
    "ends-stuck": Example([
        {"step": 0, "arrivals": [arrival("r0", 7), arrival("r1", 7)],
         "scheduled": [["r0", 7], ["r1", 7]]},
        {"step": 1, "scheduled": [["r0", 1], ["r1", 1]]},
        {"step": 2}, {"step": 3}, {"step": 4},
    ], config={"num_gpu_blocks": 4}, stall_steps=3),
    "starvation": Example([
        {"step": 0, "arrivals": [arrival("r0", 4, 4), arrival("r1", 4)],
         "scheduled": [["r0", 4]]},
        {"step": 1, "arrivals": [arrival("r2", 4)], "scheduled": [["r0", 1], ["r2", 4]]},
        {"step": 2, "scheduled": [["r0", 1], ["r2", 1]]},
        {"step": 3, "scheduled": [["r0", 1], ["r2", 1]], "finished": ["r0"]},
        {"step": 4, "arrivals": [arrival("r3", 4)], "scheduled": [["r2", 1], ["r3", 4]]},
    ], starve_steps=2),
    "needed-preemption": Example([PREFILL_TWO, PREEMPT_R1]),
    "needed-preemption-ok": Example([PREFILL_TWO, PREEMPT_R1], config={"num_gpu_blocks": 4}),
    "needed-preemption-after-overflow": Example([
        {"step": 0, "arrivals": [arrival("r0", 8, 2), arrival("r1", 8)],
         "scheduled": [["r0", 8], ["r1", 8]]},
        {"step": 1, "scheduled": [["r0", 1], ["r1", 1]], "finished": ["r0"]},
        {"step": 2, "arrivals": [arrival("r2", 4)], "preempted": [recompute("r1")],
         "scheduled": [["r2", 4]]},
    ], config={"num_gpu_blocks": 4}),
    # -- section 2: prefix caching --
    "prefix-hit": Example([
        *R0_CACHES,
        {"step": 2, "arrivals": [arrival("r1", 10, 2)], "prefix_hits": {"r1": [0, 1]},
         "scheduled": [["r1", 2]], "new_blocks": {"r1": [3]}, "free_blocks": 5},
    ], config=CACHING),
    "prefix-hit-long": Example([
        *R0_CACHES,
        {"step": 2, "arrivals": [arrival("r1", 8, 2)], "prefix_hits": {"r1": [0, 1]},
         "scheduled": [["r1", 1]], "new_blocks": {"r1": [3]}},
    ], config=CACHING),
    "prefix-hit-evicted": Example([
        *R0_CACHES,
        {"step": 2, "arrivals": [arrival("r2", 2, 8)], "scheduled": [["r2", 2]],
         "new_blocks": {"r2": [0]}, "free_blocks": 7},
        {"step": 3, "arrivals": [arrival("r1", 10, 2)], "prefix_hits": {"r1": [0, 1]},
         "scheduled": [["r2", 1], ["r1", 2]], "new_blocks": {"r1": [3]}, "free_blocks": 5},
    ], config=CACHING),
    "prefix-hit-free-count": Example([
        *R0_CACHES,
        {"step": 2, "arrivals": [arrival("r1", 10, 2)], "prefix_hits": {"r1": [0, 1]},
         "scheduled": [["r1", 2]], "new_blocks": {"r1": [3]}, "free_blocks": 7},
    ], config=CACHING),
    # -- section 2: lazy preemption, reclaims, held requests --
    "lazy-resume": Example([
        *LAZY_START,
        {"step": 1, "preempted": [lazy("r1")], "scheduled": [["r0", 1]],
         "finished": ["r0"], "new_blocks": {}, "free_blocks": 0},
        {"step": 2, "released": ["r0"], "scheduled": [["r1", 1]], "new_blocks": {"r1": [0]},
         "free_blocks": 1},
    ], config=LMDEPLOY),
    "lazy-reclaim": Example([
        *LAZY_START,
        {"step": 1, "preempted": [lazy("r1")], "reclaimed": ["r1"], "scheduled": [["r0", 1]],
         "finished": ["r0"], "new_blocks": {}, "free_blocks": 2},
        {"step": 2, "released": ["r0"], "scheduled": [["r1", 9]],
         "new_blocks": {"r1": [2, 3, 0]}, "free_blocks": 1},
    ], config=LMDEPLOY),
    "lazy-no-reclaim": Example([
        {"step": 0, "arrivals": [arrival("r0", 8), arrival("r1", 8)],
         "scheduled": [["r0", 8], ["r1", 8]]},
        {"step": 1, "preempted": [lazy("r1")], "scheduled": [["r0", 1]]},
    ], config=LMDEPLOY),
    "void-late": Example([
        {"step": 0, "arrivals": [arrival("r0", 4, 1)], "scheduled": [["r0", 4]],
         "finished": ["r0"]},
        {"step": 1},
        {"step": 2, "scheduled": [["r0", 1]]},
        {"step": 3, "released": ["r0"]},
    ], config={"pipelined": True}),
    "unsampled": Example([
        {"step": 0, "arrivals": [arrival("r0", 3, 2), arrival("r1", 3, 3)],
         "scheduled": [["r0", 3], ["r1", 3]]},
        {"step": 1, "scheduled": [["r0", 1], ["r1", 1]], "unsampled": ["r0"]},
        {"step": 2, "preempted": [lazy("r0")], "reclaimed": ["r0"],
         "scheduled": [["r1", 1]], "finished": ["r1"]},
        {"step": 3, "released": ["r1"], "scheduled": [["r0", 4]], "finished": ["r0"]},
        {"step": 4, "released": ["r0"]},
    ], config={"num_gpu_blocks": 2, "preemption": "lazy", "pipelined": True}),
    "held-leak": Example([
        {"step": 0, "arrivals": [arrival("r0", 4, 1)], "scheduled": [["r0", 4]],
         "finished": ["r0"], "free_blocks": 7},
        {"step": 1, "free_blocks": 7},
    ], config={"pipelined": True}, end=True),
    # -- section 8: PROFILE --
    "profile": Example([
        {"step": 0, "arrivals": [arrival("r0", 8), arrival("r1", 8)],
         "scheduled": [["r1", 8], ["r0", 8]]},
    ], profile="vllm-v1"),
}

DOCS = DocExamples(
    base=BASE,
    examples=EXAMPLES,
    bad_configs={
        "policy": {"policy": "lifo"},
        "block-size": {"block_size": 0},
        "threshold": {"chunked_prefill": False, "long_prefill_token_threshold": 8,
                      "max_num_batched_tokens": 32},
    },
    rejections={
        "prompt": Rejection(prompt_len=40, max_tokens=8),
        "blocks": Rejection(prompt_len=1400, max_tokens=100,
                            config={"block_size": 16, "num_gpu_blocks": 79,
                                    "max_model_len": 2048}),
        "watermark": Rejection(prompt_len=24, max_tokens=8,
                               config={"watermark_blocks": 1, "watermark_scope": "always"}),
        "prompt-fills": Rejection(prompt_len=32, max_tokens=8),
    },
)
