"""A drop-in for LeRobot's ``LeRobotDataset`` in LeRobot's own training code, streamed from epishard shards.

``EpishardLeRobotDataset`` is a ``WindowDataset`` (an ``IterableDataset``: plan, exact resume with
``WindowLoader``, ranks, mixing) whose items are LeRobot's: the same keys, shapes and dtypes as
``LeRobotDataset(repo_id, root, delta_timestamps=..., image_transforms=...)[i]`` for the frame ``i``
it is anchored at, and a ``.meta`` (``EpishardLeRobotMeta``) with the fields LeRobot's factories read
(``make_policy(cfg, ds_meta=ds.meta)``, ``make_pre_post_processors(cfg, dataset_stats=ds.meta.stats)``,
``resolve_delta_timestamps(cfg.policy, ds.meta)``). epishard does not import LeRobot.

Item (one per frame of every selected episode and epoch, in the plan's order; ``boundary="pad"``:
every frame is an anchor, as in LeRobot):

====================================  ===========================================================
``<camera>``                          float32 ``[C, H, W]`` in [0, 1] (``x / 255``, bit for bit
                                      LeRobot's), uint8 with ``return_uint8=True`` (LeRobot 0.6.1's
                                      option), ``[T, C, H, W]`` when the camera is in
                                      ``delta_timestamps``; every camera of the dataset is returned
                                      (LeRobot returns every video key); a depth camera: uint16
                                      ``[1, H, W]`` in stored units
``<key>`` (state, action, columns)    float32 ``[D]`` (the feature's shape; a scalar feature 0-d),
                                      ``[T, D]`` when in ``delta_timestamps``; integer columns int64,
                                      bool columns bool
``<key>_is_pad``                      bool ``[T]``, only for keys in ``delta_timestamps``
``<stream>`` (format version 3)       a stream at its own rate: its last sample at or before the
                                      item's time (never a later one), ``[*shape]`` (float32,
                                      integers int64) with ``<stream>_is_pad`` 0-d (no sample yet,
                                      or the episode has none); or the sample nearest each
                                      ``delta_timestamps`` time, ``[T, *shape]`` with
                                      ``<stream>_is_pad`` ``[T]`` (``stream.multirate.at``)
``index``, ``task_index``             int64 0-d (``index``: the source's global frame index)
``episode_index``, ``frame_index``    int64 0-d (``frame_index`` only where the dataset has the
                                      column, as in LeRobot)
``timestamp``                         float32 0-d, seconds
``task``                              str
``dataset_index``                     int64 0-d, only in a mix (``MultiLeRobotDataset``'s key)
``substitute``                        bool, only under ``FetchPolicy(on_shard_error="skip")``
====================================  ===========================================================

Floats are float32 whatever the dataset stores, as in LeRobot (whose ``torch.tensor`` of a row's
Python floats is float32): GR00T's float64 state, action and timestamps too, the same values.

Public entry point (the LeRobot drop-in): ``from epishard.stream.lerobot_dataset import EpishardLeRobotDataset``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from epishard.format.storage import FileSystemHandle, is_local, local_path
from epishard.format.untrusted import loads

from .dataset import WindowDataset
from .fetch import FetchPolicy
from .lookahead import materialized
from .multirate import At, Span, at
from .options import ReadOptions
from .select import Selection
from .source import DatasetSource
from .spec import RESERVED_KEYS, WindowSpec, offsets_from_seconds
from .transform import PostProcess

__all__ = [
    "EpishardLeRobotDataset",
    "EpishardLeRobotMeta",
    "StatsError",
    "manifest_stats",
    "peer_pythonpath",
    "pool_stats",
]

# Arrow value types (the manifest's ``features``) -> LeRobot's dtype names (``info.json``).
_LEROBOT_DTYPES = {
    "double": "float64",
    "float": "float32",
    "halffloat": "float16",
    "bool": "bool",
    "string": "string",
    "large_string": "string",
}
_STATS_CHOICES = ("auto", "source", "manifest")
_BOOKKEEPING = frozenset({"episode_index", "frame_index", "timestamp"})


class StatsError(ValueError):
    """The statistics asked for cannot be had (the source's ``meta/stats.json`` unreadable, a bad choice)."""


def _lerobot_dtype(arrow: str) -> str:
    """LeRobot's name for an Arrow value type (``double`` -> ``float64``; ``int64`` stays)."""
    return _LEROBOT_DTYPES.get(arrow, arrow)


def _read_json(url: str, storage_options: dict | None, what: str) -> Any:
    """The JSON document at ``url`` (a path or fsspec URL), bounded (``epishard.format.untrusted.loads``).

    Raises:
        StatsError: it cannot be read or parsed (naming ``url`` and ``what`` it is for).
    """
    try:
        if is_local(url):
            with open(local_path(url), "rb") as f:
                data = f.read()
        else:
            handle = FileSystemHandle(url, storage_options or {})
            data = handle.get().cat_file(handle.root)
        return loads(data, url, StatsError)
    except (OSError, ValueError) as exc:
        raise StatsError(f"{url}: cannot read {what}: {type(exc).__name__}: {exc}") from exc


def _as_arrays(stats: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, np.ndarray]]:
    """Feature -> statistic -> numpy array, as LeRobot's ``cast_stats_to_numpy`` gives them."""
    return {key: {name: np.asarray(value) for name, value in entry.items()} for key, entry in stats.items()}


