"""The streaming reader on generated datasets whose frames carry (episode, frame) in their pixels,
and on the real datasets in ../shared/data (skipped when absent)."""

from __future__ import annotations

import collections
import os

import numpy as np
import pytest
import torch
from conftest import shared_dataset
from torch.utils.data import DataLoader
from videogen import decode_frame_number, make_episode_table, make_video

from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Source, convert
from epishard.stream import PostProcess, WindowDataset, WindowLoader, WindowSpec, segment
from epishard.stream.lookahead import Lookahead
from epishard.stream.options import Ranks, ReadOptions
from epishard.stream.telemetry import summarize

FPS = 20
LENGTHS = [45, 20, 60, 33, 70, 52, 38]  # episode 1 is shorter than the 33-frame span
CAMS = {
    "observation.images.front": ("h264", 30),
    "observation.images.left": ("av1", 16),
    "observation.images.wrist": ("mpeg4", 12),
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("stream")
    episodes = []
    for e, n in enumerate(LENGTHS):
        videos = {
            cam: CameraVideo(make_video(None, n, codec=codec, gop=gop, fps=FPS, start_number=1000 * e))
            for cam, (codec, gop) in CAMS.items()
        }
        episodes.append(
            Episode(
                source="gen",
                episode_index=e,
                table=make_episode_table(n, fps=FPS),
                videos=videos,
                fps=FPS,
                tasks=(f"task {e}",),
            )
        )
    convert(
        [Source(name="gen", episodes=episodes, fps=FPS)],
        str(out),
        ConvertOptions(max_episodes_per_shard=2, progress=False),
    )
    return str(out)


SPEC = WindowSpec(
    cameras={
        "observation.images.front": segment(0, 32, 9),
        "observation.images.left": (0, 16, 32),
        "observation.images.wrist": (*segment(-8, -4, 2), 0, *segment(24, 32, 3)),
    },
    state_offsets=(-2, -1, 0),
    action_horizon=8,
    boundary="pad",
)


def _check_sample(s: dict, spec: WindowSpec) -> None:
    e, anchor = int(s["episode_index"]), int(s["frame_index"])
    n = LENGTHS[e]
    for cam, offsets in spec.cameras.items():
        rows = anchor + np.asarray(offsets)
        assert s[f"{cam}_is_pad"].tolist() == ((rows < 0) | (rows >= n)).tolist()
        got = [decode_frame_number(f) for f in s[cam]]
        assert got == (1000 * e + np.clip(rows, 0, n - 1)).tolist(), (cam, e, anchor)
    rows = np.clip(anchor + np.asarray(spec.state_offsets), 0, n - 1)
    assert s["observation.state"][:, 0].tolist() == rows.tolist()
    rows = np.clip(anchor + np.arange(spec.action_horizon), 0, n - 1)
    assert s["action"][:, 0].tolist() == (rows + 0.5).tolist()
    assert s["task"] == f"task {e}"


def _keys(samples) -> list[tuple[int, int]]:
    return [(int(s["episode_index"]), int(s["frame_index"])) for s in samples]


def test_every_window_decodes_the_frames_of_its_rows(dataset):
    # One look-ahead chunk holds the whole epoch (318 windows), so merged decoding is one call per
    # (episode, camera); tests/test_lookahead.py covers smaller horizons.
    ds = WindowDataset(
        dataset, SPEC, seed=3, read=ReadOptions(telemetry=True, lookahead=Lookahead(first=512, horizon=512))
    )
    for _epoch in range(2):
        samples = list(ds)
        assert sorted(_keys(samples)) == sorted((e, a) for e, n in enumerate(LENGTHS) for a in range(n))
        for s in samples:
            _check_sample(s, SPEC)
    t = summarize([s["__telemetry__"] for s in samples])
    cams = len(CAMS)
    # Merged decoding: one call per (episode, camera) visit, never per window; the decoders are kept
    # for the worker's life, one per camera setting (stream.packets.DecoderPool): none opened in the
    # second epoch.
    assert t["decode_calls"] == t["episodes_loaded"] * cams
    assert t["decoder_opens"] == 0
    assert t["episodes_loaded"] == len(LENGTHS)


def test_two_epochs_differ_and_seeds_repeat(dataset):
    ds = WindowDataset(dataset, SPEC, seed=1)
    spec_keys = [_keys(ds) for _ in range(2)]
    assert spec_keys[0] != spec_keys[1] and sorted(spec_keys[0]) == sorted(spec_keys[1])
    again = WindowDataset(dataset, SPEC, seed=1)
    assert _keys(again) == spec_keys[0]


def test_inside_mode_skips_short_episodes_and_counts_them(dataset):
    spec = WindowSpec(cameras={"observation.images.front": segment(0, 32, 9)}, action_horizon=4)
    ds = WindowDataset(dataset, spec, read=ReadOptions(telemetry=True))
    samples = list(ds)
    span = 33
    expected = sorted((e, a) for e, n in enumerate(LENGTHS) for a in range(0, n - span + 1))
    assert sorted(_keys(samples)) == expected
    assert summarize([s["__telemetry__"] for s in samples])["episodes_without_windows"] == 1
    assert not any(s["observation.images.front_is_pad"].any() for s in samples)


def test_only_returned_frames_are_decoded_and_postprocessed(dataset):
    spec = WindowSpec(cameras={"observation.images.front": (0,)}, per_episode_count=2, boundary="pad")
    calls = []
    post = PostProcess(size=(32, 32), hook=lambda x: calls.append(x.shape[0]) or x)
    ds = WindowDataset(dataset, spec, postprocess=post, read=ReadOptions(telemetry=True))
    samples = list(ds)
    assert sum(calls) == len(samples) == 2 * len(LENGTHS)  # 2 windows x 1 frame per episode, nothing more
    assert samples[0]["observation.images.front"].shape == (1, 3, 32, 32)


@pytest.mark.parametrize("world,workers", [(1, 1), (2, 2), (3, 2), (4, 4)])
def test_ranks_and_workers_yield_each_window_once_and_equal_batches(dataset, world, workers):
    spec = WindowSpec(cameras={"observation.images.front": (0,)}, stride=3, boundary="pad")
    seen, batches = collections.Counter(), []
    for rank in range(world):
        ds = WindowDataset(dataset, spec, seed=5, ranks=Ranks(rank=rank, world_size=world))
        loader = DataLoader(ds, batch_size=4, num_workers=workers if workers > 1 else 0)
        n = 0
        for batch in loader:
            seen.update(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=False))
            n += 1
        batches.append(n)
    planned = [(e, a) for e, n in enumerate(LENGTHS) for a in range(0, n, 3)]
    assert len(set(batches)) == 1
    assert all(c == 1 for c in seen.values()) and set(seen) <= set(planned)
    assert len(planned) - len(seen) < world * max(workers, 1)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("cut", [1, 3, 6])
