"""Opening a converted dataset (local path or any fsspec URL).

File handles and filesystem clients are created lazily in the process that uses them, never
before a fork: a ``DatasetSource`` pickles to its URL and options only.
"""

from __future__ import annotations

import json
import os

import fsspec
import pyarrow as pa

from shardwriter.format import DATASET_INDEX_NAME, MANIFEST_NAME
from shardwriter.index import WindowIndex


class DatasetSource:
    """One converted dataset: its manifest, its window index, and reads of shard byte ranges.

    Args:
        url: the dataset folder (local path, ``file://``, ``s3://``, ``https://``, ...).
        storage_options: passed to fsspec (endpoint, credentials, ...).

    Raises:
        FileNotFoundError: no ``manifest.json`` at ``url`` (conversion unfinished or wrong path).
    """

    def __init__(self, url: str, storage_options: dict | None = None):
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        fs, root = fsspec.core.url_to_fs(self.url, **self.storage_options)
        self._root = root
        manifest_path = f"{root}/{MANIFEST_NAME}"
        if not fs.exists(manifest_path):
            raise FileNotFoundError(f"{self.url}: no {MANIFEST_NAME} (is the conversion finished?)")
        self.manifest = json.loads(fs.cat_file(manifest_path))
        if os.path.isdir(self.url):
            self.index = WindowIndex.load_dataset(self.url)  # memory-mapped: pages shared by workers
        else:
            data = fs.cat_file(f"{root}/{DATASET_INDEX_NAME}")
            self.index = WindowIndex.from_dataset_table(pa.ipc.open_file(pa.BufferReader(data)).read_all())
        self.shards = [s["shard"] for s in self.manifest["shards"]]
        self.cameras = sorted(self.manifest["cameras"])
        self._fs = None
        self._pid = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_fs"] = state["_pid"] = None
        return state

    def filesystem(self):
        """This process's fsspec filesystem (recreated after a fork)."""
        if self._fs is None or self._pid != os.getpid():
            self._fs, _ = fsspec.core.url_to_fs(self.url, **self.storage_options)
            self._pid = os.getpid()
        return self._fs

    def shard_path(self, shard: int) -> str:
        return f"{self._root}/{self.shards[shard]}"
