"""``RayWindowLoader``: a rank's DataLoader workers as Ray actors, batches through Ray's object store.

The actors run on any node (CPU-only ones too); they decode, post-process and batch windows, and
send uint8 batches to the trainer.

The plan is ``WindowLoader``'s: a consumer is (rank, worker), with ``num_workers`` consumers per rank,
and actor ``w`` is exactly the DataLoader worker ``w`` of consumer ``(rank, w)``: it iterates a copy
of the rank's ``WindowDataset`` as that worker would (``get_worker_info`` says worker ``w`` of
``num_workers``) and batches ``batch_size`` consecutive samples with the same collate. The trainer
takes batches round-robin over the consumers in the DataLoader's order, so it yields exactly the
batches ``WindowLoader`` yields for the same (seed, epoch, world size, workers), in the same order.

Flow control: the trainer keeps at most ``prefetch`` batch requests outstanding per actor (so at
most ``num_workers x prefetch`` batches are in flight or waiting in the object store: back-pressure);
an actor computes a batch while earlier ones travel and wait, so decoding overlaps training.

Failure: when an actor dies (its process or node), Ray restarts it (``max_restarts``) and the
trainer starts it again at the first window of that consumer it has not yielded (requests that were
outstanding are dropped and asked again), so every planned window is still yielded exactly once.
After ``max_restarts`` restarts of one actor the iteration raises ``RuntimeError`` naming the rank,
consumer, epoch and the windows left.

How many actors a rank needs: a rank consumes ``step_rate x batch_size`` samples per second; one
actor produces ``r`` samples per second of its busy time (``telemetry()["samples_per_busy_s"]``,
measured) and the trainer spends ``t`` seconds per batch receiving it (``transfer_s_per_batch``).
Take ``num_workers >= ceil(step_rate x batch_size / r)`` (plus one to absorb variation), as long as
``step_rate x t < 1`` (the trainer's own share). docs/BENCHMARKS.md has measured ``r`` and ``t``.

Public entry point (needs Ray): ``from epishard.stream.ray_loader import RayWindowLoader``.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from epishard.format.storage import storage_env

from .dataset import WindowDataset
from .plan import World
from .resume import Resume

# ConsumerActor: Ray titles its actor processes after it ("ray::ConsumerActor")
__all__ = ["ConsumerActor", "RayWindowLoader"]

_ACTOR_ERRORS: tuple = ()  # ray.exceptions.RayActorError and friends, set on first use


def _import_ray():
    try:
        import ray
    except ImportError as exc:
        raise ImportError("Ray is not installed: pip install 'epishard[ray]' (ray==2.60.0)") from exc
    global _ACTOR_ERRORS
    _ACTOR_ERRORS = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
    return ray


def _to_numpy(batch):
    """Tensors become numpy arrays: Ray stores those out of band (no pickling copy of the bytes)."""
    if isinstance(batch, torch.Tensor):
        return batch.numpy()
    if isinstance(batch, dict):
        return {k: _to_numpy(v) for k, v in batch.items()}
    if isinstance(batch, list):
        return [_to_numpy(v) for v in batch]
    return batch


def _to_torch(batch):
    """Back to tensors, copied out of the object store's read-only memory (writable, owned)."""
    if isinstance(batch, np.ndarray):
        return torch.from_numpy(batch.copy())
    if isinstance(batch, dict):
        return {k: _to_torch(v) for k, v in batch.items()}
    if isinstance(batch, list):
        return [_to_torch(v) for v in batch]
    return batch


class ConsumerActor:
    """One consumer of a rank, run as a Ray actor: the DataLoader worker ``worker`` of ``num_workers``.

    ``start`` gives it the rank's dataset positioned where this consumer continues; ``next_batch``
    returns ``(batch, info)`` (batch: the collated samples, tensors as numpy arrays; info: busy
    seconds and samples of this call) or ``None`` once the consumer's windows are all yielded.
    """

    def __init__(self, worker: int, num_workers: int, batch_size: int, collate_fn=None, env: dict | None = None):
        import os

        os.environ.update(env or {})  # the driver's storage settings (storage_env): this process is the actor's
        self.worker, self.num_workers, self.batch_size = worker, num_workers, batch_size
        self.collate = collate_fn or default_collate
        self.samples = iter(())
        self.first = True

    def start(self, dataset: WindowDataset) -> int:
        """Iterate ``dataset`` (positioned for this consumer) as DataLoader worker ``worker``; returns ``worker``."""
        from torch.utils.data._utils import worker as torch_worker

        # The dataset reads its (worker, num_workers) from torch's worker info, as in a DataLoader.
        torch_worker._worker_info = torch_worker.WorkerInfo(
            id=self.worker, num_workers=self.num_workers, seed=dataset.seed, dataset=dataset
        )
        self.samples = iter(dataset)
        self.first = True
        return self.worker

    def next_batch(self):
        """``(batch, info)`` of the next ``batch_size`` samples, or ``None`` when none are left."""
        t = time.perf_counter()
        samples = list(itertools.islice(self.samples, self.batch_size))
        if not samples:
            return None
        batch = _to_numpy(self.collate(samples))
        first, self.first = self.first, False  # the first batch also plans and opens the first shards
        return batch, {"busy_s": time.perf_counter() - t, "samples": len(samples), "first": first}

    def pid(self) -> int:
        """This actor's process id."""
        import os

        return os.getpid()


