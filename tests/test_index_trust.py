"""The reader checks what it trusts (issue 11, item 4): the dataset index against the manifest's
sha256 on load (per-shard indexes when it uses them), every index value bounds-checked before it
sizes an allocation, and a decode failure handled by the shard policy, never a crash. ``verify``
checks everything the reader needs.
"""

from __future__ import annotations

import os
import tracemalloc
import warnings
from pathlib import Path

import pytest
import torch
from faultgen import (
    CAMERA,
    SPEC,
    copy,
    loaded,
    manifest,
    rewrite_index,
    rewrite_shard_member,
    video_member,
    write_manifest,
)

from epishard.format.errors import FormatError
from epishard.shardwriter import verify
from epishard.stream import WindowDataset
from epishard.stream.decode import DecodeError
from epishard.stream.fetch import FetchPolicy
from epishard.stream.options import ReadOptions


def _set(episode: int, field: str, value, camera: bool = False):
    def edit(rows):
        (rows[episode]["cameras"][0] if camera else rows[episode])[field] = value

    return edit


def test_a_changed_task_text_is_refused_by_the_digest(intact, tmp_path):
    root = copy(intact, str(tmp_path / "ds"))
    rewrite_index(root, _set(2, "task", "stack the red cup"), digests=False)
    with pytest.raises(FormatError, match=r"index.arrow: sha256 differs from the manifest's index.sha256"):
        WindowDataset(root, SPEC)
    assert any("index.arrow sha256 differs" in p["message"] for p in verify(root, decode=False)["problems"])


@pytest.mark.parametrize(
    "field, value, message",
    [
        (
            "first_frame",
            5,
            r"row 2 \(episode g-e000002\), camera observation.images.front: first_frame 5 \+ num_rows runs "
            "outside the video's frames",
        ),
        ("num_frames", 2**31 - 1, r"num_frames 2147483647 is not between 1 and the video member's size"),
        ("keyframes", [0, 30], r"keyframes are not ascending frame numbers below num_frames"),
        ("row_to_frame", [0] * 19 + [20], r"row_to_frame holds frames outside the video"),
        ("member", 7, r"member 7 is not a member of the episode"),
        ("width", 0, r"width/height are not in \[1, 65536\]"),
    ],
)
def test_index_values_are_bounds_checked_before_use(intact, tmp_path, field, value, message):
    root = copy(intact, str(tmp_path / "ds"))
    rewrite_index(root, _set(2, field, value, camera=True))  # a consistent forgery: digests updated
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match=message):
            WindowDataset(root, SPEC)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20  # nothing sized by the forged value (2^31 frames would be 16 GiB of tables)
    assert any(field in p["message"] for p in verify(root, decode=False)["problems"])


def _packets(edit):
    """An edit of episode 2's packet table (``edit(camera)``), its offsets made explicit first."""

    def rewrite(rows):
        camera = rows[2]["cameras"][0]
        if not camera["packet_offset"]:
            sizes = camera["packet_size"]
            camera["packet_offset"] = [camera["packet_start"] + sum(sizes[:i]) for i in range(len(sizes))]
        edit(camera)

    return rewrite


def _repeat_frame(camera):
    camera["packet_frame"][1] = camera["packet_frame"][0]  # as many frames shown, one of them twice


def _past_member(camera):
    camera["packet_offset"][-1] += 10**6


def _backwards(camera):
    camera["packet_offset"][1], camera["packet_offset"][2] = camera["packet_offset"][2], camera["packet_offset"][1]


def _zero_size(camera):
    camera["packet_size"][3] = 0


def _short_crc(camera):
    camera["packet_crc32"] = camera["packet_crc32"][:-1]


@pytest.mark.parametrize(
    "edit, message",
    [
        (_repeat_frame, "packet_frame 19 does not show each frame once"),
        (_past_member, "packet_offset lies outside the video member or is not after the packet before it"),
        (_backwards, "packet_offset lies outside the video member or is not after the packet before it"),
        (_zero_size, "packet_size is not positive"),
        (_short_crc, "packet_crc32 19 does not list one value per packet"),
    ],
)
def test_packet_tables_are_checked_at_a_streams_first_use(intact, tmp_path, edit, message):
    """A dataset's open checks values per episode and camera (its cost must not grow with packets:
    hundreds of millions at a million episodes); a stream's packet table is checked before its first
    read, with the same rules as ``verify``'s check of every table."""
    root = copy(intact, str(tmp_path / "ds"))
    rewrite_index(root, _packets(edit))
    ds = WindowDataset(root, SPEC, seed=5, read=ReadOptions(fetch=FetchPolicy(on_shard_error="raise")))
    where = os.path.join(root, "index.arrow")
    with pytest.raises(FormatError, match=rf"{where}: row 2 \(episode g-e000002\), camera {CAMERA}: {message}"):
        list(ds)
    assert any(message in p["message"] for p in verify(root, decode=False)["problems"])


