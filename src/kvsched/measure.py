"""The measurements of `kvsched calibrate` (kvsched.calibrate says what each one is), on
torch: a paged KV cache copied out to host memory and back, and a prompt through one
decoder layer."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kvsched.calibrate import Calibration, Shape

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                                  "float16": torch.float16}


def kv_cache(shape: Shape, blocks: int, device: torch.device, *, pin: bool = False
             ) -> torch.Tensor:
    """A paged KV cache of `blocks` blocks, each one contiguous: K and V of every layer."""
    return torch.empty((blocks, 2, shape.layers, shape.block_size, shape.kv_heads,
                        shape.head_dim), dtype=DTYPES[shape.dtype], device=device,
                       pin_memory=pin)


def measure_bytes_per_block(shape: Shape) -> int:
    """What one block of the cache holds: 2 x layers x KV heads x head dim x dtype bytes x
    block size."""
    block = kv_cache(shape, 1, torch.device("cpu"))[0]
    return block.numel() * block.element_size()


def _median_seconds(run: Callable[[], None], repeats: int, sync: Callable[[], None]) -> float:
    """The median wall time of `run` over `repeats` rounds, after one round of warm-up."""
    run()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _sync(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def host_buffer(shape: Shape, blocks: int) -> tuple[torch.Tensor, bool, str | None]:
    """A host buffer for `blocks` blocks: pinned when the platform has pinned memory (it
    needs an accelerator), else plain with a note saying so."""
    try:
        return kv_cache(shape, blocks, torch.device("cpu"), pin=True), True, None
    except RuntimeError as e:
        reason = str(e).split(";")[0].strip()
        return (kv_cache(shape, blocks, torch.device("cpu")), False,
                f"host buffer is plain (pageable) memory: pinned memory is unavailable "
                f"({reason})")


def measure_host_bandwidth(shape: Shape, device: torch.device, blocks: int, repeats: int
                           ) -> tuple[float, bool, list[str]]:
    """Bytes per second, one way, of moving `blocks` blocks device -> host -> device
    (a swap out and its swap in), with whether the host side was pinned and notes."""
    cache = kv_cache(shape, blocks, device)
    cache.normal_()
    host, pinned, note = host_buffer(shape, blocks)
    back = torch.empty_like(cache)

    def swap_out_and_in() -> None:
        host.copy_(cache, non_blocking=pinned)
        if pinned:  # the copy back must not start before the copy out has landed
            _sync(device)()
        back.copy_(host, non_blocking=pinned)

    seconds = _median_seconds(swap_out_and_in, repeats, _sync(device))
    notes = [note] if note else []
    if device.type == "cpu":
        notes.append("no accelerator: the device cache is host memory too, so host "
                     "bandwidth is a copy within host memory, not a transfer over a host "
                     "link (PCIe, NVLink); calibrate on the serving machine for that")
    return 2 * cache.numel() * cache.element_size() / seconds, pinned, notes


class DecoderLayer(nn.Module):
    """One pre-norm decoder layer of a Llama-like model: causal attention whose keys and
    values have `kv_heads` heads (nn.TransformerEncoderLayer has no grouped-query
    attention, so its K and V would not match the cache's shape), then a gated SiLU
    MLP."""

    def __init__(self, shape: Shape, device: torch.device) -> None:
        super().__init__()
        kw: dict[str, Any] = {"dtype": DTYPES[shape.dtype], "device": device}
        h, d = shape.hidden, shape.head_dim
        self.shape = shape
        self.attn_norm = nn.RMSNorm(h, **kw)
        self.qkv = nn.Linear(h, (shape.heads + 2 * shape.kv_heads) * d, bias=False, **kw)
        self.out = nn.Linear(h, h, bias=False, **kw)
        self.mlp_norm = nn.RMSNorm(h, **kw)
        self.gate_up = nn.Linear(h, 2 * shape.intermediate, bias=False, **kw)
        self.down = nn.Linear(shape.intermediate, h, bias=False, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.shape
        batch, tokens, _ = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(
            [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], -1)

        def heads(t: torch.Tensor, n: int) -> torch.Tensor:
            return t.view(batch, tokens, n, s.head_dim).transpose(1, 2)

        a = F.scaled_dot_product_attention(heads(q, s.heads), heads(k, s.kv_heads),
                                           heads(v, s.kv_heads), is_causal=True,
                                           enable_gqa=s.heads != s.kv_heads)
        x = x + self.out(a.transpose(1, 2).reshape(batch, tokens, s.hidden))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, -1)
        out: torch.Tensor = x + self.down(F.silu(gate) * up)
        return out


def measure_prefill_tokens_per_s(shape: Shape, device: torch.device, tokens: int,
                                 repeats: int) -> float:
    """Prompt tokens per second through the whole model: one layer's median time for a
    `tokens`-token prompt, times the number of layers."""
    torch.manual_seed(0)
    layer = DecoderLayer(shape, device).eval()
    prompt = torch.randn(1, tokens, shape.hidden, dtype=DTYPES[shape.dtype], device=device)

    def prefill() -> None:
        with torch.inference_mode():
            layer(prompt)

    seconds = _median_seconds(prefill, repeats, _sync(device))
    return tokens / (seconds * shape.layers)


def calibrate(shape: Shape, device: str = "auto", *, blocks: int = 256, tokens: int = 512,
              repeats: int = 5, threads: int | None = None) -> Calibration:
    """Measure the three numbers of the cost model for `shape` on `device` ("auto": CUDA
    when torch sees it, else the CPU), with `threads` torch threads (None: torch's own
    default, one per core).

    pre: not shape.problems() and blocks >= 1 and tokens >= 1 and repeats >= 1
    pre: device != "cuda" or torch.cuda.is_available()
    pre: threads is None or threads >= 1
    """
    if threads is not None:
        torch.set_num_threads(threads)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    where = torch.device(device)
    bandwidth, pinned, notes = measure_host_bandwidth(shape, where, blocks, repeats)
    prefill = measure_prefill_tokens_per_s(shape, where, tokens, repeats)
    return Calibration(shape, device, torch.get_num_threads(), measure_bytes_per_block(shape),
                       bandwidth, prefill, pinned, blocks, tokens, repeats, tuple(notes))