@dataclass
class _Consumer:
    """The trainer's view of one consumer during an iteration."""

    index: int
    actor: Any  # a Ray actor handle of ConsumerActor
    skip: int  # samples of this epoch the consumer had yielded before this iteration
    received: int = 0  # samples the trainer has yielded from it in this iteration
    outstanding: list = field(default_factory=list)  # ObjectRefs of requested batches, in order
    done: bool = False


class RayWindowLoader:
    """``WindowLoader``'s batches, made by Ray actors (possibly on other nodes), sent through Ray's object store.

    Args:
        dataset: the rank's ``WindowDataset`` (its rank and world size as in ``WindowLoader``:
            arguments, or ``torch.distributed`` in the trainer process). The loader iterates its own
            shallow copy (``loader.dataset``; the argument is not changed), positioned where the
            dataset is (its epoch, and a state loaded into it).
        batch_size: samples per batch (the last batch of a consumer may be smaller, as in a DataLoader).
        num_workers: consumers (actors) of this rank, >= 1; the plan is ``WindowLoader``'s with this
            many workers.
        prefetch: batch requests outstanding per actor (in flight or waiting in the object store).
        max_restarts: restarts of one actor before the iteration fails (``RuntimeError``).
        address: the Ray cluster to connect to when this process is not connected yet (``None``:
            ``RAY_ADDRESS`` or the local cluster, else a new local one).
        actor_options: passed to Ray's ``.options()`` for each actor (e.g. ``{"num_cpus": 2}``,
            ``{"resources": {"decode": 1}}`` to place actors on CPU nodes). Each actor reserves one
            CPU by default (``num_cpus=1``), from its start until ``close()``: ``num_workers`` actors
            need that many free CPUs (and of each resource asked) in the cluster.
        placement_timeout_s: seconds to wait, when the loader is made, for every actor to be placed
            and started; then ``TimeoutError`` (the actors made are ended).

    Raises:
        TimeoutError: the actors could not all be placed within ``placement_timeout_s`` (more CPUs or
            resources asked than the cluster has, a resource no node has, or a cluster busy with other
            actors, e.g. another loader not closed), naming what was asked and what the cluster has
            in all and free.
        ValueError: ``num_workers``, ``batch_size`` or ``prefetch`` below 1.
        ImportError: Ray is not installed.

    Lifetime: ``close()`` ends the actors and frees their CPUs (they also end with the Ray job);
    ``with RayWindowLoader(...) as loader:`` closes on leaving the block.

    Batches: ``default_collate`` of the samples (cameras uint8 ``[B, T, C, H, W]``, ...); with a
    float ``PostProcess`` frames travel as uint8 and become float32 in the trainer (as
    ``WindowLoader``'s collate does). ``state_dict()`` / ``load_state_dict()``: ``WindowLoader``'s
    states (``history`` included), loadable by either; ``load_state_dict`` also takes the list of
    every rank's states of a run under another world size or worker count (elastic resume, as
    ``WindowLoader``).
    """

    def __init__(
        self,
        dataset: WindowDataset,
        batch_size: int = 1,
        num_workers: int = 1,
        *,
        prefetch: int = 2,
        max_restarts: int = 3,
        address: str | None = None,
        actor_options: dict | None = None,
        placement_timeout_s: float = 120.0,
    ):
        if num_workers < 1 or batch_size < 1 or prefetch < 1:
            raise ValueError(
                f"num_workers, batch_size and prefetch must be >= 1, got {num_workers}, {batch_size}, {prefetch}"
            )
        ray = _import_ray()
        if not ray.is_initialized():
            import logging

            ray.init(address=address, logging_level=logging.WARNING, configure_logging=False)
        floating = dataset.post.dtype.is_floating_point  # uint8 over the wire; converted here (FloatCollate's values)
        self.dataset = dataset.with_options(defer_float=floating, num_workers=num_workers, batch_size=batch_size)
        self.batch_size, self.num_workers = batch_size, num_workers
        self.prefetch, self.max_restarts = prefetch, max_restarts
        self.float_keys: list[str] = []
        if floating:
            self.float_keys = sorted(c for c, depth in dataset.layout.depth.items() if not depth)  # model cameras
        options = {"num_cpus": 1, **(actor_options or {}), "max_restarts": max_restarts, "max_task_retries": 0}
        cls = ray.remote(ConsumerActor).options(**options)
        # The driver's storage settings, as convert --ray passes them to its tasks; held by the loader,
        # so an actor Ray restarts gets them again.
        self._env = ray.put(storage_env())
        self._actors = [cls.remote(w, num_workers, batch_size, None, self._env) for w in range(num_workers)]
        self._wait_placed(options, placement_timeout_s)
        self._restarts = [0] * num_workers  # per actor, over the loader's life (Ray's max_restarts counts so)
        self._epoch = self.dataset.epoch
        # Where the next iteration begins (a loaded state; taken by it): skip per consumer, the
        # consumer whose batch comes first (rotation), earlier layouts' progress (history).
        self._next_start = self.dataset.cursor.pending
        self.dataset.cursor.pending = None  # the actors' copies get the position explicitly
        self._began = Resume(self._epoch)  # where the running (or last) iteration began
        self._consumers: list[_Consumer] = []
        self._batches = 0
        self._running: object | None = None
        self._stats: dict = {}
        self._t_start: float | None = None
        self.reset_telemetry()

    def _wait_placed(self, options: dict, timeout_s: float) -> None:
        """Wait until every actor is placed and answers; else end them and raise ``TimeoutError`` saying why.

        Ray itself waits for resources forever, without a word (an infeasible request only logs).
        """
        ray = _import_ray()
        refs = [a.pid.remote() for a in self._actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if len(ready) == len(refs):
            return
        asked = {"CPU": float(options.get("num_cpus", 1))}
        if options.get("num_gpus"):
            asked["GPU"] = float(options["num_gpus"])
        if options.get("memory"):
            asked["memory"] = float(options["memory"])
        asked.update({k: float(v) for k, v in (options.get("resources") or {}).items()})
        total, free = ray.cluster_resources(), ray.available_resources()
        self.close()

        def shown(resources: dict) -> str:
            keys = sorted({*asked, "CPU", *(k for k in resources if k == "GPU")})
            return "{" + ", ".join(f"{k!r}: {resources.get(k, 0):g}" for k in keys) + "}"

        n = len(refs)
        lacking = [k for k, v in asked.items() if v > 0 and total.get(k, 0) < v * n]
        why = (
            f"the cluster has fewer {', '.join(lacking)} in all than asked"
            if lacking
            else "the rest is held by other actors or tasks (a RayWindowLoader holds its actors' CPUs until close())"
        )
        raise TimeoutError(
            f"RayWindowLoader: {n - len(ready)} of {n} actors (num_workers={n}) could not be placed within "
            f"{timeout_s:g} s: each asks for {shown(asked)} ({n} x that in all); the cluster has {shown(total)} in "
            f"all, {shown(free)} free now ({why}). Use fewer workers or smaller actor_options, add nodes or "
            "resources, or close() other loaders"
        )

    def __enter__(self) -> RayWindowLoader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __len__(self) -> int:
        """Batches of the next iteration's epoch under this layout (from its start)."""
        return -(-self._per_consumer(Resume(self._epoch)) // self.batch_size) * self.num_workers

    # --- iteration -------------------------------------------------------------------------------

    def _world(self) -> World:
        return self.dataset.ranks.world()

    def _per_consumer(self, start: Resume) -> int:
        """Windows each consumer of this layout yields in ``start``'s epoch (after its history)."""
        return self.dataset.windows_per_consumer(start.epoch, self._world().world_size, self.num_workers, start.history)

    def _actor_dataset(self, consumed: list[int]) -> WindowDataset:
        """A copy of the dataset, for actors: rank and world pinned (an actor has no process group).

        Positioned so that actor (worker) ``w`` continues consumer ``w`` after ``consumed[w]``
        samples of this iteration's epoch, after the earlier layouts' progress (``history``).
        """
        here = self._world()
        ds = self.dataset.with_options()
        ds.ranks = dataclasses.replace(ds.ranks, rank=here.rank, world_size=here.world_size)
        ds.set_epoch(self._began.epoch)
        ds.cursor.pending = Resume(self._began.epoch, self._began.history, tuple(consumed), 0)
        return ds

    def _start(self, consumer: _Consumer, ds_ref) -> None:
        ray = _import_ray()
        ray.get(consumer.actor.start.remote(ds_ref))
        consumer.outstanding = [consumer.actor.next_batch.remote() for _ in range(self.prefetch)]

    def _restart(self, consumer: _Consumer, error: Exception) -> None:
        """Start a restarted actor at the consumer's first window not yet yielded."""
        ray = _import_ray()
        self._restarts[consumer.index] += 1
        self._stats["restarts"][consumer.index] += 1
        position = consumer.skip + consumer.received
        rank = self._world().rank
        if position >= self._per_consumer(self._began):
            consumer.done, consumer.outstanding = True, []  # it died after its last batch: nothing is lost
            return
        if self._restarts[consumer.index] > self.max_restarts:
            raise RuntimeError(
                f"RayWindowLoader: the actor of rank {rank} consumer {consumer.index} failed "
                f"{self._restarts[consumer.index]} times (max_restarts={self.max_restarts}); in epoch "
                f"{self._epoch} {position} samples of this consumer were yielded: {error}"
            ) from error
        consumed = [0] * self.num_workers
        consumed[consumer.index] = position
        ds_ref = ray.put(self._actor_dataset(consumed))
        deadline = time.monotonic() + 120
        while True:  # the restarted actor answers once Ray has brought it back
            try:
                self._start(consumer, ds_ref)
                return
            except _ACTOR_ERRORS:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _next(self, consumer: _Consumer):
        """The consumer's next batch (numpy arrays, as sent), or None when it has none left; restarts a dead actor."""
        ray = _import_ray()
        while True:
            ref = consumer.outstanding.pop(0)
            consumer.outstanding.append(consumer.actor.next_batch.remote())
            try:
                result = ray.get(ref)
            except _ACTOR_ERRORS as exc:
                self._restart(consumer, exc)
                if consumer.done:
                    return None
                continue
            if result is None:
                consumer.done = True
                consumer.outstanding = []
                return None
            batch, info = result
            if info["first"]:
                self._stats["first_batch_s"].append(info["busy_s"])
            else:
                self._stats["busy_s"][consumer.index] += info["busy_s"]
                self._stats["samples"][consumer.index] += info["samples"]
            consumer.received += info["samples"]
            return batch

    def __iter__(self):
        ray = _import_ray()
        self._batches = 0
        self._running = token = object()
        # A loaded position is used by this iteration only: a later one (after a break) runs the epoch
        # from its start, as WindowLoader does.
        self._began, self._next_start = self._loaded(), None
        skip, rotation = list(self._began.skip) or [0] * self.num_workers, self._began.rotation
        consumers = [_Consumer(w, a, skip[w]) for w, a in enumerate(self._actors)]
        self._consumers = consumers
        try:
            ds_ref = ray.put(self._actor_dataset(skip))
            for c in consumers:
                self._start(c, ds_ref)
            order = [consumers[(rotation + i) % self.num_workers] for i in range(self.num_workers)]
            while any(not c.done for c in order):
                for c in order:
                    if c.done:
                        continue
                    t = time.perf_counter()
                    waiting = [r for x in order for r in x.outstanding]
                    depth = len(ray.wait(waiting, num_returns=len(waiting), timeout=0)[0])
                    batch = self._next(c)
                    self._t_start = self._t_start or t
                    waited = time.perf_counter() - t
                    if batch is None:
                        continue
                    t = time.perf_counter()
                    batch = self._finish(batch)
                    self._stats["transfer_s"].append(time.perf_counter() - t)
                    self._stats["wait_s"].append(waited)
                    self._stats["queue_depth"].append(depth)
                    self._batches += 1
                    yield batch
            self._epoch += 1
            self._batches, self._consumers = 0, []
            self._began = Resume(self._epoch)
        finally:
            if self._running is token:
                self._running = None

    def _finish(self, batch) -> dict:
        batch = _to_torch(batch)
        for key in self.float_keys:  # as FloatCollate: x.to(float32) * (1 / 255)
            out = batch[key].to(self.dataset.post.dtype)
            if self.dataset.post.scale:
                out.mul_(1.0 / 255.0)
            batch[key] = out
        return batch

    # --- resume ----------------------------------------------------------------------------------

    def _loaded(self) -> Resume:
        """Where the next iteration begins: a loaded state of its epoch, else the epoch's start."""
        loaded = self._next_start
        return loaded if loaded is not None and loaded.epoch == self._epoch else Resume(self._epoch)

    def _position(self) -> Resume:
        """Where this rank stands: history, samples yielded per consumer, the consumer whose batch is next.

        A loaded state before its iteration; else the running (or last broken) iteration's position.
        """
        if not self._consumers:
            return self._loaded()
        consumed = tuple(c.skip + c.received for c in self._consumers)
        rotation = (self._began.rotation + self._batches) % self.num_workers
        return Resume(self._began.epoch, self._began.history, consumed, rotation)

    def state_dict(self) -> dict:
        """Position of this rank, as ``WindowLoader.state_dict()`` (the same dict, loadable by either).

        To resume under another world size or worker count, save every rank's state and load them
        all (a list).
        """
        position = self._position()  # what each consumer took: nothing at an epoch boundary ("fresh")
        return self.dataset.state_dict(0, self.batch_size, self.num_workers, position.epoch, position)

    def load_state_dict(self, state: dict | list[dict]) -> None:
        """Continue from ``state`` (this rank's, or a list of every rank's) on the next iteration.

        ``WindowLoader.load_state_dict``'s semantics, elastic resume included.

        Raises:
            RuntimeError: an iteration over this loader is in progress.
            ValueError: see ``WindowDataset.load_state_dict`` (a field missing, of the wrong type or out
                of range: ``StateError``, naming it; another seed; states that disagree; another layout
                without every rank's state).
        """
        if self._running is not None:
            raise RuntimeError(
                "RayWindowLoader.load_state_dict during an iteration over the loader: load the state "
                "before the for loop (or after it ended, or after deleting its iterator)."
            )
        self._batches, self._consumers = 0, []
        self.dataset.load_state_dict(state, self.num_workers)  # checks seed, layout, ranks; a boundary's too
        self._epoch, self._next_start = self.dataset.epoch, self.dataset.cursor.pending
        self.dataset.cursor.pending = None  # the actors' copies get the position explicitly

    # --- telemetry and lifetime -------------------------------------------------------------------

    def telemetry(self) -> dict:
        """Counters of the trainer's waits and the actors' work since the last reset.

        Per-batch wait in the trainer (seconds a ``next()`` waited for its batch: mean, p95),
        batches ready in the object store when a batch was asked for (queue depth: mean), seconds
        per batch to turn it into tensors (transfer), and per actor: seconds of each first batch of an
        iteration (it also plans and opens the first shards), then busy seconds and samples of the
        other batches, utilisation (busy / wall since the first batch asked for after a reset),
        restarts, and samples per busy second (decode, post-process and collate; not counting the
        object-store put of the result, which the actor's Ray worker does after the call).
        """
        s = self._stats
        wall = time.perf_counter() - self._t_start if self._t_start else 0.0
        wait = np.asarray(s["wait_s"])
        return {
            "batches": int(wait.size),
            "wait_s_mean": float(wait.mean()) if wait.size else 0.0,
            "wait_s_p95": float(np.percentile(wait, 95)) if wait.size else 0.0,
            "queue_depth_mean": float(np.mean(s["queue_depth"])) if s["queue_depth"] else 0.0,
            "transfer_s_per_batch": float(np.mean(s["transfer_s"])) if s["transfer_s"] else 0.0,
            "actor_first_batch_s": list(s["first_batch_s"]),
            "actor_busy_s": list(s["busy_s"]),
            "actor_samples": list(s["samples"]),
            "actor_restarts": list(s["restarts"]),
            "actor_utilisation": [b / wall if wall else 0.0 for b in s["busy_s"]],
            "samples_per_busy_s": sum(s["samples"]) / sum(s["busy_s"]) if sum(s["busy_s"]) else 0.0,
        }

    def reset_telemetry(self) -> None:
        """Start the counters of ``telemetry()`` afresh (e.g. after a warm-up batch)."""
        w = self.num_workers
        self._stats = {"wait_s": [], "queue_depth": [], "transfer_s": [], "first_batch_s": [], "busy_s": [0.0] * w}
        self._stats.update(samples=[0] * w, restarts=[0] * w)
        self._t_start = None

    def actor_pids(self) -> list[int]:
        """Process id of each actor (consumer order), e.g. to watch or kill one."""
        ray = _import_ray()
        return ray.get([a.pid.remote() for a in self._actors])

    def close(self) -> None:
        """End the actors and free the CPUs (and resources) they reserve; they also end with the Ray job.

        Call it when done with the loader (or use it as a context manager): until then its actors
        hold their resources, and another loader's actors may not be placed. Closing twice is fine.
        """
        ray = _import_ray()
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors = []
