"""Read LeRobot datasets (v2.0, v2.1, v3.0) into ``Source`` objects, trusting files over metadata.

Layouts (from LeRobot's ``lerobot/datasets`` code and the datasets in the wild):

- v2.x: ``meta/info.json`` gives ``data_path`` / ``video_path`` templates, ``fps`` and ``features``;
  one parquet per episode and one mp4 per camera per episode; ``meta/episodes.jsonl`` and
  ``meta/tasks.jsonl`` give tasks.
- v3.0: many episodes per parquet and per mp4; ``meta/episodes/**.parquet`` gives each episode's
  data file and, per camera, its video file and ``from_timestamp``/``to_timestamp``.

Real datasets disagree with their metadata, so episodes are found from the files present (subset
copies keep the full dataset's meta), templates are matched whatever their field names, missing
``index``/``task_index``/``frame_index`` columns are accepted, and a camera declared without any file
is dropped with a note naming the path it was expected at (and a folder that looks like the
intended one). When that would drop every declared camera the dataset is refused, unless the
caller asks for state and action only (``cameras=()``).
"""

from __future__ import annotations

import difflib
import glob
import json
import os
import re

import pyarrow.parquet as pq

from .episode import CameraVideo, Episode, Source, TableSlice
from .errors import SourceError


def _template_regex(template: str) -> re.Pattern:
    """Turn a LeRobot path template (``data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet``)
    into a regex with one named group per field."""
    out, pos = [], 0
    for m in re.finditer(r"\{(\w+)(?::[^}]*)?\}", template):
        out.append(re.escape(template[pos:m.start()]))
        name = m.group(1)
        out.append(f"(?P<{name}>[^/]+)" if name == "video_key" else f"(?P<{name}>\\d+)")
        pos = m.end()
    out.append(re.escape(template[pos:]))
    return re.compile("^" + "".join(out) + "$")


def _format(template: str, fields: dict) -> str:
    names = {m.group(1) for m in re.finditer(r"\{(\w+)", template)}
    missing = names - fields.keys()
    if missing:
        raise SourceError(f"path template {template!r} uses unknown fields {sorted(missing)}")
    return template.format(**{k: v for k, v in fields.items() if k in names})


def _read_jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _camera_names(features: dict) -> list[str]:
    return [name for name, spec in features.items() if spec.get("dtype") == "video"]


def _look_alike(root: str, rel: str, taken: set[str]) -> str | None:
    """A path under ``root`` that looks like the intended one where ``rel`` first goes missing
    (``video/`` for ``videos/...``), or None. ``taken``: relative paths that are something else
    (other cameras' folders)."""
    here = ""
    for part in rel.split("/"):
        path = os.path.join(root, here, part)
        if not os.path.exists(path):
            if not os.path.isdir(os.path.join(root, here)):
                return None
            entries = [e for e in sorted(os.listdir(os.path.join(root, here))) if os.path.join(here, e) not in taken]
            match = difflib.get_close_matches(part, entries, n=1, cutoff=0.6)
            return os.path.join(here, match[0]) if match else None
        here = os.path.join(here, part)
    return None


def _dropped_cameras(root: str, declared: list[str], expected: dict[str, str], present: set[str],
                     wanted: tuple[str, ...] | None) -> list[str]:
    """Notes for declared cameras without any file; refuse when none would be left.

    ``expected``: camera -> the path (absolute) its first episode's video was looked for at
    (empty when ``wanted == ()``: videos are not looked for).

    Raises:
        SourceError: every declared camera lacks files and ``wanted`` is not ``()`` (state/action only).
    """
    # Folders on other cameras' paths are theirs, not look-alikes (ego_view is not egoview misspelt).
    taken = {os.path.join(*parts[:i]) for c in present for parts in [os.path.relpath(expected[c], root).split("/")]
             for i in range(1, len(parts) + 1)}
    notes = []
    for cam in (c for c in expected if c not in present):
        rel = os.path.relpath(expected[cam], root)
        alike = _look_alike(root, rel, taken)
        notes.append(f"camera {cam} is declared in meta/info.json but has no video files (expected e.g. {rel}, "
                     f"from video_path)" + (f"; {alike}/ exists and looks like the intended folder" if alike else ""))
    if expected and not present:
        raise SourceError(f"{root}: no declared camera has video files, so no camera would be converted: "
                          + "; ".join(notes) + ". To convert state and action only, pass --no-cameras "
                          "(ConvertOptions(cameras=())).")
    if wanted == () and declared:
        notes.append(f"cameras {', '.join(declared)} not converted: state and action only, as asked")
    return notes


def _image_features(features: dict) -> tuple[tuple[str, ...], list[str]]:
    """Image features (one PNG/JPEG per row inside the parquet) and the notes saying what becomes of them."""
    names = tuple(name for name, spec in features.items() if spec.get("dtype") == "image")
    return names, [f"image feature {name} (images inside the parquet) is converted to a camera: lossless "
                   "H.264 RGB video, every frame a keyframe; the column leaves the stored tables" for name in names]


