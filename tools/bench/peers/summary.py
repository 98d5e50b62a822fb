"""Medians over rounds, the headline (matched diversity, same dtype), the printed and markdown tables."""

from __future__ import annotations

import json
from pathlib import Path

from .config import AV1_TARGET, DECODE_TARGET, MATCHED, STAGES, TARGET
from .runs import Dataset

FIELDS = (
    "samples_per_s",
    "frames_decoded_per_returned",
    "time_to_first_batch_s",
    "rss_peak_mb",
    "pss_peak_mb",
    "worker_rss_peak_mb",
    "bytes_read_per_sample",
    "distinct_episodes_per_batch",
    "distinct_episodes_per_batch_iid",
    "same_episode_pair_probability",
    "same_episode_pair_probability_iid",
    "diversity_ratio",
    "seconds",
    "frames_postprocessed_per_sample",
)


def med(values):
    """Median (float) of ``values`` with the Nones left out; None when nothing is left."""
    import numpy as np

    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def sustained(r: dict, warmup_samples: int) -> float:
    """Samples/s from the first request to the last timed batch, warm-up included.

    A reader that banks decoded work before its first batch (today's shuffle buffer holds up to 512
    decoded windows per worker: with 4 windows per episode on 200 episodes, a worker's whole epoch)
    would otherwise be timed while it drains the bank: the gr00t baseline's pe4 run gave 20.8
    samples/s after a 211 s warm-up of 16 samples. Counting the warm-up charges that work to the
    samples; a bank still full at the end makes it a lower bound for such a reader."""
    return (r["samples"] + warmup_samples) / (r["seconds"] + r["warmup_s"])


def summarize(records: list[dict], datasets: list[Dataset], warmup_samples: int) -> list[dict]:
    """Per (dataset, system): medians over rounds of every figure, and the fraction of the decode limit.

    ``samples_per_s`` is the sustained rate (``sustained``); the rate after the warm-up batches is
    kept as ``samples_per_s_after_warmup``."""
    rows = []
    for d in datasets:
        by: dict[str, list[dict]] = {}
        for r in records:
            if r["dataset"] == d.name:
                by.setdefault(r["system"], []).append(r)
        for sid, rs in by.items():
            row = {"record": "summary", "dataset": d.name, "system": sid, "rounds": len(rs)}
            row.update({k: rs[0].get(k) for k in ("label", "kind", "dtype", "policy", "source_format", "shapes")})
            row.update({k: med([r.get(k) for r in rs]) for k in FIELDS})
            row["samples_per_s_after_warmup"] = row["samples_per_s"]
            row["samples_per_s_rounds"] = [sustained(r, warmup_samples) for r in rs]
            row["samples_per_s"] = med(row["samples_per_s_rounds"])
            row["warmup_s"] = med([r.get("warmup_s") for r in rs])
            row["frames_decoded_per_returned_is_expected"] = bool(rs[0].get("frames_decoded_per_returned_is_expected"))
            if rs[0].get("worker_stage_s"):
                row["stage_s_per_sample"] = {
                    k: med([r["worker_stage_s"][k] / max(r["samples"], 1) for r in rs]) for k in STAGES
                }
            limit = (d.decode_limit or {}).get("samples_per_s")
            row["decode_limit_fraction"] = row["samples_per_s"] / limit if limit else None
            rows.append(row)
    return rows


