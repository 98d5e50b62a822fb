"""Generate a LeRobot v3.0 dataset recorded with LeRobot 0.6.1's default video settings (the peers'
720p AV1 dataset), through LeRobot's own writer in the LeRobot 0.6.1 peer venv: the code and its
options are ``tools/bench/peers/lerobot_default.py`` (``run.py lerobot-default --help``).

    python tools/bench/run.py lerobot-default           # 20 episodes x 120 frames, 1280x720, /work/gen/...
    python tools/bench/run.py lerobot-default --smoke   # 1 episode of 8 frames at 256x144, under /tmp
"""

from __future__ import annotations

import measure


def main(argv: list[str]) -> int:
    from peers import lerobot_default

    if "--smoke" in argv:
        argv = [a for a in argv if a != "--smoke"]
        out = str(measure.SMOKE_DIR / "lerobot_default")
        argv = ["--episodes", "1", "--frames", "8", "--size", "256x144", "--out", out, "--overwrite", *argv]
    try:
        return lerobot_default.main(argv)
    except lerobot_default.Missing as e:
        raise measure.Missing(str(e.code)) from None
