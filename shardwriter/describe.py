"""Summaries of a converted dataset as data and as text.

``describe`` (``epishard inspect``: shards, episodes, cameras, codecs, GOPs, columns, streams at
their own rate), and the text the CLI prints after ``convert`` and ``verify``.

Internal: import from ``epishard.shardwriter``.
"""

from __future__ import annotations

import sys

import numpy as np

from epishard.format import manifest as fmt
from epishard.format.opening import load_shard_indexes, open_manifest
from epishard.format.storage import Storage
from epishard.format.untrusted import printable
from epishard.format.validate import totals_mismatches
from epishard.redact import scrubbed

__all__ = ["describe", "render", "render_conversion", "render_verification"]


@scrubbed  # its exceptions and their chains name no credentials
def describe(root: str, storage_options: dict | None = None, progress: bool = False) -> dict:
    """Summarise the dataset at ``root`` from its manifest and indexes (no tar is read).

    ``root``: a local folder or any fsspec URL; ``storage_options`` as ``storage.Storage`` takes them.

    ``progress``: a progress bar on stderr over the per-shard indexes read (one file per shard).

    Raises:
        NotConverted (a FileNotFoundError): ``root`` is a LeRobot dataset or a Hub repo id
            (``lerobot_instead``). FileNotFoundError: no such local folder, or no manifest.
            ``epishard.format.errors.FormatError``: the manifest or an index breaks the format (checked as
            the reader checks them), or the manifest's ``totals`` are not what its shard list adds up to
            (``validate.totals_mismatches``).
    """
    storage = Storage(root, storage_options)
    manifest = open_manifest(storage)
    where = f"{storage.url}/{fmt.MANIFEST_NAME}"
    mismatches = totals_mismatches(manifest)
    if mismatches:  # the summary would print them as the dataset's size
        raise fmt.FormatError(f"{where}: " + "; ".join(mismatches) + " (run epishard verify)")
    from tqdm import tqdm

    with tqdm(total=len(manifest.shards), unit="shard", desc="inspect", disable=not progress, file=sys.stderr) as bar:

        def read_index(name: str) -> bytes:
            data = storage.read(name)
            bar.update(1)
            return data

        index = load_shard_indexes(manifest, read_index, root)
    cameras = {}
    for cam_name, camera in manifest.cameras.items():
        streams = np.flatnonzero(index.cam_names.to_numpy(zero_copy_only=False) == cam_name)
        per_stream = []
        for s in streams:
            keys = index.keyframes_of(int(s))
            ends = np.append(keys[1:], index.cam_num_frames[s])
            per_stream.append(ends - keys)
        gaps = np.concatenate(per_stream) if per_stream else np.zeros(1)
        cameras[cam_name] = {
            **camera.to_json(),
            "frames": int(index.cam_num_frames[streams].sum()),
            "keyframe_interval": {"min": int(gaps.min()), "mean": round(float(gaps.mean()), 1), "max": int(gaps.max())},
            "bytes": int(index.cam_size[streams].sum()),
        }
    return {
        "root": root,
        "format_version": manifest.format_version,
        "sources": [{k: getattr(s, k) for k in ("name", "format", "episodes", "fps")} for s in manifest.sources],
        "totals": manifest.totals.to_json(),
        "shards": [s.to_json() for s in manifest.shards],
        "episode_rows": {
            "min": int(index.num_rows.min()),
            "mean": round(float(index.num_rows.mean()), 1),
            "max": int(index.num_rows.max()),
        },
        "cameras": cameras,
        "columns": _columns(manifest),
        "streams": {name: entry.to_json() for name, entry in (manifest.streams or {}).items()},
        "tasks": len(manifest.tasks),
        "report": {
            "skipped_by_kind": dict(manifest.report.skipped_by_kind),
            "warnings_by_kind": dict(manifest.report.warnings_by_kind),
        },
    }


