"""The LeRobot drop-in opens nothing a manifest names: a dataset from elsewhere cannot steer the user's keys.

A converted dataset's ``manifest.json`` records the path its source was read from. A stranger can
write any URL there (a host of theirs) or a path of the user's machine. The drop-in's statistics
come from the converted dataset itself (``sources[].stats``, stored by ``epishard convert`` from
the source's ``meta/stats.json``) or from a ``source_root`` the user names; the recorded path is
never opened, with or without the user's storage options. Checked with a loopback server that
records every request it gets, and a canary credential in the storage options.
"""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import threading
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from conftest import SAMPLE
from remote_servers import serve_http

from epishard.shardwriter import ConvertOptions, convert
from epishard.stream.lerobot_dataset import EpishardLeRobotDataset, StatsError
from epishard.stream.options import ReadOptions

CANARY = "CANARY-bearer-91c2"
OPTIONS = {"headers": {"Authorization": f"Bearer {CANARY}"}}


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers 200 with LeRobot-shaped statistics to anything, and records each request (path, headers)."""

    seen: ClassVar[list] = []

    def log_message(self, *args):
        pass

    def _answer(self):
        type(self).seen.append((self.command, self.path, dict(self.headers)))
        body = json.dumps({"action": {"mean": [666.0] * 44, "std": [1.0] * 44}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    do_GET = do_HEAD = _answer


@pytest.fixture(scope="module")
def recorder():
    handler = type("Recorder", (_Recorder,), {"seen": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler))
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield handler, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dropin") / "sample"
    convert([str(SAMPLE)], str(out), ConvertOptions(workers=1, episodes=frozenset({0, 1}), progress=False))
    return out


def _source_stats() -> dict:
    return json.loads((SAMPLE / "meta" / "stats.json").read_text())


def test_the_sources_statistics_are_stored_at_conversion_and_used_by_default(converted):
    """``meta.stats`` equals the source's ``meta/stats.json`` key for key, read from the manifest's copy."""
    manifest = json.loads((converted / "manifest.json").read_text())
    assert manifest["sources"][0]["stats"] == _source_stats()
    ds = EpishardLeRobotDataset(str(converted))
    assert ds.meta.stats_from == f"source (stored at conversion): {SAMPLE}/meta/stats.json"
    source = _source_stats()
    assert sorted(ds.meta.stats) == sorted(source)
    for key, entry in source.items():
        for name, value in entry.items():
            np.testing.assert_array_equal(ds.meta.stats[key][name], np.asarray(value), err_msg=f"{key}.{name}")
    # the converted episodes (2 of 5) have other statistics: the manifest's are not what was returned
    assert not np.array_equal(ds.meta.stats["action"]["mean"], ds.meta.manifest_stats["action"]["mean"])


def _forged(converted: Path, folder: Path, path: str, keep_stats: bool) -> Path:
    """A copy of ``converted`` whose manifest records ``path`` as its source (and no stored statistics)."""
    shutil.copytree(converted, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["sources"][0]["path"] = path
    if not keep_stats:
        del manifest["sources"][0]["stats"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


@pytest.mark.parametrize("keep_stats", [True, False], ids=["stats-stored", "no-stats-stored"])
def test_a_manifest_naming_another_host_gets_no_request_and_no_credentials(converted, recorder, tmp_path, keep_stats):
    """Served over HTTP with a bearer token in the storage options; the manifest names the recorder's host.

    Every ``stats`` choice opens the dataset without one request to the named host; ``"source"``
    without stored statistics is refused, naming ``source_root=`` and without the token.
    """
    handler, elsewhere = recorder
    handler.seen.clear()
    served = tmp_path / "served"
    _forged(converted, served / "ds", f"{elsewhere}/stolen", keep_stats)
    httpd, url = serve_http(str(served))
    try:
        read = ReadOptions(storage_options=OPTIONS)
        auto = EpishardLeRobotDataset(f"{url}/ds", read=read)
        manifest = EpishardLeRobotDataset(f"{url}/ds", read=read, stats="manifest")
        if keep_stats:
            source = EpishardLeRobotDataset(f"{url}/ds", read=read, stats="source")
            for ds in (auto, source):
                assert ds.meta.stats_from == f"source (stored at conversion): {elsewhere}/stolen/meta/stats.json"
                np.testing.assert_array_equal(ds.meta.stats["action"]["mean"], _source_stats()["action"]["mean"])
        else:
            assert auto.meta.stats_from == "manifest"
            with pytest.raises(StatsError, match="source_root=") as caught:
                EpishardLeRobotDataset(f"{url}/ds", read=read, stats="source")
            assert CANARY not in str(caught.value) and "not opened" in str(caught.value)
        assert manifest.meta.stats_from == "manifest"
        assert 666.0 not in auto.meta.stats["action"]["mean"]
    finally:
        httpd.shutdown()
    assert handler.seen == [], handler.seen  # not a request, let alone the token


def test_a_manifest_naming_a_local_file_is_not_opened(converted, tmp_path):
    """A local path in the manifest (a file of the user's machine) is not read either."""
    planted = tmp_path / "planted"
    (planted / "meta").mkdir(parents=True)
    (planted / "meta" / "stats.json").write_text(json.dumps({"action": {"mean": [666.0] * 44, "std": [1.0] * 44}}))
    forged = _forged(converted, tmp_path / "ds", str(planted), keep_stats=False)
    ds = EpishardLeRobotDataset(str(forged))
    assert ds.meta.stats_from == "manifest" and 666.0 not in ds.meta.stats["action"]["mean"]


@pytest.mark.parametrize(
    "hostile",
    [[[1.0, 2.0], [3.0]], "mean", None, {"a": 1}, [True, False], 10**400, [[1.0], "x"]],
    ids=["ragged", "text", "null", "object", "bools", "past-64-bits", "mixed"],
)
def test_stored_statistics_that_are_not_numbers_are_refused_naming_them(converted, tmp_path, hostile):
    """A manifest's stored statistics are a stranger's too: anything but arrays of numbers is a StatsError."""
    folder = tmp_path / "ds"
    shutil.copytree(converted, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["sources"][0]["stats"]["action"]["mean"] = hostile
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StatsError, match=r"manifest sources\[0\]\.stats\['action'\]\['mean'\]: not"):
        EpishardLeRobotDataset(str(folder))
    assert EpishardLeRobotDataset(str(folder), stats="manifest").meta.stats_from == "manifest"


def test_a_source_root_the_user_names_is_read_with_the_users_options(converted, tmp_path):
    """``source_root=`` is the user's choice: read there (with the storage options), whatever the manifest says."""
    served = tmp_path / "served"
    shutil.copytree(SAMPLE / "meta", served / "lerobot" / "meta")
    httpd, url = serve_http(str(served))
    try:
        ds = EpishardLeRobotDataset(
            str(converted), source_root=f"{url}/lerobot", read=ReadOptions(storage_options=OPTIONS)
        )
    finally:
        httpd.shutdown()
    assert ds.meta.stats_from == f"source: {url}/lerobot/meta/stats.json"
    np.testing.assert_array_equal(ds.meta.stats["action"]["mean"], _source_stats()["action"]["mean"])
