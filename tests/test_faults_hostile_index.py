"""Hostile input that would kill the process: index values that size allocations, JSON bombs,
terminal escapes.

The index forgeries are consistent (``faultgen.rewrite_index`` recomputes every digest, the
manifest's sizes and counts are edited to match), so only bounds taken from what the bytes can
hold catch them. They run in one child process under a 3 GiB address-space limit
(``RLIMIT_AS``): a regression fails fast with a ``MemoryError`` there instead of eating the machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from faultgen import CAMERA, SPEC, copy, manifest, rewrite_index, write_manifest
from lerobotgen import write_v2

from epishard.cli import main
from epishard.format.errors import FormatError
from epishard.format.untrusted import MAX_JSON_BYTES, loads, printable
from epishard.shardwriter import verify
from epishard.shardwriter.errors import SourceError
from epishard.shardwriter.lerobot import read_lerobot
from epishard.stream import WindowDataset
from epishard.stream.decode import DecodeError
from epishard.stream.fetch import FetchPolicy
from epishard.stream.options import ReadOptions

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
BIG = 1 << 31
LIMIT = 3 << 30  # the child's address space: a 16 GiB table from a forged count cannot be allocated
PACKETS = ("packet_size", "packet_frame", "packet_crc32", "packet_offset")
DEEP = 10**6


def _mp4(row: dict) -> dict:
    return next(m for m in row["members"] if m["name"].endswith(".mp4"))


def _member(row: dict, ext: str) -> dict:
    return next(m for m in row["members"] if m["name"].endswith(ext))


def _no_packets(camera: dict) -> None:
    for key in PACKETS:
        camera[key] = []


def _consistent_manifest(root: str, shard: int, size: int) -> None:
    """The manifest's shard size (and totals) set as a forger who also edits the manifest would."""
    m = manifest(root)
    m["totals"]["bytes"] += size - m["shards"][shard]["size"]
    m["shards"][shard]["size"] = size
    write_manifest(root, m)


def _past_the_end(root: str) -> None:
    """Episode 3 (last of shard 1): its video claims 2 GiB and 2^31 - 1 frames; the shard 2 GiB more."""

    def edit(rows):
        cam = rows[3]["cameras"][0]
        _mp4(rows[3])["size"] = BIG
        cam["num_frames"] = BIG - 1
        _no_packets(cam)

    rewrite_index(root, edit)
    _consistent_manifest(root, 1, 20480 + BIG)


def _rows_past_the_end(root: str) -> None:
    """Episode 1 (last of shard 0): 2^31 - 1 rows, a 2 GiB table and a 2 GiB video after it."""

    def edit(rows):
        row, cam = rows[1], rows[1]["cameras"][0]
        table, video = _member(row, ".parquet"), _mp4(row)
        table["size"] = BIG
        video["offset"] = table["offset"] + BIG + 512
        video["size"] = BIG
        row["num_rows"] = row["window_stop"] = BIG - 1
        cam["num_frames"] = BIG - 1
        _no_packets(cam)

    rewrite_index(root, edit)
    m = manifest(root)
    m["shards"][0]["rows"] += BIG - 1 - 20
    m["shards"][0]["frames"] += BIG - 1 - 20
    m["totals"]["rows"] += BIG - 1 - 20
    m["totals"]["frames"] += BIG - 1 - 20
    write_manifest(root, m)
    video = _mp4(_rows(root)[1])
    _consistent_manifest(root, 0, video["offset"] + video["size"] + 1024)


def _overlapping(root: str) -> None:
    """Episode 2 (first of shard 1): its video claims 2 GiB, over the next episode's members."""

    def edit(rows):
        _mp4(rows[2])["size"] = BIG
        rows[2]["cameras"][0]["num_frames"] = BIG - 1
        _no_packets(rows[2]["cameras"][0])

    rewrite_index(root, edit)
    _consistent_manifest(root, 1, 20480 + BIG)


