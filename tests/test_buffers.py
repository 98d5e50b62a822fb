"""Reused batch buffers (``WindowLoader(..., reuse_buffers=k)``, ``stream.buffers``) and the device-side
float conversion (``stream.collate.to_device``), on a generated dataset whose frames carry
(episode, frame) in their pixels."""

from __future__ import annotations

import pickle
import time
import warnings

import pytest
import torch
from videogen import convert_numbered, decode_frame_number

from epishard.stream import PostProcess, WindowDataset, WindowLoader, WindowSpec
from epishard.stream.buffers import (
    FRAME_CACHE_FLOOR,
    READ_ALLOWANCE,
    RECYCLE_BYTES,
    BatchBuffers,
    Field,
    batch_allowance,
    recycle_slots,
    ring_slots,
)
from epishard.stream.collate import BufferedCollate, FloatCollate, float_frames, to_device

FPS = 10
LENGTHS = [14, 9, 17, 12]
CAMS = ("observation.images.front", "observation.images.wrist")
SPEC = WindowSpec(cameras={c: (0, 3) for c in CAMS}, action_horizon=3, boundary="pad")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return convert_numbered(
        tmp_path_factory.mktemp("buffers"), LENGTHS, {c: dict(gop=5) for c in CAMS}, fps=FPS, step=1000
    )


def _loader(dataset, dtype=torch.float32, **kw) -> WindowLoader:
    post = PostProcess(size=(32, 32), dtype=dtype)
    return WindowLoader(WindowDataset(dataset, SPEC, seed=3, postprocess=post), batch_size=5, **kw)


def _clone(batch: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _assert_equal(got: dict, expected: dict) -> None:
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
        else:
            assert got[key] == value, key


def _assert_frames(batch: dict, scale: float) -> None:
    """Every frame shows its (episode, row): ``1000 x episode + clamped anchor + offset``."""
    for i, (e, a) in enumerate(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True)):
        for cam in CAMS:
            frames = (batch[cam][i] * scale).round().to(torch.uint8)
            assert [decode_frame_number(f) for f in frames] == [1000 * e + min(a + o, LENGTHS[e] - 1) for o in (0, 3)]


@pytest.mark.parametrize(
    "dtype,workers,context",
    [(torch.float32, 2, "fork"), (torch.float32, 0, None), (torch.uint8, 2, "fork"), (torch.bfloat16, 2, "fork")],
)
def test_reused_buffers_give_todays_batches_and_reuse_their_memory(dataset, dtype, workers, context):
    kw = {"num_workers": workers, "persistent_workers": workers > 0, "multiprocessing_context": context}
    today = _loader(dataset, dtype, recycle_buffers=False, **kw)
    expected = [_clone(b) for _ in range(2) for b in today]  # two epochs: FloatCollate / default_collate
    loader = _loader(dataset, dtype, reuse_buffers=2, **kw)
    got, storages = [], set()
    for _ in range(2):
        for batch in loader:
            storages.add(batch[CAMS[0]].untyped_storage().data_ptr())
            got.append(_clone(batch))
    assert len(got) == len(expected) > 2 * ring_slots(2, workers, None) * max(workers, 1)
    for g, e in zip(got, expected, strict=True):
        _assert_equal(g, e)
        _assert_frames(g, 255.0 if dtype.is_floating_point else 1.0)
    # Every batch sits in one of the rings' slots, received without a new mapping each time.
    assert len(storages) == ring_slots(2, workers, None) * max(workers, 1)


