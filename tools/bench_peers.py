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

SPAN, FRAMES, STEP, HORIZON = 33, 9, 4, 16
PEER_VENV = "/tmp/peer/lerobot-venv"
PEER_ENV = "/tmp/peer/env.sh"
STAGES = ("read_s", "decode_s", "postprocess_s", "assemble_s", "collate_s")
COUNTERS = (
    "read_s",
    "decode_s",
    "postprocess_s",
    "assemble_s",
    "frames_decoded",
    "frames_returned",
    "bytes_read",
    "decoder_opens",
    "frames_unique",
)
TARGET = 3.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def shared_dir() -> Path:
    return Path(os.environ.get("EPISHARD_SHARED_DATA", REPO.parent / "shared" / "data")).parent


# --- systems ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class System:
    """One loader configuration. ``source``: ``"main"`` (the v3.0 folder, or the folder given) or
    ``"v2"`` (its v2.x original); ``reuse``: epishard's windows per episode per epoch (``"epoch"``,
    ``"pe4"``, ``"all"``; see the module docstring)."""

    id: str
    kind: str
    source: str = "main"
    dtype: str = "float32"
    reuse: str = ""
    float_in_collate: bool = False  # reader yields uint8; the collate writes float32 [0, 1] into the batch
    float_in_main: bool = False  # reader yields uint8; the main process converts into 2 reused buffers

    @property
    def label(self) -> str:
        if self.kind != "epishard":
            return self.kind
        extra = {"epoch": "", "pe4": " pe4", "all": " all"}[self.reuse]
        out = (
            "f32c"
            if self.float_in_collate
            else "f32m"
            if self.float_in_main
            else ("f32" if self.dtype == "float32" else "u8")
        )
        return f"epishard {out}{extra}" + (" [v2]" if self.source == "v2" else "")


SYSTEMS = {
    s.id: s
    for s in (
        System("lerobot", "lerobot"),
        System("webdataset", "webdataset"),
        System("naive", "naive"),
        System("es-f32", "epishard", reuse="epoch"),
        System("es-u8", "epishard", dtype="uint8", reuse="epoch"),
        System("es-f32c", "epishard", reuse="epoch", float_in_collate=True),
        System("es-f32m", "epishard", reuse="epoch", float_in_main=True),
        System("es-f32-pe4", "epishard", reuse="pe4"),
        System("es-f32-all", "epishard", reuse="all"),
        System("es-f32-v2", "epishard", source="v2", reuse="epoch"),
        System("es-u8-v2", "epishard", source="v2", dtype="uint8", reuse="epoch"),
    )
}
PEERS = ("lerobot", "webdataset", "naive")
DEFAULT = [k for k in SYSTEMS if k not in ("es-u8-v2", "es-f32m")]  # on request: v2.x and v3.0 shards measure alike;
# es-f32m hands out batches that are overwritten two batches later (a training step must be done with them)


# --- memory ----------------------------------------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except OSError:
        return 0


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("Pss:")), 0)
    except OSError:
        return 0


class MemSampler(threading.Thread):
    """Peak over time of the summed RSS and PSS (kB) of this process and all its descendants.

    The LeRobot harness's schedule: RSS (``statm``) every 50 ms, PSS (``smaps_rollup``, which walks
    the page tables and holds the memory map lock the workers' page faults need) every 10th sample.

    ``pss_extra``: processes whose PSS is added (the zygote this process was forked from: the pages
    they share are split between them, so the sum is what a freshly started process would hold).
    """

    def __init__(self, interval: float = 0.05, pss_every: int = 10, pss_extra: tuple[int, ...] = ()):
        super().__init__(daemon=True)
        self.interval, self.pss_every, self.rss_peak, self.pss_peak = interval, pss_every, 0, 0
        self.pss_extra = pss_extra
        self._halt = threading.Event()

    def sample(self, with_pss: bool) -> None:
        pids = _descendants(os.getpid())
        self.rss_peak = max(self.rss_peak, sum(_rss(p) for p in pids))
        if with_pss:
            self.pss_peak = max(self.pss_peak, sum(_pss(p) for p in pids + list(self.pss_extra)))

    def run(self) -> None:
        i = 0
        while not self._halt.is_set():
            self.sample(i % self.pss_every == 0)
            i += 1
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.sample(True)


# --- the peer pipelines (run inside DataLoader workers) --------------------------------------------


def _clamped(rows, n: int):
    import numpy as np

    return np.clip(rows, 0, n - 1), (rows < 0) | (rows >= n)


