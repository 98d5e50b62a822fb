"""Benchmark (simulation): cost-balanced vs random assignment of samples to data-parallel ranks.

Step time of synchronous data parallelism is the slowest rank's time. Modelled per step as
``max over ranks of batch_size * (max sample cost in the rank's batch)`` ("padded": every sample
padded to the longest of its batch), or ``max over ranks of sum of costs`` ("packed", used for
decode work, which is not padded). max/mean is the largest over the mean rank cost per step
(packed costs), averaged over steps. No time is measured except the planning itself.

Sections:

(a) VLM-SFT-like lengths: text tokens ``round(lognormal(mu=5.5, sigma=1.0))`` clipped to
    [8, 16384] (median 245, mean ~400), plus ``576 * k`` image tokens (336x336 images, 14x14
    patches) with ``k`` in {0, 1, 2, 4} at probabilities {0.3, 0.5, 0.1, 0.1}; cost of a sample of
    ``L`` tokens ``L + L^2 / (12 * 2048)`` (``CostModel.transformer(2048)``: matmuls plus attention
    at hidden size 2048). ``balanced_steps`` vs ``random_steps``.
(b) The real datasets in ../shared/data, from their metadata: every episode's length, task text,
    cameras, fps (meta/info.json, episodes, tasks) and the keyframe interval found by demuxing one
    video (no decoding; AV1 GOP 2, LeRobot's encoder default, where the videos are absent). Each
    dataset has its own window: all of its cameras, frames at ``-1 s, -0.5 s, 0`` (3 per camera),
    a 1 s action chunk (``fps`` steps), pad mode, frames resized to 224x224 (256 vision tokens).
    Mixed with weights (window multipliers) gr00t 4, so101_bimanual_cloth 2,
    unitree_g1_bottle_av1 0.5, so101_record_test_v30_novideo 4; windows drawn i.i.d. from the mix.
    Two cost models through ``balance.cost.WindowCost`` on index tables built from that metadata:
    ``compute`` (sequence tokens + attention, hidden size 2048; padded step time) and ``decode``
    (frames decoded from the preceding keyframe; packed step time).
(c) Applied in the streaming reader: the real-data mix as one epoch of the reader's own plan
    (``stream.plan.worker_plan``: shards of 4 episodes, 2 workers per rank, 512-window shuffle
    buffer, every anchor), each rank's batches as the DataLoader forms them, without balancing
    ("plain") and with ``balance.local.local_order`` (16 batches per chunk, "local"); "global"
    (``balanced_steps`` on the same windows, ignoring which rank reads which shard) is the bound.

``--e2e``: instead, measured end to end: DDP training steps per second without, with local and with
global cost balancing (``scenarios/balance_e2e.py``; its options are in their own group below).

    python tools/bench/run.py balance [--steps 200] [--worlds 8 64 512] [--batches 4 16] [--data DIR] [--json]
    python tools/bench/run.py balance --e2e [--rounds 2] [--variants plain,local,global]
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import time

import measure
import numpy as np
import pyarrow.parquet as pq

from epishard.balance import (
    CostModel,
    WindowCost,
    balanced_steps,
    epoch_summary,
    local_order,
    random_steps,
    rank_steps,
    step_stats,
    stratified_order,
)
from epishard.balance.telemetry import step_costs
from epishard.format.index import WindowIndex
from epishard.stream.plan import EpisodeTable, EpochInputs, World, global_plan, rng_for, worker_plan
from epishard.stream.shuffle import SALT, default_shuffle_episodes, pool_shuffle

D_MODEL = 2048
MIX = {
    "gr00t_robot_sim_picknplace": 4.0,
    "so101_bimanual_cloth": 2.0,
    "unitree_g1_bottle_av1": 0.5,
    "so101_record_test_v30_novideo": 4.0,
}
VARIANTS = ("plain", "local", "stratified", "reader", "global")
ASSUMED_GOP = 2  # LeRobot's default for libsvtav1 (g=2), for datasets without video files


# --- (a) VLM-SFT-like lengths ---------------------------------------------------------------------


def vlm_sft_costs(n: int, rng: np.random.Generator) -> np.ndarray:
    text = np.clip(np.round(rng.lognormal(5.5, 1.0, n)), 8, 16384)
    images = rng.choice([0, 1, 2, 4], n, p=[0.3, 0.5, 0.1, 0.1])
    length = text + 576 * images
    return length + length**2 / (12 * D_MODEL)


# --- (b) real datasets from their metadata ----------------------------------------------------------


def _jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_meta(root: str) -> dict:
    """Episode lengths, first task texts, cameras (name, height, width), fps and keyframe interval."""
    with open(os.path.join(root, "meta", "info.json")) as f:
        info = json.load(f)
    if os.path.exists(os.path.join(root, "meta", "episodes.jsonl")):  # v2.x
        rows = sorted(_jsonl(os.path.join(root, "meta", "episodes.jsonl")), key=lambda r: r["episode_index"])
    else:  # v3.0
        files = sorted(glob.glob(os.path.join(glob.escape(root), "meta", "episodes", "*", "*.parquet")))
        rows = sorted(
            (r for f in files for r in pq.read_table(f, columns=["episode_index", "tasks", "length"]).to_pylist()),
            key=lambda r: r["episode_index"],
        )
    has_videos = os.path.isdir(os.path.join(root, "videos"))
    cameras, note = [], ""
    for name, feat in info["features"].items():
        if feat.get("dtype") != "video":
            continue
        pattern = os.path.join(glob.escape(root), "videos", "**", glob.escape(name), "**", "*.mp4")
        files = glob.glob(pattern, recursive=True)
        if has_videos and not files:
            continue  # declared without files (gr00t's egoview): the converter drops it too
        vi = feat.get("info") or feat.get("video_info") or {}
        shape = feat["shape"]
        h, w = (
            (vi["video.height"], vi["video.width"])
            if "video.height" in vi
            else ((shape[1], shape[2]) if shape[0] in (1, 3) and shape[-1] not in (1, 3) else (shape[0], shape[1]))
        )
        cameras.append((name, int(h), int(w), sorted(files)))
    gop = None
    for _, _, _, files in cameras:
        if files:
            gop = probe_gop(files[0])
            break
    if gop is None:
        gop, note = ASSUMED_GOP, f"no video files: GOP {ASSUMED_GOP} assumed"
    return {
        "name": os.path.basename(root.rstrip("/")),
        "fps": float(info["fps"]),
        "lengths": [int(r["length"]) for r in rows],
        "tasks": [(list(r["tasks"]) or [""])[0] for r in rows],
        "cameras": [c[:3] for c in cameras],
        "gop": gop,
        "note": note,
    }


def probe_gop(path: str) -> int:
    """Median keyframe interval (frames, presentation order) from the packets of one video."""
    import av

    with av.open(path) as container:
        stream = container.streams.video[0]
        packets = [(p.pts, p.is_keyframe) for p in container.demux(stream) if p.pts is not None]
    key = np.array([k for _, k in sorted(packets)], dtype=bool)
    where = np.flatnonzero(key)
    return int(np.median(np.diff(where))) if where.size > 1 else int(key.size)


def synthetic_index(meta: dict) -> WindowIndex:
    """A ``WindowIndex`` for the metadata's episodes: regular frame tables, keyframes every ``gop``."""
    rows = []
    for e, (n, task) in enumerate(zip(meta["lengths"], meta["tasks"], strict=False)):
        key = f"{meta['name']}-e{e:06d}"
        members = [
            {"name": f"{key}.{x}", "offset": 0, "size": 1, "sha256": ""}
            for x in ["json", "parquet"] + [c[0] for c in meta["cameras"]]
        ]
        cams = [
            {
                "name": c,
                "member": 2 + i,
                "codec": "",
                "width": w,
                "height": h,
                "pix_fmt": "yuv420p",
                "time_base_num": 1,
                "time_base_den": int(meta["fps"]),
                "num_frames": n,
                "pts_start": 0,
                "pts_step": 1,
                "pts": [],
                "duration": [],
                "keyframes": list(range(0, n, meta["gop"])),
                "first_frame": 0,
                "row_to_frame": [],
                "transform": "copy",
            }
            for i, (c, h, w) in enumerate(sorted(meta["cameras"]))
        ]
        rows.append(
            {
                "key": key,
                "source": meta["name"],
                "episode_index": e,
                "num_rows": n,
                "fps": meta["fps"],
                "task": task,
                "tasks": [task],
                "robot": "",
                "members": members,
                "cameras": cams,
                "window_start": 0,
                "window_stop": n,
            }
        )
    return WindowIndex.from_rows(rows)


