"""HDF5 sources from a stranger: nothing outside the source is read, every claim is bounded, every failure named.

Each attack is converted end to end (``convert`` and the CLI) as a user would. Conversions that could
hang (a FIFO named as external storage) or allocate what a file claims (a gzip bomb, 10^12 rows) run
in a child process under an address-space limit (RLIMIT_AS) and a timeout. A FIFO target has a
writer opening it with O_NONBLOCK in a loop: ENXIO means no reader opened it; a success is recorded.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import threading
import zlib

import numpy as np
import pytest
from sourcecheck import column, read_back

from epishard.cli import main
from epishard.shardwriter import ConversionError, ConvertOptions, SourceError, convert
from epishard.shardwriter.sources import SourceOptions

h5py = pytest.importorskip("h5py")

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
LIMIT = 3 << 30  # the child's address space: a 3.1 GiB column cannot be allocated in it
CANARY = "canary-secret-0123456789"  # the child's AWS_SECRET_ACCESS_KEY, in its /proc/self/environ
T = 5  # rows per episode
QPOS = "observations/qpos"
CAMERA = "observations/images/top"
UP = "../" * 40  # enough to climb from any folder to /


def _qpos(e: int, t: int = T) -> np.ndarray:
    return np.arange(t * 14, dtype=np.float64).reshape(t, 14) * 0.001 + e


def _frames(e: int, t: int = T) -> np.ndarray:
    ramp = np.arange(16, dtype=np.uint8)[None, :, None, None] * 8
    return ramp + np.arange(t, dtype=np.uint8)[:, None, None, None] * 20 + 60 * e + np.zeros((t, 16, 16, 3), np.uint8)


def _episode(path, e: int, forge=None) -> None:
    """An ALOHA episode file (qpos, action, one camera), then ``forge(file, e)`` changes it."""
    with h5py.File(path, "w") as f:
        f.create_dataset(QPOS, data=_qpos(e))
        f.create_dataset("action", data=2 * _qpos(e))
        f.create_dataset(CAMERA, data=_frames(e))
        if forge is not None:
            forge(f, e)


def _aloha(root, forged: dict | None = None, n: int = 3) -> str:
    """A folder of ``n`` episodes, episode ``e`` changed by ``forged[e]``."""
    os.makedirs(root, exist_ok=True)
    for e in range(n):
        _episode(os.path.join(root, f"episode_{e}.hdf5"), e, (forged or {}).get(e))
    return str(root)


def _replace(key: str, make):
    """A forge replacing ``key`` with what ``make(file, key, e)`` puts there (a dataset or a link)."""

    def forge(f, e):
        del f[key]
        make(f, key, e)

    return forge


def _external(target: str):
    return _replace(
        QPOS, lambda f, k, e: f.create_dataset(k, shape=(T, 14), dtype="f8", external=[(target, 0, T * 14 * 8)])
    )


def _link(target_file: str, target_path: str, key: str = QPOS):
    return _replace(key, lambda f, k, e: f.__setitem__(k, h5py.ExternalLink(target_file, target_path)))


def _virtual(source_file: str, source_path: str = "/q"):
    def make(f, k, e):
        layout = h5py.VirtualLayout(shape=(T, 14), dtype="f8")
        layout[:] = h5py.VirtualSource(source_file, source_path, shape=(T, 14))
        f.create_virtual_dataset(k, layout, fillvalue=-1.0)

    return _replace(QPOS, make)


def _opts(**kw) -> ConvertOptions:
    return ConvertOptions(progress=False, **kw)


@contextlib.contextmanager
def _fifo(path):
    """A FIFO at ``path`` whose writer records each time a reader has it open (yields that list)."""
    os.mkfifo(path)
    opened: list[int] = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                assert exc.errno == errno.ENXIO, exc  # ENXIO: no reader has it open
            else:
                opened.append(1)
                os.close(fd)
            stop.wait(0.002)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield opened
    finally:
        stop.set()
        thread.join()


_CHILD = r"""
import json, resource, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from epishard.shardwriter import ConvertOptions, convert
from epishard.shardwriter.sources import SourceOptions, bounds

