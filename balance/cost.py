"""Per-window cost known before decoding, from the window index and the window spec.

A cost is a float64 number per training window (sample) that predicts how long the sample takes
on the accelerator (and, if wanted, in the loader), so that ``balance.assign`` can give every rank
of a data-parallel step the same amount of work. Everything here is vectorised over windows and
does no I/O: it reads the index arrays ``epishard.format.index.WindowIndex`` already holds in memory.

Three layers, each replaceable:

1. ``window_features(index, spec, episodes, anchors)`` -> ``WindowFeatures``: what a window
   is made of, per window (int64 ``[N]`` each): frames returned, frames a decoder decodes from the
   preceding keyframe, pixels returned, instruction tokens, action steps.
2. ``CostModel`` turns features into a float64 cost ``[N]``: user-settable linear weights plus an
   optional quadratic (attention) term and an optional user function of the features.
3. ``WindowCost`` binds indexes, spec and model into a cost function
   ``f(episode_ids, anchors) -> float64 [N]`` (the ``CostFn`` protocol). Any other callable with
   that signature may be used instead, e.g. costs from a profiler or a lookup table.

And one hook after decoding: ``sample_cost(model)`` computes the same features from a decoded
sample dict (a ``SampleCost``: ``f(sample) -> float``), and ``MeasuredCosts`` keeps measured costs
per episode so that a later epoch can be planned with them.

Units: frames and steps are counts; pixels are output pixels (height x width after the reader's
crop/resize, summed over returned frames; channels not counted); tokens are instruction tokens
from a user tokenizer or ``estimate_tokens`` (ceil(characters / 4)). Costs have whatever unit the
model's weights give them; the default model counts transformer sequence tokens.

Internal: import from ``epishard.balance``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

__all__ = [
    "CostFn",
    "CostModel",
    "MeasuredCosts",
    "SampleCost",
    "Tokenizer",
    "WindowCost",
    "WindowFeatures",
    "estimate_tokens",
    "sample_cost",
    "sample_features",
    "token_counts",
    "window_features",
]

Tokenizer = Callable[[str], "int | Sequence"]
"""``f(text) -> token count`` or ``-> tokens`` (anything with ``len``), e.g. ``lambda t: len(tok(t).input_ids)``."""


class CostFn(Protocol):
    """A per-window cost known before decoding.

    ``episodes``: int64 ``[N]`` global episode numbers (as ``WindowDataset`` numbers them: the
    datasets' episodes one after the other); ``anchors``: int64 ``[N]`` anchor rows.
    Returns float64 ``[N]``, finite and >= 0.
    """

    def __call__(self, episodes: np.ndarray, anchors: np.ndarray) -> np.ndarray:
        """float64 ``[N]`` costs of the windows ``(episodes[i], anchors[i])``."""
        ...


SampleCost = Callable[[dict], float]
"""A measured cost of one decoded sample (a ``WindowDataset`` sample dict)."""


def estimate_tokens(text: str) -> int:
    """Instruction length in tokens without a tokenizer: ``ceil(len(text) / 4)`` characters.

    The common rule of thumb for English with byte-pair-encoding tokenizers (about 4 characters per
    token; e.g. "pick the pear from the counter and place it in the plate", 56 characters -> 14;
    the Llama-3 tokenizer gives 12 for it). Pass a real tokenizer to ``token_counts`` for exact numbers.
    """
    return math.ceil(len(text) / 4)


def token_counts(texts: Sequence[str], tokenizer: Tokenizer | None = None) -> np.ndarray:
    """Tokens of each text (int64 ``[len(texts)]``); each distinct text is tokenised once.

    ``tokenizer``: returns a count or a sequence of tokens; ``None`` uses ``estimate_tokens``.
    """
    count = estimate_tokens if tokenizer is None else (lambda t: _as_count(tokenizer(t)))
    cache: dict[str, int] = {}
    out = np.empty(len(texts), dtype=np.int64)
    for i, t in enumerate(texts):
        t = t or ""
        if t not in cache:
            cache[t] = int(count(t))
        out[i] = cache[t]
    return out


def _as_count(result) -> int:
    return int(result) if isinstance(result, (int, np.integer)) else len(result)


@dataclass(frozen=True)
class WindowFeatures:
    """What each of ``N`` windows is made of (int64 ``[N]`` each).

    ``frames``: frames returned, all cameras together (``sum(len(offsets))``; pad-mode clamped
    frames count, they are in the tensor). ``decoded``: frames a decoder decodes to return them,
    per camera from the keyframe at or before its first frame (``WindowIndex.decoded_frames``),
    summed over cameras. This is the cost of the window read alone; the reader decodes the union
    of all windows of an episode once, so its real per-window decode cost is this amortised over
    the episode's windows (an upper bound here). ``pixels``: output pixels returned (height x width
    of each returned frame after crop/resize, summed). ``tokens``: instruction tokens.
    ``action``: action steps returned (``spec.action_horizon``, 0 without an action key).
    ``per_camera``: camera -> ``{"frames", "decoded", "pixels"}``, the same per camera (one
    dataset only: empty after ``concat``).
    """

    frames: np.ndarray
    decoded: np.ndarray
    pixels: np.ndarray
    tokens: np.ndarray
    action: np.ndarray
    per_camera: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.frames.shape[0])

    @classmethod
    def concat(cls, parts: list[WindowFeatures], order: np.ndarray | None = None) -> WindowFeatures:
        """Windows of several parts one after the other; ``order`` (int64 ``[N]``) then picks them."""

        def cat(name: str) -> np.ndarray:
            joined = np.concatenate([getattr(p, name) for p in parts])
            return joined if order is None else joined[order]

        return cls(
            frames=cat("frames"),
            decoded=cat("decoded"),
            pixels=cat("pixels"),
            tokens=cat("tokens"),
            action=cat("action"),
        )


def window_features(
    index,
    spec,
    episodes: np.ndarray,
    anchors: np.ndarray,
    *,
    postprocess=None,
    tokenizer: Tokenizer | None = None,
    task_tokens: np.ndarray | None = None,
) -> WindowFeatures:
    """Features of windows ``(episodes[i], anchors[i])`` of one dataset, no I/O.

    Args:
        index: the dataset's ``WindowIndex``.
        spec: the ``stream.WindowSpec`` (camera offsets, action horizon; pad-mode rows are clamped
            to the anchor's recording segment the way the reader clamps them).
        episodes, anchors: int64 ``[N]``: episode numbers in this index and anchor rows.
        postprocess: anything with ``output_shape(c, h, w) -> (c, h, w)`` (``stream.PostProcess``)
            for the output pixel count; ``None``: the stored video size.
        tokenizer: see ``token_counts``; ignored when ``task_tokens`` (int64 ``[num_episodes]``) is given.

    Raises:
        KeyError: the spec names a camera the dataset lacks, or an episode lacks a camera.
    """
    episodes = np.asarray(episodes, dtype=np.int64)
    anchors = np.asarray(anchors, dtype=np.int64)
    n = episodes.shape[0]
    available = sorted(set(index.cam_names.to_pylist()))
    if task_tokens is None:
        task_tokens = token_counts(index.tasks(), tokenizer)
    # Rows are clamped into the anchor's recording segment, as the reader clamps them.
    seg_lo, seg_hi = index.segment_bounds(episodes, anchors)
    total = {k: np.zeros(n, dtype=np.int64) for k in ("frames", "decoded", "pixels")}
    per_camera = {}
    for cam, offsets in spec.camera_offsets(available).items():
        streams = index.camera_streams(cam, episodes)
        rows = np.clip(anchors[:, None] + np.sort(offsets)[None, :], seg_lo[:, None], (seg_hi - 1)[:, None])
        frames = np.sort(index.frames(streams[:, None], rows), axis=1)
        decoded = index.decoded_frames(streams, frames)
        h, w = index.cam_height[streams].astype(np.int64), index.cam_width[streams].astype(np.int64)
        if postprocess is not None:  # output size per distinct stored size
            stored, which = np.unique(np.stack([h, w], 1), axis=0, return_inverse=True)
            out = np.array(
                [postprocess.output_shape(3, int(a), int(b))[1:] for a, b in stored], dtype=np.int64
            ).reshape(-1, 2)
            h, w = out[which.ravel(), 0], out[which.ravel(), 1]
        cam_frames = np.full(n, offsets.size, dtype=np.int64)
        part = {"frames": cam_frames, "decoded": decoded.astype(np.int64), "pixels": cam_frames * h * w}
        per_camera[cam] = part
        for k in total:
            total[k] += part[k]
    horizon = spec.action_horizon if spec.action_key else 0
    return WindowFeatures(
        frames=total["frames"],
        decoded=total["decoded"],
        pixels=total["pixels"],
        tokens=np.asarray(task_tokens, dtype=np.int64)[episodes],
        action=np.full(n, horizon, dtype=np.int64),
        per_camera=per_camera,
    )


@dataclass(frozen=True)
class CostModel:
    """Cost of a window from its features: a weighted sum plus an optional non-linear term.

    ``cost = constant + per_frame*frames + per_decoded_frame*decoded + per_pixel*pixels
    + per_token*tokens + per_vision_token*vision_tokens + per_action_step*action
    + quadratic*sequence**2 (+ extra(features))``

    where ``vision_tokens = pixels / pixels_per_token`` (a ViT with 14x14 patches: 196 pixels per
    token, 256 tokens for a 224x224 frame) and ``sequence = tokens + vision_tokens + action`` is the
    transformer sequence length of the sample (one token per action step).

    Default: ``cost = sequence`` (the linear compute of a transformer, in tokens).
    ``CostModel.transformer(d)`` adds attention: per token a dense transformer spends about
    ``24 d^2`` FLOPs per layer in matmuls and ``2 L d`` in attention over a context of ``L``
    (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", Table 1: ``C_forward = 2N +
    2 n_layer n_ctx d_attn`` with ``N = 12 n_layer d^2``), so a sample of ``L`` tokens costs
    ``L + L^2 / (12 d)`` in units of one token's matmul compute.
    Loader-side terms (``per_decoded_frame``, ``per_frame``, ``per_pixel``) are 0 by default: set
    them (or use ``CostModel.decode()``) to balance decode work instead of accelerator work.
    """

    constant: float = 0.0
    per_frame: float = 0.0
    per_decoded_frame: float = 0.0
    per_pixel: float = 0.0
    per_token: float = 1.0
    per_vision_token: float = 1.0
    per_action_step: float = 1.0
    quadratic: float = 0.0
    pixels_per_token: float = 196.0
    extra: Callable[[WindowFeatures], np.ndarray] | None = None

    @classmethod
    def transformer(cls, d_model: int, **kw) -> CostModel:
        """Sequence tokens plus attention for hidden size ``d_model`` (``quadratic = 1 / (12 d)``)."""
        return cls(quadratic=1.0 / (12.0 * d_model), **kw)

    @classmethod
    def decode(cls, **kw) -> CostModel:
        """Loader-side cost: frames decoded from the preceding keyframe, nothing else."""
        return cls(per_token=0.0, per_vision_token=0.0, per_action_step=0.0, per_decoded_frame=1.0, **kw)

    def sequence(self, f: WindowFeatures) -> np.ndarray:
        """Transformer sequence length (float64 ``[N]``): instruction + vision + action tokens."""
        return f.tokens + f.pixels / self.pixels_per_token + f.action

    def __call__(self, f: WindowFeatures) -> np.ndarray:
        """float64 ``[N]`` costs."""
        cost = (
            self.constant
            + self.per_frame * f.frames
            + self.per_decoded_frame * f.decoded
            + self.per_pixel * f.pixels
            + self.per_token * f.tokens
            + self.per_vision_token * (f.pixels / self.pixels_per_token)
            + self.per_action_step * f.action
        )
        cost = np.asarray(cost, dtype=np.float64)
        if self.quadratic:
            cost = cost + self.quadratic * self.sequence(f) ** 2
        if self.extra is not None:
            cost = cost + np.asarray(self.extra(f), dtype=np.float64)
        return cost


class WindowCost:
    """A ``CostFn`` over one or more datasets: ``WindowCost(indexes, spec)(episodes, anchors)``.

    Args:
        indexes: a ``WindowIndex`` or a list of them; global episode ``g`` is episode
            ``g - base[d]`` of dataset ``d`` where ``base`` are the cumulative episode counts (the
            numbering ``WindowDataset`` plans with).
        spec: ``stream.WindowSpec``, or a list with one spec per index (datasets mixed with
            different window shapes).
        model: ``CostModel`` (or any ``f(WindowFeatures) -> float64 [N]``).
        postprocess: output size of frames (``stream.PostProcess``), ``None`` for the stored size.
        tokenizer: instruction tokenizer; ``None``: ``estimate_tokens``. Each task text is
            tokenised once, here.
    """

    def __init__(
        self,
        indexes,
        spec,
        model: Callable[[WindowFeatures], np.ndarray] | None = None,
        *,
        postprocess=None,
        tokenizer: Tokenizer | None = None,
    ):
        self.indexes = list(indexes) if isinstance(indexes, (list, tuple)) else [indexes]
        self.specs = list(spec) if isinstance(spec, (list, tuple)) else [spec] * len(self.indexes)
        if len(self.specs) != len(self.indexes):
            raise ValueError(f"{len(self.specs)} specs for {len(self.indexes)} indexes")
        self.model = model if model is not None else CostModel()
        self.postprocess = postprocess
        self.base = np.cumsum([0] + [ix.num_episodes for ix in self.indexes]).astype(np.int64)
        self.task_tokens = [token_counts(ix.tasks(), tokenizer) for ix in self.indexes]

    @classmethod
    def from_dataset(cls, dataset, model=None, *, tokenizer: Tokenizer | None = None) -> WindowCost:
        """For a ``stream.WindowDataset``: its indexes, spec and post-processing.

        For a ``stream.WindowDataset``: its indexes, spec and post-processing. In a mix each dataset's
        spec names the cameras it decodes, under its own keys (``camera_map``; a camera it lacks is
        padding and costs nothing to decode).
        """
        specs = [
            dataclasses.replace(dataset.spec, cameras={c: tuple(o.tolist()) for c, o in offsets.items()})
            for offsets in dataset.cam_offsets
        ]
        return cls([s.index for s in dataset.sources], specs, model, postprocess=dataset.post, tokenizer=tokenizer)

    def features(self, episodes: np.ndarray, anchors: np.ndarray) -> WindowFeatures:
        """``WindowFeatures`` of the windows, in the given order."""
        episodes = np.asarray(episodes, dtype=np.int64)
        anchors = np.asarray(anchors, dtype=np.int64)
        if episodes.size and (episodes.min() < 0 or episodes.max() >= self.base[-1]):
            raise IndexError(f"episode numbers must lie in [0, {int(self.base[-1])})")
        dataset = np.searchsorted(self.base, episodes, side="right") - 1
        parts, positions = [], []
        for d, ix in enumerate(self.indexes):
            pick = np.flatnonzero(dataset == d)
            parts.append(
                window_features(
                    ix,
                    self.specs[d],
                    episodes[pick] - self.base[d],
                    anchors[pick],
                    postprocess=self.postprocess,
                    task_tokens=self.task_tokens[d],
                )
            )
            positions.append(pick)
        inverse = np.empty(episodes.size, dtype=np.int64)
        inverse[np.concatenate(positions)] = np.arange(episodes.size)
        return WindowFeatures.concat(parts, inverse)

    def __call__(self, episodes: np.ndarray, anchors: np.ndarray) -> np.ndarray:
        """float64 ``[N]``: the cost model applied to the windows' features (``features``)."""
        return np.asarray(self.model(self.features(episodes, anchors)), dtype=np.float64)


def sample_features(sample: dict, tokenizer: Tokenizer | None = None, action_key: str = "action") -> WindowFeatures:
    """Features of one decoded sample (a ``WindowDataset`` sample dict), as ``[1]`` arrays.

    Cameras are the keys with a ``<key>_is_pad`` companion holding a ``[T, C, H, W]`` tensor;
    pixels are ``T*H*W`` of what was returned. ``decoded`` is unknown after the fact and set to
    ``frames`` (a lower bound).
    """
    frames = pixels = 0
    for key, value in sample.items():
        if f"{key}_is_pad" in sample and key != action_key and getattr(value, "ndim", 0) == 4:
            t, _, h, w = value.shape
            frames += int(t)
            pixels += int(t) * int(h) * int(w)
    tokens = token_counts([str(sample.get("task", ""))], tokenizer)
    action = int(sample[action_key].shape[0]) if action_key in sample else 0

    def one(v: int) -> np.ndarray:
        return np.array([v], dtype=np.int64)

    return WindowFeatures(
        frames=one(frames), decoded=one(frames), pixels=one(pixels), tokens=tokens, action=one(action)
    )


def sample_cost(
    model: Callable[[WindowFeatures], np.ndarray] | None = None, tokenizer: Tokenizer | None = None
) -> SampleCost:
    """A ``SampleCost``: the model applied to the features of a decoded sample (``sample_features``).

    Use it when the cost is only known after decoding (a processor that tiles images by their
    content, a chat template around the instruction), or to check the index-based prediction.
    """
    model = model if model is not None else CostModel()
    return lambda sample: float(np.asarray(model(sample_features(sample, tokenizer)))[0])


class MeasuredCosts:
    """Costs measured during an epoch, kept per episode, used as a ``CostFn`` for later epochs.

    ``record(episodes, anchors, costs)`` adds measurements (global episode numbers, anchor rows,
    float64 costs, e.g. from a ``SampleCost`` or a per-sample timer). ``__call__(episodes,
    anchors)`` returns the episode's mean measured cost where one was recorded, else
    ``fallback``'s prediction scaled by ``sum(measured) / sum(predicted)`` over the recorded
    windows, so both kinds of cost share one scale. Pure numpy; no I/O.
    """

    def __init__(self, fallback: CostFn, num_episodes: int):
        self.fallback = fallback
        self.total = np.zeros(num_episodes, dtype=np.float64)
        self.count = np.zeros(num_episodes, dtype=np.int64)
        self.predicted = 0.0

    def record(self, episodes: np.ndarray, anchors: np.ndarray, costs: np.ndarray) -> None:
        """Add measured ``costs`` (float64 ``[N]``) of the windows ``(episodes[i], anchors[i])``."""
        episodes = np.asarray(episodes, dtype=np.int64)
        np.add.at(self.total, episodes, np.asarray(costs, dtype=np.float64))
        np.add.at(self.count, episodes, 1)
        self.predicted += float(np.sum(self.fallback(episodes, np.asarray(anchors, dtype=np.int64))))

    def __call__(self, episodes: np.ndarray, anchors: np.ndarray) -> np.ndarray:
        """float64 ``[N]``: measured mean per episode where recorded, else the scaled prediction."""
        episodes = np.asarray(episodes, dtype=np.int64)
        predicted = np.asarray(self.fallback(episodes, anchors), dtype=np.float64)
        scale = self.total.sum() / self.predicted if self.predicted > 0 else 1.0
        seen = self.count[episodes] > 0
        mean = np.divide(self.total[episodes], np.maximum(self.count[episodes], 1))
        return np.where(seen, mean, predicted * scale)