def _rows_over_table(root: str) -> None:
    """Episode 3: 2^31 - 1 rows and frames; its (last) video member claims 2 GiB, the shard with it."""

    def edit(rows):
        row, cam = rows[3], rows[3]["cameras"][0]
        _mp4(row)["size"] = BIG
        row["num_rows"] = row["window_stop"] = BIG - 1
        cam["num_frames"] = BIG - 1
        _no_packets(cam)

    rewrite_index(root, edit)
    _consistent_manifest(root, 1, 20480 + BIG)


def _huge_manifest(root: str) -> None:
    """A manifest whose last value is a 2 GiB string (a sparse file: no disk is used)."""
    path = os.path.join(root, "manifest.json")
    text = Path(path).read_text().rstrip()
    assert text.endswith("}")
    with open(path, "w") as f:
        f.write(text[:-1] + ', "padding": "')
        f.truncate(BIG)
        f.seek(BIG)
        f.write('"}')


def _rows(root: str) -> list[dict]:
    import pyarrow.feather as feather

    return feather.read_table(os.path.join(root, "index.arrow")).to_pylist()


FORGERIES = {
    "past_the_end": _past_the_end,
    "rows_past_the_end": _rows_past_the_end,
    "overlapping": _overlapping,
    "rows_over_table": _rows_over_table,
    "huge_manifest": _huge_manifest,
}

_CHILD = r"""
import hashlib, json, resource, sys, warnings
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from faultgen import CAMERA, SPEC
from epishard.cli import main
from epishard.shardwriter import verify
from epishard.shardwriter.describe import describe
from epishard.stream import WindowDataset
from epishard.stream.fetch import FetchPolicy
from epishard.stream.options import ReadOptions

def run(step):
    try:
        return step()
    except BaseException as exc:  # MemoryError, RuntimeError("can't start new thread"), ...
        return {"error": f"{type(exc).__name__}: {exc}"[:600]}

options = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None

def read(root, policy):
    def step():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            reading = ReadOptions(storage_options=options, fetch=FetchPolicy(on_shard_error=policy))
            ds = WindowDataset(root, SPEC, seed=5, read=reading)
            samples = [
                [int(s["episode_index"]), int(s["frame_index"]), bool(s["substitute"]),
                 hashlib.sha256(s[CAMERA].numpy().tobytes()).hexdigest()]
                for s in ds
            ]
        return {"samples": samples, "warnings": [str(w.message) for w in caught]}
    return run(step)

STREAM = ["--workers", "0", "--batches", "2", "--batch-size", "2", "--frames", "2", "--span", "5",
          "--action-horizon", "2", "--boundary", "pad", "--quiet"]
if options:
    STREAM += ["--storage-options", json.dumps(options)]
out = {}
for case, root in json.loads(sys.argv[1]).items():
    out[case] = {
        "skip": read(root, "skip"),
        "raise": read(root, "raise"),
        "verify": run(lambda: verify(root, decode=False, storage_options=options)),
        "describe": run(lambda: {"episodes": describe(root, options)["totals"]["episodes"]}),
        "stream": run(lambda: {"code": main(["stream", root, *STREAM])}),
    }
print("RESULT " + json.dumps(out))
"""


