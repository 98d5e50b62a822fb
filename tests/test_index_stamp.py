"""Loading the dataset index fast without checking less (issue 16, item 5).

A local ``index.arrow`` is hashed once per node: a stamp (``epishard.format.verified``) lets the next
process skip the hash only while every key of the file (real path, size, mtime, inode, device)
and the manifest's sha256 are the same. The member-name and digest checks of ``check_index`` are
literal byte tests now; each rule the regular expressions enforced still refuses its row.
"""

from __future__ import annotations

import os
import random
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from faultgen import copy, manifest, rewrite_index

from epishard.format import opening, validate, verified
from epishard.format.errors import FormatError
from epishard.stream.source import DatasetSource


@pytest.fixture
def hashes(monkeypatch) -> list[str]:
    """Where ``index.arrow`` was hashed: one entry per sha256 computed by the reader."""
    seen: list[str] = []
    check = opening.check_digest  # the loaders of epishard.format.opening hash through it

    def counting(data, expected, where, field):
        seen.append(where)
        check(data, expected, where, field)

    monkeypatch.setattr(opening, "check_digest", counting)
    return seen


@pytest.fixture
def cache(tmp_path, monkeypatch) -> str:
    monkeypatch.setenv("EPISHARD_CACHE", str(tmp_path / "cache"))
    return str(tmp_path / "cache" / "verified")


def test_a_stamp_skips_the_hash_only_while_every_key_matches(intact, tmp_path, hashes, cache):
    root = copy(intact, str(tmp_path / "ds"))
    path = os.path.join(root, "index.arrow")
    first = DatasetSource(root).index
    assert hashes == [f"{root}/index.arrow"] and len(os.listdir(cache)) == 1
    again = DatasetSource(root).index
    assert len(hashes) == 1 and again.equals(first)  # the stamp vouched; values checked and loaded alike

    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched: same bytes, another mtime
    DatasetSource(root)
    assert len(hashes) == 2
    DatasetSource(root)
    assert len(hashes) == 2  # the touched file got its own stamp

    shutil.copy2(path, path + ".new")  # same bytes, size and mtime; another inode
    os.replace(path + ".new", path)
    DatasetSource(root)
    assert len(hashes) == 3

    m = manifest(root)
    key = os.stat(path)
    assert verified.is_verified(path, key, m["index"]["sha256"])
    assert not verified.is_verified(path, key, "0" * 64)  # a stamp vouches for one expected sha256 only


def test_a_corrupted_index_with_a_stale_stamp_is_refused(intact, tmp_path, hashes, cache):
    root = copy(intact, str(tmp_path / "ds"))
    path = os.path.join(root, "index.arrow")
    DatasetSource(root)
    st = os.stat(path)
    with open(path, "r+b") as f:  # damaged in place: same size and inode
        f.seek(st.st_size // 2)
        byte = f.read(1)
        f.seek(st.st_size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    with pytest.raises(FormatError, match=r"index.arrow: sha256 differs from the manifest's index.sha256"):
        DatasetSource(root)
    assert len(hashes) == 2


def test_stamps_can_be_turned_off(intact, tmp_path, hashes, monkeypatch):
    monkeypatch.setenv("EPISHARD_CACHE", "off")
    root = copy(intact, str(tmp_path / "ds"))
    DatasetSource(root)
    DatasetSource(root)
    assert len(hashes) == 2
    assert verified.cache_dir() is None


def _set_member(field: str, value: str, member: int = 0):
    def edit(rows):
        rows[1]["members"][member][field] = value

    return edit


@pytest.mark.parametrize(
    "name",
    ["a/b.mp4", "..", ".", "", "a\\b.mp4", "a\x00b.mp4", "/abs.mp4", "g-e000001.parquet/"],
    ids=["slash", "dotdot", "dot", "empty", "backslash", "nul", "leading-slash", "trailing-slash"],
)
def test_every_unplain_member_name_is_refused(intact, tmp_path, name):
    root = copy(intact, str(tmp_path / "ds"))
    rewrite_index(root, _set_member("name", name, member=1))  # a consistent forgery: digests updated
    with pytest.raises(FormatError, match=r"row 1 \(episode g-e000001\): members.name is not a plain file name"):
        DatasetSource(root)


@pytest.mark.parametrize(
    "digest",
    ["A" * 64, "a" * 63, "a" * 65, "g" + "a" * 63, "é" + "a" * 62, "", "a" * 63 + "\x00", "0x" + "a" * 62],
    ids=["upper", "short", "long", "not-hex", "non-ascii", "empty", "nul", "prefixed"],
)
def test_every_malformed_member_digest_is_refused(intact, tmp_path, digest):
    root = copy(intact, str(tmp_path / "ds"))
    rewrite_index(root, _set_member("sha256", digest))
    with pytest.raises(FormatError, match=r"row 1 \(episode g-e000001\): members.sha256 is not a sha256 hex digest"):
        DatasetSource(root)


def test_literal_checks_flag_what_the_regular_expressions_flagged():
    """On random strings, the first string each literal check flags is the one the old regex flagged first."""
    rng = random.Random(0)
    alphabet = ["a", "f", "0", "9", "g", "A", ".", "/", "\\", "\x00", "é", "字", "-"]
    for _ in range(200):
        strings = ["".join(rng.choices(alphabet, k=rng.choice([0, 1, 2, 5, 63, 64, 65]))) for _ in range(20)]
        strings += ["a" * 64, ".", "..", "ok.mp4"]
        rng.shuffle(strings)
        array = pa.array(strings).slice(1)  # a slice: offsets that do not start at 0
        name_regex = pc.or_(
            pc.match_substring_regex(array, r"[/\\\x00]"), pc.is_in(array, value_set=pa.array(["", ".", ".."]))
        )
        name_literal = validate._holds(array, validate._path_byte) | validate._short_in(array, ("", ".", ".."))
        sha_regex = pc.invert(pc.match_substring_regex(array, "^[0-9a-f]{64}$"))
        sha_literal = (validate._lengths(array) != 64) | validate._holds(array, validate._not_lower_hex)
        for regex, literal in ((name_regex, name_literal), (sha_regex, sha_literal)):
            flagged = np.flatnonzero(regex.to_numpy(zero_copy_only=False))
            assert np.flatnonzero(literal)[:1].tolist() == flagged[:1].tolist()
