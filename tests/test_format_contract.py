"""The format is one contract (issue 15, items 1 and 5): ``manifest.Manifest`` loads and dumps
``manifest.json`` byte for byte, every reader refuses another format or a newer version naming the
file and both versions, ``index.arrow`` states its format version, and options refuse values
outside their vocabulary, listing the allowed ones."""

from __future__ import annotations

import hashlib
import json
import os
import re

import pyarrow as pa
import pyarrow.feather as feather
import pytest
from faultgen import copy, manifest, source, write_manifest

from epishard.cli import main as cli
from epishard.format.errors import FormatError
from epishard.format.manifest import FORMAT_VERSION, PLAIN_VERSION, VERSION_KEY, Manifest
from epishard.shardwriter import ConvertOptions, convert, verify
from epishard.shardwriter.describe import describe
from epishard.stream import DatasetSource
from epishard.stream.fetch import FetchPolicy

NEWER = FORMAT_VERSION + 1


def _bytes(root: str) -> bytes:
    with open(os.path.join(root, "manifest.json"), "rb") as f:
        return f.read()


# --- load and dump ------------------------------------------------------------------------------


def test_a_written_manifest_loads_and_dumps_byte_identical(intact):
    data = _bytes(intact)
    m = Manifest.load(data, "manifest.json")
    assert m.dump() == data
    assert Manifest.load(m.dump(), "manifest.json") == m
    assert (m.totals.episodes, len(m.shards), list(m.cameras)) == (6, 3, ["observation.images.front"])
    assert [s.episodes for s in m.shards] == [2, 2, 2] and m.shards[0].shard == "shard-000000.tar"


def test_convert_returns_what_it_writes_with_the_formats_spelling_of_raise(tmp_path):
    m = convert([source(2)], str(tmp_path), ConvertOptions(progress=False, timestamps="raise"))
    assert Manifest.load(_bytes(str(tmp_path)), "manifest.json") == m
    assert (m.options.on_error, m.options.timestamps) == ("raise", "raise")
    # Version 2 spells "raise" as "fail" on disk: manifests and plan digests of earlier runs hold.
    assert (manifest(str(tmp_path))["options"]["on_error"], manifest(str(tmp_path))["options"]["timestamps"]) == (
        "fail",
        "fail",
    )


# Every shape the writer has produced: a version-1 camera (no kind), one with sizes and a
# conversion, a skipped entry (file null, shard named) and a warning (neither key), null cameras
# option and fps, nested feature names, a Python-API source without a path.
_EVERY_SHAPE = {
    "cameras": {
        "observation.images.a": {"codec": "h264", "episodes": 1, "fps": 30, "height": 8, "width": 8},
        "observation.images.b": {
            "bit_depth": 10,
            "channels": 3,
            "codec": "hevc",
            "conversion": "yuv420p10le (10 bits per sample) is returned as 8-bit RGB (uint8)",
            "dtype": "uint8",
            "episodes": 3,
            "fps": 30.0,
            "height": 48,
            "kind": "rgb",
            "pix_fmt": "yuv420p10le",
            "sizes": {"48x64": 2, "64x48": 1},
            "width": 64,
        },
    },
    "features": {
        "action": {"dtype": "float", "names": {"motors": ["a", "b"]}, "shape": [2]},
        "observation.images.b": {
            "dtype": "video",
            "kind": "rgb",
            "names": ["height", "width", "channel"],
            "shape": [48, 64, 3],
        },
        "observation.state": {"dtype": "double", "names": None, "shape": [None]},
    },
    "format": "epishard",
    "format_version": 2,
    "fps": None,
    "index": {"file": "index.arrow", "sha256": "a" * 64},
    "options": {"cameras": None, "on_error": "skip", "prefix": "shard", "timestamps": "warn", "video": "copy"},
    "plan_digest": "b" * 64,
    "report": {
        "skipped": [
            {
                "camera": None,
                "dataset": "api",
                "episode": 4,
                "file": None,
                "kind": "nan",
                "message": "NaN in action",
                "row": 7,
                "shard": "shard-000000.tar",
            }
        ],
        "skipped_by_kind": {"nan": 1},
        "warnings": [
            {
                "camera": "observation.images.b",
                "dataset": "api",
                "episode": 0,
                "kind": "timestamps_offset",
                "message": "offset",
                "row": 0,
            }
        ],
        "warnings_by_kind": {"timestamps_offset": 1},
    },
    "shards": [
        {
            "episodes": 3,
            "frames": 60,
            "index": "shard-000000.index.parquet",
            "index_sha256": "c" * 64,
            "rows": 30,
            "sha256": "d" * 64,
            "shard": "shard-000000.tar",
            "size": 10240,
        }
    ],
    "sources": [{"episodes": 3, "format": "api", "fps": 30, "name": "api", "notes": [], "path": None}],
    "stats": {
        "action": {
            "count": [30],
            "max": [1.0, 1.0],
            "mean": [0.5, 0.5],
            "min": [0.0, 0.0],
            "q01": [0.0, 0.0],
            "q99": [1.0, 1.0],
            "std": [0.1, 0.1],
        }
    },
    "stats_by_source": {"api": {}},
    "stats_mixed_widths": ["observation.state"],
    "tasks": ["pick", "place"],
    "totals": {"bytes": 10240, "episodes": 3, "frames": 60, "rows": 30, "shards": 1, "skipped": 1},
}