@pytest.mark.parametrize("k,workers", [(1, 2), (3, 2), (2, 0)])
def test_a_batch_stays_valid_until_k_more_are_drawn_then_is_overwritten_and_warned(dataset, k, workers):
    loader = _loader(dataset, reuse_buffers=k, num_workers=workers)
    kept = []  # (batch as drawn, its copy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in loader:
            kept.append((batch, _clone(batch)))
            time.sleep(0.02)  # let the workers run ahead and fill their prefetch
            for drawn, copy in kept[-k:]:  # this batch and the k - 1 before it: intact
                _assert_equal(drawn, copy)
    # Kept past their lifetime, early batches now show later ones (the contract is real), and it was said.
    assert any(not torch.equal(drawn[CAMS[0]], copy[CAMS[0]]) for drawn, copy in kept[:-k])
    messages = [str(w.message) for w in caught if w.category is RuntimeWarning]
    assert len(messages) == 1 and f"reuse_buffers={k}): batch 0 is still referenced" in messages[0]


def test_resume_with_reused_buffers_continues_exactly(dataset):
    def keys(batch):
        return list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))

    reference = _loader(dataset, num_workers=2)
    full = [keys(b) for b in reference] + [keys(b) for b in reference]
    first = _loader(dataset, reuse_buffers=1, num_workers=2)
    it = iter(first)
    got = [keys(next(it)) for _ in range(2)]
    state = first.state_dict()
    del it
    second = _loader(dataset, reuse_buffers=1, num_workers=2)
    second.load_state_dict(state)
    got += [keys(b) for b in second] + [keys(b) for b in second]
    assert got == full


def test_pin_memory_without_an_accelerator_is_torchs_documented_no_op(dataset):
    if torch.accelerator.is_available():
        pytest.skip("an accelerator is present: pin_memory pins")
    expected = [_clone(b) for b in _loader(dataset, num_workers=2)]
    with pytest.warns(UserWarning, match="no accelerator is found"):
        got = [_clone(b) for b in _loader(dataset, reuse_buffers=2, num_workers=2, pin_memory=True)]
    for g, e in zip(got, expected, strict=True):
        _assert_equal(g, e)


def test_reuse_buffers_refuses_what_it_cannot_honour(dataset):
    with pytest.raises(ValueError, match=r"reuse_buffers=2 needs .*\(no collate_fn\)"):
        _loader(dataset, reuse_buffers=2, collate_fn=FloatCollate(list(CAMS)))
    with pytest.raises(ValueError, match="reuse_buffers=-1 needs an int >= 0"):
        _loader(dataset, reuse_buffers=-1)
    with pytest.raises(ValueError, match="slots must be >= 1"):
        BatchBuffers(0)


def test_slots_follow_changing_shapes_and_short_batches_and_are_not_pickled():
    collate = BufferedCollate(["x"], slots=2)

    def samples(n, size, base):
        return [{"x": torch.full((2, size), base + i, dtype=torch.uint8), "i": base + i, "s": str(i)} for i in range(n)]

    for n, size, base in [(3, 4, 0), (3, 4, 10), (2, 4, 20), (3, 6, 30), (3, 4, 40)]:
        batch = collate(samples(n, size, base))
        expected = FloatCollate(["x"])(samples(n, size, base))
        _assert_equal(batch, expected)
    # slot 0: allocated, reused for the short batch and for the last; slot 1: allocated, again for 6 wide
    assert collate.buffers.allocations == 3
    copy = pickle.loads(pickle.dumps(collate))
    assert copy.buffers._ring == [] and copy.buffers.allocations == 3
    out = copy.buffers.take((Field("x", torch.float32, (2, 4)),), 3)
    assert out["x"].shape == (3, 2, 4) and copy.buffers.allocations == 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_to_device_equals_float_collate(dataset, dtype):
    uint8 = [b for b in _loader(dataset, torch.uint8)]
    floats = [b for b in _loader(dataset, dtype)]
    assert uint8[0][CAMS[0]].dtype == torch.uint8 and floats[0][CAMS[0]].dtype == dtype
    for u, f in zip(uint8, floats, strict=True):
        moved = to_device(u, "cpu", dtype)
        _assert_equal(moved, f)  # frames: the same floats; masks, state, action, strings: as they were
    with pytest.raises(ValueError, match="floating dtype"):
        to_device(uint8[0], "cpu", torch.int32)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_float_frames_fused_and_unfused_equal_postprocess_for_every_byte(dtype, fused):
    frames = torch.arange(256, dtype=torch.uint8).reshape(4, 64)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the result must not depend on it
    try:
        for scale in (True, False):
            expected = PostProcess(dtype=dtype, scale=scale).finish(frames.clone())
            got = float_frames(frames, torch.empty(frames.shape, dtype=dtype), scale=scale, fused=fused)
            assert torch.equal(got, expected)
    finally:
        torch.set_default_dtype(old)


