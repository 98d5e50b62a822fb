"""One measurement: build a system's loader, warm it up, time at least ``seconds``; one record (own process)."""

from __future__ import annotations

import dataclasses
import time

from epishard.stream.options import ReadOptions

from .config import COUNTERS, FRAMES, HORIZON, SPAN, STAGES, SYSTEMS
from .memory import MemSampler
from .pipelines import NaiveWindows, TarWindows, TimedCollate, timed_collate


def _latest(rows) -> dict:
    """Per worker, the telemetry vector with the most samples (counters are cumulative per epoch)."""
    from epishard.stream.telemetry import FIELDS

    i = FIELDS.index("samples")
    out: dict = {}
    for row in rows:
        w = int(row[0])
        if w not in out or row[i] >= out[w][i]:
            out[w] = row
    return out


def _telemetry(by_epoch: dict, warm_by_epoch: dict) -> tuple[dict, dict]:
    """Telemetry totals (over each epoch's rows, summed over epochs): of the timed region (minus
    what each epoch's warm-up batches had counted) and of everything since the first batch."""
    import numpy as np

    from epishard.stream.telemetry import FIELDS

    timed, total = np.zeros(len(FIELDS)), np.zeros(len(FIELDS))
    for epoch in set(by_epoch) | set(warm_by_epoch):
        a, b = _latest(by_epoch.get(epoch, [])), _latest(warm_by_epoch.get(epoch, []))
        for w in set(a) | set(b):
            last = a.get(w, b.get(w))
            timed += last - b.get(w, np.zeros(len(FIELDS)))
            total += last
    return dict(zip(FIELDS, timed.tolist(), strict=True)), dict(zip(FIELDS, total.tolist(), strict=True))


def epishard_dataset(cfg: dict, system):
    """The ``WindowDataset`` of an epishard system with ``cfg["options"]`` applied (already split into
    WindowDataset keywords and WindowSpec fields by the parent's feature detection)."""
    import torch

    from epishard.stream import PostProcess, WindowDataset, WindowSpec, segment
    from epishard.stream.source import DatasetSource

    src = DatasetSource(cfg["root"], storage_options=cfg.get("storage_options"))
    opts = cfg.get("options") or {}
    spec = WindowSpec(
        cameras={c: segment(0, SPAN - 1, FRAMES) for c in src.cameras},
        state_offsets=(0,),
        action_horizon=HORIZON,
        boundary="pad",
        per_episode_count=system.windows_per_episode,
        **opts.get("spec", {}),
    )
    dtype = torch.float32 if system.dtype == "float32" else torch.uint8
    dataset_opts = dict(opts.get("dataset", {}))
    if system.shuffle is not None:
        dataset_opts.setdefault("shuffle", None if system.shuffle == "all" else system.shuffle)
    read = ReadOptions(telemetry=True)
    if not system.packets:
        from epishard.stream.fetch import FetchPolicy

        read = ReadOptions(telemetry=True, fetch=FetchPolicy(packets=False))
    if system.presigned:
        from epishard.stream.fetch import FetchPolicy

        signed = dataclasses.replace(read.fetch or FetchPolicy(), s3_transport="presigned")
        read = dataclasses.replace(read, fetch=signed)
    if system.frame_cache_mb:
        from epishard.stream.lookahead import Lookahead

        read = dataclasses.replace(read, lookahead=Lookahead(frame_cache_bytes=system.frame_cache_mb << 20))
    return WindowDataset(src, spec, seed=cfg["seed"], postprocess=PostProcess(dtype=dtype), read=read, **dataset_opts)