def _stored_source_stats(source: DatasetSource) -> dict[str, dict[str, np.ndarray]] | None:
    """The source's own statistics stored in a converted dataset's manifest (``sources[0].stats``), or None.

    A LeRobot dataset's ``meta/stats.json``, read at conversion (``epishard convert``); None when
    the dataset was converted from several sources, from one without ``stats.json``, or by an
    epishard that did not store them. The path the manifest records is never opened: a manifest is
    a stranger's document, and its path could name another host, or a file of this machine.
    """
    entries = source.manifest.sources
    if len(entries) != 1 or entries[0].stats is None:
        return None
    where = f"{source.shown}: manifest sources[0].stats"
    out: dict[str, dict[str, np.ndarray]] = {}
    for key, entry in entries[0].stats.items():
        if not isinstance(entry, Mapping):
            raise StatsError(f"{where}[{key!r}] is not statistic -> numbers")
        out[key] = {name: _statistic(value, f"{where}[{key!r}][{name!r}]") for name, value in entry.items()}
    return out


def _statistic(value: Any, where: str) -> np.ndarray:
    """One statistic as LeRobot's ``cast_stats_to_numpy`` gives it: ``np.array`` of a number or of equal-length lists.

    Raises:
        StatsError: text, null, objects, booleans, ragged lists or numbers past float64, naming ``where``.
    """

    def numbers(v: Any) -> bool:
        if isinstance(v, list):
            return all(numbers(x) for x in v)
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if not numbers(value):
        raise StatsError(f"{where}: not a number or a list of numbers")
    try:
        array = np.asarray(value)
    except ValueError as exc:  # ragged lists
        raise StatsError(f"{where}: not an array of numbers ({exc})") from None
    if array.dtype.kind not in "iuf":  # an integer past int64 makes an object array
        raise StatsError(f"{where}: not an array of numbers (numbers past 64 bits)")
    return array


def _source_stats(root: str, storage_options: dict | None = None) -> dict[str, dict[str, np.ndarray]]:
    """A LeRobot dataset's own statistics: ``<root>/meta/stats.json`` (what LeRobot normalises with).

    Feature -> ``{mean, std, min, max, count, q01, ...}`` as numpy arrays (camera statistics
    ``[3, 1, 1]``, as LeRobot stores them).

    Raises:
        StatsError: the file cannot be read or is not a JSON object of objects (naming the path).
    """
    url = f"{root.rstrip('/')}/meta/stats.json"
    doc = _read_json(url, storage_options, "the source's statistics")
    if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
        raise StatsError(f"{url}: not LeRobot statistics (a JSON object of feature -> statistics objects)")
    return _as_arrays(doc)


def manifest_stats(source: DatasetSource) -> dict[str, dict[str, np.ndarray]]:
    """The statistics epishard computed for a converted dataset (``manifest.json``'s ``stats``: its episodes).

    Feature -> ``{mean, std, min, max, q01, q99, count}`` (``count``: ``[1]``), numeric columns
    only (no camera statistics: LeRobot's normaliser then leaves frames as they are).
    """
    out = _as_arrays(source.manifest.stats)
    for entry in out.values():
        if "count" in entry:
            entry["count"] = entry["count"].reshape(1)
    return out


def pool_stats(parts: list[dict[str, dict[str, np.ndarray]]]) -> dict[str, dict[str, np.ndarray]]:
    """Statistics of a mix from its datasets': count-weighted mean, pooled std, min of mins, max of maxes.

    Only features every part has, with ``count`` in each; quantiles do not pool and are left out.

    Raises:
        StatsError: a shared feature has no ``count`` in some part (its weight is unknown).
    """
    if len(parts) == 1:
        return parts[0]
    out: dict[str, dict[str, np.ndarray]] = {}
    for key in set.intersection(*(set(p) for p in parts)):
        entries = [p[key] for p in parts]
        if any("count" not in e for e in entries):
            raise StatsError(f"statistics of {key!r}: a dataset of the mix gives no count, so they cannot be pooled")
        counts = np.array([float(np.sum(e["count"])) for e in entries])
        w = counts / counts.sum()
        means = [np.asarray(e["mean"], dtype=np.float64) for e in entries]
        mean = sum(wi * m for wi, m in zip(w, means, strict=True))
        second = sum(
            wi * (np.square(np.asarray(e["std"], dtype=np.float64)) + np.square(m))
            for wi, e, m in zip(w, entries, means, strict=True)
        )
        out[key] = {
            "mean": mean,
            "std": np.sqrt(np.maximum(second - np.square(mean), 0.0)),
            "min": np.min([e["min"] for e in entries], axis=0),
            "max": np.max([e["max"] for e in entries], axis=0),
            "count": np.array([int(counts.sum())]),
        }
    return out


