"""Re-read a converted dataset and check it against its manifest and indexes.

Checks everything the reader relies on. The manifest: every field the reader uses, file names plain
(``epishard.format.validate``), before any file it names is opened. ``index.arrow``: its sha256, schema
and value bounds, and that it holds exactly the per-shard indexes. Per shard: the tar and index
exist as regular files, sizes and sha256 match the manifest; the index's schema; every tar member
lies exactly where the index says (data offset and size) and has the indexed sha256; an episode's
members are contiguous; its table has the indexed number of rows; each stream at its own rate
(format version 3) reads as the index states it (``streams.read_pieces``: Arrow IPC files of the
indexed dtype, shape and sample count, timestamps finite and non-decreasing) with the indexed first
and last time and smallest and largest interval (``streams.stream_facts``); and per episode and camera
(unless ``decode=False``), every frame of the video decodes through the reader's decoder with the
pts and pixels its frame table promises (``video.check_frames``: in order, and after a seek to each
keyframe). Last, the manifest's counts (rows and camera frames per shard, the totals) against
what the indexes hold.
"""

from __future__ import annotations

import hashlib
import io
import logging
import sys
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from epishard.format import manifest as fmt
from epishard.format.decoder import container_frames
from epishard.format.errors import FormatError
from epishard.format.index import WindowIndex
from epishard.format.opening import ManifestMissing, open_manifest
from epishard.format.storage import NotARegularFile, Storage
from epishard.format.streams import read_pieces, stream_facts
from epishard.format.validate import check_index, totals_mismatches
from epishard.redact import redact, scrubbed

from .video import check_frames

__all__ = [
    "camera_notes",
    "verify",
]

log = logging.getLogger(__name__)


BLACK_LUMA = 24  # luma at or below this is black (limited-range black is 16; compression adds a little)