class _SpanDecoder:
    """What the webdataset and naive pipelines do per sample: per camera a fresh decoder on the
    video's bytes, the whole span decoded, every decoded frame post-processed, 9 kept."""

    def __init__(self, root: str, dtype: str):
        self.root, self.dtype = root, dtype
        self.index = None

    def _open(self) -> None:
        if self.index is None:
            from epishard.shardwriter import WindowIndex

            self.index = WindowIndex.load_dataset(self.root)

    def window(self, episode: int, anchor: int, videos: dict, table, counters: dict) -> dict:
        """``videos``: camera name -> member bytes; ``table``: the episode's pyarrow table."""
        import numpy as np
        import torch
        from torchcodec.decoders import VideoDecoder

        from epishard.shardwriter.stats import numeric_matrix

        ix, n = self.index, int(self.index.num_rows[episode])
        names = ix.camera_names(episode)
        offsets = np.arange(0, SPAN, STEP)
        sample = {}
        for cam in sorted(videos):
            s = ix.stream(episode, names.index(cam))
            span_rows, _ = _clamped(anchor + np.arange(SPAN), n)
            span = np.unique(ix.frames(s, span_rows))
            t0 = time.perf_counter()
            decoder = VideoDecoder(videos[cam], dimension_order="NCHW", num_ffmpeg_threads=1)
            if span[-1] - span[0] + 1 == span.size:
                frames = decoder.get_frames_in_range(int(span[0]), int(span[-1]) + 1).data
            else:
                frames = decoder.get_frames_at(span.tolist()).data
            t1 = time.perf_counter()
            if self.dtype == "float32":
                frames = frames.to(torch.float32) / 255.0  # every decoded frame, as LeRobot's output
            t2 = time.perf_counter()
            rows, pad = _clamped(anchor + offsets, n)
            sample[cam] = frames[torch.from_numpy(np.searchsorted(span, ix.frames(s, rows)))]
            sample[f"{cam}_is_pad"] = torch.from_numpy(pad)
            counters["decode_s"] += t1 - t0
            counters["postprocess_s"] += t2 - t1
            counters["frames_decoded"] += int(ix.decoded_frames(s, span))
            counters["frames_returned"] += offsets.size
            counters["frames_unique"] += span.size
            counters["decoder_opens"] += 1
        t3 = time.perf_counter()
        state = numeric_matrix(table.column("observation.state")).astype(np.float32)
        action = numeric_matrix(table.column("action")).astype(np.float32)
        rows, pad = _clamped(anchor + np.arange(HORIZON), n)
        sample["observation.state"] = torch.from_numpy(state[[anchor]])
        sample["action"] = torch.from_numpy(action[rows])
        sample["action_is_pad"] = torch.from_numpy(pad)
        sample["episode_index"] = episode
        sample["frame_index"] = anchor
        counters["assemble_s"] += time.perf_counter() - t3
        sample["__counters__"] = torch.tensor([counters[k] for k in COUNTERS], dtype=torch.float64)
        return sample


class TarWindows(_SpanDecoder):
    """webdataset ``map`` stage: one episode sample (``json``, ``parquet``, ``<field>.mp4`` bytes) ->
    the window at one random anchor."""

    def __init__(self, root: str, dtype: str, seed: int):
        super().__init__(root, dtype)
        self.seed, self.rng, self.episode_of_key = seed, None, None

    def __call__(self, sample: dict) -> dict:
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq
        import torch

        if self.index is None:
            self._open()
            self.episode_of_key = {self.index.key(e): e for e in range(self.index.num_episodes)}
            info = torch.utils.data.get_worker_info()
            self.rng = np.random.default_rng([self.seed, info.id if info else 0])
        counters = dict.fromkeys(COUNTERS, 0.0)
        counters["bytes_read"] = sum(len(v) for k, v in sample.items() if isinstance(v, bytes))
        t = time.perf_counter()
        meta = json.loads(sample["json"])
        table = pq.read_table(pa.BufferReader(sample["parquet"]))
        counters["read_s"] += time.perf_counter() - t
        episode = self.episode_of_key[sample["__key__"]]
        anchor = int(self.rng.integers(int(meta["num_rows"])))
        videos = {cam: sample[f"{field}.mp4"] for field, cam in meta["cameras"].items()}
        return self.window(episode, anchor, videos, table, counters)


class NaiveWindows(_SpanDecoder):
    """Map-style: item ``i`` is the ``i``-th (episode, anchor) of the dataset; members are read by
    the index's byte offsets (a fresh file open per sample)."""

    def __init__(self, root: str, dtype: str):
        import numpy as np

        from epishard.stream import DatasetSource

        super().__init__(root, dtype)
        self.source = DatasetSource(root)
        self.cameras = self.source.cameras
        rows = self.source.index.num_rows
        self.start = np.r_[0, np.cumsum(rows)]
        self.index = None  # re-opened (memory-mapped) in each worker

    def __len__(self) -> int:
        return int(self.start[-1])

    def _read(self, shard: int, offset: int, size: int) -> bytes:
        with open(self.source.shard_path(shard), "rb") as f:
            f.seek(offset)
            return f.read(size)

    def __getitem__(self, i: int) -> dict:
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._open()
        ix = self.index
        episode = int(np.searchsorted(self.start, i, side="right") - 1)
        anchor = int(i - self.start[episode])
        counters = dict.fromkeys(COUNTERS, 0.0)
        t = time.perf_counter()
        shard = int(ix.shard[episode])
        names = ix.camera_names(episode)
        start, stop = ix.member_ranges(ix.data_member(episode))
        table_bytes = self._read(shard, int(start), int(stop - start))
        videos = {}
        for cam in self.cameras:
            s = ix.stream(episode, names.index(cam))
            videos[cam] = self._read(shard, int(ix.cam_offset[s]), int(ix.cam_size[s]))
        table = pq.read_table(pa.BufferReader(table_bytes))
        counters["read_s"] += time.perf_counter() - t
        counters["bytes_read"] = len(table_bytes) + sum(len(v) for v in videos.values())
        return self.window(episode, anchor, videos, table, counters)


def timed_collate(samples: list[dict]) -> dict:
    import torch
    from torch.utils.data import default_collate

    t = time.perf_counter()
    batch = default_collate(samples)
    batch["__collate_s__"] = torch.tensor(time.perf_counter() - t, dtype=torch.float64)
    return batch


class TimedCollate:
    """Wraps a collate function and adds its time as ``__collate_s__``."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, samples: list[dict]) -> dict:
        import torch

        t = time.perf_counter()
        batch = self.fn(samples)
        batch["__collate_s__"] = torch.tensor(time.perf_counter() - t, dtype=torch.float64)
        return batch


def float_collate(samples: list[dict]) -> dict:
    """``timed_collate`` for uint8 samples that returns frames as float32 in [0, 1]: each sample's
    uint8 frames are converted while being copied into the batch (in shared memory inside a worker,
    as ``default_collate`` does), so the only float32 memory written is the batch itself. The values
    equal ``PostProcess(dtype=torch.float32)``'s (``x.to(float32) / 255``)."""
    import torch
    from torch.utils.data import default_collate, get_worker_info

    t = time.perf_counter()
    keys = [k for k, v in samples[0].items() if torch.is_tensor(v) and v.dtype == torch.uint8 and v.dim() == 4]
    batch = default_collate([{k: v for k, v in s.items() if k not in keys} for s in samples])
    for k in keys:
        shape = (len(samples), *samples[0][k].shape)
        elem = torch.empty(0, dtype=torch.float32)
        if get_worker_info() is not None:
            out = elem.new(elem._typed_storage()._new_shared(math.prod(shape), device=elem.device)).resize_(shape)
        else:
            out = torch.empty(shape, dtype=torch.float32)
        for i, sample in enumerate(samples):
            out[i].copy_(sample[k]).div_(255.0)
        batch[k] = out
    batch["__collate_s__"] = torch.tensor(time.perf_counter() - t, dtype=torch.float64)
    return batch


# --- one measurement (a fresh process per run) ----------------------------------------------------


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
        from epishard.stream import PostProcess, WindowDataset, WindowLoader, WindowSpec, segment
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
            per_episode=per_episode,
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
            per_worker = len(ds.plan(0, 0, 1, workers, 0))
            total = workers * math.ceil(per_worker / bs)
            loader.load_state_dict(ds.state_dict(max(total - cfg["warmup"], 0), bs, workers, epoch=0))
        extra = {"per_episode": per_episode, "dataset_copies": copies, "windows_per_epoch": len(ds)}
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


# --- the zygote: imports once, forks one measuring process per run -------------------------------

ZYGOTE_IMPORTS = (
    "numpy",
    "torch",
    "torch.utils.data",
    "pyarrow",
    "pyarrow.parquet",
    "torchcodec.decoders",
    "webdataset",
    "epishard.shardwriter",
    "epishard.shardwriter.stats",
    "epishard.stream",
    "epishard.stream.decode",
    "epishard.stream.telemetry",
)


