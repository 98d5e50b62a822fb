"""Look at a converted dataset (``epishard preview``).

Training windows drawn as PNG contact sheets and one self-contained HTML page.

Windows are read through the reader itself (``WindowDataset``, ``boundary="pad"``), so the page
shows what training would get: per window, each camera's frames with their episode, row and frame
numbers and pad masks, the state/action curves over the window, and each stream at its own rate
(format version 3) as its samples at their own timestamps, seconds on the episode's clock. Drawn
with matplotlib's Agg backend (``matplotlib.figure.Figure``, no pyplot state); matplotlib is the
optional ``plots`` extra.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import os
import sys
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from epishard.redact import redact, scrubbed

from .dataset import WindowDataset
from .fetch import FetchPolicy
from .multirate import At, Span
from .multirate import span as stream_span
from .options import Ranks, ReadOptions
from .plan import World
from .plots import figure
from .source import DatasetSource
from .spec import WindowSpec

__all__ = [
    "STATE",
    "PreviewResult",
    "PreviewWindow",
    "RerunResult",
    "export_rerun",
    "preview",
    "stream_samples",
]

STATE, _ACTION = "observation.state", "action"


@dataclass(frozen=True)
class PreviewWindow:
    """One window drawn.

    The episode ``key``, the ``anchor`` row, the reader's ``sample``, and per
    camera the rows shown (int64 ``[frames]``, clamped to the episode's recording segment) and the
    camera's frame numbers of those rows (int64 ``[frames]``, from the index's row-to-frame map).
    ``streams``: per stream at its own rate drawn, the interval ``(start, stop)`` it was read over,
    seconds on the episode's clock (the anchor's timestamp plus the spec's ``span`` bounds, or the
    first and last of its ``at`` times); ``fps``: the episode's rows per second.
    """

    key: str
    anchor: int
    sample: dict
    rows: dict[str, np.ndarray]
    frames: dict[str, np.ndarray]
    streams: dict[str, tuple[float, float]] = field(default_factory=dict)
    fps: float = 0.0

    @property
    def t0(self) -> float:
        """The anchor row's timestamp, seconds on the episode's clock (the time streams are read around)."""
        return float(self.sample["timestamp"])


@dataclass(frozen=True)
class PreviewResult:
    """What ``preview`` wrote.

    The page, the contact sheets (one PNG per window, in ``shown``'s order) and their folder, and
    the windows drawn.
    """

    html: str
    sheets: list[str]
    sheets_dir: str
    shown: list[PreviewWindow]

    @property
    def windows(self) -> int:
        """Windows drawn."""
        return len(self.shown)

    @property
    def episodes(self) -> int:
        """Episodes the windows drawn come from."""
        return len({w.key for w in self.shown})


def _source_episode(key: str) -> int:
    # Episode keys are `<source>-e<episode:06d>` (docs/FORMAT.md).
    return int(key.rsplit("-e", 1)[1])


def _read_windows(
    source: DatasetSource, spec: WindowSpec, episodes: frozenset[int] | None, count: int, seed: int, progress: bool
) -> list[PreviewWindow]:
    """``count`` windows of one consumer's epoch-0 plan in ``episodes``, round robin over episodes.

    The sample at position i of a single consumer's iteration is the plan's window i (episode,
    anchor), which gives each frame's row and frame number.
    """
    ix = source.index
    ds = WindowDataset(
        source,
        spec,
        seed=seed,
        ranks=Ranks(rank=0, world_size=1),
        shuffle=0,
        read=ReadOptions(fetch=FetchPolicy(on_shard_error="raise")),
    )
    plan = ds.plan(0, World())
    by_episode: dict[int, list[int]] = {}
    for i, e in enumerate(plan.episode.tolist()):
        if episodes is None or _source_episode(ix.key(e)) in episodes:
            by_episode.setdefault(e, []).append(i)
    # Round robin over the episodes (in plan order): every selected episode shows before any shows twice.
    rounds = max((len(v) for v in by_episode.values()), default=0)
    wanted = set([v[r] for r in range(rounds) for v in by_episode.values() if r < len(v)][:count])
    out: list[PreviewWindow] = []
    offsets = ds.cam_offsets[0]
    with tqdm(total=len(wanted), unit="window", desc="preview", disable=not progress, file=sys.stderr) as bar:
        for i, sample in enumerate(ds):
            if len(out) == len(wanted):
                break
            if i not in wanted:
                continue
            e, anchor = int(plan.episode[i]), int(plan.anchor[i])
            edges = ix.segment_edges(e)
            k = int(np.searchsorted(edges, anchor, side="right")) - 1
            names = ix.camera_names(e)
            rows = {c: np.clip(anchor + o, edges[k], edges[k + 1] - 1) for c, o in offsets.items()}
            frames = {c: ix.frames(ix.stream(e, names.index(c)), r) for c, r in rows.items()}
            t0 = float(sample["timestamp"])
            intervals = {name: _interval(read, t0) for name, read in spec.streams.items()}
            out.append(PreviewWindow(ix.key(e), anchor, sample, rows, frames, intervals, float(ix.fps[e])))
            bar.update(1)
    return out


def _interval(read: Span | At, t0: float) -> tuple[float, float]:
    """The seconds on the episode's clock a stream read covers around the anchor time ``t0``."""
    if isinstance(read, Span):
        return t0 + read.start, t0 + read.stop
    return t0 + min(read.times), t0 + max(read.times)


def _row_range(spec: WindowSpec) -> tuple[int, int]:
    """The first and last row offset (from the anchor) the window shows: cameras, state, action."""
    offsets = [0]
    for o in (spec.cameras or {}).values():
        offsets += [int(x) for x in o]
    if spec.state_key is not None:
        offsets += [int(x) for x in spec.state_offsets]
    if spec.action_key is not None and spec.action_horizon:
        offsets += spec.action_rows.tolist()
    return min(offsets), max(offsets)


def _with_streams(spec: WindowSpec, source: DatasetSource, streams: list[str] | None) -> WindowSpec:
    """``spec`` reading the streams at their own rate a preview draws.

    ``streams``: their names (None: every stream of the dataset, ``manifest.streams``; ``[]``:
    none). A stream ``spec`` already reads keeps its read (what training gets); any other is read as
    ``span`` over the window's rows in seconds (first row offset / fps to last row offset / fps,
    fps the slowest episode's, so the span covers every window's rows), with ``max_samples`` the
    most samples an episode holds where samples share a time (events: no interval bounds them).

    Raises:
        ValueError: a name the dataset has no stream of (naming the ones it has).
    """
    have = dict(source.manifest.streams or {})
    names = list(have) if streams is None else list(dict.fromkeys(streams))
    unknown = [n for n in names if n not in have]
    if unknown:
        raise ValueError(f"--streams names {unknown}; the dataset has streams {sorted(have)}")
    if not names:
        return dataclasses.replace(spec, streams={}) if spec.streams else spec
    ix = source.index
    first, last = _row_range(spec)
    fps = float(np.min(ix.fps)) if ix.fps.size else 1.0
    all_names = np.asarray(ix.signal_names.to_numpy(zero_copy_only=False))
    reads: dict[str, Span | At] = {}
    for name in names:
        if name in spec.streams:
            reads[name] = spec.streams[name]
            continue
        hit = all_names == name
        count, gap = ix.signal_count[hit], ix.signal_min_interval[hit]
        tied = bool(((count >= 2) & (gap <= 0)).any())
        most = max(int(count.max(initial=0)), 1) if tied else None
        reads[name] = stream_span(first / fps, last / fps, max_samples=most)
    return dataclasses.replace(spec, streams=reads)


def stream_samples(w: PreviewWindow) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The samples of each stream at its own rate that window ``w`` read, as the page draws them.

    Stream name -> ``(timestamps float64 [k], values float64 [k, width])``: the reader's samples
    (padding left out) at their own times, seconds on the episode's clock; ``width`` the product
    of the per-sample shape (1 for a scalar). For a ``span`` read: every sample of the episode's
    recording segment in ``w.streams[name]`` (each end widened by ``multirate.TOLERANCE_S``).
    """
    out = {}
    for name in w.streams:
        pad = np.asarray(w.sample[f"{name}_is_pad"], dtype=bool)
        times = np.asarray(w.sample[f"{name}_timestamp"], dtype=np.float64)[~pad]
        values = np.asarray(w.sample[name], dtype=np.float64)
        out[name] = (times, values.reshape(values.shape[0], -1)[~pad])
    return out


def _stream_plot(ax, w: PreviewWindow, name: str, times: np.ndarray, values: np.ndarray) -> None:
    """One stream's samples at their own timestamps (seconds on the episode's clock), one curve per dimension."""
    lo, hi = w.streams[name]
    style = ".-" if times.size <= 200 else "-"
    for j in range(values.shape[1]):
        label = f"{name}[{j}]" if j < _NAMED_DIMS else None
        ax.plot(times, values[:, j], style, linewidth=0.7, markersize=2.5, label=label)
    if values.shape[1] > _NAMED_DIMS:
        ax.plot([], [], "-", color="black", label=f"{name}: {values.shape[1] - _NAMED_DIMS} more dims")
    if not times.size:
        ax.text(0.5, 0.5, "no samples in this interval", transform=ax.transAxes, ha="center", va="center")
    margin = max(hi - lo, 1e-3) * 0.02
    ax.set_xlim(lo - margin, hi + margin)
    ax.axvline(w.t0, color="red", linewidth=0.8)
    count = f"{times.size} sample{'' if times.size == 1 else 's'}"
    ax.set_title(f"{name}: {count} at their own times, {lo:.3f} to {hi:.3f} s", fontsize=7)
    ax.set_xlabel(f"seconds on the episode's clock (red: anchor, t = {w.t0:.3f} s)", fontsize=7)
    if times.size and values.shape[1] > 1:
        ax.legend(loc="upper left", fontsize=6, ncol=3)
    elif times.size:
        ax.set_ylabel(name, fontsize=7)


def _image(frame) -> tuple[np.ndarray, dict]:
    """HWC uint8 RGB, or HW with a colour map for a depth camera (uint16 ``[1, H, W]``)."""
    array = frame.numpy()
    if array.shape[0] == 1:
        return array[0], {"cmap": "viridis"}
    return np.moveaxis(array, 0, -1), {}


_NAMED_DIMS = 12  # dimensions named in a curve legend, per column; more are drawn, counted in one entry


def _dimension_names(names, width: int) -> list[str]:
    """A column's per-dimension names from its manifest ``features`` entry (``names``), else ``""`` each.

    LeRobot writes a flat list, a one-entry dict (``{"motors": [...]}``) or a list holding one list.
    """
    if isinstance(names, dict) and len(names) == 1:
        names = next(iter(names.values()))
    if isinstance(names, list) and len(names) == 1 and isinstance(names[0], list):
        names = names[0]
    if isinstance(names, list) and len(names) == width and all(isinstance(n, str) for n in names):
        return list(names)
    return [""] * width


def _curves(ax, w: PreviewWindow, spec: WindowSpec, names: dict | None = None) -> None:
    """State rows (solid) and the action chunk (dashed) against row numbers; padded rows shaded.

    Each dimension is its own named curve in the legend (``<column>[j] <name>``, names from the
    manifest's ``features``: ``names`` column -> that entry's names), the first ``_NAMED_DIMS`` per column.
    """
    drawn = False
    for key, rows, style in (
        (STATE, w.anchor + np.asarray(spec.state_offsets), "-"),
        (_ACTION, w.anchor + spec.action_rows, "--"),
    ):
        if key not in w.sample:
            continue
        values = np.asarray(w.sample[key], dtype=np.float64).reshape(len(rows), -1)
        pad = np.asarray(w.sample[f"{key}_is_pad"], dtype=bool)
        short = key.removeprefix("observation.")
        labels = _dimension_names((names or {}).get(key), values.shape[1])
        for j in range(values.shape[1]):
            label = f"{short}[{j}] {labels[j]}".rstrip() if j < _NAMED_DIMS else None
            ax.plot(rows, values[:, j], style, linewidth=0.8, label=label)
        if values.shape[1] > _NAMED_DIMS:
            ax.plot([], [], style, color="black", label=f"{short}: {values.shape[1] - _NAMED_DIMS} more dims")
        for row in rows[pad]:
            ax.axvspan(row - 0.5, row + 0.5, color="grey", alpha=0.25, linewidth=0)
        drawn = True
    ax.axvline(w.anchor, color="red", linewidth=0.8)
    ax.set_xlabel("row (red: anchor; grey: padded rows)")
    if drawn:
        ax.legend(loc="upper left", fontsize=6, ncol=2)


def _sheet(w: PreviewWindow, spec: WindowSpec, title: str, names: dict | None = None) -> bytes:
    """One window as a PNG: a row of frames per camera, the state/action curves, then one plot per stream."""
    cams = list(w.rows)
    series = stream_samples(w)
    cols = max((len(r) for r in w.rows.values()), default=1)
    heights = [2.1] * len(cams) + [2.6] + [1.9] * len(series)
    width = max(1.9 * cols, 8.0) if series else 1.9 * cols  # a stream's plot needs room for its time axis
    fig = figure(figsize=(width, sum(heights)), layout="constrained")
    grid = fig.add_gridspec(len(heights), cols, height_ratios=heights)
    for c, cam in enumerate(cams):
        pad = np.asarray(w.sample[f"{cam}_is_pad"], dtype=bool)
        for j, (row, frame) in enumerate(zip(w.rows[cam].tolist(), w.frames[cam].tolist(), strict=True)):
            ax = fig.add_subplot(grid[c, j])
            image, style = _image(w.sample[cam][j])
            ax.imshow(image, **style)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"row {row} frame {frame}" + (" PAD" if pad[j] else ""), fontsize=7)
            if pad[j]:
                for spine in ax.spines.values():
                    spine.set_edgecolor("red")
                    spine.set_linewidth(3)
            if j == 0:
                ax.set_ylabel(cam.removeprefix("observation.images."), fontsize=7)
    _curves(fig.add_subplot(grid[len(cams), :]), w, spec, names)
    for k, (name, (times, values)) in enumerate(series.items()):
        _stream_plot(fig.add_subplot(grid[len(cams) + 1 + k, :]), w, name, times, values)
    fig.suptitle(title, fontsize=9)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    return buffer.getvalue()


def _page(dataset: str, intro: str, sections: list[tuple[str, bytes]]) -> str:
    body = "\n".join(
        f'<section><h2>{html.escape(title)}</h2>\n<img alt="{html.escape(title)}" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}"></section>'
        for title, png in sections
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<link rel="icon" href="data:,">
<title>epishard preview: {html.escape(dataset)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
h2 {{ font-size: 1em; margin-top: 2em; }}
img {{ max-width: 100%; border: 1px solid #ccc; }}
</style>
</head>
<body>
<h1>epishard preview: {html.escape(dataset)}</h1>
<p>{html.escape(intro)}</p>
{body}
</body>
</html>
"""


