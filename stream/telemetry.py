"""Counters and stage timings of the reader, per worker, merged into totals by the consumer.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

__all__ = ["FIELDS", "Telemetry", "summarize"]

FIELDS = (
    "worker",
    "plan_s",
    "read_s",
    "decode_s",
    "postprocess_s",
    "assemble_s",
    "samples",
    "episodes_loaded",
    "decoder_opens",
    "decode_calls",
    "frames_decoded",
    "frames_unique",
    "frames_returned",
    "bytes_read",
    "episodes_without_windows",
    "windows_dropped",
    "retries",
    "episodes_skipped",
    "substitutes",
    "requests",
    "range_ignored",
    "cache_hits",
    "fetch_waits",
    "fetch_depth",
    "schedule_s",
    "frame_cache_hits",
    "frame_cache_misses",
    "frame_cache_evictions",
    "encoded_cache_hits",
    "frame_cache_bytes_peak",
    "encoded_bytes_peak",
    "bytes_needed",
)
_PEAKS = frozenset({"frame_cache_bytes_peak", "encoded_bytes_peak"})  # maxima, not sums (``Telemetry.peak``)


class Telemetry:
    """Cumulative counters of one consumer (a DataLoader worker, or the main process).

    Seconds per stage (plan and index, read = time the worker waited for prefetched bytes, decode,
    post-process, assemble); frames decoded
    (decoder work estimated from the keyframe tables), unique frames requested, frames returned in
    samples; decoder opens and decode calls; samples; episodes loaded (fetched: an episode fetched
    again counts again). Look-ahead (``stream.lookahead``): seconds to schedule, frames of a chunk
    found in the frame cache (hits) or decoded for it (misses), frames evicted by the budget, loads
    that reused kept encoded bytes, and the most bytes held (frame cache, kept encoded members;
    ``peak``). The fetcher (``stream.fetch``)
    counts into the same names: bytes read, requests, retries, ranges a server ignored, cache hits,
    episodes it could not deliver without waiting, and requests it allows in flight (summed over workers).
    ``bytes_needed``: encoded bytes of the packets the decode calls of cameras with a packet table
    needed (``stream.packets.run_bytes``: their groups of pictures), the floor for ``bytes_read``.
    """

    def __init__(self, worker: int = 0):
        self.values = dict.fromkeys(FIELDS, 0.0)
        self.values["worker"] = float(worker)
        self._lock = threading.Lock()  # the fetcher's threads count too

    def add(self, **kw: float) -> None:
        """Add to counters by name (``FIELDS``), e.g. ``add(decode_s=0.02, frames_decoded=9)``."""
        with self._lock:
            for name, value in kw.items():
                self.values[name] += value

    def peak(self, **kw: float) -> None:
        """Raise counters of ``_PEAKS`` to at least these values, e.g. ``peak(frame_cache_bytes_peak=...)``."""
        with self._lock:
            for name, value in kw.items():
                self.values[name] = max(self.values[name], value)

    def tensor(self) -> torch.Tensor:
        """float64 ``[len(FIELDS)]``: attached to samples as ``__telemetry__`` when enabled."""
        return torch.tensor([self.values[f] for f in FIELDS], dtype=torch.float64)


def summarize(rows: list[torch.Tensor] | np.ndarray) -> dict:
    """Totals over workers from ``__telemetry__`` values seen in samples or batches.

    Takes, per worker, the latest (largest ``samples``) vector, then sums across workers and adds
    ratios: frames decoded per frame returned (the reuse figure), decode calls and decoder opens
    per sample, bytes read per sample, frame-cache hit rate. Peaks (``_PEAKS``) are the largest of
    any worker, not sums.
    """
    data = (
        np.concatenate([np.atleast_2d(np.asarray(r, dtype=np.float64)) for r in rows])
        if len(rows)
        else np.zeros((0, len(FIELDS)))
    )
    latest: dict[int, np.ndarray] = {}
    for row in data:
        w = int(row[0])
        if w not in latest or row[FIELDS.index("samples")] >= latest[w][FIELDS.index("samples")]:
            latest[w] = row
    total = dict.fromkeys(FIELDS[1:], 0.0)
    for row in latest.values():
        for i, name in enumerate(FIELDS[1:], start=1):
            total[name] = max(total[name], float(row[i])) if name in _PEAKS else total[name] + float(row[i])
    samples = max(total["samples"], 1.0)
    total["workers"] = len(latest)
    total["frames_decoded_per_returned"] = total["frames_decoded"] / max(total["frames_returned"], 1.0)
    total["decoder_opens_per_sample"] = total["decoder_opens"] / samples
    total["decode_calls_per_sample"] = total["decode_calls"] / samples
    looked = total["frame_cache_hits"] + total["frame_cache_misses"]
    total["frame_cache_hit_rate"] = total["frame_cache_hits"] / looked if looked else 0.0
    total["bytes_read_per_sample"] = total["bytes_read"] / samples
    return total