saved = {k: getattr(bounds, k) for k in dir(bounds) if k.startswith("MAX_")}
out = {}
for name, case in json.loads(sys.argv[2]).items():
    for k, v in saved.items():
        setattr(bounds, k, v)
    for k, v in case.get("bounds", {}).items():
        setattr(bounds, k, v)
    try:
        options = SourceOptions(format="aloha", allow_external=case.get("allow", False))
        m = convert([case["source"]], case["out"],
                    ConvertOptions(progress=False, on_error=case.get("on_error", "raise"), sources=options))
        out[name] = {"ok": True, "episodes": m.totals.episodes, "rows": m.totals.rows,
                     "skipped": dict(m.report.skipped_by_kind), "notes": list(m.sources[0].notes)}
    except BaseException as exc:  # MemoryError, [internal], SourceError, ...
        out[name] = {"error": type(exc).__name__, "kind": getattr(exc, "kind", None),
                     "episode": getattr(exc, "episode", None), "path": getattr(exc, "path", None),
                     "detail": getattr(exc, "detail", None), "text": str(exc)[:3000]}
print("RESULT " + json.dumps(out))
"""


def _in_child(cases: dict, cwd, timeout: int = 240) -> dict:
    """Convert each case (``source``, ``out``, ``on_error``, ``allow``, ``bounds``) in a child process
    under ``LIMIT`` of address space; each case's result (``ok`` and counts, or the error's fields)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, REPO]), "AWS_SECRET_ACCESS_KEY": CANARY}
    argv = [sys.executable, "-c", _CHILD, str(LIMIT), json.dumps(cases)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=str(cwd), timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the conversion hung (no result in {timeout} s)")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def _fields(exc: Exception) -> dict:
    """An error's fields as ``_in_child`` reports them."""
    return {"error": type(exc).__name__, **{k: getattr(exc, k, None) for k in ("kind", "episode", "path", "detail")}}


def _refused_at_open(result: dict, *names: str) -> None:
    assert result.get("error") == "SourceError", result
    for name in names:
        assert name in result["text"], (name, result)


def _refused_in_worker(result: dict, kind: str, episode: int, *names: str) -> None:
    assert (result.get("error"), result.get("kind"), result.get("episode")) == ("ConversionError", kind, episode), (
        result
    )
    assert f"episode_{episode}.hdf5" in result["path"], result
    for name in names:
        assert name in result["detail"], (name, result)


# 1. External raw storage, external links, soft links, remote sources.


def test_external_storage_is_refused_unread_naming_file_key_and_target(tmp_path):
    fifo = str(tmp_path / "fifo")
    targets = {
        "passwd": "/etc/passwd",
        "environ": "/proc/self/environ",
        "fifo": fifo,
        "relative": UP + "etc/passwd",  # HDF5 resolves it from the working folder
    }
    cases = {}
    for name, target in targets.items():
        for e, where in ((0, "first"), (1, "other")):
            root = _aloha(tmp_path / f"{name}-{where}", {e: _external(target)})
            cases[f"{name}-{where}"] = {"source": root, "out": str(tmp_path / f"out-{name}-{where}")}
    with _fifo(fifo) as opened:
        results = _in_child(cases, cwd=tmp_path)
    assert opened == [], "the FIFO named as external storage was opened"
    for name, target in targets.items():
        _refused_at_open(results[f"{name}-first"], "episode_0.hdf5", f"'{QPOS}'", target, "external storage")
        _refused_in_worker(results[f"{name}-other"], "outside_source", 1, f"'{QPOS}'", target, "external storage")
        assert "--allow-external" in results[f"{name}-other"]["detail"]
    for out in tmp_path.glob("out-*"):  # nothing of the environment reached a shard
        for shard in out.glob("*.tar"):
            assert CANARY.encode() not in shard.read_bytes()


def test_the_cli_prints_a_named_refusal_not_an_unexpected_error(tmp_path, capsys):
    root = _aloha(tmp_path / "src", {1: _external("/etc/passwd")})
    assert main(["convert", root, str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "[outside_source]" in err and "episode_1.hdf5" in err and f"'{QPOS}'" in err, err
    assert "/etc/passwd" in err and "unexpected" not in err, err

    path = tmp_path / "demo.hdf5"  # a robomimic file whose `data` is an array, not a group of demos
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=np.arange(4.0))
    assert main(["convert", str(path), str(tmp_path / "out2"), "--format", "robomimic", "-q"]) == 2
    err = capsys.readouterr().err
    assert "demo.hdf5" in err and "'data'" in err and "unexpected" not in err, err


def test_external_links_are_refused_and_never_followed(tmp_path):
    secret = str(tmp_path / "secret.h5")
    with h5py.File(secret, "w") as f:
        f.create_dataset("x", data=np.full((T, 14), 7.0))
        f.create_dataset("observations/qpos", data=np.full((T, 14), 7.0))
    with pytest.raises(ConversionError) as err:  # a mapped key that is an external link
        convert([_aloha(tmp_path / "a", {1: _link(secret, "/x")})], str(tmp_path / "oa"), _opts())
    _refused_in_worker(_fields(err.value), "outside_source", 1, f"'{QPOS}'", secret, "external link")

    forge = _link(secret, "/observations", key="observations")  # a group on the path to every key
    with pytest.raises(SourceError) as err:
        convert([_aloha(tmp_path / "b", {0: forge})], str(tmp_path / "ob"), _opts())
    assert "episode_0.hdf5" in str(err.value) and "'observations'" in str(err.value) and secret in str(err.value)
    with pytest.raises(ConversionError) as err:
        convert([_aloha(tmp_path / "c", {2: forge})], str(tmp_path / "oc"), _opts())
    _refused_in_worker(_fields(err.value), "outside_source", 2, "'observations'", secret)

    fifo = str(tmp_path / "fifo")  # an external link no mapped key passes through: listed, not followed

    def unmapped(f, e):
        f["extra"] = h5py.ExternalLink(fifo, "/")
        f["observations/more"] = h5py.ExternalLink(fifo, "/x")

    with _fifo(fifo) as opened:
        manifest = convert([_aloha(tmp_path / "d", dict.fromkeys(range(3), unmapped))], str(tmp_path / "od"), _opts())
    assert opened == []
    assert manifest.totals.episodes == 3 and manifest.totals.rows == 3 * T
    notes = " ".join(manifest.sources[0].notes)
    assert "'extra'" in notes and "'observations/more'" in notes and "not followed" in notes, notes
    back = read_back(str(tmp_path / "od"))
    assert all(np.array_equal(column(back[("d", e)]["table"], "observation.state"), _qpos(e)) for e in range(3))


def test_soft_links_inside_the_file_are_read_dangling_ones_named(tmp_path):
    def honest(f, e):  # qpos kept under another name, reached through a soft link
        f.move(QPOS, "observations/qpos_data")
        f[QPOS] = h5py.SoftLink("/observations/qpos_data")

    root = _aloha(tmp_path / "a", dict.fromkeys(range(3), honest))
    convert([root], str(tmp_path / "oa"), _opts())
    back = read_back(str(tmp_path / "oa"))
    assert all(np.array_equal(column(back[("a", e)]["table"], "observation.state"), _qpos(e)) for e in range(3))

    dangling = _replace(QPOS, lambda f, k, e: f.__setitem__(k, h5py.SoftLink("/nowhere")))
    with pytest.raises(SourceError) as err:
        convert([_aloha(tmp_path / "b", {0: dangling})], str(tmp_path / "ob"), _opts())
    assert "episode_0.hdf5" in str(err.value) and f"'{QPOS}'" in str(err.value) and "/nowhere" in str(err.value)
    with pytest.raises(ConversionError) as err:
        convert([_aloha(tmp_path / "c", {1: dangling})], str(tmp_path / "oc"), _opts())
    _refused_in_worker(_fields(err.value), "missing_key", 1, f"'{QPOS}'", "/nowhere")

    loop = _replace(QPOS, lambda f, k, e: f.__setitem__(k, h5py.SoftLink("/" + QPOS)))
    with pytest.raises(ConversionError) as err:
        convert([_aloha(tmp_path / "d", {1: loop})], str(tmp_path / "od"), _opts())
    _refused_in_worker(_fields(err.value), "missing_key", 1, f"'{QPOS}'", "soft links")


def test_robomimic_data_or_demo_groups_linked_out_of_the_file_are_refused(tmp_path):
    secret = str(tmp_path / "secret.h5")
    with h5py.File(secret, "w") as f:
        f.create_dataset("demo_0/actions", data=np.zeros((T, 7)))

    def write(path, link_data=False, link_demo=None):
        with h5py.File(path, "w") as f:
            if link_data:
                f["data"] = h5py.ExternalLink(secret, "/")
                return
            for d in range(3):
                if d == link_demo:
                    f[f"data/demo_{d}"] = h5py.ExternalLink(secret, "/demo_0")
                    continue
                f.create_dataset(f"data/demo_{d}/actions", data=_qpos(d)[:, :7])
                f.create_dataset(f"data/demo_{d}/obs/joint_states", data=_qpos(d)[:, 7:])

    write(tmp_path / "a.hdf5", link_data=True)
    for options in (SourceOptions(), SourceOptions(format="robomimic")):  # recognised, or named by --format
        with pytest.raises(SourceError) as err:
            convert([str(tmp_path / "a.hdf5")], str(tmp_path / "oa"), _opts(sources=options))
        assert "a.hdf5" in str(err.value) and "'data'" in str(err.value) and secret in str(err.value), err.value
    write(tmp_path / "b.hdf5", link_demo=1)
    with pytest.raises(ConversionError) as err:
        convert([str(tmp_path / "b.hdf5")], str(tmp_path / "ob"), _opts())
    e = err.value
    assert (e.kind, e.episode) == ("outside_source", 1) and "b.hdf5" in e.path and secret in e.detail, e
    manifest = convert([str(tmp_path / "b.hdf5")], str(tmp_path / "oc"), _opts(on_error="skip"))
    assert manifest.totals.episodes == 2 and manifest.report.skipped_by_kind == {"outside_source": 1}


def test_a_remote_source_names_no_file_of_this_machine_even_with_allow_external(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    root = _aloha(tmp_path / "src", {0: _external("/etc/passwd")}, n=2)
    fs = fsspec.filesystem("memory")
    for name in sorted(os.listdir(root)):
        fs.pipe(f"/hdf5-hostile/src/{name}", (tmp_path / "src" / name).read_bytes())
    try:
        for allow in (False, True):
            options = SourceOptions(format="aloha", allow_external=allow)
            with pytest.raises(SourceError) as err:
                convert(["memory://hdf5-hostile/src"], str(tmp_path / f"o{allow}"), _opts(sources=options))
            text = str(err.value)
            assert "episode_0.hdf5" in text and f"'{QPOS}'" in text and "/etc/passwd" in text, text
            assert "remote" in text or not allow, text
    finally:
        fs.rm("/hdf5-hostile", recursive=True)


def test_allow_external_reads_regular_files_but_never_special_ones(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    raw = np.arange(T * 14, dtype=np.float64).reshape(T, 14) + 0.5
    (outside / "raw.bin").write_bytes(raw.tobytes())
    with h5py.File(outside / "other.h5", "w") as f:
        f.create_dataset("q", data=raw * 3)
    fifo = str(tmp_path / "fifo")

    def unmapped(f, e):  # never followed, even when allowed
        f["extra"] = h5py.ExternalLink(fifo, "/")

    def relative(f, e):  # "fifo" in the source folder is a regular file; HDF5 reads it from the working folder
        (tmp_path / "relative" / "fifo").write_bytes(raw.tobytes())
        _external("fifo")(f, e)

    forges = {
        "storage": (_external(str(outside / "raw.bin")), raw),
        "unmapped_link_fifo": (unmapped, _qpos(1)),
        "relative": (relative, None),
        "link": (_link(str(outside / "other.h5"), "/q"), raw * 3),
        "virtual": (_virtual(str(outside / "other.h5")), raw * 3),
        "virtual_missing": (_virtual(str(outside / "missing.h5")), None),
        "storage_fifo": (_external(fifo), None),
        "storage_environ": (_external("/proc/self/environ"), None),
        "link_fifo": (_link(fifo, "/q"), None),
        "virtual_fifo": (_virtual(fifo), None),
    }
    cases = {
        name: {"source": _aloha(tmp_path / name, {1: forge}, n=2), "out": str(tmp_path / f"out-{name}"), "allow": True}
        for name, (forge, _) in forges.items()
    }
    with _fifo(fifo) as opened:
        results = _in_child(cases, cwd=tmp_path)
    assert opened == [], "a FIFO was opened"
    for name, (_, expected) in forges.items():
        result = results[name]
        if expected is None:
            target = {"virtual_missing": "missing.h5", "storage_environ": "environ"}.get(name, fifo)
            _refused_in_worker(result, "outside_source", 1, f"'{QPOS}'", target)
            continue
        assert result.get("ok") and result["episodes"] == 2, (name, result)
        back = read_back(str(tmp_path / f"out-{name}"))
        assert np.array_equal(column(back[(name, 1)]["table"], "observation.state"), expected), name
        assert np.array_equal(column(back[(name, 0)]["table"], "observation.state"), _qpos(0)), name


# 2. Virtual datasets and arrays of fill values only.


def test_virtual_and_fill_value_only_arrays_are_refused(tmp_path):
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f.create_dataset("q", data=np.ones((T, 14)))
    vds = _virtual(str(tmp_path / "other.h5"))
    with pytest.raises(SourceError) as err:
        convert([_aloha(tmp_path / "a", {0: vds})], str(tmp_path / "oa"), _opts())
    assert "episode_0.hdf5" in str(err.value) and f"'{QPOS}'" in str(err.value) and "virtual" in str(err.value)
    with pytest.raises(ConversionError) as err:
        convert([_aloha(tmp_path / "b", {1: vds})], str(tmp_path / "ob"), _opts())
    _refused_in_worker(_fields(err.value), "outside_source", 1, f"'{QPOS}'", "other.h5", "virtual")

    def same_file(f, e):  # a virtual dataset of this very file's data: still refused without --allow-external
        f.create_dataset("observations/stored", data=_qpos(e))
        layout = h5py.VirtualLayout(shape=(T, 14), dtype="f8")
        layout[:] = h5py.VirtualSource(".", "/observations/stored", shape=(T, 14))
        del f[QPOS]
        f.create_virtual_dataset(QPOS, layout, fillvalue=-1.0)

    with pytest.raises(ConversionError) as err:
        convert([_aloha(tmp_path / "c", {1: same_file})], str(tmp_path / "oc"), _opts())
    _refused_in_worker(_fields(err.value), "outside_source", 1, f"'{QPOS}'", "virtual")

    unwritten = _replace(QPOS, lambda f, k, e: f.create_dataset(k, shape=(T, 14), dtype="f8", chunks=(T, 14)))
    with pytest.raises(SourceError) as err:
        convert([_aloha(tmp_path / "d", {0: unwritten})], str(tmp_path / "od"), _opts())
    assert "episode_0.hdf5" in str(err.value) and f"'{QPOS}'" in str(err.value) and "fill value" in str(err.value)
    contiguous = _replace(QPOS, lambda f, k, e: f.create_dataset(k, shape=(T, 14), dtype="f8"))

    def partly(f, e):
        del f[QPOS]
        f.create_dataset(QPOS, shape=(T, 14), dtype="f8", chunks=(2, 14))[:2] = _qpos(e)[:2]

    for name, forge in (("e", unwritten), ("f", contiguous), ("g", partly)):
        with pytest.raises(ConversionError) as err:
            convert([_aloha(tmp_path / name, {1: forge})], str(tmp_path / f"o{name}"), _opts())
        _refused_in_worker(_fields(err.value), "bad_feature", 1, f"'{QPOS}'", "fill value")
    camera = _replace(CAMERA, lambda f, k, e: f.create_dataset(k, shape=(T, 16, 16, 3), dtype="u1", chunks=True))
    with pytest.raises(ConversionError) as err:
        convert([_aloha(tmp_path / "h", {2: camera})], str(tmp_path / "oh"), _opts())
    _refused_in_worker(_fields(err.value), "bad_feature", 2, f"'{CAMERA}'", "fill value")


# 3. Claims beyond the bounds: a gzip bomb, 10^12 rows, a frame or a chunk too large.


def _gzip_bomb(f, key, e) -> None:
    """3.1 GiB of float64 zeros, 1M rows x 416, in 62 gzip chunks of 53 kB each (3.4 MB of file)."""
    rows, width, per_chunk = 1_000_000, 416, 16384
    ds = f.create_dataset(key, shape=(rows, width), dtype="f8", chunks=(per_chunk, width), compression="gzip")
    chunk = zlib.compress(bytes(per_chunk * width * 8), 9)
    for start in range(0, rows, per_chunk):
        ds.id.write_direct_chunk((start, 0), chunk)


def _rows_claim(f, key, e) -> None:
    """10^12 rows, one chunk of them written (the rest would be fill values)."""
    ds = f.create_dataset(key, shape=(10**12, 14), dtype="f8", chunks=(1024, 14), maxshape=(None, 14))
    ds.id.write_direct_chunk((0, 0), np.zeros((1024, 14)).tobytes())


def _frame_claim(f, key, e) -> None:
    """5 frames of 12000 x 12000 x 3 (432 MB each), one written."""
    ds = f.create_dataset(key, shape=(T, 12000, 12000, 3), dtype="u1", chunks=(1, 1000, 1000, 3), compression="gzip")
    ds.id.write_direct_chunk((0, 0, 0, 0), zlib.compress(bytes(3_000_000)))


def _chunk_claim(f, key, e) -> None:
    """5 rows in a chunk of 100000 rows (11 MB decompressed to read one row)."""
    ds = f.create_dataset(key, shape=(T, 14), dtype="f8", chunks=(100_000, 14), maxshape=(None, 14), compression="gzip")
    block = np.zeros((100_000, 14))
    block[:T] = _qpos(e)
    ds.id.write_direct_chunk((0, 0), zlib.compress(block.tobytes()))


def test_claims_beyond_the_bounds_are_too_large_named_and_skippable(tmp_path):
    bomb = _aloha(tmp_path / "bomb", {1: _replace(QPOS, _gzip_bomb)})
    assert os.path.getsize(os.path.join(bomb, "episode_1.hdf5")) < 4 << 20
    cases = {
        "bomb": {"source": bomb, "out": str(tmp_path / "out-bomb")},
        "bomb-skip": {"source": bomb, "out": str(tmp_path / "out-bomb-skip"), "on_error": "skip"},
        "rows": {"source": _aloha(tmp_path / "rows", {0: _replace(QPOS, _rows_claim)}), "out": str(tmp_path / "o1")},
        "frame": {
            "source": _aloha(tmp_path / "frame", {1: _replace(CAMERA, _frame_claim)}),
            "out": str(tmp_path / "o2"),
        },
        "chunk": {
            "source": _aloha(tmp_path / "chunk", {1: _replace(QPOS, _chunk_claim)}),
            "out": str(tmp_path / "o3"),
            "bounds": {"MAX_ARRAY_BYTES": 1 << 20},
        },
    }
    results = _in_child(cases, cwd=tmp_path)
    _refused_in_worker(results["bomb"], "too_large", 1, f"'{QPOS}'", "[1000000, 416]")
    skipped = results["bomb-skip"]
    assert skipped.get("ok") and skipped["episodes"] == 2 and skipped["skipped"] == {"too_large": 1}, skipped
    back = read_back(str(tmp_path / "out-bomb-skip"))
    assert sorted(back) == [("bomb", 0), ("bomb", 2)]
    for e in (0, 2):
        assert np.array_equal(column(back[("bomb", e)]["table"], "observation.state"), _qpos(e))
        assert np.array_equal(column(back[("bomb", e)]["table"], "action"), 2 * _qpos(e))
        assert np.array_equal(back[("bomb", e)]["frames"]["observation.images.top"], _frames(e))
    _refused_in_worker(results["rows"], "too_large", 0, f"'{QPOS}'", "rows")
    _refused_in_worker(results["frame"], "too_large", 1, f"'{CAMERA}'", "frame")
    _refused_in_worker(results["chunk"], "too_large", 1, f"'{QPOS}'", "chunk")


# 4. Text or other non-numbers where numbers are mapped.


def test_text_where_numbers_are_mapped_is_refused(tmp_path):
    text = _replace(QPOS, lambda f, k, e: f.create_dataset(k, data=np.array([b"0.1 0.2"] * T)))
    with pytest.raises(SourceError) as err:
        convert([_aloha(tmp_path / "a", {0: text})], str(tmp_path / "oa"), _opts())
    assert "episode_0.hdf5" in str(err.value) and f"'{QPOS}'" in str(err.value) and "not numbers" in str(err.value)
    vlen = _replace(QPOS, lambda f, k, e: f.create_dataset(k, data=["0.1 0.2"] * T, dtype=h5py.string_dtype()))
    with pytest.raises(ConversionError) as err:
        convert([_aloha(tmp_path / "b", {1: vlen})], str(tmp_path / "ob"), _opts())
    _refused_in_worker(_fields(err.value), "bad_feature", 1, f"'{QPOS}'", "not numbers")
    manifest = convert([str(tmp_path / "b")], str(tmp_path / "oc"), _opts(on_error="skip"))
    assert manifest.totals.episodes == 2 and manifest.report.skipped_by_kind == {"bad_feature": 1}

    floats = _replace(CAMERA, lambda f, k, e: f.create_dataset(k, data=_frames(e).astype(np.float32)))
    with pytest.raises(ConversionError) as err:
        convert([_aloha(tmp_path / "d", {2: floats})], str(tmp_path / "od"), _opts())
    _refused_in_worker(_fields(err.value), "bad_feature", 2, f"'{CAMERA}'", "float32")
    scalar = _replace("action", lambda f, k, e: f.create_dataset(k, data=1.0))
    with pytest.raises(ConversionError) as err:
        convert([_aloha(tmp_path / "e", {1: scalar})], str(tmp_path / "oe"), _opts())
    _refused_in_worker(_fields(err.value), "bad_feature", 1, "'action'", "rows")


# 5. Every library exception while an episode is read is a named, skippable error.


def test_library_errors_while_reading_are_named(tmp_path, monkeypatch):
    def damaged(f, e):
        del f[QPOS]
        ds = f.create_dataset(QPOS, shape=(T, 14), dtype="f8", chunks=(T, 14), compression="gzip")
        ds.id.write_direct_chunk((0, 0), b"\x78\x9c" + b"\x13" * 50)

    with pytest.raises(ConversionError) as err:
        convert([_aloha(tmp_path / "a", {1: damaged})], str(tmp_path / "oa"), _opts())
    _refused_in_worker(_fields(err.value), "unreadable_file", 1, f"'{QPOS}'")

    def odd_attribute(f, e):  # bool() of a two-value array: numpy's ValueError when the source opens
        f.attrs["compress"] = [1, 0]

    with pytest.raises(SourceError) as err:
        convert([_aloha(tmp_path / "b", {0: odd_attribute})], str(tmp_path / "ob"), _opts())
    assert "episode_0.hdf5" in str(err.value) and "ValueError" in str(err.value), err.value

    calls = {"n": 0}
    real = h5py.Dataset.__getitem__

    def failing(self, args, new_dtype=None):  # h5py raising what no reader anticipates, for episode 1 only
        if "episode_1" in repr(self.file.filename):
            calls["n"] += 1
            raise MemoryError("forged")
        return real(self, args, new_dtype)

    monkeypatch.setattr(h5py.Dataset, "__getitem__", failing)
    root = _aloha(tmp_path / "c")
    with pytest.raises(ConversionError) as err:
        convert([root], str(tmp_path / "oc"), _opts())
    _refused_in_worker(_fields(err.value), "unreadable_file", 1, "MemoryError")
    manifest = convert([root], str(tmp_path / "od"), _opts(on_error="skip"))
    assert manifest.totals.episodes == 2 and manifest.report.skipped_by_kind == {"unreadable_file": 1}
    assert calls["n"] >= 2


def test_a_folder_of_links_to_files_elsewhere_converts_only_when_allowed(tmp_path, capsys):
    """Episode files linked in from another folder (a shared disk): refused with the way out named, and
    converted with ``--allow-external`` (format recognised from the linked files too), rows equal."""
    from test_sources_hdf5 import write_aloha

    write_aloha(tmp_path / "real", [5, 4])
    (tmp_path / "src").mkdir()
    for name in sorted(os.listdir(tmp_path / "real")):
        (tmp_path / "src" / name).symlink_to(tmp_path / "real" / name)
    argv = ["convert", str(tmp_path / "src"), str(tmp_path / "out"), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "outside the source folder" in err and "pass --allow-external" in err and "unexpected" not in err
    assert main([*argv, "--allow-external"]) == 0, capsys.readouterr().err
    linked, direct = read_back(str(tmp_path / "out")), None
    convert([str(tmp_path / "real")], str(tmp_path / "direct"), ConvertOptions(progress=False))
    direct = read_back(str(tmp_path / "direct"))
    assert sorted(k[1] for k in linked) == sorted(k[1] for k in direct) == [0, 1]
    for (_, e), ep in linked.items():
        other = next(v for (_, i), v in direct.items() if i == e)
        assert np.array_equal(column(ep["table"], "action"), column(other["table"], "action"))
