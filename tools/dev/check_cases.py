"""Run the failing-input generators of ../shared/cases against this checkout and check every frame.

For each generator (``python ../shared/cases/<case>.py DIR``): ``epishard convert`` (``--check``
level, ``--workers``; odd_size_10bit also with ``--reencode codec=libx264,gop=4``, as its README
asks), ``epishard verify``, then every window of the converted dataset read through
``WindowDataset`` under several access patterns (frame offsets ``(0,)``, ``(0, 1, 2)``,
``(0, 7, 13)``, ``(5, 0, 3)``, edge rows padded; read order and a pool shuffle), each frame's
16-bit ID read back with the cases' own ``_common.decode_ids`` and compared with the ID its row
must show (the README of ../shared/cases gives the right behaviour):

- row ``r`` of episode ``e`` shows its global row number (``_common.simple_v21``), plus 10000 on
  odd_size_10bit's 10-bit camera;
  ``hidden_frames_cut``: ``14 + r`` (the 14 packets its edit list hides are no frames);
- ``depth_gray12``: the depth camera must come back uint16 ``[T, 1, H, W]`` equal, value for value,
  to FFmpeg's decode of the source file (gray12le). The generator's own values are not the
  reference: FFmpeg's gray16le -> gray12le conversion of its input dithers some pixels by one;
- ``inclusive_to_timestamp``: rows and video bytes equal a conversion of the dataset it copies
  (``../shared/data/gr00t_robot_sim_picknplace_v30``), and convert warns ``segment_end_mismatch``.

Prints one line per case and exits 1 if any case misbehaves. Nothing of ../shared/cases is copied.

    PYTHONPATH=$PWD python tools/dev/check_cases.py [--check fast] [--workers 1] [CASE ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import av
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = os.path.join(ROOT, "..", "shared", "cases")
ORIGINAL = os.path.join(ROOT, "..", "shared", "data", "gr00t_robot_sim_picknplace_v30")
CAMERA_OFFSET = {"observation.images.tenbit": 10000}  # odd_size_10bit's second camera (its generator)
EXTRA = {"odd_size_10bit": ["--reencode", "codec=libx264,gop=4"]}
PATTERNS = [(0,), (0, 1, 2), (0, 7, 13), (5, 0, 3)]


def epishard(*args: str) -> subprocess.CompletedProcess:
    """``python -m epishard ARGS`` with this checkout first on the path; output captured."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", "epishard", *args], capture_output=True, text=True, env=env)


def expected_id(case: str, camera: str, start: int, row: int) -> int:
    """The ID row ``row`` of an episode starting at global row ``start`` must show on ``camera``."""
    if case == "hidden_frames_cut":
        return 14 + row
    return CAMERA_OFFSET.get(camera, 0) + start + row


def source_depth(src: str, camera: str, episode: int) -> np.ndarray:
    """uint16 ``[T, H, W]``: FFmpeg's gray12le decode of the source dataset's depth video of ``episode``."""
    path = os.path.join(src, "videos", "chunk-000", camera, f"episode_{episode:06d}.mp4")
    with av.open(path) as container:
        return np.stack([f.to_ndarray(format="gray12le") for f in container.decode(video=0)])


def check_frames(case: str, src: str, out: str) -> tuple[int, int]:
    """(camera frames checked, wrong ones) over every window of ``out`` under ``PATTERNS``."""
    from _common import decode_ids

    from epishard.stream import WindowDataset, WindowSpec
    from epishard.stream.source import DatasetSource

    source = DatasetSource(out)
    lengths = np.asarray(source.index.num_rows)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    cameras = list(source.manifest.cameras)
    depth = {c: {} for c in cameras if source.manifest.cameras[c].kind == "depth"}
    checked = wrong = 0
    for offsets in PATTERNS:
        spec = WindowSpec(cameras={c: offsets for c in cameras}, action_horizon=1, boundary="pad")
        for shuffle in (0, 2):
            for sample in WindowDataset(out, spec, shuffle=shuffle, seed=1):
                e, anchor = sample["episode_index"], sample["frame_index"]
                rows = np.clip(anchor + np.asarray(offsets), 0, lengths[e] - 1)
                for cam in cameras:
                    frames = sample[cam]
                    if cam in depth:
                        if e not in depth[cam]:
                            depth[cam][e] = source_depth(src, cam, e)
                        want = depth[cam][e][rows]
                        ok = frames.dtype.itemsize == 2 and np.array_equal(frames[:, 0].numpy().astype(np.uint16), want)
                    else:
                        ok = decode_ids(frames) == [expected_id(case, cam, starts[e], r) for r in rows]
                    checked += len(rows)
                    wrong += 0 if ok else len(rows)
    return checked, wrong


def same_as_original(out: str, work: str) -> str | None:
    """None when ``out`` has the rows and video bytes of a conversion of ``ORIGINAL``, else what differs."""
    from epishard.stream.source import DatasetSource

    reference = os.path.join(work, "original")
    if not os.path.isdir(reference) and epishard("convert", ORIGINAL, reference, "-q").returncode:
        return f"cannot convert {ORIGINAL}"
    a, b = DatasetSource(reference).index, DatasetSource(out).index
    if list(a.num_rows) != list(b.num_rows):
        return f"rows {list(b.num_rows)}, original {list(a.num_rows)}"

    def videos(index) -> list:
        return [[m["sha256"] for m in ms if m["name"].endswith(".mp4")] for ms in index.episode_column("members")]

    return None if videos(a) == videos(b) else "video members differ from the original's"


def run_case(case: str, work: str, check: str, workers: int) -> tuple[bool, str]:
    """Generate, convert, verify and read back one case; (right behaviour, what was seen)."""
    src, out = os.path.join(work, case), os.path.join(work, case + ".epishard")
    subprocess.run([sys.executable, os.path.join(CASES, case + ".py"), src], check=True, capture_output=True)
    convert = epishard("convert", src, out, "--check", check, "--workers", str(workers), *EXTRA.get(case, []))
    if convert.returncode:
        return False, "convert failed: " + (convert.stderr.strip().splitlines() or ["?"])[-1]
    verify = epishard("verify", out)
    if verify.returncode:
        return False, "verify failed: " + (verify.stdout + verify.stderr).strip().splitlines()[-1]
    if case == "inclusive_to_timestamp":
        if "segment_end_mismatch" not in convert.stdout + convert.stderr:
            return False, "no segment_end_mismatch warning"
        differs = same_as_original(out, work)
        return differs is None, differs or "every row converted, frames equal the original's, warned"
    checked, wrong = check_frames(case, src, out)
    return wrong == 0, f"{checked} camera frames read under {len(PATTERNS)} offset patterns x 2 orders, {wrong} wrong"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*", help="generator names (default: every one in ../shared/cases)")
    ap.add_argument("--check", default="fast", choices=["full", "fast", "off"])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--work", help="folder for the generated and converted datasets (default: a temporary one)")
    args = ap.parse_args()
    if not os.path.isdir(CASES):
        raise SystemExit(f"check_cases: no {CASES}")
    sys.path.insert(0, CASES)  # the cases' decode_ids, read in place
    names = args.cases or sorted(f[:-3] for f in os.listdir(CASES) if f.endswith(".py") and not f.startswith("_"))
    work = args.work or tempfile.mkdtemp(prefix="epishard-cases-")
    bad = 0
    for case in names:
        ok, seen = run_case(case, work, args.check, args.workers)
        bad += not ok
        print(f"{case:<24} {'ok' if ok else 'WRONG':<6} {seen}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
