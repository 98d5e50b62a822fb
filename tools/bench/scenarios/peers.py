"""epishard's reader beside LeRobot 0.4.4 / 0.6.1, Lance, Ray Data, webdataset and a naive loader, at
matched batch diversity and the same output dtype, and against the decode limit: the command line of
``tools/bench/bench_peers.py`` (the code: ``tools/bench/peers/``; ``run.py peers --help``).
``--smoke`` is its ``--quick`` run.
"""

from __future__ import annotations


def main(argv: list[str]) -> int:
    from peers.cli import main as peers_main

    return peers_main(["--quick" if a == "--smoke" else a for a in argv])