def _depth_cameras(features: dict) -> set[str]:
    """Cameras declared depth maps (``info["video.is_depth_map"]``, LeRobot's flag)."""
    return {name for name, spec in features.items()
            if spec.get("dtype") == "video" and (spec.get("info") or {}).get("video.is_depth_map")}


def read_lerobot(root: str, name: str | None = None, cameras: tuple[str, ...] | None = None) -> Source:
    """Open a LeRobot dataset folder and describe its episodes without reading any video.

    Args:
        root: local path of the dataset (the folder holding ``meta/``).
        name: source name used in shard keys (default: the folder name).
        cameras: the cameras the conversion keeps (``ConvertOptions.cameras``): ``None`` all,
            ``()`` none (state and action only; the dataset's videos are not looked at).

    Raises:
        SourceError: no ``meta/info.json``, an unknown ``codebase_version``, no episode files, or
            no declared camera has video files (naming the expected path) unless ``cameras == ()``.
    """
    root = os.path.abspath(root)
    info_path = os.path.join(root, "meta", "info.json")
    if not os.path.exists(info_path):
        raise SourceError(f"{root}: no meta/info.json; is this a LeRobot dataset root?")
    with open(info_path) as f:
        info = json.load(f)
    version = str(info.get("codebase_version", ""))
    name = name or os.path.basename(root.rstrip("/"))
    if version.startswith("v2"):
        return _read_v2(root, name, info, cameras)
    if version.startswith("v3"):
        return _read_v3(root, name, info, cameras)
    raise SourceError(f"{info_path}: codebase_version {version!r} is not v2.0, v2.1 or v3.0")


def _v2_tasks(root: str) -> tuple[dict[int, list[str]], dict[int, str]]:
    per_episode = {
        int(row["episode_index"]): [str(t) for t in row.get("tasks", [])]
        for row in _read_jsonl(os.path.join(root, "meta", "episodes.jsonl"))
    }
    by_index = {
        int(row["task_index"]): str(row["task"]) for row in _read_jsonl(os.path.join(root, "meta", "tasks.jsonl"))
    }
    return per_episode, by_index


def _read_v2(root: str, name: str, info: dict, wanted: tuple[str, ...] | None) -> Source:
    fps = float(info["fps"])
    data_re = _template_regex(info["data_path"])
    video_template = info.get("video_path") or ""
    found: dict[int, tuple[str, dict]] = {}
    for path in sorted(glob.glob(os.path.join(root, "**", "*.parquet"), recursive=True)):
        m = data_re.match(os.path.relpath(path, root))
        if m:
            fields = {k: int(v) for k, v in m.groupdict().items()}
            found[fields["episode_index"]] = (path, fields)
    if not found:
        raise SourceError(f"{root}: no data file matches data_path {info['data_path']!r}")
    per_episode_tasks, task_text = _v2_tasks(root)
    declared = _camera_names(info.get("features", {}))
    depth = _depth_cameras(info.get("features", {}))
    video_of: dict[str, dict[int, str]] = {}
    expected: dict[str, str] = {}
    for cam in declared if wanted != () else []:
        paths = {}
        for ep, (_, fields) in found.items():
            path = os.path.join(root, _format(video_template, {**fields, "video_key": cam}))
            expected.setdefault(cam, path)
            if os.path.exists(path):
                paths[ep] = path
        video_of[cam] = paths
    cameras = [cam for cam in expected if video_of[cam]]
    notes = _dropped_cameras(root, declared, expected, set(cameras), wanted)
    images, image_notes = _image_features(info.get("features", {}))
    notes += image_notes
    episodes = []
    for ep in sorted(found):
        path, _ = found[ep]
        tasks = per_episode_tasks.get(ep) or ([task_text[0]] if len(task_text) == 1 else [])
        videos = {cam: CameraVideo(video_of[cam][ep], depth=cam in depth) for cam in cameras if ep in video_of[cam]}
        # A camera missing for this episode only is left out here and reported by the writer.
        extra = {"missing_cameras": [cam for cam in cameras if ep not in video_of[cam]], "task_text": task_text}
        episodes.append(
            Episode(source=name, episode_index=ep, table=path, videos=videos, fps=fps, tasks=tuple(tasks),
                    robot=str(info.get("robot_type") or ""), extra=extra, images=images)
        )
    declared = int(info.get("total_episodes", len(episodes)))
    if declared != len(episodes):
        notes.append(f"meta/info.json declares {declared} episodes; {len(episodes)} have data files and are converted")
    return Source(name=name, episodes=episodes, fps=fps, path=root, format=f"lerobot-{info['codebase_version']}",
                  features=info.get("features", {}), notes=notes)


