"""The parent's side: datasets found and converted, the LeRobot peer, one run per (dataset, system, round)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .config import (
    ENTRY,
    FRAMES,
    HARNESS,
    HORIZON,
    LANCE,
    LANCE_HARNESS,
    LANCE_SETUP,
    LEROBOT,
    RAY_HARNESS,
    REPO,
    SPAN,
    STEP,
    LancePeer,
    Peer,
    System,
    log,
)
from .pipelines import clamped
from .zygote import Zygote


@dataclass
class Dataset:
    """One dataset of the comparison: the LeRobot folder measured, where it came from, its epishard copy."""

    name: str
    main: str  # the LeRobot folder measured (the tiled copy when tiled)
    version: str
    original: str  # the LeRobot folder it came from
    episodes: int = 0  # episodes of the original (a tiled copy repeats them)
    tiles: int = 1
    shards: str | None = None  # the converted epishard folder
    decode_limit: dict | None = None


def lerobot_version(folder: Path) -> str:
    """The LeRobot dataset's ``codebase_version`` (``meta/info.json``; "?" when absent), e.g. "v3.0".

    Raises OSError / ValueError: no readable ``meta/info.json``.
    """
    with open(folder / "meta" / "info.json") as f:
        return json.load(f).get("codebase_version", "?")


def has_videos(folder: Path) -> bool:
    """Whether the LeRobot dataset stores any camera as mp4 files under ``videos/``."""
    return (folder / "videos").is_dir() and any((folder / "videos").rglob("*.mp4"))


def find_datasets(args) -> list[Dataset]:
    """The v3.0 datasets with videos in ``--data`` (or the ``--source`` folders)."""
    if args.source:
        return [
            Dataset(Path(s).name, str(Path(s).resolve()), lerobot_version(Path(s)), str(Path(s).resolve()))
            for s in args.source
        ]
    data = Path(args.data)
    if not data.is_dir():
        print(f"no shared data at {data}: nothing to measure (give --source FOLDER or set EPISHARD_SHARED_DATA)")
        return []
    out = []
    for p in sorted(data.iterdir()):
        if not (p / "meta" / "info.json").exists() or not lerobot_version(p).startswith("v3"):
            continue
        if args.datasets and p.name not in args.datasets:
            continue
        if not has_videos(p):
            print(f"skip {p.name}: a LeRobot v3.0 dataset without video files (nothing to decode)")
            continue
        out.append(Dataset(p.name, str(p), lerobot_version(p), str(p)))
    return out


def _convert_options():
    """Conversion options for the benchmark: 2 workers, no progress bar, the write-time decode check
    off (tiles repeat the original's frames; the reader checks every frame's pts anyway), feature-
    detected because the check's option may change."""
    from dataclasses import fields

    from epishard.shardwriter import ConvertOptions

    names = {f.name for f in fields(ConvertOptions)}
    kw = {"progress": False, "workers": 2, "overwrite": True}
    if "decode_check" in names:
        kw["decode_check"] = False
    elif "check" in names:
        kw["check"] = "off"
    from epishard.shardwriter.sources import SourceOptions

    if "allow_external" in {f.name for f in fields(SourceOptions)}:  # a tile links to the original's videos
        kw["sources"] = SourceOptions(allow_external=True)
    return ConvertOptions(**kw)


def prepare(datasets: list[Dataset], work: Path, min_episodes: int) -> None:
    """Tile each v3.0 dataset to ``min_episodes`` (kept in ``work`` across runs), convert it with
    epishard (resumed: a finished conversion of the same plan is reused) and measure its decode limit."""
    from epishard.shardwriter import convert

    from .decodelimit import decode_limit
    from .tile import tile, tiles_for

    work.mkdir(parents=True, exist_ok=True)
    for d in datasets:
        d.episodes = _episode_count(d.original) if d.version.startswith("v3") else 0
        if d.version.startswith("v3") and min_episodes > d.episodes:
            d.tiles = tiles_for(d.episodes, min_episodes)
            t = time.perf_counter()
            d.main = str(tile(d.original, work / f"{d.name}_x{d.tiles}", min_episodes))
            log(f"{d.name}: tiled x{d.tiles} = {d.tiles * d.episodes} episodes ({time.perf_counter() - t:.1f} s)")
        out = work / f"{Path(d.main).name}.epishard"
        t = time.perf_counter()
        convert([d.main], str(out), _convert_options())
        d.shards = str(out)
        log(f"{d.name}: converted (or reused) {out} in {time.perf_counter() - t:.1f} s")
        if d.version.startswith("v3"):
            d.decode_limit = decode_limit(d.original)
            log(f"{d.name}: decode limit {d.decode_limit['samples_per_s']:.1f} samples/s")


