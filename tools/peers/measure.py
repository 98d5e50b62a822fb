"""One measurement: build a system's loader, warm it up, time it; one record (run in its own process)."""

from __future__ import annotations

import math
import time

from .config import COUNTERS, FRAMES, HORIZON, SPAN, STAGES, SYSTEMS
from .memory import MemSampler
from .pipelines import NaiveWindows, TarWindows, TimedCollate, float_collate, timed_collate


def _latest(rows):
    """Per worker, the telemetry vector with the most samples (counters are cumulative per epoch)."""
    import numpy as np

    from epishard.stream.telemetry import FIELDS

    i = FIELDS.index("samples")
    out: dict[int, np.ndarray] = {}
    for row in rows:
        w = int(row[0])
        if w not in out or row[i] >= out[w][i]:
            out[w] = row
    return out


def _telemetry_delta(before: list, after: list) -> dict:
    """Telemetry totals of ``after`` minus ``before`` (both lists of per-sample vectors of one epoch)."""
    import numpy as np

    from epishard.stream.telemetry import FIELDS

    a, b = _latest(after), _latest(before)
    total = np.zeros(len(FIELDS))
    for w, row in a.items():
        total += row - b.get(w, np.zeros(len(FIELDS)))
    return dict(zip(FIELDS, total.tolist(), strict=False))


