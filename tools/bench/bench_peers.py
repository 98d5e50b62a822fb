"""Benchmark: the honest table. epishard's reader beside LeRobot 0.4.4 / 0.6.1, Ray Data, webdataset and a naive
loader, at matched batch diversity and the same output dtype, and against the decode limit.

The code lives in ``tools/bench/peers/`` (one job per module: ``config`` the window, systems and targets,
``tile`` the dataset tiler, ``decodelimit``, ``pipelines`` the webdataset/naive loaders,
``lerobot_harness`` the LeRobot side, ``measure`` one timed run, ``zygote`` the forking runner,
``runs`` datasets and peers, ``summary`` tables and headline, ``charts``, ``cli``); what it measures
and how is in ``tools/bench/peers/__init__.py``.

    python tools/bench/bench_peers.py                  # every v3.0 dataset in ../shared/data, tiled to 200 episodes
    python tools/bench/bench_peers.py --setup-peers    # first build both LeRobot peer venvs (~4 min)
    python tools/bench/bench_peers.py --quick          # smoke run
    python tools/bench/bench_peers.py --s3-latency-ms 100 --systems es-u8,lance-video-u8   # from moto S3, +100 ms
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for _p in (REPO, REPO / "tests"):  # epishard from this checkout; the test servers (--s3)
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from peers.cli import main

if __name__ == "__main__":
    sys.exit(main())
