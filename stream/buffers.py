"""Reused, pre-faulted batch buffers: ``WindowLoader(..., reuse_buffers=k)`` (opt-in).

Why: ``default_collate`` (and ``FloatCollate``) write every batch of a DataLoader worker into *fresh*
shared memory. The kernel zero-fills each new 4 KiB page on its first write (one minor page fault per
page in the worker) and the main process maps the new file and faults its pages in again when it reads
them; then both unmap and the pages are freed. On this machine that caps float32 batches at about
1.1 GB/s against ~3 GB/s for the same conversion into memory already faulted in
(docs/BENCHMARKS.md, recycled buffers). DALI and FFCV avoid it the same way: a few batch buffers allocated once and
written again and again.

How: each process that collates (every DataLoader worker, or the main process with
``num_workers=0``) keeps a ring of ``slots`` batch buffers, each one block of memory holding every
tensor field of a batch (64-byte aligned views), shared memory in a worker, zeroed once when allocated
so that its pages are faulted in before the first batch. Batch ``n`` of a process is written into
slot ``n mod slots``. torch's multiprocessing reductions send a slot's storage by file descriptor
each time; the main process finds it in ``torch.multiprocessing.reductions.shared_cache`` (keyed by
the file's inode) and maps nothing new *while a reference to that storage is alive*, which
``HeldBatches`` keeps.

Lifetime (the contract): a batch stays valid until ``k`` more batches are drawn from the loader; after
that its tensors may hold the values of a later batch (the worker writes into the same memory, no
copy, no error). Keep a batch, or any view of it, longer only as a ``.clone()`` (or after moving it to
a device). ``WindowLoader`` sizes the rings for this: ``ceil(k / num_workers) + prefetch_factor``
slots per worker (a worker writes its batch ``m + prefetch_factor`` once the batch ``m`` is drawn),
``k`` with ``num_workers=0``. ``HeldBatches`` warns once when a batch's tensors are still referenced
as its slot comes round again; a view or a shorter overstay goes unnoticed.

Memory: each worker holds ``slots`` batches for its life (as much as today's in-flight batches, but
kept); use ``persistent_workers=True``, else every epoch's new workers allocate and fault in their
rings again.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import collections
import math
import os
import warnings
import weakref
from dataclasses import dataclass

import torch
from torch.utils.data import get_worker_info

__all__ = [
    "FRAME_CACHE_FLOOR",
    "READ_ALLOWANCE",
    "RECYCLE_BYTES",
    "BatchBuffers",
    "Field",
    "HeldBatches",
    "RecycledBatches",
    "SlotFlags",
    "batch_allowance",
    "recycle_slots",
    "ring_slots",
]

_ALIGN = 64  # bytes: every field starts on a cache line


@dataclass(frozen=True)
class Field:
    """One tensor field of a batch: its key, dtype and per-sample shape (elements, no batch dimension)."""

    key: str
    dtype: torch.dtype
    shape: tuple[int, ...]


@dataclass
class _Slot:
    """One batch buffer: ``capacity`` samples of every field, views into one block of memory."""

    fields: tuple[Field, ...]
    capacity: int
    tensors: dict[str, torch.Tensor]

    @classmethod
    def allocate(cls, fields: tuple[Field, ...], capacity: int, shared: bool) -> _Slot:
        """A slot of ``capacity`` samples of every field, in one block of memory.

        Each field starts on an ``_ALIGN``-byte boundary; every page is written once here. ``shared``:
        torch shared memory (a worker's, sent to the main process by file descriptor).
        """
        offsets, end = [], 0
        for f in fields:
            end = -(-end // _ALIGN) * _ALIGN
            offsets.append(end)
            end += capacity * math.prod(f.shape) * f.dtype.itemsize
        nbytes = max(end, 1)
        # ``_new_shared`` is what ``default_collate`` uses in a worker (a file descriptor, unlinked).
        storage = torch.UntypedStorage._new_shared(nbytes) if shared else torch.UntypedStorage(nbytes)
        block = torch.empty(0, dtype=torch.uint8).set_(storage)
        block.zero_()  # touch every page once, here, so that no batch pays the page faults
        tensors = {
            f.key: block[off : off + capacity * math.prod(f.shape) * f.dtype.itemsize]
            .view(f.dtype)
            .view(capacity, *f.shape)
            for f, off in zip(fields, offsets, strict=True)
        }
        return cls(fields, capacity, tensors)


class BatchBuffers:
    """A ring of ``slots`` reused batch buffers, per process (each DataLoader worker has its own).

    ``take(fields, n)`` returns the next slot's tensors, ``[n, *field.shape]`` per field (views of one
    block of shared memory in a DataLoader worker, of private memory in the main process). A slot is
    allocated (and faulted in) the first time it is taken, and again only when the fields change
    (another frame size) or more than its capacity is asked for; ``allocations`` counts them.
    A pickled copy (a spawned worker) and a forked one start with no slots: two processes never
    share a ring.

    Raises:
        ValueError: ``slots`` < 1.
    """

    def __init__(self, slots: int):
        if slots < 1:
            raise ValueError(f"BatchBuffers: slots must be >= 1, got {slots}")
        self.slots = slots
        self.allocations = 0
        self._ring: list[_Slot | None] = []
        self._next = 0
        self._pid: int | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_ring": [], "_next": 0, "_pid": None}

    def take(self, fields: tuple[Field, ...], n: int) -> dict[str, torch.Tensor]:
        """The next slot's views for a batch of ``n`` samples of ``fields``.

        Key -> ``[n, *field.shape]`` of ``field.dtype``, holding the slot's last batch (the collate
        overwrites them).

        Reallocates the slot (``allocations`` + 1) when its fields differ or it holds fewer than ``n``.
        """
        if self._pid != os.getpid():  # a new process (fork copies the parent's ring): its own ring
            self._ring, self._next, self._pid = [None] * self.slots, 0, os.getpid()
        i = self._next
        self._next = (i + 1) % self.slots
        slot = self._ring[i]
        if slot is None or slot.fields != fields or slot.capacity < n:
            slot = self._ring[i] = _Slot.allocate(fields, n, shared=get_worker_info() is not None)
            self.allocations += 1
        return {key: t[:n] for key, t in slot.tensors.items()}

    def take_free(
        self, fields: tuple[Field, ...], n: int, busy: torch.Tensor, max_bytes: int
    ) -> tuple[int, dict[str, torch.Tensor]] | None:
        """``take``, guarded: the next slot's number and views, or None when the slot may not be written.

        ``busy``: int32 ``[slots]``, this process's row of ``SlotFlags`` (non-zero: the main process may
        still reference the slot's last batch). None when the next slot is busy, or when the ring would
        hold more than ``max_bytes`` (``slots`` batches of ``fields`` x ``n``): the caller then
        collates into fresh memory. The ring advances either way.
        """
        if self._pid != os.getpid():
            self._ring, self._next, self._pid = [None] * self.slots, 0, os.getpid()
        i = self._next
        if busy[i] != 0 or self.slots * n * sum(math.prod(f.shape) * f.dtype.itemsize for f in fields) > max_bytes:
            self._next = (i + 1) % self.slots
            return None
        return i, self.take(fields, n)


RECYCLE_BYTES = 256 << 20  # per worker: what the batches in flight take by default on top of the frame cache (bytes)
FRAME_CACHE_FLOOR = 128 << 20  # the least frame cache a worker keeps when its batches take the rest (bytes)
# A worker's look-ahead frame cache and its batches in flight share this (bytes): WORKER_BYTES (1.5 GB)
# less 0.49 GB for the rest, above the 0.46 GB a worker measured besides them at 640x480
# (interpreter, decoders, fetched groups of pictures, samples being assembled; docs/BENCHMARKS.md).
READ_ALLOWANCE = 960 << 20


def batch_allowance(frame_cache_bytes: int, batch_bytes: int, ring_bytes: int, recycle: bool) -> tuple[int, int | None]:
    """How a worker's batches in flight and its look-ahead frame cache share ``READ_ALLOWANCE`` (``WindowLoader``).

    ``frame_cache_bytes``: the look-ahead's default cache (``Lookahead.frame_cache_bytes``);
    ``batch_bytes``: one batch's frames; ``ring_bytes``: a ring of recycled buffers (``recycle_slots``
    batches); ``recycle``: recycled buffers apply. A ring is recycled when it fits the allowance
    with ``FRAME_CACHE_FLOOR`` left for the cache; otherwise batches go into fresh memory, one in
    flight per worker (the one being written). The cache keeps its size when the batches in flight
    leave room for it, else it shrinks to what they leave (never below ``FRAME_CACHE_FLOOR``), so
    large batches (float32, 720p) do not take a worker past ``WORKER_BYTES``.

    Returns ``(ring cap, frame cache)``: ``BufferedCollate(max_bytes=)`` (rings above it go into
    fresh memory) and the cache to read with (None: unchanged).
    """
    if recycle and ring_bytes <= READ_ALLOWANCE - FRAME_CACHE_FLOOR:
        in_flight, cap = ring_bytes, max(ring_bytes, RECYCLE_BYTES)
    else:
        in_flight, cap = batch_bytes, RECYCLE_BYTES  # that ring exceeds it: fresh memory
    if in_flight + frame_cache_bytes <= READ_ALLOWANCE:
        return cap, None
    return cap, max(FRAME_CACHE_FLOOR, READ_ALLOWANCE - in_flight)


class SlotFlags:
    """Which recycled batch buffers the main process may still reference: one flag per worker and slot.

    ``flags``: int32 ``[workers, slots]`` in shared memory, made in the main process before the workers
    start (forked or spawned workers see the same memory). A worker sets its slot's flag when it writes
    a batch there (``BufferedCollate`` with ``flags``); the main process clears it once nothing of that
    batch is referenced any more (``RecycledBatches``). A worker never writes into a flagged slot.
    """

    def __init__(self, workers: int, slots: int):
        self.flags = torch.zeros((max(workers, 1), slots), dtype=torch.int32).share_memory_()

    def clear(self) -> None:
        """All slots free (new workers, new rings)."""
        self.flags.zero_()


class RecycledBatches:
    """The main process's side of recycled buffers: frees a slot once its batch is no longer referenced.

    ``received(batch)`` for each batch drawn: removes the batch's ``__slot__`` entry (int64 ``[2]``:
    worker, slot; absent for a batch the worker collated into fresh memory) and keeps that slot's
    storage (a ``frames`` field's: the fields the collate writes into slots) referenced (so
    torch's ``shared_cache`` maps nothing new when the slot comes round:
    ``HeldBatches``' reason). ``poll()`` (also run by ``received``) clears the flag of every slot
    whose storage has no reference left but this object's: no tensor, view, ``.detach()`` or
    ``.numpy()`` of the batch is alive (the storage's use count, not a guess from the batch's age).
    A batch kept, in whole or in part, therefore keeps its slot: the worker writes later batches
    into fresh memory instead, so a batch's values never change under its holder.
    """

    def __init__(self, flags: SlotFlags, frames: list[str] | None = None):
        self.flags = flags
        self.frames = frames  # the fields written into the slots (None: every tensor field)
        self._storages: dict[tuple[int, int], torch.UntypedStorage] = {}
        self._pending: set[tuple[int, int]] = set()

    def reset(self) -> None:
        """New workers: their rings are new; forget the old slots (batches still held stay valid)."""
        self._storages.clear()
        self._pending.clear()
        self.flags.clear()

    def received(self, batch: dict) -> None:
        """Take ``batch``'s ``__slot__`` entry out and track that slot; then ``poll``."""
        slot = batch.pop("__slot__", None)
        if slot is not None:
            w, i = (int(x) for x in slot.tolist())
            # The slot's storage: a field written into it (the others are in fresh memory).
            keys = [k for k in (self.frames or batch) if isinstance(batch.get(k), torch.Tensor)]
            self._storages[(w, i)] = batch[keys[0]].untyped_storage()
            self._pending.add((w, i))
        self.poll()

    def poll(self) -> None:
        """Clear the flags of the slots whose batches nothing references any more."""
        for key in list(self._pending):
            storage = self._storages[key]
            if torch._C._storage_Use_Count(storage._cdata) <= 1:  # only ours
                self.flags.flags[key] = 0
                self._pending.discard(key)

    @property
    def held(self) -> int:
        """Slots whose batch is still referenced."""
        return len(self._pending)


class HeldBatches:
    """The main process's side: keeps the last ``n`` received slots mapped and checks the lifetime.

    ``received(batch)`` after each batch is drawn (numbered from 0 over the loader's life). Holding a
    slot's storage keeps it in torch's ``shared_cache``, so the next batch in that slot is not mapped
    (and faulted in) again.
    When a slot comes round while tensors of the batch it held before are still referenced, warns once
    (``RuntimeWarning``) naming both batch numbers: those tensors now hold the newer batch.

    ``n``: slots held (``ring_slots`` x workers); ``k``: the loader's ``reuse_buffers`` (batches a batch
    stays valid for), named in the warning.
    """

    def __init__(self, n: int, k: int):
        self.n, self.k = n, k
        self._held: collections.OrderedDict[int, tuple[torch.UntypedStorage, int, list]] = collections.OrderedDict()
        self._warned = False
        self._number = -1

    def received(self, batch: dict) -> None:
        """Record ``batch`` (key -> tensor; other values ignored) as drawn.

        Its slot is the storage of its largest tensor. Warns (``RuntimeWarning``, once) as the class says.
        """
        self._number += 1
        number = self._number
        tensors = [v for v in batch.values() if isinstance(v, torch.Tensor)]
        if not tensors:
            return
        storage = max(tensors, key=lambda t: t.untyped_storage().nbytes()).untyped_storage()
        ptr = storage.data_ptr()
        mine = [t for t in tensors if t.untyped_storage().data_ptr() == ptr]
        before = self._held.pop(ptr, None)
        if before is not None and not self._warned and any(r() is not None for r in before[2]):
            self._warned = True
            warnings.warn(
                f"WindowLoader(reuse_buffers={self.k}): batch {before[1]} is still referenced when batch "
                f"{number} reuses its buffer, so its tensors now hold batch {number}'s values. A batch "
                f"stays valid until {self.k} more batches are drawn: .clone() what you keep longer.",
                RuntimeWarning,
                stacklevel=3,
            )
        self._held[ptr] = (storage, number, [weakref.ref(t) for t in mine])
        while len(self._held) > self.n:
            self._held.popitem(last=False)


def ring_slots(k: int, num_workers: int, prefetch_factor: int | None) -> int:
    """Slots per collating process so that a batch stays valid until ``k`` more batches are drawn.

    A worker is asked for its batch ``m + prefetch_factor`` when its batch ``m`` is drawn, and the
    DataLoader draws from its workers in turn: ``ceil(k / num_workers) + prefetch_factor`` slots;
    ``k`` without workers (the batch is collated when drawn). ``prefetch_factor`` None: torch's
    default, 2.
    """
    if num_workers == 0:
        return k
    return -(-k // num_workers) + (2 if prefetch_factor is None else prefetch_factor)


def recycle_slots(num_workers: int, prefetch_factor: int | None) -> int:
    """Slots per worker for recycled buffers (``WindowLoader(recycle_buffers=...)``).

    A worker is asked for its batch ``m + prefetch_factor`` when its batch ``m`` is drawn; the slot
    that batch goes into held batch ``m - 1`` of that worker with ``prefetch_factor + 1`` slots, which
    a loop dropping each batch before drawing the next has let go of when there are two or more
    workers (the batch drawn just before is another worker's); one worker needs one slot more.
    ``prefetch_factor`` None: torch's default, 2.
    """
    prefetch = 2 if prefetch_factor is None else prefetch_factor
    return prefetch + (1 if num_workers >= 2 else 2)