def zygote_main() -> None:
    """Import what the runs need (~3 s per fresh interpreter), then for each request line (a run's
    config) on stdin fork a process that measures it: ``PID <pid>``, its record, ``EXIT <code>``."""
    import importlib
    import traceback

    for name in ZYGOTE_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    for line in sys.stdin:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                rec = run_child(json.loads(line), pss_extra=(os.getppid(),))
                os.write(1, (json.dumps(rec) + "\n").encode())
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        os.write(1, f"PID {pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        os.write(1, f"EXIT {os.waitstatus_to_exitcode(status)}\n".encode())


class Zygote:
    """The parent's handle on ``--zygote``: send a config, get the record (or the error)."""

    def __init__(self, env: dict):
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - the zygote's stderr, kept while it runs
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            cwd=str(REPO),
        )
        self.buf = b""

    def _line(self, deadline: float) -> str:
        import select

        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.time()))
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise RuntimeError("the zygote process exited")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def run(self, cfg: dict, timeout: float) -> dict:
        self.log.seek(0, 2)
        start = self.log.tell()
        self.proc.stdin.write((json.dumps(cfg) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.time() + timeout
        pid, rec = None, None
        try:
            while True:
                line = self._line(deadline)
                if line.startswith("PID "):
                    pid = int(line.split()[1])
                elif line.startswith("{"):
                    rec = json.loads(line)
                elif line.startswith("EXIT "):
                    code = int(line.split()[1])
                    break
        except TimeoutError:
            if pid:
                os.kill(pid, 9)
            raise RuntimeError(f"{cfg['system']} timed out after {timeout} s") from None
        if code or rec is None:
            self.log.seek(start)
            raise RuntimeError(
                f"{cfg['system']} on {cfg['root']} failed (exit {code}): {self.log.read()[-3000:].decode(errors='replace')}"
            )
        return rec

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.log.close()


# --- the parent: datasets, peers, rounds -----------------------------------------------------------


@dataclass
class Dataset:
    name: str
    main: str  # LeRobot folder (v3.0 when found in the shared data)
    version: str
    original: str | None = None  # its v2.x original, when there is one
    shards: dict | None = None  # "main"/"v2" -> converted epishard folder


def lerobot_version(folder: Path) -> str:
    with open(folder / "meta" / "info.json") as f:
        return json.load(f).get("codebase_version", "?")


def has_videos(folder: Path) -> bool:
    return (folder / "videos").is_dir() and any((folder / "videos").rglob("*.mp4"))


def find_datasets(args) -> list[Dataset]:
    if args.source:
        out = []
        for s in args.source:
            p = Path(s).resolve()
            out.append(Dataset(p.name, str(p), lerobot_version(p)))
        return out
    data = Path(args.data)
    if not data.is_dir():
        print(f"no shared data at {data}: nothing to measure (give --source FOLDER or set EPISHARD_SHARED_DATA)")
        return []
    out = []
    for p in sorted(data.iterdir()):
        if not (p / "meta" / "info.json").exists() or not lerobot_version(p).startswith("v3"):
            continue
        if args.datasets and p.name not in args.datasets:
            continue
        if not has_videos(p):
            print(f"skip {p.name}: a LeRobot v3.0 dataset without video files (nothing to decode)")
            continue
        orig = data / p.name.removesuffix("_v30")
        out.append(
            Dataset(
                p.name,
                str(p),
                lerobot_version(p),
                str(orig) if orig != p and (orig / "meta" / "info.json").exists() else None,
            )
        )
    return out


def convert_all(datasets: list[Dataset], work: Path) -> None:
    from epishard.shardwriter import ConvertOptions, convert

    for d in datasets:
        d.shards = {}
        for key, src in (("main", d.main), ("v2", d.original)):
            if src is None:
                continue
            out = work / f"{Path(src).name}"
            t = time.perf_counter()
            convert([src], str(out), ConvertOptions(progress=False))
            d.shards[key] = str(out)
            log(f"converted {Path(src).name} ({lerobot_version(Path(src))}) in {time.perf_counter() - t:.1f} s")


def peer_status(args) -> str | None:
    """None when the LeRobot peer can run, else the reason."""
    harness = Path(args.peers_dir) / "lerobot_windows.py"
    if not harness.exists():
        return f"no harness at {harness} (it lives in ../shared/peers)"
    if not Path(args.peer_venv, "bin", "python").exists() or not Path(args.peer_env).exists():
        return (
            f"peer venv {args.peer_venv} not found: build it with `bash {Path(args.peers_dir) / 'setup_lerobot_venv.sh'}` "
            f"(~75 s, offline CPU venv) or run this command with --setup-peers"
        )
    return None


def setup_peers(args) -> None:
    script = Path(args.peers_dir) / "setup_lerobot_venv.sh"
    print(f"building the LeRobot peer venv: bash {script} {args.peer_venv}", flush=True)
    subprocess.run(["bash", str(script), args.peer_venv], check=True)


def run_env(args) -> dict:
    """The environment of every run (LeRobot's too): this one plus ``--env`` settings."""
    env = dict(os.environ)
    env.update(kv.split("=", 1) for kv in args.env)
    return env


def run_lerobot(args, d: Dataset, seed: int) -> dict:
    harness = Path(args.peers_dir) / "lerobot_windows.py"
    cmd = (
        f"source {args.peer_env} && exec {args.peer_venv}/bin/python {harness} {d.main} --workers {args.workers} "
        f"--batches {args.batches} --warmup {args.warmup} --batch-size {args.batch_size} --window {FRAMES} "
        f"--stride {STEP} --action-horizon {HORIZON} --seed {seed}"
    )
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=args.timeout, env=run_env(args))
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode or not lines:
        raise RuntimeError(f"LeRobot harness failed (exit {p.returncode}): {p.stderr[-2000:]}")
    r = json.loads(lines[-1])
    fps_s = r["samples_per_s"]
    return {
        "system": "lerobot",
        "label": "lerobot",
        "kind": "lerobot",
        "dtype": "float32",
        "reuse": "",
        "root": d.main,
        "samples": r["batches"] * r["batch_size"],
        "batches": r["batches"],
        "seconds": r["seconds"],
        "samples_per_s": fps_s,
        "frames_per_s": r["frames_per_s"],
        "frames_decoded_per_returned": None,
        "time_to_first_batch_s": None,
        "warmup_s": r["warmup_s"],
        "build_s": r["build_s"],
        "timed": f"{r['batches']} batches",
        "rss_peak_mb": r["rss_peak_mb"],
        "pss_peak_mb": r["pss_peak_mb"],
        "bytes_read_per_sample": None,
        "worker_stage_s": None,
        "distinct_episodes_per_batch": None,
        "shapes": r.get("shapes"),
        "peer": r.get("peer"),
        "decoder": r.get("decoder"),
    }


def run_system(args, d: Dataset, system: System, seed: int, zygote: Zygote | None) -> dict:
    t = time.perf_counter()
    cfg = {
        "system": system.id,
        "root": d.shards[system.source],
        "batch_size": args.batch_size,
        "workers": args.workers,
        "batches": args.batches,
        "warmup": args.warmup,
        "seed": seed,
    }
    if system.kind == "lerobot":
        rec = run_lerobot(args, d, seed)
    elif zygote is not None:
        rec = zygote.run(cfg, args.timeout)
    else:
        p = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(cfg)],
            capture_output=True,
            text=True,
            timeout=args.timeout,
            cwd=str(REPO),
            env=run_env(args),
        )
        lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
        if p.returncode or not lines:
            raise RuntimeError(f"{system.id} on {d.name} failed (exit {p.returncode}): {p.stderr[-3000:]}")
        rec = json.loads(lines[-1])
    rec.update(
        dataset=d.name,
        source_format=d.version if system.source == "main" else lerobot_version(Path(d.original)),
        seed=seed,
        loadavg_1m=os.getloadavg()[0],
        wall_s=time.perf_counter() - t,
    )
    return rec