class EpishardLeRobotMeta:
    """LeRobot's ``LeRobotDatasetMetadata`` fields for epishard datasets (what LeRobot's factories read).

    Build one alone with ``EpishardLeRobotMeta.open(url)`` (as ``LeRobotDatasetMetadata(repo_id,
    root)``, e.g. for LeRobot's ``resolve_delta_timestamps(cfg.policy, meta)`` before the dataset),
    or take ``EpishardLeRobotDataset(...).meta``.

    Attributes:
        repo_id / root: the (first) dataset's URL (credentials redacted).
        fps: frames per second (of the first dataset).
        features: LeRobot's ``info.json`` features: key -> ``{"dtype", "shape", "names"}``; cameras
            ``{"dtype": "video", "shape": [H, W, C], "names": ["height", "width", "channels"],
            "info": {...}}`` at the size the dataset returns (``image_size``); scalars ``[1]``.
        stats: the statistics the drop-in hands to LeRobot (``stats_from`` says which): key ->
            statistic -> numpy array (``stats="source"``: the source's ``meta/stats.json``, camera
            statistics included; ``"manifest"``: epishard's over the episodes converted).
        stats_from: ``"source (stored at conversion): <path>/meta/stats.json"`` (the copy in the
            manifest; the path is where it was read, never opened now), ``"source: <source_root>/
            meta/stats.json"`` (read from the folder the caller named), ``"manifest"`` or ``"given"``.
        manifest_stats: epishard's statistics, always (pooled over a mix: ``pool_stats``).
        camera_keys / video_keys: the cameras (all are videos in epishard); ``image_keys``: ``[]``;
            ``depth_keys``: depth cameras.
        robot_type: the first episode's robot (``None`` when unknown).
        total_episodes / total_frames / total_tasks, tasks (texts): of the episodes selected.
        episodes: per selected episode, ``episode_index``, ``length``, ``dataset_from_index``,
            ``dataset_to_index`` (int64 arrays; consecutive in the selection's order) and ``tasks``.
        info: ``{"fps", "features", "robot_type", "total_episodes", "total_frames", ...}``.
        has_language_columns: False (LeRobot 0.6.1's train script asks).
    """

    def __init__(
        self,
        sources: list[DatasetSource],
        post: PostProcess | None = None,
        selected: list[np.ndarray] | None = None,
        *,
        stats: str | Mapping[str, Mapping[str, Any]] = "auto",
        source_root: str | list[str] | None = None,
        storage_options: dict | None = None,
        cameras: list[str] | None = None,
    ):
        if not sources:
            raise ValueError("EpishardLeRobotMeta needs at least one dataset")
        post = post or PostProcess()
        selected = selected or [np.ones(s.index.num_episodes, dtype=bool) for s in sources]
        first = sources[0]
        self.repo_id = self.root = first.shown
        self.fps = float(first.manifest.fps if first.manifest.fps is not None else first.index.fps[0])
        self.features = _features(first, post, cameras)
        self.camera_keys = [k for k, f in self.features.items() if f["dtype"] == "video"]
        self.video_keys = list(self.camera_keys)
        self.image_keys: list[str] = []
        self.depth_keys = [k for k in self.camera_keys if self.features[k]["info"]["video.is_depth_map"]]
        robots = first.index.episode_column("robot") if "robot" in first.index.episode_columns else []
        self.robot_type = next((r for r in robots if r), None)
        rows = [s.index.num_rows[keep] for s, keep in zip(sources, selected, strict=True)]
        lengths = np.concatenate(rows).astype(np.int64)
        self.total_episodes = int(lengths.size)
        self.total_frames = int(lengths.sum())
        tasks: list[str] = []
        episode_tasks: list[list[str]] = []
        episode_index = []
        for s, keep in zip(sources, selected, strict=True):
            for e in np.flatnonzero(keep):
                texts = s.index.episode_tasks(int(e))
                episode_tasks.append(texts)
                tasks.extend(t for t in texts if t not in tasks)
                episode_index.append(int(s.index.episode_index[e]))
        self.tasks = tasks
        self.total_tasks = len(tasks)
        ends = np.cumsum(lengths)
        self.episodes = {
            "episode_index": np.asarray(episode_index, dtype=np.int64),
            "length": lengths,
            "dataset_from_index": ends - lengths,
            "dataset_to_index": ends,
            "tasks": episode_tasks,
        }
        self.has_language_columns = False
        self.manifest_stats = pool_stats([manifest_stats(s) for s in sources])
        if isinstance(stats, Mapping):
            self.stats, self.stats_from = _as_arrays(stats), "given"
        elif stats == "manifest":
            self.stats, self.stats_from = self.manifest_stats, "manifest"
        elif source_root is not None and stats in ("auto", "source"):  # a folder the user names: read there
            roots = _source_roots(sources, source_root)
            self.stats = pool_stats([_source_stats(r, storage_options) for r in roots])
            self.stats_from = "source: " + ", ".join(f"{r.rstrip('/')}/meta/stats.json" for r in roots)
        elif stats in ("auto", "source"):
            stored = [_stored_source_stats(s) for s in sources]
            if all(d is not None for d in stored):
                self.stats = pool_stats([d for d in stored if d is not None])
                # the file each came from (sources[].stats_from; manifests before it: meta/stats.json)
                entries = [s.manifest.sources[0] for s in sources]
                self.stats_from = "source (stored at conversion): " + ", ".join(
                    f"{(e.path or '').rstrip('/')}/{e.stats_from or 'meta/stats.json'}" for e in entries
                )
            elif stats == "source":
                missing = [s.shown for s, d in zip(sources, stored, strict=True) if d is None]
                raise StatsError(
                    f"{', '.join(missing)}: stats='source' needs the source's statistics, and the manifest stores "
                    "none (converted from several sources, from one without meta/stats.json, or by an older "
                    "epishard); the path the manifest records is not opened (a dataset could name any host or "
                    "file): pass source_root= (the LeRobot dataset's folder or URL), or stats='manifest' "
                    "(epishard's, over the episodes converted)"
                )
            else:  # another format (HDF5, Zarr, RLDS, MCAP), or no stats.json: epishard's
                self.stats, self.stats_from = self.manifest_stats, "manifest"
        else:
            raise StatsError(f"stats must be one of {_STATS_CHOICES} or a dict of statistics, not {stats!r}")
        self.info = {
            "codebase_version": "v3.0",
            "fps": self.fps,
            "features": self.features,
            "robot_type": self.robot_type,
            "total_episodes": self.total_episodes,
            "total_frames": self.total_frames,
            "total_tasks": self.total_tasks,
        }

    @classmethod
    def open(
        cls,
        url: str | list[str],
        *,
        image_size: tuple[int, int] | None = None,
        stats: str | Mapping[str, Mapping[str, Any]] = "auto",
        source_root: str | list[str] | None = None,
        storage_options: dict | None = None,
        cameras: list[str] | None = None,
    ) -> EpishardLeRobotMeta:
        """The metadata of the dataset(s) at ``url``, as the dataset built with the same options gives it.

        ``image_size``: ``(H, W)`` the frames will be resized to; ``cameras``: the cameras the dataset
        will return (None: all).

        Raises:
            FileNotFoundError, FormatError, FetchError: see ``DatasetSource``.
            StatsError: see ``EpishardLeRobotDataset``.
        """
        urls = url if isinstance(url, list) else [url]
        sources = [_open(u, storage_options) for u in urls]
        return cls(
            sources,
            PostProcess(size=image_size),
            stats=stats,
            source_root=source_root,
            storage_options=storage_options,
            cameras=cameras,
        )

    def __repr__(self) -> str:
        return (
            f"EpishardLeRobotMeta({self.repo_id!r}, fps={self.fps}, episodes={self.total_episodes}, "
            f"frames={self.total_frames}, cameras={self.camera_keys}, stats={self.stats_from!r})"
        )


