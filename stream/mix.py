"""Cross-embodiment mixing: every sample of a mix has the model's keys and shapes.

Cross-embodiment mixing: every sample of a mix has the model's keys and shapes, whatever dataset
(robot) it comes from.

- Cameras: the window spec names the model's cameras (``front``, ``wrist``); each dataset maps its
  own camera keys to them (``camera_map``; a camera not mapped is looked up under its own name). A
  camera a dataset lacks is returned as zeros of the shape and dtype the other datasets give it,
  with ``<camera>_is_pad`` all true (``WindowSpec.missing_cameras="pad"``), or the dataset is
  refused (``"refuse"``).
- State, action and other numeric columns: padded with zeros to a common width (the widest in the
  mix, or a given one), with a per-dimension mask ``<column>_dim_is_pad`` (bool ``[D]``, true on
  padded dimensions: ``observation.state_dim_is_pad``, ``action_dim_is_pad``). Each dataset's own
  normalisation statistics are applied first (``normalizers``), so padded dimensions stay 0.

Widths come from the manifests' statistics (``stats``, ``stats_by_source``): known before any
byte is read, so a mix that cannot be batched is refused when the ``WindowDataset`` is made.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from epishard.format.manifest import Manifest
from epishard.format.validate import declared_width

from .episode import Normalizer
from .multirate import resolve_streams
from .source import DatasetSource
from .spec import WindowSpec
from .transform import PostProcess

__all__ = [
    "MixLayout",
    "PadCamera",
    "camera_streams",
    "check_columns",
    "column_widths",
    "mix_layout",
    "normalizers",
    "resolve_specs",
]


@dataclass(frozen=True)
class PadCamera:
    """Padding returned for a camera a dataset lacks.

    Padding returned for a camera a dataset lacks: ``shape`` ``(T, C, H, W)``; uint16 ``[T, 1, H, W]``
    when ``depth``, else uint8 ``[T, 3, H, W]`` (then converted like real frames). The size is the
    crop/resize output (``PostProcess.output_shape``); a ``hook`` that changes it is not foreseen.
    """

    shape: tuple[int, int, int, int]
    depth: bool


@dataclass(frozen=True)
class MixLayout:
    """How samples of each dataset of a mix are made uniform (see the module docstring).

    ``offsets[d]``: dataset ``d``'s camera key -> frame offsets (int64), the cameras it decodes;
    ``names[d]``: dataset ``d``'s camera key -> the model's camera name; ``pads[d]``: model camera ->
    ``PadCamera`` for the cameras ``d`` lacks; ``widths``: column -> width it is padded to (columns
    given a ``<column>_dim_is_pad`` mask); ``depth``: model camera -> depth or RGB; ``specs[d]``:
    the window spec in dataset ``d``'s rows (at its frame rate: ``resolve_specs``).
    """

    offsets: list[dict[str, np.ndarray]]
    names: list[dict[str, str]]
    pads: list[dict[str, PadCamera]]
    widths: dict[str, int]
    depth: dict[str, bool]
    specs: list[WindowSpec]
    several_sizes: dict[str, str] = field(default_factory=dict)

    def check_batchable(self) -> None:
        """Refuse a camera whose frames come out in several sizes, for a reader that batches them.

        Raises:
            ValueError: naming the camera, each size (height x width) and an episode with it, and
                ``PostProcess(size=...)``: such frames cannot be stacked into one batch.
        """
        for model, each in self.several_sizes.items():
            raise ValueError(
                f"camera {model!r} has frames of several sizes (height x width: {each}): they cannot be stacked "
                "into one batch; give PostProcess(size=(height, width)) to resize them to one size"
            )

    def apply(self, sample: dict, d: int, finish=None) -> dict:
        """Dataset ``d``'s sample with the model's camera names, padding cameras and padded columns.

        ``finish``: the conversion applied to RGB frames (``PostProcess.finish``), also applied to
        padding so it matches; None leaves uint8 frames for a collate that converts them.

        Raises:
            ValueError: a column is wider than its target width (naming it and both widths).
        """
        frames = {key: (sample.pop(key), sample.pop(f"{key}_is_pad")) for key in self.names[d]}
        for key, (value, pad) in frames.items():
            sample[self.names[d][key]], sample[f"{self.names[d][key]}_is_pad"] = value, pad
        for name, pad in self.pads[d].items():
            # One zero broadcast to the shape (stride 0): no allocation per sample; collate copies it
            # into the batch, and writing into it in place raises instead of changing other samples.
            zeros = torch.zeros((1,) * len(pad.shape), dtype=torch.uint16 if pad.depth else torch.uint8).expand(
                pad.shape
            )
            sample[name] = finish(zeros) if finish is not None and not pad.depth else zeros
            sample[f"{name}_is_pad"] = torch.ones(pad.shape[0], dtype=torch.bool)
        for column, width in self.widths.items():
            value = sample[column]
            have = value.shape[-1]
            if have > width:
                raise ValueError(f"column {column!r} has {have} dimensions, wider than the {width} it is padded to")
            if have < width:
                value = torch.nn.functional.pad(value, (0, width - have))
            sample[column] = value
            sample[f"{column}_dim_is_pad"] = torch.arange(width) >= have
        return sample


def column_widths(manifest: Manifest, column: str) -> set[int]:
    """Widths (dimensions) of ``column`` in a dataset, from its manifest statistics.

    Widths (dimensions) of ``column`` in a dataset, from its manifest statistics (one per source
    when sources differ); empty when the manifest has no statistics for it.
    """
    found = [manifest.stats, *(manifest.stats_by_source or {}).values()]
    entries = [f.get(column) for f in found if isinstance(f, Mapping)]
    means = [e.get("mean") for e in entries if isinstance(e, Mapping)]
    # Only well-formed entries count: the reader uses statistics only when asked to normalise.
    return {len(m) for m in means if isinstance(m, (list, tuple)) and m}


def normalizers(
    manifest: Manifest, normalize: dict[str, str] | None, source: str, where: str = "manifest.json"
) -> dict[str, Normalizer]:
    """Column -> ``Normalizer`` for the episodes of one source of the dataset.

    Column -> ``Normalizer`` for the episodes of ``source`` (a source of the dataset): the dataset's
    statistics, or the source's own for a column whose width differs between its sources.

    ``where``: the manifest's path, as messages name it.

    Raises:
        KeyError: the manifest has no statistics for a column (naming it).
        FormatError: its statistics cannot normalise (``Normalizer.from_stats``: naming ``where``,
            the column and the statistic).
    """
    out = {}
    for column, mode in (normalize or {}).items():
        stats = manifest.stats.get(column)
        at = f"{where}: stats[{column!r}]"
        if stats is None:
            stats = (manifest.stats_by_source or {}).get(source, {}).get(column)
            at = f"{where}: stats_by_source[{source!r}][{column!r}]"
        if stats is None:
            raise KeyError(f"no statistics for column {column!r} (source {source!r}) in the manifest")
        mixed = column in (manifest.stats_mixed_widths or ())
        width = None if mixed else declared_width(manifest.features or {}, column)
        out[column] = Normalizer.from_stats(stats, mode, where=at, width=width)
    return out


def resolve_specs(sources: list[DatasetSource], spec: WindowSpec) -> list[WindowSpec]:
    """The window spec of each dataset of a mix, in rows at the dataset's own frame rate.

    A spec made from ``delta_timestamps`` (seconds) is resolved per dataset at its rate
    (``WindowSpec.at_fps``), as LeRobot's ``MultiLeRobotDataset`` does; a spec in rows is the same
    for every dataset, and one made for a given ``fps`` refuses a dataset of another rate.

    Raises:
        ValueError: an offset falls off a dataset's frame grid (naming the dataset, its rate, the key
            and the nearest allowed time); a dataset holds episodes of several rates and the spec is
            in seconds (naming an episode of each); a spec in rows made for another rate (naming the
            dataset, an episode and both rates).
    """
    out = []
    for source in sources:
        ix = source.index
        rates = np.unique(np.round(np.asarray(ix.fps, dtype=np.float64), 6)) if ix.num_episodes else np.zeros(0)
        if spec.delta_timestamps is not None and rates.size:
            if rates.size > 1:
                first = [int(np.flatnonzero(np.round(ix.fps, 6) == r)[0]) for r in rates]
                each = ", ".join(f"episode {ix.key(e)} is {ix.fps[e]:g} fps" for e in first)
                raise ValueError(
                    f"{source.shown}: its episodes have several frame rates ({each}), so the window spec's "
                    "delta_timestamps are other rows in each: convert each robot (frame rate) into its own "
                    "dataset and mix them, WindowDataset([a, b], spec), where each is resolved at its own rate"
                )
            out.append(spec.at_fps(float(rates[0]), source.shown))
            continue
        if spec.fps is not None:
            other = np.flatnonzero(np.abs(ix.fps - spec.fps) > 1e-6 * spec.fps)
            if other.size:
                e = int(other[0])
                raise ValueError(
                    f"{source.shown}: episode {ix.key(e)} is {ix.fps[e]:g} fps but the window spec's rows are "
                    f"at {spec.fps:g} fps ({other.size} episodes differ): give the window in seconds, "
                    "WindowSpec.from_delta_timestamps(...), and each dataset resolves it at its own rate"
                )
        out.append(spec)
    return out


def _cameras(
    sources: list[DatasetSource], specs: list[WindowSpec], camera_map: list[dict[str, str]]
) -> tuple[list[dict[str, np.ndarray]], list[dict[str, str]], list[list[str]]]:
    """Per dataset: camera key -> offsets, camera key -> model name, and the model cameras it lacks.

    ``specs``: each dataset's spec (``resolve_specs``); they differ only in their row offsets.

    Raises:
        ValueError: ``cameras=None`` over datasets whose cameras differ; a camera is mapped to a key
            the dataset lacks; a camera no dataset has; a lacking camera with ``missing_cameras="refuse"``.
    """
    spec = specs[0]
    if spec.cameras is None:
        if len({tuple(s.cameras) for s in sources}) > 1:
            have = "; ".join(f"{s.shown} has {s.cameras}" for s in sources)
            raise ValueError(
                f"the window spec takes every camera (cameras=None) but the datasets' cameras differ ({have}): "
                "name the model's cameras in WindowSpec(cameras=...) and map each dataset's keys to them (camera_map)"
            )
        return (
            [{c: np.zeros(1, dtype=np.int64) for c in s.cameras} for s in sources],
            [{c: c for c in s.cameras} for s in sources],
            [[] for _ in sources],
        )
    offsets: list[dict[str, np.ndarray]] = []
    names: list[dict[str, str]] = []
    lacking: list[list[str]] = []
    for source, mapping, own in zip(sources, camera_map, specs, strict=True):
        assert own.cameras is not None  # every spec of a mix names the same cameras
        keys = {model: mapping.get(model, model) for model in spec.cameras}  # entries for other cameras are unused
        bad = [f"{m!r} -> {k!r}" for m, k in keys.items() if m in mapping and k not in source.cameras]
        if bad:
            raise ValueError(f"{source.shown}: camera_map maps {', '.join(bad)}; the dataset has {source.cameras}")
        present = {m: k for m, k in keys.items() if k in source.cameras}
        offsets.append({k: np.asarray(own.cameras[m], dtype=np.int64) for m, k in present.items()})
        names.append({k: m for m, k in present.items()})
        lacking.append([m for m in spec.cameras if m not in present])
    nowhere = [m for m in spec.cameras if all(m in lack for lack in lacking)]
    if nowhere:
        raise KeyError(
            f"window spec names cameras {nowhere} that no dataset has: "
            + "; ".join(f"{s.shown} has {s.cameras}" for s in sources)
        )
    if spec.missing_cameras == "refuse":
        for source, lack in zip(sources, lacking, strict=True):
            if lack:
                raise KeyError(
                    f"{source.shown}: window spec names cameras {lack}; the dataset has {source.cameras} "
                    "(missing_cameras='refuse'; map its keys with camera_map, or pad with missing_cameras='pad')"
                )
    return offsets, names, lacking


def camera_streams(source: DatasetSource, cam: str) -> np.ndarray:
    """``source.index.camera_streams(cam)``; a KeyError names the index file and the episode.

    When the dataset's sources (robots converted into one output) have different cameras, the
    message says so, with each source's cameras, rather than read as damage to the index.
    """
    try:
        return source.index.camera_streams(cam)
    except KeyError as exc:
        ix = source.index
        names, offsets = ix.cam_names.to_pylist(), ix.episode_cams
        per: dict[str, set[str]] = {}
        for e, name in enumerate(ix.episode_column("source")):
            per.setdefault(name, set()).update(names[int(offsets[e]) : int(offsets[e + 1])])
        if len({frozenset(c) for c in per.values()}) > 1:
            each = "; ".join(f"{k}: {', '.join(sorted(c)) or 'none'}" for k, c in per.items())
            raise KeyError(
                f"{source.shown}: the window spec reads camera {cam!r}, but this dataset holds sources with different "
                f"cameras ({each}), converted into one output: convert each robot into its own dataset and mix them, "
                "WindowDataset([a, b], spec, mix=Mixing(camera_map=...)), or name only cameras every source has"
            ) from None
        raise KeyError(f"{source.index_file}: {exc.args[0]}") from None


def _kinds_and_shapes(
    sources: list[DatasetSource], names: list[dict[str, str]], post: PostProcess
) -> tuple[dict[str, bool], dict[str, set[tuple[int, int, int]]], dict[str, str]]:
    """Per model camera: depth or RGB, its frame shapes ``(C, H, W)``, and its several sizes (if any).

    The sizes come with an episode of each (``MixLayout.several_sizes``).

    Raises:
        ValueError: a camera is depth (uint16 ``[T, 1, H, W]``) in some episodes and RGB (uint8
            ``[T, 3, H, W]``) in others, of one dataset or across a mix (naming an episode of each).
            Frames of several sizes (no ``PostProcess(size=...)`` or crop making them one; not
            checked with a ``hook``, which may resize) are refused only where samples are batched
            (``MixLayout.check_batchable``).
    """
    depth: dict[str, bool] = {}
    shapes: dict[str, set[tuple[int, int, int]]] = {}
    example: dict[str, dict[bool, str]] = {}
    sized: dict[str, dict[tuple[int, int], str]] = {}  # model camera -> output (h, w) -> an episode with it
    for source, mapping in zip(sources, names, strict=True):
        ix = source.index
        for key, model in mapping.items():
            streams = camera_streams(source, key)
            for kind in (True, False):
                hits = np.flatnonzero(ix.cam_depth[streams] == kind)
                if hits.size:
                    example.setdefault(model, {}).setdefault(kind, f"episode {ix.key(int(hits[0]))} of {source.shown}")
            # One int64 per (height, width): a 1-D unique (np.unique(axis=0) took 4 s at 1M episodes).
            sizes, first = np.unique(
                (ix.cam_height[streams].astype(np.int64) << 32) | ix.cam_width[streams].astype(np.int64),
                return_index=True,
            )
            channels = 1 if ix.cam_depth[streams].any() else 3
            for hw, at in zip(sizes.tolist(), first.tolist(), strict=True):
                shape = post.output_shape(channels, int(hw >> 32), int(hw & 0xFFFFFFFF))
                shapes.setdefault(model, set()).add(shape)
                sized.setdefault(model, {}).setdefault(shape[1:], f"episode {ix.key(int(at))} of {source.shown}")
    for model, kinds in example.items():
        if len(kinds) == 2:
            raise ValueError(
                f"camera {model!r} is a depth camera (uint16 [T, 1, H, W]) in {kinds[True]} but RGB "
                f"(uint8 [T, 3, H, W]) in {kinds[False]}: its frames cannot be batched together. "
                "Leave it out of the window spec, or convert the episodes of each kind apart "
                "(--episodes) and do not mix them."
            )
        depth[model] = True in kinds
    several = {
        model: ", ".join(f"{h}x{w} ({at})" for (h, w), at in sorted(where.items()))
        for model, where in sized.items()
        if len(where) > 1 and post.hook is None
    }
    return depth, shapes, several


_NUMERIC = ("bool", "int", "uint", "halffloat", "float", "double")  # Arrow's names of numeric value types
_TEXT = ("string", "large_string", "utf8", "large_utf8", "string_view")


def _kind(dtype: str) -> str:
    """``"numeric"``, ``"text"`` or ``"other"`` for a manifest feature's ``dtype`` (an Arrow value type name)."""
    if dtype in _TEXT or (dtype.startswith("dictionary<values=") and dtype[18:].split(",")[0] in _TEXT):
        return "text"
    name = dtype.rstrip("0123456789")
    return "numeric" if name in _NUMERIC else "other"


