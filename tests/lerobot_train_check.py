"""Train LeRobot policies on epishard batches through LeRobot's own factories, for ``tests/test_lerobot_trainer.py``.

Run with a LeRobot peer venv's python, epishard on ``PYTHONPATH`` (the checkout's root):

    . /tmp/peer/env.sh && PYTHONPATH=$PWD python tests/lerobot_train_check.py SHARDS --policy act --steps 20

Per policy (small configs, CPU): ``EpishardLeRobotDataset`` with LeRobot's own
``resolve_delta_timestamps(cfg, ds.meta)``; ``make_policy(cfg, ds_meta=ds.meta)``;
``make_pre_post_processors(cfg, dataset_stats=ds.meta.stats)``; the policy's optimizer (and
scheduler) presets, as ``lerobot-train``'s ``make_optimizer_and_scheduler`` builds them; a plain
``torch.utils.data.DataLoader`` with 2 workers; ``steps`` updates as ``lerobot-train``'s
``update_policy`` does them (forward, backward, grad clip, step). Prints one JSON line per policy:
losses, the fraction of parameter tensors changed, seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch


def small_config(name: str, image_size: int):
    """A small CPU config of LeRobot's ACT or Diffusion policy (no pretrained weights: offline)."""
    if name == "act":
        from lerobot.policies.act.configuration_act import ACTConfig

        return ACTConfig(
            device="cpu",
            chunk_size=10,
            n_action_steps=10,
            dim_model=64,
            n_heads=2,
            dim_feedforward=128,
            n_encoder_layers=1,
            n_decoder_layers=1,
            n_vae_encoder_layers=1,
            latent_dim=8,
            pretrained_backbone_weights=None,
            push_to_hub=False,
        )
    if name == "diffusion":
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig

        crop = image_size - 8
        return DiffusionConfig(
            device="cpu",
            n_obs_steps=2,
            horizon=16,
            n_action_steps=8,
            down_dims=(32, 64),
            kernel_size=3,
            n_groups=8,
            diffusion_step_embed_dim=32,
            spatial_softmax_num_keypoints=16,
            crop_shape=(crop, crop),
            pretrained_backbone_weights=None,
            use_group_norm=True,
            num_train_timesteps=50,
            push_to_hub=False,
        )
    raise SystemExit(f"unknown policy {name!r}")


def train(root: str, name: str, steps: int, workers: int, batch_size: int, image_size: int, pool: int | None) -> dict:
    """``steps`` updates of policy ``name`` on ``root``'s shards; the losses and how many parameters changed."""
    from lerobot.datasets.factory import resolve_delta_timestamps
    from lerobot.policies.factory import make_policy, make_pre_post_processors

    from epishard.stream.lerobot_dataset import EpishardLeRobotDataset, EpishardLeRobotMeta

    t0 = time.perf_counter()
    torch.manual_seed(0)
    cfg = small_config(name, image_size)
    meta = EpishardLeRobotMeta.open(root, image_size=(image_size, image_size))
    delta = resolve_delta_timestamps(cfg, meta)  # LeRobot's own, from the drop-in's meta
    size = (image_size, image_size)
    ds = EpishardLeRobotDataset(root, delta, image_size=size, seed=0, **({} if pool is None else {"shuffle": pool}))
    policy = make_policy(cfg, ds_meta=ds.meta)
    preprocessor, _ = make_pre_post_processors(cfg, dataset_stats=ds.meta.stats)
    optimizer_cfg = cfg.get_optimizer_preset()  # lerobot-train's cfg.optimizer when none is given
    optimizer = optimizer_cfg.build(policy.get_optim_params())
    scheduler_cfg = cfg.get_scheduler_preset()
    scheduler = scheduler_cfg.build(optimizer, steps) if scheduler_cfg is not None else None
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, num_workers=workers, persistent_workers=True)
    before = [p.detach().clone() for p in policy.parameters()]
    policy.train()
    losses: list[float] = []
    shapes = {}
    it = iter(loader)
    while len(losses) < steps:
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            continue
        if not shapes:
            shapes = {k: [list(v.shape), str(v.dtype)] for k, v in batch.items() if isinstance(v, torch.Tensor)}
        batch = preprocessor(batch)
        loss, _ = policy.forward(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), optimizer_cfg.grad_clip_norm)
        optimizer.step()
        optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()
        losses.append(float(loss.item()))
    changed = sum(not torch.equal(b, p.detach()) for b, p in zip(before, policy.parameters(), strict=True))
    trainable = sum(p.requires_grad for p in policy.parameters())
    return {
        "policy": name,
        "steps": len(losses),
        "losses": losses,
        "finite": all(math.isfinite(x) for x in losses),
        "params_changed": changed,
        "params_trainable": trainable,
        "workers": workers,
        "batch_shapes": shapes,
        "delta_timestamps": delta,
        "stats_from": ds.meta.stats_from,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def main() -> None:
    """Train each policy asked for and print one JSON line per policy."""
    import lerobot

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root")
    ap.add_argument("--policy", action="append", choices=["act", "diffusion"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--shuffle-episodes", type=int, default=None, help="the plan's shuffle pool (default: auto)")
    args = ap.parse_args()
    for name in args.policy or ["act", "diffusion"]:
        result = train(
            args.root, name, args.steps, args.workers, args.batch_size, args.image_size, args.shuffle_episodes
        )
        print(json.dumps({"lerobot": lerobot.__version__, **result}), flush=True)


if __name__ == "__main__":
    main()