def _open(url, storage_options: dict | None, fetch: FetchPolicy | None = None) -> DatasetSource:
    """``DatasetSource``; a LeRobot folder or Hub repo id given in its place is named as one (``NotConverted``)."""
    return DatasetSource(url, storage_options, fetch)


def _source_roots(sources: list[DatasetSource], source_root: str | list[str]) -> list[str]:
    """The LeRobot dataset folder of each dataset, as the caller names it in ``source_root``.

    Raises:
        StatsError: ``source_root`` names another number of folders than there are datasets.
    """
    roots = source_root if isinstance(source_root, list) else [source_root]
    if len(roots) != len(sources):
        raise StatsError(f"source_root names {len(roots)} folders for {len(sources)} datasets")
    return roots


def _features(source: DatasetSource, post: PostProcess, cameras: list[str] | None = None) -> dict[str, dict]:
    """LeRobot-style features of a converted dataset (cameras at the size ``post`` returns).

    ``cameras``: the cameras to keep (None: all).

    Raises:
        ValueError: the manifest has no ``features`` (written before they were recorded: convert again).
        KeyError: a camera in ``cameras`` the dataset does not have (naming it and the cameras).
    """
    manifest = source.manifest
    if manifest.features is None:
        raise ValueError(f"{source.shown}: its manifest has no 'features' (an older conversion): convert it again")
    if cameras is not None:
        unknown = sorted(set(cameras) - set(manifest.cameras))
        if unknown:
            raise KeyError(f"cameras {unknown} are not in {source.shown}, whose cameras are {sorted(manifest.cameras)}")
    out: dict[str, dict] = {}
    for name, entry in manifest.features.items():
        camera = manifest.cameras.get(name)
        if camera is not None and cameras is not None and name not in cameras:
            continue
        if camera is not None:
            depth = (camera.kind or entry.kind) == "depth"
            channels = 1 if depth else 3
            c, h, w = post.output_shape(channels, camera.height, camera.width)
            out[name] = {
                "dtype": "video",
                "shape": [h, w, c],
                "names": ["height", "width", "channels"],
                "info": {
                    "video.fps": camera.fps,
                    "video.height": h,
                    "video.width": w,
                    "video.channels": c,
                    "video.codec": camera.codec,
                    "video.is_depth_map": depth,
                },
            }
            continue
        if entry.dtype == "video":  # a camera no episode kept
            continue
        shape = [int(n) if n is not None else -1 for n in entry.shape] or [1]
        out[name] = {"dtype": _lerobot_dtype(entry.dtype), "shape": shape, "names": entry.names}
    for name, stream in (manifest.streams or {}).items():
        # A stream at its own rate (format version 3): read at the item's time (``at``, nearest sample).
        out[name] = {
            "dtype": "float32" if np.issubdtype(np.dtype(stream.dtype), np.floating) else "int64",
            "shape": list(stream.shape) or [1],
            "names": None,
            "info": {"stream.rate": stream.rate, "stream.nominal_rate": stream.nominal_rate},
        }
    return out