def check_columns(sources: list[DatasetSource], spec: WindowSpec, normalized: Collection[str] = ()) -> None:
    """Refuse, when the ``WindowDataset`` is made, a window column a dataset cannot return.

    Every table column the spec reads (``state_key``, ``action_key``, ``column_offsets`` and
    ``extra_columns``) must be in each dataset's manifest ``features``; state, action and
    ``column_offsets`` must be numeric (bool, int, float, or fixed or variable lists of them);
    ``extra_columns`` numeric or text (returned as ``str``). An integer column of ``extra_columns``
    or ``column_offsets`` not in ``normalized`` is returned as int64, exactly, so it must be one in
    every dataset of the mix. Manifests without ``features`` are not checked (the read names such
    a column).

    Raises:
        KeyError: a dataset lacks a column (naming the dataset, the column, the spec field and
            the dataset's columns).
        ValueError: a column of another type (naming the dataset, the column, its type and the field),
            lists of varying length or of text, or a column that is text in one dataset and numeric
            (or integer and float) in another.
    """
    roles = {c: "extra_columns" for c in spec.extra_columns}
    roles.update({c: "column_offsets" for c in spec.column_offsets})
    if spec.action_key:
        roles[spec.action_key] = "action_key"
    if spec.state_key:
        roles[spec.state_key] = "state_key"
    kinds: dict[str, dict[str, str]] = {}  # column -> kind -> a dataset with it
    for source in sources:
        features = source.manifest.features
        if features is None:
            continue
        for column, role in roles.items():
            entry = features.get(column)
            if entry is None or entry.dtype == "video":
                have = sorted(name for name, f in features.items() if f.dtype != "video")
                hint = " (state_key=None / action_key=None leave it out)" if role in ("state_key", "action_key") else ""
                if column in source.cameras:
                    hint = (
                        " as a table column: it is a camera of the dataset (WindowSpec.from_delta_timestamps takes "
                        "keys outside observation.images.* as columns unless camera_keys= names them)"
                    )
                raise KeyError(
                    f"{source.shown}: the window spec's {role} asks for column {column!r}, which the dataset does not "
                    f"have{hint}; its columns: {have}"
                )
            kind = _kind(entry.dtype)
            if kind == "text" and entry.shape:
                raise ValueError(
                    f"{source.shown}: column {column!r} ({role}) holds lists of text (shape {list(entry.shape)}); "
                    "only a text column of one string per row is returned (as str): leave it out of the window spec"
                )
            if kind == "numeric" and None in entry.shape:
                raise ValueError(
                    f"{source.shown}: column {column!r} ({role}) holds lists of varying length (shape "
                    f"{list(entry.shape)}): its rows cannot be returned as one shape; leave it out of the window spec"
                )
            if kind == "numeric" or (kind == "text" and role == "extra_columns"):
                exact = role in ("extra_columns", "column_offsets") and column not in normalized
                if kind == "numeric" and exact and entry.dtype.startswith(("int", "uint")):
                    kind = "integer"  # returned as int64
                kinds.setdefault(column, {}).setdefault(kind, source.shown)
                continue
            allowed = "numbers or text (str)" if role == "extra_columns" else "numbers (only extra_columns return text)"
            raise ValueError(
                f"{source.shown}: column {column!r} ({role}) holds {entry.dtype} values of shape {list(entry.shape)}; "
                f"the reader returns {allowed}: leave it out of the window spec"
            )
    for column, seen in kinds.items():
        if len(seen) > 1:
            which = " but ".join(f"{kind} in {where}" for kind, where in sorted(seen.items()))
            raise ValueError(
                f"column {column!r} is {which}: its values cannot be batched together (text is str, integers int64, "
                "other numbers float32); leave it out of the window spec, normalise it, or mix datasets that agree"
            )


