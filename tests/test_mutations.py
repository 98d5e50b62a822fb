"""Mutations of the manifest and index.arrow (issue 11, acceptance): wrong types, missing keys,
out-of-range values, swapped names, truncation. Each yields either the correct output or one clean
error: for the reader a ``FormatError`` (or ``FileNotFoundError`` / ``FetchError``) naming the file
and the field; for ``epishard verify|inspect|stream`` one line and no traceback. None may hang
(a watchdog fails the test) or allocate more than ``BOUND`` bytes while loading (tracemalloc).

One tiny dataset is generated per module; every mutation edits a copy of it.
"""

from __future__ import annotations

import copy as copy_module
import json
import os
import tracemalloc
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.feather as feather
import pytest
import torch
from faultgen import CAMERA, SPEC, copy, hang_alarm, manifest, rewrite_index, write_manifest

from epishard.cli import main
from epishard.format.errors import FormatError
from epishard.stream import WindowDataset
from epishard.stream.fetch import FetchError

BOUND = 32 << 20  # bytes the reader may allocate (Python and numpy) while loading a 6-episode dataset
CLEAN = (FormatError, FileNotFoundError, FetchError, KeyError)  # KeyError: the spec's camera is not in an episode


def _keyed(samples) -> dict:
    return {(int(s["episode_index"]), int(s["frame_index"])): s for s in samples}


# --- the mutations -------------------------------------------------------------------------------

WRONG = {"str": "x", "int": -1, "big": 2**63, "null": None, "list": [1], "dict": {"a": 1}, "bool": True}
MANIFEST_PATHS = [
    ("format",),
    ("format_version",),
    ("index",),
    ("index", "file"),
    ("index", "sha256"),
    ("shards",),
    ("shards", 0),
    ("shards", 0, "shard"),
    ("shards", 0, "index"),
    ("shards", 1, "size"),
    ("shards", 1, "sha256"),
    ("shards", 0, "index_sha256"),
    ("shards", 1, "episodes"),
    ("cameras",),
    ("cameras", CAMERA),
    ("stats",),
    ("stats", "action"),
    ("stats", "action", "mean"),
    ("totals",),
    ("totals", "episodes"),
    ("tasks",),
    ("sources",),
    ("sources", 0, "name"),
    ("report",),
]


def _manifest_mutations():
    out = []
    for path in MANIFEST_PATHS:
        out.append((f"manifest-delete-{'.'.join(map(str, path))}", ("delete", path)))
        for kind, value in WRONG.items():
            out.append((f"manifest-{kind}-{'.'.join(map(str, path))}", ("set", path, value)))
    out += [
        ("manifest-swap-shard-names", ("swap", "shard")),
        ("manifest-swap-index-names", ("swap", "index")),
        ("manifest-swap-shard-and-index", ("swap", "both")),
    ]
    out += [(f"manifest-truncated-{cut}", ("truncate", cut)) for cut in (0, 1, 0.5, -1)]
    return out


def _mutate_manifest(root: str, how) -> None:
    m = manifest(root)
    if how[0] in ("delete", "set"):
        *parents, last = how[1]
        obj = m
        for key in parents:
            obj = obj[key]
        if how[0] == "delete":
            del obj[last]
        else:
            obj[last] = copy_module.deepcopy(how[2])
    elif how[0] == "swap":
        a, b = m["shards"][0], m["shards"][1]
        if how[1] == "both":
            a["shard"], a["index"] = a["index"], a["shard"]
        else:
            a[how[1]], b[how[1]] = b[how[1]], a[how[1]]
    if how[0] == "truncate":
        text = json.dumps(m)
        cut = (
            how[1]
            if isinstance(how[1], int) and how[1] >= 0
            else len(text) + how[1]
            if isinstance(how[1], int)
            else int(len(text) * how[1])
        )
        with open(os.path.join(root, "manifest.json"), "w") as f:
            f.write(text[:cut])
        return
    write_manifest(root, m)


def _index_mutations():
    out = [
        (f"index-truncated-{cut}-{'forged' if d else 'plain'}", ("truncate", cut, d))
        for cut in (0, 8, 0.5, -16)
        for d in (False, True)
    ]
    for column, value in [
        ("num_rows", pa.array(["1"] * 6)),
        ("fps", pa.array([20] * 6, pa.int32())),
        ("shard", pa.array([0, 0, 1, 1, 2, 2], pa.int64())),
        ("key", pa.array(range(6))),
    ]:
        out.append((f"index-type-{column}", ("column", column, value)))
    out += [(f"index-drop-{c}", ("drop", c)) for c in ("cameras", "members", "shard", "window_stop")]
    out.append(("index-null-num_rows", ("column", "num_rows", pa.array([20, None, 20, 20, 20, 20], pa.int32()))))
    out.append(("index-null-camera-name", ("rows", "null_camera")))
    out += [
        (f"index-rows-{name}", ("rows", name))
        for name in (
            "negative_rows",
            "huge_frames",
            "no_keyframes",
            "pts_wrong_length",
            "negative_offset",
            "swap_keys",
            "swap_member_names",
            "unknown_camera",
            "no_members",
            "no_cameras",
            "duplicate_data_member",
            "time_base_zero",
            "segment_past_end",
        )
    ]
    return out


