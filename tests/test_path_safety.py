"""Nothing outside the dataset is read (issue 11, item 3): shard, index and member names from a
manifest or index must be plain names, checked before any open, local or remote."""

from __future__ import annotations

import os
import re

import pytest
from faultgen import SPEC, copy, manifest, rewrite_index, write_manifest
from remote_servers import serve_http

from epishard.cli import main
from epishard.format.errors import FormatError
from epishard.shardwriter import verify
from epishard.stream import WindowDataset

HOSTILE = ["../../dev/zero", "/etc/passwd", "sub/shard-000001.tar", "..", "a\\b.tar", "x\0.tar"]


def _with_name(intact: str, root: str, field: str, name: str) -> str:
    copy(intact, root)
    m = manifest(root)
    if field == "index.file":
        m["index"]["file"] = name
    else:
        m["shards"][1][field] = name
    write_manifest(root, m)
    return root


@pytest.mark.parametrize("name", HOSTILE)
@pytest.mark.parametrize("field", ["shard", "index", "index.file"])
def test_manifest_names_must_be_plain(intact, tmp_path, field, name, monkeypatch, capsys):
    root = _with_name(intact, str(tmp_path / "ds"), field, name)
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: opened.append(str(path)) or real_open(path, *a, **k))
    where = "shards[1]." + field if field != "index.file" else field
    with pytest.raises(FormatError, match=rf"manifest.json: {re.escape(where)}: .* is not a plain file name"):
        WindowDataset(root, SPEC)
    with pytest.raises(FormatError, match="not a plain file name"):
        verify(root)
    for command in ("inspect", "verify"):
        assert main([command, root]) == 2 and "not a plain file name" in capsys.readouterr().err
    assert all(p.startswith(root) and os.path.basename(p) == "manifest.json" for p in opened)  # nothing else opened


def test_remote_manifest_names_are_checked_before_any_request(intact, tmp_path):
    _with_name(intact, str(tmp_path / "ds"), "shard", "../../secret.tar")
    (tmp_path / "secret.tar").write_bytes(b"outside")
    server, base = serve_http(str(tmp_path / "ds"))
    try:
        with pytest.raises(FormatError, match=r"shards\[1\].shard: '../../secret.tar' is not a plain file name"):
            WindowDataset(base, SPEC)
    finally:
        server.shutdown()


@pytest.mark.parametrize("name", ["../g-e000000.parquet", "/abs/g-e000000.front.mp4", ".."])
def test_member_names_in_the_index_must_be_plain(intact, tmp_path, name):
    root = copy(intact, str(tmp_path / "ds"))

    def edit(rows):
        rows[3]["members"][0]["name"] = name

    rewrite_index(root, edit)  # digests updated: the name check, not a digest, must catch it
    with pytest.raises(FormatError, match=r"index.arrow: row 3 \(episode g-e000003\): members.name is not a plain"):
        WindowDataset(root, SPEC)
    assert any("members.name is not a plain file name" in p["message"] for p in verify(root)["problems"])


def test_shard_digest_must_be_hex_before_it_names_a_cache_file(intact, tmp_path):
    root = copy(intact, str(tmp_path / "ds"))
    m = manifest(root)
    m["shards"][0]["sha256"] = "../../" + "0" * 58
    write_manifest(root, m)
    with pytest.raises(FormatError, match=r"shards\[0\].sha256: .* is not a sha256 hex digest"):
        WindowDataset(root, SPEC)
