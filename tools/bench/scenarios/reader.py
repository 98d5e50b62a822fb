"""Benchmark: the streaming window reader (``stream/``) against naive baselines, in one run.

Every timed comparison alternates its sides round by round (A B A B ...) on the same inputs and
reports medians and the ratio of the medians; machines are noisy, so only ratios from one run count.
Everything runs in this one process with torch at 1 intra-op thread (``--threads``), as in a
DataLoader worker; rates are given per wall second and per CPU second of this process (user+sys),
the latter less sensitive to other load on a shared machine. Benchmarks 1 and 2 run ``--samples``
samples per round and side (default 96), rounded up to whole epochs of 4 windows per episode.

1. FastWAM-style sample: 3 cameras, a 33-frame span of which 9 frames are used (offsets 0, 4, ...,
   32: ``segment(0, 32, 9)``), frames post-processed to 224x224 uint8, 16-step action chunk,
   4 windows per episode per epoch.
   A  ``WindowDataset(..., postprocess=PostProcess(size=(224, 224)), shuffle=0)`` iterated
      in this process (``num_workers=0``): one byte-range read, one decoder and one
      ``get_frames_at`` per (episode, camera) for all its windows, post-processing of used frames.
   B  naive, over exactly the same (episode, anchor) list (``ds.plan(epoch, 0, 1, 1, 0)``): per
      sample and camera, read the video member from the shard (byte range from
      ``WindowIndex.lookup``), open a fresh torchcodec ``VideoDecoder`` (default exact seek mode,
      which scans the file), decode all 33 frames of the span (``get_frames_in_range``), resize all
      33 with the same torch uint8 antialiased bilinear kernel as ``PostProcess``, keep the 9 used.
   Run on generated 3-camera episodes (``tests/videogen.make_video``: frame-numbered H.264 with
   B-frames, 256x256, 30 fps, keyframe every 30 frames, 300 frames, 6 episodes; one video per
   episode shared by its 3 cameras, encodes cached under /tmp) and on the real
   ``so101_bimanual_cloth`` (2 cameras ``observation.images.cam0`` and ``cam1``, MPEG-4 224x224,
   GOP 12: already 224x224, so neither side resizes). Target (reader / naive): >= 2.1x.
2. Three disjoint segments per camera, past / current / future over 65 frames:
   ``segment(-32, -24, 3) + segment(-2, 2, 5) + segment(24, 32, 3)`` (11 frames), 3 cameras,
   224x224. A the reader (one decoder and one ``get_frames_at`` per (episode, camera) for all
   segments of all its windows); B one fresh decoder per (sample, camera, segment) decoding just
   that segment's frames with ``get_frames_at``, resized alike. Target: >= 1.5x.
3. Per-sample planning and index cost, a handful of episodes vs 27,500: synthetic window indexes
   (``tools/bench/bench_index.py``'s ``write_indexes``: 3 cameras, 300 rows, keyframe every 30, 64
   episodes per shard) opened as a real ``WindowDataset`` (FastWAM spec; reader defaults
   ``shuffle="auto"``); per round ``worker_plan`` (one consumer of
   one) plus, for every planned sample, ``WindowIndex.lookup`` of its 9 rows on each of the 3
   cameras; cost per planned sample. Rows: 1 episode with all its anchors, 8 episodes with 1
   window each, 27,500 episodes with 1 window each (samples per epoch = episodes), and for
   information consumer 0 of 8 ranks x 8 workers at 27,500 (every consumer plans the whole epoch).
   Target: 27,500 x 1 per sample <= 1.2x the 8 x 1 per sample. ``WindowDataset`` construction
   time (index load plus its episode table) is reported once per size.
4. Decoded frames per second per core: the reader's decode path (``epishard.format.decoder.frame_mappings``
   from the index plus ``stream.decode.decode`` of every frame of the video, one ffmpeg thread)
   vs ``ffmpeg -threads 1 -i VIDEO -f rawvideo -pix_fmt rgb24 -y /dev/null`` (a subprocess) on the
   same video members: so101 (MPEG-4 224x224, 10 videos), unitree_g1_bottle_av1 (AV1 640x480, 4
   videos) and the generated H.264 256x256 (one camera of each of the 6 episodes; the
   frame-numbered content is far simpler to decode than camera footage). fps per CPU second
   (user+sys; for ffmpeg from the child's rusage), fps per wall second, and ffmpeg's per-process
   startup (the same command with ``-frames:v 1``, timed in the same rounds) subtracted for a
   second fraction. Reported: reader fps / ffmpeg fps. For attribution only, a third side fetches
   the same frames from the same decoder 32 at a time (no full-video tensor).

Real datasets come from ../shared/data (or ``$EPISHARD_SHARED_DATA``), converted with
``shardwriter.convert`` into a temporary folder at the start; when absent, their rows are skipped
with a line saying so. Before timing, one untimed pass checks that reader and baseline return
identical tensors (and, on generated videos, the frame number drawn in every returned frame). The
reader's own telemetry (frames decoded per sample, decoder opens, stage seconds) is reported from
the timed rounds; the baseline's frames decoded are counted the same way (``WindowIndex.decoded_frames``).

Commands (from the repository root):

    python tools/bench/run.py reader                      # everything, readable tables (~2-3 min on 2 cores,
                                                      # plus ~20 s once to encode the test videos)
    python tools/bench/run.py reader --json               # one JSON line per measurement instead
    python tools/bench/run.py reader --rounds 5 --samples 48
    python tools/bench/run.py reader --only 1 2           # some (1: FastWAM, 2: segments, 3: plan, 4: decode)
    python tools/bench/run.py reader --big-episodes 5000  # smaller planning benchmark
    python tools/bench/run.py reader --threads 2          # torch intra-op threads (default 1)

"""

