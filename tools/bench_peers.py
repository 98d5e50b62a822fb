"""Benchmark: epishard's reader side by side with the loaders users would pick instead, in one run.

The code lives in ``tools/peers/`` (one job per module: ``config`` the window and the systems,
``pipelines`` the peer loaders, ``measure`` one timed run, ``zygote`` the forking runner, ``runs``
datasets and peers, ``summary`` tables and ratios, ``charts``, ``cli``); what it measures and how is
in ``tools/peers/__init__.py``.

    python tools/bench_peers.py                              # all v3.0 datasets in ../shared/data
    python tools/bench_peers.py --setup-peers                # first build the LeRobot peer venv (~75 s)
    python tools/bench_peers.py --source sample/gr00t_robot_sim_picknplace --batches 3 --rounds 1
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # epishard from this checkout
    sys.path.insert(0, str(REPO))

from peers.cli import main

if __name__ == "__main__":
    sys.exit(main())