@pytest.mark.parametrize(
    "dtype,workers,persistent",
    [(torch.float32, 2, True), (torch.uint8, 2, False), (torch.uint8, 1, True), (torch.float32, 3, True)],
)
def test_recycled_buffers_never_change_a_batch_that_is_held(dataset, dtype, workers, persistent):
    """The default: every batch kept (the whole list, two epochs) keeps its values and frames, as with
    fresh memory; the workers wrote into fresh memory whenever their slot's batch was still held."""
    kw = {"num_workers": workers, "persistent_workers": persistent}
    fresh = _loader(dataset, dtype, recycle_buffers=False, **kw)
    expected = [_clone(b) for _ in range(2) for b in fresh]
    loader = _loader(dataset, dtype, **kw)
    assert loader._recycled is not None  # on by default with workers
    kept = [b for _ in range(2) for b in loader]
    assert len(kept) == len(expected) > 2 * recycle_slots(workers, None) * workers
    for g, e in zip(kept, expected, strict=True):
        assert "__slot__" not in g
        _assert_equal(g, e)
        _assert_frames(g, 255.0 if dtype.is_floating_point else 1.0)


@pytest.mark.parametrize("hold", ["view", "numpy", "detach"])
def test_recycled_buffers_count_views_numpy_and_detach_as_held(dataset, hold):
    """A part of a batch kept (a view, its ``.numpy()``, a ``.detach()``) keeps its slot: the values
    it shows never change, while the loop drops every batch."""
    expected = [_clone(b) for b in _loader(dataset, torch.uint8, recycle_buffers=False, num_workers=2)]
    loader = _loader(dataset, torch.uint8, num_workers=2)
    parts = []
    for batch in loader:
        frames = batch[CAMS[0]]
        parts.append({"view": frames[0], "numpy": frames.numpy(), "detach": frames.detach()}[hold])
        del batch, frames
        time.sleep(0.01)
    for part, e in zip(parts, expected, strict=True):
        got = torch.as_tensor(part)
        assert torch.equal(got, e[CAMS[0]][0] if hold == "view" else e[CAMS[0]])


def test_recycled_buffers_are_reused_when_each_batch_is_dropped(dataset):
    """A loop that drops each batch before the next: the batches come out of the workers' rings (few
    distinct storages over many batches), with today's values."""
    fresh = _loader(dataset, recycle_buffers=False, num_workers=2)
    expected = [_clone(b) for _ in range(3) for b in fresh]
    loader = _loader(dataset, num_workers=2, persistent_workers=True)
    storages, n = set(), 0
    for _ in range(3):
        for batch in loader:
            storages.add(batch[CAMS[0]].untyped_storage().data_ptr())
            _assert_equal(batch, expected[n])
            n += 1
            del batch
            time.sleep(0.02)  # the workers run ahead: their next slot must be free by then
    assert n == len(expected) >= 20
    # 2 workers x recycle_slots rings; a batch that found its slot still held went to fresh memory.
    assert len(storages) <= 2 * recycle_slots(2, None) + n // 4


