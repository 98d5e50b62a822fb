"""PNG charts of the summary (matplotlib; skipped with a line when it is absent)."""

from __future__ import annotations

from pathlib import Path

from .config import STAGES
from .runs import Dataset


def charts(rows: list[dict], datasets: list[Dataset], folder: Path, title: str) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        print("charts skipped: matplotlib is not installed (pip install matplotlib)")
        return []
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
            hatch="//" if label == "lerobot" else None,
        )
    ax.set_xticks(range(len(names)), [n.replace("_v30", "\n(v3.0)") for n in names])
    ax.set_yscale("log")
    ax.set_ylabel("samples/s (median of rounds; bars: min..max)")
    ax.set_title(title)
    ax.legend(fontsize=8, ncol=3)
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    p = folder / "peers_samples_per_s.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(str(p))

    st = [r for r in rows if r["stage_s_per_sample"]]
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
        fig.tight_layout()
        p = folder / "peers_epishard_stages.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(str(p))
    return paths