from __future__ import annotations

import hashlib
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import measure
import numpy as np
import pyarrow.parquet as pq
import torch
from torchcodec.decoders import VideoDecoder

from epishard.format import manifest as fmt
from epishard.format.decoder import frame_mappings
from epishard.format.index import dataset_index_bytes
from epishard.format.manifest import DATASET_INDEX_NAME, MANIFEST_NAME
from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Source, convert
from epishard.stream import PostProcess, WindowDataset, WindowSpec, segment
from epishard.stream.decode import decode
from epishard.stream.options import ReadOptions
from epishard.stream.plan import EpochInputs, PerEpisode, World, worker_plan

SIZE = (224, 224)
CAMS3 = ("observation.images.front", "observation.images.left", "observation.images.wrist")
FASTWAM = segment(0, 32, 9)
SEGMENTS = (segment(-32, -24, 3), segment(-2, 2, 5), segment(24, 32, 3))
PER_EPISODE = 4
ACTION_HORIZON = 16
CACHE = Path(tempfile.gettempdir()) / "epishard_bench_reader_cache"
SYNTH = dict(episodes=6, frames=300, fps=30, size=256, gop=30)
START = 1000  # episode e's frame i shows the number e * START + i

log, emit, med, shared_data = measure.say, measure.emit, measure.median, measure.shared_data


def say(line: str = "") -> None:
    """A line of the readable tables (none under ``--json``)."""
    if not measure.json_mode():
        print(line, flush=True)


# --- data ------------------------------------------------------------------------------------------


def _encode(args: tuple) -> str:
    path, frames, fps, size, gop, start = args
    from videogen import make_video

    tmp = f"{path}.partial-{os.getpid()}"
    make_video(tmp, frames, codec="h264", fps=fps, height=size, width=size, gop=gop, bframes=True, start_number=start)
    os.replace(tmp, path)
    return path


def synth_videos(episodes: int, frames: int, fps: int, size: int, gop: int) -> list[str]:
    """Frame-numbered H.264 videos (cached: x264 runs without asm in videogen, ~6 s each)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    jobs = [
        (
            str(CACHE / f"h264_{size}px_{frames}f_{fps}fps_gop{gop}_start{e * START}.mp4"),
            frames,
            fps,
            size,
            gop,
            e * START,
        )
        for e in range(episodes)
    ]
    todo = [j for j in jobs if not os.path.exists(j[0])]
    if todo:
        log(f"encoding {len(todo)} test videos ({frames} frames {size}x{size}, cached in {CACHE}) ...")
        with ProcessPoolExecutor(max_workers=min(len(todo), os.cpu_count() or 1)) as pool:
            list(pool.map(_encode, todo))
    return [j[0] for j in jobs]


def build_synth(out: str) -> str:
    from videogen import make_episode_table

    videos = synth_videos(**SYNTH)
    eps = [
        Episode(
            source="synth3cam",
            episode_index=e,
            table=make_episode_table(SYNTH["frames"], fps=SYNTH["fps"]),
            videos={c: CameraVideo(path) for c in CAMS3},
            fps=SYNTH["fps"],
            tasks=("pick",),
            robot="synthetic",
        )
        for e, path in enumerate(videos)
    ]
    convert([Source(name="synth3cam", episodes=eps, fps=SYNTH["fps"])], out, ConvertOptions(progress=False))
    return out


def build_real(name: str, out: str) -> str | None:
    src = shared_data() / name
    if not src.exists():
        return None
    log(f"converting {name} ...")
    convert([str(src)], out, ConvertOptions(progress=False))
    return out


# --- timing ----------------------------------------------------------------------------------------


def alternate(rounds: int, sides: dict) -> dict[str, list[dict]]:
    """Run each side once per round, in order, alternating; each side returns a dict of numbers."""
    results: dict[str, list[dict]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            results[name].append(fn())
    return results


# --- benchmarks 1 and 2: reader vs naive samples -----------------------------------------------------


def resize(frames: torch.Tensor, size) -> torch.Tensor:
    """The kernel of ``stream.transform.PostProcess`` (uint8, channels-last, antialiased bilinear),
    copied here so the baseline does not change when the reader's post-processing does."""
    if size is not None and tuple(frames.shape[-2:]) != tuple(size):
        frames = torch.nn.functional.interpolate(
            frames.contiguous(memory_format=torch.channels_last), size=size, mode="bilinear", antialias=True
        )
    return frames.contiguous()


