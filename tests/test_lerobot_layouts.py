"""LeRobot datasets as LeRobot's converters leave them (v2.0, v2.1, v3.0), each optional meta file there or not.

Each layout is converted and opened with the drop-in (``EpishardLeRobotDataset``): every frame is
the source frame of its row (``videogen`` encodes the frame number), one item per frame, the task
texts are the dataset's, ``meta.stats`` holds what LeRobot would normalise with, ``meta.stats_from``
names the file they came from, and every fallback taken is a counted warning of the manifest's
report naming the folder and the file (docs/guide/converting.md, "LeRobot metadata").

What LeRobot reads (LeRobot 0.3's ``LeRobotDatasetMetadata.load_metadata`` for v2.x, 0.4.4 for
v3.0 and for the v2.1 to v3.0 converter): v2.0 ``meta/stats.json``; v2.1 the aggregate of
``meta/episodes_stats.jsonl`` (``aggregate_stats``; ``stats.json`` is not read); v3.0
``meta/stats.json``. ``lerobot_aggregate`` below re-implements ``aggregate_stats`` from its
definition (LeRobot is not importable here) to give the expected values independently.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from fifowatch import FifoWatch
from lerobotgen import edit_json, table_stats, write_v2, write_v3
from videogen import decode_frame_number

from epishard.cli import main as cli
from epishard.shardwriter import ConvertOptions, SourceError, convert
from epishard.stream.lerobot_dataset import EpishardLeRobotDataset

CAM = "observation.images.top"
LENGTHS = [5, 7]
TASKS = ["fold", "stack"]  # episode e's task, task_index e
V2_DATA = "data/chunk-000/episode_{:06d}.parquet"
V3_DATA = "data/chunk-000/file-000.parquet"
V3_EPISODES = "meta/episodes/chunk-000/file-000.parquet"
# Distinct from any aggregate: which file the drop-in's statistics came from shows in their values.
STATS_JSON = {
    "action": {"mean": [9.0, 9.5, 10.0], "std": [2.0, 2.0, 2.0], "min": [0.0] * 3, "max": [20.0] * 3, "count": [12]},
    CAM: {
        "mean": [[[0.5]], [[0.25]], [[0.125]]],
        "std": [[[0.1]]] * 3,
        "min": [[[0.0]]] * 3,
        "max": [[[1.0]]] * 3,
        "count": [12],
    },
}


def _episode_stats(table: pa.Table, e: int) -> dict:
    """Episode ``e``'s statistics as LeRobot writes them: numeric columns, the camera ``[3, 1, 1]``, quantiles.

    ``action`` has q01/q99 in every episode and q50 in episode 0 only (LeRobot aggregates a
    quantile only when every episode has it).
    """
    stats = table_stats(table)
    n = table.num_rows
    stats[CAM] = {
        "min": [[[0.0]]] * 3,
        "max": [[[1.0]]] * 3,
        "mean": [[[0.2 + 0.1 * e]], [[0.3 + 0.2 * e]], [[0.4]]],
        "std": [[[0.05 * (e + 1)]]] * 3,
        "count": [n],
    }
    action = stats["action"]
    action["q01"] = [v + 0.01 for v in action["min"]]
    action["q99"] = [v - 0.01 for v in action["max"]]
    if e == 0:
        action["q50"] = list(action["mean"])
    return stats


def lerobot_aggregate(per_episode: list[dict]) -> dict:
    """LeRobot's ``aggregate_stats`` (lerobot 0.4.4, ``lerobot/datasets/compute_stats.py``), from its definition.

    Per feature over the episodes that have it: mean weighted by count; variance pooled, the
    weighted mean of ``std**2 + (mean - total mean)**2``; elementwise min and max; count summed;
    a quantile ``q<digits>`` of the first episode, when every episode has it, weighted by count.
    """
    out: dict = {}
    for key in {k for s in per_episode for k in s}:
        eps = [s[key] for s in per_episode if key in s]
        weights = [float(e["count"][0]) for e in eps]
        total = sum(weights)
        mean = sum(w * np.asarray(e["mean"], np.float64) for w, e in zip(weights, eps, strict=True)) / total
        variance = (
            sum(
                w * (np.asarray(e["std"], np.float64) ** 2 + (np.asarray(e["mean"], np.float64) - mean) ** 2)
                for w, e in zip(weights, eps, strict=True)
            )
            / total
        )
        entry = {
            "mean": mean,
            "std": np.sqrt(variance),
            "min": np.minimum.reduce([np.asarray(e["min"]) for e in eps]),
            "max": np.maximum.reduce([np.asarray(e["max"]) for e in eps]),
            "count": np.array([int(total)]),
        }
        for q in (k for k in eps[0] if k.startswith("q") and k[1:].isdigit()):
            if all(q in e for e in eps):
                entry[q] = sum(w * np.asarray(e[q], np.float64) for w, e in zip(weights, eps, strict=True)) / total
        out[key] = entry
    return out


def _set_task_index(path: str) -> pa.Table:
    """Rows of episode ``e`` get task_index ``e`` (two tasks); returns the table written."""
    table = pq.read_table(path)
    tasks = pa.array(table.column("episode_index").to_numpy(), pa.int64())
    table = table.set_column(table.column_names.index("task_index"), "task_index", tasks)
    pq.write_table(table, path)
    return table


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    """The three layouts with every meta file LeRobot's converters leave, and both kinds of statistics.

    v2.x: ``episodes.jsonl``, ``tasks.jsonl``, ``episodes_stats.jsonl``, ``stats.json`` (a layout
    drops the one its version does not have); v3.0: ``meta/episodes`` with ``stats/`` columns and a
    ``tasks`` column, ``tasks.parquet``, ``stats.json``. Episode ``e``'s task is ``TASKS[e]``.
    """
    root = tmp_path_factory.mktemp("layouts")
    out = {}
    v2 = root / "v2"
    write_v2(str(v2), LENGTHS, [CAM])
    tables = [_set_task_index(str(v2 / V2_DATA.format(e))) for e in range(len(LENGTHS))]
    _jsonl(
        v2 / "meta" / "episodes_stats.jsonl",
        [{"episode_index": e, "stats": _episode_stats(t, e)} for e, t in enumerate(tables)],
    )
    _jsonl(v2 / "meta" / "tasks.jsonl", [{"task_index": i, "task": t} for i, t in enumerate(TASKS)])
    _jsonl(
        v2 / "meta" / "episodes.jsonl",
        [{"episode_index": e, "tasks": [TASKS[e]], "length": n} for e, n in enumerate(LENGTHS)],
    )
    (v2 / "meta" / "stats.json").write_text(json.dumps(STATS_JSON))
    for version in ("v2.0", "v2.1"):
        out[version] = root / version
        shutil.copytree(v2, out[version])
        edit_json(str(out[version] / "meta" / "info.json"), lambda info, v=version: info | {"codebase_version": v})
    v3 = out["v3.0"] = root / "v3.0"
    write_v3(str(v3), LENGTHS, CAM)
    table = _set_task_index(str(v3 / V3_DATA))
    per_episode = [_episode_stats(table.filter(pc.equal(table["episode_index"], e)), e) for e in range(len(LENGTHS))]
    meta = pq.read_table(v3 / V3_EPISODES)
    meta = meta.set_column(meta.column_names.index("tasks"), "tasks", pa.array([[t] for t in TASKS]))
    columns = {f"stats/{f}/{s}" for stats in per_episode for f, entry in stats.items() for s in entry}
    for name in sorted(columns):
        _, feature, stat = name.split("/")
        meta = meta.append_column(name, pa.array([stats[feature].get(stat) for stats in per_episode]))
    pq.write_table(meta, v3 / V3_EPISODES)
    pq.write_table(pa.table({"task_index": [0, 1], "task": TASKS}), v3 / "meta" / "tasks.parquet")
    (v3 / "meta" / "stats.json").write_text(json.dumps(STATS_JSON))
    return out


def _stats_columns_dropped(path: Path) -> None:
    meta = pq.read_table(path)
    pq.write_table(meta.drop_columns([c for c in meta.column_names if c.startswith("stats/")]), path)


def _tasks_column_dropped(path: Path) -> None:
    pq.write_table(pq.read_table(path).drop_columns(["tasks"]), path)


ES, SJ, TJ, EJ, TP = "episodes_stats.jsonl", "stats.json", "tasks.jsonl", "episodes.jsonl", "tasks.parquet"
AGG_V2 = "meta/episodes_stats.jsonl (aggregated over 2 episodes)"
AGG_V3 = "meta/episodes/*.parquet stats/ columns (aggregated over 2 episodes)"
# id -> (version, meta files removed, statistics expected: "stats.json" / "aggregate" / "manifest",
#        stats_from after the folder (None: "manifest"), warnings by kind, task texts per episode)
LAYOUTS = {
    # v2.0 as LeRobot leaves it: stats.json, no episodes_stats.jsonl
    "v2.0": ("v2.0", [ES], "stats.json", "meta/stats.json", {}, TASKS),
    "v2.0-no-stats": ("v2.0", [ES, SJ], "manifest", None, {"stats_fallback": 1}, TASKS),
    "v2.0-episodes_stats-only": ("v2.0", [SJ], "aggregate", AGG_V2, {"stats_fallback": 1}, TASKS),
    "v2.0-both-stats": ("v2.0", [], "stats.json", "meta/stats.json", {"stats_ignored": 1}, TASKS),
    "v2.0-no-tasks.jsonl": ("v2.0", [ES, TJ], "stats.json", "meta/stats.json", {"tasks_fallback": 1}, TASKS),
    "v2.0-no-episodes.jsonl": ("v2.0", [ES, EJ], "stats.json", "meta/stats.json", {"tasks_fallback": 1}, TASKS),
    # v2.1 as LeRobot leaves it: episodes_stats.jsonl, no stats.json (its converter deletes it)
    "v2.1": ("v2.1", [SJ], "aggregate", AGG_V2, {}, TASKS),
    "v2.1-no-stats": ("v2.1", [SJ, ES], "manifest", None, {"stats_fallback": 1}, TASKS),
    "v2.1-stats.json-only": ("v2.1", [ES], "stats.json", "meta/stats.json", {"stats_fallback": 1}, TASKS),
    "v2.1-stale-stats.json": ("v2.1", [], "aggregate", AGG_V2, {"stats_ignored": 1}, TASKS),
    "v2.1-no-tasks.jsonl": ("v2.1", [SJ, TJ], "aggregate", AGG_V2, {"tasks_fallback": 1}, TASKS),
    "v2.1-no-episodes.jsonl": ("v2.1", [SJ, EJ], "aggregate", AGG_V2, {"tasks_fallback": 1}, TASKS),
    "v2.1-no-task-files": ("v2.1", [SJ, TJ, EJ], "aggregate", AGG_V2, {"tasks_fallback": 1}, ["", ""]),
    # v3.0 as LeRobot leaves it: stats.json, per-episode stats/ columns in meta/episodes, tasks.parquet
    "v3.0": ("v3.0", [], "stats.json", "meta/stats.json", {}, TASKS),
    "v3.0-no-stats.json": ("v3.0", [SJ], "aggregate", AGG_V3, {"stats_fallback": 1}, TASKS),
    "v3.0-no-stats": ("v3.0", [SJ, "stats/"], "manifest", None, {"stats_fallback": 1}, TASKS),
    "v3.0-no-stats-columns": ("v3.0", ["stats/"], "stats.json", "meta/stats.json", {}, TASKS),
    "v3.0-no-tasks.parquet": ("v3.0", [TP], "stats.json", "meta/stats.json", {"tasks_fallback": 1}, TASKS),
    "v3.0-no-task-texts": ("v3.0", [TP, "tasks"], "stats.json", "meta/stats.json", {"tasks_fallback": 1}, ["", ""]),
}
MISSING_FILE = {  # warning kind -> the file its entry names, by the layout's removals
    "stats_fallback": lambda version: "meta/episodes_stats.jsonl" if version == "v2.1" else "meta/stats.json",
    "stats_ignored": lambda version: "meta/stats.json" if version == "v2.1" else "meta/episodes_stats.jsonl",
}


def _layout(bases: dict[str, Path], tmp_path: Path, version: str, removed: list[str]) -> Path:
    src = tmp_path / "src"
    shutil.copytree(bases[version], src)
    for name in removed:
        if name == "stats/":
            _stats_columns_dropped(src / V3_EPISODES)
        elif name == "tasks":
            _tasks_column_dropped(src / V3_EPISODES)
        else:
            (src / "meta" / name).unlink()
    return src


def _expected_stats(bases: dict[str, Path], version: str, kind: str, ds) -> dict:
    if kind == "stats.json":
        return {k: {s: np.asarray(v) for s, v in e.items()} for k, e in STATS_JSON.items()}
    if kind == "manifest":
        return ds.meta.manifest_stats
    if version == "v3.0":
        table = pq.read_table(bases[version] / V3_DATA)
        per_episode = [
            _episode_stats(table.filter(pc.equal(table["episode_index"], e)), e) for e in range(len(LENGTHS))
        ]
    else:
        lines = (bases[version] / "meta" / "episodes_stats.jsonl").read_text().splitlines()
        per_episode = [json.loads(line)["stats"] for line in lines]
    return lerobot_aggregate(per_episode)


def _frame_shown(version: str, episode: int, frame: int) -> int:
    """The number lerobotgen drew on the source frame of (episode, frame_index)."""
    return 1000 * episode + frame if version.startswith("v2") else sum(LENGTHS[:episode]) + frame


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_layout_opens_with_its_frames_tasks_and_lerobots_statistics(bases, tmp_path, layout):
    version, removed, stats_kind, stats_file, warned, texts = LAYOUTS[layout]
    src = _layout(bases, tmp_path, version, removed)
    out = tmp_path / "out"
    manifest = convert([str(src)], str(out), ConvertOptions(workers=1, progress=False))

    # the report: each fallback a counted warning naming the folder and the file
    assert dict(manifest.report.warnings_by_kind) == warned
    for w in manifest.report.warnings:
        assert w.dataset == "src" and str(src) in w.message, w
        if w.kind in MISSING_FILE:
            assert w.file == f"{src}/{MISSING_FILE[w.kind](version)}", w

    ds = EpishardLeRobotDataset(str(out), return_uint8=True, seed=0)
    # frames: one item per frame, each the source frame of its row
    seen = {}
    for item in ds:
        e, f = int(item["episode_index"]), int(item["frame_index"])
        assert (e, f) not in seen
        seen[(e, f)] = (decode_frame_number(item[CAM].numpy()), item["task"])
    assert sorted(seen) == [(e, f) for e, n in enumerate(LENGTHS) for f in range(n)]
    assert len(seen) == ds.meta.total_frames == sum(LENGTHS)
    assert all(shown == _frame_shown(version, e, f) for (e, f), (shown, _) in seen.items())
    # tasks: every item's text is its episode's
    assert all(task == texts[e] for (e, _), (_, task) in seen.items())
    assert ds.meta.episodes["tasks"] == [[t] if t else [] for t in texts]

    # statistics: what LeRobot normalises with, and where they came from
    if stats_file is None:
        assert ds.meta.stats_from == "manifest" and manifest.sources[0].stats is None
    else:
        assert ds.meta.stats_from == f"source (stored at conversion): {src}/{stats_file}"
    expected = _expected_stats(bases, version, stats_kind, ds)
    assert sorted(ds.meta.stats) == sorted(expected)
    for key, entry in expected.items():
        assert sorted(ds.meta.stats[key]) == sorted(entry), key
        for name, value in entry.items():
            np.testing.assert_allclose(ds.meta.stats[key][name], value, rtol=1e-12, atol=0, err_msg=f"{key}.{name}")
            assert np.shape(ds.meta.stats[key][name]) == np.shape(value), (key, name)


def test_the_aggregate_leaves_out_a_quantile_one_episode_lacks(bases, tmp_path):
    """LeRobot's rule: q01/q99 (every episode) are count-weighted; q50 (episode 0 only) is not aggregated."""
    src = _layout(bases, tmp_path, "v2.1", [SJ])
    out = tmp_path / "out"
    convert([str(src)], str(out), ConvertOptions(workers=1, progress=False))
    stats = EpishardLeRobotDataset(str(out)).meta.stats
    assert sorted(stats["action"]) == ["count", "max", "mean", "min", "q01", "q99", "std"]
    assert stats["action"]["count"].tolist() == [sum(LENGTHS)] and stats[CAM]["mean"].shape == (3, 1, 1)


