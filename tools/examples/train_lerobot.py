"""LeRobot's own training script (``lerobot-train``) on epishard shards: only its dataset line differs.

This runs LeRobot's ``lerobot.scripts.lerobot_train`` unchanged, with the one call that builds the
dataset (``make_dataset(cfg)`` in 0.4.4, ``make_train_eval_datasets(cfg)`` in 0.6.1) replaced by
``make_epishard_dataset`` below: an ``EpishardLeRobotDataset`` over ``--dataset.root`` (a folder or
any fsspec URL of ``epishard convert``'s output), built the way LeRobot's ``make_dataset`` builds a
``LeRobotDataset`` (LeRobot's ``resolve_delta_timestamps`` from the policy config, its
``ImageTransforms``, ImageNet camera statistics when ``--dataset.use_imagenet_stats``). Everything else,
policy, processors, optimizer, accelerate, logging, checkpoints, is LeRobot's code.

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
        else:
            raise SystemExit(f"unknown option --epishard.{key} (image_size, stats, storage_options)")
    return kw, rest


def main() -> None:
    """Run LeRobot's ``lerobot-train`` with the dataset line replaced (see the module docstring)."""
    options, sys.argv[1:] = _take_epishard_options(sys.argv[1:])

    import lerobot.scripts.lerobot_train as lerobot_train
    import torch
    from lerobot.datasets.factory import IMAGENET_STATS, resolve_delta_timestamps
    from lerobot.datasets.transforms import ImageTransforms

    from epishard.stream.lerobot_dataset import EpishardLeRobotDataset, EpishardLeRobotMeta
    from epishard.stream.options import ReadOptions

    def make_epishard_dataset(cfg):
        """LeRobot's ``make_dataset(cfg)``, for epishard shards at ``cfg.dataset.root``."""
        if not cfg.dataset.root:
            raise SystemExit("give the shards' folder or URL as --dataset.root")
        if not cfg.dataset.streaming:
            raise SystemExit("add --dataset.streaming=true: the epishard dataset is iterable (its plan shuffles)")
        size = options.get("image_size")
        meta = EpishardLeRobotMeta.open(
            cfg.dataset.root,
            image_size=size,
            stats=options.get("stats", "source"),
            storage_options=options.get("storage_options"),
        )
        transforms = ImageTransforms(cfg.dataset.image_transforms) if cfg.dataset.image_transforms.enable else None
        dataset = EpishardLeRobotDataset(
            cfg.dataset.root,
            resolve_delta_timestamps(cfg.policy, meta),
            transforms,
            seed=cfg.seed or 0,
            read=ReadOptions(storage_options=options.get("storage_options")),
            **{k: v for k, v in options.items() if k != "storage_options"},
        )
        if cfg.dataset.use_imagenet_stats:  # as LeRobot's make_dataset does
            for key in dataset.meta.camera_keys:
                for name, value in IMAGENET_STATS.items():
                    dataset.meta.stats.setdefault(key, {})[name] = torch.tensor(value, dtype=torch.float32)
        return dataset

    lerobot_train.make_dataset = make_epishard_dataset  # LeRobot 0.4.4's dataset line
    if hasattr(lerobot_train, "make_train_eval_datasets"):  # LeRobot 0.6.1's
        lerobot_train.make_train_eval_datasets = lambda cfg: (make_epishard_dataset(cfg), None)
    lerobot_train.main()


if __name__ == "__main__":
    main()
