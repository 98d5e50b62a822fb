"""How much a busy Python thread in the same process slows PyAV's decoding (the GIL between FFmpeg calls).

A reader's worker decodes in its main thread while its fetch threads (s3fs's event loop, the
prefetch pool) run Python for each request. PyAV releases the GIL inside FFmpeg's calls but needs it
back after each one, so Python work in another thread runs in series with decoding, however many
cores are free (docs/BENCHMARKS.md, "S3 at +100 ms per request"). This decodes the first
``--packets`` packets of a video with one kept decoder (one FFmpeg thread, as the reader does) alone,
then beside a thread that runs Python without pause, and prints both times.

    python tools/bench/bench_gil.py [VIDEO] [--packets 300]

Default VIDEO: ``../shared/data/unitree_g1_bottle_av1_v30``'s camera (AV1 640x480, GOP 2).
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import av

REPO = Path(__file__).resolve().parents[2]
VIDEO = REPO.parent / "shared/data/unitree_g1_bottle_av1_v30/videos/observation.images.cam_high/chunk-000/file-000.mp4"
DECODERS = {"av1": "libdav1d"}  # FFmpeg's own AV1 decoder needs a hardware accelerator


def decode_seconds(packets: list, codec: str, extradata: bytes | None) -> tuple[float, int]:
    """Seconds to decode ``packets`` with a fresh one-thread decoder, and the frames it returned."""
    ctx = av.CodecContext.create(DECODERS.get(codec, codec), "r")
    ctx.extradata = extradata
    ctx.thread_count = 1
    started, frames = time.perf_counter(), 0
    for packet in packets:
        frames += len(ctx.decode(packet))
    frames += len(ctx.decode(None))
    return time.perf_counter() - started, frames


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("video", nargs="?", default=str(VIDEO))
    parser.add_argument("--packets", type=int, default=300)
    args = parser.parse_args()
    if not Path(args.video).is_file():
        parser.error(f"no video at {args.video}: give one (the default is in ../shared/data), e.g. an mp4 of sample/")
    with av.open(args.video) as container:
        stream = container.streams.video[0]
        codec, extradata = stream.codec_context.name, stream.codec_context.extradata
        packets = [p for _, p in zip(range(args.packets), container.demux(stream), strict=False) if p.size]
    alone, frames = decode_seconds(packets, codec, extradata)

    stop = threading.Event()
    spins = [0]

    def spin() -> None:
        while not stop.is_set():
            spins[0] += 1

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        beside, _ = decode_seconds(packets, codec, extradata)
    finally:
        stop.set()
        spinner.join()
    print(
        f"{Path(args.video).name}: {len(packets)} packets, {frames} frames ({codec}, one decoder thread): "
        f"{alone:.3f} s alone, {beside:.3f} s beside a busy Python thread ({beside / alone:.1f}x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