def test_recycle_buffers_is_refused_where_it_cannot_apply(dataset):
    with pytest.raises(ValueError, match="exclude each other"):
        _loader(dataset, reuse_buffers=2, recycle_buffers=True, num_workers=2)
    with pytest.raises(ValueError, match="num_workers >= 1"):
        _loader(dataset, recycle_buffers=True, num_workers=0)
    assert _loader(dataset, num_workers=0)._recycled is None  # the default: only with workers
    assert _loader(dataset, num_workers=2, recycle_buffers=False)._recycled is None
    assert _loader(dataset, num_workers=2, collate_fn=FloatCollate(list(CAMS)))._recycled is None


def test_small_fields_kept_do_not_hold_the_recycled_frames(dataset):
    """Only the cameras' frames live in the recycled slots: keeping the state, the masks or an index
    (``.numpy()`` views, as a logger does) leaves the slots free, and those values stay intact."""
    fresh = _loader(dataset, torch.uint8, recycle_buffers=False, num_workers=2)
    expected = [_clone(b) for _ in range(3) for b in fresh]
    loader = _loader(dataset, torch.uint8, num_workers=2, persistent_workers=True)
    storages, kept, n = set(), [], 0
    for _ in range(3):
        for batch in loader:
            storages.add(batch[CAMS[0]].untyped_storage().data_ptr())
            kept.append((batch["observation.state"], batch["episode_index"].numpy(), batch[f"{CAMS[0]}_is_pad"]))
            n += 1
            del batch
            time.sleep(0.02)
    assert n == len(expected)
    assert len(storages) <= 2 * recycle_slots(2, None) + n // 4
    for (state, episodes, pad), e in zip(kept, expected, strict=True):
        assert torch.equal(state, e["observation.state"]) and episodes.tolist() == e["episode_index"].tolist()
        assert torch.equal(pad, e[f"{CAMS[0]}_is_pad"])