def _in_child(roots: dict[str, str], options: dict | None = None) -> dict[str, dict]:
    """Run ``_CHILD`` on ``roots`` (case -> dataset URL) under the memory limit; its results per case."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, REPO])}
    argv = [sys.executable, "-c", _CHILD, json.dumps(roots), str(LIMIT)] + ([json.dumps(options)] if options else [])
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.fixture(scope="module")
def forged(intact, tmp_path_factory) -> dict[str, tuple[str, dict]]:
    """Each forgery's folder and what the reader, ``verify``, ``inspect`` and ``stream`` did with it
    in the memory-limited child."""
    base = tmp_path_factory.mktemp("forged")
    roots = {}
    for name, forge in FORGERIES.items():
        roots[name] = copy(intact, str(base / name))
        forge(roots[name])
    results = _in_child(roots)
    return {name: (roots[name], results[name]) for name in FORGERIES}


def _hash(sample) -> str:
    return hashlib.sha256(sample[CAMERA].numpy().tobytes()).hexdigest()


def _expected(keyed_reference, episodes) -> set[tuple]:
    return {(e, f, False, _hash(s)) for (e, f), s in keyed_reference.items() if e in episodes}


def _substituted(samples: list, keyed_reference, episodes: set[int], substitutes: int) -> None:
    """The failed shard's windows are substitutes: repeats (flagged) of the kept ``episodes``' samples."""
    real = {tuple(s) for s in samples if not s[2]}
    assert real == _expected(keyed_reference, episodes)
    repeats = [(e, f, False, h) for e, f, sub, h in samples if sub]
    assert len(repeats) == substitutes
    assert set(repeats) <= real


def test_a_video_claiming_bytes_past_the_shard_file_substitutes_its_shard_or_raises(forged, keyed_reference):
    root, got = forged["past_the_end"]
    reason = (
        f"{root}/shard-000001.tar: 20480 bytes, the manifest's shards[1].size says {20480 + BIG} "
        "(replaced, truncated or forged after conversion"
    )
    skip = got["skip"]
    assert "samples" in skip, skip
    # The plan is the index's: all 120 windows, the 40 of shard 1 (episodes 2 and 3) substitutes.
    assert len(skip["samples"]) == 120
    _substituted(skip["samples"], keyed_reference, {0, 1, 4, 5}, 40)
    assert [w for w in skip["warnings"] if w.startswith("epishard: skipping episode g-e000003: " + reason)]
    assert [w for w in skip["warnings"] if w.startswith("epishard: skipping shard 1 (2 episodes): " + reason)]
    assert got["raise"]["error"].startswith("FormatError: " + reason)
    messages = [p["message"] for p in got["verify"]["problems"]]
    assert f"size 20480 != manifest {20480 + BIG}" in messages
    assert f"member g-e000003.front.mp4 at (13824, 2197) in the tar, index says (13824, {BIG})" in messages
    assert got["verify"]["ok"] is False
    assert got["stream"] == {"code": 0}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_truncated_shard_under_skip_keeps_the_plan_with_substitutes(intact, keyed_reference, tmp_path, workers):
    """A shard cut to half its size fails on open, but stays planned: every rank keeps its
    sample and batch count (a rank seeing another file state would otherwise hang DDP)."""
    from epishard.stream import WindowLoader

    root = copy(intact, str(tmp_path / "cut"))
    clean = len(WindowLoader(WindowDataset(intact, SPEC, seed=5), batch_size=4, num_workers=workers))
    path = f"{root}/shard-000001.tar"
    os.truncate(path, os.path.getsize(path) // 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = WindowDataset(root, SPEC, seed=5, read=ReadOptions(fetch=FetchPolicy(on_shard_error="skip")))
        assert list(ds.sources[0].skipped_shards) == [1]
        loader = WindowLoader(ds, batch_size=4, num_workers=workers)
        batches = list(loader)
    assert clean == 30 and len(loader) == 30 and len(batches) == 30
    episodes = torch.cat([b["episode_index"].reshape(-1) for b in batches]).tolist()
    frames = torch.cat([b["frame_index"].reshape(-1) for b in batches]).tolist()
    flags = torch.cat([b["substitute"].reshape(-1) for b in batches]).tolist()
    assert len(flags) == 120 and sum(flags) == 40  # shard 1's 40 windows (episodes 2, 3)
    assert {e for e, f in zip(episodes, flags, strict=True) if not f} == {0, 1, 4, 5}
    real = {(e, f) for e, f, sub in zip(episodes, frames, flags, strict=True) if not sub}
    assert real == {k for k in keyed_reference if k[0] in {0, 1, 4, 5}}
    messages = [str(w.message) for w in caught]
    assert [m for m in messages if m.startswith("epishard: skipping shard 1 (2 episodes): ")]
    if workers == 0:  # a worker's warnings stay in its process
        assert [m for m in messages if m.startswith("epishard: skipping episode g-e000002: ")]


ROWS_REFUTED = f"its index claims {BIG - 1 + 20} rows, more than the file's 20480 bytes can hold"


def test_two_billion_rows_backed_by_nothing_are_refused_not_planned(forged):
    """A failed shard stays planned (substitutes), so rows its file cannot hold are refused under skip too."""
    root, got = forged["rows_past_the_end"]
    size = manifest(root)["shards"][0]["size"]
    reason = f"{root}/shard-000000.tar: 20480 bytes, the manifest's shards[0].size says {size} "
    assert got["skip"]["error"].startswith("FormatError: " + reason), got["skip"]
    assert ROWS_REFUTED in got["skip"]["error"]
    assert got["raise"]["error"].startswith("FormatError: " + reason)
    assert f"size 20480 != manifest {size}" in [p["message"] for p in got["verify"]["problems"]]
    assert got["stream"] == {"code": 2}


def test_a_forged_shard_in_a_bucket_is_refused_by_its_listed_size(forged, moto_s3):
    """Remote: the folder's listing states each shard's size, so the same forgery is caught over S3."""
    options, fs = moto_s3
    fs.mkdir("g4-forged")
    fs.put(forged["rows_past_the_end"][0] + "/", "g4-forged/ds/", recursive=True)
    url = "s3://g4-forged/ds"
    got = _in_child({"s3": url}, options)["s3"]
    size = manifest(forged["rows_past_the_end"][0])["shards"][0]["size"]
    reason = f"{url}/shard-000000.tar: 20480 bytes, the manifest's shards[0].size says {size} "
    assert got["skip"]["error"].startswith("FormatError: " + reason), got["skip"]
    assert ROWS_REFUTED in got["skip"]["error"]
    assert got["raise"]["error"].startswith("FormatError: " + reason)
    assert got["stream"] == {"code": 2}


def test_a_member_running_into_the_next_is_refused_naming_its_episode(forged):
    root, got = forged["overlapping"]
    message = (
        f"FormatError: {root}/index.arrow: row 2 (episode g-e000002): members.offset/size run into the next "
        "member of the shard (members follow one another in the tar)"
    )
    assert got["skip"]["error"] == message and got["raise"]["error"] == message
    assert any("members.offset/size run into the next member" in p["message"] for p in got["verify"]["problems"])
    assert "members.offset/size run into the next member" in got["describe"]["error"]


def test_more_rows_than_bytes_of_the_table_member_are_refused(forged):
    root, got = forged["rows_over_table"]
    message = (
        f"FormatError: {root}/index.arrow: row 3 (episode g-e000003): num_rows 2147483647 is more than the "
        "bytes of its .parquet table member (a row needs at least one)"
    )
    assert got["skip"]["error"] == message and got["raise"]["error"] == message
    assert any("num_rows 2147483647 is more than the bytes" in p["message"] for p in got["verify"]["problems"])


def test_a_two_gib_manifest_is_refused_unread(forged):
    _, got = forged["huge_manifest"]
    said = f"manifest.json: {BIG + 2} bytes, more than the {MAX_JSON_BYTES} bytes a metadata file may have"
    for step in ("skip", "raise", "verify", "describe"):
        assert got[step]["error"].startswith("FormatError: ") and said in got[step]["error"], (step, got[step])
    assert got["stream"] == {"code": 2}


# --- frame counts a member can hold but its video does not have -----------------------------------


@pytest.fixture(scope="module")
def claimed(intact, tmp_path_factory) -> str:
    """Episode 2 claims as many frames as its video member has bytes (within every byte bound), no packet table."""
    root = copy(intact, str(tmp_path_factory.mktemp("claimed") / "ds"))

    def edit(rows):
        cam = rows[2]["cameras"][0]
        cam["num_frames"] = _mp4(rows[2])["size"]
        _no_packets(cam)

    rewrite_index(root, edit)
    return root


def test_more_frames_than_the_container_lists_skip_the_episode(claimed, keyed_reference):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = list(WindowDataset(claimed, SPEC, seed=5, read=ReadOptions(fetch=FetchPolicy(on_shard_error="skip"))))
    real = {(int(s["episode_index"]), int(s["frame_index"])): s for s in samples if not s["substitute"]}
    assert len(samples) == len(keyed_reference)
    assert set(real) == {k for k in keyed_reference if k[0] != 2}
    assert all(_hash(s) == _hash(keyed_reference[k]) for k, s in real.items())
    said = f"camera {CAMERA}: the index's num_frames 2175 is more than the 20 frames its video's container lists"
    assert [w for w in caught if "skipping episode g-e000002" in str(w.message) and said in str(w.message)]
    with pytest.raises(DecodeError, match=f"episode g-e000002 {said}"):
        list(WindowDataset(claimed, SPEC, seed=5, read=ReadOptions(fetch=FetchPolicy(on_shard_error="raise"))))


def test_verify_holds_num_frames_against_the_container(claimed):
    result = verify(claimed)
    assert result["ok"] is False
    assert {
        "shard": "shard-000001.tar",
        "episode": "g-e000002",
        "camera": CAMERA,
        "message": "the index's num_frames 2175 is more than the 20 frames the video's container lists",
    } in result["problems"]


def test_verify_checks_the_manifest_counts(intact, tmp_path):
    root = copy(intact, str(tmp_path / "ds"))
    m = manifest(root)
    m["shards"][0]["frames"] = 1 << 40
    m["shards"][1]["rows"] = 7
    m["totals"]["frames"] = 1 << 40
    write_manifest(root, m)
    result = verify(root, decode=False)
    assert result["ok"] is False
    assert [p["message"] for p in result["problems"]] == [
        f"manifest shards[0].frames is {1 << 40}, the index holds 40",
        "manifest shards[1].rows is 7, the index holds 40",
        "manifest totals.rows is 120, the shards add up to 87",
        f"manifest totals.frames is {1 << 40}, the shards add up to {(1 << 40) + 80}",
    ]


# --- JSON bombs -------------------------------------------------------------------------------------


def test_bounded_json_nesting_and_size():
    assert loads("[" * 64 + "]" * 64, "x.json") == loads("[" * 64 + "]" * 64, "y.json")
    for text in ("[" * 65 + "]" * 65, '{"a":' * DEEP + "1" + "}" * DEEP, "[" * DEEP):
        with pytest.raises(FormatError, match=r"^x.json: arrays and objects nested deeper than 64 levels: refused$"):
            loads(text, "x.json", FormatError)
    with pytest.raises(ValueError, match=r"^x.json: not valid JSON \("):
        loads(b"\xff{}", "x.json")
    with pytest.raises(ValueError, match=r"^x.json: 11 bytes, more than the 10 bytes a metadata file may have"):
        loads(b'"123456789"', "x.json", max_bytes=10)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("lerobot") / "toy")
    write_v2(root, [6, 5], [CAMERA], fps=10)
    return root


def _deep_line() -> str:
    return '{"episode_index": 1, "tasks": ' + "[" * DEEP + "]" * DEEP + "}"


def test_a_deep_info_json_is_one_line_naming_the_file(source, tmp_path, capsys):
    src = copy(source, str(tmp_path / "src"))
    Path(src, "meta", "info.json").write_text('{"fps": ' + "[" * DEEP + "]" * DEEP + "}")
    assert main(["convert", src, str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"epishard convert: error: {src}/meta/info.json: arrays and objects nested deeper than 64 levels: refused"
    )
    assert not os.path.exists(tmp_path / "out" / "manifest.json")


@pytest.mark.parametrize("name", ["episodes.jsonl", "tasks.jsonl"])
def test_a_deep_jsonl_line_names_the_file_and_line(source, tmp_path, name):
    src = copy(source, str(tmp_path / "src"))
    path = Path(src, "meta", name)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], _deep_line(), *lines[2:]]) + "\n")
    with pytest.raises(SourceError) as err:
        read_lerobot(src)
    assert str(err.value) == f"{path}: line 2: arrays and objects nested deeper than 64 levels: refused"


def test_an_oversized_info_json_is_refused_unread(source, tmp_path):
    src = copy(source, str(tmp_path / "src"))
    path = Path(src, "meta", "info.json")
    with open(path, "r+b") as f:  # sparse: the size the file system states is what is refused
        f.truncate(MAX_JSON_BYTES + 1)
    with pytest.raises(SourceError) as err:
        read_lerobot(src)
    assert str(err.value) == (
        f"{path}: {MAX_JSON_BYTES + 1} bytes, more than the {MAX_JSON_BYTES} bytes a metadata file may have "
        "(epishard.format.untrusted.MAX_JSON_BYTES): refused unread"
    )


# --- terminal escapes -------------------------------------------------------------------------------

ESCAPES = "\x1b]0;owned\x07\x1b[2J\r\u202e"
SHOWN = "\\x1b]0;owned\\x07\\x1b[2J\\r\\u202e"


def test_printable_escapes_control_characters_only():
    assert printable("café ✓ " + ESCAPES + "\n") == "café ✓ " + SHOWN + "\\n"


def test_inspect_and_verify_print_no_raw_escapes(intact, tmp_path, capsys):
    root = copy(intact, str(tmp_path / "ds"))
    m = manifest(root)
    m["sources"][0]["name"] = "g" + ESCAPES
    m["shards"][2]["shard"] = "shard" + ESCAPES + ".tar"
    write_manifest(root, m)
    assert main(["inspect", root]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\u202e" not in out
    assert f"  source g{SHOWN} (python, 20 fps): 6 episodes" in out.splitlines()
    assert f"  shard{SHOWN}.tar: 2 episodes, 40 rows, 0.0 MB" in out.splitlines()
    assert main(["verify", root, "--no-decode"]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and f"missing file {root}/shard{SHOWN}.tar" in out


def test_control_characters_in_index_names_are_refused_and_shown_escaped(intact, tmp_path):
    root = copy(intact, str(tmp_path / "ds"))

    def edit(rows):
        rows[2]["key"] = "g-e000002" + ESCAPES

    rewrite_index(root, edit)
    with pytest.raises(FormatError) as err:
        WindowDataset(root, SPEC)
    assert str(err.value) == f"{root}/index.arrow: row 2 (episode g-e000002{SHOWN}): key holds a control character"
    root = copy(intact, str(tmp_path / "ds2"))

    def camera(rows):
        rows[2]["cameras"][0]["name"] = CAMERA + "\x1b[2J"

    rewrite_index(root, camera)
    with pytest.raises(FormatError) as err:
        WindowDataset(root, SPEC)
    assert str(err.value) == (
        f"{root}/index.arrow: row 2 (episode g-e000002), camera {CAMERA}\\x1b[2J: name holds a control character"
    )


def test_the_child_limit_is_in_force():
    """The memory-limited child really cannot allocate a forged count's table (guards the harness)."""
    code = (
        "import resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({LIMIT}, {LIMIT}))\n"
        "try:\n    bytearray(4 << 30)\nexcept MemoryError:\n    sys.exit(7)\n"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 7


@pytest.mark.parametrize(
    "name, said",
    [
        ("manifest.json", "holds a finished conversion of other sources or options; nothing was changed"),
        (".epishard-convert.json", "not empty and not made by epishard convert"),
    ],
)
def test_a_deep_json_in_the_output_folder_is_refused_not_a_crash(source, tmp_path, capsys, name, said):
    out = str(tmp_path / "out")
    assert main(["convert", source, out, "--quiet"]) == 0
    Path(out, name).write_text("[" * DEEP + "]" * DEEP)
    capsys.readouterr()
    assert main(["convert", source, out, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"epishard convert: error: {out}: ") and said in err[-1], err


# --- forged statistics and totals -------------------------------------------------------------------


def _forged_stats(intact: str, path: Path, edit) -> str:
    root = copy(intact, str(path))
    m = manifest(root)
    edit(m["stats"])
    write_manifest(root, m)  # json.dump writes NaN and Infinity as the writer would
    return root


def _set(column: str, **values):
    return lambda stats: stats[column].update(values)


@pytest.mark.parametrize(
    "edit, said",
    [
        (_set("action", std=[1.0, -0.5, 1.0]), "stats['action'].std[1] is -0.5; must be finite and >= 0"),
        (_set("action", mean=[0.0, float("nan"), 0.0]), "stats['action'].mean[1] is nan; must be finite"),
        (_set("action", mean=[float("inf")] * 3), "stats['action'].mean[0] is inf; must be finite"),
        (_set("observation.state", q99=[0.0, 0.0, float("-inf"), 0.0]), "stats['observation.state'].q99[2] is -inf"),
        (
            _set("action", mean=[0.0] * 5),
            "stats['action'].mean has 5 values; features['action'].shape is [3] (3 per row)",
        ),
        (_set("action", mean=[0.0] * 10**5), "stats['action'].mean has 100000 values; features['action'].shape is [3]"),
    ],
    ids=["std_negative", "mean_nan", "mean_inf", "q99_inf", "mean_length_5", "mean_length_1e5"],
)
def test_forged_statistics_are_refused_on_load_naming_the_feature_and_statistic(intact, tmp_path, capsys, edit, said):
    """Negative std (would flip signs), non-finite statistics of a column whose values the writer
    keeps finite, or lists longer or shorter than the feature's declared shape: refused by every
    reader, ``verify`` included, naming the file, the feature and the statistic."""
    root = _forged_stats(intact, tmp_path / "ds", edit)
    where = f"{root}/manifest.json: "
    with pytest.raises(FormatError) as err:
        WindowDataset(root, SPEC, seed=0, normalize={"action": "mean_std", "observation.state": "min_max"})
    assert str(err.value).startswith(where + said), err.value
    capsys.readouterr()
    assert main(["verify", root, "--no-decode"]) == 2
    assert capsys.readouterr().err.strip().startswith(f"epishard verify: error: {where}{said}")


def test_a_zero_std_is_kept_and_divides_by_eps(intact, tmp_path):
    """A constant dimension has std 0 (``epishard.format.stats``): loaded, normalised with ``max(std, eps)``."""
    root = _forged_stats(intact, tmp_path / "ds", _set("action", mean=[0.0] * 3, std=[0.0] * 3))
    assert verify(root, decode=False)["ok"] is True
    ds = WindowDataset(root, SPEC, seed=0, normalize={"action": "mean_std"})
    assert ds.normalizers[0]["g"]["action"].scale.tolist() == pytest.approx([1e-8] * 3)


def test_a_statistic_missing_when_normalising_names_the_file_and_key(intact, tmp_path):
    root = _forged_stats(intact, tmp_path / "ds", lambda stats: stats["action"].pop("std"))
    assert verify(root, decode=False)["ok"] is True  # not needed unless normalising
    with pytest.raises(FormatError, match=r"^manifest\.json: stats\['action'\] has no 'std' \(normalising needs it\)$"):
        WindowDataset(root, SPEC, seed=0, normalize={"action": "mean_std"})
    WindowDataset(root, SPEC, seed=0, normalize={"action": "min_max"})  # min and max are there


def test_nan_statistics_of_an_unchecked_column_load_but_do_not_normalise(intact, tmp_path):
    """The writer keeps NaN in columns other than action and observation.state, and writes their
    statistics as NaN: such a manifest loads; normalising with them is refused."""
    from faultgen import loaded

    from epishard.stream.mix import normalizers

    nan = float("nan")
    entry = {"count": 120, "mean": [nan], "std": [nan], "min": [nan], "max": [nan], "q01": [nan], "q99": [nan]}
    root = _forged_stats(intact, tmp_path / "ds", lambda stats: stats.update({"next.reward": entry}))
    m = loaded(root)
    with pytest.raises(
        FormatError, match=r"^manifest\.json: stats\['next\.reward'\]\.mean\[0\] is nan; must be finite$"
    ):
        normalizers(m, {"next.reward": "mean_std"}, "g")


def test_forged_totals_are_refused_by_inspect_and_named_by_verify(intact, tmp_path, capsys):
    root = copy(intact, str(tmp_path / "ds"))
    m = manifest(root)
    m["totals"].update(shards=1 << 40, episodes=1 << 40)
    write_manifest(root, m)
    capsys.readouterr()
    assert main(["inspect", root]) == 2
    assert capsys.readouterr().err.strip() == (
        f"epishard inspect: error: {root}/manifest.json: totals.shards is {1 << 40}, the shards add up to 3; "
        f"totals.episodes is {1 << 40}, the shards add up to 6 (run epishard verify)"
    )
    assert main(["verify", root, "--no-decode"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [
        f"  file=manifest.json: manifest totals.shards is {1 << 40}, the shards add up to 3",
        f"  file=manifest.json: manifest totals.episodes is {1 << 40}, the shards add up to 6",
    ]
