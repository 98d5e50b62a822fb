"""Source formats beyond the Python API: a registry, recognition from the files, and their readers.

``FORMATS`` names what ``epishard convert`` reads; ``detect_format`` recognises a source from its
files (``--format`` overrides it); ``open_source`` returns a ``Source`` whose episodes hold small
references only (file, group, key, record offset): their rows and frames are read by the conversion
worker, one episode at a time (``episode.LazyTable``, ``episode.CameraFrames``). Each reader's
libraries are optional extras, imported only when a source of that format is opened.

Formats (one docs page each, docs/sources/): ``lerobot`` (``shardwriter.lerobot``), ``aloha`` and
``robomimic`` (``libero`` is an alias; HDF5, ``sources.hdf5``), ``umi`` (Zarr ReplayBuffer of UMI
and Diffusion Policy, ``sources.replay_buffer``), ``rlds`` (TFDS TFRecords of RLDS episodes, Open
X-Embodiment, ``sources.rlds``, read without TensorFlow: ``sources.tfrecord``), ``mcap`` (ROS 2
bags, resampled onto one row clock, ``sources.mcap_bag``).

``REGISTRY`` is the one list of them: ``FORMATS``, ``ALIASES``, ``open_source``'s dispatch, the
``epishard convert --format`` help and the table of docs/sources/README.md follow it (the last two
checked by tests/test_sources_registry.py). To add a format: a reader module with ``open_<x>``, one
``SourceFormat`` entry, its detection in ``detect_format``, a page in docs/sources/.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

from epishard.format.storage import Location, is_local, local_path, source_filesystem

from ..episode import Source
from ..errors import ConversionError, SourceError
from .base import Mapping, SourceOptions


@dataclass(frozen=True)
class SourceFormat:
    """One format ``epishard convert`` reads.

    ``name``: what ``--format`` takes (``aliases``: other names for it). ``opener``: the reader,
    ``"module:function"`` relative to ``epishard.shardwriter``, imported only when a source of this
    format is opened; called as ``function(root, options, cameras, storage_options, episodes)``, or
    with ``name`` after ``root`` when ``passes_name`` (one reader for several layouts); ``lerobot``'s
    ``read_lerobot`` is called apart (``open_source``). ``docs``: its page in docs/sources/. ``extra``:
    the pip extra of epishard that installs its libraries (None: none needed).
    """

    name: str
    aliases: tuple[str, ...]
    opener: str
    docs: str
    extra: str | None
    passes_name: bool = False


# In the order --format lists them and a LeRobot source's error names the others. ``epishard.cli.convert``
# writes the names and aliases out (``FORMATS_HELP``: its help imports no writer code); a test keeps them equal.
REGISTRY = (
    SourceFormat("lerobot", (), "lerobot:read_lerobot", "README.md", None),
    SourceFormat("aloha", ("act",), "sources.hdf5:open_hdf5", "aloha.md", "hdf5", passes_name=True),
    SourceFormat("robomimic", ("libero",), "sources.hdf5:open_hdf5", "robomimic.md", "hdf5", passes_name=True),
    SourceFormat(
        "umi",
        ("zarr", "replay_buffer", "diffusion_policy"),
        "sources.replay_buffer:open_replay_buffer",
        "umi.md",
        "zarr",
    ),
    SourceFormat("rlds", ("oxe", "tfrecord"), "sources.rlds:open_rlds", "rlds.md", "rlds"),
    SourceFormat("mcap", ("ros2", "rosbag"), "sources.mcap_bag:open_mcap", "mcap.md", "mcap"),
)
BY_NAME = {f.name: f for f in REGISTRY}
FORMATS = tuple(BY_NAME)
ALIASES = {alias: f.name for f in REGISTRY for alias in f.aliases}


def load_opener(entry: SourceFormat):
    """The function ``entry.opener`` names, imported now (its module's optional libraries are not)."""
    module, _, function = entry.opener.partition(":")
    return getattr(importlib.import_module(f"epishard.shardwriter.{module}"), function)


# Names a URL is recognised by (local sources: by their files).
_SUFFIXES = (".hdf5", ".h5", ".hdf", ".zarr", ".zarr.zip", ".mcap")

__all__ = ["ALIASES", "FORMATS", "REGISTRY", "Mapping", "SourceFormat", "SourceOptions", "detect_format", "open_source"]


def _names(root: str, storage_options: dict | None) -> tuple[bool, list[str]]:
    """(root is a file, the relative paths of the files under root, at most a few thousand)."""
    if is_local(root):
        path = local_path(root)
        if os.path.isfile(path):
            return True, [os.path.basename(path)]
        out = []
        for folder, dirs, files in os.walk(path):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            out += [os.path.relpath(os.path.join(folder, n), path) for n in files]
            if len(out) > 5000:
                break
        return False, sorted(out)
    fs = source_filesystem(Location.of(root, storage_options))
    base = fs._strip_protocol(root).rstrip("/")
    if fs.isfile(base):
        return True, [base.rsplit("/", 1)[-1]]
    return False, sorted(p[len(base) :].strip("/") for p in fs.find(base))


def detect_format(root: str, storage_options: dict | None = None, allow_external: bool = False) -> str | None:
    """The format of the source at ``root`` (a folder, a file or a URL), from its files; None if unknown.

    ``meta/info.json``: ``lerobot``. HDF5 files (``.hdf5``, ``.h5``): ``robomimic`` when the first
    holds ``data/demo_*``, ``aloha`` when it holds ``observations`` or ``action``. A ``.zarr`` folder,
    a ``.zarr.zip`` or a folder with ``meta/episode_ends``: ``umi``. TFRecord files
    (``*.tfrecord*``) or a TFDS ``features.json``: ``rlds``. ``.mcap`` files: ``mcap``. A URL is judged
    by its own name only (listing a remote folder may not be possible, e.g. over HTTP): a URL of
    a folder is taken for LeRobot unless ``--format`` names another format. ``allow_external``: as
    ``SourceOptions.allow_external`` (the first HDF5 file is opened to tell its layout).

    Raises:
        SourceError: the first HDF5 file cannot be read, or is refused (``base.source_files``), naming it.
    """
    if not is_local(root):
        names = [root.rstrip("/").rsplit("/", 1)[-1]]  # a folder's URL: its name, without the slash
        is_file = True
        if not names[0].endswith(_SUFFIXES) and ".tfrecord" not in names[0]:
            return "lerobot"
    else:
        is_file, names = _names(root, storage_options)
    if not is_file and "meta/info.json" in names:
        return "lerobot"
    if root.rstrip("/").endswith((".zarr", ".zarr.zip")) or any(n.startswith("meta/episode_ends/") for n in names):
        return "umi"
    base = [n.rsplit("/", 1)[-1] for n in names]
    if any(n.endswith(".mcap") for n in base):
        return "mcap"
    if any(".tfrecord" in n for n in base) or "features.json" in base:
        return "rlds"
    from .hdf5 import SUFFIXES

    if any(n.endswith(SUFFIXES) for n in names):
        from .base import source_files
        from .hdf5 import detect

        first = source_files(root, SUFFIXES, storage_options, allow_external)[0]
        try:
            return detect(first)
        except ConversionError as exc:
            if exc.kind == "outside_source":  # read, and refused: --format would not help
                raise SourceError(str(exc)) from None
            raise SourceError(f"looks like HDF5 but cannot be read: {exc}; pass --format") from None
    return None


def open_source(
    root: str,
    options: SourceOptions | None = None,
    cameras: tuple[str, ...] | None = None,
    storage_options: dict | None = None,
    episodes: frozenset[int] | None = None,
) -> Source:
    """Open the source at ``root`` in ``options.format`` (None: ``detect_format``'s guess).

    ``cameras``, ``storage_options``, ``episodes``: as ``lerobot.read_lerobot`` takes them. The
    source's notes name the format, how it was chosen, and the mapping used.

    Raises:
        SourceError: an unknown format, one that cannot be recognised, a missing optional library
            (naming the extra to install), or the reader's own errors (naming file and key).
    """
    options = options or SourceOptions()
    if options.format is not None:
        chosen = ALIASES.get(options.format, options.format)
        if chosen not in FORMATS:
            raise SourceError(f"--format {options.format!r}: not a known format ({', '.join(FORMATS)})")
        how = "given by --format"
    else:
        found = detect_format(root, storage_options, options.allow_external)
        chosen, how = found or "lerobot", "recognised from the files"
    if chosen == "lerobot":
        read_lerobot = load_opener(BY_NAME["lerobot"])
        try:
            return read_lerobot(
                root,
                cameras=cameras,
                storage_options=storage_options,
                episodes=episodes,
                allow_external=options.allow_external,
            )
        except SourceError as exc:
            if options.format is not None or found == "lerobot":
                raise
            raise SourceError(
                f"{exc} (nor a source of another format epishard reads: {', '.join(FORMATS[1:])}; --format names one)"
            ) from None
    entry = BY_NAME[chosen]
    opener = load_opener(entry)
    if entry.passes_name:
        source = opener(root, chosen, options, cameras, storage_options, episodes)
    else:
        source = opener(root, options, cameras, storage_options, episodes)
    source.notes.insert(0, f"format {chosen} ({how})")
    return source
