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

The optional meta files (statistics, tasks) are read as LeRobot reads them for the dataset's
version, and a missing or unusable one is a documented fallback, a counted warning of the
conversion report (``Source.warnings``: ``stats_fallback``, ``stats_ignored``, ``tasks_fallback``;
``_source_stats``, ``_v2_tasks``, ``_v3_task_fields``; docs/guide/converting.md, "LeRobot metadata").
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import functools
import glob
import io
import json
import math
import os
import re
import string
import urllib.parse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epishard.format import untrusted
from epishard.format.storage import FileSystemHandle, Location, RemoteFile, is_local, local_path, protocol_of
from epishard.redact import redact, scrubbed

from .episode import CameraVideo, Episode, FileInput, Source, TableSlice, bounded_parquet
from .errors import SourceError
from .sources import bounds

__all__ = [
    "STATS_JSON",
    "read_lerobot",
]


class _Tree:
    """The files of a dataset folder, local or behind an fsspec URL, addressed by full path.

    Full path: ``root/<relative path>``, the form messages show.

    A remote folder is listed once, recursively (one paginated listing on an object store, one
    request per folder over HTTP: the server must serve directory listings) and questions about it
    are answered from that listing; its files become ``RemoteFile``s, read through range requests.
    Hidden files and folders (a leading dot) are left out, as ``glob`` leaves them out locally.

    A local file is read only when it resolves inside the dataset's folder (symbolic links followed;
    a Hub cache snapshot's links into its ``blobs``: ``sources.bounds.source_folder``), unless
    ``allow_external``, and only when it is a regular file (a FIFO, a device, ``/proc``: refused from
    ``stat``, never opened): ``checked``.
    """

    def __init__(self, root: str, storage_options: dict | None, allow_external: bool = False):
        self.local = is_local(root)
        self.allow_external = allow_external
        self._vouched: set[str] = set()  # local paths ``checked`` passed (v3.0: many episodes share a file)
        self.whole_reads: list[str] = []  # remote files read whole: the server ignores Range
        if self.local:
            self.root = local_path(root)
            return
        self.location = Location.of(root, storage_options)  # the options resolved, the retry policy: once
        self.root = self.location.url
        handle = FileSystemHandle(self.location)
        self.fs, self._base = handle.get(), handle.root.rstrip("/")
        self.sizes: dict[str, int | None] = {}  # None: the listing gives no size (HTTP)
        if protocol_of(self.root) in ("http", "https"):
            self._reach()
        try:
            listing = self.fs.find(self._base, detail=True)
        except OSError as exc:  # s3fs: "Access Denied", a missing bucket, naming nothing
            if exc.filename is not None:
                raise
            what = "access denied" if isinstance(exc, PermissionError) else "cannot be listed"
            raise type(exc)(exc.errno or errno.EIO, redact(f"{what} ({exc})"), redact(self.root)) from exc
        for path, entry in listing.items():
            rel = path[len(self._base) :].strip("/")
            if entry.get("type", "file") == "file" and not any(p.startswith(".") for p in rel.split("/")):
                size = entry.get("size")
                self.sizes[f"{self.root}/{rel}"] = None if size is None else int(size)
        self.dirs = {path.rsplit("/", n)[0] for path in self.sizes for n in range(1, path.count("/") + 1)}

    def _reach(self) -> None:
        """List the HTTP root once within the location's retry policy (``RetryPolicy.call``).

        fsspec's ``find`` takes a refused or reset connection for an empty folder, so without this a
        dead server read as a dataset without ``meta/info.json``. A 404 is left to ``find``.

        Raises:
            RetryBudgetExceeded: the server still does not answer when the budget is spent.
        """
        with contextlib.suppress(FileNotFoundError):
            self.location.retry.call(lambda: self.fs.ls(self._base, detail=False), redact(self.root))

    def exists(self, path: str) -> bool:
        return os.path.exists(path) if self.local else path in self.sizes or path in self.dirs

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path) if self.local else path in self.dirs

    def listdir(self, path: str) -> list[str]:
        if self.local:
            return sorted(os.listdir(path))
        return sorted({p[len(path) + 1 :].split("/")[0] for p in self.sizes if p.startswith(path + "/")})

    def find(self, folder: str, suffix: str) -> list[str]:
        """Full paths of the files under ``folder`` (recursively) whose names end with ``suffix``.

        ``folder`` is a path, never a pattern: ``[``, ``]``, ``*``, ``?`` in it are its own characters.
        """
        if self.local:
            pattern = os.path.join(glob.escape(folder), "**", "*" + glob.escape(suffix))
            return sorted(glob.glob(pattern, recursive=True))
        return sorted(p for p in self.sizes if p.startswith(folder + "/") and p.endswith(suffix))

    def checked(self, path: str) -> str:
        """``path`` when the dataset may read it (see the class); a path not there at all is left to the caller.

        Raises:
            SourceError: it resolves outside the dataset's folder (without ``allow_external``), or
                is not a regular file, naming the path and where it resolves.
        """
        if path in self._vouched or not os.path.lexists(path):
            return path
        try:
            if self.allow_external:
                bounds.check_local_file(path, None, SourceError)
            else:
                bounds.confine(path, self.root, path, SourceError)
        except SourceError as exc:
            outside = "outside the source folder" in str(exc) and not self.allow_external
            hint = "; for a trusted local dataset pass --allow-external" if outside else ""
            raise SourceError(f"{exc}{hint}") from None
        self._vouched.add(path)
        return path

    def read(self, path: str) -> bytes:
        if self.local:
            with open(self.checked(path), "rb") as f:
                return f.read()
        return self._remote(path).read()

    def read_metadata(self, path: str) -> bytes:
        """A JSON metadata file's bytes, refused unread when larger than ``untrusted.MAX_JSON_BYTES``.

        The size comes from the file system (locally) or the listing (remotely; a listing that
        states none: after the read). Raises SourceError naming the file.
        """
        if self.local:
            return untrusted.read_local(self.checked(path), path, SourceError)
        untrusted.check_size(self.sizes.get(path), path, SourceError)
        data = self._remote(path).read()
        untrusted.check_size(len(data), path, SourceError)
        return data

    def file(self, path: str) -> FileInput:
        """What an episode refers to the file by: the local path (``checked``), or a ``RemoteFile``."""
        return self.checked(path) if self.local else self._remote(path)

    def _remote(self, path: str) -> RemoteFile:
        return RemoteFile(path, self.sizes.get(path), self.location)

    def parquet(self, path: str, columns: list[str] | None = None):
        """The Parquet table at ``path`` (``columns`` only); read through range requests when remote.

        A server that ignores ``Range`` (``python -m http.server``) cannot serve a range read: the
        file is then read whole, and recorded in ``whole_reads`` (a source note says so).
        """
        if self.local:
            return bounded_parquet(self.checked(path), path, SourceError, columns)
        with self._remote(path).open() as f:
            if isinstance(f, io.BytesIO):  # RemoteFile.open read it whole: the server ignores Range
                self.whole_reads.append(path)
            return bounded_parquet(f, path, SourceError, columns)

    def whole_read_notes(self) -> list[str]:
        """A note naming the files read whole because the server ignores ``Range`` (none: [])."""
        if not self.whole_reads:
            return []
        shown = [p.removeprefix(self.root + "/") for p in dict.fromkeys(self.whole_reads)]
        more = f" and {len(shown) - 3} more" if len(shown) > 3 else ""
        return [
            f"the server ignores Range requests (e.g. python -m http.server): {len(shown)} file(s) read whole instead "
            f"({', '.join(shown[:3])}{more}); a server that honours Range reads only what is needed"
        ]