def _shapes(sources: list[DatasetSource], column: str) -> list[tuple[str, tuple]]:
    """Per dataset with ``features``: its URL and ``column``'s stored per-row shape (list widths; None: they vary)."""
    out = []
    for s in sources:
        entry = (s.manifest.features or {}).get(column)
        if entry is not None:
            out.append((s.shown, tuple(entry.shape)))
    return out


def _widths(sources: list[DatasetSource], spec: WindowSpec, pad_dims) -> dict[str, int]:
    """Column -> width to pad to (see ``mix_layout``).

    Multi-dimensional columns (``[2, 3]`` per row) keep their shape and are never padded.

    Raises:
        ValueError: widths differ but ``pad_dims=False``; a dataset is wider than a given width; a
            multi-dimensional column of several shapes, or named in ``pad_dims``.
    """
    columns = [c for c in (spec.state_key, spec.action_key if spec.action_horizon else None) if c]
    columns += [*spec.column_offsets, *spec.extra_columns]
    given = pad_dims if isinstance(pad_dims, dict) else {}
    unknown = sorted(set(given) - set(columns))
    if unknown:
        raise ValueError(f"pad_dims names {unknown}, which the window spec does not return ({columns})")
    out = {}
    for column in columns:
        shapes = _shapes(sources, column)
        if any(len(shape) > 1 for _, shape in shapes):  # kept as stored: only 1-D columns are padded
            if column in given or len({shape for _, shape in shapes}) > 1:
                have = "; ".join(f"{url} has {list(shape)}" for url, shape in shapes)
                raise ValueError(
                    f"column {column!r} is multi-dimensional ({have}): it is returned with its own shape, and "
                    "only 1-D columns are padded to a common width (pad_dims); give every dataset the same shape"
                )
            continue
        per = [(s.shown, column_widths(s.manifest, column)) for s in sources]
        widest = max((max(w) for _, w in per if w), default=0)
        if column in given:
            over = [f"{url} has {sorted(w)}" for url, w in per if w and max(w) > given[column]]
            if over:
                raise ValueError(f"pad_dims[{column!r}] = {given[column]} is narrower than the data: {'; '.join(over)}")
            out[column] = int(given[column])
        elif widest and (pad_dims is True or (pad_dims is not False and len(set().union(*(w for _, w in per))) > 1)):
            out[column] = widest
        elif pad_dims is False and len(set().union(*(w for _, w in per))) > 1:
            have = "; ".join(f"{url} has {sorted(w)}" for url, w in per)
            raise ValueError(
                f"column {column!r} differs in width across the mix ({have}) and pad_dims=False: its rows "
                "cannot be batched together; pad them (pad_dims=None or True) with a per-dimension mask"
            )
    return out


