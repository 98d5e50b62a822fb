"""Every exception class epishard defines survives pickling with its own class, message, fields and notes.

A failure in a DataLoader worker, a ``convert --workers`` process or a Ray actor reaches the trainer
through pickle; an exception that cannot be rebuilt there turns into an unrelated ``TypeError``
naming no dataset, and one rebuilt as its base class loses what ``except`` clauses match on. The
classes are found by scanning every module of the package (``test_imports.module_files``), so a
new class without an example here fails this test.
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import warnings
from pathlib import Path

import pytest
from test_imports import module_files, package_map

REPO = Path(__file__).resolve().parent.parent


def _progress():
    from epishard.stream.plan import Progress

    return Progress(world_size=2, num_workers=3, consumed=(1, 2, 3, 4, 5, 6))


# qualified name -> (args, kwargs) of an instance; every field given a value other than its default.
EXAMPLES = {
    "epishard.format.errors.FormatError": (("s3://bucket/ds/manifest.json: shards[1].size must be >= 0",), {}),
    "epishard.format.errors.VideoError": (("episode 3 camera front: not a video",), {}),
    "epishard.format.opening.NotConverted": (("hf://datasets/x/y: a LeRobot dataset; run epishard convert",), {}),
    "epishard.format.opening.ManifestMissing": ((2, "no manifest.json (not a dataset)", "s3://b/ds"), {}),
    "epishard.format.presigned.HTTPStatusError": (("s3://b/ds/shard-000001.tar", 503, "SlowDown", {"x": "1"}), {}),
    "epishard.format.presigned.TLSFailure": (("s3://b/ds/shard-000001.tar: certificate does not verify",), {}),
    "epishard.format.retry.RetryBudgetExceeded": (("GET https://h/f: 503 SlowDown", 503, 61.5), {}),
    "epishard.format.storage.NotARegularFile": (("/data/ds/shard-000000.tar: a FIFO",), {}),
    "epishard.shardwriter.errors.ConversionError": (
        ("cannot read 'qpos'",),
        dict(kind="unreadable_file", dataset="aloha", episode=4, camera="cam", row=7, path="/d/e.hdf5", shard="s-1"),
    ),
    "epishard.shardwriter.errors.OutputFolderError": (("out/: holds files of another conversion",), {}),
    "epishard.shardwriter.errors.SourceError": (("data/: no HDF5 file",), {}),
    "epishard.shardwriter.errors._Redacted": (("a message",), {}),
    "epishard.shardwriter.prepare._Untimed": (("no pts",), dict(kind="untimed", episode=2, camera="front")),
    "epishard.shardwriter.video.CodecNotCopied": (("no container takes codec x",), dict(kind="codec", episode=1)),
    "epishard.shardwriter.video.FrameTimingError": (("frames without pts",), dict(kind="frame_timing", row=3)),
    "epishard.shardwriter.video._MuxRefused": (("mp4 refused the stream",), {}),
    "epishard.shardwriter.sources.tfrecord.RecordError": (
        ("a varint of 11 bytes",),
        dict(kind="too_large", feature="a"),
    ),
    "epishard.shardwriter.sources.mcap_bag._Refused": (("evil/Boom[2000000000]: no message holds it",), {}),
    "epishard.shardwriter.sources.hdf5._Missing": (("no key 'action'",), dict(kind="missing_key", path="/d/e.hdf5")),
    "epishard.stream.decode.DecodeError": (("shard 2 episode 1 camera front: undecodable packet",), {}),
    "epishard.stream.fetch.FetchError": (("shard-000002.tar bytes 10-20: connection reset",), dict(shard=2)),
    "epishard.stream.lerobot_dataset.StatsError": (("stats must be one of ...",), {}),
    "epishard.stream.plan.LevelOverrun": ((1, 4, 30, 20, "PROGRESS", 2), {}),
    "epishard.stream.statecheck.StateError": (("state_dict: not this dataset's",), {}),
    "epishard.stream.statecheck.StateTypeError": (("state_dict['epoch']: not an int",), {}),
    "epishard.stream.usercode.UserCodeError": (("transform returned a list",), dict(what="postprocess")),
}


def _classes() -> dict[str, type]:
    found = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the deprecated aliases re-export the same classes
        for name in sorted(module_files(REPO, package_map(REPO))):
            if name.endswith("__main__"):
                continue
            for obj in vars(importlib.import_module(name)).values():
                if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__.startswith("epishard"):
                    found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


CLASSES = _classes()


def test_every_exception_class_has_an_example():
    assert len(CLASSES) >= 20, sorted(CLASSES)  # the scan found the package's classes
    missing = sorted(set(CLASSES) - set(EXAMPLES))
    assert not missing, f"add an example to EXAMPLES for {missing}"
    assert not sorted(set(EXAMPLES) - set(CLASSES)), "EXAMPLES names a class the package no longer has"


def _state(exc: BaseException) -> dict:
    return {k: repr(v) for k, v in vars(exc).items()}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_exception_round_trips_through_pickle(name):
    cls = CLASSES[name]
    args, kwargs = EXAMPLES[name]
    args = tuple(_progress() if a == "PROGRESS" else a for a in args)
    exc = cls(*args, **kwargs)
    exc.add_note("while reading shard 2 (a note added on the way)")
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls
    assert str(back) == str(exc) and back.args == exc.args
    assert _state(back) == _state(exc)
    assert back.__notes__ == exc.__notes__ and back.__notes__[-1].startswith("while reading shard 2")