def test_every_shape_the_writer_produced_round_trips_byte_identical():
    data = json.dumps(_EVERY_SHAPE, indent=1, sort_keys=True).encode()
    m = Manifest.load(data, "m.json")
    assert m.dump() == data and Manifest.load(m.dump(), "m.json") == m
    a, b = m.cameras["observation.images.a"], m.cameras["observation.images.b"]
    assert (a.kind, a.conversion, b.kind, b.sizes) == (None, None, "rgb", {"48x64": 2, "64x48": 1})
    assert (m.report.skipped[0].shard, m.report.warnings[0].shard, m.options.cameras) == (
        "shard-000000.tar",
        None,
        None,
    )


# --- format and version ---------------------------------------------------------------------------


def _newer(root: str) -> str:
    m = manifest(root)
    m["format_version"] = NEWER
    write_manifest(root, m)
    return os.path.join(root, "manifest.json")


NEWER_MESSAGE = (
    f"format_version {NEWER} is newer than this epishard reads (format versions 1 to {FORMAT_VERSION}): "
    "upgrade epishard to read it"
)


def test_a_newer_version_is_refused_by_reader_verify_and_inspect(intact, tmp_path, capsys):
    root = copy(intact, str(tmp_path / "ds"))
    path = _newer(root)
    expected = re.escape(f"{path}: {NEWER_MESSAGE}")
    with pytest.raises(FormatError, match=expected):
        DatasetSource(root)
    with pytest.raises(FormatError, match=expected):
        verify(root)
    with pytest.raises(FormatError, match=expected):
        describe(root)
    for command in ("inspect", "verify"):
        assert cli([command, root]) == 2
        assert capsys.readouterr().err.strip() == f"epishard {command}: error: {path}: {NEWER_MESSAGE}"


def test_another_format_is_refused(intact, tmp_path):
    root = copy(intact, str(tmp_path / "ds"))
    m = manifest(root)
    m["format"] = "webdataset"
    write_manifest(root, m)
    with pytest.raises(FormatError, match=r"manifest.json: format 'webdataset' is not 'epishard': not an epishard"):
        DatasetSource(root)
    with pytest.raises(FormatError, match=r"format 'webdataset' is not 'epishard'"):
        verify(root)


# --- index.arrow states its version -------------------------------------------------------------------


def test_index_arrow_states_its_format_version(intact):
    schema = feather.read_table(os.path.join(intact, "index.arrow")).schema
    assert schema.metadata[VERSION_KEY] == str(PLAIN_VERSION).encode()  # no streams: version 2, as before


