"""PNG charts of per-rank cost per step (``tools/bench/run.py balance --plot``).

Drawn with matplotlib's Agg backend through ``matplotlib.figure.Figure`` (no pyplot state, no
display needed).

matplotlib is an optional dependency (the ``plots`` extra); it is imported when a chart is drawn.

Internal: import from ``epishard.balance``.
"""

from __future__ import annotations

import numpy as np

from .telemetry import step_stats

__all__ = ["plot_rank_costs"]


def plot_rank_costs(layouts: dict[str, np.ndarray], path: str, title: str = "") -> None:
    """Draw each named layout's per-rank cost per step into the PNG ``path``.

    Per layout: the cost of every rank in every step (a heat map, steps x ranks), and per step the
    max/mean rank cost and the padding fraction.

    Args:
        layouts: name -> float64 ``[steps, world_size, batch_size]`` slot costs (``step_costs``),
            e.g. ``{"random": ..., "balanced": ...}`` of the same samples; one colour scale for all.
        title: the figure's title.

    Raises:
        ImportError: matplotlib is not installed (``pip install epishard[plots]``).
    """
    from epishard.stream.plots import figure

    fig = figure(figsize=(12, 3.2 * len(layouts)), layout="constrained")
    axes = fig.subplots(len(layouts), 2, squeeze=False, width_ratios=[3, 2])
    rank_costs = {name: np.asarray(c, dtype=np.float64).sum(axis=2) for name, c in layouts.items()}
    vmax = max(float(r.max()) for r in rank_costs.values()) or 1.0
    for (name, costs), (heat, lines) in zip(layouts.items(), axes, strict=True):
        image = heat.imshow(rank_costs[name].T, aspect="auto", cmap="magma", vmin=0, vmax=vmax, interpolation="nearest")
        heat.set_xlabel("step")
        heat.set_ylabel("rank")
        heat.set_title(f"{name}: cost of each rank's batch")
        fig.colorbar(image, ax=heat, label="cost")
        stats = step_stats(np.asarray(costs, dtype=np.float64))
        lines.plot(stats.imbalance, color="tab:red", linewidth=0.8, label="max/mean rank cost")
        lines.plot(1.0 + stats.padding, color="tab:blue", linewidth=0.8, label="1 + padding fraction")
        lines.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
        lines.set_xlabel("step")
        lines.set_title(f"{name}: max/mean {stats.imbalance.mean():.3f}, padding {stats.padding.mean():.1%}")
        lines.legend(loc="upper right", fontsize=7)
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=100)
