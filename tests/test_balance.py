"""Cost-aware rank balancing: the pure global algorithm (properties), the cost model on a generated
dataset (hand-computed numbers, and the reader's own decode counters), telemetry, and the rank-local
application inside the streaming reader (exactly once, equal batches, exact resume, better balance)."""

from __future__ import annotations

import collections
import itertools

import numpy as np
import pytest
import torch

from epishard.balance import (
    CostModel,
    MeasuredCosts,
    StepTelemetry,
    WindowCost,
    balanced_steps,
    dropped_samples,
    epoch_summary,
    estimate_tokens,
    local_order,
    lpt_capped,
    padding_fraction,
    random_steps,
    rank_steps,
    remainder,
    sample_cost,
    step_stats,
    stratified_order,
    token_counts,
    window_features,
)
from epishard.stream.options import Ranks, ReadOptions
from epishard.stream.plan import EpisodeTable, EpochInputs, World, global_plan, rng_for, worker_plan
from epishard.stream.shuffle import SALT, pool_shuffle


def decoded_by_walking(frames: np.ndarray, keyframes: np.ndarray) -> int:
    """Reference decode count, one wanted frame at a time: a decoder whose last decoded frame is
    ``pos`` seeks to the keyframe ``k`` at or before the next wanted frame when ``k > pos``, else
    decodes on from ``pos + 1``; it decodes every frame up to the wanted one.
    """
    pos, count = -1, 0
    for f in sorted(set(frames.tolist())):
        k = max(x for x in keyframes.tolist() if x <= f)
        count += f - (k if k > pos else pos + 1) + 1
        pos = f
    return count