def _episode_count(folder: str) -> int:
    """Episodes of a v3.0 folder: rows of its ``meta/episodes`` tables (``info.json`` may disagree)."""
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(p).num_rows for p in sorted((Path(folder) / "meta" / "episodes").rglob("*.parquet")))


def peer_status(args, peer: Peer) -> str | None:
    """None when this LeRobot peer can run, else the reason and how to set it up."""
    if not Path(peer.venv, "bin", "python").exists() or not Path(peer.env).exists():
        script = Path(args.peers_dir) / peer.setup
        return (
            f"LeRobot {peer.version} peer venv {peer.venv} not found: build it with `bash {script}` "
            f"or run this command with --setup-peers"
        )
    return None


def ray_status(args) -> str | None:
    """None when the Ray Data peer can run (Ray 2.60 in this venv, the LeRobot 0.6.1 peer venv for
    the ``lerobot`` that ``read_lerobot`` imports), else the reason."""
    import importlib.metadata as md

    from .raydata import RAY_VERSION

    try:
        version = md.version("ray")
    except md.PackageNotFoundError:
        return f"Ray is not installed in this venv ({sys.prefix}): pip install -r requirements/machine.txt"
    if version != RAY_VERSION:
        return f"this venv has ray {version}; the Ray Data peer is pinned to {RAY_VERSION}"
    return peer_status(args, LEROBOT["0.6.1"])


def setup_peers(args) -> None:
    """Build every LeRobot peer's venv with its setup script from ``--peers-dir`` (../shared/peers).

    Raises ``subprocess.CalledProcessError``: a setup script failed.
    """
    for peer in LEROBOT.values():
        script = Path(args.peers_dir) / peer.setup
        print(f"building the LeRobot {peer.version} peer venv: bash {script} {peer.venv}", flush=True)
        subprocess.run(["bash", str(script), peer.venv], check=True)


def run_env(args) -> dict:
    """The environment of every run (LeRobot's too): this one plus ``--env`` settings."""
    env = dict(os.environ)
    env.update(kv.split("=", 1) for kv in args.env)
    return env


def _harness_json(args, cmd: str, what: str) -> dict:
    """The last JSON line a peer harness printed (``cmd``: a bash command line, its env file sourced).

    Raises ``RuntimeError`` naming ``what`` (the harness failed or printed none) or
    ``subprocess.TimeoutExpired`` (``--timeout`` seconds).
    """
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=args.timeout, env=run_env(args))
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode or not lines:
        raise RuntimeError(f"{what} harness failed (exit {p.returncode}): {p.stderr[-2000:]}")
    return json.loads(lines[-1])


def _every_frame_diversity(args, d: Dataset, ids: list[list[int]]) -> dict:
    """Diversity figures of a peer's timed batches (``ids``: each batch's episode ids) against i.i.d.
    sampling of every frame of ``d`` (LeRobot's and Lance's samplers draw every frame as an anchor)."""
    import numpy as np

    from epishard.shardwriter import WindowIndex
    from epishard.stream import diversity

    rows = WindowIndex.load_dataset(d.shards).num_rows
    reference = diversity.iid(np.asarray(rows, dtype=np.float64), args.batch_size)
    return diversity.summary(diversity.measured(ids), reference)


def run_lerobot(args, d: Dataset, system: System, seed: int) -> dict:
    """One LeRobot run through ``lerobot_harness.py`` in the release's venv."""

    peer = LEROBOT[system.lerobot]
    cmd = (
        f". {peer.env} && exec {peer.venv}/bin/python {HARNESS} {d.main} --workers {args.workers} "
        f"--batch-size {args.batch_size} --warmup {args.warmup} --seconds {args.seconds} "
        f"--min-batches {args.min_batches} --window {FRAMES} --stride {STEP} --action-horizon {HORIZON} "
        f"--seed {seed}" + (" --uint8" if system.dtype == "uint8" else "")
    )
    r = _harness_json(args, cmd, f"LeRobot {peer.version}")
    spread = _every_frame_diversity(args, d, r.pop("episode_ids"))
    return {
        "system": system.id,
        "label": system.label,
        "kind": "lerobot",
        "policy": "all",
        "root": d.main,
        "frames_decoded_per_returned": expected_decoded_per_returned(d.shards, d.episodes or None),
        "frames_decoded_per_returned_is_expected": True,
        "time_to_first_batch_s": None,
        "worker_stage_s": None,
        "bytes_read_per_sample": None,
        **r,
        **spread,
    }