def run_child(cfg: dict, pss_extra: tuple[int, ...] = ()) -> dict:
    """Build the loader of ``cfg["system"]`` and time it; returns one record."""
    import numpy as np
    import torch

    system = SYSTEMS[cfg["system"]]
    root, bs, workers, seed = cfg["root"], cfg["batch_size"], cfg["workers"], cfg["seed"]
    dtype = (
        torch.float32
        if system.dtype == "float32" and not (system.float_in_collate or system.float_in_main)
        else torch.uint8
    )
    t0 = time.perf_counter()
    epoch_timed, extra = False, {}
    if system.kind == "epishard":
        from epishard.stream import PostProcess, WindowDataset, WindowLoader, WindowSpec, World, segment
        from epishard.stream.source import DatasetSource

        src = DatasetSource(root)
        episodes = src.index.num_episodes
        want = cfg["batches"] * bs
        copies, per_episode = 1, None
        if system.reuse == "epoch":
            per_episode = max(1, math.ceil(want / episodes))
        elif system.reuse == "pe4":
            per_episode, copies = 4, max(1, math.ceil(want / (4 * episodes)))
        spec = WindowSpec(
            cameras={c: segment(0, SPAN - 1, FRAMES) for c in src.cameras},
            state_offsets=(0,),
            action_horizon=HORIZON,
            boundary="pad",
            per_episode_count=per_episode,
        )
        sources = [src] if copies == 1 else [DatasetSource(root) for _ in range(copies)]
        ds = WindowDataset(sources, spec, seed=seed, postprocess=PostProcess(dtype=dtype), telemetry=True)
        if system.float_in_collate:
            loader = WindowLoader(
                ds, batch_size=bs, num_workers=workers, persistent_workers=True, collate_fn=float_collate
            )
        else:  # the reader's own collate (FloatCollate for float32 output), timed
            loader = WindowLoader(ds, batch_size=bs, num_workers=workers, persistent_workers=True)
            loader.collate_fn = TimedCollate(loader.collate_fn)
        epoch_timed = system.reuse in ("epoch", "pe4")
        if epoch_timed:
            # Warm up on the tail of epoch 0 (exact resume: only its last `warmup` batches are left), so
            # that nothing is in flight when the timed epoch 1 starts.
            per_worker = len(ds.plan(0, World(0, 1, 0, workers)))
            total = workers * math.ceil(per_worker / bs)
            loader.load_state_dict(ds.state_dict(max(total - cfg["warmup"], 0), bs, workers, epoch=0))
        extra = {"per_episode": per_episode, "dataset_copies": copies, "windows_per_epoch": len(loader.dataset)}
    elif system.kind == "webdataset":
        import webdataset as wds

        from epishard.stream.source import DatasetSource

        src = DatasetSource(root)
        urls = [src.shard_path(i) for i in range(len(src.shards))]
        pipeline = (
            wds.WebDataset(urls, resampled=True, shardshuffle=False, seed=seed)
            .shuffle(32, initial=32)
            .map(TarWindows(root, system.dtype, seed))
        )
        loader = torch.utils.data.DataLoader(
            pipeline, batch_size=bs, num_workers=workers, persistent_workers=True, collate_fn=timed_collate
        )
        extra = {"shuffle_buffer_episodes": 32}
    elif system.kind == "naive":
        ds = NaiveWindows(root, system.dtype)
        loader = torch.utils.data.DataLoader(
            ds,
            batch_size=bs,
            num_workers=workers,
            shuffle=True,
            persistent_workers=True,
            generator=torch.Generator().manual_seed(seed),
            collate_fn=timed_collate,
        )
    else:
        raise ValueError(system.kind)
    build_s = time.perf_counter() - t0

    mem = MemSampler(pss_extra=pss_extra)
    mem.start()
    cams = None
    start = time.perf_counter()
    it = iter(loader)
    warm_tel, first, warm_batches = [], None, 0
    while epoch_timed or warm_batches < cfg["warmup"]:
        try:
            b = next(it)
        except StopIteration:
            break
        first = first if first is not None else time.perf_counter() - start
        warm_batches += 1
        if "__telemetry__" in b:
            warm_tel += list(b["__telemetry__"].numpy())
        del b  # do not hold a batch (up to 265 MB in float32) through the timed region
    warmup_s = time.perf_counter() - start
    if epoch_timed:  # epoch 0 is finished: time the whole of epoch 1, from its first request
        it = iter(loader)
    tel, counters, collate_s, distinct, samples, batches = [], np.zeros(len(COUNTERS)), 0.0, [], 0, 0
    ring, main_s = {}, 0.0
    t1 = time.perf_counter()
    epoch_first = None
    while epoch_timed or batches < cfg["batches"]:
        try:
            b = next(it)
        except StopIteration:
            break
        if system.float_in_main:
            t = time.perf_counter()
            for k, v in list(b.items()):
                if torch.is_tensor(v) and v.dtype == torch.uint8 and v.dim() == 5:
                    bufs = ring.setdefault(k, [torch.empty(v.shape, dtype=torch.float32) for _ in range(2)])
                    out = bufs[batches % 2][: v.shape[0]]
                    b[k] = out.copy_(v).div_(255.0)
            main_s += time.perf_counter() - t
        epoch_first = epoch_first if epoch_first is not None else time.perf_counter() - t1
        batches += 1
        n = len(b["episode_index"])
        samples += n
        collate_s += float(b["__collate_s__"])
        if "__telemetry__" in b:
            tel += list(b["__telemetry__"].numpy())
            distinct.append(len(set(zip(b["dataset"].tolist(), b["episode_index"].tolist(), strict=False))))
        else:
            counters += b["__counters__"].numpy().sum(0)
            distinct.append(len(set(b["episode_index"].tolist())))
        if cams is None:
            cams = sorted(k for k, v in b.items() if torch.is_tensor(v) and v.dim() == 5)
            shapes = {k: [*list(b[k].shape), str(b[k].dtype).replace("torch.", "")] for k in cams}
    seconds = time.perf_counter() - t1
    mem.stop()
    del it, loader

    if tel:
        t = _telemetry_delta([] if epoch_timed else warm_tel, tel)
        stages = {k: t[k] for k in STAGES[:-1]}
        # Counts over everything the epoch has done so far (for "all": the loads of the warm-up too,
        # which the timed batches use), per sample yielded.
        w = _telemetry_delta([], tel)
        frames_decoded, frames_returned, bytes_read, opens = (
            w["frames_decoded"],
            w["frames_returned"],
            w["bytes_read"],
            w["decoder_opens"],
        )
        samples_all, post_frames = w["samples"], t["frames_unique"] / max(t["samples"], 1)
    else:
        c = dict(zip(COUNTERS, counters.tolist(), strict=False))
        stages = {k: c[k] for k in STAGES[:-1]}
        frames_decoded, frames_returned, bytes_read, opens = (
            c["frames_decoded"],
            c["frames_returned"],
            c["bytes_read"],
            c["decoder_opens"],
        )
        samples_all, post_frames = samples, c["frames_unique"] / max(samples, 1)
    stages["collate_s"] = collate_s
    return {
        "system": system.id,
        "label": system.label,
        "kind": system.kind,
        "dtype": system.dtype,
        "reuse": system.reuse,
        "root": root,
        "samples": samples,
        "batches": batches,
        "seconds": seconds,
        "samples_per_s": samples / seconds,
        "frames_per_s": samples * frames_returned / max(samples_all, 1) / seconds,
        "frames_decoded_per_returned": frames_decoded / max(frames_returned, 1),
        "time_to_first_batch_s": epoch_first if epoch_timed else first,
        "warmup_s": warmup_s,
        "warmup_batches": warm_batches,
        "timed": "one epoch" if epoch_timed else f"{cfg['batches']} batches",
        "build_s": build_s,
        "rss_peak_mb": mem.rss_peak / 1024,
        "pss_peak_mb": mem.pss_peak / 1024,
        "bytes_read_per_sample": bytes_read / max(samples_all, 1),
        "decoder_opens_per_sample": opens / max(samples_all, 1),
        "worker_stage_s": stages,
        "frames_postprocessed_per_sample": post_frames,
        "distinct_episodes_per_batch": float(np.mean(distinct)) if distinct else 0.0,
        "shapes": shapes if cams else {},
        "main_convert_s_per_sample": main_s / max(samples, 1) if system.float_in_main else None,
        **extra,
    }