def headline(rows: list[dict], datasets: list[Dataset]) -> list[dict]:
    """Per dataset and output dtype: epishard's fastest system at matched diversity (ratio >= MATCHED)
    against LeRobot 0.6.1 (and 0.4.4 for float32) with the same dtype, and the target that applies:
    ``TARGET`` x LeRobot 0.6.1, or ``DECODE_TARGET`` of the decode limit where that is lower."""
    out = []
    for d in datasets:
        limit = (d.decode_limit or {}).get("samples_per_s")
        for dtype in ("uint8", "float32"):
            mine = [r for r in rows if r["dataset"] == d.name and r["kind"] == "epishard" and r["dtype"] == dtype]
            matched = [r for r in mine if (r["diversity_ratio"] or 0) >= MATCHED]
            best = max(matched, key=lambda r: r["samples_per_s"], default=None)
            peer = next(
                (
                    r
                    for r in rows
                    if r["dataset"] == d.name and r["system"] == f"lerobot061{'-u8' if dtype == 'uint8' else ''}"
                ),
                None,
            )
            old = (
                next((r for r in rows if r["dataset"] == d.name and r["system"] == "lerobot"), None)
                if dtype == "float32"
                else None
            )
            h = {
                "record": "headline",
                "dataset": d.name,
                "dtype": dtype,
                "epishard": best and best["label"],
                "epishard_samples_per_s": best and best["samples_per_s"],
                "epishard_diversity_ratio": best and best["diversity_ratio"],
                "unmatched_best": None
                if best or not mine
                else max(mine, key=lambda r: r["diversity_ratio"] or 0)["label"],
                "lerobot061_samples_per_s": peer and peer["samples_per_s"],
                "lerobot061_diversity_ratio": peer and peer["diversity_ratio"],
                "lerobot044_samples_per_s": old and old["samples_per_s"],
                "decode_limit": limit,
            }
            h["vs_lerobot061"] = best and peer and best["samples_per_s"] / peer["samples_per_s"]
            h["vs_lerobot044"] = best and old and best["samples_per_s"] / old["samples_per_s"]
            h["decode_limit_fraction"] = best and limit and best["samples_per_s"] / limit
            gop_limit = (d.decode_limit or {}).get("samples_per_s_gop")
            if peer and gop_limit and _codecs(d) == {"av1"}:
                bar = min(AV1_TARGET * peer["samples_per_s"], DECODE_TARGET * gop_limit)
                which = (
                    f"{AV1_TARGET:.0f}x LeRobot 0.6.1"
                    if bar < DECODE_TARGET * gop_limit
                    else f"{DECODE_TARGET} of the GOP-aware limit"
                )
                h["target"] = f">= {bar:.1f} ({which}, the lower; AV1)"
                h["met"] = bool(best and best["samples_per_s"] >= bar)
            elif peer and limit and TARGET * peer["samples_per_s"] > limit:
                triple = TARGET * peer["samples_per_s"]
                h["target"] = (
                    f">= {DECODE_TARGET} of the decode limit ({TARGET:.0f}x LeRobot 0.6.1 = {triple:.0f} exceeds it)"
                )
                h["met"] = bool(h["decode_limit_fraction"] and h["decode_limit_fraction"] >= DECODE_TARGET)
            elif peer:
                h["target"] = f">= {TARGET:.0f}x LeRobot 0.6.1 {dtype}"
                h["met"] = bool(h["vs_lerobot061"] and h["vs_lerobot061"] >= TARGET)
            else:
                h["target"], h["met"] = "LeRobot 0.6.1 not measured", None
            out.append(h)
    return out


def _codecs(d: Dataset) -> set[str]:
    """The video codecs of a LeRobot dataset's cameras (``meta/info.json``; empty when unreadable)."""
    try:
        with open(Path(d.original) / "meta" / "info.json") as f:
            features = json.load(f).get("features", {})
    except (OSError, ValueError):
        return set()
    return {str((v.get("info") or {}).get("video.codec")) for v in features.values() if v.get("dtype") == "video"}


def fmt(v, spec: str, none: str = "-") -> str:
    """``v`` formatted with ``spec`` (``format``), or ``none`` for a missing figure."""
    return none if v is None else format(v, spec)


def _pair(r: dict, key: str, spec: str) -> str:
    return f"{fmt(r[key], spec)}/{fmt(r[key + '_iid'], spec)}"


def _diversity(r: dict) -> str:
    return f"{_pair(r, 'distinct_episodes_per_batch', '.2f')} ({fmt(r['diversity_ratio'], '.2f')})"


def _decoded(r: dict) -> str:
    dec = fmt(r["frames_decoded_per_returned"], ".2f")
    return "~" + dec if r["frames_decoded_per_returned_is_expected"] else dec


def _row(cells: list) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


HEAD = [
    "dataset",
    "dtype",
    "epishard (fastest matched)",
    "samples/s",
    "diversity ratio",
    "LeRobot 0.6.1",
    "its ratio",
    "x LeRobot 0.6.1",
    "LeRobot 0.4.4",
    "x 0.4.4",
    "decode limit",
    "x limit",
    "target",
    "met",
]
COLUMNS = [
    "system",
    "dtype",
    "samples/s",
    "after warm-up",
    "warm-up s",
    "x decode limit",
    "distinct eps/batch: measured/iid (ratio)",
    "P(pair shares episode): measured/iid",
    "decoded/returned",
    "first batch s",
    "RSS MB (all)",
    "worker RSS MB",
    "PSS MB",
    "kB read/sample",
    "kB GOPs/sample",
    "timed s",
]