@dataclass
class S3:
    """``--s3-latency-ms``: the server (``s3server.Server``), the latency proxy's endpoint, what is uploaded."""

    server: object
    endpoint: str  # the latency proxy: every reader's requests go through it
    latency_ms: int
    urls: dict[str, str] = field(default_factory=dict)  # local folder -> its s3:// copy

    def url(self, local: str | Path) -> str:
        """The ``s3://`` copy of the local folder ``local``, uploaded on first use (straight to moto)."""
        from s3server import upload

        local = str(local)
        if local not in self.urls:
            url = f"s3://bench/{Path(local).name}"
            t = time.perf_counter()
            size = upload(self.server.endpoint, local, url)
            log(f"uploaded {local} to {url}: {size / 1e6:.0f} MB in {time.perf_counter() - t:.0f} s")
            self.urls[local] = url
        return self.urls[local]

    def lance_options(self) -> dict:
        """``storage_options`` for lancedb / Lance's object store (its key names) through the proxy."""
        return {
            "aws_endpoint": self.endpoint,
            "aws_access_key_id": "bench",
            "aws_secret_access_key": "bench",
            "aws_region": "us-east-1",
            "allow_http": "true",
        }


def s3_server(latency_ms: int):
    """moto S3 and a proxy adding ``latency_ms`` per request, in a process of their own (``s3server.Server``)."""
    from s3server import Server

    return Server([latency_ms])


def start_s3(args, datasets: list[Dataset], server) -> S3:
    """``server`` (``s3_server``) with each dataset's epishard conversion uploaded (Lance copies on first use)."""
    s3 = S3(server, f"http://127.0.0.1:{server.proxies[args.s3_latency_ms]}", args.s3_latency_ms)
    for d in datasets:
        s3.url(d.shards)
    return s3


def lance_status(args, peer: LancePeer) -> str | None:
    """None when this Lance peer can run, else the reason and how to set it up."""
    if not Path(peer.venv, "bin", "python").exists() or not Path(peer.env).exists():
        script = Path(args.peers_dir) / LANCE_SETUP
        return (
            f"Lance {peer.version} peer venv {peer.venv} not found: build the LeRobot 0.6.1 peer, then `bash {script}`"
        )
    return None


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def lance_copy(args, d: Dataset, peer: LancePeer) -> tuple[Path, dict]:
    """``d``'s LeRobot folder converted by the Lance release's own converter (once; reused after), and
    ``{"convert_s", "bytes"}``: the conversion's wall seconds and the copy's size on disk.

    0.3.1: ``lerobot-lance-convert --root SRC --out OUT`` (mp4 blobs); 0.2.2:
    ``lerobot-convert-to-lance --repo-id local/NAME --src-root SRC --output OUT --table-name NAME``
    (one JPEG per frame; slow). Raises ``RuntimeError``: the converter failed.
    """
    name = Path(d.main).name
    out = Path(args.work) / f"{name}.{peer.suffix}"
    done = out.parent / f"{out.name}.done.json"
    if done.exists():
        return out, json.loads(done.read_text())
    if peer.layout == "lancedb":
        convert = f"lerobot-lance-convert --root {d.main} --out {out}"
    else:
        convert = (
            f"lerobot-convert-to-lance --repo-id local/{name} --src-root {d.main} --output {out} --table-name {name}"
        )
    log(f"{d.name}: converting to Lance {peer.version} ({peer.layout}): {convert}")
    t = time.perf_counter()
    p = subprocess.run(
        ["bash", "-c", f". {peer.env} && rm -rf {out} && {convert}"],
        capture_output=True,
        text=True,
        timeout=args.timeout * 20,
        env=run_env(args),
    )
    if p.returncode:
        raise RuntimeError(f"Lance {peer.version} conversion of {d.main} failed: {p.stderr[-2000:]}")
    facts = {"convert_s": round(time.perf_counter() - t, 1), "bytes": _folder_bytes(out)}
    done.write_text(json.dumps(facts))
    return out, facts


