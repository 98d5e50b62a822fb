"""The encoded bytes of the groups of pictures a sample's frames need, averaged over a dataset's windows.

For every anchor of every episode (the benchmark's window: 9 frames over 33 rows per camera, edges
padded), the packets the reader's runs hold (``stream.packets.plan_runs``: from each frame's keyframe
on, merged where no keyframe separates two frames), summed per camera from the index's packet table:
the denominator of "bytes read per sample / bytes the sample needs". Needs a conversion with packet
tables (``WindowIndex.has_packets``).

    python tools/bench/gop_bytes.py /tmp/epishard_bench_peers/unitree_g1_bottle_av1_v30_x50.epishard
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def gop_bytes_per_sample(root: str, frames: int = 9, span: int = 33, stride: int = 1) -> float:
    """Mean bytes per window (every ``stride``-th anchor of every episode), over all cameras."""
    import numpy as np

    from epishard.shardwriter import WindowIndex
    from epishard.stream.packets import plan_runs, run_bytes

    index = WindowIndex.load_dataset(root)
    offsets = np.linspace(0, span - 1, frames).round().astype(np.int64)
    total, windows = 0, 0
    for e in range(index.num_episodes):
        n = int(index.num_rows[e])
        anchors = np.arange(0, n, stride)
        for c in range(int(index.episode_cams[e + 1] - index.episode_cams[e])):
            s = index.stream(e, c)
            table = index.packets(s)
            keys = index.keyframes_of(s)
            for a in anchors.tolist():
                wanted = np.unique(index.frames(s, np.clip(a + offsets, 0, n - 1)))
                total += run_bytes(table.size, plan_runs(table.frame_packet, keys, wanted))
        windows += anchors.size
    return total / max(windows, 1)


if __name__ == "__main__":
    for root in sys.argv[1:]:
        print(f"{root}: {gop_bytes_per_sample(root, stride=7) / 1e3:.1f} kB per sample (every 7th anchor)")