LIMIT_COLUMNS = [
    "dataset",
    "cores",
    "camera",
    "distinct frames/sample",
    "ffmpeg frames per CPU s",
    "limit samples/s",
    "GOP frames/sample",
    "GOP-aware limit samples/s",
    "cost-weighted GOP frames/sample",
    "cost-weighted limit samples/s",
]
LIMIT_LEGEND = """\
limit: ffmpeg -threads 1 decode-to-RGB frames per CPU second x cores / distinct frames a sample needs (the headline's
"decode limit"). GOP-aware limit: the same rate x cores / the frames a sample must decode counting the GOP lead-in (per
window frame, from the keyframe at or before it; on from the previous window frame when no keyframe lies between; the
video's keyframe table, every anchor), every frame costing the file's mean. Cost-weighted: those frames each weighted by
its measured decode cost per packet kind (keyframe / other, PyAV one thread) plus RGB24, in units of the file's mean
frame (AV1 GOP 2: a ~19 kB keyframe packet costs ~10x the ~31-byte inter frame after it). Limits are per dataset (all
cameras together)."""


def _headline_row(h: dict) -> list:
    who = h["epishard"] or (
        f"none matched (most diverse: {h['unmatched_best']})" if h["unmatched_best"] else "not measured"
    )
    met = "-" if h["met"] is None else ("met" if h["met"] else "**not met**")
    return [
        h["dataset"],
        h["dtype"],
        who,
        fmt(h["epishard_samples_per_s"], ".1f"),
        fmt(h["epishard_diversity_ratio"], ".2f"),
        fmt(h["lerobot061_samples_per_s"], ".1f"),
        fmt(h["lerobot061_diversity_ratio"], ".2f"),
        fmt(h["vs_lerobot061"], ".2f"),
        fmt(h["lerobot044_samples_per_s"], ".1f"),
        fmt(h["vs_lerobot044"], ".2f"),
        fmt(h["decode_limit"], ".0f"),
        fmt(h["decode_limit_fraction"], ".3f"),
        h["target"],
        met,
    ]


def _run_row(r: dict) -> list:
    kb = r["bytes_read_per_sample"] and r["bytes_read_per_sample"] / 1e3
    return [
        r["label"],
        r["dtype"],
        f"{r['samples_per_s']:.1f}",
        fmt(r["samples_per_s_after_warmup"], ".1f"),
        fmt(r["warmup_s"], ".1f"),
        fmt(r["decode_limit_fraction"], ".3f"),
        _diversity(r),
        _pair(r, "same_episode_pair_probability", ".3f"),
        _decoded(r),
        fmt(r["time_to_first_batch_s"], ".2f"),
        fmt(r["rss_peak_mb"], ".0f"),
        fmt(r["worker_rss_peak_mb"], ".0f"),
        fmt(r["pss_peak_mb"], ".0f"),
        fmt(kb, ".0f"),
        fmt(r.get("bytes_needed_per_sample") and r["bytes_needed_per_sample"] / 1e3, ".0f"),
        fmt(r["seconds"], ".1f"),
    ]


def markdown(rows: list[dict], heads: list[dict], datasets: list[Dataset], meta: dict) -> str:
    """The honest table as markdown: run header, headline, decode limits, every row, legend."""
    m, w = meta["machine"], meta["window"]
    ignored = meta["epishard_options_ignored"]
    out = [
        f"# Peer benchmark: {meta['started']}",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {m['cpus']} CPUs ({m['cpu']}), {m['memory_gib']} GiB, torch {m['torch']}, torchcodec "
        f"{m['torchcodec']}; load average (1 min) during runs {meta['load_min']:.1f}..{meta['load_max']:.1f}; "
        f"total {meta['seconds']:.0f} s.  ",
        f"Window: {w['frames']} frames over {w['span']} rows per camera, action chunk {w['action_horizon']}, batch "
        f"{meta['batch_size']}, {meta['workers']} workers, {meta['warmup']} warm-up batches, timed >= "
        f"{meta['seconds_timed']} s per run, {meta['rounds']} round(s).  ",
        f"epishard options: `{meta['epishard_options_given'] or 'none'}`"
        + (f" (not supported by this epishard, ignored: `{', '.join(ignored)}`)" if ignored else ""),
        "",
        "## Headline: matched diversity (epishard >= 0.9 of i.i.d. distinct episodes per batch), same output dtype",
        "",
        _row(HEAD),
        _row(["---"] * len(HEAD)),
        *(_row(_headline_row(h)) for h in heads),
        "",
        "## Decode limit per dataset",
        "",
        _row(LIMIT_COLUMNS),
        _row(["---"] * len(LIMIT_COLUMNS)),
    ]
    for d in datasets:
        for cam, c in (d.decode_limit or {}).get("cameras", {}).items():
            limit = d.decode_limit["samples_per_s"]
            rate = c["ffmpeg_frames_per_cpu_s"]
            out.append(
                _row(
                    [
                        d.name,
                        d.decode_limit["cores"],
                        cam,
                        f"{c['distinct_frames_per_sample']:.2f}",
                        f"{rate:.0f}",
                        f"{limit:.1f}",
                        # GOP-aware columns: absent (-) in records written before they were measured
                        fmt(c.get("gop_frames_per_sample"), ".2f"),
                        fmt(d.decode_limit.get("samples_per_s_gop"), ".1f"),
                        fmt(c.get("gop_weighted_frames_per_sample"), ".2f"),
                        fmt(d.decode_limit.get("samples_per_s_gop_weighted"), ".1f"),
                    ]
                )
            )
    out += ["", LIMIT_LEGEND]
    out += ["", "## Every run (medians over rounds)", ""]
    for d in datasets:
        drows = [r for r in rows if r["dataset"] == d.name]
        if drows:
            tiled = f", tiled x{d.tiles} = {d.tiles * d.episodes} episodes" if d.tiles > 1 else ""
            out += [f"### {d.name} ({d.version}{tiled})", "", _row(COLUMNS), _row(["---"] * len(COLUMNS))]
            out += [_row(_run_row(r)) for r in drows] + [""]
    out += ["## Legend", "", LEGEND]
    return "\n".join(out) + "\n"


