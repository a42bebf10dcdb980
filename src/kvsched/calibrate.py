"""`kvsched calibrate`: measure `auto` preemption's cost model (kvsched.spec.knobs.CostModel)
on this machine, for one model shape (layers, query and KV heads, head dim, dtype, block
size).

- bytes per block: one KV block of the cache, K and V of every layer, read off an
  allocated block's tensor (2 x layers x KV heads x head dim x dtype bytes x block size);
- host bandwidth: a run of KV blocks copied from the device's cache to a host buffer
  (pinned where the platform has pinned memory) and back, bytes moved one way per
  second. Without an accelerator the "device" cache is host memory too, so this is a
  copy within host memory, not a transfer over a host link;
- prefill tokens per second: a prompt through one decoder layer of the same shape
  (pre-norm, grouped-query causal attention, a gated SiLU MLP), divided by the number of
  layers. Embedding, rotary embedding and the vocabulary head are left out.

Each is the median of several rounds after one of warm-up. The crossover follows from
them: `auto` swaps a victim exactly when its computed tokens per held block exceed
`2 x bytes_per_block x prefill_tokens_per_s / host_bandwidth`.

This module needs no torch: the measurements are kvsched.measure's (`calibrate` there),
so that the command line can refuse bad options, and say that torch is missing, without
loading it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvsched.spec.knobs import CostModel

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class Shape:
    """A model's shape as the KV cache and a prefill see it. heads: query heads, a
    multiple of kv_heads (grouped-query attention); mlp_size 0 means 4 x hidden."""

    layers: int = 4
    kv_heads: int = 4
    heads: int = 4
    head_dim: int = 64
    dtype: str = "bfloat16"
    block_size: int = 16
    mlp_size: int = 0

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim

    @property
    def intermediate(self) -> int:
        return self.mlp_size or 4 * self.hidden

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def problems(self) -> list[str]:
        """Every way this shape is malformed, one sentence each naming the option."""
        out = [f"--{name.replace('_', '-')} must be at least 1, got {value}"
               for name, value in (("layers", self.layers), ("kv_heads", self.kv_heads),
                                   ("heads", self.heads), ("head_dim", self.head_dim),
                                   ("block_size", self.block_size)) if value < 1]
        if self.mlp_size < 0:
            out.append(f"--mlp-size must not be negative, got {self.mlp_size}")
        if self.dtype not in DTYPE_BYTES:
            out.append(f"--dtype must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")
        if not out and self.heads % self.kv_heads:
            out.append(f"--heads ({self.heads}) must be a multiple of --kv-heads "
                       f"({self.kv_heads}): each KV head serves a group of query heads")
        return out


@dataclass(frozen=True)
class Calibration:
    """What was measured, and how."""

    shape: Shape
    device: str
    threads: int
    bytes_per_block: int
    host_bandwidth: float  # bytes per second, one way
    prefill_tokens_per_s: float
    pinned: bool  # the host buffer was pinned memory
    blocks: int  # blocks copied per round
    tokens: int  # prompt tokens per prefill round
    repeats: int
    notes: tuple[str, ...] = field(default=())

    @property
    def cost(self) -> CostModel:
        return CostModel(self.bytes_per_block, self.host_bandwidth, self.prefill_tokens_per_s)

    @property
    def crossover(self) -> float:
        """Computed tokens per held block at which swap and recompute cost the same
        (CostModel.crossover)."""
        return self.cost.crossover

    def simulate_flags(self) -> list[str]:
        """The `kvsched simulate` options that set this cost model (4 significant digits:
        the measurements' noise is larger)."""
        return ["--swap-bytes-per-block", str(self.bytes_per_block),
                "--host-bandwidth", f"{self.host_bandwidth:.4g}",
                "--prefill-tokens-per-s", f"{self.prefill_tokens_per_s:.4g}"]

    def as_dict(self) -> dict[str, Any]:
        s = self.shape
        return {
            "shape": {"layers": s.layers, "heads": s.heads, "kv_heads": s.kv_heads,
                      "head_dim": s.head_dim, "dtype": s.dtype, "block_size": s.block_size,
                      "hidden": s.hidden, "mlp_size": s.intermediate},
            "device": self.device, "threads": self.threads, "pinned": self.pinned,
            "blocks": self.blocks, "tokens": self.tokens, "repeats": self.repeats,
            "bytes_per_block": self.bytes_per_block, "host_bandwidth": self.host_bandwidth,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "crossover_tokens_per_block": self.crossover,
            "simulate_flags": self.simulate_flags(), "notes": list(self.notes),
        }


def render(c: Calibration) -> str:
    """The calibration as the command prints it."""
    s = c.shape
    gqa = f"{s.heads} heads ({s.kv_heads} KV heads)" if s.heads != s.kv_heads \
        else f"{s.heads} heads"
    threads = f"{c.threads} torch thread{'s' if c.threads != 1 else ''}"
    where = c.device + (f" ({threads})" if c.device == "cpu" else "")
    rows = [
        (f"kvsched calibrate: {s.layers} layers, {gqa} x {s.head_dim} dims (hidden "
         f"{s.hidden}, MLP {s.intermediate}), {s.dtype}, {s.block_size}-token blocks, on "
         f"{where}"),
        (f"bytes per block       {c.bytes_per_block:,} (2 x {s.layers} layers x "
         f"{s.kv_heads} KV heads x {s.head_dim} dims x {s.dtype_bytes} bytes x "
         f"{s.block_size} tokens)"),
        (f"host bandwidth        {c.host_bandwidth / 1e9:.3g} GB/s one way ({c.blocks} "
         f"blocks out to {'pinned' if c.pinned else 'plain'} host memory and back, median "
         f"of {c.repeats})"),
        (f"prefill tokens/s      {c.prefill_tokens_per_s:,.0f} (a {c.tokens}-token prompt "
         f"through one layer, median of {c.repeats}, / {s.layers} layers)"),
        (f"crossover             {c.crossover:.3g} computed tokens per block: recompute "
         "is cheaper below, swap above"),
    ]
    if c.crossover >= s.block_size:
        rows.append(f"                      a block holds at most {s.block_size} tokens, so "
                    "auto recomputes every victim at these costs")
    elif c.crossover < 1:
        rows.append("                      below one token: auto swaps every victim with a "
                    "computed token in each block it holds")
    rows += [f"note: {n}" for n in c.notes]
    rows.append("kvsched simulate --preemption auto (with host blocks, --num-cpu-blocks) "
                "takes these costs as: " + " ".join(c.simulate_flags()))
    return "\n".join(rows) + "\n"
