"""Convert sources into shards, window indexes and a manifest: planned, parallel, atomic, resumable.

1. Sources are opened (LeRobot folders are read by ``lerobot.read_lerobot``), episodes filtered,
   keys checked unique across all sources.
2. Episodes are packed in order into shards under the per-shard limits (episodes, bytes). The plan
   is a pure function of the inputs and options, and each shard carries a digest of its part of it.
3. Shards are written in parallel processes. Each shard is complete once its index is renamed into
   place; a rerun keeps every shard whose index digest and tar size match, removes stale temporary
   files, and writes the rest. Worker processes die with the converting process (even on SIGKILL)
   and never publish a shard after it is gone.
4. Statistics are computed from the written tables; the manifest is written last.

Internal: import from ``epishard.shardwriter``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import logging
import multiprocessing
import os
import signal
import sys
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Literal

import av
import numpy as np
import pyarrow as pa

from epishard.format import manifest as fmt
from epishard.format import untrusted
from epishard.format.errors import check_choice
from epishard.format.index import WindowIndex, dataset_index_bytes, encode_index, read_shard_meta, read_table_bytes
from epishard.format.stats import DatasetStats
from epishard.format.storage import Storage
from epishard.format.streams import read_pieces
from epishard.redact import redact, redact_optional, scrubbed

from .episode import Episode, LazyTable, Source, TableSlice, file_size
from .errors import ConversionError, OutputFolderError, SourceError
from .prepare import PrepareOptions, prepare
from .sources import SourceOptions, open_source
from .tarwriter import TarShardWriter
from .verify import camera_notes
from .video import ReencodeSpec

__all__ = ["ConvertOptions", "Runner", "convert", "plan_digest", "plan_shards", "write_shard"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConvertOptions:
    """Options of a conversion.

    ``prefix``: shard file prefix. ``max_episodes_per_shard`` / ``max_bytes_per_shard``: a shard
    is closed before it would exceed either (a single larger episode gets a shard of its own).
    ``episodes``: source episode indices to keep (None: all). ``cameras``: camera names to keep
    (None: all; ``()``: none, state and action only, e.g. for a dataset whose videos are absent).
    ``reencode``: re-encode videos instead of copying them bit-exact. ``on_error``:
    ``"raise"`` stops at the first bad episode, ``"skip"`` leaves it out and counts it in the report.
    ``timestamps``: ``"warn"`` (report) or ``"raise"`` (stop) on timestamp/video disagreements
    (``errors.ErrorPolicy`` is the vocabulary; the earlier ``"fail"`` is a deprecated alias of
    ``"raise"``). ``check``: how each stored video's frame table is vouched for
    (``manifest.CHECK_LEVELS``; see ``prepare.PrepareOptions``): ``"fast"`` (default), ``"full"`` or
    ``"off"``; the manifest's report counts the videos checked at each level. ``decode_check``:
    deprecated; ``False`` means ``check="off"``, ``True`` ``check="full"``. ``workers``: processes.
    ``overwrite``: replace a finished conversion of another plan in the output folder (without it,
    that is refused; a rerun of the same plan, or of an unfinished conversion, never needs it).
    ``sources``: how paths of formats other than LeRobot are read (``sources.SourceOptions``:
    ``--format``, ``--mapping``, ``--fps``; None: recognised from the files, default mappings).
    Raises ``ValueError`` for a prefix that is not a plain file-name stem (``manifest.PREFIX_RE``: no
    path separator, so nothing is written outside the output folder), an out-of-range value, or a
    policy that is not one of the allowed values (the message lists them).
    """

    prefix: str = "shard"
    max_episodes_per_shard: int = 64
    max_bytes_per_shard: int = 1 << 30
    episodes: frozenset[int] | None = None
    cameras: tuple[str, ...] | None = None
    reencode: ReencodeSpec | None = None
    on_error: Literal["raise", "skip"] = "raise"
    timestamps: Literal["warn", "raise"] = "warn"
    check: Literal["full", "fast", "off"] = "fast"
    decode_check: bool | None = None
    workers: int = 1
    progress: bool = True
    overwrite: bool = False
    sources: SourceOptions | None = None

    def __post_init__(self):
        object.__setattr__(
            self, "on_error", check_choice("ConvertOptions", "on_error", self.on_error, ("raise", "skip"))
        )
        object.__setattr__(
            self, "timestamps", check_choice("ConvertOptions", "timestamps", self.timestamps, ("warn", "raise"))
        )
        object.__setattr__(self, "check", check_choice("ConvertOptions", "check", self.check, fmt.CHECK_LEVELS))
        if self.decode_check is not None:
            level = "full" if self.decode_check else "off"
            warnings.warn(
                f"ConvertOptions: decode_check is deprecated, use check={level!r}", DeprecationWarning, stacklevel=3
            )
            object.__setattr__(self, "check", level)
            object.__setattr__(self, "decode_check", None)
        problems = [
            f"prefix must be a plain file-name stem ({fmt.PREFIX_RE.pattern}), got {self.prefix!r}"
            if not fmt.PREFIX_RE.fullmatch(self.prefix)
            else "",
            f"max_episodes_per_shard must be >= 1, got {self.max_episodes_per_shard}"
            if self.max_episodes_per_shard < 1
            else "",
            f"max_bytes_per_shard must be >= 1, got {self.max_bytes_per_shard}" if self.max_bytes_per_shard < 1 else "",
            f"workers must be >= 1, got {self.workers}" if self.workers < 1 else "",
        ]
        if any(problems):
            raise ValueError("ConvertOptions: " + "; ".join(p for p in problems if p))

    def prepare_options(self) -> PrepareOptions:
        """The options of the per-episode preparation (``prepare``) among these."""
        return PrepareOptions(
            cameras=self.cameras, reencode=self.reencode, timestamps=self.timestamps, check=self.check
        )


def _open_sources(
    inputs: list[Source | str],
    cameras: tuple[str, ...] | None = None,
    storage_options: dict | None = None,
    episodes: frozenset[int] | None = None,
    source_options: SourceOptions | None = None,
) -> list[Source]:
    """Open paths or URLs and give every source a unique name (``name``, ``name_2``, ...).

    A path is a LeRobot dataset or a source of another format (``sources.open_source``: recognised
    from its files, or ``source_options.format``; ``source_options.mapping`` overrides the format's
    default mapping). ``cameras``, ``storage_options``, ``episodes``: see ``read_lerobot``
    (``episodes``: a LeRobot source describes only those of its episodes; its notes and checks are
    those of the whole dataset); items already a ``Source`` are kept as given.
    """
    sources, seen = [], set()
    for item in inputs:
        source = (
            open_source(item, source_options, cameras=cameras, storage_options=storage_options, episodes=episodes)
            if isinstance(item, str)
            else item
        )
        name, n = source.name, 2
        while fmt.slug(name) in seen:
            name, n = f"{source.name}_{n}", n + 1
        if name != source.name or any(e.source != name for e in source.episodes):
            # Episodes take their source's (unique) name: keys and per-source statistics follow it.
            renamed = [dataclasses.replace(e, source=name) if e.source != name else e for e in source.episodes]
            source = dataclasses.replace(source, name=name, episodes=renamed)
        seen.add(fmt.slug(name))
        sources.append(source)
    return sources


def _index_ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"`` (sorted, unique); ``"none"`` when empty."""
    runs: list[list[int]] = []
    for i in sorted(set(indices)):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs) or "none"


