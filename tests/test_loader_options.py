"""Every keyword a caller passes to ``WindowLoader`` (torch's ``DataLoader``) keeps exact-once and exact
resume, or is refused naming it. Frames carry their number (``videogen``)."""

from __future__ import annotations

import pytest
import torch
from videogen import convert_numbered

from epishard.stream import WindowDataset, WindowLoader, WindowSpec

CAM = "observation.images.cam"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> WindowDataset:
    root = convert_numbered(
        tmp_path_factory.mktemp("loaderopts") / "ds", [12, 9, 7], {CAM: dict(gop=3, height=32, width=32)}
    )
    return WindowDataset(root, WindowSpec(cameras={CAM: (0,)}), seed=1)


def _keys(loader) -> list[tuple[int, int]]:
    return [(int(e), int(f)) for b in loader for e, f in zip(b["episode_index"], b["frame_index"], strict=True)]


def _init(worker: int) -> None:  # a worker_init_fn (module level: spawn pickles it)
    torch.manual_seed(worker)


@pytest.mark.parametrize(
    ("option", "why"),
    [
        ({"drop_last": True}, "drop_last=True is refused: each DataLoader worker would drop its own last partial"),
        ({"in_order": False}, "in_order=False is refused"),
    ],
)
def test_options_that_break_exactness_are_refused_naming_them(dataset, option, why):
    with pytest.raises(ValueError, match=why):
        WindowLoader(dataset, batch_size=4, num_workers=2, **option)


@pytest.mark.parametrize("option", ["shuffle", "sampler", "batch_sampler"])
def test_torch_refuses_an_order_of_its_own_naming_the_option(dataset, option):
    value = {"shuffle": True, "sampler": [0, 1], "batch_sampler": [[0]]}[option]
    with pytest.raises(ValueError, match=f"expected unspecified {option} option"):
        WindowLoader(dataset, batch_size=4, **{option: value})


def test_the_other_options_yield_the_plans_windows_exactly_once_and_resume_exactly(dataset):
    base = _keys(WindowLoader(dataset, batch_size=4, num_workers=2))
    assert len(base) == len(set(base)) == 12 + 9 + 7
    kw = dict(
        multiprocessing_context="spawn",
        generator=torch.Generator().manual_seed(3),
        worker_init_fn=_init,
        timeout=120,
        prefetch_factor=1,
        persistent_workers=True,
        drop_last=False,
        in_order=True,
    )
    loader = WindowLoader(dataset, batch_size=4, num_workers=2, **kw)
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    state = loader.state_dict()
    del it
    resumed = WindowLoader(dataset, batch_size=4, num_workers=2, **kw)
    resumed.load_state_dict(state)
    assert _keys(first) + _keys(resumed) == base


@pytest.mark.parametrize(("workers", "batch_size"), [(0, 16), (2, 7), (3, 16), (3, 5)])
def test_len_counts_the_batches_every_worker_yields_with_its_own_partial_batch(intact, workers, batch_size):
    """120 windows: 3 workers of 40 in batches of 16 yield 16, 16, 8 each (9 batches; torch's own
    len says ceil(120 / 16) = 8); a trainer sizing its schedule by len() gets the real count."""
    from faultgen import SPEC

    loader = WindowLoader(WindowDataset(intact, SPEC, seed=5), batch_size=batch_size, num_workers=workers)
    sizes = [len(b["episode_index"]) for b in loader]
    assert sum(sizes) == 120 and len(loader) == len(sizes)
    assert len(loader) == max(workers, 1) * -(-(120 // max(workers, 1)) // batch_size)