def _restate(root: str, version: bytes | None) -> None:
    """Rewrite ``index.arrow`` with another stated version (None: none, as older writers), its
    sha256 updated in the manifest so that only the version check can object."""
    table = feather.read_table(os.path.join(root, "index.arrow"))
    table = table.replace_schema_metadata(None if version is None else {VERSION_KEY: version})
    sink = pa.BufferOutputStream()
    feather.write_feather(table, sink, compression="uncompressed")
    data = sink.getvalue().to_pybytes()
    with open(os.path.join(root, "index.arrow"), "wb") as f:
        f.write(data)
    m = manifest(root)
    m["index"]["sha256"] = hashlib.sha256(data).hexdigest()
    write_manifest(root, m)


@pytest.mark.parametrize(
    "version, message",
    [
        (str(NEWER).encode(), NEWER_MESSAGE),
        (b"1", f"format_version 1 in its schema metadata, the manifest's format_version is {PLAIN_VERSION}"),
        (b"x", "schema metadata epishard.format_version b'x' is not a version"),
    ],
)
def test_index_arrow_of_another_version_is_refused(intact, tmp_path, version, message):
    root = copy(intact, str(tmp_path / "ds"))
    _restate(root, version)
    with pytest.raises(FormatError, match=re.escape(f"{root}/index.arrow: {message}")):
        DatasetSource(root)
    result = verify(root, decode=False)
    assert not result["ok"] and [p["message"] for p in result["problems"]] == [
        f"index.arrow: {root}/index.arrow: {message}"
    ]


def test_index_arrow_without_a_version_reads_as_the_manifests(intact, tmp_path):
    root = copy(intact, str(tmp_path / "ds"))
    _restate(root, None)  # as written before index.arrow kept it
    assert DatasetSource(root).index.num_episodes == 6 and verify(root, decode=False)["ok"]


# --- options: one vocabulary, checked at construction -----------------------------------------------------


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: ConvertOptions(on_error="abort"),
            "ConvertOptions: invalid on_error 'abort'; allowed values are 'raise', 'skip'",
        ),
        (
            lambda: ConvertOptions(timestamps="skip"),
            "ConvertOptions: invalid timestamps 'skip'; allowed values are 'warn', 'raise'",
        ),
        (
            lambda: FetchPolicy(on_shard_error="warn"),
            "FetchPolicy: invalid on_shard_error 'warn'; allowed values are 'skip', 'raise'",
        ),
        (
            lambda: FetchPolicy(mode="random"),
            "FetchPolicy: invalid mode 'random'; allowed values are 'stream', 'ranged'",
        ),
    ],
)
def test_an_option_outside_its_vocabulary_is_refused_listing_the_allowed_values(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


def test_fail_is_a_deprecated_spelling_of_raise():
    with pytest.warns(DeprecationWarning, match="on_error='fail' is deprecated, use 'raise'"):
        options = ConvertOptions(on_error="fail")
    with pytest.warns(DeprecationWarning, match="timestamps='fail' is deprecated"):
        assert ConvertOptions(timestamps="fail").timestamps == "raise"
    assert options == ConvertOptions(on_error="raise")


def _audio_only() -> bytes:
    """A Matroska file holding one audio stream and no video stream."""
    import io

    import av
    import numpy as np

    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska") as container:
        stream = container.add_stream("pcm_s16le", rate=8000, layout="mono")
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format="s16", layout="mono")
        frame.sample_rate = 8000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return buf.getvalue()


def test_the_decoder_glue_raises_its_own_error_and_the_writer_its_conversion_error():
    import io

    import av

    from epishard.format import decoder
    from epishard.format.errors import VideoError
    from epishard.shardwriter import video
    from epishard.shardwriter.errors import ConversionError

    data = _audio_only()
    said = "no video stream in file: no video stream holds frames"
    with av.open(io.BytesIO(data)) as container:
        with pytest.raises(VideoError) as contract:
            decoder.frame_stream(container)
        with pytest.raises(ConversionError) as writer:
            video.frame_stream(container)
    assert str(contract.value) == said and not isinstance(contract.value, ConversionError)
    assert writer.value.kind == "unreadable_video" and writer.value.detail == said
    with pytest.raises(ConversionError, match=re.escape(f"[unreadable_video] : {said}")):
        video.probe(data)
    assert decoder.container_frames(data, -1) is None  # the reader's bound: not stated, not refused here