def expected_decoded_per_returned(shards: str) -> float:
    """LeRobot decodes, per sample and camera, from the keyframe before each requested frame run
    (torchcodec batch API): the same count ``WindowIndex.decoded_frames`` gives, averaged over
    every anchor (LeRobot samples anchors uniformly)."""
    import numpy as np

    from epishard.shardwriter import WindowIndex

    ix = WindowIndex.load_dataset(shards)
    decoded = returned = 0
    for e in range(ix.num_episodes):
        n = int(ix.num_rows[e])
        for c in range(len(ix.camera_names(e))):
            s = ix.stream(e, c)
            for a in range(n):
                rows, _ = _clamped(a + np.arange(0, SPAN, STEP), n)
                decoded += int(ix.decoded_frames(s, np.unique(ix.frames(s, rows))))
                returned += FRAMES
    return decoded / max(returned, 1)


# --- summary ---------------------------------------------------------------------------------------


def med(values):
    import numpy as np

    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def summarize(records: list[dict], datasets: list[Dataset], systems: list[System]) -> tuple[list[dict], list[dict]]:
    """Per (dataset, system) medians, and per (dataset, epishard system, peer) per-round ratios."""
    rows, ratios = [], []
    for d in datasets:
        by = {s.id: [r for r in records if r["dataset"] == d.name and r["system"] == s.id] for s in systems}
        for s in systems:
            rs = by[s.id]
            if not rs:
                continue
            stages = None
            if rs[0].get("worker_stage_s"):
                stages = {k: med([r["worker_stage_s"][k] / max(r["samples"], 1) for r in rs]) for k in STAGES}
            rows.append(
                {
                    "record": "summary",
                    "dataset": d.name,
                    "system": s.id,
                    "label": rs[0]["label"],
                    "source_format": rs[0]["source_format"],
                    "dtype": s.dtype,
                    "rounds": len(rs),
                    "samples_per_s": med([r["samples_per_s"] for r in rs]),
                    "samples_per_s_rounds": [r["samples_per_s"] for r in rs],
                    "frames_per_s": med([r["frames_per_s"] for r in rs]),
                    "frames_decoded_per_returned": med([r["frames_decoded_per_returned"] for r in rs]),
                    "time_to_first_batch_s": med([r["time_to_first_batch_s"] for r in rs]),
                    "warmup_s": med([r["warmup_s"] for r in rs]),
                    "rss_peak_mb": med([r["rss_peak_mb"] for r in rs]),
                    "pss_peak_mb": med([r["pss_peak_mb"] for r in rs]),
                    "bytes_read_per_sample": med([r["bytes_read_per_sample"] for r in rs]),
                    "distinct_episodes_per_batch": med([r["distinct_episodes_per_batch"] for r in rs]),
                    "stage_s_per_sample": stages,
                    "timed": rs[0]["timed"],
                    "frames_postprocessed_per_sample": med([r.get("frames_postprocessed_per_sample") for r in rs]),
                    "per_episode": rs[0].get("per_episode"),
                    "dataset_copies": rs[0].get("dataset_copies"),
                    "windows_per_epoch": rs[0].get("windows_per_epoch"),
                    "shapes": rs[0].get("shapes"),
                }
            )
        for s in systems:
            if s.kind != "epishard":
                continue
            for peer in PEERS:
                a, b = by.get(s.id, []), by.get(peer, [])
                pairs = [(x["samples_per_s"], y["samples_per_s"]) for x, y in zip(a, b, strict=False)]
                if not pairs:
                    continue
                per_round = [x / y for x, y in pairs]
                ratios.append(
                    {
                        "record": "ratio",
                        "dataset": d.name,
                        "system": s.id,
                        "label": s.label,
                        "peer": peer,
                        "ratio": med(per_round),
                        "ratio_rounds": [round(v, 2) for v in per_round],
                    }
                )
    return rows, ratios


