"""Merged frame-list decoding: one decoder and one ``get_frames_at`` call per (episode, camera).

The decoder is opened from the member's bytes in memory with torchcodec's
``custom_frame_mappings`` built from the index (pts, durations, keyframes) and the stream the index
names (``epishard.format.decoder.open_decoder``, the decoder the writer checked every frame against), so
opening does not rescan the file and seeking stays frame-exact. Every returned frame's pts is
compared with the index: a frame the table does not vouch for is an error, never a sample.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass

import av
import numpy as np
import torch

# Imported here, not at the first decode: DataLoader workers forked after this inherit it, where each
# would otherwise pay its 2-5 s import (it loads torch._dynamo) before its first batch.
import torchcodec.decoders  # noqa: F401

from epishard.format.decoder import frame_stream, open_decoder

from .usercode import from_user_code

__all__ = ["DecodeError", "Decoded", "decode", "decode_depth"]


class DecodeError(RuntimeError):
    """A video member did not decode; the message names the episode key and camera."""


@dataclass(frozen=True)
class Decoded:
    """What ``decode``/``decode_depth`` return.

    ``frames`` (``[N, C, h, w]`` after post-processing:
    uint8 RGB, or uint16 ``C == 1`` depth), ``calls`` (decoder calls made: ``get_frames_at`` calls,
    or seeks for depth), ``post_s`` (seconds spent in post-processing) and the torchcodec
    ``decoder`` used (None for depth), which a caller may keep and pass again: asked next for
    later frames of the same keyframe group, it decodes on from where it stopped instead of
    seeking back to the keyframe.
    """

    frames: torch.Tensor
    calls: int
    post_s: float
    decoder: object = None


def decode(
    data: bytes,
    frames: np.ndarray,
    tables: tuple[np.ndarray, np.ndarray, np.ndarray],
    *,
    where: str,
    stream_index: int | None = None,
    time_base: float = 0.0,
    post=None,
    max_bytes: int = 256 << 20,
    height: int = 0,
    width: int = 0,
    decoder=None,
    rotation: int = 0,
) -> Decoded:
    """Decode ``frames`` (sorted unique int64 frame numbers) of one video with one decoder.

    ``tables``: (pts, duration, keyframe flags) of the stream (``WindowIndex.frame_tables``);
    ``stream_index``: the stream they describe (None or -1: FFmpeg's best video stream);
    ``time_base``: seconds per pts tick; when given, each decoded frame's pts must equal the table's.

    One ``get_frames_at`` call takes them all, unless the decoded RGB frames (``height x width x 3``
    bytes each) would exceed ``max_bytes``: then consecutive calls of at most that many bytes on the
    same decoder, each post-processed before the next, bound the memory of long high-resolution
    episodes. ``post`` (a ``PostProcess``) runs on the decoded frames only. ``decoder``: one this
    function returned before for the same ``data`` and ``tables`` (None: open one). ``rotation``:
    the stream's display-matrix degrees (the index's; refused where torchcodec would not apply it).

    Returns:
        ``Decoded``: frames ``[len(frames), C, h, w]`` after ``post``, ``get_frames_at`` calls made,
        seconds spent in ``post``.

    Raises:
        DecodeError: torchcodec failed, or returned a frame whose pts is not the table's; ``where``
            (episode key and camera) is in the message.
    """
    pts = tables[0]
    per_call = max(1, max_bytes // max(3 * height * width, 1)) if height and width else frames.size
    parts, post_s = [], 0.0
    try:
        decoder = decoder if decoder is not None else open_decoder(data, *tables, stream_index, rotation)
        for start in range(0, frames.size, per_call):
            wanted = frames[start : start + per_call]
            out = decoder.get_frames_at(wanted.tolist())
            batch = out.data
            if time_base:
                got = np.rint(out.pts_seconds.double().numpy() / time_base).astype(np.int64)
                bad = np.flatnonzero(got != pts[wanted])
                if bad.size:
                    f = int(wanted[bad[0]])
                    raise DecodeError(
                        f"{where}: frame {f} should have pts {pts[f]}, the decoder returned pts {got[bad[0]]}"
                    )
            t = time.perf_counter()
            parts.append(post(batch) if post is not None else batch)
            post_s += time.perf_counter() - t
    except DecodeError:
        raise
    except Exception as exc:  # torchcodec raises RuntimeError/ValueError/IndexError by case
        if from_user_code(exc):  # the post-processing hook's: the caller's, not a damaged video
            raise
        raise DecodeError(f"{where}: decoding frames {frames[:8].tolist()}... failed: {exc}") from exc
    out = parts[0] if len(parts) == 1 else torch.cat(parts)
    return Decoded(out, len(parts), post_s, decoder)


def decode_depth(
    data: bytes,
    frames: np.ndarray,
    pts: np.ndarray,
    keyframes: np.ndarray,
    *,
    where: str,
    stream_index: int | None = None,
    post=None,
) -> Decoded:
    """Decode ``frames`` (sorted unique int64 frame numbers) of a grey (depth) video at full precision.

    torchcodec returns RGB only, so PyAV decodes here: it seeks to the keyframe at or before each
    run of wanted frames and decodes forward, jumping again when the next wanted frame lies past
    another keyframe. Frames are identified by pts against the index's table (``pts``: int64
    ``[num_frames]``, presentation order; ``keyframes``: int64 ascending frame numbers), so frame
    numbers match the RGB path. Samples are returned as stored (a 12-bit code stays 0..4095).
    ``stream_index``: the stream the index describes (None or -1: FFmpeg's best video stream that is
    not an attached picture, the writer's rule).

    Returns:
        ``Decoded``: uint16 frames ``[len(frames), 1, h, w]`` after ``post``, seeks made (``calls``),
        seconds in ``post``.

    Raises:
        DecodeError: PyAV failed, or a wanted frame never came out of the decoder; ``where``
            (episode key and camera) is in the message.
    """
    wanted = {int(pts[f]): i for i, f in enumerate(frames.tolist())}
    out: list = [None] * frames.size
    seeks, i = 0, 0
    try:
        with av.open(io.BytesIO(data), "r") as container:
            stream = frame_stream(container, stream_index)
            stream.thread_count = 1
            while i < frames.size:
                key = int(keyframes[np.searchsorted(keyframes, frames[i], side="right") - 1])
                container.seek(int(pts[key]), stream=stream, backward=True)
                seeks += 1
                for frame in container.decode(stream):
                    j = wanted.get(frame.pts)
                    if j is not None and out[j] is None:
                        out[j] = frame.to_ndarray()  # grey formats: one plane of raw samples
                    while i < frames.size and out[i] is not None:
                        i += 1
                    if i == frames.size:
                        break
                    # A keyframe past the decoder's position and at or before the next wanted frame:
                    # seeking there is cheaper than decoding on.
                    shown = int(np.searchsorted(pts, frame.pts)) if frame.pts is not None else -1
                    next_key = int(keyframes[np.searchsorted(keyframes, frames[i], side="right") - 1])
                    if next_key != key and next_key > shown + 1:
                        break
                else:
                    if i < frames.size:
                        raise DecodeError(
                            f"{where}: frame {int(frames[i])} (pts {int(pts[frames[i]])}) not found in the depth video"
                        )
    except DecodeError:
        raise
    except Exception as exc:  # PyAV raises FFmpegError/ValueError by case
        raise DecodeError(f"{where}: decoding depth frames {frames[:8].tolist()}... failed: {exc}") from exc
    batch = torch.from_numpy(np.stack(out).astype(np.uint16, copy=False)[:, None])
    t = time.perf_counter()
    batch = post(batch) if post is not None else batch
    return Decoded(batch, seeks, time.perf_counter() - t)