def _columns(manifest: fmt.Manifest) -> dict[str, dict]:
    """Table column -> ``{"dtype", "shape", "names"}`` from the manifest's ``features`` (cameras left out).

    ``shape``: the per-row list widths (``[]`` for a scalar; None where lengths vary). A column whose
    width differs between sources (``stats_mixed_widths``: other robots) also gets ``"widths"``,
    source -> width, from each source's statistics.
    """
    out: dict[str, dict] = {}
    for name, f in (manifest.features or {}).items():
        if f.dtype == "video":
            continue
        entry: dict = {"dtype": f.dtype, "shape": list(f.shape), "names": f.names}
        if name in (manifest.stats_mixed_widths or ()):
            widths = {}
            for source, stats in (manifest.stats_by_source or {}).items():
                mean = stats.get(name, {}).get("mean") if isinstance(stats, dict) else None
                if isinstance(mean, list):
                    widths[source] = len(mean)
            entry["widths"] = widths
        out[name] = entry
    return out


def _ms(seconds: float) -> str:
    """An interval in milliseconds: one decimal, three significant digits below 0.095 ms."""
    ms = seconds * 1e3
    return f"{ms:.1f}" if ms >= 0.095 or ms == 0 else f"{ms:.3g}"


def _stream_line(name: str, s: dict) -> str:
    """One stream at its own rate as ``render`` lists it (``manifest.StreamEntry``'s JSON object)."""
    shape = "[" + ", ".join(str(n) for n in s["shape"]) + "]"
    rate = f"{s['rate']:.5g} Hz" if s.get("rate") is not None else "no rate (fewer than 2 samples)"
    nominal = f" (nominal {s['nominal_rate']:.5g} Hz)" if s.get("nominal_rate") is not None else ""
    gaps = f"{s['gaps']} gap{'' if s['gaps'] == 1 else 's'}"
    return (
        f"  stream {name}: {s['dtype']} {shape}, {s['episodes']} episodes, {s['samples']:,} samples, "
        f"{rate}{nominal}, intervals {_ms(s['min_interval'])}-{_ms(s['max_interval'])} ms, {gaps}"
    )


def _names(names) -> str:
    """A feature's ``names`` as one short text: the first 6 of a flat list (or of its one inner list), else ''."""
    if isinstance(names, dict) and len(names) == 1:
        names = next(iter(names.values()))
    if isinstance(names, list) and len(names) == 1 and isinstance(names[0], list):
        names = names[0]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        return ""
    more = f", ... ({len(names)})" if len(names) > 6 else ""
    return f" ({', '.join(names[:6])}{more})"