def dataset_spec(meta: dict):
    from epishard.stream import WindowSpec

    fps = int(meta["fps"])
    return WindowSpec(
        cameras={c: (-fps, -fps // 2, 0) for c, _, _ in meta["cameras"]},
        action_horizon=fps,
        state_offsets=(0,),
        boundary="pad",
    )


class RealMix:
    """The weighted mix of the real datasets: indexes, specs, cost functions, window sampling."""

    def __init__(self, data: str):
        from epishard.stream import PostProcess

        self.metas = [read_meta(os.path.join(data, name)) for name in MIX]
        self.weights = np.array([MIX[m["name"]] for m in self.metas])
        self.indexes = [synthetic_index(m) for m in self.metas]
        self.specs = [dataset_spec(m) for m in self.metas]
        post = PostProcess(size=(224, 224))
        self.cost = {
            "compute": WindowCost(self.indexes, self.specs, CostModel.transformer(D_MODEL), postprocess=post),
            "decode": WindowCost(self.indexes, self.specs, CostModel.decode(), postprocess=post),
        }
        self.base = np.cumsum([0] + [ix.num_episodes for ix in self.indexes])

    def describe(self) -> list[dict]:
        return [
            {
                "dataset": m["name"],
                "episodes": len(m["lengths"]),
                "frames": int(sum(m["lengths"])),
                "fps": m["fps"],
                "cameras": len(m["cameras"]),
                "gop": m["gop"],
                "task_tokens": sorted({(len(t) + 3) // 4 for t in m["tasks"]}),
                "weight": MIX[m["name"]],
                "note": m["note"],
            }
            for m in self.metas
        ]

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` windows (global episode, anchor) i.i.d. from the weighted mix (every anchor, pad mode)."""
        lengths = np.concatenate([np.asarray(m["lengths"]) for m in self.metas])
        weight = np.repeat(self.weights, [len(m["lengths"]) for m in self.metas]) * lengths
        episodes = rng.choice(lengths.size, size=n, p=weight / weight.sum())
        anchors = np.floor(rng.random(n) * lengths[episodes]).astype(np.int64)
        return episodes.astype(np.int64), anchors

    def episode_table(self, per_shard: int = 4) -> EpisodeTable:
        shard, start = [], 0
        for m in self.metas:
            k = len(m["lengths"])
            shard.append(start + np.arange(k) // per_shard)
            start += (k + per_shard - 1) // per_shard
        lengths = np.concatenate([np.asarray(m["lengths"], dtype=np.int64) for m in self.metas])
        weight = np.repeat(self.weights, [len(m["lengths"]) for m in self.metas])
        return EpisodeTable(
            shard=np.concatenate(shard).astype(np.int64),
            lo=np.zeros_like(lengths),
            hi=lengths,
            weight=weight.astype(np.float64),
            cost_bytes=np.ones_like(lengths),
        )


# --- runs -----------------------------------------------------------------------------------------


def compare(costs: np.ndarray, world: int, batch: int, seed: int, padded: bool) -> dict:
    t0 = time.perf_counter()
    bal = balanced_steps(costs, world, batch, seed)
    plan_s = time.perf_counter() - t0
    rnd = random_steps(costs, world, batch, seed)
    a, b = epoch_summary(step_stats(rnd, costs)), epoch_summary(step_stats(bal, costs))
    key = "step_time_padded" if padded else "step_time_packed"
    return {
        "world": world,
        "batch": batch,
        "steps": b["steps"],
        "step_model": "padded" if padded else "packed",
        "random_step": a[key],
        "balanced_step": b[key],
        "speedup": a[key] / b[key],
        "imbalance_random": a["imbalance_mean"],
        "imbalance_balanced": b["imbalance_mean"],
        "imbalance_balanced_total": b["imbalance_total"],
        "padding_random": a["padding"],
        "padding_balanced": b["padding"],
        "plan_s": plan_s,
    }


def _stratified_plans(table: EpisodeTable, strata: np.ndarray, consumers: int, seed: int, pool: int) -> list[tuple]:
    """Per consumer (episode, anchor, stratum) in planned order, each stratum cut into equal ranges.

    The reader's plan (``global_plan`` + per-consumer ``pool_shuffle`` of ``pool`` episodes) applied to every stratum's
    episodes separately, so every consumer holds the same number of windows of each stratum."""
    parts = [[] for _ in range(consumers)]
    for k in np.unique(strata).tolist():
        pick = np.flatnonzero(strata == k)
        sub = EpisodeTable(
            shard=table.shard[pick],
            lo=table.lo[pick],
            hi=table.hi[pick],
            weight=table.weight[pick],
            cost_bytes=table.cost_bytes[pick],
        )
        plan = global_plan(EpochInputs(sub, 1, None, seed, 0), consumers)
        for c in range(consumers):
            e, a = plan.episode[plan.consumer_slice(c)], plan.anchor[plan.consumer_slice(c)]
            o = pool_shuffle(e, pool, rng_for(seed, 0, SALT, c, k))
            parts[c].append((pick[e[o]], a[o], np.full(e.size, k)))
    return [tuple(np.concatenate(x) for x in zip(*p, strict=False)) for p in parts]


def streaming(mix: RealMix, model: str, world: int, batch: int, workers: int, chunk_batches: int, seed: int) -> dict:
    """(c): one epoch of the reader's plan; per-step rank costs for plain, local, stratified, global."""
    table = mix.episode_table()
    strata = (np.searchsorted(mix.base, np.arange(table.num_episodes), side="right") - 1).astype(np.int64)
    cost, key = mix.cost[model], ("step_time_padded" if model == "compute" else "step_time_packed")
    pool = default_shuffle_episodes(batch)  # the reader's default pool ("auto")
    strat_plans = _stratified_plans(table, strata, world * workers, seed, pool)
    layouts = {"plain": [], "local": [], "stratified": [], "reader": []}
    table_s = dataclasses.replace(table, stratum=strata)  # what WindowDataset does when mixing datasets
    windows = []
    for rank in range(world):
        per = {k: [] for k in layouts}
        for w in range(workers):
            p = worker_plan(
                EpochInputs(table, 1, None, seed, 0), world=World(rank, world, w, workers), shuffle_episodes=pool
            )
            c = cost(p.episode, p.anchor)
            per["plain"].append(c)
            per["local"].append(c[local_order(c, batch, chunk_batches, seed, 0, w)])
            windows.append(c)
            q = worker_plan(
                EpochInputs(table_s, 1, None, seed, 0), world=World(rank, world, w, workers), shuffle_episodes=pool
            )
            cq = cost(q.episode, q.anchor)
            kq = strata[q.episode]
            per["reader"].append(cq[stratified_order(kq, len(mix.metas), batch, seed, 0, w, cq, chunk_batches)])
            e, a, k = strat_plans[rank * workers + w]
            cs = cost(e, a)
            per["stratified"].append(cs[stratified_order(k, len(mix.metas), batch, seed, 0, w, cs, chunk_batches)])
        for k in layouts:
            layouts[k].append(rank_steps(per[k], batch))
    summary = {k: epoch_summary(step_stats(np.stack(v, axis=1))) for k, v in layouts.items()}
    all_costs = np.concatenate(windows)
    summary["global"] = epoch_summary(step_stats(balanced_steps(all_costs, world, batch, seed), all_costs))
    row = {
        "model": model,
        "step_model": key[10:],
        "world": world,
        "batch": batch,
        "workers": workers,
        "chunk_batches": chunk_batches,
        "steps": summary["plain"]["steps"],
        "windows": int(all_costs.size),
    }
    for k, v in summary.items():
        row.update(
            {
                f"{k}_step": v[key],
                f"{k}_speedup": summary["plain"][key] / v[key],
                f"{k}_imbalance": v["imbalance_mean"],
                f"{k}_padding": v["padding"],
            }
        )
    return row


def plot_first_configuration(args, path: str) -> None:
    """Per-rank cost per step, random against balanced, of (a)'s first world size and batch size."""
    from epishard.balance.plots import plot_rank_costs

    world, batch = args.worlds[0], args.batches[0]
    costs = vlm_sft_costs(args.steps * world * batch, np.random.default_rng(args.seed))
    layouts = {
        "random": step_costs(random_steps(costs, world, batch, args.seed), costs),
        "balanced": step_costs(balanced_steps(costs, world, batch, args.seed), costs),
    }
    plot_rank_costs(layouts, path, f"VLM SFT costs, world {world}, batch {batch}, {args.steps} steps")
    print(f"plot: {path}")


SMOKE = {"steps": 5, "worlds": [8], "batches": [4], "stream_worlds": [8], "data": "", "episodes": 6, "rounds": 1}
SMOKE_E2E = {"variants": "plain,local", "batch_size": 4, "chunk_batches": 2}


def options(ap) -> None:
    ap.add_argument("--steps", type=int, default=200, help="global steps per configuration in (a) and (b)")
    ap.add_argument("--worlds", type=int, nargs="+", default=[8, 64, 512])
    ap.add_argument("--batches", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--stream-worlds", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--data", default=str(measure.shared_data()), help="the real datasets of (b) and (c)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", metavar="PNG", help="draw per-rank cost per step of (a)'s first configuration")
    from scenarios.balance_e2e import e2e_options

    e2e_options(ap.add_argument_group("--e2e: DDP end to end"))


def run(args) -> int:
    if args.e2e:
        from scenarios.balance_e2e import e2e

        if args.smoke:
            for k, v in SMOKE_E2E.items():
                setattr(args, k, v)
        return e2e(args)
    t_start = time.perf_counter()
    out = measure.emit

    rows_a = []
    for world in args.worlds:
        for batch in args.batches:
            n = args.steps * world * batch + world * batch // 2  # a remainder, dropped
            r = {
                "section": "a",
                "model": "vlm_sft",
                **compare(vlm_sft_costs(n, np.random.default_rng(args.seed)), world, batch, args.seed, padded=True),
            }
            rows_a.append(r)
            out(r)

    if args.plot:
        plot_first_configuration(args, args.plot)

    rows_b, rows_c, described = [], [], []
    if args.data and all(os.path.exists(os.path.join(args.data, name, "meta", "info.json")) for name in MIX):
        mix = RealMix(args.data)
        described = mix.describe()
        for d in described:
            out({"section": "b_data", **d})
        for world in args.worlds:
            for batch in args.batches:
                episodes, anchors = mix.sample(args.steps * world * batch, np.random.default_rng(args.seed))
                for model, padded in (("compute", True), ("decode", False)):
                    r = {
                        "section": "b",
                        "model": model,
                        **compare(mix.cost[model](episodes, anchors), world, batch, args.seed, padded),
                    }
                    rows_b.append(r)
                    out(r)
        for model in ("compute", "decode"):
            for world in args.stream_worlds:
                for batch in args.batches:
                    r = {"section": "c", **streaming(mix, model, world, batch, 2, 16, args.seed)}
                    rows_c.append(r)
                    out(r)
    elif not args.json:
        print(f"(b), (c) skipped: the real datasets are not in {args.data}")

    if not args.json:
        head = (
            f"{'sec':3} {'model':8} {'world':>5} {'batch':>5} {'steps':>5} {'step':6} {'random':>10} {'balanced':>10} "
            f"{'speedup':>7} {'max/mean rnd':>12} {'max/mean bal':>12} {'pad rnd':>7} {'pad bal':>7} {'plan s':>6}"
        )
        print(head)
        for r in rows_a + rows_b:
            print(
                f"{r['section']:3} {r['model']:8} {r['world']:5d} {r['batch']:5d} {r['steps']:5d} {r['step_model']:6} "
                f"{r['random_step']:10.0f} {r['balanced_step']:10.0f} {r['speedup']:6.2f}x "
                f"{r['imbalance_random']:12.3f} {r['imbalance_balanced']:12.3f} "
                f"{r['padding_random']:7.3f} {r['padding_balanced']:7.3f} {r['plan_s']:6.2f}"
            )
        if described:
            print("\n(b) datasets:")
            for d in described:
                print(
                    f"  {d['dataset']}: {d['episodes']} episodes, {d['frames']} frames, {d['fps']:g} fps, "
                    f"{d['cameras']} camera(s), GOP {d['gop']}, task tokens {d['task_tokens']}, weight {d['weight']:g}"
                    + (f" ({d['note']})" if d["note"] else "")
                )
        if rows_c:
            print("\n(c) streaming reader: step time, speedup over plain, max/mean rank cost")
            print(
                f"  {'model':8} {'step':6} {'world':>5} {'batch':>5} {'steps':>5} "
                + " ".join(f"{k:>24}" for k in VARIANTS)
            )
            for r in rows_c:
                print(
                    f"  {r['model']:8} {r['step_model']:6} {r['world']:5d} {r['batch']:5d} {r['steps']:5d} "
                    + " ".join(
                        f"{r[k + '_step']:8.0f} {r[k + '_speedup']:5.2f}x {r[k + '_imbalance']:6.3f}  "
                        for k in VARIANTS
                    )
                )
        a8 = [r for r in rows_a if r["world"] == 8]
        if a8:
            ok = all(r["speedup"] >= 1.5 and r["imbalance_balanced"] <= 1.05 for r in a8)
            print(
                f"\ntargets (a) at world size 8: step time >= 1.5x lower than random and max/mean <= 1.05: "
                f"{'met' if ok else 'NOT met'} ("
                + ", ".join(f"batch {r['batch']}: {r['speedup']:.2f}x, {r['imbalance_balanced']:.3f}" for r in a8)
                + ")"
            )
        print(f"total {time.perf_counter() - t_start:.1f} s")
    return 0
