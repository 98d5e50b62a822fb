"""LeRobot's own training script (``lerobot-train``) on epishard shards: only its dataset line differs.

This runs LeRobot's ``lerobot.scripts.lerobot_train`` unchanged, with the one call that builds the
dataset (``make_dataset(cfg)`` in 0.4.4, ``make_train_eval_datasets(cfg)`` in 0.6.1) replaced by
``make_epishard_datasets`` below: an ``EpishardLeRobotDataset`` over ``--dataset.root`` (a folder or
any fsspec URL of ``epishard convert``'s output), built the way LeRobot's factory builds a
``LeRobotDataset`` (LeRobot's ``resolve_delta_timestamps`` from the policy config, its
``ImageTransforms``, ImageNet camera statistics when ``--dataset.use_imagenet_stats``). Every field of
LeRobot's ``DatasetConfig`` is honoured or refused with a message (``DATASET_FIELDS``): ``episodes``,
0.6.x's ``eval_split`` (its per-task held-out split, an eval dataset) and ``return_uint8`` are honoured,
a ``revision``, another ``video_backend`` or a field this script does not know stop the run.
Everything else, policy, processors, optimizer, accelerate, logging, checkpoints, is LeRobot's code.
Under ``accelerate launch`` with several processes the main process reads each window of an epoch
once and accelerate hands each process its slice of every batch (its default for an iterable
dataset). ``--resume=true`` restarts the data stream from the start of the plan, as LeRobot's
streaming dataset does; exact mid-epoch resume needs ``WindowLoader`` in your own loop.

    python tools/examples/train_lerobot.py --dataset.repo_id=epishard --dataset.root=s3://shards/so101 \\
        --dataset.streaming=true --policy.type=act --policy.device=cuda --policy.push_to_hub=false \\
        --output_dir=out/act --steps=100000 --batch_size=8 --num_workers=4

Needs a Python with lerobot and epishard (``pip install epishard`` into LeRobot's environment, or
``PYTHONPATH=<this checkout>``). ``--dataset.streaming=true`` is required: the dataset is iterable
(the plan shuffles), so the DataLoader takes no ``shuffle``/``sampler``. LeRobot 0.4.4's script
builds an ``EpisodeAwareSampler`` for policies with ``drop_n_last_frames`` (Diffusion) even when
streaming, which a DataLoader refuses for any iterable dataset (LeRobot's own
``StreamingLeRobotDataset`` too); 0.6.1's does not. epishard's own options, taken off the command
line before LeRobot parses it:

    --epishard.image_size=HxW        resize every camera (default: as stored)
    --epishard.stats=source|manifest the statistics LeRobot normalises with (default: source, LeRobot's)
    --epishard.storage_options=JSON  fsspec options for the shards' URL
    --epishard.cameras=A,B           the cameras to train on (default: all; one for VQ-BeT)
"""

from __future__ import annotations

import json
import sys


def _take_epishard_options(argv: list[str]) -> tuple[dict, list[str]]:
    """``--epishard.KEY=VALUE`` options as the drop-in's keyword arguments, and the rest of ``argv``.

    Raises:
        SystemExit: an unknown ``--epishard.`` option or a bad value (naming it).
    """
    kw: dict = {}
    rest = []
    for arg in argv:
        if not arg.startswith("--epishard."):
            rest.append(arg)
            continue
        key, _, value = arg[len("--epishard.") :].partition("=")
        if key == "image_size":
            h, _, w = value.partition("x")
            if not (h.isdigit() and w.isdigit()):
                raise SystemExit(f"--epishard.image_size={value}: give HxW, e.g. 96x96")
            kw["image_size"] = (int(h), int(w))
        elif key == "stats":
            kw["stats"] = value
        elif key == "storage_options":
            kw["storage_options"] = json.loads(value)
        elif key == "cameras":
            kw["cameras"] = [c for c in value.split(",") if c]
        else:
            raise SystemExit(f"unknown option --epishard.{key} (image_size, stats, storage_options, cameras)")
    return kw, rest


