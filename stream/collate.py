"""Batching: ``default_collate``, with deferred float conversion of frames.

Frames kept as uint8 by the reader become float32 in [0, 1] while they are copied into the batch
(``PostProcess(dtype=torch.float32)`` deferred).

Converting up front would write every decoded frame as float32 (4x the bytes) and copy it again per
window; converting here writes float32 memory once, the batch itself (in shared memory inside a
DataLoader worker, as ``default_collate`` does). The values equal ``x.to(float32) / 255``.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import default_collate, get_worker_info


class FloatCollate:
    """Collate for a ``WindowDataset`` whose float conversion is deferred.

    ``keys``: the camera keys to convert; ``dtype``: the float dtype; ``scale``: divide by 255.
    """

    def __init__(self, keys: list[str], dtype: torch.dtype = torch.float32, scale: bool = True):
        self.keys, self.dtype, self.scale = list(keys), dtype, scale

    def __call__(self, samples: list[dict]) -> dict:
        """``default_collate`` of ``samples``, the ``keys`` frames converted while copied in."""
        batch = default_collate([{k: v for k, v in s.items() if k not in self.keys} for s in samples])
        for key in self.keys:
            shape = (len(samples), *samples[0][key].shape)
            if get_worker_info() is not None:  # straight into shared memory: no copy on the way out
                elem = torch.empty(0, dtype=self.dtype)
                out = elem.new(elem._typed_storage()._new_shared(math.prod(shape), device=elem.device)).resize_(shape)
            else:
                out = torch.empty(shape, dtype=self.dtype)
            for i, sample in enumerate(samples):
                out[i].copy_(sample[key])
            if self.scale:
                out.mul_(1.0 / 255.0)
            batch[key] = out
        return batch