def blank_camera(
    data: bytes, stream_index: int | None, pts: np.ndarray, keyframes: np.ndarray
) -> tuple[str, str] | None:
    """``(kind, message)`` when a camera's video looks black or constant, else None.

    Samples the first, middle and last keyframes (``keyframes``: frame numbers) and the last frame
    (``pts``: every frame's pts in the stream's time base), each decoded with PyAV after a seek (the
    last one from its group's keyframe), as luma (uint8 ``[H, W]``). ``"camera_black"``: 99.5% of
    every sampled frame's pixels at luma <= ``BLACK_LUMA``; ``"camera_constant"``: two or more
    sampled frames, all equal to the first within 2 levels (a frozen, covered or flat camera). A
    note, never an error: a video that does not decode here gives None (``check_frames`` and the
    reader judge decoding).
    """
    import av

    keys, pts = np.asarray(keyframes, dtype=np.int64), np.asarray(pts, dtype=np.int64)
    if keys.size == 0 or pts.size == 0:
        return None
    picks = sorted({int(keys[0]), int(keys[keys.size // 2]), int(keys[-1]), int(pts.size - 1)})
    frames = []
    try:
        with av.open(io.BytesIO(data)) as container:
            stream = container.streams.video[0] if stream_index is None or stream_index < 0 else None
            stream = stream or next(s for s in container.streams if s.index == stream_index)
            for k in picks:
                target = int(pts[k])
                container.seek(target, stream=stream, backward=True, any_frame=False)
                for i, frame in enumerate(container.decode(stream)):
                    if frame.pts is not None and frame.pts >= target:
                        frames.append(frame.to_ndarray(format="gray"))
                        break
                    if i > 512:  # a long group of pictures: not worth a note
                        return None
    except Exception:  # only a note: decoding faults are check_frames' and the reader's to judge
        return None
    if len(frames) != len(picks):
        return None
    at = f"frame{'s' if len(picks) > 1 else ''} {', '.join(map(str, picks))}"
    if all(np.percentile(f, 99.5) <= BLACK_LUMA for f in frames):
        return "camera_black", f"every frame sampled ({at}) is black: did the camera record?"
    if len(frames) > 1 and all(
        f.shape == frames[0].shape and int(np.abs(f.astype(np.int16) - frames[0]).max()) <= 2 for f in frames[1:]
    ):
        return "camera_constant", f"the frames sampled ({at}) are all the same image: a frozen or covered camera?"
    return None


def camera_notes(row: dict, members: list[tuple[str, bytes]], dataset: str, episode: int) -> list[dict]:
    """Report entries (``camera_black`` / ``camera_constant``) of an episode's RGB cameras, at convert time.

    ``row``: the episode's index row (``prepare.PreparedEpisode.row``: per camera its member, pts
    table, keyframes and kind); ``members``: its tar members (name, bytes). Depth cameras are skipped.
    """
    notes = []
    for cam in row["cameras"]:
        if cam.get("kind") == "depth" or cam.get("member") is None:
            continue
        n = int(cam["num_frames"])
        pts = (
            np.asarray(cam["pts"], dtype=np.int64)
            if len(cam["pts"])
            else cam["pts_start"] + cam["pts_step"] * np.arange(n)
        )
        found = blank_camera(members[cam["member"]][1], cam.get("stream_index"), pts, np.asarray(cam["keyframes"]))
        if found:
            notes.append(
                {"kind": found[0], "message": found[1], "dataset": dataset, "episode": episode, "camera": cam["name"]}
            )
    return notes


def _problem(shard: str, message: str, **where) -> dict:
    return {"shard": shard, **where, "message": redact(message)}  # a client's error may quote a URL


def _check_video(data: bytes, index: WindowIndex, stream: int, shard: str, key: str) -> list[dict]:
    """Decode a camera stream's video against its frame tables (``WindowIndex.frame_tables``).

    Their bounds and the row-to-frame map were checked with the index (``validate.check_index``);
    the frame count is held against the container's (``decoder.container_frames``) before a
    table of that many frames is built.
    """
    name = index.cam_names[stream].as_py()
    claimed = int(index.cam_num_frames[stream])
    stated = container_frames(data, int(index.cam_stream_index[stream]))
    if stated is not None and claimed > stated:
        message = f"the index's num_frames {claimed} is more than the {stated} frames the video's container lists"
        return [_problem(shard, message, episode=key, camera=name)]
    tables = index.frame_tables(stream)
    problem = check_frames(data, *tables, index.time_base(stream), int(index.cam_stream_index[stream]))
    if problem is None:
        if index.cam_depth[stream]:
            return []
        pts, _, keyframe = tables
        found = blank_camera(data, int(index.cam_stream_index[stream]), pts, np.flatnonzero(keyframe))
        return [] if found is None else [{**_problem(shard, found[1], episode=key, camera=name), "note": found[0]}]
    return [_problem(shard, f"the frame table disagrees with the video: {problem}", episode=key, camera=name)]


def _check_stream(blobs: dict, index: WindowIndex, signal: int, shard: str, key: str, name: str) -> list[dict]:
    """Read a stream's piece members (``read_pieces``) as the index's entry ``signal`` states them; its facts too.

    ``blobs``: flat member number -> bytes of the episode. The problem names the episode and the
    stream: the piece that does not read (type, shape, count, a timestamp not finite or
    decreasing, a first time other than the index's) or the first fact (``stream_facts``) that differs.
    """
    member = index.member_names[int(index.signal_member[signal])].as_py()
    try:
        times = read_pieces(index, signal, blobs, "").timestamps
    except FormatError as exc:
        return [_problem(shard, f"stream does not read: {exc}", episode=key, stream=name)]
    facts = stream_facts(times)
    for fact in ("t_first", "t_last", "min_interval", "max_interval"):
        said = float(getattr(index, f"signal_{fact}")[signal])
        if facts[fact] != said:
            message = f"member {member}: its samples' {fact} is {facts[fact]!r} s, the index says {said!r} s"
            return [_problem(shard, message, episode=key, stream=name)]
    return []


def _check_shard(
    storage: Storage, entry: fmt.ShardEntry, manifest: fmt.Manifest, decode: bool
) -> tuple[list[dict], WindowIndex | None]:
    """Problems of one shard, and its index when that is sound (else None)."""
    shard = entry.shard
    for name in (shard, entry.index):
        if not storage.exists(name):
            return [_problem(shard, f"missing file {storage.path(name)}")], None
    problems = []
    if storage.size(shard) != entry.size:
        problems.append(_problem(shard, f"size {storage.size(shard)} != manifest {entry.size}"))
    with storage.open(shard) as f:
        if _sha256(f) != entry.sha256:
            problems.append(_problem(shard, "sha256 differs from the manifest"))
    index_bytes = storage.read(entry.index)
    if hashlib.sha256(index_bytes).hexdigest() != entry.index_sha256:
        problems.append(_problem(shard, f"index {entry.index} sha256 differs from the manifest"))
    try:
        index = WindowIndex.read_shard_indexes([(index_bytes, storage.path(entry.index))], manifest.format_version)
        cameras = dict.fromkeys(manifest.cameras)  # per-camera episode counts are dataset-wide: not checked here
        check_index(index, [entry], cameras, storage.path(entry.index))
    except (pa.ArrowException, FormatError) as exc:
        return [*problems, _problem(shard, f"index {entry.index} does not read: {exc}")], None
    try:
        with storage.open(shard) as f, tarfile.open(fileobj=f) as tar:
            members = {m.name: m for m in tar.getmembers()}
            order = [m.name for m in tar.getmembers()]
            for episode in range(index.num_episodes):
                problems += _check_episode(f, members, order, index, shard, episode, decode)
    except tarfile.TarError as exc:
        problems.append(_problem(shard, f"tar does not parse: {exc}"))
    return problems, index


def _sha256(f) -> str:
    digest = hashlib.sha256()
    for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def _check_episode(
    f, members: dict, order: list[str], index: WindowIndex, shard: str, episode: int, decode: bool
) -> list[dict]:
    """Problems of one episode of the shard's index; its videos are decoded when ``decode``."""
    key, problems = index.key(episode), []
    numbers = index.members(episode)
    names = index.member_names.take(numbers).to_pylist()
    if any(n not in members for n in names):
        return [_problem(shard, f"members missing from the tar: {[n for n in names if n not in members]}", episode=key)]
    first = order.index(names[0])
    if order[first : first + len(names)] != names:
        problems.append(_problem(shard, "episode members are not contiguous in index order", episode=key))
    starts, stops = index.member_ranges(numbers)
    shas = index.member_sha256.take(numbers).to_pylist()
    blobs = {}
    for m, name, start, stop, sha in zip(numbers.tolist(), names, starts.tolist(), stops.tolist(), shas, strict=True):
        info = members[name]
        if (info.offset_data, info.size) != (start, stop - start):
            problems.append(
                _problem(
                    shard,
                    f"member {name} at ({info.offset_data}, {info.size}) in the tar, "
                    f"index says ({start}, {stop - start})",
                    episode=key,
                )
            )
            continue
        f.seek(start)
        blobs[m] = data = f.read(stop - start)
        if hashlib.sha256(data).hexdigest() != sha:
            problems.append(_problem(shard, f"member {name} sha256 differs from the index", episode=key))
    data = blobs.get(int(index.data_member(episode)))
    if data is not None:
        try:
            rows = pq.read_metadata(pa.BufferReader(data)).num_rows
            if rows != index.num_rows[episode]:
                problems.append(
                    _problem(shard, f"table holds {rows} rows, index says {index.num_rows[episode]}", episode=key)
                )
        except pa.ArrowException as exc:
            problems.append(_problem(shard, f"table does not read: {exc}", episode=key))
    for name, s in index.signals(episode).items():
        if all(int(m) in blobs for m in index.signal_pieces(s)[0]):
            problems += _check_stream(blobs, index, s, shard, key, name)
    if decode:
        for s in range(index.episode_cams[episode], index.episode_cams[episode + 1]):
            if int(index.stream_member[s]) in blobs:
                problems += _check_video(blobs[int(index.stream_member[s])], index, s, shard, key)
    return problems


@scrubbed  # its exceptions and their chains name no credentials
def verify(root: str, decode: bool = True, storage_options: dict | None = None, progress: bool = False) -> dict:
    """Verify the dataset at ``root``: ``{"ok", "shards", "episodes", "problems", "notes", "notes_by_kind"}``.

    ``ok``: no problem found; ``shards``, ``episodes``: counts; ``problems``: a list of dicts.

    ``notes``: cameras whose video looks black or constant (``blank_camera``; ``note``: the kind, with
    shard, episode, camera and message, as problems), counted per kind; they do not make ``ok`` false.

    ``root``: local folder or fsspec URL; ``storage_options`` merged with the environment
    (``storage.resolve_storage_options``).

    Each problem names the shard, and where it applies the episode key and camera or stream (a URL
    in its message: credentials redacted). ``progress``: a progress bar on stderr over the shards.

    Raises:
        epishard.format.opening.NotConverted (a FileNotFoundError): ``root`` is a LeRobot dataset or
            a Hugging Face repo id (``describe.lerobot_instead``: run ``epishard convert`` first).
        FileNotFoundError: no such folder or bucket. PermissionError: access denied.
        epishard.format.errors.FormatError (a ValueError): ``manifest.json`` breaks the format
            (nothing it names is opened then). NotARegularFile: it is a FIFO, directory or device.
    """
    storage = Storage(root, storage_options)
    try:
        manifest = open_manifest(storage)
    except ManifestMissing as exc:  # files, but no manifest: a report, not an error
        return {
            "ok": False,
            "shards": 0,
            "episodes": 0,
            "problems": [
                {"shard": None, "message": f"no {fmt.MANIFEST_NAME} in {exc.filename} (conversion unfinished?)"}
            ],
            "notes": [],
            "notes_by_kind": {},
        }
    problems, indexes = [], []
    for entry in tqdm(manifest.shards, unit="shard", desc="verify", disable=not progress, file=sys.stderr):
        try:
            found, index = _check_shard(storage, entry, manifest, decode)
        except NotARegularFile as exc:
            found, index = [_problem(entry.shard, str(exc))], None
        log.info("%s: %s", entry.shard, f"{len(found)} problem(s)" if found else "ok")
        problems += found
        indexes.append(index)
    problems += _check_counts(manifest, indexes)
    problems += _check_dataset_index(storage, manifest, indexes)
    notes = [p for p in problems if "note" in p]  # a black or constant camera: said, not damage
    problems = [p for p in problems if "note" not in p]
    by_kind: dict[str, int] = {}
    for n in notes:
        by_kind[n["note"]] = by_kind.get(n["note"], 0) + 1
    return {
        "ok": not problems,
        "shards": len(manifest.shards),
        "episodes": manifest.totals.episodes,
        "problems": problems,
        "notes": notes,
        "notes_by_kind": by_kind,
    }


def _check_counts(manifest: fmt.Manifest, shard_indexes: list[WindowIndex | None]) -> list[dict]:
    """The manifest's counts against what the shards hold.

    Per shard (where its index is sound): ``rows`` (the episodes' table rows) and ``frames``
    (rows x cameras, as the writer counts them); then ``totals``: shards, episodes, rows, frames
    and bytes as the shard entries add up, ``skipped`` as the report lists.
    """
    problems = []
    for i, (entry, index) in enumerate(zip(manifest.shards, shard_indexes, strict=True)):
        if index is None:
            continue
        rows = int(index.num_rows.sum())
        frames = int((index.num_rows * np.diff(index.episode_cams)).sum())
        for field, held in (("rows", rows), ("frames", frames)):
            said = getattr(entry, field)
            if said != held:
                problems.append(
                    _problem(entry.shard, f"manifest shards[{i}].{field} is {said}, the index holds {held}")
                )
    for message in totals_mismatches(manifest):
        problems.append({"shard": None, "file": fmt.MANIFEST_NAME, "message": f"manifest {message}"})
    return problems


def _check_dataset_index(
    storage: Storage, manifest: fmt.Manifest, shard_indexes: list[WindowIndex | None]
) -> list[dict]:
    """Check ``index.arrow`` against the manifest and the per-shard indexes.

    Its sha256 as in the manifest, the format's schema, values in bounds, and the same rows as the
    per-shard indexes (``shard_indexes``, None where a shard's index is unsound).
    """
    name = manifest.index.file
    where = storage.path(name)
    try:
        if not storage.exists(name):
            return [{"shard": None, "message": f"{name} is missing"}]
        data = storage.read(name)
        if hashlib.sha256(data).hexdigest() != manifest.index.sha256:
            return [{"shard": None, "message": f"{name} sha256 differs from the manifest"}]
        index = WindowIndex.read_dataset_index(pa.py_buffer(data), where, manifest.format_version)
        check_index(index, manifest.shards, manifest.camera_episodes(), where)
    except (FormatError, pa.ArrowException, NotARegularFile) as exc:
        return [{"shard": None, "message": redact(f"{name}: {exc}")}]
    sound = [ix for ix in shard_indexes if ix is not None]
    if sound and len(sound) == len(shard_indexes) and not index.equals(WindowIndex.concat_shards(sound)):
        return [{"shard": None, "message": f"{name} differs from the per-shard indexes"}]
    return []