def _eval_split(meta, fraction: float, only: list[int] | None = None) -> tuple[list[int], list[int]]:
    """LeRobot 0.6.1's ``eval_split``: per task (an episode's first task), its last ``ceil(n * fraction)``
    episodes are held out for evaluation (``lerobot.datasets.factory.make_train_eval_datasets``), of
    the episodes ``only`` (``--dataset.episodes``; None: all, in the dataset's order).

    Returns (train episode_index values, eval episode_index values).

    Raises:
        SystemExit: the split leaves no training episode (LeRobot's check).
    """
    import math

    by_task: dict[str, list[int]] = {}
    tasks = dict(zip(meta.episodes["episode_index"].tolist(), meta.episodes["tasks"], strict=True))
    for e in meta.episodes["episode_index"].tolist() if only is None else only:
        texts = tasks.get(int(e)) or [""]
        by_task.setdefault(texts[0], []).append(int(e))
    train, held = [], []
    for episodes in by_task.values():
        n = math.ceil(len(episodes) * fraction)
        train += episodes[: len(episodes) - n]
        held += episodes[len(episodes) - n :]
    if not train:
        raise SystemExit(f"--dataset.eval_split={fraction} leaves 0 training episodes of {len(held)}")
    return train, held


# Every field of LeRobot's DatasetConfig (0.4.x and 0.6.x) -> what this script does with it. A field
# not listed here is refused (``make_epishard_datasets``), so a new LeRobot field is never silently ignored.
DATASET_FIELDS = {
    "repo_id": "a name only (one dataset; a list is refused): the shards are read from --dataset.root",
    "root": "the shards' folder or fsspec URL (required)",
    "repo_type": "'dataset' (0.6.x; 'bucket' refused)",
    "episodes": "honoured: EpishardLeRobotDataset(episodes=...), unknown episode indices refused",
    "image_transforms": "honoured: LeRobot's ImageTransforms on the training dataset",
    "revision": "None only (refused otherwise: shards hold the converted revision)",
    "use_imagenet_stats": "honoured: ImageNet statistics for the cameras (0.6.x: not depth cameras)",
    "video_backend": "'torchcodec' (epishard decodes with it; others refused)",
    "return_uint8": "0.6.x's make_dataset asks for uint8 always; so does this script under 0.6.x",
    "depth_output_unit": "refused for datasets with depth cameras under 0.6.x (stored units returned)",
    "streaming": "must be true (the dataset is iterable; its plan shuffles)",
    "eval_split": "honoured: LeRobot 0.6.x's per-task held-out split, an eval dataset of those episodes",
}