def run_child(cfg: dict, pss_extra: tuple[int, ...] = ()) -> dict:
    """Build the loader of ``cfg["system"]`` and time it; returns one record."""
    import numpy as np
    import torch

    from epishard.stream import diversity

    system = SYSTEMS[cfg["system"]]
    root, bs, workers, seed = cfg["root"], cfg["batch_size"], cfg["workers"], cfg["seed"]
    t0 = time.perf_counter()
    extra: dict = {}
    if system.kind == "epishard":
        from epishard.stream import WindowLoader
        from epishard.stream.report import iid_reference

        ds = epishard_dataset(cfg, system)
        if system.ray:  # Ray actors make the batches (a local cluster of ``workers`` CPUs, as Ray Data's)
            import logging

            import ray

            from epishard.stream.ray_loader import RayWindowLoader

            ray.init(num_cpus=max(workers, 1), logging_level=logging.WARNING, configure_logging=False)
            loader = RayWindowLoader(ds, batch_size=bs, num_workers=max(workers, 1))
        else:
            reuse = {"reuse_buffers": system.reuse_buffers} if system.reuse_buffers else {}
            if not system.recycle:
                reuse["recycle_buffers"] = False
            loader = WindowLoader(ds, batch_size=bs, num_workers=workers, persistent_workers=workers > 0, **reuse)
            loader.collate_fn = TimedCollate(loader.collate_fn)
        reference = iid_reference(loader.dataset, bs)
        extra = {"windows_per_epoch": len(loader.dataset), "options": cfg.get("options")}
    elif system.kind in ("webdataset", "naive"):
        from epishard.stream.source import DatasetSource

        src = DatasetSource(root)
        rows = src.index.num_rows
        if system.kind == "webdataset":
            import webdataset as wds

            urls = [src.shard_path(i) for i in range(len(src.shards))]
            pipeline = (
                wds.WebDataset(urls, resampled=True, shardshuffle=False, seed=seed)
                .shuffle(32, initial=32)
                .map(TarWindows(root, system.dtype, seed))
            )
            loader = torch.utils.data.DataLoader(
                pipeline, batch_size=bs, num_workers=workers, persistent_workers=workers > 0, collate_fn=timed_collate
            )
            # one window of each episode it meets, episodes drawn from shards uniformly
            reference = diversity.iid(np.ones(len(rows)), bs)
            extra = {"shuffle_buffer_episodes": 32}
        else:
            loader = torch.utils.data.DataLoader(
                NaiveWindows(root, system.dtype),
                batch_size=bs,
                num_workers=workers,
                shuffle=True,
                persistent_workers=workers > 0,
                generator=torch.Generator().manual_seed(seed),
                collate_fn=timed_collate,
            )
            reference = diversity.iid(rows, bs)  # every anchor of every episode
    else:
        raise ValueError(system.kind)
    build_s = time.perf_counter() - t0

    mem = MemSampler(pss_extra=pss_extra)
    mem.start()
    epoch = 0
    start = time.perf_counter()
    it = iter(loader)

    def draw():
        nonlocal it, epoch
        try:
            return next(it)
        except StopIteration:  # an epoch ended inside the run: the next one's start is part of the cost
            epoch += 1
            it = iter(loader)
            return next(it)

    warm: dict = {}
    first = None
    for _ in range(cfg["warmup"]):
        b = draw()
        first = first if first is not None else time.perf_counter() - start
        if "__telemetry__" in b:
            warm.setdefault(epoch, []).extend(b["__telemetry__"].numpy())
        del b  # do not hold a batch (up to 265 MB in float32) through the timed region
    warmup_s = time.perf_counter() - start
    tel: dict = {}
    counters, collate_s, ids, samples, shapes = np.zeros(len(COUNTERS)), 0.0, [], 0, {}
    t1 = time.perf_counter()
    while len(ids) < cfg["min_batches"] or time.perf_counter() - t1 < cfg["seconds"]:
        b = draw()
        n = len(b["episode_index"])
        samples += n
        collate_s += float(b.get("__collate_s__", 0.0))  # Ray actors' collation is not timed here
        if "__telemetry__" in b:
            tel.setdefault(epoch, []).extend(b["__telemetry__"].numpy())
            ids.append(list(zip(b["dataset"].tolist(), b["episode_index"].tolist(), strict=True)))
        else:
            counters += b["__counters__"].numpy().sum(0)
            ids.append(b["episode_index"].tolist())
        if not shapes:
            shapes = {
                k: [*v.shape, str(v.dtype).replace("torch.", "")]
                for k, v in b.items()
                if torch.is_tensor(v) and v.dim() == 5
            }
        del b
    seconds = time.perf_counter() - t1
    mem.stop()
    epochs = epoch
    del it

    if tel:
        t, w = _telemetry(tel, warm)
        stages = {k: t[k] for k in STAGES[:-1]}
        # decode counts over everything done since the first batch: frames loaded in the warm-up
        # serve timed windows too
        decoded, returned, bytes_read, opens = (
            w[k] for k in ("frames_decoded", "frames_returned", "bytes_read", "decoder_opens")
        )
        per, post = max(w["samples"], 1), t["frames_unique"] / max(t["samples"], 1)
        extra["bytes_needed_per_sample"] = w.get("bytes_needed", 0.0) / per
    else:
        c = dict(zip(COUNTERS, counters.tolist(), strict=True))
        stages = {k: c[k] for k in STAGES[:-1]}
        decoded, returned, bytes_read, opens = (
            c[k] for k in ("frames_decoded", "frames_returned", "bytes_read", "decoder_opens")
        )
        per, post = max(samples, 1), c["frames_unique"] / max(samples, 1)
    stages["collate_s"] = collate_s
    dtype = next(iter(shapes.values()))[-1] if shapes else None
    return {
        "system": system.id,
        "label": system.label,
        "kind": system.kind,
        "dtype": dtype,
        "policy": system.policy,
        "root": root,
        "samples": samples,
        "batches": len(ids),
        "seconds": seconds,
        "samples_per_s": samples / seconds,
        "frames_decoded_per_returned": decoded / max(returned, 1),
        "time_to_first_batch_s": first,
        "warmup_s": warmup_s,
        "build_s": build_s,
        "epochs_crossed": epochs,
        "rss_peak_mb": mem.rss_peak / 1024,
        "pss_peak_mb": mem.pss_peak / 1024,
        "worker_rss_peak_mb": mem.worker_rss_peak / 1024,
        "bytes_read_per_sample": bytes_read / per,
        "decoder_opens_per_sample": opens / per,
        "worker_stage_s": stages,
        "frames_postprocessed_per_sample": post,
        **diversity.summary(diversity.measured(ids), reference),
        "shapes": shapes,
        **extra,
    }
