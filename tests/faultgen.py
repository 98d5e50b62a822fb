"""Damaged datasets for the fault tests: a tiny generated dataset, and copies of it with one byte
flipped, a file replaced, or the manifest / index rewritten (optionally with their sha256 digests
updated, as a forger would, so that the value checks, not the digests, must catch the change).

Test-support module (not a test file). Frames carry their number (``videogen``): episode ``e``'s
frame ``i`` shows ``100 * e + i``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import signal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.feather as feather
import pyarrow.parquet as pq
from videogen import make_episode_table, make_video

from epishard.format.manifest import Manifest
from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Source, WindowIndex, convert
from epishard.stream import WindowSpec, segment


class Hang(BaseException):
    """A test ran past its alarm. A BaseException, so no ``except Exception`` (the CLI's one-line
    error handler, the reader's shard policy) can turn a hang into a 'clean' error."""


@contextlib.contextmanager
def hang_alarm(seconds: int):
    """Raise ``Hang`` in the main thread when the block runs longer than ``seconds``."""

    def hung(*_):
        raise Hang(f"hung for {seconds} s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


CAMERA = "observation.images.front"
ROWS = 20
SPEC = WindowSpec(cameras={CAMERA: segment(0, 4, 2)}, action_horizon=2, boundary="pad")


def source(episodes: int = 6) -> Source:
    """``episodes`` episodes of ``ROWS`` rows, one 32x32 H.264 camera (keyframe every 5 frames);
    episode ``e``'s frame ``i`` shows ``100 * e + i``."""
    return Source(
        name="g",
        fps=20,
        episodes=[
            Episode(
                source="g",
                episode_index=e,
                table=make_episode_table(ROWS),
                fps=20,
                tasks=(f"task {e}",),
                videos={CAMERA: CameraVideo(make_video(None, ROWS, gop=5, start_number=100 * e, height=32, width=32))},
            )
            for e in range(episodes)
        ],
    )


def make_dataset(out: str, episodes: int = 6, per_shard: int = 2) -> str:
    """``source(episodes)`` converted with ``per_shard`` episodes per shard. Returns ``out``."""
    convert([source(episodes)], out, ConvertOptions(max_episodes_per_shard=per_shard, progress=False))
    return out


def copy(src: str, dst: str) -> str:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


def manifest(root: str) -> dict:
    """The manifest as raw JSON, for tests that damage it."""
    with open(os.path.join(root, "manifest.json")) as f:
        return json.load(f)


def loaded(root: str) -> Manifest:
    """The manifest as readers see it (``manifest.Manifest.load``)."""
    path = os.path.join(root, "manifest.json")
    with open(path, "rb") as f:
        return Manifest.load(f.read(), path)


def write_manifest(root: str, data) -> None:
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump(data, f)


def video_member(root: str, shard: int, episode_in_shard: int = 0) -> dict:
    """The index entry (name, offset, size, sha256) of a video member of a shard's episode."""
    index = WindowIndex.load_dataset(root)
    rows = [index.row(e) for e in range(index.num_episodes) if index.shard[e] == shard]
    return next(m for m in rows[episode_in_shard]["members"] if m["name"].endswith(".mp4"))


def flip_byte(root: str, shard: int, offset: int) -> None:
    path = os.path.join(root, loaded(root).shards[shard].shard)
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def rewrite_index(root: str, edit, digests: bool = True) -> None:
    """Apply ``edit(rows)`` (rows of ``index.arrow`` as dicts, edited in place) and write the result
    back to ``index.arrow`` and the per-shard indexes; with ``digests``, update the manifest's
    sha256 of every file that changed, as a consistent forger would."""
    m = manifest(root)
    table = feather.read_table(os.path.join(root, "index.arrow"))
    rows = table.to_pylist()
    edit(rows)
    table = pa.Table.from_pylist(rows, schema=table.schema)
    _write_arrow(root, m, table, digests)
    for i, entry in enumerate(m["shards"]):
        path = os.path.join(root, entry["index"])
        meta = pq.read_schema(path).metadata
        part = table.filter(pc.equal(table.column("shard"), i)).drop_columns(["shard"])
        buf = io.BytesIO()
        pq.write_table(part.replace_schema_metadata(meta), buf, compression="zstd")
        with open(path, "wb") as f:
            f.write(buf.getvalue())
        if digests:
            entry["index_sha256"] = hashlib.sha256(buf.getvalue()).hexdigest()
    write_manifest(root, m)


def _write_arrow(root: str, m: dict, table: pa.Table, digests: bool) -> None:
    sink = pa.BufferOutputStream()
    feather.write_feather(table, sink, compression="uncompressed")
    data = sink.getvalue().to_pybytes()
    with open(os.path.join(root, "index.arrow"), "wb") as f:
        f.write(data)
    if digests:
        m["index"]["sha256"] = hashlib.sha256(data).hexdigest()


def rewrite_shard_member(root: str, shard: int, member: dict, data: bytes) -> None:
    """Replace a member's bytes in its tar (same length) and update every digest that covers it."""
    assert len(data) == member["size"]
    m = manifest(root)
    path = os.path.join(root, m["shards"][shard]["shard"])
    with open(path, "r+b") as f:
        f.seek(member["offset"])
        f.write(data)
    with open(path, "rb") as f:
        m["shards"][shard]["sha256"] = hashlib.sha256(f.read()).hexdigest()
    write_manifest(root, m)
    digest = hashlib.sha256(data).hexdigest()

    def edit(rows):
        for row in rows:
            for mm in row["members"]:
                if mm["name"] == member["name"]:
                    mm["sha256"] = digest

    rewrite_index(root, edit)


def convert_to_s3(moto_s3, bucket: str):
    """``source()`` converted to ``s3://BUCKET/ds`` (2 episodes per shard) on ``moto_s3``'s server.

    Returns ``moto_s3``: ``(storage options, s3fs filesystem)``.
    """
    from epishard.shardwriter import ConvertOptions, convert

    options, fs = moto_s3
    fs.mkdir(bucket)
    convert(
        [source()],
        f"s3://{bucket}/ds",
        ConvertOptions(max_episodes_per_shard=2, progress=False),
        storage_options=options,
    )
    return options, fs