def run_lance(args, d: Dataset, system: System, seed: int) -> dict:
    """One lerobot-lancedb run through ``lance_harness.py`` in its release's venv, on its own
    conversion of ``d``; its items are compared with LeRobot 0.6.1's once per copy (``--check``)."""

    peer = LANCE[system.lance]
    root, facts = lance_copy(args, d, peer)
    read_from = str(root)
    if args.s3 is not None:  # the same copy from the S3 server; meta/ (0.2.x) stays the local folder's
        url = args.s3.url(root)
        if peer.layout != "lancedb":  # 0.2.x opens the table's own URI (NAME.lance inside the folder)
            url += f"/{Path(d.main).name}.lance"
        read_from = f"{url} --storage-options '{json.dumps(args.s3.lance_options())}'"
    base = (
        f". {peer.env} && exec {peer.venv}/bin/python {LANCE_HARNESS} {read_from} --layout {peer.layout} "
        f"--meta-root {d.main} --workers {args.workers} --batch-size {args.batch_size} --warmup {args.warmup} "
        f"--seconds {args.seconds} --min-batches {args.min_batches} --window {FRAMES} --stride {STEP} "
        f"--action-horizon {HORIZON} --seed {seed}" + (" --uint8" if system.dtype == "uint8" else "")
    )
    checked = root.parent / f"{root.name}.check-{system.dtype}.json"
    # items against LeRobot 0.6.1 on the source folder (frames bit for bit for mp4 blobs); local copies only
    if not checked.exists() and args.s3 is None:
        try:
            found = _harness_json(args, f"{base} --check 6 --source {d.main}", f"Lance {peer.version} check")
        except RuntimeError as exc:
            found = {"error": str(exc)}
        checked.write_text(json.dumps(found))
    check = json.loads(checked.read_text()) if checked.exists() else {}
    r = _harness_json(args, base, f"Lance {peer.version}")
    spread = _every_frame_diversity(args, d, r.pop("episode_ids"))
    return {
        "system": system.id,
        "label": system.label,
        "kind": "lance",
        "policy": "all",
        "root": args.s3.url(root) if args.s3 is not None else str(root),
        "frames_decoded_per_returned": None,
        "time_to_first_batch_s": r.get("time_to_first_batch_s"),
        "worker_stage_s": None,
        "bytes_read_per_sample": None,
        "lance_convert_s": facts["convert_s"],
        "lance_bytes": facts["bytes"],
        "lance_items_equal_to_lerobot": check.get("frames_bit_exact"),
        "lance_check": {k: v for k, v in check.items() if k != "indices"},
        **{k: v for k, v in r.items() if k not in ("time_to_first_batch_s",)},
        **spread,
    }


RAY_SHUTDOWN_RACE = "The core worker has already been shutdown"