def test_resume_continues_exactly(dataset, workers, cut):
    spec = WindowSpec(cameras={"observation.images.front": (0, 8)}, action_horizon=2, boundary="pad", stride=2)

    def loader():
        return WindowLoader(WindowDataset(dataset, spec, seed=7), batch_size=3, num_workers=workers)

    reference = loader()
    full = [_keys_of(b) for b in reference] + [_keys_of(b) for b in reference]  # epochs 0 and 1
    first = loader()
    it = iter(first)
    got = [_keys_of(next(it)) for _ in range(cut)]
    state = first.state_dict()
    del it
    second = loader()
    second.load_state_dict(state)
    got += [_keys_of(b) for b in second] + [_keys_of(b) for b in second]
    assert got == full


def _keys_of(batch) -> list[tuple[int, int]]:
    return list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=False))


def test_resume_under_another_layout_without_every_rank_or_with_another_seed_is_refused(dataset):
    """Another worker count or world size resumes (tests/test_elastic.py) only from every rank's
    state; one rank's state of a 2-rank run, or another seed, is refused with a clear message."""
    spec = WindowSpec(cameras={"observation.images.front": (0,)}, boundary="pad")
    first = WindowLoader(WindowDataset(dataset, spec, ranks=Ranks(rank=1, world_size=2)), batch_size=2, num_workers=2)
    it = iter(first)
    next(it)
    state = first.state_dict()
    del it
    with pytest.raises(
        ValueError, match=r"world_size=2, this run has world_size=1 .num_workers 2 then, 1 now.*got ranks \[1\]"
    ):
        WindowLoader(WindowDataset(dataset, spec), batch_size=2, num_workers=0).load_state_dict(state)
    with pytest.raises(ValueError, match="seed=0, this run has seed=5"):
        WindowLoader(WindowDataset(dataset, spec, seed=5), batch_size=2, num_workers=0).load_state_dict(state)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_with_fork_spawn_and_persistent_workers(dataset, context):
    spec = WindowSpec(cameras={"observation.images.wrist": (0, 4)}, boundary="pad", per_episode_count=3)
    ds = WindowDataset(dataset, spec, seed=2)
    loader = WindowLoader(ds, batch_size=2, num_workers=2, multiprocessing_context=context, persistent_workers=True)
    epochs = [[k for b in loader for k in _keys_of(b)] for _ in range(2)]
    assert epochs[0] != epochs[1]
    single = WindowLoader(WindowDataset(dataset, spec, seed=2), batch_size=2, num_workers=2)
    assert [[k for b in single for k in _keys_of(b)] for _ in range(2)] == epochs