def _edit_rows(name: str):
    def edit(rows):
        cam, row = rows[1]["cameras"][0], rows[1]
        if name == "negative_rows":
            row["num_rows"] = -1
        elif name == "huge_frames":
            cam["num_frames"] = 2**31 - 1
        elif name == "no_keyframes":
            cam["keyframes"] = []
        elif name == "pts_wrong_length":
            cam["pts"] = [0, 1, 2]
        elif name == "negative_offset":
            row["members"][0]["offset"] = -1
        elif name == "swap_keys":
            rows[0]["key"], rows[1]["key"] = rows[1]["key"], rows[0]["key"]
        elif name == "swap_member_names":
            ms = row["members"]
            ms[1]["name"], ms[2]["name"] = ms[2]["name"], ms[1]["name"]
        elif name == "unknown_camera":
            cam["name"] = "observation.images.elsewhere"
        elif name == "null_camera":
            cam["name"] = None
        elif name == "no_members":
            row["members"] = []
        elif name == "no_cameras":
            row["cameras"] = []
        elif name == "duplicate_data_member":
            row["members"][2]["name"] = row["members"][1]["name"]
        elif name == "segment_past_end":
            row["segment_starts"] = [5, 99]
        elif name == "time_base_zero":
            cam["time_base_den"] = 0

    return edit


def _mutate_index(root: str, how) -> None:
    path = os.path.join(root, "index.arrow")
    if how[0] == "rows":
        rewrite_index(root, _edit_rows(how[1]))
        return
    if how[0] == "truncate":
        data = Path(path).read_bytes()
        cut = (
            how[1]
            if isinstance(how[1], int) and how[1] >= 0
            else len(data) + how[1]
            if isinstance(how[1], int)
            else int(len(data) * how[1])
        )
        data = data[:cut]
        Path(path).write_bytes(data)
    else:
        table = feather.read_table(path)
        i = table.schema.get_field_index(how[1])
        table = table.remove_column(i) if how[0] == "drop" else table.set_column(i, how[1], how[2])
        feather.write_feather(table, path, compression="uncompressed")
    if how[0] != "truncate" or how[2]:  # forged: the manifest's digest updated to the new file
        import hashlib

        m = manifest(root)
        m["index"]["sha256"] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        write_manifest(root, m)


MUTATIONS = _manifest_mutations() + _index_mutations()


# --- the test ------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def watchdog():
    with hang_alarm(30):
        yield


@pytest.mark.parametrize("name, how", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_mutation_gives_correct_output_or_one_clean_error(intact, keyed_reference, tmp_path, capsys, name, how):
    root = copy(intact, str(tmp_path / "ds"))
    (_mutate_manifest if name.startswith("manifest") else _mutate_index)(root, how)
    tracemalloc.start()
    try:
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            samples = list(WindowDataset(root, SPEC, seed=5))
        outcome = "samples"
    except CLEAN as exc:
        message = exc.args[0] if isinstance(exc, KeyError) else str(exc)
        outcome = "error"
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < BOUND
    if outcome == "error":
        assert root in message and any(f in message for f in ("manifest.json", "index.arrow", ".index.parquet", ".tar"))
    else:  # the output is the correct one: every real window is the intact dataset's
        got = _keyed(s for s in samples if not s["substitute"])
        assert len(samples) == len(keyed_reference) and set(got) <= set(keyed_reference)
        assert all(torch.equal(s[CAMERA], keyed_reference[k][CAMERA]) for k, s in got.items())
    for argv in (
        ["verify", root],
        ["inspect", root],
        [
            "stream",
            root,
            "--workers",
            "0",
            "--batches",
            "2",
            "--batch-size",
            "2",
            "--frames",
            "2",
            "--span",
            "5",
            "--action-horizon",
            "2",
            "--boundary",
            "pad",
        ],
    ):
        code = main(argv)
        out, err = capsys.readouterr()
        errors = [line for line in err.splitlines() if ": error: " in line]
        assert code in (0, 1, 2) and "Traceback" not in err + out and len(errors) <= 1, (argv[0], err)
        if argv[0] == "verify" and outcome == "error":
            assert code == 1 or errors  # damage the reader refuses is damage verify reports