def test_batches_and_the_frame_cache_share_the_read_allowance():
    """``batch_allowance``: small batches leave the cache; large ones are recycled while the ring fits
    beside the floor, taking their bytes out of the cache; larger still go to fresh memory, and the
    cache makes room for the one batch in flight."""
    m = 1 << 20
    default = 548 * m
    assert batch_allowance(default, 62 * m, 186 * m, True) == (RECYCLE_BYTES, None)  # 640x480 uint8
    assert batch_allowance(default, 62 * m, 186 * m, False) == (RECYCLE_BYTES, None)
    cap, cache = batch_allowance(default, 252 * m, 756 * m, True)  # 640x480 float32: recycled, cache smaller
    assert cap == 756 * m and cache == READ_ALLOWANCE - 756 * m and cache + 756 * m == READ_ALLOWANCE
    cap, cache = batch_allowance(default, 759 * m, 2277 * m, True)  # 720p float32: fresh, one batch in flight
    assert cap < 2277 * m and cache == READ_ALLOWANCE - 759 * m
    assert batch_allowance(default, 900 * m, 2700 * m, True) == (RECYCLE_BYTES, FRAME_CACHE_FLOOR)  # the floor
    ring = READ_ALLOWANCE - FRAME_CACHE_FLOOR
    assert batch_allowance(default, ring // 3, ring, True) == (ring, FRAME_CACHE_FLOOR)  # the largest ring kept


def test_a_loader_whose_batches_need_the_cache_shrinks_it_and_keeps_the_plan(dataset, monkeypatch):
    """Where the batches take part of the allowance, the loader's view reads with a smaller frame
    cache, recycles its ring, and yields the same batches (its plan, shuffle pool included, is the
    dataset's); a Lookahead of the user's is left as given."""
    import epishard.stream.buffers as buffers_module
    import epishard.stream.dataset as dataset_module
    from epishard.stream.lookahead import Lookahead
    from epishard.stream.options import ReadOptions

    expected = [_clone(b) for b in _loader(dataset, num_workers=2, recycle_buffers=False)]
    per_batch = 5 * 2 * 2 * 3 * 32 * 32 * 4  # samples x cameras x frames x RGB x 32x32 x float32
    ring = recycle_slots(2, None) * per_batch
    small = FRAME_CACHE_FLOOR + ring + (64 << 10)  # leaves the cache 64 KiB above the floor
    monkeypatch.setattr(buffers_module, "READ_ALLOWANCE", small)
    monkeypatch.setattr(buffers_module, "FRAME_CACHE_FLOOR", 0)
    monkeypatch.setattr(dataset_module, "RECYCLE_BYTES", 0)
    loader = _loader(dataset, num_workers=2)
    base = WindowDataset(dataset, SPEC, seed=3, postprocess=PostProcess(size=(32, 32), dtype=torch.float32))
    assert loader.dataset.lookahead.frame_cache_bytes == small - ring < base.lookahead.frame_cache_bytes
    assert loader.dataset.pool_episodes(5) == base.pool_episodes(5)
    got = []
    for batch in loader:
        got.append(_clone(batch))
        del batch
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        _assert_equal(g, e)
    mine = Lookahead(frame_cache_bytes=3 << 20)
    read = ReadOptions(lookahead=mine)
    ds = WindowDataset(dataset, SPEC, seed=3, postprocess=PostProcess(size=(32, 32), dtype=torch.float32), read=read)
    assert WindowLoader(ds, batch_size=5, num_workers=2).dataset.lookahead == mine


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ring", [True, False])
def test_kept_pictures_are_written_straight_into_recycled_batches(dataset, monkeypatch, dtype, ring):
    """With frames kept as pictures, the recycled ring's collate converts each window's frames into
    the batch (``LazyFrames``), or, where the ring does not fit, into fresh memory: the batches equal
    those of frames kept as RGB, none escapes unconverted."""
    import epishard.stream.dataset as dataset_module
    from epishard.stream.lookahead import LazyFrames, Lookahead
    from epishard.stream.options import ReadOptions

    if not ring:  # every ring is past the cap: each batch goes into fresh memory
        monkeypatch.setattr(dataset_module, "RECYCLE_BYTES", 0)
    got = {}
    for pictures in (False, True):
        read = ReadOptions(lookahead=Lookahead(pictures=pictures))
        ds = WindowDataset(dataset, SPEC, seed=3, postprocess=PostProcess(dtype=dtype), read=read)
        loader = WindowLoader(ds, batch_size=5, num_workers=1, recycle_buffers=None if not ring else True)
        # What the loader's worker iterates: picture frames as LazyFrames, for the collate to write.
        first = next(iter(loader.dataset))
        assert all(isinstance(first[c], LazyFrames) == pictures for c in CAMS)
        assert not any(isinstance(v, LazyFrames) for v in next(iter(ds)).values())  # never to the user
        got[pictures] = [_clone(b) for b in loader]
        assert all(isinstance(b[c], torch.Tensor) and b[c].dtype == dtype for b in got[pictures] for c in CAMS)
    assert len(got[True]) == len(got[False])
    for a, b in zip(got[True], got[False], strict=True):
        _assert_equal(a, b)
        _assert_frames(a, 1.0 if dtype == torch.uint8 else 255.0)


def test_a_new_epoch_finds_last_epochs_dropped_batches_released(dataset, monkeypatch):
    """Persistent workers write an epoch's first batches as soon as it starts: the slots of last
    epoch's batches, dropped by then, are released before (``RecycledBatches.poll`` when the loader
    starts an epoch), else the worker finds its slot flagged and writes into fresh memory."""
    loader = _loader(dataset, num_workers=2, persistent_workers=True)
    held_when_workers_start = []
    start = torch.utils.data.DataLoader.__iter__

    def spy(self):
        held_when_workers_start.append(self._recycled.held)
        return start(self)

    monkeypatch.setattr(torch.utils.data.DataLoader, "__iter__", spy)
    for _ in range(3):
        for batch in loader:
            del batch
    assert held_when_workers_start == [0, 0, 0]
