"""A 2-node Ray cluster on loopback for the Ray tests, inside a network namespace of its own.

Test-support module (not a test file). ``loopback_namespace()`` moves this process's main thread
(and so every thread and process it starts afterwards) into a new network namespace where only
``lo`` exists (Linux ``unshare(CLONE_NEWNET)``, needs root), and moves it back at the end, so Ray
can only ever use 127.0.0.1. ``cluster()`` starts a head and a second node (``--num-cpus 1``
each) there and always runs ``ray stop`` at the end.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CLONE_NEWNET = 0x40000000  # <sched.h>
REPO = Path(__file__).resolve().parents[1]
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def unavailable() -> str | None:
    """Why the Ray tests cannot run here, or None."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (pip install 'epishard[ray]'; pinned in requirements/machine.txt)"
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "the loopback Ray cluster needs a network namespace of its own (Linux, root: unshare -n)"
    if shutil.which("ip") is None:
        return "the loopback Ray cluster needs the `ip` command (iproute2) to bring lo up"
    return None


@contextlib.contextmanager
def loopback_namespace():
    """Run the block in a new network namespace with only ``lo`` (up); restore the old one after."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")
        try:
            subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
            with _own_fsspec_loop():
                yield
        finally:
            if libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the original network namespace failed")
    finally:
        os.close(home)


@contextlib.contextmanager
def _own_fsspec_loop():
    """Give the block its own fsspec IO thread, started inside the namespace: fsspec runs async
    filesystems (s3fs) on one IO thread per process, and one started earlier (by an earlier test)
    would still connect from the old namespace, where the block's servers are not.
    """
    import fsspec.asyn as asyn

    saved = asyn.loop[0], asyn.iothread[0]
    asyn.loop[0] = asyn.iothread[0] = None
    try:
        yield
    finally:
        if asyn.loop[0] is not None:
            asyn.loop[0].call_soon_threadsafe(asyn.loop[0].stop)
        asyn.loop[0], asyn.iothread[0] = saved


def _node_env() -> dict:
    """This process's environment (e.g. AWS credentials) with Ray's settings, importing this checkout."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, **RAY_ENV, "PYTHONPATH": path}


def _ray(*args: str, env: dict) -> None:
    ray_bin = str(Path(sys.executable).with_name("ray"))
    done = subprocess.run([ray_bin, *args], env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(
            f"ray {' '.join(args)} failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}"
        )


@contextlib.contextmanager
def cluster(port: int = 6379, nodes: int = 2):
    """A Ray cluster of ``nodes`` nodes on 127.0.0.1 (one CPU each), with this process connected as
    its driver; yields the address. Call inside ``loopback_namespace()``. Nodes inherit this
    process's environment (e.g. AWS credentials) and import epishard from this checkout.
    """
    import ray

    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = _node_env()
    os.environ.update(RAY_ENV)
    address = f"127.0.0.1:{port}"
    try:
        _ray("start", "--head", "--port", str(port), "--num-cpus", "1", "--include-dashboard=false",
             "--temp-dir", temp, "--disable-usage-stats", env=env)  # fmt: skip
        for _ in range(nodes - 1):
            add_node(address)
        ray.init(address=address, logging_level="ERROR", configure_logging=False)
        yield address
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        subprocess.run(
            [str(Path(sys.executable).with_name("ray")), "stop", "--force"], env=env, capture_output=True, check=False
        )
        shutil.rmtree(temp, ignore_errors=True)


def add_node(address: str) -> None:
    """Start one more node (one CPU) that joins the cluster at ``address``."""
    _ray("start", "--address", address, "--num-cpus", "1", env=_node_env())


def pids_titled(title: str) -> list[int]:
    """Processes whose command line (Ray sets it to ``ray::<task or actor method>``) starts with ``title``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f.read().startswith(title.encode()):
                        found.append(int(entry))
            except OSError:
                continue
    return found
