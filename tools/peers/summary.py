"""Medians, ratios per round, the printed tables and the acceptance verdict."""

from __future__ import annotations

from pathlib import Path

from .config import PEERS, STAGES, TARGET, System
from .runs import Dataset


def med(values):
    import numpy as np

    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def summarize(records: list[dict], datasets: list[Dataset], systems: list[System]) -> tuple[list[dict], list[dict]]:
    """Per (dataset, system) medians, and per (dataset, epishard system, peer) per-round ratios."""
    rows, ratios = [], []
    for d in datasets:
        by = {s.id: [r for r in records if r["dataset"] == d.name and r["system"] == s.id] for s in systems}
        for s in systems:
            rs = by[s.id]
            if not rs:
                continue
            stages = None
            if rs[0].get("worker_stage_s"):
                stages = {k: med([r["worker_stage_s"][k] / max(r["samples"], 1) for r in rs]) for k in STAGES}
            rows.append(
                {
                    "record": "summary",
                    "dataset": d.name,
                    "system": s.id,
                    "label": rs[0]["label"],
                    "source_format": rs[0]["source_format"],
                    "dtype": s.dtype,
                    "rounds": len(rs),
                    "samples_per_s": med([r["samples_per_s"] for r in rs]),
                    "samples_per_s_rounds": [r["samples_per_s"] for r in rs],
                    "frames_per_s": med([r["frames_per_s"] for r in rs]),
                    "frames_decoded_per_returned": med([r["frames_decoded_per_returned"] for r in rs]),
                    "time_to_first_batch_s": med([r["time_to_first_batch_s"] for r in rs]),
                    "warmup_s": med([r["warmup_s"] for r in rs]),
                    "rss_peak_mb": med([r["rss_peak_mb"] for r in rs]),
                    "pss_peak_mb": med([r["pss_peak_mb"] for r in rs]),
                    "bytes_read_per_sample": med([r["bytes_read_per_sample"] for r in rs]),
                    "distinct_episodes_per_batch": med([r["distinct_episodes_per_batch"] for r in rs]),
                    "stage_s_per_sample": stages,
                    "timed": rs[0]["timed"],
                    "frames_postprocessed_per_sample": med([r.get("frames_postprocessed_per_sample") for r in rs]),
                    "per_episode": rs[0].get("per_episode"),
                    "dataset_copies": rs[0].get("dataset_copies"),
                    "windows_per_epoch": rs[0].get("windows_per_epoch"),
                    "shapes": rs[0].get("shapes"),
                }
            )
        for s in systems:
            if s.kind != "epishard":
                continue
            for peer in PEERS:
                a, b = by.get(s.id, []), by.get(peer, [])
                pairs = [(x["samples_per_s"], y["samples_per_s"]) for x, y in zip(a, b, strict=False)]
                if not pairs:
                    continue
                per_round = [x / y for x, y in pairs]
                ratios.append(
                    {
                        "record": "ratio",
                        "dataset": d.name,
                        "system": s.id,
                        "label": s.label,
                        "peer": peer,
                        "ratio": med(per_round),
                        "ratio_rounds": [round(v, 2) for v in per_round],
                    }
                )
    return rows, ratios