def mix_layout(
    sources: list[DatasetSource],
    spec: WindowSpec,
    post: PostProcess,
    camera_map: dict[str, str] | list[dict[str, str] | None] | None = None,
    pad_dims: bool | dict[str, int] | None = None,
    normalized: Collection[str] = (),
) -> MixLayout:
    """The ``MixLayout`` of a mix (one dataset is a mix of one).

    Args:
        camera_map: model camera -> the dataset's camera key; one dict for every dataset, or a list
            with one per dataset (None: keys as named in the spec).
        pad_dims: ``None``: columns whose width differs in the mix are padded to the widest, with
            ``<column>_dim_is_pad``; ``True``: every returned numeric column, always (the same keys
            whatever the mix); ``False``: never (a mix of widths is refused); a dict column -> width:
            those columns to that width, the others as with ``None``.

    Raises:
        KeyError / ValueError: see ``resolve_specs``, ``_cameras``, ``_kinds_and_shapes``, ``_widths``; a
            lacking camera whose frames have several shapes across the mix (set ``PostProcess(size=...)``).
    """
    maps = camera_map if isinstance(camera_map, list) else [camera_map] * len(sources)
    if len(maps) != len(sources):
        raise ValueError(f"camera_map has {len(maps)} entries for {len(sources)} datasets")
    specs = resolve_streams([s.index for s in sources], resolve_specs(sources, spec), [s.shown for s in sources])
    check_columns(sources, spec, normalized)
    offsets, names, lacking = _cameras(sources, specs, [m or {} for m in maps])
    depth, shapes, several = _kinds_and_shapes(sources, names, post)
    pads = []
    for lack in lacking:
        pad = {}
        for model in lack:
            if len(shapes[model]) > 1:
                raise ValueError(
                    f"camera {model!r} is padded in some datasets of the mix, but its frames have several "
                    f"shapes {sorted(shapes[model])}: give PostProcess(size=(height, width))"
                )
            pad[model] = PadCamera((len(spec.cameras[model]), *next(iter(shapes[model]))), depth[model])  # type: ignore[index]
        pads.append(pad)
    return MixLayout(offsets, names, pads, _widths(sources, spec, pad_dims), depth, specs, several)
