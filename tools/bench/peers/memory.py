"""Peak RSS and PSS of a process tree, sampled as the LeRobot harness samples them."""

from __future__ import annotations

import os
import threading


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except OSError:
        return 0


def _field(pid: int, name: str, key: str) -> int:
    """The ``key`` line's value (kB) of ``/proc/<pid>/<name>``; 0 when unreadable or absent."""
    try:
        with open(f"/proc/{pid}/{name}") as f:
            return next((int(line.split()[1]) for line in f if line.startswith(key)), 0)
    except OSError:
        return 0


def _hwm(pid: int) -> int:
    """The process's own peak RSS so far (``VmHWM``, kB): what sampling can miss."""
    return _field(pid, "status", "VmHWM:")


def _pss(pid: int) -> int:
    return _field(pid, "smaps_rollup", "Pss:")


class MemSampler(threading.Thread):
    """Peak over time of the summed RSS and PSS (kB) of this process and all its descendants, and
    the peak RSS of the largest single descendant (its ``VmHWM`` too, so a peak between samples counts).

    The LeRobot harness's schedule: RSS (``statm``) every 50 ms, PSS (``smaps_rollup``, which walks
    the page tables and holds the memory map lock the workers' page faults need) every 10th sample.

    ``pss_extra``: processes whose PSS is added (the zygote this process was forked from: the pages
    they share are split between them, so the sum is what a freshly started process would hold).
    """

    def __init__(self, interval: float = 0.05, pss_every: int = 10, pss_extra: tuple[int, ...] = ()):
        super().__init__(daemon=True)
        self.interval, self.pss_every, self.rss_peak, self.pss_peak = interval, pss_every, 0, 0
        self.worker_rss_peak = 0  # the largest single descendant (a DataLoader worker)
        self.pss_extra = pss_extra
        self._halt = threading.Event()

    def sample(self, with_pss: bool) -> None:
        """Read every process's RSS now (and PSS with ``with_pss``: the slow read) and update the peaks."""
        pids = _descendants(os.getpid())
        rss = [_rss(p) for p in pids]
        self.rss_peak = max(self.rss_peak, sum(rss))
        # A worker's own high-water mark: the kernel's peak, between samples too.
        self.worker_rss_peak = max(self.worker_rss_peak, *rss[1:], *(_hwm(p) for p in pids[1:]), 0)
        if with_pss:
            self.pss_peak = max(self.pss_peak, sum(_pss(p) for p in pids + list(self.pss_extra)))

    def run(self) -> None:
        """Sample every ``interval`` seconds (PSS every ``pss_every``-th) until ``stop``."""
        i = 0
        while not self._halt.is_set():
            self.sample(i % self.pss_every == 0)
            i += 1
            self._halt.wait(self.interval)

    def stop(self) -> None:
        """End the sampling thread, then take a last sample with PSS (the peaks are final after it)."""
        self._halt.set()
        self.join()
        self.sample(True)