def test_the_streams_packet_tables_pass_both_checks(intact):
    """Every stream's table passes the per-stream check, and the whole-index check agrees."""
    from epishard.format.index import WindowIndex
    from epishard.format.validate import check_stream_packets

    index = WindowIndex.load_dataset(intact)
    for stream in range(index.cam_num_frames.size):
        check_stream_packets(index, stream, "index.arrow")
    assert verify(intact, decode=False)["problems"] == []


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("num_rows", 0, r"row 1 \(episode g-e000001\): num_rows 0 is not positive"),
        ("window_stop", 99, r"window_start/window_stop are not inside \[0, num_rows\]"),
        ("fps", float("nan"), r"fps nan is not a positive number"),
        ("shard", 7, r"shard 7 is not a shard of the manifest"),
    ],
)
def test_episode_values_are_bounds_checked(intact, tmp_path, field, value, message):
    root = copy(intact, str(tmp_path / "ds"))
    rewrite_index(root, _set(1, field, value))
    with pytest.raises(FormatError, match=message):
        WindowDataset(root, SPEC)


def test_member_ranges_must_lie_inside_the_shard(intact, tmp_path):
    root = copy(intact, str(tmp_path / "ds"))

    def edit(rows):
        rows[4]["members"][2]["size"] = 1 << 40

    rewrite_index(root, edit)
    with pytest.raises(FormatError, match=r"row 4 \(episode g-e000004\): members.offset/size lie outside the shard"):
        WindowDataset(root, SPEC)


@pytest.mark.parametrize("policy", ["skip", "raise"])
def test_a_video_that_does_not_decode_follows_the_shard_policy(intact, keyed_reference, tmp_path, policy):
    root = copy(intact, str(tmp_path / "ds"))
    member = video_member(root, 1, 0)  # episode 2's video
    rewrite_shard_member(root, 1, member, bytes(member["size"]))  # digests match: only decoding can tell
    ds = WindowDataset(root, SPEC, seed=5, read=ReadOptions(fetch=FetchPolicy(on_shard_error=policy)))
    if policy == "raise":
        with pytest.raises(DecodeError, match=f"episode g-e000002 camera {CAMERA}"):
            list(ds)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = list(ds)
    assert len(samples) == len(keyed_reference)
    good = keyed_reference
    real = [s for s in samples if not s["substitute"]]
    assert sorted((int(s["episode_index"]), int(s["frame_index"])) for s in real) == sorted(
        k for k in good if k[0] != 2
    )
    for s in samples:
        assert torch.equal(s[CAMERA], good[(int(s["episode_index"]), int(s["frame_index"]))][CAMERA])
    assert [str(w.message) for w in caught if "skipping episode g-e000002" in str(w.message)]


def test_per_shard_indexes_are_checked_when_used(intact, reference, tmp_path):
    root = copy(intact, str(tmp_path / "ds"))
    os.remove(os.path.join(root, "index.arrow"))
    assert [s["frame_index"] for s in WindowDataset(root, SPEC, seed=5)] == [s["frame_index"] for s in reference]
    path = os.path.join(root, loaded(root).shards[2].index)
    data = bytearray(Path(path).read_bytes())
    data[len(data) // 2] ^= 0xFF
    Path(path).write_bytes(bytes(data))
    with pytest.raises(
        FormatError,
        match=r"shard-000002.index.parquet: sha256 differs from the manifest's "
        r"shards\[2\].index_sha256",
    ):
        WindowDataset(root, SPEC)


def test_verify_checks_what_the_reader_needs(intact, tmp_path):
    root = copy(intact, str(tmp_path / "ds"))
    m = manifest(root)
    del m["cameras"]
    write_manifest(root, m)
    with pytest.raises(FormatError, match=r"manifest\.json: cameras: missing"):
        verify(root)
    with pytest.raises(FormatError, match=r"manifest\.json: cameras: missing"):
        WindowDataset(root, SPEC)

    root = copy(intact, str(tmp_path / "ds2"))  # index.arrow rewritten alone, its digest updated
    rewrite_index(root, _set(3, "task", "another task"))
    for entry in manifest(intact)["shards"]:  # the per-shard indexes and their digests as converted
        Path(os.path.join(root, entry["index"])).write_bytes(Path(os.path.join(intact, entry["index"])).read_bytes())
    m = manifest(root)
    m["shards"] = manifest(intact)["shards"]
    write_manifest(root, m)
    assert [p["message"] for p in verify(root, decode=False)["problems"]] == [
        "index.arrow differs from the per-shard indexes"
    ]
