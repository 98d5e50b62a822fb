"""``convert`` on a Ray cluster (``epishard convert --ray [ADDRESS]``): each shard is a Ray task.

The plan is the single-machine one (``convert.plan_shards``, same shards, same plan digests): only
the step that writes the shards changes. Each shard still to write becomes one task, placed by Ray on
any node, that runs ``convert.write_shard``: it reads the shard's episodes from their sources (paths
or URLs every node can read) and streams the shard to the output store (any fsspec URL, or a file
system every node shares) with the same atomic upload, one episode's members in memory at a time.
The driver then writes the dataset index and the manifest, from the shards' indexes, as ``convert``
always does, so the output is byte-identical to a single-machine conversion.

Failures: a task whose worker process or node dies is retried by Ray (``max_retries``); its shard
appears only when an attempt completes (an interrupted upload leaves nothing under the shard's
name), so nothing is lost or doubled. An error in an episode (``ConversionError``) is not retried: it
is raised on the driver as it would be locally. On Ctrl-C (or any error) the driver cancels every
task still queued or running (running ones are killed), and a rerun resumes: finished shards are kept.
If the driver itself is killed, Ray ends the job's tasks with it.

Internal: import from ``epishard.shardwriter``.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import sys
from dataclasses import dataclass

from epishard.format import manifest as fmt
from epishard.format.storage import STORAGE_ENV_NAMES, STORAGE_ENV_PREFIXES, Storage, storage_env  # noqa: F401  (re-exported)
from epishard.redact import redact

from .convert import ConvertOptions, convert, write_shard
from .episode import Source

# write_shard_with_env: Ray titles its task processes after it ("ray::write_shard_with_env")
__all__ = ["RayRunner", "convert_ray", "portable", "write_shard_with_env"]


def _import_ray():
    """The ``ray`` module. Raises ``ImportError`` saying how to install it when absent."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError("Ray is not installed: pip install 'epishard[ray]' (ray==2.60.0)") from exc
    return ray


def _connect(address: str | None) -> bool:
    """Connect this process to the Ray cluster at ``address`` unless it already is; True if this call connected.

    ``None``: ``RAY_ADDRESS`` or the cluster running on this machine, else a new local one.
    """
    ray = _import_ray()
    if ray.is_initialized():
        return False
    ray.init(address=address, logging_level=logging.WARNING, configure_logging=False)
    return True


def write_shard_with_env(env: dict[str, str], *args):
    """``convert.write_shard(*args)`` with ``env`` set in this process's environment, restored after.

    The task's storage clients are made inside the call, so they read the driver's settings (a Ray
    worker runs one task at a time). Raises what ``write_shard`` raises.
    """
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return write_shard(*args)
    except Exception as exc:
        raise portable(
            exc, f"shard {args[1]} of {redact(args[0].url)} (a Ray task on {socket.gethostname()})"
        ) from None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def portable(exc: Exception, where: str) -> Exception:
    """``exc`` with a note naming ``where`` when it survives pickling (Ray sends it so); else a plain one of its kind.

    Every exception class of epishard survives pickling with its class and fields
    (tests/test_exceptions_pickle.py); one of another library whose class cannot be rebuilt from
    its pickle (extra ``__init__`` arguments: many botocore errors) reached the driver as Ray's
    ``UnserializableException`` with a page of traceback instead of its message. The plain one is
    the first of ``FileNotFoundError``, ``PermissionError``, ``OSError``, ``KeyError``, ``ValueError``
    it is an instance of (else ``RuntimeError``), with the message ``"<where>: <type>: <message>"``.
    """
    try:
        pickle.loads(pickle.dumps(exc))
        add = getattr(exc, "add_note", None)  # Python >= 3.11; tracebacks print the notes
        if add is not None:
            add(redact(where))
        return exc
    except Exception:
        pass
    kind = next(
        (k for k in (FileNotFoundError, PermissionError, OSError, KeyError, ValueError) if isinstance(exc, k)),
        RuntimeError,
    )
    return kind(redact(f"{where}: {type(exc).__name__}: {exc}"))