def windows_for(ds: WindowDataset, samples: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Whole epochs 0, 1, ... until at least ``samples`` windows: (epoch, count) pieces and the
    (episode, anchor) list the reader yields for them, in order. Whole epochs, so that every episode
    the reader loads has all its windows yielded (a cut epoch would charge it decoded, unused frames)."""
    pieces, wins, epoch = [], [], 0
    while len(wins) < samples:
        plan = ds.plan(epoch, World())
        if len(plan) == 0:
            raise RuntimeError("the window spec gives no windows on this dataset")
        pieces.append((epoch, len(plan)))
        wins += list(zip(plan.episode.tolist(), plan.anchor.tolist(), strict=False))
        epoch += 1
    return pieces, wins


def reader_pass(ds: WindowDataset, pieces, keep: bool = False) -> tuple[dict, list]:
    """Iterate the reader over ``pieces``; returns times (wall, CPU) plus its telemetry totals."""
    kept, tele = [], []
    t, cpu = time.perf_counter(), time.process_time()
    for epoch, take in pieces:
        ds.set_epoch(epoch)
        it = iter(ds)
        for _ in range(take):
            sample = next(it)
            if ds.telemetry:
                tele.append(sample.pop("__telemetry__"))
            if keep:
                kept.append(sample)
        it.close()
    out = {"s": time.perf_counter() - t, "cpu": time.process_time() - cpu}
    if tele:
        out["tele"] = _sum_epochs(tele)
    return out, kept


class Naive:
    """The baselines: per sample and camera, a fresh file read and a fresh decoder (no index frame
    tables: torchcodec's default exact mode scans the file on open)."""

    def __init__(self, ds: WindowDataset, cam_offsets: dict[str, tuple[int, ...]], mode: str):
        self.source = ds.sources[0]
        self.index = self.source.index
        self.cams = {c: np.asarray(o, dtype=np.int64) for c, o in cam_offsets.items()}
        self.mode = mode  # "span": decode the whole span then subsample; "segments": one decoder per segment
        self.frames_decoded = 0
        self.decoder_opens = 0

    def _read(self, shard: int, offset: int, size: int) -> bytes:
        with open(self.source.shard_path(shard), "rb") as f:
            f.seek(offset)
            return f.read(size)

    def sample(self, episode: int, anchor: int) -> dict[str, torch.Tensor]:
        ix, out = self.index, {}
        names = ix.camera_names(episode)
        for cam, offsets in self.cams.items():
            c = names.index(cam)
            s = ix.stream(episode, c)
            if self.mode == "span":
                lo, hi = int(offsets.min()), int(offsets.max())
                look = ix.lookup(episode, anchor + np.arange(lo, hi + 1), c)
                data = self._read(look.shard, look.offset, look.size)
                decoder = VideoDecoder(data, dimension_order="NCHW", num_ffmpeg_threads=1)
                f = look.frames
                if np.array_equal(f, np.arange(f[0], f[0] + f.size)):
                    batch = decoder.get_frames_in_range(int(f[0]), int(f[-1]) + 1).data
                else:
                    batch = decoder.get_frames_at(f.tolist()).data
                self.decoder_opens += 1
                self.frames_decoded += int(ix.decoded_frames(s, np.unique(f)))
                out[cam] = resize(batch, SIZE)[torch.from_numpy(offsets - lo)]
            else:
                look = ix.lookup(episode, anchor + offsets, c)
                data = self._read(look.shard, look.offset, look.size)
                parts, pos = [], 0
                for seg in SEGMENTS:
                    f = look.frames[pos : pos + len(seg)]
                    pos += len(seg)
                    decoder = VideoDecoder(data, dimension_order="NCHW", num_ffmpeg_threads=1)
                    parts.append(resize(decoder.get_frames_at(f.tolist()).data, SIZE))
                    self.decoder_opens += 1
                    self.frames_decoded += int(ix.decoded_frames(s, np.unique(f)))
                out[cam] = torch.cat(parts)
        return out

    def run(self, wins, keep: bool = False) -> tuple[dict, list]:
        kept = []
        t, cpu = time.perf_counter(), time.process_time()
        for e, a in wins:
            s = self.sample(e, a)
            if keep:
                kept.append(s)
        return {"s": time.perf_counter() - t, "cpu": time.process_time() - cpu}, kept


def check(reader_samples, naive_samples, wins, cams, synthetic: bool, ds: WindowDataset) -> str:
    """Reader and baseline return identical frames; generated videos show the expected numbers."""
    from videogen import decode_frame_number

    ix = ds.sources[0].index
    for r, n, (e, a) in zip(reader_samples, naive_samples, wins, strict=False):
        if int(r["episode_index"]) != int(ix.episode_index[e]):
            raise AssertionError(f"reader sample is episode {r['episode_index']}, plan says {e}")
        for cam, offsets in cams.items():
            if r[cam].shape != n[cam].shape or not torch.equal(r[cam], n[cam]):
                diff = (r[cam].int() - n[cam].int()).abs().max().item() if r[cam].shape == n[cam].shape else "shape"
                raise AssertionError(f"episode {e} anchor {a} {cam}: reader and baseline differ (max diff {diff})")
            if synthetic:
                got = [decode_frame_number(fr) for fr in r[cam]]
                want = [e * START + a + int(o) for o in offsets]
                if got != want:
                    raise AssertionError(f"episode {e} anchor {a} {cam}: frames {got}, expected {want}")
    return f"{len(reader_samples)} samples x {len(cams)} cameras identical" + (
        ", frame numbers as expected" if synthetic else ""
    )


def bench_samples(
    name: str,
    bench: str,
    root: str,
    cams: dict[str, tuple[int, ...]],
    mode: str,
    rounds: int,
    samples: int,
    target: float,
    synthetic: bool,
    note: str,
) -> None:
    kw = dict(
        spec=WindowSpec(cameras=cams, action_horizon=ACTION_HORIZON, per_episode_count=PER_EPISODE),
        postprocess=PostProcess(size=SIZE),
        shuffle=0,
    )
    # telemetry=True only attaches the worker's counters (kept anyway) to each sample: ~10 us/sample.
    ds = WindowDataset(root, read=ReadOptions(telemetry=True), **kw)
    pieces, wins = windows_for(ds, samples)
    naive = Naive(ds, cams, mode)
    # Untimed: correctness, warm-up (page cache, decoder libraries).
    _, rs = reader_pass(ds, pieces, keep=True)
    _, ns = naive.run(wins, keep=True)
    verdict = check(rs, ns, wins, cams, synthetic, ds)
    naive_frames, naive_opens = naive.frames_decoded, naive.decoder_opens
    del rs, ns
    res = alternate(
        rounds,
        {
            "reader": lambda: reader_pass(ds, pieces)[0],
            "naive": lambda: naive.run(wins)[0],
        },
    )
    n = len(wins)
    tele = {k: float(np.mean([r["tele"][k] for r in res["reader"]])) for k in res["reader"][0]["tele"]}
    sps = {k: [n / r["s"] for r in v] for k, v in res.items()}
    cps = {k: [n / r["cpu"] for r in v] for k, v in res.items()}
    ratio = med(sps["reader"]) / med(sps["naive"])
    ratio_cpu = med(cps["reader"]) / med(cps["naive"])
    frames_returned = sum(len(o) for o in cams.values())
    rows = {
        "reader": dict(
            frames_decoded_per_sample=tele["frames_decoded"] / n, decoder_opens_per_sample=tele["decoder_opens"] / n
        ),
        "naive": dict(frames_decoded_per_sample=naive_frames / n, decoder_opens_per_sample=naive_opens / n),
    }
    say(f"\n[{bench}] {name} (load average {os.getloadavg()[0]:.1f})")
    say(f"  {note}")
    say(
        f"  {n} samples per round and side ({len(pieces)} epochs, {PER_EPISODE} windows/episode), "
        f"{len(cams)} cameras x "
        f"{frames_returned // len(cams)} frames -> {SIZE[0]}x{SIZE[1]}; check: {verdict}"
    )
    say(
        f"  {'side':<8}{'samples/s':>11}{'ms/sample':>11}{'samples/cpu-s':>15}{'frames decoded/sample':>23}"
        f"{'decoder opens/sample':>22}   rounds (samples/s)"
    )
    for side in ("reader", "naive"):
        m = med(sps[side])
        say(
            f"  {side:<8}{m:>11.1f}{1e3 / m:>11.2f}{med(cps[side]):>15.1f}"
            f"{rows[side]['frames_decoded_per_sample']:>23.1f}"
            f"{rows[side]['decoder_opens_per_sample']:>22.2f}   {', '.join(f'{x:.1f}' for x in sps[side])}"
        )
        emit(
            {
                "bench": bench,
                "dataset": name,
                "side": side,
                "samples": n,
                "rounds": rounds,
                "samples_per_s": m,
                "samples_per_cpu_s": med(cps[side]),
                "rounds_samples_per_s": sps[side],
                **rows[side],
            }
        )
    stages = {k: tele[k] / n * 1e3 for k in ("read_s", "decode_s", "postprocess_s", "assemble_s", "plan_s")}
    say(
        "  reader stages, ms/sample (its telemetry, mean of the timed rounds): "
        + ", ".join(f"{k[:-2]} {v:.2f}" for k, v in stages.items())
    )
    met = ratio >= target
    say(
        f"  ratio reader/naive = {ratio:.2f}x wall (target >= {target}x: {'met' if met else 'NOT met'}); "
        f"{ratio_cpu:.2f}x per CPU second"
    )
    emit(
        {
            "bench": bench,
            "dataset": name,
            "metric": "ratio_reader_over_naive",
            "value": ratio,
            "target_min": target,
            "met": met,
            "value_cpu": ratio_cpu,
            "reader_stage_ms_per_sample": stages,
        }
    )


def _sum_epochs(vectors: list[torch.Tensor]) -> dict:
    """Telemetry totals over several epochs run one after another in this process (one ``Telemetry``
    per epoch, cumulative: add up each epoch's last vector)."""
    from epishard.stream.telemetry import FIELDS

    i_samples = FIELDS.index("samples")
    total = dict.fromkeys(FIELDS[1:], 0.0)
    for k, v in enumerate(vectors):
        if k + 1 == len(vectors) or vectors[k + 1][i_samples] <= v[i_samples]:
            for i, name in enumerate(FIELDS[1:], start=1):
                total[name] += float(v[i])
    return total


# --- benchmark 3: planning + index per sample --------------------------------------------------------


def synth_index_dataset(folder: str, episodes: int) -> str:
    from scenarios.index import CAMERAS, write_indexes

    paths = write_indexes(folder, episodes)
    index_arrow = dataset_index_bytes([Path(p).read_bytes() for p in paths])
    with open(os.path.join(folder, DATASET_INDEX_NAME), "wb") as f:
        f.write(index_arrow)
    no_digest = "0" * 64  # no tar is read: planning and index only
    counts = [pq.read_metadata(p).num_rows for p in paths]
    manifest = fmt.Manifest(
        format=fmt.FORMAT_NAME,
        format_version=fmt.FORMAT_VERSION,
        index=fmt.IndexFile(DATASET_INDEX_NAME, hashlib.sha256(index_arrow).hexdigest()),
        shards=tuple(
            fmt.ShardEntry(f"bench-{i:06d}.tar", os.path.basename(p), n, 0, 0, 1 << 40, no_digest, no_digest)
            for i, (p, n) in enumerate(zip(paths, counts, strict=True))
        ),
        cameras={c: fmt.CameraEntry("h264", 224, 224, 30.0, episodes) for c in CAMERAS},
        stats={},
        totals=fmt.Totals(len(paths), episodes, 0, 0, 0, 0),
        tasks=(),
        sources=(),
        report=fmt.Report.of((), ()),
        fps=30.0,
    )
    with open(os.path.join(folder, MANIFEST_NAME), "wb") as f:
        f.write(manifest.dump())
    return folder


def bench_plan(rounds: int, big: int) -> None:
    from scenarios.index import CAMERAS

    spec = WindowSpec(cameras={c: FASTWAM for c in CAMERAS}, action_horizon=ACTION_HORIZON)
    offsets = np.asarray(FASTWAM, dtype=np.int64)
    sizes = sorted({1, 8, big})
    tmp = tempfile.mkdtemp(prefix="epishard_bench_plan_")
    try:
        datasets, init = {}, {}
        for n in sizes:
            log(f"writing a synthetic index of {n} episodes ...")
            os.makedirs(os.path.join(tmp, str(n)))
            folder = synth_index_dataset(os.path.join(tmp, str(n)), n)
            t = time.perf_counter()
            datasets[n] = WindowDataset(folder, spec)
            init[n] = time.perf_counter() - t
        cases = [  # label, episodes, per_episode, world, workers
            ("1 episode, all anchors", 1, None, 1, 1),
            ("8 episodes, 1 window each", 8, PerEpisode(count=1), 1, 1),
            (f"{big:,} episodes, 1 window each", big, PerEpisode(count=1), 1, 1),
            (f"{big:,} episodes, 1 window each, consumer 0 of 8 ranks x 8 workers", big, PerEpisode(count=1), 8, 8),
        ]

        def once(ds, ix, per, world, workers) -> tuple[float, float, float, float, int]:
            t0, c0 = time.perf_counter(), time.process_time()
            plan = worker_plan(
                EpochInputs(ds.table, 1, per, 0, 0),
                world=World(0, world, 0, workers),
                shuffle_episodes=ds.pool_episodes(),
            )
            t1, c1 = time.perf_counter(), time.process_time()
            for e, a in zip(plan.episode.tolist(), plan.anchor.tolist(), strict=False):
                rows = a + offsets
                for c in range(len(CAMERAS)):
                    ix.lookup(e, rows, c)
            t2, c2 = time.perf_counter(), time.process_time()
            return t1 - t0, t2 - t1, c1 - c0, c2 - c1, len(plan)

        def run(case) -> dict:
            """One round: the case repeated until it has run 50 ms (small cases take under 1 ms)."""
            _, n, per, world, workers = case
            ds = datasets[n]
            total, reps = np.zeros(5), 0
            start = time.perf_counter()
            while reps == 0 or time.perf_counter() - start < 0.05:
                total += once(ds, ds.sources[0].index, per, world, workers)
                reps += 1
            return {
                "plan_s": total[0],
                "lookup_s": total[1],
                "plan_cpu": total[2],
                "lookup_cpu": total[3],
                "samples": int(total[4]),
                "per_epoch": int(total[4]) // reps,
            }

        # The per_episode of each case is passed to worker_plan directly (the spec's is not used).
        res = alternate(rounds, {c[0]: (lambda c=c: run(c)) for c in cases})
        say(
            f"\n[3-plan] planning + index lookups per sample (synthetic indexes, 3 cameras x 300 rows, FastWAM spec, "
            f"shuffle_episodes={datasets[1].pool_episodes()}; {rounds} rounds alternating, medians; load average "
            f"{os.getloadavg()[0]:.1f})"
        )
        say("  per planned sample, microseconds of CPU (wall in the last column but one)")
        say(f"  {'case':<66}{'samples':>8}{'plan':>9}{'lookup':>9}{'total':>9}{'total wall':>12}{'plan ms/epoch':>15}")
        per_sample, per_sample_wall = {}, {}
        for case in cases:
            label, n = case[0], case[1]
            rs = res[label]
            epoch_samples = rs[0]["per_epoch"]
            plan_us = med([r["plan_cpu"] / r["samples"] for r in rs]) * 1e6
            look_us = med([r["lookup_cpu"] / r["samples"] for r in rs]) * 1e6
            total = med([(r["plan_cpu"] + r["lookup_cpu"]) / r["samples"] for r in rs]) * 1e6
            wall = med([(r["plan_s"] + r["lookup_s"]) / r["samples"] for r in rs]) * 1e6
            plan_ms = med([r["plan_cpu"] / r["samples"] for r in rs]) * epoch_samples * 1e3
            per_sample[label], per_sample_wall[label] = total, wall
            say(
                f"  {label:<66}{epoch_samples:>8}{plan_us:>9.2f}{look_us:>9.2f}{total:>9.2f}"
                f"{wall:>12.2f}{plan_ms:>15.1f}"
            )
            emit(
                {
                    "bench": "3-plan",
                    "case": label,
                    "episodes": n,
                    "per_episode": None if case[2] is None else case[2].count,
                    "world_size": case[3],
                    "num_workers": case[4],
                    "samples_per_epoch": epoch_samples,
                    "plan_cpu_us_per_sample": plan_us,
                    "lookup_cpu_us_per_sample": look_us,
                    "total_cpu_us_per_sample": total,
                    "total_wall_us_per_sample": wall,
                    "plan_cpu_ms_per_epoch": plan_ms,
                }
            )
        for n in sizes:
            say(
                f"  WindowDataset construction (index.arrow mmap + episode table), {n:,} episodes: "
                f"{init[n] * 1e3:.1f} ms"
            )
            emit({"bench": "3-plan", "metric": "dataset_init_ms", "episodes": n, "value": init[n] * 1e3})
        big_label, small_label, one_label = cases[2][0], cases[1][0], cases[0][0]
        ratio = per_sample[big_label] / per_sample[small_label]
        ratio_wall = per_sample_wall[big_label] / per_sample_wall[small_label]
        met = ratio <= 1.2
        say(
            f"  ratio per sample {big:,} x 1 / 8 x 1 = {ratio:.2f} CPU (target <= 1.2: {'met' if met else 'NOT met'}); "
            f"{ratio_wall:.2f} wall"
        )
        r1 = per_sample[big_label] / per_sample[one_label]
        say(
            f"  ratio per sample {big:,} x 1 / 1 episode all anchors = {r1:.2f} CPU (informational: the planner's "
            f"per-episode cost)"
        )
        emit(
            {
                "bench": "3-plan",
                "metric": "ratio_big_over_small_per_sample",
                "value": ratio,
                "value_wall": ratio_wall,
                "target_max": 1.2,
                "met": met,
                "big": big_label,
                "small": small_label,
            }
        )
        emit(
            {
                "bench": "3-plan",
                "metric": "ratio_big_over_one_episode_per_sample",
                "value": r1,
                "big": big_label,
                "small": one_label,
            }
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- benchmark 4: decoded frames per second per core --------------------------------------------------


def _videos_of(root: str, folder: str, first_camera_only: bool = False) -> list[dict]:
    """Each camera stream's member bytes, written to ``folder`` for ffmpeg."""
    from epishard.stream import DatasetSource

    src = DatasetSource(root)
    ix = src.index
    out = []
    for e in range(ix.num_episodes):
        for c in range(1 if first_camera_only else int(ix.episode_cams[e + 1] - ix.episode_cams[e])):
            s = ix.stream(e, c)
            with open(src.shard_path(int(ix.shard[e])), "rb") as f:
                f.seek(int(ix.cam_offset[s]))
                data = f.read(int(ix.cam_size[s]))
            path = os.path.join(folder, f"{os.path.basename(root)}_{e}_{c}.mp4")
            with open(path, "wb") as f:
                f.write(data)
            out.append(
                {
                    "data": data,
                    "path": path,
                    "tables": ix.frame_tables(s),
                    "n": int(ix.cam_num_frames[s]),
                    "codec": ix.cam_codec[s].as_py(),
                    "size": f"{int(ix.cam_width[s])}x{int(ix.cam_height[s])}",
                }
            )
    return out


def _ffmpeg(path: str, extra: list[str]) -> tuple[float, float, str]:
    cmd = [
        "ffmpeg",
        "-nostdin",
        "-hide_banner",
        "-threads",
        "1",
        "-i",
        path,
        *extra,
        "-f",
        "rawvideo",
        "-pix_fmt",
        "rgb24",
        "-y",
        "/dev/null",
    ]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr[-500:]}")
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), p.stderr


def bench_decode(rounds: int, sets: list[tuple[str, list[dict]]]) -> None:
    say(
        f"\n[4-decode] decoded frames per second per core: reader decode path vs ffmpeg -threads 1 "
        f"({rounds} rounds alternating, medians; cpu = user+sys seconds; load average {os.getloadavg()[0]:.1f})"
    )
    say(
        f"  {'videos':<44}{'frames':>7}{'reader fps/cpu':>15}{'ffmpeg fps/cpu':>15}{'fraction':>9}"
        f"{'  -startup':>10}{'reader fps/wall':>16}{'ffmpeg fps/wall':>16}{'chunked fps/cpu':>16}{'-startup':>8}"
    )
    for label, videos in sets:
        frames = sum(v["n"] for v in videos)
        # ffmpeg's own frame count (stats line) must match the index: no duplicated or dropped frames.
        counts = []
        for v in videos:
            _, _, err = _ffmpeg(v["path"], [])
            m = re.findall(r"frame=\s*(\d+)", err)
            counts.append(int(m[-1]) if m else -1)
            dd = re.findall(r"(dup|drop)=\s*(\d+)", err)
            if any(int(x) for _, x in dd):
                log(f"warning: ffmpeg reported {dd} for {v['path']}")
        tensors = []

        def reader(videos=videos, tensors=tensors):  # this iteration's videos
            cpu, t = time.process_time(), time.perf_counter()
            for v in videos:
                x = decode(v["data"], np.arange(v["n"]), v["tables"], where=v["path"]).frames
                if len(tensors) < len(videos):
                    tensors.append(int(x.shape[0]))
                del x
            return {"wall": time.perf_counter() - t, "cpu": time.process_time() - cpu}

        def chunked(videos=videos):  # attribution only: the same decoder, frames fetched 32 at a time (small buffers)
            cpu, t = time.process_time(), time.perf_counter()
            for v in videos:
                dec = VideoDecoder(
                    v["data"],
                    custom_frame_mappings=frame_mappings(*v["tables"]),
                    dimension_order="NCHW",
                    num_ffmpeg_threads=1,
                )
                for i in range(0, v["n"], 32):
                    dec.get_frames_at(list(range(i, min(i + 32, v["n"]))))
            return {"wall": time.perf_counter() - t, "cpu": time.process_time() - cpu}

        def ffmpeg(extra=(), videos=videos):
            wall = cpu = 0.0
            for v in videos:
                w, c, _ = _ffmpeg(v["path"], list(extra))
                wall, cpu = wall + w, cpu + c
            return {"wall": wall, "cpu": cpu}

        res = alternate(
            rounds,
            {"reader": reader, "ffmpeg": ffmpeg, "startup": lambda: ffmpeg(["-frames:v", "1"]), "chunked": chunked},
        )
        startup_cpu = med([r["cpu"] for r in res["startup"]])
        startup_wall = med([r["wall"] for r in res["startup"]])
        if tensors != [v["n"] for v in videos] or counts != tensors:
            log(f"warning: frame counts differ: index {[v['n'] for v in videos]}, reader {tensors}, ffmpeg {counts}")
        r_cpu = frames / med([r["cpu"] for r in res["reader"]])
        f_cpu = frames / med([r["cpu"] for r in res["ffmpeg"]])
        r_wall = frames / med([r["wall"] for r in res["reader"]])
        f_wall = frames / med([r["wall"] for r in res["ffmpeg"]])
        # ffmpeg without its per-process startup: median of per-round differences (same round, same load).
        net = med([f["cpu"] - st["cpu"] for f, st in zip(res["ffmpeg"], res["startup"], strict=False)])
        f_cpu_net = frames / net if net > 0 else float("nan")
        c_cpu = frames / med([r["cpu"] for r in res["chunked"]])
        say(
            f"  {label:<44}{frames:>7}{r_cpu:>15.0f}{f_cpu:>15.0f}{r_cpu / f_cpu:>9.2f}{r_cpu / f_cpu_net:>10.2f}"
            f"{r_wall:>16.0f}{f_wall:>16.0f}{c_cpu:>14.0f}{c_cpu / f_cpu_net:>10.2f}"
        )
        emit(
            {
                "bench": "4-decode",
                "videos": label,
                "frames": frames,
                "reader_fps_per_cpu_s": r_cpu,
                "ffmpeg_fps_per_cpu_s": f_cpu,
                "fraction_cpu": r_cpu / f_cpu,
                "ffmpeg_startup_cpu_s_per_video": startup_cpu / len(videos),
                "ffmpeg_fps_per_cpu_s_without_startup": f_cpu_net,
                "fraction_cpu_without_startup": r_cpu / f_cpu_net,
                "reader_fps_per_wall_s": r_wall,
                "ffmpeg_fps_per_wall_s": f_wall,
                "fraction_wall": r_wall / f_wall,
                "ffmpeg_startup_wall_s_per_video": startup_wall / len(videos),
                "chunked_fps_per_cpu_s": c_cpu,
                "fraction_chunked_cpu_without_startup": c_cpu / f_cpu_net,
                "rounds_reader": res["reader"],
                "rounds_ffmpeg": res["ffmpeg"],
                "rounds_ffmpeg_startup": res["startup"],
                "rounds_chunked": res["chunked"],
            }
        )
    say(
        "  fraction = reader fps / ffmpeg fps per CPU second; -startup: ffmpeg's per-process cost "
        "(its run with -frames:v 1) taken out of the ffmpeg side;"
    )
    say(
        "  chunked (attribution only): the reader's decoder fetching 32 frames per call instead of all at once "
        "(no full-video output tensor), fraction vs ffmpeg without startup"
    )


# --- main ------------------------------------------------------------------------------------------


SMOKE = {"only": [3], "big_episodes": 100, "rounds": 1}


def options(parser) -> None:
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per comparison (medians reported)")
    parser.add_argument(
        "--samples",
        type=int,
        default=96,
        help="samples per round and side in benchmarks 1 and 2, rounded up to whole epochs "
        "(an epoch is episodes x 4 windows)",
    )
    parser.add_argument("--big-episodes", type=int, default=27_500, help="episodes of the large planning case")
    parser.add_argument("--only", type=int, nargs="+", choices=[1, 2, 3, 4], default=[1, 2, 3, 4])
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (default 1, what a DataLoader worker runs with)"
    )