def _template_regex(template: str) -> re.Pattern:
    """Turn a LeRobot path template into a regex with one named group per field.

    E.g. ``data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet``.
    """
    out, pos = [], 0
    for m in re.finditer(r"\{(\w+)(?::[^}]*)?\}", template):
        out.append(re.escape(template[pos : m.start()]))
        name = m.group(1)
        out.append(f"(?P<{name}>[^/]+)" if name == "video_key" else f"(?P<{name}>\\d+)")
        pos = m.end()
    out.append(re.escape(template[pos:]))
    return re.compile("^" + "".join(out) + "$")


@functools.lru_cache(maxsize=64)
def _template_fields(template: str) -> frozenset[str]:
    return frozenset(m.group(1) for m in re.finditer(r"\{(\w+)", template))


def _format(template: str, fields: dict) -> str:
    names = _template_fields(template)
    missing = names - fields.keys()
    if missing:
        raise SourceError(f"meta/info.json: path template {template!r} uses unknown fields {sorted(missing)}")
    try:
        return template.format(**{k: v for k, v in fields.items() if k in names})
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise SourceError(f"meta/info.json: path template {template!r} cannot be filled with {fields}: {exc}") from None


def _read_jsonl(tree: _Tree, path: str, fields: dict[str, type]) -> list[dict] | None:
    """Rows of a JSON-lines file (None if it is absent), each an object with typed ``fields``.

    ``fields``: name -> type (``list`` means a list of strings). The file is bounded as every
    metadata file (``_Tree.read_metadata``: ``untrusted.MAX_JSON_BYTES``; each line's nesting:
    ``untrusted.loads``). Raises SourceError naming file and line.
    """
    if not tree.exists(path):
        return None
    rows = []
    try:
        lines = tree.read_metadata(path).decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise SourceError(f"{path}: not UTF-8 text ({exc})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        row = untrusted.loads(line, f"{path}: line {number}", SourceError)  # bounded nesting
        if not isinstance(row, dict):
            raise SourceError(f"{path}: line {number}: must be a JSON object, got {line.strip()[:60]}")
        for name, kind in fields.items():
            value = row.get(name)
            if kind is list and value is not None and not _is_list_of_str(value):
                raise SourceError(f"{path}: line {number}: {name} must be a list of strings, got {value!r:.60}")
            if kind is not list and (not isinstance(value, kind) or isinstance(value, bool)):
                raise SourceError(f"{path}: line {number}: {name} must be a JSON {kind.__name__}, got {value!r:.60}")
        rows.append(row)
    return rows


def _is_list_of_str(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_finite_number(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _inside_folder(relative_path: str) -> bool:
    """Whether a path from the metadata stays inside the dataset folder (relative, no ``..``)."""
    return not os.path.isabs(relative_path) and ".." not in relative_path.split("/")


def _is_template(template: str) -> bool:
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError:  # unbalanced braces
        return False
    return all(name.isidentifier() for name in fields)


def _check_info(info, path: str) -> None:
    """Refuse a ``meta/info.json`` whose fields the reader relies on have a wrong type or value.

    Raises SourceError naming the file, the field and the value: the document is not an object;
    ``fps`` is not a finite number > 0; ``codebase_version`` or ``data_path`` is not a non-empty
    string (v2.x: ``data_path`` must use ``{episode_index}``); a path template is absolute or climbs
    out of the dataset folder (``..``); ``video_path`` is not a string while
    a video feature is declared; ``features`` is not an object of objects; ``total_episodes`` is
    not an integer >= 0; ``robot_type`` is not a string.
    """

    def bad(field: str, must: str, value) -> SourceError:
        return SourceError(f"{path}: {field} must be {must}, got {json.dumps(value)[:60]}")

    if not isinstance(info, dict):
        raise bad("the document", "a JSON object", info)
    fps = info.get("fps")
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not math.isfinite(fps) or fps <= 0:
        raise bad("fps", "a positive number (frames per second)", fps)
    for field in ("codebase_version", "data_path"):
        if not isinstance(info.get(field), str) or not info[field]:
            raise bad(field, "a non-empty string", info.get(field))
    for field in ("data_path", "video_path"):
        if isinstance(info.get(field), str) and not _is_template(info[field]):
            raise bad(field, "a path template with named fields like {episode_index:06d}", info[field])
        if isinstance(info.get(field), str) and not _inside_folder(info[field]):
            raise bad(field, "a path inside the dataset folder (relative, no '..')", info[field])
    if info["codebase_version"].startswith("v2") and "{episode_index" not in info["data_path"]:
        raise bad("data_path", "a template with {episode_index}", info["data_path"])
    features = info.get("features", {})
    if not isinstance(features, dict) or not all(isinstance(spec, dict) for spec in features.values()):
        raise bad("features", "an object of feature objects", features)
    if _camera_names(features) and not (isinstance(info.get("video_path"), str) and info["video_path"]):
        raise bad("video_path", "a non-empty string when video features are declared", info.get("video_path"))
    total = info.get("total_episodes", 0)
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise bad("total_episodes", "an integer >= 0", total)
    if not isinstance(info.get("robot_type") or "", str):
        raise bad("robot_type", "a string", info["robot_type"])


def _camera_names(features: dict) -> list[str]:
    return [name for name, spec in features.items() if spec.get("dtype") == "video"]


def _check_wanted(features: dict, wanted: tuple[str, ...] | None, root: str) -> None:
    """Refuse camera names (``--cameras``) that the dataset does not declare, listing the ones it has.

    Raises:
        SourceError: some of ``wanted`` are neither video nor image features of ``meta/info.json``.
    """
    have = [name for name, spec in features.items() if spec.get("dtype") in ("video", "image")]
    unknown = [c for c in wanted or () if c not in have]
    if unknown:
        raise SourceError(
            f"{root}: camera {', '.join(unknown)} is not in this dataset (--cameras takes full feature "
            f"names); its cameras: {', '.join(have) or 'none'}"
        )


def _look_alike(tree: _Tree, rel: str, taken: set[str]) -> str | None:
    """A path under ``root`` that looks like the intended one where ``rel`` first goes missing, or None.

    E.g. ``video/`` for ``videos/...``. ``taken``: relative paths that are something else (other
    cameras' folders).
    """
    here, root = "", tree.root
    for part in rel.split("/"):
        path = os.path.join(root, here, part)
        if not tree.exists(path):
            folder = os.path.join(root, here).rstrip("/")
            if not tree.isdir(folder):
                return None
            entries = [e for e in tree.listdir(folder) if os.path.join(here, e) not in taken]
            match = difflib.get_close_matches(part, entries, n=1, cutoff=0.6)
            return os.path.join(here, match[0]) if match else None
        here = os.path.join(here, part)
    return None


def _dropped_cameras(
    tree: _Tree,
    declared: list[str],
    expected: dict[str, str],
    present: set[str],
    wanted: tuple[str, ...] | None,
    looked: dict[str, list[str]] | None = None,
) -> list[str]:
    """Notes for declared cameras without any file; refuse when none would be left.

    ``expected``: camera -> the path (absolute) its first episode's video was looked for at
    (empty when ``wanted == ()``: videos are not looked for). ``looked``: camera -> every path
    (absolute) looked for, of the episodes whose data file is there; the refusal names them.

    Raises:
        SourceError: every declared camera lacks files and ``wanted`` is not ``()`` (state/action only).
    """
    # Folders on other cameras' paths are theirs, not look-alikes (ego_view is not egoview misspelt).
    root = tree.root
    taken = {
        os.path.join(*parts[:i])
        for c in present
        for parts in [os.path.relpath(expected[c], root).split("/")]
        for i in range(1, len(parts) + 1)
    }
    notes, refusal = [], []
    for cam in (c for c in expected if c not in present):
        rel = os.path.relpath(expected[cam], root)
        alike = _look_alike(tree, rel, taken)
        notes.append(
            f"camera {cam} is declared in meta/info.json but has no video files (expected e.g. {rel}, "
            f"from video_path)" + (f"; {alike}/ exists and looks like the intended folder" if alike else "")
        )
        paths = sorted(set((looked or {}).get(cam, [])))
        refusal.append(notes[-1] + (f"; looked for {_files(paths, root)}" if paths else ""))
    if expected and not present:
        raise SourceError(
            f"{root}: no declared camera has video files, so no camera would be converted: "
            + "; ".join(refusal)
            + ". To convert state and action only, pass --no-cameras "
            "(ConvertOptions(cameras=()))."
        )
    if wanted == () and declared:
        notes.append(f"cameras {', '.join(declared)} not converted: state and action only, as asked")
    return notes


def _files(paths: list[str], root: str, most: int = 4) -> str:
    """``paths`` (absolute, under ``root``) for a message: the first ``most`` relative, then how many more."""
    rel = [os.path.relpath(p, root) for p in paths]
    some = ", ".join(rel[:most]) + (f" and {len(rel) - most} more" if len(rel) > most else "")
    return f"{len(rel)} file{'s' if len(rel) != 1 else ''}: {some}"


def _image_features(features: dict, wanted: tuple[str, ...] | None) -> tuple[tuple[str, ...], list[str]]:
    """Image features (one PNG/JPEG per row inside the parquet) and notes on what becomes of them.

    The ones converted (all, or those in ``wanted``: the others are not read).
    """
    names = tuple(name for name, spec in features.items() if spec.get("dtype") == "image")
    return names, [
        f"image feature {name} (images inside the parquet) is converted to a camera: lossless "
        "H.264 RGB video, every frame a keyframe (or the --reencode settings; 16-bit grey images: lossless "
        "FFV1, a depth camera); the column leaves the stored tables"
        for name in names
        if wanted is None or name in wanted
    ]


def _depth_cameras(features: dict) -> set[str]:
    """Cameras declared depth maps (LeRobot's flag ``video.is_depth_map``).

    The flag is under the feature's ``info``, or ``video_info`` as LeRobot v2.0 and many converted
    datasets, v2.1 and v3.0 too, write it.
    """
    return {
        name
        for name, spec in features.items()
        if spec.get("dtype") == "video"
        and any((spec.get(key) or {}).get("video.is_depth_map") for key in ("info", "video_info"))
    }


@scrubbed  # its exceptions and their chains name no credentials
def read_lerobot(
    root: str,
    name: str | None = None,
    cameras: tuple[str, ...] | None = None,
    storage_options: dict | None = None,
    episodes: frozenset[int] | None = None,
    allow_external: bool = False,
) -> Source:
    """Open a LeRobot dataset folder and describe its episodes without reading any video.

    Args:
        root: the dataset (the folder holding ``meta/``): a local path or any fsspec URL
            (``s3://bucket/raw/g1``, ``https://host/g1``, ``hf://datasets/<user>/<repo>``). A
            remote folder is listed once (see ``_Tree``; an HTTP server must serve directory
            listings); its files are read through range requests, never copied to disk.
        name: source name used in shard keys (default: the folder name).
        cameras: the cameras the conversion keeps (``ConvertOptions.cameras``): ``None`` all,
            ``()`` none (state and action only; the dataset's videos are not looked at).
        storage_options: for a URL, fsspec options merged with the environment's once, when the
            root is opened (``epishard.format.storage.Location``).
        allow_external: read local files that resolve outside the dataset's folder (symbolic links
            out of it; ``SourceOptions.allow_external``); special files are refused even then.
        episodes: the episode indices to describe (``ConvertOptions.episodes``; None: all).
            ``Source.episodes`` then lists only those of them the dataset has; everything else
            (the checks of ``meta/episodes``, the notes, the episode count, the errors) is as
            without it. Of a v3.0 ``meta/episodes``, only the selected rows become Python
            objects: the rest is checked and looked up column by column, so opening a selection
            costs about the same whatever the number of episodes the dataset lists.

    Returns:
        The ``Source``; ``stats`` / ``stats_from``: the statistics LeRobot normalises with for this
        version and the file they came from (``_source_stats``: never a reason to refuse the
        dataset); ``warnings``: the fallbacks taken (statistics, task files).

    Raises:
        SourceError: no ``meta/info.json``, one that is not valid JSON or has fields of the wrong
            type or value (``_check_info``), an unknown ``codebase_version``, malformed
            episodes/tasks metadata (a v3.0 dataset without ``meta/episodes/*.parquet``), a JSON
            file larger than ``untrusted.MAX_JSON_BYTES`` or nested deeper than
            ``untrusted.MAX_JSON_DEPTH``, no episode files, or no declared camera has video files
            (naming the expected path) unless ``cameras == ()``. Messages name the file and field.
    """
    tree = _Tree(root, storage_options, allow_external)
    root = tree.root
    info_path = os.path.join(root, "meta", "info.json")
    if not tree.exists(info_path):
        http = protocol_of(root) in ("http", "https")
        listed = " (the server listed no files: are directory listings on?)" if http and not tree.sizes else ""
        if http and any(c in root for c in "?# "):  # a folder name's characters, not URL syntax
            listed += "; in a URL a folder name's '?', '#' and spaces are written %3F, %23 and %20"
        raise SourceError(f"{root}: no meta/info.json; is this a LeRobot dataset root?{listed}")
    info = untrusted.loads(tree.read_metadata(info_path), info_path, SourceError)  # bounded size and nesting
    _check_info(info, info_path)
    _check_wanted(info.get("features", {}), cameras, root)
    version = str(info.get("codebase_version", ""))
    # The name goes into episode keys, the index and the manifest: never a URL's credentials.
    name = name or os.path.basename(redact(root).rstrip("/"))
    if protocol_of(root) in ("http", "https"):  # the folder's name, not its URL spelling (%20, %5B)
        name = urllib.parse.unquote(name)
    if version.startswith("v2"):
        source = _read_v2(tree, name, info, cameras, episodes)
    elif version.startswith("v3"):
        source = _read_v3(tree, name, info, cameras, episodes)
    else:
        raise SourceError(f"{info_path}: codebase_version {version!r} is not v2.0, v2.1 or v3.0")
    source.stats, source.stats_from = _source_stats(tree, version, source.warnings)
    return source


STATS_JSON = "meta/stats.json"
EPISODES_STATS = "meta/episodes_stats.jsonl"
V3_STATS_COLUMNS = "meta/episodes/*.parquet stats/ columns"


def _source_stats(tree: _Tree, version: str, warnings: list[dict]) -> tuple[dict | None, str | None]:
    """The dataset's own normalisation statistics, chosen as LeRobot chooses them, and where they came from.

    Kept in the manifest (``sources[].stats``, ``sources[].stats_from``) so the LeRobot drop-in
    hands LeRobot what LeRobot itself would normalise with. Tried in this order
    (docs/guide/converting.md, "LeRobot metadata"):

    - v2.0: ``meta/stats.json`` (LeRobot 0.3's ``LeRobotDatasetMetadata.load_metadata``: below
      v2.1, ``load_stats``), then ``meta/episodes_stats.jsonl`` aggregated.
    - v2.1: ``meta/episodes_stats.jsonl`` aggregated with LeRobot's ``aggregate_stats``
      (``_aggregate_stats``), as LeRobot 0.3's loader does from v2.1 on and LeRobot 0.4's v2.1 to
      v3.0 converter does (``convert_episodes_metadata`` writes the v3.0 ``stats.json`` from it),
      then ``meta/stats.json``.
    - v3.0: ``meta/stats.json`` (LeRobot 0.4's ``load_stats``), then the per-episode
      ``stats/<feature>/<statistic>`` columns of ``meta/episodes/*.parquet`` aggregated.

    Files passed over (absent, or unusable: not feature -> statistic -> numbers, ragged, without
    what ``aggregate_stats`` needs, past ``untrusted.MAX_JSON_BYTES``) make one ``stats_fallback``
    entry of ``warnings`` naming the folder, the files and what was used instead; when none serves,
    no statistics (the drop-in then takes epishard's, over the converted episodes). A v2.x file of
    the other kind that is there but not read (a v2.1 ``stats.json``: LeRobot does not read it, its
    v2.0 to v2.1 converter deletes it) is a ``stats_ignored`` entry.

    Returns:
        (feature -> statistic -> numbers or nested lists, or None; where they came from, relative to
        the dataset folder, e.g. ``meta/episodes_stats.jsonl (aggregated over 50 episodes)``, or None).
    """
    root = tree.root
    loaders = {
        STATS_JSON: lambda: _stats_json(tree, os.path.join(root, STATS_JSON)),
        EPISODES_STATS: lambda: _episodes_stats(tree, os.path.join(root, EPISODES_STATS)),
        V3_STATS_COLUMNS: lambda: _v3_column_stats(tree),
    }
    if version.startswith("v3"):
        order = [STATS_JSON, V3_STATS_COLUMNS]
    elif _from_v21(version):
        order = [EPISODES_STATS, STATS_JSON]
    else:
        order = [STATS_JSON, EPISODES_STATS]
    passed: list[str] = []  # the sources of statistics passed over, and why
    stats, described = None, None
    for what in order:
        try:
            got = loaders[what]()
        except SourceError as exc:
            passed.append(f"{what} is unusable ({exc})")
            continue
        except (ValueError, TypeError, OverflowError, RecursionError, pa.ArrowException) as exc:  # a stranger's file
            passed.append(f"{what} is unusable ({type(exc).__name__}: {str(exc)[:200]})")
            continue
        if got is None:
            passed.append(_ABSENT[what])
            continue
        stats, described = got
        break
    preferred, other = order
    if passed:
        instead = (
            f"the source statistics are {described} instead"
            if described is not None
            else "no source statistics are stored (the LeRobot drop-in uses epishard's, over the episodes "
            "converted: stats_from 'manifest')"
        )
        message = f"{root}: LeRobot {version} normalises with {_RULE[preferred]}, but {'; '.join(passed)}; {instead}"
        warnings.append({"kind": "stats_fallback", "message": message, "file": os.path.join(root, preferred)})
    elif version.startswith("v2") and tree.exists(os.path.join(root, other)):
        why = " (its v2.0 to v2.1 converter deletes it)" if other == STATS_JSON else ""
        rule = _RULE[preferred]
        message = f"{root}: {other} is not used: LeRobot {version} normalises with {rule} and does not read it{why}"
        warnings.append({"kind": "stats_ignored", "message": message, "file": os.path.join(root, other)})
    return stats, described


_RULE = {
    STATS_JSON: STATS_JSON,
    EPISODES_STATS: f"the aggregate of {EPISODES_STATS} (aggregate_stats)",
}
_ABSENT = {
    STATS_JSON: f"{STATS_JSON} is absent",
    EPISODES_STATS: f"{EPISODES_STATS} is absent",
    V3_STATS_COLUMNS: "meta/episodes/*.parquet have no stats/ columns",
}


def _from_v21(version: str) -> bool:
    """Whether a v2.x ``codebase_version`` is v2.1 or later (LeRobot: ``packaging.version`` order; ``v2``: v2.0)."""
    m = re.match(r"v2\.(\d+)", version)
    return m is not None and int(m.group(1)) >= 1


def _stats_json(tree: _Tree, path: str) -> tuple[dict, str] | None:
    """``meta/stats.json`` as it is (None when absent), and ``STATS_JSON``.

    Raises:
        SourceError: larger than ``untrusted.MAX_JSON_BYTES``, not JSON, or not feature -> statistic
            -> numbers (naming the file).
    """
    if not tree.exists(path):
        return None
    doc = untrusted.loads(tree.read_metadata(path), path, SourceError)
    if not _is_stats(doc):
        raise SourceError(f"{path}: not feature -> statistic -> numbers")
    return doc, STATS_JSON


def _is_stats(doc) -> bool:
    """Whether ``doc`` is feature -> statistic -> a number or nested lists of numbers."""
    return isinstance(doc, dict) and all(
        isinstance(v, dict) and all(_numbers(x) for x in v.values()) for v in doc.values()
    )


def _episodes_stats(tree: _Tree, path: str) -> tuple[dict, str] | None:
    """The aggregate of a v2.x ``meta/episodes_stats.jsonl`` (None when absent), and where it came from.

    Each line ``{"episode_index": int, "stats": feature -> statistic -> numbers}``; read as LeRobot
    reads it (``legacy_load_episodes_stats``: by episode_index, a later line for the same episode
    wins) and aggregated over every episode it lists (``_aggregate_stats``), as LeRobot does, whether
    or not the folder has their data files. Bounded: ``untrusted.MAX_JSON_BYTES`` for the file,
    ``bounds.MAX_EPISODES`` lines.

    Raises:
        SourceError: too large, a line that is not such an object, no line, or statistics
            ``aggregate_stats`` cannot aggregate (naming the file and the episode).
    """
    rows = _read_jsonl(tree, path, {"episode_index": int})
    if rows is None:
        return None
    if len(rows) > bounds.MAX_EPISODES:
        raise SourceError(f"{path}: {len(rows)} lines, more than the {bounds.MAX_EPISODES} episodes a source may list")
    by_episode: dict[int, dict] = {}
    for row in sorted(rows, key=lambda r: r["episode_index"]):
        if not _is_stats(row.get("stats")):
            raise SourceError(
                f"{path}: episode_index {row['episode_index']}: stats must be feature -> statistic -> numbers, "
                f"got {json.dumps(row.get('stats'))[:60]}"
            )
        by_episode[row["episode_index"]] = row["stats"]
    if not by_episode:
        raise SourceError(f"{path}: no line")
    stats = _aggregate_stats(list(by_episode.values()), path)
    return stats, f"{EPISODES_STATS} (aggregated over {len(by_episode)} episodes)"


def _v3_column_stats(tree: _Tree) -> tuple[dict, str] | None:
    """The aggregate of the ``stats/<feature>/<statistic>`` columns of a v3.0 ``meta/episodes`` (None: none).

    LeRobot v3.0 writes each episode's statistics there besides ``meta/stats.json``. Rows in
    episode_index order; a feature whose columns are null in a row is not in that episode's
    statistics. Aggregated as ``_episodes_stats``.

    Raises:
        SourceError: unreadable files, or statistics ``aggregate_stats`` cannot aggregate.
    """
    folder = os.path.join(tree.root, "meta", "episodes")
    per_row: list[tuple[int, dict]] = []
    for path in tree.find(folder, ".parquet"):
        table = _read_parquet(tree, path)
        columns = [c for c in table.column_names if c.startswith("stats/") and c.count("/") >= 2]
        if not columns or "episode_index" not in table.column_names:
            continue
        episodes = table.column("episode_index").to_pylist()
        values = {c: table.column(c).to_pylist() for c in columns}
        for r, episode in enumerate(episodes):
            stats: dict[str, dict] = {}
            for c in columns:
                if values[c][r] is not None:
                    feature, statistic = c[len("stats/") :].rsplit("/", 1)
                    stats.setdefault(feature, {})[statistic] = values[c][r]
            if stats:
                if not _is_stats(stats) or not isinstance(episode, int):
                    raise SourceError(f"{path}: row {r}: stats/ columns must hold numbers or lists of numbers")
                per_row.append((episode, stats))
    if not per_row:
        return None
    per_row.sort(key=lambda p: p[0])
    stats = _aggregate_stats([s for _, s in per_row], folder)
    return stats, f"{V3_STATS_COLUMNS} (aggregated over {len(per_row)} episodes)"


_AGGREGATED = ("mean", "std", "min", "max", "count")


def _aggregate_stats(stats_list: list[dict], where: str) -> dict:
    """Per-episode statistics aggregated as LeRobot's ``aggregate_stats`` does.

    LeRobot 0.4.4, ``lerobot/datasets/compute_stats.py``: ``aggregate_stats`` /
    ``aggregate_feature_stats``. Per feature, over the episodes that have it: ``mean`` weighted by
    ``count``; ``std`` pooled (``sqrt(sum(count * (std**2 + (mean - total_mean)**2)) /
    total_count)``); elementwise ``min`` / ``max``; ``count`` summed; each quantile ``q<digits>``
    of the first episode, when every episode has it, weighted by ``count`` (an approximation,
    LeRobot's). Other statistics are left out, as LeRobot leaves them. The same operations in the
    same order as LeRobot, so the values are LeRobot's bit for bit. ``stats_list``: feature ->
    statistic -> numbers, one per episode.

    Returns:
        feature -> statistic -> nested lists (``count``: ``[n]``), as JSON holds them.

    Raises:
        SourceError: naming ``where`` and the feature: a statistic of 0 dimensions, ``count`` not of
            shape ``[1]``, an ``image`` feature's statistic not ``[3, 1, 1]`` (LeRobot's
            ``_assert_type_and_shape``), one of mean/std/min/max/count missing, shapes that differ
            between episodes, a negative count or a total of 0.
    """
    keys = list(dict.fromkeys(key for stats in stats_list for key in stats))
    out: dict[str, dict] = {}
    for key in keys:
        entries = []
        for stats in (s for s in stats_list if key in s):
            entry = {
                name: _stat_array(value, f"{where}: statistics of {key!r}: {name}")
                for name, value in stats[key].items()
            }
            for name, array in entry.items():  # LeRobot's _assert_type_and_shape
                if name == "count" and array.shape != (1,):
                    raise SourceError(f"{where}: statistics of {key!r}: count has shape {list(array.shape)}, not [1]")
                if "image" in key and name != "count" and array.shape != (3, 1, 1):
                    shape = list(array.shape)
                    raise SourceError(f"{where}: statistics of {key!r}: {name} has shape {shape}, not [3, 1, 1]")
            missing = [n for n in _AGGREGATED if n not in entry]
            if missing:
                raise SourceError(f"{where}: statistics of {key!r}: no {', '.join(missing)} in some episode")
            entries.append(entry)
        try:
            out[key] = {name: value.tolist() for name, value in _aggregate_feature(entries).items()}
        except ValueError as exc:  # np.stack: shapes differ between episodes
            raise SourceError(f"{where}: statistics of {key!r} cannot be aggregated ({exc})") from None
        total = float(out[key]["count"][0])
        if not math.isfinite(total) or total <= 0 or any(float(np.min(e["count"])) < 0 for e in entries):
            raise SourceError(f"{where}: statistics of {key!r}: counts must be >= 0 with a finite total above 0")
    return out


def _stat_array(value, where: str) -> np.ndarray:
    """One statistic as LeRobot's ``cast_stats_to_numpy`` makes it (``np.array``), of 1 dimension or more.

    Raises:
        SourceError: ragged lists, integers past 64 bits, or a bare number (naming ``where``).
    """
    try:
        array = np.array(value)
    except ValueError:  # ragged lists
        raise SourceError(f"{where} is ragged lists") from None
    if array.dtype.kind not in "iuf":  # integers past 64 bits make an object array
        raise SourceError(f"{where} is not an array of numbers")
    if array.ndim == 0:
        raise SourceError(f"{where} is a bare number (LeRobot's statistics have 1 dimension or more)")
    return array


def _aggregate_feature(stats_ft_list: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """LeRobot 0.4.4's ``aggregate_feature_stats``, operation for operation (see ``_aggregate_stats``)."""
    with np.errstate(all="ignore"):  # a total count of 0 (or past float64) is refused by the caller
        means = np.stack([s["mean"] for s in stats_ft_list])
        variances = np.stack([s["std"] ** 2 for s in stats_ft_list])
        counts = np.stack([s["count"] for s in stats_ft_list])
        total_count = counts.sum(axis=0)
        while counts.ndim < means.ndim:
            counts = np.expand_dims(counts, axis=-1)
        total_mean = (means * counts).sum(axis=0) / total_count
        delta_means = means - total_mean
        total_variance = ((variances + delta_means**2) * counts).sum(axis=0) / total_count
        aggregated = {
            "min": np.min(np.stack([s["min"] for s in stats_ft_list]), axis=0),
            "max": np.max(np.stack([s["max"] for s in stats_ft_list]), axis=0),
            "mean": total_mean,
            "std": np.sqrt(total_variance),
            "count": total_count,
        }
        quantile_keys = [k for k in stats_ft_list[0] if k.startswith("q") and k[1:].isdigit()]
        for q_key in quantile_keys:
            if all(q_key in s for s in stats_ft_list):
                quantile_values = np.stack([s[q_key] for s in stats_ft_list])
                aggregated[q_key] = (quantile_values * counts).sum(axis=0) / total_count
    return aggregated


def _numbers(value) -> bool:
    """Whether ``value`` is a number or a (nested) list of numbers, as LeRobot's statistics are."""
    if isinstance(value, list):
        return all(_numbers(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _v2_tasks(tree: _Tree, warnings: list[dict]) -> tuple[dict[int, list[str]], dict[int, str], dict]:
    """A v2.x dataset's task texts: per episode (``meta/episodes.jsonl``), per task_index (``meta/tasks.jsonl``).

    An episode's texts are its ``tasks`` in ``meta/episodes.jsonl``; without that file, the text
    ``meta/tasks.jsonl`` gives its first row's ``task_index`` (as LeRobot names a frame's task;
    an index the file does not define: an empty text and a ``task_unknown`` warning, ``prepare``).
    Either file absent is one ``tasks_fallback`` entry of ``warnings`` saying where the texts come
    from instead (neither: empty texts). LeRobot's own loader needs both files.

    Returns:
        (episode_index -> texts; task_index -> text; the ``Episode.extra`` fields for ``prepare``:
        ``task_text``, and ``task_file`` when ``meta/tasks.jsonl`` is there).

    Raises:
        SourceError: a malformed line (``_read_jsonl``), naming the file and line.
    """
    meta = os.path.join(tree.root, "meta")
    episodes = _read_jsonl(tree, f"{meta}/episodes.jsonl", {"episode_index": int, "tasks": list})
    tasks = _read_jsonl(tree, f"{meta}/tasks.jsonl", {"task_index": int, "task": str})
    per_episode = {row["episode_index"]: row.get("tasks") or [] for row in episodes or []}
    by_index = {row["task_index"]: row["task"] for row in tasks or []}
    if episodes is None or tasks is None:
        if episodes is None and tasks is None:
            missing, instead = "meta/episodes.jsonl and meta/tasks.jsonl are", "the task texts are empty"
        elif tasks is None:
            missing = "meta/tasks.jsonl is"
            instead = "each episode's task texts are its tasks in meta/episodes.jsonl"
        else:
            missing = "meta/episodes.jsonl is"
            instead = "each episode's task is the text meta/tasks.jsonl gives its first row's task_index"
        warnings.append(
            {
                "kind": "tasks_fallback",
                "message": f"{tree.root}: {missing} absent; {instead}",
                "file": f"{meta}/{'tasks' if tasks is None else 'episodes'}.jsonl",
            }
        )
    extra: dict = {"task_text": by_index}
    if tasks is not None:
        extra["task_file"] = f"{meta}/tasks.jsonl"
    return per_episode, by_index, extra


def _read_v2(
    tree: _Tree, name: str, info: dict, wanted: tuple[str, ...] | None, selection: frozenset[int] | None = None
) -> Source:
    root = tree.root
    fps = float(info["fps"])
    data_re = _template_regex(info["data_path"])
    video_template = info.get("video_path") or ""
    found: dict[int, tuple[str, dict]] = {}
    parquets = tree.find(root, ".parquet")
    for path in parquets:
        m = data_re.match(path[len(root) + 1 :])
        if m:
            fields = {k: int(v) for k, v in m.groupdict().items()}
            found[fields["episode_index"]] = (path, fields)
    if not found:
        seen = f"its .parquet files, none of them a match: {_files(parquets, root)}" if parquets else "no .parquet file"
        raise SourceError(f"{root}: no data file matches data_path {info['data_path']!r} (the folder holds {seen})")
    task_warnings: list[dict] = []
    per_episode_tasks, _, task_extra = _v2_tasks(tree, task_warnings)
    declared = _camera_names(info.get("features", {}))
    depth = _depth_cameras(info.get("features", {}))
    video_of: dict[str, dict[int, str]] = {}
    expected: dict[str, str] = {}
    looked: dict[str, list[str]] = {}
    for cam in declared if wanted != () else []:
        paths = {}
        for ep, (_, fields) in found.items():
            path = os.path.join(root, _format(video_template, {**fields, "video_key": cam}))
            expected.setdefault(cam, path)
            looked.setdefault(cam, []).append(path)
            if tree.exists(path):
                paths[ep] = path
        video_of[cam] = paths
    cameras = [cam for cam in expected if video_of[cam]]
    notes = _dropped_cameras(tree, declared, expected, set(cameras), wanted, looked)
    images, image_notes = _image_features(info.get("features", {}), wanted)
    notes += image_notes
    episodes = []
    for ep in sorted(found if selection is None else found.keys() & selection):
        path, _ = found[ep]
        tasks = per_episode_tasks.get(ep) or []  # else the rows' task_index (prepare)
        videos = {
            cam: CameraVideo(tree.file(video_of[cam][ep]), depth=cam in depth) for cam in cameras if ep in video_of[cam]
        }
        # A camera missing for this episode only is left out here and reported by the writer, naming
        # the file it was looked for at.
        absent = [cam for cam in cameras if ep not in video_of[cam]]
        extra = {
            "missing_cameras": absent,
            "missing_paths": {
                cam: os.path.join(root, _format(video_template, {**found[ep][1], "video_key": cam})) for cam in absent
            },
            **task_extra,
        }
        episodes.append(
            Episode(
                source=name,
                episode_index=ep,
                table=tree.file(path),
                videos=videos,
                fps=fps,
                tasks=tuple(tasks),
                robot=str(info.get("robot_type") or ""),
                extra=extra,
                images=images,
            )
        )
    source = _source(name, root, info, fps, episodes, notes, len(found))
    source.warnings += task_warnings
    return source


def _source(name: str, root, info: dict, fps: float, episodes: list, notes: list[str], count: int) -> Source:
    """The ``Source`` of a LeRobot dataset (v2.x or v3.0), noting an episode count info.json gets wrong.

    ``count``: the episodes the dataset has (``episodes`` may be a selection of them).
    """
    declared_episodes = int(info.get("total_episodes", count))
    if declared_episodes != count:
        notes.append(f"meta/info.json declares {declared_episodes} episodes; {count} have data files and are converted")
    return Source(
        name=name,
        episodes=episodes,
        fps=fps,
        path=root,
        format=f"lerobot-{info['codebase_version']}",
        features=info.get("features", {}),
        notes=notes,
    )


def _read_v3(
    tree: _Tree, name: str, info: dict, wanted: tuple[str, ...] | None, selection: frozenset[int] | None = None
) -> Source:
    root = tree.root
    fps = float(info["fps"])
    meta_files = tree.find(os.path.join(root, "meta", "episodes"), ".parquet")
    if not meta_files:
        raise SourceError(  # where each episode's rows and video segments are: nothing to fall back on
            f"{root}: LeRobot v3.0 dataset without meta/episodes/*.parquet (it locates each episode's rows and "
            "video segments; no fallback)"
        )
    meta = _V3Meta(tree, meta_files)
    task_warnings, task_extra = _v3_task_fields(tree, meta)
    declared = _camera_names(info.get("features", {}))
    cameras = declared if wanted != () else []
    depth = _depth_cameras(info.get("features", {}))
    images, image_notes = _image_features(info.get("features", {}), wanted)
    # Many episodes share a file: each path is filled in and looked up once, whole columns at a time
    # (only the selected rows become Python objects, below).
    exists = functools.cache(tree.exists)
    ep = meta.episode
    data_uses_episode = "episode_index" in _template_fields(info["data_path"])
    data_keys = [meta.data_chunk, meta.data_file] + ([ep] if data_uses_episode else [])
    first, data_code = _first_seen(np.stack(data_keys, axis=1))
    data_paths = [
        os.path.join(
            root,
            _format(
                info["data_path"],
                {
                    "chunk_index": int(meta.data_chunk[r]),
                    "file_index": int(meta.data_file[r]),
                    "episode_chunk": int(meta.data_chunk[r]),
                    "episode_index": int(ep[r]),
                },
            ),
        )
        for r in first.tolist()
    ]
    data_there = np.asarray([exists(path) for path in data_paths], dtype=bool)
    if not data_there.any():
        raise SourceError(
            f"{root}: none of the episodes in meta/episodes has its data file present (data_path "
            f"{info['data_path']!r}; looked for {_files(sorted(set(data_paths)), root)})"
        )
    has_data = data_there[data_code]
    # Videos are looked for only for the episodes whose data file is there (a subset copy keeps
    # the full dataset's meta/episodes): those are the files a message names.
    video_uses_episode = "episode_index" in _template_fields(info.get("video_path") or "")
    pending = []  # (first row, camera, key number, key row): filled in row order, as a message names the first
    video_code: dict[str, np.ndarray] = {}  # camera -> per row: its video file's key number (-1: none)
    key_seconds: dict[str, np.ndarray] = {}  # camera -> per key: the largest to_timestamp of its rows
    for cam in cameras:
        to, to_valid = meta.floats(f"videos/{cam}/to_timestamp")
        rows = np.flatnonzero(has_data & to_valid)
        chunk, chunk_valid = meta.ints(f"videos/{cam}/chunk_index")
        file, file_valid = meta.ints(f"videos/{cam}/file_index")
        keys = [chunk, chunk_valid, file, file_valid] + ([ep] if video_uses_episode else [])
        first, code = _first_seen(np.stack([k[rows].astype(np.int64) for k in keys], axis=1))
        video_code[cam] = np.full(meta.num_rows, -1, dtype=np.int64)
        video_code[cam][rows] = code
        key_seconds[cam] = np.full(first.size, -np.inf)
        np.maximum.at(key_seconds[cam], code, to[rows])
        pending += [(int(rows[f]), cam, k) for k, f in enumerate(first.tolist())]
    video_paths: dict[str, list[str]] = {cam: [""] * key_seconds[cam].size for cam in cameras}
    file_seconds: dict[str, float] = {}
    for r, cam, k in sorted(pending, key=lambda p: (p[0], cameras.index(p[1]))):
        path = video_paths[cam][k] = _video_path(root, info, cam, meta.video_fields(cam, r))
        file_seconds[path] = max(file_seconds.get(path, 0.0), float(key_seconds[cam][k]))
    present = {cam for cam in cameras if any(exists(p) for p in video_paths[cam])}
    # A camera meta/episodes gives no file for: the template, its chunk and file fields unfilled.
    expected = {
        cam: video_paths[cam][0]
        if video_paths[cam]
        else os.path.join(root, (info.get("video_path") or "").replace("{video_key}", cam))
        for cam in cameras
    }
    notes = _dropped_cameras(tree, declared, expected, present, wanted, video_paths) + image_notes
    # Each row's rows in its data file, from the file's own episode_index column (not global indices).
    start = np.zeros(meta.num_rows, dtype=np.int64)
    stop = np.zeros(meta.num_rows, dtype=np.int64)
    in_file = np.zeros(meta.num_rows, dtype=bool)
    ranges: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for d in np.flatnonzero(data_there).tolist():  # in the order their first rows come: the first fault is named
        if data_paths[d] not in ranges:
            ranges[data_paths[d]] = _episode_ranges(tree, data_paths[d])
        values, starts, stops = ranges[data_paths[d]]
        rows = np.flatnonzero(data_code == d)
        if values.size:
            at = np.minimum(np.searchsorted(values, ep[rows]), values.size - 1)
            in_file[rows], start[rows], stop[rows] = values[at] == ep[rows], starts[at], stops[at]
    notes += [
        f"episode {int(ep[r])}: meta/episodes lists it in {data_paths[data_code[r]]} but the file has no rows for it; "
        "skipped"
        for r in np.flatnonzero(has_data & ~in_file).tolist()
    ]
    count = int(np.count_nonzero(in_file))
    if not count:
        raise SourceError(
            f"{root}: none of the episodes in meta/episodes has rows in its data file (data_path "
            f"{info['data_path']!r}; read {_files(sorted({data_paths[d] for d in np.flatnonzero(data_there)}), root)})"
        )
    if selection is not None:
        wanted_episodes = np.asarray([e for e in selection if -(2**63) <= e < 2**63], dtype=np.int64)
        chosen = in_file & np.isin(ep, wanted_episodes)
    else:
        chosen = in_file
    positions = np.flatnonzero(chosen)
    episodes = []
    for r, row in zip(positions.tolist(), meta.rows(positions), strict=True):
        data_path = data_paths[data_code[r]]
        videos, missing, missing_paths = {}, [], {}
        for cam in cameras:
            if cam not in present:
                continue
            k = int(video_code[cam][r])
            path = video_paths[cam][k] if k >= 0 else _video_path(root, info, cam, row)
            if exists(path):
                seg = (float(row[f"videos/{cam}/from_timestamp"]), float(row[f"videos/{cam}/to_timestamp"]))
                videos[cam] = CameraVideo(
                    tree.file(path), segment=seg, file_seconds=file_seconds.get(path), depth=cam in depth
                )
            else:
                missing.append(cam)
                missing_paths[cam] = path
        tasks = tuple(str(t) for t in (row.get("tasks") or []))
        episodes.append(
            Episode(
                source=name,
                episode_index=int(row["episode_index"]),
                table=TableSlice(tree.file(data_path), int(start[r]), int(stop[r])),
                videos=videos,
                fps=fps,
                tasks=tasks,
                robot=str(info.get("robot_type") or ""),
                extra={"missing_cameras": missing, "missing_paths": missing_paths, **task_extra},
                images=images,
            )
        )
    episodes.sort(key=lambda e: e.episode_index)
    source = _source(name, root, info, fps, episodes, notes + tree.whole_read_notes(), count)
    source.warnings += task_warnings
    return source


def _v3_task_fields(tree: _Tree, meta: _V3Meta) -> tuple[list[dict], dict]:
    """A v3.0 dataset's ``Episode.extra`` task fields, and a ``tasks_fallback`` warning without ``meta/tasks.parquet``.

    An episode's texts are its ``tasks`` in ``meta/episodes``; without them, the text
    ``meta/tasks.parquet`` gives its first row's ``task_index`` (``prepare``). Without that file
    (LeRobot's ``load_tasks`` needs it) the texts come from ``meta/episodes`` alone, or are empty
    when it has no ``tasks`` column: one warning saying which.

    Returns:
        (warnings; ``{"task_text": task_index -> text, "task_file": path}``, ``task_file`` only
        when the file is there).

    Raises:
        SourceError: ``meta/tasks.parquet`` is unreadable or has no task_index / text column.
    """
    path = os.path.join(tree.root, "meta", "tasks.parquet")
    texts = _v3_tasks(tree, path)
    if texts is not None:
        return [], {"task_text": texts, "task_file": path}
    listed = any("tasks" in t.column_names and t.column("tasks").null_count < t.num_rows for t in meta.tables)
    instead = "each episode's task texts are its tasks in meta/episodes" if listed else "the task texts are empty"
    message = f"{tree.root}: meta/tasks.parquet is absent; {instead}"
    return [{"kind": "tasks_fallback", "message": message, "file": path}], {"task_text": {}}


def _first_seen(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of ``keys`` (int ``[n, k]``) numbered in the order they first occur.

    Returns (the row where each first occurs, ascending; per row: its number).
    """
    if not keys.shape[0]:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    number = np.empty_like(order)
    number[order] = np.arange(order.size)
    return first[order], number[inverse.reshape(-1)]


def _episode_ranges(tree: _Tree, path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The episodes of a v3.0 data file and their rows ``[start, stop)``, from its episode_index column.

    Returns (episode indices, ascending; their start rows; their stop rows). Raises SourceError
    naming the file: the column holds nulls or no integers, or an episode's rows are not contiguous.
    """
    col = tree.parquet(path, columns=["episode_index"]).column("episode_index")
    if col.null_count or not pa.types.is_integer(col.type):
        raise SourceError(f"{path}: episode_index must hold integers without nulls, has {col.type}")
    values = col.to_numpy()
    if not values.size:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    change = np.concatenate([[0], np.flatnonzero(values[1:] != values[:-1]) + 1, [len(values)]]).astype(np.int64)
    starts, stops = change[:-1], change[1:]
    episodes = values[starts].astype(np.int64)
    order = np.argsort(episodes, kind="stable")
    twice = np.flatnonzero(episodes[order][1:] == episodes[order][:-1])
    if twice.size:  # the first run, in file order, of an episode whose rows came before
        run = int(np.min(order[twice + 1]))
        raise SourceError(f"{path}: rows of episode {int(episodes[run])} are not contiguous")
    return episodes[order], starts[order], stops[order]


def _read_parquet(tree: _Tree, path: str):
    try:
        return tree.parquet(path)
    except (OSError, ValueError) as exc:  # pyarrow: not Parquet, truncated, unreadable
        raise SourceError(f"{path}: not a readable Parquet file ({exc})") from None


class _V3Meta:
    """The rows of the v3.0 ``meta/episodes`` files, checked, as whole columns.

    ``episode_index`` (unique) and ``data/*_index`` are integers; each camera's ``videos/<camera>/``
    columns come as the set ``chunk_index``, ``file_index`` (integers or null), ``from_timestamp``,
    ``to_timestamp`` (finite numbers or null); ``tasks`` is a list of strings. Raises SourceError
    naming file, row and column. The checks are per column (Arrow types and kernels) where the
    types decide them, else per row; ``rows`` makes Python values of the rows asked for only.
    """

    def __init__(self, tree: _Tree, paths: list[str]):
        self.tables: list[pa.Table] = []
        episode: list[np.ndarray] = []
        for path in paths:
            table = _read_parquet(tree, path)
            for prefix in {name.rsplit("/", 1)[0] for name in table.column_names if name.startswith("videos/")}:
                for column in (
                    f"{prefix}/{key}" for key in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
                ):
                    if column not in table.column_names:
                        raise SourceError(f"{path}: column {column} is missing")
            # Only the columns read below are kept (not the per-episode stats columns).
            table = table.select([n for n in table.column_names if n in _V3_ROW_COLUMNS or n.startswith("videos/")])
            if _v3_columns_valid(table):  # True: the row checks would find nothing
                values = _int_column(table.column("episode_index"))
                _refuse_listed_twice(path, values, episode, paths)
            else:  # the row checks name the first bad row (a row listed twice before it comes first)
                seen = {int(e): paths[i] for i, done in enumerate(episode) for e in done.tolist()}
                for i, row in enumerate(table.to_pylist()):
                    _check_v3_row(path, i, row)
                    if row["episode_index"] in seen:
                        raise SourceError(
                            f"{path}: row {i}: episode_index {row['episode_index']} is listed twice "
                            f"(also in {seen[row['episode_index']]})"
                        )
                    seen[row["episode_index"]] = path
                values = _int_column(table.column("episode_index"))
            episode.append(values)
            self.tables.append(table)
        self.offsets = np.cumsum([0] + [t.num_rows for t in self.tables])
        self.num_rows = int(self.offsets[-1])
        self.episode = np.concatenate(episode) if episode else np.zeros(0, dtype=np.int64)
        self.data_chunk = self.ints("data/chunk_index")[0]
        self.data_file = self.ints("data/file_index")[0]

    def _columns(self, name: str, convert, dtype) -> tuple[np.ndarray, np.ndarray]:
        values, valid = [np.zeros(0, dtype)], [np.zeros(0, bool)]
        for t in self.tables:
            there = name in t.column_names
            values.append(convert(t.column(name)) if there else np.zeros(t.num_rows, dtype))
            valid.append(_valid(t.column(name)) if there else np.zeros(t.num_rows, bool))
        return np.concatenate(values).astype(dtype), np.concatenate(valid)

    def ints(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Column ``name`` of every row as int64 (0 where null or absent), and where it has a value."""
        return self._columns(name, _int_column, np.int64)

    def floats(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Column ``name`` of every row as float64 (0 where null or absent), and where it has a value."""
        return self._columns(name, _float_column, np.float64)

    def video_fields(self, cam: str, r: int) -> dict:
        """What ``_video_path`` reads of row ``r``: the camera's chunk and file (None where null) and the episode."""
        fields: dict = {"episode_index": int(self.episode[r])}
        t = int(np.searchsorted(self.offsets, r, side="right")) - 1
        table = self.tables[t]
        for key in (f"videos/{cam}/chunk_index", f"videos/{cam}/file_index"):
            fields[key] = table.column(key)[r - int(self.offsets[t])].as_py() if key in table.column_names else None
        return fields

    def rows(self, positions: np.ndarray) -> list[dict]:
        """The rows at ``positions`` (ascending), as Python dicts of their columns."""
        out: list[dict] = []
        which = np.searchsorted(self.offsets, positions, side="right") - 1
        for t, table in enumerate(self.tables):
            local = positions[which == t] - self.offsets[t]
            if local.size:
                out += table.take(pa.array(local, pa.int64())).to_pylist()
        return out


def _valid(column) -> np.ndarray:
    if pa.types.is_null(column.type):
        return np.zeros(len(column), dtype=bool)
    return pc.is_valid(column).to_numpy(zero_copy_only=False)


def _int_column(column) -> np.ndarray:
    if pa.types.is_null(column.type) or not len(column):
        return np.zeros(len(column), dtype=np.int64)
    return pc.cast(pc.fill_null(column, 0), pa.int64(), safe=False).to_numpy(zero_copy_only=False)


def _float_column(column) -> np.ndarray:
    if pa.types.is_null(column.type) or not len(column):
        return np.zeros(len(column), dtype=np.float64)
    return pc.cast(pc.fill_null(column, 0), pa.float64(), safe=False).to_numpy(zero_copy_only=False)


def _refuse_listed_twice(path: str, values: np.ndarray, before: list[np.ndarray], paths: list[str]) -> None:
    """Refuse the first row of ``path`` (``values``: its episode_index column) whose episode is listed before.

    ``before``: the episode_index columns of the files before it (``paths``, in order).
    """
    earlier = np.isin(values, np.concatenate(before)) if before else np.zeros(values.size, dtype=bool)
    again = np.ones(values.size, dtype=bool)
    again[np.unique(values, return_index=True)[1]] = False
    twice = np.flatnonzero(earlier | again)
    if not twice.size:
        return
    i = int(twice[0])
    ep = int(values[i])
    also = next((paths[k] for k, done in enumerate(before) if np.any(done == ep)), path)
    raise SourceError(f"{path}: row {i}: episode_index {ep} is listed twice (also in {also})")


def _v3_episode_rows(tree: _Tree, paths: list[str]) -> list[dict]:
    """Every row of the v3.0 ``meta/episodes`` files, checked (``_V3Meta``), as Python dicts."""
    meta = _V3Meta(tree, paths)
    return meta.rows(np.arange(meta.num_rows))


_V3_ROW_COLUMNS = ("episode_index", "data/chunk_index", "data/file_index", "tasks")


def _check_v3_row(path: str, i: int, row: dict) -> None:
    """Refuse row ``i`` of a ``meta/episodes`` file whose values have a wrong type (see ``_v3_episode_rows``)."""
    for name in ("episode_index", "data/chunk_index", "data/file_index"):
        if not isinstance(row.get(name), int):
            raise SourceError(f"{path}: row {i}: {name} must be an integer, got {row.get(name)!r:.60}")
    for name, value in row.items():
        if not name.startswith("videos/") or value is None:
            continue
        if name.endswith("_index") and not isinstance(value, int):
            raise SourceError(f"{path}: row {i}: {name} must be an integer, got {value!r:.60}")
        if name.endswith("_timestamp") and not _is_finite_number(value):
            raise SourceError(f"{path}: row {i}: {name} must be a finite number, got {value!r:.60}")
    tasks = row.get("tasks")
    if tasks is not None and not _is_list_of_str(tasks):
        raise SourceError(f"{path}: row {i}: tasks must be a list of strings, got {tasks!r:.60}")


def _v3_columns_valid(table: pa.Table) -> bool:
    """Whether ``_check_v3_row`` would pass every row of ``table``, decided per column (Arrow types and kernels).

    False where a column's type alone does not decide it: the row checks then run and name the row.
    """
    names = set(table.column_names)
    if not {"episode_index", "data/chunk_index", "data/file_index"} <= names:
        return False
    for name in table.column_names:
        column = table.column(name)
        kind = column.type
        if name in ("episode_index", "data/chunk_index", "data/file_index"):
            if not pa.types.is_integer(kind) or column.null_count:
                return False
        elif name == "tasks":
            if pa.types.is_null(kind):
                continue
            if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_string(kind.value_type):
                return False
            if pc.list_flatten(column).null_count:
                return False
        elif name.endswith("_index"):  # videos/<camera>/chunk_index, file_index: integers or null
            if not (pa.types.is_integer(kind) or pa.types.is_null(kind)):
                return False
        elif name.endswith("_timestamp"):  # finite numbers or null
            if pa.types.is_integer(kind) or pa.types.is_null(kind):
                continue
            if not pa.types.is_floating(kind) or pc.all(pc.is_finite(column)).as_py() is False:
                return False
    return True


def _v3_tasks(tree: _Tree, path: str) -> dict[int, str] | None:
    """task_index -> task text from a v3.0 ``meta/tasks.parquet`` (None if absent)."""
    if not tree.exists(path):
        return None
    t = _read_parquet(tree, path)
    text_col = "task" if "task" in t.column_names else next((c for c in t.column_names if c != "task_index"), None)
    if "task_index" not in t.column_names or text_col is None:
        raise SourceError(f"{path}: needs a task_index column and a task text column, has {t.column_names}")
    index = t.column("task_index").to_pylist()
    if not all(isinstance(v, int) for v in index):
        raise SourceError(f"{path}: task_index must hold integers, has {t.schema.field('task_index').type}")
    return dict(zip(index, map(str, t.column(text_col).to_pylist()), strict=False))


def _video_path(root: str, info: dict, cam: str, row: dict, cache: dict | None = None) -> str:
    """The video file of ``cam`` for a v3.0 ``meta/episodes`` row (``cache``: filled paths by fields used)."""
    chunk = row.get(f"videos/{cam}/chunk_index")
    file = row.get(f"videos/{cam}/file_index")
    if cache is not None:
        uses_episode = "episode_index" in _template_fields(info.get("video_path") or "")
        key = (cam, chunk, file, row["episode_index"] if uses_episode else None)
        if key not in cache:
            cache[key] = _video_path(root, info, cam, row)
        return cache[key]
    return os.path.join(
        root,
        _format(
            info.get("video_path") or "",
            {
                "video_key": cam,
                "chunk_index": chunk,
                "file_index": file,
                "episode_chunk": chunk,
                "episode_index": int(row["episode_index"]),
            },
        ),
    )
