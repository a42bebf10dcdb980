"""`kvsched calibrate`: auto preemption's cost model measured on this machine.

Loaded when the command is named (kvsched.cli.Group).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click
import orjson

from kvsched.commands.options import (
    fail,
)

if TYPE_CHECKING:
    pass


@click.command()
@click.option("--layers", type=int, default=4, show_default=True, help="Decoder layers.")
@click.option("--kv-heads", type=int, default=4, show_default=True,
              help="Key/value heads per layer (what the KV cache holds).")
@click.option("--heads", type=int, default=None,
              help="Query heads, a multiple of --kv-heads [default: --kv-heads].")
@click.option("--head-dim", type=int, default=64, show_default=True, help="Dims per head.")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]),
              default="bfloat16", show_default=True, help="KV cache and weights dtype.")
@click.option("--block-size", type=int, default=16, show_default=True,
              help="Tokens per KV block.")
@click.option("--mlp-size", type=int, default=None,
              help="MLP intermediate size [default: 4 x hidden].")
@click.option("--blocks", type=int, default=256, show_default=True,
              help="KV blocks copied out and back per round.")
@click.option("--tokens", type=int, default=512, show_default=True,
              help="Prompt tokens per prefill round.")
@click.option("--repeats", type=int, default=5, show_default=True,
              help="Rounds of each measurement (the median is taken).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True,
              help="Where the KV cache and the layer live (auto: cuda when torch sees it).")
@click.option("--threads", type=int, default=None,
              help="Torch CPU threads [default: torch's, one per core]; on a machine "
                   "shared with other jobs 1 gives steadier figures.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def calibrate(layers: int, kv_heads: int, heads: int | None, head_dim: int, dtype: str,
              block_size: int, mlp_size: int | None, blocks: int, tokens: int, repeats: int,
              device: str, threads: int | None, fmt: str) -> None:
    """Measure the cost model of --preemption auto on this machine: bytes per KV block,
    host bandwidth, prefill tokens per second, and the crossover between them."""
    from kvsched.calibrate import Shape, render

    if mlp_size is not None and mlp_size < 1:
        fail(f"--mlp-size must be at least 1, got {mlp_size}")
    shape = Shape(layers=layers, kv_heads=kv_heads, heads=kv_heads if heads is None else heads,
                  head_dim=head_dim, dtype=dtype, block_size=block_size, mlp_size=mlp_size or 0)
    problems = shape.problems()
    for name, value in (("blocks", blocks), ("tokens", tokens), ("repeats", repeats),
                        ("threads", threads)):
        if value is not None and value < 1:
            problems.append(f"--{name} must be at least 1, got {value}")
    if problems:
        fail(problems[0])
    try:
        import torch

        from kvsched.measure import calibrate as measure
    except ImportError:
        fail("kvsched calibrate needs torch: pip install 'kvsched[gpu]'")
    if device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: torch.cuda.is_available() is False on this machine")
    result = measure(shape, device, blocks=blocks, tokens=tokens, repeats=repeats,
                     threads=threads)
    if fmt == "json":
        sys.stdout.write(orjson.dumps(result.as_dict(), option=orjson.OPT_INDENT_2).decode()
                         + "\n")
    else:
        sys.stdout.write(render(result))