def test_a_row_task_index_no_task_file_defines_is_an_empty_text_and_a_warning(bases, tmp_path):
    """Without meta/episodes.jsonl, episode 1's task_index 1 is not in meta/tasks.jsonl: "" and ``task_unknown``."""
    src = _layout(bases, tmp_path, "v2.1", [SJ, EJ])
    _jsonl(src / "meta" / "tasks.jsonl", [{"task_index": 0, "task": "fold"}])
    out = tmp_path / "out"
    manifest = convert([str(src)], str(out), ConvertOptions(workers=1, progress=False))
    assert dict(manifest.report.warnings_by_kind) == {"task_unknown": 1, "tasks_fallback": 1}
    (unknown,) = [w for w in manifest.report.warnings if w.kind == "task_unknown"]
    assert unknown.episode == 1 and "task_index 1" in unknown.message and "meta/tasks.jsonl" in unknown.message
    assert EpishardLeRobotDataset(str(out)).meta.episodes["tasks"] == [["fold"], []]


BAD_EPISODES_STATS = {
    "not-json": "{not json\n",
    "no-lines": "\n",
    "stats-text": json.dumps({"episode_index": 0, "stats": {"action": {"mean": "high"}}}) + "\n",
    "ragged": json.dumps(
        {"episode_index": 0, "stats": {"action": {k: [[1.0], [1.0, 2.0]] for k in ("mean", "std", "min", "max")}}}
    )
    + "\n",
    "count-shape": json.dumps(
        {
            "episode_index": 0,
            "stats": {"action": {"mean": [1.0], "std": [1.0], "min": [0.0], "max": [2.0], "count": [1, 2]}},
        }
    )
    + "\n",
    "no-std": json.dumps(
        {"episode_index": 0, "stats": {"action": {"mean": [1.0], "min": [0.0], "max": [2.0], "count": [3]}}}
    )
    + "\n",
    "zero-count": json.dumps(
        {
            "episode_index": 0,
            "stats": {"action": {"mean": [1.0], "std": [1.0], "min": [0.0], "max": [2.0], "count": [0]}},
        }
    )
    + "\n",
    "image-shape": json.dumps(
        {"episode_index": 0, "stats": {CAM: {"mean": [0.5], "std": [0.1], "min": [0.0], "max": [1.0], "count": [5]}}}
    )
    + "\n",
}


