"""Mutation test of LeRobot metadata: every mutation of ``meta/info.json`` and of the episodes and
tasks files (wrong types, missing keys, out-of-range values, swapped names, truncation) gives either
a correct conversion or one clean error line naming the file or field; never a traceback or a hang."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from faultgen import hang_alarm
from lerobotgen import edit_json, write_v2, write_v3

from epishard.cli import main as cli
from epishard.shardwriter import WindowIndex, verify

LENGTHS = [12, 9]
CAMERA = "observation.images.front"
WRONG = {
    "null": None,
    "zero": 0,
    "negative": -1,
    "fraction": 1.5,
    "nan": math.nan,
    "inf": math.inf,
    "empty": "",
    "text": "x",
    "list": [],
    "object": {},
    "true": True,
}


def _json_edit(change):
    return lambda path: edit_json(path, change)


def _set(key, value):
    return _json_edit(lambda info: info | {key: value})


def _drop(key):
    return _json_edit(lambda info: {k: v for k, v in info.items() if k != key})


def _truncate(fraction: float):
    def apply(path: str) -> None:
        data = Path(path).read_bytes()
        Path(path).write_bytes(data[: int(len(data) * fraction)])

    return apply


def _write(data: bytes):
    def apply(path: str) -> None:
        Path(path).write_bytes(data)

    return apply


def _swap(a: str, b: str):
    return _json_edit(lambda info: info | {a: info.get(b), b: info.get(a)})


def _swap_feature_names(info: dict) -> dict:
    features = dict(info["features"])
    features[CAMERA], features["observation.state"] = features["observation.state"], features[CAMERA]
    return info | {"features": features}


def _info_mutations() -> dict[str, object]:
    out = {}
    for key in ("fps", "codebase_version", "data_path", "video_path", "features", "total_episodes", "robot_type"):
        out[f"drop-{key}"] = _drop(key)
        for name, value in WRONG.items():
            out[f"{key}={name}"] = _set(key, value)
    out |= {
        "fps=string-number": _set("fps", "10"),
        "fps=huge": _set("fps", 1e9),
        "fps=other-rate": _set("fps", 25),
        "total_episodes=more": _set("total_episodes", 100),
        "data_path=no-fields": _set("data_path", "data/x.parquet"),
        "data_path=unknown-field": _set("data_path", "data/{nonsense:03d}/{episode_index:06d}.parquet"),
        "data_path=positional": _set("data_path", "data/{0}/{episode_index}.parquet"),
        "video_path=bad-spec": _set("video_path", "videos/{video_key:06d}/{episode_index:06d}.mp4"),
        "video_path=outside": _json_edit(lambda i: i | {"video_path": "../toy/" + i["video_path"]}),
        "data_path=absolute": _json_edit(lambda i: i | {"data_path": "/" + i["data_path"]}),
        "features=camera-not-object": _set("features", {CAMERA: "video"}),
        "features=dtype-number": _json_edit(lambda i: i | {"features": {CAMERA: {"dtype": 5}}}),
        "swap-data_path-video_path": _swap("data_path", "video_path"),
        "swap-fps-total_episodes": _swap("fps", "total_episodes"),
        "swap-feature-names": _json_edit(_swap_feature_names),
        "rename-fps": _json_edit(lambda i: {("FPS" if k == "fps" else k): v for k, v in i.items()}),
        "document=list": _json_edit(lambda i: [i]),
        "document=number": _write(b"30"),
        "document=null": _write(b"null"),
        "document=empty": _write(b""),
        "document=binary": _write(b"\xff\xfe\x00{"),
    }
    out |= {f"truncate-{f}": _truncate(f) for f in (0.1, 0.5, 0.9)}
    return out


def _jsonl_edit(change):
    def apply(path: str) -> None:
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        with open(path, "w") as f:
            f.write("".join(line + "\n" for line in change(rows)))

    return apply


def _rows_set(key, value, drop=False):
    return _jsonl_edit(
        lambda rows: [json.dumps({k: v for k, v in r.items() if k != key} if drop else r | {key: value}) for r in rows]
    )


V21_JSONL = {
    "episodes.jsonl": {
        "episode_index=string": _rows_set("episode_index", "0"),
        "drop-episode_index": _rows_set("episode_index", None, True),
        "episode_index=null": _rows_set("episode_index", None),
        "episode_index=out-of-range": _rows_set("episode_index", 99),
        "tasks=string": _rows_set("tasks", "pick the cube"),
        "tasks=numbers": _rows_set("tasks", [1, 2]),
        "tasks=null": _rows_set("tasks", None),
        "row=list": _jsonl_edit(lambda rows: [json.dumps([r]) for r in rows]),
        "truncate": _truncate(0.6),
        "empty": _write(b""),
        "binary": _write(b"\xff\xfe\n\x00"),
        "duplicate-rows": _jsonl_edit(lambda rows: [json.dumps(r) for r in rows + rows]),
    },
    "tasks.jsonl": {
        "task_index=string": _rows_set("task_index", "0"),
        "drop-task": _rows_set("task", None, True),
        "task=number": _rows_set("task", 5),
        "swap-names": _jsonl_edit(
            lambda rows: [json.dumps({"task": r["task_index"], "task_index": r["task"]}) for r in rows]
        ),
        "truncate": _truncate(0.5),
        "row=string": _jsonl_edit(lambda rows: ['"pick"' for _ in rows]),
    },
}


def _parquet_edit(change):
    def apply(path: str) -> None:
        pq.write_table(change(pq.read_table(path)), path)

    return apply


def _column(name: str, values):
    def change(table: pa.Table) -> pa.Table:
        array = pa.array(values(table.column(name).to_pylist()) if callable(values) else values)
        return table.set_column(table.column_names.index(name), name, array)

    return _parquet_edit(change)


def _drop_column(name: str):
    return _parquet_edit(lambda t: t.drop_columns([name]))


FROM, TO = f"videos/{CAMERA}/from_timestamp", f"videos/{CAMERA}/to_timestamp"
V30_META = {
    "episodes/chunk-000/file-000.parquet": {
        "drop-episode_index": _drop_column("episode_index"),
        "drop-data-chunk": _drop_column("data/chunk_index"),
        "drop-from_timestamp": _drop_column(FROM),
        "episode_index=string": _column("episode_index", ["0", "1"]),
        "data-file=float": _column("data/file_index", [0.0, 0.5]),
        "from=nan": _column(FROM, [math.nan, 1.2]),
        "to<from": _column(TO, [0.0, 1.2]),
        "from=negative": _column(FROM, [-5.0, 1.2]),
        "to=past-end": _column(TO, [1.2, 50.0]),
        "swap-from-to": _column(FROM, lambda v: [v[0] + 5.0, v[1] + 5.0]),
        "episode_index=duplicate": _column("episode_index", [0, 0]),
        "episode_index=missing-data": _column("episode_index", [0, 7]),
        "tasks=string": _column("tasks", ["pick", "place"]),
        "truncate": _truncate(0.5),
        "empty": _write(b""),
    },
    "tasks.parquet": {
        "drop-task_index": _drop_column("task_index"),
        "task_index=string": _column("task_index", lambda v: [str(x) for x in v]),
        "only-task_index": _drop_column("task"),
        "truncate": _truncate(0.5),
    },
}


def _cases():
    cases = []
    for version in ("v21", "v30"):
        cases += [(version, "info.json", name) for name in _info_mutations()]
    cases += [("v21", file, name) for file, muts in V21_JSONL.items() for name in muts]
    cases += [("v30", file, name) for file, muts in V30_META.items() for name in muts]
    return cases


def _mutation(version: str, file: str, name: str):
    if file == "info.json":
        return _info_mutations()[name]
    return (V21_JSONL if version == "v21" else V30_META)[file][name]


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("lerobot")
    write_v2(str(root / "v21"), LENGTHS, [CAMERA], fps=10)
    write_v3(str(root / "v30"), LENGTHS, CAMERA, fps=10)
    return {"v21": str(root / "v21"), "v30": str(root / "v30")}


@pytest.mark.parametrize("version, file, name", _cases(), ids=lambda v: str(v))
def test_mutation_gives_a_correct_conversion_or_one_clean_line(sources, tmp_path, capsys, version, file, name):
    src = shutil.copytree(sources[version], str(tmp_path / "toy"))
    _mutation(version, file, name)(os.path.join(src, "meta", file))
    out = str(tmp_path / "out")
    with hang_alarm(120):
        code = cli(["convert", src, out, "--quiet"])
    err = capsys.readouterr().err
    if code == 0:
        assert verify(out)["ok"]
        index = WindowIndex.load_dataset(out)
        for e in range(index.num_episodes):  # every converted episode complete, none made up
            source_episode = int(index.key(e).rsplit("-e", 1)[1])
            assert int(index.num_rows[e]) == LENGTHS[source_episode]
        return
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1, err
    line = lines[0]
    assert line.startswith("epishard convert: error: ") and "unexpected" not in line, line
    field = name.split("=")[0].removeprefix("drop-").removeprefix("swap-").split("-")[0]
    named = (os.path.basename(file), field, "data_path", "video_path", "dataset=toy")
    assert any(thing in line for thing in named), line
