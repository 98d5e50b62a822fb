"""Look-ahead decoding (``stream.lookahead``): property tests of the pure schedule on random plans,
horizons and budgets, replayed step by step against a model of the caches; and the reader end to end
on a generated dataset whose frames carry (episode, frame) in their pixels, under a fully shuffled
yield order, with budgets small enough that frames are decoded and members fetched again."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from videogen import decode_frame_number, make_episode_table, make_video

import epishard.stream.dataset as dataset_module
import epishard.stream.reader as reader_module
from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Source, convert
from epishard.stream import WindowDataset, WindowSpec, segment
from epishard.stream.fetch import FetchPolicy
from epishard.stream.lookahead import (
    NEVER,
    REACH,
    WORKER_BYTES,
    Demand,
    Lookahead,
    Scheduler,
    Store,
    columns_key,
    frame_key,
    key_frame,
    key_stream,
    schedule,
)
from epishard.stream.options import ReadOptions
from epishard.stream.plan import WorkerPlan
from epishard.stream.telemetry import Telemetry, summarize

# --- the schedule, pure -----------------------------------------------------------------------------


def random_demand(rng: np.random.Generator) -> Demand:
    """A random consumer: episodes of 1-3 cameras, windows in random order reading random frames."""
    episodes, cams = int(rng.integers(1, 7)), int(rng.integers(1, 4))
    n, per_cam = int(rng.integers(1, 90)), int(rng.integers(1, 4))
    length = rng.integers(3, 40, size=episodes)
    episode = rng.integers(0, episodes, size=n)
    keys = np.full((n, cams * per_cam), -1, dtype=np.int64)
    for i, e in enumerate(episode.tolist()):
        for c in range(cams):
            if rng.random() < 0.1:
                continue  # a camera this window's dataset lacks
            anchor = int(rng.integers(0, length[e]))
            frames = np.clip(anchor + rng.integers(-3, 6, size=per_cam), 0, length[e] - 1)
            keys[i, c * per_cam : (c + 1) * per_cam] = frame_key(e * cams + c, frames)
    return Demand(
        episode=episode.astype(np.int64),
        keys=keys,
        stream_episode=np.repeat(np.arange(episodes, dtype=np.int64), cams),
        frame_bytes=rng.integers(1, 6, size=episodes * cams),
        columns_bytes=rng.integers(1, 4, size=episodes),
        encoded_bytes=rng.integers(1, 12, size=episodes),
    )


def random_policy(rng: np.random.Generator, demand: Demand) -> Lookahead:
    biggest = max(int(demand.sizes(demand.need(i, i + 1)).sum()) for i in range(demand.episode.size))
    total = int(demand.sizes(demand.need(0, demand.episode.size)).sum())
    return Lookahead(
        horizon=int(rng.integers(1, 24)),
        first=int(rng.integers(1, 9)),
        frame_cache_bytes=int(rng.integers(biggest, max(biggest + 1, total + 2))),
        encoded_bytes=int(rng.integers(0, 30)),
    )


def replay(demand: Demand, policy: Lookahead, reach: int = REACH) -> dict:
    """Run the schedule against a model of both caches, checking every property on the way.

    The model's frame cache holds, for each key, the (stream, frame) its decode call produced: a
    window reading it gets exactly what was decoded for that key, so a wrong decode list, a missing
    or evicted frame shows as a wrong or missing frame. With a ``reach`` shorter than the order,
    next uses past it are unknown to the scheduler: Belady's order and "released means never needed
    again" are checked only when the reach covers the whole order.
    """
    sched = schedule(demand, policy, reach)
    exact = reach >= demand.episode.size
    n = demand.episode.size
    needs = {}
    cache: dict[int, tuple] = {}  # key -> what the model decoded for it
    held_bytes = 0
    encoded: set[int] = set()
    fetched = 0
    position = 0
    counts = {"decodes": 0, "fetches": 0, "evictions": 0, "frames_decoded": 0}
    for t, step in enumerate(sched.steps):
        assert step.start == position and step.stop > step.start, "the steps cover the windows in order"
        position = step.stop
        assert step.stop - step.start <= max(policy.horizon, policy.first)
        need = demand.need(step.start, step.stop)
        needs[t] = need
        assert not np.isin(step.evict, need).any(), "an item the chunk needs was evicted"
        assert np.array_equal(step.keys, demand.keys[step.start : step.stop]), "the chunk's windows' frame keys"
        if step.evict.size and exact:  # Belady: nothing kept (and not needed now) is needed later than an evicted item
            later = _next_use(demand, sched, t)
            kept = [k for k in cache if k not in set(step.evict.tolist()) and k not in set(need.tolist())]
            assert min(later(k) for k in step.evict.tolist()) >= max((later(k) for k in kept), default=-1)
        for k in step.evict.tolist():
            held_bytes -= int(demand.sizes(np.array([k]))[0])
            del cache[k]
        counts["evictions"] += step.evict.size
        before = set(cache)
        decoded: dict[int, np.ndarray] = {}
        for load in step.loads:
            for e in load.drop_encoded:
                encoded.remove(e)
            if load.fetch is None:
                assert load.episode in encoded, "bytes reused that were not kept"
            else:
                assert load.fetch == fetched and sched.fetches[load.fetch] == load.episode
                fetched += 1
                counts["fetches"] += 1
            if load.columns:
                k = int(columns_key(load.episode))
                assert k not in cache
                cache[k] = ("columns", load.episode)
            for call in load.decodes:
                assert demand.stream_episode[call.stream] == load.episode
                assert call.stream not in decoded, "one decode call per (episode, camera) per chunk"
                assert np.all(np.diff(call.frames) > 0)
                decoded[call.stream] = call.frames
                for f in call.frames.tolist():
                    k = int(frame_key(call.stream, f))
                    assert k not in cache, "a cached frame decoded again"
                    cache[k] = ("frame", call.stream, f)
                counts["decodes"] += 1
                counts["frames_decoded"] += call.frames.size
            if load.keep:
                encoded.add(load.episode)
            else:
                encoded.discard(load.episode)
            assert int(demand.encoded_bytes[list(encoded)].sum()) <= policy.encoded_bytes, "encoded cache over budget"
        held_bytes = int(demand.sizes(np.array(sorted(cache), dtype=np.int64)).sum()) if cache else 0
        assert held_bytes == step.held <= policy.frame_cache_bytes, "frame cache over budget"
        # Each decode call is exactly the chunk's frames of its stream that were not cached.
        frames_needed = need[need >= 0]
        missing = frames_needed[~np.isin(frames_needed, np.array(sorted(before), dtype=np.int64))]
        for s in np.unique(key_stream(missing)).tolist():
            assert np.array_equal(decoded.get(s, np.zeros(0, np.int64)), key_frame(missing[key_stream(missing) == s]))
        assert set(decoded) <= set(np.unique(key_stream(missing)).tolist())
        for i in range(step.start, step.stop):  # every returned frame is the right frame
            e = int(demand.episode[i])
            assert cache[int(columns_key(e))] == ("columns", e)
            for k in demand.keys[i][demand.keys[i] >= 0].tolist():
                assert cache[k] == ("frame", int(key_stream(k)), int(key_frame(k)))
        for k in step.release.tolist():
            del cache[k]
    assert position == n, "every window exactly once"
    for t in needs if exact else ():  # released items are needed by no later chunk
        later = np.concatenate([needs[u] for u in needs if u > t] or [np.zeros(0, np.int64)])
        assert not np.isin(sched.steps[t].release, later).any()
    return counts


def _next_use(demand: Demand, sched, t: int):
    """Key -> the first chunk after ``t`` that needs it (NEVER: none), from the demand itself."""
    later = {}
    for u in range(len(sched.steps) - 1, t, -1):
        for k in demand.need(sched.steps[u].start, sched.steps[u].stop).tolist():
            later[k] = u
    return lambda k: later.get(k, NEVER)


@pytest.mark.parametrize("seed", range(80))
def test_schedule_properties_on_random_plans(seed):
    rng = np.random.default_rng(seed)
    demand = random_demand(rng)
    replay(demand, random_policy(rng, demand))


def test_a_short_reach_keeps_every_window_frame_and_budget():
    """Next uses known only ``reach`` windows ahead: the schedule still yields every window in order,
    every frame it reads is the one decoded for it, and both caches stay within budget (``replay``)."""
    for seed in range(30):
        rng = np.random.default_rng(2000 + seed)
        demand = random_demand(rng)
        replay(demand, random_policy(rng, demand), reach=int(rng.integers(1, 12)))


def test_a_larger_budget_never_decodes_more():
    worse = 0
    for seed in range(25):
        rng = np.random.default_rng(1000 + seed)
        demand = random_demand(rng)
        small = random_policy(rng, demand)
        big = dataclasses.replace(small, frame_cache_bytes=1 << 40, encoded_bytes=1 << 40)
        a, b = replay(demand, small), replay(demand, big)
        assert b["frames_decoded"] <= a["frames_decoded"] and b["evictions"] == 0
        # Unbounded: each episode fetched once, each frame decoded once.
        assert b["fetches"] == np.unique(demand.episode).size
        assert b["frames_decoded"] == np.unique(demand.keys[demand.keys >= 0]).size
        worse += a["frames_decoded"] > b["frames_decoded"]
    assert worse > 0, "some small budget must force frames to be decoded again (else the test shows nothing)"


def test_chunks_grow_from_first_to_horizon_and_shrink_to_fit():
    n = 100
    demand = Demand(
        episode=np.zeros(n, dtype=np.int64),
        keys=frame_key(0, np.arange(n))[:, None],
        stream_episode=np.zeros(1, dtype=np.int64),
        frame_bytes=np.array([10]),
        columns_bytes=np.array([5]),
        encoded_bytes=np.array([1]),
    )
    spans = [(s.start, s.stop) for s in schedule(demand, Lookahead(horizon=16, first=2, frame_cache_bytes=10**6)).steps]
    assert [b - a for a, b in spans] == [2, 4, 8, 16, 16, 16, 16, 16, 6]  # doubling up to the horizon
    # 10 windows' frames (100 bytes) plus the columns (5) fit in 105 bytes: chunks are cut to 10.
    spans = [(s.start, s.stop) for s in schedule(demand, Lookahead(horizon=64, first=64, frame_cache_bytes=105)).steps]
    assert {b - a for a, b in spans[:-1]} == {10}
    with pytest.raises(ValueError, match=r"window 0 \(episode 0\) needs 15 bytes.*frame_cache_bytes = 14"):
        schedule(demand, Lookahead(frame_cache_bytes=14))


# --- the reader end to end --------------------------------------------------------------------------

FPS = 20
LENGTHS = [30, 18, 40, 26, 35]
CAMS = {"observation.images.front": ("h264", 10), "observation.images.wrist": ("mpeg4", 6)}
SPEC = WindowSpec(
    cameras={"observation.images.front": segment(0, 8, 3), "observation.images.wrist": (-4, 0)},
    state_offsets=(-1, 0),
    action_horizon=4,
    boundary="pad",
)
FRAME_BYTES = 3 * 32 * 32


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("lookahead")
    episodes = [
        Episode(
            source="gen",
            episode_index=e,
            table=make_episode_table(n, fps=FPS),
            videos={
                cam: CameraVideo(
                    make_video(None, n, codec=codec, gop=gop, fps=FPS, height=32, width=32, start_number=100 * e)
                )
                for cam, (codec, gop) in CAMS.items()
            },
            fps=FPS,
            tasks=(f"task {e}",),
        )
        for e, n in enumerate(LENGTHS)
    ]
    convert([Source(name="gen", episodes=episodes, fps=FPS)], str(out), ConvertOptions(max_episodes_per_shard=2))
    return str(out)


def shuffled(ds: WindowDataset, seed: int) -> WindowDataset:
    """``ds`` with each consumer's yield order replaced by a random permutation of its plan.

    Stands in for the planner's plan-level shuffle (``shuffle_episodes``): the most diverse order.
    """
    plan = ds.plan

    def permuted(epoch, world, history=()):
        p = plan(epoch, world, history)
        order = np.random.default_rng([seed, epoch, world.consumer]).permutation(len(p))
        return dataclasses.replace(p, episode=p.episode[order], anchor=p.anchor[order])

    ds.plan = permuted  # type: ignore[method-assign]
    return ds


def check(sample: dict) -> tuple[int, int]:
    e, anchor = int(sample["episode_index"]), int(sample["frame_index"])
    n = LENGTHS[e]
    assert not sample["substitute"]
    for cam, offsets in SPEC.cameras.items():
        rows = anchor + np.asarray(offsets)
        assert sample[f"{cam}_is_pad"].tolist() == ((rows < 0) | (rows >= n)).tolist()
        assert [decode_frame_number(f) for f in sample[cam]] == (100 * e + np.clip(rows, 0, n - 1)).tolist()
    assert sample["observation.state"][:, 0].tolist() == np.clip(anchor + np.array([-1, 0]), 0, n - 1).tolist()
    return e, anchor


ALL = sorted((e, a) for e, n in enumerate(LENGTHS) for a in range(n))


@pytest.mark.parametrize("horizon", [1, 5, 64])
def test_fully_shuffled_order_returns_the_right_frames_exactly_once(small, horizon):
    ds = shuffled(
        WindowDataset(small, SPEC, seed=2, read=ReadOptions(telemetry=True, lookahead=Lookahead(horizon, first=3))), 7
    )
    samples = list(ds)
    assert sorted(check(s) for s in samples) == ALL
    t = summarize([samples[-1]["__telemetry__"]])
    assert t["samples"] == len(ALL) and t["frame_cache_evictions"] == 0
    assert t["frame_cache_bytes_peak"] <= ds.lookahead.frame_cache_bytes


def test_a_tiny_budget_decodes_and_fetches_again_and_stays_within_it(small):
    # Room for about 3 windows (4 frames of 3 KiB each, plus columns): frames are evicted and decoded
    # again, and no encoded bytes are kept, so episodes are fetched again.
    budget = 3 * 4 * FRAME_BYTES + 2 * 40 * 64
    la = Lookahead(horizon=16, first=2, frame_cache_bytes=budget, encoded_bytes=0)
    ds = shuffled(WindowDataset(small, SPEC, seed=2, read=ReadOptions(telemetry=True, lookahead=la)), 3)
    samples = list(ds)
    assert sorted(check(s) for s in samples) == ALL
    t = summarize([samples[-1]["__telemetry__"]])
    assert t["frame_cache_evictions"] > 0 and t["frame_cache_bytes_peak"] <= budget
    returned = {
        (int(s["episode_index"]), cam, int(r))
        for s in samples
        for cam, o in SPEC.cameras.items()
        for r in np.clip(int(s["frame_index"]) + np.asarray(o), 0, LENGTHS[int(s["episode_index"])] - 1)
    }
    assert t["frames_unique"] > len(returned), "some frame was decoded twice"
    assert t["episodes_loaded"] > len(LENGTHS) and t["encoded_cache_hits"] == 0 and t["encoded_bytes_peak"] == 0


def test_resume_mid_epoch_gives_the_same_samples_and_decodes_nothing_for_the_skipped(small, monkeypatch):
    la = Lookahead(horizon=8, first=2, frame_cache_bytes=20 * FRAME_BYTES)

    def make():
        return shuffled(WindowDataset(small, SPEC, seed=5, read=ReadOptions(lookahead=la)), 11)

    full = list(make())
    ds = make()
    it = iter(ds)
    head = [next(it) for _ in range(37)]
    state = ds.state_dict()
    del it
    decoded = []
    real = reader_module.decode_camera

    def spy(index, stream, frames, *args, **kw):
        decoded.append((stream, frames.copy()))
        return real(index, stream, frames, *args, **kw)

    monkeypatch.setattr(reader_module, "decode_camera", spy)
    again = make()
    again.load_state_dict(state)
    rest = list(again)
    assert len(head) + len(rest) == len(full)
    for a, b in zip(head + rest, full, strict=True):
        assert (a["episode_index"], a["frame_index"]) == (b["episode_index"], b["frame_index"])
        for cam in SPEC.cameras:
            assert torch.equal(a[cam], b[cam])
    # Nothing decoded for the 37 windows before the resume: every frame decoded is one a later window returns.
    index = again.sources[0].index
    wanted = set()
    for s in rest:
        e, anchor = int(s["episode_index"]), int(s["frame_index"])
        for cam, o in SPEC.cameras.items():
            stream = index.stream(e, index.camera_names(e).index(cam))
            rows = np.clip(anchor + np.asarray(o), 0, LENGTHS[e] - 1)
            wanted |= {(stream, int(f)) for f in index.frames(stream, rows)}
    assert {(s, int(f)) for s, frames in decoded for f in frames} <= wanted


def test_the_first_chunk_is_the_first_batch(small, monkeypatch):
    decoded = []
    real = reader_module.decode_camera

    def spy(index, stream, frames, *args, **kw):
        decoded.append(frames.size)
        return real(index, stream, frames, *args, **kw)

    monkeypatch.setattr(reader_module, "decode_camera", spy)
    ds = shuffled(WindowDataset(small, SPEC, seed=0, batch_size=4), 1)
    it = iter(ds)
    [next(it) for _ in range(4)]
    # 4 windows read at most 4 x 5 frames, in at most 4 x 2 decode calls; the epoch has 149 windows.
    assert sum(decoded) <= 20 and len(decoded) <= 8


def test_worker_plan_interface_is_all_the_reader_needs(small):
    """The executor follows any yield order the planner gives (contract: ``WorkerPlan`` episode/anchor)."""
    ds = WindowDataset(small, SPEC, seed=0)
    p = ds.plan(0, dataset_module.World())
    reversed_plan = WorkerPlan(p.episode[::-1].copy(), p.anchor[::-1].copy(), p.read_order, p.dropped, p.total_windows)
    samples = list(reader_module.EpochReader(ds.read_context()).samples(reversed_plan, 0, Telemetry()))
    assert [check(s) for s in samples] == list(zip(p.episode[::-1].tolist(), p.anchor[::-1].tolist(), strict=True))


class BudgetStore(Store):
    """``Store`` that checks, at every frame and columns put, the bytes held against the budget."""

    budget = 0
    peak = 0

    def _check(self):
        BudgetStore.peak = max(BudgetStore.peak, self.nbytes)
        assert self.nbytes <= BudgetStore.budget, f"the decoded-item cache holds {self.nbytes} > {self.budget} bytes"

    def put_frames(self, stream, frames, decoded):
        super().put_frames(stream, frames, decoded)
        self._check()

    def put_columns(self, episode, columns, info, nbytes):
        super().put_columns(episode, columns, info, nbytes)
        self._check()


def test_random_plans_yield_their_windows_in_order_with_the_right_frames_within_budget(small, monkeypatch):
    """Seeded random plans through the reader: random subsets of the epoch's windows in random order,
    random chunk sizes, budgets from one window's worth up, and a random reach. Each case yields
    exactly the plan's windows in its order, every frame is the one its pixels say (frame number),
    and the decoded-item cache never holds more than its budget at any put."""
    ds = WindowDataset(small, SPEC, seed=0)
    full = ds.plan(0, dataset_module.World())
    monkeypatch.setattr(reader_module, "Store", BudgetStore)
    rng = np.random.default_rng(16)
    tiny = 0
    for _ in range(8):
        pick = rng.permutation(len(full))[: int(rng.integers(1, 40))]
        plan = WorkerPlan(full.episode[pick], full.anchor[pick], full.read_order, 0, pick.size)
        budget = (5 + int(rng.integers(0, 40))) * FRAME_BYTES + 2 * 40 * 64  # one window: 5 frames, columns
        ds.lookahead = Lookahead(int(rng.integers(1, 20)), int(rng.integers(1, 9)), budget, int(rng.integers(0, 2e4)))
        reach = int(rng.integers(1, 30))
        monkeypatch.setattr(reader_module, "Scheduler", lambda d, p, r=reach: Scheduler(d, p, r))
        BudgetStore.budget, BudgetStore.peak = budget, 0
        samples = list(reader_module.EpochReader(ds.read_context()).samples(plan, 0, Telemetry()))
        assert [check(s) for s in samples] == list(zip(plan.episode.tolist(), plan.anchor.tolist(), strict=True))
        tiny += BudgetStore.peak > budget // 2
    assert tiny, "some case must fill its budget (else the bound shows nothing)"


# --- the worker's memory budget ---------------------------------------------------------------------


def test_the_default_budget_states_its_parts_and_stays_within_1_5_gb():
    policy = Lookahead()
    prefetch = FetchPolicy().prefetch_bytes
    budget = policy.budget(prefetch)
    assert (budget.frame_cache, budget.encoded, budget.prefetch, budget.decode_call) == (
        policy.frame_cache_bytes,
        policy.encoded_bytes,
        prefetch,
        2 * policy.decode_bytes,
    )
    assert budget.total == sum(dataclasses.astuple(budget)) <= WORKER_BYTES == 1_500_000_000
    assert policy.budget(prefetch, batch_bytes=7).total == budget.total + 7


def distinct_frames(samples: list[dict]) -> int:
    """(episode, camera, frame) triples the samples return."""
    return len(
        {
            (int(s["episode_index"]), cam, int(r))
            for s in samples
            for cam, o in SPEC.cameras.items()
            for r in np.clip(int(s["frame_index"]) + np.asarray(o), 0, LENGTHS[int(s["episode_index"])] - 1)
        }
    )


def test_the_auto_pool_fits_the_frame_cache_so_each_frame_is_decoded_once(small):
    # A window's span: 9 front + 5 wrist frames. Room for 2 episodes' spans and their columns: the
    # default pool (batch 1: at most 8 episodes, at least 1) becomes 2, the cache never exceeds its
    # budget and no frame is decoded twice; the whole consumer as one pool, with the same cache,
    # decodes frames again. Decode calls split at 2 frames' RGB bytes return the same frames.
    live, chunk = 14 * FRAME_BYTES, 4 * 2 * FRAME_BYTES  # a chunk of 4 windows: a new frame per camera each
    la = Lookahead(horizon=4, first=1, frame_cache_bytes=2 * live + chunk + 2 * 40 * 64, decode_bytes=2 * FRAME_BYTES)
    ds = WindowDataset(small, SPEC, seed=4, read=ReadOptions(telemetry=True, lookahead=la), batch_size=1)
    assert (
        reader_module.episode_bytes(ds.sources, ds.cam_offsets, ds.post) == (live, 2 * FRAME_BYTES)
        and ds.pool_episodes() == 2
    )
    samples = list(ds)
    assert sorted(check(s) for s in samples) == ALL
    t = summarize([samples[-1]["__telemetry__"]])
    assert t["frame_cache_bytes_peak"] <= la.frame_cache_bytes
    assert t["frames_unique"] == distinct_frames(samples), "a frame was decoded twice"
    assert t["decode_calls"] > t["decoder_opens"], "no decode call was split at decode_bytes"
    whole = list(WindowDataset(small, SPEC, seed=4, read=ReadOptions(telemetry=True, lookahead=la), shuffle=None))
    assert sorted(check(s) for s in whole) == ALL
    assert summarize([whole[-1]["__telemetry__"]])["frames_unique"] > distinct_frames(whole)
