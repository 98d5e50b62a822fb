"""``epishard convert``: LeRobot datasets in, window-indexed tar shards out (``shardwriter.convert``).

Internal: the command line's own module (``epishard.cli``).
"""

from __future__ import annotations

import argparse
import time

from epishard.cli import show_progress, storage_options
from epishard.redact import redact

__all__ = ["FORMATS_HELP", "HELP", "add_arguments", "parse_episodes", "run"]

HELP = (
    "convert LeRobot datasets (v2.0, v2.1, v3.0), ALOHA and robomimic/LIBERO HDF5, UMI Zarr, RLDS TFRecords "
    "and ROS 2 MCAP bags into window-indexed tar shards"
)


def _parse_size(text: str) -> int:
    """Bytes of ``512MiB``, ``1GiB``, ``100k``, ``4096``; ValueError naming the option otherwise."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    stem = text.strip().lower().rstrip("b").rstrip("i")
    try:
        return int(float(stem[:-1]) * units[stem[-1]]) if stem and stem[-1] in units else int(stem)
    except ValueError:
        raise ValueError(f"--max-shard-size: {text!r} is not a size in bytes like 512MiB or 1GiB") from None


def parse_episodes(text: str) -> frozenset[int]:
    """Episode indices of ``0-9,12``; ValueError naming the option otherwise (a backwards range too)."""
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        a, _, b = part.partition("-")
        try:
            lo, hi = int(a), int(b or a)
        except ValueError:
            raise ValueError(f"--episodes: {text!r} is not a list of episode indices like 0-9,12") from None
        if hi < lo:
            raise ValueError(f"--episodes: range {part!r} runs backwards (write {hi}-{lo})")
        out.update(range(lo, hi + 1))
    return frozenset(out)


def _reencode(text: str):
    from epishard.shardwriter.video import ReencodeSpec

    try:
        return ReencodeSpec.parse(text)
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"--reencode {text!r}: {exc} (expected e.g. codec=libx264,gop=10,size=224x224,crf=23)"
        ) from None


# The formats and aliases of ``shardwriter.sources.REGISTRY``, written out: importing the writer to
# read them would load numpy, pyarrow and PyAV, which ``epishard convert --help`` must not.
# tests/test_sources_registry.py asserts this equals the text the registry gives.
FORMATS_HELP = (
    "lerobot, aloha (act), robomimic (libero), umi (zarr, replay_buffer, diffusion_policy), rlds (oxe, tfrecord), "
    "mcap (ros2, rosbag)"
)


def _policy(c: argparse.ArgumentParser, flag: str, choices: tuple[str, str], help: str) -> None:
    """Add ``flag``, what to do with bad input: one of ``choices``, the first the default.

    ``fail``, the deprecated name of ``raise``, is still accepted (``ConvertOptions`` warns).
    """
    c.add_argument(
        flag,
        choices=[*choices, "fail"],
        default=choices[0],
        metavar="{" + ",".join(choices) + "}",
        help=f"{help} ('fail': deprecated 'raise')",
    )


def add_arguments(c: argparse.ArgumentParser) -> None:
    """The ``epishard convert`` arguments."""
    c.add_argument(
        "sources",
        nargs="+",
        metavar="SRC",
        help="LeRobot dataset folders or URLs (s3://, http(s)://, hf://datasets/...), or sources of another "
        "format (--format)",
    )
    c.add_argument("out", metavar="OUT", help="output folder or URL")
    c.add_argument("--prefix", default="shard", help="shard file prefix")
    c.add_argument("--max-episodes-per-shard", type=int, default=64, help="episodes per shard at most")
    c.add_argument("--max-shard-size", default="1GiB", help="bytes per shard at most, e.g. 512MiB")
    c.add_argument("--episodes", help="source episode indices to keep, e.g. 0-9,12 (default: all)")
    c.add_argument("--cameras", help="comma-separated camera names to keep (default: all)")
    c.add_argument(
        "--no-cameras",
        action="store_true",
        help="convert state and action only, no camera (needed when no declared camera has video files)",
    )
    c.add_argument(
        "--reencode", help="re-encode videos, e.g. codec=libx264,gop=10,size=224x224,crf=23 (default: copy bit-exact)"
    )
    _policy(c, "--on-error", ("raise", "skip"), "bad episode: stop, or skip it and count it in the report")
    _policy(c, "--timestamps", ("warn", "raise"), "timestamps that disagree with the video: report them, or stop")
    c.add_argument(
        "--check",
        choices=["full", "fast", "off"],
        default="fast",
        help="how each video's frame table is vouched for: fast = read from the container, keyframes and the "
        "last group of pictures decoded as the reader does (a disagreement: checked in full); full = every "
        "frame decoded three times; off = read from the container, nothing decoded (docs/guide/converting.md)",
    )
    c.add_argument(
        "--format",
        dest="source_format",
        metavar="FORMAT",
        help=f"the sources' format: {FORMATS_HELP} (default: recognised from the files)",
    )
    c.add_argument(
        "--mapping",
        metavar="FILE",
        help="JSON or TOML file overriding the format's mapping onto LeRobot keys: state, action, cameras, "
        "depth, columns, others, task, fps (docs/sources/; default: the format's own mapping)",
    )
    c.add_argument(
        "--fps",
        type=float,
        help="rows per second of a source that is not LeRobot; MCAP: the rate topics are resampled to "
        "(default: the format's own; MCAP: the slowest camera topic's rate)",
    )
    c.add_argument(
        "--allow-external",
        action="store_true",
        help="read files a source names outside itself (HDF5 external storage, external links and virtual "
        "datasets, symbolic links out of the source folder): only for a trusted local source; FIFOs, devices, "
        "/proc and /sys are refused even so (default: refused, naming file, key and target)",
    )
    c.add_argument("--workers", type=int, default=1, help="parallel processes")
    c.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a finished conversion of other sources or options in OUT (refused without it)",
    )
    c.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="write each shard as a task on a Ray cluster (ADDRESS, e.g. 10.0.0.1:6379; alone: RAY_ADDRESS "
        "or this machine's cluster); sources and OUT must be reachable from every node (default: no Ray, "
        "--workers processes here)",
    )
    storage_options(c)


def run(args: argparse.Namespace) -> int:
    """Run ``epishard convert``; return the exit status."""
    from epishard.shardwriter.convert import ConvertOptions, convert
    from epishard.shardwriter.describe import render_conversion
    from epishard.shardwriter.errors import ConversionError
    from epishard.shardwriter.sources import Mapping, SourceOptions

    options = ConvertOptions(
        prefix=args.prefix,
        max_episodes_per_shard=args.max_episodes_per_shard,
        max_bytes_per_shard=_parse_size(args.max_shard_size),
        episodes=parse_episodes(args.episodes) if args.episodes else None,
        cameras=() if args.no_cameras else tuple(args.cameras.split(",")) if args.cameras else None,
        reencode=_reencode(args.reencode) if args.reencode else None,
        on_error=args.on_error,
        timestamps=args.timestamps,
        check=args.check,
        workers=args.workers,
        progress=show_progress(args),
        overwrite=args.overwrite,
        sources=SourceOptions(
            format=args.source_format,
            mapping=Mapping.load(args.mapping) if args.mapping else Mapping(),
            fps=args.fps,
            allow_external=args.allow_external,
        ),
    )
    runner = None
    if args.ray is not None:  # Ray is imported only when asked for
        from epishard.shardwriter.ray_convert import RayRunner

        runner = RayRunner(args.ray or None)
    start = time.perf_counter()
    try:
        manifest = convert(args.sources, args.out, options, storage_options=args.storage_options, runner=runner)
    except ConversionError as exc:  # one episode's fault: say how to leave it out
        if args.on_error == "raise" and exc.episode is not None:
            exc.args = (f"{exc} (--on-error skip leaves such an episode out and counts it in the report)",)
        raise
    print(redact(render_conversion(manifest, args.out, time.perf_counter() - start)))
    _print_resampling(manifest)
    return 0


def _print_resampling(manifest, most: int = 40) -> None:
    """One line per episode and topic an MCAP source resampled (the summary above shows one example)."""
    from epishard.format.untrusted import printable

    entries = [w for w in manifest.report.warnings if w.kind == "resampled"]
    for w in entries[:most]:
        print(redact(printable(f"  resampled: {w.dataset} episode {w.episode}: {w.message}")))
    if len(entries) > most:
        print(f"  resampled: {len(entries) - most} more in the manifest's report")