def lognormal_costs(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    tokens = np.clip(np.round(rng.lognormal(5.5, 1.0, n)), 8, 16384) + rng.choice([0, 576, 1152], n, p=[0.3, 0.6, 0.1])
    return tokens + tokens**2 / 24576


DISTRIBUTIONS = {
    "lognormal": lognormal_costs(40_000),
    "uniform": np.random.default_rng(1).uniform(1, 100, 40_000),
    "mixed_datasets": np.random.default_rng(2).choice([1900.0, 2400.0, 3700.0, 5200.0], 40_000, p=[0.4, 0.3, 0.2, 0.1]),
    "constant": np.full(40_000, 7.0),
}


# --- the global algorithm ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n,world,batch", [(1000, 8, 4), (1003, 8, 4), (4096, 64, 16), (31, 8, 4), (7, 1, 1), (0, 4, 2)]
)
def test_every_sample_once_minus_the_remainder_and_equal_counts(n, world, batch):
    costs = lognormal_costs(n, seed=n)
    for fn in (balanced_steps, random_steps):
        steps = fn(costs, world, batch, seed=3, epoch=1)
        assert steps.dtype == np.int64 and steps.shape == (n // (world * batch), world, batch)
        flat = steps.ravel()
        assert np.unique(flat).size == flat.size  # nothing twice
        dropped = dropped_samples(steps, n)
        assert dropped.size == remainder(n, world, batch) == n % (world * batch)
        assert np.array_equal(np.sort(np.concatenate([flat, dropped])), np.arange(n))


def test_both_layouts_drop_the_same_random_samples_and_other_ones_each_epoch():
    costs = lognormal_costs(1003)
    drops = [dropped_samples(balanced_steps(costs, 8, 4, seed=0, epoch=e), costs.size) for e in range(3)]
    assert np.array_equal(drops[0], dropped_samples(random_steps(costs, 8, 4, seed=0, epoch=0), costs.size))
    assert not np.array_equal(drops[0], drops[1]) and not np.array_equal(drops[1], drops[2])
    assert drops[0].max() < costs.size - 11 or drops[1].max() < costs.size - 11  # not always the cheapest/last


def test_deterministic_for_seed_and_epoch_different_otherwise():
    costs = lognormal_costs(5000)
    a = balanced_steps(costs, 8, 4, seed=5, epoch=2)
    assert np.array_equal(a, balanced_steps(costs.copy(), 8, 4, seed=5, epoch=2))
    assert not np.array_equal(a, balanced_steps(costs, 8, 4, seed=5, epoch=3))
    assert not np.array_equal(a, balanced_steps(costs, 8, 4, seed=6, epoch=2))


def test_equal_costs_are_grouped_differently_each_epoch():
    costs = np.full(512, 1.0)
    steps = [balanced_steps(costs, 8, 4, seed=0, epoch=e) for e in range(2)]
    groups = [{frozenset(s.ravel().tolist()) for s in st} for st in steps]
    assert groups[0] != groups[1]


def test_lpt_capped_on_a_hand_example():
    # 10 -> r0; 9 -> r1; 8 -> r1 (9 < 10); 1 -> r0 (10 < 17); 1 -> r0 (11 < 17), now full; 1 -> r1.
    rank = lpt_capped(np.array([[10.0, 9, 8, 1, 1, 1]]), world_size=2, batch_size=3)
    assert rank.tolist() == [[0, 1, 1, 0, 0, 1]]  # loads 12 and 18: the optimum for 3 + 3 samples


@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
@pytest.mark.parametrize("world,batch", [(8, 4), (8, 16), (64, 4)])
def test_max_over_mean_rank_cost_is_close_to_one(name, world, batch):
    costs = DISTRIBUTIONS[name]
    balanced = epoch_summary(step_stats(balanced_steps(costs, world, batch, seed=0), costs))
    baseline = epoch_summary(step_stats(random_steps(costs, world, batch, seed=0), costs))
    assert balanced["imbalance_mean"] <= 1.05 and balanced["imbalance_total"] <= 1.05
    assert balanced["step_time_padded"] <= baseline["step_time_padded"] * (1 + 1e-9)
    if name == "lognormal":
        assert baseline["step_time_padded"] / balanced["step_time_padded"] >= 1.5
        assert balanced["padding"] < 0.05 < baseline["padding"]


def test_no_rank_is_systematically_heavier():
    world, batch = 8, 4
    costs = np.random.default_rng(9).lognormal(6, 1, world * batch * 4000)  # continuous: no ties for the heaviest
    steps = balanced_steps(costs, world, batch, seed=1)
    per_rank = costs[steps].sum(axis=(0, 2))
    share = per_rank / per_rank.sum()
    assert np.all(np.abs(share * world - 1) < 0.02), share  # each rank's share within 2% of 1/8
    # The rank holding the step's heaviest sample is uniform over ranks (4000 steps, 500 expected each).
    heaviest = np.argmax(costs[steps].max(axis=2), axis=1)
    counts = np.bincount(heaviest, minlength=world)
    chi2 = float(np.sum((counts - 500.0) ** 2 / 500.0))
    assert chi2 < 24.3, counts  # chi-square, 7 degrees of freedom, p = 0.001
    # Heavy steps are spread over the epoch, not front-loaded.
    step_cost = costs[steps].sum(axis=(1, 2))
    halves = step_cost[: len(step_cost) // 2].sum() / step_cost.sum()
    assert abs(halves - 0.5) < 0.03


def test_steps_hold_similar_costs():
    costs = DISTRIBUTIONS["uniform"]
    steps = balanced_steps(costs, 8, 4, seed=0)
    c = costs[steps].reshape(len(steps), -1)
    assert np.max(c.max(axis=1) - c.min(axis=1)) < 0.3  # 32 consecutive of 40000 sorted uniform(1, 100)


# --- telemetry -------------------------------------------------------------------------------------


def test_padding_and_step_stats_on_a_hand_example():
    costs = np.array([4.0, 2.0, 3.0, 3.0])
    steps = np.array([[[0, 1], [2, 3]]])  # rank 0: 4 + 2 (padded 8), rank 1: 3 + 3 (padded 6)
    s = step_stats(steps, costs)
    assert s.max_rank.tolist() == [6.0] and s.mean_rank.tolist() == [6.0] and s.imbalance.tolist() == [1.0]
    assert s.padded_time.tolist() == [8.0] and s.packed_time.tolist() == [6.0]
    assert s.padding.tolist() == [pytest.approx(1 - 12 / 14)]
    assert padding_fraction(costs[steps]) == pytest.approx(1 - 12 / 14)
    live = StepTelemetry()
    assert live.add(costs[steps][0])["padded_time"] == 8.0
    live.add(np.array([[1.0, 1.0], [3.0, 1.0]]))
    summary = live.summary()
    assert summary["steps"] == 2 and summary["imbalance_max"] == pytest.approx(4 / 3)
    assert summary["step_time_padded"] == pytest.approx((8 + 6) / 2)


# --- the cost model on a generated dataset -----------------------------------------------------------

FPS = 20
LENGTHS = [40, 25, 33]
TASKS = ["pick", "pick the pear from the counter and place it in the plate", ""]
GOPS = {"observation.images.front": ("h264", 10), "observation.images.wrist": ("mpeg4", 6)}
SPEC_KW = dict(
    cameras={"observation.images.front": (0, 4, 8), "observation.images.wrist": (-2, 0)},
    action_horizon=5,
    boundary="pad",
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from videogen import make_episode_table, make_video

    from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Source, convert

    out = tmp_path_factory.mktemp("balance")
    episodes = [
        Episode(
            source="gen",
            episode_index=e,
            table=make_episode_table(n, fps=FPS),
            fps=FPS,
            tasks=(TASKS[e],),
            videos={
                cam: CameraVideo(make_video(None, n, codec=codec, gop=gop, fps=FPS, start_number=1000 * e))
                for cam, (codec, gop) in GOPS.items()
            },
        )
        for e, n in enumerate(LENGTHS)
    ]
    convert(
        [Source(name="gen", episodes=episodes, fps=FPS)],
        str(out),
        ConvertOptions(max_episodes_per_shard=2, progress=False),
    )
    return str(out)


@pytest.fixture(scope="module")
def index(dataset):
    from epishard.shardwriter import WindowIndex

    ix = WindowIndex.load_dataset(dataset)
    for e, n in enumerate(LENGTHS):  # the hand counts below assume keyframes at multiples of the GOP
        for c, (_, gop) in enumerate(GOPS.values()):
            s = ix.stream(e, c)
            assert ix.keyframes[ix.key_offsets[s] : ix.key_offsets[s + 1]].tolist() == list(range(0, n, gop))
    return ix


def test_features_match_hand_counts(index):
    from epishard.stream import WindowSpec

    spec = WindowSpec(**SPEC_KW)
    f = window_features(index, spec, np.array([0, 0, 1]), np.array([13, 38, 0]))
    # front (keyframes every 10), offsets 0, 4, 8:
    #   anchor 13 -> frames 13, 17, 21: 10..13 (4), 14..17 (4), keyframe 20: 20..21 (2) = 10
    #   anchor 38 of 40 rows -> frames 38, 39, 39 (clamped): 30..38 (9), 39 (1), again (0) = 10
    #   anchor 0 -> frames 0, 4, 8: 0..8 = 9
    assert f.per_camera["observation.images.front"]["decoded"].tolist() == [10, 10, 9]
    # wrist (keyframes every 6), offsets -2, 0:
    #   anchor 13 -> frames 11, 13: 6..11 (6), keyframe 12: 12..13 (2) = 8
    #   anchor 38 -> 36, 38: 36 (1), 37..38 (2) = 3;  anchor 0 -> 0 (clamped), 0: 1
    assert f.per_camera["observation.images.wrist"]["decoded"].tolist() == [8, 3, 1]
    assert f.decoded.tolist() == [18, 13, 10]
    assert f.frames.tolist() == [5, 5, 5] and f.pixels.tolist() == [5 * 64 * 64] * 3
    assert f.tokens.tolist() == [1, 1, 14]  # ceil(4 / 4), ceil(56 / 4)
    assert f.action.tolist() == [5, 5, 5]
    default = CostModel()(f)  # tokens + pixels / 196 + action
    assert default.tolist() == pytest.approx([1 + 5 * 4096 / 196 + 5, 1 + 5 * 4096 / 196 + 5, 14 + 5 * 4096 / 196 + 5])
    quad = CostModel.transformer(64)(f)
    assert quad == pytest.approx(default + default**2 / (12 * 64))
    assert CostModel.decode()(f).tolist() == [18.0, 13.0, 10.0]


def test_decode_counts_equal_a_walking_decoder_for_every_window(index):
    from epishard.stream import WindowSpec

    spec = WindowSpec(**SPEC_KW)
    episodes = np.repeat(np.arange(len(LENGTHS)), LENGTHS)
    anchors = np.concatenate([np.arange(n) for n in LENGTHS])
    f = window_features(index, spec, episodes, anchors)
    for cam, offsets in spec.cameras.items():
        c = sorted(GOPS).index(cam)
        expected = []
        for e, a in zip(episodes.tolist(), anchors.tolist(), strict=False):
            rows = np.clip(a + np.asarray(offsets), 0, LENGTHS[e] - 1)
            look = index.lookup(e, rows, camera=c)
            s = index.stream(e, c)
            expected.append(
                decoded_by_walking(look.frames, index.keyframes[index.key_offsets[s] : index.key_offsets[s + 1]])
            )
        assert f.per_camera[cam]["decoded"].tolist() == expected


def test_features_equal_the_readers_decode_counters_and_the_measured_hook(dataset):
    from epishard.stream import PostProcess, WindowDataset, WindowSpec
    from epishard.stream.telemetry import summarize

    spec = WindowSpec(**SPEC_KW, per_episode_count=1)  # one window per episode: the reader decodes exactly its frames
    ds = WindowDataset(dataset, spec, seed=4, read=ReadOptions(telemetry=True), postprocess=PostProcess(size=(32, 48)))
    samples = list(ds)
    cost = WindowCost.from_dataset(ds)
    episodes = np.array([int(s["episode_index"]) for s in samples])  # one source: global == source index
    anchors = np.array([int(s["frame_index"]) for s in samples])
    f = cost.features(episodes, anchors)
    t = summarize([s["__telemetry__"] for s in samples])
    assert int(f.decoded.sum()) == t["frames_decoded"] and int(f.frames.sum()) == t["frames_returned"]
    assert f.pixels.tolist() == [5 * 32 * 48] * len(samples)
    measured = np.array([sample_cost()(s) for s in samples])
    assert measured == pytest.approx(cost(episodes, anchors))


def test_tokens_from_a_tokenizer_or_the_estimate():
    assert estimate_tokens("pick the pear from the counter and place it in the plate") == 14
    assert token_counts(["a b c", "a b c", ""]).tolist() == [2, 2, 0]
    assert token_counts(["a b c", "d"], tokenizer=str.split).tolist() == [3, 1]
    assert token_counts(["a b c"], tokenizer=lambda t: 42).tolist() == [42]


def test_user_cost_function_and_measured_costs(index):
    from epishard.stream import WindowSpec

    cost = WindowCost(index, WindowSpec(**SPEC_KW), CostModel(extra=lambda f: 1000.0 * f.tokens))
    e, a = np.array([0, 1, 2]), np.array([0, 0, 0])
    base = WindowCost(index, WindowSpec(**SPEC_KW))(e, a)
    assert cost(e, a) == pytest.approx(base + 1000.0 * np.array([1, 14, 0]))
    measured = MeasuredCosts(lambda ep, an: np.full(ep.size, 10.0), num_episodes=3)
    measured.record(np.array([0, 0]), np.array([1, 2]), np.array([30.0, 50.0]))  # predicted 10 each, measured 40
    assert measured(e, a).tolist() == [40.0, 40.0, 40.0]  # episode 0 measured; others scaled by 80/20


# --- applied in the streaming reader -----------------------------------------------------------------


def test_local_order_is_a_chunked_permutation_aligned_across_ranks():
    rng = np.random.default_rng(0)
    batch, chunk_batches = 4, 5
    chunk = batch * chunk_batches
    plans = [rng.lognormal(3, 1, 203) for _ in range(3)]  # three ranks' costs for worker 0
    orders = [local_order(c, batch, chunk_batches, seed=1, epoch=0, worker=0) for c in plans]
    for costs, order in zip(plans, orders, strict=False):
        assert np.array_equal(np.sort(order), np.arange(costs.size))
        assert np.array_equal(order // chunk, np.arange(costs.size) // chunk)  # never leaves its chunk
        assert np.all(order - np.arange(costs.size) <= chunk - 1)  # moved at most a chunk earlier
        assert np.array_equal(order, local_order(costs, batch, chunk_batches, seed=1, epoch=0, worker=0))
    # In every step all ranks hold the block of the same cost rank of their own chunk.
    for c in range(costs.size // chunk):
        ranks_of_blocks = []
        for costs, order in zip(plans, orders, strict=False):
            block_cost = costs[order[c * chunk : (c + 1) * chunk]].reshape(chunk_batches, batch).sum(axis=1)
            ranks_of_blocks.append(np.argsort(np.argsort(-block_cost)).tolist())
        assert ranks_of_blocks[0] == ranks_of_blocks[1] == ranks_of_blocks[2]
    assert not np.array_equal(orders[0], local_order(plans[0], batch, chunk_batches, seed=1, epoch=1, worker=0))


def _mixed_table(num_episodes=120, shards=30, seed=0):
    rng = np.random.default_rng(seed)
    rows = rng.integers(40, 200, num_episodes)
    return EpisodeTable(
        shard=np.sort(rng.integers(0, shards, num_episodes)),
        lo=np.zeros(num_episodes, np.int64),
        hi=rows.astype(np.int64),
        weight=np.ones(num_episodes),
        cost_bytes=rows * 1000,
    )


def test_streaming_plan_with_local_order_keeps_guarantees_and_balances_steps():
    table = _mixed_table()
    rng = np.random.default_rng(1)
    episode_cost = rng.choice([1900.0, 2400.0, 3700.0, 5200.0], table.num_episodes)  # datasets of different shapes
    world, workers, batch, chunk_batches = 4, 2, 4, 16
    plain, balanced, seen = [], [], collections.Counter()
    for rank in range(world):
        per_worker_plain, per_worker_bal = [], []
        for w in range(workers):
            p = worker_plan(EpochInputs(table, 3, None, 0, 0), world=World(rank, world, w, workers), shuffle_episodes=8)
            costs = episode_cost[p.episode] * (1 + 0.2 * (p.anchor % 7))  # and some per-window variation
            order = local_order(costs, batch, chunk_batches, seed=0, epoch=0, worker=w)
            seen.update(zip(p.episode[order].tolist(), p.anchor[order].tolist(), strict=False))
            per_worker_plain.append(costs)
            per_worker_bal.append(costs[order])
        plain.append(rank_steps(per_worker_plain, batch))
        balanced.append(rank_steps(per_worker_bal, batch))
    assert len({len(s) for s in balanced}) == 1  # equal batch counts per rank
    assert all(v == 1 for v in seen.values())  # every planned window once
    planned = sum(len(range(0, int(h), 3)) for h in table.hi)
    assert planned - len(seen) < world * workers
    a = epoch_summary(step_stats(np.stack(plain, axis=1)))
    b = epoch_summary(step_stats(np.stack(balanced, axis=1)))
    assert b["step_time_padded"] < 0.8 * a["step_time_padded"]
    assert b["imbalance_mean"] < a["imbalance_mean"] and b["padding"] < a["padding"]


def test_stratified_order_gives_every_rank_the_same_stratum_per_batch():
    rng = np.random.default_rng(3)
    batch, num_strata = 4, 3
    counts = [37, 20, 9]  # per stratum, the same on every rank
    ranks = []
    for _ in range(3):
        strata = rng.permutation(np.repeat(np.arange(num_strata), counts))
        costs = rng.lognormal(3, 1, strata.size) * (1 + strata)
        order = stratified_order(strata, num_strata, batch, seed=2, epoch=0, worker=1, costs=costs, chunk_batches=4)
        assert np.array_equal(np.sort(order), np.arange(strata.size))
        for k in range(num_strata):  # within a stratum, blocks stay inside local_order's chunks
            assert np.array_equal(np.sort(order[strata[order] == k]), np.flatnonzero(strata == k))
        ranks.append(strata[order])
    full = sum(c // batch for c in counts)
    for r in ranks:
        batches = r[: full * batch].reshape(full, batch)
        assert (batches == batches[:, :1]).all()  # one stratum per full batch
        assert np.array_equal(r, ranks[0])  # the same stratum in every step on every rank
    assert sorted(ranks[0][full * batch :].tolist()) == [0, 2]  # leftovers 37 mod 4, 20 mod 4, 9 mod 4 at the end
    other = stratified_order(np.repeat(np.arange(num_strata), counts), num_strata, batch, seed=2, epoch=1, worker=1)
    assert not np.array_equal(np.repeat(np.arange(num_strata), counts)[other], ranks[0])


def test_stratified_streaming_plan_balances_datasets_that_live_in_separate_shards():
    table = _mixed_table(num_episodes=160, shards=40, seed=4)
    strata = table.shard % 4  # 4 datasets, each in its own shards, with different window costs
    stratum_cost = np.array([800.0, 1560.0, 810.0, 1580.0])
    world, workers, batch, consumers = 4, 2, 4, 8
    parts = [[] for _ in range(consumers)]
    for k in range(4):  # the reader's plan run per stratum: each consumer gets equal counts of every stratum
        pick = np.flatnonzero(strata == k)
        sub = EpisodeTable(
            shard=table.shard[pick],
            lo=table.lo[pick],
            hi=table.hi[pick],
            weight=table.weight[pick],
            cost_bytes=table.cost_bytes[pick],
        )
        plan = global_plan(EpochInputs(sub, 3, None, 0, 0), consumers)
        for c in range(consumers):
            e = plan.episode[plan.consumer_slice(c)]
            o = pool_shuffle(e, 8, rng_for(0, 0, SALT, c, k))
            parts[c].append((pick[e[o]], plan.anchor[plan.consumer_slice(c)][o]))
    plain, stratified, seen = [], [], collections.Counter()
    for rank in range(world):
        per_plain, per_strat = [], []
        for w in range(workers):
            p = worker_plan(EpochInputs(table, 3, None, 0, 0), world=World(rank, world, w, workers), shuffle_episodes=8)
            per_plain.append(stratum_cost[strata[p.episode]])
            e, a = (np.concatenate(x) for x in zip(*parts[rank * workers + w], strict=False))
            order = stratified_order(strata[e], 4, batch, seed=0, epoch=0, worker=w)
            seen.update(zip(e[order].tolist(), a[order].tolist(), strict=False))
            per_strat.append(stratum_cost[strata[e[order]]])
        plain.append(rank_steps(per_plain, batch))
        stratified.append(rank_steps(per_strat, batch))
    assert all(v == 1 for v in seen.values()) and len({len(s) for s in stratified}) == 1
    a = epoch_summary(step_stats(np.stack(plain, axis=1)))
    b = epoch_summary(step_stats(np.stack(stratified, axis=1)))
    assert a["imbalance_mean"] > 1.2 and b["imbalance_mean"] < 1.03
    assert b["step_time_padded"] < 0.8 * a["step_time_padded"]


@pytest.fixture(scope="module")
def balanced_loader_factory(dataset, index):
    from epishard.balance.streaming import BalancedWindowDataset
    from epishard.stream import WindowLoader, WindowSpec

    spec = WindowSpec(**{**SPEC_KW, "cameras": {"observation.images.front": (0, 4, 8)}}, stride=2)
    cost = WindowCost(index, spec, CostModel.decode())  # decode work varies with the anchor's keyframe distance

    def make(rank=0, world=1, workers=0, batch=2, balanced=True):
        if not balanced:
            from epishard.stream import WindowDataset

            return WindowLoader(
                WindowDataset(dataset, spec, seed=7, ranks=Ranks(rank=rank, world_size=world)),
                batch_size=batch,
                num_workers=workers,
            )
        ds = BalancedWindowDataset(
            dataset,
            spec,
            batch_size=batch,
            chunk_batches=3,
            seed=7,
            ranks=Ranks(rank=rank, world_size=world),
            cost=cost,
        )
        return WindowLoader(ds, batch_size=batch, num_workers=workers)

    return make


def _keys_of(batch) -> list[tuple[int, int]]:
    return list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=False))


def test_balanced_reader_yields_each_window_once_with_equal_batches(balanced_loader_factory):
    world, seen, counts = 2, collections.Counter(), []
    for rank in range(world):
        batches = list(balanced_loader_factory(rank=rank, world=world, workers=2))
        counts.append(len(batches))
        for b in batches:
            seen.update(_keys_of(b))
            assert b["__cost__"].dtype == torch.float64
    assert len(set(counts)) == 1
    assert all(v == 1 for v in seen.values())
    planned = {(e, a) for e, n in enumerate(LENGTHS) for a in range(0, n, 2)}
    assert set(seen) <= planned and len(planned) - len(seen) < world * 2


@pytest.mark.parametrize("workers,cut", [(0, 2), (2, 3)])
def test_balanced_reader_resumes_exactly(balanced_loader_factory, workers, cut):
    reference = balanced_loader_factory(workers=workers)
    full = [_keys_of(b) for b in reference] + [_keys_of(b) for b in reference]  # epochs 0 and 1
    first = balanced_loader_factory(workers=workers)
    it = iter(first)
    got = [_keys_of(next(it)) for _ in range(cut)]
    state = first.state_dict()
    del it
    second = balanced_loader_factory(workers=workers)
    second.load_state_dict(state)
    got += [_keys_of(b) for b in second] + [_keys_of(b) for b in second]
    assert got == full
    plain = [_keys_of(b) for b in balanced_loader_factory(workers=workers, balanced=False)]
    assert sorted(itertools.chain(*plain)) == sorted(itertools.chain(*full[: len(plain)]))  # same windows ...
    assert plain != full[: len(plain)]  # ... in the balanced order


def test_step_telemetry_accepts_a_partial_last_batch():
    from epishard.balance import StepTelemetry

    t = StepTelemetry()
    t.add(np.array([[1.0, 3.0], [2.0, 2.0]]))
    t.add(np.array([[5.0], [1.0]]))  # the epoch's last, partial batch
    s = t.summary()
    assert s["steps"] == 2
    assert s["imbalance_mean"] == pytest.approx((1.0 + 5.0 / 3.0) / 2)
    assert s["step_time_padded"] == pytest.approx((6.0 + 5.0) / 2)


def test_an_epoch_boundary_state_loads_under_other_balancing(intact):
    """A state at an epoch boundary ("fresh") consumed nothing: it loads under another chunk size, and the
    next epoch is that loader's own (a mid-epoch state of another balancing is refused, naming both)."""
    from faultgen import SPEC

    from epishard.balance.streaming import BalancedWindowDataset
    from epishard.stream import WindowLoader

    def loader(chunk: int) -> WindowLoader:
        ds = BalancedWindowDataset(intact, SPEC, batch_size=2, chunk_batches=chunk, seed=4)
        return WindowLoader(ds, batch_size=2)

    saved = loader(3)
    list(saved)  # one whole epoch: its state is the next epoch's start
    state = saved.state_dict()
    assert state["fresh"] and state["epoch"] == 1 and state["balance"]["chunk_batches"] == 3
    other = loader(5)
    other.load_state_dict(state)
    reference = loader(5)
    reference.load_state_dict({**state, "balance": {**state["balance"], "chunk_batches": 5}})
    assert [_keys_of(b) for b in other] == [_keys_of(b) for b in reference]
    partway = loader(3)
    it = iter(partway)
    next(it)
    mid = partway.state_dict()
    del it
    with pytest.raises(ValueError, match=r"saved with balancing .*'chunk_batches': 3.*this dataset has .*5"):
        loader(5).load_state_dict(mid)