def print_tables(rows: list[dict], heads: list[dict], datasets: list[Dataset]) -> None:
    """Print ``summarize``'s rows as a plain-text table per dataset, then ``headline``'s heads."""
    widths = (22, 8, 10, 10, 7, 25, 8, 8, 8, 8)
    names = ("system", "dtype", "samples/s", "after wu", "xlimit", "eps/batch/iid (ratio)", "dec/ret", "RSS MB")
    names += ("wkr MB", "timed s")
    for d in datasets:
        drows = [r for r in rows if r["dataset"] == d.name]
        if not drows:
            continue
        limit = d.decode_limit and d.decode_limit["samples_per_s"]
        tiled = f", tiled x{d.tiles}" if d.tiles > 1 else ""
        print(f"\n{d.name} ({d.version}{tiled}); decode limit {fmt(limit, '.1f')} samples/s")
        print(
            "".join(f"{n:<{w}}" if i == 0 else f"{n:>{w}}" for i, (n, w) in enumerate(zip(names, widths, strict=True)))
        )
        for r in drows:
            cells = _run_row(r)
            cells = [cells[i] or "-" for i in (0, 1, 2, 3, 5, 6, 8, 10, 11, 14)]
            print(
                "".join(
                    f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(cells, widths, strict=True))
                )
            )
    print("\nheadline (matched diversity >= 0.9 of i.i.d., same dtype):")
    for h in heads:
        c = _headline_row(h)
        print(
            f"  {c[0]} {c[1]}: {c[2]} {c[3]} samples/s; x LeRobot 0.6.1 {c[7]}; "
            f"x decode limit {c[11]}; {c[12]}: {c[13]}"
        )


LEGEND = """\
samples/s: sustained rate, median over rounds: all samples (warm-up batches included) / the time from the first
request to the last timed batch (timed region >= 10 s after the warm-up; an epoch that ends inside it is crossed,
its start counted). Counting the warm-up charges work a reader banks before its first batch (a shuffle buffer of
decoded windows) to the samples; "after warm-up" is the rate over the timed region alone, shown beside it.
x decode limit: samples/s over the dataset's decode limit (ffmpeg -threads 1 decode-to-RGB frames per CPU
second x cores / distinct frames a sample needs). Diversity: distinct episodes per batch measured over the
timed batches / the exact expectation under i.i.d. uniform sampling
of the windows the system's policy draws from (epishard: its plan's windows per episode; LeRobot and naive: every
frame of every episode; webdataset: one window per episode met), and their ratio; P(pair shares episode): the
probability that two samples of a batch come from one episode, measured / i.i.d. decoded/returned: frames
decoded per frame returned (epishard: telemetry; webdataset, naive: counted alike; ~: LeRobot, expected from the
keyframe tables over uniform anchors). RSS (all): peak summed RSS of the main process and its workers; worker
RSS: the largest single worker's peak; PSS: peak summed PSS. kB read/sample: bytes the reader fetched per sample
(epishard's telemetry); kB GOPs/sample: the encoded bytes of the groups of pictures its decodes needed (cameras
read by packet tables; the floor for what is read). Systems: `all` = every anchor every epoch (LeRobot's
population), `pe4` = 4 windows per episode per epoch (little reuse of decoded frames), `whole`: epishard with
video members fetched whole and decoded by torchcodec (`FetchPolicy(packets=False)`)."""