def fmt(v, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def print_tables(rows: list[dict], ratios: list[dict], datasets: list[Dataset], lerobot_decode: dict) -> None:
    head = (
        f"{'system':<22}{'src':>5}{'samples/s':>10}{'(min..max)':>16}{'frames/s':>9}{'dec/ret':>8}{'1st batch':>10}"
        f"{'warm-up':>8}{'RSS MB':>8}{'PSS MB':>8}{'kB/sample':>10}{'eps/batch':>10}  timed"
    )
    for d in datasets:
        drows = [r for r in rows if r["dataset"] == d.name]
        if not drows:
            continue
        shapes = next((r["shapes"] for r in drows if r["shapes"]), {})
        print(
            f"\n{d.name} ({d.version}"
            + (f"; v2 = {Path(d.original).name}" if d.original else "")
            + ")  "
            + ", ".join(f"{k.split('.')[-1]} {v[:5]}" for k, v in (shapes or {}).items())
        )
        print(head)
        for r in drows:
            rounds = r["samples_per_s_rounds"]
            dec = r["frames_decoded_per_returned"]
            dec_s = (
                fmt(dec, ".2f")
                if dec is not None
                else (f"~{lerobot_decode[d.name]:.2f}" if d.name in lerobot_decode else "-")
            )
            src = r["source_format"]
            print(
                f"{r['label']:<22}{src:>5}{r['samples_per_s']:>10.1f}{f'({min(rounds):.1f}..{max(rounds):.1f})':>16}"
                f"{r['frames_per_s']:>9.0f}{dec_s:>8}{fmt(r['time_to_first_batch_s'], '.2f'):>10}{r['warmup_s']:>8.2f}"
                f"{r['rss_peak_mb']:>8.0f}{r['pss_peak_mb']:>8.0f}"
                f"{fmt(r['bytes_read_per_sample'] and r['bytes_read_per_sample'] / 1e3, '.0f'):>10}"
                f"{fmt(r['distinct_episodes_per_batch'], '.2f'):>10}  {r['timed']}"
                + (f", {r['per_episode']}/episode" if r.get("per_episode") else "")
                + (f" x{r['dataset_copies']} copies" if (r.get("dataset_copies") or 1) > 1 else "")
            )
        st = [r for r in drows if r["stage_s_per_sample"]]
        if st:
            print(
                f"  {'worker ms per sample':<20}"
                + "".join(f"{k[:-2]:>12}" for k in STAGES)
                + f"{'sum':>8}{'frames post-processed/sample':>30}"
            )
            for r in st:
                ms = [1e3 * r["stage_s_per_sample"][k] for k in STAGES]
                print(
                    f"  {r['label']:<20}"
                    + "".join(f"{v:>12.1f}" for v in ms)
                    + f"{sum(ms):>8.1f}"
                    + f"{fmt(r['frames_postprocessed_per_sample'], '.1f'):>30}"
                )
        dr = [x for x in ratios if x["dataset"] == d.name]
        if dr:
            peers = [p for p in PEERS if any(x["peer"] == p for x in dr)]
            print("  ratio epishard / peer (median of per-round ratios; per round):")
            for sid in dict.fromkeys(x["system"] for x in dr):
                cells = []
                for p in peers:
                    x = next((x for x in dr if x["system"] == sid and x["peer"] == p), None)
                    if x:
                        cells.append(f"/{p} {x['ratio']:.2f}x ({', '.join(f'{v:.2f}' for v in x['ratio_rounds'])})")
                label = next(x["label"] for x in dr if x["system"] == sid)
                print(f"    {label:<20}" + "   ".join(cells))


LEGEND = """\
columns: samples/s median of the rounds (min..max); frames/s returned frames; dec/ret frames decoded per
frame returned (epishard: telemetry over the epoch so far; webdataset/naive: counted alike; ~LeRobot:
expected over uniform anchors); 1st batch: from iter() to the first batch (epoch-timed epishard: the
timed epoch's, workers running; others: fresh loader); warm-up: the warm-up batches (LeRobot's own
figure; epoch-timed epishard: the tail of epoch 0); RSS/PSS: peak, main process + workers; kB/sample:
bytes read per sample; eps/batch: distinct episodes per batch. f32c = uint8 from the reader, float32
written by the collate; f32m = uint8 from the reader, float32 in the main process; pe4 = 4 windows per
episode per epoch; all = every anchor every epoch, in-epoch rate."""


def verdict(ratios: list[dict], datasets: list[Dataset]) -> list[str]:
    lines = []
    for d in datasets:
        if not d.version.startswith("v3"):
            continue
        x = next(
            (x for x in ratios if x["dataset"] == d.name and x["system"] == "es-f32" and x["peer"] == "lerobot"), None
        )
        if x is None:
            lines.append(f"{d.name}: no epishard-f32 / LeRobot pair measured")
            continue
        ok = x["ratio"] >= TARGET
        more = [
            (y["label"], y["ratio"])
            for y in ratios
            if y["dataset"] == d.name
            and y["peer"] == "lerobot"
            and y["system"] in ("es-f32-pe4", "es-f32-all", "es-f32c", "es-f32m", "es-u8")
        ]
        lines.append(
            f"{d.name}: epishard f32 / LeRobot = {x['ratio']:.2f}x (target >= {TARGET:.0f}x: "
            f"{'met' if ok else 'NOT met'})" + "".join(f"; {label} {v:.2f}x" for label, v in more)
        )
    return lines