def _kill_group(pgid: int) -> None:
    """SIGKILL the process group ``pgid`` (a harness started with ``start_new_session``), if any is left."""
    import contextlib
    import signal

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def run_raydata(args, d: Dataset, system: System, seed: int) -> dict:
    """One Ray Data run through ``raydata.py`` (the LeRobot 0.6.1 peer's python, Ray 2.60 from this
    venv linked into an overlay on ``PYTHONPATH``: ``raydata.overlay``).

    Raises ``RuntimeError``: the harness failed (``read_lerobot`` could not read the dataset, or gave
    windows of another shape: its error text is in the message).
    """

    from .raydata import overlay

    peer = LEROBOT[system.lerobot]
    sites = sorted(Path(peer.venv).glob("lib/python3*/site-packages"))
    if not sites:
        raise RuntimeError(f"Ray Data peer: no site-packages under {peer.venv}")
    folder = overlay(Path(args.work) / "ray-overlay", sites[0])
    cmd = (
        f". {peer.env} && PYTHONPATH={folder} exec {peer.venv}/bin/python {RAY_HARNESS} {d.main} "
        f"--workers {args.workers} --batch-size {args.batch_size} --warmup {args.warmup} "
        f"--seconds {args.seconds} --min-batches {args.min_batches} --window {FRAMES} --stride {STEP} "
        f"--action-horizon {HORIZON} --seed {seed}" + (" --uint8" if system.dtype == "uint8" else "")
    )
    # its own process group: whatever Ray leaves behind (its agents outlive a raylet that died in a
    # shutdown race) is killed with it
    proc = subprocess.Popen(
        ["bash", "-c", cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=run_env(args),
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        proc.communicate()
        raise
    finally:
        _kill_group(proc.pid)
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    # Ray 2.60 may end a finished driver with exit 1 after its record is out ("The core worker has
    # already been shutdown ... The process will exit": a Ray Data thread racing ray.shutdown())
    raced = RAY_SHUTDOWN_RACE in stderr
    if not lines or (proc.returncode and not raced):
        raise RuntimeError(f"Ray Data harness failed (exit {proc.returncode}): {stderr[-2000:]}")
    r = json.loads(lines[-1])
    r["harness_exit"] = proc.returncode
    spread = _every_frame_diversity(args, d, r.pop("episode_ids"))  # every frame is an anchor
    return {
        "system": system.id,
        "label": system.label,
        "kind": "raydata",
        "policy": "all",
        "root": d.main,
        "frames_decoded_per_returned": None,  # inside lerobot's decode called by Ray's read tasks: not counted
        "frames_decoded_per_returned_is_expected": False,
        "worker_stage_s": None,
        "bytes_read_per_sample": None,
        **r,
        **spread,
    }


def run_system(args, d: Dataset, system: System, seed: int, zygote: Zygote | None) -> dict:
    """One timed run of ``system`` on ``d``: LeRobot and Ray Data through their harnesses, the others in a child process
    forked from ``zygote`` or started fresh (``measure.run_child``). Returns the run's record with the
    dataset, seed, 1-minute load average and the run's wall seconds (``wall_s``) added.

    Raises ``RuntimeError`` (a fresh child failed) or ``subprocess.TimeoutExpired`` (``--timeout`` seconds).
    """
    t = time.perf_counter()
    s3 = args.s3
    cfg = {
        "system": system.id,
        "root": d.shards if s3 is None else s3.url(d.shards),
        "storage_options": None if s3 is None else {"endpoint_url": s3.endpoint},
        "batch_size": args.batch_size,
        "workers": args.workers,
        "seconds": args.seconds,
        "min_batches": args.min_batches,
        "warmup": args.warmup,
        "seed": seed,
        "options": args.epishard_options if system.kind == "epishard" else None,
    }
    served = s3.server.stats() if s3 is not None else None
    if system.kind == "lerobot":
        rec = run_lerobot(args, d, system, seed)
    elif system.kind == "raydata":
        rec = run_raydata(args, d, system, seed)
    elif system.kind == "lance":
        rec = run_lance(args, d, system, seed)
    elif zygote is not None:
        rec = zygote.run(cfg, args.timeout)
    else:
        p = subprocess.run(
            [sys.executable, str(ENTRY), "--child", json.dumps(cfg)],
            capture_output=True,
            text=True,
            timeout=args.timeout,
            cwd=str(REPO),
            env=run_env(args),
        )
        lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
        if p.returncode or not lines:
            raise RuntimeError(f"{system.id} on {d.name} failed (exit {p.returncode}): {p.stderr[-3000:]}")
        rec = json.loads(lines[-1])
    if served is not None:  # what the server sent and spent during the run (warm-up and start included)
        after = s3.server.stats()
        drawn = rec["samples"] + args.warmup * args.batch_size
        sent = after["bytes_out"][s3.latency_ms] - served["bytes_out"][s3.latency_ms]
        rec.update(
            storage=f"s3 +{s3.latency_ms} ms",
            s3_bytes_sent_per_sample=sent / max(drawn, 1),
            s3_server_cpu_s_per_sample=(after["cpu_s"] - served["cpu_s"]) / max(drawn, 1),
        )
    rec.update(
        dataset=d.name,
        source_format=d.version,
        episodes=d.episodes * d.tiles if d.episodes else None,
        tiles=d.tiles,
        seed=seed,
        loadavg_1m=os.getloadavg()[0],
        wall_s=time.perf_counter() - t,
    )
    return rec


def expected_decoded_per_returned(shards: str, episodes: int | None = None) -> float:
    """LeRobot decodes, per sample and camera, from the keyframe before each requested frame run
    (torchcodec batch API): the same count ``WindowIndex.decoded_frames`` gives, averaged over
    every anchor (LeRobot samples anchors uniformly). ``episodes``: only the first ones (a tiled
    dataset repeats them)."""
    import numpy as np

    from epishard.shardwriter import WindowIndex

    ix = WindowIndex.load_dataset(shards)
    decoded = returned = 0
    for e in range(min(episodes or ix.num_episodes, ix.num_episodes)):
        n = int(ix.num_rows[e])
        for c in range(len(ix.camera_names(e))):
            s = ix.stream(e, c)
            for a in range(n):
                rows, _ = clamped(a + np.arange(0, SPAN, STEP), n)
                decoded += int(ix.decoded_frames(s, np.unique(ix.frames(s, rows))))
                returned += FRAMES
    return decoded / max(returned, 1)
