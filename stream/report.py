"""Stream windows from a dataset and report throughput and where time goes (``epishard stream``).

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch.utils.data import default_collate
from tqdm import tqdm

from epishard.redact import redact, scrubbed

from . import diversity
from .dataset import WindowDataset, WindowLoader
from .lookahead import Lookahead
from .options import ReadOptions
from .source import DatasetSource
from .spec import WindowSpec, segment
from .telemetry import FIELDS, summarize
from .transform import PostProcess

__all__ = ["StreamRun", "dataset_columns", "iid_reference", "render", "run", "stream_spec"]

log = logging.getLogger(__name__)


def _timed_collate(samples: list[dict]) -> dict:
    t = time.perf_counter()
    batch = default_collate(samples)
    batch["__collate_s__"] = torch.tensor(time.perf_counter() - t, dtype=torch.float64)
    return batch


@dataclass(frozen=True)
class StreamRun:
    """What ``run`` streams: a dataset and the window, post-processing and loader to read it with.

    The window: ``frames`` per camera spread over ``span`` rows starting at the anchor
    (``segment(0, span - 1, frames)``), ``state_history`` state rows ending at the anchor, an
    ``action_horizon``-row action chunk; ``per_episode_count`` / ``per_episode_fraction``: windows
    per episode per epoch (``WindowSpec``'s); ``size``: ``"HxW"`` to resize frames; ``float``: float32 frames
    in [0, 1]. ``batches``: batches to run (0: one epoch). ``shuffle_episodes``: the plan's pool
    (``WindowDataset``'s ``shuffle``, ``"global"`` included); ``horizon``, ``frame_cache_mb``: the
    look-ahead (``stream.lookahead.Lookahead``'s ``horizon`` windows, ``frame_cache_bytes`` in MiB).
    ``storage_options``: fsspec options for a URL (``epishard.format.storage.resolve_storage_options``).
    """

    dataset: str
    cameras: str | None = None
    frames: int = 9
    span: int = 33
    state_history: int = 1
    action_horizon: int = 16
    boundary: str = "inside"
    stride: int = 1
    per_episode_count: int | None = None
    per_episode_fraction: float | None = None
    size: str | None = None
    float: bool = False
    batch_size: int = 8
    batches: int = 50
    workers: int = 2
    seed: int = 0
    shuffle_episodes: int | Literal["auto", "global"] | None = "auto"
    horizon: int = 256
    frame_cache_mb: int = Lookahead.frame_cache_bytes >> 20
    storage_options: dict | None = field(default=None, repr=False)  # secrets: never shown


def _size(text: str) -> tuple[int, int]:
    """``(height, width)`` of ``"HxW"``; ValueError naming the option otherwise."""
    height, _, width = text.lower().partition("x")
    try:
        return int(height), int(width)
    except ValueError:
        raise ValueError(f"--size: {text!r} is not a frame size like 224x224 (height x width)") from None


def stream_spec(
    cameras: list[str],
    frames: int,
    span: int,
    action_horizon: int,
    state_history: int = 1,
    boundary: str = "inside",
    stride: int = 1,
    per_episode_count: int | None = None,
    per_episode_fraction: float | None = None,
    columns: set[str] | None = None,
) -> WindowSpec:
    """The window ``epishard stream`` trains on (``preview --window stream`` draws the same).

    ``frames`` frames per camera over the ``span`` rows from the anchor on (``segment(0, span - 1,
    frames)``; one frame: the anchor's), ``state_history`` state rows ending at the anchor, an
    ``action_horizon``-row action chunk from the anchor on. ``columns``: the dataset's columns
    (``dataset_columns``); a dataset without ``observation.state`` or ``action`` (a UMI or
    camera-only conversion) gets a window without it (None: both asked for).

    Raises:
        ValueError: ``frames < 1``; as ``segment`` and ``WindowSpec`` do (the frames do not spread
            evenly over the span).
    """
    if frames < 1:
        raise ValueError(f"frames per camera (--frames) must be >= 1, not {frames}")
    offsets = segment(0, span - 1, frames) if frames > 1 else (0,)
    has = (lambda key: True) if columns is None else columns.__contains__
    return WindowSpec(
        cameras={c: offsets for c in cameras},
        state_offsets=tuple(range(1 - state_history, 1)),
        state_key="observation.state" if has("observation.state") else None,
        action_key="action" if has("action") else None,
        action_horizon=action_horizon if has("action") else 0,
        boundary=boundary,
        stride=stride,
        per_episode_count=per_episode_count,
        per_episode_fraction=per_episode_fraction,
    )


def dataset_columns(source) -> set[str]:
    """The numeric columns of a converted dataset (``DatasetSource``), from its manifest's features and statistics."""
    return set(source.manifest.features or {}) | set(source.manifest.stats)


def _build(options: StreamRun) -> WindowLoader:
    """The ``WindowLoader`` (telemetry on, collate timed) that ``run`` iterates."""
    source = DatasetSource(options.dataset, options.storage_options)  # a LeRobot folder is named as one
    cams = options.cameras.split(",") if options.cameras else source.cameras
    spec = stream_spec(
        cams,
        options.frames,
        options.span,
        options.action_horizon,
        options.state_history,
        options.boundary,
        options.stride,
        options.per_episode_count,
        options.per_episode_fraction,
        columns=dataset_columns(source),
    )
    size = _size(options.size) if options.size else None
    post = PostProcess(size=size, dtype=torch.float32 if options.float else torch.uint8)
    lookahead = Lookahead(horizon=options.horizon, frame_cache_bytes=options.frame_cache_mb << 20)
    ds = WindowDataset(
        source,
        spec,
        seed=options.seed,
        postprocess=post,
        read=ReadOptions(telemetry=True, lookahead=lookahead),
        shuffle=options.shuffle_episodes,
    )
    return WindowLoader(ds, batch_size=options.batch_size, num_workers=options.workers, collate_fn=_timed_collate)


def iid_reference(ds: WindowDataset, batch_size: float) -> diversity.Diversity:
    """What i.i.d. uniform sampling of ``ds``'s epoch windows gives (``stream.diversity.iid``).

    Windows per episode come from the sampling policy (the planner's expected count per episode:
    anchors, windows per episode, weights, selection), never from a run's length. An episode is
    ``(dataset, episode_index)``, as samples name it, so episodes of two sources in one dataset
    that share an index count as one on both sides of the comparison.
    """
    from .plan import anchor_counts, expected_windows

    t = ds.table
    windows = expected_windows(anchor_counts(t.lo, t.hi, ds.spec.stride, t.gaps), ds.spec.sampling, t.weight)
    keys = [(d, int(e)) for d, source in enumerate(ds.sources) for e in source.index.episode_index]
    return diversity.iid(diversity.merge_counts(keys, windows), batch_size)


_WORKER, _SAMPLES, _DECODED, _RETURNED = (
    FIELDS.index(f) for f in ("worker", "samples", "frames_decoded", "frames_returned")
)


def _running_ratio(latest: dict[int, np.ndarray], rows: np.ndarray) -> float:
    """Frames decoded per frame returned so far, after a batch's ``__telemetry__`` rows.

    ``rows``: float64 ``[batch, len(FIELDS)]``; ``latest`` keeps each worker's newest counters
    (updated in place).
    """
    for row in rows:
        w = int(row[_WORKER])
        if w not in latest or row[_SAMPLES] >= latest[w][_SAMPLES]:
            latest[w] = row
    decoded = sum(float(r[_DECODED]) for r in latest.values())
    return decoded / max(sum(float(r[_RETURNED]) for r in latest.values()), 1.0)


@scrubbed  # its exceptions and their chains name no credentials
def run(options: StreamRun, progress: bool = False) -> dict:
    """Iterate ``options.batches`` batches (or one epoch); return the report (a JSON-ready dict).

    ``progress``: a progress bar and two status lines on stderr (steps per epoch before the first
    batch; the time to the first batch when it arrives). ``report["per_step"]`` holds per-step
    series for plots: ``wait_s`` (seconds the loop waited for each batch) and
    ``frames_decoded_per_returned`` (running value after each batch). ``report["dataset"]``: the
    dataset's URL with its credentials redacted (``epishard.redact``).

    Raises:
        ValueError: no window fits the request.
    """
    t0 = time.perf_counter()
    loader = _build(options)
    setup_s = time.perf_counter() - t0
    steps_per_epoch, windows = len(loader), len(loader.dataset)
    todo = min(options.batches, steps_per_epoch) if options.batches else steps_per_epoch
    bar = tqdm(total=todo, unit="batch", desc="stream", disable=not progress, file=sys.stderr)

    def say(text: str) -> None:  # above the bar on a terminal, else a log line (shown with -v)
        if progress:
            bar.write(f"epishard stream: {text}", file=sys.stderr)
        else:
            log.info(text)

    say(f"{steps_per_epoch} steps per epoch ({windows} windows, batch size {options.batch_size}); running {todo}")
    tel, episodes, collate_s, samples, first, waits, ratio = [], [], 0.0, 0, None, [], []
    latest: dict[int, np.ndarray] = {}
    start = last = time.perf_counter()
    for i, batch in enumerate(loader):
        now = time.perf_counter()
        waits.append(now - last)
        if first is None:
            first = now - start
            say(f"first batch after {first:.2f} s (setup {setup_s:.2f} s)")
        tel.append(batch["__telemetry__"].numpy())
        ratio.append(_running_ratio(latest, tel[-1]))
        episodes.append(list(zip(batch["dataset"].tolist(), batch["episode_index"].tolist(), strict=True)))
        collate_s += float(batch["__collate_s__"])
        samples += len(batch["episode_index"])
        bar.update(1)
        last = time.perf_counter()
        if options.batches and i + 1 >= options.batches:
            break
    bar.close()
    wall = time.perf_counter() - start
    if not tel:
        raise ValueError(
            f"{redact(options.dataset)}: no window fits the request (episodes shorter than --span/--action-horizon?)"
        )
    t = summarize(tel)
    batch_diversity = diversity.measured(episodes)
    reference = iid_reference(loader.dataset, batch_diversity.batch_size)
    stages = {k: t[k] for k in ("plan_s", "read_s", "decode_s", "postprocess_s", "assemble_s")}
    stages["collate_s"] = collate_s
    return {
        "dataset": redact(options.dataset),  # shown and plotted: no credentials
        "batches": len(tel),
        "samples": samples,
        "wall_s": wall,
        "setup_s": setup_s,
        "time_to_first_batch_s": first,
        "steps_per_epoch": steps_per_epoch,
        "samples_per_s": samples / wall if wall else 0.0,
        "frames_per_s": t["frames_returned"] / wall if wall else 0.0,
        "worker_stage_s": stages,
        "frames_decoded_per_returned": t["frames_decoded_per_returned"],
        "decoder_opens_per_sample": t["decoder_opens_per_sample"],
        "bytes_read_per_sample": t["bytes_read_per_sample"],
        **diversity.summary(batch_diversity, reference),
        "windows_per_rank_per_epoch": windows,
        "episodes_without_windows": t["episodes_without_windows"],
        "workers": options.workers,
        "per_step": {"wait_s": waits, "frames_decoded_per_returned": ratio},
    }


def render(r: dict) -> str:
    """Text of ``run``'s report; its last line is the summary (samples, batches, seconds, rates)."""
    stages = r["worker_stage_s"]
    total = sum(stages.values()) or 1.0
    lines = [
        "  worker time per stage: "
        + ", ".join(f"{k[:-2]} {v:.2f}s ({100 * v / total:.0f}%)" for k, v in stages.items()),
        f"  frames decoded per frame returned {r['frames_decoded_per_returned']:.2f}, decoder opens per sample "
        f"{r['decoder_opens_per_sample']:.3f}, bytes read per sample {r['bytes_read_per_sample'] / 1e3:.1f} kB",
        f"  batch diversity: {r['distinct_episodes_per_batch']:.2f} distinct episodes per batch "
        f"(i.i.d. sampling: {r['distinct_episodes_per_batch_iid']:.2f}; ratio {r['diversity_ratio']:.2f}), "
        f"two samples share an episode with p={r['same_episode_pair_probability']:.3f} "
        f"(i.i.d.: {r['same_episode_pair_probability_iid']:.3f})",
        f"  {int(r['episodes_without_windows'])} episodes shorter than the window",
        f"  epoch: {r['steps_per_epoch']} steps, {r['windows_per_rank_per_epoch']} windows; {r['workers']} workers",
        f"{r['dataset']}: {r['samples']} samples in {r['batches']} batches, {r['wall_s']:.2f} s: "
        f"{r['samples_per_s']:.1f} samples/s, {r['frames_per_s']:.0f} frames/s, first batch after "
        f"{r['time_to_first_batch_s']:.2f} s (setup {r['setup_s']:.2f} s)",
    ]
    return "\n".join(lines)
