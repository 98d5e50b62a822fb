"""Opening a converted dataset's index against its manifest, and naming what is not a converted dataset.

- ``load_dataset_index``: the dataset's ``index.arrow`` (one memory-mappable Arrow IPC file) as a
  ``WindowIndex``, after its sha256 (the manifest's ``index.sha256``), format version, schema and
  values (``validate.check_index``) are checked;
- ``load_shard_indexes``: every per-shard ``*.index.parquet`` the manifest lists, each against its
  ``index_sha256``, then the schema and values of all of them;
- ``NotConverted``, ``lerobot_instead``: a LeRobot dataset or a Hugging Face repo id given where a
  converted dataset was expected is named as one, with the ``epishard convert`` command to run;
- ``open_manifest``: a dataset folder's checked manifest, or what the folder is instead (the one
  opening the reader's ``DatasetSource``, ``verify`` and ``inspect`` share; each passes its opened
  ``Storage``, whose location holds the storage options and the retry policy).

Each load raises ``FormatError`` (``epishard.format.errors``) naming the file and the field.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable

from epishard.redact import redact

from . import manifest as fmt
from .errors import FormatError
from .index import WindowIndex
from .storage import Storage
from .untrusted import check_size, printable
from .validate import check_digest, check_index

__all__ = [
    "ManifestMissing",
    "NotConverted",
    "lerobot_instead",
    "load_dataset_index",
    "load_shard_indexes",
    "open_manifest",
]


def load_dataset_index(data, manifest: fmt.Manifest, where: str, hashed: bool = False) -> WindowIndex:
    """The ``WindowIndex`` in ``data``, after its sha256, version, schema and values are checked.

    Packet tables are checked one stream at a time, at its first use (``WindowIndex.packets``).

    ``data``: ``index.arrow``'s bytes or buffer (an Arrow IPC file) of a checked manifest; the
    sha256 is the manifest's ``index.sha256``. ``hashed``: the caller knows these bytes have that
    sha256 (a stamp of ``epishard.format.verified``), so it is not computed again; the rest is checked.

    Raises:
        FormatError: names ``where`` (the file) and the field.
    """
    if not hashed:  # before parsing: Arrow's IPC reader can crash (SIGSEGV) on a damaged file
        check_digest(data, manifest.index.sha256, where, "index.sha256")
    index = WindowIndex.read_dataset_index(data, where, manifest.format_version)
    # Packet tables are checked per stream at first use (``WindowIndex.packets``): at a million
    # episodes they hold hundreds of millions of packets, and a rank reads a few thousand streams.
    check_index(index, manifest.shards, manifest.camera_episodes(), where, packets=False)
    return index


def load_shard_indexes(manifest: fmt.Manifest, read: Callable[[str], bytes], url: str) -> WindowIndex:
    """The ``WindowIndex`` of every per-shard index a checked manifest lists, each checked.

    Against its ``index_sha256``, the schema and the value bounds. ``read(name)`` returns a file's bytes.

    Raises:
        FormatError: names the file and field.
    """
    if not manifest.shards:
        raise FormatError(f"{url}/{fmt.MANIFEST_NAME}: lists no shards")

    def checked():  # each file's digest is checked before it is parsed
        for i, entry in enumerate(manifest.shards):
            where = f"{url}/{entry.index}"
            data = read(entry.index)
            check_digest(data, entry.index_sha256, where, f"shards[{i}].index_sha256")
            yield data, where

    index = WindowIndex.read_shard_indexes(checked(), manifest.format_version)
    index.where = f"{url}/*{fmt.INDEX_SUFFIX}"  # DatasetSource.index_file names it alike
    check_index(index, manifest.shards, manifest.camera_episodes(), index.where, packets=False)
    return index


class NotConverted(FileNotFoundError):
    """The path is a LeRobot dataset, or a Hugging Face repo id, where an epishard dataset was expected."""


_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def lerobot_instead(storage: Storage) -> str | None:
    """The message for a folder that is a LeRobot dataset rather than a converted (epishard) one, else None.

    ``storage``: the opened folder (its ``url``: ``root`` below).

    A LeRobot dataset: ``meta/info.json`` under ``root`` (a folder or any URL). A Hugging Face repo
    id (``lerobot/svla_so101_pickplace``: ``owner/name``, no scheme, no such local path): said to be
    one, with the ``hf://datasets/...`` URL ``convert`` takes. Both say to run ``epishard convert``
    first, then to stream the output (``WindowDataset``, or the LeRobot drop-in). Errors reading
    ``root`` are left to the caller's own checks (None).
    """
    after = (
        "then stream OUT (epishard stream OUT, WindowDataset(OUT, ...), or LeRobot's dataset API through the "
        "drop-in epishard.stream.lerobot_dataset.EpishardLeRobotDataset(OUT, delta_timestamps=...))"
    )
    root = storage.url
    if "://" not in root and _REPO_ID.fullmatch(root) and not os.path.exists(root):
        return (
            f"{root}: no such folder here; if it is the Hugging Face repo id of a LeRobot dataset (it looks like "
            f"one), run epishard convert hf://datasets/{root} OUT first, {after}"
        )
    try:
        if not storage.exists("meta/info.json"):
            return None
        info = json.loads(storage.read("meta/info.json")[: 1 << 20])
        version = info.get("codebase_version") if isinstance(info, dict) else None
    except Exception:  # unreadable or not JSON: the caller's own "no manifest" message stands
        return None
    what = f"LeRobot {printable(str(version))} dataset" if version else "LeRobot dataset"
    return (
        f"{redact(root)}: this is a {what} (meta/info.json), not an epishard dataset: run epishard convert "
        f"{redact(root)} OUT first, {after}"
    )


def _not_a_dataset(storage: Storage) -> FileNotFoundError | None:
    """What to raise for a folder with no manifest, when more can be said than "no manifest.json".

    ``NotConverted`` for a LeRobot dataset or a Hugging Face repo id (``lerobot_instead``); a
    ``FileNotFoundError`` (errno ENOENT, naming the path) for a local path that does not exist; else
    None (the caller's own message stands).
    """
    hint = lerobot_instead(storage)
    if hint:
        return NotConverted(hint)
    root = storage.url
    if "://" not in root and not os.path.exists(root):
        return FileNotFoundError(errno.ENOENT, "no such dataset folder", root)
    return None


class ManifestMissing(FileNotFoundError):
    """A folder (or bucket prefix) that holds files but no ``manifest.json``.

    Not a dataset, or a conversion unfinished. ``filename``: the folder (credentials redacted).
    """


def open_manifest(storage: Storage) -> fmt.Manifest:
    """The checked manifest of the converted dataset in ``storage`` (an opened folder: ``Storage``).

    The one opening of a dataset's manifest: the writer's resume, ``verify``, ``inspect`` and the
    reader (``stream.source.DatasetSource``) call it. Every call goes through ``storage``, so its
    location's retry policy applies (the reader's storage raises its ``FetchError`` when it runs out).

    Its size is held against ``MAX_JSON_BYTES`` before a byte is read, then ``Manifest.load`` checks
    every field (nothing it names is opened before that).

    Raises:
        NotConverted (a FileNotFoundError): ``root`` is a LeRobot dataset or a Hugging Face repo id.
        FileNotFoundError: no such folder, or an empty one (errno ENOENT, ``filename``: ``root``);
            a missing bucket; PermissionError: the store refuses to list it.
        ManifestMissing (a FileNotFoundError): files, but no ``manifest.json``.
        FormatError (a ValueError): the manifest is too large or breaks the format (naming the file).
    """
    if not storage.exists(fmt.MANIFEST_NAME):
        if (refused := _not_a_dataset(storage)) is not None:
            raise refused
        shown = storage.location.shown
        if not storage.names():  # raises for a missing bucket (naming it) or denied access
            raise FileNotFoundError(
                errno.ENOENT, f"no {fmt.MANIFEST_NAME}: no such dataset folder, or it is empty", shown
            )
        raise ManifestMissing(
            errno.ENOENT, f"no {fmt.MANIFEST_NAME} (not a dataset, or the conversion is unfinished)", shown
        )
    where = f"{storage.url}/{fmt.MANIFEST_NAME}"
    check_size(storage.size(fmt.MANIFEST_NAME), where, FormatError)  # before a byte of it is read
    return fmt.Manifest.load(storage.read(fmt.MANIFEST_NAME), where)