def test_delta_timestamps_and_float_output(dataset):
    spec = WindowSpec.from_delta_timestamps(
        {"observation.images.front": [-0.1, 0.0], "observation.state": [0.0], "action": [0.0, 0.05, 0.1]},
        fps=FPS,
        boundary="pad",
    )
    assert spec.cameras == {"observation.images.front": (-2, 0)} and spec.action_horizon == 3
    ds = WindowDataset(dataset, spec, postprocess=PostProcess(dtype=torch.float32), normalize={"action": "mean_std"})
    s = next(iter(ds))
    assert s["observation.images.front"].dtype == torch.float32 and s["observation.images.front"].max() <= 1.0
    assert abs(float(s["action"].mean())) < 3
    with pytest.raises(ValueError, match="not a multiple of 1/fps"):
        WindowSpec.from_delta_timestamps({"observation.images.front": [0.033]}, fps=FPS)


@pytest.mark.parametrize("name", ["so101_bimanual_cloth", "unitree_g1_bottle_av1_v30", "gr00t_robot_sim_picknplace"])
def test_real_datasets_return_the_source_frames_of_their_rows(name, tmp_path):
    from torchcodec.decoders import VideoDecoder

    from epishard.shardwriter import read_lerobot

    root = shared_dataset(name)
    convert([str(root)], str(tmp_path), ConvertOptions(progress=False))
    source = {e.episode_index: e for e in read_lerobot(str(root)).episodes}
    cams = sorted(next(iter(source.values())).videos)
    spec = WindowSpec(cameras={c: segment(0, 16, 5) for c in cams}, action_horizon=4, per_episode_count=2)
    for s in WindowDataset(str(tmp_path), spec, seed=0):
        episode = source[int(s["episode_index"])]
        table, _ = episode.load_table()
        frame_index = (
            table.column("frame_index").to_numpy() if "frame_index" in table.column_names else np.arange(table.num_rows)
        )
        row = int(np.flatnonzero(frame_index == int(s["frame_index"]))[0])
        for cam in cams:
            video = episode.videos[cam]
            first = round(video.segment[0] * episode.fps) if video.segment else 0
            want = (
                VideoDecoder(video.source)
                .get_frames_at([first + int(frame_index[row + o]) for o in segment(0, 16, 5)])
                .data
            )
            assert torch.equal(s[cam], want), (name, cam, row)
        assert torch.equal(s["action"][0], torch.tensor(table.column("action")[row].as_py(), dtype=torch.float32))


