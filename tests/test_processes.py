"""Process hygiene on generated inputs: clean interpreter exit, conversion workers that die with
their parent, and WindowLoader resume with persistent workers."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from lerobotgen import write_v2
from videogen import decode_frame_number, make_episode_table, make_video

from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Source, convert
from epishard.stream import WindowDataset, WindowLoader, WindowSpec

REPO = Path(__file__).resolve().parents[1]
CAMERA = "observation.images.front"


def _lerobot(root: Path, num_episodes: int) -> str:
    """A LeRobot v2.1 folder of ``num_episodes`` episodes of 24 rows, one 32x32 camera."""
    write_v2(str(root), [24] * num_episodes, [CAMERA])
    return str(root)


def _cli(*args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "epishard.cli", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kw,
    )


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


# --- clean exit ------------------------------------------------------------------------------------


def test_verify_exits_cleanly_20_times(tmp_path):
    """``verify --no-decode`` prints OK and exits 0, 20 times (2 at a time): no abort at shutdown."""
    out = tmp_path / "out"
    convert([_lerobot(tmp_path / "src", 2)], str(out), ConvertOptions(progress=False))

    def run(_):
        proc = _cli("verify", str(out), "--no-decode")
        stdout, stderr = proc.communicate(timeout=120)
        return proc.returncode, stdout.decode(), stderr.decode()

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, range(20)))
    for rc, stdout, stderr in results:
        assert (rc, stdout.strip().endswith("OK")) == (0, True), f"rc={rc}\n{stdout}\n{stderr}"


# --- conversion workers die with their parent -----------------------------------------------------


def _tagged(tag: str) -> list[int]:
    """Live (not zombie) processes whose environment carries ``EPISHARD_TEST_TAG=tag``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # gone, or not ours
        if f"EPISHARD_TEST_TAG={tag}".encode() in environ.split(b"\0") and state != "Z":
            pids.append(int(entry))
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kill_9_of_a_2_worker_conversion_leaves_no_process_and_rerun_is_identical(tmp_path):
    src = _lerobot(tmp_path / "src", 6)
    args = ["convert", src, "--workers", "2", "--max-episodes-per-shard", "1", "--quiet"]
    clean = tmp_path / "clean"
    t0 = time.perf_counter()
    proc = _cli(*args, str(clean))
    assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()
    duration = time.perf_counter() - t0
    expected = _files(clean)
    rng = random.Random()
    for attempt in range(3):
        out, tag = tmp_path / f"killed{attempt}", uuid.uuid4().hex
        delay = rng.uniform(0.3, duration)
        proc = _cli(*args, str(out), env={"EPISHARD_TEST_TAG": tag})
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while _tagged(tag) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _tagged(tag) == [], f"processes left after kill -9 at {delay:.2f}s"
        written = {p.name: p.stat().st_mtime_ns for p in out.iterdir()} if out.exists() else {}
        time.sleep(0.5)
        after = {p.name: p.stat().st_mtime_ns for p in out.iterdir()} if out.exists() else {}
        assert after == written, f"files written after kill -9 at {delay:.2f}s"
        convert([src], str(out), ConvertOptions(max_episodes_per_shard=1, workers=2, progress=False))
        assert _files(out) == expected, f"rerun after kill -9 at {delay:.2f}s differs from a clean run"


# --- resume with persistent workers ----------------------------------------------------------------

LENGTHS = [26, 20, 31, 24]


@pytest.fixture(scope="module")
def windows(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("windows")
    episodes = [
        Episode(
            source="gen",
            episode_index=e,
            table=make_episode_table(n),
            fps=20,
            tasks=("fold",),
            videos={CAMERA: CameraVideo(make_video(None, n, height=32, width=32, gop=8, start_number=100 * e))},
        )
        for e, n in enumerate(LENGTHS)
    ]
    convert([Source(name="gen", episodes=episodes, fps=20)], str(out), ConvertOptions(progress=False))
    return str(out)


def _loader(root: str, persistent: bool) -> WindowLoader:
    spec = WindowSpec(cameras={CAMERA: (0,)}, action_horizon=1, boundary="pad", stride=2)
    return WindowLoader(WindowDataset(root, spec, seed=3), batch_size=2, num_workers=2, persistent_workers=persistent)


def _epoch(batches) -> list[tuple[int, int]]:
    """(episode, frame) of every sample, checked against the decoded frame number."""
    keys = []
    for b in batches:
        for e, f, frame in zip(b["episode_index"].tolist(), b["frame_index"].tolist(), b[CAMERA], strict=False):
            assert decode_frame_number(frame[0]) == 100 * e + f
            keys.append((e, f))
    return keys


@pytest.fixture(scope="module")
def reference(windows) -> list[list[tuple[int, int]]]:
    """Epochs 0, 1, 2 of an uninterrupted run without persistent workers."""
    loader = _loader(windows, persistent=False)
    return [_epoch(loader) for _ in range(3)]


def _take(loader: WindowLoader, n: int) -> tuple[list, dict]:
    """The first ``n`` batches of the loader's next epoch and its state after them; finish the epoch."""
    it = iter(loader)
    head = _epoch(next(it) for _ in range(n))
    state = loader.state_dict()
    _epoch(it)
    return head, state


def test_mid_epoch_state_loaded_after_the_epoch_ended_resumes_exactly(windows, reference):
    loader = _loader(windows, persistent=True)
    assert _epoch(loader) == reference[0]
    head, state = _take(loader, 3)  # epoch 1: 3 batches, state, rest of the epoch
    assert head == reference[1][:6]
    loader.load_state_dict(state)
    assert _epoch(loader) == reference[1][6:]
    assert _epoch(loader) == reference[2]


def test_state_loaded_before_the_first_iteration_and_twice(windows, reference):
    source = _loader(windows, persistent=True)
    _epoch(source)
    _, mid = _take(source, 3)
    loader = _loader(windows, persistent=True)
    loader.load_state_dict(mid)
    assert _epoch(loader) == reference[1][6:]
    fresh = loader.state_dict()  # at the boundary of epochs 1 and 2
    loader.load_state_dict(mid)
    loader.load_state_dict(mid)
    assert _epoch(loader) == reference[1][6:]
    loader.load_state_dict(fresh)
    assert _epoch(loader) == reference[2]


def test_state_taken_at_an_epoch_boundary_replays_that_epoch(windows, reference):
    loader = _loader(windows, persistent=True)
    _epoch(loader)
    boundary = loader.state_dict()
    assert _epoch(loader) == reference[1]
    loader.load_state_dict(boundary)
    assert _epoch(loader) == reference[1]
    assert _epoch(loader) == reference[2]


@pytest.mark.parametrize("persistent", [False, True])
def test_an_unfinished_epoch_runs_again_from_its_start(windows, reference, persistent):
    loader = _loader(windows, persistent)
    it = iter(loader)
    assert _epoch([next(it)]) == reference[0][:2]
    del it
    assert _epoch(loader) == reference[0]
    assert _epoch(loader) == reference[1]


def test_loading_during_an_iteration_is_refused(windows):
    loader = _loader(windows, persistent=True)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    with pytest.raises(RuntimeError, match="during an iteration"):
        loader.load_state_dict(state)
    del it
    loader.load_state_dict(state)
