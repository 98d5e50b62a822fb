"""The zygote: imports once, then forks one measuring process per run."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

from .config import ENTRY, REPO
from .measure import run_child

ZYGOTE_IMPORTS = (
    "numpy",
    "torch",
    "torch.utils.data",
    "pyarrow",
    "pyarrow.parquet",
    "torchcodec.decoders",
    "webdataset",
    "epishard.shardwriter",
    "epishard.format.stats",
    "epishard.stream",
    "epishard.stream.decode",
    "epishard.stream.telemetry",
)


def zygote_main() -> None:
    """Import what the runs need (~3 s per fresh interpreter), then for each request line (a run's
    config) on stdin fork a process that measures it: ``PID <pid>``, its record, ``EXIT <code>``."""
    import importlib
    import traceback

    for name in ZYGOTE_IMPORTS:
        with contextlib.suppress(ImportError):  # a peer that is not installed is skipped later
            importlib.import_module(name)
    for line in sys.stdin:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                rec = run_child(json.loads(line), pss_extra=(os.getppid(),))
                os.write(1, (json.dumps(rec) + "\n").encode())
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        os.write(1, f"PID {pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        os.write(1, f"EXIT {os.waitstatus_to_exitcode(status)}\n".encode())


class Zygote:
    """The parent's handle on ``--zygote``: send a config, get the record (or the error)."""

    def __init__(self, env: dict):
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - the zygote's stderr, kept while it runs
        self.proc = subprocess.Popen(
            [sys.executable, str(ENTRY), "--zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            cwd=str(REPO),
        )
        self.buf = b""

    def _line(self, deadline: float) -> str:
        import select

        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.time()))
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise RuntimeError("the zygote process exited")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def run(self, cfg: dict, timeout: float) -> dict:
        self.log.seek(0, 2)
        start = self.log.tell()
        self.proc.stdin.write((json.dumps(cfg) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.time() + timeout
        pid, rec = None, None
        try:
            while True:
                line = self._line(deadline)
                if line.startswith("PID "):
                    pid = int(line.split()[1])
                elif line.startswith("{"):
                    rec = json.loads(line)
                elif line.startswith("EXIT "):
                    code = int(line.split()[1])
                    break
        except TimeoutError:
            if pid:
                os.kill(pid, 9)
            raise RuntimeError(f"{cfg['system']} timed out after {timeout} s") from None
        if code or rec is None:
            self.log.seek(start)
            tail = self.log.read()[-3000:].decode(errors="replace")
            raise RuntimeError(f"{cfg['system']} on {cfg['root']} failed (exit {code}): {tail}")
        return rec

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.log.close()
