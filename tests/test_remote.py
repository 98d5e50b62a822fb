"""Object storage on loopback: a real S3-protocol server (moto), HTTP servers that honour or ignore
Range, and a fault-injecting proxy. Every sample must equal the local-disk run's."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from remote_servers import FaultProxy, serve_http
from torch.utils.data import DataLoader
from videogen import make_episode_table, make_video

from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Source, convert, verify
from epishard.stream import WindowDataset, WindowSpec, segment
from epishard.stream.fetch import FetchError, FetchPolicy
from epishard.stream.options import ReadOptions
from epishard.stream.telemetry import summarize

LENGTHS = [40, 25, 33, 47, 30]
CAMS = ("observation.images.front", "observation.images.wrist")
SPEC = WindowSpec(cameras={c: segment(0, 8, 3) for c in CAMS}, action_horizon=4, boundary="pad", per_episode_count=6)


def _source() -> Source:
    episodes = [
        Episode(
            source="remote",
            episode_index=e,
            table=make_episode_table(n),
            fps=20,
            tasks=("t",),
            videos={
                c: CameraVideo(make_video(None, n, gop=10, start_number=1000 * e + 100 * i)) for i, c in enumerate(CAMS)
            },
        )
        for e, n in enumerate(LENGTHS)
    ]
    return Source(name="remote", episodes=episodes, fps=20)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    convert([_source()], str(out), ConvertOptions(max_episodes_per_shard=2, progress=False))
    return str(out)


def _samples(url: str, workers: int = 0, **kw) -> list[dict]:
    ds = WindowDataset(url, SPEC, seed=4, read=ReadOptions(telemetry=True, **kw))
    if workers == 0:
        return list(ds)
    loader = DataLoader(ds, batch_size=None, num_workers=workers)
    return sorted(loader, key=lambda s: (int(s["episode_index"]), int(s["frame_index"])))


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=False):
        for key in [*list(CAMS), "observation.state", "action", "episode_index", "frame_index"]:
            assert torch.equal(torch.as_tensor(x[key]), torch.as_tensor(y[key])), key
        assert not x["substitute"]


@pytest.fixture(scope="module")
def s3(moto_s3):
    options, fs = moto_s3
    fs.mkdir("epishard-test")
    return options


def test_convert_verify_and_stream_through_s3(local, s3):
    url = "s3://epishard-test/ds"
    manifest = convert(
        [_source()], url, ConvertOptions(max_episodes_per_shard=2, progress=False, workers=2), storage_options=s3
    )
    assert manifest.totals.episodes == len(LENGTHS)
    assert verify(url, storage_options=s3)["ok"]
    # The same input gives the same bytes locally and in the bucket.
    import s3fs

    fs = s3fs.S3FileSystem(**s3)
    for shard in manifest.shards:
        assert fs.cat_file(f"epishard-test/ds/{shard.shard}") == Path(f"{local}/{shard.shard}").read_bytes()
    expected = _samples(local)
    _same(
        _samples(url, workers=2, storage_options=s3),
        sorted(expected, key=lambda s: (int(s["episode_index"]), int(s["frame_index"]))),
    )


def test_interrupted_upload_leaves_no_object_and_rerun_finishes(local, s3, monkeypatch):
    import s3fs

    from epishard.shardwriter import prepare as prepare_module

    url, calls = "s3://epishard-test/interrupted", {"n": 0}
    real = prepare_module.prepare

    def failing(episode, opts):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt  # as Ctrl-C in the middle of shard 1
        return real(episode, opts)

    convert_module = sys.modules["epishard.shardwriter.convert"]
    monkeypatch.setattr(convert_module, "prepare", failing)
    with pytest.raises(KeyboardInterrupt):
        convert([_source()], url, ConvertOptions(max_episodes_per_shard=2, progress=False), storage_options=s3)
    fs = s3fs.S3FileSystem(**s3)
    fs.invalidate_cache()
    names = sorted(p.rsplit("/", 1)[1] for p in fs.ls("epishard-test/interrupted"))
    assert names == [
        ".epishard-convert.json",
        "shard-000000.index.parquet",
        "shard-000000.tar",
    ]  # shard 1 never appeared
    monkeypatch.setattr(convert_module, "prepare", real)
    convert([_source()], url, ConvertOptions(max_episodes_per_shard=2, progress=False), storage_options=s3)
    assert verify(url, storage_options=s3)["ok"]


aiohttp = pytest.importorskip("aiohttp")  # fsspec's HTTP filesystem (installed with s3fs)


@pytest.mark.parametrize("honour_range", [True, False])
@pytest.mark.parametrize("mode", ["stream", "ranged"])
def test_http_with_and_without_range_support(local, honour_range, mode):
    server, base = serve_http(local, honour_range=honour_range)
    try:
        got = _samples(base, fetch=FetchPolicy(mode=mode))
    finally:
        server.shutdown()
    _same(got, _samples(local))
    t = summarize([s["__telemetry__"] for s in got])
    assert t["retries"] == 0


@pytest.mark.parametrize("cuts", [1, 2])
def test_cut_connections_are_retried_to_identical_bytes(local, cuts):
    server, _ = serve_http(local)
    proxy = FaultProxy(server.server_address, cut_after=8_000, cuts=cuts)
    try:
        got = _samples(f"http://127.0.0.1:{proxy.port}", fetch=FetchPolicy(chunk_bytes=1 << 20, backoff_s=0.01))
    finally:
        proxy.close()
        server.shutdown()
    _same(got, _samples(local))
    assert proxy.cuts_done == cuts
    assert summarize([s["__telemetry__"] for s in got])["retries"] == cuts


def test_a_shard_that_always_fails_is_skipped_or_raises(local):
    server, _ = serve_http(local)
    proxy = FaultProxy(server.server_address, cut_after=8_000, cuts=-1, match=b"shard-000001.tar")
    url = f"http://127.0.0.1:{proxy.port}"
    try:
        policy = FetchPolicy(chunk_bytes=1 << 20, retries=2, backoff_s=0.01)
        got = _samples(url, fetch=policy)
        with pytest.raises(FetchError, match="after 2 retries"):
            _samples(url, fetch=FetchPolicy(chunk_bytes=1 << 20, retries=2, backoff_s=0.01, on_shard_error="raise"))
    finally:
        proxy.close()
        server.shutdown()
    expected = _samples(local)
    assert len(got) == len(expected)  # the rank keeps its sample (and batch) count
    t = summarize([s["__telemetry__"] for s in got])
    assert t["substitutes"] == sum(s["substitute"] for s in got) > 0 and t["episodes_skipped"] > 0
    good = {(int(s["episode_index"]), int(s["frame_index"])): s for s in expected}
    for s in got:  # every sample, substitutes included, is a real window with its real frames
        ref = good[(int(s["episode_index"]), int(s["frame_index"]))]
        assert all(torch.equal(s[c], ref[c]) for c in CAMS)


def test_ranged_mode_reads_only_the_cameras_asked_for(local):

    one = WindowSpec(cameras={CAMS[0]: segment(0, 8, 3)}, action_horizon=4, boundary="pad", per_episode_count=6)
    server, base = serve_http(local)
    try:
        totals = {}
        for mode in ("stream", "ranged", "packets"):
            # Holes up to a tar header's size only: these test videos are smaller than the default 8 KiB.
            # Members whole, except "packets": only the groups of pictures decoded (stream.packets).
            policy = FetchPolicy(
                mode="ranged" if mode == "packets" else mode, coalesce_bytes=1024, packets=mode == "packets"
            )
            samples = list(WindowDataset(base, one, seed=4, read=ReadOptions(telemetry=True, fetch=policy)))
            totals[mode] = summarize([s["__telemetry__"] for s in samples])["bytes_read"]
    finally:
        server.shutdown()
    from epishard.shardwriter import WindowIndex

    ix = WindowIndex.load_dataset(local)
    wanted = 0
    for row in map(
        ix.row, range(ix.num_episodes)
    ):  # the table and the camera are adjacent: one range from one to the other
        table, front = (
            next(m for m in row["members"] if m["name"].endswith(ext)) for ext in (".parquet", ".front.mp4")
        )
        wanted += front["offset"] + front["size"] - table["offset"]
    assert totals["ranged"] == wanted  # exactly the table and the one camera, not the wrist camera
    assert totals["stream"] > wanted
    assert totals["packets"] < wanted  # the tables and some of the one camera's packets


def test_local_cache_serves_repeat_epochs_and_never_stale_data(local, tmp_path):
    from epishard.stream.cache import RangeCache

    server, _ = serve_http(local)
    proxy = FaultProxy(server.server_address)
    url, cache = f"http://127.0.0.1:{proxy.port}", str(tmp_path / "cache")
    policy = FetchPolicy(cache_dir=cache, disk_cache_bytes=10 << 20, retries=0, on_shard_error="raise")
    try:
        first = _samples(url, fetch=policy)
        proxy.cut_after, proxy.cuts = 1, -1  # from now on every shard read through the network fails
        second = _samples(url, fetch=policy)  # same plan (same seed and epoch): all ranges come from the cache
    finally:
        proxy.close()
        server.shutdown()
    expected = _samples(local)
    _same(first, expected)
    _same(second, expected)
    assert proxy.cuts_done == 0 and os.listdir(cache)
    small = RangeCache(str(tmp_path / "small"), max_bytes=100)
    small.put("a" * 64, 0, 60, b"x" * 60)
    small.put("b" * 64, 0, 60, b"y" * 60)  # evicts the older entry
    assert small.get("a" * 64, 0, 60) is None and small.get("b" * 64, 0, 60) == b"y" * 60
    assert small.get("c" * 64, 0, 60) is None  # a changed shard has another sha256: another key


def test_a_server_that_ignores_range_is_read_right_and_said_once_per_shard(intact):
    """``python -m http.server`` answers every ranged GET with the whole shard: the samples are the local
    ones (the range cut out of each answer), and each shard is warned about once, not silently re-read."""
    import warnings

    from faultgen import SPEC

    import epishard.stream.fetch as fetch

    fetch._RANGE_WARNED.clear()
    server, url = serve_http(intact, honour_range=False)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            remote = list(WindowDataset(url, SPEC, seed=3, read=ReadOptions(fetch=FetchPolicy(mode="ranged"))))
    finally:
        server.shutdown()
    local = list(WindowDataset(intact, SPEC, seed=3))
    assert [int(s["episode_index"]) for s in remote] == [int(s["episode_index"]) for s in local]
    assert all(torch.equal(a["action"], b["action"]) for a, b in zip(remote, local, strict=True))
    said = sorted(str(w.message) for w in caught if "ignores Range" in str(w.message))
    shards = sorted(n for n in os.listdir(intact) if n.endswith(".tar"))
    assert len(said) == len(shards) and all(
        f"{url}/{n}: the server ignores Range" in m for m, n in zip(said, shards, strict=True)
    )