def fmt(v, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def print_tables(rows: list[dict], ratios: list[dict], datasets: list[Dataset], lerobot_decode: dict) -> None:
    head = (
        f"{'system':<22}{'src':>5}{'samples/s':>10}{'(min..max)':>16}{'frames/s':>9}{'dec/ret':>8}{'1st batch':>10}"
        f"{'warm-up':>8}{'RSS MB':>8}{'PSS MB':>8}{'kB/sample':>10}{'eps/batch':>10}  timed"
    )
    for d in datasets:
        drows = [r for r in rows if r["dataset"] == d.name]
        if not drows:
            continue
        shapes = next((r["shapes"] for r in drows if r["shapes"]), {})
        print(
            f"\n{d.name} ({d.version}"
            + (f"; v2 = {Path(d.original).name}" if d.original else "")
            + ")  "
            + ", ".join(f"{k.split('.')[-1]} {v[:5]}" for k, v in (shapes or {}).items())
        )
        print(head)
        for r in drows:
            rounds = r["samples_per_s_rounds"]
            dec = r["frames_decoded_per_returned"]
            dec_s = (
                fmt(dec, ".2f")
                if dec is not None
                else (f"~{lerobot_decode[d.name]:.2f}" if d.name in lerobot_decode else "-")
            )
            src = r["source_format"]
            print(
                f"{r['label']:<22}{src:>5}{r['samples_per_s']:>10.1f}{f'({min(rounds):.1f}..{max(rounds):.1f})':>16}"
                f"{r['frames_per_s']:>9.0f}{dec_s:>8}{fmt(r['time_to_first_batch_s'], '.2f'):>10}{r['warmup_s']:>8.2f}"
                f"{r['rss_peak_mb']:>8.0f}{r['pss_peak_mb']:>8.0f}"
                f"{fmt(r['bytes_read_per_sample'] and r['bytes_read_per_sample'] / 1e3, '.0f'):>10}"
                f"{fmt(r['distinct_episodes_per_batch'], '.2f'):>10}  {r['timed']}"
                + (f", {r['per_episode']}/episode" if r.get("per_episode") else "")
                + (f" x{r['dataset_copies']} copies" if (r.get("dataset_copies") or 1) > 1 else "")
            )
        st = [r for r in drows if r["stage_s_per_sample"]]
        if st:
            print(
                f"  {'worker ms per sample':<20}"
                + "".join(f"{k[:-2]:>12}" for k in STAGES)
                + f"{'sum':>8}{'frames post-processed/sample':>30}"
            )
            for r in st:
                ms = [1e3 * r["stage_s_per_sample"][k] for k in STAGES]
                print(
                    f"  {r['label']:<20}"
                    + "".join(f"{v:>12.1f}" for v in ms)
                    + f"{sum(ms):>8.1f}"
                    + f"{fmt(r['frames_postprocessed_per_sample'], '.1f'):>30}"
                )
        dr = [x for x in ratios if x["dataset"] == d.name]
        if dr:
            peers = [p for p in PEERS if any(x["peer"] == p for x in dr)]
            print("  ratio epishard / peer (median of per-round ratios; per round):")
            for sid in dict.fromkeys(x["system"] for x in dr):
                cells = []
                for p in peers:
                    x = next((x for x in dr if x["system"] == sid and x["peer"] == p), None)
                    if x:
                        cells.append(f"/{p} {x['ratio']:.2f}x ({', '.join(f'{v:.2f}' for v in x['ratio_rounds'])})")
                label = next(x["label"] for x in dr if x["system"] == sid)
                print(f"    {label:<20}" + "   ".join(cells))


LEGEND = """\
columns: samples/s median of the rounds (min..max); frames/s returned frames; dec/ret frames decoded per
frame returned (epishard: telemetry over the epoch so far; webdataset/naive: counted alike; ~LeRobot:
expected over uniform anchors); 1st batch: from iter() to the first batch (epoch-timed epishard: the
timed epoch's, workers running; others: fresh loader); warm-up: the warm-up batches (LeRobot's own
figure; epoch-timed epishard: the tail of epoch 0); RSS/PSS: peak, main process + workers; kB/sample:
bytes read per sample; eps/batch: distinct episodes per batch. f32c = uint8 from the reader, float32
written by the collate; f32m = uint8 from the reader, float32 in the main process; pe4 = 4 windows per
episode per epoch; all = every anchor every epoch, in-epoch rate."""


def verdict(ratios: list[dict], datasets: list[Dataset]) -> list[str]:
    lines = []
    for d in datasets:
        if not d.version.startswith("v3"):
            continue
        x = next(
            (x for x in ratios if x["dataset"] == d.name and x["system"] == "es-f32" and x["peer"] == "lerobot"), None
        )
        if x is None:
            lines.append(f"{d.name}: no epishard-f32 / LeRobot pair measured")
            continue
        ok = x["ratio"] >= TARGET
        more = [
            (y["label"], y["ratio"])
            for y in ratios
            if y["dataset"] == d.name
            and y["peer"] == "lerobot"
            and y["system"] in ("es-f32-pe4", "es-f32-all", "es-f32c", "es-f32m", "es-u8")
        ]
        lines.append(
            f"{d.name}: epishard f32 / LeRobot = {x['ratio']:.2f}x (target >= {TARGET:.0f}x: "
            f"{'met' if ok else 'NOT met'})" + "".join(f"; {label} {v:.2f}x" for label, v in more)
        )
    return lines


# --- charts ----------------------------------------------------------------------------------------


def charts(rows: list[dict], datasets: list[Dataset], folder: Path, title: str) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        print("charts skipped: matplotlib is not installed (pip install matplotlib)")
        return []
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    names = [d.name for d in datasets if any(r["dataset"] == d.name for r in rows)]
    labels = list(dict.fromkeys(r["label"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(names) * len(labels) / 2), 5))
    width = 0.8 / len(labels)
    colors = plt.get_cmap("tab10")
    for j, label in enumerate(labels):
        xs, ys, lo, hi = [], [], [], []
        for i, n in enumerate(names):
            r = next((r for r in rows if r["dataset"] == n and r["label"] == label), None)
            if r:
                xs.append(i + (j - (len(labels) - 1) / 2) * width)
                ys.append(r["samples_per_s"])
                lo.append(max(0.0, r["samples_per_s"] - min(r["samples_per_s_rounds"])))
                hi.append(max(0.0, max(r["samples_per_s_rounds"]) - r["samples_per_s"]))
        ax.bar(
            xs,
            ys,
            width,
            yerr=[lo, hi],
            capsize=2,
            label=label,
            color=colors(j % 10),
            hatch="//" if label == "lerobot" else None,
        )
    ax.set_xticks(range(len(names)), [n.replace("_v30", "\n(v3.0)") for n in names])
    ax.set_yscale("log")
    ax.set_ylabel("samples/s (median of rounds; bars: min..max)")
    ax.set_title(title)
    ax.legend(fontsize=8, ncol=3)
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    p = folder / "peers_samples_per_s.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(str(p))

    st = [r for r in rows if r["stage_s_per_sample"]]
    if st:
        panels = [n for n in names if any(r["dataset"] == n for r in st)]
        fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels) + 1, 5), squeeze=False)
        for ax, n in zip(axes[0], panels, strict=False):
            rs = [r for r in st if r["dataset"] == n]
            bottom = np.zeros(len(rs))
            for k, stage in enumerate(STAGES):
                vals = np.array([1e3 * r["stage_s_per_sample"][stage] for r in rs])
                ax.bar(range(len(rs)), vals, 0.7, bottom=bottom, label=stage[:-2], color=colors(k))
                bottom += vals
            ax.set_xticks(
                range(len(rs)),
                [r["label"].replace("epishard ", "es ") for r in rs],
                rotation=60,
                ha="right",
                fontsize=8,
            )
            ax.set_title(n.replace("_v30", " (v3.0)"), fontsize=9)
            ax.grid(axis="y", alpha=0.3)
        axes[0][0].set_ylabel("worker ms per sample (median of rounds)")
        axes[0][-1].legend(fontsize=8)
        fig.suptitle("worker time per stage and sample: epishard telemetry; webdataset and naive timed the same way")
        fig.tight_layout()
        p = folder / "peers_epishard_stages.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(str(p))
    return paths


