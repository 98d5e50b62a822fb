"""Batching: ``default_collate``, with deferred float conversion of frames, optionally into reused buffers.

Frames kept as uint8 by the reader become float32 in [0, 1] while they are copied into the batch
(``PostProcess(dtype=torch.float32)`` deferred).

Converting up front would write every decoded frame as float32 (4x the bytes) and copy it again per
window; converting here writes float32 memory once, the batch itself (in shared memory inside a
DataLoader worker, as ``default_collate`` does). The values equal ``x.to(float32).mul_(1 / 255)``
(``PostProcess``'s arithmetic, bit for bit).

``BufferedCollate`` writes the same batch into a ring of reused, pre-faulted buffers
(``stream.buffers``: ``WindowLoader(..., reuse_buffers=k)``). ``to_device`` is the other way out of the
page-fault tax: keep frames uint8 through the loader (a quarter of the bytes) and convert on the
device.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch.utils.data import default_collate, get_worker_info

from .buffers import RECYCLE_BYTES, BatchBuffers, Field, SlotFlags
from .lookahead import LazyFrames, materialized

__all__ = ["BufferedCollate", "FloatCollate", "float_frames", "to_device"]


def _convert_into(out: torch.Tensor, samples: list[dict], key: str, scale: bool) -> None:
    """``out[i] = samples[i][key]`` converted to ``out``'s dtype, divided by 255 when ``scale``.

    A ``LazyFrames`` value is converted straight into ``out[i]`` (its planes cast on the way in)
    where numpy has ``out``'s dtype, else through one uint8 scratch window (reused across samples).
    """
    scratch = None
    direct = out.dtype in (torch.float16, torch.float32, torch.float64)
    for i, sample in enumerate(samples):
        value = sample[key]
        if isinstance(value, LazyFrames):
            if direct:
                value.write(out[i])
                continue
            if scratch is None:
                scratch = torch.empty(value.shape, dtype=torch.uint8)
            value = value.write(scratch)
        out[i].copy_(value)
    if scale:
        out.mul_(1.0 / 255.0)


def _collate_materialized(samples: list[dict]) -> dict:
    """``default_collate`` of ``samples`` whose ``LazyFrames`` are made tensors first."""
    return default_collate([materialized(s) for s in samples])


class FloatCollate:
    """Collate for a ``WindowDataset`` whose float conversion is deferred.

    ``keys``: the camera keys to convert; ``dtype``: the float dtype; ``scale``: divide by 255.
    """

    def __init__(self, keys: list[str], dtype: torch.dtype = torch.float32, scale: bool = True):
        self.keys, self.dtype, self.scale = list(keys), dtype, scale

    def __call__(self, samples: list[dict]) -> dict:
        """``default_collate`` of ``samples``, the ``keys`` frames converted while copied in.

        ``LazyFrames`` (``stream.lookahead``) of the ``keys`` are converted straight into the batch;
        other ones are made tensors first.
        """
        batch = default_collate([materialized({k: v for k, v in s.items() if k not in self.keys}) for s in samples])
        for key in self.keys:
            shape = (len(samples), *samples[0][key].shape)
            if get_worker_info() is not None:  # straight into shared memory: no copy on the way out
                elem = torch.empty(0, dtype=self.dtype)
                out = elem.new(elem._typed_storage()._new_shared(math.prod(shape), device=elem.device)).resize_(shape)
            else:
                out = torch.empty(shape, dtype=self.dtype)
            _convert_into(out, samples, key, self.scale)
            batch[key] = out
        return batch


class BufferedCollate:
    """``FloatCollate``'s batch (or ``default_collate``'s, with no ``keys``) written into reused buffers.

    Every tensor field of the samples goes into the next slot of a ``BatchBuffers`` ring of
    ``slots`` (``torch.stack`` into the slot, as ``default_collate`` stacks into fresh memory); the
    ``keys`` frames are converted to ``dtype`` (and divided by 255 when ``scale``) on the way in;
    other fields (str, int, float) go through ``default_collate``. The values are identical to
    ``FloatCollate``'s. A batch returned here is overwritten when its slot comes round again
    (``stream.buffers``: the lifetime).
    """

    def __init__(
        self,
        keys: list[str],
        dtype: torch.dtype = torch.float32,
        scale: bool = True,
        *,
        slots: int,
        flags: SlotFlags | None = None,
        max_bytes: int = RECYCLE_BYTES,
        frames: list[str] | None = None,
    ):
        self.keys, self.dtype, self.scale = set(keys), dtype, scale
        self.buffers = BatchBuffers(slots)
        self.flags, self.max_bytes = flags, max_bytes
        # Recycled: only these fields (the cameras' frames, where the bytes are) go into the slot, so a
        # small field kept by the training loop (a mask, telemetry, ``.numpy()`` of an index) does not
        # hold the slot; None: every tensor field.
        self.frames = None if frames is None else set(frames)
        # With flags (recycled buffers): a batch that cannot go into its slot goes into fresh memory.
        self.fresh = FloatCollate(sorted(keys), dtype, scale) if keys else _collate_materialized

    def __call__(self, samples: list[dict]) -> dict:
        """The batch of ``samples``, its tensors views of the next slot.

        With ``flags`` (recycled buffers; in a DataLoader worker): the slot is written only when the
        main process no longer references its last batch (``SlotFlags``), and the batch then carries
        ``__slot__`` (int64 ``[2]``: worker, slot) for ``RecycledBatches``; otherwise, or when the
        ring would exceed ``max_bytes``, the batch is collated into fresh memory, as without buffers.
        """
        first = samples[0]
        tensors = [k for k, v in first.items() if isinstance(v, torch.Tensor | LazyFrames)]
        fields = tuple(
            Field(k, self.dtype if k in self.keys else first[k].dtype, tuple(first[k].shape)) for k in tensors
        )
        info = get_worker_info()
        if self.flags is not None and info is not None:
            if self.frames is not None:
                tensors = [k for k in tensors if k in self.frames]
                fields = tuple(f for f in fields if f.key in self.frames)
            got = self.buffers.take_free(fields, len(samples), self.flags.flags[info.id], self.max_bytes)
            if got is None or not fields:
                return self.fresh(samples)
            slot, out = got
            batch = self._write(samples, tensors, out)
            self.flags.flags[info.id, slot] = 1
            batch["__slot__"] = torch.tensor([info.id, slot], dtype=torch.int64)
            return batch
        return self._write(samples, tensors, self.buffers.take(fields, len(samples)))

    def _write(self, samples: list[dict], tensors: list[str], out: dict[str, torch.Tensor]) -> dict:
        first = samples[0]
        batch = default_collate([{k: v for k, v in s.items() if k not in out} for s in samples])
        for key in tensors:  # in the samples' order, as default_collate
            if key in self.keys:
                _convert_into(out[key], samples, key, self.scale)
            elif isinstance(first[key], LazyFrames):  # kept pictures: converted straight into the batch
                for i, s in enumerate(samples):
                    s[key].write(out[key][i])
            else:
                torch.stack([s[key] for s in samples], out=out[key])
            batch[key] = out[key]
        return {k: batch[k] for k in first}


def float_frames(
    frames: torch.Tensor, out: torch.Tensor, *, scale: bool = True, fused: bool | None = None
) -> torch.Tensor:
    """Write uint8 ``frames`` into the float tensor ``out`` (same shape and device) in [0, 1]; returns ``out``.

    Values are identical to ``PostProcess(dtype=out.dtype)`` and ``FloatCollate``
    (``x.to(dtype).mul_(1 / 255)``; only cast with ``scale=False``). ``fused`` (default: on any device
    but the CPU) is one multiply that reads uint8 and writes ``out``'s dtype, the factor a 0-dim tensor
    in float32 (float64 for float64): the dtype torch computes that in-place multiply in, whatever
    ``torch.get_default_dtype()`` is. On the CPU it is a copy then an in-place multiply: CPU kernels would
    first cast the uint8 input into a full-size float temporary (a fresh allocation per batch).
    """
    if fused if fused is not None else frames.device.type != "cpu":
        factor = torch.tensor(1.0 / 255.0 if scale else 1.0, dtype=torch.promote_types(out.dtype, torch.float32))
        return torch.mul(frames, factor, out=out)
    out.copy_(frames)
    return out.mul_(1.0 / 255.0) if scale else out


def to_device(
    batch: Mapping,
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
    *,
    scale: bool = True,
    non_blocking: bool = True,
) -> dict:
    """Move a batch of uint8 frames to ``device`` and make them float there (``float_frames``).

    For training on an accelerator with frames kept uint8 through the loader (``PostProcess()``'s
    default dtype): frames move as a quarter of a float32 batch's bytes and no worker writes float32
    pages. Every tensor is moved with ``.to(device, non_blocking=non_blocking)``; every uint8 tensor
    (RGB frames ``[B, T, 3, H, W]``; masks are bool and depth uint16, so they are untouched) then
    becomes ``dtype`` in [0, 1] on the device, by one fused multiply there: values identical to
    ``PostProcess(dtype=dtype)`` and ``FloatCollate``. With ``scale=False`` frames are only cast.
    Nested dicts are handled; other values (``task`` strings) are kept as they are. A tensor already
    on ``device`` with its dtype is returned as it is, not copied (``Tensor.to``): with
    ``reuse_buffers`` and ``device="cpu"`` it still lives in the loader's buffer.

    ``non_blocking`` copies overlap compute only from pinned memory (``pin_memory=True`` on the loader);
    from pageable memory they are synchronous, and correct either way.

    Raises:
        ValueError: ``dtype`` is not a floating dtype.
    """
    if not dtype.is_floating_point:
        raise ValueError(f"to_device: dtype must be a floating dtype, got {dtype}")
    out: dict = {}
    for key, value in batch.items():
        if isinstance(value, Mapping):
            out[key] = to_device(value, device, dtype, scale=scale, non_blocking=non_blocking)
        elif isinstance(value, torch.Tensor):
            moved = value.to(device, non_blocking=non_blocking)
            if moved.dtype == torch.uint8:
                moved = float_frames(moved, torch.empty(moved.shape, dtype=dtype, device=moved.device), scale=scale)
            out[key] = moved
        else:
            out[key] = value
    return out
