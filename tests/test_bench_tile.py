"""The benchmarks' tiler (``tile`` of ``tools/bench/scenarios/firstbatch.py``, the ``firstbatch`` scenario
for its million-episode index) makes a dataset the reader accepts, whose copies read the source's frames.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections import Counter

from faultgen import CAMERA, SPEC

from epishard.stream import WindowDataset
from epishard.stream.source import DatasetSource

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tile():
    if os.path.join(REPO, "tools", "bench") not in sys.path:
        sys.path.insert(0, os.path.join(REPO, "tools", "bench"))
    from scenarios.firstbatch import tile

    return tile


def _samples(root: str) -> Counter:
    return Counter(
        (int(s["episode_index"]), int(s["frame_index"]), hashlib.sha256(s[CAMERA].numpy().tobytes()).hexdigest())
        for s in WindowDataset(root, SPEC, seed=5)
    )


def test_tiled_copies_are_distinct_shards_that_read_the_source_frames(intact, tmp_path):
    out = _tile()(intact, 40, str(tmp_path / "tiled"), None, block=3)
    source = DatasetSource(out)  # every index check holds: no two members of a shard share a byte
    reps = 9  # 40 episodes of 6 per copy: 7 copies, rounded up to whole blocks of 3
    assert source.index.num_episodes == 6 * reps
    assert len(source.manifest.shards) == 3 * 3
    want = _samples(intact)
    assert _samples(out) == Counter({key: n * reps for key, n in want.items()})
