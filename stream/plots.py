"""PNG charts of the reader's telemetry (``epishard stream --plot``).

Drawn with matplotlib's Agg backend through ``matplotlib.figure.Figure`` (no pyplot state, no
display needed).

matplotlib is an optional dependency (the ``plots`` extra); it is imported when a chart is drawn.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["figure", "plot_stream_report"]


def figure(**kw: Any) -> Any:
    """A ``matplotlib.figure.Figure`` (Agg canvas; nothing global), ``kw`` passed on.

    Raises:
        ImportError: matplotlib is not installed, with the command that installs it.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("drawing needs matplotlib: pip install 'epishard[plots]' (or matplotlib)") from None
    return Figure(**kw)


def plot_stream_report(report: dict, path: str) -> None:
    """Draw ``stream.report.run``'s report into the PNG ``path``.

    Worker seconds per stage, the seconds the loop waited for each batch, and frames decoded per
    frame returned as the run went on.

    Raises:
        ImportError: matplotlib is not installed (``pip install epishard[plots]``).
    """
    fig = figure(figsize=(12, 3.6), layout="constrained")
    stages, waits, ratio = fig.subplots(1, 3)
    names = [k.removesuffix("_s") for k in report["worker_stage_s"]]
    seconds = list(report["worker_stage_s"].values())
    stages.barh(names, seconds, color="tab:blue")
    stages.invert_yaxis()
    stages.set_xlabel("seconds (all workers)")
    stages.set_title("worker time per stage")
    steps = report["per_step"]
    x = np.arange(1, len(steps["wait_s"]) + 1)
    waits.plot(x, steps["wait_s"], marker=".", color="tab:orange")
    waits.set_xlabel("step")
    waits.set_ylabel("seconds")
    waits.set_title(f"wait for each batch (first {report['time_to_first_batch_s']:.2f} s)")
    ratio.plot(x, steps["frames_decoded_per_returned"], color="tab:green")
    ratio.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ratio.set_xlabel("step")
    ratio.set_title("frames decoded / frame returned (running)")
    fig.suptitle(
        f"{report['dataset']}: {report['samples_per_s']:.1f} samples/s, {report['workers']} workers, "
        f"{report['steps_per_epoch']} steps per epoch"
    )
    fig.savefig(path, dpi=100)
