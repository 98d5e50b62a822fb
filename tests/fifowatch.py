"""A FIFO that tells whether anything opened it for reading: the check that a refused special file was never opened.

A thread opens the FIFO's writer end with ``O_NONBLOCK`` in a loop: while no reader has it open the
open fails with ``ENXIO``; a success is recorded (and the writer closed at once, so a reader that did
open it sees the end of the file and never hangs).
"""

from __future__ import annotations

import errno
import os
import threading
import time


class FifoWatch:
    """A FIFO made at ``path`` (an existing file there is replaced) and watched until ``stop()``.

    ``stop()`` returns whether a reader ever opened it.
    """

    def __init__(self, path) -> None:
        if os.path.lexists(path):
            os.remove(path)
        os.mkfifo(path)
        self.path, self.opened, self._stop = str(path), False, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
            else:
                self.opened = True
                os.close(fd)
            time.sleep(0.002)

    def stop(self) -> bool:
        self._stop.set()
        self._thread.join()
        return self.opened