class EpishardLeRobotDataset(WindowDataset):
    """LeRobot's dataset, streamed from epishard shards: use it where a training script builds ``LeRobotDataset``.

    ``ds = EpishardLeRobotDataset("s3://shards/so101", delta_timestamps={...})`` then LeRobot's own
    ``make_policy(cfg.policy, ds_meta=ds.meta)``, ``make_pre_post_processors(cfg.policy,
    dataset_stats=ds.meta.stats)`` and a ``DataLoader(ds, batch_size=..., num_workers=...)`` (no
    ``shuffle``/``sampler``: it is an ``IterableDataset`` whose plan shuffles; LeRobot's
    ``lerobot-train`` does so with ``--dataset.streaming=true``). ``WindowLoader(ds, ...)`` adds exact
    mid-epoch resume. Items: see the module docstring.

    Args:
        sources: a dataset URL (any fsspec URL or path) or ``DatasetSource``, or a list of them (or
            of ``(url, weight)`` pairs) to mix them (``WindowDataset``; same cameras and frame rate).
        delta_timestamps: LeRobot's: key -> offsets in seconds (any offsets, past and future; those
            outside the episode clamped to its edge and flagged in ``<key>_is_pad``). Keys: cameras,
            ``observation.state``, ``action`` and any other numeric column.
        image_transforms: LeRobot's: a callable applied to each RGB camera's frames of every item,
            ``[C, H, W]`` (``[T, C, H, W]`` with delta_timestamps), float in [0, 1] (uint8 with
            ``return_uint8``), in the DataLoader workers.
        return_uint8: frames as uint8 (LeRobot 0.6.1's ``return_uint8=True``; 0.6.1's train script
            divides by 255 itself); default float32 in [0, 1].
        image_size: ``(H, W)`` every RGB camera is resized to (bilinear, antialiased) before the
            float conversion; ``meta.features`` gives the size returned. None: as stored (LeRobot's).
        stats: which statistics ``meta.stats`` holds (LeRobot normalises with them): ``"auto"``
            (default: ``"source"`` when the converted dataset stores its source's statistics or
            ``source_root`` is given; else ``"manifest"``), ``"source"`` (LeRobot's own: the
            LeRobot dataset's ``meta/stats.json``, as ``epishard convert`` stored it in the
            manifest, or read from ``source_root``), ``"manifest"`` (epishard's, computed over the
            episodes converted: they differ when only some were converted), or a dict of your own
            (key -> statistic -> array). ``meta.manifest_stats`` always holds epishard's. The path
            a manifest records is never opened (a dataset could name another host, where the
            ``storage_options``' credentials would go, or a file of this machine).
        source_root: the LeRobot dataset folder or URL (one per dataset of a mix) to read
            ``meta/stats.json`` from, with ``read.storage_options``.
        tolerance_s: LeRobot's tolerance for offsets that are not multiples of 1/fps.
        episodes: LeRobot's: the ``episode_index`` values to read (None: all), as
            ``LeRobotDataset(episodes=[...])``; ``ds.episodes`` keeps them. Every one must be in the
            converted dataset; one dataset only (for a mix, ``select=[Selection(episodes=...), ...]``).
        revision: LeRobot's Hub revision: only None is taken (shards hold the revision that was
            converted: convert the one you want).
        video_backend: LeRobot's: None or ``"torchcodec"`` (epishard decodes with torchcodec, as
            LeRobot's default backend does); another backend is refused.
        cameras: the cameras to return and list in ``meta.features`` (None: all, as LeRobot), e.g.
            one camera for a single-camera policy such as VQ-BeT; the others are not fetched.
        stride / per_episode_count / per_episode_fraction: fewer anchors per episode per epoch
            (``WindowSpec``); default every frame, as LeRobot.
        read: ``ReadOptions`` (``WindowDataset``'s); its ``fetch`` defaults to
            ``FetchPolicy(on_shard_error="raise")`` (LeRobot's behaviour; with ``"skip"`` items carry
            ``substitute``), its ``storage_options`` also read the source's statistics.
        **kw: the other ``WindowDataset`` options (``seed``, ``shuffle``, ``select``, ``ranks``,
            ``mix``, ...).

    Raises:
        KeyError: a ``delta_timestamps`` key the dataset has no feature for (naming it and the features),
            or a camera in ``cameras`` it does not have.
        ValueError: an offset that is not a multiple of 1/fps (naming key and offset); ``episodes``
            the dataset does not hold (naming them), given with a mix or with ``select`` that
            already lists episodes; a ``revision`` or ``video_backend`` it cannot honour (naming
            it); see ``WindowDataset``.
        StatsError: ``stats="source"`` and the manifest stores no source statistics and no
            ``source_root`` is given, or ``source_root``'s ``meta/stats.json`` cannot be read
            (naming the path, and what to pass instead), or a bad ``stats`` value.
    """

    def __init__(
        self,
        sources,
        delta_timestamps: Mapping[str, list[float]] | None = None,
        image_transforms: Callable[[torch.Tensor], torch.Tensor] | None = None,
        *,
        return_uint8: bool = False,
        image_size: tuple[int, int] | None = None,
        stats: str | Mapping[str, Mapping[str, Any]] = "auto",
        source_root: str | list[str] | None = None,
        tolerance_s: float = 1e-4,
        episodes: list[int] | None = None,
        revision: str | None = None,
        video_backend: str | None = None,
        cameras: list[str] | None = None,
        stride: int = 1,
        per_episode_count: int | None = None,
        per_episode_fraction: float | None = None,
        read: ReadOptions | None = None,
        **kw,
    ):
        if not isinstance(stats, Mapping) and stats not in _STATS_CHOICES:
            raise StatsError(f"stats must be one of {_STATS_CHOICES} or a dict of statistics, not {stats!r}")
        _refuse_unknown_keywords(kw)
        if revision is not None:
            raise ValueError(
                f"revision={revision!r}: epishard shards hold the revision of the dataset that was converted; "
                "convert the revision you want (epishard convert) and pass revision=None"
            )
        if video_backend not in (None, "torchcodec"):
            raise ValueError(
                f"video_backend={video_backend!r}: epishard decodes with torchcodec (the frames LeRobot's default "
                "'torchcodec' backend returns); pass None or 'torchcodec'"
            )
        read = read or ReadOptions()
        if read.fetch is None:
            read = dataclasses.replace(read, fetch=FetchPolicy(on_shard_error="raise"))
        fetch, storage_options = read.fetch, read.storage_options
        items = sources if isinstance(sources, list) else [sources]
        opened = []
        for item in items:
            src, weight = item if isinstance(item, tuple) else (item, None)
            src = src if isinstance(src, DatasetSource) else _open(src, storage_options, fetch)
            opened.append(src if weight is None else (src, weight))
        first = opened[0][0] if isinstance(opened[0], tuple) else opened[0]
        post = PostProcess(size=image_size)
        features = _features(first, post, cameras)
        fps = float(first.manifest.fps if first.manifest.fps is not None else first.index.fps[0])
        delta = {k: list(v) for k, v in (delta_timestamps or {}).items()}
        # Streams at their own rate: at the item's time, or at its delta_timestamps (the nearest sample).
        own_rate = set(first.manifest.streams or {})
        streams: dict[str, Span | At] = {
            k: at(delta[k], "nearest") if k in delta else at([0.0], "previous") for k in sorted(own_rate)
        }
        unknown = sorted(set(delta) - set(features))
        left_out = [k for k in unknown if cameras is not None and k in first.manifest.cameras]
        if left_out:
            raise KeyError(f"delta_timestamps names {left_out}, which cameras={cameras} leaves out of {first.shown}")
        if unknown:
            raise KeyError(
                f"delta_timestamps names {unknown}, which {first.shown} has no feature for: {sorted(features)}"
            )
        rows = {k: offsets_from_seconds(v, fps, tolerance_s, k) for k, v in delta.items() if k not in own_rate}
        cameras = [k for k, f in features.items() if f["dtype"] == "video"]
        state = "observation.state" if "observation.state" in features else None
        action = "action" if "action" in features else None
        taken = {*cameras, state, action, *rows, *own_rate}
        extra = tuple(
            k
            for k in features
            if k not in taken and k not in _BOOKKEEPING and k not in RESERVED_KEYS and features[k]["dtype"] != "video"
        )
        spec = WindowSpec(
            cameras={c: rows.get(c, (0,)) for c in cameras},
            state_key=state,
            state_offsets=rows.get(state, (0,)) if state else (0,),
            action_key=action,
            action_offsets=rows.get(action, (0,)) if action else None,
            column_offsets={k: o for k, o in rows.items() if k not in (*cameras, state, action)},
            extra_columns=extra,
            boundary="pad",
            stride=stride,
            per_episode_count=per_episode_count,
            per_episode_fraction=per_episode_fraction,
            fps=fps,
            streams=streams,
        )
        if episodes is not None:
            kw["select"] = _episode_selection(first, len(opened), list(episodes), kw.get("select"))
        super().__init__(opened, spec, postprocess=post, read=read, **kw)
        self.delta_timestamps = delta or None
        self.image_transforms = image_transforms
        self.return_uint8 = return_uint8
        self.tolerance_s = tolerance_s
        self.episodes = sorted(int(e) for e in episodes) if episodes is not None else None  # LeRobot's
        self.meta = EpishardLeRobotMeta(
            self.sources,
            self.post,
            self.selected,
            stats=stats,
            source_root=source_root,
            storage_options=storage_options,
            cameras=cameras,
        )
        self._features = features
        self._scalars = frozenset(k for k, f in (first.manifest.features or {}).items() if tuple(f.shape) == ())
        self._streams = frozenset(streams)
        self._has_index = "index" in features
        self._index_base = None if self._has_index else self._frame_bases()

    # --- LeRobotDataset's attributes ------------------------------------------------------------------

    @property
    def fps(self) -> float:
        """Frames per second (``meta.fps``)."""
        return self.meta.fps

    @property
    def features(self) -> dict[str, dict]:
        """LeRobot-style features (``meta.features``)."""
        return self.meta.features

    @property
    def num_frames(self) -> int:
        """Frames of the selected episodes (LeRobot's ``num_frames``; one item each per epoch at stride 1)."""
        return self.meta.total_frames

    @property
    def num_episodes(self) -> int:
        """Selected episodes (LeRobot's ``num_episodes``)."""
        return self.meta.total_episodes

    def __getitem__(self, index):
        """Not supported: the drop-in streams (an ``IterableDataset``); raises ``TypeError``.

        Windows come in the plan's shuffled order through ``iter(ds)`` or a ``DataLoader``; a
        ``sampler`` or ``shuffle=True`` is not needed (nor accepted by torch for it).
        """
        raise TypeError(
            f"EpishardLeRobotDataset[{index!r}]: the drop-in streams windows and is not indexable; take items "
            "with iter(ds) / next(...) or a DataLoader (no sampler, no shuffle=True: the plan shuffles, by seed "
            "and epoch)"
        )

    def set_image_transforms(self, image_transforms: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
        """Replace the transform applied to the cameras (LeRobot 0.6.1's method)."""
        self.image_transforms = image_transforms

    # --- items ------------------------------------------------------------------------------------------

    def _frame_bases(self) -> dict[tuple[int, int], int]:
        """(dataset, episode_index) -> the global index of its first frame, for datasets without an ``index`` column.

        Frames are numbered over each dataset's episodes in ``episode_index`` order, as LeRobot does.
        """
        bases = {}
        for d, s in enumerate(self.sources):
            order = np.argsort(s.index.episode_index, kind="stable")
            starts = np.cumsum(np.concatenate([[0], s.index.num_rows[order]]))[:-1]
            for e, start in zip(order, starts, strict=True):
                bases[(d, int(s.index.episode_index[e]))] = int(start)
        return bases

    def __iter__(self):
        for sample in super().__iter__():
            yield self.lerobot_item(materialized(sample))  # its items are tensors, LeRobot's

    def lerobot_item(self, sample: dict) -> dict:
        """LeRobot's item from a ``WindowDataset`` sample (keys, shapes and dtypes: the module docstring)."""
        delta = self.delta_timestamps or {}
        item: dict = {}
        for key, value in sample.items():
            if key.endswith("_is_pad") and key[: -len("_is_pad")] in sample:
                if key[: -len("_is_pad")] in delta:
                    item[key] = value
                elif key[: -len("_is_pad")] in self._streams:  # a stream at the item's time: its one flag
                    item[key] = value[0]
                continue
            feature = self._features.get(key)
            if key == "episode_index" or (key == "frame_index" and feature is not None):
                item[key] = torch.tensor(int(value), dtype=torch.int64)
            elif key == "frame_index":
                continue  # the dataset has no frame_index column, and LeRobot's item then has none
            elif key in self._streams:  # at the item's time ([*shape]) or at its delta_timestamps ([T, *shape])
                item[key] = value if key in delta else value[0]
            elif key.endswith("_timestamp") and key[: -len("_timestamp")] in self._streams:
                continue  # LeRobot's items hold a feature and its _is_pad only
            elif key == "timestamp":
                item[key] = torch.tensor(value, dtype=torch.float32)
            elif key == "dataset":
                if len(self.sources) > 1:
                    item["dataset_index"] = torch.tensor(int(value), dtype=torch.int64)
            elif key == "substitute":
                if self.fetch.on_shard_error == "skip":
                    item[key] = value
            elif feature is not None and feature["dtype"] == "video":
                frames = value if key in delta else value[0]
                if not feature["info"]["video.is_depth_map"]:
                    if not self.return_uint8 and frames.dtype == torch.uint8:
                        frames = frames / 255.0  # LeRobot's conversion, bit for bit: x / 255 in float32
                    if self.image_transforms is not None:
                        frames = self.image_transforms(frames)
                item[key] = frames
            elif feature is not None:
                item[key] = _lerobot_value(value, feature, windowed=key in delta, scalar=key in self._scalars)
            else:
                item[key] = value
        if not self._has_index:
            base = self._index_base[(int(sample["dataset"]), int(sample["episode_index"]))]  # type: ignore[index]
            item["index"] = torch.tensor(base + int(sample["frame_index"]), dtype=torch.int64)
        return item


# LeRobotDataset keywords (0.4.x, 0.6.x) the drop-in does not take, and what to do instead.
_LEROBOT_ONLY = {
    "repo_id": "pass the shards' folder or URL as the first argument",
    "root": "pass the shards' folder or URL as the first argument",
    "force_cache_sync": "shards are read where they are (no Hub cache to sync)",
    "download_videos": "frames are fetched from the shards as windows need them",
    "batch_encoding_size": "a recording option of LeRobot's writer",
    "episode_filter": "use episodes=[...] or select=Selection(...)",
    "token": "pass storage credentials in read=ReadOptions(storage_options=...)",
    "depth_output_unit": "depth cameras come back in stored uint16 units",
    "repo_type": "pass the shards' folder or URL as the first argument",
}


def _refuse_unknown_keywords(kw: dict) -> None:
    """Refuse a keyword neither the drop-in nor ``WindowDataset`` takes, naming it.

    For one of LeRobot's keywords the message says what to pass instead.

    Raises:
        TypeError: naming the keyword.
    """
    import inspect

    taken = set(inspect.signature(WindowDataset.__init__).parameters) - {"self", "sources", "spec"}
    for name in kw:
        if name in _LEROBOT_ONLY:
            raise TypeError(f"EpishardLeRobotDataset does not take LeRobot's {name}=: {_LEROBOT_ONLY[name]}")
        if name not in taken:
            own = set(inspect.signature(EpishardLeRobotDataset.__init__).parameters) - {"self", "sources", "kw"}
            raise TypeError(
                f"EpishardLeRobotDataset got an unexpected keyword argument {name!r} (it takes {sorted(own)} "
                f"and WindowDataset's {sorted(taken - {'postprocess', 'read'})})"
            )


def _episode_selection(source: DatasetSource, datasets: int, episodes: list[int], select) -> Selection:
    """LeRobot's ``episodes=[...]`` as a read-time selection of ``source``, joined to the caller's ``select``.

    Raises:
        ValueError: a mix (``datasets`` > 1), an index the dataset does not hold (naming them and
            the dataset), or a ``select`` that is a list or already lists episodes.
    """
    if datasets > 1:
        raise ValueError(
            "episodes= selects episodes of one dataset; for a mix pass select=[Selection(episodes=[...]), ...] "
            "with one entry per dataset"
        )
    if not episodes:
        raise ValueError("episodes=[] selects no episode; pass None for all of them")
    wanted = {int(e) for e in episodes}
    held = {int(e) for e in source.index.episode_index}
    missing = sorted(wanted - held)
    if missing:
        raise ValueError(
            f"episodes {missing[:20]} are not in {source.shown}, which holds {len(held)} episodes "
            f"(episode_index {min(held, default=0)}..{max(held, default=-1)}); only the episodes converted can be read"
        )
    if isinstance(select, list) or (select is not None and select.episodes is not None):
        raise ValueError("give the episodes once: episodes= or select=Selection(episodes=...), not both")
    return (
        dataclasses.replace(select, episodes=sorted(wanted))
        if select is not None
        else Selection(episodes=sorted(wanted))
    )


def _lerobot_value(value, feature: dict, windowed: bool, scalar: bool):
    """A column's value as LeRobot returns it: a scalar column 0-d (``[T]`` windowed), bools bool.

    ``value``: the reader's tensor (``[*shape]`` for the anchor row, ``[T, *shape]`` for a window
    or for state and action at offset 0 only, ``T = 1``; a scalar column's shape is ``[1]``), or a
    ``str``. ``scalar``: the column stores one value per row (the manifest's shape ``[]``).
    """
    if not isinstance(value, torch.Tensor):
        return value
    if not windowed and value.dim() == len(feature["shape"]) + 1:
        value = value[0]  # state / action read at offset 0 only: without the time axis
    if scalar:
        value = value[..., 0]
    if feature["dtype"] == "bool":
        value = value.to(torch.bool)
    return value


def peer_pythonpath() -> str:
    """A ``PYTHONPATH`` entry that makes ``import epishard`` work in another venv (e.g. LeRobot's).

    In a checkout: the repository root (``epishard/__init__.py`` finds the three package folders
    next to itself); installed: the folder holding the ``epishard`` package.
    """
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.isfile(os.path.join(here, "epishard", "__init__.py")):
        return here
    return os.path.dirname(here)