def run(args) -> int:
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    say(
        f"reader: torch {torch.__version__} ({torch.get_num_threads()} intra-op threads), "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, rounds={args.rounds}"
    )
    emit(
        {
            "bench": "setup",
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "cpus": os.cpu_count(),
            "rounds": args.rounds,
        }
    )
    tmp = tempfile.mkdtemp(prefix="epishard_bench_reader_")
    try:
        need_synth = bool({1, 2, 4} & set(args.only))
        need_real = bool({1, 4} & set(args.only))
        synth = build_synth(os.path.join(tmp, "synth")) if need_synth else None
        real = {}
        if need_real:
            for name in ("so101_bimanual_cloth", "unitree_g1_bottle_av1"):
                real[name] = build_real(name, os.path.join(tmp, name))
                if real[name] is None:
                    say(f"SKIP: {shared_data() / name} is absent; its rows are skipped")
                    emit({"bench": "setup", "skipped": name, "reason": f"{shared_data() / name} absent"})
        if 1 in args.only:
            bench_samples(
                "generated, 3 cameras",
                "1-fastwam",
                synth,
                {c: FASTWAM for c in CAMS3},
                "span",
                args.rounds,
                args.samples,
                2.1,
                True,
                f"{SYNTH['episodes']} episodes x {SYNTH['frames']} frames, H.264 {SYNTH['size']}x{SYNTH['size']} "
                f"B-frames, GOP {SYNTH['gop']}, {SYNTH['fps']} fps; offsets {FASTWAM}",
            )
            if real.get("so101_bimanual_cloth"):
                cams = {"observation.images.cam0": FASTWAM, "observation.images.cam1": FASTWAM}
                bench_samples(
                    "so101_bimanual_cloth, 2 cameras (cam0, cam1)",
                    "1-fastwam",
                    real["so101_bimanual_cloth"],
                    cams,
                    "span",
                    args.rounds,
                    args.samples,
                    2.1,
                    False,
                    "real: 5 episodes, MPEG-4 224x224 GOP 12, 20 fps (no resize needed on either side)",
                )
        if 2 in args.only:
            offs = sum(SEGMENTS, ())
            bench_samples(
                "generated, 3 cameras, 3 segments",
                "2-segments",
                synth,
                {c: offs for c in CAMS3},
                "segments",
                args.rounds,
                args.samples,
                1.5,
                True,
                f"segments {SEGMENTS} ({len(offs)} frames over 65)",
            )
        if 3 in args.only:
            bench_plan(args.rounds, args.big_episodes)
        if 4 in args.only:
            sets = []
            vid_dir = os.path.join(tmp, "videos")
            os.makedirs(vid_dir)
            if real.get("so101_bimanual_cloth"):
                sets.append(
                    ("so101_bimanual_cloth: 10 x MPEG-4 224x224", _videos_of(real["so101_bimanual_cloth"], vid_dir))
                )
            if real.get("unitree_g1_bottle_av1"):
                sets.append(
                    ("unitree_g1_bottle_av1: 4 x AV1 640x480", _videos_of(real["unitree_g1_bottle_av1"], vid_dir))
                )
            sets.append(
                (
                    f"generated: {SYNTH['episodes']} x H.264 {SYNTH['size']}x{SYNTH['size']} B-frames",
                    _videos_of(synth, vid_dir, first_camera_only=True),
                )
            )
            bench_decode(args.rounds, sets)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"\ntotal {time.perf_counter() - t_start:.0f} s (load average at the end {os.getloadavg()[0]:.1f})")
    return 0
