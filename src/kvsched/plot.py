"""Plots of traces as PNG (matplotlib, the `plot` extra): `kvsched metrics --plot` draws
one trace over time; `kvsched diff --plot` (kvsched.diff.plot_png) draws two."""

from __future__ import annotations

import io

from kvsched.metrics import Metrics

__all__ = ["PlotUnavailable", "metrics_png", "require_matplotlib"]


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'kvsched[plot]'") from None


def metrics_png(m: Metrics, title: str) -> bytes:
    """One trace over time: queue lengths, KV use, preemptions (cumulative), and each
    request's TTFT (at its first token) and TPOT (at its finish), in steps.

    pre: m.series is not None
    """
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    s = m.series
    assert s is not None, "collect the metrics with series=True"
    fig = Figure(figsize=(9, 9.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    queue, kv, pre, lat = fig.subplots(4, 1, sharex=True)
    steps = range(len(s.waiting))
    queue.plot(steps, s.running, color="tab:blue", lw=1.2, label="running")
    queue.plot(steps, s.waiting, color="tab:orange", lw=1.2, label="waiting")
    if any(s.swapped):
        queue.plot(steps, s.swapped, color="tab:green", lw=1.2, label="swapped")
    queue.set_ylabel("requests")
    queue.set_title("queue lengths after each step", fontsize=10, loc="left")
    kv.plot(steps, [100 * k / m.num_gpu_blocks for k in s.kv_blocks], color="tab:purple",
            lw=1.2, label=f"{m.num_gpu_blocks} blocks")
    kv.set_ylabel("KV use (%)")
    kv.set_ylim(0, 105)
    kv.set_title("GPU KV blocks held while the batch runs", fontsize=10, loc="left")
    total = 0
    cumulative = []
    for n in s.preemptions:
        total += n
        cumulative.append(total)
    pre.step(steps, cumulative, where="post", color="tab:red", lw=1.2, label=f"{total} in all")
    pre.set_ylabel("preemptions")
    pre.set_title("preemptions so far", fontsize=10, loc="left")
    if s.ttft_at:
        lat.scatter(*zip(*s.ttft_at, strict=True), s=6, color="tab:blue", label="TTFT")
    if s.tpot_at:
        lat.scatter(*zip(*s.tpot_at, strict=True), s=6, color="tab:orange", marker="x",
                    label="TPOT (steps/token)")
    lat.set_yscale("log")  # TTFT runs to thousands of steps where TPOT stays near 1
    lat.set_ylabel("steps (log)")
    lat.set_title("each request's TTFT at its first token, TPOT at its finish", fontsize=10,
                  loc="left")
    lat.set_xlabel("step")
    for ax in (queue, kv, pre, lat):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    fig.suptitle(title, fontsize=11)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
