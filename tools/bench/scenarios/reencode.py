"""Benchmark: ``convert --reencode`` to the model's input size and a short GOP, against native video.

Fidelity: every frame of every episode of ``SRC`` (a LeRobot dataset), decoded from the source and
resized exactly as the writer resizes before it encodes (``shardwriter.video.resize``: bilinear,
antialiased), against the same frame decoded from the re-encoded conversion: PSNR (dB, over all
pixels of all frames, RGB) and SSIM (mean over frames of the luma SSIM, 11x11 Gaussian window,
sigma 1.5, Wang et al. 2004's constants).

Speed: the reader on the re-encoded conversion (frames already at the model's size) against the
reader on the native conversion resizing to the same size (``PostProcess(size=...)``), both with
the ``stages`` scenario's window and figures, in one process, alternating.

    python tools/bench/run.py reencode /tmp/epishard_bench_peers/unitree_g1_bottle_av1_v30_x50 \\
        --fidelity-source ../shared/data/unitree_g1_bottle_av1_v30 --spec codec=libx264,gop=2,size=224x224,crf=20
"""

from __future__ import annotations

import time
from pathlib import Path

import measure


def ssim_luma(a, b) -> float:
    """Mean SSIM of two uint8 RGB frames ``[H, W, 3]`` on BT.601 luma (11x11 Gaussian, sigma 1.5)."""
    import torch

    weights = torch.tensor([0.299, 0.587, 0.114], dtype=torch.float64)
    x = (torch.from_numpy(a).double() @ weights)[None, None]
    y = (torch.from_numpy(b).double() @ weights)[None, None]
    g = torch.exp(-((torch.arange(11, dtype=torch.float64) - 5) ** 2) / (2 * 1.5**2))
    g = (g / g.sum())[:, None] @ (g / g.sum())[None, :]
    win = g[None, None]

    def blur(t):
        return torch.nn.functional.conv2d(t, win)

    mx, my = blur(x), blur(y)
    sxx, syy, sxy = blur(x * x) - mx**2, blur(y * y) - my**2, blur(x * y) - mx * my
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    s = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx**2 + my**2 + c1) * (sxx + syy + c2))
    return float(s.mean())


def fidelity(source: str, converted: str, size: tuple[int, int]) -> dict:
    """PSNR and SSIM of every stored frame of ``converted`` against ``source``'s frames resized to ``size``."""
    import numpy as np

    from epishard.format.decoder import open_decoder
    from epishard.shardwriter import WindowIndex
    from epishard.shardwriter.lerobot import read_lerobot
    from epishard.shardwriter.video import probe, resize
    from epishard.stream.source import DatasetSource

    src = read_lerobot(source)
    index = WindowIndex.load_dataset(converted)
    shards = DatasetSource(converted)
    se, n, ssims = 0.0, 0, []
    for ep in src.episodes:
        hits = np.flatnonzero(index.episode_index == ep.episode_index)
        if not hits.size:
            continue
        e = int(hits[0])
        for cam, video in ep.videos.items():
            s = index.camera_streams(cam, np.array([e]))[0]
            rows = np.arange(int(index.num_rows[e]))
            info = probe(str(video.source))
            t0 = video.segment[0] if video.segment else 0.0
            base = int(np.searchsorted(info.seconds(np.arange(info.num_frames)), t0 - 0.5 / ep.fps))
            ref = open_decoder(str(video.source), info.pts, info.duration, info.keyflags(), info.stream_index)
            want = (base + rows).tolist()
            original = resize(ref.get_frames_at(want).data.permute(0, 2, 3, 1).numpy(), size)
            start = int(index.cam_offset[s])
            data = shards.read_range(int(index.shard[e]), start, start + int(index.cam_size[s]))
            pts, dur, keys = index.frame_tables(s)
            stored = open_decoder(data, pts, dur, keys, int(index.cam_stream_index[s]))
            frames = index.frames(s, rows).tolist()
            got = stored.get_frames_at(frames).data.permute(0, 2, 3, 1).numpy()
            diff = original.astype(np.float64) - got.astype(np.float64)
            se += float((diff**2).sum())
            n += diff.size
            ssims += [ssim_luma(a, b) for a, b in zip(original, got, strict=True)]
    mse = se / max(n, 1)
    return {"psnr_db": 10 * np.log10(255**2 / mse) if mse else float("inf"), "ssim": float(np.mean(ssims))}


SMOKE = {"batches": 2, "rounds": 1, "workers": 1, "spec": "codec=libx264,gop=2,size=24x24,crf=20"}


def options(p) -> None:
    p.add_argument("src", nargs="?", help="a LeRobot dataset to convert twice (native and re-encoded)")
    p.add_argument("--fidelity-source", help="the dataset whose frames fidelity is measured on (default: src)")
    p.add_argument("--spec", default="codec=libx264,gop=2,size=224x224,crf=20", help="--reencode value")
    p.add_argument("--work", default="/tmp/epishard_bench_reencode", help="conversions, kept for a rerun")
    p.add_argument("--workers", type=int, default=2, help="conversion workers")
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--rounds", type=int, default=2)


def run(args) -> int:
    if args.src is None:
        if not args.smoke:
            raise measure.Missing("give a LeRobot dataset (SRC)")
        args.src, args.work = str(measure.smoke_source()), str(measure.SMOKE_DIR / "reencode")
    import torch

    from epishard.shardwriter import ConvertOptions, convert
    from epishard.shardwriter.video import ReencodeSpec
    from scenarios.stages import one_pass

    torch.set_num_threads(1)
    spec = ReencodeSpec.parse(args.spec)
    work = Path(args.work)
    native, coded = work / "native", work / "reencoded"
    t = time.perf_counter()
    convert([args.src], str(native), ConvertOptions(workers=args.workers, progress=False))
    native_s = time.perf_counter() - t
    t = time.perf_counter()
    convert([args.src], str(coded), ConvertOptions(workers=args.workers, progress=False, reencode=spec))
    coded_s = time.perf_counter() - t
    measure.say(f"converted: native {native_s:.1f} s, re-encoded ({spec.describe()}) {coded_s:.1f} s (0 s when reused)")
    fid_src = args.fidelity_source or args.src
    fid_out = work / "fidelity"
    convert([fid_src], str(fid_out), ConvertOptions(workers=args.workers, progress=False, reencode=spec))
    fid = fidelity(fid_src, str(fid_out), spec.size)
    measure.emit({"fidelity_source": fid_src, "spec": args.spec, **fid})
    if not measure.json_mode():
        print(f"fidelity on {fid_src}: PSNR {fid['psnr_db']:.2f} dB, SSIM {fid['ssim']:.4f}")
    rows = []
    pair = [("native, resized by the reader", native, spec.size), ("re-encoded", coded, None)]
    for r, (label, root, size) in measure.alternate(pair, args.rounds, mirror=True):
        res = one_pass(str(root), True, args.batches, 4, "uint8", r, size=size)
        res["path"] = label
        measure.emit(res)
        rows.append(
            (
                label,
                f"{res['samples_per_s']:.1f}",
                f"{res['decode_ms']:.2f}",
                f"{res['postprocess_ms']:.2f}",
                f"{res['bytes_read_per_sample'] / 1e3:.0f}",
            )
        )
    measure.table(("conversion", "samples/s", "decode ms", "post ms", "kB read/sample"), rows)
    return 0