@dataclass
class RayRunner:
    """A ``convert.Runner`` that writes each shard as a Ray task.

    ``address``: the cluster (see ``_connect``); ``max_retries``: attempts after a worker or node dies
    (Ray's task retry; episode errors are not retried); ``num_cpus``: CPUs each task reserves;
    ``memory_bytes``: memory each task reserves for Ray's scheduler (None: none; a task holds one
    episode's members at a time, so about its largest episode plus the decoder's frames);
    ``max_in_flight``: tasks submitted at once (None: twice the cluster's CPUs), so a plan of
    thousands of shards does not put every shard's episode list into the object store at once.
    """

    address: str | None = None
    max_retries: int = 3
    num_cpus: float = 1
    memory_bytes: int | None = None
    max_in_flight: int | None = None

    def __call__(self, jobs: list[tuple], storage: Storage, options: ConvertOptions, total: int, done: dict) -> None:
        """Write ``jobs`` (``(shard_id, episodes, plan_digest)``) as Ray tasks of ``write_shard``.

        Each result (the shard's metadata) goes to ``done[shard_id]``; ``total``: episodes of the
        whole plan, for the progress bar (shards already in ``done`` count as progress). Disconnects
        afterwards if this call connected. Raises the first task's own exception (e.g.
        ``ConversionError``), after cancelling the tasks still pending so none publishes a shard.
        """
        from tqdm import tqdm

        ray = _import_ray()
        connected = _connect(self.address)
        bar = tqdm(total=total, unit="ep", desc="convert (ray)", disable=not options.progress, file=sys.stderr)
        bar.update(sum(m["episodes"] + len(m["skipped"]) for m in done.values()))
        task = ray.remote(write_shard_with_env).options(
            max_retries=self.max_retries,
            retry_exceptions=False,
            num_cpus=self.num_cpus,
            **({"memory": self.memory_bytes} if self.memory_bytes else {}),
        )
        limit = self.max_in_flight or max(2 * int(ray.cluster_resources().get("CPU", 1)), 1)
        queue = list(jobs)
        env = ray.put(storage_env())  # the driver's storage settings, for every task (docs/guide/ray.md's pattern)
        pending: dict = {}  # ObjectRef -> (shard id, episodes)
        try:
            while queue or pending:
                while queue and len(pending) < limit:
                    sid, episodes, digest = queue.pop(0)
                    pending[task.remote(env, storage, sid, episodes, options, digest)] = (sid, len(episodes))
                ready, _ = ray.wait(list(pending), num_returns=1)
                sid, n = pending.pop(ready[0])
                done[sid] = _result(ray, ready[0])
                bar.update(n)
        except BaseException:
            for ref in pending:  # nothing of this run publishes a shard after it stopped
                ray.cancel(ref, force=True)
            raise
        finally:
            bar.close()
            if connected:
                ray.shutdown()


def _result(ray, ref):
    """``ray.get(ref)``, raising a task's own exception as the local conversion would, not Ray's wrapper.

    E.g. a ``ConversionError`` naming the episode.
    """
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, Exception):
            raise cause from None
        raise


def convert_ray(
    inputs: list[Source | str],
    out: str,
    options: ConvertOptions | None = None,
    storage_options: dict | None = None,
    address: str | None = None,
) -> fmt.Manifest:
    """``convert.convert`` with every shard written by a Ray task on the cluster at ``address``.

    Sources and ``out`` must be reachable from every node under the same path or URL (object store,
    shared file system). ``options.workers`` is not used (Ray places the tasks); for other retry or
    resource settings pass ``convert(..., runner=RayRunner(...))``. Returns the manifest; raises what
    ``convert`` raises, and ``ImportError`` when Ray is absent.
    """
    return convert(inputs, out, options or ConvertOptions(), storage_options, runner=RayRunner(address))