def _shown(value):
    """``value`` (a summary or problem: dicts, lists, strings) with every string ``untrusted.printable``.

    Names and messages come from the manifest and indexes: shown escaped, never as raw control characters.
    """
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {_shown(k): _shown(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_shown(v) for v in value]
    return value


def render(summary: dict) -> str:
    """Human-readable text of ``describe``'s result; control characters in its strings escaped (``_shown``)."""
    summary = _shown(summary)
    t = summary["totals"]
    lines = [
        f"{summary['root']}: epishard format v{summary['format_version']}",
        f"  {t['shards']} shards, {t['episodes']} episodes, {t['rows']} rows, {t['frames']} camera frames, "
        f"{t['bytes'] / 1e6:.1f} MB, {t['skipped']} skipped",
        f"  episode length (rows): min {summary['episode_rows']['min']}, mean {summary['episode_rows']['mean']}, "
        f"max {summary['episode_rows']['max']}; {summary['tasks']} tasks",
    ]
    for s in summary["sources"]:
        lines.append(f"  source {s['name']} ({s['format']}, {s['fps']:g} fps): {s['episodes']} episodes")
    for name, c in summary["cameras"].items():
        k = c["keyframe_interval"]
        kind = f" {c.get('pix_fmt')}, read as {c.get('kind', 'rgb')} {c.get('dtype', 'uint8')}" if "kind" in c else ""
        lines.append(
            f"  camera {name}: {c['codec']} {c['width']}x{c['height']}{kind}, {c['episodes']} episodes, "
            f"{c['frames']} frames, {c['bytes'] / 1e6:.1f} MB, keyframe interval min {k['min']} / "
            f"mean {k['mean']} / max {k['max']} frames"
        )
        if c.get("conversion"):
            lines.append(f"    conversion: {c['conversion']}")
        if "sizes" in c:  # episodes of other sizes (height x width, as the reader returns them)
            lines.append("    sizes: " + ", ".join(f"{size} ({n} episodes)" for size, n in c["sizes"].items()))
    for name, c in summary.get("columns", {}).items():
        shape = "[" + ", ".join("*" if n is None else str(n) for n in c["shape"]) + "]"
        widths = c.get("widths")
        by = f", width by source: {', '.join(f'{k} {w}' for k, w in widths.items())}" if widths else ""
        lines.append(f"  column {name}: {c['dtype']} {shape}{_names(c['names'])}{by}")
    for name, st in summary.get("streams", {}).items():
        lines.append(_stream_line(name, st))
    for s in summary["shards"]:
        lines.append(f"  {s['shard']}: {s['episodes']} episodes, {s['rows']} rows, {s['size'] / 1e6:.1f} MB")
    for kind, n in summary["report"]["skipped_by_kind"].items():
        lines.append(f"  skipped {n} episode(s): {kind}")
    for kind, n in summary["report"]["warnings_by_kind"].items():
        lines.append(f"  warning x{n}: {kind}")
    return "\n".join(lines)


def render_conversion(manifest: fmt.Manifest, out: str, seconds: float) -> str:
    """Text the CLI prints after ``convert``.

    Notes, converted cameras, skips and warnings by kind, the videos per check level, then one
    summary line (shards, episodes, rows, MB, seconds).
    """
    lines = []
    for source in manifest.sources:
        lines += [f"  note: {source.name}: {note}" for note in source.notes]
    for name, cam in manifest.cameras.items():
        if cam.conversion or cam.kind == "depth":
            lines.append(
                f"  camera {name}: " + (cam.conversion or f"depth, read as uint16 [T, 1, H, W] ({cam.pix_fmt})")
            )
    report = manifest.report
    lines += [f"  skipped {n} episode(s): {kind}" for kind, n in report.skipped_by_kind.items()]
    for kind, n in report.warnings_by_kind.items():
        example = next(w for w in report.warnings if w.kind == kind)
        camera = f" camera {example.camera}" if example.camera else ""
        where = f"e.g. episode {example.episode}{camera}: " if example.episode is not None else ""
        lines.append(f"  warning x{n} {kind}: {where}{example.message}")
    if report.checks:  # (none when no video was stored: a conversion without cameras)
        lines.append("  frame tables checked: " + ", ".join(f"{level} x{n}" for level, n in report.checks.items()))
    lines = [printable(line) for line in lines]  # names and messages come from the sources
    t = manifest.totals
    lines.append(
        f"wrote {t.shards} shards, {t.episodes} episodes, {t.rows} rows, {t.bytes / 1e6:.1f} MB to {out} "
        f"in {seconds:.1f} s"
    )
    return "\n".join(lines)


def render_verification(result: dict, root: str, seconds: float) -> str:
    """Text the CLI prints after ``verify``.

    One line per problem (file, shard, episode, camera, stream, message; control characters escaped), then one
    summary line ending in ``OK`` or the number of problems.
    """
    lines = []
    for p in _shown(result["problems"]):  # names and messages quote the manifest and indexes
        keys = ("file", "shard", "episode", "camera", "stream")
        where = " ".join(f"{k}={p[k]}" for k in keys if p.get(k) is not None)
        lines.append(f"  {where}: {p['message']}" if where else f"  {p['message']}")
    notes = _shown(result.get("notes", []))
    for kind, n in result.get("notes_by_kind", {}).items():
        p = next(x for x in notes if x["note"] == kind)
        lines.append(
            f"  note x{n} {kind}: e.g. shard={p['shard']} episode={p['episode']} camera={p['camera']}: {p['message']}"
        )
    verdict = "OK" if result["ok"] else f"{len(result['problems'])} problem(s)"
    lines.append(
        f"{root}: {result['shards']} shards, {result['episodes']} episodes, checked in {seconds:.1f} s: {verdict}"
    )
    return "\n".join(lines)
