"""LeRobotDataset's items at given frame indices, dumped for ``tests/test_lerobot_dropin.py``.

Run with a LeRobot peer venv's python (imports only LeRobot and torch, never epishard):

    . /tmp/peer/env.sh && python tests/lerobot_peer_items.py JOBS.json OUT.pt

``JOBS.json``: a list of ``{"root", "delta_timestamps", "keys": [index, ...], "uint8": bool}``
(``index``: the dataset's global frame index column). For each job,
``LeRobotDataset(local/<name>, root=root, delta_timestamps=...)`` (``return_uint8=True`` when
``uint8``, LeRobot >= 0.5) and its item at each key. Float frames are stored as uint8
``round(x * 255)`` after checking that LeRobot's float is exactly ``u8 / 255.0`` (``float_exact``
per item), so the dump stays small and the float values are still pinned bit for bit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def compact(item: dict, cameras) -> dict:
    """The item with float frames as uint8 ``round(x * 255)``, after checking that each is exactly ``u8 / 255``."""
    out = dict(item)
    exact = True
    for cam in cameras:
        f = item[cam]
        if f.dtype.is_floating_point:
            u8 = (f * 255).round().to(torch.uint8)
            exact = exact and f.dtype == torch.float32 and torch.equal(u8 / 255.0, f)
            out[cam] = u8
    out["float_exact"] = exact
    return out


def main() -> None:
    """Dump the items (see the module docstring)."""
    import lerobot
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    jobs = json.loads(Path(sys.argv[1]).read_text())
    out = {"lerobot": lerobot.__version__, "jobs": []}
    for job in jobs:
        root = Path(job["root"])
        kw = {"return_uint8": True} if job.get("uint8") else {}
        ds = LeRobotDataset(f"local/{root.name}", root=root, delta_timestamps=job["delta_timestamps"], **kw)
        where = {int(x): i for i, x in enumerate(ds.hf_dataset.select_columns(["index"])["index"])}
        cameras = set(ds.meta.camera_keys)
        items = [compact(ds[where[key]], cameras) for key in job["keys"]]
        out["jobs"].append({"root": str(root), "items": items})
    torch.save(out, sys.argv[2])


if __name__ == "__main__":
    main()