def _read_v3(root: str, name: str, info: dict, wanted: tuple[str, ...] | None) -> Source:
    fps = float(info["fps"])
    meta_files = sorted(glob.glob(os.path.join(root, "meta", "episodes", "**", "*.parquet"), recursive=True))
    if not meta_files:
        raise SourceError(f"{root}: LeRobot v3.0 dataset without meta/episodes/*.parquet")
    rows = [row for path in meta_files for row in pq.read_table(path).to_pylist()]
    task_text = {}
    tasks_path = os.path.join(root, "meta", "tasks.parquet")
    if os.path.exists(tasks_path):
        t = pq.read_table(tasks_path)
        text_col = "task" if "task" in t.column_names else next(c for c in t.column_names if c != "task_index")
        task_text = dict(zip(t.column("task_index").to_pylist(), map(str, t.column(text_col).to_pylist())))
    declared = _camera_names(info.get("features", {}))
    cameras = declared if wanted != () else []
    depth = _depth_cameras(info.get("features", {}))
    images, image_notes = _image_features(info.get("features", {}))
    data_ranges: dict[str, dict[int, tuple[int, int]]] = {}

    def ranges_in(path: str) -> dict[int, tuple[int, int]]:
        # Episode row ranges from the file's own episode_index column, not from global indices.
        if path not in data_ranges:
            col = pq.read_table(path, columns=["episode_index"]).column("episode_index")
            values = col.to_numpy()
            ranges: dict[int, tuple[int, int]] = {}
            change = [0] + [i for i in range(1, len(values)) if values[i] != values[i - 1]] + [len(values)]
            for a, b in zip(change[:-1], change[1:]):
                ep = int(values[a])
                if ep in ranges:
                    raise SourceError(f"{path}: rows of episode {ep} are not contiguous")
                ranges[ep] = (a, b)
            data_ranges[path] = ranges
        return data_ranges[path]

    file_seconds: dict[str, float] = {}
    files_of: dict[str, list[str]] = {cam: [] for cam in cameras}
    for row in rows:
        for cam in cameras:
            key = f"videos/{cam}/to_timestamp"
            if key in row and row[key] is not None:
                path = _video_path(root, info, cam, row)
                file_seconds[path] = max(file_seconds.get(path, 0.0), float(row[key]))
                files_of[cam].append(path)
    present = {cam for cam in cameras if any(os.path.exists(p) for p in files_of[cam])}
    # A camera meta/episodes gives no file for: the template, its chunk and file fields unfilled.
    expected = {cam: files_of[cam][0] if files_of[cam] else
                os.path.join(root, (info.get("video_path") or "").replace("{video_key}", cam)) for cam in cameras}
    notes = _dropped_cameras(root, declared, expected, present, wanted) + image_notes
    episodes = []
    for row in rows:
        ep = int(row["episode_index"])
        data_path = os.path.join(root, _format(info["data_path"], {
            "chunk_index": row["data/chunk_index"], "file_index": row["data/file_index"],
            "episode_chunk": row["data/chunk_index"], "episode_index": ep}))
        if not os.path.exists(data_path):
            continue
        if ep not in ranges_in(data_path):
            notes.append(f"episode {ep}: meta/episodes lists it in {data_path} but the file has no rows for it; skipped")
            continue
        start, stop = ranges_in(data_path)[ep]
        videos, missing = {}, []
        for cam in cameras:
            if cam not in present:
                continue
            path = _video_path(root, info, cam, row)
            if os.path.exists(path):
                seg = (float(row[f"videos/{cam}/from_timestamp"]), float(row[f"videos/{cam}/to_timestamp"]))
                videos[cam] = CameraVideo(path, segment=seg, file_seconds=file_seconds.get(path), depth=cam in depth)
            else:
                missing.append(cam)
        tasks = tuple(str(t) for t in (row.get("tasks") or []))
        episodes.append(
            Episode(source=name, episode_index=ep, table=TableSlice(data_path, start, stop), videos=videos, fps=fps,
                    tasks=tasks, robot=str(info.get("robot_type") or ""),
                    extra={"missing_cameras": missing, "task_text": task_text}, images=images)
        )
    if not episodes:
        raise SourceError(f"{root}: none of the episodes in meta/episodes has its data file present")
    declared = int(info.get("total_episodes", len(episodes)))
    if declared != len(episodes):
        notes.append(f"meta/info.json declares {declared} episodes; {len(episodes)} have data files and are converted")
    episodes.sort(key=lambda e: e.episode_index)
    return Source(name=name, episodes=episodes, fps=fps, path=root, format=f"lerobot-{info['codebase_version']}",
                  features=info.get("features", {}), notes=notes)


def _video_path(root: str, info: dict, cam: str, row: dict) -> str:
    chunk = row.get(f"videos/{cam}/chunk_index")
    file = row.get(f"videos/{cam}/file_index")
    return os.path.join(root, _format(info.get("video_path") or "", {
        "video_key": cam, "chunk_index": chunk, "file_index": file, "episode_chunk": chunk,
        "episode_index": int(row["episode_index"])}))