@pytest.mark.parametrize("bad", sorted(BAD_EPISODES_STATS))
def test_an_unusable_episodes_stats_file_falls_back_with_a_warning(bases, tmp_path, bad):
    """v2.1: a malformed meta/episodes_stats.jsonl is not aggregated: stats.json is used, and the warning says why."""
    src = _layout(bases, tmp_path, "v2.1", [])
    (src / "meta" / ES).write_text(BAD_EPISODES_STATS[bad])
    manifest = convert([str(src)], str(tmp_path / "out"), ConvertOptions(workers=1, progress=False))
    (warning,) = manifest.report.warnings
    assert warning.kind == "stats_fallback" and "meta/episodes_stats.jsonl is unusable (" in warning.message
    assert warning.message.endswith("the source statistics are meta/stats.json instead"), warning.message
    assert manifest.sources[0].stats == STATS_JSON and manifest.sources[0].stats_from == "meta/stats.json"


def test_a_fifo_for_episodes_stats_is_never_opened(bases, tmp_path):
    src = _layout(bases, tmp_path, "v2.1", [SJ])
    watch = FifoWatch(src / "meta" / ES)
    try:
        manifest = convert([str(src)], str(tmp_path / "out"), ConvertOptions(workers=1, progress=False))
    finally:
        opened = watch.stop()
    assert not opened
    (warning,) = manifest.report.warnings
    assert warning.kind == "stats_fallback" and "refused unread" in warning.message
    assert manifest.sources[0].stats is None


def test_the_console_says_each_fallback(bases, tmp_path, capsys):
    src = _layout(bases, tmp_path, "v2.1", [SJ, ES, TJ])
    assert cli(["convert", str(src), str(tmp_path / "out"), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert (
        f"warning x1 stats_fallback: {src}: LeRobot v2.1 normalises with the aggregate of meta/episodes_stats.jsonl"
        in printed
    )
    assert f"warning x1 tasks_fallback: {src}: meta/tasks.jsonl is absent" in printed


def test_a_v3_dataset_without_meta_episodes_is_refused_naming_folder_and_file(bases, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(bases["v3.0"], src)
    shutil.rmtree(src / "meta" / "episodes")
    with pytest.raises(SourceError) as info:
        convert([str(src)], str(tmp_path / "out"), ConvertOptions(workers=1, progress=False))
    assert str(info.value).startswith(f"{src}: LeRobot v3.0 dataset without meta/episodes/*.parquet")
    assert not os.path.exists(tmp_path / "out" / "manifest.json")
