"""PNG charts of the summary (matplotlib, pinned in requirements/machine.txt; ``require`` fails loudly without it)."""

from __future__ import annotations

from pathlib import Path

from .config import STAGES
from .runs import Dataset

# epishard's shuffle from local to global (``es-u8-pool16``, ``es-u8``, ``es-u8-poolall``, ``es-u8-global``):
# joined by a line in the diversity chart, each point with its worker RSS peak.
_CURVE = ("epishard u8 pool 16", "epishard u8", "epishard u8 pool all", "epishard u8 global")


def require() -> None:
    """Raise SystemExit naming the fix when matplotlib cannot be imported (checked before any run)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise SystemExit(
            f"bench_peers: --charts needs matplotlib, which failed to import ({exc}); install the pinned "
            "requirements (pip install -r requirements/machine.txt, or make setup) or pass --charts ''"
        ) from None


def charts(rows: list[dict], datasets: list[Dataset], folder: Path, title: str) -> list[str]:
    """Write the summary's PNG charts into ``folder``; return their paths.

    ``rows``: the summary's rows (one per dataset and system). Charts: samples/s per dataset and
    system (median of rounds, min..max bars, log scale); samples/s against batch diversity (distinct
    episodes per batch over the i.i.d. expectation, ``stream.diversity``); epishard's worker time per
    stage and sample (ms, from its telemetry), when rows carry it.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    names = [d.name for d in datasets if any(r["dataset"] == d.name for r in rows)]
    labels = list(dict.fromkeys(r["label"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(names) * len(labels) / 2), 5))
    width = 0.8 / len(labels)
    colors = plt.get_cmap("tab10")
    for j, label in enumerate(labels):
        xs, ys, lo, hi = [], [], [], []
        for i, n in enumerate(names):
            r = next((r for r in rows if r["dataset"] == n and r["label"] == label), None)
            if r:
                xs.append(i + (j - (len(labels) - 1) / 2) * width)
                ys.append(r["samples_per_s"])
                lo.append(max(0.0, r["samples_per_s"] - min(r["samples_per_s_rounds"])))
                hi.append(max(0.0, max(r["samples_per_s_rounds"]) - r["samples_per_s"]))
        ax.bar(
            xs,
            ys,
            width,
            yerr=[lo, hi],
            capsize=2,
            label=label,
            color=colors(j % 10),
            hatch="//" if label.startswith("LeRobot") else None,
        )
    ax.set_xticks(range(len(names)), [n.replace("_v30", "\n(v3.0)") for n in names])
    ax.set_yscale("log")
    ax.set_ylabel("samples/s (median of rounds; bars: min..max)")
    ax.set_title(title)
    ax.legend(fontsize=8, ncol=3)
    ax.grid(axis="y", alpha=0.3, which="both")
    paths.append(_save(fig, folder / "peers_samples_per_s.png"))

    fig, axes = plt.subplots(1, len(names), figsize=(4.6 * len(names) + 1, 4.6), squeeze=False)
    for ax, n in zip(axes[0], names, strict=True):
        for j, label in enumerate(labels):
            r = next((r for r in rows if r["dataset"] == n and r["label"] == label), None)
            if r and r["diversity_ratio"] is not None:
                marker = "s" if r["dtype"] == "uint8" else "o"
                ax.scatter(r["diversity_ratio"], r["samples_per_s"], color=colors(j % 10), marker=marker, label=label)
        curve = sorted(
            (r for r in rows if r["dataset"] == n and r["label"] in _CURVE and r["diversity_ratio"] is not None),
            key=lambda r: r["diversity_ratio"],
        )
        if len(curve) > 1:  # the shuffle's diversity curve: pool 16, the default, one pool, global; worker RSS
            ax.plot(
                [r["diversity_ratio"] for r in curve], [r["samples_per_s"] for r in curve], "-", color="grey", lw=0.8
            )
            for r in curve:
                if r.get("worker_rss_peak_mb"):
                    xy = (r["diversity_ratio"], r["samples_per_s"])
                    ax.annotate(
                        f"{r['worker_rss_peak_mb']:.0f} MB", xy, fontsize=6, xytext=(3, 3), textcoords="offset points"
                    )
        ax.axvline(0.9, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("distinct episodes per batch / i.i.d.")
        ax.set_title(n.replace("_v30", " (v3.0)"), fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("samples/s (square: uint8, circle: float32)")
    legend = {}
    for ax in axes[0]:  # every system once, whichever panel it ran in
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    axes[0][-1].legend(list(legend.values()), list(legend), fontsize=7)
    fig.suptitle("throughput against batch diversity; matched diversity right of the dashed line (0.9)")
    paths.append(_save(fig, folder / "peers_diversity.png"))

    st = [r for r in rows if r.get("stage_s_per_sample")]
    if st:
        panels = [n for n in names if any(r["dataset"] == n for r in st)]
        fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels) + 1, 5), squeeze=False)
        for ax, n in zip(axes[0], panels, strict=False):
            rs = [r for r in st if r["dataset"] == n]
            bottom = np.zeros(len(rs))
            for k, stage in enumerate(STAGES):
                vals = np.array([1e3 * r["stage_s_per_sample"][stage] for r in rs])
                ax.bar(range(len(rs)), vals, 0.7, bottom=bottom, label=stage[:-2], color=colors(k))
                bottom += vals
            ax.set_xticks(
                range(len(rs)),
                [r["label"].replace("epishard ", "es ") for r in rs],
                rotation=60,
                ha="right",
                fontsize=8,
            )
            ax.set_title(n.replace("_v30", " (v3.0)"), fontsize=9)
            ax.grid(axis="y", alpha=0.3)
        axes[0][0].set_ylabel("worker ms per sample (median of rounds)")
        axes[0][-1].legend(fontsize=8)
        fig.suptitle("worker time per stage and sample: epishard telemetry; webdataset and naive timed the same way")
        paths.append(_save(fig, folder / "peers_epishard_stages.png"))
    return paths


def _save(fig, path: Path) -> str:
    """Lay ``fig`` out, write it to ``path`` as a PNG (110 dpi), free it; return the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