def _write(path: str, data: bytes) -> None:
    """Write ``path`` whole or not at all (a temporary name, then a rename)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


@scrubbed  # its exceptions and their chains name no credentials
def preview(
    dataset: str,
    out: str = "preview.html",
    *,
    episodes: frozenset[int] | None = None,
    windows: int = 8,
    cameras: list[str] | None = None,
    frames: int = 6,
    span: int = 30,
    action_horizon: int = 16,
    seed: int = 0,
    sheets: str | None = None,
    storage_options: dict | None = None,
    progress: bool = False,
    spec: WindowSpec | None = None,
    streams: list[str] | None = None,
) -> PreviewResult:
    """Draw ``windows`` training windows of ``dataset`` (a converted dataset, folder or URL).

    Each window: ``frames`` frames per camera spread evenly over the ``span`` rows ending at the
    anchor (rounded to rows), the state over those rows and an ``action_horizon``-row
    action chunk, with ``boundary="pad"``: rows past an episode's edge repeat its edge row and are
    flagged (red frame, ``PAD``; grey bands on the curves). Windows are the seed's epoch-0 plan of
    one consumer (``per_episode_count`` so that every selected episode contributes), restricted to the
    source episode indices ``episodes``.

    Writes one PNG contact sheet per window into ``sheets`` (default: ``<out without .html>_sheets``)
    and the page ``out``, which inlines the same PNGs (base64) and needs no other file.

    ``spec``: draw this window instead (its cameras, offsets, state, action and boundary; e.g.
    ``stream.report.stream_spec(...)``, the window ``epishard stream`` trains on, or a training
    run's own ``WindowSpec``); ``cameras``, ``frames``, ``span`` and ``action_horizon`` are then
    unused, and only its windows per episode are the preview's. State and action curves: one per
    dimension, named ``<column>[j] <name>`` from the manifest's ``features`` names.

    ``streams``: the streams at their own rate drawn (format version 3), each in its own plot below
    the curves: its samples at their own timestamps, seconds on the episode's clock, the anchor's
    time marked (``stream_samples`` gives the data). None: every stream of the dataset
    (``manifest.streams``); ``[]``: none. A stream ``spec`` reads is drawn as it reads it; any
    other over the window's rows in seconds (from its first row offset / fps to its last, fps the
    slowest episode's): by default ``-(span - 1) / fps`` to ``(action_horizon - 1) / fps``.

    Raises:
        ValueError: no window to show (``episodes`` selects none, or ``windows < 1``); ``streams``
            names a stream the dataset does not have.
        ImportError: matplotlib is not installed (``pip install epishard[plots]``).
    """
    figure()  # fail before reading anything when matplotlib is missing

    if windows < 1 or frames < 1 or span < 1:
        raise ValueError(f"--windows, --frames and --span must be >= 1, got {windows}, {frames}, {span}")
    source = DatasetSource(dataset, storage_options)  # a LeRobot folder is named as one
    ix = source.index
    chosen = [e for e in range(ix.num_episodes) if episodes is None or _source_episode(ix.key(e)) in episodes]
    if not chosen:
        raise ValueError(f"--episodes selects no episode of the dataset ({ix.num_episodes} episodes)")
    # Columns with statistics are the numeric features (features may be absent in older manifests).
    features = set(source.manifest.features or {}) | set(source.manifest.stats)
    # Evenly spread, rounded to rows (any span works; segment() would insist on an exact spread).
    offsets = tuple(int(o) for o in np.unique(np.round(np.linspace(-(span - 1), 0, frames))))
    count = -(-windows // len(chosen))
    if spec is not None:  # the window a run trains on: only the windows per episode are the preview's
        spec = dataclasses.replace(spec, per_episode_count=count, per_episode_fraction=None)
        offsets = tuple(next(iter(spec.cameras.values()))) if spec.cameras else (0,)
    else:
        spec = WindowSpec(
            cameras={c: offsets for c in (cameras or source.cameras)},
            state_offsets=tuple(range(-(span - 1), 1)),
            action_horizon=action_horizon if _ACTION in features else 0,
            state_key=STATE if STATE in features else None,
            action_key=_ACTION if _ACTION in features else None,
            boundary="pad",
            per_episode_count=count,
        )
    spec = _with_streams(spec, source, streams)
    names = {k: f.names for k, f in (source.manifest.features or {}).items()}
    picked = sorted(_read_windows(source, spec, episodes, windows, seed, progress), key=lambda w: (w.key, w.anchor))
    if not picked:
        raise ValueError(f"{redact(dataset)}: no window to show")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    stem = out[:-5] if out.endswith(".html") else out
    sheets_dir = sheets or f"{stem}_sheets"
    os.makedirs(sheets_dir, exist_ok=True)
    sections, paths = [], []
    for n, w in enumerate(picked):
        title = (
            f"window {n + 1}/{len(picked)}: episode {w.key} (episode_index {w.sample['episode_index']}), "
            f"anchor row {w.anchor}, frame_index {w.sample['frame_index']}, task: {w.sample['task']}"
        )
        png = _sheet(w, spec, title, names)
        paths.append(os.path.join(sheets_dir, f"window-{n:03d}.png"))
        _write(paths[-1], png)
        sections.append((title, png))
    intro = (
        f"{len(picked)} windows of {len({w.key for w in picked})} episodes; cameras "
        f"{', '.join(spec.cameras or {})}; frames at offsets {list(offsets)} from the anchor; state at rows "
        f"{list(spec.state_offsets)}, action at rows {spec.action_rows.tolist()} from the anchor. Red frames and grey "
        "bands: padded rows (past the episode's edge, repeating its edge row)."
    )
    if spec.streams:
        reads = ", ".join(
            f"{name} [{r.start:g}, {r.stop:g}] s" if isinstance(r, Span) else f"{name} at {list(r.times)} s"
            for name, r in spec.streams.items()
        )
        intro += (
            f" Streams at their own rate, each sample at its own timestamp (seconds on the episode's clock, the "
            f"anchor's time in red), around the anchor: {reads}."
        )
    _write(out, _page(redact(dataset), intro, sections).encode("utf-8"))  # the page names no credentials
    return PreviewResult(out, paths, sheets_dir, picked)


def _row_time(w: PreviewWindow, row: int) -> float:
    """Row ``row``'s time in the Rerun export: the anchor's timestamp plus ``(row - anchor) / fps`` seconds."""
    return w.t0 + (row - w.anchor) / w.fps if w.fps > 0 else w.t0


def _ns(seconds):
    """Seconds (a float or float64 array) as ``timedelta64[ns]``, rounded to the nearest nanosecond."""
    return np.round(np.asarray(seconds, dtype=np.float64) * 1e9).astype(np.int64).astype("timedelta64[ns]")


@dataclass(frozen=True)
class RerunResult:
    """What ``export_rerun`` wrote: the ``.rrd`` path and the windows in it (in the ``window`` timeline's order)."""

    rrd: str
    shown: list[PreviewWindow]


@scrubbed  # its exceptions and their chains name no credentials
def export_rerun(
    dataset: str,
    out: str,
    spec: WindowSpec,
    *,
    episodes: frozenset[int] | None = None,
    windows: int = 8,
    seed: int = 0,
    storage_options: dict | None = None,
    progress: bool = False,
    streams: list[str] | None = None,
) -> RerunResult:
    """Write training windows of ``dataset`` to a Rerun recording (``.rrd``) for the Rerun viewer.

    The windows are those ``preview(..., spec=spec)`` draws (the reader's samples of ``spec``, a
    few per episode, round robin over ``episodes``). Timelines: ``window`` (the window's number),
    ``row`` (the table row) and ``time`` (seconds on the episode's clock, a duration to the nearest
    nanosecond: row ``r`` of a
    window at the anchor's timestamp plus ``(r - anchor) / fps``, a stream's sample at its own
    timestamp). Per window, at ``window`` = its number: each camera's frames as
    ``window/<camera>/<j>`` images (``j``: the frame's position in the window; uint8 RGB
    ``[H, W, 3]``, depth as uint16 ``[H, W]``) at their row's ``time``, ``window/info`` (text:
    episode, anchor, task, the rows and frame numbers shown, padded ones marked); at each row of
    the window also: ``state/<j> <name>`` and ``action/<j> <name>`` scalars (one series per
    dimension, names from the manifest's ``features``); and each stream at its own rate as
    ``stream/<name>/<j>`` scalars (one series per value of a sample), every sample the window read
    at its own ``time``: a 1 kHz stream holds 1,000 points per second. ``streams`` chooses the
    streams as ``preview`` does (None: every stream of the dataset).

    Needs ``rerun-sdk`` (``pip install epishard[rerun]``).

    Raises:
        ImportError: rerun-sdk is not installed.
        ValueError: no window to show (``episodes`` selects none, or ``windows < 1``); ``streams``
            names a stream the dataset does not have.
    """
    try:
        import rerun as rr
    except ImportError as exc:
        raise ImportError("the Rerun export needs rerun-sdk: pip install 'epishard[rerun]'") from exc
    if windows < 1:
        raise ValueError(f"windows must be >= 1, got {windows}")
    source = DatasetSource(dataset, storage_options)
    ix = source.index
    chosen = [e for e in range(ix.num_episodes) if episodes is None or _source_episode(ix.key(e)) in episodes]
    if not chosen:
        raise ValueError(f"episodes= selects no episode of the dataset ({ix.num_episodes} episodes)")
    spec = dataclasses.replace(spec, per_episode_count=-(-windows // len(chosen)), per_episode_fraction=None)
    spec = _with_streams(spec, source, streams)
    picked = _read_windows(source, spec, episodes, windows, seed, progress)
    names = {k: f.names for k, f in (source.manifest.features or {}).items()}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    rec = rr.RecordingStream("epishard")
    rec.save(out)
    for n, w in enumerate(picked):
        rec.reset_time()  # the frames of a window are at its number only
        rec.set_time("window", sequence=n)
        lines = [f"episode {w.key}, anchor row {w.anchor}, task: {w.sample['task']}"]
        for cam, rows in w.rows.items():
            pad = np.asarray(w.sample[f"{cam}_is_pad"], dtype=bool)
            for j, frame in enumerate(w.sample[cam]):
                image, _ = _image(frame)
                rec.set_time("time", duration=_ns(_row_time(w, int(rows[j]))))
                rec.log(f"window/{cam}/{j}", rr.Image(image) if image.ndim == 3 else rr.DepthImage(image))
            shown = [
                f"row {r} frame {f}{' PAD' if p else ''}" for r, f, p in zip(rows, w.frames[cam], pad, strict=True)
            ]
            lines.append(f"{cam}: " + ", ".join(shown))
        rec.log("window/info", rr.TextDocument(redact("\n".join(lines))))
        for key, offsets in ((STATE, np.asarray(spec.state_offsets)), (_ACTION, spec.action_rows)):
            if key not in w.sample:
                continue
            values = np.asarray(w.sample[key], dtype=np.float64).reshape(len(offsets), -1)
            labels = _dimension_names(names.get(key), values.shape[1])
            for row, v in zip((w.anchor + offsets).tolist(), values, strict=True):
                rec.set_time("row", sequence=int(row))
                rec.set_time("time", duration=_ns(_row_time(w, int(row))))
                for j, x in enumerate(v.tolist()):
                    rec.log(f"{key.removeprefix('observation.')}/{j} {labels[j]}".rstrip(), rr.Scalars([x]))
        for name, (times, values) in stream_samples(w).items():
            if not times.size:
                continue
            indexes = [
                rr.TimeColumn("window", sequence=np.full(times.size, n)),
                rr.TimeColumn("time", duration=_ns(times)),
            ]
            for j in range(values.shape[1]):
                rec.send_columns(
                    f"stream/{name}/{j}", indexes=indexes, columns=rr.Scalars.columns(scalars=values[:, j])
                )
    rec.flush()
    del rec  # closes the file
    return RerunResult(out, picked)
