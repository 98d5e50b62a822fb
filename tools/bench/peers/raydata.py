"""Ray Data (``ray.data.read_lerobot``, Ray 2.60) loading the benchmark's windows, as a peer.

``read_lerobot(root, delta_timestamps=...)`` is Ray's own LeRobot v3 reader: per camera the frames at
offsets 0, 4, ..., 32 (``i * STEP / fps`` s), the 16-step action chunk (``k / fps``), the state at
the anchor, clamped to the anchor's episode with ``*_is_pad`` masks (the rule of LeRobot's
``delta_timestamps``, which it delegates to: ``lerobot.datasets.feature_utils``). It needs
``lerobot`` (>= 0.5: ``lerobot.datasets.dataset_metadata``, ``decode_video_frames_torchcodec``)
importable beside Ray, and lerobot 0.6.1 needs PyAV < 16 (``av.option``), while this project's venv
has PyAV 18: so this harness runs with the LeRobot 0.6.1 peer venv's python and Ray 2.60 taken from
this project's venv (the same cp311 install, ``ray`` and the few of its requirements the peer lacks,
linked into an overlay folder put on ``PYTHONPATH``: ``overlay()``). Ray itself is the pinned one;
the peer venv is left untouched.

How it is run (``runs.run_raydata``): ``ray.init(num_cpus=--workers)`` (a local cluster, 2 CPUs:
the read tasks are Ray's "workers"), ``read_lerobot(read_granularity="episode",
concurrency=--workers)``: one read task per episode (``"file"``, its default, would make one task of
a tiled dataset, whose episodes all share one mp4 per camera), each decoding its episode through
lerobot's torchcodec path. Ray has no sampler over anchors: rows come out episode by episode, and
the only shuffle that does not first materialise every decoded window (``random_shuffle``,
``randomize_block_order``: all-to-all, hundreds of GB here) is ``iter_torch_batches``'
``local_shuffle_buffer_size`` (``--shuffle-buffer`` rows, default 32 = 4 batches). Batch diversity is
therefore what that buffer gives, and is measured like every other system's. Output: ``raydata-u8``
is Ray's native layout, uint8 (N, T, H, W, C); ``raydata`` converts in Ray tasks (``map_batches``
after the read: Ray runs it as ``Project->MapBatches``) to float32 in [0, 1] (N, T, C, H, W),
LeRobot's float layout. The timed loop is ``measure.run_child``'s and ``lerobot_harness``'s (warm-up
batches, then at least ``--seconds`` and ``--min-batches``); memory is sampled over the driver's
process tree (raylet, the Ray workers; the object store's shared pages are in every RSS, once in PSS).
Measured on the 720p default-settings dataset (2026-12-01, 2 busy cores, ``--quick``): about 55-70 s
to the first batch (the 32-row buffer holds 25 MB windows), 2-3 samples/s after it, PSS 8-9 GB, 1.0
episodes per batch of 8. Windows checked frame-exact against the frame-index barcodes of
``tools/bench/make_lerobot_default.py`` (240 anchors, clamping and ``*_is_pad`` at episode ends included).

    . /tmp/peer/lerobot061-env.sh && PYTHONPATH=OVERLAY python tools/bench/peers/raydata.py ROOT [--uint8]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

RAY_VERSION = "2.60.0"
# Ray's requirements (with the ``data`` extra) that the LeRobot 0.6.1 peer venv does not have; the
# rest (numpy, pandas, pyarrow, fsspec, requests, pyyaml, click, ...) are the peer's own.
OVERLAY_DISTRIBUTIONS = (
    "ray",
    "jsonschema",
    "jsonschema-specifications",
    "referencing",
    "rpds-py",
    "msgpack",
    "protobuf",
    "six",
    "pydantic",  # iter_torch_batches imports ray.train, which needs pydantic
    "pydantic-core",
    "annotated-types",
    "typing-inspection",
)


def overlay(folder: Path, peer_site: Path) -> Path:
    """Link this interpreter's Ray and its requirements missing from ``peer_site`` into ``folder``.

    Called in this project's venv (where Ray 2.60 is installed). Returns ``folder``, rebuilt each call
    (symlinks only: cheap). Raises ``RuntimeError``: Ray is not the pinned version here, or the peer
    interpreter's site-packages are missing.
    """
    import importlib.metadata as md
    import shutil

    if md.version("ray") != RAY_VERSION:
        raise RuntimeError(f"Ray Data peer: this venv has ray {md.version('ray')}, the benchmark pins {RAY_VERSION}")
    if not peer_site.is_dir():
        raise RuntimeError(f"Ray Data peer: no LeRobot 0.6.1 site-packages at {peer_site}")
    have = {
        p.name[: -len(".dist-info")].rsplit("-", 1)[0].lower().replace("_", "-") for p in peer_site.glob("*.dist-info")
    }
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name in OVERLAY_DISTRIBUTIONS:
        if name in have:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError as exc:
            raise RuntimeError(f"Ray Data peer: {name} (a requirement of Ray) is not installed in this venv") from exc
        tops = {str(f).split("/")[0] for f in dist.files or () if not str(f).startswith("..")} - {"__pycache__"}
        for top in sorted(tops):
            src = Path(dist.locate_file(top))
            if src.exists():
                (folder / top).symlink_to(src)
    return folder


def _to_float(batch: dict, cams: list[str]) -> dict:
    """``map_batches`` step of ``raydata`` (f32): cameras (N, T, H, W, C) uint8 -> (N, T, C, H, W) float32 in [0, 1]."""
    import numpy as np

    for c in cams:
        x = np.stack(list(batch[c])) if batch[c].dtype == object else batch[c]
        batch[c] = np.ascontiguousarray(x.transpose(0, 1, 4, 2, 3), dtype=np.float32) / np.float32(255.0)
    return batch


def check_window(b: dict, cams: list[str], action: str, args) -> None:
    """Exit with a clear message unless the batch holds the benchmark's window: per camera
    ``--window`` frames, an ``--action-horizon`` action chunk (never measure something else)."""
    for c in cams:
        t = b[c].shape[1] if b[c].dim() == 5 else None
        if t != args.window:
            raise SystemExit(f"Ray Data gave {c} of shape {tuple(b[c].shape)}, not {args.window} frames per sample")
    if b[action].dim() != 3 or b[action].shape[1] != args.action_horizon:
        shape = tuple(b[action].shape)
        raise SystemExit(f"Ray Data gave {action} of shape {shape}, not a {args.action_horizon}-step chunk")


def main() -> None:
    """Time Ray Data's ``read_lerobot`` windows on ``root``; print one JSON line (samples/s, memory in MB)."""
    assert os.environ.get("HF_HUB_OFFLINE") == "1", "source the LeRobot 0.6.1 peer's env file first"
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root")
    ap.add_argument("--workers", type=int, default=2, help="Ray CPUs = concurrent read tasks")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--min-batches", type=int, default=5)
    ap.add_argument("--window", type=int, default=9)
    ap.add_argument("--stride", type=int, default=4)
    ap.add_argument("--action-horizon", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shuffle-buffer", type=int, default=32, help="iter_torch_batches local_shuffle_buffer_size")
    ap.add_argument("--uint8", action="store_true", help="Ray's native uint8 (N, T, H, W, C) frames")
    ap.add_argument("--object-store-mb", type=int, default=0, help="Ray's object store size (0: Ray's default)")
    args = ap.parse_args()

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # On 2 busy cores the raylet misses heartbeats and the GCS declares the node dead ("health check
    # failed due to missing too many heartbeats", seen at 720p with a load average of 5): be patient.
    os.environ.setdefault("RAY_health_check_failure_threshold", "60")
    os.environ.setdefault("RAY_health_check_timeout_ms", "30000")
    import ray
    import ray.data
    import torch
    from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata
    from memory import MemSampler  # tools/bench/peers/memory.py: this script's folder is sys.path[0]

    root = Path(args.root).resolve()
    meta = LeRobotDatasetMetadata(f"local/{root.name}", root=root)
    cams = list(meta.video_keys)
    action = "action" if "action" in meta.features else "actions"
    state = "observation.state" if "observation.state" in meta.features else None
    delta = {c: [i * args.stride / meta.fps for i in range(args.window)] for c in cams}
    delta[action] = [k / meta.fps for k in range(args.action_horizon)]
    keep = [*cams, action, f"{action}_is_pad", *(f"{c}_is_pad" for c in cams), "episode_index", "index"]
    keep += [state] if state else []

    t0 = time.perf_counter()
    ray.init(
        num_cpus=args.workers,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        object_store_memory=args.object_store_mb * 2**20 or None,
    )
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.execution_options.preserve_order = False
    init_s = time.perf_counter() - t0
    store_mb = ray.cluster_resources().get("object_store_memory", 0) / 2**20
    ds = ray.data.read_lerobot(
        str(root),
        read_granularity="episode",
        delta_timestamps=delta,
        concurrency=args.workers,
        num_cpus=1,
    ).select_columns(keep)
    if not args.uint8:
        ds = ds.map_batches(_to_float, fn_kwargs={"cams": cams}, batch_format="numpy", num_cpus=1)
    build_s = time.perf_counter() - t0

    def batches(epoch: int):
        return ds.iter_torch_batches(
            batch_size=args.batch_size,
            local_shuffle_buffer_size=args.shuffle_buffer or None,
            local_shuffle_seed=args.seed + epoch,
            drop_last=True,
        )

    mem = MemSampler()
    mem.start()
    epoch = 0
    t = time.perf_counter()  # as epishard's (measure.py): from before iter()
    it = iter(batches(epoch))

    def next_batch():
        nonlocal it, epoch
        try:
            return next(it)
        except StopIteration:  # an epoch ended inside the run: the next one's start is part of the cost
            epoch += 1
            it = iter(batches(epoch))
            return next(it)

    first = None
    for _ in range(args.warmup):
        try:
            b = next_batch()
        except Exception as exc:  # Ray wraps the read task's error; say which reader failed on what
            raise SystemExit(f"Ray Data read_lerobot could not read {root}: {type(exc).__name__}: {exc}") from exc
        first = first if first is not None else time.perf_counter() - t
        check_window(b, cams, action, args)
        del b  # do not hold a batch through the timed region (as measure.run_child)
    warmup_s = time.perf_counter() - t
    episodes, samples, shapes = [], 0, {}
    t1 = time.perf_counter()
    while len(episodes) < args.min_batches or time.perf_counter() - t1 < args.seconds:
        b = next_batch()
        samples += len(b[action])
        episodes.append([int(e) for e in b["episode_index"].reshape(-1).tolist()])
        if not shapes:
            shapes = {c: [*b[c].shape, str(b[c].dtype).replace("torch.", "")] for c in cams if torch.is_tensor(b[c])}
        del b
    seconds = time.perf_counter() - t1
    mem.stop()
    close = getattr(it, "close", None)  # stop the streaming execution before the cluster goes down
    if close is not None:
        close()
    del it
    # printed before ray.shutdown(): a Ray object collected after it can end the process ("The core
    # worker has already been shutdown ... The process will exit", exit 1) before a later print
    print(
        json.dumps(
            {
                "peer": f"ray-{ray.__version__}",
                "samples": samples,
                "batches": len(episodes),
                "seconds": seconds,
                "samples_per_s": samples / seconds,
                "frames_per_s": samples * args.window * len(cams) / seconds,
                "episode_ids": episodes,
                "dtype": next(iter(shapes.values()))[-1] if shapes else None,
                "shapes": shapes,
                "rss_peak_mb": mem.rss_peak / 1024,
                "pss_peak_mb": mem.pss_peak / 1024,
                "worker_rss_peak_mb": mem.worker_rss_peak / 1024,
                "warmup_s": warmup_s,
                "time_to_first_batch_s": first,
                "build_s": build_s,
                "ray_init_s": init_s,
                "epochs_crossed": epoch,
                "shuffle_buffer_rows": args.shuffle_buffer,
                "read_granularity": "episode",
                "num_frames": meta.total_frames,
                "object_store_mb": store_mb,
            }
        ),
        flush=True,
    )
    ray.shutdown()
    os._exit(0)  # the record is out and the cluster is down: no interpreter teardown touching Ray after it


if __name__ == "__main__":
    main()
