"""The timed region every peer harness runs (LeRobot's, Lance's): imports only torch and the standard library.

A harness in another venv imports it from this folder (its ``sys.path[0]``), as it does ``memory.py``,
so every peer is timed and sampled the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from memory import MemSampler  # this folder's: the same sampling schedule for every peer


@dataclass
class Timed:
    """What a timed run measured: ``samples`` in ``seconds`` after ``warmup_s`` of warm-up batches
    (``first_s`` to the first one), ``episodes``: each timed batch's episode ids, ``epochs``: epochs
    crossed, ``last``: the last warm-up batch (shapes), memory peaks in kB (``mem``)."""

    samples: int = 0
    seconds: float = 0.0
    warmup_s: float = 0.0
    first_s: float = 0.0
    epochs: int = 0
    episodes: list[list[int]] = field(default_factory=list)
    last: dict | None = None
    mem: MemSampler | None = None


def timed_batches(dataset, args, action: str, **kw) -> Timed:
    """A shuffled ``DataLoader`` (persistent workers, seeded) over ``dataset``: ``args.warmup`` batches
    untimed, then at least ``args.seconds`` and ``args.min_batches`` batches timed (``args``: a harness's
    parsed options, also ``batch_size``, ``workers``, ``seed``; ``action``: the key counting samples).

    The clock starts before ``iter(loader)`` (the workers start inside the warm-up), as epishard's runs
    (``measure.py``) start theirs; memory is sampled throughout. ``kw``: more ``DataLoader`` keywords.
    """
    seed, workers, seconds = args.seed, args.workers, args.seconds
    torch.manual_seed(seed)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        num_workers=workers,
        shuffle=True,
        persistent_workers=workers > 0,
        generator=torch.Generator().manual_seed(seed),
        **kw,
    )
    out = Timed(mem=MemSampler())
    out.mem.start()
    t = time.perf_counter()
    it = iter(loader)

    def next_batch():
        nonlocal it
        try:
            return next(it)
        except StopIteration:
            out.epochs += 1
            it = iter(loader)
            return next(it)

    for i in range(args.warmup):
        out.last = next_batch()
        if i == 0:
            out.first_s = time.perf_counter() - t
    out.warmup_s = time.perf_counter() - t
    t1 = time.perf_counter()
    while len(out.episodes) < args.min_batches or time.perf_counter() - t1 < seconds:
        b = next_batch()
        out.samples += len(b[action])
        out.episodes.append([int(e) for e in b["episode_index"].reshape(-1).tolist()])
        del b
    out.seconds = time.perf_counter() - t1
    out.mem.stop()
    it = loader = None  # the workers stop here
    return out