def plan_shards(episodes: list[Episode], max_episodes: int, max_bytes: int) -> list[list[Episode]]:
    """Pack episodes, in order, into shards of at most ``max_episodes`` and about ``max_bytes``."""
    shards: list[list[Episode]] = []
    current: list[Episode] = []
    size = 0
    for episode in episodes:
        estimate = episode.estimated_bytes()
        if current and (len(current) >= max_episodes or size + estimate > max_bytes):
            shards.append(current)
            current, size = [], 0
        current.append(episode)
        size += estimate
    if current:
        shards.append(current)
    return shards


def _fingerprint(episode: Episode, root: str = "") -> list:
    """What identifies an episode's input: its key and, per file, its relative path and size.

    Paths are relative to the source's ``root`` (so a copy of a dataset elsewhere, a local folder or
    a bucket, plans the same shards); in-memory inputs are identified by size or digest.
    """

    def name(file) -> str:
        path = str(file)
        return path[len(root) + 1 :] if root and path.startswith(root + "/") else path

    def one(item) -> list:
        if isinstance(item, pa.Table):
            return ["table", item.num_rows, item.nbytes]
        if isinstance(item, TableSlice):
            return ["slice", name(item.path), file_size(item.path), item.start, item.stop]
        if isinstance(item, LazyTable):
            return ["lazy", *item.fingerprint()]
        if isinstance(item, (bytes, bytearray)):
            return ["bytes", hashlib.sha256(item).hexdigest()]
        return ["file", name(item), file_size(item)]

    videos = {cam: [*one(v.source), v.segment] for cam, v in sorted(episode.videos.items())}
    for cam, f in sorted(episode.frames.items()):
        videos[cam] = ["frames", *f.reader.fingerprint(), f.depth]
    out = [episode.key or fmt.episode_key(episode.source, episode.episode_index), one(episode.table), videos]
    if episode.streams:  # (absent without streams: the fingerprints of earlier conversions hold)
        out.append({name: _stream_digest(s) for name, s in sorted(episode.streams.items())})
    return out


