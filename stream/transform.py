"""Per-frame post-processing, applied only to the frames that were decoded for some window.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .usercode import UserCodeError, call_user, describe

__all__ = ["PostProcess"]


@dataclass(frozen=True)
class PostProcess:
    """Post-processing of decoded frames, in this order: crop, resize, user hook, dtype and scale.

    Args:
        crop: ``(top, left, height, width)`` in source pixels, or None.
        size: output ``(height, width)``; bilinear with antialiasing, or None to keep.
        dtype: ``torch.uint8`` (default, values 0..255) or a float dtype.
        scale: with a float dtype, divide by 255 so values lie in [0, 1] (LeRobot's convention).
        hook: ``f(frames) -> frames`` on a uint8 ``[N, C, H, W]`` tensor, before the dtype
            conversion; runs once per decoded frame, never per window. It must return uint8
            ``[N, C, h, w]`` (the same frames and channels; ``UserCodeError`` otherwise). An exception
            it raises is the caller's, never a damaged episode: it reaches the caller with its own
            type and traceback (through a DataLoader worker too), whatever ``on_shard_error`` says.

    Depth cameras go through ``prepare_depth`` only (crop, nearest resize): no hook, no dtype change.
    """

    crop: tuple[int, int, int, int] | None = None
    size: tuple[int, int] | None = None
    dtype: torch.dtype = torch.uint8
    scale: bool = True
    hook: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __call__(self, frames: torch.Tensor) -> torch.Tensor:
        """``frames``: uint8 ``[N, C, H, W]`` -> ``[N, C, h, w]`` of ``dtype``."""
        return self.finish(self.prepare(frames))

    @property
    def prepares_nothing(self) -> bool:
        """True when ``prepare`` only makes frames contiguous (no crop, resize or hook)."""
        return self.crop is None and self.size is None and self.hook is None

    def prepare(self, frames: torch.Tensor) -> torch.Tensor:
        """Crop, resize and hook: uint8 ``[N, C, H, W]`` -> uint8 ``[N, C, h, w]`` (contiguous).

        The reader keeps decoded frames in this form and applies ``finish`` to the frames of each
        window (or, under ``WindowLoader``, while collating), so float output never converts
        frames that no window returns, nor writes them twice.
        """
        if self.crop is not None:
            top, left, h, w = self.crop
            frames = frames[:, :, top : top + h, left : left + w]
        if self.size is not None and tuple(frames.shape[-2:]) != tuple(self.size):
            # torch's uint8 antialiased bilinear kernel on channels-last input is ~10x faster than
            # going through float32 and rounds to within 1 of it.
            frames = torch.nn.functional.interpolate(
                frames.contiguous(memory_format=torch.channels_last), size=self.size, mode="bilinear", antialias=True
            )
        if self.hook is not None:
            frames = self._run_hook(frames)
        return frames.contiguous()

    def _run_hook(self, frames: torch.Tensor) -> torch.Tensor:
        """``hook(frames)``, its exception marked as the user's (``stream.usercode``) and its output checked.

        Raises:
            Exception: whatever the hook raises, unchanged (with a note naming the hook).
            UserCodeError: the hook returned no tensor, another dtype than uint8, or another number
                of frames or channels (``[N, C, h, w]`` of the frames given).
        """
        hook = self.hook
        assert hook is not None
        what = f"PostProcess.hook {describe(hook)}"
        out = call_user(what, hook, frames)
        shaped = isinstance(out, torch.Tensor) and out.dim() == 4 and out.shape[:2] == frames.shape[:2]
        if not shaped or out.dtype != torch.uint8:
            got = f"{out.dtype} {list(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
            raise UserCodeError(
                f"{what} returned {got}; it must return uint8 [N, C, h, w] with the N={frames.shape[0]} frames and "
                f"C={frames.shape[1]} channels it was given ({list(frames.shape)})",
                what,
            )
        return out

    def prepare_depth(self, frames: torch.Tensor) -> torch.Tensor:
        """Crop and resize of depth frames: uint16 ``[N, 1, H, W]`` -> uint16 ``[N, 1, h, w]``.

        Resizing is nearest-neighbour (PyTorch's ``nearest-exact`` sampling positions), so every
        output pixel is one stored depth sample, never a blend of a foreground and a background
        depth. The hook and ``finish`` (dtype, /255 scaling) are not applied: depth stays uint16 in
        the stored units, and float conversion with a depth scale is left to the user.
        """
        if self.crop is not None:
            top, left, h, w = self.crop
            frames = frames[:, :, top : top + h, left : left + w]
        if self.size is not None and tuple(frames.shape[-2:]) != tuple(self.size):
            (h, w), (oh, ow) = frames.shape[-2:], self.size
            rows = ((torch.arange(oh) + 0.5) * (h / oh)).floor().long().clamp_(max=h - 1)
            cols = ((torch.arange(ow) + 0.5) * (w / ow)).floor().long().clamp_(max=w - 1)
            frames = frames.index_select(2, rows).index_select(3, cols)
        return frames.contiguous()

    def finish(self, frames: torch.Tensor) -> torch.Tensor:
        """Dtype conversion and scaling of prepared frames."""
        if frames.dtype == self.dtype:
            return frames
        frames = frames.to(self.dtype)
        if self.scale and self.dtype.is_floating_point:
            frames.mul_(1.0 / 255.0)  # in place: no second full-size float tensor
        return frames

    def output_shape(self, channels: int, height: int, width: int) -> tuple[int, int, int]:
        """Shape ``(C, h, w)`` of one output frame for a source of the given size (without the hook)."""
        if self.crop is not None:
            height, width = self.crop[2], self.crop[3]
        if self.size is not None:
            height, width = self.size
        return channels, height, width