def test_mixing_datasets_with_weights_deals_each_to_every_worker(dataset, tmp_path):
    other = tmp_path / "other"
    eps = [
        Episode(
            source="other",
            episode_index=e,
            table=make_episode_table(n, fps=FPS),
            fps=FPS,
            tasks=("other",),
            videos={
                "observation.images.front": CameraVideo(
                    make_video(None, n, gop=10, fps=FPS, start_number=30000 + 1000 * e)
                )
            },
        )
        for e, n in enumerate([30, 26, 41])
    ]
    convert([Source(name="other", episodes=eps, fps=FPS)], str(other), ConvertOptions(progress=False))
    spec = WindowSpec(cameras={"observation.images.front": (0, 4)}, boundary="pad", stride=2)
    mixed = WindowDataset([(dataset, 1.0), (str(other), 2.0)], spec, seed=0)
    assert mixed.stratify
    samples = list(DataLoader(mixed, batch_size=None, num_workers=2))
    by = collections.Counter(int(s["dataset"]) for s in samples)
    first = sum(len(range(0, n, 2)) for n in LENGTHS)
    second = 2 * sum(len(range(0, n, 2)) for n in [30, 26, 41])
    assert abs(by[0] - first) <= 2 and abs(by[1] - second) <= 4  # weight 2: every anchor twice
    for s in samples:
        base = 30000 if s["dataset"] == 1 else 0
        rows = np.clip(int(s["frame_index"]) + np.array([0, 4]), 0, None)
        n = [30, 26, 41][int(s["episode_index"])] if s["dataset"] == 1 else LENGTHS[int(s["episode_index"])]
        want = base + 1000 * int(s["episode_index"]) + np.minimum(rows, n - 1)
        assert [decode_frame_number(f) for f in s["observation.images.front"]] == want.tolist()
    halves = [samples[: len(samples) // 2], samples[len(samples) // 2 :]]
    assert all({int(s["dataset"]) for s in h} == {0, 1} for h in halves)


def test_a_mix_whose_datasets_have_other_cameras_is_refused_naming_them(dataset, tmp_path):
    other = str(tmp_path / "other")
    eps = [
        Episode(
            source="other",
            episode_index=0,
            table=make_episode_table(12, fps=FPS),
            fps=FPS,
            videos={"observation.images.front": CameraVideo(make_video(None, 12, fps=FPS, start_number=30000))},
        )
    ]
    convert([Source(name="other", episodes=eps, fps=FPS)], other, ConvertOptions(progress=False))
    # Every camera of each: samples of the two would carry other keys, and no batch could hold both.
    with pytest.raises(
        ValueError,
        match=r"cameras differ .*stream\d* has \['observation.images.front', "
        r"'observation.images.left', 'observation.images.wrist'\]; .*other has "
        r"\['observation.images.front'\]\)",
    ):
        WindowDataset([dataset, other], WindowSpec(cameras=None))
    # A named camera one dataset lacks: refused when the spec says so (else padded: tests/test_mixing.py).
    refuse = WindowSpec(cameras={"observation.images.left": (0,)}, missing_cameras="refuse")
    with pytest.raises(KeyError, match=r"other: window spec names cameras \['observation.images.left'\]"):
        WindowDataset([dataset, other], refuse)
    # The cameras both have: batches mix the two datasets.
    ds = WindowDataset([dataset, other], WindowSpec(cameras={"observation.images.front": (0,)}), seed=0)
    batch = next(iter(WindowLoader(ds, batch_size=64)))
    assert set(batch["dataset"].tolist()) == {0, 1}
    for d, e, a, frame in zip(
        batch["dataset"], batch["episode_index"], batch["frame_index"], batch["observation.images.front"], strict=False
    ):
        assert decode_frame_number(frame[0]) == (30000 if d else 1000 * int(e)) + int(a)


def test_memory_stays_flat_across_epochs(dataset):
    import gc

    def rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    spec = WindowSpec(cameras={c: segment(0, 8, 3) for c in CAMS}, action_horizon=4, boundary="pad")
    ds = WindowDataset(dataset, spec, seed=0)
    for _ in range(2):  # warm up allocators and caches
        for _ in ds:
            pass
    gc.collect()
    before = rss_mb()
    for _ in range(6):
        for _ in ds:
            pass
    gc.collect()
    assert rss_mb() - before < 40, (before, rss_mb())  # no decoder, episode or sample kept between epochs


@pytest.mark.parametrize("workers", [0, 2])
def test_float_output_through_the_loader_equals_per_sample_conversion(dataset, workers):
    spec = WindowSpec(
        cameras={"observation.images.front": (0, 4), "observation.images.left": (0,)},
        boundary="pad",
        per_episode_count=3,
    )
    post = PostProcess(size=(32, 32), dtype=torch.float32)
    loader = WindowLoader(WindowDataset(dataset, spec, seed=1, postprocess=post), batch_size=4, num_workers=workers)
    assert loader.dataset.defer_float
    plain = WindowDataset(dataset, spec, seed=1, postprocess=post)
    expected = {(int(s["episode_index"]), int(s["frame_index"])): s for s in plain}
    seen = 0
    for batch in loader:
        for i, (e, f) in enumerate(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=False)):
            for cam in spec.cameras:
                assert batch[cam].dtype == torch.float32
                assert torch.equal(batch[cam][i], expected[(e, f)][cam])
            seen += 1
    assert len(expected) - max(workers, 1) < seen <= len(expected)  # the remainder is dropped per epoch