# --- main ------------------------------------------------------------------------------------------


def machine() -> dict:
    import torch
    import torchcodec

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(mem, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchcodec": torchcodec.__version__,
        "host": platform.node(),
        "cpu": next(
            (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?"
        ),
    }


def parse(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--data", default=str(shared_dir() / "data"), help="folder of LeRobot datasets (default ../shared/data)"
    )
    p.add_argument("--datasets", type=lambda s: s.split(","), help="comma-separated v3.0 folder names (default: all)")
    p.add_argument("--source", action="append", help="a LeRobot dataset folder to measure instead (repeatable)")
    p.add_argument(
        "--systems",
        type=lambda s: s.split(","),
        default=DEFAULT,
        help=f"comma-separated, from {','.join(SYSTEMS)} (default: all but es-u8-v2)",
    )
    p.add_argument(
        "--batches",
        type=int,
        default=20,
        help="timed batches (default 20: a full run in ~10 min on 2 cores; epishard's epoch configs time "
        "one epoch of about as many)",
    )
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", default="docs/bench/peers.jsonl", help="JSON lines (every run, summaries, ratios)")
    p.add_argument("--charts", default="docs/bench", help="folder for the PNG charts ('' for none)")
    p.add_argument("--work", help="folder for converted shards (default: a temporary folder, removed)")
    p.add_argument("--peers-dir", default=str(shared_dir() / "peers"))
    p.add_argument("--peer-venv", default=PEER_VENV)
    p.add_argument("--peer-env", default=PEER_ENV)
    p.add_argument(
        "--setup-peers", action="store_true", help="build the LeRobot peer venv first (setup_lerobot_venv.sh)"
    )
    p.add_argument("--timeout", type=int, default=900, help="seconds per run")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment for every run, peers included (e.g. THP_MEM_ALLOC_ENABLE=1: torch's large "
        "CPU allocations on transparent huge pages)",
    )
    p.add_argument(
        "--fresh-process",
        action="store_true",
        help="start a fresh interpreter per run (default: fork each run from a process that imported "
        "torch, torchcodec, ... once; its PSS is added to the run's)",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--zygote", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown:
        p.error(f"unknown systems {unknown}; choose from {list(SYSTEMS)}")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.zygote:
        zygote_main()
        return 0
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))), flush=True)
        return 0
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    t_start = time.perf_counter()
    command = "python tools/bench_peers.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.setup_peers:
        setup_peers(args)
    datasets = find_datasets(args)
    if not datasets:
        return 1
    systems = [SYSTEMS[s] for s in args.systems]
    missing = peer_status(args) if "lerobot" in args.systems else None
    if missing:
        print(f"skip LeRobotDataset peer: {missing}")
        systems = [s for s in systems if s.kind != "lerobot"]
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="epishard_bench_peers_"))
    info = machine()
    print(
        f"{started}; {info['cpus']} CPUs ({info['cpu']}), {info['memory_gib']} GiB; torch {info['torch']}, "
        f"torchcodec {info['torchcodec']}; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    print(
        f"window: {FRAMES} frames over {SPAN} (offsets 0,{STEP},...,{SPAN - 1}) per camera, action chunk {HORIZON}, "
        f"batch {args.batch_size}, {args.workers} workers, {args.warmup} warm-up batches, {args.batches} timed batches, "
        f"{args.rounds} rounds",
        flush=True,
    )
    records: list[dict] = []
    zygote = None if args.fresh_process else Zygote(run_env(args))
    try:
        convert_all(datasets, work)
        lerobot_decode = {}
        for d in datasets:
            plan = [s for s in systems if s.source == "main" or d.original]
            if not d.version.startswith("v3"):
                if any(s.kind == "lerobot" for s in plan):
                    print(f"{d.name}: LeRobot harness reads v3.0 folders only ({d.version}): peer skipped")
                plan = [s for s in plan if s.kind != "lerobot"]
            if any(s.kind == "lerobot" for s in plan):
                lerobot_decode[d.name] = expected_decoded_per_returned(d.shards["main"])
            for r in range(args.rounds):
                order = plan if r % 2 == 0 else plan[::-1]
                for s in order:
                    rec = run_system(args, d, s, seed=r, zygote=zygote)
                    if s.kind == "lerobot":
                        rec["frames_decoded_per_returned_expected"] = lerobot_decode[d.name]
                    records.append(rec)
                    log(
                        f"  {d.name} round {r + 1}/{args.rounds} {s.label:<22} {rec['samples_per_s']:8.1f} samples/s  "
                        f"(load {rec['loadavg_1m']:.1f})"
                    )
    finally:
        if zygote is not None:
            zygote.close()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    rows, ratios = summarize(records, datasets, systems)
    print_tables(rows, ratios, datasets, lerobot_decode)
    print("\n" + LEGEND)
    loads = [r["loadavg_1m"] for r in records]
    total_s = time.perf_counter() - t_start
    print(
        f"\nnoise: 1-min load average during runs {min(loads):.1f}..{max(loads):.1f} on {info['cpus']} CPUs; total {total_s:.0f} s"
    )
    lines = verdict(ratios, datasets)
    if lines:
        print("acceptance (float32, v3.0 datasets):")
        for line in lines:
            print("  " + line)
    meta = {
        "record": "run",
        "started": started,
        "command": command,
        "seconds": total_s,
        "machine": info,
        "window": {"frames": FRAMES, "span": SPAN, "offsets": list(range(0, SPAN, STEP)), "action_horizon": HORIZON},
        "batch_size": args.batch_size,
        "workers": args.workers,
        "warmup": args.warmup,
        "batches": args.batches,
        "rounds": args.rounds,
        "env": args.env,
        "systems": [asdict(s) for s in systems],
        "lerobot_expected_decoded_per_returned": lerobot_decode,
        "verdict": lines,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            for rec in [meta] + [dict(r, record="run_result") for r in records] + rows + ratios:
                f.write(json.dumps(rec) + "\n")
        print(f"wrote {args.out}")
    if args.charts:
        title = f"{FRAMES} frames/{SPAN}-frame span, batch {args.batch_size}, {args.workers} workers; {started[:10]}, {info['cpus']} CPUs"
        for p in charts(rows, datasets, Path(args.charts), title):
            print(f"chart {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