def make_epishard_datasets(cfg, options: dict | None = None, v061: bool = False):
    """LeRobot's ``make_dataset(cfg)`` (0.6.x: ``make_train_eval_datasets(cfg)``) for epishard shards at
    ``cfg.dataset.root``.

    ``cfg``: LeRobot's ``TrainPipelineConfig`` (or any object with its ``dataset``, ``policy``, ``seed``
    and ``tolerance_s``); ``options``: the ``--epishard.`` options; ``v061``: follow LeRobot 0.6.x's
    factory (uint8 frames, eval split, depth rules) rather than 0.4.x's.

    Returns:
        (training ``EpishardLeRobotDataset``, evaluation one or None).

    Raises:
        SystemExit: a config field this script cannot honour (naming it and why; ``DATASET_FIELDS``).
        ValueError: episodes the dataset does not hold (``EpishardLeRobotDataset``).
    """
    import dataclasses

    import torch
    from lerobot.datasets import factory  # what LeRobot's own make_dataset uses, in 0.4.x and 0.6.x alike

    from epishard.stream.lerobot_dataset import EpishardLeRobotDataset, EpishardLeRobotMeta
    from epishard.stream.options import Ranks, ReadOptions

    options = options or {}
    d = cfg.dataset
    unknown = sorted(f.name for f in dataclasses.fields(d) if f.name not in DATASET_FIELDS)
    if unknown:
        raise SystemExit(
            f"--dataset.{unknown[0]}: this LeRobot's dataset config has fields {unknown} that "
            "tools/examples/train_lerobot.py does not know; it refuses rather than ignore them"
        )
    if not d.root:
        raise SystemExit("give the shards' folder or URL as --dataset.root")
    if not d.streaming:
        raise SystemExit("add --dataset.streaming=true: the epishard dataset is iterable (its plan shuffles)")
    if getattr(d, "repo_type", "dataset") != "dataset":
        raise SystemExit(f"--dataset.repo_type={d.repo_type}: epishard reads the shards at --dataset.root")
    if not isinstance(d.repo_id, str):
        raise SystemExit(
            "--dataset.repo_id: one dataset (LeRobot's script takes one too); mix datasets in your own loop"
        )
    if d.revision is not None:
        raise SystemExit(
            f"--dataset.revision={d.revision}: the shards hold the revision that was converted; "
            "convert the one you want"
        )
    if d.video_backend not in (None, "torchcodec"):
        raise SystemExit(f"--dataset.video_backend={d.video_backend}: epishard decodes with torchcodec")
    meta = EpishardLeRobotMeta.open(
        d.root,
        cameras=options.get("cameras"),
        image_size=options.get("image_size"),
        stats=options.get("stats", "source"),
        storage_options=options.get("storage_options"),
    )
    if v061 and meta.depth_keys:
        raise SystemExit(
            f"--dataset.depth_output_unit={d.depth_output_unit}: the drop-in returns depth cameras "
            f"({meta.depth_keys}) in stored uint16 units, not LeRobot 0.6.x's rescaled depth: "
            "train them in your own loop"
        )
    delta = factory.resolve_delta_timestamps(getattr(cfg, "trainable_config", cfg.policy), meta)
    transforms = factory.ImageTransforms(d.image_transforms) if d.image_transforms.enable else None
    common = {
        "seed": cfg.seed or 0,
        "read": ReadOptions(storage_options=options.get("storage_options")),
        "tolerance_s": cfg.tolerance_s,
        "return_uint8": v061,  # 0.6.x's make_dataset asks for uint8 frames; its loop divides by 255
        # Under accelerate with several processes, the main process reads every window of the epoch
        # and accelerate hands each process its slice of each batch (its default for an iterable
        # dataset): each window once per epoch. Own loops read a share per rank (WindowLoader).
        "ranks": Ranks(0, 1),
        **{k: v for k, v in options.items() if k != "storage_options"},
    }
    episodes, held = d.episodes, None
    if getattr(d, "eval_split", 0.0):
        episodes, held = _eval_split(meta, d.eval_split, episodes)
    try:
        train = EpishardLeRobotDataset(d.root, delta, transforms, episodes=episodes, **common)
        evaluation = None if held is None else EpishardLeRobotDataset(d.root, delta, None, episodes=held, **common)
    except (KeyError, ValueError) as exc:  # episodes the shards do not hold, cameras they lack: one line
        raise SystemExit(f"{type(exc).__name__}: {exc}") from exc
    if d.use_imagenet_stats:  # as LeRobot's make_dataset does (0.6.x: not on depth cameras)
        for ds in (train, evaluation):
            for key in ds.meta.camera_keys if ds is not None else []:
                if v061 and key in ds.meta.depth_keys:
                    continue
                for name, value in factory.IMAGENET_STATS.items():
                    ds.meta.stats.setdefault(key, {})[name] = torch.tensor(value, dtype=torch.float32)
    return train, evaluation


def main() -> None:
    """Run LeRobot's ``lerobot-train`` with the dataset line replaced (see the module docstring)."""
    options, sys.argv[1:] = _take_epishard_options(sys.argv[1:])

    import lerobot.scripts.lerobot_train as lerobot_train

    v061 = hasattr(lerobot_train, "make_train_eval_datasets")  # LeRobot 0.6.x's script (else 0.4.x's)
    lerobot_train.make_dataset = lambda cfg: make_epishard_datasets(cfg, options, v061)[0]  # 0.4.x's dataset line
    if v061:  # LeRobot 0.6.x's
        lerobot_train.make_train_eval_datasets = lambda cfg: make_epishard_datasets(cfg, options, v061)
    lerobot_train.main()


if __name__ == "__main__":
    main()