def _stream_digest(stream) -> list:
    """What identifies an in-memory stream: sha256 of its timestamps and values (with dtype and shape), its rate."""
    digest = hashlib.sha256()
    for array in (np.asarray(stream.timestamps), np.asarray(stream.values)):
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return [digest.hexdigest(), stream.rate]


def plan_digest(episodes: list[Episode], options: ConvertOptions, roots: dict[str, str] | None = None) -> str:
    """sha256 (hex) of what determines a shard's content: format version, episodes, sources, options.

    ``roots``: source name -> its folder or URL (``Source.path``); files are named relative to it.
    """
    roots = roots or {}
    spec = {
        # Version 2's number: a dataset without streams is written as version 2, byte for byte (streams
        # enter through the episodes' fingerprints).
        "format": fmt.PLAIN_VERSION,
        "episodes": [_fingerprint(e, roots.get(e.source, "")) for e in episodes],
        "cameras": options.cameras,
        "reencode": options.reencode.describe() if options.reencode else None,
        "on_error": fmt.policy_on_disk(options.on_error),  # the format's spelling: digests of earlier runs hold
        "timestamps": fmt.policy_on_disk(options.timestamps),
        "index_columns": fmt.INDEX_SCHEMA.names,  # an index of another layout is rewritten, not reused
        "camera_fields": [f.name for f in fmt.CAMERA_TYPE],  # so is one without packet tables
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_parent: int | None = None  # pid of the converting process, in its worker processes


def _die_with_parent(parent: int) -> None:
    """Worker initializer: the kernel SIGKILLs this worker when ``parent`` dies.

    Linux ``_PR_SET_PDEATHSIG``, so a killed conversion leaves no worker running and writing shards.
    """
    global _parent
    _parent = parent
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    _check_parent()  # the parent may have died before the request took effect


def _check_parent() -> None:
    """In a worker: exit if the converting process is gone (its children are re-parented).

    Called before each publishing rename too, where ``_PR_SET_PDEATHSIG`` is unavailable (not Linux).
    """
    if _parent is not None and os.getppid() != _parent:
        os._exit(1)  # an orphan: nobody reads its results; the rerun rewrites its shard


def _pool_context():
    # PR_SET_PDEATHSIG and the getppid() check need workers to be children of the converting
    # process: fork (Linux; Python 3.14 defaults to forkserver, whose workers are not) or spawn.
    return multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")


def _redacted_entry(entry: dict) -> dict:
    """A report entry (a warning of ``prepare``) with its text fields redacted (``epishard.redact``)."""
    return {k: redact(v) if isinstance(v, str) and k in ("message", "file", "dataset") else v for k, v in entry.items()}


def write_shard(storage: Storage, shard_id: int, episodes: list[Episode], options: ConvertOptions, digest: str) -> dict:
    """Write one shard and its index atomically; return the shard metadata stored in the index."""
    name = fmt.shard_name(options.prefix, shard_id)
    rows, skipped, notes = [], [], []
    checks: dict[str, int] = {}
    prep = options.prepare_options()
    with storage.writer(name) as f:
        tar = TarShardWriter(f)
        for episode in episodes:
            try:
                ready = prepare(episode, prep)
            except ConversionError as exc:
                exc = exc.with_context(shard=name)
                if options.on_error != "skip":
                    raise exc from None
                skipped.append(exc.to_dict())
                continue
            except Exception as exc:  # a fault prepare does not know: still say where, never skip it
                detail = f"{type(exc).__name__}: {exc}"
                raise ConversionError(
                    detail if len(detail) <= 500 else detail[:500] + "...",  # a library may put a buffer in it
                    kind="internal",
                    dataset=episode.source,
                    episode=episode.episode_index,
                    shard=name,
                ) from exc
            members = []
            for member_name, data in ready.members:
                offset, size, sha = tar.add(member_name, data)
                members.append({"name": member_name, "offset": offset, "size": size, "sha256": sha})
            rows.append({**ready.row, "members": members})
            notes.extend([_redacted_entry(w) for w in ready.warnings])  # the index meta is published
            if prep.check != "off":  # a black or constant camera: a counted note (check "off" decodes nothing)
                found = camera_notes(ready.row, ready.members, episode.source, episode.episode_index)
                notes.extend(_redacted_entry(w) for w in found)
            for level, n in ready.checks.items():
                checks[level] = checks.get(level, 0) + n
        tar.close()
        _check_parent()  # leaving this block publishes the tar
    meta = {
        "shard": name,
        "index": fmt.index_name(options.prefix, shard_id),
        "size": tar.size,
        "sha256": tar.sha256,
        "plan_digest": digest,
        "episodes": len(rows),
        "rows": sum(r["num_rows"] for r in rows),
        "frames": sum(r["num_rows"] * len(r["cameras"]) for r in rows),
        "skipped": skipped,
        "warnings": notes,
        "checks": checks,
    }
    _check_parent()
    storage.write(meta["index"], encode_index(rows, meta))
    return meta


def _complete(storage: Storage, shard_id: int, options: ConvertOptions, digest: str) -> dict | None:
    index, tar = fmt.index_name(options.prefix, shard_id), fmt.shard_name(options.prefix, shard_id)
    if not (storage.exists(index) and storage.exists(tar)):
        return None
    try:
        meta = read_shard_meta(pa.BufferReader(storage.read(index)))
    except (ValueError, OSError, pa.ArrowException):
        return None
    if meta.get("plan_digest") != digest or storage.size(tar) != meta.get("size"):
        return None
    return meta


def _claim_output(storage: Storage, prefix: str) -> None:
    """Make sure the output folder is this writer's before anything in it is removed or replaced.

    A new or empty folder is claimed by writing the marker (``manifest.CONVERT_MARKER``) first; so is
    one that holds nothing but the marker's temporary file (``<marker>.partial-<pid>``: a run killed
    while it wrote the marker), which is removed. Any other non-empty one is used only if it holds
    the marker, for the same shard prefix, and nothing but files the writer creates
    (``manifest.is_writer_file``): an earlier or interrupted conversion, which this one resumes or
    replaces.

    Raises:
        OutputFolderError: the path is a file, or the folder holds anything else; nothing was changed.
        FileNotFoundError, PermissionError: from ``Storage.names``: no such bucket, access denied.
    """
    if storage.is_file():
        raise OutputFolderError(f"{storage.url}: is a file; the output must be a new or empty folder")
    names = storage.names()
    if names and all(_is_partial_marker(n) for n in names):
        # A run killed while it wrote the marker into the new folder: the folder is still new.
        for name in names:
            storage.remove(name)
        names = []
    if not names:
        storage.makedirs()
        storage.write(fmt.CONVERT_MARKER, json.dumps({"writer": "epishard convert", "prefix": prefix}).encode())
        return
    try:
        marker = _read_json(storage, fmt.CONVERT_MARKER) if fmt.CONVERT_MARKER in names else None
    except ValueError:
        marker = None
    if not isinstance(marker, dict):
        raise OutputFolderError(
            f"{storage.url}: not empty and not made by epishard convert (holds {_some(names)}); "
            "nothing was changed: convert into a new or empty folder"
        )
    if marker.get("prefix") != prefix:
        raise OutputFolderError(
            f"{storage.url}: holds a conversion with --prefix {marker.get('prefix')!r}, not "
            f"{prefix!r}; nothing was changed: use that prefix or a new or empty folder"
        )
    foreign = [n for n in names if not fmt.is_writer_file(n, prefix)]
    if foreign:
        raise OutputFolderError(
            f"{storage.url}: holds files epishard convert did not write ({_some(foreign)}); "
            "nothing was changed: move them out or convert into a new or empty folder"
        )


def _is_partial_marker(name: str) -> bool:
    """Whether ``name`` is the marker's temporary file (``manifest.temp_path``), left by a run killed as it wrote it."""
    return fmt.is_partial(name) and name.rsplit(".partial-", 1)[0] == fmt.CONVERT_MARKER


def _refuse_other_finished(storage: Storage, dataset_digest: str) -> None:
    """Refuse to replace a finished conversion (one with a manifest) of another plan.

    A rerun of the same plan (same sources, episodes and options: same ``plan_digest`` in the
    manifest) resumes or repairs it; an unfinished conversion (no manifest) is this writer's to
    resume or replace.

    Raises:
        OutputFolderError: the manifest records another plan (or none); nothing was changed.
    """
    if not storage.exists(fmt.MANIFEST_NAME):
        return
    try:  # only the digest is compared, not trusted: a damaged manifest of this very plan is still ours to redo
        recorded = _read_json(storage, fmt.MANIFEST_NAME).get("plan_digest")
    except (ValueError, AttributeError):
        recorded = None
    if recorded != dataset_digest:
        raise OutputFolderError(
            f"{storage.url}: holds a finished conversion of other sources or options; "
            "nothing was changed: convert into a new folder, or pass --overwrite to replace it"
        )


def _read_json(storage: Storage, name: str):
    """JSON file ``name`` of the output folder, within ``untrusted``'s size and depth bounds (else ValueError)."""
    untrusted.check_size(storage.size(name), storage.path(name))
    return untrusted.loads(storage.read(name), storage.path(name))


def _some(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _remove_stale(storage: Storage, prefix: str, num_shards: int) -> None:
    storage.remove_partials()
    # Shards of an earlier plan with more shards than this one would be listed by no manifest.
    for name in storage.names():
        if name.startswith(prefix + "-"):
            stem = name[len(prefix) + 1 :].split(".")[0]
            if stem.isdigit() and int(stem) >= num_shards:
                storage.remove(name)


# How the shards still to write are written: ``(jobs, storage, options, total_episodes, done)`` where
# ``jobs`` are ``(shard_id, episodes, plan_digest)``; it calls ``write_shard`` for each job and stores
# the returned metadata in ``done[shard_id]``. ``_run`` uses this machine's processes;
# ``shardwriter.ray_convert.RayRunner`` runs each job as a Ray task.
Runner = Callable[[list[tuple], Storage, ConvertOptions, int, dict], None]


def _run(jobs: list[tuple], storage: Storage, options: ConvertOptions, total_episodes: int, done: dict) -> None:
    from tqdm import tqdm

    bar = tqdm(total=total_episodes, unit="ep", desc="convert", disable=not options.progress, file=sys.stderr)
    bar.update(sum(m["episodes"] + len(m["skipped"]) for m in done.values()))
    if options.workers <= 1 or len(jobs) <= 1:
        for shard_id, episodes, digest in jobs:
            done[shard_id] = write_shard(storage, shard_id, episodes, options, digest)
            log.info("shard %d written: %d episodes", shard_id, len(episodes))
            bar.update(len(episodes))
    else:
        with ProcessPoolExecutor(
            max_workers=options.workers,
            mp_context=_pool_context(),
            initializer=_die_with_parent,
            initargs=(os.getpid(),),
        ) as pool:
            futures = {
                pool.submit(write_shard, storage, sid, eps, options, dg): (sid, len(eps)) for sid, eps, dg in jobs
            }
            try:
                for future in as_completed(futures):
                    sid, n = futures[future]
                    done[sid] = future.result()
                    log.info("shard %d written: %d episodes", sid, n)
                    bar.update(n)
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
    bar.close()


def _sources_differ(cameras: dict[str, set[str]], fps: dict[str, float]) -> tuple[fmt.ReportEntry, ...]:
    """Warnings for sources of one output that differ in cameras or frame rate (two robots in one dataset).

    ``cameras``: source -> the cameras its converted episodes have; ``fps``: source -> its rate. Such a
    dataset converts, but a window over a camera some episodes lack cannot be streamed from it, nor
    one ``delta_timestamps`` (seconds) over its rates: each warning names the sources and what differs.
    """
    out = []
    if len({frozenset(c) for c in cameras.values()}) > 1:
        each = "; ".join(f"{name}: {', '.join(sorted(c)) or 'none'}" for name, c in cameras.items())
        out.append(
            fmt.ReportEntry(
                kind="sources_cameras_differ",
                message=(
                    f"the sources have different cameras ({each}): a window over a camera some episodes lack "
                    "cannot be streamed from this dataset; convert each robot into its own dataset and mix them "
                    "(WindowDataset([a, b], spec, mix=Mixing(camera_map=...)))"
                ),
            )
        )
    rates = {name: fps[name] for name in cameras if name in fps}
    if len(set(rates.values())) > 1:
        each = "; ".join(f"{name}: {rate:g} fps" for name, rate in rates.items())
        out.append(
            fmt.ReportEntry(
                kind="sources_fps_differ",
                message=(
                    f"the sources have different frame rates ({each}): one delta_timestamps (seconds) is other rows "
                    "at each rate and is refused over this dataset; convert each robot into its own dataset and mix "
                    "them (each is resolved at its own rate)"
                ),
            )
        )
    return tuple(out)


def _feature_schema(source: Source, table: pa.Table) -> dict:
    features = {}
    for field in table.schema:
        value_type, shape = field.type, []
        while (
            pa.types.is_list(value_type)
            or pa.types.is_fixed_size_list(value_type)
            or pa.types.is_large_list(value_type)
        ):
            if pa.types.is_fixed_size_list(value_type):
                shape.append(value_type.list_size)
            else:
                column = table.column(field.name).combine_chunks()
                lengths = set(column.value_lengths().to_pylist()) if len(column) else {0}
                shape.append(lengths.pop() if len(lengths) == 1 else None)
            value_type = value_type.value_type
        declared = source.features.get(field.name, {})
        features[field.name] = {"dtype": str(value_type), "shape": shape, "names": declared.get("names")}
    return features


def _camera_entry(index: WindowIndex, stream: int, fps: float) -> dict:
    """Manifest ``cameras`` entry of a camera stream: stream facts, camera kind and reader output.

    The entry also names the conversion the reader applies when it returns fewer bits than are stored.
    """
    kind = index.cam_kind[stream].as_py()
    pix_fmt = index.cam_pix_fmt[stream].as_py()
    dtype, channels = fmt.camera_output(kind)
    bits = av.VideoFormat(pix_fmt).components[0].bits if pix_fmt else 8
    conversion = None
    if kind == "rgb" and bits > 8:
        conversion = (
            f"{pix_fmt} ({bits} bits per sample) is returned as 8-bit RGB (uint8): "
            f"the decoder converts it to rgb24, keeping 8 of its {bits} bits"
        )
    return {
        "codec": index.cam_codec[stream].as_py(),
        "width": int(index.cam_width[stream]),
        "height": int(index.cam_height[stream]),
        "fps": fps,
        "episodes": 0,
        "kind": kind,
        "pix_fmt": pix_fmt,
        "bit_depth": bits,
        "dtype": dtype,
        "channels": channels,
        "conversion": conversion,
    }


def _summarise(storage: Storage, shard_metas: list[dict], index_files: list[bytes], sources: list[Source]) -> dict:
    """Statistics, schema, cameras and tasks, computed from the written shards.

    ``index_files``: each shard's index, as read back once for the manifest.
    """
    stats = DatasetStats()
    features: dict = {}
    cameras: dict = {}
    streams: dict = {}
    tasks: dict[str, int] = {}
    per_source: dict[str, int] = {}
    cameras_per_source: dict[str, set[str]] = {}
    videos_per_shard: list[int] = []
    by_name = {s.name: s for s in sources}
    for meta, index_file in zip(shard_metas, index_files, strict=False):
        index = WindowIndex.read_shard_indexes([(index_file, storage.path(meta["index"]))], fmt.FORMAT_VERSION)
        videos_per_shard.append(int(index.episode_cams[index.num_episodes]) if index.num_episodes else 0)
        for e in range(index.num_episodes):
            source = index.source(e)
            per_source[source] = per_source.get(source, 0) + 1
            start, stop = index.member_ranges(index.data_member(e))
            table = read_table_bytes(storage.read(meta["shard"], int(start), int(stop)))
            stats.add_table(table, source)
            for name, spec in _feature_schema(by_name[source], table).items():
                features.setdefault(name, spec)
            for s in range(index.episode_cams[e], index.episode_cams[e + 1]):
                cameras_per_source.setdefault(source, set()).add(index.cam_names[s].as_py())
                entry = cameras.setdefault(index.cam_names[s].as_py(), _camera_entry(index, s, float(index.fps[e])))
                entry["episodes"] += 1
                size = f"{index.cam_height[s]}x{index.cam_width[s]}"
                entry.setdefault("sizes", {})[size] = entry.get("sizes", {}).get(size, 0) + 1
            for task in index.episode_tasks(e):
                tasks.setdefault(task, len(tasks))
            for name, sig in index.signals(e).items():
                where = f"{storage.path(meta['shard'])}: episode {index.key(e)} stream {name}"
                blobs = {}
                for m in index.signal_pieces(sig)[0].tolist():
                    start, stop = index.member_ranges(m)
                    blobs[m] = storage.read(meta["shard"], int(start), int(stop))
                data = read_pieces(index, sig, blobs, where)
                _add_stream(streams, name, data.timestamps, data.values, float(index.signal_rate[sig]))
    for name, cam in cameras.items():
        if len(cam["sizes"]) == 1:  # listed only where episodes differ (e.g. a rotated one)
            del cam["sizes"]
        features[name] = {
            "dtype": "video",
            "shape": [cam["height"], cam["width"], cam["channels"]],
            "names": ["height", "width", "channel"],
            "kind": cam["kind"],
        }
    return {
        "features": {name: fmt.FeatureEntry(**{**f, "shape": tuple(f["shape"])}) for name, f in features.items()},
        "cameras": {name: fmt.CameraEntry(**cam) for name, cam in cameras.items()},
        "tasks": list(tasks),
        "stats": stats.result(),
        "stats_by_source": stats.result_by_source(),
        "stats_mixed_widths": stats.mixed_widths,
        "episodes_per_source": per_source,
        "cameras_per_source": {name: cameras_per_source.get(name, set()) for name in per_source},
        "videos_per_shard": videos_per_shard,
        "streams": {name: _stream_entry(s) for name, s in sorted(streams.items())},
    }


def _add_stream(streams: dict, name: str, times: np.ndarray, values: np.ndarray, rate: float) -> None:
    """Add one episode's stream to the running per-stream sums of ``_summarise``."""
    entry = streams.setdefault(
        name,
        {
            "dtype": values.dtype.name,
            "shape": values.shape[1:],
            "episodes": 0,
            "samples": 0,
            "span": 0.0,
            "intervals": 0,
            "rates": set(),
            "min": None,
            "max": 0.0,
            "gaps": 0,
        },
    )
    entry["episodes"] += 1
    entry["samples"] += int(times.size)
    if rate > 0:
        entry["rates"].add(rate)
    if times.size < 2:
        return
    gaps = np.diff(times)
    entry["span"] += float(times[-1] - times[0])
    entry["intervals"] += int(gaps.size)
    entry["min"] = float(gaps.min()) if entry["min"] is None else min(entry["min"], float(gaps.min()))
    entry["max"] = max(entry["max"], float(gaps.max()))
    period = 1.0 / rate if rate > 0 else float(np.median(gaps))
    entry["gaps"] += int(np.count_nonzero(gaps > 1.5 * period)) if period > 0 else 0


def _stream_entry(entry: dict) -> fmt.StreamEntry:
    """The manifest's entry of a stream from the sums ``_add_stream`` kept."""
    rates = sorted(entry["rates"])
    return fmt.StreamEntry(
        dtype=entry["dtype"],
        shape=tuple(int(n) for n in entry["shape"]),
        episodes=entry["episodes"],
        samples=entry["samples"],
        rate=entry["intervals"] / entry["span"] if entry["span"] > 0 else None,
        nominal_rate=rates[0] if len(rates) == 1 else None,
        min_interval=entry["min"] or 0.0,
        max_interval=entry["max"],
        gaps=entry["gaps"],
    )


@scrubbed  # its exceptions and their chains name no credentials
def convert(
    inputs: list[Source | str],
    out: str,
    options: ConvertOptions = ConvertOptions(),
    storage_options: dict | None = None,
    runner: Runner | None = None,
) -> fmt.Manifest:
    """Convert sources (LeRobot dataset paths or ``Source`` objects) into a sharded dataset at ``out``.

    ``out`` and LeRobot sources are local folders or any fsspec URLs (``s3://bucket/prefix``,
    ``https://...``, ``hf://datasets/<repo>``); ``storage_options`` apply to every URL, merged with
    the environment (``storage.resolve_storage_options``; sources on stores needing other options:
    open them with ``read_lerobot(url, storage_options=...)`` and pass the ``Source``). Sources are
    read through (range requests), never copied whole to disk. Shards stream straight to ``out``;
    each appears under its final name only when complete.
    Returns the manifest (``manifest.Manifest``; also written to ``out/manifest.json``, last).
    ``runner``: how the shards are written (default: ``options.workers`` processes on this machine;
    see ``Runner``); the plan, the shards' bytes, the index and the manifest do not depend on it.

    Raises:
        SourceError: a source cannot be read, no episode is left after filtering, or two episodes
            share a key.
        ConversionError: an episode is bad and ``options.on_error == "raise"``; the message names
            dataset, episode, camera, row and shard. Shards finished before it stay and are reused
            by a rerun.
        OutputFolderError: ``out`` is a file, or a non-empty folder that is not this writer's (see
            ``_claim_output``), or a finished conversion of another plan and ``options.overwrite``
            is off; nothing in it was changed.
        OSError: a write failed (``filename`` names the file; no half-written file stays under a
            final name, and a rerun resumes).
    """
    # A selection: only its episodes' rows of a LeRobot source's metadata are turned into episodes.
    sources = _open_sources(inputs, options.cameras, storage_options, options.episodes, options.sources)
    episodes = [
        e for s in sources for e in s.episodes if options.episodes is None or e.episode_index in options.episodes
    ]
    if not episodes:
        if options.episodes is not None:
            sources = _open_sources(inputs, options.cameras, storage_options, None, options.sources)  # for the message
            have = ", ".join(f"{s.name}: {_index_ranges([e.episode_index for e in s.episodes])}" for s in sources)
            raise SourceError(f"no episodes to convert: none of --episodes is in the sources (episode indices {have})")
        raise SourceError("no episodes to convert (the sources list none)")
    keys: dict[str, Episode] = {}
    for e in episodes:
        key = e.key or fmt.episode_key(e.source, e.episode_index)
        if key in keys:
            raise SourceError(f"episode key {key!r} is used twice ({keys[key].source} and {e.source})")
        keys[key] = e
    shards = plan_shards(episodes, options.max_episodes_per_shard, options.max_bytes_per_shard)
    storage = Storage(out, storage_options)
    _claim_output(storage, options.prefix)
    roots = {s.name: s.path.rstrip("/") for s in sources}
    digests = [plan_digest(shard, options, roots) for shard in shards]
    dataset_digest = hashlib.sha256("".join(digests).encode()).hexdigest()
    if not options.overwrite:
        _refuse_other_finished(storage, dataset_digest)
    done: dict[int, dict] = {}
    jobs = []
    for shard_id, (shard, digest) in enumerate(zip(shards, digests, strict=False)):
        meta = _complete(storage, shard_id, options, digest)
        if meta is not None:
            done[shard_id] = meta
        else:
            jobs.append((shard_id, shard, digest))
    # The dataset is incomplete until a new manifest lands: never leave an old one describing shards
    # this run may rewrite.
    storage.remove(fmt.MANIFEST_NAME)
    _remove_stale(storage, options.prefix, len(shards))
    (runner or _run)(jobs, storage, options, len(episodes), done)
    metas = [done[i] for i in range(len(shards))]
    index_files = [storage.read(m["index"]) for m in metas]
    dataset_index = dataset_index_bytes(index_files)
    storage.write(fmt.DATASET_INDEX_NAME, dataset_index)
    summary = _summarise(storage, metas, index_files, sources)
    skipped = tuple(fmt.ReportEntry(**s) for m in metas for s in m["skipped"])
    flagged = tuple(fmt.ReportEntry(**_redacted_entry({**w, "dataset": s.name})) for s in sources for w in s.warnings)
    flagged += tuple(fmt.ReportEntry(**w) for m in metas for w in m["warnings"])
    flagged += _sources_differ(summary["cameras_per_source"], {s.name: s.fps for s in sources})
    checks: dict[str, int] = {}
    for m, videos in zip(metas, summary["videos_per_shard"], strict=True):
        # A shard kept from a run before check levels: its tables were checked as "full" checks now.
        for level, n in m.get("checks", {"full": videos}).items():
            checks[level] = checks.get(level, 0) + n
    fps_values = sorted({s.fps for s in sources})
    manifest = fmt.Manifest(
        format=fmt.FORMAT_NAME,
        format_version=fmt.STREAMS_VERSION if summary["streams"] else fmt.PLAIN_VERSION,
        plan_digest=dataset_digest,
        sources=tuple(
            fmt.SourceEntry(
                name=s.name,
                path=redact_optional(s.path),  # the manifest is published: no credentials
                format=s.format,
                fps=s.fps,
                episodes=summary["episodes_per_source"].get(s.name, 0),
                notes=tuple(redact(n) for n in s.notes),
                stats=s.stats,
                stats_from=s.stats_from,
            )
            for s in sources
        ),
        options=fmt.ManifestOptions(
            prefix=options.prefix,
            cameras=options.cameras,
            on_error=options.on_error,
            timestamps=options.timestamps,
            video=options.reencode.describe() if options.reencode else "copy",
        ),
        fps=fps_values[0] if len(fps_values) == 1 else None,
        features=summary["features"],
        cameras=summary["cameras"],
        streams=summary["streams"] or None,
        tasks=tuple(summary["tasks"]),
        stats=summary["stats"],
        stats_by_source=summary["stats_by_source"],
        stats_mixed_widths=tuple(summary["stats_mixed_widths"]),
        totals=fmt.Totals(
            shards=len(metas),
            episodes=sum(m["episodes"] for m in metas),
            rows=sum(m["rows"] for m in metas),
            frames=sum(m["frames"] for m in metas),
            bytes=sum(m["size"] for m in metas),
            skipped=len(skipped),
        ),
        index=fmt.IndexFile(file=fmt.DATASET_INDEX_NAME, sha256=hashlib.sha256(dataset_index).hexdigest()),
        shards=tuple(
            fmt.ShardEntry(
                **{k: m[k] for k in ("shard", "index", "episodes", "rows", "frames", "size", "sha256")},
                index_sha256=hashlib.sha256(data).hexdigest(),
            )
            for m, data in zip(metas, index_files, strict=False)
        ),
        report=fmt.Report.of(skipped, flagged, checks),
    )
    storage.write(fmt.MANIFEST_NAME, manifest.dump())
    return manifest
